/* test_nn_tune.c — build-time timing of Conv tactics (backend/cpu/nn_tune.c):
 * on a small CNN graph with a symbolic batch, every Conv that has more than
 * one tactic is timed and given one that applies to its geometry (no
 * Winograd on a strided or 1x1 conv) and never the kernel the rule runs
 * there, stored with the batch it was timed at (the rule runs at other
 * batches), a depthwise conv keeps the rule, and
 * each node run by the CPU kernels with its chosen tactic matches the
 * reference kernel on random data. One context's packed-weight cache
 * holds every tactic's form of a weight side by side. A graph without Conv
 * is left alone. */
#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"
#include "tb_test.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static int name_id;

static int weight(tb_graph *g, int rank, const int64_t *dims) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    float *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = 0.3f * tb_test_frand(&rng);
    char nm[32];
    snprintf(nm, sizeof nm, "w%d", name_id++);
    int v = tb_graph_add_weight(g, nm, TB_F32, rank, dims, d, 1);
    CHECK(v >= 0);
    return v;
}

/* Conv k x k, stride s, pad p, group grp, cin -> cout, bias and relu */
static int conv(tb_graph *g, int x, int64_t cin, int64_t cout, int k, int s, int p, int grp) {
    int64_t wd[4] = {cout, cin / grp, k, k}, bd[1] = {cout};
    int in[3] = {x, weight(g, 4, wd), weight(g, 1, bd)};
    int32_t ia[TB_NODE_INTS] = {grp, s, s, p, p, p, p, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS};
    char nm[32];
    snprintf(nm, sizeof nm, "t%d", name_id++);
    const char *names[1] = {nm};
    int n = tb_graph_add_node_ex(g, TB_OP_CONV, in, 3, names, 1, ia, NULL);
    CHECK_MSG(n >= 0, "Conv: %s", tb_last_error());
    return n >= 0 ? g->nodes[n].out[0] : -1;
}

/* the graph: x (batch, 32, 16, 16) -> 3x3 -> 3x3/2 -> 1x1 -> depthwise 3x3 */
static tb_graph *make_cnn(void) {
    tb_graph *g = tb_graph_new();
    int b = tb_graph_add_sym(g, "batch", 1, 2, 4);
    int64_t xd[4] = {TB_SYM(b), 32, 16, 16};
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 4, xd);
    CHECK(x >= 0);
    g->inputs[g->n_inputs++] = x;
    int y = conv(g, x, 32, 32, 3, 1, 1, 1);
    y = conv(g, y, 32, 64, 3, 2, 1, 1);
    y = conv(g, y, 64, 64, 1, 1, 0, 1);
    y = conv(g, y, 64, 64, 3, 1, 1, 64);
    g->outputs[g->n_outputs++] = y;
    return g;
}

/* Node n on random inputs at batch 2: its fast kernel (with its tactic)
 * against the reference; returns max |err| / max |ref|. */
static double node_err_ctx(const tb_graph *g, const tb_node *n, tb_cpu_nn_ctx *ctx);

static double node_err(const tb_graph *g, const tb_node *n, tb_pool *pool) {
    tb_cpu_nn_ctx ctx = {pool, NULL, 0, g, NULL};
    double e = node_err_ctx(g, n, &ctx);
    tb_cpu_nn_ctx_release(&ctx);
    return e;
}

