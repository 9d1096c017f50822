/*
 * igemm_avx512.c — the AVX-512 VNNI path of tb_cpu_igemm (igemm.h): one
 * thread's rows x 16-blocks of Y (igemm.c splits the work over the pool).
 *
 * vpdpbusd multiplies 4 unsigned bytes of A by 4 signed bytes of W and adds
 * the sum into an int32 lane (no saturation, so the sums are exact): with
 * W packed as 16 channels x 4 codes per 64 bytes (igemm_impl.h) one
 * instruction does 64 multiply-adds, A's 4 codes broadcast to all lanes.
 * Register tile: 6 rows x 64 channels (24 accumulators, 4 W vectors, one
 * broadcast), over the whole K (no int32 partials leave the registers).
 * Blocking: A packed per block of rows ([Kg][6][4] per tile, ~128 KiB, L2)
 * and W read per chunk of 16-blocks (~384 KiB, L2): each tile's A (L1) is
 * used by every 64-channel panel of the chunk, each panel by every tile.
 * The tile is finished while in cache: minus a_zero * rowsum, to f32, times
 * a_scale * w_scale[n] (the reference's formula, so the same bits), then the
 * epilogue (bias, activation, residual).
 */
#include "backend/cpu/igemm_impl.h"

#include <immintrin.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IGEMM_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define IGEMM_SANITIZED 1
#endif
#define IPRAGMA(x) _Pragma(#x)
#ifdef IGEMM_SANITIZED
#define IUNROLL(n)
#else
#define IUNROLL(n) IPRAGMA(GCC unroll n)
#endif

#define V_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma"
#define V_FN __attribute__((target(V_TARGET)))
#define V_INLINE static inline __attribute__((target(V_TARGET), always_inline))

enum { MR = 6, NV = 4 };

/* acc += dot4(a, w) per lane. As asm: with the intrinsic GCC 12 copied each
 * accumulator to a fresh register and spilled it every K step in the 6 x 4
 * tile (19 stores per 24 vpdpbusd). */
#ifdef IGEMM_SANITIZED
#define DPBUSD(acc, a, w) ((acc) = _mm512_dpbusd_epi32((acc), (a), (w)))
#else
#define DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))
#endif /* the tile: MR rows x NV 16-blocks (the macros below spell out 6 x 4) */

/* Y[m .. m+mr, 16b .. 16(b+nv)) from the packed tile ap ([Kg][mr][4]).
 * The accumulators are named variables (an array of them stayed in memory
 * with GCC: a store per vpdpbusd); mr and nv are constants in each copy. */
