/* gemv.cu — the decode matmul: y (T, N) = x (T, K) . w (N, K)^T (+ bias) for
 * T <= 8, reading each weight once at the memory-bandwidth limit.
 *
 * Rows are computed in pairs so that an epilogue can fuse the op that follows
 * the matmul (see "epilogues": SiLU-gated product, RoPE + KV-cache write,
 * residual add), and the RMSNorm in front of it can run in the prologue
 * (inline RMSNorm). SIMT kernels: gemv_row_kernel (f16/bf16, T <= 2: one or
 * two warps per row, the warps of a pair meet in shared memory for the
 * epilogue; one, two or four loads per lane in flight, chosen per matrix
 * by timing) and gemv_pair_kernel (one warp per row pair); each lane streams
 * 16-byte vectors (8 f16/bf16 or 4 f32 weights) and multiplies them with
 * every token's x (read through L1: x is tiny and shared by all warps). f32 accumulation; for f16/bf16 weights x is
 * rounded to the weight type first (see cuda_kernels.h). K not a multiple of
 * the vector (or misaligned pointers) takes the same kernel with scalar
 * loads. f16/bf16 weights with K a multiple of 32 and more than simt_max_t
 * tokens take the tensor-core kernel (gemv_mma_kernel). Every kernel waits
 * for the previous one (programmatic dependent launch) only after it has
 * started the prefetch of its first weights into L2. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/qwiden.cuh"

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

/* ---------------------------------------------------------------- epilogues
 * Every GEMV kernel computes rows in pairs (ra, rb), so that an epilogue can
 * combine the two values of a pair:
 *   TBC_EPI_PLAIN  rows (2P, 2P + 1); y = x w^T (+ bias)
 *   TBC_EPI_GLU    rows (P, P + N/2), the gate and up rows of one unit; only
 *                  silu(gate) * up is written, to e.glu (T, N/2)
 *   TBC_EPI_ROPE   rows (j, j + hd/2) (or (2j, 2j + 1) interleaved) of one
 *                  head: q and k heads are rotated by RoPE at the token's
 *                  position, written to y, and k and v are also stored in the
 *                  paged KV cache (what attention's rope_kv kernel does)
 *   TBC_EPI_ADD    rows (2P, 2P + 1); res_out = res + x w^T (+ bias) */
template <int MODE>
__device__ __forceinline__ int pair_count(const tbc_gemv_epi &e, int N) {
    (void)e;
    return MODE == TBC_EPI_PLAIN || MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
}

template <int MODE>
__device__ __forceinline__ void pair_rows(const tbc_gemv_epi &e, int N, int P, int &ra, int &rb) {
    if (MODE == TBC_EPI_PLAIN || MODE == TBC_EPI_ADD) {
        ra = 2 * P;
        rb = 2 * P + 1;
    } else if (MODE == TBC_EPI_GLU) {
        ra = P;
        rb = P + N / 2;
    } else {
        int half = e.attn.hd / 2, h = P / half, j = P - h * half, b = h * e.attn.hd;
        ra = e.attn.interleaved ? b + 2 * j : b + j;
        rb = e.attn.interleaved ? ra + 1 : ra + half;
    }
}

/* Stores the pair (va, vb) of rows (ra, rb), token t (bias included). */
template <int MODE>
__device__ __forceinline__ void epi_store(const tbc_gemv_epi &e, float *__restrict__ y, int N, int t, int P, int ra,
                                          int rb, bool okb, float va, float vb) {
    if (MODE == TBC_EPI_PLAIN) {
        y[(size_t)t * N + ra] = va;
        if (okb) y[(size_t)t * N + rb] = vb;
    } else if (MODE == TBC_EPI_GLU) {
        e.glu[(size_t)t * (N / 2) + P] = va / (1.0f + expf(-va)) * vb;
    } else if (MODE == TBC_EPI_ADD) {
        size_t ia = (size_t)t * N + ra, ib = (size_t)t * N + rb;
        e.res_out[ia] = e.res[ia] + va;
        if (okb) e.res_out[ib] = e.res[ib] + vb;
    } else {
        const tbc_attn_args &a = e.attn;
        int hd = a.hd, half = hd / 2, h = P / half, j = P - h * half, H = a.n_heads, KV = a.n_kv;
        int p = a.pos[t];
        if (h < H + KV) {
            float sn, cs;
            sincosf((float)p * a.inv_freq[j], &sn, &cs);
            float x0 = va, x1 = vb;
            va = x0 * cs - x1 * sn;
            vb = x0 * sn + x1 * cs;
        }
        y[(size_t)t * N + ra] = va;
        y[(size_t)t * N + rb] = vb;
        if (h >= H) {
            int kvh = h < H + KV ? h - H : h - H - KV;
            void *cache = h < H + KV ? a.k_cache : a.v_cache;
            int blk = a.block_tables[(size_t)a.seq[t] * a.max_blocks + p / a.block_size];
            size_t base = (((size_t)blk * a.block_size + (size_t)(p % a.block_size)) * KV + kvh) * (size_t)hd;
            size_t ia = base + (size_t)(ra - h * hd), ib = base + (size_t)(rb - h * hd);
            if (a.kv_f16) {
                ((__half *)cache)[ia] = __float2half_rn(va);
                ((__half *)cache)[ib] = __float2half_rn(vb);
            } else if (a.kv_bf16) {
                ((__nv_bfloat16 *)cache)[ia] = __float2bfloat16_rn(va);
                ((__nv_bfloat16 *)cache)[ib] = __float2bfloat16_rn(vb);
            } else {
                ((float *)cache)[ia] = va;
                ((float *)cache)[ib] = vb;
            }
        }
    }
}

/* ---------------------------------------------------------------- inline RMSNorm
 * RMSNorm of x in front of the GEMV (NORM): the norm weight has been folded
 * into w at load (w[n, k] * norm_w[k]), so y = x w^T / rms(x) with
 * rms(x) = sqrt(mean(x^2) + eps): every warp reads all of x for its dot
 * product anyway, so it also sums x^2 and scales its result at the end. x
 * is used unrounded there (the raw residual may exceed the f16 range). */

/* 8 (f16/bf16) or 4 (f32) values of token t's x at k0, rounded to the
 * weight type (or raw, and their squares summed into ss, with NORM). */
template <int WDT, bool NORM>
__device__ __forceinline__ void load_x(const float *__restrict__ x, size_t off, float *xf, float &ss) {
    constexpr int VEC = WDT == TBC_F32 ? 4 : 8;
    const float4 *xp = reinterpret_cast<const float4 *>(x + off);
#pragma unroll
    for (int q = 0; q < VEC / 4; q++) {
        float4 a = __ldg(xp + q);
        xf[4 * q] = a.x; xf[4 * q + 1] = a.y; xf[4 * q + 2] = a.z; xf[4 * q + 3] = a.w;
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        if (NORM) ss = fmaf(xf[e], xf[e], ss);
        else xf[e] = round_to_w<WDT>(xf[e]);
    }
}

/* The warp's sums of x^2 (per token) -> the factor 1 / rms(x). */
__device__ __forceinline__ float inv_rms(float ss, int K, float eps) {
    return rsqrtf(tbc_warp_sum(ss) / (float)K + eps);
}

/* ---------------------------------------------------------------- SIMT, pairs
 * One warp per row pair, GEMV_WARPS pairs per block. Each lane streams
 * 16-byte vectors of both rows, four per row in flight, and multiplies them
 * with every token's x (read once for the two rows, through L1). */
#define GEMV_WARPS 4

template <int WDT, int TT, bool NORM>
__device__ __forceinline__ void accum2(const float *__restrict__ x, int K, int k0, const uint4 &ua, const uint4 &ub,
                                       float *aa, float *ab, float *ss) {
    constexpr int VEC = WDT == TBC_F32 ? 4 : 8;
    float wa[VEC], wb[VEC];
    unpack16<WDT>(ua, wa);
    unpack16<WDT>(ub, wb);
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float xf[VEC];
        load_x<WDT, NORM>(x, (size_t)t * K + k0, xf, ss[t]);
        float sa = aa[t], sb = ab[t];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            sa = fmaf(xf[e], wa[e], sa);
            sb = fmaf(xf[e], wb[e], sb);
        }
        aa[t] = sa;
        ab[t] = sb;
    }
}

/* VECLOAD: 16-byte loads (K a multiple of the vector, 16-byte aligned rows);
 * otherwise one element per lane per step. NORM (VECLOAD only): the
 * inline RMSNorm above. */
template <int WDT, int TT, int MODE, bool VECLOAD, bool NORM>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_pair_kernel(const float *__restrict__ x, const void *__restrict__ w, const float *__restrict__ bias,
                 float *__restrict__ y, int K, int N, tbc_gemv_epi e) {
    constexpr int VEC = WDT == TBC_F32 ? 4 : 8;
    constexpr int ES = WDT == TBC_F32 ? 4 : 2;
    const int lane = threadIdx.x & 31;
    const int P = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const bool valid = P < pair_count<MODE>(e, N);
    if (!valid) return;
    int ra = 0, rb = 0;
    if (valid) pair_rows<MODE>(e, N, P, ra, rb);
    const bool okb = rb < N;
    const int rbl = okb ? rb : ra;
    float aa[TT], ab[TT], ss[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) aa[t] = ab[t] = ss[t] = 0.0f;
    if (VECLOAD) {
        const uint4 *wa = reinterpret_cast<const uint4 *>(static_cast<const char *>(w) + (size_t)ra * K * ES);
        const uint4 *wb = reinterpret_cast<const uint4 *>(static_cast<const char *>(w) + (size_t)rbl * K * ES);
        const int nv = K / VEC;
        /* the weights do not depend on the previous kernel: start them early */
        if (valid && lane < nv) {
            tbc_prefetch_l2(wa + lane);
            tbc_prefetch_l2(wb + lane);
        }
        tbc_pdl_wait();
        const float *xp = x;
        int v = lane;
        for (; v + 96 < nv; v += 128) {
            uint4 a0 = __ldg(wa + v), a1 = __ldg(wa + v + 32), a2 = __ldg(wa + v + 64), a3 = __ldg(wa + v + 96);
            uint4 b0 = __ldg(wb + v), b1 = __ldg(wb + v + 32), b2 = __ldg(wb + v + 64), b3 = __ldg(wb + v + 96);
            accum2<WDT, TT, NORM>(xp, K, v * VEC, a0, b0, aa, ab, ss);
            accum2<WDT, TT, NORM>(xp, K, (v + 32) * VEC, a1, b1, aa, ab, ss);
            accum2<WDT, TT, NORM>(xp, K, (v + 64) * VEC, a2, b2, aa, ab, ss);
            accum2<WDT, TT, NORM>(xp, K, (v + 96) * VEC, a3, b3, aa, ab, ss);
        }
        for (; v < nv; v += 32) accum2<WDT, TT, NORM>(xp, K, v * VEC, __ldg(wa + v), __ldg(wb + v), aa, ab, ss);
    } else {
        tbc_pdl_wait();
        const size_t ba = (size_t)ra * K, bb = (size_t)rbl * K;
        for (int k = lane; k < K; k += 32) {
            float wa = tbc_load(w, WDT, ba + k), wb = tbc_load(w, WDT, bb + k);
#pragma unroll
            for (int t = 0; t < TT; t++) {
                float xr = round_to_w<WDT>(x[(size_t)t * K + k]);
                aa[t] = fmaf(xr, wa, aa[t]);
                ab[t] = fmaf(xr, wb, ab[t]);
            }
        }
    }
    tbc_pdl_trigger();
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float f = NORM ? inv_rms(ss[t], K, e.norm_eps) : 1.0f;
        aa[t] = tbc_warp_sum(aa[t]) * f;
        ab[t] = tbc_warp_sum(ab[t]) * f;
    }
    if (lane == 0) {
        float bia = bias ? bias[ra] : 0.0f, bib = bias && okb ? bias[rb] : 0.0f;
#pragma unroll
        for (int t = 0; t < TT; t++) epi_store<MODE>(e, y, N, t, P, ra, rb, okb, aa[t] + bia, ab[t] + bib);
    }
}

/* ---------------------------------------------------------------- SIMT, rows
 * f16/bf16, 16-byte aligned, T <= 2: KS warps per row (1 or 2), RW warps
 * per block (RW / (2 KS) pairs); the warps of row ra of a pair, then those of
 * row rb, U 16-byte vectors per lane in flight (4, 2 or 1: the tactics are
 * timed at load, see tune_gemv in cuda_backend.c). The sums meet in shared
 * memory and lane 0 of the pair's first warp runs the epilogue. */
template <int WDT, int TT, bool NORM>
__device__ __forceinline__ void accum1(const float *__restrict__ x, int K, int k0, const uint4 &u, float *acc,
                                       float *ss) {
    float wf[8];
    unpack16<WDT>(u, wf);
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float xf[8];
        load_x<WDT, NORM>(x, (size_t)t * K + k0, xf, ss[t]);
        float s = acc[t];
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(xf[e], wf[e], s);
        acc[t] = s;
    }
}

template <int WDT, int TT, int MODE, int RW, bool NORM, int U, int KS>
__global__ void __launch_bounds__(RW * 32)
gemv_row_kernel(const float *__restrict__ x, const void *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ y, int K, int N, tbc_gemv_epi e, int rot_on) {
    /* KS warps per row: warp w is part w % KS of row-warp w / KS; the
     * parts take turns over the row in chunks of 32 U vectors */
    __shared__ float sums[RW][TT], ssum[RW][TT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % KS, rw = warp / KS, side = rw & 1;
    const int P = blockIdx.x * (RW / (2 * KS)) + (rw >> 1);
    const bool valid = P < pair_count<MODE>(e, N);
    int ra = 0, rb = 0;
    if (valid) pair_rows<MODE>(e, N, P, ra, rb);
    const bool okb = rb < N;
    const bool active = valid && (side == 0 || okb);
    const uint4 *wr = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(w) +
                                                      (size_t)(active && side ? rb : ra) * K);
    const int nv = K / 8;
    /* rot_on: pair P reads its rows from vector 32 ((97 P) mod (nv / 32))
     * on, wrapping (the warps of one wave then read different columns) */
    const int rot = rot_on && nv >= 32 ? (int)(((unsigned)P * 97u) % (unsigned)(nv / 32)) * 32 : 0;
    auto ph = [&](int v) { return v + rot < nv ? v + rot : v + rot - nv; };
    tbc_pdl_wait();
    const float *xp = x;
    float acc[TT], ss[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = ss[t] = 0.0f;
    if (active) {
        /* U vectors per lane in flight; the last round is predicated rather
         * than a loop of single loads (K = 11008 leaves 96 vectors over) */
        for (int v0 = part * 32 * U + lane; v0 < nv; v0 += 32 * U * KS) {
            uint4 u[U];
#pragma unroll
            for (int i = 0; i < U; i++) u[i] = v0 + 32 * i < nv ? __ldg(wr + ph(v0 + 32 * i)) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int i = 0; i < U; i++)
                if (v0 + 32 * i < nv) accum1<WDT, TT, NORM>(xp, K, ph(v0 + 32 * i) * 8, u[i], acc, ss);
        }
    }
    tbc_pdl_trigger();
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float sv = tbc_warp_sum(acc[t]), q = NORM ? tbc_warp_sum(ss[t]) : 0.0f;
        if (lane == 0) {
            sums[warp][t] = sv;
            ssum[warp][t] = q;
        }
    }
    __syncthreads();
    if (valid && side == 0 && part == 0 && lane == 0) {
        float bia = bias ? bias[ra] : 0.0f, bib = bias && okb ? bias[rb] : 0.0f;
#pragma unroll
        for (int t = 0; t < TT; t++) {
            float va = 0.0f, vb = 0.0f, q = 0.0f;
#pragma unroll
            for (int p = 0; p < KS; p++) {
                va += sums[warp + p][t];
                vb += sums[warp + KS + p][t];
                q += ssum[warp + p][t];
            }
            if (NORM) {
                /* the sums of x^2 of row ra's parts (each x once) */
                float f = rsqrtf(q / (float)K + e.norm_eps);
                va *= f;
                vb *= f;
            }
            epi_store<MODE>(e, y, N, t, P, ra, rb, okb, va + bia, vb + bib);
        }
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

/* 8 f32 of x (16-byte aligned) as 4 packed registers; with NORM their
 * squares are added to ss. */
template <int WDT, bool NORM = false>
__device__ __forceinline__ uint4 load_x8(const float *p, float &ss) {
    float4 a = __ldg(reinterpret_cast<const float4 *>(p)), b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    if (NORM) {
        ss = fmaf(a.x, a.x, ss); ss = fmaf(a.y, a.y, ss); ss = fmaf(a.z, a.z, ss); ss = fmaf(a.w, a.w, ss);
        ss = fmaf(b.x, b.x, ss); ss = fmaf(b.y, b.y, ss); ss = fmaf(b.z, b.z, ss); ss = fmaf(b.w, b.w, ss);
    }
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

/* The rows of thread group g in 16-row tile `tile` of a tensor-core GEMV:
 * PLAIN, rows 16 * tile + g and + 8; other epilogues, pair P = 8 * tile + g
 * is rows (ra, rb). Returns whether the pair exists (rows 0 when not). */
template <int MODE>
__device__ __forceinline__ bool mma_rows(const tbc_gemv_epi &e, int N, int g, int &ra, int &rb, int &P, int tile) {
    P = tile * 8 + g;
    if (MODE == TBC_EPI_PLAIN) {
        ra = tile * 16 + g;
        rb = ra + 8;
        return true;
    }
    if (P < pair_count<MODE>(e, N)) {
        pair_rows<MODE>(e, N, P, ra, rb);
        return true;
    }
    ra = rb = 0;
    return false;
}

/* The end of the tensor-core GEMVs: the warps' partial sums (c, and ss
 * with NORM) meet in shared memory, warp 0 adds them in a fixed order,
 * multiplies rows ra and rb by sa and sb (quantized rows' scales; 1
 * otherwise) and by 1 / rms(x), adds the bias and runs the epilogue.
 * ss_in: the squares go to red_ss (a second tile of the same block finds
 * them there already). KS > 1: the block is one of a cluster of KS that
 * split the tile's K; rank 0's warp 0 adds the other blocks' red and
 * red_ss (ranks in order) through distributed shared memory and stores,
 * every thread of the cluster at both cluster barriers (a producer warp
 * too: qgemv_tma_kernel's). */
template <int MODE, bool NORM, int KS = 1>
__device__ __forceinline__ void mma_finish(float (*red)[32][4], float (*red_ss)[8], float *c, float ss, int warp,
                                           int lane, int ra, int rb, int P, bool pair_ok, int T, int K, int N,
                                           const float *__restrict__ bias, float *__restrict__ y,
                                           const tbc_gemv_epi &e, float sa, float sb, bool ss_in = true) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][lane][i] = c[i];
    if (NORM && ss_in) {
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        if (t == 0) red_ss[warp][g] = ss;
    }
    __syncthreads();
    if (KS > 1) {
        tbc_cluster_arrive(); /* every block's red is written */
        tbc_cluster_wait();
        if (warp != 0 || tbc_cluster_rank() != 0) {
            tbc_cluster_arrive(); /* rank 0 has read it */
            tbc_cluster_wait();
            return;
        }
    }
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < GEMV_MMA_WARPS; k++) v += red[k][lane][i];
        c[i] = v;
    }
    const int t0 = 2 * t, t1 = 2 * t + 1;
    float rs0 = 0.0f, rs1 = 0.0f; /* the other blocks' squares (KS > 1) */
    if (KS > 1) {
        for (unsigned r = 1; r < (unsigned)KS; r++) {
            const float(*rr)[32][4] = tbc_cluster_map(red, r);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < GEMV_MMA_WARPS; k++) v += rr[k][lane][i];
                c[i] += v;
            }
            if (NORM) {
                const float(*rq)[8] = tbc_cluster_map(red_ss, r);
#pragma unroll
                for (int k = 0; k < GEMV_MMA_WARPS; k++) {
                    rs0 += rq[k][t0];
                    rs1 += rq[k][t1];
                }
            }
        }
        tbc_cluster_arrive();
        tbc_cluster_wait();
    }
    c[0] *= sa;
    c[1] *= sa;
    c[2] *= sb;
    c[3] *= sb;
    /* c0, c1: row ra, tokens 2t, 2t + 1; c2, c3: row rb */
    if (NORM) {
        float s0 = rs0, s1 = rs1;
#pragma unroll
        for (int k = 0; k < GEMV_MMA_WARPS; k++) {
            s0 += red_ss[k][t0];
            s1 += red_ss[k][t1];
        }
        float f0 = rsqrtf(s0 / (float)K + e.norm_eps), f1 = rsqrtf(s1 / (float)K + e.norm_eps);
        c[0] *= f0;
        c[1] *= f1;
        c[2] *= f0;
        c[3] *= f1;
    }
    if (MODE == TBC_EPI_PLAIN) {
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
    } else if (pair_ok) {
        float ba = bias ? bias[ra] : 0.0f, bb = bias && rb < N ? bias[rb] : 0.0f;
        if (t0 < T) epi_store<MODE>(e, y, N, t0, P, ra, rb, rb < N, c[0] + ba, c[2] + bb);
        if (t1 < T) epi_store<MODE>(e, y, N, t1, P, ra, rb, rb < N, c[1] + ba, c[3] + bb);
    }
}

