/*
 * nn_conv.c — definitions of the compute group (ops_nn.def): Conv, Gemm,
 * MatMul and the fused attention (sdpa), each with its attribute schema,
 * shape rule and scalar reference kernel. The references accumulate in
 * double and apply the fused epilogue of ops_nn.h:
 *   y = act(alpha * op(a, b) + bias) + residual, or
 *   y = act(alpha * op(a, b) + bias + residual) with TB_NN_ACT_AFTER_RESIDUAL.
 * Input positions: the residual, when TB_NN_HAS_RESIDUAL is set, is the last
 * input; a bias is the input after the two operands when one is left (an
 * importer that sets TB_NN_HAS_BIAS or simply passes ONNX's third input gets
 * the same reading).
 * Inputs are f32, f16 or bf16, all of one dtype (an additive sdpa mask any
 * of them), and the output takes it; the kernels compute through f32
 * copies of the 16-bit operands (with_f32).
 */
#include "ir/ops_nn.h"
#include "ir/nn_epi.h"

#include <float.h>
#include <math.h>

#define NEED(cond, ...) do { if (!(cond)) return tb_errorf(TB_ERR_FORMAT, __VA_ARGS__); } while (0)

/* ---------------------------------------------------------------- shared pieces */

double tb_nn_act_apply(tb_nn_act a, double x, float p0, float p1) {
    switch (a) {
    case TB_NN_ACT_NONE: return x;
    case TB_NN_ACT_RELU: return x > 0 ? x : 0;
    case TB_NN_ACT_GELU_ERF: return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
    case TB_NN_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
    case TB_NN_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case TB_NN_ACT_CLIP: return x < p0 ? p0 : x > p1 ? p1 : x;
    case TB_NN_ACT_TANH: return tanh(x);
    }
    return x;
}


static int float_act(tb_dtype t) { return t == TB_F32 || t == TB_F16 || t == TB_BF16; }

/* Every input float (f32, f16 or bf16) and of the first input's dtype, which
 * the output takes. */
static tb_status need_float(const char *op, const tb_view *in, int n_in) {
    NEED(float_act(in[0].dtype), "%s: input 0 must be f32, f16 or bf16 (is %s)", op, tb_dtype_name(in[0].dtype));
    for (int k = 1; k < n_in; k++)
        NEED(in[k].dtype == in[0].dtype, "%s: input %d is %s, input 0 %s (one dtype for all)", op, k,
             tb_dtype_name(in[k].dtype), tb_dtype_name(in[0].dtype));
    return TB_OK;
}

/* The kernels below read and write f32. Other float dtypes (f16, bf16) go
 * through f32 copies: each such input widened into a temporary, the output
 * computed in f32 and rounded to its dtype (a reference: speed is not the
 * point, and the sums are in double either way). */
typedef tb_status (*ref_f32_fn)(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out);

static tb_status with_f32(ref_f32_fn f, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                          int n_out) {
    int widen = out[0].dtype != TB_F32;
    for (int k = 0; k < n_in; k++) widen |= in[k].dtype == TB_F16 || in[k].dtype == TB_BF16;
    if (!widen) return f(n, in, n_in, out, n_out);
    tb_view win[TB_MAX_INPUTS], wout = out[0];
    float *tmp[TB_MAX_INPUTS + 1] = {0};
    tb_status s = TB_OK;
    for (int k = 0; k < n_in; k++) {
        win[k] = in[k];
        if (in[k].dtype != TB_F16 && in[k].dtype != TB_BF16) continue;
        int64_t ne = tb_view_numel(&in[k]);
        if (!(tmp[k] = malloc((size_t)(ne > 0 ? ne : 1) * sizeof(float)))) { s = TB_ERR_OOM; goto done; }
        for (int64_t i = 0; i < ne; i++) tmp[k][i] = (float)tb_view_get_f(&in[k], i);
        win[k].dtype = TB_F32;
        win[k].data = tmp[k];
    }
    int64_t no = tb_view_numel(&out[0]);
    if (out[0].dtype != TB_F32) {
        if (!(tmp[n_in] = malloc((size_t)(no > 0 ? no : 1) * sizeof(float)))) { s = TB_ERR_OOM; goto done; }
        wout.dtype = TB_F32;
        wout.data = tmp[n_in];
    }
    s = f(n, win, n_in, &wout, 1);
    if (s == TB_OK && out[0].dtype != TB_F32)
        for (int64_t i = 0; i < no; i++) {
            float v = tmp[n_in][i];
            if (out[0].dtype == TB_F16) ((uint16_t *)out[0].data)[i] = tb_f32_to_f16(v);
            else ((uint16_t *)out[0].data)[i] = tb_f32_to_bf16(v);
        }
done:
    for (int k = 0; k <= n_in; k++) free(tmp[k]);
    return s == TB_ERR_OOM ? tb_errorf(TB_ERR_OOM, "%s: out of memory widening to f32", tb_op_name(n->op)) : s;
}

