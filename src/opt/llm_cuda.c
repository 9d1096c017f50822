/*
 * llm_cuda.c — the pass of `--device cuda` builds (cuda_fuse): which node
 * pairs the CUDA backend runs as one kernel, stored in each node's tactic
 * word (tune/tactic.h), and the weight rewrite those fusions need, stored in
 * the engine's weights. The backend used to find these patterns and rewrite
 * the weights on the device at every load.
 *
 * The rewrite: where an rmsnorm's output feeds only the next matmul (and
 * where a matmul -> add_rmsnorm -> matmul chain norms the second matmul's
 * input), the norm weight g is folded into that matmul's weight, W[n][k] *=
 * g[k] (rounded to W's dtype as the device did: f32 product, nearest even),
 * and g becomes ones. The graph computes the same function (up to that
 * rounding) on any backend; the CUDA GEMV then only scales its dot
 * products by 1 / rms(x). Only weights read by that one node are folded.
 *
 * Quantized builds (--dtype int8|int4|fp8): the pass runs after the
 * quantize pass (which merges q|k|v and gate|up itself), on qmatmul nodes
 * as on matmuls. Their norm weights are not folded (one scale per row or
 * group cannot carry a factor per input channel): the GEMV multiplies x by
 * the norm weight as it reads it, so the engine's weights stay exactly what
 * the quantizer wrote, the same as a CPU build's.
 */
#include "opt/opt.h"
#include "ir/ops.h"
#include "tune/tactic.h"

static int is_float(tb_dtype t) { return t == TB_F32 || t == TB_F16 || t == TB_BF16; }
static int is_mm(const tb_node *n) { return n->op == TB_OP_MATMUL || n->op == TB_OP_QMATMUL; }

/* Folds the f32 norm weight nw (K) into w (N, K) and sets nw to ones. The
 * values are owned by the graph (the builder's buffers). */
static void fold(tb_value *nw, tb_value *w) {
    float *g = (float *)nw->data;
    int64_t N = w->dims[0], K = w->dims[1];
    for (int64_t r = 0; r < N; r++) {
        if (w->dtype == TB_F32) {
            float *row = (float *)w->data + r * K;
            for (int64_t k = 0; k < K; k++) row[k] *= g[k];
        } else {
            uint16_t *row = (uint16_t *)w->data + r * K;
            for (int64_t k = 0; k < K; k++)
                row[k] = w->dtype == TB_F16 ? tb_f32_to_f16(tb_f16_to_f32(row[k]) * g[k])
                                            : tb_f32_to_bf16(tb_bf16_to_f32(row[k]) * g[k]);
        }
    }
    for (int64_t k = 0; k < K; k++) g[k] = 1.0f;
}

