/* nn_pattern.c — subgraph patterns of exported transformers fused into one
 * op each: LayerNormalization written out as reductions, GELU in its erf
 * and tanh forms, and scaled dot-product attention (the sdpa op).
 *
 * A match walks back from an anchor node (Div of the normalisation, Erf,
 * Tanh, Softmax) and forward along single readers; every intermediate value
 * must have no reader outside the pattern, every constant must be the value
 * the formula needs (within float tolerance) and must not broadcast the
 * tensor to another shape. The fused node replaces the last node of the
 * pattern and writes its output value, so the graph stays in order. */
#include <math.h>

#include "opt/opt.h"

#define MAX_KILL 16

typedef struct {
    int k[MAX_KILL];
    int n;
} kill_list;

static void kl_add(kill_list *l, int k) {
    if (l->n < MAX_KILL) l->k[l->n++] = k;
}

static void kl_apply(tb_graph *g, const kill_list *l, int keep) {
    for (int i = 0; i < l->n; i++)
        if (l->k[i] != keep) tb_opt_kill(g, l->k[i]);
}

static int near(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b); }

/* The producer of v when it is `op` and v's only reader is node `reader`. */
static int prod_only(const tb_graph *g, const tb_opt_index *ix, int v, tb_op_kind op, int reader) {
    int p = tb_opt_producer_op(g, ix, v, op);
    return p >= 0 && tb_opt_single_reader(g, ix, v) == reader ? p : -1;
}

/* The only reader of v when it is op `op`, else -1. */
static int reader_op(const tb_graph *g, const tb_opt_index *ix, int v, tb_op_kind op) {
    int k = tb_opt_single_reader(g, ix, v);
    return k >= 0 && g->nodes[k].op == op ? k : -1;
}

/* Binary node k with one input a constant scalar equal to want (within
 * rel) that cannot broadcast the other: returns the other input or -1. */
static int other_of_scalar(const tb_graph *g, int k, double want, double rel) {
    const tb_node *n = &g->nodes[k];
    if (n->n_in != 2) return -1;
    for (int side = 0; side < 2; side++) {
        double c;
        int x = n->in[1 - side];
        if (tb_opt_const_scalar(g, n->in[side], g->values[x].rank, &c) && near(c, want, rel)) return x;
    }
    return -1;
}

static int is_f32(const tb_graph *g, int v) { return g->values[v].dtype == TB_F32; }

/* ---------------------------------------------------------------- layernorm */

/* ReduceMean over the last axis only, keepdims. */
static int reduces_last(const tb_graph *g, const tb_node *n) {
    if (n->op != TB_OP_REDUCE_MEAN || n->i[0] != 1) return 0;
    int r = g->values[n->in[0]].rank;
    if (r < 1) return 0;
    if (n->n_in == 2) {
        const tb_value *a = &g->values[n->in[1]];
        if (a->kind != TB_VAL_WEIGHT || !a->data || a->rank > 1 || (a->rank == 1 && a->dims[0] != 1)) return 0;
        tb_view v;
        tb_value_view(g, n->in[1], &v);
        int64_t ax = tb_view_get_i(&v, 0);
        return ax == r - 1 || ax == -1;
    }
    return (uint32_t)n->i[1] == 1u << (r - 1) || (n->i[1] == 0 && r == 1);
}

