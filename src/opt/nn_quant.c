/*
 * nn_quant.c — the INT8 pass of general (ONNX) graphs (opt.h,
 * tb_opt_quantize_nn), after the fusions so that the quantized ops keep the
 * bias / activation / residual epilogues fused into Conv / Gemm / MatMul:
 *
 *   - explicit quantization (always): Conv / Gemm / MatMul whose weight is
 *     DequantizeLinear(int8 constant codes, constant scales, zero point 0)
 *     and whose input is DequantizeLinear(QuantizeLinear(x, s, z), s, z)
 *     become QConv / QGemm over x with the codes, the DQ's scales per
 *     output channel and the activation scale / zero point of the Q (an
 *     int8 zero point z is the uint8 code z + 128: the same integers). A
 *     DequantizeLinear of int8 constants left over (constant folding leaves
 *     them to this pass) is evaluated into an f32 weight;
 *   - calibrated quantization (o->nn_quant given): Conv (one group) / Gemm
 *     (transA 0) / MatMul (trans_a 0) with a constant f32 2-d weight whose
 *     input has a calibrated scale become QConv / QGemm with the weight
 *     quantized per output channel (symmetric int8 codes in [-127, 127],
 *     core/quant.h) and the activation's scale and zero point. The stem
 *     over 3 colour channels is quantized too (the CPU's direct int8 conv
 *     runs it 3-4x faster than f32; on ResNet-18 top-1 agreement is
 *     unchanged, docs/ONNX.md). Kept in f32: nodes an override "GLOB=f32"
 *     names (output or weight name).
 * Gemm's alpha goes into the weight scales, beta * c into the bias.
 */
#include <fnmatch.h>
#include <math.h>

#include "core/quant.h"
#include "opt/opt.h"

/* The parts of a Conv / Gemm / MatMul that a quantized op keeps. */
typedef struct {
    int x, w, bias, res;     /* values (bias, res: -1 when none)            */
    int w_kn;                /* the weight is stored (K, N): transposed     */
    int64_t N, K;            /* output channels, reduction length           */
    float alpha, beta;       /* Gemm / MatMul scale of op(a, b), of the bias */
    int act, flags;
    float p0, p1;
} mm_parts;

static void epi_inputs(int flags, int n_in, int *bias, int *res) {
    int has_res = (flags & TB_NN_HAS_RESIDUAL) != 0;
    *res = has_res ? n_in - 1 : -1;
    *bias = n_in - has_res > 2 ? 2 : -1;
}

/* Whether node n can become QConv / QGemm as far as its layout goes (the
 * weight's contents aside): its parts. */
static int parts_of(const tb_graph *g, const tb_node *n, mm_parts *p) {
    memset(p, 0, sizeof *p);
    if (n->n_in < 2 || n->n_out != 1) return 0;
    const tb_value *x = &g->values[n->in[0]], *w = &g->values[n->in[1]];
    if (x->dtype != TB_F32 || g->values[n->out[0]].dtype != TB_F32) return 0;
    p->x = n->in[0];
    p->w = n->in[1];
    p->alpha = 1.0f;
    p->beta = 1.0f;
    for (int d = 0; d < w->rank; d++)
        if (!tb_dim_known(w->dims[d])) return 0;
    switch (n->op) {
    case TB_OP_CONV:
        if ((n->i[0] > 1) || (x->rank != 3 && x->rank != 4) || w->rank != x->rank) return 0;
        p->N = w->dims[0];
        p->K = w->dims[1] * (w->rank == 4 ? w->dims[2] * w->dims[3] : w->dims[2]);
        p->act = n->i[10], p->flags = n->i[11], p->p0 = n->f[0], p->p1 = n->f[1];
        break;
    case TB_OP_GEMM:
        if (n->i[0] || w->rank != 2 || x->rank != 2) return 0;
        p->w_kn = !n->i[1];
        p->alpha = n->f[0], p->beta = n->f[1];
        p->act = n->i[2], p->flags = n->i[3], p->p0 = n->f[2], p->p1 = n->f[3];
        break;
    case TB_OP_NN_MATMUL:
        if (n->i[0] || w->rank != 2 || x->rank < 2) return 0;
        p->w_kn = !n->i[1];
        p->alpha = n->f[0] != 0.0f ? n->f[0] : 1.0f;
        p->act = n->i[2], p->flags = n->i[3], p->p0 = n->f[2], p->p1 = n->f[3];
        break;
    default: return 0;
    }
    if (n->op != TB_OP_CONV) {
        p->N = p->w_kn ? w->dims[1] : w->dims[0];
        p->K = p->w_kn ? w->dims[0] : w->dims[1];
    }
    epi_inputs(p->flags, n->n_in, &p->bias, &p->res);
    p->bias = p->bias >= 0 ? n->in[p->bias] : -1;
    p->res = p->res >= 0 ? n->in[p->res] : -1;
    if (p->bias >= 0) { /* a constant of N values (Gemm's c broadcast along rows only) */
        const tb_value *b = &g->values[p->bias];
        if (b->kind != TB_VAL_WEIGHT || b->dtype != TB_F32 || !b->data || b->rank > 2) return 0;
        if (n->op == TB_OP_GEMM && p->beta == 0.0f) p->bias = -1;
        else {
            int64_t ne = 1;
            for (int d = 0; d < b->rank; d++) ne *= b->dims[d];
            if ((ne != p->N && ne != 1) || (b->rank == 2 && b->dims[0] != 1)) return 0;
        }
    }
    return p->N > 0 && p->K > 0 && p->N < INT32_MAX && p->K < INT32_MAX;
}

