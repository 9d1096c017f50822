/*
 * kernels.h — the CPU kernels behind the CPU backend.
 *
 * Each op has two entry points:
 *   tb_ref_*  : a plain scalar reference, written for clarity (tests compare
 *               every fast path against it);
 *   tb_cpu_*  : the fast version, split across the thread pool, with AVX-512,
 *               AVX2+FMA(+F16C) and portable scalar paths chosen once at run time
 *               from tb_cpu_features() (so TB_CPU_MASK can force a path).
 *
 * All activations are f32, row-major. Weights may be f32, f16 or bf16 and are
 * converted on the fly (f32 accumulation). Nothing here allocates: scratch
 * space, when needed, comes from the caller.
 */
#ifndef TB_CPU_KERNELS_H
#define TB_CPU_KERNELS_H

#include "core/core.h"

/* Which SIMD path the fast kernels use: "avx512", "avx2" or "scalar". */
const char *tb_cpu_kernel_path(void);

/* ---- embedding: y[t,:] = table[ids[t],:] (converted to f32)
 * ids (T) i32, table (V, D) wdt, y (T, D) f32. Ids are checked by the caller. */
void tb_ref_embedding(const int32_t *ids, const void *table, tb_dtype wdt,
                      float *y, int T, int D);
void tb_cpu_embedding(tb_pool *p, const int32_t *ids, const void *table,
                      tb_dtype wdt, float *y, int T, int D);
/* A vocabulary shard (tensor parallelism): table (V, D) holds the rows of
 * ids [lo, lo + V); other ids give zero rows. */
void tb_ref_embedding_range(const int32_t *ids, const void *table, tb_dtype wdt, float *y, int T, int D, int32_t lo,
                            int32_t V);
void tb_cpu_embedding_range(tb_pool *p, const int32_t *ids, const void *table, tb_dtype wdt, float *y, int T, int D,
                            int32_t lo, int32_t V);

/* ---- rmsnorm: y[t,:] = x[t,:] / sqrt(mean(x[t,:]^2) + eps) * w
 * x (T, D), w (D) f32, y (T, D). */
void tb_ref_rmsnorm(const float *x, const float *w, float *y, int T, int D,
                    float eps);
void tb_cpu_rmsnorm(tb_pool *p, const float *x, const float *w, float *y,
                    int T, int D, float eps);

/* ---- add + rmsnorm (fused residual): r = x + d; y = rmsnorm(r) * w
 * x, d (T, D); r (T, D) the new residual; y (T, D). r may alias x. */
void tb_ref_add_rmsnorm(const float *x, const float *d, const float *w,
                        float *r, float *y, int T, int D, float eps);
void tb_cpu_add_rmsnorm(tb_pool *p, const float *x, const float *d,
                        const float *w, float *r, float *y, int T, int D,
                        float eps);

/* ---- matmul: y[t,n] = sum_k x[t,k] * w[n,k] + (bias ? bias[n] : 0)
 * x (T, K) f32; w (N, K) row-major in wdt (f32, f16, bf16), the PyTorch
 * Linear layout; bias (N) f32 or NULL; y (T, N) f32. K is a multiple of 8 in
 * practice but the kernels must handle any K. T = 1 (decode) must run at the
 * memory-bandwidth limit; large T (prefill) must be compute-efficient
 * (register-blocked over several rows of x and of w). */
/* Steps of at least this many rows run as prefill-shaped GEMMs (packed
 * weights, or the BLAS tactic when the tuner picked it); fewer rows stream the
 * weights once like a GEMV. */
#define TB_CPU_GEMM_MIN_T 96

void tb_ref_matmul(const float *x, const void *w, tb_dtype wdt,
                   const float *bias, float *y, int T, int K, int N);
void tb_cpu_matmul(tb_pool *p, const float *x, const void *w, tb_dtype wdt,
                   const float *bias, float *y, int T, int K, int N);

