/*
 * ops_nn.h — the general ops (ops_nn.def): ONNX semantics at any rank up to
 * TB_MAX_RANK, one definition each (tb_op_def in ops.h) with a general shape
 * rule (`infer`) and a scalar reference kernel (`ref`), both over tb_view.
 *
 * Shape rules run twice:
 *   - at build time, over the graph's values: dims may be symbols (TB_SYM)
 *     or TB_DIM_DYN, and `data` is set only for constants (weights and
 *     folded values). A rule that needs a dim or a value it does not know
 *     answers TB_DIM_DYN for the dims that depend on it (never fails for
 *     that reason); it fails only on a real mismatch (TB_ERR_FORMAT naming
 *     it).
 *   - at run time, with every dim concrete and `data` set for the op's
 *     host inputs (the bits of tb_op_def.host_inputs: shapes, axes, starts,
 *     ...): the executor computes such values on the host before it sizes
 *     the outputs.
 * Reference kernels read in[k].data and write out[k].data (already sized by
 * the rule); they are plain scalar C, the semantics every backend is tested
 * against, also used by constant folding and by the host evaluation of shape
 * tensors.
 *
 * Conventions shared by importer, passes and kernels:
 *   - every axis attribute is stored normalised to [0, rank) of the tensor
 *     it indexes (the importer adds the rank to negative axes);
 *   - sets of axes are bit masks over [0, TB_MAX_RANK);
 *   - optional ONNX inputs that are absent are not in the node (n_in is
 *     smaller), or the importer fills a constant (named below);
 *   - activation epilogues (fused by passes) use tb_nn_act with two float
 *     parameters in the slots the op names.
 *
 * Attribute layouts (i[] ints, f[] floats; unused slots are zero):
 *   Relu Sigmoid Tanh Exp Log Neg Abs Sqrt Reciprocal Erf Floor Ceil Not
 *   Identity: none.
 *   Clip:     x [, min, max] (scalars, host inputs; absent: -inf / +inf).
 *   Cast:     i[0] the target tb_dtype.
 *   Gelu:     i[0] 0 erf form, 1 tanh approximation.
 *   Add Sub Mul Div Pow Equal Less LessOrEqual Greater GreaterOrEqual And Or:
 *             a, b (numpy broadcasting); comparisons give bool.
 *   Where:    cond (bool), x, y (broadcast).
 *   Softmax:  i[0] axis.
 *   LayerNormalization: x, scale [, bias]; i[0] axis (normalised over
 *             [axis, rank)); i[1] outputs (0 or 1: y; 2: y, mean; 3: y,
 *             mean, inv_std_dev; the two statistics are f32 with x's dims,
 *             those of [axis, rank) set to 1); f[0] epsilon.
 *   BatchNormalization: x (N, C, ...), scale, bias, mean, var (C); f[0]
 *             epsilon (inference form only).
 *   ReduceMean ReduceSum ReduceMax: x [, axes (host input, i64)]; i[0]
 *             keepdims, i[1] axes mask (0 and no axes input: all axes),
 *             i[2] noop_with_empty_axes.
 *   Reshape:  data, shape (i64, host input); i[0] allowzero.
 *   Transpose: i[0..rank) perm (none given: the importer writes reversed).
 *   Unsqueeze: data, axes (i64, host input; may be negative: normalised
 *             against the output rank by the rule).
 *   Squeeze:  data [, axes (i64, host input)].
 *   Flatten:  i[0] axis.
 *   Slice:    data, starts, ends [, axes [, steps]] (i64 or i32, host
 *             inputs).
 *   Concat:   inputs...; i[0] axis.
 *   Split:    data [, split (i64, host input)]; i[0] axis, i[1] outputs
 *             (equal parts, the last smaller, when no split input).
 *   Shape:    i[0] start, i[1] end, i[2] 1 when end is given (ends at rank
 *             otherwise); start/end as ONNX (negative allowed, clamped).
 *   Gather:   data, indices (i32/i64, negative wraps); i[0] axis.
 *   Expand:   data, shape (i64, host input).
 *   Range:    start, limit, delta (scalars, host inputs).
 *   ConstantOfShape: shape (i64, host input), value (one element; its
 *             dtype is the output's; the importer adds f32 0 when absent).
 *   Trilu:    x [, k (i64 scalar, host input)]; i[0] upper.
 *   Resize:   x, scales (f32) or sizes (i64) (host input); i[0] mode
 *             (tb_nn_resize_mode), i[1] coordinate transformation
 *             (tb_nn_coord), i[2] nearest mode (tb_nn_nearest), i[3]
 *             exclude_outside; f[0] cubic_coeff_a, f[1] extrapolation
 *             value.
 *   MaxPool AveragePool: x (N, C, H, W) or (N, C, W); i[0..1] kernel (h,
 *             w), i[2..3] strides, i[4..7] pads (top, left, bottom,
 *             right), i[8..9] dilations, i[10] ceil_mode, i[11]
 *             count_include_pad, i[12] auto_pad (tb_nn_autopad). Rank-3
 *             inputs use the w entries (h = 1).
 *   GlobalAveragePool: x (N, C, ...).
 *   Conv:     x (N, C, H, W) or (N, C, W), w (M, C/group, kh, kw) [, bias
 *             (M)] [, residual (the output's shape)]; i[0] group, i[1..2]
 *             strides, i[3..6] pads (top, left, bottom, right), i[7..8]
 *             dilations, i[9] auto_pad, i[10] activation (tb_nn_act),
 *             i[11] flags (TB_NN_HAS_BIAS, TB_NN_HAS_RESIDUAL); f[0..1]
 *             activation parameters. y = act(conv(x, w) + bias) +
 *             residual... see TB_NN_RESIDUAL_AFTER_ACT.
 *   Gemm:     a, b [, c] [, residual]; i[0] transA, i[1] transB, i[2]
 *             activation, i[3] flags (TB_NN_HAS_BIAS: c present); f[0]
 *             alpha, f[1] beta, f[2..3] activation parameters.
 *   MatMul:   a (..., M, K), b (..., K, N) (numpy matmul broadcasting)
 *             [, bias (N)] [, residual]; i[0] trans_a, i[1] trans_b (the
 *             last two dims of a / b are read transposed: folded
 *             Transposes), i[2] activation, i[3] flags; f[0] alpha (0
 *             means 1: a folded scale), f[2..3] activation parameters.
 *   (sdpa, fused) attention: q (B, H, S, D), k (B, H, T, D), v (B, H, T, Dv)
 *             [, mask (broadcast to (B, H, S, T), additive f32 or bool
 *             keep-mask)]; i[0] causal, i[1] 1 when k is given as (B, H,
 *             D, T), i[2] mask kind (0 none, 1 additive, 2 bool); f[0]
 *             scale. out (B, H, S, Dv). i[3] heads H > 0 (a pass's layout,
             no Transpose around it): q (B, S, H*D), k (B, T, H*D), v (B,
             T, H*Dv) (i[1] 0), out (B, S, H*Dv); with i[4] 1 (packed) the
             three inputs are (B, S, 3*H*D) and q is read from columns [0,
             HD) of the first, k from [HD, 2HD) of the second, v from [2HD,
             3HD) of the third: one value thrice for a merged q/k/v
             projection. tb_nn_sdpa_geometry gives the strides of each.
 *   QuantizeLinear: x (f32), scale (f32 scalar, or 1-d of x.dims[axis]) [,
 *             zero point (int8 / uint8, the scale's shape: the output's
 *             dtype)]; i[0] axis (normalised; 0 for a scalar scale), i[1]
 *             the output tb_dtype without a zero point (TB_U8 or TB_I8).
 *             y = clamp(round_half_even(x / scale) + zero).
 *   DequantizeLinear: x (int8, uint8 or int32), scale [, zero point (x's
 *             dtype)]; i[0] axis. y = (x - zero) * scale, f32.
 *   (QConv, fused) x f32 (N, C, H, W) or (N, C, W), w int8 codes (M, C/group,
 *             kh, kw), w_scale f32 (M) [, bias (M)] [, residual]; i[0..11]
 *             as Conv, i[12] the activations' zero point (uint8 code);
 *             f[0..1] activation parameters, f[2] the activations' scale.
 *             x is quantized per tensor to uint8 (round half to even, as
 *             tb_cpu_quantize_u8), the sums are exact integers, y =
 *             epilogue(f[2] * w_scale[m] * sum (q - zero) w + bias).
 *   (QGemm, fused) x f32 (..., K), w int8 codes (N, K), w_scale f32 (N) [,
 *             bias (N)] [, residual (..., N)]; i[0] activation, i[1] flags,
 *             i[2] zero point; f[0] the activations' scale, f[2..3]
 *             activation parameters. Gemm (transA 0) and MatMul with a
 *             constant 2-d b both become it (alpha in w_scale, beta in the
 *             bias).
 * Fused epilogue of Conv / Gemm / MatMul (Gemm's bias is beta * c):
 *   y = act(alpha * op(a, b) + bias) + residual, or with the flag
 *   TB_NN_ACT_AFTER_RESIDUAL y = act(alpha * op(a, b) + bias + residual)
 *   (ResNet's relu(bn(conv(x)) + identity)). The residual has the output's
 *   shape.
 */
