/* nn_elem.cu — elementwise ops with numpy broadcasting, Cast, Softmax,
 * LayerNormalization, BatchNormalization and the reductions (nn_cuda.h). */
#include "backend/cuda/nn_common.cuh"

/* ---------------------------------------------------------------- elementwise */

__device__ __forceinline__ int64_t ew_off(const tbn_ew_args &a, int k, int64_t i) {
    switch (a.mode[k]) {
    case TBN_IDX_FLAT: return i;
    case TBN_IDX_SCALAR: return 0;
    case TBN_IDX_MOD: return i % a.p[k];
    case TBN_IDX_DIV: return i / a.p[k];
    default: {
        int64_t off = 0, t = i;
        for (int d = a.rank - 1; d >= 0; d--) {
            int64_t c = t % a.dims[d];
            t /= a.dims[d];
            off += c * a.st[k][d];
        }
        return off;
    }
    }
}

__device__ __forceinline__ float gelu_f(float x, int tanh_form) {
    if (tanh_form) {
        float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return x / (1.0f + expf(-2.0f * u));
    }
    return 0.5f * x * erfcf(-x * 0.7071067811865476f);
}

__device__ __forceinline__ float unary_f(int op, float x, int attr) {
    switch (op) {
    case TBN_RELU: return x < 0 ? 0.0f : x;
    case TBN_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case TBN_TANH: return tanhf(x);
    case TBN_EXP: return expf(x);
    case TBN_LOG: return logf(x);
    case TBN_NEG: return -x;
    case TBN_ABS: return fabsf(x);
    case TBN_SQRT: return sqrtf(x);
    case TBN_RECIP: return 1.0f / x;
    case TBN_ERF: return erff(x);
    case TBN_FLOOR: return floorf(x);
    case TBN_CEIL: return ceilf(x);
    case TBN_GELU: return gelu_f(x, attr);
    default: return x;
    }
}

__device__ __forceinline__ float binary_f(int op, float a, float b) {
    switch (op) {
    case TBN_ADD: return a + b;
    case TBN_SUB: return a - b;
    case TBN_MUL: return a * b;
    case TBN_DIV: return a / b;
    case TBN_POW: return powf(a, b);
    case TBN_EQ: return a == b;
    case TBN_LT: return a < b;
    case TBN_LE: return a <= b;
    case TBN_GT: return a > b;
    case TBN_GE: return a >= b;
    default: return 0;
    }
}

__device__ __forceinline__ int64_t ipow(int64_t a, int64_t e) {
    if (e < 0) return a == 1 ? 1 : a == -1 ? (e & 1 ? -1 : 1) : 0;
    uint64_t r = 1, base = (uint64_t)a;
    for (; e; e >>= 1, base *= base)
        if (e & 1) r *= base;
    return (int64_t)r;
}

__device__ __forceinline__ int64_t binary_i(int op, int64_t a, int64_t b) {
    switch (op) {
    case TBN_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
    case TBN_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
    case TBN_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
    case TBN_DIV: return b == 0 ? 0 : (a == INT64_MIN && b == -1) ? a : a / b;
    case TBN_POW: return ipow(a, b);
    case TBN_EQ: return a == b;
    case TBN_LT: return a < b;
    case TBN_LE: return a <= b;
    case TBN_GT: return a > b;
    case TBN_GE: return a >= b;
    case TBN_AND: return a && b;
    case TBN_OR: return a || b;
    default: return 0;
    }
}

/* The common case: f32 or f16 everywhere, float math, one kernel per
 * storage type (the generic kernel below converts through a switch). */
