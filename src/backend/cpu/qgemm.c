/*
 * qgemm.c — matmuls over quantized weights (kernels.h tb_qweight; encodings
 * in core/quant.h): the references, the portable path, the per-thread
 * scratch, the dispatch to the SIMD paths and the tactic timing.
 *
 * tb_ref_qmatmul is the scalar reference every fast path is tested against:
 * each weight element dequantised on its own, f32 accumulation in the order
 * k = 0 .. K-1. tb_ref_qmatmul_q8 is the reference of the int8-activation
 * tactic (x rounded to int8 per block of 32 first).
 *
 * tb_cpu_qmatmul splits the output columns (rows of W) across the pool and
 * runs the path of the other CPU kernels (tb_cpu_kernel_path: AVX-512 in
 * qgemm_avx512.c, AVX2 in qgemm_avx2.c, else the portable loop below, which
 * walks each row of W once for every row of x and applies each group's
 * scale once to the group's partial sum and the zero to the sum of x over
 * the group). Steps below TB_CPU_GEMM_MIN_T rows stream W once through
 * register tiles; larger ones dequantise W into packed f32 panels. The
 * TB_QMM_Q8 tactic (activations to int8, integer dot products) runs in
 * qgemm_vnni.c on AVX-512 VNNI, else in qgemm_avx2.c; the build's timing
 * may choose it (tb_cpu_qmatmul_pick), it is never the default.
 */
#include "backend/cpu/kernels.h"
#include "core/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

static inline float qw_code(const tb_qweight *w, const uint8_t *row, int k) {
    switch (w->dtype) {
    case TB_I8: return (float)((const int8_t *)row)[k];
    case TB_FP8_E4M3: return tb_fp8_e4m3_to_f32(row[k]);
    default: return (float)tb_i4_code(row, k);
    }
}

void tb_ref_qmatmul(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N) {
    int G = K / w->group;
    uint64_t rb = tb_quant_codes_bytes(w->dtype, 1, K);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
            float acc = 0;
            for (int k = 0; k < K; k++) {
                int g = k / w->group;
                float dq = qw_code(w, row, k) * w->scales[(size_t)n * G + g] +
                           (w->zeros ? w->zeros[(size_t)n * G + g] : 0.0f);
                acc += x[(size_t)t * K + k] * dq;
            }
            y[(size_t)t * N + n] = acc + (bias ? bias[n] : 0.0f);
        }
}

void tb_ref_qmatmul_q8(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N) {
    TB_ASSERT(w->dtype == TB_I8 || w->dtype == TB_I4);
    int G = K / w->group;
    uint64_t rb = tb_quant_codes_bytes(w->dtype, 1, K);
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * K;
        for (int n = 0; n < N; n++) {
            const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
            float acc = 0;
            for (int k0 = 0; k0 < K; k0 += 32) {
                int k1 = k0 + 32 < K ? k0 + 32 : K;
                float amax = 0;
                for (int k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(xr[k]));
                float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
                int32_t isum = 0, qsum = 0;
                for (int k = k0; k < k1; k++) {
                    int q = (int)rintf(xr[k] * id);
                    q = q < -127 ? -127 : q > 127 ? 127 : q;
                    isum += q * (int)qw_code(w, row, k);
                    qsum += q;
                }
                /* i4 groups hold whole blocks of 32; i8 has one scale */
                int g = k0 / w->group;
                float s = w->scales[(size_t)n * G + g], z = w->zeros ? w->zeros[(size_t)n * G + g] : 0.0f;
                acc += d * ((float)isum * s + (float)qsum * z);
            }
            y[(size_t)t * N + n] = acc + (bias ? bias[n] : 0.0f);
        }
    }
}

/* ---------------------------------------------------------------- scratch */

typedef struct {
    void *p;
    size_t cap;
} qscratch;

static pthread_key_t qs_key;
static pthread_once_t qs_once = PTHREAD_ONCE_INIT;

static void qs_free(void *v) {
    qscratch *b = v;
    tb_free_aligned(b->p);
    free(b);
}
static void qs_key_create(void) { TB_ASSERT(pthread_key_create(&qs_key, qs_free) == 0); }

