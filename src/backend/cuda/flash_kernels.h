/*
 * flash_kernels.h — flash-attention prefill over the paged KV cache (flash.cu).
 *
 * A run of n query tokens of one sequence (a prompt, or a chunk of one) is
 * attended causally in one kernel: tensor cores for S = q k^T and O = P v,
 * an online (running max / sum) softmax in f32, no score matrix in device
 * memory. It computes what the GEMM path (tbc_attn_gather, cuBLAS,
 * tbc_attn_softmax, cuBLAS) computes for an f16 cache, up to rounding:
 *   out[t, h, :] = softmax_j<=pos[t](scale * q16[t, h] . k[j, h / (H / KV)])
 *                  . v[j, h / (H / KV)]
 * with q rounded to f16, probabilities rounded to f16 before the product
 * with v, and f32 accumulation. Over a bf16 cache (kv_bf16) q and the
 * probabilities are rounded to bf16 instead and the products are bf16 ones.
 *
 * Included from C (cuda_backend.c) and from the .cu files.
 */
#ifndef TB_CUDA_FLASH_KERNELS_H
#define TB_CUDA_FLASH_KERNELS_H

#include "backend/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when tbc_flash_prefill handles this head size and cache type
 * (hd 64 or 128; exactly one of an f16 cache, a bf16 cache, or int8 / fp8
 * codes, kv_q). */
int tbc_flash_supports(int hd, int kv_f16, int kv_bf16, int kv_q);

/* Causal attention of the n query tokens t0..t0+n-1 of the step, all of one
 * sequence whose compact block-table row is `seq_slot`; their k and v are
 * already in the cache (rope done).
 *   qkv  (T, (H + 2 KV) hd) f32, q of token t, head h at qkv[t, h hd ..]
 *   out  (T, H hd) f32; only rows t0..t0+n-1 are written
 *   a    n_heads, n_kv, hd, scale, pos (T, device), block_tables,
 *        max_blocks, block_size (a power of two), k_cache / v_cache
 *        (n_blocks, block_size, KV, hd) f16 (bf16 with kv_bf16), or with kv_q int8 / fp8
 *        blocks (kv_block_bytes, kv_scale_off: core/kv_layout.h) read
 *        dequantised to f16; the other fields are unused
 * The positions are read on the device: token t attends keys 0..pos[t]
 * (pos[t0 + i] = pos[t0] + i for a run; pos[t0] > 0 is a chunk whose
 * earlier keys are already in the cache). No host synchronisation; with
 * tbc_set_pdl on, the kernel is launched as a programmatic dependent.
 * Returns cudaErrorInvalidValue for arguments it does not handle (see
 * tbc_flash_supports; also scale <= 0, a block size that is not a power of
 * two, n_heads not a multiple of n_kv), else the launch status. n = 0 does
 * nothing. */
cudaError_t tbc_flash_prefill(const tbc_attn_args *a, const float *qkv, float *out, int seq_slot, int t0, int n,
                              cudaStream_t s);

/* Tests and tuning: every later tbc_flash_prefill uses warps of 16 or 32
 * query rows (blocks of 64 or 128 rows); 0, the default, chooses per launch
 * (32 once that gives at least two blocks per multiprocessor). Process-wide. */
void tbc_flash_force_rows(int rows_per_warp);
/* Tuning: 1 (the default) pairs heavy and light row tiles on a
 * multiprocessor when the grid is at most two blocks per multiprocessor;
 * 0: heaviest first always. Process-wide. */
void tbc_flash_pair_order(int on);

#ifdef __cplusplus
}
#endif

#endif /* TB_CUDA_FLASH_KERNELS_H */
