/*
 * nn_tune.c — Conv tactics of a general graph timed at build time on this
 * CPU, as TensorRT times its tactics per optimisation profile: at the
 * symbols' opt values, every tactic that can run a Conv node (im2col + GEMM,
 * the direct kernel, Winograd F(2x2, 3x3), F(4x4, 3x3) in phases and by
 * tile blocks) runs on the
 * node's own weights and the fastest (best of several runs) is stored in the node's
 * tactic field (TB_CONV_TACTIC_*, read by nn_conv.c). Which tactic wins
 * depends on the core, its caches and the map size (F(4x4) needs many tiles,
 * the direct kernel wins on 7x7 maps), which is why a fixed rule loses.
 * The candidates run alternately, so a burst of load on a shared machine
 * hits them all alike; a node keeps the kernel's own rule (tactic 0) unless
 * another kernel beats it by 10% (a wrong pick on a noisy machine costs
 * more than a near tie gains). The kernel the rule itself runs at the opt
 * shape is not timed again: forcing it would only take the rule's choice
 * away at the profile's other shapes (F(4x4) at batch 8 where batch 1
 * takes F(2x2)), since one tactic serves the whole profile. For the same
 * reason a timed tactic is stored with the batch it was timed at
 * (TB_CONV_TACTIC_BATCH_SHIFT): at any other batch the rule runs (the
 * direct kernel can time best at batch 1 on 14x14 maps, but is ~35%
 * slower than F(4x4) by blocks at batch 8).
 */
#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"
#include "ir/interp.h"

#define TUNE_MIN_REPS 9
#define TUNE_MAX_REPS 41
#define TUNE_MIN_SECONDS 0.03 /* per candidate */
#define TUNE_MARGIN 0.90      /* another tactic must take under 90% of the rule's time */
#define TUNE_MAX_CAND 6

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fill_random(float *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        p[i] = (float)((seed >> 40) * (1.0 / 8388608.0)) - 1.0f;
    }
}

static const char *tactic_name(int t) {
    switch (t) {
    case TB_CONV_TACTIC_AUTO: return "rule";
    case TB_CONV_TACTIC_IM2COL: return "gemm";
    case TB_CONV_TACTIC_WINOGRAD: return "winograd2";
    case TB_CONV_TACTIC_WINOGRAD4: return "winograd4";
    case TB_CONV_TACTIC_DIRECT: return "direct";
    case TB_CONV_TACTIC_WINOGRAD4F: return "winograd4f";
    default: return "?";
    }
}

/* The tactics that can run geometry g: the kernel's rule first, then the
 * other kernels (not the one the rule runs here: timing the same kernel
 * twice only lets noise pick it, and a node forced to it loses the rule's
 * choice at the engine's other shapes, e.g. F(4x4) at batch 8 where batch
 * 1 takes F(2x2)). */
static int conv_candidates(const tb_nn_conv_geom *g, int *cand) {
    int n = 0;
    if (g->group == 1 && g->c > 1) { /* grouped and depthwise convs have one kernel each */
        int rule = tb_cpu_conv_rule(g), all[5], na = 0;
        cand[n++] = TB_CONV_TACTIC_AUTO;
        all[na++] = TB_CONV_TACTIC_IM2COL;
        if (tb_cpu_conv_direct_ok(g)) all[na++] = TB_CONV_TACTIC_DIRECT;
        int wino = g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
                   g->group == 1 && g->c >= 4 && g->m >= 4;
        if (wino) {
            all[na++] = TB_CONV_TACTIC_WINOGRAD;
            if (tb_cpu_features() & TB_CPU_AVX512F) {
                all[na++] = TB_CONV_TACTIC_WINOGRAD4;
                all[na++] = TB_CONV_TACTIC_WINOGRAD4F;
            }
        }
        for (int k = 0; k < na; k++)
            if (all[k] != rule) cand[n++] = all[k];
    }
    return n;
}

/* Times node n's candidates over views iv (inputs) and ov (output), all
 * with data; sets n->tactic. */
