/* qgemm.cu — the mixed-input GEMM of quantized weights (qgemm.h).
 *
 * Block: 256 threads, 128 rows (weights) by 8 MT NT tokens. Warp w takes
 * MT 16-row mma tiles (rows 16 MT (w % (8 / MT)) ..) and the NT 8-token
 * tiles from 8 NT (w / (8 / MT)): each widened A fragment feeds NT mmas.
 * MT = 1 (8 warps along the rows) widens each code once a block, MT = 2
 * twice with half the x fragments a warp; qg_cfg_of picks the shape by
 * step size and type. A step is 64 bytes of every row (64
 * codes of int8 / e4m3, 128 of int4) and the x of the same k for the
 * block's tokens (f16); NS steps are in flight in a ring of shared memory
 * (cp.async), int4 steps also carry the scales (and zeros) of their groups.
 *
 * k order: thread (g, q) of a warp (g = lane / 4, q = lane % 4) reads the
 * 16 bytes q of a row's step (int8: k = 16 q .. 16 q + 15, int4: 32 q ..
 * 32 q + 31) and the same k of x; each 32-bit word of codes widens to pairs
 * of consecutive k, (e0, e1), (e2, e3), ..., as x's f16 pairs come in
 * memory, so A and B agree without shuffles (the sum over k does not care
 * which k sits in which mma slot). int4's natural pairs: byte b of the word
 * copied to bytes 0 and 2 (prmt), its low nibble under the exponent of 1024
 * in the low half and its high nibble at 16 times that in the high half (one
 * lop3), then (1, 1/16) and (-1032, -72) in one f16x2 fma: both codes exact;
 * then code * scale + zero in f16, what the GEMV computes.
 *
 * Shared memory of x: a token's row of 16-byte units, the row 16 bytes
 * longer than the step (16 mod 128 bytes, so that the 8 lanes of a
 * 16-byte load phase fall on 8 distinct bank groups); int4's unit of
 * (q, j) sits at 4 q + (j ^ (q & 2)) for the same reason. */
#include <stdint.h>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/qgemm.h"
#include "backend/cuda/qwiden.cuh"

#define QG_BM 128
#define QG_THREADS 256
#define QG_MAX_SPLITS 8

/* MT: 16-row mma tiles a warp takes (2 or 1): the 8 warps stand 8 / MT
 * along the block's 128 rows and MT along its tokens; NT: 8-token mma tiles
 * a warp takes (8, 4, 2 or 1): the block holds 8 NT MT tokens. */
template <int QT, int MT, int NT>
struct qg_shape {
    static constexpr int WM = 8 / MT;                 /* warps along the rows */
    static constexpr int BN = 8 * NT * MT;            /* tokens a block */
    static constexpr int BK = QT == QT_I4 ? 128 : 64; /* k a step */
    static constexpr int U = BK / 8;                  /* 16-byte units of x a token and step */
    static constexpr int XROW = U * 16 + 16;          /* bytes of a token's row in shared memory */
    static constexpr int WB = QG_BM * 64;             /* codes a step */
    static constexpr int XB = BN * XROW;
    static constexpr int SB = QT == QT_I4 ? QG_BM * 4 * 4 * 2 : 0; /* scales and zeros: <= 4 groups a step */
    static constexpr int STAGE = WB + XB + SB;
    static constexpr int NS = QT == QT_I4 ? 3 : 4; /* steps in flight: two int4 / three int8 blocks an SM */
    static constexpr int PST = QG_BM + 4;            /* floats a token's partial sums take (cluster reduction) */
    static constexpr int SMEM = NS * STAGE;
};

__device__ __forceinline__ void qg_cp16(void *dst, const void *src, bool full) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    const int n = full ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}

