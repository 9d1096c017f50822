/* nn_mha.cu — the f16 fused attention (sdpa) on the tensor cores, the path
 * tbn_sdpa (nn_attn.cu) takes for f16 q, k, v, out with head dims D == Dv in
 * {32, 64, 128}: the flash-attention-2 recurrence with mma.sync m16n8k16
 * (f16 operands, f32 accumulation). Two kernels: mha_short_kernel for
 * T <= MHA_TS keys (the whole K and V of a head in shared memory, loaded by
 * cp.async at once, V read by ldmatrix.trans; below), and the tiled one
 * described here for the rest.
 *
 * One block of NW warps (1, 2, 4 or 8: mha_warps) owns 16 * NW query rows of
 * one (batch, head); each
 * warp owns 16 of them and keeps its Q fragments, its scores S (16 x 64
 * keys) and its output O (16 x D) in registers. Keys go in tiles of 64
 * through shared memory: K as [key][d], V transposed as [d][key] (the B
 * operand of P V wants key pairs adjacent), rows padded by 8 halves so the
 * fragment loads of the 8 row groups of a warp hit distinct banks. The
 * softmax runs in the log2 domain on the f32 scores; P is rounded to f16 for
 * the second product (as flash attention does); the row sums stay in f32.
 *
 * Operands are read through strides (tbn_sdpa_args.qs / ks / vs / os: batch,
 * head, row and, for k, the d stride), so q, k, v can be the (B, S, H, D)
 * outputs of the projections as well as (B, H, S, D) tensors, and k may be
 * given as (B, H, D, T). Loads are 16 bytes wide where the strides and
 * pointers allow it (the launcher checks), element by element otherwise.
 * Masks (additive, bool keep) and causal masking as the reference kernel
 * (ir/nn_conv.c sdpa_ref); a row with every key masked gets zeros. A key
 * tile's mask goes through shared memory (one row when it does not vary
 * along the queries, BERT's (B, 1, 1, T)): loading it per score from
 * global memory cost 30 us a BERT-base layer. */
#include <stdlib.h>

#include "backend/cuda/nn_common.cuh"

#define MHA_BK 64 /* keys per tile */
#ifndef MHA_SHORT_NW
#define MHA_SHORT_NW 4 /* warps a block of the short kernel (mha_short_warps) */
#endif

__device__ __forceinline__ void mha_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t mha_pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

/* dst[r][c] (row pitch ld halves) = element (r, c) of the source at
 * src + r rs + c cs, for r < rv and c < cv, zero elsewhere, by NT threads.
 * Either cs == 1 (rows contiguous along c: 8 columns per 16-byte load) or
 * rs == 1 (8 rows per load, scattered into 8 destination rows); vec: 16-byte
 * loads allowed (aligned pointer and strides). Every load of a thread is
 * issued before its first store: through generic pointers the compiler
 * cannot tell the shared-memory stores from the global loads, and a store
 * between two loads serialised them (one memory latency per 16 bytes). */
template <int R, int C, int NT>
__device__ __forceinline__ void mha_tile(__half *dst, int ld, const __half *src, int64_t rs, int64_t cs, int rv,
                                         int cv, bool vec, int tid) {
    constexpr int N = R * C / 8 / NT;
    static_assert(R * C / 8 % NT == 0, "tile not a multiple of the block");
    uint4 buf[N];
    const bool rows = cs == 1;
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int i = tid + u * NT;
        /* rows: (r, 8 columns from c); else (8 rows from r, column c) */
        const int r = rows ? i / (C / 8) : (i % (R / 8)) * 8, c = rows ? (i % (C / 8)) * 8 : i / (R / 8);
        const bool full = rows ? r < rv && c + 8 <= cv : c < cv && r + 8 <= rv;
        if (vec && full) {
            buf[u] = *(const uint4 *)(src + r * rs + c * cs);
        } else {
            __half v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int rr = rows ? r : r + e, cc = rows ? c + e : c;
                v[e] = rr < rv && cc < cv ? src[rr * rs + cc * cs] : __float2half(0.0f);
            }
            memcpy(&buf[u], v, 16);
        }
    }
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int i = tid + u * NT;
        if (rows) {
            *(uint4 *)(dst + (i / (C / 8)) * ld + (i % (C / 8)) * 8) = buf[u];
        } else {
            const int r = (i % (R / 8)) * 8, c = i / (R / 8);
            __half v[8];
            memcpy(v, &buf[u], 16);
#pragma unroll
            for (int e = 0; e < 8; e++) dst[(r + e) * ld + c] = v[e];
        }
    }
}