/* the residual must have the output's shape (dims known on both sides) */
static tb_status check_residual(const char *op, const tb_view *r, const tb_op_shape *out) {
    NEED(r->rank == out->rank[0], "%s: residual rank %d, output rank %d", op, r->rank, out->rank[0]);
    for (int d = 0; d < r->rank; d++)
        NEED(!tb_dim_known(r->dims[d]) || !tb_dim_known(out->dims[0][d]) || r->dims[d] == out->dims[0][d],
             "%s: residual dim %d is %lld, output's %lld", op, d, (long long)r->dims[d],
             (long long)out->dims[0][d]);
    return TB_OK;
}

/* ---------------------------------------------------------------- Conv */

enum {
    CONV_GROUP = 0, CONV_STRIDE_H, CONV_STRIDE_W, CONV_PAD_T, CONV_PAD_L, CONV_PAD_B, CONV_PAD_R, CONV_DIL_H,
    CONV_DIL_W, CONV_AUTO_PAD, CONV_ACT, CONV_FLAGS,
};

/* One spatial axis: input size in, kernel k, stride s, dilation d, explicit
 * pads; auto_pad resolves them. Output size, or -1 when empty. */
static int64_t conv_axis(int64_t in, int k, int s, int d, int autopad, int *pb, int *pe) {
    int64_t ek = (int64_t)(k - 1) * d + 1;
    if (autopad == TB_NN_PAD_SAME_UPPER || autopad == TB_NN_PAD_SAME_LOWER) {
        int64_t out = (in + s - 1) / s;
        int64_t total = (out - 1) * s + ek - in;
        if (total < 0) total = 0;
        int64_t small = total / 2;
        *pb = (int)(autopad == TB_NN_PAD_SAME_UPPER ? small : total - small);
        *pe = (int)(total - *pb);
        return out;
    }
    if (autopad == TB_NN_PAD_VALID) *pb = *pe = 0;
    int64_t span = in + *pb + *pe - ek;
    return span < 0 ? -1 : span / s + 1;
}

tb_status tb_nn_conv_geometry(const tb_node *n, const tb_view *x, const tb_view *w, tb_nn_conv_geom *g) {
    NEED(x->rank == 3 || x->rank == 4, "Conv: x must be (N, C, H, W) or (N, C, W), rank %d", x->rank);
    NEED(w->rank == x->rank, "Conv: w rank %d, x rank %d", w->rank, x->rank);
    const int32_t *a = n->i;
    int r4 = x->rank == 4;
    memset(g, 0, sizeof *g);
    g->group = a[CONV_GROUP] > 0 ? a[CONV_GROUP] : 1;
    g->n = x->dims[0];
    g->c = x->dims[1];
    g->h = r4 ? x->dims[2] : 1;
    g->w = x->dims[x->rank - 1];
    g->m = w->dims[0];
    g->kh = r4 ? (int)w->dims[2] : 1;
    g->kw = (int)w->dims[w->rank - 1];
    g->sh = r4 && a[CONV_STRIDE_H] > 0 ? a[CONV_STRIDE_H] : 1;
    g->sw = a[CONV_STRIDE_W] > 0 ? a[CONV_STRIDE_W] : 1;
    g->dh = r4 && a[CONV_DIL_H] > 0 ? a[CONV_DIL_H] : 1;
    g->dw = a[CONV_DIL_W] > 0 ? a[CONV_DIL_W] : 1;
    g->pt = r4 ? a[CONV_PAD_T] : 0;
    g->pb = r4 ? a[CONV_PAD_B] : 0;
    g->pl = a[CONV_PAD_L];
    g->pr = a[CONV_PAD_R];
    NEED(g->c == w->dims[1] * g->group, "Conv: x has %lld channels, w (%lld per group) x %d groups",
         (long long)g->c, (long long)w->dims[1], g->group);
    NEED(g->m % g->group == 0, "Conv: %lld output channels not a multiple of %d groups", (long long)g->m, g->group);
    NEED(g->kh >= 1 && g->kw >= 1, "Conv: empty kernel");
    g->oh = conv_axis(g->h, g->kh, g->sh, g->dh, a[CONV_AUTO_PAD], &g->pt, &g->pb);
    g->ow = conv_axis(g->w, g->kw, g->sw, g->dw, a[CONV_AUTO_PAD], &g->pl, &g->pr);
    NEED(g->oh >= 1 && g->ow >= 1, "Conv: the kernel is larger than the padded input");
    return TB_OK;
}