#ifndef TB_IR_OPS_NN_H
#define TB_IR_OPS_NN_H
#include "ir/ops.h"

typedef enum {
    TB_NN_ACT_NONE = 0,
    TB_NN_ACT_RELU,
    TB_NN_ACT_GELU_ERF,
    TB_NN_ACT_GELU_TANH,
    TB_NN_ACT_SIGMOID,
    TB_NN_ACT_CLIP,     /* f: min, max */
    TB_NN_ACT_TANH,
} tb_nn_act;

/* flags of Conv / Gemm / MatMul */
#define TB_NN_HAS_BIAS 1
#define TB_NN_HAS_RESIDUAL 2
#define TB_NN_ACT_AFTER_RESIDUAL 4

typedef enum { TB_NN_PAD_NOTSET = 0, TB_NN_PAD_SAME_UPPER, TB_NN_PAD_SAME_LOWER, TB_NN_PAD_VALID } tb_nn_autopad;
typedef enum { TB_NN_RESIZE_NEAREST = 0, TB_NN_RESIZE_LINEAR, TB_NN_RESIZE_CUBIC } tb_nn_resize_mode;
typedef enum {
    TB_NN_COORD_HALF_PIXEL = 0,
    TB_NN_COORD_ASYMMETRIC,
    TB_NN_COORD_ALIGN_CORNERS,
    TB_NN_COORD_PYTORCH_HALF_PIXEL,
    TB_NN_COORD_TF_CROP_AND_RESIZE,
    TB_NN_COORD_HALF_PIXEL_SYMMETRIC,
} tb_nn_coord;
typedef enum {
    TB_NN_NEAREST_ROUND_PREFER_FLOOR = 0,
    TB_NN_NEAREST_ROUND_PREFER_CEIL,
    TB_NN_NEAREST_FLOOR,
    TB_NN_NEAREST_CEIL,
} tb_nn_nearest;

