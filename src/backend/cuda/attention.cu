/* attention.cu — paged causal GQA attention of one layer, with RoPE and the
 * KV-cache write in front of it.
 *
 *   rope_kv_kernel   one block per (token, kv head) (one per token in long
 *                    steps, rope_kv_tok_kernel): rotates the token's q
 *                    heads of that group in place (qkv is consumed only by
 *                    this op) and stores k rotated and v at (seq[t],
 *                    pos[t]) in the paged cache (not back into qkv).
 *   attn_kernel      one block per (head, token, split): online softmax over
 *                    the split's range of the sequence's keys. The head of hd
 *                    values is spread over a group of S lanes (S the largest
 *                    power of two dividing hd, at most 32; EPL = hd / S values
 *                    per lane), so a warp scores 32 / S keys at once and tiny
 *                    heads (hd = 8) still use whole warps. Groups, then warps,
 *                    merge their (max, sum, output) triples. f16 / bf16
 *                    caches are read 16 bytes a load and rescale the running
 *                    output only at a new running max.
 *   combine          with n_splits > 1 (decode "flash-decoding"): the last
 *                    block of a (token, head) to finish (an atomic counter
 *                    per pair) merges the splits' partial triples. With
 *                    split_min, a (token, head) whose context is short uses
 *                    fewer splits (one per split_min keys) and the blocks
 *                    of the unused splits return at once (attn_split.h:
 *                    the ranges, and only splits that have keys in use).
 *   attn_mma_kernel  (hd 128, f16 / e4m3 caches) the same blocks with 16-key
 *                    tiles scored and summed on the tensor cores;
 *                    attn_mma_pipe_kernel the same with each warp's tiles
 *                    copied ahead into shared memory (cp.async).
 * With rope_done the qkv GEMV's epilogue has done rope_kv's work.
 *
 * int8 and fp8 (e4m3) caches (core/kv_layout.h): rope_kv quantises each
 * (token, kv head) row with one warp (absmax, scale, codes: the bytes of
 * tb_ref_kv_quantize), attn_kernel reads one-byte codes with one vector load
 * per lane, two keys a group a pass (both keys' loads in flight together),
 * and applies the row's f32 scale once per key (to the dot product, and to
 * the probability that weights the value row); the flash prefill and the
 * GEMM prefill's gather dequantise into f16.
 */
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/attn_split.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"

#define ATTN_WARPS 4
#define ATTN_MAX_HD 256

/* ---------------------------------------------------------------- int8 / fp8 rows
 * A row is the hd values of one (token, kv head): hd one-byte codes and an
 * f32 scale (kv_layout.h). Writing gives the bytes tb_ref_kv_quantize gives
 * for the same f32 row: scale = absmax / qmax and codes of x * (qmax /
 * absmax) (0 for a row of zeros), IEEE round-to-nearest throughout (the
 * explicit _rn intrinsics keep it so whatever the compile flags); int8
 * rounds half to even (rintf) and clamps to +-127; e4m3 is the hardware's
 * cvt.rn.satfinite: round to nearest even, saturating at +-448, as
 * dtype.c's f32_to_fp8_e4m3 (a NaN becomes 0x7f, where dtype.c keeps its
 * sign). */