static tb_status conv_infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    TB_TRY(need_float("Conv", in, n_in));
    const tb_view *x = &in[0], *w = &in[1];
    NEED(x->rank == 3 || x->rank == 4, "Conv: x must be (N, C, H, W) or (N, C, W), rank %d", x->rank);
    NEED(w->rank == x->rank, "Conv: w rank %d, x rank %d", w->rank, x->rank);
    int group = n->i[CONV_GROUP] > 0 ? n->i[CONV_GROUP] : 1;
    int r = x->rank, ns = r - 2;
    if (tb_dim_known(x->dims[1]) && tb_dim_known(w->dims[1]))
        NEED(x->dims[1] == w->dims[1] * group, "Conv: x has %lld channels, w (%lld per group) x %d groups",
             (long long)x->dims[1], (long long)w->dims[1], group);
    if (tb_dim_known(w->dims[0]))
        NEED(w->dims[0] % group == 0, "Conv: %lld output channels not a multiple of %d groups",
             (long long)w->dims[0], group);
    out->rank[0] = r;
    out->dims[0][0] = x->dims[0];
    out->dims[0][1] = w->dims[0];
    for (int s = 0; s < ns; s++) {
        int64_t xi = x->dims[2 + s], ki = w->dims[2 + s];
        int hax = ns == 2 && s == 0; /* the h axis of a rank-4 conv */
        int st = n->i[hax ? CONV_STRIDE_H : CONV_STRIDE_W], di = n->i[hax ? CONV_DIL_H : CONV_DIL_W];
        int pb = n->i[hax ? CONV_PAD_T : CONV_PAD_L], pe = n->i[hax ? CONV_PAD_B : CONV_PAD_R];
        if (!tb_dim_known(xi) || !tb_dim_known(ki)) { out->dims[0][2 + s] = TB_DIM_DYN; continue; }
        int64_t o = conv_axis(xi, (int)ki, st > 0 ? st : 1, di > 0 ? di : 1, n->i[CONV_AUTO_PAD], &pb, &pe);
        NEED(o >= 1, "Conv: kernel %lld is larger than the padded input %lld", (long long)ki, (long long)xi);
        out->dims[0][2 + s] = o;
    }
    int bias, res;
    epi_inputs(n->i[CONV_FLAGS], n_in, 2, &bias, &res);
    if (bias >= 0)
        NEED(in[bias].rank == 1 && (!tb_dim_known(in[bias].dims[0]) || !tb_dim_known(w->dims[0]) ||
                                    in[bias].dims[0] == w->dims[0]),
             "Conv: bias must be (M)");
    if (res >= 0) TB_TRY(check_residual("Conv", &in[res], out));
    out->dtype[0] = in[0].dtype;
    return TB_OK;
}

static tb_status conv_ref_f32(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    tb_nn_conv_geom g;
    TB_TRY(tb_nn_conv_geometry(n, &in[0], &in[1], &g));
    int bi, ri;
    int flags = n->i[CONV_FLAGS];
    epi_inputs(flags, n_in, 2, &bi, &ri);
    const float *x = in[0].data, *w = in[1].data;
    const float *bias = bi >= 0 ? in[bi].data : NULL, *res = ri >= 0 ? in[ri].data : NULL;
    float *y = out[0].data;
    int64_t cg = g.c / g.group, mg = g.m / g.group;
    for (int64_t b = 0; b < g.n; b++)
        for (int64_t m = 0; m < g.m; m++) {
            int64_t grp = m / mg;
            for (int64_t oy = 0; oy < g.oh; oy++)
                for (int64_t ox = 0; ox < g.ow; ox++) {
                    double acc = bias ? bias[m] : 0.0;
                    for (int64_t c = 0; c < cg; c++)
                        for (int ky = 0; ky < g.kh; ky++) {
                            int64_t iy = oy * g.sh - g.pt + (int64_t)ky * g.dh;
                            if (iy < 0 || iy >= g.h) continue;
                            for (int kx = 0; kx < g.kw; kx++) {
                                int64_t ix = ox * g.sw - g.pl + (int64_t)kx * g.dw;
                                if (ix < 0 || ix >= g.w) continue;
                                acc += (double)x[((b * g.c + grp * cg + c) * g.h + iy) * g.w + ix] *
                                       w[((m * cg + c) * g.kh + ky) * g.kw + kx];
                            }
                        }
                    int64_t o = ((b * g.m + m) * g.oh + oy) * g.ow + ox;
                    y[o] = epi_apply(acc, n->i[CONV_ACT], n->f[0], n->f[1], flags & TB_NN_ACT_AFTER_RESIDUAL, res, o);
                }
        }
    return TB_OK;
}

/* ---------------------------------------------------------------- Gemm */

enum { GEMM_TRANS_A = 0, GEMM_TRANS_B, GEMM_ACT, GEMM_FLAGS };

