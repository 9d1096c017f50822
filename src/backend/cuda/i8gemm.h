/* i8gemm.h — the int8 tensor-core GEMM's two kernels around cuBLASLt:
 * x (T, K) rounded to int8 with one scale a token (absmax / 127), and the
 * int32 product (T, N) turned into f32 in place with both scales and the
 * bias. An int8 matmul takes this path (W8A8) only where the engine asked
 * for int8 activations (`turbine build --qmm-tactics q8`) or
 * TB_CUDA_I8_GEMM_ALL=1, in steps of at least TB_CUDA_I8_GEMM tokens
 * (cuda_backend.c, i8_gemm_ok). Its own header, so that cuda_kernels.h
 * (included by every kernel file) stays as it is. */
#ifndef TB_BACKEND_CUDA_I8GEMM_H
#define TB_BACKEND_CUDA_I8GEMM_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* q (T, K) int8 codes, sx (T) scales: q = rint(x * (127 / absmax)) (the
 * quotient in f32, rounded to nearest even, as tb_ref below does), sx =
 * absmax / 127 (0 for a zero row). K % 4 == 0, x 16-byte aligned. */
cudaError_t tbc_quant_x_i8(const float *x, int T, int K, void *q, float *sx, cudaStream_t s);

/* y (T, N), holding int32 sums of codes, rewritten as f32: y = sum * sx[t]
 * * sw[n] (+ bias[n]). N % 4 == 0, y / sw / bias 16-byte aligned. */
cudaError_t tbc_scale_out_i32(float *y, int T, int N, const float *sx, const float *sw, const float *bias,
                              cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
