/*
 * test_nn_shape.c — the shape, data-movement and pooling ops (ir/nn_shape.c,
 * backend/cpu/nn_shape.c): schemas, shape rules at build time (symbols
 * carried through the Reshape / Transpose / Unsqueeze / Concat chains of
 * exported BERT and GPT-2 graphs, TB_DIM_DYN where a value is unknown) and at
 * run time, reference kernels against hand-computed values (Resize against
 * the ONNX spec's examples, pools against a direct loop here), the fast CPU
 * kernels against the references on odd shapes, and errors on mismatches.
 */
#include "backend/cpu/nn.h"
#include "ir/ops_nn.h"
#include "tb_test.h"

/* ---------------------------------------------------------------- helpers */

static tb_view V(tb_dtype t, int rank, const int64_t *dims, const void *data) {
    tb_view v;
    memset(&v, 0, sizeof v);
    v.dtype = t;
    v.rank = rank;
    for (int i = 0; i < rank; i++) v.dims[i] = dims[i];
    v.data = (void *)data;
    return v;
}
#define D(...) ((const int64_t[]){__VA_ARGS__})
#define I64(...) ((const int64_t[]){__VA_ARGS__})
#define F32(...) ((const float[]){__VA_ARGS__})
#define VEC(t, n, data) V(t, 1, D(n), data)

static tb_node node(tb_op_kind op, const int32_t *i, int ni, const float *f, int nf) {
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    for (int k = 0; k < ni; k++) n.i[k] = i[k];
    for (int k = 0; k < nf; k++) n.f[k] = f[k];
    return n;
}
#define NODE(op, ...) node(op, (const int32_t[]){__VA_ARGS__}, (int)(sizeof((const int32_t[]){__VA_ARGS__}) / 4), NULL, 0)
#define NODE0(op) node(op, NULL, 0, NULL, 0)

static tb_status infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *sh) {
    tb_status s = tb_op_check_attrs(n);
    if (s == TB_OK) s = tb_op_infer_views(n, in, n_in, sh);
    if (s != TB_OK && getenv("TB_TEST_VERBOSE")) fprintf(stderr, "  %s\n", tb_last_error());
    return s;
}

static int dims_are(const tb_op_shape *sh, int o, int rank, const int64_t *d) {
    if (sh->rank[o] != rank) return 0;
    for (int i = 0; i < rank; i++)
        if (sh->dims[o][i] != d[i]) return 0;
    return 1;
}

/* Runs rule + reference kernel; outputs malloc'd into out[] (caller frees
 * with free_outs). Returns the kernel's status. */
static tb_status run_ref(const tb_node *n, const tb_view *in, int n_in, tb_view *out, int *n_out) {
    tb_op_shape sh;
    *n_out = 0;
    tb_status s = infer(n, in, n_in, &sh);
    if (s != TB_OK) return s;
    *n_out = sh.n_out;
    for (int o = 0; o < sh.n_out; o++) {
        out[o] = V(sh.dtype[o], sh.rank[o], sh.dims[o], NULL);
        size_t bytes = (size_t)tb_view_numel(&out[o]) * tb_dtype_size(sh.dtype[o]);
        out[o].data = calloc(1, bytes + 16);
    }
    tb_node m = *n;
    m.n_in = n_in;
    m.n_out = sh.n_out;
    s = tb_op_get_def(n->op)->ref(&m, in, n_in, out, sh.n_out);
    if (s != TB_OK && getenv("TB_TEST_VERBOSE")) fprintf(stderr, "  %s\n", tb_last_error());
    return s;
}

static void free_outs(tb_view *out, int n) {
    for (int o = 0; o < n; o++) { free(out[o].data); out[o].data = NULL; }
}

/* the first n elements of v (all of them: eq_f32) */
static int eq_f32_head(const tb_view *v, const float *want, int n, float tol) {
    if (tb_view_numel(v) < n) return 0;
    for (int i = 0; i < n; i++)
        if (!(fabsf(((const float *)v->data)[i] - want[i]) <= tol)) {
            fprintf(stderr, "  element %d: %g, want %g\n", i, ((const float *)v->data)[i], want[i]);
            return 0;
        }
    return 1;
}

static int eq_f32(const tb_view *v, const float *want, int n, float tol) {
    return tb_view_numel(v) == n && eq_f32_head(v, want, n, tol);
}

static int eq_i64(const tb_view *v, const int64_t *want, int n) {
    if (tb_view_numel(v) != n) return 0;
    for (int i = 0; i < n; i++)
        if (((const int64_t *)v->data)[i] != want[i]) return 0;
    return 1;
}

static float *iota_f(int64_t n) {
    float *p = malloc((size_t)n * sizeof *p + 4);
    for (int64_t i = 0; i < n; i++) p[i] = (float)i;
    return p;
}

/* ---------------------------------------------------------------- schema */

static void test_schema(void) {
    static const struct { tb_op_kind k; const char *name; int host; int n_attrs; } want[] = {
        {TB_OP_RESHAPE, "Reshape", 0x2, 1},       {TB_OP_TRANSPOSE, "Transpose", 0, 8},
        {TB_OP_UNSQUEEZE, "Unsqueeze", 0x2, 0},   {TB_OP_SQUEEZE, "Squeeze", 0x2, 0},
        {TB_OP_FLATTEN, "Flatten", 0, 1},         {TB_OP_SLICE, "Slice", 0x1e, 0},
        {TB_OP_CONCAT, "Concat", 0, 1},           {TB_OP_SPLIT, "Split", 0x2, 2},
        {TB_OP_SHAPE, "Shape", 0, 3},             {TB_OP_GATHER, "Gather", 0, 1},
        {TB_OP_EXPAND, "Expand", 0x2, 0},         {TB_OP_RANGE, "Range", 0x7, 0},
        {TB_OP_CONSTANT_OF_SHAPE, "ConstantOfShape", 0x1, 0}, {TB_OP_TRILU, "Trilu", 0x2, 1},
        {TB_OP_RESIZE, "Resize", 0x6, 6},         {TB_OP_MAXPOOL, "MaxPool", 0, 13},
        {TB_OP_AVGPOOL, "AveragePool", 0, 13},    {TB_OP_GLOBAL_AVGPOOL, "GlobalAveragePool", 0, 0},
    };
    for (size_t t = 0; t < sizeof want / sizeof want[0]; t++) {
        const tb_op_def *d = tb_nn_shape_def(want[t].k);
        CHECK_MSG(d && d == tb_op_get_def(want[t].k), "%s: not in the table", want[t].name);
        if (!d) continue;
        CHECK_MSG(!strcmp(d->name, want[t].name) && !strcmp(tb_nn_onnx_name(want[t].k), d->name), "%s", want[t].name);
        CHECK_MSG(tb_nn_from_onnx(d->name) == (int)want[t].k, "%s: ONNX name", d->name);
        CHECK_MSG(d->host_inputs == (uint32_t)want[t].host, "%s: host inputs %#x", d->name, d->host_inputs);
        CHECK_MSG(d->n_attrs == want[t].n_attrs, "%s: %d attributes", d->name, d->n_attrs);
        CHECK_MSG(d->infer && d->ref && !d->shape && d->signature, "%s: rule and reference", d->name);
    }
    CHECK(tb_nn_shape_def(TB_OP_RELU) == NULL && tb_nn_shape_def(TB_OP_CONV) == NULL);
    CHECK(tb_op_get_def(TB_OP_SPLIT)->max_out == TB_MAX_OUTPUTS);
    /* slots of the pooling layout (ops_nn.h) */
    const tb_op_def *p = tb_nn_shape_def(TB_OP_MAXPOOL);
    static const char *pool_names[13] = {"kernel_h", "kernel_w", "stride_h", "stride_w", "pad_top", "pad_left",
                                         "pad_bottom", "pad_right", "dilation_h", "dilation_w", "ceil_mode",
                                         "count_include_pad", "auto_pad"};
    for (int a = 0; a < 13; a++)
        CHECK_MSG(!strcmp(p->attrs[a].name, pool_names[a]) && p->attrs[a].slot == a, "MaxPool attr %d", a);
    const tb_op_def *r = tb_nn_shape_def(TB_OP_RESIZE);
    CHECK(r->attrs[4].type == TB_ATTR_FLOAT && r->attrs[4].slot == 0 && r->attrs[5].slot == 1);
    /* attributes out of range are refused */
    tb_node n = NODE(TB_OP_RESIZE, 3);
    CHECK(tb_op_check_attrs(&n) == TB_ERR_FORMAT);
    n = NODE(TB_OP_TRANSPOSE, 0, 8);
    CHECK(tb_op_check_attrs(&n) == TB_ERR_FORMAT);
    n = NODE(TB_OP_RESHAPE, 0, 1); /* a slot no attribute defines */
    CHECK(tb_op_check_attrs(&n) == TB_ERR_FORMAT);
}

/* ---------------------------------------------------------------- rules at build time */

static int add(tb_graph *g, tb_op_kind op, const int *in, int n_in, const char *name, const int32_t *i) {
    int32_t attrs[TB_NODE_INTS] = {0};
    if (i) memcpy(attrs, i, sizeof attrs);
    const char *names[1] = {name};
    int k = tb_graph_add_node_ex(g, op, in, n_in, names, 1, attrs, NULL);
    CHECK_MSG(k >= 0, "%s: %s", name, tb_last_error());
    return k;
}
static int cst(tb_graph *g, const char *name, int n, const int64_t *v) {
    int64_t *p = malloc(sizeof *p * (n ? n : 1));
    memcpy(p, v, sizeof *p * n);
    return tb_graph_add_weight(g, name, TB_I64, 1, D(n), p, 1);
}
static const tb_value *outv(tb_graph *g, int node, int o) { return &g->values[g->nodes[node].out[o]]; }
static int out_is(tb_graph *g, int node, int o, int rank, const int64_t *d) {
    if (node < 0) return 0;
    const tb_value *v = outv(g, node, o);
    if (v->rank != rank) return 0;
    for (int i = 0; i < rank; i++)
        if (v->dims[i] != d[i]) return 0;
    return 1;
}
static int32_t A16[TB_NODE_INTS];
static const int32_t *attrs(int n, const int32_t *v) {
    memset(A16, 0, sizeof A16);
    memcpy(A16, v, sizeof *v * n);
    return A16;
}
#define AT(...) attrs((int)(sizeof((const int32_t[]){__VA_ARGS__}) / 4), (const int32_t[]){__VA_ARGS__})

