/*
 * test_onnx_int8.c — the INT8 ops of general graphs (ir/nn_quant.c,
 * backend/cpu/nn_quant.c, opt/nn_quant.c):
 *   - QConv / QGemm reference kernels against an independent double loop
 *     over the dequantized operands (DQ(Q(x)) * DQ(w) + bias, epilogue):
 *     |d| <= 1e-6 (S + 1e-3), S = sum |terms| + |bias| + |residual|;
 *   - the CPU kernels (the direct int8 conv on AVX-512 VNNI; igemm, im2row,
 *     the (pixels, M) -> NCHW epilogue elsewhere and under the masks below)
 *     against the reference on odd shapes, strides, pads and zero points:
 *     the integer sums are exact, so |d| <= 1e-5 (S + 1e-3);
 *   - QuantizeLinear / DequantizeLinear references per tensor and per axis
 *     against hand-computed values (round half to even, saturation);
 *   - the INT8 pass on a Conv (+ bias, relu) and a MatMul (+ bias, residual)
 *     graph, run by the reference interpreter before and after on random
 *     inputs, with the activation scale of the input's max: every output
 *     within the rounding bound of the quantization,
 *       |d| <= s_x / 2 sum_k |w_k| + s_w / 2 sum_k |x_k| + s_x s_w K / 4
 *     (no clipping: the scale covers the input), and the nodes are QConv /
 *     QGemm afterwards.
 * The program runs itself again with TB_CPU_MASK=3 (AVX2) and 0 (portable
 * C) so each int8 GEMM path runs under the kernels.
 */
#include <math.h>

#include "backend/cpu/nn.h"
#include "ir/interp.h"
#include "opt/opt.h"
#include "tb_test.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static int qcode(float x, float s, int z) {
    float v = nearbyintf(x * (1.0f / s)) + (float)z;
    return v < 0 ? 0 : v > 255 ? 255 : (int)v;
}

static tb_view view(tb_dtype dt, int rank, const int64_t *dims, void *data) {
    tb_view v;
    memset(&v, 0, sizeof v);
    v.dtype = dt;
    v.rank = rank;
    memcpy(v.dims, dims, sizeof(int64_t) * (size_t)rank);
    v.data = data;
    return v;
}

static double act(int a, double v) { return a == TB_NN_ACT_RELU ? (v > 0 ? v : 0) : v; }

/* ---------------------------------------------------------------- QConv */

