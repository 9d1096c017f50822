/*
 * test_nn_conv.c — the compute group of the general ops (ir/nn_conv.c,
 * backend/cpu/nn_conv.c, sgemm.c, winograd.c): schemas, shape rules (with
 * symbols and unknown dims), the reference kernels against values computed
 * here independently (hand-written cases and a direct double loop with the
 * epilogue), and the fast CPU kernels against the reference on odd shapes.
 *
 * Error bounds are relative to S = sum_k |a_k b_k| + |bias| + |residual| of
 * each output element (the size of what was summed, not of the result):
 *   reference vs the independent loop:   |d| <= 1e-6 (S + 1e-3)
 *   sgemm, im2col, direct, Winograd F(2x2, 3x3): |d| <= 1e-5 (S + 1e-3)
 *   Winograd F(4x4, 3x3):                        |d| <= 2e-5 (S + 1e-3)
 * (observed: below 1e-6 for the GEMM paths and F(2x2), about 2e-6 for
 * F(4x4), whose transforms scale values by up to 8 and 1/24.)
 * The program runs itself again with TB_CPU_MASK=3 (AVX2 without AVX-512)
 * and TB_CPU_MASK=0 (the generic C kernels) so every kernel path is tested
 * on a machine that has them.
 */
#include <math.h>
#include <unistd.h>

#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"
#include "tb_test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* ---------------------------------------------------------------- views */

typedef struct {
    tb_view v;
    int owned;
} tview;

static tb_view mk(tb_dtype dt, int rank, const int64_t *dims) {
    tb_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dt;
    v.rank = rank;
    memcpy(v.dims, dims, sizeof(int64_t) * rank);
    size_t n = (size_t)tb_view_numel(&v);
    v.data = calloc(n ? n : 1, dt == TB_BOOL ? 1 : 4);
    if (dt == TB_F32)
        for (size_t i = 0; i < n; i++) ((float *)v.data)[i] = tb_test_frand(&rng);
    return v;
}

#define MK(dt, ...) mk(dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__})

static void free_views(tb_view *v, int n) {
    for (int i = 0; i < n; i++) free(v[i].data);
}

/* Runs node n over in[] with the reference (fast = 0) or the CPU dispatch. */
static tb_status run_node(const tb_node *n, const tb_view *in, int n_in, tb_view *out, int fast, tb_pool *pool) {
    tb_op_shape sh;
    TB_TRY(tb_op_infer_views(n, in, n_in, &sh));
    *out = mk(TB_F32, sh.rank[0], sh.dims[0]);
    for (int64_t i = 0; i < tb_view_numel(out); i++) ((float *)out->data)[i] = NAN;
    if (!fast) return tb_op_get_def(n->op)->ref(n, in, n_in, out, 1);
    tb_cpu_nn_ctx c = {.pool = pool};
    if (fast < 2) {
        tb_status s = tb_cpu_nn_run(&c, n, in, n_in, out, 1);
        tb_cpu_nn_ctx_release(&c);
        return s;
    }
    /* fast 2: in[1] is a weight of a graph, packed on the first run and read
     * packed on the second (whose output is the one returned) */
    tb_value vals[TB_MAX_INPUTS];
    memset(vals, 0, sizeof vals);
    tb_graph g;
    memset(&g, 0, sizeof g);
    g.values = vals;
    g.n_values = n_in;
    tb_node nw = *n;
    for (int k = 0; k < n_in; k++) {
        nw.in[k] = k;
        vals[k].kind = k == 1 ? TB_VAL_WEIGHT : TB_VAL_ACT;
    }
    c.graph = &g;
    tb_status s = tb_cpu_nn_run(&c, &nw, in, n_in, out, 1);
    int64_t cnt = tb_view_numel(out);
    for (int64_t i = 0; i < cnt; i++) ((float *)out->data)[i] = NAN;
    if (s == TB_OK) s = tb_cpu_nn_run(&c, &nw, in, n_in, out, 1);
    tb_cpu_nn_ctx_release(&c);
    return s;
}

/* max over elements of |got - want| / (S + 1e-3); NaN counts as a failure */
static double worst(const float *got, const double *want, const double *S, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / (S[i] + 1e-3);
        if (isnan(got[i]) || d > w) w = isnan(got[i]) ? INFINITY : d;
    }
    return w;
}

static double act_d(int act, double x, float p0, float p1) { return tb_nn_act_apply((tb_nn_act)act, x, p0, p1); }

/* epilogue of the expected values: want = act(v [+ r]) [+ r] */
static double epi_d(double v, int act, float p0, float p1, int flags, const float *res, int64_t o) {
    double r = res ? res[o] : 0.0;
    if (flags & TB_NN_ACT_AFTER_RESIDUAL) return act_d(act, v + r, p0, p1);
    return act_d(act, v, p0, p1) + r;
}

/* ---------------------------------------------------------------- schema and shapes */

static tb_node conv_node(int group, int sh, int sw, int pt, int pl, int pb, int pr, int dh, int dw, int autopad,
                         int act, int flags) {
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = TB_OP_CONV;
    int32_t v[12] = {group, sh, sw, pt, pl, pb, pr, dh, dw, autopad, act, flags};
    memcpy(n.i, v, sizeof v);
    return n;
}

static void test_schema(void) {
    static const char *names[] = {"Conv", "Gemm", "MatMul"};
    static const tb_op_kind kinds[] = {TB_OP_CONV, TB_OP_GEMM, TB_OP_NN_MATMUL, TB_OP_SDPA};
    for (int i = 0; i < 4; i++) {
        const tb_op_def *d = tb_op_get_def(kinds[i]);
        CHECK(d && d->infer && d->ref);
        if (!d) continue;
        if (i < 3) CHECK(!strcmp(d->name, names[i]) && tb_nn_from_onnx(names[i]) == (int)kinds[i]);
        else CHECK(!strcmp(d->name, "sdpa"));
    }
    const tb_op_def *c = tb_op_get_def(TB_OP_CONV);
    CHECK(c->n_attrs == 14 && !strcmp(c->attrs[0].name, "group") && c->attrs[9].slot == 9 &&
          c->attrs[12].type == TB_ATTR_FLOAT && c->attrs[12].slot == 0 && c->attrs[13].slot == 1);
    const tb_op_def *g = tb_op_get_def(TB_OP_GEMM);
    CHECK(g->attrs[4].type == TB_ATTR_FLOAT && !strcmp(g->attrs[4].name, "alpha") && g->attrs[5].slot == 1 &&
          g->attrs[6].slot == 2);
    const tb_op_def *m = tb_op_get_def(TB_OP_NN_MATMUL);
    CHECK(m->attrs[4].slot == 0 && m->attrs[5].slot == 2 && m->attrs[6].slot == 3);
    tb_node n = conv_node(1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0);
    CHECK(tb_op_check_attrs(&n) == TB_OK);
    n.i[1] = -1;
    CHECK(tb_op_check_attrs(&n) == TB_ERR_FORMAT && strstr(tb_last_error(), "stride_h"));
    n.i[1] = 1;
    n.i[10] = TB_NN_ACT_TANH + 1;
    CHECK(tb_op_check_attrs(&n) == TB_ERR_FORMAT);
    n.i[10] = 0;
    n.i[12] = 1; /* no attribute there */
    CHECK(tb_op_check_attrs(&n) == TB_ERR_FORMAT);
    n.i[12] = 0;
    n.f[0] = -INFINITY; /* clip without a lower bound */
    n.f[1] = 6.0f;
    CHECK(tb_op_check_attrs(&n) == TB_OK);
    tb_node s;
    memset(&s, 0, sizeof s);
    s.op = TB_OP_SDPA;
    s.i[2] = 3;
    CHECK(tb_op_check_attrs(&s) == TB_ERR_FORMAT);
    s.i[2] = 0;
    s.f[0] = -1.0f;
    CHECK(tb_op_check_attrs(&s) == TB_ERR_FORMAT);
}