static int excluded(const tb_graph *g, const tb_node *n, const tb_nn_quant_options *q) {
    const char *out = g->values[n->out[0]].name, *w = g->values[n->in[1]].name;
    int keep = 0;
    for (int i = 0; q && i < q->n_overrides; i++) {
        const char *o = q->overrides[i], *eq = strrchr(o, '=');
        if (!eq || (size_t)(eq - o) >= TB_NAME_LEN) continue;
        char glob[TB_NAME_LEN];
        memcpy(glob, o, (size_t)(eq - o));
        glob[eq - o] = 0;
        if (fnmatch(glob, out, 0) && fnmatch(glob, w, 0)) continue;
        keep = strcmp(eq + 1, "int8") && strcmp(eq + 1, "i8"); /* the last match wins */
    }
    return keep;
}

int tb_opt_nn_quant_input(const tb_graph *g, int k, const tb_nn_quant_options *q) {
    const tb_node *n = &g->nodes[k];
    if (tb_opt_dead(n) || (n->op != TB_OP_CONV && n->op != TB_OP_GEMM && n->op != TB_OP_NN_MATMUL)) return -1;
    mm_parts p;
    if (!parts_of(g, n, &p) || !tb_opt_weight_f32(g, p.w)) return -1;
    if (excluded(g, n, q)) return -1;
    return p.x;
}

/* Replaces node k by the quantized op over x with codes (N, K) int8 and
 * scales (N) (both malloc'd, taken). 1: done; 0: left alone. */
