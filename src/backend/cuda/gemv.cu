/* gemv.cu — the decode matmul: y (T, N) = x (T, K) . w (N, K)^T (+ bias) for
 * T <= 8, reading each weight once at the memory-bandwidth limit.
 *
 * One warp per output row n; each lane streams 16-byte vectors of the row
 * (8 f16/bf16 or 4 f32 weights), four vectors in flight, and multiplies them
 * with every token's x (read through L1: x is tiny and shared by all warps).
 * f32 accumulation; for f16/bf16 weights x is rounded to the weight type
 * first (see cuda_kernels.h). Rows whose K is not a multiple of the vector
 * (or misaligned pointers) take the scalar kernel below. f16/bf16 weights
 * with K a multiple of 32 take the tensor-core kernel (gemv_mma_kernel)
 * unless TB_CUDA_GEMV=simt. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"

#define GEMV_WARPS 8

template <int WDT>
__device__ __forceinline__ float round_to_w(float v) {
    if (WDT == TBC_F16) return __half2float(__float2half_rn(v));
    if (WDT == TBC_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

/* The 16-byte vector u as 8 (f16/bf16) or 4 (f32) floats. */
template <int WDT>
__device__ __forceinline__ void unpack16(const uint4 &u, float *f) {
    if (WDT == TBC_F32) {
        f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
    } else {
        const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 p;
            if (WDT == TBC_F16) {
                __half2 h = *reinterpret_cast<const __half2 *>(&w4[i]);
                p = __half22float2(h);
            } else {
                __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162 *>(&w4[i]);
                p = __bfloat1622float2(h);
            }
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
}

template <int WDT, int TT>
__device__ __forceinline__ void gemv_accum(const float *__restrict__ x, int K, int k0, const uint4 &u, float *acc) {
    constexpr int VEC = WDT == TBC_F32 ? 4 : 8;
    float wf[VEC];
    unpack16<WDT>(u, wf);
#pragma unroll
    for (int t = 0; t < TT; t++) {
        const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)t * K + k0);
        float xf[VEC];
#pragma unroll
        for (int q = 0; q < VEC / 4; q++) {
            float4 a = __ldg(xp + q);
            xf[4 * q] = a.x; xf[4 * q + 1] = a.y; xf[4 * q + 2] = a.z; xf[4 * q + 3] = a.w;
        }
        float s = acc[t];
#pragma unroll
        for (int e = 0; e < VEC; e++) s = fmaf(round_to_w<WDT>(xf[e]), wf[e], s);
        acc[t] = s;
    }
}

template <int WDT, int TT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_vec_kernel(const float *__restrict__ x, const void *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ y, int K, int N) {
    constexpr int VEC = WDT == TBC_F32 ? 4 : 8;
    constexpr int ES = WDT == TBC_F32 ? 4 : 2;
    int lane = threadIdx.x & 31;
    int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    const uint4 *wr = reinterpret_cast<const uint4 *>(static_cast<const char *>(w) + (size_t)n * K * ES);
    int nv = K / VEC;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.0f;
    int v = lane;
    for (; v + 96 < nv; v += 128) {
        uint4 u0 = __ldg(wr + v), u1 = __ldg(wr + v + 32), u2 = __ldg(wr + v + 64), u3 = __ldg(wr + v + 96);
        gemv_accum<WDT, TT>(x, K, v * VEC, u0, acc);
        gemv_accum<WDT, TT>(x, K, (v + 32) * VEC, u1, acc);
        gemv_accum<WDT, TT>(x, K, (v + 64) * VEC, u2, acc);
        gemv_accum<WDT, TT>(x, K, (v + 96) * VEC, u3, acc);
    }
    for (; v < nv; v += 32) gemv_accum<WDT, TT>(x, K, v * VEC, __ldg(wr + v), acc);
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float s = tbc_warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * N + n] = s + (bias ? bias[n] : 0.0f);
    }
}

