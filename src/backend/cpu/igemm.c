/*
 * igemm.c — the int8 GEMM of igemm.h: the scalar reference, the packing
 * (one layout for every path: igemm_impl.h), the dispatch over the paths
 * (AVX-512 VNNI in igemm_avx512.c, AVX2 in igemm_avx2.c, the portable one
 * here), the split over the pool, and tb_cpu_quantize_u8.
 *
 * The path follows tb_cpu_kernel_path() (so tb_cpu_kernel_force_path and
 * TB_CPU_MASK apply): "avx512" with VNNI (+BW, VL) runs 512-bit vpdpbusd;
 * "avx512" without VNNI and "avx2" run 256-bit vpdpbusd where the CPU has
 * AVX-VNNI, else the int16 AVX2 kernel; "scalar" the portable loops.
 */
#include "backend/cpu/igemm_impl.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/nn_conv_impl.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int64_t kgroups(int64_t K) { return (K + 3) / 4; }
static int64_t blocks16(int64_t N) { return (N + 15) / 16; }

size_t tb_cpu_igemm_packed_bytes(int64_t N, int64_t K) {
    int64_t nb = blocks16(N);
    return (size_t)(nb * kgroups(K) * 64) + (size_t)(nb * 16) * sizeof(int32_t);
}

void tb_cpu_igemm_pack(const int8_t *W, int64_t ldw, int64_t N, int64_t K, void *dst) {
    int64_t nb = blocks16(N), Kg = kgroups(K);
    int8_t *blk = dst;
    int32_t *sums = (int32_t *)(blk + nb * Kg * 64);
    memset(dst, 0, tb_cpu_igemm_packed_bytes(N, K));
    for (int64_t n = 0; n < N; n++) {
        int8_t *d = blk + (n / 16) * Kg * 64 + (n % 16) * 4;
        const int8_t *w = W + n * ldw;
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) {
            d[(k / 4) * 64 + k % 4] = w[k];
            s += w[k];
        }
        sums[n] = s;
    }
}

/* ---------------------------------------------------------------- quantize */

static void quantize_scalar(const float *x, uint8_t *q, int64_t n, float inv_scale, int zero) {
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] * inv_scale) + (float)zero; /* default rounding mode: half to even */
        q[i] = (uint8_t)(v > 0.f ? (v < 255.f ? v : 255.f) : 0.f); /* NaN: 0 */
    }
}

/* The same formula 16 (8) at a time: roundscale / round_ps to nearest even,
 * the clamp in float (max / min give 0 for NaN, like the scalar test), so
 * every element equals quantize_scalar's. */
__attribute__((target("avx512f,avx512bw"))) static void quantize_avx512(const float *x, uint8_t *q, int64_t n,
                                                                        float inv_scale, int zero) {
    __m512 vi = _mm512_set1_ps(inv_scale), vz = _mm512_set1_ps((float)zero), lo = _mm512_setzero_ps(),
           hi = _mm512_set1_ps(255.f);
    int64_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vi);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        _mm512_mask_cvtepi32_storeu_epi8(q + i, k, _mm512_cvtps_epi32(v));
    }
}

__attribute__((target("avx2,fma"))) static void quantize_avx2(const float *x, uint8_t *q, int64_t n, float inv_scale,
                                                              int zero) {
    __m256 vi = _mm256_set1_ps(inv_scale), vz = _mm256_set1_ps((float)zero), lo = _mm256_setzero_ps(),
           hi = _mm256_set1_ps(255.f);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i r[4];
        for (int u = 0; u < 4; u++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * u), vi);
            v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
            /* max(v, 0): NaN in v gives 0 */
            r[u] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
        }
        /* packs work per 128-bit lane: the permute puts the 32 bytes back in order */
        __m256i w = _mm256_packus_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + i), w);
    }
    quantize_scalar(x + i, q + i, n - i, inv_scale, zero);
}

static int has_avxvnni(void) {
    static int v = -1; /* racing first calls store the same value */
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1) &&
            (tb_cpu_features() & (TB_CPU_AVX2 | TB_CPU_FMA)) == (TB_CPU_AVX2 | TB_CPU_FMA);
    }
    return v;
}

static _Atomic int avxvnni_allowed = 1;

int tb_cpu_igemm_allow_avxvnni(int allow) { return atomic_exchange(&avxvnni_allowed, allow ? 1 : 0); }

