/*
 * nn_shape.c — definitions of the general ops of this group (ops_nn.def):
 * attribute schema, shape rule and scalar reference kernel each, for the
 * shape and data-movement ops (Reshape ... Resize) and pooling.
 *
 * Shape rules follow ops_nn.h: at build time a dim may be a symbol or
 * TB_DIM_DYN and a host input's data may be NULL; a rule then answers
 * TB_DIM_DYN for what it cannot compute, carries symbols through where a dim
 * is only moved (Reshape's 0 entries, Transpose, Unsqueeze, Concat, ...), and
 * fails only on a real mismatch or when even the output rank is unknown.
 * Data movement works on any dtype of one element per block, by element
 * size; Resize (linear, cubic) and pooling compute in double over the float
 * dtypes (MaxPool and nearest Resize also over integers).
 */
#include "ir/nn_shape.h"

#include <float.h>
#include <math.h>

#define NEED(cond, ...) do { if (!(cond)) return tb_errorf(TB_ERR_FORMAT, __VA_ARGS__); } while (0)

/* ================================================================ helpers */

static int plain_dtype(tb_dtype t) {
    const tb_dtype_traits *tr = tb_dtype_get_traits(t);
    return tr && tr->block_elems == 1;
}

static int float_dtype(tb_dtype t) { return t == TB_F32 || t == TB_F16 || t == TB_BF16 || t == TB_F64; }
static int int_index_dtype(tb_dtype t) { return t == TB_I32 || t == TB_I64; }

static tb_status need_plain(const char *op, const tb_view *v) {
    NEED(plain_dtype(v->dtype), "%s: dtype %s is not supported (one element per block needed)", op,
         tb_dtype_name(v->dtype));
    return TB_OK;
}

static void set_dyn(tb_op_shape *out, int o, int rank) {
    out->rank[o] = rank;
    for (int i = 0; i < rank; i++) out->dims[o][i] = TB_DIM_DYN;
}

static void copy_dims(tb_op_shape *out, int o, const tb_view *v) {
    out->rank[o] = v->rank;
    memcpy(out->dims[o], v->dims, sizeof out->dims[o]);
}

static int all_known(const int64_t *d, int r) {
    for (int i = 0; i < r; i++)
        if (!tb_dim_known(d[i])) return 0;
    return 1;
}

/* The product of r dims: symbols survive a product with ones (tb_dim_mul). */
static int64_t dims_prod(const int64_t *d, int r) {
    int64_t p = 1;
    for (int i = 0; i < r; i++) p = tb_dim_mul(p, d[i]);
    return p;
}

/* Two dims that must be equal: the more informative one (number, symbol,
 * unknown); two different numbers are a mismatch. */
static tb_status dim_merge(int64_t a, int64_t b, int64_t *out) {
    if (tb_dim_known(a) && tb_dim_known(b) && a != b)
        return tb_errorf(TB_ERR_FORMAT, "dims %lld and %lld differ", (long long)a, (long long)b);
    *out = tb_dim_known(a) ? a : tb_dim_known(b) ? b : TB_IS_SYM(a) ? a : b;
    return TB_OK;
}

/* An integer host input (rank 0 or 1, i32 / i64): *len its length (-1 when
 * not known at build time), *known whether vals holds its entries. */
static tb_status host_ints(const char *op, const char *what, const tb_view *v, int max, int64_t *vals, int *len,
                           int *known) {
    NEED(int_index_dtype(v->dtype), "%s: %s must be i64 or i32, got %s", op, what, tb_dtype_name(v->dtype));
    NEED(v->rank <= 1, "%s: %s must be 1-d", op, what);
    int64_t l = v->rank == 0 ? 1 : v->dims[0];
    *known = 0;
    *len = -1;
    if (!tb_dim_known(l)) return TB_OK;
    NEED(l <= max, "%s: %s has %lld entries (at most %d)", op, what, (long long)l, max);
    *len = (int)l;
    if (!v->data) return TB_OK;
    for (int i = 0; i < *len; i++) vals[i] = tb_view_get_i(v, i);
    *known = 1;
    return TB_OK;
}

static tb_status rank_unknown(const char *op, const char *what) {
    return tb_errorf(TB_ERR_UNSUPPORTED, "%s: the length of %s is not known, so neither is the output rank", op,
                     what);
}

/* A scalar host input (one element): its value as double and as int64. */
static int scalar_of(const tb_view *v, double *f, int64_t *i) {
    if (!v->data) return 0;
    if (f) *f = tb_view_get_f(v, 0);
    if (i) *i = tb_view_get_i(v, 0);
    return 1;
}

/* Writes x into element i of a float or integer view. */
static void put_f(const tb_view *v, int64_t i, double x) {
    switch (v->dtype) {
    case TB_F32: ((float *)v->data)[i] = (float)x; break;
    case TB_F64: ((double *)v->data)[i] = x; break;
    case TB_F16: ((uint16_t *)v->data)[i] = tb_f32_to_f16((float)x); break;
    case TB_BF16: ((uint16_t *)v->data)[i] = tb_f32_to_bf16((float)x); break;
    case TB_I64: ((int64_t *)v->data)[i] = (int64_t)x; break;
    case TB_I32: ((int32_t *)v->data)[i] = (int32_t)x; break;
    case TB_I8: ((int8_t *)v->data)[i] = (int8_t)x; break;
    case TB_U8: case TB_BOOL: ((uint8_t *)v->data)[i] = (uint8_t)x; break;
    default: break;
    }
}

static size_t esize(const tb_view *v) { return tb_dtype_size(v->dtype); }

/* Row-major element strides of concrete dims. */
static void strides_of(const int64_t *d, int r, int64_t *st) {
    int64_t s = 1;
    for (int i = r - 1; i >= 0; i--) { st[i] = s; s *= d[i]; }
}

/* out (contiguous, dims od[r]) = in[base + sum_k j_k * st[k]], elements of
 * es bytes: the one walk behind Transpose, Slice and Expand. */
static void strided_gather(void *out, const void *in, int r, const int64_t *od, const int64_t *st, int64_t base,
                           size_t es) {
    int64_t total = 1;
    for (int k = 0; k < r; k++) total *= od[k];
    if (total == 0) return;
    int64_t idx[TB_MAX_RANK] = {0}, off = base;
    uint8_t *o = out;
    const uint8_t *src = in;
    for (int64_t e = 0; e < total; e++) {
        memcpy(o + (size_t)e * es, src + off * (int64_t)es, es);
        for (int k = r - 1; k >= 0; k--) {
            if (++idx[k] < od[k]) { off += st[k]; break; }
            off -= st[k] * (od[k] - 1);
            idx[k] = 0;
        }
    }
}

static tb_status copy_through(const tb_view *in, const tb_view *out) {
    size_t n = (size_t)tb_view_numel(out) * esize(out);
    if (tb_view_numel(in) != tb_view_numel(out))
        return tb_errorf(TB_ERR_FORMAT, "reshape: %lld elements into %lld", (long long)tb_view_numel(in),
                         (long long)tb_view_numel(out));
    if (n && out->data != in->data) memmove(out->data, in->data, n);
    return TB_OK;
}

static tb_status ref_copy(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    return copy_through(&in[0], &out[0]);
}

/* ================================================================ Reshape */

/* A dim product as a multiset of symbols times a number (dyn: some factor
 * unknown). */
typedef struct {
    int64_t c;
    int sym[TB_MAX_SYMS];
    int dyn;
} dim_factors;

static void factors_add(dim_factors *f, int64_t d) {
    if (tb_dim_known(d)) {
        if (f->c && d && f->c > INT64_MAX / d) f->dyn = 1;
        else f->c *= d;
    } else if (TB_IS_SYM(d) && TB_SYM_INDEX(d) < TB_MAX_SYMS) f->sym[TB_SYM_INDEX(d)]++;
    else f->dyn = 1;
}

