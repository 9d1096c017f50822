/*
 * test_lazy_libs.c — the optional libraries enter a process only when it
 * uses them: a program linking libturbine starts without the CUDA module,
 * cuBLAS, OpenBLAS, libcurl, libmicrohttpd or GnuTLS mapped, and keeps them
 * out while it runs a CPU backend; asking for the BLAS tactic, an HTTP GET of
 * the load tester, or the server's HTTP library then maps each one (the
 * controls that show this reading of /proc/self/maps sees a dlopen).
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "bench/bench.h"
#include "tb_test.h"

tb_status tb_mhd_load(void); /* src/serve/mhd_shim.h */


static const char *const k_lazy[] = {"libturbine_cuda", "libcublas", "libcudart", "libopenblas", "libgfortran",
                                      "libcurl", "libmicrohttpd", "libgnutls", NULL};

static void check_none(const char *when) {
    for (int i = 0; k_lazy[i]; i++) CHECK_MSG(tb_test_mapped(k_lazy[i]) == 0, "%s is mapped %s", k_lazy[i], when);
}

int main(void) {
    CHECK_MSG(tb_test_mapped("libc.so") == 1, "/proc/self/maps does not show the C library");
    check_none("at start");

    /* a CPU backend and a matmul of the own kernels */
    tb_backend *b = NULL;
    CHECK(tb_backend_create("cpu", 2, 64, &b) == TB_OK);
    float x[4 * 8], w[16 * 8], y[4 * 16];
    for (int i = 0; i < 4 * 8; i++) x[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < 16 * 8; i++) w[i] = (float)(i % 7) * 0.25f;
    tb_cpu_matmul(tb_backend_cpu_pool(b), x, w, TB_F32, NULL, y, 4, 8, 16);
    tb_backend_free(b);
    check_none("after a CPU matmul");

    /* the BLAS tactic loads OpenBLAS when this machine has it */
    if (tb_cpu_matmul_tactic_available(TB_MM_BLAS, TB_F32))
        CHECK_MSG(tb_test_mapped("libopenblas") == 1, "the BLAS tactic is offered but OpenBLAS is not mapped");
    else
        printf("note: no OpenBLAS here (%s): its control is skipped\n", tb_cpu_blas_error());
    CHECK(tb_test_mapped("libcurl") == 0);

    /* the load tester's GET loads libcurl (port 1: refused, nothing listens) */
    char *body = NULL;
    long http = 0;
    tb_status st = tb_bench_http_get("http://127.0.0.1:1/", NULL, 2.0, 1024, &body, &http);
    free(body);
    CHECK_MSG(st != TB_OK, "GET of a closed port succeeded");
    CHECK_MSG(tb_test_mapped("libcurl") == 1, "libcurl is not mapped after a GET (%s)", tb_last_error());
    CHECK(tb_test_mapped("libmicrohttpd") == 0);

    CHECK_MSG(tb_mhd_load() == TB_OK, "%s", tb_last_error());
    CHECK_MSG(tb_test_mapped("libmicrohttpd") == 1, "libmicrohttpd is not mapped after tb_mhd_load");
    CHECK(tb_test_mapped("libturbine_cuda") == 0 && tb_test_mapped("libcublas") == 0);

    printf("%d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures != 0;
}