/* bytes (4, 8 or 16) from src to dst, both aligned to it */
__device__ __forceinline__ void qg_cp_small(void *dst, const void *src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
    else if (bytes == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void qg_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void qg_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* One 32-bit word of int4 codes (element 2b in the low nibble of byte b,
 * 2b + 1 in the high one) -> four f16x2 of code * s + z in natural pairs. */
__device__ __forceinline__ void widen_word4_nat(uint32_t w, __half2 s, __half2 z, uint32_t *h) {
    const __half2 mul = u2h(0x2c003c00u); /* (1, 1/16) */
    const __half2 off = u2h(0xd480e408u); /* (-1032, -72) */
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const uint32_t v = __byte_perm(w, 0u, 0x1111u * (uint32_t)b);
        uint32_t d;
        asm("lop3.b32 %0, %1, %2, %3, 0x6a;\n" : "=r"(d) : "r"(v), "r"(0x00f0000fu), "r"(0x64806408u));
        h[b] = h2u(__hfma2(__hfma2(u2h(d), mul, off), s, z));
    }
}

/* Step `step` of the block into stage buffer st: codes of rows row0 .. +
 * 127 (rows past N read row N - 1, never stored), x16 of tokens tok0 .. +
 * 63 (past T: zeros), int4 scales and zeros of the step's groups. */
template <int QT, class S>
__device__ __forceinline__ void qg_load_w(unsigned char *st, const tbc_qweight &w, int row0, int N, size_t row_bytes,
                                          int step, int tid) {
    const unsigned char *codes = (const unsigned char *)w.codes;
#pragma unroll
    for (int i = 0; i < QG_BM * 4 / QG_THREADS; i++) {
        const int c = tid + QG_THREADS * i, r = c >> 2, part = c & 3;
        const int gr = min(row0 + r, N - 1);
        qg_cp16(st + r * 64 + part * 16, codes + (size_t)gr * row_bytes + (size_t)step * 64 + part * 16, true);
    }
    if (QT == QT_I4) {
        const int gps = S::BK / w.group; /* groups a step: 1, 2 or 4 */
        const int ng = (int)(row_bytes * 2) / w.group;
        float *sc = reinterpret_cast<float *>(st + S::WB + S::XB);
        const int r = tid & (QG_BM - 1), gr = min(row0 + r, N - 1);
        const size_t src = (size_t)gr * ng + (size_t)step * gps;
        if (tid < QG_BM)
            qg_cp_small(sc + r * 4, w.scales + src, gps * 4);
        else if (w.zeros)
            qg_cp_small(sc + QG_BM * 4 + r * 4, w.zeros + src, gps * 4);
    }
}

template <int QT, class S>
__device__ __forceinline__ void qg_load_x(unsigned char *st, const __half *x16, int tok0, int T, int K, int step,
                                          int tid) {
    unsigned char *xs = st + S::WB;
#pragma unroll
    for (int i = 0; i < (S::BN * S::U + QG_THREADS - 1) / QG_THREADS; i++) {
        const int lin = tid + QG_THREADS * i, tok = lin / S::U, c = lin % S::U;
        if (S::BN * S::U % QG_THREADS && lin >= S::BN * S::U) break;
        int slot = c;
        if (QT == QT_I4) {
            const int q = c >> 2, j = c & 3;
            slot = 4 * q + (j ^ (q & 2));
        }
        const bool ok = tok0 + tok < T;
        const __half *src = ok ? x16 + (size_t)(tok0 + tok) * K + (size_t)step * S::BK + 8 * c : x16;
        qg_cp16(xs + tok * S::XROW + slot * 16, src, ok);
    }
}

/* x's B fragments of the warp's NT token tiles: unit `slot` of tokens
 * 8 NT wn + 8 nt + g (g = lane / 4) from the stage's x. */
template <class S, int NT>
__device__ __forceinline__ void qg_frag_x(uint4 *xb, const unsigned char *xs, int wn, int g, int slot) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        xb[nt] = *reinterpret_cast<const uint4 *>(xs + (8 * NT * wn + 8 * nt + g) * S::XROW + 16 * slot);
}

