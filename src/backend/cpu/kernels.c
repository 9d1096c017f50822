/*
 * kernels.c — the tb_cpu_* entry points: pick a SIMD path once, split the
 * work over the thread pool, and call that path's single-threaded pieces.
 *
 * Small ops (a decode step runs ~150 of them) stay on the calling thread:
 * waking the pool costs more than the op itself below ~16K elements.
 * The portable scalar path lives here too, for CPUs without AVX2.
 */
#include "backend/cpu/kernels.h"
#include "core/kv_layout.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>


/* Elementwise work (elements) below which an op runs on one thread. */
#define TB_PAR_MIN_ELEMS 16384
/* Matmul work (T*K*N multiply-adds) below which it runs on one thread.
 * stories260K at 2 threads (turbine run -n 256, 5 interleaved runs each,
 * median tok/s): 65536 (no matmul split) 25.5k, 8192 28.9k, 4096 25.0k;
 * split in two, each core's L2 keeps its half of the 1 MB of weights. */
#define TB_PAR_MIN_MACS 8192

/* ================================================================ scalar path */

static float sc_load(const void *w, tb_dtype dt, size_t i) {
    if (dt == TB_F16) return tb_f16_to_f32(((const uint16_t *)w)[i]);
    if (dt == TB_BF16) return tb_bf16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

static void sc_to_f32(const void *src, tb_dtype sdt, float *dst, size_t n) {
    if (sdt == TB_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    TB_ASSERT(sdt == TB_F16 || sdt == TB_BF16);
    for (size_t i = 0; i < n; i++) dst[i] = sc_load(src, sdt, i);
}

static void sc_from_f32(const float *src, void *dst, tb_dtype ddt, size_t n) {
    uint16_t *h = dst;
    switch (ddt) {
    case TB_F32: memcpy(dst, src, n * sizeof(float)); break;
    case TB_F16: for (size_t i = 0; i < n; i++) h[i] = tb_f32_to_f16(src[i]); break;
    case TB_BF16: for (size_t i = 0; i < n; i++) h[i] = tb_f32_to_bf16(src[i]); break;
    default: TB_ASSERT(!"unsupported dtype");
    }
}

/* Four rows of w per pass so x is loaded once for four outputs. */
static void sc_matmul(const float *x, const void *w, tb_dtype wdt, const float *bias, float *y,
                      int T, int K, int N, int n0, int n1) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * K;
        float *yr = y + (size_t)t * N;
        int n = n0;
        for (; n + 4 <= n1; n += 4) {
            size_t r = (size_t)n * K;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int k = 0; k < K; k++) {
                float xv = xr[k];
                s0 += xv * sc_load(w, wdt, r + k);
                s1 += xv * sc_load(w, wdt, r + K + k);
                s2 += xv * sc_load(w, wdt, r + 2 * (size_t)K + k);
                s3 += xv * sc_load(w, wdt, r + 3 * (size_t)K + k);
            }
            yr[n] = s0 + (bias ? bias[n] : 0.0f);
            yr[n + 1] = s1 + (bias ? bias[n + 1] : 0.0f);
            yr[n + 2] = s2 + (bias ? bias[n + 2] : 0.0f);
            yr[n + 3] = s3 + (bias ? bias[n + 3] : 0.0f);
        }
        for (; n < n1; n++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += xr[k] * sc_load(w, wdt, (size_t)n * K + k);
            yr[n] = s + (bias ? bias[n] : 0.0f);
        }
    }
}

/* fp8 e4m3 byte -> f32, from core's exact conversion, filled once. */
static float fp8_lut[256];
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;
static void fp8_lut_init(void) {
    uint8_t b[256];
    for (int i = 0; i < 256; i++) b[i] = (uint8_t)i;
    tb_dtype_get_traits(TB_FP8_E4M3)->to_f32(b, fp8_lut, 256);
}

const float *tb_cpu_fp8_table(void) {
    pthread_once(&fp8_once, fp8_lut_init);
    return fp8_lut;
}

/* Element d of a KV row as f32; int8 and fp8 codes without their scale. */
static inline float sc_kv(const uint8_t *row, tb_dtype dt, const float *lut, int d) {
    if (dt == TB_I8) return (float)((const int8_t *)row)[d];
    if (dt == TB_FP8_E4M3) return lut[row[d]];
    return sc_load(row, dt, (size_t)d);
}

/* Rows are addressed in bytes (kv_layout.h): block bt[j / bs], row j % bs;
 * a quantized row's scale multiplies its dot product (K) or its softmax
 * weight (V). */