static tb_view shape_view(tb_dtype dt, int rank, const int64_t *dims) {
    tb_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dt;
    v.rank = rank;
    memcpy(v.dims, dims, sizeof(int64_t) * rank);
    return v;
}
#define SV(...) shape_view(TB_F32, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__})

static int dims_are(const tb_op_shape *s, int rank, const int64_t *d) {
    if (s->rank[0] != rank) return 0;
    for (int i = 0; i < rank; i++)
        if (s->dims[0][i] != d[i]) return 0;
    return 1;
}
#define DIMS(s, ...) dims_are(s, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__})

static void test_shapes(void) {
    tb_op_shape s;
    /* the ResNet stem with a symbolic batch and symbolic spatial dims */
    tb_node n = conv_node(1, 2, 2, 3, 3, 3, 3, 1, 1, 0, 0, 0);
    tb_view in[4] = {SV(TB_SYM(0), 3, 224, 224), SV(64, 3, 7, 7)};
    CHECK(tb_op_infer_views(&n, in, 2, &s) == TB_OK && DIMS(&s, TB_SYM(0), 64, 112, 112));
    in[0] = SV(1, 3, TB_SYM(1), 224);
    CHECK(tb_op_infer_views(&n, in, 2, &s) == TB_OK && DIMS(&s, 1, 64, TB_DIM_DYN, 112));
    in[0] = SV(1, 4, 224, 224);
    CHECK(tb_op_infer_views(&n, in, 2, &s) == TB_ERR_FORMAT && strstr(tb_last_error(), "channels"));
    /* groups, auto_pad, rank 3 */
    n = conv_node(4, 2, 2, 0, 0, 0, 0, 1, 1, TB_NN_PAD_SAME_UPPER, 0, 0);
    in[0] = SV(2, 8, 9, 10);
    in[1] = SV(12, 2, 3, 3);
    CHECK(tb_op_infer_views(&n, in, 2, &s) == TB_OK && DIMS(&s, 2, 12, 5, 5));
    n.i[9] = TB_NN_PAD_VALID;
    CHECK(tb_op_infer_views(&n, in, 2, &s) == TB_OK && DIMS(&s, 2, 12, 4, 4));
    in[1] = SV(10, 2, 3, 3); /* 10 output channels over 4 groups */
    CHECK(tb_op_infer_views(&n, in, 2, &s) == TB_ERR_FORMAT);
    n = conv_node(1, 0, 3, 0, 1, 0, 1, 0, 2, 0, 0, TB_NN_HAS_BIAS);
    in[0] = SV(1, 5, 20);
    in[1] = SV(6, 5, 4);
    in[2] = SV(6);
    CHECK(tb_op_infer_views(&n, in, 3, &s) == TB_OK && DIMS(&s, 1, 6, 6)); /* (20 + 2 - 7) / 3 + 1 */
    in[2] = SV(5);
    CHECK(tb_op_infer_views(&n, in, 3, &s) == TB_ERR_FORMAT);
    in[0] = SV(1, 5, 3);
    in[2] = SV(6);
    CHECK(tb_op_infer_views(&n, in, 3, &s) == TB_ERR_FORMAT); /* kernel larger than the input */
    /* residual must match the output */
    n = conv_node(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_RESIDUAL);
    in[0] = SV(1, 4, 8, 8);
    in[1] = SV(4, 4, 3, 3);
    in[2] = SV(1, 4, 8, 8);
    CHECK(tb_op_infer_views(&n, in, 3, &s) == TB_OK && DIMS(&s, 1, 4, 8, 8));
    in[2] = SV(1, 4, 8, 7);
    CHECK(tb_op_infer_views(&n, in, 3, &s) == TB_ERR_FORMAT);

    /* Gemm */
    tb_node gm;
    memset(&gm, 0, sizeof gm);
    gm.op = TB_OP_GEMM;
    gm.i[1] = 1;
    gm.f[0] = gm.f[1] = 1.0f;
    in[0] = SV(TB_SYM(0), 768);
    in[1] = SV(3072, 768);
    in[2] = SV(3072);
    CHECK(tb_op_infer_views(&gm, in, 3, &s) == TB_OK && DIMS(&s, TB_SYM(0), 3072));
    in[2] = SV(7, 1);
    CHECK(tb_op_infer_views(&gm, in, 3, &s) == TB_OK); /* (7, 1) vs a symbolic M: checked at run time */
    in[0] = SV(7, 768);
    CHECK(tb_op_infer_views(&gm, in, 3, &s) == TB_OK);
    in[2] = SV(5, 1);
    CHECK(tb_op_infer_views(&gm, in, 3, &s) == TB_ERR_FORMAT);
    in[1] = SV(3072, 767);
    CHECK(tb_op_infer_views(&gm, in, 2, &s) == TB_ERR_FORMAT);

    /* MatMul: numpy broadcasting, 1-d operands, transposed reads */
    tb_node mm;
    memset(&mm, 0, sizeof mm);
    mm.op = TB_OP_NN_MATMUL;
    in[0] = SV(2, 1, 3, 4);
    in[1] = SV(5, 4, 6);
    CHECK(tb_op_infer_views(&mm, in, 2, &s) == TB_OK && DIMS(&s, 2, 5, 3, 6));
    in[0] = SV(4);
    CHECK(tb_op_infer_views(&mm, in, 2, &s) == TB_OK && DIMS(&s, 5, 6));
    in[0] = SV(2, 3, 4);
    in[1] = SV(4);
    CHECK(tb_op_infer_views(&mm, in, 2, &s) == TB_OK && DIMS(&s, 2, 3));
    in[0] = SV(TB_SYM(0), TB_SYM(1), 768);
    in[1] = SV(768, 768);
    CHECK(tb_op_infer_views(&mm, in, 2, &s) == TB_OK && DIMS(&s, TB_SYM(0), TB_SYM(1), 768));
    mm.i[0] = 1; /* a read as (..., K, M) */
    in[0] = SV(3, 4, 5);
    in[1] = SV(4, 6);
    CHECK(tb_op_infer_views(&mm, in, 2, &s) == TB_OK && DIMS(&s, 3, 5, 6));
    mm.i[0] = 0;
    CHECK(tb_op_infer_views(&mm, in, 2, &s) == TB_ERR_FORMAT);
    in[0] = SV(2, 3, 4);
    in[1] = SV(3, 4, 6);
    CHECK(tb_op_infer_views(&mm, in, 2, &s) == TB_ERR_FORMAT); /* batch 2 vs 3 */

    /* sdpa */
    tb_node at;
    memset(&at, 0, sizeof at);
    at.op = TB_OP_SDPA;
    in[0] = SV(TB_SYM(0), 12, TB_SYM(1), 64);
    in[1] = SV(TB_SYM(0), 12, TB_SYM(2), 64);
    in[2] = SV(TB_SYM(0), 12, TB_SYM(2), 32);
    CHECK(tb_op_infer_views(&at, in, 3, &s) == TB_OK && DIMS(&s, TB_SYM(0), 12, TB_SYM(1), 32));
    at.i[2] = 1;
    in[3] = SV(TB_SYM(0), 1, 1, TB_SYM(2));
    CHECK(tb_op_infer_views(&at, in, 4, &s) == TB_OK);
    in[3].dtype = TB_BOOL;
    CHECK(tb_op_infer_views(&at, in, 4, &s) == TB_ERR_FORMAT);
    at.i[2] = 0;
    in[1] = SV(1, 12, 10, 63);
    CHECK(tb_op_infer_views(&at, in, 3, &s) == TB_ERR_FORMAT);
}