static void test_bert_gpt2_chains(void) {
    tb_graph *g = tb_graph_new();
    int b = tb_graph_add_sym(g, "batch", 1, 1, 8), s = tb_graph_add_sym(g, "seq", 1, 128, 512);
    int64_t B = TB_SYM(b), S = TB_SYM(s);
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 3, D(B, S, 768));
    /* BERT self-attention: (B, S, 768) -> (B, S, 12, 64) -> (B, 12, S, 64) */
    int heads = add(g, TB_OP_RESHAPE, (const int[]){x, cst(g, "sh1", 4, I64(0, 0, 12, 64))}, 2, "heads", NULL);
    CHECK(out_is(g, heads, 0, 4, D(B, S, 12, 64)));
    int q = add(g, TB_OP_TRANSPOSE, (const int[]){g->nodes[heads].out[0]}, 1, "q", AT(0, 2, 1, 3));
    CHECK(out_is(g, q, 0, 4, D(B, 12, S, 64)));
    int kt = add(g, TB_OP_TRANSPOSE, (const int[]){g->nodes[heads].out[0]}, 1, "kt", AT(0, 2, 3, 1));
    CHECK(out_is(g, kt, 0, 4, D(B, 12, 64, S)));
    int back = add(g, TB_OP_TRANSPOSE, (const int[]){g->nodes[q].out[0]}, 1, "back", AT(0, 2, 1, 3));
    int merged = add(g, TB_OP_RESHAPE, (const int[]){g->nodes[back].out[0], cst(g, "sh2", 3, I64(0, 0, 768))}, 2,
                     "merged", NULL);
    CHECK(out_is(g, merged, 0, 3, D(B, S, 768)));
    /* -1 inferred: a number when the symbols cancel, the symbol when one is left */
    int m2 = add(g, TB_OP_RESHAPE, (const int[]){g->nodes[back].out[0], cst(g, "sh3", 3, I64(0, 0, -1))}, 2, "m2",
                 NULL);
    CHECK(out_is(g, m2, 0, 3, D(B, S, 768)));
    int m3 = add(g, TB_OP_RESHAPE, (const int[]){x, cst(g, "sh4", 2, I64(-1, 768))}, 2, "m3", NULL);
    CHECK(out_is(g, m3, 0, 2, D(TB_DIM_DYN, 768)));
    int m4 = add(g, TB_OP_RESHAPE, (const int[]){x, cst(g, "sh5", 3, I64(0, -1, 768))}, 2, "m4", NULL);
    CHECK(out_is(g, m4, 0, 3, D(B, S, 768)));
    int m5 = add(g, TB_OP_RESHAPE, (const int[]){x, cst(g, "sh6", 4, I64(0, -1, 12, 64))}, 2, "m5", NULL);
    CHECK(out_is(g, m5, 0, 4, D(B, S, 12, 64)));
    int m6 = add(g, TB_OP_RESHAPE, (const int[]){x, cst(g, "sh7", 3, I64(0, 0, -1))}, 2, "m6", NULL);
    CHECK(out_is(g, m6, 0, 3, D(B, S, 768)));
    /* a mismatch the symbols cannot hide */
    CHECK(tb_graph_add_node_ex(g, TB_OP_RESHAPE, (const int[]){x, cst(g, "bad", 4, I64(0, 0, 12, 32))}, 2,
                               (const char *const[]){"bad"}, 1, NULL, NULL) < 0 &&
          tb_last_status() == TB_ERR_FORMAT);
    CHECK(tb_graph_add_node_ex(g, TB_OP_RESHAPE, (const int[]){x, cst(g, "bad2", 3, I64(0, 0, 7))}, 2,
                               (const char *const[]){"bad2"}, 1, NULL, NULL) < 0);
    /* GPT-2 attention mask: (B, S) -> Unsqueeze [1, 2] -> (B, 1, 1, S) */
    int mask = tb_graph_add_value(g, "mask", TB_VAL_INPUT, TB_I64, 2, D(B, S));
    int um = add(g, TB_OP_UNSQUEEZE, (const int[]){mask, cst(g, "ax12", 2, I64(1, 2))}, 2, "um", NULL);
    CHECK(out_is(g, um, 0, 4, D(B, 1, 1, S)));
    int um2 = add(g, TB_OP_UNSQUEEZE, (const int[]){mask, cst(g, "axm1", 1, I64(-1))}, 2, "um2", NULL);
    CHECK(out_is(g, um2, 0, 3, D(B, S, 1)));
    int sq = add(g, TB_OP_SQUEEZE, (const int[]){g->nodes[um].out[0], cst(g, "ax1", 1, I64(1))}, 2, "sq", NULL);
    CHECK(out_is(g, sq, 0, 3, D(B, 1, S)));
    /* GPT-2 c_attn output split into q, k, v */
    int qkv = tb_graph_add_value(g, "qkv", TB_VAL_INPUT, TB_F32, 3, D(B, S, 2304));
    int sp = add(g, TB_OP_SPLIT, (const int[]){qkv, cst(g, "spl", 3, I64(768, 768, 768))}, 2, "sp", AT(2, 3));
    CHECK(sp >= 0 && g->nodes[sp].n_out == 3 && out_is(g, sp, 2, 3, D(B, S, 768)));
    int sp2 = add(g, TB_OP_SPLIT, (const int[]){qkv}, 1, "sp2", AT(2, 3));
    CHECK(sp2 >= 0 && g->nodes[sp2].n_out == 3 && out_is(g, sp2, 1, 3, D(B, S, 768)));
    /* the KV cache: past (B, 12, P, 64) ++ new (B, 12, S, 64) along 2 */
    int p = tb_graph_add_sym(g, "past", 1, 1, 512);
    int past = tb_graph_add_value(g, "past_k", TB_VAL_INPUT, TB_F32, 4, D(B, 12, TB_SYM(p), 64));
    int cat = add(g, TB_OP_CONCAT, (const int[]){past, g->nodes[q].out[0]}, 2, "cat", AT(2));
    CHECK(out_is(g, cat, 0, 4, D(B, 12, TB_DIM_DYN, 64)));
    int cat2 = add(g, TB_OP_CONCAT, (const int[]){x, x}, 2, "cat2", AT(2));
    CHECK(out_is(g, cat2, 0, 3, D(B, S, 1536)));
    /* Shape of symbolic dims: i64 (3), contents unknown; Gather of it a
     * scalar; the shape built from it leaves the Reshape's dims unknown */
    int shp = add(g, TB_OP_SHAPE, (const int[]){x}, 1, "shp", NULL);
    CHECK(out_is(g, shp, 0, 1, D(3)) && outv(g, shp, 0)->dtype == TB_I64);
    int64_t zero = 0;
    int i0 = tb_graph_add_weight(g, "i0", TB_I64, 0, NULL, memcpy(malloc(8), &zero, 8), 1);
    int gb = add(g, TB_OP_GATHER, (const int[]){g->nodes[shp].out[0], i0}, 2, "gb", AT(0));
    CHECK(out_is(g, gb, 0, 0, NULL) && outv(g, gb, 0)->dtype == TB_I64);
    int ub = add(g, TB_OP_UNSQUEEZE, (const int[]){g->nodes[gb].out[0], cst(g, "ax0", 1, I64(0))}, 2, "ub", NULL);
    CHECK(out_is(g, ub, 0, 1, D(1)));
    int cs = add(g, TB_OP_CONCAT, (const int[]){g->nodes[ub].out[0], cst(g, "m1", 1, I64(-1)), cst(g, "c64", 1, I64(64))}, 3,
                 "cs", AT(0));
    CHECK(out_is(g, cs, 0, 1, D(3)));
    int rd = add(g, TB_OP_RESHAPE, (const int[]){x, g->nodes[cs].out[0]}, 2, "rd", NULL);
    CHECK(out_is(g, rd, 0, 3, D(TB_DIM_DYN, TB_DIM_DYN, TB_DIM_DYN)));
    /* Range with unknown bounds: rank 1, dim unknown */
    int lim = add(g, TB_OP_GATHER, (const int[]){g->nodes[shp].out[0], i0}, 2, "lim", AT(0));
    int rg = add(g, TB_OP_RANGE, (const int[]){i0, g->nodes[lim].out[0], i0}, 3, "rg", NULL);
    CHECK(out_is(g, rg, 0, 1, D(TB_DIM_DYN)) && outv(g, rg, 0)->dtype == TB_I64);
    /* Slice [0, INT64_MAX) keeps a symbol; [1, ...) does not */
    int sl = add(g, TB_OP_SLICE, (const int[]){x, cst(g, "s0", 1, I64(0)), cst(g, "e0", 1, I64(INT64_MAX)),
                                              cst(g, "a1", 1, I64(1))}, 4, "sl", NULL);
    CHECK(out_is(g, sl, 0, 3, D(B, S, 768)));
    int sl2 = add(g, TB_OP_SLICE, (const int[]){x, cst(g, "s1", 2, I64(1, 0)), cst(g, "e1", 2, I64(INT64_MAX, 100)),
                                               cst(g, "a2", 2, I64(1, -1))}, 4, "sl2", NULL);
    CHECK(out_is(g, sl2, 0, 3, D(B, TB_DIM_DYN, 100)));
    /* Flatten: (B, S, 768) axis 2 -> (DYN, 768); axis 1 -> (B, DYN) */
    int fl = add(g, TB_OP_FLATTEN, (const int[]){x}, 1, "fl", AT(1));
    CHECK(out_is(g, fl, 0, 2, D(B, TB_DIM_DYN)));
    int fl0 = add(g, TB_OP_FLATTEN, (const int[]){g->nodes[um].out[0]}, 1, "fl0", AT(3));
    CHECK(out_is(g, fl0, 0, 2, D(B, S)));
    /* Expand by a constant shape, and by an unknown one */
    int ex = add(g, TB_OP_EXPAND, (const int[]){g->nodes[um].out[0], cst(g, "esh", 4, I64(1, 12, 1, 1))}, 2, "ex",
                 NULL);
    CHECK(out_is(g, ex, 0, 4, D(B, 12, 1, S)));
    int ex2 = add(g, TB_OP_EXPAND, (const int[]){x, g->nodes[cs].out[0]}, 2, "ex2", NULL);
    CHECK(out_is(g, ex2, 0, 3, D(TB_DIM_DYN, TB_DIM_DYN, 768)));
    /* ConstantOfShape with unknown contents: rank known, dims not */
    float one = 1;
    int val = tb_graph_add_weight(g, "one", TB_F32, 1, D(1), memcpy(malloc(4), &one, 4), 1);
    int cos = add(g, TB_OP_CONSTANT_OF_SHAPE, (const int[]){g->nodes[cs].out[0], val}, 2, "cos", NULL);
    CHECK(out_is(g, cos, 0, 3, D(TB_DIM_DYN, TB_DIM_DYN, TB_DIM_DYN)) && outv(g, cos, 0)->dtype == TB_F32);
    /* pools over symbolic batch, Resize keeping dims scaled by 1 */
    int img = tb_graph_add_value(g, "img", TB_VAL_INPUT, TB_F32, 4, D(B, 64, 112, 112));
    int mp = add(g, TB_OP_MAXPOOL, (const int[]){img}, 1, "mp", AT(3, 3, 2, 2, 1, 1, 1, 1));
    CHECK(out_is(g, mp, 0, 4, D(B, 64, 56, 56)));
    int gap = add(g, TB_OP_GLOBAL_AVGPOOL, (const int[]){img}, 1, "gap", NULL);
    CHECK(out_is(g, gap, 0, 4, D(B, 64, 1, 1)));
    float sc[4] = {1, 1, 2, 2};
    int scw = tb_graph_add_weight(g, "sc", TB_F32, 1, D(4), memcpy(malloc(16), sc, 16), 1);
    int rs = add(g, TB_OP_RESIZE, (const int[]){img, scw}, 2, "rs", NULL);
    CHECK(out_is(g, rs, 0, 4, D(B, 64, 224, 224)));
    int himg = tb_graph_add_value(g, "himg", TB_VAL_INPUT, TB_F32, 4, D(B, 3, S, S));
    int rs2 = add(g, TB_OP_RESIZE, (const int[]){himg, scw}, 2, "rs2", NULL);
    CHECK(out_is(g, rs2, 0, 4, D(B, 3, TB_DIM_DYN, TB_DIM_DYN)));
    int mp2 = add(g, TB_OP_MAXPOOL, (const int[]){himg}, 1, "mp2", AT(3, 3, 2, 2, 1, 1, 1, 1));
    CHECK(out_is(g, mp2, 0, 4, D(B, 3, TB_DIM_DYN, TB_DIM_DYN)));
    /* Squeeze without axes over symbols: the rank is unknown */
    CHECK(tb_graph_add_node_ex(g, TB_OP_SQUEEZE, (const int[]){x}, 1, (const char *const[]){"sqx"}, 1, NULL, NULL) <
              0 &&
          tb_last_status() == TB_ERR_UNSUPPORTED);
    g->outputs[0] = outv(g, merged, 0) - g->values;
    g->n_outputs = 1;
    g->inputs[0] = x;
    g->n_inputs = 1;
    CHECK_MSG(tb_graph_check(g) == TB_OK, "%s", tb_last_error());
    tb_graph_free(g);
}

