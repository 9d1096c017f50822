/*
 * nn_quant.c — definitions of the quantization group (ops_nn.def):
 * ONNX's QuantizeLinear and DequantizeLinear, and the quantized Conv
 * ("QConv") and Gemm / MatMul ("QGemm") that INT8 engines run (made by
 * opt/nn_quant.c from calibrated f32 graphs or from explicit Q/DQ nodes).
 *
 * The quantized ops take f32 activations and quantize them inside the op
 * (per tensor: uint8 codes q = clamp(round_half_even(x * (1 / s)) + z, 0,
 * 255), as backend/cpu/igemm.h's tb_cpu_quantize_u8), weights as int8 codes
 * per output channel (symmetric, [-127, 127]) with one f32 scale each, and
 * sum (q - z) * w exactly in integers; the result is scaled back to f32
 * (s * w_scale[m] * sum), the bias added and the fused epilogue of Conv /
 * Gemm / MatMul applied (ops_nn.h). Their output is f32, so a quantized
 * layer replaces an f32 one without touching its neighbours.
 */
#include "ir/ops_nn.h"
#include "ir/nn_epi.h"

#include <float.h>
#include <math.h>

#define NEED(cond, ...) do { if (!(cond)) return tb_errorf(TB_ERR_FORMAT, __VA_ARGS__); } while (0)

/* ---------------------------------------------------------------- shared */

/* The activation code of x: QuantizeLinear to uint8 with 1 / scale
 * precomputed (the kernels' rounding, bit for bit). */
static inline int q_u8(float x, float inv_scale, int zero) {
    float v = nearbyintf(x * inv_scale) + (float)zero;
    return (int)(v < 0.f ? 0.f : v > 255.f ? 255.f : v);
}


/* ---------------------------------------------------------------- QuantizeLinear / DequantizeLinear */

enum { QL_AXIS = 0, QL_DTYPE };

/* The scale (and zero point) of a per-tensor or per-axis quantization: a
 * scalar (or one element), or 1-d with dims[axis] elements. */
static tb_status ql_check_param(const char *op, const char *what, const tb_view *x, const tb_view *p, int axis) {
    if (p->rank == 0 || (p->rank == 1 && p->dims[0] == 1)) return TB_OK;
    NEED(p->rank == 1, "%s: %s must be a scalar or 1-d (rank %d)", op, what, p->rank);
    NEED(axis >= 0 && axis < x->rank, "%s: axis %d outside x's rank %d", op, axis, x->rank);
    NEED(!tb_dim_known(p->dims[0]) || !tb_dim_known(x->dims[axis]) || p->dims[0] == x->dims[axis],
         "%s: %s has %lld elements, x's axis %d has %lld", op, what, (long long)p->dims[0], axis,
         (long long)x->dims[axis]);
    return TB_OK;
}

static tb_status ql_infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    int q = n->op == TB_OP_QUANTIZE_LINEAR;
    const char *op = q ? "QuantizeLinear" : "DequantizeLinear";
    const tb_view *x = &in[0];
    if (q) NEED(x->dtype == TB_F32, "%s: x must be f32 (is %s)", op, tb_dtype_name(x->dtype));
    else NEED(x->dtype == TB_I8 || x->dtype == TB_U8 || x->dtype == TB_I32, "%s: x must be int8, uint8 or int32 (is %s)",
              op, tb_dtype_name(x->dtype));
    NEED(in[1].dtype == TB_F32, "%s: the scale must be f32 (is %s)", op, tb_dtype_name(in[1].dtype));
    TB_TRY(ql_check_param(op, "the scale", x, &in[1], n->i[QL_AXIS]));
    tb_dtype qt = q ? (tb_dtype)n->i[QL_DTYPE] : x->dtype;
    if (q && qt != TB_I8) qt = TB_U8;
    if (n_in > 2) {
        TB_TRY(ql_check_param(op, "the zero point", x, &in[2], n->i[QL_AXIS]));
        if (q) qt = in[2].dtype;
        NEED(qt == TB_I8 || qt == TB_U8 || (!q && qt == TB_I32), "%s: the zero point must be int8 or uint8 (is %s)",
             op, tb_dtype_name(in[2].dtype));
        NEED(in[2].dtype == qt, "%s: the zero point is %s, x %s", op, tb_dtype_name(in[2].dtype), tb_dtype_name(qt));
    }
    out->n_out = 1;
    out->rank[0] = x->rank;
    memcpy(out->dims[0], x->dims, sizeof(int64_t) * (size_t)x->rank);
    out->dtype[0] = q ? qt : TB_F32;
    return TB_OK;
}

