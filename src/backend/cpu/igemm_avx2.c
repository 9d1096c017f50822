/*
 * igemm_avx2.c — the AVX2 path of tb_cpu_igemm (igemm.h), for CPUs without
 * AVX-512 VNNI: one thread's rows x 16-blocks of Y.
 *
 * vpmaddubsw would saturate (255 * 127 * 2 > 32767), so the sums are made
 * exact by widening: A packed as uint16 ([Kg][2][4] per tile), W's 16 bytes
 * of 4 channels x 4 codes sign-extended to 16 lanes of int16 (vpmovsxbw),
 * vpmaddwd against A's 4 codes broadcast (64 bits), so each int32 lane
 * holds a pair of products; the pairs are added at the end (vphaddd).
 * Register tile: 2 rows x 16 channels (8 accumulators). The same blocking,
 * finish and epilogue as the VNNI path (igemm_avx512.c).
 */
#include "backend/cpu/igemm_impl.h"

#include <immintrin.h>
#include <string.h>


#define A2_TARGET "avx2,fma"
#define A2_FN __attribute__((target(A2_TARGET)))
#define A2_INLINE static inline __attribute__((target(A2_TARGET), always_inline))

enum { MR = 2 };

/* acc += madd(a, w). As asm: GCC 12 kept copies of the accumulators in
 * fresh registers and spilled one every K step. */
#ifdef IGEMM_SANITIZED
#define MADD_ACC(acc, a, w) ((acc) = _mm256_add_epi32((acc), _mm256_madd_epi16((a), (w))))
#else
#define MADD_ACC(acc, a, w)                                                                     \
    do {                                                                                        \
        __m256i t_;                                                                             \
        __asm__("vpmaddwd %2, %3, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(t_) : "x"(w), "x"(a)); \
    } while (0)
#endif /* 3 rows (12 accumulators) ran out of the 16 registers */

/* Y[m .. m+mr, 16b .. 16b+16) from the packed tile ap ([Kg][mr][4] uint16).
 * Named accumulators (an array of them was spilled inside the K loop). */
#define ACC_DECL(r) __m256i c##r##0 = z, c##r##1 = z, c##r##2 = z, c##r##3 = z
#define ACC_Q(q)                                                                      \
    {                                                                                 \
        __m256i wq = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 * q))); \
        MADD_ACC(c0##q, a0, wq);                                                      \
        if (mr > 1) MADD_ACC(c1##q, a1, wq);                                          \
    }
A2_INLINE __m256i bcast4(const uint16_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}

A2_INLINE void tile(const tb_igemm_job *j, const uint16_t *ap, int64_t m, int64_t b, const int mr) {
    const __m256i z = _mm256_setzero_si256();
    ACC_DECL(0); ACC_DECL(1);
    const int64_t Kg = j->Kg;
    const int8_t *w = j->W + b * Kg * 64;
    for (int64_t g = 0; g < Kg; g++, w += 64, ap += 4 * mr) {
        __m256i a0 = bcast4(ap), a1 = z;
        if (mr > 1) a1 = bcast4(ap + 4);
        ACC_Q(0) ACC_Q(1) ACC_Q(2) ACC_Q(3)
    }
    __m256i acc[MR][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}};
    int64_t n = b * 16, left = j->N - n;
    __m256i vz = _mm256_set1_epi32(j->a_zero);
    __m256 vs = _mm256_set1_ps(j->a_scale);
    float scale[16];
    for (int c = 0; c < 16; c++) scale[c] = c < left ? j->w_scale[n + c] : 0.f;
    __m256i zs[2];
    __m256 sc[2];
    for (int h = 0; h < 2; h++) {
        zs[h] = _mm256_mullo_epi32(vz, _mm256_loadu_si256((const __m256i *)(j->wsum + n + 8 * h)));
        sc[h] = _mm256_mul_ps(vs, _mm256_loadu_ps(scale + 8 * h));
    }
    IUNROLL(2)
    for (int r = 0; r < mr; r++) {
        float out[16];
        float *y = j->Y + (m + r) * j->ldy + n, *dst = left >= 16 ? y : out;
        IUNROLL(2)
        for (int h = 0; h < 2; h++) {
            /* lanes [c0 c0' c1 c1' | c2 c2' c3 c3'] of two 4-channel sets:
             * the pair sums, then the 64-bit lanes back in channel order */
            __m256i s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[r][2 * h], acc[r][2 * h + 1]), 0xD8);
            _mm256_storeu_ps(dst + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s, zs[h])), sc[h]));
        }
        if (dst == out) memcpy(y, out, (size_t)left * sizeof(float));
    }
}

