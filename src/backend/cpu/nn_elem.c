/*
 * nn_elem.c — fast CPU kernels of the elementwise, normalisation and
 * reduction ops (nn.h): f32 only, AVX2 + FMA (target attributes, used when
 * tb_cpu_features() reports both), split over the pool for large tensors.
 * Anything else (other dtypes, shapes outside a fast path, a CPU without
 * AVX2) runs the op's reference kernel (ir/nn_elem.c).
 *
 * Accuracy against the reference (double precision, then rounded): the
 * bounds tests/test_nn_elem.c holds them to (worst seen in dense sweeps in
 * brackets); subnormal results are compared absolutely (1e-44 .. 1e-38).
 *   Relu, Clip, Add Sub Mul Div: bit-exact (IEEE operations, one rounding).
 *   Exp: relative 3e-7 [2.3e-7]. Cephes' range reduction and polynomial,
 *     2^n applied in two halves so that results stay exact into the
 *     subnormals and overflow to inf where they should.
 *   Sigmoid: relative 4e-7 [2.2e-7]; exp(-|x|) / (1 + exp(-|x|)) or
 *     1 / (1 + exp(-|x|)), no cancellation on either side.
 *   Tanh: relative 3e-7 [1.2e-7]; Cephes' odd polynomial below |x| 0.625,
 *     1 - 2 / (exp(2|x|) + 1) above.
 *   Erf: relative 5e-7 [3.5e-7], absolute 2e-7 near +-1. Taylor series to
 *     x^13 below |x| 0.5 (truncation < 1e-9); above, 1 - erfc(|x|) with
 *     erfc from Numerical Recipes' Chebyshev fit (fractional error
 *     < 1.2e-7), its exp(-x^2) argument carried exactly (x^2 split by FMA,
 *     the sum by TwoSum).
 *   Gelu, erf form: relative 1e-6 [5.3e-7] down to x = -14 (y ~ 1e-43):
 *     0.5 x erfc(-x / sqrt 2) from the same pieces, so the left tail keeps
 *     its relative accuracy.
 *   Gelu, tanh form: relative 5e-7 [3.3e-7]: x sigmoid(2u), 2u formed in
 *     double (exp magnifies its rounding by |2u|).
 *   Softmax (last axis): relative 1e-6 per element [2.2e-7]: x - max
 *     carried exactly into exp, sums in double.
 *   LayerNormalization (last axes, full scale/bias), BatchNormalization:
 *     1e-6 (1 + |y|) for inputs of unit scale, also with a mean of 100
 *     (means and variances in double; BatchNorm as one FMA per element
 *     with a = scale / sqrt(var + eps), b = bias - mean a per channel).
 *   ReduceMean ReduceSum (trailing axes): sums in double, one rounding from
 *     the reference; ReduceMax exact (NaN wins).
 */
#include "backend/cpu/nn.h"

#include <immintrin.h>
#include <math.h>

#define AVX2_FN __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((target("avx2,fma"), always_inline))

static int have_avx2(void) {
    uint32_t want = TB_CPU_AVX2 | TB_CPU_FMA;
    return (tb_cpu_features() & want) == want;
}

static tb_status run_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    return tb_op_get_def(n->op)->ref(n, in, n_in, out, n_out);
}

/* ================================================================ threads */

typedef void (*range_fn)(void *arg, int64_t lo, int64_t hi);

typedef struct {
    range_fn fn;
    void *arg;
    int64_t n, per;
} par_job;

static void par_worker(void *a, int ith, int nth) {
    const par_job *j = a;
    int64_t lo = j->per * ith, hi = lo + j->per;
    if (hi > j->n) hi = j->n;
    if (lo < hi) j->fn(j->arg, lo, hi);
}

/* fn over [0, n) in pieces of at least `grain` (multiples of `align`), one
 * per pool thread; on the calling thread alone when n is small. */
static void par_range(tb_cpu_nn_ctx *c, int64_t n, int64_t grain, int64_t align, range_fn fn, void *arg) {
    int nth = c && c->pool ? tb_pool_size(c->pool) : 1;
    if (nth <= 1 || n < 2 * grain) {
        if (n > 0) fn(arg, 0, n);
        return;
    }
    int64_t per = (n + nth - 1) / nth;
    if (per < grain) per = grain;
    per = (per + align - 1) / align * align;
    par_job j = {fn, arg, n, per};
    tb_pool_run(c->pool, par_worker, &j);
}

