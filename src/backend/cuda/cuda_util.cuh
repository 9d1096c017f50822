/* cuda_util.cuh — device helpers shared by the .cu files: typed loads,
 * warp and block reductions, one RoPE rotation. */
#ifndef TB_CUDA_UTIL_CUH
#define TB_CUDA_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_kernels.h"

/* Element i of a weight array of type wdt, as f32. */
__device__ __forceinline__ float tbc_load(const void *p, int wdt, size_t i) {
    if (wdt == TBC_F16) return __half2float(((const __half *)p)[i]);
    if (wdt == TBC_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ float tbc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32); every thread gets it.
 * red: 32 floats of shared memory. */
__device__ __forceinline__ float tbc_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tbc_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return tbc_warp_sum(v);
}

/* Rotates pair j of one head by `angle` (the reference's layouts:
 * interleaved = 0 pairs (j, j + half), 1 pairs (2j, 2j + 1)). Accurate
 * sin/cos: positions reach thousands of radians. */
__device__ __forceinline__ void tbc_rotate_pair(float *v, int j, int half, int interleaved, float angle) {
    float sn, cs;
    sincosf(angle, &sn, &cs);
    int i0 = interleaved ? 2 * j : j;
    int i1 = interleaved ? 2 * j + 1 : j + half;
    float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * cs - x1 * sn;
    v[i1] = x0 * sn + x1 * cs;
}

#endif /* TB_CUDA_UTIL_CUH */
