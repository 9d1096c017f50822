/*
 * test_igemm.c — the int8 GEMM of igemm.h: every kernel (forced through
 * tb_cpu_kernel_force_path and tb_cpu_igemm_allow_avxvnni: AVX-512 VNNI,
 * AVX-VNNI, int16 AVX2, scalar, those this CPU runs) against the scalar
 * reference tb_ref_igemm on odd shapes (M, N, K off the tiles, K from 1 to
 * 4608, several row blocks and W chunks), zero points 0 / 128 / 255, leading
 * dims larger than the rows, with and without each epilogue part, alone and
 * over a pool. Without an epilogue the outputs must be the same bits (the
 * integer sums are exact and the f32 formula is the same); with one, within
 * the float rounding of the epilogue. Also tb_cpu_quantize_u8 against a
 * round-half-to-even formula written out here (ties, saturation).
 * The direct int8 convolution (tb_cpu_iconv_*, where it runs): its codes
 * against tb_cpu_quantize_u8 per pixel (border and slack the zero point's
 * code), and the kernel against tb_ref_iconv on the same codes and packed
 * weight, every output the same bits, over odd channel counts (M off the
 * 8-channel blocks), widths off the 16-lane vectors, kernels 1x1 to 5x5 with
 * asymmetric pads, zero points, each epilogue part, and the work split by
 * channel blocks and by vectors.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/igemm.h"
#include "backend/cpu/igemm_impl.h"
#include "backend/cpu/kernels.h"
#include "core/core.h"
#include "tb_test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frnd(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }

enum { EPI_NONE, EPI_BIAS_COL, EPI_BIAS_ROW, EPI_RELU, EPI_GELU_RES, EPI_RES_AFTER, EPI_COUNT };

static void check_case(const char *path, tb_pool *pool, int64_t M, int64_t N, int64_t K, int a_zero, int epi_kind,
                       int pad) {
    int64_t lda = K + pad, ldw = K + 3 * pad, ldy = N + pad;
    uint8_t *A = malloc((size_t)(M * lda));
    int8_t *W = malloc((size_t)(N * ldw));
    float *ws = malloc((size_t)N * sizeof(float)), *bias = malloc((size_t)(M > N ? M : N) * sizeof(float));
    float *res = malloc((size_t)(M * ldy) * sizeof(float));
    float *Y = malloc((size_t)(M * ldy) * sizeof(float)), *R = malloc((size_t)(M * ldy) * sizeof(float));
    void *Wp = tb_alloc_aligned(tb_cpu_igemm_packed_bytes(N, K), 64);
    for (int64_t i = 0; i < M * lda; i++) A[i] = (uint8_t)rnd();
    /* the extremes of both ranges appear in every row */
    for (int64_t m = 0; m < M; m++) A[m * lda] = m & 1 ? 255 : 0;
    for (int64_t i = 0; i < N * ldw; i++) W[i] = (int8_t)((int)(rnd() % 255) - 127);
    for (int64_t n = 0; n < N; n++) W[n * ldw + (K - 1)] = n & 1 ? 127 : -127;
    for (int64_t n = 0; n < N; n++) ws[n] = 0.001f + 0.01f * (float)(rnd() % 100) / 100.f;
    for (int64_t i = 0; i < (M > N ? M : N); i++) bias[i] = frnd();
    for (int64_t i = 0; i < M * ldy; i++) res[i] = frnd();
    float a_scale = 0.02f + 0.001f * (float)(rnd() % 10);
    tb_cpu_sgemm_epi e;
    memset(&e, 0, sizeof e);
    switch (epi_kind) {
    case EPI_BIAS_COL: e.bias = bias, e.bias_cs = 1; break;
    case EPI_BIAS_ROW: e.bias = bias, e.bias_rs = 1, e.bias_scale = 0.5f; break;
    case EPI_RELU: e.bias = bias, e.bias_cs = 1, e.act = TB_NN_ACT_RELU; break;
    case EPI_GELU_RES: e.bias = bias, e.bias_cs = 1, e.act = TB_NN_ACT_GELU_ERF, e.res = res, e.ld_res = ldy; break;
    case EPI_RES_AFTER: e.act = TB_NN_ACT_RELU, e.res = res, e.ld_res = ldy, e.act_after_res = 1; break;
    default: break;
    }
    const tb_cpu_sgemm_epi *ep = epi_kind == EPI_NONE ? NULL : &e;
    tb_cpu_igemm_pack(W, ldw, N, K, Wp);
    for (int64_t i = 0; i < M * ldy; i++) Y[i] = R[i] = -7.0f; /* the columns past N must stay */
    tb_ref_igemm(M, N, K, A, lda, a_zero, a_scale, W, ldw, ws, R, ldy, ep);
    tb_cpu_igemm(M, N, K, A, lda, a_zero, a_scale, Wp, ws, Y, ldy, ep, pool);
    int64_t bad = 0, at = -1;
    float worst = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < ldy; n++) {
            float y = Y[m * ldy + n], r = R[m * ldy + n];
            int ok;
            if (n >= N || !ep)
                ok = memcmp(&y, &r, sizeof y) == 0;
            else {
                float d = fabsf(y - r);
                ok = d <= 1e-5f * fabsf(r) + 1e-6f;
                if (d > worst) worst = d;
            }
            if (!ok && bad++ == 0) at = m * ldy + n;
        }
    CHECK_MSG(bad == 0,
              "%s pool %d: M %lld N %lld K %lld zero %d epi %d pad %d: %lld wrong, first at (%lld, %lld): %.9g vs %.9g",
              path, pool != NULL, (long long)M, (long long)N, (long long)K, a_zero, epi_kind, pad, (long long)bad,
              (long long)(at / ldy), (long long)(at % ldy), at >= 0 ? Y[at] : 0.0, at >= 0 ? R[at] : 0.0);
    tb_free_aligned(Wp);
    free(A), free(W), free(ws), free(bias), free(res), free(Y), free(R);
}