static tb_status gemm_infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    TB_TRY(need_float("Gemm", in, n_in));
    const tb_view *a = &in[0], *b = &in[1];
    NEED(a->rank == 2 && b->rank == 2, "Gemm: a and b must be rank 2 (ranks %d, %d)", a->rank, b->rank);
    int ta = n->i[GEMM_TRANS_A], tb = n->i[GEMM_TRANS_B];
    int64_t M = a->dims[ta ? 1 : 0], Ka = a->dims[ta ? 0 : 1], Kb = b->dims[tb ? 1 : 0], N = b->dims[tb ? 0 : 1];
    NEED(!tb_dim_known(Ka) || !tb_dim_known(Kb) || Ka == Kb, "Gemm: K is %lld for a, %lld for b", (long long)Ka,
         (long long)Kb);
    out->rank[0] = 2;
    out->dims[0][0] = M;
    out->dims[0][1] = N;
    int bias, res;
    epi_inputs(n->i[GEMM_FLAGS], n_in, 2, &bias, &res);
    if (bias >= 0) {
        int rk;
        int64_t bd[TB_MAX_RANK];
        NEED(in[bias].rank <= 2, "Gemm: c must have rank <= 2");
        TB_TRY(tb_shape_broadcast(in[bias].rank, in[bias].dims, 2, out->dims[0], &rk, bd));
        for (int d = 0; d < 2; d++)
            NEED(!tb_dim_known(bd[d]) || !tb_dim_known(out->dims[0][d]) || bd[d] == out->dims[0][d],
                 "Gemm: c does not broadcast to (M, N)");
    }
    if (res >= 0) TB_TRY(check_residual("Gemm", &in[res], out));
    out->dtype[0] = in[0].dtype;
    return TB_OK;
}

static tb_status gemm_ref_f32(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int ta = n->i[GEMM_TRANS_A], tb = n->i[GEMM_TRANS_B], flags = n->i[GEMM_FLAGS];
    int64_t M = out[0].dims[0], N = out[0].dims[1], K = in[0].dims[ta ? 0 : 1];
    int64_t lda = in[0].dims[1], ldb = in[1].dims[1];
    const float *A = in[0].data, *B = in[1].data;
    int bi, ri;
    epi_inputs(flags, n_in, 2, &bi, &ri);
    const float *c = bi >= 0 ? in[bi].data : NULL, *res = ri >= 0 ? in[ri].data : NULL;
    /* c's strides over (M, N): a dim of 1 (or absent) broadcasts */
    int64_t cs_m = 0, cs_n = 0;
    if (c) {
        int r = in[bi].rank;
        int64_t cm = r == 2 ? in[bi].dims[0] : 1, cn = r >= 1 ? in[bi].dims[r - 1] : 1;
        cs_n = cn == 1 ? 0 : 1;
        cs_m = cm == 1 ? 0 : cn;
    }
    double alpha = n->f[0], beta = n->f[1];
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            double v = alpha * acc + (c ? beta * c[i * cs_m + j * cs_n] : 0.0);
            ((float *)out[0].data)[i * N + j] =
                epi_apply(v, n->i[GEMM_ACT], n->f[2], n->f[3], flags & TB_NN_ACT_AFTER_RESIDUAL, res, i * N + j);
        }
    return TB_OK;
}

/* ---------------------------------------------------------------- MatMul */

enum { MM_TRANS_A = 0, MM_TRANS_B, MM_ACT, MM_FLAGS };

/* The matrix view of a MatMul operand: rows x cols of its last two dims as
 * read (after the trans flag), 1-d operands promoted as numpy does. */
typedef struct {
    int64_t rows, cols;
    int nb;                 /* batch dims */
    const int64_t *bdims;
} mm_side;

static void mm_side_of(const tb_view *v, int trans, int is_b, mm_side *s) {
    if (v->rank == 1) {
        s->rows = is_b ? v->dims[0] : 1;
        s->cols = is_b ? 1 : v->dims[0];
        s->nb = 0;
        s->bdims = NULL;
        return;
    }
    int64_t r = v->dims[v->rank - 2], c = v->dims[v->rank - 1];
    s->rows = trans ? c : r;
    s->cols = trans ? r : c;
    s->nb = v->rank - 2;
    s->bdims = v->dims;
}

