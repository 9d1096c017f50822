/* kernels.cu — the small CUDA kernels: embedding, RMSNorm (with the fused
 * residual add), SiLU-gated product, add, row gather, bias, f32 -> f16/bf16,
 * RoPE. Each section: kernel, then its launcher (grid and stream). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"

int tbc_pdl_on = 0;

extern "C" void tbc_set_pdl(int on) { tbc_pdl_on = on; }

/* ---------------------------------------------------------------- embedding */

__global__ void embedding_kernel(const int32_t *ids, const void *table, int wdt, float *y, int D, int lo, int V) {
    tbc_pdl_wait();
    int t = blockIdx.x;
    long long id = (long long)ids[t] - lo;
    float *yr = y + (size_t)t * D;
    if (id < 0 || id >= V) {
        for (int d = threadIdx.x; d < D; d += blockDim.x) yr[d] = 0.0f;
        return;
    }
    size_t base = (size_t)id * (size_t)D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) yr[d] = tbc_load(table, wdt, base + d);
}

extern "C" cudaError_t tbc_embedding(const int32_t *ids, const void *table, tbc_dtype wdt, float *y, int T, int D,
                                     int lo, int V, cudaStream_t s) {
    return tbc_launch(embedding_kernel, dim3(T), dim3(256), 0, s, ids, table, (int)wdt, y, D, lo, V);
}

/* ---------------------------------------------------------------- tensor-parallel collectives */

__global__ void allreduce_slice_kernel(tbc_rank_ptrs b, int n, size_t lo, size_t hi) {
    for (size_t i = lo + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += (size_t)gridDim.x * blockDim.x) {
        float sum = b.p[0][i];
        for (int k = 1; k < n; k++) sum += b.p[k][i];
        for (int k = 0; k < n; k++) b.p[k][i] = sum;
    }
}

extern "C" cudaError_t tbc_allreduce_slice(tbc_rank_ptrs bufs, int n, size_t count, int rank, cudaStream_t s) {
    size_t per = (count + (size_t)n - 1) / (size_t)n, lo = per * (size_t)rank, hi = lo + per;
    if (lo > count) lo = count;
    if (hi > count) hi = count;
    if (hi <= lo) return cudaSuccess;
    size_t blocks = (hi - lo + 255) / 256;
    if (blocks > 1024) blocks = 1024;
    allreduce_slice_kernel<<<(unsigned)blocks, 256, 0, s>>>(bufs, n, lo, hi);
    return cudaGetLastError();
}

__global__ void gather_cols_kernel(tbc_rank_ptrs xs, int n, float *y, int C) {
    int r = blockIdx.x;
    size_t W = (size_t)C * n;
    for (size_t j = threadIdx.x; j < W; j += blockDim.x)
        y[(size_t)r * W + j] = xs.p[j / C][(size_t)r * C + j % C];
}

extern "C" cudaError_t tbc_gather_cols(tbc_rank_ptrs xs, int n, float *y, int rows, int C, cudaStream_t s) {
    if (rows <= 0) return cudaSuccess;
    gather_cols_kernel<<<rows, 256, 0, s>>>(xs, n, y, C);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- rmsnorm */

/* y[i] = v, or with y16 set (the next matmul's input) v rounded to dt16
 * into y16[i] instead. */
__device__ __forceinline__ void store_act(float *y, void *y16, int dt16, size_t i, float v) {
    if (!y16) y[i] = v;
    else if (dt16 == TBC_BF16) ((__nv_bfloat16 *)y16)[i] = __float2bfloat16(v);
    else ((__half *)y16)[i] = __float2half(v);
}

/* One block per row. With `d` set, r = x + d is written first and normed. */
__global__ void rmsnorm_kernel(const float *x, const float *dl, const float *w, float *r, float *y, int D, float eps,
                               void *y16, int dt16) {
    tbc_pdl_wait();
    tbc_pdl_trigger();
    __shared__ float red[32];
    size_t off = (size_t)blockIdx.x * D;
    const float *xr = x + off;
    float ss = 0.0f;
    if (dl) {
        const float *dr = dl + off;
        float *rr = r + off;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            float v = xr[i] + dr[i];
            rr[i] = v;
            ss += v * v;
        }
        xr = rr; /* each thread re-reads only what it wrote */
    } else {
        for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    }
    ss = tbc_block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) store_act(y, y16, dt16, off + i, xr[i] * inv * w[i]);
}

