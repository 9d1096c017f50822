/*
 * kernels_bench.c — CPU matmul microbenchmark at the shapes of a 134M Llama.
 *
 * GEMV (T = 1, decode) is reported as GB/s of weight bytes read, next to the
 * copy bandwidth (tb_cpu_copy of a 256 MiB buffer, bytes copied per second)
 * measured in the same run. The weights rotate through enough copies to span
 * >= 256 MiB, so they come from DRAM as in a real decode step, not from L3.
 * GEMM (T = 512, prefill) is reported as GFLOP/s, own kernels vs OpenBLAS.
 *
 * Six more modes: `gemvx` (GEMV variants, below; KB_HUGE=1 backs the
 * weights with transparent huge pages), `small` (stories260K's decode
 * matmuls), `attn` (stories260K's decode attention), `attn8` (the 134M
 * model's batch-8 decode attention from DRAM), `attnkv` (the 134M model's
 * decode attention at context 1024 for each KV dtype, f32 to int8/fp8) and
 * `batch` (the 134M model's decode matmuls at T = 1 and T = 8, below).
 *
 * usage: kernels_bench [seconds per measurement, default 0.3]
 *                      [gemv|gemm|gemvx|small|attn|attn8|attnkv|batch]
 */
#include "backend/cpu/kernels.h"
#include "core/kv_layout.h"

#include <math.h>
#include <sys/mman.h>

#define SPAN_BYTES ((size_t)256 << 20)

static void *xalloc(size_t n) {
    void *p = tb_alloc_aligned(n, 64);
    TB_ASSERT(p);
    return p;
}

static void fill_weights(void *w, tb_dtype dt, size_t n) {
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float v = (float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
        if (dt == TB_F32) ((float *)w)[i] = v;
        else if (dt == TB_F16) ((uint16_t *)w)[i] = tb_f32_to_f16(v);
        else ((uint16_t *)w)[i] = tb_f32_to_bf16(v);
    }
}

static double copy_gbs(tb_pool *p, double secs) {
    uint8_t *a = xalloc(SPAN_BYTES), *b = xalloc(SPAN_BYTES);
    memset(a, 1, SPAN_BYTES);
    memset(b, 2, SPAN_BYTES);
    double best = 1e30, t_end = tb_now() + secs;
    int reps = 0;
    while (reps < 3 || tb_now() < t_end) {
        double t0 = tb_now();
        tb_cpu_copy(p, b, a, SPAN_BYTES);
        double dt = tb_now() - t0;
        if (dt < best) best = dt;
        reps++;
    }
    tb_free_aligned(a);
    tb_free_aligned(b);
    return (double)SPAN_BYTES / best * 1e-9;
}

/* Median-free simple timing: total time over as many calls as fit in
 * `secs`, weights rotating through `copies` distinct matrices. */
static double time_matmul(tb_pool *p, tb_mm_tactic tac, const float *x, const uint8_t *w,
                          size_t wbytes, int copies, tb_dtype dt, float *y, int T, int K, int N,
                          double secs) {
    for (int c = 0; c < copies; c++) /* warm up: page in every copy */
        tb_cpu_matmul_tactic(p, tac, x, w + (size_t)c * wbytes, dt, NULL, y, T, K, N);
    double t0 = tb_now(), t;
    long calls = 0;
    do {
        tb_cpu_matmul_tactic(p, tac, x, w + (size_t)(calls % copies) * wbytes, dt, NULL, y, T, K, N);
        calls++;
    } while ((t = tb_now() - t0) < secs || calls < 3);
    return t / (double)calls;
}

/* ---------------------------------------------------------------- GEMV experiments
 * Variants of the single-thread decode GEMV (`kernels_bench S gemvx`), run
 * interleaved over the same rotating weights, to find what bounds its read
 * bandwidth: rows per block, software prefetch distance and hint, and the
 * order in which memory is walked. Kept here, not in the library. */
#include <immintrin.h>
#define XFN __attribute__((target("avx2,fma,f16c")))
#define XIN static inline __attribute__((target("avx2,fma,f16c"), always_inline))

