/* interp.c — the reference interpreter (interp.h). */
#include "ir/interp.h"

struct tb_interp_host {
    void **blocks;
    int n, cap;
};

void tb_interp_free_host(tb_interp_host *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++) free(h->blocks[i]);
    free(h->blocks);
    free(h);
}

static void *host_alloc(tb_interp_host *h, size_t bytes) {
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 16;
        void **b = realloc(h->blocks, (size_t)cap * sizeof *b);
        if (!b) return NULL;
        h->blocks = b;
        h->cap = cap;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (p) h->blocks[h->n++] = p;
    return p;
}

tb_status tb_view_bytes(const tb_view *v, uint64_t *out) {
    for (int d = 0; d < v->rank; d++)
        if (v->dims[d] < 0) return tb_errorf(TB_ERR_FORMAT, "a dim is unknown (%lld)", (long long)v->dims[d]);
    if (v->rank == 0) {
        *out = tb_dtype_size(v->dtype);
        return TB_OK;
    }
    return tb_dtype_tensor_bytes(v->dtype, v->rank, v->dims, out);
}

void tb_interp_host_values(const tb_graph *g, uint8_t *need) {
    memset(need, 0, (size_t)g->n_values);
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        const tb_op_def *d = tb_op_get_def(n->op);
        if (!d) continue;
        for (int i = 0; i < n->n_in; i++)
            if (d->host_inputs & (1u << i)) need[n->in[i]] = 1;
    }
    /* backwards: a value computed on the host needs its node's inputs there
     * too, except Shape, which reads only dims */
    for (int k = g->n_nodes - 1; k >= 0; k--) {
        const tb_node *n = &g->nodes[k];
        int any = 0;
        for (int o = 0; o < n->n_out; o++) any |= need[n->out[o]];
        if (!any || n->op == TB_OP_SHAPE) continue;
        for (int i = 0; i < n->n_in; i++) need[n->in[i]] = 1;
    }
}

/* Whether a computed shape agrees with the graph's value (symbols bound). */
static int shape_agrees(const tb_graph *g, const tb_value *v, const int64_t *sym, const tb_view *w) {
    if (v->rank != w->rank || v->dtype != w->dtype) return 0;
    for (int d = 0; d < v->rank; d++) {
        int64_t want = v->dims[d];
        if (want == TB_DIM_DYN) continue;
        if (TB_IS_SYM(want)) {
            int s = TB_SYM_INDEX(want);
            if (s >= g->n_syms || sym[s] < 0) continue; /* a symbol no input binds: dynamic */
            want = sym[s];
        }
        if (want != w->dims[d]) return 0;
    }
    return 1;
}

static void shape_str(const tb_view *v, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < v->rank && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)v->dims[d]);
    if (n < cap) snprintf(buf + n, cap - n, ") %s", tb_dtype_name(v->dtype));
}

tb_status tb_interp_shapes(const tb_graph *g, const tb_view *inputs, int n_in, tb_view *views,
                           tb_interp_host **host_out) {
    *host_out = NULL;
    if (n_in != g->n_inputs)
        return tb_errorf(TB_ERR_INVALID_ARG, "the graph takes %d inputs, %d given", g->n_inputs, n_in);
    int64_t sym[TB_MAX_SYMS];
    for (int s = 0; s < TB_MAX_SYMS; s++) sym[s] = -1;
    for (int v = 0; v < g->n_values; v++) tb_value_view(g, v, &views[v]);
    for (int i = 0; i < n_in; i++) {
        const tb_value *v = &g->values[g->inputs[i]];
        const tb_view *x = &inputs[i];
        if (x->dtype != v->dtype || x->rank != v->rank)
            return tb_errorf(TB_ERR_INVALID_ARG, "input %s: want %s of rank %d, got %s of rank %d", v->name,
                             tb_dtype_name(v->dtype), v->rank, tb_dtype_name(x->dtype), x->rank);
        for (int d = 0; d < v->rank; d++) {
            int64_t want = v->dims[d], got = x->dims[d];
            if (got < 0) return tb_errorf(TB_ERR_INVALID_ARG, "input %s: dim %d is negative", v->name, d);
            if (TB_IS_SYM(want)) {
                int s = TB_SYM_INDEX(want);
                if (sym[s] >= 0 && sym[s] != got)
                    return tb_errorf(TB_ERR_INVALID_ARG, "input %s: dim %d (%s) is %lld, but another input has %lld",
                                     v->name, d, g->syms[s].name, (long long)got, (long long)sym[s]);
                sym[s] = got;
            } else if (want != TB_DIM_DYN && want != got) {
                return tb_errorf(TB_ERR_INVALID_ARG, "input %s: dim %d must be %lld, got %lld", v->name, d,
                                 (long long)want, (long long)got);
            }
        }
        views[g->inputs[i]] = *x;
    }
    uint8_t *need = malloc((size_t)g->n_values + 1);
    tb_interp_host *h = calloc(1, sizeof *h);
    if (!need || !h) {
        free(need);
        free(h);
        return tb_errorf(TB_ERR_OOM, "out of memory computing shapes");
    }
    tb_interp_host_values(g, need);
    tb_status st = TB_OK;
    for (int k = 0; k < g->n_nodes && st == TB_OK; k++) {
        const tb_node *n = &g->nodes[k];
        tb_view in[TB_MAX_INPUTS];
        for (int i = 0; i < n->n_in; i++) in[i] = views[n->in[i]];
        tb_op_shape sh;
        const tb_op_def *d = tb_op_get_def(n->op);
        if (!d || !d->infer) {
            st = tb_errorf(TB_ERR_UNSUPPORTED, "node %d: op %s is not a general op", k, tb_op_name(n->op));
            break;
        }
        st = tb_op_infer_views(n, in, n->n_in, &sh);
        if (st != TB_OK) {
            tb_error_prefix(st, "node %d (%s, output %s)", k, d->name, g->values[n->out[0]].name);
            break;
        }
        if (sh.n_out != n->n_out) {
            st = tb_errorf(TB_ERR_FORMAT, "node %d (%s): %d outputs, the graph has %d", k, d->name, sh.n_out,
                           n->n_out);
            break;
        }
        int host = 0;
        tb_view out[TB_MAX_OUTPUTS];
        for (int o = 0; o < n->n_out; o++) {
            tb_view *w = &out[o];
            memset(w, 0, sizeof *w);
            w->dtype = sh.dtype[o];
            w->rank = sh.rank[o];
            memcpy(w->dims, sh.dims[o], sizeof w->dims);
            const tb_value *v = &g->values[n->out[o]];
            for (int dd = 0; dd < w->rank; dd++)
                if (w->dims[dd] < 0) {
                    st = tb_errorf(TB_ERR_FORMAT, "node %d (%s): output %s has an unknown dim with all inputs known", k,
                                   d->name, v->name);
                    break;
                }
            if (st != TB_OK) break;
            if (!shape_agrees(g, v, sym, w)) {
                char a[160], b[160];
                shape_str(w, a, sizeof a);
                tb_value_shape_str(g, v, b, sizeof b);
                st = tb_errorf(TB_ERR_FORMAT, "node %d (%s): output %s is %s here, the graph says %s %s", k, d->name,
                               v->name, a, b, tb_dtype_name(v->dtype));
                break;
            }
            host |= need[n->out[o]];
        }
        if (st != TB_OK) break;
        if (host) { /* a value some shape rule reads: compute it now */
            for (int i = 0; i < n->n_in && st == TB_OK; i++)
                if (!in[i].data && n->op != TB_OP_SHAPE)
                    st = tb_errorf(TB_ERR_INTERNAL, "node %d (%s): input %d is not on the host", k, d->name, i);
            for (int o = 0; o < n->n_out && st == TB_OK; o++) {
                uint64_t bytes;
                st = tb_view_bytes(&out[o], &bytes);
                if (st == TB_OK && !(out[o].data = host_alloc(h, (size_t)bytes)))
                    st = tb_errorf(TB_ERR_OOM, "out of memory computing shapes");
            }
            if (st == TB_OK) st = d->ref(n, in, n->n_in, out, n->n_out);
            if (st != TB_OK) tb_error_prefix(st, "node %d (%s)", k, d->name);
        }
        for (int o = 0; o < n->n_out; o++) views[n->out[o]] = out[o];
    }
    free(need);
    if (st != TB_OK) {
        tb_interp_free_host(h);
        return st;
    }
    *host_out = h;
    return TB_OK;
}

