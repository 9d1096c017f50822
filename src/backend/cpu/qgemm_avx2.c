/*
 * qgemm_avx2.c — the AVX2 + FMA + F16C path of tb_cpu_qmatmul: y[0:T, n0:n1]
 * for one thread (qgemm.c splits the rows of W across the pool).
 *
 * The same two regimes as the AVX-512 path (qgemm_avx512.c), with 8 lanes:
 *   small steps: register tiles of 4 weight rows by up to 4 tokens, each
 *     row tile read from memory once and from L1 by every token block;
 *     i8 codes vpmovsxbd + vcvtdq2ps, fp8 codes rebuilt as f16 bits (value
 *     / 256) + vcvtph2ps, the row's scale applied to the sum; i4: 8 bytes
 *     vpmovzxbd, XOR 0x88 turns each nibble v into u = code + 8 in [0, 15],
 *     so dq = u * scale + (zero - 8 * scale), one FMA per 8 weights shared by
 *     the tokens; x reordered per call into each 16-block's even then odd
 *     elements (the low and high nibbles);
 *   prefill: (256, 128) blocks of W dequantised into the f32 packed panel,
 *     a 6x16 outer-product microkernel over all rows of x.
 * Functions carry target attributes, so the library runs on any x86-64.
 */
#include "backend/cpu/kernels.h"
#include "core/quant.h"

#include <immintrin.h>

#define Q2_FN __attribute__((target("avx2,fma,f16c")))
#define Q2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

Q2_INLINE __m256 i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* 8 fp8 codes as f32 / 256 */
Q2_INLINE __m256 f8x8(const uint8_t *p) {
    __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xBF80));
    return _mm256_cvtph_ps(h);
}
Q2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float code1(tb_dtype dt, const uint8_t *row, int k) {
    return dt == TB_I8 ? (float)(int8_t)row[k] : tb_fp8_e4m3_to_f32(row[k]);
}

/* xp (T, K) = x with every 16-block reordered to its 8 even then 8 odd
 * elements (K % 32 == 0 for i4). */
Q2_INLINE void i4_reorder_x(const float *x, float *xp, int T, int K) {
    const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (size_t i = 0; i < (size_t)T * K; i += 16) {
        __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + i), perm);     /* a0 a2 a4 a6 a1 a3 a5 a7 */
        __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + i + 8), perm); /* b0 b2 .. b1 b3 .. */
        _mm256_storeu_ps(xp + i, _mm256_permute2f128_ps(a, b, 0x20));
        _mm256_storeu_ps(xp + i + 8, _mm256_permute2f128_ps(a, b, 0x31));
    }
}

/* ---------------------------------------------------------------- small steps */

enum { qpf_dist = 8192 }; /* software prefetch distance, as in qgemm_avx512.c */

Q2_INLINE void tile_rowscale(tb_dtype dt, const float *x, size_t ldx, const uint8_t *w, size_t rb, int K,
                             const float *scales, const float *bias, float *y, size_t ldy, const int R, const int TT) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    int K8 = K & ~7;
    /* prefetch as in qgemm_avx512.c: R * 8 bytes consumed and prefetched per step */
    const char *pf = (const char *)w + qpf_dist;
    for (int k = 0; k < K8; k += 8) {
        if (R == 4 && (k & 8)) _mm_prefetch(pf + (size_t)k * R - 32, _MM_HINT_T0);
        __m256 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = dt == TB_I8 ? i8x8(w + r * rb + k) : f8x8(w + r * rb + k);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    float mul = dt == TB_I8 ? 1.0f : 256.0f;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            float tail = 0;
            for (int k = K8; k < K; k++) tail += x[t * ldx + k] * code1(dt, w + r * rb, k);
            y[t * ldy + r] = (hsum8(acc[r][t]) * mul + tail) * scales[r] + b;
        }
    }
}

Q2_INLINE void tile_i4(const float *xp, size_t ldx, const uint8_t *w, size_t rb, int K, int G, const float *scales,
                       const float *zeros, const float *bias, float *y, size_t ldy, const int R, const int TT) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i x88 = _mm256_set1_epi32(0x88), m15 = _mm256_set1_epi32(15);
    int ng = K / G;
    const char *pf = (const char *)w + qpf_dist;
    for (int g = 0; g < ng; g++) {
        __m256 sv[4], zv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float s = scales[(size_t)r * ng + g], z = zeros ? zeros[(size_t)r * ng + g] : 0.0f;
            sv[r] = _mm256_set1_ps(s);
            zv[r] = _mm256_set1_ps(z - 8.0f * s);
        }
        for (int k = g * G; k < (g + 1) * G; k += 16) {
            if (R == 4 && (k & 16)) _mm_prefetch(pf + (size_t)k / 2 * R - 32, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i b = _mm256_xor_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + r * rb + k / 2))), x88);
                __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, m15)), sv[r], zv[r]);
                __m256 hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), sv[r], zv[r]);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    acc[r][t] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xp + t * ldx + k), acc[r][t]);
                    acc[r][t] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xp + t * ldx + k + 8), acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) y[t * ldy + r] = hsum8(acc[r][t]) + b;
    }
}

