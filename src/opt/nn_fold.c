/* nn_fold.c — the clean-up passes of the general pipeline: Identity
 * removal, dead nodes, and constant folding with the reference kernels
 * (Shape of fixed dims included, so the Shape -> Gather -> Unsqueeze ->
 * Concat -> Reshape arithmetic of exported graphs folds into constants;
 * with dynamic dims, such a Reshape target becomes a constant of 0s (copy
 * the input's dim) and one -1 where it can). */
#include "opt/opt.h"

/* ---------------------------------------------------------------- identity */

tb_status tb_opt_remove_identity(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    int removed = 0, kept = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if (n->op != TB_OP_IDENTITY || n->n_in != 1 || n->n_out != 1) continue;
        int x = n->in[0], y = n->out[0];
        int y_is_output = g->output == y;
        for (int i = 0; i < g->n_outputs; i++) y_is_output |= g->outputs[i] == y;
        if (!y_is_output) {
            tb_opt_replace_uses(g, y, x);
        } else {
            /* a graph output keeps its value (outputs are bound by name): the
             * producer of x writes it instead when x has no other reader */
            int p = ix.prod[x];
            if (p < 0 || ix.uses[x] != 1) { kept++; continue; }
            tb_node *pn = &g->nodes[p];
            for (int j = 0; j < pn->n_out; j++)
                if (pn->out[j] == x) pn->out[j] = y;
        }
        tb_opt_kill(g, k);
        removed++;
        tb_opt_index_free(&ix);
        TB_TRY(tb_opt_index_build(g, &ix));
    }
    tb_opt_index_free(&ix);
    r->changes = removed;
    snprintf(r->what, sizeof r->what, "removed %d Identity%s", removed,
             kept ? " (some kept: a graph input passed through as an output)" : "");
    return TB_OK;
}

tb_status tb_opt_dead_nodes(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    int before_v = g->n_values;
    int removed = tb_opt_compact(g);
    r->changes = removed;
    snprintf(r->what, sizeof r->what, "removed %d nodes nothing reads, %d values", removed, before_v - g->n_values);
    return TB_OK;
}

/* ---------------------------------------------------------------- folding */

/* Turns activation v into a weight holding `data` (taken) with these dims. */
static void make_weight(tb_graph *g, int v, int rank, const int64_t *dims, void *data, uint64_t nbytes) {
    tb_value *x = &g->values[v];
    x->kind = TB_VAL_WEIGHT;
    x->rank = rank;
    memcpy(x->dims, dims, sizeof(int64_t) * (size_t)rank);
    x->data = data;
    x->owned = 1;
    x->nbytes = nbytes;
    x->offset = 0;
}

