/*
 * nn_elem.c — the elementwise, normalisation and reduction ops of
 * ops_nn.def (Relu ... ReduceMax): attribute schema, general shape rule and
 * scalar reference kernel each (ops_nn.h has the contract).
 *
 * Reference kernels are written for meaning, not speed: every element is
 * read through the dtype (tb_view_get_f / tb_view_get_i), computed in double
 * (float dtypes) or in int64 with wrap-around (integer and bool dtypes) and
 * stored back rounded (floats) or truncated toward zero and wrapped to the
 * width of the dtype (integers), as numpy's astype does. Reductions and
 * normalisations accumulate in double. Fast kernels (backend/cpu/nn_elem.c)
 * are tested against these.
 *
 * Dtypes taken (the shape rules refuse others):
 *   float ops (Sigmoid Tanh Exp Log Sqrt Reciprocal Erf Floor Ceil Gelu
 *     Softmax LayerNormalization BatchNormalization): f32 f16 bf16 f64;
 *   numeric ops (Relu Neg Abs Clip Add Sub Mul Div Pow, comparisons, the
 *     reductions): those and i64 i32 i8 u8 (integer Div truncates toward
 *     zero as C does; x / 0 gives 0);
 *   Not And Or: bool; Equal also bool; Identity Where Cast: any of the above
 *     and bool.
 */
#include "ir/ops_nn.h"

#include <float.h>
#include <math.h>

#define NEED(cond, ...) do { if (!(cond)) return tb_errorf(TB_ERR_FORMAT, __VA_ARGS__); } while (0)

/* ================================================================ dtypes */

static int dt_float(tb_dtype t) { return t == TB_F32 || t == TB_F64 || t == TB_F16 || t == TB_BF16; }
static int dt_int(tb_dtype t) { return t == TB_I64 || t == TB_I32 || t == TB_I8 || t == TB_U8; }
static int dt_num(tb_dtype t) { return dt_float(t) || dt_int(t); }
static int dt_any(tb_dtype t) { return dt_num(t) || t == TB_BOOL; }

/* double -> int64 truncating toward zero, saturating (NaN: 0) */
static int64_t trunc_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775807.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}

static void st_f(const tb_view *v, int64_t i, double x);

/* element i of v = x, wrapped to the width of an integer dtype */
static void st_i(const tb_view *v, int64_t i, int64_t x) {
    switch (v->dtype) {
    case TB_I64: ((int64_t *)v->data)[i] = x; break;
    case TB_I32: ((int32_t *)v->data)[i] = (int32_t)(uint32_t)(uint64_t)x; break;
    case TB_I8: ((int8_t *)v->data)[i] = (int8_t)(uint8_t)(uint64_t)x; break;
    case TB_U8: ((uint8_t *)v->data)[i] = (uint8_t)(uint64_t)x; break;
    case TB_BOOL: ((uint8_t *)v->data)[i] = x != 0; break;
    case TB_F32: ((float *)v->data)[i] = (float)x; break;
    default: st_f(v, i, (double)x); break;
    }
}

/* element i of v = x, rounded (floats), truncated (integers), x != 0 (bool) */
static void st_f(const tb_view *v, int64_t i, double x) {
    switch (v->dtype) {
    case TB_F32: ((float *)v->data)[i] = (float)x; break;
    case TB_F64: ((double *)v->data)[i] = x; break;
    case TB_F16: ((uint16_t *)v->data)[i] = tb_f32_to_f16((float)x); break;
    case TB_BF16: ((uint16_t *)v->data)[i] = tb_f32_to_bf16((float)x); break;
    case TB_BOOL: ((uint8_t *)v->data)[i] = x != 0; break;
    default: st_i(v, i, trunc_i64(x)); break;
    }
}

static const char *dt_name(tb_dtype t) { return tb_dtype_name(t); }

/* ================================================================ broadcasting */

/* Element offsets of up to three inputs while walking an output in order:
 * st[k][d] is input k's stride along output dim d (0 where it broadcasts). */
typedef struct {
    int rank, n;
    int64_t dims[TB_MAX_RANK], idx[TB_MAX_RANK];
    int64_t st[3][TB_MAX_RANK], off[3];
} bcast;

static void bcast_init(bcast *b, const tb_view *out, const tb_view *in, int n) {
    memset(b, 0, sizeof *b);
    b->rank = out->rank;
    b->n = n;
    memcpy(b->dims, out->dims, sizeof b->dims);
    for (int k = 0; k < n; k++) {
        int lead = out->rank - in[k].rank;
        int64_t s = 1;
        for (int d = out->rank - 1; d >= 0; d--) {
            int id = d - lead;
            if (id < 0) continue;
            b->st[k][d] = in[k].dims[id] == 1 ? 0 : s;
            s *= in[k].dims[id];
        }
    }
}

