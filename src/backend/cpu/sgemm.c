/*
 * sgemm.c — f32 GEMM for the general ops (nn.h): packed and cache-blocked
 * in the GotoBLAS way, with one register-blocked micro-kernel per ISA:
 *   AVX-512  12 x 32 (24 zmm accumulators, A broadcast from the packed panel)
 *   AVX2      6 x 16 (12 ymm accumulators)
 *   generic   4 x 8  (plain C, for CPUs without AVX2)
 * Loops, outer to inner: jc over N by NC, pc over K by KC (B block packed:
 * (KC, NR) micro-panels that stay in L1 while the kernel walks the rows),
 * ic over M by MC (A block packed: (MR, KC) micro-panels, the block in L2;
 * the AVX-512 kernel takes them as rows, [MR][KC] with any row stride, so a
 * row-major A is read in place and only a last panel of fewer than MR rows
 * is copied: a transposing pack cost as much as the products when N is
 * small, as in the 7x7 convs of ResNet, and the copy still a quarter),
 * then jr over NR and ir over MR. The threads of the pool take disjoint
 * ranges of N (or of M when N has too few tiles), each with its own packing
 * buffers (per-thread, freed at thread exit). The epilogue (bias, activation,
 * residual) runs on each C tile right after its last K block, while the tile
 * is still in L1. Prefetches: a pre-packed B (a weight, streamed from memory)
 * one panel ahead into L2, issued by the AVX-512 kernel a line per k step; C
 * and residual tiles at the start of each kernel call when the thread's C
 * block is over half of L2.
 */
#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>

#define T512 __attribute__((target("avx512f,avx512dq,avx2,fma")))
#define T256 __attribute__((target("avx2,fma")))
#define T512_INLINE static inline __attribute__((target("avx512f,avx512dq,avx2,fma"), always_inline))
#define T256_INLINE static inline __attribute__((target("avx2,fma"), always_inline))

/* ---------------------------------------------------------------- per-thread buffers */

typedef struct {
    float *p;
    size_t cap; /* floats */
} pack_buf;

static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;

static void pack_buf_free(void *p) {
    pack_buf *b = p;
    tb_free_aligned(b->p);
    free(b);
}

static void pack_key_create(void) { pthread_key_create(&pack_key, pack_buf_free); }

/* At least `floats` floats for this thread, kept for its next calls. */
static float *pack_get(size_t floats) {
    pthread_once(&pack_once, pack_key_create);
    pack_buf *b = pthread_getspecific(pack_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        TB_ASSERT(b && "out of memory for GEMM packing buffers");
        pthread_setspecific(pack_key, b);
    }
    if (b->cap < floats) {
        tb_free_aligned(b->p);
        b->p = tb_alloc_aligned(floats * sizeof(float), 64);
        TB_ASSERT(b->p && "out of memory for GEMM packing buffers");
        b->cap = floats;
    }
    return b->p;
}

/* ---------------------------------------------------------------- kernels */

/* C (mr, nr) = alpha * Apanel (mr, kc) Bpanel (kc, nr) + beta * C; beta 0
 * does not read C. Panels: A [k][MR], B [k][NR], zero-padded. pf: pfn
 * (<= kc) cache lines from pf to prefetch into L2 during the products (the
 * AVX-512 kernel; the others get none). */
typedef void (*micro_fn)(int64_t kc, const float *pa, int64_t ars, const float *pb, float *c, int64_t ldc, int mr,
                         int nr, float alpha, float beta, const char *pf, int64_t pfn, int pfc);
/* The epilogue over the tile (mr, nr) at (i0, j0) of C. */
typedef void (*epi_fn)(float *c, int64_t ldc, int64_t i0, int64_t j0, int mr, int nr, const tb_cpu_sgemm_epi *e);

/* micro_fn with the epilogue applied in registers (acts none, relu, clip, gelu erf) */
typedef void (*micro_epi_fn)(int64_t kc, const float *pa, int64_t ars, const float *pb, float *c, int64_t ldc, int mr,
                             int nr, float alpha, float beta, const char *pf, int64_t pfn, int pfc,
                             const tb_cpu_sgemm_epi *e, int64_t i0, int64_t j0);

typedef struct {
    const char *name;
    int mr, nr;
    int kc, mc, nc;
    micro_fn micro;
    epi_fn epi;
    micro_epi_fn micro_epi; /* NULL: micro, then epi */
} sgemm_isa;

/* ---- generic */

#define G_MR 4
#define G_NR 8

static void micro_generic(int64_t kc, const float *pa, int64_t ars, const float *pb, float *c, int64_t ldc, int mr,
                          int nr, float alpha, float beta, const char *pf, int64_t pfn, int pfc) {
    float acc[G_MR][G_NR] = {{0}};
    for (int64_t k = 0; k < kc; k++, pa += G_MR, pb += G_NR)
        for (int i = 0; i < G_MR; i++)
            for (int j = 0; j < G_NR; j++) acc[i][j] += pa[i] * pb[j];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float *o = &c[i * ldc + j];
            *o = alpha * acc[i][j] + (beta != 0.0f ? beta * *o : 0.0f);
        }
}

static inline float bias_at(const tb_cpu_sgemm_epi *e, int64_t i, int64_t j) {
    float s = e->bias_scale != 0.0f ? e->bias_scale : 1.0f;
    return s * e->bias[i * e->bias_rs + j * e->bias_cs];
}

static void epi_generic(float *c, int64_t ldc, int64_t i0, int64_t j0, int mr, int nr, const tb_cpu_sgemm_epi *e) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float *o = &c[i * ldc + j];
            float v = *o;
            if (e->bias) v += bias_at(e, i0 + i, j0 + j);
            float r = e->res ? e->res[(i0 + i) * e->ld_res + j0 + j] : 0.0f;
            if (e->act_after_res) v += r;
            v = (float)tb_nn_act_apply((tb_nn_act)e->act, v, e->p0, e->p1);
            if (!e->act_after_res) v += r;
            *o = v;
        }
}

/* ---- AVX2 */

#define A2_MR 6
#define A2_NR 16