static tb_status infer_reshape(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    int allowzero = n->i[0];
    int64_t sh[TB_MAX_RANK];
    int r, known;
    TB_TRY(need_plain("Reshape", x));
    TB_TRY(host_ints("Reshape", "shape", &in[1], TB_MAX_RANK, sh, &r, &known));
    if (r < 0) return rank_unknown("Reshape", "shape");
    if (!known) { set_dyn(out, 0, r); return TB_OK; }
    int64_t *od = out->dims[0];
    out->rank[0] = r;
    int minus = -1, zero = 0;
    for (int i = 0; i < r; i++) {
        NEED(sh[i] >= -1, "Reshape: shape entry %d is %lld", i, (long long)sh[i]);
        if (sh[i] == -1) {
            NEED(minus < 0, "Reshape: more than one -1 in the shape");
            minus = i;
            od[i] = 1;
        } else if (sh[i] == 0 && !allowzero) {
            NEED(i < x->rank, "Reshape: 0 at entry %d copies a dim the input (rank %d) lacks", i, x->rank);
            od[i] = x->dims[i];
        } else {
            od[i] = sh[i];
            zero |= sh[i] == 0;
        }
    }
    NEED(!(zero && minus >= 0), "Reshape: -1 with a 0 entry under allowzero");
    dim_factors fi = {1, {0}, 0}, fo = {1, {0}, 0};
    for (int i = 0; i < x->rank; i++) factors_add(&fi, x->dims[i]);
    for (int i = 0; i < r; i++)
        if (i != minus) factors_add(&fo, od[i]);
    int nsym = 0, same_syms = 1, cancel = 1;
    for (int s = 0; s < TB_MAX_SYMS; s++) {
        same_syms &= fi.sym[s] == fo.sym[s];
        int left = fi.sym[s] - fo.sym[s];
        if (left < 0) cancel = 0;
        else nsym += left;
    }
    if (minus < 0) {
        /* equal symbol multisets with different numbers never match */
        if (!fi.dyn && !fo.dyn && same_syms)
            NEED(fi.c == fo.c, "Reshape: %lld elements (times the symbols) into %lld", (long long)fi.c,
                 (long long)fo.c);
        return TB_OK;
    }
    od[minus] = TB_DIM_DYN;
    if (fi.dyn || fo.dyn || !cancel) return TB_OK;
    if (fo.c == 0) {
        if (!nsym) return tb_errorf(TB_ERR_FORMAT, "Reshape: -1 beside a 0 dim cannot be inferred");
        return TB_OK;
    }
    if (nsym == 0) {
        NEED(fi.c % fo.c == 0, "Reshape: %lld elements do not divide into rows of %lld", (long long)fi.c,
             (long long)fo.c);
        od[minus] = fi.c / fo.c;
    } else if (nsym == 1 && fi.c == fo.c) {
        for (int s = 0; s < TB_MAX_SYMS; s++)
            if (fi.sym[s] - fo.sym[s] == 1) od[minus] = TB_SYM(s);
    }
    return TB_OK;
}

/* ================================================================ Transpose */

tb_status tb_nn_transpose_perm(const tb_node *n, int r, int *perm) {
    unsigned seen = 0;
    for (int k = 0; k < r; k++) {
        int p = n->i[k];
        NEED(p >= 0 && p < r && !(seen & (1u << p)), "Transpose: perm is not a permutation of [0, %d)", r);
        seen |= 1u << p;
        perm[k] = p;
    }
    for (int k = r; k < TB_MAX_RANK; k++) NEED(n->i[k] == 0, "Transpose: perm entry %d past the rank %d", k, r);
    return TB_OK;
}

static tb_status infer_transpose(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    int perm[TB_MAX_RANK];
    TB_TRY(need_plain("Transpose", &in[0]));
    TB_TRY(tb_nn_transpose_perm(n, in[0].rank, perm));
    out->rank[0] = in[0].rank;
    for (int k = 0; k < in[0].rank; k++) out->dims[0][k] = in[0].dims[perm[k]];
    return TB_OK;
}

static tb_status ref_transpose(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int perm[TB_MAX_RANK], r = in[0].rank;
    TB_TRY(tb_nn_transpose_perm(n, r, perm));
    int64_t ist[TB_MAX_RANK], st[TB_MAX_RANK];
    strides_of(in[0].dims, r, ist);
    for (int k = 0; k < r; k++) st[k] = ist[perm[k]];
    strided_gather(out[0].data, in[0].data, r, out[0].dims, st, 0, esize(&in[0]));
    return TB_OK;
}

/* ================================================================ Unsqueeze, Squeeze, Flatten */

static tb_status infer_unsqueeze(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    int64_t ax[TB_MAX_RANK];
    int len, known;
    TB_TRY(need_plain("Unsqueeze", x));
    TB_TRY(host_ints("Unsqueeze", "axes", &in[1], TB_MAX_RANK, ax, &len, &known));
    if (len < 0) return rank_unknown("Unsqueeze", "axes");
    int r = x->rank + len;
    NEED(r <= TB_MAX_RANK, "Unsqueeze: output rank %d (at most %d)", r, TB_MAX_RANK);
    if (!known) { set_dyn(out, 0, r); return TB_OK; }
    unsigned mask = 0;
    for (int i = 0; i < len; i++) {
        int64_t a = ax[i] < 0 ? ax[i] + r : ax[i];
        NEED(a >= 0 && a < r && !(mask & (1u << a)), "Unsqueeze: axis %lld outside [-%d, %d) or repeated",
             (long long)ax[i], r, r);
        mask |= 1u << a;
    }
    out->rank[0] = r;
    for (int k = 0, j = 0; k < r; k++) out->dims[0][k] = mask & (1u << k) ? 1 : x->dims[j++];
    return TB_OK;
}

static tb_status infer_squeeze(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    unsigned mask = 0;
    TB_TRY(need_plain("Squeeze", x));
    if (n_in < 2) {
        for (int k = 0; k < x->rank; k++) {
            if (!tb_dim_known(x->dims[k]))
                return tb_errorf(TB_ERR_UNSUPPORTED,
                                 "Squeeze: no axes and dim %d is not known, so neither is the output rank", k);
            if (x->dims[k] == 1) mask |= 1u << k;
        }
    } else {
        int64_t ax[TB_MAX_RANK];
        int len, known;
        TB_TRY(host_ints("Squeeze", "axes", &in[1], TB_MAX_RANK, ax, &len, &known));
        if (len < 0) return rank_unknown("Squeeze", "axes");
        NEED(len <= x->rank, "Squeeze: %d axes of a rank-%d input", len, x->rank);
        if (!known) { set_dyn(out, 0, x->rank - len); return TB_OK; }
        for (int i = 0; i < len; i++) {
            int64_t a = ax[i] < 0 ? ax[i] + x->rank : ax[i];
            NEED(a >= 0 && a < x->rank && !(mask & (1u << a)), "Squeeze: axis %lld outside [-%d, %d) or repeated",
                 (long long)ax[i], x->rank, x->rank);
            NEED(!tb_dim_known(x->dims[a]) || x->dims[a] == 1, "Squeeze: dim %lld is %lld, not 1", (long long)a,
                 (long long)x->dims[a]);
            mask |= 1u << a;
        }
    }
    int r = 0;
    for (int k = 0; k < x->rank; k++)
        if (!(mask & (1u << k))) out->dims[0][r++] = x->dims[k];
    out->rank[0] = r;
    return TB_OK;
}

