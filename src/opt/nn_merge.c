/* nn_merge.c — passes that cut the kernel count of exported transformers
 * around the fused attention (sdpa), for backends whose sdpa reads the heads
 * layout (ops_nn.h: i[3] heads, i[4] packed):
 *
 *   attention-heads  X (B, S, H*D) -> Reshape (B, S, H, D) -> Transpose
 *                    (0, 2, 1, 3) -> sdpa -> Transpose (0, 2, 1, 3) ->
 *                    Reshape (B, S, H*Dv) becomes one sdpa reading X and
 *                    writing (B, S, H*Dv): the head split / merge copies go
 *                    (k's split may be the (0, 2, 3, 1) Transpose of a
 *                    k-transposed sdpa).
 *   merge-qkv        the three MatMuls [+ bias] writing that sdpa's q, k, v
 *                    from one input with constant weights of one width
 *                    become one MatMul over the concatenated weights and
 *                    biases, and the sdpa reads q | k | v as column blocks of
 *                    its (B, S, 3*H*D) output (packed): two matmul kernels a
 *                    layer fewer and one wider product. Where q, k, v are
 *                    already the three equal parts of a Split of one
 *                    product (GPT-2's c_attn), the sdpa reads that product
 *                    packed and the Split goes.
 *
 * The CUDA backend runs both layouts through strides (nn_backend.c
 * run_sdpa_heads), and so does the CPU kernel (backend/cpu/nn_conv.c
 * sdpa_kernel: its two products take the layout's row strides). Both
 * backends take the passes: on the CPU (2 threads, a Zen 4 host,
 * docs/PERFORMANCE.md 2026-12-03 16:14) BERT-base with them (one N 2304
 * projection GEMM a layer, no head Transposes) beat the engine without them
 * in 9 of 12 alternating rounds at batch 1 and 3 of 4 at batch 8, ~1-3% in
 * the medians (an earlier A/B on a loaded machine, 2026-12-02 04:00, could
 * not tell them apart). The reference kernel, which the pass tests
 * compare, reads every layout. */
#include <string.h>

#include "opt/opt.h"

/* the backends the layouts are made for (see above) */
static int for_backend(const tb_opt_options *o) { return o && (!strcmp(o->device, "cuda") || !strcmp(o->device, "cpu")); }

/* Whether dims a and b are the same (equal known numbers or symbols, or
 * symbols fixed by the profile to equal numbers). */
static int dim_eq(const tb_graph *g, int64_t a, int64_t b) {
    int64_t fa, fb;
    if (a == TB_DIM_DYN || b == TB_DIM_DYN) return 0;
    if (a == b) return 1;
    return tb_opt_fixed_dim(g, a, &fa) && tb_opt_fixed_dim(g, b, &fb) && fa == fb;
}

static int fixed(const tb_graph *g, int64_t d, int64_t *out) { return d != TB_DIM_DYN && tb_opt_fixed_dim(g, d, out); }

static int is_perm(const tb_node *t, int a, int b, int c, int d) {
    return t->i[0] == a && t->i[1] == b && t->i[2] == c && t->i[3] == d;
}

/* tb_opt_node_fits, where dims may also be equal by the profile (a symbol
 * fixed to a number) or, for a dim of `like` the shape rules left
 * TB_DIM_DYN (a Reshape to a computed shape), by the index; such dims of
 * `like` take the candidate's. */
static int fits(tb_graph *g, const tb_opt_index *ix, const tb_node *cand, int like) {
    tb_op_shape sh;
    if (tb_op_infer(g, cand, &sh) != TB_OK) {
        tb_error_clear();
        return 0;
    }
    tb_value *y = &g->values[like];
    if (sh.n_out != 1 || sh.rank[0] != y->rank || sh.dtype[0] != y->dtype) return 0;
    for (int i = 0; i < y->rank; i++)
        if (sh.dims[0][i] != y->dims[i] && !dim_eq(g, sh.dims[0][i], y->dims[i]) &&
            !(y->dims[i] == TB_DIM_DYN && like < ix->n_values && dim_eq(g, sh.dims[0][i], ix->dims[like][i])))
            return 0;
    for (int i = 0; i < y->rank; i++)
        if (y->dims[i] == TB_DIM_DYN) y->dims[i] = sh.dims[0][i];
    return 1;
}

/* v = Transpose(perm)(Reshape(X)) read only by node `reader`, X (B, S, H*D)
 * split into (B, S, H, D): X, with the two nodes in kill[0..1]; -1 if not. */
