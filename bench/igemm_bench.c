/*
 * igemm_bench.c — GOP/s of the int8 GEMM (backend/cpu/igemm.c) on the
 * shapes of the INT8 ONNX engines, beside the f32 packed sgemm
 * (tb_cpu_sgemm_packed) on the same shapes, and their ratio; 1 thread and
 * the pool (-t). Peaks measured here: the vpdpbusd loop (64 int8
 * multiply-adds per 512-bit instruction) and the f32 FMA loop.
 *
 *   igemm_bench [-t threads] [-r seconds per case] [-f filter] [-p path]
 *
 * -p forces the kernel path (avx512, avx2, scalar); TB_IGEMM_NO_AVXVNNI=1
 * keeps "avx2" on the int16 kernel where the CPU has AVX-VNNI. Run with
 * TB_CPU_MASK=7 (AVX2, FMA, F16C) to have the f32 sgemm on AVX2 as well
 * (it follows the CPU features, not the forced path). Each case alternates
 * int8 and f32 runs (two rounds of each) and keeps each one's best: on a
 * shared machine the ratio is the figure to read. Ops: 2 * M * N * K.
 * Then the direct int8 conv (tb_cpu_iconv_*, igemm_conv.c) on ResNet-18's
 * convs at batch 1, one thread: the codes (quantize + layout) and the conv
 * with its bias + ReLU epilogue, each its best; ops counted on the conv's
 * own multiply-adds (2 M oh ow C kh kw), not the padded work.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/igemm.h"
#include "backend/cpu/igemm_impl.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/nn_conv_impl.h"

/* ---------------------------------------------------------------- peaks */

/* 16 independent chains in named registers (arrays of them stayed in
 * memory with GCC, a store and a load per instruction) */
#define CHAINS 16
#define DECL16(T, init) T a0 = init(0), a1 = init(1), a2 = init(2), a3 = init(3), a4 = init(4), a5 = init(5), \
    a6 = init(6), a7 = init(7), a8 = init(8), a9 = init(9), a10 = init(10), a11 = init(11), a12 = init(12),     \
    a13 = init(13), a14 = init(14), a15 = init(15)
#define OP16(OP) OP(a0); OP(a1); OP(a2); OP(a3); OP(a4); OP(a5); OP(a6); OP(a7); OP(a8); OP(a9); OP(a10); OP(a11); \
    OP(a12); OP(a13); OP(a14); OP(a15)

__attribute__((target("avx512f,avx512vnni"))) static int vnni_loop(long n) {
    __m512i b = _mm512_set1_epi32(0x01010101), c = _mm512_set1_epi32(0x01ff01ff);
#define INIT_I(i) _mm512_set1_epi32(i)
#define STEP_I(x) __asm__("vpdpbusd %2, %1, %0" : "+v"(x) : "v"(b), "v"(c))
    DECL16(__m512i, INIT_I);
    for (long k = 0; k < n; k++) { OP16(STEP_I); }
    __m512i s = _mm512_setzero_si512();
#define SUM_I(x) s = _mm512_add_epi32(s, x)
    OP16(SUM_I);
    return _mm512_reduce_add_epi32(s);
}

__attribute__((target("avx512f,fma"))) static float fma_loop(long n) {
    __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
#define INIT_F(i) _mm512_set1_ps((float)(i))
#define STEP_F(x) __asm__("vfmadd213ps %2, %1, %0" : "+v"(x) : "v"(b), "v"(c))
    DECL16(__m512, INIT_F);
    for (long k = 0; k < n; k++) { OP16(STEP_F); }
    __m512 s = _mm512_setzero_ps();
#define SUM_F(x) s = _mm512_add_ps(s, x)
    OP16(SUM_F);
    return _mm512_reduce_add_ps(s);
}

typedef struct {
    int vnni;
    long n;
    double ops[64];
    volatile float sink;
} peak_job;

static void peak_run(void *arg, int ith, int nth) {
    (void)nth;
    peak_job *j = arg;
    double t = tb_now();
    j->sink = j->vnni ? (float)vnni_loop(j->n) : fma_loop(j->n);
    t = tb_now() - t;
    j->ops[ith] = (double)j->n * CHAINS * (j->vnni ? 128 : 32) / t;
}

