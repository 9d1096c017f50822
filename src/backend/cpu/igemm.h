/*
 * igemm.h — int8 GEMM for the quantized general ops (INT8 ONNX engines):
 * activations quantized per tensor (uint8 codes with a zero point, a float
 * scale), weights int8 per output channel (symmetric, codes in [-127, 127]),
 * int32 accumulation, dequantized into f32 in the epilogue of the f32 GEMM
 * (bias, activation, residual: tb_cpu_sgemm_epi, nn.h):
 *
 *   Y[m, n] = epi( a_scale * w_scale[n] * sum_k (A[m, k] - a_zero) * W[n, k] )
 *
 * A (M, K) uint8 row-major with leading dim lda; W (N, K) int8 row-major,
 * packed once (it is a weight) by tb_cpu_igemm_pack into the kernel's layout
 * (tb_cpu_igemm_packed_bytes bytes, 64-byte aligned dst); the packed form
 * keeps each row's sum of codes, so the zero point costs one multiply-add
 * per output. Integer sums are exact: every path equals tb_ref_igemm bit for
 * bit before the f32 epilogue (which rounds like the sgemm's).
 * Symmetric int8 activations are a_zero = 128 (code = int8 + 128).
 *
 * Paths (chosen per call from tb_cpu_kernel_path(), so a forced path
 * applies): AVX-512 VNNI (vpdpbusd, igemm_avx512.c), AVX2 (exact int16
 * vpmaddwd, igemm_avx2.c), portable (igemm.c). All read the same packed
 * layout (igemm_impl.h), so a weight packed once serves every path.
 */
#ifndef TB_CPU_IGEMM_H
#define TB_CPU_IGEMM_H
#include "backend/cpu/nn.h"
#include <stdint.h>

size_t tb_cpu_igemm_packed_bytes(int64_t N, int64_t K);
void tb_cpu_igemm_pack(const int8_t *W, int64_t ldw, int64_t N, int64_t K, void *dst);

/* q[i] = clamp(round_half_even(x[i] * inv_scale) + zero, 0, 255): ONNX's
 * QuantizeLinear to uint8 (inv_scale = 1 / scale); NaN gives 0. */
void tb_cpu_quantize_u8(const float *x, uint8_t *q, int64_t n, float inv_scale, int zero);

/* Y (M, N), leading dim ldy, = the formula above; epi NULL: none. Split over
 * the pool when given. */
void tb_cpu_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const void *Wp, const float *w_scale, float *Y, int64_t ldy, const tb_cpu_sgemm_epi *epi,
                  tb_pool *pool);

/* The scalar reference, on W unpacked (N, K) with leading dim ldw. */
void tb_ref_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const int8_t *W, int64_t ldw, const float *w_scale, float *Y, int64_t ldy,
                  const tb_cpu_sgemm_epi *epi);

#endif /* TB_CPU_IGEMM_H */
