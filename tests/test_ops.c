/*
 * test_ops.c — the op table (ir/ops.c): every definition consistent, the
 * attribute schema reads and writes each attribute in its own bits, nodes
 * with attributes outside their ranges or with undefined bits are refused
 * when added and when a serialized graph is loaded, and the CPU backend's
 * supports_op refuses what its kernels do not implement.
 */
#include "backend/backend.h"
#include "ir/ops_nn.h"
#include "tb_test.h"

static void test_table(void) {
    for (int k = 0; k < TB_OP_COUNT; k++) {
        const tb_op_def *d = tb_op_get_def((tb_op_kind)k);
        CHECK_MSG(d != NULL, "op %d has no definition", k);
        if (!d) continue;
        CHECK_MSG(d->name && d->name[0] && !strcmp(tb_op_name((tb_op_kind)k), d->name), "op %d: name", k);
        for (int j = 0; j < k; j++) CHECK_MSG(strcmp(d->name, tb_op_name((tb_op_kind)j)), "%s: name twice", d->name);
        CHECK_MSG(d->min_in >= 1 && d->min_in <= d->max_in && d->max_in <= TB_MAX_INPUTS, "%s: arity", d->name);
        CHECK_MSG(d->n_out >= 1 && d->n_out <= TB_MAX_OUTPUTS, "%s: outputs", d->name);
        CHECK_MSG((d->shape != NULL || (d->infer != NULL && d->ref != NULL && tb_op_is_nn((tb_op_kind)k))) &&
                      d->signature && d->signature[0],
                  "%s: shape rule (general ops: rule and reference kernel)", d->name);
        CHECK_MSG(d->n_attrs >= 0 && d->n_attrs <= TB_MAX_ATTRS, "%s: attribute count", d->name);
        uint32_t used_i[TB_NODE_INTS] = {0};
        int used_f[TB_NODE_FLOATS] = {0};
        for (int a = 0; a < d->n_attrs; a++) {
            const tb_attr_def *at = &d->attrs[a];
            CHECK_MSG(at->name && at->name[0] && at->slot >= 0 && at->slot < (at->type == TB_ATTR_FLOAT ? TB_NODE_FLOATS : TB_NODE_INTS) && at->lo <= at->hi,
                      "%s: attribute %d", d->name, a);
            for (int b = 0; b < a; b++) CHECK_MSG(strcmp(at->name, d->attrs[b].name), "%s.%s twice", d->name, at->name);
            if (at->type == TB_ATTR_FLOAT) {
                CHECK_MSG(!used_f[at->slot], "%s.%s shares f[%d]", d->name, at->name, at->slot);
                used_f[at->slot] = 1;
                continue;
            }
            CHECK_MSG(at->shift >= 0 && at->bits >= 1 && (at->bits >= 32 ? at->shift == 0 : at->shift + at->bits <= 32),
                      "%s.%s: bit field", d->name, at->name);
            uint32_t m = at->bits >= 32 ? 0xffffffffu : ((1u << at->bits) - 1u) << at->shift;
            CHECK_MSG(!(used_i[at->slot] & m), "%s.%s overlaps another attribute", d->name, at->name);
            used_i[at->slot] |= m;
            /* the range fits the field (fields are unsigned) */
            if (at->bits < 32) CHECK_MSG(at->lo >= 0 && at->hi <= (double)((1u << at->bits) - 1u), "%s.%s range",
                                         d->name, at->name);
            if (at->type == TB_ATTR_BOOL) CHECK_MSG(at->lo == 0 && at->hi == 1, "%s.%s: a bool", d->name, at->name);
        }
    }
    CHECK(tb_op_get_def((tb_op_kind)TB_OP_COUNT) == NULL);
    CHECK(!strcmp(tb_op_name((tb_op_kind)-1), "?"));
}

/* every attribute written at both ends of its range reads back, and does not
 * disturb the others */