static int fuse_layernorm_at(tb_graph *g, const tb_opt_index *ix, int k) {
    const tb_node *n = &g->nodes[k];
    kill_list kl = {{0}, 0};
    int d = -1, sq = -1;
    if (n->op == TB_OP_DIV && n->n_in == 2) {
        d = n->in[0];
        sq = prod_only(g, ix, n->in[1], TB_OP_SQRT, k);
    } else if (n->op == TB_OP_MUL && n->n_in == 2) {
        for (int side = 0; side < 2 && sq < 0; side++) {
            int rc = prod_only(g, ix, n->in[side], TB_OP_RECIPROCAL, k);
            if (rc < 0) continue;
            sq = prod_only(g, ix, g->nodes[rc].in[0], TB_OP_SQRT, rc);
            if (sq >= 0) { kl_add(&kl, rc); d = n->in[1 - side]; }
        }
    }
    if (sq < 0 || d < 0) return 0;
    kl_add(&kl, sq);
    int ad = prod_only(g, ix, g->nodes[sq].in[0], TB_OP_NN_ADD, sq);
    if (ad < 0) return 0;
    double eps = -1;
    int var = -1;
    for (int side = 0; side < 2 && var < 0; side++) {
        const tb_node *a = &g->nodes[ad];
        int other = a->in[1 - side];
        if (tb_opt_const_scalar(g, a->in[side], g->values[other].rank, &eps) && eps >= 0 && eps < 1) var = other;
    }
    if (var < 0) return 0;
    kl_add(&kl, ad);
    int rm2 = prod_only(g, ix, var, TB_OP_REDUCE_MEAN, ad);
    if (rm2 < 0 || !reduces_last(g, &g->nodes[rm2])) return 0;
    kl_add(&kl, rm2);
    int sqv = g->nodes[rm2].in[0], pw, d_uses;
    if ((pw = prod_only(g, ix, sqv, TB_OP_POW, rm2)) >= 0) {
        double e;
        const tb_node *p = &g->nodes[pw];
        if (p->in[0] != d || !tb_opt_const_scalar(g, p->in[1], g->values[d].rank, &e) || e != 2.0) return 0;
        d_uses = 2;
    } else if ((pw = prod_only(g, ix, sqv, TB_OP_MUL, rm2)) >= 0) {
        const tb_node *p = &g->nodes[pw];
        if (p->in[0] != d || p->in[1] != d) return 0;
        d_uses = 3;
    } else {
        return 0;
    }
    kl_add(&kl, pw);
    int sub = tb_opt_producer_op(g, ix, d, TB_OP_SUB);
    if (sub < 0 || ix->uses[d] != d_uses) return 0;
    kl_add(&kl, sub);
    int x = g->nodes[sub].in[0];
    int rm1 = prod_only(g, ix, g->nodes[sub].in[1], TB_OP_REDUCE_MEAN, sub);
    if (rm1 < 0 || g->nodes[rm1].in[0] != x || !reduces_last(g, &g->nodes[rm1])) return 0;
    kl_add(&kl, rm1);
    const tb_value *xv = &g->values[x];
    int rank = xv->rank;
    int64_t D = rank ? xv->dims[rank - 1] : 0;
    /* d = x - mean and d / sqrt(var + eps) have x's shape: the reductions
     * keep their dims and eps is a scalar of no higher rank */
    if (!is_f32(g, x) || D <= 0 || g->values[n->out[0]].rank != rank) return 0;

    /* optional scale and shift along the last axis */
    float *gamma = malloc((size_t)D * sizeof *gamma), *beta = malloc((size_t)D * sizeof *beta);
    if (!gamma || !beta) { free(gamma); free(beta); return 0; }
    int last = k, y = n->out[0], has_beta = 0;
    for (int64_t i = 0; i < D; i++) gamma[i] = 1.0f;
    int m = reader_op(g, ix, y, TB_OP_MUL);
    for (int side = 0; m >= 0 && side < 2; side++) {
        const tb_node *mn = &g->nodes[m];
        if (mn->in[1 - side] == y && tb_opt_const_per_channel(g, mn->in[side], rank, rank - 1, D, gamma)) {
            kl_add(&kl, last);
            last = m;
            y = mn->out[0];
            break;
        }
    }
    int a = reader_op(g, ix, y, TB_OP_NN_ADD);
    for (int side = 0; a >= 0 && side < 2; side++) {
        const tb_node *an = &g->nodes[a];
        if (an->in[1 - side] == y && tb_opt_const_per_channel(g, an->in[side], rank, rank - 1, D, beta)) {
            kl_add(&kl, last);
            last = a;
            y = an->out[0];
            has_beta = 1;
            break;
        }
    }
    char name[TB_NAME_LEN];
    snprintf(name, sizeof name, "%s.ln_scale", g->values[y].name);
    int gid = tb_opt_add_weight_f32(g, name, 1, &D, gamma);
    int bid = -1;
    if (has_beta) {
        snprintf(name, sizeof name, "%s.ln_bias", g->values[y].name);
        bid = tb_opt_add_weight_f32(g, name, 1, &D, beta);
    } else {
        free(beta);
    }
    if (gid < 0 || (has_beta && bid < 0)) { tb_error_clear(); return 0; }
    tb_node c;
    memset(&c, 0, sizeof c);
    c.op = TB_OP_LAYERNORM;
    c.in[0] = x;
    c.in[1] = gid;
    c.n_in = 2;
    if (has_beta) c.in[c.n_in++] = bid;
    c.i[0] = rank - 1;
    c.f[0] = (float)eps;
    c.n_out = 1;
    c.out[0] = y;
    if (!tb_opt_node_fits(g, &c, y)) return 0;
    tb_opt_place(g, last, &c, y);
    kl_apply(g, &kl, last);
    return 1;
}

