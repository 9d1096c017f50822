/* nn_shape.cu — data movement of the general ops: the strided copy behind
 * Transpose / Slice / Expand (with a tiled 2-d transpose), Gather, Range,
 * fills, Trilu, Resize and the pools (nn_cuda.h). */
#include "backend/cuda/nn_common.cuh"

typedef struct {
    int r;
    int64_t od[TBN_MAX_RANK], st[TBN_MAX_RANK];
    int64_t base, n;
} sc_args;

template <typename T>
__global__ void strided_copy_kernel(sc_args a, T *out, const T *in) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < a.n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t off = a.base, t = e;
        for (int k = a.r - 1; k >= 0; k--) {
            int64_t c = t % a.od[k];
            t /= a.od[k];
            off += c * a.st[k];
        }
        out[e] = in[off];
    }
}

/* out (B, R, C) = in with out[b, i, j] at base + b-offset + i * st_r + j * st_c
 * where st_r == 1 (a 2-d transpose per batch): 32 x 32 tiles through shared
 * memory so that reads and writes are both coalesced. The batch offset is
 * the generic walk over the leading dims. */
template <typename T>
__global__ void transpose_tile_kernel(sc_args a, T *out, const T *in, int64_t R, int64_t C, int64_t st_c) {
    __shared__ T tile[32][33];
    int64_t b = blockIdx.z;
    int64_t boff = a.base, t = b;
    for (int k = a.r - 3; k >= 0; k--) {
        int64_t c = t % a.od[k];
        t /= a.od[k];
        boff += c * a.st[k];
    }
    int64_t i0 = (int64_t)blockIdx.y * 32, j0 = (int64_t)blockIdx.x * 32;
    /* read: consecutive threads walk i (stride 1 in the input) */
    for (int dj = threadIdx.y; dj < 32; dj += blockDim.y) {
        int64_t i = i0 + threadIdx.x, j = j0 + dj;
        if (i < R && j < C) tile[dj][threadIdx.x] = in[boff + i + j * st_c];
    }
    __syncthreads();
    for (int di = threadIdx.y; di < 32; di += blockDim.y) {
        int64_t i = i0 + di, j = j0 + threadIdx.x;
        if (i < R && j < C) out[(b * R + i) * C + j] = tile[threadIdx.x][di];
    }
}

template <typename T>
static cudaError_t strided_copy_t(const sc_args &a, void *out, const void *in, cudaStream_t s) {
    int r = a.r;
    if (r >= 2 && a.st[r - 2] == 1 && a.st[r - 1] != 1 && a.od[r - 1] >= 8 && a.od[r - 2] >= 8) {
        int64_t B = 1;
        for (int k = 0; k < r - 2; k++) B *= a.od[k];
        if (B <= 65535) {
            dim3 grid((unsigned)((a.od[r - 1] + 31) / 32), (unsigned)((a.od[r - 2] + 31) / 32), (unsigned)B);
            transpose_tile_kernel<T><<<grid, dim3(32, 8), 0, s>>>(a, (T *)out, (const T *)in, a.od[r - 2],
                                                                  a.od[r - 1], a.st[r - 1]);
            return cudaGetLastError();
        }
    }
    strided_copy_kernel<T><<<tbn_blocks(a.n, 256), 256, 0, s>>>(a, (T *)out, (const T *)in);
    return cudaGetLastError();
}

