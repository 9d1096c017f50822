/* test_passes.c — the general-graph passes (opt/opt.h): each pass on graphs
 * built by hand that hold its pattern, and near misses it must leave alone.
 * Every graph is run by the reference interpreter on random inputs before
 * and after the pass; outputs agree within rtol 1e-4 of their largest
 * magnitude, and the nodes left are checked. Then the whole pipeline on a
 * BERT-like encoder layer and a ResNet basic block, and the memory plan
 * (no two values live at once overlap; planned <= unplanned). */
#include "ir/interp.h"
#include "opt/opt.h"
#include "tb_test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int name_id;
static const char *opt_device = ""; /* the passes' target backend (tb_opt_options.device) */

/* ---------------------------------------------------------------- building */

static int input(tb_graph *g, tb_dtype dt, int rank, const int64_t *dims) {
    char nm[32];
    snprintf(nm, sizeof nm, "in%d", g->n_inputs);
    int v = tb_graph_add_value(g, nm, TB_VAL_INPUT, dt, rank, dims);
    CHECK(v >= 0);
    g->inputs[g->n_inputs++] = v;
    return v;
}

static int inputf(tb_graph *g, int rank, const int64_t *dims) { return input(g, TB_F32, rank, dims); }

static void output(tb_graph *g, int v) { g->outputs[g->n_outputs++] = v; }

/* A random f32 weight, values in [-scale, scale) + shift. */
static int weight(tb_graph *g, int rank, const int64_t *dims, float scale, float shift) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    float *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = tb_test_frand(&rng) * scale + shift;
    char nm[32];
    snprintf(nm, sizeof nm, "w%d", name_id++);
    int v = tb_graph_add_weight(g, nm, TB_F32, rank, dims, d, 1);
    CHECK(v >= 0);
    return v;
}

/* An f32 weight holding these values. */
static int wvals(tb_graph *g, int rank, const int64_t *dims, const float *vals) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    float *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    memcpy(d, vals, (size_t)n * sizeof *d);
    char nm[32];
    snprintf(nm, sizeof nm, "c%d", name_id++);
    int v = tb_graph_add_weight(g, nm, TB_F32, rank, dims, d, 1);
    CHECK(v >= 0);
    return v;
}

/* A scalar f32 constant (rank 0) and a (1) one. */
static int scalar(tb_graph *g, float x) { return wvals(g, 0, NULL, &x); }
static int scalar1(tb_graph *g, float x) { return wvals(g, 1, (int64_t[]){1}, &x); }

static int i64s(tb_graph *g, int n, const int64_t *vals) {
    int64_t *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    memcpy(d, vals, (size_t)n * sizeof *d);
    char nm[32];
    snprintf(nm, sizeof nm, "i%d", name_id++);
    int64_t dim = n;
    int v = tb_graph_add_weight(g, nm, TB_I64, 1, &dim, d, 1);
    CHECK(v >= 0);
    return v;
}

/* A scalar (rank 0) i64 constant: Gather's index in exported shape code. */
static int i64scalar(tb_graph *g, int64_t x) {
    int64_t *d = malloc(sizeof *d);
    *d = x;
    char nm[32];
    snprintf(nm, sizeof nm, "i%d", name_id++);
    int v = tb_graph_add_weight(g, nm, TB_I64, 0, NULL, d, 1);
    CHECK(v >= 0);
    return v;
}

/* Adds a node; returns its first output value (-1 and a failed check). */
static int node(tb_graph *g, tb_op_kind op, int n_in, const int *in, const int32_t *ia, const float *fa) {
    char nm[32];
    snprintf(nm, sizeof nm, "t%d", name_id++);
    const char *names[1] = {nm};
    int k = tb_graph_add_node_ex(g, op, in, n_in, names, 1, ia, fa);
    CHECK_MSG(k >= 0, "%s: %s", tb_op_name(op), tb_last_error());
    return k >= 0 ? g->nodes[k].out[0] : -1;
}

#define N1(op, a) node(g, op, 1, (int[]){a}, NULL, NULL)
#define N2(op, a, b) node(g, op, 2, (int[]){a, b}, NULL, NULL)
#define NI(op, ins, n, ...) node(g, op, n, ins, (int32_t[TB_NODE_INTS]){__VA_ARGS__}, NULL)

static int count_op(const tb_graph *g, tb_op_kind op) {
    int c = 0;
    for (int k = 0; k < g->n_nodes; k++) c += g->nodes[k].op == op;
    return c;
}

static const tb_node *find_op(const tb_graph *g, tb_op_kind op, int nth) {
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == op && nth-- == 0) return &g->nodes[k];
    return NULL;
}

/* ---------------------------------------------------------------- running */

typedef struct {
    tb_view in[TB_MAX_IO];
    int n;
} feed;

/* Random inputs for g: symbols at their opt value; bool inputs a causal
 * pattern over their last two dims (every row keeps something). */
static void feed_make(const tb_graph *g, feed *f) {
    f->n = g->n_inputs;
    for (int i = 0; i < g->n_inputs; i++) {
        const tb_value *x = &g->values[g->inputs[i]];
        tb_view *v = &f->in[i];
        memset(v, 0, sizeof *v);
        v->dtype = x->dtype;
        v->rank = x->rank;
        int64_t n = 1;
        for (int d = 0; d < x->rank; d++) {
            int64_t dim = x->dims[d];
            if (TB_IS_SYM(dim)) dim = g->syms[TB_SYM_INDEX(dim)].opt;
            v->dims[d] = dim;
            n *= dim;
        }
        uint64_t bytes;
        CHECK(tb_view_bytes(v, &bytes) == TB_OK);
        v->data = calloc(1, bytes ? bytes : 1);
        if (x->dtype == TB_BOOL) {
            int64_t cols = x->rank ? v->dims[x->rank - 1] : 1, rows = x->rank > 1 ? v->dims[x->rank - 2] : 1;
            for (int64_t e = 0; e < n; e++) ((uint8_t *)v->data)[e] = e % cols <= (e / cols) % rows;
        } else {
            for (int64_t e = 0; e < n; e++) ((float *)v->data)[e] = tb_test_frand(&rng);
        }
    }
}

static void feed_free(feed *f) {
    for (int i = 0; i < f->n; i++) free(f->in[i].data);
}

typedef struct {
    tb_view out[TB_MAX_IO];
    int n;
} result;

static int run(const tb_graph *g, const feed *f, result *r) {
    r->n = g->n_outputs;
    memset(r->out, 0, sizeof r->out);
    tb_status s = tb_interp_run(g, f->in, f->n, r->out, r->n);
    CHECK_MSG(s == TB_OK, "interp: %s", tb_last_error());
    return s == TB_OK;
}

/* max |a - b| / max |b| per output, worst over outputs */
static double compare(const result *a, const result *b) {
    double worst = 0;
    if (a->n != b->n) return INFINITY;
    for (int o = 0; o < a->n; o++) {
        const tb_view *x = &a->out[o], *y = &b->out[o];
        if (x->rank != y->rank || x->dtype != TB_F32 || y->dtype != TB_F32) return INFINITY;
        for (int d = 0; d < x->rank; d++)
            if (x->dims[d] != y->dims[d]) return INFINITY;
        int64_t n = tb_view_numel(x);
        double m = 0, e = 0;
        for (int64_t i = 0; i < n; i++) {
            double p = ((float *)x->data)[i], q = ((float *)y->data)[i];
            if (fabs(q) > m) m = fabs(q);
            if (!(fabs(p - q) <= e)) e = fabs(p - q); /* NaN counts as worst */
        }
        double rel = e / (m > 0 ? m : 1);
        if (!(rel <= worst)) worst = rel;
    }
    return worst;
}

