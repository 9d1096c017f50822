/*
 * calib.h — calibration for quantized engines.
 *
 * Four pieces, each usable alone:
 *   1. Statistics (tb_calib_stats): for the input x (rows, K) of every matmul
 *      of an f32 graph, keyed by the matmul's weight name (after fusion, e.g.
 *      the fused q|k|v weight), the running max |x|, per input channel the
 *      mean and max |x| (what AWQ needs), a 2048-bin histogram of |x| over
 *      [0, max] (re-binned when a later batch raises the max, as TensorRT
 *      does) and a reservoir sample of up to `sample_rows` rows. It is fed by
 *      the runtime's per-node observer (runtime.h: tb_context_set_observer)
 *      or directly (tb_calib_stats_add). Everything is allocated at creation.
 *   2. Calibrators: pure functions from a histogram to a threshold T (|x| is
 *      clipped there): minmax, percentile, mse and entropy (TensorRT's
 *      IInt8EntropyCalibrator2). The activation scale is T / 127 for int8 and
 *      T / 448 for fp8 (tb_calib_act_scale).
 *   3. The table the builder consumes (tb_calib_table: name -> threshold and
 *      channel statistics) and its text cache (`--calib-cache`, format in
 *      docs/COMMANDS.md): one header line naming the format version, the
 *      calibrator and the model's fingerprint, then `name: scale` lines.
 *   4. The AWQ search (tb_awq_search): per-input-channel scales for int4.
 * Running the model over calibration text is plan/calib_run.c.
 */
#ifndef TB_TUNE_CALIB_H
#define TB_TUNE_CALIB_H

#include "backend/backend.h"
#include "ir/ir.h"

#define TB_CALIB_BINS 2048          /* histogram bins of |x| (TensorRT's count)        */
#define TB_CALIB_SAMPLE_ROWS 256    /* input rows kept per matmul by default (AWQ)    */
#define TB_CALIB_CACHE_VERSION 1
#define TB_CALIB_INT8_MAX 127.0f
#define TB_CALIB_FP8_MAX 448.0f

/* ---------------------------------------------------------------- calibrators */

typedef enum {
    TB_CALIB_ENTROPY = 0, /* least KL divergence (TensorRT's EntropyCalibrator2) */
    TB_CALIB_MINMAX,      /* the max |x| seen                                      */
    TB_CALIB_PERCENTILE,  /* the given percentile of |x|                           */
    TB_CALIB_MSE,         /* least int8 quantisation MSE over the histogram        */
} tb_calib_method;

typedef struct {
    tb_calib_method method;
    double percentile;    /* TB_CALIB_PERCENTILE: in (0, 100], default 99.99 */
} tb_calibrator;

/* "entropy", "minmax", "percentile" (99.99), "percentile=P", "mse". */
tb_status tb_calibrator_parse(const char *s, tb_calibrator *out);
/* The canonical name ("percentile=99.99"), as the cache header writes it. */
void tb_calibrator_name(const tb_calibrator *c, char *buf, size_t cap);

/* Threshold of a histogram of |x|: hist (n_bins) counts over [0, amax]
 * (bin i covers [i, i+1) * amax / n_bins). Returns amax for an empty
 * histogram and 0 when amax is 0. */
double tb_calib_minmax(const double *hist, int n_bins, double amax);
double tb_calib_percentile(const double *hist, int n_bins, double amax, double pct);
/* The cut-off minimising the expected squared error of symmetric int8
 * quantisation (levels = 127) with clipping, each bin's mass at its centre. */
double tb_calib_mse(const double *hist, int n_bins, double amax, int levels);
/* TensorRT's entropy calibration: for i in [levels, n_bins] (levels = 128
 * for int8), P = hist[0, i) with the mass of hist[i, n) added to bin i - 1;
 * Q = hist[0, i) (before the fold) merged into `levels` groups of i / levels
 * bins (the last takes the remainder), each group's mass spread evenly over
 * the bins where P is non-zero (zero bins stay zero); KL(P || Q) with both
 * normalised (infinite where Q is 0 and P is not); the threshold is
 * (i + 0.5) * bin width of the least KL (the first on ties). *best_i (may be
 * NULL) gets that i. */
double tb_calib_entropy(const double *hist, int n_bins, double amax, int levels, int *best_i);
/* One of the above as `c` says (levels 128 for entropy, 127 for mse). */
double tb_calib_threshold(const tb_calibrator *c, const double *hist, int n_bins, double amax);

/* ---------------------------------------------------------------- statistics */

typedef struct {
    char name[TB_NAME_LEN]; /* the matmul's weight name                        */
    int K;                  /* input channels                                  */
    uint64_t n_rows;        /* rows observed                                   */
    float amax;             /* max |x| so far                                  */
    double *hist;           /* (TB_CALIB_BINS) counts of |x| over [0, amax]   */
    double *sum_abs;        /* (K) sum of |x| per input channel                */
    float *max_abs;         /* (K) max |x| per input channel                   */
    float *rows;            /* (sample_cap, K) reservoir sample of input rows  */
    int n_sample, sample_cap;
} tb_calib_tensor;

typedef struct tb_calib_stats tb_calib_stats;

/* One tensor per matmul of g whose weight is a graph weight (K its input
 * channels); sample_rows (>= 0) rows kept per matmul. */
