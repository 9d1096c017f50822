/*
 * qgemm_bench.c — the quantized matmul kernels (tb_cpu_qmatmul) against the
 * f32/f16 ones (tb_cpu_matmul) at the shapes of the 134M Llama of the CPU
 * benchmark (hidden 768, ffn 2048, 12 layers, vocab 32000; q/k/v and
 * gate/up fused as the Llama passes fuse them).
 *
 * decode:  one decode step's matmuls (12 layers of qkv 768x2304, o 768x768,
 *          gate|up 768x4096, down 2048x768, then the 32000-row LM head), each
 *          layer its own weights so they stream from DRAM as in a real step
 *          (~110M weights: 438 MB at f32, 55 MB at int4). Reported: ms per
 *          step, GB/s of weight bytes (codes + scales + zeros) read, that as
 *          a fraction of the read bandwidth measured in the same rounds
 *          (each thread sums its slice of a 256 MiB buffer, as bench/bandwidth
 *          does), and the speed-up over f32.
 * parts:   the decode step's matmuls by shape (the 12 layers' qkv, o, gate|up
 *          and down, and the head alone): ms and % of the read bandwidth of
 *          each (one call after a pass over the read buffer, so from DRAM),
 *          to see which one keeps a step from its floor (a quantized
 *          engine keeps its head f16: the f16 row is the head it runs).
 * batch:   the same step at T = 1, 2, 4, 8, 16 tokens: time per step / T = 1
 *          (weights read once per call, so it grows far less than T).
 * prefill: T = 512 tokens through one layer's four matmuls: GFLOP/s, int8 /
 *          int4 / fp8 (the default packed panels, and the Q8 tactic the
 *          tuner may pick) against f32 (its packed GEMM).
 * Variants run interleaved, round after round (this machine is shared):
 * each figure is the median over rounds; the load average is printed. With
 * 1 thread every time (the read bandwidth's too) is the thread's CPU time,
 * not wall time: on a loaded machine the wall clock also counts the time
 * the thread waited for a core, the CPU clock only the time it ran (memory
 * stalls included), so the ratios stay meaningful under load.
 *
 * usage: qgemm_bench [decode|parts|batch|prefill|all] [threads, default 2]
 *                    [rounds, default 7] [seconds per variant and round, default 0.25]
 * QB_ONLY="f32,int8 q8,int4 g128 q8" runs only the variants it names.
 */
#include "backend/cpu/kernels.h"
#include "core/quant.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define D 768
#define F 2048
#define L 12
#define V 32000
#define READ_BYTES ((size_t)256 << 20)
#define MAX_ROUNDS 31

static const int shapes[5][2] = {{D, 3 * D}, {D, D}, {D, 2 * F}, {F, D}, {D, V}}; /* (K, N); the last: LM head */

typedef struct {
    const char *name;
    tb_dtype dt;    /* TB_F32 / TB_F16: tb_cpu_matmul; else quantized */
    int group;      /* i4 */
    int asym;
    tb_qmm_tactic tac;
    void *w[5][L];  /* per shape, per layer (the head: layer 0 only) */
    float *s[5], *z[5];
    double bytes;   /* read per step (T = 1) */
} variant;

static void *xalloc(size_t n) {
    void *p = tb_alloc_aligned(n ? n : 64, 64);
    TB_ASSERT(p && "out of memory");
    return p;
}

static uint32_t rs = 12345;
static float urand(void) {
    rs = rs * 1664525u + 1013904223u;
    return (float)(rs >> 8) * (1.0f / 16777216.0f) - 0.5f;
}

/* Distinct buffers per layer (the same values: what matters is that a
 * step reads 12 layers of distinct memory). */
static void setup(variant *v, float *const src[5]) {
    v->bytes = 0;
    for (int s = 0; s < 5; s++) {
        int K = shapes[s][0], N = shapes[s][1], nl = s == 4 ? 1 : L;
        size_t cb;
        if (v->dt == TB_F32 || v->dt == TB_F16) {
            cb = (size_t)K * N * tb_dtype_size(v->dt);
            void *c = xalloc(cb);
            if (v->dt == TB_F32) memcpy(c, src[s], cb);
            else for (size_t i = 0; i < (size_t)K * N; i++) ((uint16_t *)c)[i] = tb_f32_to_f16(src[s][i]);
            for (int l = 0; l < nl; l++) {
                v->w[s][l] = xalloc(cb);
                memcpy(v->w[s][l], c, cb);
            }
            tb_free_aligned(c);
            v->s[s] = v->z[s] = NULL;
            v->bytes += (double)cb * nl;
            continue;
        }
        int group = v->dt == TB_I4 ? v->group : K, G = K / group;
        cb = tb_quant_codes_bytes(v->dt, N, K);
        v->s[s] = xalloc(sizeof(float) * (size_t)N * G);
        v->z[s] = v->asym ? xalloc(sizeof(float) * (size_t)N * G) : NULL;
        void *c = xalloc(cb);
        TB_ASSERT(tb_quantize_rows(v->dt, src[s], N, K, group, v->asym, c, v->s[s], v->z[s]) == TB_OK);
        for (int l = 0; l < nl; l++) {
            v->w[s][l] = xalloc(cb);
            memcpy(v->w[s][l], c, cb);
        }
        tb_free_aligned(c);
        /* scales and zeros are shared by the layers here, but a real step reads each layer's */
        v->bytes += ((double)cb + sizeof(float) * (double)N * G * (v->asym ? 2 : 1)) * nl;
    }
}