/* ================================================================ vector maths */

/* Lanes [0, n) set, n in [0, 8]. */
AVX2_INLINE __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#define SET(c) _mm256_set1_ps(c)

AVX2_INLINE __m256 vabs(__m256 x) { return _mm256_andnot_ps(SET(-0.0f), x); }

/* exp(x): x = n ln2 + r, |r| <= ln2 / 2, Cephes' polynomial for exp(r),
 * 2^n applied as 2^(n/2) 2^(n - n/2) so that both factors are normal for
 * n in [-150, 128] (subnormal results rounded once, overflow to inf). MINPS
 * / MAXPS return the second operand when one is NaN: NaN passes through. */
AVX2_INLINE __m256 exp8(__m256 x) {
    x = _mm256_max_ps(SET(-104.0f), _mm256_min_ps(SET(89.0f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, SET(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, SET(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, SET(-2.12194440e-4f), r);
    __m256 p = SET(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, SET(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, SET(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, SET(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, SET(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, SET(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), SET(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

AVX2_INLINE __m256 sigmoid8(__m256 x) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), vabs(x)));
    __m256 s = _mm256_div_ps(SET(1.0f), _mm256_add_ps(SET(1.0f), e));
    return _mm256_blendv_ps(_mm256_mul_ps(e, s), s, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
}

AVX2_INLINE __m256 tanh8(__m256 x) {
    __m256 ax = vabs(x), z = _mm256_mul_ps(x, x);
    __m256 p = SET(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, SET(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, SET(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, SET(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, SET(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    __m256 e = exp8(_mm256_add_ps(ax, ax));
    __m256 big = _mm256_sub_ps(SET(1.0f), _mm256_div_ps(SET(2.0f), _mm256_add_ps(e, SET(1.0f))));
    big = _mm256_or_ps(big, _mm256_and_ps(x, SET(-0.0f)));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, SET(0.625f), _CMP_LT_OQ));
}

/* erf(x) for |x| < 0.5: 2/sqrt(pi) (x - x^3/3 + x^5/10 - ... + x^13/9360) */
AVX2_INLINE __m256 erf_small8(__m256 x) {
    __m256 z = _mm256_mul_ps(x, x);
    __m256 p = SET(1.2055332981789664e-4f);
    p = _mm256_fmadd_ps(p, z, SET(-8.548327023450852e-4f));
    p = _mm256_fmadd_ps(p, z, SET(5.223977625442188e-3f));
    p = _mm256_fmadd_ps(p, z, SET(-2.6866170645131252e-2f));
    p = _mm256_fmadd_ps(p, z, SET(1.1283791670955126e-1f));
    p = _mm256_fmadd_ps(p, z, SET(-3.7612638903183754e-1f));
    p = _mm256_fmadd_ps(p, z, SET(1.1283791670955126f));
    return _mm256_mul_ps(p, x);
}

/* erfc(a) for a >= 0 (at most about 10), given a^2 = hi + lo exactly:
 * t exp(-a^2 + c(t)), t = 1 / (1 + a/2), c Numerical Recipes' fit; the
 * exponent's rounding error (TwoSum) and lo enter as a factor 1 + err. */
AVX2_INLINE __m256 erfc_tail8(__m256 a, __m256 hi, __m256 lo) {
    __m256 t = _mm256_div_ps(SET(1.0f), _mm256_fmadd_ps(a, SET(0.5f), SET(1.0f)));
    __m256 c = SET(0.17087277f);
    c = _mm256_fmadd_ps(c, t, SET(-0.82215223f));
    c = _mm256_fmadd_ps(c, t, SET(1.48851587f));
    c = _mm256_fmadd_ps(c, t, SET(-1.13520398f));
    c = _mm256_fmadd_ps(c, t, SET(0.27886807f));
    c = _mm256_fmadd_ps(c, t, SET(-0.18628806f));
    c = _mm256_fmadd_ps(c, t, SET(0.09678418f));
    c = _mm256_fmadd_ps(c, t, SET(0.37409196f));
    c = _mm256_fmadd_ps(c, t, SET(1.00002368f));
    c = _mm256_fmadd_ps(c, t, SET(-1.26551223f));
    __m256 s = _mm256_sub_ps(c, hi); /* TwoSum(c, -hi) */
    __m256 bb = _mm256_sub_ps(s, c);
    __m256 err = _mm256_add_ps(_mm256_sub_ps(c, _mm256_sub_ps(s, bb)), _mm256_sub_ps(_mm256_sub_ps(_mm256_setzero_ps(), hi), bb));
    __m256 corr = _mm256_add_ps(SET(1.0f), _mm256_sub_ps(err, lo));
    return _mm256_mul_ps(_mm256_mul_ps(t, exp8(s)), corr);
}

AVX2_INLINE __m256 erf8(__m256 x) {
    __m256 ax = vabs(x);
    __m256 a = _mm256_min_ps(SET(10.0f), ax); /* erfc(10) ~ 2e-45; NaN passes */
    __m256 hi = _mm256_mul_ps(a, a), lo = _mm256_fmsub_ps(a, a, hi);
    __m256 big = _mm256_sub_ps(SET(1.0f), erfc_tail8(a, hi, lo));
    big = _mm256_or_ps(big, _mm256_and_ps(x, SET(-0.0f)));
    return _mm256_blendv_ps(big, erf_small8(x), _mm256_cmp_ps(ax, SET(0.5f), _CMP_LT_OQ));
}

/* 0.5 x (1 + erf(x / sqrt 2)): 0.5 x erfc(|z|) for x < 0, 0.5 x (2 - erfc(z))
 * above, z^2 = x^2 / 2 carried exactly */
AVX2_INLINE __m256 gelu_erf8(__m256 x) {
    __m256 ax = _mm256_min_ps(SET(14.0f), vabs(x)); /* erfc(14 / sqrt 2) ~ 1e-44 */
    __m256 az = _mm256_mul_ps(ax, SET(0.70710678118654752f));
    __m256 hi0 = _mm256_mul_ps(ax, ax);
    __m256 hi = _mm256_mul_ps(hi0, SET(0.5f)), lo = _mm256_mul_ps(_mm256_fmsub_ps(ax, ax, hi0), SET(0.5f));
    __m256 q = erfc_tail8(az, hi, lo);
    __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 f = _mm256_blendv_ps(_mm256_sub_ps(SET(2.0f), q), q, neg);
    __m256 small = _mm256_add_ps(SET(1.0f), erf_small8(_mm256_mul_ps(x, SET(0.70710678118654752f))));
    f = _mm256_blendv_ps(f, small, _mm256_cmp_ps(az, SET(0.5f), _CMP_LT_OQ));
    f = _mm256_andnot_ps(_mm256_cmp_ps(x, SET(-14.0f), _CMP_LT_OQ), f); /* |y| < 2e-43 there */
    return _mm256_mul_ps(_mm256_mul_ps(x, SET(0.5f)), f);
}

/* x sigmoid(2u) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 * sigmoid taken as sigmoid8 does (no overflow on either side). exp(-|2u|)
 * magnifies the rounding of u by |2u|: 2u is formed in double and enters
 * as hi + lo, exp(-|hi|) (1 -+ lo). */
AVX2_INLINE __m256 gelu_tanh8(__m256 x) {
    const __m256d k1 = _mm256_set1_pd(1.5957691216057308), k3 = _mm256_set1_pd(1.5957691216057308 * 0.044715);
    __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    __m256d w0 = _mm256_mul_pd(x0, _mm256_fmadd_pd(_mm256_mul_pd(x0, x0), k3, k1));
    __m256d w1 = _mm256_mul_pd(x1, _mm256_fmadd_pd(_mm256_mul_pd(x1, x1), k3, k1));
    __m128 h0 = _mm256_cvtpd_ps(w0), h1 = _mm256_cvtpd_ps(w1);
    __m128 l0 = _mm256_cvtpd_ps(_mm256_sub_pd(w0, _mm256_cvtps_pd(h0)));
    __m128 l1 = _mm256_cvtpd_ps(_mm256_sub_pd(w1, _mm256_cvtps_pd(h1)));
    __m256 hi = _mm256_set_m128(h1, h0), lo = _mm256_set_m128(l1, l0), ahi = vabs(hi);
    lo = _mm256_and_ps(lo, _mm256_cmp_ps(ahi, SET(100.0f), _CMP_LT_OQ)); /* exp is 0 beyond; inf - inf */
    __m256 c = _mm256_xor_ps(_mm256_sub_ps(_mm256_setzero_ps(), lo), _mm256_and_ps(hi, SET(-0.0f)));
    __m256 e = _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_setzero_ps(), ahi)), _mm256_add_ps(SET(1.0f), c));
    __m256 s = _mm256_div_ps(SET(1.0f), _mm256_add_ps(SET(1.0f), e));
    s = _mm256_blendv_ps(_mm256_mul_ps(e, s), s, _mm256_cmp_ps(hi, _mm256_setzero_ps(), _CMP_GE_OQ));
    return _mm256_mul_ps(x, s);
}

AVX2_INLINE __m256 relu8(__m256 x) { return _mm256_max_ps(_mm256_setzero_ps(), x); /* NaN, -0 pass */ }

/* ================================================================ unary */

typedef void (*unary_span)(const float *x, float *y, int64_t n);

#define UNARY_SPAN(name, F)                                                          \
    AVX2_FN static void name(const float *x, float *y, int64_t n) {                 \
        int64_t i = 0;                                                               \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, F(_mm256_loadu_ps(x + i))); \
        if (i < n) {                                                                 \
            __m256i m = tail_mask(n - i);                                            \
            _mm256_maskstore_ps(y + i, m, F(_mm256_maskload_ps(x + i, m)));         \
        }                                                                            \
    }

UNARY_SPAN(span_relu, relu8)
UNARY_SPAN(span_sigmoid, sigmoid8)
UNARY_SPAN(span_tanh, tanh8)
UNARY_SPAN(span_exp, exp8)
UNARY_SPAN(span_erf, erf8)
UNARY_SPAN(span_gelu_erf, gelu_erf8)
UNARY_SPAN(span_gelu_tanh, gelu_tanh8)

typedef struct {
    unary_span fn;
    const float *x;
    float *y;
} unary_job;

static void unary_range(void *a, int64_t lo, int64_t hi) {
    const unary_job *j = a;
    j->fn(j->x + lo, j->y + lo, hi - lo);
}

static tb_status k_unary(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                         int n_out) {
    if (!have_avx2() || in[0].dtype != TB_F32) return run_ref(n, in, n_in, out, n_out);
    unary_job j = {NULL, in[0].data, out[0].data};
    int64_t grain = 1 << 14; /* elements per thread at least: transcendental ops */
    switch (n->op) {
    case TB_OP_RELU: j.fn = span_relu; grain = 1 << 16; break;
    case TB_OP_SIGMOID: j.fn = span_sigmoid; break;
    case TB_OP_TANH: j.fn = span_tanh; break;
    case TB_OP_EXP: j.fn = span_exp; break;
    case TB_OP_ERF: j.fn = span_erf; break;
    case TB_OP_GELU: j.fn = n->i[0] ? span_gelu_tanh : span_gelu_erf; break;
    default: return run_ref(n, in, n_in, out, n_out);
    }
    par_range(c, tb_view_numel(&in[0]), grain, 16, unary_range, &j);
    return TB_OK;
}

/* ---------------------------------------------------------------- Clip */

typedef struct {
    const float *x;
    float *y;
    float lo, hi;
} clip_job;

/* min(max(x, lo), hi) with the operands ordered so that NaN passes (MAXPS /
 * MINPS return the second operand then) and lo > hi gives hi, as numpy */
AVX2_FN static void clip_range(void *arg, int64_t lo, int64_t hi) {
    const clip_job *j = arg;
    __m256 vl = _mm256_set1_ps(j->lo), vh = _mm256_set1_ps(j->hi);
    const float *x = j->x;
    float *y = j->y;
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) _mm256_storeu_ps(y + i, _mm256_min_ps(vh, _mm256_max_ps(vl, _mm256_loadu_ps(x + i))));
    if (i < hi) {
        __m256i m = tail_mask(hi - i);
        _mm256_maskstore_ps(y + i, m, _mm256_min_ps(vh, _mm256_max_ps(vl, _mm256_maskload_ps(x + i, m))));
    }
}

static tb_status k_clip(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                        int n_out) {
    clip_job j = {in[0].data, out[0].data, -INFINITY, INFINITY};
    int ok = have_avx2() && in[0].dtype == TB_F32;
    for (int k = 1; k < n_in && ok; k++) {
        if (tb_view_numel(&in[k]) == 0) continue; /* absent */
        ok = in[k].dtype == TB_F32;
        if (ok) *(k == 1 ? &j.lo : &j.hi) = ((const float *)in[k].data)[0];
    }
    if (!ok) return run_ref(n, in, n_in, out, n_out);
    par_range(c, tb_view_numel(&in[0]), 1 << 16, 16, clip_range, &j);
    return TB_OK;
}

/* ================================================================ binary */

/* y[i] = a[i * sa] op b[i * sb], sa and sb 0 (broadcast) or 1 */
typedef void (*binary_span)(const float *a, int sa, const float *b, int sb, float *y, int64_t n);

#define BINARY_SPAN(name, VOP, SOP)                                                                      \
    AVX2_FN static void name(const float *a, int sa, const float *b, int sb, float *y, int64_t n) {     \
        int64_t i = 0;                                                                                   \
        if (sa && sb) {                                                                                  \
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, VOP(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i))); \
            if (i < n) {                                                                                 \
                __m256i m = tail_mask(n - i);                                                            \
                _mm256_maskstore_ps(y + i, m, VOP(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m))); \
            }                                                                                            \
        } else if (sa) {                                                                                 \
            __m256 vb = _mm256_set1_ps(*b);                                                              \
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, VOP(_mm256_loadu_ps(a + i), vb));        \
            if (i < n) {                                                                                 \
                __m256i m = tail_mask(n - i);                                                            \
                _mm256_maskstore_ps(y + i, m, VOP(_mm256_maskload_ps(a + i, m), vb));                   \
            }                                                                                            \
        } else if (sb) {                                                                                 \
            __m256 va = _mm256_set1_ps(*a);                                                              \
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, VOP(va, _mm256_loadu_ps(b + i)));        \
            if (i < n) {                                                                                 \
                __m256i m = tail_mask(n - i);                                                            \
                _mm256_maskstore_ps(y + i, m, VOP(va, _mm256_maskload_ps(b + i, m)));                   \
            }                                                                                            \
        } else {                                                                                         \
            float v = SOP(*a, *b);                                                                       \
            for (; i < n; i++) y[i] = v;                                                                 \
        }                                                                                                \
    }

#define S_ADD(x, y) ((x) + (y))
#define S_SUB(x, y) ((x) - (y))
#define S_MUL(x, y) ((x) * (y))
#define S_DIV(x, y) ((x) / (y))
BINARY_SPAN(span_add, _mm256_add_ps, S_ADD)
BINARY_SPAN(span_sub, _mm256_sub_ps, S_SUB)
BINARY_SPAN(span_mul, _mm256_mul_ps, S_MUL)
BINARY_SPAN(span_div, _mm256_div_ps, S_DIV)

/* The output as rows of `inner` elements: dims collapsed where both inputs
 * stay contiguous (or both broadcast) across them, each input's strides
 * over the remaining dims (0: broadcast). */
typedef struct {
    binary_span fn;
    const float *a, *b;
    float *y;
    int rank;               /* collapsed dims, the last one `inner` */
    int64_t dims[TB_MAX_RANK], sa[TB_MAX_RANK], sb[TB_MAX_RANK];
    int64_t inner;
} binary_job;

static void binary_range(void *arg, int64_t lo, int64_t hi) {
    const binary_job *j = arg;
    int64_t inner = j->inner, row = lo / inner, col = lo % inner;
    int r = j->rank, ia = j->sa[r - 1] != 0, ib = j->sb[r - 1] != 0;
    while (lo < hi) {
        int64_t len = inner - col < hi - lo ? inner - col : hi - lo;
        int64_t oa = 0, ob = 0, t = row;
        for (int d = r - 2; d >= 0; d--) {
            int64_t c = t % j->dims[d];
            t /= j->dims[d];
            oa += c * j->sa[d];
            ob += c * j->sb[d];
        }
        j->fn(j->a + oa + col * ia, ia, j->b + ob + col * ib, ib, j->y + lo, len);
        lo += len;
        row++;
        col = 0;
    }
}

static tb_status k_binary(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                          int n_out) {
    if (!have_avx2() || in[0].dtype != TB_F32 || in[1].dtype != TB_F32) return run_ref(n, in, n_in, out, n_out);
    binary_job j;
    memset(&j, 0, sizeof j);
    j.fn = n->op == TB_OP_NN_ADD ? span_add : n->op == TB_OP_SUB ? span_sub : n->op == TB_OP_MUL ? span_mul : span_div;
    j.a = in[0].data;
    j.b = in[1].data;
    j.y = out[0].data;
    int64_t total = tb_view_numel(&out[0]);
    if (total == 0) return TB_OK;
    /* strides of a and b over the output's dims, dims of 1 dropped */
    int64_t dims[TB_MAX_RANK], st[2][TB_MAX_RANK];
    int r = 0;
    int64_t s[2] = {1, 1};
    int64_t sd[2][TB_MAX_RANK];
    for (int k = 0; k < 2; k++) {
        int lead = out[0].rank - in[k].rank;
        for (int d = out[0].rank - 1; d >= 0; d--) {
            int64_t id = d - lead >= 0 ? in[k].dims[d - lead] : 1;
            sd[k][d] = id == 1 ? 0 : s[k];
            s[k] *= id;
        }
    }
    for (int d = 0; d < out[0].rank; d++) {
        if (out[0].dims[d] == 1) continue;
        if (r > 0) { /* merge into the previous dim when both inputs allow */
            int ok = 1;
            for (int k = 0; k < 2; k++)
                ok &= (st[k][r - 1] == 0 && sd[k][d] == 0) || (sd[k][d] != 0 && st[k][r - 1] == sd[k][d] * out[0].dims[d]);
            if (ok) {
                dims[r - 1] *= out[0].dims[d];
                st[0][r - 1] = sd[0][d];
                st[1][r - 1] = sd[1][d];
                continue;
            }
        }
        dims[r] = out[0].dims[d];
        st[0][r] = sd[0][d];
        st[1][r] = sd[1][d];
        r++;
    }
    if (r == 0) { dims[0] = 1; st[0][0] = st[1][0] = 0; r = 1; }
    j.rank = r;
    memcpy(j.dims, dims, sizeof dims);
    memcpy(j.sa, st[0], sizeof j.sa);
    memcpy(j.sb, st[1], sizeof j.sb);
    j.inner = dims[r - 1];
    par_range(c, total, 1 << 16, 16, binary_range, &j);
    return TB_OK;
}

/* ================================================================ row helpers */

/* sum of x[0, n) in double */
AVX2_FN static double row_sum(const float *x, int64_t n) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(s0, s1));
    double s = (t[0] + t[1]) + (t[2] + t[3]);
    for (; i < n; i++) s += x[i];
    return s;
}