static void bcast_next(bcast *b) {
    for (int d = b->rank - 1; d >= 0; d--) {
        for (int k = 0; k < b->n; k++) b->off[k] += b->st[k][d];
        if (++b->idx[d] < b->dims[d]) return;
        for (int k = 0; k < b->n; k++) b->off[k] -= b->st[k][d] * b->dims[d];
        b->idx[d] = 0;
    }
}

/* n inputs broadcast together into out (shape rule) */
static tb_status infer_bcast(const char *op, const tb_view *in, int n, tb_op_shape *out) {
    int r = in[0].rank;
    int64_t dims[TB_MAX_RANK];
    memcpy(dims, in[0].dims, sizeof dims);
    for (int k = 1; k < n; k++) {
        int64_t t[TB_MAX_RANK];
        if (tb_shape_broadcast(r, dims, in[k].rank, in[k].dims, &r, t) != TB_OK)
            return tb_error_prefix(TB_ERR_FORMAT, "%s: input %d does not broadcast", op, k);
        memcpy(dims, t, sizeof dims);
    }
    out->rank[0] = r;
    memcpy(out->dims[0], dims, sizeof dims);
    return TB_OK;
}

/* ================================================================ unary */

static tb_status infer_unary(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const char *name = tb_op_name(n->op);
    tb_dtype t = in[0].dtype;
    switch (n->op) {
    case TB_OP_NOT: NEED(t == TB_BOOL, "%s: x is %s, want bool", name, dt_name(t)); break;
    case TB_OP_IDENTITY: NEED(dt_any(t), "%s: x is %s", name, dt_name(t)); break;
    case TB_OP_RELU: case TB_OP_NEG: case TB_OP_ABS: case TB_OP_CLIP:
        NEED(dt_num(t), "%s: x is %s, want a float or integer dtype", name, dt_name(t));
        break;
    default: NEED(dt_float(t), "%s: x is %s, want f32, f16, bf16 or f64", name, dt_name(t)); break;
    }
    if (n->op == TB_OP_CLIP)
        for (int k = 1; k < n_in; k++) {
            int known = 1;
            int64_t e = 1;
            for (int d = 0; d < in[k].rank; d++) {
                known &= tb_dim_known(in[k].dims[d]);
                if (tb_dim_known(in[k].dims[d])) e *= in[k].dims[d];
            }
            NEED(!known || e <= 1, "Clip: %s must be a scalar (%lld elements)", k == 1 ? "min" : "max", (long long)e);
            NEED(dt_num(in[k].dtype), "Clip: %s is %s", k == 1 ? "min" : "max", dt_name(in[k].dtype));
        }
    out->rank[0] = in[0].rank;
    memcpy(out->dims[0], in[0].dims, sizeof out->dims[0]);
    out->dtype[0] = t;
    return TB_OK;
}

static double gelu(double a, int tanh_form) {
    if (tanh_form) { /* 0.5 a (1 + tanh(u)) = a sigmoid(2u), without the cancellation for a < 0 */
        double u = 0.7978845608028654 * (a + 0.044715 * a * a * a);
        return a / (1.0 + exp(-2.0 * u));
    }
    return 0.5 * a * erfc(-a * 0.7071067811865476); /* 0.5 a (1 + erf(a / sqrt 2)) */
}

static double unary_f(tb_op_kind op, double a, int attr) {
    switch (op) {
    case TB_OP_RELU: return a < 0 ? 0.0 : a; /* NaN stays NaN */
    case TB_OP_SIGMOID: return 1.0 / (1.0 + exp(-a));
    case TB_OP_TANH: return tanh(a);
    case TB_OP_EXP: return exp(a);
    case TB_OP_LOG: return log(a);
    case TB_OP_NEG: return -a;
    case TB_OP_ABS: return fabs(a);
    case TB_OP_SQRT: return sqrt(a);
    case TB_OP_RECIPROCAL: return 1.0 / a;
    case TB_OP_ERF: return erf(a);
    case TB_OP_FLOOR: return floor(a);
    case TB_OP_CEIL: return ceil(a);
    case TB_OP_GELU: return gelu(a, attr);
    default: return a;
    }
}

static int64_t unary_i(tb_op_kind op, int64_t a) {
    switch (op) {
    case TB_OP_RELU: return a < 0 ? 0 : a;
    case TB_OP_NEG: return (int64_t)(0 - (uint64_t)a);
    case TB_OP_ABS: return a < 0 ? (int64_t)(0 - (uint64_t)a) : a;
    case TB_OP_NOT: return !a;
    default: return a;
    }
}