static A2_FN void tile_any(const tb_igemm_job *j, const uint16_t *ap, int64_t m, int64_t b, int mr) {
    switch (mr) {
    case 1: tile(j, ap, m, b, 1); break;
    case 2: tile(j, ap, m, b, 2); break;
    default: break;
    }
}

A2_FN void tb_cpu_igemm_range_avx2(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1) {
    int64_t mc, nb, tb = j->Kg * 4; /* elements of one packed row */
    tb_cpu_igemm_blocks(j->K, MR, 1, 2, &mc, &nb);
    uint16_t *apk = tb_cpu_igemm_scratch((size_t)(mc * tb) * sizeof(uint16_t));
    for (int64_t mb = m0; mb < m1; mb += mc) {
        int64_t me = mb + mc < m1 ? mb + mc : m1;
        for (int64_t m = mb; m < me; m += MR) {
            int mr = me - m < MR ? (int)(me - m) : MR;
            tb_cpu_igemm_pack_a(j->A + m * j->lda, j->lda, j->K, mr, 2, apk + (m - mb) * tb);
        }
        for (int64_t bb = b0; bb < b1; bb += nb) {
            int64_t be = bb + nb < b1 ? bb + nb : b1;
            for (int64_t m = mb; m < me; m += MR) {
                int mr = me - m < MR ? (int)(me - m) : MR;
                for (int64_t b = bb; b < be; b++) tile_any(j, apk + (m - mb) * tb, m, b, mr);
                int64_t n = bb * 16, nw = be * 16 < j->N ? (be - bb) * 16 : j->N - n;
                tb_cpu_igemm_tile_epi(j, m, n, mr, nw);
            }
        }
    }
}

/* ---------------------------------------------------------------- AVX-VNNI
 * CPUs with the 256-bit VEX vpdpbusd (AVX-VNNI) but no AVX-512 VNNI: the
 * VNNI path's scheme (igemm_avx512.c) on 8 lanes. Tile: 6 rows x 16
 * channels (12 accumulators, the two halves of a 16-block, one broadcast),
 * A read in place, the epilogue through tb_cpu_nn_epilogue per tile. */

#define VX_TARGET "avx2,fma,avxvnni"
#define VX_FN __attribute__((target(VX_TARGET)))
#define VX_INLINE static inline __attribute__((target(VX_TARGET), always_inline))

enum { VX_MR = 6 };

/* {vex}: the assembler would pick the EVEX (AVX-512 VNNI) form; "x" keeps
 * to ymm0-15, which VEX can encode */
#ifdef IGEMM_SANITIZED
#define DPBUSD_VEX(acc, a, w) ((acc) = _mm256_dpbusd_avx_epi32((acc), (a), (w)))
#else
#define DPBUSD_VEX(acc, a, w) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(w))
#endif