/* The e4m3 or int8 code of v (in code units). */
__device__ __forceinline__ uint8_t kv_encode(float v, int kv_q) {
    if (kv_q == TBC_KVQ_I8) return (uint8_t)(int8_t)__float2int_rn(fminf(fmaxf(rintf(v), -127.0f), 127.0f));
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

/* The value of code c (without the row's scale); exact in f32. */
__device__ __forceinline__ float kv_decode(uint8_t c, int kv_q) {
    if (kv_q == TBC_KVQ_I8) return (float)((int)c - ((int)(c & 0x80u) << 1)); /* sign-extended byte */
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
}

/* A quantised row's scale from the lanes' partial absmax values: the
 * warp's absmax by shuffles, lane 0 stores absmax / qmax at *scale, and
 * every lane gets qmax / absmax (0 for a row of zeros) to code its values
 * with. Called by all 32 lanes of a warp together. */
__device__ __forceinline__ float kv_warp_inv(float amax, int kv_q, float *scale) {
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float qmax = kv_q == TBC_KVQ_I8 ? 127.0f : 448.0f;
    if ((threadIdx.x & 31) == 0) *scale = __fdiv_rn(amax, qmax);
    return amax > 0.0f ? __fdiv_rn(qmax, amax) : 0.0f;
}

/* Quantises the row x (hd f32) into codes (hd bytes) and *scale. Called by
 * all 32 lanes of a warp together (shuffles). */
__device__ void kv_quantize_row_warp(const float *x, int hd, int kv_q, uint8_t *codes, float *scale) {
    const int lane = threadIdx.x & 31;
    float amax = 0.0f; /* fmaxf skips a NaN, as the reference's comparison does */
    for (int d = lane; d < hd; d += 32) amax = fmaxf(amax, fabsf(x[d]));
    const float inv = kv_warp_inv(amax, kv_q, scale);
    for (int d = lane; d < hd; d += 32) codes[d] = kv_encode(__fmul_rn(x[d], inv), kv_q);
}

/* ---------------------------------------------------------------- rope + kv write */

/* One block per (token t, kv head h), one warp per head of the G = H / KV
 * query heads of h's group, k's head h and v's head h (blockDim 32 (G + 2),
 * rope_kv_threads). A lane holds the rotation pairs (j, j + half) (or (2j,
 * 2j + 1) interleaved) for j = lane, lane + 32, ... (PAIRS of them: hd <=
 * 64 PAIRS) in registers: all its loads (the row's values, the FP8 GEMM's
 * scales and bias, the frequencies, the position and the cache block) are
 * issued before any store, then the scales and the rotation, then one
 * write a value (rope_store_row). q heads are written back rotated (f16
 * when the input is the f16 raw product, ys_raw16: the attention kernels
 * then read q16); k and v only go to the cache at (seq[t], pos[t]),
 * quantised by their warp for an int8 / fp8 cache (absmax by shuffles; the
 * bytes of kv_quantize_row_warp). (One block per token serialised the whole
 * token's rows: 26 us a 7B layer with an fp8 cache at batch 1; separate
 * passes for the scales, the rotation and the cache, each through global
 * memory, made the 512-token prefill's kernel 25-32 us a layer; blocks of
 * 2-8 tokens changed nothing there.) Long steps take rope_kv_tok_kernel. */
template <int PAIRS>
__device__ __forceinline__ void rope_store_row(const tbc_attn_args &a, float *qkv, const float *x0, const float *x1,
                                               float amax, int gh, int G, int h, size_t hr, int p, int blk) {
    const int lane = threadIdx.x & 31, half = a.hd / 2, hd = a.hd, KV = a.n_kv;
    if (gh < G) { /* q: back into qkv */
#pragma unroll
        for (int u = 0; u < PAIRS; u++) {
            const int j = lane + 32 * u;
            if (j >= half) break;
            const size_t e0 = hr + (a.interleaved ? 2 * j : j), e1 = hr + (a.interleaved ? 2 * j + 1 : j + half);
            if (a.ys_raw16) {
                ((__half *)qkv)[e0] = __float2half_rn(x0[u]);
                ((__half *)qkv)[e1] = __float2half_rn(x1[u]);
            } else {
                qkv[e0] = x0[u];
                qkv[e1] = x1[u];
            }
        }
        return;
    }
    /* k (gh == G) or v: into the cache */
    void *cache = gh == G ? a.k_cache : a.v_cache;
    if (a.kv_q) {
        const size_t r = (size_t)(p % a.block_size) * KV + h; /* (row, head h) of the block */
        uint8_t *b = (uint8_t *)cache + (size_t)blk * a.kv_block_bytes, *codes = b + r * hd;
        const float inv = kv_warp_inv(amax, a.kv_q, (float *)(b + a.kv_scale_off) + r);
#pragma unroll
        for (int u = 0; u < PAIRS; u++) {
            const int j = lane + 32 * u;
            if (j >= half) break;
            const int i0 = a.interleaved ? 2 * j : j, i1 = a.interleaved ? 2 * j + 1 : j + half;
            codes[i0] = kv_encode(__fmul_rn(x0[u], inv), a.kv_q);
            codes[i1] = kv_encode(__fmul_rn(x1[u], inv), a.kv_q);
        }
        return;
    }
    const size_t base = (((size_t)blk * a.block_size + (size_t)(p % a.block_size)) * (size_t)KV + h) * (size_t)hd;
#pragma unroll
    for (int u = 0; u < PAIRS; u++) {
        const int j = lane + 32 * u;
        if (j >= half) break;
        const size_t e0 = base + (a.interleaved ? 2 * j : j), e1 = base + (a.interleaved ? 2 * j + 1 : j + half);
        if (a.kv_f16) {
            ((__half *)cache)[e0] = __float2half_rn(x0[u]);
            ((__half *)cache)[e1] = __float2half_rn(x1[u]);
        } else if (a.kv_bf16) {
            ((__nv_bfloat16 *)cache)[e0] = __float2bfloat16_rn(x0[u]);
            ((__nv_bfloat16 *)cache)[e1] = __float2bfloat16_rn(x1[u]);
        } else {
            ((float *)cache)[e0] = x0[u];
            ((float *)cache)[e1] = x1[u];
        }
    }
}

template <int PAIRS>
__global__ void rope_kv_kernel(tbc_attn_args a, float *qkv) {
    tbc_pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y, hd = a.hd, half = hd / 2, H = a.n_heads, KV = a.n_kv;
    const int G = H / KV, lane = threadIdx.x & 31;
    const size_t row0 = (size_t)t * (size_t)(H + 2 * KV) * hd; /* element offset of token t's row */
    const int p = a.pos[t];
    const int blk = a.block_tables[(size_t)a.seq[t] * a.max_blocks + p / a.block_size];
    const float st = a.ys_sw ? a.ys_sx[t] * (a.ys_raw16 ? a.ys_mul : 1.0f) : 1.0f;
    for (int gh = threadIdx.x >> 5; gh < G + 2; gh += blockDim.x >> 5) {
        const int head = gh < G ? h * G + gh : gh == G ? H + h : H + KV + h;
        const size_t hr = row0 + (size_t)head * hd;
        float x0[PAIRS], x1[PAIRS], w0[PAIRS], w1[PAIRS], b0[PAIRS], b1[PAIRS], ang[PAIRS];
#pragma unroll
        for (int u = 0; u < PAIRS; u++) { /* loads */
            const int j = lane + 32 * u;
            if (j >= half) break;
            const int i0 = a.interleaved ? 2 * j : j, i1 = a.interleaved ? 2 * j + 1 : j + half;
            if (a.ys_raw16) {
                x0[u] = __half2float(((const __half *)qkv)[hr + i0]);
                x1[u] = __half2float(((const __half *)qkv)[hr + i1]);
            } else {
                x0[u] = qkv[hr + i0];
                x1[u] = qkv[hr + i1];
            }
            if (a.ys_sw) {
                w0[u] = a.ys_sw[head * hd + i0];
                w1[u] = a.ys_sw[head * hd + i1];
                b0[u] = a.ys_bias ? a.ys_bias[head * hd + i0] : 0.0f;
                b1[u] = a.ys_bias ? a.ys_bias[head * hd + i1] : 0.0f;
            }
            ang[u] = a.inv_freq[j];
        }
        float amax = 0.0f; /* fmaxf skips a NaN, as the reference's comparison does */
#pragma unroll
        for (int u = 0; u < PAIRS; u++) { /* the scales, the rotation */
            const int j = lane + 32 * u;
            if (j >= half) break;
            float v0 = x0[u], v1 = x1[u];
            if (a.ys_sw) { /* the FP8 GEMM's scales (and bias) first */
                v0 *= st * w0[u];
                v1 *= st * w1[u];
                if (a.ys_bias) {
                    v0 += b0[u];
                    v1 += b1[u];
                }
            }
            if (gh <= G) { /* q heads and k: rotated */
                float sn, cs;
                sincosf((float)p * ang[u], &sn, &cs);
                const float r0 = v0 * cs - v1 * sn, r1 = v0 * sn + v1 * cs;
                v0 = r0;
                v1 = r1;
            }
            x0[u] = v0;
            x1[u] = v1;
            amax = fmaxf(amax, fmaxf(fabsf(v0), fabsf(v1)));
        }
        rope_store_row<PAIRS>(a, qkv, x0, x1, amax, gh, G, h, hr, p, blk);
    }
}

/* Threads of rope_kv_kernel's block: a warp per head of the group's G + 2. */
static unsigned rope_kv_threads(const tbc_attn_args *a) {
    int heads = a->n_heads / a->n_kv + 2;
    return 32u * (unsigned)(heads < 32 ? heads : 32);
}

/* Long steps: blocks of ROPE_TOK_THREADS, grid (group of nt <= TT tokens,
 * group of 2 nw heads). A warp takes two of the H + 2 KV heads for the
 * block's nt tokens: the heads' FP8 GEMM scales once, every token's values
 * all issued before anything else (raw: an f16 pair a 32-bit register), so
 * that a warp holds 2 nt rows' loads in flight and makes one round trip to
 * memory. A lane takes two neighbouring rotation pairs j0 = 2 lane + 64 u
 * and j0 + 1 (U = hd / 128 rounded up), so that every access is a pair of
 * adjacent elements: (j0, j0 + 1) and (j0 + half, ...) in the halves
 * layout, (2 j0, 2 j0 + 1) and (2 j0 + 2, ...) interleaved; the block
 * computes each (token, pair)'s sin and cos once (sincosf into shared
 * memory while the loads are in flight). hd % 4 == 0. The arithmetic and
 * the bytes written are rope_kv_kernel's. (A lane a pair and a 2-byte
 * access each, and sin / cos per head, kept the SM's issue 54-65% busy at
 * 0.5 TB/s: 26-31 us a 7B layer at 512 tokens; a block a token whose warps
 * looped over the heads (six rounds of load, rotate, store) 17.3 us; a
 * block a (token, 16 heads), 4 KB of loads in flight a warp, 17.8 us.) */
#define ROPE_TOK_THREADS 256
#define ROPE_TT 8
__device__ __forceinline__ float2 rope_ld2(const void *p, size_t i, int f16) {
    if (f16) return __half22float2(*(const __half2 *)((const __half *)p + i));
    return *(const float2 *)((const float *)p + i);
}
__device__ __forceinline__ void rope_st2(void *p, size_t i, float2 v, int kind) { /* 0 f32, 1 f16, 2 bf16 */
    if (kind == 1) *(__half2 *)((__half *)p + i) = __floats2half2_rn(v.x, v.y);
    else if (kind == 2) *(__nv_bfloat162 *)((__nv_bfloat16 *)p + i) = __floats2bfloat162_rn(v.x, v.y);
    else *(float2 *)((float *)p + i) = v;
}
/* two adjacent values as loaded: an f16 pair (F16) or two f32 */
template <bool F16> struct rope_raw { typedef float2 type; };
template <> struct rope_raw<true> { typedef __half2 type; };
__device__ __forceinline__ float2 rope_widen(float2 v) { return v; }
__device__ __forceinline__ float2 rope_widen(__half2 v) { return __half22float2(v); }

template <int U, bool F16> struct rope_tt_of { enum { n = ROPE_TT / (U * (F16 ? 1 : 2)) }; }; /* 32 registers of values */

template <int U, bool F16>
__global__ void __launch_bounds__(ROPE_TOK_THREADS, 3) rope_kv_tok_kernel(tbc_attn_args a, float *qkv, int ntt) {
    typedef typename rope_raw<F16>::type raw_t;
    enum { TT = rope_tt_of<U, F16>::n };
    __shared__ __align__(16) float2 rope_cs[TT][ATTN_MAX_HD / 2]; /* (cos, sin) of a token's pairs */
    tbc_pdl_wait();
    const int hd = a.hd, half = hd / 2, H = a.n_heads, KV = a.n_kv, nh = H + 2 * KV;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, il = a.interleaved;
    const int t0 = (int)blockIdx.x * ntt, nt = min(ntt, a.T - t0);
    /* element offsets of a lane's two accesses within a head */
    int o0[U], o1[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j0 = 2 * lane + 64 * u;
        o0[u] = il ? 2 * j0 : j0;
        o1[u] = il ? 2 * j0 + 2 : j0 + half;
    }
    const int hb = (int)blockIdx.y * 2 * nw + 2 * warp; /* the warp's two heads hb, hb + 1 */
    raw_t va[TT][2][U], vb[TT][2][U];
    float2 wa[2][U], wb[2][U];
#pragma unroll
    for (int c = 0; c < 2; c++) { /* loads of both heads, before the barrier */
        const int head = hb + c;
        if (head >= nh) break;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (2 * lane + 64 * u >= half) break;
            if (a.ys_sw) {
                wa[c][u] = *(const float2 *)(a.ys_sw + head * hd + o0[u]);
                wb[c][u] = *(const float2 *)(a.ys_sw + head * hd + o1[u]);
            }
#pragma unroll
            for (int tt = 0; tt < TT; tt++) {
                if (tt >= nt) break;
                const size_t hr = ((size_t)(t0 + tt) * nh + head) * hd;
                va[tt][c][u] = reinterpret_cast<const raw_t *>(qkv)[(hr + o0[u]) >> 1];
                vb[tt][c][u] = reinterpret_cast<const raw_t *>(qkv)[(hr + o1[u]) >> 1];
            }
        }
    }
    for (int i = threadIdx.x; i < nt * half; i += blockDim.x) { /* one sincosf a (token, pair) for the block */
        const int tt = i / half, j = i - tt * half;
        float sn, cs;
        sincosf((float)a.pos[t0 + tt] * a.inv_freq[j], &sn, &cs);
        rope_cs[tt][j] = make_float2(cs, sn);
    }
    __syncthreads();
    if (hb >= nh) return;
#pragma unroll
    for (int tt = 0; tt < TT; tt++) {
        if (tt >= nt) break;
        const int t = t0 + tt, p = a.pos[t];
        const int blk = a.block_tables[(size_t)a.seq[t] * a.max_blocks + p / a.block_size];
        const float st = a.ys_sw ? a.ys_sx[t] * (F16 ? a.ys_mul : 1.0f) : 1.0f;
        const size_t row0 = (size_t)t * (size_t)nh * hd;
        const size_t kvrow = ((size_t)blk * a.block_size + (size_t)(p % a.block_size)) * (size_t)KV; /* cache row of head 0 */
        float cs[U][2], sn[U][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j0 = 2 * lane + 64 * u;
            cs[u][0] = cs[u][1] = 1.0f;
            sn[u][0] = sn[u][1] = 0.0f;
            if (j0 < half) {
                const float4 r = *(const float4 *)&rope_cs[tt][j0]; /* pairs j0, j0 + 1 (j0 even) */
                cs[u][0] = r.x;
                sn[u][0] = r.y;
                cs[u][1] = r.z;
                sn[u][1] = r.w;
            }
        }
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int head = hb + c;
            if (head >= nh) break;
            const int kind = head < H ? 0 : head < H + KV ? 1 : 2; /* q, k, v */
            float amax = 0.0f; /* fmaxf skips a NaN, as the reference's comparison does */
            float2 ra[U], rb[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (2 * lane + 64 * u >= half) break;
                float2 A = rope_widen(va[tt][c][u]), B = rope_widen(vb[tt][c][u]);
                if (a.ys_sw) { /* the FP8 GEMM's scales (and bias) first */
                    A.x *= st * wa[c][u].x;
                    A.y *= st * wa[c][u].y;
                    B.x *= st * wb[c][u].x;
                    B.y *= st * wb[c][u].y;
                    if (a.ys_bias) {
                        const float2 ba = *(const float2 *)(a.ys_bias + head * hd + o0[u]);
                        const float2 bb = *(const float2 *)(a.ys_bias + head * hd + o1[u]);
                        A.x += ba.x;
                        A.y += ba.y;
                        B.x += bb.x;
                        B.y += bb.y;
                    }
                }
                /* the pairs (v0, v1) of j0 and j0 + 1 */
                float v00 = A.x, v01 = il ? A.y : B.x; /* pair j0 */
                float v10 = il ? B.x : A.y, v11 = B.y;  /* pair j0 + 1 */
                if (kind < 2) {
                    const float r00 = v00 * cs[u][0] - v01 * sn[u][0], r01 = v00 * sn[u][0] + v01 * cs[u][0];
                    const float r10 = v10 * cs[u][1] - v11 * sn[u][1], r11 = v10 * sn[u][1] + v11 * cs[u][1];
                    v00 = r00;
                    v01 = r01;
                    v10 = r10;
                    v11 = r11;
                }
                amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v00), fabsf(v01)), fmaxf(fabsf(v10), fabsf(v11))));
                ra[u] = il ? make_float2(v00, v01) : make_float2(v00, v10);
                rb[u] = il ? make_float2(v10, v11) : make_float2(v01, v11);
            }
            if (kind == 0) { /* q: back into qkv */
                const size_t hr = row0 + (size_t)head * hd;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (2 * lane + 64 * u >= half) break;
                    rope_st2(qkv, hr + o0[u], ra[u], F16);
                    rope_st2(qkv, hr + o1[u], rb[u], F16);
                }
                continue;
            }
            const int h = kind == 1 ? head - H : head - H - KV;
            void *cache = kind == 1 ? a.k_cache : a.v_cache;
            if (a.kv_q) {
                const size_t r = (size_t)(p % a.block_size) * KV + h; /* (row, head h) of the block */
                uint8_t *bp = (uint8_t *)cache + (size_t)blk * a.kv_block_bytes, *codes = bp + r * hd;
                const float inv = kv_warp_inv(amax, a.kv_q, (float *)(bp + a.kv_scale_off) + r);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (2 * lane + 64 * u >= half) break;
                    uchar2 ca, cb;
                    ca.x = kv_encode(__fmul_rn(ra[u].x, inv), a.kv_q);
                    ca.y = kv_encode(__fmul_rn(ra[u].y, inv), a.kv_q);
                    cb.x = kv_encode(__fmul_rn(rb[u].x, inv), a.kv_q);
                    cb.y = kv_encode(__fmul_rn(rb[u].y, inv), a.kv_q);
                    *(uchar2 *)(codes + o0[u]) = ca;
                    *(uchar2 *)(codes + o1[u]) = cb;
                }
                continue;
            }
            const size_t base = (kvrow + (size_t)h) * (size_t)hd;
            const int ck = a.kv_f16 ? 1 : a.kv_bf16 ? 2 : 0;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (2 * lane + 64 * u >= half) break;
                rope_st2(cache, base + o0[u], ra[u], ck);
                rope_st2(cache, base + o1[u], rb[u], ck);
            }
        }
    }
}

/* Steps of at least rope_tok_min tokens take rope_kv_tok_kernel
 * (TB_CUDA_ROPE_TOK=n sets it, 0: never; default 64), its blocks
 * rope_tt tokens each (TB_CUDA_ROPE_TT, 1..ROPE_TT; 0: T / 32 of them),
 * at least one and at most the kernel's TT. */
static int rope_tok_min = 64, rope_tt = 0;
extern "C" void tbc_set_rope_tok(int n, int tt) {
    rope_tok_min = n >= 0 ? n : 64;
    rope_tt = tt >= 1 && tt <= ROPE_TT ? tt : 0;
}

