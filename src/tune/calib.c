/* calib.c — activation statistics, calibrators, the calibration cache and the
 * AWQ search (calib.h). Nothing here runs a model: plan/calib_run.c feeds the
 * statistics from an f32 engine through the runtime's node observer. */
#include "tune/calib.h"

#include <errno.h>
#include <float.h>
#include <math.h>

#include "backend/cpu/kernels.h"
/* The shared quantisers (core/quant.h) quantise for the search where this
 * tree has them; fake_quant_i4 below is the same arithmetic for a tree that
 * does not yet. */
#if defined(__has_include)
#if __has_include("core/quant.h")
#include "core/quant.h"
#define TB_CALIB_SHARED_QUANT 1
#endif
#endif

/* ================================================================ calibrators */

tb_status tb_calibrator_parse(const char *s, tb_calibrator *out) {
    tb_calibrator c = {TB_CALIB_ENTROPY, 99.99};
    if (!s || !*s || !strcmp(s, "entropy")) c.method = TB_CALIB_ENTROPY;
    else if (!strcmp(s, "minmax")) c.method = TB_CALIB_MINMAX;
    else if (!strcmp(s, "mse")) c.method = TB_CALIB_MSE;
    else if (!strncmp(s, "percentile", 10) && (s[10] == 0 || s[10] == '=')) {
        c.method = TB_CALIB_PERCENTILE;
        if (s[10] == '=') {
            char *end = NULL;
            errno = 0;
            c.percentile = strtod(s + 11, &end);
            if (errno || end == s + 11 || *end || !(c.percentile > 0 && c.percentile <= 100))
                return tb_errorf(TB_ERR_INVALID_ARG, "calibrator '%.64s': the percentile must be in (0, 100]", s);
        }
    } else {
        return tb_errorf(TB_ERR_INVALID_ARG, "unknown calibrator '%.64s' (entropy, minmax, percentile[=P], mse)", s);
    }
    *out = c;
    return TB_OK;
}

void tb_calibrator_name(const tb_calibrator *c, char *buf, size_t cap) {
    switch (c->method) {
    case TB_CALIB_MINMAX: snprintf(buf, cap, "minmax"); break;
    case TB_CALIB_PERCENTILE: snprintf(buf, cap, "percentile=%g", c->percentile); break;
    case TB_CALIB_MSE: snprintf(buf, cap, "mse"); break;
    default: snprintf(buf, cap, "entropy"); break;
    }
}

static double hist_total(const double *h, int n) {
    double t = 0;
    for (int i = 0; i < n; i++) t += h[i];
    return t;
}

double tb_calib_minmax(const double *hist, int n_bins, double amax) {
    (void)hist; (void)n_bins;
    return amax;
}

double tb_calib_percentile(const double *hist, int n_bins, double amax, double pct) {
    double total = hist_total(hist, n_bins), want = total * pct / 100.0, run = 0;
    if (total <= 0 || amax <= 0) return amax;
    double w = amax / n_bins;
    for (int i = 0; i < n_bins; i++) {
        run += hist[i];
        if (run >= want) return (i + 1) * w; /* the upper edge of the bin that reaches it */
    }
    return amax;
}

double tb_calib_mse(const double *hist, int n_bins, double amax, int levels) {
    if (amax <= 0 || hist_total(hist, n_bins) <= 0) return amax;
    double w = amax / n_bins, best = INFINITY, best_t = amax;
    /* candidates: every bin's upper edge; each bin's mass sits at its centre */
    for (int i = 1; i <= n_bins; i++) {
        double t = i * w, step = t / levels, err = 0;
        for (int b = 0; b < n_bins; b++) {
            if (hist[b] == 0) continue;
            double c = (b + 0.5) * w, q = c >= t ? t : rint(c / step) * step, d = c - q;
            err += hist[b] * d * d;
        }
        if (err < best) { best = err; best_t = t; }
    }
    return best_t;
}