/* ---- quantized matmul: y[t,n] = sum_k x[t,k] * dq(w)[n,k] + (bias ? bias[n] : 0)
 * x (T, K) f32; w: codes (N, K) and scales (N, K/group) as core/quant.h
 * encodes them (i8 and fp8 per output channel, group = K; i4 groups of 32,
 * 64 or 128 with optional zeros); bias (N) f32 or NULL; y (T, N) f32.
 * tb_cpu_qmatmul (qgemm.c) picks its path like tb_cpu_matmul; the reference
 * dequantises one weight row at a time. */
typedef struct {
    tb_dtype dtype;      /* TB_I8, TB_I4 or TB_FP8_E4M3                 */
    const void *codes;   /* (N, K) codes                                */
    const float *scales; /* (N, K / group)                              */
    const float *zeros;  /* (N, K / group) or NULL (i4 only)            */
    int group;           /* elements per scale along K                  */
} tb_qweight;
void tb_ref_qmatmul(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N);
void tb_cpu_qmatmul(tb_pool *p, const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K,
                    int N);
/* Its tactics (the node's tactic word, tune/tactic.h: low byte for steps
 * below TB_CPU_GEMM_MIN_T, next byte for larger ones; 0 = TB_QMM_AUTO):
 *   TB_QMM_DQ      register tiles of 4 weight rows x up to 4 tokens, codes
 *                  widened to f32 in registers (every path);
 *   TB_QMM_PACKED  dequantised f32 panels of W and an outer-product
 *                  microkernel (prefill; every path);
 *   TB_QMM_Q8      activations quantised to int8 per block of 32 once per
 *                  call, integer dot products (i8 and i4 weights; vpdpbusd
 *                  with AVX-512 VNNI, else AVX2 vpmaddubsw). Differs from
 *                  the reference by the activations' rounding (see
 *                  tb_ref_qmatmul_q8).
 * TB_QMM_AUTO: TB_QMM_DQ below TB_CPU_GEMM_MIN_T rows, else TB_QMM_PACKED.
 * TB_QMM_Q8 is never a default: the build's timing chooses it where it is
 * faster (unless the build keeps the exact tactics: tb_build_options
 * qmm_tactics). */
/* The reference of TB_QMM_Q8: each row of x quantised per block of 32
 * along K (the last block may be shorter): d = amax / 127, q = rint(x *
 * (127 / amax)) (0 when amax is 0), then y = sum over blocks of d * sum_k
 * q[k] * dq(w)[n,k] (i8 and i4 weights; the i4 zero enters as zero * d *
 * sum q). Exact integer sums within a block, f32 across blocks. */
void tb_ref_qmatmul_q8(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N);
typedef enum { TB_QMM_AUTO = 0, TB_QMM_DQ = 1, TB_QMM_PACKED = 2, TB_QMM_Q8 = 3 } tb_qmm_tactic;
int tb_cpu_qmatmul_tactic_available(tb_qmm_tactic t, const tb_qweight *w);
void tb_cpu_qmatmul_tactic(tb_pool *p, tb_qmm_tactic t, const float *x, const tb_qweight *w, const float *bias,
                           float *y, int T, int K, int N);
/* The tactic for steps of T rows of this weight, timed here (alternating
 * the candidates, median of each; TB_QMM_AUTO when only one applies);
 * TB_QMM_Q8 is a candidate only with allow_q8. x (T, K) and y (T, N) are
 * the caller's scratch. The tuner stores it in the node's tactic word. */
tb_qmm_tactic tb_cpu_qmatmul_pick(tb_pool *p, const tb_qweight *w, int T, int K, int N, int allow_q8, const float *x,
                                  float *y);
/* The per-path single-threaded pieces (qgemm_avx2.c, qgemm_avx512.c):
 * y[0:T, n0:n1] (rows of y N apart) with tactic t (never AUTO). */
void tb_cpu_qmm_avx512(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                       int n1, int t);
void tb_cpu_qmm_avx2(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                     int n1, int t);
/* TB_QMM_Q8 on AVX-512 VNNI (qgemm_vnni.c), i8 and i4 weights, any T;
 * tb_cpu_has_avx512vnni: whether this CPU runs it. */