/* ---------------------------------------------------------------- independent expectations */

/* Conv straight from the definition: want and S per output element. */
static void conv_expect(const tb_node *n, const tb_view *in, int n_in, const tb_view *out, double *want, double *S) {
    int r = in[0].rank;
    const float *x = in[0].data, *w = in[1].data;
    int flags = n->i[11];
    int has_res = (flags & TB_NN_HAS_RESIDUAL) != 0;
    const float *bias = n_in - has_res > 2 ? in[2].data : NULL, *res = has_res ? in[n_in - 1].data : NULL;
    int64_t N = in[0].dims[0], C = in[0].dims[1], H = r == 4 ? in[0].dims[2] : 1, W = in[0].dims[r - 1];
    int64_t M = in[1].dims[0], KH = r == 4 ? in[1].dims[2] : 1, KW = in[1].dims[r - 1];
    int64_t OH = r == 4 ? out->dims[2] : 1, OW = out->dims[r - 1];
    int G = n->i[0] ? n->i[0] : 1;
    int sh = r == 4 && n->i[1] ? n->i[1] : 1, sw = n->i[2] ? n->i[2] : 1;
    int dh = r == 4 && n->i[7] ? n->i[7] : 1, dw = n->i[8] ? n->i[8] : 1;
    int pt = r == 4 ? n->i[3] : 0, pl = n->i[4];
    if (n->i[9] == TB_NN_PAD_SAME_UPPER || n->i[9] == TB_NN_PAD_SAME_LOWER) {
        int64_t th = (OH - 1) * sh + (KH - 1) * dh + 1 - H, tw = (OW - 1) * sw + (KW - 1) * dw + 1 - W;
        th = th < 0 ? 0 : th;
        tw = tw < 0 ? 0 : tw;
        pt = (int)(n->i[9] == TB_NN_PAD_SAME_UPPER ? th / 2 : th - th / 2);
        pl = (int)(n->i[9] == TB_NN_PAD_SAME_UPPER ? tw / 2 : tw - tw / 2);
    } else if (n->i[9] == TB_NN_PAD_VALID) {
        pt = pl = 0;
    }
    int64_t CG = C / G, MG = M / G;
    for (int64_t b = 0; b < N; b++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t p = 0; p < OH * OW; p++) {
                int64_t oy = p / OW, ox = p % OW;
                double acc = 0, s = 0;
                for (int64_t k = 0; k < CG * KH * KW; k++) {
                    int64_t c = k / (KH * KW), ky = k / KW % KH, kx = k % KW;
                    int64_t iy = oy * sh + ky * dh - pt, ix = ox * sw + kx * dw - pl;
                    if (iy < 0 || ix < 0 || iy >= H || ix >= W) continue;
                    double t = (double)x[((b * C + (m / MG) * CG + c) * H + iy) * W + ix] * w[m * CG * KH * KW + k];
                    acc += t;
                    s += fabs(t);
                }
                int64_t o = (b * M + m) * OH * OW + p;
                if (bias) { acc += bias[m]; s += fabs(bias[m]); }
                if (res) s += fabs(res[o]);
                want[o] = epi_d(acc, n->i[10], n->f[0], n->f[1], flags, res, o);
                S[o] = s;
            }
}

/* C (M, N) = A B with A, B given by element functions through strides */
typedef struct {
    const float *p;
    int64_t rs, cs; /* element (i, j) at p[i rs + j cs] */
} mat;

static void gemm_expect(int64_t M, int64_t N, int64_t K, double alpha, mat A, mat B, mat bias, double bscale,
                        const float *res, int act, float p0, float p1, int flags, double *want, double *S) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0, s = 0;
            for (int64_t k = 0; k < K; k++) {
                double t = (double)A.p[i * A.rs + k * A.cs] * B.p[k * B.rs + j * B.cs];
                acc += t;
                s += fabs(t);
            }
            acc *= alpha;
            s *= fabs(alpha);
            if (bias.p) {
                double bv = bscale * bias.p[i * bias.rs + j * bias.cs];
                acc += bv;
                s += fabs(bv);
            }
            int64_t o = i * N + j;
            if (res) s += fabs(res[o]);
            want[o] = epi_d(acc, act, p0, p1, flags, res, o);
            S[o] = s;
        }
}

/* ---------------------------------------------------------------- hand-written cases */

static void test_ref_hand(void) {
    /* x = 1..16 (1, 1, 4, 4), w = [[1, 0], [0, -1]], pad 1 each side, stride 2 */
    tb_view in[3] = {MK(TB_F32, 1, 1, 4, 4), MK(TB_F32, 1, 1, 2, 2), MK(TB_F32, 1)};
    for (int i = 0; i < 16; i++) ((float *)in[0].data)[i] = (float)(i + 1);
    float wv[4] = {1, 0, 0, -1};
    memcpy(in[1].data, wv, sizeof wv);
    ((float *)in[2].data)[0] = 0.5f;
    tb_node n = conv_node(1, 2, 2, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_NONE, TB_NN_HAS_BIAS);
    tb_view out;
    CHECK(run_node(&n, in, 3, &out, 0, NULL) == TB_OK && out.rank == 4 && out.dims[2] == 3 && out.dims[3] == 3);
    /* y[oy][ox] = x(2oy-1, 2ox-1) - x(2oy, 2ox) + 0.5, x outside = 0 */
    float want[9];
    const float *x = in[0].data;
    for (int oy = 0; oy < 3; oy++)
        for (int ox = 0; ox < 3; ox++) {
            int y0 = 2 * oy - 1, x0 = 2 * ox - 1;
            float a = y0 >= 0 && x0 >= 0 ? x[y0 * 4 + x0] : 0, b = y0 + 1 < 4 && x0 + 1 < 4 ? x[(y0 + 1) * 4 + x0 + 1] : 0;
            want[oy * 3 + ox] = a - b + 0.5f;
        }
    CHECK(want[0] == -0.5f && want[1] == -2.5f && want[4] == 6 - 11 + 0.5f && want[8] == 16.5f);
    for (int i = 0; i < 9; i++) CHECK_MSG(((float *)out.data)[i] == want[i], "conv hand %d: %g vs %g", i,
                                          ((float *)out.data)[i], want[i]);
    free(out.data);
    /* with relu and a residual of 1 after / before the activation */
    tb_view r = MK(TB_F32, 1, 1, 3, 3);
    for (int i = 0; i < 9; i++) ((float *)r.data)[i] = 1.0f;
    tb_view in4[4] = {in[0], in[1], in[2], r};
    n = conv_node(1, 2, 2, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL);
    CHECK(run_node(&n, in4, 4, &out, 0, NULL) == TB_OK);
    CHECK(((float *)out.data)[0] == 1.0f && ((float *)out.data)[8] == 17.5f);
    free(out.data);
    n.i[11] |= TB_NN_ACT_AFTER_RESIDUAL;
    CHECK(run_node(&n, in4, 4, &out, 0, NULL) == TB_OK);
    CHECK(((float *)out.data)[0] == 0.5f && ((float *)out.data)[1] == 0.0f);
    free(out.data);
    free(r.data);
    free_views(in, 3);

    /* Gemm: a (2, 3) transposed storage, b (3, 2), c (2) row, alpha 2, beta 3 */
    tb_view g[3] = {MK(TB_F32, 3, 2), MK(TB_F32, 3, 2), MK(TB_F32, 2)};
    float av[6] = {1, 4, 2, 5, 3, 6}; /* a = [[1, 2, 3], [4, 5, 6]] */
    float bv[6] = {1, 0, 0, 1, 1, 1};
    float cv[2] = {10, 20};
    memcpy(g[0].data, av, sizeof av);
    memcpy(g[1].data, bv, sizeof bv);
    memcpy(g[2].data, cv, sizeof cv);
    tb_node gm;
    memset(&gm, 0, sizeof gm);
    gm.op = TB_OP_GEMM;
    gm.i[0] = 1;
    gm.i[3] = TB_NN_HAS_BIAS;
    gm.f[0] = 2;
    gm.f[1] = 3;
    for (int fast = 0; fast < 2; fast++) {
        CHECK(run_node(&gm, g, 3, &out, fast, NULL) == TB_OK);
        /* a b = [[4, 5], [10, 11]] */
        float ge[4] = {8 + 30, 10 + 60, 20 + 30, 22 + 60};
        for (int i = 0; i < 4; i++) CHECK_MSG(((float *)out.data)[i] == ge[i], "gemm hand %d (fast %d)", i, fast);
        free(out.data);
    }
    free_views(g, 3);

    /* MatMul of 1-d operands: (3) x (3) is a scalar of rank 0 */
    tb_view mv[2] = {MK(TB_F32, 3), MK(TB_F32, 3, 1)};
    float v3[3] = {1, 2, 3};
    memcpy(mv[0].data, v3, sizeof v3);
    memcpy(mv[1].data, v3, sizeof v3);
    tb_node mm;
    memset(&mm, 0, sizeof mm);
    mm.op = TB_OP_NN_MATMUL;
    CHECK(run_node(&mm, mv, 2, &out, 0, NULL) == TB_OK && out.rank == 1 && out.dims[0] == 1 &&
          ((float *)out.data)[0] == 14.0f);
    free(out.data);
    free_views(mv, 2);

    /* sdpa: one query over two keys with scores 0 and ln 3: weights 1/4, 3/4 */
    tb_view sv[3] = {MK(TB_F32, 1, 1, 1, 1), MK(TB_F32, 1, 1, 2, 1), MK(TB_F32, 1, 1, 2, 2)};
    ((float *)sv[0].data)[0] = 1;
    ((float *)sv[1].data)[0] = 0;
    ((float *)sv[1].data)[1] = (float)log(3.0);
    float vv[4] = {4, 8, 0, 4};
    memcpy(sv[2].data, vv, sizeof vv);
    tb_node at;
    memset(&at, 0, sizeof at);
    at.op = TB_OP_SDPA;
    for (int fast = 0; fast < 2; fast++) {
        CHECK(run_node(&at, sv, 3, &out, fast, NULL) == TB_OK);
        CHECK(fabsf(((float *)out.data)[0] - 1.0f) < 1e-6f && fabsf(((float *)out.data)[1] - 5.0f) < 1e-5f);
        free(out.data);
    }
    free_views(sv, 3);
}

