/* llama.c — the Llama-family builder (Llama 1/2/3, Mistral, Qwen2).
 *
 * It emits the plain graph of the model: one matmul per projection (q, k, v,
 * o, gate, up, down), silu and mul for the gated MLP, add for the residual
 * stream and rmsnorm. The pass pipeline (opt/llm_fuse.c, run by the build)
 * fuses it into the graph the backends run: the q|k|v and gate|up matmuls
 * merged, silu_mul, add_rmsnorm. */
#include "models/models.h"
#include "ir/ops.h"

#include <math.h>


/* Tensor names take the layer number when they have a %d. */
#pragma GCC diagnostic ignored "-Wformat-extra-args"

#define TB_PI 3.14159265358979323846

void tb_rope_inv_freq(const tb_model_config *c, float *inv_freq) {
    int hd = c->head_dim;
    for (int i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow((double)c->rope_theta, (2.0 * i) / hd);
        if (c->rope_scaling == TB_ROPE_SCALING_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == TB_ROPE_SCALING_LLAMA3) {
            double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            double old = c->rope_orig_max_pos, factor = c->rope_factor;
            double low_wavelen = old / lo, high_wavelen = old / hi;
            double wavelen = 2.0 * TB_PI / f;
            if (wavelen > low_wavelen) {
                f = f / factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old / wavelen - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

/* Converts `parts` source tensors stacked along dim 0 into one new weight. */
static int add_stacked(tb_graph *g, const char *name, tb_dtype dt, const tb_src_tensor **parts, int n_parts,
                       int64_t cols) {
    int64_t rows = 0;
    for (int i = 0; i < n_parts; i++) rows += parts[i]->dims[0];
    int64_t dims[2] = {rows, cols};
    int rank = cols > 1 || parts[0]->rank > 1 ? 2 : 1;
    uint64_t bytes;
    /* rows of whole blocks of dt, so each part starts on a block */
    if (tb_dtype_tensor_bytes(dt, rank, dims, &bytes) != TB_OK) {
        tb_error_prefix(TB_ERR_FORMAT, "weight %s", name);
        return -1;
    }
    uint8_t *buf = tb_alloc_aligned(bytes ? (size_t)bytes : 64, 64);
    if (!buf) { tb_errorf(TB_ERR_OOM, "out of memory converting %s", name); return -1; }
    size_t off = 0; /* bytes */
    for (int i = 0; i < n_parts; i++) {
        size_t n = (size_t)(parts[i]->dims[0] * (parts[i]->rank > 1 ? parts[i]->dims[1] : 1));
        if (tb_dtype_convert(parts[i]->data, parts[i]->dtype, buf + off, dt, n) != TB_OK) {
            tb_free_aligned(buf);
            tb_error_prefix(TB_ERR_UNSUPPORTED, "weight %s", name);
            return -1;
        }
        off += (size_t)tb_dtype_row_size(dt, n);
    }
    /* the graph owns buf from here, also when adding fails (it frees it then):
     * owned buffers are freed with free(), which aligned_alloc memory allows */
    return tb_graph_add_weight(g, name, dt, rank, dims, buf, 1);
}

/* TB_DTYPE_COUNT as the dtype: the source tensor itself, borrowed
 * (tb_model_build_opts.source_weights). */
#define TB_SOURCE_DTYPE TB_DTYPE_COUNT

static int add_one(tb_graph *g, const char *name, tb_dtype dt, const tb_src_tensor *t) {
    if (dt == TB_SOURCE_DTYPE) {
        int64_t dims[2] = {t->dims[0], t->rank > 1 ? t->dims[1] : 1};
        return tb_graph_add_weight(g, name, t->dtype, t->rank > 1 ? 2 : 1, dims, t->data, 0);
    }
    const tb_src_tensor *parts[1] = {t};
    return add_stacked(g, name, dt, parts, 1, t->rank > 1 ? t->dims[1] : 1);
}

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of source tensor t as a new
 * weight (t itself when the slice is all of it). A rank-1 t has one column.
 * Whole rows stay borrowed under TB_SOURCE_DTYPE; a column slice is an
 * owned copy in t's dtype (the quantize pass converts it like the rest). */
static int add_slice(tb_graph *g, const char *name, tb_dtype dt, const tb_src_tensor *t, int64_t r0, int64_t nr,
                     int64_t c0, int64_t nc) {
    int64_t R = t->dims[0], C = t->rank > 1 ? t->dims[1] : 1;
    if (r0 == 0 && nr == R && c0 == 0 && nc == C) return add_one(g, name, dt, t);
    if ((t->dtype != TB_F32 && t->dtype != TB_F16 && t->dtype != TB_BF16) || r0 < 0 || c0 < 0 || r0 + nr > R ||
        c0 + nc > C || nr <= 0 || nc <= 0) {
        tb_errorf(TB_ERR_UNSUPPORTED, "weight %s (%s) cannot be split for tensor parallelism", name,
                  tb_dtype_name(t->dtype));
        return -1;
    }
    size_t esz = tb_dtype_size(t->dtype);
    tb_src_tensor part = *t;
    part.dims[0] = nr;
    if (t->rank > 1) part.dims[1] = nc;
    part.nbytes = (size_t)(nr * nc) * esz;
    if (c0 == 0 && nc == C) {
        part.data = (const uint8_t *)t->data + (size_t)(r0 * C) * esz;
        return add_one(g, name, dt, &part);
    }
    uint8_t *buf = malloc(part.nbytes);
    if (!buf) { tb_errorf(TB_ERR_OOM, "out of memory splitting %s", name); return -1; }
    for (int64_t r = 0; r < nr; r++)
        memcpy(buf + (size_t)(r * nc) * esz, (const uint8_t *)t->data + (size_t)((r0 + r) * C + c0) * esz,
               (size_t)nc * esz);
    if (dt == TB_SOURCE_DTYPE) {
        int64_t dims[2] = {nr, nc};
        return tb_graph_add_weight(g, name, t->dtype, 2, dims, buf, 1); /* owns buf, also on failure */
    }
    part.data = buf;
    int w = add_one(g, name, dt, &part);
    free(buf);
    return w;
}

/* A node summing x over the tensor-parallel ranks (x itself with one).
 * Returns the sum's value or -1. */
static int add_all_reduce(tb_graph *g, const char *name, int x, int tp) {
    if (tp <= 1) return x;
    int nd = tb_graph_add_node(g, TB_OP_ALL_REDUCE, (int[]){x}, 1, name, NULL, NULL);
    return nd < 0 ? -1 : g->nodes[nd].out[0];
}

/* x + d: the residual stream. Returns the sum's value or -1. */
static int add_residual(tb_graph *g, const char *name, int x, int d) {
    int nd = tb_graph_add_node(g, TB_OP_ADD, (int[]){x, d}, 2, name, NULL, NULL);
    return nd < 0 ? -1 : g->nodes[nd].out[0];
}

#define GET(name_fmt, d0, d1, outp)                                                           \
    do {                                                                                      \
        char nm_[160];                                                                        \
        snprintf(nm_, sizeof nm_, name_fmt, l);                                               \
        if ((s = tb_source_get(src, nm_, (d0), (d1), (outp))) != TB_OK) goto fail;            \
    } while (0)

tb_status tb_model_build_graph(const tb_model_source *src, const tb_model_build_opts *o, tb_graph **out) {
    *out = NULL;
    const tb_model_config *c = tb_source_config(src);
    if (strcmp(c->arch, "llama") && strcmp(c->arch, "mistral") && strcmp(c->arch, "qwen2"))
        return tb_errorf(TB_ERR_UNSUPPORTED, "architecture '%s' has no builder (supported: llama, mistral, qwen2)",
                         c->arch);
    int D = c->dim, F = c->hidden_dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, V = c->vocab_size;
    if (D <= 0 || F <= 0 || H <= 0 || KV <= 0 || hd <= 0 || V <= 0 || c->n_layers <= 0 || H % KV || hd % 2 ||
        hd > 0xffff)
        return tb_errorf(TB_ERR_FORMAT, "model config has invalid sizes (dim %d, hidden %d, heads %d/%d, head_dim %d)",
                         D, F, H, KV, hd);
    int tp = o->tp_size > 1 ? o->tp_size : 1, rk = tp > 1 ? o->tp_rank : 0;
    if (tp > 1 && (rk < 0 || rk >= tp || H % tp || KV % tp || F % tp || V % tp))
        return tb_errorf(TB_ERR_INVALID_ARG, "tensor parallelism over %d ranks needs heads (%d), KV heads (%d), the MLP "
                         "size (%d) and the vocabulary (%d) to divide by %d", tp, H, KV, F, V, tp);
    /* this rank's share: heads, KV heads, MLP columns, vocabulary rows */
    int Hr = H / tp, KVr = KV / tp, Fr = F / tp, Vr = V / tp;
    tb_dtype wdt = o->source_weights ? TB_SOURCE_DTYPE : o->weight_dtype;
    tb_status s = TB_OK;
    tb_graph *g = tb_graph_new();
    if (!g) return tb_errorf(TB_ERR_OOM, "out of memory");
    tb_error_clear(); /* graph_fail reads the cause the graph calls record */
    int tok = tb_graph_add_sym(g, "tokens", 1, 1, o->max_step_tokens);
    int rows = tb_graph_add_sym(g, "rows", 1, 1, o->max_step_tokens);
    (void)rows;
    int64_t tdims[1] = {TB_SYM(tok)};
    int ids = tb_graph_add_value(g, "token_ids", TB_VAL_INPUT, TB_I32, 1, tdims);
    int l = 0;
    const tb_src_tensor *emb, *t0, *t1;
    GET("model.embed_tokens.weight", V, D, &emb);
    int w_emb = add_slice(g, "embed", wdt, emb, (int64_t)rk * Vr, Vr, 0, D);
    float *inv = calloc((size_t)hd / 2, sizeof(float));
    if (!inv) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto fail; }
    tb_rope_inv_freq(c, inv);
    int64_t fd[1] = {hd / 2};
    int w_freq = tb_graph_add_weight(g, "rope_inv_freq", TB_F32, 1, fd, inv, 1);
    int32_t ei[4] = {0};
    tb_attr_set_i(TB_OP_EMBEDDING, TB_EMB_VOCAB_OFFSET, ei, rk * Vr);
    int x = tb_graph_add_node(g, TB_OP_EMBEDDING, (int[]){ids, w_emb}, 2, tp > 1 ? "x0.part" : "x0", ei, NULL);
    if (w_emb < 0 || w_freq < 0 || x < 0) goto graph_fail;
    int resid = add_all_reduce(g, "x0", g->nodes[x].out[0], tp), delta = -1, h;
    if (resid < 0) goto graph_fail;
    float eps[4] = {0}, scale[4] = {0}; /* the same slot for rmsnorm and add_rmsnorm */
    tb_attr_set_f(TB_OP_RMSNORM, TB_NORM_EPS, eps, c->norm_eps);
    tb_attr_set_f(TB_OP_ATTENTION, TB_ATTN_SCALE, scale, 1.0f / sqrtf((float)hd));
    char nm[TB_NAME_LEN], nm2[TB_NAME_LEN];
    for (l = 0; l < c->n_layers; l++) {
        const tb_src_tensor *tn;
        GET("model.layers.%d.input_layernorm.weight", D, -1, &tn);
        snprintf(nm, sizeof nm, "l%d.attn_norm", l);
        int w_an = add_one(g, nm, TB_F32, tn);
        if (w_an < 0) goto graph_fail;
        if (delta >= 0) { /* the residual stream: x += the last layer's MLP */
            snprintf(nm, sizeof nm, "l%d.h", l);
            resid = add_residual(g, nm, resid, delta);
            if (resid < 0) goto graph_fail;
        }
        snprintf(nm, sizeof nm, delta < 0 ? "l%d.h" : "l%d.hn", l);
        int nd = tb_graph_add_node(g, TB_OP_RMSNORM, (int[]){resid, w_an}, 2, nm, NULL, eps);
        if (nd < 0) goto graph_fail;
        h = g->nodes[nd].out[0];
        /* q, k, v: one projection each (the passes merge them) */
        static const char *const qkv_src[3] = {"q", "k", "v"};
        int64_t rows_of[3] = {(int64_t)H * hd, (int64_t)KV * hd, (int64_t)KV * hd};
        int64_t rank_rows[3] = {(int64_t)Hr * hd, (int64_t)KVr * hd, (int64_t)KVr * hd};
        int w_p[3], b_p[3] = {-1, -1, -1}, proj[3];
        for (int i = 0; i < 3; i++) {
            char tname[160];
            snprintf(tname, sizeof tname, "model.layers.%%d.self_attn.%s_proj.weight", qkv_src[i]);
            GET(tname, rows_of[i], D, &t0);
            snprintf(nm, sizeof nm, "l%d.w%s", l, qkv_src[i]);
            if ((w_p[i] = add_slice(g, nm, wdt, t0, rk * rank_rows[i], rank_rows[i], 0, D)) < 0) goto graph_fail;
        }
        char bq[160];
        snprintf(bq, sizeof bq, "model.layers.%d.self_attn.q_proj.bias", l);
        if (c->attn_bias || tb_source_find(src, bq)) {
            for (int i = 0; i < 3; i++) {
                char tname[160];
                snprintf(tname, sizeof tname, "model.layers.%%d.self_attn.%s_proj.bias", qkv_src[i]);
                GET(tname, rows_of[i], -1, &t0);
                snprintf(nm, sizeof nm, "l%d.b%s", l, qkv_src[i]);
                if ((b_p[i] = add_slice(g, nm, TB_F32, t0, rk * rank_rows[i], rank_rows[i], 0, 1)) < 0)
                    goto graph_fail;
            }
        }
        for (int i = 0; i < 3; i++) {
            snprintf(nm, sizeof nm, "l%d.%s", l, qkv_src[i]);
            nd = tb_graph_add_node(g, TB_OP_MATMUL, (int[]){h, w_p[i], b_p[i]}, b_p[i] >= 0 ? 3 : 2, nm, NULL, NULL);
            if (nd < 0) goto graph_fail;
            proj[i] = g->nodes[nd].out[0];
        }
        /* attention reads q | k | v side by side in each row */
        snprintf(nm, sizeof nm, "l%d.qkv", l);
        nd = tb_graph_add_node(g, TB_OP_CONCAT_COLS, proj, 3, nm, NULL, NULL);
        if (nd < 0) goto graph_fail;
        int qkv = g->nodes[nd].out[0];
        int32_t ai[4] = {0};
        tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_LAYER, ai, l);
        tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_HEADS, ai, Hr);
        tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_KV_HEADS, ai, KVr);
        tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_HEAD_DIM, ai, hd);
        tb_attr_set_i(TB_OP_ATTENTION, TB_ATTN_INTERLEAVED, ai, c->rope_interleaved ? 1 : 0);
        snprintf(nm, sizeof nm, "l%d.attn", l);
        nd = tb_graph_add_node(g, TB_OP_ATTENTION, (int[]){qkv, w_freq}, 2, nm, ai, scale);
        if (nd < 0) goto graph_fail;
        int att = g->nodes[nd].out[0];
        GET("model.layers.%d.self_attn.o_proj.weight", D, (int64_t)H * hd, &t0);
        snprintf(nm, sizeof nm, "l%d.wo", l);
        int w_o = add_slice(g, nm, wdt, t0, 0, D, (int64_t)rk * Hr * hd, (int64_t)Hr * hd);
        snprintf(nm, sizeof nm, tp > 1 ? "l%d.attn_out.part" : "l%d.attn_out", l);
        nd = tb_graph_add_node(g, TB_OP_MATMUL, (int[]){att, w_o}, 2, nm, NULL, NULL);
        if (w_o < 0 || nd < 0) goto graph_fail;
        snprintf(nm, sizeof nm, "l%d.attn_out", l);
        int ao = add_all_reduce(g, nm, g->nodes[nd].out[0], tp);
        if (ao < 0) goto graph_fail;
        GET("model.layers.%d.post_attention_layernorm.weight", D, -1, &tn);
        snprintf(nm, sizeof nm, "l%d.ffn_norm", l);
        int w_fn = add_one(g, nm, TB_F32, tn);
        if (w_fn < 0) goto graph_fail;
        snprintf(nm, sizeof nm, "l%d.h2", l);
        resid = add_residual(g, nm, resid, ao);
        if (resid < 0) goto graph_fail;
        snprintf(nm, sizeof nm, "l%d.h2n", l);
        nd = tb_graph_add_node(g, TB_OP_RMSNORM, (int[]){resid, w_fn}, 2, nm, NULL, eps);
        if (nd < 0) goto graph_fail;
        int h2 = g->nodes[nd].out[0];
        /* the MLP: silu(h2 Wg^T) * (h2 Wu^T), projected down */
        GET("model.layers.%d.mlp.gate_proj.weight", F, D, &t0);
        GET("model.layers.%d.mlp.up_proj.weight", F, D, &t1);
        snprintf(nm, sizeof nm, "l%d.wg", l);
        int w_g = add_slice(g, nm, wdt, t0, (int64_t)rk * Fr, Fr, 0, D);
        snprintf(nm, sizeof nm, "l%d.wu", l);
        int w_u = add_slice(g, nm, wdt, t1, (int64_t)rk * Fr, Fr, 0, D);
        if (w_g < 0 || w_u < 0) goto graph_fail;
        snprintf(nm, sizeof nm, "l%d.g", l);
        nd = tb_graph_add_node(g, TB_OP_MATMUL, (int[]){h2, w_g}, 2, nm, NULL, NULL);
        if (nd < 0) goto graph_fail;
        int gate = g->nodes[nd].out[0];
        snprintf(nm, sizeof nm, "l%d.u", l);
        nd = tb_graph_add_node(g, TB_OP_MATMUL, (int[]){h2, w_u}, 2, nm, NULL, NULL);
        if (nd < 0) goto graph_fail;
        int up = g->nodes[nd].out[0];
        snprintf(nm, sizeof nm, "l%d.silu", l);
        nd = tb_graph_add_node(g, TB_OP_SILU, (int[]){gate}, 1, nm, NULL, NULL);
        if (nd < 0) goto graph_fail;
        snprintf(nm, sizeof nm, "l%d.act", l);
        nd = tb_graph_add_node(g, TB_OP_EMUL, (int[]){g->nodes[nd].out[0], up}, 2, nm, NULL, NULL);
        if (nd < 0) goto graph_fail;
        int act = g->nodes[nd].out[0];
        GET("model.layers.%d.mlp.down_proj.weight", D, F, &t0);
        snprintf(nm, sizeof nm, "l%d.wdown", l);
        int w_d = add_slice(g, nm, wdt, t0, 0, D, (int64_t)rk * Fr, Fr);
        snprintf(nm2, sizeof nm2, tp > 1 ? "l%d.mlp_out.part" : "l%d.mlp_out", l);
        nd = tb_graph_add_node(g, TB_OP_MATMUL, (int[]){act, w_d}, 2, nm2, NULL, NULL);
        if (w_d < 0 || nd < 0) goto graph_fail;
        snprintf(nm2, sizeof nm2, "l%d.mlp_out", l);
        delta = add_all_reduce(g, nm2, g->nodes[nd].out[0], tp);
        if (delta < 0) goto graph_fail;
        if (o->progress) o->progress(o->progress_arg, l + 1, c->n_layers + 1);
    }
    l = 0;
    const tb_src_tensor *tn;
    GET("model.norm.weight", D, -1, &tn);
    int w_norm = add_one(g, "final_norm", TB_F32, tn);
    if (w_norm < 0) goto graph_fail;
    resid = add_residual(g, "final", resid, delta);
    if (resid < 0) goto graph_fail;
    int nd = tb_graph_add_node(g, TB_OP_RMSNORM, (int[]){resid, w_norm}, 2, "final_normed", NULL, eps);
    if (nd < 0) goto graph_fail;
    int hf = g->nodes[nd].out[0];
    nd = tb_graph_add_node(g, TB_OP_GATHER_ROWS, (int[]){hf}, 1, "selected", NULL, NULL);
    if (nd < 0) goto graph_fail;
    int sel = g->nodes[nd].out[0];
    int w_head = w_emb;
    const tb_src_tensor *head = tb_source_find(src, "lm_head.weight");
    if (head && !c->tie_embeddings) {
        GET("lm_head.weight", V, D, &head);
        w_head = add_slice(g, "lm_head", wdt, head, (int64_t)rk * Vr, Vr, 0, D);
    } else if (!head && !c->tie_embeddings) {
        s = tb_errorf(TB_ERR_NOT_FOUND, "tensor lm_head.weight is missing (and tie_word_embeddings is false)");
        goto fail;
    }
    nd = tb_graph_add_node(g, TB_OP_MATMUL, (int[]){sel, w_head}, 2, tp > 1 ? "logits.part" : "logits", NULL, NULL);
    if (w_head < 0 || nd < 0) goto graph_fail;
    if (tp > 1) { /* every rank's vocabulary columns, rank order */
        int32_t gi[4] = {0};
        tb_attr_set_i(TB_OP_ALL_GATHER_COLS, TB_GATHER_RANKS, gi, tp);
        nd = tb_graph_add_node(g, TB_OP_ALL_GATHER_COLS, (int[]){g->nodes[nd].out[0]}, 1, "logits", gi, NULL);
        if (nd < 0) goto graph_fail;
    }
    g->output = g->nodes[nd].out[0];
    if (o->progress) o->progress(o->progress_arg, c->n_layers + 1, c->n_layers + 1);
    if ((s = tb_graph_check(g)) != TB_OK) goto fail;
    *out = g;
    return TB_OK;
graph_fail:
    /* the builder calls report -1: pass on the cause they recorded */
    if (!tb_last_error()[0] || tb_last_status() == TB_OK) tb_errorf(TB_ERR_OOM, "out of memory building the graph");
    s = tb_last_status();
    tb_error_prefix(s, "building layer %d", l);
fail:
    tb_graph_free(g);
    return s;
}