static tb_status infer_flatten(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    int axis = n->i[0];
    TB_TRY(need_plain("Flatten", x));
    NEED(axis <= x->rank, "Flatten: axis %d of a rank-%d input", axis, x->rank);
    out->rank[0] = 2;
    out->dims[0][0] = dims_prod(x->dims, axis);
    out->dims[0][1] = dims_prod(x->dims + axis, x->rank - axis);
    return TB_OK;
}

/* ================================================================ Slice */

/* ONNX's clamping of one axis: start and length of dim d sliced [s, e) by st. */
static void slice_axis(int64_t d, int64_t s, int64_t e, int64_t st, int64_t *start, int64_t *len) {
    if (s < 0) s += d;
    if (e < 0) e += d;
    if (st < -INT64_MAX) st = -INT64_MAX;
    if (st > 0) {
        s = s < 0 ? 0 : s > d ? d : s;
        e = e < 0 ? 0 : e > d ? d : e;
        *len = e > s ? (e - s - 1) / st + 1 : 0;
    } else {
        s = s < 0 ? 0 : s;
        s = s > d - 1 ? d - 1 : s;
        e = e < -1 ? -1 : e > d - 1 ? d - 1 : e;
        *len = s > e ? (s - e - 1) / -st + 1 : 0;
    }
    *start = s;
}

typedef struct {
    int n, known;
    int64_t axis[TB_MAX_RANK], s[TB_MAX_RANK], e[TB_MAX_RANK], st[TB_MAX_RANK];
} slice_args;

/* Reads starts, ends, axes and steps; known = 0 when some data is missing
 * (axes known or not: axes_known). */
static tb_status slice_read(const tb_view *in, int n_in, int rank, slice_args *a, int *axes_known) {
    int len[4], kn[4];
    int64_t *dst[4] = {a->s, a->e, a->axis, a->st};
    const char *what[4] = {"starts", "ends", "axes", "steps"};
    for (int k = 0; k < 4; k++) {
        if (k + 1 >= n_in) { len[k] = len[0]; kn[k] = 1; continue; }
        TB_TRY(host_ints("Slice", what[k], &in[k + 1], TB_MAX_RANK, dst[k], &len[k], &kn[k]));
        if (len[k] < 0) return rank_unknown("Slice", what[k]);
    }
    NEED(len[1] == len[0] && len[2] == len[0] && len[3] == len[0], "Slice: starts, ends, axes, steps differ in length");
    a->n = len[0];
    if (n_in < 4)
        for (int i = 0; i < a->n; i++) a->axis[i] = i;
    if (n_in < 5)
        for (int i = 0; i < a->n; i++) a->st[i] = 1;
    *axes_known = kn[2];
    a->known = kn[0] && kn[1] && kn[2] && kn[3];
    if (!kn[2]) return TB_OK;
    unsigned mask = 0;
    for (int i = 0; i < a->n; i++) {
        int64_t ax = a->axis[i] < 0 ? a->axis[i] + rank : a->axis[i];
        NEED(ax >= 0 && ax < rank && !(mask & (1u << ax)), "Slice: axis %lld outside [-%d, %d) or repeated",
             (long long)a->axis[i], rank, rank);
        mask |= 1u << ax;
        a->axis[i] = ax;
    }
    if (kn[3])
        for (int i = 0; i < a->n; i++) NEED(a->st[i] != 0, "Slice: step 0");
    return TB_OK;
}

static tb_status infer_slice(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    slice_args a;
    int axes_known;
    TB_TRY(need_plain("Slice", x));
    TB_TRY(slice_read(in, n_in, x->rank, &a, &axes_known));
    if (!axes_known) { set_dyn(out, 0, x->rank); return TB_OK; }
    copy_dims(out, 0, x);
    for (int i = 0; i < a.n; i++) {
        int ax = (int)a.axis[i];
        int64_t d = x->dims[ax], start, len;
        if (!a.known) { out->dims[0][ax] = TB_DIM_DYN; continue; }
        if (tb_dim_known(d)) {
            slice_axis(d, a.s[i], a.e[i], a.st[i], &start, &len);
            out->dims[0][ax] = len;
        } else {
            /* [0, "the end") keeps an unknown dim whole */
            out->dims[0][ax] = a.st[i] == 1 && a.s[i] == 0 && a.e[i] >= INT32_MAX ? d : TB_DIM_DYN;
        }
    }
    return TB_OK;
}

tb_status tb_nn_slice_plan(const tb_view *in, int n_in, const tb_view *out, int64_t *base, int64_t *st) {
    const tb_view *x = &in[0];
    slice_args a;
    int axes_known;
    TB_TRY(slice_read(in, n_in, x->rank, &a, &axes_known));
    NEED(a.known && out->rank == x->rank, "Slice: starts, ends, axes or steps unknown when run");
    strides_of(x->dims, x->rank, st);
    *base = 0;
    unsigned sliced = 0;
    for (int i = 0; i < a.n; i++) {
        int ax = (int)a.axis[i];
        int64_t start, len;
        slice_axis(x->dims[ax], a.s[i], a.e[i], a.st[i], &start, &len);
        NEED(len == out->dims[ax], "Slice: output dim %d is %lld, want %lld", ax, (long long)out->dims[ax],
             (long long)len);
        if (len) *base += start * st[ax];
        st[ax] *= a.st[i];
        sliced |= 1u << ax;
    }
    for (int k = 0; k < x->rank; k++)
        NEED((sliced & (1u << k)) || out->dims[k] == x->dims[k], "Slice: output dim %d is %lld, want %lld", k,
             (long long)out->dims[k], (long long)x->dims[k]);
    return TB_OK;
}

static tb_status ref_slice(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int64_t st[TB_MAX_RANK], base;
    TB_TRY(tb_nn_slice_plan(in, n_in, &out[0], &base, st));
    strided_gather(out[0].data, in[0].data, in[0].rank, out[0].dims, st, base, esize(&in[0]));
    return TB_OK;
}

/* ================================================================ Concat, Split */

static tb_status infer_concat(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    int axis = n->i[0], r = in[0].rank;
    TB_TRY(need_plain("Concat", &in[0]));
    NEED(axis < r, "Concat: axis %d of rank-%d inputs", axis, r);
    copy_dims(out, 0, &in[0]);
    int64_t sum = 0, unknown = 0, only = 0;
    for (int k = 0; k < n_in; k++) {
        NEED(in[k].rank == r && in[k].dtype == in[0].dtype, "Concat: input %d is rank %d %s, input 0 rank %d %s", k,
             in[k].rank, tb_dtype_name(in[k].dtype), r, tb_dtype_name(in[0].dtype));
        for (int d = 0; d < r; d++) {
            if (d == axis) continue;
            if (dim_merge(out->dims[0][d], in[k].dims[d], &out->dims[0][d]) != TB_OK)
                return tb_errorf(TB_ERR_FORMAT, "Concat: input %d: dim %d is %lld, input 0 has %lld", k, d,
                                 (long long)in[k].dims[d], (long long)in[0].dims[d]);
        }
        int64_t a = in[k].dims[axis];
        if (tb_dim_known(a)) sum += a;
        else { unknown++; only = a; }
    }
    out->dims[0][axis] = unknown == 0 ? sum : unknown == 1 && sum == 0 ? only : TB_DIM_DYN;
    return TB_OK;
}

static tb_status ref_concat(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int axis = n->i[0], r = out[0].rank;
    size_t es = esize(&out[0]);
    int64_t outer = dims_prod(out[0].dims, axis), inner = dims_prod(out[0].dims + axis + 1, r - axis - 1);
    uint8_t *o = out[0].data;
    for (int64_t j = 0; j < outer; j++)
        for (int k = 0; k < n_in; k++) {
            size_t row = (size_t)(in[k].dims[axis] * inner) * es;
            if (row) memcpy(o, (const uint8_t *)in[k].data + (size_t)j * row, row);
            o += row;
        }
    return TB_OK;
}