/* ---------------------------------------------------------------- randomised cases */

static void check_conv(const char *what, tb_node n, tb_view *in, int n_in, tb_pool *pool) {
    tb_view ref, fast;
    tb_status s1 = run_node(&n, in, n_in, &ref, 0, NULL);
    CHECK_MSG(s1 == TB_OK, "%s: ref: %s", what, tb_last_error());
    if (s1 != TB_OK) return;
    int64_t cnt = tb_view_numel(&ref);
    double *want = malloc(sizeof(double) * (size_t)cnt), *S = malloc(sizeof(double) * (size_t)cnt);
    conv_expect(&n, in, n_in, &ref, want, S);
    double e = worst(ref.data, want, S, cnt);
    CHECK_MSG(e <= 1e-6, "%s: reference error %.3g", what, e);
    /* Winograd only applies to 3x3 stride 1 one group */
    int w_ok = in[1].rank == 4 && in[1].dims[2] == 3 && in[1].dims[3] == 3 && n.i[1] <= 1 && n.i[2] <= 1 &&
               n.i[7] <= 1 && n.i[8] <= 1 && n.i[0] <= 1;
    for (int t = 0; t <= TB_CONV_TACTIC_WINOGRAD4F; t++) {
        if (!w_ok && (t == TB_CONV_TACTIC_WINOGRAD || t == TB_CONV_TACTIC_WINOGRAD4 || t == TB_CONV_TACTIC_WINOGRAD4F))
            continue;
        n.tactic = t;
        if (run_node(&n, in, n_in, &fast, 1, pool) != TB_OK) {
            CHECK_MSG(0, "%s: fast: %s", what, tb_last_error());
            break;
        }
        e = worst(fast.data, want, S, cnt);
        double bound = t == TB_CONV_TACTIC_WINOGRAD4 || t == TB_CONV_TACTIC_WINOGRAD4F ? 2e-5 : 1e-5;
        if (getenv("TB_TEST_VERBOSE")) printf("%s tactic %d: error %.6g\n", what, t, e);
        CHECK_MSG(e <= bound, "%s tactic %d: error %.3g (bound %.0e)", what, t, e, bound);
        free(fast.data);
    }
    free(ref.data);
    free(want);
    free(S);
}

