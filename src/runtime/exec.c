/*
 * exec.c — the executor of general engines (tb_exec, turbine.h).
 *
 * Per run: the input shapes are checked against the profile; when they
 * differ from the previous run's, every value's shape is computed again
 * (ir/interp.c: shape rules, shape tensors evaluated on the host) and the
 * activations are planned into one arena by liveness (first fit over the
 * values' lifetimes). The arena only grows, on a shape larger than any seen
 * before; runs of a seen shape allocate nothing. Then the backend runs the
 * nodes in order with the run's views (tb_step.views).
 */
#include "backend/backend.h"
#include "ir/interp.h"
#include "plan/engine.h"
#include "runtime/runtime.h"

struct tb_exec {
    tb_engine *engine;
    tb_graph *g;
    tb_backend *b;
    void **bufs;           /* per value: weights (backend's), inputs, arena slices, host values */
    tb_view *views;        /* per value, this shape's                      */
    uint64_t *offset;      /* per value: in the arena, or UINT64_MAX       */
    uint64_t *bytes;
    int *last_use;         /* per value: the last node reading it           */
    uint8_t *host_needed;  /* per value: some shape rule reads it          */
    int inputs_on_host;    /* a graph input is read by a shape rule: never cache shapes */
    tb_interp_host *host;
    void *arena;
    uint64_t arena_cap, arena_used;
    void *out_host[TB_MAX_IO]; /* device backends: outputs copied back */
    size_t out_cap[TB_MAX_IO];
    int have_shape;
    int64_t last_dims[TB_MAX_IO][TB_MAX_RANK];
    /* profiling */
    double h2d_seconds, d2h_seconds; /* copies, summed over runs */
    int profiling;
    double *node_seconds;  /* per node */
    int n_runs_profiled;
};

void tb_exec_options_default(tb_exec_options *o) { memset(o, 0, sizeof *o); }

int tb_engine_is_llm(const tb_engine *e) { return e->graph && e->graph->n_outputs == 0; }

int tb_exec_n_inputs(const tb_exec *x) { return x->g->n_inputs; }
int tb_exec_n_outputs(const tb_exec *x) { return x->g->n_outputs; }

static void io_info(const tb_graph *g, int v, tb_io_info *out) {
    const tb_value *x = &g->values[v];
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", x->name);
    out->dtype = x->dtype;
    out->rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        int64_t dim = x->dims[d];
        if (TB_IS_SYM(dim)) {
            const tb_symbol *s = &g->syms[TB_SYM_INDEX(dim)];
            out->min[d] = s->min, out->opt[d] = s->opt, out->max[d] = s->max;
        } else if (dim == TB_DIM_DYN) {
            out->min[d] = out->opt[d] = out->max[d] = -1;
        } else {
            out->min[d] = out->opt[d] = out->max[d] = dim;
        }
    }
}

tb_status tb_exec_input_info(const tb_exec *x, int i, tb_io_info *out) {
    if (i < 0 || i >= x->g->n_inputs) return tb_errorf(TB_ERR_INVALID_ARG, "no input %d", i);
    io_info(x->g, x->g->inputs[i], out);
    return TB_OK;
}

tb_status tb_exec_output_info(const tb_exec *x, int i, tb_io_info *out) {
    if (i < 0 || i >= x->g->n_outputs) return tb_errorf(TB_ERR_INVALID_ARG, "no output %d", i);
    io_info(x->g, x->g->outputs[i], out);
    return TB_OK;
}

void tb_exec_free(tb_exec *x) {
    if (!x) return;
    if (x->b) {
        if (x->arena) x->b->iface->free(x->b, x->arena);
        tb_backend_free(x->b);
    }
    tb_interp_free_host(x->host);
    for (int i = 0; i < TB_MAX_IO; i++) free(x->out_host[i]);
    free(x->bufs);
    free(x->views);
    free(x->offset);
    free(x->bytes);
    free(x->last_use);
    free(x->host_needed);
    free(x->node_seconds);
    free(x);
}