/* Runs passes on g, comparing outputs before and after on random inputs.
 * Returns the changes the passes reported. */
static int check_passes(tb_graph *g, const tb_pass *passes, int n, const char *what) {
    feed f;
    result before, after;
    feed_make(g, &f);
    if (!run(g, &f, &before)) { feed_free(&f); return -1; }
    tb_opt_options o;
    memset(&o, 0, sizeof o);
    snprintf(o.device, sizeof o.device, "%s", opt_device);
    int changes = 0;
    for (int i = 0; i < n; i++) {
        tb_pass_report r;
        memset(&r, 0, sizeof r);
        tb_status s = passes[i].run(g, &o, &r);
        CHECK_MSG(s == TB_OK, "%s: pass %s: %s", what, passes[i].name, tb_last_error());
        tb_opt_compact(g);
        s = tb_graph_check(g);
        CHECK_MSG(s == TB_OK, "%s: graph after %s: %s", what, passes[i].name, tb_last_error());
        changes += r.changes;
        if (getenv("TB_TEST_VERBOSE")) printf("  %s: %s: %s\n", what, passes[i].name, r.what);
    }
    if (run(g, &f, &after)) {
        double e = compare(&after, &before);
        CHECK_MSG(e <= 1e-4, "%s: outputs differ after the passes by %g", what, e);
        tb_interp_free_outputs(after.out, after.n);
    }
    tb_interp_free_outputs(before.out, before.n);
    feed_free(&f);
    return changes;
}

static int check_pass(tb_graph *g, tb_pass_fn fn, const char *what) {
    tb_pass p = {what, fn, ""};
    return check_passes(g, &p, 1, what);
}

/* ---------------------------------------------------------------- 1. identity, dead nodes */

