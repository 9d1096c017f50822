/* flash.cu — flash-attention prefill: causal GQA attention of a run of query
 * tokens of one sequence over the paged KV cache (f16, int8 or fp8), on
 * tensor cores, with an online softmax and no score matrix in device memory
 * (see flash_kernels.h for the semantics). A bf16 cache runs the same
 * kernel with bf16 operands (BF: q and P rounded to bf16, mma.sync .bf16),
 * so keys and values past f16's range stay as they are.
 *
 * Work split. The query rows of a kv head's group are (token, q head) pairs,
 * token-major with the G = H / KV heads of the group innermost:
 *   row r = i G + g  ->  token t0 + i, q head kvh G + g      (R = n G rows)
 * A block (4 warps, 128 threads) takes BM consecutive rows of one kv head
 * (grid (KV, ceil(R / BM))), so every K/V tile it stages in shared memory
 * serves all the query heads that read it: with GQA (TinyLlama, G = 8) a
 * block of 64 rows is 8 tokens x 8 heads, without it (G = 1) 64 tokens of
 * one head. Two variants (template MT, m16 tiles per warp):
 *   MT = 1  warps of 16 rows, BM = 64; q fragments held in registers
 *   MT = 2  warps of 32 rows, BM = 128: every K or V fragment a warp loads
 *           from shared memory feeds two mma's (shared-memory bandwidth,
 *           not the tensor cores, bounds a 16-row warp); q fragments from
 *           shared memory for hd 128 (registers), in registers for hd 64;
 *           hd 128 runs the softmax in steps of 32 keys (registers)
 * The launcher takes MT = 2 once its grid has at least two blocks per
 * multiprocessor (long runs: throughput), else MT = 1 (twice the blocks:
 * parallelism, the critical path of the heaviest row tile); MT = 1 always
 * over int8 / fp8 caches.
 * KQ: the cache's type, f16 (0) or int8 / fp8 codes with per-(key, kv
 * head) scales (TBC_KVQ_*): their tiles are loaded into registers across
 * the tile before (flash_qload_tile) and stored dequantised to f16
 * (flash_qstore_tile), so the mma part is the same.
 * Block order: heaviest (last) row tiles first; for a grid of at most two
 * blocks per multiprocessor, the second residents lightest first, so that a
 * multiprocessor pairs a heavy row tile with a light one.
 *
 * Shared memory (f16, rows of hd, 16-byte chunks XOR-swizzled by row & 7 so
 * that ldmatrix and the stores are free of bank conflicts):
 *   Q  (BM, hd)         the block's q rows, rounded to f16 once
 *   K, V (2, 64, hd)    two stages of key tiles
 * hd 128: 96 KB (MT 2) / 80 KB (MT 1); hd 64: 48 / 40 KB (all fit sm_89's 99 KB).
 *
 * Per block: keys 0 .. (largest position of its rows) in tiles of FL_BN = 64,
 * lowest first; K and V tiles are gathered from the paged cache with
 * cp.async, one cache row (key) at a time through the block table, tile
 * j + 1 in flight while tile j is computed. Keys past the block's last
 * position are zero-filled, never read.
 *
 * Per warp and softmax step (mma.sync m16n8k16, f16 (bf16) in, f32 accumulate):
 *   S (16 MT, 64)  = q k^T, k^T fragments by ldmatrix from K;
 *   mask        keys after the row's position -> -inf (only on steps that
 *                 reach past the warp's first position);
 *   softmax     running max m and sum l per row in f32, exp2 of
 *                 scale log2(e) (s - m);
 *   O (16 MT, hd) += P v: P rounded to f16 straight from the S accumulators
 *                 into A fragments, v fragments by ldmatrix.trans.
 * Causal skipping: a warp skips key steps that start after its last row's
 * position and, on the diagonal, the 16-key steps past it; warps whose rows
 * are all past the run do nothing.
 * At the end O / l is written to out (f32), for the rows of the run only. */
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/flash_kernels.h"

#define FL_WARPS 4
#define FL_THREADS (FL_WARPS * 32)
#define FL_BN 64                       /* keys per tile */