static T256 void micro_avx2(int64_t kc, const float *pa, int64_t ars, const float *pb, float *c, int64_t ldc, int mr,
                            int nr, float alpha, float beta, const char *pf, int64_t pfn, int pfc) {
    __m256 acc0[A2_MR], acc1[A2_MR];
#pragma GCC unroll 6
    for (int i = 0; i < A2_MR; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(pb), b1 = _mm256_load_ps(pb + 8);
#pragma GCC unroll 6
        for (int i = 0; i < A2_MR; i++) {
            __m256 a = _mm256_broadcast_ss(pa + i);
            acc0[i] = _mm256_fmadd_ps(a, b0, acc0[i]);
            acc1[i] = _mm256_fmadd_ps(a, b1, acc1[i]);
        }
        pa += A2_MR;
        pb += A2_NR;
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    if (nr == A2_NR) {
#pragma GCC unroll 6
        for (int i = 0; i < A2_MR; i++) {
            if (i >= mr) break;
            float *o = c + i * ldc;
            __m256 r0 = _mm256_mul_ps(va, acc0[i]), r1 = _mm256_mul_ps(va, acc1[i]);
            if (beta != 0.0f) {
                r0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(o), r0);
                r1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(o + 8), r1);
            }
            _mm256_storeu_ps(o, r0);
            _mm256_storeu_ps(o + 8, r1);
        }
        return;
    }
    float t[A2_MR][A2_NR] __attribute__((aligned(32)));
#pragma GCC unroll 6
    for (int i = 0; i < A2_MR; i++) {
        _mm256_store_ps(t[i], _mm256_mul_ps(va, acc0[i]));
        _mm256_store_ps(t[i] + 8, _mm256_mul_ps(va, acc1[i]));
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = t[i][j] + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0f);
}

/* exp for x in any range (clamped to where f32 exp is finite and normal). */
T256_INLINE __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.37626f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* n in [-126, 127]: 2^n by the exponent field; 2^127 overflows to the
     * largest finite product through two steps */
    __m256i e = _mm256_cvtps_epi32(n);
    __m256i e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

T256_INLINE __m256 tanh256(__m256 x) {
    __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    __m256 t = exp256(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    __m256 big = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), t), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
    __m256 z = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-5.70498872745E-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954E-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531E-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036E-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422E-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), ax, ax);
    __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
    return _mm256_or_ps(r, sign);
}

/* erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7) */
T256_INLINE __m256 erf256(__m256 x) {
    __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(ax, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.0f)));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    p = _mm256_mul_ps(p, t);
    __m256 e = exp256(_mm256_mul_ps(_mm256_mul_ps(ax, ax), _mm256_set1_ps(-1.0f)));
    __m256 r = _mm256_fnmadd_ps(p, e, _mm256_set1_ps(1.0f));
    return _mm256_or_ps(r, sign);
}

T256_INLINE __m256 act256(__m256 v, int act, float p0, float p1) {
    switch (act) {
    case TB_NN_ACT_RELU: return _mm256_max_ps(v, _mm256_setzero_ps());
    case TB_NN_ACT_CLIP: return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(p0)), _mm256_set1_ps(p1));
    case TB_NN_ACT_SIGMOID:
        return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), v))));
    case TB_NN_ACT_TANH: return tanh256(v);
    case TB_NN_ACT_GELU_ERF:
        return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v),
                             _mm256_add_ps(_mm256_set1_ps(1.0f), erf256(_mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f)))));
    case TB_NN_ACT_GELU_TANH: {
        __m256 u = _mm256_mul_ps(_mm256_mul_ps(v, v), _mm256_set1_ps(0.044715f));
        u = _mm256_mul_ps(_mm256_fmadd_ps(u, v, v), _mm256_set1_ps(0.79788456080286535588f));
        return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh256(u)));
    }
    default: return v;
    }
}

/* Masked load/store of the first n (< 8) lanes. */
T256_INLINE __m256i mask256(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static T256 void epi_avx2(float *c, int64_t ldc, int64_t i0, int64_t j0, int mr, int nr, const tb_cpu_sgemm_epi *e) {
    __m256 scale = _mm256_set1_ps(e->bias_scale != 0.0f ? e->bias_scale : 1.0f);
    for (int i = 0; i < mr; i++) {
        float *row = c + i * ldc;
        const float *brow = e->bias ? e->bias + (i0 + i) * e->bias_rs : NULL;
        const float *rrow = e->res ? e->res + (i0 + i) * e->ld_res + j0 : NULL;
        for (int j = 0; j < nr; j += 8) {
            __m256i m = mask256(nr - j);
            __m256 v = _mm256_maskload_ps(row + j, m);
            if (brow) {
                __m256 b = e->bias_cs ? _mm256_maskload_ps(brow + j0 + j, m) : _mm256_set1_ps(brow[0]);
                v = _mm256_fmadd_ps(b, scale, v);
            }
            __m256 r = rrow ? _mm256_maskload_ps(rrow + j, m) : _mm256_setzero_ps();
            if (e->act_after_res) v = _mm256_add_ps(v, r);
            v = act256(v, e->act, e->p0, e->p1);
            if (!e->act_after_res) v = _mm256_add_ps(v, r);
            _mm256_maskstore_ps(row + j, m, v);
        }
    }
}

/* ---- AVX-512 */

#define A5_MR 12
#define A5_NR 32
#define A5_KC 256 /* isa_avx512's kc */
#define SMALL_M 4  /* rows up to which a pre-packed B takes the GEMV-style kernel */

/* GELU, erf form, by Abramowitz and Stegun 7.1.28: erf(z) = 1 - 1 / P(z)^16,
 * P(z) = 1 + a1 z + ... + a6 z^6 for z >= 0 (truncation below 3e-7). No exp
 * and one reciprocal: ~19 instructions a vector against ~33 for 7.1.26 with
 * its exp, which made the FFN's first matmul (its GELU in the epilogue) ~5%
 * slower than the second. In f32 the 16th power multiplies P's rounding by
 * 16: the erf it gives is within 1.7e-6 of libm's over [-8, 8], so GELU(x) is
 * within 1e-6 |x| of the exact one (test_nn_conv sweeps x through the
 * epilogue against libm's erf and asserts 1.25e-6 |x|). z is clamped to 6 (erf(6) is 1 in f32) so P^16 stays finite; a NaN
 * x stays NaN through the product by x. */
T512_INLINE __m512 gelu512(__m512 v) {
    __m512 z = _mm512_min_ps(_mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(0.70710678118654752f)), _mm512_set1_ps(6.0f));
    __m512 p = _mm512_set1_ps(0.0000430638f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.0002765672f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.0001520143f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.0092705272f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.0422820123f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.0705230784f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.0f));
    p = _mm512_mul_ps(p, p);
    p = _mm512_mul_ps(p, p);
    p = _mm512_mul_ps(p, p);
    p = _mm512_mul_ps(p, p);
    /* r = 1 / P^16 = erfc(|z|), rcp14 and one Newton step (relative ~1e-8) */
    __m512 r = _mm512_rcp14_ps(p);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(p, r, _mm512_set1_ps(2.0f)));
    /* 0.5 x (1 + erf): 0.5 x (2 - r) for x >= 0, 0.5 x r below */
    __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
    r = _mm512_mask_sub_ps(r, pos, _mm512_set1_ps(2.0f), r);
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), r);
}

