/*
 * test_nn_elem.c — the elementwise, normalisation and reduction ops
 * (ir/nn_elem.c, backend/cpu/nn_elem.c): attribute schemas, shape rules at
 * build time (symbols, TB_DIM_DYN, unknown host inputs) and run time, the
 * reference kernels against values computed here from math.h, and each fast
 * CPU kernel against the reference on odd and large shapes with a stated
 * bound per op. `test_nn_elem --bench` times a few kernels against plain
 * loops.
 */
#include "backend/cpu/nn.h"
#include "tb_test.h"

#include <float.h>
#include <time.h>

#define D(...) ((int64_t[]){__VA_ARGS__})
#define F32(...) ((float[]){__VA_ARGS__})

static tb_view V(tb_dtype dt, int rank, const int64_t *dims, const void *data) {
    tb_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dt;
    v.rank = rank;
    if (rank) memcpy(v.dims, dims, (size_t)rank * sizeof *dims);
    v.data = (void *)data;
    return v;
}

static tb_node N(tb_op_kind op) {
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    return n;
}

/* Sizes out[0] by the op's rule and runs it: the reference (ctx NULL) or
 * the CPU dispatch. out->data is malloc'd (free it). */
static tb_status run(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, tb_view *out) {
    memset(out, 0, sizeof *out);
    TB_TRY(tb_op_check_attrs(n));
    tb_op_shape sh;
    TB_TRY(tb_op_infer_views(n, in, n_in, &sh));
    out->dtype = sh.dtype[0];
    out->rank = sh.rank[0];
    memcpy(out->dims, sh.dims[0], sizeof out->dims);
    size_t bytes = (size_t)tb_view_numel(out) * tb_dtype_size(out->dtype);
    out->data = malloc(bytes ? bytes : 1);
    memset(out->data, 0xA5, bytes); /* garbage: kernels must write every element */
    if (ctx) return tb_cpu_nn_run(ctx, n, in, n_in, out, 1);
    return tb_op_get_def(n->op)->ref(n, in, n_in, out, 1);
}

static int same_dims(const tb_view *v, int rank, const int64_t *dims) {
    if (v->rank != rank) return 0;
    for (int d = 0; d < rank; d++) if (v->dims[d] != dims[d]) return 0;
    return 1;
}

/* float results within rtol |want| + atol */
static int close_f(const float *got, const double *want, int n, double rtol, double atol) {
    int ok = 1;
    for (int i = 0; i < n; i++) {
        if ((double)got[i] == want[i]) continue;
        double e = fabs(got[i] - want[i]);
        if (!(e <= rtol * fabs(want[i]) + atol) && !(isnan(want[i]) && isnan(got[i]))) {
            fprintf(stderr, "  [%d] got %.9g want %.9g\n", i, got[i], want[i]);
            ok = 0;
        }
    }
    return ok;
}

/* runs n on the reference and checks an f32 result */
#define CHECK_REF_F(node, in, n_in, rank_, dims_, want, rtol, atol)                                    \
    do {                                                                                             \
        tb_view o_;                                                                                  \
        tb_node nd_ = (node);                                                                        \
        tb_status s_ = run(NULL, &nd_, in, n_in, &o_);                                               \
        CHECK_MSG(s_ == TB_OK, "%s: %s", tb_op_name(nd_.op), tb_last_error());                    \
        if (s_ == TB_OK) {                                                                           \
            int nn_ = (int)tb_view_numel(&o_);                                                       \
            CHECK_MSG(same_dims(&o_, rank_, dims_) && o_.dtype == TB_F32, "%s: shape", tb_op_name(nd_.op)); \
            CHECK_MSG(close_f(o_.data, want, nn_, rtol, atol), "%s: values", tb_op_name(nd_.op));  \
        }                                                                                            \
        free(o_.data);                                                                               \
    } while (0)

/* runs n on the reference and compares raw bytes */
#define CHECK_REF_BYTES(node, in, n_in, dt, rank_, dims_, want, nbytes)                                \
    do {                                                                                             \
        tb_view o_;                                                                                  \
        tb_node nd_ = (node);                                                                        \
        tb_status s_ = run(NULL, &nd_, in, n_in, &o_);                                               \
        CHECK_MSG(s_ == TB_OK, "%s: %s", tb_op_name(nd_.op), tb_last_error());                    \
        if (s_ == TB_OK) {                                                                           \
            CHECK_MSG(same_dims(&o_, rank_, dims_) && o_.dtype == (dt), "%s: shape/dtype", tb_op_name(nd_.op)); \
            CHECK_MSG(!memcmp(o_.data, want, nbytes), "%s: values", tb_op_name(nd_.op));          \
        }                                                                                            \
        free(o_.data);                                                                               \
    } while (0)

/* ================================================================ schema */

static const tb_op_kind group[] = {
    TB_OP_RELU, TB_OP_SIGMOID, TB_OP_TANH, TB_OP_EXP, TB_OP_LOG, TB_OP_NEG, TB_OP_ABS, TB_OP_SQRT,
    TB_OP_RECIPROCAL, TB_OP_ERF, TB_OP_FLOOR, TB_OP_CEIL, TB_OP_NOT, TB_OP_IDENTITY, TB_OP_CLIP, TB_OP_CAST,
    TB_OP_GELU, TB_OP_NN_ADD, TB_OP_SUB, TB_OP_MUL, TB_OP_DIV, TB_OP_POW, TB_OP_EQUAL, TB_OP_LESS,
    TB_OP_LESS_OR_EQUAL, TB_OP_GREATER, TB_OP_GREATER_OR_EQUAL, TB_OP_AND, TB_OP_OR, TB_OP_WHERE, TB_OP_SOFTMAX,
    TB_OP_LAYERNORM, TB_OP_BATCHNORM, TB_OP_REDUCE_MEAN, TB_OP_REDUCE_SUM, TB_OP_REDUCE_MAX,
};
#define N_GROUP ((int)(sizeof group / sizeof group[0]))

static int attr_ok(tb_node n) { return tb_op_check_attrs(&n) == TB_OK; }

static void test_schema(void) {
    for (int g = 0; g < N_GROUP; g++) {
        tb_op_kind k = group[g];
        const tb_op_def *d = tb_nn_elem_def(k);
        CHECK_MSG(d && d == tb_op_get_def(k), "op %d: no definition", (int)k);
        if (!d) continue;
        CHECK_MSG(!strcmp(d->name, tb_nn_onnx_name(k)) && tb_nn_from_onnx(d->name) == (int)k, "%s: ONNX name", d->name);
        CHECK_MSG(d->infer && d->ref && !d->shape && d->signature && d->signature[0], "%s: rule, kernel", d->name);
        CHECK_MSG(attr_ok(N(k)), "%s: zero attributes are valid", d->name);
        tb_node n = N(k);
        n.i[TB_NODE_INTS - 1] = 1; /* no op here uses the last slot */
        CHECK_MSG(!attr_ok(n), "%s: an undefined slot is refused", d->name);
    }
    CHECK(tb_nn_elem_def(TB_OP_RESHAPE) == NULL && tb_nn_elem_def(TB_OP_EMBEDDING) == NULL);
    CHECK(tb_nn_elem_def(TB_OP_CLIP)->host_inputs == 6 && tb_nn_elem_def(TB_OP_REDUCE_SUM)->host_inputs == 2);
    CHECK(tb_nn_elem_def(TB_OP_NN_ADD)->host_inputs == 0 && tb_nn_elem_def(TB_OP_CLIP)->max_in == 3);
    tb_node n = N(TB_OP_SOFTMAX);
    n.i[0] = TB_MAX_RANK - 1;
    CHECK(attr_ok(n));
    n.i[0] = TB_MAX_RANK;
    CHECK(!attr_ok(n) && strstr(tb_last_error(), "axis"));
    n = N(TB_OP_LAYERNORM);
    n.f[0] = 1e-5f;
    CHECK(attr_ok(n));
    n.f[0] = -1e-5f;
    CHECK(!attr_ok(n) && strstr(tb_last_error(), "epsilon"));
    n.f[0] = 2;
    CHECK(!attr_ok(n));
    n.f[0] = 1e-5f;
    n.i[1] = 3; /* y, mean, inv_std_dev */
    CHECK(attr_ok(n));
    n.i[1] = 4;
    CHECK(!attr_ok(n) && strstr(tb_last_error(), "outputs"));
    CHECK(tb_op_get_def(TB_OP_LAYERNORM)->max_out == 3);
    n = N(TB_OP_BATCHNORM);
    n.f[0] = NAN;
    CHECK(!attr_ok(n));
    n.f[1] = 1;
    n.f[0] = 0;
    CHECK(!attr_ok(n));
    n = N(TB_OP_CAST);
    n.i[0] = TB_DTYPE_COUNT;
    CHECK(!attr_ok(n) && strstr(tb_last_error(), "to"));
    n = N(TB_OP_GELU);
    n.i[0] = 2;
    CHECK(!attr_ok(n));
    n = N(TB_OP_REDUCE_MAX);
    n.i[0] = 1; n.i[1] = 0xff; n.i[2] = 1;
    CHECK(attr_ok(n));
    n.i[1] = 0x100;
    CHECK(!attr_ok(n));
    n.i[1] = 0; n.i[0] = 2;
    CHECK(!attr_ok(n) && strstr(tb_last_error(), "keepdims"));
    n = N(TB_OP_NN_ADD);
    n.f[0] = 1;
    CHECK(!attr_ok(n));
}

/* ================================================================ shape rules */

