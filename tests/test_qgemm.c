/*
 * test_qgemm.c — every path of tb_cpu_qmatmul against tb_ref_qmatmul.
 *
 * Paths: each SIMD path this CPU has (forced: avx512, avx2, scalar), each
 * tactic (register tiles, packed prefill panels, and the int8-activation
 * tactic where available), 1 and 2 threads; shapes: T 1..17 (every token
 * tile remainder), 96 and 100+ (prefill sizes, and a remainder of the 6-row
 * microkernel), K odd and not a multiple of 64 or 256 (i8/fp8), i4 K whole
 * groups of 32/64/128 but not multiples of 64/256, N odd (row-tile tails),
 * with and without zeros and bias.
 *
 * Tolerances: the dequantise-and-FMA tactics differ from the reference only
 * by f32 summation order: max |y - ref| <= 1e-5 * max |ref|. The int8-
 * activation tactic is checked tightly (1e-5) against tb_ref_qmatmul_q8,
 * which quantises x the same way, and loosely against tb_ref_qmatmul:
 * |y - ref| <= 2 * sum_k |dq(w)[n,k]| * (amax of x's block / 127) / 2
 * elementwise (each activation moves by at most half its block's step).
 */
#include "backend/cpu/kernels.h"
#include "core/quant.h"
#include "tb_test.h"
#include "tune/tune.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

typedef struct {
    tb_dtype dt;
    int K, N, group, asym;
} wshape;

typedef struct {
    tb_qweight qw;
    float *dq; /* (N, K) dequantised */
    void *codes;
    float *s, *z;
} qweight_buf;

static void make_weight(const wshape *ws, qweight_buf *b) {
    int K = ws->K, N = ws->N, G = K / ws->group;
    float *w = malloc(sizeof(float) * (size_t)N * K);
    b->s = malloc(sizeof(float) * (size_t)N * G);
    b->z = malloc(sizeof(float) * (size_t)N * G);
    b->codes = malloc(tb_quant_codes_bytes(ws->dt, N, K));
    b->dq = malloc(sizeof(float) * (size_t)N * K);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = frand() * (1.0f + (float)(i % 5)) + (ws->asym ? 0.3f : 0.0f);
    CHECK(tb_quantize_rows(ws->dt, w, N, K, ws->group, ws->asym, b->codes, b->s, ws->asym ? b->z : NULL) == TB_OK);
    tb_dequantize_rows(ws->dt, b->codes, b->s, ws->asym ? b->z : NULL, N, K, ws->group, b->dq);
    b->qw = (tb_qweight){ws->dt, b->codes, b->s, ws->asym ? b->z : NULL, ws->group};
    free(w);
}

static void free_weight(qweight_buf *b) { free(b->s), free(b->z), free(b->codes), free(b->dq); }

static int n_runs;