tb_status tb_exec_create(tb_engine *e, const tb_exec_options *o, tb_exec **out) {
    *out = NULL;
    if (tb_engine_is_llm(e))
        return tb_errorf(TB_ERR_INVALID_ARG, "this is an LLM engine: run it with a context (turbine run / serve)");
    tb_exec_options def;
    if (!o) { tb_exec_options_default(&def); o = &def; }
    tb_exec *x = calloc(1, sizeof *x);
    if (!x) return tb_errorf(TB_ERR_OOM, "out of memory");
    x->engine = e;
    x->g = e->graph;
    int nv = x->g->n_values, nn = x->g->n_nodes;
    x->bufs = calloc((size_t)nv + 1, sizeof *x->bufs);
    x->views = calloc((size_t)nv + 1, sizeof *x->views);
    x->offset = calloc((size_t)nv + 1, sizeof *x->offset);
    x->bytes = calloc((size_t)nv + 1, sizeof *x->bytes);
    x->last_use = calloc((size_t)nv + 1, sizeof *x->last_use);
    x->host_needed = calloc((size_t)nv + 1, 1);
    x->node_seconds = calloc((size_t)nn + 1, sizeof *x->node_seconds);
    tb_status s = TB_OK;
    if (!x->bufs || !x->views || !x->offset || !x->bytes || !x->last_use || !x->host_needed || !x->node_seconds) {
        s = tb_errorf(TB_ERR_OOM, "out of memory");
        goto fail;
    }
    const char *device = o->device && *o->device ? o->device : e->backend;
    if ((s = tb_backend_create(device, o->n_threads > 0 ? o->n_threads : tb_default_threads(), 0, &x->b)) != TB_OK)
        goto fail;
    for (int k = 0; k < nn; k++)
        if (!x->b->iface->supports_op(x->b, x->g, &x->g->nodes[k])) {
            s = tb_errorf(TB_ERR_UNSUPPORTED, "the %s backend cannot run node %d (%s, output %s)", x->b->iface->name, k,
                          tb_op_name(x->g->nodes[k].op), x->g->values[x->g->nodes[k].out[0]].name);
            goto fail;
        }
    if ((s = x->b->iface->load_weights(x->b, x->g, x->bufs)) != TB_OK) goto fail;
    tb_interp_host_values(x->g, x->host_needed);
    for (int i = 0; i < x->g->n_inputs; i++) x->inputs_on_host |= x->host_needed[x->g->inputs[i]];
    for (int v = 0; v < nv; v++) x->last_use[v] = -1;
    for (int k = 0; k < nn; k++)
        for (int i = 0; i < x->g->nodes[k].n_in; i++) x->last_use[x->g->nodes[k].in[i]] = k;
    for (int i = 0; i < x->g->n_outputs; i++) x->last_use[x->g->outputs[i]] = nn; /* live to the end */
    *out = x;
    return TB_OK;
fail:
    tb_exec_free(x);
    return s;
}

/* The profile: every symbol bound inside [min, max]. */
static tb_status check_profile(const tb_graph *g, const tb_tensor *in, int n_in) {
    for (int i = 0; i < n_in; i++) {
        const tb_value *v = &g->values[g->inputs[i]];
        if (in[i].rank != v->rank)
            return tb_errorf(TB_ERR_INVALID_ARG, "input %s: rank %d given, the engine takes rank %d", v->name,
                             in[i].rank, v->rank);
        for (int d = 0; d < v->rank; d++) {
            if (!TB_IS_SYM(v->dims[d])) continue;
            const tb_symbol *s = &g->syms[TB_SYM_INDEX(v->dims[d])];
            if (in[i].dims[d] < s->min || in[i].dims[d] > s->max)
                return tb_errorf(TB_ERR_RANGE,
                                 "input %s: dim %d (%s) is %lld, outside the engine's profile [%lld, %lld]; rebuild "
                                 "with --min-shapes/--max-shapes covering it",
                                 v->name, d, s->name, (long long)in[i].dims[d], (long long)s->min, (long long)s->max);
        }
    }
    return TB_OK;
}

/* Whether value v is read by some node as a kernel input (not only as a
 * host input of a shape rule). */
static int read_on_device(const tb_graph *g, int v) {
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return 1;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        const tb_op_def *d = tb_op_get_def(n->op);
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == v && !(d && (d->host_inputs & (1u << i))) && n->op != TB_OP_SHAPE) return 1;
    }
    return 0;
}

/* Shapes and the arena plan for the inputs' shapes. On a backend with its
 * own memory (upload != NULL) the inputs and the host-computed values its
 * kernels read live in the arena too. */