static int norm_threads(int D) {
    int t = 32;
    while (t < D && t < 1024) t *= 2;
    return t;
}

extern "C" cudaError_t tbc_rmsnorm(const float *x, const float *w, float *y, int T, int D, float eps, void *y16,
                                   tbc_dtype dt16, cudaStream_t s) {
    return tbc_launch(rmsnorm_kernel, dim3(T), dim3(norm_threads(D / 4 > 32 ? D / 4 : 32)), 0, s, x,
                      (const float *)NULL, w, (float *)NULL, y, D, eps, y16, (int)dt16);
}

extern "C" cudaError_t tbc_add_rmsnorm(const float *x, const float *d, const float *w, float *r, float *y, int T,
                                       int D, float eps, void *y16, tbc_dtype dt16, cudaStream_t s) {
    return tbc_launch(rmsnorm_kernel, dim3(T), dim3(norm_threads(D / 4 > 32 ? D / 4 : 32)), 0, s, x, d, w, r, y, D,
                      eps, y16, (int)dt16);
}

/* ---------------------------------------------------------------- the FP8 GEMM's input
 * An e4m3 matmul on the FP8 tensor cores reads x as codes and one scale a
 * token (quant_x_fp8_kernel in gemv.cu: s = absmax / 448). Its producer, an
 * RMSNorm (with the residual add) or SiLU·mul, writes them itself here: one
 * block a token keeps the row's f32 values in shared memory between its
 * passes (the sum of squares, the absmax, the codes), so each input is read
 * once from memory and only codes are written. An input that is itself a
 * raw FP8 product (the GEMM before skipped tbc_scale_out) is scaled as it
 * is read: d * (sx[t] * sw[n]) + bias[n], with the sx[t] this kernel then
 * overwrites with its own scale. */

__device__ __forceinline__ float4 scale4(float4 v, float st, float4 w, const float4 *b) {
    v.x *= st * w.x;
    v.y *= st * w.y;
    v.z *= st * w.z;
    v.w *= st * w.w;
    if (b) {
        v.x += b->x;
        v.y += b->y;
        v.z += b->z;
        v.w += b->w;
    }
    return v;
}

__device__ __forceinline__ float amax4(float m, float4 v) {
    return fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
}

/* g sigmoid(g) u with the fast exp and division: the FP8 producer rounds
 * the result to e4m3 (3 mantissa bits) just after; expf and an IEEE
 * division had the SiLU·mul producer issue-bound. For g < -88, __expf(-g)
 * is inf and the result -0, as the exact form underflows to. */
__device__ __forceinline__ float silu_times_fast(float g, float u) { return __fdividef(g, 1.0f + __expf(-g)) * u; }