XIN __m256 xld8(const void *b, size_t i, int f16) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)b + i)));
    return _mm256_loadu_ps((const float *)b + i);
}
XIN float xhsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* R rows per block walked side by side; prefetch `dist` bytes ahead of the
 * block's own stream (0: none), hint 0 = T0, 1 = NTA. K % 32 == 0. */
XIN void gemv_x(const float *x, const void *w, int f16, float *y, int K, int N, int R, size_t dist,
                int nta) {
    size_t esz = f16 ? 2 : 4;
    for (int n = 0; n < N; n += R) {
        __m256 acc[8][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        const char *base = (const char *)w + (size_t)n * K * esz;
        for (int k = 0; k < K; k += 16) {
            if (dist) {
                /* the block is R*K*esz contiguous bytes; walk its prefetch
                 * stream at R*16*esz bytes per step */
                const char *q = base + (size_t)k * R * esz + dist;
                for (size_t o = 0; o < (size_t)R * 16 * esz; o += 64) {
                    if (nta) _mm_prefetch(q + o, _MM_HINT_NTA);
                    else _mm_prefetch(q + o, _MM_HINT_T0);
                }
            }
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
            for (int r = 0; r < R; r++) {
                size_t ro = (size_t)(n + r) * K + k;
                acc[r][0] = _mm256_fmadd_ps(xld8(w, ro, f16), x0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(xld8(w, ro + 8, f16), x1, acc[r][1]);
            }
        }
        for (int r = 0; r < R; r++) y[n + r] = xhsum(_mm256_add_ps(acc[r][0], acc[r][1]));
    }
}

#define GX(NAME, R, DIST, NTA)                                                                  \
    static XFN void NAME(const float *x, const void *w, int f16, float *y, int K, int N) {   \
        if (f16) gemv_x(x, w, 1, y, K, N, R, DIST, NTA);                                      \
        else gemv_x(x, w, 0, y, K, N, R, DIST, NTA);                                          \
    }
GX(gx_r1_nopf, 1, 0, 0)
GX(gx_r1_pf1k, 1, 1024, 0)
GX(gx_r1_pf2k, 1, 2048, 0)
GX(gx_r1_pf4k, 1, 4096, 0)
GX(gx_r1_pf8k, 1, 8192, 0)
GX(gx_r4_nopf, 4, 0, 0)
GX(gx_r4_pf2k, 4, 2048, 0)
GX(gx_r4_pf4k, 4, 4096, 0)
GX(gx_r4_pf8k, 4, 8192, 0)
GX(gx_r4_nta4k, 4, 4096, 1)
GX(gx_r8_pf4k, 8, 4096, 0)
GX(gx_r2_pf4k, 2, 4096, 0)

typedef void (*gx_fn)(const float *, const void *, int, float *, int, int);

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void gemv_experiments(uint8_t *wbuf, const float *x, float *y, double secs) {
    static const struct { const char *name; gx_fn fn; } v[] = {
        {"library", NULL},          {"r1 no pf", gx_r1_nopf}, {"r1 pf 1K", gx_r1_pf1k},
        {"r1 pf 2K", gx_r1_pf2k},   {"r1 pf 4K", gx_r1_pf4k}, {"r1 pf 8K", gx_r1_pf8k},
        {"r2 pf 4K", gx_r2_pf4k},   {"r4 no pf", gx_r4_nopf}, {"r4 pf 2K", gx_r4_pf2k},
        {"r4 pf 4K", gx_r4_pf4k},   {"r4 pf 8K", gx_r4_pf8k}, {"r4 nta 4K", gx_r4_nta4k},
        {"r8 pf 4K", gx_r8_pf4k},
    };
    enum { NV = sizeof v / sizeof v[0], ROUNDS = 7 };
    static const int shapes[][2] = {{768, 2304}, {2048, 768}};
    for (int f16 = 0; f16 < 2; f16++)
        for (int s = 0; s < 2; s++) {
            int K = shapes[s][0], N = shapes[s][1];
            tb_dtype dt = f16 ? TB_F16 : TB_F32;
            size_t wbytes = (size_t)K * N * tb_dtype_size(dt);
            int copies = (int)(SPAN_BYTES / wbytes);
            for (int c = 0; c < copies; c++) fill_weights(wbuf + (size_t)c * wbytes, dt, (size_t)K * N);
            double gbs[NV][ROUNDS];
            for (int round = 0; round < ROUNDS; round++)
                for (int i = 0; i < NV; i++) {
                    double t0 = tb_now(), t;
                    long calls = 0;
                    do {
                        const uint8_t *w = wbuf + (size_t)(calls % copies) * wbytes;
                        if (v[i].fn) v[i].fn(x, w, f16, y, K, N);
                        else tb_cpu_matmul(NULL, x, w, dt, NULL, y, 1, K, N);
                        calls++;
                    } while ((t = tb_now() - t0) < secs / ROUNDS);
                    gbs[i][round] = (double)wbytes * calls / t * 1e-9;
                }
            printf("GEMV experiments K=%d N=%d %s, 1 thread, GB/s (median of %d rounds; min, max)\n", K, N,
                   tb_dtype_name(dt), ROUNDS);
            for (int i = 0; i < NV; i++) {
                qsort(gbs[i], ROUNDS, sizeof(double), cmp_d);
                printf("  %-10s %6.1f  (%5.1f, %5.1f)\n", v[i].name, gbs[i][ROUNDS / 2], gbs[i][0],
                       gbs[i][ROUNDS - 1]);
            }
        }
}

/* The decode matmuls of stories260K (dim 64, hidden 172, 5 layers, vocab
 * 512), in model order over 1 MiB of distinct f32 weights (L3, not L2, as in
 * a real step), against the same shapes all reading one layer's weights
 * (L1/L2): per-token microseconds (`kernels_bench S small`). */
static void small_model(double secs) {
    static const int shp[][2] = {{64, 128}, {64, 64}, {64, 344}, {172, 64}};
    size_t per_layer = 0;
    for (int i = 0; i < 4; i++) per_layer += (size_t)shp[i][0] * shp[i][1];
    size_t total = per_layer * 5 + 64 * 512;
    float *w = xalloc(total * sizeof(float));
    fill_weights(w, TB_F32, total);
    float *x = xalloc(4096 * sizeof(float)), *y = xalloc(4096 * sizeof(float));
    for (int i = 0; i < 4096; i++) x[i] = (float)(i % 17) * 0.01f;
    for (int pass = 0; pass < 2; pass++) {
        double best = 1e30;
        for (int round = 0; round < 9; round++) {
            double t0 = tb_now(), t;
            long n = 0;
            do {
                size_t o = 0;
                for (int l = 0; l < 5; l++) {
                    size_t lo = pass ? 0 : o;
                    for (int i = 0; i < 4; i++) {
                        tb_cpu_matmul(NULL, x, w + lo, TB_F32, NULL, y, 1, shp[i][0], shp[i][1]);
                        lo += (size_t)shp[i][0] * shp[i][1];
                    }
                    o += per_layer;
                }
                tb_cpu_matmul(NULL, x, w + (pass ? 0 : o), TB_F32, NULL, y, 1, 64, 512);
                n++;
            } while ((t = tb_now() - t0) < secs / 9);
            if (t / n < best) best = t / n;
        }
        printf("stories260K decode matmuls, %s: %.2f us per token (best of 9)\n",
               pass ? "one layer's weights (cache-resident)" : "all 1 MiB of weights", best * 1e6);
    }
    tb_free_aligned(w);
    tb_free_aligned(x);
    tb_free_aligned(y);
}

/* Decode attention at stories260K's shape (8 q heads, 4 kv heads, hd 8,
 * f32 cache, 5 layers, blocks of 16) at context `ctx`: per-token
 * microseconds with the cache resident (`kernels_bench S attn`). */
static void attn_model(double secs) {
    enum { L = 5, H = 8, KV = 4, HD = 8, BS = 16, MAXB = 32 };
    int max_ctx = BS * MAXB;
    size_t cache_elems = (size_t)MAXB * BS * KV * HD;
    float *kc = xalloc(L * cache_elems * 4), *vc = xalloc(L * cache_elems * 4);
    fill_weights(kc, TB_F32, L * cache_elems);
    fill_weights(vc, TB_F32, L * cache_elems);
    float *qkv = xalloc((H + 2 * KV) * HD * 4), *out = xalloc(H * HD * 4);
    fill_weights(qkv, TB_F32, (H + 2 * KV) * HD);
    float *scratch = xalloc(tb_attention_scratch_floats(1, max_ctx) * 4);
    int32_t bt[MAXB], seq = 0;
    for (int i = 0; i < MAXB; i++) bt[i] = i;
    static const int ctxs[] = {32, 130, 256, 500};
    for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++) {
        int32_t pos = ctxs[c] - 1;
        double best = 1e30;
        for (int round = 0; round < 9; round++) {
            double t0 = tb_now(), t;
            long n = 0;
            do {
                for (int l = 0; l < L; l++) {
                    tb_attn_args a = {1, H, KV, HD, 0.35f, &pos, &seq, bt, MAXB, BS,
                                      kc + l * cache_elems, vc + l * cache_elems, TB_F32};
                    tb_cpu_attention(NULL, &a, qkv, out, scratch, max_ctx);
                }
                n++;
            } while ((t = tb_now() - t0) < secs / 9);
            if (t / n < best) best = t / n;
        }
        printf("stories260K decode attention, ctx %d: %.2f us per token (5 layers, best of 9)\n", ctxs[c],
               best * 1e6);
    }
    tb_free_aligned(kc); tb_free_aligned(vc); tb_free_aligned(qkv); tb_free_aligned(out);
    tb_free_aligned(scratch);
}

/* Decode attention of the f32 134M Llama at batch 8 (12 layers, 12 heads,
 * hd 64, f32 paged cache in blocks of 16, the 8 sequences' blocks
 * interleaved as a decode allocates them), 2 threads, every sequence at
 * context ctx: ms per step, the cache evicted from L3 before each step as
 * the weight stream does in a real one (`kernels_bench S attn8`). */
static void attn8_model(double secs) {
    enum { L = 12, H = 12, KV = 12, HD = 64, BS = 16, S = 8, MAXB = 16 };
    int max_ctx = BS * MAXB;
    size_t layer_elems = (size_t)S * MAXB * BS * KV * HD;
    float *kc = xalloc(L * layer_elems * 4), *vc = xalloc(L * layer_elems * 4);
    fill_weights(kc, TB_F32, L * layer_elems);
    fill_weights(vc, TB_F32, L * layer_elems);
    size_t qkv_row = (H + 2 * KV) * HD;
    float *qkv = xalloc(S * qkv_row * 4), *out = xalloc(S * H * HD * 4);
    fill_weights(qkv, TB_F32, S * qkv_row);
    float *scratch = xalloc(tb_attention_scratch_floats(2, max_ctx) * 4);
    size_t flush_n = (size_t)64 << 20;
    uint8_t *flush = xalloc(flush_n);
    memset(flush, 1, flush_n);
    int32_t bt[S * MAXB], seq[S], pos[S];
    for (int s = 0; s < S; s++) {
        seq[s] = s;
        for (int b = 0; b < MAXB; b++) bt[s * MAXB + b] = b * S + s;
    }
    tb_pool *p = NULL;
    if (tb_pool_create(2, &p) != TB_OK) exit(1);
    static const int ctxs[] = {32, 96, 160};
    for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++) {
        for (int s = 0; s < S; s++) pos[s] = ctxs[c] - 1;
        enum { N = 41 };
        double ms[N];
        volatile uint32_t sink = 0;
        for (int it = 0; it < N; it++) {
            uint32_t acc = 0;
            for (size_t i = 0; i < flush_n; i += 64) acc += flush[i];
            sink += acc;
            double t0 = tb_now();
            for (int l = 0; l < L; l++) {
                tb_attn_args a = {S, H, KV, HD, 0.125f, pos, seq, bt, MAXB, BS,
                                  kc + l * layer_elems, vc + l * layer_elems, TB_F32};
                tb_cpu_attention(p, &a, qkv, out, scratch, max_ctx);
            }
            ms[it] = (tb_now() - t0) * 1e3;
        }
        qsort(ms, N, sizeof(double), cmp_d);
        double mb = 2.0 * L * S * ctxs[c] * KV * HD * 4 * 1e-6;
        printf("134M batch-8 decode attention, ctx %3d: %.3f ms per step (min %.3f; %.1f MB, %.1f GB/s)\n",
               ctxs[c], ms[N / 2], ms[0], mb, mb / ms[N / 2]);
    }
    (void)secs;
    tb_pool_free(p);
    tb_free_aligned(kc); tb_free_aligned(vc); tb_free_aligned(qkv); tb_free_aligned(out);
    tb_free_aligned(scratch); tb_free_aligned(flush);
}