static tb_status infer1(tb_node n, const tb_view *in, int n_in, tb_op_shape *sh) {
    return tb_op_infer_views(&n, in, n_in, sh);
}

#define S0 TB_SYM(0)
#define S1 TB_SYM(1)
#define DYN TB_DIM_DYN

static int shape_is(const tb_op_shape *sh, tb_dtype dt, int rank, const int64_t *dims) {
    if (sh->n_out != 1 || sh->dtype[0] != dt || sh->rank[0] != rank) return 0;
    for (int d = 0; d < rank; d++) if (sh->dims[0][d] != dims[d]) return 0;
    return 1;
}

static void test_shapes(void) {
    tb_op_shape sh;
    tb_view in[5];
    /* broadcasting, symbols and unknown dims */
    in[0] = V(TB_F32, 3, D(2, 3, 4), NULL);
    in[1] = V(TB_F32, 1, D(4), NULL);
    CHECK(infer1(N(TB_OP_NN_ADD), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(2, 3, 4)));
    in[0] = V(TB_F32, 3, D(S0, 1, 768), NULL);
    in[1] = V(TB_F32, 1, D(768), NULL);
    CHECK(infer1(N(TB_OP_MUL), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(S0, 1, 768)));
    in[1] = V(TB_F32, 2, D(5, 1), NULL);
    CHECK(infer1(N(TB_OP_SUB), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(S0, 5, 768)));
    in[0] = V(TB_F32, 2, D(S0, 4), NULL);
    in[1] = V(TB_F32, 2, D(S1, 4), NULL);
    CHECK(infer1(N(TB_OP_NN_ADD), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 2, D(DYN, 4)));
    in[1] = V(TB_F32, 2, D(S0, 1), NULL);
    CHECK(infer1(N(TB_OP_DIV), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 2, D(S0, 4)));
    in[0] = V(TB_F32, 2, D(DYN, 3), NULL);
    in[1] = V(TB_F32, 2, D(2, 3), NULL);
    CHECK(infer1(N(TB_OP_NN_ADD), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 2, D(2, 3)));
    in[0] = V(TB_F32, 0, NULL, NULL); /* a scalar */
    CHECK(infer1(N(TB_OP_POW), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 2, D(2, 3)));
    in[0] = V(TB_F32, 2, D(4, 3), NULL);
    CHECK(infer1(N(TB_OP_NN_ADD), in, 2, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "Add"));
    in[0] = V(TB_I64, 2, D(2, 3), NULL);
    CHECK(infer1(N(TB_OP_NN_ADD), in, 2, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "dtypes"));
    in[1] = V(TB_I64, 1, D(3), NULL);
    CHECK(infer1(N(TB_OP_NN_ADD), in, 2, &sh) == TB_OK && shape_is(&sh, TB_I64, 2, D(2, 3)));
    CHECK(infer1(N(TB_OP_LESS), in, 2, &sh) == TB_OK && shape_is(&sh, TB_BOOL, 2, D(2, 3)));
    CHECK(infer1(N(TB_OP_AND), in, 2, &sh) == TB_ERR_FORMAT);
    in[0] = V(TB_F32, 1, D(3), NULL); /* Pow: f32 base, i64 exponent */
    CHECK(infer1(N(TB_OP_POW), in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 1, D(3)));
    in[0] = V(TB_BOOL, 2, D(S0, 1), NULL);
    in[1] = V(TB_BOOL, 1, D(7), NULL);
    CHECK(infer1(N(TB_OP_OR), in, 2, &sh) == TB_OK && shape_is(&sh, TB_BOOL, 2, D(S0, 7)));
    CHECK(infer1(N(TB_OP_EQUAL), in, 2, &sh) == TB_OK && shape_is(&sh, TB_BOOL, 2, D(S0, 7)));
    CHECK(infer1(N(TB_OP_LESS), in, 2, &sh) == TB_ERR_FORMAT);
    /* Where: three-way */
    in[0] = V(TB_BOOL, 2, D(1, 4), NULL);
    in[1] = V(TB_I64, 2, D(3, 1), NULL);
    in[2] = V(TB_I64, 0, NULL, NULL);
    CHECK(infer1(N(TB_OP_WHERE), in, 3, &sh) == TB_OK && shape_is(&sh, TB_I64, 2, D(3, 4)));
    in[2] = V(TB_F32, 0, NULL, NULL);
    CHECK(infer1(N(TB_OP_WHERE), in, 3, &sh) == TB_ERR_FORMAT);
    in[2] = V(TB_I64, 1, D(5), NULL);
    CHECK(infer1(N(TB_OP_WHERE), in, 3, &sh) == TB_ERR_FORMAT);
    in[0] = V(TB_F32, 2, D(1, 4), NULL);
    in[2] = V(TB_I64, 0, NULL, NULL);
    CHECK(infer1(N(TB_OP_WHERE), in, 3, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "cond"));

    /* unary dtypes */
    in[0] = V(TB_F32, 3, D(S0, DYN, 2), NULL);
    for (int g = 0; g < 17; g++) {
        tb_op_kind k = group[g];
        if (k == TB_OP_NOT || k == TB_OP_CAST) continue;
        CHECK_MSG(infer1(N(k), in, 1, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(S0, DYN, 2)), "%s", tb_op_name(k));
    }
    CHECK(infer1(N(TB_OP_NOT), in, 1, &sh) == TB_ERR_FORMAT);
    in[0] = V(TB_I64, 1, D(5), NULL);
    CHECK(infer1(N(TB_OP_EXP), in, 1, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "Exp"));
    CHECK(infer1(N(TB_OP_NEG), in, 1, &sh) == TB_OK && shape_is(&sh, TB_I64, 1, D(5)));
    in[0] = V(TB_BOOL, 1, D(5), NULL);
    CHECK(infer1(N(TB_OP_NOT), in, 1, &sh) == TB_OK && shape_is(&sh, TB_BOOL, 1, D(5)));
    CHECK(infer1(N(TB_OP_RELU), in, 1, &sh) == TB_ERR_FORMAT);
    /* Clip: scalar bounds, optional */
    in[0] = V(TB_F32, 2, D(S0, 3), NULL);
    in[1] = V(TB_F32, 0, NULL, NULL);
    in[2] = V(TB_F32, 1, D(1), NULL);
    CHECK(infer1(N(TB_OP_CLIP), in, 3, &sh) == TB_OK && shape_is(&sh, TB_F32, 2, D(S0, 3)));
    CHECK(infer1(N(TB_OP_CLIP), in, 2, &sh) == TB_OK);
    in[2] = V(TB_F32, 1, D(2), NULL);
    CHECK(infer1(N(TB_OP_CLIP), in, 3, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "max"));
    in[2] = V(TB_F32, 1, D(S1), NULL); /* unknown: allowed */
    CHECK(infer1(N(TB_OP_CLIP), in, 3, &sh) == TB_OK);
    /* Cast */
    tb_node c = N(TB_OP_CAST);
    c.i[0] = TB_I64;
    CHECK(infer1(c, in, 1, &sh) == TB_OK && shape_is(&sh, TB_I64, 2, D(S0, 3)));
    c.i[0] = TB_I4;
    CHECK(infer1(c, in, 1, &sh) == TB_ERR_FORMAT);
    /* Softmax */
    tb_node sm = N(TB_OP_SOFTMAX);
    sm.i[0] = 1;
    CHECK(infer1(sm, in, 1, &sh) == TB_OK && shape_is(&sh, TB_F32, 2, D(S0, 3)));
    sm.i[0] = 2;
    CHECK(infer1(sm, in, 1, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "axis"));
    /* LayerNormalization: scale over [axis, rank) */
    tb_node ln = N(TB_OP_LAYERNORM);
    ln.i[0] = 2;
    in[0] = V(TB_F32, 3, D(S0, 5, 768), NULL);
    in[1] = V(TB_F32, 1, D(768), NULL);
    in[2] = V(TB_F32, 1, D(768), NULL);
    CHECK(infer1(ln, in, 3, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(S0, 5, 768)));
    in[1] = V(TB_F32, 1, D(767), NULL);
    CHECK(infer1(ln, in, 2, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "scale"));
    in[1] = V(TB_F32, 2, D(5, 768), NULL); /* more dims than [axis, rank) */
    CHECK(infer1(ln, in, 2, &sh) == TB_ERR_FORMAT);
    ln.i[0] = 1;
    CHECK(infer1(ln, in, 2, &sh) == TB_OK);
    in[1] = V(TB_F32, 2, D(1, S1), NULL);
    CHECK(infer1(ln, in, 2, &sh) == TB_OK);
    ln.i[0] = 3;
    CHECK(infer1(ln, in, 2, &sh) == TB_ERR_FORMAT);
    /* Mean and InvStdDev: x's dims with [axis, rank) set to 1, f32 */
    ln.i[0] = 1;
    ln.i[1] = 3;
    in[0] = V(TB_F16, 3, D(S0, 5, 768), NULL);
    in[1] = V(TB_F16, 1, D(768), NULL);
    CHECK(infer1(ln, in, 2, &sh) == TB_OK && sh.n_out == 3 && sh.dtype[0] == TB_F16 && sh.dims[0][2] == 768);
    CHECK(sh.dtype[1] == TB_F32 && sh.rank[1] == 3 && sh.dims[1][0] == S0 && sh.dims[1][1] == 1 && sh.dims[1][2] == 1);
    CHECK(sh.dtype[2] == TB_F32 && sh.rank[2] == 3 && sh.dims[2][0] == S0 && sh.dims[2][2] == 1);
    ln.i[1] = 2;
    CHECK(infer1(ln, in, 2, &sh) == TB_OK && sh.n_out == 2);
    ln.i[1] = 0;
    CHECK(infer1(ln, in, 2, &sh) == TB_OK && sh.n_out == 1);
    /* BatchNormalization */
    tb_node bn = N(TB_OP_BATCHNORM);
    in[0] = V(TB_F32, 4, D(S0, 16, 7, 7), NULL);
    for (int k = 1; k < 5; k++) in[k] = V(TB_F32, 1, D(16), NULL);
    CHECK(infer1(bn, in, 5, &sh) == TB_OK && shape_is(&sh, TB_F32, 4, D(S0, 16, 7, 7)));
    in[3] = V(TB_F32, 1, D(15), NULL);
    CHECK(infer1(bn, in, 5, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "mean"));
    in[0] = V(TB_F32, 1, D(16), NULL);
    in[3] = V(TB_F32, 1, D(16), NULL);
    CHECK(infer1(bn, in, 5, &sh) == TB_ERR_FORMAT);

    /* reductions */
    tb_node r = N(TB_OP_REDUCE_MEAN);
    in[0] = V(TB_F32, 3, D(S0, 5, 768), NULL);
    r.i[1] = 4; /* axis 2 */
    CHECK(infer1(r, in, 1, &sh) == TB_OK && shape_is(&sh, TB_F32, 2, D(S0, 5)));
    r.i[0] = 1;
    CHECK(infer1(r, in, 1, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(S0, 5, 1)));
    r.i[1] = 0; /* all axes */
    CHECK(infer1(r, in, 1, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(1, 1, 1)));
    r.i[0] = 0;
    CHECK(infer1(r, in, 1, &sh) == TB_OK && shape_is(&sh, TB_F32, 0, NULL));
    r.i[2] = 1; /* noop */
    CHECK(infer1(r, in, 1, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(S0, 5, 768)));
    r.i[2] = 0;
    r.i[1] = 8;
    CHECK(infer1(r, in, 1, &sh) == TB_ERR_FORMAT);
    r.i[1] = 0;
    int64_t axes[2] = {-1, 0};
    in[1] = V(TB_I64, 1, D(2), axes); /* a constant axes input */
    CHECK(infer1(r, in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 1, D(5)));
    axes[1] = 3;
    CHECK(infer1(r, in, 2, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "axis 3"));
    in[1] = V(TB_I64, 1, D(2), NULL); /* axes known only at run time */
    CHECK(infer1(r, in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 1, D(DYN)));
    r.i[0] = 1;
    in[0] = V(TB_F32, 3, D(S0, 1, 768), NULL);
    CHECK(infer1(r, in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(DYN, 1, DYN)));
    in[1] = V(TB_I64, 1, D(0), NULL);
    CHECK(infer1(r, in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(1, 1, 1)));
    in[1] = V(TB_I64, 1, D(S1), NULL);
    CHECK(infer1(r, in, 2, &sh) == TB_ERR_UNSUPPORTED);
    in[1] = V(TB_I64, 1, D(0), axes);
    r.i[2] = 1;
    CHECK(infer1(r, in, 2, &sh) == TB_OK && shape_is(&sh, TB_F32, 3, D(S0, 1, 768)));
    r.i[1] = 1;
    in[1] = V(TB_I64, 1, D(1), axes);
    CHECK(infer1(r, in, 2, &sh) == TB_ERR_FORMAT && strstr(tb_last_error(), "both"));
    in[0] = V(TB_BOOL, 1, D(3), NULL);
    CHECK(infer1(N(TB_OP_REDUCE_SUM), in, 1, &sh) == TB_ERR_FORMAT);
}