/* One (path, threads, tactic, weight, T, bias) case. */
static void check_case(tb_pool *pool, tb_qmm_tactic tac, const wshape *ws, qweight_buf *b, int T, int with_bias) {
    int K = ws->K, N = ws->N;
    float *x = malloc(sizeof(float) * (size_t)T * K), *bias = malloc(sizeof(float) * N);
    float *y = malloc(sizeof(float) * (size_t)T * N), *yr = malloc(sizeof(float) * (size_t)T * N);
    for (size_t i = 0; i < (size_t)T * K; i++) x[i] = frand() * (i % 11 == 0 ? 4.0f : 1.0f);
    for (int i = 0; i < N; i++) bias[i] = frand();
    const float *bp = with_bias ? bias : NULL;
    for (size_t i = 0; i < (size_t)T * N; i++) y[i] = NAN; /* every output must be written */
    tb_ref_qmatmul(x, &b->qw, bp, yr, T, K, N);
    tb_cpu_qmatmul_tactic(pool, tac, x, &b->qw, bp, y, T, K, N);
    n_runs++;
    const char *what = tac == TB_QMM_DQ ? "dq" : tac == TB_QMM_PACKED ? "packed" : tac == TB_QMM_Q8 ? "q8" : "auto";
    if (tac != TB_QMM_Q8) {
        float rel = tb_test_max_rel(y, yr, T * N);
        CHECK_MSG(rel <= 1e-5f, "%s %s T %d K %d N %d group %d zeros %d bias %d path %s threads %d: rel err %g",
                  what, tb_dtype_name(ws->dt), T, K, N, ws->group, ws->asym, with_bias, tb_cpu_kernel_path(),
                  tb_pool_size(pool), rel);
    } else {
        float *yq = malloc(sizeof(float) * (size_t)T * N);
        tb_ref_qmatmul_q8(x, &b->qw, bp, yq, T, K, N);
        float rel = tb_test_max_rel(y, yq, T * N);
        CHECK_MSG(rel <= 1e-5f, "q8 %s T %d K %d N %d group %d zeros %d: rel err %g vs the q8 reference",
                  tb_dtype_name(ws->dt), T, K, N, ws->group, ws->asym, rel);
        /* the activation rounding bound against the exact reference */
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                double bound = 0;
                for (int k0 = 0; k0 < K; k0 += 32) {
                    float amax = 0;
                    int k1 = k0 + 32 < K ? k0 + 32 : K;
                    for (int k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(x[(size_t)t * K + k]));
                    for (int k = k0; k < k1; k++) bound += fabs(b->dq[(size_t)n * K + k]) * amax / 127.0 * 0.5;
                }
                double e = fabs((double)y[(size_t)t * N + n] - yr[(size_t)t * N + n]);
                if (e > 2 * bound + 1e-4) bad++;
            }
        CHECK_MSG(bad == 0, "q8 %s T %d K %d N %d: %d outputs outside the activation rounding bound",
                  tb_dtype_name(ws->dt), T, K, N, bad);
        free(yq);
    }
    free(x), free(bias), free(y), free(yr);
}