static void test_attr_round_trip(void) {
    for (int k = 0; k < TB_OP_COUNT; k++) {
        const tb_op_def *d = tb_op_get_def((tb_op_kind)k);
        if (!d) continue;
        for (int end = 0; end < 2; end++) {
            tb_node n;
            memset(&n, 0, sizeof n);
            n.op = (tb_op_kind)k;
            for (int a = 0; a < d->n_attrs; a++) {
                const tb_attr_def *at = &d->attrs[a];
                if (at->type == TB_ATTR_FLOAT) tb_attr_set_f(n.op, a, n.f, (float)(end ? at->hi : at->lo));
                else tb_attr_set_i(n.op, a, n.i, (int32_t)(end ? at->hi : at->lo));
            }
            for (int a = 0; a < d->n_attrs; a++) {
                const tb_attr_def *at = &d->attrs[a];
                double want = end ? at->hi : at->lo;
                if (at->type == TB_ATTR_FLOAT)
                    CHECK_MSG(tb_node_attr_f(&n, a) == (float)want, "%s.%s", d->name, at->name);
                else
                    CHECK_MSG(tb_node_attr_i(&n, a) == (int32_t)want, "%s.%s: %d", d->name, at->name,
                              tb_node_attr_i(&n, a));
            }
            CHECK_MSG(tb_op_check_attrs(&n) == TB_OK, "%s: attributes at their %s: %s", d->name, end ? "maxima" : "minima",
                      tb_last_error());
        }
    }
    /* the packing the engine files have always used for attention */
    int32_t i[4] = {0};
    tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_LAYER, i, 3);
    tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_HEADS, i, 8);
    tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_KV_HEADS, i, 2);
    tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_HEAD_DIM, i, 128);
    tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_INTERLEAVED, i, 1);
    CHECK(i[0] == 3 && i[1] == 8 && i[2] == 2 && i[3] == (128 | 1 << 16));
}

static tb_node attention_node(int H, int KV, int hd) {
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = TB_OP_ATTENTION;
    tb_attr_set_i(n.op, TB_ATTN_HEADS, n.i, H);
    tb_attr_set_i(n.op, TB_ATTN_KV_HEADS, n.i, KV);
    tb_attr_set_i(n.op, TB_ATTN_HEAD_DIM, n.i, hd);
    tb_attr_set_f(n.op, TB_ATTN_SCALE, n.f, 0.25f);
    return n;
}

static void test_attr_checks(void) {
    tb_node n = attention_node(4, 2, 16);
    CHECK(tb_op_check_attrs(&n) == TB_OK);
    tb_node m = n;
    tb_attr_set_i(m.op, TB_ATTN_HEAD_DIM, m.i, 0);
    CHECK(tb_op_check_attrs(&m) == TB_ERR_FORMAT && strstr(tb_last_error(), "head_dim"));
    m = n;
    m.i[3] |= 1 << 20; /* no attribute there */
    CHECK(tb_op_check_attrs(&m) == TB_ERR_FORMAT && strstr(tb_last_error(), "slot 3"));
    m = n;
    m.f[0] = NAN;
    CHECK(tb_op_check_attrs(&m) == TB_ERR_FORMAT && strstr(tb_last_error(), "scale"));
    m = n;
    m.f[2] = 1.0f;
    CHECK(tb_op_check_attrs(&m) == TB_ERR_FORMAT);
    m = n;
    tb_attr_set_i(m.op, TB_ATTN_LAYER, m.i, -1);
    CHECK(tb_op_check_attrs(&m) == TB_ERR_FORMAT && strstr(tb_last_error(), "layer"));
    tb_node r;
    memset(&r, 0, sizeof r);
    r.op = TB_OP_RMSNORM;
    tb_attr_set_f(r.op, TB_NORM_EPS, r.f, -1e-5f);
    CHECK(tb_op_check_attrs(&r) == TB_ERR_FORMAT && strstr(tb_last_error(), "eps"));
    r.op = TB_OP_ADD; /* takes no attributes: any set bit is refused */
    r.f[0] = 0; r.i[1] = 1;
    CHECK(tb_op_check_attrs(&r) == TB_ERR_FORMAT);
}

/* A graph: qkv (tokens, (H + 2 KV) hd) -> attention -> add with itself. */
static tb_graph *small_graph(int H, int KV, int hd, int *att_node) {
    tb_graph *g = tb_graph_new();
    if (!g) return NULL;
    int tok = tb_graph_add_sym(g, "tokens", 1, 4, 8);
    tb_graph_add_sym(g, "rows", 1, 1, 8);
    int qkv = tb_graph_add_value(g, "qkv", TB_VAL_INPUT, TB_F32, 2,
                                 (const int64_t[]){TB_SYM(tok), (int64_t)(H + 2 * KV) * hd});
    float *inv = calloc((size_t)hd / 2, sizeof(float));
    int w = tb_graph_add_weight(g, "inv_freq", TB_F32, 1, (const int64_t[]){hd / 2}, inv, 1);
    tb_node a = attention_node(H, KV, hd);
    *att_node = tb_graph_add_node(g, TB_OP_ATTENTION, (const int[]){qkv, w}, 2, "att", a.i, a.f);
    if (*att_node < 0) { tb_graph_free(g); return NULL; }
    int o = g->nodes[*att_node].out[0];
    int s = tb_graph_add_node(g, TB_OP_ADD, (const int[]){o, o}, 2, "sum", NULL, NULL);
    if (s < 0) { tb_graph_free(g); return NULL; }
    g->output = g->nodes[s].out[0];
    return g;
}