static void test_identity(void) {
    tb_graph *g = tb_graph_new();
    int64_t d[2] = {3, 4};
    int x = inputf(g, 2, d);
    int a = N1(TB_OP_RELU, x);
    int b = N1(TB_OP_IDENTITY, a);
    int c = N1(TB_OP_SIGMOID, b);
    int y = N1(TB_OP_IDENTITY, c);
    int z = N1(TB_OP_IDENTITY, x); /* input straight to output: kept */
    int unused = N1(TB_OP_TANH, x);
    (void)unused;
    output(g, y);
    output(g, z);
    char yname[TB_NAME_LEN];
    snprintf(yname, sizeof yname, "%s", g->values[y].name);
    CHECK(check_pass(g, tb_opt_remove_identity, "identity") == 2);
    CHECK(count_op(g, TB_OP_IDENTITY) == 1);
    CHECK(count_op(g, TB_OP_TANH) == 0); /* dead: compacted */
    CHECK(!strcmp(g->values[g->outputs[0]].name, yname));
    tb_graph_free(g);

    g = tb_graph_new();
    x = inputf(g, 2, d);
    a = N1(TB_OP_RELU, x);
    N1(TB_OP_TANH, a);
    N1(TB_OP_EXP, a);
    output(g, N1(TB_OP_SIGMOID, a));
    tb_opt_options o = {.dtype = TB_F32};
    tb_pass_report r = {0, {0}};
    CHECK(tb_opt_dead_nodes(g, &o, &r) == TB_OK && r.changes == 2 && g->n_nodes == 2);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- 2. constant folding */

static void test_fold(void) {
    /* constants through Add/Mul, and the Shape -> Gather -> Unsqueeze ->
     * Concat -> Reshape chain over a fixed symbol */
    tb_graph *g = tb_graph_new();
    tb_graph_add_sym(g, "b", 2, 2, 2);
    tb_graph_add_sym(g, "s", 1, 3, 8);
    int64_t d[3] = {TB_SYM(0), 3, 4};
    int x = inputf(g, 3, d);
    int64_t four[1] = {4};
    int c = N2(TB_OP_NN_ADD, weight(g, 1, four, 1, 0), weight(g, 1, four, 1, 0));
    c = N2(TB_OP_MUL, c, scalar(g, 3.0f));
    int xc = N2(TB_OP_MUL, x, c);
    int sh = N1(TB_OP_SHAPE, x);
    int b0 = NI(TB_OP_GATHER, ((int[]){sh, i64scalar(g, 0)}), 2, 0);
    int b0u = N2(TB_OP_UNSQUEEZE, b0, i64s(g, 1, (int64_t[]){0}));
    int cat = NI(TB_OP_CONCAT, ((int[]){b0u, i64s(g, 1, (int64_t[]){-1})}), 2, 0);
    int y = NI(TB_OP_RESHAPE, ((int[]){xc, cat}), 2, 0);
    output(g, y);
    CHECK(g->values[y].dims[1] == TB_DIM_DYN || g->values[y].dims[1] == 12);
    int ch = check_pass(g, tb_opt_fold_constants, "fold");
    CHECK(ch == 6);
    CHECK(g->n_nodes == 2 && count_op(g, TB_OP_MUL) == 1 && count_op(g, TB_OP_RESHAPE) == 1);
    y = g->outputs[0];
    /* x's batch is a symbol to the Reshape's rule, so the -1 stays unknown */
    CHECK(g->values[y].rank == 2 && g->values[y].dims[0] == 2);
    tb_graph_free(g);

    /* a symbol with a range: Shape stays unknown, but a Reshape target built
     * from it becomes a constant where it can: [s, 2, 2] of x (s, 4) is
     * [0, 2, 2]; [2, s, 2] is [2, -1, 2]; [t, s] of (s, t) stays */
    g = tb_graph_new();
    tb_graph_add_sym(g, "s", 1, 3, 8);
    tb_graph_add_sym(g, "t", 1, 2, 8);
    int64_t d2[2] = {TB_SYM(0), 4};
    x = inputf(g, 2, d2);
    int x2 = inputf(g, 2, (int64_t[]){TB_SYM(0), TB_SYM(1)});
    sh = N1(TB_OP_SHAPE, x);
    b0u = N2(TB_OP_UNSQUEEZE, NI(TB_OP_GATHER, ((int[]){sh, i64scalar(g, 0)}), 2, 0), i64s(g, 1, (int64_t[]){0}));
    cat = NI(TB_OP_CONCAT, ((int[]){b0u, i64s(g, 2, (int64_t[]){2, 2})}), 2, 0);
    output(g, NI(TB_OP_RESHAPE, ((int[]){x, cat}), 2, 0));
    cat = NI(TB_OP_CONCAT, ((int[]){i64s(g, 1, (int64_t[]){2}), b0u, i64s(g, 1, (int64_t[]){2})}), 3, 0);
    output(g, NI(TB_OP_RESHAPE, ((int[]){x, cat}), 2, 0));
    int sh2 = N1(TB_OP_SHAPE, x2);
    int swap = NI(TB_OP_GATHER, ((int[]){sh2, i64s(g, 2, (int64_t[]){1, 0})}), 2, 0);
    output(g, NI(TB_OP_RESHAPE, ((int[]){x2, swap}), 2, 0));
    CHECK(check_pass(g, tb_opt_fold_constants, "fold-range") == 2);
    CHECK(count_op(g, TB_OP_SHAPE) == 1 && g->n_nodes == 5);
    const tb_node *r0 = find_op(g, TB_OP_RESHAPE, 0), *r1 = find_op(g, TB_OP_RESHAPE, 1);
    const int64_t *t0 = g->values[r0->in[1]].data, *t1 = g->values[r1->in[1]].data;
    CHECK(t0 && t0[0] == 0 && t0[1] == 2 && t0[2] == 2 && g->values[r0->out[0]].dims[0] == TB_SYM(0));
    CHECK(t1 && t1[0] == 2 && t1[1] == -1 && t1[2] == 2);
    tb_graph_free(g);

    /* near miss: a result over the cap stays a node (not run: 64 MiB) */
    g = tb_graph_new();
    x = inputf(g, 1, (int64_t[]){1});
    int big = N2(TB_OP_CONSTANT_OF_SHAPE, i64s(g, 1, (int64_t[]){(int64_t)(TB_OPT_FOLD_MAX_BYTES / 4) + 1}),
                 scalar1(g, 1.0f));
    output(g, N2(TB_OP_MUL, big, x));
    tb_opt_options o = {.dtype = TB_F32};
    tb_pass_report r = {0, {0}};
    CHECK(tb_opt_fold_constants(g, &o, &r) == TB_OK && r.changes == 0);
    CHECK(count_op(g, TB_OP_CONSTANT_OF_SHAPE) == 1);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- 3. batchnorm */

static int bn(tb_graph *g, int x, int64_t c) {
    int64_t d[1] = {c};
    int in[5] = {x, weight(g, 1, d, 0.5f, 1.0f), weight(g, 1, d, 0.5f, 0), weight(g, 1, d, 0.3f, 0),
                 weight(g, 1, d, 0.2f, 0.8f)};
    return node(g, TB_OP_BATCHNORM, 5, in, NULL, (float[TB_NODE_FLOATS]){1e-5f});
}

static int conv(tb_graph *g, int x, int64_t cin, int64_t cout, int bias, int act) {
    int64_t wd[4] = {cout, cin, 3, 3}, bd[1] = {cout};
    int in[3] = {x, weight(g, 4, wd, 0.3f, 0), bias ? weight(g, 1, bd, 0.3f, 0) : -1};
    int32_t ia[TB_NODE_INTS] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, act, bias ? TB_NN_HAS_BIAS : 0};
    return node(g, TB_OP_CONV, bias ? 3 : 2, in, ia, NULL);
}

static void test_batchnorm(void) {
    tb_graph *g = tb_graph_new();
    int64_t xd[4] = {2, 3, 5, 5};
    int x = inputf(g, 4, xd);
    output(g, bn(g, conv(g, x, 3, 4, 0, 0), 4));
    output(g, bn(g, conv(g, x, 3, 4, 1, 0), 4));
    /* Gemm (rank 2) then BN; MatMul then a per-channel Mul (1, N) */
    int a = inputf(g, 2, (int64_t[]){4, 6});
    int gm = node(g, TB_OP_GEMM, 3, (int[]){a, weight(g, 2, (int64_t[]){5, 6}, 0.5f, 0), weight(g, 1, (int64_t[]){5}, 0.5f, 0)},
                  (int32_t[TB_NODE_INTS]){0, 1, 0, TB_NN_HAS_BIAS}, (float[TB_NODE_FLOATS]){1.0f, 0.5f});
    output(g, bn(g, gm, 5));
    int a3 = inputf(g, 3, (int64_t[]){2, 4, 6});
    int mm = N2(TB_OP_NN_MATMUL, a3, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N2(TB_OP_MUL, mm, weight(g, 2, (int64_t[]){1, 5}, 1.0f, 0)));
    CHECK(check_pass(g, tb_opt_fold_batchnorm, "batchnorm") == 4);
    CHECK(count_op(g, TB_OP_BATCHNORM) == 0 && count_op(g, TB_OP_MUL) == 0);
    CHECK(count_op(g, TB_OP_CONV) == 2 && count_op(g, TB_OP_GEMM) == 1 && count_op(g, TB_OP_NN_MATMUL) == 1);
    CHECK(find_op(g, TB_OP_CONV, 0)->i[11] == TB_NN_HAS_BIAS && find_op(g, TB_OP_NN_MATMUL, 0)->i[3] == TB_NN_HAS_BIAS);
    tb_graph_free(g);

    /* near misses: an activation already fused before the BN; a Conv read
     * twice; a Mul per row (not per channel); a Mul by a tensor input */
    g = tb_graph_new();
    x = inputf(g, 4, xd);
    output(g, bn(g, conv(g, x, 3, 4, 1, TB_NN_ACT_RELU), 4));
    int cv = conv(g, x, 3, 4, 0, 0);
    output(g, bn(g, cv, 4));
    output(g, cv);
    a3 = inputf(g, 3, (int64_t[]){2, 4, 6});
    mm = N2(TB_OP_NN_MATMUL, a3, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N2(TB_OP_MUL, mm, weight(g, 2, (int64_t[]){4, 1}, 1.0f, 0)));
    int mm2 = N2(TB_OP_NN_MATMUL, a3, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N2(TB_OP_MUL, mm2, inputf(g, 1, (int64_t[]){5})));
    CHECK(check_pass(g, tb_opt_fold_batchnorm, "batchnorm-miss") == 0);
    CHECK(count_op(g, TB_OP_BATCHNORM) == 2 && count_op(g, TB_OP_MUL) == 2);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- 4. epilogue */

static void test_epilogue(void) {
    tb_graph *g = tb_graph_new();
    int a = inputf(g, 3, (int64_t[]){2, 4, 6});
    int64_t n5[1] = {5};
    /* MatMul + bias (N) + Relu */
    int mm = N2(TB_OP_NN_MATMUL, a, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N1(TB_OP_RELU, N2(TB_OP_NN_ADD, weight(g, 1, n5, 0.5f, 0), mm)));
    /* Conv + Clip(0, 6) */
    int x = inputf(g, 4, (int64_t[]){1, 3, 5, 5});
    output(g, node(g, TB_OP_CLIP, 3, (int[]){conv(g, x, 3, 4, 1, 0), scalar(g, 0), scalar(g, 6)}, NULL, NULL));
    /* Conv + bias as (1, M, 1, 1) Add */
    output(g, N2(TB_OP_NN_ADD, conv(g, x, 3, 4, 0, 0), weight(g, 4, (int64_t[]){1, 4, 1, 1}, 0.5f, 0)));
    /* Gemm + Sigmoid */
    int a2 = inputf(g, 2, (int64_t[]){4, 6});
    int gm = node(g, TB_OP_GEMM, 2, (int[]){a2, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0)}, NULL,
                  (float[TB_NODE_FLOATS]){1.0f, 1.0f});
    output(g, N1(TB_OP_SIGMOID, gm));
    /* MatMul + bias + residual + Relu (act after residual) */
    int r = inputf(g, 3, (int64_t[]){2, 4, 5});
    mm = N2(TB_OP_NN_MATMUL, a, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N1(TB_OP_RELU, N2(TB_OP_NN_ADD, r, N2(TB_OP_NN_ADD, mm, weight(g, 1, n5, 0.5f, 0)))));
    /* Conv + Tanh, then a residual (residual after the activation) */
    int rx = inputf(g, 4, (int64_t[]){1, 4, 5, 5});
    output(g, N2(TB_OP_NN_ADD, N1(TB_OP_TANH, conv(g, x, 3, 4, 1, 0)), rx));
    /* MatMul + Gelu (erf) */
    mm = N2(TB_OP_NN_MATMUL, a, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, NI(TB_OP_GELU, ((int[]){mm}), 1, 0));
    CHECK(check_pass(g, tb_opt_fuse_epilogue, "epilogue") == 11);
    CHECK(g->n_nodes == 7);
    CHECK(count_op(g, TB_OP_NN_ADD) == 0 && count_op(g, TB_OP_RELU) == 0 && count_op(g, TB_OP_CLIP) == 0 &&
          count_op(g, TB_OP_SIGMOID) == 0 && count_op(g, TB_OP_TANH) == 0 && count_op(g, TB_OP_GELU) == 0);
    const tb_node *m1 = find_op(g, TB_OP_NN_MATMUL, 1);
    CHECK(m1 && m1->i[2] == TB_NN_ACT_RELU &&
          m1->i[3] == (TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL) && m1->n_in == 4);
    const tb_node *c2 = find_op(g, TB_OP_CONV, 2);
    CHECK(c2 && c2->i[10] == TB_NN_ACT_TANH && c2->i[11] == (TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL));
    tb_graph_free(g);

    /* near misses: a per-row constant (M, 1) is no bias; a tensor that
     * broadcasts up to the output is no residual; a MatMul read twice; an
     * activation after an activation */
    g = tb_graph_new();
    a = inputf(g, 3, (int64_t[]){2, 4, 6});
    mm = N2(TB_OP_NN_MATMUL, a, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N2(TB_OP_NN_ADD, mm, weight(g, 2, (int64_t[]){4, 1}, 0.5f, 0)));
    int mm2 = N2(TB_OP_NN_MATMUL, a, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N2(TB_OP_NN_ADD, mm2, inputf(g, 2, (int64_t[]){4, 5})));
    int mm3 = N2(TB_OP_NN_MATMUL, a, weight(g, 2, (int64_t[]){6, 5}, 0.5f, 0));
    output(g, N1(TB_OP_RELU, mm3));
    output(g, mm3);
    int64_t wd[2] = {6, 5};
    int mm4 = node(g, TB_OP_NN_MATMUL, 2, (int[]){a, weight(g, 2, wd, 0.5f, 0)},
                   (int32_t[TB_NODE_INTS]){0, 0, TB_NN_ACT_TANH}, NULL);
    output(g, N1(TB_OP_SIGMOID, mm4));
    CHECK(check_pass(g, tb_opt_fuse_epilogue, "epilogue-miss") == 0);
    CHECK(count_op(g, TB_OP_NN_ADD) == 2 && count_op(g, TB_OP_RELU) == 1 && count_op(g, TB_OP_SIGMOID) == 1);
    tb_graph_free(g);
}

/* Dynamic dims: a position embedding of Range(0, seq, 1) leaves seq
 * unknown to the shape rules; the passes follow it, so the residual of a
 * MatMul over x + pos is proved to have the output's shape. */
static void test_epilogue_dynamic(void) {
    tb_graph *g = tb_graph_new();
    tb_graph_add_sym(g, "batch", 1, 2, 4);
    tb_graph_add_sym(g, "seq", 1, 5, 16);
    int x = inputf(g, 3, (int64_t[]){TB_SYM(0), TB_SYM(1), 8});
    int seq = NI(TB_OP_GATHER, ((int[]){N1(TB_OP_SHAPE, x), i64scalar(g, 1)}), 2, 0);
    int range = node(g, TB_OP_RANGE, 3, (int[]){i64scalar(g, 0), seq, i64scalar(g, 1)}, NULL, NULL);
    int pos = NI(TB_OP_GATHER, ((int[]){weight(g, 2, (int64_t[]){16, 8}, 1, 0), N2(TB_OP_UNSQUEEZE, range, i64s(g, 1, (int64_t[]){0}))}), 2, 0);
    int h = N2(TB_OP_NN_ADD, x, pos);
    CHECK(g->values[h].dims[1] == TB_DIM_DYN);
    int64_t n8 = 8;
    int y = N2(TB_OP_NN_ADD, N2(TB_OP_NN_MATMUL, h, weight(g, 2, (int64_t[]){8, 8}, 0.3f, 0)), weight(g, 1, &n8, 0.3f, 0));
    output(g, N2(TB_OP_NN_ADD, y, h));
    /* near miss: (batch, 1, 8) would broadcast up to the output */
    int y2 = N2(TB_OP_NN_MATMUL, h, weight(g, 2, (int64_t[]){8, 8}, 0.3f, 0));
    output(g, N2(TB_OP_NN_ADD, y2, inputf(g, 3, (int64_t[]){TB_SYM(0), 1, 8})));
    CHECK(check_pass(g, tb_opt_fuse_epilogue, "epilogue-dynamic") == 2);
    const tb_node *m0 = find_op(g, TB_OP_NN_MATMUL, 0);
    CHECK(m0 && m0->i[3] == (TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL) && count_op(g, TB_OP_NN_ADD) == 2);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- 5. layernorm */

/* The exported form over the last axis of x (rank 3); variant 0: Pow and
 * Div; 1: Mul(d, d) and Reciprocal; axes as an input or as the mask. */
static int layernorm_pattern(tb_graph *g, int x, int64_t D, int variant, int affine, float eps, int axis) {
    int m = variant || axis != 2 ? NI(TB_OP_REDUCE_MEAN, ((int[]){x}), 1, 1, 1 << axis)
                                 : NI(TB_OP_REDUCE_MEAN, ((int[]){x, i64s(g, 1, (int64_t[]){-1})}), 2, 1);
    int d = N2(TB_OP_SUB, x, m);
    int sq = variant ? N2(TB_OP_MUL, d, d) : N2(TB_OP_POW, d, scalar(g, 2.0f));
    int v = NI(TB_OP_REDUCE_MEAN, ((int[]){sq}), 1, 1, 1 << axis);
    int s = N1(TB_OP_SQRT, N2(TB_OP_NN_ADD, v, scalar(g, eps)));
    int y = variant ? N2(TB_OP_MUL, N1(TB_OP_RECIPROCAL, s), d) : N2(TB_OP_DIV, d, s);
    if (affine) {
        y = N2(TB_OP_MUL, y, weight(g, 1, &D, 0.5f, 1.0f));
        y = N2(TB_OP_NN_ADD, weight(g, 1, &D, 0.5f, 0), y);
    }
    return y;
}

static void test_layernorm(void) {
    tb_graph *g = tb_graph_new();
    int64_t xd[3] = {2, 3, 8};
    int x = inputf(g, 3, xd);
    output(g, layernorm_pattern(g, x, 8, 0, 1, 1e-5f, 2));
    output(g, layernorm_pattern(g, x, 8, 1, 1, 1e-12f, 2));
    output(g, layernorm_pattern(g, x, 8, 0, 0, 1e-5f, 2));
    CHECK(check_pass(g, tb_opt_fuse_layernorm, "layernorm") == 3);
    CHECK(g->n_nodes == 3 && count_op(g, TB_OP_LAYERNORM) == 3);
    const tb_node *ln = find_op(g, TB_OP_LAYERNORM, 1);
    CHECK(ln && ln->i[0] == 2 && ln->n_in == 3 && fabsf(ln->f[0] - 1e-12f) < 1e-15f);
    CHECK(find_op(g, TB_OP_LAYERNORM, 2)->n_in == 2);
    tb_graph_free(g);

    /* near misses: reduced over axis 1; x - mean read by something else; a
     * fourth power instead of a square */
    g = tb_graph_new();
    x = inputf(g, 3, xd);
    output(g, layernorm_pattern(g, x, 8, 0, 1, 1e-5f, 1));
    int y = layernorm_pattern(g, x, 8, 0, 0, 1e-5f, 2);
    output(g, y);
    int k = tb_opt_producer(g, y); /* Div(d, s): d also becomes an output */
    output(g, g->nodes[k].in[0]);
    int m = NI(TB_OP_REDUCE_MEAN, ((int[]){x}), 1, 1, 1 << 2);
    int d = N2(TB_OP_SUB, x, m);
    int v = NI(TB_OP_REDUCE_MEAN, ((int[]){N2(TB_OP_POW, d, scalar(g, 4.0f))}), 1, 1, 1 << 2);
    output(g, N2(TB_OP_DIV, d, N1(TB_OP_SQRT, N2(TB_OP_NN_ADD, v, scalar(g, 1e-5f)))));
    int before = g->n_nodes;
    CHECK(check_pass(g, tb_opt_fuse_layernorm, "layernorm-miss") == 0);
    CHECK(g->n_nodes == before && count_op(g, TB_OP_LAYERNORM) == 0);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- 6. gelu */

static int gelu_erf(tb_graph *g, int x, int variant) {
    int t = variant & 1 ? N2(TB_OP_MUL, scalar(g, 0.70710678f), x) : N2(TB_OP_DIV, x, scalar(g, 1.4142135f));
    int a = N2(TB_OP_NN_ADD, N1(TB_OP_ERF, t), scalar(g, 1.0f));
    switch (variant >> 1) {
    case 0: return N2(TB_OP_MUL, N2(TB_OP_MUL, x, a), scalar(g, 0.5f));           /* (x a) 0.5     */
    case 1: return N2(TB_OP_MUL, a, N2(TB_OP_MUL, x, scalar(g, 0.5f)));           /* a (x 0.5)     */
    default: return N2(TB_OP_MUL, x, N2(TB_OP_MUL, scalar1(g, 0.5f), a));         /* x (0.5 a)     */
    }
}

static int gelu_tanh(tb_graph *g, int x, int cube_by_mul, float c) {
    int x3 = cube_by_mul ? N2(TB_OP_MUL, x, N2(TB_OP_MUL, x, x)) : N2(TB_OP_POW, x, scalar(g, 3.0f));
    int in = N2(TB_OP_NN_ADD, x, N2(TB_OP_MUL, scalar(g, c), x3));
    int t = N1(TB_OP_TANH, N2(TB_OP_MUL, in, scalar(g, 0.7978845608f)));
    int a = N2(TB_OP_NN_ADD, scalar(g, 1.0f), t);
    return N2(TB_OP_MUL, N2(TB_OP_MUL, scalar(g, 0.5f), x), a);
}

static void test_gelu(void) {
    tb_graph *g = tb_graph_new();
    int64_t xd[2] = {4, 16};
    int x = N2(TB_OP_MUL, inputf(g, 2, xd), scalar(g, 3.0f));
    for (int v = 0; v < 6; v++) output(g, gelu_erf(g, x, v));
    output(g, gelu_tanh(g, x, 0, 0.044715f));
    output(g, gelu_tanh(g, x, 1, 0.044715f));
    CHECK(check_pass(g, tb_opt_fuse_gelu, "gelu") == 8);
    CHECK(g->n_nodes == 9 && count_op(g, TB_OP_GELU) == 8);
    CHECK(find_op(g, TB_OP_GELU, 0)->i[0] == 0 && find_op(g, TB_OP_GELU, 7)->i[0] == 1);
    tb_graph_free(g);

    /* near misses: x / 1.5; 0.4 for 0.5; 0.05 for 0.044715; erf(x / sqrt 2)
     * read twice; a (1, 16) constant that would not change the shape but is
     * 0.5 only in its first element */
    g = tb_graph_new();
    x = inputf(g, 2, xd);
    int a = N2(TB_OP_NN_ADD, N1(TB_OP_ERF, N2(TB_OP_DIV, x, scalar(g, 1.5f))), scalar(g, 1.0f));
    output(g, N2(TB_OP_MUL, N2(TB_OP_MUL, x, a), scalar(g, 0.5f)));
    a = N2(TB_OP_NN_ADD, N1(TB_OP_ERF, N2(TB_OP_DIV, x, scalar(g, 1.4142135f))), scalar(g, 1.0f));
    output(g, N2(TB_OP_MUL, N2(TB_OP_MUL, x, a), scalar(g, 0.4f)));
    output(g, gelu_tanh(g, x, 0, 0.05f));
    int e = N1(TB_OP_ERF, N2(TB_OP_DIV, x, scalar(g, 1.4142135f)));
    a = N2(TB_OP_NN_ADD, e, scalar(g, 1.0f));
    output(g, N2(TB_OP_MUL, N2(TB_OP_MUL, x, a), scalar(g, 0.5f)));
    output(g, e);
    float half[16] = {0.5f};
    a = N2(TB_OP_NN_ADD, N1(TB_OP_ERF, N2(TB_OP_DIV, x, scalar(g, 1.4142135f))), scalar(g, 1.0f));
    output(g, N2(TB_OP_MUL, N2(TB_OP_MUL, x, a), wvals(g, 2, (int64_t[]){1, 16}, half)));
    int before = g->n_nodes;
    CHECK(check_pass(g, tb_opt_fuse_gelu, "gelu-miss") == 0);
    CHECK(g->n_nodes == before && count_op(g, TB_OP_GELU) == 0);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- 7. attention */

static int perm(tb_graph *g, int x, int p0, int p1, int p2, int p3) {
    return NI(TB_OP_TRANSPOSE, ((int[]){x}), 1, p0, p1, p2, p3);
}

static void test_attention(void) {
    int64_t B = 2, H = 2, S = 5, D = 8;
    int64_t qd[4] = {B, H, S, D};
    /* BERT: MatMul(q, Transpose(k)) / sqrt(D) + mask (B, 1, 1, S) */
    tb_graph *g = tb_graph_new();
    int q = inputf(g, 4, qd), k = inputf(g, 4, qd), v = inputf(g, 4, qd);
    int mask = inputf(g, 4, (int64_t[]){B, 1, 1, S});
    int s = N2(TB_OP_NN_MATMUL, q, perm(g, k, 0, 1, 3, 2));
    s = N2(TB_OP_NN_ADD, N2(TB_OP_DIV, s, scalar(g, sqrtf((float)D))), mask);
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 3), v));
    /* k given as (B, H, D, T), scale as Mul, no mask */
    int kt = inputf(g, 4, (int64_t[]){B, H, D, S});
    s = N2(TB_OP_MUL, scalar1(g, 0.25f), N2(TB_OP_NN_MATMUL, q, kt));
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 3), v));
    /* GPT-2: Where(causal, scores, -FLT_MAX) */
    int causal = input(g, TB_BOOL, 4, (int64_t[]){1, 1, S, S});
    s = N2(TB_OP_DIV, N2(TB_OP_NN_MATMUL, q, perm(g, k, 0, 1, 3, 2)), scalar(g, 2.0f));
    s = node(g, TB_OP_WHERE, 3, (int[]){causal, s, scalar(g, -3.4028234663852886e38f)}, NULL, NULL);
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 3), v));
    CHECK(check_pass(g, tb_opt_fuse_attention, "attention") == 3);
    CHECK(count_op(g, TB_OP_SDPA) == 3 && count_op(g, TB_OP_SOFTMAX) == 0 && count_op(g, TB_OP_NN_MATMUL) == 0);
    const tb_node *a0 = find_op(g, TB_OP_SDPA, 0), *a1 = find_op(g, TB_OP_SDPA, 1), *a2 = find_op(g, TB_OP_SDPA, 2);
    CHECK(a0->i[1] == 0 && a0->i[2] == 1 && a0->n_in == 4 && fabsf(a0->f[0] - 1 / sqrtf(8)) < 1e-6f);
    CHECK(a1->i[1] == 1 && a1->i[2] == 0 && a1->n_in == 3 && a1->f[0] == 0.25f);
    CHECK(a2->i[2] == 1 && a2->n_in == 4 && count_op(g, TB_OP_WHERE) == 1);
    tb_graph_free(g);

    /* near misses: Softmax over axis 2; a scale that is a tensor; the
     * scores read twice; a Where whose fill is not large enough to vanish */
    g = tb_graph_new();
    q = inputf(g, 4, qd), k = inputf(g, 4, qd), v = inputf(g, 4, qd);
    s = N2(TB_OP_NN_MATMUL, q, perm(g, k, 0, 1, 3, 2));
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 2), v));
    s = N2(TB_OP_MUL, N2(TB_OP_NN_MATMUL, q, perm(g, k, 0, 1, 3, 2)), inputf(g, 4, (int64_t[]){B, H, S, S}));
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 3), v));
    s = N2(TB_OP_NN_MATMUL, q, perm(g, k, 0, 1, 3, 2));
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 3), v));
    output(g, s);
    causal = input(g, TB_BOOL, 4, (int64_t[]){1, 1, S, S});
    s = N2(TB_OP_NN_MATMUL, q, perm(g, k, 0, 1, 3, 2));
    s = node(g, TB_OP_WHERE, 3, (int[]){causal, s, scalar(g, -10000.0f)}, NULL, NULL);
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 3), v));
    int before = g->n_nodes;
    CHECK(check_pass(g, tb_opt_fuse_attention, "attention-miss") == 0);
    CHECK(g->n_nodes == before && count_op(g, TB_OP_SDPA) == 0);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- 8. transposes, reshapes */

