/* nn_fuse.c — rewrites around Conv / Gemm / MatMul: BatchNormalization and
 * per-channel Mul folded into the weights, constant bias Add into the bias
 * input, activations and residual Adds into the fused epilogue
 * (ops_nn.h), Transposes folded into the trans flags, and consecutive
 * Transposes / Reshapes merged. */
#include <math.h>

#include "opt/opt.h"

/* ---------------------------------------------------------------- epilogues */

/* Where Conv, Gemm and MatMul keep their epilogue (ops_nn.h). */
typedef struct {
    int act, flags; /* int slots */
    int fparam;     /* first float slot of the activation parameters */
} epi_layout;

static int epi_layout_of(tb_op_kind op, epi_layout *l) {
    switch (op) {
    case TB_OP_CONV: *l = (epi_layout){10, 11, 0}; return 1;
    case TB_OP_GEMM: *l = (epi_layout){2, 3, 2}; return 1;
    case TB_OP_NN_MATMUL: *l = (epi_layout){2, 3, 2}; return 1;
    default: return 0;
    }
}

/* The producer of v when it is a Conv / Gemm / MatMul read only by node k. */
static int epi_producer(const tb_graph *g, const tb_opt_index *ix, int v, int k) {
    if (v < 0 || v >= ix->n_values) return -1;
    int p = ix->prod[v];
    epi_layout l;
    if (p < 0 || !epi_layout_of(g->nodes[p].op, &l) || g->nodes[p].n_out != 1) return -1;
    return tb_opt_single_reader(g, ix, v) == k ? p : -1;
}

/* Bias (input 2) set on c, the residual (if any) moved after it. */
static void epi_set_bias(tb_node *c, const epi_layout *l, int bias_v) {
    int flags = c->i[l->flags];
    int res = flags & TB_NN_HAS_RESIDUAL ? c->in[2 + !!(flags & TB_NN_HAS_BIAS)] : -1;
    c->in[2] = bias_v;
    c->n_in = 3;
    if (res >= 0) c->in[c->n_in++] = res;
    c->i[l->flags] = flags | TB_NN_HAS_BIAS;
}

/* The channel axis of the output of c, and its size (0 when not known). */
static int64_t epi_channels(const tb_graph *g, const tb_node *c, int *axis) {
    const tb_value *y = &g->values[c->out[0]];
    if (y->rank < 1 || (c->op == TB_OP_CONV && y->rank < 2)) return 0;
    *axis = c->op == TB_OP_CONV ? 1 : y->rank - 1;
    int64_t ch = y->dims[*axis];
    return ch > 0 ? ch : 0;
}

/* y = P(...) followed by y * s + t per output channel (s or t NULL: 1 / 0),
 * rewritten as P with scaled weights and bias, placed at node k writing
 * out_v (P killed). Scaling needs constant f32 weights and no activation or
 * residual after P; a bias alone (s NULL) goes before a residual. */
