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
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(4)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    int K8 = K & ~7;
    /* prefetch as in qgemm_avx512.c: R * 8 bytes consumed and prefetched per step */
    const char *pf = (const char *)w + qpf_dist;
    int k0 = 0;
    if (dt == TB_FP8_E4M3) {
        /* 16 codes a step: one widening to 16-bit lanes for two conversions */
        for (; k0 + 16 <= K8; k0 += 16) {
            if (R == 4) _mm_prefetch(pf + (size_t)k0 * R, _MM_HINT_T0);
            __m256 x0[4], x1[4];
QUNROLL(4)
            for (int t = 0; t < TT; t++) {
                x0[t] = _mm256_loadu_ps(x + t * ldx + k0);
                x1[t] = _mm256_loadu_ps(x + t * ldx + k0 + 8);
            }
QUNROLL(4)
            for (int r = 0; r < R; r++) {
                __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + r * rb + k0)));
                h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBF80));
                __m256 w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
QUNROLL(4)
                for (int t = 0; t < TT; t++)
                    acc[r][t] = _mm256_fmadd_ps(w1, x1[t], _mm256_fmadd_ps(w0, x0[t], acc[r][t]));
            }
        }
    }
    for (int k = k0; k < K8; k += 8) {
        if (R == 4 && (k & 8)) _mm_prefetch(pf + (size_t)k * R - 32, _MM_HINT_T0);
        __m256 xv[4];
QUNROLL(4)
        for (int t = 0; t < TT; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + k);
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            __m256 wv = dt == TB_I8 ? i8x8(w + r * rb + k) : f8x8(w + r * rb + k);
QUNROLL(4)
            for (int t = 0; t < TT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    float mul = dt == TB_I8 ? 1.0f : 256.0f;
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
QUNROLL(4)
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
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(4)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i x88 = _mm256_set1_epi32(0x88), m15 = _mm256_set1_epi32(15);
    int ng = K / G;
    const char *pf = (const char *)w + qpf_dist;
    for (int g = 0; g < ng; g++) {
        __m256 sv[4], zv[4];
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            float s = scales[(size_t)r * ng + g], z = zeros ? zeros[(size_t)r * ng + g] : 0.0f;
            sv[r] = _mm256_set1_ps(s);
            zv[r] = _mm256_set1_ps(z - 8.0f * s);
        }
        for (int k = g * G; k < (g + 1) * G; k += 16) {
            if (R == 4 && (k & 16)) _mm_prefetch(pf + (size_t)k / 2 * R - 32, _MM_HINT_T0);
QUNROLL(4)
            for (int r = 0; r < R; r++) {
                __m256i b = _mm256_xor_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + r * rb + k / 2))), x88);
                __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, m15)), sv[r], zv[r]);
                __m256 hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), sv[r], zv[r]);
QUNROLL(4)
                for (int t = 0; t < TT; t++) {
                    acc[r][t] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xp + t * ldx + k), acc[r][t]);
                    acc[r][t] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xp + t * ldx + k + 8), acc[r][t]);
                }
            }
        }
    }
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
QUNROLL(4)
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

/* ---------------------------------------------------------------- int8 activations (TB_QMM_Q8) */
/* x quantised per block of 32 as tb_ref_qmatmul_q8 does, products with
 * vpmaddubsw (unsigned x signed bytes -> pairs summed to int16) and
 * vpmaddwd (pairs of int16 -> int32), as llama.cpp's AVX2 kernels do:
 *   i8  32 codes (one block) per step: |code| times q with code's sign
 *       (vpsignb), pairs <= 2 * 127 * 127, no saturation; one scale d per
 *       block, the row's scale on the sum;
 *   i4  32 bytes (64 codes, two blocks) per step: each nibble ^ 8 is
 *       u = code + 8 in [0, 15]; low nibbles (even k) and high (odd k)
 *       against x stored per 64-chunk as its 32 even then 32 odd elements;
 *       the two int16 products summed (<= 4 * 15 * 127) before vpmaddwd;
 *       lane j: block j / 4. dq = u * s + (zero - 8 s): the second term
 *       as sum_g (zero_g - 8 s_g) * XS[g], XS[g] = sum of d_b * sum(q_b)
 *       over g's blocks, once per token. */
typedef struct {
    int Kp, CH, nch, ngp;
    size_t stride, o_dv, o_cor;
} q8l;

