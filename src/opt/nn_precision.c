/*
 * nn_precision.c — the f16 pass (opt.h, run only for tb_opt_options.dtype
 * f16): the graph's float math moves from f32 to f16.
 *
 *   - f32 weights that device kernels read become f16 (rounded to nearest,
 *     finite values saturated to +-65504 so that a mask constant such as
 *     -3.4e38 stays a large finite number and 0 * it stays 0);
 *   - f32 activations become f16 (a Cast to f32 casts to f16 instead);
 *   - values some shape rule reads (host inputs and what computes them:
 *     shapes, axes, Range bounds, scales) keep their dtype, as do integer
 *     and bool values;
 *   - graph inputs and outputs keep the model's dtypes: an f32 input is
 *     read through a Cast to f16 inserted after it, an output computed in
 *     f16 is cast back by a Cast inserted before it, which takes the
 *     output's name (the f16 value is renamed NAME/f16).
 * Where an op's rule does not produce what the plan says (an op whose
 * output stays f32 for f32 host inputs, a weight needed both on the host
 * and by a kernel) the pass inserts a Cast, or an f16 copy of the weight,
 * and checks every node's rule again; a node it cannot make consistent is
 * refused naming it.
 */
#include <math.h>

#include "ir/interp.h"
#include "opt/opt.h"

/* ---------------------------------------------------------------- helpers */

static uint16_t f16_saturated(float x) {
    if (isfinite(x) && fabsf(x) > 65504.0f) x = x > 0 ? 65504.0f : -65504.0f;
    return tb_f32_to_f16(x);
}

/* An f16 copy of f32 weight v's data (malloc'd), or NULL. */
static uint16_t *weight_f16_data(const tb_value *v) {
    uint64_t n = v->nbytes / sizeof(float);
    uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    if (!h) return NULL;
    const float *f = v->data;
    for (uint64_t i = 0; i < n; i++) h[i] = f16_saturated(f[i]);
    return h;
}

/* Converts weight v to f16 in place (its data replaced). */
static tb_status weight_to_f16(tb_graph *g, int v) {
    tb_value *x = &g->values[v];
    uint16_t *h = weight_f16_data(x);
    if (!h) return tb_errorf(TB_ERR_OOM, "out of memory converting %s to f16", x->name);
    if (x->owned) free((void *)x->data);
    x->data = h;
    x->owned = 1;
    x->nbytes = x->nbytes / 2;
    x->dtype = TB_F16;
    return TB_OK;
}

/* A name for a companion of value v ("NAME/f16"), unique in g. */
static void companion_name(const tb_graph *g, int v, const char *suffix, char *out) {
    snprintf(out, TB_NAME_LEN, "%.80s%s", g->values[v].name, suffix);
    for (int i = 2; tb_graph_find_value(g, out) >= 0 && i < 1000; i++)
        snprintf(out, TB_NAME_LEN, "%.76s%s%d", g->values[v].name, suffix, i);
}

/* Inserts Cast(src -> to) at node position pos; returns its output value,
 * or -1. */
static int insert_cast(tb_graph *g, int pos, int src, tb_dtype to, const char *name) {
    int32_t ia[TB_NODE_INTS] = {0};
    ia[0] = (int32_t)to;
    const char *nm = name;
    int k = tb_opt_insert_node(g, pos, TB_OP_CAST, &src, 1, &nm, 1, ia, NULL);
    return k < 0 ? -1 : g->nodes[k].out[0];
}

/* Whether node k's rule accepts its inputs and gives each output the dtype
 * its value has. Clears the message of a rejection. */
static int node_consistent(const tb_graph *g, const tb_node *n, tb_op_shape *sh, int *rule_ok) {
    *rule_ok = tb_op_infer(g, n, sh) == TB_OK;
    if (!*rule_ok) { tb_error_clear(); return 0; }
    if (sh->n_out != n->n_out) return 0;
    for (int o = 0; o < n->n_out; o++)
        if (sh->dtype[o] != g->values[n->out[o]].dtype) return 0;
    return 1;
}

typedef struct {
    int *as16;      /* per value (original numbering): its f16 stand-in, or -1 */
    int n_orig;
    int casts, copies;
} prec_state;

/* The f16 stand-in of f32 value v for kernels: an f16 copy of a weight, or
 * a Cast inserted at *pos (which then moves past it). -1 on failure. */
