/*
 * nn_layout.c — channels-last activations for f16 convolutional graphs on
 * the CUDA backend.
 *
 * cuDNN's f16 tensor-core convolutions want (N, H, W, C) tensors. Transposing
 * x, y and the residual around each convolution costs what the faster kernel
 * saves, so the backend keeps activations channels-last between the ops that
 * can read and write them, and transposes only where the graph leaves that
 * region. The graph, its shapes and the memory plan stay as built (the views
 * still say (N, C, H, W); a buffer has the same bytes either way): only the
 * order of the elements inside some buffers differs, and it is decided here,
 * once per graph, from its nodes alone (the same decision eagerly, captured
 * and replayed).
 *
 * A value is held channels-last when it is a 4-d f16 activation that is not
 * a graph output, its producer writes channels-last, and every reader reads
 * it. Producers and readers:
 *   Conv (group 1, explicit symmetric pads): reads x, writes y; its residual
 *     is held as y is (the epilogue walks both in one order);
 *   MaxPool / AveragePool (2-d): input and output alike;
 *   GlobalAveragePool: reads (its (N, C, 1, 1) output is the same bytes);
 *   unary elementwise ops, and binary ones whose inputs both have the
 *     output's shape: inputs and output alike (they walk flat indices).
 * Everything else reads (N, C, H, W). The rules shrink the set to a fixed
 * point from every candidate. Off without cuDNN, for f32 graphs, and with
 * TB_CUDA_NHWC=0.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/nn_backend.h"
#include "ir/ops_nn.h"

static int layout_off(void) {
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("TB_CUDA_NHWC");
        off = e && !strcmp(e, "0");
    }
    return off;
}

static int is_unary_ew(tb_op_kind k) {
    switch (k) {
    case TB_OP_RELU: case TB_OP_SIGMOID: case TB_OP_TANH: case TB_OP_EXP: case TB_OP_LOG: case TB_OP_NEG:
    case TB_OP_ABS: case TB_OP_SQRT: case TB_OP_RECIPROCAL: case TB_OP_ERF: case TB_OP_FLOOR: case TB_OP_CEIL:
    case TB_OP_CLIP: case TB_OP_GELU:
        return 1;
    default: return 0;
    }
}

static int is_binary_ew(tb_op_kind k) {
    return k == TB_OP_NN_ADD || k == TB_OP_SUB || k == TB_OP_MUL || k == TB_OP_DIV;
}

static int same_dims(const tb_value *a, const tb_value *b) {
    if (a->rank != b->rank) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return 0;
    return 1;
}

/* Conv node n: whether it can run channels-last on cuDNN */
static int conv_ok(const tb_graph *g, const tb_node *n) {
    const tb_value *xv = &g->values[n->in[0]], *wv = &g->values[n->in[1]], *yv = &g->values[n->out[0]];
    if (xv->rank != 4 || wv->rank != 4 || xv->dtype != TB_F16 || wv->dtype != TB_F16 || yv->dtype != TB_F16)
        return 0;
    const int32_t *a = n->i;
    if (a[0] > 1) return 0;                                       /* group 1 */
    if (a[9] != TB_NN_PAD_NOTSET && a[9] != TB_NN_PAD_VALID) return 0;
    if (a[9] == TB_NN_PAD_NOTSET && (a[3] != a[5] || a[4] != a[6])) return 0; /* symmetric pads */
    return 1;
}

/* the role of node n's input j: 0 reads (N, C, H, W) only, 1 reads either
 * (no tie), 2 tied to the output's layout */