static tb_status mm_infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    TB_TRY(need_float("MatMul", in, n_in));
    const tb_view *a = &in[0], *b = &in[1];
    NEED(a->rank >= 1 && b->rank >= 1, "MatMul: scalar operand");
    mm_side sa, sb;
    mm_side_of(a, n->i[MM_TRANS_A], 0, &sa);
    mm_side_of(b, n->i[MM_TRANS_B], 1, &sb);
    NEED(!tb_dim_known(sa.cols) || !tb_dim_known(sb.rows) || sa.cols == sb.rows,
         "MatMul: K is %lld for a, %lld for b", (long long)sa.cols, (long long)sb.rows);
    int rb = 0;
    int64_t bd[TB_MAX_RANK];
    TB_TRY(tb_shape_broadcast(sa.nb, sa.bdims, sb.nb, sb.bdims, &rb, bd));
    int r = rb;
    memcpy(out->dims[0], bd, sizeof(int64_t) * rb);
    if (a->rank > 1) out->dims[0][r++] = sa.rows;
    if (b->rank > 1) out->dims[0][r++] = sb.cols;
    NEED(r <= TB_MAX_RANK, "MatMul: rank");
    out->rank[0] = r;
    int bias, res;
    epi_inputs(n->i[MM_FLAGS], n_in, 2, &bias, &res);
    if (bias >= 0)
        NEED(in[bias].rank == 1 && (!tb_dim_known(in[bias].dims[0]) || !tb_dim_known(sb.cols) ||
                                    in[bias].dims[0] == sb.cols),
             "MatMul: bias must be (N)");
    if (res >= 0) TB_TRY(check_residual("MatMul", &in[res], out));
    out->dtype[0] = in[0].dtype;
    return TB_OK;
}

/* Offset (in matrices) of operand `v` for output batch index `ob`. */
static int64_t mm_batch_offset(const mm_side *s, int rb, const int64_t *obd, int64_t ob) {
    int64_t off = 0, stride = 1;
    for (int d = rb - 1; d >= 0; d--) {
        int64_t idx = ob % obd[d];
        ob /= obd[d];
        int sd = d - (rb - s->nb);
        if (sd < 0) continue;
        if (s->bdims[sd] != 1) off += idx * stride;
        stride *= s->bdims[sd];
    }
    return off;
}

