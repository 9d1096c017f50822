/*
 * igemm.c — the int8 GEMM of igemm.h: the scalar reference, the packing and
 * the portable path (the packed form here: W's rows as they are, 64-byte
 * aligned, then the N row sums as int32).
 */
#include "backend/cpu/igemm.h"
#include "backend/cpu/nn_conv_impl.h"
#include <math.h>
#include <string.h>

static int64_t row_bytes(int64_t K) { return (K + 63) / 64 * 64; }

size_t tb_cpu_igemm_packed_bytes(int64_t N, int64_t K) {
    return (size_t)(N * row_bytes(K)) + (size_t)N * sizeof(int32_t);
}

void tb_cpu_igemm_pack(const int8_t *W, int64_t ldw, int64_t N, int64_t K, void *dst) {
    int8_t *rows = dst;
    int32_t *sums = (int32_t *)(rows + N * row_bytes(K));
    for (int64_t n = 0; n < N; n++) {
        memcpy(rows + n * row_bytes(K), W + n * ldw, (size_t)K);
        memset(rows + n * row_bytes(K) + K, 0, (size_t)(row_bytes(K) - K));
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += W[n * ldw + k];
        sums[n] = s;
    }
}

void tb_cpu_quantize_u8(const float *x, uint8_t *q, int64_t n, float inv_scale, int zero) {
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] * inv_scale) + (float)zero; /* default rounding mode: half to even */
        q[i] = (uint8_t)(v < 0.f ? 0.f : v > 255.f ? 255.f : v);
    }
}

static void dot_rows(int64_t m0, int64_t m1, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero,
                     float a_scale, const int8_t *W, int64_t ldw, const int32_t *wsum, const float *w_scale,
                     float *Y, int64_t ldy) {
    for (int64_t m = m0; m < m1; m++)
        for (int64_t n = 0; n < N; n++) {
            const uint8_t *a = A + m * lda;
            const int8_t *w = W + n * ldw;
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += (int32_t)a[k] * (int32_t)w[k];
            int32_t s = wsum ? wsum[n] : 0;
            if (!wsum)
                for (int64_t k = 0; k < K; k++) s += w[k];
            acc -= a_zero * s;
            Y[m * ldy + n] = (float)acc * (a_scale * w_scale[n]);
        }
}

void tb_ref_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const int8_t *W, int64_t ldw, const float *w_scale, float *Y, int64_t ldy,
                  const tb_cpu_sgemm_epi *epi) {
    dot_rows(0, M, N, K, A, lda, a_zero, a_scale, W, ldw, NULL, w_scale, Y, ldy);
    if (epi) tb_cpu_nn_epilogue(Y, ldy, M, N, epi);
}

typedef struct {
    int64_t M, N, K, lda, ldy;
    const uint8_t *A;
    int a_zero;
    float a_scale;
    const int8_t *W;
    const int32_t *wsum;
    const float *w_scale;
    float *Y;
    const tb_cpu_sgemm_epi *epi;
} igemm_job;

static void igemm_task(void *arg, int ith, int nth) {
    const igemm_job *j = arg;
    int64_t m0 = j->M * ith / nth, m1 = j->M * (ith + 1) / nth;
    if (m0 >= m1) return;
    dot_rows(m0, m1, j->N, j->K, j->A, j->lda, j->a_zero, j->a_scale, j->W, row_bytes(j->K), j->wsum, j->w_scale,
             j->Y, j->ldy);
    if (j->epi) {
        tb_cpu_sgemm_epi e = *j->epi; /* rows m0..m1: move the per-row and matrix reads */
        if (e.bias) e.bias += m0 * e.bias_rs;
        if (e.res) e.res += m0 * e.ld_res;
        tb_cpu_nn_epilogue(j->Y + m0 * j->ldy, j->ldy, m1 - m0, j->N, &e);
    }
}

void tb_cpu_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const void *Wp, const float *w_scale, float *Y, int64_t ldy, const tb_cpu_sgemm_epi *epi,
                  tb_pool *pool) {
    igemm_job j = {M, N, K, lda, ldy, A, a_zero, a_scale, Wp,
                   (const int32_t *)((const int8_t *)Wp + N * row_bytes(K)), w_scale, Y, epi};
    if (pool)
        tb_pool_run(pool, igemm_task, &j);
    else
        igemm_task(&j, 0, 1);
}
