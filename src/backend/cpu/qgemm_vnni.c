/*
 * qgemm_vnni.c — tactic TB_QMM_Q8 of tb_cpu_qmatmul on AVX-512 VNNI: the
 * activations quantised to int8 once per call, integer dot products with
 * vpdpbusd (64 multiply-adds per instruction), as llama.cpp's Q8_0 x Q4_0 /
 * Q8_0 kernels do. Small steps only (T < TB_CPU_GEMM_MIN_T).
 *
 * Activations: each row of x in blocks of 32 along K, d = amax / 127,
 * q = round(x * 127 / amax) (tb_ref_qmatmul_q8 is the reference), kept in
 * per-thread scratch for the call, with per-lane vectors of d so that one
 * vcvtdq2ps + FMA per 64 (i8) or 128 (i4) products applies the scales.
 * vpdpbusd multiplies unsigned by signed bytes, so the weight codes are
 * made unsigned and x stays signed:
 *   i8  u = code ^ 0x80 = code + 128: y = s * (sum d_b * dot(u, q)_b - C),
 *       C = 128 * sum_b d_b * sum(q_b), once per token;
 *   i4  64 bytes (128 codes) per step: byte ^ 0x88 turns each nibble into
 *       u = code + 8 in [0, 15]; the low nibbles (even k) and high (odd k)
 *       are two vectors, x is stored per 128-chunk as its 64 even then 64
 *       odd elements to match, so both dot products land in the lanes of
 *       the same block (lane j: block j / 4 of the chunk). dq = u * s +
 *       (zero - 8 s): the first term per lane with d_b * s_g, the second as
 *       sum_g (zero_g - 8 s_g) * XS[g], XS[g] = sum over g's blocks of
 *       d_b * sum(q_b), once per token.
 * Tiles: 4 weight rows x up to 2 tokens (registers), each row tile read
 * from memory once and from L1 by the further token pairs.
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

#define QV_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define QV_FN __attribute__((target(QV_TARGET)))
#define QV_INLINE static inline __attribute__((target(QV_TARGET), always_inline))

int tb_cpu_has_avx512vnni(void) {
    static int v = -1; /* racing first calls store the same value */
    if (v < 0) __builtin_cpu_init(); /* in case this runs before the runtime's constructor */
    if (v < 0) v = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl");
    return v;
}

/* The sums of 4 accumulators, [a, b, c, d]: one shared tree instead of
 * four reductions (they cost as much as the products when K is small). */
QV_INLINE __m128 hsum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
#define TB_HALF8(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    __m256 ab = _mm256_hadd_ps(TB_HALF8(a), TB_HALF8(b)), cd = _mm256_hadd_ps(TB_HALF8(c), TB_HALF8(d));
#undef TB_HALF8
    __m256 s = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

enum { qpf_dist = 8192 }; /* software prefetch, as in qgemm_avx512.c */

/* Per-token scratch layout: xq (Kp bytes), dv (Kp / CH * 16 floats, CH
 * codes per step), then the correction: C (i8) or XS (ngp floats, i4). */
typedef struct {
    int Kp, CH, nch, ngp;
    size_t stride, o_dv, o_cor; /* bytes */
} q8_layout;

static q8_layout layout(const tb_qweight *w, int K) {
    q8_layout l;
    l.CH = w->dtype == TB_I4 ? 128 : 64;
    l.Kp = (K + l.CH - 1) / l.CH * l.CH;
    l.nch = l.Kp / l.CH;
    int ng = K / w->group;
    l.ngp = w->dtype == TB_I4 ? (ng + 15) / 16 * 16 : 16;
    l.o_dv = (size_t)l.Kp;
    l.o_cor = l.o_dv + (size_t)l.nch * 16 * sizeof(float);
    l.stride = (l.o_cor + (size_t)l.ngp * sizeof(float) + 63) / 64 * 64;
    return l;
}

