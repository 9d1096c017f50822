/*
 * llm_quant.c — the quantize pass: the last pass of the LLM pipeline.
 *
 * A build with --dtype int8|int4|fp8 (or with --override) makes the graph
 * from the source's own tensors (models.h: source_weights), so nothing is
 * converted twice and the whole model is never held converted. This pass
 * then gives each matmul and embedding weight its dtype, one weight at a
 * time:
 *
 *   float dtype    converted in place (f32, f16, bf16)
 *   i8, i4, fp8    the matmul becomes qmatmul(x, codes, scales[, bias][, zeros])
 *                  with the encodings of core/quant.h (round to nearest)
 *
 * It runs last. In a quantized build the q|k|v and gate|up merge
 * (tb_opt_merge_concat_matmul) is left to it: it quantises each part in
 * place, then merges codes, scales, zeros and biases into the fused
 * weights. That equals quantising the merged weights (every scale belongs
 * to one output row; int4 groups never straddle rows) without ever stacking
 * the source weights. A weight is read from its source in row chunks and
 * the source pages are given back to the kernel as soon as it is done, so
 * the peak is the quantized model plus one chunk.
 *
 * Defaults keep accuracy: the embedding table stays f16 when the matmuls are
 * quantized, the LM head f16 in int8 and fp8 engines and int8 in int4
 * engines (measured in docs/PERFORMANCE.md; --override lm_head=f16 gives
 * the f16 head back), norms and
 * biases stay f32 (the builder makes them so). An int4 matmul whose K is not
 * a whole number of groups falls back to int8 (reported).
 *
 * Calibration hooks (tb_quant_calib): a static activation scale per matmul
 * input (stored in qmatmul's act_scale) and AWQ per-input-channel
 * multipliers s: the weight is quantised as W diag(s) and the input divided
 * by s, folded into what writes it. With tb_quant_options.awq the
 * multipliers are searched here, once per group on the whole group's weight:
 *
 *   q|k|v, gate|up  an RMSNorm feeds them (the parts share one s): 1 / s
 *                   folds into the norm weight
 *   wo              reads the attention output, a per-head linear mix of v:
 *                   1 / s folds into wv's rows (one multiplier per v channel,
 *                   shared by the query heads of one kv head)
 *   wdown           reads silu(gate) * up: 1 / s folds into wup's rows
 *
 * wo's and wdown's multipliers are searched before their feeder (wv, wup) is
 * quantised (when the pass reaches q|k|v or gate|up): the feeder becomes an
 * f32 copy with its rows divided, then is quantised with its own group.
 * With tb_quant_options.awq_clip every int4 weight then gets AWQ's clipping
 * (a clamp bound per output row and group, searched on the calibration
 * rows) applied before rounding.
 */
#include "opt/opt.h"
#include "core/quant.h"
#include "ir/ops.h"

#include <fnmatch.h>
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

tb_status tb_quant_parse_dtype(const char *s, tb_dtype *out) {
    static const struct { const char *name; tb_dtype dt; } names[] = {
        {"f32", TB_F32}, {"f16", TB_F16}, {"bf16", TB_BF16}, {"int8", TB_I8}, {"i8", TB_I8},
        {"int4", TB_I4}, {"i4", TB_I4}, {"fp8", TB_FP8_E4M3}, {"fp8_e4m3", TB_FP8_E4M3}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) { *out = names[i].dt; return TB_OK; }
    return tb_errorf(TB_ERR_INVALID_ARG, "unknown weight dtype '%.32s' (f32, f16, bf16, int8, int4, fp8)", s);
}

/* ---------------------------------------------------------------- overrides */

typedef struct {
    char glob[TB_NAME_LEN];
    tb_dtype dt;
    int hits;
} override;

static tb_status parse_overrides(const tb_quant_options *q, override *ov) {
    for (int i = 0; i < q->n_overrides; i++) {
        const char *s = q->overrides[i], *eq = strrchr(s, '=');
        if (!eq || eq == s || (size_t)(eq - s) >= TB_NAME_LEN)
            return tb_errorf(TB_ERR_INVALID_ARG, "--override '%.96s': want NAME_GLOB=DTYPE (e.g. 'lm_head=f16')", s);
        memcpy(ov[i].glob, s, (size_t)(eq - s));
        ov[i].glob[eq - s] = 0;
        TB_TRY(tb_quant_parse_dtype(eq + 1, &ov[i].dt));
        ov[i].hits = 0;
    }
    return TB_OK;
}

/* The dtype a weight gets: the last override matching its name or the name
 * of the fused weight it becomes (`fused`, or NULL), else dflt. */
static tb_dtype resolve(override *ov, int n, const char *name, const char *fused, tb_dtype dflt) {
    tb_dtype dt = dflt;
    for (int i = 0; i < n; i++)
        if (fnmatch(ov[i].glob, name, 0) == 0 || (fused && fnmatch(ov[i].glob, fused, 0) == 0)) {
            dt = ov[i].dt;
            ov[i].hits++;
        }
    return dt;
}