/* NORM: the inline RMSNorm (each thread sums the squares of the x it
 * loads for its token g; quads and then warps add them up). Measured no
 * faster on the 7B step (H100, docs/GPU.md "The f16 tensor-core GEMV's
 * loop"): 2 or 4 tiles a block sharing x, 16 warps a block, 8 steps of
 * loads, x without the branch, and the loads forced ahead of the mmas. */
template <int WDT, int MODE, bool NORM>
__global__ void __launch_bounds__(GEMV_MMA_WARPS * 32)
gemv_mma_kernel(const float *__restrict__ x, const void *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ y, int T, int K, int N, tbc_gemv_epi e, int rot_on) {
    __shared__ float red[GEMV_MMA_WARPS][32][4];
    __shared__ float red_ss[GEMV_MMA_WARPS][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* PLAIN: the block's 16 rows are r0 .. r0 + 15 (rows g and g + 8 per
     * thread); other epilogues: pair P = 8 * block + g is rows (ra, rb) */
    int ra, rb, P;
    const bool pair_ok = mma_rows<MODE>(e, N, g, ra, rb, P, blockIdx.x);
    const uint16_t *wbase = static_cast<const uint16_t *>(w);
    /* rows past N are read from row N - 1 and never written */
    const uint4 *pa = reinterpret_cast<const uint4 *>(wbase + (size_t)min(ra, N - 1) * K) + t;
    const uint4 *pb = reinterpret_cast<const uint4 *>(wbase + (size_t)min(rb, N - 1) * K) + t;
    const int steps = K / 32;
    /* rot_on: block b reads its rows from step (97 b) mod steps on,
     * wrapping (the blocks of one wave then read different columns) */
    const int rot = rot_on ? (int)(((unsigned)blockIdx.x * 97u) % (unsigned)steps) : 0;
    auto ph = [&](int q) { return q + rot < steps ? q + rot : q + rot - steps; };
    if (warp < 4) {
        tbc_prefetch_l2(pa + (size_t)ph(warp) * 4);
        tbc_prefetch_l2(pb + (size_t)ph(warp) * 4);
    }
    tbc_pdl_wait();
    const bool has_x = g < T;
    const float *px = x + (size_t)(has_x ? g : 0) * K + t * 8;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float ss = 0.0f;
    int s = warp;
    for (; s + 3 * GEMV_MMA_WARPS < steps; s += 4 * GEMV_MMA_WARPS) {
        uint4 a0 = __ldg(pa + (size_t)ph(s) * 4), b0 = __ldg(pb + (size_t)ph(s) * 4);
        uint4 a1 = __ldg(pa + (size_t)ph(s + GEMV_MMA_WARPS) * 4), b1 = __ldg(pb + (size_t)ph(s + GEMV_MMA_WARPS) * 4);
        uint4 a2 = __ldg(pa + (size_t)ph(s + 2 * GEMV_MMA_WARPS) * 4),
              b2 = __ldg(pb + (size_t)ph(s + 2 * GEMV_MMA_WARPS) * 4);
        uint4 a3 = __ldg(pa + (size_t)ph(s + 3 * GEMV_MMA_WARPS) * 4),
              b3 = __ldg(pb + (size_t)ph(s + 3 * GEMV_MMA_WARPS) * 4);
        uint4 x0 = has_x ? load_x8<WDT, NORM>(px + (size_t)ph(s) * 32, ss) : zero;
        uint4 x1 = has_x ? load_x8<WDT, NORM>(px + (size_t)ph(s + GEMV_MMA_WARPS) * 32, ss) : zero;
        uint4 x2 = has_x ? load_x8<WDT, NORM>(px + (size_t)ph(s + 2 * GEMV_MMA_WARPS) * 32, ss) : zero;
        uint4 x3 = has_x ? load_x8<WDT, NORM>(px + (size_t)ph(s + 3 * GEMV_MMA_WARPS) * 32, ss) : zero;
        mma_step<WDT>(c, a0, b0, x0);
        mma_step<WDT>(c, a1, b1, x1);
        mma_step<WDT>(c, a2, b2, x2);
        mma_step<WDT>(c, a3, b3, x3);
    }
    for (; s < steps; s += GEMV_MMA_WARPS) {
        uint4 a0 = __ldg(pa + (size_t)ph(s) * 4), b0 = __ldg(pb + (size_t)ph(s) * 4);
        uint4 x0 = has_x ? load_x8<WDT, NORM>(px + (size_t)ph(s) * 32, ss) : zero;
        mma_step<WDT>(c, a0, b0, x0);
    }
    tbc_pdl_trigger();
    mma_finish<MODE, NORM>(red, red_ss, c, ss, warp, lane, ra, rb, P, pair_ok, T, K, N, bias, y, e, 1.0f, 1.0f);
}

/* ---------------------------------------------------------------- f16 / bf16, bulk-copy ring
 * The tensor-core GEMV of gemv_mma_kernel (16-row tiles, the same fragment
 * order and epilogues), but the weights reach shared memory by the copy
 * engine (sm_90 cp.async.bulk): a producer warp copies stages of 16 rows x
 * TMA_CHB bytes (512 values a row) into a ring of NS slots, one bulk
 * copy a row, completion counted in bytes on the slot's "full" mbarrier;
 * the 8 consumer warps take turns over a stage's 16 steps of 32 values and
 * each arrives on the slot's "empty" mbarrier, which the producer waits for
 * before it refills the slot. The first NS stages are issued before the
 * PDL wait (the weights do not depend on the previous kernel). Rows sit
 * TMA_CHB + 64 bytes apart in a slot, so a quarter-warp's 16-byte reads of
 * rows g, g + 1 fall on different banks. Stages are taken from (97 block)
 * mod stages on, wrapping, as the rotated starts of gemv_mma_kernel. */
#define TMA_CHB 1024
#define TMA_RS (TMA_CHB + 64)
#define TMA_NS 4       /* slots of the ring (the kernel's NS) */
#define TMA_NS_SMALL 2 /* TB_CUDA_GEMV_TMA bit 3: rows of K < 8192 */
static_assert(TMA_CHB / 64 == 2 * GEMV_MMA_WARPS, "a stage is two steps a consumer warp");
__device__ __forceinline__ uint32_t tma_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void tma_fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_mbar_init(uint64_t *b, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(tma_smem(b)), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void tma_mbar_expect(uint64_t *b, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(tma_smem(b)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void tma_mbar_arrive(uint64_t *b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tma_smem(b)) : "memory");
#endif
}
__device__ __forceinline__ void tma_mbar_wait(uint64_t *b, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "TMA_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra TMA_WAIT_%=;\n"
                 "}\n" ::"r"(tma_smem(b)),
                 "r"(parity)
                 : "memory");
#endif
}
__device__ __forceinline__ void tma_copy(void *dst, const void *src, unsigned bytes, uint64_t *b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     tma_smem(dst)),
                 "l"(src), "r"(bytes), "r"(tma_smem(b))
                 : "memory");
#endif
}

/* The ring's barriers, by thread 0: "full" completes on the producer's
 * arrival and the stage's bytes, "empty" on each consumer warp's. */
template <int NS>
__device__ __forceinline__ void tma_ring_init(uint64_t *full, uint64_t *empty) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < NS; i++) {
            tma_mbar_init(&full[i], 1);
            tma_mbar_init(&empty[i], GEMV_MMA_WARPS);
        }
        tma_fence_init();
    }
}
/* The producer warp of the bulk-copy rings: lane r < 16 copies slot row r
 * (rows ra / rb of thread group r & 7 of tile `tile`, as the consumers'
 * mma_rows; rows past N read row N - 1) for stages q = 0 .. nst - 1, TMA_CHB
 * bytes of each row from stage pst(q), after the slot's "empty" completed. */
template <int MODE, int NS, class PST>
__device__ __forceinline__ void tma_produce(const tbc_gemv_epi &e, int N, const void *w, size_t row_bytes, int nst,
                                            PST pst, char *ring, uint64_t *full, uint64_t *empty, int lane, int tile) {
    int ra, rb, P;
    mma_rows<MODE>(e, N, lane & 7, ra, rb, P, tile);
    const int row = min(lane < 8 ? ra : rb, N - 1);
    const char *src = static_cast<const char *>(w) + (size_t)row * row_bytes;
    for (int q = 0; q < nst; q++) {
        const int slot = q % NS;
        if (q >= NS) tma_mbar_wait(&empty[slot], (unsigned)((q / NS - 1) & 1));
        const int ps = pst(q);
        const unsigned bytes = (unsigned)min((size_t)TMA_CHB, row_bytes - (size_t)ps * TMA_CHB);
        if (lane == 0) tma_mbar_expect(&full[slot], bytes * 16u);
        __syncwarp();
        if (lane < 16) tma_copy(ring + ((size_t)slot * 16 + lane) * TMA_RS, src + (size_t)ps * TMA_CHB, bytes, &full[slot]);
    }
}

template <int WDT, int MODE, bool NORM, int NS>
__global__ void __launch_bounds__((GEMV_MMA_WARPS + 1) * 32)
gemv_tma_kernel(const float *__restrict__ x, const void *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ y, int T, int K, int N, tbc_gemv_epi e) {
    __shared__ float red[GEMV_MMA_WARPS][32][4];
    __shared__ float red_ss[GEMV_MMA_WARPS][8];
    __shared__ __align__(8) uint64_t full[NS], empty[NS];
    extern __shared__ uint4 tma_dyn[]; /* [NS slots][16 rows][TMA_RS bytes] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const size_t row_bytes = (size_t)K * 2;
    const int nst = (int)((row_bytes + TMA_CHB - 1) / TMA_CHB);
    const int rot = (int)(((unsigned)blockIdx.x * 97u) % (unsigned)nst);
    auto pst = [&](int q) { return q + rot < nst ? q + rot : q + rot - nst; };
    char *ring = reinterpret_cast<char *>(tma_dyn);
    tma_ring_init<NS>(full, empty);
    __syncthreads();
    if (warp == GEMV_MMA_WARPS) {
        tma_produce<MODE, NS>(e, N, w, row_bytes, nst, pst, ring, full, empty, lane, blockIdx.x);
        __syncthreads(); /* mma_finish's */
        return;
    }
    int ra, rb, P;
    const bool pair_ok = mma_rows<MODE>(e, N, g, ra, rb, P, blockIdx.x);
    tbc_pdl_wait();
    const bool has_x = g < T;
    const float *px = x + (size_t)(has_x ? g : 0) * K + t * 8;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float ss = 0.0f;
    for (int q = 0; q < nst; q++) {
        const int slot = q % NS, ps = pst(q);
        const int nsteps = (int)(min((size_t)TMA_CHB, row_bytes - (size_t)ps * TMA_CHB) / 64);
        /* x of the warp's two steps (warp, warp + 8) before the wait */
        const float *pxs = px + (size_t)ps * (TMA_CHB / 2);
        const int j0 = warp, j1 = warp + GEMV_MMA_WARPS;
        const uint4 x0 = has_x && j0 < nsteps ? load_x8<WDT, NORM>(pxs + (size_t)j0 * 32, ss) : zero;
        const uint4 x1 = has_x && j1 < nsteps ? load_x8<WDT, NORM>(pxs + (size_t)j1 * 32, ss) : zero;
        tma_mbar_wait(&full[slot], (unsigned)((q / NS) & 1));
        const char *sa = ring + ((size_t)slot * 16 + g) * TMA_RS + t * 16;
        const char *sb = sa + (size_t)8 * TMA_RS;
        if (j1 < nsteps) {
            const uint4 a0 = *reinterpret_cast<const uint4 *>(sa + j0 * 64);
            const uint4 b0 = *reinterpret_cast<const uint4 *>(sb + j0 * 64);
            const uint4 a1 = *reinterpret_cast<const uint4 *>(sa + j1 * 64);
            const uint4 b1 = *reinterpret_cast<const uint4 *>(sb + j1 * 64);
            mma_step<WDT>(c, a0, b0, x0);
            mma_step<WDT>(c, a1, b1, x1);
        } else if (j0 < nsteps) {
            const uint4 a0 = *reinterpret_cast<const uint4 *>(sa + j0 * 64);
            const uint4 b0 = *reinterpret_cast<const uint4 *>(sb + j0 * 64);
            mma_step<WDT>(c, a0, b0, x0);
        }
        __syncwarp();
        if (lane == 0) tma_mbar_arrive(&empty[slot]);
    }
    tbc_pdl_trigger();
    mma_finish<MODE, NORM>(red, red_ss, c, ss, warp, lane, ra, rb, P, pair_ok, T, K, N, bias, y, e, 1.0f, 1.0f);
}

/* ---------------------------------------------------------------- quantized weights
 * qmatmul (core/quant.h encodings) on the tensor cores at every T <= 8: the
 * block layout of gemv_mma_kernel (16 rows, GEMV_MMA_WARPS warps taking
 * turns over K), but each thread's 16-byte load of a row holds 16 codes
 * (int8, e4m3) or 32 (int4), so a quad covers 64 or 128 values of K per
 * step and feeds 4 or 8 mmas. The codes are widened to f16 in registers:
 *   int8  byte b -> f16(1024 + (b ^ 0x80)) - 1152 = b exactly (byte_perm
 *         puts the byte under the exponent of 1024), pairs (e0,e1),(e2,e3)
 *   e4m3  the hardware's e4m3x2 -> f16x2 conversion (exact), same pairs
 *   int4  nibble u -> f16(1024 + (u ^ 8)) - 1032 = the signed code, pairs
 *         (e0,e4),(e1,e5),(e2,e6),(e3,e7) of a 32-bit word (one mask
 *         takes nibble 0 and nibble 4 at once); then code * scale (+ zero)
 *         in f16 (each thread's 32 codes lie in one group: G >= 32)
 * x is paired the same way, so the k slots of A and B still match without
 * shuffles. int8 and e4m3 sums are of the raw codes; the row's scale
 * multiplies the f32 result. */
