/*
 * llm_fuse.c — the LLM fusion passes. The Llama-family builder emits plain
 * ops (separate q/k/v and gate/up projections, silu and mul, add and
 * rmsnorm); these passes turn them into the fused ops the backends run:
 *
 *   add_rmsnorm    add -> rmsnorm                       => add_rmsnorm
 *   silu_mul       emul(silu(g), u)                      => silu_mul(concat_cols(g, u))
 *   concat_matmul  concat_cols(matmul(x, w1[, b1]), ...) => matmul(x, [w1; ...][, [b1; ...]])
 *
 * (concat_matmul merges q|k|v before attention and gate|up after silu_mul.)
 * A value that replaces others takes the place of the first of them in the
 * value list, and the fused outputs are named as tb_graph_add_node names
 * them: the fused graph is value for value the one a builder emitting fused
 * ops directly would make, so the engine (graph and weight layout) is too.
 */
#include "opt/opt.h"
#include "ir/ops.h"

/* ---------------------------------------------------------------- helpers */

/* Moves value v to index pos (<= v), shifting [pos, v) up by one, and
 * renumbers every reference to them. */
static void move_value(tb_graph *g, int v, int pos) {
    if (pos >= v) return;
    tb_value x = g->values[v];
    memmove(&g->values[pos + 1], &g->values[pos], (size_t)(v - pos) * sizeof x);
    g->values[pos] = x;
#define REMAP(i) ((i) == v ? pos : (i) >= pos && (i) < v ? (i) + 1 : (i))
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        for (int i = 0; i < n->n_in; i++) n->in[i] = REMAP(n->in[i]);
        for (int o = 0; o < n->n_out; o++) n->out[o] = REMAP(n->out[o]);
    }
    if (g->output >= 0) g->output = REMAP(g->output);
    for (int i = 0; i < g->n_inputs; i++) g->inputs[i] = REMAP(g->inputs[i]);
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = REMAP(g->outputs[i]);
#undef REMAP
}

/* The name of a value made of `vals`: their common prefix, then what follows
 * it in each ("l0.wq", "l0.wk", "l0.wv" -> "l0.wqkv"). */
static void joined_name(const tb_graph *g, const int *vals, int n, char out[TB_NAME_LEN]) {
    const char *a = g->values[vals[0]].name;
    size_t p = strlen(a);
    for (int i = 1; i < n; i++) {
        const char *b = g->values[vals[i]].name;
        size_t j = 0;
        while (j < p && a[j] == b[j]) j++;
        p = j;
    }
    size_t w = p < TB_NAME_LEN - 1 ? p : TB_NAME_LEN - 1;
    memcpy(out, a, w);
    for (int i = 0; i < n; i++)
        for (const char *s = g->values[vals[i]].name + p; *s && w < TB_NAME_LEN - 1; s++) out[w++] = *s;
    out[w] = 0;
}

/* A new weight: the parts (equal dtype, rank and trailing dims) stacked
 * along dim 0, at the index of the first part. Returns that index or -1. */
static int stack_weights(tb_graph *g, const int *parts, int n) {
    const tb_value *p0 = &g->values[parts[0]];
    int64_t dims[TB_MAX_RANK];
    memcpy(dims, p0->dims, sizeof dims);
    uint64_t bytes = 0;
    int first = parts[0];
    dims[0] = 0;
    for (int i = 0; i < n; i++) {
        dims[0] += g->values[parts[i]].dims[0];
        bytes += g->values[parts[i]].nbytes;
        if (parts[i] < first) first = parts[i];
    }
    /* owned buffers are freed with free() */
    uint8_t *buf = malloc(bytes ? (size_t)bytes : 1);
    if (!buf) { tb_errorf(TB_ERR_OOM, "out of memory stacking weights"); return -1; }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const tb_value *p = &g->values[parts[i]];
        memcpy(buf + off, p->data, (size_t)p->nbytes);
        off += p->nbytes;
    }
    char name[TB_NAME_LEN];
    joined_name(g, parts, n, name);
    int w = tb_graph_add_weight(g, name, p0->dtype, p0->rank, dims, buf, 1);
    if (w < 0) return -1;
    move_value(g, w, first);
    return first;
}

/* Writes the shapes node k's rule gives into its output values (after the
 * node was rewritten in place). */
static tb_status reshape_outputs(tb_graph *g, int k) {
    tb_op_shape sh;
    TB_TRY(tb_op_infer(g, &g->nodes[k], &sh));
    for (int o = 0; o < sh.n_out; o++) {
        tb_value *v = &g->values[g->nodes[k].out[o]];
        v->rank = sh.rank[o];
        v->dtype = sh.dtype[o];
        memset(v->dims, 0, sizeof v->dims);
        memcpy(v->dims, sh.dims[o], sizeof(int64_t) * (size_t)sh.rank[o]);
    }
    return TB_OK;
}

static void report(tb_pass_report *r, const char *what) {
    if (r->changes) snprintf(r->what, sizeof r->what, "%d %s", r->changes, what);
}

/* ---------------------------------------------------------------- add_rmsnorm */