static void check_qconv(tb_pool *pool, int n_img, int C, int H, int W, int M, int k, int stride, int pad, int zero,
                        int with_bias, int with_res, int a) {
    int oh = (H + 2 * pad - k) / stride + 1, ow = (W + 2 * pad - k) / stride + 1;
    int64_t xd[4] = {n_img, C, H, W}, wd[4] = {M, C, k, k}, sd[1] = {M}, yd[4] = {n_img, M, oh, ow};
    size_t nx = (size_t)n_img * C * H * W, nw = (size_t)M * C * k * k, ny = (size_t)n_img * M * oh * ow;
    float *x = malloc(nx * 4), *ws = malloc((size_t)M * 4), *b = malloc((size_t)M * 4), *res = malloc(ny * 4);
    float *yr = malloc(ny * 4), *yc = malloc(ny * 4);
    int8_t *w = malloc(nw);
    float s = 0.013f;
    for (size_t i = 0; i < nx; i++) x[i] = frand(-1.2f, 1.4f);
    for (size_t i = 0; i < nw; i++) w[i] = (int8_t)((int)(urand() * 255) - 127);
    for (int m = 0; m < M; m++) ws[m] = frand(0.001f, 0.01f), b[m] = frand(-1, 1);
    for (size_t i = 0; i < ny; i++) res[i] = frand(-1, 1);
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = TB_OP_QCONV;
    n.i[1] = n.i[2] = stride;
    n.i[3] = n.i[4] = n.i[5] = n.i[6] = pad;
    n.i[10] = a;
    n.i[11] = (with_bias ? TB_NN_HAS_BIAS : 0) | (with_res ? TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL : 0);
    n.i[12] = zero;
    n.f[2] = s;
    tb_view in[5];
    int n_in = 0;
    in[n_in++] = view(TB_F32, 4, xd, x);
    in[n_in++] = view(TB_I8, 4, wd, w);
    in[n_in++] = view(TB_F32, 1, sd, ws);
    if (with_bias) in[n_in++] = view(TB_F32, 1, sd, b);
    if (with_res) in[n_in++] = view(TB_F32, 4, yd, res);
    n.n_in = n_in;
    tb_view outr = view(TB_F32, 4, yd, yr), outc = view(TB_F32, 4, yd, yc);
    CHECK(tb_op_check_attrs(&n) == TB_OK);
    CHECK(tb_op_get_def(TB_OP_QCONV)->ref(&n, in, n_in, &outr, 1) == TB_OK);
    tb_cpu_nn_ctx ctx = {.pool = pool};
    CHECK(tb_cpu_nn_run(&ctx, &n, in, n_in, &outc, 1) == TB_OK);
    CHECK(tb_cpu_nn_run(&ctx, &n, in, n_in, &outc, 1) == TB_OK); /* again, scratch warm */
    tb_cpu_nn_ctx_release(&ctx);
    double worst_ref = 0, worst_cpu = 0;
    for (int bi = 0; bi < n_img; bi++)
        for (int m = 0; m < M; m++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double acc = 0, S = 0;
                    for (int c = 0; c < C; c++)
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                int iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                                double xq = (qcode(x[(((size_t)bi * C + c) * H + iy) * W + ix], s, zero) - zero) *
                                            (double)s;
                                double t = xq * (w[(((size_t)m * C + c) * k + ky) * k + kx] * (double)ws[m]);
                                acc += t;
                                S += fabs(t);
                            }
                    size_t o = (((size_t)bi * M + m) * oh + oy) * ow + ox;
                    if (with_bias) acc += b[m], S += fabs(b[m]);
                    if (with_res) acc += res[o], S += fabs(res[o]);
                    double want = act(a, acc);
                    worst_ref = fmax(worst_ref, fabs(yr[o] - want) / (S + 1e-3));
                    worst_cpu = fmax(worst_cpu, fabs(yc[o] - yr[o]) / (S + 1e-3));
                }
    CHECK_MSG(worst_ref <= 1e-6, "QConv ref %dx%dx%dx%d M %d k %d s %d p %d z %d: %g", n_img, C, H, W, M, k, stride,
              pad, zero, worst_ref);
    CHECK_MSG(worst_cpu <= 1e-5, "QConv cpu %dx%dx%dx%d M %d k %d s %d p %d z %d: %g", n_img, C, H, W, M, k, stride,
              pad, zero, worst_cpu);
    free(x), free(ws), free(b), free(res), free(yr), free(yc), free(w);
}

/* ---------------------------------------------------------------- QGemm */

