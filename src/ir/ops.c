/*
 * ops.c — the op table: each op's name, arity, outputs, attribute schema and
 * shape rule in one entry (ops.h says how attributes map onto a node's
 * i[4] / f[4]). ir.c asks this table for everything op-specific.
 */
#include "ir/ops.h"

#include <float.h>
#include <math.h>

static int is_float_weight(tb_dtype t) { return t == TB_F32 || t == TB_F16 || t == TB_BF16; }

#define NEED(cond, ...) do { if (!(cond)) return tb_errorf(TB_ERR_FORMAT, __VA_ARGS__); } while (0)

/* out (i) = a 2-d copy of value v's shape */
static void same_2d(tb_op_shape *out, int i, const tb_value *v) {
    out->rank[i] = 2;
    memcpy(out->dims[i], v->dims, sizeof out->dims[i]);
}

/* ---------------------------------------------------------------- shape rules */

static tb_status shape_embedding(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->dtype == TB_I32 && in[0]->rank == 1, "embedding: ids must be i32 (tokens)");
    NEED(in[1]->rank == 2 && is_float_weight(in[1]->dtype), "embedding: table must be (V, D) float");
    out->rank[0] = 2; out->dims[0][0] = in[0]->dims[0]; out->dims[0][1] = in[1]->dims[1];
    return TB_OK;
}

static tb_status shape_rmsnorm(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->rank == 2 && in[1]->rank == 1 && in[1]->dims[0] == in[0]->dims[1] && in[1]->dtype == TB_F32,
         "rmsnorm: want x (n, D), w (D) f32");
    same_2d(out, 0, in[0]);
    return TB_OK;
}

static tb_status shape_add_rmsnorm(const tb_graph *g, const tb_node *n, const tb_value *const *in,
                                   tb_op_shape *out) {
    NEED(in[0]->rank == 2 && in[1]->rank == 2 && in[0]->dims[0] == in[1]->dims[0] &&
         in[0]->dims[1] == in[1]->dims[1] && in[2]->rank == 1 && in[2]->dims[0] == in[0]->dims[1],
         "add_rmsnorm: want x, d (n, D), w (D)");
    same_2d(out, 0, in[0]);
    same_2d(out, 1, in[0]);
    return TB_OK;
}

static tb_status shape_matmul(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->rank == 2 && in[1]->rank == 2 && in[0]->dims[1] == in[1]->dims[1] && is_float_weight(in[1]->dtype),
         "matmul: want x (n, K), w (N, K) with equal K (%s vs %s)", in[0]->name, in[1]->name);
    NEED(n->n_in == 2 || (in[2]->rank == 1 && in[2]->dims[0] == in[1]->dims[0] && in[2]->dtype == TB_F32),
         "matmul: bias must be (N) f32");
    out->rank[0] = 2; out->dims[0][0] = in[0]->dims[0]; out->dims[0][1] = in[1]->dims[0];
    return TB_OK;
}

static tb_status shape_rope(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    int heads = tb_node_attr_i(n, TB_ROPE_HEADS), hd = tb_node_attr_i(n, TB_ROPE_HEAD_DIM);
    /* dims come from files: compared, never multiplied (hd is in [2, 65535]) */
    NEED(in[0]->rank == 2 && in[1]->dtype == TB_I32 && in[2]->rank == 1 && hd % 2 == 0 && in[2]->dims[0] == hd / 2 &&
         (int64_t)heads * hd <= in[0]->dims[1],
         "rope: want x (n, C), pos (n), inv_freq (hd/2) with heads*hd <= C");
    same_2d(out, 0, in[0]);
    return TB_OK;
}

static tb_status shape_attention(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    int H = tb_node_attr_i(n, TB_ATTN_HEADS), KV = tb_node_attr_i(n, TB_ATTN_KV_HEADS);
    int hd = tb_node_attr_i(n, TB_ATTN_HEAD_DIM);
    NEED(H % KV == 0, "attention: bad head counts %d/%d", H, KV);
    NEED(in[0]->rank == 2 && in[0]->dims[1] == (int64_t)(H + 2 * KV) * hd, "attention: qkv must be (tokens, %lld)",
         (long long)(H + 2 * KV) * hd);
    NEED(in[1]->rank == 1 && hd % 2 == 0 && in[1]->dims[0] == hd / 2, "attention: inv_freq must be (%d)", hd / 2);
    out->rank[0] = 2; out->dims[0][0] = in[0]->dims[0]; out->dims[0][1] = (int64_t)H * hd;
    return TB_OK;
}

static tb_status shape_silu_mul(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->rank == 2 && in[0]->dims[1] % 2 == 0, "silu_mul: want gu (n, 2F)");
    out->rank[0] = 2; out->dims[0][0] = in[0]->dims[0]; out->dims[0][1] = in[0]->dims[1] / 2;
    return TB_OK;
}