/* ---------------------------------------------------------------- rules and references */

static void test_reshape(void) {
    tb_view out[4];
    int no;
    float *x = iota_f(24);
    tb_view in[2] = {V(TB_F32, 3, D(2, 3, 4), x), VEC(TB_I64, 2, I64(-1, 6))};
    tb_node n = NODE0(TB_OP_RESHAPE);
    CHECK(run_ref(&n, in, 2, out, &no) == TB_OK && out[0].rank == 2 && out[0].dims[0] == 4 &&
          out[0].dims[1] == 6 && !memcmp(out[0].data, x, 96));
    free_outs(out, no);
    tb_op_shape sh;
    in[1] = VEC(TB_I64, 3, I64(0, -1, 2));
    CHECK(infer(&n, in, 2, &sh) == TB_OK && dims_are(&sh, 0, 3, D(2, 6, 2)));
    in[1] = VEC(TB_I32, 2, ((const int32_t[]){4, 6}));
    CHECK(infer(&n, in, 2, &sh) == TB_OK && dims_are(&sh, 0, 2, D(4, 6)));
    in[1] = VEC(TB_I64, 2, I64(5, -1));
    CHECK(infer(&n, in, 2, &sh) == TB_ERR_FORMAT);
    in[1] = VEC(TB_I64, 2, I64(-1, -1));
    CHECK(infer(&n, in, 2, &sh) == TB_ERR_FORMAT);
    in[1] = VEC(TB_I64, 2, I64(5, 5));
    CHECK(infer(&n, in, 2, &sh) == TB_ERR_FORMAT);
    in[1] = VEC(TB_I64, 4, I64(0, 0, 0, 0)); /* copies a dim the input lacks */
    CHECK(infer(&n, in, 2, &sh) == TB_ERR_FORMAT);
    /* allowzero: 0 is a 0 dim */
    tb_view e[2] = {V(TB_F32, 2, D(0, 3), x), VEC(TB_I64, 2, I64(3, 0))};
    tb_node az = NODE(TB_OP_RESHAPE, 1);
    CHECK(infer(&az, e, 2, &sh) == TB_OK && dims_are(&sh, 0, 2, D(3, 0)));
    CHECK(infer(&n, e, 2, &sh) == TB_ERR_FORMAT); /* (0, 3) -> (3, 3) */
    /* unknown shape contents: rank from its length */
    in[1] = VEC(TB_I64, 3, NULL);
    CHECK(infer(&n, in, 2, &sh) == TB_OK && dims_are(&sh, 0, 3, D(TB_DIM_DYN, TB_DIM_DYN, TB_DIM_DYN)));
    in[1] = VEC(TB_I64, TB_DIM_DYN, NULL);
    CHECK(infer(&n, in, 2, &sh) == TB_ERR_UNSUPPORTED);
    /* any dtype by element size; in place when the buffers alias */
    int64_t xi[6] = {1, -2, 3, -4, 5, -6};
    tb_view ii[2] = {V(TB_I64, 2, D(2, 3), xi), VEC(TB_I64, 1, I64(6))};
    CHECK(run_ref(&n, ii, 2, out, &no) == TB_OK && eq_i64(&out[0], xi, 6));
    free_outs(out, no);
    tb_view alias = V(TB_I64, 1, D(6), xi);
    CHECK(tb_op_get_def(TB_OP_RESHAPE)->ref(&n, ii, 2, &alias, 1) == TB_OK && xi[5] == -6);
    free(x);
}

static void test_transpose(void) {
    tb_view out[1];
    int no;
    float *x = iota_f(24);
    tb_view in = V(TB_F32, 3, D(2, 3, 4), x);
    tb_node n = NODE(TB_OP_TRANSPOSE, 2, 0, 1); /* out (4, 2, 3): out[k][i][j] = x[i][j][k] */
    CHECK(run_ref(&n, &in, 1, out, &no) == TB_OK && out[0].dims[0] == 4 && out[0].dims[1] == 2 &&
          out[0].dims[2] == 3);
    int ok = 1;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                ok &= ((float *)out[0].data)[(k * 2 + i) * 3 + j] == x[(i * 3 + j) * 4 + k];
    CHECK(ok);
    free_outs(out, no);
    /* u8 and f64 */
    uint8_t b[6] = {1, 2, 3, 4, 5, 6};
    tb_view bi = V(TB_U8, 2, D(2, 3), b);
    tb_node t2 = NODE(TB_OP_TRANSPOSE, 1, 0);
    CHECK(run_ref(&t2, &bi, 1, out, &no) == TB_OK && !memcmp(out[0].data, ((const uint8_t[]){1, 4, 2, 5, 3, 6}), 6));
    free_outs(out, no);
    double dd[6] = {1, 2, 3, 4, 5, 6};
    tb_view di = V(TB_F64, 2, D(3, 2), dd);
    CHECK(run_ref(&t2, &di, 1, out, &no) == TB_OK && ((double *)out[0].data)[1] == 3 &&
          ((double *)out[0].data)[3] == 2);
    free_outs(out, no);
    tb_op_shape sh;
    tb_node bad = NODE(TB_OP_TRANSPOSE, 0, 0, 1);
    CHECK(infer(&bad, &in, 1, &sh) == TB_ERR_FORMAT);
    bad = NODE(TB_OP_TRANSPOSE, 0, 1, 2, 3); /* past the rank */
    CHECK(infer(&bad, &in, 1, &sh) == TB_ERR_FORMAT);
    free(x);
}