tb_status tb_calib_stats_create(const tb_graph *g, int sample_rows, tb_calib_stats **out);
void tb_calib_stats_free(tb_calib_stats *s);
int tb_calib_stats_count(const tb_calib_stats *s);
tb_calib_tensor *tb_calib_stats_at(tb_calib_stats *s, int i);
/* Index of the tensor of a weight name, -1 when none. */
int tb_calib_stats_find(const tb_calib_stats *s, const char *name);
/* Adds rows x (rows, K) to tensor i. */
void tb_calib_stats_add(tb_calib_stats *s, int i, const float *x, int rows);
/* Adds |x[0, n)| to a histogram hist (TB_CALIB_BINS) over [0, *amax],
 * re-binned when x raises the max (as tb_calib_stats_add does): the
 * statistics of one tensor without the per-channel parts (INT8 ONNX
 * engines, plan/calib_onnx.c). */
void tb_calib_hist_add(double *hist, float *amax, const float *x, size_t n);
/* The runtime observer (tb_node_observer, runtime.h): `user` is the stats;
 * adds the input of every matmul node it knows. */
void tb_calib_observe(void *user, const tb_graph *g, int node, void *const *bufs, const tb_step *st);
/* Seconds spent in tb_calib_observe so far (the statistics' share of a run). */
double tb_calib_stats_seconds(const tb_calib_stats *s);

/* ---------------------------------------------------------------- the table */

typedef struct {
    char name[TB_NAME_LEN]; /* the matmul's weight name                         */
    int K;
    float amax;             /* max |x| seen (0 when read from a cache)          */
    float threshold;        /* the calibrator's clip point T of |x|             */
    float *mean_abs;        /* (K) mean |x| per input channel, or NULL          */
    float *max_abs;         /* (K) max |x| per input channel, or NULL           */
    float *rows;            /* (n_rows, K) sampled input rows, or NULL          */
    int n_rows;
} tb_calib_entry;

typedef struct {
    char calibrator[48];    /* tb_calibrator_name                               */
    uint64_t fingerprint;   /* the model's (tb_calib_fingerprint)              */
    long tokens;            /* calibration tokens (0: unknown)                 */
    int n;
    tb_calib_entry *e;      /* (n), owned                                      */
} tb_calib_table;

/* The table from statistics (thresholds by `c`; channel statistics and the
 * sampled rows copied). Free with tb_calib_table_free. */
tb_status tb_calib_table_from_stats(tb_calib_stats *s, const tb_calibrator *c, uint64_t fingerprint, long tokens,
                                    tb_calib_table **out);
void tb_calib_table_free(tb_calib_table *t);
/* The entry of a matmul weight, NULL when the table has none. */
const tb_calib_entry *tb_calib_find(const tb_calib_table *t, const char *weight_name);
/* The static per-tensor activation scale for dt: T / 127 (TB_I8) or T / 448
 * (TB_FP8_E4M3); 0 for other dtypes or a NULL entry. */
float tb_calib_act_scale(const tb_calib_entry *e, tb_dtype dt);

/* The cache: text, written atomically. Reading checks the header against
 * the expected version, calibrator and fingerprint and refuses (TB_ERR_
 * VERSION / TB_ERR_INVALID_ARG) with a message naming which differs. */
tb_status tb_calib_cache_write(const char *path, const tb_calib_table *t);
tb_status tb_calib_cache_read(const char *path, const char *calibrator, uint64_t fingerprint,
                              tb_calib_table **out);

/* ---------------------------------------------------------------- AWQ */

typedef struct {
    float alpha;        /* the exponent chosen                                  */
    double err_rtn;     /* output error of round to nearest (alpha = 0)         */
    double err_best;    /* output error with the chosen scales                  */
} tb_awq_report;

/* Activation-aware scaling for int4 (AWQ): for alpha in {0, 0.05, ..., 1},
 * s_k = mean_abs_k^alpha normalised so that sqrt(max s * min s) = 1; W diag(s)
 * quantised to int4 round to nearest per group of `group` (asym: with zero
 * points; core/quant.h's encoding) and scaled back by diag(1 / s); the alpha
 * with the least output error ||X W^T - X Wq^T||^2 wins. X (m, K) sampled
 * input rows, or NULL / m = 0: the error is then weighted per channel by
 * mean_abs_k^2 (inputs taken as uncorrelated). w (N, K), mean_abs (K);
 * writes s (K). The caller quantises W diag(s) (tb_quantize_rows_scaled) and
 * divides the matmul's input by s (folded into whatever produces it). */
tb_status tb_awq_search(const float *w, int N, int K, const float *mean_abs, const float *x, int m, int group,
                        int asym, float *s, tb_awq_report *rep);

/* AWQ's weight clipping (auto_clip) for int4: for every output row n and
 * group g of w (N, K), the weights as they will be quantised (W diag(s)
 * with AWQ scales), the clip bound b = r max|w[n, g]| for r in {1.0, 0.95,
 * ..., 0.5} whose quantisation of clamp(w[n, g], -b, b) (tb_quantize_rows,
 * round to nearest, asym: with zero points) gives the least output error of
 * that group, d^T C_g d with d = w[n, g] - Q(clamp(w[n, g])) and C_g =
 * X_g^T X_g over the sampled input rows X (m, K) divided by in_scale (K, or
 * NULL); without rows (x NULL or m 0) C_g = diag((mean_abs_k / in_scale_k)^2).
 * r = 1 is round to nearest, so the chosen bound never loses on this
 * objective. Writes bound (N, K/group): the caller clamps each group to
 * +-bound before quantising. rep (may be NULL): the summed group errors. */
typedef struct {
    double err_rtn;     /* sum over rows and groups, r = 1                      */
    double err_best;    /* the same with the chosen bounds                      */
    double mean_ratio;  /* mean r chosen                                        */
} tb_awq_clip_report;

tb_status tb_awq_clip(const float *w, int N, int K, const float *x, int m, const float *mean_abs,
                      const float *in_scale, int group, int asym, float *bound, tb_awq_clip_report *rep);

#endif /* TB_TUNE_CALIB_H */