static void release(variant *v) {
    for (int s = 0; s < 5; s++) {
        for (int l = 0; l < (s == 4 ? 1 : L); l++) tb_free_aligned(v->w[s][l]);
        tb_free_aligned(v->s[s]);
        tb_free_aligned(v->z[s]);
    }
}

static void mm(tb_pool *p, const variant *v, int s, int l, const float *x, float *y, int T) {
    int K = shapes[s][0], N = shapes[s][1];
    if (v->dt == TB_F32 || v->dt == TB_F16) {
        tb_cpu_matmul(p, x, v->w[s][l], v->dt, NULL, y, T, K, N);
        return;
    }
    tb_qweight q = {v->dt, v->w[s][l], v->s[s], v->z[s], v->dt == TB_I4 ? v->group : K};
    tb_cpu_qmatmul_tactic(p, v->tac, x, &q, NULL, y, T, K, N);
}

/* one decode step (all layers + head) at T tokens */
static void step(tb_pool *p, const variant *v, const float *x, float *y, int T) {
    for (int l = 0; l < L; l++)
        for (int s = 0; s < 4; s++) mm(p, v, s, l, x, y, T);
    mm(p, v, 4, 0, x, y, T);
}

/* ---------------------------------------------------------------- read bandwidth */

typedef struct {
    const uint8_t *buf;
    double sink[64];
} read_job;

