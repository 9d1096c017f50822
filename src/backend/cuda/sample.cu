/* sample.cu — picking the next token of each logits row on the GPU, so that
 * only the token and its log-probabilities cross to the host.
 *
 * One block of SAMPLE_THREADS per row, in the order of the CPU sampler
 * (runtime/sampler.c): log-softmax statistics and the top alternatives of
 * the raw logits; penalties over the row's (token, count) pairs; greedy
 * (argmax, lowest index on ties) at temperature 0; else top-k, min-p and
 * top-p as thresholds on the logits and a draw with the host's uniform u.
 *
 * Thresholds without sorting: a radix select over an order-preserving
 * 32-bit key of each logit, a byte per pass (4 passes), finds the largest
 * key t whose elements at or above it weigh at least a target: a count for
 * top-k, probability mass for top-p. Mass is fixed point,
 * q_i = floor(exp((x_i - max) / T) * 2^32), summed as 64-bit integers, so
 * every pass and the draw see the same sums in any order: a seed gives the
 * same tokens on every run. Ties at a threshold are all kept (the CPU keeps
 * the lower indices); probabilities below 2^-32 of the largest are never
 * drawn. The draw walks the kept tokens in index order (the CPU walks them
 * in sorted order): the same distribution, another token for the same u.
 */
#include <math.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"

#define SAMPLE_THREADS 1024
#define FULL 0xffffffffu
typedef unsigned long long u64;

/* Order-preserving key: a < b as floats <=> okey(a) < okey(b). */
__device__ __forceinline__ uint32_t okey(float f) {
    uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* (v, i) ranks before (w, j): larger value, then lower index. */
__device__ __forceinline__ bool better(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

/* Running max m and sum s of exp(x - m), and the argmax (bv, bi). */
struct row_stats {
    float m, s, bv;
    int bi;
};

__device__ __forceinline__ row_stats stats_init() {
    row_stats r;
    r.m = -INFINITY;
    r.s = 0.0f;
    r.bv = -INFINITY;
    r.bi = 0x7fffffff;
    return r;
}

__device__ __forceinline__ void stats_add(row_stats &a, float x, int i) {
    if (better(x, i, a.bv, a.bi)) {
        a.bv = x;
        a.bi = i;
    }
    if (x == -INFINITY || x != x) return;
    if (x > a.m) {
        a.s = a.s * expf(a.m - x) + 1.0f;
        a.m = x;
    } else {
        a.s += expf(x - a.m);
    }
}

__device__ __forceinline__ void stats_merge(row_stats &a, const row_stats &b) {
    if (better(b.bv, b.bi, a.bv, a.bi)) {
        a.bv = b.bv;
        a.bi = b.bi;
    }
    if (b.m == -INFINITY) return;
    if (b.m > a.m) {
        a.s = a.s * expf(a.m - b.m) + b.s;
        a.m = b.m;
    } else {
        a.s += b.s * expf(b.m - a.m);
    }
}

__device__ __forceinline__ row_stats stats_shfl(const row_stats &a, int o) {
    row_stats r;
    r.m = __shfl_xor_sync(FULL, a.m, o);
    r.s = __shfl_xor_sync(FULL, a.s, o);
    r.bv = __shfl_xor_sync(FULL, a.bv, o);
    r.bi = __shfl_xor_sync(FULL, a.bi, o);
    return r;
}

/* The block's stats; every thread gets them. red: 32 entries. */
__device__ row_stats block_stats(row_stats a, row_stats *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) stats_merge(a, stats_shfl(a, o));
    __syncthreads();
    if (lane == 0) red[warp] = a;
    __syncthreads();
    a = lane < (int)(blockDim.x >> 5) ? red[lane] : stats_init();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) stats_merge(a, stats_shfl(a, o));
    return a;
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ u64 block_sum_u64(u64 v, u64 *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? red[lane] : 0;
    return warp_sum_u64(v);
}

/* Exclusive prefix sum over the block in thread order; *total gets the sum. */
__device__ u64 block_excl_scan_u64(u64 v, u64 *red, u64 *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u64 inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(FULL, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) red[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        u64 w = lane < nw ? red[lane] : 0, wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            u64 y = __shfl_up_sync(FULL, wi, o);
            if (lane >= o) wi += y;
        }
        if (lane < nw) red[lane] = wi - w; /* exclusive, per warp */
        if (lane == 31) red[32] = wi;
    }
    __syncthreads();
    *total = red[32];
    return red[warp] + inc - v;
}

