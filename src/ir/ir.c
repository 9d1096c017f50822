/* ir.c — graph construction, shape checks (rules in ops.c) and (de)serialization. */
#include "ir/ir.h"
#include "ir/ops.h"

tb_graph *tb_graph_new(void) { return calloc(1, sizeof(tb_graph)); }

void tb_graph_free(tb_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].owned) free((void *)g->values[i].data);
    free(g->values);
    free(g->nodes);
    free(g);
}

int tb_graph_add_sym(tb_graph *g, const char *name, int64_t min, int64_t opt, int64_t max) {
    int i = tb_graph_find_sym(g, name);
    if (i < 0) {
        if (g->n_syms >= TB_MAX_SYMS) return -1;
        i = g->n_syms++;
        snprintf(g->syms[i].name, sizeof g->syms[i].name, "%s", name);
    }
    g->syms[i].min = min;
    g->syms[i].opt = opt;
    g->syms[i].max = max;
    return i;
}

int tb_graph_find_sym(const tb_graph *g, const char *name) {
    for (int i = 0; i < g->n_syms; i++)
        if (!strcmp(g->syms[i].name, name)) return i;
    return -1;
}

int tb_graph_add_value(tb_graph *g, const char *name, tb_value_kind kind, tb_dtype dt,
                       int rank, const int64_t *dims) {
    if (rank < 0 || rank > TB_MAX_RANK) {
        tb_errorf(TB_ERR_INVALID_ARG, "value %s: rank %d is outside [0, %d]", name, rank, TB_MAX_RANK);
        return -1;
    }
    if (g->n_values == g->cap_values) {
        int cap = g->cap_values ? g->cap_values * 2 : 64;
        tb_value *v = realloc(g->values, (size_t)cap * sizeof *v);
        if (!v) { tb_errorf(TB_ERR_OOM, "out of memory adding value %s", name); return -1; }
        g->values = v;
        g->cap_values = cap;
    }
    tb_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->kind = kind;
    v->dtype = dt;
    v->rank = rank;
    for (int i = 0; i < rank; i++) v->dims[i] = dims[i];
    return g->n_values++;
}

int tb_graph_add_weight(tb_graph *g, const char *name, tb_dtype dt, int rank,
                        const int64_t *dims, const void *data, int owned) {
    int id = tb_graph_add_value(g, name, TB_VAL_WEIGHT, dt, rank, dims);
    if (id < 0) {
        if (owned) free((void *)data); /* ownership passes even on failure */
        return -1;
    }
    tb_value *v = &g->values[id];
    uint64_t bytes;
    if (tb_dtype_tensor_bytes(dt, rank, dims, &bytes) != TB_OK) {
        tb_error_prefix(TB_ERR_INVALID_ARG, "weight %s", name);
        if (owned) free((void *)data);
        g->n_values--; /* the value just added */
        return -1;
    }
    v->data = data;
    v->owned = owned;
    v->nbytes = bytes;
    return id;
}

int tb_graph_find_value(const tb_graph *g, const char *name) {
    for (int i = 0; i < g->n_values; i++)
        if (!strcmp(g->values[i].name, name)) return i;
    return -1;
}

/* ---------------------------------------------------------------- shapes */

/* Computes the outputs' dtype/rank/dims of node n from its op's definition
 * (ops.c). Returns TB_OK or an error naming the op and the mismatch. */
static tb_status infer(const tb_graph *g, const tb_node *n, int *out_rank,
                       int64_t out_dims[][TB_MAX_RANK], tb_dtype *out_dt, int *n_out) {
    tb_op_shape sh;
    TB_TRY(tb_op_infer(g, n, &sh));
    *n_out = sh.n_out;
    for (int o = 0; o < sh.n_out; o++) {
        out_rank[o] = sh.rank[o];
        memcpy(out_dims[o], sh.dims[o], sizeof sh.dims[o]);
        out_dt[o] = sh.dtype[o];
    }
    return TB_OK;
}

