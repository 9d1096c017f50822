/* graph_edit.c — the editing helpers passes share (opt.h). */
#include <stdlib.h>
#include <string.h>

#include "opt/opt.h"

int tb_opt_producer(const tb_graph *g, int v) {
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        for (int o = 0; o < n->n_out; o++)
            if (n->out[o] == v) return k;
    }
    return -1;
}

int tb_opt_uses(const tb_graph *g, int v) {
    int u = g->output == v;
    for (int i = 0; i < g->n_outputs; i++) u += g->outputs[i] == v;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        for (int i = 0; i < n->n_in; i++) u += n->in[i] == v;
    }
    return u;
}

void tb_opt_replace_uses(tb_graph *g, int from, int to) {
    if (g->output == from) g->output = to;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == from) g->outputs[i] = to;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == from) n->in[i] = to;
    }
}

void tb_opt_kill(tb_graph *g, int k) { g->nodes[k].op = TB_OP_COUNT; }

int tb_opt_insert_node(tb_graph *g, int pos, tb_op_kind op, const int *in, int n_in,
                       const char *const *out_names, int n_names, const int32_t *iattr, const float *fattr) {
    int k = tb_graph_add_node_ex(g, op, in, n_in, out_names, n_names, iattr, fattr);
    if (k < 0) return -1;
    if (pos < 0 || pos > k) pos = k;
    tb_node nd = g->nodes[k];
    memmove(&g->nodes[pos + 1], &g->nodes[pos], (size_t)(k - pos) * sizeof nd);
    g->nodes[pos] = nd;
    return pos;
}

int tb_opt_compact(tb_graph *g) {
    int nv = g->n_values, removed = 0;
    uint8_t *need = calloc((size_t)nv + 1, 1);
    int *map = malloc(((size_t)nv + 1) * sizeof *map);
    if (!need || !map) { free(need); free(map); return 0; } /* nothing removed: still consistent */
    if (g->output >= 0 && g->output < nv) need[g->output] = 1;
    for (int i = 0; i < g->n_outputs; i++) need[g->outputs[i]] = 1;
    /* backwards: a node lives when something needed reads one of its outputs */
    for (int k = g->n_nodes - 1; k >= 0; k--) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        int live = 0;
        for (int o = 0; o < n->n_out; o++) live |= need[n->out[o]];
        if (!live) { tb_opt_kill(g, k); continue; }
        for (int i = 0; i < n->n_in; i++) need[n->in[i]] = 1;
        for (int o = 0; o < n->n_out; o++) need[n->out[o]] = 1;
    }
    int w = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        if (tb_opt_dead(&g->nodes[k])) { removed++; continue; }
        g->nodes[w++] = g->nodes[k];
    }
    g->n_nodes = w;
    /* values: keep inputs (bound by name), and whatever is needed */
    int nn = 0;
    for (int v = 0; v < nv; v++) {
        tb_value *x = &g->values[v];
        if (!need[v] && x->kind != TB_VAL_INPUT) {
            if (x->owned) free((void *)x->data);
            map[v] = -1;
            continue;
        }
        map[v] = nn;
        if (nn != v) g->values[nn] = *x;
        nn++;
    }
    g->n_values = nn;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        for (int i = 0; i < n->n_in; i++) n->in[i] = map[n->in[i]];
        for (int o = 0; o < n->n_out; o++) n->out[o] = map[n->out[o]];
    }
    if (g->output >= 0 && g->output < nv) g->output = map[g->output];
    for (int i = 0; i < g->n_inputs; i++) g->inputs[i] = map[g->inputs[i]];
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = map[g->outputs[i]];
    free(need);
    free(map);
    return removed;
}

/* Whether pass `name` is in TB_OPT_SKIP (comma-separated pass names): a
 * switch for comparing engines built with and without a pass. */
static int skipped(const char *name) {
    const char *e = getenv("TB_OPT_SKIP");
    size_t len = strlen(name);
    for (const char *p = e; p && *p;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l == len && !strncmp(p, name, len)) return 1;
        p = c ? c + 1 : NULL;
    }
    return 0;
}

tb_status tb_opt_run(tb_graph *g, const tb_pass *passes, int n, const tb_opt_options *o) {
    for (int i = 0; i < n; i++) {
        if (skipped(passes[i].name)) {
            if (o && o->verbose) tb_log(TB_LOG_INFO, "pass %-22s skipped (TB_OPT_SKIP)", passes[i].name);
            continue;
        }
        tb_pass_report r;
        memset(&r, 0, sizeof r);
        int before = g->n_nodes;
        double t0 = tb_now();
        tb_status s = passes[i].run(g, o, &r);
        if (s != TB_OK) return tb_error_prefix(s, "pass %s", passes[i].name);
        tb_opt_compact(g);
        s = tb_graph_check(g);
        if (s != TB_OK) return tb_error_prefix(s, "after pass %s", passes[i].name);
        if (o && o->verbose)
            tb_log(TB_LOG_INFO, "pass %-22s %4d -> %4d nodes  %.1f ms  %s", passes[i].name, before, g->n_nodes,
                   (tb_now() - t0) * 1e3, r.changes ? r.what : "no change");
    }
    return TB_OK;
}
