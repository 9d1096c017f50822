/*
 * kernels_bench.c — CPU matmul microbenchmark at the shapes of a 134M Llama.
 *
 * GEMV (T = 1, decode) is reported as GB/s of weight bytes read, next to the
 * copy bandwidth (tb_cpu_copy of a 256 MiB buffer, bytes copied per second)
 * measured in the same run. The weights rotate through enough copies to span
 * >= 256 MiB, so they come from DRAM as in a real decode step, not from L3.
 * GEMM (T = 512, prefill) is reported as GFLOP/s, own kernels vs OpenBLAS.
 *
 * usage: kernels_bench [seconds per measurement, default 0.3] [gemv|gemm]
 */
#include "backend/cpu/kernels.h"

#include <math.h>

#define SPAN_BYTES ((size_t)256 << 20)

static void *xalloc(size_t n) {
    void *p = tb_alloc_aligned(n, 64);
    TB_ASSERT(p);
    return p;
}

static void fill_weights(void *w, tb_dtype dt, size_t n) {
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float v = (float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
        if (dt == TB_F32) ((float *)w)[i] = v;
        else if (dt == TB_F16) ((uint16_t *)w)[i] = tb_f32_to_f16(v);
        else ((uint16_t *)w)[i] = tb_f32_to_bf16(v);
    }
}

static double copy_gbs(tb_pool *p, double secs) {
    uint8_t *a = xalloc(SPAN_BYTES), *b = xalloc(SPAN_BYTES);
    memset(a, 1, SPAN_BYTES);
    memset(b, 2, SPAN_BYTES);
    double best = 1e30, t_end = tb_now() + secs;
    int reps = 0;
    while (reps < 3 || tb_now() < t_end) {
        double t0 = tb_now();
        tb_cpu_copy(p, b, a, SPAN_BYTES);
        double dt = tb_now() - t0;
        if (dt < best) best = dt;
        reps++;
    }
    tb_free_aligned(a);
    tb_free_aligned(b);
    return (double)SPAN_BYTES / best * 1e-9;
}

/* Median-free simple timing: total time over as many calls as fit in
 * `secs`, weights rotating through `copies` distinct matrices. */
static double time_matmul(tb_pool *p, tb_mm_tactic tac, const float *x, const uint8_t *w,
                          size_t wbytes, int copies, tb_dtype dt, float *y, int T, int K, int N,
                          double secs) {
    for (int c = 0; c < copies; c++) /* warm up: page in every copy */
        tb_cpu_matmul_tactic(p, tac, x, w + (size_t)c * wbytes, dt, NULL, y, T, K, N);
    double t0 = tb_now(), t;
    long calls = 0;
    do {
        tb_cpu_matmul_tactic(p, tac, x, w + (size_t)(calls % copies) * wbytes, dt, NULL, y, T, K, N);
        calls++;
    } while ((t = tb_now() - t0) < secs || calls < 3);
    return t / (double)calls;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.3;
    const char *only = argc > 2 ? argv[2] : "";
    static const int gemv_shapes[][2] = {{768, 2304}, {768, 768}, {768, 4096}, {2048, 768}, {768, 32000}};
    static const int gemm_shapes[][2] = {{768, 2304}, {768, 768}, {768, 4096}, {2048, 768}};
    static const tb_dtype dts[] = {TB_F32, TB_F16};
    char model[128], feat[128];
    tb_cpu_model_name(model, sizeof model);
    tb_cpu_features_str(tb_cpu_features(), feat, sizeof feat);
    printf("cpu: %s [%s], kernel path: %s, OpenBLAS: %s\n\n", model, feat, tb_cpu_kernel_path(),
           tb_cpu_matmul_tactic_available(TB_MM_BLAS, TB_F32) ? "yes" : "no");

    uint8_t *wbuf = xalloc(SPAN_BYTES + ((size_t)128 << 20));
    float *x = xalloc((size_t)512 * 2048 * sizeof(float));
    float *y = xalloc((size_t)512 * 32000 * sizeof(float));
    for (size_t i = 0; i < (size_t)512 * 2048; i++) x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;

    for (int nth = 1; nth <= 2; nth++) {
        tb_pool *p = NULL;
        if (tb_pool_create(nth, &p) != TB_OK) return 1;
        double cp = copy_gbs(p, secs);
        printf("== %d thread%s: copy bandwidth %.1f GB/s (256 MiB tb_cpu_copy)\n", nth,
               nth > 1 ? "s" : "", cp);
        printf("GEMV T=1       %-6s %8s %9s %8s %7s\n", "dtype", "MB", "us/call", "GB/s", "%copy");
        for (size_t d = 0; d < 2 && strcmp(only, "gemm"); d++)
            for (size_t s = 0; s < sizeof gemv_shapes / sizeof gemv_shapes[0]; s++) {
                int K = gemv_shapes[s][0], N = gemv_shapes[s][1];
                size_t wbytes = (size_t)K * N * tb_dtype_size(dts[d]);
                int copies = (int)((SPAN_BYTES + wbytes - 1) / wbytes);
                if ((size_t)copies * wbytes > SPAN_BYTES + ((size_t)128 << 20)) copies--;
                for (int c = 0; c < copies; c++) fill_weights(wbuf + (size_t)c * wbytes, dts[d], (size_t)K * N);
                double t = time_matmul(p, TB_MM_OWN, x, wbuf, wbytes, copies, dts[d], y, 1, K, N, secs);
                double gbs = (double)wbytes / t * 1e-9;
                printf("  K=%-4d N=%-5d %-6s %8.2f %9.1f %8.1f %6.0f%%\n", K, N, tb_dtype_name(dts[d]),
                       (double)wbytes / 1e6, t * 1e6, gbs, 100.0 * gbs / cp);
            }
        printf("GEMM T=512     %-6s %10s %10s %10s\n", "dtype", "own GF/s", "blas GF/s", "own/blas");
        for (size_t d = 0; d < 2 && strcmp(only, "gemv"); d++)
            for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
                int K = gemm_shapes[s][0], N = gemm_shapes[s][1], T = 512;
                size_t wbytes = (size_t)K * N * tb_dtype_size(dts[d]);
                fill_weights(wbuf, dts[d], (size_t)K * N);
                double flop = 2.0 * T * K * N;
                double own = flop / time_matmul(p, TB_MM_OWN, x, wbuf, wbytes, 1, dts[d], y, T, K, N, secs) * 1e-9;
                double blas = 0;
                if (tb_cpu_matmul_tactic_available(TB_MM_BLAS, dts[d]))
                    blas = flop / time_matmul(p, TB_MM_BLAS, x, wbuf, wbytes, 1, dts[d], y, T, K, N, secs) * 1e-9;
                if (blas > 0)
                    printf("  K=%-4d N=%-5d %-6s %10.1f %10.1f %10.2f\n", K, N, tb_dtype_name(dts[d]), own,
                           blas, own / blas);
                else
                    printf("  K=%-4d N=%-5d %-6s %10.1f %10s %10s\n", K, N, tb_dtype_name(dts[d]), own, "-", "-");
            }
        printf("\n");
        tb_pool_free(p);
    }
    tb_free_aligned(wbuf);
    tb_free_aligned(x);
    tb_free_aligned(y);
    return 0;
}