static tb_status mm_ref_f32(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *a = &in[0], *b = &in[1];
    int ta = a->rank > 1 && n->i[MM_TRANS_A], tb = b->rank > 1 && n->i[MM_TRANS_B], flags = n->i[MM_FLAGS];
    mm_side sa, sb;
    mm_side_of(a, ta, 0, &sa);
    mm_side_of(b, tb, 1, &sb);
    int64_t M = sa.rows, K = sa.cols, N = sb.cols;
    int rb = out[0].rank - (a->rank > 1) - (b->rank > 1);
    int64_t nbatch = 1;
    for (int d = 0; d < rb; d++) nbatch *= out[0].dims[d];
    int bi, ri;
    epi_inputs(flags, n_in, 2, &bi, &ri);
    const float *bias = bi >= 0 ? in[bi].data : NULL, *res = ri >= 0 ? in[ri].data : NULL;
    double alpha = n->f[0] != 0.0f ? n->f[0] : 1.0;
    /* stored leading dims: a (M, K) or (K, M), b (K, N) or (N, K) */
    int64_t lda = a->rank > 1 ? a->dims[a->rank - 1] : K, ldb = b->rank > 1 ? b->dims[b->rank - 1] : 1;
    const float *A0 = a->data, *B0 = b->data;
    float *Y = out[0].data;
    for (int64_t ob = 0; ob < nbatch; ob++) {
        const float *A = A0 + mm_batch_offset(&sa, rb, out[0].dims, ob) * M * K;
        const float *B = B0 + mm_batch_offset(&sb, rb, out[0].dims, ob) * K * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                int64_t o = (ob * M + i) * N + j;
                Y[o] = epi_apply(alpha * acc + (bias ? bias[j] : 0.0), n->i[MM_ACT], n->f[2], n->f[3],
                                 flags & TB_NN_ACT_AFTER_RESIDUAL, res, o);
            }
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- sdpa */

enum { SDPA_CAUSAL = 0, SDPA_K_TRANSPOSED, SDPA_MASK_KIND, SDPA_HEADS, SDPA_PACKED };

/* The heads layout (i[3] > 0, ops_nn.h): q (B, S, H*D), k (B, T, H*D), v (B,
 * T, H*Dv), or one packed (B, S, 3*H*D) value; out (B, S, H*Dv). */
static tb_status sdpa_infer_heads(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *q = &in[0], *k = &in[1], *v = &in[2];
    int64_t H = n->i[SDPA_HEADS];
    int packed = n->i[SDPA_PACKED];
    NEED(q->rank == 3 && k->rank == 3 && v->rank == 3, "sdpa: heads layout wants (B, S, H*D) (ranks %d %d %d)",
         q->rank, k->rank, v->rank);
    NEED(!n->i[SDPA_K_TRANSPOSED], "sdpa: heads layout with k transposed");
    for (int d = 0; packed && d < 3; d++)
        NEED(!tb_dim_known(q->dims[d]) || !tb_dim_known(k->dims[d]) || !tb_dim_known(v->dims[d]) ||
                 (q->dims[d] == k->dims[d] && q->dims[d] == v->dims[d]),
             "sdpa: packed q, k, v differ in dim %d", d);
    NEED(q->dtype == k->dtype && q->dtype == v->dtype, "sdpa: q, k, v dtypes differ");
    int64_t C = q->dims[2], Dv = TB_DIM_DYN;
    if (packed) {
        NEED(!tb_dim_known(C) || C % (3 * H) == 0, "sdpa: packed width %lld is not 3 x %lld heads", (long long)C,
             (long long)H);
        if (tb_dim_known(C)) Dv = C / (3 * H) * H;
    } else {
        NEED(!tb_dim_known(C) || C % H == 0, "sdpa: q width %lld is not %lld heads", (long long)C, (long long)H);
        NEED(!tb_dim_known(C) || !tb_dim_known(k->dims[2]) || C == k->dims[2], "sdpa: q width %lld, k %lld",
             (long long)C, (long long)k->dims[2]);
        NEED(!tb_dim_known(v->dims[2]) || v->dims[2] % H == 0, "sdpa: v width %lld is not %lld heads",
             (long long)v->dims[2], (long long)H);
        NEED(!tb_dim_known(k->dims[1]) || !tb_dim_known(v->dims[1]) || k->dims[1] == v->dims[1],
             "sdpa: k has T %lld, v %lld", (long long)k->dims[1], (long long)v->dims[1]);
        Dv = v->dims[2];
    }
    for (int d = 0; d < 1; d++)
        NEED(!tb_dim_known(q->dims[d]) || !tb_dim_known(k->dims[d]) || !tb_dim_known(v->dims[d]) ||
                 (q->dims[d] == k->dims[d] && q->dims[d] == v->dims[d]),
             "sdpa: q, k, v differ in dim %d", d);
    int mk = n->i[SDPA_MASK_KIND];
    NEED((mk == 0) == (n_in == 3), "sdpa: mask kind %d with %d inputs", mk, n_in);
    if (mk) {
        const tb_view *m = &in[3];
        NEED(mk == 1 ? float_act(m->dtype) : m->dtype == TB_BOOL, "sdpa: mask kind %d wants a%s mask", mk,
             mk == 1 ? " float" : " bool");
        NEED(m->rank <= 4, "sdpa: mask rank %d", m->rank);
        int64_t want[4] = {q->dims[0], H, q->dims[1], packed ? q->dims[1] : k->dims[1]}, bd[TB_MAX_RANK];
        int rk;
        TB_TRY(tb_shape_broadcast(m->rank, m->dims, 4, want, &rk, bd));
    }
    out->rank[0] = 3;
    out->dims[0][0] = q->dims[0];
    out->dims[0][1] = q->dims[1];
    out->dims[0][2] = Dv;
    out->dtype[0] = q->dtype;
    return TB_OK;
}

static tb_status sdpa_infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *q = &in[0], *k = &in[1], *v = &in[2];
    TB_TRY(need_float("sdpa", in, 3));
    if (n->i[SDPA_HEADS] > 0) return sdpa_infer_heads(n, in, n_in, out);
    NEED(!n->i[SDPA_PACKED], "sdpa: packed q, k, v without heads");
    int r = q->rank;
    NEED(r >= 3 && r <= 4 && k->rank == r && v->rank == r, "sdpa: q, k, v must be (B, H, S, D) (ranks %d %d %d)",
         q->rank, k->rank, v->rank);
    int kt = n->i[SDPA_K_TRANSPOSED];
    for (int d = 0; d < r - 2; d++)
        NEED(!tb_dim_known(q->dims[d]) || !tb_dim_known(k->dims[d]) || !tb_dim_known(v->dims[d]) ||
                 (q->dims[d] == k->dims[d] && q->dims[d] == v->dims[d]),
             "sdpa: q, k, v differ in dim %d", d);
    int64_t D = q->dims[r - 1], kD = k->dims[kt ? r - 2 : r - 1], kT = k->dims[kt ? r - 1 : r - 2];
    int64_t vT = v->dims[r - 2];
    NEED(!tb_dim_known(D) || !tb_dim_known(kD) || D == kD, "sdpa: q has D %lld, k %lld", (long long)D,
         (long long)kD);
    NEED(!tb_dim_known(kT) || !tb_dim_known(vT) || kT == vT, "sdpa: k has T %lld, v %lld", (long long)kT,
         (long long)vT);
    int mk = n->i[SDPA_MASK_KIND];
    NEED((mk == 0) == (n_in == 3), "sdpa: mask kind %d with %d inputs", mk, n_in);
    if (mk) {
        const tb_view *m = &in[3];
        NEED(mk == 1 ? float_act(m->dtype) : m->dtype == TB_BOOL, "sdpa: mask kind %d wants a%s mask", mk,
             mk == 1 ? " float" : " bool");
        NEED(m->rank <= r, "sdpa: mask rank %d", m->rank);
        int64_t want[TB_MAX_RANK], bd[TB_MAX_RANK];
        memcpy(want, q->dims, sizeof(int64_t) * r);
        want[r - 1] = kT;
        int rk;
        TB_TRY(tb_shape_broadcast(m->rank, m->dims, r, want, &rk, bd));
    }
    out->rank[0] = r;
    memcpy(out->dims[0], q->dims, sizeof(int64_t) * r);
    out->dims[0][r - 1] = v->dims[r - 1];
    out->dtype[0] = in[0].dtype;
    return TB_OK;
}