/* the block's max of m (every thread gets it); red free on entry */
__device__ __forceinline__ float block_max(float m, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncthreads();
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = lane < nw ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

/* Four values of the raw product at p[i] (f32, or f16 with R16): loaded
 * as they are (raw_t, held in registers until used), then widened. */
template <bool R16> struct raw_of { typedef float4 type; };
template <> struct raw_of<true> { typedef uint2 type; };
template <bool R16>
__device__ __forceinline__ typename raw_of<R16>::type raw_load(const void *p, int i) {
    return reinterpret_cast<const typename raw_of<R16>::type *>(p)[i];
}
__device__ __forceinline__ float4 raw_widen(float4 v) { return v; }
__device__ __forceinline__ float4 raw_widen(uint2 u) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
template <bool R16>
__device__ __forceinline__ float4 raw4(const void *p, int i) { return raw_widen(raw_load<R16>(p, i)); }

/* Row t of x (T, D), or (T, 2D) of [g | u] for SiLU·mul; d, r (T, D); w (D);
 * sw, bias (D, or 2D for SiLU·mul) with sw NULL: the input is not scaled.
 * R16: the scaled input (d, or x for SiLU·mul) is an f16 raw product, its
 * scale sx[t] * mul. A thread takes float4 i = threadIdx.x + k blockDim.x
 * in chunks of ACT_U: the chunk's loads (predicated) are all issued before
 * its arithmetic, so a block has ACT_U loads a thread in flight; at most
 * 64 registers, so that 1024 threads fit one SM and 256 (steps of 256
 * tokens or more) four blocks. (One load at a time with 1024-thread blocks of 35
 * registers, one block an SM, made SiLU·mul 25 us a 7B layer at 512
 * tokens.) */
#define ACT_U 4
template <int KIND, bool R16>
__global__ void __launch_bounds__(1024) act_fp8_kernel(const float *x, const float *d, const float *__restrict__ w,
                                                       float *r, int D, float eps, const float *__restrict__ sw,
                                                       const float *__restrict__ bias, float mul,
                                                       unsigned char *__restrict__ q, float *sx) {
    extern __shared__ float4 act_row[]; /* (D / 4): the row's values */
    __shared__ float red[32];
    tbc_pdl_wait();
    tbc_pdl_trigger();
    const int t = blockIdx.x, D4 = D >> 2, nt = blockDim.x;
    const float st = sw ? (R16 ? sx[t] * mul : sx[t]) : 0.0f; /* read by every thread before the first barrier */
    const float4 *sw4 = reinterpret_cast<const float4 *>(sw), *b4 = reinterpret_cast<const float4 *>(bias);
    float m = 0.0f;
    if (KIND == TBC_ACT_SILU) {
        const size_t row = (size_t)t * 2 * D; /* element offset of [g | u] */
        const void *gp = R16 ? (const void *)(reinterpret_cast<const __half *>(x) + row) : (const void *)(x + row);
        const void *up = R16 ? (const void *)(reinterpret_cast<const __half *>(x) + row + D) : (const void *)(x + row + D);
        for (int i0 = threadIdx.x; i0 < D4; i0 += ACT_U * nt) {
            typename raw_of<R16>::type g[ACT_U], u[ACT_U];
#pragma unroll
            for (int k = 0; k < ACT_U; k++) { /* loads (the scales, L2's, as they are used) */
                const int i = i0 + k * nt;
                if (i < D4) {
                    g[k] = raw_load<R16>(gp, i);
                    u[k] = raw_load<R16>(up, i);
                }
            }
#pragma unroll
            for (int k = 0; k < ACT_U; k++) {
                const int i = i0 + k * nt;
                if (i >= D4) break;
                float4 gk = raw_widen(g[k]), uk = raw_widen(u[k]), h;
                if (sw) {
                    gk = scale4(gk, st, sw4[i], b4 ? b4 + i : NULL);
                    uk = scale4(uk, st, sw4[D4 + i], b4 ? b4 + D4 + i : NULL);
                }
                h.x = silu_times_fast(gk.x, uk.x);
                h.y = silu_times_fast(gk.y, uk.y);
                h.z = silu_times_fast(gk.z, uk.z);
                h.w = silu_times_fast(gk.w, uk.w);
                act_row[i] = h;
                m = amax4(m, h);
            }
        }
    } else {
        const float4 *x4 = reinterpret_cast<const float4 *>(x + (size_t)t * D);
        const void *dp = KIND != TBC_ACT_ADDNORM ? NULL
                         : R16 ? (const void *)(reinterpret_cast<const __half *>(d) + (size_t)t * D)
                               : (const void *)(d + (size_t)t * D);
        float4 *r4 = KIND == TBC_ACT_ADDNORM ? reinterpret_cast<float4 *>(r + (size_t)t * D) : NULL;
        float ss = 0.0f;
        for (int i0 = threadIdx.x; i0 < D4; i0 += ACT_U * nt) {
            float4 v[ACT_U], ws[ACT_U];
            typename raw_of<R16>::type e[ACT_U];
#pragma unroll
            for (int k = 0; k < ACT_U; k++) { /* loads, with an f16 input its scales' too (f32: L2's at use) */
                const int i = i0 + k * nt;
                if (i < D4) {
                    v[k] = x4[i];
                    if (KIND == TBC_ACT_ADDNORM) e[k] = raw_load<R16>(dp, i);
                    if (KIND == TBC_ACT_ADDNORM && R16 && sw) ws[k] = sw4[i];
                }
            }
#pragma unroll
            for (int k = 0; k < ACT_U; k++) {
                const int i = i0 + k * nt;
                if (i >= D4) break;
                float4 vk = v[k];
                if (KIND == TBC_ACT_ADDNORM) {
                    float4 ek = raw_widen(e[k]);
                    if (sw) ek = scale4(ek, st, R16 ? ws[k] : sw4[i], b4 ? b4 + i : NULL);
                    vk.x += ek.x;
                    vk.y += ek.y;
                    vk.z += ek.z;
                    vk.w += ek.w;
                    r4[i] = vk;
                }
                act_row[i] = vk;
                ss += vk.x * vk.x + vk.y * vk.y + vk.z * vk.z + vk.w * vk.w;
            }
        }
        const float4 *w4 = reinterpret_cast<const float4 *>(w);
        float4 g[ACT_U]; /* the first chunk's norm weights, loaded across the reduction */
#pragma unroll
        for (int k = 0; k < ACT_U; k++)
            if (threadIdx.x + k * nt < D4) g[k] = w4[threadIdx.x + k * nt];
        const float inv = 1.0f / sqrtf(tbc_block_sum(ss, red) / (float)D + eps);
        for (int i0 = threadIdx.x; i0 < D4; i0 += ACT_U * nt) { /* a thread's own elements: no barrier */
            if (i0 != (int)threadIdx.x) {
#pragma unroll
                for (int k = 0; k < ACT_U; k++)
                    if (i0 + k * nt < D4) g[k] = w4[i0 + k * nt];
            }
#pragma unroll
            for (int k = 0; k < ACT_U; k++) {
                const int i = i0 + k * nt;
                if (i >= D4) break;
                float4 vk = act_row[i];
                vk.x = vk.x * inv * g[k].x;
                vk.y = vk.y * inv * g[k].y;
                vk.z = vk.z * inv * g[k].z;
                vk.w = vk.w * inv * g[k].w;
                act_row[i] = vk;
                m = amax4(m, vk);
            }
        }
    }
    m = block_max(m, red);
    const float sc = m > 0.0f ? m / 448.0f : 1.0f, isc = 1.0f / sc;
    if (threadIdx.x == 0) sx[t] = m > 0.0f ? sc : 0.0f;
    unsigned int *qr = reinterpret_cast<unsigned int *>(q + (size_t)t * D);
    for (int i = threadIdx.x; i < D4; i += nt) qr[i] = tbc_e4m3x4(act_row[i], isc);
}

static int act_threads = 0; /* tbc_set_act_threads */

extern "C" void tbc_set_act_threads(int n) { act_threads = n >= 32 && n <= 1024 && !(n & (n - 1)) ? n : 0; }

template <int KIND, bool R16>
static cudaError_t act_fp8_launch(const float *x, const float *d, const float *w, float *r, int T, int D, float eps,
                                  const float *sw, const float *bias, float mul, void *q, float *sx, cudaStream_t s) {
    const size_t smem = sizeof(float) * (size_t)D;
    static unsigned big = 0; /* the opt-in above 48 KiB, once a kernel and device (a benign race) */
    int dev = 0;
    if (smem > 48 * 1024 && (cudaGetDevice(&dev) != cudaSuccess || dev >= 32 || !(big >> dev & 1u))) {
        cudaError_t e = cudaFuncSetAttribute(act_fp8_kernel<KIND, R16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)(sizeof(float) * TBC_ACT_FP8_MAX_D));
        if (e != cudaSuccess) return e;
        if (dev < 32) big |= 1u << dev;
    }
    /* long steps: 256 threads (four blocks an SM, every token of a
     * 512-token step at once); short ones (T < 256, fewer blocks than the
     * SMs hold) a float4 a thread up to 1024, the least latency a token */
    const int nt = act_threads ? act_threads
                   : T >= 256 && D / 4 >= 256 ? 256
                                              : norm_threads(D / 4 > 32 ? D / 4 : 32);
    return tbc_launch(act_fp8_kernel<KIND, R16>, dim3(T), dim3(nt), smem, s, x, d, w, r, D, eps, sw, bias, mul,
                      static_cast<unsigned char *>(q), sx);
}