static void check_qgemm(tb_pool *pool, int B, int T, int K, int N, int zero, int with_bias, int with_res, int a) {
    int64_t xd[3] = {B, T, K}, wd[2] = {N, K}, sd[1] = {N}, yd[3] = {B, T, N};
    size_t M = (size_t)B * T;
    float *x = malloc(M * K * 4), *ws = malloc((size_t)N * 4), *b = malloc((size_t)N * 4), *res = malloc(M * N * 4);
    float *yr = malloc(M * N * 4), *yc = malloc(M * N * 4);
    int8_t *w = malloc((size_t)N * K);
    float s = 0.021f;
    for (size_t i = 0; i < M * K; i++) x[i] = frand(-2.0f, 2.5f);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (int8_t)((int)(urand() * 255) - 127);
    for (int j = 0; j < N; j++) ws[j] = frand(-0.01f, 0.01f), b[j] = frand(-1, 1);
    for (size_t i = 0; i < M * N; i++) res[i] = frand(-1, 1);
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = TB_OP_QGEMM;
    n.i[0] = a;
    n.i[1] = (with_bias ? TB_NN_HAS_BIAS : 0) | (with_res ? TB_NN_HAS_RESIDUAL : 0);
    n.i[2] = zero;
    n.f[0] = s;
    tb_view in[5];
    int n_in = 0;
    in[n_in++] = view(TB_F32, 3, xd, x);
    in[n_in++] = view(TB_I8, 2, wd, w);
    in[n_in++] = view(TB_F32, 1, sd, ws);
    if (with_bias) in[n_in++] = view(TB_F32, 1, sd, b);
    if (with_res) in[n_in++] = view(TB_F32, 3, yd, res);
    n.n_in = n_in;
    tb_view outr = view(TB_F32, 3, yd, yr), outc = view(TB_F32, 3, yd, yc);
    CHECK(tb_op_check_attrs(&n) == TB_OK);
    CHECK(tb_op_get_def(TB_OP_QGEMM)->ref(&n, in, n_in, &outr, 1) == TB_OK);
    tb_cpu_nn_ctx ctx = {.pool = pool};
    CHECK(tb_cpu_nn_run(&ctx, &n, in, n_in, &outc, 1) == TB_OK);
    tb_cpu_nn_ctx_release(&ctx);
    double worst_ref = 0, worst_cpu = 0;
    for (size_t i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0, S = 0;
            for (int k = 0; k < K; k++) {
                double t = (qcode(x[i * K + k], s, zero) - zero) * (double)s * (w[(size_t)j * K + k] * (double)ws[j]);
                acc += t;
                S += fabs(t);
            }
            if (with_bias) acc += b[j], S += fabs(b[j]);
            double want = act(a, acc);
            if (with_res) want += res[i * N + j], S += fabs(res[i * N + j]);
            worst_ref = fmax(worst_ref, fabs(yr[i * N + j] - want) / (S + 1e-3));
            worst_cpu = fmax(worst_cpu, fabs(yc[i * N + j] - yr[i * N + j]) / (S + 1e-3));
        }
    CHECK_MSG(worst_ref <= 1e-6, "QGemm ref %dx%dx%d N %d z %d: %g", B, T, K, N, zero, worst_ref);
    CHECK_MSG(worst_cpu <= 1e-5, "QGemm cpu %dx%dx%d N %d z %d: %g", B, T, K, N, zero, worst_cpu);
    free(x), free(ws), free(b), free(res), free(yr), free(yc), free(w);
}

/* ---------------------------------------------------------------- Q / DQ */