/* RED 0: one block over K, y written. RED 1, 2: blockIdx.z takes steps
 * [z * sps, (z + 1) * sps) and its partial sums (row scales applied, no
 * bias) are added in the order of z: RED 1 writes them to ws[z] (T, N)
 * and qgemm_reduce_kernel adds them; RED 2 runs the splits of a tile as one
 * cluster (gridDim.z blocks): each block leaves its partials in its own
 * shared memory (the ring, free by then), and after a cluster barrier
 * block z adds slice z of the tile's partials from every block's shared
 * memory (distributed shared memory, the same order, the same sums as RED
 * 1) and writes y; a second barrier keeps every block's memory until all
 * have read it. (The last split of a tile adding the partials from global
 * memory, found by an atomic counter a tile, was tried: its one block's
 * serial sum at the end of the launch made 8-layer 7B steps 7-27% slower
 * on an H100.) */
template <int QT, int MT, int NT, int RED>
__global__ void __launch_bounds__(QG_THREADS, QT == QT_I4 ? 2 : 3)
    qgemm_kernel(const __half *__restrict__ x16, tbc_qweight w, const float *__restrict__ bias, float *__restrict__ y,
                 float *__restrict__ ws, int T, int K, int N, int sps) {
    using S = qg_shape<QT, MT, NT>;
    static_assert(S::BN * S::PST * 4 <= S::SMEM, "the partial sums fit in the ring");
    constexpr bool SPLIT = RED > 0;
    extern __shared__ __align__(16) unsigned char qg_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3, wm = warp % S::WM, wn = warp / S::WM;
    const int row0 = blockIdx.x * QG_BM, tok0 = blockIdx.y * S::BN;
    const int steps = K / S::BK;
    const int s0 = SPLIT ? blockIdx.z * sps : 0;
    const int s1 = SPLIT ? min(steps, s0 + sps) : steps;
    const int n = s1 - s0;
    const size_t row_bytes = QT == QT_I4 ? (size_t)K / 2 : (size_t)K;

    float acc[MT][NT][4];
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[a][b][c] = 0.0f;

    /* the codes do not depend on the previous kernel: their first steps
     * are on their way before waiting for it */
#pragma unroll
    for (int i = 0; i < S::NS - 1; i++)
        if (i < n) qg_load_w<QT, S>(qg_smem + i * S::STAGE, w, row0, N, row_bytes, s0 + i, tid);
    tbc_pdl_wait();
#pragma unroll
    for (int i = 0; i < S::NS - 1; i++) {
        if (i < n) qg_load_x<QT, S>(qg_smem + i * S::STAGE, x16, tok0, T, K, s0 + i, tid);
        qg_commit();
    }

    const int gi = QT == QT_I4 ? (32 * q) / w.group : 0; /* the thread's group within an int4 step */
    for (int it = 0; it < n; it++) {
        qg_wait<S::NS - 2>();
        __syncthreads();
        {
            const int nx = it + S::NS - 1;
            if (nx < n) {
                unsigned char *st = qg_smem + (nx % S::NS) * S::STAGE;
                qg_load_w<QT, S>(st, w, row0, N, row_bytes, s0 + nx, tid);
                qg_load_x<QT, S>(st, x16, tok0, T, K, s0 + nx, tid);
            }
            qg_commit();
        }
        const unsigned char *st = qg_smem + (it % S::NS) * S::STAGE;
        const unsigned char *xs = st + S::WB;
        uint4 wa[MT], wb[MT];
        __half2 sa[MT], za[MT], sb[MT], zb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int r = 16 * MT * wm + 16 * mt + g;
            wa[mt] = *reinterpret_cast<const uint4 *>(st + r * 64 + q * 16);
            wb[mt] = *reinterpret_cast<const uint4 *>(st + (r + 8) * 64 + q * 16);
            if (QT == QT_I4) {
                const float *sc = reinterpret_cast<const float *>(st + S::WB + S::XB);
                sa[mt] = __float2half2_rn(sc[r * 4 + gi]);
                sb[mt] = __float2half2_rn(sc[(r + 8) * 4 + gi]);
                za[mt] = __float2half2_rn(w.zeros ? sc[QG_BM * 4 + r * 4 + gi] : 0.0f);
                zb[mt] = __float2half2_rn(w.zeros ? sc[QG_BM * 4 + (r + 8) * 4 + gi] : 0.0f);
            }
        }
        if (QT == QT_I4) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint4 xb[NT];
                qg_frag_x<S, NT>(xb, xs, wn, g, 4 * q + (j ^ (q & 2)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const uint32_t ua = j == 0 ? wa[mt].x : j == 1 ? wa[mt].y : j == 2 ? wa[mt].z : wa[mt].w;
                    const uint32_t ub = j == 0 ? wb[mt].x : j == 1 ? wb[mt].y : j == 2 ? wb[mt].z : wb[mt].w;
                    uint32_t ha[4], hb[4];
                    widen_word4_nat(ua, sa[mt], za[mt], ha);
                    widen_word4_nat(ub, sb[mt], zb[mt], hb);
                    /* the first k16 half over every token tile, then the
                     * second: no mma waits on the one just issued */
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        mma16816<TBC_F16>(acc[mt][nt], ha[0], hb[0], ha[1], hb[1], xb[nt].x, xb[nt].y);
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        mma16816<TBC_F16>(acc[mt][nt], ha[2], hb[2], ha[3], hb[3], xb[nt].z, xb[nt].w);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint4 xb[NT];
                qg_frag_x<S, NT>(xb, xs, wn, g, 2 * q + j);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int wd = 2 * j + h; /* word of the thread's 16 bytes: k16 step wd */
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        const uint32_t ua = wd == 0 ? wa[mt].x : wd == 1 ? wa[mt].y : wd == 2 ? wa[mt].z : wa[mt].w;
                        const uint32_t ub = wd == 0 ? wb[mt].x : wd == 1 ? wb[mt].y : wd == 2 ? wb[mt].z : wb[mt].w;
                        uint32_t a0, a1, b0, b1;
                        widen_word8<QT>(ua, a0, a1);
                        widen_word8<QT>(ub, b0, b1);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            mma16816<TBC_F16>(acc[mt][nt], a0, b0, a1, b1, h ? xb[nt].z : xb[nt].x,
                                              h ? xb[nt].w : xb[nt].y);
                    }
                }
            }
        }
    }
    qg_wait<0>();
    tbc_pdl_trigger();

    /* acc[mt][nt]: (row g, token 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1) */
    if (RED == 2) {
        __syncthreads(); /* every warp is done with the ring */
        float *part = reinterpret_cast<float *>(qg_smem); /* (BN, PST): token-major, rows of the block */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int rl = 16 * MT * wm + 16 * mt + g + 8 * hr;
                const float mul = QT != QT_I4 ? __ldg(w.scales + min(row0 + rl, N - 1)) : 1.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int tl = 8 * NT * wn + 8 * nt + 2 * q;
                    part[tl * S::PST + rl] = acc[mt][nt][2 * hr] * mul;
                    part[(tl + 1) * S::PST + rl] = acc[mt][nt][2 * hr + 1] * mul;
                }
            }
        tbc_cluster_arrive();
        tbc_cluster_wait();
        const int sp = (int)gridDim.z, z = (int)blockIdx.z, tile = S::BN * QG_BM;
        const int e0 = z * tile / sp, e1 = (z + 1) * tile / sp;
        for (int e = e0 + tid; e < e1; e += QG_THREADS) {
            const int tl = e / QG_BM, rl = e % QG_BM, t = tok0 + tl, r = row0 + rl;
            float v = *tbc_cluster_map(part + tl * S::PST + rl, 0u);
            for (int o = 1; o < sp; o++) v += *tbc_cluster_map(part + tl * S::PST + rl, (unsigned)o);
            if (t < T && r < N) y[(size_t)t * N + r] = bias ? v + __ldg(bias + r) : v;
        }
        tbc_cluster_arrive();
        tbc_cluster_wait();
        return;
    }
    float *out = SPLIT ? ws + (size_t)blockIdx.z * (size_t)T * (size_t)N : y;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = row0 + 16 * MT * wm + 16 * mt + g + 8 * hr;
            if (r >= N) continue;
            float mul = 1.0f, add = 0.0f;
            if (QT != QT_I4) mul = __ldg(w.scales + r);
            if (!SPLIT && bias) add = __ldg(bias + r);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int t = tok0 + 8 * NT * wn + 8 * nt + 2 * q;
                if (t < T) out[(size_t)t * N + r] = acc[mt][nt][2 * hr] * mul + add;
                if (t + 1 < T) out[(size_t)(t + 1) * N + r] = acc[mt][nt][2 * hr + 1] * mul + add;
            }
        }
    }
}

