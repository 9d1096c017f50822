/* nn_match.c — what the general-graph passes share to match patterns
 * safely: producers and reader counts, constants read as scalars or
 * per-channel vectors, shape equality, and a check that a fused node is
 * valid before it replaces anything (opt.h). */
#include "opt/opt.h"

tb_status tb_opt_index_build(const tb_graph *g, tb_opt_index *ix) {
    int nv = g->n_values;
    ix->prod = malloc(((size_t)nv + 1) * sizeof *ix->prod);
    ix->uses = calloc((size_t)nv + 1, sizeof *ix->uses);
    ix->n_values = nv;
    if (!ix->prod || !ix->uses) {
        tb_opt_index_free(ix);
        return tb_errorf(TB_ERR_OOM, "out of memory indexing %d values", nv);
    }
    for (int v = 0; v < nv; v++) ix->prod[v] = -1;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        for (int o = 0; o < n->n_out; o++)
            if (n->out[o] >= 0 && n->out[o] < nv) ix->prod[n->out[o]] = k;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0 && n->in[i] < nv) ix->uses[n->in[i]]++;
    }
    if (g->output >= 0 && g->output < nv) ix->uses[g->output]++;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] >= 0 && g->outputs[i] < nv) ix->uses[g->outputs[i]]++;
    return TB_OK;
}

void tb_opt_index_free(tb_opt_index *ix) {
    free(ix->prod);
    free(ix->uses);
    ix->prod = ix->uses = NULL;
    ix->n_values = 0;
}

int tb_opt_producer_op(const tb_graph *g, const tb_opt_index *ix, int v, tb_op_kind op) {
    if (v < 0 || v >= ix->n_values) return -1;
    int k = ix->prod[v];
    return k >= 0 && g->nodes[k].op == op ? k : -1;
}

int tb_opt_single_reader(const tb_graph *g, const tb_opt_index *ix, int v) {
    if (v < 0 || v >= ix->n_values || ix->uses[v] != 1) return -1;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == v) return k;
    }
    return -1; /* the one use is a graph output */
}

static int64_t value_numel_known(const tb_value *x) {
    int64_t n = 1;
    for (int i = 0; i < x->rank; i++) {
        if (x->dims[i] < 0) return -1;
        n *= x->dims[i];
    }
    return n;
}

int tb_opt_const_scalar(const tb_graph *g, int v, int max_rank, double *out) {
    if (v < 0 || v >= g->n_values) return 0;
    const tb_value *x = &g->values[v];
    if (x->kind != TB_VAL_WEIGHT || !x->data || x->rank > max_rank || value_numel_known(x) != 1) return 0;
    tb_view w;
    tb_value_view(g, v, &w);
    switch (x->dtype) {
    case TB_F32: case TB_F64: case TB_F16: case TB_BF16: case TB_I32: case TB_I64: case TB_I8: case TB_U8:
        *out = tb_view_get_f(&w, 0);
        return 1;
    default: return 0;
    }
}

const float *tb_opt_weight_f32(const tb_graph *g, int v) {
    if (v < 0 || v >= g->n_values) return NULL;
    const tb_value *x = &g->values[v];
    if (x->kind != TB_VAL_WEIGHT || x->dtype != TB_F32 || !x->data || value_numel_known(x) < 0) return NULL;
    return x->data;
}

/* A symbol whose profile is one value is that number. */
static int64_t dim_fixed(const tb_graph *g, int64_t d) {
    if (TB_IS_SYM(d) && TB_SYM_INDEX(d) < g->n_syms) {
        const tb_symbol *s = &g->syms[TB_SYM_INDEX(d)];
        if (s->min == s->max) return s->min;
    }
    return d;
}

int tb_opt_shape_eq(const tb_graph *g, int a, int b) {
    const tb_value *x = &g->values[a], *y = &g->values[b];
    if (x->rank != y->rank) return 0;
    for (int i = 0; i < x->rank; i++)
        if (dim_fixed(g, x->dims[i]) != dim_fixed(g, y->dims[i]) || x->dims[i] == TB_DIM_DYN) return 0;
    return 1;
}

int tb_opt_const_per_channel(const tb_graph *g, int v, int rank, int axis, int64_t ch, float *out) {
    const float *d = tb_opt_weight_f32(g, v);
    if (!d || ch <= 0) return 0;
    const tb_value *x = &g->values[v];
    if (x->rank > rank || axis < 0 || axis >= rank) return 0;
    int64_t n = 1;
    for (int i = 0; i < x->rank; i++) {
        int a = i + (rank - x->rank); /* the axis of the tensor it broadcasts against */
        int64_t dim = x->dims[i];
        if (a == axis ? dim != ch && dim != 1 : dim != 1) return 0;
        n *= dim;
    }
    for (int64_t c = 0; c < ch; c++) out[c] = d[n == 1 ? 0 : c];
    return 1;
}

int tb_opt_add_weight_f32(tb_graph *g, const char *name, int rank, const int64_t *dims, float *data) {
    char nm[TB_NAME_LEN];
    /* a fresh name: passes may add several weights derived from one value */
    for (int i = 0;; i++) {
        snprintf(nm, sizeof nm, i ? "%s.%d" : "%s", name, i);
        if (tb_graph_find_value(g, nm) < 0) break;
    }
    return tb_graph_add_weight(g, nm, TB_F32, rank, dims, data, 1);
}

int tb_opt_node_fits(const tb_graph *g, const tb_node *cand, int like) {
    tb_op_shape sh;
    if (tb_op_infer(g, cand, &sh) != TB_OK) {
        tb_error_clear(); /* a rejected candidate is no error */
        return 0;
    }
    const tb_value *y = &g->values[like];
    if (sh.n_out != 1 || sh.rank[0] != y->rank || sh.dtype[0] != y->dtype) return 0;
    for (int i = 0; i < y->rank; i++)
        if (sh.dims[0][i] != y->dims[i]) return 0;
    return 1;
}

void tb_opt_place(tb_graph *g, int k, const tb_node *cand, int out_v) {
    tb_node nd = *cand;
    nd.n_out = 1;
    nd.out[0] = out_v;
    nd.tactic = 0;
    g->nodes[k] = nd;
}

tb_status tb_opt_refresh_shapes(tb_graph *g) {
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        tb_op_shape sh;
        tb_status s = tb_op_infer(g, n, &sh);
        if (s != TB_OK) return tb_error_prefix(s, "node %d (%s)", k, tb_op_name(n->op));
        if (sh.n_out != n->n_out)
            return tb_errorf(TB_ERR_INTERNAL, "node %d (%s): %d outputs, the rule says %d", k, tb_op_name(n->op),
                             n->n_out, sh.n_out);
        for (int o = 0; o < n->n_out; o++) {
            tb_value *y = &g->values[n->out[o]];
            y->rank = sh.rank[o];
            y->dtype = sh.dtype[o];
            memcpy(y->dims, sh.dims[o], sizeof y->dims);
        }
    }
    return TB_OK;
}