double tb_calib_entropy(const double *hist, int n_bins, double amax, int levels, int *best_i) {
    if (best_i) *best_i = n_bins;
    double total = hist_total(hist, n_bins);
    if (amax <= 0 || n_bins < levels || levels < 1 || total <= 0) return amax;
    /* Prefix sums (k bins): counts, non-zero bins and sum of h log h. With
     * them each candidate costs O(levels), not O(n_bins), since within a
     * group Q is constant:
     *   KL(i) = (1/S) [sum_b P_b log P_b - sum_j Pmass_j log(mass_j / nz_j)] + log(SQ / S)
     * S = sum P = the total; SQ = sum Q = the mass of bins [0, i) (a bin
     * with mass is non-zero in P); mass_j / nz_j the value Q takes in group j
     * (its mass before the fold over the bins where P is non-zero); Pmass_j
     * the group's P mass (the last group's includes the outliers). */
    double *ch = malloc(sizeof(double) * (size_t)(n_bins + 1) * 2);
    int *nz = malloc(sizeof(int) * (size_t)(n_bins + 1));
    if (!ch || !nz) { free(ch); free(nz); return amax; } /* a few KiB; the build fails elsewhere first */
    double *hl = ch + n_bins + 1;
    ch[0] = hl[0] = 0;
    nz[0] = 0;
    for (int b = 0; b < n_bins; b++) {
        ch[b + 1] = ch[b] + hist[b];
        hl[b + 1] = hl[b] + (hist[b] > 0 ? hist[b] * log(hist[b]) : 0);
        nz[b + 1] = nz[b] + (hist[b] != 0);
    }
    double best = INFINITY;
    int arg = n_bins;
    for (int i = levels; i <= n_bins; i++) {
        double out = total - ch[i];        /* folded into bin i - 1 */
        double last = hist[i - 1] + out;   /* P's last bin */
        double plogp = hl[i - 1] + (last > 0 ? last * log(last) : 0);
        int merged = i / levels;
        double cross = 0;                  /* sum_j Pmass_j log q_j */
        for (int j = 0; j < levels && cross < INFINITY; j++) {
            int start = j * merged, stop = j == levels - 1 ? i : start + merged;
            double mass = ch[stop] - ch[start], pmass = mass;
            int n_nz = nz[stop] - nz[start];
            if (j == levels - 1 && out > 0) {
                pmass += out;
                if (hist[i - 1] == 0) n_nz++; /* the fold made bin i - 1 non-zero */
            }
            if (pmass <= 0) continue;      /* P is zero over the whole group */
            if (mass <= 0) cross = INFINITY; /* P has mass where Q has none */
            else cross += pmass * log(mass / n_nz);
        }
        double sq = ch[i];
        double kl = cross < INFINITY && sq > 0 ? (plogp - cross) / total + log(sq / total) : INFINITY;
        if (kl < best) { best = kl; arg = i; }
    }
    free(ch);
    free(nz);
    if (best_i) *best_i = arg;
    return (arg + 0.5) * (amax / n_bins);
}

double tb_calib_threshold(const tb_calibrator *c, const double *hist, int n_bins, double amax) {
    switch (c->method) {
    case TB_CALIB_MINMAX: return tb_calib_minmax(hist, n_bins, amax);
    case TB_CALIB_PERCENTILE: return tb_calib_percentile(hist, n_bins, amax, c->percentile);
    case TB_CALIB_MSE: return tb_calib_mse(hist, n_bins, amax, 127);
    default: return tb_calib_entropy(hist, n_bins, amax, 128, NULL);
    }
}

/* ================================================================ statistics */

struct tb_calib_stats {
    int n;
    tb_calib_tensor *t;  /* (n) */
    int n_nodes;
    int *node_tensor;    /* (n_nodes) tensor of each matmul node, -1 otherwise */
    uint64_t rng;        /* reservoir sampling (xorshift64*) */
    double seconds;      /* spent in tb_calib_observe */
};

tb_status tb_calib_stats_create(const tb_graph *g, int sample_rows, tb_calib_stats **out) {
    *out = NULL;
    if (sample_rows < 0) return tb_errorf(TB_ERR_INVALID_ARG, "calibration: negative sample rows");
    tb_calib_stats *s = calloc(1, sizeof *s);
    if (!s) return tb_errorf(TB_ERR_OOM, "out of memory");
    s->rng = 0x9e3779b97f4a7c15ull;
    s->n_nodes = g->n_nodes;
    s->node_tensor = malloc(sizeof(int) * (size_t)(g->n_nodes ? g->n_nodes : 1));
    s->t = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *s->t);
    if (!s->node_tensor || !s->t) { tb_calib_stats_free(s); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *nd = &g->nodes[k];
        s->node_tensor[k] = -1;
        if (nd->op != TB_OP_MATMUL || nd->n_in < 2) continue;
        const tb_value *w = &g->values[nd->in[1]];
        if (w->kind != TB_VAL_WEIGHT || w->rank != 2) continue;
        int idx = tb_calib_stats_find(s, w->name);
        if (idx < 0) {
            idx = s->n++;
            tb_calib_tensor *t = &s->t[idx];
            snprintf(t->name, sizeof t->name, "%s", w->name);
            t->K = (int)w->dims[1];
            t->sample_cap = sample_rows;
            t->hist = calloc(TB_CALIB_BINS, sizeof(double));
            t->sum_abs = calloc((size_t)t->K, sizeof(double));
            t->max_abs = calloc((size_t)t->K, sizeof(float));
            t->rows = sample_rows ? malloc(sizeof(float) * (size_t)sample_rows * (size_t)t->K) : NULL;
            if (!t->hist || !t->sum_abs || !t->max_abs || (sample_rows && !t->rows)) {
                tb_calib_stats_free(s);
                return tb_errorf(TB_ERR_OOM, "out of memory for calibration statistics");
            }
        }
        s->node_tensor[k] = idx;
    }
    *out = s;
    return TB_OK;
}