/* Index into the scale / zero point p of element i of x: 0 for a scalar,
 * else i's coordinate along axis (inner: the elements after that axis). */
static inline int64_t ql_index(const tb_view *p, int64_t i, int64_t inner, int64_t len) {
    return tb_view_numel(p) <= 1 ? 0 : (i / inner) % len;
}

static tb_status ql_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    int axis = n->i[QL_AXIS];
    int64_t N = tb_view_numel(x), inner = 1, len = 1;
    if (x->rank > 0 && axis < x->rank) {
        len = x->dims[axis];
        for (int d = axis + 1; d < x->rank; d++) inner *= x->dims[d];
    }
    const float *sc = in[1].data;
    const tb_view *zp = n_in > 2 ? &in[2] : NULL;
    if (n->op == TB_OP_QUANTIZE_LINEAR) {
        int lo = out[0].dtype == TB_I8 ? -128 : 0, hi = out[0].dtype == TB_I8 ? 127 : 255;
        const float *xf = x->data;
        for (int64_t i = 0; i < N; i++) {
            int64_t p = ql_index(&in[1], i, inner, len);
            /* ONNX's float32 arithmetic: x / scale, rounded half to even */
            float v = nearbyintf(xf[i] / sc[p]);
            double z = zp ? (double)tb_view_get_i(zp, ql_index(zp, i, inner, len)) : 0.0;
            double r = (double)v + z;
            r = r < lo ? lo : r > hi ? hi : r;
            if (out[0].dtype == TB_I8) ((int8_t *)out[0].data)[i] = (int8_t)r;
            else ((uint8_t *)out[0].data)[i] = (uint8_t)r;
        }
    } else {
        float *y = out[0].data;
        for (int64_t i = 0; i < N; i++) {
            int64_t z = zp ? tb_view_get_i(zp, ql_index(zp, i, inner, len)) : 0;
            y[i] = (float)(tb_view_get_i(x, i) - z) * sc[ql_index(&in[1], i, inner, len)];
        }
    }
    (void)n_out;
    return TB_OK;
}

/* ---------------------------------------------------------------- QConv */

/* Conv's slots (ops_nn.h) i[0..11], then: */
enum { QCONV_FLAGS = 11, QCONV_ZERO = 12 };

/* One spatial axis of the output: -1 when empty (nn_conv.c's rule). */
static int64_t out_axis(int64_t in, int k, int s, int d, int autopad, int pb, int pe) {
    int64_t ek = (int64_t)(k - 1) * d + 1;
    if (autopad == TB_NN_PAD_SAME_UPPER || autopad == TB_NN_PAD_SAME_LOWER) return (in + s - 1) / s;
    if (autopad == TB_NN_PAD_VALID) pb = pe = 0;
    int64_t span = in + pb + pe - ek;
    return span < 0 ? -1 : span / s + 1;
}

static tb_status check_residual(const char *op, const tb_view *r, const tb_op_shape *out) {
    NEED(r->rank == out->rank[0], "%s: residual rank %d, output rank %d", op, r->rank, out->rank[0]);
    for (int d = 0; d < r->rank; d++)
        NEED(!tb_dim_known(r->dims[d]) || !tb_dim_known(out->dims[0][d]) || r->dims[d] == out->dims[0][d],
             "%s: residual dim %d is %lld, output's %lld", op, d, (long long)r->dims[d], (long long)out->dims[0][d]);
    return TB_OK;
}

