/* nn_match.c — what the general-graph passes share to match patterns
 * safely: producers and reader counts, constants read as scalars or
 * per-channel vectors, shape equality, and a check that a fused node is
 * valid before it replaces anything (opt.h). */
#include "opt/opt.h"


/* ---------------------------------------------------------------- refined dims */

static int shape_expr(const tb_graph *g, const tb_opt_index *ix, int v, tb_opt_shape_el *out, int depth);

/* numpy broadcasting of two dims when it can be told: equal, or one is 1 */
static int64_t bdim(int64_t a, int64_t b) {
    if (a == b) return a;
    if (a == 1) return b;
    if (b == 1) return a;
    return TB_DIM_DYN;
}

static void bcast(const int64_t *a, int ra, const int64_t *b, int rb, int64_t *out, int r) {
    for (int i = 0; i < r; i++) {
        int ia = i - (r - ra), ib = i - (r - rb);
        out[i] = bdim(ia >= 0 ? a[ia] : 1, ib >= 0 ? b[ib] : 1);
    }
}

/* The element count divided by the known dims, for Reshape's -1: x's
 * factors over the target's, equal symbols cancelled. TB_DIM_DYN unless
 * one symbol or a whole number is left. */
static int64_t solve_minus1(const int64_t *x, int rx, const int64_t *t, int rt, int skip) {
    int64_t num = 1, den = 1, left[TB_MAX_RANK];
    int nl = 0;
    for (int i = 0; i < rx; i++) {
        if (x[i] == TB_DIM_DYN) return TB_DIM_DYN;
        if (x[i] >= 0) num *= x[i];
        else left[nl++] = x[i];
    }
    for (int j = 0; j < rt; j++) {
        if (j == skip) continue;
        if (t[j] == TB_DIM_DYN) return TB_DIM_DYN;
        if (t[j] >= 0) { den *= t[j]; continue; }
        int f = -1;
        for (int i = 0; i < nl && f < 0; i++) if (left[i] == t[j]) f = i;
        if (f < 0) return TB_DIM_DYN;
        left[f] = left[--nl];
    }
    if (den <= 0 || num % den) return TB_DIM_DYN;
    if (nl == 0) return num / den;
    return nl == 1 && num == den ? left[0] : TB_DIM_DYN;
}

/* Refined dims of the outputs of node k (already sound: a dim the rule
 * knows is kept, a TB_DIM_DYN one replaced by what the inputs tell). */