/* ---------------------------------------------------------------- gelu */

/* The end of x * 0.5 * a (a = 1 + erf(..) or 1 + tanh(..)) in any
 * association: the node writing the product, the Muls before it added to
 * kl; -1 when the readers of a do not form it. */
static int match_half_x(const tb_graph *g, const tb_opt_index *ix, int a, int x, kill_list *kl) {
    int r1 = reader_op(g, ix, a, TB_OP_MUL);
    if (r1 < 0) return -1;
    const tb_node *m1 = &g->nodes[r1];
    if (m1->n_in != 2) return -1;
    int q = m1->in[0] == a ? m1->in[1] : m1->in[0];
    int rank = g->values[x].rank;
    double c;
    if (q == x) { /* (x * a) * 0.5 */
        int r2 = reader_op(g, ix, m1->out[0], TB_OP_MUL);
        if (r2 < 0 || other_of_scalar(g, r2, 0.5, 1e-6) != m1->out[0]) return -1;
        kl_add(kl, r1);
        return r2;
    }
    if (tb_opt_const_scalar(g, q, rank, &c) && near(c, 0.5, 1e-6)) { /* (a * 0.5) * x */
        int r2 = reader_op(g, ix, m1->out[0], TB_OP_MUL);
        if (r2 < 0) return -1;
        const tb_node *m2 = &g->nodes[r2];
        if (!((m2->in[0] == x && m2->in[1] == m1->out[0]) || (m2->in[1] == x && m2->in[0] == m1->out[0]))) return -1;
        kl_add(kl, r1);
        return r2;
    }
    int h = prod_only(g, ix, q, TB_OP_MUL, r1); /* (x * 0.5) * a */
    if (h < 0 || other_of_scalar(g, h, 0.5, 1e-6) != x) return -1;
    kl_add(kl, h);
    return r1;
}

/* x / sqrt(2) or x * (1 / sqrt(2)) written by node t: x, or -1. */
static int erf_arg(const tb_graph *g, const tb_opt_index *ix, int v, int reader, kill_list *kl) {
    int t = prod_only(g, ix, v, TB_OP_DIV, reader);
    if (t >= 0) {
        const tb_node *n = &g->nodes[t];
        double c;
        if (tb_opt_const_scalar(g, n->in[1], g->values[n->in[0]].rank, &c) && near(c, M_SQRT2, 1e-5)) {
            kl_add(kl, t);
            return n->in[0];
        }
        return -1;
    }
    t = prod_only(g, ix, v, TB_OP_MUL, reader);
    if (t < 0) return -1;
    int x = other_of_scalar(g, t, M_SQRT1_2, 1e-5);
    if (x >= 0) kl_add(kl, t);
    return x;
}

/* x^3 as Pow(x, 3), x * (x * x) or (x * x) * x, read only by `reader`. */
static int is_cube_of(const tb_graph *g, const tb_opt_index *ix, int v, int x, int reader, kill_list *kl) {
    int p = prod_only(g, ix, v, TB_OP_POW, reader);
    double e;
    if (p >= 0) {
        const tb_node *n = &g->nodes[p];
        if (n->in[0] != x || !tb_opt_const_scalar(g, n->in[1], g->values[x].rank, &e) || e != 3.0) return 0;
        kl_add(kl, p);
        return 1;
    }
    p = prod_only(g, ix, v, TB_OP_MUL, reader);
    if (p < 0) return 0;
    const tb_node *n = &g->nodes[p];
    for (int side = 0; side < 2; side++) {
        if (n->in[1 - side] != x) continue;
        int sq = prod_only(g, ix, n->in[side], TB_OP_MUL, p);
        if (sq >= 0 && g->nodes[sq].in[0] == x && g->nodes[sq].in[1] == x) {
            kl_add(kl, p);
            kl_add(kl, sq);
            return 1;
        }
    }
    return 0;
}