/* y (T, N) = the sum of the splits' partials in order (+ bias). */
__global__ void qgemm_reduce_kernel(const float *__restrict__ ws, const float *__restrict__ bias, float *__restrict__ y,
                                    int T, int N, int splits) {
    tbc_pdl_wait();
    const size_t total = (size_t)T * (size_t)N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float v = ws[i];
        for (int z = 1; z < splits; z++) v += ws[(size_t)z * total + i];
        y[i] = bias ? v + __ldg(bias + i % (size_t)N) : v;
    }
}

/* Multiprocessors of the current device, its number (devp) and compute
 * capability (ccp: 10 major + minor; may be NULL), looked up once a device. */
static int qg_sms(int *devp, int *ccp) {
    static int sms[32], ccs[32];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    *devp = dev;
    if (dev < 32 && sms[dev]) {
        if (ccp) *ccp = ccs[dev];
        return sms[dev];
    }
    int n = 0, ma = 0, mi = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) n = 132;
    if (cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        ma = mi = 0;
    if (dev < 32) sms[dev] = n, ccs[dev] = 10 * ma + mi;
    if (ccp) *ccp = 10 * ma + mi;
    return n;
}

extern "C" int tbc_qgemm_supports(const tbc_qweight *w, const void *x16, int T, int K) {
    if (T < 1 || K < 1) return 0;
    if (((uintptr_t)w->codes | (uintptr_t)x16 | (uintptr_t)w->scales | (uintptr_t)w->zeros) & 15) return 0;
    if (w->type == TBC_Q_I4)
        return K % 128 == 0 && (w->group == 32 || w->group == 64 || w->group == 128) && K % w->group == 0;
    return (w->type == TBC_Q_I8 || w->type == TBC_Q_FP8) && K % 64 == 0 && w->group == K && !w->zeros;
}

