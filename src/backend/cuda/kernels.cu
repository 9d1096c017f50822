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

/* One block per row. With `d` set, r = x + d is written first and normed.
 * Q8: the normed row v is not stored but quantised for the FP8 GEMM, the
 * arithmetic of quant_x_fp8_kernel (gemv.cu) on it: y16 gets the e4m3
 * codes of v / s and sx[row] = s = absmax(v) / 448 (0 for a zero row). */
template <bool Q8>
__global__ void rmsnorm_kernel(const float *x, const float *dl, const float *w, float *r, float *y, int D,
                               float eps, void *y16, int dt16, float *sx) {
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
    if (!Q8) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) store_act(y, y16, dt16, off + i, xr[i] * inv * w[i]);
        return;
    }
    float m = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) m = fmaxf(m, fabsf(xr[i] * inv * w[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncthreads(); /* red is free again (tbc_block_sum's readers are done) */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, red[i]);
    const float sc = m > 0.0f ? m / 448.0f : 1.0f, isc = 1.0f / sc;
    if (threadIdx.x == 0) sx[blockIdx.x] = m > 0.0f ? sc : 0.0f;
    unsigned char *q = static_cast<unsigned char *>(y16) + off;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        q[i] = (unsigned char)__nv_cvt_float_to_fp8(xr[i] * inv * w[i] * isc, __NV_SATFINITE, __NV_E4M3);
}

static int norm_threads(int D) {
    int t = 32;
    while (t < D && t < 1024) t *= 2;
    return t;
}

extern "C" cudaError_t tbc_rmsnorm(const float *x, const float *w, float *y, int T, int D, float eps, void *y16,
                                   tbc_dtype dt16, cudaStream_t s) {
    return tbc_launch(rmsnorm_kernel<false>, dim3(T), dim3(norm_threads(D / 4 > 32 ? D / 4 : 32)), 0, s, x,
                      (const float *)NULL, w, (float *)NULL, y, D, eps, y16, (int)dt16, (float *)NULL);
}

extern "C" cudaError_t tbc_add_rmsnorm(const float *x, const float *d, const float *w, float *r, float *y, int T,
                                       int D, float eps, void *y16, tbc_dtype dt16, cudaStream_t s) {
    return tbc_launch(rmsnorm_kernel<false>, dim3(T), dim3(norm_threads(D / 4 > 32 ? D / 4 : 32)), 0, s, x, d, w, r,
                      y, D, eps, y16, (int)dt16, (float *)NULL);
}

extern "C" cudaError_t tbc_rmsnorm_fp8(const float *x, const float *d, const float *w, float *r, int T, int D,
                                       float eps, void *q, float *sx, cudaStream_t s) {
    if (T < 1 || D < 1 || !q || !sx || (d && !r)) return cudaErrorInvalidValue;
    return tbc_launch(rmsnorm_kernel<true>, dim3(T), dim3(norm_threads(D / 4 > 32 ? D / 4 : 32)), 0, s, x, d, w, r,
                      (float *)NULL, D, eps, q, 0, sx);
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