template <typename T>
__device__ __forceinline__ float ldT(const T *p, int64_t i);
template <>
__device__ __forceinline__ float ldT<float>(const float *p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float ldT<__half>(const __half *p, int64_t i) { return __half2float(p[i]); }
template <typename T>
__device__ __forceinline__ void stT(T *p, int64_t i, float x);
template <>
__device__ __forceinline__ void stT<float>(float *p, int64_t i, float x) { p[i] = x; }
template <>
__device__ __forceinline__ void stT<__half>(__half *p, int64_t i, float x) { p[i] = __float2half_rn(x); }

template <typename T>
__global__ void ew_float_kernel(tbn_ew_args a, const T *x0, const T *x1, T *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = ldT(x0, ew_off(a, 0, i)), r;
        if (a.n_in == 2 && a.op >= TBN_ADD) {
            r = binary_f(a.op, v, ldT(x1, ew_off(a, 1, i)));
        } else if (a.op == TBN_CLIP) {
            r = v < (float)a.lo ? (float)a.lo : v;
            r = r > (float)a.hi ? (float)a.hi : r;
        } else {
            r = unary_f(a.op, v, a.attr);
        }
        stT(y, i, r);
    }
}

__global__ void ew_generic_kernel(tbn_ew_args a, const void *x0, const void *x1, const void *x2, void *y) {
    int isint = !tbn_is_float(a.dt[0]) && !(a.op == TBN_WHERE);
    int fexp = a.op == TBN_POW && tbn_is_float(a.dt[1]);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
        if (a.op == TBN_WHERE) {
            int c = ((const uint8_t *)x0)[ew_off(a, 0, i)] != 0;
            int64_t o = c ? ew_off(a, 1, i) : ew_off(a, 2, i);
            const void *src = c ? x1 : x2;
            switch (a.odt) {
            case TBN_F64: case TBN_I64: ((int64_t *)y)[i] = ((const int64_t *)src)[o]; break;
            case TBN_F32: case TBN_I32: ((int32_t *)y)[i] = ((const int32_t *)src)[o]; break;
            case TBN_F16: case TBN_BF16: ((uint16_t *)y)[i] = ((const uint16_t *)src)[o]; break;
            default: ((uint8_t *)y)[i] = ((const uint8_t *)src)[o]; break;
            }
            continue;
        }
        if (a.n_in >= 2 && a.op >= TBN_ADD) {
            int64_t o0 = ew_off(a, 0, i), o1 = ew_off(a, 1, i);
            if (!isint) {
                tbn_std(y, a.odt, i, (double)binary_f(a.op, tbn_ldf(x0, a.dt[0], o0), tbn_ldf(x1, a.dt[1], o1)));
            } else if (fexp) {
                tbn_std(y, a.odt, i, pow((double)tbn_ldi(x0, a.dt[0], o0), tbn_ldd(x1, a.dt[1], o1)));
            } else {
                tbn_sti(y, a.odt, i, binary_i(a.op, tbn_ldi(x0, a.dt[0], o0), tbn_ldi(x1, a.dt[1], o1)));
            }
            continue;
        }
        int64_t o0 = ew_off(a, 0, i);
        if (!isint) {
            float v = tbn_ldf(x0, a.dt[0], o0), r;
            if (a.op == TBN_CLIP) {
                r = v < (float)a.lo ? (float)a.lo : v;
                r = r > (float)a.hi ? (float)a.hi : r;
            } else {
                r = unary_f(a.op, v, a.attr);
            }
            tbn_stf(y, a.odt, i, r);
        } else {
            int64_t v = tbn_ldi(x0, a.dt[0], o0), r;
            switch (a.op) {
            case TBN_RELU: r = v < 0 ? 0 : v; break;
            case TBN_NEG: r = (int64_t)(0 - (uint64_t)v); break;
            case TBN_ABS: r = v < 0 ? (int64_t)(0 - (uint64_t)v) : v; break;
            case TBN_NOT: r = !v; break;
            case TBN_CLIP: r = v < a.ilo ? a.ilo : v; r = r > a.ihi ? a.ihi : r; break;
            default: r = v; break;
            }
            tbn_sti(y, a.odt, i, r);
        }
    }
}