/* 0.797885 * (x + 0.044715 x^3) (either operand order): x, or -1. */
static int tanh_arg(const tb_graph *g, const tb_opt_index *ix, int v, int reader, kill_list *kl) {
    int m = prod_only(g, ix, v, TB_OP_MUL, reader);
    if (m < 0) return -1;
    int s = other_of_scalar(g, m, sqrt(2.0 / M_PI), 1e-5);
    int ad = s >= 0 ? prod_only(g, ix, s, TB_OP_NN_ADD, m) : -1;
    if (ad < 0) return -1;
    const tb_node *an = &g->nodes[ad];
    for (int side = 0; side < 2; side++) {
        int x = an->in[side];
        int c1 = prod_only(g, ix, an->in[1 - side], TB_OP_MUL, ad);
        if (c1 < 0) continue;
        int cube = other_of_scalar(g, c1, 0.044715, 1e-5);
        kill_list k2 = *kl;
        if (cube < 0 || !is_cube_of(g, ix, cube, x, c1, &k2)) continue;
        *kl = k2;
        kl_add(kl, m);
        kl_add(kl, ad);
        kl_add(kl, c1);
        return x;
    }
    return -1;
}

static int fuse_gelu_at(tb_graph *g, const tb_opt_index *ix, int k) {
    const tb_node *n = &g->nodes[k];
    if ((n->op != TB_OP_ERF && n->op != TB_OP_TANH) || n->n_in != 1) return 0;
    kill_list kl = {{0}, 0};
    int tanh_form = n->op == TB_OP_TANH;
    int x = tanh_form ? tanh_arg(g, ix, n->in[0], k, &kl) : erf_arg(g, ix, n->in[0], k, &kl);
    if (x < 0 || !is_f32(g, x)) return 0;
    kl_add(&kl, k);
    int one = reader_op(g, ix, n->out[0], TB_OP_NN_ADD);
    if (one < 0 || other_of_scalar(g, one, 1.0, 1e-6) != n->out[0]) return 0;
    kl_add(&kl, one);
    int last = match_half_x(g, ix, g->nodes[one].out[0], x, &kl);
    if (last < 0) return 0;
    int y = g->nodes[last].out[0]; /* x's shape: every constant is a scalar of no higher rank */
    tb_node c;
    memset(&c, 0, sizeof c);
    c.op = TB_OP_GELU;
    c.in[0] = x;
    c.n_in = 1;
    c.i[0] = tanh_form;
    c.n_out = 1;
    c.out[0] = y;
    if (!tb_opt_node_fits(g, &c, y)) return 0;
    tb_opt_place(g, last, &c, y);
    kl_apply(g, &kl, last);
    return 1;
}

/* ---------------------------------------------------------------- attention */

static int matmul_plain(const tb_node *n) {
    return n->op == TB_OP_NN_MATMUL && n->n_in == 2 && n->i[0] == 0 && n->i[2] == 0 && n->i[3] == 0 &&
           (n->f[0] == 0 || n->f[0] == 1);
}

/* Scores: MatMul(q, k^T) [* c | / c], read only by `reader`. Returns the
 * MatMul node and the scale; the scale node goes to kl. */
static int match_scores(const tb_graph *g, const tb_opt_index *ix, int v, int reader, double *scale, kill_list *kl) {
    *scale = 1.0;
    int p = ix->prod[v];
    if (p < 0 || tb_opt_single_reader(g, ix, v) != reader) return -1;
    const tb_node *n = &g->nodes[p];
    if (n->op == TB_OP_MUL || n->op == TB_OP_DIV) {
        double c;
        int s = -1;
        for (int side = 0; side < 2 && s < 0; side++) {
            if (n->op == TB_OP_DIV && side == 0) continue; /* c / scores is no scale */
            int other = n->in[1 - side];
            if (tb_opt_const_scalar(g, n->in[side], g->values[other].rank, &c) && c != 0 && isfinite(c)) s = other;
        }
        if (s < 0) return -1;
        *scale = n->op == TB_OP_DIV ? 1.0 / c : c;
        int mm = tb_opt_producer_op(g, ix, s, TB_OP_NN_MATMUL);
        if (mm < 0 || tb_opt_single_reader(g, ix, s) != p) return -1;
        kl_add(kl, p);
        p = mm;
        n = &g->nodes[p];
    }
    if (!matmul_plain(n)) return -1;
    kl_add(kl, p);
    return p;
}