/* Shape of a value whose dims are all fixed. 1: folded, 0: not. */
static int fold_shape(tb_graph *g, int k) {
    tb_node *n = &g->nodes[k];
    if (n->n_in != 1 || n->n_out != 1) return 0;
    const tb_value *x = &g->values[n->in[0]];
    int64_t dims[TB_MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        if (!tb_opt_fixed_dim(g, x->dims[i], &dims[i])) return 0;
    int64_t rank = x->rank, start = n->i[0], end = n->i[2] ? n->i[1] : rank;
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = start < 0 ? 0 : start > rank ? rank : start;
    end = end < 0 ? 0 : end > rank ? rank : end;
    int64_t len = end > start ? end - start : 0;
    const tb_value *y = &g->values[n->out[0]];
    if (y->dtype != TB_I64 || y->rank != 1 || (y->dims[0] >= 0 && y->dims[0] != len)) return 0;
    int64_t *data = malloc(sizeof(int64_t) * (size_t)(len ? len : 1));
    if (!data) return 0;
    for (int64_t i = 0; i < len; i++) data[i] = dims[start + i];
    make_weight(g, n->out[0], 1, &len, data, (uint64_t)len * sizeof(int64_t));
    tb_opt_kill(g, k);
    return 1;
}

/* A node whose inputs are all constants, run with its reference kernel.
 * 1: folded, 0: left (too large, no kernel, or the kernel failed). */
static int fold_node(tb_graph *g, int k, int *too_big) {
    tb_node *n = &g->nodes[k];
    const tb_op_def *d = tb_op_get_def(n->op);
    if (!d || !d->ref || !d->infer || n->n_in < 1) return 0;
    tb_view in[TB_MAX_INPUTS];
    for (int i = 0; i < n->n_in; i++) {
        if (g->values[n->in[i]].kind != TB_VAL_WEIGHT || !g->values[n->in[i]].data) return 0;
        tb_value_view(g, n->in[i], &in[i]);
    }
    tb_op_shape sh;
    if (tb_op_infer_views(n, in, n->n_in, &sh) != TB_OK || sh.n_out != n->n_out) {
        tb_error_clear();
        return 0;
    }
    tb_view out[TB_MAX_OUTPUTS];
    uint64_t bytes[TB_MAX_OUTPUTS], total = 0;
    memset(out, 0, sizeof out);
    for (int o = 0; o < sh.n_out; o++) {
        out[o].dtype = sh.dtype[o];
        out[o].rank = sh.rank[o];
        memcpy(out[o].dims, sh.dims[o], sizeof out[o].dims);
        for (int i = 0; i < sh.rank[o]; i++)
            if (sh.dims[o][i] < 0) return 0;
        if (tb_dtype_tensor_bytes(sh.dtype[o], sh.rank[o], sh.dims[o], &bytes[o]) != TB_OK) {
            tb_error_clear();
            return 0;
        }
        total += bytes[o];
    }
    if (total > TB_OPT_FOLD_MAX_BYTES) { (*too_big)++; return 0; }
    int ok = 1;
    for (int o = 0; o < sh.n_out && ok; o++) ok = (out[o].data = calloc(1, bytes[o] ? bytes[o] : 1)) != NULL;
    if (ok && d->ref(n, in, n->n_in, out, sh.n_out) != TB_OK) {
        tb_error_clear();
        ok = 0;
    }
    if (!ok) {
        for (int o = 0; o < sh.n_out; o++) free(out[o].data);
        return 0;
    }
    for (int o = 0; o < sh.n_out; o++) {
        g->values[n->out[o]].dtype = sh.dtype[o];
        make_weight(g, n->out[o], sh.rank[o], sh.dims[o], out[o].data, bytes[o]);
    }
    tb_opt_kill(g, k);
    return 1;
}

/* Reshape(x, target) with a target computed from dims: each element that is
 * dim j of x itself at position j (or x's symbol there) becomes 0 (copy
 * that dim); when one
 * element is left unknown it becomes -1 (Reshape keeps the element count,
 * so it is the same number). The target is then a constant, and the shape
 * rule knows the dims it copies. 1: rewritten. */
static int simplify_reshape(tb_graph *g, const tb_opt_index *ix, int k) {
    const tb_node *n = &g->nodes[k];
    if (n->n_in != 2 || n->i[0] != 0 || g->values[n->in[1]].kind == TB_VAL_WEIGHT) return 0;
    tb_opt_shape_el e[TB_MAX_RANK];
    int m = tb_opt_shape_expr(g, ix, n->in[1], e), x = n->in[0], unknown = 0, minus1 = 0;
    if (m < 0) return 0;
    int64_t *t = malloc(sizeof(int64_t) * (size_t)(m ? m : 1));
    if (!t) return 0;
    const tb_value *xv = &g->values[x];
    for (int j = 0; j < m; j++) {
        int64_t sd = e[j].src >= 0 ? g->values[e[j].src].dims[e[j].axis] : 0;
        if (e[j].src < 0) {
            t[j] = e[j].c;
            minus1 += t[j] == -1;
        } else if (j < xv->rank && ((e[j].src == x && e[j].axis == j) || (TB_IS_SYM(sd) && xv->dims[j] == sd))) {
            t[j] = 0; /* the same dim of x (or the same symbol) */
        } else {
            t[j] = -1;
            unknown++;
        }
    }
    if (unknown + minus1 > 1) { free(t); return 0; }
    char name[TB_NAME_LEN];
    snprintf(name, sizeof name, "%s.target", g->values[n->out[0]].name);
    int64_t len = m;
    int w = tb_graph_add_weight(g, name, TB_I64, 1, &len, t, 1);
    if (w < 0) { tb_error_clear(); return 0; }
    g->nodes[k].in[1] = w;
    return 1;
}

static int simplify_reshapes(tb_graph *g) {
    tb_opt_index ix;
    if (tb_opt_index_build(g, &ix) != TB_OK) return 0;
    int done = 0;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == TB_OP_RESHAPE) done += simplify_reshape(g, &ix, k);
    tb_opt_index_free(&ix);
    return done;
}

/* Graph outputs stay written by nodes (the runtime returns them from its
 * buffers), so a node writing one is not folded. */
static int writes_graph_output(const tb_graph *g, const tb_node *n) {
    for (int o = 0; o < n->n_out; o++) {
        if (g->output == n->out[o]) return 1;
        for (int i = 0; i < g->n_outputs; i++)
            if (g->outputs[i] == n->out[o]) return 1;
    }
    return 0;
}

tb_status tb_opt_fold_constants(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    int folded = 0, shapes = 0, reshapes = 0, too_big = 0;
    /* one sweep folds chains (a folded value is a weight for the nodes after
     * it); refreshing the shapes then makes more dims known (a Reshape whose
     * shape became constant), which may let more Shape nodes fold */
    for (int round = 0; round < 16; round++) {
        int changed = 0;
        for (int k = 0; k < g->n_nodes; k++) {
            tb_node *n = &g->nodes[k];
            if (tb_opt_dead(n) || !tb_op_is_nn(n->op) || writes_graph_output(g, n)) continue;
            /* int8 weights behind DequantizeLinear: the INT8 pass (nn_quant.c)
             * keeps them as codes, or folds them itself */
            if (n->op == TB_OP_DEQUANTIZE_LINEAR && g->values[n->in[0]].dtype == TB_I8) continue;
            if (n->op == TB_OP_SHAPE && g->values[n->in[0]].kind != TB_VAL_WEIGHT) {
                if (fold_shape(g, k)) { shapes++; changed++; }
                continue;
            }
            if (fold_node(g, k, &too_big)) { folded++; changed++; }
        }
        if (!changed) { /* folding is stuck: Reshape targets of dims left unknown */
            int re = simplify_reshapes(g);
            reshapes += re;
            changed += re;
        }
        if (!changed) break;
        TB_TRY(tb_opt_refresh_shapes(g));
    }
    r->changes = folded + shapes + reshapes;
    snprintf(r->what, sizeof r->what,
             "folded %d nodes into constants, %d Shape of fixed dims; %d Reshape targets computed from dims made "
             "constant%s",
             folded, shapes, reshapes, too_big ? " (larger results left as nodes)" : "");
    return TB_OK;
}