/* The name of the weight matmul k's weight becomes part of: the joined name
 * of the matmuls of one input whose outputs one concat_cols reads (the
 * q|k|v and gate|up merges, tb_opt_merge_concat_matmul), else its own. */
static void group_name(const tb_graph *g, int k, char out[TB_NAME_LEN]) {
    const tb_node *m = &g->nodes[k];
    snprintf(out, TB_NAME_LEN, "%s", g->values[m->in[1]].name);
    if (tb_opt_uses(g, m->out[0]) != 1) return;
    for (int j = 0; j < g->n_nodes; j++) {
        const tb_node *c = &g->nodes[j];
        if (tb_opt_dead(c) || c->op != TB_OP_CONCAT_COLS) continue;
        int mine = 0, all = 1, ws[TB_MAX_INPUTS];
        for (int i = 0; i < c->n_in; i++) {
            int p = tb_opt_producer(g, c->in[i]);
            all = all && p >= 0 && (g->nodes[p].op == TB_OP_MATMUL || g->nodes[p].op == TB_OP_QMATMUL) &&
                  g->nodes[p].in[0] == m->in[0];
            if (!all) break;
            ws[i] = g->nodes[p].in[1];
            mine |= p == k;
        }
        if (!mine) continue;
        if (all) tb_opt_joined_name(g, ws, c->n_in, out);
        return;
    }
}

/* ---------------------------------------------------------------- weights */

/* Gives the pages of a borrowed (mapped, read-only) source tensor back: the
 * pass has read it for the last time. Only whole pages inside it. */
static void release_source(const tb_value *v) {
    if (!v->owned) tb_file_release_pages(v->data, (size_t)v->nbytes);
}

/* Replaces the data of weight v (same shape) by buf (owned), releasing the old. */
static void set_data(tb_value *v, tb_dtype dt, void *buf, uint64_t nbytes) {
    if (v->owned) free((void *)v->data);
    else release_source(v);
    v->dtype = dt;
    v->data = buf;
    v->owned = 1;
    v->nbytes = nbytes;
}

/* Rows of weight v converted to a float dtype dt in a new buffer. */
static tb_status convert_copy(const tb_value *v, tb_dtype dt, void **out, uint64_t *nbytes) {
    TB_TRY(tb_dtype_tensor_bytes(dt, v->rank, v->dims, nbytes));
    void *buf = tb_alloc_aligned(*nbytes ? (size_t)*nbytes : 64, 64);
    if (!buf) return tb_errorf(TB_ERR_OOM, "out of memory converting %s", v->name);
    uint64_t n = 1;
    for (int d = 0; d < v->rank; d++) n *= (uint64_t)v->dims[d];
    tb_status s = tb_dtype_convert(v->data, v->dtype, buf, dt, (size_t)n);
    if (s != TB_OK) { free(buf); return tb_error_prefix(s, "weight %s", v->name); }
    *out = buf;
    return TB_OK;
}

/* Quantised form of weight v (N, K): codes, scales (N, K/group) and zeros
 * (asym), read from v in chunks of rows through an f32 buffer. in_scale: AWQ
 * multipliers (K) or NULL; bound: AWQ clip bounds (N, K/group) or NULL, each
 * group of w * in_scale clamped to +-bound first (as tb_awq_clip searched). */
static tb_status quantize_value(const tb_value *v, tb_dtype dt, int group, int asym, const float *in_scale,
                                const float *bound, uint8_t **codes, float **scales, float **zeros) {
    int N = (int)v->dims[0], K = (int)v->dims[1], G = K / group;
    uint64_t row_codes = tb_quant_codes_bytes(dt, 1, K);
    *codes = tb_alloc_aligned((size_t)tb_quant_codes_bytes(dt, N, K), 64);
    *scales = tb_alloc_aligned(sizeof(float) * (size_t)N * (size_t)G, 64);
    *zeros = asym ? tb_alloc_aligned(sizeof(float) * (size_t)N * (size_t)G, 64) : NULL;
    int chunk = (int)((4u << 20) / (sizeof(float) * (size_t)K)); /* rows per 4 MiB of f32 */
    if (chunk < 1) chunk = 1;
    if (chunk > N) chunk = N;
    float *rows = malloc(sizeof(float) * (size_t)chunk * (size_t)K);
    tb_status s = TB_OK;
    if (!*codes || !*scales || (asym && !*zeros) || !rows) {
        s = tb_errorf(TB_ERR_OOM, "out of memory quantizing %s", v->name);
        goto fail;
    }
    uint64_t src_row = tb_dtype_row_size(v->dtype, (uint64_t)K);
    for (int n0 = 0; n0 < N && s == TB_OK; n0 += chunk) {
        int m = N - n0 < chunk ? N - n0 : chunk;
        s = tb_dtype_convert((const uint8_t *)v->data + (uint64_t)n0 * src_row, v->dtype, rows, TB_F32,
                             (size_t)m * (size_t)K);
        if (s != TB_OK) break;
        uint8_t *c = *codes + (uint64_t)n0 * row_codes;
        float *sc = *scales + (size_t)n0 * (size_t)G, *z = asym ? *zeros + (size_t)n0 * (size_t)G : NULL;
        if (bound) { /* the product the search clipped, then the clamp */
            for (int r = 0; r < m; r++) {
                float *row = rows + (size_t)r * (size_t)K;
                const float *b = bound + (size_t)(n0 + r) * (size_t)G;
                for (int k = 0; k < K; k++) {
                    float x = in_scale ? row[k] * in_scale[k] : row[k], lim = b[k / group];
                    row[k] = x > lim ? lim : x < -lim ? -lim : x;
                }
            }
            s = tb_quantize_rows(dt, rows, m, K, group, asym, c, sc, z);
        } else {
            s = in_scale ? tb_quantize_rows_scaled(dt, rows, in_scale, m, K, group, asym, c, sc, z)
                         : tb_quantize_rows(dt, rows, m, K, group, asym, c, sc, z);
        }
    }
    free(rows);
    if (s == TB_OK) return TB_OK;
    tb_error_prefix(s, "quantizing %s", v->name);
fail:
    free(*codes); free(*scales); free(*zeros);
    *codes = NULL; *scales = NULL; *zeros = NULL;
    return tb_last_status();
}