int tb_graph_add_node_ex(tb_graph *g, tb_op_kind op, const int *in, int n_in, const char *const *out_names,
                         int n_names, const int32_t *iattr, const float *fattr) {
    const char *out_name = n_names > 0 && out_names[0] ? out_names[0] : "?";
    if (n_in < 0 || n_in > TB_MAX_INPUTS) {
        tb_errorf(TB_ERR_INVALID_ARG, "node %s: %d inputs (at most %d)", out_name, n_in, TB_MAX_INPUTS);
        return -1;
    }
    tb_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = op;
    nd.n_in = n_in;
    for (int i = 0; i < n_in; i++) nd.in[i] = in[i];
    if (iattr) memcpy(nd.i, iattr, sizeof nd.i);
    if (fattr) memcpy(nd.f, fattr, sizeof nd.f);
    int rank[TB_MAX_OUTPUTS], n_out;
    int64_t dims[TB_MAX_OUTPUTS][TB_MAX_RANK];
    tb_dtype dt[TB_MAX_OUTPUTS];
    memset(dims, 0, sizeof dims);
    if (infer(g, &nd, rank, dims, dt, &n_out) != TB_OK) {
        tb_error_prefix(tb_last_status(), "node %s", out_name);
        return -1;
    }
    nd.n_out = n_out;
    int first_value = g->n_values;
    for (int k = 0; k < n_out; k++) {
        char name[TB_NAME_LEN];
        if (k < n_names && out_names[k]) snprintf(name, sizeof name, "%s", out_names[k]);
        else snprintf(name, sizeof name, k ? "%s.%d" : "%s", out_name, k);
        int v = tb_graph_add_value(g, name, TB_VAL_ACT, dt[k], rank[k], dims[k]);
        if (v < 0) { g->n_values = first_value; return -1; }
        nd.out[k] = v;
    }
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
        tb_node *p = realloc(g->nodes, (size_t)cap * sizeof *p);
        if (!p) { g->n_values = first_value; tb_errorf(TB_ERR_OOM, "out of memory adding node %s", out_name); return -1; }
        g->nodes = p;
        g->cap_nodes = cap;
    }
    g->nodes[g->n_nodes] = nd;
    return g->n_nodes++;
}

int tb_graph_add_node(tb_graph *g, tb_op_kind op, const int *in, int n_in, const char *out_name,
                      const int32_t *iattr, const float *fattr) {
    int32_t ia[TB_NODE_INTS] = {0};
    float fa[TB_NODE_FLOATS] = {0};
    if (iattr) memcpy(ia, iattr, 4 * sizeof *ia);
    if (fattr) memcpy(fa, fattr, 4 * sizeof *fa);
    return tb_graph_add_node_ex(g, op, in, n_in, &out_name, 1, ia, fa);
}