void *tb_cpu_qscratch(size_t bytes) {
    pthread_once(&qs_once, qs_key_create);
    qscratch *b = pthread_getspecific(qs_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        TB_ASSERT(b && "out of memory for quantized-matmul scratch");
        pthread_setspecific(qs_key, b);
    }
    if (b->cap < bytes) {
        tb_free_aligned(b->p);
        b->cap = bytes < 65536 ? 65536 : bytes + bytes / 4;
        b->p = tb_alloc_aligned(b->cap, 64);
        TB_ASSERT(b->p && "out of memory for quantized-matmul scratch");
    }
    return b->p;
}

/* ---------------------------------------------------------------- portable path */

static void qmm_scalar(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                       int n1) {
    int G = K / w->group;
    uint64_t rb = tb_quant_codes_bytes(w->dtype, 1, K);
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
        for (int t = 0; t < T; t++) {
            const float *xr = x + (size_t)t * K;
            float acc = 0;
            for (int g = 0; g < G; g++) {
                float part = 0, xs = 0;
                int k0 = g * w->group;
                for (int k = k0; k < k0 + w->group; k++) {
                    part += xr[k] * qw_code(w, row, k);
                    xs += xr[k];
                }
                acc += part * w->scales[(size_t)n * G + g];
                if (w->zeros) acc += xs * w->zeros[(size_t)n * G + g];
            }
            y[(size_t)t * N + n] = acc + (bias ? bias[n] : 0.0f);
        }
    }
}

/* ---------------------------------------------------------------- dispatch */

typedef void (*qmm_fn)(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                       int n1, int t);

static void qmm_vnni_t(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                       int n1, int t) {
    tb_cpu_qmm_vnni(x, w, bias, y, T, K, N, n0, n1);
}

static int avx512_ok(void) {
    uint32_t f = tb_cpu_features();
    return !strcmp(tb_cpu_kernel_path(), "avx512") && (f & TB_CPU_AVX512BW) && (f & TB_CPU_AVX512VL);
}

static void qmm_scalar_t(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N,
                         int n0, int n1, int t) {
    qmm_scalar(x, w, bias, y, T, K, N, n0, n1);
}

/* The path of the other kernels (tb_cpu_kernel_path, so a forced path
 * applies here too); AVX-512 here also needs BW and VL. */
static qmm_fn qmm_path(void) {
    const char *p = tb_cpu_kernel_path();
    if (avx512_ok()) return tb_cpu_qmm_avx512;
    if (!strcmp(p, "avx512") || !strcmp(p, "avx2")) return tb_cpu_qmm_avx2;
    return qmm_scalar_t;
}

typedef struct {
    qmm_fn fn;
    const float *x;
    const tb_qweight *w;
    const float *bias;
    float *y;
    int T, K, N, tactic, align;
} qmm_job;

static void qmm_run(void *arg, int ith, int nth) {
    const qmm_job *j = arg;
    int per = (j->N + nth - 1) / nth;
    per = (per + j->align - 1) / j->align * j->align;
    int n0 = per * ith, n1 = n0 + per;
    if (n0 > j->N) n0 = j->N;
    if (n1 > j->N) n1 = j->N;
    if (n1 > n0) j->fn(j->x, j->w, j->bias, j->y, j->T, j->K, j->N, n0, n1, j->tactic);
}

/* The default tactic for a step of T rows: the packed panels from
 * TB_CPU_GEMM_MIN_T rows, as for f32. Measured on AVX-512 (1 thread, CPU
 * time, 768x2304, GFLOP/s panels / tiles): int8 T 96 166 / 175, 128
 * 177 / 175, 192 171 / 136, 512 142 / 104; int4 g128 T 96 186 / 173, 128
 * 179 / 176, 192 159 / 159, 512 137 / 99 (before the panels were filled by
 * 16x16 transposes the tiles won up to T = 256). */
static tb_qmm_tactic qmm_default(int T) { return T < TB_CPU_GEMM_MIN_T ? TB_QMM_DQ : TB_QMM_PACKED; }

int tb_cpu_qmatmul_tactic_available(tb_qmm_tactic t, const tb_qweight *w) {
    switch (t) {
    case TB_QMM_AUTO:
    case TB_QMM_DQ:
    case TB_QMM_PACKED: return 1;
    case TB_QMM_Q8: return (w->dtype == TB_I8 || w->dtype == TB_I4) && qmm_path() != qmm_scalar_t;
    default: return 0;
    }
}

