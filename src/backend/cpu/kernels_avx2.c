/*
 * kernels_avx2.c — the AVX2 + FMA + F16C path.
 *
 * Every function carries a target attribute instead of a global -mavx2, so
 * the library still runs on any x86-64; kernels.c only calls this table when
 * tb_cpu_features() reports all three extensions.
 *
 * Matmul has three regimes:
 *   T == 1 (decode): a GEMV streaming rows of w against x held in L1, so it
 *     runs at memory bandwidth;
 *   1 < T < TB_CPU_GEMM_MIN_T (batched decode): register tiles in
 *     dot-product form reading w in place (4 rows of x by 3 rows of w below
 *     12 rows, 3 by 4 above; f32 batches of 5..47 rows walk each 3-row block
 *     of w in k-blocks so that every tile of x reuses it from L1 while the
 *     next block streams in), weights converted on the fly;
 *   T >= TB_CPU_GEMM_MIN_T (prefill): a 6x16 outer-product microkernel over
 *     packed, transposed f32 panels of w (any weight dtype).
 */
#include "backend/cpu/kernels.h"
#include "core/kv_layout.h"

#include <immintrin.h>
#include <math.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* ---------------------------------------------------------------- helpers */

/* 8 elements of a weight row from element i, as f32. */
AVX2_INLINE __m256 ld8(const void *base, size_t i, tb_dtype dt) {
    if (dt == TB_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    if (dt == TB_BF16) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    return _mm256_loadu_ps((const float *)base + i);
}

static inline float ld1(const void *base, size_t i, tb_dtype dt) {
    if (dt == TB_F16) return tb_f16_to_f32(((const uint16_t *)base)[i]);
    if (dt == TB_BF16) return tb_bf16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

/* Lanes [0, n) set, n in [0, 8]. */
AVX2_INLINE __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AVX2_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* (sum a, sum b, sum c, sum d). */
AVX2_INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* exp(x), Cephes-style: 2^n * p(r), r = x - n ln2, |rel err| ~ 2e-7. */
AVX2_INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* ---------------------------------------------------------------- conversion */
static AVX2_FN void avx2_to_f32(const void *src, tb_dtype sdt, float *dst, size_t n) {
    size_t i = 0;
    switch (sdt) {
    case TB_F32: memcpy(dst, src, n * sizeof(float)); return;
    case TB_F16:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8(src, i, TB_F16));
        break;
    case TB_BF16:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8(src, i, TB_BF16));
        break;
    default: TB_ASSERT(!"unsupported dtype");
    }
    for (; i < n; i++) dst[i] = ld1(src, i, sdt);
}

static AVX2_FN void avx2_from_f32(const float *src, void *dst, tb_dtype ddt, size_t n) {
    size_t i = 0;
    uint16_t *h = dst;
    switch (ddt) {
    case TB_F32: memcpy(dst, src, n * sizeof(float)); return;
    case TB_F16:
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(h + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
        for (; i < n; i++) h[i] = tb_f32_to_f16(src[i]);
        return;
    case TB_BF16:
        for (; i < n; i++) h[i] = tb_f32_to_bf16(src[i]);
        return;
    default: TB_ASSERT(!"unsupported dtype");
    }
}

/* ---------------------------------------------------------------- GEMV (T = 1) */
#define ESZ(dt) ((dt) == TB_F32 ? (size_t)4 : (size_t)2)

AVX2_INLINE float dot_row(const float *x, const void *w, size_t r, int K, tb_dtype dt) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        a0 = _mm256_fmadd_ps(ld8(w, r + k, dt), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(ld8(w, r + k + 8, dt), _mm256_loadu_ps(x + k + 8), a1);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(ld8(w, r + k, dt), _mm256_loadu_ps(x + k), a0);
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; k < K; k++) s += x[k] * ld1(w, r + k, dt);
    return s;
}

AVX2_INLINE void gemv_dt(const float *x, const void *w, tb_dtype dt, const float *bias,
                         float *y, int K, int n0, int n1, int pf_bytes) {
    int n = n0;
    for (; n + 4 <= n1; n += 4) {
        size_t r0 = (size_t)n * K, r1 = r0 + K, r2 = r1 + K, r3 = r2 + K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
        __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
        __m256 d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
        /* The 4 rows are one contiguous run of 4*K elements, read at 4*16
         * elements per step; prefetch that run pf_bytes ahead as a
         * single stream (across blocks, so short rows do not each pay the
         * hardware prefetcher's ramp-up), stopping at the end of w. */
        const char *blk = (const char *)w + (size_t)n * K * ESZ(dt);
        const char *pf_end = (const char *)w + (size_t)n1 * K * ESZ(dt);
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            const char *q = blk + (size_t)k * 4 * ESZ(dt) + pf_bytes;
            if (pf_bytes && q < pf_end) {
                _mm_prefetch(q, _MM_HINT_T0);
                _mm_prefetch(q + 64, _MM_HINT_T0);
                if (ESZ(dt) == 4) {
                    _mm_prefetch(q + 128, _MM_HINT_T0);
                    _mm_prefetch(q + 192, _MM_HINT_T0);
                }
            }
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
            a0 = _mm256_fmadd_ps(ld8(w, r0 + k, dt), x0, a0);
            a1 = _mm256_fmadd_ps(ld8(w, r0 + k + 8, dt), x1, a1);
            b0 = _mm256_fmadd_ps(ld8(w, r1 + k, dt), x0, b0);
            b1 = _mm256_fmadd_ps(ld8(w, r1 + k + 8, dt), x1, b1);
            c0 = _mm256_fmadd_ps(ld8(w, r2 + k, dt), x0, c0);
            c1 = _mm256_fmadd_ps(ld8(w, r2 + k + 8, dt), x1, c1);
            d0 = _mm256_fmadd_ps(ld8(w, r3 + k, dt), x0, d0);
            d1 = _mm256_fmadd_ps(ld8(w, r3 + k + 8, dt), x1, d1);
        }
        if (k + 8 <= K) {
            __m256 x0 = _mm256_loadu_ps(x + k);
            a0 = _mm256_fmadd_ps(ld8(w, r0 + k, dt), x0, a0);
            b0 = _mm256_fmadd_ps(ld8(w, r1 + k, dt), x0, b0);
            c0 = _mm256_fmadd_ps(ld8(w, r2 + k, dt), x0, c0);
            d0 = _mm256_fmadd_ps(ld8(w, r3 + k, dt), x0, d0);
            k += 8;
        }
        float s[4];
        _mm_storeu_ps(s, hsum4(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1),
                               _mm256_add_ps(c0, c1), _mm256_add_ps(d0, d1)));
        for (; k < K; k++) {
            s[0] += x[k] * ld1(w, r0 + k, dt);
            s[1] += x[k] * ld1(w, r1 + k, dt);
            s[2] += x[k] * ld1(w, r2 + k, dt);
            s[3] += x[k] * ld1(w, r3 + k, dt);
        }
        for (int j = 0; j < 4; j++) y[n + j] = s[j] + (bias ? bias[n + j] : 0.0f);
    }
    for (; n < n1; n++) y[n] = dot_row(x, w, (size_t)n * K, K, dt) + (bias ? bias[n] : 0.0f);
}

/* One row at a time, so that w is read as a single sequential stream, with a
 * software prefetch pf bytes ahead of it (0: none). With 4 KiB pages,
 * kernels_bench gemvx measured (1 thread, GB/s from DRAM): f16 K=768 and
 * K=2048: 19-20 with pf = 1 KiB against 15-16 for 4 interleaved rows with
 * the next block prefetched; f32 K=768: 19-20 with no prefetch against
 * 18-19; f32 K=2048: 4 interleaved rows without prefetch did best (21-22). */
AVX2_INLINE void gemv_seq(const float *x, const void *w, tb_dtype dt, const float *bias, float *y, int K,
                          int n0, int n1, int pf_bytes) {
    const char *end = (const char *)w + (size_t)n1 * K * ESZ(dt);
    for (int n = n0; n < n1; n++) {
        size_t r = (size_t)n * K;
        const char *pf = (const char *)w + r * ESZ(dt) + pf_bytes;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int k = 0;
        for (; k + 32 <= K; k += 32) {
            const char *q = pf + (size_t)k * ESZ(dt);
            if (pf_bytes && q < end) {
                _mm_prefetch(q, _MM_HINT_T0);
                if (ESZ(dt) == 4) _mm_prefetch(q + 64, _MM_HINT_T0);
            }
            a0 = _mm256_fmadd_ps(ld8(w, r + k, dt), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(ld8(w, r + k + 8, dt), _mm256_loadu_ps(x + k + 8), a1);
            a2 = _mm256_fmadd_ps(ld8(w, r + k + 16, dt), _mm256_loadu_ps(x + k + 16), a2);
            a3 = _mm256_fmadd_ps(ld8(w, r + k + 24, dt), _mm256_loadu_ps(x + k + 24), a3);
        }
        for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(ld8(w, r + k, dt), _mm256_loadu_ps(x + k), a0);
        float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; k < K; k++) s += x[k] * ld1(w, r + k, dt);
        y[n] = s + (bias ? bias[n] : 0.0f);
    }
}