static int epi_affine(tb_graph *g, int p, const float *s, const float *t, int k, int out_v) {
    tb_node c = g->nodes[p];
    epi_layout l;
    if (!epi_layout_of(c.op, &l)) return 0;
    int flags = c.i[l.flags], axis;
    int64_t ch = epi_channels(g, &c, &axis);
    if (!ch || c.i[l.act] != TB_NN_ACT_NONE) return 0;
    if (s) {
        int any = 0;
        for (int64_t i = 0; i < ch; i++) any |= s[i] != 1.0f;
        if (!any) s = NULL;
    }
    if (s && (flags & TB_NN_HAS_RESIDUAL)) return 0;
    if (!s && !t) return 0;
    float *bias = calloc((size_t)ch, sizeof *bias);
    if (!bias) return 0;
    int ok = 1;
    if (flags & TB_NN_HAS_BIAS) {
        if (c.op == TB_OP_GEMM) {
            ok = tb_opt_const_per_channel(g, c.in[2], 2, 1, ch, bias);
            for (int64_t i = 0; ok && i < ch; i++) bias[i] *= c.f[1]; /* beta */
        } else {
            ok = tb_opt_const_per_channel(g, c.in[2], 1, 0, ch, bias);
        }
    }
    if (ok && s) {
        const float *w = tb_opt_weight_f32(g, c.in[1]);
        const tb_value *wv = ok && w ? &g->values[c.in[1]] : NULL;
        ok = wv != NULL;
        int r = wv ? wv->rank : 0;
        int64_t numel = 1;
        for (int i = 0; i < r; i++) numel *= wv->dims[i];
        /* which axis of the weight is the output channel */
        int wax = -1;
        if (ok && c.op == TB_OP_CONV) wax = 0;
        if (ok && c.op == TB_OP_GEMM && r == 2) wax = c.i[1] ? 0 : 1;
        if (ok && c.op == TB_OP_NN_MATMUL && r >= 2) wax = c.i[1] ? r - 2 : r - 1;
        ok = ok && wax >= 0 && wv->dims[wax] == ch;
        float *nw = ok ? malloc((size_t)numel * sizeof *nw) : NULL;
        if (ok && !nw) ok = 0;
        if (ok) {
            int64_t inner = 1;
            for (int i = wax + 1; i < r; i++) inner *= wv->dims[i];
            for (int64_t e = 0; e < numel; e++) nw[e] = w[e] * s[(e / inner) % ch];
            char name[TB_NAME_LEN];
            snprintf(name, sizeof name, "%s.folded", wv->name);
            int64_t dims[TB_MAX_RANK];
            memcpy(dims, wv->dims, sizeof dims);
            int id = tb_opt_add_weight_f32(g, name, r, dims, nw); /* takes nw */
            if (id < 0) ok = 0;
            else c.in[1] = id;
            for (int64_t i = 0; i < ch; i++) bias[i] *= s[i];
        }
    }
    if (!ok) { free(bias); return 0; }
    if (t)
        for (int64_t i = 0; i < ch; i++) bias[i] += t[i];
    char name[TB_NAME_LEN];
    snprintf(name, sizeof name, "%s.bias", g->values[out_v].name);
    int bid = tb_opt_add_weight_f32(g, name, 1, &ch, bias); /* takes bias */
    if (bid < 0) { tb_error_clear(); return 0; }
    epi_set_bias(&c, &l, bid);
    if (c.op == TB_OP_GEMM) c.f[1] = 1.0f;
    if (!tb_opt_node_fits(g, &c, out_v)) return 0;
    tb_opt_place(g, k, &c, out_v);
    if (p != k) tb_opt_kill(g, p);
    return 1;
}

/* ---------------------------------------------------------------- batchnorm */

tb_status tb_opt_fold_batchnorm(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    int bn = 0, mul = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        int done = 0;
        if (n->op == TB_OP_BATCHNORM && n->n_in == 5 && n->n_out == 1) {
            int p = epi_producer(g, &ix, n->in[0], k), axis;
            int64_t ch = p >= 0 ? epi_channels(g, &g->nodes[p], &axis) : 0;
            if (ch && axis == 1 && g->values[n->in[0]].rank >= 2) {
                float *v = malloc((size_t)ch * 4 * 4 + (size_t)ch * 2 * 4);
                if (!v) { tb_opt_index_free(&ix); return tb_errorf(TB_ERR_OOM, "out of memory folding BatchNormalization"); }
                float *sc = v, *bi = v + ch, *mean = v + 2 * ch, *var = v + 3 * ch, *s = v + 4 * ch, *t = v + 5 * ch;
                if (tb_opt_const_per_channel(g, n->in[1], 1, 0, ch, sc) &&
                    tb_opt_const_per_channel(g, n->in[2], 1, 0, ch, bi) &&
                    tb_opt_const_per_channel(g, n->in[3], 1, 0, ch, mean) &&
                    tb_opt_const_per_channel(g, n->in[4], 1, 0, ch, var)) {
                    for (int64_t c = 0; c < ch; c++) {
                        s[c] = (float)(sc[c] / sqrt((double)var[c] + n->f[0]));
                        t[c] = (float)(bi[c] - (double)mean[c] * s[c]);
                    }
                    done = epi_affine(g, p, s, t, k, n->out[0]);
                    bn += done;
                }
                free(v);
            }
        } else if (n->op == TB_OP_MUL && n->n_in == 2) {
            for (int side = 0; side < 2 && !done; side++) {
                int p = epi_producer(g, &ix, n->in[side], k), axis;
                int64_t ch = p >= 0 ? epi_channels(g, &g->nodes[p], &axis) : 0;
                if (!ch) continue;
                float *s = malloc((size_t)ch * sizeof *s);
                if (!s) { tb_opt_index_free(&ix); return tb_errorf(TB_ERR_OOM, "out of memory folding Mul"); }
                if (tb_opt_const_per_channel(g, n->in[1 - side], g->values[n->in[side]].rank, axis, ch, s)) {
                    done = epi_affine(g, p, s, NULL, k, n->out[0]);
                    mul += done;
                }
                free(s);
            }
        }
        if (done) {
            tb_opt_index_free(&ix);
            TB_TRY(tb_opt_index_build(g, &ix));
        }
    }
    tb_opt_index_free(&ix);
    r->changes = bn + mul;
    snprintf(r->what, sizeof r->what, "folded %d BatchNormalization, %d per-channel Mul into weights", bn, mul);
    return TB_OK;
}