/* The weight side of a quantized op: codes int8 (M, ...), scales f32 (M). */
static tb_status check_weights(const char *op, const tb_view *w, const tb_view *s) {
    NEED(w->dtype == TB_I8, "%s: the weight codes must be int8 (are %s)", op, tb_dtype_name(w->dtype));
    NEED(s->dtype == TB_F32 && s->rank == 1, "%s: the weight scales must be f32 (M)", op);
    NEED(!tb_dim_known(s->dims[0]) || !tb_dim_known(w->dims[0]) || s->dims[0] == w->dims[0],
         "%s: %lld weight scales for %lld output channels", op, (long long)s->dims[0], (long long)w->dims[0]);
    return TB_OK;
}

static tb_status qconv_infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0], *w = &in[1];
    NEED(x->dtype == TB_F32, "QConv: x must be f32 (is %s)", tb_dtype_name(x->dtype));
    NEED(x->rank == 3 || x->rank == 4, "QConv: x must be (N, C, H, W) or (N, C, W), rank %d", x->rank);
    NEED(w->rank == x->rank, "QConv: w rank %d, x rank %d", w->rank, x->rank);
    TB_TRY(check_weights("QConv", w, &in[2]));
    int group = n->i[0] > 0 ? n->i[0] : 1;
    if (tb_dim_known(x->dims[1]) && tb_dim_known(w->dims[1]))
        NEED(x->dims[1] == w->dims[1] * group, "QConv: x has %lld channels, w (%lld per group) x %d groups",
             (long long)x->dims[1], (long long)w->dims[1], group);
    int r = x->rank, ns = r - 2;
    out->n_out = 1;
    out->rank[0] = r;
    out->dims[0][0] = x->dims[0];
    out->dims[0][1] = w->dims[0];
    for (int s = 0; s < ns; s++) {
        int64_t xi = x->dims[2 + s], ki = w->dims[2 + s];
        int hax = ns == 2 && s == 0;
        int st = n->i[hax ? 1 : 2], di = n->i[hax ? 7 : 8];
        int pb = n->i[hax ? 3 : 4], pe = n->i[hax ? 5 : 6];
        if (!tb_dim_known(xi) || !tb_dim_known(ki)) { out->dims[0][2 + s] = TB_DIM_DYN; continue; }
        int64_t o = out_axis(xi, (int)ki, st > 0 ? st : 1, di > 0 ? di : 1, n->i[9], pb, pe);
        NEED(o >= 1, "QConv: kernel %lld is larger than the padded input %lld", (long long)ki, (long long)xi);
        out->dims[0][2 + s] = o;
    }
    int bias, res;
    epi_inputs(n->i[QCONV_FLAGS], n_in, 3, &bias, &res);
    if (bias >= 0) NEED(in[bias].dtype == TB_F32 && in[bias].rank == 1, "QConv: bias must be f32 (M)");
    if (res >= 0) {
        NEED(in[res].dtype == TB_F32, "QConv: the residual must be f32");
        TB_TRY(check_residual("QConv", &in[res], out));
    }
    out->dtype[0] = TB_F32;
    return TB_OK;
}

