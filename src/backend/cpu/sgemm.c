/* sgemm.c — f32 GEMM for the general ops (nn.h): the reference loop order
 * for now; blocked and vectorised kernels replace it. */
#include "backend/cpu/nn.h"

void tb_cpu_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, tb_pool *pool) {
    (void)pool;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) {
                float a = ta ? A[k * lda + i] : A[i * lda + k];
                float b = tb ? B[j * ldb + k] : B[k * ldb + j];
                acc += (double)a * b;
            }
            float *c = &C[i * ldc + j];
            *c = alpha * (float)acc + (beta != 0.0f ? beta * *c : 0.0f);
        }
}