extern "C" cudaError_t tbn_elementwise(const tbn_ew_args *a, const void *const *in, void *out, cudaStream_t s) {
    if (a->n <= 0) return cudaSuccess;
    unsigned nb = tbn_blocks(a->n, 256);
    int same = a->op != TBN_WHERE && a->op != TBN_NOT && a->odt == a->dt[0] &&
               (a->n_in == 1 || a->dt[1] == a->dt[0]) && !(a->op >= TBN_EQ && a->op <= TBN_OR);
    if (same && a->odt == TBN_F32)
        ew_float_kernel<float><<<nb, 256, 0, s>>>(*a, (const float *)in[0], (const float *)(a->n_in > 1 ? in[1] : in[0]),
                                                   (float *)out);
    else if (same && a->odt == TBN_F16)
        ew_float_kernel<__half><<<nb, 256, 0, s>>>(*a, (const __half *)in[0],
                                                    (const __half *)(a->n_in > 1 ? in[1] : in[0]), (__half *)out);
    else
        ew_generic_kernel<<<nb, 256, 0, s>>>(*a, in[0], a->n_in > 1 ? in[1] : in[0], a->n_in > 2 ? in[2] : in[0],
                                             out);
    return cudaGetLastError();
}

__global__ void cast_kernel(const void *x, int xdt, void *y, int ydt, int64_t n) {
    int xf = tbn_is_float(xdt);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (xf) tbn_std(y, ydt, i, tbn_ldd(x, xdt, i));
        else tbn_sti(y, ydt, i, tbn_ldi(x, xdt, i));
    }
}

extern "C" cudaError_t tbn_cast(const void *x, int xdt, void *y, int ydt, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    cast_kernel<<<tbn_blocks(n, 256), 256, 0, s>>>(x, xdt, y, ydt, n);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- Softmax */

/* last axis (I == 1): one warp per row, rows of up to 32 * 16 held in
 * registers, longer rows read three times */
__global__ void softmax_rows_kernel(const void *x, void *y, int dt, int64_t rows, int64_t A) {
    int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int64_t base = row * A;
    float m = -INFINITY;
    for (int64_t j = lane; j < A; j += 32) m = fmaxf(m, tbn_ldf(x, dt, base + j));
    m = tbn_warp_max(m);
    float sum = 0;
    for (int64_t j = lane; j < A; j += 32) sum += expf(tbn_ldf(x, dt, base + j) - m);
    sum = tbn_warp_sum(sum);
    float inv = 1.0f / sum;
    for (int64_t j = lane; j < A; j += 32) tbn_stf(y, dt, base + j, expf(tbn_ldf(x, dt, base + j) - m) * inv);
}

/* long rows: one block per row */
__global__ void softmax_block_kernel(const void *x, void *y, int dt, int64_t A) {
    __shared__ float red[32];
    int64_t base = blockIdx.x * A;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < A; j += blockDim.x) m = fmaxf(m, tbn_ldf(x, dt, base + j));
    m = tbn_warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = lane < nw ? red[lane] : -INFINITY;
    m = tbn_warp_max(m);
    __syncthreads();
    float sum = 0;
    for (int64_t j = threadIdx.x; j < A; j += blockDim.x) sum += expf(tbn_ldf(x, dt, base + j) - m);
    sum = tbn_warp_sum(sum);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = lane < nw ? red[lane] : 0;
    sum = tbn_warp_sum(sum);
    float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < A; j += blockDim.x) tbn_stf(y, dt, base + j, expf(tbn_ldf(x, dt, base + j) - m) * inv);
}

/* other axes: one thread per (o, i) column */
__global__ void softmax_cols_kernel(const void *x, void *y, int dt, int64_t O, int64_t A, int64_t I) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < O * I; c += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = c / I, i = c % I, base = o * A * I + i;
        float m = -INFINITY, sum = 0;
        for (int64_t a = 0; a < A; a++) m = fmaxf(m, tbn_ldf(x, dt, base + a * I));
        for (int64_t a = 0; a < A; a++) sum += expf(tbn_ldf(x, dt, base + a * I) - m);
        float inv = 1.0f / sum;
        for (int64_t a = 0; a < A; a++) tbn_stf(y, dt, base + a * I, expf(tbn_ldf(x, dt, base + a * I) - m) * inv);
    }
}