/* The integer sums alone, against a plain loop here (not the reference):
 * a_scale = w_scale = 1, so Y holds the exact int32 sum (below 2^24). */
static void check_exact(const char *path, int64_t M, int64_t N, int64_t K, int a_zero) {
    uint8_t *A = malloc((size_t)(M * K));
    int8_t *W = malloc((size_t)(N * K));
    float *ones = malloc((size_t)N * sizeof(float)), *Y = malloc((size_t)(M * N) * sizeof(float));
    void *Wp = tb_alloc_aligned(tb_cpu_igemm_packed_bytes(N, K), 64);
    for (int64_t i = 0; i < M * K; i++) A[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < N * K; i++) W[i] = (int8_t)((int)(rnd() % 255) - 127);
    for (int64_t n = 0; n < N; n++) ones[n] = 1.0f;
    tb_cpu_igemm_pack(W, K, N, K, Wp);
    tb_cpu_igemm(M, N, K, A, K, a_zero, 1.0f, Wp, ones, Y, N, NULL, NULL);
    int64_t bad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t s = 0;
            for (int64_t k = 0; k < K; k++) s += ((int64_t)A[m * K + k] - a_zero) * W[n * K + k];
            bad += Y[m * N + n] != (float)s;
        }
    CHECK_MSG(bad == 0, "%s exact sums: M %lld N %lld K %lld zero %d: %lld wrong", path, (long long)M, (long long)N,
              (long long)K, a_zero, (long long)bad);
    tb_free_aligned(Wp);
    free(A), free(W), free(ones), free(Y);
}

static void test_path(const char *path, tb_pool *pool) {
    static const int64_t shapes[][3] = {
        {1, 1, 1},    {1, 17, 3},   {2, 33, 17},  {3, 70, 147},  {4, 300, 300}, {5, 100, 4608}, {7, 16, 64},
        {13, 64, 576}, {6, 64, 4},  {37, 129, 64}, {50, 100, 4608}, {97, 31, 147}, {200, 48, 5},  {11, 257, 1},
    };
    static const int zeros[] = {0, 128, 255};
    int ns = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < ns; s++)
        for (int z = 0; z < 3; z++) {
            int epi = (s + z) % EPI_COUNT, pad = (s + z) % 2 ? 5 : 0;
            check_case(path, NULL, shapes[s][0], shapes[s][1], shapes[s][2], zeros[z], epi, pad);
            check_case(path, pool, shapes[s][0], shapes[s][1], shapes[s][2], zeros[z], (epi + 3) % EPI_COUNT, 7 - pad);
        }
    for (int e = 0; e < EPI_COUNT; e++) {
        check_case(path, NULL, 19, 45, 33, 128, e, 3);
        check_case(path, pool, 130, 90, 260, 3, e, 0);  /* split over rows */
        check_case(path, pool, 9, 250, 100, 200, e, 1); /* split over columns */
    }
    check_exact(path, 9, 40, 4608, 0);
    check_exact(path, 6, 64, 1023, 128);
    check_exact(path, 3, 17, 147, 255);
}

