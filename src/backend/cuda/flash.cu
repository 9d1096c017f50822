/* flash.cu — flash-attention prefill: causal GQA attention of a run of query
 * tokens of one sequence over the paged f16 KV cache, on tensor cores, with
 * an online softmax and no score matrix in device memory (see
 * flash_kernels.h for the semantics).
 *
 * Work split. The query rows of a kv head's group are (token, q head) pairs,
 * token-major with the G = H / KV heads of the group innermost:
 *   row r = i G + g  ->  token t0 + i, q head kvh G + g      (R = n G rows)
 * A block (4 warps, 128 threads) takes FL_BM = 64 consecutive rows of one
 * kv head (grid (KV, ceil(R / 64)), heaviest row tiles first), so every K/V
 * tile it stages in shared memory serves all query heads that read it: with
 * GQA (TinyLlama: G = 8) a block is 8 tokens x 8 heads, without it (G = 1)
 * 64 tokens of one head. Each warp owns 16 rows.
 *
 * Per block: keys 0 .. (largest position of its rows) in tiles of FL_BN = 64,
 * lowest first. K and V tiles ((64, hd) f16 each, rows padded by 16 bytes so
 * ldmatrix is free of bank conflicts) are gathered from the paged cache with
 * cp.async, one cache row (key) at a time through the block table, into a
 * two-stage ring: tile j + 1 loads while tile j is computed. Keys past the
 * block's last position are zero-filled, never read.
 *
 * Per warp and key tile (mma.sync m16n8k16, f16 in, f32 accumulate):
 *   S (16, 64)  = q (16, hd) k^T: q is held in registers as A fragments
 *                 (rounded to f16 once, read from qkv f32), k^T fragments
 *                 come from shared memory by ldmatrix;
 *   mask        keys after the row's position -> -inf (only on tiles that
 *                 reach past the warp's first position);
 *   softmax     running max m and sum l per row in f32, scores scaled by
 *                 scale * log2(e) and exponentiated with exp2;
 *   O (16, hd) += P (16, 64) v: P rounded to f16 straight from the S
 *                 accumulators into A fragments, v fragments by
 *                 ldmatrix.trans.
 * Causal skipping: a warp skips key tiles that start after its last row's
 * position and, in the diagonal tile, the 16-key steps past it.
 * At the end O / l is written to out (f32), for the rows of the run only. */
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/flash_kernels.h"

#define FL_BM 64      /* query rows per block (4 warps x 16) */
#define FL_BN 64      /* keys per tile */
#define FL_WARPS 4
#define FL_THREADS (FL_WARPS * 32)

template <int HD>
struct flash_cfg {
    static constexpr int SROW = HD + 8;          /* halves per shared row: 16-byte pad */
    static constexpr int TILE = FL_BN * SROW;    /* halves per K or V tile */
    static constexpr size_t SMEM = 4 * (size_t)TILE * sizeof(__half); /* K, V x 2 stages */
};

/* ---------------------------------------------------------------- PTX helpers */

static __device__ __forceinline__ uint32_t flash_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, the last 16 - src_bytes bytes zero-filled. */
static __device__ __forceinline__ void flash_cp16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

static __device__ __forceinline__ void flash_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
static __device__ __forceinline__ void flash_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void flash_ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                   uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