/* hist[digit] += w for every lane with `in`, one shared-memory atomic per
 * distinct digit of the warp (the top byte of most logits is the same few
 * exponents: lane-by-lane atomics would serialise on them). */
template <bool COUNT>
__device__ __forceinline__ void warp_hist_add(u64 *hist, bool in, uint32_t digit, u64 w) {
    int lane = threadIdx.x & 31;
    unsigned act = __ballot_sync(FULL, in);
    while (act) {
        int leader = __ffs(act) - 1;
        uint32_t d = __shfl_sync(FULL, digit, leader);
        bool mine = ((act >> lane) & 1u) && digit == d;
        unsigned grp = __ballot_sync(FULL, mine);
        u64 sum = COUNT ? (u64)__popc(grp) : warp_sum_u64(mine ? w : 0);
        if (lane == leader) atomicAdd(&hist[d], sum);
        act &= ~grp;
    }
}

/* Fixed-point weight of a logit: exp((x - m) / T) in units of 2^-32. */
__device__ __forceinline__ float rel_prob(float x, float m, float inv_t) { return expf((x - m) * inv_t); }
__device__ __forceinline__ u64 fixed_mass(float e) { return (u64)(e * 4294967296.0f); }

/* Elements in play: key >= kmin, and relative probability >= minp when
 * minp > 0. Returns the largest key t such that the elements in play with
 * key >= t weigh at least `target` (COUNT: one each; else fixed_mass), or
 * kmin when all of them together weigh less. Every thread gets it. */