template <int HD, int MT>
struct flash_cfg {
    static constexpr int BM = FL_WARPS * MT * 16;                     /* query rows per block */
    static constexpr int ROWB = HD * 2;                               /* bytes per shared row */
    static constexpr int TILEB = FL_BN * ROWB;                        /* bytes per K or V tile */
    static constexpr int QB = BM * ROWB;                              /* bytes of Q */
    static constexpr size_t SMEM = (size_t)QB + 4 * (size_t)TILEB;    /* Q, K x 2, V x 2 */
    static constexpr bool QREG = MT == 1 || HD <= 64;                 /* q fragments in registers */
    static constexpr int KSUB = MT == 2 && HD > 64 ? 32 : FL_BN;      /* keys per softmax step */
    static constexpr int SN = KSUB / 8;                               /* n8 tiles of S per m16 tile */
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

static __device__ __forceinline__ void flash_ldsm4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void flash_ldsm4_t(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c (16x8 f32) += a (16x16, row) b (16x8, col): f16 operands, or bf16 (BF) */
template <bool BF>
static __device__ __forceinline__ void flash_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x (results below 2^-126 flush to 0) */
static __device__ __forceinline__ float flash_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* (x, y) rounded to f16 (bf16 with BF), x in the low half (the lower column). */
template <bool BF = false>
static __device__ __forceinline__ uint32_t flash_pack(float x, float y) {
    if constexpr (BF) {
        __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        return *reinterpret_cast<uint32_t *>(&h);
    } else {
        __half2 h = __floats2half2_rn(x, y);
        return *reinterpret_cast<uint32_t *>(&h);
    }
}

/* Byte offset of 16-byte chunk ch of row r in a swizzled (rows, hd) array. */
template <int HD>
static __device__ __forceinline__ uint32_t flash_swz(int r, int ch) {
    return (uint32_t)(r * (HD * 2) + ((ch ^ (r & 7)) << 4));
}

/* ---------------------------------------------------------------- K/V tile load
 * Keys kbase .. kbase + FL_BN - 1 of kv head kvh into sk, sv (FL_BN, hd):
 * each 16-byte chunk of a cache row by one cp.async; key j lives in block
 * bt[j >> bs_log2], row j & (bs - 1). Keys >= kmax are zero-filled. */
template <int HD>
static __device__ __forceinline__ void flash_load_tile(uint32_t sk, uint32_t sv, const __half *kc, const __half *vc,
                                                       const int32_t *bt, int kbase, int kmax, int bs_log2, int KV,
                                                       int kvh, int tid) {
    constexpr int CPR = HD / 8;             /* 16-byte chunks per row */
    constexpr int RSTEP = FL_THREADS / CPR; /* rows per pass */
    constexpr int ITER = FL_BN / RSTEP;
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
        const uint32_t d = flash_swz<HD>(r, ch);
        flash_cp16(sk + d, ks, sz);
        flash_cp16(sv + d, vs, sz);
    }
}

/* int8 / fp8 caches (KQ = TBC_KVQ_I8 / TBC_KVQ_FP8, kv_layout.h): the same
 * tile from one-byte codes and per-(key, kv head) f32 scales, in two halves
 * around the tile before it: flash_qload_tile issues the thread's loads
 * into registers (8 codes of K and of V a chunk, and the rows' scales),
 * flash_qstore_tile dequantises them to f16 (code value x scale in f32,
 * rounded once: the values the GEMM prefill's gather writes) into the
 * swizzled stage. */
template <int HD> struct flash_qregs {
    static constexpr int ITER = FL_BN / (FL_THREADS / (HD / 8));
    uint2 k[ITER], v[ITER];
    float ks[ITER], vs[ITER];
};
template <int HD>
static __device__ __forceinline__ void flash_qload_tile(flash_qregs<HD> &q, const uint8_t *kc, const uint8_t *vc,
                                                        size_t block_bytes, size_t scale_off, const int32_t *bt,
                                                        int kbase, int kmax, int bs_log2, int KV, int kvh, int tid) {
    constexpr int CPR = HD / 8, RSTEP = FL_THREADS / CPR;
    const int ch = tid % CPR, r0 = tid / CPR, bmask = (1 << bs_log2) - 1;
#pragma unroll
    for (int it = 0; it < flash_qregs<HD>::ITER; it++) {
        const int key = kbase + r0 + it * RSTEP;
        q.k[it] = q.v[it] = make_uint2(0u, 0u);
        q.ks[it] = q.vs[it] = 0.0f;
        if (key < kmax) {
            const size_t blk = (size_t)__ldg(bt + (key >> bs_log2));
            const size_t r = (size_t)(key & bmask) * KV + kvh; /* (row, kv head) of the block */
            const uint8_t *kb = kc + blk * block_bytes, *vb = vc + blk * block_bytes;
            q.k[it] = *(const uint2 *)(kb + r * HD + ch * 8);
            q.v[it] = *(const uint2 *)(vb + r * HD + ch * 8);
            q.ks[it] = ((const float *)(kb + scale_off))[r];
            q.vs[it] = ((const float *)(vb + scale_off))[r];
        }
    }
}
template <int KQ>
static __device__ __forceinline__ uint32_t flash_deq2(uint32_t codes2, float sc) { /* two codes in the low 16 bits */
    const float2 f = tbc_kv_codes2<KQ>(codes2);
    return flash_pack(f.x * sc, f.y * sc);
}
template <int HD, int KQ>
static __device__ __forceinline__ void flash_qstore_tile(const flash_qregs<HD> &q, unsigned char *smem, uint32_t sk_off,
                                                         uint32_t sv_off, int tid) {
    constexpr int CPR = HD / 8, RSTEP = FL_THREADS / CPR;
    const int ch = tid % CPR, r0 = tid / CPR;
#pragma unroll
    for (int it = 0; it < flash_qregs<HD>::ITER; it++) {
        const uint32_t d = flash_swz<HD>(r0 + it * RSTEP, ch);
        const uint2 kk = q.k[it], vv = q.v[it];
        *(uint4 *)(smem + sk_off + d) = make_uint4(flash_deq2<KQ>(kk.x, q.ks[it]), flash_deq2<KQ>(kk.x >> 16, q.ks[it]),
                                                   flash_deq2<KQ>(kk.y, q.ks[it]), flash_deq2<KQ>(kk.y >> 16, q.ks[it]));
        *(uint4 *)(smem + sv_off + d) = make_uint4(flash_deq2<KQ>(vv.x, q.vs[it]), flash_deq2<KQ>(vv.x >> 16, q.vs[it]),
                                                   flash_deq2<KQ>(vv.y, q.vs[it]), flash_deq2<KQ>(vv.y >> 16, q.vs[it]));
    }
}

/* ---------------------------------------------------------------- one softmax step of one warp
 * The warp's rows: m16 tile m (< MT), row g or g + 8 (h = 0, 1). S and O
 * accumulators: s[m][t] / o[m][t] hold rows g ([0], [1]) and g + 8 ([2], [3])
 * at columns 8t + 2c (+1).
 * NP: the 16-key steps of the KSUB keys that some row of the warp reaches
 * (KSUB / 16 but on the diagonal); the steps past them are neither
 * multiplied nor read.
 * Inner loops run over independent accumulators (mma chains interleave).
 *
 * ldmatrix lane addresses (x4: lanes 8i..8i+7 address the rows of matrix i):
 *   q (A, row-major) at (row 16m, k-chunk 2k): matrices (rows +0..7, chunk +0),
 *     (+8..15, +0), (+0..7, +1), (+8..15, +1) = a0..a3: row (l & 7) + 8 ((l >> 3) & 1),
 *     chunk + (l >> 4)
 *   k^T (B, col) at (key 16p, k-chunk 2k): (keys +0..7, chunk +0), (+0..7, +1),
 *     (+8..15, +0), (+8..15, +1) = b0, b1 of n-tile 2p, b0, b1 of n-tile 2p + 1:
 *     row (l & 7) + 8 (l >> 4), chunk + ((l >> 3) & 1)
 *   v (B, row-major, .trans) at (key 16k, d-chunk 2q): (keys +0..7, chunk +0),
 *     (+8..15, +0), (+0..7, +1), (+8..15, +1) = b0, b1 of n-tile 2q, b0, b1 of
 *     n-tile 2q + 1: row (l & 7) + 8 ((l >> 3) & 1), chunk + (l >> 4)
 * Every lane's row is = l (mod 8), so its swizzled chunk for a logical even
 * chunk 2k is 2k ^ y = 8 (k >> 2) + (2 (k & 3) ^ y) with y = (chunk bit) ^
 * (l & 7) < 8, a per-lane constant: four addresses per array and lane, the
 * rest immediate offsets. */

template <int HD, int MT>
struct flash_lane {
    /* [i]: the lane's address of logical chunk 2i (i < 4) in its row of Q
     * (m16 tile 0), K and V (stage 0); chunk 2k is at [k & 3] + 128 (k >> 2) */
    uint32_t q[4], k[4], v[4];
};

/* s (16 MT, 16 NP) = q k^T */
template <int HD, int MT, int NP, bool BF>
static __device__ __forceinline__ void flash_qk(float (&s)[MT][flash_cfg<HD, MT>::SN][4], const flash_lane<HD, MT> &ln,
                                                uint32_t koff,
                                                const uint32_t (&qreg)[MT][flash_cfg<HD, MT>::QREG ? HD / 16 : 1][4]) {
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if constexpr (flash_cfg<HD, MT>::QREG) {
#pragma unroll
                for (int i = 0; i < 4; i++) qa[m][i] = qreg[m][k][i];
            } else {
                flash_ldsm4(ln.q[k & 3] + (uint32_t)(m * 16 * HD * 2 + 128 * (k >> 2)), qa[m]);
            }
        }
#pragma unroll
        for (int p = 0; p < NP; p++) {
            uint32_t b[4];
            flash_ldsm4(ln.k[k & 3] + koff + (uint32_t)(16 * p * HD * 2 + 128 * (k >> 2)), b);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                flash_mma<BF>(s[m][2 * p], qa[m], b[0], b[1]);
                flash_mma<BF>(s[m][2 * p + 1], qa[m], b[2], b[3]);
            }
        }
    }
}