static tb_status qconv_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    tb_nn_conv_geom g;
    TB_TRY(tb_nn_conv_geometry(n, &in[0], &in[1], &g));
    int bi, ri, flags = n->i[QCONV_FLAGS], zero = n->i[QCONV_ZERO];
    epi_inputs(flags, n_in, 3, &bi, &ri);
    const float *x = in[0].data, *ws = in[2].data;
    const int8_t *w = in[1].data;
    const float *bias = bi >= 0 ? in[bi].data : NULL, *res = ri >= 0 ? in[ri].data : NULL;
    float a_scale = n->f[2], inv = 1.0f / a_scale;
    float *y = out[0].data;
    int64_t cg = g.c / g.group, mg = g.m / g.group;
    for (int64_t b = 0; b < g.n; b++)
        for (int64_t m = 0; m < g.m; m++) {
            int64_t grp = m / mg;
            for (int64_t oy = 0; oy < g.oh; oy++)
                for (int64_t ox = 0; ox < g.ow; ox++) {
                    int64_t acc = 0; /* padding is the zero point's code: it adds nothing */
                    for (int64_t c = 0; c < cg; c++)
                        for (int ky = 0; ky < g.kh; ky++) {
                            int64_t iy = oy * g.sh - g.pt + (int64_t)ky * g.dh;
                            if (iy < 0 || iy >= g.h) continue;
                            for (int kx = 0; kx < g.kw; kx++) {
                                int64_t ix = ox * g.sw - g.pl + (int64_t)kx * g.dw;
                                if (ix < 0 || ix >= g.w) continue;
                                int q = q_u8(x[((b * g.c + grp * cg + c) * g.h + iy) * g.w + ix], inv, zero);
                                acc += (int64_t)(q - zero) * w[((m * cg + c) * g.kh + ky) * g.kw + kx];
                            }
                        }
                    double v = (double)a_scale * ws[m] * (double)acc + (bias ? bias[m] : 0.0);
                    int64_t o = ((b * g.m + m) * g.oh + oy) * g.ow + ox;
                    y[o] = epi_apply(v, n->i[10], n->f[0], n->f[1], flags & TB_NN_ACT_AFTER_RESIDUAL, res, o);
                }
        }
    (void)n_out;
    return TB_OK;
}

/* ---------------------------------------------------------------- QGemm */

enum { QG_ACT = 0, QG_FLAGS, QG_ZERO };

static tb_status qgemm_infer(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0], *w = &in[1];
    NEED(x->dtype == TB_F32, "QGemm: x must be f32 (is %s)", tb_dtype_name(x->dtype));
    NEED(x->rank >= 1, "QGemm: scalar x");
    NEED(w->rank == 2, "QGemm: the weight codes must be (N, K), rank %d", w->rank);
    TB_TRY(check_weights("QGemm", w, &in[2]));
    int64_t K = x->dims[x->rank - 1];
    NEED(!tb_dim_known(K) || !tb_dim_known(w->dims[1]) || K == w->dims[1], "QGemm: x has K = %lld, the weight %lld",
         (long long)K, (long long)w->dims[1]);
    out->n_out = 1;
    out->rank[0] = x->rank;
    memcpy(out->dims[0], x->dims, sizeof(int64_t) * (size_t)x->rank);
    out->dims[0][x->rank - 1] = w->dims[0];
    int bias, res;
    epi_inputs(n->i[QG_FLAGS], n_in, 3, &bias, &res);
    if (bias >= 0) NEED(in[bias].dtype == TB_F32 && in[bias].rank == 1, "QGemm: bias must be f32 (N)");
    if (res >= 0) {
        NEED(in[res].dtype == TB_F32, "QGemm: the residual must be f32");
        TB_TRY(check_residual("QGemm", &in[res], out));
    }
    out->dtype[0] = TB_F32;
    return TB_OK;
}

static tb_status qgemm_ref(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    int64_t K = x->dims[x->rank - 1], N = in[1].dims[0], M = K ? tb_view_numel(x) / K : 0;
    int bi, ri, flags = n->i[QG_FLAGS], zero = n->i[QG_ZERO];
    epi_inputs(flags, n_in, 3, &bi, &ri);
    const float *xf = x->data, *ws = in[2].data;
    const int8_t *w = in[1].data;
    const float *bias = bi >= 0 ? in[bi].data : NULL, *res = ri >= 0 ? in[ri].data : NULL;
    float a_scale = n->f[0], inv = 1.0f / a_scale;
    float *y = out[0].data;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            int64_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += (int64_t)(q_u8(xf[i * K + k], inv, zero) - zero) * w[j * K + k];
            double v = (double)a_scale * ws[j] * (double)acc + (bias ? bias[j] : 0.0);
            y[i * N + j] = epi_apply(v, n->i[QG_ACT], n->f[2], n->f[3], flags & TB_NN_ACT_AFTER_RESIDUAL, res, i * N + j);
        }
    (void)n_out;
    return TB_OK;
}

/* ---------------------------------------------------------------- the table */