extern "C" cudaError_t tbn_softmax(const void *x, void *y, int dt, int64_t O, int64_t A, int64_t I, cudaStream_t s) {
    if (O * A * I <= 0) return cudaSuccess;
    if (I == 1 && A <= 2048) {
        softmax_rows_kernel<<<(unsigned)((O + 7) / 8), 256, 0, s>>>(x, y, dt, O, A);
    } else if (I == 1) {
        softmax_block_kernel<<<(unsigned)O, 512, 0, s>>>(x, y, dt, A);
    } else {
        softmax_cols_kernel<<<tbn_blocks(O * I, 256), 256, 0, s>>>(x, y, dt, O, A, I);
    }
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- LayerNormalization */

__device__ __forceinline__ int64_t ln_pidx(const tbn_ln_args &a, int mode, int pr, const int64_t *pd, int64_t j) {
    if (mode == 0) return j;
    if (mode == 1) return 0;
    int64_t idx = 0, st = 1;
    for (int d = a.nr - 1, p = pr - 1; d >= 0 && p >= 0; d--, p--) {
        int64_t c = j % a.nd[d];
        j /= a.nd[d];
        if (pd[p] != 1) idx += c * st;
        st *= pd[p];
    }
    return idx;
}

__device__ __forceinline__ float block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tbn_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return tbn_warp_sum(v);
}

/* one block per row; mean, then the centred variance (two passes, the
 * second over values the first brought into L1/L2) */
__global__ void layernorm_kernel(tbn_ln_args a, const void *x, const void *sc, const void *bi, void *y) {
    __shared__ float red[32];
    int64_t base = blockIdx.x * a.D;
    float s = 0;
    for (int64_t j = threadIdx.x; j < a.D; j += blockDim.x) s += tbn_ldf(x, a.dt, base + j);
    float mean = block_sum(s, red) / (float)a.D;
    float v = 0;
    for (int64_t j = threadIdx.x; j < a.D; j += blockDim.x) {
        float c = tbn_ldf(x, a.dt, base + j) - mean;
        v += c * c;
    }
    float var = block_sum(v, red) / (float)a.D;
    float rstd = rsqrtf(var + a.eps);
    for (int64_t j = threadIdx.x; j < a.D; j += blockDim.x) {
        float r = (tbn_ldf(x, a.dt, base + j) - mean) * rstd * tbn_ldf(sc, a.sdt, ln_pidx(a, a.smode, a.sr, a.sd, j));
        if (bi) r += tbn_ldf(bi, a.bdt, ln_pidx(a, a.bmode, a.br, a.bd, j));
        tbn_stf(y, a.dt, base + j, r);
    }
}

/* 8 values of parameter p (f32 or f16) from element j (a multiple of 8) */
__device__ __forceinline__ void ln_ld8(const void *p, int dt, int64_t j, float *v) {
    if (dt == TBN_F16) {
        uint4 u = *(const uint4 *)((const __half *)p + j);
        const __half2 *h = (const __half2 *)&u;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 f = __half22float2(h[e]);
            v[2 * e] = f.x, v[2 * e + 1] = f.y;
        }
    } else {
        float4 a = *(const float4 *)((const float *)p + j), b = *(const float4 *)((const float *)p + j + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
}

/* f16 rows of D (a multiple of 8, at most 256 NC) with per-element f32 / f16
 * scale and bias: one warp a row, the row in registers (16-byte loads), two
 * passes over the registers for the mean and the variance as the kernel
 * above */
template <int NC>
__global__ void __launch_bounds__(128) layernorm_f16_kernel(tbn_ln_args a, const __half *x, const void *sc,
                                                             const void *bi, __half *y) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (row >= a.rows) return;
    const int nc = (int)(a.D / 8);
    const __half *xr = x + row * a.D;
    float v[NC][8];
    float s = 0;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int ch = lane + 32 * c;
        if (ch < nc) {
            uint4 u = *(const uint4 *)(xr + ch * 8);
            const __half2 *h = (const __half2 *)&u;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 f = __half22float2(h[e]);
                v[c][2 * e] = f.x, v[c][2 * e + 1] = f.y;
                s += f.x + f.y;
            }
        }
    }
    const float mean = tbn_warp_sum(s) / (float)a.D;
    float q = 0;
