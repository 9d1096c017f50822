/*
 * test_calib.c — calibration (src/tune/calib.c): the entropy calibrator on
 * hand-made histograms against tests/reference.py's separate implementation
 * (run by /usr/bin/python3), the other calibrators on histograms whose
 * answer is known, the statistics collector (histogram re-binning, channel
 * statistics, row sampling), the cache's round trip and each refusal, and
 * the AWQ search on a layer with a few salient input channels, and AWQ's
 * clipping search against a direct computation of each candidate's error.
 */
#include <float.h>
#include <math.h>
#include <unistd.h>

#include "tb_test.h"
#include "core/quant.h"
#include "tune/calib.h"

#define NB TB_CALIB_BINS

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static double nrand(void) {
    double u = urand(), v = urand();
    return sqrt(-2 * log(u > 1e-300 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

/* Runs the numpy reference on one histogram: its best i and threshold. */
static int ref_entropy(const double *h, double amax, int *i, double *t) {
    char path[512], cmd[1536];
    snprintf(path, sizeof path, "%s/calib_hist_%d.txt", tb_test_tmp(), (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    fprintf(f, "%.17g\n", amax);
    for (int b = 0; b < NB; b++) fprintf(f, "%.17g\n", h[b]);
    fclose(f);
    const char *src = getenv("TURBINE_SRC");
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/reference.py calib-entropy %s", src && *src ? src : ".", path);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    int ok = fscanf(p, "%d %lf", i, t) == 2;
    ok = pclose(p) == 0 && ok;
    remove(path);
    return ok;
}

static void test_entropy(void) {
    static double h[NB];
    for (int c = 0; c < 8; c++) {
        memset(h, 0, sizeof h);
        double amax = 1.0 + c;
        switch (c) {
        case 0: /* half-normal |x| samples with a long tail, binned over [0, 6 sigma] */
            for (int s = 0; s < 200000; s++) {
                double a = fabs(nrand()) * 2048 / 6.0;
                h[a < NB ? (int)a : NB - 1] += 1;
            }
            break;
        case 1: /* uniform: no cut-off should beat the full range by much */
            for (int b = 0; b < NB; b++) h[b] = 100;
            break;
        case 2: /* a mass near 0 and a few far outliers */
            for (int b = 0; b < 300; b++) h[b] = 1000.0 * exp(-b / 40.0);
            h[1900] = 3; h[2047] = 1;
            break;
        case 3: /* sparse: zero bins inside the kept range (the zero rule of Q) */
            for (int b = 0; b < 700; b += 7) h[b] = 50 + (b % 13);
            h[1500] = 2;
            break;
        case 4: /* random integer counts, decaying */
            for (int b = 0; b < NB; b++) h[b] = floor(urand() * 1000 * exp(-b / 300.0));
            break;
        case 5: /* Laplace-like with a heavy bump at the end (clipping costs a lot) */
            for (int b = 0; b < NB; b++) h[b] = floor(5000 * exp(-b / 150.0));
            for (int b = 2000; b < NB; b++) h[b] += 400;
            break;
        case 6: /* random gaps and random outliers, zero where an outlier folds */
        case 7:
            for (int b = 0; b < NB; b++)
                h[b] = urand() < 0.3 ? 0 : floor(urand() * 300 * exp(-b / (100.0 + 200 * (c - 6))));
            for (int k = 0; k < 6; k++) h[(int)(urand() * (NB - 1))] += floor(1 + urand() * 5);
            h[NB - 1] = 0;
            break;
        }
        int ci = 0, ri = -1;
        double ct = tb_calib_entropy(h, NB, amax, 128, &ci), rt = -1;
        CHECK_MSG(ref_entropy(h, amax, &ri, &rt), "the numpy reference did not run (histogram %d)", c);
        CHECK_MSG(ci == ri, "histogram %d: C picks bin %d, the reference %d", c, ci, ri);
        CHECK_MSG(fabs(ct - rt) <= 1e-9 * amax, "histogram %d: threshold %.9g vs %.9g", c, ct, rt);
        CHECK(ci >= 128 && ci <= NB);
        if (c == 2) CHECK_MSG(ci < 1900, "outliers are clipped (cut-off %d)", ci);
        if (c == 5) CHECK_MSG(ci > 2000, "a heavy tail is kept (cut-off %d)", ci);
        printf("entropy histogram %d: cut-off %d threshold %.6g (reference %d)\n", c, ci, ct, ri);
    }
    /* degenerate inputs */
    memset(h, 0, sizeof h);
    CHECK(tb_calib_entropy(h, NB, 3.0, 128, NULL) == 3.0);
    h[0] = 10;
    CHECK(tb_calib_entropy(h, NB, 0.0, 128, NULL) == 0.0);
}

static void test_other_calibrators(void) {
    static double h[NB];
    memset(h, 0, sizeof h);
    /* 10000 values: 9990 in bin 99, 10 in bin 2047 */
    h[99] = 9990;
    h[2047] = 10;
    double amax = 2048.0; /* bin width 1 */
    CHECK(tb_calib_minmax(h, NB, amax) == amax);
    CHECK_MSG(fabs(tb_calib_percentile(h, NB, amax, 99.9) - 100.0) < 1e-9, "99.9%% of the mass is below 100");
    CHECK(fabs(tb_calib_percentile(h, NB, amax, 99.95) - 2048.0) < 1e-9);
    CHECK(fabs(tb_calib_percentile(h, NB, amax, 100) - 2048.0) < 1e-9);
    /* a few far outliers cost little next to the bulk's rounding error
     * (keeping them: step 16 for every value), so mse keeps them here ... */
    double t = tb_calib_mse(h, NB, amax, 127);
    CHECK_MSG(t == amax, "mse threshold %g", t);
    /* ... but clips one outlier among 1e6 values spread over [0, 100) */
    memset(h, 0, sizeof h);
    for (int b = 0; b < 100; b++) h[b] = 10000;
    h[2047] = 1;
    t = tb_calib_mse(h, NB, amax, 127);
    CHECK_MSG(t < 1000 && t >= 99, "mse threshold %g", t);
    /* a uniform histogram: clipping saves nothing, mse keeps (nearly) all */
    for (int b = 0; b < NB; b++) h[b] = 1;
    t = tb_calib_mse(h, NB, amax, 127);
    CHECK_MSG(t > 0.95 * amax, "uniform: mse threshold %g of %g", t, amax);
    tb_calibrator c;
    char name[64];
    CHECK(tb_calibrator_parse("percentile=99.9", &c) == TB_OK && c.method == TB_CALIB_PERCENTILE &&
          fabs(c.percentile - 99.9) < 1e-12);
    tb_calibrator_name(&c, name, sizeof name);
    CHECK(!strcmp(name, "percentile=99.9"));
    CHECK(tb_calibrator_parse("percentile", &c) == TB_OK && c.percentile == 99.99);
    CHECK(tb_calibrator_parse("mse", &c) == TB_OK && c.method == TB_CALIB_MSE);
    CHECK(tb_calibrator_parse("minmax", &c) == TB_OK && c.method == TB_CALIB_MINMAX);
    CHECK(tb_calibrator_parse("entropy", &c) == TB_OK && c.method == TB_CALIB_ENTROPY);
    CHECK(tb_calibrator_parse("percentile=0", &c) != TB_OK);
    CHECK(tb_calibrator_parse("percentile=101", &c) != TB_OK);
    CHECK(tb_calibrator_parse("kl", &c) != TB_OK);
}

/* A graph with two matmuls reading one input: the statistics key them by
 * weight name. */
static tb_graph *small_graph(int K, int N) {
    tb_graph *g = tb_graph_new();
    tb_graph_add_sym(g, "tokens", 1, 1, 64);
    int64_t xd[2] = {TB_SYM(0), K}, wd[2] = {N, K};
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 2, xd);
    float *w1 = calloc((size_t)N * (size_t)K, sizeof(float)), *w2 = calloc((size_t)N * (size_t)K, sizeof(float));
    int a = tb_graph_add_weight(g, "l.a.weight", TB_F32, 2, wd, w1, 1);
    int b = tb_graph_add_weight(g, "l.b.weight", TB_F32, 2, wd, w2, 1);
    int in1[2] = {x, a}, in2[2] = {x, b};
    tb_graph_add_node(g, TB_OP_MATMUL, in1, 2, "ya", NULL, NULL);
    tb_graph_add_node(g, TB_OP_MATMUL, in2, 2, "yb", NULL, NULL);
    return g;
}

static void test_stats(void) {
    const int K = 16, N = 8;
    tb_graph *g = small_graph(K, N);
    tb_calib_stats *s = NULL;
    CHECK(tb_calib_stats_create(g, 5, &s) == TB_OK);
    if (!s) { tb_graph_free(g); return; }
    CHECK(tb_calib_stats_count(s) == 2);
    int ia = tb_calib_stats_find(s, "l.a.weight");
    CHECK(ia >= 0 && tb_calib_stats_find(s, "l.b.weight") >= 0 && tb_calib_stats_find(s, "x") < 0);
    /* batch 1: |x| up to 1; batch 2 raises the max to 4 (re-binning) */
    float x1[3 * 16], x2[4 * 16];
    for (int i = 0; i < 3 * K; i++) x1[i] = (float)((i % K) + 1) / K * (i % 2 ? -1.0f : 1.0f);
    for (int i = 0; i < 4 * K; i++) x2[i] = (i % K) == 3 ? -4.0f : 0.5f;
    tb_calib_stats_add(s, ia, x1, 3);
    tb_calib_tensor *t = tb_calib_stats_at(s, ia);
    CHECK(t->amax == 1.0f);
    /* value (k+1)/16 sits in bin floor((k+1)/16 * 2048) = 128 (k+1), clamped */
    CHECK(t->hist[128] == 3 && t->hist[2047] == 3);
    tb_calib_stats_add(s, ia, x2, 4);
    CHECK(t->amax == 4.0f && t->n_rows == 7);
    double tot = 0;
    for (int b = 0; b < NB; b++) tot += t->hist[b];
    CHECK_MSG(tot == 7.0 * K, "histogram keeps every value through re-binning (%g)", tot);
    CHECK(t->hist[2047] == 4);            /* the four |x| = 4 */
    CHECK(t->hist[(int)(0.5 / 4 * NB)] >= 4 * (K - 1)); /* the 0.5s */
    CHECK(t->n_sample == 5);
    /* channel 3: |x| 4/16 three times, 4 four times */
    CHECK(fabsf(t->max_abs[3] - 4.0f) == 0);
    CHECK(fabs(t->sum_abs[3] - (3 * 0.25 + 16)) < 1e-9);
    /* non-finite inputs saturate the histogram instead of indexing outside it */
    tb_calib_stats *s2 = NULL;
    CHECK(tb_calib_stats_create(g, 0, &s2) == TB_OK);
    if (s2) {
        float xn[16];
        for (int k = 0; k < K; k++) xn[k] = k == 0 ? NAN : k == 1 ? -INFINITY : 0.25f;
        tb_calib_stats_add(s2, 0, xn, 1);
        tb_calib_tensor *tn = tb_calib_stats_at(s2, 0);
        double totn = 0;
        for (int b = 0; b < NB; b++) totn += tn->hist[b];
        CHECK(tn->amax == FLT_MAX && totn == K && tn->hist[NB - 1] == 2 && tn->n_sample == 0);
        tb_calib_stats_free(s2);
    }
    /* the table */
    tb_calibrator c = {TB_CALIB_MINMAX, 0};
    tb_calib_table *tab = NULL;
    CHECK(tb_calib_table_from_stats(s, &c, 0x1234, 7, &tab) == TB_OK);
    if (tab) {
        const tb_calib_entry *e = tb_calib_find(tab, "l.a.weight");
        CHECK(e && e->threshold == 4.0f && e->n_rows == 5);
        CHECK(e && fabsf(e->mean_abs[3] - (float)((3 * 0.25 + 16) / 7)) < 1e-6f);
        CHECK(e && fabsf(tb_calib_act_scale(e, TB_I8) - 4.0f / 127) < 1e-9f);
        CHECK(e && fabsf(tb_calib_act_scale(e, TB_FP8_E4M3) - 4.0f / 448) < 1e-9f);
        CHECK(tb_calib_find(tab, "nope") == NULL);
        /* the cache: round trip and refusals */
        char path[512];
        snprintf(path, sizeof path, "%s/test_calib_%d.cache", tb_test_tmp(), (int)getpid());
        CHECK(tb_calib_cache_write(path, tab) == TB_OK);
        tb_calib_table *back = NULL;
        CHECK(tb_calib_cache_read(path, "minmax", 0x1234, &back) == TB_OK);
        if (back) {
            CHECK(back->n == tab->n && back->tokens == 7);
            for (int i = 0; i < tab->n && i < back->n; i++) {
                const tb_calib_entry *b = tb_calib_find(back, tab->e[i].name);
                CHECK(b && fabsf(b->threshold - tab->e[i].threshold) <= 1e-6f * tab->e[i].threshold);
                CHECK(b && b->mean_abs && b->K == K);
                for (int k = 0; b && b->mean_abs && k < K; k++) CHECK(b->mean_abs[k] == tab->e[i].mean_abs[k]);
            }
            tb_calib_table_free(back);
        }
        back = NULL;
        CHECK(tb_calib_cache_read(path, "entropy", 0x1234, &back) == TB_ERR_INVALID_ARG && !back);
        CHECK_MSG(strstr(tb_last_error(), "calibrator minmax") != NULL, "%s", tb_last_error());
        CHECK(tb_calib_cache_read(path, "minmax", 0x9999, &back) == TB_ERR_INVALID_ARG && !back);
        CHECK_MSG(strstr(tb_last_error(), "another model") != NULL, "%s", tb_last_error());
        /* another format version */
        char *text = NULL;
        size_t n = 0;
        CHECK(tb_file_read_all(path, &text, &n, 1 << 20) == TB_OK);
        if (text) {
            char *v = strstr(text, "CACHE 1 ");
            if (v) v[6] = '7';
            FILE *f = fopen(path, "w");
            fputs(text, f);
            fclose(f);
            CHECK(tb_calib_cache_read(path, "minmax", 0x1234, &back) == TB_ERR_VERSION && !back);
            CHECK_MSG(strstr(tb_last_error(), "version 7") != NULL, "%s", tb_last_error());
            /* a malformed line */
            if (v) v[6] = '1';
            f = fopen(path, "w");
            fputs(text, f);
            fputs("broken line\n", f);
            fclose(f);
            CHECK(tb_calib_cache_read(path, "minmax", 0x1234, &back) == TB_ERR_FORMAT && !back);
            free(text);
        }
        remove(path);
        tb_calib_table_free(tab);
    }
    tb_calib_stats_free(s);
    tb_graph_free(g);
}

/* A layer whose inputs have a few salient channels (large mean |x|): AWQ
 * protects their weights and beats round to nearest. */
static void test_awq(void) {
    const int N = 96, K = 256, M = 128, G = 64;
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    float mean[256], s[256];
    for (int i = 0; i < N * K; i++) w[i] = (float)nrand();
    for (int k = 0; k < K; k++) mean[k] = 0;
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++) {
            float v = (float)nrand() * (k % 50 == 7 ? 25.0f : 1.0f);
            x[r * K + k] = v;
            mean[k] += fabsf(v) / M;
        }
    for (int asym = 0; asym <= 1; asym++) {
        tb_awq_report rep;
        CHECK(tb_awq_search(w, N, K, mean, x, M, G, asym, s, &rep) == TB_OK);
        printf("awq (asym %d): alpha %.2f, output error %.4g vs round to nearest %.4g\n", asym, rep.alpha,
               rep.err_best, rep.err_rtn);
        CHECK_MSG(rep.err_best < 0.9 * rep.err_rtn, "AWQ error %g, RTN %g", rep.err_best, rep.err_rtn);
        CHECK(rep.alpha > 0);
        float smax = 0, smin = INFINITY;
        for (int k = 0; k < K; k++) { smax = fmaxf(smax, s[k]); smin = fminf(smin, s[k]); }
        CHECK_MSG(fabsf(sqrtf(smax * smin) - 1) < 1e-4f, "normalised scales (max %g min %g)", smax, smin);
        CHECK(s[7] > s[8]); /* salient channels are scaled up */
        /* without sampled rows: the channel-weighted estimate also finds it */
        tb_awq_report r2;
        CHECK(tb_awq_search(w, N, K, mean, NULL, 0, G, asym, s, &r2) == TB_OK);
        CHECK_MSG(r2.err_best < r2.err_rtn && r2.alpha > 0, "no rows: %g vs %g", r2.err_best, r2.err_rtn);
    }
    CHECK(tb_awq_search(w, N, 100, mean, x, M, G, 0, s, NULL) == TB_ERR_INVALID_ARG);
    free(w);
    free(x);
}

/* The output error of one row and group, directly: sum over the sampled
 * rows of (x_g . d)^2 with d = w - Q(clamp(w, -b, b)), in double, the
 * inputs divided by in_scale. */
static double clip_err_direct(const float *w, const float *x, const float *in_scale, int M, int K, int g0, int group,
                              int asym, float b) {
    float cw[128], dq[128], sc[2];
    uint8_t codes[64];
    for (int i = 0; i < group; i++) cw[i] = w[g0 + i] > b ? b : w[g0 + i] < -b ? -b : w[g0 + i];
    if (tb_quantize_rows(TB_I4, cw, 1, group, group, asym, codes, sc, asym ? sc + 1 : NULL) != TB_OK) return NAN;
    tb_dequantize_rows(TB_I4, codes, sc, asym ? sc + 1 : NULL, 1, group, group, dq);
    double e = 0;
    for (int r = 0; r < M; r++) {
        double y = 0;
        for (int i = 0; i < group; i++)
            y += (double)(x[(size_t)r * K + g0 + i] / in_scale[g0 + i]) * ((double)w[g0 + i] - (double)dq[i]);
        e += y * y;
    }
    return e;
}

/* AWQ's clipping: heavy-tailed weights (a few large ones per group), where
 * a smaller range wins for most groups. Each chosen bound is one of the
 * candidates r max|w| (r = 1, 0.95, ..., 0.5) and its error, computed
 * directly, is the least of them (within float rounding of the search's
 * covariance form); the total never exceeds round to nearest's. */
static void test_awq_clip(void) {
    const int N = 24, K = 256, M = 64, G = 64, NG = K / G;
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    float mean[256], in_scale[256], bound[24 * 4];
    for (int i = 0; i < N * K; i++) w[i] = (float)(nrand() * (urand() < 0.02 ? 6.0 : 1.0));
    for (int k = 0; k < K; k++) mean[k] = 0, in_scale[k] = (float)(0.5 + urand());
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++) {
            x[r * K + k] = (float)nrand() * (k % 40 == 3 ? 4.0f : 1.0f);
            mean[k] += fabsf(x[r * K + k]) / M;
        }
    for (int asym = 0; asym <= 1; asym++)
        for (int with_rows = 1; with_rows >= 0; with_rows--) {
            tb_awq_clip_report rep;
            CHECK(tb_awq_clip(w, N, K, with_rows ? x : NULL, with_rows ? M : 0, mean, in_scale, G, asym, bound,
                              &rep) == TB_OK);
            printf("awq clip (asym %d, rows %d): mean range %.3f, error %.4g vs unclipped %.4g\n", asym, with_rows,
                   rep.mean_ratio, rep.err_best, rep.err_rtn);
            CHECK_MSG(rep.err_best <= rep.err_rtn, "clip error %g above unclipped %g", rep.err_best, rep.err_rtn);
            CHECK_MSG(rep.mean_ratio < 1.0 && rep.mean_ratio >= 0.5, "mean range %g", rep.mean_ratio);
            if (!with_rows) continue;
            CHECK_MSG(rep.err_best < 0.9 * rep.err_rtn, "heavy tails: clip error %g, unclipped %g", rep.err_best,
                      rep.err_rtn);
            int bad = 0;
            for (int n = 0; n < N; n++)
                for (int g = 0; g < NG; g++) {
                    const float *row = w + (size_t)n * K;
                    float amax = 0;
                    for (int i = 0; i < G; i++) amax = fmaxf(amax, fabsf(row[g * G + i]));
                    float b = bound[n * NG + g];
                    double e = clip_err_direct(row, x, in_scale, M, K, g * G, G, asym, b), best = INFINITY;
                    int cand = 0;
                    for (int r = 0; r < 11; r++) {
                        float rb = (1.0f - 0.05f * (float)r) * amax;
                        cand |= rb == b;
                        double er = clip_err_direct(row, x, in_scale, M, K, g * G, G, asym, rb);
                        best = er < best ? er : best;
                    }
                    if (!cand || e > best * (1 + 1e-4) + 1e-9) bad++;
                }
            CHECK_MSG(bad == 0, "%d of %d groups: bound not a candidate or not the least error", bad, N * NG);
        }
    CHECK(tb_awq_clip(w, N, 100, x, M, mean, NULL, G, 0, bound, NULL) == TB_ERR_INVALID_ARG);
    free(w);
    free(x);
}

int main(void) {
    test_entropy();
    test_other_calibrators();
    test_stats();
    test_awq();
    test_awq_clip();
    return tb_test_finish("test_calib");
}
