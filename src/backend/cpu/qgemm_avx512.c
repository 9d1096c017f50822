/*
 * qgemm_avx512.c — the AVX-512 (F, BW, VL, DQ) path of tb_cpu_qmatmul:
 * y[0:T, n0:n1] for one thread (qgemm.c splits the rows of W across the pool).
 *
 * Small steps (T < TB_CPU_GEMM_MIN_T: decode and decode batches) walk W once:
 * register tiles of 4 weight rows by up to 4 tokens, the codes widened to f32
 * in registers and multiplied into f32 accumulators (tactic "dq"); a tile of
 * rows stays in L1 while every token block passes over it, so each weight
 * comes from memory once per call. Per encoding:
 *   i8   16 codes: vpmovsxbd + vcvtdq2ps; the row's scale applied to the sum;
 *   fp8  16 codes: sign-extended to 16 bits, shifted left 7 and masked, which
 *        is the f16 with the same bits (exponent bias 15 instead of 7, so
 *        the value / 256: subnormals included, exactly); vcvtph2ps; the
 *        row's scale * 256 applied to the sum. (e4m3fn's NaN codes, which
 *        the quantisers never write, read as 480 * scale.)
 *   i4   32 codes (16 bytes): vpmovzxbd; a 16-entry f32 table per row and
 *        group, table[v] = code(v) * scale + zero, looked up with vpermps
 *        by the low nibble (even k) and by the byte >> 4 (odd k): two
 *        shuffles per 32 weights, the scale and zero already applied. x is
 *        reordered once per call into each 32-block's even then odd elements
 *        (per-thread scratch) to match.
 * Large steps (prefill) dequantise (256, 128) blocks of W into the f32
 * packed panel (tb_cpu_thread_panel) and run a 6x32 outer-product
 * microkernel over all T rows of x: the dequantisation is paid once per
 * weight and call, the products run at the f32 GEMM's speed.
 */
#include "backend/cpu/kernels.h"
#include "core/quant.h"

#include <immintrin.h>

/* Full unrolling keeps the tiles' accumulator arrays in registers. The
 * sanitized fuzz build (clang -O1, ASan + UBSan) only needs the code to be
 * right, and with the unrolling it spent minutes on each of these files. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QGEMM_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define QGEMM_SANITIZED 1
#endif
#define QPRAGMA(x) _Pragma(#x)
#ifdef QGEMM_SANITIZED
#define QUNROLL(n)
#else
#define QUNROLL(n) QPRAGMA(GCC unroll n)
#endif

#define Q512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define Q512_INLINE static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline))

/* ---------------------------------------------------------------- widening */

Q512_INLINE __m512 i8x16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
Q512_INLINE __m512 i8x16m(const uint8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}
Q512_INLINE __m512 f8bits(__m128i b) {
    __m256i h = _mm256_cvtepi8_epi16(b);
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(h);
}
/* 16 fp8 codes as f32 / 256 */
Q512_INLINE __m512 f8x16(const uint8_t *p) { return f8bits(_mm_loadu_si128((const __m128i *)p)); }
Q512_INLINE __m512 f8x16m(const uint8_t *p, __mmask16 m) { return f8bits(_mm_maskz_loadu_epi8(m, p)); }

/* The sums of 4 accumulators, [a, b, c, d]: one shared tree instead of
 * four reductions (they cost as much as the products when K is small). */
Q512_INLINE __m128 hsum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
#define TB_HALF8(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    __m256 ab = _mm256_hadd_ps(TB_HALF8(a), TB_HALF8(b)), cd = _mm256_hadd_ps(TB_HALF8(c), TB_HALF8(d));
#undef TB_HALF8
    __m256 s = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* the signed code of each nibble value 0..15 */
Q512_INLINE __m512 i4_base(void) {
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
}

/* xp (T, K) = x with every 32-block reordered to its 16 even then 16 odd
 * elements (the order the i4 tables produce). */
Q512_INLINE void i4_reorder_x(const float *x, float *xp, int T, int K) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (size_t i = 0; i < (size_t)T * K; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        _mm512_storeu_ps(xp + i, _mm512_permutex2var_ps(a, ev, b));
        _mm512_storeu_ps(xp + i + 16, _mm512_permutex2var_ps(a, od, b));
    }
}

/* ---------------------------------------------------------------- small steps */