/* ONNX op type of a general op (NULL for fused ops and LLM ops), and the
 * op of an ONNX op type (-1 when none). */
const char *tb_nn_onnx_name(tb_op_kind k);
int tb_nn_from_onnx(const char *op_type);
static inline int tb_op_is_nn(tb_op_kind k) { return k >= TB_OP_NN_FIRST && k < TB_OP_COUNT; }

/* ---- dims at build time (symbols, TB_DIM_DYN) and at run time */
static inline int tb_dim_known(int64_t d) { return d >= 0; }
/* a * b, TB_DIM_DYN unless both are known (or one is 1 / 0) */
int64_t tb_dim_mul(int64_t a, int64_t b);
/* numpy broadcasting of two dims; TB_ERR_FORMAT on 2 vs 3 */
tb_status tb_dim_broadcast(int64_t a, int64_t b, int64_t *out);
/* broadcast shapes (ranks aligned at the right) */
tb_status tb_shape_broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *rank, int64_t *out);
/* Elements of a view with concrete dims. */
int64_t tb_view_numel(const tb_view *v);
/* Reads element i of an integer (i32/i64) or float view as int64 / double. */
int64_t tb_view_get_i(const tb_view *v, int64_t i);
double tb_view_get_f(const tb_view *v, int64_t i);

/* The group tables (nn_elem.c, nn_shape.c, nn_conv.c, nn_quant.c): the definition of k
 * when the group owns it, else NULL. ops.c asks them in turn. */
const tb_op_def *tb_nn_elem_def(tb_op_kind k);
const tb_op_def *tb_nn_shape_def(tb_op_kind k);
const tb_op_def *tb_nn_conv_def(tb_op_kind k);
const tb_op_def *tb_nn_quant_def(tb_op_kind k);

/* The axes ReduceMean / ReduceSum / ReduceMax reduce, as a mask over x's
 * dims, from the attribute or the axes input (its data needed): every axis
 * when none are given, none for noop_with_empty_axes. (nn_elem.c) */
tb_status tb_nn_reduce_axes(const tb_node *n, const tb_view *in, int n_in, uint32_t *mask);