static int in_role(const tb_graph *g, const tb_node *n, int j) {
    switch (n->op) {
    case TB_OP_CONV:
        if (!conv_ok(g, n)) return 0;
        if (j == 0) return 1;
        if ((n->i[11] & TB_NN_HAS_RESIDUAL) && j == n->n_in - 1) return 2;
        return 0;
    case TB_OP_MAXPOOL: case TB_OP_AVGPOOL:
        return j == 0 && g->values[n->in[0]].rank == 4 && n->n_out == 1 ? 2 : 0;
    case TB_OP_GLOBAL_AVGPOOL:
        return j == 0 && g->values[n->in[0]].rank == 4 ? 1 : 0;
    default:
        if (is_unary_ew(n->op) && j == 0 && n->n_in >= 1) return 2;
        if (is_binary_ew(n->op) && j < 2 && n->n_in == 2 &&
            same_dims(&g->values[n->in[0]], &g->values[n->out[0]]) &&
            same_dims(&g->values[n->in[1]], &g->values[n->out[0]]))
            return 2;
        return 0;
    }
}

/* whether node n can write its (first) output channels-last */
static int out_ok(const tb_graph *g, const tb_node *n) {
    if (n->n_out != 1) return 0;
    if (n->op == TB_OP_CONV) return conv_ok(g, n);
    if (n->op == TB_OP_MAXPOOL || n->op == TB_OP_AVGPOOL) return g->values[n->in[0]].rank == 4;
    return in_role(g, n, 0) == 2;
}

void tbn_layout_plan(tbn_ctx *x, const tb_graph *g) {
    tbn_layout *L = &x->lay;
    L->g = g;
    L->nodes = g->nodes;
    L->n_nodes = g->n_nodes;
    L->n_values = g->n_values;
    L->n_nhwc = 0;
    if (L->cap < g->n_values) {
        uint8_t *p = realloc(L->nhwc, (size_t)g->n_values);
        if (!p) { L->g = NULL; return; }
        L->nhwc = p;
        L->cap = g->n_values;
    }
    memset(L->nhwc, 0, (size_t)g->n_values);
    if (layout_off()) return;
    uint8_t *h = L->nhwc;
    int any = 0;
    /* candidates: 4-d f16 activations, not graph outputs, from a producer that writes channels-last */
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (n->n_out < 1) continue;
        int v = n->out[0];
        const tb_value *val = &g->values[v];
        if (val->kind != TB_VAL_ACT || val->rank != 4 || val->dtype != TB_F16) continue;
        int out = 0;
        for (int i = 0; i < g->n_outputs; i++) out |= g->outputs[i] == v;
        if (!out && out_ok(g, n)) h[v] = 1, any = 1;
    }
    /* (cuDNN is loaded only for graphs that have candidates) */
    if (!any || !tbn_cudnn_nhwc_ok(x)) {
        memset(h, 0, (size_t)g->n_values);
        return;
    }
    /* shrink to the fixed point */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int k = 0; k < g->n_nodes; k++) {
            const tb_node *n = &g->nodes[k];
            int tie_all = n->n_out == 1 && out_ok(g, n) ? h[n->out[0]] : 0;
            for (int j = 0; j < n->n_in; j++) {
                int v = n->in[j], r = in_role(g, n, j);
                if (v < 0 || !h[v]) continue;
                if (r == 0 || (r == 2 && !tie_all)) { h[v] = 0; changed = 1; }
            }
            /* an output tied to an input held (N, C, H, W) is held so too */
            if (n->n_out == 1 && h[n->out[0]])
                for (int j = 0; j < n->n_in; j++)
                    if (in_role(g, n, j) == 2 && !h[n->in[j]]) { h[n->out[0]] = 0; changed = 1; break; }
        }
    }
    for (int v = 0; v < g->n_values; v++) L->n_nhwc += h[v];
}

int tbn_nhwc(tbn_ctx *x, const tb_graph *g, int v) {
    tbn_layout *L = &x->lay;
    if (L->g != g || L->nodes != g->nodes || L->n_nodes != g->n_nodes || L->n_values != g->n_values)
        tbn_layout_plan(x, g);
    return L->g == g && v >= 0 && v < L->n_values && L->nhwc[v];
}

void tbn_layout_free(tbn_ctx *x) {
    free(x->lay.nhwc);
    memset(&x->lay, 0, sizeof x->lay);
}