static void refine_node(const tb_graph *g, tb_opt_index *ix, int k) {
    const tb_node *n = &g->nodes[k];
    if (n->op == TB_OP_SPLIT) { /* every part keeps the dims off the split axis */
        int ax = n->i[0], ra = g->values[n->in[0]].rank;
        for (int o = 0; o < n->n_out; o++) {
            int y = n->out[o];
            if (g->values[y].rank != ra || ax < 0 || ax >= ra) continue;
            for (int i = 0; i < ra; i++)
                if (i != ax && g->values[y].dims[i] == TB_DIM_DYN) ix->dims[y][i] = ix->dims[n->in[0]][i];
        }
        return;
    }
    if (n->n_out != 1) return;
    int y = n->out[0], r = g->values[y].rank;
    int64_t d[TB_MAX_RANK];
    for (int i = 0; i < r; i++) d[i] = TB_DIM_DYN;
    const int64_t *a = n->n_in > 0 ? ix->dims[n->in[0]] : NULL;
    int ra = n->n_in > 0 ? g->values[n->in[0]].rank : 0;
    switch (n->op) {
    case TB_OP_NN_ADD: case TB_OP_SUB: case TB_OP_MUL: case TB_OP_DIV: case TB_OP_POW: case TB_OP_WHERE:
    case TB_OP_EQUAL: case TB_OP_LESS: case TB_OP_LESS_OR_EQUAL: case TB_OP_GREATER: case TB_OP_GREATER_OR_EQUAL:
    case TB_OP_AND: case TB_OP_OR: {
        int64_t acc[TB_MAX_RANK];
        for (int i = 0; i < r; i++) acc[i] = 1;
        for (int j = 0; j < n->n_in; j++) {
            const int64_t *b = ix->dims[n->in[j]];
            int rb = g->values[n->in[j]].rank;
            if (rb > r) return;
            bcast(acc, r, b, rb, acc, r);
        }
        memcpy(d, acc, sizeof(int64_t) * (size_t)r);
        break;
    }
    case TB_OP_RELU: case TB_OP_SIGMOID: case TB_OP_TANH: case TB_OP_EXP: case TB_OP_LOG: case TB_OP_NEG:
    case TB_OP_ABS: case TB_OP_SQRT: case TB_OP_RECIPROCAL: case TB_OP_ERF: case TB_OP_IDENTITY: case TB_OP_CLIP:
    case TB_OP_CAST: case TB_OP_GELU: case TB_OP_SOFTMAX: case TB_OP_LAYERNORM: case TB_OP_NOT:
        if (ra == r) memcpy(d, a, sizeof(int64_t) * (size_t)r);
        break;
    case TB_OP_RANGE: { /* Range(0, dim, 1): dim elements */
        double s, dl;
        tb_opt_shape_el e[TB_MAX_RANK];
        if (r == 1 && tb_opt_const_scalar(g, n->in[0], 1, &s) && s == 0 && tb_opt_const_scalar(g, n->in[2], 1, &dl) &&
            dl == 1 && shape_expr(g, ix, n->in[1], e, 0) == 1)
            d[0] = e[0].src < 0 ? (e[0].c > 0 ? e[0].c : TB_DIM_DYN) : ix->dims[e[0].src][e[0].axis];
        break;
    }
    case TB_OP_GATHER: {
        int ax = n->i[0], ri = g->values[n->in[1]].rank;
        if (ax < 0 || ax >= ra || ra - 1 + ri != r) break;
        int o = 0;
        for (int i = 0; i < ax; i++) d[o++] = a[i];
        for (int i = 0; i < ri; i++) d[o++] = ix->dims[n->in[1]][i];
        for (int i = ax + 1; i < ra; i++) d[o++] = a[i];
        break;
    }
    case TB_OP_UNSQUEEZE: {
        tb_opt_shape_el e[TB_MAX_RANK];
        int na = shape_expr(g, ix, n->in[1], e, 0);
        if (na < 0 || ra + na != r) break;
        uint32_t ones = 0;
        for (int i = 0; i < na; i++) {
            if (e[i].src >= 0) return;
            int64_t x = e[i].c < 0 ? e[i].c + r : e[i].c;
            if (x < 0 || x >= r) return;
            ones |= 1u << x;
        }
        for (int i = 0, o = 0; i < r; i++) d[i] = ones >> i & 1 ? 1 : a[o++];
        break;
    }
    case TB_OP_TRANSPOSE:
        if (ra != r) break;
        for (int i = 0; i < r; i++) d[i] = n->i[i] >= 0 && n->i[i] < r ? a[n->i[i]] : TB_DIM_DYN;
        break;
    case TB_OP_RESHAPE: {
        const tb_value *t = &g->values[n->in[1]];
        if (t->kind != TB_VAL_WEIGHT || !t->data || t->rank != 1 || t->dims[0] != r) break;
        tb_view tv;
        tb_value_view(g, n->in[1], &tv);
        int64_t tgt[TB_MAX_RANK];
        int m1 = -1;
        for (int j = 0; j < r; j++) {
            int64_t c = tb_view_get_i(&tv, j);
            tgt[j] = c == 0 && !n->i[0] ? (j < ra ? a[j] : TB_DIM_DYN) : c;
            if (c == -1) { m1 = j; tgt[j] = TB_DIM_DYN; }
        }
        if (m1 >= 0) tgt[m1] = solve_minus1(a, ra, tgt, r, m1);
        memcpy(d, tgt, sizeof(int64_t) * (size_t)r);
        break;
    }
    case TB_OP_NN_MATMUL: {
        const int64_t *b = ix->dims[n->in[1]];
        int rb = g->values[n->in[1]].rank;
        if (ra < 2 || rb < 2 || r != (ra > rb ? ra : rb)) break;
        bcast(a, ra - 2, b, rb - 2, d, r - 2);
        d[r - 2] = n->i[0] ? a[ra - 1] : a[ra - 2];
        d[r - 1] = n->i[1] ? b[rb - 2] : b[rb - 1];
        break;
    }
    case TB_OP_SDPA:
        if (ra == r && g->values[n->in[2]].rank == r && n->i[3] == 0) {
            memcpy(d, a, sizeof(int64_t) * (size_t)r);
            d[r - 1] = ix->dims[n->in[2]][r - 1];
        } else if (ra == 3 && r == 3 && n->i[3] > 0) { /* heads layout: (B, S) of q, the width by the rule */
            d[0] = a[0];
            d[1] = a[1];
        }
        break;
    default: break;
    }
    const int64_t *st = g->values[y].dims;
    for (int i = 0; i < r; i++) ix->dims[y][i] = st[i] != TB_DIM_DYN ? st[i] : d[i];
}

static void refine_dims(const tb_graph *g, tb_opt_index *ix) {
    for (int v = 0; v < g->n_values; v++) memcpy(ix->dims[v], g->values[v].dims, sizeof ix->dims[v]);
    for (int k = 0; k < g->n_nodes; k++)
        if (!tb_opt_dead(&g->nodes[k])) refine_node(g, ix, k);
}