/* The register tile computes R (4, 8 or 12) rows by V (1 or 2) vectors of
 * 16 columns: a tile's last row panel (M mod 12 rows, as the 4 extra rows of
 * M = 64, 128 or 256) or last column panel (N mod 32 columns: Winograd's
 * 196 tiles of a 56x56 map end in 4) runs a smaller instance instead of the
 * whole 12 x 32 over zero padding. */
T512_INLINE void micro512_t(int64_t kc, const float *pa, int64_t ars, const float *pb, float *c, int64_t ldc, int mr,
                            int nr, float alpha, float beta, const char *pf, int64_t pfn, int pfc,
                            const tb_cpu_sgemm_epi *e, int64_t i0, int64_t j0, const int R, const int V) {
    __m512 acc0[A5_MR], acc1[A5_MR];
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
    /* A is a row panel: MR rows of kc, ars apart (a packed copy, or A itself);
     * three row pointers with offsets 0, ars, 2 ars, 3 ars cover the 12 rows */
    const float *r0 = pa, *r4 = R > 4 ? pa + 4 * ars : pa, *r8 = R > 8 ? pa + 8 * ars : pa;
    /* the C tile is read (beta 1: a K block after the first) or written
     * (beta 0: its lines are fetched for ownership) after the K loop; when C
     * is larger than L2, as the (1024, 3072) output of BERT-base's FFN at
     * batch 8, those lines come from L3 or memory and the kernel stalled on
     * them at the end of every call: fetched now, they arrive during the
     * products (one thread's BERT-base batch 8 went from 1180-1213 to
     * 1061-1065 ms of CPU time, interleaved runs). pfc: the caller's C is
     * that large; a C that stays in cache (the small products of Winograd
     * and of sdpa) is not fetched again */
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        if (i >= mr || !pfc) break;
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        if (V > 1) _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);
        /* and the residual the register epilogue adds (the same stall: at
         * batch 8 the (1024, 768) residual of BERT-base is out of L2) */
        if (e && e->res) {
            const float *rr = e->res + (i0 + i) * e->ld_res + j0;
            _mm_prefetch((const char *)rr, _MM_HINT_T0);
            if (V > 1) _mm_prefetch((const char *)(rr + 16), _MM_HINT_T0);
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(pb), b1 = V > 1 ? _mm512_load_ps(pb + 16) : _mm512_setzero_ps();
        _mm_prefetch((const char *)(pb + 8 * A5_NR), _MM_HINT_T0);
        if (k < pfn) _mm_prefetch(pf + k * 64, _MM_HINT_T1); /* the caller's next B panel, a line a step */
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            const float *r = i < 4 ? r0 : i < 8 ? r4 : r8;
            __m512 a = _mm512_set1_ps(r[(i & 3) * ars + k]);
            acc0[i] = _mm512_fmadd_ps(a, b0, acc0[i]);
            if (V > 1) acc1[i] = _mm512_fmadd_ps(a, b1, acc1[i]);
        }
        pb += A5_NR;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = V < 2 || nr <= 16 ? (__mmask16)0 : nr >= 32 ? (__mmask16)0xffff : (__mmask16)((1u << (nr - 16)) - 1);
    /* the register epilogue: bias, relu / clip / gelu (erf) / none, residual */
    __m512 bc0 = _mm512_setzero_ps(), bc1 = _mm512_setzero_ps(), lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    float bscale = 1.0f;
    if (e) {
        bscale = e->bias_scale != 0.0f ? e->bias_scale : 1.0f;
        if (e->bias && e->bias_cs && !e->bias_rs) {
            const float *bp = e->bias + j0;
            bc0 = _mm512_mul_ps(_mm512_set1_ps(bscale), _mm512_maskz_loadu_ps(m0, bp));
            bc1 = _mm512_mul_ps(_mm512_set1_ps(bscale), _mm512_maskz_loadu_ps(m1, bp + 16));
        }
        lo = _mm512_set1_ps(e->act == TB_NN_ACT_CLIP ? e->p0 : 0.0f);
        hi = _mm512_set1_ps(e->act == TB_NN_ACT_CLIP ? e->p1 : INFINITY);
    }
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        if (i >= mr) break;
        float *o = c + i * ldc;
        __m512 r0v = _mm512_mul_ps(va, acc0[i]), r1v = _mm512_mul_ps(va, acc1[i]);
        if (beta != 0.0f) {
            r0v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, o), r0v);
            if (V > 1) r1v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, o + 16), r1v);
        }
        if (e) {
            if (e->bias) {
                if (e->bias_cs && e->bias_rs) { /* a whole matrix */
                    const float *bp = e->bias + (i0 + i) * e->bias_rs + j0;
                    r0v = _mm512_fmadd_ps(_mm512_set1_ps(bscale), _mm512_maskz_loadu_ps(m0, bp), r0v);
                    r1v = _mm512_fmadd_ps(_mm512_set1_ps(bscale), _mm512_maskz_loadu_ps(m1, bp + 16), r1v);
                } else if (e->bias_cs) {
                    r0v = _mm512_add_ps(r0v, bc0);
                    r1v = _mm512_add_ps(r1v, bc1);
                } else {
                    __m512 b = _mm512_set1_ps(bscale * e->bias[(i0 + i) * e->bias_rs]);
                    r0v = _mm512_add_ps(r0v, b);
                    r1v = _mm512_add_ps(r1v, b);
                }
            }
            const float *rr = e->res ? e->res + (i0 + i) * e->ld_res + j0 : NULL;
            __m512 q0 = rr ? _mm512_maskz_loadu_ps(m0, rr) : _mm512_setzero_ps();
            __m512 q1 = rr && V > 1 ? _mm512_maskz_loadu_ps(m1, rr + 16) : _mm512_setzero_ps();
            if (e->act_after_res) {
                r0v = _mm512_add_ps(r0v, q0);
                r1v = _mm512_add_ps(r1v, q1);
            }
            if (e->act == TB_NN_ACT_GELU_ERF) { /* BERT's first FFN matmul: no pass over the stored tile */
                r0v = gelu512(r0v);
                if (V > 1) r1v = gelu512(r1v);
            } else if (e->act != TB_NN_ACT_NONE) {
                r0v = _mm512_min_ps(_mm512_max_ps(r0v, lo), hi);
                r1v = _mm512_min_ps(_mm512_max_ps(r1v, lo), hi);
            }
            if (!e->act_after_res) {
                r0v = _mm512_add_ps(r0v, q0);
                r1v = _mm512_add_ps(r1v, q1);
            }
        }
        _mm512_mask_storeu_ps(o, m0, r0v);
        if (V > 1) _mm512_mask_storeu_ps(o + 16, m1, r1v);
    }
}