/* Block shapes (tbc_set_qgemm_cfg): MT, NT; the block holds 8 NT MT
 * tokens. */
static const struct {
    int mt, nt;
} qg_cfgs[] = {{0, 0}, {2, 1}, {2, 2}, {2, 4}, {1, 1}, {1, 2}, {1, 4}, {1, 8}};
#define QG_NCFG ((int)(sizeof qg_cfgs / sizeof qg_cfgs[0]))

static int qgemm_cfg = 0, qgemm_split = 0, qgemm_cred = -1;
extern "C" void tbc_set_qgemm_bn(int bn) { qgemm_cfg = bn == 16 ? 1 : bn == 32 ? 2 : bn == 64 ? 3 : 0; }
extern "C" void tbc_set_qgemm_cfg(int cfg) { qgemm_cfg = cfg > 0 && cfg < QG_NCFG ? cfg : 0; }
extern "C" void tbc_set_qgemm_split(int sp) { qgemm_split = sp > 0 && sp <= QG_MAX_SPLITS ? sp : 0; }
extern "C" void tbc_set_qgemm_cluster(int on) { qgemm_cred = on < 0 ? -1 : on != 0; }

/* Whether the K splits of a step of T tokens add up in a cluster: by
 * default for int8 / e4m3 codes past 16 tokens, where the partials' round
 * trip through memory is largest against the codes (qgemv_bench on an H100,
 * a 7B layer and the logits: int8 32 / 64 tokens -4% / -10%, 16 tokens
 * +2%; int4 +7% / +11% at 32 / 64: its clusters of two-blocks-an-SM
 * blocks wait on each other longer; clusters of 8 splits (o_proj, down_proj) lose
 * everywhere, of 2, 3 and 5 win at 64 int8 tokens). */