static tb_status pass_add_rmsnorm(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || n->op != TB_OP_RMSNORM) continue;
        int p = tb_opt_producer(g, n->in[0]);
        if (p < 0 || g->nodes[p].op != TB_OP_ADD || g->values[n->in[0]].rank != 2) continue;
        tb_node f = g->nodes[p];
        f.op = TB_OP_ADD_RMSNORM;
        f.n_in = 3;
        f.in[2] = n->in[1];
        f.n_out = 2;
        f.out[1] = n->out[0];
        memset(f.i, 0, sizeof f.i);
        memcpy(f.f, n->f, sizeof f.f);
        tb_op_shape sh;
        if (tb_op_infer(g, &f, &sh) != TB_OK) { tb_error_clear(); continue; }
        g->nodes[p] = f;
        /* outputs named as tb_graph_add_node names a node's: NAME, NAME.1 */
        char nm[TB_NAME_LEN + 4];
        snprintf(nm, sizeof nm, "%s.1", g->values[f.out[0]].name);
        char *dst = g->values[f.out[1]].name; /* serialized whole: no stale bytes after the NUL */
        memset(dst, 0, TB_NAME_LEN);
        snprintf(dst, TB_NAME_LEN, "%.*s", TB_NAME_LEN - 1, nm);
        tb_opt_kill(g, k);
        r->changes++;
    }
    report(r, "add + rmsnorm -> add_rmsnorm");
    return TB_OK;
}

/* ---------------------------------------------------------------- silu_mul */

static tb_status pass_silu_mul(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    for (int k = 0; k < g->n_nodes; k++) {
        if (tb_opt_dead(&g->nodes[k]) || g->nodes[k].op != TB_OP_EMUL) continue;
        for (int side = 0; side < 2; side++) {
            const tb_node *m = &g->nodes[k];
            int sv = m->in[side], up = m->in[1 - side];
            int sp = tb_opt_producer(g, sv);
            if (sp < 0 || g->nodes[sp].op != TB_OP_SILU || tb_opt_uses(g, sv) != 1) continue;
            int gate = g->nodes[sp].in[0];
            const tb_value *gv = &g->values[gate];
            if (gv->rank != 2 || g->values[up].rank != 2 || gv->dims[1] != g->values[up].dims[1]) continue;
            char name[TB_NAME_LEN];
            int parts[2] = {gate, up};
            joined_name(g, parts, 2, name);
            const char *names[1] = {name};
            int at = tb_opt_insert_node(g, k, TB_OP_CONCAT_COLS, parts, 2, names, 1, NULL, NULL);
            if (at < 0) return tb_last_status();
            /* the concatenation takes the place of silu's output */
            move_value(g, g->nodes[k].out[0], sv);
            tb_node *mm = &g->nodes[k + 1];
            mm->op = TB_OP_SILU_MUL;
            mm->n_in = 1;
            mm->in[0] = g->nodes[k].out[0];
            mm->in[1] = 0;
            tb_opt_kill(g, sp);
            TB_TRY(reshape_outputs(g, k + 1));
            r->changes++;
            k++;
            break;
        }
    }
    report(r, "silu + emul -> silu_mul over concat_cols");
    return TB_OK;
}

/* ---------------------------------------------------------------- concat_matmul */

void tb_opt_joined_name(const tb_graph *g, const int *vals, int n, char out[TB_NAME_LEN]) {
    joined_name(g, vals, n, out);
}

/* The weights of matmul / qmatmul node m stacked by the merge, in order:
 * matmul: w [, bias]; qmatmul: codes, scales [, bias] [, zeros]. */
static int merge_parts(const tb_node *m, int *w) {
    int n = 0;
    for (int i = 1; i < m->n_in; i++) w[n++] = m->in[i];
    return n;
}