/* the instance for a tile of mr rows and nr columns (rows rounded up to 4) */
#define MICRO512_PICK(E, I0, J0)                                                                                     \
    switch (((mr + 3) >> 2) * 2 + (nr > 16)) {                                                                       \
    case 2: micro512_t(kc, pa, ars, pb, c, ldc, mr, nr, alpha, beta, pf, pfn, pfc, E, I0, J0, 4, 1); break;                        \
    case 3: micro512_t(kc, pa, ars, pb, c, ldc, mr, nr, alpha, beta, pf, pfn, pfc, E, I0, J0, 4, 2); break;                        \
    case 4: micro512_t(kc, pa, ars, pb, c, ldc, mr, nr, alpha, beta, pf, pfn, pfc, E, I0, J0, 8, 1); break;                        \
    case 5: micro512_t(kc, pa, ars, pb, c, ldc, mr, nr, alpha, beta, pf, pfn, pfc, E, I0, J0, 8, 2); break;                        \
    case 6: micro512_t(kc, pa, ars, pb, c, ldc, mr, nr, alpha, beta, pf, pfn, pfc, E, I0, J0, 12, 1); break;                       \
    default: micro512_t(kc, pa, ars, pb, c, ldc, mr, nr, alpha, beta, pf, pfn, pfc, E, I0, J0, 12, 2); break;                      \
    }

static T512 void micro_avx512(int64_t kc, const float *pa, int64_t ars, const float *pb, float *c, int64_t ldc, int mr,
                              int nr, float alpha, float beta, const char *pf, int64_t pfn, int pfc) {
    MICRO512_PICK(NULL, 0, 0)
}

/* the kernel with the epilogue in registers: act none, relu, clip or gelu (erf) */
static T512 void micro_avx512_epi(int64_t kc, const float *pa, int64_t ars, const float *pb, float *c, int64_t ldc,
                                  int mr, int nr, float alpha, float beta, const char *pf, int64_t pfn, int pfc,
                                  const tb_cpu_sgemm_epi *e, int64_t i0, int64_t j0) {
    MICRO512_PICK(e, i0, j0)
}

T512_INLINE __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.37626f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

T512_INLINE __m512 tanh512(__m512 x) {
    __m512 ax = _mm512_abs_ps(x);
    __m512 t = exp512(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    __m512 big = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), t), _mm512_add_ps(_mm512_set1_ps(1.0f), t));
    __m512 z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-5.70498872745E-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954E-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531E-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036E-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422E-1f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), ax, ax);
    __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), big, small);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r),
                                               _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
}

T512_INLINE __m512 act512(__m512 v, int act, float p0, float p1) {
    switch (act) {
    case TB_NN_ACT_RELU: return _mm512_max_ps(v, _mm512_setzero_ps());
    case TB_NN_ACT_CLIP: return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(p0)), _mm512_set1_ps(p1));
    case TB_NN_ACT_SIGMOID:
        return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), v))));
    case TB_NN_ACT_TANH: return tanh512(v);
    case TB_NN_ACT_GELU_ERF: return gelu512(v);
    case TB_NN_ACT_GELU_TANH: {
        __m512 u = _mm512_mul_ps(_mm512_mul_ps(v, v), _mm512_set1_ps(0.044715f));
        u = _mm512_mul_ps(_mm512_fmadd_ps(u, v, v), _mm512_set1_ps(0.79788456080286535588f));
        return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), _mm512_add_ps(_mm512_set1_ps(1.0f), tanh512(u)));
    }
    default: return v;
    }
}

/* the epilogue with act a compile-time constant in each instance */
T512_INLINE void epi512_t(float *c, int64_t ldc, int64_t i0, int64_t j0, int mr, int nr, const tb_cpu_sgemm_epi *e,
                          const int act) {
    __m512 scale = _mm512_set1_ps(e->bias_scale != 0.0f ? e->bias_scale : 1.0f);
    int after = e->act_after_res;
    for (int i = 0; i < mr; i++) {
        float *row = c + i * ldc;
        const float *brow = e->bias ? e->bias + (i0 + i) * e->bias_rs : NULL;
        const float *rrow = e->res ? e->res + (i0 + i) * e->ld_res + j0 : NULL;
        __m512 bconst = brow && !e->bias_cs ? _mm512_mul_ps(_mm512_set1_ps(brow[0]), scale) : _mm512_setzero_ps();
        for (int j = 0; j < nr; j += 16) {
            __mmask16 m = nr - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nr - j)) - 1);
            __m512 v = _mm512_maskz_loadu_ps(m, row + j);
            if (brow)
                v = e->bias_cs ? _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, brow + j0 + j), scale, v)
                               : _mm512_add_ps(v, bconst);
            if (rrow && after) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rrow + j));
            v = act512(v, act, e->p0, e->p1);
            if (rrow && !after) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rrow + j));
            _mm512_mask_storeu_ps(row + j, m, v);
        }
    }
}

static T512 void epi_avx512(float *c, int64_t ldc, int64_t i0, int64_t j0, int mr, int nr,
                            const tb_cpu_sgemm_epi *e) {
    switch (e->act) {
    case TB_NN_ACT_NONE: epi512_t(c, ldc, i0, j0, mr, nr, e, TB_NN_ACT_NONE); break;
    case TB_NN_ACT_RELU: epi512_t(c, ldc, i0, j0, mr, nr, e, TB_NN_ACT_RELU); break;
    case TB_NN_ACT_CLIP: epi512_t(c, ldc, i0, j0, mr, nr, e, TB_NN_ACT_CLIP); break;
    case TB_NN_ACT_GELU_ERF: epi512_t(c, ldc, i0, j0, mr, nr, e, TB_NN_ACT_GELU_ERF); break;
    default: epi512_t(c, ldc, i0, j0, mr, nr, e, e->act); break;
    }
}

/* ---------------------------------------------------------------- ISA choice */