static int place_quantized(tb_graph *g, int k, const mm_parts *p, int8_t *codes, float *scales, float a_scale,
                           int a_zero, tb_status *err) {
    const tb_node *n = &g->nodes[k];
    const tb_value *w = &g->values[p->w];
    char name[TB_NAME_LEN];
    tb_node c;
    memset(&c, 0, sizeof c);
    int is_conv = n->op == TB_OP_CONV;
    c.op = is_conv ? TB_OP_QCONV : TB_OP_QGEMM;
    int64_t cdims[TB_MAX_RANK];
    int crank = 2;
    if (is_conv) {
        crank = w->rank;
        memcpy(cdims, w->dims, sizeof(int64_t) * (size_t)w->rank);
    } else {
        cdims[0] = p->N, cdims[1] = p->K;
    }
    for (int64_t j = 0; j < p->N; j++) scales[j] *= p->alpha;
    snprintf(name, sizeof name, "%.100s/i8", w->name);
    for (int i = 2; tb_graph_find_value(g, name) >= 0 && i < 1000; i++)
        snprintf(name, sizeof name, "%.100s/i8.%d", w->name, i);
    int cid = tb_graph_add_weight(g, name, TB_I8, crank, cdims, codes, 1);
    snprintf(name, sizeof name, "%.100s/scale", w->name);
    int64_t nd = p->N;
    int sid = cid >= 0 ? tb_opt_add_weight_f32(g, name, 1, &nd, scales) : (free(scales), -1);
    if (cid < 0 || sid < 0) { *err = tb_errorf(TB_ERR_OOM, "out of memory quantizing %s", w->name); return 0; }
    int bid = -1;
    if (p->bias >= 0) {
        const tb_value *b = &g->values[p->bias];
        const float *bd = b->data;
        int one = b->nbytes / sizeof(float) == 1;
        if (one || p->beta != 1.0f || b->rank != 1) { /* (N) with beta applied */
            float *nb = malloc(sizeof(float) * (size_t)p->N);
            if (!nb) { *err = tb_errorf(TB_ERR_OOM, "out of memory quantizing %s", w->name); return 0; }
            for (int64_t j = 0; j < p->N; j++) nb[j] = p->beta * bd[one ? 0 : j];
            snprintf(name, sizeof name, "%.100s/bias", w->name);
            if ((bid = tb_opt_add_weight_f32(g, name, 1, &nd, nb)) < 0) {
                *err = tb_errorf(TB_ERR_OOM, "out of memory quantizing %s", w->name);
                return 0;
            }
        } else {
            bid = p->bias;
        }
    }
    n = &g->nodes[k]; /* adding values may move nothing of nodes, but be safe */
    c.in[c.n_in++] = p->x;
    c.in[c.n_in++] = cid;
    c.in[c.n_in++] = sid;
    int flags = p->flags & ~TB_NN_HAS_BIAS;
    if (bid >= 0) { c.in[c.n_in++] = bid; flags |= TB_NN_HAS_BIAS; }
    if (p->res >= 0) c.in[c.n_in++] = p->res;
    if (is_conv) {
        memcpy(c.i, n->i, sizeof(int32_t) * 10);
        c.i[10] = p->act;
        c.i[11] = flags;
        c.i[12] = a_zero;
        c.f[0] = p->p0, c.f[1] = p->p1, c.f[2] = a_scale;
    } else {
        c.i[0] = p->act;
        c.i[1] = flags;
        c.i[2] = a_zero;
        c.f[0] = a_scale, c.f[2] = p->p0, c.f[3] = p->p1;
    }
    c.n_out = 1;
    c.out[0] = n->out[0];
    c.tactic = 0;
    int out_v = n->out[0];
    if (!tb_opt_node_fits(g, &c, out_v)) return 0;
    tb_opt_place(g, k, &c, out_v);
    return 1;
}

/* codes (N, K) of a weight stored (N, K) or (K, N) (w_kn), as int8 src or
 * quantized from f32 src (scales written then). */
static tb_status weight_codes(const mm_parts *p, const float *wf, const int8_t *wi, int8_t **codes, float **scales) {
    size_t N = (size_t)p->N, K = (size_t)p->K;
    size_t nk = N * K;
    *codes = malloc(nk ? nk : 1);
    *scales = malloc(sizeof(float) * (N ? N : 1));
    float *t = NULL;
    if (!*codes || !*scales) goto oom;
    if (wi) {
        for (size_t n = 0; n < N; n++)
            for (size_t k = 0; k < K; k++) (*codes)[n * K + k] = p->w_kn ? wi[k * N + n] : wi[n * K + k];
        return TB_OK;
    }
    if (p->w_kn) {
        if (!(t = malloc(sizeof(float) * N * K))) goto oom;
        for (size_t n = 0; n < N; n++)
            for (size_t k = 0; k < K; k++) t[n * K + k] = wf[k * N + n];
        wf = t;
    }
    tb_status s = tb_quantize_rows(TB_I8, wf, (int)N, (int)K, (int)K, 0, *codes, *scales, NULL);
    free(t);
    if (s != TB_OK) { free(*codes); free(*scales); }
    return s;
oom:
    free(*codes);
    free(*scales);
    return tb_errorf(TB_ERR_OOM, "out of memory quantizing weights");
}

/* ---------------------------------------------------------------- explicit (Q/DQ) */

/* One-element constant of v as double (scale or zero point). */
static int const_one(const tb_graph *g, int v, double *out) {
    return v >= 0 && tb_opt_const_scalar(g, v, 1, out);
}

/* The activation side: input x of node k is DQ(Q(src, s, z), s, z) with
 * per-tensor constants. Writes src, the scale and the uint8 zero point. */