#pragma unroll
    for (int c = 0; c < NC; c++)
        if (lane + 32 * c < nc)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float d = v[c][e] - mean;
                q += d * d;
            }
    const float rstd = rsqrtf(tbn_warp_sum(q) / (float)a.D + a.eps);
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int ch = lane + 32 * c;
        if (ch >= nc) continue;
        float g[8], b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ln_ld8(sc, a.sdt, ch * 8, g);
        if (bi) ln_ld8(bi, a.bdt, ch * 8, b);
        uint4 u;
        __half2 *h = (__half2 *)&u;
#pragma unroll
        for (int e = 0; e < 4; e++)
            h[e] = __floats2half2_rn((v[c][2 * e] - mean) * rstd * g[2 * e] + b[2 * e],
                                     (v[c][2 * e + 1] - mean) * rstd * g[2 * e + 1] + b[2 * e + 1]);
        *(uint4 *)(y + row * a.D + ch * 8) = u;
    }
}

static int ln_al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" cudaError_t tbn_layernorm(const tbn_ln_args *a, const void *x, const void *scale, const void *bias, void *y,
                                     cudaStream_t s) {
    if (a->rows <= 0 || a->D <= 0) return cudaSuccess;
    if (a->dt == TBN_F16 && a->D % 8 == 0 && a->D <= 8 * 32 * 16 && a->smode == 0 && (!bias || a->bmode == 0) &&
        (a->sdt == TBN_F16 || a->sdt == TBN_F32) && (!bias || a->bdt == TBN_F16 || a->bdt == TBN_F32) &&
        ln_al16(x) && ln_al16(y) && ln_al16(scale) && (!bias || ln_al16(bias)) && a->rows <= 4ll * 0x7fffffff) {
        const int64_t chunks = a->D / 8;
        const unsigned nb = (unsigned)((a->rows + 3) / 4);
        const __half *xh = (const __half *)x;
        __half *yh = (__half *)y;
        if (chunks <= 32) layernorm_f16_kernel<1><<<nb, 128, 0, s>>>(*a, xh, scale, bias, yh);
        else if (chunks <= 64) layernorm_f16_kernel<2><<<nb, 128, 0, s>>>(*a, xh, scale, bias, yh);
        else if (chunks <= 128) layernorm_f16_kernel<4><<<nb, 128, 0, s>>>(*a, xh, scale, bias, yh);
        else if (chunks <= 256) layernorm_f16_kernel<8><<<nb, 128, 0, s>>>(*a, xh, scale, bias, yh);
        else layernorm_f16_kernel<16><<<nb, 128, 0, s>>>(*a, xh, scale, bias, yh);
        return cudaGetLastError();
    }
    int threads = a->D >= 1024 ? 512 : a->D >= 256 ? 256 : 128;
    layernorm_kernel<<<(unsigned)a->rows, threads, 0, s>>>(*a, x, scale, bias, y);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- BatchNormalization */

typedef struct {
    const void *p[4];
    int pdt[4];
    int64_t pn[4];
} bn_params;

__global__ void batchnorm_kernel(const void *x, void *y, int dt, int64_t n, int64_t C, int64_t S, bn_params p,
                                 float eps) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = (i / S) % C;
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = tbn_ldf(p.p[k], p.pdt[k], p.pn[k] == 1 ? 0 : c);
        float a = v[0] * rsqrtf(v[3] + eps);
        tbn_stf(y, dt, i, a * (tbn_ldf(x, dt, i) - v[2]) + v[1]);
    }
}

