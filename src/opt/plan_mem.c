/* plan_mem.c — the activation memory plan (opt.h): liveness intervals over
 * the node order, then greedy placement by size into one arena, so values
 * whose lifetimes do not overlap share memory. */
#include "opt/opt.h"

typedef struct {
    int v;
    int first, last; /* live over nodes [first, last]  */
    uint64_t size;   /* aligned                        */
    uint64_t off;
} plan_item;

static int by_size_desc(const void *a, const void *b) {
    const plan_item *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    if (x->first != y->first) return x->first - y->first;
    return x->v - y->v;
}

static int by_offset(const void *a, const void *b) {
    const plan_item *x = *(const plan_item *const *)a, *y = *(const plan_item *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

tb_status tb_plan_memory(const tb_graph *g, const uint64_t *bytes, uint64_t *offsets, uint64_t *arena_bytes) {
    int nv = g->n_values, nn = g->n_nodes;
    *arena_bytes = 0;
    int *first = malloc(((size_t)nv + 1) * sizeof *first), *last = malloc(((size_t)nv + 1) * sizeof *last);
    plan_item *it = malloc(((size_t)nv + 1) * sizeof *it);
    plan_item **conf = malloc(((size_t)nv + 1) * sizeof *conf);
    if (!first || !last || !it || !conf) {
        free(first); free(last); free(it); free(conf);
        return tb_errorf(TB_ERR_OOM, "out of memory planning %d values", nv);
    }
    for (int v = 0; v < nv; v++) {
        first[v] = last[v] = -1;
        offsets[v] = UINT64_MAX;
    }
    for (int k = 0; k < nn; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        for (int o = 0; o < n->n_out; o++) { /* written at k, even when nothing reads it */
            int v = n->out[o];
            if (first[v] < 0) first[v] = k;
            if (last[v] < k) last[v] = k;
        }
        for (int i = 0; i < n->n_in; i++)
            if (last[n->in[i]] < k) last[n->in[i]] = k;
    }
    if (g->output >= 0 && g->output < nv) last[g->output] = nn;
    for (int i = 0; i < g->n_outputs; i++) last[g->outputs[i]] = nn;
    int m = 0;
    for (int v = 0; v < nv; v++) {
        if (!bytes[v]) continue;
        if (bytes[v] > UINT64_MAX / 2) {
            free(first); free(last); free(it); free(conf);
            return tb_errorf(TB_ERR_INVALID_ARG, "value %s: %llu bytes", g->values[v].name, (unsigned long long)bytes[v]);
        }
        plan_item *p = &it[m++];
        p->v = v;
        p->first = first[v] < 0 ? 0 : first[v]; /* not written by a node: live from the start */
        p->last = last[v] < p->first ? p->first : last[v];
        p->size = (bytes[v] + TB_PLAN_ALIGN - 1) / TB_PLAN_ALIGN * TB_PLAN_ALIGN;
        p->off = 0;
    }
    qsort(it, (size_t)m, sizeof *it, by_size_desc);
    uint64_t top = 0;
    for (int i = 0; i < m; i++) {
        plan_item *p = &it[i];
        int nc = 0;
        for (int j = 0; j < i; j++)
            if (it[j].first <= p->last && p->first <= it[j].last) conf[nc++] = &it[j];
        qsort(conf, (size_t)nc, sizeof *conf, by_offset);
        /* best fit: the smallest gap between conflicting values that holds p */
        uint64_t cur = 0, best = UINT64_MAX, best_off = 0;
        for (int j = 0; j < nc; j++) {
            if (conf[j]->off > cur) {
                uint64_t gap = conf[j]->off - cur;
                if (gap >= p->size && gap < best) { best = gap; best_off = cur; }
            }
            if (conf[j]->off + conf[j]->size > cur) cur = conf[j]->off + conf[j]->size;
        }
        p->off = best != UINT64_MAX ? best_off : cur;
        offsets[p->v] = p->off;
        if (p->off + p->size > top) top = p->off + p->size;
    }
    *arena_bytes = top;
    free(first); free(last); free(it); free(conf);
    return TB_OK;
}

tb_status tb_plan_memory_report(const tb_graph *g, const int64_t *symval, uint64_t *unplanned, uint64_t *planned,
                                int *n_dynamic) {
    int nv = g->n_values;
    *unplanned = *planned = 0;
    *n_dynamic = 0;
    uint64_t *bytes = calloc((size_t)nv + 1, sizeof *bytes), *off = malloc(((size_t)nv + 1) * sizeof *off);
    if (!bytes || !off) {
        free(bytes); free(off);
        return tb_errorf(TB_ERR_OOM, "out of memory planning %d values", nv);
    }
    for (int v = 0; v < nv; v++) {
        const tb_value *x = &g->values[v];
        int out = g->output == v;
        for (int i = 0; i < g->n_outputs; i++) out |= g->outputs[i] == v;
        if (x->kind != TB_VAL_ACT || out) continue;
        int dyn = 0;
        for (int i = 0; i < x->rank; i++) dyn |= x->dims[i] == TB_DIM_DYN;
        if (dyn) { (*n_dynamic)++; continue; }
        tb_status s = tb_value_bytes(g, x, symval, &bytes[v]);
        if (s != TB_OK) { free(bytes); free(off); return s; }
        *unplanned += (bytes[v] + TB_PLAN_ALIGN - 1) / TB_PLAN_ALIGN * TB_PLAN_ALIGN;
    }
    tb_status s = tb_plan_memory(g, bytes, off, planned);
    free(bytes);
    free(off);
    return s;
}

tb_status tb_opt_plan_memory_pass(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    uint64_t unplanned, planned;
    int dyn;
    TB_TRY(tb_plan_memory_report(g, NULL, &unplanned, &planned, &dyn));
    r->changes = 0; /* an account, not a rewrite */
    snprintf(r->what, sizeof r->what, "activations %.2f MiB without reuse, %.2f MiB planned arena at max shapes%s",
             unplanned / 1048576.0, planned / 1048576.0, dyn ? " (some sized only at run time)" : "");
    if (o && o->verbose) tb_log(TB_LOG_INFO, "memory plan: %s", r->what);
    return TB_OK;
}