/* Convolution / pooling geometry with pads resolved (auto_pad applied) for
 * concrete input dims: used by shape rules and kernels alike. */
typedef struct {
    int64_t n, c, h, w;        /* input (h = 1 for rank 3)        */
    int64_t m, oh, ow;         /* output channels, spatial        */
    int kh, kw, sh, sw, dh, dw;
    int pt, pl, pb, pr;        /* pads                            */
    int group;
} tb_nn_conv_geom;
/* The geometry of Conv node n (ops_nn.h layout) over x and w with concrete
 * dims; TB_ERR_FORMAT on a mismatch or an empty output (nn_conv.c). */
tb_status tb_nn_conv_geometry(const tb_node *n, const tb_view *x, const tb_view *w, tb_nn_conv_geom *g);
/* The activation epilogue a of Conv / Gemm / MatMul with its two parameters
 * (nn_conv.c; the reference form, in double). */
double tb_nn_act_apply(tb_nn_act a, double x, float p0, float p1);
/* Element strides st[0..r) of sdpa's mask m broadcast to (lead..., S, T). */
void tb_nn_sdpa_mask_strides(const tb_view *m, int r, int64_t *st);

/* sdpa's operands as strided arrays for concrete dims: element (b, h, row,
 * col) of operand j (0 q, 1 k with row = key and col = d, 2 v, 3 out) is at
 * off[j] + b st[j][0] + h st[j][1] + row st[j][2] + col st[j][3]. Inline
 * (the CUDA module uses it without linking the IR). 0 on a mismatch. */
typedef struct {
    int64_t B, H, S, T, D, Dv;
    int64_t off[4], st[4][4];
} tb_nn_sdpa_geom;
static inline void tb_nn_sdpa_set(int64_t *st, int64_t b, int64_t h, int64_t r, int64_t c) {
    st[0] = b, st[1] = h, st[2] = r, st[3] = c;
}
static inline int tb_nn_sdpa_geometry(const tb_node *n, int rq, const int64_t *qd, const int64_t *kd,
                                      const int64_t *vd, tb_nn_sdpa_geom *g) {
    int kt = n->i[1], heads = n->i[3], packed = n->i[4];
    for (int j = 0; j < 4; j++) g->off[j] = 0;
    if (heads <= 0) {
        int r = rq;
        if ((r != 3 && r != 4) || packed) return 0;
        g->B = r == 4 ? qd[0] : 1, g->H = qd[r - 3], g->S = qd[r - 2], g->D = qd[r - 1];
        g->T = vd[r - 2], g->Dv = vd[r - 1];
        int64_t H = g->H, S = g->S, T = g->T, D = g->D, Dv = g->Dv;
        tb_nn_sdpa_set(g->st[0], H * S * D, S * D, D, 1);
        if (kt) tb_nn_sdpa_set(g->st[1], H * T * D, T * D, 1, T);
        else tb_nn_sdpa_set(g->st[1], H * T * D, T * D, D, 1);
        tb_nn_sdpa_set(g->st[2], H * T * Dv, T * Dv, Dv, 1);
        tb_nn_sdpa_set(g->st[3], H * S * Dv, S * Dv, Dv, 1);
        return 1;
    }
    if (rq != 3 || kt) return 0;
    int64_t H = heads, C = qd[2];
    g->B = qd[0], g->H = H, g->S = qd[1];
    if (packed) {
        if (C % (3 * H)) return 0;
        int64_t D = C / (3 * H), S = g->S;
        g->D = g->Dv = D, g->T = S;
        g->off[1] = H * D, g->off[2] = 2 * H * D;
        for (int j = 0; j < 3; j++) tb_nn_sdpa_set(g->st[j], S * C, D, C, 1);
    } else {
        if (C % H || kd[2] % H || vd[2] % H) return 0;
        g->D = C / H, g->T = kd[1], g->Dv = vd[2] / H;
        int64_t S = g->S, T = g->T, D = g->D;
        if (kd[2] != C) return 0;
        tb_nn_sdpa_set(g->st[0], S * C, D, C, 1);
        tb_nn_sdpa_set(g->st[1], T * C, D, C, 1);
        tb_nn_sdpa_set(g->st[2], T * vd[2], g->Dv, vd[2], 1);
    }
    tb_nn_sdpa_set(g->st[3], g->S * H * g->Dv, g->Dv, H * g->Dv, 1);
    return 1;
}

#endif /* TB_IR_OPS_NN_H */