/* sum of (x - m)^2 in double */
AVX2_FN static double row_sqdev(const float *x, int64_t n, double m) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), vm = _mm256_set1_pd(m);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vm);
        __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vm);
        s0 = _mm256_fmadd_pd(d0, d0, s0);
        s1 = _mm256_fmadd_pd(d1, d1, s1);
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(s0, s1));
    double s = (t[0] + t[1]) + (t[2] + t[3]);
    for (; i < n; i++) s += (x[i] - m) * (x[i] - m);
    return s;
}

/* max of x[0, n) (n >= 1), NaN when any is */
AVX2_FN static float row_max(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        m = _mm256_max_ps(m, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float t[8];
    _mm256_storeu_ps(t, m);
    float r = t[0];
    for (int k = 1; k < 8; k++) r = t[k] > r ? t[k] : r;
    int any_nan = _mm256_movemask_ps(nan) != 0;
    for (; i < n; i++) {
        any_nan |= x[i] != x[i];
        r = x[i] > r ? x[i] : r;
    }
    return any_nan ? NAN : r;
}

/* ================================================================ Softmax (last axis) */

typedef struct {
    const float *x;
    float *y;
    int64_t D;
} rows_job;

/* exp(x - m) for x <= m: x - m rounds (by up to 2^-24 |x - m|, which exp
 * turns into a relative error of that size); TwoSum recovers the rounding
 * and it enters as a factor 1 + err. */
AVX2_INLINE __m256 exp_diff8(__m256 x, __m256 m) {
    __m256 d = _mm256_sub_ps(x, m), bb = _mm256_sub_ps(d, x);
    __m256 err = _mm256_add_ps(_mm256_sub_ps(x, _mm256_sub_ps(d, bb)), _mm256_sub_ps(_mm256_sub_ps(_mm256_setzero_ps(), m), bb));
    err = _mm256_and_ps(err, _mm256_cmp_ps(d, SET(-100.0f), _CMP_GT_OQ)); /* exp(d) is 0 below; inf - inf */
    return _mm256_mul_ps(exp8(d), _mm256_add_ps(SET(1.0f), err));
}

AVX2_FN static void softmax_rows(void *arg, int64_t lo, int64_t hi) {
    const rows_job *j = arg;
    int64_t D = j->D;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->x + r * D;
        float *y = j->y + r * D;
        __m256 m = _mm256_set1_ps(row_max(x, D));
        __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
        int64_t i = 0;
        for (; i + 8 <= D; i += 8) {
            __m256 e = exp_diff8(_mm256_loadu_ps(x + i), m);
            _mm256_storeu_ps(y + i, e);
            s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
        if (i < D) {
            __m256i k = tail_mask(D - i);
            __m256 e = exp_diff8(_mm256_maskload_ps(x + i, k), m);
            e = _mm256_and_ps(e, _mm256_castsi256_ps(k));
            _mm256_maskstore_ps(y + i, k, e);
            s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
        double t[4];
        _mm256_storeu_pd(t, _mm256_add_pd(s0, s1));
        float inv = (float)(1.0 / ((t[0] + t[1]) + (t[2] + t[3])));
        __m256 vi = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= D; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vi));
        for (; i < D; i++) y[i] *= inv;
    }
}