template <int U, bool F16>
static cudaError_t rope_kv_tok_launch(const tbc_attn_args *a, float *qkv, cudaStream_t s) {
    const int per = 2 * (ROPE_TOK_THREADS / 32), nh = a->n_heads + 2 * a->n_kv; /* heads a block */
    const int tm = rope_tt_of<U, F16>::n, want = rope_tt ? rope_tt : a->T / 32;
    const int ntt = want < 1 ? 1 : want > tm ? tm : want;
    const dim3 g((a->T + ntt - 1) / ntt, (nh + per - 1) / per);
    return tbc_launch(rope_kv_tok_kernel<U, F16>, g, dim3(ROPE_TOK_THREADS), 0, s, *a, qkv, ntt);
}

template <int PAIRS>
static cudaError_t rope_kv_launch_p(const tbc_attn_args *a, float *qkv, cudaStream_t s) {
    return tbc_launch(rope_kv_kernel<PAIRS>, dim3(a->T, a->n_kv), dim3(rope_kv_threads(a)), 0, s, *a, qkv);
}

static cudaError_t rope_kv_launch(const tbc_attn_args *a, float *qkv, cudaStream_t s) {
    if (rope_tok_min > 0 && a->T >= rope_tok_min && a->hd % 4 == 0) {
        const int U2 = ATTN_MAX_HD / 128;
        if (a->hd <= 128) return a->ys_raw16 ? rope_kv_tok_launch<1, true>(a, qkv, s) : rope_kv_tok_launch<1, false>(a, qkv, s);
        return a->ys_raw16 ? rope_kv_tok_launch<U2, true>(a, qkv, s) : rope_kv_tok_launch<U2, false>(a, qkv, s);
    }
    if (a->hd <= 64) return rope_kv_launch_p<1>(a, qkv, s);
    if (a->hd <= 128) return rope_kv_launch_p<2>(a, qkv, s);
    return rope_kv_launch_p<ATTN_MAX_HD / 64>(a, qkv, s);
}

/* ---------------------------------------------------------------- attention */

/* Cache element types of the attention kernel's KVT parameter. */
#define KVT_F32 0
#define KVT_F16 1
#define KVT_BF16 2
#define KVT_I8 3  /* int8 codes and per-row f32 scales (kv_layout.h) */
#define KVT_FP8 4 /* e4m3 codes likewise */