static tb_status infer_split(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    int axis = n->i[0], parts = n->i[1];
    TB_TRY(need_plain("Split", x));
    NEED(axis < x->rank, "Split: axis %d of a rank-%d input", axis, x->rank);
    int64_t d = x->dims[axis], sz[TB_MAX_OUTPUTS];
    int len = parts, known = 0;
    if (n_in > 1) {
        TB_TRY(host_ints("Split", "split", &in[1], TB_MAX_OUTPUTS, sz, &len, &known));
        if (len < 0) return tb_errorf(TB_ERR_UNSUPPORTED, "Split: the length of split is not known");
        NEED(len >= 1 && (parts == 0 || parts == len), "Split: %d sizes for %d outputs", len, parts);
        if (known) {
            int64_t s = 0;
            for (int k = 0; k < len; k++) {
                NEED(sz[k] >= 0 && sz[k] <= INT64_MAX - s, "Split: size %lld (negative, or the sizes overflow)",
                     (long long)sz[k]);
                s += sz[k];
            }
            NEED(!tb_dim_known(d) || s == d, "Split: sizes add up to %lld, the dim is %lld", (long long)s,
                 (long long)d);
        }
    } else {
        NEED(parts >= 1, "Split: no split input and outputs = 0");
        if (tb_dim_known(d)) {
            int64_t chunk = (d + parts - 1) / parts;
            for (int k = 0; k < parts; k++) {
                int64_t left = d - k * chunk;
                sz[k] = left < 0 ? 0 : left < chunk ? left : chunk;
            }
            known = 1;
        } else if (parts == 1) {
            sz[0] = d;
            known = 1;
        }
    }
    out->n_out = len;
    for (int k = 0; k < len; k++) {
        copy_dims(out, k, x);
        out->dims[k][axis] = known ? sz[k] : TB_DIM_DYN;
        out->dtype[k] = x->dtype;
    }
    return TB_OK;
}

static tb_status ref_split(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    int axis = n->i[0];
    size_t es = esize(x);
    int64_t outer = dims_prod(x->dims, axis), inner = dims_prod(x->dims + axis + 1, x->rank - axis - 1);
    int64_t total = 0;
    for (int k = 0; k < n_out; k++) total += out[k].dims[axis];
    NEED(total == x->dims[axis], "Split: outputs add up to %lld along axis %d, the input has %lld",
         (long long)total, axis, (long long)x->dims[axis]);
    const uint8_t *src = x->data;
    for (int64_t j = 0; j < outer; j++)
        for (int k = 0; k < n_out; k++) {
            size_t row = (size_t)(out[k].dims[axis] * inner) * es;
            if (row) memcpy((uint8_t *)out[k].data + (size_t)j * row, src, row);
            src += row;
        }
    return TB_OK;
}

/* ================================================================ Shape, Gather, Expand */

static void shape_range(const tb_node *n, int r, int *s, int *e) {
    int64_t a = n->i[0], b = n->i[2] ? n->i[1] : r;
    if (a < 0) a += r;
    if (b < 0) b += r;
    a = a < 0 ? 0 : a > r ? r : a;
    b = b < 0 ? 0 : b > r ? r : b;
    *s = (int)a;
    *e = (int)(b > a ? b : a);
}

static tb_status infer_shape(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    int s, e;
    shape_range(n, in[0].rank, &s, &e);
    out->rank[0] = 1;
    out->dims[0][0] = e - s;
    out->dtype[0] = TB_I64;
    return TB_OK;
}

static tb_status ref_shape(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int s, e;
    shape_range(n, in[0].rank, &s, &e);
    for (int k = s; k < e; k++) ((int64_t *)out[0].data)[k - s] = in[0].dims[k];
    return TB_OK;
}

static tb_status infer_gather(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0], *ix = &in[1];
    int axis = n->i[0];
    TB_TRY(need_plain("Gather", x));
    NEED(axis < x->rank, "Gather: axis %d of a rank-%d input", axis, x->rank);
    NEED(int_index_dtype(ix->dtype), "Gather: indices must be i32 or i64, got %s", tb_dtype_name(ix->dtype));
    int r = x->rank - 1 + ix->rank;
    NEED(r <= TB_MAX_RANK, "Gather: output rank %d (at most %d)", r, TB_MAX_RANK);
    out->rank[0] = r;
    int k = 0;
    for (int d = 0; d < axis; d++) out->dims[0][k++] = x->dims[d];
    for (int d = 0; d < ix->rank; d++) out->dims[0][k++] = ix->dims[d];
    for (int d = axis + 1; d < x->rank; d++) out->dims[0][k++] = x->dims[d];
    return TB_OK;
}

static tb_status ref_gather(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0], *ix = &in[1];
    int axis = n->i[0];
    size_t es = esize(x);
    int64_t outer = dims_prod(x->dims, axis), A = x->dims[axis];
    size_t row = (size_t)dims_prod(x->dims + axis + 1, x->rank - axis - 1) * es;
    int64_t ni = tb_view_numel(ix);
    uint8_t *o = out[0].data;
    for (int64_t j = 0; j < outer; j++)
        for (int64_t t = 0; t < ni; t++) {
            int64_t i = tb_view_get_i(ix, t);
            if (i < 0) i += A;
            if (i < 0 || i >= A)
                return tb_errorf(TB_ERR_INVALID_ARG, "Gather: index %lld outside [-%lld, %lld)",
                                 (long long)tb_view_get_i(ix, t), (long long)A, (long long)A);
            if (row) memcpy(o, (const uint8_t *)x->data + ((size_t)(j * A + i)) * row, row);
            o += row;
        }
    return TB_OK;
}

static tb_status infer_expand(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    int64_t sh[TB_MAX_RANK];
    int len, known;
    TB_TRY(need_plain("Expand", x));
    TB_TRY(host_ints("Expand", "shape", &in[1], TB_MAX_RANK, sh, &len, &known));
    if (len < 0) return rank_unknown("Expand", "shape");
    if (known) {
        for (int i = 0; i < len; i++) NEED(sh[i] >= 0, "Expand: shape entry %lld", (long long)sh[i]);
        if (tb_shape_broadcast(x->rank, x->dims, len, sh, &out->rank[0], out->dims[0]) != TB_OK)
            return tb_error_prefix(TB_ERR_FORMAT, "Expand");
        return TB_OK;
    }
    int r = x->rank > len ? x->rank : len;
    out->rank[0] = r;
    for (int i = 0; i < r; i++) {
        int ix = i - (r - x->rank);
        int64_t d = ix >= 0 ? x->dims[ix] : TB_DIM_DYN;
        out->dims[0][i] = tb_dim_known(d) && d != 1 ? d : TB_DIM_DYN;
    }
    return TB_OK;
}

/* Strides that read x broadcast to out's dims (0 along broadcast dims). */
void tb_nn_broadcast_strides(const tb_view *x, const tb_view *o, int64_t *st) {
    int64_t xs[TB_MAX_RANK];
    strides_of(x->dims, x->rank, xs);
    for (int i = 0; i < o->rank; i++) {
        int ix = i - (o->rank - x->rank);
        st[i] = ix < 0 || x->dims[ix] == 1 ? 0 : xs[ix];
    }
}

static tb_status ref_expand(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int64_t st[TB_MAX_RANK];
    tb_nn_broadcast_strides(&in[0], &out[0], st);
    strided_gather(out[0].data, in[0].data, out[0].rank, out[0].dims, st, 0, esize(&in[0]));
    return TB_OK;
}