/* The f16x2 of x pairs matching the codes of one step: VPL floats of x from
 * p (16-byte aligned); with G (norm weight) multiplied in; ss += x^2. */
template <int QT, bool NORM>
__device__ __forceinline__ void load_xq(const float *__restrict__ p, const float *__restrict__ gw, uint32_t *xb,
                                        float &ss) {
    constexpr int VPL = QT == QT_I4 ? 32 : 16;
    float f[VPL];
#pragma unroll
    for (int q = 0; q < VPL / 4; q++) {
        float4 a = __ldg(reinterpret_cast<const float4 *>(p) + q);
        f[4 * q] = a.x; f[4 * q + 1] = a.y; f[4 * q + 2] = a.z; f[4 * q + 3] = a.w;
    }
    if (NORM) {
#pragma unroll
        for (int q = 0; q < VPL; q++) ss = fmaf(f[q], f[q], ss);
        if (gw) {
#pragma unroll
            for (int q = 0; q < VPL / 4; q++) {
                float4 gv = __ldg(reinterpret_cast<const float4 *>(gw) + q);
                f[4 * q] *= gv.x; f[4 * q + 1] *= gv.y; f[4 * q + 2] *= gv.z; f[4 * q + 3] *= gv.w;
            }
        }
    }
    if (QT == QT_I4) {
        /* word j holds x[8j .. 8j+7]: pairs (0,4), (1,5), (2,6), (3,7) */
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) xb[4 * j + i] = h2u(__floats2half2_rn(f[8 * j + i], f[8 * j + i + 4]));
    } else {
#pragma unroll
        for (int q = 0; q < VPL / 2; q++) xb[q] = h2u(__floats2half2_rn(f[2 * q], f[2 * q + 1]));
    }
}

/* One step of a thread: 16 bytes of rows ra (ua) and rb (ub) times x
 * (int4, RAW: the codes without scale and zero), the mmas alternating
 * between accumulators c0 and c1 (two halve the chain of dependent mmas a
 * step waits on; c0 == c1 accumulates them all in order). */
template <int QT, bool RAW = false, bool LOP = true>
__device__ __forceinline__ void qmma_step(float *c0, float *c1, const uint4 &ua, const uint4 &ub, const uint32_t *xb,
                                          __half2 sa, __half2 za, __half2 sb, __half2 zb) {
    const uint32_t wa[4] = {ua.x, ua.y, ua.z, ua.w}, wb[4] = {ub.x, ub.y, ub.z, ub.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (QT == QT_I4) {
            uint32_t ha[4], hb[4];
            widen_word4<RAW, LOP>(wa[j], sa, za, ha);
            widen_word4<RAW, LOP>(wb[j], sb, zb, hb);
            mma16816<TBC_F16>(c0, ha[0], hb[0], ha[1], hb[1], xb[4 * j], xb[4 * j + 1]);
            mma16816<TBC_F16>(c1, ha[2], hb[2], ha[3], hb[3], xb[4 * j + 2], xb[4 * j + 3]);
        } else {
            uint32_t a0, a1, b0, b1;
            widen_word8<QT>(wa[j], a0, a1);
            widen_word8<QT>(wb[j], b0, b1);
            mma16816<TBC_F16>(j & 1 ? c1 : c0, a0, b0, a1, b1, xb[2 * j], xb[2 * j + 1]);
        }
    }
}

/* The scale and zero of row r for the group of element k, as f16x2 (int4). */
__device__ __forceinline__ void group_sz(const tbc_qweight &w, int r, int K, int k, __half2 &s, __half2 &z) {
    const int ng = K / w.group;
    const size_t i = (size_t)r * ng + (size_t)(k / w.group);
    s = __float2half2_rn(__ldg(w.scales + i));
    z = w.zeros ? __float2half2_rn(__ldg(w.zeros + i)) : __float2half2_rn(0.0f);
}

/* U steps of a warp have their weight loads (and int4 scales) in flight
 * before the first is multiplied; each warp takes a contiguous range of
 * steps, so a row's U steps are U * 64 contiguous bytes. GS (int4 with
 * groups of a multiple of 128, no zeros): a step is one group of every
 * row, so its mmas run on the raw codes and the f32 sums are scaled per
 * step (no f16 product with the scale). MINB: blocks an SM must hold (the
 * register budget). PRE: the first U steps' weights are loaded before the
 * kernel waits for the previous one (they do not depend on it), so their
 * latency overlaps that kernel's end. RT: 16-row tiles a block computes
 * (each thread holds 2 * RT rows), sharing each step's x. */
template <int QT, int MODE, bool NORM, int U, bool GS, int MINB, bool PRE, int RT>
__global__ void __launch_bounds__(GEMV_MMA_WARPS * 32, MINB)
qgemv_mma_kernel(const float *__restrict__ x, tbc_qweight w, const float *__restrict__ bias, float *__restrict__ y,
                 int T, int K, int N, tbc_gemv_epi e) {
    constexpr int VPL = QT == QT_I4 ? 32 : 16; /* values per 16-byte load */
    constexpr int KSTEP = 4 * VPL;             /* values of K per step (a quad) */
    __shared__ float red[RT][GEMV_MMA_WARPS][32][4];
    __shared__ float red_ss[GEMV_MMA_WARPS][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* the block's RT tiles of 16 rows (8 pairs): per tile, this thread's rows
     * ra, rb (read from row N - 1 when past N, never written) */
    int ra[RT], rb[RT], P[RT], rla[RT], rlb[RT];
    bool pair_ok[RT];
    const size_t row_bytes = QT == QT_I4 ? (size_t)K / 2 : (size_t)K;
    const char *cb = static_cast<const char *>(w.codes);
    const uint4 *pa[RT], *pb[RT];
#pragma unroll
    for (int r = 0; r < RT; r++) {
        pair_ok[r] = mma_rows<MODE>(e, N, g, ra[r], rb[r], P[r], blockIdx.x * RT + r);
        rla[r] = min(ra[r], N - 1);
        rlb[r] = min(rb[r], N - 1);
        pa[r] = reinterpret_cast<const uint4 *>(cb + (size_t)rla[r] * row_bytes) + t;
        pb[r] = reinterpret_cast<const uint4 *>(cb + (size_t)rlb[r] * row_bytes) + t;
    }
    /* the warp's steps s0 + j, j = 0 .. nj - 1: a contiguous range (a warp
     * that took turns with the others over the steps measured no faster) */
    const int steps = K / KSTEP, per = (steps + GEMV_MMA_WARPS - 1) / GEMV_MMA_WARPS;
    const int s0 = warp * per, nj = max(0, min(steps, s0 + per) - s0);
    if (!PRE && nj > 0) {
#pragma unroll
        for (int r = 0; r < RT; r++) {
            tbc_prefetch_l2(pa[r] + (size_t)s0 * 4);
            tbc_prefetch_l2(pb[r] + (size_t)s0 * 4);
        }
    }
    if (!PRE) tbc_pdl_wait();
    const bool has_x = g < T;
    const float *px = x + (size_t)(has_x ? g : 0) * K + t * VPL;
    const float *gw = NORM && e.norm_w ? e.norm_w + t * VPL : nullptr;
    const int ng = QT == QT_I4 ? K / w.group : 1;
    float c[RT][4];
#pragma unroll
    for (int r = 0; r < RT; r++) c[r][0] = c[r][1] = c[r][2] = c[r][3] = 0.0f;
    float ss = 0.0f;
    const __half2 one2 = __float2half2_rn(1.0f), zero2 = __float2half2_rn(0.0f);
    /* the loads of U steps (weights, int4 scales and zeros) from step sb */
    uint4 ua[U][RT], ub[U][RT];
    float fsa[U][RT], fsb[U][RT], fza[U][RT], fzb[U][RT];
    auto load = [&](int sb) {
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int st = s0 + (sb + i < nj ? sb + i : sb);
            const size_t o = (size_t)st * 4;
#pragma unroll
            for (int r = 0; r < RT; r++) {
                ua[i][r] = __ldg(pa[r] + o);
                ub[i][r] = __ldg(pb[r] + o);
                if (QT == QT_I4) {
                    const size_t gi = (size_t)(st * KSTEP + t * VPL) / w.group;
                    fsa[i][r] = __ldg(w.scales + (size_t)rla[r] * ng + gi);
                    fsb[i][r] = __ldg(w.scales + (size_t)rlb[r] * ng + gi);
                    fza[i][r] = w.zeros ? __ldg(w.zeros + (size_t)rla[r] * ng + gi) : 0.0f;
                    fzb[i][r] = w.zeros ? __ldg(w.zeros + (size_t)rlb[r] * ng + gi) : 0.0f;
                }
            }
        }
    };
    auto compute = [&](int sb) {
#pragma unroll
        for (int i = 0; i < U; i++) {
            if (sb + i >= nj) break;
            const int st = s0 + sb + i;
            /* x once per step, shared by the RT tiles */
            uint32_t xb[VPL / 2];
            if (has_x) {
                load_xq<QT, NORM>(px + (size_t)st * KSTEP, gw ? gw + (size_t)st * KSTEP : nullptr, xb, ss);
            } else {
#pragma unroll
                for (int q = 0; q < VPL / 2; q++) xb[q] = 0u;
            }
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (GS) {
                    float ct[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    qmma_step<QT, true, false>(ct, ct, ua[i][r], ub[i][r], xb, one2, zero2, one2, zero2);
                    c[r][0] = fmaf(ct[0], fsa[i][r], c[r][0]);
                    c[r][1] = fmaf(ct[1], fsa[i][r], c[r][1]);
                    c[r][2] = fmaf(ct[2], fsb[i][r], c[r][2]);
                    c[r][3] = fmaf(ct[3], fsb[i][r], c[r][3]);
                } else if (QT == QT_I4) {
                    qmma_step<QT, false, false>(c[r], c[r], ua[i][r], ub[i][r], xb, __float2half2_rn(fsa[i][r]),
                                  __float2half2_rn(fza[i][r]), __float2half2_rn(fsb[i][r]),
                                  __float2half2_rn(fzb[i][r]));
                } else {
                    qmma_step<QT, true>(c[r], c[r], ua[i][r], ub[i][r], xb, one2, zero2, one2, zero2);
                }
            }
        }
    };
    if (PRE) {
        if (nj > 0) load(0);
        tbc_pdl_wait();
    }
    for (int sb = 0; sb < nj; sb += U) {
        if (!PRE || sb > 0) load(sb);
        compute(sb);
    }
    tbc_pdl_trigger();
#pragma unroll
    for (int r = 0; r < RT; r++) {
        const float fa = QT == QT_I4 ? 1.0f : __ldg(w.scales + rla[r]);
        const float fb = QT == QT_I4 ? 1.0f : __ldg(w.scales + rlb[r]);
        mma_finish<MODE, NORM>(red[r], red_ss, c[r], ss, warp, lane, ra[r], rb[r], P[r], pair_ok[r], T, K, N, bias,
                               y, e, fa, fb, r == 0);
    }
}


/* ---------------------------------------------------------------- quantized, pipelined
 * Decode steps (T = 1..8) of int8 / e4m3 / int4 weights. The tensor-core
 * layout of qgemv_mma_kernel (16-row tiles, 8 warps splitting K, a thread's
 * 16-byte loads of rows g and g + 8), but the weights go through a ring of
 * NS steps per warp in shared memory filled by cp.async: NS - 1 steps of
 * every warp are in flight without holding registers, and the first ones
 * are issued before the kernel waits for the previous one (the weights do
 * not depend on it). Each thread reads back only the codes it copied, so the
 * ring needs no barrier (int4 with a group a step: a __syncwarp a step, the
 * quad's scale copied once); a slot is refilled one step after it was read.
 * x (T tokens, times the norm weight) is converted to f16 pairs in the
 * mma's k order once per block into shared memory (qpipe_xstride); lanes
 * of tokens >= T take token T - 1's fragment: those columns of the product
 * are discarded, so their slots need not be zero. int4 scales (and zeros)
 * go through the ring with their codes. */