static q8l q8_layout(const tb_qweight *w, int K) {
    q8l l;
    l.CH = w->dtype == TB_I4 ? 64 : 32;
    l.Kp = (K + l.CH - 1) / l.CH * l.CH;
    l.nch = l.Kp / l.CH;
    l.ngp = w->dtype == TB_I4 ? (K / w->group + 7) / 8 * 8 : 8;
    l.o_dv = (size_t)l.Kp;
    l.o_cor = l.o_dv + (size_t)l.nch * 8 * sizeof(float);
    l.stride = (l.o_cor + (size_t)l.ngp * sizeof(float) + 63) / 64 * 64;
    return l;
}

static Q2_FN void q8_quantize(const float *x, const tb_qweight *w, int T, int K, const q8l *l, uint8_t *out) {
    int i4 = w->dtype == TB_I4, nb = (K + 31) / 32;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * K;
        uint8_t *base = out + (size_t)t * l->stride;
        int8_t *xq = (int8_t *)base;
        float *dv = (float *)(base + l->o_dv), *cor = (float *)(base + l->o_cor);
        memset(xq, 0, (size_t)l->Kp);
        memset(cor, 0, (size_t)l->ngp * sizeof(float));
        float C = 0;
        for (int b = 0; b < nb; b++) {
            int k0 = b * 32, n = K - k0 < 32 ? K - k0 : 32;
            float blk[32] __attribute__((aligned(32)));
            const float *src = xr + k0;
            if (n < 32) {
                memset(blk, 0, sizeof blk);
                memcpy(blk, src, (size_t)n * sizeof(float));
                src = blk;
            }
            __m256 v[4], mx = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(src + 8 * i);
                mx = _mm256_max_ps(mx, _mm256_and_ps(v[i], absm));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
            int32_t q[32] __attribute__((aligned(32)));
            for (int i = 0; i < 4; i++)
                _mm256_store_si256((__m256i *)(q + 8 * i), _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id))));
            int qs = 0;
            if (i4) {
                int8_t *c = xq + (b / 2) * 64 + (b % 2) * 16;
                for (int j = 0; j < 16; j++) {
                    c[j] = (int8_t)q[2 * j];
                    c[32 + j] = (int8_t)q[2 * j + 1];
                }
            } else {
                for (int j = 0; j < 32; j++) xq[k0 + j] = (int8_t)q[j];
            }
            for (int j = 0; j < 32; j++) qs += q[j];
            if (i4) {
                for (int j = 0; j < 4; j++) dv[(b / 2) * 8 + (b % 2) * 4 + j] = d;
                cor[k0 / w->group] += d * (float)qs;
            } else {
                for (int j = 0; j < 8; j++) dv[b * 8 + j] = d;
                C += d * (float)qs;
            }
        }
        if (i4 && nb % 2) /* a last chunk of one block: the other block's lanes */
            for (int j = 4; j < 8; j++) dv[(nb / 2) * 8 + j] = 0;
        if (!i4) cor[0] = C;
    }
}

Q2_INLINE __m256i ld32_tail(const uint8_t *p, int n) {
    if (n >= 32) return _mm256_loadu_si256((const __m256i *)p);
    uint8_t b[32] = {0};
    memcpy(b, p, (size_t)n);
    return _mm256_loadu_si256((const __m256i *)b);
}

Q2_INLINE void q8_tile_i8(const uint8_t *xs, const q8l *l, const uint8_t *w, size_t rb, int K, const float *scales,
                          const float *bias, float *y, size_t ldy, const int R, const int TT) {
    __m256 acc[4][2];
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(2)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    const char *pf = (const char *)w + qpf_dist;
    for (int c = 0; c < l->nch; c++) {
        int k = c * 32;
        if (R == 4) _mm_prefetch(pf + (size_t)k * R, _MM_HINT_T0), _mm_prefetch(pf + (size_t)k * R + 64, _MM_HINT_T0);
        __m256i xv[2];
        __m256 dv[2];
QUNROLL(2)
        for (int t = 0; t < TT; t++) {
            xv[t] = _mm256_loadu_si256((const __m256i *)(xs + t * l->stride + k));
            dv[t] = _mm256_loadu_ps((const float *)(xs + t * l->stride + l->o_dv) + c * 8);
        }
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            __m256i wv = ld32_tail(w + r * rb + k, K - k), ax = _mm256_abs_epi8(wv);
QUNROLL(2)
            for (int t = 0; t < TT; t++) {
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(xv[t], wv)), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dv[t], acc[r][t]);
            }
        }
    }
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
QUNROLL(2)
        for (int t = 0; t < TT; t++) y[t * ldy + r] = hsum8(acc[r][t]) * scales[r] + b;
    }
}