tb_status tb_graph_check(tb_graph *g) {
    /* profiles: 1 <= min <= opt <= max, and a bound that keeps every size
     * computed from them far from overflow */
    for (int i = 0; i < g->n_syms; i++) {
        const tb_symbol *y = &g->syms[i];
        if (y->min < 1 || y->min > y->opt || y->opt > y->max || y->max > (1 << 24))
            return tb_errorf(TB_ERR_FORMAT, "symbol %s has an invalid profile [min %lld, opt %lld, max %lld]", y->name,
                             (long long)y->min, (long long)y->opt, (long long)y->max);
    }
    /* nodes in topological order: a node reads inputs, weights and values an
     * earlier node wrote; every activation is written by exactly one node */
    uint8_t *written = calloc((size_t)g->n_values + 1, 1);
    if (!written) return tb_errorf(TB_ERR_OOM, "out of memory checking the graph");
    for (int v = 0; v < g->n_values; v++) written[v] = g->values[v].kind != TB_VAL_ACT;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] < 0 || n->in[j] >= g->n_values || !written[n->in[j]]) {
                free(written);
                return tb_errorf(TB_ERR_FORMAT, "node %d (%s) reads value %d before any node writes it", k,
                                 (unsigned)n->op < TB_OP_COUNT ? tb_op_name(n->op) : "?", n->in[j]);
            }
        for (int o = 0; o < n->n_out; o++) {
            int v = n->out[o];
            if (v < 0 || v >= g->n_values || g->values[v].kind != TB_VAL_ACT || written[v] == 2) {
                free(written);
                return tb_errorf(TB_ERR_FORMAT, "node %d writes value %d, which is not a fresh activation", k, v);
            }
            written[v] = 2;
        }
    }
    int out_ok = g->output >= 0 && g->output < g->n_values && written[g->output];
    if (g->n_outputs > 0) { /* a general graph: its listed inputs and outputs */
        out_ok = g->n_outputs <= TB_MAX_IO && g->n_inputs >= 0 && g->n_inputs <= TB_MAX_IO;
        for (int i = 0; out_ok && i < g->n_outputs; i++)
            out_ok = g->outputs[i] >= 0 && g->outputs[i] < g->n_values && written[g->outputs[i]];
        for (int i = 0; out_ok && i < g->n_inputs; i++)
            out_ok = g->inputs[i] >= 0 && g->inputs[i] < g->n_values && g->values[g->inputs[i]].kind == TB_VAL_INPUT;
    }
    free(written);
    if (!out_ok) return tb_errorf(TB_ERR_FORMAT, "graph has no output");
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        int rank[TB_MAX_OUTPUTS], n_out;
        int64_t dims[TB_MAX_OUTPUTS][TB_MAX_RANK];
        tb_dtype dt[TB_MAX_OUTPUTS];
        memset(dims, 0, sizeof dims);
        if ((unsigned)n->op >= TB_OP_COUNT) return tb_errorf(TB_ERR_FORMAT, "node %d: unknown op %d", k, (int)n->op);
        if (infer(g, n, rank, dims, dt, &n_out) != TB_OK)
            return tb_error_prefix(TB_ERR_FORMAT, "node %d", k);
        if (n_out != n->n_out) return tb_errorf(TB_ERR_FORMAT, "node %d (%s): wrong output count", k, tb_op_name(n->op));
        for (int o = 0; o < n_out; o++) {
            if (n->out[o] < 0 || n->out[o] >= g->n_values)
                return tb_errorf(TB_ERR_FORMAT, "node %d: output refers to no value", k);
            tb_value *v = &g->values[n->out[o]];
            int same = v->rank == rank[o] && v->dtype == dt[o];
            /* a general op's dim the rule cannot tell here (it reads a
             * constant whose data is not resolved yet) is checked at run
             * time against the recorded one (ir/interp.c) */
            for (int d = 0; same && d < rank[o]; d++)
                same = v->dims[d] == dims[o][d] || dims[o][d] == TB_DIM_DYN;
            if (!same)
                return tb_errorf(TB_ERR_FORMAT, "node %d (%s): output %s has the wrong shape", k,
                                 tb_op_name(n->op), v->name);
        }
    }
    if (g->n_outputs == 0 && (g->output < 0 || g->output >= g->n_values))
        return tb_errorf(TB_ERR_FORMAT, "graph has no output");
    return TB_OK;
}

int64_t tb_value_numel(const tb_graph *g, const tb_value *v, const int64_t *symval) {
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) {
        int64_t d = v->dims[i];
        if (TB_IS_SYM(d)) d = symval ? symval[TB_SYM_INDEX(d)] : g->syms[TB_SYM_INDEX(d)].max;
        n *= d;
    }
    return n;
}

tb_status tb_value_bytes(const tb_graph *g, const tb_value *v, const int64_t *symval, uint64_t *out) {
    int64_t dims[TB_MAX_RANK];
    for (int i = 0; i < v->rank; i++) {
        int64_t d = v->dims[i];
        dims[i] = TB_IS_SYM(d) ? (symval ? symval[TB_SYM_INDEX(d)] : g->syms[TB_SYM_INDEX(d)].max) : d;
    }
    tb_status s = tb_dtype_tensor_bytes(v->dtype, v->rank, dims, out);
    return s == TB_OK ? s : tb_error_prefix(s, "value %s", v->name);
}