/* o (16 MT, hd) += P (16 MT, 16 NP) v; the S accumulators of n-tiles 2k, 2k + 1
 * (probabilities now) are the A fragment of k-step k */
template <int HD, int MT, int NP, bool BF>
static __device__ __forceinline__ void flash_pv(float (&o)[MT][HD / 8][4],
                                                const float (&s)[MT][flash_cfg<HD, MT>::SN][4],
                                                const flash_lane<HD, MT> &ln, uint32_t voff) {
#pragma unroll
    for (int k = 0; k < NP; k++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            pa[m][0] = flash_pack<BF>(s[m][2 * k][0], s[m][2 * k][1]);
            pa[m][1] = flash_pack<BF>(s[m][2 * k][2], s[m][2 * k][3]);
            pa[m][2] = flash_pack<BF>(s[m][2 * k + 1][0], s[m][2 * k + 1][1]);
            pa[m][3] = flash_pack<BF>(s[m][2 * k + 1][2], s[m][2 * k + 1][3]);
        }
#pragma unroll
        for (int q = 0; q < HD / 16; q++) {
            uint32_t b[4];
            flash_ldsm4_t(ln.v[q & 3] + voff + (uint32_t)(16 * k * HD * 2 + 128 * (q >> 2)), b);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                flash_mma<BF>(o[m][2 * q], pa[m], b[0], b[1]);
                flash_mma<BF>(o[m][2 * q + 1], pa[m], b[2], b[3]);
            }
        }
    }
}