static const sgemm_isa isa_generic = {"generic", G_MR, G_NR, 256, 64, 1024, micro_generic, epi_generic, NULL};
static const sgemm_isa isa_avx2 = {"avx2", A2_MR, A2_NR, 256, 72, 2048, micro_avx2, epi_avx2, NULL};
static const sgemm_isa isa_avx512 = {"avx512", A5_MR, A5_NR, A5_KC, 144, 512, micro_avx512, epi_avx512,
                                      micro_avx512_epi};
/* the AVX-512 kernel reads A as row panels [MR][kc], the others as [kc][MR] */
#define ROW_PANELS(isa) ((isa) == &isa_avx512)

static const sgemm_isa *isa_get(void) {
    uint32_t f = tb_cpu_features();
    if ((f & (TB_CPU_AVX2 | TB_CPU_FMA)) != (TB_CPU_AVX2 | TB_CPU_FMA)) return &isa_generic;
    return f & TB_CPU_AVX512F ? &isa_avx512 : &isa_avx2;
}

/* ---------------------------------------------------------------- packing */

/* AVX-512 packing of a (N, K) B by gathers: one (strided) column of 16 rows
 * per instruction. The stride must fit the int32 indices (gather_ok). */
static T512 void pack_bt_cols512(const float *B, int64_t ldb, int nr, int kc, float *d) {
    __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32((int)ldb));
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1);
    const float *B1 = B + 16 * ldb;
    for (int k = 0; k < kc; k++) {
        __m512 v0 = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m0, idx, B + k, 4);
        __m512 v1 = m1 ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m1, idx, B1 + k, 4) : _mm512_setzero_ps();
        _mm512_store_ps(d + (size_t)k * A5_NR, v0);
        _mm512_store_ps(d + (size_t)k * A5_NR + 16, v1);
    }
}

static int gather_ok(int64_t ld) { return ld > 0 && ld <= (int64_t)(INT32_MAX / 4 / 16); }

/* A block rows [i0, i0 + mc) x k [k0, k0 + kc) into (MR, kc) panels, [k][MR]
 * or with `rows` [MR][kc]; rows past mc zero. */
static void pack_a(int ta, const float *A, int64_t lda, int64_t i0, int mc, int64_t k0, int kc, int MR, int rows,
                   float *dst) {
    for (int p = 0; p < mc; p += MR) {
        int mr = mc - p < MR ? mc - p : MR;
        float *d = dst + (size_t)p * kc;
        if (rows) { /* [MR][kc]: rows of A copied, or gathered when A is stored (K, M) */
            for (int r = 0; r < mr; r++) {
                float *dr = d + (size_t)r * kc;
                if (!ta) memcpy(dr, A + (i0 + p + r) * lda + k0, sizeof(float) * (size_t)kc);
                else
                    for (int k = 0; k < kc; k++) dr[k] = A[(k0 + k) * lda + i0 + p + r];
            }
            if (mr < MR) memset(d + (size_t)mr * kc, 0, sizeof(float) * (size_t)(MR - mr) * (size_t)kc);
        } else if (ta) {
            for (int k = 0; k < kc; k++) {
                const float *s = A + (k0 + k) * lda + i0 + p;
                float *dk = d + (size_t)k * MR;
                int r = 0;
                for (; r < mr; r++) dk[r] = s[r];
                for (; r < MR; r++) dk[r] = 0.0f;
            }
        } else {
            for (int r = 0; r < mr; r++) {
                const float *s = A + (i0 + p + r) * lda + k0;
                for (int k = 0; k < kc; k++) d[(size_t)k * MR + r] = s[k];
            }
            for (int r = mr; r < MR; r++)
                for (int k = 0; k < kc; k++) d[(size_t)k * MR + r] = 0.0f;
        }
    }
}

/* B block k [k0, k0 + kc) x columns [j0, j0 + nc) into (kc, NR) panels
 * [k][NR], columns past nc zero. */
static void pack_b(int tb, const float *B, int64_t ldb, int64_t k0, int kc, int64_t j0, int nc, int NR, float *dst) {
    for (int q = 0; q < nc; q += NR) {
        int nr = nc - q < NR ? nc - q : NR;
        float *d = dst + (size_t)q * kc;
        if (!tb) {
            for (int k = 0; k < kc; k++) {
                const float *s = B + (k0 + k) * ldb + j0 + q;
                float *dk = d + (size_t)k * NR;
                if (nr == NR) {
                    memcpy(dk, s, sizeof(float) * (size_t)NR);
                } else {
                    int j = 0;
                    for (; j < nr; j++) dk[j] = s[j];
                    for (; j < NR; j++) dk[j] = 0.0f;
                }
            }
        } else if (NR == A5_NR && gather_ok(ldb) && isa_get() == &isa_avx512) {
            pack_bt_cols512(B + (j0 + q) * ldb + k0, ldb, nr, kc, d);
        } else {
            /* (N, K) storage: 8 columns at a time, reading rows of B */
            int j = 0;
            for (; j + 8 <= nr; j += 8) {
                const float *s = B + (j0 + q + j) * ldb + k0;
                for (int k = 0; k < kc; k++) {
                    float *dk = d + (size_t)k * NR + j;
                    for (int u = 0; u < 8; u++) dk[u] = s[u * ldb + k];
                }
            }
            for (; j < nr; j++) {
                const float *s = B + (j0 + q + j) * ldb + k0;
                for (int k = 0; k < kc; k++) d[(size_t)k * NR + j] = s[k];
            }
            for (; j < NR; j++)
                for (int k = 0; k < kc; k++) d[(size_t)k * NR + j] = 0.0f;
        }
    }
}

/* ---------------------------------------------------------------- driver */