/* Lane i = sum of the 8 lanes of p[i] (used by the small-K GEMV and by
 * attention). */
AVX2_INLINE __m256 hsum8x8(const __m256 p[8]) {
    /* unpack/shuffle + add rather than vhaddps: on Zen 3 the shuffles are
     * single uops on two pipes while each vhaddps costs two cycles */
    __m256 s01 = _mm256_add_ps(_mm256_unpacklo_ps(p[0], p[1]), _mm256_unpackhi_ps(p[0], p[1]));
    __m256 s23 = _mm256_add_ps(_mm256_unpacklo_ps(p[2], p[3]), _mm256_unpackhi_ps(p[2], p[3]));
    __m256 s45 = _mm256_add_ps(_mm256_unpacklo_ps(p[4], p[5]), _mm256_unpackhi_ps(p[4], p[5]));
    __m256 s67 = _mm256_add_ps(_mm256_unpacklo_ps(p[6], p[7]), _mm256_unpackhi_ps(p[6], p[7]));
    /* s01 = (p0 02, p1 02, p0 13, p1 13 | the same for lanes 4-7) */
    __m256 c0 = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, 0x44), _mm256_shuffle_ps(s01, s23, 0xEE));
    __m256 c1 = _mm256_add_ps(_mm256_shuffle_ps(s45, s67, 0x44), _mm256_shuffle_ps(s45, s67, 0xEE));
    /* c0 = (sums of p0..p3 over lanes 0-3 | over lanes 4-7), c1 for p4..p7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

/* Small K (stories260K: K = 64 or 172, weights in L3): 8 rows per block,
 * one accumulator each, so each x vector is loaded once for 8 FMAs, and one
 * 8-way transpose-sum yields the 8 outputs as a vector. Instruction count
 * bounded the 4-row GEMV here (kernels_bench small: 16.7 us per token with
 * cache-resident weights, 11.6 with this); the block's stream is
 * prefetched 4 KiB ahead, past the end of w too (a prefetch never faults,
 * and the next weights of the step usually follow): 16 -> 14.6 us. */
#define GEMV_SMALL_PF_BYTES 4096
AVX2_INLINE void gemv_small(const float *x, const void *w, tb_dtype dt, const float *bias, float *y, int K,
                            int n0, int n1) {
    int n = n0, K8 = K & ~7;
    for (; n + 8 <= n1; n += 8) {
        size_t r = (size_t)n * K;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        const char *pf = (const char *)w + r * ESZ(dt) + GEMV_SMALL_PF_BYTES;
        for (int k = 0; k < K8; k += 8) {
            {
                const char *q = pf + (size_t)k * 8 * ESZ(dt);
                _mm_prefetch(q, _MM_HINT_T0);
                if (ESZ(dt) == 4) _mm_prefetch(q + 64, _MM_HINT_T0);
                _mm_prefetch(q + 128, _MM_HINT_T0);
                if (ESZ(dt) == 4) _mm_prefetch(q + 192, _MM_HINT_T0);
            }
            __m256 xv = _mm256_loadu_ps(x + k);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(ld8(w, r + (size_t)i * K + k, dt), xv, acc[i]);
        }
        __m256 s = hsum8x8(acc);
        if (K8 < K) {
            float t[8];
            for (int i = 0; i < 8; i++) {
                float a = 0.0f;
                for (int k = K8; k < K; k++) a += x[k] * ld1(w, r + (size_t)i * K + k, dt);
                t[i] = a;
            }
            s = _mm256_add_ps(s, _mm256_loadu_ps(t));
        }
        if (bias) s = _mm256_add_ps(s, _mm256_loadu_ps(bias + n));
        _mm256_storeu_ps(y + n, s);
    }
    for (; n < n1; n++) y[n] = dot_row(x, w, (size_t)n * K, K, dt) + (bias ? bias[n] : 0.0f);
}

static AVX2_FN void gemv_f32(const float *x, const void *w, const float *bias, float *y, int K, int n0, int n1) {
    if (K < 256) gemv_small(x, w, TB_F32, bias, y, K, n0, n1);
    else if (K < 1536) gemv_seq(x, w, TB_F32, bias, y, K, n0, n1, 0);
    else gemv_dt(x, w, TB_F32, bias, y, K, n0, n1, 0);
}
static AVX2_FN void gemv_f16(const float *x, const void *w, const float *bias, float *y, int K, int n0, int n1) {
    if (K < 256) gemv_small(x, w, TB_F16, bias, y, K, n0, n1);
    else gemv_seq(x, w, TB_F16, bias, y, K, n0, n1, 1024);
}
static AVX2_FN void gemv_bf16(const float *x, const void *w, const float *bias, float *y, int K, int n0, int n1) {
    if (K < 256) gemv_small(x, w, TB_BF16, bias, y, K, n0, n1);
    else gemv_dt(x, w, TB_BF16, bias, y, K, n0, n1, 4096);
}

/* ---------------------------------------------------------------- GEMM (T > 1) */
/* ---- packed GEMM (T >= MS_MAX_T, prefill): outer-product 6x16 microkernel.
 * A (KC, 16) panel of w, transposed and converted to f32, is loaded as two
 * vectors per k while 6 rows of x are broadcast: 12 accumulators, no
 * horizontal sums, any K. Panels of MP_NC rows of w (KC x MP_NC x 4 bytes
 * = 128 KiB) stay in L2 while every 6-row slab of x passes over them. */
#define MP_MR 6
#define MP_NR 16
#define MP_KC 256
#define MP_NC 128

/* the packed panel: per-thread scratch from tb_cpu_thread_panel() */
_Static_assert(MP_NC * MP_KC * sizeof(float) <= TB_CPU_PANEL_BYTES, "panel exceeds the per-thread scratch");

/* Packs w[n0 + j, k0 + k] for j < nn (<= MP_NC), k < kc into micro-panels
 * of (kc, 16) each; columns past nn are zero. */
static AVX2_FN void mp_pack(float *mp_panel, const void *w, tb_dtype wdt, int K, int n0, int nn, int k0,
                               int kc) {
    float row[MP_KC] __attribute__((aligned(32)));
    size_t esz = tb_dtype_size(wdt);
    int nn16 = (nn + MP_NR - 1) / MP_NR * MP_NR;
    for (int j = 0; j < nn16; j++) {
        float *dst = mp_panel + (size_t)(j / MP_NR) * kc * MP_NR + (j % MP_NR);
        if (j < nn) {
            avx2_to_f32((const uint8_t *)w + ((size_t)(n0 + j) * K + k0) * esz, wdt, row, (size_t)kc);
            for (int k = 0; k < kc; k++) dst[(size_t)k * MP_NR] = row[k];
        } else {
            for (int k = 0; k < kc; k++) dst[(size_t)k * MP_NR] = 0.0f;
        }
    }
}

/* y[i, 0:nr] (+)= sum_k x[i, k] * pw[k, 0:nr] for i < mr. */
AVX2_INLINE void mp_micro(int mr, const float *x, size_t ldx, const float *pw, int kc, float *y,
                          size_t ldy, int nr, int first, const float *bias) {
    __m256 acc[MP_MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MP_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(pw + (size_t)k * MP_NR), b1 = _mm256_load_ps(pw + (size_t)k * MP_NR + 8);
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) {
            __m256 a = _mm256_broadcast_ss(x + i * ldx + k);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
    float bb[MP_NR] __attribute__((aligned(32))) = {0};
    if (first && bias)
        for (int j = 0; j < nr; j++) bb[j] = bias[j];
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
        float *o = y + i * ldy;
        if (nr == MP_NR) {
            __m256 c0 = first ? _mm256_load_ps(bb) : _mm256_loadu_ps(o);
            __m256 c1 = first ? _mm256_load_ps(bb + 8) : _mm256_loadu_ps(o + 8);
            _mm256_storeu_ps(o, _mm256_add_ps(c0, acc[i][0]));
            _mm256_storeu_ps(o + 8, _mm256_add_ps(c1, acc[i][1]));
        } else {
            float t[MP_NR] __attribute__((aligned(32)));
            _mm256_store_ps(t, acc[i][0]);
            _mm256_store_ps(t + 8, acc[i][1]);
            for (int j = 0; j < nr; j++) o[j] = (first ? bb[j] : o[j]) + t[j];
        }
    }
}

#define MP_CASE(MR)                                                           \
    case MR: mp_micro(MR, x, ldx, pw, kc, y, ldy, nr, first, bias); break;

static AVX2_FN void mp_micro_any(int mr, const float *x, size_t ldx, const float *pw, int kc,
                                 float *y, size_t ldy, int nr, int first, const float *bias) {
    switch (mr) {
        MP_CASE(1) MP_CASE(2) MP_CASE(3) MP_CASE(4) MP_CASE(5) MP_CASE(6)
    default: TB_ASSERT(!"bad microkernel shape");
    }
}

