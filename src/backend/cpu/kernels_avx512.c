/*
 * kernels_avx512.c — the AVX-512F path: the matmul kernels of
 * kernels_avx2.c with 16-lane registers and mask registers for the tails.
 * Same structure: a 4-row GEMV for T == 1, a 4x3 dot-product microkernel
 * for small T, a packed 6x32 outer-product kernel for T >= 16. The other ops are bandwidth-bound or tiny and come
 * from the AVX2 table (entries left NULL here).
 */
#include "backend/cpu/kernels.h"

#include <immintrin.h>

#define AVX512_INLINE static inline __attribute__((target("avx512f,avx2,fma,f16c"), always_inline))
#define AVX512_FN __attribute__((target("avx512f,avx2,fma,f16c")))

/* ---------------------------------------------------------------- helpers */

/* 16 elements of a weight row from element i, as f32. */
AVX512_INLINE __m512 ld16(const void *base, size_t i, tb_dtype dt) {
    if (dt == TB_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    if (dt == TB_BF16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    return _mm512_loadu_ps((const float *)base + i);
}

static inline float ld1(const void *base, size_t i, tb_dtype dt) {
    if (dt == TB_F16) return tb_f16_to_f32(((const uint16_t *)base)[i]);
    if (dt == TB_BF16) return tb_bf16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

static AVX512_FN void avx512_to_f32(const void *src, tb_dtype sdt, float *dst, size_t n) {
    size_t i = 0;
    if (sdt == TB_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    TB_ASSERT(sdt == TB_F16 || sdt == TB_BF16);
    if (sdt == TB_F16)
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld16(src, i, TB_F16));
    else
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld16(src, i, TB_BF16));
    for (; i < n; i++) dst[i] = ld1(src, i, sdt);
}

/* ---------------------------------------------------------------- GEMV (T = 1) */
/* 16-bit weights (the f16 LM head of quantized engines: 49 MB of the 94 MB
 * of weights a 134M int4 engine reads per token) are prefetched in
 * software, 8 KiB ahead in the stream of 4-row blocks: a row of 768 f16 is
 * 1.5 KiB and each step reads half a cache line of each row, too little for
 * the hardware prefetcher to keep enough lines in flight (the distance of
 * qgemm_avx512.c). Measured in docs/PERFORMANCE.md, "Quantized kernels". */
enum { gemv_pf_dist = 8192 };

AVX512_INLINE void gemv_dt(const float *x, const void *w, tb_dtype dt, const float *bias,
                           float *y, int K, int n0, int n1) {
    int K16 = K & ~15;
    int n = n0;
    size_t esz = dt == TB_F32 ? 4 : 2;
    for (; n + 4 <= n1; n += 4) {
        size_t r0 = (size_t)n * K, r1 = r0 + K, r2 = r1 + K, r3 = r2 + K;
        __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
        __m512 c = _mm512_setzero_ps(), d = _mm512_setzero_ps();
        /* the 4 rows are 4 * K * 2 contiguous bytes; each step consumes
         * 4 * 16 * 2 of them and prefetches as many, further on */
        const char *pf = (const char *)w + r0 * esz + gemv_pf_dist;
        for (int k = 0; k < K16; k += 16) {
            if (dt != TB_F32) {
                _mm_prefetch(pf + (size_t)k * 8, _MM_HINT_T0);
                _mm_prefetch(pf + (size_t)k * 8 + 64, _MM_HINT_T0);
            }
            __m512 xv = _mm512_loadu_ps(x + k);
            a = _mm512_fmadd_ps(ld16(w, r0 + k, dt), xv, a);
            b = _mm512_fmadd_ps(ld16(w, r1 + k, dt), xv, b);
            c = _mm512_fmadd_ps(ld16(w, r2 + k, dt), xv, c);
            d = _mm512_fmadd_ps(ld16(w, r3 + k, dt), xv, d);
        }
        float s[4] = {_mm512_reduce_add_ps(a), _mm512_reduce_add_ps(b), _mm512_reduce_add_ps(c),
                      _mm512_reduce_add_ps(d)};
        for (int k = K16; k < K; k++) {
            s[0] += x[k] * ld1(w, r0 + k, dt);
            s[1] += x[k] * ld1(w, r1 + k, dt);
            s[2] += x[k] * ld1(w, r2 + k, dt);
            s[3] += x[k] * ld1(w, r3 + k, dt);
        }
        for (int j = 0; j < 4; j++) y[n + j] = s[j] + (bias ? bias[n + j] : 0.0f);
    }
    for (; n < n1; n++) {
        size_t r = (size_t)n * K;
        __m512 a = _mm512_setzero_ps();
        for (int k = 0; k < K16; k += 16) a = _mm512_fmadd_ps(ld16(w, r + k, dt), _mm512_loadu_ps(x + k), a);
        float s = _mm512_reduce_add_ps(a);
        for (int k = K16; k < K; k++) s += x[k] * ld1(w, r + k, dt);
        y[n] = s + (bias ? bias[n] : 0.0f);
    }
}

/* ---------------------------------------------------------------- GEMM (prefill) */
/* ---- packed GEMM (T >= TB_CPU_GEMM_MIN_T): the 6x32 outer-product form of the
 * AVX2 6x16 kernel: (KC, 32) panels of w transposed to f32, two zmm loads
 * and 6 broadcasts of x per k, 12 accumulators. */
#define MP_MR 6
#define MP_NR 32
#define MP_KC 256
#define MP_NC 128

/* the packed panel: per-thread scratch from tb_cpu_thread_panel() */
_Static_assert(MP_NC * MP_KC * sizeof(float) <= TB_CPU_PANEL_BYTES, "panel exceeds the per-thread scratch");

static AVX512_FN void mp_pack(float *mp_panel, const void *w, tb_dtype wdt, int K, int n0, int nn, int k0,
                               int kc) {
    float row[MP_KC] __attribute__((aligned(64)));
    size_t esz = tb_dtype_size(wdt);
    int nnr = (nn + MP_NR - 1) / MP_NR * MP_NR;
    for (int j = 0; j < nnr; j++) {
        float *dst = mp_panel + (size_t)(j / MP_NR) * kc * MP_NR + (j % MP_NR);
        if (j < nn) {
            avx512_to_f32((const uint8_t *)w + ((size_t)(n0 + j) * K + k0) * esz, wdt, row, (size_t)kc);
            for (int k = 0; k < kc; k++) dst[(size_t)k * MP_NR] = row[k];
        } else {
            for (int k = 0; k < kc; k++) dst[(size_t)k * MP_NR] = 0.0f;
        }
    }
}

AVX512_INLINE void mp_micro(int mr, const float *x, size_t ldx, const float *pw, int kc, float *y,
                            size_t ldy, int nr, int first, const float *bias) {
    __m512 acc[MP_MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MP_MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(pw + (size_t)k * MP_NR), b1 = _mm512_load_ps(pw + (size_t)k * MP_NR + 16);
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) {
            __m512 a = _mm512_set1_ps(x[i * ldx + k]);
            acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
    }
    /* lanes [0, nr) of the two halves */
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1);
    __m512 bb0 = _mm512_setzero_ps(), bb1 = _mm512_setzero_ps();
    if (first && bias) {
        bb0 = _mm512_maskz_loadu_ps(m0, bias);
        bb1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    }
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++) {
        float *o = y + i * ldy;
        __m512 c0 = first ? bb0 : _mm512_maskz_loadu_ps(m0, o);
        __m512 c1 = first ? bb1 : _mm512_maskz_loadu_ps(m1, o + 16);
        _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(c0, acc[i][0]));
        _mm512_mask_storeu_ps(o + 16, m1, _mm512_add_ps(c1, acc[i][1]));
    }
}