/* ================================================================ Range, ConstantOfShape, Trilu */

static int scalar_view(const tb_view *v) { return v->rank == 0 || (v->rank == 1 && v->dims[0] == 1); }

static tb_status range_count(const tb_view *in, int64_t *count) {
    tb_dtype t = in[0].dtype;
    if (t == TB_I32 || t == TB_I64) {
        int64_t s = tb_view_get_i(&in[0], 0), l = tb_view_get_i(&in[1], 0), d = tb_view_get_i(&in[2], 0);
        NEED(d != 0, "Range: delta is 0");
        int64_t span = l - s, c = d > 0 ? (span > 0 ? (span + d - 1) / d : 0) : (span < 0 ? (-span - d - 1) / -d : 0);
        *count = c;
        return TB_OK;
    }
    double s = tb_view_get_f(&in[0], 0), l = tb_view_get_f(&in[1], 0), d = tb_view_get_f(&in[2], 0);
    NEED(d != 0 && isfinite(s) && isfinite(l) && isfinite(d), "Range: delta 0 or a bound not finite");
    double span = t == TB_F32 ? (double)((float)l - (float)s) : l - s;
    double c = ceil(span / d);
    NEED(c < 1e15, "Range: %g elements", c);
    *count = c > 0 ? (int64_t)c : 0;
    return TB_OK;
}

static tb_status infer_range(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    tb_dtype t = in[0].dtype;
    NEED(t == TB_F32 || t == TB_F64 || t == TB_I32 || t == TB_I64, "Range: dtype %s (f32, f64, i32, i64)",
         tb_dtype_name(t));
    for (int k = 0; k < 3; k++)
        NEED(in[k].dtype == t && scalar_view(&in[k]), "Range: start, limit, delta must be scalars of one dtype");
    out->rank[0] = 1;
    out->dims[0][0] = TB_DIM_DYN;
    if (in[0].data && in[1].data && in[2].data) TB_TRY(range_count(in, &out->dims[0][0]));
    return TB_OK;
}

static tb_status ref_range(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    int64_t c;
    TB_TRY(range_count(in, &c));
    NEED(c == out[0].dims[0], "Range: %lld elements, the output has %lld", (long long)c, (long long)out[0].dims[0]);
    switch (in[0].dtype) {
    case TB_F32: {
        float s = ((const float *)in[0].data)[0], d = ((const float *)in[2].data)[0];
        for (int64_t i = 0; i < c; i++) ((float *)out[0].data)[i] = s + (float)i * d;
        break;
    }
    case TB_F64: {
        double s = ((const double *)in[0].data)[0], d = ((const double *)in[2].data)[0];
        for (int64_t i = 0; i < c; i++) ((double *)out[0].data)[i] = s + (double)i * d;
        break;
    }
    case TB_I64: {
        int64_t s = tb_view_get_i(&in[0], 0), d = tb_view_get_i(&in[2], 0);
        for (int64_t i = 0; i < c; i++) ((int64_t *)out[0].data)[i] = s + i * d;
        break;
    }
    default: {
        int64_t s = tb_view_get_i(&in[0], 0), d = tb_view_get_i(&in[2], 0);
        for (int64_t i = 0; i < c; i++) ((int32_t *)out[0].data)[i] = (int32_t)(s + i * d);
    }
    }
    return TB_OK;
}

static tb_status infer_constant_of_shape(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    int64_t sh[TB_MAX_RANK];
    int len, known;
    TB_TRY(host_ints("ConstantOfShape", "shape", &in[0], TB_MAX_RANK, sh, &len, &known));
    if (len < 0) return rank_unknown("ConstantOfShape", "shape");
    const tb_view *v = &in[1];
    TB_TRY(need_plain("ConstantOfShape", v));
    NEED(!all_known(v->dims, v->rank) || tb_view_numel(v) == 1, "ConstantOfShape: value must be one element");
    out->dtype[0] = v->dtype;
    if (!known) { set_dyn(out, 0, len); return TB_OK; }
    out->rank[0] = len;
    for (int i = 0; i < len; i++) {
        NEED(sh[i] >= 0, "ConstantOfShape: shape entry %lld", (long long)sh[i]);
        out->dims[0][i] = sh[i];
    }
    return TB_OK;
}

static tb_status ref_constant_of_shape(const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                                       int n_out) {
    size_t es = esize(&out[0]);
    int64_t c = tb_view_numel(&out[0]);
    for (int64_t i = 0; i < c; i++) memcpy((uint8_t *)out[0].data + (size_t)i * es, in[1].data, es);
    return TB_OK;
}

static tb_status infer_trilu(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    TB_TRY(need_plain("Trilu", &in[0]));
    NEED(in[0].rank >= 2, "Trilu: input rank %d (at least 2)", in[0].rank);
    if (n_in > 1)
        NEED(int_index_dtype(in[1].dtype) && scalar_view(&in[1]), "Trilu: k must be an i64 scalar");
    copy_dims(out, 0, &in[0]);
    return TB_OK;
}

static tb_status ref_trilu(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    int64_t k = 0;
    if (n_in > 1) scalar_of(&in[1], NULL, &k);
    int upper = n->i[0], r = x->rank;
    int64_t M = x->dims[r - 2], N = x->dims[r - 1], B = dims_prod(x->dims, r - 2);
    size_t es = esize(x);
    const uint8_t *src = x->data;
    uint8_t *dst = out[0].data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                size_t off = ((size_t)(b * M + i) * N + j) * es;
                int keep = upper ? j - i >= k : j - i <= k;
                if (keep) memmove(dst + off, src + off, es);
                else memset(dst + off, 0, es);
            }
    return TB_OK;
}

/* ================================================================ Resize */

static tb_status resize_params(const tb_node *n, const tb_view *in, int n_in, double *scale, int64_t *size,
                               double *roi, int *known) {
    const tb_view *x = &in[0], *p = &in[1];
    int r = x->rank;
    NEED(p->rank == 1, "Resize: scales / sizes must be 1-d");
    if (tb_dim_known(p->dims[0]))
        NEED(p->dims[0] == r, "Resize: %lld scales / sizes for a rank-%d input", (long long)p->dims[0], r);
    int by_sizes = int_index_dtype(p->dtype);
    NEED(by_sizes || p->dtype == TB_F32 || p->dtype == TB_F64, "Resize: scales must be f32, sizes i64");
    for (int d = 0; d < r; d++) { roi[d] = 0; roi[r + d] = 1; }
    int roi_known = 1;
    if (n_in > 2) {
        const tb_view *q = &in[2];
        NEED(q->rank == 1 && float_dtype(q->dtype), "Resize: roi must be 1-d float");
        if (tb_dim_known(q->dims[0]))
            NEED(q->dims[0] == 2 * r, "Resize: roi has %lld entries, want %d", (long long)q->dims[0], 2 * r);
        if (q->data)
            for (int d = 0; d < 2 * r; d++) roi[d] = tb_view_get_f(q, d);
        else roi_known = 0;
    }
    int crop = n->i[1] == TB_NN_COORD_TF_CROP_AND_RESIZE;
    *known = p->data != NULL && (roi_known || !crop);
    for (int d = 0; d < r; d++) {
        size[d] = TB_DIM_DYN;
        scale[d] = 1;
        if (!p->data) continue;
        int64_t in_d = x->dims[d];
        if (by_sizes) {
            size[d] = tb_view_get_i(p, d);
            NEED(size[d] >= 0, "Resize: size %lld", (long long)size[d]);
            if (tb_dim_known(in_d)) scale[d] = in_d ? (double)size[d] / (double)in_d : 1;
            else if (size[d] != in_d) { *known = 0; }
        } else {
            scale[d] = tb_view_get_f(p, d);
            NEED(scale[d] > 0 && isfinite(scale[d]), "Resize: scale %g", scale[d]);
            double span = crop ? roi[r + d] - roi[d] : 1.0;
            if (tb_dim_known(in_d)) {
                if (!crop || roi_known) {
                    double sz = floor((double)in_d * span * scale[d]);
                    NEED(sz >= 0 && sz <= (double)((int64_t)1 << 40), "Resize: output dim %d would be %g", d, sz);
                    size[d] = (int64_t)sz;
                }
            } else if (scale[d] == 1 && span == 1) size[d] = in_d;
        }
    }
    return TB_OK;
}