/* Decode attention of the 134M Llama (12 layers, 12 heads = kv heads, hd
 * 64, blocks of 16) for `batch` sequences at context 1024, 2 threads, per KV
 * dtype: ms per step with the cache evicted from L3 before each step (as
 * the weight stream does in a real one), and the cache bytes read per
 * second. Rounds take the dtypes in turn so that load on this shared
 * machine hits each alike (`kernels_bench S attnkv`; KB_BATCH, default 1;
 * KB_CTX, default and at most 1024, the positions attended;
 * KB_NOFLUSH=1 keeps whatever of the cache stays in L3; KB_THREADS, default
 * 2, the pool's threads). With KB_BATCH=1
 * each round runs every dtype twice, positions split between the threads
 * and heads split (tb_cpu_attention_force_split), in alternating order. */
static void attnkv_model(void) {
    enum { L = 12, H = 12, KV = 12, HD = 64, BS = 16, CTX = 1024, MAXB = CTX / BS, ND = 4, N = 15 };
    int S = getenv("KB_BATCH") ? atoi(getenv("KB_BATCH")) : 1;
    if (S < 1 || S > 16) S = 1;
    int ctx = getenv("KB_CTX") ? atoi(getenv("KB_CTX")) : CTX; /* positions attended, <= CTX */
    if (ctx < 1 || ctx > CTX) ctx = CTX;
    static const tb_dtype dts[ND] = {TB_F32, TB_F16, TB_I8, TB_FP8_E4M3};
    uint8_t *kc[ND], *vc[ND];
    size_t layer_bytes[ND];
    float *src = xalloc((size_t)BS * KV * HD * 4);
    for (int d = 0; d < ND; d++) {
        size_t blkb = tb_kv_block_bytes(dts[d], BS, KV, HD), cb = tb_kv_codes_bytes(dts[d], BS, KV, HD);
        layer_bytes[d] = blkb * (size_t)S * MAXB;
        kc[d] = xalloc(L * layer_bytes[d]);
        vc[d] = xalloc(L * layer_bytes[d]);
        for (size_t b = 0; b < (size_t)L * S * MAXB; b++) /* every block from the same random rows */
            for (int c = 0; c < 2; c++) {
                uint8_t *blk = (c ? vc[d] : kc[d]) + b * blkb;
                fill_weights(src, TB_F32, (size_t)BS * KV * HD);
                for (int r = 0; r < BS * KV; r++) {
                    if (tb_kv_quantized(dts[d]))
                        tb_ref_kv_quantize(src + (size_t)r * HD, HD, dts[d], blk + (size_t)r * HD, (float *)(blk + cb) + r);
                    else
                        tb_convert(src + (size_t)r * HD, TB_F32, blk + (size_t)r * HD * tb_kv_elem_bytes(dts[d]),
                                   dts[d], HD);
                }
            }
    }
    size_t qkv_row = (H + 2 * KV) * HD;
    float *qkv = xalloc((size_t)S * qkv_row * 4), *out = xalloc((size_t)S * H * HD * 4);
    fill_weights(qkv, TB_F32, (size_t)S * qkv_row);
    float *scratch = xalloc(tb_attention_scratch_floats(2, CTX) * 4);
    size_t flush_n = (size_t)64 << 20;
    uint8_t *flush = xalloc(flush_n);
    memset(flush, 1, flush_n);
    int32_t *bt = xalloc(sizeof(int32_t) * (size_t)S * MAXB), seq[16], pos[16];
    for (int s = 0; s < S; s++) {
        seq[s] = s;
        pos[s] = ctx - 1;
        for (int b = 0; b < MAXB; b++) bt[s * MAXB + b] = b * S + s;
    }
    tb_pool *p = NULL;
    if (tb_pool_create(getenv("KB_THREADS") ? atoi(getenv("KB_THREADS")) : 2, &p) != TB_OK) exit(1);
    double ms[ND][N], ms_heads[ND][N];
    volatile uint32_t sink = 0;
    int no_flush = getenv("KB_NOFLUSH") && atoi(getenv("KB_NOFLUSH"));
    int modes = S == 1 ? 2 : 1;
    for (int it = 0; it < N; it++)
        for (int d = 0; d < ND; d++)
            for (int mi = 0; mi < modes; mi++) {
            int split = modes == 1 ? -1 : (mi + it) % 2; /* which goes first alternates */
            tb_cpu_attention_force_split(split);
            uint32_t acc = 0;
            for (size_t i = 0; i < flush_n && !no_flush; i += 64) acc += flush[i];
            sink += acc;
            double t0 = tb_now();
            for (int l = 0; l < L; l++) {
                tb_attn_args a = {S, H, KV, HD, 0.125f, pos, seq, bt, MAXB, BS,
                                  kc[d] + l * layer_bytes[d], vc[d] + l * layer_bytes[d], dts[d]};
                tb_cpu_attention(p, &a, qkv, out, scratch, CTX);
            }
            (split == 0 ? ms_heads : ms)[d][it] = (tb_now() - t0) * 1e3;
            tb_cpu_attention_force_split(-1);
        }
    printf("134M decode attention, batch %d, ctx %d, 2 threads, path %s (median of %d interleaved rounds):\n", S, ctx,
           tb_cpu_kernel_path(), N);
    for (int d = 0; d < ND; d++) {
        qsort(ms[d], N, sizeof(double), cmp_d);
        double mb = 2.0 * L * S * ctx * tb_kv_bytes_per_token(dts[d], BS, KV, HD, 1) / 2.0 * 1e-6;
        printf("  %-5s %7.3f ms per step (min %.3f; %6.1f MB of cache, %5.1f GB/s; %.2fx f32)\n",
               tb_kv_dtype_label(dts[d]), ms[d][N / 2], ms[d][0], mb, mb / ms[d][N / 2], ms[0][N / 2] / ms[d][N / 2]);
        if (modes == 2) {
            qsort(ms_heads[d], N, sizeof(double), cmp_d);
            printf("  %-5s %7.3f ms per step split by heads (min %.3f; %5.1f GB/s; positions split / heads split %.2f)\n",
                   tb_kv_dtype_label(dts[d]), ms_heads[d][N / 2], ms_heads[d][0], mb / ms_heads[d][N / 2],
                   ms[d][N / 2] / ms_heads[d][N / 2]);
        }
    }
    tb_pool_free(p);
    for (int d = 0; d < ND; d++) { tb_free_aligned(kc[d]); tb_free_aligned(vc[d]); }
    tb_free_aligned(src); tb_free_aligned(qkv); tb_free_aligned(out); tb_free_aligned(scratch);
    tb_free_aligned(flush); tb_free_aligned(bt);
}

