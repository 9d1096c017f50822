/*
 * bandwidth.c — the machine's rooflines, measured: memory copy and read
 * bandwidth at a given number of threads, and AVX2 FMA throughput.
 *
 * Decode of a batch-1 LLM reads every weight once per token, so its speed is
 * bounded by memory bandwidth; prefill is bounded by FMA throughput. The
 * benchmark script runs this program in the same run as the models, because
 * the bandwidth of this machine varies over time.
 *
 * Copy: each thread memcpy()s its slice of a buffer far larger than the last
 * level cache into a second buffer. GB/s counts bytes read plus bytes written
 * (the STREAM "Copy" convention), so it is comparable with a read-only stream
 * of weights. Read: each thread sums its slice with AVX2 loads, two ways:
 * one sequential stream, and four streams (the slice's quarters) taken in
 * turn with software prefetches 1 KiB ahead, as the decode kernels read
 * several weight rows at once; the read figure is the faster of the two
 * (one stream alone leaves some machines' memory idle: a core with few
 * misses in flight reads 14-20 GB/s where four prefetched streams read 23).
 * FMA: each thread runs 12 independent chains of 8-lane fused multiply-adds.
 * Every figure is the best of --reps repetitions (bounded by --seconds).
 *
 * The program needs only libc and pthreads, so the benchmark script can also
 * compile it on its own when the library does not build.
 *
 * Usage: bandwidth [--threads 1,2] [--mib 256] [--reps 10] [--seconds 20]
 * Prints one line per measurement and, last, one JSON object on one line.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_THREADS 64
#define MAX_COUNTS 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef enum { OP_TOUCH, OP_COPY, OP_READ, OP_READ4, OP_FMA } bw_op;

typedef struct bw_job bw_job;

/* One worker: its slice of both buffers and its result. */
typedef struct {
    bw_job *job;
    int ith;
    pthread_t tid;
    double sink; /* keeps the read and FMA results alive */
} bw_worker;

/* What every worker does between two barrier waits. */
struct bw_job {
    pthread_barrier_t start, done;
    bw_op op;
    int quit;
    int n_threads;
    uint8_t *src, *dst;
    size_t bytes;      /* per buffer */
    long fma_iters;    /* per thread */
    bw_worker workers[MAX_THREADS];
};

static void slice(size_t total, int ith, int nth, size_t *off, size_t *len) {
    size_t per = (total / nth) & ~(size_t)63;
    *off = per * ith;
    *len = ith == nth - 1 ? total - *off : per;
}