static int head_split(const tb_graph *g, const tb_opt_index *ix, int v, int reader, int k_t, int64_t H, int *kill) {
    int t = tb_opt_producer_op(g, ix, v, TB_OP_TRANSPOSE);
    if (t < 0 || tb_opt_single_reader(g, ix, v) != reader || g->values[v].rank != 4) return -1;
    const tb_node *tn = &g->nodes[t];
    if (!(k_t ? is_perm(tn, 0, 2, 3, 1) : is_perm(tn, 0, 2, 1, 3))) return -1;
    int r4 = tn->in[0];
    int rs = tb_opt_producer_op(g, ix, r4, TB_OP_RESHAPE);
    if (rs < 0 || tb_opt_single_reader(g, ix, r4) != t || g->values[r4].rank != 4) return -1;
    int x = g->nodes[rs].in[0];
    if (g->values[x].rank != 3 || g->values[x].dtype != g->values[v].dtype) return -1;
    const int64_t *rd = ix->dims[r4], *xd = ix->dims[x];
    int64_t h, d, c;
    if (!dim_eq(g, rd[0], xd[0]) || !dim_eq(g, rd[1], xd[1])) return -1;
    if (!fixed(g, rd[2], &h) || h != H || !fixed(g, rd[3], &d) || !fixed(g, xd[2], &c) || c != h * d) return -1;
    kill[0] = t;
    kill[1] = rs;
    return x;
}

static int heads_at(tb_graph *g, const tb_opt_index *ix, int k) {
    const tb_node *n = &g->nodes[k];
    if (n->op != TB_OP_SDPA || n->i[3] != 0 || n->n_in < 3 || n->n_out != 1) return 0;
    int y = n->out[0];
    if (g->values[n->in[0]].rank != 4 || g->values[y].rank != 4) return 0;
    int64_t H, Dv;
    if (!fixed(g, ix->dims[n->in[0]][1], &H) || H <= 0 || H > 65535) return 0;
    int kill[8], nk = 0, x[3];
    for (int j = 0; j < 3; j++) {
        x[j] = head_split(g, ix, n->in[j], k, j == 1 && n->i[1], H, kill + nk);
        if (x[j] < 0) return 0;
        nk += 2;
    }
    /* the merge: Transpose (0, 2, 1, 3) -> Reshape (B, S, H*Dv) */
    int to = tb_opt_single_reader(g, ix, y);
    if (to < 0 || g->nodes[to].op != TB_OP_TRANSPOSE || !is_perm(&g->nodes[to], 0, 2, 1, 3)) return 0;
    int tv = g->nodes[to].out[0];
    int ro = tb_opt_single_reader(g, ix, tv);
    if (ro < 0 || g->nodes[ro].op != TB_OP_RESHAPE) return 0;
    int out = g->nodes[ro].out[0];
    const int64_t *yd = ix->dims[y], *od = ix->dims[out];
    int64_t w;
    if (g->values[out].rank != 3 || !fixed(g, yd[3], &Dv) || !dim_eq(g, od[0], yd[0]) || !dim_eq(g, od[1], yd[2]) ||
        !fixed(g, od[2], &w) || w != H * Dv)
        return 0;
    tb_node c = *n;
    c.in[0] = x[0];
    c.in[1] = x[1];
    c.in[2] = x[2];
    c.i[1] = 0;
    c.i[3] = (int32_t)H;
    c.i[4] = 0;
    c.out[0] = out;
    if (!fits(g, ix, &c, out)) return 0;
    kill[nk++] = k;
    kill[nk++] = to;
    tb_opt_place(g, ro, &c, out);
    for (int i = 0; i < nk; i++) tb_opt_kill(g, kill[i]);
    return 1;
}

/* ---------------------------------------------------------------- merge-qkv */

/* MatMul node m as a projection: a (rank 3), constant f32 weight (K, N) or
 * (N, K) with trans_b, [constant f32 bias (N)], no activation, no residual.
 * Writes N. */
static int projection(const tb_graph *g, const tb_node *m, int64_t *N) {
    if (m->op != TB_OP_NN_MATMUL || m->i[0] || m->i[2] || (m->i[3] & ~TB_NN_HAS_BIAS)) return 0;
    int has_bias = (m->i[3] & TB_NN_HAS_BIAS) != 0;
    if (m->n_in != 2 + has_bias) return 0;
    const tb_value *b = &g->values[m->in[1]];
    if (b->rank != 2 || !tb_opt_weight_f32(g, m->in[1])) return 0;
    *N = b->dims[m->i[1] ? 0 : 1];
    if (has_bias) {
        const tb_value *c = &g->values[m->in[2]];
        if (c->rank != 1 || c->dims[0] != *N || !tb_opt_weight_f32(g, m->in[2])) return 0;
    }
    return *N > 0;
}

