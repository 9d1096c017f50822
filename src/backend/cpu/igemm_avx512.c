/*
 * igemm_avx512.c — the AVX-512 VNNI path of tb_cpu_igemm (igemm.h): one
 * thread's rows x 16-blocks of Y (igemm.c splits the work over the pool).
 *
 * vpdpbusd multiplies 4 unsigned bytes of A by 4 signed bytes of W and adds
 * the sum into an int32 lane (no saturation, so the sums are exact): with
 * W packed as 16 channels x 4 codes per 64 bytes (igemm_impl.h) one
 * instruction does 64 multiply-adds, A's 4 codes broadcast to all lanes.
 * Register tile: 6 rows x 64 channels (24 accumulators, 4 W vectors, one
 * broadcast), over the whole K (no int32 partials leave the registers). A
 * is read in place (the 4 codes of a group broadcast from each row; the
 * last group of a K not a multiple of 4 built from its bytes): packing it
 * cost as much as the products when K is small (ResNet's 1x1 and stem).
 * Blocking: rows in blocks of ~128 KiB of A and W in chunks of 16-blocks
 * (~384 KiB), both L2: each tile's rows (L1) are used by every 64-channel
 * panel of the chunk, each panel by every tile of the block.
 * The sums start at -a_zero * rowsum; the tile is finished in registers:
 * to f32, times a_scale * w_scale[n] (the reference's formula, so the same
 * bits), then the common epilogues (bias per column or row, ReLU or none,
 * residual) with the sgemm's operations (sgemm.c epi512_t); other
 * activations go through tb_cpu_nn_epilogue on the tile while it is in L1.
 */
#include "backend/cpu/igemm_impl.h"

#include <immintrin.h>
#include <string.h>


#define V_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma"
#define V_FN __attribute__((target(V_TARGET)))
#define V_INLINE static inline __attribute__((target(V_TARGET), always_inline))

enum { MR = 6, NV = 4 }; /* the tile: MR rows x NV 16-blocks (the macros below spell out 6 x 4) */

/* acc += dot4(a, w) per lane. As asm: with the intrinsic GCC 12 copied each
 * accumulator to a fresh register and spilled it every K step in the 6 x 4
 * tile (19 stores per 24 vpdpbusd). */
#ifdef IGEMM_SANITIZED
#define DPBUSD(acc, a, w) ((acc) = _mm512_dpbusd_epi32((acc), (a), (w)))
#else
#define DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))
#endif

V_INLINE int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The 1-3 codes of a row's last group, zeros after them */
V_INLINE int32_t ld_tail(const uint8_t *p, int64_t n) {
    /* bytes one by one: a memcpy of a run-time length became a call */
    uint32_t v = p[0];
    if (n > 1) v |= (uint32_t)p[1] << 8;
    if (n > 2) v |= (uint32_t)p[2] << 16;
    return (int32_t)v;
}

/* Accumulators are named variables (an array of them stayed in memory with
 * GCC: a store per vpdpbusd); mr and nv are constants in each copy. */