/* Any K, any alignment: one element per lane per step. */
template <int WDT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_scalar_kernel(const float *__restrict__ x, const void *__restrict__ w, const float *__restrict__ bias,
                   float *__restrict__ y, int T, int K, int N) {
    int lane = threadIdx.x & 31;
    int n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[TBC_GEMV_MAX_T];
#pragma unroll
    for (int t = 0; t < TBC_GEMV_MAX_T; t++) acc[t] = 0.0f;
    size_t base = (size_t)n * K;
    for (int k = lane; k < K; k += 32) {
        float wv = tbc_load(w, WDT, base + k);
#pragma unroll
        for (int t = 0; t < TBC_GEMV_MAX_T; t++)
            if (t < T) acc[t] = fmaf(round_to_w<WDT>(x[(size_t)t * K + k]), wv, acc[t]);
    }
#pragma unroll
    for (int t = 0; t < TBC_GEMV_MAX_T; t++) {
        if (t >= T) break;
        float s = tbc_warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * N + n] = s + (bias ? bias[n] : 0.0f);
    }
}

/* ---------------------------------------------------------------- tensor cores
 * f16/bf16 weights, K a multiple of 32: mma.sync m16n8k16 (f32 accumulate)
 * with the weights as A (16 rows) and the tokens as B (n = 8 columns, tokens
 * >= T zero). A block owns 16 rows; its GEMV_MMA_WARPS warps take turns over
 * K in steps of 32. The dot product does not care about the order of k, so
 * each thread loads 16 contiguous bytes of its two rows (g and g + 8) and of
 * x for token g, and uses halves 0-3 in the first mma and 4-7 in the second:
 * the k slot -> memory position map then depends only on the thread's
 * position in its quad (t), the same for A and B, and needs no shuffles. */
#define GEMV_MMA_WARPS 8

template <int WDT>
__device__ __forceinline__ void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    if (WDT == TBC_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two f32 values as one packed f16x2 / bf16x2 register (round to nearest). */
template <int WDT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    if (WDT == TBC_F16) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* 8 f32 of x (16-byte aligned) as 4 packed registers. */
template <int WDT>
__device__ __forceinline__ uint4 load_x8(const float *p) {
    float4 a = __ldg(reinterpret_cast<const float4 *>(p)), b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    uint4 r;
    r.x = pack2<WDT>(a.x, a.y);
    r.y = pack2<WDT>(a.z, a.w);
    r.z = pack2<WDT>(b.x, b.y);
    r.w = pack2<WDT>(b.z, b.w);
    return r;
}

template <int WDT>
__device__ __forceinline__ void mma_step(float *c, const uint4 &wa, const uint4 &wb, const uint4 &x) {
    mma16816<WDT>(c, wa.x, wb.x, wa.y, wb.y, x.x, x.y);
    mma16816<WDT>(c, wa.z, wb.z, wa.w, wb.w, x.z, x.w);
}

template <int WDT>
__global__ void __launch_bounds__(GEMV_MMA_WARPS * 32)
gemv_mma_kernel(const float *__restrict__ x, const void *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ y, int T, int K, int N) {
    __shared__ float red[GEMV_MMA_WARPS][32][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16, ra = r0 + g, rb = r0 + g + 8;
    const uint16_t *wbase = static_cast<const uint16_t *>(w);
    /* rows past N are read from row N - 1 and never written */
    const uint4 *pa = reinterpret_cast<const uint4 *>(wbase + (size_t)min(ra, N - 1) * K) + t;
    const uint4 *pb = reinterpret_cast<const uint4 *>(wbase + (size_t)min(rb, N - 1) * K) + t;
    const bool has_x = g < T;
    const float *px = x + (size_t)(has_x ? g : 0) * K + t * 8;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int steps = K / 32;
    int s = warp;
    for (; s + 3 * GEMV_MMA_WARPS < steps; s += 4 * GEMV_MMA_WARPS) {
        uint4 a0 = __ldg(pa + (size_t)s * 4), b0 = __ldg(pb + (size_t)s * 4);
        uint4 a1 = __ldg(pa + (size_t)(s + GEMV_MMA_WARPS) * 4), b1 = __ldg(pb + (size_t)(s + GEMV_MMA_WARPS) * 4);
        uint4 a2 = __ldg(pa + (size_t)(s + 2 * GEMV_MMA_WARPS) * 4),
              b2 = __ldg(pb + (size_t)(s + 2 * GEMV_MMA_WARPS) * 4);
        uint4 a3 = __ldg(pa + (size_t)(s + 3 * GEMV_MMA_WARPS) * 4),
              b3 = __ldg(pb + (size_t)(s + 3 * GEMV_MMA_WARPS) * 4);
        uint4 x0 = has_x ? load_x8<WDT>(px + (size_t)s * 32) : zero;
        uint4 x1 = has_x ? load_x8<WDT>(px + (size_t)(s + GEMV_MMA_WARPS) * 32) : zero;
        uint4 x2 = has_x ? load_x8<WDT>(px + (size_t)(s + 2 * GEMV_MMA_WARPS) * 32) : zero;
        uint4 x3 = has_x ? load_x8<WDT>(px + (size_t)(s + 3 * GEMV_MMA_WARPS) * 32) : zero;
        mma_step<WDT>(c, a0, b0, x0);
        mma_step<WDT>(c, a1, b1, x1);
        mma_step<WDT>(c, a2, b2, x2);
        mma_step<WDT>(c, a3, b3, x3);
    }
    for (; s < steps; s += GEMV_MMA_WARPS) {
        uint4 a0 = __ldg(pa + (size_t)s * 4), b0 = __ldg(pb + (size_t)s * 4);
        uint4 x0 = has_x ? load_x8<WDT>(px + (size_t)s * 32) : zero;
        mma_step<WDT>(c, a0, b0, x0);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][lane][i] = c[i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < GEMV_MMA_WARPS; k++) v += red[k][lane][i];
        c[i] = v;
    }
    /* c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8 */
    const int t0 = 2 * t, t1 = 2 * t + 1;
    if (ra < N) {
        float bb = bias ? bias[ra] : 0.0f;
        if (t0 < T) y[(size_t)t0 * N + ra] = c[0] + bb;
        if (t1 < T) y[(size_t)t1 * N + ra] = c[1] + bb;
    }
    if (rb < N) {
        float bb = bias ? bias[rb] : 0.0f;
        if (t0 < T) y[(size_t)t0 * N + rb] = c[2] + bb;
        if (t1 < T) y[(size_t)t1 * N + rb] = c[3] + bb;
    }
}

static int gemv_use_mma(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TB_CUDA_GEMV");
        v = !(e && !strcmp(e, "simt"));
    }
    return v;
}