static void test_transpose(void) {
    tb_graph *g = tb_graph_new();
    int a = inputf(g, 3, (int64_t[]){2, 6, 4}); /* read as (2, 4, 6) */
    int b = inputf(g, 2, (int64_t[]){5, 6});    /* read as (6, 5)    */
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_TRANSPOSE, ((int[]){a}), 1, 0, 2, 1), NI(TB_OP_TRANSPOSE, ((int[]){b}), 1, 1, 0)));
    int a2 = inputf(g, 2, (int64_t[]){4, 6});
    output(g, node(g, TB_OP_GEMM, 2, (int[]){a2, NI(TB_OP_TRANSPOSE, ((int[]){b}), 1, 1, 0)}, NULL,
                   (float[TB_NODE_FLOATS]){1, 1}));
    /* near miss: perm (1, 0, 2) is not the last two */
    int c = inputf(g, 3, (int64_t[]){4, 2, 6});
    output(g, N2(TB_OP_NN_MATMUL, NI(TB_OP_TRANSPOSE, ((int[]){c}), 1, 1, 0, 2), inputf(g, 2, (int64_t[]){6, 3})));
    CHECK(check_pass(g, tb_opt_fold_transpose_matmul, "transpose-matmul") == 3);
    CHECK(count_op(g, TB_OP_TRANSPOSE) == 1);
    const tb_node *m = find_op(g, TB_OP_NN_MATMUL, 0);
    CHECK(m->i[0] == 1 && m->i[1] == 1 && find_op(g, TB_OP_GEMM, 0)->i[1] == 1);
    tb_graph_free(g);

    g = tb_graph_new();
    int x = inputf(g, 4, (int64_t[]){2, 3, 4, 5});
    /* (0 2 1 3) then (0 1 3 2): one Transpose (0 2 3 1) */
    output(g, perm(g, perm(g, x, 0, 2, 1, 3), 0, 1, 3, 2));
    /* a pair that cancels feeds a Relu: both go */
    output(g, N1(TB_OP_RELU, perm(g, perm(g, x, 0, 2, 1, 3), 0, 2, 1, 3)));
    /* Reshape of a Reshape (and of a Flatten) */
    int r1 = NI(TB_OP_RESHAPE, ((int[]){x, i64s(g, 2, (int64_t[]){6, 20})}), 2, 0);
    output(g, NI(TB_OP_RESHAPE, ((int[]){r1, i64s(g, 3, (int64_t[]){2, -1, 5})}), 2, 0));
    int fl = NI(TB_OP_FLATTEN, ((int[]){x}), 1, 2);
    output(g, N1(TB_OP_EXP, NI(TB_OP_RESHAPE, ((int[]){fl, i64s(g, 4, (int64_t[]){2, 3, 4, 5})}), 2, 0)));
    /* near miss: a target with a 0 (copies a dim of its input) */
    int r2 = NI(TB_OP_RESHAPE, ((int[]){x, i64s(g, 2, (int64_t[]){6, 20})}), 2, 0);
    output(g, NI(TB_OP_RESHAPE, ((int[]){r2, i64s(g, 3, (int64_t[]){0, 4, 5})}), 2, 0));
    CHECK(check_pass(g, tb_opt_merge_transpose_reshape, "merge-transpose-reshape") == 6);
    CHECK(count_op(g, TB_OP_TRANSPOSE) == 1 && find_op(g, TB_OP_TRANSPOSE, 0)->i[1] == 2 &&
          find_op(g, TB_OP_TRANSPOSE, 0)->i[2] == 3 && find_op(g, TB_OP_TRANSPOSE, 0)->i[3] == 1);
    CHECK(count_op(g, TB_OP_RESHAPE) == 3 && count_op(g, TB_OP_FLATTEN) == 0);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- whole pipeline */

