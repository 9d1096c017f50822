/*
 * test_onnx_import.c — the ONNX front end (import/onnx.h) on small models that
 * tests/onnx_import/gen_models.py writes with onnx.helper at test time:
 * graphs, symbols and profiles, initializers in every storage form, external
 * data, and every refusal with its message. Model cases whose ops this build
 * does not define yet are skipped (and say so); a build without the importer
 * checks that it says which package was missing.
 */
#include <unistd.h>

#include "import/onnx.h"
#include "ir/ops.h"
#include "ir/ops_nn.h"
#include "tb_test.h"

#include <sys/wait.h>

static char dir[1024];

static const char *model(const char *name) {
    static char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static int has_ops(const tb_op_kind *ops, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (!tb_op_get_def(ops[i])) {
            printf("skip %s: op %s is not defined in this build\n", what, tb_nn_onnx_name(ops[i]));
            return 0;
        }
    return 1;
}

/* imports `name`, expects status `want` and every one of the NULL-terminated
 * fragments in the message */
static void expect_error(const char *name, const tb_onnx_options *o, tb_status want, const char *const *frags) {
    tb_graph *g = (tb_graph *)1;
    tb_status s = tb_onnx_import(model(name), o, &g);
    CHECK_MSG(s == want, "%s: status %s, want %s (%s)", name, tb_status_str(s), tb_status_str(want), tb_last_error());
    CHECK_MSG(g == NULL, "%s: graph set on failure", name);
    for (int i = 0; frags[i]; i++)
        CHECK_MSG(strstr(tb_last_error(), frags[i]) != NULL, "%s: message '%s' lacks '%s'", name, tb_last_error(),
                  frags[i]);
    tb_graph_free(g);
}

static int find(const tb_graph *g, const char *name) { return tb_graph_find_value(g, name); }

static int count_op(const tb_graph *g, tb_op_kind op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static void test_shapes_text(void) {
    tb_onnx_shape_spec sp[4];
    int n = 0;
    CHECK(tb_onnx_parse_shapes("input_ids:1x128,x:0:2x3x4", 3, sp, &n, 4) == TB_OK);
    CHECK(n == 2 && !strcmp(sp[0].name, "input_ids") && sp[0].rank == 2 && sp[0].min[1] == 128 && sp[0].max[0] == 1);
    CHECK(!strcmp(sp[1].name, "x:0") && sp[1].rank == 3 && sp[1].opt[2] == 4);
    CHECK(tb_onnx_parse_shapes("input_ids:8x512", 2, sp, &n, 4) == TB_OK);
    CHECK(n == 2 && sp[0].min[1] == 128 && sp[0].opt[1] == 128 && sp[0].max[1] == 512 && sp[0].max[0] == 8);
    CHECK(tb_onnx_parse_shapes("input_ids:8", 2, sp, &n, 4) == TB_ERR_INVALID_ARG);
    CHECK(strstr(tb_last_error(), "input_ids") != NULL);
    CHECK(tb_onnx_parse_shapes("a:1xx2", 3, sp, &n, 4) == TB_ERR_INVALID_ARG);
    CHECK(tb_onnx_parse_shapes("a:1x", 3, sp, &n, 4) == TB_ERR_INVALID_ARG);
    CHECK(tb_onnx_parse_shapes("nocolon", 3, sp, &n, 4) == TB_ERR_INVALID_ARG);
    CHECK(tb_onnx_parse_shapes("a:-1", 3, sp, &n, 4) == TB_ERR_INVALID_ARG);
    CHECK(tb_onnx_parse_shapes("a:1,b:2,c:3", 3, sp, &n, 4) == TB_ERR_INVALID_ARG); /* past cap */
    n = 0;
    CHECK(tb_onnx_parse_shapes("#1:,#0:2x3", 3, sp, &n, 4) == TB_OK); /* a scalar; inputs by position */
    CHECK(n == 2 && !strcmp(sp[0].name, "#1") && sp[0].rank == 0 && sp[1].rank == 2);
}

static void test_conv_relu(void) {
    tb_op_kind ops[] = {TB_OP_CONV, TB_OP_RELU};
    if (!has_ops(ops, 2, "conv_relu")) return;
    tb_graph *g = NULL;
    tb_status s = tb_onnx_import(model("conv_relu.onnx"), NULL, &g);
    CHECK_MSG(s == TB_OK, "conv_relu: %s", tb_last_error());
    if (s != TB_OK) return;
    CHECK(g->n_inputs == 1 && g->n_outputs == 1 && g->n_nodes == 2 && g->n_syms == 0);
    const tb_value *y = &g->values[g->outputs[0]];
    CHECK(!strcmp(y->name, "Y") && y->rank == 4 && y->dtype == TB_F32);
    CHECK(y->dims[0] == 1 && y->dims[1] == 4 && y->dims[2] == 8 && y->dims[3] == 8);
    const tb_node *c = &g->nodes[0];
    CHECK(c->op == TB_OP_CONV && c->n_in == 3);
    CHECK(c->i[0] == 1 && c->i[1] == 1 && c->i[2] == 1);                            /* group, strides */
    CHECK(c->i[3] == 1 && c->i[4] == 1 && c->i[5] == 1 && c->i[6] == 1);            /* pads */
    CHECK(c->i[7] == 1 && c->i[8] == 1 && c->i[9] == 0 && c->i[11] == TB_NN_HAS_BIAS); /* dilations, flags */
    int w = find(g, "W");
    CHECK(w >= 0 && g->values[w].kind == TB_VAL_WEIGHT && g->values[w].nbytes == 4 * 3 * 3 * 3 * 4);
    if (w >= 0) CHECK(fabsf(((const float *)g->values[w].data)[5] - 0.05f) < 1e-7f);
    CHECK(g->values[g->inputs[0]].kind == TB_VAL_INPUT && !strcmp(g->values[g->inputs[0]].name, "X"));
    tb_graph_free(g);
}

static void test_matmul_add(void) {
    tb_op_kind ops[] = {TB_OP_NN_MATMUL, TB_OP_NN_ADD};
    if (!has_ops(ops, 2, "matmul_add")) return;
    /* the batch is symbolic: without a profile it is refused naming it */
    const char *frags[] = {"input 'X' dim 0 ('batch') is symbolic", "--shapes", "--min-shapes", NULL};
    expect_error("matmul_add.onnx", NULL, TB_ERR_INVALID_ARG, frags);

    tb_onnx_shape_spec sp[2];
    int n = 0;
    CHECK(tb_onnx_parse_shapes("X:1x4", 0, sp, &n, 2) == TB_OK);
    CHECK(tb_onnx_parse_shapes("X:4x4", 1, sp, &n, 2) == TB_OK);
    CHECK(tb_onnx_parse_shapes("X:8x4", 2, sp, &n, 2) == TB_OK);
    tb_onnx_options o = {sp, n};
    tb_graph *g = NULL;
    tb_status s = tb_onnx_import(model("matmul_add.onnx"), &o, &g);
    CHECK_MSG(s == TB_OK, "matmul_add: %s", tb_last_error());
    if (s != TB_OK) return;
    CHECK(g->n_syms == 1 && !strcmp(g->syms[0].name, "batch"));
    CHECK(g->syms[0].min == 1 && g->syms[0].opt == 4 && g->syms[0].max == 8);
    CHECK(g->n_inputs == 1); /* Wm is an initializer too: a weight */
    int wm = find(g, "Wm");
    CHECK(wm >= 0 && g->values[wm].kind == TB_VAL_WEIGHT);
    const tb_value *y = &g->values[g->outputs[0]];
    CHECK(!strcmp(y->name, "Y") && y->rank == 2 && y->dims[0] == TB_SYM(0) && y->dims[1] == 5);
    tb_graph_free(g);

    /* the same by position */
    n = 0;
    CHECK(tb_onnx_parse_shapes("#0:3x4", 3, sp, &n, 2) == TB_OK);
    o.n_shapes = n;
    s = tb_onnx_import(model("matmul_add.onnx"), &o, &g);
    /* a fixed profile makes the dim a number, not a symbol */
    CHECK_MSG(s == TB_OK && g->n_syms == 0 && g->values[g->inputs[0]].dims[0] == 3, "#0: %s", tb_last_error());
    tb_graph_free(g);
    const char *f4[] = {"'#1', which is not an input", NULL};
    n = 0;
    CHECK(tb_onnx_parse_shapes("#0:3x4,#1:2", 3, sp, &n, 2) == TB_OK);
    o.n_shapes = n;
    expect_error("matmul_add.onnx", &o, TB_ERR_INVALID_ARG, f4);
    /* a fixed dim that the shapes contradict, and a shape for no input */
    n = 0;
    CHECK(tb_onnx_parse_shapes("X:2x3", 3, sp, &n, 2) == TB_OK);
    const char *f2[] = {"input 'X' dim 1 is 4 in the model", NULL};
    expect_error("matmul_add.onnx", &o, TB_ERR_INVALID_ARG, f2);
    n = 0;
    CHECK(tb_onnx_parse_shapes("X:2x4,Q:1", 3, sp, &n, 2) == TB_OK);
    o.n_shapes = n;
    const char *f3[] = {"'Q', which is not an input", "inputs: 'X'", NULL};
    expect_error("matmul_add.onnx", &o, TB_ERR_INVALID_ARG, f3);
}

static void test_shape_chain(void) {
    tb_op_kind ops[] = {TB_OP_SHAPE, TB_OP_GATHER, TB_OP_UNSQUEEZE, TB_OP_CONCAT, TB_OP_RESHAPE,
                        TB_OP_CAST, TB_OP_MUL, TB_OP_IDENTITY, TB_OP_SOFTMAX};
    if (!has_ops(ops, 9, "shape_chain")) return;
    tb_onnx_shape_spec sp[2];
    int n = 0;
    CHECK(tb_onnx_parse_shapes("x:1x1x8", 0, sp, &n, 2) == TB_OK);
    CHECK(tb_onnx_parse_shapes("x:2x16x8", 1, sp, &n, 2) == TB_OK);
    CHECK(tb_onnx_parse_shapes("x:4x64x8", 2, sp, &n, 2) == TB_OK);
    tb_onnx_options o = {sp, n};
    tb_graph *g = NULL;
    tb_status s = tb_onnx_import(model("shape_chain.onnx"), &o, &g);
    CHECK_MSG(s == TB_OK, "shape_chain: %s", tb_last_error());
    if (s != TB_OK) return;
    /* batch and seq are shared by ids and x: two symbols, profiles from x */
    CHECK(g->n_syms == 2 && g->n_inputs == 2);
    int b = tb_graph_find_sym(g, "batch"), q = tb_graph_find_sym(g, "seq");
    CHECK(b >= 0 && q >= 0);
    if (b >= 0 && q >= 0) {
        CHECK(g->syms[b].min == 1 && g->syms[b].opt == 2 && g->syms[b].max == 4);
        CHECK(g->syms[q].min == 1 && g->syms[q].opt == 16 && g->syms[q].max == 64);
        const tb_value *ids = &g->values[g->inputs[0]], *x = &g->values[g->inputs[1]];
        CHECK(!strcmp(ids->name, "ids") && ids->dtype == TB_I64 && ids->dims[0] == TB_SYM(b) && ids->dims[1] == TB_SYM(q));
        CHECK(!strcmp(x->name, "x") && x->dims[0] == TB_SYM(b) && x->dims[1] == TB_SYM(q) && x->dims[2] == 8);
    }
    const tb_value *y = &g->values[g->outputs[0]];
    CHECK(!strcmp(y->name, "y") && y->rank == 4 && y->dtype == TB_F32);
    /* Dropout became Identity; Softmax's axis -1 normalised; Gather's -1 too */
    CHECK(count_op(g, TB_OP_IDENTITY) == 1);
    for (int i = 0; i < g->n_nodes; i++) {
        const tb_node *nd = &g->nodes[i];
        if (nd->op == TB_OP_SOFTMAX) CHECK(nd->i[0] == 2);
        if (nd->op == TB_OP_CONCAT) CHECK(nd->i[0] == 0 && nd->n_in == 3);
        if (nd->op == TB_OP_CAST) CHECK(nd->i[0] == TB_F32);
        if (nd->op == TB_OP_GATHER) CHECK(nd->i[0] == 0);
    }
    /* Constants are weights of their kind */
    int i0 = find(g, "i0"), tail = find(g, "tail"), half = find(g, "half");
    CHECK(i0 >= 0 && g->values[i0].kind == TB_VAL_WEIGHT && g->values[i0].dtype == TB_I64 && g->values[i0].rank == 0);
    CHECK(tail >= 0 && g->values[tail].rank == 1 && g->values[tail].dims[0] == 2 &&
          ((const int64_t *)g->values[tail].data)[1] == 4);
    CHECK(half >= 0 && g->values[half].dtype == TB_F32 && *(const float *)g->values[half].data == 0.5f);
    /* the long name is shortened to a unique name that keeps its start */
    int found = 0;
    for (int i = 0; i < g->n_values; i++) {
        const char *nm = g->values[i].name;
        if (!strncmp(nm, "encoder/layer_0/attention/self/very_long", 40)) {
            found++;
            CHECK(strlen(nm) == TB_NAME_LEN - 1 && strchr(nm, '~'));
        }
    }
    CHECK(found == 1);
    tb_graph_free(g);
}

static const void *wdata(const tb_graph *g, const char *name, int *v) {
    *v = find(g, name);
    CHECK_MSG(*v >= 0 && g->values[*v].kind == TB_VAL_WEIGHT, "no weight %s", name);
    return *v >= 0 ? g->values[*v].data : NULL;
}

/* the node that writes value `name` */
static const tb_node *writer(const tb_graph *g, const char *name) {
    int v = find(g, name);
    for (int i = 0; v >= 0 && i < g->n_nodes; i++)
        for (int o = 0; o < g->nodes[i].n_out; o++)
            if (g->nodes[i].out[o] == v) return &g->nodes[i];
    CHECK_MSG(0, "no node writes %s", name);
    return NULL;
}

static int ints_are(const tb_node *n, const int32_t *want, int k) {
    for (int i = 0; i < k; i++)
        if (n->i[i] != want[i]) return 0;
    return 1;
}

static void test_ops_misc(void) {
    tb_op_kind ops[] = {TB_OP_MAXPOOL, TB_OP_AVGPOOL, TB_OP_GLOBAL_AVGPOOL, TB_OP_RESIZE, TB_OP_FLATTEN,
                        TB_OP_TRANSPOSE, TB_OP_REDUCE_MEAN, TB_OP_GEMM, TB_OP_CLIP, TB_OP_CONSTANT_OF_SHAPE,
                        TB_OP_SPLIT, TB_OP_SHAPE, TB_OP_TRILU, TB_OP_LAYERNORM, TB_OP_BATCHNORM, TB_OP_SLICE,
                        TB_OP_CONCAT, TB_OP_CONV};
    if (!has_ops(ops, (int)(sizeof ops / sizeof ops[0]), "ops_misc")) return;
    tb_graph *g = NULL;
    tb_status s = tb_onnx_import(model("ops_misc.onnx"), NULL, &g);
    CHECK_MSG(s == TB_OK, "ops_misc: %s", tb_last_error());
    if (s != TB_OK) return;
    const tb_node *n;
    /* pools: kernel, strides, pads (t, l, b, r), dilations, ceil, count_include_pad, auto_pad */
    if ((n = writer(g, "mp"))) CHECK(ints_are(n, (const int32_t[]){2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0, 0, 0}, 13));
    if ((n = writer(g, "ap"))) CHECK(ints_are(n, (const int32_t[]){3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0}, 13));
    /* 1-d: the w entries, h = 1 */
    if ((n = writer(g, "mp1"))) CHECK(ints_are(n, (const int32_t[]){1, 2, 1, 1, 0, 0, 0, 0, 1, 1}, 10));
    if ((n = writer(g, "c1"))) CHECK(ints_are(n, (const int32_t[]){1, 1, 2, 0, 2, 0, 2, 1, 1, 0, 0, 0}, 12));
    /* Resize: x and scales or sizes; mode, coordinates, nearest mode */
    if ((n = writer(g, "rz")))
        CHECK(n->n_in == 2 && n->in[1] == find(g, "scales") && n->i[0] == TB_NN_RESIZE_LINEAR &&
              n->i[1] == TB_NN_COORD_ALIGN_CORNERS && n->f[0] == -0.75f);
    if ((n = writer(g, "rs")))
        CHECK(n->n_in == 2 && n->in[1] == find(g, "sizes") && n->i[0] == TB_NN_RESIZE_NEAREST &&
              n->i[1] == TB_NN_COORD_HALF_PIXEL && n->i[2] == TB_NN_NEAREST_FLOOR);
    if ((n = writer(g, "fl"))) CHECK(n->i[0] == 1);
    if ((n = writer(g, "tr"))) CHECK(ints_are(n, (const int32_t[]){3, 2, 1, 0}, 4));
    if ((n = writer(g, "rm"))) CHECK(n->n_in == 1 && n->i[0] == 0 && n->i[1] == 12 && n->i[2] == 0);
    if ((n = writer(g, "gm")))
        CHECK(n->n_in == 3 && n->i[0] == 0 && n->i[1] == 1 && n->i[3] == TB_NN_HAS_BIAS && n->f[0] == 0.5f &&
              n->f[1] == 1.0f);
    if ((n = writer(g, "cl"))) { /* min left out, max given: min = -inf */
        CHECK(n->n_in == 3 && n->in[2] == find(g, "maxc"));
        const tb_value *mn = &g->values[n->in[1]];
        CHECK(mn->kind == TB_VAL_WEIGHT && mn->rank == 0 && isinf(*(const float *)mn->data) &&
              *(const float *)mn->data < 0);
    }
    if ((n = writer(g, "co"))) {
        const tb_value *v = &g->values[n->in[1]];
        CHECK(n->n_in == 2 && v->dtype == TB_F32 && *(const float *)v->data == 0.0f);
    }
    if ((n = writer(g, "sp0"))) CHECK(n->n_out == 2 && n->n_in == 2 && n->i[0] == 1 && n->i[1] == 2);
    if ((n = writer(g, "sh"))) CHECK(n->i[0] == 1 && n->i[1] == -1 && n->i[2] == 1);
    if ((n = writer(g, "tl"))) CHECK(n->i[0] == 0);
    if ((n = writer(g, "ln"))) CHECK(n->n_in == 3 && n->i[0] == 1 && fabsf(n->f[0] - 1e-3f) < 1e-9f);
    if ((n = writer(g, "bn"))) CHECK(n->n_in == 5 && fabsf(n->f[0] - 1e-3f) < 1e-9f);
    if ((n = writer(g, "sl"))) { /* steps without axes: axes 0 .. len(starts) - 1 filled */
        const tb_value *ax = &g->values[n->in[3]];
        CHECK(n->n_in == 5 && ax->dtype == TB_I64 && ax->dims[0] == 1 && ((const int64_t *)ax->data)[0] == 0);
    }
    /* Concat of 10: chained through TB_MAX_INPUTS */
    const tb_value *cat = &g->values[find(g, "cat")];
    CHECK(cat->rank == 4 && cat->dims[1] == 30 && count_op(g, TB_OP_CONCAT) == 2);
    tb_graph_free(g);
}

static void test_typed(void) {
    tb_op_kind ops[] = {TB_OP_IDENTITY};
    if (!has_ops(ops, 1, "typed")) return;
    tb_graph *g = NULL;
    tb_status s = tb_onnx_import(model("typed.onnx"), NULL, &g);
    CHECK_MSG(s == TB_OK, "typed: %s", tb_last_error());
    if (s != TB_OK) return;
    CHECK(g->n_inputs == 0 && g->n_outputs == 9);
    int v;
#define W(name) wdata(g, name, &v)
    const float *f32 = W("t_f32");
    if (f32) CHECK(f32[0] == 1.5f && f32[1] == -2.0f && f32[2] == 3.25f && g->values[v].dtype == TB_F32);
    const uint16_t *f16 = W("t_f16");
    if (f16) CHECK(g->values[v].dtype == TB_F16 && tb_f16_to_f32(f16[0]) == 1.0f && tb_f16_to_f32(f16[1]) == -0.5f);
    const int64_t *i64 = W("t_i64");
    if (i64) CHECK(g->values[v].dtype == TB_I64 && i64[0] == -7 && i64[1] == (int64_t)1 << 40);
    const int32_t *i32 = W("t_i32");
    if (i32) CHECK(g->values[v].dtype == TB_I32 && i32[0] == -3 && i32[1] == 100000);
    const int8_t *i8 = W("t_i8");
    if (i8) CHECK(g->values[v].dtype == TB_I8 && i8[0] == -128 && i8[1] == 127);
    const uint8_t *u8 = W("t_u8");
    if (u8) CHECK(g->values[v].dtype == TB_U8 && u8[0] == 0 && u8[1] == 255);
    const uint8_t *bl = W("t_bool");
    if (bl) CHECK(g->values[v].dtype == TB_BOOL && bl[0] == 1 && bl[1] == 0 && bl[2] == 1);
    const double *f64 = W("t_f64");
    if (f64) CHECK(g->values[v].dtype == TB_F64 && f64[0] == 0.125);
    const float *sc = W("t_scalar");
    if (sc) CHECK(g->values[v].rank == 0 && sc[0] == 42.0f);
#undef W
    tb_graph_free(g);
}

static void test_external(void) {
    tb_op_kind ops[] = {TB_OP_NN_MATMUL, TB_OP_NN_ADD, TB_OP_IDENTITY};
    if (!has_ops(ops, 3, "external")) return;
    tb_graph *g = NULL;
    tb_status s = tb_onnx_import(model("external.onnx"), NULL, &g);
    CHECK_MSG(s == TB_OK, "external: %s", tb_last_error());
    if (s == TB_OK) {
        int w = find(g, "We"), b = find(g, "Be");
        CHECK(w >= 0 && b >= 0);
        if (w >= 0 && b >= 0) {
            const float *wd = g->values[w].data, *bd = g->values[b].data;
            CHECK(g->values[w].nbytes == 80 && wd[0] == 0.0f && wd[19] == 9.5f);
            CHECK(g->values[b].nbytes == 20 && bd[0] == 0.0f && bd[4] == -4.0f);
        }
        tb_graph_free(g);
    }
    /* the same bytes from memory: external data needs a folder */
    FILE *f = fopen(model("external.onnx"), "rb");
    CHECK(f != NULL);
    if (f) {
        static uint8_t buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        s = tb_onnx_import_buffer(buf, n, NULL, NULL, &g);
        CHECK(s == TB_ERR_INVALID_ARG && strstr(tb_last_error(), "no folder") && g == NULL);
        s = tb_onnx_import_buffer(buf, n, dir, NULL, &g);
        CHECK_MSG(s == TB_OK, "external from memory: %s", tb_last_error());
        tb_graph_free(g);
    }
    const char *f1[] = {"tensor 'We'", "leaves the model's folder", NULL};
    expect_error("escape_dotdot.onnx", NULL, TB_ERR_FORMAT, f1);
    expect_error("escape_abs.onnx", NULL, TB_ERR_FORMAT, f1);
    const char *f3[] = {"tensor 'Be'", "past the end of data/weights.bin", NULL};
    expect_error("external_short.onnx", NULL, TB_ERR_FORMAT, f3);
}

static void test_refusals(void) {
    /* every unsupported node is listed, supported ones are not */
    const char *f1[] = {"unsupported.onnx: ", "nodes are not supported: ",
                        "node 'Foo_12' (op NonMaxSuppression): op type not supported",
                        "node 'Baz' (op Softmax)",
                        "node 'ms_node' (op FusedGemm): domain 'com.microsoft' is not supported", NULL};
    expect_error("unsupported.onnx", NULL, TB_ERR_UNSUPPORTED, f1);
    if (tb_op_get_def(TB_OP_SOFTMAX) && tb_op_get_def(TB_OP_RELU) && tb_op_get_def(TB_OP_NN_ADD)) {
        const char *f[] = {"unsupported.onnx: 3 nodes are not supported: node 'Foo_12'",
                           "node 'Baz' (op Softmax): attribute 'frobnicate' is not supported", NULL};
        expect_error("unsupported.onnx", NULL, TB_ERR_UNSUPPORTED, f);
        CHECK(strstr(tb_last_error(), "ok_relu") == NULL && strstr(tb_last_error(), "'after'") == NULL);
    }
    tb_log_set_level(TB_LOG_ERROR);
    const char *fm[] = {"many_unsupported.onnx: 30 nodes are not supported: node 'an_unsupported_node_with_a_long_name_00' "
                        "(op Celu): op type not supported; node 'an_unsupported_node_with_a_long_name_01'",
                        "more (logged)", NULL};
    expect_error("many_unsupported.onnx", NULL, TB_ERR_UNSUPPORTED, fm);
    tb_log_set_level(TB_LOG_WARN);
    if (tb_op_get_def(TB_OP_LAYERNORM)) { /* Mean used: a second output, (2, 1) f32 */
        tb_graph *g = NULL;
        CHECK_MSG(tb_onnx_import(model("layernorm_mean.onnx"), NULL, &g) == TB_OK, "layernorm_mean: %s", tb_last_error());
        if (g) {
            const tb_node *n = &g->nodes[g->n_nodes - 1];
            CHECK(n->op == TB_OP_LAYERNORM && n->n_out == 2 && n->i[1] == 2 && g->n_outputs == 2);
            const tb_value *m = &g->values[g->outputs[1]];
            CHECK(m->dtype == TB_F32 && m->rank == 2 && m->dims[0] == 2 && m->dims[1] == 1);
        }
        tb_graph_free(g);
    }
    if (tb_op_get_def(TB_OP_IDENTITY) && tb_op_get_def(TB_OP_CONSTANT_OF_SHAPE)) { /* the mask: all true */
        tb_graph *g = NULL;
        CHECK_MSG(tb_onnx_import(model("dropout_mask.onnx"), NULL, &g) == TB_OK, "dropout_mask: %s", tb_last_error());
        if (g) {
            const tb_value *m = &g->values[g->outputs[1]];
            CHECK(g->n_outputs == 2 && m->dtype == TB_BOOL && m->rank == 2);
            int cos = 0;
            for (int k = 0; k < g->n_nodes; k++) cos += g->nodes[k].op == TB_OP_CONSTANT_OF_SHAPE;
            CHECK(cos == 1);
        }
        tb_graph_free(g);
    }
    const char *fa[] = {"absent_inputs.onnx: 2 nodes are not supported",
                        "node 'clip_no_x' (op Clip): its first input is left out (an empty name)",
                        "node 'slice_no_starts' (op Slice): starts left out (an empty name)", NULL};
    expect_error("absent_inputs.onnx", NULL, TB_ERR_UNSUPPORTED, fa);
    CHECK(strstr(tb_last_error(), "'fine'") == NULL);
    const char *f2[] = {"opset11.onnx: opset 11 of the default ONNX domain is not supported (13 to 21)", NULL};
    expect_error("opset11.onnx", NULL, TB_ERR_UNSUPPORTED, f2);
    if (tb_op_get_def(TB_OP_RELU)) {
        tb_graph *g = NULL;
        CHECK_MSG(tb_onnx_import(model("relu.onnx"), NULL, &g) == TB_OK, "opset 21: %s", tb_last_error());
        tb_graph_free(g);
    }
    const char *f3[] = {"tensor 'w16' has data type UINT16, which is not supported", NULL};
    expect_error("bad_dtype.onnx", NULL, TB_ERR_UNSUPPORTED, f3);
    const char *f4[] = {"tensor 'wr' has 7 bytes of raw data, its shape and type need 12", NULL};
    expect_error("bad_raw.onnx", NULL, TB_ERR_FORMAT, f4);
    const char *f5[] = {"truncated.onnx: not an ONNX model", NULL};
    expect_error("truncated.onnx", NULL, TB_ERR_FORMAT, f5);
    const char *f6[] = {"random.onnx: not an ONNX model", NULL};
    expect_error("random.onnx", NULL, TB_ERR_FORMAT, f6);
    const char *f7[] = {"deep.onnx: not an ONNX model (the protobuf is malformed or truncated)", NULL};
    expect_error("deep.onnx", NULL, TB_ERR_FORMAT, f7);
    const char *f8[] = {"cannot open", NULL};
    expect_error("missing.onnx", NULL, TB_ERR_IO, f8);
    tb_graph *g = (tb_graph *)1;
    CHECK(tb_onnx_import_buffer("", 0, NULL, NULL, &g) == TB_ERR_FORMAT && g == NULL);

    /* every prefix of a valid model and single-byte corruptions: an error or a graph, never a crash */
    FILE *f = fopen(model("shape_chain.onnx"), "rb");
    static uint8_t buf[1 << 16], tmp[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(n > 100);
    tb_onnx_shape_spec sp[2];
    int ns = 0;
    tb_onnx_parse_shapes("x:2x3x8", 3, sp, &ns, 2);
    tb_onnx_options o = {sp, ns};
    tb_log_set_level(TB_LOG_ERROR); /* refusals past the message are logged as warnings */
    for (size_t k = 0; k < n; k++) {
        g = NULL;
        if (tb_onnx_import_buffer(buf, k, dir, &o, &g) == TB_OK) tb_graph_free(g);
    }
    uint32_t seed = 12345;
    for (int it = 0; it < 3000; it++) {
        memcpy(tmp, buf, n);
        for (int j = 0; j < 1 + it % 3; j++) {
            seed = seed * 1664525u + 1013904223u;
            size_t at = (seed >> 8) % n;
            seed = seed * 1664525u + 1013904223u;
            tmp[at] = (uint8_t)(seed >> 24);
        }
        g = NULL;
        if (tb_onnx_import_buffer(tmp, n, dir, &o, &g) == TB_OK) tb_graph_free(g);
    }
    tb_log_set_level(TB_LOG_WARN);
}

/* TensorProto files (the input_K.pb / output_K.pb of ONNX's tests) */
static void test_tensor_files(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/t.pb", dir);
    float v[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    tb_tensor t = {TB_F32, 2, {2, 3}, v}, r;
    char name[96];
    CHECK(tb_onnx_write_tensor(path, "logits", &t) == TB_OK);
    CHECK_MSG(tb_onnx_read_tensor(path, &r, name, sizeof name) == TB_OK, "%s", tb_last_error());
    CHECK(!strcmp(name, "logits") && r.dtype == TB_F32 && r.rank == 2 && r.dims[0] == 2 && r.dims[1] == 3);
    CHECK(r.data && !memcmp(r.data, v, sizeof v));
    free(r.data);
    int64_t sc = -5;
    tb_tensor t0 = {TB_I64, 0, {0}, &sc};
    CHECK(tb_onnx_write_tensor(path, NULL, &t0) == TB_OK);
    CHECK(tb_onnx_read_tensor(path, &r, name, sizeof name) == TB_OK && r.rank == 0 && r.dtype == TB_I64 &&
          *(int64_t *)r.data == -5 && name[0] == 0);
    free(r.data);
    tb_tensor t4 = {TB_I4, 1, {2}, v};
    CHECK(tb_onnx_write_tensor(path, "x", &t4) == TB_ERR_UNSUPPORTED);
    /* the model file is not a tensor: an error, not a crash */
    CHECK(tb_onnx_read_tensor(model("random.onnx"), &r, name, sizeof name) == TB_ERR_FORMAT && r.data == NULL);
    snprintf(path, sizeof path, "%s/nodir/t.pb", dir);
    CHECK(tb_onnx_write_tensor(path, "x", &t) == TB_ERR_IO);
}

static void test_supported_ops(void) {
    char *s = tb_onnx_supported_ops();
    CHECK(s != NULL);
    if (!s) return;
    CHECK(strstr(s, "Constant\n") != NULL);
    CHECK((strstr(s, "Relu\n") != NULL) == (tb_op_get_def(TB_OP_RELU) != NULL));
    CHECK((strstr(s, "Dropout\n") != NULL) == (tb_op_get_def(TB_OP_IDENTITY) != NULL));
    CHECK(strstr(s, "NonMaxSuppression") == NULL);
    free(s);
}

int main(void) {
    test_shapes_text();
    tb_graph *g = NULL;
    if (tb_onnx_import("/nonexistent.onnx", NULL, &g) == TB_ERR_UNSUPPORTED) {
        /* built without protobuf-c / onnx.proto: the message names what was missing */
        CHECK(strstr(tb_last_error(), "not in this build") != NULL);
        printf("skip: %s\n", tb_last_error());
        printf("%d checks, %d failures\n", tb_test_checks, tb_test_failures);
        return tb_test_failures != 0;
    }
    const char *src = getenv("TURBINE_SRC");
    snprintf(dir, sizeof dir, "%s/onnx_import_%d", tb_test_tmp(), (int)getpid()); /* runs at once do not share it */
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/onnx_import/gen_models.py %s", src && *src ? src : "..", dir);
    int rc = system(cmd);
    if (rc != 0) {
        CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 77, "gen_models.py failed (%d)", rc);
        printf("skip models: python3-onnx is not installed\n");
    } else {
        test_conv_relu();
        test_matmul_add();
        test_shape_chain();
        test_typed();
        test_ops_misc();
        test_external();
        test_refusals();
        test_tensor_files();
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    test_supported_ops();
    printf("%d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures != 0;
}
