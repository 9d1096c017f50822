/* attention.cu — paged causal GQA attention of one layer, with RoPE and the
 * KV-cache write in front of it.
 *
 *   rope_kv_kernel   one block per token: rotates the token's q and k heads in
 *                    place (qkv is consumed only by this op) and stores k and v
 *                    at (seq[t], pos[t]) in the paged cache.
 *   attn_kernel      one block per (head, token, split): online softmax over
 *                    the split's range of the sequence's keys. The head of hd
 *                    values is spread over a group of S lanes (S the largest
 *                    power of two dividing hd, at most 32; EPL = hd / S values
 *                    per lane), so a warp scores 32 / S keys at once and tiny
 *                    heads (hd = 8) still use whole warps. Groups, then warps,
 *                    merge their (max, sum, output) triples.
 *   combine          with n_splits > 1 (decode "flash-decoding"): the last
 *                    block of a (token, head) to finish (an atomic counter
 *                    per pair) merges the splits' partial triples. With
 *                    split_min, a (token, head) whose context is short uses
 *                    fewer splits (one per split_min keys) and the blocks
 *                    of the unused splits return at once.
 * With rope_done the qkv GEMV's epilogue has done rope_kv's work.
 */
#include <math.h>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"

#define ATTN_WARPS 4
#define ATTN_MAX_HD 256

/* ---------------------------------------------------------------- rope + kv write */

__global__ void rope_kv_kernel(tbc_attn_args a, float *qkv) {
    tbc_pdl_wait();
    int t = blockIdx.x, hd = a.hd, half = hd / 2, H = a.n_heads, KV = a.n_kv;
    float *row = qkv + (size_t)t * (size_t)(H + 2 * KV) * hd;
    int p = a.pos[t];
    for (int i = threadIdx.x; i < (H + KV) * half; i += blockDim.x) {
        int h = i / half, j = i % half;
        tbc_rotate_pair(row + (size_t)h * hd, j, half, a.interleaved, (float)p * a.inv_freq[j]);
    }
    __syncthreads();
    int blk = a.block_tables[(size_t)a.seq[t] * a.max_blocks + p / a.block_size];
    size_t base = ((size_t)blk * a.block_size + (size_t)(p % a.block_size)) * (size_t)KV * hd;
    const float *k = row + (size_t)H * hd, *v = row + (size_t)(H + KV) * hd;
    for (int e = threadIdx.x; e < KV * hd; e += blockDim.x) {
        if (a.kv_f16) {
            ((__half *)a.k_cache)[base + e] = __float2half_rn(k[e]);
            ((__half *)a.v_cache)[base + e] = __float2half_rn(v[e]);
        } else {
            ((float *)a.k_cache)[base + e] = k[e];
            ((float *)a.v_cache)[base + e] = v[e];
        }
    }
}

/* ---------------------------------------------------------------- attention */

/* EPL consecutive cache values from element offset off, as f32. */
template <int EPL, bool F16>
__device__ __forceinline__ void load_kv(const void *base, size_t off, float *f) {
    if (F16) {
        const __half *p = (const __half *)base + off;
        if (EPL % 2 == 0) {
#pragma unroll
            for (int i = 0; i < EPL / 2; i++) {
                float2 v = __half22float2(((const __half2 *)p)[i]);
                f[2 * i] = v.x;
                f[2 * i + 1] = v.y;
            }
        } else {
#pragma unroll
            for (int i = 0; i < EPL; i++) f[i] = __half2float(p[i]);
        }
    } else {
        const float *p = (const float *)base + off;
        if (EPL % 4 == 0) {
#pragma unroll
            for (int i = 0; i < EPL / 4; i++) {
                float4 v = ((const float4 *)p)[i];
                f[4 * i] = v.x; f[4 * i + 1] = v.y; f[4 * i + 2] = v.z; f[4 * i + 3] = v.w;
            }
        } else if (EPL % 2 == 0) {
#pragma unroll
            for (int i = 0; i < EPL / 2; i++) {
                float2 v = ((const float2 *)p)[i];
                f[2 * i] = v.x;
                f[2 * i + 1] = v.y;
            }
        } else {
#pragma unroll
            for (int i = 0; i < EPL; i++) f[i] = p[i];
        }
    }
}