#define MP_CASE(MR)                                                           \
    case MR: mp_micro(MR, x, ldx, pw, kc, y, ldy, nr, first, bias); break;

static AVX512_FN void mp_micro_any(int mr, const float *x, size_t ldx, const float *pw, int kc,
                                   float *y, size_t ldy, int nr, int first, const float *bias) {
    switch (mr) {
        MP_CASE(1) MP_CASE(2) MP_CASE(3) MP_CASE(4) MP_CASE(5) MP_CASE(6)
    default: TB_ASSERT(!"bad microkernel shape");
    }
}

static AVX512_FN void gemm_packed(const float *x, const void *w, tb_dtype wdt, const float *bias,
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

static AVX512_FN void avx512_matmul(const float *x, const void *w, tb_dtype wdt, const float *bias,
                                    float *y, int T, int K, int N, int n0, int n1) {
    if (n1 <= n0 || T <= 0) return;
    if (T == 1) {
        switch (wdt) {
        case TB_F32: gemv_dt(x, w, TB_F32, bias, y, K, n0, n1); return;
        case TB_F16: gemv_dt(x, w, TB_F16, bias, y, K, n0, n1); return;
        case TB_BF16: gemv_dt(x, w, TB_BF16, bias, y, K, n0, n1); return;
        default: TB_ASSERT(!"unsupported weight dtype");
        }
    }
    if (T < TB_CPU_GEMM_MIN_T) {
        /* Decode batches are bound by streaming the weights: the AVX2
         * register tiles already do that once per step (measured on AVX2;
         * the 512-bit packed form only pays off at prefill sizes). */
        tb_cpu_kernels_avx2.matmul(x, w, wdt, bias, y, T, K, N, n0, n1);
        return;
    }
    gemm_packed(x, w, wdt, bias, y, T, K, N, n0, n1);
}

const tb_cpu_kernel_table tb_cpu_kernels_avx512 = {
    .name = "avx512",
    .matmul = avx512_matmul,
    .to_f32 = avx512_to_f32,
};
