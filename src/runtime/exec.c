/*
 * exec.c — the executor of general engines (tb_exec, turbine.h).
 *
 * Per run: the input shapes are checked against the engine's profiles (one
 * of them must hold every symbol the inputs bind); when they differ from
 * the previous run's, every value's shape is computed again (ir/interp.c:
 * shape rules, shape tensors evaluated on the host) and the activations are
 * planned into one arena by liveness. Reshape, Squeeze, Unsqueeze, Flatten
 * and Identity change no byte: their outputs are views of their input's
 * memory (kernels never write their inputs, so sharing is safe), no kernel
 * runs for them, and the memory of such an alias group lives until the last
 * reader of any value in it. Two placements are tried, first fit in order of
 * definition and best fit largest first (as opt/plan_mem.c), and the
 * smaller arena kept. The arena only grows, on a shape larger than any seen
 * before; runs of a seen shape allocate nothing. Then the backend runs the
 * nodes in order with the run's views (tb_step.views).
 */
#include <jansson.h>

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
    int *alias;            /* per value: the value whose memory it views, or -1 (this shape's) */
    uint8_t *skip;         /* per node: an alias, no kernel runs (this shape's) */
    int n_aliased;
    tb_profile_set profiles;
    int last_profile;
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
    /* calibration of INT8 engines (plan/calib_onnx.c): called after each node */
    tb_node_observer observer;
    void *observer_user;
};

void tb_exec_options_default(tb_exec_options *o) { memset(o, 0, sizeof *o); }

int tb_engine_is_llm(const tb_engine *e) { return e->graph && e->graph->n_outputs == 0; }

int tb_exec_n_inputs(const tb_exec *x) { return x->g->n_inputs; }
int tb_exec_n_outputs(const tb_exec *x) { return x->g->n_outputs; }
const char *tb_exec_backend(const tb_exec *x) { return x->b->iface->name; }

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
    free(x->alias);
    free(x->skip);
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
    x->alias = calloc((size_t)nv + 1, sizeof *x->alias);
    x->skip = calloc((size_t)nn + 1, 1);
    x->host_needed = calloc((size_t)nv + 1, 1);
    x->node_seconds = calloc((size_t)nn + 1, sizeof *x->node_seconds);
    x->last_profile = -1;
    tb_status s = TB_OK;
    if (!x->bufs || !x->views || !x->offset || !x->bytes || !x->last_use || !x->alias || !x->skip ||
        !x->host_needed || !x->node_seconds) {
        s = tb_errorf(TB_ERR_OOM, "out of memory");
        goto fail;
    }
    if ((s = tb_profiles_from_meta(x->g, e->meta_json, &x->profiles)) != TB_OK) goto fail;
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

/* ---------------------------------------------------------------- profiles */

tb_status tb_profiles_from_meta(const tb_graph *g, const char *meta_json, tb_profile_set *out) {
    memset(out, 0, sizeof *out);
    out->n = 1;
    memcpy(out->syms[0], g->syms, sizeof(tb_symbol) * (size_t)g->n_syms);
    json_error_t err;
    json_t *m = meta_json ? json_loads(meta_json, 0, &err) : NULL;
    json_t *list = m ? json_object_get(m, "profiles") : NULL;
    size_t n = json_is_array(list) ? json_array_size(list) : 0;
    /* an older engine lists the symbols themselves: one profile, the graph's */
    if (!n || !json_is_object(json_array_get(list, 0)) || !json_object_get(json_array_get(list, 0), "symbols")) {
        json_decref(m);
        return TB_OK;
    }
    if (n > TB_MAX_PROFILES) {
        json_decref(m);
        return tb_errorf(TB_ERR_FORMAT, "the engine has %zu profiles, at most %d", n, TB_MAX_PROFILES);
    }
    out->n = (int)n;
    for (size_t p = 0; p < n; p++) {
        json_t *pr = json_array_get(list, p), *syms = json_object_get(pr, "symbols");
        const char *text = json_string_value(json_object_get(pr, "inputs"));
        snprintf(out->text[p], sizeof out->text[p], "%s", text ? text : "");
        memcpy(out->syms[p], g->syms, sizeof(tb_symbol) * (size_t)g->n_syms);
        for (size_t i = 0; i < json_array_size(syms); i++) {
            json_t *y = json_array_get(syms, i);
            const char *name = json_string_value(json_object_get(y, "name"));
            int k = name ? tb_graph_find_sym(g, name) : -1;
            json_t *mn = json_object_get(y, "min"), *op = json_object_get(y, "opt"), *mx = json_object_get(y, "max");
            if (k < 0 || !json_is_integer(mn) || !json_is_integer(op) || !json_is_integer(mx)) {
                json_decref(m);
                return tb_errorf(TB_ERR_FORMAT, "the engine's profile %zu has a malformed symbol entry %zu", p + 1, i);
            }
            tb_symbol *s = &out->syms[p][k];
            s->min = json_integer_value(mn), s->opt = json_integer_value(op), s->max = json_integer_value(mx);
            if (s->min < g->syms[k].min || s->max > g->syms[k].max || s->min > s->opt || s->opt > s->max) {
                json_decref(m);
                return tb_errorf(TB_ERR_FORMAT, "the engine's profile %zu gives %s [%lld, %lld, %lld], outside the "
                                 "graph's [%lld, %lld]", p + 1, s->name, (long long)s->min, (long long)s->opt,
                                 (long long)s->max, (long long)g->syms[k].min, (long long)g->syms[k].max);
            }
        }
    }
    json_decref(m);
    return TB_OK;
}