/* EPL consecutive cache values from element offset off, as f32. */
template <int EPL, int KVT>
__device__ __forceinline__ void load_kv(const void *base, size_t off, float *f) {
    if (KVT == KVT_BF16) {
        const __nv_bfloat16 *p = (const __nv_bfloat16 *)base + off;
        if (EPL % 2 == 0) {
#pragma unroll
            for (int i = 0; i < EPL / 2; i++) {
                float2 v = __bfloat1622float2(((const __nv_bfloat162 *)p)[i]);
                f[2 * i] = v.x;
                f[2 * i + 1] = v.y;
            }
        } else {
#pragma unroll
            for (int i = 0; i < EPL; i++) f[i] = __bfloat162float(p[i]);
        }
    } else if (KVT == KVT_F16) {
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

/* NB bytes (a multiple of 4) from p, aligned to min(NB, 16) or to the
 * largest of 16, 8, 4 dividing NB, as NB / 4 words: 16-byte loads where
 * NB allows, else 8- or 4-byte ones. CG: through L2 only (ld.global.cg),
 * for bytes the previous kernel wrote after this one may have put their
 * line in L1 (the decode kernels' early loads). */
template <int NB, bool CG = false>
__device__ __forceinline__ void load_words(const void *p, uint32_t *w) {
    static_assert(NB % 4 == 0, "whole words");
    if (NB % 16 == 0) {
#pragma unroll
        for (int i = 0; i < NB / 16; i++) {
            uint4 u = CG ? __ldcg((const uint4 *)p + i) : ((const uint4 *)p)[i];
            w[4 * i] = u.x; w[4 * i + 1] = u.y; w[4 * i + 2] = u.z; w[4 * i + 3] = u.w;
        }
    } else if (NB % 8 == 0) {
#pragma unroll
        for (int i = 0; i < NB / 8; i++) {
            uint2 u = CG ? __ldcg((const uint2 *)p + i) : ((const uint2 *)p)[i];
            w[2 * i] = u.x; w[2 * i + 1] = u.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < NB / 4; i++) w[i] = CG ? __ldcg((const unsigned int *)p + i) : ((const uint32_t *)p)[i];
    }
}

/* EPL consecutive int8 / e4m3 codes from p as (EPL + 3) / 4 words (first
 * code in the low byte; the row's scale is the caller's): one 16-, 8-, 4- or 2-byte load per 16, 8, 4 or 2
 * codes. p is aligned to that: a row of hd codes starts at a multiple of hd
 * bytes in a block of a multiple of 64 bytes, and a lane reads at li * EPL
 * where hd = S * EPL. */
template <int EPL>
__device__ __forceinline__ void load_code_words(const uint8_t *p, uint32_t *w) { /* (EPL + 3) / 4 words */
    constexpr int NW = (EPL + 3) / 4;
    if constexpr (EPL % 4 == 0) {
        load_words<EPL>(p, w);
    } else if (EPL % 2 == 0) {
#pragma unroll
        for (int i = 0; i < NW; i++) w[i] = 0;
#pragma unroll
        for (int i = 0; i < EPL / 2; i++) w[i / 2] |= (uint32_t)((const uint16_t *)p)[i] << (16 * (i % 2));
    } else {
#pragma unroll
        for (int i = 0; i < NW; i++) w[i] = 0;
#pragma unroll
        for (int i = 0; i < EPL; i++) w[i / 4] |= (uint32_t)p[i] << (8 * (i % 4));
    }
}

/* The EPL codes of w (4 a word, first code in the low byte) as f32 code
 * values. */
template <int EPL, int KVT>
__device__ __forceinline__ void decode_code_words(const uint32_t *w, float *f) {
    if (KVT == KVT_I8) { /* byte by byte (as pairs: 8 bytes of stack at EPL 16) */
#pragma unroll
        for (int i = 0; i < EPL; i++) f[i] = kv_decode((uint8_t)(w[i / 4] >> (8 * (i % 4))), TBC_KVQ_I8);
        return;
    }
#pragma unroll
    for (int i = 0; i < EPL / 2; i++) {
        const float2 v = tbc_kv_codes2<TBC_KVQ_FP8>(w[i / 2] >> (16 * (i % 2)));
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
    if (EPL % 2) f[EPL - 1] = kv_decode((uint8_t)(w[(EPL - 1) / 4] >> (8 * ((EPL - 1) % 4))), TBC_KVQ_FP8);
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
 * blocks wrote them). Called by whole warps (every thread of the block).
 * Up to 32 splits: lane s of each warp loads split s's (max, sum) while
 * every thread loads its first element's values of the first COMBINE_CH
 * splits, all at once (one round of L2 latency, where a loop over the
 * splits for the max, then the sum, then the values took several); the
 * max and the sum by shuffles, each split's weight from its lane. */
#define COMBINE_CH 12
__device__ void combine(const tbc_attn_args &a, int t, int h, int ns, float *out, int tid, int nt) {
    const int hd = a.hd, H = a.n_heads, lane = tid & 31;
    const float *p = a.partial + ((size_t)t * H + h) * a.n_splits * (size_t)(hd + 2);
    float *o = out + ((size_t)t * H + h) * hd;
    if (ns <= 32 && !a.merge_loop) {
        float pv[COMBINE_CH];
#pragma unroll
        for (int i = 0; i < COMBINE_CH; i++) pv[i] = i < ns && tid < hd ? __ldcg(p + (size_t)i * (hd + 2) + tid) : 0.0f;
        /* (max, sum) at hd, hd + 1: 8-byte aligned (hd even) */
        const float2 ml = lane < ns ? __ldcg(reinterpret_cast<const float2 *>(p + (size_t)lane * (hd + 2) + hd))
                                    : make_float2(-INFINITY, 0.0f);
        float M = ml.x;
#pragma unroll
        for (int k = 16; k > 0; k >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, k));
        const float w = ml.x == -INFINITY ? 0.0f : __expf(ml.x - M); /* lane s: split s's weight */
        float L = ml.y * w;
#pragma unroll
        for (int k = 16; k > 0; k >>= 1) L += __shfl_xor_sync(0xffffffffu, L, k);
        for (int e0 = tid - lane; e0 < hd; e0 += nt) { /* warp-uniform: the shuffles below */
            const int e = e0 + lane;
            float A = 0.0f;
#pragma unroll
            for (int i = 0; i < COMBINE_CH; i++) {
                const float v = e == tid ? pv[i] : i < ns && e < hd ? __ldcg(p + (size_t)i * (hd + 2) + e) : 0.0f;
                A += v * __shfl_sync(0xffffffffu, w, i);
            }
            for (int i = COMBINE_CH; i < ns; i++) { /* more splits: one at a time */
                const float wi = __shfl_sync(0xffffffffu, w, i);
                if (e < hd) A += __ldcg(p + (size_t)i * (hd + 2) + e) * wi;
            }
            if (e < hd) o[e] = A / L;
        }
        return;
    }
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, __ldcg(p + (size_t)s * (hd + 2) + hd));
    float L = 0.0f;
    for (int s = 0; s < ns; s++) {
        const float *ps = p + (size_t)s * (hd + 2);
        float ms = __ldcg(ps + hd);
        if (ms != -INFINITY) L += __ldcg(ps + hd + 1) * __expf(ms - M);
    }
    for (int e = tid; e < hd; e += nt) {
        float acc = 0.0f;
        for (int s = 0; s < ns; s++) {
            const float *ps = p + (size_t)s * (hd + 2);
            float ms = __ldcg(ps + hd);
            if (ms != -INFINITY) acc += __ldcg(ps + e) * __expf(ms - M);
        }
        o[e] = acc / L;
    }
}

/* The EPL / 2 words of f16 (or bf16) pairs w as EPL f32 values. */
template <int EPL, int KVT>
__device__ __forceinline__ void decode_half_words(const uint32_t *w, float *f) {
#pragma unroll
    for (int i = 0; i < EPL / 2; i++) {
        float2 v;
        if constexpr (KVT == KVT_BF16) v = __bfloat1622float2(*(const __nv_bfloat162 *)&w[i]);
        else v = __half22float2(*(const __half2 *)&w[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

/* The lane's EPL values of k and v of cache row `row` of block blk, head
 * kvh (f16 / bf16 caches). */
template <int EPL, bool CG = false>
__device__ __forceinline__ void attn_h16_load(const tbc_attn_args &a, int blk, int row, int kvh, int li, uint32_t *kw,
                                              uint32_t *vw) {
    const size_t off = (((size_t)blk * a.block_size + (size_t)row) * a.n_kv + kvh) * (size_t)a.hd + (size_t)li * EPL;
    load_words<2 * EPL, CG>((const uint16_t *)a.k_cache + off, kw); /* 16-bit values: 4 * (EPL / 2 words) bytes aligned */
    load_words<2 * EPL, CG>((const uint16_t *)a.v_cache + off, vw);
}

/* Scores one key of the group (its words kw, vw; valid false past the
 * range: the lanes still take part in the shuffles) and folds it into the
 * group's running (m, l, acc): a new running max rescales (l, acc) first,
 * other keys skip the EPL multiplies (the values of multiplying by exp(0) =
 * 1). */
template <int EPL, int KVT>
__device__ __forceinline__ void attn_h16_score(bool valid, int S, const float *q, const uint32_t *kw,
                                               const uint32_t *vw, float &m, float &l, float *acc) {
    float dot = 0.0f;
    if (valid) {
        float kf[EPL];
        decode_half_words<EPL, KVT>(kw, kf);
#pragma unroll
        for (int e = 0; e < EPL; e++) dot = fmaf(q[e], kf[e], dot);
    }
    for (int o = S >> 1; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (!valid) return;
    if (dot > m) {
        const float corr = __expf(m - dot);
        l *= corr;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[e] *= corr;
        m = dot;
    }
    const float p = __expf(dot - m);
    l += p;
    float vf[EPL];
    decode_half_words<EPL, KVT>(vw, vf);
#pragma unroll
    for (int e = 0; e < EPL; e++) acc[e] = fmaf(p, vf[e], acc[e]);
}

/* The block's output of (t, h, split sp) once each warp has put its (max,
 * sum, hd outputs) in sm_m[w], sm_l[w], sm_o[w * ld ..] (and the block has
 * synchronised): merged over the warps into out (one split) or into the
 * split's partial, the last split of (t, h) to finish merging them all. */
__device__ __forceinline__ void attn_block_out(const tbc_attn_args &a, int t, int h, int sp, int ns, const float *sm_m,
                                               const float *sm_l, const float *sm_o, int ld, int *sm_last,
                                               float *out) {
    const int hd = a.hd, H = a.n_heads;
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
            for (int w = 0; w < ATTN_WARPS; w++) s += sm_o[w * ld + e] * c[w];
            o[e] = s / L;
        }
    } else {
        float *o = a.partial + (((size_t)t * H + h) * a.n_splits + sp) * (size_t)(hd + 2);
        for (int e = threadIdx.x; e < hd; e += blockDim.x) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++) s += sm_o[w * ld + e] * c[w];
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
            *sm_last = done == ns - 1;
        }
        __syncthreads();
        if (!*sm_last) return;
        __threadfence();
        if (threadIdx.x == 0) a.counters[(size_t)t * H + h] = 0;
        combine(a, t, h, ns, out, threadIdx.x, blockDim.x);
    }
}

/* EARLY (a.early, f16 / bf16 caches at even EPL): the split's range, the
 * block table and the first pass's key and value of each group (unless it
 * is key pos[t], the one the previous kernel writes) are read before the
 * wait on the previous kernel; q and key pos[t] (past L1) after it. */
template <int EPL, int KVT, bool EARLY = false>
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_kernel(tbc_attn_args a, const float *qkv, float *out) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_o[ATTN_WARPS][ATTN_MAX_HD];
    __shared__ int sm_last;
    constexpr bool H16 = (KVT == KVT_F16 || KVT == KVT_BF16) && EPL % 2 == 0;
    static_assert(!EARLY || H16, "early loads: f16 / bf16 caches at even EPL");
    const int h = blockIdx.x, t = blockIdx.y, sp = blockIdx.z;
    const int hd = a.hd, S = hd / EPL, H = a.n_heads, KV = a.n_kv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gi = lane / S, li = lane % S, gpw = 32 / S;
    const int slot = warp * gpw + gi, nslots = ATTN_WARPS * gpw;
    const int kvh = h / (H / KV);
    int chunk = 0, len = 0, ns = 0;
    const int32_t *bt = nullptr;
    const auto bind = [&]() { /* the split's plan and the sequence's block table (EARLY: before the wait) */
        len = a.pos[t] + 1;
        ns = tbc_split_plan(a.n_splits, a.split_min, len, 1, &chunk);
        bt = a.block_tables + (size_t)a.seq[t] * a.max_blocks;
    };
    uint32_t kw0[H16 ? EPL / 2 : 1], vw0[H16 ? EPL / 2 : 1]; /* EARLY: the first pass's words */
    if constexpr (EARLY) {
        bind();
        const int j = sp * chunk + slot;
        if (sp < ns && j < min(len, sp * chunk + chunk) && j < len - 1)
            attn_h16_load<EPL>(a, bt[j / a.block_size], j % a.block_size, kvh, li, kw0, vw0);
    }
    tbc_pdl_wait();
    tbc_pdl_trigger();
    if constexpr (!EARLY) bind();
    if (sp >= ns) return;

    float q[EPL], acc[EPL];
    const float *qp = qkv + (size_t)t * (size_t)(H + 2 * KV) * hd + (size_t)h * hd + li * EPL;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        q[e] = (a.q16 ? __half2float(((const __half *)qkv)[qp - qkv + e]) : qp[e]) * a.scale;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    const int lo = sp * chunk, hi = min(len, lo + chunk);
    const int bs = a.block_size;
    /* every lane runs the same number of iterations (shuffles need them all).
     * f16 / bf16 caches at even EPL: a group loads a key's values as words
     * (16 bytes a load at EPL >= 8) and scores it (attn_h16_*), rescaling
     * (l, acc) only at a new running max.
     * int8 / fp8 caches: a group takes KU = 2 keys a pass (j and j + nslots),
     * both keys' block-table entries, codes and scales loaded before either
     * is used, the codes held as loaded (a 16-byte word set a row at EPL 16)
     * until decoded; the keys' updates in the same order as one a pass.
     * (The same rescale-at-a-new-max branch made the fp8 kernel ~10% slower
     * at batch 64: its four groups a warp diverge. Loading the next pass's
     * codes while this one is scored took 96 registers against 79, five
     * blocks an SM against six, and the 7B batch-64 step 5% longer.) */
    if constexpr (H16) {
        for (int base = lo; base < hi; base += nslots) {
            uint32_t kw[EPL / 2], vw[EPL / 2];
            const int j = base + slot;
            if (EARLY && base == lo && j < len - 1) { /* read before the wait */
#pragma unroll
                for (int i = 0; i < EPL / 2; i++) kw[i] = kw0[i], vw[i] = vw0[i];
            } else if (j < hi) {
                if (EARLY && j == len - 1) attn_h16_load<EPL, true>(a, bt[j / bs], j % bs, kvh, li, kw, vw);
                else attn_h16_load<EPL>(a, bt[j / bs], j % bs, kvh, li, kw, vw);
            }
            attn_h16_score<EPL, KVT>(j < hi, S, q, kw, vw, m, l, acc);
        }
    } else {
        constexpr bool QK = KVT == KVT_I8 || KVT == KVT_FP8;
        constexpr int KU = QK ? 2 : 1, NW = QK ? (EPL + 3) / 4 : 1;
        for (int base = lo; base < hi; base += KU * nslots) {
            float kf[EPL], vf[KU][QK ? 1 : EPL];
            uint32_t kw[KU][NW], vw[KU][NW];
            float dot[KU], ksc[KU], vsc[KU];
            bool valid[KU];
#pragma unroll
            for (int u = 0; u < KU; u++) { /* loads */
                const int j = base + u * nslots + slot;
                valid[u] = j < hi;
                dot[u] = 0.0f;
                ksc[u] = vsc[u] = 1.0f;
                if (!valid[u]) continue;
                const int blk = bt[j / bs];
                if (QK) {
                    /* codes of (row j % bs, head kvh), then the rows' scales (the
                     * S lanes of a group read the same word: one request) */
                    const size_t r = (size_t)(j % bs) * KV + kvh;
                    const uint8_t *kb = (const uint8_t *)a.k_cache + (size_t)blk * a.kv_block_bytes;
                    const uint8_t *vb = (const uint8_t *)a.v_cache + (size_t)blk * a.kv_block_bytes;
                    load_code_words<EPL>(kb + r * hd + (size_t)li * EPL, kw[u]);
                    load_code_words<EPL>(vb + r * hd + (size_t)li * EPL, vw[u]);
                    ksc[u] = ((const float *)(kb + a.kv_scale_off))[r];
                    vsc[u] = ((const float *)(vb + a.kv_scale_off))[r];
                } else {
                    size_t off = (((size_t)blk * bs + (size_t)(j % bs)) * KV + kvh) * (size_t)hd + (size_t)li * EPL;
                    load_kv<EPL, KVT>(a.k_cache, off, kf);
                    load_kv<EPL, KVT>(a.v_cache, off, vf[u]);
#pragma unroll
                    for (int e = 0; e < EPL; e++) dot[u] = fmaf(q[e], kf[e], dot[u]);
                }
            }
            if (QK) {
#pragma unroll
                for (int u = 0; u < KU; u++) {
                    if (!valid[u]) continue;
                    decode_code_words<EPL, KVT>(kw[u], kf);
#pragma unroll
                    for (int e = 0; e < EPL; e++) dot[u] = fmaf(q[e], kf[e], dot[u]);
                    dot[u] *= ksc[u];
                }
            }
#pragma unroll
            for (int u = 0; u < KU; u++)
                for (int o = S >> 1; o > 0; o >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], o);
#pragma unroll
            for (int u = 0; u < KU; u++) {
                if (!valid[u]) continue;
                float mn = fmaxf(m, dot[u]);
                float corr = __expf(m - mn), p = __expf(dot[u] - mn);
                l = l * corr + p;
                if (QK) { /* a quantised V row: its scale applied once, to p */
                    float vq[EPL];
                    decode_code_words<EPL, KVT>(vw[u], vq);
                    const float pv = p * vsc[u];
#pragma unroll
                    for (int e = 0; e < EPL; e++) acc[e] = fmaf(pv, vq[e], acc[e] * corr);
                } else {
#pragma unroll
                    for (int e = 0; e < EPL; e++) acc[e] = fmaf(p, vf[u][e], acc[e] * corr);
                }
                m = mn;
            }
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
    attn_block_out(a, t, h, sp, ns, sm_m, sm_l, &sm_o[0][0], ATTN_MAX_HD, &sm_last, out);
}

/* ---------------------------------------------------------------- tensor-core decode
 * For hd = 128 over f16 or e4m3 caches whose blocks hold a multiple of 16
 * rows, a warp takes tiles of 16 keys (the split's range rounded to 16 keys,
 * so that a tile lies in one cache block) and scores and sums them with
 * mma.sync m16n8k16 (f16 in, f32 accumulate); the 16 rows of the mma's M
 * side are copies of the one query (the scalar kernel above is bound by
 * instruction issue; a tile here is 16 + 8 mmas against ~30 instructions a
 * key a lane there).
 *   S (16 x 8 keys) = Q (16 x 16 dims) K^T: lane (g, c) (g = lane / 4,
 *     c = lane % 4) supplies keys g and g + 8 at dims [32c, 32c + 32): the
 *     k index of step st maps to dims 32c + 4st + {0..3}, and q (f16, the
 *     softmax scale applied) is held in the same order, so both fragments
 *     come straight from contiguous loads (e4m3: one cvt a pair).
 *   The lane's scores are its keys 2c, 2c + 1, 2c + 8, 2c + 9 (the C layout),
 *     the same keys as the B fragment of P^T below: one online-softmax
 *     update a tile (max over the quad by two shuffles).
 *   O^T (16 dims x 8) = V^T (16 dims x 16 keys) P^T: m-tile mi's rows g and
 *     g + 8 are dims 16g + 2mi and 16g + 2mi + 1, so the lane reads dims
 *     [16g, 16g + 16) of its four keys (one 16-byte load a key for e4m3) and
 *     pairs keys with one byte_perm a register. e4m3 rows' V scales go into
 *     P (p * vscale / u, u the tile's largest V scale: P stays in f16's normal
 *     range) and the running output is kept in units of u, rescaled with the
 *     softmax correction once a tile.
 * attn_mma_kernel keeps attn_kernel's blocks: 4 warps a (head, token, split),
 * warp w taking tiles w, w + 4, ..., merged through shared memory; q is read
 * from shared memory in the loop (16 registers fewer: 115, four blocks an
 * SM; TB_CUDA_ATTN_MMA=2 compiles it for five, 96 registers). A warp per
 * (head, token) with the next tile loaded while one is scored (150
 * registers) was slower on long contexts (docs/GPU.md). */
#define AMMA_HD 128

__device__ __forceinline__ void amma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two e4m3 codes (the low 16 bits, first code low) as an f16 pair, exact. */
__device__ __forceinline__ uint32_t amma_e4m3x2(uint32_t w) {
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    return (uint32_t)r.x | ((uint32_t)r.y << 16);
}

/* Two int8 codes likewise, exact: code + 128 as the low byte of the f16
 * 0x64xx (1024 + code + 128), minus 1152. */
__device__ __forceinline__ uint32_t amma_i8x2(uint32_t w) {
    const uint32_t u = __byte_perm(w ^ 0x8080u, 0x64646464u, 0x4140u);
    const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&u), __float2half2_rn(1152.0f));
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Two codes of a quantised cache (e4m3 or int8) as an f16 pair. */
template <int KVT>
__device__ __forceinline__ uint32_t amma_codes2(uint32_t w) {
    if constexpr (KVT == KVT_I8) return amma_i8x2(w);
    else return amma_e4m3x2(w);
}

__device__ __forceinline__ uint32_t amma_pack(float x, float y) {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* One tile's loads, as a lane holds them: k of keys g, g + 8 (dims [32c,
 * 32c + 32)), v of its keys 2c, 2c + 1, 2c + 8, 2c + 9 (dims [16g, 16g +
 * 16)) and (e4m3) both rows' scales of those four keys; zeros past the
 * range. */