template <bool COUNT>
__device__ uint32_t radix_select(const float *x, int V, float m, float inv_t, uint32_t kmin, float minp, u64 target,
                                 u64 *hist, u64 *sh) {
    uint32_t prefix = 0;
    u64 above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        uint32_t hmask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        for (int base = 0; base < V; base += blockDim.x) {
            int i = base + threadIdx.x;
            bool in = false;
            uint32_t digit = 0;
            u64 w = 0;
            if (i < V) {
                float v = x[i];
                uint32_t k = okey(v);
                if (k >= kmin && (k & hmask) == (prefix & hmask)) {
                    float e = (COUNT && minp <= 0.0f) ? 1.0f : rel_prob(v, m, inv_t);
                    if (minp <= 0.0f || e >= minp) {
                        in = true;
                        digit = (k >> shift) & 255u;
                        w = COUNT ? 1 : fixed_mass(e);
                    }
                }
            }
            warp_hist_add<COUNT>(hist, in, digit, w);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 cum = above;
            int d = 255;
            for (; d >= 0; d--) {
                if (cum + hist[d] >= target) break;
                cum += hist[d];
            }
            if (d < 0) {
                sh[0] = 1; /* everything in play weighs less than the target */
            } else {
                sh[0] = 0;
                sh[1] = prefix | ((uint32_t)d << shift);
                sh[2] = cum;
            }
        }
        __syncthreads();
        if (sh[0]) return kmin;
        prefix = (uint32_t)sh[1];
        above = sh[2];
        __syncthreads(); /* sh and hist are rewritten by the next pass */
    }
    return prefix;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(float *logits, int V, const tbc_sample_row *rows, const int32_t *pen_tok, const int32_t *pen_cnt,
                  float *pen_raw, tbc_sample_out *outs) {
    __shared__ row_stats red_s[32];
    __shared__ u64 red_u[33];
    __shared__ u64 hist[256];
    __shared__ u64 sh[4];
    __shared__ int sh_tok;
    __shared__ float sh_raw;
    const tbc_sample_row P = rows[blockIdx.x];
    float *x = logits + (size_t)blockIdx.x * (size_t)V;
    tbc_sample_out *o = outs + blockIdx.x;
    int tid = threadIdx.x;

    /* 1. the raw distribution: log-sum-exp, argmax, top alternatives */
    row_stats st = stats_init();
    for (int i = tid; i < V; i += blockDim.x) stats_add(st, x[i], i);
    st = block_stats(st, red_s);
    float lse = st.m + logf(st.s);
    int n_top = 0;
    if (P.n_top > 0) {
        float pv = INFINITY;
        int pi = -1;
        for (int k = 0; k < P.n_top && k < TBC_TOP_MAX; k++) {
            row_stats b = stats_init();
            b.bi = 0x7fffffff;
            for (int i = tid; i < V; i += blockDim.x) {
                float v = x[i];
                if ((v < pv || (v == pv && i > pi)) && (b.bi == 0x7fffffff || better(v, i, b.bv, b.bi))) {
                    b.bv = v;
                    b.bi = i;
                }
            }
            b = block_stats(b, red_s);
            if (b.bi == 0x7fffffff) break;
            if (tid == 0) {
                o->top_ids[k] = b.bi;
                o->top_logprobs[k] = b.bv - lse;
            }
            pv = b.bv;
            pi = b.bi;
            n_top++;
        }
    }

    /* 2. penalties, once per distinct token of the window */
    if (P.pen_n > 0) {
        for (int j = tid; j < P.pen_n; j += blockDim.x) {
            int t = pen_tok[P.pen_off + j];
            if (t < 0 || t >= V) continue;
            float l = x[t];
            pen_raw[P.pen_off + j] = l;
            if (P.repeat_penalty != 1.0f) l = l > 0 ? l / P.repeat_penalty : l * P.repeat_penalty;
            l -= P.presence_penalty + P.frequency_penalty * (float)pen_cnt[P.pen_off + j];
            x[t] = l;
        }
        __syncthreads();
        st = stats_init();
        for (int i = tid; i < V; i += blockDim.x) stats_add(st, x[i], i);
        st = block_stats(st, red_s);
    }

    /* 3. the pick */
    int tok = P.force >= 0 && P.force < V ? P.force : st.bi;
    if (P.force < 0 && P.temperature > 0.0f && st.m > -INFINITY) {
        float m = st.m, inv_t = 1.0f / P.temperature, minp = P.min_p;
        uint32_t kmin = 0;
        if (P.top_k > 0 && P.top_k < V)
            kmin = radix_select<true>(x, V, m, inv_t, 0u, 0.0f, (u64)P.top_k, hist, sh);
        if (P.top_p < 1.0f) {
            /* the CPU's top-p mass is relative to the top-k candidates */
            u64 z = 0;
            for (int i = tid; i < V; i += blockDim.x) {
                float v = x[i];
                if (okey(v) >= kmin) z += fixed_mass(rel_prob(v, m, inv_t));
            }
            z = block_sum_u64(z, red_u);
            u64 target = (u64)ceil((double)P.top_p * (double)z);
            if (target < 1) target = 1;
            kmin = radix_select<false>(x, V, m, inv_t, kmin, minp, target, hist, sh);
        }
        /* the draw: contiguous chunks per thread, scanned in thread order */
        int chunk = (V + (int)blockDim.x - 1) / (int)blockDim.x, c0 = tid * chunk;
        int c1 = c0 + chunk < V ? c0 + chunk : V;
        u64 own = 0;
        for (int i = c0; i < c1; i++) {
            float v = x[i];
            if (okey(v) < kmin) continue;
            float e = rel_prob(v, m, inv_t);
            if (minp > 0.0f && e < minp) continue;
            own += fixed_mass(e);
        }
        u64 total = 0, excl = block_excl_scan_u64(own, red_u, &total);
        if (tid == 0) sh_tok = st.bi; /* total is never 0 (the max weighs 2^32); kept as a guard */
        __syncthreads();
        if (total > 0) {
            u64 r = (u64)((double)P.u * (double)total);
            if (r >= total) r = total - 1;
            if (r >= excl && r < excl + own) {
                u64 acc = excl;
                for (int i = c0; i < c1; i++) {
                    float v = x[i];
                    if (okey(v) < kmin) continue;
                    float e = rel_prob(v, m, inv_t);
                    if (minp > 0.0f && e < minp) continue;
                    acc += fixed_mass(e);
                    if (r < acc) {
                        sh_tok = i;
                        break;
                    }
                }
            }
        }
        __syncthreads();
        tok = sh_tok;
    }
    if (tok < 0 || tok >= V) tok = 0; /* only when every logit is NaN */

    /* 4. the pick's log-probability under the raw distribution */
    if (tid == 0) sh_raw = x[tok];
    __syncthreads();
    for (int j = tid; j < P.pen_n; j += blockDim.x)
        if (pen_tok[P.pen_off + j] == tok) sh_raw = pen_raw[P.pen_off + j];
    __syncthreads();
    if (tid == 0) {
        o->token = tok;
        o->logprob = sh_raw - lse;
        o->n_top = n_top;
    }
}

extern "C" cudaError_t tbc_sample(float *logits, int R, int V, const tbc_sample_row *rows, const int32_t *pen_tok,
                                  const int32_t *pen_cnt, float *pen_raw, tbc_sample_out *out, cudaStream_t s) {
    if (R <= 0) return cudaSuccess;
    sample_kernel<<<R, SAMPLE_THREADS, 0, s>>>(logits, V, rows, pen_tok, pen_cnt, pen_raw, out);
    return cudaGetLastError();
}