static tb_status plan(tb_exec *x, const tb_tensor *in, int n_in) {
    tb_graph *g = x->g;
    int device = x->b->iface->upload != NULL;
    tb_interp_free_host(x->host);
    x->host = NULL;
    x->have_shape = 0;
    tb_view iv[TB_MAX_IO];
    for (int i = 0; i < n_in; i++) {
        iv[i].dtype = in[i].dtype;
        iv[i].rank = in[i].rank;
        memcpy(iv[i].dims, in[i].dims, sizeof iv[i].dims);
        iv[i].data = in[i].data;
    }
    TB_TRY(tb_interp_shapes(g, iv, n_in, x->views, &x->host));
    int nv = g->n_values, nn = g->n_nodes;
    /* when each value is defined: inputs before node 0, activations at their node */
    int *def = malloc(((size_t)nv + 1) * sizeof *def);
    if (!def) return tb_errorf(TB_ERR_OOM, "out of memory planning");
    for (int v = 0; v < nv; v++) def[v] = -2;
    for (int i = 0; i < g->n_inputs; i++) def[g->inputs[i]] = -1;
    for (int k = 0; k < nn; k++)
        for (int o = 0; o < g->nodes[k].n_out; o++) def[g->nodes[k].out[o]] = k;
    for (int v = 0; v < nv; v++) {
        x->offset[v] = UINT64_MAX;
        x->bytes[v] = 0;
        int want;
        if (g->values[v].kind == TB_VAL_ACT)
            want = !x->views[v].data || (device && read_on_device(g, v));
        else
            want = device && g->values[v].kind == TB_VAL_INPUT;
        if (!want) continue;
        tb_status s = tb_view_bytes(&x->views[v], &x->bytes[v]);
        if (s != TB_OK) { free(def); return tb_error_prefix(s, "value %s", g->values[v].name); }
        x->bytes[v] = (x->bytes[v] + 63) / 64 * 64;
        if (!x->bytes[v]) x->bytes[v] = 64;
    }
    /* first fit in order of definition; a block frees after its last reader */
    typedef struct { uint64_t off, len; int v; } blk;
    blk *live = malloc(((size_t)nv + 1) * sizeof *live);
    if (!live) { free(def); return tb_errorf(TB_ERR_OOM, "out of memory planning"); }
    int n_live = 0;
    uint64_t top = 0;
    for (int k = -1; k < nn; k++) {
        for (int v = 0; v < nv; v++) {
            if (def[v] != k || !x->bytes[v]) continue;
            int w = 0;
            for (int j = 0; j < n_live; j++)
                if (x->last_use[live[j].v] >= k) live[w++] = live[j];
            n_live = w;
            for (int a = 1; a < n_live; a++)
                for (int b2 = a; b2 > 0 && live[b2 - 1].off > live[b2].off; b2--) {
                    blk t = live[b2]; live[b2] = live[b2 - 1]; live[b2 - 1] = t;
                }
            uint64_t at = 0;
            for (int j = 0; j < n_live; j++) {
                if (live[j].off >= at + x->bytes[v]) break;
                if (live[j].off + live[j].len > at) at = live[j].off + live[j].len;
            }
            x->offset[v] = at;
            live[n_live++] = (blk){at, x->bytes[v], v};
            if (at + x->bytes[v] > top) top = at + x->bytes[v];
        }
    }
    free(live);
    free(def);
    if (top > x->arena_cap) {
        if (x->arena) x->b->iface->free(x->b, x->arena);
        x->arena = x->b->iface->alloc(x->b, (size_t)top);
        x->arena_cap = x->arena ? top : 0;
        if (!x->arena) return tb_errorf(TB_ERR_OOM, "out of memory for %llu bytes of activations", (unsigned long long)top);
    }
    x->arena_used = top;
    for (int v = 0; v < nv; v++) {
        if (x->offset[v] != UINT64_MAX) x->bufs[v] = (uint8_t *)x->arena + x->offset[v];
        else if (g->values[v].kind == TB_VAL_ACT) x->bufs[v] = x->views[v].data; /* host-computed */
    }
    /* host-computed values the device's kernels read */
    for (int v = 0; v < nv && device; v++)
        if (g->values[v].kind == TB_VAL_ACT && x->views[v].data && x->offset[v] != UINT64_MAX) {
            uint64_t bytes;
            TB_TRY(tb_view_bytes(&x->views[v], &bytes));
            TB_TRY(x->b->iface->upload(x->b, x->bufs[v], x->views[v].data, (size_t)bytes));
        }
    for (int i = 0; i < n_in; i++) memcpy(x->last_dims[i], in[i].dims, sizeof x->last_dims[i]);
    x->have_shape = 1;
    return TB_OK;
}