/* the rules are wired into the graph builder */
static void test_graph(void) {
    tb_graph *g = tb_graph_new();
    CHECK(g != NULL);
    if (!g) return;
    int tok = tb_graph_add_sym(g, "tokens", 1, 8, 64);
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 3, D(TB_SYM(tok), 4, 16));
    float *w = calloc(16, sizeof(float)), *b = calloc(16, sizeof(float));
    int sc = tb_graph_add_weight(g, "scale", TB_F32, 1, D(16), w, 1);
    int bi = tb_graph_add_weight(g, "bias", TB_F32, 1, D(16), b, 1);
    int64_t *ax = malloc(sizeof(int64_t));
    ax[0] = -1;
    int axv = tb_graph_add_weight(g, "axes", TB_I64, 1, D(1), ax, 1);
    int32_t ia[TB_NODE_INTS] = {0};
    float fa[TB_NODE_FLOATS] = {0};
    const char *nm[] = {"y"};
    int add = tb_graph_add_node_ex(g, TB_OP_NN_ADD, (const int[]){x, bi}, 2, nm, 1, ia, fa);
    CHECK_MSG(add >= 0, "%s", tb_last_error());
    if (add < 0) { tb_graph_free(g); return; }
    const tb_value *y = &g->values[g->nodes[add].out[0]];
    CHECK(y->rank == 3 && y->dims[0] == TB_SYM(tok) && y->dims[1] == 4 && y->dims[2] == 16 && y->dtype == TB_F32);
    ia[0] = 2;
    fa[0] = 1e-5f;
    nm[0] = "ln";
    int ln = tb_graph_add_node_ex(g, TB_OP_LAYERNORM, (const int[]){y - g->values, sc, bi}, 3, nm, 1, ia, fa);
    CHECK_MSG(ln >= 0, "%s", tb_last_error());
    ia[0] = 0;
    fa[0] = 0;
    nm[0] = "mean";
    int rm = tb_graph_add_node_ex(g, TB_OP_REDUCE_MEAN, (const int[]){x, axv}, 2, nm, 1, ia, fa);
    CHECK_MSG(rm >= 0, "%s", tb_last_error());
    if (rm >= 0) {
        const tb_value *m = &g->values[g->nodes[rm].out[0]];
        CHECK(m->rank == 2 && m->dims[0] == TB_SYM(tok) && m->dims[1] == 4);
    }
    ia[0] = 1;
    nm[0] = "lt";
    int lt = tb_graph_add_node_ex(g, TB_OP_LESS, (const int[]){x, sc}, 2, nm, 1, ia, fa);
    CHECK(lt < 0 && strstr(tb_last_error(), "slot")); /* Less takes no attributes */
    ia[0] = 0;
    lt = tb_graph_add_node_ex(g, TB_OP_LESS, (const int[]){x, sc}, 2, nm, 1, ia, fa);
    CHECK(lt >= 0 && g->values[g->nodes[lt].out[0]].dtype == TB_BOOL);
    int bad = tb_graph_add_node_ex(g, TB_OP_NN_ADD, (const int[]){x, axv}, 2, nm, 1, ia, fa);
    CHECK(bad < 0 && strstr(tb_last_error(), "Add"));
    int v4 = tb_graph_add_value(g, "v4", TB_VAL_INPUT, TB_F32, 1, D(5));
    bad = tb_graph_add_node_ex(g, TB_OP_MUL, (const int[]){x, v4}, 2, nm, 1, ia, fa);
    CHECK(bad < 0 && tb_last_status() == TB_ERR_FORMAT);
    g->inputs[0] = x;
    g->n_inputs = 1;
    g->outputs[0] = g->nodes[ln].out[0];
    g->n_outputs = 1;
    CHECK_MSG(tb_graph_check(g) == TB_OK, "%s", tb_last_error());
    tb_graph_free(g);
}

/* ================================================================ reference kernels */