void tb_cpu_qmm_vnni(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                     int n1);
int tb_cpu_has_avx512vnni(void);
/* Per-thread scratch of the quantized kernels (reordered or quantised
 * activations): at least `bytes`, 64-byte aligned, kept for the thread's
 * later calls and freed at its exit; grows only when a call needs more. */
void *tb_cpu_qscratch(size_t bytes);

/* ---- silu-gated MLP activation: y[t,i] = silu(g[t,i]) * u[t,i], where
 * gu (T, 2F) holds [gate | up] side by side in each row; y (T, F). */
void tb_ref_silu_mul(const float *gu, float *y, int T, int F);
void tb_cpu_silu_mul(tb_pool *p, const float *gu, float *y, int T, int F);

/* ---- the Llama builder's plain ops (fused by the passes before they run,
 * so one scalar kernel each serves as reference and CPU kernel):
 * concat_cols: y (T, sum cols[i]) = [x_0 | x_1 | ...], x_i (T, cols[i]);
 * silu: y = x * sigmoid(x); mul: y = a * b; all (n) */
void tb_ref_concat_cols(const float *const *x, const int *cols, int n_in, float *y, int T);
void tb_ref_silu(const float *x, float *y, size_t n);
void tb_ref_mul(const float *a, const float *b, float *y, size_t n);

/* ---- residual add: y = a + b, all (n) */
void tb_ref_add(const float *a, const float *b, float *y, size_t n);
void tb_cpu_add(tb_pool *p, const float *a, const float *b, float *y, size_t n);

/* ---- rope: rotates `n_heads` heads of size hd in each row of x, in place.
 * x (T, row_stride) with the heads starting at column 0; pos (T) i32;
 * inv_freq (hd/2) f32 (rope_theta and any rope scaling already applied).
 * angle = pos[t] * inv_freq[i].
 * interleaved = 0: HF "rotate_half" pairs (i, i + hd/2);
 * interleaved = 1: Meta/llama2.c pairs (2i, 2i + 1). */
void tb_ref_rope(float *x, int row_stride, const int32_t *pos,
                 const float *inv_freq, int T, int n_heads, int hd,
                 int interleaved);
void tb_cpu_rope(tb_pool *p, float *x, int row_stride, const int32_t *pos,
                 const float *inv_freq, int T, int n_heads, int hd,
                 int interleaved);

/* ---- paged attention (grouped-query, causal), for one layer.
 *
 * The KV cache of a layer is a pool of blocks:
 *   k_cache, v_cache (n_blocks, block_size, n_kv, hd) in kv_dtype: f32, f16,
 *   bf16, or int8 / fp8 e4m3 codes with an f32 scale per (row, kv head)
 *   after each block's codes (core/kv_layout.h gives every block's bytes).
 * Sequence s owns blocks block_tables[s * max_blocks + j], j = 0, 1, ...;
 * position p of s lives in block block_tables[s*max_blocks + p/block_size],
 * row p % block_size.
 *
 * qkv (T, (n_heads + 2*n_kv) * hd): per token, q heads, then k heads, then v
 * heads, RoPE ALREADY applied to q and k. Token t belongs to sequence seq[t]
 * at position pos[t].
 *
 * The kernel first writes k and v of every token into the cache at
 * (seq[t], pos[t]) (int8 / fp8: quantised per kv head as
 * tb_ref_kv_quantize does, by tb_cpu_kv_quantize on every fast path), then for every token t and head h computes
 *   out[t, h*hd:(h+1)*hd] = softmax_j(scale * q_h . k_j) v_j
 * over positions j = 0 .. pos[t] of seq[t] (causal; positions written by this
 * same step included), with kv head h / (n_heads / n_kv).
 * out (T, n_heads * hd). scratch: at least tb_attention_scratch_floats(...)
 * floats (for scores), provided by the caller. */
typedef struct {
    int T, n_heads, n_kv, hd;
    float scale;
    const int32_t *pos;          /* (T) */
    const int32_t *seq;          /* (T) */
    const int32_t *block_tables; /* (n_seqs, max_blocks) */
    int max_blocks;
    int block_size;
    void *k_cache, *v_cache;     /* (n_blocks, block_size, n_kv, hd) + scales */
    tb_dtype kv_dtype;           /* TB_F32, TB_F16, TB_BF16, TB_I8, TB_FP8_E4M3 */
} tb_attn_args;