__attribute__((target("avx2")))
static double read_sum(const uint8_t *p, size_t len) {
    const float *f = (const float *)p;
    size_t n = len / sizeof(float);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(f + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(f + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(f + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(f + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float out[8];
    _mm256_storeu_ps(out, s);
    double r = 0;
    for (int k = 0; k < 8; k++) r += out[k];
    for (; i < n; i++) r += f[i];
    return r;
}

/* Four streams over the quarters of [p, p + len), 64 bytes of each a turn,
 * each prefetched 1 KiB ahead. */
__attribute__((target("avx2")))
static double read_sum4(const uint8_t *p, size_t len) {
    size_t q = (len / 4) & ~(size_t)63;
    const float *f0 = (const float *)p, *f1 = (const float *)(p + q);
    const float *f2 = (const float *)(p + 2 * q), *f3 = (const float *)(p + 3 * q);
    size_t n = q / sizeof(float);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t i = 0; i < n; i += 16) {
        _mm_prefetch((const char *)(f0 + i) + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)(f1 + i) + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)(f2 + i) + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)(f3 + i) + 1024, _MM_HINT_T0);
        a0 = _mm256_add_ps(a0, _mm256_load_ps(f0 + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(f0 + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(f1 + i));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(f1 + i + 8));
        a4 = _mm256_add_ps(a4, _mm256_load_ps(f2 + i));
        a5 = _mm256_add_ps(a5, _mm256_load_ps(f2 + i + 8));
        a6 = _mm256_add_ps(a6, _mm256_load_ps(f3 + i));
        a7 = _mm256_add_ps(a7, _mm256_load_ps(f3 + i + 8));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    float out[8];
    _mm256_storeu_ps(out, s);
    double r = 0;
    for (int k = 0; k < 8; k++) r += out[k];
    /* the tail the four quarters left */
    for (size_t i = 4 * q / sizeof(float); i < len / sizeof(float); i++) r += ((const float *)p)[i];
    return r;
}

__attribute__((target("avx2,fma")))
static double fma_chains(long iters) {
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    /* Distinct starting values keep the compiler from merging the chains. */
    __m256 c0 = _mm256_set1_ps(1.0f), c1 = _mm256_set1_ps(1.1f), c2 = _mm256_set1_ps(1.2f);
    __m256 c3 = _mm256_set1_ps(1.3f), c4 = _mm256_set1_ps(1.4f), c5 = _mm256_set1_ps(1.5f);
    __m256 c6 = _mm256_set1_ps(1.6f), c7 = _mm256_set1_ps(1.7f), c8 = _mm256_set1_ps(1.8f);
    __m256 c9 = _mm256_set1_ps(1.9f), c10 = _mm256_set1_ps(2.0f), c11 = _mm256_set1_ps(2.1f);
    for (long i = 0; i < iters; i++) {
        c0 = _mm256_fmadd_ps(c0, a, b);
        c1 = _mm256_fmadd_ps(c1, a, b);
        c2 = _mm256_fmadd_ps(c2, a, b);
        c3 = _mm256_fmadd_ps(c3, a, b);
        c4 = _mm256_fmadd_ps(c4, a, b);
        c5 = _mm256_fmadd_ps(c5, a, b);
        c6 = _mm256_fmadd_ps(c6, a, b);
        c7 = _mm256_fmadd_ps(c7, a, b);
        c8 = _mm256_fmadd_ps(c8, a, b);
        c9 = _mm256_fmadd_ps(c9, a, b);
        c10 = _mm256_fmadd_ps(c10, a, b);
        c11 = _mm256_fmadd_ps(c11, a, b);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

static void worker_step(bw_worker *w) {
    bw_job *j = w->job;
    size_t off, len;
    slice(j->bytes, w->ith, j->n_threads, &off, &len);
    switch (j->op) {
    case OP_TOUCH:
        memset(j->src + off, 1, len);
        memset(j->dst + off, 0, len);
        break;
    case OP_COPY:
        memcpy(j->dst + off, j->src + off, len);
        break;
    case OP_READ:
        w->sink += read_sum(j->src + off, len);
        break;
    case OP_READ4:
        w->sink += read_sum4(j->src + off, len);
        break;
    case OP_FMA:
        w->sink += fma_chains(j->fma_iters);
        break;
    }
}

static void *worker_main(void *arg) {
    bw_worker *w = arg;
    bw_job *j = w->job;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(w->ith % CPU_SETSIZE, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set); /* best effort */
    for (;;) {
        pthread_barrier_wait(&j->start);
        if (j->quit) break;
        worker_step(w);
        pthread_barrier_wait(&j->done);
    }
    return NULL;
}

/* Runs one op on every thread (the caller is thread 0); returns seconds. */
static double job_run(bw_job *j, bw_op op) {
    j->op = op;
    pthread_barrier_wait(&j->start);
    double t0 = now_s();
    worker_step(&j->workers[0]);
    pthread_barrier_wait(&j->done);
    return now_s() - t0;
}

typedef struct {
    int threads;
    double copy_gbs, read_gbs, fma_gflops;
} bw_result;

static int measure(int nth, size_t bytes, int reps, double budget_s, bw_result *r) {
    static bw_job j;
    memset(&j, 0, sizeof(j));
    j.n_threads = nth;
    j.bytes = bytes;
    j.fma_iters = 20000000; /* about 0.1 s per thread */
    if (posix_memalign((void **)&j.src, 4096, bytes) || posix_memalign((void **)&j.dst, 4096, bytes)) {
        fprintf(stderr, "bandwidth: cannot allocate 2 x %zu bytes\n", bytes);
        return 1;
    }
    pthread_barrier_init(&j.start, NULL, (unsigned)nth);
    pthread_barrier_init(&j.done, NULL, (unsigned)nth);
    for (int i = 0; i < nth; i++) {
        j.workers[i].job = &j;
        j.workers[i].ith = i;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    for (int i = 1; i < nth; i++) pthread_create(&j.workers[i].tid, NULL, worker_main, &j.workers[i]);

    job_run(&j, OP_TOUCH); /* first touch by the thread that will use each page */
    double best_copy = 1e30, best_read = 1e30, best_fma = 1e30;
    double deadline = now_s() + budget_s;
    for (int k = 0; k < reps && (k < 2 || now_s() < deadline); k++) {
        double t = job_run(&j, OP_COPY);
        if (t < best_copy) best_copy = t;
        t = job_run(&j, OP_READ);
        if (t < best_read) best_read = t;
        t = job_run(&j, OP_READ4);
        if (t < best_read) best_read = t;
        t = job_run(&j, OP_FMA);
        if (t < best_fma) best_fma = t;
    }
    j.quit = 1;
    pthread_barrier_wait(&j.start);
    for (int i = 1; i < nth; i++) pthread_join(j.workers[i].tid, NULL);
    pthread_barrier_destroy(&j.start);
    pthread_barrier_destroy(&j.done);
    double sink = 0;
    for (int i = 0; i < nth; i++) sink += j.workers[i].sink;
    if (sink == 12345.678) fprintf(stderr, " "); /* keeps the sums observable */
    free(j.src);
    free(j.dst);

    r->threads = nth;
    r->copy_gbs = 2.0 * bytes / best_copy / 1e9;
    r->read_gbs = (double)bytes / best_read / 1e9;
    r->fma_gflops = (double)nth * j.fma_iters * 12 * 8 * 2 / best_fma / 1e9;
    return 0;
}

/* The "cpu MHz" of the first processor in /proc/cpuinfo, or 0. */
static double cpuinfo_mhz(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[512];
    double mhz = 0;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "cpu MHz", 7)) {
            const char *c = strchr(line, ':');
            if (c) mhz = atof(c + 1);
            break;
        }
    }
    fclose(f);
    return mhz;
}

static void usage(void) {
    fprintf(stderr, "usage: bandwidth [--threads 1,2] [--mib 256] [--reps 10] [--seconds 20]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int counts[MAX_COUNTS] = {1, 2}, n_counts = 2, reps = 10;
    long mib = 256;
    double seconds = 20;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        const char *a = argv[i], *v = argv[++i];
        if (!strcmp(a, "--threads")) {
            n_counts = 0;
            for (const char *p = v; *p && n_counts < MAX_COUNTS;) {
                char *end;
                long t = strtol(p, &end, 10);
                if (end == p || t < 1 || t > MAX_THREADS) usage();
                counts[n_counts++] = (int)t;
                p = *end == ',' ? end + 1 : end;
            }
        } else if (!strcmp(a, "--mib")) {
            mib = atol(v);
            if (mib < 1 || mib > 16384) usage();
        } else if (!strcmp(a, "--reps")) {
            reps = atoi(v);
            if (reps < 1 || reps > 1000) usage();
        } else if (!strcmp(a, "--seconds")) {
            seconds = atof(v);
            if (seconds <= 0 || seconds > 600) usage();
        } else {
            usage();
        }
    }
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, "bandwidth: this CPU lacks AVX2/FMA\n");
        return 1;
    }

    bw_result res[MAX_COUNTS];
    size_t bytes = (size_t)mib << 20;
    for (int c = 0; c < n_counts; c++) {
        if (measure(counts[c], bytes, reps, seconds / n_counts, &res[c])) return 1;
        printf("threads=%d copy_gb_s=%.2f read_gb_s=%.2f fma_gflop_s=%.1f\n", res[c].threads,
               res[c].copy_gbs, res[c].read_gbs, res[c].fma_gflops);
    }
    double mhz = cpuinfo_mhz();
    printf("{\"buffer_mib\":%ld,\"cpuinfo_mhz\":%.1f,\"results\":[", mib, mhz);
    for (int c = 0; c < n_counts; c++)
        printf("%s{\"threads\":%d,\"copy_gb_s\":%.3f,\"read_gb_s\":%.3f,\"fma_gflop_s\":%.2f}",
               c ? "," : "", res[c].threads, res[c].copy_gbs, res[c].read_gbs, res[c].fma_gflops);
    printf("]}\n");
    return 0;
}