#define I32(name, slot, lo, hi, doc) {name, TB_ATTR_INT, slot, 0, 32, lo, hi, doc}
#define F32(name, slot, lo, hi, doc) {name, TB_ATTR_FLOAT, slot, 0, 32, lo, hi, doc}
#define DIM_HI 65536.0
#define ACT_ATTR(slot) I32("activation", slot, 0, TB_NN_ACT_TANH, "fused tb_nn_act epilogue")
#define FLAGS_ATTR(slot) I32("flags", slot, 0, 7, "TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL")
#define ACT_PARAMS(s0, s1)                                                                \
    F32("act_p0", s0, -INFINITY, INFINITY, "first activation parameter (clip: min)"),    \
        F32("act_p1", s1, -INFINITY, INFINITY, "second activation parameter (clip: max)")
#define ZERO_ATTR(slot) I32("act_zero", slot, 0, 255, "the activations' zero point (uint8 code)")
#define SCALE_ATTR(slot) F32("act_scale", slot, FLT_MIN, FLT_MAX, "the activations' scale (per tensor)")

static const tb_op_def quant_defs[] = {
    {"QuantizeLinear", 2, 3, 1, "x f32, scale f32 (scalar or (x.dims[axis])) [, zero point i8|u8 (as scale)] -> y i8|u8",
     2,
     {I32("axis", QL_AXIS, 0, TB_MAX_RANK - 1, "the per-axis axis (normalised)"),
      I32("dtype", QL_DTYPE, 0, 64, "the output dtype without a zero point (tb_dtype: u8 or i8)")},
     NULL, ql_infer, ql_ref, 0, 0},
    {"DequantizeLinear", 2, 3, 1, "x i8|u8|i32, scale f32 (scalar or (x.dims[axis])) [, zero point (x's dtype)] -> y f32",
     1, {I32("axis", QL_AXIS, 0, TB_MAX_RANK - 1, "the per-axis axis (normalised)")}, NULL, ql_infer, ql_ref, 0, 0},
    {"QConv", 3, 5, 1,
     "x f32 (N, C, H, W) or (N, C, W), w i8 (M, C/group, kh, kw), w_scale f32 (M) [, bias (M)] [, residual] -> f32 "
     "(N, M, oh, ow)",
     16,
     {I32("group", 0, 0, 1 << 24, "channel groups (0: 1)"), I32("stride_h", 1, 0, DIM_HI, "0: 1"),
      I32("stride_w", 2, 0, DIM_HI, "0: 1"), I32("pad_top", 3, 0, DIM_HI, ""), I32("pad_left", 4, 0, DIM_HI, ""),
      I32("pad_bottom", 5, 0, DIM_HI, ""), I32("pad_right", 6, 0, DIM_HI, ""),
      I32("dilation_h", 7, 0, DIM_HI, "0: 1"), I32("dilation_w", 8, 0, DIM_HI, "0: 1"),
      I32("auto_pad", 9, 0, TB_NN_PAD_VALID, "tb_nn_autopad"), ACT_ATTR(10), FLAGS_ATTR(QCONV_FLAGS),
      ZERO_ATTR(QCONV_ZERO), ACT_PARAMS(0, 1), SCALE_ATTR(2)},
     NULL, qconv_infer, qconv_ref, 0, 0},
    {"QGemm", 3, 5, 1, "x f32 (..., K), w i8 (N, K), w_scale f32 (N) [, bias (N)] [, residual] -> f32 (..., N)", 6,
     {ACT_ATTR(QG_ACT), FLAGS_ATTR(QG_FLAGS), ZERO_ATTR(QG_ZERO), SCALE_ATTR(0), ACT_PARAMS(2, 3)},
     NULL, qgemm_infer, qgemm_ref, 0, 0},
};

const tb_op_def *tb_nn_quant_def(tb_op_kind k) {
    switch (k) {
    case TB_OP_QUANTIZE_LINEAR: return &quant_defs[0];
    case TB_OP_DEQUANTIZE_LINEAR: return &quant_defs[1];
    case TB_OP_QCONV: return &quant_defs[2];
    case TB_OP_QGEMM: return &quant_defs[3];
    default: return NULL;
    }
}