void tb_cpu_qmatmul_tactic(tb_pool *p, tb_qmm_tactic t, const float *x, const tb_qweight *w, const float *bias,
                           float *y, int T, int K, int N) {
    if (T <= 0 || N <= 0) return;
    if (t == TB_QMM_AUTO || !tb_cpu_qmatmul_tactic_available(t, w)) t = qmm_default(T);
    /* Q8: VNNI where AVX-512 has it, else the AVX2 path's maddubs form */
    qmm_fn fn = t == TB_QMM_Q8 && avx512_ok() && tb_cpu_has_avx512vnni() ? qmm_vnni_t : qmm_path();
    qmm_job j = {fn, x, w, bias, y, T, K, N, (int)t, t == TB_QMM_PACKED ? 32 : 4};
    int nth = tb_pool_size(p);
    /* below ~8K multiply-adds waking the pool costs more than the work */
    if (nth == 1 || (double)T * K * N < 8192) qmm_run(&j, 0, 1);
    else tb_pool_run(p, qmm_run, &j);
}

void tb_cpu_qmatmul(tb_pool *p, const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K,
                    int N) {
    tb_cpu_qmatmul_tactic(p, TB_QMM_AUTO, x, w, bias, y, T, K, N);
}

/* ---------------------------------------------------------------- timing */

static int cmp_double(const void *a, const void *b) {
    double u = *(const double *)a, v = *(const double *)b;
    return u < v ? -1 : u > v;
}

tb_qmm_tactic tb_cpu_qmatmul_pick(tb_pool *p, const tb_qweight *w, int T, int K, int N, int allow_q8, const float *x,
                                  float *y) {
    /* the default first; the packed panels only for prefill-sized steps */
    tb_qmm_tactic cand[3], def = qmm_default(T);
    int nc = 0;
    cand[nc++] = def;
    if (def != TB_QMM_DQ) cand[nc++] = TB_QMM_DQ;
    if (def != TB_QMM_PACKED && T >= TB_CPU_GEMM_MIN_T) cand[nc++] = TB_QMM_PACKED;
    /* Q8 rounds x to 8 bits per block of 32, which adds little to int4's
     * own error and about doubles int8's (x with a 20x outlier every 97
     * channels, 768x2048 Gaussian weights, relative RMS error of y against
     * f32 weights: int8 DQ 0.81%, Q8 1.39%; int4 g128 DQ 11.3%, Q8 11.4%;
     * g32 9.5%, 9.6%). End to end both stay inside the perplexity gates
     * (docs/PERFORMANCE.md: int8 with Q8 everywhere on the demo model), so
     * the timing decides, unless the caller keeps the exact tactics. */
    if (allow_q8 && tb_cpu_qmatmul_tactic_available(TB_QMM_Q8, w)) cand[nc++] = TB_QMM_Q8;
    if (nc == 1) return TB_QMM_AUTO;
    /* alternate the candidates (a burst of load hits all), >= 9 rounds and
     * 4 ms, median of each; the default stays unless another is >7% faster */
    enum { MAXR = 201 };
    double tm[3][MAXR]; /* 4.8 KB of stack (thread-local storage would be zeroed in every thread) */
    for (int c = 0; c < nc; c++) tb_cpu_qmatmul_tactic(p, cand[c], x, w, NULL, y, T, K, N);
    double total = 0;
    int r = 0;
    while (r < MAXR && (r < 9 || total < 0.004)) {
        for (int c = 0; c < nc; c++) {
            double t0 = tb_now();
            tb_cpu_qmatmul_tactic(p, cand[c], x, w, NULL, y, T, K, N);
            tm[c][r] = tb_now() - t0;
            total += tm[c][r];
        }
        r++;
    }
    int best = 0;
    for (int c = 0; c < nc; c++) qsort(tm[c], (size_t)r, sizeof(double), cmp_double);
    for (int c = 1; c < nc; c++)
        if (tm[c][r / 2] < tm[best][r / 2] * 0.93) best = c;
    return best == 0 ? TB_QMM_AUTO : cand[best];
}