/* (m, l, acc) <- merge of two softmax partials. */
template <int EPL>
__device__ __forceinline__ void merge(float &m, float &l, float *acc, float m2, float l2, const float *acc2) {
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;
    float c1 = __expf(m - mn), c2 = __expf(m2 - mn);
    l = l * c1 + l2 * c2;
#pragma unroll
    for (int e = 0; e < EPL; e++) acc[e] = acc[e] * c1 + acc2[e] * c2;
    m = mn;
}

/* Merges the ns partial triples of (t, h) into out (L2 reads: other
 * blocks wrote them). */
__device__ void combine(const tbc_attn_args &a, int t, int h, int ns, float *out) {
    const int hd = a.hd, H = a.n_heads;
    const float *p = a.partial + ((size_t)t * H + h) * a.n_splits * (size_t)(hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, __ldcg(p + (size_t)s * (hd + 2) + hd));
    float L = 0.0f;
    for (int s = 0; s < ns; s++) {
        const float *ps = p + (size_t)s * (hd + 2);
        float ms = __ldcg(ps + hd);
        if (ms != -INFINITY) L += __ldcg(ps + hd + 1) * __expf(ms - M);
    }
    float *o = out + ((size_t)t * H + h) * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < ns; s++) {
            const float *ps = p + (size_t)s * (hd + 2);
            float ms = __ldcg(ps + hd);
            if (ms != -INFINITY) acc += __ldcg(ps + e) * __expf(ms - M);
        }
        o[e] = acc / L;
    }
}

template <int EPL, bool F16>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_kernel(tbc_attn_args a, const float *qkv, float *out) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_o[ATTN_WARPS][ATTN_MAX_HD];
    __shared__ int sm_last;
    tbc_pdl_wait();
    tbc_pdl_trigger();
    const int h = blockIdx.x, t = blockIdx.y, sp = blockIdx.z;
    const int len = a.pos[t] + 1;
    /* splits in use for this (t, h): at most one per split_min keys */
    int ns = a.n_splits;
    if (a.split_min > 0) {
        int cap = (len + a.split_min - 1) / a.split_min;
        if (cap < ns) ns = cap < 1 ? 1 : cap;
    }
    if (sp >= ns) return;
    const int hd = a.hd, S = hd / EPL, H = a.n_heads, KV = a.n_kv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gi = lane / S, li = lane % S, gpw = 32 / S;
    const int slot = warp * gpw + gi, nslots = ATTN_WARPS * gpw;
    const int kvh = h / (H / KV);

    float q[EPL], acc[EPL];
    const float *qp = qkv + (size_t)t * (size_t)(H + 2 * KV) * hd + (size_t)h * hd + li * EPL;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        q[e] = qp[e] * a.scale;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    const int chunk = (len + ns - 1) / ns;
    const int lo = sp * chunk, hi = min(len, lo + chunk);
    const int32_t *bt = a.block_tables + (size_t)a.seq[t] * a.max_blocks;
    const int bs = a.block_size;
    /* every lane runs the same number of iterations (shuffles need them all) */
    for (int base = lo; base < hi; base += nslots) {
        int j = base + slot;
        bool valid = j < hi;
        float kf[EPL], vf[EPL];
        float dot = 0.0f;
        if (valid) {
            int blk = bt[j / bs];
            size_t off = (((size_t)blk * bs + (size_t)(j % bs)) * KV + kvh) * (size_t)hd + (size_t)li * EPL;
            load_kv<EPL, F16>(a.k_cache, off, kf);
            load_kv<EPL, F16>(a.v_cache, off, vf);
#pragma unroll
            for (int e = 0; e < EPL; e++) dot = fmaf(q[e], kf[e], dot);
        }
        for (int o = S >> 1; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (valid) {
            float mn = fmaxf(m, dot);
            float corr = __expf(m - mn), p = __expf(dot - mn);
            l = l * corr + p;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[e] = fmaf(p, vf[e], acc[e] * corr);
            m = mn;
        }
    }
    /* groups of a warp: partners sit S, 2S, ... lanes apart */
    for (int o = S; o < 32; o <<= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
        float a2[EPL];
#pragma unroll
        for (int e = 0; e < EPL; e++) a2[e] = __shfl_xor_sync(0xffffffffu, acc[e], o);
        merge<EPL>(m, l, acc, m2, l2, a2);
    }
    if (gi == 0) {
#pragma unroll
        for (int e = 0; e < EPL; e++) sm_o[warp][li * EPL + e] = acc[e];
        if (li == 0) {
            sm_m[warp] = m;
            sm_l[warp] = l;
        }
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, sm_m[w]);
    float c[ATTN_WARPS], L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) {
        c[w] = M == -INFINITY ? 0.0f : __expf(sm_m[w] - M);
        L += sm_l[w] * c[w];
    }
    if (ns == 1) {
        float *o = out + ((size_t)t * H + h) * hd;
        for (int e = threadIdx.x; e < hd; e += blockDim.x) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++) s += sm_o[w][e] * c[w];
            o[e] = s / L;
        }
    } else {
        float *o = a.partial + (((size_t)t * H + h) * a.n_splits + sp) * (size_t)(hd + 2);
        for (int e = threadIdx.x; e < hd; e += blockDim.x) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++) s += sm_o[w][e] * c[w];
            o[e] = s;
        }
        if (threadIdx.x == 0) {
            o[hd] = M;
            o[hd + 1] = L;
        }
        /* the last of the (t, h) blocks to finish merges the splits */
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            int done = atomicAdd(a.counters + (size_t)t * H + h, 1);
            sm_last = done == ns - 1;
        }
        __syncthreads();
        if (!sm_last) return;
        __threadfence();
        if (threadIdx.x == 0) a.counters[(size_t)t * H + h] = 0;
        combine(a, t, h, ns, out);
    }
}