/* Keys kbase .. kbase + KSUB - 1 (at koff / voff in K / V) into the warp's
 * running (m, l, o). prow: the positions of the thread's rows (-1: a row
 * past the run, which sees no key). m is the running max of the raw scores
 * q.k (scale > 0), l the running sum of this thread's probabilities (the
 * quad's are added at the end). */
template <int HD, int MT, bool BF>
static __device__ __forceinline__ void flash_tile(const flash_lane<HD, MT> &ln, uint32_t koff, uint32_t voff,
                                                  const uint32_t (&qreg)[MT][flash_cfg<HD, MT>::QREG ? HD / 16 : 1][4],
                                                  float (&o)[MT][HD / 8][4], float (&mr)[MT][2],
                                                  float (&lr)[MT][2], const int (&prow)[MT][2], int kbase,
                                                  int wmin, int wmax, int c, float sl2) {
    constexpr int KSUB = flash_cfg<HD, MT>::KSUB;
    const int np = min(KSUB / 16, (wmax - kbase) / 16 + 1);
    float s[MT][flash_cfg<HD, MT>::SN][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < flash_cfg<HD, MT>::SN; t++) s[m][t][0] = s[m][t][1] = s[m][t][2] = s[m][t][3] = 0.0f;
    switch (np) {
    case 1: flash_qk<HD, MT, 1, BF>(s, ln, koff, qreg); break;
    case 2: flash_qk<HD, MT, 2, BF>(s, ln, koff, qreg); break;
    case 3: flash_qk<HD, MT, KSUB / 16 >= 3 ? 3 : 1, BF>(s, ln, koff, qreg); break;
    default: flash_qk<HD, MT, KSUB / 16, BF>(s, ln, koff, qreg); break;
    }
    /* causal mask, on steps that reach past the warp's first position (np < KSUB / 16 implies it) */
    if (kbase + KSUB - 1 > wmin) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int t = 0; t < flash_cfg<HD, MT>::SN; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (kbase + 8 * t + 2 * c + (e & 1) > prow[m][e >> 1]) s[m][t][e] = -INFINITY;
    }
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int t = 0; t < flash_cfg<HD, MT>::SN; t++) mx = fmaxf(mx, fmaxf(s[m][t][2 * h], s[m][t][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* online softmax in the log2 domain: p = 2^(s sl2 - m sl2); a row
             * with no key yet keeps zeros, not NaNs */
            const float nm = fmaxf(mr[m][h], mx);
            const float z = nm == -INFINITY ? 0.0f : nm * sl2;
            const float corr = flash_exp2(mr[m][h] * sl2 - z);
            mr[m][h] = nm;
            float rs = 0.0f;
#pragma unroll
            for (int t = 0; t < flash_cfg<HD, MT>::SN; t++) {
                s[m][t][2 * h] = flash_exp2(fmaf(s[m][t][2 * h], sl2, -z));
                s[m][t][2 * h + 1] = flash_exp2(fmaf(s[m][t][2 * h + 1], sl2, -z));
                rs += s[m][t][2 * h] + s[m][t][2 * h + 1];
            }
            lr[m][h] = lr[m][h] * corr + rs;
#pragma unroll
            for (int t = 0; t < HD / 8; t++) {
                o[m][t][2 * h] *= corr;
                o[m][t][2 * h + 1] *= corr;
            }
        }
    }
    switch (np) {
    case 1: flash_pv<HD, MT, 1, BF>(o, s, ln, voff); break;
    case 2: flash_pv<HD, MT, 2, BF>(o, s, ln, voff); break;
    case 3: flash_pv<HD, MT, KSUB / 16 >= 3 ? 3 : 1, BF>(o, s, ln, voff); break;
    default: flash_pv<HD, MT, KSUB / 16, BF>(o, s, ln, voff); break;
    }
}