/* Software prefetch distance (bytes ahead in W's stream): a block of 4
 * rows of a few hundred bytes each is too short a stream for the hardware
 * prefetcher to ramp up. Measured (Zen 5, 1 thread, CPU time, 768x4096
 * weights from DRAM, medians of 9 interleaved rounds, GB/s; two runs,
 * distances 0 / 1K / 2K / 4K / 8K, then 4K / 8K / 12K / 16K / 32K):
 * int8     10.9 / 13.9 / 17.1 / 19.5 / 21.2,  17.5 / 21.2 / 20.9 / 17.7 / 15.4;
 * int8 Q8  19.9 / 17.3 / 22.8 / 27.4 / 28.5,  26.2 / 26.5 / 27.5 / 26.3 / 24.1;
 * int4 Q8  14.8 / 17.3 / 17.1 / 19.8 / 19.6,  22.6 / 23.3 / 21.4 / 20.9 / 19.1. */
enum { qpf_dist = 8192 };

/* y[t, r] for R rows of W (codes from w, rb bytes apart) and TT tokens
 * (x rows ldx apart), i8 or fp8 (one scale per row). */
Q512_INLINE void tile_rowscale(tb_dtype dt, const float *x, size_t ldx, const uint8_t *w, size_t rb, int K,
                               const float *scales, const float *bias, float *y, size_t ldy, const int R,
                               const int TT) {
    __m512 acc[4][4];
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(4)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    int k = 0;
    /* the R rows are R * rb contiguous bytes; each step consumes R * 16 of
     * them and prefetches as many, QPF bytes further on */
    const char *pf = (const char *)w + qpf_dist;
    for (; k + 16 <= K; k += 16) {
QUNROLL(4)
        for (int r = 0; r < R; r += 4) _mm_prefetch(pf + (size_t)k * R + r * 16, _MM_HINT_T0);
        __m512 xv[4];
QUNROLL(4)
        for (int t = 0; t < TT; t++) xv[t] = _mm512_loadu_ps(x + t * ldx + k);
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            __m512 wv = dt == TB_I8 ? i8x16(w + r * rb + k) : f8x16(w + r * rb + k);
QUNROLL(4)
            for (int t = 0; t < TT; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 xv[4];
QUNROLL(4)
        for (int t = 0; t < TT; t++) xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + k);
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            __m512 wv = dt == TB_I8 ? i8x16m(w + r * rb + k, m) : f8x16m(w + r * rb + k, m);
QUNROLL(4)
            for (int t = 0; t < TT; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    float mul = dt == TB_I8 ? 1.0f : 256.0f;
    if (R == 4) {
        __m128 s4 = _mm_mul_ps(_mm_loadu_ps(scales), _mm_set1_ps(mul));
        __m128 b4 = bias ? _mm_loadu_ps(bias) : _mm_setzero_ps();
QUNROLL(4)
        for (int t = 0; t < TT; t++)
            _mm_storeu_ps(y + t * ldy, _mm_fmadd_ps(hsum4x16(acc[0][t], acc[1 % R][t], acc[2 % R][t], acc[3 % R][t]), s4, b4));
        return;
    }
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float s = scales[r] * mul, b = bias ? bias[r] : 0.0f;
QUNROLL(4)
        for (int t = 0; t < TT; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]) * s + b;
    }
}

/* The same for i4 (group G, K % G == 0, G % 32 == 0); xp reordered
 * (i4_reorder_x); scales/zeros point at row 0's groups, ng groups a row. */
Q512_INLINE void tile_i4(const float *xp, size_t ldx, const uint8_t *w, size_t rb, int K, int G,
                         const float *scales, const float *zeros, const float *bias, float *y, size_t ldy,
                         const int R, const int TT) {
    __m512 acc[4][4];
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(4)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    const __m512 base = i4_base();
    int ng = K / G;
    const char *pf = (const char *)w + qpf_dist; /* as in tile_rowscale */
    for (int g = 0; g < ng; g++) {
        __m512 lut[4];
QUNROLL(4)
        for (int r = 0; r < R; r++)
            lut[r] = _mm512_fmadd_ps(base, _mm512_set1_ps(scales[(size_t)r * ng + g]),
                                     zeros ? _mm512_set1_ps(zeros[(size_t)r * ng + g]) : _mm512_setzero_ps());
        for (int k = g * G; k < (g + 1) * G; k += 32) {
QUNROLL(4)
            for (int r = 0; r < R; r += 4) _mm_prefetch(pf + (size_t)k / 2 * R + r * 16, _MM_HINT_T0);
QUNROLL(4)
            for (int r = 0; r < R; r++) {
                __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + r * rb + k / 2)));
                __m512 lo = _mm512_permutexvar_ps(b, lut[r]);
                __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut[r]);