template <int KVT> struct amma_tile {
    static constexpr bool Q = KVT == KVT_FP8 || KVT == KVT_I8; /* one-byte codes and row scales */
    static constexpr int KW = Q ? 8 : 16, VW = Q ? 4 : 8;
    uint32_t kw[2][KW], vw[4][VW];
    float ksc[4], vsc[4];
};

/* The lane's q pairs (head h, token t, scaled) into sq (16 words at sq[0 ..
 * 15]): dims [32c, 32c + 32), or with IL the 8-dim chunks c, c + 4, c + 8,
 * c + 12 (words 4i .. 4i + 3 the chunk's 8 dims), as the lane's keys are
 * laid out. */
template <bool IL = false>
__device__ __forceinline__ void amma_q(const tbc_attn_args &a, const float *qkv, int t, int h, int c, uint32_t *sq) {
    const size_t qo = (size_t)t * (size_t)(a.n_heads + 2 * a.n_kv) * AMMA_HD + (size_t)h * AMMA_HD + 32 * c;
    /* words 4i .. 4i + 3 are the 8 dims from qb(i) + 8i: 8(c + 4i) (IL), 32c + 8i */
    const auto qb = [&](int i) -> size_t { return IL ? qo - 24 * c + 24 * i : qo; };
    if (a.q16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 w = ((const uint4 *)((const __half *)qkv + qb(i)))[i];
            const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&ws[j]));
                sq[4 * i + j] = amma_pack(f.x * a.scale, f.y * a.scale);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 f = ((const float4 *)(qkv + qb(i / 2)))[i];
            sq[2 * i] = amma_pack(f.x * a.scale, f.y * a.scale);
            sq[2 * i + 1] = amma_pack(f.z * a.scale, f.w * a.scale);
        }
    }
}

/* The tile of keys base .. base + 15 of which nk = hi - base are valid
 * (zeros past them): PART 1 its keys (and e4m3 key scales), 2 its values
 * (and value scales), 3 both. ONE: only key `one` of the tile (< nk),
 * through L2 (the key the previous kernel wrote; attn_mma_kernel's early
 * loads), the lane's other words left as they are. */
template <int KVT, bool ONE = false, int PART = 3>
__device__ __forceinline__ void amma_load(const tbc_attn_args &a, const int32_t *bt, int base, int hi, int kvh, int g,
                                          int c, amma_tile<KVT> &x, int one = -1) {
    constexpr bool K = PART & 1, V = PART & 2;
    const int bs = a.block_size, blk = bt[base / bs], r0 = base % bs, nk = hi - base, KV = a.n_kv;
    const int own[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
    const auto take = [&](int key) { return ONE ? key == one : key < nk; };
    if constexpr (KVT == KVT_FP8) {
        const uint8_t *kb = (const uint8_t *)a.k_cache + (size_t)blk * a.kv_block_bytes;
        const uint8_t *vb = (const uint8_t *)a.v_cache + (size_t)blk * a.kv_block_bytes;
#pragma unroll
        for (int u = 0; u < 2 && K; u++) {
            const int key = g + 8 * u;
            if (take(key)) load_words<32, ONE>(kb + ((size_t)(r0 + key) * KV + kvh) * AMMA_HD + 32 * c, x.kw[u]);
            else if (!ONE)
#pragma unroll
                for (int i = 0; i < 8; i++) x.kw[u][i] = 0;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = own[i];
            const size_t r = (size_t)(r0 + key) * KV + kvh;
            const float *ks = (const float *)(kb + a.kv_scale_off) + r, *vs = (const float *)(vb + a.kv_scale_off) + r;
            if (K && !ONE) x.ksc[i] = 0.0f;
            if (V && !ONE) x.vsc[i] = 0.0f;
            if (take(key)) {
                if (V) load_words<16, ONE>(vb + r * AMMA_HD + 16 * g, x.vw[i]);
                if (K) x.ksc[i] = ONE ? __ldcg(ks) : *ks;
                if (V) x.vsc[i] = ONE ? __ldcg(vs) : *vs;
            } else if (V && !ONE) {
#pragma unroll
                for (int j = 0; j < 4; j++) x.vw[i][j] = 0;
            }
        }
    } else {
        const __half *kc = (const __half *)a.k_cache, *vc = (const __half *)a.v_cache;
        const size_t row0 = (size_t)blk * bs + r0;
#pragma unroll
        for (int u = 0; u < 2 && K; u++) {
            const int key = g + 8 * u;
            if (take(key)) load_words<64, ONE>(kc + ((row0 + key) * KV + kvh) * AMMA_HD + 32 * c, x.kw[u]);
            else if (!ONE)
#pragma unroll
                for (int i = 0; i < 16; i++) x.kw[u][i] = 0;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = own[i];
            if (!ONE) x.ksc[i] = x.vsc[i] = 1.0f;
            if (V && take(key)) load_words<32, ONE>(vc + ((row0 + key) * KV + kvh) * AMMA_HD + 16 * g, x.vw[i]);
            else if (V && !ONE)
#pragma unroll
                for (int j = 0; j < 8; j++) x.vw[i][j] = 0;
        }
    }
}

/* Scores tile x (keys base .. , nk = hi - base of them valid) against q
 * (the lane's 16 pairs at sq) and folds it into (m, l, unit, acc). GQ:
 * row g of the mma is q head g (sq that head's pairs; rows g + 8 zero), so
 * the lane's (m, l) are head g's and O^T's columns 2c, 2c + 1 in acc are
 * heads 2c, 2c + 1 (rescaled by those heads' corrections, from lanes 8c and
 * 8c + 4); else every row is the one q and acc's columns are equal. */
template <int KVT, bool GQ = false>
__device__ __forceinline__ void amma_step(const amma_tile<KVT> &x, const uint32_t *sq, int nk, int c, float &m,
                                          float &l, float &unit, float (&acc)[8][4]) {
    constexpr bool FP8 = amma_tile<KVT>::Q; /* e4m3 or int8 codes */
    const int own[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
    float s[2][4];
#pragma unroll
    for (int u = 0; u < 2; u++) s[u][0] = s[u][1] = s[u][2] = s[u][3] = 0.0f;
#pragma unroll
    for (int st = 0; st < 8; st++) {
        const uint2 q = *(const uint2 *)&sq[2 * st];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            uint32_t b0, b1;
            if constexpr (FP8) {
                b0 = amma_codes2<KVT>(x.kw[u][st]);
                b1 = amma_codes2<KVT>(x.kw[u][st] >> 16);
            } else {
                b0 = x.kw[u][2 * st];
                b1 = x.kw[u][2 * st + 1];
            }
            if constexpr (GQ) amma(s[u], q.x, 0u, q.y, 0u, b0, b1);
            else amma(s[u], q.x, q.x, q.y, q.y, b0, b1);
        }
    }
    float sc[4] = {s[0][0], s[0][1], s[1][0], s[1][1]}, mt = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sc[i] = own[i] < nk ? sc[i] * x.ksc[i] : -INFINITY;
        mt = fmaxf(mt, sc[i]);
    }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float mn = fmaxf(m, mt), corr = __expf(m - mn);
    float p[4], ps = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        p[i] = __expf(sc[i] - mn);
        ps += p[i];
    }
    l = l * corr + ps;
    m = mn;
    float ratio = corr;
    if constexpr (FP8) { /* P in units of the tile's largest V scale */
        float vm = fmaxf(fmaxf(x.vsc[0], x.vsc[1]), fmaxf(x.vsc[2], x.vsc[3]));
        vm = fmaxf(vm, __shfl_xor_sync(0xffffffffu, vm, 1));
        vm = fmaxf(vm, __shfl_xor_sync(0xffffffffu, vm, 2));
        const float nu = vm > 0.0f ? vm : unit, inv = 1.0f / nu;
        ratio = corr * (unit * inv);
        unit = nu;
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] *= x.vsc[i] * inv;
    }
    if constexpr (GQ) {
        const float ra = __shfl_sync(0xffffffffu, ratio, 8 * c), rb = __shfl_sync(0xffffffffu, ratio, 8 * c + 4);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i][0] *= ra, acc[i][1] *= rb, acc[i][2] *= ra, acc[i][3] *= rb;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i][0] *= ratio, acc[i][1] *= ratio, acc[i][2] *= ratio, acc[i][3] *= ratio;
    }
    const uint32_t pb0 = amma_pack(p[0], p[1]), pb1 = amma_pack(p[2], p[3]);
#pragma unroll
    for (int mi = 0; mi < 8; mi++) {
        uint32_t a0, a1, a2, a3;
        if constexpr (FP8) { /* dims 16g + 2mi, + 1: bytes (2mi) % 4 and + 1 of word mi / 2 */
            const uint32_t sel = (mi & 1) ? 0x7362u : 0x5140u;
            const uint32_t u = __byte_perm(x.vw[0][mi >> 1], x.vw[1][mi >> 1], sel);
            const uint32_t v = __byte_perm(x.vw[2][mi >> 1], x.vw[3][mi >> 1], sel);
            a0 = amma_codes2<KVT>(u);
            a1 = amma_codes2<KVT>(u >> 16);
            a2 = amma_codes2<KVT>(v);
            a3 = amma_codes2<KVT>(v >> 16);
        } else { /* word mi of each key: dims 16g + 2mi, + 1 */
            a0 = __byte_perm(x.vw[0][mi], x.vw[1][mi], 0x5410u);
            a1 = __byte_perm(x.vw[0][mi], x.vw[1][mi], 0x7632u);
            a2 = __byte_perm(x.vw[2][mi], x.vw[3][mi], 0x5410u);
            a3 = __byte_perm(x.vw[2][mi], x.vw[3][mi], 0x7632u);
        }
        amma(acc[mi], a0, a1, a2, a3, pb0, pb1);
    }
}

/* Splits of (t, h) in use (*ns_out, what the merge counts) and split sp's
 * key range [lo, hi), the splits rounded to 16 keys (attn_split.h: 144 keys
 * launched as 32 splits use 9 of 16 keys). Returns 0 when split sp is not
 * in use. */
__device__ __forceinline__ int amma_range(const tbc_attn_args &a, int t, int sp, int *ns_out, int *lo, int *hi) {
    int chunk;
    const int len = a.pos[t] + 1, ns = tbc_split_plan(a.n_splits, a.split_min, len, 16, &chunk);
    *ns_out = ns;
    if (sp >= ns) return 0;
    *lo = sp * chunk;
    *hi = min(len, *lo + chunk);
    return 1;
}