static AVX2_FN void gemm_packed(const float *x, const void *w, tb_dtype wdt, const float *bias,
                                float *y, int T, int K, int N, int n0, int n1) {
    float *mp_panel = tb_cpu_thread_panel();
    int nkb = (K + MP_KC - 1) / MP_KC;
    int kcb = (K + nkb - 1) / nkb;
    for (int k0 = 0; k0 < K; k0 += kcb) {
        int kc = K - k0 < kcb ? K - k0 : kcb;
        int first = k0 == 0;
        for (int p0 = n0; p0 < n1; p0 += MP_NC) {
            int pn = n1 - p0 < MP_NC ? n1 - p0 : MP_NC;
            mp_pack(mp_panel, w, wdt, K, p0, pn, k0, kc);
            for (int t0 = 0; t0 < T; t0 += MP_MR) {
                int mr = T - t0 < MP_MR ? T - t0 : MP_MR;
                for (int j = 0; j < pn; j += MP_NR) {
                    int nr = pn - j < MP_NR ? pn - j : MP_NR;
                    mp_micro_any(mr, x + (size_t)t0 * K + k0, (size_t)K,
                                 mp_panel + (size_t)(j / MP_NR) * kc * MP_NR, kc,
                                 y + (size_t)t0 * N + p0 + j, (size_t)N, nr, first,
                                 bias ? bias + p0 + j : NULL);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- small batches (2 <= T < MS_MAX_T)
 * Decode steps of a few sequences are memory-bound like a GEMV: weights
 * stream once, contiguously, a few rows at a time, while the few rows of x
 * stay in L1/L2. Register tiles keep 12 accumulators; weights are converted
 * on the fly, and the next block of rows is prefetched. */
#define MS_MAX_T TB_CPU_GEMM_MIN_T /* measured: packing w pays off from ~100 rows */

/* Up to 4 rows of x against 3 rows of w (12 accumulators): best for the few
 * rows of small decode batches (T < 12), where 3-row tiles leave rows over. */
#define PAIR_FMA(i, xv)                                                                     \
    do {                                                                                    \
        a##i##0 = _mm256_fmadd_ps(xv, w0, a##i##0);                                         \
        a##i##1 = _mm256_fmadd_ps(xv, w1, a##i##1);                                         \
        a##i##2 = _mm256_fmadd_ps(xv, w2, a##i##2);                                         \
    } while (0)
#define PAIR_ROWS(MR)                                                                       \
    AVX2_INLINE void pair_tile_##MR(const float *x, int K, const void *w, tb_dtype dt,       \
                                    size_t r0, float *y, int N, const float *bias,          \
                                    const char *pf) {                                       \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00;        \
        __m256 a12 = a00, a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;  \
        size_t r1 = r0 + (size_t)K, r2 = r1 + (size_t)K;                                    \
        int k = 0;                                                                          \
        for (; k + 8 <= K; k += 8) {                                                        \
            if (pf && (k & 15) == 0) {                                                      \
                const char *q = pf + (size_t)k * ESZ(dt) * 3;                               \
                _mm_prefetch(q, _MM_HINT_T0);                                               \
                _mm_prefetch(q + 64, _MM_HINT_T0);                                          \
                if (ESZ(dt) == 4) _mm_prefetch(q + 128, _MM_HINT_T0);                       \
            }                                                                               \
            __m256 w0 = ld8(w, r0 + k, dt), w1 = ld8(w, r1 + k, dt), w2 = ld8(w, r2 + k, dt);\
            PAIR_FMA(0, _mm256_loadu_ps(x + k));                                            \
            if (MR > 1) PAIR_FMA(1, _mm256_loadu_ps(x + (size_t)K + k));                     \
            if (MR > 2) PAIR_FMA(2, _mm256_loadu_ps(x + 2 * (size_t)K + k));                 \
            if (MR > 3) PAIR_FMA(3, _mm256_loadu_ps(x + 3 * (size_t)K + k));                 \
        }                                                                                   \
        float s[4][4];                                                                      \
        __m256 z = _mm256_setzero_ps();                                                     \
        _mm_storeu_ps(s[0], hsum4(a00, a01, a02, z));                                       \
        _mm_storeu_ps(s[1], hsum4(a10, a11, a12, z));                                       \
        _mm_storeu_ps(s[2], hsum4(a20, a21, a22, z));                                       \
        _mm_storeu_ps(s[3], hsum4(a30, a31, a32, z));                                       \
        for (int i = 0; i < MR; i++)                                                        \
            for (int j = 0; j < 3; j++) {                                                   \
                float v = s[i][j];                                                          \
                for (int kk = k; kk < K; kk++)                                              \
                    v += x[(size_t)i * K + kk] * ld1(w, r0 + (size_t)j * K + kk, dt);       \
                y[(size_t)i * N + j] = v + (bias ? bias[j] : 0.0f);                         \
            }                                                                               \
    }
PAIR_ROWS(1)
PAIR_ROWS(2)
PAIR_ROWS(3)
PAIR_ROWS(4)

AVX2_INLINE void pair_mm_dt(const float *x, const void *w, tb_dtype dt, const float *bias, float *y, int T,
                            int K, int N, int n0, int n1) {
    int n = n0;
    for (; n + 3 <= n1; n += 3) {
        size_t r0 = (size_t)n * K;
        /* rows n+3 .. n+5 are one contiguous run of 3K elements */
        const char *pf = n + 6 <= n1 ? (const char *)w + (size_t)(n + 3) * K * ESZ(dt) : NULL;
        const float *bn = bias ? bias + n : NULL;
        for (int t = 0; t < T; t += 4) {
            const float *xt = x + (size_t)t * K;
            float *yt = y + (size_t)t * N + n;
            const char *p = t == 0 ? pf : NULL;
            switch (T - t < 4 ? T - t : 4) { /* a constant row count keeps acc in registers */
            case 4: pair_tile_4(xt, K, w, dt, r0, yt, N, bn, p); break;
            case 3: pair_tile_3(xt, K, w, dt, r0, yt, N, bn, p); break;
            case 2: pair_tile_2(xt, K, w, dt, r0, yt, N, bn, p); break;
            default: pair_tile_1(xt, K, w, dt, r0, yt, N, bn, p); break;
            }
        }
    }
    for (; n < n1; n++)
        for (int t = 0; t < T; t++)
            y[(size_t)t * N + n] = dot_row(x + (size_t)t * K, w, (size_t)n * K, K, dt) + (bias ? bias[n] : 0.0f);
}

/* Up to 3 rows of x against 4 rows of w: 12 accumulators, 3 x vectors and
 * one w vector fill the 16 ymm registers. The accumulators are named so they
 * stay in registers (an indexed array would live on the stack at -O2). */
#define SMALL_FMA(i, xv)                                                                    \
    do {                                                                                    \
        a##i##0 = _mm256_fmadd_ps(xv, w0, a##i##0);                                         \
        a##i##1 = _mm256_fmadd_ps(xv, w1, a##i##1);                                         \
        a##i##2 = _mm256_fmadd_ps(xv, w2, a##i##2);                                         \
        a##i##3 = _mm256_fmadd_ps(xv, w3, a##i##3);                                         \
    } while (0)
#define SMALL_ROWS(MR)                                                                      \
    AVX2_INLINE void small_tile_##MR(const float *x, int K, const void *w, tb_dtype dt,      \
                                     size_t r0, float *y, int N, const float *bias,         \
                                     const char *pf) {                                      \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;                  \
        __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;                                  \
        __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;                                  \
        const float *x0 = x, *x1 = x + (MR > 1 ? K : 0), *x2 = x + (MR > 2 ? 2 * K : 0);     \
        size_t r1 = r0 + (size_t)K, r2 = r1 + (size_t)K, r3 = r2 + (size_t)K;               \
        int k = 0;                                                                          \
        for (; k + 8 <= K; k += 8) {                                                        \
            if (pf && (k & 15) == 0) {                                                      \
                const char *q = pf + (size_t)k * ESZ(dt) * 4;                               \
                _mm_prefetch(q, _MM_HINT_T0);                                               \
                _mm_prefetch(q + 64, _MM_HINT_T0);                                          \
                if (ESZ(dt) == 4) {                                                         \
                    _mm_prefetch(q + 128, _MM_HINT_T0);                                     \
                    _mm_prefetch(q + 192, _MM_HINT_T0);                                     \
                }                                                                           \
            }                                                                               \
            __m256 w0 = ld8(w, r0 + k, dt), w1 = ld8(w, r1 + k, dt);                        \
            __m256 w2 = ld8(w, r2 + k, dt), w3 = ld8(w, r3 + k, dt);                        \
            __m256 v0 = _mm256_loadu_ps(x0 + k);                                            \
            SMALL_FMA(0, v0);                                                               \
            if (MR > 1) { __m256 v1 = _mm256_loadu_ps(x1 + k); SMALL_FMA(1, v1); }          \
            if (MR > 2) { __m256 v2 = _mm256_loadu_ps(x2 + k); SMALL_FMA(2, v2); }          \
        }                                                                                   \
        float s[3][4];                                                                      \
        _mm_storeu_ps(s[0], hsum4(a00, a01, a02, a03));                                     \
        _mm_storeu_ps(s[1], hsum4(a10, a11, a12, a13));                                     \
        _mm_storeu_ps(s[2], hsum4(a20, a21, a22, a23));                                     \
        for (int i = 0; i < MR; i++)                                                        \
            for (int j = 0; j < 4; j++) {                                                   \
                float v = s[i][j];                                                          \
                for (int kk = k; kk < K; kk++)                                              \
                    v += x[(size_t)i * K + kk] * ld1(w, r0 + (size_t)j * K + kk, dt);       \
                y[(size_t)i * N + j] = v + (bias ? bias[j] : 0.0f);                         \
            }                                                                               \
    }
SMALL_ROWS(1)
SMALL_ROWS(2)
SMALL_ROWS(3)

AVX2_INLINE void small_mm_dt(const float *x, const void *w, tb_dtype dt, const float *bias, float *y, int T,
                             int K, int N, int n0, int n1) {
    int n = n0;
    for (; n + 4 <= n1; n += 4) {
        size_t r0 = (size_t)n * K;
        /* rows n+4 .. n+7 are one contiguous run of 4K elements */
        const char *pf = n + 8 <= n1 ? (const char *)w + (size_t)(n + 4) * K * ESZ(dt) : NULL;
        const float *bn = bias ? bias + n : NULL;
        for (int t = 0; t < T; t += 3) {
            const float *xt = x + (size_t)t * K;
            float *yt = y + (size_t)t * N + n;
            const char *p = t == 0 ? pf : NULL;
            switch (T - t < 3 ? T - t : 3) { /* a constant row count keeps acc in registers */
            case 3: small_tile_3(xt, K, w, dt, r0, yt, N, bn, p); break;
            case 2: small_tile_2(xt, K, w, dt, r0, yt, N, bn, p); break;
            default: small_tile_1(xt, K, w, dt, r0, yt, N, bn, p); break;
            }
        }
    }
    for (; n < n1; n++)
        for (int t = 0; t < T; t++)
            y[(size_t)t * N + n] = dot_row(x + (size_t)t * K, w, (size_t)n * K, K, dt) + (bias ? bias[n] : 0.0f);
}

/* f32, 5 <= T < 12: the tiles above make ceil(T/4) passes over each 3-row
 * block, and only the first waits on DRAM; the later ones ran from L1 with
 * memory idle, so a batch-8 step cost its memory time plus its FMA time.
 * Here each block is walked in k-blocks of PAIR_KB_LEN: every 4-row tile of x
 * runs over the k-block while it is in L1 (accumulators spilled to a small
 * stack array between k-blocks), and the prefetch of the next block is
 * spread evenly over all the passes, so DRAM streams throughout the block.
 * kernels_bench batch (134M decode matmuls from DRAM, 2 threads, ms per
 * step at T=8, variants in one run): 19.5 before, 15.3 with k-blocks of
 * 256 (384: 15.4, 512: 15.5, 128: ~16.5; the whole K with only the spread
 * prefetch: 15.3-16.6 against 14.9-16.1; a 16-k unrolled loop: 15.7).
 * The prefetch pace matters: the next block done in half the block: 19.3
 * against 15.5; half a block ahead: 17.9 against 14.7; two blocks: 16.9.
 * f16/bf16 are bound by conversion at T=8 and gained nothing (f16: 13.0
 * -> 14.0 ms), nor did T <= 4, one pass already (T=2: 14.6 -> 15.1). */
#define PAIR_KB_LEN 256

/* The 12-FMA loop of pair_kb_tile_4 ran ~8% faster (T=8, K=768, weights in
 * L2, one thread: 66-70 -> 72-75 GFLOP/s; kernels_bench batch, T=8 from
 * DRAM: 14.9-15.2 -> 14.4 ms) when an unrelated change happened to place it
 * on a 64-byte boundary instead of an 8-byte one (-O2's generic loop
 * alignment): loops and jump targets of this section are aligned to 64 bytes
 * so that its speed no longer depends on the code around it. The k loop
 * also takes 16 k a step, the prefetch test once per step instead of a
 * (k - k0) & 15 test every 8 k (in cache: +3%, 70 -> 73 GFLOP/s). */
#pragma GCC push_options
#pragma GCC optimize("align-loops=64", "align-jumps=64")

/* 3 rows of w x MR rows of x over k in [k0, k1), accumulators read from
 * (unless first) and written back to acc (12 x 8 floats). Every 16 k,
 * npf lines at *pq are prefetched and *pq advances by pfb bytes (NULL: no
 * prefetch). */
#define PAIR_KB_STEP(MR, k)                                                                 \
    do {                                                                                    \
        __m256 w0 = _mm256_loadu_ps(w0p + (k)), w1 = _mm256_loadu_ps(w1p + (k));            \
        __m256 w2 = _mm256_loadu_ps(w2p + (k));                                             \
        PAIR_FMA(0, _mm256_loadu_ps(x + (k)));                                              \
        if (MR > 1) PAIR_FMA(1, _mm256_loadu_ps(x + (size_t)K + (k)));                      \
        if (MR > 2) PAIR_FMA(2, _mm256_loadu_ps(x + 2 * (size_t)K + (k)));                  \
        if (MR > 3) PAIR_FMA(3, _mm256_loadu_ps(x + 3 * (size_t)K + (k)));                  \
    } while (0)
#define PAIR_KB_ROWS(MR)                                                                    \
    AVX2_INLINE void pair_kb_tile_##MR(const float *x, int K, const float *w, size_t r0,     \
                                       int k0, int k1, float *acc, int first,               \
                                       const char **pq, size_t pfb, int npf) {              \
        __m256 a00, a01, a02, a10, a11, a12, a20, a21, a22, a30, a31, a32;                  \
        if (first) {                                                                        \
            a00 = _mm256_setzero_ps(); a01 = a00; a02 = a00; a10 = a00; a11 = a00;          \
            a12 = a00; a20 = a00; a21 = a00; a22 = a00; a30 = a00; a31 = a00; a32 = a00;    \
        } else {                                                                            \
            a00 = _mm256_load_ps(acc + 0); a01 = _mm256_load_ps(acc + 8);                   \
            a02 = _mm256_load_ps(acc + 16); a10 = _mm256_load_ps(acc + 24);                 \
            a11 = _mm256_load_ps(acc + 32); a12 = _mm256_load_ps(acc + 40);                 \
            a20 = _mm256_load_ps(acc + 48); a21 = _mm256_load_ps(acc + 56);                 \
            a22 = _mm256_load_ps(acc + 64); a30 = _mm256_load_ps(acc + 72);                 \
            a31 = _mm256_load_ps(acc + 80); a32 = _mm256_load_ps(acc + 88);                 \
        }                                                                                   \
        const float *w0p = w + r0, *w1p = w0p + K, *w2p = w1p + K;                          \
        const char *q = *pq;                                                                \
        for (int k = k0; k < k1; k += 16) {                                                 \
            if (q) {                                                                        \
                for (int i = 0; i < npf; i++) _mm_prefetch(q + 64 * i, _MM_HINT_T0);        \
                q += pfb;                                                                   \
            }                                                                               \
            PAIR_KB_STEP(MR, k);                                                            \
            if (k + 8 < k1) PAIR_KB_STEP(MR, k + 8);                                        \
        }                                                                                   \
        *pq = q;                                                                            \
        _mm256_store_ps(acc + 0, a00); _mm256_store_ps(acc + 8, a01);                       \
        _mm256_store_ps(acc + 16, a02); _mm256_store_ps(acc + 24, a10);                     \
        _mm256_store_ps(acc + 32, a11); _mm256_store_ps(acc + 40, a12);                     \
        _mm256_store_ps(acc + 48, a20); _mm256_store_ps(acc + 56, a21);                     \
        _mm256_store_ps(acc + 64, a22); _mm256_store_ps(acc + 72, a30);                     \
        _mm256_store_ps(acc + 80, a31); _mm256_store_ps(acc + 88, a32);                     \
    }
PAIR_KB_ROWS(1)
PAIR_KB_ROWS(2)
PAIR_KB_ROWS(3)
PAIR_KB_ROWS(4)

/* y[t, n] = x[t] . w[n] (+ bias[n]) for t < T (< PAIR_KB_MAX_T), n in [n0, n1).
 * Up to 47 rows: `turbine bench --engine` on the 134M f32 model, ms per
 * decode step against the 3x4 tiles, alternating runs: batch 16 27.4-28.4
 * vs 34.5-35.3, batch 24 41.4-42.6 vs 45.3-46.5, batch 32 54.2-54.4 vs
 * 58.0-58.8, batch 48 a tie, batch 64 110.5-111.4 vs 107.5-107.8. */
#define PAIR_KB_MAX_T 48
static AVX2_FN void pair_kb_f32(const float *x, const float *w, const float *bias, float *y, int T, int K, int N,
                                int n0, int n1) {
    float acc[PAIR_KB_MAX_T / 4][96] __attribute__((aligned(32))); /* 12 vectors per 4-row tile of x */
    int K8 = K & ~7, ntile = (T + 3) / 4;
    /* The next block (3K floats) is prefetched over the ntile passes of
     * ceil(K8/16) 16-k steps each: pfb bytes, npf lines a step. A step's
     * lines start at q, q+64, ...; as pfb <= 64 * npf, consecutive steps
     * leave no line out. */
    int nsteps = ntile * ((K8 + 15) / 16);
    size_t pfb = nsteps ? ((size_t)3 * K * sizeof(float) + (size_t)nsteps - 1) / (size_t)nsteps : 0;
    int npf = (int)((pfb + 63) / 64);
    if (K8 == 0) memset(acc, 0, sizeof acc);
    int n = n0;
    for (; n + 3 <= n1; n += 3) {
        size_t r0 = (size_t)n * K;
        /* rows n+3 .. n+5 are one contiguous run of 3K floats */
        const char *q = n + 6 <= n1 ? (const char *)(w + r0 + 3 * (size_t)K) : NULL;
        for (int k0 = 0; k0 < K8; k0 += PAIR_KB_LEN) {
            int k1 = K8 - k0 < PAIR_KB_LEN ? K8 : k0 + PAIR_KB_LEN;
            for (int t = 0, i = 0; t < T; t += 4, i++) {
                const float *xt = x + (size_t)t * K;
                switch (T - t < 4 ? T - t : 4) { /* a constant row count keeps acc in registers */
                case 4: pair_kb_tile_4(xt, K, w, r0, k0, k1, acc[i], k0 == 0, &q, pfb, npf); break;
                case 3: pair_kb_tile_3(xt, K, w, r0, k0, k1, acc[i], k0 == 0, &q, pfb, npf); break;
                case 2: pair_kb_tile_2(xt, K, w, r0, k0, k1, acc[i], k0 == 0, &q, pfb, npf); break;
                default: pair_kb_tile_1(xt, K, w, r0, k0, k1, acc[i], k0 == 0, &q, pfb, npf); break;
                }
            }
        }
        /* y[t, n:n+3]: one horizontal sum per row of x, stored as 2 + 1
         * floats (a scalar epilogue through a stack array cost ~15% of the
         * block with the weights in cache: 79 -> 85-87 GFLOP/s). */
        __m128 b3 = bias ? _mm_setr_ps(bias[n], bias[n + 1], bias[n + 2], 0.0f) : _mm_setzero_ps();
        __m256 z = _mm256_setzero_ps();
        for (int t = 0; t < T; t++) {
            const float *a = acc[t >> 2] + 24 * (t & 3);
            __m128 v = _mm_add_ps(hsum4(_mm256_load_ps(a), _mm256_load_ps(a + 8), _mm256_load_ps(a + 16), z), b3);
            float *yp = y + (size_t)t * N + n;
            if (K8 < K) {
                float s[4];
                _mm_storeu_ps(s, v);
                for (int j = 0; j < 3; j++)
                    for (int kk = K8; kk < K; kk++) s[j] += x[(size_t)t * K + kk] * w[r0 + (size_t)j * K + kk];
                v = _mm_loadu_ps(s);
            }
            _mm_storel_pi((__m64 *)yp, v);
            _mm_store_ss(yp + 2, _mm_movehl_ps(v, v));
        }
    }
    for (; n < n1; n++)
        for (int t = 0; t < T; t++)
            y[(size_t)t * N + n] = dot_row(x + (size_t)t * K, w, (size_t)n * K, K, TB_F32) + (bias ? bias[n] : 0.0f);
}

#pragma GCC pop_options

/* 4x2 tiles below 12 rows, 3x4 tiles above (measured crossover); f32 from
 * 5 to 47 rows on k-blocks (pair_kb_f32). */
static AVX2_FN void small_mm(const float *x, const void *w, tb_dtype dt, const float *bias, float *y, int T, int K,
                             int N, int n0, int n1) {
    int pair = T < 12;
    switch (dt) {
    case TB_F32:
        if (T >= 5 && T < PAIR_KB_MAX_T) pair_kb_f32(x, w, bias, y, T, K, N, n0, n1);
        else if (pair) pair_mm_dt(x, w, TB_F32, bias, y, T, K, N, n0, n1);
        else small_mm_dt(x, w, TB_F32, bias, y, T, K, N, n0, n1);
        return;
    case TB_F16:
        if (pair) pair_mm_dt(x, w, TB_F16, bias, y, T, K, N, n0, n1);
        else small_mm_dt(x, w, TB_F16, bias, y, T, K, N, n0, n1);
        return;
    case TB_BF16:
        if (pair) pair_mm_dt(x, w, TB_BF16, bias, y, T, K, N, n0, n1);
        else small_mm_dt(x, w, TB_BF16, bias, y, T, K, N, n0, n1);
        return;
    default: TB_ASSERT(!"unsupported weight dtype");
    }
}

static AVX2_FN void avx2_matmul(const float *x, const void *w, tb_dtype wdt, const float *bias,
                                float *y, int T, int K, int N, int n0, int n1) {
    if (n1 <= n0 || T <= 0) return;
    if (T == 1) {
        switch (wdt) {
        case TB_F32: gemv_f32(x, w, bias, y, K, n0, n1); return;
        case TB_F16: gemv_f16(x, w, bias, y, K, n0, n1); return;
        case TB_BF16: gemv_bf16(x, w, bias, y, K, n0, n1); return;
        default: TB_ASSERT(!"unsupported weight dtype");
        }
    }
    if (T < MS_MAX_T) {
        small_mm(x, w, wdt, bias, y, T, K, N, n0, n1);
        return;
    }
    gemm_packed(x, w, wdt, bias, y, T, K, N, n0, n1);
}

/* ---------------------------------------------------------------- norms */
AVX2_INLINE void rmsnorm_row(const float *x, const float *w, float *y, int D, float eps) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= D; d += 16) {
        __m256 a = _mm256_loadu_ps(x + d), b = _mm256_loadu_ps(x + d + 8);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; d + 8 <= D; d += 8) {
        __m256 a = _mm256_loadu_ps(x + d);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    float ss = hsum(_mm256_add_ps(s0, s1));
    for (; d < D; d++) ss += x[d] * x[d];
    float inv = 1.0f / sqrtf(ss / (float)D + eps);
    __m256 vi = _mm256_set1_ps(inv);
    d = 0;
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(y + d, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), vi),
                                              _mm256_loadu_ps(w + d)));
    for (; d < D; d++) y[d] = x[d] * inv * w[d];
}

