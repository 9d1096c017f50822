/* qgemm.h — the mixed-input GEMM of quantized weights: y (T, N) = x (T, K)
 * dq(W)^T (+ bias) for steps of more tokens than the quantized GEMV's chunks
 * take (cuda_backend.c, qgemm_ok), without a dequantised copy of W.
 *
 * x comes as f16 (T, K) (what a producer writes for the f16 path, or
 * tbc_convert_f32); the codes (int8, e4m3, int4 as core/quant.h stores them)
 * are widened to f16 in registers (int8 / e4m3 exactly, the row scale on the
 * f32 sums; int4 as code * scale (+ zero) rounded to f16, as the GEMV does)
 * and multiplied on the tensor cores (mma.sync m16n8k16, f32 accumulate).
 * A block takes 128 rows by 8 to 64 tokens; K flows through a ring of shared
 * memory filled with cp.async. Shapes with few row blocks split K across
 * blocks (partial sums added in a fixed order, in a cluster's shared
 * memory or through the caller's workspace: the result does not depend on
 * timing). Its own header, so
 * that cuda_kernels.h (included by every kernel file) stays as it is. */
#ifndef TB_BACKEND_CUDA_QGEMM_H
#define TB_BACKEND_CUDA_QGEMM_H

#include <stddef.h>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when tbc_qgemm takes weights w with x16 (T, K) f16: K % 64 == 0 (int8,
 * e4m3; one scale a row) or K % 128 == 0 (int4, groups of 32, 64 or 128 with
 * K % group == 0), codes / x16 / scales / zeros 16-byte aligned. */
int tbc_qgemm_supports(const tbc_qweight *w, const void *x16, int T, int K);

/* The K splits tbc_qgemm takes for (T, K, N) on this device with a workspace
 * of ws_bytes (1: none; each split needs T * N floats of it). */
int tbc_qgemm_splits(const tbc_qweight *w, int T, int K, int N, size_t ws_bytes);

/* Tokens a block takes with two 16-row tiles a warp (16, 32 or 64: the
 * shapes 1..3 of tbc_set_qgemm_cfg; else 0: by T and type).
 * Process-wide; the backend sets it from TB_CUDA_QGEMM_BN. */
void tbc_set_qgemm_bn(int bn);

/* The block shape by number (0: by T and type, qgemm.cu's qg_cfg_of): 1..3 two
 * 16-row tiles a warp over 16 / 32 / 64 tokens (what bn 16 / 32 / 64 set);
 * 4..7 one 16-row tile a warp (8 warps along the rows) over 8 / 16 / 32 /
 * 64 tokens. Process-wide (the last of this and tbc_set_qgemm_bn counts);
 * TB_CUDA_QGEMM_CFG. */
void tbc_set_qgemm_cfg(int cfg);

/* 1: on compute capability 9.0+ the K splits of a tile run as one cluster
 * and add their partial sums through distributed shared memory; 0: through
 * the workspace and a second kernel (the same sums in the same order either
 * way); -1 (default): clusters for int8 / e4m3 steps of more than 16 tokens
 * in 2..5 splits. TB_CUDA_QGEMM_CLUSTER. */
void tbc_set_qgemm_cluster(int on);

/* K splits forced to sp (1..8; 0: by tbc_qgemm_splits' occupancy rule),
 * still bounded by the steps and the workspace. TB_CUDA_QGEMM_SPLIT. */
void tbc_set_qgemm_split(int sp);

/* y (T, N) f32 = x16 . dq(w)^T (+ bias (N)); ws: the workspace of
 * tbc_qgemm_splits (may be NULL when ws_bytes is 0). Launched with the
 * programmatic-serialization attribute while tbc_pdl_on (the kernels wait
 * for the previous one before reading x16). */
cudaError_t tbc_qgemm(const void *x16, const tbc_qweight *w, const float *bias, float *y, int T, int K, int N,
                      float *ws, size_t ws_bytes, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