static tb_status cuda_fuse(tb_graph *g, int o_quant, tb_pass_report *r) {
    int *uses = calloc((size_t)g->n_values + 1, sizeof(int));
    uint8_t *kind = calloc((size_t)g->n_nodes + 1, 1);
    if (!uses || !kind) { free(uses); free(kind); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].n_in; i++)
            if (g->nodes[k].in[i] >= 0) uses[g->nodes[k].in[i]]++;
    /* the patterns the GEMV epilogues and prologues implement */
    for (int k = 0; k + 1 < g->n_nodes; k++) {
        const tb_node *m = &g->nodes[k], *nx = &g->nodes[k + 1];
        int act = m->op == TB_OP_RMSNORM || m->op == TB_OP_SILU_MUL ? m->out[0]
                  : m->op == TB_OP_ADD_RMSNORM                       ? m->out[1]
                                                                     : -1;
        if (act >= 0 && is_mm(nx) && nx->in[0] == act && uses[act] == 1 && act != g->output &&
            (nx->op == TB_OP_QMATMUL || g->values[nx->in[1]].dtype == TB_F16 ||
             g->values[nx->in[1]].dtype == TB_BF16))
            kind[k] |= TB_FUSE_X16;
        if (m->op == TB_OP_RMSNORM && is_mm(nx) && nx->in[0] == m->out[0] && uses[m->out[0]] == 1 &&
            m->out[0] != g->output)
            kind[k] |= TB_FUSE_NORM;
        if (!is_mm(m) || uses[m->out[0]] != 1 || m->out[0] == g->output) continue;
        if (nx->op == TB_OP_ADD_RMSNORM && nx->in[1] == m->out[0] && nx->in[0] != m->out[0] && k + 2 < g->n_nodes) {
            const tb_node *m2 = &g->nodes[k + 2];
            if (is_mm(m2) && m2->in[0] == nx->out[1] && uses[nx->out[1]] == 1 &&
                nx->out[1] != g->output && nx->out[0] != g->output)
                kind[k] |= TB_FUSE_ADDNORM;
            continue;
        }
        if (nx->in[0] != m->out[0]) continue;
        int64_t N = g->values[m->in[1]].dims[0];
        if (nx->op == TB_OP_ATTENTION) {
            int H = tb_node_attr_i(nx, TB_ATTN_HEADS), KV = tb_node_attr_i(nx, TB_ATTN_KV_HEADS);
            int hd = tb_node_attr_i(nx, TB_ATTN_HEAD_DIM);
            if (N == (int64_t)(H + 2 * KV) * hd && hd % 2 == 0) kind[k] = TB_FUSE_ROPE;
        } else if (nx->op == TB_OP_SILU_MUL) {
            if (N % 2 == 0) kind[k] = TB_FUSE_GLU;
        }
    }
    /* fold the norm weights of the norm fusions; pairs that cannot be folded
     * are not fused */
    int folded = 0, pairs = 0;
    for (int k = 0; k + 1 < g->n_nodes; k++) {
        int nk = -1, mk = -1, wi = -1;
        if (kind[k] & TB_FUSE_NORM) { nk = k; mk = k + 1; wi = 1; }
        else if (kind[k] & TB_FUSE_ADDNORM) { nk = k + 1; mk = k + 2; wi = 2; }
        if (nk < 0) continue;
        const tb_node *nn = &g->nodes[nk], *mm = &g->nodes[mk];
        tb_value *nwv = &g->values[nn->in[wi]], *wv = &g->values[mm->in[1]];
        if (mm->op == TB_OP_QMATMUL) { /* the GEMV reads the norm weight itself */
            if (nwv->dtype != TB_F32 || nwv->dims[0] != wv->dims[1]) kind[k] &= (uint8_t)~(TB_FUSE_NORM | TB_FUSE_ADDNORM);
            continue;
        }
        int ok = nwv->kind == TB_VAL_WEIGHT && wv->kind == TB_VAL_WEIGHT && nwv->dtype == TB_F32 &&
                 uses[nn->in[wi]] == 1 && uses[mm->in[1]] == 1 && is_float(wv->dtype) && wv->rank == 2 &&
                 nwv->dims[0] == wv->dims[1] && nwv->data && wv->data &&
                 (nwv->owned || !o_quant) && (wv->owned || !o_quant); /* not a mapped source tensor */
        if (ok) {
            fold(nwv, wv);
            folded++;
        } else {
            kind[k] &= (uint8_t)~(TB_FUSE_NORM | TB_FUSE_ADDNORM);
        }
    }
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        n->tactic &= ~((TB_FUSE_MASK << TB_TACTIC_FUSE_SHIFT) | TB_TACTIC_WITH_NEXT);
        n->tactic |= kind[k] << TB_TACTIC_FUSE_SHIFT;
        /* epilogues that write the next node's output while this node's
         * inputs are read: those inputs stay live until the next node */
        if (kind[k] & (TB_FUSE_GLU | TB_FUSE_NORM | TB_FUSE_ADDNORM)) n->tactic |= TB_TACTIC_WITH_NEXT;
        if (k > 0 && (kind[k - 1] & TB_FUSE_ADDNORM)) n->tactic |= TB_TACTIC_WITH_NEXT;
        pairs += kind[k] != 0;
    }
    free(uses);
    free(kind);
    r->changes = pairs + folded;
    snprintf(r->what, sizeof r->what, "%d nodes fused with their neighbours, %d RMSNorm weights folded", pairs,
             folded);
    return TB_OK;
}

/* A float build fuses before quantize (which only converts its weights); a
 * quantized one after it, on the merged qmatmuls. */
tb_status tb_opt_cuda_fuse(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    if (!o || strcmp(o->device, "cuda") || o->quant) return TB_OK;
    return cuda_fuse(g, 0, r);
}

tb_status tb_opt_cuda_fuse_quant(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    if (!o || strcmp(o->device, "cuda") || !o->quant) return TB_OK;
    return cuda_fuse(g, 1, r);
}
