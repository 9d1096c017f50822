/*
 * qgemm.c — matmuls over quantized weights (kernels.h tb_qweight; encodings
 * in core/quant.h).
 *
 * tb_ref_qmatmul is the scalar reference every fast path is tested against:
 * each weight element dequantised on its own, f32 accumulation in the order
 * k = 0 .. K-1.
 *
 * tb_cpu_qmatmul splits the output columns across the pool; each thread
 * walks its rows of W once and, for each, every row of x (so the weights
 * stream once per call, the decode case), applying each group's scale once
 * to the group's partial sum (and the zero to the sum of x over the group).
 * The SIMD paths come next to it, chosen like tb_cpu_matmul's.
 */
#include "backend/cpu/kernels.h"
#include "core/quant.h"

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

typedef struct {
    const float *x;
    const tb_qweight *w;
    const float *bias;
    float *y;
    int T, K, N;
} qmm_args;

static void qmm_worker(void *arg, int ith, int nth) {
    const qmm_args *a = arg;
    const tb_qweight *w = a->w;
    int K = a->K, N = a->N, G = K / w->group;
    int n0 = (int)((int64_t)N * ith / nth), n1 = (int)((int64_t)N * (ith + 1) / nth);
    uint64_t rb = tb_quant_codes_bytes(w->dtype, 1, K);
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
        for (int t = 0; t < a->T; t++) {
            const float *xr = a->x + (size_t)t * K;
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
            a->y[(size_t)t * N + n] = acc + (a->bias ? a->bias[n] : 0.0f);
        }
    }
}

void tb_cpu_qmatmul(tb_pool *p, const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K,
                    int N) {
    qmm_args a = {x, w, bias, y, T, K, N};
    tb_pool_run(p, qmm_worker, &a);
}