extern "C" cudaError_t tbc_act_fp8(tbc_act_kind kind, const float *x, const float *d, const float *w, float *r, int T,
                                   int D, float eps, const float *sw, const float *bias, int raw16, float mul, void *q,
                                   float *sx, cudaStream_t s) {
    if (T < 1 || D < 4 || D % 4 || D > TBC_ACT_FP8_MAX_D || !q || !sx ||
        (kind != TBC_ACT_SILU && !w) || (kind == TBC_ACT_ADDNORM && (!d || !r)) || (raw16 && (!sw || kind == TBC_ACT_NORM)) ||
        (((uintptr_t)x | (uintptr_t)d | (uintptr_t)w | (uintptr_t)r | (uintptr_t)sw | (uintptr_t)bias |
          (uintptr_t)q) & 15))
        return cudaErrorInvalidValue;
    switch (kind) {
    case TBC_ACT_NORM: return act_fp8_launch<TBC_ACT_NORM, false>(x, d, w, r, T, D, eps, sw, bias, mul, q, sx, s);
    case TBC_ACT_ADDNORM:
        return raw16 ? act_fp8_launch<TBC_ACT_ADDNORM, true>(x, d, w, r, T, D, eps, sw, bias, mul, q, sx, s)
                     : act_fp8_launch<TBC_ACT_ADDNORM, false>(x, d, w, r, T, D, eps, sw, bias, mul, q, sx, s);
    case TBC_ACT_SILU:
        return raw16 ? act_fp8_launch<TBC_ACT_SILU, true>(x, d, w, r, T, D, eps, sw, bias, mul, q, sx, s)
                     : act_fp8_launch<TBC_ACT_SILU, false>(x, d, w, r, T, D, eps, sw, bias, mul, q, sx, s);
    }
    return cudaErrorInvalidValue;
}