extern "C" cudaError_t tbn_strided_copy(void *out, const void *in, int r, const int64_t *od, const int64_t *st,
                                        int64_t base, int es, cudaStream_t s) {
    sc_args a;
    memset(&a, 0, sizeof a);
    a.base = base;
    a.n = 1;
    /* drop dims of 1, merge dims that are contiguous with the next */
    for (int k = 0; k < r; k++) {
        if (od[k] == 0) return cudaSuccess;
        if (od[k] == 1) continue;
        if (a.r > 0 && a.st[a.r - 1] == st[k] * od[k]) {
            a.od[a.r - 1] *= od[k];
            a.st[a.r - 1] = st[k];
        } else {
            a.od[a.r] = od[k];
            a.st[a.r] = st[k];
            a.r++;
        }
    }
    for (int k = 0; k < a.r; k++) a.n *= a.od[k];
    if (a.r == 0) { a.r = 1; a.od[0] = 1; a.st[0] = 0; }
    /* one contiguous run: a plain copy */
    if (a.r == 1 && a.st[0] == 1)
        return cudaMemcpyAsync(out, (const char *)in + a.base * es, (size_t)(a.n * es), cudaMemcpyDeviceToDevice, s);
    /* the innermost run contiguous in both (a Transpose that keeps the last
     * dim: heads split and merged) and 16-byte aligned: copy 16-byte units */
    if (es < 16 && a.r >= 2 && a.st[a.r - 1] == 1 && (a.od[a.r - 1] * es) % 16 == 0 && (a.base * es) % 16 == 0 &&
        ((uintptr_t)in & 15) == 0 && ((uintptr_t)out & 15) == 0) {
        int ok = 1;
        for (int k = 0; k < a.r - 1; k++) ok &= (a.st[k] * es) % 16 == 0;
        if (ok) {
            sc_args v = a;
            const int64_t u = 16 / es;
            v.od[v.r - 1] /= u;
            for (int k = 0; k < v.r - 1; k++) v.st[k] /= u;
            v.base /= u;
            v.n /= u;
            return strided_copy_t<uint4>(v, out, in, s);
        }
    }
    switch (es) {
    case 1: return strided_copy_t<uint8_t>(a, out, in, s);
    case 2: return strided_copy_t<uint16_t>(a, out, in, s);
    case 4: return strided_copy_t<uint32_t>(a, out, in, s);
    default: return strided_copy_t<uint64_t>(a, out, in, s);
    }
}

/* ---------------------------------------------------------------- Gather */

template <typename T>
__global__ void gather_kernel(const T *x, const void *idx, int idt, T *out, int64_t A, int64_t ni, int64_t inner,
                              int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = e % inner, q = e / inner, t = q % ni, j = q / ni;
        int64_t i = idt == TBN_I64 ? ((const int64_t *)idx)[t] : ((const int32_t *)idx)[t];
        if (i < 0) i += A;
        i = i < 0 ? 0 : i >= A ? A - 1 : i;
        out[e] = x[(j * A + i) * inner + c];
    }
}

extern "C" cudaError_t tbn_gather(const void *x, const void *idx, int idt, void *out, int64_t outer, int64_t A,
                                  int64_t ni, int64_t inner, int es, cudaStream_t s) {
    int64_t n = outer * ni * inner;
    if (n <= 0 || A <= 0) return cudaSuccess;
    unsigned nb = tbn_blocks(n, 256);
    switch (es) {
    case 1: gather_kernel<uint8_t><<<nb, 256, 0, s>>>((const uint8_t *)x, idx, idt, (uint8_t *)out, A, ni, inner, n); break;
    case 2: gather_kernel<uint16_t><<<nb, 256, 0, s>>>((const uint16_t *)x, idx, idt, (uint16_t *)out, A, ni, inner, n); break;
    case 4: gather_kernel<uint32_t><<<nb, 256, 0, s>>>((const uint32_t *)x, idx, idt, (uint32_t *)out, A, ni, inner, n); break;
    default: gather_kernel<uint64_t><<<nb, 256, 0, s>>>((const uint64_t *)x, idx, idt, (uint64_t *)out, A, ni, inner, n); break;
    }
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- Range, fill, Trilu */

__global__ void range_kernel(void *out, int dt, int64_t n, double fs, double fd, int64_t is, int64_t id) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        switch (dt) {
        /* no fused multiply-add: the reference rounds the product first */
        case TBN_F32: ((float *)out)[i] = __fadd_rn((float)fs, __fmul_rn((float)i, (float)fd)); break;
        case TBN_F64: ((double *)out)[i] = __dadd_rn(fs, __dmul_rn((double)i, fd)); break;
        case TBN_I64: ((int64_t *)out)[i] = is + i * id; break;
        default: ((int32_t *)out)[i] = (int32_t)(is + i * id); break;
        }
    }
}