static tb_status infer_resize(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    int r = x->rank;
    TB_TRY(need_plain("Resize", x));
    NEED(r >= 1, "Resize: a scalar input");
    if (n->i[0] != TB_NN_RESIZE_NEAREST)
        NEED(float_dtype(x->dtype), "Resize: linear and cubic modes need a float input, got %s",
             tb_dtype_name(x->dtype));
    double scale[TB_MAX_RANK], roi[2 * TB_MAX_RANK];
    int known;
    TB_TRY(resize_params(n, in, n_in, scale, out->dims[0], roi, &known));
    out->rank[0] = r;
    return TB_OK;
}

/* Source coordinate of output coordinate xr along one axis (ONNX Resize). */
static double resize_coord(int mode, double xr, double scale, int64_t len_in, int64_t len_out, double r0,
                           double r1) {
    switch (mode) {
    case TB_NN_COORD_ASYMMETRIC: return xr / scale;
    case TB_NN_COORD_ALIGN_CORNERS: {
        /* the resized length as the scale gives it, fractional (as ONNX's
         * reference and its conformance data: 4 x 0.6 aligns over 2.4) */
        double lr = scale * (double)len_in;
        return lr == 1 ? 0 : xr * (double)(len_in - 1) / (lr - 1);
    }
    case TB_NN_COORD_PYTORCH_HALF_PIXEL: return len_out > 1 ? (xr + 0.5) / scale - 0.5 : 0;
    case TB_NN_COORD_TF_CROP_AND_RESIZE:
        return len_out > 1 ? r0 * (double)(len_in - 1) + xr * (r1 - r0) * (double)(len_in - 1) / (double)(len_out - 1)
                           : 0.5 * (r0 + r1) * (double)(len_in - 1);
    case TB_NN_COORD_HALF_PIXEL_SYMMETRIC: {
        double adjustment = (double)len_out / (scale * (double)len_in);
        double center = (double)len_in / 2, offset = center * (1 - adjustment);
        return offset + (xr + 0.5) / scale - 0.5;
    }
    default: return (xr + 0.5) / scale - 0.5; /* half_pixel */
    }
}

