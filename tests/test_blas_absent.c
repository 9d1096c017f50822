/*
 * test_blas_absent.c — without OpenBLAS (TURBINE_OPENBLAS naming a library
 * that does not exist) the BLAS tactic is not offered, the reason names the
 * library, nothing of OpenBLAS is mapped, and the own kernels still run.
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "tb_test.h"


int main(void) {
    char missing[512];
    snprintf(missing, sizeof missing, "%s/no-such-dir/libopenblas-absent.so.0", tb_test_tmp());
    setenv("TURBINE_OPENBLAS", missing, 1);

    CHECK_MSG(!tb_cpu_matmul_tactic_available(TB_MM_BLAS, TB_F32), "the BLAS tactic is offered without OpenBLAS");
    CHECK_MSG(tb_cpu_blas() == NULL, "tb_cpu_blas() returned a table");
    CHECK_MSG(strstr(tb_cpu_blas_error(), "libopenblas-absent.so.0") != NULL, "reason: '%s'", tb_cpu_blas_error());
    CHECK(tb_test_mapped("libopenblas") == 0);
    CHECK(tb_cpu_matmul_tactic_available(TB_MM_OWN, TB_F32));

    /* the own kernels run: y = x w^T against a plain loop */
    tb_backend *b = NULL;
    CHECK(tb_backend_create("cpu", 2, 64, &b) == TB_OK);
    enum { T = 3, K = 20, N = 12 };
    float x[T * K], w[N * K], y[T * N];
    for (int i = 0; i < T * K; i++) x[i] = (float)((i * 7) % 11) - 5.0f;
    for (int i = 0; i < N * K; i++) w[i] = (float)((i * 5) % 9) * 0.125f;
    tb_cpu_matmul_tactic(tb_backend_cpu_pool(b), TB_MM_OWN, x, w, TB_F32, NULL, y, T, K, N);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            float r = 0;
            for (int k = 0; k < K; k++) r += x[t * K + k] * w[n * K + k];
            CHECK_MSG(fabsf(y[t * N + n] - r) <= 1e-4f * (1 + fabsf(r)), "y[%d,%d] = %g, want %g", t, n,
                      y[t * N + n], r);
        }
    tb_backend_free(b);
    CHECK(tb_test_mapped("libopenblas") == 0);
    printf("%d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures != 0;
}
