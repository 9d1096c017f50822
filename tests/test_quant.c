/*
 * test_quant.c — the weight quantisers (core/quant.h) and the quantized
 * matmul (kernels.h tb_qweight): dequantised values within each encoding's
 * rounding bound, the refusals of tb_quant_check, and tb_cpu_qmatmul against
 * tb_ref_qmatmul over odd shapes, every dtype, with and without zeros and
 * bias, for 1 and 2 threads and every SIMD path this CPU has.
 */
#include "backend/cpu/kernels.h"
#include "core/quant.h"
#include "tb_test.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Quantise, dequantise, check every element against its group's bound. */
static void check_roundtrip(tb_dtype dt, int N, int K, int group, int asym) {
    float *w = malloc(sizeof(float) * (size_t)N * K), *dq = malloc(sizeof(float) * (size_t)N * K);
    int G = K / group;
    float *s = malloc(sizeof(float) * (size_t)N * G), *z = malloc(sizeof(float) * (size_t)N * G);
    uint8_t *codes = malloc(tb_quant_codes_bytes(dt, N, K));
    for (int i = 0; i < N * K; i++) w[i] = frand() * (1 + (i % 7)) + (asym ? 0.5f : 0.0f);
    if (N > 1) for (int k = 0; k < K; k++) w[K + k] = 0; /* an all-zero row */
    CHECK(tb_quantize_rows(dt, w, N, K, group, asym, codes, s, asym ? z : NULL) == TB_OK);
    tb_dequantize_rows(dt, codes, s, asym ? z : NULL, N, K, group, dq);
    int bad = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            float sc = s[(size_t)n * G + k / group], v = w[(size_t)n * K + k], e = fabsf(dq[(size_t)n * K + k] - v);
            /* half a step; fp8: half an ulp of 3 mantissa bits (1/16 relative) or half the subnormal step */
            float bound = dt == TB_FP8_E4M3 ? fmaxf(fabsf(v) / 16.0f, sc * 0.5f * 0.001953125f) : 0.5f * sc;
            if (e > bound * 1.0001f + 1e-7f) bad++;
        }
    CHECK_MSG(bad == 0, "%s N %d K %d group %d asym %d: %d elements outside the rounding bound", tb_dtype_name(dt),
              N, K, group, asym, bad);
    if (N > 1) {
        float zmax = 0;
        for (int k = 0; k < K; k++) zmax = fmaxf(zmax, fabsf(dq[K + k]));
        CHECK_MSG(zmax == 0, "an all-zero row dequantises to %g", zmax);
    }
    free(w), free(dq), free(s), free(z), free(codes);
}

static void check_matmul(tb_pool *pool, tb_dtype dt, int T, int K, int N, int group, int asym, int with_bias) {
    float *w = malloc(sizeof(float) * (size_t)N * K), *x = malloc(sizeof(float) * (size_t)T * K);
    float *bias = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * (size_t)T * N),
          *yr = malloc(sizeof(float) * (size_t)T * N);
    int G = K / group;
    float *s = malloc(sizeof(float) * (size_t)N * G), *z = malloc(sizeof(float) * (size_t)N * G);
    uint8_t *codes = malloc(tb_quant_codes_bytes(dt, N, K));
    for (int i = 0; i < N * K; i++) w[i] = frand();
    for (int i = 0; i < T * K; i++) x[i] = frand();
    for (int i = 0; i < N; i++) bias[i] = frand();
    CHECK(tb_quantize_rows(dt, w, N, K, group, asym, codes, s, asym ? z : NULL) == TB_OK);
    tb_qweight qw = {dt, codes, s, asym ? z : NULL, group};
    tb_ref_qmatmul(x, &qw, with_bias ? bias : NULL, yr, T, K, N);
    tb_cpu_qmatmul(pool, x, &qw, with_bias ? bias : NULL, y, T, K, N);
    float rel = tb_test_max_rel(y, yr, T * N);
    CHECK_MSG(rel < 1e-5f, "%s T %d K %d N %d group %d asym %d bias %d path %s: rel err %g", tb_dtype_name(dt), T, K,
              N, group, asym, with_bias, tb_cpu_kernel_path(), rel);
    /* and the reference is the float product with the dequantised weights */
    float *dq = malloc(sizeof(float) * (size_t)N * K);
    tb_dequantize_rows(dt, codes, s, asym ? z : NULL, N, K, group, dq);
    tb_ref_matmul(x, dq, TB_F32, with_bias ? bias : NULL, y, T, K, N);
    rel = tb_test_max_rel(yr, y, T * N);
    CHECK_MSG(rel < 1e-5f, "reference vs dequantised f32 matmul: rel err %g", rel);
    free(w), free(x), free(bias), free(y), free(yr), free(s), free(z), free(codes), free(dq);
}

int main(void) {
    /* refusals */
    CHECK(tb_quant_check(TB_I4, 96, 48, 0) != TB_OK);
    CHECK(tb_quant_check(TB_I4, 96, 64, 0) != TB_OK); /* 96 not whole groups of 64 */
    CHECK(tb_quant_check(TB_I8, 96, 32, 0) != TB_OK);
    CHECK(tb_quant_check(TB_I8, 96, 96, 1) != TB_OK);
    CHECK(tb_quant_check(TB_F16, 96, 96, 0) == TB_ERR_UNSUPPORTED);
    CHECK(tb_quant_check(TB_I4, 96, 32, 1) == TB_OK);
    float inf[32];
    for (int i = 0; i < 32; i++) inf[i] = i == 5 ? INFINITY : 1.0f;
    uint8_t c[32];
    float sc[1];
    CHECK(tb_quantize_rows(TB_I8, inf, 1, 32, 32, 0, c, sc, NULL) == TB_ERR_FORMAT);

    check_roundtrip(TB_I8, 5, 72, 72, 0);
    check_roundtrip(TB_FP8_E4M3, 5, 72, 72, 0);
    for (int g = 32; g <= 128; g *= 2) {
        check_roundtrip(TB_I4, 5, 256, g, 0);
        check_roundtrip(TB_I4, 5, 256, g, 1);
    }

    const char *paths[] = {"avx512", "avx2", "scalar"};
    for (int th = 1; th <= 2; th++) {
        tb_pool *pool = NULL;
        CHECK(tb_pool_create(th, &pool) == TB_OK);
        for (int pi = 0; pi < 3; pi++) {
            if (tb_cpu_kernel_force_path(paths[pi]) != 0) continue;
            int Ts[] = {1, 3, 8, 17, 100};
            for (int ti = 0; ti < 5; ti++) {
                int T = Ts[ti];
                check_matmul(pool, TB_I8, T, 72, 37, 72, 0, ti & 1);
                check_matmul(pool, TB_FP8_E4M3, T, 200, 19, 200, 0, !(ti & 1));
                check_matmul(pool, TB_I4, T, 256, 33, 32, 0, 1);
                check_matmul(pool, TB_I4, T, 384, 21, 128, 1, 0);
                check_matmul(pool, TB_I4, T, 128, 9, 64, 1, 1);
            }
        }
        tb_cpu_kernel_force_path(NULL);
        tb_pool_free(pool);
    }
    printf("test_quant: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