/* round half to even, written with floor (not nearbyintf) */
static uint8_t quant_formula(float x, float inv, int zero) {
    float v = x * inv, f = floorf(v), d = v - f;
    float r = d > 0.5f ? f + 1 : d < 0.5f ? f : (fmodf(f, 2.0f) != 0.0f ? f + 1 : f);
    float q = r + (float)zero;
    return (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
}

static void test_quantize(const char *path) {
    enum { n = 1031 };
    float x[n];
    uint8_t q[n + 1];
    const float invs[] = {0.25f, 1.0f / 0.0173f, 3.0f};
    const int zeros[] = {0, 128, 255, 7};
    for (int t = 0; t < 3; t++)
        for (int z = 0; z < 4; z++) {
            float inv = invs[t];
            for (int i = 0; i < n; i++) {
                switch (i % 4) {
                case 0: x[i] = ((float)(int)(rnd() % 601) - 300.0f + 0.5f) / inv; break; /* a tie when exact */
                case 1: x[i] = frnd() * 40.0f / inv; break;
                case 2: x[i] = (rnd() & 1 ? 1e6f : -1e6f) * frnd(); break; /* saturates */
                default: x[i] = frnd() * 300.0f / inv; break;
                }
            }
            x[0] = 2.5f / 0.25f * (inv == 0.25f), x[1] = -2.5f / inv, x[2] = 0.5f / inv, x[3] = -0.5f / inv;
            q[n] = 0xab;
            tb_cpu_quantize_u8(x, q, n, inv, zeros[z]);
            int bad = 0, ties = 0, first = -1;
            for (int i = 0; i < n; i++) {
                float v = x[i] * inv;
                ties += v - floorf(v) == 0.5f;
                if (q[i] != quant_formula(x[i], inv, zeros[z]) && bad++ == 0) first = i;
            }
            CHECK_MSG(bad == 0, "%s quantize inv %g zero %d: %d wrong, first x = %.9g: %d vs %d", path, inv, zeros[z],
                      bad, first >= 0 ? x[first] : 0.0, first >= 0 ? q[first] : 0,
                      first >= 0 ? quant_formula(x[first], inv, zeros[z]) : 0);
            CHECK(ties > 100); /* the ties were exercised */
            CHECK(q[n] == 0xab); /* nothing written past n */
        }
}

static void check_iconv(int64_t C, int64_t H, int64_t W, int64_t M, int kh, int kw, int st, int pt, int pl, int pb,
                        int pr, int zero, int with_bias, int with_res, int act, int after) {
    tb_iconv_geom g;
    tb_cpu_iconv_geometry(C, H, W, kh, kw, st, pt, pl, pb, pr, &g);
    /* two images (the codes of the first checked; the conv over both) */
    int64_t P = g.oh * g.ow * 2, nx = C * H * W;
    size_t qs = (tb_cpu_iconv_codes_bytes(&g) + 63) / 64 * 64;
    float *x = malloc((size_t)nx * 2 * sizeof(float)), *ws = malloc((size_t)M * sizeof(float));
    float *bias = malloc((size_t)M * sizeof(float)), *res = malloc((size_t)(M * P) * sizeof(float));
    float *Y = malloc((size_t)(M * P) * sizeof(float)), *R = malloc((size_t)(M * P) * sizeof(float));
    int8_t *w = malloc((size_t)(M * C * kh * kw));
    uint8_t *q = tb_alloc_aligned(2 * qs, 64), *row = malloc((size_t)W);
    uint32_t *tmp = malloc((size_t)(g.hp * g.wp) * 4);
    void *wp = tb_alloc_aligned(tb_cpu_iconv_packed_bytes(M, C, kh, kw), 64);
    CHECK(x && ws && bias && res && Y && R && w && q && row && wp && tmp);
    for (int64_t i = 0; i < 2 * nx; i++) x[i] = 1.5f * frnd();
    for (int64_t i = 0; i < M * C * kh * kw; i++) w[i] = (int8_t)((int)(rnd() % 255) - 127);
    for (int64_t i = 0; i < M; i++) ws[i] = 0.001f + 0.01f * fabsf(frnd()), bias[i] = frnd();
    for (int64_t i = 0; i < M * P; i++) res[i] = frnd(), Y[i] = NAN, R[i] = -NAN;
    float inv = 1.0f / 0.012f;
    tb_cpu_iconv_quantize(&g, x, inv, zero, q, st > 1 ? tmp : NULL, 0, g.cg);
    tb_cpu_iconv_quantize(&g, x + nx, inv, zero, q + qs, st > 1 ? tmp : NULL, 0, 1); /* in two calls */
    if (g.cg > 1) tb_cpu_iconv_quantize(&g, x + nx, inv, zero, q + qs, st > 1 ? tmp : NULL, 1, g.cg);
    int bad = 0;
    /* the codes: the quantizer's in the interior, the zero point elsewhere;
     * stride 2: padded (y, x) in phase (y % 2, x % 2) at (y / 2, x / 2) */
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < g.hq * st; y++) {
            int64_t iy = y - pt;
            if (iy >= 0 && iy < H) tb_cpu_quantize_u8(x + (c * H + iy) * W, row, W, inv, zero);
            for (int64_t xx = 0; xx < g.wq * st; xx++) {
                int64_t ix = xx - pl;
                int want = y < g.hp && xx < g.wp && iy >= 0 && iy < H && ix >= 0 && ix < W ? row[ix] : zero;
                int64_t at = (c / 4) * g.plane + ((y % st) * st + xx % st) * g.sub + (y / st) * g.wq + xx / st;
                bad += q[at * 4 + c % 4] != want;
            }
        }
    for (int64_t c = C; c < g.cg * 4; c++) /* the last group's channels past C */
        for (int64_t i = 0; i < g.plane; i++) bad += q[((c / 4) * g.plane + i) * 4 + c % 4] != zero;
    for (int64_t c = 0; c < C; c++)
        for (int64_t ph = 0; ph < st * st; ph++)
            for (int64_t i = g.hq * g.wq; i < g.sub; i++)
                bad += q[((c / 4) * g.plane + ph * g.sub + i) * 4 + c % 4] != zero;
    CHECK_MSG(bad == 0, "iconv codes C %lld %lldx%lld k %dx%d s %d: %d wrong", (long long)C, (long long)H,
              (long long)W, kh, kw, st, bad);
    tb_cpu_iconv_pack(w, M, C, kh, kw, wp);
    tb_iconv_job j;
    memset(&j, 0, sizeof j);
    j.g = &g, j.q = q, j.q_stride = qs, j.y_stride = M * g.oh * g.ow, j.n_img = 2, j.w = wp, j.m = M, j.zero = zero, j.a_scale = 0.012f, j.w_scale = ws;
    j.bias = with_bias ? bias : NULL, j.res = with_res ? res : NULL, j.y = R, j.act = act, j.after = after;
    tb_cpu_iconv_job_init(&j);
    tb_ref_iconv(&j);
    j.y = Y;
    /* split like the pool: by channel blocks, then by vectors */
    int64_t half = j.nblocks / 2;
    tb_cpu_iconv_run(&j, 0, half, 0, g.nvec);
    int64_t hv = g.nvec / 2 / 3 * 3;
    tb_cpu_iconv_run(&j, half, j.nblocks, 0, hv);
    tb_cpu_iconv_run(&j, half, j.nblocks, hv, g.nvec);
    bad = 0;
    int64_t first = -1;
    for (int64_t i = 0; i < M * P; i++)
        if (memcmp(&Y[i], &R[i], sizeof(float))) bad++, first = first < 0 ? i : first;
    CHECK_MSG(bad == 0, "iconv C %lld %lldx%lld M %lld k %dx%d s %d pads %d %d %d %d z %d b %d r %d a %d: %d of "
              "%lld differ, first %lld: %.9g vs %.9g", (long long)C, (long long)H, (long long)W, (long long)M, kh, kw,
              st, pt,
              pl, pb, pr, zero, with_bias, with_res, act, bad, (long long)(M * P), (long long)first,
              first >= 0 ? Y[first] : 0.0, first >= 0 ? R[first] : 0.0);
    free(x), free(ws), free(bias), free(res), free(Y), free(R), free(w), free(row), free(tmp);
    tb_free_aligned(q);
    tb_free_aligned(wp);
}