static void test_ref_unary(void) {
    const float xs[] = {-3.5f, -1.0f, -0.25f, 0.0f, 0.4f, 1.0f, 2.5f, 7.0f};
    const int nx = 8;
    double want[8];
    tb_view in = V(TB_F32, 2, D(2, 4), xs);
#define UNARY_CASE(op, expr, rtol)                        \
    for (int i = 0; i < nx; i++) {                        \
        double x = xs[i];                                 \
        want[i] = (expr);                                 \
    }                                                     \
    CHECK_REF_F(N(op), &in, 1, 2, D(2, 4), want, rtol, 0)
    UNARY_CASE(TB_OP_RELU, x > 0 ? x : 0, 0);
    UNARY_CASE(TB_OP_SIGMOID, 1 / (1 + exp(-x)), 1e-7);
    UNARY_CASE(TB_OP_TANH, tanh(x), 1e-7);
    UNARY_CASE(TB_OP_EXP, exp(x), 1e-7);
    UNARY_CASE(TB_OP_NEG, -x, 0);
    UNARY_CASE(TB_OP_ABS, x < 0 ? -x : x, 0);
    UNARY_CASE(TB_OP_ERF, erf(x), 1e-7);
    UNARY_CASE(TB_OP_FLOOR, floor(x), 0);
    UNARY_CASE(TB_OP_CEIL, ceil(x), 0);
    UNARY_CASE(TB_OP_IDENTITY, x, 0);
    UNARY_CASE(TB_OP_RECIPROCAL, 1 / x, 1e-7);
    UNARY_CASE(TB_OP_GELU, 0.5 * x * (1 + erf(x / sqrt(2.0))), 1e-6);
    tb_node g = N(TB_OP_GELU);
    g.i[0] = 1;
    for (int i = 0; i < nx; i++) {
        double x = xs[i];
        want[i] = 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    }
    CHECK_REF_F(g, &in, 1, 2, D(2, 4), want, 1e-6, 1e-9);
    const float ps[] = {0.25f, 1.0f, 4.0f, 100.0f};
    tb_view pin = V(TB_F32, 1, D(4), ps);
    double wl[] = {log(0.25), 0, log(4.0), log(100.0)}, ws[] = {0.5, 1, 2, 10};
    CHECK_REF_F(N(TB_OP_LOG), &pin, 1, 1, D(4), wl, 1e-7, 0);
    CHECK_REF_F(N(TB_OP_SQRT), &pin, 1, 1, D(4), ws, 0, 0);
    /* special values */
    const float sp[] = {NAN, INFINITY, -INFINITY, -0.0f};
    tb_view spv = V(TB_F32, 1, D(4), sp);
    double wr[] = {NAN, INFINITY, 0, -0.0}, we[] = {NAN, INFINITY, 0, 1}, wt[] = {NAN, 1, -1, 0};
    CHECK_REF_F(N(TB_OP_RELU), &spv, 1, 1, D(4), wr, 0, 0);
    CHECK_REF_F(N(TB_OP_EXP), &spv, 1, 1, D(4), we, 0, 0);
    CHECK_REF_F(N(TB_OP_TANH), &spv, 1, 1, D(4), wt, 0, 0);

    /* integers and bool */
    const int32_t xi[] = {-5, 0, 7, INT32_MIN};
    tb_view iv = V(TB_I32, 1, D(4), xi);
    CHECK_REF_BYTES(N(TB_OP_RELU), &iv, 1, TB_I32, 1, D(4), ((int32_t[]){0, 0, 7, 0}), 16);
    CHECK_REF_BYTES(N(TB_OP_NEG), &iv, 1, TB_I32, 1, D(4), ((int32_t[]){5, 0, -7, INT32_MIN}), 16);
    CHECK_REF_BYTES(N(TB_OP_ABS), &iv, 1, TB_I32, 1, D(4), ((int32_t[]){5, 0, 7, INT32_MIN}), 16);
    const int64_t xl[] = {-9, 3, INT64_MAX};
    tb_view lv = V(TB_I64, 1, D(3), xl);
    CHECK_REF_BYTES(N(TB_OP_NEG), &lv, 1, TB_I64, 1, D(3), ((int64_t[]){9, -3, -INT64_MAX}), 24);
    CHECK_REF_BYTES(N(TB_OP_IDENTITY), &lv, 1, TB_I64, 1, D(3), xl, 24);
    const uint8_t bl[] = {0, 1, 1, 0};
    tb_view bv = V(TB_BOOL, 2, D(2, 2), bl);
    CHECK_REF_BYTES(N(TB_OP_NOT), &bv, 1, TB_BOOL, 2, D(2, 2), ((uint8_t[]){1, 0, 0, 1}), 4);

    /* Clip: bounds absent, given, empty; integers */
    const float cx[] = {-2.0f, 0.5f, 3.0f, NAN};
    tb_view cin[3] = {V(TB_F32, 1, D(4), cx), V(TB_F32, 0, NULL, F32(0.0f)), V(TB_F32, 0, NULL, F32(1.0f))};
    double c3[] = {0, 0.5, 1, NAN}, c2[] = {0, 0.5, 3, NAN}, c1[] = {-2, 0.5, 3, NAN}, cmax[] = {-2, 0.5, 1, NAN};
    CHECK_REF_F(N(TB_OP_CLIP), cin, 3, 1, D(4), c3, 0, 0);
    CHECK_REF_F(N(TB_OP_CLIP), cin, 2, 1, D(4), c2, 0, 0);
    CHECK_REF_F(N(TB_OP_CLIP), cin, 1, 1, D(4), c1, 0, 0);
    cin[1] = V(TB_F32, 1, D(0), NULL); /* min absent, max given */
    CHECK_REF_F(N(TB_OP_CLIP), cin, 3, 1, D(4), cmax, 0, 0);
    cin[1] = V(TB_F32, 0, NULL, F32(2.0f)); /* min > max: every value is max */
    double cmm[] = {1, 1, 1, NAN};
    CHECK_REF_F(N(TB_OP_CLIP), cin, 3, 1, D(4), cmm, 0, 0);
    tb_view ic[3] = {V(TB_I64, 1, D(3), xl), V(TB_I64, 0, NULL, (int64_t[]){-1}), V(TB_I64, 0, NULL, (int64_t[]){5})};
    CHECK_REF_BYTES(N(TB_OP_CLIP), ic, 3, TB_I64, 1, D(3), ((int64_t[]){-1, 3, 5}), 24);

    /* Cast: truncation toward zero, wrap to the width, nonzero to bool */
    const float fx[] = {-1.7f, 2.5f, 300.0f, 0.0f, -0.0f, 65504.0f};
    tb_view fv = V(TB_F32, 1, D(6), fx);
    tb_node c = N(TB_OP_CAST);
    c.i[0] = TB_I32;
    CHECK_REF_BYTES(c, &fv, 1, TB_I32, 1, D(6), ((int32_t[]){-1, 2, 300, 0, 0, 65504}), 24);
    c.i[0] = TB_I64;
    CHECK_REF_BYTES(c, &fv, 1, TB_I64, 1, D(6), ((int64_t[]){-1, 2, 300, 0, 0, 65504}), 48);
    c.i[0] = TB_U8;
    CHECK_REF_BYTES(c, &fv, 1, TB_U8, 1, D(6), ((uint8_t[]){255, 2, 44, 0, 0, 224}), 6);
    c.i[0] = TB_I8;
    CHECK_REF_BYTES(c, &fv, 1, TB_I8, 1, D(6), ((int8_t[]){-1, 2, 44, 0, 0, -32}), 6);
    c.i[0] = TB_BOOL;
    CHECK_REF_BYTES(c, &fv, 1, TB_BOOL, 1, D(6), ((uint8_t[]){1, 1, 1, 0, 0, 1}), 6);
    c.i[0] = TB_F64;
    CHECK_REF_BYTES(c, &fv, 1, TB_F64, 1, D(6), ((double[]){-1.7f, 2.5, 300, 0, -0.0, 65504}), 48);
    c.i[0] = TB_F16; /* f16 bits of -1.7 (rounded), 2.5, 300, 0, -0, 65504 */
    CHECK_REF_BYTES(c, &fv, 1, TB_F16, 1, D(6), ((uint16_t[]){0xBECD, 0x4100, 0x5CB0, 0, 0x8000, 0x7BFF}), 12);
    c.i[0] = TB_BF16; /* -1.7 = 0xBFD9999A rounds to 0xBFDA */
    CHECK_REF_BYTES(c, &fv, 1, TB_BF16, 1, D(6), ((uint16_t[]){0xBFDA, 0x4020, 0x4396, 0, 0x8000, 0x4780}), 12);
    const int64_t cl[] = {-3, 16777217, 1};
    tb_view clv = V(TB_I64, 1, D(3), cl);
    c.i[0] = TB_F32;
    CHECK_REF_BYTES(c, &clv, 1, TB_F32, 1, D(3), ((float[]){-3.0f, 16777216.0f, 1.0f}), 12);
    c.i[0] = TB_I32;
    CHECK_REF_BYTES(c, &clv, 1, TB_I32, 1, D(3), ((int32_t[]){-3, 16777217, 1}), 12);
    const uint16_t hx[] = {0x3C00, 0xC000}; /* f16 1, -2 */
    tb_view hv = V(TB_F16, 1, D(2), hx);
    c.i[0] = TB_F32;
    CHECK_REF_BYTES(c, &hv, 1, TB_F32, 1, D(2), ((float[]){1.0f, -2.0f}), 8);
    c.i[0] = TB_I64;
    CHECK_REF_BYTES(c, &hv, 1, TB_I64, 1, D(2), ((int64_t[]){1, -2}), 16);
    c.i[0] = TB_F32;
    CHECK_REF_BYTES(c, &bv, 1, TB_F32, 2, D(2, 2), ((float[]){0, 1, 1, 0}), 16);
    const double dx[] = {1e300, -2.75};
    tb_view dv = V(TB_F64, 1, D(2), dx);
    CHECK_REF_BYTES(c, &dv, 1, TB_F32, 1, D(2), ((float[]){INFINITY, -2.75f}), 8);
}