typedef struct {
    const sgemm_isa *isa;
    int ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A, *B;
    int64_t lda, ldb, ldc;
    float *C;
    const tb_cpu_sgemm_epi *epi;
    int split_n;            /* threads take tiles of N (else of M) */
    int64_t tiles;          /* of the split dim */
    const float *Bp;        /* B pre-packed (tb_cpu_sgemm_pack_b), else NULL */
    int64_t npad;           /* its row length: N rounded up to NR */
} sgemm_job;

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Whether MR rows of A, lda floats apart, read in place by the kernel (a
 * line of each row every 16 k steps), fall on so few of L1's 64 sets that
 * they evict each other: a stride of a multiple of 4 KB (lda 1024, 2048,
 * 3072: BERT-base's second FFN matmul reads its (T, 3072) input) puts all 12
 * rows in one set of an 8-way L1. Those A panels are packed instead (a copy
 * per K block, reused across the block's column panels): on a 32 KB L1 that
 * product's twelve layers went from 408-435 to 324-349 ms at batch 8 and
 * from 49-53 to 40-42 ms at batch 1 (2 threads, docs/PERFORMANCE.md).
 * Only where the thread's columns span 8 panels or more: a copy of A made
 * for fewer is not paid back (the products of a conv on a 7x7 map, whose A
 * is the weights and N the 49 pixels, lost 20-50% with it). */
static int rows_alias(int64_t lda, int mr) {
    int cnt[64] = {0}, worst = 0;
    for (int r = 0; r < mr; r++) {
        int set = (int)(((uint64_t)r * (uint64_t)lda / 16) & 63);
        if (++cnt[set] > worst) worst = cnt[set];
    }
    return worst > 4;
}

/* C rows [m0, m1) x columns [n0, n1), one thread. */
static void sgemm_block(const sgemm_job *j, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const sgemm_isa *s = j->isa;
    int64_t K = j->K;
    if (K == 0) { /* no products: beta * C, then the epilogue */
        for (int64_t i = m0; i < m1; i++)
            for (int64_t c = n0; c < n1; c++) {
                float *o = &j->C[i * j->ldc + c];
                *o = j->beta != 0.0f ? j->beta * *o : 0.0f;
            }
        if (j->epi)
            for (int64_t i = m0; i < m1; i += s->mr)
                for (int64_t c = n0; c < n1; c += s->nr)
                    s->epi(j->C + i * j->ldc + c, j->ldc, i, c, (int)(m1 - i < s->mr ? m1 - i : s->mr),
                           (int)(n1 - c < s->nr ? n1 - c : s->nr), j->epi);
        return;
    }
    int64_t nkb = (K + s->kc - 1) / s->kc;
    int kcb = (int)((K + nkb - 1) / nkb);
    int mcb = (int)(m1 - m0 < s->mc ? round_up(m1 - m0, s->mr) : s->mc);
    int ncb = (int)(n1 - n0 < s->nc ? round_up(n1 - n0, s->nr) : s->nc);
    int reg_epi = s->micro_epi && j->epi &&
                  (j->epi->act == TB_NN_ACT_NONE || j->epi->act == TB_NN_ACT_RELU || j->epi->act == TB_NN_ACT_CLIP ||
                   j->epi->act == TB_NN_ACT_GELU_ERF);
    int direct_a = ROW_PANELS(s) && !j->ta && !(n1 - n0 >= 8 * s->nr && rows_alias(j->lda, s->mr));
    /* this thread's C block is larger than half of L2: the kernel prefetches its tiles */
    int pfc = (double)(m1 - m0) * (double)(n1 - n0) * sizeof(float) > 512.0 * 1024;
    /* a pre-packed B needs no B buffer: its blocks are read in place */
    float *pbuf = pack_get((size_t)kcb * (j->Bp ? 0 : ncb) + (size_t)kcb * mcb);
    float *pa = pbuf + (size_t)kcb * (j->Bp ? 0 : ncb), *pb = pbuf;
    for (int64_t jc = n0; jc < n1; jc += ncb) {
        int nc = (int)(n1 - jc < ncb ? n1 - jc : ncb);
        for (int64_t pc = 0; pc < K; pc += kcb) {
            int kc = (int)(K - pc < kcb ? K - pc : kcb);
            float beta = pc == 0 ? j->beta : 1.0f;
            int last = pc + kc >= K;
            if (j->Bp) pb = (float *)j->Bp + pc * j->npad + jc * kc;
            else pack_b(j->tb, j->B, j->ldb, pc, kc, jc, nc, s->nr, pb);
            for (int64_t ic = m0; ic < m1; ic += mcb) {
                int mc = (int)(m1 - ic < mcb ? m1 - ic : mcb);
                /* row panels of a row-major A are read in place; only a
                 * last panel of fewer than MR rows is copied (zero rows) */
                int full = direct_a ? mc / s->mr * s->mr : 0;
                if (mc > full)
                    pack_a(j->ta, j->A, j->lda, ic + full, mc - full, pc, kc, s->mr, ROW_PANELS(s), pa + (size_t)full * kc);
                for (int jr = 0; jr < nc; jr += s->nr) {
                    int nr = nc - jr < s->nr ? nc - jr : s->nr;
                    /* a pre-packed B comes from memory (a model's weights do
                     * not stay in cache, and one core's DRAM bandwidth is
                     * below what the kernel reads): the next panel is
                     * prefetched into L2, a share per row panel, so the
                     * kernel does not stall on its first pass over it */
                    const char *nxt = NULL;
                    int64_t lines = 0, per = 0;
                    if (j->Bp && ic == m0) {
                        if (jr + s->nr < nc) nxt = (const char *)(pb + (size_t)(jr + s->nr) * kc);
                        else if (pc + kc < K) nxt = (const char *)(j->Bp + (pc + kc) * j->npad + jc * kcb);
                        else if (jc + nc < n1) nxt = (const char *)(j->Bp + (jc + nc) * kcb);
                        lines = (int64_t)kc * s->nr * (int64_t)sizeof(float) / 64;
                        int64_t nir = (mc + s->mr - 1) / s->mr;
                        per = (lines + nir - 1) / nir;
                    }
                    for (int ir = 0; ir < mc; ir += s->mr) {
                        int mr = mc - ir < s->mr ? mc - ir : s->mr;
                        const char *pf = NULL;
                        int64_t pfn = 0;
                        if (nxt) {
                            int64_t l0 = ir / s->mr * per, l1 = l0 + per < lines ? l0 + per : lines;
                            /* the AVX-512 kernel takes its share one line per
                             * k step, spread over its products: issued here
                             * as a burst of ~50 misses they waited on the
                             * core's miss buffers (one thread's BERT-base
                             * batch 1 at 155-165 ms of CPU time against
                             * 163-172 ms with the burst, interleaved) */
                            if (s == &isa_avx512) {
                                pf = nxt + l0 * 64;
                                pfn = l1 > l0 ? l1 - l0 : 0;
                                if (pfn > kc) pfn = kc;
                                l0 += pfn;
                            }
                            for (int64_t l = l0; l < l1; l++) _mm_prefetch(nxt + l * 64, _MM_HINT_T1);
                        }
                        float *c = j->C + (ic + ir) * j->ldc + jc + jr;
                        const float *ap = pa + (size_t)ir * kc;
                        int64_t ars = kc;
                        if (ir < full) {
                            ap = j->A + (ic + ir) * j->lda + pc;
                            ars = j->lda;
                        }
                        if (last && j->epi && reg_epi) {
                            s->micro_epi(kc, ap, ars, pb + (size_t)jr * kc, c, j->ldc, mr, nr, j->alpha, beta, pf, pfn, pfc, j->epi,
                                         ic + ir, jc + jr);
                            continue;
                        }
                        s->micro(kc, ap, ars, pb + (size_t)jr * kc, c, j->ldc, mr, nr, j->alpha, beta, pf, pfn, pfc);
                        if (last && j->epi) s->epi(c, j->ldc, ic + ir, jc + jr, mr, nr, j->epi);
                    }
                }
            }
        }
    }
}

static void sgemm_run(void *arg, int ith, int nth) {
    const sgemm_job *j = arg;
    int64_t t0 = j->tiles * ith / nth, t1 = j->tiles * (ith + 1) / nth;
    if (t1 <= t0) return;
    if (j->split_n) {
        int64_t n0 = t0 * j->isa->nr, n1 = t1 * j->isa->nr;
        sgemm_block(j, 0, j->M, n0, n1 < j->N ? n1 : j->N);
    } else {
        int64_t m0 = t0 * j->isa->mr, m1 = t1 * j->isa->mr;
        sgemm_block(j, m0, m1 < j->M ? m1 : j->M, 0, j->N);
    }
}

#define SPLIT_M_ROWS 512 /* sgemm_go: rows from which a weight's product splits M */

/* useful share of a split of n (tiles of r) over nth threads: the busiest
 * thread's padded tiles set the time */
static double split_eff(int64_t n, int64_t r, int nth) {
    int64_t tiles = (n + r - 1) / r;
    return (double)n / (double)(nth * ((tiles + nth - 1) / nth) * r);
}

/* ---------------------------------------------------------------- small M */

/* C rows [0, M < 5) x NR-panels [q0, q1) over a pre-packed B: each panel of
 * B streamed once, its columns' sums in registers over all of K (the GEMV of
 * a batch-1 linear layer, where the 12-row kernel would do 12 / M times the
 * work). Two sets of accumulators over even / odd k keep the FMA latency
 * hidden at M = 1. */
T512_INLINE void smallm512_t(const sgemm_job *j, int64_t q0, int64_t q1, const int M) {
    const int64_t K = j->K, N = j->N;
    int64_t nkb = (K + A5_KC - 1) / A5_KC;
    int64_t kcb = (K + nkb - 1) / nkb;
    int64_t ams = j->ta ? 1 : j->lda, aks = j->ta ? j->lda : 1;
    for (int64_t q = q0; q < q1; q++) {
        int64_t j0 = q * A5_NR;
        int nr = (int)(N - j0 < A5_NR ? N - j0 : A5_NR);
        __m512 acc[2][4][2];
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) acc[0][m][0] = acc[0][m][1] = acc[1][m][0] = acc[1][m][1] = _mm512_setzero_ps();
        for (int64_t pc = 0; pc < K; pc += kcb) {
            int64_t kc = K - pc < kcb ? K - pc : kcb;
            const float *pb = j->Bp + pc * j->npad + j0 * kc;
            const float *a = j->A + pc * aks;
            int64_t k = 0;
            for (; k + 2 <= kc; k += 2, pb += 2 * A5_NR) {
                __m512 b0 = _mm512_load_ps(pb), b1 = _mm512_load_ps(pb + 16);
                __m512 b2 = _mm512_load_ps(pb + 32), b3 = _mm512_load_ps(pb + 48);
#pragma GCC unroll 4
                for (int m = 0; m < M; m++) {
                    __m512 x0 = _mm512_set1_ps(a[m * ams + k * aks]), x1 = _mm512_set1_ps(a[m * ams + (k + 1) * aks]);
                    acc[0][m][0] = _mm512_fmadd_ps(x0, b0, acc[0][m][0]);
                    acc[0][m][1] = _mm512_fmadd_ps(x0, b1, acc[0][m][1]);
                    acc[1][m][0] = _mm512_fmadd_ps(x1, b2, acc[1][m][0]);
                    acc[1][m][1] = _mm512_fmadd_ps(x1, b3, acc[1][m][1]);
                }
            }
            if (k < kc) {
                __m512 b0 = _mm512_load_ps(pb), b1 = _mm512_load_ps(pb + 16);
#pragma GCC unroll 4
                for (int m = 0; m < M; m++) {
                    __m512 x0 = _mm512_set1_ps(a[m * ams + k * aks]);
                    acc[0][m][0] = _mm512_fmadd_ps(x0, b0, acc[0][m][0]);
                    acc[0][m][1] = _mm512_fmadd_ps(x0, b1, acc[0][m][1]);
                }
            }
        }
        __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
        __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1);
        __m512 va = _mm512_set1_ps(j->alpha), vb = _mm512_set1_ps(j->beta);
        float *c = j->C + j0;
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            float *o = c + m * j->ldc;
            __m512 r0 = _mm512_mul_ps(va, _mm512_add_ps(acc[0][m][0], acc[1][m][0]));
            __m512 r1 = _mm512_mul_ps(va, _mm512_add_ps(acc[0][m][1], acc[1][m][1]));
            if (j->beta != 0.0f) {
                r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, o), r0);
                r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, o + 16), r1);
            }
            _mm512_mask_storeu_ps(o, m0, r0);
            _mm512_mask_storeu_ps(o + 16, m1, r1);
        }
        if (j->epi) epi_avx512(c, j->ldc, 0, j0, M, nr, j->epi);
    }
}