static tb_status ref_unary(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0], *y = &out[0];
    int64_t N = tb_view_numel(x);
    if (n->op == TB_OP_IDENTITY) {
        if (N) memcpy(y->data, x->data, (size_t)N * tb_dtype_size(x->dtype));
        return TB_OK;
    }
    int attr = n->op == TB_OP_GELU ? n->i[0] : 0;
    if (dt_float(x->dtype)) {
        double lo = -INFINITY, hi = INFINITY;
        if (n->op == TB_OP_CLIP) {
            if (n_in > 1 && tb_view_numel(&in[1]) > 0) lo = tb_view_get_f(&in[1], 0);
            if (n_in > 2 && tb_view_numel(&in[2]) > 0) hi = tb_view_get_f(&in[2], 0);
        }
        for (int64_t i = 0; i < N; i++) {
            double a = tb_view_get_f(x, i), r;
            if (n->op == TB_OP_CLIP) { /* numpy.clip: min(max(a, lo), hi); NaN stays */
                r = a < lo ? lo : a;
                r = r > hi ? hi : r;
            } else {
                r = unary_f(n->op, a, attr);
            }
            st_f(y, i, r);
        }
        return TB_OK;
    }
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    if (n->op == TB_OP_CLIP) {
        if (n_in > 1 && tb_view_numel(&in[1]) > 0) lo = dt_float(in[1].dtype) ? trunc_i64(ceil(tb_view_get_f(&in[1], 0))) : tb_view_get_i(&in[1], 0);
        if (n_in > 2 && tb_view_numel(&in[2]) > 0) hi = dt_float(in[2].dtype) ? trunc_i64(floor(tb_view_get_f(&in[2], 0))) : tb_view_get_i(&in[2], 0);
    }
    for (int64_t i = 0; i < N; i++) {
        int64_t a = tb_view_get_i(x, i), r;
        if (n->op == TB_OP_CLIP) {
            r = a < lo ? lo : a;
            r = r > hi ? hi : r;
        } else {
            r = unary_i(n->op, a);
        }
        st_i(y, i, r);
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- Cast */

static int cast_dtype_ok(int t) {
    return t == TB_F32 || t == TB_F16 || t == TB_BF16 || t == TB_F64 || t == TB_I64 || t == TB_I32 || t == TB_I8 ||
           t == TB_U8 || t == TB_BOOL;
}

static tb_status infer_cast(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    NEED(cast_dtype_ok(in[0].dtype), "Cast: from %s is not supported", dt_name(in[0].dtype));
    NEED(cast_dtype_ok(n->i[0]), "Cast: to %s is not supported", dt_name((tb_dtype)n->i[0]));
    out->rank[0] = in[0].rank;
    memcpy(out->dims[0], in[0].dims, sizeof out->dims[0]);
    out->dtype[0] = (tb_dtype)n->i[0];
    return TB_OK;
}

static tb_status ref_cast(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0], *y = &out[0];
    int64_t N = tb_view_numel(x);
    if (x->dtype == y->dtype) {
        if (N) memcpy(y->data, x->data, (size_t)N * tb_dtype_size(x->dtype));
        return TB_OK;
    }
    if (dt_float(x->dtype))
        for (int64_t i = 0; i < N; i++) st_f(y, i, tb_view_get_f(x, i));
    else
        for (int64_t i = 0; i < N; i++) st_i(y, i, tb_view_get_i(x, i));
    return TB_OK;
}

/* ================================================================ binary, Where */

static int is_compare(tb_op_kind k) { return k >= TB_OP_EQUAL && k <= TB_OP_GREATER_OR_EQUAL; }

static tb_status infer_binary(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const char *name = tb_op_name(n->op);
    tb_dtype a = in[0].dtype, b = in[1].dtype;
    if (n->op == TB_OP_AND || n->op == TB_OP_OR) {
        NEED(a == TB_BOOL && b == TB_BOOL, "%s: inputs are %s and %s, want bool", name, dt_name(a), dt_name(b));
    } else if (n->op == TB_OP_POW) {
        NEED(dt_num(a) && dt_num(b), "%s: inputs are %s and %s", name, dt_name(a), dt_name(b));
    } else {
        NEED(a == b, "%s: inputs of different dtypes (%s and %s)", name, dt_name(a), dt_name(b));
        NEED(dt_num(a) || (n->op == TB_OP_EQUAL && a == TB_BOOL), "%s: inputs are %s", name, dt_name(a));
    }
    TB_TRY(infer_bcast(name, in, 2, out));
    out->dtype[0] = is_compare(n->op) || n->op == TB_OP_AND || n->op == TB_OP_OR ? TB_BOOL : a;
    return TB_OK;
}

static double binary_f(tb_op_kind op, double a, double b) {
    switch (op) {
    case TB_OP_NN_ADD: return a + b;
    case TB_OP_SUB: return a - b;
    case TB_OP_MUL: return a * b;
    case TB_OP_DIV: return a / b;
    case TB_OP_POW: return pow(a, b);
    case TB_OP_EQUAL: return a == b;
    case TB_OP_LESS: return a < b;
    case TB_OP_LESS_OR_EQUAL: return a <= b;
    case TB_OP_GREATER: return a > b;
    case TB_OP_GREATER_OR_EQUAL: return a >= b;
    default: return 0;
    }
}