VX_INLINE int32_t vx_ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define VX_DECL(r) __m256i c##r##0 = z, c##r##1 = z
#define VX_ROW(r, AVAL)                              \
    if (mr > r) {                                    \
        __m256i a = _mm256_set1_epi32(AVAL);         \
        DPBUSD_VEX(c##r##0, a, w0);                  \
        DPBUSD_VEX(c##r##1, a, w1);                  \
    }
#define VX_STORE(r)                                                                                  \
    if (mr > r) {                                                                                    \
        float *y = j->Y + (m + r) * j->ldy + n, *dst = left >= 16 ? y : out;                         \
        _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c##r##0, zs0)), sc0)); \
        _mm256_storeu_ps(dst + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c##r##1, zs1)), sc1)); \
        if (dst == out) memcpy(y, out, (size_t)left * sizeof(float));                               \
    }

VX_INLINE void vx_tile(const tb_igemm_job *j, int64_t m, int64_t b, const int mr) {
    const __m256i z = _mm256_setzero_si256();
    VX_DECL(0); VX_DECL(1); VX_DECL(2); VX_DECL(3); VX_DECL(4); VX_DECL(5);
    const int64_t Kf = j->K / 4, Kt = j->K % 4, lda = j->lda;
    const int8_t *w = j->W + b * j->Kg * 64;
    const uint8_t *a0 = j->A + m * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda, *a4 = a3 + lda,
                  *a5 = a4 + lda;
    for (int64_t g = 0; g < Kf; g++, w += 64) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)w), w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
        VX_ROW(0, vx_ld32(a0 + 4 * g)) VX_ROW(1, vx_ld32(a1 + 4 * g)) VX_ROW(2, vx_ld32(a2 + 4 * g))
        VX_ROW(3, vx_ld32(a3 + 4 * g)) VX_ROW(4, vx_ld32(a4 + 4 * g)) VX_ROW(5, vx_ld32(a5 + 4 * g))
    }
    if (Kt) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)w), w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
        const uint8_t *rows[6] = {a0, a1, a2, a3, a4, a5};
        int32_t t[6] = {0, 0, 0, 0, 0, 0};
        for (int r = 0; r < mr; r++) /* bytes one by one: a memcpy of a run-time length became a call */
            t[r] = (int32_t)(rows[r][4 * Kf] | (Kt > 1 ? (uint32_t)rows[r][4 * Kf + 1] << 8 : 0u) |
                             (Kt > 2 ? (uint32_t)rows[r][4 * Kf + 2] << 16 : 0u));
        VX_ROW(0, t[0]) VX_ROW(1, t[1]) VX_ROW(2, t[2]) VX_ROW(3, t[3]) VX_ROW(4, t[4]) VX_ROW(5, t[5])
    }
    int64_t n = b * 16, left = j->N - n;
    float scale[16], out[16];
    for (int c = 0; c < 16; c++) scale[c] = c < left ? j->w_scale[n + c] : 0.f;
    __m256i vz = _mm256_set1_epi32(j->a_zero);
    __m256 vs = _mm256_set1_ps(j->a_scale);
    __m256i zs0 = _mm256_mullo_epi32(vz, _mm256_loadu_si256((const __m256i *)(j->wsum + n))),
            zs1 = _mm256_mullo_epi32(vz, _mm256_loadu_si256((const __m256i *)(j->wsum + n + 8)));
    __m256 sc0 = _mm256_mul_ps(vs, _mm256_loadu_ps(scale)), sc1 = _mm256_mul_ps(vs, _mm256_loadu_ps(scale + 8));
    VX_STORE(0) VX_STORE(1) VX_STORE(2) VX_STORE(3) VX_STORE(4) VX_STORE(5)
}

#ifdef IGEMM_SANITIZED
static VX_FN void vx_tile_any(const tb_igemm_job *j, int64_t m, int64_t b, int mr) { vx_tile(j, m, b, mr); }
#else
static VX_FN void vx_tile_any(const tb_igemm_job *j, int64_t m, int64_t b, int mr) {
    switch (mr) {
    case 1: vx_tile(j, m, b, 1); break;
    case 2: vx_tile(j, m, b, 2); break;
    case 3: vx_tile(j, m, b, 3); break;
    case 4: vx_tile(j, m, b, 4); break;
    case 5: vx_tile(j, m, b, 5); break;
    case 6: vx_tile(j, m, b, 6); break;
    default: break;
    }
}
#endif

VX_FN void tb_cpu_igemm_range_avxvnni(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1) {
    int64_t mc, nb;
    tb_cpu_igemm_blocks(j->K, VX_MR, 1, 1, &mc, &nb);
    for (int64_t mb = m0; mb < m1; mb += mc) {
        int64_t me = mb + mc < m1 ? mb + mc : m1;
        for (int64_t bb = b0; bb < b1; bb += nb) {
            int64_t be = bb + nb < b1 ? bb + nb : b1;
            for (int64_t m = mb; m < me; m += VX_MR) {
                int mr = me - m < VX_MR ? (int)(me - m) : VX_MR;
                for (int64_t b = bb; b < be; b++) vx_tile_any(j, m, b, mr);
                int64_t n = bb * 16, nw = be * 16 < j->N ? (be - bb) * 16 : j->N - n;
                tb_cpu_igemm_tile_epi(j, m, n, mr, nw);
            }
        }
    }
}