static bool qg_cluster_of(int qt, int T, int sp, int cc) {
    if (sp < 2 || sp > 8 || cc < 90 || qgemm_cred == 0) return false;
    return qgemm_cred == 1 || (qt != TBC_Q_I4 && T > 16 && sp <= 5);
}

/* The block shape a step of T tokens of weights of type qt takes. One
 * 16-row tile a warp (8 warps along the rows: each code widened once a
 * block) up to 32 tokens, and for int4 above (its widening is dearer);
 * qgemv_bench on an H100, a 7B layer's matrices and the logits against
 * two tiles a warp: int4 16 / 32 / 64 tokens -20% / -13% / -9%, int8 -2% /
 * -4% and +2% at 64 (hence two tiles there). */
static int qg_cfg_of(int qt, int T) {
    if (qgemm_cfg) return qgemm_cfg;
    if (T <= 8) return 4;
    if (T <= 16) return 5;
    if (T <= 32) return 6;
    return qt == TBC_Q_I4 ? 7 : 3;
}

/* tbc_qgemm_splits on a device of `sms` multiprocessors */
static int qg_splits(const tbc_qweight *w, int T, int K, int N, size_t ws_bytes, int sms) {
    const int bk = w->type == TBC_Q_I4 ? 128 : 64, steps = K / bk, cfg = qg_cfg_of(w->type, T);
    const int bn = 8 * qg_cfgs[cfg].mt * qg_cfgs[cfg].nt;
    const int per_sm = w->type == TBC_Q_I4 ? 2 : 3;
    const long blocks = (long)((N + QG_BM - 1) / QG_BM) * (long)((T + bn - 1) / bn);
    const long target = (long)sms * per_sm;
    int sp;
    if (qgemm_split)
        sp = qgemm_split;
    else {
        if (blocks >= target) return 1;
        sp = (int)((target + blocks - 1) / blocks);
        if (sp > QG_MAX_SPLITS) sp = QG_MAX_SPLITS;
        while (sp > 1 && steps / sp < 8) sp--; /* at least 8 steps a split */
    }
    if (sp > steps) sp = steps;
    while (sp > 1 && (size_t)sp * (size_t)T * (size_t)N * sizeof(float) > ws_bytes) sp--;
    return sp;
}

extern "C" int tbc_qgemm_splits(const tbc_qweight *w, int T, int K, int N, size_t ws_bytes) {
    int dev;
    return qg_splits(w, T, K, N, ws_bytes, qg_sms(&dev, NULL));
}