static int same_projection(const tb_node *a, const tb_node *b) {
    return a->in[0] == b->in[0] && a->i[1] == b->i[1] && a->i[3] == b->i[3] && a->f[0] == b->f[0] && a->n_in == b->n_in;
}

/* q, k, v already one product split in three (GPT-2's c_attn): outputs 0,
 * 1, 2 of a Split of P (B, S, 3C) along its last axis into equal parts,
 * read by sdpa node k alone. The sdpa reads P packed; the Split goes. */
static int split_at(tb_graph *g, const tb_opt_index *ix, int k) {
    const tb_node *n = &g->nodes[k];
    int sp = tb_opt_producer_op(g, ix, n->in[0], TB_OP_SPLIT);
    if (sp < 0) return 0;
    const tb_node *s = &g->nodes[sp];
    int p = s->in[0];
    int64_t c, w;
    if (s->n_out != 3 || g->values[p].rank != 3 || s->i[0] != 2 || !fixed(g, ix->dims[p][2], &w)) return 0;
    for (int j = 0; j < 3; j++)
        if (s->out[j] != n->in[j] || tb_opt_single_reader(g, ix, n->in[j]) != k ||
            !fixed(g, ix->dims[n->in[j]][2], &c) || 3 * c != w)
            return 0;
    tb_node cand = *n;
    cand.in[0] = cand.in[1] = cand.in[2] = p;
    cand.i[4] = 1;
    if (!fits(g, ix, &cand, n->out[0])) return 0;
    tb_opt_place(g, k, &cand, cand.out[0]);
    tb_opt_kill(g, sp);
    return 1;
}

static int merge_at(tb_graph *g, const tb_opt_index *ix, int k) {
    const tb_node *n = &g->nodes[k];
    if (n->op != TB_OP_SDPA || n->i[3] <= 0 || n->i[4] || n->n_out != 1) return 0;
    if (split_at(g, ix, k)) return 1;
    int m[3];
    int64_t N[3];
    for (int j = 0; j < 3; j++) {
        int v = n->in[j];
        for (int i = 0; i < j; i++)
            if (n->in[i] == v) return 0;
        m[j] = tb_opt_producer_op(g, ix, v, TB_OP_NN_MATMUL);
        if (m[j] < 0 || tb_opt_single_reader(g, ix, v) != k || !projection(g, &g->nodes[m[j]], &N[j])) return 0;
        if (j && (!same_projection(&g->nodes[m[0]], &g->nodes[m[j]]) || N[j] != N[0])) return 0;
    }
    const tb_node *m0 = &g->nodes[m[0]];
    int tb = m0->i[1], has_bias = (m0->i[3] & TB_NN_HAS_BIAS) != 0;
    int64_t C = N[0], K = g->values[m0->in[1]].dims[tb ? 1 : 0];
    for (int j = 1; j < 3; j++)
        if (g->values[g->nodes[m[j]].in[1]].dims[tb ? 1 : 0] != K) return 0;
    /* the concatenated weight: (K, 3C) row by row, or (3C, K) block by block */
    float *w = malloc(sizeof(float) * (size_t)(K * 3 * C));
    float *bias = has_bias ? malloc(sizeof(float) * (size_t)(3 * C)) : NULL;
    if (!w || (has_bias && !bias)) { free(w); free(bias); return 0; }
    for (int j = 0; j < 3; j++) {
        const float *wj = tb_opt_weight_f32(g, g->nodes[m[j]].in[1]);
        if (tb) memcpy(w + (size_t)(j * C * K), wj, sizeof(float) * (size_t)(C * K));
        else
            for (int64_t r = 0; r < K; r++)
                memcpy(w + (size_t)(r * 3 * C + j * C), wj + (size_t)(r * C), sizeof(float) * (size_t)C);
        if (has_bias) memcpy(bias + j * C, tb_opt_weight_f32(g, g->nodes[m[j]].in[2]), sizeof(float) * (size_t)C);
    }
    char name[TB_NAME_LEN];
    int64_t wd[2] = {tb ? 3 * C : K, tb ? K : 3 * C}, bd[1] = {3 * C};
    snprintf(name, sizeof name, "%.*s.qkv_w", TB_NAME_LEN - 8, g->values[n->in[0]].name);
    int wv = tb_opt_add_weight_f32(g, name, 2, wd, w);
    if (wv < 0) { free(bias); tb_error_clear(); return 0; }
    int bv = -1;
    if (has_bias) {
        snprintf(name, sizeof name, "%.*s.qkv_b", TB_NAME_LEN - 8, g->values[n->in[0]].name);
        bv = tb_opt_add_weight_f32(g, name, 1, bd, bias);
        if (bv < 0) { tb_error_clear(); return 0; } /* the unused weight goes with the next compaction */
    }
    int pos = m[0] < m[1] ? m[0] : m[1];
    if (m[2] < pos) pos = m[2];
    int in[3] = {m0->in[0], wv, bv};
    int32_t ia[TB_NODE_INTS];
    float fa[TB_NODE_FLOATS];
    memcpy(ia, m0->i, sizeof ia);
    memcpy(fa, m0->f, sizeof fa);
    snprintf(name, sizeof name, "%.*s.qkv", TB_NAME_LEN - 8, g->values[n->in[0]].name);
    const char *nm = name;
    int p = tb_opt_insert_node(g, pos, TB_OP_NN_MATMUL, in, has_bias ? 3 : 2, &nm, 1, ia, fa);
    if (p < 0) { tb_error_clear(); return 0; }
    int qkv = g->nodes[p].out[0];
    k++;
    for (int j = 0; j < 3; j++) m[j] += m[j] >= p;
    tb_node c = g->nodes[k];
    c.in[0] = c.in[1] = c.in[2] = qkv;
    c.i[4] = 1;
    if (!tb_opt_node_fits(g, &c, c.out[0])) {
        tb_opt_kill(g, p); /* the unread product goes with the compaction */
        return 0;
    }
    tb_opt_place(g, k, &c, c.out[0]);
    for (int j = 0; j < 3; j++) tb_opt_kill(g, m[j]);
    return 1;
}