static T512 void smallm512(const sgemm_job *j, int64_t q0, int64_t q1) {
    switch (j->M) {
    case 1: smallm512_t(j, q0, q1, 1); break;
    case 2: smallm512_t(j, q0, q1, 2); break;
    case 3: smallm512_t(j, q0, q1, 3); break;
    default: smallm512_t(j, q0, q1, 4); break;
    }
}

static void smallm_run(void *arg, int ith, int nth) {
    const sgemm_job *j = arg;
    smallm512(j, j->tiles * ith / nth, j->tiles * (ith + 1) / nth);
}

/* ---------------------------------------------------------------- entry points */

static void sgemm_go(sgemm_job *j, tb_pool *pool) {
    const sgemm_isa *isa = j->isa;
    int64_t M = j->M, N = j->N, K = j->K;
    int nth = pool ? tb_pool_size(pool) : 1;
    if ((double)M * N * K < 65536.0) nth = 1;
    if (j->Bp && isa == &isa_avx512 && M <= SMALL_M && K > 0) {
        j->tiles = (N + A5_NR - 1) / A5_NR;
        /* a thread per 16 K N or more of B: below, the hand-off costs more */
        if ((double)N * K < 16.0 * 65536.0) nth = 1;
        if (nth <= 1) smallm512(j, 0, j->tiles);
        else tb_pool_run(pool, smallm_run, j);
        return;
    }
    int64_t tm = (M + isa->mr - 1) / isa->mr, tn = (N + isa->nr - 1) / isa->nr;
    j->split_n = split_eff(N, isa->nr, nth) >= split_eff(M, isa->mr, nth);
    /* A weight's product over many rows (a transformer's linear layers at
     * batch x sequence >= 512) splits rows instead: each thread then writes
     * whole rows of C, which the next op (LayerNorm, the next linear layer,
     * attention by sequence) reads on the same core, where with columns
     * split half of every row came from the other core's cache. Each thread
     * reads all of B (a weight, from memory either way). BERT-base batch 8,
     * 2 threads: 931 -> 897 ms median, LayerNorms 12-16 -> 5-6 ms
     * (docs/PERFORMANCE.md, 2026-12-03 16:35). */
    if (j->Bp && M >= SPLIT_M_ROWS && split_eff(M, isa->mr, nth) >= 0.97) j->split_n = 0;
    j->tiles = j->split_n ? tn : tm;
    if (nth <= 1) sgemm_block(j, 0, M, 0, N);
    else tb_pool_run(pool, sgemm_run, j);
}

