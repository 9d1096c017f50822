/*
 * test_quant_ref.c — the weight quantisers (core/quant.h) against the
 * independent numpy implementation in tests/reference.py (--quant-check):
 * random tensors of every encoding (int8, fp8 e4m3, int4 symmetric and with
 * zero points, each int4 group size) plus rows made to hit the edge cases
 * (an all-zero group, values exactly half a step apart so rounding ties,
 * one outlier per row, magnitudes in fp8's subnormal range) are quantised
 * here, written to files, and reference.py requires equal codes and scales
 * bit for bit and dequantised values within the rounding bound.
 * Skips (77) without /usr/bin/python3 and numpy.
 */
#include "core/quant.h"
#include "tb_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static float nrand(void) { /* Box-Muller: weights look Gaussian */
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* kind 0: Gaussian; 1: edge cases (see the top) */
static void write_case(const char *dir, int id, tb_dtype dt, int N, int K, int group, int asym, int kind) {
    float *w = malloc(sizeof(float) * (size_t)N * K);
    int G = K / group;
    float *s = malloc(sizeof(float) * (size_t)N * G), *z = malloc(sizeof(float) * (size_t)N * G);
    uint8_t *codes = malloc(tb_quant_codes_bytes(dt, N, K));
    for (int n = 0; n < N; n++) {
        float row_scale = (float)exp(urand() * 6 - 4); /* rows of different magnitudes */
        for (int k = 0; k < K; k++) w[(size_t)n * K + k] = nrand() * row_scale + (asym ? 0.3f * row_scale : 0);
        if (kind == 1) {
            float *r = w + (size_t)n * K;
            switch (n % 4) {
            case 0: for (int k = 0; k < group; k++) r[k] = 0; break;          /* an all-zero group */
            case 1: /* ties: multiples of half a step of a max of 7 * 127 * 15 */
                for (int k = 0; k < K; k++) r[k] = (float)((int)(urand() * 2 * 13335) - 13335) * 0.5f;
                r[0] = 13335.0f;
                break;
            case 2: r[K / 2] = 1000.0f * row_scale; break;                     /* an outlier */
            case 3: for (int k = 1; k < K; k++) r[k] *= 1e-4f; break;          /* fp8 subnormals */
            }
        }
    }
    CHECK(tb_quantize_rows(dt, w, N, K, group, asym, codes, s, asym ? z : NULL) == TB_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/case_%02d.json", dir, id);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fprintf(f, "{\"dtype\": \"%s\", \"N\": %d, \"K\": %d, \"group\": %d, \"asym\": %d}\n", tb_dtype_name(dt), N, K,
                group, asym);
        fclose(f);
    }
#define W(ext, p, n)                                                   \
    do {                                                               \
        snprintf(path, sizeof path, "%s/case_%02d." ext, dir, id);     \
        CHECK(write_file(path, p, n));                                 \
    } while (0)
    W("w", w, sizeof(float) * (size_t)N * K);
    W("codes", codes, (size_t)tb_quant_codes_bytes(dt, N, K));
    W("scales", s, sizeof(float) * (size_t)N * G);
    if (asym) W("zeros", z, sizeof(float) * (size_t)N * G);
#undef W
    free(w); free(s); free(z); free(codes);
}

int main(void) {
    if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
        printf("SKIP: /usr/bin/python3 with numpy is needed\n");
        return 77;
    }
    const char *tmp = getenv("TURBINE_TMP"), *src = getenv("TURBINE_SRC");
    char dir[400], cmd[1200];
    snprintf(dir, sizeof dir, "%s/quant_ref", tmp && *tmp ? tmp : "/tmp");
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    CHECK(system(cmd) == 0);
    int id = 0;
    for (int kind = 0; kind < 2; kind++) {
        write_case(dir, id++, TB_I8, 37, 96, 96, 0, kind);
        write_case(dir, id++, TB_I8, 8, 4096, 4096, 0, kind);
        write_case(dir, id++, TB_FP8_E4M3, 37, 96, 96, 0, kind);
        write_case(dir, id++, TB_FP8_E4M3, 8, 1000, 1000, 0, kind);
        for (int group = 32; group <= 128; group *= 2)
            for (int asym = 0; asym < 2; asym++) write_case(dir, id++, TB_I4, 19, 384, group, asym, kind);
    }
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/reference.py' --quant-check '%s'", src && *src ? src : ".",
             dir);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "reference.py --quant-check failed (%d) on %d cases", rc, id);
    return tb_test_finish("test_quant_ref");
}