/* G(FL)OP/s of the loop on the pool's threads (the sum of their rates),
 * best of many ~1 ms runs (some run unpreempted on a shared machine) */
static double peak(tb_pool *pool, int vnni) {
    double best = 0;
    for (int rep = 0; rep < 300; rep++) {
        peak_job j = {vnni, 60000, {0}, 0};
        if (pool) tb_pool_run(pool, peak_run, &j);
        else peak_run(&j, 0, 1);
        int nth = pool ? tb_pool_size(pool) : 1;
        double s = 0;
        for (int i = 0; i < nth; i++) s += j.ops[i];
        if (s > best) best = s;
    }
    return best / 1e9;
}

/* ---------------------------------------------------------------- cases */

static double opt_seconds = 0.3;
static const char *opt_filter = NULL;

typedef struct {
    int64_t M, N, K;
    const uint8_t *A;
    const void *Wp;
    const float *ws, *Af, *Bp;
    float *Y;
    tb_cpu_sgemm_epi *epi;
    tb_pool *pool;
} bcase;

static void run_int8(const bcase *c) {
    tb_cpu_igemm(c->M, c->N, c->K, c->A, c->K, 128, 0.02f, c->Wp, c->ws, c->Y, c->N, c->epi, c->pool);
}
static void run_f32(const bcase *c) {
    tb_cpu_sgemm_packed(0, c->M, c->N, c->K, 1.0f, c->Af, c->K, c->Bp, 0.0f, c->Y, c->N, c->epi, c->pool);
}

static double best_of(void (*fn)(const bcase *), const bcase *c) {
    double best = 1e30, start = tb_now();
    int n = 0;
    while (n < 3 || tb_now() - start < opt_seconds) {
        double t = tb_now();
        fn(c);
        t = tb_now() - t;
        if (t < best) best = t;
        n++;
    }
    return best;
}

static uint64_t seed = 88172645463325252ull;
static uint32_t rnd(void) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return (uint32_t)(seed >> 20);
}

static double g_peak_i8, g_peak_f32;

static void bench(const char *name, int64_t M, int64_t N, int64_t K, int relu, tb_pool *pool) {
    char label[96];
    snprintf(label, sizeof label, "%s M%lld N%lld K%lld", name, (long long)M, (long long)N, (long long)K);
    if (opt_filter && !strstr(label, opt_filter)) return;
    uint8_t *A = tb_alloc_aligned((size_t)(M * K) + 64, 64);
    int8_t *W = malloc((size_t)(N * K));
    float *ws = malloc((size_t)N * sizeof(float)), *bias = malloc((size_t)N * sizeof(float));
    float *Af = tb_alloc_aligned((size_t)(M * K) * sizeof(float), 64), *Wf = malloc((size_t)(N * K) * sizeof(float));
    float *Y = tb_alloc_aligned((size_t)(M * N) * sizeof(float), 64);
    void *Wp = tb_alloc_aligned(tb_cpu_igemm_packed_bytes(N, K), 64);
    float *Bp = tb_alloc_aligned(tb_cpu_sgemm_packed_floats(K, N) * sizeof(float), 64);
    for (int64_t i = 0; i < M * K; i++) A[i] = (uint8_t)rnd(), Af[i] = (float)A[i] / 255.0f;
    for (int64_t i = 0; i < N * K; i++) W[i] = (int8_t)((int)(rnd() % 255) - 127), Wf[i] = (float)W[i] / 127.0f;
    for (int64_t n = 0; n < N; n++) ws[n] = 0.01f, bias[n] = 0.1f;
    tb_cpu_igemm_pack(W, K, N, K, Wp);
    tb_cpu_sgemm_pack_b(1, K, N, Wf, K, Bp);
    tb_cpu_sgemm_epi e = {0};
    e.bias = bias, e.bias_cs = 1, e.act = relu ? TB_NN_ACT_RELU : TB_NN_ACT_NONE;
    double ops = 2.0 * (double)M * (double)N * (double)K;
    for (int t = 0; t < 2; t++) {
        tb_pool *p = t ? pool : NULL;
        if (t && !pool) break;
        bcase c = {M, N, K, A, Wp, ws, Af, Bp, Y, &e, p};
        run_int8(&c), run_f32(&c); /* warm: scratch, pages */
        double ti = 1e30, tf = 1e30;
        for (int round = 0; round < 2; round++) {
            double a = best_of(run_int8, &c), b = best_of(run_f32, &c);
            ti = a < ti ? a : ti, tf = b < tf ? b : tf;
        }
        int nth = p ? tb_pool_size(p) : 1;
        double gi = ops / ti / 1e9, gf = ops / tf / 1e9;
        /* percentages of the 1-thread peaks times the threads (0: not measured, no AVX-512) */
        printf("%-34s t%d  int8 %8.3f ms %7.1f GOP/s (%4.1f%% vnni peak)  f32 %8.3f ms %7.1f GFLOP/s (%4.1f%% fma "
               "peak)  int8/f32 %.2fx\n",
               label, nth, ti * 1e3, gi, g_peak_i8 > 0 ? 100.0 * gi / (g_peak_i8 * nth) : 0.0, tf * 1e3, gf,
               g_peak_f32 > 0 ? 100.0 * gf / (g_peak_f32 * nth) : 0.0, tf / ti);
        fflush(stdout);
    }
    tb_free_aligned(A), free(W), free(ws), free(bias), tb_free_aligned(Af), free(Wf), tb_free_aligned(Y);
    tb_free_aligned(Wp), tb_free_aligned(Bp);
}