/* ---------------------------------------------------------------- kernel */

template <int HD, int MT, int KQ, bool BF>
__global__ void __launch_bounds__(FL_THREADS, 2)
    flash_prefill_kernel(tbc_attn_args a, const float *__restrict__ qkv, float *__restrict__ out, int seq_slot,
                         int t0, int n, int bs_log2, int pair_sms) {
    using cfg = flash_cfg<HD, MT>;
    constexpr int CPR = HD / 8; /* 16-byte chunks per row */
    extern __shared__ __align__(128) unsigned char flash_smem[];
    __shared__ int spos[cfg::BM];
    constexpr int WR = MT * 16; /* rows per warp */

    tbc_pdl_wait();
    tbc_pdl_trigger();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3; /* mma fragment row group, column pair */
    const int H = a.n_heads, KV = a.n_kv, G = H / KV;
    /* block order: heaviest (last) row tiles first; with pair_sms > 0 (a grid of at
     * most two blocks per multiprocessor) the blocks after the first pair_sms, which
     * become the second residents, lightest first, so heavy and light tiles pair up */
    int rank = blockIdx.y * gridDim.x + blockIdx.x;
    if (pair_sms > 0 && rank >= pair_sms) rank = pair_sms + (int)(gridDim.x * gridDim.y) - 1 - rank;
    const int kvh = rank % gridDim.x;
    const int row0 = (gridDim.y - 1 - rank / gridDim.x) * cfg::BM;
    const int R = n * G;

    /* positions of the block's rows; -1 past the run */
    if (tid < cfg::BM) {
        const int r = row0 + tid;
        spos[tid] = r < R ? a.pos[t0 + r / G] : -1;
    }
    __syncthreads();

    /* the block's last key, the warp's first and last positions, the thread's rows' */
    int bm = spos[lane];
#pragma unroll
    for (int i = 1; i < cfg::BM / 32; i++) bm = max(bm, spos[lane + 32 * i]);
    const int bmax = __reduce_max_sync(0xffffffffu, bm);
    const int wpos = spos[warp * WR + lane % WR];
    const int wmax = __reduce_max_sync(0xffffffffu, wpos), wmin = __reduce_min_sync(0xffffffffu, wpos);
    int prow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        prow[m][0] = spos[warp * WR + 16 * m + g];
        prow[m][1] = spos[warp * WR + 16 * m + g + 8];
    }
    const int kmax = bmax + 1; /* keys the block reads */
    const int ntiles = (kmax + FL_BN - 1) / FL_BN;

    const __half *kc = (const __half *)a.k_cache, *vc = (const __half *)a.v_cache;
    const int32_t *bt = a.block_tables + (size_t)seq_slot * a.max_blocks;
    const uint32_t sq = flash_smem_u32(flash_smem); /* Q (BM, hd) */
    const uint32_t sk = sq + cfg::QB;               /* K (2, 64, hd) */
    const uint32_t sv = sk + 2 * cfg::TILEB;        /* V (2, 64, hd) */

    /* first K/V tile in flight while q is staged */
    flash_qregs<HD> qr; /* KQ: the next tile's codes and scales */
    const uint8_t *kq = (const uint8_t *)a.k_cache, *vq = (const uint8_t *)a.v_cache;
    if (KQ) {
        if (ntiles > 0) {
            flash_qload_tile<HD>(qr, kq, vq, a.kv_block_bytes, a.kv_scale_off, bt, 0, kmax, bs_log2, KV, kvh, tid);
            flash_qstore_tile<HD, KQ>(qr, flash_smem, cfg::QB, cfg::QB + 2 * cfg::TILEB, tid);
        }
    } else {
        if (ntiles > 0) flash_load_tile<HD>(sk, sv, kc, vc, bt, 0, kmax, bs_log2, KV, kvh, tid);
        flash_cp_commit();
    }

    /* q of the block's rows -> Q, f16 or bf16 (BF) (zeros past the run) */
    {
        const size_t qstride = (size_t)(H + 2 * KV) * HD;
        for (int i = tid; i < cfg::BM * CPR; i += FL_THREADS) {
            const int r = i / CPR, ch = i % CPR, rg = row0 + r;
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (rg < R) {
                const size_t off = (size_t)(t0 + rg / G) * qstride + (size_t)(kvh * G + rg % G) * HD + ch * 8;
                if (a.q16) { /* rope_kv wrote q as f16 (tbc_attn_args.q16) */
                    u = *(const uint4 *)((const __half *)qkv + off);
                    if constexpr (BF) {
                        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
                            w[i] = flash_pack<true>(f.x, f.y);
                        }
                        u = make_uint4(w[0], w[1], w[2], w[3]);
                    }
                } else {
                    const float4 *src = (const float4 *)(qkv + off);
                    const float4 x0 = src[0], x1 = src[1];
                    u = make_uint4(flash_pack<BF>(x0.x, x0.y), flash_pack<BF>(x0.z, x0.w), flash_pack<BF>(x1.x, x1.y),
                                   flash_pack<BF>(x1.z, x1.w));
                }
            }
            *(uint4 *)(flash_smem + flash_swz<HD>(r, ch)) = u;
        }
    }
    __syncthreads();

    flash_lane<HD, MT> ln;
    {
        const int qr = (lane & 7) + 8 * ((lane >> 3) & 1);
        const uint32_t q0 = sq + (uint32_t)((warp * WR + qr) * HD * 2);
        const uint32_t k0 = sk + (uint32_t)(((lane & 7) + 8 * (lane >> 4)) * HD * 2), v0 = sv + (uint32_t)(qr * HD * 2);
        const int yq = (lane >> 4) ^ (lane & 7), yk = ((lane >> 3) & 1) ^ (lane & 7);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            ln.q[i] = q0 + (uint32_t)(((2 * i) ^ yq) << 4);
            ln.k[i] = k0 + (uint32_t)(((2 * i) ^ yk) << 4);
            ln.v[i] = v0 + (uint32_t)(((2 * i) ^ yq) << 4);
        }
    }
    uint32_t qreg[MT][cfg::QREG ? HD / 16 : 1][4];
    if constexpr (cfg::QREG) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int k = 0; k < HD / 16; k++)
                flash_ldsm4(ln.q[k & 3] + (uint32_t)(m * 16 * HD * 2 + 128 * (k >> 2)), qreg[m][k]);
    } else {
        qreg[0][0][0] = 0u; /* unused */
    }

    float o[MT][HD / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < HD / 8; t++) o[m][t][0] = o[m][t][1] = o[m][t][2] = o[m][t][3] = 0.0f;
    float mr[MT][2], lr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) mr[m][0] = mr[m][1] = -INFINITY, lr[m][0] = lr[m][1] = 0.0f;
    const float sl2 = a.scale * 1.4426950408889634f;

    for (int j = 0; j < ntiles; j++) {
        const uint32_t cur = (uint32_t)(j & 1) * cfg::TILEB, nxt = (uint32_t)((j + 1) & 1) * cfg::TILEB;
        if (KQ) { /* tile j + 1's loads in flight across tile j; stored after it */
            if (j + 1 < ntiles)
                flash_qload_tile<HD>(qr, kq, vq, a.kv_block_bytes, a.kv_scale_off, bt, (j + 1) * FL_BN, kmax, bs_log2,
                                     KV, kvh, tid);
            __syncthreads(); /* tile j stored by everyone */
        } else {
            if (j + 1 < ntiles)
                flash_load_tile<HD>(sk + nxt, sv + nxt, kc, vc, bt, (j + 1) * FL_BN, kmax, bs_log2, KV, kvh, tid);
            flash_cp_commit();
            flash_cp_wait<1>(); /* tile j has landed (this thread's part) */
            __syncthreads();    /* ... and everyone's */
        }
        /* softmax steps of KSUB keys; warp-uniform: some row of the warp sees a key of the step */
#pragma unroll
        for (int sub = 0; sub < FL_BN / cfg::KSUB; sub++) {
            const int kbase = j * FL_BN + sub * cfg::KSUB;
            const uint32_t off = cur + (uint32_t)(sub * cfg::KSUB * HD * 2);
            if (kbase <= wmax) flash_tile<HD, MT, BF>(ln, off, off, qreg, o, mr, lr, prow, kbase, wmin, wmax, c, sl2);
        }
        if (KQ) {
            /* the other stage was last read in tile j - 1, which every thread
             * finished before this iteration's barrier; this stage is refilled
             * after the next one's */
            if (j + 1 < ntiles) flash_qstore_tile<HD, KQ>(qr, flash_smem, cfg::QB + nxt, cfg::QB + 2 * cfg::TILEB + nxt, tid);
        } else {
            __syncthreads(); /* this stage is refilled by the next iteration */
        }
    }
    if (!KQ) flash_cp_wait<0>();

    /* ---- out = O / l for the rows of the run */
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float l = lr[m][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = 1.0f / l;
            const int r = row0 + warp * WR + 16 * m + g + 8 * h;
            if (r < R) {
                float *op = out + (size_t)(t0 + r / G) * (size_t)H * HD + (size_t)(kvh * G + r % G) * HD + 2 * c;
#pragma unroll
                for (int t = 0; t < HD / 8; t++)
                    *(float2 *)(op + 8 * t) = make_float2(o[m][t][2 * h] * inv, o[m][t][2 * h + 1] * inv);
            }
        }
    }
}