Q2_INLINE void q8_tile_i4(const uint8_t *xs, const q8l *l, const uint8_t *w, size_t rb, int K, int G,
                          const float *scales, const float *zeros, const float *bias, float *y, size_t ldy,
                          const int R, const int TT) {
    __m256 acc[4][2];
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(2)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), x88 = _mm256_set1_epi8((char)0x88), m15 = _mm256_set1_epi8(15);
    int ng = K / G, half = K / 2;
    const char *pf = (const char *)w + qpf_dist;
    for (int c = 0; c < l->nch; c++) {
        int kb = c * 32, g0 = (2 * c * 32) / G, g1 = ((2 * c + 1) * 32) / G;
        if (g1 >= ng) g1 = ng - 1;
        if (R == 4) _mm_prefetch(pf + (size_t)kb * R, _MM_HINT_T0), _mm_prefetch(pf + (size_t)kb * R + 64, _MM_HINT_T0);
        __m256i xe[2], xo[2];
        __m256 dv[2];
QUNROLL(2)
        for (int t = 0; t < TT; t++) {
            xe[t] = _mm256_loadu_si256((const __m256i *)(xs + t * l->stride + c * 64));
            xo[t] = _mm256_loadu_si256((const __m256i *)(xs + t * l->stride + c * 64 + 32));
            dv[t] = _mm256_loadu_ps((const float *)(xs + t * l->stride + l->o_dv) + c * 8);
        }
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            __m256i b = _mm256_xor_si256(ld32_tail(w + r * rb + kb, half - kb), x88);
            __m256i lo = _mm256_and_si256(b, m15), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m15);
            const float *sr = scales + (size_t)r * ng;
            __m256 sv = _mm256_setr_m128(_mm_set1_ps(sr[g0]), _mm_set1_ps(sr[g1]));
QUNROLL(2)
            for (int t = 0; t < TT; t++) {
                __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe[t]), _mm256_maddubs_epi16(hi, xo[t]));
                p = _mm256_madd_epi16(p, ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv[t], sv), acc[r][t]);
            }
        }
    }
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
        const float *sr = scales + (size_t)r * ng, *zr = zeros ? zeros + (size_t)r * ng : NULL;
QUNROLL(2)
        for (int t = 0; t < TT; t++) {
            const float *xsg = (const float *)(xs + t * l->stride + l->o_cor);
            __m256 zv = _mm256_setzero_ps();
            int g = 0;
            for (; g + 8 <= ng; g += 8) {
                __m256 zp = _mm256_fmadd_ps(_mm256_loadu_ps(sr + g), _mm256_set1_ps(-8.0f),
                                            zr ? _mm256_loadu_ps(zr + g) : _mm256_setzero_ps());
                zv = _mm256_fmadd_ps(zp, _mm256_loadu_ps(xsg + g), zv);
            }
            float zc = hsum8(zv);
            for (; g < ng; g++) zc += ((zr ? zr[g] : 0.0f) - 8.0f * sr[g]) * xsg[g];
            y[t * ldy + r] = hsum8(acc[r][t]) + zc + b;
        }
    }
}

#define Q8T(R, TT)                                                                                                \
    static Q2_FN void q8i8_##R##_##TT(const uint8_t *xs, const q8l *l, const uint8_t *w, size_t rb, int K,       \
                                      const float *s, const float *b, float *y, size_t ldy) {                    \
        q8_tile_i8(xs, l, w, rb, K, s, b, y, ldy, R, TT);                                                         \
    }                                                                                                             \
    static Q2_FN void q8i4_##R##_##TT(const uint8_t *xs, const q8l *l, const uint8_t *w, size_t rb, int K, int G, \
                                      const float *s, const float *z, const float *b, float *y, size_t ldy) {    \
        q8_tile_i4(xs, l, w, rb, K, G, s, z, b, y, ldy, R, TT);                                                   \
    }
Q8T(1, 1) Q8T(1, 2) Q8T(4, 1) Q8T(4, 2)
typedef void (*q8i8_fn)(const uint8_t *, const q8l *, const uint8_t *, size_t, int, const float *, const float *,
                        float *, size_t);
typedef void (*q8i4_fn)(const uint8_t *, const q8l *, const uint8_t *, size_t, int, int, const float *,
                        const float *, const float *, float *, size_t);