/* Whether mask m broadcasts to exactly the shape of s: each of its dims
 * is 1 or the same as s's (dims as the index follows them). */
static int broadcasts_to(const tb_graph *g, const tb_opt_index *ix, int m, int s) {
    int rm = g->values[m].rank, rs = g->values[s].rank;
    if (rm > rs) return 0;
    for (int i = 0; i < rm; i++) {
        int64_t md = ix->dims[m][i], sd = ix->dims[s][i + rs - rm], fm, fs;
        if (md == 1) continue;
        if (md == TB_DIM_DYN || sd == TB_DIM_DYN) return 0;
        if (md != sd && !(tb_opt_fixed_dim(g, md, &fm) && tb_opt_fixed_dim(g, sd, &fs) && fm == fs)) return 0;
    }
    return 1;
}

static int fuse_attention_at(tb_graph *g, const tb_opt_index *ix, int k) {
    const tb_node *sm = &g->nodes[k];
    if (sm->op != TB_OP_SOFTMAX || sm->n_in != 1) return 0;
    const tb_value *sv = &g->values[sm->in[0]];
    if (sv->rank != 4 || sm->i[0] != 3 || !is_f32(g, sm->in[0])) return 0;
    kill_list kl = {{0}, 0};
    double scale = 1;
    int mask = -1, mask_kind = 0;
    int where = -1, where_c = -1, where_scores_first = 0;
    int mm = match_scores(g, ix, sm->in[0], k, &scale, &kl);
    if (mm < 0) {
        kl.n = 0;
        int a = prod_only(g, ix, sm->in[0], TB_OP_NN_ADD, k);
        int w = prod_only(g, ix, sm->in[0], TB_OP_WHERE, k);
        if (a >= 0) {
            for (int side = 0; side < 2 && mm < 0; side++) {
                kl.n = 0;
                mm = match_scores(g, ix, g->nodes[a].in[side], a, &scale, &kl);
                if (mm >= 0) mask = g->nodes[a].in[1 - side];
            }
            if (mm < 0 || !is_f32(g, mask) || !broadcasts_to(g, ix, mask, sm->in[0])) return 0;
            kl_add(&kl, a);
            mask_kind = 1;
        } else if (w >= 0) {
            /* Where(keep, scores, c) = scores + Where(keep, 0, c) for c <=
             * -1e30 or -inf (scores + c rounds to c) and the other way
             * round for Where(drop, c, scores): an additive mask */
            const tb_node *wn = &g->nodes[w];
            double c;
            for (int side = 1; side <= 2 && mm < 0; side++) {
                int cv = wn->in[3 - side];
                if (!tb_opt_const_scalar(g, cv, 4, &c) || !(c <= -1e30) || g->values[cv].dtype != TB_F32) continue;
                kl.n = 0;
                mm = match_scores(g, ix, wn->in[side], w, &scale, &kl);
                if (mm >= 0) { where_c = cv; where_scores_first = side == 1; }
            }
            if (mm < 0 || g->values[wn->in[0]].dtype != TB_BOOL || !broadcasts_to(g, ix, wn->in[0], sm->in[0])) return 0;
            where = w;
            kl_add(&kl, w);
            mask_kind = 1;
        } else {
            return 0;
        }
    }
    kl_add(&kl, k);
    int pv = reader_op(g, ix, sm->out[0], TB_OP_NN_MATMUL);
    if (pv < 0 || !matmul_plain(&g->nodes[pv]) || g->nodes[pv].in[0] != sm->out[0]) return 0;
    int q = g->nodes[mm].in[0], kt = g->nodes[mm].in[1], v = g->nodes[pv].in[1], y = g->nodes[pv].out[0];
    int k_trans = 1, kk = kt;
    int t = tb_opt_producer_op(g, ix, kt, TB_OP_TRANSPOSE);
    if (t >= 0) {
        const tb_node *tn = &g->nodes[t];
        if (tn->i[0] == 0 && tn->i[1] == 1 && tn->i[2] == 3 && tn->i[3] == 2) { kk = tn->in[0]; k_trans = 0; }
    }
    /* a scale on q alone (q * c) joins the scale */
    int qs = prod_only(g, ix, q, TB_OP_MUL, mm);
    if (qs >= 0) {
        for (int side = 0; side < 2; side++) {
            double c;
            int other = g->nodes[qs].in[1 - side];
            if (g->values[other].rank == 4 && tb_opt_const_scalar(g, g->nodes[qs].in[side], 4, &c) && isfinite(c) &&
                c != 0) {
                scale *= c;
                q = other;
                kl_add(&kl, qs);
                break;
            }
        }
    }
    if (g->values[q].rank != 4 || g->values[kk].rank != 4 || g->values[v].rank != 4 || !is_f32(g, q) ||
        !is_f32(g, kk) || !is_f32(g, v))
        return 0;

    int zero = -1;
    if (where >= 0) {
        float *z = malloc(sizeof *z);
        if (!z) return 0;
        *z = 0;
        char name[TB_NAME_LEN];
        snprintf(name, sizeof name, "%s.zero", g->values[y].name);
        zero = tb_opt_add_weight_f32(g, name, 0, NULL, z);
        if (zero < 0) { tb_error_clear(); return 0; }
    }
    tb_node c;
    memset(&c, 0, sizeof c);
    c.op = TB_OP_SDPA;
    c.in[0] = q;
    c.in[1] = kk;
    c.in[2] = v;
    c.n_in = 3;
    c.i[1] = k_trans;
    c.i[2] = mask_kind;
    c.f[0] = (float)scale;
    c.n_out = 1;
    c.out[0] = y;
    if (mask >= 0) c.in[c.n_in++] = mask;
    if (where >= 0) {
        /* the mask value: a node placed where the Where was */
        const tb_node *wn = &g->nodes[where];
        int win[3] = {wn->in[0], where_scores_first ? zero : where_c, where_scores_first ? where_c : zero};
        char name[TB_NAME_LEN];
        snprintf(name, sizeof name, "%s.mask", g->values[y].name);
        const char *nm = name;
        c.in[c.n_in++] = g->n_values; /* the value the node below adds */
        int pos = tb_opt_insert_node(g, where, TB_OP_WHERE, win, 3, &nm, 1, NULL, NULL);
        if (pos < 0) { tb_error_clear(); return 0; }
        for (int i = 0; i < kl.n; i++)
            if (kl.k[i] >= pos) kl.k[i]++;
        if (pv >= pos) pv++;
        if (!tb_opt_node_fits(g, &c, y)) {
            /* undo the insertion exactly: the node and its value (the last one) */
            memmove(&g->nodes[pos], &g->nodes[pos + 1], (size_t)(g->n_nodes - pos - 1) * sizeof *g->nodes);
            g->n_nodes--;
            g->n_values--;
            return 0;
        }
    } else if (!tb_opt_node_fits(g, &c, y)) {
        return 0;
    }
    tb_opt_place(g, pv, &c, y);
    kl_apply(g, &kl, pv);
    return 1;
}