static void test_graph(void) {
    int an = -1;
    tb_graph *g = small_graph(4, 2, 16, &an);
    CHECK_MSG(g != NULL, "small graph: %s", tb_last_error());
    if (!g) return;
    CHECK(tb_graph_check(g) == TB_OK);
    /* arity and attributes are checked when a node is added */
    int x = tb_graph_find_value(g, "qkv");
    CHECK(tb_graph_add_node(g, TB_OP_MATMUL, (const int[]){x}, 1, "mm", NULL, NULL) < 0 &&
          strstr(tb_last_error(), "2 to 3"));
    tb_node bad = attention_node(4, 3, 16); /* 4 heads over 3 kv heads */
    CHECK(tb_graph_add_node(g, TB_OP_ATTENTION, (const int[]){x, 1}, 2, "att2", bad.i, bad.f) < 0);
    bad = attention_node(4, 2, 16);
    bad.i[3] |= 1 << 24;
    CHECK(tb_graph_add_node(g, TB_OP_ATTENTION, (const int[]){x, 1}, 2, "att3", bad.i, bad.f) < 0);

    /* a serialized graph whose attention node has an undefined bit set fails to load */
    uint8_t *buf = NULL;
    size_t n = 0;
    CHECK(tb_graph_serialize(g, &buf, &n) == TB_OK);
    tb_graph *back = NULL;
    CHECK(tb_graph_deserialize(buf, n, &back) == TB_OK && back && back->n_nodes == g->n_nodes);
    tb_graph_free(back);
    back = NULL;
    uint8_t *at = NULL;
    for (size_t off = 0; off + sizeof g->nodes[an].i <= n; off++)
        if (!memcmp(buf + off, g->nodes[an].i, sizeof g->nodes[an].i)) { at = buf + off; break; }
    CHECK(at != NULL);
    if (at) {
        int32_t i3;
        memcpy(&i3, at + 12, 4);
        i3 |= 1 << 17;
        memcpy(at + 12, &i3, 4);
        CHECK(tb_graph_deserialize(buf, n, &back) == TB_ERR_FORMAT && back == NULL);
        tb_graph_free(back);
    }
    free(buf);

    /* the CPU backend runs these nodes, and not an rmsnorm over f16 activations
     * nor an add over rank-3 values, which the shape rules allow */
    tb_backend *be = NULL;
    CHECK(tb_backend_create("cpu", 1, 64, &be) == TB_OK && be);
    if (be) {
        for (int k = 0; k < g->n_nodes; k++)
            CHECK_MSG(be->iface->supports_op(be, g, &g->nodes[k]), "cpu: node %d (%s)", k,
                      tb_op_name(g->nodes[k].op));
        int h = tb_graph_add_value(g, "h16", TB_VAL_INPUT, TB_F16, 2, (const int64_t[]){4, 8});
        float *nw = calloc(8, sizeof(float));
        int w = tb_graph_add_weight(g, "nw", TB_F32, 1, (const int64_t[]){8}, nw, 1);
        float eps[4] = {0};
        tb_attr_set_f(TB_OP_RMSNORM, TB_NORM_EPS, eps, 1e-5f);
        int rn = tb_graph_add_node(g, TB_OP_RMSNORM, (const int[]){h, w}, 2, "rn", NULL, eps);
        CHECK(rn >= 0 && !be->iface->supports_op(be, g, &g->nodes[rn]));
        int c3 = tb_graph_add_value(g, "c3", TB_VAL_INPUT, TB_F32, 3, (const int64_t[]){2, 3, 4});
        int ad = tb_graph_add_node(g, TB_OP_ADD, (const int[]){c3, c3}, 2, "a3", NULL, NULL);
        CHECK(ad >= 0 && !be->iface->supports_op(be, g, &g->nodes[ad]));
        int c2 = tb_graph_add_value(g, "c2", TB_VAL_INPUT, TB_F32, 2, (const int64_t[]){3, 4});
        ad = tb_graph_add_node(g, TB_OP_ADD, (const int[]){c2, c2}, 2, "a2", NULL, NULL);
        CHECK(ad >= 0 && be->iface->supports_op(be, g, &g->nodes[ad]));
        tb_backend_free(be);
    }
    tb_graph_free(g);
}

int main(void) {
    test_table();
    test_attr_round_trip();
    test_attr_checks();
    test_graph();
    printf("test_ops: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