void tb_calib_stats_free(tb_calib_stats *s) {
    if (!s) return;
    for (int i = 0; s->t && i < s->n; i++) {
        free(s->t[i].hist);
        free(s->t[i].sum_abs);
        free(s->t[i].max_abs);
        free(s->t[i].rows);
    }
    free(s->t);
    free(s->node_tensor);
    free(s);
}

int tb_calib_stats_count(const tb_calib_stats *s) { return s->n; }
tb_calib_tensor *tb_calib_stats_at(tb_calib_stats *s, int i) { return i >= 0 && i < s->n ? &s->t[i] : NULL; }

int tb_calib_stats_find(const tb_calib_stats *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name)) return i;
    return -1;
}

/* Moves the histogram onto [0, new_max]: each old bin's count goes to the
 * new bin holding its centre (the new bins are wider, so an old bin falls
 * into at most two; the centre picks one, as TensorRT's re-binning does). */
static void hist_rebin(double *h, float old_max, float new_max) {
    double tmp[TB_CALIB_BINS];
    memcpy(tmp, h, sizeof tmp);
    memset(h, 0, sizeof tmp);
    double ow = (double)old_max / TB_CALIB_BINS, nw = (double)new_max / TB_CALIB_BINS;
    for (int i = 0; i < TB_CALIB_BINS; i++) {
        if (tmp[i] == 0) continue;
        int b = (int)(((i + 0.5) * ow) / nw);
        h[b < TB_CALIB_BINS ? b : TB_CALIB_BINS - 1] += tmp[i];
    }
}

void tb_calib_hist_add(double *hist, float *amax, const float *x, size_t n) {
    float bmax = 0;
    for (size_t j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (!(a <= FLT_MAX)) a = FLT_MAX;
        bmax = a > bmax ? a : bmax;
    }
    if (bmax > *amax) {
        if (*amax > 0) hist_rebin(hist, *amax, bmax);
        *amax = bmax;
    }
    double inv_w = *amax > 0 ? TB_CALIB_BINS / (double)*amax : 0;
    for (size_t j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (!(a <= FLT_MAX)) a = FLT_MAX;
        int b = a < *amax ? (int)(a * inv_w) : TB_CALIB_BINS - 1;
        hist[b < TB_CALIB_BINS ? b : TB_CALIB_BINS - 1] += 1;
    }
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545f4914f6cdd1dull;
}

void tb_calib_stats_add(tb_calib_stats *s, int i, const float *x, int rows) {
    if (i < 0 || i >= s->n || rows <= 0) return;
    tb_calib_tensor *t = &s->t[i];
    int K = t->K;
    size_t n = (size_t)rows * (size_t)K;
    float bmax = 0;
    for (size_t j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (!(a <= FLT_MAX)) a = FLT_MAX; /* inf / NaN inputs: the histogram saturates */
        bmax = a > bmax ? a : bmax;
    }
    if (bmax > t->amax) {
        if (t->amax > 0) hist_rebin(t->hist, t->amax, bmax);
        t->amax = bmax;
    }
    double inv_w = t->amax > 0 ? TB_CALIB_BINS / (double)t->amax : 0;
    double *h = t->hist;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)K;
        for (int k = 0; k < K; k++) {
            float a = fabsf(xr[k]);
            if (!(a <= FLT_MAX)) a = FLT_MAX; /* inf and NaN count as the largest value */
            int b = a < t->amax ? (int)(a * inv_w) : TB_CALIB_BINS - 1;
            h[b < TB_CALIB_BINS ? b : TB_CALIB_BINS - 1] += 1;
            t->sum_abs[k] += a;
            if (a > t->max_abs[k]) t->max_abs[k] = a;
        }
        /* reservoir sampling: every row seen has the same chance to be kept */
        if (t->sample_cap > 0) {
            uint64_t seen = t->n_rows + (uint64_t)r;
            int slot = -1;
            if (t->n_sample < t->sample_cap) slot = t->n_sample++;
            else {
                uint64_t j = rng_next(&s->rng) % (seen + 1);
                if (j < (uint64_t)t->sample_cap) slot = (int)j;
            }
            if (slot >= 0) memcpy(t->rows + (size_t)slot * (size_t)K, xr, sizeof(float) * (size_t)K);
        }
    }
    t->n_rows += (uint64_t)rows;
}