/* ---------------------------------------------------------------- passes */

typedef int (*fuse_at_fn)(tb_graph *g, const tb_opt_index *ix, int k);

static tb_status run_fuse(tb_graph *g, fuse_at_fn fn, int *count) {
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    *count = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        if (tb_opt_dead(&g->nodes[k])) continue;
        int before = g->n_nodes, done = fn(g, &ix, k);
        *count += done;
        if (!done && g->n_nodes == before) continue; /* a failed attempt may have inserted a node */
        tb_opt_index_free(&ix);
        TB_TRY(tb_opt_index_build(g, &ix));
    }
    tb_opt_index_free(&ix);
    return TB_OK;
}

tb_status tb_opt_fuse_layernorm(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    TB_TRY(run_fuse(g, fuse_layernorm_at, &r->changes));
    snprintf(r->what, sizeof r->what, "fused %d LayerNormalization patterns", r->changes);
    return TB_OK;
}

tb_status tb_opt_fuse_gelu(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    TB_TRY(run_fuse(g, fuse_gelu_at, &r->changes));
    snprintf(r->what, sizeof r->what, "fused %d GELU patterns", r->changes);
    return TB_OK;
}

tb_status tb_opt_fuse_attention(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    TB_TRY(run_fuse(g, fuse_attention_at, &r->changes));
    snprintf(r->what, sizeof r->what, "fused %d attention patterns into sdpa", r->changes);
    return TB_OK;
}
