/*
 * tb_test.h — a tiny harness for the C tests: CHECK macros that count
 * failures and print file:line, helpers to find shared data and temp dirs.
 */
#ifndef TB_TEST_H
#define TB_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tb_test_failures = 0;
static int tb_test_checks = 0;

#define CHECK(cond)                                                          \
    do {                                                                     \
        tb_test_checks++;                                                    \
        if (!(cond)) {                                                       \
            tb_test_failures++;                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
        }                                                                    \
    } while (0)

#define CHECK_MSG(cond, ...)                                                 \
    do {                                                                     \
        tb_test_checks++;                                                    \
        if (!(cond)) {                                                       \
            tb_test_failures++;                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, \
                    #cond);                                                  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

/* The shared data folder: $TURBINE_SHARED, else ../shared. */
static inline const char *tb_test_shared(void) {
    const char *s = getenv("TURBINE_SHARED");
    return s && *s ? s : "../shared";
}

/* A scratch folder for files the test writes. */
static inline const char *tb_test_tmp(void) {
    const char *s = getenv("TURBINE_TMP");
    return s && *s ? s : "/tmp";
}

/* max |a - b| / max |b| over n floats: the relative error of logit rows. */
static inline float tb_test_max_rel(const float *a, const float *b, int n) {
    float m = 0, d = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(b[i]) > m) m = fabsf(b[i]);
        if (fabsf(a[i] - b[i]) > d) d = fabsf(a[i] - b[i]);
    }
    return d / (m > 0 ? m : 1);
}

/* Index of the largest of n floats (the first on ties): a greedy pick. */
static inline int tb_test_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

#ifdef TURBINE_H
/* Loads an engine; on failure counts a failed check, says why and returns NULL. */
static inline tb_engine *tb_test_load_engine(const char *path) {
    tb_engine *e = NULL;
    tb_test_checks++;
    if (tb_engine_load(path, &e) != TB_OK) {
        tb_test_failures++;
        fprintf(stderr, "load %s: %s\n", path, tb_last_error());
        return NULL;
    }
    return e;
}
#endif

/* xorshift64: uniform in [-1, 1) from the caller's own state, so each test
 * keeps its own reproducible sequence. The top 24 bits scaled by 2^-24 give
 * [0, 1) exactly in a float; doubled and shifted, [-1, 1). */
static inline float tb_test_frand(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* malloc that ends the test when memory runs out (n = 0: one byte). */
static inline void *tb_test_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

/* max |a - b| / max(max |b|, floor) over n floats, in double; a NaN
 * anywhere gives infinity (a relative bound against the output's scale). */
static inline double tb_test_rel_err(const float *a, const float *b, size_t n, double floor) {
    double mx = floor, err = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > err || d != d) err = d != d ? INFINITY : d;
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    return err / mx;
}

/* ---------------------------------------------------------------- attention
 * What the CPU attention tests (test_kernels, test_kv_quant) share: block
 * tables scattered over the cache pool, and the batches they run. */

/* tables[n_seqs][max_blocks]: the first n_seqs * max_blocks entries of a
 * random permutation of the pool's n_blocks blocks (n_blocks >= n_seqs *
 * max_blocks), so that a sequence's blocks are neither in order nor adjacent. */
static inline void tb_test_block_tables(uint64_t *state, int n_blocks, int n_seqs, int max_blocks, int32_t *tables) {
    int32_t *perm = (int32_t *)tb_test_xmalloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)((tb_test_frand(state) + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int k = 0; k < n_seqs * max_blocks; k++) tables[k] = perm[k];
    free(perm);
}

/* A batch of T tokens: token t is at position pos[t] of sequence seq[t]. */
typedef struct {
    int n_seqs;
    int T;
    int seq[80], pos[80];
} tb_test_attn_batch;

/* one: a single decode token of seq 0 at 77; mixed: a 17-token prefill of
 * seq 0 from 0, one decode token of seq 1 at 40, a 3-token chunk of seq 2 at
 * 20 and a decode of seq 3 at last_pos; pre: a 64-token prefill of seq 1
 * from position 5 (two sequences' tables). */
static inline void tb_test_attn_batches(int last_pos, tb_test_attn_batch *one, tb_test_attn_batch *mixed,
                                        tb_test_attn_batch *pre) {
    *one = (tb_test_attn_batch){1, 1, {0}, {77}};
    *mixed = (tb_test_attn_batch){4, 0, {0}, {0}};
    for (int i = 0; i < 17; i++) { mixed->seq[mixed->T] = 0; mixed->pos[mixed->T++] = i; }
    mixed->seq[mixed->T] = 1; mixed->pos[mixed->T++] = 40;
    for (int i = 0; i < 3; i++) { mixed->seq[mixed->T] = 2; mixed->pos[mixed->T++] = 20 + i; }
    mixed->seq[mixed->T] = 3; mixed->pos[mixed->T++] = last_pos;
    *pre = (tb_test_attn_batch){2, 64, {0}, {0}};
    for (int i = 0; i < 64; i++) { pre->seq[i] = 1; pre->pos[i] = i + 5; }
}

#ifdef TB_CPU_KERNELS_H
/* Runs run(pool, path, threads) for every SIMD path of the CPU kernels this
 * CPU has (scalar, avx2, avx512; forced one at a time, the others said to be
 * skipped) with pools of 1 and 2 threads; checks that at least one path ran
 * and leaves the kernels' own choice in place. */
static inline void tb_test_each_kernel_path(void (*run)(tb_pool *p, const char *path, int threads)) {
    static const char *paths[] = {"scalar", "avx2", "avx512"};
    int n_paths = 0;
    for (int pi = 0; pi < 3; pi++) {
        if (tb_cpu_kernel_force_path(paths[pi]) != 0) {
            printf("path %-6s: not supported by this CPU, skipped\n", paths[pi]);
            continue;
        }
        n_paths++;
        CHECK(strcmp(tb_cpu_kernel_path(), paths[pi]) == 0);
        for (int nth = 1; nth <= 2; nth++) {
            tb_pool *p = NULL;
            CHECK(tb_pool_create(nth, &p) == TB_OK);
            if (!p) continue;
            run(p, paths[pi], nth);
            tb_pool_free(p);
        }
    }
    CHECK(n_paths >= 1);
    tb_cpu_kernel_force_path(NULL);
}
#endif

/* Whether a file whose name contains `name` is mapped into this process
 * (-1: /proc/self/maps unreadable): which libraries a code path loaded. */
static inline int tb_test_mapped(const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        const char *slash = strrchr(line, '/');
        found = slash && strstr(slash, name) != NULL;
    }
    fclose(f);
    return found;
}

static inline int tb_test_finish(const char *name) {
    printf("%s: %d checks, %d failed\n", name, tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}

#endif