/* ---------------------------------------------------------------- epilogue */

static int act_of(const tb_graph *g, const tb_node *n, float *p0, float *p1) {
    *p0 = *p1 = 0;
    switch (n->op) {
    case TB_OP_RELU: return TB_NN_ACT_RELU;
    case TB_OP_SIGMOID: return TB_NN_ACT_SIGMOID;
    case TB_OP_TANH: return TB_NN_ACT_TANH;
    case TB_OP_GELU: return n->i[0] ? TB_NN_ACT_GELU_TANH : TB_NN_ACT_GELU_ERF;
    case TB_OP_CLIP: {
        double lo = -INFINITY, hi = INFINITY;
        if (n->n_in > 1 && !tb_opt_const_scalar(g, n->in[1], 1, &lo)) return -1;
        if (n->n_in > 2 && !tb_opt_const_scalar(g, n->in[2], 1, &hi)) return -1;
        *p0 = (float)lo;
        *p1 = (float)hi;
        return TB_NN_ACT_CLIP;
    }
    default: return -1;
    }
}

tb_status tb_opt_fuse_epilogue(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    int bias = 0, act = 0, res = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || n->n_out != 1) continue;
        int done = 0;
        float a0, a1;
        int a = act_of(g, n, &a0, &a1);
        if (n->op == TB_OP_NN_ADD && n->n_in == 2) {
            for (int side = 0; side < 2 && !done; side++) {
                int y = n->in[side], other = n->in[1 - side];
                int p = epi_producer(g, &ix, y, k), axis;
                if (p < 0 || other == y) continue;
                int64_t ch = epi_channels(g, &g->nodes[p], &axis);
                float *t = ch ? malloc((size_t)ch * sizeof *t) : NULL;
                if (t && tb_opt_const_per_channel(g, other, g->values[y].rank, axis, ch, t)) {
                    done = epi_affine(g, p, NULL, t, k, n->out[0]);
                    bias += done;
                }
                free(t);
                if (done) break;
                /* a residual: another tensor of exactly the output's shape */
                tb_node c = g->nodes[p];
                epi_layout l = {0, 0, 0};
                epi_layout_of(c.op, &l);
                if ((c.i[l.flags] & TB_NN_HAS_RESIDUAL) || !tb_opt_shape_eq_ix(g, &ix, other, y) ||
                    !tb_opt_shape_eq_ix(g, &ix, n->out[0], y) ||
                    g->values[other].dtype != g->values[y].dtype || c.n_in >= TB_MAX_INPUTS)
                    continue;
                c.in[c.n_in++] = other;
                c.i[l.flags] |= TB_NN_HAS_RESIDUAL;
                if (tb_opt_node_fits(g, &c, n->out[0])) {
                    tb_opt_place(g, k, &c, n->out[0]);
                    tb_opt_kill(g, p);
                    done = 1;
                    res++;
                }
            }
        } else if (a > 0 && n->n_in >= 1) {
            int p = epi_producer(g, &ix, n->in[0], k);
            if (p >= 0) { /* elementwise with scalar parameters: the shape of its input */
                tb_node c = g->nodes[p];
                epi_layout l = {0, 0, 0};
                epi_layout_of(c.op, &l);
                if (c.i[l.act] == TB_NN_ACT_NONE && !(c.i[l.flags] & TB_NN_ACT_AFTER_RESIDUAL)) {
                    c.i[l.act] = a;
                    c.f[l.fparam] = a0;
                    c.f[l.fparam + 1] = a1;
                    /* after a fused residual the activation is the last step */
                    if (c.i[l.flags] & TB_NN_HAS_RESIDUAL) c.i[l.flags] |= TB_NN_ACT_AFTER_RESIDUAL;
                    if (tb_opt_node_fits(g, &c, n->out[0])) {
                        tb_opt_place(g, k, &c, n->out[0]);
                        tb_opt_kill(g, p);
                        done = 1;
                        act++;
                    }
                }
            }
        }
        if (done) {
            tb_opt_index_free(&ix);
            TB_TRY(tb_opt_index_build(g, &ix));
        }
    }
    tb_opt_index_free(&ix);
    r->changes = bias + act + res;
    snprintf(r->what, sizeof r->what, "fused %d bias Add, %d activations, %d residual Add", bias, act, res);
    return TB_OK;
}

/* ---------------------------------------------------------------- transposes */

/* Whether perm (rank r) swaps the last two axes and keeps the others. */
static int perm_swaps_last2(const tb_node *t, int r) {
    if (r < 2) return 0;
    for (int i = 0; i < r - 2; i++)
        if (t->i[i] != i) return 0;
    return t->i[r - 2] == r - 1 && t->i[r - 1] == r - 2;
}