extern "C" cudaError_t tbn_batchnorm(const void *x, void *y, int dt, int64_t N, int64_t C, int64_t S,
                                     const void *const *p, const int *pdt, const int64_t *pn, float eps,
                                     cudaStream_t s) {
    int64_t n = N * C * S;
    if (n <= 0) return cudaSuccess;
    bn_params bp;
    for (int k = 0; k < 4; k++) { bp.p[k] = p[k]; bp.pdt[k] = pdt[k]; bp.pn[k] = pn[k]; }
    batchnorm_kernel<<<tbn_blocks(n, 256), 256, 0, s>>>(x, y, dt, n, C, S, bp, eps);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- reductions */

/* one block per output element, double accumulation (the reference's) */
__global__ void reduce_kernel(tbn_reduce_args a, const void *x, void *y) {
    __shared__ double red[32];
    int64_t o = blockIdx.x;
    int64_t base = 0, t = o;
    for (int k = a.nk - 1; k >= 0; k--) { base += (t % a.kd[k]) * a.ks[k]; t /= a.kd[k]; }
    int isint = !tbn_is_float(a.xdt), is_max = a.op == 2;
    double acc = is_max ? -INFINITY : 0.0;
    int64_t iacc = is_max ? INT64_MIN : 0;
    for (int64_t j = threadIdx.x; j < a.nred; j += blockDim.x) {
        int64_t off = base, u = j;
        for (int k = a.nr - 1; k >= 0; k--) { off += (u % a.rd[k]) * a.rs[k]; u /= a.rd[k]; }
        if (isint) {
            int64_t v = tbn_ldi(x, a.xdt, off);
            iacc = is_max ? (v > iacc ? v : iacc) : (int64_t)((uint64_t)iacc + (uint64_t)v);
        } else {
            double v = tbn_ldd(x, a.xdt, off);
            if (is_max) acc = (v > acc || v != v) && acc == acc ? v : acc;
            else acc += v;
        }
    }
    /* combine: floats as doubles (NaN wins for max), ints through doubles
     * only for max/mean; sums of ints stay int64 in shared memory */
    __shared__ int64_t ired[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o2 = 16; o2 > 0; o2 >>= 1) {
        double od = __shfl_xor_sync(0xffffffffu, acc, o2);
        long long oi = __shfl_xor_sync(0xffffffffu, (long long)iacc, o2);
        if (is_max) {
            acc = (od > acc || od != od) && acc == acc ? od : acc;
            iacc = oi > iacc ? oi : iacc;
        } else {
            acc += od;
            iacc = (int64_t)((uint64_t)iacc + (uint64_t)oi);
        }
    }
    if (lane == 0) { red[warp] = acc; ired[warp] = iacc; }
    __syncthreads();
    if (threadIdx.x == 0) {
        acc = red[0];
        iacc = ired[0];
        for (int w = 1; w < nw; w++) {
            if (is_max) {
                acc = (red[w] > acc || red[w] != red[w]) && acc == acc ? red[w] : acc;
                iacc = ired[w] > iacc ? ired[w] : iacc;
            } else {
                acc += red[w];
                iacc = (int64_t)((uint64_t)iacc + (uint64_t)ired[w]);
            }
        }
        if (a.op == 0) acc /= (double)a.nred;
        if (isint && a.op == 0) tbn_std(y, a.ydt, o, (double)iacc / (double)a.nred);
        else if (isint) tbn_sti(y, a.ydt, o, iacc);
        else tbn_std(y, a.ydt, o, acc);
    }
}

extern "C" cudaError_t tbn_reduce(const tbn_reduce_args *a, const void *x, void *y, cudaStream_t s) {
    if (a->nout <= 0) return cudaSuccess;
    int threads = a->nred >= 2048 ? 512 : a->nred >= 256 ? 256 : a->nred > 32 ? 128 : 32;
    /* grid.x is limited to 2^31 - 1 */
    reduce_kernel<<<(unsigned)a->nout, threads, 0, s>>>(*a, x, y);
    return cudaGetLastError();
}