static void test_unsqueeze_squeeze_flatten(void) {
    tb_op_shape sh;
    tb_view x = V(TB_F16, 3, D(2, 1, 3), NULL);
    tb_node u = NODE0(TB_OP_UNSQUEEZE), s = NODE0(TB_OP_SQUEEZE), f = NODE(TB_OP_FLATTEN, 2);
    tb_view in[2] = {x, VEC(TB_I64, 2, I64(0, -1))};
    CHECK(infer(&u, in, 2, &sh) == TB_OK && dims_are(&sh, 0, 5, D(1, 2, 1, 3, 1)) && sh.dtype[0] == TB_F16);
    in[1] = VEC(TB_I64, 2, I64(1, 1));
    CHECK(infer(&u, in, 2, &sh) == TB_ERR_FORMAT);
    in[1] = VEC(TB_I64, 1, I64(5));
    CHECK(infer(&u, in, 2, &sh) == TB_ERR_FORMAT);
    in[1] = VEC(TB_I64, 2, NULL);
    CHECK(infer(&u, in, 2, &sh) == TB_OK && sh.rank[0] == 5 && sh.dims[0][0] == TB_DIM_DYN);
    CHECK(infer(&s, in, 1, &sh) == TB_OK && dims_are(&sh, 0, 2, D(2, 3)));
    in[1] = VEC(TB_I64, 1, I64(-2));
    CHECK(infer(&s, in, 2, &sh) == TB_OK && dims_are(&sh, 0, 2, D(2, 3)));
    in[1] = VEC(TB_I64, 1, I64(0));
    CHECK(infer(&s, in, 2, &sh) == TB_ERR_FORMAT); /* dim 0 is 2 */
    CHECK(infer(&f, in, 1, &sh) == TB_OK && dims_are(&sh, 0, 2, D(2, 3)));
    f = NODE(TB_OP_FLATTEN, 0);
    CHECK(infer(&f, in, 1, &sh) == TB_OK && dims_are(&sh, 0, 2, D(1, 6)));
    f = NODE(TB_OP_FLATTEN, 3);
    CHECK(infer(&f, in, 1, &sh) == TB_OK && dims_are(&sh, 0, 2, D(6, 1)));
    f = NODE(TB_OP_FLATTEN, 4);
    CHECK(infer(&f, in, 1, &sh) == TB_ERR_FORMAT);
    /* the kernels are copies */
    uint16_t h[6] = {1, 2, 3, 4, 5, 6};
    tb_view out[1];
    int no;
    in[0].data = h;
    in[1] = VEC(TB_I64, 1, I64(3));
    CHECK(run_ref(&u, in, 2, out, &no) == TB_OK && !memcmp(out[0].data, h, 12));
    free_outs(out, no);
}

static void test_slice(void) {
    float *x = iota_f(20); /* (4, 5) */
    tb_view out[1];
    int no;
    tb_node n = NODE0(TB_OP_SLICE);
    /* rows 1..3, columns 4 down to 1 by -2 (ONNX: 4, 2) */
    tb_view in[5] = {V(TB_F32, 2, D(4, 5), x), VEC(TB_I64, 2, I64(1, -1)), VEC(TB_I64, 2, I64(3, 0)),
                     VEC(TB_I64, 2, I64(0, 1)), VEC(TB_I64, 2, I64(1, -2))};
    CHECK(run_ref(&n, in, 5, out, &no) == TB_OK && out[0].dims[0] == 2 && out[0].dims[1] == 2 &&
          eq_f32(&out[0], F32(9, 7, 14, 12), 4, 0));
    free_outs(out, no);
    /* clamped ends, negative starts, i32 indices, no axes */
    tb_view in2[3] = {V(TB_F32, 2, D(4, 5), x), VEC(TB_I32, 2, ((const int32_t[]){-2, -100})),
                      VEC(TB_I32, 2, ((const int32_t[]){1000, 2}))};
    CHECK(run_ref(&n, in2, 3, out, &no) == TB_OK && eq_f32(&out[0], F32(10, 11, 15, 16), 4, 0));
    free_outs(out, no);
    /* reversal with INT64_MIN end, over axis -1 */
    tb_view in3[5] = {V(TB_F32, 2, D(4, 5), x), VEC(TB_I64, 1, I64(-1)), VEC(TB_I64, 1, I64(INT64_MIN)),
                      VEC(TB_I64, 1, I64(-1)), VEC(TB_I64, 1, I64(-1))};
    CHECK(run_ref(&n, in3, 5, out, &no) == TB_OK && out[0].dims[1] == 5 &&
          eq_f32(&out[0], F32(4, 3, 2, 1, 0, 9, 8, 7, 6, 5, 14, 13, 12, 11, 10, 19, 18, 17, 16, 15), 20, 0));
    free_outs(out, no);
    /* empty result */
    tb_view in4[3] = {V(TB_F32, 2, D(4, 5), x), VEC(TB_I64, 1, I64(3)), VEC(TB_I64, 1, I64(1))};
    CHECK(run_ref(&n, in4, 3, out, &no) == TB_OK && out[0].dims[0] == 0 && out[0].dims[1] == 5);
    free_outs(out, no);
    tb_op_shape sh;
    in[4] = VEC(TB_I64, 2, I64(1, 0));
    CHECK(infer(&n, in, 5, &sh) == TB_ERR_FORMAT); /* step 0 */
    in[3] = VEC(TB_I64, 2, I64(1, 1));
    in[4] = VEC(TB_I64, 2, I64(1, 1));
    CHECK(infer(&n, in, 5, &sh) == TB_ERR_FORMAT); /* repeated axis */
    in[3] = VEC(TB_I64, 3, I64(0, 1, 2));
    CHECK(infer(&n, in, 5, &sh) == TB_ERR_FORMAT); /* lengths differ */
    in[3] = VEC(TB_I64, 2, I64(0, 1));
    in[1] = VEC(TB_I64, 2, NULL);
    CHECK(infer(&n, in, 4, &sh) == TB_OK && dims_are(&sh, 0, 2, D(TB_DIM_DYN, TB_DIM_DYN)));
    free(x);
}

static void test_concat_split(void) {
    float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {7, 8, 9, 10};
    tb_view out[4];
    int no;
    tb_node c1 = NODE(TB_OP_CONCAT, 1);
    tb_view in[2] = {V(TB_F32, 2, D(2, 3), a), V(TB_F32, 2, D(2, 2), b)};
    CHECK(run_ref(&c1, in, 2, out, &no) == TB_OK && out[0].dims[1] == 5 &&
          eq_f32(&out[0], F32(1, 2, 3, 7, 8, 4, 5, 6, 9, 10), 10, 0));
    free_outs(out, no);
    tb_node c0 = NODE(TB_OP_CONCAT, 0);
    tb_op_shape sh;
    CHECK(infer(&c0, in, 2, &sh) == TB_ERR_FORMAT);
    in[1] = V(TB_I32, 2, D(2, 2), b);
    CHECK(infer(&c1, in, 2, &sh) == TB_ERR_FORMAT);
    /* i64 shape pieces (the exported Concat of Unsqueezes) */
    tb_view p[3] = {VEC(TB_I64, 1, I64(2)), VEC(TB_I64, 0, NULL), VEC(TB_I64, 2, I64(-1, 64))};
    CHECK(run_ref(&c0, p, 3, out, &no) == TB_OK && eq_i64(&out[0], I64(2, -1, 64), 3));
    free_outs(out, no);
    /* Split: sizes given, equal parts, the last smaller */
    float *x = iota_f(14); /* (2, 7) */
    tb_view s[2] = {V(TB_F32, 2, D(2, 7), x), VEC(TB_I64, 2, I64(2, 5))};
    tb_node sp = NODE(TB_OP_SPLIT, 1);
    CHECK(run_ref(&sp, s, 2, out, &no) == TB_OK && no == 2 && eq_f32(&out[0], F32(0, 1, 7, 8), 4, 0) &&
          eq_f32(&out[1], F32(2, 3, 4, 5, 6, 9, 10, 11, 12, 13), 10, 0));
    free_outs(out, no);
    tb_node sp3 = NODE(TB_OP_SPLIT, 1, 3);
    CHECK(run_ref(&sp3, s, 1, out, &no) == TB_OK && no == 3 && out[0].dims[1] == 3 && out[2].dims[1] == 1 &&
          eq_f32(&out[2], F32(6, 13), 2, 0));
    free_outs(out, no);
    s[1] = VEC(TB_I64, 2, I64(2, 4));
    CHECK(infer(&sp, s, 2, &sh) == TB_ERR_FORMAT);
    tb_node sp0 = NODE(TB_OP_SPLIT, 1, 0);
    CHECK(infer(&sp0, s, 1, &sh) == TB_ERR_FORMAT);
    free(x);
}

static void test_shape_gather(void) {
    tb_view out[1];
    int no;
    tb_view x = V(TB_BOOL, 4, D(2, 3, 5, 7), NULL);
    tb_node n = NODE0(TB_OP_SHAPE);
    CHECK(run_ref(&n, &x, 1, out, &no) == TB_OK && out[0].dtype == TB_I64 && eq_i64(&out[0], I64(2, 3, 5, 7), 4));
    free_outs(out, no);
    n = NODE(TB_OP_SHAPE, -3, -1, 1);
    CHECK(run_ref(&n, &x, 1, out, &no) == TB_OK && eq_i64(&out[0], I64(3, 5), 2));
    free_outs(out, no);
    n = NODE(TB_OP_SHAPE, -10, 100, 1);
    CHECK(run_ref(&n, &x, 1, out, &no) == TB_OK && eq_i64(&out[0], I64(2, 3, 5, 7), 4));
    free_outs(out, no);
    n = NODE(TB_OP_SHAPE, 3, 1, 1);
    CHECK(run_ref(&n, &x, 1, out, &no) == TB_OK && out[0].dims[0] == 0);
    free_outs(out, no);
    /* Gather: embedding rows (axis 0) with i32 ids, negative wrap; axis 1 with i64 */
    float *t = iota_f(12); /* (4, 3) */
    tb_view g[2] = {V(TB_F32, 2, D(4, 3), t), V(TB_I32, 2, D(2, 2), ((const int32_t[]){3, 0, -1, 1}))};
    tb_node g0 = NODE(TB_OP_GATHER, 0);
    CHECK(run_ref(&g0, g, 2, out, &no) == TB_OK && out[0].rank == 3 &&
          eq_f32(&out[0], F32(9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5), 12, 0));
    free_outs(out, no);
    tb_view g1[2] = {V(TB_F32, 2, D(4, 3), t), VEC(TB_I64, 2, I64(2, -3))};
    tb_node ga1 = NODE(TB_OP_GATHER, 1);
    CHECK(run_ref(&ga1, g1, 2, out, &no) == TB_OK && out[0].dims[0] == 4 && out[0].dims[1] == 2 &&
          eq_f32(&out[0], F32(2, 0, 5, 3, 8, 6, 11, 9), 8, 0));
    free_outs(out, no);
    /* a scalar index drops the axis */
    tb_view g2[2] = {V(TB_F32, 2, D(4, 3), t), V(TB_I64, 0, NULL, I64(-2))};
    CHECK(run_ref(&g0, g2, 2, out, &no) == TB_OK && out[0].rank == 1 && eq_f32(&out[0], F32(6, 7, 8), 3, 0));
    free_outs(out, no);
    tb_view g3[2] = {V(TB_F32, 2, D(4, 3), t), VEC(TB_I64, 1, I64(4))};
    CHECK(run_ref(&g0, g3, 2, out, &no) == TB_ERR_INVALID_ARG);
    free_outs(out, no);
    tb_op_shape sh;
    g3[1] = VEC(TB_F32, 1, F32(1));
    CHECK(infer(&g0, g3, 2, &sh) == TB_ERR_FORMAT);
    free(t);
}