static int vnni_ok(void) {
    uint32_t f = tb_cpu_features();
    return !strcmp(tb_cpu_kernel_path(), "avx512") && (f & TB_CPU_AVX512BW) && (f & TB_CPU_AVX512VL) &&
           tb_cpu_has_avx512vnni();
}

void tb_cpu_quantize_u8(const float *x, uint8_t *q, int64_t n, float inv_scale, int zero) {
    const char *p = tb_cpu_kernel_path();
    if (!strcmp(p, "avx512") && (tb_cpu_features() & TB_CPU_AVX512BW))
        quantize_avx512(x, q, n, inv_scale, zero);
    else if (!strcmp(p, "avx512") || !strcmp(p, "avx2"))
        quantize_avx2(x, q, n, inv_scale, zero);
    else
        quantize_scalar(x, q, n, inv_scale, zero);
}

/* ---------------------------------------------------------------- reference */

void tb_ref_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const int8_t *W, int64_t ldw, const float *w_scale, float *Y, int64_t ldy,
                  const tb_cpu_sgemm_epi *epi) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const uint8_t *a = A + m * lda;
            const int8_t *w = W + n * ldw;
            int32_t acc = 0, s = 0;
            for (int64_t k = 0; k < K; k++) {
                acc += (int32_t)a[k] * (int32_t)w[k];
                s += w[k];
            }
            acc -= a_zero * s;
            Y[m * ldy + n] = (float)acc * (a_scale * w_scale[n]);
        }
    if (epi) tb_cpu_nn_epilogue(Y, ldy, M, N, epi);
}

/* ---------------------------------------------------------------- shared pieces */

void tb_cpu_igemm_pack_a(const uint8_t *A, int64_t lda, int64_t K, int mr, int elem, void *dst) {
    int64_t Kf = K / 4, Kg = kgroups(K);
    for (int r = 0; r < mr; r++) {
        const uint8_t *a = A + r * lda;
        if (elem == 1) {
            uint32_t *d = (uint32_t *)dst + r;
            for (int64_t g = 0; g < Kf; g++) {
                uint32_t v;
                memcpy(&v, a + 4 * g, 4);
                d[g * mr] = v;
            }
            if (Kf < Kg) {
                uint32_t v = 0;
                memcpy(&v, a + 4 * Kf, (size_t)(K - 4 * Kf));
                d[Kf * mr] = v;
            }
        } else {
            uint16_t *d = (uint16_t *)dst + 4 * r;
            for (int64_t g = 0; g < Kg; g++)
                for (int i = 0; i < 4; i++) d[g * mr * 4 + i] = 4 * g + i < K ? a[4 * g + i] : 0;
        }
    }
}

typedef struct {
    void *p;
    size_t cap;
} igemm_scratch;

static pthread_key_t is_key;
static pthread_once_t is_once = PTHREAD_ONCE_INIT;

static void is_free(void *v) {
    igemm_scratch *b = v;
    tb_free_aligned(b->p);
    free(b);
}
static void is_key_create(void) { TB_ASSERT(pthread_key_create(&is_key, is_free) == 0); }

/* Its own key, not tb_cpu_qscratch: a caller may hold A in that one. */
void *tb_cpu_igemm_scratch(size_t bytes) {
    pthread_once(&is_once, is_key_create);
    igemm_scratch *b = pthread_getspecific(is_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        TB_ASSERT(b && "out of memory for int8 GEMM scratch");
        pthread_setspecific(is_key, b);
    }
    if (b->cap < bytes) {
        tb_free_aligned(b->p);
        b->cap = bytes < 65536 ? 65536 : bytes + bytes / 4;
        b->p = tb_alloc_aligned(b->cap, 64);
        TB_ASSERT(b->p && "out of memory for int8 GEMM scratch");
    }
    return b->p;
}

void tb_cpu_igemm_tile_epi(const tb_igemm_job *j, int64_t m, int64_t n, int64_t mr, int64_t nw) {
    if (!j->epi) return;
    tb_cpu_sgemm_epi e = *j->epi; /* move the bias and residual reads to the tile */
    if (e.bias) e.bias += m * e.bias_rs + n * e.bias_cs;
    if (e.res) e.res += m * e.ld_res + n;
    tb_cpu_nn_epilogue(j->Y + m * j->ldy + n, j->ldy, mr, nw, &e);
}

