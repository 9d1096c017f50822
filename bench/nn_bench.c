/*
 * nn_bench.c — GFLOP/s of the CPU compute kernels of the general ops
 * (backend/cpu/sgemm.c, nn_conv.c) against the machine's FMA peak, measured
 * here with a register-resident FMA loop on 1 and n threads.
 *
 *   nn_bench [-t threads] [-r seconds per case] [-f filter] [-c] [-b batch]
 *
 * -c times by the calling thread's CPU time instead of the wall clock
 * (with -t 1: what the kernel costs when the core is not shared).
 * -b sets the batch of the conv cases (1 by default).
 *
 * Cases: sgemm shapes of BERT-base (128 x 768 x 768, x3072), a square
 * 1024^3, batch-8 versions, then ResNet-18's conv layers at 224x224, batch 1,
 * and BERT-base attention (sdpa). Every figure is the best of repeated runs
 * (the median is printed beside it): the machine may be shared.
 */
#include <immintrin.h>
#include <math.h>
#include <time.h>

#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"

/* ---------------------------------------------------------------- peak */

#define PEAK_CHAINS 24

__attribute__((target("avx512f,fma"))) static float peak_loop512(long n) {
    __m512 a[PEAK_CHAINS];
    __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
#pragma GCC unroll 24
    for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < n; k++) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    __m512 s = a[0];
#pragma GCC unroll 24
    for (int i = 1; i < PEAK_CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float peak_loop256(long n) {
    __m256 a[PEAK_CHAINS];
    __m256 b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
#pragma GCC unroll 24
    for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < n; k++) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    }
    __m256 s = a[0];
#pragma GCC unroll 24
    for (int i = 1; i < PEAK_CHAINS; i++) s = _mm256_add_ps(s, a[i]);
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0];
}

typedef struct {
    int wide;
    long n;
    double flops[64];
    volatile float sink;
} peak_job;

static void peak_run(void *arg, int ith, int nth) {
    peak_job *j = arg;
    double t = tb_now();
    j->sink = j->wide ? peak_loop512(j->n) : peak_loop256(j->n);
    t = tb_now() - t;
    j->flops[ith] = (double)j->n * PEAK_CHAINS * (j->wide ? 32 : 16) / t;
}

/* GFLOP/s of the FMA loop on nth threads (the sum of each thread's rate) */
static double peak_gflops(tb_pool *pool, int wide) {
    double best = 0;
    /* many short runs (about 1 ms each): on a shared machine some of them
     * run without being preempted, as the short GEMM cases do */
    for (int rep = 0; rep < 400; rep++) {
        peak_job j = {wide, 100000, {0}, 0};
        if (pool) tb_pool_run(pool, peak_run, &j);
        else peak_run(&j, 0, 1);
        int nth = pool ? tb_pool_size(pool) : 1;
        double s = 0;
        for (int i = 0; i < nth; i++) s += j.flops[i];
        if (s > best) best = s;
    }
    return best / 1e9;
}

/* ---------------------------------------------------------------- timing */

static double opt_seconds = 0.5;
static int opt_cpu_time = 0;

/* wall time, or with -c the calling thread's CPU time: on a shared machine
 * that leaves out the time other processes held the core (-t 1 only) */