tb_status tb_exec_run(tb_exec *x, const tb_tensor *inputs, int n_in, tb_tensor *outputs, int n_out) {
    tb_graph *g = x->g;
    if (n_in != g->n_inputs)
        return tb_errorf(TB_ERR_INVALID_ARG, "the engine takes %d inputs, %d given", g->n_inputs, n_in);
    if (n_out != g->n_outputs)
        return tb_errorf(TB_ERR_INVALID_ARG, "the engine has %d outputs, %d wanted", g->n_outputs, n_out);
    TB_TRY(check_profile(g, inputs, n_in));
    int same = x->have_shape && !x->inputs_on_host;
    for (int i = 0; same && i < n_in; i++)
        same = !memcmp(x->last_dims[i], inputs[i].dims, sizeof(int64_t) * (size_t)inputs[i].rank) &&
               x->views[g->inputs[i]].dtype == inputs[i].dtype;
    if (!same) TB_TRY(plan(x, inputs, n_in));
    int device = x->b->iface->upload != NULL;
    for (int i = 0; i < n_in; i++) {
        int v = g->inputs[i];
        if (inputs[i].dtype != g->values[v].dtype)
            return tb_errorf(TB_ERR_INVALID_ARG, "input %s: want %s, got %s", g->values[v].name,
                             tb_dtype_name(g->values[v].dtype), tb_dtype_name(inputs[i].dtype));
        x->views[v].data = inputs[i].data;
        if (!device) { x->bufs[v] = inputs[i].data; continue; }
        uint64_t bytes;
        TB_TRY(tb_view_bytes(&x->views[v], &bytes));
        double t0 = tb_now();
        TB_TRY(x->b->iface->upload(x->b, x->bufs[v], inputs[i].data, (size_t)bytes));
        x->h2d_seconds += tb_now() - t0;
    }
    tb_step st;
    memset(&st, 0, sizeof st);
    st.views = x->views;
    /* a backend may record the run (a CUDA graph) and replay it for a shape
     * it has seen; not while per-node times are taken */
    int hooks = x->b->iface->run_begin && x->b->iface->run_end && !x->profiling;
    if (hooks) TB_TRY(x->b->iface->run_begin(x->b, g, x->bufs, &st));
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (x->views[n->out[0]].data) continue; /* computed on the host while planning */
        double t0 = x->profiling ? tb_now() : 0;
        tb_status s = x->b->iface->run_node(x->b, g, n, x->bufs, &st);
        if (s != TB_OK)
            return tb_error_prefix(s, "node %d (%s, output %s)", k, tb_op_name(n->op), g->values[n->out[0]].name);
        if (x->profiling) {
            /* a device runs asynchronously: wait for the node (a copy of
             * nothing synchronises the backend's stream) */
            if (device && (s = x->b->iface->download(x->b, NULL, NULL, 0)) != TB_OK) return s;
            x->node_seconds[k] += tb_now() - t0;
        }
    }
    if (hooks) TB_TRY(x->b->iface->run_end(x->b, g, x->bufs, &st));
    if (x->profiling) x->n_runs_profiled++;
    for (int i = 0; i < n_out; i++) {
        int v = g->outputs[i];
        const tb_view *w = &x->views[v];
        outputs[i].dtype = w->dtype;
        outputs[i].rank = w->rank;
        memcpy(outputs[i].dims, w->dims, sizeof outputs[i].dims);
        outputs[i].data = x->bufs[v];
        if (!device || g->values[v].kind == TB_VAL_WEIGHT) {
            if (g->values[v].kind == TB_VAL_WEIGHT) outputs[i].data = (void *)g->values[v].data;
            continue;
        }
        uint64_t bytes;
        TB_TRY(tb_view_bytes(w, &bytes));
        if (bytes > x->out_cap[i]) {
            void *p = realloc(x->out_host[i], (size_t)bytes);
            if (!p) return tb_errorf(TB_ERR_OOM, "out of memory for output %s", g->values[v].name);
            x->out_host[i] = p;
            x->out_cap[i] = (size_t)bytes;
        }
        double t0 = tb_now();
        TB_TRY(x->b->iface->download(x->b, x->out_host[i], x->bufs[v], (size_t)bytes));
        x->d2h_seconds += tb_now() - t0;
        outputs[i].data = x->out_host[i];
    }
    return TB_OK;
}

tb_status tb_exec_set_profiling(tb_exec *x, int on) {
    x->profiling = on;
    x->n_runs_profiled = 0;
    memset(x->node_seconds, 0, (size_t)x->g->n_nodes * sizeof *x->node_seconds);
    return TB_OK;
}

int tb_exec_profile(const tb_exec *x, tb_exec_node_time *out, int cap) {
    int n = 0;
    for (int k = 0; k < x->g->n_nodes && n < cap; k++) {
        const tb_node *nd = &x->g->nodes[k];
        out[n].node = k;
        out[n].op = tb_op_name(nd->op);
        out[n].output = x->g->values[nd->out[0]].name;
        out[n].seconds = x->n_runs_profiled ? x->node_seconds[k] / x->n_runs_profiled : 0;
        n++;
    }
    return n;
}

const tb_graph *tb_exec_graph(const tb_exec *x) { return x->g; }

void tb_exec_copy_seconds(const tb_exec *x, double *h2d, double *d2h) {
    *h2d = x->h2d_seconds;
    *d2h = x->d2h_seconds;
}

uint64_t tb_exec_arena_bytes(const tb_exec *x) { return x->arena_used; }