/* The RMSNorm (or add_rmsnorm) weight that writes x when that norm feeds
 * only the matmuls of group `wname` (q|k|v, gate|up), else -1: where AWQ's
 * 1 / in_scale can be folded. wo reads the attention output and wdown the
 * SwiGLU product, which no norm writes, so they get -1. */
static int fold_target(const tb_graph *g, int x, const char *wname) {
    int p = tb_opt_producer(g, x);
    const tb_node *pn = p >= 0 ? &g->nodes[p] : NULL;
    int ok = pn && ((pn->op == TB_OP_RMSNORM && pn->out[0] == x) || (pn->op == TB_OP_ADD_RMSNORM && pn->out[1] == x));
    /* every reader of x is a matmul of this weight's group (q|k|v, gate|up) */
    for (int k = 0; ok && k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        int reads = 0;
        for (int i = 0; i < n->n_in; i++) reads |= n->in[i] == x;
        if (!reads || tb_opt_dead(n)) continue;
        char gn[TB_NAME_LEN] = "";
        if (n->op == TB_OP_MATMUL || n->op == TB_OP_QMATMUL) group_name(g, k, gn);
        ok = n->in[0] == x && !strcmp(gn, wname);
    }
    int wv = ok ? pn->in[pn->op == TB_OP_RMSNORM ? 1 : 2] : -1;
    if (!ok || tb_opt_uses(g, wv) != 1 || g->values[wv].dtype != TB_F32 || !g->values[wv].owned) return -1;
    return wv;
}

/* AWQ: the matmul reads x * diag(1 / in_scale) from here on, folded into
 * the norm weight fold_target finds. */
static tb_status fold_in_scale(tb_graph *g, int x, const float *in_scale, const char *wname, int *folded) {
    int wv = fold_target(g, x, wname);
    if (wv < 0)
        return tb_errorf(TB_ERR_UNSUPPORTED,
                         "input-channel scales for %s: its input is not written by an RMSNorm feeding only it to "
                         "fold them into", wname);
    if (*folded == wv) return TB_OK; /* another part of the same group: folded once */
    float *w = (float *)g->values[wv].data;
    for (int64_t k = 0; k < g->values[wv].dims[0]; k++) w[k] /= in_scale[k];
    *folded = wv;
    return TB_OK;
}

/* AWQ scales searched so far, one per weight group (the parts of a group
 * are quantised one by one and must share one in_scale). */
typedef struct {
    char name[TB_NAME_LEN];
    float *s;      /* (K), NULL: none (not searched, no calibration, no fold) */
    int searched;  /* the search ran (or was ruled out)                      */
    int prefolded; /* 1 / s already folded into the feeder's rows (wo, wdown) */
    int pre;       /* awq_prefold ran for this group                         */
} awq_entry;

typedef struct {
    awq_entry *e;
    int n, cap;
} awq_cache;

static void awq_cache_free(awq_cache *c) {
    for (int i = 0; i < c->n; i++) free(c->e[i].s);
    free(c->e);
}

static awq_entry *awq_find(awq_cache *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].name, name)) return &c->e[i];
    return NULL;
}

/* The entry of `name`, added when absent. The pointer lives until the next
 * awq_get (the array may move). */