QUNROLL(4)
                for (int t = 0; t < TT; t++) {
                    acc[r][t] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xp + t * ldx + k), acc[r][t]);
                    acc[r][t] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp + t * ldx + k + 16), acc[r][t]);
                }
            }
        }
    }
    if (R == 4) {
        __m128 b4 = bias ? _mm_loadu_ps(bias) : _mm_setzero_ps();
QUNROLL(4)
        for (int t = 0; t < TT; t++)
            _mm_storeu_ps(y + t * ldy, _mm_add_ps(hsum4x16(acc[0][t], acc[1 % R][t], acc[2 % R][t], acc[3 % R][t]), b4));
        return;
    }
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
QUNROLL(4)
        for (int t = 0; t < TT; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]) + b;
    }
}

/* One instantiation per (dtype, rows, tokens): the tiles' loops unroll
 * into straight register code only with constant R and TT. */
#define QT_RS(DT, R, TT)                                                                                          \
    static Q512_FN void rs_##DT##_##R##_##TT(const float *x, size_t ldx, const uint8_t *w, size_t rb, int K,     \
                                             const float *s, const float *b, float *y, size_t ldy) {             \
        tile_rowscale(TB_##DT, x, ldx, w, rb, K, s, b, y, ldy, R, TT);                                            \
    }
#define QT_I4(R, TT)                                                                                              \
    static Q512_FN void i4_##R##_##TT(const float *x, size_t ldx, const uint8_t *w, size_t rb, int K, int G,    \
                                      const float *s, const float *z, const float *b, float *y, size_t ldy) {    \
        tile_i4(x, ldx, w, rb, K, G, s, z, b, y, ldy, R, TT);                                                     \
    }
#define QT_ALL(R)                                                                                                 \
    QT_RS(I8, R, 1) QT_RS(I8, R, 2) QT_RS(I8, R, 3) QT_RS(I8, R, 4)                                               \
    QT_RS(FP8_E4M3, R, 1) QT_RS(FP8_E4M3, R, 2) QT_RS(FP8_E4M3, R, 3) QT_RS(FP8_E4M3, R, 4)                       \
    QT_I4(R, 1) QT_I4(R, 2) QT_I4(R, 3) QT_I4(R, 4)
QT_ALL(1)
QT_ALL(4)

typedef void (*rs_fn)(const float *, size_t, const uint8_t *, size_t, int, const float *, const float *, float *,
                      size_t);
typedef void (*i4_fn)(const float *, size_t, const uint8_t *, size_t, int, int, const float *, const float *,
                      const float *, float *, size_t);
static const rs_fn rs_i8[2][4] = {{rs_I8_1_1, rs_I8_1_2, rs_I8_1_3, rs_I8_1_4},
                                  {rs_I8_4_1, rs_I8_4_2, rs_I8_4_3, rs_I8_4_4}};
static const rs_fn rs_f8[2][4] = {{rs_FP8_E4M3_1_1, rs_FP8_E4M3_1_2, rs_FP8_E4M3_1_3, rs_FP8_E4M3_1_4},
                                  {rs_FP8_E4M3_4_1, rs_FP8_E4M3_4_2, rs_FP8_E4M3_4_3, rs_FP8_E4M3_4_4}};
static const i4_fn i4_tiles[2][4] = {{i4_1_1, i4_1_2, i4_1_3, i4_1_4}, {i4_4_1, i4_4_2, i4_4_3, i4_4_4}};

static Q512_FN void qmm_small(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N,
                              int n0, int n1) {
    const uint8_t *codes = w->codes;
    size_t rb = (size_t)tb_quant_codes_bytes(w->dtype, 1, K);
    int ng = K / w->group;
    const float *xs = x;
    if (w->dtype == TB_I4) {
        float *xp = tb_cpu_qscratch((size_t)T * K * sizeof(float));
        i4_reorder_x(x, xp, T, K);
        xs = xp;
    }
    for (int n = n0; n < n1;) {
        int R = n1 - n >= 4 ? 4 : 1, ri = R == 4;
        const uint8_t *wr = codes + (size_t)n * rb;
        const float *b = bias ? bias + n : NULL;
        for (int t = 0; t < T; t += 4) {
            int tt = T - t < 4 ? T - t : 4;
            const float *xt = xs + (size_t)t * K;
            float *yt = y + (size_t)t * N + n;
            if (w->dtype == TB_I4)
                i4_tiles[ri][tt - 1](xt, (size_t)K, wr, rb, K, w->group, w->scales + (size_t)n * ng,
                                     w->zeros ? w->zeros + (size_t)n * ng : NULL, b, yt, (size_t)N);
            else
                (w->dtype == TB_I8 ? rs_i8 : rs_f8)[ri][tt - 1](xt, (size_t)K, wr, rb, K, w->scales + n, b, yt,
                                                                (size_t)N);
        }
        n += R;
    }
}