static void test_ref_binary(void) {
    const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {10, -20, 0.5f};
    tb_view in[3] = {V(TB_F32, 2, D(2, 3), a), V(TB_F32, 1, D(3), b)};
    double add[] = {11, -18, 3.5, 14, -15, 6.5}, sub[] = {-9, 22, 2.5, -6, 25, 5.5};
    double mul[] = {10, -40, 1.5, 40, -100, 3}, dv[] = {0.1f, -0.1f, 6, 0.4f, -0.25, 12};
    CHECK_REF_F(N(TB_OP_NN_ADD), in, 2, 2, D(2, 3), add, 0, 0);
    CHECK_REF_F(N(TB_OP_SUB), in, 2, 2, D(2, 3), sub, 0, 0);
    CHECK_REF_F(N(TB_OP_MUL), in, 2, 2, D(2, 3), mul, 0, 0);
    CHECK_REF_F(N(TB_OP_DIV), in, 2, 2, D(2, 3), dv, 0, 0);
    /* (2, 1) against (3): an outer product */
    tb_view op[2] = {V(TB_F32, 2, D(2, 1), F32(1, 2)), V(TB_F32, 1, D(3), F32(3, 4, 5))};
    double outer[] = {3, 4, 5, 6, 8, 10};
    CHECK_REF_F(N(TB_OP_MUL), op, 2, 2, D(2, 3), outer, 0, 0);
    /* Pow: float and integer exponents */
    tb_view pw[2] = {V(TB_F32, 1, D(3), F32(2, 4, -3)), V(TB_F32, 1, D(3), F32(3, 0.5f, 2))};
    double pww[] = {8, 2, 9};
    CHECK_REF_F(N(TB_OP_POW), pw, 2, 1, D(3), pww, 1e-7, 0);
    pw[1] = V(TB_I64, 0, NULL, (int64_t[]){3});
    double pwi[] = {8, 64, -27};
    CHECK_REF_F(N(TB_OP_POW), pw, 2, 1, D(3), pwi, 1e-7, 0);
    tb_view ipw[2] = {V(TB_I32, 1, D(3), ((int32_t[]){2, -3, 5})), V(TB_I32, 1, D(3), ((int32_t[]){10, 3, 0}))};
    CHECK_REF_BYTES(N(TB_OP_POW), ipw, 2, TB_I32, 1, D(3), ((int32_t[]){1024, -27, 1}), 12);
    /* integers: wrap, truncating division */
    const int64_t ia[] = {7, -7, 7, -7, INT64_MAX, 5}, ib[] = {2, 2, -2, -2, 1, 0};
    tb_view il[2] = {V(TB_I64, 1, D(6), ia), V(TB_I64, 1, D(6), ib)};
    CHECK_REF_BYTES(N(TB_OP_DIV), il, 2, TB_I64, 1, D(6), ((int64_t[]){3, -3, -3, 3, INT64_MAX, 0}), 48);
    CHECK_REF_BYTES(N(TB_OP_NN_ADD), il, 2, TB_I64, 1, D(6), ((int64_t[]){9, -5, 5, -9, INT64_MIN, 5}), 48);
    CHECK_REF_BYTES(N(TB_OP_MUL), il, 2, TB_I64, 1, D(6), ((int64_t[]){14, -14, -14, 14, INT64_MAX, 0}), 48);
    tb_view i32[2] = {V(TB_I32, 2, D(2, 2), ((int32_t[]){1, 2, 3, 4})), V(TB_I32, 0, NULL, ((int32_t[]){3}))};
    CHECK_REF_BYTES(N(TB_OP_SUB), i32, 2, TB_I32, 2, D(2, 2), ((int32_t[]){-2, -1, 0, 1}), 16);
    CHECK_REF_BYTES(N(TB_OP_DIV), i32, 2, TB_I32, 2, D(2, 2), ((int32_t[]){0, 0, 1, 1}), 16);
    /* comparisons */
    tb_view cf[2] = {V(TB_F32, 1, D(4), F32(1, 2, NAN, 3)), V(TB_F32, 0, NULL, F32(2))};
    CHECK_REF_BYTES(N(TB_OP_EQUAL), cf, 2, TB_BOOL, 1, D(4), ((uint8_t[]){0, 1, 0, 0}), 4);
    CHECK_REF_BYTES(N(TB_OP_LESS), cf, 2, TB_BOOL, 1, D(4), ((uint8_t[]){1, 0, 0, 0}), 4);
    CHECK_REF_BYTES(N(TB_OP_LESS_OR_EQUAL), cf, 2, TB_BOOL, 1, D(4), ((uint8_t[]){1, 1, 0, 0}), 4);
    CHECK_REF_BYTES(N(TB_OP_GREATER), cf, 2, TB_BOOL, 1, D(4), ((uint8_t[]){0, 0, 0, 1}), 4);
    CHECK_REF_BYTES(N(TB_OP_GREATER_OR_EQUAL), cf, 2, TB_BOOL, 1, D(4), ((uint8_t[]){0, 1, 0, 1}), 4);
    tb_view ci[2] = {V(TB_I64, 2, D(2, 1), ((int64_t[]){-1, 5})), V(TB_I64, 1, D(3), ((int64_t[]){-1, 0, 5}))};
    CHECK_REF_BYTES(N(TB_OP_EQUAL), ci, 2, TB_BOOL, 2, D(2, 3), ((uint8_t[]){1, 0, 0, 0, 0, 1}), 6);
    CHECK_REF_BYTES(N(TB_OP_GREATER), ci, 2, TB_BOOL, 2, D(2, 3), ((uint8_t[]){0, 0, 0, 1, 1, 0}), 6);
    tb_view cb[2] = {V(TB_BOOL, 2, D(2, 1), ((uint8_t[]){0, 1})), V(TB_BOOL, 1, D(2), ((uint8_t[]){0, 1}))};
    CHECK_REF_BYTES(N(TB_OP_AND), cb, 2, TB_BOOL, 2, D(2, 2), ((uint8_t[]){0, 0, 0, 1}), 4);
    CHECK_REF_BYTES(N(TB_OP_OR), cb, 2, TB_BOOL, 2, D(2, 2), ((uint8_t[]){0, 1, 1, 1}), 4);
    CHECK_REF_BYTES(N(TB_OP_EQUAL), cb, 2, TB_BOOL, 2, D(2, 2), ((uint8_t[]){1, 0, 0, 1}), 4);
    /* Where over three shapes, two dtypes */
    in[0] = V(TB_BOOL, 2, D(2, 1), ((uint8_t[]){1, 0}));
    in[1] = V(TB_F32, 1, D(3), F32(1, 2, 3));
    in[2] = V(TB_F32, 0, NULL, F32(-1));
    double wh[] = {1, 2, 3, -1, -1, -1};
    CHECK_REF_F(N(TB_OP_WHERE), in, 3, 2, D(2, 3), wh, 0, 0);
    in[0] = V(TB_BOOL, 1, D(3), ((uint8_t[]){0, 1, 0}));
    in[1] = V(TB_I64, 2, D(2, 1), ((int64_t[]){7, 8}));
    in[2] = V(TB_I64, 2, D(2, 3), ((int64_t[]){1, 2, 3, 4, 5, 6}));
    CHECK_REF_BYTES(N(TB_OP_WHERE), in, 3, TB_I64, 2, D(2, 3), ((int64_t[]){1, 7, 3, 4, 8, 6}), 48);
}