static int linear(tb_graph *g, int x, int64_t in, int64_t out) {
    int64_t wd[2] = {in, out};
    int y = N2(TB_OP_NN_MATMUL, x, weight(g, 2, wd, 1.0f / sqrtf((float)in), 0));
    return N2(TB_OP_NN_ADD, weight(g, 1, &out, 0.1f, 0), y);
}

/* (B, S, D) -> (B, H, S, hd), the reshape target built from Shape as
 * PyTorch exports it */
static int split_heads(tb_graph *g, int x, int64_t H, int64_t hd) {
    int sh = N1(TB_OP_SHAPE, x);
    int b = N2(TB_OP_UNSQUEEZE, NI(TB_OP_GATHER, ((int[]){sh, i64scalar(g, 0)}), 2, 0), i64s(g, 1, (int64_t[]){0}));
    int s = N2(TB_OP_UNSQUEEZE, NI(TB_OP_GATHER, ((int[]){sh, i64scalar(g, 1)}), 2, 0), i64s(g, 1, (int64_t[]){0}));
    int t = NI(TB_OP_CONCAT, ((int[]){b, s, i64s(g, 2, (int64_t[]){H, hd})}), 3, 0);
    return perm(g, NI(TB_OP_RESHAPE, ((int[]){x, t}), 2, 0), 0, 2, 1, 3);
}