template <int D, int NW>
__global__ void __launch_bounds__(NW * 32) mha_kernel(tbn_sdpa_args a, const __half *q, const __half *k,
                                                     const __half *v, __half *out, int vec) {
    constexpr int BQ = 16 * NW, LQ = D + 8, LK = D + 8, LV = MHA_BK + 8;
    extern __shared__ __align__(16) unsigned char mha_sm[];
    __half *Qs = (__half *)mha_sm;       /* [BQ][LQ]     */
    __half *Ks = Qs + BQ * LQ;           /* [BK][LK]     */
    __half *Vt = Ks + MHA_BK * LK;       /* [D][LV]      */
    float *Ms = (float *)(Vt + D * LV);  /* [mr][BK]: the mask tile, log2 units (-inf: dropped) */
    const int mr = a.ms[2] == 0 ? 1 : BQ; /* a mask that does not vary along the rows: one row */
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
    const int64_t q0 = (int64_t)blockIdx.x * BQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const __half *qb = q + b * a.qs[0] + h * a.qs[1] + q0 * a.qs[2];
    const __half *kb = k + b * a.ks[0] + h * a.ks[1];
    const __half *vb = v + b * a.vs[0] + h * a.vs[1];
    const int sv = (int)(a.S - q0 < BQ ? a.S - q0 : BQ);
    mha_tile<BQ, D, NW * 32>(Qs, LQ, qb, a.qs[2], 1, sv, D, vec, tid);

    const float l2e = 1.4426950408889634f, sl2 = a.scale * l2e;
    const int64_t r0 = q0 + warp * 16 + g, r1 = r0 + 8; /* this thread's two rows */
    uint32_t qa[D / 16][4];
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    int64_t t_end = a.T;
    if (a.causal && q0 + BQ < t_end) t_end = q0 + BQ;
    for (int64_t t0 = 0; t0 < t_end; t0 += MHA_BK) {
        const int tv = (int)(a.T - t0 < MHA_BK ? a.T - t0 : MHA_BK);
        __syncthreads(); /* the previous tile's readers are done */
        if (a.ks[3] == 1) mha_tile<MHA_BK, D, NW * 32>(Ks, LK, kb + t0 * a.ks[2], a.ks[2], 1, tv, D, vec, tid);
        else mha_tile<MHA_BK, D, NW * 32>(Ks, LK, kb + t0, 1, a.ks[3], tv, D, vec, tid);
        mha_tile<D, MHA_BK, NW * 32>(Vt, LV, vb + t0 * a.vs[2], 1, a.vs[2], D, tv, vec, tid);
        if (a.mask_kind) {
            /* loaded once a block (coalesced along the keys), not once per score */
            for (int i = tid; i < mr * MHA_BK; i += NW * 32) {
                const int rr = i / MHA_BK, j = i % MHA_BK;
                const int64_t row = q0 + rr, tk = t0 + j;
                float mv = 0.0f;
                if (tk < a.T && row < a.S) {
                    const int64_t mo = b * a.ms[0] + h * a.ms[1] + row * a.ms[2] + tk * a.ms[3];
                    if (a.mask_kind == 1) mv = tbn_ldf(a.mask, a.mdt, mo) * l2e;
                    else mv = ((const uint8_t *)a.mask)[mo] ? 0.0f : -INFINITY;
                }
                Ms[i] = mv;
            }
        }
        __syncthreads();
        if (t0 == 0) {
            const __half *qr = Qs + (warp * 16 + g) * LQ + 2 * t4;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                qa[kk][0] = *(const uint32_t *)(qr + kk * 16);
                qa[kk][1] = *(const uint32_t *)(qr + 8 * LQ + kk * 16);
                qa[kk][2] = *(const uint32_t *)(qr + kk * 16 + 8);
                qa[kk][3] = *(const uint32_t *)(qr + 8 * LQ + kk * 16 + 8);
            }
        }
        /* S (16 x 64) = Q K^T */
        float s[MHA_BK / 8][4];
#pragma unroll
        for (int j = 0; j < MHA_BK / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const __half *kr = Ks + (j * 8 + g) * LK + 2 * t4;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                mha_mma(s[j], qa[kk], *(const uint32_t *)(kr + kk * 16), *(const uint32_t *)(kr + kk * 16 + 8));
        }
        /* scale, masks, row maxima (log2 domain) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < MHA_BK / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int jj = j * 8 + 2 * t4 + (e & 1);
                const int64_t tk = t0 + jj, row = e < 2 ? r0 : r1;
                float x = s[j][e] * sl2;
                if (a.mask_kind) x += Ms[(mr == 1 ? 0 : warp * 16 + g + (e < 2 ? 0 : 8)) * MHA_BK + jj];
                const bool keep = tk < a.T && !(a.causal && tk > row);
                x = keep ? x : -INFINITY;
                s[j][e] = x;
                if (e < 2) mx0 = fmaxf(mx0, x);
                else mx1 = fmaxf(mx1, x);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        /* a row with nothing kept so far subtracts 0 (every p is 0 then) */
        const float z0 = n0 == -INFINITY ? 0.0f : n0, z1 = n1 == -INFINITY ? 0.0f : n1;
        const float c0 = exp2f(m0 - z0), c1 = exp2f(m1 - z1);
        m0 = n0;
        m1 = n1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int j = 0; j < MHA_BK / 8; j++) {
            s[j][0] = exp2f(s[j][0] - z0);
            s[j][1] = exp2f(s[j][1] - z0);
            s[j][2] = exp2f(s[j][2] - z1);
            s[j][3] = exp2f(s[j][3] - z1);
            ps0 += s[j][0] + s[j][1];
            ps1 += s[j][2] + s[j][3];
        }
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }
        /* O += P V: the score fragments of key tiles 2kk, 2kk + 1 are the A
         * fragment of keys 16kk .. 16kk + 15 */