void tb_value_shape_str(const tb_graph *g, const tb_value *v, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < v->rank && n < cap; i++) {
        int64_t d = v->dims[i];
        if (d == TB_DIM_DYN)
            n += (size_t)snprintf(buf + n, cap - n, "%s?", i ? ", " : "");
        else if (TB_IS_SYM(d) && TB_SYM_INDEX(d) < g->n_syms)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", g->syms[TB_SYM_INDEX(d)].name);
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)d);
    }
    if (n < cap) snprintf(buf + n, cap - n, ")");
}

/* ---------------------------------------------------------------- serialize
 * Layout (little-endian): u32 n_syms, syms; u32 n_values, values; u32 n_nodes,
 * nodes; i32 output. Fixed-size records keep the reader simple and bounded. */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4096;
        while (cap < w->n + n) cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) { w->oom = 1; return; }
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}

typedef struct {
    char name[TB_NAME_LEN];
    int32_t kind, dtype, rank, pad;
    int64_t dims[TB_MAX_RANK];
    uint64_t nbytes, offset;
} value_rec;

typedef struct {
    int32_t op, n_in, n_out, tactic;
    int32_t in[TB_MAX_INPUTS];
    int32_t out[TB_MAX_OUTPUTS];
    int32_t i[TB_NODE_INTS];
    float f[TB_NODE_FLOATS];
} node_rec;

tb_status tb_graph_serialize(const tb_graph *g, uint8_t **buf, size_t *n) {
    wbuf w = {0};
    uint32_t c = (uint32_t)g->n_syms;
    put(&w, &c, 4);
    put(&w, g->syms, sizeof(tb_symbol) * (size_t)g->n_syms);
    c = (uint32_t)g->n_values;
    put(&w, &c, 4);
    for (int i = 0; i < g->n_values; i++) {
        const tb_value *v = &g->values[i];
        value_rec r;
        memset(&r, 0, sizeof r);
        memcpy(r.name, v->name, sizeof r.name);
        r.kind = v->kind; r.dtype = v->dtype; r.rank = v->rank;
        memcpy(r.dims, v->dims, sizeof r.dims);
        r.nbytes = v->nbytes; r.offset = v->offset;
        put(&w, &r, sizeof r);
    }
    c = (uint32_t)g->n_nodes;
    put(&w, &c, 4);
    for (int i = 0; i < g->n_nodes; i++) {
        const tb_node *nd = &g->nodes[i];
        node_rec r;
        memset(&r, 0, sizeof r);
        r.op = nd->op; r.n_in = nd->n_in; r.n_out = nd->n_out; r.tactic = nd->tactic;
        for (int k = 0; k < TB_MAX_INPUTS; k++) r.in[k] = nd->in[k];
        for (int k = 0; k < TB_MAX_OUTPUTS; k++) r.out[k] = nd->out[k];
        memcpy(r.i, nd->i, sizeof r.i);
        memcpy(r.f, nd->f, sizeof r.f);
        put(&w, &r, sizeof r);
    }
    int32_t o = g->output;
    put(&w, &o, 4);
    int32_t io[2 + 2 * TB_MAX_IO] = {g->n_inputs, g->n_outputs};
    for (int i = 0; i < TB_MAX_IO; i++) { io[2 + i] = g->inputs[i]; io[2 + TB_MAX_IO + i] = g->outputs[i]; }
    put(&w, io, sizeof io);
    if (w.oom) { free(w.p); return tb_errorf(TB_ERR_OOM, "out of memory serializing the graph"); }
    *buf = w.p;
    *n = w.n;
    return TB_OK;
}