int tb_profiles_describe(const tb_profile_set *ps, const tb_graph *g, const char *indent, char *buf, size_t cap) {
    size_t k = 0;
    if (cap) buf[0] = 0;
#define PUT(...) do { if (k < cap) k += (size_t)snprintf(buf + k, cap - k, __VA_ARGS__); } while (0)
    for (int p = 0; p < ps->n; p++) {
        PUT("%sprofile %d:", indent, p + 1);
        for (int i = 0; i < g->n_syms; i++)
            PUT("%s %s [%lld, %lld, %lld]", i ? "," : "", ps->syms[p][i].name, (long long)ps->syms[p][i].min,
                (long long)ps->syms[p][i].opt, (long long)ps->syms[p][i].max);
        if (!g->n_syms) PUT(" fixed shapes");
        if (ps->text[p][0]) PUT("  (%s)", ps->text[p]);
        PUT("\n");
    }
#undef PUT
    return (int)k;
}

const tb_profile_set *tb_exec_profiles(const tb_exec *x) { return &x->profiles; }
int tb_exec_last_profile(const tb_exec *x) { return x->last_profile; }
int tb_exec_n_aliased(const tb_exec *x) { return x->n_aliased; }

/* The profiles: the inputs' ranks, and the symbols they bind inside the
 * ranges of one profile (the first that holds them; *which). */