static void test_ref_norm(void) {
    /* Softmax along each axis of (2, 3) */
    const float x[] = {1, 2, 3, -1, 0, 5};
    tb_view in[5] = {V(TB_F32, 2, D(2, 3), x)};
    double w[6];
    for (int r = 0; r < 2; r++) {
        double s = 0;
        for (int j = 0; j < 3; j++) s += exp(x[r * 3 + j]);
        for (int j = 0; j < 3; j++) w[r * 3 + j] = exp(x[r * 3 + j]) / s;
    }
    tb_node sm = N(TB_OP_SOFTMAX);
    sm.i[0] = 1;
    CHECK_REF_F(sm, in, 1, 2, D(2, 3), w, 1e-6, 0);
    for (int j = 0; j < 3; j++) {
        double s = exp(x[j]) + exp(x[3 + j]);
        w[j] = exp(x[j]) / s;
        w[3 + j] = exp(x[3 + j]) / s;
    }
    sm.i[0] = 0;
    CHECK_REF_F(sm, in, 1, 2, D(2, 3), w, 1e-6, 0);

    /* LayerNormalization over the last axis, and over both */
    const float sc[] = {1, 2, 0.5f}, bi[] = {0, 1, -1};
    in[1] = V(TB_F32, 1, D(3), sc);
    in[2] = V(TB_F32, 1, D(3), bi);
    tb_node ln = N(TB_OP_LAYERNORM);
    ln.i[0] = 1;
    ln.f[0] = 0.01f;
    for (int r = 0; r < 2; r++) {
        double m = (x[r * 3] + x[r * 3 + 1] + x[r * 3 + 2]) / 3, v = 0;
        for (int j = 0; j < 3; j++) v += (x[r * 3 + j] - m) * (x[r * 3 + j] - m) / 3;
        for (int j = 0; j < 3; j++) w[r * 3 + j] = (x[r * 3 + j] - m) / sqrt(v + (double)0.01f) * sc[j] + bi[j];
    }
    CHECK_REF_F(ln, in, 3, 2, D(2, 3), w, 1e-6, 1e-7);
    ln.i[0] = 0;
    in[1] = V(TB_F32, 1, D(3), sc); /* scale (3) broadcast over (2, 3) */
    {
        double m = 0, v = 0;
        for (int j = 0; j < 6; j++) m += x[j] / 6.0;
        for (int j = 0; j < 6; j++) v += (x[j] - m) * (x[j] - m) / 6;
        for (int j = 0; j < 6; j++) w[j] = (x[j] - m) / sqrt(v + (double)0.01f) * sc[j % 3];
    }
    CHECK_REF_F(ln, in, 2, 2, D(2, 3), w, 1e-6, 1e-7);

    /* BatchNormalization: x (1, 2, 3) */
    const float scale[] = {2, 0.5f}, bias[] = {1, -1}, mean[] = {2, 0}, var[] = {4, 0.25f};
    in[1] = V(TB_F32, 1, D(2), scale);
    in[2] = V(TB_F32, 1, D(2), bias);
    in[3] = V(TB_F32, 1, D(2), mean);
    in[4] = V(TB_F32, 1, D(2), var);
    in[0] = V(TB_F32, 3, D(1, 2, 3), x);
    tb_node bn = N(TB_OP_BATCHNORM);
    double bw[] = {2 * (1 - 2) / 2.0 + 1, 2 * (2 - 2) / 2.0 + 1, 2 * (3 - 2) / 2.0 + 1,
                   0.5 * -1 / 0.5 - 1, 0.5 * 0 / 0.5 - 1, 0.5 * 5 / 0.5 - 1};
    CHECK_REF_F(bn, in, 5, 3, D(1, 2, 3), bw, 1e-7, 0);
    bn.f[0] = 0.5f;
    for (int j = 0; j < 6; j++) {
        int ch = j / 3;
        bw[j] = scale[ch] * (x[j] - mean[ch]) / sqrt(var[ch] + 0.5) + bias[ch];
    }
    CHECK_REF_F(bn, in, 5, 3, D(1, 2, 3), bw, 1e-7, 0);

    /* reductions of (2, 3) */
    tb_view rx = V(TB_F32, 2, D(2, 3), x);
    tb_node r = N(TB_OP_REDUCE_SUM);
    r.i[1] = 2;
    CHECK_REF_F(r, &rx, 1, 1, D(2), ((double[]){6, 4}), 0, 0);
    r.op = TB_OP_REDUCE_MEAN;
    CHECK_REF_F(r, &rx, 1, 1, D(2), ((double[]){2, 4.0 / 3}), 1e-7, 0);
    r.op = TB_OP_REDUCE_MAX;
    r.i[0] = 1;
    CHECK_REF_F(r, &rx, 1, 2, D(2, 1), ((double[]){3, 5}), 0, 0);
    r.i[1] = 1;
    CHECK_REF_F(r, &rx, 1, 2, D(1, 3), ((double[]){1, 2, 5}), 0, 0);
    r.i[1] = 0; /* all axes */
    CHECK_REF_F(r, &rx, 1, 2, D(1, 1), ((double[]){5}), 0, 0);
    r.i[2] = 1; /* noop */
    CHECK_REF_F(r, &rx, 1, 2, D(2, 3), ((double[]){1, 2, 3, -1, 0, 5}), 0, 0);
    tb_view ra[2] = {rx, V(TB_I64, 1, D(1), ((int64_t[]){-2}))};
    r.op = TB_OP_REDUCE_MEAN;
    r.i[0] = 0;
    r.i[2] = 0;
    CHECK_REF_F(r, ra, 2, 1, D(3), ((double[]){0, 1, 4}), 1e-7, 0);
    ra[1] = V(TB_I64, 1, D(0), NULL); /* empty axes: all, or none with noop */
    CHECK_REF_F(r, ra, 2, 0, NULL, ((double[]){10.0 / 6}), 1e-7, 0);
    r.i[2] = 1;
    CHECK_REF_F(r, ra, 2, 2, D(2, 3), ((double[]){1, 2, 3, -1, 0, 5}), 0, 0);
    /* NaN wins in ReduceMax, an empty ReduceSum is 0 */
    tb_view rn = V(TB_F32, 2, D(2, 2), F32(1, NAN, NAN, -2));
    r = N(TB_OP_REDUCE_MAX);
    r.i[1] = 2;
    CHECK_REF_F(r, &rn, 1, 1, D(2), ((double[]){NAN, NAN}), 0, 0);
    tb_view re = V(TB_F32, 2, D(2, 0), NULL);
    r.op = TB_OP_REDUCE_SUM;
    CHECK_REF_F(r, &re, 1, 1, D(2), ((double[]){0, 0}), 0, 0);
    /* i64 ReduceSum over axis 0 of (3, 2) */
    tb_view rl = V(TB_I64, 2, D(3, 2), ((int64_t[]){1, 2, 3, 4, 5, -6}));
    r.i[1] = 1;
    CHECK_REF_BYTES(r, &rl, 1, TB_I64, 1, D(2), ((int64_t[]){9, 0}), 16);
    r.op = TB_OP_REDUCE_MAX;
    CHECK_REF_BYTES(r, &rl, 1, TB_I64, 1, D(2), ((int64_t[]){5, 4}), 16);
    /* a middle axis of (2, 3, 2) */
    const float x3[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    tb_view r3 = V(TB_F32, 3, D(2, 3, 2), x3);
    r = N(TB_OP_REDUCE_SUM);
    r.i[1] = 2;
    r.i[0] = 1;
    CHECK_REF_F(r, &r3, 1, 3, D(2, 1, 2), ((double[]){6, 9, 24, 27}), 0, 0);
    r.i[1] = 5; /* axes 0 and 2 */
    CHECK_REF_F(r, &r3, 1, 3, D(1, 3, 1), ((double[]){14, 22, 30}), 0, 0);
}

/* ================================================================ fast kernels against the reference */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float *rand_buf(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * 0.5f * (tb_test_frand(&rng) + 1.0f);
    return p;
}

/* Runs n on the reference and on the CPU dispatch; compares f32 outputs
 * within rtol |ref| + atol (NaN where the reference has NaN). Returns the
 * largest error relative to that bound (<= 1 passes). */
static double vs_ref(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, double rtol, double atol,
                     const char *what) {
    tb_view r, f;
    tb_status sr = run(NULL, n, in, n_in, &r), sf = run(ctx, n, in, n_in, &f);
    CHECK_MSG(sr == TB_OK && sf == TB_OK, "%s %s: %s", tb_op_name(n->op), what, tb_last_error());
    double worst = 0;
    if (sr == TB_OK && sf == TB_OK) {
        int64_t cnt = tb_view_numel(&r), bad = -1;
        const float *a = f.data, *b = r.data;
        for (int64_t i = 0; i < cnt; i++) {
            if (isnan(b[i]) || isnan(a[i])) {
                if (isnan(b[i]) != isnan(a[i]) && bad < 0) bad = i;
                continue;
            }
            if (a[i] == b[i]) continue;
            double e = fabs((double)a[i] - b[i]), bound = rtol * fabs(b[i]) + atol;
            double q = bound > 0 ? e / bound : INFINITY;
            if (q > worst) worst = q;
            if (q > 1 && bad < 0) bad = i;
        }
        CHECK_MSG(bad < 0, "%s %s: element %lld: fast %.9g ref %.9g (rtol %g atol %g)", tb_op_name(n->op), what,
                  (long long)bad, bad >= 0 ? a[bad] : 0, bad >= 0 ? b[bad] : 0, rtol, atol);
    }
    free(r.data);
    free(f.data);
    return worst;
}

static const int64_t sizes[] = {1, 7, 33, 1000003};

static void test_fast_unary(tb_cpu_nn_ctx *ctx) {
    static const struct {
        tb_op_kind op;
        int attr;
        float lo, hi;
        double rtol, atol;
    } cases[] = {
        {TB_OP_RELU, 0, -10, 10, 0, 0},
        {TB_OP_EXP, 0, -88, 88, 3e-7, 0},
        {TB_OP_EXP, 0, -110, 95, 3e-7, 1e-44}, /* under- and overflow */
        {TB_OP_SIGMOID, 0, -100, 100, 4e-7, 1e-44},
        {TB_OP_TANH, 0, -1, 1, 3e-7, 0},
        {TB_OP_TANH, 0, -12, 12, 3e-7, 0},
        {TB_OP_ERF, 0, -0.7f, 0.7f, 5e-7, 0},
        {TB_OP_ERF, 0, -6, 6, 5e-7, 2e-7},
        {TB_OP_GELU, 0, -1.5f, 1.5f, 1e-6, 0},
        {TB_OP_GELU, 0, -10, 10, 1e-6, 0},
        {TB_OP_GELU, 0, -20, 20, 1e-6, 1e-30},
        {TB_OP_GELU, 1, -3, 3, 5e-7, 0},
        {TB_OP_GELU, 1, -12, 12, 5e-7, 1e-38},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tb_node n = N(cases[c].op);
        n.i[0] = cases[c].attr;
        double worst = 0;
        for (int s = 0; s < 4; s++) {
            float *x = rand_buf(sizes[s], cases[c].lo, cases[c].hi);
            tb_view in = V(TB_F32, 1, D(sizes[s]), x);
            char what[64];
            snprintf(what, sizeof what, "(%lld) in [%g, %g]", (long long)sizes[s], cases[c].lo, cases[c].hi);
            double q = vs_ref(ctx, &n, &in, 1, cases[c].rtol, cases[c].atol, what);
            if (q > worst) worst = q;
            free(x);
        }
        printf("  %-8s%s in [%6g, %6g]: max error %.2f of the bound (rtol %g, atol %g)\n", tb_op_name(cases[c].op),
               cases[c].op == TB_OP_GELU ? (cases[c].attr ? "/tanh" : "/erf ") : "     ", cases[c].lo, cases[c].hi,
               worst, cases[c].rtol, cases[c].atol);
    }
    /* special values in every lane position */
    const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, FLT_MIN, -FLT_MAX, 1e-30f, -1e-30f, 0.49999997f, 0.5f,
                        0.625f, -0.62499994f, 88.72f, -87.5f, 3e-39f, 9.5f};
    tb_view in = V(TB_F32, 1, D(17), sp);
    const tb_op_kind ops[] = {TB_OP_RELU, TB_OP_EXP, TB_OP_SIGMOID, TB_OP_TANH, TB_OP_ERF, TB_OP_GELU};
    for (int k = 0; k < 6; k++) {
        tb_node n = N(ops[k]);
        vs_ref(ctx, &n, &in, 1, 1e-6, 1e-38, "special values");
        n.i[0] = 1;
        if (ops[k] == TB_OP_GELU) vs_ref(ctx, &n, &in, 1, 1e-6, 1e-38, "special values");
    }
    /* Clip: bit-exact, bounds absent, given, crossed */
    float *cx = rand_buf(1000003, -10, 10);
    cx[5] = NAN;
    cx[6] = -0.0f;
    for (int s = 0; s < 4; s++) {
        tb_view cin[3] = {V(TB_F32, 1, D(sizes[s]), cx), V(TB_F32, 0, NULL, F32(0.0f)), V(TB_F32, 1, D(1), F32(6.0f))};
        tb_node n = N(TB_OP_CLIP);
        for (int k = 1; k <= 3; k++) vs_ref(ctx, &n, cin, k, 0, 0, "Relu6");
        cin[1] = V(TB_F32, 1, D(0), NULL);
        vs_ref(ctx, &n, cin, 3, 0, 0, "max only");
        cin[1] = V(TB_F32, 0, NULL, F32(7.0f));
        vs_ref(ctx, &n, cin, 3, 0, 0, "min > max");
        cin[1] = V(TB_F64, 0, NULL, ((double[]){-1.5}));
        vs_ref(ctx, &n, cin, 3, 0, 0, "f64 min");
    }
    free(cx);
    /* other dtypes go to the reference */
    int64_t xl[] = {-3, 4};
    tb_view lv = V(TB_I64, 1, D(2), xl);
    tb_view o;
    tb_node n = N(TB_OP_RELU);
    CHECK(run(ctx, &n, &lv, 1, &o) == TB_OK && ((int64_t *)o.data)[0] == 0 && ((int64_t *)o.data)[1] == 4);
    free(o.data);
}