/* ---------------------------------------------------------------- launcher */

extern "C" int tbc_flash_supports(int hd, int kv_f16, int kv_bf16, int kv_q) {
    const int kinds = (kv_f16 != 0) + (kv_bf16 != 0) + (kv_q != TBC_KVQ_NONE); /* exactly one cache type */
    return kinds == 1 && (kv_q == TBC_KVQ_NONE || kv_q == TBC_KVQ_I8 || kv_q == TBC_KVQ_FP8) && (hd == 64 || hd == 128);
}

static int flash_force_rows = 0; /* tbc_flash_force_rows */
static int flash_pair_order = 1; /* tbc_flash_pair_order */

extern "C" void tbc_flash_pair_order(int on) { flash_pair_order = on != 0; }

extern "C" void tbc_flash_force_rows(int rows_per_warp) {
    flash_force_rows = rows_per_warp == 16 || rows_per_warp == 32 ? rows_per_warp : 0;
}

/* Raises the kernel's dynamic shared-memory limit once per device. */
template <int HD, int MT, int KQ, bool BF>
static cudaError_t flash_smem_attr(int dev) {
    static unsigned done = 0;
    return tbc_smem_optin(flash_prefill_kernel<HD, MT, KQ, BF>, (int)flash_cfg<HD, MT>::SMEM, dev, &done);
}