static int64_t ipow(int64_t a, int64_t e) {
    if (e < 0) return a == 1 ? 1 : a == -1 ? (e & 1 ? -1 : 1) : 0;
    uint64_t r = 1, base = (uint64_t)a;
    for (; e; e >>= 1, base *= base)
        if (e & 1) r *= base;
    return (int64_t)r;
}

static int64_t binary_i(tb_op_kind op, int64_t a, int64_t b) {
    switch (op) {
    case TB_OP_NN_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
    case TB_OP_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
    case TB_OP_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
    case TB_OP_DIV: return b == 0 ? 0 : (a == INT64_MIN && b == -1) ? a : a / b;
    case TB_OP_POW: return ipow(a, b);
    case TB_OP_EQUAL: return a == b;
    case TB_OP_LESS: return a < b;
    case TB_OP_LESS_OR_EQUAL: return a <= b;
    case TB_OP_GREATER: return a > b;
    case TB_OP_GREATER_OR_EQUAL: return a >= b;
    case TB_OP_AND: return a && b;
    case TB_OP_OR: return a || b;
    default: return 0;
    }
}

static tb_status ref_binary(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int64_t N = tb_view_numel(&out[0]);
    bcast b;
    bcast_init(&b, &out[0], in, 2);
    int fa = dt_float(in[0].dtype), fb = dt_float(in[1].dtype);
    for (int64_t i = 0; i < N; i++, bcast_next(&b)) {
        if (fa) { /* float inputs (Pow: a float base, any exponent) */
            st_f(&out[0], i, binary_f(n->op, tb_view_get_f(&in[0], b.off[0]), tb_view_get_f(&in[1], b.off[1])));
        } else if (fb) { /* Pow: an integer base, a float exponent */
            st_f(&out[0], i, pow((double)tb_view_get_i(&in[0], b.off[0]), tb_view_get_f(&in[1], b.off[1])));
        } else {
            st_i(&out[0], i, binary_i(n->op, tb_view_get_i(&in[0], b.off[0]), tb_view_get_i(&in[1], b.off[1])));
        }
    }
    return TB_OK;
}

static tb_status infer_where(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    NEED(in[0].dtype == TB_BOOL, "Where: cond is %s, want bool", dt_name(in[0].dtype));
    NEED(in[1].dtype == in[2].dtype && dt_any(in[1].dtype), "Where: x and y are %s and %s", dt_name(in[1].dtype),
         dt_name(in[2].dtype));
    TB_TRY(infer_bcast("Where", in, 3, out));
    out->dtype[0] = in[1].dtype;
    return TB_OK;
}

static tb_status ref_where(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int64_t N = tb_view_numel(&out[0]);
    size_t es = tb_dtype_size(out[0].dtype);
    bcast b;
    bcast_init(&b, &out[0], in, 3);
    const uint8_t *c = in[0].data;
    for (int64_t i = 0; i < N; i++, bcast_next(&b)) {
        const uint8_t *src = c[b.off[0]] ? (const uint8_t *)in[1].data + b.off[1] * es
                                         : (const uint8_t *)in[2].data + b.off[2] * es;
        memcpy((uint8_t *)out[0].data + i * es, src, es);
    }
    return TB_OK;
}

/* ================================================================ Softmax */

static tb_status infer_same_float(const char *name, const tb_view *x, tb_op_shape *out) {
    NEED(dt_float(x->dtype), "%s: x is %s, want f32, f16, bf16 or f64", name, dt_name(x->dtype));
    out->rank[0] = x->rank;
    memcpy(out->dims[0], x->dims, sizeof out->dims[0]);
    return TB_OK;
}

static tb_status infer_softmax(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    NEED(n->i[0] < in[0].rank, "Softmax: axis %d of a rank-%d x", n->i[0], in[0].rank);
    return infer_same_float("Softmax", &in[0], out);
}

/* outer, the axis' dim, inner */
static void split3(const tb_view *x, int axis, int64_t *outer, int64_t *mid, int64_t *inner) {
    *outer = *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= x->dims[d];
    for (int d = axis + 1; d < x->rank; d++) *inner *= x->dims[d];
    *mid = x->dims[axis];
}

static tb_status ref_softmax(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int64_t O, A, I;
    split3(&in[0], n->i[0], &O, &A, &I);
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
            int64_t base = o * A * I + i;
            double m = -INFINITY, s = 0;
            for (int64_t a = 0; a < A; a++) m = fmax(m, tb_view_get_f(&in[0], base + a * I));
            for (int64_t a = 0; a < A; a++) s += exp(tb_view_get_f(&in[0], base + a * I) - m);
            for (int64_t a = 0; a < A; a++)
                st_f(&out[0], base + a * I, exp(tb_view_get_f(&in[0], base + a * I) - m) / s);
        }
    return TB_OK;
}

/* ================================================================ LayerNormalization */