static void test_iconv(void) {
    if (!tb_cpu_iconv_supported(4, 3, 3, 1, 1, 1, 1, 1, TB_NN_ACT_RELU)) {
        printf("test_igemm: the direct int8 conv does not run here\n");
        return;
    }
    check_iconv(64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 128, 1, 1, TB_NN_ACT_RELU, 1);
    check_iconv(4, 5, 3, 3, 3, 3, 1, 1, 1, 1, 1, 0, 0, 0, TB_NN_ACT_NONE, 0);
    check_iconv(12, 7, 7, 21, 3, 3, 1, 1, 1, 1, 1, 255, 1, 0, TB_NN_ACT_RELU, 0);
    check_iconv(8, 9, 37, 17, 5, 3, 1, 2, 0, 1, 2, 77, 1, 1, TB_NN_ACT_RELU, 0);
    check_iconv(16, 6, 20, 40, 1, 1, 1, 0, 0, 0, 0, 3, 0, 1, TB_NN_ACT_NONE, 1);
    check_iconv(32, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 128, 1, 1, TB_NN_ACT_RELU, 0);
    check_iconv(20, 3, 56, 9, 3, 3, 1, 0, 0, 0, 0, 128, 1, 0, TB_NN_ACT_NONE, 0);
    /* stride 2: ResNet's 3x3 and 1x1 downsampling, odd sizes and pads */
    check_iconv(64, 56, 56, 24, 3, 3, 2, 1, 1, 1, 1, 128, 1, 0, TB_NN_ACT_RELU, 0);
    check_iconv(16, 14, 14, 32, 1, 1, 2, 0, 0, 0, 0, 128, 1, 0, TB_NN_ACT_NONE, 0);
    check_iconv(8, 11, 9, 13, 3, 3, 2, 1, 1, 1, 1, 5, 0, 1, TB_NN_ACT_RELU, 1);
    check_iconv(4, 10, 13, 8, 5, 4, 2, 2, 1, 0, 2, 200, 1, 1, TB_NN_ACT_NONE, 0);
    /* C off the 4-channel groups: ResNet's stem (7x7 / 2 over 3 colours), others */
    check_iconv(3, 32, 30, 64, 7, 7, 2, 3, 3, 3, 3, 128, 1, 0, TB_NN_ACT_RELU, 0);
    check_iconv(5, 9, 9, 11, 3, 3, 1, 1, 1, 1, 1, 17, 1, 1, TB_NN_ACT_RELU, 1);
    check_iconv(1, 6, 40, 8, 3, 3, 2, 1, 1, 1, 1, 128, 0, 0, TB_NN_ACT_NONE, 0);
}