static void sc_attn_head(const tb_attn_args *a, const float *q, int t, int kvh, float *out,
                         float *scores, float *m_out, float *l_out) {
    int hd = a->hd, bs = a->block_size, ctx = a->pos[t] + 1;
    tb_dtype dt = a->kv_dtype;
    int quant = tb_kv_quantized(dt);
    const float *lut = tb_cpu_fp8_table();
    size_t esz = tb_kv_elem_bytes(dt), rowb = (size_t)a->n_kv * hd * esz;
    size_t blkb = tb_kv_block_bytes(dt, bs, a->n_kv, hd), cb = tb_kv_codes_bytes(dt, bs, a->n_kv, hd);
    const int32_t *bt = a->block_tables + (size_t)a->seq[t] * a->max_blocks;
    const uint8_t *kc = a->k_cache, *vc = a->v_cache;
    float mx = -INFINITY;
    for (int j = 0; j < ctx; j++) {
        size_t b = (size_t)bt[j / bs] * blkb;
        int r = j % bs;
        const uint8_t *kr = kc + b + (size_t)r * rowb + (size_t)kvh * hd * esz;
        float s = 0;
        for (int d = 0; d < hd; d++) s += q[d] * sc_kv(kr, dt, lut, d);
        if (quant) s *= ((const float *)(kc + b + cb))[(size_t)r * a->n_kv + kvh];
        scores[j] = a->scale * s;
        if (scores[j] > mx) mx = scores[j];
    }
    float sum = 0;
    for (int j = 0; j < ctx; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    for (int d = 0; d < hd; d++) out[d] = 0;
    for (int j = 0; j < ctx; j++) {
        size_t b = (size_t)bt[j / bs] * blkb;
        int r = j % bs;
        const uint8_t *vr = vc + b + (size_t)r * rowb + (size_t)kvh * hd * esz;
        float p = scores[j];
        if (quant) p *= ((const float *)(vc + b + cb))[(size_t)r * a->n_kv + kvh];
        for (int d = 0; d < hd; d++) out[d] += p * sc_kv(vr, dt, lut, d);
    }
    for (int d = 0; d < hd; d++) out[d] *= 1.0f / sum;
    *m_out = mx;
    *l_out = sum;
}

static void sc_attn_rows(const tb_attn_args *a, const tb_attn_item *it, float *scores) {
    for (int g = 0; g < it->n; g++) {
        float m, l;
        sc_attn_head(a, it->q[g], it->t[g], it->kvh[g], it->out[g], scores, &m, &l);
        if (it->m) { it->m[g] = m; it->l[g] = l; }
    }
}

/* The elementwise references are already simple loops the compiler
 * vectorises for the baseline ISA; the scalar path reuses them. */
static const tb_cpu_kernel_table tb_cpu_kernels_scalar = {
    .name = "scalar",
    .matmul = sc_matmul,
    .to_f32 = sc_to_f32,
    .from_f32 = sc_from_f32,
    .rmsnorm = tb_ref_rmsnorm,
    .add_rmsnorm = tb_ref_add_rmsnorm,
    .silu_mul = tb_ref_silu_mul,
    .add = tb_ref_add,
    .rope = tb_ref_rope,
    .attn_rows = sc_attn_rows,
};

/* ================================================================ dispatch */

static tb_cpu_kernel_table kt_avx512; /* AVX-512 entries, holes filled from AVX2 */
static const tb_cpu_kernel_table *_Atomic kt_current;

static int path_supported(const char *name) {
    uint32_t f = tb_cpu_features();
    uint32_t avx2 = TB_CPU_AVX2 | TB_CPU_FMA | TB_CPU_F16C;
    if (!strcmp(name, "scalar")) return 1;
    if (!strcmp(name, "avx2")) return (f & avx2) == avx2;
    if (!strcmp(name, "avx512")) return (f & avx2) == avx2 && (f & TB_CPU_AVX512F);
    return 0;
}

/* The AVX-512 table: AVX2's with AVX-512's kernels where it has them, made
 * once (threads of several contexts or tensor-parallel ranks may ask for it
 * at the same time). */
static pthread_once_t kt_avx512_once = PTHREAD_ONCE_INIT;
static void make_kt_avx512(void) {
    kt_avx512 = tb_cpu_kernels_avx2;
    const tb_cpu_kernel_table *o = &tb_cpu_kernels_avx512;
    kt_avx512.name = o->name;
#define TB_OVERRIDE(f) if (o->f) kt_avx512.f = o->f
    TB_OVERRIDE(matmul); TB_OVERRIDE(to_f32); TB_OVERRIDE(from_f32);
    TB_OVERRIDE(rmsnorm); TB_OVERRIDE(add_rmsnorm); TB_OVERRIDE(silu_mul);
    TB_OVERRIDE(add); TB_OVERRIDE(rope); TB_OVERRIDE(attn_rows);
#undef TB_OVERRIDE
}

static const tb_cpu_kernel_table *path_table(const char *name) {
    if (!strcmp(name, "avx512")) {
        pthread_once(&kt_avx512_once, make_kt_avx512);
        return &kt_avx512;
    }
    if (!strcmp(name, "avx2")) return &tb_cpu_kernels_avx2;
    return &tb_cpu_kernels_scalar;
}

static const tb_cpu_kernel_table *kt_auto(void) {
    if (path_supported("avx512")) return path_table("avx512");
    if (path_supported("avx2")) return path_table("avx2");
    return path_table("scalar");
}

static const tb_cpu_kernel_table *kt(void) {
    const tb_cpu_kernel_table *k = atomic_load_explicit(&kt_current, memory_order_acquire);
    if (!k) {
        k = kt_auto();
        atomic_store_explicit(&kt_current, k, memory_order_release);
    }
    return k;
}

const char *tb_cpu_kernel_path(void) { return kt()->name; }

int tb_cpu_kernel_force_path(const char *name) {
    if (!name) {
        atomic_store(&kt_current, kt_auto());
        return 0;
    }
    if (!path_supported(name)) return -1;
    atomic_store(&kt_current, path_table(name));
    return 0;
}

/* [*lo, *hi) of n items for thread ith of nth, boundaries multiples of
 * `align` (the last range takes the remainder). */
static void split_range(int n, int ith, int nth, int align, int *lo, int *hi) {
    int per = (n + nth - 1) / nth;
    per = (per + align - 1) / align * align;
    int a = per * ith, b = a + per;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

static int pool_threads(tb_pool *p) { return tb_pool_size(p); }

/* ================================================================ embedding */

typedef struct {
    const tb_cpu_kernel_table *k;
    const int32_t *ids;
    const void *table;
    tb_dtype wdt;
    float *y;
    int T, D;
    int32_t lo, V; /* ids in [lo, lo + V) index the table; others give zeros */
} emb_job;

static void emb_run(void *arg, int ith, int nth) {
    emb_job *j = arg;
    int t0, t1;
    split_range(j->T, ith, nth, 1, &t0, &t1);
    size_t esz = tb_dtype_size(j->wdt);
    for (int t = t0; t < t1; t++) {
        int64_t id = (int64_t)j->ids[t] - j->lo;
        if (id < 0 || id >= j->V) {
            memset(j->y + (size_t)t * j->D, 0, sizeof(float) * (size_t)j->D);
            continue;
        }
        j->k->to_f32((const uint8_t *)j->table + (size_t)id * j->D * esz, j->wdt, j->y + (size_t)t * j->D,
                     (size_t)j->D);
    }
}

void tb_cpu_embedding(tb_pool *p, const int32_t *ids, const void *table, tb_dtype wdt, float *y,
                      int T, int D) {
    tb_cpu_embedding_range(p, ids, table, wdt, y, T, D, 0, INT32_MAX);
}

void tb_cpu_embedding_range(tb_pool *p, const int32_t *ids, const void *table, tb_dtype wdt, float *y, int T, int D,
                            int32_t lo, int32_t V) {
    emb_job j = {kt(), ids, table, wdt, y, T, D, lo, V};
    if ((size_t)T * D < TB_PAR_MIN_ELEMS || T < 2) emb_run(&j, 0, 1);
    else tb_pool_run(p, emb_run, &j);
}

/* ================================================================ norms, elementwise */

typedef struct {
    const tb_cpu_kernel_table *k;
    const float *x, *d, *w;
    float *r, *y;
    int T, D;
    float eps;
} norm_job;

static void rmsnorm_run(void *arg, int ith, int nth) {
    norm_job *j = arg;
    int t0, t1;
    split_range(j->T, ith, nth, 1, &t0, &t1);
    if (t1 > t0)
        j->k->rmsnorm(j->x + (size_t)t0 * j->D, j->w, j->y + (size_t)t0 * j->D, t1 - t0, j->D, j->eps);
}

static void add_rmsnorm_run(void *arg, int ith, int nth) {
    norm_job *j = arg;
    int t0, t1;
    split_range(j->T, ith, nth, 1, &t0, &t1);
    size_t o = (size_t)t0 * j->D;
    if (t1 > t0)
        j->k->add_rmsnorm(j->x + o, j->d + o, j->w, j->r + o, j->y + o, t1 - t0, j->D, j->eps);
}

void tb_cpu_rmsnorm(tb_pool *p, const float *x, const float *w, float *y, int T, int D, float eps) {
    norm_job j = {kt(), x, NULL, w, NULL, y, T, D, eps};
    if ((size_t)T * D < TB_PAR_MIN_ELEMS || T < 2) rmsnorm_run(&j, 0, 1);
    else tb_pool_run(p, rmsnorm_run, &j);
}

void tb_cpu_add_rmsnorm(tb_pool *p, const float *x, const float *d, const float *w, float *r,
                        float *y, int T, int D, float eps) {
    norm_job j = {kt(), x, d, w, r, y, T, D, eps};
    if ((size_t)T * D < TB_PAR_MIN_ELEMS || T < 2) add_rmsnorm_run(&j, 0, 1);
    else tb_pool_run(p, add_rmsnorm_run, &j);
}

typedef struct {
    const tb_cpu_kernel_table *k;
    const float *gu;
    float *y;
    int T, F;
} silu_job;

static void silu_run(void *arg, int ith, int nth) {
    silu_job *j = arg;
    int t0, t1;
    split_range(j->T, ith, nth, 1, &t0, &t1);
    if (t1 > t0) j->k->silu_mul(j->gu + (size_t)t0 * 2 * j->F, j->y + (size_t)t0 * j->F, t1 - t0, j->F);
}

void tb_cpu_silu_mul(tb_pool *p, const float *gu, float *y, int T, int F) {
    silu_job j = {kt(), gu, y, T, F};
    if ((size_t)T * F < TB_PAR_MIN_ELEMS || T < 2) silu_run(&j, 0, 1);
    else tb_pool_run(p, silu_run, &j);
}

typedef struct {
    const tb_cpu_kernel_table *k;
    const float *a, *b;
    float *y;
    size_t n;
} add_job;

static void add_run(void *arg, int ith, int nth) {
    add_job *j = arg;
    size_t per = (j->n + (size_t)nth - 1) / (size_t)nth;
    per = (per + 15) & ~(size_t)15;
    size_t i0 = per * (size_t)ith, i1 = i0 + per;
    if (i0 > j->n) i0 = j->n;
    if (i1 > j->n) i1 = j->n;
    if (i1 > i0) j->k->add(j->a + i0, j->b + i0, j->y + i0, i1 - i0);
}

void tb_cpu_add(tb_pool *p, const float *a, const float *b, float *y, size_t n) {
    add_job j = {kt(), a, b, y, n};
    if (n < TB_PAR_MIN_ELEMS) add_run(&j, 0, 1);
    else tb_pool_run(p, add_run, &j);
}

/* ================================================================ rope */

typedef struct {
    const tb_cpu_kernel_table *k;
    float *x;
    int row_stride;
    const int32_t *pos;
    const float *inv_freq;
    int T, n_heads, hd, interleaved;
} rope_job;

static void rope_run(void *arg, int ith, int nth) {
    rope_job *j = arg;
    int t0, t1;
    split_range(j->T, ith, nth, 1, &t0, &t1);
    if (t1 > t0)
        j->k->rope(j->x + (size_t)t0 * j->row_stride, j->row_stride, j->pos + t0, j->inv_freq,
                   t1 - t0, j->n_heads, j->hd, j->interleaved);
}

void tb_cpu_rope(tb_pool *p, float *x, int row_stride, const int32_t *pos, const float *inv_freq,
                 int T, int n_heads, int hd, int interleaved) {
    rope_job j = {kt(), x, row_stride, pos, inv_freq, T, n_heads, hd, interleaved};
    if ((size_t)T * n_heads * hd < TB_PAR_MIN_ELEMS || T < 2) rope_run(&j, 0, 1);
    else tb_pool_run(p, rope_run, &j);
}

/* ================================================================ matmul */

typedef struct {
    const tb_cpu_kernel_table *k;
    const float *x;
    const void *w;
    tb_dtype wdt;
    const float *bias;
    float *y;
    int T, K, N;
    int split_t; /* 1: threads take rows of x; 0: threads take rows of w */
} mm_job;

static void mm_run(void *arg, int ith, int nth) {
    mm_job *j = arg;
    int lo, hi;
    if (j->split_t) {
        split_range(j->T, ith, nth, 4, &lo, &hi);
        if (hi > lo)
            j->k->matmul(j->x + (size_t)lo * j->K, j->w, j->wdt, j->bias, j->y + (size_t)lo * j->N,
                         hi - lo, j->K, j->N, 0, j->N);
    } else {
        split_range(j->N, ith, nth, 12, &lo, &hi);
        if (hi > lo) j->k->matmul(j->x, j->w, j->wdt, j->bias, j->y, j->T, j->K, j->N, lo, hi);
    }
}

void tb_cpu_matmul(tb_pool *p, const float *x, const void *w, tb_dtype wdt, const float *bias,
                   float *y, int T, int K, int N) {
    TB_ASSERT(wdt == TB_F32 || wdt == TB_F16 || wdt == TB_BF16);
    int nth = pool_threads(p);
    mm_job j = {kt(), x, w, wdt, bias, y, T, K, N, 0};
    j.split_t = N < 24 * nth && T >= 4 * nth;
    if (nth == 1 || (double)T * K * N < TB_PAR_MIN_MACS) mm_run(&j, 0, 1);
    else tb_pool_run(p, mm_run, &j);
}

/* ---- per-thread panel (kernels.h): a pthread key frees it at thread exit */
static pthread_key_t panel_key;
static pthread_once_t panel_once = PTHREAD_ONCE_INIT;
static void panel_key_create(void) { TB_ASSERT(pthread_key_create(&panel_key, tb_free_aligned) == 0); }

float *tb_cpu_thread_panel(void) {
    static _Thread_local float *panel;
    if (!panel) {
        pthread_once(&panel_once, panel_key_create);
        panel = tb_alloc_aligned(TB_CPU_PANEL_BYTES, 64);
        TB_ASSERT(panel && "out of memory for a thread's GEMM panel");
        pthread_setspecific(panel_key, panel);
    }
    return panel;
}

/* ---- OpenBLAS tactic: every thread runs a single-threaded sgemm on its
 * slice of N, so it shares the pool (and its spinning workers) with the
 * rest of the step instead of waking OpenBLAS's own threads. OpenBLAS is
 * loaded by the first call that asks for the tactic (blas.c). */
static void blas_run(void *arg, int ith, int nth) {
    mm_job *j = arg;
    const tb_blas_api *b = tb_cpu_blas();
    int lo, hi;
    split_range(j->N, ith, nth, 16, &lo, &hi);
    if (hi <= lo) return;
    const float *w = (const float *)j->w + (size_t)lo * j->K;
    float *y = j->y + lo;
    if (j->T == 1)
        b->sgemv(TB_CBLAS_ROW_MAJOR, TB_CBLAS_NO_TRANS, hi - lo, j->K, 1.0f, w, j->K, j->x, 1, 0.0f, y, 1);
    else
        b->sgemm(TB_CBLAS_ROW_MAJOR, TB_CBLAS_NO_TRANS, TB_CBLAS_TRANS, j->T, hi - lo, j->K, 1.0f, j->x, j->K,
                 w, j->K, 0.0f, y, j->N);
    if (j->bias)
        for (int t = 0; t < j->T; t++)
            for (int n = lo; n < hi; n++) j->y[(size_t)t * j->N + n] += j->bias[n];
}

int tb_cpu_matmul_tactic_available(tb_mm_tactic t, tb_dtype wdt) {
    if (t == TB_MM_OWN) return wdt == TB_F32 || wdt == TB_F16 || wdt == TB_BF16;
    if (t == TB_MM_BLAS) return wdt == TB_F32 && tb_cpu_blas() != NULL;
    return 0;
}

void tb_cpu_matmul_tactic(tb_pool *p, tb_mm_tactic t, const float *x, const void *w, tb_dtype wdt,
                          const float *bias, float *y, int T, int K, int N) {
    TB_ASSERT(tb_cpu_matmul_tactic_available(t, wdt));
    if (t == TB_MM_BLAS) {
        mm_job j = {kt(), x, w, wdt, bias, y, T, K, N, 0};
        if (pool_threads(p) == 1 || (double)T * K * N < TB_PAR_MIN_MACS) blas_run(&j, 0, 1);
        else tb_pool_run(p, blas_run, &j);
        return;
    }
    tb_cpu_matmul(p, x, w, wdt, bias, y, T, K, N);
}

/* ================================================================ attention */

typedef struct {
    const tb_cpu_kernel_table *k;
    const tb_attn_args *a;
    const float *qkv;
    float *out, *scratch;
    size_t scratch_per_thread;
} attn_job;

/* The cache row of token t (all kv heads), and *scales its scales (int8,
 * fp8: kv_layout.h). */
static uint8_t *kv_row(const tb_attn_args *a, void *cache, int t, float **scales) {
    int p = a->pos[t];
    int blk = a->block_tables[(size_t)a->seq[t] * a->max_blocks + p / a->block_size];
    int r = p % a->block_size;
    uint8_t *b = (uint8_t *)cache + (size_t)blk * tb_kv_block_bytes(a->kv_dtype, a->block_size, a->n_kv, a->hd);
    if (scales)
        *scales = (float *)(b + tb_kv_codes_bytes(a->kv_dtype, a->block_size, a->n_kv, a->hd)) + (size_t)r * a->n_kv;
    return b + (size_t)r * a->n_kv * a->hd * tb_kv_elem_bytes(a->kv_dtype);
}

/* ---- KV row quantiser (kernels.h tb_cpu_kv_quantize): the same bytes as
 * tb_ref_kv_quantize without a libm call per element. Rounding to nearest
 * even by adding and subtracting 1.5 * 2^23 (exact for |v| < 2^22, and this
 * file is not built with -ffast-math); e4m3 by rounding the f32 bits to 3
 * mantissa bits (round half to even through the carry), saturated at 448. */
static inline float rne_f32(float v) {
    /* 1.5 * 2^23; this file is built for baseline x86-64, so no FMA can fuse
     * the caller's scaling into the addition (test_kv_quant compares bytes) */
    const float big = 12582912.0f;
    return (v + big) - big;
}

static inline uint8_t fp8_encode(float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    uint8_t sign = (uint8_t)((b >> 24) & 0x80);
    uint32_t a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7f; /* NaN */
    if (a < 0x3c800000u) {                   /* below 2^-6: e4m3's subnormal steps of 2^-9 */
        float f;
        memcpy(&f, &a, 4);
        return sign | (uint8_t)rne_f32(f * 512.0f); /* 8 is the smallest normal: same bits */
    }
    uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20; /* exponent and 3 mantissa bits, rounded */
    uint32_t code = r - ((127u - 7u) << 3);
    return sign | (uint8_t)(code > 0x7eu ? 0x7eu : code);
}

void tb_cpu_kv_quantize(const float *x, int hd, tb_dtype dt, void *codes, float *scale) {
    float amax = 0.0f, qmax = tb_kv_code_max(dt);
    for (int d = 0; d < hd; d++) {
        float m = fabsf(x[d]);
        amax = m > amax ? m : amax;
    }
    *scale = amax / qmax;
    float inv = amax > 0.0f ? qmax / amax : 0.0f;
    if (dt == TB_I8) {
        int8_t *c = codes;
        for (int d = 0; d < hd; d++) {
            float r = rne_f32(x[d] * inv);
            c[d] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
        }
    } else {
        uint8_t *c = codes;
        for (int d = 0; d < hd; d++) c[d] = fp8_encode(x[d] * inv);
    }
}

/* A decode step writes n_kv rows per layer; a prefill a row per token and
 * kv head. */
static void attn_write_run(void *arg, int ith, int nth) {
    attn_job *j = arg;
    const tb_attn_args *a = j->a;
    int t0, t1;
    split_range(a->T, ith, nth, 1, &t0, &t1);
    size_t stride = (size_t)(a->n_heads + 2 * a->n_kv) * a->hd, kvd = (size_t)a->n_kv * a->hd;
    for (int t = t0; t < t1; t++) {
        const float *row = j->qkv + (size_t)t * stride + (size_t)a->n_heads * a->hd;
        if (tb_kv_quantized(a->kv_dtype)) {
            float *ks, *vs;
            int8_t *kr = (int8_t *)kv_row(a, a->k_cache, t, &ks), *vr = (int8_t *)kv_row(a, a->v_cache, t, &vs);
            for (int h = 0; h < a->n_kv; h++) {
                size_t o = (size_t)h * a->hd;
                tb_cpu_kv_quantize(row + o, a->hd, a->kv_dtype, kr + o, ks + h);
                tb_cpu_kv_quantize(row + kvd + o, a->hd, a->kv_dtype, vr + o, vs + h);
            }
            continue;
        }
        j->k->from_f32(row, kv_row(a, a->k_cache, t, NULL), a->kv_dtype, kvd);
        j->k->from_f32(row + kvd, kv_row(a, a->v_cache, t, NULL), a->kv_dtype, kvd);
    }
}

/* Work items are (block of tokens, run of consecutive q heads), dealt
 * round-robin: causal prefill makes later tokens longer, and interleaving
 * keeps the threads' totals close.
 *
 * A run of heads is about an equal part of one kv head's group when the
 * group is larger than TB_ATTN_GROUP_MAX; otherwise whole groups of as many
 * kv heads as fill one 64-byte cache line of a K or V row (hd 8 in f32: 2),
 * so every line fetched is used whole. A block is up to
 * TB_ATTN_GROUP_MAX / (heads in a run) consecutive tokens of one sequence:
 * in a prefill their queries share every K and V row load (without this, a
 * 512-token prefill of a 134M model read ~10 GB of K and V from L3).
 *
 * When no two neighbouring tokens share a sequence (a decode batch), blocks
 * are single tokens anyway, and runs take as many kv heads as fill
 * ATTN_DECODE_RUN_BYTES of a row (at most): one head's rows are hd * 4 bytes
 * strided by a whole cache row, which DRAM and the hardware prefetchers
 * serve poorly. kernels_bench attn8 (134M, batch 8, 2 threads, ms per step
 * from DRAM at ctx 96): 3.5 with one head (256 B) per run, 2.5-3.0 with 4
 * (1 KB), 3.0 with 6, 3.15 with 8; with the cache in L3: 1.34 -> 0.78.
 * Software prefetch of the next chunks' K rows and of the V rows in
 * attn_scores was slower at every distance tried (16, 32, 64 positions)
 * for f32 rows; the next block's rows are prefetched for f16, bf16 and the
 * one-byte dtypes (kernels_avx2.c attn_scores). */
#define ATTN_DECODE_RUN_BYTES 1024
static int attn_heads_per_run(const tb_attn_args *a, int nth) {
    int group = a->n_heads / a->n_kv;
    if (group > TB_ATTN_GROUP_MAX) {
        int n_sl = (group + TB_ATTN_GROUP_MAX - 1) / TB_ATTN_GROUP_MAX;
        return (group + n_sl - 1) / n_sl;
    }
    int decode = 1;
    for (int t = 1; t < a->T && decode; t++) decode = a->seq[t] != a->seq[t - 1];
    int kv_bytes = a->hd * (int)tb_dtype_size(a->kv_dtype), run = decode ? ATTN_DECODE_RUN_BYTES : 64;
    int nk = kv_bytes >= run ? 1 : run / kv_bytes;
    /* int8 / fp8 prefill: one kv head per run, so that a block holds more
     * tokens and each widened K and V row serves more q rows (widening, not
     * the line fetched, is their cost) */
    if (!decode && tb_kv_quantized(a->kv_dtype)) nk = 1;
    if (nk > TB_ATTN_GROUP_MAX / group) nk = TB_ATTN_GROUP_MAX / group;
    if (nk > a->n_kv) nk = a->n_kv;
    if (decode) { /* runs of equal size (f16 at 134M: 6 + 6 heads, not 8 + 4) */
        int n_runs = (a->n_kv + nk - 1) / nk;
        /* and at least one item per thread (stories260K, batch 1: all 4 kv
         * heads fit in 1 KB, but one item would leave a thread idle) */
        int want = (nth + a->T - 1) / a->T;
        if (n_runs < want) n_runs = want < a->n_kv ? want : a->n_kv;
        nk = (a->n_kv + n_runs - 1) / n_runs;
    }
    return nk * group;
}

static void attn_run(void *arg, int ith, int nth) {
    attn_job *j = arg;
    const tb_attn_args *a = j->a;
    int hd = a->hd, group = a->n_heads / a->n_kv, per = attn_heads_per_run(a, nth);
    int runs = (a->n_heads + per - 1) / per, qb = TB_ATTN_GROUP_MAX / per;
    size_t stride = (size_t)(a->n_heads + 2 * a->n_kv) * hd;
    float *scores = j->scratch + (size_t)ith * j->scratch_per_thread;
    int item = 0;
    for (int t0 = 0; t0 < a->T;) {
        int nt = 1;
        while (nt < qb && t0 + nt < a->T && a->seq[t0 + nt] == a->seq[t0]) nt++;
        for (int r = 0; r < runs; r++, item++) {
            if (item % nth != ith) continue;
            int h0 = r * per, ng = a->n_heads - h0 < per ? a->n_heads - h0 : per;
            tb_attn_item it;
            it.m = it.l = NULL;
            it.n = nt * ng;
            it.seq = a->seq[t0];
            for (int i = 0, g = 0; i < nt; i++)
                for (int h = h0; h < h0 + ng; h++, g++) {
                    int t = t0 + i;
                    it.t[g] = t;
                    it.kvh[g] = h / group;
                    it.q[g] = j->qkv + (size_t)t * stride + (size_t)h * hd;
                    it.out[g] = j->out + ((size_t)t * a->n_heads + (size_t)h) * hd;
                }
            j->k->attn_rows(a, &it, scores);
        }
        t0 += nt;
    }
}

/* ---- decode of one token: positions split between the threads
 * (flash-decoding). Split by heads, each thread reads its heads' slices of
 * every K and V row (128 B of a 1.5 KB f16 row at 134M) at a stride, which
 * DRAM and the prefetchers serve at a fraction of the read bandwidth; split
 * by positions, each thread streams whole consecutive rows of its range.
 * Thread i runs the path's attn_rows over cache blocks [b0, b1) of the
 * sequence (whole blocks: the kernels address positions from a block
 * boundary) for every head, through a copy of the arguments whose block
 * table starts at b0 and whose position is the range's last, and keeps per
 * head its normalised output o_i, max score m_i and sum l_i; the caller then
 * merges each head: out = sum_i w_i o_i / sum_i w_i, w_i = l_i exp(m_i - M),
 * M = max_i m_i (a thread with no blocks has l_i = 0).
 *
 * Its scratch is each thread's slice of the score scratch: the partial
 * results (n_heads * (hd + 2) floats, rounded to 16) first, then the scores
 * of its range. The split is taken when that fits, which it does whenever
 * the context is long enough for the split to matter (the slice holds
 * TB_ATTN_GROUP_MAX rows of max_ctx scores); otherwise the heads split. */
static int attn_split_mode = -1; /* tb_cpu_attention_force_split */

void tb_cpu_attention_force_split(int mode) { attn_split_mode = mode < 0 ? -1 : mode > 0; }

typedef struct {
    const tb_cpu_kernel_table *k;
    const tb_attn_args *a;
    const float *qkv;
    float *scratch;
    size_t scratch_per_thread, part_floats;
    int nblk, per; /* blocks of the context; heads per attn_rows call */
} attn_split_job;

static size_t attn_part_floats(const tb_attn_args *a) {
    return ((size_t)a->n_heads * (size_t)(a->hd + 2) + 15) & ~(size_t)15;
}

static void attn_split_run(void *arg, int ith, int nth) {
    attn_split_job *j = arg;
    const tb_attn_args *a = j->a;
    int hd = a->hd, bs = a->block_size, group = a->n_heads / a->n_kv, ctx = a->pos[0] + 1;
    float *part = j->scratch + (size_t)ith * j->scratch_per_thread; /* (n_heads, hd) outputs */
    float *m = part + (size_t)a->n_heads * hd, *l = m + a->n_heads; /* (n_heads) each */
    float *scores = part + j->part_floats;
    int b0, b1;
    split_range(j->nblk, ith, nth, 1, &b0, &b1);
    if (b0 >= b1) {
        for (int h = 0; h < a->n_heads; h++) { m[h] = -INFINITY; l[h] = 0.0f; }
        return;
    }
    int p1 = b1 * bs < ctx ? b1 * bs : ctx;
    int32_t pos = p1 - 1 - b0 * bs, seq = 0;
    tb_attn_args sa = *a;
    sa.T = 1;
    sa.pos = &pos;
    sa.seq = &seq;
    sa.block_tables = a->block_tables + (size_t)a->seq[0] * a->max_blocks + b0;
    for (int h0 = 0; h0 < a->n_heads; h0 += j->per) {
        int ng = a->n_heads - h0 < j->per ? a->n_heads - h0 : j->per;
        tb_attn_item it;
        it.n = ng;
        it.seq = 0;
        it.m = m + h0;
        it.l = l + h0;
        for (int g = 0; g < ng; g++) {
            it.t[g] = 0;
            it.kvh[g] = (h0 + g) / group;
            it.q[g] = j->qkv + (size_t)(h0 + g) * hd;
            it.out[g] = part + (size_t)(h0 + g) * hd;
        }
        j->k->attn_rows(&sa, &it, scores);
    }
}

/* out (n_heads, hd) from the nth threads' partial results. */
static void attn_split_merge(const attn_split_job *j, int nth, float *out) {
    const tb_attn_args *a = j->a;
    int hd = a->hd, H = a->n_heads;
    for (int h = 0; h < H; h++) {
        float M = -INFINITY, w[64], wsum = 0.0f;
        for (int i = 0; i < nth; i++) {
            const float *m = j->scratch + (size_t)i * j->scratch_per_thread + (size_t)H * hd;
            if (m[H + h] > 0.0f && m[h] > M) M = m[h];
        }
        for (int i = 0; i < nth; i++) {
            const float *m = j->scratch + (size_t)i * j->scratch_per_thread + (size_t)H * hd;
            w[i] = m[H + h] > 0.0f ? m[H + h] * expf(m[h] - M) : 0.0f;
            wsum += w[i];
        }
        float *o = out + (size_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = 0.0f;
        for (int i = 0; i < nth; i++) {
            if (w[i] == 0.0f) continue;
            const float *pi = j->scratch + (size_t)i * j->scratch_per_thread + (size_t)h * hd;
            float c = w[i] / wsum;
            for (int d = 0; d < hd; d++) o[d] += c * pi[d];
        }
    }
}

/* Heads per attn_rows call of the split. Without GQA, runs of at most
 * ATTN_SPLIT_RUN_HEADS heads of equal size: a thread's range of a run's
 * rows then stays in L2 between its K pass and its V passes (one per head,
 * attn_pv64). kernels_bench attnkv (134M, ctx 1024, 2 threads, ms per step,
 * two interleaved runs): 3 heads f16 1.14-1.21, int8 1.13-1.18, fp8
 * 1.36-1.49, f32 1.74-1.91; 4 heads 1.24-1.34, 1.15-1.36, 1.42-1.89,
 * 1.86-1.94; 6 heads (the heads split's 1 KB runs) 1.16-1.35, 1.33-1.60,
 * 1.61-2.14, 1.78-2.14; 2 heads slower again. With GQA the heads split's
 * runs (whole groups share each K and V row load). */
#define ATTN_SPLIT_RUN_HEADS 3
static int attn_split_heads_per_call(const tb_attn_args *a) {
    if (a->n_heads != a->n_kv) return attn_heads_per_run(a, 1);
    int runs = (a->n_heads + ATTN_SPLIT_RUN_HEADS - 1) / ATTN_SPLIT_RUN_HEADS;
    return (a->n_heads + runs - 1) / runs;
}

/* Whether a step on nth threads with spt scratch floats per thread takes
 * the position split (see above). */
static int attn_split_ok(const tb_attn_args *a, int nth, size_t spt) {
    if (attn_split_mode == 0 || a->T != 1 || nth < 2 || nth > 64) return 0;
    int ctx = a->pos[0] + 1, bs = a->block_size, nblk = (ctx + bs - 1) / bs;
    if (nblk < 2) return 0;
    /* a short context: the heads split's single pass costs less than the
     * merge and the second pool run's wake-up */
    if (attn_split_mode < 0 && (size_t)ctx * a->n_heads * a->hd * 2 < TB_PAR_MIN_ELEMS * 4) return 0;
    size_t part = attn_part_floats(a);
    int span = (nblk + nth - 1) / nth * bs; /* positions of the longest range */
    return part + tb_attention_scratch_floats(1, span) <= spt;
}

int tb_cpu_attention_split(const tb_attn_args *a, int n_threads, int max_ctx) {
    return attn_split_ok(a, n_threads, tb_attention_scratch_floats(1, max_ctx));
}

void tb_cpu_attention(tb_pool *p, const tb_attn_args *a, const float *qkv, float *out,
                      float *scratch, int max_ctx) {
    TB_ASSERT(a->kv_dtype == TB_F32 || a->kv_dtype == TB_F16 || a->kv_dtype == TB_BF16 || a->kv_dtype == TB_I8 ||
              a->kv_dtype == TB_FP8_E4M3);
    TB_ASSERT(a->n_kv > 0 && a->n_heads % a->n_kv == 0);
    int nth = pool_threads(p);
    attn_job j = {kt(), a, qkv, out, scratch,
                  tb_attention_scratch_floats(1, max_ctx)};
    for (int t = 0; t < a->T; t++) TB_ASSERT(a->pos[t] >= 0 && a->pos[t] < max_ctx);

    if ((size_t)a->T * a->n_kv * a->hd * 2 < TB_PAR_MIN_ELEMS || nth == 1) attn_write_run(&j, 0, 1);
    else tb_pool_run(p, attn_write_run, &j);

    if (attn_split_ok(a, nth, j.scratch_per_thread)) {
        int nblk = (a->pos[0] + a->block_size) / a->block_size;
        attn_split_job sj = {j.k, a, qkv, scratch, j.scratch_per_thread, attn_part_floats(a), nblk,
                             attn_split_heads_per_call(a)};
        tb_pool_run(p, attn_split_run, &sj);
        attn_split_merge(&sj, nth, out);
        return;
    }

    size_t work = 0; /* multiply-adds, roughly */
    for (int t = 0; t < a->T; t++) work += (size_t)(a->pos[t] + 1) * a->n_heads * a->hd * 2;
    if (work < TB_PAR_MIN_ELEMS || nth == 1) attn_run(&j, 0, 1);
    else tb_pool_run(p, attn_run, &j);
}

/* ================================================================ data movement */

void tb_cpu_gather_rows(const float *x, const int32_t *rows, float *y, int R, int D) {
    for (int r = 0; r < R; r++)
        memcpy(y + (size_t)r * D, x + (size_t)rows[r] * D, (size_t)D * sizeof(float));
}

void tb_convert(const void *src, tb_dtype sdt, void *dst, tb_dtype ddt, size_t n) {
    const tb_cpu_kernel_table *k = kt();
    if (sdt == ddt) {
        memcpy(dst, src, n * tb_dtype_size(sdt));
    } else if (ddt == TB_F32) {
        k->to_f32(src, sdt, dst, n);
    } else if (sdt == TB_F32) {
        k->from_f32(src, dst, ddt, n);
    } else { /* f16 <-> bf16, through f32 in chunks */
        float buf[1024];
        size_t esz = tb_dtype_size(sdt), dsz = tb_dtype_size(ddt);
        for (size_t i = 0; i < n; i += 1024) {
            size_t m = n - i < 1024 ? n - i : 1024;
            k->to_f32((const uint8_t *)src + i * esz, sdt, buf, m);
            k->from_f32(buf, (uint8_t *)dst + i * dsz, ddt, m);
        }
    }
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_job;

static void copy_run(void *arg, int ith, int nth) {
    copy_job *j = arg;
    size_t per = (j->bytes + (size_t)nth - 1) / (size_t)nth;
    per = (per + 4095) & ~(size_t)4095;
    size_t a = per * (size_t)ith, b = a + per;
    if (a > j->bytes) a = j->bytes;
    if (b > j->bytes) b = j->bytes;
    if (b > a) memcpy((uint8_t *)j->dst + a, (const uint8_t *)j->src + a, b - a);
}

void tb_cpu_copy(tb_pool *p, void *dst, const void *src, size_t bytes) {
    copy_job j = {dst, src, bytes};
    tb_pool_run(p, copy_run, &j);
}