static void bench_iconv(const char *name, int64_t C, int64_t H, int64_t M, int k, int st) {
    char label[96];
    snprintf(label, sizeof label, "iconv %s C%lld H%lld M%lld k%d s%d", name, (long long)C, (long long)H, (long long)M,
             k, st);
    if (opt_filter && !strstr(label, opt_filter)) return;
    if (!tb_cpu_iconv_supported(C, k, k, st, st, 1, 1, 1, TB_NN_ACT_RELU)) return;
    tb_iconv_geom g;
    tb_cpu_iconv_geometry(C, H, H, k, k, st, k / 2, k / 2, k / 2, k / 2, &g);
    int64_t P = g.oh * g.ow;
    float *x = malloc((size_t)(C * H * H) * sizeof(float)), *ws = malloc((size_t)M * sizeof(float));
    float *bias = malloc((size_t)M * sizeof(float)), *y = tb_alloc_aligned((size_t)(M * P) * sizeof(float), 64);
    int8_t *w = malloc((size_t)(M * C * k * k));
    uint8_t *q = tb_alloc_aligned(tb_cpu_iconv_codes_bytes(&g), 64);
    uint32_t *tmp = malloc((size_t)(g.hp * g.wp) * 4);
    void *wp = tb_alloc_aligned(tb_cpu_iconv_packed_bytes(M, C, k, k), 64);
    for (int64_t i = 0; i < C * H * H; i++) x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    for (int64_t i = 0; i < M * C * k * k; i++) w[i] = (int8_t)((int)(rnd() % 255) - 127);
    for (int64_t i = 0; i < M; i++) ws[i] = 0.01f, bias[i] = 0.1f;
    tb_cpu_iconv_pack(w, M, C, k, k, wp);
    tb_iconv_job j;
    memset(&j, 0, sizeof j);
    j.g = &g, j.q = q, j.w = wp, j.m = M, j.zero = 128, j.a_scale = 0.02f, j.w_scale = ws, j.bias = bias, j.y = y;
    j.act = TB_NN_ACT_RELU;
    tb_cpu_iconv_job_init(&j);
    double tq = 1e30, tc = 1e30, start = tb_now();
    for (int n = 0; n < 3 || tb_now() - start < opt_seconds; n++) {
        double t0 = tb_now();
        tb_cpu_iconv_quantize(&g, x, 50.0f, 128, q, st > 1 ? tmp : NULL, 0, g.cg);
        double t1 = tb_now();
        tb_cpu_iconv_run(&j, 0, j.nblocks, 0, g.nvec);
        double t2 = tb_now();
        tq = t1 - t0 < tq ? t1 - t0 : tq;
        tc = t2 - t1 < tc ? t2 - t1 : tc;
    }
    double ops = 2.0 * (double)M * (double)P * (double)(C * k * k), gi = ops / tc / 1e9;
    printf("%-34s t1  codes %6.3f ms  conv %7.3f ms %7.1f GOP/s (%4.1f%% vnni peak)\n", label, tq * 1e3, tc * 1e3, gi,
           g_peak_i8 > 0 ? 100.0 * gi / g_peak_i8 : 0.0);
    fflush(stdout);
    free(x), free(ws), free(bias), free(w), free(tmp);
    tb_free_aligned(y), tb_free_aligned(q), tb_free_aligned(wp);
}

