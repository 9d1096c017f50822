/* nn_conv.cu — the pieces of Conv / Gemm / MatMul around cuBLAS: the fused
 * epilogue, im2col and the depthwise convolution (nn_cuda.h). */
#include "backend/cuda/nn_common.cuh"

/* tb_nn_act (ir/ops_nn.h) */
__device__ __forceinline__ float act_apply(int act, float x, float p0, float p1) {
    switch (act) {
    case 1: return x > 0 ? x : 0.0f;
    case 2: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    case 3: return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
    case 4: return 1.0f / (1.0f + expf(-x));
    case 5: return x < p0 ? p0 : x > p1 ? p1 : x;
    case 6: return tanhf(x);
    default: return x;
    }
}

__global__ void epilogue_kernel(tbn_epi_args a, const float *acc, void *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = a.adt == TBN_F32 ? acc[i] : tbn_ldf(acc, a.adt, i);
        if (a.bias) v += a.beta * tbn_ldf(a.bias, a.bdt, ((i / a.ncols) % a.bmod) * a.bs_m + (i % a.ncols) * a.bs_n);
        if (a.res && a.after_res) v += tbn_ldf(a.res, a.rdt, i);
        v = act_apply(a.act, v, a.p0, a.p1);
        if (a.res && !a.after_res) v += tbn_ldf(a.res, a.rdt, i);
        tbn_stf(y, a.ydt, i, v);
    }
}

/* the common shapes: f32 or f16 output, a bias along the columns (or rows
 * of a conv's planes) without beta, vectorised by nothing but the grid */
/* 4 consecutive values of a float tensor of dtype dt (f32 or f16) at i
 * (a multiple of 4: 16- or 8-byte aligned) */
__device__ __forceinline__ void epi_ld4(const void *p, int dt, int64_t i, float *v) {
    if (dt == TBN_F32) {
        float4 f = *(const float4 *)((const float *)p + i);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
        uint2 u = *(const uint2 *)((const __half *)p + i);
        __half2 h0, h1;
        memcpy(&h0, &u.x, 4);
        memcpy(&h1, &u.y, 4);
        float2 f0 = __half22float2(h0), f1 = __half22float2(h1);
        v[0] = f0.x, v[1] = f0.y, v[2] = f1.x, v[3] = f1.y;
    }
}

/* The epilogue over 4 elements a thread: an f32 product, a bias along the
 * columns or one per row of ncols (or none), f32 / f16 bias, residual and output; the same
 * arithmetic as epilogue_kernel, with one column index per 4 elements
 * instead of two 64-bit divisions per element. */
__global__ void epilogue4_kernel(tbn_epi_args a, const float *acc, void *y) {
    const int64_t n4 = a.n / 4;
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < n4; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = q * 4;
        float v[4], bb[4], rr[4];
        epi_ld4(acc, TBN_F32, i, v);
        if (a.bias && a.bs_n) { /* along the columns */
            epi_ld4(a.bias, a.bdt, i % a.ncols, bb);
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] += a.beta * bb[e];
        } else if (a.bias) { /* one value a row of ncols (a conv's plane): the same for all 4 */
            float c = a.beta * tbn_ldf(a.bias, a.bdt, (i / a.ncols) % a.bmod);
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] += c;
        }
        if (a.res) epi_ld4(a.res, a.rdt, i, rr);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (a.res && a.after_res) v[e] += rr[e];
            v[e] = act_apply(a.act, v[e], a.p0, a.p1);
            if (a.res && !a.after_res) v[e] += rr[e];
        }
        if (a.ydt == TBN_F32) {
            *(float4 *)((float *)y + i) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
            __half2 h0 = __floats2half2_rn(v[0], v[1]), h1 = __floats2half2_rn(v[2], v[3]);
            uint2 u;
            memcpy(&u.x, &h0, 4);
            memcpy(&u.y, &h1, 4);
            *(uint2 *)((__half *)y + i) = u;
        }
    }
}

static int epi_al(const void *p, int dt) {
    return !p || ((uintptr_t)p & (dt == TBN_F32 ? 15 : 7)) == 0;
}