/* ---------------------------------------------------------------- elementwise */

__global__ void silu_mul_kernel(const float *gu, float *y, int F, size_t n, void *y16, int dt16) {
    tbc_pdl_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / F, k = i % F;
        float g = gu[t * 2 * F + k], u = gu[t * 2 * F + F + k];
        store_act(y, y16, dt16, i, g / (1.0f + expf(-g)) * u);
    }
}

static int grid_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535) b = 65535;
    return b ? (int)b : 1;
}

extern "C" cudaError_t tbc_silu_mul(const float *gu, float *y, int T, int F, void *y16, tbc_dtype dt16,
                                    cudaStream_t s) {
    size_t n = (size_t)T * F;
    return tbc_launch(silu_mul_kernel, dim3(grid_for(n, 256)), dim3(256), 0, s, gu, y, F, n, y16, (int)dt16);
}

__global__ void add_kernel(const float *a, const float *b, float *y, size_t n) {
    tbc_pdl_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

extern "C" cudaError_t tbc_add(const float *a, const float *b, float *y, size_t n, cudaStream_t s) {
    return tbc_launch(add_kernel, dim3(grid_for(n, 256)), dim3(256), 0, s, a, b, y, n);
}

__global__ void gather_rows_kernel(const float *x, const int32_t *rows, float *y, int D) {
    tbc_pdl_wait();
    int r = blockIdx.x;
    const float *xr = x + (size_t)rows[r] * D;
    float *yr = y + (size_t)r * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = xr[i];
}

extern "C" cudaError_t tbc_gather_rows(const float *x, const int32_t *rows, float *y, int R, int D,
                                       cudaStream_t s) {
    return tbc_launch(gather_rows_kernel, dim3(R), dim3(256), 0, s, x, rows, y, D);
}

__global__ void add_bias_kernel(float *y, const float *bias, int N, size_t n) {
    tbc_pdl_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % N];
}

extern "C" cudaError_t tbc_add_bias(float *y, const float *bias, int T, int N, cudaStream_t s) {
    size_t n = (size_t)T * N;
    return tbc_launch(add_bias_kernel, dim3(grid_for(n, 256)), dim3(256), 0, s, y, bias, N, n);
}

__global__ void convert_kernel(const float *src, void *dst, int dt, size_t n) {
    tbc_pdl_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (dt == TBC_F16) ((__half *)dst)[i] = __float2half_rn(src[i]);
        else ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(src[i]);
    }
}

extern "C" cudaError_t tbc_convert_f32(const float *src, void *dst, tbc_dtype dt, size_t n, cudaStream_t s) {
    return tbc_launch(convert_kernel, dim3(grid_for(n, 256)), dim3(256), 0, s, src, dst, (int)dt, n);
}

/* ---------------------------------------------------------------- rope */

__global__ void rope_kernel(float *x, int row_stride, const int32_t *pos, const float *inv_freq, int n_heads, int hd,
                            int interleaved) {
    tbc_pdl_wait();
    int t = blockIdx.x, half = hd / 2;
    float *row = x + (size_t)t * row_stride;
    float p = (float)pos[t];
    for (int i = threadIdx.x; i < n_heads * half; i += blockDim.x) {
        int h = i / half, j = i % half;
        tbc_rotate_pair(row + (size_t)h * hd, j, half, interleaved, p * inv_freq[j]);
    }
}

extern "C" cudaError_t tbc_rope(float *x, int row_stride, const int32_t *pos, const float *inv_freq, int T,
                                int n_heads, int hd, int interleaved, cudaStream_t s) {
    return tbc_launch(rope_kernel, dim3(T), dim3(128), 0, s, x, row_stride, pos, inv_freq, n_heads, hd, interleaved);
}