static tb_status check_profile(const tb_graph *g, const tb_profile_set *ps, const tb_tensor *in, int n_in,
                               int *which) {
    int64_t val[TB_MAX_SYMS];
    for (int i = 0; i < TB_MAX_SYMS; i++) val[i] = -1;
    for (int i = 0; i < n_in; i++) {
        const tb_value *v = &g->values[g->inputs[i]];
        if (in[i].rank != v->rank)
            return tb_errorf(TB_ERR_INVALID_ARG, "input %s: rank %d given, the engine takes rank %d", v->name,
                             in[i].rank, v->rank);
        for (int d = 0; d < v->rank; d++)
            if (TB_IS_SYM(v->dims[d]) && val[TB_SYM_INDEX(v->dims[d])] < 0)
                val[TB_SYM_INDEX(v->dims[d])] = in[i].dims[d];
    }
    for (int p = 0; p < ps->n; p++) {
        int ok = 1;
        for (int y = 0; y < g->n_syms && ok; y++)
            ok = val[y] < 0 || (val[y] >= ps->syms[p][y].min && val[y] <= ps->syms[p][y].max);
        if (ok) { *which = p; return TB_OK; }
    }
    /* name the first dim outside, then every profile's ranges */
    char msg[2048];
    size_t k = 0;
#define PUT(...) do { if (k < sizeof msg) k += (size_t)snprintf(msg + k, sizeof msg - k, __VA_ARGS__); } while (0)
    for (int i = 0; i < n_in && !k; i++) {
        const tb_value *v = &g->values[g->inputs[i]];
        for (int d = 0; d < v->rank && !k; d++) {
            if (!TB_IS_SYM(v->dims[d])) continue;
            int y = TB_SYM_INDEX(v->dims[d]);
            int inside_one = 0;
            for (int p = 0; p < ps->n; p++)
                inside_one |= in[i].dims[d] >= ps->syms[p][y].min && in[i].dims[d] <= ps->syms[p][y].max;
            if (!inside_one || ps->n == 1)
                PUT("input %s: dim %d (%s) is %lld, outside ", v->name, d, g->syms[y].name, (long long)in[i].dims[d]);
        }
    }
    if (!k) {
        PUT("the inputs bind");
        for (int y = 0; y < g->n_syms; y++)
            if (val[y] >= 0) PUT(" %s = %lld", g->syms[y].name, (long long)val[y]);
        PUT(", a combination outside ");
    }
    if (ps->n == 1) {
        PUT("the engine's profile:");
        for (int y = 0; y < g->n_syms; y++)
            PUT("%s %s [%lld, %lld]", y ? "," : "", g->syms[y].name, (long long)ps->syms[0][y].min,
                (long long)ps->syms[0][y].max);
    } else {
        PUT("every profile of the engine:");
        for (int p = 0; p < ps->n; p++) {
            PUT("%s profile %d:", p ? ";" : "", p + 1);
            for (int y = 0; y < g->n_syms; y++)
                PUT("%s %s [%lld, %lld]", y ? "," : "", g->syms[y].name, (long long)ps->syms[p][y].min,
                    (long long)ps->syms[p][y].max);
        }
    }
    PUT("; rebuild with a profile covering it (--profile, or --min-shapes/--max-shapes)");
#undef PUT
    return tb_errorf(TB_ERR_RANGE, "%s", msg);
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

/* Ops whose output is their first input's bytes under another shape. */
static int is_view_op(tb_op_kind k) {
    return k == TB_OP_RESHAPE || k == TB_OP_SQUEEZE || k == TB_OP_UNSQUEEZE || k == TB_OP_FLATTEN ||
           k == TB_OP_IDENTITY;
}

/* ---- placement: values with lifetimes [start, end] (node indices, both
 * inclusive; -1 before the first node) and sizes; two that are live at once
 * never overlap. */
typedef struct {
    int v, start, end;
    uint64_t bytes, off;
} plan_item;

static int overlaps(const plan_item *a, const plan_item *b) { return a->start <= b->end && b->start <= a->end; }

/* First fit in order of definition (items sorted by start). */
static uint64_t place_first_fit(plan_item *it, int n, plan_item **tmp) {
    uint64_t top = 0;
    for (int i = 0; i < n; i++) {
        int m = 0;
        for (int j = 0; j < i; j++)
            if (overlaps(&it[i], &it[j])) tmp[m++] = &it[j];
        for (int a = 1; a < m; a++) /* by offset */
            for (int b = a; b > 0 && tmp[b - 1]->off > tmp[b]->off; b--) {
                plan_item *t = tmp[b]; tmp[b] = tmp[b - 1]; tmp[b - 1] = t;
            }
        uint64_t at = 0;
        for (int j = 0; j < m; j++) {
            if (tmp[j]->off >= at + it[i].bytes) break;
            if (tmp[j]->off + tmp[j]->bytes > at) at = tmp[j]->off + tmp[j]->bytes;
        }
        it[i].off = at;
        if (at + it[i].bytes > top) top = at + it[i].bytes;
    }
    return top;
}

static int by_size_desc(const void *a, const void *b) {
    const plan_item *x = *(plan_item *const *)a, *y = *(plan_item *const *)b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->start - y->start;
}

static int by_off(const void *a, const void *b) {
    const plan_item *x = *(plan_item *const *)a, *y = *(plan_item *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Best fit, largest first: each item in the smallest gap between the
 * placed items it overlaps in time that holds it (else above them). */
static uint64_t place_best_fit(plan_item *it, int n, plan_item **order, plan_item **tmp, uint64_t *off) {
    for (int i = 0; i < n; i++) order[i] = &it[i];
    qsort(order, (size_t)n, sizeof *order, by_size_desc);
    uint64_t top = 0;
    for (int i = 0; i < n; i++) {
        plan_item *p = order[i];
        int m = 0;
        for (int j = 0; j < i; j++)
            if (overlaps(p, order[j])) tmp[m++] = order[j];
        qsort(tmp, (size_t)m, sizeof *tmp, by_off);
        uint64_t at = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
        for (int j = 0; j < m; j++) {
            if (tmp[j]->off >= at + p->bytes && tmp[j]->off - at < best_gap) {
                best = at;
                best_gap = tmp[j]->off - at;
            }
            if (tmp[j]->off + tmp[j]->bytes > at) at = tmp[j]->off + tmp[j]->bytes;
        }
        p->off = best != UINT64_MAX ? best : at;
        if (p->off + p->bytes > top) top = p->off + p->bytes;
    }
    for (int i = 0; i < n; i++) off[i] = it[i].off;
    return top;
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
    /* aliases: a view op's output shares its input's memory (the group's
     * root: an input, a weight or an activation with memory of its own) */
    x->n_aliased = 0;
    for (int v = 0; v < nv; v++) x->alias[v] = -1;
    for (int k = 0; k < nn; k++) {
        const tb_node *n = &g->nodes[k];
        x->skip[k] = 0;
        if (!is_view_op(n->op) || n->n_out != 1 || x->views[n->out[0]].data) continue;
        int src = n->in[0], root = x->alias[src] >= 0 ? x->alias[src] : src;
        x->alias[n->out[0]] = root;
        x->skip[k] = 1;
        x->n_aliased++;
    }
    /* when each value is defined (inputs and weights before node 0) and
     * when its memory is last read: the group's last reader for a root */
    int *def = malloc(((size_t)nv + 1) * sizeof *def), *end = malloc(((size_t)nv + 1) * sizeof *end);
    plan_item *items = malloc(((size_t)nv + 1) * sizeof *items);
    plan_item **order = malloc(((size_t)nv + 1) * sizeof *order), **tmp = malloc(((size_t)nv + 1) * sizeof *tmp);
    uint64_t *off_best = malloc(((size_t)nv + 1) * sizeof *off_best);
    tb_status s = TB_OK;
    if (!def || !end || !items || !order || !tmp || !off_best) { s = tb_errorf(TB_ERR_OOM, "out of memory planning"); goto done; }
    for (int v = 0; v < nv; v++) def[v] = -1, end[v] = x->last_use[v];
    for (int k = 0; k < nn; k++)
        for (int o = 0; o < g->nodes[k].n_out; o++) def[g->nodes[k].out[o]] = k;
    for (int v = 0; v < nv; v++)
        if (x->alias[v] >= 0 && end[v] > end[x->alias[v]]) end[x->alias[v]] = end[v];
    int n_items = 0;
    for (int v = 0; v < nv; v++) {
        x->offset[v] = UINT64_MAX;
        x->bytes[v] = 0;
        if (x->alias[v] >= 0) continue;
        int want;
        if (g->values[v].kind == TB_VAL_ACT)
            want = !x->views[v].data || (device && read_on_device(g, v));
        else
            want = device && g->values[v].kind == TB_VAL_INPUT;
        if (!want) continue;
        if ((s = tb_view_bytes(&x->views[v], &x->bytes[v])) != TB_OK) {
            s = tb_error_prefix(s, "value %s", g->values[v].name);
            goto done;
        }
        x->bytes[v] = (x->bytes[v] + 63) / 64 * 64;
        if (!x->bytes[v]) x->bytes[v] = 64;
        /* an activation nothing reads (an unused output of Split) still
         * gets its bytes while its node runs */
        items[n_items++] = (plan_item){v, def[v], end[v] < def[v] ? def[v] : end[v], x->bytes[v], 0};
    }
    /* items are in value order; first fit wants them by definition */
    for (int a = 1; a < n_items; a++)
        for (int b2 = a; b2 > 0 && items[b2 - 1].start > items[b2].start; b2--) {
            plan_item t = items[b2]; items[b2] = items[b2 - 1]; items[b2 - 1] = t;
        }
    uint64_t top_best = place_best_fit(items, n_items, order, tmp, off_best);
    uint64_t top = place_first_fit(items, n_items, tmp);
    if (top_best < top) {
        for (int i = 0; i < n_items; i++) items[i].off = off_best[i];
        top = top_best;
    }
    for (int i = 0; i < n_items; i++) x->offset[items[i].v] = items[i].off;
    if (top > x->arena_cap) {
        /* the CPU's arena is host memory: a run whose shapes (data-dependent
         * ones included: Expand, ConstantOfShape, Range) need more than the
         * machine has free is refused here, before malloc's overcommit would
         * let it fault the pages in until the kernel kills the process */
        uint64_t avail = strcmp(x->b->iface->name, "cpu") ? 0 : tb_mem_available();
        if (avail && top > avail) {
            s = tb_errorf(TB_ERR_OOM, "these shapes need %.2f GB of activations, more than the %.2f GB of memory "
                          "available", (double)top / 1e9, (double)avail / 1e9);
            goto done;
        }
        if (x->arena) x->b->iface->free(x->b, x->arena);
        x->arena = x->b->iface->alloc(x->b, (size_t)top);
        x->arena_cap = x->arena ? top : 0;
        if (!x->arena) {
            s = tb_errorf(TB_ERR_OOM, "out of memory for %llu bytes of activations", (unsigned long long)top);
            goto done;
        }
    }
    x->arena_used = top;
    for (int v = 0; v < nv; v++) {
        if (x->offset[v] != UINT64_MAX) x->bufs[v] = (uint8_t *)x->arena + x->offset[v];
        else if (g->values[v].kind == TB_VAL_ACT && x->alias[v] < 0) x->bufs[v] = x->views[v].data; /* host-computed */
    }
    /* host-computed values the device's kernels read */
    for (int v = 0; v < nv && device; v++)
        if (g->values[v].kind == TB_VAL_ACT && x->views[v].data && x->offset[v] != UINT64_MAX) {
            uint64_t bytes;
            if ((s = tb_view_bytes(&x->views[v], &bytes)) != TB_OK) goto done;
            if ((s = x->b->iface->upload(x->b, x->bufs[v], x->views[v].data, (size_t)bytes)) != TB_OK) goto done;
        }
    for (int i = 0; i < n_in; i++) memcpy(x->last_dims[i], in[i].dims, sizeof x->last_dims[i]);
    x->have_shape = 1;
done:
    free(def);
    free(end);
    free(items);
    free(order);
    free(tmp);
    free(off_best);
    return s;
}

tb_status tb_exec_run(tb_exec *x, const tb_tensor *inputs, int n_in, tb_tensor *outputs, int n_out) {
    tb_graph *g = x->g;
    if (n_in != g->n_inputs)
        return tb_errorf(TB_ERR_INVALID_ARG, "the engine takes %d inputs, %d given", g->n_inputs, n_in);
    if (n_out != g->n_outputs)
        return tb_errorf(TB_ERR_INVALID_ARG, "the engine has %d outputs, %d wanted", g->n_outputs, n_out);
    TB_TRY(check_profile(g, &x->profiles, inputs, n_in, &x->last_profile));
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
    /* views: their root's memory (an input's is this run's) */
    for (int v = 0; v < g->n_values && x->n_aliased; v++)
        if (x->alias[v] >= 0) x->bufs[v] = x->bufs[x->alias[v]];
    tb_step st;
    memset(&st, 0, sizeof st);
    st.views = x->views;
    /* a backend may record the run (a CUDA graph) and replay it for a shape
     * it has seen; not while per-node times are taken */
    int hooks = x->b->iface->run_begin && x->b->iface->run_end && !x->profiling;
    if (hooks) TB_TRY(x->b->iface->run_begin(x->b, g, x->bufs, &st));
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (x->views[n->out[0]].data || x->skip[k]) continue; /* computed on the host while planning, or a view */
        double t0 = x->profiling ? tb_now() : 0;
        tb_status s = x->b->iface->run_node(x->b, g, n, x->bufs, &st);
        if (s != TB_OK)
            return tb_error_prefix(s, "node %d (%s, output %s)", k, tb_op_name(n->op), g->values[n->out[0]].name);
        if (x->observer) x->observer(x->observer_user, g, k, x->bufs, &st);
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
        int root = x->alias[v] >= 0 ? x->alias[v] : v;
        tb_value_kind rk = g->values[root].kind;
        if (rk == TB_VAL_WEIGHT && (!device || root == v)) {
            /* the engine's bytes (mapped, read-only), valid while it is loaded */
            outputs[i].data = (void *)g->values[root].data;
            continue;
        }
        /* a host output is the executor's memory, except a view of a graph
         * input there: the caller's buffer, copied (the caller may reuse it) */
        if (!device && !(rk == TB_VAL_INPUT)) continue;
        uint64_t bytes;
        TB_TRY(tb_view_bytes(w, &bytes));
        if (bytes > x->out_cap[i]) {
            void *p = realloc(x->out_host[i], (size_t)bytes);
            if (!p) return tb_errorf(TB_ERR_OOM, "out of memory for output %s", g->values[v].name);
            x->out_host[i] = p;
            x->out_cap[i] = (size_t)bytes;
        }
        if (!device) {
            if (bytes) memcpy(x->out_host[i], x->bufs[v], (size_t)bytes); /* an empty output has no buffer */
            outputs[i].data = x->out_host[i];
            continue;
        }
        double t0 = tb_now();
        if (bytes) TB_TRY(x->b->iface->download(x->b, x->out_host[i], x->bufs[v], (size_t)bytes));
        x->d2h_seconds += tb_now() - t0;
        outputs[i].data = x->out_host[i];
    }
    return TB_OK;
}

tb_status tb_exec_set_observer(tb_exec *x, tb_node_observer fn, void *user) {
    if (x->b->iface->upload)
        return tb_errorf(TB_ERR_UNSUPPORTED, "a node observer needs an executor on the CPU");
    x->observer = fn;
    x->observer_user = user;
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