static double now_s(void) {
    if (!opt_cpu_time) return tb_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static const char *opt_filter = NULL;
static int64_t opt_batch = 1;

static void fill(float *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        p[i] = (float)((seed >> 40) * (1.0 / 8388608.0)) - 1.0f;
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef void (*case_fn)(void *arg);

/* best and median seconds of fn over about opt_seconds */
static void time_case(case_fn fn, void *arg, double *best, double *median) {
    double t[256];
    int n = 0;
    fn(arg); /* warm: packing buffers, scratch, pages */
    double start = tb_now();
    while (n < 256 && (n < 3 || tb_now() - start < opt_seconds)) {
        double t0 = now_s();
        fn(arg);
        t[n++] = now_s() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_d);
    *best = t[0];
    *median = t[n / 2];
}

static double g_peak = 0;

static void report(const char *name, double flop, double best, double median) {
    double g = flop / best / 1e9;
    printf("%-40s %9.2f ms %8.1f GFLOP/s (median %7.1f)  %5.1f%% of peak\n", name, best * 1e3, g,
           flop / median / 1e9, 100.0 * g / g_peak);
    fflush(stdout);
}

static int wanted(const char *name) { return !opt_filter || strstr(name, opt_filter); }

/* ---------------------------------------------------------------- sgemm */

typedef struct {
    int ta, tb;
    int64_t M, N, K, batch;
    float *A, *B, *C;
    tb_pool *pool;
    float *Bp; /* B packed once (a weight): tb_cpu_sgemm_packed */
} gemm_case;

static void gemm_call(void *arg) {
    gemm_case *g = arg;
    if (g->Bp) {
        tb_cpu_sgemm_packed(0, g->M * g->batch, g->N, g->K, 1.0f, g->A, g->K, g->Bp, 0.0f, g->C, g->N, NULL, g->pool);
        return;
    }
    for (int64_t b = 0; b < g->batch; b++)
        tb_cpu_sgemm(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->A + b * g->M * g->K, g->ta ? g->M : g->K, g->B,
                     g->tb ? g->K : g->N, 0.0f, g->C + b * g->M * g->N, g->N, g->pool);
}

/* packed: B packed once beforehand and the batch as one GEMM of batch M
 * rows (a linear layer over a weight, as the MatMul / Gemm kernels run it) */
static void bench_gemm_x(tb_pool *pool, int64_t M, int64_t N, int64_t K, int64_t batch, int tb, int packed) {
    char name[96];
    snprintf(name, sizeof name, "sgemm %s%s%lldx%lldx%lld%s", packed ? "packed " : "", batch > 1 ? "8x " : "",
             (long long)M, (long long)N, (long long)K, tb ? " transB" : "");
    if (!wanted(name)) return;
    gemm_case g = {0, tb, M, N, K, batch, NULL, NULL, NULL, pool, NULL};
    g.A = tb_alloc_aligned(sizeof(float) * (size_t)(batch * M * K), 64);
    g.B = tb_alloc_aligned(sizeof(float) * (size_t)(K * N), 64);
    g.C = tb_alloc_aligned(sizeof(float) * (size_t)(batch * M * N), 64);
    fill(g.A, (size_t)(batch * M * K), 1);
    fill(g.B, (size_t)(K * N), 2);
    if (packed) {
        g.Bp = tb_alloc_aligned(sizeof(float) * tb_cpu_sgemm_packed_floats(K, N), 64);
        tb_cpu_sgemm_pack_b(tb, K, N, g.B, tb ? K : N, g.Bp);
    }
    double best, med;
    time_case(gemm_call, &g, &best, &med);
    report(name, 2.0 * M * N * K * batch, best, med);
    tb_free_aligned(g.Bp);
    tb_free_aligned(g.A);
    tb_free_aligned(g.B);
    tb_free_aligned(g.C);
}

/* packed, B cold: each call takes the next of nw packed weights (together
 * far larger than the caches), so B streams from memory as a model's
 * weights do in its forward pass (the warm cases above keep B in L2/L3) */
typedef struct {
    gemm_case g;
    float **Bps;
    int nw, next;
} cold_case;

static void cold_call(void *arg) {
    cold_case *c = arg;
    c->g.Bp = c->Bps[c->next];
    c->next = (c->next + 1) % c->nw;
    gemm_call(&c->g);
}

static void bench_gemm_cold(tb_pool *pool, int64_t M, int64_t N, int64_t K, int nw) {
    char name[96];
    snprintf(name, sizeof name, "sgemm packed cold %lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
    if (!wanted(name)) return;
    cold_case c = {{0, 0, M, N, K, 1, NULL, NULL, NULL, pool, NULL}, NULL, nw, 0};
    c.g.A = tb_alloc_aligned(sizeof(float) * (size_t)(M * K), 64);
    c.g.B = tb_alloc_aligned(sizeof(float) * (size_t)(K * N), 64);
    c.g.C = tb_alloc_aligned(sizeof(float) * (size_t)(M * N), 64);
    fill(c.g.A, (size_t)(M * K), 1);
    fill(c.g.B, (size_t)(K * N), 2);
    c.Bps = calloc((size_t)nw, sizeof *c.Bps);
    for (int i = 0; i < nw; i++) {
        c.Bps[i] = tb_alloc_aligned(sizeof(float) * tb_cpu_sgemm_packed_floats(K, N), 64);
        tb_cpu_sgemm_pack_b(0, K, N, c.g.B, N, c.Bps[i]);
    }
    double best, med;
    time_case(cold_call, &c, &best, &med);
    report(name, 2.0 * M * N * K, best, med);
    for (int i = 0; i < nw; i++) tb_free_aligned(c.Bps[i]);
    free(c.Bps);
    tb_free_aligned(c.g.A);
    tb_free_aligned(c.g.B);
    tb_free_aligned(c.g.C);
}

static void bench_gemm(tb_pool *pool, int64_t M, int64_t N, int64_t K, int64_t batch, int tb) {
    bench_gemm_x(pool, M, N, K, batch, tb, 0);
}

/* ---------------------------------------------------------------- general ops */

typedef struct {
    tb_node n;
    tb_view in[4], out[1];
    int n_in;
    tb_cpu_nn_ctx ctx;
    /* a graph of the node's inputs in which in[1] (and a bias) are weights,
     * so the kernels keep their packed forms across calls as in a model */
    tb_graph graph;
    tb_value values[4];
} op_case;

static void op_case_weights(op_case *o, int n_weights) {
    memset(o->values, 0, sizeof o->values);
    for (int i = 0; i < 4; i++) {
        o->values[i].kind = i >= 1 && i <= n_weights ? TB_VAL_WEIGHT : TB_VAL_ACT;
        o->n.in[i] = i;
    }
    memset(&o->graph, 0, sizeof o->graph);
    o->graph.values = o->values;
    o->graph.n_values = 4;
    o->ctx.graph = &o->graph;
    o->n.n_in = o->n_in;
}

static void op_call(void *arg) {
    op_case *o = arg;
    tb_status s = tb_cpu_nn_run(&o->ctx, &o->n, o->in, o->n_in, o->out, 1);
    TB_ASSERT(s == TB_OK);
}

static void view_alloc(tb_view *v, int rank, const int64_t *dims, uint64_t seed) {
    memset(v, 0, sizeof *v);
    v->dtype = TB_F32;
    v->rank = rank;
    memcpy(v->dims, dims, sizeof(int64_t) * rank);
    size_t n = (size_t)tb_view_numel(v);
    v->data = tb_alloc_aligned(sizeof(float) * (n ? n : 1), 64);
    fill(v->data, n, seed);
}

static void op_case_run(const char *name, op_case *o, double flop) {
    tb_op_shape sh;
    tb_status s = tb_op_infer_views(&o->n, o->in, o->n_in, &sh);
    if (s != TB_OK) {
        printf("%-40s shape rule failed: %s\n", name, tb_last_error());
        return;
    }
    view_alloc(&o->out[0], sh.rank[0], sh.dims[0], 9);
    double best, med;
    time_case(op_call, o, &best, &med);
    report(name, flop, best, med);
    for (int i = 0; i < o->n_in; i++) tb_free_aligned(o->in[i].data);
    tb_free_aligned(o->out[0].data);
    tb_cpu_nn_ctx_release(&o->ctx);
}

/* a ResNet-18 conv: x (1, c, h, h), w (m, c, k, k), stride s, pad p, with
 * bias and relu (the fused form the passes make) */
static void bench_conv1(tb_pool *pool, const char *what, int64_t c, int64_t h, int64_t m, int k, int s, int p,
                        int tactic) {
    static const char *tn[] = {"", " im2col", " winograd", " winograd4", " direct", " winograd4f"};
    char name[96];
    snprintf(name, sizeof name, "conv %s %lld->%lld %dx%d/%d %lldx%lld%s%s", what, (long long)c, (long long)m, k, k, s,
             (long long)h, (long long)h, tn[tactic], opt_batch > 1 ? " (batch)" : "");
    if (!wanted(name)) return;
    op_case o;
    memset(&o, 0, sizeof o);
    o.ctx.pool = pool;
    o.n.op = TB_OP_CONV;
    o.n.tactic = tactic;
    o.n.i[0] = 1;
    o.n.i[1] = o.n.i[2] = s;
    o.n.i[3] = o.n.i[4] = o.n.i[5] = o.n.i[6] = p;
    o.n.i[7] = o.n.i[8] = 1;
    o.n.i[10] = TB_NN_ACT_RELU;
    o.n.i[11] = TB_NN_HAS_BIAS;
    o.n_in = 3;
    op_case_weights(&o, 2);
    view_alloc(&o.in[0], 4, (const int64_t[]){opt_batch, c, h, h}, 1);
    view_alloc(&o.in[1], 4, (const int64_t[]){m, c, k, k}, 2);
    view_alloc(&o.in[2], 1, (const int64_t[]){m}, 3);
    int64_t oh = (h + 2 * p - k) / s + 1;
    op_case_run(name, &o, 2.0 * opt_batch * m * c * k * k * oh * oh);
}

/* a BERT linear layer as the passes fuse it: MatMul x (B, S, K) by w (K, N)
 * with bias and an activation */
static void bench_linear(tb_pool *pool, int64_t B, int64_t S, int64_t K, int64_t N, int act) {
    char name[96];
    snprintf(name, sizeof name, "matmul %lldx%lldx%lld x %lld%s", (long long)B, (long long)S, (long long)K,
             (long long)N, act == TB_NN_ACT_GELU_ERF ? " +bias+gelu" : " +bias");
    if (!wanted(name)) return;
    op_case o;
    memset(&o, 0, sizeof o);
    o.ctx.pool = pool;
    o.n.op = TB_OP_NN_MATMUL;
    o.n.i[2] = act;
    o.n.i[3] = TB_NN_HAS_BIAS;
    o.n_in = 3;
    op_case_weights(&o, 2);
    view_alloc(&o.in[0], 3, (const int64_t[]){B, S, K}, 1);
    view_alloc(&o.in[1], 2, (const int64_t[]){K, N}, 2);
    view_alloc(&o.in[2], 1, (const int64_t[]){N}, 3);
    op_case_run(name, &o, 2.0 * B * S * K * N);
}

/* 3x3 stride-1 convs by each tactic (im2col, F(2x2), F(4x4)), the others by the kernel's choice */
static void bench_conv(tb_pool *pool, const char *what, int64_t c, int64_t h, int64_t m, int k, int s, int p) {
    if (k == 3 && s == 1) {
        bench_conv1(pool, what, c, h, m, k, s, p, 1);
        bench_conv1(pool, what, c, h, m, k, s, p, 2);
        bench_conv1(pool, what, c, h, m, k, s, p, 3);
        bench_conv1(pool, what, c, h, m, k, s, p, 4);
        bench_conv1(pool, what, c, h, m, k, s, p, 5);
    } else {
        bench_conv1(pool, what, c, h, m, k, s, p, 1);
        bench_conv1(pool, what, c, h, m, k, s, p, 4);
    }
}

static void bench_sdpa(tb_pool *pool, int64_t B, int64_t H, int64_t S, int64_t D) {
    char name[96];
    snprintf(name, sizeof name, "sdpa %lldx%lld S=%lld D=%lld", (long long)B, (long long)H, (long long)S,
             (long long)D);
    if (!wanted(name)) return;
    op_case o;
    memset(&o, 0, sizeof o);
    o.ctx.pool = pool;
    o.n.op = TB_OP_SDPA;
    o.n_in = 3;
    for (int i = 0; i < 3; i++) view_alloc(&o.in[i], 4, (const int64_t[]){B, H, S, D}, (uint64_t)i + 1);
    op_case_run(name, &o, 4.0 * B * H * S * S * D);
}

/* a conv whose weights come from memory, as a model's do in its forward
 * pass (the cases above keep one weight in L2/L3): each call takes the next
 * of nw weights (together far larger than the caches), packed on their
 * first use as in a model's context */
typedef struct {
    op_case o;
    float **ws;
    int nw, next;
} conv_cold_case;

static void conv_cold_call(void *arg) {
    conv_cold_case *c = arg;
    c->o.in[1].data = c->ws[c->next];
    c->next = (c->next + 1) % c->nw;
    op_call(&c->o);
}

static void bench_conv_cold(tb_pool *pool, const char *what, int64_t c, int64_t h, int64_t m, int k, int s, int p,
                            int tactic, int nw) {
    static const char *tn[] = {"", " im2col", " winograd", " winograd4", " direct", " winograd4f"};
    char name[96];
    snprintf(name, sizeof name, "conv cold %s %lld->%lld %dx%d/%d %lldx%lld%s%s", what, (long long)c, (long long)m, k,
             k, s, (long long)h, (long long)h, tn[tactic], opt_batch > 1 ? " (batch)" : "");
    if (!wanted(name)) return;
    conv_cold_case cc;
    memset(&cc, 0, sizeof cc);
    op_case *o = &cc.o;
    o->ctx.pool = pool;
    o->n.op = TB_OP_CONV;
    o->n.tactic = tactic;
    o->n.i[0] = 1;
    o->n.i[1] = o->n.i[2] = s;
    o->n.i[3] = o->n.i[4] = o->n.i[5] = o->n.i[6] = p;
    o->n.i[7] = o->n.i[8] = 1;
    o->n.i[10] = TB_NN_ACT_RELU;
    o->n.i[11] = TB_NN_HAS_BIAS;
    o->n_in = 3;
    op_case_weights(o, 2);
    view_alloc(&o->in[0], 4, (const int64_t[]){opt_batch, c, h, h}, 1);
    view_alloc(&o->in[1], 4, (const int64_t[]){m, c, k, k}, 2);
    view_alloc(&o->in[2], 1, (const int64_t[]){m}, 3);
    cc.nw = nw;
    cc.ws = calloc((size_t)nw, sizeof *cc.ws);
    size_t wn = (size_t)(m * c * k * k);
    for (int i = 0; i < nw; i++) {
        cc.ws[i] = tb_alloc_aligned(sizeof(float) * wn, 64);
        memcpy(cc.ws[i], o->in[1].data, sizeof(float) * wn);
    }
    tb_free_aligned(o->in[1].data);
    o->in[1].data = cc.ws[0];
    tb_op_shape sh;
    if (tb_op_infer_views(&o->n, o->in, o->n_in, &sh) != TB_OK) {
        printf("%-40s shape rule failed: %s\n", name, tb_last_error());
        return;
    }
    view_alloc(&o->out[0], sh.rank[0], sh.dims[0], 9);
    for (int i = 0; i < nw; i++) conv_cold_call(&cc); /* every weight packed once */
    int64_t oh = (h + 2 * p - k) / s + 1;
    double best, med;
    time_case(conv_cold_call, &cc, &best, &med);
    report(name, 2.0 * opt_batch * m * c * k * k * oh * oh, best, med);
    o->in[1].data = cc.ws[0]; /* freed with the inputs */
    for (int i = 1; i < nw; i++) tb_free_aligned(cc.ws[i]);
    free(cc.ws);
    for (int i = 0; i < o->n_in; i++) tb_free_aligned(o->in[i].data);
    tb_free_aligned(o->out[0].data);
    tb_cpu_nn_ctx_release(&o->ctx);
}

int main(int argc, char **argv) {
    int threads = 2, verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) opt_seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) opt_filter = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "-c")) opt_cpu_time = 1;
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) opt_batch = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: nn_bench [-t threads] [-r seconds] [-f filter] [-c] [-b batch]\n");
            return 2;
        }
    }
    (void)verbose;
    tb_pool *pool = NULL;
    if (opt_cpu_time && threads > 1) {
        fprintf(stderr, "nn_bench: -c needs -t 1\n");
        return 2;
    }
    if (threads > 1 && tb_pool_create(threads, &pool) != TB_OK) {
        fprintf(stderr, "nn_bench: %s\n", tb_last_error());
        return 1;
    }
    uint32_t f = tb_cpu_features();
    int wide = (f & TB_CPU_AVX512F) != 0;
    char fs[128];
    tb_cpu_features_str(f, fs, sizeof fs);
    double p1 = peak_gflops(NULL, wide), pn = pool ? peak_gflops(pool, wide) : p1;
    double p1n = peak_gflops(NULL, 0);
    printf("cpu: %s; threads %d\n", fs, threads);
    printf("FMA peak (%s): %.1f GFLOP/s on 1 thread, %.1f on %d; AVX2 FMA loop: %.1f on 1 thread\n",
           wide ? "512-bit" : "256-bit", p1, pn, threads, p1n);
    g_peak = pn;

    if (!opt_filter || strstr("sgemm", opt_filter) || !strncmp(opt_filter, "sgemm", 5)) {
        bench_gemm(pool, 128, 768, 768, 1, 0);
        bench_gemm(pool, 128, 3072, 768, 1, 0);
        bench_gemm(pool, 128, 768, 3072, 1, 0);
        bench_gemm(pool, 128, 768, 768, 1, 1);
        bench_gemm(pool, 1024, 1024, 1024, 1, 0);
        bench_gemm(pool, 128, 768, 768, 8, 0);
        bench_gemm(pool, 128, 3072, 768, 8, 0);
        bench_gemm(pool, 128, 768, 3072, 8, 0);
        bench_gemm_x(pool, 128, 768, 768, 1, 0, 1);
        bench_gemm_x(pool, 128, 3072, 768, 1, 0, 1);
        bench_gemm_x(pool, 128, 768, 3072, 1, 0, 1);
        bench_gemm_x(pool, 128, 768, 768, 8, 0, 1);
        bench_gemm_x(pool, 128, 3072, 768, 8, 0, 1);
        bench_gemm_x(pool, 128, 768, 3072, 8, 0, 1);
        /* BERT-base's weights stream from memory: 48 and 24 of them (~110 MB and ~220 MB) */
        bench_gemm_cold(pool, 128, 768, 768, 48);
        bench_gemm_cold(pool, 128, 3072, 768, 24);
        bench_gemm_cold(pool, 128, 768, 3072, 24);
        /* M = 1: the logits Gemm of ResNet-18 (transB), a batch-1 decoder's linear layers */
        bench_gemm(pool, 1, 1000, 512, 1, 1);
        bench_gemm_x(pool, 1, 1000, 512, 1, 1, 1);
        bench_gemm(pool, 1, 3072, 768, 1, 0);
        bench_gemm_x(pool, 1, 3072, 768, 1, 0, 1);
        bench_gemm_x(pool, 4, 3072, 768, 1, 0, 1);
    }
    /* BERT-base FFN: 768 -> 3072 with gelu, 3072 -> 768 */
    bench_linear(pool, 1, 128, 768, 3072, TB_NN_ACT_GELU_ERF);
    bench_linear(pool, 1, 128, 3072, 768, TB_NN_ACT_NONE);
    /* ResNet-18 at 224x224 */
    bench_conv(pool, "stem", 3, 224, 64, 7, 2, 3);
    bench_conv(pool, "l1", 64, 56, 64, 3, 1, 1);
    bench_conv(pool, "l2a", 64, 56, 128, 3, 2, 1);
    bench_conv(pool, "l2", 128, 28, 128, 3, 1, 1);
    bench_conv(pool, "l2ds", 64, 56, 128, 1, 2, 0);
    bench_conv(pool, "l3a", 128, 28, 256, 3, 2, 1);
    bench_conv(pool, "l3", 256, 14, 256, 3, 1, 1);
    bench_conv(pool, "l3ds", 128, 28, 256, 1, 2, 0);
    bench_conv(pool, "l4a", 256, 14, 512, 3, 2, 1);
    bench_conv(pool, "l4", 512, 7, 512, 3, 1, 1);
    bench_conv(pool, "l4ds", 256, 14, 512, 1, 2, 0);
    /* BERT-base attention: 12 heads, S 128, D 64 */
    bench_sdpa(pool, 1, 12, 128, 64);
    bench_sdpa(pool, 8, 12, 128, 64);
    /* ResNet-18's layer4, layer3 and layer2 convs with their weights from
     * memory (8 of layer4's 9.4 MB weights, 16 or 32 of the others'), by
     * the rule's tactic and by the direct kernel */
    bench_conv_cold(pool, "l4", 512, 7, 512, 3, 1, 1, 4, 8);
    bench_conv_cold(pool, "l4a", 256, 14, 512, 3, 2, 1, 4, 16);
    bench_conv_cold(pool, "l3", 256, 14, 256, 3, 1, 1, 2, 16);
    bench_conv_cold(pool, "l3", 256, 14, 256, 3, 1, 1, 4, 16);
    bench_conv_cold(pool, "l2", 128, 28, 128, 3, 1, 1, 3, 32);
    bench_conv_cold(pool, "l2", 128, 28, 128, 3, 1, 1, 5, 32);
    bench_conv_cold(pool, "l3", 256, 14, 256, 3, 1, 1, 5, 16);
    bench_conv_cold(pool, "l2", 128, 28, 128, 3, 1, 1, 4, 32);
    tb_pool_free(pool);
    return 0;
}