typedef int (*at_fn)(tb_graph *g, const tb_opt_index *ix, int k);

/* After a rewrite the new sdpa may give a dim as a symbol the profile fixes
 * where the value held its number (or the other way round): the values
 * downstream take what the rules say wherever the rules know the dim (dims
 * the rules leave TB_DIM_DYN keep what the values know). */
static tb_status sync_dims(tb_graph *g) {
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n)) continue;
        tb_op_shape sh;
        tb_status s = tb_op_infer(g, n, &sh);
        if (s != TB_OK) return tb_error_prefix(s, "node %d (%s)", k, tb_op_name(n->op));
        for (int o = 0; o < n->n_out && o < sh.n_out; o++) {
            tb_value *y = &g->values[n->out[o]];
            if (y->rank != sh.rank[o]) continue;
            for (int d = 0; d < y->rank; d++)
                if (sh.dims[o][d] != TB_DIM_DYN) y->dims[d] = sh.dims[o][d];
        }
    }
    return TB_OK;
}

static tb_status run_at(tb_graph *g, at_fn fn, int *count) {
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    *count = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        if (tb_opt_dead(&g->nodes[k])) continue;
        int before = g->n_nodes, done = fn(g, &ix, k);
        *count += done;
        if (!done && g->n_nodes == before) continue;
        if (g->n_nodes != before) k += g->n_nodes - before; /* the node at k moved on */
        tb_opt_index_free(&ix);
        if (done) TB_TRY(sync_dims(g));
        TB_TRY(tb_opt_index_build(g, &ix));
    }
    tb_opt_index_free(&ix);
    return TB_OK;
}

tb_status tb_opt_attention_heads(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    if (!for_backend(o)) {
        snprintf(r->what, sizeof r->what, "not for this backend");
        return TB_OK;
    }
    TB_TRY(run_at(g, heads_at, &r->changes));
    snprintf(r->what, sizeof r->what, "%d sdpa read (B, S, H*D) and write (B, S, H*Dv): %d head Transposes gone",
             r->changes, 4 * r->changes);
    return TB_OK;
}

tb_status tb_opt_merge_qkv(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    if (!for_backend(o)) {
        snprintf(r->what, sizeof r->what, "not for this backend");
        return TB_OK;
    }
    TB_TRY(run_at(g, merge_at, &r->changes));
    snprintf(r->what, sizeof r->what, "%d sdpa read q / k / v packed: MatMul triples merged into one, or a Split "
             "of one product read directly", r->changes);
    return TB_OK;
}