__device__ __forceinline__ uint32_t qp_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void qp_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(qp_smem(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void qp_cp4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(qp_smem(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void qp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void qp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* x in shared memory, 16-byte units of 8 values (f16 pairs in the mma's k
 * order): int8 / e4m3 a token's K / 8 in order (a quad's 4 lanes read 4
 * units 32 bytes apart: 4 banks each, none shared). int4 lanes read 4 units
 * each, unit m = 16 st + 4 t + q of step st, so in order the quad's loads
 * of one q would be 64 bytes apart, two to a bank: unit m is stored at
 * 16 st + 4 q + t (the quad's 4 units of one q side by side), and a token
 * takes K / 8 + 4 units, so tokens g and g + 1 (in one phase of a 16-byte
 * load) lie in different halves of the 32 banks. */
template <int QT>
__host__ __device__ __forceinline__ int qpipe_xstride(int K) {
    return QT == QT_I4 ? K / 8 + 4 : K / 8;
}
template <int QT>
__device__ __forceinline__ int qpipe_xpos(int m) {
    return QT == QT_I4 ? (m & ~15) | ((m & 3) << 2) | ((m >> 2) & 3) : m;
}

/* One 16-byte unit of the staged x: the 8 values a, b (unit m of token tk)
 * as f16 pairs in the mma's k order (int4 (i, i + 4), else (2i, 2i + 1));
 * with NORM their squares are added to ssr[tk], then they are multiplied by
 * the norm weight's unit m (norm_w, if any). qgemv_tma_kernel's; the
 * pipelined kernel keeps the same code inline (with this helper ptxas gave
 * its cluster forms other register counts, on a kernel whose speed has
 * moved 12-17% with code layout alone: not changed unmeasured). */
template <int QT, bool NORM>
__device__ __forceinline__ uint4 qx_unit(const float4 &a, const float4 &b, const float *__restrict__ norm_w, int m,
                                         int tk, float *ssr) {
    float f0 = a.x, f1 = a.y, f2 = a.z, f3 = a.w;
    float f4 = b.x, f5 = b.y, f6 = b.z, f7 = b.w;
    if (NORM) {
        float ss = f0 * f0;
        ss = fmaf(f1, f1, ss); ss = fmaf(f2, f2, ss); ss = fmaf(f3, f3, ss);
        ss = fmaf(f4, f4, ss); ss = fmaf(f5, f5, ss); ss = fmaf(f6, f6, ss); ss = fmaf(f7, f7, ss);
#pragma unroll
        for (int k = 0; k < TBC_GEMV_MAX_T; k++)
            if (k == tk) ssr[k] += ss;
        if (norm_w) {
            const float4 ga = __ldg(reinterpret_cast<const float4 *>(norm_w) + 2 * m);
            const float4 gb = __ldg(reinterpret_cast<const float4 *>(norm_w) + 2 * m + 1);
            f0 *= ga.x; f1 *= ga.y; f2 *= ga.z; f3 *= ga.w;
            f4 *= gb.x; f5 *= gb.y; f6 *= gb.z; f7 *= gb.w;
        }
    }
    uint4 o;
    if (QT == QT_I4) {
        o.x = h2u(__floats2half2_rn(f0, f4));
        o.y = h2u(__floats2half2_rn(f1, f5));
        o.z = h2u(__floats2half2_rn(f2, f6));
        o.w = h2u(__floats2half2_rn(f3, f7));
    } else {
        o.x = h2u(__floats2half2_rn(f0, f1));
        o.y = h2u(__floats2half2_rn(f2, f3));
        o.z = h2u(__floats2half2_rn(f4, f5));
        o.w = h2u(__floats2half2_rn(f6, f7));
    }
    return o;
}

/* Floats a ring slot of int4 scales takes: a group a step (GS) 8 rows a and
 * 8 rows b, else scale a, scale b, zero a, zero b for each of 32 lanes. */
template <int QT, bool GS>
__host__ __device__ constexpr int qpipe_scr() {
    return QT != QT_I4 ? 0 : GS ? 16 : 128;
}

/* Shared memory of qgemv_pipe_kernel beyond its static arrays: the rings
 * (codes; int4 also scales and zeros) and x in f16. */
template <int QT, bool GS, int NS, int RT>
static size_t qpipe_smem(int T, int K) {
    size_t ring = (size_t)GEMV_MMA_WARPS * NS * RT * 64 * 16;
    size_t scr = (size_t)GEMV_MMA_WARPS * NS * RT * qpipe_scr<QT, GS>() * 4;
    return ring + scr + (size_t)T * qpipe_xstride<QT>(K) * 16;
}

/* The block takes block tiles (RT 16-row tiles each) blockIdx.x,
 * blockIdx.x + gridDim.x, ...: a grid of one block per block tile runs one
 * each; a smaller (persistent) grid runs several, x staged once and each
 * warp's ring running on from one tile's steps into the next's. */
template <int QT, int MODE, bool NORM, bool GS, int NS, int RT, int MINB, int CL>
__global__ void __launch_bounds__(GEMV_MMA_WARPS * 32, MINB)
qgemv_pipe_kernel(const float *__restrict__ x, tbc_qweight w, const float *__restrict__ bias, float *__restrict__ y,
                  int T, int K, int N, int tiles, tbc_gemv_epi e, int xw) {
    constexpr int VPL = QT == QT_I4 ? 32 : 16; /* values per 16-byte load */
    constexpr int KSTEP = 4 * VPL;
    constexpr int NW = GEMV_MMA_WARPS;
    static_assert(NS >= 2, "the ring needs two slots");
    __shared__ float red[2][RT][NW][32][4]; /* by tile parity: warp 0 may still read the last tile's */
    __shared__ float red_ss[NW][8];
    __shared__ float wss[NW][8]; /* each warp's sum of squares per token */
    __shared__ float wss_o[CL > 1 ? NW : 1][8]; /* CL 2: the other block's warps' */
    extern __shared__ uint4 qp_dyn[];
    if (CL > 1) tbc_cluster_arrive_relaxed(); /* "started": waited for before the first store into the other block */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* this warp's ring: [NS][RT][2 rows][32 lanes] of 16 bytes; int4:
     * [NS][RT][scale a, scale b, zero a, zero b][32 lanes] floats, or with
     * GS (a step in one group) [NS][RT][scale a, scale b][8 row pairs g],
     * copied by the quad's lane t = 0: a 4-byte cp.async costs a
     * shared-memory wavefront a lane, and all 32 lanes copying them made
     * half the kernel's shared-memory traffic (the smaller slots also let
     * 8 tokens of K 11008 fit beside a one-tile ring) */
    constexpr int SCR = qpipe_scr<QT, GS>();
    uint4 *ring = qp_dyn + (size_t)warp * NS * RT * 64;
    float *scr = reinterpret_cast<float *>(qp_dyn + (size_t)NW * NS * RT * 64) + (size_t)warp * NS * RT * SCR;
    uint4 *xs = reinterpret_cast<uint4 *>(reinterpret_cast<float *>(qp_dyn + (size_t)NW * NS * RT * 64) +
                                          (size_t)NW * NS * RT * SCR);
    const size_t row_bytes = QT == QT_I4 ? (size_t)K / 2 : (size_t)K;
    const char *cb = static_cast<const char *>(w.codes);
    const int nbt_all = (tiles + RT - 1) / RT;
    const int nbt = (nbt_all - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const int steps = K / KSTEP, per = (steps + NW - 1) / NW;
    const int s0 = warp * per, nj = max(0, min(steps, s0 + per) - s0);
    const int ng = QT == QT_I4 ? K / w.group : 1;
    /* the issue cursor: block tile ci, step cj, ring slot cs */
    int ci = 0, cj = 0, cs = 0;
    int qla[RT], qlb[RT];
    /* int4 with a group a step: the rows' code and scale pointers at step 0
     * (fewer integer ops a step than from the row numbers; int8 / e4m3 keep
     * the row numbers: the pointers' registers cost them 4% alone) */
    const char *pca[RT], *pcb[RT];
    const float *psa[RT], *psb[RT];
    auto set_rows = [&](int i) {
#pragma unroll
        for (int r = 0; r < RT; r++) {
            int a, b, pp;
            mma_rows<MODE>(e, N, g, a, b, pp, ((int)blockIdx.x + i * (int)gridDim.x) * RT + r);
            qla[r] = min(a, N - 1);
            qlb[r] = min(b, N - 1);
            if (QT == QT_I4 && GS) {
                pca[r] = cb + (size_t)qla[r] * row_bytes + (size_t)t * 16;
                pcb[r] = cb + (size_t)qlb[r] * row_bytes + (size_t)t * 16;
                psa[r] = w.scales + (size_t)qla[r] * ng;
                psb[r] = w.scales + (size_t)qlb[r] * ng;
            }
        }
    };
    set_rows(0);
    /* GS: a step lies in one group, that of step st being st / spg */
    const int spg = GS ? w.group / KSTEP : 1;
    auto issue_next = [&]() {
        if (ci >= nbt || nj == 0) return;
        const int st = s0 + cj;
        const size_t o = (size_t)st * 64 + (size_t)t * 16; /* byte offset in the row */
#pragma unroll
        for (int r = 0; r < RT; r++) {
            uint4 *d = ring + (size_t)(cs * RT + r) * 64;
            if (QT == QT_I4 && GS) {
                qp_cp16(d + lane, pca[r] + (size_t)st * 64);
                qp_cp16(d + 32 + lane, pcb[r] + (size_t)st * 64);
            } else {
                qp_cp16(d + lane, cb + (size_t)qla[r] * row_bytes + o);
                qp_cp16(d + 32 + lane, cb + (size_t)qlb[r] * row_bytes + o);
            }
            if (QT == QT_I4) {
                float *f = scr + (size_t)(cs * RT + r) * SCR;
                if (GS) {
                    const int gi = spg == 1 ? st : st / spg;
                    if (t == 0) {
                        qp_cp4(f + g, psa[r] + gi);
                        qp_cp4(f + 8 + g, psb[r] + gi);
                    }
                } else {
                    const size_t gi = (size_t)(st * KSTEP + t * VPL) / w.group;
                    qp_cp4(f + lane, w.scales + (size_t)qla[r] * ng + gi);
                    qp_cp4(f + 32 + lane, w.scales + (size_t)qlb[r] * ng + gi);
                    if (w.zeros) {
                        qp_cp4(f + 64 + lane, w.zeros + (size_t)qla[r] * ng + gi);
                        qp_cp4(f + 96 + lane, w.zeros + (size_t)qlb[r] * ng + gi);
                    }
                }
            }
        }
        cs = cs + 1 == NS ? 0 : cs + 1;
        if (++cj == nj) {
            cj = 0;
            if (++ci < nbt) set_rows(ci);
        }
    };
    /* NS - 1 steps in flight before the wait for the previous kernel */
#pragma unroll
    for (int j = 0; j < NS - 1; j++) {
        issue_next();
        qp_commit();
    }
    tbc_pdl_wait();
    /* x (T tokens) in f16 pairs, the k order of load_xq: int8 / e4m3 pairs
     * (2i, 2i + 1), int4 (i, i + 4) within each 8 values; token k's at
     * xs + k * qpipe_xstride(K), placed by qpipe_xpos. The T * K / 8 units
     * of all tokens are taken 4 a thread at a time, their loads issued
     * before the first is used (a loop over tokens with one unit a thread
     * in flight waited out the load's latency T * K / 2048 times; on the
     * H200 the 8-token int8 GEMVs of a 7B layer alone went 139 -> 124 us,
     * the one-token ones 98 -> 94, the whole int8 b1 step 2.72 -> 2.60 ms) */
    /* xw (TB_CUDA_QGEMV_XW, blocks not in clusters): each warp stages only
     * its own steps' units of x (its K range is the same for every tile)
     * and waits for its own lanes alone, no block barrier before the first
     * mma; the sums of squares are the warp's own either way (mma_finish
     * adds the warps') */
    const bool xwarp = CL == 1 && xw;
    {
        constexpr int XU = 4, BT = NW * 32;
        const int ku = K / 8, nit = T * ku;
        /* xwarp: the warp's units, token-major: mb + (i % mn) of token i / mn */
        constexpr int UPS = KSTEP / 8;
        const int mb = s0 * UPS, mn = nj * UPS;
        float ssr[TBC_GEMV_MAX_T];
#pragma unroll
        for (int k = 0; k < TBC_GEMV_MAX_T; k++) ssr[k] = 0.0f;
        /* CL 2: the two blocks of a cluster take turns over chunks of XU * BT
         * units and store each unit into both blocks' xs (and their sums of
         * squares into the other's wss_o): half the L2 reads a block */
        const unsigned crank = CL > 1 ? tbc_cluster_rank() : 0u;
        uint4 *xs_o = CL > 1 ? tbc_cluster_map(xs, crank ^ 1u) : nullptr;
        if (CL > 1) tbc_cluster_wait();
        /* xwarp: the loop runs over the warp's T * mn units, 32 lanes a round */
        const int lim = xwarp ? T * mn : nit, bt = xwarp ? 32 : BT;
        /* unit i is token i / span's unit m0 + i % span */
        const int span = xwarp ? mn : ku, m0 = xwarp ? mb : 0;
        for (int i0 = xwarp ? lane : threadIdx.x + (int)crank * XU * BT; i0 < lim; i0 += CL * XU * bt) {
            float4 a[XU], b[XU];
#pragma unroll
            for (int u = 0; u < XU; u++) {
                const int i = i0 + u * bt;
                if (i < lim) {
                    const int tk = i / span, m = m0 + (i - tk * span);
                    const float4 *p = reinterpret_cast<const float4 *>(x + (size_t)tk * K) + 2 * m;
                    a[u] = __ldg(p);
                    b[u] = __ldg(p + 1);
                }
            }
#pragma unroll
            for (int u = 0; u < XU; u++) {
                const int i = i0 + u * bt;
                if (i >= lim) break;
                const int tk = i / span, m = m0 + (i - tk * span);
                float f0 = a[u].x, f1 = a[u].y, f2 = a[u].z, f3 = a[u].w;
                float f4 = b[u].x, f5 = b[u].y, f6 = b[u].z, f7 = b[u].w;
                if (NORM) {
                    float ss = f0 * f0;
                    ss = fmaf(f1, f1, ss); ss = fmaf(f2, f2, ss); ss = fmaf(f3, f3, ss);
                    ss = fmaf(f4, f4, ss); ss = fmaf(f5, f5, ss); ss = fmaf(f6, f6, ss); ss = fmaf(f7, f7, ss);
#pragma unroll
                    for (int k = 0; k < TBC_GEMV_MAX_T; k++)
                        if (k == tk) ssr[k] += ss;
                    if (e.norm_w) {
                        float4 ga = __ldg(reinterpret_cast<const float4 *>(e.norm_w) + 2 * m);
                        float4 gb = __ldg(reinterpret_cast<const float4 *>(e.norm_w) + 2 * m + 1);
                        f0 *= ga.x; f1 *= ga.y; f2 *= ga.z; f3 *= ga.w;
                        f4 *= gb.x; f5 *= gb.y; f6 *= gb.z; f7 *= gb.w;
                    }
                }
                uint4 o;
                if (QT == QT_I4) {
                    o.x = h2u(__floats2half2_rn(f0, f4));
                    o.y = h2u(__floats2half2_rn(f1, f5));
                    o.z = h2u(__floats2half2_rn(f2, f6));
                    o.w = h2u(__floats2half2_rn(f3, f7));
                } else {
                    o.x = h2u(__floats2half2_rn(f0, f1));
                    o.y = h2u(__floats2half2_rn(f2, f3));
                    o.z = h2u(__floats2half2_rn(f4, f5));
                    o.w = h2u(__floats2half2_rn(f6, f7));
                }
                const size_t xi = (size_t)tk * qpipe_xstride<QT>(K) + qpipe_xpos<QT>(m);
                xs[xi] = o;
                if (CL > 1) xs_o[xi] = o;
            }
        }
        if (NORM) {
            float *wo = CL > 1 ? tbc_cluster_map(&wss_o[0][0], crank ^ 1u) : nullptr;
#pragma unroll
            for (int k = 0; k < TBC_GEMV_MAX_T; k++) {
                if (k >= T) break;
                const float ss = tbc_warp_sum(ssr[k]);
                if (lane == 0) {
                    wss[warp][k] = ss;
                    if (CL > 1) wo[warp * 8 + k] = ss;
                }
            }
        }
    }
    if (CL > 1) { /* both blocks' stores done and seen; none after this */
        tbc_cluster_arrive();
        tbc_cluster_wait();
    } else if (xwarp) {
        __syncwarp();
    } else {
        __syncthreads();
    }
    /* the block's sums of squares reach mma_finish as token g's: warp w's
     * on its lane (g, t = 0), every other lane 0 (summed over quads, then
     * warps there) */
    const float ss = NORM && t == 0 && g < T ? wss[warp][g] + (CL > 1 ? wss_o[CL > 1 ? warp : 0][g] : 0.0f) : 0.0f;
    /* lanes of tokens >= T read token T - 1's x: their product columns are
     * not stored */
    const uint4 *xg = xs + (size_t)min(g, T - 1) * qpipe_xstride<QT>(K);
    const __half2 one2 = __float2half2_rn(1.0f), zero2 = __float2half2_rn(0.0f);
    int rs = 0; /* the slot read next */
    for (int i = 0; i < nbt; i++) {
        float c[RT][4], c1[RT][4];
#pragma unroll
        for (int r = 0; r < RT; r++)
#pragma unroll
            for (int q = 0; q < 4; q++) c[r][q] = c1[r][q] = 0.0f;
        for (int j = 0; j < nj; j++) {
            qp_wait<NS - 2>(); /* this step has landed */
            /* GS: the scales came by lane t = 0's copies (the wait covers a
             * thread's own); this also orders the last reads of the slot
             * refilled below before its refill */
            if (QT == QT_I4 && GS) __syncwarp();
            uint4 ua[RT], ub[RT];
            float fsa[RT], fsb[RT], fza[RT], fzb[RT];
#pragma unroll
            for (int r = 0; r < RT; r++) {
                const uint4 *d = ring + (size_t)(rs * RT + r) * 64;
                ua[r] = d[lane];
                ub[r] = d[32 + lane];
                if (QT == QT_I4) {
                    const float *f = scr + (size_t)(rs * RT + r) * SCR;
                    fsa[r] = f[GS ? g : lane];
                    fsb[r] = GS ? f[8 + g] : f[32 + lane];
                    fza[r] = !GS && w.zeros ? f[64 + lane] : 0.0f;
                    fzb[r] = !GS && w.zeros ? f[96 + lane] : 0.0f;
                }
            }
            rs = rs + 1 == NS ? 0 : rs + 1;
            /* refill the slot read one step ago */
            issue_next();
            qp_commit();
            const int st = s0 + j;
            uint32_t xb[VPL / 2];
            /* int4: unit 16 st + 4 t + q at 16 st + 4 q + t (qpipe_xpos) */
            const uint4 *xp = QT == QT_I4 ? xg + (size_t)st * 16 + t : xg + (size_t)(st * KSTEP + t * VPL) / 8;
#pragma unroll
            for (int q = 0; q < VPL / 8; q++) {
                uint4 v = xp[QT == QT_I4 ? 4 * q : q];
                xb[4 * q] = v.x; xb[4 * q + 1] = v.y; xb[4 * q + 2] = v.z; xb[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (GS) {
                    float ct[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    qmma_step<QT, true>(ct, cu, ua[r], ub[r], xb, one2, zero2, one2, zero2);
                    c[r][0] = fmaf(ct[0] + cu[0], fsa[r], c[r][0]);
                    c[r][1] = fmaf(ct[1] + cu[1], fsa[r], c[r][1]);
                    c[r][2] = fmaf(ct[2] + cu[2], fsb[r], c[r][2]);
                    c[r][3] = fmaf(ct[3] + cu[3], fsb[r], c[r][3]);
                } else if (QT == QT_I4) {
                    qmma_step<QT>(c[r], c1[r], ua[r], ub[r], xb, __float2half2_rn(fsa[r]), __float2half2_rn(fza[r]),
                                   __float2half2_rn(fsb[r]), __float2half2_rn(fzb[r]));
                } else {
                    qmma_step<QT, true>(c[r], c1[r], ua[r], ub[r], xb, one2, zero2, one2, zero2);
                }
            }
        }
        if (i == nbt - 1) {
            qp_wait<0>();
            tbc_pdl_trigger();
        }
        const int bt = (int)blockIdx.x + i * (int)gridDim.x;
#pragma unroll
        for (int r = 0; r < RT; r++) {
            int ra, rb, P;
            const bool pair_ok = mma_rows<MODE>(e, N, g, ra, rb, P, bt * RT + r);
            const float fa = QT == QT_I4 ? 1.0f : __ldg(w.scales + min(ra, N - 1));
            const float fb = QT == QT_I4 ? 1.0f : __ldg(w.scales + min(rb, N - 1));
            float cc[4] = {c[r][0] + c1[r][0], c[r][1] + c1[r][1], c[r][2] + c1[r][2], c[r][3] + c1[r][3]};
            mma_finish<MODE, NORM>(red[i & 1][r], red_ss, cc, ss, warp, lane, ra, rb, P, pair_ok, T, K, N, bias, y,
                                   e, fa, fb, i == 0 && r == 0);
        }
    }
}

/* ---------------------------------------------------------------- quantized, bulk-copy ring
 * Decode steps of int8 / e4m3 / int4 (a group a multiple of 128, no zeros)
 * weights on the copy engine: the f16 bulk-copy ring of gemv_tma_kernel
 * (a producer warp copying stages of 16 rows x TMA_CHB bytes with
 * cp.async.bulk into a ring of NS slots, full / empty mbarriers, 8 consumer
 * warps taking two 64-byte steps of a stage each, rotated stages), with
 * the consumers of qgemv_pipe_kernel: x (T tokens, times the norm weight)
 * staged once a block in f16 pairs of the mma's k order (qpipe_xstride /
 * qpipe_xpos), the codes widened in registers (qmma_step), int4 sums scaled
 * a step, int8 / e4m3 rows' scales in the epilogue. A consumer reads its
 * two steps' codes, arrives on "empty" and only then multiplies, so the
 * slot is refilled while it computes. The ring holds min(NS, stages)
 * slots (int4 rows of K 4096 are two stages); x follows it. KS > 1
 * (TB_CUDA_GEMV_TMA bit 6, matrices of few tiles): clusters of KS blocks
 * a tile, block r of a cluster taking stages [r nst / KS, (r + 1) nst / KS)
 * and staging only their x (and its squares); the partial sums meet in
 * rank 0 (mma_finish). */
template <int QT, int MODE, bool NORM, int NS, int KS = 1>
__global__ void __launch_bounds__((GEMV_MMA_WARPS + 1) * 32)
qgemv_tma_kernel(const float *__restrict__ x, tbc_qweight w, const float *__restrict__ bias, float *__restrict__ y,
                 int T, int K, int N, tbc_gemv_epi e) {
    constexpr int VPL = QT == QT_I4 ? 32 : 16; /* values per 16-byte load */
    constexpr int KSTEP = 4 * VPL;
    constexpr int NW = GEMV_MMA_WARPS;
    __shared__ float red[NW][32][4];
    __shared__ float red_ss[NW][8];
    __shared__ float wss[NW][8]; /* each warp's sum of squares per token */
    __shared__ __align__(8) uint64_t full[NS], empty[NS];
    extern __shared__ uint4 tma_dyn[]; /* [nsl slots][16 rows][TMA_RS bytes], then x */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const size_t row_bytes = QT == QT_I4 ? (size_t)K / 2 : (size_t)K;
    const int tile = KS > 1 ? (int)blockIdx.x / KS : (int)blockIdx.x, kr = KS > 1 ? (int)blockIdx.x % KS : 0;
    const int nall = (int)((row_bytes + TMA_CHB - 1) / TMA_CHB);
    /* this block's stages s0 .. s0 + nst - 1 */
    const int s0 = KS > 1 ? kr * nall / KS : 0, nst = KS > 1 ? (kr + 1) * nall / KS - s0 : nall;
    const int nsl = min(NS, nst);
    const int rot = (int)(((unsigned)tile * 97u) % (unsigned)nst);
    auto pst = [&](int q) { return s0 + (q + rot < nst ? q + rot : q + rot - nst); };
    char *ring = reinterpret_cast<char *>(tma_dyn);
    uint4 *xs = reinterpret_cast<uint4 *>(ring + (size_t)nsl * 16 * TMA_RS);
    tma_ring_init<NS>(full, empty);
    __syncthreads();
    if (warp == NW) {
        tma_produce<MODE, NS>(e, N, w.codes, row_bytes, nst, pst, ring, full, empty, lane, tile);
        __syncthreads(); /* mma_finish's */
        if (KS > 1) { /* and its two cluster barriers */
            tbc_cluster_arrive();
            tbc_cluster_wait();
            tbc_cluster_arrive();
            tbc_cluster_wait();
        }
        return;
    }
    int ra, rb, P;
    const bool pair_ok = mma_rows<MODE>(e, N, g, ra, rb, P, tile);
    const int qa = min(ra, N - 1), qb = min(rb, N - 1);
    tbc_pdl_wait();
    /* x: the consumers' 256 threads take its T * K / 8 units (those of
     * this block's stages: units m0 .. m0 + ku - 1), 4 a thread in flight
     * (as qgemv_pipe_kernel's block staging) */
    {
        constexpr int XU = 4, BT = NW * 32, UPS = TMA_CHB * (QT == QT_I4 ? 2 : 1) / 8; /* units a stage */
        const int m0 = KS > 1 ? s0 * UPS : 0;
        const int ku = KS > 1 ? min(K / 8, (s0 + nst) * UPS) - m0 : K / 8, nit = T * ku;
        float ssr[TBC_GEMV_MAX_T];
#pragma unroll
        for (int k = 0; k < TBC_GEMV_MAX_T; k++) ssr[k] = 0.0f;
        for (int i0 = threadIdx.x; i0 < nit; i0 += XU * BT) {
            float4 a[XU], b[XU];
#pragma unroll
            for (int u = 0; u < XU; u++) {
                const int i = i0 + u * BT;
                if (i < nit) {
                    const int tk = i / ku, m = m0 + i - tk * ku;
                    const float4 *p = reinterpret_cast<const float4 *>(x + (size_t)tk * K) + 2 * m;
                    a[u] = __ldg(p);
                    b[u] = __ldg(p + 1);
                }
            }
#pragma unroll
            for (int u = 0; u < XU; u++) {
                const int i = i0 + u * BT;
                if (i >= nit) break;
                const int tk = i / ku, m = m0 + i - tk * ku;
                const uint4 o = qx_unit<QT, NORM>(a[u], b[u], e.norm_w, m, tk, ssr);
                xs[(size_t)tk * qpipe_xstride<QT>(K) + qpipe_xpos<QT>(m)] = o;
            }
        }
        if (NORM) {
#pragma unroll
            for (int k = 0; k < TBC_GEMV_MAX_T; k++) {
                if (k >= T) break;
                const float ss = tbc_warp_sum(ssr[k]);
                if (lane == 0) wss[warp][k] = ss;
            }
        }
    }
    /* the consumers only (the producer is not at this barrier) */
    asm volatile("bar.sync 1, %0;\n" ::"n"(NW * 32) : "memory");
    const float ss = NORM && t == 0 && g < T ? wss[warp][g] : 0.0f;
    /* lanes of tokens >= T read token T - 1's x: their columns are not stored */
    const uint4 *xg = xs + (size_t)min(g, T - 1) * qpipe_xstride<QT>(K);
    const __half2 one2 = __float2half2_rn(1.0f), zero2 = __float2half2_rn(0.0f);
    /* int4: a step lies in one group (the launcher takes groups of a
     * multiple of 128 without zeros), that of step st being st / spg */
    const int ng = QT == QT_I4 ? K / w.group : 1, spg = QT == QT_I4 ? w.group / KSTEP : 1;
    const float *psa = w.scales + (size_t)qa * ng, *psb = w.scales + (size_t)qb * ng;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto step = [&](const uint4 &ua, const uint4 &ub, int st) {
        uint32_t xb[VPL / 2];
        /* int4: unit 16 st + 4 t + q at 16 st + 4 q + t (qpipe_xpos) */
        const uint4 *xp = QT == QT_I4 ? xg + (size_t)st * 16 + t : xg + (size_t)(st * KSTEP + t * VPL) / 8;
#pragma unroll
        for (int q = 0; q < VPL / 8; q++) {
            const uint4 v = xp[QT == QT_I4 ? 4 * q : q];
            xb[4 * q] = v.x; xb[4 * q + 1] = v.y; xb[4 * q + 2] = v.z; xb[4 * q + 3] = v.w;
        }
        if (QT == QT_I4) {
            const int gi = spg == 1 ? st : st / spg;
            const float fa = __ldg(psa + gi), fb = __ldg(psb + gi);
            float ct[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            qmma_step<QT, true>(ct, cu, ua, ub, xb, one2, zero2, one2, zero2);
            c[0] = fmaf(ct[0] + cu[0], fa, c[0]);
            c[1] = fmaf(ct[1] + cu[1], fa, c[1]);
            c[2] = fmaf(ct[2] + cu[2], fb, c[2]);
            c[3] = fmaf(ct[3] + cu[3], fb, c[3]);
        } else {
            qmma_step<QT, true>(c, c1, ua, ub, xb, one2, zero2, one2, zero2);
        }
    };
    const int j0 = warp, j1 = warp + NW;
    for (int q = 0; q < nst; q++) {
        const int slot = q % NS, ps = pst(q);
        const int nsteps = (int)(min((size_t)TMA_CHB, row_bytes - (size_t)ps * TMA_CHB) / 64);
        tma_mbar_wait(&full[slot], (unsigned)((q / NS) & 1));
        const char *sa = ring + ((size_t)slot * 16 + g) * TMA_RS + t * 16;
        const char *sb = sa + (size_t)8 * TMA_RS;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        const uint4 a0 = j0 < nsteps ? *reinterpret_cast<const uint4 *>(sa + j0 * 64) : zero;
        const uint4 b0 = j0 < nsteps ? *reinterpret_cast<const uint4 *>(sb + j0 * 64) : zero;
        const uint4 a1 = j1 < nsteps ? *reinterpret_cast<const uint4 *>(sa + j1 * 64) : zero;
        const uint4 b1 = j1 < nsteps ? *reinterpret_cast<const uint4 *>(sb + j1 * 64) : zero;
        __syncwarp();
        if (lane == 0) tma_mbar_arrive(&empty[slot]);
        const int st = ps * (TMA_CHB / 64);
        if (j0 < nsteps) step(a0, b0, st + j0);
        if (j1 < nsteps) step(a1, b1, st + j1);
    }
    tbc_pdl_trigger();
    const float fa = QT == QT_I4 ? 1.0f : __ldg(w.scales + qa);
    const float fb = QT == QT_I4 ? 1.0f : __ldg(w.scales + qb);
    float cc[4] = {c[0] + c1[0], c[1] + c1[1], c[2] + c1[2], c[3] + c1[3]};
    mma_finish<MODE, NORM, KS>(red, red_ss, cc, ss, warp, lane, ra, rb, P, pair_ok, T, K, N, bias, y, e, fa, fb);
}

/* ---------------------------------------------------------------- quantized, one token, Q8
 * One-token steps of int8 / int4 weights with x rounded to int8 per block of
 * 32 values (tb_ref_qmatmul_q8's activations: d = absmax / 127, q =
 * rint(x * 127 / absmax), clamped to +-127), the codes multiplied by dp4a in
 * integers: no widening, four products an instruction (int4: two masks and
 * one shift a 32-bit word of eight codes, the sign flip folded into the
 * mask's lop3 as code + 8, the 8 * sum(q) taken off once a block). Each
 * block stages x once in shared memory (one Q8 block of 32 values per 8
 * threads: absmax and sum of codes by shuffles), arranged so a lane's
 * 16-byte words of x match its codes: int8 word j = q[4j .. 4j+3]; int4 the
 * pairs of word j of codes (k 8j .. 8j+7) as (q[8j], q[8j+2], q[8j+4],
 * q[8j+6]) and (q[8j+1], ..., q[8j+7]), the low and high nibbles of its
 * bytes. Then one warp a row pair (the epilogues of pair_rows), lanes taking
 * Q8 blocks lane, lane + 32, ... of both rows, 8 16-byte loads a lane in
 * flight (int4: 16 bytes a block a row, 4 blocks; int8 32, 2 blocks); f32 sums d_b * s_g * isum (int4,
 * + d_b * z_g * sum(q) with zeros), int8's row scale at the end. With NORM
 * the squares are those of x before the norm weight, q of x * norm_w. */
#define Q8_WARPS 8
template <int QT, int MODE, bool NORM>
__global__ void __launch_bounds__(Q8_WARPS * 32, 3)
qgemv_q8_kernel(const float *__restrict__ x, tbc_qweight w, const float *__restrict__ bias, float *__restrict__ y,
                int K, int N, tbc_gemv_epi e) {
    constexpr int CW = QT == QT_I4 ? 1 : 2;   /* 16-byte loads a Q8 block a row */
    constexpr int Q8_CU = QT == QT_I4 ? 4 : 2; /* Q8 blocks a lane in flight: 8 loads */
    __shared__ float wss[Q8_WARPS];
    extern __shared__ uint4 q8_dyn[];
    const int NB = K >> 5; /* Q8 blocks a row */
    uint4 *xa = q8_dyn, *xb = q8_dyn + NB;
    float2 *xm = reinterpret_cast<float2 *>(q8_dyn + 2 * NB); /* (d, sum of codes) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pairs = pair_count<MODE>(e, N);
    const int tw = (int)gridDim.x * Q8_WARPS, p0 = (int)blockIdx.x * Q8_WARPS + warp;
    const char *cb = static_cast<const char *>(w.codes);
    const size_t row_bytes = QT == QT_I4 ? (size_t)K / 2 : (size_t)K;
    /* the first pair's first blocks into L2 while the previous kernel ends */
    if (p0 < pairs) {
        int ra, rb;
        pair_rows<MODE>(e, N, p0, ra, rb);
        rb = min(rb, N - 1);
#pragma unroll
        for (int u = 0; u < Q8_CU; u++) {
            const int b = lane + 32 * u;
            if (b < NB) {
                tbc_prefetch_l2(cb + (size_t)ra * row_bytes + (size_t)b * 16 * CW);
                tbc_prefetch_l2(cb + (size_t)rb * row_bytes + (size_t)b * 16 * CW);
            }
        }
    }
    tbc_pdl_wait();
    /* stage x: unit u (4 values) is value 4 (u % 8) .. of Q8 block u / 8 */
    float ssq = 0.0f;
    {
        const int NU = K >> 2, BT = Q8_WARPS * 32, s8 = threadIdx.x & 7;
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        const float4 *g4 = reinterpret_cast<const float4 *>(e.norm_w);
        for (int u0 = 0; u0 < NU; u0 += 2 * BT) {
            float4 v[2], gv[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int u = u0 + i * BT + (int)threadIdx.x;
                v[i] = u < NU ? __ldg(x4 + u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (NORM && g4) gv[i] = u < NU ? __ldg(g4 + u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int u = u0 + i * BT + (int)threadIdx.x; /* a group of 8 lanes: all below NU or none */
                float4 f = v[i];
                if (NORM) {
                    ssq = fmaf(f.x, f.x, ssq); ssq = fmaf(f.y, f.y, ssq);
                    ssq = fmaf(f.z, f.z, ssq); ssq = fmaf(f.w, f.w, ssq);
                    if (g4) { f.x *= gv[i].x; f.y *= gv[i].y; f.z *= gv[i].z; f.w *= gv[i].w; }
                }
                float am = fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w)));
                am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
                am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
                am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 4));
                const float id = am > 0.0f ? __fdiv_rn(127.0f, am) : 0.0f;
                int q0 = __float2int_rn(__fmul_rn(f.x, id)), q1 = __float2int_rn(__fmul_rn(f.y, id));
                int q2 = __float2int_rn(__fmul_rn(f.z, id)), q3 = __float2int_rn(__fmul_rn(f.w, id));
                q0 = max(-127, min(127, q0)); q1 = max(-127, min(127, q1));
                q2 = max(-127, min(127, q2)); q3 = max(-127, min(127, q3));
                int qs = q0 + q1 + q2 + q3;
                qs += __shfl_xor_sync(0xffffffffu, qs, 1);
                qs += __shfl_xor_sync(0xffffffffu, qs, 2);
                qs += __shfl_xor_sync(0xffffffffu, qs, 4);
                if (u < NU) {
                    const int b = u >> 3;
                    uint32_t *ra = reinterpret_cast<uint32_t *>(xa + b), *rb = reinterpret_cast<uint32_t *>(xb + b);
                    if (QT == QT_I4) {
                        /* words 2j (low nibbles) and 2j + 1 (high) of code word j = s8 / 2, this lane's half */
                        const int j = s8 >> 1, hf = s8 & 1;
                        const uint16_t lo = (uint16_t)((q0 & 0xff) | (q2 & 0xff) << 8);
                        const uint16_t hi = (uint16_t)((q1 & 0xff) | (q3 & 0xff) << 8);
                        uint16_t *wl = reinterpret_cast<uint16_t *>(j < 2 ? ra + 2 * j : rb + 2 * j - 4);
                        wl[hf] = lo;
                        wl[2 + hf] = hi;
                    } else {
                        const uint32_t word = (uint32_t)(q0 & 0xff) | (uint32_t)(q1 & 0xff) << 8 |
                                              (uint32_t)(q2 & 0xff) << 16 | (uint32_t)(q3 & 0xff) << 24;
                        (s8 < 4 ? ra : rb)[s8 & 3] = word;
                    }
                    if (s8 == 0) xm[b] = make_float2(__fdiv_rn(am, 127.0f), (float)qs);
                }
            }
        }
        if (NORM) {
            ssq = tbc_warp_sum(ssq);
            if (lane == 0) wss[warp] = ssq;
        }
    }
    __syncthreads();
    float rinv = 1.0f;
    if (NORM) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < Q8_WARPS; i++) s += wss[i];
        rinv = rsqrtf(s / (float)K + e.norm_eps);
    }
    const int ng = QT == QT_I4 ? K / w.group : 1;
    for (int P = p0; P < pairs; P += tw) {
        int ra, rb;
        pair_rows<MODE>(e, N, P, ra, rb);
        const bool okb = rb < N;
        const int rbl = okb ? rb : ra;
        const char *pa = cb + (size_t)ra * row_bytes, *pb = cb + (size_t)rbl * row_bytes;
        float acca = 0.0f, accb = 0.0f;
        for (int c0 = 0; c0 < NB; c0 += 32 * Q8_CU) {
            uint4 wa[Q8_CU][CW], wb[Q8_CU][CW];
            float sa[Q8_CU], sb[Q8_CU], za[Q8_CU], zb[Q8_CU];
#pragma unroll
            for (int u = 0; u < Q8_CU; u++) {
                const int b = c0 + lane + 32 * u;
                if (b < NB) {
#pragma unroll
                    for (int c = 0; c < CW; c++) {
                        wa[u][c] = __ldg(reinterpret_cast<const uint4 *>(pa) + (size_t)b * CW + c);
                        wb[u][c] = __ldg(reinterpret_cast<const uint4 *>(pb) + (size_t)b * CW + c);
                    }
                    if (QT == QT_I4) {
                        const int gi = (b << 5) / w.group;
                        sa[u] = __ldg(w.scales + (size_t)ra * ng + gi);
                        sb[u] = __ldg(w.scales + (size_t)rbl * ng + gi);
                        za[u] = w.zeros ? __ldg(w.zeros + (size_t)ra * ng + gi) : 0.0f;
                        zb[u] = w.zeros ? __ldg(w.zeros + (size_t)rbl * ng + gi) : 0.0f;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < Q8_CU; u++) {
                const int b = c0 + lane + 32 * u;
                if (b >= NB) break;
                const uint4 x0 = xa[b], x1 = xb[b];
                const float2 m = xm[b];
                const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                const int qs = (int)m.y;
                int ia = QT == QT_I4 ? -8 * qs : 0, ib = ia;
                if (QT == QT_I4) {
                    const uint32_t ca[4] = {wa[u][0].x, wa[u][0].y, wa[u][0].z, wa[u][0].w};
                    const uint32_t cbw[4] = {wb[u][0].x, wb[u][0].y, wb[u][0].z, wb[u][0].w};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        uint32_t la, ha, lb, hb;
                        /* (a & 0x0f0f0f0f) ^ 0x08080808: lut 0x6a as in lop3_lo4 */
                        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(la) : "r"(ca[j]), "r"(0x0f0f0f0fu), "r"(0x08080808u));
                        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(ha) : "r"(ca[j] >> 4), "r"(0x0f0f0f0fu), "r"(0x08080808u));
                        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(lb) : "r"(cbw[j]), "r"(0x0f0f0f0fu), "r"(0x08080808u));
                        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(hb) : "r"(cbw[j] >> 4), "r"(0x0f0f0f0fu), "r"(0x08080808u));
                        ia = __dp4a((int)la, (int)xw[2 * j], ia);
                        ia = __dp4a((int)ha, (int)xw[2 * j + 1], ia);
                        ib = __dp4a((int)lb, (int)xw[2 * j], ib);
                        ib = __dp4a((int)hb, (int)xw[2 * j + 1], ib);
                    }
                    float fa = (float)ia * sa[u], fb = (float)ib * sb[u];
                    if (w.zeros) {
                        fa = fmaf((float)qs, za[u], fa);
                        fb = fmaf((float)qs, zb[u], fb);
                    }
                    acca = fmaf(fa, m.x, acca);
                    accb = fmaf(fb, m.x, accb);
                } else {
                    const uint32_t ca[8] = {wa[u][0].x, wa[u][0].y, wa[u][0].z, wa[u][0].w,
                                            wa[u][1].x, wa[u][1].y, wa[u][1].z, wa[u][1].w};
                    const uint32_t cbw[8] = {wb[u][0].x, wb[u][0].y, wb[u][0].z, wb[u][0].w,
                                             wb[u][1].x, wb[u][1].y, wb[u][1].z, wb[u][1].w};
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        ia = __dp4a((int)ca[j], (int)xw[j], ia);
                        ib = __dp4a((int)cbw[j], (int)xw[j], ib);
                    }
                    acca = fmaf((float)ia, m.x, acca);
                    accb = fmaf((float)ib, m.x, accb);
                }
            }
        }
        if (P + tw >= pairs) tbc_pdl_trigger();
        acca = tbc_warp_sum(acca);
        accb = tbc_warp_sum(accb);
        if (lane == 0) {
            if (QT != QT_I4) {
                acca *= __ldg(w.scales + ra);
                accb *= __ldg(w.scales + rbl);
            }
            acca *= rinv;
            accb *= rinv;
            const float ba = bias ? bias[ra] : 0.0f, bbv = bias && okb ? bias[rb] : 0.0f;
            epi_store<MODE>(e, y, N, 0, P, ra, rb, okb, acca + ba, accb + bbv);
        }
    }
}