void tb_calib_observe(void *user, const tb_graph *g, int node, void *const *bufs, const tb_step *st) {
    tb_calib_stats *s = user;
    if (node < 0 || node >= s->n_nodes || s->node_tensor[node] < 0) return;
    const tb_node *n = &g->nodes[node];
    int rows = (int)tb_step_rows(g, n->in[0], st);
    double t0 = tb_now();
    tb_calib_stats_add(s, s->node_tensor[node], bufs[n->in[0]], rows);
    s->seconds += tb_now() - t0;
}

double tb_calib_stats_seconds(const tb_calib_stats *s) { return s->seconds; }

/* ================================================================ the table */

void tb_calib_table_free(tb_calib_table *t) {
    if (!t) return;
    for (int i = 0; t->e && i < t->n; i++) {
        free(t->e[i].mean_abs);
        free(t->e[i].max_abs);
        free(t->e[i].rows);
    }
    free(t->e);
    free(t);
}

tb_status tb_calib_table_from_stats(tb_calib_stats *s, const tb_calibrator *c, uint64_t fingerprint, long tokens,
                                    tb_calib_table **out) {
    *out = NULL;
    tb_calib_table *t = calloc(1, sizeof *t);
    if (!t || !(t->e = calloc((size_t)(s->n ? s->n : 1), sizeof *t->e))) {
        free(t);
        return tb_errorf(TB_ERR_OOM, "out of memory");
    }
    tb_calibrator_name(c, t->calibrator, sizeof t->calibrator);
    t->fingerprint = fingerprint;
    t->tokens = tokens;
    t->n = s->n;
    for (int i = 0; i < s->n; i++) {
        const tb_calib_tensor *st = &s->t[i];
        tb_calib_entry *e = &t->e[i];
        snprintf(e->name, sizeof e->name, "%s", st->name);
        e->K = st->K;
        e->amax = st->amax;
        e->threshold = (float)tb_calib_threshold(c, st->hist, TB_CALIB_BINS, st->amax);
        e->mean_abs = malloc(sizeof(float) * (size_t)st->K);
        e->max_abs = malloc(sizeof(float) * (size_t)st->K);
        e->n_rows = st->n_sample;
        e->rows = st->n_sample ? malloc(sizeof(float) * (size_t)st->n_sample * (size_t)st->K) : NULL;
        if (!e->mean_abs || !e->max_abs || (st->n_sample && !e->rows)) {
            tb_calib_table_free(t);
            return tb_errorf(TB_ERR_OOM, "out of memory");
        }
        for (int k = 0; k < st->K; k++) {
            e->mean_abs[k] = st->n_rows ? (float)(st->sum_abs[k] / (double)st->n_rows) : 0.0f;
            e->max_abs[k] = st->max_abs[k];
        }
        if (e->rows) memcpy(e->rows, st->rows, sizeof(float) * (size_t)st->n_sample * (size_t)st->K);
    }
    *out = t;
    return TB_OK;
}

const tb_calib_entry *tb_calib_find(const tb_calib_table *t, const char *weight_name) {
    if (!t) return NULL;
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].name, weight_name)) return &t->e[i];
    return NULL;
}

float tb_calib_act_scale(const tb_calib_entry *e, tb_dtype dt) {
    if (!e) return 0;
    if (dt == TB_I8) return e->threshold / TB_CALIB_INT8_MAX;
    if (dt == TB_FP8_E4M3) return e->threshold / TB_CALIB_FP8_MAX;
    return 0;
}

/* ================================================================ the cache
 *
 *   TURBINE-CALIB-CACHE 1 calibrator=entropy fingerprint=0123456789abcdef tokens=4096
 *   model.layers.0.self_attn.qkv.weight: 0.0123456789
 *   model.layers.0.self_attn.qkv.weight mean_abs: 0.1 0.25 ...      (optional, K values)
 *
 * The value of a `name:` line is the int8 activation scale T / 127 (as
 * TensorRT's cache keeps int8 scales); fp8 scales are derived from it.
 */
#define CACHE_MAGIC "TURBINE-CALIB-CACHE"
#define CACHE_MAX_BYTES ((size_t)1 << 30)

tb_status tb_calib_cache_write(const char *path, const tb_calib_table *t) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return tb_errorf(TB_ERR_IO, "cannot write the calibration cache %s: %s", tmp, strerror(errno));
    fprintf(f, "%s %d calibrator=%s fingerprint=%016llx tokens=%ld\n", CACHE_MAGIC, TB_CALIB_CACHE_VERSION,
            t->calibrator, (unsigned long long)t->fingerprint, t->tokens);
    for (int i = 0; i < t->n; i++) fprintf(f, "%s: %.9g\n", t->e[i].name, (double)(t->e[i].threshold / 127.0f));
    for (int i = 0; i < t->n; i++) {
        if (!t->e[i].mean_abs) continue;
        fprintf(f, "%s mean_abs:", t->e[i].name);
        for (int k = 0; k < t->e[i].K; k++) fprintf(f, " %.9g", (double)t->e[i].mean_abs[k]);
        fputc('\n', f);
    }
    int ok = !ferror(f);
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return tb_errorf(TB_ERR_IO, "cannot write the calibration cache %s: %s", path, strerror(errno));
    }
    return TB_OK;
}