static tb_status k_softmax(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                           int n_out) {
    const tb_view *x = &in[0];
    if (!have_avx2() || x->dtype != TB_F32 || n->i[0] != x->rank - 1) return run_ref(n, in, n_in, out, n_out);
    rows_job j = {x->data, out[0].data, x->dims[x->rank - 1]};
    if (j.D == 0) return TB_OK;
    int64_t rows = tb_view_numel(x) / j.D;
    par_range(c, rows, (1 << 13) / j.D + 1, 1, softmax_rows, &j);
    return TB_OK;
}

/* ================================================================ LayerNormalization */

typedef struct {
    const float *x, *scale, *bias;
    float *y;
    int64_t D;
    double eps;
} ln_job;

AVX2_FN static void layernorm_rows(void *arg, int64_t lo, int64_t hi) {
    const ln_job *j = arg;
    int64_t D = j->D;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->x + r * D;
        float *y = j->y + r * D;
        double mean = row_sum(x, D) / (double)D;
        double var = row_sqdev(x, D, mean) / (double)D;
        /* x - mean as (x - hi) - lo, mean = hi + lo: exact to a rounding of
         * the difference even when |mean| is large against the spread */
        float fm = (float)mean, fl = (float)(mean - fm), rs = (float)(1.0 / sqrt(var + j->eps));
        __m256 vm = _mm256_set1_ps(fm), vl = _mm256_set1_ps(fl), vr = _mm256_set1_ps(rs);
        int64_t i = 0;
        for (; i + 8 <= D; i += 8) {
            __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vl), vr);
            __m256 b = j->bias ? _mm256_loadu_ps(j->bias + i) : _mm256_setzero_ps();
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(t, _mm256_loadu_ps(j->scale + i), b));
        }
        for (; i < D; i++) y[i] = (x[i] - fm - fl) * rs * j->scale[i] + (j->bias ? j->bias[i] : 0.0f);
    }
}