void tb_nn_sdpa_mask_strides(const tb_view *m, int r, int64_t *st) {
    int64_t s = 1;
    for (int d = r - 1; d >= 0; d--) {
        int md = d - (r - m->rank);
        if (md < 0) { st[d] = 0; continue; }
        st[d] = m->dims[md] == 1 ? 0 : s;
        s *= m->dims[md];
    }
}

static tb_status sdpa_ref_f32(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *qv = &in[0], *kv = &in[1], *vv = &in[2];
    int causal = n->i[SDPA_CAUSAL], mk = n->i[SDPA_MASK_KIND];
    tb_nn_sdpa_geom g;
    if (!tb_nn_sdpa_geometry(n, qv->rank, qv->dims, kv->dims, vv->dims, &g))
        return tb_errorf(TB_ERR_FORMAT, "sdpa: operands do not fit the layout");
    int64_t B = g.B, H = g.H, S = g.S, D = g.D, T = g.T, Dv = g.Dv;
    double scale = n->f[0] != 0.0f ? n->f[0] : 1.0 / sqrt((double)D);
    int64_t mst[4] = {0, 0, 0, 0};
    /* the mask broadcasts to the logical (B, H, S, T) in every layout */
    int mr = n->i[SDPA_HEADS] > 0 ? 4 : qv->rank;
    if (mk) tb_nn_sdpa_mask_strides(&in[3], mr, mst + (4 - mr));
    double *sc = malloc(sizeof(double) * (size_t)(T > 0 ? T : 1));
    if (!sc) return tb_errorf(TB_ERR_OOM, "sdpa: out of memory");
    const int64_t(*st)[4] = g.st;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = (const float *)qv->data + g.off[0] + b * st[0][0] + h * st[0][1];
            const float *k = (const float *)kv->data + g.off[1] + b * st[1][0] + h * st[1][1];
            const float *v = (const float *)vv->data + g.off[2] + b * st[2][0] + h * st[2][1];
            float *y = (float *)out[0].data + g.off[3] + b * st[3][0] + h * st[3][1];
            for (int64_t s = 0; s < S; s++) {
                double mx = -INFINITY;
                for (int64_t t = 0; t < T; t++) {
                    double acc = 0;
                    for (int64_t d = 0; d < D; d++)
                        acc += (double)q[s * st[0][2] + d * st[0][3]] * k[t * st[1][2] + d * st[1][3]];
                    acc *= scale;
                    if (mk) {
                        int64_t mo = b * mst[0] + h * mst[1] + s * mst[2] + t * mst[3];
                        if (mk == 1) acc += ((const float *)in[3].data)[mo];
                        else if (!((const uint8_t *)in[3].data)[mo]) acc = -INFINITY;
                    }
                    if (causal && t > s) acc = -INFINITY;
                    sc[t] = acc;
                    if (acc > mx) mx = acc;
                }
                double sum = 0;
                for (int64_t t = 0; t < T; t++) {
                    sc[t] = mx == -INFINITY ? 0.0 : exp(sc[t] - mx);
                    sum += sc[t];
                }
                for (int64_t e = 0; e < Dv; e++) {
                    double acc = 0;
                    for (int64_t t = 0; t < T; t++) acc += sc[t] * v[t * st[2][2] + e * st[2][3]];
                    y[s * st[3][2] + e * st[3][3]] = sum > 0 ? (float)(acc / sum) : 0.0f;
                }
            }
        }
    free(sc);
    (void)n_in;
    (void)n_out;
    return TB_OK;
}

static tb_status conv_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    return with_f32(conv_ref_f32, n, in, n_in, out, n_out);
}
static tb_status gemm_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    return with_f32(gemm_ref_f32, n, in, n_in, out, n_out);
}
static tb_status mm_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    return with_f32(mm_ref_f32, n, in, n_in, out, n_out);
}
static tb_status sdpa_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    return with_f32(sdpa_ref_f32, n, in, n_in, out, n_out);
}

/* ---------------------------------------------------------------- the table */

#define I32(name, slot, lo, hi, doc) {name, TB_ATTR_INT, slot, 0, 32, lo, hi, doc}
#define BOOL_ATTR(name, slot, doc) {name, TB_ATTR_BOOL, slot, 0, 32, 0, 1, doc}
#define F32(name, slot, lo, hi, doc) {name, TB_ATTR_FLOAT, slot, 0, 32, lo, hi, doc}
#define DIM_HI 65536.0
#define ACT_ATTR(slot) I32("activation", slot, 0, TB_NN_ACT_TANH, "fused tb_nn_act epilogue")
#define FLAGS_ATTR(slot) I32("flags", slot, 0, 7, "TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL")
#define ACT_PARAMS(s0, s1)                                                                \
    F32("act_p0", s0, -INFINITY, INFINITY, "first activation parameter (clip: min)"),    \
        F32("act_p1", s1, -INFINITY, INFINITY, "second activation parameter (clip: max)")