/* One token on qgemv_q8_kernel (variant 15): as many blocks as fit at once,
 * fewer where that evens the pairs a warp takes. */
template <int QT, int MODE, bool NORM>
static cudaError_t q8_launch(const float *x, const tbc_qweight &w, const float *bias, float *y, int K, int N,
                             const tbc_gemv_epi &e, cudaStream_t s) {
    auto kern = qgemv_q8_kernel<QT, MODE, NORM>;
    const size_t smem = (size_t)(K >> 5) * 40;
    static unsigned optin = 0;
    static int sms = 0, per_sm = 0;
    int dev = 0;
    cudaError_t r = cudaGetDevice(&dev);
    if (r == cudaSuccess) r = tbc_smem_optin(kern, 64 * 1024, dev, &optin);
    if (r != cudaSuccess) return r;
    if (smem > 64 * 1024) return cudaErrorNotSupported;
    if (!per_sm) {
        int nb = 0;
        r = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (r == cudaSuccess) r = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, Q8_WARPS * 32, 16384);
        if (r != cudaSuccess) return r;
        per_sm = nb > 0 ? nb : 1;
    }
    const int pairs = MODE == TBC_EPI_PLAIN || MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
    const int maxb = per_sm * sms, need = (pairs + Q8_WARPS - 1) / Q8_WARPS;
    int grid = need < maxb ? need : maxb;
    const int per_warp = (pairs + grid * Q8_WARPS - 1) / (grid * Q8_WARPS);
    grid = (pairs + per_warp * Q8_WARPS - 1) / (per_warp * Q8_WARPS);
    return tbc_launch(kern, dim3(grid), dim3(Q8_WARPS * 32), smem, s, x, w, bias, y, K, N, e);
}