int main(int argc, char **argv) {
    int threads = 2;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) opt_seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) opt_filter = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) path = argv[++i];
        else {
            fprintf(stderr, "usage: igemm_bench [-t threads] [-r seconds] [-f filter] [-p avx512|avx2|scalar]\n");
            return 2;
        }
    }
    if (path && tb_cpu_kernel_force_path(path) != 0) {
        fprintf(stderr, "igemm_bench: path %s not available\n", path);
        return 1;
    }
    tb_pool *pool = NULL;
    if (threads > 1 && tb_pool_create(threads, &pool) != TB_OK) {
        fprintf(stderr, "igemm_bench: %s\n", tb_last_error());
        return 1;
    }
    uint32_t f = tb_cpu_features();
    char fs[128];
    tb_cpu_features_str(f, fs, sizeof fs);
    int have = (f & TB_CPU_AVX512F) && tb_cpu_has_avx512vnni();
    g_peak_i8 = have ? peak(NULL, 1) : 0;
    g_peak_f32 = (f & TB_CPU_AVX512F) ? peak(NULL, 0) : 0;
    if (getenv("TB_IGEMM_NO_AVXVNNI")) tb_cpu_igemm_allow_avxvnni(0);
    printf("cpu: %s%s; path %s, int8 kernel %s; threads 1 and %d\n", fs, have ? " avx512vnni" : "", tb_cpu_kernel_path(),
           tb_cpu_igemm_kernel(), threads);
    printf("peaks on 1 thread: vpdpbusd loop %.1f GOP/s, f32 FMA loop %.1f GFLOP/s (ratio %.2f)\n", g_peak_i8,
           g_peak_f32, g_peak_f32 > 0 ? g_peak_i8 / g_peak_f32 : 0.0);
    /* BERT-base, seq 128: batch 1 and 8 (M = tokens) */
    static const int64_t bert[][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}};
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 4; i++) bench(b ? "bert-b8" : "bert-b1", b ? 1024 : 128, bert[i][0], bert[i][1], 0, pool);
    /* ResNet-18 convs through im2row: M = output pixels, K = Cin * kh * kw, N = Cout (relu epilogue) */
    static const int64_t rn[][3] = {{12544, 64, 147}, {3136, 64, 576}, {784, 128, 576},  {784, 128, 1152},
                                    {784, 128, 64},   {196, 256, 1152}, {196, 256, 2304}, {196, 256, 128},
                                    {49, 512, 2304},  {49, 512, 4608},  {49, 512, 256}};
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 11; i++)
            bench(b ? "resnet-b8" : "resnet-b1", rn[i][0] * (b ? 8 : 1), rn[i][1], rn[i][2], 1, pool);
    /* a few rows: the GEMV regime */
    for (int64_t m = 1; m <= 4; m *= 2) bench("gemv", m, 3072, 768, 0, pool);
    /* ResNet-18's convs through the direct int8 conv (QConv's kernel on AVX-512 VNNI) */
    bench_iconv("stem", 3, 224, 64, 7, 2);
    bench_iconv("layer1", 64, 56, 64, 3, 1);
    bench_iconv("layer2.0", 64, 56, 128, 3, 2);
    bench_iconv("layer2.0ds", 64, 56, 128, 1, 2);
    bench_iconv("layer2", 128, 28, 128, 3, 1);
    bench_iconv("layer3.0", 128, 28, 256, 3, 2);
    bench_iconv("layer3", 256, 14, 256, 3, 1);
    bench_iconv("layer4.0", 256, 14, 512, 3, 2);
    bench_iconv("layer4", 512, 7, 512, 3, 1);
    if (pool) tb_pool_free(pool);
    return 0;
}