static void test_expand_range_cos_trilu(void) {
    tb_view out[1];
    int no;
    float a[3] = {1, 2, 3};
    tb_view in[2] = {V(TB_F32, 2, D(3, 1), a), VEC(TB_I64, 3, I64(2, 1, 2))};
    tb_node e = NODE0(TB_OP_EXPAND);
    CHECK(run_ref(&e, in, 2, out, &no) == TB_OK && out[0].rank == 3 && out[0].dims[1] == 3 &&
          eq_f32(&out[0], F32(1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3), 12, 0));
    free_outs(out, no);
    tb_op_shape sh;
    in[1] = VEC(TB_I64, 2, I64(2, 2));
    CHECK(infer(&e, in, 2, &sh) == TB_ERR_FORMAT); /* 3 vs 2 */
    /* Range over i64, i32 and f32 (ONNX examples: 3, 10, 3 -> 3 6 9; 10, 4, -3 -> 10 7) */
    tb_node r = NODE0(TB_OP_RANGE);
    tb_view ri[3] = {V(TB_I64, 0, NULL, I64(3)), V(TB_I64, 0, NULL, I64(10)), V(TB_I64, 0, NULL, I64(3))};
    CHECK(run_ref(&r, ri, 3, out, &no) == TB_OK && eq_i64(&out[0], I64(3, 6, 9), 3));
    free_outs(out, no);
    const int32_t r32[3] = {10, 4, -3};
    tb_view ri32[3] = {V(TB_I32, 0, NULL, r32), V(TB_I32, 0, NULL, r32 + 1), V(TB_I32, 0, NULL, r32 + 2)};
    CHECK(run_ref(&r, ri32, 3, out, &no) == TB_OK && out[0].dims[0] == 2 && ((int32_t *)out[0].data)[1] == 7);
    free_outs(out, no);
    const float rf[3] = {0.5f, 2.0f, 0.5f};
    tb_view rif[3] = {V(TB_F32, 0, NULL, rf), V(TB_F32, 0, NULL, rf + 1), V(TB_F32, 0, NULL, rf + 2)};
    CHECK(run_ref(&r, rif, 3, out, &no) == TB_OK && eq_f32(&out[0], F32(0.5f, 1.0f, 1.5f), 3, 0));
    free_outs(out, no);
    const int64_t zero = 0;
    ri[2].data = (void *)&zero;
    CHECK(infer(&r, ri, 3, &sh) == TB_ERR_FORMAT);
    ri[2] = rif[2];
    CHECK(infer(&r, ri, 3, &sh) == TB_ERR_FORMAT); /* mixed dtypes */
    ri[2] = V(TB_I64, 0, NULL, NULL);
    CHECK(infer(&r, ri, 3, &sh) == TB_OK && dims_are(&sh, 0, 1, D(TB_DIM_DYN)));
    /* ConstantOfShape: the value's dtype */
    tb_node c = NODE0(TB_OP_CONSTANT_OF_SHAPE);
    const int64_t seven = 7;
    tb_view ci[2] = {VEC(TB_I64, 2, I64(2, 3)), VEC(TB_I64, 1, &seven)};
    CHECK(run_ref(&c, ci, 2, out, &no) == TB_OK && out[0].dtype == TB_I64 &&
          eq_i64(&out[0], I64(7, 7, 7, 7, 7, 7), 6));
    free_outs(out, no);
    ci[0] = VEC(TB_I64, 0, NULL);
    CHECK(run_ref(&c, ci, 2, out, &no) == TB_OK && out[0].rank == 0 && eq_i64(&out[0], I64(7), 1)); /* a scalar */
    free_outs(out, no);
    ci[0] = V(TB_I64, 0, NULL, NULL);
    ci[0].rank = 1; ci[0].dims[0] = 0;
    ci[1] = VEC(TB_I64, 2, I64(1, 2));
    CHECK(infer(&c, ci, 2, &sh) == TB_ERR_FORMAT);
    /* Trilu (ONNX examples): upper k = 0 and lower k = -1 on a batch of 2 (2, 3) */
    float *x = iota_f(12);
    tb_view ti[2] = {V(TB_F32, 3, D(2, 2, 3), x), V(TB_I64, 0, NULL, I64(-1))};
    tb_node up = NODE(TB_OP_TRILU, 1), lo = NODE(TB_OP_TRILU, 0);
    CHECK(run_ref(&up, ti, 1, out, &no) == TB_OK && eq_f32(&out[0], F32(0, 1, 2, 0, 4, 5, 6, 7, 8, 0, 10, 11), 12, 0));
    free_outs(out, no);
    CHECK(run_ref(&lo, ti, 2, out, &no) == TB_OK && eq_f32(&out[0], F32(0, 0, 0, 3, 0, 0, 0, 0, 0, 9, 0, 0), 12, 0));
    free_outs(out, no);
    ti[1] = V(TB_I64, 0, NULL, I64(1));
    CHECK(run_ref(&lo, ti, 2, out, &no) == TB_OK && eq_f32(&out[0], F32(0, 1, 0, 3, 4, 5, 6, 7, 0, 9, 10, 11), 12, 0));
    free_outs(out, no);
    tb_view t1 = VEC(TB_F32, 3, x);
    CHECK(infer(&up, &t1, 1, &sh) == TB_ERR_FORMAT);
    free(x);
}

/* ---------------------------------------------------------------- Resize (ONNX spec examples) */

static tb_node resize_node(int mode, int coord, int nearest, int excl, float a, float extrap) {
    tb_node n = NODE(TB_OP_RESIZE, mode, coord, nearest, excl);
    n.f[0] = a;
    n.f[1] = extrap;
    return n;
}