static tb_status awq_get(awq_cache *c, const char *name, awq_entry **out) {
    if ((*out = awq_find(c, name))) return TB_OK;
    if (c->n == c->cap) {
        int nc = c->cap ? 2 * c->cap : 16;
        awq_entry *ne = realloc(c->e, sizeof *ne * (size_t)nc);
        if (!ne) return tb_errorf(TB_ERR_OOM, "out of memory");
        c->e = ne, c->cap = nc;
    }
    awq_entry *e = &c->e[c->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    *out = e;
    return TB_OK;
}

/* Searches the in_scale of group `name` that matmul k (input x, K channels)
 * is part of, over the whole group's weight (every live matmul of x in the
 * group, rows stacked in node order); tie as opt.h's awq hook. Into e (the
 * cache's entry of `name`); e->s stays NULL when the group has no
 * calibration. */
static tb_status awq_search_group(tb_graph *g, int k, const char *name, const tb_quant_options *q, const int *tie,
                                  int n_tie, awq_entry *e) {
    int x = g->nodes[k].in[0], K = (int)g->values[g->nodes[k].in[1]].dims[1];
    e->searched = 1;
    int64_t N = 0;
    for (int j = 0; j < g->n_nodes; j++) {
        const tb_node *n = &g->nodes[j];
        char gn[TB_NAME_LEN];
        if (tb_opt_dead(n) || n->op != TB_OP_MATMUL || n->in[0] != x) continue;
        group_name(g, j, gn);
        if (!strcmp(gn, name)) N += g->values[n->in[1]].dims[0];
    }
    float *w = malloc(sizeof(float) * (size_t)N * (size_t)K), *s = malloc(sizeof(float) * (size_t)K);
    if (!w || !s) { free(w); free(s); return tb_errorf(TB_ERR_OOM, "out of memory for the AWQ search of %s", name); }
    tb_status st = TB_OK;
    int64_t r = 0;
    for (int j = 0; j < g->n_nodes && st == TB_OK; j++) {
        const tb_node *n = &g->nodes[j];
        char gn[TB_NAME_LEN];
        if (tb_opt_dead(n) || n->op != TB_OP_MATMUL || n->in[0] != x) continue;
        group_name(g, j, gn);
        if (strcmp(gn, name)) continue;
        const tb_value *v = &g->values[n->in[1]];
        st = tb_dtype_convert(v->data, v->dtype, w + r * K, TB_F32, (size_t)v->dims[0] * (size_t)K);
        r += v->dims[0];
    }
    int found = 0;
    if (st == TB_OK) st = q->awq(q->awq_user, name, w, (int)N, K, q->group, q->asym, tie, n_tie, s, &found);
    free(w);
    if (st != TB_OK || !found) { free(s); return st; }
    e->s = s;
    return TB_OK;
}

/* The matmul whose weight's rows write matmul k's input channels linearly,
 * or -1: wv for wo (attention mixes v's channels per head over positions,
 * nothing else touches them) and wup for wdown (silu(gate) * up is linear
 * in up). Both still unquantised matmuls of the merge-to-be (concat_cols)
 * that feeds attention or silu_mul, their weight read only there. tie (K):
 * the feeder row each of k's input channels reads (query head h, channel d
 * reads v row (h / (H / KV)) hd + d under grouped attention). */
static int linear_feeder(const tb_graph *g, int k, int *tie) {
    const tb_node *m = &g->nodes[k];
    int x = m->in[0], K = (int)g->values[m->in[1]].dims[1];
    int p = tb_opt_producer(g, x);
    if (p < 0 || tb_opt_uses(g, x) != 1) return -1;
    const tb_node *pn = &g->nodes[p];
    if (pn->op != TB_OP_ATTENTION && pn->op != TB_OP_SILU_MUL) return -1;
    int cat = tb_opt_producer(g, pn->in[0]);
    if (cat < 0 || g->nodes[cat].op != TB_OP_CONCAT_COLS || tb_opt_uses(g, pn->in[0]) != 1) return -1;
    const tb_node *cn = &g->nodes[cat];
    if (cn->n_in != (pn->op == TB_OP_ATTENTION ? 3 : 2)) return -1;
    int part = cn->in[cn->n_in - 1], f = tb_opt_producer(g, part);
    if (f < 0 || g->nodes[f].op != TB_OP_MATMUL || tb_opt_uses(g, part) != 1) return -1;
    const tb_value *fw = &g->values[g->nodes[f].in[1]];
    if (fw->kind != TB_VAL_WEIGHT || tb_opt_uses(g, g->nodes[f].in[1]) != 1 || fw->rank != 2) return -1;
    if (pn->op == TB_OP_SILU_MUL) {
        if (fw->dims[0] != K) return -1;
        for (int i = 0; i < K; i++) tie[i] = i;
        return f;
    }
    int H = tb_node_attr_i(pn, TB_ATTN_HEADS), KV = tb_node_attr_i(pn, TB_ATTN_KV_HEADS);
    int hd = tb_node_attr_i(pn, TB_ATTN_HEAD_DIM);
    if (H <= 0 || KV <= 0 || hd <= 0 || H % KV || (int64_t)H * hd != K || fw->dims[0] != (int64_t)KV * hd) return -1;
    for (int h = 0; h < H; h++)
        for (int d = 0; d < hd; d++) tie[h * hd + d] = (h / (H / KV)) * hd + d;
    return f;
}

/* Before the group `name` of matmul k is quantised (AWQ on): for each part
 * that feeds a later int4 matmul c linearly (wv -> wo, wup -> wdown), c's
 * in_scale is searched now and 1 / in_scale folded into the part's rows
 * (and bias), the part becoming an owned f32 copy: then c's input arrives
 * divided by in_scale, and the part is quantised (with its group's own
 * scales) from the folded rows. want_i4(c): whether matmul c will be int4
 * (overrides, whole groups). */
static tb_status awq_prefold(tb_graph *g, int k, const char *name, const tb_quant_options *q, awq_cache *c,
                             int (*want_i4)(void *, const tb_graph *, int), void *want_user) {
    int x = g->nodes[k].in[0];
    for (int j = 0; j < g->n_nodes; j++) {
        const tb_node *n = &g->nodes[j];
        char gn[TB_NAME_LEN];
        if (tb_opt_dead(n) || n->op != TB_OP_MATMUL || n->in[0] != x) continue;
        group_name(g, j, gn);
        if (strcmp(gn, name)) continue;
        /* the matmul reading part j's output through attention / silu_mul */
        for (int ci = 0; ci < g->n_nodes; ci++) {
            const tb_node *cn = &g->nodes[ci];
            if (tb_opt_dead(cn) || cn->op != TB_OP_MATMUL || g->values[cn->in[1]].kind != TB_VAL_WEIGHT) continue;
            int K = (int)g->values[cn->in[1]].dims[1];
            int *tie = malloc(sizeof(int) * (size_t)K);
            if (!tie) return tb_errorf(TB_ERR_OOM, "out of memory");
            if (linear_feeder(g, ci, tie) != j || !want_i4(want_user, g, ci)) { free(tie); continue; }
            /* a bias on the feeder scales with its rows: it must be its own */
            int fb = g->nodes[j].n_in > 2 ? g->nodes[j].in[2] : -1;
            if (fb >= 0 && tb_opt_uses(g, fb) != 1) { free(tie); continue; }
            char cname[TB_NAME_LEN];
            group_name(g, ci, cname);
            awq_entry *e;
            tb_status st = awq_get(c, cname, &e);
            if (st != TB_OK || e->searched) { free(tie); if (st != TB_OK) return st; continue; }
            int n_tie = 0;
            for (int i = 0; i < K; i++) n_tie = tie[i] + 1 > n_tie ? tie[i] + 1 : n_tie;
            st = awq_search_group(g, ci, cname, q, tie, n_tie, e);
            if (st != TB_OK || !e->s) { free(tie); if (st != TB_OK) return st; continue; }
            /* fold: the feeder's row tie[i] divided by s[i] (equal over a
             * class), each row once */
            tb_value *fv = &g->values[g->nodes[j].in[1]];
            int FN = (int)fv->dims[0], FK = (int)fv->dims[1];
            tb_value *bv = fb >= 0 ? &g->values[fb] : NULL;
            void *buf;
            uint64_t nb;
            if (bv && (bv->dtype != TB_F32 || !bv->owned)) { /* an f32 copy to divide */
                st = convert_copy(bv, TB_F32, &buf, &nb);
                if (st != TB_OK) { free(tie); return st; }
                set_data(bv, TB_F32, buf, nb);
            }
            unsigned char *seen = calloc((size_t)FN, 1);
            st = seen ? convert_copy(fv, TB_F32, &buf, &nb) : tb_errorf(TB_ERR_OOM, "out of memory");
            if (st != TB_OK) { free(seen); free(tie); return st; }
            float *fw = buf;
            for (int i = 0; i < K; i++) {
                int r = tie[i];
                if (seen[r]) continue;
                seen[r] = 1;
                for (int kk = 0; kk < FK; kk++) fw[(size_t)r * (size_t)FK + (size_t)kk] /= e->s[i];
                if (bv) ((float *)bv->data)[r] /= e->s[i];
            }
            free(seen);
            set_data(fv, TB_F32, buf, nb);
            e->prefolded = 1;
            free(tie);
        }
    }
    return TB_OK;
}

static const tb_quant_calib *find_calib(const tb_quant_options *q, const char *name) {
    for (int i = 0; i < q->n_calib; i++)
        if (q->calib[i].weight && !strcmp(q->calib[i].weight, name)) return &q->calib[i];
    return NULL;
}

/* ---------------------------------------------------------------- the pass */

typedef struct {
    int n_quant[TB_DTYPE_COUNT]; /* matmul weights per final dtype */
    uint64_t bytes_before, bytes_after;
    int n_fallback;              /* int4 weights made int8: K not whole groups */
    char fallback[TB_NAME_LEN];  /* the first of them                          */
    int n_awq;                   /* matmuls quantised with AWQ scales          */
    int n_clip;                  /* matmuls quantised with AWQ clip bounds     */
} tally;

/* What decides each matmul's dtype (the pass's loop and awq_prefold). */
typedef struct {
    const tb_quant_options *q;
    override *ov;
    int head;               /* the LM head's node, or -1 */
    tb_dtype embed_default;
    tb_dtype head_default;  /* the LM head's dtype unless overridden */
} dtype_rule;

/* The dtype matmul k gets, and its override name (`own`) and fused name. */
static tb_dtype matmul_dtype(const dtype_rule *d, const tb_graph *g, int k, char own[TB_NAME_LEN],
                             char fused[TB_NAME_LEN]) {
    /* overrides match the part's name or the fused weight's (what inspect
     * lists); calibration is keyed by the fused weight's */
    snprintf(own, TB_NAME_LEN, "%s", k == d->head ? "lm_head" : g->values[g->nodes[k].in[1]].name);
    if (k == d->head) snprintf(fused, TB_NAME_LEN, "%s", own);
    else group_name(g, k, fused);
    return resolve(d->ov, d->q->n_overrides, own, fused, k == d->head ? d->head_default : d->q->dtype);
}

/* awq_prefold's question: will matmul k be int4 (whole groups)? */
static int will_be_i4(void *user, const tb_graph *g, int k) {
    const dtype_rule *d = user;
    char own[TB_NAME_LEN], fused[TB_NAME_LEN];
    return matmul_dtype(d, g, k, own, fused) == TB_I4 && g->values[g->nodes[k].in[1]].dims[1] % d->q->group == 0;
}

/* Matmul node k gets weight dtype dt; `name` is what overrides matched
 * ("lm_head" for a head tied to the embedding). */
static tb_status retype_matmul(tb_graph *g, int k, tb_dtype dt, const char *name, const dtype_rule *rule,
                               int emb_v, tb_dtype emb_dt, int *folded, awq_cache *awq, tally *t) {
    const tb_quant_options *q = rule->q;
    if (q->awq) { /* before anything of this group is quantised: the folds into its parts' rows */
        awq_entry *ae;
        TB_TRY(awq_get(awq, name, &ae));
        if (!ae->pre) {
            ae->pre = 1;
            TB_TRY(awq_prefold(g, k, name, q, awq, will_be_i4, (void *)rule));
        }
    }
    int wi = g->nodes[k].in[1];
    tb_value *v = &g->values[wi];
    int shared = tb_opt_uses(g, wi) > 1;
    int N = (int)v->dims[0], K = (int)v->dims[1];
    t->bytes_before += v->nbytes;
    if (!tb_dtype_is_quant(dt)) {
        if (dt == v->dtype && !shared) { t->bytes_after += v->nbytes; return TB_OK; }
        if (shared && wi == emb_v && dt == emb_dt) { /* a tied head: the table converted once, read by both */
            uint64_t nb;
            TB_TRY(tb_dtype_tensor_bytes(dt, v->rank, v->dims, &nb));
            t->bytes_after += nb;
            return TB_OK;
        }
        void *buf;
        uint64_t nb;
        TB_TRY(convert_copy(v, dt, &buf, &nb));
        if (shared) { /* the embedding keeps the table: the head gets its own */
            int nv = tb_graph_add_weight(g, name, dt, 2, (int64_t[]){N, K}, buf, 1);
            if (nv < 0) return tb_last_status();
            g->nodes[k].in[1] = nv;
        } else {
            set_data(v, dt, buf, nb);
        }
        t->bytes_after += nb;
        return TB_OK;
    }
    int group = dt == TB_I4 ? q->group : K, asym = dt == TB_I4 && q->asym;
    if (dt == TB_I4 && K % group) {
        if (!t->n_fallback++) snprintf(t->fallback, sizeof t->fallback, "%s", name);
        dt = TB_I8, group = K, asym = 0;
    }
    TB_TRY(tb_quant_check(dt, K, group, asym));
    const tb_quant_calib *cal = find_calib(q, name);
    const float *in_scale = cal ? cal->in_scale : NULL;
    int prefolded = 0;
    float *bound = NULL; /* AWQ clip bounds (N, K / group) */
    if (q->awq && dt == TB_I4) {
        awq_entry *ae;
        TB_TRY(awq_get(awq, name, &ae));
        if (!ae->searched) {
            ae->searched = 1;
            /* q|k|v, gate|up: 1 / s into the norm; wo and wdown were
             * searched by awq_prefold or keep no scales */
            if (fold_target(g, g->nodes[k].in[0], name) >= 0) TB_TRY(awq_search_group(g, k, name, q, NULL, 0, ae));
        }
        in_scale = ae->s;
        prefolded = ae->prefolded;
        if (in_scale) t->n_awq++;
        if (q->awq_clip) {
            int found = 0;
            float *wf = malloc(sizeof(float) * (size_t)N * (size_t)K);
            bound = malloc(sizeof(float) * (size_t)N * (size_t)(K / group));
            tb_status st = wf && bound ? tb_dtype_convert(v->data, v->dtype, wf, TB_F32, (size_t)N * (size_t)K)
                                       : tb_errorf(TB_ERR_OOM, "out of memory for the AWQ clip of %s", v->name);
            if (st == TB_OK && in_scale) /* the product quantize_value clamps */
                for (size_t n = 0; n < (size_t)N; n++)
                    for (int kk = 0; kk < K; kk++) wf[n * (size_t)K + (size_t)kk] *= in_scale[kk];
            if (st == TB_OK)
                st = q->awq_clip(q->awq_user, name, v->name, wf, N, K, group, asym, in_scale, bound, &found);
            free(wf);
            if (st != TB_OK || !found) { free(bound); bound = NULL; }
            if (st != TB_OK) return st;
            if (found) t->n_clip++;
        }
    }
    float act_scale = cal ? cal->act_scale : 0.0f;
    if (!(act_scale >= 0 && act_scale < INFINITY)) {
        free(bound);
        return tb_errorf(TB_ERR_INVALID_ARG, "activation scale %g for %s", act_scale, name);
    }
    uint8_t *codes;
    float *scales, *zeros;
    tb_status qs = quantize_value(v, dt, group, asym, in_scale, bound, &codes, &scales, &zeros);
    free(bound);
    if (qs != TB_OK) return qs;
    tb_node nd = g->nodes[k];
    int x = nd.in[0], bias = nd.n_in > 2 ? nd.in[2] : -1;
    if (in_scale && !prefolded) {
        tb_status s = fold_in_scale(g, x, in_scale, name, folded);
        if (s != TB_OK) { free(codes); free(scales); free(zeros); return s; }
    }
    uint64_t cb = tb_quant_codes_bytes(dt, N, K);
    int cv = wi;
    if (shared) {
        cv = tb_graph_add_weight(g, name, dt, 2, (int64_t[]){N, K}, codes, 1);
        if (cv < 0) { free(scales); free(zeros); return tb_last_status(); }
    } else {
        set_data(v, dt, codes, cb);
    }
    char sn[TB_NAME_LEN];
    snprintf(sn, sizeof sn, "%.80s.scales", g->values[cv].name);
    int64_t sd[2] = {N, K / group};
    int sv = tb_graph_add_weight(g, sn, TB_F32, 2, sd, scales, 1);
    if (sv < 0) { free(zeros); return tb_last_status(); }
    int zv = -1;
    if (asym) {
        snprintf(sn, sizeof sn, "%.80s.zeros", g->values[cv].name);
        if ((zv = tb_graph_add_weight(g, sn, TB_F32, 2, sd, zeros, 1)) < 0) return tb_last_status();
    }
    tb_node *n = &g->nodes[k];
    memset(n->in, 0, sizeof n->in);
    memset(n->i, 0, sizeof n->i);
    memset(n->f, 0, sizeof n->f);
    n->op = TB_OP_QMATMUL;
    n->tactic = 0;
    n->n_in = 0;
    n->in[n->n_in++] = x;
    n->in[n->n_in++] = cv;
    n->in[n->n_in++] = sv;
    if (bias >= 0) n->in[n->n_in++] = bias;
    if (zv >= 0) n->in[n->n_in++] = zv;
    tb_attr_set_i(TB_OP_QMATMUL, TB_QMM_HAS_BIAS, n->i, bias >= 0);
    tb_attr_set_i(TB_OP_QMATMUL, TB_QMM_HAS_ZEROS, n->i, zv >= 0);
    tb_attr_set_f(TB_OP_QMATMUL, TB_QMM_ACT_SCALE, n->f, act_scale);
    t->bytes_after += cb + sizeof(float) * (uint64_t)N * (uint64_t)(K / group) * (asym ? 2u : 1u);
    return TB_OK;
}

tb_status tb_opt_quantize(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    const tb_quant_options *q = o ? o->quant : NULL;
    if (!q) return TB_OK;
    int quant = tb_dtype_is_quant(q->dtype);
    if (!quant && q->dtype != TB_F32 && q->dtype != TB_F16 && q->dtype != TB_BF16)
        return tb_errorf(TB_ERR_UNSUPPORTED, "engine dtype %s is not supported", tb_dtype_name(q->dtype));
    if (q->n_overrides < 0 || q->n_overrides > 256) return tb_errorf(TB_ERR_INVALID_ARG, "too many --override");
    override ov[256];
    TB_TRY(parse_overrides(q, ov));
    tb_dtype embed_default = quant ? TB_F16 : q->dtype;
    /* An int4 engine's LM head is int8 by default: the head is the largest
     * single matmul of a small model (a 32000-row vocabulary), so at f16 it
     * reads about a quarter of an int4 step's bytes, and int8 costs ~0.04%
     * perplexity on the demo model (docs/PERFORMANCE.md). int4 itself would
     * cost far more there; int8 and fp8 engines keep it f16. */
    tb_dtype head_default = q->dtype == TB_I4 ? TB_I8 : embed_default;
    /* the LM head: the matmul writing the logits */
    int head = g->output >= 0 ? tb_opt_producer(g, g->output) : -1;
    if (head >= 0 && g->nodes[head].op == TB_OP_ALL_GATHER_COLS) /* a rank's vocabulary shard */
        head = tb_opt_producer(g, g->nodes[head].in[0]);
    /* the embedding's dtype first: a head tied to it shares the table when
     * it wants the same dtype */
    int emb_v = -1;
    tb_dtype embed_dt = embed_default;
    for (int k = 0; k < g->n_nodes && emb_v < 0; k++)
        if (!tb_opt_dead(&g->nodes[k]) && g->nodes[k].op == TB_OP_EMBEDDING) {
            emb_v = g->nodes[k].in[1];
            embed_dt = resolve(ov, q->n_overrides, g->values[emb_v].name, NULL, embed_default);
        }
    tally t;
    memset(&t, 0, sizeof t);
    int n_nodes = g->n_nodes, folded = -1;
    dtype_rule rule = {q, ov, head, embed_default, head_default};
    awq_cache awq = {0};
    tb_status st = TB_OK;
    for (int k = 0; k < n_nodes && st == TB_OK; k++) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || n->op != TB_OP_MATMUL || g->values[n->in[1]].kind != TB_VAL_WEIGHT) continue;
        char own[TB_NAME_LEN], fused[TB_NAME_LEN];
        tb_dtype dt = matmul_dtype(&rule, g, k, own, fused);
        st = retype_matmul(g, k, dt, fused, &rule, emb_v, embed_dt, &folded, &awq, &t);
    }
    awq_cache_free(&awq);
    if (st != TB_OK) return st;
    /* q|k|v and gate|up merged now that each part is in its final form */
    tb_pass_report mr;
    memset(&mr, 0, sizeof mr);
    TB_TRY(tb_opt_merge_concat_matmul(g, &mr));

    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || n->op != TB_OP_EMBEDDING) continue;
        tb_value *v = &g->values[n->in[1]];
        tb_dtype dt = resolve(ov, q->n_overrides, v->name, NULL, embed_default);
        if (tb_dtype_is_quant(dt))
            return tb_errorf(TB_ERR_UNSUPPORTED, "the embedding table %s stays a float dtype (f32, f16 or bf16), "
                             "not %s", v->name, tb_dtype_name(dt));
        embed_dt = dt;
        if (dt == v->dtype) continue;
        void *buf;
        uint64_t nb;
        TB_TRY(convert_copy(v, dt, &buf, &nb));
        set_data(v, dt, buf, nb);
    }
    for (int k = 0; k < g->n_nodes; k++) { /* the final dtypes, merged weights once */
        const tb_node *n = &g->nodes[k];
        if (!tb_opt_dead(n) && (n->op == TB_OP_MATMUL || n->op == TB_OP_QMATMUL))
            t.n_quant[g->values[n->in[1]].dtype]++;
    }
    for (int i = 0; i < q->n_overrides; i++)
        if (!ov[i].hits)
            return tb_errorf(TB_ERR_INVALID_ARG, "--override '%s': no weight is named so (matmul weights are named "
                             "like l0.wqkv, l0.wo, l0.wgu, l0.wdown and lm_head; the embedding embed)", ov[i].glob);
    int kinds[] = {TB_I8, TB_I4, TB_FP8_E4M3, TB_F16, TB_BF16, TB_F32};
    size_t w = (size_t)snprintf(r->what, sizeof r->what, "matmul weights:");
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (t.n_quant[kinds[i]] && w < sizeof r->what)
            w += (size_t)snprintf(r->what + w, sizeof r->what - w, " %d %s", t.n_quant[kinds[i]],
                                  tb_dtype_name((tb_dtype)kinds[i]));
    if (w < sizeof r->what)
        w += (size_t)snprintf(r->what + w, sizeof r->what - w, " (%.1f -> %.1f MB); embedding %s%s",
                              t.bytes_before / 1e6, t.bytes_after / 1e6, tb_dtype_name(embed_dt),
                              q->calib ? "; calibrated" : "");
    if (quant && q->dtype == TB_I4 && w < sizeof r->what)
        w += (size_t)snprintf(r->what + w, sizeof r->what - w, "; int4 %s, group %d",
                              q->asym ? "with zero points" : "symmetric", q->group);
    if (q->awq && w < sizeof r->what)
        w += (size_t)snprintf(r->what + w, sizeof r->what - w, "; AWQ scales on %d matmuls, clipping on %d", t.n_awq,
                              t.n_clip);
    if (mr.changes && w < sizeof r->what)
        w += (size_t)snprintf(r->what + w, sizeof r->what - w, "; %d merged after quantizing", mr.changes);
    if (t.n_fallback && w < sizeof r->what)
        snprintf(r->what + w, sizeof r->what - w, "; %d int8 instead of int4 (K not a multiple of %d: %s%s)",
                 t.n_fallback, q->group, t.fallback, t.n_fallback > 1 ? ", ..." : "");
    for (int i = 0; i < TB_DTYPE_COUNT; i++) r->changes += t.n_quant[i];
    return TB_OK;
}