tb_status tb_opt_fold_transpose_matmul(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    int folded = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if ((n->op != TB_OP_NN_MATMUL && n->op != TB_OP_GEMM) || n->n_in < 2) continue;
        for (int side = 0; side < 2; side++) {
            int t = tb_opt_producer_op(g, &ix, n->in[side], TB_OP_TRANSPOSE);
            if (t < 0) continue;
            int x = g->nodes[t].in[0], rk = g->values[x].rank;
            if (!perm_swaps_last2(&g->nodes[t], rk) || (n->op == TB_OP_GEMM && rk != 2)) continue;
            tb_node c = *n;
            c.in[side] = x;
            c.i[side] ^= 1; /* trans_a / trans_b, transA / transB */
            if (!tb_opt_node_fits(g, &c, n->out[0])) continue;
            tb_opt_place(g, k, &c, n->out[0]);
            folded++;
            tb_opt_index_free(&ix);
            TB_TRY(tb_opt_index_build(g, &ix));
        }
    }
    tb_opt_index_free(&ix);
    r->changes = folded;
    snprintf(r->what, sizeof r->what, "folded %d Transposes into MatMul / Gemm", folded);
    return TB_OK;
}

static int is_graph_output(const tb_graph *g, int v) {
    if (g->output == v) return 1;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return 1;
    return 0;
}

/* A Reshape's target shape as a constant with no 0 entries (a 0 copies a dim
 * of the input, so it would change meaning with another input). */
static int reshape_target_plain(const tb_graph *g, const tb_node *n) {
    const tb_value *s = &g->values[n->in[1]];
    if (s->kind != TB_VAL_WEIGHT || !s->data || s->rank != 1 || s->dims[0] < 0) return 0;
    tb_view v;
    tb_value_view(g, n->in[1], &v);
    if (v.dtype != TB_I64 && v.dtype != TB_I32) return 0;
    for (int64_t i = 0; i < s->dims[0]; i++)
        if (tb_view_get_i(&v, i) == 0) return 0;
    return 1;
}

tb_status tb_opt_merge_transpose_reshape(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    int tmerged = 0, rmerged = 0, noop = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || n->n_out != 1) continue;
        int done = 0, y = n->out[0];
        if (n->op == TB_OP_TRANSPOSE) {
            int rk = g->values[n->in[0]].rank;
            int p = tb_opt_producer_op(g, &ix, n->in[0], TB_OP_TRANSPOSE);
            if (p >= 0) { /* out[i] = mid[p2[i]] = x[p1[p2[i]]] */
                tb_node c = *n;
                for (int i = 0; i < rk; i++) c.i[i] = g->nodes[p].i[n->i[i]];
                c.in[0] = g->nodes[p].in[0];
                if (tb_opt_node_fits(g, &c, y)) {
                    tb_opt_place(g, k, &c, y);
                    done = 1;
                    tmerged++;
                }
            }
            int ident = 1;
            for (int i = 0; i < rk; i++) ident &= g->nodes[k].i[i] == i;
            if (ident && !is_graph_output(g, y) && tb_opt_shape_eq(g, g->nodes[k].in[0], y)) {
                tb_opt_replace_uses(g, y, g->nodes[k].in[0]);
                tb_opt_kill(g, k);
                done = 1;
                noop++;
            }
        } else if (n->op == TB_OP_RESHAPE && n->n_in == 2) {
            int p = ix.prod[n->in[0]];
            tb_op_kind pop = p >= 0 ? g->nodes[p].op : TB_OP_COUNT;
            if ((pop == TB_OP_RESHAPE || pop == TB_OP_FLATTEN || pop == TB_OP_SQUEEZE || pop == TB_OP_UNSQUEEZE) &&
                reshape_target_plain(g, n)) {
                tb_node c = *n;
                c.in[0] = g->nodes[p].in[0];
                if (tb_opt_node_fits(g, &c, y)) {
                    tb_opt_place(g, k, &c, y);
                    done = 1;
                    rmerged++;
                }
            }
            if (!is_graph_output(g, y) && tb_opt_shape_eq(g, g->nodes[k].in[0], y)) {
                tb_opt_replace_uses(g, y, g->nodes[k].in[0]);
                tb_opt_kill(g, k);
                done = 1;
                noop++;
            }
        }
        if (done) {
            tb_opt_index_free(&ix);
            TB_TRY(tb_opt_index_build(g, &ix));
        }
    }
    tb_opt_index_free(&ix);
    r->changes = tmerged + rmerged + noop;
    snprintf(r->what, sizeof r->what, "merged %d Transpose pairs, %d Reshape chains; removed %d no-op Transpose/Reshape",
             tmerged, rmerged, noop);
    return TB_OK;
}