static tb_status shape_add(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->rank == in[1]->rank, "add: want equal shapes");
    for (int d = 0; d < in[0]->rank; d++) NEED(in[0]->dims[d] == in[1]->dims[d], "add: want equal shapes");
    out->rank[0] = in[0]->rank;
    memcpy(out->dims[0], in[0]->dims, sizeof out->dims[0]);
    return TB_OK;
}

static tb_status shape_gather_rows(const tb_graph *g, const tb_node *n, const tb_value *const *in,
                                   tb_op_shape *out) {
    NEED(in[0]->rank == 2, "gather_rows: want x (tokens, D)");
    int rows = tb_graph_find_sym(g, "rows");
    NEED(rows >= 0, "gather_rows: the graph has no 'rows' symbol");
    out->rank[0] = 2; out->dims[0][0] = TB_SYM(rows); out->dims[0][1] = in[0]->dims[1];
    return TB_OK;
}

/* ---------------------------------------------------------------- the table */

#define EPS_ATTR {"eps", TB_ATTR_FLOAT, 0, 0, 32, 0.0, 1.0, "added to the mean square"}
#define DIM_MAX 65535.0 /* head_dim and head counts: attention packs head_dim in 16 bits */

static const tb_op_def ops[TB_OP_COUNT] = {
    [TB_OP_EMBEDDING] = {"embedding", 2, 2, 1, "ids (tokens) i32, table (V, D) -> (tokens, D)", 0, {{0}},
                         shape_embedding},
    [TB_OP_RMSNORM] = {"rmsnorm", 2, 2, 1, "x (n, D), w (D) -> (n, D)", 1, {EPS_ATTR}, shape_rmsnorm},
    [TB_OP_ADD_RMSNORM] = {"add_rmsnorm", 3, 3, 2, "x, d (n, D), w (D) -> r = x + d, y = rmsnorm(r) (n, D)", 1,
                           {EPS_ATTR}, shape_add_rmsnorm},
    [TB_OP_MATMUL] = {"matmul", 2, 3, 1, "x (n, K), w (N, K) [, bias (N)] -> (n, N)", 0, {{0}}, shape_matmul},
    [TB_OP_ROPE] = {"rope", 3, 3, 1, "x (n, C), pos (n) i32, inv_freq (hd/2) -> (n, C)", 3,
                    {{"heads", TB_ATTR_INT, 0, 0, 32, 0, DIM_MAX, "heads rotated, from column 0"},
                     {"head_dim", TB_ATTR_INT, 1, 0, 32, 2, DIM_MAX, "columns of a head"},
                     {"interleaved", TB_ATTR_BOOL, 2, 0, 32, 0, 1, "pairs (2i, 2i+1) instead of (i, i + hd/2)"}},
                    shape_rope},
    [TB_OP_ATTENTION] = {"attention", 2, 2, 1,
                         "qkv (tokens, (H + 2 KV) hd), inv_freq (hd/2) -> (tokens, H hd); RoPE on q and k, "
                         "KV-cache write, paged causal GQA attention",
                         6,
                         {{"layer", TB_ATTR_INT, 0, 0, 32, 0, 1 << 20, "the layer's KV cache"},
                          {"heads", TB_ATTR_INT, 1, 0, 32, 1, DIM_MAX, "query heads H"},
                          {"kv_heads", TB_ATTR_INT, 2, 0, 32, 1, DIM_MAX, "key/value heads KV (H % KV == 0)"},
                          {"head_dim", TB_ATTR_INT, 3, 0, 16, 2, DIM_MAX, "hd"},
                          {"interleaved", TB_ATTR_BOOL, 3, 16, 1, 0, 1, "RoPE pairs (2i, 2i+1)"},
                          {"scale", TB_ATTR_FLOAT, 0, 0, 32, FLT_MIN, FLT_MAX, "applied to q.k"}},
                         shape_attention},
    [TB_OP_SILU_MUL] = {"silu_mul", 1, 1, 1, "gu (n, 2F) -> silu(g) * u (n, F)", 0, {{0}}, shape_silu_mul},
    [TB_OP_ADD] = {"add", 2, 2, 1, "a, b (same shape) -> a + b", 0, {{0}}, shape_add},
    [TB_OP_GATHER_ROWS] = {"gather_rows", 1, 1, 1, "x (tokens, D) -> (rows, D), rows chosen per step", 0, {{0}},
                           shape_gather_rows},
};

const tb_op_def *tb_op_get_def(tb_op_kind k) {
    return (unsigned)k < TB_OP_COUNT && ops[k].name ? &ops[k] : NULL;
}