#define QT_RS(DT, R, TT)                                                                                          \
    static Q2_FN void rs_##DT##_##R##_##TT(const float *x, size_t ldx, const uint8_t *w, size_t rb, int K,       \
                                           const float *s, const float *b, float *y, size_t ldy) {               \
        tile_rowscale(TB_##DT, x, ldx, w, rb, K, s, b, y, ldy, R, TT);                                            \
    }
#define QT_I4(R, TT)                                                                                              \
    static Q2_FN void i4_##R##_##TT(const float *x, size_t ldx, const uint8_t *w, size_t rb, int K, int G,      \
                                    const float *s, const float *z, const float *b, float *y, size_t ldy) {      \
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

static Q2_FN void qmm_small(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N,
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
#define QP_NR 16
#define QP_KC 256 /* a multiple of every i4 group */
#define QP_NC 128
_Static_assert(QP_NC * QP_KC * sizeof(float) <= TB_CPU_PANEL_BYTES, "panel exceeds the per-thread scratch");

/* dq(W)[n, k0 : k0 + kc] -> out; k0 a multiple of QP_KC */
static Q2_FN void dq_row(const tb_qweight *w, int K, int n, int k0, int kc, float *out) {
    size_t rb = (size_t)tb_quant_codes_bytes(w->dtype, 1, K);
    const uint8_t *row = (const uint8_t *)w->codes + (size_t)n * rb;
    if (w->dtype == TB_I4) {
        const __m256i x88 = _mm256_set1_epi32(0x88), m15 = _mm256_set1_epi32(15);
        int ng = K / w->group;
        for (int k = k0; k < k0 + kc; k += 8) {
            int g = k / w->group;
            float s = w->scales[(size_t)n * ng + g], z = w->zeros ? w->zeros[(size_t)n * ng + g] : 0.0f;
            __m256 sv = _mm256_set1_ps(s), zv = _mm256_set1_ps(z - 8.0f * s);
            /* 4 bytes: 8 codes, low nibble first; widen to 8 dwords with
             * the byte repeated, shift the odd lanes by 4 */
            int32_t b4;
            memcpy(&b4, row + k / 2, 4);
            __m256i b = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(b4),
                                                             _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1,
                                                                           -1, -1, -1, -1)));
            b = _mm256_srlv_epi32(_mm256_xor_si256(b, x88), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
            _mm256_storeu_ps(out + (k - k0),
                             _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, m15)), sv, zv));
        }
        return;
    }
    int fp8 = w->dtype == TB_FP8_E4M3;
    float sc = w->scales[n];
    __m256 s = _mm256_set1_ps(sc * (fp8 ? 256.0f : 1.0f));
    int k = 0;
    for (; k + 8 <= kc; k += 8)
        _mm256_storeu_ps(out + k, _mm256_mul_ps(fp8 ? f8x8(row + k0 + k) : i8x8(row + k0 + k), s));
    for (; k < kc; k++) out[k] = code1(w->dtype, row, k0 + k) * sc;
}

static Q2_FN void qp_pack(float *panel, const tb_qweight *w, int K, int n0, int nn, int k0, int kc) {
    float row[QP_KC] __attribute__((aligned(32)));
    int nnr = (nn + QP_NR - 1) / QP_NR * QP_NR;
    for (int j = 0; j < nnr; j++) {
        float *dst = panel + (size_t)(j / QP_NR) * kc * QP_NR + (j % QP_NR);
        if (j < nn) {
            dq_row(w, K, n0 + j, k0, kc, row);
            for (int k = 0; k < kc; k++) dst[(size_t)k * QP_NR] = row[k];
        } else {
            for (int k = 0; k < kc; k++) dst[(size_t)k * QP_NR] = 0.0f;
        }
    }
}

Q2_INLINE void qp_micro(const int mr, const float *x, size_t ldx, const float *pw, int kc, float *y, size_t ldy,
                        int nr, int first, const float *bias) {
    __m256 acc[QP_MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < QP_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(pw + (size_t)k * QP_NR), b1 = _mm256_load_ps(pw + (size_t)k * QP_NR + 8);
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) {
            __m256 a = _mm256_broadcast_ss(x + i * ldx + k);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
        float *o = y + i * ldy;
        if (nr == QP_NR) {
            __m256 c0 = first ? (bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps()) : _mm256_loadu_ps(o);
            __m256 c1 = first ? (bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps()) : _mm256_loadu_ps(o + 8);
            _mm256_storeu_ps(o, _mm256_add_ps(c0, acc[i][0]));
            _mm256_storeu_ps(o + 8, _mm256_add_ps(c1, acc[i][1]));
        } else {
            float v[QP_NR] __attribute__((aligned(32)));
            _mm256_store_ps(v, acc[i][0]);
            _mm256_store_ps(v + 8, acc[i][1]);
            for (int j = 0; j < nr; j++) o[j] = (first ? (bias ? bias[j] : 0.0f) : o[j]) + v[j];
        }
    }
}

#define QP_CASE(MR)                                                                                               \
    case MR: qp_micro(MR, x, ldx, pw, kc, y, ldy, nr, first, bias); break;
static Q2_FN void qp_micro_any(int mr, const float *x, size_t ldx, const float *pw, int kc, float *y, size_t ldy,
                               int nr, int first, const float *bias) {
    switch (mr) {
        QP_CASE(1) QP_CASE(2) QP_CASE(3) QP_CASE(4) QP_CASE(5) QP_CASE(6)
    default: TB_ASSERT(!"bad microkernel shape");
    }
}

static Q2_FN void qmm_packed(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N,
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

void tb_cpu_qmm_avx2(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                     int n1, int tactic) {
    if (n1 <= n0 || T <= 0) return;
    if (tactic == TB_QMM_PACKED) qmm_packed(x, w, bias, y, T, K, N, n0, n1);
    else qmm_small(x, w, bias, y, T, K, N, n0, n1);
}