static void test_conv_random(tb_pool *pool) {
    struct {
        int r, n, c, h, w, m, kh, kw, group, sh, sw, pt, pl, pb, pr, dh, dw, ap, act, flags;
    } cs[] = {
        {4, 1, 3, 17, 13, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS},
        {4, 2, 16, 9, 11, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_NONE, 0},
        {4, 1, 32, 8, 8, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL},
        {4, 1, 20, 7, 7, 24, 3, 3, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, TB_NN_ACT_CLIP, TB_NN_HAS_BIAS},
        {4, 1, 3, 23, 23, 8, 7, 7, 1, 2, 2, 3, 3, 3, 3, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS},
        {4, 1, 3, 21, 75, 13, 7, 7, 1, 2, 2, 3, 3, 2, 3, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS}, /* rows of 38 */
        {4, 1, 16, 7, 69, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_GELU_TANH, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL}, /* 35 tiles a row */
        {4, 2, 17, 66, 9, 18, 3, 3, 1, 1, 1, 0, 1, 2, 0, 1, 1, 0, TB_NN_ACT_NONE, TB_NN_HAS_BIAS}, /* tall, uneven pads */
        /* im2col over 16 MB: made in two chunks of output rows */
        {4, 1, 64, 60, 128, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        {4, 1, 7, 10, 9, 9, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, TB_NN_ACT_GELU_ERF, TB_NN_HAS_BIAS},
        {4, 1, 8, 11, 11, 6, 1, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 0, TB_NN_ACT_NONE, TB_NN_HAS_RESIDUAL},
        {4, 2, 6, 9, 8, 6, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_CLIP, TB_NN_HAS_BIAS},     /* depthwise */
        {4, 1, 4, 12, 12, 8, 3, 3, 4, 2, 2, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_SIGMOID, TB_NN_HAS_BIAS}, /* x2 mult */
        {4, 1, 8, 10, 12, 6, 3, 2, 2, 1, 2, 2, 0, 1, 1, 2, 1, 0, TB_NN_ACT_TANH, TB_NN_HAS_BIAS},
        {4, 1, 5, 9, 10, 4, 3, 3, 1, 2, 2, 0, 0, 0, 0, 1, 1, TB_NN_PAD_SAME_UPPER, 0, 0},
        {4, 1, 5, 9, 10, 4, 4, 4, 1, 2, 3, 0, 0, 0, 0, 1, 1, TB_NN_PAD_SAME_LOWER, TB_NN_ACT_GELU_TANH, 0},
        {4, 1, 5, 9, 10, 4, 3, 3, 1, 2, 2, 9, 9, 9, 9, 1, 1, TB_NN_PAD_VALID, 0, 0},
        {3, 2, 6, 1, 31, 10, 1, 5, 2, 1, 2, 0, 2, 0, 1, 1, 3, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS},
        {4, 1, 64, 14, 14, 65, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        /* direct (channels in the lanes): a stem, a deep small map with a
         * part panel, dilation with stride 2, 1x1 stride 2 with an
         * activation of the sgemm epilogue, blocks of rows over 16 pixels */
        {4, 2, 3, 30, 29, 70, 7, 7, 1, 2, 2, 3, 3, 3, 3, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        {4, 1, 40, 9, 9, 130, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL},
        {4, 1, 16, 15, 17, 64, 3, 3, 1, 2, 2, 1, 2, 1, 0, 2, 2, 0, TB_NN_ACT_CLIP, TB_NN_HAS_BIAS},
        {4, 1, 24, 14, 14, 48, 1, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 0, TB_NN_ACT_GELU_ERF, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        {4, 1, 20, 40, 37, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_NONE, TB_NN_HAS_RESIDUAL},
        /* Winograd over a batch: the images' tiles side by side in one GEMM,
         * each image's residual and output in its place */
        {4, 3, 24, 7, 9, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        /* 7x7 maps at batch 8: the rule (tactic 0) takes F(4x4) by tile blocks (AVX-512), one block of 32 tiles over the images */
        {4, 8, 16, 7, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        /* F(4x4) by tile blocks: two blocks (32 + 17 tiles) split by groups
         * of output channels (a part group of 8), the residual and ReLU
         * after it fused; four blocks with one of 16 tiles, images crossed
         * within a block; a deep K (2304 products a sum) */
        {4, 1, 64, 28, 28, 68, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL},
        {4, 2, 12, 30, 26, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_CLIP, TB_NN_HAS_BIAS},
        {4, 1, 256, 14, 14, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "conv case %zu", i);
        tb_node n = conv_node(cs[i].group, cs[i].r == 4 ? cs[i].sh : 0, cs[i].sw, cs[i].r == 4 ? cs[i].pt : 0, cs[i].pl,
                              cs[i].r == 4 ? cs[i].pb : 0, cs[i].pr, cs[i].r == 4 ? cs[i].dh : 0, cs[i].dw, cs[i].ap,
                              cs[i].act, cs[i].flags);
        if (cs[i].act == TB_NN_ACT_CLIP) { n.f[0] = -0.25f; n.f[1] = 0.5f; }
        tb_view in[4];
        int k = 0;
        int cg = cs[i].c / cs[i].group;
        if (cs[i].r == 4) {
            in[k++] = MK(TB_F32, cs[i].n, cs[i].c, cs[i].h, cs[i].w);
            in[k++] = MK(TB_F32, cs[i].m, cg, cs[i].kh, cs[i].kw);
        } else {
            in[k++] = MK(TB_F32, cs[i].n, cs[i].c, cs[i].w);
            in[k++] = MK(TB_F32, cs[i].m, cg, cs[i].kw);
        }
        if (cs[i].flags & TB_NN_HAS_BIAS) in[k++] = MK(TB_F32, cs[i].m);
        if (cs[i].flags & TB_NN_HAS_RESIDUAL) {
            tb_op_shape sh;
            tb_node plain = n;
            plain.i[11] = 0;
            CHECK(tb_op_infer_views(&plain, in, 2, &sh) == TB_OK);
            in[k++] = mk(TB_F32, sh.rank[0], sh.dims[0]);
        }
        check_conv(what, n, in, k, pool);
        free_views(in, k);
    }
}

/* sgemm directly: trans flags, odd sizes, alpha / beta, leading dims, epilogues */
static void test_sgemm(tb_pool *pool, int packed) {
    /* the small-M kernel of a packed B: M <= 4, several K blocks, N over a thread's share; the AVX-512
     * kernel's tail instances (last row panel of 1-4, 5-8, 9-12 rows by last column panel of 1-16 or
     * 17-32 columns): 13 x 1, 14 x 50, 65 x 129, 200 x 150, 129 x 33, 24 x 32; a C of 520 x 700 (1.4 MB,
     * over half of L2 per thread too), whose kernel calls prefetch the C and residual tiles (with B packed and
     * M >= 512 its threads split the rows, not the columns); 37 x 600 x 1021
     * (lda 1024 when A is not transposed: rows 4 KB apart, whose panels are packed, not read in place,
     * when a thread's columns span 8 panels or more) */
    static const int64_t sizes[][3] = {{1, 1, 1},   {7, 17, 63},    {17, 7, 65},    {63, 65, 1},   {65, 129, 17},
                                       {129, 33, 300}, {13, 1, 129}, {1, 97, 31},   {200, 150, 520}, {31, 45, 0},
                                       {2, 1000, 513}, {3, 70, 300}, {4, 2049, 257}, {1, 1000, 512}, {5, 33, 260},
                                       {14, 50, 40},   {24, 32, 70},   {520, 700, 70}, {37, 600, 1021}};
    int idx = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++, idx++) {
                int64_t M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
                int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 5;
                float *A = malloc(sizeof(float) * (size_t)((ta ? K : M) * lda + 1));
                float *B = malloc(sizeof(float) * (size_t)((tb ? N : K) * ldb + 1));
                float *C = malloc(sizeof(float) * (size_t)(M * ldc));
                float *C0 = malloc(sizeof(float) * (size_t)(M * ldc));
                float *bias = malloc(sizeof(float) * (size_t)(M > N ? M : N));
                float *res = malloc(sizeof(float) * (size_t)(M * N));
                for (int64_t i = 0; i < (ta ? K : M) * lda; i++) A[i] = tb_test_frand(&rng);
                for (int64_t i = 0; i < (tb ? N : K) * ldb; i++) B[i] = tb_test_frand(&rng);
                for (int64_t i = 0; i < M * ldc; i++) C0[i] = tb_test_frand(&rng);
                for (int64_t i = 0; i < (M > N ? M : N); i++) bias[i] = tb_test_frand(&rng);
                for (int64_t i = 0; i < M * N; i++) res[i] = tb_test_frand(&rng);
                memcpy(C, C0, sizeof(float) * (size_t)(M * ldc));
                /* variants: plain with beta; per-row bias + relu; per-column bias + gelu + residual after;
                 * per-column bias + residual (the register epilogue's residual) */
                int variant = idx % 4;
                float alpha = variant == 1 ? -0.75f : 1.0f, beta = variant == 0 ? 0.5f : 0.0f;
                tb_cpu_sgemm_epi e = {0};
                if (variant == 1) { e.bias = bias; e.bias_rs = 1; e.act = TB_NN_ACT_RELU; }
                if (variant == 2) {
                    e.bias = bias; e.bias_cs = 1; e.bias_scale = 2.0f;
                    e.act = TB_NN_ACT_GELU_ERF; e.res = res; e.ld_res = N;
                }
                if (variant == 3) { e.bias = bias; e.bias_cs = 1; e.res = res; e.ld_res = N; }
                if (packed) { /* B packed once beforehand (a weight), with a dense A when ta */
                    float *Bp = tb_alloc_aligned(sizeof(float) * (tb_cpu_sgemm_packed_floats(K, N) + 1), 64);
                    tb_cpu_sgemm_pack_b(tb, K, N, B, ldb, Bp);
                    tb_cpu_sgemm_packed(ta, M, N, K, alpha, A, lda, Bp, beta, C, ldc, &e, pool);
                    tb_free_aligned(Bp);
                } else {
                    tb_cpu_sgemm_ex(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, &e, pool);
                }
                double *want = malloc(sizeof(double) * (size_t)(M * N + 1)), *S = malloc(sizeof(double) * (size_t)(M * N + 1));
                mat am = {A, ta ? 1 : lda, ta ? lda : 1}, bm = {B, tb ? 1 : ldb, tb ? ldb : 1};
                mat bi = {e.bias, e.bias_rs, e.bias_cs};
                gemm_expect(M, N, K, alpha, am, bm, bi, variant == 2 ? 2.0 : 1.0, e.res, e.act, 0, 0, 0, want, S);
                float *got = malloc(sizeof(float) * (size_t)(M * N + 1));
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) {
                        int64_t o = i * N + j;
                        if (beta != 0.0f) { want[o] += beta * C0[i * ldc + j]; S[o] += fabs(beta * C0[i * ldc + j]); }
                        got[o] = C[i * ldc + j];
                    }
                double err = worst(got, want, S, M * N);
                int pad_ok = 1;
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = N; j < ldc; j++) pad_ok &= C[i * ldc + j] == C0[i * ldc + j];
                CHECK_MSG(err <= 1e-5 && pad_ok, "sgemm%s %lldx%lldx%lld ta %d tb %d variant %d: error %.3g%s",
                          packed ? " packed" : "", (long long)M, (long long)N, (long long)K, ta, tb, variant, err,
                          pad_ok ? "" : ", wrote past N");
                free(A); free(B); free(C); free(C0); free(bias); free(res); free(want); free(S); free(got);
            }
}

static void test_gemm_matmul(tb_pool *pool) {
    /* Gemm over c shapes, trans flags, activations, residual */
    static const int64_t gs[][3] = {{1, 1, 1}, {7, 17, 63}, {65, 33, 129}, {128, 96, 70}, {1, 1000, 512}, {3, 64, 300}};
    int v = 0;
    for (size_t s = 0; s < sizeof gs / sizeof gs[0]; s++)
        for (int t = 0; t < 4; t++, v++) {
            int64_t M = gs[s][0], N = gs[s][1], K = gs[s][2];
            int ta = t & 1, tb = t >> 1;
            tb_node n;
            memset(&n, 0, sizeof n);
            n.op = TB_OP_GEMM;
            n.i[0] = ta;
            n.i[1] = tb;
            n.i[2] = v % 7;
            n.i[3] = TB_NN_HAS_BIAS | (v % 2 ? TB_NN_HAS_RESIDUAL : 0) | (v % 4 == 3 ? TB_NN_ACT_AFTER_RESIDUAL : 0);
            n.f[0] = 0.5f + (float)(v % 3);
            n.f[1] = v % 5 == 4 ? 0.0f : 1.5f;
            n.f[2] = -0.3f;
            n.f[3] = 0.4f;
            tb_view in[4];
            in[0] = ta ? MK(TB_F32, K, M) : MK(TB_F32, M, K);
            in[1] = tb ? MK(TB_F32, N, K) : MK(TB_F32, K, N);
            int cshape = v % 5;
            in[2] = cshape == 0 ? MK(TB_F32, N) : cshape == 1 ? MK(TB_F32, M, 1) : cshape == 2 ? MK(TB_F32, M, N)
                  : cshape == 3 ? MK(TB_F32, 1) : MK(TB_F32, 1, N);
            int k = 3;
            if (n.i[3] & TB_NN_HAS_RESIDUAL) in[k++] = MK(TB_F32, M, N);
            double *want = malloc(sizeof(double) * (size_t)(M * N)), *S = malloc(sizeof(double) * (size_t)(M * N));
            mat am = {in[0].data, ta ? 1 : K, ta ? M : 1}, bm = {in[1].data, tb ? 1 : N, tb ? K : 1};
            int64_t cm = in[2].rank == 2 ? in[2].dims[0] : 1, cn = in[2].dims[in[2].rank - 1];
            mat cmat = {n.f[1] != 0.0f ? in[2].data : NULL, cm == 1 ? 0 : cn, cn == 1 ? 0 : 1};
            gemm_expect(M, N, K, n.f[0], am, bm, cmat, n.f[1], k == 4 ? in[3].data : NULL, n.i[2], n.f[2], n.f[3],
                        n.i[3], want, S);
            for (int fast = 0; fast < 3; fast++) { /* fast 2: B a weight, packed once */
                tb_view out;
                if (run_node(&n, in, k, &out, fast, pool) != TB_OK) {
                    CHECK_MSG(0, "gemm %d: %s", v, tb_last_error());
                    continue;
                }
                double e = worst(out.data, want, S, M * N), bound = fast ? 1e-5 : 1e-6;
                CHECK_MSG(e <= bound, "gemm %lldx%lldx%lld ta %d tb %d act %d c %d (fast %d): error %.3g",
                          (long long)M, (long long)N, (long long)K, ta, tb, n.i[2], cshape, fast, e);
                free(out.data);
            }
            free(want);
            free(S);
            free_views(in, k);
        }

    /* MatMul: broadcasting batch dims, 1-d operands, trans flags, bias, residual */
    struct {
        int ra;
        int64_t a[4];
        int rb;
        int64_t b[4];
        int ta, tb, act, flags;
    } ms[] = {
        {3, {4, 17, 65}, 2, {65, 33}, 0, 0, TB_NN_ACT_GELU_ERF, TB_NN_HAS_BIAS},
        {3, {2, 129, 31}, 2, {7, 31}, 0, 1, TB_NN_ACT_NONE, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        {4, {2, 1, 9, 13}, 3, {3, 13, 5}, 0, 0, TB_NN_ACT_RELU, 0},
        {4, {2, 3, 13, 9}, 4, {2, 3, 5, 13}, 1, 1, TB_NN_ACT_NONE, TB_NN_HAS_RESIDUAL},
        {3, {5, 7, 3}, 3, {1, 3, 64}, 0, 0, TB_NN_ACT_TANH, TB_NN_HAS_BIAS},
        {1, {17}, 3, {2, 17, 6}, 0, 0, TB_NN_ACT_NONE, 0},
        {3, {2, 6, 17}, 1, {17}, 0, 0, TB_NN_ACT_NONE, 0},
        {3, {24, 64, 64}, 3, {24, 64, 64}, 0, 1, TB_NN_ACT_NONE, 0},
        {2, {1, 1}, 2, {1, 1}, 1, 1, TB_NN_ACT_SIGMOID, TB_NN_HAS_BIAS},
        /* small M (the GEMV kernel over a packed weight), a transposed A over one shared B */
        {3, {1, 1, 300}, 2, {300, 70}, 0, 0, TB_NN_ACT_NONE, TB_NN_HAS_BIAS},
        {2, {3, 257}, 2, {100, 257}, 0, 1, TB_NN_ACT_RELU, TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL},
        {3, {2, 13, 9}, 2, {13, 37}, 1, 0, TB_NN_ACT_NONE, TB_NN_HAS_RESIDUAL},
    };
    for (size_t c = 0; c < sizeof ms / sizeof ms[0]; c++) {
        tb_node n;
        memset(&n, 0, sizeof n);
        n.op = TB_OP_NN_MATMUL;
        n.i[0] = ms[c].ta;
        n.i[1] = ms[c].tb;
        n.i[2] = ms[c].act;
        n.i[3] = ms[c].flags;
        n.f[0] = c % 2 ? 0.0f : 0.125f;
        tb_view in[4];
        in[0] = mk(TB_F32, ms[c].ra, ms[c].a);
        in[1] = mk(TB_F32, ms[c].rb, ms[c].b);
        int k = 2;
        tb_op_shape sh;
        tb_node plain = n;
        plain.i[3] = 0;
        CHECK(tb_op_infer_views(&plain, in, 2, &sh) == TB_OK);
        int64_t N = ms[c].rb > 1 ? ms[c].b[ms[c].rb - (ms[c].tb ? 2 : 1)] : 1;
        if (ms[c].flags & TB_NN_HAS_BIAS) in[k++] = MK(TB_F32, N);
        if (ms[c].flags & TB_NN_HAS_RESIDUAL) in[k++] = mk(TB_F32, sh.rank[0], sh.dims[0]);
        /* expected: each output batch from the broadcast operands */
        tb_view o = {TB_F32, sh.rank[0], {0}, NULL};
        memcpy(o.dims, sh.dims[0], sizeof o.dims);
        int64_t cnt = tb_view_numel(&o);
        double *want = malloc(sizeof(double) * (size_t)cnt), *S = malloc(sizeof(double) * (size_t)cnt);
        int ra = ms[c].ra, rb = ms[c].rb;
        int64_t M = ra > 1 ? ms[c].a[ra - (ms[c].ta ? 1 : 2)] : 1, K = ra > 1 ? ms[c].a[ra - (ms[c].ta ? 2 : 1)] : ms[c].a[0];
        int nbo = o.rank - (ra > 1) - (rb > 1);
        int64_t nb = cnt / (M * N);
        for (int64_t ob = 0; ob < nb; ob++) {
            /* unravel ob over the output batch dims, then index each operand */
            int64_t idx[TB_MAX_RANK], t = ob;
            for (int d = nbo - 1; d >= 0; d--) { idx[d] = t % o.dims[d]; t /= o.dims[d]; }
            int64_t offa = 0, offb = 0;
            for (int d = 0; d < ra - 2; d++) {
                int od = d + nbo - (ra - 2);
                offa = offa * ms[c].a[d] + (ms[c].a[d] == 1 ? 0 : idx[od]);
            }
            for (int d = 0; d < rb - 2; d++) {
                int od = d + nbo - (rb - 2);
                offb = offb * ms[c].b[d] + (ms[c].b[d] == 1 ? 0 : idx[od]);
            }
            const float *A = (const float *)in[0].data + offa * M * K, *B = (const float *)in[1].data + offb * K * N;
            mat am = {A, ms[c].ta ? 1 : K, ms[c].ta ? M : 1};
            mat bm = {B, rb == 1 ? 0 : ms[c].tb ? 1 : N, rb == 1 ? 0 : ms[c].tb ? K : 1};
            if (rb == 1) bm = (mat){B, 1, 0};
            mat bi = {(ms[c].flags & TB_NN_HAS_BIAS) ? in[2].data : NULL, 0, 1};
            const float *res = (ms[c].flags & TB_NN_HAS_RESIDUAL) ? (const float *)in[k - 1].data + ob * M * N : NULL;
            gemm_expect(M, N, K, n.f[0] != 0.0f ? n.f[0] : 1.0, am, bm, bi, 1.0, res, n.i[2], 0, 0, n.i[3],
                        want + ob * M * N, S + ob * M * N);
        }
        for (int fast = 0; fast < 3; fast++) { /* fast 2: B a weight, packed once */
            tb_view out;
            if (run_node(&n, in, k, &out, fast, pool) != TB_OK) {
                CHECK_MSG(0, "matmul %zu: %s", c, tb_last_error());
                continue;
            }
            double e = worst(out.data, want, S, cnt), bound = fast ? 1e-5 : 1e-6;
            CHECK_MSG(e <= bound, "matmul case %zu (fast %d): error %.3g", c, fast, e);
            free(out.data);
        }
        free(want);
        free(S);
        free_views(in, k);
    }
}

static void test_sdpa(tb_pool *pool) {
    struct {
        int64_t B, H, S, T, D, Dv;
        int causal, kt, mk, mrank;
    } cs[] = {
        {1, 2, 5, 5, 8, 8, 0, 0, 0, 0},     {2, 3, 17, 17, 16, 8, 1, 0, 0, 0}, {1, 2, 70, 33, 64, 64, 0, 1, 1, 4},
        {2, 1, 9, 130, 7, 5, 0, 0, 2, 2},   {1, 4, 129, 129, 64, 64, 1, 1, 1, 2},
        {2, 2, 3, 6, 4, 4, 1, 0, 2, 4}, /* rows 0..: the bool mask may hide a whole row */
        {1, 3, 64, 200, 32, 16, 0, 1, 1, 2}, /* k stored (D, T), T not a multiple of 16, a 2-d mask */
        /* q, k, v over 4 MB: the next block prefetched (two query blocks a head, 130 = 128 + 2);
         * an odd case: the default scale 1/sqrt(D) */
        {4, 12, 130, 128, 64, 64, 0, 0, 1, 4},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        tb_node n;
        memset(&n, 0, sizeof n);
        n.op = TB_OP_SDPA;
        n.i[0] = cs[c].causal;
        n.i[1] = cs[c].kt;
        n.i[2] = cs[c].mk;
        n.f[0] = c % 2 ? 0.0f : 0.3f;
        int64_t B = cs[c].B, H = cs[c].H, S = cs[c].S, T = cs[c].T, D = cs[c].D, Dv = cs[c].Dv;
        tb_view in[4];
        in[0] = MK(TB_F32, B, H, S, D);
        in[1] = cs[c].kt ? MK(TB_F32, B, H, D, T) : MK(TB_F32, B, H, T, D);
        in[2] = MK(TB_F32, B, H, T, Dv);
        int k = 3;
        int64_t ms[4] = {0};
        if (cs[c].mk) {
            tb_dtype dt = cs[c].mk == 1 ? TB_F32 : TB_BOOL;
            in[k++] = cs[c].mrank == 4 ? mk(dt, 4, (const int64_t[]){B, 1, S, T}) : mk(dt, 2, (const int64_t[]){S, T});
            if (cs[c].mrank == 4) { ms[0] = S * T; ms[2] = T; ms[3] = 1; }
            else { ms[2] = T; ms[3] = 1; }
            if (dt == TB_BOOL)
                for (int64_t i = 0; i < tb_view_numel(&in[3]); i++)
                    ((uint8_t *)in[3].data)[i] = (uint8_t)(tb_test_frand(&rng) > -0.5f || c == 5 ? (i % 7 != 0) : 0);
            if (c == 5) /* one row hidden entirely */
                for (int64_t t = 0; t < T; t++) ((uint8_t *)in[3].data)[1 * T + t] = 0;
        }
        double scale = n.f[0] != 0.0f ? n.f[0] : 1.0 / sqrt((double)D);
        int64_t cnt = B * H * S * Dv;
        double *want = malloc(sizeof(double) * (size_t)cnt), *Sab = malloc(sizeof(double) * (size_t)cnt);
        double *p = malloc(sizeof(double) * (size_t)T);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t s = 0; s < S; s++) {
                    const float *q = (const float *)in[0].data + ((b * H + h) * S + s) * D;
                    const float *kk = (const float *)in[1].data + (b * H + h) * T * D;
                    const float *vv = (const float *)in[2].data + (b * H + h) * T * Dv;
                    double mx = -INFINITY, sum = 0;
                    for (int64_t t = 0; t < T; t++) {
                        double a = 0;
                        for (int64_t d = 0; d < D; d++) a += (double)q[d] * (cs[c].kt ? kk[d * T + t] : kk[t * D + d]);
                        a *= scale;
                        int64_t mo = b * ms[0] + s * ms[2] + t * ms[3];
                        if (cs[c].mk == 1) a += ((const float *)in[3].data)[mo];
                        if (cs[c].mk == 2 && !((const uint8_t *)in[3].data)[mo]) a = -INFINITY;
                        if (cs[c].causal && t > s) a = -INFINITY;
                        p[t] = a;
                        mx = a > mx ? a : mx;
                    }
                    for (int64_t t = 0; t < T; t++) sum += p[t] = mx == -INFINITY ? 0 : exp(p[t] - mx);
                    for (int64_t e = 0; e < Dv; e++) {
                        double a = 0, sa = 0;
                        for (int64_t t = 0; t < T; t++) {
                            a += p[t] * vv[t * Dv + e];
                            sa += p[t] * fabs(vv[t * Dv + e]);
                        }
                        int64_t o = ((b * H + h) * S + s) * Dv + e;
                        want[o] = sum > 0 ? a / sum : 0;
                        Sab[o] = sum > 0 ? sa / sum : 0;
                    }
                }
        for (int fast = 0; fast < 2; fast++) {
            tb_view out;
            if (run_node(&n, in, k, &out, fast, pool) != TB_OK) {
                CHECK_MSG(0, "sdpa %zu: %s", c, tb_last_error());
                continue;
            }
            /* the softmax weights carry the scores' rounding: bound 1e-5 on S */
            double e = worst(out.data, want, Sab, cnt), bound = fast ? 2e-5 : 1e-6;
            CHECK_MSG(e <= bound, "sdpa case %zu (fast %d): error %.3g", c, fast, e);
            free(out.data);
        }
        free(want);
        free(Sab);
        free(p);
        free_views(in, k);
    }
}

/* sdpa in the (B, S, H*D) layouts of opt/nn_merge.c (i[3] heads, i[4]
 * packed q | k | v): the CPU kernel, which reads them through strides,
 * against the reference kernel on the same views; v in [-1, 1], so every
 * output is a weighted mean of values in [-1, 1]: |d| <= 2e-5 (the bound of
 * test_sdpa with S <= 1). Cases: both layouts, each mask kind, causal, T
 * != S (heads only), and one over 4 MB (the next block's rows prefetched
 * through the layout's strides). */
static void test_sdpa_heads(tb_pool *pool) {
    struct {
        int64_t B, H, S, T, D, Dv;
        int packed, causal, mk, mrank;
    } cs[] = {
        {1, 2, 5, 5, 8, 8, 1, 0, 0, 0},      {2, 3, 17, 17, 16, 16, 1, 1, 1, 4}, {2, 2, 9, 33, 8, 4, 0, 0, 1, 4},
        {1, 4, 129, 129, 64, 64, 0, 1, 2, 2}, {2, 3, 20, 7, 16, 24, 0, 0, 2, 4},
        {4, 12, 130, 130, 64, 64, 1, 0, 1, 4}, /* BERT-base's shape at 130 tokens, 4.8 MB: prefetched */
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int64_t B = cs[c].B, H = cs[c].H, S = cs[c].S, T = cs[c].T, D = cs[c].D, Dv = cs[c].Dv;
        tb_node n;
        memset(&n, 0, sizeof n);
        n.op = TB_OP_SDPA;
        n.i[0] = cs[c].causal;
        n.i[2] = cs[c].mk;
        n.i[3] = (int32_t)H;
        n.i[4] = cs[c].packed;
        n.f[0] = c % 2 ? 0.0f : 0.3f;
        tb_view in[4];
        int k = 3;
        if (cs[c].packed) {
            in[0] = MK(TB_F32, B, S, 3 * H * D);
            in[1] = in[0];
            in[2] = in[0];
        } else {
            in[0] = MK(TB_F32, B, S, H * D);
            in[1] = MK(TB_F32, B, T, H * D);
            in[2] = MK(TB_F32, B, T, H * Dv);
        }
        if (cs[c].mk) {
            tb_dtype dt = cs[c].mk == 1 ? TB_F32 : TB_BOOL;
            in[k++] = cs[c].mrank == 4 ? mk(dt, 4, (const int64_t[]){B, 1, 1, T}) : mk(dt, 2, (const int64_t[]){S, T});
            if (dt == TB_BOOL)
                for (int64_t i = 0; i < tb_view_numel(&in[3]); i++) ((uint8_t *)in[3].data)[i] = (uint8_t)(i % 5 != 0);
        }
        tb_view ref, got;
        CHECK_MSG(run_node(&n, in, k, &ref, 0, NULL) == TB_OK, "sdpa heads %zu: %s", c, tb_last_error());
        tb_status st = run_node(&n, in, k, &got, 1, pool);
        CHECK_MSG(st == TB_OK, "sdpa heads %zu (fast): %s", c, tb_last_error());
        if (st == TB_OK) {
            double w = 0;
            int64_t cnt = B * S * H * Dv;
            CHECK(tb_view_numel(&got) == cnt);
            for (int64_t i = 0; i < cnt; i++) {
                double d = fabs((double)((float *)got.data)[i] - ((float *)ref.data)[i]);
                if (!(d <= w)) w = d;
            }
            CHECK_MSG(w <= 2e-5, "sdpa heads case %zu (packed %d): error %.3g", c, cs[c].packed, w);
            free(got.data);
        }
        free(ref.data);
        if (cs[c].packed) {
            free(in[0].data);
            if (k > 3) free(in[3].data);
        } else {
            free_views(in, k);
        }
    }
}

/* the vector activations of the epilogue against the double forms, over
 * [-20, 20] and at the extremes: |d| <= 4e-7 (1 + |y|); the erf GELU, whose
 * AVX-512 form (Abramowitz and Stegun 7.1.28, no exp) trades accuracy for
 * speed, |d| <= 1e-6 |x| (observed 8.3e-7 |x|, 4.9e-7 (1 + |y|)) */
static void test_activations(void) {
    enum { N = 4099 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = -20.0f + 40.0f * (float)i / (float)(N - 8);
    x[N - 7] = 0.0f; x[N - 6] = -0.0f; x[N - 5] = 1e-30f; x[N - 4] = -1e-6f; x[N - 3] = 88.0f; x[N - 2] = -90.0f;
    x[N - 1] = 1e30f;
    for (int act = TB_NN_ACT_NONE; act <= TB_NN_ACT_TANH; act++) {
        memcpy(y, x, sizeof x);
        tb_cpu_sgemm_epi e = {0};
        e.act = act;
        e.p0 = -1.5f;
        e.p1 = 2.5f;
        tb_cpu_nn_epilogue(y, N, 1, N, &e);
        double w = 0;
        int at = 0;
        for (int i = 0; i < N; i++) {
            double want = tb_nn_act_apply((tb_nn_act)act, x[i], e.p0, e.p1);
            double d = act == TB_NN_ACT_GELU_ERF ? fabs(y[i] - want) / (1e-30 + fabs(x[i]))
                                                 : fabs(y[i] - want) / (1.0 + fabs(want));
            if (!(d <= w)) { w = d; at = i; }
        }
        double bound = act == TB_NN_ACT_GELU_ERF ? 1e-6 : 4e-7;
        CHECK_MSG(w <= bound, "activation %d: error %.3g at x = %g (%g)", act, w, x[at], y[at]);
    }
}

int main(int argc, char **argv) {
    const char *mask = getenv("TB_CPU_MASK");
    char fs[128];
    tb_cpu_features_str(tb_cpu_features(), fs, sizeof fs);
    printf("test_nn_conv: cpu features [%s]\n", fs);
    tb_pool *pool = NULL;
    CHECK(tb_pool_create(2, &pool) == TB_OK);
    if (!mask) {
        test_schema();
        test_shapes();
        test_ref_hand();
    }
    test_activations();
    test_sgemm(NULL, 0);
    test_sgemm(pool, 0);
    test_sgemm(NULL, 1);
    test_sgemm(pool, 1);
    test_conv_random(pool);
    test_conv_random(NULL);
    test_gemm_matmul(pool);
    test_sdpa(pool);
    test_sdpa_heads(pool);
    test_sdpa_heads(NULL);
    tb_pool_free(pool);
    if (!mask && argc >= 1) {
        /* the AVX2 and generic kernels: the same program with features masked */
        static const char *masks[] = {"3", "0"};
        for (int i = 0; i < 2; i++) {
            char cmd[4200];
            snprintf(cmd, sizeof cmd, "TB_CPU_MASK=%s '%s'", masks[i], argv[0]);
            int rc = system(cmd);
            CHECK_MSG(rc == 0, "with TB_CPU_MASK=%s: exit %d", masks[i], rc);
        }
    }
    return tb_test_finish(mask ? "test_nn_conv (masked)" : "test_nn_conv");
}