static void test_fast_binary(tb_cpu_nn_ctx *ctx) {
    static const struct {
        int ra, rb;
        int64_t a[4], b[4];
    } shapes[] = {
        {1, 1, {1000003}, {1000003}},
        {1, 1, {7}, {1}},
        {1, 1, {1}, {33}},
        {0, 1, {0}, {7}},
        {3, 1, {3, 1000, 33}, {33}},
        {2, 1, {1031, 768}, {768}},
        {1, 2, {768}, {1031, 768}},
        {3, 2, {5, 7, 33}, {7, 1}},
        {3, 3, {4, 1, 9}, {1, 6, 1}},
        {4, 3, {2, 64, 1, 1}, {64, 31, 31}},
        {4, 4, {2, 3, 40, 41}, {1, 3, 1, 1}},
        {2, 2, {1, 1}, {1, 1}},
        {2, 2, {3, 0}, {1, 1}},
    };
    const tb_op_kind ops[] = {TB_OP_NN_ADD, TB_OP_SUB, TB_OP_MUL, TB_OP_DIV};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t na = 1, nb = 1;
        for (int d = 0; d < shapes[s].ra; d++) na *= shapes[s].a[d];
        for (int d = 0; d < shapes[s].rb; d++) nb *= shapes[s].b[d];
        float *a = rand_buf(na, -4, 4), *b = rand_buf(nb, -4, 4);
        if (nb > 2) b[2] = 0; /* x / 0 */
        if (na > 3) a[3] = NAN;
        tb_view in[2] = {V(TB_F32, shapes[s].ra, shapes[s].a, a), V(TB_F32, shapes[s].rb, shapes[s].b, b)};
        char what[64];
        snprintf(what, sizeof what, "shape case %d", (int)s);
        for (int k = 0; k < 4; k++) {
            tb_node n = N(ops[k]);
            vs_ref(ctx, &n, in, 2, 0, 0, what); /* bit-exact */
        }
        free(a);
        free(b);
    }
    /* i64 goes to the reference */
    tb_view il[2] = {V(TB_I64, 1, D(2), ((int64_t[]){7, -7})), V(TB_I64, 0, NULL, ((int64_t[]){2}))};
    tb_view o;
    tb_node n = N(TB_OP_DIV);
    CHECK(run(ctx, &n, il, 2, &o) == TB_OK && ((int64_t *)o.data)[0] == 3 && ((int64_t *)o.data)[1] == -3);
    free(o.data);
}

static void test_fast_norm(tb_cpu_nn_ctx *ctx) {
    /* Softmax: last axis (fast), another axis (reference) */
    static const int64_t sm_shapes[][3] = {{1, 1, 1}, {1, 7, 33}, {2, 500, 1003}, {1, 3, 100000}, {1, 1, 7}};
    for (int s = 0; s < 5; s++) {
        int64_t cnt = sm_shapes[s][0] * sm_shapes[s][1] * sm_shapes[s][2];
        float *x = rand_buf(cnt, -30, 30);
        tb_view in = V(TB_F32, 3, sm_shapes[s], x);
        tb_node n = N(TB_OP_SOFTMAX);
        n.i[0] = 2;
        double q = vs_ref(ctx, &n, &in, 1, 1e-6, 1e-37, "last axis");
        n.i[0] = 1;
        vs_ref(ctx, &n, &in, 1, 1e-6, 1e-37, "axis 1");
        if (s == 2) printf("  Softmax (2, 500, 1003): max error %.2f of the bound (rtol 1e-6)\n", q);
        free(x);
    }
    /* LayerNormalization */
    static const struct {
        int rank, axis;
        int64_t x[3];
        float offset;
        int bias;
    } ln_cases[] = {
        {2, 1, {1, 7}, 0, 1},    {2, 1, {33, 768}, 0, 1}, {2, 1, {1024, 768}, 0, 0}, {3, 2, {2, 3, 1}, 0, 1},
        {3, 1, {4, 3, 5}, 0, 1}, {2, 1, {64, 1003}, 100, 1}, {3, 0, {3, 33, 33}, -5, 1},
    };
    for (size_t c = 0; c < sizeof ln_cases / sizeof ln_cases[0]; c++) {
        int64_t cnt = 1, Dn = 1;
        for (int d = 0; d < ln_cases[c].rank; d++) cnt *= ln_cases[c].x[d];
        for (int d = ln_cases[c].axis; d < ln_cases[c].rank; d++) Dn *= ln_cases[c].x[d];
        float *x = rand_buf(cnt, ln_cases[c].offset - 2, ln_cases[c].offset + 2);
        float *sc = rand_buf(Dn, -2, 2), *bi = rand_buf(Dn, -1, 1);
        tb_view in[3] = {V(TB_F32, ln_cases[c].rank, ln_cases[c].x, x),
                         V(TB_F32, ln_cases[c].rank - ln_cases[c].axis, ln_cases[c].x + ln_cases[c].axis, sc),
                         V(TB_F32, ln_cases[c].rank - ln_cases[c].axis, ln_cases[c].x + ln_cases[c].axis, bi)};
        tb_node n = N(TB_OP_LAYERNORM);
        n.i[0] = ln_cases[c].axis;
        n.f[0] = 1e-5f;
        char what[64];
        snprintf(what, sizeof what, "case %d", (int)c);
        double q = vs_ref(ctx, &n, in, 2 + ln_cases[c].bias, 1e-6, 1e-6, what);
        if (c == 5) printf("  LayerNormalization (64, 1003), mean 100: max error %.2f of the bound (1e-6 (1 + |y|))\n", q);
        free(x);
        free(sc);
        free(bi);
    }
    /* Mean and InvStdDev outputs: the CPU dispatch (the reference) writes all three */
    {
        const float x[] = {1, 2, 3, 4, 10, -2}, sc[] = {1, 1, 1}, bi[] = {0, 0, 0};
        tb_view in[3] = {V(TB_F32, 2, D(2, 3), x), V(TB_F32, 1, D(3), sc), V(TB_F32, 1, D(3), bi)};
        float y[6], mean[2], rstd[2];
        tb_view out[3] = {V(TB_F32, 2, D(2, 3), y), V(TB_F32, 2, D(2, 1), mean), V(TB_F32, 2, D(2, 1), rstd)};
        tb_node n = N(TB_OP_LAYERNORM);
        n.i[0] = 1;
        n.i[1] = 3;
        n.f[0] = 1e-5f;
        CHECK(tb_cpu_nn_run(ctx, &n, in, 3, out, 3) == TB_OK);
        for (int r = 0; r < 2; r++) {
            double m = (x[3 * r] + x[3 * r + 1] + x[3 * r + 2]) / 3, v = 0;
            for (int j = 0; j < 3; j++) v += (x[3 * r + j] - m) * (x[3 * r + j] - m) / 3;
            double rs = 1 / sqrt(v + (double)1e-5f);
            CHECK(fabs(mean[r] - m) <= 1e-6 * fabs(m) && fabs(rstd[r] - rs) <= 1e-6 * rs);
            for (int j = 0; j < 3; j++) CHECK(fabs(y[3 * r + j] - (x[3 * r + j] - m) * rs) <= 1e-6);
        }
    }
    /* a broadcast scale goes to the reference */
    {
        float *x = rand_buf(6 * 5, -1, 1);
        tb_view in[2] = {V(TB_F32, 2, D(6, 5), x), V(TB_F32, 1, D(1), F32(2))};
        tb_node n = N(TB_OP_LAYERNORM);
        n.i[0] = 1;
        vs_ref(ctx, &n, in, 2, 1e-6, 1e-6, "scalar scale");
        free(x);
    }
    /* BatchNormalization */
    static const struct {
        int rank;
        int64_t x[4];
    } bn_cases[] = {{4, {2, 3, 7, 33}}, {3, {1, 64, 1000}}, {2, {5, 2, 1, 1}}, {4, {2, 16, 181, 181}}, {3, {1, 1, 7}}};
    for (size_t c = 0; c < sizeof bn_cases / sizeof bn_cases[0]; c++) {
        int64_t cnt = 1, C = bn_cases[c].x[1];
        for (int d = 0; d < bn_cases[c].rank; d++) cnt *= bn_cases[c].x[d];
        float *x = rand_buf(cnt, -3, 3), *p[4];
        for (int k = 0; k < 4; k++) p[k] = rand_buf(C, k == 3 ? 0.1f : -1, 2);
        tb_view in[5] = {V(TB_F32, bn_cases[c].rank, bn_cases[c].x, x)};
        for (int k = 0; k < 4; k++) in[k + 1] = V(TB_F32, 1, D(C), p[k]);
        tb_node n = N(TB_OP_BATCHNORM);
        n.f[0] = 1e-3f;
        char what[64];
        snprintf(what, sizeof what, "case %d", (int)c);
        vs_ref(ctx, &n, in, 5, 1e-6, 1e-6 * 8, what); /* |a x| + |b| up to ~8 */
        free(x);
        for (int k = 0; k < 4; k++) free(p[k]);
    }
    /* reductions: trailing axes (fast), others (reference) */
    static const struct {
        int rank;
        int64_t x[4];
        int mask;
    } rd_cases[] = {{2, {33, 1000}, 2}, {2, {7, 1}, 2},  {4, {2, 3, 17, 33}, 12}, {1, {1000003}, 1},
                    {3, {3, 4, 5}, 2},  {2, {1000, 1003}, 3}, {2, {4000, 7}, 2}, {1, {1}, 0}};
    const tb_op_kind rops[] = {TB_OP_REDUCE_MEAN, TB_OP_REDUCE_SUM, TB_OP_REDUCE_MAX};
    for (size_t c = 0; c < sizeof rd_cases / sizeof rd_cases[0]; c++) {
        int64_t cnt = 1;
        for (int d = 0; d < rd_cases[c].rank; d++) cnt *= rd_cases[c].x[d];
        float *x = rand_buf(cnt, -1, 3);
        tb_view in = V(TB_F32, rd_cases[c].rank, rd_cases[c].x, x);
        for (int k = 0; k < 3; k++)
            for (int keep = 0; keep < 2; keep++) {
                tb_node n = N(rops[k]);
                n.i[0] = keep;
                n.i[1] = rd_cases[c].mask;
                char what[64];
                snprintf(what, sizeof what, "case %d keepdims %d", (int)c, keep);
                vs_ref(ctx, &n, &in, 1, 2e-7, 0, what); /* both sum in double: one rounding apart */
            }
        free(x);
    }
    /* axes as an input */
    float *x = rand_buf(6 * 700, -1, 1);
    tb_view in[2] = {V(TB_F32, 2, D(6, 700), x), V(TB_I64, 1, D(1), ((int64_t[]){-1}))};
    tb_node n = N(TB_OP_REDUCE_MEAN);
    vs_ref(ctx, &n, in, 2, 2e-7, 0, "axes input");
    free(x);
}