static AVX2_FN void avx2_rmsnorm(const float *x, const float *w, float *y, int T, int D, float eps) {
    for (int t = 0; t < T; t++) rmsnorm_row(x + (size_t)t * D, w, y + (size_t)t * D, D, eps);
}

static AVX2_FN void avx2_add(const float *a, const float *b, float *y, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static AVX2_FN void avx2_add_rmsnorm(const float *x, const float *d, const float *w, float *r,
                                     float *y, int T, int D, float eps) {
    for (int t = 0; t < T; t++) {
        size_t o = (size_t)t * D;
        avx2_add(x + o, d + o, r + o, (size_t)D);
        rmsnorm_row(r + o, w, y + o, D, eps);
    }
}

/* ---------------------------------------------------------------- silu */
static AVX2_FN void avx2_silu_mul(const float *gu, float *y, int T, int F) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int t = 0; t < T; t++) {
        const float *g = gu + (size_t)t * 2 * F, *u = g + F;
        float *o = y + (size_t)t * F;
        int i = 0;
        for (; i + 8 <= F; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
        for (; i < F; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* ---------------------------------------------------------------- rope */
#define ROPE_MAX_HALF 512

/* cos/sin of the last position rotated by this thread, and its key */
static _Thread_local float rope_cs[2 * ROPE_MAX_HALF] __attribute__((aligned(32)));
static _Thread_local float rope_sn[2 * ROPE_MAX_HALF] __attribute__((aligned(32)));
static _Thread_local float rope_freq[ROPE_MAX_HALF];
static _Thread_local int rope_pos = -1, rope_half, rope_inter;

static AVX2_FN void avx2_rope(float *x, int row_stride, const int32_t *pos, const float *inv_freq,
                              int T, int n_heads, int hd, int interleaved) {
    int half = hd / 2;
    TB_ASSERT(half <= ROPE_MAX_HALF);
    /* cos/sin per pair; for the interleaved layout each value is stored
     * twice so that lanes line up with (x[2i], x[2i+1]). */
    float *cs = rope_cs, *sn = rope_sn;
    for (int t = 0; t < T; t++) {
        /* every layer of a decode step rotates by the same angles: keep the
         * last position's cos/sin, keyed by everything they depend on */
        int hit = pos[t] == rope_pos && half == rope_half && interleaved == rope_inter &&
                  !memcmp(inv_freq, rope_freq, sizeof(float) * (size_t)half);
        rope_pos = pos[t];
        rope_half = half;
        rope_inter = interleaved;
        if (!hit) memcpy(rope_freq, inv_freq, sizeof(float) * (size_t)half);
        for (int i = 0; i < half && !hit; i++) {
            float a = (float)pos[t] * inv_freq[i];
            float c = cosf(a), s = sinf(a);
            if (interleaved) {
                cs[2 * i] = cs[2 * i + 1] = c;
                sn[2 * i] = sn[2 * i + 1] = s;
            } else {
                cs[i] = c;
                sn[i] = s;
            }
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)t * row_stride + (size_t)h * hd;
            int i = 0;
            if (interleaved) {
                for (; i + 8 <= hd; i += 8) {
                    __m256 xv = _mm256_loadu_ps(v + i);
                    __m256 sw = _mm256_permute_ps(xv, 0xB1); /* (x1, x0, x3, x2, ...) */
                    /* even lanes x0 c - x1 s, odd lanes x1 c + x0 s */
                    __m256 r = _mm256_fmaddsub_ps(xv, _mm256_load_ps(cs + i),
                                                  _mm256_mul_ps(sw, _mm256_load_ps(sn + i)));
                    _mm256_storeu_ps(v + i, r);
                }
                for (; i + 1 < hd; i += 2) {
                    float x0 = v[i], x1 = v[i + 1], c = cs[i], s = sn[i];
                    v[i] = x0 * c - x1 * s;
                    v[i + 1] = x0 * s + x1 * c;
                }
            } else {
                for (; i + 8 <= half; i += 8) {
                    __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + half + i);
                    __m256 c = _mm256_load_ps(cs + i), s = _mm256_load_ps(sn + i);
                    _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                    _mm256_storeu_ps(v + half + i, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
                }
                for (; i < half; i++) {
                    float x0 = v[i], x1 = v[i + half], c = cs[i], s = sn[i];
                    v[i] = x0 * c - x1 * s;
                    v[i + half] = x0 * s + x1 * c;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- attention */
/* KV rows in every cache dtype (core/kv_layout.h). int8 and fp8 rows load
 * their codes, and the row's scale is applied once per dot product (K) or
 * per softmax weight (V), not per element:
 *   int8: sign-extend and convert;
 *   fp8 e4m3: the byte's sign, exponent and mantissa moved into an f16
 *     (sign to bit 15, exponent and mantissa to bits 13..7) is the e4m3 value
 *     times 2^-8, subnormals included, and F16C widens it exactly; the 2^8
 *     is folded into the scale (kv_scale_mul). No table, no gather. */
AVX2_INLINE __m256 kv8(const void *base, size_t i, tb_dtype dt) {
    if (dt == TB_I8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + i))));
    if (dt == TB_FP8_E4M3) {
        /* sign-extended to 16 bits, << 7: the sign lands in bits 15 and 14;
         * clearing bit 14 leaves s.0eeee.mmm0000000 */
        __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)((const uint8_t *)base + i)));
        h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xbfff));
        return _mm256_cvtph_ps(h);
    }
    return ld8(base, i, dt);
}