/* The decode matmuls of the f32 134M Llama (12 layers of qkv 768->2304,
 * o 768->768, gate/up 768->4096, down 2048->768, then the 768->32000 head),
 * in model order over distinct weights (438 MB, from DRAM as in a real
 * step), 2 threads: ms per step at T = 1 and T = 8 and the aggregate
 * tokens/s ratio (`kernels_bench S batch`). Rounds alternate T = 1 and
 * T = 8 so that load on this shared machine hits both. */
static void batch_model(double secs) {
    static const int shp[][2] = {{768, 2304}, {768, 768}, {768, 4096}, {2048, 768}};
    enum { L = 12, ROUNDS = 7 };
    size_t per_layer = 0;
    for (int i = 0; i < 4; i++) per_layer += (size_t)shp[i][0] * shp[i][1];
    size_t total = per_layer * L + (size_t)768 * 32000;
    float *w = xalloc(total * sizeof(float));
    fill_weights(w, TB_F32, total);
    float *x = xalloc((size_t)8 * 2048 * sizeof(float)), *y = xalloc((size_t)8 * 32000 * sizeof(float));
    for (int i = 0; i < 8 * 2048; i++) x[i] = (float)(i % 17) * 0.01f - 0.08f;
    tb_pool *p = NULL;
    if (tb_pool_create(2, &p) != TB_OK) exit(1);
    double ms[2][ROUNDS];
    for (int round = 0; round < ROUNDS; round++)
        for (int b = 0; b < 2; b++) {
            int T = b ? 8 : 1;
            double t0 = tb_now(), t;
            long n = 0;
            do {
                size_t o = 0;
                for (int l = 0; l < L; l++)
                    for (int i = 0; i < 4; i++) {
                        tb_cpu_matmul(p, x, w + o, TB_F32, NULL, y, T, shp[i][0], shp[i][1]);
                        o += (size_t)shp[i][0] * shp[i][1];
                    }
                tb_cpu_matmul(p, x, w + o, TB_F32, NULL, y, T, 768, 32000);
                n++;
            } while ((t = tb_now() - t0) < secs / ROUNDS || n < 2);
            ms[b][round] = t / n * 1e3;
        }
    for (int b = 0; b < 2; b++) qsort(ms[b], ROUNDS, sizeof(double), cmp_d);
    double m1 = ms[0][ROUNDS / 2], m8 = ms[1][ROUNDS / 2];
    printf("134M decode matmuls, f32, 2 threads, ms per step (median of %d rounds; min, max):\n", ROUNDS);
    printf("  T=1 %7.2f (%6.2f, %6.2f)  %6.1f GB/s\n", m1, ms[0][0], ms[0][ROUNDS - 1], total * 4.0 / m1 * 1e-6);
    printf("  T=8 %7.2f (%6.2f, %6.2f)  %6.1f GFLOP/s\n", m8, ms[1][0], ms[1][ROUNDS - 1],
           2.0 * 8 * total / m8 * 1e-6);
    printf("  aggregate tokens/s, T=8 / T=1: %.2fx\n", 8.0 * m1 / m8);
    tb_pool_free(p);
    tb_free_aligned(w);
    tb_free_aligned(x);
    tb_free_aligned(y);
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.3;
    const char *only = argc > 2 ? argv[2] : "";
    static const int gemv_shapes[][2] = {{768, 2304}, {768, 768}, {768, 4096}, {2048, 768}, {768, 32000}};
    static const int gemm_shapes[][2] = {{768, 2304}, {768, 768}, {768, 4096}, {2048, 768}};
    static const tb_dtype dts[] = {TB_F32, TB_F16};
    char model[128], feat[128];
    tb_cpu_model_name(model, sizeof model);
    tb_cpu_features_str(tb_cpu_features(), feat, sizeof feat);
    printf("cpu: %s [%s], kernel path: %s, OpenBLAS: %s\n\n", model, feat, tb_cpu_kernel_path(),
           tb_cpu_matmul_tactic_available(TB_MM_BLAS, TB_F32) ? "yes" : "no");

    uint8_t *wbuf = xalloc(SPAN_BYTES + ((size_t)128 << 20));
    float *x = xalloc((size_t)512 * 2048 * sizeof(float));
    float *y = xalloc((size_t)512 * 32000 * sizeof(float));
    for (size_t i = 0; i < (size_t)512 * 2048; i++) x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    if (!strcmp(only, "attn")) {
        attn_model(secs);
        return 0;
    }
    if (!strcmp(only, "attn8")) {
        attn8_model(secs);
        return 0;
    }
    if (!strcmp(only, "attnkv")) {
        attnkv_model();
        return 0;
    }
    if (!strcmp(only, "batch")) {
        batch_model(secs);
        return 0;
    }
    if (!strcmp(only, "small")) {
        small_model(secs);
        return 0;
    }
    if (!strcmp(only, "gemvx")) {
        /* KB_HUGE=1: back the weights with transparent huge pages */
        if (getenv("KB_HUGE") && atoi(getenv("KB_HUGE")))
        {
            uintptr_t a = ((uintptr_t)wbuf + 4095) & ~(uintptr_t)4095;
            printf("madvise(MADV_HUGEPAGE): %d\n",
                   madvise((void *)a, SPAN_BYTES + ((size_t)127 << 20), MADV_HUGEPAGE));
        }
        gemv_experiments(wbuf, x, y, secs);
        return 0;
    }

    for (int nth = 1; nth <= 2; nth++) {
        tb_pool *p = NULL;
        if (tb_pool_create(nth, &p) != TB_OK) return 1;
        double cp = copy_gbs(p, secs);
        printf("== %d thread%s: copy bandwidth %.1f GB/s (256 MiB tb_cpu_copy)\n", nth,
               nth > 1 ? "s" : "", cp);
        printf("GEMV T=1       %-6s %8s %9s %8s %7s\n", "dtype", "MB", "us/call", "GB/s", "%copy");
        for (size_t d = 0; d < 2 && strcmp(only, "gemm"); d++)
            for (size_t s = 0; s < sizeof gemv_shapes / sizeof gemv_shapes[0]; s++) {
                int K = gemv_shapes[s][0], N = gemv_shapes[s][1];
                size_t wbytes = (size_t)K * N * tb_dtype_size(dts[d]);
                int copies = (int)((SPAN_BYTES + wbytes - 1) / wbytes);
                if ((size_t)copies * wbytes > SPAN_BYTES + ((size_t)128 << 20)) copies--;
                for (int c = 0; c < copies; c++) fill_weights(wbuf + (size_t)c * wbytes, dts[d], (size_t)K * N);
                double t = time_matmul(p, TB_MM_OWN, x, wbuf, wbytes, copies, dts[d], y, 1, K, N, secs);
                double gbs = (double)wbytes / t * 1e-9;
                printf("  K=%-4d N=%-5d %-6s %8.2f %9.1f %8.1f %6.0f%%\n", K, N, tb_dtype_name(dts[d]),
                       (double)wbytes / 1e6, t * 1e6, gbs, 100.0 * gbs / cp);
            }
        printf("GEMM T=512     %-6s %10s %10s %10s\n", "dtype", "own GF/s", "blas GF/s", "own/blas");
        for (size_t d = 0; d < 2 && strcmp(only, "gemv"); d++)
            for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
                int K = gemm_shapes[s][0], N = gemm_shapes[s][1], T = 512;
                size_t wbytes = (size_t)K * N * tb_dtype_size(dts[d]);
                fill_weights(wbuf, dts[d], (size_t)K * N);
                double flop = 2.0 * T * K * N;
                double own = flop / time_matmul(p, TB_MM_OWN, x, wbuf, wbytes, 1, dts[d], y, T, K, N, secs) * 1e-9;
                double blas = 0;
                if (tb_cpu_matmul_tactic_available(TB_MM_BLAS, dts[d]))
                    blas = flop / time_matmul(p, TB_MM_BLAS, x, wbuf, wbytes, 1, dts[d], y, T, K, N, secs) * 1e-9;
                if (blas > 0)
                    printf("  K=%-4d N=%-5d %-6s %10.1f %10.1f %10.2f\n", K, N, tb_dtype_name(dts[d]), own,
                           blas, own / blas);
                else
                    printf("  K=%-4d N=%-5d %-6s %10.1f %10s %10s\n", K, N, tb_dtype_name(dts[d]), own, "-", "-");
            }
        printf("\n");
        tb_pool_free(p);
    }
    tb_free_aligned(wbuf);
    tb_free_aligned(x);
    tb_free_aligned(y);
    return 0;
}