static int act_qdq(const tb_graph *g, const tb_opt_index *ix, int x, int *src, float *scale, int *zero) {
    int d = tb_opt_producer_op(g, ix, x, TB_OP_DEQUANTIZE_LINEAR);
    if (d < 0) return 0;
    const tb_node *dq = &g->nodes[d];
    int q = tb_opt_producer_op(g, ix, dq->in[0], TB_OP_QUANTIZE_LINEAR);
    if (q < 0) return 0;
    const tb_node *qn = &g->nodes[q];
    double s1, s2, z1 = 0, z2 = 0;
    if (!const_one(g, dq->in[1], &s1) || !const_one(g, qn->in[1], &s2) || s1 != s2 || !(s1 > 0)) return 0;
    if (dq->n_in > 2 && !const_one(g, dq->in[2], &z1)) return 0;
    if (qn->n_in > 2 && !const_one(g, qn->in[2], &z2)) return 0;
    if (z1 != z2) return 0;
    tb_dtype qt = g->values[qn->out[0]].dtype;
    *src = qn->in[0];
    *scale = (float)s1;
    *zero = qt == TB_I8 ? (int)z1 + 128 : (int)z1;
    return *zero >= 0 && *zero <= 255 && g->values[*src].dtype == TB_F32;
}

/* The weight side: w is DQ(int8 codes, scales per tensor or per output
 * channel, zero point 0), every code in [-127, 127]. Writes the codes'
 * value and the scales (N, malloc'd). */
static int weight_dq(const tb_graph *g, const tb_opt_index *ix, int w, const mm_parts *p, int out_axis, int *codes_v,
                     float **scales) {
    int d = tb_opt_producer_op(g, ix, w, TB_OP_DEQUANTIZE_LINEAR);
    if (d < 0) return 0;
    const tb_node *dq = &g->nodes[d];
    const tb_value *c = &g->values[dq->in[0]], *s = &g->values[dq->in[1]];
    if (c->kind != TB_VAL_WEIGHT || c->dtype != TB_I8 || !c->data) return 0;
    if (s->kind != TB_VAL_WEIGHT || s->dtype != TB_F32 || !s->data) return 0;
    int64_t ns = (int64_t)(s->nbytes / sizeof(float));
    if (ns != 1 && (ns != p->N || dq->i[0] != out_axis)) return 0;
    if (dq->n_in > 2) {
        const tb_value *z = &g->values[dq->in[2]];
        if (z->kind != TB_VAL_WEIGHT || !z->data || z->dtype != TB_I8) return 0;
        for (uint64_t i = 0; i < z->nbytes; i++)
            if (((const int8_t *)z->data)[i]) return 0;
    }
    const int8_t *cd = c->data;
    for (uint64_t i = 0; i < c->nbytes; i++)
        if (cd[i] == -128) return 0;
    float *sc = malloc(sizeof(float) * (size_t)p->N);
    if (!sc) return 0;
    const float *sd = s->data;
    for (int64_t j = 0; j < p->N; j++) sc[j] = sd[ns == 1 ? 0 : j];
    *codes_v = dq->in[0];
    *scales = sc;
    return 1;
}

/* Evaluates DequantizeLinear node k of constants into an f32 weight. */
static int fold_dq(tb_graph *g, int k, tb_status *err) {
    const tb_node *n = &g->nodes[k];
    for (int j = 0; j < n->n_in; j++)
        if (g->values[n->in[j]].kind != TB_VAL_WEIGHT || !g->values[n->in[j]].data) return 0;
    const tb_value *o = &g->values[n->out[0]];
    tb_view in[3], out;
    for (int j = 0; j < n->n_in; j++) tb_value_view(g, n->in[j], &in[j]);
    memset(&out, 0, sizeof out);
    out.dtype = TB_F32;
    out.rank = in[0].rank;
    memcpy(out.dims, in[0].dims, sizeof out.dims);
    int64_t ne = tb_view_numel(&in[0]);
    float *y = malloc(sizeof(float) * (size_t)(ne > 0 ? ne : 1));
    if (!y) { *err = tb_errorf(TB_ERR_OOM, "out of memory folding %s", o->name); return 0; }
    out.data = y;
    if (tb_op_get_def(TB_OP_DEQUANTIZE_LINEAR)->ref(n, in, n->n_in, &out, 1) != TB_OK) { free(y); return 0; }
    char name[TB_NAME_LEN];
    snprintf(name, sizeof name, "%.100s/f32", o->name);
    int id = tb_opt_add_weight_f32(g, name, out.rank, out.dims, y);
    if (id < 0) { *err = tb_errorf(TB_ERR_OOM, "out of memory folding %s", name); return 0; }
    tb_opt_replace_uses(g, g->nodes[k].out[0], id);
    tb_opt_kill(g, k);
    return 1;
}