/* A BERT encoder layer as PyTorch exports it (B 2, S 6, D 16, 2 heads of
 * 8, FFN 32); with `cross` v is projected from a second input (no q / k / v
 * merge possible there). */
static tb_graph *bert_layer(int cross) {
    int64_t B = 2, S = 6, D = 16, H = 2, hd = 8, F = 32;
    tb_graph *g = tb_graph_new();
    tb_graph_add_sym(g, "batch", B, B, B);
    int x = inputf(g, 3, (int64_t[]){TB_SYM(0), S, D});
    int am = inputf(g, 2, (int64_t[]){TB_SYM(0), S}); /* attention mask, random here */
    int xv = cross ? inputf(g, 3, (int64_t[]){TB_SYM(0), S, D}) : x;
    int ext = N2(TB_OP_MUL, N2(TB_OP_SUB, scalar(g, 1.0f), N2(TB_OP_UNSQUEEZE, N2(TB_OP_UNSQUEEZE, am, i64s(g, 1, (int64_t[]){1})), i64s(g, 1, (int64_t[]){2}))),
                 scalar(g, -10000.0f));
    int q = split_heads(g, linear(g, x, D, D), H, hd);
    int k = split_heads(g, linear(g, x, D, D), H, hd);
    int v = split_heads(g, linear(g, xv, D, D), H, hd);
    int s = N2(TB_OP_NN_MATMUL, q, perm(g, k, 0, 1, 3, 2));
    s = N2(TB_OP_NN_ADD, N2(TB_OP_DIV, s, scalar(g, sqrtf((float)hd))), ext);
    int p = N1(TB_OP_IDENTITY, NI(TB_OP_SOFTMAX, ((int[]){s}), 1, 3)); /* dropout */
    int ctx = perm(g, N2(TB_OP_NN_MATMUL, p, v), 0, 2, 1, 3);
    ctx = NI(TB_OP_RESHAPE, ((int[]){ctx, i64s(g, 3, (int64_t[]){B, S, D})}), 2, 0);
    int h = N2(TB_OP_NN_ADD, N1(TB_OP_IDENTITY, linear(g, ctx, D, D)), x);
    h = layernorm_pattern(g, h, D, 0, 1, 1e-12f, 2);
    int f = gelu_erf(g, linear(g, h, D, F), 0);
    int o = N2(TB_OP_NN_ADD, linear(g, f, F, D), h);
    o = layernorm_pattern(g, o, D, 0, 1, 1e-12f, 2);
    output(g, o);
    return g;
}