extern "C" cudaError_t tbn_range(void *out, int dt, int64_t n, double fstart, double fdelta, int64_t istart,
                                 int64_t idelta, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    range_kernel<<<tbn_blocks(n, 256), 256, 0, s>>>(out, dt, n, fstart, fdelta, istart, idelta);
    return cudaGetLastError();
}

template <typename T>
__global__ void fill_kernel(T *out, int64_t n, T v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = v;
}

extern "C" cudaError_t tbn_fill(void *out, int64_t n, int es, uint64_t value, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    unsigned nb = tbn_blocks(n, 256);
    switch (es) {
    case 1: fill_kernel<uint8_t><<<nb, 256, 0, s>>>((uint8_t *)out, n, (uint8_t)value); break;
    case 2: fill_kernel<uint16_t><<<nb, 256, 0, s>>>((uint16_t *)out, n, (uint16_t)value); break;
    case 4: fill_kernel<uint32_t><<<nb, 256, 0, s>>>((uint32_t *)out, n, (uint32_t)value); break;
    default: fill_kernel<uint64_t><<<nb, 256, 0, s>>>((uint64_t *)out, n, value); break;
    }
    return cudaGetLastError();
}

template <typename T>
__global__ void trilu_kernel(const T *x, T *y, int64_t M, int64_t N, int64_t k, int upper, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = e % N, i = (e / N) % M;
        int keep = upper ? j - i >= k : j - i <= k;
        y[e] = keep ? x[e] : (T)0;
    }
}