#define ACC_DECL(r) __m512i c##r##0 = z, c##r##1 = z, c##r##2 = z, c##r##3 = z
#define ACC_ROW(r)                                                      \
    if (mr > r) {                                                       \
        __m512i a = _mm512_set1_epi32(*(const int32_t *)(ap + 4 * r));  \
        DPBUSD(c##r##0, a, w0);                                         \
        if (nv > 1) DPBUSD(c##r##1, a, w1);                             \
        if (nv > 2) DPBUSD(c##r##2, a, w2);                             \
        if (nv > 3) DPBUSD(c##r##3, a, w3);                             \
    }
#define ACC_STORE(r, v)                                                                             \
    if (mr > r && nv > v)                                                                           \
        _mm512_mask_storeu_ps(j->Y + (m + r) * j->ldy + n0 + 16 * v, k##v,                           \
                              _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c##r##v, zs##v)), sc##v))
#define COL_PREP(v)                                                                                   \
    __mmask16 k##v = 0;                                                                               \
    __m512i zs##v = z;                                                                                \
    __m512 sc##v = _mm512_setzero_ps();                                                               \
    if (nv > v) {                                                                                     \
        int64_t left = j->N - (n0 + 16 * v);                                                          \
        k##v = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);                        \
        zs##v = _mm512_mullo_epi32(vz, _mm512_loadu_si512((const void *)(j->wsum + n0 + 16 * v)));     \
        sc##v = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k##v, j->w_scale + n0 + 16 * v));              \
    }

V_INLINE void tile(const tb_igemm_job *j, const uint8_t *ap, int64_t m, int64_t b, const int mr, const int nv) {
    const __m512i z = _mm512_setzero_si512();
    ACC_DECL(0); ACC_DECL(1); ACC_DECL(2); ACC_DECL(3); ACC_DECL(4); ACC_DECL(5);
    const int64_t Kg = j->Kg, ws = Kg * 64;
    const int8_t *w = j->W + b * ws;
    for (int64_t g = 0; g < Kg; g++, w += 64, ap += 4 * mr) {
        __m512i w0 = _mm512_load_si512((const void *)w), w1 = z, w2 = z, w3 = z;
        if (nv > 1) w1 = _mm512_load_si512((const void *)(w + ws));
        if (nv > 2) w2 = _mm512_load_si512((const void *)(w + 2 * ws));
        if (nv > 3) w3 = _mm512_load_si512((const void *)(w + 3 * ws));
        ACC_ROW(0) ACC_ROW(1) ACC_ROW(2) ACC_ROW(3) ACC_ROW(4) ACC_ROW(5)
    }
    const int64_t n0 = b * 16;
    const __m512i vz = _mm512_set1_epi32(j->a_zero);
    const __m512 vs = _mm512_set1_ps(j->a_scale);
    /* column by column: each 16-block's accumulators die as its scales come
     * in (all scales first made GCC spill accumulators inside the K loop) */
#define ACC_STORE_COL(v) \
    COL_PREP(v) ACC_STORE(0, v); ACC_STORE(1, v); ACC_STORE(2, v); ACC_STORE(3, v); ACC_STORE(4, v); ACC_STORE(5, v)
    ACC_STORE_COL(0); ACC_STORE_COL(1); ACC_STORE_COL(2); ACC_STORE_COL(3);
#undef ACC_STORE_COL
}

#define TILE_CASE(r, v) \
    case (r) * 8 + (v): tile(j, ap, m, b, r, v); break
#define TILE_ROW(r) TILE_CASE(r, 1); TILE_CASE(r, 2); TILE_CASE(r, 3); TILE_CASE(r, 4)

static V_FN void tile_any(const tb_igemm_job *j, const uint8_t *ap, int64_t m, int64_t b, int mr, int nv) {
    switch (mr * 8 + nv) {
        TILE_ROW(1); TILE_ROW(2); TILE_ROW(3); TILE_ROW(4); TILE_ROW(5); TILE_ROW(6);
    default: break;
    }
}

V_FN void tb_cpu_igemm_range_vnni512(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1) {
    int64_t mc, nb, tb = j->Kg * 4; /* bytes of one packed row */
    tb_cpu_igemm_blocks(j->K, MR, NV, 1, &mc, &nb);
    uint8_t *apk = tb_cpu_igemm_scratch((size_t)(mc * tb));
    for (int64_t mb = m0; mb < m1; mb += mc) {
        int64_t me = mb + mc < m1 ? mb + mc : m1;
        for (int64_t m = mb; m < me; m += MR) {
            int mr = me - m < MR ? (int)(me - m) : MR;
            tb_cpu_igemm_pack_a(j->A + m * j->lda, j->lda, j->K, mr, 1, apk + (m - mb) * tb);
        }
        for (int64_t bb = b0; bb < b1; bb += nb) {
            int64_t be = bb + nb < b1 ? bb + nb : b1;
            for (int64_t m = mb; m < me; m += MR) {
                int mr = me - m < MR ? (int)(me - m) : MR;
                for (int64_t b = bb; b < be; b += NV) {
                    int nv = be - b < NV ? (int)(be - b) : NV;
                    tile_any(j, apk + (m - mb) * tb, m, b, mr, nv);
                    int64_t n = b * 16, nw = (b + nv) * 16 < j->N ? nv * 16 : j->N - n;
                    tb_cpu_igemm_tile_epi(j, m, n, mr, nw);
                }
            }
        }
    }
}