static inline float kv1(const void *base, size_t i, tb_dtype dt) {
    if (dt == TB_I8) return (float)((const int8_t *)base)[i];
    if (dt == TB_FP8_E4M3) return tb_cpu_fp8_table()[((const uint8_t *)base)[i]] * (1.0f / 256.0f);
    return ld1(base, i, dt);
}

/* What a stored scale is multiplied by to scale kv8's values. */
static inline float kv_scale_mul(tb_dtype dt) { return dt == TB_FP8_E4M3 ? 256.0f : 1.0f; }

/* Prefetches bytes [lo, hi) of each of the n rows (rb bytes apart) of a
 * block: int8 / fp8 rows are short (hd bytes a head), so the rows of a
 * work item's heads are a few lines strided by a whole cache row, which the
 * hardware prefetchers follow poorly. */
AVX2_INLINE void kv_prefetch_block(const uint8_t *blk, size_t rb, int n, size_t lo, size_t hi) {
    for (int r = 0; r < n; r++)
        for (size_t o = lo & ~(size_t)63; o < hi; o += 64) _mm_prefetch((const char *)(blk + (size_t)r * rb + o), _MM_HINT_T0);
}

AVX2_INLINE float dot_kv(const float *q, const void *k, tb_dtype dt, int hd) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv8(k, (size_t)d, dt), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), kv8(k, (size_t)d + 8, dt), a1);
    }
    for (; d + 8 <= hd; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv8(k, (size_t)d, dt), a0);
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; d < hd; d++) s += q[d] * kv1(k, (size_t)d, dt);
    return s;
}