/* ---------------------------------------------------------------- prefill */

#define QP_MR 6
#define QP_NR 32
#define QP_KC 256 /* a multiple of every i4 group: blocks start at group boundaries */
#define QP_NC 128
_Static_assert(QP_NC * QP_KC * sizeof(float) <= TB_CPU_PANEL_BYTES, "panel exceeds the per-thread scratch");

/* dq(W)[n, k0 : k0 + kc] -> out (f32); k0 a multiple of QP_KC. */
static Q512_FN void dq_row(const tb_qweight *w, int K, int n, int k0, int kc, float *out) {
    size_t rb = (size_t)tb_quant_codes_bytes(w->dtype, 1, K);
    const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
    if (w->dtype == TB_I4) {
        const __m512i lo_i = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i hi_i = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        int ng = K / w->group;
        for (int k = k0; k < k0 + kc; k += 32) {
            int g = k / w->group;
            float s = w->scales[(size_t)n * ng + g], z = w->zeros ? w->zeros[(size_t)n * ng + g] : 0.0f;
            __m512 lut = _mm512_fmadd_ps(i4_base(), _mm512_set1_ps(s), _mm512_set1_ps(z));
            __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + k / 2)));
            __m512 ev = _mm512_permutexvar_ps(b, lut), od = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut);
            _mm512_storeu_ps(out + (k - k0), _mm512_permutex2var_ps(ev, lo_i, od));
            _mm512_storeu_ps(out + (k - k0) + 16, _mm512_permutex2var_ps(ev, hi_i, od));
        }
        return;
    }
    int fp8 = w->dtype == TB_FP8_E4M3;
    __m512 s = _mm512_set1_ps(w->scales[n] * (fp8 ? 256.0f : 1.0f));
    int k = 0;
    for (; k + 16 <= kc; k += 16)
        _mm512_storeu_ps(out + k, _mm512_mul_ps(fp8 ? f8x16(row + k0 + k) : i8x16(row + k0 + k), s));
    if (k < kc) {
        __mmask16 m = (__mmask16)((1u << (kc - k)) - 1);
        _mm512_mask_storeu_ps(out + k, m,
                              _mm512_mul_ps(fp8 ? f8x16m(row + k0 + k, m) : i8x16m(row + k0 + k, m), s));
    }
}

/* r[i] (row i, 16 elements) -> r[c] (element c of rows 0..15): unpack
 * pairs of rows, then pairs of pairs (each 128-bit block then holds one
 * element of 4 rows), then a 4x4 transpose of the blocks. 64 shuffles for
 * 256 elements; a scalar transposing store cost a cycle per element. */