/* as node_err, in the given context (its packed weights kept) */
static double node_err_ctx(const tb_graph *g, const tb_node *n, tb_cpu_nn_ctx *ctxp) {
    tb_view views[3];
    float *bufs[4] = {0};
    int64_t b = 2;
    for (int k = 0; k < n->n_in; k++) {
        const tb_value *v = &g->values[n->in[k]];
        views[k].dtype = TB_F32;
        views[k].rank = v->rank;
        for (int d = 0; d < v->rank; d++) views[k].dims[d] = TB_IS_SYM(v->dims[d]) ? b : v->dims[d];
        if (v->data) {
            views[k].data = (void *)v->data;
        } else {
            int64_t m = tb_view_numel(&views[k]);
            bufs[k] = malloc(sizeof(float) * (size_t)m);
            for (int64_t i = 0; i < m; i++) bufs[k][i] = tb_test_frand(&rng);
            views[k].data = bufs[k];
        }
    }
    tb_op_shape sh;
    CHECK(tb_op_infer_views(n, views, n->n_in, &sh) == TB_OK);
    tb_view out[2];
    memset(out, 0, sizeof out);
    for (int o = 0; o < 2; o++) {
        out[o].dtype = TB_F32;
        out[o].rank = sh.rank[0];
        memcpy(out[o].dims, sh.dims[0], sizeof(int64_t) * (size_t)sh.rank[0]);
    }
    int64_t m = tb_view_numel(&out[0]);
    float *fast = calloc((size_t)m, sizeof(float)), *ref = calloc((size_t)m, sizeof(float));
    out[0].data = fast;
    out[1].data = ref;
    CHECK(tb_cpu_nn_run(ctxp, n, views, n->n_in, &out[0], 1) == TB_OK);
    CHECK(tb_op_get_def(n->op)->ref(n, views, n->n_in, &out[1], 1) == TB_OK);
    double e = 0, s = 0;
    for (int64_t i = 0; i < m; i++) {
        double d = fabs((double)fast[i] - ref[i]);
        e = d > e || d != d ? d : e;
        s = fabs(ref[i]) > s ? fabs(ref[i]) : s;
    }
    for (int k = 0; k < 4; k++) free(bufs[k]);
    free(fast);
    free(ref);
    return s > 0 ? e / s : e;
}

static void test_tune_cnn(tb_pool *pool) {
    tb_graph *g = make_cnn();
    int n_tuned = -1;
    tb_status s = tb_cpu_nn_tune_convs(g, 2, 0, &n_tuned);
    CHECK_MSG(s == TB_OK, "tune: %s", tb_last_error());
    int k = 0, want = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const tb_node *n = &g->nodes[i];
        if (n->op != TB_OP_CONV) continue;
        int t = n->tactic & 0xff, tbatch = (n->tactic >> TB_CONV_TACTIC_BATCH_SHIFT) & 0xff;
        CHECK_MSG(t >= TB_CONV_TACTIC_AUTO && t <= TB_CONV_TACTIC_WINOGRAD4F, "conv %d: tactic %d", k, t);
        /* a timed tactic carries the batch it was timed at (opt 2) */
        CHECK_MSG(t == TB_CONV_TACTIC_AUTO ? tbatch == 0 : tbatch == 2, "conv %d: tactic %d at batch %d", k, t, tbatch);
        if (k == 1 || k == 2) /* stride 2, 1x1: no Winograd */
            CHECK_MSG(t != TB_CONV_TACTIC_WINOGRAD && t != TB_CONV_TACTIC_WINOGRAD4 && t != TB_CONV_TACTIC_WINOGRAD4F,
                      "conv %d: tactic %d", k, t);
        if (k < 3) { /* a tactic is set only for another kernel than the rule's at the opt shape (batch 2) */
            static const int64_t xs[3][4] = {{2, 32, 16, 16}, {2, 32, 16, 16}, {2, 64, 8, 8}};
            tb_view xv, wv;
            memset(&xv, 0, sizeof xv);
            xv.dtype = TB_F32;
            xv.rank = 4;
            memcpy(xv.dims, xs[k], sizeof xs[k]);
            const tb_value *wval = &g->values[n->in[1]];
            wv = xv;
            memcpy(wv.dims, wval->dims, sizeof(int64_t) * 4);
            tb_nn_conv_geom geo;
            CHECK(tb_nn_conv_geometry(n, &xv, &wv, &geo) == TB_OK);
            CHECK_MSG(t == TB_CONV_TACTIC_AUTO || t != tb_cpu_conv_rule(&geo), "conv %d: tactic %d is the rule's", k, t);
            /* timed where more than one kernel can run it: im2col always,
             * the direct kernel (AVX-512), Winograd for the stride-1 3x3
             * (F(2x2); F(4x4) twice with AVX-512) */
            int kernels = 1 + tb_cpu_conv_direct_ok(&geo);
            if (k == 0) kernels += tb_cpu_features() & TB_CPU_AVX512F ? 3 : 1;
            want += kernels >= 2;
        }
        if (k == 3) CHECK_MSG(t == TB_CONV_TACTIC_AUTO, "depthwise conv: tactic %d", t);
        double e = node_err(g, n, pool);
        CHECK_MSG(e < 1e-4, "conv %d (tactic %d): relative error %g", k, t, e);
        k++;
    }
    CHECK(k == 4);
    /* the stride-1 3x3 always; the strided 3x3 and the 1x1 where the
     * direct kernel exists; never the depthwise conv (one kernel) */
    CHECK_MSG(want >= 1 && n_tuned == want, "%d Conv nodes timed, %d expected", n_tuned, want);
    tb_graph_free(g);
}