int main(void) {
    const wshape shapes[] = {
        {TB_I8, 72, 37, 72, 0},           {TB_I8, 333, 7, 333, 0},          {TB_I8, 16, 5, 16, 0},
        {TB_FP8_E4M3, 200, 19, 200, 0},   {TB_FP8_E4M3, 77, 6, 77, 0},      {TB_I4, 96, 33, 32, 0},
        {TB_I4, 96, 9, 32, 1},            {TB_I4, 320, 13, 64, 0},          {TB_I4, 192, 21, 64, 1},
        {TB_I4, 384, 11, 128, 1},         {TB_I4, 640, 5, 128, 0},          {TB_I8, 520, 45, 520, 0},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    qweight_buf bufs[sizeof shapes / sizeof shapes[0]];
    for (int i = 0; i < n_shapes; i++) make_weight(&shapes[i], &bufs[i]);

    /* the reference itself: the f32 product with the dequantised weights */
    for (int i = 0; i < n_shapes; i++) {
        int T = 3, K = shapes[i].K, N = shapes[i].N;
        float *x = malloc(sizeof(float) * (size_t)T * K), *y = malloc(sizeof(float) * (size_t)T * N),
              *yr = malloc(sizeof(float) * (size_t)T * N);
        for (size_t j = 0; j < (size_t)T * K; j++) x[j] = frand();
        tb_ref_qmatmul(x, &bufs[i].qw, NULL, yr, T, K, N);
        tb_ref_matmul(x, bufs[i].dq, TB_F32, NULL, y, T, K, N);
        CHECK(tb_test_max_rel(yr, y, T * N) < 1e-5f);
        free(x), free(y), free(yr);
    }

    const char *paths[] = {"avx512", "avx2", "scalar"};
    int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 96, 100, 131};
    const int nT = (int)(sizeof Ts / sizeof Ts[0]);
    int n_paths = 0;
    for (int th = 1; th <= 2; th++) {
        tb_pool *pool = NULL;
        CHECK(tb_pool_create(th, &pool) == TB_OK);
        for (int pi = 0; pi < 3; pi++) {
            if (tb_cpu_kernel_force_path(paths[pi]) != 0) continue;
            n_paths += th == 1;
            for (int i = 0; i < n_shapes; i++) {
                for (int ti = 0; ti < nT; ti++) {
                    int T = Ts[ti], bias = (ti + i) & 1;
                    check_case(pool, TB_QMM_AUTO, &shapes[i], &bufs[i], T, bias);
                    /* each exact tactic at sizes where it is not the default
                     * (panels for small steps; tiles and panels at prefill
                     * sizes, whichever the path defaults to) */
                    if (T <= 17 && (T % 4 == 1 || T == 16)) check_case(pool, TB_QMM_PACKED, &shapes[i], &bufs[i], T, !bias);
                    if (T >= 96) {
                        check_case(pool, TB_QMM_DQ, &shapes[i], &bufs[i], T, !bias);
                        check_case(pool, TB_QMM_PACKED, &shapes[i], &bufs[i], T, bias);
                    }
                    if (tb_cpu_qmatmul_tactic_available(TB_QMM_Q8, &bufs[i].qw) && (T <= 17 || T == 100))
                        check_case(pool, TB_QMM_Q8, &shapes[i], &bufs[i], T, bias);
                }
            }
        }
        tb_cpu_kernel_force_path(NULL);
        tb_pool_free(pool);
    }
    CHECK(n_paths >= 1);

    /* the build-time timing (tb_tune_qmatmul), each mode: a tactic this CPU
     * runs; Q8 only where available, never in EXACT builds, everywhere it
     * applies in Q8 builds; for i8 and i4 weights */
    for (int wi = 0; wi < 2; wi++) {
        qweight_buf *b = &bufs[wi ? 7 : 11];
        int T = 96, K = shapes[wi ? 7 : 11].K, N = shapes[wi ? 7 : 11].N;
        int q8 = tb_cpu_qmatmul_tactic_available(TB_QMM_Q8, &b->qw);
        tb_pool *pool = NULL;
        CHECK(tb_pool_create(2, &pool) == TB_OK);
        float *x = calloc((size_t)T * K, sizeof(float)), *y = calloc((size_t)T * N, sizeof(float));
        for (size_t j = 0; j < (size_t)T * K; j++) x[j] = frand();
        for (int mode = TB_QMM_TACTICS_AUTO; mode <= TB_QMM_TACTICS_Q8; mode++) {
            int word = tb_tune_qmatmul(pool, &b->qw, K, N, T, mode, x, y);
            int small = word & 0xff, large = (word >> 8) & 0xff;
            CHECK_MSG(word >> 16 == 0, "tactic word %#x has bits beyond the CPU's bytes", word);
            CHECK_MSG(small == TB_QMM_AUTO || (small == TB_QMM_Q8 && q8 && mode != TB_QMM_TACTICS_EXACT),
                      "mode %d: small-step tactic %d", mode, small);
            CHECK_MSG(large == TB_QMM_AUTO || large == TB_QMM_DQ || large == TB_QMM_PACKED ||
                          (large == TB_QMM_Q8 && q8 && mode != TB_QMM_TACTICS_EXACT),
                      "mode %d: prefill tactic %d", mode, large);
            if (mode == TB_QMM_TACTICS_Q8)
                CHECK_MSG(!q8 || (small == TB_QMM_Q8 && large == TB_QMM_Q8), "q8 mode: small %d large %d", small,
                          large);
            printf("test_qgemm: timed tactic for %s %dx%d, mode %d: small %d, large %d\n",
                   tb_dtype_name(b->qw.dtype), N, K, mode, small, large);
        }
        free(x), free(y);
        tb_pool_free(pool);
    }
    for (int i = 0; i < n_shapes; i++) free_weight(&bufs[i]);
    printf("test_qgemm: %d paths, %d runs, %d checks, %d failures\n", n_paths, n_runs, tb_test_checks,
           tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