#pragma unroll
        for (int kk = 0; kk < MHA_BK / 16; kk++) {
            uint32_t pa[4] = {mha_pack(s[2 * kk][0], s[2 * kk][1]), mha_pack(s[2 * kk][2], s[2 * kk][3]),
                              mha_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              mha_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const __half *vr = Vt + (n * 8 + g) * LV + kk * 16 + 2 * t4;
                mha_mma(o[n], pa, *(const uint32_t *)vr, *(const uint32_t *)(vr + 8));
            }
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    __half *ob = out + b * a.os[0] + h * a.os[1];
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        const int c = n * 8 + 2 * t4;
        if (r0 < a.S) *(__half2 *)(ob + r0 * a.os[2] + c) = __floats2half2_rn(o[n][0] * i0, o[n][1] * i0);
        if (r1 < a.S) *(__half2 *)(ob + r1 * a.os[2] + c) = __floats2half2_rn(o[n][2] * i1, o[n][3] * i1);
    }
}

/* ---- short sequences: every key of the head in shared memory at once
 *
 * For T <= MHA_TS keys (BERT's 128) a block loads its Q rows and the head's
 * whole K and V with cp.async in one go (one memory latency, no register
 * staging), then runs the same recurrence over the 64-key tiles from shared
 * memory with no barrier in between. V stays [key][d] as it is in memory:
 * the B fragments of P V come from ldmatrix.trans, so the tile stores are
 * 16-byte copies instead of the transposed 2-byte stores (8-way bank
 * conflicts) of the kernel above. With the loads cheap, blocks can be
 * small: more SMs take part at batch 1 (mha_short_warps: 4 warps). Needs K as
 * [key][d] (ks[3] == 1), 16-byte aligned operands and strides, D 32 / 64. */