static const tb_op_def conv_defs[] = {
    {"Conv", 2, 4, 1,
     "x (N, C, H, W) or (N, C, W), w (M, C/group, kh, kw) [, bias (M)] [, residual] -> (N, M, oh, ow)", 14,
     {I32("group", CONV_GROUP, 0, 1 << 24, "channel groups (0: 1)"),
      I32("stride_h", CONV_STRIDE_H, 0, DIM_HI, "0: 1"), I32("stride_w", CONV_STRIDE_W, 0, DIM_HI, "0: 1"),
      I32("pad_top", CONV_PAD_T, 0, DIM_HI, ""), I32("pad_left", CONV_PAD_L, 0, DIM_HI, ""),
      I32("pad_bottom", CONV_PAD_B, 0, DIM_HI, ""), I32("pad_right", CONV_PAD_R, 0, DIM_HI, ""),
      I32("dilation_h", CONV_DIL_H, 0, DIM_HI, "0: 1"), I32("dilation_w", CONV_DIL_W, 0, DIM_HI, "0: 1"),
      I32("auto_pad", CONV_AUTO_PAD, 0, TB_NN_PAD_VALID, "tb_nn_autopad"), ACT_ATTR(CONV_ACT),
      FLAGS_ATTR(CONV_FLAGS), ACT_PARAMS(0, 1)},
     NULL, conv_infer, conv_ref, 0, 0},
    {"Gemm", 2, 4, 1, "a (M, K) or (K, M), b (K, N) or (N, K) [, c (broadcast to (M, N))] [, residual] -> (M, N)",
     8,
     {BOOL_ATTR("transA", GEMM_TRANS_A, "a is (K, M)"), BOOL_ATTR("transB", GEMM_TRANS_B, "b is (N, K)"),
      ACT_ATTR(GEMM_ACT), FLAGS_ATTR(GEMM_FLAGS), F32("alpha", 0, -FLT_MAX, FLT_MAX, "scales a b"),
      F32("beta", 1, -FLT_MAX, FLT_MAX, "scales c"), ACT_PARAMS(2, 3)},
     NULL, gemm_infer, gemm_ref, 0, 0},
    {"MatMul", 2, 4, 1, "a (..., M, K), b (..., K, N) (broadcast batch) [, bias (N)] [, residual] -> (..., M, N)", 7,
     {BOOL_ATTR("trans_a", MM_TRANS_A, "a's last two dims read transposed"),
      BOOL_ATTR("trans_b", MM_TRANS_B, "b's last two dims read transposed"), ACT_ATTR(MM_ACT),
      FLAGS_ATTR(MM_FLAGS), F32("alpha", 0, -FLT_MAX, FLT_MAX, "scales a b (0: 1)"), ACT_PARAMS(2, 3)},
     NULL, mm_infer, mm_ref, 0, 0},
    {"sdpa", 3, 4, 1,
     "q (B, H, S, D), k (B, H, T, D) or (B, H, D, T), v (B, H, T, Dv) [, mask (to (B, H, S, T))] -> (B, H, S, Dv)"
     " (heads layout: (B, S, H*D) operands and output)",
     6,
     {BOOL_ATTR("causal", SDPA_CAUSAL, "t > s masked (upper-left aligned)"),
      BOOL_ATTR("k_transposed", SDPA_K_TRANSPOSED, "k is (B, H, D, T)"),
      I32("mask_kind", SDPA_MASK_KIND, 0, 2, "0 none, 1 additive f32, 2 bool keep-mask"),
      F32("scale", 0, 0, FLT_MAX, "applied to q.k (0: 1/sqrt(D))"),
      I32("heads", SDPA_HEADS, 0, 65535, "0: (B, H, S, D) operands; H: (B, S, H*D) operands, no head Transposes"),
      BOOL_ATTR("packed", SDPA_PACKED, "q, k, v (B, S, 3*H*D): q from columns [0, HD) of input 0, k [HD, 2HD) of 1, v the rest of 2")},
     NULL, sdpa_infer, sdpa_ref, 0, 0},
};

const tb_op_def *tb_nn_conv_def(tb_op_kind k) {
    switch (k) {
    case TB_OP_CONV: return &conv_defs[0];
    case TB_OP_GEMM: return &conv_defs[1];
    case TB_OP_NN_MATMUL: return &conv_defs[2];
    case TB_OP_SDPA: return &conv_defs[3];
    default: return NULL;
    }
}