/* ---------------------------------------------------------------- quantized, SIMT rows
 * int8 / e4m3 weights, T <= 2 (batch-1 decode): the f16 row kernel's layout
 * (one warp per row, 8 warps = 4 row pairs a block, U 16-byte loads per lane
 * in flight), each load 16 codes widened to f32 in registers (int8: the
 * byte under the exponent of 2^23, one add; e4m3: the hardware's pairwise
 * conversion to f16, exact) and multiplied with x in f32 (x is not
 * rounded: the f32 sums of codes times x, scaled by the row's scale). */
template <int QT>
__device__ __forceinline__ void widen16(const uint4 &u, float *f) {
    const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (QT == QT_I8) {
            const uint32_t v = w4[i] ^ 0x80808080u;
            f[4 * i] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540)) - 8388736.0f;
            f[4 * i + 1] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7541)) - 8388736.0f;
            f[4 * i + 2] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7542)) - 8388736.0f;
            f[4 * i + 3] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7543)) - 8388736.0f;
        } else {
            uint32_t h0, h1;
            widen_word8<QT_FP8>(w4[i], h0, h1);
            float2 a = __half22float2(u2h(h0)), b = __half22float2(u2h(h1));
            f[4 * i] = a.x; f[4 * i + 1] = a.y; f[4 * i + 2] = b.x; f[4 * i + 3] = b.y;
        }
    }
}

template <int QT, int TT, int MODE, bool NORM, int U>
__global__ void __launch_bounds__(256)
qgemv_row_kernel(const float *__restrict__ x, tbc_qweight w, const float *__restrict__ bias, float *__restrict__ y,
                 int K, int N, tbc_gemv_epi e) {
    constexpr int RW = 8;
    __shared__ float sums[RW][TT], ssum[RW][TT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, side = warp & 1;
    const int P = blockIdx.x * (RW / 2) + (warp >> 1);
    const bool valid = P < pair_count<MODE>(e, N);
    int ra = 0, rb = 0;
    if (valid) pair_rows<MODE>(e, N, P, ra, rb);
    const bool okb = rb < N;
    const bool active = valid && (side == 0 || okb);
    const int row = active && side ? rb : ra;
    const uint4 *wr = reinterpret_cast<const uint4 *>(static_cast<const char *>(w.codes) + (size_t)row * K);
    const int nv = K / 16;
    tbc_pdl_wait();
    float acc[TT], ss[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = ss[t] = 0.0f;
    if (active) {
        for (int v0 = lane; v0 < nv; v0 += 32 * U) {
            uint4 u[U];
#pragma unroll
            for (int i = 0; i < U; i++) u[i] = v0 + 32 * i < nv ? __ldg(wr + v0 + 32 * i) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int v = v0 + 32 * i;
                if (v >= nv) break;
                float wf[16], gf[16];
                widen16<QT>(u[i], wf);
                if (NORM && e.norm_w) {
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        float4 gv = __ldg(reinterpret_cast<const float4 *>(e.norm_w + (size_t)v * 16) + q);
                        gf[4 * q] = gv.x; gf[4 * q + 1] = gv.y; gf[4 * q + 2] = gv.z; gf[4 * q + 3] = gv.w;
                    }
                }
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)t * K + (size_t)v * 16);
                    float s = acc[t], q = ss[t];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        float4 a = __ldg(xp + j);
                        float xv[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                        for (int l = 0; l < 4; l++) {
                            float xe = xv[l];
                            if (NORM) {
                                q = fmaf(xe, xe, q);
                                if (e.norm_w) xe *= gf[4 * j + l];
                            }
                            s = fmaf(xe, wf[4 * j + l], s);
                        }
                    }
                    acc[t] = s;
                    ss[t] = q;
                }
            }
        }
    }
    tbc_pdl_trigger();
    const float rs = active ? __ldg(w.scales + row) : 0.0f;
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float sv = tbc_warp_sum(acc[t]) * rs, q = NORM ? tbc_warp_sum(ss[t]) : 0.0f;
        if (lane == 0) {
            sums[warp][t] = sv;
            ssum[warp][t] = q;
        }
    }
    __syncthreads();
    if (valid && side == 0 && lane == 0) {
        float bia = bias ? bias[ra] : 0.0f, bib = bias && okb ? bias[rb] : 0.0f;
#pragma unroll
        for (int t = 0; t < TT; t++) {
            float va = sums[warp][t], vb = sums[warp + 1][t];
            if (NORM) {
                float f = rsqrtf(ssum[warp][t] / (float)K + e.norm_eps);
                va *= f;
                vb *= f;
            }
            epi_store<MODE>(e, y, N, t, P, ra, rb, okb, va + bia, vb + bib);
        }
    }
}

/* out (N, K) f16 = dq(W) (computed in f32, rounded once). K % 8 == 0: one
 * thread per 8 elements of a row (one 4-byte load of int4 codes or 8 bytes
 * of int8 / e4m3, one 16-byte store); otherwise one per element. */
__device__ __forceinline__ float dq_one(const tbc_qweight &w, const unsigned char *cb, size_t r, int K, int k) {
    if (w.type == TBC_Q_I4) {
        unsigned char byte = cb[r * (size_t)(K / 2) + (size_t)(k / 2)];
        int u = (k & 1) ? byte >> 4 : byte & 15;
        size_t gi = r * (size_t)(K / w.group) + (size_t)(k / w.group);
        return (float)(u >= 8 ? u - 16 : u) * w.scales[gi] + (w.zeros ? w.zeros[gi] : 0.0f);
    }
    unsigned char b = cb[r * (size_t)K + (size_t)k];
    if (w.type == TBC_Q_I8) return (float)(signed char)b * w.scales[r];
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h)) * w.scales[r];
}

__global__ void dequant_f16_kernel(tbc_qweight w, int K, int N, int vec, __half *__restrict__ out) {
    tbc_pdl_wait(); /* out may still be read by the previous matmul */
    const unsigned char *cb = static_cast<const unsigned char *>(w.codes);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (vec) {
        const size_t per_row = (size_t)K / 8, total = (size_t)N * per_row;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += stride) {
            const size_t r = i / per_row;
            const int k0 = (int)(i - r * per_row) * 8;
            float v[8];
            if (w.type == TBC_Q_I4) {
                uint32_t word = *reinterpret_cast<const uint32_t *>(cb + r * (size_t)(K / 2) + (size_t)(k0 / 2));
                size_t gi = r * (size_t)(K / w.group) + (size_t)(k0 / w.group); /* 8 | group */
                float sc = w.scales[gi], z = w.zeros ? w.zeros[gi] : 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    int u = (word >> (4 * e)) & 15;
                    v[e] = (float)(u >= 8 ? u - 16 : u) * sc + z;
                }
            } else {
                uint2 q = *reinterpret_cast<const uint2 *>(cb + r * (size_t)K + (size_t)k0);
                const uint32_t wd[2] = {q.x, q.y};
                const float sc = w.scales[r];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    if (w.type == TBC_Q_I8) {
#pragma unroll
                        for (int e = 0; e < 4; e++) v[4 * j + e] = (float)(signed char)(wd[j] >> (8 * e)) * sc;
                    } else {
                        uint32_t h0, h1;
                        widen_word8<QT_FP8>(wd[j], h0, h1);
                        float2 a = __half22float2(u2h(h0)), b = __half22float2(u2h(h1));
                        v[4 * j] = a.x * sc; v[4 * j + 1] = a.y * sc; v[4 * j + 2] = b.x * sc; v[4 * j + 3] = b.y * sc;
                    }
                }
            }
            uint4 o;
            o.x = h2u(__floats2half2_rn(v[0], v[1]));
            o.y = h2u(__floats2half2_rn(v[2], v[3]));
            o.z = h2u(__floats2half2_rn(v[4], v[5]));
            o.w = h2u(__floats2half2_rn(v[6], v[7]));
            *reinterpret_cast<uint4 *>(out + r * (size_t)K + (size_t)k0) = o;
        }
        return;
    }
    const size_t n_el = (size_t)N * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_el; i += stride) {
        const size_t r = i / (size_t)K;
        out[i] = __float2half_rn(dq_one(w, cb, r, K, (int)(i - r * (size_t)K)));
    }
}

/* SIMT kernels exist for T <= 2 with the inline norm or the residual-add
 * epilogue (larger T take the tensor-core kernel for those); other
 * combinations return cudaErrorInvalidValue. */
template <int WDT, int TT, int MODE, bool VECLOAD, bool NORM>
static cudaError_t pair_launch_t(const float *x, const void *w, const float *bias, float *y, int K, int N,
                                 const tbc_gemv_epi &e, cudaStream_t s) {
    if constexpr ((NORM && (!VECLOAD || TT > 2)) || (MODE == TBC_EPI_ADD && TT > 2)) {
        return cudaErrorInvalidValue;
    } else {
        int pairs = MODE == TBC_EPI_PLAIN || MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
        dim3 grid((pairs + GEMV_WARPS - 1) / GEMV_WARPS), block(GEMV_WARPS * 32);
        return tbc_launch(gemv_pair_kernel<WDT, TT, MODE, VECLOAD, NORM>, grid, block, 0, s, x, w, bias, y, K, N, e);
    }
}

template <int WDT, int MODE, bool VECLOAD, bool NORM>
static cudaError_t pair_launch(const float *x, const void *w, const float *bias, float *y, int T, int K, int N,
                               const tbc_gemv_epi &e, cudaStream_t s) {
    switch (T) {
    case 1: return pair_launch_t<WDT, 1, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    case 2: return pair_launch_t<WDT, 2, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    case 3: return pair_launch_t<WDT, 3, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    case 4: return pair_launch_t<WDT, 4, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    case 5: return pair_launch_t<WDT, 5, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    case 6: return pair_launch_t<WDT, 6, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    case 7: return pair_launch_t<WDT, 7, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    case 8: return pair_launch_t<WDT, 8, MODE, VECLOAD, NORM>(x, w, bias, y, K, N, e, s);
    default: return cudaErrorInvalidValue;
    }
}

/* TB_CUDA_GEMV_ROT: the f16 / bf16 GEMVs' rows read from rotated starts
 * (bit 0 the tensor-core kernel, bit 1 the SIMT row kernel). The same
 * rotation was measured and dropped in two quantized kernels (H200 / H100,
 * qgemv_bench; docs/GPU.md "Rotated row starts in the one-token kernels"):
 * each warp's steps in the cp.async ring kernel (the warps already read 8
 * column ranges at once; int8 / fp8 / int4 sums 0.3-0.8% slower) and the
 * Q8 kernel's blocks of a row pair (sum 0.8% faster alone, the int8 b1
 * step even). */
static int gemv_rot = 0;
extern "C" void tbc_set_gemv_rot(int v) { gemv_rot = v >= 0 && v <= 3 ? v : 0; }

template <int WDT, int TT, int MODE, int U, int KS>
static cudaError_t row_launch_t(const float *x, const void *w, const float *bias, float *y, int K, int N,
                                const tbc_gemv_epi &e, cudaStream_t s) {
    constexpr int RW = 8;
    int pairs = MODE == TBC_EPI_PLAIN || MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
    dim3 grid((pairs + RW / (2 * KS) - 1) / (RW / (2 * KS))), block(RW * 32);
    const int rot = (gemv_rot & 2) != 0;
    if (e.norm)
        return tbc_launch(gemv_row_kernel<WDT, TT, MODE, RW, true, U, KS>, grid, block, 0, s, x, w, bias, y, K, N, e,
                          rot);
    return tbc_launch(gemv_row_kernel<WDT, TT, MODE, RW, false, U, KS>, grid, block, 0, s, x, w, bias, y, K, N, e, rot);
}

template <int WDT, int TT, int MODE>
static cudaError_t row_launch_k(const float *x, const void *w, const float *bias, float *y, int K, int N,
                                const tbc_gemv_epi &e, int kind, cudaStream_t s) {
    switch (kind) {
    case TBC_SIMT_ROW1: return row_launch_t<WDT, TT, MODE, 1, 1>(x, w, bias, y, K, N, e, s);
    case TBC_SIMT_ROW2: return row_launch_t<WDT, TT, MODE, 2, 1>(x, w, bias, y, K, N, e, s);
    case TBC_SIMT_ROW1S: return row_launch_t<WDT, TT, MODE, 1, 2>(x, w, bias, y, K, N, e, s);
    case TBC_SIMT_ROW2S: return row_launch_t<WDT, TT, MODE, 2, 2>(x, w, bias, y, K, N, e, s);
    default: return row_launch_t<WDT, TT, MODE, 4, 1>(x, w, bias, y, K, N, e, s);
    }
}

template <int WDT, int MODE>
static cudaError_t row_launch(const float *x, const void *w, const float *bias, float *y, int T, int K, int N,
                              const tbc_gemv_epi &e, int kind, cudaStream_t s) {
    if (T == 1) return row_launch_k<WDT, 1, MODE>(x, w, bias, y, K, N, e, kind, s);
    return row_launch_k<WDT, 2, MODE>(x, w, bias, y, K, N, e, kind, s);
}

static int takes_mma(tbc_dtype wdt, int T, int K, int aligned, int simt_max_t) {
    return wdt != TBC_F32 && aligned && K % 32 == 0 && T > simt_max_t;
}

/* TB_CUDA_GEMV_TMA (tbc_set_gemv_tma): the bulk-copy ring kernel
 * (gemv_tma_kernel) for the tensor-core kernel's steps of 3..8 tokens
 * (bit 0) and for the row kernel's 1..2 (bit 1); bit 2: only for rows of
 * K >= 8192 (a 7B's down_proj); bit 3: rows of K < 8192 on a ring of
 * TMA_NS_SMALL slots (35 KB a block) rather than TMA_NS; bits 4, 7 and 5:
 * the quantized GEMVs of one token (int8 / e4m3; int4) and of 2..8 tokens
 * on qgemv_tma_kernel, bit 6 with matrices of few tiles split in K over
 * clusters of two; sm_90 only */
