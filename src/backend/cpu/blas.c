/*
 * blas.c — OpenBLAS for the matmul tactic TB_MM_BLAS, loaded with dlopen on
 * first use.
 *
 * Linking OpenBLAS made every command map it (and libgfortran) and start
 * its threads at load, tactic used or not. Now the library enters the
 * process only when something asks for the tactic: the tuner at build time,
 * or an engine whose tuner chose it. When it cannot be loaded the tactic is
 * not offered (the tuner keeps the own kernels), and an engine that chose it
 * runs those nodes with the own kernels after one warning (cpu_backend.c):
 * the result is the same, only the speed of those shapes differs.
 *
 * $TURBINE_OPENBLAS names the library to load instead of libopenblas.so.0
 * (then libopenblas.so): a specific build, or a missing path to turn the
 * tactic off. The CBLAS enum values below are the standard ones
 * (cblas.h), so no OpenBLAS header is needed to build.
 */
#define _GNU_SOURCE
#include "backend/cpu/kernels.h"

#include <dlfcn.h>
#include <pthread.h>

static struct {
    pthread_once_t once;
    tb_blas_api api;
    int ok;
    char err[512];
} blas = {.once = PTHREAD_ONCE_INIT};

static void blas_load(void) {
    const char *env = getenv("TURBINE_OPENBLAS");
    const char *names[] = {env && *env ? env : "libopenblas.so.0", env && *env ? NULL : "libopenblas.so", NULL};
    void *h = tb_dl_open_first(names, blas.err, sizeof blas.err);
    if (!h) return;
    void (*set_threads)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
    blas.api.sgemm = (tb_blas_sgemm_fn)dlsym(h, "cblas_sgemm");
    blas.api.sgemv = (tb_blas_sgemv_fn)dlsym(h, "cblas_sgemv");
    if (!set_threads || !blas.api.sgemm || !blas.api.sgemv) {
        snprintf(blas.err, sizeof blas.err, "%s lacks cblas_sgemm, cblas_sgemv or openblas_set_num_threads",
                 names[0]);
        dlclose(h);
        return;
    }
    /* every pool thread calls a single-threaded sgemm on its own slice */
    set_threads(1);
    blas.ok = 1;
}

const tb_blas_api *tb_cpu_blas(void) {
    pthread_once(&blas.once, blas_load);
    return blas.ok ? &blas.api : NULL;
}

const char *tb_cpu_blas_error(void) {
    pthread_once(&blas.once, blas_load);
    return blas.ok ? "" : blas.err;
}