int tb_opt_shape_eq_ix(const tb_graph *g, const tb_opt_index *ix, int a, int b) {
    if (g->values[a].rank != g->values[b].rank) return 0;
    for (int i = 0; i < g->values[a].rank; i++) {
        int64_t x = ix->dims[a][i], y = ix->dims[b][i], fx, fy;
        if (x == TB_DIM_DYN || y == TB_DIM_DYN) return 0;
        if (x != y && !(tb_opt_fixed_dim(g, x, &fx) && tb_opt_fixed_dim(g, y, &fy) && fx == fy)) return 0;
    }
    return 1;
}

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
    ix->dims = malloc(((size_t)nv + 1) * sizeof *ix->dims);
    if (!ix->dims) {
        tb_opt_index_free(ix);
        return tb_errorf(TB_ERR_OOM, "out of memory indexing %d values", nv);
    }
    refine_dims(g, ix);
    return TB_OK;
}

void tb_opt_index_free(tb_opt_index *ix) {
    free(ix->prod);
    free(ix->uses);
    free(ix->dims);
    ix->prod = ix->uses = NULL;
    ix->dims = NULL;
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

int tb_opt_fixed_dim(const tb_graph *g, int64_t d, int64_t *out) {
    if (d >= 0) { *out = d; return 1; }
    if (TB_IS_SYM(d) && TB_SYM_INDEX(d) < g->n_syms) {
        const tb_symbol *s = &g->syms[TB_SYM_INDEX(d)];
        if (s->min == s->max) { *out = s->min; return 1; }
    }
    return 0;
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

/* ---------------------------------------------------------------- shape expressions */

static int shape_expr(const tb_graph *g, const tb_opt_index *ix, int v, tb_opt_shape_el *out, int depth) {
    const tb_value *x = &g->values[v];
    if (depth > 16 || x->rank > 1 || (x->dtype != TB_I64 && x->dtype != TB_I32)) return -1;
    if (x->kind == TB_VAL_WEIGHT) {
        if (!x->data || (x->rank == 1 && (x->dims[0] < 0 || x->dims[0] > TB_MAX_RANK))) return -1;
        int n = x->rank ? (int)x->dims[0] : 1;
        tb_view w;
        tb_value_view(g, v, &w);
        for (int i = 0; i < n; i++) out[i] = (tb_opt_shape_el){-1, 0, tb_view_get_i(&w, i)};
        return n;
    }
    int k = ix->prod[v];
    if (k < 0) return -1;
    const tb_node *n = &g->nodes[k];
    tb_opt_shape_el a[TB_MAX_RANK];
    switch (n->op) {
    case TB_OP_SHAPE: {
        const tb_value *s = &g->values[n->in[0]];
        int64_t rank = s->rank, start = n->i[0], end = n->i[2] ? n->i[1] : rank;
        if (start < 0) start += rank;
        if (end < 0) end += rank;
        start = start < 0 ? 0 : start > rank ? rank : start;
        end = end < 0 ? 0 : end > rank ? rank : end;
        int m = 0;
        for (int64_t i = start; i < end; i++, m++) {
            int64_t d;
            out[m] = tb_opt_fixed_dim(g, s->dims[i], &d) ? (tb_opt_shape_el){-1, 0, d} : (tb_opt_shape_el){n->in[0], (int)i, 0};
        }
        return m;
    }
    case TB_OP_GATHER: {
        int na = n->i[0] == 0 ? shape_expr(g, ix, n->in[0], a, depth + 1) : -1;
        const tb_value *iv = &g->values[n->in[1]];
        if (na < 0 || iv->kind != TB_VAL_WEIGHT || !iv->data || iv->rank > 1 ||
            (iv->rank == 1 && (iv->dims[0] < 0 || iv->dims[0] > TB_MAX_RANK)))
            return -1;
        int m = iv->rank ? (int)iv->dims[0] : 1;
        tb_view w;
        tb_value_view(g, n->in[1], &w);
        for (int i = 0; i < m; i++) {
            int64_t j = tb_view_get_i(&w, i);
            if (j < 0) j += na;
            if (j < 0 || j >= na) return -1;
            out[i] = a[j];
        }
        return m;
    }
    case TB_OP_UNSQUEEZE: case TB_OP_SQUEEZE: case TB_OP_CAST:
        if (n->op == TB_OP_CAST && n->i[0] != TB_I64 && n->i[0] != TB_I32) return -1;
        return shape_expr(g, ix, n->in[0], out, depth + 1);
    case TB_OP_CONCAT: {
        if (n->i[0] != 0) return -1;
        int m = 0;
        for (int i = 0; i < n->n_in; i++) {
            int na = shape_expr(g, ix, n->in[i], a, depth + 1);
            if (na < 0 || m + na > TB_MAX_RANK) return -1;
            memcpy(out + m, a, sizeof(tb_opt_shape_el) * (size_t)na);
            m += na;
        }
        return m;
    }
    default: return -1;
    }
}

int tb_opt_shape_expr(const tb_graph *g, const tb_opt_index *ix, int v, tb_opt_shape_el *out) {
    return shape_expr(g, ix, v, out, 0);
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