static tb_status k_layernorm(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    const tb_view *x = &in[0];
    int axis = n->i[0];
    int64_t D = 1;
    for (int d = axis; d < x->rank; d++) D *= x->dims[d];
    int ok = have_avx2() && n_out == 1 && x->dtype == TB_F32 && in[1].dtype == TB_F32 && tb_view_numel(&in[1]) == D &&
             D > 0; /* mean / inv_std_dev outputs: the reference */
    if (n_in > 2) ok &= in[2].dtype == TB_F32 && tb_view_numel(&in[2]) == D;
    if (!ok) return run_ref(n, in, n_in, out, n_out);
    ln_job j = {x->data, in[1].data, n_in > 2 ? in[2].data : NULL, out[0].data, D, n->f[0]};
    par_range(c, tb_view_numel(x) / D, (1 << 13) / D + 1, 1, layernorm_rows, &j);
    return TB_OK;
}

/* ================================================================ BatchNormalization */

typedef struct {
    const float *x, *a, *b;
    float *y;
    int64_t C, S;
} bn_job;

AVX2_FN static void batchnorm_range(void *arg, int64_t lo, int64_t hi) {
    const bn_job *j = arg;
    int64_t S = j->S, plane = lo / S, col = lo % S;
    while (lo < hi) {
        int64_t len = S - col < hi - lo ? S - col : hi - lo, ch = plane % j->C;
        const float *x = j->x + lo;
        float *y = j->y + lo;
        __m256 va = _mm256_set1_ps(j->a[ch]), vb = _mm256_set1_ps(j->b[ch]);
        int64_t i = 0;
        for (; i + 8 <= len; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), va, vb));
        if (i < len) {
            __m256i m = tail_mask(len - i);
            _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(_mm256_maskload_ps(x + i, m), va, vb));
        }
        lo += len;
        plane++;
        col = 0;
    }
}