tb_status tb_opt_merge_concat_matmul(tb_graph *g, tb_pass_report *r) {
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *c = &g->nodes[k];
        if (tb_opt_dead(c) || c->op != TB_OP_CONCAT_COLS) continue;
        int n = c->n_in, mk[TB_MAX_INPUTS] = {0}, ok = 1;
        /* parts[j][i]: the j-th weight input of part i */
        int parts[TB_MAX_INPUTS][TB_MAX_INPUTS], n_w = 0;
        for (int i = 0; i < n && ok; i++) {
            int p = tb_opt_producer(g, c->in[i]);
            ok = p >= 0 && (g->nodes[p].op == TB_OP_MATMUL || g->nodes[p].op == TB_OP_QMATMUL) &&
                 tb_opt_uses(g, c->in[i]) == 1;
            if (!ok) break;
            mk[i] = p;
            const tb_node *m = &g->nodes[p], *m0 = &g->nodes[mk[0]];
            int w[TB_MAX_INPUTS], nw = merge_parts(m, w);
            if (i == 0) n_w = nw;
            /* one input, one op, the same flags and dtypes, weights with equal trailing dims */
            ok = m->in[0] == m0->in[0] && m->op == m0->op && nw == n_w && !memcmp(m->i, m0->i, sizeof m->i) &&
                 !memcmp(m->f, m0->f, sizeof m->f);
            for (int j = 0; j < nw && ok; j++) {
                parts[j][i] = w[j];
                const tb_value *v = &g->values[w[j]], *v0 = &g->values[parts[j][0]];
                ok = v->kind == TB_VAL_WEIGHT && v->dtype == v0->dtype && v->rank == v0->rank &&
                     (v->rank < 2 || v->dims[1] == v0->dims[1]);
            }
            /* a plain matmul's first weight is rank 2 */
            ok = ok && g->values[w[0]].rank == 2;
        }
        if (!ok) continue;
        /* stack each weight list; a stacked value takes the index of its
         * first part, shifting the values from there up by one */
        int stacked[TB_MAX_INPUTS];
        for (int j = 0; j < n_w; j++) {
            int at = stack_weights(g, parts[j], n);
            if (at < 0) return tb_last_status();
            /* the parts are copied: free them now rather than when the pass
             * ends (tb_opt_compact), or a model's worth of merged weights
             * would exist twice; a part read elsewhere too stays */
            for (int i = 0; i < n; i++) {
                tb_value *pv = &g->values[parts[j][i] >= at ? parts[j][i] + 1 : parts[j][i]];
                if (tb_opt_uses(g, (int)(pv - g->values)) != 1) continue;
                if (pv->owned) {
                    free((void *)pv->data);
                    pv->data = NULL;
                    pv->owned = 0;
                } else { /* borrowed from the mapped source (models.h source_weights) */
                    tb_file_release_pages(pv->data, (size_t)pv->nbytes);
                }
            }
            for (int jj = j + 1; jj < n_w; jj++)
                for (int i = 0; i < n; i++) if (parts[jj][i] >= at) parts[jj][i]++;
            for (int jj = 0; jj < j; jj++) if (stacked[jj] >= at) stacked[jj]++;
            stacked[j] = at;
        }
        tb_node *cn = &g->nodes[k];
        const tb_node *m0 = &g->nodes[mk[0]];
        int x = m0->in[0];
        tb_op_kind op = m0->op;
        int32_t ia[TB_NODE_INTS];
        float fa[TB_NODE_FLOATS];
        memcpy(ia, m0->i, sizeof ia);
        memcpy(fa, m0->f, sizeof fa);
        memset(cn->in, 0, sizeof cn->in);
        cn->op = op;
        cn->n_in = 1 + n_w;
        cn->in[0] = x;
        for (int j = 0; j < n_w; j++) cn->in[1 + j] = stacked[j];
        memcpy(cn->i, ia, sizeof ia);
        memcpy(cn->f, fa, sizeof fa);
        if (op == TB_OP_QMATMUL) /* scales and zeros are named after the codes, as the quantize pass names them */
            for (int j = 1; j < n_w; j++) {
                tb_value *v = &g->values[stacked[j]];
                const char *suffix = strrchr(v->name, '.');
                if (!suffix || g->values[stacked[j]].rank != 2) continue; /* the bias keeps its joined name */
                char nm[TB_NAME_LEN];
                snprintf(nm, sizeof nm, "%.80s%s", g->values[stacked[0]].name,
                         j == n_w - 1 && tb_node_attr_i(cn, TB_QMM_HAS_ZEROS) ? ".zeros" : ".scales");
                snprintf(v->name, sizeof v->name, "%s", nm);
            }
        for (int i = 0; i < n; i++) tb_opt_kill(g, mk[i]);
        TB_TRY(reshape_outputs(g, k));
        r->changes++;
    }
    report(r, "concatenated matmuls merged into one");
    return TB_OK;
}

static tb_status pass_concat_matmul(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    /* a quantized build merges after quantizing (tb_opt_quantize): stacking
     * the source weights first would hold them converted, all at once */
    if (o && o->quant) return TB_OK;
    return tb_opt_merge_concat_matmul(g, r);
}

/* ---------------------------------------------------------------- pipeline */

static const tb_pass llm_passes[] = {
    {"llm_add_rmsnorm", pass_add_rmsnorm, "add -> rmsnorm becomes add_rmsnorm"},
    {"llm_silu_mul", pass_silu_mul, "emul(silu(g), u) becomes silu_mul(concat_cols(g, u))"},
    {"llm_concat_matmul", pass_concat_matmul,
     "concat_cols of matmuls of one input becomes one matmul over the stacked weights (q|k|v, gate|up)"},
    {"cuda_fuse", tb_opt_cuda_fuse,
     "--device cuda: marks the pairs the CUDA backend fuses and folds RMSNorm weights into the next matmul"},
    {"quantize", tb_opt_quantize,
     "--dtype int8|int4|fp8 (and --override): each weight gets its dtype; quantized matmuls become qmatmul"},
    {"cuda_fuse_quant", tb_opt_cuda_fuse_quant,
     "--device cuda with --dtype int8|int4|fp8 (or --override): cuda_fuse on the quantized graph, norm weights "
     "read by the GEMVs rather than folded"},
};

const tb_pass *tb_opt_llm_pipeline(int *n) {
    *n = (int)(sizeof llm_passes / sizeof llm_passes[0]);
    return llm_passes;
}