tb_status tb_interp_run(const tb_graph *g, const tb_view *inputs, int n_in, tb_view *outputs, int n_out) {
    if (n_out != g->n_outputs)
        return tb_errorf(TB_ERR_INVALID_ARG, "the graph has %d outputs, %d wanted", g->n_outputs, n_out);
    tb_view *views = calloc((size_t)g->n_values + 1, sizeof *views);
    void **owned = calloc((size_t)g->n_values + 1, sizeof *owned);
    if (!views || !owned) {
        free(views);
        free(owned);
        return tb_errorf(TB_ERR_OOM, "out of memory");
    }
    tb_interp_host *h = NULL;
    tb_status st = tb_interp_shapes(g, inputs, n_in, views, &h);
    for (int k = 0; k < g->n_nodes && st == TB_OK; k++) {
        const tb_node *n = &g->nodes[k];
        if (views[n->out[0]].data) continue; /* computed on the host already */
        for (int o = 0; o < n->n_out && st == TB_OK; o++) {
            uint64_t bytes;
            st = tb_view_bytes(&views[n->out[o]], &bytes);
            if (st == TB_OK && !(owned[n->out[o]] = views[n->out[o]].data = calloc(1, bytes ? (size_t)bytes : 1)))
                st = tb_errorf(TB_ERR_OOM, "out of memory for %s", g->values[n->out[o]].name);
        }
        if (st != TB_OK) break;
        tb_view in[TB_MAX_INPUTS], out[TB_MAX_OUTPUTS];
        for (int i = 0; i < n->n_in; i++) in[i] = views[n->in[i]];
        for (int o = 0; o < n->n_out; o++) out[o] = views[n->out[o]];
        st = tb_op_get_def(n->op)->ref(n, in, n->n_in, out, n->n_out);
        if (st != TB_OK) tb_error_prefix(st, "node %d (%s)", k, tb_op_name(n->op));
    }
    for (int i = 0; i < n_out; i++) memset(&outputs[i], 0, sizeof outputs[i]);
    for (int i = 0; i < n_out && st == TB_OK; i++) {
        const tb_view *v = &views[g->outputs[i]];
        uint64_t bytes;
        st = tb_view_bytes(v, &bytes);
        if (st != TB_OK) break;
        outputs[i] = *v;
        outputs[i].data = malloc(bytes ? (size_t)bytes : 1);
        if (!outputs[i].data) { st = tb_errorf(TB_ERR_OOM, "out of memory"); break; }
        if (bytes) memcpy(outputs[i].data, v->data, (size_t)bytes);
    }
    if (st != TB_OK) tb_interp_free_outputs(outputs, n_out);
    for (int v = 0; v < g->n_values; v++) free(owned[v]);
    free(owned);
    free(views);
    tb_interp_free_host(h);
    return st;
}

void tb_interp_free_outputs(tb_view *outputs, int n_out) {
    for (int i = 0; i < n_out; i++) {
        free(outputs[i].data);
        outputs[i].data = NULL;
    }
}