static int stand_in_f16(tb_graph *g, prec_state *st, int v, int *pos) {
    if (v < st->n_orig && st->as16[v] >= 0) return st->as16[v];
    char name[TB_NAME_LEN];
    companion_name(g, v, "/f16", name);
    int w;
    if (g->values[v].kind == TB_VAL_WEIGHT) {
        uint16_t *h = weight_f16_data(&g->values[v]);
        if (!h) { tb_errorf(TB_ERR_OOM, "out of memory converting %s to f16", g->values[v].name); return -1; }
        tb_value x = g->values[v];
        w = tb_graph_add_weight(g, name, TB_F16, x.rank, x.dims, h, 1);
        st->copies++;
    } else {
        w = insert_cast(g, *pos, v, TB_F16, name);
        if (w >= 0) (*pos)++;
        st->casts++;
    }
    if (w >= 0 && v < st->n_orig) st->as16[v] = w;
    return w;
}

/* Makes node *k consistent after the dtype changes; *k moves past any Cast
 * inserted before or after it. */
static tb_status fix_node(tb_graph *g, prec_state *st, int *k) {
    tb_node *n = &g->nodes[*k];
    if (n->op == TB_OP_CAST && n->i[0] == TB_F32 && g->values[n->out[0]].dtype == TB_F16) n->i[0] = TB_F16;
    tb_op_shape sh;
    int rule_ok;
    if (node_consistent(g, n, &sh, &rule_ok)) return TB_OK;
    /* inputs: f32 values kernels read, given their f16 stand-ins */
    const tb_op_def *d = tb_op_get_def(n->op);
    tb_node cand = *n; /* n moves when Casts go in before it */
    int any16 = 0, changed = 0, pos = *k;
    for (int i = 0; i < cand.n_in; i++) any16 |= g->values[cand.in[i]].dtype == TB_F16;
    for (int o = 0; o < cand.n_out; o++) any16 |= g->values[cand.out[o]].dtype == TB_F16;
    for (int i = 0; any16 && i < cand.n_in; i++) {
        if ((d && (d->host_inputs & (1u << i))) || g->values[cand.in[i]].dtype != TB_F32) continue;
        int w = stand_in_f16(g, st, cand.in[i], &pos);
        if (w < 0) return tb_error_prefix(tb_last_status(), "f16: node %d", *k);
        cand.in[i] = w;
        changed = 1;
    }
    *k = pos; /* the node, after the Casts inserted before it */
    if (changed) {
        tb_node save = g->nodes[pos];
        g->nodes[pos] = cand;
        if (node_consistent(g, &g->nodes[pos], &sh, &rule_ok)) return TB_OK;
        if (!rule_ok) { /* the stand-ins did not help: the original inputs (the Casts go unread) */
            g->nodes[pos] = save;
            node_consistent(g, &g->nodes[pos], &sh, &rule_ok);
        }
    }
    n = &g->nodes[*k];
    /* outputs: the rule keeps f32 where the plan wants f16: write f32 and
     * cast after */
    if (rule_ok && sh.n_out == n->n_out) {
        for (int o = 0; o < n->n_out; o++) {
            int v = n->out[o];
            if (!(sh.dtype[o] == TB_F32 && g->values[v].dtype == TB_F16)) continue;
            char name[TB_NAME_LEN];
            companion_name(g, v, "/f32", name);
            tb_value x = g->values[v];
            int t = tb_graph_add_value(g, name, TB_VAL_ACT, TB_F32, x.rank, x.dims);
            if (t < 0) return tb_last_status();
            g->nodes[*k].out[o] = t;
            int c = insert_cast(g, *k + 1, t, TB_F16, "?");
            if (c < 0) return tb_error_prefix(tb_last_status(), "f16: node %d", *k);
            g->nodes[*k + 1].out[0] = v; /* the Cast writes the planned value; its own is left unread */
            st->casts++;
        }
        n = &g->nodes[*k];
        if (node_consistent(g, n, &sh, &rule_ok)) {
            while (*k + 1 < g->n_nodes && g->nodes[*k + 1].op == TB_OP_CAST && g->nodes[*k + 1].n_in == 1) {
                /* step over the Casts just inserted after the node */
                int src = g->nodes[*k + 1].in[0], mine = 0;
                for (int o = 0; o < n->n_out; o++) mine |= n->out[o] == src;
                if (!mine) break;
                (*k)++;
            }
            return TB_OK;
        }
    }
    char why[512] = "";
    if (!rule_ok && tb_op_infer(g, n, &sh) != TB_OK) snprintf(why, sizeof why, ": %s", tb_last_error());
    return tb_errorf(TB_ERR_UNSUPPORTED, "f16: node %d (%s, output %s) cannot run in f16%s", *k, tb_op_name(n->op),
                     g->values[n->out[0]].name, why);
}