const char *tb_op_name(tb_op_kind k) {
    const tb_op_def *d = tb_op_get_def(k);
    return d ? d->name : "?";
}

/* ---------------------------------------------------------------- attributes */

static const tb_attr_def *attr_def(tb_op_kind op, int a, int want_float) {
    const tb_op_def *d = tb_op_get_def(op);
    TB_ASSERT(d && a >= 0 && a < d->n_attrs);
    TB_ASSERT((d->attrs[a].type == TB_ATTR_FLOAT) == want_float);
    return &d->attrs[a];
}

static uint32_t field_mask(const tb_attr_def *at) {
    return at->bits >= 32 ? 0xffffffffu : ((1u << at->bits) - 1u) << at->shift;
}

int32_t tb_attr_get_i(tb_op_kind op, int a, const int32_t i[4]) {
    const tb_attr_def *at = attr_def(op, a, 0);
    if (at->bits >= 32) return i[at->slot];
    return (int32_t)(((uint32_t)i[at->slot] & field_mask(at)) >> at->shift); /* fields are unsigned */
}

float tb_attr_get_f(tb_op_kind op, int a, const float f[4]) { return f[attr_def(op, a, 1)->slot]; }

void tb_attr_set_i(tb_op_kind op, int a, int32_t i[4], int32_t v) {
    const tb_attr_def *at = attr_def(op, a, 0);
    if (at->bits >= 32) { i[at->slot] = v; return; }
    uint32_t m = field_mask(at), w = (uint32_t)i[at->slot];
    i[at->slot] = (int32_t)((w & ~m) | (((uint32_t)v << at->shift) & m));
}

void tb_attr_set_f(tb_op_kind op, int a, float f[4], float v) { f[attr_def(op, a, 1)->slot] = v; }

tb_status tb_op_check_attrs(const tb_node *n) {
    const tb_op_def *d = tb_op_get_def(n->op);
    if (!d) return tb_errorf(TB_ERR_UNSUPPORTED, "unknown op kind %d", (int)n->op);
    uint32_t used_i[4] = {0};
    int used_f[4] = {0};
    for (int a = 0; a < d->n_attrs; a++) {
        const tb_attr_def *at = &d->attrs[a];
        if (at->type == TB_ATTR_FLOAT) {
            used_f[at->slot] = 1;
            float v = n->f[at->slot];
            if (!isfinite(v) || v < at->lo || v > at->hi)
                return tb_errorf(TB_ERR_FORMAT, "%s: attribute %s = %g is outside [%g, %g]", d->name, at->name, v,
                                 at->lo, at->hi);
            continue;
        }
        used_i[at->slot] |= field_mask(at);
        int32_t v = tb_attr_get_i(n->op, a, n->i);
        if (v < at->lo || v > at->hi)
            return tb_errorf(TB_ERR_FORMAT, "%s: attribute %s = %d is outside [%.0f, %.0f]", d->name, at->name, v,
                             at->lo, at->hi);
    }
    /* slots and bits no attribute uses stay zero (room for later attributes) */
    for (int s = 0; s < 4; s++) {
        uint32_t w;
        memcpy(&w, &n->f[s], 4);
        if (((uint32_t)n->i[s] & ~used_i[s]) || (!used_f[s] && w))
            return tb_errorf(TB_ERR_FORMAT, "%s: attribute slot %d holds bits no attribute defines", d->name, s);
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- inference */

tb_status tb_op_infer(const tb_graph *g, const tb_node *n, tb_op_shape *out) {
    const tb_op_def *d = tb_op_get_def(n->op);
    if (!d) return tb_errorf(TB_ERR_UNSUPPORTED, "unknown op kind %d", (int)n->op);
    if (n->n_in < d->min_in || n->n_in > d->max_in) {
        if (d->min_in == d->max_in)
            return tb_errorf(TB_ERR_FORMAT, "%s: takes %d inputs, got %d", d->name, d->min_in, n->n_in);
        return tb_errorf(TB_ERR_FORMAT, "%s: takes %d to %d inputs, got %d", d->name, d->min_in, d->max_in, n->n_in);
    }
    const tb_value *in[TB_MAX_INPUTS] = {0};
    for (int i = 0; i < n->n_in; i++) {
        if (n->in[i] < 0 || n->in[i] >= g->n_values)
            return tb_errorf(TB_ERR_FORMAT, "%s: input %d refers to no value", d->name, i);
        in[i] = &g->values[n->in[i]];
    }
    TB_TRY(tb_op_check_attrs(n));
    memset(out, 0, sizeof *out);
    out->n_out = d->n_out;
    for (int o = 0; o < d->n_out; o++) out->dtype[o] = TB_F32; /* activations are f32 */
    return d->shape(g, n, in, out);
}