#define ACC_DECL(r) __m512i c##r##0 = i0, c##r##1 = i1, c##r##2 = i2, c##r##3 = i3
#define ACC_ROW(r, AVAL)                                     \
    if (mr > r) {                                            \
        __m512i a = _mm512_set1_epi32(AVAL);                 \
        DPBUSD(c##r##0, a, w0);                              \
        if (nv > 1) DPBUSD(c##r##1, a, w1);                  \
        if (nv > 2) DPBUSD(c##r##2, a, w2);                  \
        if (nv > 3) DPBUSD(c##r##3, a, w3);                  \
    }
#define LOAD_W(wp)                                                                       \
    __m512i w0 = _mm512_loadu_si512((const void *)(wp)), w1 = z, w2 = z, w3 = z;         \
    if (nv > 1) w1 = _mm512_loadu_si512((const void *)((wp) + ws));                        \
    if (nv > 2) w2 = _mm512_loadu_si512((const void *)((wp) + 2 * ws));                    \
    if (nv > 3) w3 = _mm512_loadu_si512((const void *)((wp) + 3 * ws));

/* Per 16-block v: the lane mask, a_scale * w_scale and,
 * for a bias along the columns, bias_scale * bias */
#define COL_PREP(v)                                                                                   \
    __mmask16 k##v = 0;                                                                               \
    __m512 sc##v = _mm512_setzero_ps(), bc##v = _mm512_setzero_ps();                                  \
    if (nv > v) {                                                                                     \
        int64_t n_ = n0 + 16 * v, left = j->N - n_;                                                   \
        k##v = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);                        \
        sc##v = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k##v, j->w_scale + n_));                      \
        if (epi && e->bias && e->bias_cs) bc##v = _mm512_maskz_loadu_ps(k##v, e->bias + n_);          \
    }
#define ACC_STORE(r, v)                                                                       \
    if (mr > r && nv > v) {                                                                   \
        float *y_ = j->Y + (m + r) * j->ldy + n0 + 16 * v;                                    \
        __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(c##r##v), sc##v); \
        if (epi) y = epi_vec(e, y, bc##v, m + r, n0 + 16 * v, k##v);                          \
        _mm512_mask_storeu_ps(y_, k##v, y);                                                   \
    }

/* The sgemm's epilogue on one vector of row i, columns n.. (masked by k):
 * the same operations as sgemm.c's epi512_t for act NONE / RELU. */
V_INLINE __m512 epi_vec(const tb_cpu_sgemm_epi *e, __m512 v, __m512 bcol, int64_t i, int64_t n, __mmask16 k) {
    __m512 scale = _mm512_set1_ps(e->bias_scale != 0.0f ? e->bias_scale : 1.0f);
    if (e->bias)
        v = e->bias_cs ? _mm512_fmadd_ps(bcol, scale, v)
                       : _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(e->bias[i * e->bias_rs]), scale));
    const float *rrow = e->res ? e->res + i * e->ld_res + n : NULL;
    if (rrow && e->act_after_res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, rrow));
    if (e->act == TB_NN_ACT_RELU) v = _mm512_max_ps(v, _mm512_setzero_ps());
    if (rrow && !e->act_after_res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, rrow));
    return v;
}

/* Y[m .. m+mr, 16b .. 16(b+nv)); epi: the epilogue e inline (else none here) */
V_INLINE void tile(const tb_igemm_job *j, int64_t m, int64_t b, const int mr, const int nv, const int epi) {
    const tb_cpu_sgemm_epi *e = j->epi;
    const __m512i z = _mm512_setzero_si512();
    /* the sums start at -a_zero * rowsum (the zero point's term, exact in
     * int32 like the rest), so the finish has one operation less */
    const __m512i nz = _mm512_set1_epi32(-j->a_zero);
    const int32_t *ws16 = j->wsum + b * 16;
    const __m512i i0 = _mm512_mullo_epi32(nz, _mm512_loadu_si512((const void *)ws16)),
                  i1 = nv > 1 ? _mm512_mullo_epi32(nz, _mm512_loadu_si512((const void *)(ws16 + 16))) : z,
                  i2 = nv > 2 ? _mm512_mullo_epi32(nz, _mm512_loadu_si512((const void *)(ws16 + 32))) : z,
                  i3 = nv > 3 ? _mm512_mullo_epi32(nz, _mm512_loadu_si512((const void *)(ws16 + 48))) : z;
    ACC_DECL(0); ACC_DECL(1); ACC_DECL(2); ACC_DECL(3); ACC_DECL(4); ACC_DECL(5);
    const int64_t Kf = j->K / 4, Kt = j->K % 4, ws = j->Kg * 64, lda = j->lda;
    const int8_t *w = j->W + b * ws;
    const uint8_t *a0 = j->A + m * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda, *a4 = a3 + lda,
                  *a5 = a4 + lda;
    for (int64_t g = 0; g < Kf; g++, w += 64) {
        LOAD_W(w)
        ACC_ROW(0, ld32(a0 + 4 * g)) ACC_ROW(1, ld32(a1 + 4 * g)) ACC_ROW(2, ld32(a2 + 4 * g))
        ACC_ROW(3, ld32(a3 + 4 * g)) ACC_ROW(4, ld32(a4 + 4 * g)) ACC_ROW(5, ld32(a5 + 4 * g))
    }
    if (Kt) {
        LOAD_W(w)
        ACC_ROW(0, ld_tail(a0 + 4 * Kf, Kt)) ACC_ROW(1, ld_tail(a1 + 4 * Kf, Kt))
        ACC_ROW(2, ld_tail(a2 + 4 * Kf, Kt)) ACC_ROW(3, ld_tail(a3 + 4 * Kf, Kt))
        ACC_ROW(4, ld_tail(a4 + 4 * Kf, Kt)) ACC_ROW(5, ld_tail(a5 + 4 * Kf, Kt))
    }
    const int64_t n0 = b * 16;
    const __m512 vs = _mm512_set1_ps(j->a_scale);
    /* column by column: each 16-block's accumulators die as its scales come
     * in (all scales first made GCC spill accumulators inside the K loop) */
#define ACC_STORE_COL(v) \
    COL_PREP(v) ACC_STORE(0, v) ACC_STORE(1, v) ACC_STORE(2, v) ACC_STORE(3, v) ACC_STORE(4, v) ACC_STORE(5, v)
    ACC_STORE_COL(0) ACC_STORE_COL(1) ACC_STORE_COL(2) ACC_STORE_COL(3)
#undef ACC_STORE_COL
}

#define TILE_CASE(r, v) \
    case (r) * 8 + (v): tile(j, m, b, r, v, epi); break
#define TILE_ROW(r) TILE_CASE(r, 1); TILE_CASE(r, 2); TILE_CASE(r, 3); TILE_CASE(r, 4)

#ifdef IGEMM_SANITIZED
/* one copy with mr and nv at run time: clang -O1 with ASan spent over 15
 * minutes on the 48 unrolled copies */
static V_FN void tile_any(const tb_igemm_job *j, int64_t m, int64_t b, int mr, int nv, const int epi) {
    tile(j, m, b, mr, nv, epi);
}
#else
static V_FN void tile_any(const tb_igemm_job *j, int64_t m, int64_t b, int mr, int nv, const int epi) {
    switch (mr * 8 + nv) {
        TILE_ROW(1); TILE_ROW(2); TILE_ROW(3); TILE_ROW(4); TILE_ROW(5); TILE_ROW(6);
    default: break;
    }
}
#endif
static V_FN void tile_plain(const tb_igemm_job *j, int64_t m, int64_t b, int mr, int nv) { tile_any(j, m, b, mr, nv, 0); }
static V_FN void tile_epi(const tb_igemm_job *j, int64_t m, int64_t b, int mr, int nv) { tile_any(j, m, b, mr, nv, 1); }

/* The epilogues done in registers: act NONE or RELU, a bias along the
 * columns (stride 1) or one per row (column stride 0), any residual. */
static int epi_inline(const tb_cpu_sgemm_epi *e) {
    return e && (e->act == TB_NN_ACT_NONE || e->act == TB_NN_ACT_RELU) &&
           (!e->bias || e->bias_cs == 1 || e->bias_cs == 0);
}

V_FN void tb_cpu_igemm_range_vnni512(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1) {
    int64_t mc, nb;
    tb_cpu_igemm_blocks(j->K, MR, NV, 1, &mc, &nb);
    int inl = epi_inline(j->epi);
    void (*fn)(const tb_igemm_job *, int64_t, int64_t, int, int) = inl ? tile_epi : tile_plain;
    for (int64_t mb = m0; mb < m1; mb += mc) {
        int64_t me = mb + mc < m1 ? mb + mc : m1;
        for (int64_t bb = b0; bb < b1; bb += nb) {
            int64_t be = bb + nb < b1 ? bb + nb : b1;
            for (int64_t m = mb; m < me; m += MR) {
                int mr = me - m < MR ? (int)(me - m) : MR;
                for (int64_t b = bb; b < be; b += NV) {
                    int nv = be - b < NV ? (int)(be - b) : NV;
                    fn(j, m, b, mr, nv);
                    if (j->epi && !inl) {
                        int64_t n = b * 16, nw = (b + nv) * 16 < j->N ? nv * 16 : j->N - n;
                        tb_cpu_igemm_tile_epi(j, m, n, mr, nw);
                    }
                }
            }
        }
    }
}