template <int QT, int MT, int NT>
static cudaError_t qgemm_launch(const __half *x16, const tbc_qweight &w, const float *bias, float *y, int T, int K,
                                int N, float *ws, int sp, int dev, int cc, cudaStream_t s) {
    using S = qg_shape<QT, MT, NT>;
    static unsigned done[3];
    const int steps = K / S::BK, sps = (steps + sp - 1) / sp;
    sp = (steps + sps - 1) / sps; /* no empty split */
    dim3 grid((unsigned)((N + QG_BM - 1) / QG_BM), (unsigned)((T + S::BN - 1) / S::BN), (unsigned)sp);
    cudaError_t e;
    if (qg_cluster_of(w.type, T, sp, cc)) {
        e = tbc_smem_optin(qgemm_kernel<QT, MT, NT, 2>, S::SMEM, dev, &done[2]);
        if (e != cudaSuccess) return e;
        return tbc_launch_cluster_dim(qgemm_kernel<QT, MT, NT, 2>, grid, dim3(QG_THREADS), (size_t)S::SMEM, s,
                                      dim3(1, 1, (unsigned)sp), x16, w, bias, y, (float *)nullptr, T, K, N, sps);
    }
    if (sp > 1) {
        e = tbc_smem_optin(qgemm_kernel<QT, MT, NT, 1>, S::SMEM, dev, &done[1]);
        if (e == cudaSuccess)
            e = tbc_launch(qgemm_kernel<QT, MT, NT, 1>, grid, dim3(QG_THREADS), (size_t)S::SMEM, s, x16, w, bias, y,
                           ws, T, K, N, sps);
        if (e != cudaSuccess) return e;
        const size_t total = (size_t)T * (size_t)N;
        const unsigned blocks = (unsigned)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
        return tbc_launch(qgemm_reduce_kernel, dim3(blocks), dim3(256), 0, s, (const float *)ws, bias, y, T, N, sp);
    }
    e = tbc_smem_optin(qgemm_kernel<QT, MT, NT, 0>, S::SMEM, dev, &done[0]);
    if (e != cudaSuccess) return e;
    return tbc_launch(qgemm_kernel<QT, MT, NT, 0>, grid, dim3(QG_THREADS), (size_t)S::SMEM, s, x16, w, bias, y,
                      (float *)nullptr, T, K, N, steps);
}

template <int QT>
static cudaError_t qgemm_launch_cfg(const __half *x16, const tbc_qweight &w, const float *bias, float *y, int T,
                                    int K, int N, float *ws, int sp, int dev, int cc, cudaStream_t s) {
    switch (qg_cfg_of(w.type, T)) {
    case 1: return qgemm_launch<QT, 2, 1>(x16, w, bias, y, T, K, N, ws, sp, dev, cc, s);
    case 2: return qgemm_launch<QT, 2, 2>(x16, w, bias, y, T, K, N, ws, sp, dev, cc, s);
    case 4: return qgemm_launch<QT, 1, 1>(x16, w, bias, y, T, K, N, ws, sp, dev, cc, s);
    case 5: return qgemm_launch<QT, 1, 2>(x16, w, bias, y, T, K, N, ws, sp, dev, cc, s);
    case 6: return qgemm_launch<QT, 1, 4>(x16, w, bias, y, T, K, N, ws, sp, dev, cc, s);
    case 7: return qgemm_launch<QT, 1, 8>(x16, w, bias, y, T, K, N, ws, sp, dev, cc, s);
    default: return qgemm_launch<QT, 2, 4>(x16, w, bias, y, T, K, N, ws, sp, dev, cc, s);
    }
}

extern "C" cudaError_t tbc_qgemm(const void *x16, const tbc_qweight *w, const float *bias, float *y, int T, int K,
                                 int N, float *ws, size_t ws_bytes, cudaStream_t s) {
    if (!tbc_qgemm_supports(w, x16, T, K) || N < 1) return cudaErrorInvalidValue;
    int dev, cc;
    const int sms = qg_sms(&dev, &cc); /* the device looked up once a launch */
    const int sp = ws ? qg_splits(w, T, K, N, ws_bytes, sms) : 1;
    const __half *xh = (const __half *)x16;
    switch (w->type) {
    case TBC_Q_I8: return qgemm_launch_cfg<QT_I8>(xh, *w, bias, y, T, K, N, ws, sp, dev, cc, s);
    case TBC_Q_FP8: return qgemm_launch_cfg<QT_FP8>(xh, *w, bias, y, T, K, N, ws, sp, dev, cc, s);
    default: return qgemm_launch_cfg<QT_I4>(xh, *w, bias, y, T, K, N, ws, sp, dev, cc, s);
    }
}