/* ================================================================ timing */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* best of reps */
#define TIME_BEST(reps, best, stmt)                         \
    do {                                                    \
        best = 1e30;                                        \
        for (int r_ = 0; r_ < (reps); r_++) {               \
            double t0_ = now_s();                           \
            stmt;                                           \
            double t_ = now_s() - t0_;                      \
            if (t_ < best) best = t_;                       \
        }                                                   \
    } while (0)

__attribute__((noinline)) static void naive_add(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

__attribute__((noinline)) static void naive_layernorm(const float *x, const float *s, const float *b, float *y,
                                                      int64_t rows, int64_t D, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float m = 0, v = 0;
        for (int64_t j = 0; j < D; j++) m += xr[j];
        m /= D;
        for (int64_t j = 0; j < D; j++) v += (xr[j] - m) * (xr[j] - m);
        float rs = 1.0f / sqrtf(v / D + eps);
        for (int64_t j = 0; j < D; j++) y[r * D + j] = (xr[j] - m) * rs * s[j] + b[j];
    }
}

__attribute__((noinline)) static void naive_gelu(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678f));
}

static void bench(int threads) {
    tb_pool *pool = NULL;
    if (threads > 1 && tb_pool_create(threads, &pool) != TB_OK) return;
    tb_cpu_nn_ctx ctx = {.pool = pool};
    int64_t n = 16 << 20;
    float *a = rand_buf(n, -1, 1), *b = rand_buf(n, -1, 1), *y = malloc(n * sizeof(float));
    memset(y, 0, n * sizeof(float));
    tb_view in[3] = {V(TB_F32, 1, D(n), a), V(TB_F32, 1, D(n), b)};
    tb_view out = V(TB_F32, 1, D(n), y);
    tb_node add = N(TB_OP_NN_ADD);
    double t;
    printf("threads %d\n", threads);
    TIME_BEST(5, t, naive_add(a, b, y, n));
    printf("  Add 16M f32, plain loop:   %7.2f ms  %6.1f GB/s\n", t * 1e3, 12.0 * n / t / 1e9);
    TIME_BEST(5, t, tb_cpu_nn_run(&ctx, &add, in, 2, &out, 1));
    printf("  Add 16M f32, kernel:       %7.2f ms  %6.1f GB/s\n", t * 1e3, 12.0 * n / t / 1e9);
    in[1] = V(TB_F32, 1, D(768), b);
    in[0] = V(TB_F32, 2, D(n / 768, 768), a);
    out = V(TB_F32, 2, D(n / 768, 768), y);
    TIME_BEST(5, t, tb_cpu_nn_run(&ctx, &add, in, 2, &out, 1));
    printf("  Add (21845, 768)+(768):    %7.2f ms  %6.1f GB/s\n", t * 1e3, 8.0 * (n / 768 * 768) / t / 1e9);
    tb_node g = N(TB_OP_GELU);
    in[0] = V(TB_F32, 1, D(n), a);
    out = V(TB_F32, 1, D(n), y);
    TIME_BEST(3, t, naive_gelu(a, y, n));
    printf("  Gelu 16M, plain erff loop: %7.2f ms  %6.2f Gelem/s\n", t * 1e3, n / t / 1e9);
    TIME_BEST(3, t, tb_cpu_nn_run(&ctx, &g, in, 1, &out, 1));
    printf("  Gelu 16M, kernel:          %7.2f ms  %6.2f Gelem/s\n", t * 1e3, n / t / 1e9);
    int64_t rows = 1024, Dn = 768;
    tb_node ln = N(TB_OP_LAYERNORM);
    ln.i[0] = 1;
    ln.f[0] = 1e-5f;
    in[0] = V(TB_F32, 2, D(rows, Dn), a);
    in[1] = V(TB_F32, 1, D(Dn), b);
    in[2] = V(TB_F32, 1, D(Dn), b + Dn);
    out = V(TB_F32, 2, D(rows, Dn), y);
    TIME_BEST(20, t, naive_layernorm(a, b, b + Dn, y, rows, Dn, 1e-5f));
    printf("  LayerNorm (1024, 768), plain loop: %7.3f ms  %6.1f GB/s\n", t * 1e3, 8.0 * rows * Dn / t / 1e9);
    TIME_BEST(20, t, tb_cpu_nn_run(&ctx, &ln, in, 3, &out, 1));
    printf("  LayerNorm (1024, 768), kernel:     %7.3f ms  %6.1f GB/s\n", t * 1e3, 8.0 * rows * Dn / t / 1e9);
    TIME_BEST(3, t, tb_op_get_def(TB_OP_LAYERNORM)->ref(&ln, in, 3, &out, 1));
    printf("  LayerNorm (1024, 768), reference:  %7.3f ms\n", t * 1e3);
    tb_node sm = N(TB_OP_SOFTMAX);
    sm.i[0] = 1;
    in[0] = V(TB_F32, 2, D(4096, 1024), a);
    out = V(TB_F32, 2, D(4096, 1024), y);
    TIME_BEST(5, t, tb_cpu_nn_run(&ctx, &sm, in, 1, &out, 1));
    printf("  Softmax (4096, 1024), kernel:      %7.3f ms  %6.1f GB/s\n", t * 1e3, 8.0 * 4096 * 1024 / t / 1e9);
    free(a);
    free(b);
    free(y);
    tb_cpu_nn_ctx_release(&ctx);
    tb_pool_free(pool);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        int th = argc > 2 ? atoi(argv[2]) : 1;
        bench(1);
        if (th > 1) bench(th);
        return 0;
    }
    char feat[128];
    tb_cpu_features_str(tb_cpu_features(), feat, sizeof feat);
    printf("cpu: %s\n", feat);
    test_schema();
    test_shapes();
    test_graph();
    test_ref_unary();
    test_ref_binary();
    test_ref_norm();
    tb_pool *pool = NULL;
    CHECK(tb_pool_create(3, &pool) == TB_OK);
    tb_cpu_nn_ctx ctx = {.pool = pool}, solo = {.pool = NULL};
    printf("fast kernels against the reference (3 threads):\n");
    test_fast_unary(&ctx);
    test_fast_binary(&ctx);
    test_fast_norm(&ctx);
    /* the calling thread alone */
    float *x = rand_buf(100003, -5, 5);
    tb_view in = V(TB_F32, 2, D(1, 100003), x);
    tb_node n = N(TB_OP_GELU);
    vs_ref(&solo, &n, &in, 1, 1e-6, 0, "no pool");
    n = N(TB_OP_SOFTMAX);
    n.i[0] = 1;
    vs_ref(&solo, &n, &in, 1, 1e-6, 1e-37, "no pool");
    free(x);
    tb_cpu_nn_ctx_release(&ctx);
    tb_cpu_nn_ctx_release(&solo);
    tb_pool_free(pool);
    return tb_test_finish("test_nn_elem");
}