static tb_status infer_layernorm(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    int axis = n->i[0], nr = x->rank - axis;
    NEED(axis < x->rank, "LayerNormalization: axis %d of a rank-%d x", axis, x->rank);
    for (int k = 1; k < n_in; k++) {
        const tb_view *p = &in[k];
        const char *what = k == 1 ? "scale" : "bias";
        NEED(dt_float(p->dtype), "LayerNormalization: %s is %s", what, dt_name(p->dtype));
        /* broadcast into x's dims [axis, rank), aligned at the right */
        for (int d = 0; d < p->rank; d++) {
            int xd = d - p->rank + nr; /* position in the normalised dims */
            int64_t pd = p->dims[d];
            if (xd < 0) {
                NEED(pd == 1 || !tb_dim_known(pd), "LayerNormalization: %s has more dims than [axis, rank) of x",
                     what);
                continue;
            }
            int64_t xdim = x->dims[axis + xd];
            NEED(pd == 1 || pd == xdim || !tb_dim_known(pd) || !tb_dim_known(xdim),
                 "LayerNormalization: %s dim %d (%lld) does not match x dim %d (%lld)", what, d, (long long)pd,
                 axis + xd, (long long)xdim);
        }
    }
    TB_TRY(infer_same_float("LayerNormalization", x, out));
    /* Mean and InvStdDev (ONNX outputs 1 and 2): x's dims with [axis, rank)
     * set to 1, f32 (stash_type) */
    out->n_out = n->i[1] > 1 ? n->i[1] : 1;
    for (int o = 1; o < out->n_out; o++) {
        out->rank[o] = x->rank;
        for (int d = 0; d < x->rank; d++) out->dims[o][d] = d < axis ? x->dims[d] : 1;
        out->dtype[o] = TB_F32;
    }
    return TB_OK;
}

/* Index into p (broadcast over the dims nd[0..nr)) of element j of them. */
static int64_t bcast_index(int64_t j, const int64_t *nd, int nr, const tb_view *p) {
    int64_t idx = 0, st = 1;
    for (int d = nr - 1, pd = p->rank - 1; d >= 0 && pd >= 0; d--, pd--) {
        int64_t c = j % nd[d];
        j /= nd[d];
        if (p->dims[pd] != 1) idx += c * st;
        st *= p->dims[pd];
    }
    return idx;
}

static tb_status ref_layernorm(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    int axis = n->i[0], nr = x->rank - axis;
    double eps = n->f[0];
    int64_t rows = 1, D = 1;
    for (int d = 0; d < axis; d++) rows *= x->dims[d];
    for (int d = axis; d < x->rank; d++) D *= x->dims[d];
    const int64_t *nd = x->dims + axis;
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r * D;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < D; j++) mean += tb_view_get_f(x, base + j);
        mean /= (double)D;
        for (int64_t j = 0; j < D; j++) {
            double c = tb_view_get_f(x, base + j) - mean;
            var += c * c;
        }
        var /= (double)D;
        double rstd = 1.0 / sqrt(var + eps);
        for (int64_t j = 0; j < D; j++) {
            double y = (tb_view_get_f(x, base + j) - mean) * rstd * tb_view_get_f(&in[1], bcast_index(j, nd, nr, &in[1]));
            if (n_in > 2) y += tb_view_get_f(&in[2], bcast_index(j, nd, nr, &in[2]));
            st_f(&out[0], base + j, y);
        }
        if (n_out > 1) st_f(&out[1], r, mean);
        if (n_out > 2) st_f(&out[2], r, rstd);
    }
    return TB_OK;
}

/* ================================================================ BatchNormalization */

static tb_status infer_batchnorm(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    static const char *const what[] = {"x", "scale", "bias", "mean", "var"};
    NEED(in[0].rank >= 2, "BatchNormalization: x must be (N, C, ...), got rank %d", in[0].rank);
    int64_t C = in[0].dims[1];
    for (int k = 1; k < 5; k++) {
        const tb_view *p = &in[k];
        NEED(dt_float(p->dtype), "BatchNormalization: %s is %s", what[k], dt_name(p->dtype));
        NEED(p->rank == 1, "BatchNormalization: %s must be (C), got rank %d", what[k], p->rank);
        NEED(!tb_dim_known(C) || !tb_dim_known(p->dims[0]) || p->dims[0] == C || p->dims[0] == 1,
             "BatchNormalization: %s has %lld channels, x %lld", what[k], (long long)p->dims[0], (long long)C);
    }
    return infer_same_float("BatchNormalization", &in[0], out);
}