static tb_status k_batchnorm(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    const tb_view *x = &in[0];
    int ok = have_avx2() && x->dtype == TB_F32;
    for (int k = 1; k < 5; k++) ok &= in[k].dtype == TB_F32;
    int64_t C = x->dims[1], S = 1;
    for (int d = 2; d < x->rank; d++) S *= x->dims[d];
    if (!ok) return run_ref(n, in, n_in, out, n_out);
    if (C == 0 || S == 0 || x->dims[0] == 0) return TB_OK;
    float *ab = tb_cpu_nn_scratch(c, (size_t)C * 2 * sizeof(float));
    if (!ab) return tb_errorf(TB_ERR_OOM, "BatchNormalization: out of memory for %lld channels", (long long)C);
    const float *p[5];
    for (int k = 1; k < 5; k++) p[k] = in[k].data;
    for (int64_t ch = 0; ch < C; ch++) {
#define P(k) ((double)p[k][in[k].dims[0] == 1 ? 0 : ch])
        double a = P(1) / sqrt(P(4) + (double)n->f[0]);
        ab[ch] = (float)a;
        ab[C + ch] = (float)(P(2) - P(3) * a);
#undef P
    }
    bn_job j = {x->data, ab, ab + C, out[0].data, C, S};
    par_range(c, tb_view_numel(x), 1 << 16, 16, batchnorm_range, &j);
    return TB_OK;
}