template <int WDT>
static cudaError_t gemv_launch(const float *x, const void *w, const float *bias, float *y, int T, int K, int N,
                               cudaStream_t s) {
    constexpr int VEC = WDT == TBC_F32 ? 4 : 8;
    dim3 grid((N + GEMV_WARPS - 1) / GEMV_WARPS), block(GEMV_WARPS * 32);
    int aligned = K % VEC == 0 && (((uintptr_t)x | (uintptr_t)w) & 15) == 0;
    if (WDT != TBC_F32 && aligned && K % 32 == 0 && gemv_use_mma()) {
        gemv_mma_kernel<WDT><<<(N + 15) / 16, GEMV_MMA_WARPS * 32, 0, s>>>(x, w, bias, y, T, K, N);
        return cudaGetLastError();
    }
    if (!aligned) {
        gemv_scalar_kernel<WDT><<<grid, block, 0, s>>>(x, w, bias, y, T, K, N);
        return cudaGetLastError();
    }
    switch (T) {
    case 1: gemv_vec_kernel<WDT, 1><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    case 2: gemv_vec_kernel<WDT, 2><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    case 3: gemv_vec_kernel<WDT, 3><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    case 4: gemv_vec_kernel<WDT, 4><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    case 5: gemv_vec_kernel<WDT, 5><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    case 6: gemv_vec_kernel<WDT, 6><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    case 7: gemv_vec_kernel<WDT, 7><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    case 8: gemv_vec_kernel<WDT, 8><<<grid, block, 0, s>>>(x, w, bias, y, K, N); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t tbc_gemv(const float *x, const void *w, tbc_dtype wdt, const float *bias, float *y, int T,
                                int K, int N, cudaStream_t s) {
    if (T < 1 || T > TBC_GEMV_MAX_T) return cudaErrorInvalidValue;
    switch (wdt) {
    case TBC_F32: return gemv_launch<TBC_F32>(x, w, bias, y, T, K, N, s);
    case TBC_F16: return gemv_launch<TBC_F16>(x, w, bias, y, T, K, N, s);
    case TBC_BF16: return gemv_launch<TBC_BF16>(x, w, bias, y, T, K, N, s);
    }
    return cudaErrorInvalidValue;
}