/* Quantises x row by row into the scratch (see the layout above). */
static QV_FN void quantize_x(const float *x, const tb_qweight *w, int T, int K, const q8_layout *l, uint8_t *out) {
    int i4 = w->dtype == TB_I4, nb = (K + 31) / 32;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * K;
        uint8_t *base = out + (size_t)t * l->stride;
        int8_t *xq = (int8_t *)base;
        float *dv = (float *)(base + l->o_dv), *cor = (float *)(base + l->o_cor);
        memset(xq, 0, (size_t)l->Kp);
        memset(dv, 0, (size_t)l->nch * 16 * sizeof(float));
        memset(cor, 0, (size_t)l->ngp * sizeof(float));
        float C = 0;
        for (int b = 0; b < nb; b++) {
            int k0 = b * 32, n = K - k0 < 32 ? K - k0 : 32;
            __mmask16 m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
            __mmask16 m1 = n >= 32 ? (__mmask16)0xffff : n <= 16 ? (__mmask16)0 : (__mmask16)((1u << (n - 16)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m0, xr + k0), c = _mm512_maskz_loadu_ps(m1, xr + k0 + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
            float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
            __m512 v0 = a, v1 = c;
            int8_t *p0 = xq + k0, *p1 = xq + k0 + 16;
            if (i4) {
                v0 = _mm512_permutex2var_ps(a, ev, c);
                v1 = _mm512_permutex2var_ps(a, od, c);
                int ch = b / 4, j = b % 4;
                p0 = xq + ch * 128 + j * 16;
                p1 = p0 + 64;
            }
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
            _mm_storeu_si128((__m128i *)p0, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)p1, _mm512_cvtsepi32_epi8(q1));
            float dq = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            if (i4) {
                for (int j = 0; j < 4; j++) dv[(b / 4) * 16 + (b % 4) * 4 + j] = d;
                cor[k0 / w->group] += dq;
            } else {
                for (int j = 0; j < 8; j++) dv[(b / 2) * 16 + (b % 2) * 8 + j] = d;
                C += dq;
            }
        }
        if (!i4) cor[0] = 128.0f * C;
    }
}

/* i8: R rows x TT tokens */
QV_INLINE void tile_i8(const uint8_t *xs, const q8_layout *l, const uint8_t *w, size_t rb, int K, const float *scales,
                       const float *bias, float *y, size_t ldy, const int R, const int TT) {
    __m512 acc[4][2];
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(2)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    const char *pf = (const char *)w + qpf_dist;
    for (int c = 0; c < l->nch; c++) {
        int k = c * 64;
        __mmask64 m = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
        _mm_prefetch(pf + (size_t)k * R, _MM_HINT_T0);
        if (R == 4) _mm_prefetch(pf + (size_t)k * R + 64, _MM_HINT_T0), _mm_prefetch(pf + (size_t)k * R + 128, _MM_HINT_T0),
            _mm_prefetch(pf + (size_t)k * R + 192, _MM_HINT_T0);
        __m512i xv[2];
        __m512 dv[2];
QUNROLL(2)
        for (int t = 0; t < TT; t++) {
            xv[t] = _mm512_loadu_si512(xs + t * l->stride + k);
            dv[t] = _mm512_loadu_ps((const float *)(xs + t * l->stride + l->o_dv) + c * 16);
        }
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            __m512i u = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w + r * rb + k), x80);
QUNROLL(2)
            for (int t = 0; t < TT; t++) {
                __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv[t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), dv[t], acc[r][t]);
            }
        }
    }
    if (R == 4) {
        __m128 s4 = _mm_loadu_ps(scales), b4 = bias ? _mm_loadu_ps(bias) : _mm_setzero_ps();
QUNROLL(2)
        for (int t = 0; t < TT; t++) {
            __m128 C = _mm_set1_ps(*(const float *)(xs + t * l->stride + l->o_cor));
            __m128 v = hsum4x16(acc[0][t], acc[1 % R][t], acc[2 % R][t], acc[3 % R][t]);
            _mm_storeu_ps(y + t * ldy, _mm_fmadd_ps(_mm_sub_ps(v, C), s4, b4));
        }
        return;
    }
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
QUNROLL(2)
        for (int t = 0; t < TT; t++) {
            float C = *(const float *)(xs + t * l->stride + l->o_cor);
            y[t * ldy + r] = (_mm512_reduce_add_ps(acc[r][t]) - C) * scales[r] + b;
        }
    }
}

/* i4: R rows x TT tokens; scales/zeros at row 0's groups, ng a row */
QV_INLINE void tile_i4(const uint8_t *xs, const q8_layout *l, const uint8_t *w, size_t rb, int K, int G,
                       const float *scales, const float *zeros, const float *bias, float *y, size_t ldy, const int R,
                       const int TT) {
    __m512 acc[4][2];
QUNROLL(4)
    for (int r = 0; r < R; r++)
QUNROLL(2)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    const __m512i x88 = _mm512_set1_epi8((char)0x88), m15 = _mm512_set1_epi8(15);
    int ng = K / G, gsh = G == 32 ? 0 : G == 64 ? 1 : 2; /* blocks of 32 per group: 1 << gsh */
    /* lane j belongs to block j / 4 of the chunk, group (j / 4) >> gsh of it */
    const __m512i gidx = _mm512_srli_epi32(_mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                 11, 12, 13, 14, 15), 2), gsh);
    const char *pf = (const char *)w + qpf_dist;
    for (int c = 0; c < l->nch; c++) {
        int kb = c * 64, nbytes = K / 2 - kb; /* code bytes left in the row */
        __mmask64 m = nbytes >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << nbytes) - 1);
        int g0 = (c * 4) >> gsh, ngl = ng - g0 < 16 ? ng - g0 : 16;
        __mmask16 gm = (__mmask16)((1u << ngl) - 1);