static __device__ __forceinline__ void flash_ldsm4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                     uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* c (16x8 f32) += a (16x16 f16, row) b (16x8 f16, col) */
static __device__ __forceinline__ void flash_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* (x, y) rounded to f16, x in the low half (the lower column). */
static __device__ __forceinline__ uint32_t flash_pack(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* ---------------------------------------------------------------- K/V tile load
 * Keys kbase .. kbase + FL_BN - 1 of kv head kvh into sk, sv (FL_BN, SROW):
 * each 16-byte chunk of a cache row by one cp.async; key j lives in block
 * bt[j >> bs_log2], row j & (bs - 1). Keys >= kmax are zero-filled. */
template <int HD>
static __device__ __forceinline__ void flash_load_tile(uint32_t sk, uint32_t sv, const __half *kc, const __half *vc,
                                                       const int32_t *bt, int kbase, int kmax, int bs_log2, int KV,
                                                       int kvh, int tid) {
    constexpr int CPR = HD / 8;                         /* 16-byte chunks per row */
    constexpr int RSTEP = FL_THREADS / CPR;             /* rows per pass */
    constexpr int ITER = FL_BN / RSTEP;
    constexpr int SROW = flash_cfg<HD>::SROW;
    const int ch = tid % CPR, r0 = tid / CPR;
    const int bmask = (1 << bs_log2) - 1;
#pragma unroll
    for (int it = 0; it < ITER; it++) {
        const int r = r0 + it * RSTEP, key = kbase + r;
        const __half *ks = kc, *vs = vc;
        int sz = 0;
        if (key < kmax) {
            const int blk = __ldg(bt + (key >> bs_log2));
            const size_t off =
                ((((size_t)blk << bs_log2) + (size_t)(key & bmask)) * (size_t)KV + kvh) * HD + (size_t)ch * 8;
            ks = kc + off;
            vs = vc + off;
            sz = 16;
        }
        const uint32_t d = (uint32_t)(r * SROW + ch * 8) * 2u;
        flash_cp16(sk + d, ks, sz);
        flash_cp16(sv + d, vs, sz);
    }
}

/* ---------------------------------------------------------------- kernel */

template <int HD>
__global__ void __launch_bounds__(FL_THREADS, 2)
    flash_prefill_kernel(tbc_attn_args a, const float *__restrict__ qkv, float *__restrict__ out, int seq_slot,
                         int t0, int n, int bs_log2) {
    constexpr int SROW = flash_cfg<HD>::SROW, TILE = flash_cfg<HD>::TILE;
    constexpr int KS = HD / 16;    /* k-steps of q k^T */
    constexpr int ON = HD / 8;     /* n-tiles of O */
    constexpr int SN = FL_BN / 8;  /* n-tiles of S */
    extern __shared__ __align__(16) unsigned char flash_smem[];
    __shared__ int spos[FL_BM];

    tbc_pdl_wait();
    tbc_pdl_trigger();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3; /* mma fragment row group, column pair */
    const int H = a.n_heads, KV = a.n_kv, G = H / KV;
    const int kvh = blockIdx.x;
    const int row0 = (gridDim.y - 1 - blockIdx.y) * FL_BM; /* heaviest (last) rows first */
    const int R = n * G;

    /* positions of the block's rows; rows past R repeat the last row's */
    if (tid < FL_BM) {
        const int r = min(row0 + tid, R - 1);
        spos[tid] = a.pos[t0 + r / G];
    }
    __syncthreads();
    const int bmax = __reduce_max_sync(0xffffffffu, max(spos[lane], spos[lane + 32]));
    const int wpos = spos[warp * 16 + (lane & 15)];
    const int wmax = __reduce_max_sync(0xffffffffu, wpos), wmin = __reduce_min_sync(0xffffffffu, wpos);
    const int p0 = spos[warp * 16 + g], p1 = spos[warp * 16 + g + 8]; /* this thread's rows g, g + 8 */
    const int kmax = bmax + 1;                                          /* keys the block reads */
    const int ntiles = (kmax + FL_BN - 1) / FL_BN;

    const __half *kc = (const __half *)a.k_cache, *vc = (const __half *)a.v_cache;
    const int32_t *bt = a.block_tables + (size_t)seq_slot * a.max_blocks;
    const uint32_t sk = flash_smem_u32(flash_smem);  /* K (2, FL_BN, SROW) f16 */
    const uint32_t sv = sk + 2u * TILE * 2u;         /* V (2, FL_BN, SROW) f16 */

    /* first K/V tile in flight while q is read */
    flash_load_tile<HD>(sk, sv, kc, vc, bt, 0, kmax, bs_log2, KV, kvh, tid);
    flash_cp_commit();

    /* q (16, hd) of the warp as A fragments, f16: qf[k][0] (row g, cols 16k + 2c, +1),
     * [1] (row g + 8, same), [2] (row g, cols 16k + 8 + 2c, +1), [3] (row g + 8, same) */
    uint32_t qf[KS][4];
    {
        const size_t qstride = (size_t)(H + 2 * KV) * HD;
        const float *qr[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = min(row0 + warp * 16 + g + 8 * hf, R - 1);
            qr[hf] = qkv + (size_t)(t0 + r / G) * qstride + (size_t)(kvh * G + r % G) * HD + 2 * c;
        }
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const float2 x00 = *(const float2 *)(qr[0] + 16 * k), x10 = *(const float2 *)(qr[1] + 16 * k);
            const float2 x01 = *(const float2 *)(qr[0] + 16 * k + 8), x11 = *(const float2 *)(qr[1] + 16 * k + 8);
            qf[k][0] = flash_pack(x00.x, x00.y);
            qf[k][1] = flash_pack(x10.x, x10.y);
            qf[k][2] = flash_pack(x01.x, x01.y);
            qf[k][3] = flash_pack(x11.x, x11.y);
        }
    }

    float o[ON][4];
#pragma unroll
    for (int t = 0; t < ON; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* rows g, g + 8 (log2 domain) */
    const float sl2 = a.scale * 1.4426950408889634f;

    /* ldmatrix lane addresses (bytes into a tile).
     * K, x4 at (key 16p, col 16k): matrices (keys +0..7, cols +0..7), (+0..7, +8..15),
     *   (+8..15, +0..7), (+8..15, +8..15) = b0, b1 of n-tile 2p, b0, b1 of n-tile 2p + 1.
     * V, x4.trans at (key 16k, col 16q): matrices (keys +0..7, cols +0..7), (+8..15, +0..7),
     *   (+0..7, +8..15), (+8..15, +8..15) = b0, b1 of n-tile 2q, b0, b1 of n-tile 2q + 1. */
    const uint32_t klane = (uint32_t)(((lane & 7) + ((lane >> 4) << 3)) * SROW + ((lane >> 3) & 1) * 8) * 2u;
    const uint32_t vlane = (uint32_t)(((lane & 7) + (((lane >> 3) & 1) << 3)) * SROW + (lane >> 4) * 8) * 2u;

    for (int j = 0; j < ntiles; j++) {
        const int st = j & 1;
        if (j + 1 < ntiles)
            flash_load_tile<HD>(sk + (st ^ 1) * TILE * 2u, sv + (st ^ 1) * TILE * 2u, kc, vc, bt, (j + 1) * FL_BN,
                                kmax, bs_log2, KV, kvh, tid);
        flash_cp_commit();
        flash_cp_wait<1>(); /* tile j has landed (this thread's part) */
        __syncthreads();    /* ... and everyone's */

        const int kbase = j * FL_BN;
        if (kbase <= wmax) { /* warp-uniform: some row of the warp sees a key of this tile */
            /* ---- S = q k^T */
            float s[SN][4];
#pragma unroll
            for (int t = 0; t < SN; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
            const uint32_t kt = sk + st * TILE * 2u + klane;
#pragma unroll
            for (int p = 0; p < FL_BN / 16; p++) {
                if (kbase + 16 * p <= wmax) {
#pragma unroll
                    for (int k = 0; k < KS; k++) {
                        uint32_t b0, b1, b2, b3;
                        flash_ldsm4(kt + (uint32_t)(16 * p * SROW + 16 * k) * 2u, b0, b1, b2, b3);
                        flash_mma(s[2 * p], qf[k], b0, b1);
                        flash_mma(s[2 * p + 1], qf[k], b2, b3);
                    }
                }
            }
            /* ---- scale, causal mask (s[t]: rows g (0, 1), g + 8 (2, 3); key kbase + 8t + 2c (+1)) */
            const bool mask = kbase + FL_BN - 1 > wmin;
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int t = 0; t < SN; t++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = s[t][e] * sl2;
                    if (mask && kbase + 8 * t + 2 * c + (e & 1) > (e < 2 ? p0 : p1)) v = -INFINITY;
                    s[t][e] = v;
                }
                mx0 = fmaxf(mx0, fmaxf(s[t][0], s[t][1]));
                mx1 = fmaxf(mx1, fmaxf(s[t][2], s[t][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            /* ---- online softmax: new max, rescale of l and O */
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            /* a row with no key yet (cannot happen for valid positions) keeps 0s, not NaNs */
            const float z0 = n0 == -INFINITY ? 0.0f : n0, z1 = n1 == -INFINITY ? 0.0f : n1;
            const float c0 = exp2f(m0 - z0), c1 = exp2f(m1 - z1);
            m0 = n0;
            m1 = n1;
            float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
            for (int t = 0; t < SN; t++) {
                s[t][0] = exp2f(s[t][0] - z0);
                s[t][1] = exp2f(s[t][1] - z0);
                s[t][2] = exp2f(s[t][2] - z1);
                s[t][3] = exp2f(s[t][3] - z1);
                r0 += s[t][0] + s[t][1];
                r1 += s[t][2] + s[t][3];
            }
            l0 = l0 * c0 + r0;
            l1 = l1 * c1 + r1;
#pragma unroll
            for (int t = 0; t < ON; t++) {
                o[t][0] *= c0;
                o[t][1] *= c0;
                o[t][2] *= c1;
                o[t][3] *= c1;
            }
            /* ---- O += P v; the S accumulators of n-tiles 2k, 2k + 1 are the A fragment of k-step k */
            const uint32_t vt = sv + st * TILE * 2u + vlane;
#pragma unroll
            for (int k = 0; k < FL_BN / 16; k++) {
                if (kbase + 16 * k <= wmax) {
                    const uint32_t pa[4] = {flash_pack(s[2 * k][0], s[2 * k][1]), flash_pack(s[2 * k][2], s[2 * k][3]),
                                            flash_pack(s[2 * k + 1][0], s[2 * k + 1][1]),
                                            flash_pack(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
                    for (int q = 0; q < HD / 16; q++) {
                        uint32_t v0, v1, v2, v3;
                        flash_ldsm4_t(vt + (uint32_t)(16 * k * SROW + 16 * q) * 2u, v0, v1, v2, v3);
                        flash_mma(o[2 * q], pa, v0, v1);
                        flash_mma(o[2 * q + 1], pa, v2, v3);
                    }
                }
            }
        }
        __syncthreads(); /* stage st is refilled by the next iteration */
    }
    flash_cp_wait<0>();

    /* ---- out = O / l for the rows of the run */
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv[2] = {1.0f / l0, 1.0f / l1};
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = row0 + warp * 16 + g + 8 * hf;
        if (r < R) {
            float *op = out + (size_t)(t0 + r / G) * (size_t)H * HD + (size_t)(kvh * G + r % G) * HD + 2 * c;
#pragma unroll
            for (int t = 0; t < ON; t++)
                *(float2 *)(op + 8 * t) = make_float2(o[t][2 * hf] * inv[hf], o[t][2 * hf + 1] * inv[hf]);
        }
    }
}

/* ---------------------------------------------------------------- launcher */

extern "C" int tbc_flash_supports(int hd, int kv_f16) { return kv_f16 && (hd == 64 || hd == 128); }

template <int HD>
static cudaError_t flash_launch(const tbc_attn_args *a, const float *qkv, float *out, int seq_slot, int t0, int n,
                                int bs_log2, cudaStream_t s) {
    const size_t smem = flash_cfg<HD>::SMEM;
    /* the dynamic shared-memory limit, raised once per device (benign race:
     * two threads may both set it) */
    static unsigned attr_done = 0;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 32 || !(attr_done >> dev & 1u)) {
        e = cudaFuncSetAttribute(flash_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev < 32) attr_done |= 1u << dev;
    }
    const int G = a->n_heads / a->n_kv;
    const long long rows = (long long)n * G, tiles = (rows + FL_BM - 1) / FL_BM;
    if (tiles > 65535) return cudaErrorInvalidValue;
    dim3 grid(a->n_kv, (unsigned)tiles);
    return tbc_launch(flash_prefill_kernel<HD>, grid, dim3(FL_THREADS), smem, s, *a, qkv, out, seq_slot, t0, n,
                      bs_log2);
}

extern "C" cudaError_t tbc_flash_prefill(const tbc_attn_args *a, const float *qkv, float *out, int seq_slot, int t0,
                                         int n, cudaStream_t s) {
    if (!tbc_flash_supports(a->hd, a->kv_f16) || a->n_kv < 1 || a->n_heads < a->n_kv || a->n_heads % a->n_kv ||
        a->block_size < 1 || (a->block_size & (a->block_size - 1)) || n < 0 || t0 < 0 || seq_slot < 0)
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    int bs_log2 = 0;
    while ((1 << bs_log2) < a->block_size) bs_log2++;
    if (a->hd == 64) return flash_launch<64>(a, qkv, out, seq_slot, t0, n, bs_log2, s);
    return flash_launch<128>(a, qkv, out, seq_slot, t0, n, bs_log2, s);
}