Q512_INLINE void tr16x16(__m512 r[16]) {
    __m512 t[16], u[16];
QUNROLL(8)
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
QUNROLL(4)
    for (int q = 0; q < 4; q++) {
        __m512d a = _mm512_castps_pd(t[4 * q]), b = _mm512_castps_pd(t[4 * q + 1]);
        __m512d c = _mm512_castps_pd(t[4 * q + 2]), d = _mm512_castps_pd(t[4 * q + 3]);
        u[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* u[4q + c], block b: element 4b + c of rows 4q .. 4q+3 */
QUNROLL(4)
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* panel (nn rows of W from n0, k0 .. k0+kc) as (kc, 32) micro-panels,
 * zero-padded to whole panels; 16 rows dequantised at a time, then
 * transposed 16 x 16 into the panel */
static Q512_FN void qp_pack(float *panel, const tb_qweight *w, int K, int n0, int nn, int k0, int kc) {
    float rows[16][QP_KC] __attribute__((aligned(64)));
    int nnr = (nn + QP_NR - 1) / QP_NR * QP_NR;
    for (int j0 = 0; j0 < nnr; j0 += 16) {
        for (int i = 0; i < 16; i++) {
            if (j0 + i < nn) dq_row(w, K, n0 + j0 + i, k0, kc, rows[i]);
            else memset(rows[i], 0, sizeof(float) * (size_t)kc);
        }
        float *dst = panel + (size_t)(j0 / QP_NR) * kc * QP_NR + (j0 % QP_NR);
        int k = 0;
        for (; k + 16 <= kc; k += 16) {
            __m512 r[16];
QUNROLL(16)
            for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(rows[i] + k);
            tr16x16(r);
QUNROLL(16)
            for (int c = 0; c < 16; c++) _mm512_store_ps(dst + (size_t)(k + c) * QP_NR, r[c]);
        }
        for (; k < kc; k++)
            for (int i = 0; i < 16; i++) dst[(size_t)k * QP_NR + i] = rows[i][k];
    }
}

Q512_INLINE void qp_micro(const int mr, const float *x, size_t ldx, const float *pw, int kc, float *y, size_t ldy,
                          int nr, int first, const float *bias) {
    __m512 acc[QP_MR][2];
QUNROLL(6)
    for (int i = 0; i < QP_MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(pw + (size_t)k * QP_NR), b1 = _mm512_load_ps(pw + (size_t)k * QP_NR + 16);
QUNROLL(6)
        for (int i = 0; i < mr; i++) {
            __m512 a = _mm512_set1_ps(x[i * ldx + k]);
            acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
    }
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1);
    __m512 bb0 = _mm512_setzero_ps(), bb1 = _mm512_setzero_ps();
    if (first && bias) {
        bb0 = _mm512_maskz_loadu_ps(m0, bias);
        bb1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    }
QUNROLL(6)
    for (int i = 0; i < mr; i++) {
        float *o = y + i * ldy;
        __m512 c0 = first ? bb0 : _mm512_maskz_loadu_ps(m0, o);
        __m512 c1 = first ? bb1 : _mm512_maskz_loadu_ps(m1, o + 16);
        _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(c0, acc[i][0]));
        _mm512_mask_storeu_ps(o + 16, m1, _mm512_add_ps(c1, acc[i][1]));
    }
}

#define QP_CASE(MR)                                                                                               \
    case MR: qp_micro(MR, x, ldx, pw, kc, y, ldy, nr, first, bias); break;
static Q512_FN void qp_micro_any(int mr, const float *x, size_t ldx, const float *pw, int kc, float *y, size_t ldy,
                                 int nr, int first, const float *bias) {
    switch (mr) {
        QP_CASE(1) QP_CASE(2) QP_CASE(3) QP_CASE(4) QP_CASE(5) QP_CASE(6)
    default: TB_ASSERT(!"bad microkernel shape");
    }
}

static Q512_FN void qmm_packed(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N,
                               int n0, int n1) {
    float *panel = tb_cpu_thread_panel();
    for (int k0 = 0; k0 < K; k0 += QP_KC) {
        int kc = K - k0 < QP_KC ? K - k0 : QP_KC, first = k0 == 0;
        for (int p0 = n0; p0 < n1; p0 += QP_NC) {
            int pn = n1 - p0 < QP_NC ? n1 - p0 : QP_NC;
            qp_pack(panel, w, K, p0, pn, k0, kc);
            for (int t0 = 0; t0 < T; t0 += QP_MR) {
                int mr = T - t0 < QP_MR ? T - t0 : QP_MR;
                for (int j = 0; j < pn; j += QP_NR) {
                    int nr = pn - j < QP_NR ? pn - j : QP_NR;
                    qp_micro_any(mr, x + (size_t)t0 * K + k0, (size_t)K, panel + (size_t)(j / QP_NR) * kc * QP_NR,
                                 kc, y + (size_t)t0 * N + p0 + j, (size_t)N, nr, first, bias ? bias + p0 + j : NULL);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- entry */

void tb_cpu_qmm_avx512(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                       int n1, int tactic) {
    if (n1 <= n0 || T <= 0) return;
    if (tactic == TB_QMM_Q8) tb_cpu_qmm_avx2(x, w, bias, y, T, K, N, n0, n1, tactic); /* no VNNI: maddubs form */
    else if (tactic == TB_QMM_PACKED) qmm_packed(x, w, bias, y, T, K, N, n0, n1);
    else qmm_small(x, w, bias, y, T, K, N, n0, n1);
}