void tb_cpu_igemm_blocks(int64_t K, int mr_tile, int nv_tile, int elem, int64_t *mc, int64_t *nb) {
    int64_t kb = kgroups(K) * 4 * elem; /* bytes of one packed row of A */
    int64_t m = (128 * 1024 / kb) / mr_tile * mr_tile;
    *mc = m < mr_tile ? mr_tile : m;
    int64_t b = (384 * 1024 / (kgroups(K) * 64)) / nv_tile * nv_tile;
    *nb = b < nv_tile ? nv_tile : b;
}

/* ---------------------------------------------------------------- portable path */

static void range_scalar(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1) {
    int64_t n1 = b1 * 16 < j->N ? b1 * 16 : j->N;
    for (int64_t m = m0; m < m1; m++) {
        const uint8_t *a = j->A + m * j->lda;
        for (int64_t n = b0 * 16; n < n1; n++) {
            const int8_t *w = j->W + (n / 16) * j->Kg * 64 + (n % 16) * 4;
            int32_t acc = 0;
            for (int64_t k = 0; k < j->K; k++) acc += (int32_t)a[k] * (int32_t)w[(k / 4) * 64 + k % 4];
            acc -= j->a_zero * j->wsum[n];
            j->Y[m * j->ldy + n] = (float)acc * (j->a_scale * j->w_scale[n]);
        }
    }
    if (n1 > b0 * 16) tb_cpu_igemm_tile_epi(j, m0, b0 * 16, m1 - m0, n1 - b0 * 16);
}

/* ---------------------------------------------------------------- split */

typedef struct {
    tb_igemm_job j;
    tb_igemm_range_fn fn;
    int split_n; /* threads take slices of N (all rows) instead of rows (all of N) */
} igemm_task_arg;

/* [*lo, *hi) of n items for thread ith of nth, boundaries multiples of `al` */
static void split(int64_t n, int ith, int nth, int64_t al, int64_t *lo, int64_t *hi) {
    int64_t units = (n + al - 1) / al;
    int64_t a = units * ith / nth * al, b = units * (ith + 1) / nth * al;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

static void igemm_task(void *arg, int ith, int nth) {
    const igemm_task_arg *t = arg;
    int64_t m0 = 0, m1 = t->j.M, b0 = 0, b1 = t->j.nb16;
    if (t->split_n)
        split(t->j.nb16, ith, nth, 4, &b0, &b1);
    else
        split(t->j.M, ith, nth, 6, &m0, &m1);
    if (m0 < m1 && b0 < b1) t->fn(&t->j, m0, m1, b0, b1);
}

static tb_igemm_range_fn kernel(const char **name) {
    const char *p = tb_cpu_kernel_path(), *nm = "scalar";
    tb_igemm_range_fn fn = range_scalar;
    if (vnni_ok())
        fn = tb_cpu_igemm_range_vnni512, nm = "avx512vnni";
    else if ((!strcmp(p, "avx512") || !strcmp(p, "avx2")) && has_avxvnni() && atomic_load(&avxvnni_allowed))
        fn = tb_cpu_igemm_range_avxvnni, nm = "avxvnni";
    else if (!strcmp(p, "avx512") || !strcmp(p, "avx2"))
        fn = tb_cpu_igemm_range_avx2, nm = "avx2";
    if (name) *name = nm;
    return fn;
}

const char *tb_cpu_igemm_kernel(void) {
    const char *nm;
    kernel(&nm);
    return nm;
}

void tb_cpu_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const void *Wp, const float *w_scale, float *Y, int64_t ldy, const tb_cpu_sgemm_epi *epi,
                  tb_pool *pool) {
    if (M <= 0 || N <= 0) return;
    int64_t nb = blocks16(N), Kg = kgroups(K);
    igemm_task_arg t = {{M, N, K, Kg, nb, A, lda, ldy, a_zero, a_scale, Wp,
                         (const int32_t *)((const int8_t *)Wp + nb * Kg * 64), w_scale, Y, epi},
                        range_scalar, 0};
    t.fn = kernel(NULL);
    int nth = pool ? tb_pool_size(pool) : 1;
    /* Each thread reads its rows of A and its columns of W: slicing N costs
     * M*K + N*K/nth bytes per thread, slicing M M*K/nth + N*K, so the larger
     * dimension is sliced (N needs a 64-column slice per thread). */
    t.split_n = N > M && (nb + 3) / 4 >= nth;
    if (nth > 1 && M * N * K >= 65536)
        tb_pool_run(pool, igemm_task, &t);
    else
        igemm_task(&t, 0, 1);
}