static void check_qdq_ref(void) {
    /* x (2, 3), per-axis scale on axis 1, int8 zero points */
    float x[6] = {0.25f, -1.0f, 3.0f, 0.75f, 200.0f, -0.5f};
    float sc[3] = {0.5f, 0.5f, 2.0f};
    int8_t zp[3] = {0, 1, -2};
    int8_t y[6];
    int64_t xd[2] = {2, 3}, pd[1] = {3};
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = TB_OP_QUANTIZE_LINEAR;
    n.n_in = 3;
    n.i[0] = 1;
    tb_view in[3] = {view(TB_F32, 2, xd, x), view(TB_F32, 1, pd, sc), view(TB_I8, 1, pd, zp)};
    tb_view out = view(TB_I8, 2, xd, y);
    CHECK(tb_op_get_def(TB_OP_QUANTIZE_LINEAR)->ref(&n, in, 3, &out, 1) == TB_OK);
    /* 0.25/0.5 = 0.5 -> 0 (half to even); -1/0.5 = -2, +1 -> -1; 3/2 = 1.5 -> 2, -2 -> 0;
     * 0.75/0.5 = 1.5 -> 2; 200/0.5 = 400 + 1 -> 127 (saturated); -0.5/2 = -0.25 -> 0, -2 -> -2 */
    const int8_t want[6] = {0, -1, 0, 2, 127, -2};
    for (int i = 0; i < 6; i++) CHECK_MSG(y[i] == want[i], "Q[%d] = %d, want %d", i, y[i], want[i]);
    float d[6];
    n.op = TB_OP_DEQUANTIZE_LINEAR;
    tb_view din[3] = {view(TB_I8, 2, xd, y), view(TB_F32, 1, pd, sc), view(TB_I8, 1, pd, zp)};
    tb_view dout = view(TB_F32, 2, xd, d);
    CHECK(tb_op_get_def(TB_OP_DEQUANTIZE_LINEAR)->ref(&n, din, 3, &dout, 1) == TB_OK);
    const float dw[6] = {0.0f, -1.0f, 4.0f, 1.0f, 63.0f, 0.0f};
    for (int i = 0; i < 6; i++) CHECK_MSG(d[i] == dw[i], "DQ[%d] = %g, want %g", i, d[i], dw[i]);
    /* uint8, per tensor, no zero point: clamps at 0 */
    uint8_t u[6];
    memset(&n, 0, sizeof n);
    n.op = TB_OP_QUANTIZE_LINEAR;
    n.n_in = 2;
    n.i[1] = TB_U8;
    int64_t one[1] = {1};
    tb_view uin[2] = {view(TB_F32, 2, xd, x), view(TB_F32, 1, one, sc)};
    tb_view uout = view(TB_U8, 2, xd, u);
    CHECK(tb_op_get_def(TB_OP_QUANTIZE_LINEAR)->ref(&n, uin, 2, &uout, 1) == TB_OK);
    const uint8_t uw[6] = {0, 0, 6, 2, 255, 0};
    for (int i = 0; i < 6; i++) CHECK_MSG(u[i] == uw[i], "Q u8[%d] = %d, want %d", i, u[i], uw[i]);
}

/* ---------------------------------------------------------------- the pass */