static tb_status ref_batchnorm(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int64_t N, C, S;
    split3(&in[0], 1, &N, &C, &S);
    double eps = n->f[0];
    for (int64_t c = 0; c < C; c++) {
        double p[5];
        for (int k = 1; k < 5; k++) p[k] = tb_view_get_f(&in[k], in[k].dims[0] == 1 ? 0 : c);
        double a = p[1] / sqrt(p[4] + eps);
        for (int64_t b = 0; b < N; b++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (b * C + c) * S + s;
                st_f(&out[0], i, a * (tb_view_get_f(&in[0], i) - p[3]) + p[2]);
            }
    }
    return TB_OK;
}

/* ================================================================ reductions */

tb_status tb_nn_reduce_axes(const tb_node *n, const tb_view *in, int n_in, uint32_t *mask) {
    const char *name = tb_op_name(n->op);
    int r = in[0].rank;
    uint32_t m = (uint32_t)n->i[1];
    int empty = m == 0;
    NEED(!(m >> r), "%s: axes mask 0x%x on a rank-%d x", name, m, r);
    if (n_in > 1) {
        const tb_view *a = &in[1];
        NEED(m == 0, "%s: both an axes input and an axes attribute", name);
        NEED(a->rank <= 1 && (a->dtype == TB_I64 || a->dtype == TB_I32), "%s: axes must be a 1-d i64 tensor", name);
        int64_t k = tb_view_numel(a);
        TB_ASSERT(a->data != NULL || k == 0);
        for (int64_t i = 0; i < k; i++) {
            int64_t ax = tb_view_get_i(a, i);
            NEED(ax >= -r && ax < r, "%s: axis %lld of a rank-%d x", name, (long long)ax, r);
            m |= 1u << (ax < 0 ? ax + r : ax);
        }
        empty = k == 0;
    }
    if (empty) m = n->i[2] ? 0 : (r ? (1u << r) - 1 : 0);
    *mask = m;
    return TB_OK;
}

static tb_status infer_reduce(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const char *name = tb_op_name(n->op);
    const tb_view *x = &in[0];
    int r = x->rank, keep = n->i[0];
    NEED(dt_num(x->dtype), "%s: x is %s", name, dt_name(x->dtype));
    if (n_in > 1 && !in[1].data) { /* axes computed at run time: which dims go is unknown */
        NEED(n->i[1] == 0, "%s: both an axes input and an axes attribute", name);
        NEED(in[1].rank <= 1, "%s: axes must be 1-d", name);
        int64_t k = in[1].rank ? in[1].dims[0] : 1;
        if (k == 0) k = n->i[2] ? 0 : r; /* empty: no-op, or every axis */
        if (!tb_dim_known(k))
            return tb_errorf(TB_ERR_UNSUPPORTED, "%s: the number of axes is known only at run time", name);
        NEED(k <= r, "%s: %lld axes of a rank-%d x", name, (long long)k, r);
        out->rank[0] = keep || k == 0 ? r : r - (int)k;
        for (int d = 0; d < out->rank[0]; d++)
            out->dims[0][d] = k == 0 ? x->dims[d] : k == r && keep ? 1 : keep && x->dims[d] == 1 ? 1 : TB_DIM_DYN;
        return TB_OK;
    }
    uint32_t m;
    TB_TRY(tb_nn_reduce_axes(n, in, n_in, &m));
    int o = 0;
    for (int d = 0; d < r; d++) {
        if (!(m >> d & 1)) out->dims[0][o++] = x->dims[d];
        else if (keep) out->dims[0][o++] = 1;
    }
    out->rank[0] = o;
    return TB_OK;
}

static tb_status ref_reduce(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    uint32_t m;
    TB_TRY(tb_nn_reduce_axes(n, in, n_in, &m));
    int r = x->rank, nk = 0, nrd = 0;
    int64_t st[TB_MAX_RANK], kd[TB_MAX_RANK], ks[TB_MAX_RANK], rd[TB_MAX_RANK], rs[TB_MAX_RANK];
    int64_t s = 1, nred = 1, nout = 1;
    for (int d = r - 1; d >= 0; d--) { st[d] = s; s *= x->dims[d]; }
    for (int d = 0; d < r; d++) {
        if (m >> d & 1) { rd[nrd] = x->dims[d]; rs[nrd++] = st[d]; nred *= x->dims[d]; }
        else { kd[nk] = x->dims[d]; ks[nk++] = st[d]; nout *= x->dims[d]; }
    }
    int isint = !dt_float(x->dtype);
    for (int64_t o = 0; o < nout; o++) {
        int64_t base = 0, t = o;
        for (int k = nk - 1; k >= 0; k--) { base += (t % kd[k]) * ks[k]; t /= kd[k]; }
        double acc = n->op == TB_OP_REDUCE_MAX ? -INFINITY : 0;
        int64_t iacc = n->op == TB_OP_REDUCE_MAX ? INT64_MIN : 0;
        int64_t idx[TB_MAX_RANK] = {0}, off = base;
        for (int64_t j = 0; j < nred; j++) {
            if (isint) {
                int64_t v = tb_view_get_i(x, off);
                iacc = n->op == TB_OP_REDUCE_MAX ? (v > iacc ? v : iacc) : (int64_t)((uint64_t)iacc + (uint64_t)v);
            } else {
                double v = tb_view_get_f(x, off);
                if (n->op == TB_OP_REDUCE_MAX) acc = (v > acc || v != v) && acc == acc ? v : acc; /* NaN wins */
                else acc += v;
            }
            for (int d = nrd - 1; d >= 0; d--) { /* next reduced coordinate */
                off += rs[d];
                if (++idx[d] < rd[d]) break;
                off -= rs[d] * rd[d];
                idx[d] = 0;
            }
        }
        if (n->op == TB_OP_REDUCE_MEAN) acc /= (double)nred;
        if (isint && n->op == TB_OP_REDUCE_MEAN) st_f(&out[0], o, (double)iacc / (double)nred);
        else if (isint) st_i(&out[0], o, iacc);
        else st_f(&out[0], o, acc);
    }
    return TB_OK;
}