/* out (hd) += p * v (hd). */
AVX2_INLINE void axpy_kv(float *out, float p, const void *v, tb_dtype dt, int hd) {
    __m256 pv = _mm256_set1_ps(p);
    int d = 0;
    for (; d + 8 <= hd; d += 8)
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(pv, kv8(v, (size_t)d, dt), _mm256_loadu_ps(out + d)));
    for (; d < hd; d++) out[d] += p * kv1(v, (size_t)d, dt);
}

AVX2_INLINE void attn_head_dt(const tb_attn_args *a, const float *q, int t, int kvh, float *out,
                              float *scores, float *m_out, float *l_out, tb_dtype dt) {
    int hd = a->hd, bs = a->block_size, ctx = a->pos[t] + 1, quant = tb_kv_quantized(dt);
    size_t esz = tb_kv_elem_bytes(dt);
    size_t rb = (size_t)a->n_kv * hd * esz; /* bytes per cache row */
    size_t blkb = tb_kv_block_bytes(dt, bs, a->n_kv, hd), cb = tb_kv_codes_bytes(dt, bs, a->n_kv, hd);
    float mul = kv_scale_mul(dt);
    const int32_t *bt = a->block_tables + (size_t)a->seq[t] * a->max_blocks;
    const uint8_t *kc = a->k_cache, *vc = a->v_cache;

    float mx = -INFINITY;
    for (int j0 = 0, b = 0; j0 < ctx; j0 += bs, b++) {
        int n = ctx - j0 < bs ? ctx - j0 : bs;
        const uint8_t *kb = kc + (size_t)bt[b] * blkb + (size_t)kvh * hd * esz;
        const float *ks = (const float *)(kc + (size_t)bt[b] * blkb + cb) + kvh;
        for (int r = 0; r < n; r++) {
            float s = a->scale * dot_kv(q, kb + (size_t)r * rb, dt, hd);
            if (quant) s *= ks[(size_t)r * a->n_kv] * mul;
            scores[j0 + r] = s;
            mx = s > mx ? s : mx;
        }
    }
    __m256 vmx = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= ctx; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vmx));
        _mm256_storeu_ps(scores + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum(vsum);
    for (; j < ctx; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    for (int j0 = 0, b = 0; j0 < ctx; j0 += bs, b++) {
        int n = ctx - j0 < bs ? ctx - j0 : bs;
        const uint8_t *vb = vc + (size_t)bt[b] * blkb + (size_t)kvh * hd * esz;
        const float *vs = (const float *)(vc + (size_t)bt[b] * blkb + cb) + kvh;
        for (int r = 0; r < n; r++) {
            float p = scores[j0 + r];
            if (quant) p *= vs[(size_t)r * a->n_kv] * mul;
            axpy_kv(out, p, vb + (size_t)r * rb, dt, hd);
        }
    }
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    int d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), inv));
    for (; d < hd; d++) out[d] *= 1.0f / sum;
    *m_out = mx;
    *l_out = sum;
}

/* The NG rows of a work item (tb_attn_item: q heads of one or several
 * tokens of one sequence) each read their own kv head: koff[g] is the byte
 * offset of row g's kv head within a cache row. Each K and V row is loaded
 * once for all NG rows. Positions run to the largest context of the rows;
 * a row with a shorter one gets zero weights past it. */

/* Scores, 8 positions at a time: scores[g * ss + j] = scale * q_g . k_j. A
 * chunk that runs past the end of a cache block repeats its last row; the
 * extra lanes land in positions a later chunk overwrites, or in the padding
 * past ctx. */