tb_status tb_graph_deserialize(const uint8_t *buf, size_t n, tb_graph **out) {
    *out = NULL;
    size_t off = 0;
    uint32_t c;
#define TAKE(dst, sz) do { if ((sz) > n - off) goto truncated; memcpy((dst), buf + off, (sz)); off += (sz); } while (0)
    tb_graph *g = tb_graph_new();
    if (!g) return tb_errorf(TB_ERR_OOM, "out of memory");
    TAKE(&c, 4);
    if (c > TB_MAX_SYMS) goto bad;
    g->n_syms = (int)c;
    TAKE(g->syms, sizeof(tb_symbol) * c);
    for (uint32_t i = 0; i < c; i++) g->syms[i].name[sizeof g->syms[i].name - 1] = 0;
    TAKE(&c, 4);
    if (c > (n - off) / sizeof(value_rec)) goto truncated;
    g->values = calloc(c ? c : 1, sizeof(tb_value));
    if (!g->values) goto oom;
    g->cap_values = (int)c;
    for (uint32_t i = 0; i < c; i++) {
        value_rec r;
        TAKE(&r, sizeof r);
        tb_value *v = &g->values[i];
        memcpy(v->name, r.name, sizeof v->name);
        v->name[TB_NAME_LEN - 1] = 0;
        if (r.kind < 0 || r.kind > TB_VAL_ACT || r.dtype < 0 || r.dtype >= TB_DTYPE_COUNT || r.rank < 0 ||
            r.rank > TB_MAX_RANK)
            goto bad;
        v->kind = (tb_value_kind)r.kind; v->dtype = (tb_dtype)r.dtype; v->rank = r.rank;
        memcpy(v->dims, r.dims, sizeof v->dims);
        for (int d = 0; d < v->rank; d++)
            /* a symbol is -1 - its index: one past the table (or INT64_MIN) is no
             * symbol; TB_DIM_DYN is the one other negative dim */
            if (v->dims[d] < 0 && v->dims[d] != TB_DIM_DYN && v->dims[d] < -(int64_t)g->n_syms) goto bad;
        v->nbytes = r.nbytes; v->offset = r.offset;
        g->n_values++;
    }
    TAKE(&c, 4);
    if (c > (n - off) / sizeof(node_rec)) goto truncated;
    g->nodes = calloc(c ? c : 1, sizeof(tb_node));
    if (!g->nodes) goto oom;
    g->cap_nodes = (int)c;
    for (uint32_t i = 0; i < c; i++) {
        node_rec r;
        TAKE(&r, sizeof r);
        tb_node *nd = &g->nodes[i];
        if (r.op < 0 || r.op >= TB_OP_COUNT || r.n_in < 0 || r.n_in > TB_MAX_INPUTS || r.n_out < 1 ||
            r.n_out > TB_MAX_OUTPUTS)
            goto bad;
        nd->op = (tb_op_kind)r.op; nd->n_in = r.n_in; nd->n_out = r.n_out; nd->tactic = r.tactic;
        for (int k = 0; k < r.n_in; k++) {
            if (r.in[k] < 0 || r.in[k] >= g->n_values) goto bad;
            nd->in[k] = r.in[k];
        }
        for (int k = 0; k < r.n_out; k++) {
            if (r.out[k] < 0 || r.out[k] >= g->n_values) goto bad;
            nd->out[k] = r.out[k];
        }
        memcpy(nd->i, r.i, sizeof nd->i);
        memcpy(nd->f, r.f, sizeof nd->f);
        g->n_nodes++;
    }
    int32_t o;
    TAKE(&o, 4);
    g->output = o;
    int32_t io[2 + 2 * TB_MAX_IO];
    TAKE(io, sizeof io);
    if (io[0] < 0 || io[0] > TB_MAX_IO || io[1] < 0 || io[1] > TB_MAX_IO) goto bad;
    g->n_inputs = io[0];
    g->n_outputs = io[1];
    for (int i = 0; i < TB_MAX_IO; i++) { g->inputs[i] = io[2 + i]; g->outputs[i] = io[2 + TB_MAX_IO + i]; }
    if (tb_graph_check(g) != TB_OK) {
        tb_graph_free(g);
        return tb_error_prefix(TB_ERR_FORMAT, "engine graph is inconsistent");
    }
    *out = g;
    return TB_OK;
#undef TAKE
truncated:
    tb_graph_free(g);
    return tb_errorf(TB_ERR_FORMAT, "engine graph section is truncated");
bad:
    tb_graph_free(g);
    return tb_errorf(TB_ERR_FORMAT, "engine graph section is corrupted");
oom:
    tb_graph_free(g);
    return tb_errorf(TB_ERR_OOM, "out of memory loading the graph");
}