static void test_bert_layer(void) {
    tb_graph *g = bert_layer(0);
    int before = g->n_nodes, n;
    const tb_pass *passes = tb_opt_nn_pipeline(&n);
    CHECK(check_passes(g, passes, n, "bert-layer") > 0);
    printf("bert layer: %d -> %d nodes\n", before, g->n_nodes);
    CHECK(count_op(g, TB_OP_SDPA) == 1 && count_op(g, TB_OP_LAYERNORM) == 2 && count_op(g, TB_OP_SOFTMAX) == 0);
    CHECK(count_op(g, TB_OP_SHAPE) == 0 && count_op(g, TB_OP_CONCAT) == 0 && count_op(g, TB_OP_IDENTITY) == 0);
    CHECK(count_op(g, TB_OP_ERF) == 0 && count_op(g, TB_OP_GELU) == 0 && count_op(g, TB_OP_NN_ADD) == 0);
    CHECK(count_op(g, TB_OP_NN_MATMUL) == 6);
    int gelu = 0, res = 0, bias = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const tb_node *m = &g->nodes[i];
        if (m->op != TB_OP_NN_MATMUL) continue;
        gelu += m->i[2] == TB_NN_ACT_GELU_ERF;
        res += !!(m->i[3] & TB_NN_HAS_RESIDUAL);
        bias += !!(m->i[3] & TB_NN_HAS_BIAS);
    }
    CHECK(gelu == 1 && res == 2 && bias == 6);
    /* what is left: 6 MatMul, 3 Reshape + 3 Transpose (heads; k's two
     * Transposes merged into one (0 2 3 1), read by sdpa as (B, H, D, T)),
     * sdpa, Transpose + Reshape (merge heads), 2 LayerNorm, the mask
     * arithmetic on the input (2 Unsqueeze, Sub, Mul) */
    CHECK_MSG(g->n_nodes == 21, "%d nodes", g->n_nodes);
    tb_graph_free(g);
}

/* The pipeline for the cuda backend: attention-heads folds the head split /
 * merge Reshapes and Transposes into sdpa's heads layout, merge-qkv the
 * three projections into one MatMul read packed; with v projected from
 * another input only the first applies. Outputs compared as for every pass. */
static void test_bert_layer_cuda(void) {
    opt_device = "cuda";
    int n;
    const tb_pass *passes = tb_opt_nn_pipeline(&n);
    for (int cross = 0; cross < 2; cross++) {
        tb_graph *g = bert_layer(cross);
        CHECK(check_passes(g, passes, n, cross ? "bert-layer-cuda-cross" : "bert-layer-cuda") > 0);
        printf("bert layer for cuda%s: %d nodes\n", cross ? " (v from another input)" : "", g->n_nodes);
        const tb_node *a = find_op(g, TB_OP_SDPA, 0);
        CHECK(a && count_op(g, TB_OP_SDPA) == 1 && a->i[3] == 2 && a->i[1] == 0 && a->i[4] == !cross);
        CHECK(count_op(g, TB_OP_TRANSPOSE) == 0 && count_op(g, TB_OP_RESHAPE) == 0);
        CHECK(count_op(g, TB_OP_NN_MATMUL) == (cross ? 6 : 4));
        if (a && !cross) {
            CHECK(a->in[0] == a->in[1] && a->in[1] == a->in[2]);
            const tb_value *qkv = &g->values[a->in[0]];
            CHECK(qkv->rank == 3 && qkv->dims[2] == 48);
        }
        /* 21 of the cpu pipeline less 3 + 3 head split, 2 head merge
         * nodes, and 2 of the 3 projections where they merge */
        CHECK_MSG(g->n_nodes == (cross ? 13 : 11), "%d nodes", g->n_nodes);
        tb_graph_free(g);
    }
    /* near miss: q's projection also read elsewhere (a graph output) stays
     * unmerged; the heads layout still applies */
    {
        tb_graph *g = bert_layer(0);
        int sd = -1;
        for (int k = 0; k < g->n_nodes && sd < 0; k++)
            if (g->nodes[k].op == TB_OP_NN_ADD && g->values[g->nodes[k].out[0]].rank == 3) sd = g->nodes[k].out[0];
        CHECK(sd >= 0);
        if (sd >= 0) output(g, sd); /* the first bias Add: q's projection */
        CHECK(check_passes(g, passes, n, "bert-layer-cuda-miss") > 0);
        const tb_node *a = find_op(g, TB_OP_SDPA, 0);
        CHECK(a && a->i[3] == 2 && a->i[4] == 0 && count_op(g, TB_OP_NN_MATMUL) == 6);
        tb_graph_free(g);
    }
    opt_device = "";
}

/* GPT-2's attention for cuda: one projection to (B, S, 3D) split in three,
 * a causal bool mask through Where. attention-heads and then merge-qkv
 * (the Split read packed) leave the projection, sdpa and the output
 * projection. */