/* ================================================================ the table */

#define DEF_UNARY(e, nm, sig) [e - TB_OP_RELU] = {.name = nm, .min_in = 1, .max_in = 1, .n_out = 1, .signature = sig, \
                                                  .infer = infer_unary, .ref = ref_unary}
#define DEF_BINARY(e, nm, sig) [e - TB_OP_RELU] = {.name = nm, .min_in = 2, .max_in = 2, .n_out = 1, .signature = sig, \
                                                   .infer = infer_binary, .ref = ref_binary}
#define REDUCE_ATTRS                                                                                             \
    .n_attrs = 3, .attrs = {                                                                                     \
        {"keepdims", TB_ATTR_BOOL, 0, 0, 32, 0, 1, "reduced axes stay as dims of 1"},                           \
        {"axes", TB_ATTR_INT, 1, 0, 32, 0, (1 << TB_MAX_RANK) - 1, "mask of reduced axes (no axes input)"},      \
        {"noop_with_empty_axes", TB_ATTR_BOOL, 2, 0, 32, 0, 1, "no axes: copy x instead of reducing all"},      \
    }
#define DEF_REDUCE(e, nm, sig) [e - TB_OP_RELU] = {.name = nm, .min_in = 1, .max_in = 2, .n_out = 1, .signature = sig, \
                                                   REDUCE_ATTRS, .infer = infer_reduce, .ref = ref_reduce,             \
                                                   .host_inputs = 1u << 1}
#define EPSILON_ATTR {"epsilon", TB_ATTR_FLOAT, 0, 0, 32, 0.0, 1.0, "added to the variance"}

