/*
 * ops.c — the op table: each op's name, arity, outputs, attribute schema and
 * shape rule in one entry (ops.h says how attributes map onto a node's
 * i[4] / f[4]). ir.c asks this table for everything op-specific.
 */
#include "ir/ops.h"
#include "ir/ops_nn.h"
#include "core/quant.h"

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

/* all_reduce: the shape of its input (a rank's partial sums of the whole). */
static tb_status shape_all_reduce(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->rank == 2 && in[0]->dtype == TB_F32, "all_reduce: want x (n, C) f32");
    same_2d(out, 0, in[0]);
    return TB_OK;
}

static tb_status shape_all_gather_cols(const tb_graph *g, const tb_node *n, const tb_value *const *in,
                                       tb_op_shape *out) {
    int ranks = tb_node_attr_i(n, TB_GATHER_RANKS);
    NEED(in[0]->rank == 2 && in[0]->dtype == TB_F32 && in[0]->dims[1] > 0 && in[0]->dims[1] <= INT32_MAX / ranks,
         "all_gather_cols: want x (n, C) f32 with C * ranks in range");
    out->rank[0] = 2; out->dims[0][0] = in[0]->dims[0]; out->dims[0][1] = in[0]->dims[1] * ranks;
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

/* The inputs past scales follow the flags: bias when has_bias, then zeros
 * when has_zeros; the group size is K / scales' columns (core/quant.h). */
static tb_status shape_qmatmul(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    int has_bias = tb_node_attr_i(n, TB_QMM_HAS_BIAS), has_zeros = tb_node_attr_i(n, TB_QMM_HAS_ZEROS);
    NEED(n->n_in == 3 + has_bias + has_zeros, "qmatmul: has_bias %d and has_zeros %d want %d inputs, got %d", has_bias,
         has_zeros, 3 + has_bias + has_zeros, n->n_in);
    const tb_value *x = in[0], *c = in[1], *sc = in[2];
    NEED(c->dtype == TB_I8 || c->dtype == TB_I4 || c->dtype == TB_FP8_E4M3,
         "qmatmul: codes %s must be i8, i4 or fp8_e4m3 (got %s)", c->name, tb_dtype_name(c->dtype));
    NEED(x->rank == 2 && c->rank == 2 && x->dims[1] == c->dims[1] && c->dims[0] > 0 && c->dims[1] > 0,
         "qmatmul: want x (n, K), codes (N, K) with equal K (%s vs %s)", x->name, c->name);
    int64_t N = c->dims[0], K = c->dims[1];
    NEED(K <= INT32_MAX && N <= INT32_MAX, "qmatmul: codes %s are too large", c->name);
    NEED(sc->dtype == TB_F32 && sc->rank == 2 && sc->dims[0] == N && sc->dims[1] > 0 && K % sc->dims[1] == 0,
         "qmatmul: scales %s must be (%lld, K/group) f32 with K = %lld", sc->name, (long long)N, (long long)K);
    int group = (int)(K / sc->dims[1]);
    if (tb_quant_check(c->dtype, (int)K, group, has_zeros) != TB_OK)
        return tb_error_prefix(TB_ERR_FORMAT, "qmatmul %s", c->name);
    if (has_bias)
        NEED(in[3]->rank == 1 && in[3]->dims[0] == N && in[3]->dtype == TB_F32, "qmatmul: bias must be (N) f32");
    if (has_zeros) {
        const tb_value *z = in[3 + has_bias];
        NEED(z->dtype == TB_F32 && z->rank == 2 && z->dims[0] == N && z->dims[1] == sc->dims[1],
             "qmatmul: zeros %s must be f32 shaped like the scales", z->name);
    }
    out->rank[0] = 2; out->dims[0][0] = x->dims[0]; out->dims[0][1] = N;
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

static tb_status shape_concat_cols(const tb_graph *g, const tb_node *n, const tb_value *const *in,
                                   tb_op_shape *out) {
    int64_t cols = 0;
    for (int i = 0; i < n->n_in; i++) {
        NEED(in[i]->rank == 2 && in[i]->dims[0] == in[0]->dims[0] && in[i]->dims[1] >= 0 && in[i]->dtype == TB_F32,
             "concat_cols: want f32 inputs (n, Ci) with equal n");
        cols += in[i]->dims[1];
    }
    out->rank[0] = 2; out->dims[0][0] = in[0]->dims[0]; out->dims[0][1] = cols;
    return TB_OK;
}

static tb_status shape_silu(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->rank == 2, "silu: want x (n, C)");
    same_2d(out, 0, in[0]);
    return TB_OK;
}

static tb_status shape_mul(const tb_graph *g, const tb_node *n, const tb_value *const *in, tb_op_shape *out) {
    NEED(in[0]->rank == 2 && in[1]->rank == 2 && in[0]->dims[0] == in[1]->dims[0] && in[0]->dims[1] == in[1]->dims[1],
         "emul: want a, b (n, C)");
    same_2d(out, 0, in[0]);
    return TB_OK;
}

/* ---------------------------------------------------------------- the table */

#define EPS_ATTR {"eps", TB_ATTR_FLOAT, 0, 0, 32, 0.0, 1.0, "added to the mean square"}
#define DIM_MAX 65535.0 /* head_dim and head counts: attention packs head_dim in 16 bits */

static const tb_op_def ops[TB_OP_COUNT] = {
    [TB_OP_EMBEDDING] = {"embedding", 2, 2, 1,
                         "ids (tokens) i32, table (V, D) -> (tokens, D); ids outside [vocab_offset, "
                         "vocab_offset + V) give zero rows",
                         1,
                         {{"vocab_offset", TB_ATTR_INT, 0, 0, 32, 0, INT32_MAX,
                           "the id of the table's first row (a tensor-parallel rank's vocabulary shard)"}},
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
    [TB_OP_CONCAT_COLS] = {"concat_cols", 2, TB_MAX_INPUTS, 1, "x1 (n, C1), ..., xk (n, Ck) -> (n, C1 + ... + Ck)", 0,
                           {{0}}, shape_concat_cols},
    [TB_OP_SILU] = {"silu", 1, 1, 1, "x (n, C) -> x * sigmoid(x) (n, C)", 0, {{0}}, shape_silu},
    [TB_OP_EMUL] = {"emul", 2, 2, 1, "a, b (n, C) -> a * b (n, C), elementwise", 0, {{0}}, shape_mul},
    [TB_OP_QMATMUL] = {"qmatmul", 3, 5, 1,
                       "x (n, K), codes (N, K) i8|i4|fp8_e4m3, scales (N, K/G) f32 [, bias (N)] [, zeros (N, K/G)] "
                       "-> (n, N)",
                       3,
                       {{"has_bias", TB_ATTR_BOOL, 0, 0, 1, 0, 1, "input 3 is a bias (N) f32"},
                        {"has_zeros", TB_ATTR_BOOL, 0, 1, 1, 0, 1, "the last input is zeros (N, K/G): int4 asymmetric"},
                        {"act_scale", TB_ATTR_FLOAT, 0, 0, 32, 0.0, FLT_MAX,
                         "static per-tensor activation scale from calibration (fp8 on the GPU); 0: none"}},
                       shape_qmatmul},
    [TB_OP_ALL_REDUCE] = {"all_reduce", 1, 1, 1, "x (n, C) -> (n, C), summed over the tensor-parallel ranks", 0,
                          {{0}}, shape_all_reduce},
    [TB_OP_ALL_GATHER_COLS] = {"all_gather_cols", 1, 1, 1,
                               "x (n, C) -> (n, C * ranks): every rank's columns side by side, rank 0 first", 1,
                               {{"ranks", TB_ATTR_INT, 0, 0, 32, 1, 64, "tensor-parallel ranks"}},
                               shape_all_gather_cols},
};

const tb_op_def *tb_op_get_def(tb_op_kind k) {
    if ((unsigned)k >= TB_OP_COUNT) return NULL;
    if (k < TB_OP_NN_FIRST) return ops[k].name ? &ops[k] : NULL;
    const tb_op_def *d = tb_nn_elem_def(k);
    if (!d) d = tb_nn_shape_def(k);
    if (!d) d = tb_nn_conv_def(k);
    if (!d) d = tb_nn_quant_def(k);
    return d && d->name ? d : NULL;
}

static const char *const onnx_names[TB_OP_COUNT] = {
#define TB_NN_OP(e, onnx) [e] = onnx,
#include "ir/ops_nn.def"
#undef TB_NN_OP
};

const char *tb_nn_onnx_name(tb_op_kind k) { return (unsigned)k < TB_OP_COUNT ? onnx_names[k] : NULL; }

int tb_nn_from_onnx(const char *op_type) {
    for (int k = TB_OP_NN_FIRST; k < TB_OP_COUNT; k++)
        if (onnx_names[k] && !strcmp(onnx_names[k], op_type)) return k;
    return -1;
}

const char *tb_op_name(tb_op_kind k) {
    const tb_op_def *d = tb_op_get_def(k);
    if (d) return d->name;
    const char *o = tb_nn_onnx_name(k);
    return o ? o : "?";
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

int32_t tb_attr_get_i(tb_op_kind op, int a, const int32_t *i) {
    const tb_attr_def *at = attr_def(op, a, 0);
    if (at->bits >= 32) return i[at->slot];
    return (int32_t)(((uint32_t)i[at->slot] & field_mask(at)) >> at->shift); /* fields are unsigned */
}

float tb_attr_get_f(tb_op_kind op, int a, const float *f) { return f[attr_def(op, a, 1)->slot]; }

void tb_attr_set_i(tb_op_kind op, int a, int32_t *i, int32_t v) {
    const tb_attr_def *at = attr_def(op, a, 0);
    if (at->bits >= 32) { i[at->slot] = v; return; }
    uint32_t m = field_mask(at), w = (uint32_t)i[at->slot];
    i[at->slot] = (int32_t)((w & ~m) | (((uint32_t)v << at->shift) & m));
}

void tb_attr_set_f(tb_op_kind op, int a, float *f, float v) { f[attr_def(op, a, 1)->slot] = v; }

tb_status tb_op_check_attrs(const tb_node *n) {
    const tb_op_def *d = tb_op_get_def(n->op);
    if (!d) return tb_errorf(TB_ERR_UNSUPPORTED, "unknown op kind %d", (int)n->op);
    uint32_t used_i[TB_NODE_INTS] = {0};
    int used_f[TB_NODE_FLOATS] = {0};
    for (int a = 0; a < d->n_attrs; a++) {
        const tb_attr_def *at = &d->attrs[a];
        if (at->type == TB_ATTR_FLOAT) {
            used_f[at->slot] = 1;
            float v = n->f[at->slot];
            if (isnan(v) || (!isfinite(v) && !(at->lo == -INFINITY && at->hi == INFINITY)) || v < at->lo ||
                v > at->hi)
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
    for (int s = 0; s < TB_NODE_INTS; s++)
        if ((uint32_t)n->i[s] & ~used_i[s])
            return tb_errorf(TB_ERR_FORMAT, "%s: int attribute slot %d holds bits no attribute defines", d->name, s);
    for (int s = 0; s < TB_NODE_FLOATS; s++) {
        uint32_t w;
        memcpy(&w, &n->f[s], 4);
        if (!used_f[s] && w)
            return tb_errorf(TB_ERR_FORMAT, "%s: float attribute slot %d holds bits no attribute defines", d->name, s);
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
    if (d->shape) return d->shape(g, n, in, out);
    tb_view v[TB_MAX_INPUTS];
    for (int i = 0; i < n->n_in; i++) tb_value_view(g, n->in[i], &v[i]);
    return tb_op_infer_views(n, v, n->n_in, out);
}

void tb_value_view(const tb_graph *g, int v, tb_view *out) {
    const tb_value *x = &g->values[v];
    memset(out, 0, sizeof *out);
    out->dtype = x->dtype;
    out->rank = x->rank;
    memcpy(out->dims, x->dims, sizeof out->dims);
    out->data = x->kind == TB_VAL_WEIGHT ? (void *)x->data : NULL;
}

tb_status tb_op_infer_views(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_op_def *d = tb_op_get_def(n->op);
    if (!d || !d->infer) return tb_errorf(TB_ERR_UNSUPPORTED, "op %s has no general shape rule", tb_op_name(n->op));
    if (n_in < d->min_in || n_in > d->max_in)
        return tb_errorf(TB_ERR_FORMAT, "%s: takes %d to %d inputs, got %d", d->name, d->min_in, d->max_in, n_in);
    memset(out, 0, sizeof *out);
    out->n_out = d->n_out;
    for (int o = 0; o < TB_MAX_OUTPUTS; o++) out->dtype[o] = in[0].dtype;
    TB_TRY(d->infer(n, in, n_in, out));
    int most = d->max_out ? d->max_out : d->n_out;
    if (out->n_out < 1 || out->n_out > most || out->n_out > TB_MAX_OUTPUTS)
        return tb_errorf(TB_ERR_FORMAT, "%s: %d outputs (1 to %d)", d->name, out->n_out, most);
    return TB_OK;
}

/* ---------------------------------------------------------------- dims */

int64_t tb_dim_mul(int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    if (a == 1) return b;
    if (b == 1) return a;
    if (a < 0 || b < 0) return TB_DIM_DYN;
    if (a > INT64_MAX / b) return TB_DIM_DYN;
    return a * b;
}

tb_status tb_dim_broadcast(int64_t a, int64_t b, int64_t *out) {
    if (a == b) { *out = a; return TB_OK; }
    if (a == 1) { *out = b; return TB_OK; }
    if (b == 1) { *out = a; return TB_OK; }
    if (a >= 0 && b >= 0)
        return tb_errorf(TB_ERR_FORMAT, "dims %lld and %lld do not broadcast", (long long)a, (long long)b);
    /* a symbol or unknown against a number: the number (the other must be 1
     * or equal at run time, checked then); two different symbols: unknown */
    *out = a >= 0 ? a : b >= 0 ? b : TB_DIM_DYN;
    return TB_OK;
}

tb_status tb_shape_broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *rank, int64_t *out) {
    int r = ra > rb ? ra : rb;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - ra), ib = i - (r - rb);
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        TB_TRY(tb_dim_broadcast(da, db, &out[i]));
    }
    *rank = r;
    return TB_OK;
}

int64_t tb_view_numel(const tb_view *v) {
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) n *= v->dims[i];
    return n;
}

int64_t tb_view_get_i(const tb_view *v, int64_t i) {
    switch (v->dtype) {
    case TB_I64: return ((const int64_t *)v->data)[i];
    case TB_I32: return ((const int32_t *)v->data)[i];
    case TB_I8: return ((const int8_t *)v->data)[i];
    case TB_U8: case TB_BOOL: return ((const uint8_t *)v->data)[i];
    case TB_F32: return (int64_t)((const float *)v->data)[i];
    case TB_F64: return (int64_t)((const double *)v->data)[i];
    default: return 0;
    }
}

double tb_view_get_f(const tb_view *v, int64_t i) {
    switch (v->dtype) {
    case TB_F32: return ((const float *)v->data)[i];
    case TB_F64: return ((const double *)v->data)[i];
    case TB_F16: return tb_f16_to_f32(((const uint16_t *)v->data)[i]);
    case TB_BF16: return tb_bf16_to_f32(((const uint16_t *)v->data)[i]);
    default: return (double)tb_view_get_i(v, i);
    }
}