static tb_status quantize_explicit(tb_graph *g, int *n_fused, int *n_folded) {
    tb_opt_index ix;
    TB_TRY(tb_opt_index_build(g, &ix));
    tb_status err = TB_OK;
    for (int k = 0; k < g->n_nodes && err == TB_OK; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || (n->op != TB_OP_CONV && n->op != TB_OP_GEMM && n->op != TB_OP_NN_MATMUL)) continue;
        mm_parts p;
        int src, zero, codes_v;
        float a_scale, *scales = NULL;
        if (!parts_of(g, n, &p) || !act_qdq(g, &ix, p.x, &src, &a_scale, &zero)) continue;
        if (!weight_dq(g, &ix, p.w, &p, n->op == TB_OP_CONV || !p.w_kn ? 0 : 1, &codes_v, &scales)) continue;
        int8_t *codes;
        float *unused;
        mm_parts pc = p;
        pc.x = src;
        if ((err = weight_codes(&pc, NULL, g->values[codes_v].data, &codes, &unused)) != TB_OK) { free(scales); break; }
        free(unused);
        if (place_quantized(g, k, &pc, codes, scales, a_scale, zero, &err)) {
            (*n_fused)++;
            tb_opt_index_free(&ix);
            if ((err = tb_opt_index_build(g, &ix)) != TB_OK) return err;
        }
    }
    tb_opt_index_free(&ix);
    for (int k = 0; k < g->n_nodes && err == TB_OK; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || n->op != TB_OP_DEQUANTIZE_LINEAR || g->values[n->in[0]].dtype != TB_I8) continue;
        if (tb_opt_uses(g, n->out[0]) == 0) continue;
        int gout = 0;
        for (int i = 0; i < g->n_outputs; i++) gout |= g->outputs[i] == n->out[0];
        if (!gout && fold_dq(g, k, &err)) (*n_folded)++;
    }
    return err;
}

/* ---------------------------------------------------------------- calibrated */

static tb_status quantize_calibrated(tb_graph *g, const tb_nn_quant_options *q, int *n_q, int *n_kept) {
    tb_status err = TB_OK;
    for (int k = 0; k < g->n_nodes && err == TB_OK; k++) {
        const tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || (n->op != TB_OP_CONV && n->op != TB_OP_GEMM && n->op != TB_OP_NN_MATMUL)) continue;
        mm_parts p;
        if (!parts_of(g, n, &p) || !tb_opt_weight_f32(g, p.w)) continue;
        if (tb_opt_nn_quant_input(g, k, q) < 0) { (*n_kept)++; continue; }
        const tb_nn_act_quant *a = NULL;
        for (int i = 0; i < q->n_acts && !a; i++)
            if (!strcmp(q->acts[i].tensor, g->values[p.x].name)) a = &q->acts[i];
        if (!a || !(a->scale > 0) || !isfinite(a->scale)) { (*n_kept)++; continue; }
        int8_t *codes;
        float *scales;
        if ((err = weight_codes(&p, tb_opt_weight_f32(g, p.w), NULL, &codes, &scales)) != TB_OK) break;
        if (place_quantized(g, k, &p, codes, scales, a->scale, a->zero, &err)) (*n_q)++;
        else (*n_kept)++;
    }
    return err;
}

tb_status tb_opt_quantize_nn(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    int fused = 0, folded = 0, nq = 0, kept = 0;
    TB_TRY(quantize_explicit(g, &fused, &folded));
    if (o && o->nn_quant) TB_TRY(quantize_calibrated(g, o->nn_quant, &nq, &kept));
    r->changes = fused + folded + nq;
    if (o && o->nn_quant)
        snprintf(r->what, sizeof r->what, "%d Conv / Gemm / MatMul quantized to int8 (%d kept in f32); %d from "
                 "Q/DQ nodes, %d DequantizeLinear of constants folded", nq, kept, fused, folded);
    else
        snprintf(r->what, sizeof r->what, "%d Conv / Gemm / MatMul with Q/DQ around them quantized to int8, %d "
                 "DequantizeLinear of constants folded", fused, folded);
    return TB_OK;
}