QUNROLL(4)
        for (int r = 0; r < R; r++) _mm_prefetch(pf + (size_t)kb * R + r * 64, _MM_HINT_T0);
        __m512i xe[2], xo[2];
        __m512 dv[2];
QUNROLL(2)
        for (int t = 0; t < TT; t++) {
            xe[t] = _mm512_loadu_si512(xs + t * l->stride + c * 128);
            xo[t] = _mm512_loadu_si512(xs + t * l->stride + c * 128 + 64);
            dv[t] = _mm512_loadu_ps((const float *)(xs + t * l->stride + l->o_dv) + c * 16);
        }
QUNROLL(4)
        for (int r = 0; r < R; r++) {
            __m512i b = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w + r * rb + kb), x88);
            __m512i lo = _mm512_and_si512(b, m15), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m15);
            __m512 sv = G >= 128 ? _mm512_set1_ps(scales[(size_t)r * ng + g0])
                                 : _mm512_permutexvar_ps(gidx, _mm512_maskz_loadu_ps(gm, scales + (size_t)r * ng + g0));
QUNROLL(2)
            for (int t = 0; t < TT; t++) {
                __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xe[t]);
                is = _mm512_dpbusd_epi32(is, hi, xo[t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv[t], sv), acc[r][t]);
            }
        }
    }
    /* the per-group term: sum_g (zero_g - 8 s_g) * XS[g] */
QUNROLL(4)
    for (int r = 0; r < R; r++) {
        float b = bias ? bias[r] : 0.0f;
        __m512 zc[2];
QUNROLL(2)
        for (int t = 0; t < TT; t++) zc[t] = _mm512_setzero_ps();
        for (int g = 0; g < ng; g += 16) {
            __mmask16 gm = ng - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ng - g)) - 1);
            __m512 s = _mm512_maskz_loadu_ps(gm, scales + (size_t)r * ng + g);
            __m512 z = zeros ? _mm512_maskz_loadu_ps(gm, zeros + (size_t)r * ng + g) : _mm512_setzero_ps();
            __m512 zp = _mm512_fmadd_ps(s, _mm512_set1_ps(-8.0f), z);
QUNROLL(2)
            for (int t = 0; t < TT; t++)
                zc[t] = _mm512_fmadd_ps(zp, _mm512_maskz_loadu_ps(gm, (const float *)(xs + t * l->stride + l->o_cor) + g),
                                        zc[t]);
        }
QUNROLL(2)
        for (int t = 0; t < TT; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][t], zc[t])) + b;
    }
}

#define QV_T(R, TT)                                                                                               \
    static QV_FN void v8_##R##_##TT(const uint8_t *xs, const q8_layout *l, const uint8_t *w, size_t rb, int K,   \
                                    const float *s, const float *b, float *y, size_t ldy) {                      \
        tile_i8(xs, l, w, rb, K, s, b, y, ldy, R, TT);                                                            \
    }                                                                                                             \
    static QV_FN void v4_##R##_##TT(const uint8_t *xs, const q8_layout *l, const uint8_t *w, size_t rb, int K,   \
                                    int G, const float *s, const float *z, const float *b, float *y, size_t ldy) { \
        tile_i4(xs, l, w, rb, K, G, s, z, b, y, ldy, R, TT);                                                      \
    }
QV_T(1, 1) QV_T(1, 2) QV_T(4, 1) QV_T(4, 2)

typedef void (*v8_fn)(const uint8_t *, const q8_layout *, const uint8_t *, size_t, int, const float *, const float *,
                      float *, size_t);
typedef void (*v4_fn)(const uint8_t *, const q8_layout *, const uint8_t *, size_t, int, int, const float *,
                      const float *, const float *, float *, size_t);
static const v8_fn v8_tiles[2][2] = {{v8_1_1, v8_1_2}, {v8_4_1, v8_4_2}};
static const v4_fn v4_tiles[2][2] = {{v4_1_1, v4_1_2}, {v4_4_1, v4_4_2}};

void tb_cpu_qmm_vnni(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N, int n0,
                     int n1) {
    TB_ASSERT(w->dtype == TB_I8 || w->dtype == TB_I4);
    if (n1 <= n0 || T <= 0) return;
    q8_layout l = layout(w, K);
    uint8_t *xs = tb_cpu_qscratch(l.stride * (size_t)T);
    quantize_x(x, w, T, K, &l, xs);
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
                v4_tiles[ri][tt - 1](xt, &l, wr, rb, K, w->group, w->scales + (size_t)n * ng,
                                     w->zeros ? w->zeros + (size_t)n * ng : NULL, b, yt, (size_t)N);
            else
                v8_tiles[ri][tt - 1](xt, &l, wr, rb, K, w->scales + n, b, yt, (size_t)N);
        }
        n += R;
    }
}