extern "C" cudaError_t tbn_epilogue(const tbn_epi_args *a, const float *acc, void *y, cudaStream_t s) {
    if (a->n <= 0) return cudaSuccess;
    int fdt = (a->ydt == TBN_F32 || a->ydt == TBN_F16) && (!a->bias || a->bdt == TBN_F32 || a->bdt == TBN_F16) &&
              (!a->res || a->rdt == TBN_F32 || a->rdt == TBN_F16);
    /* bias index ((i / ncols) % bmod) bs_m + (i % ncols) bs_n with (bs_m, bs_n)
     * (0, 1): along the columns; (1, 0): one per row, ncols a multiple of 4 so
     * that 4 elements share it */
    int colbias = !a->bias || (a->bs_m == 0 && a->bs_n == 1 && a->ncols % 4 == 0) ||
                  (a->bs_m == 1 && a->bs_n == 0 && a->ncols % 4 == 0);
    if (a->adt == TBN_F32 && fdt && colbias && a->n % 4 == 0 && epi_al(acc, TBN_F32) && epi_al(y, a->ydt) &&
        epi_al(a->bias, a->bdt) && epi_al(a->res, a->rdt)) {
        epilogue4_kernel<<<tbn_blocks(a->n / 4, 256), 256, 0, s>>>(*a, acc, y);
        return cudaGetLastError();
    }
    epilogue_kernel<<<tbn_blocks(a->n, 256), 256, 0, s>>>(*a, acc, y);
    return cudaGetLastError();
}

/* col[(b, (c, ky, kx), (oy, ox))] = x[b, c, iy, ix] or 0 outside */
template <typename T>
__global__ void im2col_kernel(tbn_conv_geom g, const T *x, T *col, int64_t n) {
    int64_t ohw = g.oh * g.ow, kk = (int64_t)g.kh * g.kw;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t p = e % ohw, q = e / ohw;
        int64_t r = q % (g.c * kk), b = q / (g.c * kk);
        int64_t c = r / kk, k = r % kk;
        int ky = (int)(k / g.kw), kx = (int)(k % g.kw);
        int64_t oy = p / g.ow, ox = p % g.ow;
        int64_t iy = oy * g.sh - g.pt + (int64_t)ky * g.dh, ix = ox * g.sw - g.pl + (int64_t)kx * g.dw;
        T v = (T)0;
        if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) v = x[((b * g.c + c) * g.h + iy) * g.w + ix];
        col[e] = v;
    }
}

extern "C" cudaError_t tbn_im2col(const tbn_conv_geom *g, const void *x, void *col, cudaStream_t s) {
    int64_t n = g->n * g->c * g->kh * g->kw * g->oh * g->ow;
    if (n <= 0) return cudaSuccess;
    unsigned nb = tbn_blocks(n, 256);
    if (g->es == 2) im2col_kernel<uint16_t><<<nb, 256, 0, s>>>(*g, (const uint16_t *)x, (uint16_t *)col, n);
    else im2col_kernel<uint32_t><<<nb, 256, 0, s>>>(*g, (const uint32_t *)x, (uint32_t *)col, n);
    return cudaGetLastError();
}

/* one thread per output element; channel m reads input channel m / mult */
__global__ void depthwise_kernel(tbn_conv_geom g, int64_t m_out, const void *x, const void *w, int dt, float *acc,
                                 int64_t n) {
    int64_t mult = m_out / g.c;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, m = (e / (g.ow * g.oh)) % m_out, b = e / (g.ow * g.oh * m_out);
        int64_t c = m / mult;
        const int64_t xb = (b * g.c + c) * g.h * g.w, wb = m * g.kh * g.kw;
        float s = 0;
        for (int ky = 0; ky < g.kh; ky++) {
            int64_t iy = oy * g.sh - g.pt + (int64_t)ky * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (int kx = 0; kx < g.kw; kx++) {
                int64_t ix = ox * g.sw - g.pl + (int64_t)kx * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                s += tbn_ldf(x, dt, xb + iy * g.w + ix) * tbn_ldf(w, dt, wb + ky * g.kw + kx);
            }
        }
        acc[e] = s;
    }
}

extern "C" cudaError_t tbn_depthwise(const tbn_conv_geom *g, int64_t m, const void *x, const void *w, int dt,
                                     float *acc, cudaStream_t s) {
    int64_t n = g->n * m * g->oh * g->ow;
    if (n <= 0) return cudaSuccess;
    depthwise_kernel<<<tbn_blocks(n, 256), 256, 0, s>>>(*g, m, x, w, dt, acc, n);
    return cudaGetLastError();
}