template <int HD, int MT, int KQ, bool BF>
static cudaError_t flash_launch_q(const tbc_attn_args *a, const float *qkv, float *out, int seq_slot, int t0, int n,
                                  int bs_log2, int dev, int nsm, cudaStream_t s) {
    cudaError_t e = flash_smem_attr<HD, MT, KQ, BF>(dev);
    if (e != cudaSuccess) return e;
    const long long rows = (long long)n * (a->n_heads / a->n_kv);
    const long long tiles = (rows + flash_cfg<HD, MT>::BM - 1) / flash_cfg<HD, MT>::BM;
    if (tiles > 65535 || a->n_kv > 65535) return cudaErrorInvalidValue;
    dim3 grid(a->n_kv, (unsigned)tiles);
    const int pair = flash_pair_order && a->n_kv * tiles <= 2LL * nsm ? nsm : 0;
    return tbc_launch(flash_prefill_kernel<HD, MT, KQ, BF>, grid, dim3(FL_THREADS), flash_cfg<HD, MT>::SMEM, s, *a, qkv, out,
                      seq_slot, t0, n, bs_log2, pair);
}

template <int HD, int MT>
static cudaError_t flash_launch(const tbc_attn_args *a, const float *qkv, float *out, int seq_slot, int t0, int n,
                                int bs_log2, int dev, int nsm, cudaStream_t s) {
    if (a->kv_q == TBC_KVQ_FP8) return flash_launch_q<HD, MT, TBC_KVQ_FP8, false>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s);
    if (a->kv_q == TBC_KVQ_I8) return flash_launch_q<HD, MT, TBC_KVQ_I8, false>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s);
    if (a->kv_bf16) return flash_launch_q<HD, MT, 0, true>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s);
    return flash_launch_q<HD, MT, 0, false>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s);
}