static float max_abs(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* g: one node of op over input x (xr, xd) and weight w, with bias (and a
 * residual input for MatMul); runs before and after the pass. */
static void check_pass(int conv) {
    tb_graph *g = tb_graph_new();
    int64_t xd[4], wd[4], bd[1];
    int xr, wr, K, N;
    if (conv) {
        int64_t a[4] = {2, 16, 9, 7}, b[4] = {24, 16, 3, 3};
        memcpy(xd, a, sizeof a), memcpy(wd, b, sizeof b);
        xr = wr = 4, K = 16 * 9, N = 24;
    } else {
        int64_t a[3] = {3, 5, 40}, b[2] = {40, 24};
        memcpy(xd, a, sizeof a), memcpy(wd, b, sizeof b);
        xr = 3, wr = 2, K = 40, N = 24;
    }
    bd[0] = N;
    size_t nx = 1, nw = 1;
    for (int d = 0; d < xr; d++) nx *= (size_t)xd[d];
    for (int d = 0; d < wr; d++) nw *= (size_t)wd[d];
    float *w = malloc(nw * 4), *b = malloc((size_t)N * 4), *x = malloc(nx * 4);
    for (size_t i = 0; i < nw; i++) w[i] = frand(-0.3f, 0.3f);
    for (int i = 0; i < N; i++) b[i] = frand(-0.5f, 0.5f);
    for (size_t i = 0; i < nx; i++) x[i] = frand(-1.5f, 1.0f);
    int xv = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, xr, xd);
    g->inputs[g->n_inputs++] = xv;
    int wv = tb_graph_add_weight(g, "w", TB_F32, wr, wd, w, 1);
    int bv = tb_graph_add_weight(g, "b", TB_F32, 1, bd, b, 1);
    int32_t ia[TB_NODE_INTS] = {0};
    float fa[TB_NODE_FLOATS] = {0};
    int ins[4] = {xv, wv, bv, -1}, n_in = 3;
    const char *nm = "y";
    int k;
    int64_t yd[4];
    if (conv) {
        ia[3] = ia[4] = ia[5] = ia[6] = 1;
        ia[10] = TB_NN_ACT_RELU;
        ia[11] = TB_NN_HAS_BIAS;
        k = tb_graph_add_node_ex(g, TB_OP_CONV, ins, n_in, &nm, 1, ia, fa);
    } else {
        int64_t rd[3] = {3, 5, 24};
        float *r = malloc(sizeof(float) * 3 * 5 * 24);
        for (int i = 0; i < 3 * 5 * 24; i++) r[i] = frand(-1, 1);
        ins[n_in++] = tb_graph_add_weight(g, "res", TB_F32, 3, rd, r, 1);
        ia[3] = TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL;
        k = tb_graph_add_node_ex(g, TB_OP_NN_MATMUL, ins, n_in, &nm, 1, ia, fa);
    }
    CHECK(k >= 0);
    if (k < 0) { tb_graph_free(g); free(x); return; }
    g->outputs[g->n_outputs++] = g->nodes[k].out[0];
    tb_view in = view(TB_F32, xr, xd, x), before, after;
    CHECK(tb_interp_run(g, &in, 1, &before, 1) == TB_OK);
    memcpy(yd, before.dims, sizeof yd);
    /* the input's scale: its max over 127 (zero point 128), no clipping */
    float sx = max_abs(x, nx) / 127.0f;
    tb_nn_act_quant aq;
    memset(&aq, 0, sizeof aq);
    snprintf(aq.tensor, sizeof aq.tensor, "x");
    aq.scale = sx;
    aq.zero = 128;
    tb_nn_quant_options q = {&aq, 1, NULL, 0};
    tb_opt_options oo;
    memset(&oo, 0, sizeof oo);
    snprintf(oo.device, sizeof oo.device, "cpu");
    oo.nn_quant = &q;
    tb_pass p = {"quantize-int8", tb_opt_quantize_nn, ""};
    /* per-channel weight scales, for the bound (before the pass replaces w) */
    float *sw = malloc((size_t)N * 4);
    for (int j = 0; j < N; j++) {
        float m = 0;
        for (int kk = 0; kk < K; kk++) m = fmaxf(m, fabsf(conv ? w[(size_t)j * K + kk] : w[(size_t)kk * N + j]));
        sw[j] = m / 127.0f;
    }
    float *wc = malloc(nw * 4);
    memcpy(wc, w, nw * 4);
    CHECK(tb_opt_run(g, &p, 1, &oo) == TB_OK);
    int nq = 0;
    for (int i = 0; i < g->n_nodes; i++) nq += g->nodes[i].op == (conv ? TB_OP_QCONV : TB_OP_QGEMM);
    CHECK_MSG(nq == 1, "%s: %d quantized nodes after the pass", conv ? "Conv" : "MatMul", nq);
    CHECK(tb_interp_run(g, &in, 1, &after, 1) == TB_OK);
    /* bound per output element from the f32 operands */
    double worst = 0;
    size_t ny = 1;
    for (int d = 0; d < before.rank; d++) ny *= (size_t)before.dims[d];
    const float *yb = before.data, *ya = after.data;
    for (size_t o = 0; o < ny; o++) {
        int j;
        double sum_w = 0, sum_x = 0;
        if (conv) {
            int64_t oh = yd[2], ow = yd[3], ox = (int64_t)(o % (size_t)ow), oy = (int64_t)(o / (size_t)ow % (size_t)oh);
            int64_t bi = (int64_t)(o / (size_t)(ow * oh * N));
            j = (int)(o / (size_t)(ow * oh) % (size_t)N);
            for (int c = 0; c < 16; c++)
                for (int ky = 0; ky < 3; ky++)
                    for (int kx = 0; kx < 3; kx++) {
                        int64_t iy = oy - 1 + ky, ix = ox - 1 + kx;
                        if (iy < 0 || iy >= xd[2] || ix < 0 || ix >= xd[3]) continue;
                        sum_w += fabs(wc[(((size_t)j * 16 + c) * 3 + ky) * 3 + kx]);
                        sum_x += fabs(x[(((size_t)bi * 16 + c) * xd[2] + iy) * xd[3] + ix]);
                    }
        } else {
            j = (int)(o % (size_t)N);
            size_t row = o / (size_t)N;
            for (int kk = 0; kk < K; kk++) {
                sum_w += fabs(wc[(size_t)kk * N + j]);
                sum_x += fabs(x[row * K + kk]);
            }
        }
        double bound = sx / 2 * sum_w + sw[j] / 2 * sum_x + sx * sw[j] * K / 4 + 1e-5;
        worst = fmax(worst, fabs(ya[o] - yb[o]) / bound);
    }
    CHECK_MSG(worst <= 1.0, "%s: int8 error %.3g of the bound", conv ? "Conv" : "MatMul", worst);
    printf("pass %s: worst error %.3f of the quantization bound\n", conv ? "Conv" : "MatMul", worst);
    tb_interp_free_outputs(&before, 1);
    tb_interp_free_outputs(&after, 1);
    tb_graph_free(g);
    free(x), free(sw), free(wc);
}