/* ---------------------------------------------------------------- the pass */

tb_status tb_opt_precision(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    if (!o || o->dtype != TB_F16) return TB_OK;
    int nv = g->n_values;
    uint8_t *need = calloc((size_t)nv + 1, 1), *read = calloc((size_t)nv + 1, 1);
    prec_state st = {calloc((size_t)nv + 1, sizeof(int)), nv, 0, 0};
    tb_dtype out_dt[TB_MAX_IO];
    tb_status s = TB_OK;
    if (!need || !read || !st.as16) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    for (int v = 0; v < nv; v++) st.as16[v] = -1;
    tb_interp_host_values(g, need);
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        const tb_op_def *d = tb_op_get_def(n->op);
        for (int i = 0; i < n->n_in; i++)
            if (!(d && (d->host_inputs & (1u << i)))) read[n->in[i]] = 1;
    }
    for (int i = 0; i < g->n_outputs; i++) out_dt[i] = g->values[g->outputs[i]].dtype;
    /* the plan: f32 weights kernels read and f32 activations become f16 */
    int n_w = 0, n_act = 0;
    for (int v = 0; v < nv; v++) {
        tb_value *x = &g->values[v];
        if (x->dtype != TB_F32 || need[v]) continue;
        if (x->kind == TB_VAL_WEIGHT && read[v] && x->data) {
            if ((s = weight_to_f16(g, v)) != TB_OK) goto done;
            n_w++;
        } else if (x->kind == TB_VAL_ACT) {
            x->dtype = TB_F16;
            n_act++;
        }
    }
    /* f32 inputs: read through a Cast */
    int n_in_cast = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        int v = g->inputs[i];
        if (g->values[v].dtype != TB_F32 || need[v] || !read[v]) continue;
        char name[TB_NAME_LEN];
        companion_name(g, v, "/f16", name);
        int c = insert_cast(g, 0, v, TB_F16, name);
        if (c < 0) { s = tb_error_prefix(tb_last_status(), "f16: input %s", g->values[v].name); goto done; }
        for (int k = 1; k < g->n_nodes; k++)
            for (int j = 0; j < g->nodes[k].n_in; j++)
                if (g->nodes[k].in[j] == v) g->nodes[k].in[j] = c;
        st.as16[v] = c;
        n_in_cast++;
    }
    /* every node again, in order */
    for (int k = 0; k < g->n_nodes; k++)
        if (!tb_opt_dead(&g->nodes[k]) && (s = fix_node(g, &st, &k)) != TB_OK) goto done;
    /* outputs: their declared dtypes, under their names */
    int n_out_cast = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        if (g->values[v].dtype == out_dt[i]) continue;
        char orig[TB_NAME_LEN], renamed[TB_NAME_LEN];
        snprintf(orig, sizeof orig, "%s", g->values[v].name);
        companion_name(g, v, "/f16", renamed);
        snprintf(g->values[v].name, sizeof g->values[v].name, "%s", renamed);
        int c = insert_cast(g, g->n_nodes, v, out_dt[i], orig);
        if (c < 0) { s = tb_error_prefix(tb_last_status(), "f16: output %s", orig); goto done; }
        for (int j = i; j < g->n_outputs; j++)
            if (g->outputs[j] == v && out_dt[j] == out_dt[i]) g->outputs[j] = c;
        n_out_cast++;
    }
    r->changes = n_w + n_act + n_in_cast + n_out_cast + st.casts + st.copies;
    snprintf(r->what, sizeof r->what,
             "%d weights and %d activations to f16; Casts: %d after inputs, %d before outputs, %d inside; %d f16 "
             "copies of weights also read on the host",
             n_w, n_act, n_in_cast, n_out_cast, st.casts, st.copies);
done:
    free(need);
    free(read);
    free(st.as16);
    return s;
}