static tb_status tune_conv(tb_cpu_nn_ctx *ctx, tb_node *n, const tb_view *iv, const tb_view *ov, int verbose,
                           const char *name, int *timed) {
    *timed = 0;
    tb_nn_conv_geom g;
    TB_TRY(tb_nn_conv_geometry(n, &iv[0], &iv[1], &g));
    int cand[TUNE_MAX_CAND];
    int nc = conv_candidates(&g, cand);
    if (nc < 2) return TB_OK;
    double t[TUNE_MAX_CAND][TUNE_MAX_REPS];
    double total[TUNE_MAX_CAND] = {0};
    tb_node tn = *n;
    for (int c = 0; c < nc; c++) { /* warm: transformed weights, scratch, pages */
        tn.tactic = cand[c];
        TB_TRY(tb_cpu_nn_run(ctx, &tn, iv, n->n_in, ov, 1));
    }
    int reps = 0;
    for (; reps < TUNE_MAX_REPS; reps++) {
        int done = reps >= TUNE_MIN_REPS;
        for (int c = 0; c < nc; c++) done = done && total[c] >= TUNE_MIN_SECONDS;
        if (done) break;
        for (int c = 0; c < nc; c++) {
            tn.tactic = cand[c];
            double t0 = tb_now();
            TB_TRY(tb_cpu_nn_run(ctx, &tn, iv, n->n_in, ov, 1));
            t[c][reps] = tb_now() - t0;
            total[c] += t[c][reps];
        }
    }
    double best_t[TUNE_MAX_CAND];
    int best = 0;
    for (int c = 0; c < nc; c++) {
        qsort(t[c], (size_t)reps, sizeof(double), cmp_double);
        best_t[c] = t[c][0];
        if (c > 0 && best_t[c] < best_t[best]) best = c;
    }
    /* scored by the best run: load from other processes only adds time
     * (descheduled threads wait at the pool's barrier: runs 20x longer were
     * seen on a loaded 2-core machine, which moved even the medians); the
     * rule (candidate 0) stays unless clearly beaten */
    if (best != 0 && best_t[best] >= TUNE_MARGIN * best_t[0]) best = 0;
    /* a tactic holds at the batch it was timed at (the rule elsewhere) */
    n->tactic = cand[best] ? cand[best] | (int)((g.n <= 255 ? g.n : 0) << TB_CONV_TACTIC_BATCH_SHIFT) : 0;
    *timed = 1;
    if (verbose) {
        char line[256];
        size_t k = 0;
        for (int c = 0; c < nc && k < sizeof line; c++)
            k += (size_t)snprintf(line + k, sizeof line - k, " %s%s%s %.3f", tactic_name(cand[c]), c ? "" : "=",
                                  c ? "" : tactic_name(tb_cpu_conv_rule(&g)), best_t[c] * 1e3);
        tb_log(TB_LOG_INFO, "conv tactic %s (%lldx%lldx%lldx%lld, %dx%d/%d -> %lld): best ms%s -> %s", name,
               (long long)g.n, (long long)g.c, (long long)g.h, (long long)g.w, g.kh, g.kw, g.sh, (long long)g.m,
               line, tactic_name(cand[best]));
    }
    return TB_OK;
}

tb_status tb_cpu_nn_tune_convs(tb_graph *g, int n_threads, int verbose, int *n_tuned) {
    if (n_tuned) *n_tuned = 0;
    int convs = 0;
    for (int i = 0; i < g->n_nodes; i++) convs += g->nodes[i].op == TB_OP_CONV;
    if (!convs) return TB_OK;
    /* the inputs at the opt shapes (zeros: only shapes are needed of them) */
    tb_view in[TB_MAX_IO];
    memset(in, 0, sizeof in);
    tb_view *views = calloc((size_t)g->n_values + 1, sizeof *views);
    tb_interp_host *host = NULL;
    tb_pool *pool = NULL;
    tb_cpu_nn_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    tb_status s = TB_OK;
    if (!views) { s = tb_errorf(TB_ERR_OOM, "out of memory timing conv tactics"); goto done; }
    for (int i = 0; i < g->n_inputs; i++) {
        const tb_value *v = &g->values[g->inputs[i]];
        in[i].dtype = v->dtype;
        in[i].rank = v->rank;
        size_t numel = 1;
        for (int d = 0; d < v->rank; d++) {
            int64_t x = v->dims[d];
            if (TB_IS_SYM(x)) x = g->syms[TB_SYM_INDEX(x)].opt;
            if (x < 0) goto done; /* a dim known only at run time: keep the rules */
            in[i].dims[d] = x;
            numel *= (size_t)x;
        }
        in[i].data = calloc(numel ? numel : 1, tb_dtype_size(v->dtype));
        if (!in[i].data) { s = tb_errorf(TB_ERR_OOM, "out of memory timing conv tactics"); goto done; }
    }
    if (tb_interp_shapes(g, in, g->n_inputs, views, &host) != TB_OK) goto done; /* keep the rules */
    if (n_threads > 1 && (s = tb_pool_create(n_threads, &pool)) != TB_OK) goto done;
    ctx.pool = pool;
    ctx.graph = g;
    /* one node at a time: its activations (random) and packed weights are
     * freed before the next, so the build's memory stays that of one conv */
    for (int i = 0; i < g->n_nodes && s == TB_OK; i++) {
        tb_node *n = &g->nodes[i];
        if (n->op != TB_OP_CONV) continue;
        tb_view iv[TB_MAX_INPUTS], ov = views[n->out[0]];
        float *bufs[TB_MAX_INPUTS + 1];
        int nb = 0, ok = ov.dtype == TB_F32;
        for (int k = 0; k <= n->n_in && ok && s == TB_OK; k++) {
            tb_view *v = k < n->n_in ? &iv[k] : &ov;
            if (k < n->n_in) *v = views[n->in[k]];
            ok = v->dtype == TB_F32;
            if (!ok || (k < n->n_in && v->data)) continue;
            /* an activation or the output: a buffer of its own */
            size_t numel = (size_t)tb_view_numel(v);
            float *b = tb_alloc_aligned(sizeof(float) * (numel ? numel : 1), 64);
            if (!b) { s = tb_errorf(TB_ERR_OOM, "out of memory timing conv tactics"); break; }
            fill_random(b, numel, (uint64_t)i * 2654435761u + (uint64_t)k + 1);
            bufs[nb++] = b;
            v->data = b;
        }
        int timed = 0;
        if (s == TB_OK && ok) s = tune_conv(&ctx, n, iv, &ov, verbose, g->values[n->out[0]].name, &timed);
        if (s == TB_OK && n_tuned) *n_tuned += timed;
        for (int k = 0; k < nb; k++) tb_free_aligned(bufs[k]);
        tb_cpu_nn_wpack_free(&ctx);
    }
done:
    tb_cpu_nn_ctx_release(&ctx);
    if (pool) tb_pool_free(pool);
    if (host) tb_interp_free_host(host);
    for (int i = 0; i < g->n_inputs; i++) free(in[i].data);
    free(views);
    return s;
}