/* The online softmax's start: no keys seen (running max, sum, V-scale unit,
 * output sums). */
__device__ __forceinline__ void amma_zero(float (&acc)[8][4], float &m, float &l, float &unit) {
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    m = -INFINITY;
    l = 0.0f;
    unit = 1.0f;
}

/* A warp's (m, l, unit, acc) into the block's shared triples, then the
 * block's output (attn_block_out). */
__device__ __forceinline__ void amma_finish(const tbc_attn_args &a, int t, int h, int sp, int ns, float m, float l,
                                            float unit, const float (&acc)[8][4], float *sm_m, float *sm_l,
                                            float (*sm_o)[AMMA_HD], int *sm_last, float *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (c == 0) {
#pragma unroll
        for (int mi = 0; mi < 8; mi++) {
            sm_o[warp][16 * g + 2 * mi] = acc[mi][0] * unit;
            sm_o[warp][16 * g + 2 * mi + 1] = acc[mi][2] * unit;
        }
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    __syncthreads();
    attn_block_out(a, t, h, sp, ns, sm_m, sm_l, &sm_o[0][0], AMMA_HD, sm_last, out);
}

/* EARLY (a.early set, one token a sequence): the split's range, the block
 * table and the keys of each warp's first tile (without key pos[t]) are
 * read before the wait on the previous kernel (which writes q and key
 * pos[t]); after it, q, that tile's values and key pos[t] (past L1: another
 * block of this SM may have brought its line, e4m3 scales of neighbouring
 * keys, into L1 before the wait) are loaded together. So the chain after
 * the wait is one round of loads, not four (position, block table, keys,
 * values). Not EARLY: everything after the wait. */
template <int KVT, int MINB, bool EARLY>
__global__ void __launch_bounds__(ATTN_WARPS * 32, MINB) attn_mma_kernel(tbc_attn_args a, const float *qkv, float *out) {
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_o[ATTN_WARPS][AMMA_HD];
    __shared__ uint32_t sm_q[4 * 18]; /* q's pairs, lane c's 16 at 18c (no bank conflicts) */
    __shared__ int sm_last;
    const int h = blockIdx.x, t = blockIdx.y, sp = blockIdx.z;
    const int kvh = h / (a.n_heads / a.n_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int ns = 0, lo = 0, hi = 0, use = 1;
    amma_tile<KVT> x; /* the tile in hand */
    const int32_t *bt = nullptr;
    const auto bind = [&]() { /* the split's range and the sequence's block table (EARLY: before the wait) */
        use = amma_range(a, t, sp, &ns, &lo, &hi);
        bt = a.block_tables + (size_t)a.seq[t] * a.max_blocks;
    };
    if (EARLY) {
        bind();
        if (use && lo + 16 * warp < hi)
            amma_load<KVT, false, 1>(a, bt, lo + 16 * warp, min(hi, a.pos[t]), kvh, g, c, x);
    }
    tbc_pdl_wait();
    tbc_pdl_trigger();
    if (!EARLY) bind();
    if (!use) return;
    const int b0 = lo + 16 * warp, pw = EARLY ? a.pos[t] : hi; /* keys from pw on: read past L1 */
    /* EARLY: key pw of the tile at base, if it has it, past L1 */
    const auto take_new = [&](int base) {
        const int nw = pw - base;
        if (EARLY && nw >= 0 && nw < 16 && nw < hi - base) amma_load<KVT, true>(a, bt, base, hi, kvh, g, c, x, nw);
    };
    if (EARLY && b0 < hi) {
        amma_load<KVT, false, 2>(a, bt, b0, min(hi, pw), kvh, g, c, x);
        take_new(b0);
    }
    if (warp == 0 && g == 0) amma_q(a, qkv, t, h, c, &sm_q[18 * c]);
    __syncthreads();
    float acc[8][4];
    float m, l, unit;
    amma_zero(acc, m, l, unit);
    for (int base = b0; base < hi; base += 16 * ATTN_WARPS) {
        if (!EARLY || base != b0) {
            amma_load<KVT>(a, bt, base, min(hi, pw), kvh, g, c, x);
            take_new(base);
        }
        amma_step<KVT>(x, &sm_q[18 * c], hi - base, c, m, l, unit, acc);
    }
    amma_finish(a, t, h, sp, ns, m, l, unit, acc, sm_m, sm_l, sm_o, &sm_last, out);
}

/* ---------------------------------------------------------------- decode attention, a warp a (token, head)
 * attn_mma_warp_kernel (TB_CUDA_ATTN_MMA=6; 7: U = 2 tiles' loads in flight
 * a warp): attn_mma_kernel's tensor-core steps, but a warp takes a whole
 * (token, q head), ATTN_WARPS of them a block: no key splits, no merge
 * across warps (no barrier; shared memory only for q). Meant for steps of
 * many (token, head) pairs, where attn_mma_kernel's blocks run 2-3 tiles a
 * warp and then merge (batch 64 at contexts ~150). Launched with n_splits
 * 1 only (tbc_attention takes attn_mma_kernel otherwise). Registers (sm_90,
 * CUDA 13): U 1 114 (e4m3) / 126 (f16), four blocks an SM; U 2 148 (e4m3,
 * three blocks) / f16 built for two blocks (it spills at three). */
template <int KVT, int U, int MINB>
__global__ void __launch_bounds__(ATTN_WARPS * 32, MINB)
    attn_mma_warp_kernel(tbc_attn_args a, const float *qkv, float *out) {
    __shared__ uint32_t sm_q[ATTN_WARPS][4 * 18]; /* a warp's q pairs, lane c's 16 at 18c */
    tbc_pdl_wait();
    tbc_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int H = a.n_heads, pair = (int)blockIdx.x * ATTN_WARPS + warp;
    if (pair >= a.T * H) return; /* warp-uniform; no block barrier follows */
    const int t = pair / H, h = pair - t * H, kvh = h / (H / a.n_kv), len = a.pos[t] + 1;
    uint32_t *sq = &sm_q[warp][18 * c];
    if (g == 0) amma_q(a, qkv, t, h, c, sq);
    __syncwarp();
    float acc[8][4];
    float m, l, unit;
    amma_zero(acc, m, l, unit);
    const int32_t *bt = a.block_tables + (size_t)a.seq[t] * a.max_blocks;
    for (int base = 0; base < len; base += 16 * U) {
        amma_tile<KVT> x[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (base + 16 * u < len) amma_load<KVT>(a, bt, base + 16 * u, len, kvh, g, c, x[u]);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (base + 16 * u < len) amma_step<KVT>(x[u], sq, len - base - 16 * u, c, m, l, unit, acc);
    }
    /* the warp's (m, l, acc) are the head's: out = acc * unit / l (every
     * column of acc holds the same q's sums; lane (g, 0) has dims 16g + 2mi
     * and 16g + 2mi + 1 in acc[mi][0], acc[mi][2], as amma_finish reads) */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (c == 0) {
        const float f = unit / l;
        float *o = out + ((size_t)t * H + h) * AMMA_HD + 16 * g;
#pragma unroll
        for (int mi = 0; mi < 8; mi++)
            *reinterpret_cast<float2 *>(o + 2 * mi) = make_float2(acc[mi][0] * f, acc[mi][2] * f);
    }
}

/* ---------------------------------------------------------------- decode attention, pipelined tiles
 * attn_mma_pipe_kernel (TB_CUDA_ATTN_MMA=3): attn_mma_kernel's blocks and
 * mma steps, but each warp copies its tiles into a ring of S stages in
 * shared memory with cp.async (no registers held for loads in flight) and
 * issues the first S tiles' copies before q is even read: a block's
 * dependent chain is pos, the block-table entries, one round of copies,
 * where attn_mma_kernel waits on one tile's loads per pass. A stage is a
 * tile's 16 k rows, 16 v rows (zeros past the range: cp.async's zero fill)
 * and, for e4m3, their 32 scales.
 * Rows are stored whole with their 16-byte chunks permuted by a key-
 * dependent xor so that the fragment reads hit 32 distinct banks a
 * quarter-warp:
 *   e4m3 (8 chunks a row): a lane reads chunks 2c, 2c + 1 of keys g, g + 8
 *     (k: xor key & 1) and chunk g of keys 2c, 2c + 1, 2c + 8, 2c + 9 (v:
 *     xor key & 6);
 *   f16 (16 chunks): k's lane holds chunks c, c + 4, c + 8, c + 12 of its
 *     keys (q taken in the same order, amma_q<true>; xor (key & 1) << 2),
 *     v's chunks 2g, 2g + 1 (xor of bits 1 and 2 of the key moved to bits
 *     0 and 2).
 * S: 3 stages for e4m3 (4,224 bytes a stage, 50.7 KiB a block: four blocks
 * an SM), 2 for f16 (8 KiB a stage, 64 KiB a block: three). int8 caches
 * take e4m3's layout and steps, their codes widened to f16 by amma_i8x2
 * (attn_mma_kernel does not take them). */
template <int KVT> struct apipe {
    static constexpr bool FP8 = amma_tile<KVT>::Q;           /* e4m3 or int8 codes and row scales */
    static constexpr int ROWB = FP8 ? AMMA_HD : 2 * AMMA_HD; /* bytes of a row */
    static constexpr int ROWC = ROWB / 16;                   /* its 16-byte chunks */
    static constexpr int VOFF = 16 * ROWB, SOFF = 32 * ROWB; /* v rows, scales (k 16, v 16) */
    static constexpr int STAGE = SOFF + (FP8 ? 32 * 4 : 0);
    static constexpr int S = FP8 ? 3 : 2;
    static constexpr int MINB = FP8 ? 4 : 3;
    static constexpr int SMEM = ATTN_WARPS * S * STAGE;
    __device__ static __forceinline__ int swk(int key) { return FP8 ? key & 1 : (key & 1) << 2; }
    __device__ static __forceinline__ int swv(int key) { return FP8 ? key & 6 : ((key >> 1) & 1) | (key & 4); }
};

__device__ __forceinline__ uint32_t apipe_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 (or 4) bytes global -> shared; n = 0: zeros instead */
__device__ __forceinline__ void apipe_cp16(uint32_t dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void apipe_cp4(uint32_t dst, const void *src, int n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void apipe_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void apipe_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* The warp's copies of the tile at in-block row r0 of cache block blk (nk
 * of its 16 keys in range) into stage st. */
template <int KVT>
__device__ __forceinline__ void apipe_issue(const tbc_attn_args &a, int blk, int r0, int nk, int kvh, int lane,
                                            unsigned char *st) {
    typedef apipe<KVT> P;
    const int KV = a.n_kv;
    const unsigned char *kb, *vb;
    size_t row0; /* the cache row (token, head 0) of key 0, counted from kb / vb */
    if constexpr (P::FP8) {
        kb = (const unsigned char *)a.k_cache + (size_t)blk * a.kv_block_bytes;
        vb = (const unsigned char *)a.v_cache + (size_t)blk * a.kv_block_bytes;
        row0 = (size_t)r0 * KV;
    } else {
        kb = (const unsigned char *)a.k_cache;
        vb = (const unsigned char *)a.v_cache;
        row0 = ((size_t)blk * a.block_size + r0) * KV;
    }
    const uint32_t s0 = apipe_smem(st);
#pragma unroll
    for (int i = 0; i < P::ROWC / 2; i++) {
        const int q = lane + 32 * i, key = q / P::ROWC, ch = q % P::ROWC, n = key < nk ? 16 : 0;
        const size_t src = (row0 + (size_t)key * KV + kvh) * P::ROWB + 16 * ch;
        apipe_cp16(s0 + key * P::ROWB + 16 * (ch ^ P::swk(key)), kb + src, n);
        apipe_cp16(s0 + P::VOFF + key * P::ROWB + 16 * (ch ^ P::swv(key)), vb + src, n);
    }
    if constexpr (P::FP8) { /* lanes 0-15 the k scales, 16-31 the v scales */
        const int key = lane & 15;
        const unsigned char *sb = (lane < 16 ? kb : vb) + a.kv_scale_off;
        apipe_cp4(s0 + P::SOFF + 4 * lane, sb + 4 * (row0 + (size_t)key * KV + kvh), key < nk ? 4 : 0);
    }
}

/* The lane's fragments of the tile in stage st, as amma_load gives them
 * (f16: k's words in amma_q<true>'s order). */
template <int KVT>
__device__ __forceinline__ void apipe_read(const unsigned char *st, int g, int c, amma_tile<KVT> &x) {
    typedef apipe<KVT> P;
    const int own[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int key = g + 8 * u;
#pragma unroll
        for (int j = 0; j < P::ROWC / 4; j++) {
            const int ch = P::FP8 ? 2 * c + j : c + 4 * j;
            const uint4 w = *(const uint4 *)(st + key * P::ROWB + 16 * (ch ^ P::swk(key)));
            x.kw[u][4 * j] = w.x, x.kw[u][4 * j + 1] = w.y, x.kw[u][4 * j + 2] = w.z, x.kw[u][4 * j + 3] = w.w;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int key = own[i];
#pragma unroll
        for (int j = 0; j < P::ROWC / 8; j++) {
            const int ch = (P::ROWC / 8) * g + j;
            const uint4 w = *(const uint4 *)(st + P::VOFF + key * P::ROWB + 16 * (ch ^ P::swv(key)));
            x.vw[i][4 * j] = w.x, x.vw[i][4 * j + 1] = w.y, x.vw[i][4 * j + 2] = w.z, x.vw[i][4 * j + 3] = w.w;
        }
        if constexpr (P::FP8) {
            x.ksc[i] = ((const float *)(st + P::SOFF))[key];
            x.vsc[i] = ((const float *)(st + P::SOFF))[16 + key];
        } else {
            x.ksc[i] = x.vsc[i] = 1.0f;
        }
    }
}

/* GQ: a warp's per-head (m, l) into sm_m / sm_l ([head][warp]) and its
 * outputs into its own ring ([head][dim]: the ring is free once its tiles
 * are read, no copies in flight), then the block's output head by head. */
template <int KVT>
__device__ __forceinline__ void amma_finish_gq(const tbc_attn_args &a, int t, int kvh, int G, int sp, int ns, float m,
                                               float l, float unit, const float (&acc)[8][4], float *sm_m, float *sm_l,
                                               unsigned char *rings, int *sm_last, float *out) {
    constexpr int RING = apipe<KVT>::S * apipe<KVT>::STAGE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float *o = reinterpret_cast<float *>(rings + warp * RING);
#pragma unroll
    for (int mi = 0; mi < 8; mi++) { /* columns 2c, 2c + 1: heads 2c, 2c + 1; rows: dims d, d + 1 */
        const int d = 16 * g + 2 * mi;
        if (2 * c < G) {
            o[2 * c * AMMA_HD + d] = acc[mi][0] * unit;
            o[2 * c * AMMA_HD + d + 1] = acc[mi][2] * unit;
        }
        if (2 * c + 1 < G) {
            o[(2 * c + 1) * AMMA_HD + d] = acc[mi][1] * unit;
            o[(2 * c + 1) * AMMA_HD + d + 1] = acc[mi][3] * unit;
        }
    }
    if (c == 0 && g < G) {
        sm_m[g * ATTN_WARPS + warp] = m;
        sm_l[g * ATTN_WARPS + warp] = l;
    }
    __syncthreads();
    for (int r = 0; r < G; r++)
        attn_block_out(a, t, kvh * G + r, sp, ns, sm_m + r * ATTN_WARPS, sm_l + r * ATTN_WARPS,
                       reinterpret_cast<const float *>(rings) + r * AMMA_HD, RING / 4, sm_last, out);
}

/* GQ (TB_CUDA_ATTN_MMA=4, 2 <= G <= AMMA_GQ q heads a kv head): a block a
 * (kv head, token, split) scores its G q heads in the mma's rows (amma_step
 * GQ) over one read of the kv head's keys; else a block a (q head, token,
 * split) as attn_mma_kernel. */
#define AMMA_GQ 8
template <int KVT, bool GQ>
__global__ void __launch_bounds__(ATTN_WARPS * 32, apipe<KVT>::MINB)
    attn_mma_pipe_kernel(tbc_attn_args a, const float *qkv, float *out) {
    typedef apipe<KVT> P;
    constexpr int QH = GQ ? AMMA_GQ : 1;
    extern __shared__ __align__(16) unsigned char apipe_ring[];
    __shared__ float sm_m[QH * ATTN_WARPS], sm_l[QH * ATTN_WARPS];
    __shared__ float sm_o[GQ ? 1 : ATTN_WARPS][AMMA_HD]; /* GQ: in the rings */
    __shared__ uint32_t sm_q[QH * 4 * 18];             /* (head,) lane c's 16 pairs at 18 (4 head + c) */
    __shared__ int sm_last;
    tbc_pdl_wait();
    tbc_pdl_trigger();
    const int t = blockIdx.y, sp = blockIdx.z, G = a.n_heads / a.n_kv;
    const int h = blockIdx.x, kvh = GQ ? blockIdx.x : h / G; /* h: the q head (not GQ) */
    int ns, lo, hi;
    if (!amma_range(a, t, sp, &ns, &lo, &hi)) return;
    const int bs = a.block_size;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    unsigned char *ring = apipe_ring + warp * (P::S * P::STAGE);
    const int32_t *bt = a.block_tables + (size_t)a.seq[t] * a.max_blocks;
    const int step = 16 * ATTN_WARPS, first = lo + 16 * warp;
    const int nt = first < hi ? (hi - first + step - 1) / step : 0; /* the warp's tiles */
    /* the first S tiles: their block-table entries, then their copies */
    int blk[P::S];
#pragma unroll
    for (int s = 0; s < P::S; s++) blk[s] = s < nt ? bt[(first + s * step) / bs] : 0;
#pragma unroll
    for (int s = 0; s < P::S; s++) {
        if (s < nt) {
            const int base = first + s * step;
            apipe_issue<KVT>(a, blk[s], base % bs, hi - base, kvh, lane, ring + s * P::STAGE);
        }
        apipe_commit();
    }
    int nblk = P::S < nt ? bt[(first + P::S * step) / bs] : 0;
    if constexpr (GQ) { /* head g's q in row g; rows >= G zero */
        if (warp == 0) {
            uint32_t *sq = &sm_q[18 * (4 * g + c)];
            if (g < G) amma_q<!P::FP8>(a, qkv, t, kvh * G + g, c, sq);
            else
#pragma unroll
                for (int j = 0; j < 16; j++) sq[j] = 0;
        }
    } else if (warp == 0 && g == 0) {
        amma_q<!P::FP8>(a, qkv, t, h, c, &sm_q[18 * c]);
    }
    __syncthreads();
    const uint32_t *sq = &sm_q[18 * (GQ ? 4 * g + c : c)];
    float acc[8][4];
    float m, l, unit;
    amma_zero(acc, m, l, unit);
    int slot = 0;
    for (int i = 0; i < nt; i++) {
        apipe_wait<P::S - 1>(); /* tile i's group (one committed a tile, S ahead) */
        __syncwarp();
        unsigned char *stg = ring + slot * P::STAGE;
        const int base = first + i * step;
        {
            amma_tile<KVT> x;
            apipe_read<KVT>(stg, g, c, x);
            amma_step<KVT, GQ>(x, sq, hi - base, c, m, l, unit, acc);
        }
        __syncwarp(); /* every lane has read the stage */
        const int nx = i + P::S;
        if (nx < nt) {
            const int nb = first + nx * step;
            apipe_issue<KVT>(a, nblk, nb % bs, hi - nb, kvh, lane, stg);
            nblk = nx + 1 < nt ? bt[(first + (nx + 1) * step) / bs] : 0;
        }
        apipe_commit();
        slot = slot + 1 == P::S ? 0 : slot + 1;
    }
    if constexpr (GQ)
        amma_finish_gq<KVT>(a, t, kvh, G, sp, ns, m, l, unit, acc, sm_m, sm_l, apipe_ring, &sm_last, out);
    else
        amma_finish(a, t, h, sp, ns, m, l, unit, acc, sm_m, sm_l, sm_o, &sm_last, out);
}

/* Launches the pipelined kernel, raising its dynamic shared-memory limit
 * once per device first (with the whole L1 as shared memory: the rings
 * decide the blocks an SM). */
template <int KVT, bool GQ>
static cudaError_t apipe_launch(const tbc_attn_args &a, dim3 grid, const float *qkv, float *out, cudaStream_t s) {
    static unsigned done = 0;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = tbc_smem_optin(attn_mma_pipe_kernel<KVT, GQ>, apipe<KVT>::SMEM, dev, &done, true);
    if (e != cudaSuccess) return e;
    return tbc_launch(attn_mma_pipe_kernel<KVT, GQ>, grid, dim3(ATTN_WARPS * 32), (size_t)apipe<KVT>::SMEM, s, a,
                      qkv, out);
}

template <bool GQ>
static cudaError_t apipe_launch_kv(const tbc_attn_args &a, dim3 grid, const float *qkv, float *out, cudaStream_t s) {
    if (a.kv_f16) return apipe_launch<KVT_F16, GQ>(a, grid, qkv, out, s);
    if (a.kv_q == TBC_KVQ_I8) return apipe_launch<KVT_I8, GQ>(a, grid, qkv, out, s);
    return apipe_launch<KVT_FP8, GQ>(a, grid, qkv, out, s);
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

template <int KVT>
static cudaError_t attn_launch(int epl, dim3 grid, const tbc_attn_args &a, const float *qkv, float *out,
                               cudaStream_t s) {
    dim3 block(ATTN_WARPS * 32);
    switch (epl) {
    case 1: return tbc_launch(attn_kernel<1, KVT>, grid, block, 0, s, a, qkv, out);
    case 2: return tbc_launch(attn_kernel<2, KVT>, grid, block, 0, s, a, qkv, out);
    case 3: return tbc_launch(attn_kernel<3, KVT>, grid, block, 0, s, a, qkv, out);
    case 4: return tbc_launch(attn_kernel<4, KVT>, grid, block, 0, s, a, qkv, out);
    case 5: return tbc_launch(attn_kernel<5, KVT>, grid, block, 0, s, a, qkv, out);
    case 6: return tbc_launch(attn_kernel<6, KVT>, grid, block, 0, s, a, qkv, out);
    case 7: return tbc_launch(attn_kernel<7, KVT>, grid, block, 0, s, a, qkv, out);
    case 8: return tbc_launch(attn_kernel<8, KVT>, grid, block, 0, s, a, qkv, out);
    case 16:
        if constexpr (KVT == KVT_F16 || KVT == KVT_BF16)
            if (a.early) return tbc_launch(attn_kernel<16, KVT, true>, grid, block, 0, s, a, qkv, out);
        return tbc_launch(attn_kernel<16, KVT>, grid, block, 0, s, a, qkv, out);
    }
    return cudaErrorInvalidValue;
}

/* 1 when a's cache fields are consistent: at most one of f16, bf16 and a
 * quantised type; for int8 / fp8, blocks laid out as kv_layout.h says
 * (scales after the codes, both 64-byte aligned, as the vector loads need). */
static int kv_args_ok(const tbc_attn_args *a) {
    if (a->kv_f16 + a->kv_bf16 + (a->kv_q != TBC_KVQ_NONE) > 1) return 0;
    if (a->kv_q == TBC_KVQ_NONE) return 1;
    size_t codes = (size_t)a->block_size * (size_t)a->n_kv * (size_t)a->hd;
    size_t scales = (size_t)a->block_size * (size_t)a->n_kv * sizeof(float);
    return (a->kv_q == TBC_KVQ_I8 || a->kv_q == TBC_KVQ_FP8) && a->kv_scale_off % 64 == 0 &&
           a->kv_block_bytes % 64 == 0 && a->kv_scale_off >= codes && a->kv_block_bytes >= a->kv_scale_off + scales;
}

/* mma 5 (auto) takes the GQA kernel from this many (token, kv head) blocks
 * (before splits) on: measured faster at 128 and 512 (batch 16 and 64 of 8 kv
 * heads), slower at 8 (batch 1: a block's G outputs are merged one after
 * another; docs/GPU.md) */
#define AMMA_GQ_MIN_BLOCKS 128

extern "C" int tbc_attention_q_heads_per_block(const tbc_attn_args *a) {
    const int G = a->n_kv > 0 ? a->n_heads / a->n_kv : 1;
    const int on = a->mma == 4 || (a->mma == 5 && a->T * a->n_kv >= AMMA_GQ_MIN_BLOCKS);
    return on && a->hd == AMMA_HD && a->block_size % 16 == 0 && (a->kv_q || a->kv_f16) && G >= 2 && G <= AMMA_GQ ? G
                                                                                                               : 1;
}

extern "C" cudaError_t tbc_attention(const tbc_attn_args *args, float *qkv, float *out, cudaStream_t s) {
    if (!tbc_attention_supports(args->hd) || args->n_splits < 1 || args->n_kv < 1 || args->n_heads % args->n_kv ||
        (args->n_splits > 1 && !args->counters) || !kv_args_ok(args) ||
        (args->ys_sw && (args->rope_done || !args->ys_sx)) || (args->ys_raw16 && !args->ys_sw))
        return cudaErrorInvalidValue;
    cudaError_t e;
    tbc_attn_args b = *args, *a = &b;
    if (!a->rope_done) {
        e = rope_kv_launch(a, qkv, s);
        if (e != cudaSuccess) return e;
        if (a->ys_raw16) a->q16 = 1; /* rope_kv wrote q as f16 */
    }
    int S = group_lanes(a->hd);
    /* fewer lanes per key (more keys in flight per warp): hd / 16 (auto) or on request */
    const int want = a->lanes < 0 ? a->hd / 16 : a->lanes;
    if (want > 0 && want < S && S % want == 0 && a->hd / want == 16) S = want;
    int epl = a->hd / S;
    dim3 grid(a->n_heads, a->T, a->n_splits);
    const bool mma_shape = a->hd == AMMA_HD && a->block_size % 16 == 0;
    if (tbc_attention_q_heads_per_block(a) > 1) /* GQA heads in the mma's rows */
        return apipe_launch_kv<true>(*a, dim3(a->n_kv, a->T, a->n_splits), qkv, out, s);
    /* the pipelined kernel: f16 / e4m3 / int8 caches under 3 and 4, int8 (else scalar) under 5 */
    const bool pipe = a->mma == 5 ? a->kv_q == TBC_KVQ_I8 : (a->mma == 3 || a->mma == 4) && (a->kv_q || a->kv_f16);
    if (pipe && mma_shape) return apipe_launch_kv<false>(*a, grid, qkv, out, s);
    if (a->mma && mma_shape && (a->kv_q == TBC_KVQ_FP8 || (a->kv_f16 && !a->kv_q))) {
        const dim3 block(ATTN_WARPS * 32);
        const bool warp = a->mma == 6 || a->mma == 7 || (a->mma == 5 && a->warp_min > 0 && a->T * a->n_heads >= a->warp_min);
        if (warp && a->n_splits == 1) { /* a warp a (token, head) */
            const dim3 wg((unsigned)((a->T * a->n_heads + ATTN_WARPS - 1) / ATTN_WARPS));
            if (a->mma == 7)
                return a->kv_f16 ? tbc_launch(attn_mma_warp_kernel<KVT_F16, 2, 2>, wg, block, 0, s, *a, qkv, out)
                                 : tbc_launch(attn_mma_warp_kernel<KVT_FP8, 2, 3>, wg, block, 0, s, *a, qkv, out);
            return a->kv_f16 ? tbc_launch(attn_mma_warp_kernel<KVT_F16, 1, 4>, wg, block, 0, s, *a, qkv, out)
                             : tbc_launch(attn_mma_warp_kernel<KVT_FP8, 1, 4>, wg, block, 0, s, *a, qkv, out);
        }
        if (a->mma == 2) /* 96 registers (24 bytes spilled): five blocks an SM */
            return a->kv_f16 ? tbc_launch(attn_mma_kernel<KVT_F16, 5, false>, grid, block, 0, s, *a, qkv, out)
                             : tbc_launch(attn_mma_kernel<KVT_FP8, 5, false>, grid, block, 0, s, *a, qkv, out);
        if (a->early)
            return a->kv_f16 ? tbc_launch(attn_mma_kernel<KVT_F16, 4, true>, grid, block, 0, s, *a, qkv, out)
                             : tbc_launch(attn_mma_kernel<KVT_FP8, 4, true>, grid, block, 0, s, *a, qkv, out);
        return a->kv_f16 ? tbc_launch(attn_mma_kernel<KVT_F16, 4, false>, grid, block, 0, s, *a, qkv, out)
                         : tbc_launch(attn_mma_kernel<KVT_FP8, 4, false>, grid, block, 0, s, *a, qkv, out);
    }
    if (a->kv_q == TBC_KVQ_I8) return attn_launch<KVT_I8>(epl, grid, *a, qkv, out, s);
    if (a->kv_q == TBC_KVQ_FP8) return attn_launch<KVT_FP8>(epl, grid, *a, qkv, out, s);
    if (a->kv_bf16) return attn_launch<KVT_BF16>(epl, grid, *a, qkv, out, s);
    return a->kv_f16 ? attn_launch<KVT_F16>(epl, grid, *a, qkv, out, s) : attn_launch<KVT_F32>(epl, grid, *a, qkv, out, s);
}

/* ---------------------------------------------------------------- prefill through GEMMs
 * A run of many query tokens of one sequence (a prompt or a prefill chunk)
 * is attended with two batched GEMMs per layer (cuBLAS, on the host side):
 * S = scale * Q K^T per head, a causal softmax of S into P, O = P V. The
 * kernels here gather the sequence's keys and values out of the paged
 * cache into contiguous per-query-head matrices (GQA heads repeated), round
 * q to the cache type, and do the softmax. An int8 / fp8 cache is gathered
 * dequantised (code * scale, in f32, rounded to f16) and q rounded to f16:
 * the f16 GEMMs, as for an f16 cache. */

__global__ void attn_gather_kv_kernel(tbc_attn_args a, int seq_slot, int L, int ld_l, void *kx, void *vx) {
    const int j = blockIdx.x, hd = a.hd, H = a.n_heads, KV = a.n_kv, G = H / KV;
    if (j >= L) return;
    int blk = a.block_tables[(size_t)seq_slot * a.max_blocks + j / a.block_size];
    if (a.kv_q) {
        const size_t r0 = (size_t)(j % a.block_size) * KV; /* (row, head 0) of the block */
        const uint8_t *kb = (const uint8_t *)a.k_cache + (size_t)blk * a.kv_block_bytes;
        const uint8_t *vb = (const uint8_t *)a.v_cache + (size_t)blk * a.kv_block_bytes;
        const float *ks = (const float *)(kb + a.kv_scale_off) + r0, *vs = (const float *)(vb + a.kv_scale_off) + r0;
        for (int e = threadIdx.x; e < H * hd; e += blockDim.x) {
            int h = e / hd, d = e % hd, kvh = h / G;
            size_t s = (r0 + kvh) * hd + d, dst = ((size_t)h * ld_l + j) * hd + d;
            ((__half *)kx)[dst] = __float2half_rn(kv_decode(kb[s], a.kv_q) * ks[kvh]);
            ((__half *)vx)[dst] = __float2half_rn(kv_decode(vb[s], a.kv_q) * vs[kvh]);
        }
        return;
    }
    size_t src = ((size_t)blk * a.block_size + (size_t)(j % a.block_size)) * (size_t)KV * hd;
    for (int e = threadIdx.x; e < H * hd; e += blockDim.x) {
        int h = e / hd, d = e % hd;
        size_t s = src + (size_t)(h / G) * hd + d, dst = ((size_t)h * ld_l + j) * hd + d;
        if (a.kv_f16) {
            ((__half *)kx)[dst] = ((const __half *)a.k_cache)[s];
            ((__half *)vx)[dst] = ((const __half *)a.v_cache)[s];
        } else {
            ((float *)kx)[dst] = ((const float *)a.k_cache)[s];
            ((float *)vx)[dst] = ((const float *)a.v_cache)[s];
        }
    }
}

__global__ void attn_gather_q_kernel(tbc_attn_args a, const float *qkv, int t0, void *qx) {
    const int i = blockIdx.x, hd = a.hd, H = a.n_heads, KV = a.n_kv;
    const float *q = qkv + (size_t)(t0 + i) * (size_t)(H + 2 * KV) * hd;
    for (int e = threadIdx.x; e < H * hd; e += blockDim.x) {
        size_t dst = (size_t)i * H * hd + e;
        const float qv = a.q16 ? __half2float(((const __half *)qkv)[(q - qkv) + e]) : q[e];
        if (a.kv_f16 || a.kv_q) ((__half *)qx)[dst] = __float2half_rn(qv);
        else ((float *)qx)[dst] = qv;
    }
}

/* One block per (query row i, head h): P[h, i, j] = softmax over j <= pos[i]
 * of S[h, i, :], zero for the keys after pos[i] (up to L). */
__global__ void attn_softmax_kernel(const float *S, void *P, int p16, const int32_t *pos, int nq, int L) {
    __shared__ float red[32];
    const int i = blockIdx.x, h = blockIdx.y;
    const size_t row = ((size_t)h * nq + i) * (size_t)L;
    const float *s = S + row;
    const int len = min(L, pos[i] + 1);
    float m = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, s[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    m = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) sum += __expf(s[j] - m);
    sum = tbc_block_sum(sum, red);
    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        float p = j < len ? __expf(s[j] - m) * inv : 0.0f;
        if (p16) ((__half *)P)[row + j] = __float2half_rn(p);
        else ((float *)P)[row + j] = p;
    }
}

extern "C" cudaError_t tbc_rope_kv(const tbc_attn_args *a, float *qkv, cudaStream_t s) {
    if (!kv_args_ok(a) || (a->ys_sw && !a->ys_sx) || (a->ys_raw16 && !a->ys_sw)) return cudaErrorInvalidValue;
    return rope_kv_launch(a, qkv, s);
}

extern "C" cudaError_t tbc_attn_gather(const tbc_attn_args *a, const float *qkv, int seq_slot, int t0, int n,
                                       int L, int ld_l, void *qx, void *kx, void *vx, cudaStream_t s) {
    if (L > ld_l || L < 1 || n < 1 || !kv_args_ok(a) || a->kv_bf16) return cudaErrorInvalidValue;
    cudaError_t e = tbc_launch(attn_gather_kv_kernel, dim3(L), dim3(256), 0, s, *a, seq_slot, L, ld_l, kx, vx);
    if (e != cudaSuccess) return e;
    return tbc_launch(attn_gather_q_kernel, dim3(n), dim3(256), 0, s, *a, qkv, t0, qx);
}

extern "C" cudaError_t tbc_attn_softmax(const float *S, void *P, int p16, const int32_t *pos, int H, int nq, int L,
                                        cudaStream_t s) {
    return tbc_launch(attn_softmax_kernel, dim3(nq, H), dim3(256), 0, s, S, P, p16, pos, nq, L);
}