static const tb_op_def defs[TB_OP_REDUCE_MAX - TB_OP_RELU + 1] = {
    DEF_UNARY(TB_OP_RELU, "Relu", "x -> max(x, 0)"),
    DEF_UNARY(TB_OP_SIGMOID, "Sigmoid", "x -> 1 / (1 + exp(-x))"),
    DEF_UNARY(TB_OP_TANH, "Tanh", "x -> tanh(x)"),
    DEF_UNARY(TB_OP_EXP, "Exp", "x -> exp(x)"),
    DEF_UNARY(TB_OP_LOG, "Log", "x -> log(x)"),
    DEF_UNARY(TB_OP_NEG, "Neg", "x -> -x"),
    DEF_UNARY(TB_OP_ABS, "Abs", "x -> |x|"),
    DEF_UNARY(TB_OP_SQRT, "Sqrt", "x -> sqrt(x)"),
    DEF_UNARY(TB_OP_RECIPROCAL, "Reciprocal", "x -> 1 / x"),
    DEF_UNARY(TB_OP_ERF, "Erf", "x -> erf(x)"),
    DEF_UNARY(TB_OP_FLOOR, "Floor", "x -> floor(x)"),
    DEF_UNARY(TB_OP_CEIL, "Ceil", "x -> ceil(x)"),
    DEF_UNARY(TB_OP_NOT, "Not", "x (bool) -> !x (bool)"),
    DEF_UNARY(TB_OP_IDENTITY, "Identity", "x -> x"),
    [TB_OP_CLIP - TB_OP_RELU] = {.name = "Clip", .min_in = 1, .max_in = 3, .n_out = 1,
                                 .signature = "x [, min [, max]] (scalars; absent: -inf, +inf) -> min(max(x, min), max)",
                                 .infer = infer_unary, .ref = ref_unary, .host_inputs = 1u << 1 | 1u << 2},
    [TB_OP_CAST - TB_OP_RELU] = {.name = "Cast", .min_in = 1, .max_in = 1, .n_out = 1,
                                 .signature = "x -> x converted to dtype `to` (floats to integers truncate)",
                                 .n_attrs = 1,
                                 .attrs = {{"to", TB_ATTR_INT, 0, 0, 32, 0, TB_DTYPE_COUNT - 1, "target tb_dtype"}},
                                 .infer = infer_cast, .ref = ref_cast},
    [TB_OP_GELU - TB_OP_RELU] = {.name = "Gelu", .min_in = 1, .max_in = 1, .n_out = 1,
                                 .signature = "x -> 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation",
                                 .n_attrs = 1,
                                 .attrs = {{"approximate", TB_ATTR_BOOL, 0, 0, 32, 0, 1,
                                            "1: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))"}},
                                 .infer = infer_unary, .ref = ref_unary},
    DEF_BINARY(TB_OP_NN_ADD, "Add", "a, b (broadcast) -> a + b"),
    DEF_BINARY(TB_OP_SUB, "Sub", "a, b (broadcast) -> a - b"),
    DEF_BINARY(TB_OP_MUL, "Mul", "a, b (broadcast) -> a * b"),
    DEF_BINARY(TB_OP_DIV, "Div", "a, b (broadcast) -> a / b (integers: truncated)"),
    DEF_BINARY(TB_OP_POW, "Pow", "a, b (broadcast) -> a ^ b (a's dtype)"),
    DEF_BINARY(TB_OP_EQUAL, "Equal", "a, b (broadcast) -> a == b (bool)"),
    DEF_BINARY(TB_OP_LESS, "Less", "a, b (broadcast) -> a < b (bool)"),
    DEF_BINARY(TB_OP_LESS_OR_EQUAL, "LessOrEqual", "a, b (broadcast) -> a <= b (bool)"),
    DEF_BINARY(TB_OP_GREATER, "Greater", "a, b (broadcast) -> a > b (bool)"),
    DEF_BINARY(TB_OP_GREATER_OR_EQUAL, "GreaterOrEqual", "a, b (broadcast) -> a >= b (bool)"),
    DEF_BINARY(TB_OP_AND, "And", "a, b (bool, broadcast) -> a && b (bool)"),
    DEF_BINARY(TB_OP_OR, "Or", "a, b (bool, broadcast) -> a || b (bool)"),
    [TB_OP_WHERE - TB_OP_RELU] = {.name = "Where", .min_in = 3, .max_in = 3, .n_out = 1,
                                  .signature = "cond (bool), x, y (broadcast) -> cond ? x : y",
                                  .infer = infer_where, .ref = ref_where},
    [TB_OP_SOFTMAX - TB_OP_RELU] = {.name = "Softmax", .min_in = 1, .max_in = 1, .n_out = 1,
                                    .signature = "x -> exp(x) / sum(exp(x)) along axis",
                                    .n_attrs = 1,
                                    .attrs = {{"axis", TB_ATTR_INT, 0, 0, 32, 0, TB_MAX_RANK - 1, "normalised axis"}},
                                    .infer = infer_softmax, .ref = ref_softmax},
    [TB_OP_LAYERNORM - TB_OP_RELU] = {.name = "LayerNormalization", .min_in = 2, .max_in = 3, .n_out = 1,
                                      .signature = "x, scale [, bias] (broadcast over x's dims [axis, rank)) -> "
                                                   "(x - mean) / sqrt(var + epsilon) * scale + bias over [axis, rank) "
                                                   "[, mean [, 1 / sqrt(var + epsilon)] (f32, [axis, rank) dims 1)]",
                                      .n_attrs = 3,
                                      .attrs = {{"axis", TB_ATTR_INT, 0, 0, 32, 0, TB_MAX_RANK - 1,
                                                 "first normalised axis"},
                                                EPSILON_ATTR,
                                                {"outputs", TB_ATTR_INT, 1, 0, 32, 0, 3,
                                                 "outputs: 0 or 1 y; 2 also mean; 3 also inv_std_dev"}},
                                      .infer = infer_layernorm, .ref = ref_layernorm, .max_out = 3},
    [TB_OP_BATCHNORM - TB_OP_RELU] = {.name = "BatchNormalization", .min_in = 5, .max_in = 5, .n_out = 1,
                                      .signature = "x (N, C, ...), scale, bias, mean, var (C) -> "
                                                   "scale (x - mean) / sqrt(var + epsilon) + bias",
                                      .n_attrs = 1, .attrs = {EPSILON_ATTR},
                                      .infer = infer_batchnorm, .ref = ref_batchnorm},
    DEF_REDUCE(TB_OP_REDUCE_MEAN, "ReduceMean", "x [, axes (i64)] -> mean over axes"),
    DEF_REDUCE(TB_OP_REDUCE_SUM, "ReduceSum", "x [, axes (i64)] -> sum over axes"),
    DEF_REDUCE(TB_OP_REDUCE_MAX, "ReduceMax", "x [, axes (i64)] -> max over axes"),
};

const tb_op_def *tb_nn_elem_def(tb_op_kind k) {
    if (k < TB_OP_RELU || k > TB_OP_REDUCE_MAX) return NULL;
    return defs[k - TB_OP_RELU].name ? &defs[k - TB_OP_RELU] : NULL;
}