#define MHA_TS 128

__device__ __forceinline__ uint32_t mha_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mha_cp16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void mha_ldsm4t(uint32_t addr, uint32_t *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* rows [0, rows) of dst (pitch D + 8 halves) from src (row pitch rs
 * halves): rows < rv by cp.async, the others zero (a zero V row times a
 * zero probability stays 0; garbage could be NaN) */
template <int D, int NT>
__device__ __forceinline__ void mha_rows_async(__half *dst, const __half *src, int64_t rs, int rows, int rv, int tid) {
    constexpr int LD = D + 8, CH = D / 8;
    for (int i = tid; i < rows * CH; i += NT) {
        const int r = i / CH, c = (i % CH) * 8;
        __half *d = dst + r * LD + c;
        if (r < rv) mha_cp16(mha_smem(d), src + r * rs + c);
        else *(uint4 *)d = make_uint4(0u, 0u, 0u, 0u);
    }
}

template <int D, int NW>
__global__ void __launch_bounds__(NW * 32) mha_short_kernel(tbn_sdpa_args a, const __half *q, const __half *k,
                                                           const __half *v, __half *out) {
    constexpr int BQ = 16 * NW, LD = D + 8, NT = NW * 32;
    extern __shared__ __align__(16) unsigned char mha_sm[];
    __half *Qs = (__half *)mha_sm;           /* [BQ][LD]          */
    __half *Ks = Qs + BQ * LD;               /* [MHA_TS][LD]      */
    __half *Vs = Ks + MHA_TS * LD;           /* [MHA_TS][LD]      */
    float *Ms = (float *)(Vs + MHA_TS * LD); /* [mr][MHA_TS], log2 units */
    const int mr = a.ms[2] == 0 ? 1 : BQ;
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
    const int64_t q0 = (int64_t)blockIdx.x * BQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int sv = (int)(a.S - q0 < BQ ? a.S - q0 : BQ);
    const int T = (int)a.T;
    int t_end = T;
    if (a.causal && q0 + BQ < t_end) t_end = (int)(q0 + BQ);
    const int tp = (t_end + MHA_BK - 1) / MHA_BK * MHA_BK; /* key rows the tiles read */
    mha_rows_async<D, NT>(Qs, q + b * a.qs[0] + h * a.qs[1] + q0 * a.qs[2], a.qs[2], BQ, sv, tid);
    mha_rows_async<D, NT>(Ks, k + b * a.ks[0] + h * a.ks[1], a.ks[2], tp, T, tid);
    mha_rows_async<D, NT>(Vs, v + b * a.vs[0] + h * a.vs[1], a.vs[2], tp, T, tid);
    const float l2e = 1.4426950408889634f, sl2 = a.scale * l2e;
    if (a.mask_kind) {
        for (int i = tid; i < mr * tp; i += NT) {
            const int rr = i / tp, j = i % tp;
            const int64_t row = q0 + rr;
            float mv = 0.0f;
            if (j < T && row < a.S) {
                const int64_t mo = b * a.ms[0] + h * a.ms[1] + row * a.ms[2] + j * a.ms[3];
                if (a.mask_kind == 1) mv = tbn_ldf(a.mask, a.mdt, mo) * l2e;
                else mv = ((const uint8_t *)a.mask)[mo] ? 0.0f : -INFINITY;
            }
            Ms[rr * MHA_TS + j] = mv;
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();

    const int64_t r0 = q0 + warp * 16 + g, r1 = r0 + 8; /* this thread's two rows */
    uint32_t qa[D / 16][4];
    {
        const __half *qr = Qs + (warp * 16 + g) * LD + 2 * t4;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            qa[kk][0] = *(const uint32_t *)(qr + kk * 16);
            qa[kk][1] = *(const uint32_t *)(qr + 8 * LD + kk * 16);
            qa[kk][2] = *(const uint32_t *)(qr + kk * 16 + 8);
            qa[kk][3] = *(const uint32_t *)(qr + 8 * LD + kk * 16 + 8);
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const float *mrow = Ms + (mr == 1 ? 0 : warp * 16 + g) * MHA_TS;
    const int mr8 = mr == 1 ? 0 : 8 * MHA_TS;

    for (int t0 = 0; t0 < t_end; t0 += MHA_BK) {
        float s[MHA_BK / 8][4];
#pragma unroll
        for (int j = 0; j < MHA_BK / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const __half *kr = Ks + (t0 + j * 8 + g) * LD + 2 * t4;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                mha_mma(s[j], qa[kk], *(const uint32_t *)(kr + kk * 16), *(const uint32_t *)(kr + kk * 16 + 8));
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < MHA_BK / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tk = t0 + j * 8 + 2 * t4 + (e & 1);
                const int64_t row = e < 2 ? r0 : r1;
                float x = s[j][e] * sl2;
                if (a.mask_kind) x += mrow[(e < 2 ? 0 : mr8) + tk];
                const bool keep = tk < T && !(a.causal && tk > row);
                x = keep ? x : -INFINITY;
                s[j][e] = x;
                if (e < 2) mx0 = fmaxf(mx0, x);
                else mx1 = fmaxf(mx1, x);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float z0 = n0 == -INFINITY ? 0.0f : n0, z1 = n1 == -INFINITY ? 0.0f : n1;
        const float c0 = exp2f(m0 - z0), c1 = exp2f(m1 - z1);
        m0 = n0;
        m1 = n1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int j = 0; j < MHA_BK / 8; j++) {
            s[j][0] = exp2f(s[j][0] - z0);
            s[j][1] = exp2f(s[j][1] - z0);
            s[j][2] = exp2f(s[j][2] - z1);
            s[j][3] = exp2f(s[j][3] - z1);
            ps0 += s[j][0] + s[j][1];
            ps1 += s[j][2] + s[j][3];
        }
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }
        /* O += P V; lane l addresses key 16kk + (l & 15), columns 8 (n + (l >> 4)):
         * matrices 0 / 1 are the b0 / b1 of n8 tile n, 2 / 3 those of n + 1 */
#pragma unroll
        for (int kk = 0; kk < MHA_BK / 16; kk++) {
            uint32_t pa[4] = {mha_pack(s[2 * kk][0], s[2 * kk][1]), mha_pack(s[2 * kk][2], s[2 * kk][3]),
                              mha_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              mha_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const uint32_t va = mha_smem(Vs + (t0 + kk * 16 + (lane & 15)) * LD + (lane >> 4) * 8);
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                uint32_t vb[4];
                mha_ldsm4t(va + n * 8 * (int)sizeof(__half), vb);
                mha_mma(o[n], pa, vb[0], vb[1]);
                mha_mma(o[n + 1], pa, vb[2], vb[3]);
            }
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    __half *ob = out + b * a.os[0] + h * a.os[1];
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        const int c = n * 8 + 2 * t4;
        if (r0 < a.S) *(__half2 *)(ob + r0 * a.os[2] + c) = __floats2half2_rn(o[n][0] * i0, o[n][1] * i0);
        if (r1 < a.S) *(__half2 *)(ob + r1 * a.os[2] + c) = __floats2half2_rn(o[n][2] * i1, o[n][3] * i1);
    }
}

template <int D, int NW>
static cudaError_t mha_short_launch(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out,
                                    cudaStream_t s) {
    constexpr int BQ = 16 * NW;
    size_t smem = sizeof(__half) * (size_t)(BQ + 2 * MHA_TS) * (D + 8);
    if (a->mask_kind) smem += sizeof(float) * (size_t)(a->ms[2] == 0 ? 1 : BQ) * MHA_TS;
    static size_t opted = 0;
    if (smem > 48 * 1024 && smem > opted) {
        cudaError_t e =
            cudaFuncSetAttribute(mha_short_kernel<D, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        opted = smem;
    }
    dim3 grid((unsigned)((a->S + BQ - 1) / BQ), (unsigned)(a->B * a->H));
    mha_short_kernel<D, NW><<<grid, NW * 32, smem, s>>>(*a, (const __half *)q, (const __half *)k,
                                                       (const __half *)v, (__half *)out);
    return cudaGetLastError();
}

/* Warps a block of the short kernel: 4 (BERT-base f16 on the H200,
 * 2026-12-02, one engine, interleaved: 1 / 2 / 4 / 8 warps 0.491 / 0.473 /
 * 0.464 / 0.479 ms at batch 1, 0.788 / 0.685 / 0.673 / 0.679 at batch 8;
 * the tiled kernel above 0.510 / 0.708). TB_CUDA_MHA_NW forces as for the
 * kernel above, TB_CUDA_MHA_SHORT=0 turns the short kernel off. */
static int mha_short_warps(const tbn_sdpa_args *a) {
    static int force = -2;
    if (force == -2) {
        const char *on = getenv("TB_CUDA_MHA_SHORT");
        const char *ev = getenv("TB_CUDA_MHA_NW");
        int f = ev ? atoi(ev) : 0;
        force = on && !strcmp(on, "0") ? -1 : f == 1 || f == 2 || f == 4 || f == 8 ? f : 0;
    }
    if (force) return force;
    (void)a;
    return MHA_SHORT_NW;
}

template <int D, int NW>
static cudaError_t mha_launch(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out, int vec,
                              cudaStream_t s) {
    constexpr int BQ = 16 * NW;
    size_t smem = sizeof(__half) * ((size_t)BQ * (D + 8) + (size_t)MHA_BK * (D + 8) + (size_t)D * (MHA_BK + 8));
    if (a->mask_kind) smem += sizeof(float) * (size_t)(a->ms[2] == 0 ? 1 : BQ) * MHA_BK;
    static size_t opted = 0;
    if (smem > 48 * 1024 && smem > opted) {
        cudaError_t e = cudaFuncSetAttribute(mha_kernel<D, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        opted = smem;
    }
    dim3 grid((unsigned)((a->S + BQ - 1) / BQ), (unsigned)(a->B * a->H));
    mha_kernel<D, NW><<<grid, NW * 32, smem, s>>>(*a, (const __half *)q, (const __half *)k, (const __half *)v,
                                                 (__half *)out, vec);
    return cudaGetLastError();
}

static int mha_al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Warps a block (16 query rows each). Every block loads the whole K and V
 * of its head, so fewer, larger blocks load less and split each tile load
 * among more threads: on the H200, BERT-base f16 (12 heads x 128 queries)
 * ran 0.602 / 0.537 / 0.508 / 0.505 ms with 1 / 2 / 4 / 8 warps a block at
 * batch 1 (96 / 48 / 24 / 12 blocks: idle SMs cost less than repeated, serial
 * tile loads) and 0.765 / 0.720 / 0.700 ms with 2 / 4 / 8 at batch 8
 * (2026-12-01, same engine, interleaved). So 8 warps (on short sequences
 * the warps past the last row still share the tile loads; not timed there);
 * D 128 keeps 4 (its registers). TB_CUDA_MHA_NW=1|2|4|8 forces a size for
 * D <= 64 (for comparing them on one engine). */
static int mha_warps(const tbn_sdpa_args *a) {
    static int force = -1;
    if (force < 0) {
        const char *ev = getenv("TB_CUDA_MHA_NW");
        int f = ev ? atoi(ev) : 0;
        force = f == 1 || f == 2 || f == 4 || f == 8 ? f : 0;
    }
    if (a->D > 64) return 4;
    if (force) return force;
    return 8;
}

template <int D>
static cudaError_t mha_dispatch_d(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out,
                                  int vec, cudaStream_t s, int nw) {
    if (nw == 1) return mha_launch<D, 1>(a, q, k, v, out, vec, s);
    if (nw == 2) return mha_launch<D, 2>(a, q, k, v, out, vec, s);
    if (nw == 8) return mha_launch<D, 8>(a, q, k, v, out, vec, s);
    return mha_launch<D, 4>(a, q, k, v, out, vec, s);
}

static cudaError_t mha_dispatch(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out,
                                int vec, cudaStream_t s, int nw) {
    switch (a->D) {
    case 32: return mha_dispatch_d<32>(a, q, k, v, out, vec, s, nw);
    case 64: return mha_dispatch_d<64>(a, q, k, v, out, vec, s, nw);
    default: return mha_launch<128, 4>(a, q, k, v, out, vec, s);
    }
}

/* Whether this kernel runs sdpa a (whatever its strides, given k's last
 * two have a 1 and the output's are even); TB_CUDA_SDPA_F32=1: never (the
 * f32-arithmetic kernel of nn_attn.cu, for comparison). */
extern "C" int tbn_mha_f16_ok(const tbn_sdpa_args *a) {
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("TB_CUDA_SDPA_F32");
        off = e && !strcmp(e, "1");
    }
    if (off || a->dt != TBN_F16 || a->D != a->Dv || (a->D != 32 && a->D != 64 && a->D != 128)) return 0;
    return a->S > 0 && a->T > 0 && a->B * a->H <= 65535 && a->S <= ((int64_t)1 << 30) && a->T <= ((int64_t)1 << 30);
}

/* 1: launched (*e its status); 0: not this kernel's case */
extern "C" int tbn_mha_f16(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out,
                           cudaStream_t s, cudaError_t *e) {
    if (!tbn_mha_f16_ok(a)) return 0;
    if (a->ks[2] != 1 && a->ks[3] != 1) return 0;
    /* half2 stores: even output strides and an aligned base */
    if (((uintptr_t)out & 3) || (a->os[0] | a->os[1] | a->os[2]) & 1) return 0;
    int vec = mha_al16(q) && mha_al16(k) && mha_al16(v);
    const int64_t st[] = {a->qs[0], a->qs[1], a->qs[2], a->ks[0], a->ks[1], a->ks[2], a->ks[3], a->vs[0], a->vs[1],
                          a->vs[2]};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        if (st[i] != 1 && st[i] % 8) vec = 0;
    if (vec && a->ks[3] == 1 && a->T <= MHA_TS && (a->D == 32 || a->D == 64)) {
        const int nw = mha_short_warps(a);
        if (nw > 0) {
            if (a->D == 32)
                *e = nw == 1 ? mha_short_launch<32, 1>(a, q, k, v, out, s) : nw == 2 ? mha_short_launch<32, 2>(a, q, k, v, out, s)
                     : nw == 8 ? mha_short_launch<32, 8>(a, q, k, v, out, s) : mha_short_launch<32, 4>(a, q, k, v, out, s);
            else
                *e = nw == 1 ? mha_short_launch<64, 1>(a, q, k, v, out, s) : nw == 2 ? mha_short_launch<64, 2>(a, q, k, v, out, s)
                     : nw == 8 ? mha_short_launch<64, 8>(a, q, k, v, out, s) : mha_short_launch<64, 4>(a, q, k, v, out, s);
            return 1;
        }
    }
    *e = mha_dispatch(a, q, k, v, out, vec, s, mha_warps(a));
    return 1;
}