AVX2_INLINE void attn_scores(const tb_attn_args *a, const float *const *q, int NG, const size_t *koff, int ctx,
                             const int32_t *bt, float *scores, size_t ss, tb_dtype dt) {
    int hd = a->hd, bs = a->block_size;
    size_t esz = tb_kv_elem_bytes(dt), rb = (size_t)a->n_kv * hd * esz; /* bytes per cache row */
    size_t blkb = tb_kv_block_bytes(dt, bs, a->n_kv, hd);
    const __m256 scale = _mm256_set1_ps(a->scale); /* int8 / fp8 row scales: attn_row_scales */
    for (int j0 = 0, b = 0; j0 < ctx; j0 += bs, b++) {
        int n = ctx - j0 < bs ? ctx - j0 : bs;
        const uint8_t *kb = (const uint8_t *)a->k_cache + (size_t)bt[b] * blkb;
        /* the next block's rows of these heads: one-byte and two-byte rows
         * (kernels_bench attnkv, 134M, ctx 1024, batch 1, 2 threads, min of
         * 15 rounds: f16 2.6 -> 2.0 ms a step; f32 gains nothing) */
        if ((tb_kv_quantized(dt) || esz == 2) && j0 + bs < ctx)
            kv_prefetch_block((const uint8_t *)a->k_cache + (size_t)bt[b + 1] * blkb, rb, bs, koff[0],
                              koff[NG - 1] + (size_t)hd * esz);
        for (int r = 0; r < n; r += 8) {
            const uint8_t *kr[8];
            if (r + 8 <= n) {
                const uint8_t *k0 = kb + (size_t)r * rb;
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) kr[i] = k0 + (size_t)i * rb;
            } else {
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) kr[i] = kb + (size_t)(r + i < n ? r + i : n - 1) * rb;
            }
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++) {
                const float *qg = q[g];
                __m256 p[8];
                if (hd == 8) {
                    __m256 qv = _mm256_loadu_ps(qg);
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) p[i] = _mm256_mul_ps(qv, kv8(kr[i] + koff[g], 0, dt));
                } else {
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) p[i] = _mm256_setzero_ps();
                    for (int d = 0; d < hd; d += 8) {
                        __m256 qv = _mm256_loadu_ps(qg + d);
#pragma GCC unroll 8
                        for (int i = 0; i < 8; i++)
                            p[i] = _mm256_fmadd_ps(qv, kv8(kr[i] + koff[g], (size_t)d, dt), p[i]);
                    }
                }
                _mm256_storeu_ps(scores + g * ss + j0 + r, _mm256_mul_ps(hsum8x8(p), scale));
            }
        }
    }
}

/* attn_scores and attn_pv for int8 / fp8 rows that share kv heads (GQA
 * groups, several tokens of a prefill): each K row chunk and V row slice is
 * widened once per distinct kv head (nu of them at offsets ukoff; row g
 * reads head ug[g]), not once per row. hd % 8 == 0, hd <= ATTN_SHARED_MAX_HD. */
#define ATTN_SHARED_MAX_HD 128
AVX2_INLINE void attn_scores_shared(const tb_attn_args *a, const float *const *q, int NG, const size_t *ukoff, int nu,
                                    const int *ug, int ctx, const int32_t *bt, float *scores, size_t ss,
                                    tb_dtype dt) {
    int hd = a->hd, bs = a->block_size;
    size_t esz = tb_kv_elem_bytes(dt), rb = (size_t)a->n_kv * hd * esz;
    size_t blkb = tb_kv_block_bytes(dt, bs, a->n_kv, hd);
    const __m256 scale = _mm256_set1_ps(a->scale);
    /* (nu, 8 positions, hd) widened K rows of one chunk */
    float kbuf[TB_ATTN_GROUP_MAX * 8 * ATTN_SHARED_MAX_HD] __attribute__((aligned(32)));
    for (int j0 = 0, b = 0; j0 < ctx; j0 += bs, b++) {
        int n = ctx - j0 < bs ? ctx - j0 : bs;
        const uint8_t *kb = (const uint8_t *)a->k_cache + (size_t)bt[b] * blkb;
        if (j0 + bs < ctx)
            kv_prefetch_block((const uint8_t *)a->k_cache + (size_t)bt[b + 1] * blkb, rb, bs, ukoff[0],
                              ukoff[nu - 1] + (size_t)hd * esz);
        for (int r = 0; r < n; r += 8) {
            for (int u = 0; u < nu; u++)
                for (int i = 0; i < 8; i++) {
                    const uint8_t *kr = kb + (size_t)(r + i < n ? r + i : n - 1) * rb + ukoff[u];
                    float *dst = kbuf + ((size_t)u * 8 + (size_t)i) * hd;
                    for (int d = 0; d < hd; d += 8) _mm256_store_ps(dst + d, kv8(kr, (size_t)d, dt));
                }
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++) {
                const float *qg = q[g], *ku = kbuf + (size_t)ug[g] * 8 * hd;
                __m256 p[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) p[i] = _mm256_setzero_ps();
                for (int d = 0; d < hd; d += 8) {
                    __m256 qv = _mm256_loadu_ps(qg + d);
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) p[i] = _mm256_fmadd_ps(qv, _mm256_load_ps(ku + (size_t)i * hd + d), p[i]);
                }
                _mm256_storeu_ps(scores + g * ss + j0 + r, _mm256_mul_ps(hsum8x8(p), scale));
            }
        }
    }
}