static void cubic_coeffs(double t, double A, double *c) {
    double a = t + 1, b = 1 - t, e = 2 - t;
    c[0] = ((A * a - 5 * A) * a + 8 * A) * a - 4 * A;
    c[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
    c[2] = ((A + 2) * b - (A + 3)) * b * b + 1;
    c[3] = ((A * e - 5 * A) * e + 8 * A) * e - 4 * A;
}

/* Per output coordinate of one axis: up to 4 (source index, weight) taps;
 * outside[j] = 1 where tf_crop_and_resize extrapolates. */
typedef struct {
    int64_t *idx;
    double *w;
    uint8_t *outside;
    int taps;
} resize_axis;

static void resize_axis_fill(const tb_node *n, resize_axis *ax, int64_t len_in, int64_t len_out, double scale,
                             double r0, double r1) {
    int mode = n->i[0], coord = n->i[1], nearest = n->i[2], excl = n->i[3];
    double A = n->f[0];
    ax->taps = mode == TB_NN_RESIZE_NEAREST ? 1 : mode == TB_NN_RESIZE_LINEAR ? 2 : 4;
    for (int64_t o = 0; o < len_out; o++) {
        double xo = resize_coord(coord, (double)o, scale, len_in, len_out, r0, r1);
        int64_t *idx = ax->idx + o * ax->taps;
        double *w = ax->w + o * ax->taps;
        ax->outside[o] = coord == TB_NN_COORD_TF_CROP_AND_RESIZE && (xo < 0 || xo > (double)(len_in - 1));
        double fl = floor(xo), t = xo - fl;
        int64_t f = (int64_t)fl;
        if (mode == TB_NN_RESIZE_NEAREST) {
            int64_t i;
            if (t == 0) i = f;
            else switch (nearest) {
                case TB_NN_NEAREST_ROUND_PREFER_CEIL: i = t >= 0.5 ? f + 1 : f; break;
                case TB_NN_NEAREST_FLOOR: i = f; break;
                case TB_NN_NEAREST_CEIL: i = f + 1; break;
                default: i = t > 0.5 ? f + 1 : f; break;
                }
            idx[0] = i < 0 ? 0 : i >= len_in ? len_in - 1 : i;
            w[0] = 1;
            continue;
        }
        int64_t first;
        if (mode == TB_NN_RESIZE_LINEAR) {
            w[0] = 1 - t; w[1] = t;
            first = f;
        } else {
            cubic_coeffs(t, A, w);
            first = f - 1;
        }
        double sum = 0;
        for (int j = 0; j < ax->taps; j++) {
            int64_t i = first + j;
            if (excl && (i < 0 || i >= len_in)) w[j] = 0;
            sum += w[j];
            idx[j] = i < 0 ? 0 : i >= len_in ? len_in - 1 : i;
        }
        if (excl && sum != 0)
            for (int j = 0; j < ax->taps; j++) w[j] /= sum;
    }
}

static tb_status ref_resize(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    int r = x->rank;
    double scale[TB_MAX_RANK], roi[2 * TB_MAX_RANK];
    int64_t size[TB_MAX_RANK];
    int known;
    TB_TRY(resize_params(n, in, n_in, scale, size, roi, &known));
    for (int d = 0; d < r; d++)
        NEED(size[d] == out[0].dims[d], "Resize: output dim %d is %lld, want %lld", d, (long long)out[0].dims[d],
             (long long)size[d]);
    resize_axis ax[TB_MAX_RANK];
    memset(ax, 0, sizeof ax);
    size_t cells = 0;
    for (int d = 0; d < r; d++) cells += (size_t)size[d];
    int64_t *idx = malloc(cells * 4 * sizeof *idx + 1);
    double *w = malloc(cells * 4 * sizeof *w + 1);
    uint8_t *outside = malloc(cells + 1);
    if (!idx || !w || !outside) {
        free(idx); free(w); free(outside);
        return tb_errorf(TB_ERR_OOM, "Resize: out of memory");
    }
    size_t at = 0;
    for (int d = 0; d < r; d++) {
        ax[d].idx = idx + at * 4;
        ax[d].w = w + at * 4;
        ax[d].outside = outside + at;
        resize_axis_fill(n, &ax[d], x->dims[d], size[d], scale[d], roi[d], roi[r + d]);
        at += (size_t)size[d];
    }
    int64_t xs[TB_MAX_RANK], total = tb_view_numel(&out[0]), o[TB_MAX_RANK] = {0};
    strides_of(x->dims, r, xs);
    size_t es = esize(x);
    int nearest = n->i[0] == TB_NN_RESIZE_NEAREST;
    double extrap = n->f[1];
    for (int64_t e = 0; e < total; e++) {
        int out_of = 0;
        for (int d = 0; d < r; d++) out_of |= ax[d].outside[o[d]];
        if (nearest && !out_of) {
            int64_t src = 0;
            for (int d = 0; d < r; d++) src += ax[d].idx[o[d]] * xs[d];
            memcpy((uint8_t *)out[0].data + (size_t)e * es, (const uint8_t *)x->data + (size_t)src * es, es);
        } else if (out_of) {
            put_f(&out[0], e, extrap);
        } else {
            /* the sum over every combination of taps, axis by axis */
            int t[TB_MAX_RANK] = {0};
            double acc = 0;
            for (;;) {
                double wt = 1;
                int64_t src = 0;
                for (int d = 0; d < r; d++) {
                    wt *= ax[d].w[o[d] * ax[d].taps + t[d]];
                    src += ax[d].idx[o[d] * ax[d].taps + t[d]] * xs[d];
                }
                if (wt != 0) acc += wt * tb_view_get_f(x, src);
                int d = r - 1;
                for (; d >= 0; d--) {
                    if (++t[d] < ax[d].taps) break;
                    t[d] = 0;
                }
                if (d < 0) break;
            }
            put_f(&out[0], e, acc);
        }
        for (int d = r - 1; d >= 0; d--) {
            if (++o[d] < size[d]) break;
            o[d] = 0;
        }
    }
    free(idx); free(w); free(outside);
    return TB_OK;
}

/* ================================================================ pooling */

/* Output length and pads of one spatial axis; TB_DIM_DYN when len is not
 * known. */
static tb_status pool_axis(int64_t len, int k, int s, int d, int autopad, int ceil_mode, int *pb, int *pe,
                           int64_t *out) {
    int64_t ek = (int64_t)(k - 1) * d + 1;
    if (!tb_dim_known(len)) { *out = TB_DIM_DYN; return TB_OK; }
    switch (autopad) {
    case TB_NN_PAD_VALID:
        *pb = *pe = 0;
        *out = len >= ek ? (len - ek) / s + 1 : 0;
        return TB_OK;
    case TB_NN_PAD_SAME_UPPER:
    case TB_NN_PAD_SAME_LOWER: {
        int64_t o = (len + s - 1) / s, total = (o - 1) * s + ek - len;
        if (total < 0) total = 0;
        int64_t small = total / 2, big = total - small;
        *pb = (int)(autopad == TB_NN_PAD_SAME_UPPER ? small : big);
        *pe = (int)(autopad == TB_NN_PAD_SAME_UPPER ? big : small);
        *out = o;
        return TB_OK;
    }
    default: {
        int64_t span = len + *pb + *pe - ek;
        NEED(span >= 0, "pool: window %lld larger than the padded input %lld", (long long)ek,
             (long long)(len + *pb + *pe));
        int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
        /* a last window starting in the end padding is dropped (ceil_mode) */
        if (ceil_mode && (o - 1) * s >= len + *pb) o--;
        *out = o;
        return TB_OK;
    }
    }
}

/* The geometry of a MaxPool / AveragePool node over x (N, C, [H,] W). */
tb_status tb_nn_pool_geom(const tb_node *n, const tb_view *x, tb_nn_conv_geom *g) {
    const char *op = n->op == TB_OP_MAXPOOL ? "MaxPool" : "AveragePool";
    NEED(x->rank == 3 || x->rank == 4, "%s: input rank %d (3 or 4)", op, x->rank);
    memset(g, 0, sizeof *g);
    int r4 = x->rank == 4;
    g->n = x->dims[0];
    g->c = g->m = x->dims[1];
    g->h = r4 ? x->dims[2] : 1;
    g->w = x->dims[x->rank - 1];
    g->kh = r4 ? n->i[0] : 1;
    g->kw = n->i[1];
    g->sh = r4 && n->i[2] ? n->i[2] : 1;
    g->sw = n->i[3] ? n->i[3] : 1;
    g->pt = r4 ? n->i[4] : 0;
    g->pl = n->i[5];
    g->pb = r4 ? n->i[6] : 0;
    g->pr = n->i[7];
    g->dh = r4 && n->i[8] ? n->i[8] : 1;
    g->dw = n->i[9] ? n->i[9] : 1;
    g->group = 1;
    NEED(g->kh >= 1 && g->kw >= 1, "%s: kernel %dx%d", op, g->kh, g->kw);
    int ap = n->i[12], cm = n->i[10];
    TB_TRY(pool_axis(g->h, g->kh, g->sh, g->dh, ap, cm, &g->pt, &g->pb, &g->oh));
    TB_TRY(pool_axis(g->w, g->kw, g->sw, g->dw, ap, cm, &g->pl, &g->pr, &g->ow));
    return TB_OK;
}

static tb_status infer_pool(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    const tb_view *x = &in[0];
    const char *op = n->op == TB_OP_MAXPOOL ? "MaxPool" : "AveragePool";
    NEED(float_dtype(x->dtype) || (n->op == TB_OP_MAXPOOL && (x->dtype == TB_I8 || x->dtype == TB_U8)),
         "%s: dtype %s", op, tb_dtype_name(x->dtype));
    tb_nn_conv_geom g;
    TB_TRY(tb_nn_pool_geom(n, x, &g));
    copy_dims(out, 0, x);
    if (x->rank == 4) out->dims[0][2] = g.oh;
    out->dims[0][x->rank - 1] = g.ow;
    return TB_OK;
}

static tb_status ref_pool(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    tb_nn_conv_geom g;
    TB_TRY(tb_nn_pool_geom(n, x, &g));
    int is_max = n->op == TB_OP_MAXPOOL, incl = n->i[11];
    int64_t planes = g.n * g.c, e = 0;
    for (int64_t p = 0; p < planes; p++)
        for (int64_t oh = 0; oh < g.oh; oh++)
            for (int64_t ow = 0; ow < g.ow; ow++, e++) {
                double acc = is_max ? -INFINITY : 0;
                int64_t cnt = 0;
                for (int i = 0; i < g.kh; i++) {
                    int64_t ih = oh * g.sh - g.pt + (int64_t)i * g.dh;
                    int in_h = ih >= 0 && ih < g.h, pad_h = ih >= -g.pt && ih < g.h + g.pb;
                    for (int j = 0; j < g.kw; j++) {
                        int64_t iw = ow * g.sw - g.pl + (int64_t)j * g.dw;
                        int in_w = iw >= 0 && iw < g.w, pad_w = iw >= -g.pl && iw < g.w + g.pr;
                        if (in_h && in_w) {
                            double v = tb_view_get_f(x, (p * g.h + ih) * g.w + iw);
                            if (is_max) acc = v > acc ? v : acc;
                            else acc += v;
                        }
                        cnt += incl ? pad_h && pad_w : in_h && in_w;
                    }
                }
                put_f(&out[0], e, is_max ? acc : cnt ? acc / (double)cnt : 0);
            }
    return TB_OK;
}

static tb_status infer_global_avgpool(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out) {
    NEED(in[0].rank >= 3 && float_dtype(in[0].dtype), "GlobalAveragePool: want x (N, C, ...) float");
    copy_dims(out, 0, &in[0]);
    for (int d = 2; d < in[0].rank; d++) out->dims[0][d] = 1;
    return TB_OK;
}

static tb_status ref_global_avgpool(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, int n_out) {
    const tb_view *x = &in[0];
    int64_t planes = x->dims[0] * x->dims[1], sp = dims_prod(x->dims + 2, x->rank - 2);
    for (int64_t p = 0; p < planes; p++) {
        double acc = 0;
        for (int64_t i = 0; i < sp; i++) acc += tb_view_get_f(x, p * sp + i);
        put_f(&out[0], p, sp ? acc / (double)sp : 0);
    }
    return TB_OK;
}

/* ================================================================ the table */

#define IATTR(nm, slot, lo, hi, doc) {nm, TB_ATTR_INT, slot, 0, 32, lo, hi, doc}
#define BATTR(nm, slot, doc) {nm, TB_ATTR_BOOL, slot, 0, 32, 0, 1, doc}
#define AXIS_ATTR(hi) IATTR("axis", 0, 0, hi, "normalised to [0, rank)")
#define RMAX (TB_MAX_RANK - 1)
#define PERM(k) IATTR("perm" #k, k, 0, RMAX, "output dim " #k " is input dim perm" #k)
#define POOL_ATTRS                                                                                     \
    IATTR("kernel_h", 0, 0, 65535, "rank 4 only"), IATTR("kernel_w", 1, 0, 65535, "window width"),       \
        IATTR("stride_h", 2, 0, 65535, "0: 1"), IATTR("stride_w", 3, 0, 65535, "0: 1"),                  \
        IATTR("pad_top", 4, 0, 65535, ""), IATTR("pad_left", 5, 0, 65535, ""),                           \
        IATTR("pad_bottom", 6, 0, 65535, ""), IATTR("pad_right", 7, 0, 65535, ""),                       \
        IATTR("dilation_h", 8, 0, 65535, "0: 1"), IATTR("dilation_w", 9, 0, 65535, "0: 1"),              \
        BATTR("ceil_mode", 10, "ceil instead of floor for the output size"),                            \
        BATTR("count_include_pad", 11, "AveragePool: pads count in the divisor"),                       \
        IATTR("auto_pad", 12, 0, 3, "tb_nn_autopad")

/* op, name, arity, signature, rule, reference, host inputs, outputs up to,
 * attribute count, attributes */
#define DEF(e, nm, lo, hi, sig, inf, rf, host, maxo, na, ...) \
    [e - TB_OP_RESHAPE] = {nm, lo, hi, 1, sig, na, {__VA_ARGS__}, NULL, inf, rf, host, maxo}

static const tb_op_def defs[TB_OP_GLOBAL_AVGPOOL - TB_OP_RESHAPE + 1] = {
    DEF(TB_OP_RESHAPE, "Reshape", 2, 2, "data, shape (i64, host) -> data reshaped (0 copies, -1 infers)",
        infer_reshape, ref_copy, 0x2, 0, 1, BATTR("allowzero", 0, "a 0 entry is a 0 dim, not a copy")),
    DEF(TB_OP_TRANSPOSE, "Transpose", 1, 1, "data -> data with dims permuted (out dim k = in dim perm[k])",
        infer_transpose, ref_transpose, 0, 0, 8, PERM(0), PERM(1), PERM(2), PERM(3), PERM(4), PERM(5), PERM(6),
        PERM(7)),
    DEF(TB_OP_UNSQUEEZE, "Unsqueeze", 2, 2, "data, axes (i64, host) -> data with 1s inserted", infer_unsqueeze,
        ref_copy, 0x2, 0, 0, {0}),
    DEF(TB_OP_SQUEEZE, "Squeeze", 1, 2, "data [, axes (i64, host)] -> data without those 1s", infer_squeeze,
        ref_copy, 0x2, 0, 0, {0}),
    DEF(TB_OP_FLATTEN, "Flatten", 1, 1, "data -> (prod dims[:axis], prod dims[axis:])", infer_flatten, ref_copy, 0,
        0, 1, IATTR("axis", 0, 0, TB_MAX_RANK, "in [0, rank]")),
    DEF(TB_OP_SLICE, "Slice", 3, 5, "data, starts, ends [, axes [, steps]] (i64 / i32, host) -> sliced data",
        infer_slice, ref_slice, 0x1e, 0, 0, {0}),
    DEF(TB_OP_CONCAT, "Concat", 1, TB_MAX_INPUTS, "inputs... (equal but for axis) -> joined along axis",
        infer_concat, ref_concat, 0, 0, 1, AXIS_ATTR(RMAX)),
    DEF(TB_OP_SPLIT, "Split", 1, 2, "data [, split (i64, host)] -> parts along axis", infer_split, ref_split, 0x2,
        TB_MAX_OUTPUTS, 2, AXIS_ATTR(RMAX), IATTR("outputs", 1, 0, TB_MAX_OUTPUTS, "equal parts when no split input")),
    DEF(TB_OP_SHAPE, "Shape", 1, 1, "data -> dims[start:end] (i64)", infer_shape, ref_shape, 0, 0, 3,
        IATTR("start", 0, INT32_MIN, INT32_MAX, "negative from the end, clamped"),
        IATTR("end", 1, INT32_MIN, INT32_MAX, "as start, when has_end"), BATTR("has_end", 2, "0: ends at the rank")),
    DEF(TB_OP_GATHER, "Gather", 2, 2, "data, indices (i32 / i64) -> data[..., indices, ...] along axis",
        infer_gather, ref_gather, 0, 0, 1, AXIS_ATTR(RMAX)),
    DEF(TB_OP_EXPAND, "Expand", 2, 2, "data, shape (i64, host) -> data broadcast to shape", infer_expand,
        ref_expand, 0x2, 0, 0, {0}),
    DEF(TB_OP_RANGE, "Range", 3, 3, "start, limit, delta (scalars, host) -> (ceil((limit - start) / delta))",
        infer_range, ref_range, 0x7, 0, 0, {0}),
    DEF(TB_OP_CONSTANT_OF_SHAPE, "ConstantOfShape", 2, 2, "shape (i64, host), value (1 element) -> shape filled",
        infer_constant_of_shape, ref_constant_of_shape, 0x1, 0, 0, {0}),
    DEF(TB_OP_TRILU, "Trilu", 1, 2, "x (..., M, N) [, k (i64, host)] -> triangle of x, the rest 0", infer_trilu,
        ref_trilu, 0x2, 0, 1, BATTR("upper", 0, "keep j - i >= k (else j - i <= k)")),
    DEF(TB_OP_RESIZE, "Resize", 2, 3, "x, scales (f32) or sizes (i64) (host) [, roi (host)] -> x resized",
        infer_resize, ref_resize, 0x6, 0, 6, IATTR("mode", 0, 0, 2, "tb_nn_resize_mode"),
        IATTR("coordinate_transformation_mode", 1, 0, 5, "tb_nn_coord"),
        IATTR("nearest_mode", 2, 0, 3, "tb_nn_nearest"), BATTR("exclude_outside", 3, "taps outside get weight 0"),
        {"cubic_coeff_a", TB_ATTR_FLOAT, 0, 0, 32, -100, 100, "cubic mode's A"},
        {"extrapolation_value", TB_ATTR_FLOAT, 1, 0, 32, -FLT_MAX, FLT_MAX, "tf_crop_and_resize outside"}),
    DEF(TB_OP_MAXPOOL, "MaxPool", 1, 1, "x (N, C, H, W) or (N, C, W) -> max over each window", infer_pool,
        ref_pool, 0, 0, 13, POOL_ATTRS),
    DEF(TB_OP_AVGPOOL, "AveragePool", 1, 1, "x (N, C, H, W) or (N, C, W) -> mean over each window", infer_pool,
        ref_pool, 0, 0, 13, POOL_ATTRS),
    DEF(TB_OP_GLOBAL_AVGPOOL, "GlobalAveragePool", 1, 1, "x (N, C, ...) -> (N, C, 1, ...) spatial mean",
        infer_global_avgpool, ref_global_avgpool, 0, 0, 0, {0}),
};

const tb_op_def *tb_nn_shape_def(tb_op_kind k) {
    if (k < TB_OP_RESHAPE || k > TB_OP_GLOBAL_AVGPOOL) return NULL;
    return &defs[k - TB_OP_RESHAPE];
}