static void test_gpt2_attention_cuda(void) {
    int64_t B = 2, S = 6, D = 16, H = 2, hd = 8;
    tb_graph *g = tb_graph_new();
    tb_graph_add_sym(g, "batch", 1, B, 4);
    int x = inputf(g, 3, (int64_t[]){TB_SYM(0), S, D});
    int causal = input(g, TB_BOOL, 4, (int64_t[]){1, 1, S, S});
    int qkv = linear(g, x, D, 3 * D);
    const char *names[3] = {"split_q", "split_k", "split_v"};
    int k = tb_graph_add_node_ex(g, TB_OP_SPLIT, (int[]){qkv, i64s(g, 3, (int64_t[]){D, D, D})}, 2, names, 3,
                                 (int32_t[TB_NODE_INTS]){2, 3}, NULL);
    CHECK_MSG(k >= 0, "Split: %s", tb_last_error());
    if (k < 0) { tb_graph_free(g); return; }
    int sq = g->nodes[k].out[0], sk = g->nodes[k].out[1], sv = g->nodes[k].out[2];
    int q = split_heads(g, sq, H, hd), kk = split_heads(g, sk, H, hd), v = split_heads(g, sv, H, hd);
    int sc = N2(TB_OP_DIV, N2(TB_OP_NN_MATMUL, q, perm(g, kk, 0, 1, 3, 2)), scalar(g, sqrtf((float)hd)));
    sc = node(g, TB_OP_WHERE, 3, (int[]){causal, sc, scalar(g, -3.4e38f)}, NULL, NULL);
    int p = NI(TB_OP_SOFTMAX, ((int[]){sc}), 1, 3);
    int sh = N1(TB_OP_SHAPE, x);
    int ctx = perm(g, N2(TB_OP_NN_MATMUL, p, v), 0, 2, 1, 3);
    ctx = NI(TB_OP_RESHAPE, ((int[]){ctx, sh}), 2, 0);
    output(g, linear(g, ctx, D, D));
    opt_device = "cuda";
    int n;
    const tb_pass *passes = tb_opt_nn_pipeline(&n);
    CHECK(check_passes(g, passes, n, "gpt2-attention-cuda") > 0);
    opt_device = "";
    printf("gpt2 attention for cuda: %d nodes\n", g->n_nodes);
    const tb_node *a = find_op(g, TB_OP_SDPA, 0);
    CHECK(a && a->i[3] == 2 && a->i[4] == 1 && a->in[0] == a->in[1] && a->in[0] == a->in[2]);
    CHECK(count_op(g, TB_OP_SPLIT) == 0 && count_op(g, TB_OP_TRANSPOSE) == 0 && count_op(g, TB_OP_RESHAPE) == 0);
    CHECK(count_op(g, TB_OP_NN_MATMUL) == 2);
    tb_graph_free(g);
}

static void test_resnet_block(void) {
    tb_graph *g = tb_graph_new();
    int64_t C = 8;
    int x = inputf(g, 4, (int64_t[]){2, C, 6, 6});
    int y = N1(TB_OP_RELU, bn(g, conv(g, x, C, C, 0, 0), C));
    y = bn(g, conv(g, y, C, C, 0, 0), C);
    /* downsample-free block: identity shortcut; then one with a 1x1 conv */
    y = N1(TB_OP_RELU, N2(TB_OP_NN_ADD, y, x));
    int z = N1(TB_OP_RELU, bn(g, conv(g, y, C, C, 0, 0), C));
    z = bn(g, conv(g, z, C, C, 0, 0), C);
    int64_t wd[4] = {C, C, 1, 1};
    int sc = bn(g, node(g, TB_OP_CONV, 2, (int[]){y, weight(g, 4, wd, 0.3f, 0)}, (int32_t[TB_NODE_INTS]){1}, NULL), C);
    z = N1(TB_OP_RELU, N2(TB_OP_NN_ADD, sc, z));
    output(g, z);
    int before = g->n_nodes, n;
    const tb_pass *passes = tb_opt_nn_pipeline(&n);
    CHECK(check_passes(g, passes, n, "resnet-block") > 0);
    printf("resnet block: %d -> %d nodes\n", before, g->n_nodes);
    CHECK(g->n_nodes == 5 && count_op(g, TB_OP_CONV) == 5);
    int after_res = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const tb_node *m = &g->nodes[i];
        after_res += m->i[10] == TB_NN_ACT_RELU &&
                     m->i[11] == (TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL);
    }
    CHECK(after_res == 2);
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- memory plan */

static void check_plan(const tb_graph *g, const uint64_t *bytes) {
    int nv = g->n_values, nn = g->n_nodes;
    uint64_t *off = malloc((size_t)nv * sizeof *off), arena = 0, total = 0;
    CHECK(tb_plan_memory(g, bytes, off, &arena) == TB_OK);
    int *first = malloc((size_t)nv * sizeof *first), *last = malloc((size_t)nv * sizeof *last);
    for (int v = 0; v < nv; v++) first[v] = last[v] = -1;
    for (int k = 0; k < nn; k++) {
        const tb_node *n = &g->nodes[k];
        for (int o = 0; o < n->n_out; o++) { first[n->out[o]] = k; if (last[n->out[o]] < k) last[n->out[o]] = k; }
        for (int i = 0; i < n->n_in; i++) if (last[n->in[i]] < k) last[n->in[i]] = k;
    }
    for (int i = 0; i < g->n_outputs; i++) last[g->outputs[i]] = nn;
    int overlaps = 0, placed = 0;
    for (int a = 0; a < nv; a++) {
        if (!bytes[a]) { CHECK(off[a] == UINT64_MAX); continue; }
        placed++;
        total += (bytes[a] + TB_PLAN_ALIGN - 1) / TB_PLAN_ALIGN * TB_PLAN_ALIGN;
        CHECK(off[a] % TB_PLAN_ALIGN == 0 && off[a] + bytes[a] <= arena);
        int fa = first[a] < 0 ? 0 : first[a], la = last[a] < fa ? fa : last[a];
        for (int b = a + 1; b < nv; b++) {
            if (!bytes[b]) continue;
            int fb = first[b] < 0 ? 0 : first[b], lb = last[b] < fb ? fb : last[b];
            int live_together = fa <= lb && fb <= la;
            int overlap = off[a] < off[b] + bytes[b] && off[b] < off[a] + bytes[a];
            overlaps += live_together && overlap;
        }
    }
    CHECK(overlaps == 0);
    CHECK(arena <= total);
    CHECK(placed > 0);
    free(off); free(first); free(last);
}

static void test_memory_plan(void) {
    /* a chain with a long-lived skip value and varied sizes */
    tb_graph *g = tb_graph_new();
    tb_graph_add_sym(g, "n", 1, 4, 16);
    int x = inputf(g, 2, (int64_t[]){TB_SYM(0), 64});
    int skip = N1(TB_OP_RELU, x);
    int y = skip;
    for (int i = 0; i < 6; i++) {
        int64_t wd[2] = {64, i % 2 ? 64 : 128};
        if (i % 2) wd[0] = 128;
        y = N1(TB_OP_TANH, N2(TB_OP_NN_MATMUL, y, weight(g, 2, wd, 0.1f, 0)));
    }
    y = N2(TB_OP_NN_ADD, y, skip);
    output(g, N1(TB_OP_SIGMOID, y));
    uint64_t unplanned, planned;
    int dyn;
    CHECK(tb_plan_memory_report(g, NULL, &unplanned, &planned, &dyn) == TB_OK);
    printf("memory plan: %llu bytes without reuse, %llu planned\n", (unsigned long long)unplanned,
           (unsigned long long)planned);
    CHECK(dyn == 0 && planned < unplanned && planned > 0);
    /* the executor's call: concrete sizes, graph inputs / outputs left out */
    uint64_t *bytes = calloc((size_t)g->n_values, sizeof *bytes);
    for (int v = 0; v < g->n_values; v++) {
        const tb_value *val = &g->values[v];
        if (val->kind != TB_VAL_ACT || v == g->outputs[0]) continue;
        int64_t sym[1] = {7};
        CHECK(tb_value_bytes(g, val, sym, &bytes[v]) == TB_OK);
    }
    check_plan(g, bytes);
    /* the same with every activation and the input in the arena, odd sizes */
    for (int v = 0; v < g->n_values; v++) bytes[v] = g->values[v].kind == TB_VAL_WEIGHT ? 0 : 100 + 37 * (uint64_t)v;
    check_plan(g, bytes);
    free(bytes);
    tb_graph_free(g);
}

int main(void) {
    test_identity();
    test_fold();
    test_batchnorm();
    test_epilogue();
    test_epilogue_dynamic();
    test_layernorm();
    test_gelu();
    test_attention();
    test_transpose();
    test_bert_layer();
    test_bert_layer_cuda();
    test_gpt2_attention_cuda();
    test_resnet_block();
    test_memory_plan();
    return tb_test_finish("test_passes");
}