static const q8i8_fn q8i8_tiles[2][2] = {{q8i8_1_1, q8i8_1_2}, {q8i8_4_1, q8i8_4_2}};
static const q8i4_fn q8i4_tiles[2][2] = {{q8i4_1_1, q8i4_1_2}, {q8i4_4_1, q8i4_4_2}};

static Q2_FN void qmm_q8(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                         int n1) {
    TB_ASSERT(w->dtype == TB_I8 || w->dtype == TB_I4);
    q8l l = q8_layout(w, K);
    uint8_t *xs = tb_cpu_qscratch(l.stride * (size_t)T);
    q8_quantize(x, w, T, K, &l, xs);
    size_t rb = (size_t)tb_quant_codes_bytes(w->dtype, 1, K);
    int ng = K / w->group;
    for (int n = n0; n < n1;) {
        int R = n1 - n >= 4 ? 4 : 1, ri = R == 4;
        const uint8_t *wr = (const uint8_t *)w->codes + (size_t)n * rb;
        const float *b = bias ? bias + n : NULL;
        for (int t = 0; t < T; t += 2) {
            int tt = T - t < 2 ? T - t : 2;
            const uint8_t *xt = xs + (size_t)t * l.stride;
            float *yt = y + (size_t)t * N + n;
            if (w->dtype == TB_I4)
                q8i4_tiles[ri][tt - 1](xt, &l, wr, rb, K, w->group, w->scales + (size_t)n * ng,
                                       w->zeros ? w->zeros + (size_t)n * ng : NULL, b, yt, (size_t)N);
            else
                q8i8_tiles[ri][tt - 1](xt, &l, wr, rb, K, w->scales + n, b, yt, (size_t)N);
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

/* 8x8 transpose in registers: r[i] (row i, 8 elements) -> r[c] (element
 * c of rows 0..7) */
Q2_INLINE void tr8x8(__m256 r[8]) {
    __m256 t[8], u[8];
QUNROLL(4)
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
QUNROLL(2)
    for (int q = 0; q < 2; q++) {
        u[4 * q] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
        u[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
        u[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
        u[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
    }
QUNROLL(4)
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* panel as (kc, 16) micro-panels, zero-padded; 8 rows dequantised at a
 * time and transposed 8 x 8 into the panel */
static Q2_FN void qp_pack(float *panel, const tb_qweight *w, int K, int n0, int nn, int k0, int kc) {
    float rows[8][QP_KC] __attribute__((aligned(32)));
    int nnr = (nn + QP_NR - 1) / QP_NR * QP_NR;
    for (int j0 = 0; j0 < nnr; j0 += 8) {
        for (int i = 0; i < 8; i++) {
            if (j0 + i < nn) dq_row(w, K, n0 + j0 + i, k0, kc, rows[i]);
            else memset(rows[i], 0, sizeof(float) * (size_t)kc);
        }
        float *dst = panel + (size_t)(j0 / QP_NR) * kc * QP_NR + (j0 % QP_NR);
        int k = 0;
        for (; k + 8 <= kc; k += 8) {
            __m256 r[8];
QUNROLL(8)
            for (int i = 0; i < 8; i++) r[i] = _mm256_load_ps(rows[i] + k);
            tr8x8(r);
QUNROLL(8)
            for (int c = 0; c < 8; c++) _mm256_store_ps(dst + (size_t)(k + c) * QP_NR, r[c]);
        }
        for (; k < kc; k++)
            for (int i = 0; i < 8; i++) dst[(size_t)k * QP_NR + i] = rows[i][k];
    }
}

Q2_INLINE void qp_micro(const int mr, const float *x, size_t ldx, const float *pw, int kc, float *y, size_t ldy,
                        int nr, int first, const float *bias) {
    __m256 acc[QP_MR][2];
QUNROLL(6)
    for (int i = 0; i < QP_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(pw + (size_t)k * QP_NR), b1 = _mm256_load_ps(pw + (size_t)k * QP_NR + 8);
QUNROLL(6)
        for (int i = 0; i < mr; i++) {
            __m256 a = _mm256_broadcast_ss(x + i * ldx + k);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
QUNROLL(6)
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
    else if (tactic == TB_QMM_Q8) qmm_q8(x, w, bias, y, T, K, N, n0, n1);
    else qmm_small(x, w, bias, y, T, K, N, n0, n1);
}