extern "C" cudaError_t tbn_trilu(const void *x, void *y, int64_t B, int64_t M, int64_t N, int64_t k, int upper,
                                 int es, cudaStream_t s) {
    int64_t n = B * M * N;
    if (n <= 0) return cudaSuccess;
    unsigned nb = tbn_blocks(n, 256);
    switch (es) {
    case 1: trilu_kernel<uint8_t><<<nb, 256, 0, s>>>((const uint8_t *)x, (uint8_t *)y, M, N, k, upper, n); break;
    case 2: trilu_kernel<uint16_t><<<nb, 256, 0, s>>>((const uint16_t *)x, (uint16_t *)y, M, N, k, upper, n); break;
    case 4: trilu_kernel<uint32_t><<<nb, 256, 0, s>>>((const uint32_t *)x, (uint32_t *)y, M, N, k, upper, n); break;
    default: trilu_kernel<uint64_t><<<nb, 256, 0, s>>>((const uint64_t *)x, (uint64_t *)y, M, N, k, upper, n); break;
    }
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- Resize */

/* ONNX's coordinate transformations (ir/nn_shape.c resize_coord) */
__device__ double resize_coord(int mode, double xr, double scale, int64_t len_in, int64_t len_out, double r0,
                               double r1) {
    switch (mode) {
    case 1: return xr / scale; /* asymmetric */
    case 2: { /* align_corners */
        double lr = scale * (double)len_in;
        return lr == 1 ? 0 : xr * (double)(len_in - 1) / (lr - 1);
    }
    case 3: return len_out > 1 ? (xr + 0.5) / scale - 0.5 : 0; /* pytorch_half_pixel */
    case 4: /* tf_crop_and_resize */
        return len_out > 1 ? r0 * (double)(len_in - 1) + xr * (r1 - r0) * (double)(len_in - 1) / (double)(len_out - 1)
                           : 0.5 * (r0 + r1) * (double)(len_in - 1);
    case 5: { /* half_pixel_symmetric */
        double adjustment = (double)len_out / (scale * (double)len_in);
        double center = (double)len_in / 2, offset = center * (1 - adjustment);
        return offset + (xr + 0.5) / scale - 0.5;
    }
    default: return (xr + 0.5) / scale - 0.5;
    }
}

/* taps of output coordinate o along axis d: up to 4 (index, weight) pairs;
 * returns the tap count, *outside for tf_crop_and_resize extrapolation */
__device__ int resize_taps(const tbn_resize_args &a, int d, int64_t o, int64_t *idx, double *w, int *outside) {
    int64_t len_in = a.in[d];
    double xo = resize_coord(a.coord, (double)o, a.scale[d], len_in, a.out[d], a.r0[d], a.r1[d]);
    *outside = a.coord == 4 && (xo < 0 || xo > (double)(len_in - 1));
    double fl = floor(xo), t = xo - fl;
    int64_t f = (int64_t)fl;
    if (a.mode == 0) {
        int64_t i;
        if (t == 0) i = f;
        else switch (a.nearest) {
            case 1: i = t >= 0.5 ? f + 1 : f; break;
            case 2: i = f; break;
            case 3: i = f + 1; break;
            default: i = t > 0.5 ? f + 1 : f; break;
            }
        idx[0] = i < 0 ? 0 : i >= len_in ? len_in - 1 : i;
        w[0] = 1;
        return 1;
    }
    int taps = a.mode == 1 ? 2 : 4;
    int64_t first;
    if (a.mode == 1) {
        w[0] = 1 - t; w[1] = t;
        first = f;
    } else {
        double A = a.cubic_a, p = t + 1, b = 1 - t, e = 2 - t;
        w[0] = ((A * p - 5 * A) * p + 8 * A) * p - 4 * A;
        w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
        w[2] = ((A + 2) * b - (A + 3)) * b * b + 1;
        w[3] = ((A * e - 5 * A) * e + 8 * A) * e - 4 * A;
        first = f - 1;
    }
    double sum = 0;
    for (int j = 0; j < taps; j++) {
        int64_t i = first + j;
        if (a.excl && (i < 0 || i >= len_in)) w[j] = 0;
        sum += w[j];
        idx[j] = i < 0 ? 0 : i >= len_in ? len_in - 1 : i;
    }
    if (a.excl && sum != 0)
        for (int j = 0; j < taps; j++) w[j] /= sum;
    return taps;
}

__global__ void resize_kernel(tbn_resize_args a, const void *x, void *y, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t idx[TBN_MAX_RANK][4];
        double w[TBN_MAX_RANK][4];
        int taps[TBN_MAX_RANK], out_of = 0;
        int64_t t = e, xs = 1, xst[TBN_MAX_RANK];
        for (int d = a.rank - 1; d >= 0; d--) {
            int64_t o = t % a.out[d];
            t /= a.out[d];
            int oo;
            taps[d] = resize_taps(a, d, o, idx[d], w[d], &oo);
            out_of |= oo;
            xst[d] = xs;
            xs *= a.in[d];
        }
        if (out_of) { tbn_stf(y, a.dt, e, a.extrap); continue; }
        if (a.mode == 0) {
            int64_t src = 0;
            for (int d = 0; d < a.rank; d++) src += idx[d][0] * xst[d];
            tbn_std(y, a.dt, e, tbn_ldd(x, a.dt, src));
            continue;
        }
        int tp[TBN_MAX_RANK];
        for (int d = 0; d < a.rank; d++) tp[d] = 0;
        double acc = 0;
        for (;;) {
            double wt = 1;
            int64_t src = 0;
            for (int d = 0; d < a.rank; d++) {
                wt *= w[d][tp[d]];
                src += idx[d][tp[d]] * xst[d];
            }
            if (wt != 0) acc += wt * tbn_ldd(x, a.dt, src);
            int d = a.rank - 1;
            for (; d >= 0; d--) {
                if (++tp[d] < taps[d]) break;
                tp[d] = 0;
            }
            if (d < 0) break;
        }
        tbn_std(y, a.dt, e, acc);
    }
}