/* Adds an entry (K 0 until a mean_abs line says). */
static tb_calib_entry *table_add(tb_calib_table *t, int *cap, const char *name, size_t len) {
    if (len == 0 || len >= TB_NAME_LEN) return NULL;
    if (t->n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        tb_calib_entry *e = realloc(t->e, sizeof *e * (size_t)nc);
        if (!e) return NULL;
        t->e = e;
        *cap = nc;
    }
    tb_calib_entry *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    memcpy(e->name, name, len);
    return e;
}

tb_status tb_calib_cache_read(const char *path, const char *calibrator, uint64_t fingerprint,
                              tb_calib_table **out) {
    *out = NULL;
    char *text = NULL;
    size_t size = 0;
    TB_TRY(tb_file_read_all(path, &text, &size, CACHE_MAX_BYTES));
    tb_status s = TB_OK;
    tb_calib_table *t = calloc(1, sizeof *t);
    int cap = 0, line_no = 1;
    if (!t) { free(text); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    char *p = text, *nl = strchr(p, '\n');
    if (nl) *nl = 0;
    int ver = 0, used = 0;
    char cal[48] = "", fp[32] = "";
    long tokens = 0;
    if (sscanf(p, CACHE_MAGIC " %d calibrator=%47s fingerprint=%31s tokens=%ld%n", &ver, cal, fp, &tokens, &used) < 4 ||
        p[used] != 0) {
        s = tb_errorf(TB_ERR_FORMAT, "%s is not a turbine calibration cache (the first line must be '%s VERSION "
                      "calibrator=NAME fingerprint=HEX tokens=N')", path, CACHE_MAGIC);
        goto done;
    }
    if (ver != TB_CALIB_CACHE_VERSION) {
        s = tb_errorf(TB_ERR_VERSION, "calibration cache %s has format version %d; this turbine reads version %d "
                      "(calibrate again)", path, ver, TB_CALIB_CACHE_VERSION);
        goto done;
    }
    if (calibrator && strcmp(cal, calibrator)) {
        s = tb_errorf(TB_ERR_INVALID_ARG, "calibration cache %s was made by calibrator %s, this build asks for %s "
                      "(use another --calib-cache file, or --calibrator %s)", path, cal, calibrator, cal);
        goto done;
    }
    char want_fp[32];
    snprintf(want_fp, sizeof want_fp, "%016llx", (unsigned long long)fingerprint);
    if (strcmp(fp, want_fp)) {
        s = tb_errorf(TB_ERR_INVALID_ARG, "calibration cache %s is for another model (fingerprint %s, this model's "
                      "is %s)", path, fp, want_fp);
        goto done;
    }
    snprintf(t->calibrator, sizeof t->calibrator, "%s", cal);
    t->fingerprint = fingerprint;
    t->tokens = tokens;
    while (nl) {
        p = nl + 1;
        line_no++;
        nl = strchr(p, '\n');
        if (nl) *nl = 0;
        if (!*p) continue;
        char *colon = strchr(p, ':');
        if (!colon) { s = tb_errorf(TB_ERR_FORMAT, "%s:%d: expected 'name: value'", path, line_no); goto done; }
        size_t klen = (size_t)(colon - p);
        const char *suffix = " mean_abs";
        size_t sl = strlen(suffix);
        if (klen > sl && !memcmp(colon - sl, suffix, sl)) { /* channel statistics of an entry read before */
            tb_calib_entry *e = NULL;
            for (int i = 0; i < t->n; i++)
                if (strlen(t->e[i].name) == klen - sl && !memcmp(t->e[i].name, p, klen - sl)) e = &t->e[i];
            if (!e || e->mean_abs) {
                s = tb_errorf(TB_ERR_FORMAT, "%s:%d: channel statistics of an unknown or repeated tensor", path,
                              line_no);
                goto done;
            }
            int n = 0, vcap = 1024;
            float *v = malloc(sizeof(float) * (size_t)vcap);
            char *q = colon + 1, *end;
            while (v) {
                errno = 0;
                double d = strtod(q, &end);
                if (end == q) break;
                if (n == vcap) {
                    if (vcap >= (1 << 24)) break;
                    float *nv = realloc(v, sizeof(float) * (size_t)(vcap *= 2));
                    if (!nv) { free(v); v = NULL; break; }
                    v = nv;
                }
                v[n++] = (float)d;
                q = end;
            }
            while (*q == ' ' || *q == '\r') q++;
            if (!v || *q || n == 0) {
                free(v);
                s = v ? tb_errorf(TB_ERR_FORMAT, "%s:%d: bad channel statistics", path, line_no)
                      : tb_errorf(TB_ERR_OOM, "out of memory");
                goto done;
            }
            e->mean_abs = v;
            e->K = n;
            continue;
        }
        char *end;
        errno = 0;
        double v = strtod(colon + 1, &end);
        while (*end == ' ' || *end == '\r') end++;
        if (end == colon + 1 || *end || errno || !(v >= 0) || !isfinite(v)) {
            s = tb_errorf(TB_ERR_FORMAT, "%s:%d: the scale is not a finite number >= 0", path, line_no);
            goto done;
        }
        for (int i = 0; i < t->n; i++)
            if (strlen(t->e[i].name) == klen && !memcmp(t->e[i].name, p, klen)) {
                s = tb_errorf(TB_ERR_FORMAT, "%s:%d: tensor %.*s appears twice", path, line_no, (int)klen, p);
                goto done;
            }
        tb_calib_entry *e = table_add(t, &cap, p, klen);
        if (!e) {
            s = tb_errorf(TB_ERR_FORMAT, "%s:%d: a tensor name of 1 to %d characters expected (or out of memory)",
                          path, line_no, TB_NAME_LEN - 1);
            goto done;
        }
        e->threshold = (float)(v * 127.0);
    }
    if (t->n == 0) s = tb_errorf(TB_ERR_FORMAT, "calibration cache %s has no tensors", path);
done:
    free(text);
    if (s != TB_OK) { tb_calib_table_free(t); return s; }
    *out = t;
    return TB_OK;
}

/* ================================================================ AWQ */

/* Round-to-nearest int4 fake quantisation of rows (N, K) in place, groups of
 * `group` along K, with core/quant.h's encoding: symmetric s = max|w| / 7,
 * codes in [-7, 7]; asymmetric s = (M - m) / 15, c = round((w - m) / s) - 8,
 * zero = m + 8 s, c = round((w - zero) / s) in [-8, 7]; rintf (ties to even);
 * an all-zero (symmetric) or constant (asymmetric) group gets scale 1. The
 * same float arithmetic as core/quant.c's tb_quantize_rows followed by
 * tb_dequantize_rows, kept here so the search needs no code buffers (it
 * quantises each weight 21 times). */
#ifndef TB_CALIB_SHARED_QUANT
static void fake_quant_i4(float *w, size_t N, int K, int group, int asym) {
    for (size_t n = 0; n < N; n++) {
        float *row = w + n * (size_t)K;
        for (int g0 = 0; g0 < K; g0 += group) {
            float *x = row + g0;
            if (asym) {
                float lo = x[0], hi = x[0];
                for (int k = 1; k < group; k++) { lo = x[k] < lo ? x[k] : lo; hi = x[k] > hi ? x[k] : hi; }
                float s = hi > lo ? (hi - lo) / 15.0f : 1.0f;
                float zero = lo + 8.0f * s;
                for (int k = 0; k < group; k++) {
                    float c = rintf((x[k] - zero) / s);
                    x[k] = (c < -8 ? -8 : c > 7 ? 7 : c) * s + zero;
                }
            } else {
                float amax = 0;
                for (int k = 0; k < group; k++) amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
                float s = amax > 0 ? amax / 7.0f : 1.0f;
                for (int k = 0; k < group; k++) {
                    float c = rintf(x[k] / s);
                    x[k] = (c < -7 ? -7 : c > 7 ? 7 : c) * s;
                }
            }
        }
    }
}
#endif

tb_status tb_awq_search(const float *w, int N, int K, const float *mean_abs, const float *x, int m, int group,
                        int asym, float *s, tb_awq_report *rep) {
    if (N <= 0 || K <= 0 || group <= 0 || K % group)
        return tb_errorf(TB_ERR_INVALID_ARG, "AWQ: %d inputs are not whole groups of %d", K, group);
    if (!x) m = 0;
    size_t NK = (size_t)N * (size_t)K;
    float *q = malloc(sizeof(float) * NK), *cand = malloc(sizeof(float) * (size_t)K);
    float *y = m ? malloc(sizeof(float) * (size_t)m * (size_t)N * 2) : NULL;
    tb_pool *pool = NULL;
    if (!q || !cand || (m && !y) || (m && tb_pool_create(tb_default_threads(), &pool) != TB_OK)) {
        free(q); free(cand); free(y);
        return tb_errorf(TB_ERR_OOM, "AWQ: out of memory for a (%d, %d) weight", N, K);
    }
#ifdef TB_CALIB_SHARED_QUANT
    uint8_t *codes = malloc((size_t)tb_quant_codes_bytes(TB_I4, N, K));
    float *qs = malloc(sizeof(float) * (NK / (size_t)group) * 2), *qz = qs ? qs + NK / (size_t)group : NULL;
    if (!codes || !qs) {
        free(codes); free(qs); free(q); free(cand); free(y);
        tb_pool_free(pool);
        return tb_errorf(TB_ERR_OOM, "AWQ: out of memory for a (%d, %d) weight", N, K);
    }
#endif
    float *yq = y ? y + (size_t)m * (size_t)N : NULL;
    if (m) tb_cpu_matmul(pool, x, w, TB_F32, NULL, y, m, K, N); /* y (m, N) = X W^T, the target */
    double best = INFINITY, err_rtn = 0;
    float best_alpha = 0;
    for (int ai = 0; ai <= 20; ai++) {
        float alpha = (float)ai * 0.05f;
        /* s_k = mean|x_k|^alpha, clamped away from 0 and centred so that
         * sqrt(max s * min s) = 1 (AWQ's normalisation) */
        float smax = 0, smin = INFINITY;
        for (int k = 0; k < K; k++) {
            float v = powf(mean_abs[k] > 0 ? mean_abs[k] : 0.0f, alpha);
            if (!(v >= 1e-4f)) v = 1e-4f;
            cand[k] = v;
            smax = v > smax ? v : smax;
            smin = v < smin ? v : smin;
        }
        float norm = sqrtf(smax * smin);
        for (int k = 0; k < K; k++) cand[k] /= norm;
        /* Q(W diag(s)) diag(1/s) */
        for (size_t n = 0; n < (size_t)N; n++)
            for (int k = 0; k < K; k++) q[n * (size_t)K + (size_t)k] = w[n * (size_t)K + (size_t)k] * cand[k];
#ifdef TB_CALIB_SHARED_QUANT
        tb_status qst = tb_quantize_rows(TB_I4, q, N, K, group, asym, codes, qs, asym ? qz : NULL);
        if (qst != TB_OK) {
            free(codes); free(qs); free(q); free(cand); free(y);
            tb_pool_free(pool);
            return tb_error_prefix(qst, "AWQ");
        }
        tb_dequantize_rows(TB_I4, codes, qs, asym ? qz : NULL, N, K, group, q);
#else
        fake_quant_i4(q, (size_t)N, K, group, asym);
#endif
        for (size_t n = 0; n < (size_t)N; n++)
            for (int k = 0; k < K; k++) q[n * (size_t)K + (size_t)k] /= cand[k];
        double err = 0;
        if (m) {
            tb_cpu_matmul(pool, x, q, TB_F32, NULL, yq, m, K, N);
            for (size_t j = 0; j < (size_t)m * (size_t)N; j++) {
                double d = (double)y[j] - (double)yq[j];
                err += d * d;
            }
        } else {
            for (size_t n = 0; n < (size_t)N; n++)
                for (int k = 0; k < K; k++) {
                    double d = (double)w[n * (size_t)K + (size_t)k] - (double)q[n * (size_t)K + (size_t)k];
                    err += (double)mean_abs[k] * (double)mean_abs[k] * d * d;
                }
        }
        if (ai == 0) err_rtn = err;
        if (err < best) {
            best = err;
            best_alpha = alpha;
            memcpy(s, cand, sizeof(float) * (size_t)K);
        }
    }
    if (rep) {
        rep->alpha = best_alpha;
        rep->err_rtn = err_rtn;
        rep->err_best = best;
    }
#ifdef TB_CALIB_SHARED_QUANT
    free(codes);
    free(qs);
#endif
    tb_pool_free(pool);
    free(q);
    free(cand);
    free(y);
    return TB_OK;
}

/* ---------------------------------------------------------------- AWQ clip */

#define TB_AWQ_CLIP_STEPS 11 /* r = 1.0, 0.95, ..., 0.5 (AWQ: max_shrink 0.5, steps of 1/20) */

tb_status tb_awq_clip(const float *w, int N, int K, const float *x, int m, const float *mean_abs,
                      const float *in_scale, int group, int asym, float *bound, tb_awq_clip_report *rep) {
    if (N <= 0 || K <= 0 || group <= 0 || K % group)
        return tb_errorf(TB_ERR_INVALID_ARG, "AWQ clip: %d inputs are not whole groups of %d", K, group);
    if (!x) m = 0;
    if (!m && !mean_abs) return tb_errorf(TB_ERR_INVALID_ARG, "AWQ clip: neither sampled rows nor channel means");
    int G = K / group;
    size_t Ng = (size_t)N * (size_t)group;
    float *xt = m ? malloc(sizeof(float) * (size_t)group * (size_t)m) : NULL;
    float *C = malloc(sizeof(float) * (size_t)group * (size_t)group);
    float *wg = malloc(sizeof(float) * Ng), *d = malloc(sizeof(float) * Ng), *t = malloc(sizeof(float) * Ng);
    float *amax = malloc(sizeof(float) * (size_t)N), *qs = malloc(sizeof(float) * 2 * (size_t)N);
    double *best = malloc(sizeof(double) * (size_t)N);
    uint8_t *codes = malloc((size_t)tb_quant_codes_bytes(TB_I4, N, group));
    tb_pool *pool = NULL;
    tb_status st = TB_OK;
    if ((m && !xt) || !C || !wg || !d || !t || !amax || !qs || !best || !codes ||
        tb_pool_create(tb_default_threads(), &pool) != TB_OK) {
        st = tb_errorf(TB_ERR_OOM, "AWQ clip: out of memory for a (%d, %d) weight", N, K);
        goto done;
    }
    double err_rtn = 0, err_best = 0, ratio_sum = 0;
    for (int g = 0; g < G && st == TB_OK; g++) {
        int k0 = g * group;
        /* C_g (group, group) = X_g^T X_g of the inputs the quantised weight
         * sees (x / in_scale) */
        if (m) {
            for (int i = 0; i < group; i++) {
                float inv = in_scale ? 1.0f / in_scale[k0 + i] : 1.0f;
                for (int j = 0; j < m; j++) xt[(size_t)i * (size_t)m + (size_t)j] = x[(size_t)j * (size_t)K + (size_t)(k0 + i)] * inv;
            }
            tb_cpu_matmul(pool, xt, xt, TB_F32, NULL, C, group, m, group);
        } else {
            memset(C, 0, sizeof(float) * (size_t)group * (size_t)group);
            for (int i = 0; i < group; i++) {
                float a = mean_abs[k0 + i] / (in_scale ? in_scale[k0 + i] : 1.0f);
                C[(size_t)i * (size_t)group + (size_t)i] = a * a;
            }
        }
        for (int n = 0; n < N; n++) {
            float a = 0;
            for (int i = 0; i < group; i++) {
                float v = w[(size_t)n * (size_t)K + (size_t)(k0 + i)];
                wg[(size_t)n * (size_t)group + (size_t)i] = v;
                a = fabsf(v) > a ? fabsf(v) : a;
            }
            amax[n] = a;
        }
        for (int r = 0; r < TB_AWQ_CLIP_STEPS; r++) {
            float ratio = 1.0f - 0.05f * (float)r;
            /* d = w - Q(clamp(w, -b, b)) row by row; the same float
             * arithmetic as the quantize pass's clamp then tb_quantize_rows */
            for (int n = 0; n < N; n++) {
                float b = ratio * amax[n];
                for (int i = 0; i < group; i++) {
                    float v = wg[(size_t)n * (size_t)group + (size_t)i];
                    d[(size_t)n * (size_t)group + (size_t)i] = v > b ? b : v < -b ? -b : v;
                }
            }
            st = tb_quantize_rows(TB_I4, d, N, group, group, asym, codes, qs, asym ? qs + N : NULL);
            if (st != TB_OK) { tb_error_prefix(st, "AWQ clip"); break; }
            tb_dequantize_rows(TB_I4, codes, qs, asym ? qs + N : NULL, N, group, group, d);
            for (size_t i = 0; i < Ng; i++) d[i] = wg[i] - d[i];
            tb_cpu_matmul(pool, d, C, TB_F32, NULL, t, N, group, group); /* t = d C (C symmetric) */
            for (int n = 0; n < N; n++) {
                double e = 0;
                for (int i = 0; i < group; i++)
                    e += (double)t[(size_t)n * (size_t)group + (size_t)i] * (double)d[(size_t)n * (size_t)group + (size_t)i];
                if (r == 0 || e < best[n]) {
                    best[n] = e;
                    bound[(size_t)n * (size_t)G + (size_t)g] = ratio * amax[n];
                }
                if (r == 0) err_rtn += e;
            }
        }
        for (int n = 0; n < N; n++) {
            err_best += best[n];
            ratio_sum += amax[n] > 0 ? bound[(size_t)n * (size_t)G + (size_t)g] / amax[n] : 1.0;
        }
    }
    if (st == TB_OK && rep) {
        rep->err_rtn = err_rtn;
        rep->err_best = err_best;
        rep->mean_ratio = ratio_sum / ((double)N * (double)G);
    }
done:
    tb_pool_free(pool);
    free(xt); free(C); free(wg); free(d); free(t); free(amax); free(qs); free(best); free(codes);
    return st;
}