static void test_resize(void) {
    tb_view out[1];
    int no;
    const float x4[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    const float x22[4] = {1, 2, 3, 4};
    /* resize_upsample_scales_nearest: (1,1,2,2) x (1,1,2,3) */
    tb_view in[3] = {V(TB_F32, 4, D(1, 1, 2, 2), x22), VEC(TB_F32, 4, F32(1, 1, 2, 3))};
    tb_node n = resize_node(TB_NN_RESIZE_NEAREST, TB_NN_COORD_HALF_PIXEL, TB_NN_NEAREST_ROUND_PREFER_FLOOR, 0, -0.75f, 0);
    CHECK(run_ref(&n, in, 2, out, &no) == TB_OK && out[0].dims[2] == 4 && out[0].dims[3] == 6 &&
          eq_f32(&out[0], F32(1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4), 24, 0));
    free_outs(out, no);
    /* resize_downsample_scales_nearest: (1,1,2,4) x 0.6 -> (1,1,1,2) = 1 3 */
    const float x24[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    in[0] = V(TB_F32, 4, D(1, 1, 2, 4), x24);
    in[1] = VEC(TB_F32, 4, F32(1, 1, 0.6f, 0.6f));
    CHECK(run_ref(&n, in, 2, out, &no) == TB_OK && out[0].dims[2] == 1 && out[0].dims[3] == 2 &&
          eq_f32(&out[0], F32(1, 3), 2, 0));
    free_outs(out, no);
    /* resize_upsample_scales_linear (half_pixel): (1,1,2,2) x 2 */
    tb_node lin = resize_node(TB_NN_RESIZE_LINEAR, TB_NN_COORD_HALF_PIXEL, 0, 0, -0.75f, 0);
    in[0] = V(TB_F32, 4, D(1, 1, 2, 2), x22);
    in[1] = VEC(TB_F32, 4, F32(1, 1, 2, 2));
    CHECK(run_ref(&lin, in, 2, out, &no) == TB_OK &&
          eq_f32(&out[0], F32(1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f, 3.5f, 3, 3.25f, 3.75f, 4),
                 16, 1e-6f));
    free_outs(out, no);
    /* resize_upsample_scales_linear_align_corners */
    tb_node lac = resize_node(TB_NN_RESIZE_LINEAR, TB_NN_COORD_ALIGN_CORNERS, 0, 0, -0.75f, 0);
    CHECK(run_ref(&lac, in, 2, out, &no) == TB_OK &&
          eq_f32(&out[0],
                 F32(1, 1.33333333f, 1.66666667f, 2, 1.66666667f, 2, 2.33333333f, 2.66666667f, 2.33333333f,
                     2.66666667f, 3, 3.33333333f, 3, 3.33333333f, 3.66666667f, 4),
                 16, 1e-5f));
    free_outs(out, no);
    /* resize_downsample_scales_linear: (1,1,2,4) x 0.6 -> 2.6666666 4.3333335 */
    in[0] = V(TB_F32, 4, D(1, 1, 2, 4), x24);
    in[1] = VEC(TB_F32, 4, F32(1, 1, 0.6f, 0.6f));
    CHECK(run_ref(&lin, in, 2, out, &no) == TB_OK && eq_f32(&out[0], F32(2.6666666f, 4.3333335f), 2, 1e-5f));
    free_outs(out, no);
    /* resize_downsample_scales_linear_align_corners: 1 3.142857 */
    CHECK(run_ref(&lac, in, 2, out, &no) == TB_OK && eq_f32(&out[0], F32(1, 3.142857f), 2, 1e-5f));
    free_outs(out, no);
    /* resize_upsample_sizes_nearest_ceil_half_pixel: (1,1,4,4) -> sizes 8 8 */
    tb_node nc = resize_node(TB_NN_RESIZE_NEAREST, TB_NN_COORD_HALF_PIXEL, TB_NN_NEAREST_CEIL, 0, -0.75f, 0);
    in[0] = V(TB_F32, 4, D(1, 1, 4, 4), x4);
    in[1] = VEC(TB_I64, 4, I64(1, 1, 8, 8));
    static const float want_ceil[64] = {1,  2,  2,  3,  3,  4,  4,  4,  5,  6,  6,  7,  7,  8,  8,  8,
                                        5,  6,  6,  7,  7,  8,  8,  8,  9,  10, 10, 11, 11, 12, 12, 12,
                                        9,  10, 10, 11, 11, 12, 12, 12, 13, 14, 14, 15, 15, 16, 16, 16,
                                        13, 14, 14, 15, 15, 16, 16, 16, 13, 14, 14, 15, 15, 16, 16, 16};
    CHECK(run_ref(&nc, in, 2, out, &no) == TB_OK && eq_f32(&out[0], want_ceil, 64, 0));
    free_outs(out, no);
    /* resize_upsample_sizes_nearest_floor_align_corners */
    tb_node nf = resize_node(TB_NN_RESIZE_NEAREST, TB_NN_COORD_ALIGN_CORNERS, TB_NN_NEAREST_FLOOR, 0, -0.75f, 0);
    static const float want_floor[64] = {1, 1, 1, 2, 2, 3, 3, 4,  1,  1,  1,  2,  2,  3,  3,  4,
                                         1, 1, 1, 2, 2, 3, 3, 4,  5,  5,  5,  6,  6,  7,  7,  8,
                                         5, 5, 5, 6, 6, 7, 7, 8,  9,  9,  9,  10, 10, 11, 11, 12,
                                         9, 9, 9, 10, 10, 11, 11, 12, 13, 13, 13, 14, 14, 15, 15, 16};
    CHECK(run_ref(&nf, in, 2, out, &no) == TB_OK && eq_f32(&out[0], want_floor, 64, 0));
    free_outs(out, no);
    /* resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric */
    tb_node nr = resize_node(TB_NN_RESIZE_NEAREST, TB_NN_COORD_ASYMMETRIC, TB_NN_NEAREST_ROUND_PREFER_CEIL, 0,
                             -0.75f, 0);
    static const float want_rpc[64] = {1,  2,  2,  3,  3,  4,  4,  4,  5,  6,  6,  7,  7,  8,  8,  8,
                                       5,  6,  6,  7,  7,  8,  8,  8,  9,  10, 10, 11, 11, 12, 12, 12,
                                       9,  10, 10, 11, 11, 12, 12, 12, 13, 14, 14, 15, 15, 16, 16, 16,
                                       13, 14, 14, 15, 15, 16, 16, 16, 13, 14, 14, 15, 15, 16, 16, 16};
    CHECK(run_ref(&nr, in, 2, out, &no) == TB_OK && eq_f32(&out[0], want_rpc, 64, 0));
    free_outs(out, no);
    /* resize_downsample_sizes_linear_pytorch_half_pixel: (1,1,4,4) -> (1,1,3,1) */
    tb_node lp = resize_node(TB_NN_RESIZE_LINEAR, TB_NN_COORD_PYTORCH_HALF_PIXEL, 0, 0, -0.75f, 0);
    in[1] = VEC(TB_I64, 4, I64(1, 1, 3, 1));
    CHECK(run_ref(&lp, in, 2, out, &no) == TB_OK && out[0].dims[2] == 3 && out[0].dims[3] == 1 &&
          eq_f32(&out[0], F32(1.6666666f, 7, 12.333333f), 3, 1e-5f));
    free_outs(out, no);
    /* resize_upsample_scales_cubic (A = -0.75, half_pixel), first row and a middle element */
    tb_node cu = resize_node(TB_NN_RESIZE_CUBIC, TB_NN_COORD_HALF_PIXEL, 0, 0, -0.75f, 0);
    in[1] = VEC(TB_F32, 4, F32(1, 1, 2, 2));
    CHECK(run_ref(&cu, in, 2, out, &no) == TB_OK && out[0].dims[3] == 8 &&
          eq_f32_head(&out[0], F32(0.47265625f, 0.76953125f, 1.24609375f, 1.875f, 2.28125f, 2.91015625f, 3.38671875f,
                              3.68359375f),
                 8, 1e-5f));
    free_outs(out, no);
    /* resize_upsample_scales_cubic_align_corners, first row */
    tb_node ca = resize_node(TB_NN_RESIZE_CUBIC, TB_NN_COORD_ALIGN_CORNERS, 0, 0, -0.75f, 0);
    CHECK(run_ref(&ca, in, 2, out, &no) == TB_OK &&
          eq_f32_head(&out[0], F32(1, 1.34110787f, 1.80029155f, 2.32944606f, 2.67055394f, 3.19970845f, 3.65889213f, 4),
                 8, 1e-5f));
    free_outs(out, no);
    /* resize_downsample_scales_cubic_A_n0p5_exclude_outside: (1,1,4,4) x 0.8 */
    tb_node ce = resize_node(TB_NN_RESIZE_CUBIC, TB_NN_COORD_HALF_PIXEL, 0, 1, -0.5f, 0);
    in[1] = VEC(TB_F32, 4, F32(1, 1, 0.8f, 0.8f));
    CHECK(run_ref(&ce, in, 2, out, &no) == TB_OK && out[0].dims[2] == 3 &&
          eq_f32(&out[0], F32(1.36812675f, 2.6695014f, 4.0133367f, 6.57362535f, 7.875f, 9.2188353f, 11.94896657f,
                              13.25034122f, 14.59417842f),
                 9, 1e-4f));
    free_outs(out, no);
    /* tf_crop_and_resize with extrapolation: roi [0 0 0.4 0.6 1 1 1.2 1.7], sizes 3 3 */
    tb_node tc = resize_node(TB_NN_RESIZE_LINEAR, TB_NN_COORD_TF_CROP_AND_RESIZE, 0, 0, -0.75f, 10);
    in[1] = VEC(TB_I64, 4, I64(1, 1, 3, 3));
    in[2] = VEC(TB_F32, 8, F32(0, 0, 0.4f, 0.6f, 1, 1, 1.2f, 1.7f));
    CHECK(run_ref(&tc, in, 3, out, &no) == TB_OK &&
          eq_f32(&out[0], F32(7.6000004f, 10, 10, 12.400001f, 10, 10, 10, 10, 10), 9, 1e-4f));
    free_outs(out, no);
    /* nearest on i64 any rank; a symbol-free rule with sizes */
    int64_t xi[3] = {5, 6, 7};
    tb_view ii[2] = {VEC(TB_I64, 3, xi), VEC(TB_I64, 1, I64(6))};
    CHECK(run_ref(&n, ii, 2, out, &no) == TB_OK && eq_i64(&out[0], I64(5, 5, 6, 6, 7, 7), 6));
    free_outs(out, no);
    tb_op_shape sh;
    CHECK(infer(&lin, ii, 2, &sh) == TB_ERR_FORMAT); /* linear over i64 */
    ii[1] = VEC(TB_I64, 2, I64(6, 6));
    CHECK(infer(&n, ii, 2, &sh) == TB_ERR_FORMAT);
}

/* ---------------------------------------------------------------- pools */

/* A direct MaxPool / AveragePool over (N, C, H, W) f32 written here. */
static void pool_direct(int is_max, const float *x, int N, int C, int H, int W, int kh, int kw, int sh, int sw,
                        int pt, int pl, int pb, int pr, int dh, int dw, int incl, int OH, int OW, float *y) {
    for (int p = 0; p < N * C; p++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                double m = -INFINITY, s = 0;
                int cnt = 0;
                for (int a = 0; a < kh; a++)
                    for (int b = 0; b < kw; b++) {
                        int ih = oh * sh - pt + a * dh, iw = ow * sw - pl + b * dw;
                        int in = ih >= 0 && ih < H && iw >= 0 && iw < W;
                        if (in) {
                            float v = x[(p * H + ih) * W + iw];
                            if (v > m) m = v;
                            s += v;
                        }
                        if (incl ? ih < H + pb && iw < W + pr : in) cnt++;
                    }
                y[(p * OH + oh) * OW + ow] = (float)(is_max ? m : s / cnt);
            }
}

static void test_pools(void) {
    tb_view out[1];
    int no;
    /* maxpool_2d_precomputed_pads / averagepool_2d_precomputed_pads (ONNX): 5x5, k 5, pads 2 */
    float *x = iota_f(25);
    for (int i = 0; i < 25; i++) x[i] += 1;
    tb_view in = V(TB_F32, 4, D(1, 1, 5, 5), x);
    tb_node mp = NODE(TB_OP_MAXPOOL, 5, 5, 1, 1, 2, 2, 2, 2);
    static const float want_max[25] = {13, 14, 15, 15, 15, 18, 19, 20, 20, 20, 23, 24, 25,
                                       25, 25, 23, 24, 25, 25, 25, 23, 24, 25, 25, 25};
    CHECK(run_ref(&mp, &in, 1, out, &no) == TB_OK && eq_f32(&out[0], want_max, 25, 0));
    free_outs(out, no);
    tb_node ap = NODE(TB_OP_AVGPOOL, 5, 5, 1, 1, 2, 2, 2, 2);
    static const float want_avg[25] = {7, 7.5f, 8, 8.5f, 9, 9.5f, 10, 10.5f, 11, 11.5f, 12, 12.5f, 13,
                                       13.5f, 14, 14.5f, 15, 15.5f, 16, 16.5f, 17, 17.5f, 18, 18.5f, 19};
    CHECK(run_ref(&ap, &in, 1, out, &no) == TB_OK && eq_f32(&out[0], want_avg, 25, 1e-5f));
    free_outs(out, no);
    /* averagepool_2d_pads_count_include_pad (ONNX): 5x5 k3 pads 2 -> 7x7, first row */
    tb_node api = NODE(TB_OP_AVGPOOL, 3, 3, 1, 1, 2, 2, 2, 2, 0, 0, 0, 1);
    CHECK(run_ref(&api, &in, 1, out, &no) == TB_OK && out[0].dims[2] == 7 &&
          eq_f32_head(&out[0], F32(0.11111111f, 0.33333334f, 0.6666667f, 1, 1.3333334f, 1, 0.5555556f), 7, 1e-5f));
    free_outs(out, no);
    /* maxpool_2d_ceil (ONNX): 4x4 k3 s2 ceil -> 2x2 = 11 12 15 16 */
    float *y = iota_f(16);
    for (int i = 0; i < 16; i++) y[i] += 1;
    tb_view in4 = V(TB_F32, 4, D(1, 1, 4, 4), y);
    tb_node mc = NODE(TB_OP_MAXPOOL, 3, 3, 2, 2, 0, 0, 0, 0, 0, 0, 1);
    CHECK(run_ref(&mc, &in4, 1, out, &no) == TB_OK && out[0].dims[2] == 2 && eq_f32(&out[0], F32(11, 12, 15, 16), 4, 0));
    free_outs(out, no);
    /* maxpool_2d_dilations (ONNX): 4x4 k2 d2 -> 11 12 15 16 */
    tb_node md = NODE(TB_OP_MAXPOOL, 2, 2, 1, 1, 0, 0, 0, 0, 2, 2);
    CHECK(run_ref(&md, &in4, 1, out, &no) == TB_OK && eq_f32(&out[0], F32(11, 12, 15, 16), 4, 0));
    free_outs(out, no);
    /* maxpool_2d_same_upper (ONNX): 5x5 k3 s2 -> 3x3 = 7 9 10 17 19 20 22 24 25 */
    tb_node su = NODE(TB_OP_MAXPOOL, 3, 3, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, TB_NN_PAD_SAME_UPPER);
    CHECK(run_ref(&su, &in, 1, out, &no) == TB_OK && eq_f32(&out[0], F32(7, 9, 10, 17, 19, 20, 22, 24, 25), 9, 0));
    free_outs(out, no);
    /* averagepool_2d_same_lower (ONNX, k2 s1): first row 1 1.5 2.5 3.5 4.5 */
    tb_node sl = NODE(TB_OP_AVGPOOL, 2, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, TB_NN_PAD_SAME_LOWER);
    CHECK(run_ref(&sl, &in, 1, out, &no) == TB_OK && eq_f32_head(&out[0], F32(1, 1.5f, 2.5f, 3.5f, 4.5f), 5, 1e-6f));
    free_outs(out, no);
    /* rank 3: w entries only */
    tb_view in1 = V(TB_F32, 3, D(1, 2, 5), x);
    tb_node m1 = NODE(TB_OP_MAXPOOL, 0, 2, 0, 2);
    CHECK(run_ref(&m1, &in1, 1, out, &no) == TB_OK && out[0].rank == 3 && out[0].dims[2] == 2 &&
          eq_f32(&out[0], F32(2, 4, 7, 9), 4, 0));
    free_outs(out, no);
    /* odd shapes against the direct loop: every flag */
    uint64_t st = 0x1234567;
    float *big = malloc(2 * 3 * 11 * 13 * sizeof *big), *want = malloc(2 * 3 * 11 * 13 * 4 * sizeof *want);
    for (int i = 0; i < 2 * 3 * 11 * 13; i++) big[i] = tb_test_frand(&st);
    tb_view bv = V(TB_F32, 4, D(2, 3, 11, 13), big);
    for (int is_max = 0; is_max < 2; is_max++)
        for (int cm = 0; cm < 2; cm++)
            for (int incl = 0; incl < 2; incl++) {
                tb_node pn = NODE(is_max ? TB_OP_MAXPOOL : TB_OP_AVGPOOL, 3, 2, 2, 3, 1, 0, 2, 1, 1, 2, cm, incl);
                if (run_ref(&pn, &bv, 1, out, &no) != TB_OK) { CHECK(0); continue; }
                int OH = (int)out[0].dims[2], OW = (int)out[0].dims[3];
                /* floor((11 + 3 - 3) / 2) + 1 = 6 (ceil: 7 - dropped? 12/2 exact): 6; W: (13 + 1 - 3) / 3 + 1 = 4, ceil 5 */
                CHECK(OH == 6 && OW == (cm ? 5 : 4));
                pool_direct(is_max, big, 2, 3, 11, 13, 3, 2, 2, 3, 1, 0, 2, 1, 1, 2, incl, OH, OW, want);
                CHECK_MSG(eq_f32(&out[0], want, 2 * 3 * OH * OW, 1e-5f), "pool max %d ceil %d incl %d", is_max, cm,
                          incl);
                free_outs(out, no);
            }
    /* GlobalAveragePool */
    tb_node gp = NODE0(TB_OP_GLOBAL_AVGPOOL);
    tb_view g3 = V(TB_F32, 3, D(1, 2, 3), x);
    CHECK(run_ref(&gp, &g3, 1, out, &no) == TB_OK && out[0].rank == 3 && eq_f32(&out[0], F32(2, 5), 2, 1e-6f));
    free_outs(out, no);
    tb_op_shape sh;
    tb_view bad = V(TB_F32, 2, D(2, 3), x);
    CHECK(infer(&gp, &bad, 1, &sh) == TB_ERR_FORMAT && infer(&mp, &bad, 1, &sh) == TB_ERR_FORMAT);
    tb_node k0 = NODE(TB_OP_MAXPOOL, 0, 0);
    CHECK(infer(&k0, &in, 1, &sh) == TB_ERR_FORMAT);
    tb_node big_k = NODE(TB_OP_MAXPOOL, 7, 7);
    CHECK(infer(&big_k, &in, 1, &sh) == TB_ERR_FORMAT);
    free(x); free(y); free(big); free(want);
}

/* ---------------------------------------------------------------- fast kernels against the references */

static tb_cpu_nn_ctx g_ctx;

/* Runs op n through the CPU dispatch (fast kernel) and the reference and
 * compares the bytes (tol > 0: f32 within tol relative to the largest). */
static int fast_vs_ref(const tb_node *n, const tb_view *in, int n_in, float tol, const char *what) {
    tb_view ref[TB_MAX_OUTPUTS], fast[TB_MAX_OUTPUTS];
    int no = 0, ok = 1;
    if (run_ref(n, in, n_in, ref, &no) != TB_OK) {
        fprintf(stderr, "%s: reference failed: %s\n", what, tb_last_error());
        free_outs(ref, no);
        return 0;
    }
    for (int o = 0; o < no; o++) {
        fast[o] = ref[o];
        size_t bytes = (size_t)tb_view_numel(&ref[o]) * tb_dtype_size(ref[o].dtype);
        fast[o].data = malloc(bytes + 16);
        memset(fast[o].data, 0xab, bytes + 16);
    }
    tb_node m = *n;
    m.n_in = n_in;
    m.n_out = no;
    if (tb_cpu_nn_run(&g_ctx, &m, in, n_in, fast, no) != TB_OK) {
        fprintf(stderr, "%s: fast kernel failed: %s\n", what, tb_last_error());
        ok = 0;
    }
    for (int o = 0; ok && o < no; o++) {
        int64_t ne = tb_view_numel(&ref[o]);
        size_t bytes = (size_t)ne * tb_dtype_size(ref[o].dtype);
        if (tol > 0 && ref[o].dtype == TB_F32) {
            float e = tb_test_max_rel(fast[o].data, ref[o].data, (int)ne);
            if (!(e <= tol)) { fprintf(stderr, "%s: output %d differs by %g\n", what, o, e); ok = 0; }
        } else if (memcmp(fast[o].data, ref[o].data, bytes)) {
            fprintf(stderr, "%s: output %d differs\n", what, o);
            ok = 0;
        }
        uint8_t guard[16];
        memset(guard, 0xab, 16);
        if (memcmp((uint8_t *)fast[o].data + bytes, guard, 16)) {
            fprintf(stderr, "%s: output %d written past its end\n", what, o);
            ok = 0;
        }
    }
    free_outs(ref, no);
    free_outs(fast, no);
    return ok;
}

static void *rand_data(tb_dtype t, int64_t n, uint64_t *st) {
    size_t es = tb_dtype_size(t);
    uint8_t *p = malloc((size_t)n * es + 16);
    for (int64_t i = 0; i < n; i++) {
        if (t == TB_F32) ((float *)p)[i] = tb_test_frand(st);
        else for (size_t b = 0; b < es; b++) p[i * es + b] = (uint8_t)(tb_test_frand(st) * 127 + 128);
    }
    return p;
}

static void test_fast_kernels(void) {
    tb_pool *pool = NULL;
    CHECK(tb_pool_create(3, &pool) == TB_OK);
    g_ctx.pool = pool;
    uint64_t st = 0x9e3779b97f4a7c15ull;
    static const tb_dtype dts[4] = {TB_F32, TB_F16, TB_U8, TB_I64};
    char what[128];
    /* Transpose: every permutation of rank 4 on odd dims, four element sizes;
     * BERT's shapes big enough to take the threads */
    static const int64_t shapes[3][4] = {{3, 5, 7, 9}, {1, 37, 2, 41}, {2, 12, 67, 64}};
    for (int si = 0; si < 3; si++)
        for (int di = 0; di < 4; di++) {
            if (si == 2 && di != 0) continue;
            tb_view x = V(dts[di], 4, shapes[si], NULL);
            x.data = rand_data(dts[di], tb_view_numel(&x), &st);
            int perm[4] = {0, 1, 2, 3}, c[4] = {0};
            for (int k = 0; k < 24; k++) { /* Heap's algorithm, iteratively */
                tb_node n = NODE(TB_OP_TRANSPOSE, perm[0], perm[1], perm[2], perm[3]);
                snprintf(what, sizeof what, "transpose %d/%s (%d %d %d %d)", si, tb_dtype_name(dts[di]), perm[0],
                         perm[1], perm[2], perm[3]);
                CHECK_MSG(fast_vs_ref(&n, &x, 1, 0, what), "%s", what);
                int i = 1;
                while (i < 4 && c[i] >= i) c[i++] = 0;
                if (i >= 4) break;
                int j = i % 2 ? c[i] : 0, t = perm[i];
                perm[i] = perm[j]; perm[j] = t;
                c[i]++;
            }
            free(x.data);
        }
    {
        /* rank 2, 3 and 6 */
        tb_view x = V(TB_F32, 2, D(129, 67), NULL);
        x.data = rand_data(TB_F32, tb_view_numel(&x), &st);
        tb_node n = NODE(TB_OP_TRANSPOSE, 1, 0);
        CHECK(fast_vs_ref(&n, &x, 1, 0, "transpose 2-d"));
        x = V(TB_F32, 6, D(2, 3, 1, 5, 4, 3), x.data);
        n = NODE(TB_OP_TRANSPOSE, 5, 3, 0, 2, 4, 1);
        CHECK(fast_vs_ref(&n, &x, 1, 0, "transpose 6-d"));
        free(x.data);
    }
    /* copies: Reshape / Squeeze / Unsqueeze / Flatten, large enough to split */
    {
        tb_view in[2] = {V(TB_F32, 3, D(7, 300, 301), NULL), VEC(TB_I64, 2, I64(-1, 301))};
        in[0].data = rand_data(TB_F32, tb_view_numel(&in[0]), &st);
        tb_node n = NODE0(TB_OP_RESHAPE);
        CHECK(fast_vs_ref(&n, in, 2, 0, "reshape"));
        tb_node f = NODE(TB_OP_FLATTEN, 1);
        CHECK(fast_vs_ref(&f, in, 1, 0, "flatten"));
        in[1] = VEC(TB_I64, 1, I64(1));
        tb_node u = NODE0(TB_OP_UNSQUEEZE);
        CHECK(fast_vs_ref(&u, in, 2, 0, "unsqueeze"));
        /* aliased buffers: nothing to do */
        tb_view o = V(TB_F32, 2, D(2100, 301), in[0].data);
        in[1] = VEC(TB_I64, 2, I64(-1, 301));
        n.n_in = 2; n.n_out = 1;
        CHECK(tb_cpu_nn_run(&g_ctx, &n, in, 2, &o, 1) == TB_OK);
        free(in[0].data);
    }
    /* Slice: steps of both signs, clamps, on f32 and u8 */
    for (int di = 0; di < 3; di++) {
        tb_view in[5] = {V(dts[di], 3, D(5, 33, 70), NULL), VEC(TB_I64, 3, I64(1, -30, 65)),
                         VEC(TB_I64, 3, I64(100, 31, 2)), VEC(TB_I64, 3, I64(0, 1, 2)), VEC(TB_I64, 3, I64(2, 3, -7))};
        in[0].data = rand_data(dts[di], tb_view_numel(&in[0]), &st);
        tb_node n = NODE0(TB_OP_SLICE);
        CHECK_MSG(fast_vs_ref(&n, in, 5, 0, "slice steps"), "%s", tb_dtype_name(dts[di]));
        in[4] = VEC(TB_I64, 3, I64(1, 1, 1));
        in[2] = VEC(TB_I64, 3, I64(4, 20, INT64_MAX));
        in[1] = VEC(TB_I64, 3, I64(0, 3, 5));
        CHECK_MSG(fast_vs_ref(&n, in, 5, 0, "slice rows"), "%s", tb_dtype_name(dts[di]));
        in[1] = VEC(TB_I64, 1, I64(-1));
        in[2] = VEC(TB_I64, 1, I64(INT64_MIN));
        in[3] = VEC(TB_I64, 1, I64(-1));
        in[4] = VEC(TB_I64, 1, I64(-1));
        CHECK_MSG(fast_vs_ref(&n, in, 5, 0, "slice reverse"), "%s", tb_dtype_name(dts[di]));
        free(in[0].data);
    }
    /* Expand, Concat (3 parts, every axis), Split, Gather */
    {
        tb_view in[3] = {V(TB_F32, 3, D(3, 1, 5), NULL), VEC(TB_I64, 4, I64(2, 3, 77, 5))};
        in[0].data = rand_data(TB_F32, 15, &st);
        tb_node e = NODE0(TB_OP_EXPAND);
        CHECK(fast_vs_ref(&e, in, 2, 0, "expand"));
        in[0].dims[2] = 1;
        in[1] = VEC(TB_I64, 3, I64(3, 64, 129));
        CHECK(fast_vs_ref(&e, in, 2, 0, "expand inner"));
        free(in[0].data);
        for (int axis = 0; axis < 3; axis++) {
            int64_t d0[3] = {4, 5, 6}, d1[3] = {4, 5, 6}, d2[3] = {4, 5, 6};
            d0[axis] = 3; d1[axis] = 0; d2[axis] = 7;
            tb_view parts[3] = {V(TB_F16, 3, d0, NULL), V(TB_F16, 3, d1, NULL), V(TB_F16, 3, d2, NULL)};
            for (int k = 0; k < 3; k++) parts[k].data = rand_data(TB_F16, tb_view_numel(&parts[k]), &st);
            tb_node c = NODE(TB_OP_CONCAT, axis);
            snprintf(what, sizeof what, "concat axis %d", axis);
            CHECK_MSG(fast_vs_ref(&c, parts, 3, 0, what), "%s", what);
            tb_view whole = V(TB_F16, 3, D(4, 5, 6), NULL);
            whole.dims[axis] = 10;
            whole.data = rand_data(TB_F16, tb_view_numel(&whole), &st);
            tb_view sp[2] = {whole, VEC(TB_I64, 3, I64(3, 0, 7))};
            tb_node s = NODE(TB_OP_SPLIT, axis);
            snprintf(what, sizeof what, "split axis %d", axis);
            CHECK_MSG(fast_vs_ref(&s, sp, 2, 0, what), "%s", what);
            tb_node s4 = NODE(TB_OP_SPLIT, axis, 4);
            CHECK_MSG(fast_vs_ref(&s4, sp, 1, 0, what), "%s (4 parts)", what);
            free(whole.data);
            for (int k = 0; k < 3; k++) free(parts[k].data);
        }
        tb_view g[2] = {V(TB_F32, 2, D(1000, 77), NULL), V(TB_I32, 2, D(3, 129), NULL)};
        g[0].data = rand_data(TB_F32, 77000, &st);
        int32_t *ids = malloc(3 * 129 * sizeof *ids);
        for (int i = 0; i < 3 * 129; i++) ids[i] = (int32_t)((i * 7919) % 2000) - 1000;
        g[1].data = ids;
        tb_node g0 = NODE(TB_OP_GATHER, 0);
        CHECK(fast_vs_ref(&g0, g, 2, 0, "gather rows"));
        tb_node g1 = NODE(TB_OP_GATHER, 1);
        g[1] = VEC(TB_I32, 3, ((const int32_t[]){-1, 0, 5}));
        CHECK(fast_vs_ref(&g1, g, 2, 0, "gather axis 1"));
        g[1] = VEC(TB_I64, 2, I64(3, 1000));
        tb_view o = V(TB_F32, 2, D(2, 77), malloc(2 * 77 * 4));
        g0.n_in = 2; g0.n_out = 1;
        CHECK(tb_cpu_nn_run(&g_ctx, &g0, g, 2, &o, 1) == TB_ERR_INVALID_ARG);
        free(o.data);
        free(g[0].data);
        free(ids);
    }
    /* pools: ResNet's maxpool and global average pool, and odd geometries */
    {
        static const int32_t cases[][13] = {
            {3, 3, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 0},  /* ResNet stem       */
            {3, 3, 2, 2, 1, 1, 1, 1, 0, 0, 1, 1, 0},  /* ceil, incl        */
            {2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0},
            {3, 2, 1, 3, 2, 0, 1, 2, 2, 1, 1, 0, 0},  /* dilated, uneven   */
            {5, 4, 3, 1, 0, 0, 0, 0, 1, 3, 0, 1, 1},  /* SAME_UPPER        */
            {3, 3, 3, 2, 0, 0, 0, 0, 0, 0, 1, 0, 2},  /* SAME_LOWER        */
            {1, 7, 1, 7, 0, 3, 0, 3, 0, 0, 1, 1, 3},  /* VALID             */
        };
        static const int64_t xs[3][4] = {{2, 64, 112, 112}, {1, 3, 13, 17}, {3, 5, 9, 31}};
        for (int xi = 0; xi < 3; xi++) {
            tb_view x = V(TB_F32, 4, xs[xi], NULL);
            x.data = rand_data(TB_F32, tb_view_numel(&x), &st);
            for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
                if (xi == 0 && ci > 1) break;
                for (int is_max = 0; is_max < 2; is_max++) {
                    tb_node n = node(is_max ? TB_OP_MAXPOOL : TB_OP_AVGPOOL, cases[ci], 13, NULL, 0);
                    snprintf(what, sizeof what, "%s case %zu on shape %d", is_max ? "maxpool" : "avgpool", ci, xi);
                    CHECK_MSG(fast_vs_ref(&n, &x, 1, is_max ? 0 : 1e-5f, what), "%s", what);
                }
            }
            /* rank 3 */
            tb_view x3 = V(TB_F32, 3, D(xs[xi][0], xs[xi][1], xs[xi][2] * xs[xi][3]), x.data);
            tb_node m3 = NODE(TB_OP_MAXPOOL, 0, 3, 0, 2, 0, 1, 0, 1);
            CHECK(fast_vs_ref(&m3, &x3, 1, 0, "maxpool rank 3"));
            tb_node gp = NODE0(TB_OP_GLOBAL_AVGPOOL);
            CHECK(fast_vs_ref(&gp, &x, 1, 1e-5f, "global average pool"));
            free(x.data);
        }
        tb_view r7 = V(TB_F32, 4, D(2, 512, 7, 7), NULL);
        r7.data = rand_data(TB_F32, tb_view_numel(&r7), &st);
        tb_node gp = NODE0(TB_OP_GLOBAL_AVGPOOL);
        CHECK(fast_vs_ref(&gp, &r7, 1, 1e-5f, "global average pool (N, 512, 7, 7)"));
        free(r7.data);
    }
    /* ops without a fast kernel run their reference through the dispatch */
    CHECK(tb_cpu_nn_shape_kernel(TB_OP_RESIZE) == NULL && tb_cpu_nn_shape_kernel(TB_OP_TRANSPOSE) != NULL);
    tb_cpu_nn_ctx_release(&g_ctx);
    g_ctx.pool = NULL;
    tb_pool_free(pool);
}

int main(void) {
    test_schema();
    test_bert_gpt2_chains();
    test_reshape();
    test_transpose();
    test_unsqueeze_squeeze_flatten();
    test_slice();
    test_concat_split();
    test_shape_gather();
    test_expand_range_cos_trilu();
    test_resize();
    test_pools();
    test_fast_kernels();
    return tb_test_finish("test_nn_shape");
}