int main(int argc, char **argv) {
    (void)argc;
    const char *mask = getenv("TB_CPU_MASK");
    tb_pool *pool = NULL;
    CHECK(tb_pool_create(2, &pool) == TB_OK);
    check_qdq_ref();
    /* shapes: 1x1 direct, 3x3 padded, strided, the odd ones */
    check_qconv(pool, 2, 16, 7, 5, 24, 1, 1, 0, 128, 1, 0, TB_NN_ACT_RELU);
    check_qconv(pool, 1, 19, 9, 11, 33, 3, 1, 1, 0, 1, 1, TB_NN_ACT_RELU);
    check_qconv(pool, 2, 8, 10, 10, 16, 3, 2, 1, 77, 0, 0, TB_NN_ACT_NONE);
    check_qconv(pool, 1, 5, 13, 6, 7, 5, 2, 2, 255, 1, 0, TB_NN_ACT_NONE);
    check_qconv(pool, 1, 4, 4, 4, 3, 1, 2, 0, 3, 1, 1, TB_NN_ACT_RELU);
    /* ResNet's: the stem (3 colours, 7x7 / 2), a residual block conv over
     * several 8-channel blocks and a map narrower than a vector */
    check_qconv(pool, 2, 3, 20, 18, 16, 7, 2, 3, 128, 1, 0, TB_NN_ACT_RELU);
    check_qconv(pool, 1, 64, 7, 7, 72, 3, 1, 1, 0, 1, 1, TB_NN_ACT_RELU);
    check_qgemm(pool, 2, 7, 37, 19, 128, 1, 0, TB_NN_ACT_RELU);
    check_qgemm(pool, 1, 65, 130, 70, 0, 1, 1, TB_NN_ACT_NONE);
    check_qgemm(pool, 3, 1, 64, 8, 200, 0, 1, TB_NN_ACT_RELU);
    check_pass(1);
    check_pass(0);
    tb_pool_free(pool);
    /* the int8 GEMM's other paths on this machine: AVX2 without AVX-512
     * (TB_CPU_MASK=3) and the portable C (0) */
    if (!mask) {
        const char *masks[2] = {"3", "0"};
        for (int i = 0; i < 2; i++) {
            char cmd[4200];
            snprintf(cmd, sizeof cmd, "TB_CPU_MASK=%s '%s'", masks[i], argv[0]);
            int rc = system(cmd);
            CHECK_MSG(rc == 0, "TB_CPU_MASK=%s run failed (%d)", masks[i], rc);
        }
    }
    printf("%d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