__attribute__((target("avx2"))) static void read_run(void *arg, int ith, int nth) {
    read_job *j = arg;
    size_t per = (READ_BYTES / nth) & ~(size_t)63, off = per * ith, len = ith == nth - 1 ? READ_BYTES - off : per;
    const float *f = (const float *)(j->buf + off);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= len / 4; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(f + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(f + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(f + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(f + i + 24));
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    j->sink[ith % 64] += o[0] + o[7];
}

/* best of a few reads of the buffer (GB/s) */
static double now_s(void);
static double read_gbs(tb_pool *p, read_job *j, double secs) {
    double best = 1e30, end = now_s() + secs;
    int n = 0;
    while (n < 3 || now_s() < end) {
        double t0 = now_s();
        tb_pool_run(p, read_run, j);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
        n++;
    }
    return (double)READ_BYTES / best * 1e-9;
}

#include <time.h>
static int cpu_clock;
static double now_s(void) {
    if (!cpu_clock) return tb_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *a, int n) {
    qsort(a, (size_t)n, sizeof(double), cmp_d);
    return a[n / 2];
}

static void loadavg(const char *when) {
    FILE *f = fopen("/proc/loadavg", "r");
    char b[128] = "?";
    if (f) {
        if (!fgets(b, sizeof b, f)) strcpy(b, "?\n");
        fclose(f);
    }
    printf("load average (%s): %s", when, b);
}

/* seconds per call of fn over `secs` (at least 2 calls) */
#define TIME_CALLS(secs, CALL)                                                                                      \
    ({                                                                                                              \
        double t0_ = now_s(), t_;                                                                                  \
        long n_ = 0;                                                                                                \
        do {                                                                                                        \
            CALL;                                                                                                   \
            n_++;                                                                                                   \
        } while ((t_ = now_s() - t0_) < (secs) || n_ < 2);                                                         \
        t_ / (double)n_;                                                                                            \
    })

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    int nth = argc > 2 ? atoi(argv[2]) : 2, rounds = argc > 3 ? atoi(argv[3]) : 7;
    double secs = argc > 4 ? atof(argv[4]) : 0.25;
    if (nth < 1 || rounds < 1 || rounds > MAX_ROUNDS || secs <= 0) {
        fprintf(stderr, "usage: qgemm_bench [decode|parts|batch|prefill|all] [threads] [rounds <= %d] [seconds]\n",
                MAX_ROUNDS);
        return 2;
    }
    int do_dec = !strcmp(mode, "all") || !strcmp(mode, "decode"), do_bat = !strcmp(mode, "all") || !strcmp(mode, "batch");
    int do_pre = !strcmp(mode, "all") || !strcmp(mode, "prefill"), do_parts = !strcmp(mode, "parts");
    tb_pool *p = NULL;
    TB_ASSERT(tb_pool_create(nth, &p) == TB_OK);
    cpu_clock = nth == 1;
    printf("qgemm_bench: %s, %d threads, %d rounds, kernel path %s, %s\n", mode, nth, rounds, tb_cpu_kernel_path(),
           cpu_clock ? "thread CPU time" : "wall time");
    loadavg("start");

    float *src[5];
    for (int s = 0; s < 5; s++) {
        size_t n = (size_t)shapes[s][0] * shapes[s][1];
        src[s] = xalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) src[s][i] = urand() * 0.1f;
    }
#define VAR(n, d, g, a, t) {.name = n, .dt = d, .group = g, .asym = a, .tac = t}
    variant vs[] = {
        VAR("f32", TB_F32, 0, 0, TB_QMM_AUTO),          VAR("f16", TB_F16, 0, 0, TB_QMM_AUTO),
        VAR("int8", TB_I8, 0, 0, TB_QMM_DQ),            VAR("int8 q8", TB_I8, 0, 0, TB_QMM_Q8),
        VAR("fp8", TB_FP8_E4M3, 0, 0, TB_QMM_DQ),       VAR("int4 g32", TB_I4, 32, 0, TB_QMM_DQ),
        VAR("int4 g32 q8", TB_I4, 32, 0, TB_QMM_Q8),    VAR("int4 g64", TB_I4, 64, 0, TB_QMM_DQ),
        VAR("int4 g128", TB_I4, 128, 0, TB_QMM_DQ),     VAR("int4 g128 q8", TB_I4, 128, 0, TB_QMM_Q8),
        VAR("int4 g128 z", TB_I4, 128, 1, TB_QMM_DQ),
    };
    int nv = (int)(sizeof vs / sizeof vs[0]);
    int use[sizeof vs / sizeof vs[0]];
    for (int i = 0; i < nv; i++) {
        tb_qweight q = {vs[i].dt, NULL, NULL, NULL, vs[i].group};
        use[i] = vs[i].tac != TB_QMM_Q8 || tb_cpu_qmatmul_tactic_available(TB_QMM_Q8, &q);
        if (getenv("QB_ONLY") && !strstr(getenv("QB_ONLY"), vs[i].name)) use[i] = 0;
        if (use[i]) setup(&vs[i], src);
    }
    for (int s = 0; s < 5; s++) tb_free_aligned(src[s]);
    float *x = xalloc(sizeof(float) * 512 * F), *y = xalloc(sizeof(float) * 512 * V);
    for (int i = 0; i < 512 * F; i++) x[i] = urand();
    read_job rj = {xalloc(READ_BYTES), {0}};
    memset((void *)rj.buf, 1, READ_BYTES);

    if (do_dec) {
        double ms[16][MAX_ROUNDS], rbw[MAX_ROUNDS];
        for (int i = 0; i < nv; i++)
            if (use[i]) step(p, &vs[i], x, y, 1); /* warm up, page in */
        for (int r = 0; r < rounds; r++) {
            rbw[r] = read_gbs(p, &rj, secs);
            for (int i = 0; i < nv; i++)
                if (use[i]) ms[i][r] = TIME_CALLS(secs, step(p, &vs[i], x, y, 1)) * 1e3;
        }
        double bw = median(rbw, rounds), f32ms = 0;
        printf("\ndecode step (T = 1), 134M shapes, %d threads; read bandwidth %.1f GB/s (median of %d rounds)\n",
               nth, bw, rounds);
        printf("  %-13s %8s %9s %8s %9s %9s\n", "weights", "MB/step", "ms/step", "GB/s", "of read", "vs f32");
        for (int i = 0; i < nv; i++) {
            if (!use[i]) continue;
            double m = median(ms[i], rounds), gbs = vs[i].bytes / (m * 1e-3) * 1e-9;
            if (i == 0) f32ms = m;
            printf("  %-13s %8.1f %9.3f %8.1f %8.0f%% %8.2fx\n", vs[i].name, vs[i].bytes * 1e-6, m, gbs,
                   100.0 * gbs / bw, f32ms / m);
        }
    }
    if (do_parts) {
        static const char *const names[5] = {"qkv", "o", "gate|up", "down", "head"};
        double ms[16][5][MAX_ROUNDS], rbw[MAX_ROUNDS];
        for (int i = 0; i < nv; i++)
            if (use[i]) step(p, &vs[i], x, y, 1);
        for (int r = 0; r < rounds; r++) {
            rbw[r] = read_gbs(p, &rj, secs);
            /* one call each, after a pass over the 256 MiB read buffer: a
             * shape's 12 layers (7-28 MB quantized) would otherwise be timed
             * from the last-level cache they were just read into */
            for (int i = 0; i < nv; i++)
                for (int sh = 0; sh < 5 && use[i]; sh++) {
                    tb_pool_run(p, read_run, &rj);
                    double t0 = now_s();
                    for (int l = 0; l < (sh == 4 ? 1 : L); l++) mm(p, &vs[i], sh, l, x, y, 1);
                    ms[i][sh][r] = (now_s() - t0) * 1e3;
                }
        }
        double bw = median(rbw, rounds);
        printf("\ndecode step by matmul (T = 1; the layers' 12 of each, the head once), %d threads; read %.1f GB/s\n"
               "  ms (%% of the read bandwidth)\n  %-13s", nth, bw, "weights");
        for (int sh = 0; sh < 5; sh++) printf(" %15s", names[sh]);
        printf("\n");
        for (int i = 0; i < nv; i++) {
            if (!use[i]) continue;
            printf("  %-13s", vs[i].name);
            for (int sh = 0; sh < 5; sh++) {
                int K = shapes[sh][0], N = shapes[sh][1], nl = sh == 4 ? 1 : L;
                double b;
                if (vs[i].dt == TB_F32 || vs[i].dt == TB_F16) b = (double)K * N * tb_dtype_size(vs[i].dt);
                else {
                    int G = vs[i].dt == TB_I4 ? K / vs[i].group : 1;
                    b = (double)tb_quant_codes_bytes(vs[i].dt, N, K) + 4.0 * N * G * (vs[i].asym ? 2 : 1);
                }
                double m = median(ms[i][sh], rounds);
                printf("   %6.3f (%3.0f%%)", m, 100.0 * b * nl / (m * 1e-3) * 1e-9 / bw);
            }
            printf("\n");
        }
    }
    if (do_bat) {
        static const int Ts[] = {1, 2, 4, 8, 16};
        double ms[16][5][MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            for (int ti = 0; ti < 5; ti++)
                for (int i = 0; i < nv; i++)
                    if (use[i]) ms[i][ti][r] = TIME_CALLS(secs / 2, step(p, &vs[i], x, y, Ts[ti])) * 1e3;
        printf("\ndecode batches: ms per step at T tokens (median of %d rounds), and / T = 1\n", rounds);
        printf("  %-13s", "weights");
        for (int ti = 0; ti < 5; ti++) printf("      T=%-2d", Ts[ti]);
        printf("\n");
        for (int i = 0; i < nv; i++) {
            if (!use[i]) continue;
            double m1 = median(ms[i][0], rounds);
            printf("  %-13s", vs[i].name);
            for (int ti = 0; ti < 5; ti++) {
                double m = ti ? median(ms[i][ti], rounds) : m1;
                printf(" %5.2f/%3.1f", m, m / m1);
            }
            printf("\n");
        }
    }
    if (do_pre) {
        const int T = 512;
        double ms[16][MAX_ROUNDS];
        double flops = 0;
        for (int s = 0; s < 4; s++) flops += 2.0 * T * shapes[s][0] * shapes[s][1];
        for (int r = 0; r < rounds; r++)
            for (int i = 0; i < nv; i++) {
                if (!use[i]) continue;
                variant v = vs[i];
                if (v.tac == TB_QMM_DQ) v.tac = TB_QMM_AUTO; /* the packed panels at this size */
                ms[i][r] = TIME_CALLS(secs, for (int s = 0; s < 4; s++) mm(p, &v, s, 0, x, y, T)) * 1e3;
            }
        printf("\nprefill T = %d, one layer (qkv, o, gate|up, down), %d threads (median of %d rounds)\n", T, nth,
               rounds);
        printf("  %-13s %9s %8s %9s\n", "weights", "ms", "GFLOP/s", "vs f32");
        double f32ms = median(ms[0], rounds);
        for (int i = 0; i < nv; i++) {
            if (!use[i]) continue;
            double m = i ? median(ms[i], rounds) : f32ms;
            printf("  %-13s %9.2f %8.1f %8.2fx\n", vs[i].name, m, flops / (m * 1e-3) * 1e-9, f32ms / m);
        }
    }
    loadavg("end");
    for (int i = 0; i < nv; i++)
        if (use[i]) release(&vs[i]);
    tb_free_aligned(x), tb_free_aligned(y), tb_free_aligned((void *)rj.buf);
    tb_pool_free(p);
    return 0;
}
