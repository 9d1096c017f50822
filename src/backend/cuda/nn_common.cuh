/* nn_common.cuh — typed loads and stores of the general ops' kernels: any
 * tb_dtype element read as float / double / int64 and written back rounded
 * (floats), truncated and wrapped (integers) or as x != 0 (bool), as the
 * references do. The dtype is a run-time value, the same for every thread
 * of a launch (a uniform branch). */
#ifndef TB_CUDA_NN_COMMON_CUH
#define TB_CUDA_NN_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/nn_cuda.h"

__device__ __forceinline__ int tbn_is_float(int dt) {
    return dt == TBN_F32 || dt == TBN_F16 || dt == TBN_BF16 || dt == TBN_F64;
}

__device__ __forceinline__ float tbn_ldf(const void *p, int dt, int64_t i) {
    switch (dt) {
    case TBN_F32: return ((const float *)p)[i];
    case TBN_F16: return __half2float(((const __half *)p)[i]);
    case TBN_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case TBN_F64: return (float)((const double *)p)[i];
    case TBN_I32: return (float)((const int32_t *)p)[i];
    case TBN_I64: return (float)((const int64_t *)p)[i];
    case TBN_I8: return (float)((const int8_t *)p)[i];
    default: return (float)((const uint8_t *)p)[i];
    }
}

__device__ __forceinline__ double tbn_ldd(const void *p, int dt, int64_t i) {
    if (dt == TBN_F64) return ((const double *)p)[i];
    if (dt == TBN_I64) return (double)((const int64_t *)p)[i];
    return (double)tbn_ldf(p, dt, i);
}

__device__ __forceinline__ int64_t tbn_ldi(const void *p, int dt, int64_t i) {
    switch (dt) {
    case TBN_I64: return ((const int64_t *)p)[i];
    case TBN_I32: return ((const int32_t *)p)[i];
    case TBN_I8: return ((const int8_t *)p)[i];
    case TBN_U8: case TBN_BOOL: return ((const uint8_t *)p)[i];
    default: {
        double x = tbn_ldd(p, dt, i);
        if (x != x) return 0;
        if (x >= 9223372036854775807.0) return INT64_MAX;
        if (x <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)x;
    }
    }
}

__device__ __forceinline__ void tbn_sti(void *p, int dt, int64_t i, int64_t x);

__device__ __forceinline__ void tbn_std(void *p, int dt, int64_t i, double x) {
    switch (dt) {
    case TBN_F32: ((float *)p)[i] = (float)x; break;
    case TBN_F16: ((__half *)p)[i] = __float2half_rn((float)x); break;
    case TBN_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)x); break;
    case TBN_F64: ((double *)p)[i] = x; break;
    case TBN_BOOL: ((uint8_t *)p)[i] = x != 0; break;
    default: {
        int64_t v = x != x ? 0 : x >= 9223372036854775807.0 ? INT64_MAX
                                 : x <= -9223372036854775808.0 ? INT64_MIN : (int64_t)x;
        tbn_sti(p, dt, i, v);
    }
    }
}

__device__ __forceinline__ void tbn_stf(void *p, int dt, int64_t i, float x) {
    switch (dt) {
    case TBN_F32: ((float *)p)[i] = x; break;
    case TBN_F16: ((__half *)p)[i] = __float2half_rn(x); break;
    case TBN_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x); break;
    default: tbn_std(p, dt, i, (double)x); break;
    }
}

__device__ __forceinline__ void tbn_sti(void *p, int dt, int64_t i, int64_t x) {
    switch (dt) {
    case TBN_I64: ((int64_t *)p)[i] = x; break;
    case TBN_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)x; break;
    case TBN_I8: ((int8_t *)p)[i] = (int8_t)(uint8_t)(uint64_t)x; break;
    case TBN_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)x; break;
    case TBN_BOOL: ((uint8_t *)p)[i] = x != 0; break;
    default: tbn_std(p, dt, i, (double)x); break;
    }
}

__device__ __forceinline__ float tbn_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float tbn_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* grid size for n elements at `threads` per block, capped (grid-stride loops) */
static inline unsigned tbn_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535LL * 32) b = 65535LL * 32;
    return (unsigned)(b < 1 ? 1 : b);
}

#endif /* TB_CUDA_NN_COMMON_CUH */