static const tb_cpu_sgemm_epi *epi_norm(const tb_cpu_sgemm_epi *epi, tb_cpu_sgemm_epi *e0) {
    if (epi && !epi->bias && !epi->res && epi->act == TB_NN_ACT_NONE) return NULL;
    if (!epi) return NULL;
    TB_ASSERT(!epi->bias || epi->bias_cs == 0 || epi->bias_cs == 1);
    *e0 = *epi;
    return e0;
}

void tb_cpu_sgemm_ex(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float beta, float *C, int64_t ldc, const tb_cpu_sgemm_epi *epi,
                     tb_pool *pool) {
    if (M <= 0 || N <= 0) return;
    tb_cpu_sgemm_epi e0;
    epi = epi_norm(epi, &e0);
    sgemm_job j = {isa_get(), ta, tb, M, N, K, alpha, beta, A, B, lda, ldb, ldc, C, epi, 1, 0, NULL, 0};
    sgemm_go(&j, pool);
}

/* The packed form's geometry: K blocks of kcb rows, rows of npad floats. */
static void packed_geom(const sgemm_isa *s, int64_t K, int64_t N, int64_t *kcb, int64_t *npad) {
    int64_t nkb = K > 0 ? (K + s->kc - 1) / s->kc : 1;
    *kcb = K > 0 ? (K + nkb - 1) / nkb : 0;
    *npad = round_up(N, s->nr);
}

size_t tb_cpu_sgemm_packed_floats(int64_t K, int64_t N) {
    int64_t kcb, npad;
    packed_geom(isa_get(), K, N, &kcb, &npad);
    return (size_t)K * (size_t)npad;
}

void tb_cpu_sgemm_pack_b(int tb, int64_t K, int64_t N, const float *B, int64_t ldb, float *dst) {
    const sgemm_isa *s = isa_get();
    int64_t kcb, npad;
    packed_geom(s, K, N, &kcb, &npad);
    for (int64_t pc = 0; pc < K; pc += kcb) {
        int kc = (int)(K - pc < kcb ? K - pc : kcb);
        pack_b(tb, B, ldb, pc, kc, 0, (int)N, s->nr, dst + pc * npad);
    }
}

void tb_cpu_sgemm_packed(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                         const float *Bp, float beta, float *C, int64_t ldc, const tb_cpu_sgemm_epi *epi,
                         tb_pool *pool) {
    if (M <= 0 || N <= 0) return;
    tb_cpu_sgemm_epi e0;
    epi = epi_norm(epi, &e0);
    const sgemm_isa *s = isa_get();
    int64_t kcb, npad;
    packed_geom(s, K, N, &kcb, &npad);
    sgemm_job j = {s, ta, 0, M, N, K, alpha, beta, A, NULL, lda, 0, ldc, C, epi, 1, 0, K > 0 ? Bp : NULL, npad};
    sgemm_go(&j, pool);
}

void tb_cpu_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, tb_pool *pool) {
    tb_cpu_sgemm_ex(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, pool);
}

/* ---------------------------------------------------------------- helpers of nn_conv_impl.h */

void tb_cpu_nn_epilogue(float *c, int64_t ldc, int64_t M, int64_t N, const tb_cpu_sgemm_epi *e) {
    const sgemm_isa *isa = isa_get();
    for (int64_t j = 0; j < N; j += 4096)
        isa->epi(c + j, ldc, 0, j, (int)M, (int)(N - j < 4096 ? N - j : 4096), e);
}

static T512 float softmax_avx512(float *x, int64_t n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
    float m = _mm512_reduce_max_ps(mx);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    if (m == -INFINITY) return 0.0f;
    __m512 vm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    for (i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        v = _mm512_maskz_mov_ps(k, v);
        sum = _mm512_add_ps(sum, v);
        _mm512_mask_storeu_ps(x + i, k, v);
    }
    float s = _mm512_reduce_add_ps(sum);
    __m512 inv = _mm512_set1_ps(1.0f / s);
    for (i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
    }
    return s;
}

static T256 float softmax_avx2(float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    if (m == -INFINITY) return 0.0f;
    __m256 vm = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        sum = _mm256_add_ps(sum, v);
        _mm256_storeu_ps(x + i, v);
    }
    float t[8], s = 0;
    _mm256_storeu_ps(t, sum);
    for (int u = 0; u < 8; u++) s += t[u];
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = 1.0f / s;
    for (i = 0; i < n; i++) x[i] *= inv;
    return s;
}

void tb_cpu_nn_softmax_row(float *x, int64_t n) {
    const sgemm_isa *isa = isa_get();
    float s;
    if (isa == &isa_avx512) s = softmax_avx512(x, n);
    else if (isa == &isa_avx2) s = softmax_avx2(x, n);
    else {
        float m = -INFINITY;
        for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        s = 0;
        if (m != -INFINITY) {
            for (int64_t i = 0; i < n; i++) s += x[i] = expf(x[i] - m);
            for (int64_t i = 0; i < n; i++) x[i] /= s;
        }
    }
    if (s == 0.0f) memset(x, 0, sizeof(float) * (size_t)n);
}