/* Multiprocessors of device dev (cached). */
static int flash_sm_count(int dev) {
    static int count[32];
    if (dev < 32 && count[dev] > 0) return count[dev];
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v < 1) v = 1;
    if (dev < 32) count[dev] = v;
    return v;
}

extern "C" cudaError_t tbc_flash_prefill(const tbc_attn_args *a, const float *qkv, float *out, int seq_slot, int t0,
                                         int n, cudaStream_t s) {
    if (!tbc_flash_supports(a->hd, a->kv_f16, a->kv_bf16, a->kv_q) || a->n_kv < 1 || a->n_heads < a->n_kv || a->n_heads % a->n_kv ||
        a->block_size < 1 || (a->block_size & (a->block_size - 1)) || !(a->scale > 0.0f) || n < 0 || t0 < 0 ||
        seq_slot < 0)
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    int bs_log2 = 0;
    while ((1 << bs_log2) < a->block_size) bs_log2++;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    /* 32 rows per warp (less shared-memory traffic per mma) once its blocks
     * fill two per multiprocessor; else 16 (twice the blocks and warps).
     * int8 / fp8 caches take 16: the 32-row variant holding the next tile's
     * codes in registers spills (7B, 512 tokens: 48.7 us against 24.3) */
    const long long rows = (long long)n * (a->n_heads / a->n_kv);
    const int nsm = flash_sm_count(dev);
    const bool wide = flash_force_rows ? flash_force_rows == 32
                                       : !a->kv_q && a->n_kv * ((rows + 127) / 128) >= 2LL * nsm;
    if (a->hd == 64)
        return wide ? flash_launch<64, 2>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s)
                    : flash_launch<64, 1>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s);
    return wide ? flash_launch<128, 2>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s)
                : flash_launch<128, 1>(a, qkv, out, seq_slot, t0, n, bs_log2, dev, nsm, s);
}