/* One (token, kv head) row x (hd) of an int8 / fp8 cache: *scale = absmax /
 * 127 (int8) or / 448 (e4m3), codes (hd) = x * (127 or 448) / absmax,
 * rounded to nearest even (int8 clamped to +-127; e4m3 by core's exact
 * conversion). All zeros: scale 0, codes 0. */
void tb_ref_kv_quantize(const float *x, int hd, tb_dtype dt, void *codes, float *scale);
/* The same bytes, faster (what tb_cpu_attention writes with). */
void tb_cpu_kv_quantize(const float *x, int hd, tb_dtype dt, void *codes, float *scale);
/* The f32 value of each fp8 e4m3 byte (core's exact conversion; NaN for
 * 0x7f and 0xff), filled on first use. */
const float *tb_cpu_fp8_table(void);

/* Most q heads that one attention call handles together (the scores of
 * each are held in scratch at once). */
#define TB_ATTN_GROUP_MAX 8
size_t tb_attention_scratch_floats(int n_threads, int max_ctx);
void tb_ref_attention(const tb_attn_args *a, const float *qkv, float *out,
                      float *scratch);
void tb_cpu_attention(tb_pool *p, const tb_attn_args *a, const float *qkv,
                      float *out, float *scratch, int max_ctx);
/* A decode step of one token (T == 1) on more than one thread splits the
 * context's positions between the threads (flash-decoding: partial softmax
 * per thread, merged per head; kernels.c) when it is long enough and the
 * scratch holds the partial results. Tests and benchmarks: mode 1 takes
 * that split whenever it can (any context of 2 cache blocks or more), 0
 * never, -1 goes back to the automatic choice. */
void tb_cpu_attention_force_split(int mode);
/* Whether tb_cpu_attention would take that split for a (on n_threads,
 * scratch for max_ctx). */
int tb_cpu_attention_split(const tb_attn_args *a, int n_threads, int max_ctx);

/* ---- gather rows: y[r,:] = x[rows[r],:]; x (T, D), rows (R), y (R, D). */
void tb_cpu_gather_rows(const float *x, const int32_t *rows, float *y, int R,
                        int D);

/* ---- conversion through this path's to_f32 / from_f32 (f32, f16, bf16):
 * n elements from src dtype to dst; the tests check each path with it. The
 * builder converts weights with core's tb_dtype_convert (core/dtype.c). */
void tb_convert(const void *src, tb_dtype sdt, void *dst, tb_dtype ddt,
                size_t n);

/* ---- memory copy bandwidth probe used by the benchmarks: copies `bytes`
 * from src to dst with `nth` threads of the pool. */
void tb_cpu_copy(tb_pool *p, void *dst, const void *src, size_t bytes);

/* ---- path selection (tests and benchmarks): forces "avx512", "avx2" or
 * "scalar" when this CPU can run it and returns 0, else returns -1 and keeps
 * the current path. NULL goes back to the automatic choice. */
int tb_cpu_kernel_force_path(const char *name);

/* ---- per-thread scratch of the packed GEMMs (TB_CPU_PANEL_BYTES, 64-byte
 * aligned), allocated by a thread's first call and freed when the thread
 * exits. (A static _Thread_local array put 256 KiB of zeroed TLS into every
 * thread, which glibc clears at each process and thread start: some 70 page
 * faults of every command, `turbine --help` included, and of every server
 * connection thread.) Aborts when 128 KiB cannot be allocated. */
#define TB_CPU_PANEL_BYTES ((size_t)128 * 1024)
float *tb_cpu_thread_panel(void);

/* ---- matmul tactics: the build's tuner times each available one per shape
 * and keeps the faster. TB_MM_OWN is tb_cpu_matmul; TB_MM_BLAS has every pool
 * thread call a single-threaded cblas_sgemm on its own slice of N (f32
 * weights only, when OpenBLAS can be loaded: blas.c). */
typedef enum { TB_MM_OWN = 0, TB_MM_BLAS = 1 } tb_mm_tactic;