extern "C" cudaError_t tbn_resize(const tbn_resize_args *a, const void *x, void *y, cudaStream_t s) {
    int64_t n = 1;
    for (int d = 0; d < a->rank; d++) n *= a->out[d];
    if (n <= 0) return cudaSuccess;
    resize_kernel<<<tbn_blocks(n, 128), 128, 0, s>>>(*a, x, y, n);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- pools */

__global__ void pool_kernel(tbn_pool_args a, const void *x, void *y, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        /* (N, C, OH, OW), or channels-last (N, OH, OW, C): element (ih, iw) of
         * the plane at plane + (ih * w + iw) * cs */
        int64_t ow, oh, plane, cs;
        if (a.nhwc) {
            int64_t c = e % a.c, r = e / a.c;
            ow = r % a.ow;
            oh = (r / a.ow) % a.oh;
            plane = (r / (a.ow * a.oh)) * a.h * a.w * a.c + c;
            cs = a.c;
        } else {
            ow = e % a.ow;
            oh = (e / a.ow) % a.oh;
            plane = (e / (a.ow * a.oh)) * a.h * a.w;
            cs = 1;
        }
        float acc = a.is_max ? -INFINITY : 0.0f;
        int64_t cnt = 0;
        for (int i = 0; i < a.kh; i++) {
            int64_t ih = oh * a.sh - a.pt + (int64_t)i * a.dh;
            int in_h = ih >= 0 && ih < a.h, pad_h = ih >= -a.pt && ih < a.h + a.pb;
            for (int j = 0; j < a.kw; j++) {
                int64_t iw = ow * a.sw - a.pl + (int64_t)j * a.dw;
                int in_w = iw >= 0 && iw < a.w, pad_w = iw >= -a.pl && iw < a.w + a.pr;
                if (in_h && in_w) {
                    float v = tbn_ldf(x, a.dt, plane + (ih * a.w + iw) * cs);
                    if (a.is_max) acc = v > acc ? v : acc;
                    else acc += v;
                }
                cnt += a.incl ? (pad_h && pad_w) : (in_h && in_w);
            }
        }
        tbn_stf(y, a.dt, e, a.is_max ? acc : cnt ? acc / (float)cnt : 0.0f);
    }
}

extern "C" cudaError_t tbn_pool(const tbn_pool_args *a, const void *x, void *y, cudaStream_t s) {
    int64_t n = a->planes * a->oh * a->ow;
    if (n <= 0) return cudaSuccess;
    pool_kernel<<<tbn_blocks(n, 256), 256, 0, s>>>(*a, x, y, n);
    return cudaGetLastError();
}

/* one warp per plane */
__global__ void gap_kernel(const void *x, void *y, int dt, int64_t planes, int64_t sp) {
    int64_t p = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (p >= planes) return;
    float acc = 0;
    for (int64_t i = lane; i < sp; i += 32) acc += tbn_ldf(x, dt, p * sp + i);
    acc = tbn_warp_sum(acc);
    if (lane == 0) tbn_stf(y, dt, p, sp ? acc / (float)sp : 0.0f);
}

/* channels-last: a thread per (n, c), the threads of a warp on consecutive
 * channels (coalesced reads); 4 partial sums per (n, c) over a quarter of the
 * positions each when the positions are many, combined through shared memory */
__global__ void gap_nhwc_kernel(const void *x, void *y, int dt, int64_t n, int64_t c, int64_t sp) {
    __shared__ float part[4][64];
    int64_t o = blockIdx.x * 64 + (threadIdx.x & 63);
    int q = threadIdx.x >> 6; /* 0..3 */
    float acc = 0;
    if (o < n * c) {
        int64_t b = o / c, ch = o % c, base = b * sp * c + ch;
        for (int64_t i = q; i < sp; i += 4) acc += tbn_ldf(x, dt, base + i * c);
    }
    part[q][threadIdx.x & 63] = acc;
    __syncthreads();
    if (q == 0 && o < n * c) {
        float t = part[0][threadIdx.x] + part[1][threadIdx.x] + part[2][threadIdx.x] + part[3][threadIdx.x];
        tbn_stf(y, dt, o, sp ? t / (float)sp : 0.0f);
    }
}

extern "C" cudaError_t tbn_global_avgpool_nhwc(const void *x, void *y, int dt, int64_t n, int64_t c, int64_t sp,
                                               cudaStream_t s) {
    if (n * c <= 0) return cudaSuccess;
    gap_nhwc_kernel<<<(unsigned)((n * c + 63) / 64), 256, 0, s>>>(x, y, dt, n, c, sp);
    return cudaGetLastError();
}

extern "C" cudaError_t tbn_global_avgpool(const void *x, void *y, int dt, int64_t planes, int64_t sp,
                                          cudaStream_t s) {
    if (planes <= 0) return cudaSuccess;
    gap_kernel<<<(unsigned)((planes + 7) / 8), 256, 0, s>>>(x, y, dt, planes, sp);
    return cudaGetLastError();
}