AVX2_INLINE void attn_pv_shared(const tb_attn_args *a, int NG, const size_t *ukoff, int nu, const int *ug, int ctx,
                                const int32_t *bt, const float *p, size_t ss, const float *sums, float *const *out,
                                tb_dtype dt) {
    int hd = a->hd, bs = a->block_size;
    size_t esz = tb_kv_elem_bytes(dt), rb = (size_t)a->n_kv * hd * esz, blkb = tb_kv_block_bytes(dt, bs, a->n_kv, hd);
    for (int d = 0; d < hd; d += 8) {
        __m256 acc[TB_ATTN_GROUP_MAX], v[TB_ATTN_GROUP_MAX];
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) acc[g] = _mm256_setzero_ps();
        for (int j0 = 0, b = 0; j0 < ctx; j0 += bs, b++) {
            int n = ctx - j0 < bs ? ctx - j0 : bs;
            const uint8_t *vb = (const uint8_t *)a->v_cache + (size_t)bt[b] * blkb + (size_t)d * esz;
            const float *pj = p + j0;
            for (int r = 0; r < n; r++) {
                const uint8_t *vr = vb + (size_t)r * rb;
                for (int u = 0; u < nu; u++) v[u] = kv8(vr + ukoff[u], 0, dt);
#pragma GCC unroll 8
                for (int g = 0; g < NG; g++)
                    acc[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(pj + g * ss + r), v[ug[g]], acc[g]);
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(out[g] + d, _mm256_mul_ps(acc[g], _mm256_set1_ps(1.0f / sums[g])));
    }
}

/* s[0:n) = exp(s - max s); returns the sum, and the max through *mx_out. */
AVX2_INLINE float softmax_unnorm(float *s, int n, float *mx_out) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float mx = _mm_cvtss_f32(m4);
    for (; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    *mx_out = mx;
    __m256 vmx = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
    j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum(vsum);
    for (; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

/* out[g, :] = sum_j p_g[j] v_j / sums[g], one 8-column slice of the heads
 * at a time, positions in the outer loop so that each V row is used for all
 * NG heads at once; NS accumulators per head take positions in turn so that
 * the FMA latency does not bound the loop. */
AVX2_INLINE void attn_pv(const tb_attn_args *a, int NG, int NS, const size_t *koff, int ctx,
                         const int32_t *bt, const float *p, size_t ss, const float *sums, float *const *out,
                         tb_dtype dt) {
    int hd = a->hd, bs = a->block_size;
    size_t esz = tb_kv_elem_bytes(dt), rb = (size_t)a->n_kv * hd * esz, blkb = tb_kv_block_bytes(dt, bs, a->n_kv, hd);
    for (int d = 0; d < hd; d += 8) {
        __m256 acc[TB_ATTN_GROUP_MAX][4];
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
            for (int u = 0; u < NS; u++) acc[g][u] = _mm256_setzero_ps();
        for (int j0 = 0, b = 0; j0 < ctx; j0 += bs, b++) {
            int n = ctx - j0 < bs ? ctx - j0 : bs;
            const uint8_t *vb = (const uint8_t *)a->v_cache + (size_t)bt[b] * blkb + (size_t)d * esz;
            const float *pj = p + j0;
            int r = 0;
            for (; r + NS <= n; r += NS) {
#pragma GCC unroll 4
                for (int u = 0; u < NS; u++) {
                    const uint8_t *vr = vb + (size_t)(r + u) * rb;
#pragma GCC unroll 8
                    for (int g = 0; g < NG; g++)
                        acc[g][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(pj + g * ss + r + u), kv8(vr + koff[g], 0, dt),
                                                    acc[g][u]);
                }
            }
            for (; r < n; r++) {
                const uint8_t *vr = vb + (size_t)r * rb;
#pragma GCC unroll 8
                for (int g = 0; g < NG; g++)
                    acc[g][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(pj + g * ss + r), kv8(vr + koff[g], 0, dt),
                                                acc[g][0]);
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) {
            __m256 s = acc[g][0];
#pragma GCC unroll 4
            for (int u = 1; u < NS; u++) s = _mm256_add_ps(s, acc[g][u]);
            _mm256_storeu_ps(out[g] + d, _mm256_mul_ps(s, _mm256_set1_ps(1.0f / sums[g])));
        }
    }
}

/* attn_pv for hd % 64 == 0 and rows that each read their own kv head
 * (decode): one row at a time, 64 columns of it in 8 accumulators,
 * positions in the inner loop, so that each V row segment (256 B in f32) is
 * read whole and in order, where attn_pv's 8-column passes touch one line
 * of every row per pass. kernels_bench attn8 (134M, batch 8, f32 cache from
 * DRAM, ms per step): ctx 96 2.5 -> 2.0-2.25, ctx 160 4.15 -> 3.5-3.7.
 * Rows that share a kv head (GQA, prefill) keep attn_pv, which loads each V
 * row once for all of them. */
AVX2_INLINE void attn_pv64(const tb_attn_args *a, int NG, const size_t *koff, int ctx, const int32_t *bt,
                           const float *p, size_t ss, const float *sums, float *const *out, tb_dtype dt) {
    int hd = a->hd, bs = a->block_size;
    size_t esz = tb_kv_elem_bytes(dt), rb = (size_t)a->n_kv * hd * esz, blkb = tb_kv_block_bytes(dt, bs, a->n_kv, hd);
    for (int g = 0; g < NG; g++) {
        const float *pg = p + g * ss;
        for (int d = 0; d < hd; d += 64) {
            __m256 acc[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
            for (int j0 = 0, b = 0; j0 < ctx; j0 += bs, b++) {
                int n = ctx - j0 < bs ? ctx - j0 : bs;
                const uint8_t *vr = (const uint8_t *)a->v_cache + (size_t)bt[b] * blkb + koff[g] + (size_t)d * esz;
                if ((tb_kv_quantized(dt) || esz == 2) && j0 + bs < ctx)
                    kv_prefetch_block((const uint8_t *)a->v_cache + (size_t)bt[b + 1] * blkb, rb, bs, koff[g] + (size_t)d * esz,
                                      koff[g] + (size_t)(d + 64) * esz);
                for (int r = 0; r < n; r++, vr += rb) {
                    __m256 pv = _mm256_broadcast_ss(pg + j0 + r);
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(pv, kv8(vr, (size_t)i * 8, dt), acc[i]);
                }
            }
            __m256 inv = _mm256_set1_ps(1.0f / sums[g]);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(out[g] + d + 8 * i, _mm256_mul_ps(acc[i], inv));
        }
    }
}

/* scores[g * ss + j] *= the scale of row j of row g's kv head in `cache`
 * (int8 / fp8), for j < row g's context: once per position, where applying
 * it in attn_scores took a gather per 8 positions and head. */
AVX2_INLINE void attn_row_scales(const tb_attn_args *a, const tb_attn_item *it, int NG, const int32_t *bt,
                                 const void *cache, float *scores, size_t ss, tb_dtype dt) {
    int bs = a->block_size;
    size_t blkb = tb_kv_block_bytes(dt, bs, a->n_kv, a->hd), cb = tb_kv_codes_bytes(dt, bs, a->n_kv, a->hd);
    float mul = kv_scale_mul(dt);
    for (int g = 0; g < NG; g++) {
        int c = a->pos[it->t[g]] + 1;
        float *pg = scores + g * ss;
        for (int j0 = 0, b = 0; j0 < c; j0 += bs, b++) {
            const float *sc = (const float *)((const uint8_t *)cache + (size_t)bt[b] * blkb + cb) + it->kvh[g];
            int n = c - j0 < bs ? c - j0 : bs;
            for (int r = 0; r < n; r++) pg[j0 + r] *= sc[(size_t)r * a->n_kv] * mul;
        }
    }
}

/* hd % 8 == 0. */
AVX2_INLINE void attn_rows_fast(const tb_attn_args *a, const tb_attn_item *it, int NG, int NS, float *scores,
                                tb_dtype dt) {
    size_t esz = tb_kv_elem_bytes(dt);
    const int32_t *bt = a->block_tables + (size_t)it->seq * a->max_blocks;
    float sums[TB_ATTN_GROUP_MAX];
    size_t koff[TB_ATTN_GROUP_MAX];
    int ctx = 0;
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++) {
        koff[g] = (size_t)it->kvh[g] * a->hd * esz;
        int c = a->pos[it->t[g]] + 1;
        ctx = c > ctx ? c : ctx;
    }
    size_t ss = (size_t)(ctx + 15) & ~(size_t)7; /* >= ctx + 8 */
    /* int8 / fp8 rows that share kv heads: widen each row once (attn_*_shared) */
    size_t ukoff[TB_ATTN_GROUP_MAX];
    int ug[TB_ATTN_GROUP_MAX], nu = 0;
    if (tb_kv_quantized(dt) && a->hd <= ATTN_SHARED_MAX_HD)
        for (int g = 0; g < NG; g++) {
            int u = 0;
            while (u < nu && ukoff[u] != koff[g]) u++;
            if (u == nu) ukoff[nu++] = koff[g];
            ug[g] = u;
        }
    int shared = nu > 0 && nu < NG;
    if (shared) { /* ukoff ascending, for the prefetch's range */
        for (int i = 1; i < nu; i++)
            for (int k = i; k > 0 && ukoff[k - 1] > ukoff[k]; k--) {
                size_t t = ukoff[k]; ukoff[k] = ukoff[k - 1]; ukoff[k - 1] = t;
                for (int g = 0; g < NG; g++) ug[g] = ug[g] == k ? k - 1 : ug[g] == k - 1 ? k : ug[g];
            }
        attn_scores_shared(a, it->q, NG, ukoff, nu, ug, ctx, bt, scores, ss, dt);
    } else {
        attn_scores(a, it->q, NG, koff, ctx, bt, scores, ss, dt);
    }
    if (tb_kv_quantized(dt)) attn_row_scales(a, it, NG, bt, a->k_cache, scores, ss, dt); /* K rows' scales */
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++) {
        int c = a->pos[it->t[g]] + 1;
        float mx;
        sums[g] = softmax_unnorm(scores + g * ss, c, &mx);
        if (it->m) { it->m[g] = mx; it->l[g] = sums[g]; }
        for (int j = c; j < ctx; j++) scores[g * ss + j] = 0.0f; /* causal: later positions */
    }
    if (tb_kv_quantized(dt)) attn_row_scales(a, it, NG, bt, a->v_cache, scores, ss, dt); /* V rows' */
    int distinct = a->hd % 64 == 0;
#pragma GCC unroll 8
    for (int g = 1; g < NG; g++) distinct &= koff[g] != koff[g - 1];
    if (shared) attn_pv_shared(a, NG, ukoff, nu, ug, ctx, bt, scores, ss, sums, it->out, dt);
    else if (distinct) attn_pv64(a, NG, koff, ctx, bt, scores, ss, sums, it->out, dt);
    else attn_pv(a, NG, NS, koff, ctx, bt, scores, ss, sums, it->out, dt);
}

#define ATTN_ROWS_FNS(DT, SUF)                                                                      \
    static AVX2_FN void attn_rows_##SUF(const tb_attn_args *a, const tb_attn_item *it, float *scores) { \
        if (a->hd % 8) {                                                                            \
            for (int g = 0; g < it->n; g++) {                                                       \
                float m, l;                                                                         \
                attn_head_dt(a, it->q[g], it->t[g], it->kvh[g], it->out[g], scores, &m, &l, DT);    \
                if (it->m) { it->m[g] = m; it->l[g] = l; }                                          \
            }                                                                                       \
            return;                                                                                 \
        }                                                                                           \
        switch (it->n) {                                                                            \
        case 1: attn_rows_fast(a, it, 1, 4, scores, DT); break;                                     \
        case 2: attn_rows_fast(a, it, 2, 4, scores, DT); break;                                     \
        case 3: attn_rows_fast(a, it, 3, 2, scores, DT); break;                                     \
        case 4: attn_rows_fast(a, it, 4, 2, scores, DT); break;                                     \
        case 5: attn_rows_fast(a, it, 5, 1, scores, DT); break;                                     \
        case 6: attn_rows_fast(a, it, 6, 1, scores, DT); break;                                     \
        case 7: attn_rows_fast(a, it, 7, 1, scores, DT); break;                                     \
        case 8: attn_rows_fast(a, it, 8, 1, scores, DT); break;                                     \
        default: TB_ASSERT(!"more rows than TB_ATTN_GROUP_MAX");                                   \
        }                                                                                           \
    }
ATTN_ROWS_FNS(TB_F32, f32)
ATTN_ROWS_FNS(TB_F16, f16)
ATTN_ROWS_FNS(TB_BF16, bf16)
ATTN_ROWS_FNS(TB_I8, i8)
ATTN_ROWS_FNS(TB_FP8_E4M3, fp8)

static AVX2_FN void avx2_attn_rows(const tb_attn_args *a, const tb_attn_item *it, float *scores) {
    switch (a->kv_dtype) {
    case TB_F16: attn_rows_f16(a, it, scores); break;
    case TB_BF16: attn_rows_bf16(a, it, scores); break;
    case TB_I8: attn_rows_i8(a, it, scores); break;
    case TB_FP8_E4M3: attn_rows_fp8(a, it, scores); break;
    default: attn_rows_f32(a, it, scores); break;
    }
}

/* ---------------------------------------------------------------- table */
const tb_cpu_kernel_table tb_cpu_kernels_avx2 = {
    .name = "avx2",
    .matmul = avx2_matmul,
    .to_f32 = avx2_to_f32,
    .from_f32 = avx2_from_f32,
    .rmsnorm = avx2_rmsnorm,
    .add_rmsnorm = avx2_add_rmsnorm,
    .silu_mul = avx2_silu_mul,
    .add = avx2_add,
    .rope = avx2_rope,
    .attn_rows = avx2_attn_rows,
};