/* OpenBLAS's CBLAS entry points, loaded on first use (blas.c). The enum
 * arguments are CBLAS's standard values. */
enum { TB_CBLAS_ROW_MAJOR = 101, TB_CBLAS_NO_TRANS = 111, TB_CBLAS_TRANS = 112 };
typedef void (*tb_blas_sgemm_fn)(int order, int transa, int transb, int m, int n, int k, float alpha,
                                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*tb_blas_sgemv_fn)(int order, int trans, int m, int n, float alpha, const float *a, int lda,
                                 const float *x, int incx, float beta, float *y, int incy);
typedef struct {
    tb_blas_sgemm_fn sgemm;
    tb_blas_sgemv_fn sgemv;
} tb_blas_api;
/* Loads OpenBLAS the first time ($TURBINE_OPENBLAS, else libopenblas.so.0);
 * NULL when it cannot be loaded, with the reason in tb_cpu_blas_error(). */
const tb_blas_api *tb_cpu_blas(void);
const char *tb_cpu_blas_error(void);
int tb_cpu_matmul_tactic_available(tb_mm_tactic t, tb_dtype wdt);
void tb_cpu_matmul_tactic(tb_pool *p, tb_mm_tactic t, const float *x,
                          const void *w, tb_dtype wdt, const float *bias,
                          float *y, int T, int K, int N);

/* ---- one attention work item: n (<= TB_ATTN_GROUP_MAX) rows, each one q
 * head of one token, all tokens of sequence `seq`. The rows may be several
 * heads of a token (decode: every K and V row is then loaded once for all of
 * them) or one head of several tokens (prefill: the same, across queries);
 * row g attends to positions 0 .. pos[t[g]] of kv head kvh[g].
 * When m and l are set (the position split of a decode step, kernels.c),
 * the kernel also stores each row's softmax statistics: m[g] the largest
 * scaled score and l[g] = sum_j exp(score_j - m[g]); out[g] stays the
 * normalised result over the row's positions, so that partial results over
 * disjoint position ranges merge exactly. */
typedef struct tb_attn_item {
    int n, seq;
    int t[TB_ATTN_GROUP_MAX], kvh[TB_ATTN_GROUP_MAX];
    const float *q[TB_ATTN_GROUP_MAX]; /* (hd) each */
    float *out[TB_ATTN_GROUP_MAX];     /* (hd) each */
    float *m, *l;                      /* (n) each, or NULL */
} tb_attn_item;

/* ---- one SIMD path: the single-threaded pieces the tb_cpu_* entry points
 * split across the pool (internal to the CPU backend). */
typedef struct {
    const char *name;
    /* y[0:T, n0:n1] of tb_cpu_matmul; y rows have stride N. */
    void (*matmul)(const float *x, const void *w, tb_dtype wdt,
                   const float *bias, float *y, int T, int K, int N, int n0,
                   int n1);
    void (*to_f32)(const void *src, tb_dtype sdt, float *dst, size_t n);
    void (*from_f32)(const float *src, void *dst, tb_dtype ddt, size_t n);
    void (*rmsnorm)(const float *x, const float *w, float *y, int T, int D,
                    float eps);
    void (*add_rmsnorm)(const float *x, const float *d, const float *w,
                        float *r, float *y, int T, int D, float eps);
    void (*silu_mul)(const float *gu, float *y, int T, int F);
    void (*add)(const float *a, const float *b, float *y, size_t n);
    void (*rope)(float *x, int row_stride, const int32_t *pos,
                 const float *inv_freq, int T, int n_heads, int hd,
                 int interleaved);
    /* attention of every row of one work item (below); scores: at least
     * tb_attention_scratch_floats(1, max ctx of the rows) floats. */
    void (*attn_rows)(const tb_attn_args *a, const struct tb_attn_item *it,
                      float *scores);
} tb_cpu_kernel_table;

extern const tb_cpu_kernel_table tb_cpu_kernels_avx2;
/* Entries left NULL are taken from the AVX2 table. */
extern const tb_cpu_kernel_table tb_cpu_kernels_avx512;

#endif /* TB_CPU_KERNELS_H */