/* ---------------------------------------------------------------- launcher */

/* Lanes per head: the largest power of two dividing hd, at most 32. */
static int group_lanes(int hd) {
    int s = 1;
    while (s < 32 && hd % (2 * s) == 0) s *= 2;
    return s;
}

extern "C" int tbc_attention_supports(int hd) {
    return hd >= 2 && hd % 2 == 0 && hd <= ATTN_MAX_HD && hd / group_lanes(hd) <= 8;
}

template <bool F16>
static cudaError_t attn_launch(int epl, dim3 grid, const tbc_attn_args &a, const float *qkv, float *out,
                               cudaStream_t s) {
    dim3 block(ATTN_WARPS * 32);
    switch (epl) {
    case 1: return tbc_launch(attn_kernel<1, F16>, grid, block, 0, s, a, qkv, out);
    case 2: return tbc_launch(attn_kernel<2, F16>, grid, block, 0, s, a, qkv, out);
    case 3: return tbc_launch(attn_kernel<3, F16>, grid, block, 0, s, a, qkv, out);
    case 4: return tbc_launch(attn_kernel<4, F16>, grid, block, 0, s, a, qkv, out);
    case 5: return tbc_launch(attn_kernel<5, F16>, grid, block, 0, s, a, qkv, out);
    case 6: return tbc_launch(attn_kernel<6, F16>, grid, block, 0, s, a, qkv, out);
    case 7: return tbc_launch(attn_kernel<7, F16>, grid, block, 0, s, a, qkv, out);
    case 8: return tbc_launch(attn_kernel<8, F16>, grid, block, 0, s, a, qkv, out);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t tbc_attention(const tbc_attn_args *a, float *qkv, float *out, cudaStream_t s) {
    if (!tbc_attention_supports(a->hd) || a->n_splits < 1 || a->n_kv < 1 || a->n_heads % a->n_kv ||
        (a->n_splits > 1 && !a->counters))
        return cudaErrorInvalidValue;
    cudaError_t e;
    if (!a->rope_done) {
        e = tbc_launch(rope_kv_kernel, dim3(a->T), dim3(128), 0, s, *a, qkv);
        if (e != cudaSuccess) return e;
    }
    int epl = a->hd / group_lanes(a->hd);
    dim3 grid(a->n_heads, a->T, a->n_splits);
    return a->kv_f16 ? attn_launch<true>(epl, grid, *a, qkv, out, s) : attn_launch<false>(epl, grid, *a, qkv, out, s);
}