/* ================================================================ reductions (trailing axes) */

typedef struct {
    const float *x;
    float *y;
    int64_t D;
    tb_op_kind op;
} red_job;

static void reduce_rows(void *arg, int64_t lo, int64_t hi) {
    const red_job *j = arg;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->x + r * j->D;
        if (j->op == TB_OP_REDUCE_MAX) j->y[r] = row_max(x, j->D);
        else if (j->op == TB_OP_REDUCE_SUM) j->y[r] = (float)row_sum(x, j->D);
        else j->y[r] = (float)(row_sum(x, j->D) / (double)j->D);
    }
}

static tb_status k_reduce(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                          int n_out) {
    const tb_view *x = &in[0];
    uint32_t m;
    if (!have_avx2() || x->dtype != TB_F32 || tb_nn_reduce_axes(n, in, n_in, &m) != TB_OK || m == 0)
        return run_ref(n, in, n_in, out, n_out);
    /* the reduced axes must be a trailing run [k, rank) */
    int k = x->rank;
    while (k > 0 && (m >> (k - 1) & 1)) k--;
    if (m != ((1u << x->rank) - 1) >> k << k) return run_ref(n, in, n_in, out, n_out);
    int64_t D = 1;
    for (int d = k; d < x->rank; d++) D *= x->dims[d];
    if (D == 0) return run_ref(n, in, n_in, out, n_out);
    red_job j = {x->data, out[0].data, D, n->op};
    par_range(c, tb_view_numel(x) / D, (1 << 14) / D + 1, 1, reduce_rows, &j);
    return TB_OK;
}

/* ================================================================ the table */

tb_cpu_nn_fn tb_cpu_nn_elem_kernel(tb_op_kind k) {
    switch (k) {
    case TB_OP_RELU: case TB_OP_SIGMOID: case TB_OP_TANH: case TB_OP_EXP: case TB_OP_ERF: case TB_OP_GELU:
        return k_unary;
    case TB_OP_CLIP: return k_clip;
    case TB_OP_NN_ADD: case TB_OP_SUB: case TB_OP_MUL: case TB_OP_DIV: return k_binary;
    case TB_OP_SOFTMAX: return k_softmax;
    case TB_OP_LAYERNORM: return k_layernorm;
    case TB_OP_BATCHNORM: return k_batchnorm;
    case TB_OP_REDUCE_MEAN: case TB_OP_REDUCE_SUM: case TB_OP_REDUCE_MAX: return k_reduce;
    default: return NULL;
    }
}
