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
 * keeps its own reproducible sequence. */
static inline float tb_test_frand(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / 8388608.0)) * 2.0f - 1.0f;
}

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
