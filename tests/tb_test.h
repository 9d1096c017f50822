/*
 * tb_test.h — a tiny harness for the C tests: CHECK macros that count
 * failures and print file:line, helpers to find shared data and temp dirs.
 */
#ifndef TB_TEST_H
#define TB_TEST_H

#include <math.h>
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

static inline int tb_test_finish(const char *name) {
    printf("%s: %d checks, %d failed\n", name, tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}

#endif