int main(void) {
    tb_pool *pool = NULL;
    CHECK(tb_pool_create(2, &pool) == TB_OK);
    /* each kernel once: the forced path, and on "avx2" with AVX-VNNI allowed
     * or not (the 256-bit vpdpbusd kernel and the int16 one) */
    const char *paths[] = {"avx512", "avx2", "avx2", "scalar"};
    const int allow[] = {1, 1, 0, 1};
    const char *seen[4] = {0};
    int n_seen = 0;
    for (int p = 0; p < 4; p++) {
        if (tb_cpu_kernel_force_path(paths[p]) != 0) {
            printf("test_igemm: path %s not available here\n", paths[p]);
            continue;
        }
        tb_cpu_igemm_allow_avxvnni(allow[p]);
        const char *k = tb_cpu_igemm_kernel();
        int dup = 0;
        for (int i = 0; i < n_seen; i++) dup |= !strcmp(seen[i], k);
        if (dup) continue;
        seen[n_seen++] = k;
        printf("test_igemm: path %s, kernel %s\n", paths[p], k);
        test_path(k, pool);
        test_quantize(paths[p]);
    }
    CHECK(n_seen >= 1 && !strcmp(seen[n_seen - 1], "scalar"));
    tb_cpu_kernel_force_path(NULL);
    tb_cpu_igemm_allow_avxvnni(1);
    test_iconv();
    tb_cpu_igemm_allow_avxvnni(1);
    tb_cpu_kernel_force_path(NULL);
    tb_pool_free(pool);
    return tb_test_finish("test_igemm");
}