static int gemv_tma = 0;
extern "C" void tbc_set_gemv_tma(int v) { gemv_tma = v >= 0 && v <= 255 ? v : 0; }
/* Whether the device is compute capability 9.0 or later (thread-block
 * clusters, bulk copies): read once, for every launcher that needs it. */
static int sm90_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
    }
    return ok;
}
template <int WDT, int MODE, bool NORM, int NS>
static cudaError_t tma_launch_n(const float *x, const void *w, const float *bias, float *y, int T, int K, int N,
                                const tbc_gemv_epi &e, cudaStream_t s) {
    auto kern = gemv_tma_kernel<WDT, MODE, NORM, NS>;
    constexpr size_t smem = (size_t)NS * 16 * TMA_RS;
    static int attr_done = 0; /* once per instantiation */
    if (!attr_done) {
        cudaError_t r = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    int pairs = MODE == TBC_EPI_PLAIN ? 0 : MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
    int blocks = MODE == TBC_EPI_PLAIN ? (N + 15) / 16 : (pairs + 7) / 8;
    return tbc_launch(kern, dim3(blocks), dim3((GEMV_MMA_WARPS + 1) * 32), smem, s, x, w, bias, y, T, K, N, e);
}
template <int WDT, int MODE>
static cudaError_t tma_launch(const float *x, const void *w, const float *bias, float *y, int T, int K, int N,
                              const tbc_gemv_epi &e, cudaStream_t s) {
    if ((gemv_tma & 8) && K < 8192) {
        if (e.norm) return tma_launch_n<WDT, MODE, true, TMA_NS_SMALL>(x, w, bias, y, T, K, N, e, s);
        return tma_launch_n<WDT, MODE, false, TMA_NS_SMALL>(x, w, bias, y, T, K, N, e, s);
    }
    if (e.norm) return tma_launch_n<WDT, MODE, true, TMA_NS>(x, w, bias, y, T, K, N, e, s);
    return tma_launch_n<WDT, MODE, false, TMA_NS>(x, w, bias, y, T, K, N, e, s);
}

template <int WDT, int MODE>
static cudaError_t gemv_launch(const float *x, const void *w, const float *bias, float *y, int T, int K, int N,
                               const tbc_gemv_epi &e, const tbc_gemv_opts &o, cudaStream_t s) {
    constexpr int VEC = WDT == TBC_F32 ? 4 : 8;
    int aligned = K % VEC == 0 && (((uintptr_t)x | (uintptr_t)w) & 15) == 0;
    const bool norm = e.norm != 0;
    const bool mma = takes_mma((tbc_dtype)WDT, T, K, aligned, o.simt_max_t);
    if (norm && (!aligned || K % 8 || (T > 2 && !mma))) return cudaErrorInvalidValue;
    if (MODE == TBC_EPI_ADD && T > 2 && !mma) return cudaErrorInvalidValue;
    if constexpr (WDT != TBC_F32) {
        if (gemv_tma && aligned && K % 32 == 0 && (mma ? (gemv_tma & 1) : T <= 2 && (gemv_tma & 2)) &&
            (!(gemv_tma & 4) || K >= 8192) && sm90_ok())
            return tma_launch<WDT, MODE>(x, w, bias, y, T, K, N, e, s);
        if (mma) {
            int pairs = MODE == TBC_EPI_PLAIN ? 0 : MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
            int blocks = MODE == TBC_EPI_PLAIN ? (N + 15) / 16 : (pairs + 7) / 8;
            const int rot = (gemv_rot & 1) != 0;
            if (norm)
                return tbc_launch(gemv_mma_kernel<WDT, MODE, true>, dim3(blocks), dim3(GEMV_MMA_WARPS * 32), 0, s, x,
                                  w, bias, y, T, K, N, e, rot);
            return tbc_launch(gemv_mma_kernel<WDT, MODE, false>, dim3(blocks), dim3(GEMV_MMA_WARPS * 32), 0, s, x, w,
                              bias, y, T, K, N, e, rot);
        }
    }
    if constexpr (WDT != TBC_F32) {
        if (aligned && T <= 2 && o.simt_kind != TBC_SIMT_PAIR)
            return row_launch<WDT, MODE>(x, w, bias, y, T, K, N, e, o.simt_kind, s);
    }
    if (aligned) {
        if (norm) return pair_launch<WDT, MODE, true, true>(x, w, bias, y, T, K, N, e, s);
        return pair_launch<WDT, MODE, true, false>(x, w, bias, y, T, K, N, e, s);
    }
    return pair_launch<WDT, MODE, false, false>(x, w, bias, y, T, K, N, e, s);
}

template <int WDT>
static cudaError_t gemv_dispatch(const float *x, const void *w, const float *bias, float *y, int T, int K, int N,
                                 const tbc_gemv_epi &e, const tbc_gemv_opts &o, cudaStream_t s) {
    switch (e.mode) {
    case TBC_EPI_PLAIN: return gemv_launch<WDT, TBC_EPI_PLAIN>(x, w, bias, y, T, K, N, e, o, s);
    case TBC_EPI_GLU: return gemv_launch<WDT, TBC_EPI_GLU>(x, w, bias, y, T, K, N, e, o, s);
    case TBC_EPI_ROPE: return gemv_launch<WDT, TBC_EPI_ROPE>(x, w, bias, y, T, K, N, e, o, s);
    case TBC_EPI_ADD: return gemv_launch<WDT, TBC_EPI_ADD>(x, w, bias, y, T, K, N, e, o, s);
    }
    return cudaErrorInvalidValue;
}

extern "C" int tbc_gemv_fuses_norm(tbc_dtype wdt, int T, int K, const tbc_gemv_opts *opts) {
    return T >= 1 && T <= TBC_GEMV_MAX_T && (T <= 2 || takes_mma(wdt, T, K, 1, opts->simt_max_t));
}

extern "C" cudaError_t tbc_gemv_ex(const float *x, const void *w, tbc_dtype wdt, const float *bias, float *y, int T,
                                   int K, int N, const tbc_gemv_epi *epi, const tbc_gemv_opts *opts, cudaStream_t s) {
    if (T < 1 || T > TBC_GEMV_MAX_T) return cudaErrorInvalidValue;
    tbc_gemv_epi e{};
    if (epi) e = *epi;
    tbc_gemv_opts o{};
    o.simt_max_t = TBC_GEMV_SIMT_MAX_T;
    o.simt_kind = TBC_SIMT_ROW;
    if (opts) o = *opts;
    if (e.mode == TBC_EPI_GLU && N % 2) return cudaErrorInvalidValue;
    if (e.mode == TBC_EPI_ADD && (!e.res || !e.res_out)) return cudaErrorInvalidValue;
    if (e.mode == TBC_EPI_ROPE && (e.attn.hd < 2 || e.attn.hd % 2 || N != (e.attn.n_heads + 2 * e.attn.n_kv) * e.attn.hd))
        return cudaErrorInvalidValue;
    switch (wdt) {
    case TBC_F32: return gemv_dispatch<TBC_F32>(x, w, bias, y, T, K, N, e, o, s);
    case TBC_F16: return gemv_dispatch<TBC_F16>(x, w, bias, y, T, K, N, e, o, s);
    case TBC_BF16: return gemv_dispatch<TBC_BF16>(x, w, bias, y, T, K, N, e, o, s);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t tbc_gemv(const float *x, const void *w, tbc_dtype wdt, const float *bias, float *y, int T,
                                int K, int N, cudaStream_t s) {
    return tbc_gemv_ex(x, w, wdt, bias, y, T, K, N, NULL, NULL, s);
}

/* ---------------------------------------------------------------- quantized launchers */
static int qstep_of(tbc_qtype t) { return t == TBC_Q_I4 ? 128 : 64; }

extern "C" int tbc_qgemv_supports(const tbc_qweight *w, const float *x, int T, int K) {
    if (T < 1 || T > TBC_GEMV_MAX_T || K < 1 || K % qstep_of(w->type)) return 0;
    if (((uintptr_t)w->codes | (uintptr_t)x) & 15) return 0;
    if (w->type == TBC_Q_I4) return w->group >= 32 && w->group % 32 == 0 && K % w->group == 0;
    return w->group == K && !w->zeros;
}

/* Steps in flight per warp (TB_CUDA_QGEMV_U: 1 or 2; default 2) and the
 * kernel variant (TB_CUDA_QGEMV_V; -1: by type and step), set by the
 * backend at create. */
static int qgemv_unroll = 2, qgemv_variant = -1, qgemv_xw = -1;
extern "C" void tbc_set_qgemv_unroll(int u) { qgemv_unroll = u == 1 ? 1 : 2; }
extern "C" void tbc_set_qgemv_xw(int v) { qgemv_xw = v == 0 || v == 1 ? v : -1; }
extern "C" void tbc_set_qgemv_variant(int v) { qgemv_variant = v >= 0 && v <= 15 ? v : -1; }

template <int QT, int MODE, bool NORM, bool GS, int MINB, bool PRE, int RT>
static cudaError_t qgemv_launch_v(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K,
                                  int N, const tbc_gemv_epi &e, int tiles, cudaStream_t s) {
    dim3 grid((tiles + RT - 1) / RT), block(GEMV_MMA_WARPS * 32);
    if (qgemv_unroll == 1)
        return tbc_launch(qgemv_mma_kernel<QT, MODE, NORM, 1, GS, MINB, PRE, RT>, grid, block, 0, s, x, w, bias, y, T, K, N, e);
    return tbc_launch(qgemv_mma_kernel<QT, MODE, NORM, 2, GS, MINB, PRE, RT>, grid, block, 0, s, x, w, bias, y, T, K, N, e);
}

/* The block shapes, chosen on the H200's 7B decode step (docs/GPU.md):
 *   variant 0  one 16-row tile a block, 2 blocks an SM (int4, one token)
 *   variant 1  one tile, 4 blocks an SM (64 registers), the first steps'
 *              weights loaded before the wait (int8 / e4m3, one token)
 *   variant 2  two tiles a block sharing each step's x, 2 blocks an SM,
 *              first loads before the wait (int4, 2..8 tokens)
 *   variant 3  as 2 with 3 blocks an SM (int8 / e4m3, 2..8 tokens)
 * The register budget decides: int4's widening needs more registers, and
 * at 3 or 4 blocks an SM it spills. `tiles` counts 16-row tiles. */
template <int QT, int MODE, bool NORM, bool GS>
static cudaError_t qgemv_launch_u(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K,
                                  int N, const tbc_gemv_epi &e, int tiles, cudaStream_t s) {
    /* one token: one tile; 2..8 tokens: two tiles (int8 b8 -15%, int4 -25% on the 7B step) */
    const int v = qgemv_variant >= 0 && qgemv_variant <= 3 ? qgemv_variant : QT == QT_I4 ? (T == 1 ? 0 : 2) : (T == 1 ? 1 : 3);
    /* int4 builds variants 0 and 2 only, int8 / e4m3 1 and 3 (compile time);
     * a variant asked of the other kind takes its single- or two-tile one */
    if constexpr (QT == QT_I4) {
        if (v == 0 || v == 1) return qgemv_launch_v<QT, MODE, NORM, GS, 2, false, 1>(x, w, bias, y, T, K, N, e, tiles, s);
        return qgemv_launch_v<QT, MODE, NORM, GS, 2, true, 2>(x, w, bias, y, T, K, N, e, tiles, s);
    } else {
        if (v == 0 || v == 1) return qgemv_launch_v<QT, MODE, NORM, GS, 4, true, 1>(x, w, bias, y, T, K, N, e, tiles, s);
        return qgemv_launch_v<QT, MODE, NORM, GS, 3, true, 2>(x, w, bias, y, T, K, N, e, tiles, s);
    }
}

/* int8 / e4m3 steps of at most qgemv_simt_t tokens take the SIMT row
 * kernel (TB_CUDA_QGEMV_SIMT: 0, 1 or 2; default 0: on the H200 it ran
 * the 7B int8 step in 6.8 ms against the tensor-core kernel's 3.4, its x
 * reads (64 bytes of f32 per 16 bytes of codes) and conversions being the
 * limit), with qgemv_simt_u loads per lane in flight (1, 2 or 4). */
static int qgemv_simt_t = 0, qgemv_simt_u = 1;
extern "C" void tbc_set_qgemv_simt(int max_t, int u) {
    qgemv_simt_t = max_t >= 0 && max_t <= 2 ? max_t : 0;
    qgemv_simt_u = u == 2 || u == 4 ? u : 1;
}

template <int QT, int TT, int MODE, bool NORM>
static cudaError_t qrow_launch_t(const float *x, const tbc_qweight &w, const float *bias, float *y, int K, int N,
                                 const tbc_gemv_epi &e, cudaStream_t s) {
    int pairs = MODE == TBC_EPI_PLAIN || MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
    dim3 grid((pairs + 3) / 4), block(256);
    switch (qgemv_simt_u) {
    case 2: return tbc_launch(qgemv_row_kernel<QT, TT, MODE, NORM, 2>, grid, block, 0, s, x, w, bias, y, K, N, e);
    case 4: return tbc_launch(qgemv_row_kernel<QT, TT, MODE, NORM, 4>, grid, block, 0, s, x, w, bias, y, K, N, e);
    default: return tbc_launch(qgemv_row_kernel<QT, TT, MODE, NORM, 1>, grid, block, 0, s, x, w, bias, y, K, N, e);
    }
}

/* One token on qgemv_pipe_kernel: NS steps a warp's ring, RT tiles a block;
 * PT 0 a block per block tile, 1 persistent blocks (as many as fit).
 * Returns cudaErrorNotSupported when its shared memory would not fit (the
 * caller takes the register-loading kernel). */
template <int QT, int MODE, bool NORM, bool GS, int NS, int RT, int PT, int CL = 1>
static cudaError_t qpipe_launch(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K,
                                int N, const tbc_gemv_epi &e, int tiles, cudaStream_t s) {
    /* sm_90's 227 KiB a block less the static arrays (red, red_ss, wss) */
    constexpr int QPIPE_MAX_SMEM = 232448 - RT * 8192 - 1024;
    const size_t smem = qpipe_smem<QT, GS, NS, RT>(T, K);
    if (smem > (size_t)QPIPE_MAX_SMEM) return cudaErrorNotSupported;
    constexpr int MINB = QT == QT_I4 ? 2 : 3;
    auto kern = qgemv_pipe_kernel<QT, MODE, NORM, GS, NS, RT, MINB, CL>;
    static int attr_done = 0; /* once per instantiation, before any capture needs it */
    if (!attr_done) {
        cudaError_t r = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, QPIPE_MAX_SMEM);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    const int nbt = (tiles + RT - 1) / RT;
    int grid_n = nbt;
    if (PT) {
        /* persistent: as many blocks as fit on the device at once, by
         * shared-memory size (x's bytes vary with T and K): a few sizes
         * cached per instantiation, the oldest giving way */
        static int occ_smem[4] = {-1, -1, -1, -1}, occ_blocks[4], occ_next, sms = 0;
        int hit = -1;
        for (int i = 0; i < 4; i++)
            if (occ_smem[i] == (int)smem) hit = i;
        if (hit < 0) {
            int dev = 0, nb = 0;
            cudaError_t r = cudaGetDevice(&dev);
            if (r == cudaSuccess) r = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
            if (r == cudaSuccess) r = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, GEMV_MMA_WARPS * 32, smem);
            if (r != cudaSuccess) return r;
            hit = occ_next++ & 3;
            occ_blocks[hit] = nb > 0 ? nb : 1;
            occ_smem[hit] = (int)smem;
        }
        /* (another thread filling the cache meanwhile may leave a stale
         * count: a grid of another size, still correct) */
        const int nb = occ_blocks[hit];
        if (nb > 0 && sms > 0) grid_n = min(nbt, nb * sms);
    }
    dim3 grid(grid_n), block(GEMV_MMA_WARPS * 32);
    if (CL > 1) { /* whole clusters (a block past the tiles still stages its share of x) */
        grid.x = (unsigned)((grid_n + CL - 1) / CL * CL);
        return tbc_launch_cluster(kern, grid, block, smem, s, CL, x, w, bias, y, T, K, N, tiles, e, 0);
    }
    /* x staged per warp: by default int4's one-token steps (H100, 7B
     * shapes: qgemv_bench's int4 sum 78.3 -> 77.4 us; an 8-layer int4 b1
     * step within noise, ~0.5%; int8 / e4m3 even at one token, int8 2%
     * slower at 8 on variant 5) */
    const int xw = qgemv_xw >= 0 ? qgemv_xw : QT == QT_I4 && T == 1;
    return tbc_launch(kern, grid, block, smem, s, x, w, bias, y, T, K, N, tiles, e, xw);
}

/* qgemv_tma_kernel's launch (TB_CUDA_GEMV_TMA bits 4, 5 and 7): a block per
 * 16-row tile, NS slots (TMA_NS_SMALL with bit 3 and K < 8192); KS > 1:
 * clusters of KS blocks a tile, each a KS-th of its stages. Returns
 * cudaErrorNotSupported when x beside the ring would not fit. */
template <int QT, int MODE, bool NORM, int NS, int KS>
static cudaError_t qtma_launch_n(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K,
                                 int N, const tbc_gemv_epi &e, int tiles, cudaStream_t s) {
    /* sm_90's 227 KiB a block less the static arrays (red, red_ss, wss, the barriers) */
    constexpr int QTMA_MAX_SMEM = 232448 - 6144;
    const size_t row_bytes = QT == QT_I4 ? (size_t)K / 2 : (size_t)K;
    const int nst = (int)((row_bytes + TMA_CHB - 1) / TMA_CHB);
    const size_t smem = (size_t)min(NS, (nst + KS - 1) / KS) * 16 * TMA_RS + (size_t)T * qpipe_xstride<QT>(K) * 16;
    if (smem > (size_t)QTMA_MAX_SMEM) return cudaErrorNotSupported;
    auto kern = qgemv_tma_kernel<QT, MODE, NORM, NS, KS>;
    static int attr_done = 0; /* once per instantiation */
    if (!attr_done) {
        cudaError_t r = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, QTMA_MAX_SMEM);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    return tbc_launch_cluster(kern, dim3(tiles * KS), dim3((GEMV_MMA_WARPS + 1) * 32), smem, s, (unsigned)KS, x, w,
                              bias, y, T, K, N, e);
}
/* Tiles up to which bit 6 splits K in two (7B: o_proj and down_proj, 256
 * tiles, against qkv's 768 and gate|up's 1,376) */
#define QTMA_SPLIT_TILES 512
template <int QT, int MODE, int NS>
static cudaError_t qtma_launch_s(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K,
                                 int N, const tbc_gemv_epi &e, int tiles, cudaStream_t s) {
    const size_t row_bytes = QT == QT_I4 ? (size_t)K / 2 : (size_t)K;
    if ((gemv_tma & 64) && tiles <= QTMA_SPLIT_TILES && row_bytes > TMA_CHB) {
        if (e.norm) return qtma_launch_n<QT, MODE, true, NS, 2>(x, w, bias, y, T, K, N, e, tiles, s);
        return qtma_launch_n<QT, MODE, false, NS, 2>(x, w, bias, y, T, K, N, e, tiles, s);
    }
    if (e.norm) return qtma_launch_n<QT, MODE, true, NS, 1>(x, w, bias, y, T, K, N, e, tiles, s);
    return qtma_launch_n<QT, MODE, false, NS, 1>(x, w, bias, y, T, K, N, e, tiles, s);
}
template <int QT, int MODE>
static cudaError_t qtma_launch(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K, int N,
                               const tbc_gemv_epi &e, int tiles, cudaStream_t s) {
    if ((gemv_tma & 8) && K < 8192) return qtma_launch_s<QT, MODE, TMA_NS_SMALL>(x, w, bias, y, T, K, N, e, tiles, s);
    return qtma_launch_s<QT, MODE, TMA_NS>(x, w, bias, y, T, K, N, e, tiles, s);
}

/* The pipelined shapes (variants 4..9, 12, 13): rings of 4 steps; 4 one tile a
 * block, a block per tile; 5 one tile a block, persistent blocks (as many
 * as fit at once, each taking tiles in turn); 6 as 5 with two tiles a
 * block; 9 as 4 with a ring of 12 steps (for matrices of few tiles, where
 * the blocks an SM are few); 12 as 5 in clusters of two blocks that stage
 * x together (each reads half of it from L2 and stores it into both:
 * 8-token steps read ~34 MB of x a K-4096 GEMV before their first mma;
 * the 2..8-token default on sm_90, see qgemv_launch), 13 as 6 in such
 * clusters (12 where its shared memory does not fit). Rings of 8 steps (a block per tile or
 * persistent) and one persistent block an SM with an early PDL trigger
 * (rings of 8 or 12) were measured too and dropped: no faster alone, 10-13%
 * slower in the 7B step (docs/PERFORMANCE.md, "Deeper rings for few-tile
 * matrices"); variants 7, 8, 10 and 11 take 4. x takes
 * T * K * 2 bytes of shared memory: shapes where it does not fit take the
 * register-loading kernel. */
template <int QT, int MODE, bool NORM, bool GS>
static cudaError_t qpipe_launch_v(int v, const float *x, const tbc_qweight &w, const float *bias, float *y, int T,
                                  int K, int N, const tbc_gemv_epi &e, int tiles, cudaStream_t s) {
    if (v == 5) return qpipe_launch<QT, MODE, NORM, GS, 4, 1, 1>(x, w, bias, y, T, K, N, e, tiles, s);
    if (v == 6) return qpipe_launch<QT, MODE, NORM, GS, 4, 2, 1>(x, w, bias, y, T, K, N, e, tiles, s);
    if (v == 9) return qpipe_launch<QT, MODE, NORM, GS, 12, 1, 0>(x, w, bias, y, T, K, N, e, tiles, s);
    if (v == 12) return qpipe_launch<QT, MODE, NORM, GS, 4, 1, 1, 2>(x, w, bias, y, T, K, N, e, tiles, s);
    if (v == 13) return qpipe_launch<QT, MODE, NORM, GS, 4, 2, 1, 2>(x, w, bias, y, T, K, N, e, tiles, s);
    return qpipe_launch<QT, MODE, NORM, GS, 4, 1, 0>(x, w, bias, y, T, K, N, e, tiles, s);
}


template <int QT, int MODE>
static cudaError_t qgemv_launch(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K, int N,
                                const tbc_gemv_epi &e, cudaStream_t s) {
    if constexpr (QT != QT_I4) {
        if (T <= qgemv_simt_t) {
            if (T == 1)
                return e.norm ? qrow_launch_t<QT, 1, MODE, true>(x, w, bias, y, K, N, e, s)
                              : qrow_launch_t<QT, 1, MODE, false>(x, w, bias, y, K, N, e, s);
            return e.norm ? qrow_launch_t<QT, 2, MODE, true>(x, w, bias, y, K, N, e, s)
                          : qrow_launch_t<QT, 2, MODE, false>(x, w, bias, y, K, N, e, s);
        }
    }
    if constexpr (QT != QT_FP8) {
        /* x rounded to int8 per block of 32 (the engine's q8 tactic, or
         * variant 15 everywhere; one token) */
        if (T == 1 && (qgemv_variant == 15 || (e.q8 && qgemv_variant < 0)) && (QT != QT_I4 || w.group % 32 == 0)) {
            cudaError_t r = e.norm ? q8_launch<QT, MODE, true>(x, w, bias, y, K, N, e, s)
                                   : q8_launch<QT, MODE, false>(x, w, bias, y, K, N, e, s);
            if (r != cudaErrorNotSupported) return r;
        }
    }
    int pairs = MODE == TBC_EPI_PLAIN ? 0 : MODE == TBC_EPI_ADD ? (N + 1) / 2 : N / 2;
    int blocks = MODE == TBC_EPI_PLAIN ? (N + 15) / 16 : (pairs + 7) / 8;
    /* the pipelined kernel unless an older shape is forced (7B on the
     * H200, docs/PERFORMANCE.md: b1 int8 / e4m3 3.27 -> 2.68 ms with
     * variant 4, int4 3.10 -> 2.68 with 5; 2..8 tokens persistent, x staged
     * once a block serving many tiles: b8 int8 3.96 -> 3.71 with 5, int4
     * 5.18 -> 3.98 with 6); one token of a long-row matrix with few
     * tiles (7B down_proj: 4096 x 11008, 256 tiles) on a 12-step ring:
     * 17.5 -> 15.5 us, where o_proj's short rows (K 4096) gain nothing) */
    /* 2..8 tokens on compute capability 9.0: clusters of two sharing x's
     * staging (12; H200, qgemv_bench --t 8, a 7B layer's four GEMVs and the
     * logits: int8 127.3 -> 122.7 us, e4m3 127.0 -> 122.0, int4 91.0 (6) ->
     * 78.7, its down_proj 17.8 -> 14.2) */
    const int clusters = sm90_ok(); /* thread-block clusters */
    const int qv = qgemv_variant == 15 ? -1 : qgemv_variant; /* 15 above: one token, int8 / int4 */
    const int pv = qv >= 4 ? qv
                   : qv >= 0 ? 0
                   : T > 1 ? (clusters ? 12 : QT == QT_I4 ? 6 : 5)
                   : QT == QT_I4 ? 5
                   : K >= 8192 && blocks <= 512 ? 9 : 4;
    /* a pipelined shape whose shared memory does not fit returns
     * cudaErrorNotSupported: two tiles a block (6) then falls back to one
     * (5; int4's 8-token down_proj, x 176 KiB: 23.3 -> 17.6 us on the
     * H200, the 7B int4 b8 step 3.25 -> 3.07 ms), and that to the
     * register-loading kernel */
    /* the bulk-copy ring (TB_CUDA_GEMV_TMA bit 4: one token of int8 /
     * e4m3, bit 7: of int4, bit 5: 2..8 tokens; int4 with groups of a
     * multiple of 128 and no zeros; sm_90), unless a variant is forced;
     * where x does not fit beside the ring, the pipelined kernel. H100,
     * qgemv_bench --t 1 at a 7B layer's shapes and the logits: int8 132.5
     * -> 127.1 us, e4m3 132.1 -> 125.7 (down_proj 20.8 -> 18.2); int4
     * 78.0 -> 98.7, 8 tokens 156 -> 191 us (int8), so bits 4 and 3 only
     * by default (docs/GPU.md) */
    const int tma_bit = T > 1 ? 32 : QT == QT_I4 ? 128 : 16;
    if ((gemv_tma & tma_bit) && qv < 0 && (QT != QT_I4 || (w.group % 128 == 0 && !w.zeros)) && sm90_ok()) {
        cudaError_t r = qtma_launch<QT, MODE>(x, w, bias, y, T, K, N, e, blocks, s);
        if (r != cudaErrorNotSupported) return r;
    }
    for (int v = pv; v;) {
        cudaError_t r = cudaErrorNotSupported;
        bool done = false;
        if constexpr (QT == QT_I4) {
            if (w.group % 128 == 0 && !w.zeros) {
                r = e.norm ? qpipe_launch_v<QT, MODE, true, true>(v, x, w, bias, y, T, K, N, e, blocks, s)
                           : qpipe_launch_v<QT, MODE, false, true>(v, x, w, bias, y, T, K, N, e, blocks, s);
                done = true;
            }
        }
        if (!done)
            r = e.norm ? qpipe_launch_v<QT, MODE, true, false>(v, x, w, bias, y, T, K, N, e, blocks, s)
                       : qpipe_launch_v<QT, MODE, false, false>(v, x, w, bias, y, T, K, N, e, blocks, s);
        if (r != cudaErrorNotSupported) return r;
        v = v == 6 ? 5 : v == 13 ? 12 : 0;
    }
    if constexpr (QT == QT_I4) {
        if (w.group % 128 == 0 && !w.zeros) {
            if (e.norm) return qgemv_launch_u<QT, MODE, true, true>(x, w, bias, y, T, K, N, e, blocks, s);
            return qgemv_launch_u<QT, MODE, false, true>(x, w, bias, y, T, K, N, e, blocks, s);
        }
    }
    if (e.norm) return qgemv_launch_u<QT, MODE, true, false>(x, w, bias, y, T, K, N, e, blocks, s);
    return qgemv_launch_u<QT, MODE, false, false>(x, w, bias, y, T, K, N, e, blocks, s);
}

template <int QT>
static cudaError_t qgemv_dispatch(const float *x, const tbc_qweight &w, const float *bias, float *y, int T, int K,
                                  int N, const tbc_gemv_epi &e, cudaStream_t s) {
    switch (e.mode) {
    case TBC_EPI_PLAIN: return qgemv_launch<QT, TBC_EPI_PLAIN>(x, w, bias, y, T, K, N, e, s);
    case TBC_EPI_GLU: return qgemv_launch<QT, TBC_EPI_GLU>(x, w, bias, y, T, K, N, e, s);
    case TBC_EPI_ROPE: return qgemv_launch<QT, TBC_EPI_ROPE>(x, w, bias, y, T, K, N, e, s);
    case TBC_EPI_ADD: return qgemv_launch<QT, TBC_EPI_ADD>(x, w, bias, y, T, K, N, e, s);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t tbc_qgemv(const float *x, const tbc_qweight *w, const float *bias, float *y, int T, int K, int N,
                                 const tbc_gemv_epi *epi, cudaStream_t s) {
    if (!tbc_qgemv_supports(w, x, T, K) || N < 1) return cudaErrorInvalidValue;
    tbc_gemv_epi e{};
    if (epi) e = *epi;
    if (e.mode == TBC_EPI_GLU && N % 2) return cudaErrorInvalidValue;
    if (e.mode == TBC_EPI_ADD && (!e.res || !e.res_out)) return cudaErrorInvalidValue;
    if (e.mode == TBC_EPI_ROPE && (e.attn.hd < 2 || e.attn.hd % 2 || N != (e.attn.n_heads + 2 * e.attn.n_kv) * e.attn.hd))
        return cudaErrorInvalidValue;
    if (e.norm && e.norm_w && ((uintptr_t)e.norm_w & 15)) return cudaErrorInvalidValue;
    switch (w->type) {
    case TBC_Q_I8: return qgemv_dispatch<QT_I8>(x, *w, bias, y, T, K, N, e, s);
    case TBC_Q_FP8: return qgemv_dispatch<QT_FP8>(x, *w, bias, y, T, K, N, e, s);
    case TBC_Q_I4: return qgemv_dispatch<QT_I4>(x, *w, bias, y, T, K, N, e, s);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t tbc_dequant_f16(const tbc_qweight *w, int K, int N, void *out, cudaStream_t s) {
    if (K < 1 || N < 1 || (w->type == TBC_Q_I4 && (K % 2 || w->group < 1 || K % w->group))) return cudaErrorInvalidValue;
    /* the vector path reads 4 or 8 bytes of codes and writes 16 bytes */
    const int vec = K % 8 == 0 && !(((uintptr_t)w->codes | (uintptr_t)out) & 15) &&
                    (w->type != TBC_Q_I4 || w->group % 8 == 0);
    size_t n = vec ? (size_t)N * K / 8 : (size_t)N * K;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    return tbc_launch(dequant_f16_kernel, dim3((unsigned)blocks), dim3(256), 0, s, *w, K, N, vec,
                      static_cast<__half *>(out));
}

/* ---------------------------------------------------------------- fp8 GEMM helpers
 * Steps of more than TBC_GEMV_MAX_T tokens with e4m3 weights run on the FP8
 * tensor cores (cuBLASLt, in cuda_backend.c): x is quantised to e4m3 with one
 * scale per token (absmax / 448, dynamic: no calibration needed and no
 * token's range clipped by another's), and the f32 product of the codes is
 * then scaled by both scales. */
__global__ void quant_x_fp8_kernel(const float *__restrict__ x, int K, unsigned char *__restrict__ q,
                                   float *__restrict__ sx) {
    __shared__ float wmax[32];
    tbc_pdl_wait();
    const int t = blockIdx.x;
    const float *r = x + (size_t)t * K;
    float m = 0.0f;
    /* K % 16 == 0 and 16-byte aligned rows (fp8_gemm_ok): four floats a load, four codes a store */
    const float4 *r4 = reinterpret_cast<const float4 *>(r);
    const int K4 = K >> 2;
    for (int k = threadIdx.x; k < K4; k += blockDim.x) {
        const float4 v = r4[k];
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, wmax[i]);
    const float s = m > 0.0f ? m / 448.0f : 1.0f, inv = 1.0f / s;
    if (threadIdx.x == 0) sx[t] = m > 0.0f ? s : 0.0f;
    unsigned int *qr = reinterpret_cast<unsigned int *>(q + (size_t)t * K);
    for (int k = threadIdx.x; k < K4; k += blockDim.x) qr[k] = tbc_e4m3x4(r4[k], inv);
}

/* y (T, N) *= sx[t] * sw[n], + bias[n]: one block row per token, N % 16 == 0
 * (fp8_gemm_ok), four outputs a thread and load. */
__global__ void scale_out_kernel(float *__restrict__ y, int T, int N, const float *__restrict__ sx,
                                 const float *__restrict__ sw, const float *__restrict__ bias) {
    tbc_pdl_wait();
    const int t = blockIdx.y;
    const float st = sx[t];
    float4 *yr = reinterpret_cast<float4 *>(y + (size_t)t * N);
    const float4 *w4 = reinterpret_cast<const float4 *>(sw);
    const float4 *b4 = reinterpret_cast<const float4 *>(bias);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (N >> 2); i += gridDim.x * blockDim.x) {
        float4 v = yr[i];
        const float4 w = w4[i];
        v.x *= st * w.x;
        v.y *= st * w.y;
        v.z *= st * w.z;
        v.w *= st * w.w;
        if (bias) {
            const float4 b = b4[i];
            v.x += b.x;
            v.y += b.y;
            v.z += b.z;
            v.w += b.w;
        }
        yr[i] = v;
    }
}

extern "C" cudaError_t tbc_quant_x_fp8(const float *x, int T, int K, void *q, float *sx, cudaStream_t s) {
    if (T < 1 || K < 1) return cudaErrorInvalidValue;
    return tbc_launch(quant_x_fp8_kernel, dim3(T), dim3(256), 0, s, x, K, static_cast<unsigned char *>(q), sx);
}

extern "C" cudaError_t tbc_scale_out(float *y, int T, int N, const float *sx, const float *sw, const float *bias,
                                     cudaStream_t s) {
    if (T < 1 || N < 1 || N % 4 || T > 65535 || ((uintptr_t)y | (uintptr_t)sw | (uintptr_t)bias) & 15)
        return cudaErrorInvalidValue;
    unsigned bx = (unsigned)((N / 4 + 255) / 256);
    return tbc_launch(scale_out_kernel, dim3(bx, (unsigned)T), dim3(256), 0, s, y, T, N, sx, sw, bias);
}