/* One context's packed-weight cache holding several forms of the same
 * weight (GEMM panels, direct panels, Winograd F(2x2) and F(4x4) U, both
 * layouts): every
 * tactic, run twice in turn (the second time from the cache), still
 * matches the reference. */
static void test_wpack_forms(tb_pool *pool) {
    tb_graph *g = make_cnn();
    tb_node n = g->nodes[0]; /* the 3x3 stride-1 conv: all six tactics apply */
    tb_cpu_nn_ctx ctx = {pool, NULL, 0, g, NULL};
    for (int rep = 0; rep < 2; rep++)
        for (int t = TB_CONV_TACTIC_AUTO; t <= TB_CONV_TACTIC_WINOGRAD4F; t++) {
            n.tactic = t;
            double e = node_err_ctx(g, &n, &ctx);
            CHECK_MSG(e < 1e-4, "tactic %d, pass %d: relative error %g", t, rep, e);
        }
    CHECK(ctx.wpack != NULL);
    tb_cpu_nn_ctx_release(&ctx);
    CHECK(ctx.wpack == NULL);
    tb_graph_free(g);
}

/* A tactic stored with a batch holds at that batch only; the rule runs at
 * the others; a tactic without one holds at every batch. */
static void test_tactic_batch(void) {
    tb_graph *g = make_cnn();
    tb_node n = g->nodes[0]; /* 3x3 stride 1, 32 -> 32 channels on 16x16 */
    tb_nn_conv_geom geo[2];
    for (int b = 0; b < 2; b++) {
        tb_view xv, wv;
        memset(&xv, 0, sizeof xv);
        xv.dtype = TB_F32;
        xv.rank = 4;
        xv.dims[0] = b ? 8 : 1;
        xv.dims[1] = 32;
        xv.dims[2] = xv.dims[3] = 16;
        wv = xv;
        memcpy(wv.dims, g->values[n.in[1]].dims, sizeof(int64_t) * 4);
        CHECK(tb_nn_conv_geometry(&n, &xv, &wv, &geo[b]) == TB_OK);
    }
    n.tactic = TB_CONV_TACTIC_IM2COL | 1 << TB_CONV_TACTIC_BATCH_SHIFT;
    CHECK(tb_cpu_conv_tactic(&n, &geo[0]) == TB_CONV_TACTIC_IM2COL);
    CHECK(tb_cpu_conv_tactic(&n, &geo[1]) == tb_cpu_conv_rule(&geo[1]));
    CHECK(tb_cpu_conv_rule(&geo[1]) != TB_CONV_TACTIC_IM2COL);
    n.tactic = TB_CONV_TACTIC_IM2COL;
    CHECK(tb_cpu_conv_tactic(&n, &geo[0]) == TB_CONV_TACTIC_IM2COL);
    CHECK(tb_cpu_conv_tactic(&n, &geo[1]) == TB_CONV_TACTIC_IM2COL);
    n.tactic = TB_CONV_TACTIC_AUTO;
    CHECK(tb_cpu_conv_tactic(&n, &geo[1]) == tb_cpu_conv_rule(&geo[1]));
    tb_graph_free(g);
}

/* no Conv: nothing timed, nothing changed */
static void test_no_conv(void) {
    tb_graph *g = tb_graph_new();
    int64_t xd[2] = {4, 8};
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 2, xd);
    g->inputs[g->n_inputs++] = x;
    const char *names[1] = {"y"};
    int n = tb_graph_add_node_ex(g, TB_OP_RELU, (int[]){x}, 1, names, 1, NULL, NULL);
    CHECK(n >= 0);
    g->outputs[g->n_outputs++] = g->nodes[n].out[0];
    int n_tuned = -1;
    CHECK(tb_cpu_nn_tune_convs(g, 2, 0, &n_tuned) == TB_OK);
    CHECK(n_tuned == 0 && g->nodes[n].tactic == 0);
    tb_graph_free(g);
}

int main(void) {
    tb_pool *pool = NULL;
    CHECK(tb_pool_create(2, &pool) == TB_OK);
    test_tune_cnn(pool);
    test_wpack_forms(pool);
    test_tactic_batch();
    test_no_conv();
    tb_pool_free(pool);
    return tb_test_finish("test_nn_tune");
}
