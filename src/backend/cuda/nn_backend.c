/*
 * nn_backend.c — the CUDA backend's general ops (ops_nn.def): which nodes it
 * runs (tbn_supports) and how (tbn_run_node), over the run's views
 * (tb_step.views: concrete dims, host copies of host inputs) and the device
 * buffers bufs[].
 *
 * Values a kernel needs as numbers (shapes, axes, starts, Clip bounds,
 * Range's scalars, ConstantOfShape's value, Trilu's k, Resize's scales) are
 * read from the views' host data, never from device memory. Shapes and
 * strides go to the kernels by value, so a run captured into a CUDA graph
 * replays exactly while the views and buffers stay the same.
 *
 * Matmuls (MatMul, Gemm, Conv as im2col or 1x1 GEMM) run on cuBLAS with f32
 * accumulation: f32 operands in full f32 (no TF32: the handle's default math
 * mode), f16 operands on the tensor cores. The fused epilogue (bias, beta,
 * activation, residual) is one elementwise pass after the product; with an
 * f16 output the product lands in an f32 scratch first, so the epilogue
 * rounds once.
 */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/nn_backend.h"
#include "ir/nn_shape.h"
#include "tune/tune_cache.h"

#include <cublas_v2.h>

#define NEEDR(cond, ...) do { if (!(cond)) return tb_errorf(TB_ERR_UNSUPPORTED, __VA_ARGS__); } while (0)

static tb_status cu_fail(cudaError_t e, const char *what) {
    return tb_errorf(TB_ERR_INTERNAL, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CU(call, what)                                                                                        \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) return cu_fail(e_, what);                                                      \
    } while (0)

/* ---------------------------------------------------------------- host helpers */

static size_t dt_size(tb_dtype t) {
    switch (t) {
    case TB_F32: case TB_I32: return 4;
    case TB_F16: case TB_BF16: return 2;
    case TB_I64: case TB_F64: return 8;
    default: return 1;
    }
}
static int dt_float(tb_dtype t) { return t == TB_F32 || t == TB_F16 || t == TB_BF16 || t == TB_F64; }
static int dt_int(tb_dtype t) { return t == TB_I64 || t == TB_I32 || t == TB_I8 || t == TB_U8; }
static int dt_plain(tb_dtype t) { return dt_float(t) || dt_int(t) || t == TB_BOOL; }
static int dt_act(tb_dtype t) { return t == TB_F32 || t == TB_F16 || t == TB_BF16; } /* float math on device */
static int dt_mm(tb_dtype t) { return t == TB_F32 || t == TB_F16; }                  /* cuBLAS operands      */

static int64_t numel(const tb_view *v) {
    int64_t n = 1;
    for (int d = 0; d < v->rank; d++) n *= v->dims[d];
    return n;
}

static int64_t prod(const int64_t *d, int r) {
    int64_t n = 1;
    for (int i = 0; i < r; i++) n *= d[i];
    return n;
}

static float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 31) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else {
        e = 113;
        while (!(m & 1024)) { m <<= 1; e--; }
        u = s | (e << 23) | ((m & 1023) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* element i of host data as double / int64 */
static double hget_f(const tb_view *v, int64_t i) {
    const void *p = v->data;
    switch (v->dtype) {
    case TB_F32: return ((const float *)p)[i];
    case TB_F64: return ((const double *)p)[i];
    case TB_F16: return half_to_float(((const uint16_t *)p)[i]);
    case TB_BF16: { uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16; float f; memcpy(&f, &u, 4); return f; }
    case TB_I64: return (double)((const int64_t *)p)[i];
    case TB_I32: return ((const int32_t *)p)[i];
    case TB_I8: return ((const int8_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static int64_t hget_i(const tb_view *v, int64_t i) {
    const void *p = v->data;
    switch (v->dtype) {
    case TB_I64: return ((const int64_t *)p)[i];
    case TB_I32: return ((const int32_t *)p)[i];
    case TB_I8: return ((const int8_t *)p)[i];
    case TB_U8: case TB_BOOL: return ((const uint8_t *)p)[i];
    default: {
        double x = hget_f(v, i);
        return x != x ? 0 : x >= 9.2e18 ? INT64_MAX : x <= -9.2e18 ? INT64_MIN : (int64_t)x;
    }
    }
}

static void strides_of(const int64_t *d, int r, int64_t *st) {
    int64_t s = 1;
    for (int i = r - 1; i >= 0; i--) { st[i] = s; s *= d[i]; }
}

/* ---------------------------------------------------------------- context */

static tb_status grow(tbn_ctx *x, void **p, size_t *have, size_t need, const char *what) {
    if (need <= *have) return TB_OK;
    size_t cap = need + need / 4;
    if (*p) {
        /* the stream's work may still read the old buffer */
        CU(cudaStreamSynchronize(x->stream), what);
        cudaFree(*p);
    }
    *p = NULL;
    *have = 0;
    CU(cudaMalloc(p, cap), what);
    *have = cap;
    x->grew = 1; /* captured graphs point at the old buffer */
    return TB_OK;
}

tb_status tbn_grow(tbn_ctx *x, void **p, size_t *have, size_t need, const char *what) {
    return grow(x, p, have, need, what);
}

void tbn_ctx_free(tbn_ctx *x) {
    if (!x) return;
    tbn_cudnn_free(x);
    tbn_layout_free(x);
    cudaFree(x->lx);
    cudaFree(x->ly);
    cudaFree(x->lr);
    x->lx = x->ly = x->lr = NULL;
    x->lx_bytes = x->ly_bytes = x->lr_bytes = 0;
    if (x->lt) cublasLtDestroy(x->lt);
    x->lt = NULL;
    cudaFree(x->lt_ws);
    x->lt_ws = NULL;
    cudaFree(x->acc);
    cudaFree(x->col);
    x->acc = x->col = NULL;
    free(x->lt_picks);
    x->lt_picks = NULL;
    x->n_lt_picks = x->cap_lt_picks = 0;
    free(x->lt_known);
    x->lt_known = NULL;
    x->n_lt_known = x->cap_lt_known = 0;
    x->tune_cache = 0;
    x->acc_bytes = x->col_bytes = 0;
}

/* ---------------------------------------------------------------- supports */

static const tb_value *val(const tb_graph *g, const tb_node *n, int k) { return &g->values[n->in[k]]; }

int tbn_supports(const tb_graph *g, const tb_node *n) {
    if (!tb_op_is_nn(n->op)) return 0;
    tb_dtype t0 = n->n_in > 0 ? val(g, n, 0)->dtype : TB_F32;
    tb_dtype to = g->values[n->out[0]].dtype;
    switch (n->op) {
    case TB_OP_SIGMOID: case TB_OP_TANH: case TB_OP_EXP: case TB_OP_LOG: case TB_OP_SQRT: case TB_OP_RECIPROCAL:
    case TB_OP_ERF: case TB_OP_FLOOR: case TB_OP_CEIL: case TB_OP_GELU: case TB_OP_SOFTMAX:
    case TB_OP_LAYERNORM: case TB_OP_BATCHNORM: case TB_OP_GLOBAL_AVGPOOL: case TB_OP_AVGPOOL:
        return dt_act(t0) && n->n_out == 1; /* LayerNormalization's mean / inv_std_dev: not on the GPU */
    case TB_OP_MAXPOOL:
        return dt_act(t0) || t0 == TB_I8 || t0 == TB_U8;
    case TB_OP_RELU: case TB_OP_NEG: case TB_OP_ABS: case TB_OP_CLIP:
        return dt_act(t0) || dt_int(t0);
    case TB_OP_NOT: case TB_OP_AND: case TB_OP_OR:
        return t0 == TB_BOOL;
    case TB_OP_NN_ADD: case TB_OP_SUB: case TB_OP_MUL: case TB_OP_DIV: case TB_OP_POW: case TB_OP_EQUAL:
    case TB_OP_LESS: case TB_OP_LESS_OR_EQUAL: case TB_OP_GREATER: case TB_OP_GREATER_OR_EQUAL: {
        tb_dtype t1 = val(g, n, 1)->dtype;
        return (dt_act(t0) || dt_int(t0) || t0 == TB_BOOL) && (dt_act(t1) || dt_int(t1) || t1 == TB_BOOL);
    }
    case TB_OP_REDUCE_MEAN: case TB_OP_REDUCE_SUM: case TB_OP_REDUCE_MAX:
        return dt_plain(t0) && t0 != TB_BOOL;
    case TB_OP_RESIZE:
        return n->i[0] == TB_NN_RESIZE_NEAREST ? dt_plain(t0) : dt_act(t0);
    case TB_OP_CONV: case TB_OP_GEMM: case TB_OP_NN_MATMUL: case TB_OP_SDPA: {
        if (!dt_mm(t0) || val(g, n, 1)->dtype != t0 || !dt_mm(to)) return 0;
        if (n->op == TB_OP_SDPA) {
            if (val(g, n, 2)->dtype != t0) return 0;
            const tb_value *q = val(g, n, 0), *v = val(g, n, 2);
            if (n->i[3] > 0) { /* heads layout: widths H*D (packed 3*H*D) */
                int64_t h = n->i[3] * (n->i[4] ? 3 : 1), qw = q->dims[2], vw = n->i[4] ? qw : v->dims[2];
                return q->rank == 3 && (qw < 0 || qw / h <= 256) && (vw < 0 || vw / h <= 128);
            }
            if (q->rank >= 1 && q->dims[q->rank - 1] >= 0 && q->dims[q->rank - 1] > 256) return 0;
            if (v->rank >= 1 && v->dims[v->rank - 1] >= 0 && v->dims[v->rank - 1] > 128) return 0;
            return 1;
        }
        for (int k = 2; k < n->n_in; k++)
            if (!dt_mm(val(g, n, k)->dtype)) return 0;
        return 1;
    }
    case TB_OP_RANGE:
        return t0 == TB_F32 || t0 == TB_F64 || t0 == TB_I32 || t0 == TB_I64;
    default: /* data movement, Cast, Where, Identity, Shape, ConstantOfShape, Trilu: any plain dtype */
        return dt_plain(to);
    }
}

/* ---------------------------------------------------------------- elementwise */

static int ew_op(tb_op_kind k) {
    switch (k) {
    case TB_OP_RELU: return TBN_RELU;
    case TB_OP_SIGMOID: return TBN_SIGMOID;
    case TB_OP_TANH: return TBN_TANH;
    case TB_OP_EXP: return TBN_EXP;
    case TB_OP_LOG: return TBN_LOG;
    case TB_OP_NEG: return TBN_NEG;
    case TB_OP_ABS: return TBN_ABS;
    case TB_OP_SQRT: return TBN_SQRT;
    case TB_OP_RECIPROCAL: return TBN_RECIP;
    case TB_OP_ERF: return TBN_ERF;
    case TB_OP_FLOOR: return TBN_FLOOR;
    case TB_OP_CEIL: return TBN_CEIL;
    case TB_OP_NOT: return TBN_NOT;
    case TB_OP_CLIP: return TBN_CLIP;
    case TB_OP_GELU: return TBN_GELU;
    case TB_OP_NN_ADD: return TBN_ADD;
    case TB_OP_SUB: return TBN_SUB;
    case TB_OP_MUL: return TBN_MUL;
    case TB_OP_DIV: return TBN_DIV;
    case TB_OP_POW: return TBN_POW;
    case TB_OP_EQUAL: return TBN_EQ;
    case TB_OP_LESS: return TBN_LT;
    case TB_OP_LESS_OR_EQUAL: return TBN_LE;
    case TB_OP_GREATER: return TBN_GT;
    case TB_OP_GREATER_OR_EQUAL: return TBN_GE;
    case TB_OP_AND: return TBN_AND;
    case TB_OP_OR: return TBN_OR;
    case TB_OP_WHERE: return TBN_WHERE;
    default: return -1;
    }
}

/* How input x is read while walking output o (tbn_ew_args.mode). */
static void ew_input(tbn_ew_args *a, int k, const tb_view *x, const tb_view *o) {
    int r = o->rank, lead = r - x->rank;
    int64_t xd[TBN_MAX_RANK];
    for (int d = 0; d < r; d++) xd[d] = d < lead ? 1 : x->dims[d - lead];
    int64_t s = 1;
    for (int d = r - 1; d >= 0; d--) {
        a->st[k][d] = xd[d] == 1 ? 0 : s;
        s *= xd[d];
    }
    int64_t n = numel(x);
    if (n == a->n) { a->mode[k] = TBN_IDX_FLAT; return; }
    if (n == 1) { a->mode[k] = TBN_IDX_SCALAR; return; }
    /* x == o over dims [d0, r) and 1 before: i % P */
    int d0 = r;
    while (d0 > 0 && xd[d0 - 1] == o->dims[d0 - 1]) d0--;
    int ones = 1;
    for (int d = 0; d < d0; d++) ones &= xd[d] == 1;
    if (ones) { a->mode[k] = TBN_IDX_MOD; a->p[k] = prod(o->dims + d0, r - d0); return; }
    /* x == o over dims [0, d1) and 1 after: i / Q */
    int d1 = 0;
    while (d1 < r && xd[d1] == o->dims[d1]) d1++;
    ones = 1;
    for (int d = d1; d < r; d++) ones &= xd[d] == 1;
    if (ones) { a->mode[k] = TBN_IDX_DIV; a->p[k] = prod(o->dims + d1, r - d1); return; }
    a->mode[k] = TBN_IDX_STRIDED;
}

static tb_status run_elementwise(tbn_ctx *x, const tb_node *n, const tb_view *in, const tb_view *o,
                                 const void *const *ib, void *ob) {
    tbn_ew_args a;
    memset(&a, 0, sizeof a);
    a.op = ew_op(n->op);
    a.n = numel(o);
    a.rank = o->rank;
    a.odt = o->dtype;
    memcpy(a.dims, o->dims, sizeof(int64_t) * (size_t)o->rank);
    int nd = n->op == TB_OP_WHERE ? 3 : a.op >= TBN_ADD ? 2 : 1;
    a.n_in = nd;
    for (int k = 0; k < nd; k++) {
        a.dt[k] = in[k].dtype;
        ew_input(&a, k, &in[k], o);
    }
    if (n->op == TB_OP_GELU) a.attr = n->i[0];
    if (n->op == TB_OP_CLIP) {
        a.lo = -INFINITY, a.hi = INFINITY;
        a.ilo = INT64_MIN, a.ihi = INT64_MAX;
        for (int k = 1; k < n->n_in && k < 3; k++) {
            const tb_view *b = &in[k];
            if (numel(b) == 0) continue;
            NEEDR(b->data, "Clip: %s is not known on the host", k == 1 ? "min" : "max");
            double f = hget_f(b, 0);
            int64_t iv = dt_float(b->dtype) ? (k == 1 ? (int64_t)ceil(f) : (int64_t)floor(f)) : hget_i(b, 0);
            if (k == 1) { a.lo = f; a.ilo = iv; }
            else { a.hi = f; a.ihi = iv; }
        }
    }
    CU(tbn_elementwise(&a, ib, ob, x->stream), "elementwise launch");
    return TB_OK;
}

/* ---------------------------------------------------------------- normalisation, reductions */

static tb_status run_layernorm(tbn_ctx *x, const tb_node *n, const tb_view *in, int n_in, const tb_view *o,
                               const void *const *ib, void *ob) {
    const tb_view *xv = &in[0];
    int axis = n->i[0];
    tbn_ln_args a;
    memset(&a, 0, sizeof a);
    a.rows = prod(xv->dims, axis);
    a.D = prod(xv->dims + axis, xv->rank - axis);
    a.dt = xv->dtype;
    a.eps = n->f[0];
    a.nr = xv->rank - axis;
    memcpy(a.nd, xv->dims + axis, sizeof(int64_t) * (size_t)a.nr);
    for (int k = 1; k < n_in && k < 3; k++) {
        const tb_view *p = &in[k];
        int64_t pn = numel(p);
        int mode = pn == a.D ? 0 : pn == 1 ? 1 : 2;
        if (k == 1) { a.sdt = p->dtype; a.smode = mode; a.sr = p->rank; memcpy(a.sd, p->dims, sizeof a.sd); }
        else { a.bdt = p->dtype; a.bmode = mode; a.br = p->rank; memcpy(a.bd, p->dims, sizeof a.bd); }
    }
    CU(tbn_layernorm(&a, ib[0], ib[1], n_in > 2 ? ib[2] : NULL, ob, x->stream), "layernorm launch");
    (void)o;
    return TB_OK;
}

/* the reduced axes (ir/nn_elem.c tb_nn_reduce_axes) */
static tb_status reduce_mask(const tb_node *n, const tb_view *in, int n_in, uint32_t *mask) {
    int r = in[0].rank;
    uint32_t m = (uint32_t)n->i[1];
    int empty = m == 0;
    if (n_in > 1) {
        const tb_view *a = &in[1];
        int64_t k = numel(a);
        NEEDR(a->data || k == 0, "%s: axes are not known on the host", tb_op_name(n->op));
        for (int64_t i = 0; i < k; i++) {
            int64_t ax = hget_i(a, i);
            NEEDR(ax >= -r && ax < r, "%s: axis %lld of a rank-%d x", tb_op_name(n->op), (long long)ax, r);
            m |= 1u << (ax < 0 ? ax + r : ax);
        }
        empty = k == 0;
    }
    if (empty) m = n->i[2] ? 0 : (r ? (1u << r) - 1 : 0);
    *mask = m;
    return TB_OK;
}

static tb_status run_reduce(tbn_ctx *x, const tb_node *n, const tb_view *in, int n_in, const tb_view *o,
                            const void *const *ib, void *ob) {
    uint32_t m = 0;
    TB_TRY(reduce_mask(n, in, n_in, &m));
    const tb_view *xv = &in[0];
    tbn_reduce_args a;
    memset(&a, 0, sizeof a);
    a.op = n->op == TB_OP_REDUCE_MEAN ? 0 : n->op == TB_OP_REDUCE_SUM ? 1 : 2;
    a.xdt = xv->dtype;
    a.ydt = o->dtype;
    int64_t st[TB_MAX_RANK];
    strides_of(xv->dims, xv->rank, st);
    a.nout = a.nred = 1;
    for (int d = 0; d < xv->rank; d++) {
        if (m >> d & 1) { a.rd[a.nr] = xv->dims[d]; a.rs[a.nr++] = st[d]; a.nred *= xv->dims[d]; }
        else { a.kd[a.nk] = xv->dims[d]; a.ks[a.nk++] = st[d]; a.nout *= xv->dims[d]; }
    }
    if (a.nred == 1 && o->dtype == xv->dtype) { /* nothing reduced: a copy */
        CU(cudaMemcpyAsync(ob, ib[0], (size_t)numel(o) * dt_size(o->dtype), cudaMemcpyDeviceToDevice, x->stream),
           "reduce copy");
        return TB_OK;
    }
    NEEDR(a.nout <= 0x7fffffff, "%s: %lld outputs", tb_op_name(n->op), (long long)a.nout);
    CU(tbn_reduce(&a, ib[0], ob, x->stream), "reduce launch");
    return TB_OK;
}

/* ---------------------------------------------------------------- matmuls */

/* Row-major Y (M, N) [batch] = op(A) (M, K) op(B) (K, N) with f32
 * accumulation; A stored (M, K) or (K, M) with ta, B (K, N) or (N, K) with
 * tb; strides between batches in elements. Y in ydt (f32 or f16). */
static tb_status gemm(tbn_ctx *x, int64_t M, int64_t N, int64_t K, int ta, int tb, const void *A, int64_t sA,
                      const void *B, int64_t sB, tb_dtype adt, void *Y, int64_t sY, tb_dtype ydt, int64_t batch,
                      float alpha) {
    if (M <= 0 || N <= 0 || batch <= 0) return TB_OK;
    NEEDR(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX, "matmul of %lld x %lld x %lld", (long long)M,
          (long long)N, (long long)K);
    float beta = 0.0f;
    if (K == 0) { /* nothing to sum: zeros */
        CU(cudaMemsetAsync(Y, 0, (size_t)(M * N * batch) * dt_size(ydt), x->stream), "matmul zeros");
        return TB_OK;
    }
    cudaDataType_t at = adt == TB_F16 ? CUDA_R_16F : CUDA_R_32F, yt = ydt == TB_F16 ? CUDA_R_16F : CUDA_R_32F;
    int ldb = (int)(tb ? K : N), lda = (int)(ta ? M : K);
    cublasStatus_t bs = cublasGemmStridedBatchedEx(
        x->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, B,
        at, ldb, (long long)sB, A, at, lda, (long long)sA, &beta, Y, yt, (int)N, (long long)sY, (int)batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return tb_errorf(TB_ERR_INTERNAL, "cublas: matmul %lld x %lld x %lld (batch %lld) failed (status %d)",
                         (long long)M, (long long)N, (long long)K, (long long)batch, (int)bs);
    return TB_OK;
}

/* ---- cuBLASLt: the product and its epilogue in one kernel where the
 * epilogue is one cuBLASLt has: D = act(alpha op(A) op(B) + C + bias) with
 * C the residual (beta 1), bias along the output's columns, act none, relu
 * or the tanh form of gelu, everything in the output's dtype. */

#define TBN_LT_WS ((size_t)32 << 20)

typedef struct {
    const void *bias;        /* (N), the output's dtype, or NULL */
    const void *res;         /* (M, N) per batch, or NULL        */
    int act;                 /* TB_NN_ACT_NONE / RELU / GELU_TANH */
} lt_epi;

/* ---- the algorithm of each cuBLASLt product, timed once per shape
 *
 * cuBLASLt's first heuristic pick need not be its fastest for a given shape
 * (on the H200, BERT-base f16: 1% of the engine's time at batch 8, nothing at
 * batch 1, in 2026-12-01's runs): of the first TBN_LT_CAND candidates (a
 * candidate must beat the earlier ones by 3%), each is timed as
 * the engine runs it, replayed from a CUDA graph of 5 products (eager timing
 * would measure the host: a product takes ~5 us on the GPU), into a scratch
 * output (the real output may be the residual), and the fastest is kept for
 * that shape (lt_picks). Ties keep the heuristic's order. TB_CUDA_LT_TUNE=0:
 * the first candidate, untimed. A shape first seen while capturing takes the
 * first candidate and is not remembered. Each timed pick is also kept on
 * disk (tune/tune_cache.h: the file of this GPU, driver and cuBLASLt, as
 * the LLM's picks are), and a later process takes it from there untimed:
 * records "nn K3 K2 K1 K0 IDX", the shape's 64-bit key in 16-bit pieces
 * (most significant first) and the pick's index in the heuristic's list. */
#define TBN_LT_CAND 24

static uint64_t lt_key(int64_t M, int64_t N, int64_t K, int ta, int tb, tb_dtype dt, int64_t batch, int64_t sA,
                       int64_t sB, int epi, int res) {
    uint64_t v[11] = {(uint64_t)M, (uint64_t)N, (uint64_t)K, (uint64_t)ta, (uint64_t)tb, (uint64_t)dt,
                      (uint64_t)batch, (uint64_t)sA, (uint64_t)sB, (uint64_t)epi, (uint64_t)res};
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 11; i++) {
        h ^= v[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0x100000001b3ull;
    }
    return h;
}

static int lt_picks_grow(tbn_ctx *x) {
    int nc = x->cap_lt_picks ? 2 * x->cap_lt_picks : 32;
    void *p = realloc(x->lt_picks, sizeof *x->lt_picks * (size_t)nc);
    if (!p) return 0;
    x->lt_picks = p;
    x->cap_lt_picks = nc;
    return 1;
}

/* the key's pieces and index of a record, checked before use */
static void lt_known_add(tbn_ctx *x, uint64_t key, int idx) {
    for (int i = 0; i < x->n_lt_known; i++)
        if (x->lt_known[i].key == key) return;
    if (x->n_lt_known == x->cap_lt_known) {
        int nc = x->cap_lt_known ? 2 * x->cap_lt_known : 32;
        void *p = realloc(x->lt_known, sizeof *x->lt_known * (size_t)nc);
        if (!p) return;
        x->lt_known = p;
        x->cap_lt_known = nc;
    }
    x->lt_known[x->n_lt_known].key = key;
    x->lt_known[x->n_lt_known].idx = idx;
    x->n_lt_known++;
}

static void lt_cache_record(void *user, const int *v) {
    for (int i = 0; i < 4; i++)
        if (v[i] < 0 || v[i] > 0xffff) return;
    if (v[4] < 0 || v[4] >= TBN_LT_CAND) return;
    lt_known_add(user, ((uint64_t)v[0] << 48) | ((uint64_t)v[1] << 32) | ((uint64_t)v[2] << 16) | (uint64_t)v[3], v[4]);
}

/* Bump when lt_key or the descriptors gemm_lt makes change. */
#define TBN_LT_PLAN_VERSION 1

/* Opens this device's file of general-engine picks (once). */
static void lt_cache_open(tbn_ctx *x) {
    x->tune_cache = -1;
    int dev = 0, drv = 0;
    struct cudaDeviceProp pr;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&pr, dev) != cudaSuccess ||
        cudaDriverGetVersion(&drv) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    snprintf(x->tune_ident, sizeof x->tune_ident,
             "cuda-nn gpu=%s cc=%d.%d sms=%d driver=%d cublasLt=%zu cand=%d ws=%zu plan=%d", pr.name, pr.major,
             pr.minor, pr.multiProcessorCount, drv, cublasLtGetVersion(), TBN_LT_CAND, TBN_LT_WS, TBN_LT_PLAN_VERSION);
    if (!tb_tune_cache_open(x->tune_ident, x->tune_path, sizeof x->tune_path, "nn", 5, lt_cache_record, x,
                            "general-engine cuBLASLt picks"))
        return;
    x->tune_cache = 1;
}

static int lt_tune_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("TB_CUDA_LT_TUNE");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* the index of the fastest of h[0, n) (-1 when untimed or on any failure:
 * the caller takes the first) */
static int lt_time(tbn_ctx *x, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                   cublasLtMatrixLayout_t lc, const cublasLtMatmulHeuristicResult_t *h, int n, float alpha,
                   float beta, const void *A, const void *B, const void *res, int64_t ybytes) {
    if (n < 2 || !lt_tune_on()) return -1;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(x->stream, &cs);
    if (cs != cudaStreamCaptureStatusNone) return -1;
    /* the scratch output: the f32 product scratch, grown eagerly here */
    if (grow(x, (void **)&x->acc, &x->acc_bytes, (size_t)ybytes + 256, "matmul scratch") != TB_OK) {
        cudaGetLastError();
        return -1;
    }
    void *D = x->acc;
    const void *C = res ? res : D;
    cudaEvent_t a = NULL, b = NULL;
    int best = -1;
    float best_ms = -1;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) goto done;
    for (int i = 0; i < n; i++) {
        if (h[i].state != CUBLAS_STATUS_SUCCESS || h[i].workspaceSize > TBN_LT_WS) continue;
        /* one eager product first: a candidate that refuses is skipped */
        if (cublasLtMatmul(x->lt, op, &alpha, B, la, A, lb, &beta, C, lc, D, lc, &h[i].algo, x->lt_ws, TBN_LT_WS,
                           x->stream) != CUBLAS_STATUS_SUCCESS)
            continue;
        cudaGraph_t gr = NULL;
        cudaGraphExec_t ge = NULL;
        float ms = -1;
        if (cudaStreamSynchronize(x->stream) == cudaSuccess &&
            cudaStreamBeginCapture(x->stream, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
            int okc = 1;
            for (int r = 0; r < 5 && okc; r++)
                okc = cublasLtMatmul(x->lt, op, &alpha, B, la, A, lb, &beta, C, lc, D, lc, &h[i].algo, x->lt_ws,
                                     TBN_LT_WS, x->stream) == CUBLAS_STATUS_SUCCESS;
            cudaError_t ce = cudaStreamEndCapture(x->stream, &gr);
            if (okc && ce == cudaSuccess && gr && cudaGraphInstantiate(&ge, gr, 0) == cudaSuccess &&
                cudaGraphLaunch(ge, x->stream) == cudaSuccess && cudaEventRecord(a, x->stream) == cudaSuccess &&
                cudaGraphLaunch(ge, x->stream) == cudaSuccess && cudaEventRecord(b, x->stream) == cudaSuccess &&
                cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&ms, a, b) == cudaSuccess)
                ms /= 5;
            else
                ms = -1;
        }
        cudaGetLastError();
        if (ge) cudaGraphExecDestroy(ge);
        if (gr) cudaGraphDestroy(gr);
        if (ms < 0) { /* the capture failed: keep the heuristic's choice */
            best = -1;
            break;
        }
        if (best_ms < 0 || ms < best_ms * 0.97f) { best = i; best_ms = ms; }
    }
done:
    cudaGetLastError();
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    return best;
}

/* 1: done; 0: not for cuBLASLt (the caller runs the plain path);
 * an error only when the launch itself failed */
static int gemm_lt(tbn_ctx *x, int64_t M, int64_t N, int64_t K, int ta, int tb, const void *A, int64_t sA,
                   const void *B, int64_t sB, tb_dtype dt, void *Y, int64_t batch, float alpha, const lt_epi *e,
                   tb_status *st) {
    *st = TB_OK;
    if (x->lt_off || M <= 0 || N <= 0 || K <= 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return 0;
    if (!x->lt) {
        const char *le = getenv("TB_CUDA_LT");
        if (le && !strcmp(le, "0")) { x->lt_off = 1; return 0; }
        if (cublasLtCreate(&x->lt) != CUBLAS_STATUS_SUCCESS) { x->lt = NULL; x->lt_off = 1; return 0; }
    }
    if (!x->lt_ws) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(x->stream, &cs);
        if (cs != cudaStreamCaptureStatusNone) return 0; /* no allocation inside a capture */
        if (cudaMalloc(&x->lt_ws, TBN_LT_WS) != cudaSuccess) { cudaGetLastError(); x->lt_ws = NULL; x->lt_off = 1; return 0; }
    }
    cudaDataType_t ty = dt == TB_F16 ? CUDA_R_16F : CUDA_R_32F;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int done = 0;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (e->act == TB_NN_ACT_RELU) epi = e->bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (e->act == TB_NN_ACT_GELU_TANH) epi = e->bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (e->bias) epi = CUBLASLT_EPILOGUE_BIAS;
    /* column-major: D (N, M) = op(Bs) (N, K) op(As) (K, M), as gemm() */
    int64_t rows_a = tb ? K : N, cols_a = tb ? N : K, rows_b = ta ? M : K, cols_b = ta ? K : M;
    int32_t bt = (int32_t)batch;
    int64_t sD = M * N;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto out;
    if (cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) ||
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb) ||
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi))
        goto out;
    if (e->bias) {
        int32_t bty = ty;
        if (cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->bias, sizeof e->bias) ||
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bty, sizeof bty))
            goto out;
    }
    if (cublasLtMatrixLayoutCreate(&la, ty, (uint64_t)rows_a, (uint64_t)cols_a, rows_a) ||
        cublasLtMatrixLayoutCreate(&lb, ty, (uint64_t)rows_b, (uint64_t)cols_b, rows_b) ||
        cublasLtMatrixLayoutCreate(&lc, ty, (uint64_t)N, (uint64_t)M, N))
        goto out;
    if (batch > 1) {
        if (cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bt, sizeof bt) ||
            cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sB, sizeof sB) ||
            cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bt, sizeof bt) ||
            cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sA, sizeof sA) ||
            cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bt, sizeof bt) ||
            cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sD, sizeof sD))
            goto out;
    }
    size_t ws = TBN_LT_WS;
    if (cublasLtMatmulPreferenceCreate(&pref) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))
        goto out;
    float beta = e->res ? 1.0f : 0.0f;
    uint64_t key = lt_key(M, N, K, ta, tb, dt, batch, sA, sB, epi, e->res != NULL);
    const cublasLtMatmulAlgo_t *algo = NULL;
    for (int i = 0; i < x->n_lt_picks && !algo; i++)
        if (x->lt_picks[i].key == key) algo = &x->lt_picks[i].algo;
    cublasLtMatmulHeuristicResult_t h[TBN_LT_CAND];
    if (!algo) {
        int nres = 0;
        if (cublasLtMatmulAlgoGetHeuristic(x->lt, op, la, lb, lc, lc, pref, TBN_LT_CAND, h, &nres) !=
                CUBLAS_STATUS_SUCCESS || nres < 1)
            goto out;
        int best = -1;
        if (nres > 1 && lt_tune_on()) { /* a pick kept on disk by an earlier process */
            if (x->tune_cache == 0) lt_cache_open(x);
            for (int i = 0; i < x->n_lt_known && best < 0; i++)
                if (x->lt_known[i].key == key) best = x->lt_known[i].idx;
            if (best >= nres || (best >= 0 && (h[best].state != CUBLAS_STATUS_SUCCESS ||
                                               h[best].workspaceSize > TBN_LT_WS)))
                best = -1;
        }
        if (best < 0) {
            const int timed = lt_time(x, op, la, lb, lc, h, nres, alpha, beta, A, B, e->res,
                                      M * N * batch * (dt == TB_F16 ? 2 : 4));
            best = timed < 0 ? 0 : timed;
            if (timed >= 0 && x->tune_cache > 0) {
                const int v[5] = {(int)(key >> 48), (int)((key >> 32) & 0xffff), (int)((key >> 16) & 0xffff),
                                  (int)(key & 0xffff), timed};
                if (tb_tune_cache_append(x->tune_path, x->tune_ident, "nn", 5, v) == 0) lt_known_add(x, key, timed);
            }
        }
        algo = &h[best].algo;
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(x->stream, &cs);
        if (cs == cudaStreamCaptureStatusNone && (x->n_lt_picks < x->cap_lt_picks || lt_picks_grow(x))) {
            x->lt_picks[x->n_lt_picks].key = key;
            x->lt_picks[x->n_lt_picks].algo = h[best].algo;
            x->n_lt_picks++;
        }
    }
    cublasStatus_t bs = cublasLtMatmul(x->lt, op, &alpha, B, la, A, lb, &beta, e->res ? e->res : Y, lc, Y, lc, algo,
                                       x->lt_ws, TBN_LT_WS, x->stream);
    /* a refusal (checked before anything is enqueued): the plain path */
    if (bs == CUBLAS_STATUS_NOT_SUPPORTED || bs == CUBLAS_STATUS_INVALID_VALUE) goto out;
    if (bs != CUBLAS_STATUS_SUCCESS)
        *st = tb_errorf(TB_ERR_INTERNAL, "cublasLt: matmul %lld x %lld x %lld failed (status %d)", (long long)M,
                        (long long)N, (long long)K, (int)bs);
    done = 1;
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    return done;
}

/* Whether the erf GELU of an f16 output may run as cuBLASLt's tanh form:
 * the two differ by at most 4.8e-4 (at x = 2.70, where the output 2.69 has
 * an f16 spacing of 2^-9 = 1.95e-3), below the output's own rounding
 * wherever |y| >= 0.25 and a few f16 ulps of the small tail values, while it
 * saves the f32 product, its round trip and one launch per FFN.
 * TB_CUDA_GELU_EXACT=1 keeps the erf form (the epilogue kernel). f32
 * outputs always keep it. */
static int gelu_tanh_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        const char *e = getenv("TB_CUDA_GELU_EXACT");
        ok = !(e && !strcmp(e, "1"));
    }
    return ok;
}

/* Whether epilogue e of an output of dtype dt is one cuBLASLt fuses. */
static int lt_epi_of(const tbn_epi_args *e, tb_dtype dt, lt_epi *l) {
    int act = e->act;
    if (act == TB_NN_ACT_GELU_ERF && dt == TB_F16 && gelu_tanh_ok()) act = TB_NN_ACT_GELU_TANH;
    if (act != TB_NN_ACT_NONE && act != TB_NN_ACT_RELU && act != TB_NN_ACT_GELU_TANH) return 0;
    if (e->bias && (e->bdt != (int)dt || e->beta != 1.0f || e->bs_m != 0 || e->bs_n != 1)) return 0;
    if (e->res && (e->rdt != (int)dt || (act != TB_NN_ACT_NONE && !e->after_res))) return 0;
    l->bias = e->bias;
    l->res = e->res;
    l->act = act;
    return 1;
}

/* The f32 buffer the product goes into before the epilogue: y itself when
 * y is f32, else the scratch. */
static tb_status acc_for(tbn_ctx *x, const tb_view *o, void *ob, float **acc) {
    if (o->dtype == TB_F32) { *acc = ob; return TB_OK; }
    TB_TRY(grow(x, (void **)&x->acc, &x->acc_bytes, (size_t)numel(o) * sizeof(float) + 256, "matmul scratch"));
    *acc = x->acc;
    return TB_OK;
}

static void epi_inputs(int flags, int n_in, int *bias, int *res) {
    int has_res = (flags & TB_NN_HAS_RESIDUAL) != 0;
    *res = has_res ? n_in - 1 : -1;
    *bias = n_in - has_res > 2 ? 2 : -1;
}

static tb_status run_epilogue(tbn_ctx *x, tbn_epi_args *e, const tb_view *o, const float *acc, void *ob) {
    int none = !e->bias && !e->res && !e->act;
    if (none && (void *)acc == ob) return TB_OK;
    e->n = numel(o);
    e->ydt = o->dtype;
    if (!e->bmod) e->bmod = INT64_MAX;
    if (!e->ncols) e->ncols = 1;
    CU(tbn_epilogue(e, acc, ob, x->stream), "epilogue launch");
    return TB_OK;
}

/* operand batch layout for MatMul: stride between batch matrices, or -1
 * when the operand's batch dims broadcast in a way strides cannot say */
static int64_t mm_batch_stride(const tb_view *v, int nb_out, const int64_t *obd, int64_t mat) {
    int nb = v->rank - 2;
    if (nb <= 0) return 0;
    int64_t nv = prod(v->dims, nb), no = prod(obd, nb_out);
    if (nv == 1) return 0;
    if (nv != no) return -1;
    return mat; /* same batch count and broadcast-compatible: the same dims */
}

static tb_status run_matmul(tbn_ctx *x, const tb_node *n, const tb_view *in, int n_in, const tb_view *o,
                            const void *const *ib, void *ob) {
    const tb_view *a = &in[0], *b = &in[1];
    int ta = a->rank > 1 && n->i[0], tb = b->rank > 1 && n->i[1], flags = n->i[3];
    int64_t M = a->rank > 1 ? a->dims[a->rank - (ta ? 1 : 2)] : 1;
    int64_t K = a->rank > 1 ? a->dims[a->rank - (ta ? 2 : 1)] : a->dims[0];
    int64_t N = b->rank > 1 ? b->dims[b->rank - (tb ? 2 : 1)] : 1;
    int rb = o->rank - (a->rank > 1) - (b->rank > 1);
    int64_t nbatch = prod(o->dims, rb);
    float alpha = n->f[0] != 0.0f ? n->f[0] : 1.0f;
    int bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    tbn_epi_args e;
    memset(&e, 0, sizeof e);
    e.act = n->i[2];
    e.p0 = n->f[2];
    e.p1 = n->f[3];
    e.after_res = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    e.beta = 1.0f;
    if (bi >= 0) { e.bias = ib[bi]; e.bdt = in[bi].dtype; e.ncols = N; e.bs_n = 1; }
    if (ri >= 0) { e.res = ib[ri]; e.rdt = in[ri].dtype; }
    int direct = !e.bias && !e.res && !e.act; /* the product is the output */
    int64_t sA = mm_batch_stride(a, rb, o->dims, M * K), sB = mm_batch_stride(b, rb, o->dims, K * N);
    lt_epi le;
    if (!direct && sA >= 0 && sB >= 0 && o->dtype == a->dtype && lt_epi_of(&e, o->dtype, &le)) {
        tb_status ls;
        int done = sB == 0 && !ta && sA == M * K && nbatch > 1
                       ? gemm_lt(x, M * nbatch, N, K, 0, tb, ib[0], 0, ib[1], 0, a->dtype, ob, 1, alpha, &le, &ls)
                       : gemm_lt(x, M, N, K, ta, tb, ib[0], sA, ib[1], sB, a->dtype, ob, nbatch, alpha, &le, &ls);
        if (done) return ls;
    }
    float *acc = NULL;
    if (!direct) TB_TRY(acc_for(x, o, ob, &acc));
    void *Y = direct ? ob : acc;
    tb_dtype ydt = direct ? o->dtype : TB_F32;
    if (sA >= 0 && sB >= 0) {
        if (sB == 0 && !ta && sA == M * K && nbatch > 1) /* b shared, a's rows contiguous: one tall product */
            TB_TRY(gemm(x, M * nbatch, N, K, 0, tb, ib[0], 0, ib[1], 0, a->dtype, Y, 0, ydt, 1, alpha));
        else
            TB_TRY(gemm(x, M, N, K, ta, tb, ib[0], sA, ib[1], sB, a->dtype, Y, M * N, ydt, nbatch, alpha));
    } else {
        /* general broadcasting of the batch dims: one product per batch */
        size_t es = dt_size(a->dtype), ys = dt_size(ydt);
        for (int64_t ob2 = 0; ob2 < nbatch; ob2++) {
            int64_t offs[2] = {0, 0};
            for (int side = 0; side < 2; side++) {
                const tb_view *v = side ? b : a;
                int nb = v->rank - 2;
                int64_t t = ob2, st = 1, off = 0;
                for (int d = rb - 1; d >= 0; d--) {
                    int64_t idx = t % o->dims[d];
                    t /= o->dims[d];
                    int sd = d - (rb - nb);
                    if (sd < 0) continue;
                    if (v->dims[sd] != 1) off += idx * st;
                    st *= v->dims[sd];
                }
                offs[side] = off;
            }
            TB_TRY(gemm(x, M, N, K, ta, tb, (const char *)ib[0] + (size_t)(offs[0] * M * K) * es, 0,
                        (const char *)ib[1] + (size_t)(offs[1] * K * N) * es, 0, a->dtype,
                        (char *)Y + (size_t)(ob2 * M * N) * ys, 0, ydt, 1, alpha));
        }
    }
    if (direct) return TB_OK;
    return run_epilogue(x, &e, o, acc, ob);
}

static tb_status run_gemm(tbn_ctx *x, const tb_node *n, const tb_view *in, int n_in, const tb_view *o,
                          const void *const *ib, void *ob) {
    int ta = n->i[0], tb = n->i[1], flags = n->i[3];
    int64_t M = o->dims[0], N = o->dims[1], K = in[0].dims[ta ? 0 : 1];
    int bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    tbn_epi_args e;
    memset(&e, 0, sizeof e);
    e.act = n->i[2];
    e.p0 = n->f[2];
    e.p1 = n->f[3];
    e.after_res = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    e.beta = n->f[1];
    if (bi >= 0) {
        const tb_view *c = &in[bi];
        int r = c->rank;
        int64_t cm = r == 2 ? c->dims[0] : 1, cn = r >= 1 ? c->dims[r - 1] : 1;
        e.bias = ib[bi];
        e.bdt = c->dtype;
        e.ncols = N;
        e.bs_n = cn == 1 ? 0 : 1;
        e.bs_m = cm == 1 ? 0 : cn;
    }
    if (ri >= 0) { e.res = ib[ri]; e.rdt = in[ri].dtype; }
    int direct = !e.bias && !e.res && !e.act;
    lt_epi le;
    if (!direct && o->dtype == in[0].dtype && lt_epi_of(&e, o->dtype, &le)) {
        tb_status ls;
        if (gemm_lt(x, M, N, K, ta, tb, ib[0], 0, ib[1], 0, in[0].dtype, ob, 1, n->f[0], &le, &ls)) return ls;
    }
    float *acc = NULL;
    if (!direct) TB_TRY(acc_for(x, o, ob, &acc));
    TB_TRY(gemm(x, M, N, K, ta, tb, ib[0], 0, ib[1], 0, in[0].dtype, direct ? ob : acc, 0,
                direct ? o->dtype : TB_F32, 1, n->f[0]));
    if (direct) return TB_OK;
    return run_epilogue(x, &e, o, acc, ob);
}

/* ONNX conv geometry of one axis (ir/nn_conv.c conv_axis) */
static int64_t conv_axis(int64_t in, int k, int s, int d, int autopad, int *pb, int *pe) {
    int64_t ek = (int64_t)(k - 1) * d + 1;
    if (autopad == TB_NN_PAD_SAME_UPPER || autopad == TB_NN_PAD_SAME_LOWER) {
        int64_t out = (in + s - 1) / s, total = (out - 1) * s + ek - in;
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

typedef struct {
    tbn_ctx *x;
    const tb_view *in, *o;
    const void *const *ib;
    void *ob;
    const tbn_conv_geom *g;
    int64_t M;
    int pb, pr, group;
    const tbn_epi_args *e;
} conv_im2col_args;

/* Conv as im2col (or a 1x1 GEMM, or the depthwise kernel) + cuBLAS + the
 * epilogue kernel */
static tb_status conv_im2col(void *arg) {
    const conv_im2col_args *c = arg;
    tbn_ctx *x = c->x;
    const tb_view *xv = &c->in[0], *o = c->o;
    const void *const *ib = c->ib;
    void *ob = c->ob;
    tbn_conv_geom g = *c->g;
    int64_t M = c->M;
    int pb = c->pb, pr = c->pr, group = c->group;
    int64_t cg = g.c / group, mg = M / group, ohw = g.oh * g.ow, kk = (int64_t)g.kh * g.kw;
    tbn_epi_args e = *c->e;
    float *acc;
    TB_TRY(acc_for(x, o, ob, &acc));
    if (cg == 1 && group == g.c && M % g.c == 0) {
        CU(tbn_depthwise(&g, M, ib[0], ib[1], xv->dtype, acc, x->stream), "depthwise conv launch");
    } else if (kk == 1 && g.sh == 1 && g.sw == 1 && !g.pt && !g.pl && !pb && !pr && group == 1) {
        /* 1x1: Y_b (M, HW) = W (M, C) X_b (C, HW) */
        TB_TRY(gemm(x, M, ohw, g.c, 0, 0, ib[1], 0, ib[0], g.c * ohw, xv->dtype, acc, M * ohw, TB_F32, g.n, 1.0f));
    } else {
        size_t es = dt_size(xv->dtype);
        size_t colb = (size_t)(g.n * g.c * kk * ohw) * es;
        TB_TRY(grow(x, &x->col, &x->col_bytes, colb + 256, "im2col scratch"));
        CU(tbn_im2col(&g, ib[0], x->col, x->stream), "im2col launch");
        for (int gi = 0; gi < group; gi++)
            TB_TRY(gemm(x, mg, ohw, cg * kk, 0, 0, (const char *)ib[1] + (size_t)(gi * mg * cg * kk) * es, 0,
                        (const char *)x->col + (size_t)(gi * cg * kk * ohw) * es, g.c * kk * ohw, xv->dtype,
                        acc + gi * mg * ohw, M * ohw, TB_F32, g.n, 1.0f));
    }
    return run_epilogue(x, &e, o, acc, ob);
}

/* (N, C, HW) <-> (N, HW, C), elements of es bytes */
static tb_status relayout(tbn_ctx *x, void *out, const void *in, int64_t n, int64_t c, int64_t hw, int es, int to_last) {
    int64_t od[3], st[3];
    if (to_last) { od[0] = n, od[1] = hw, od[2] = c; st[0] = c * hw, st[1] = 1, st[2] = hw; }
    else { od[0] = n, od[1] = c, od[2] = hw; st[0] = c * hw, st[1] = 1, st[2] = c; }
    CU(tbn_strided_copy(out, in, 3, od, st, 0, es, x->stream), "layout copy launch");
    return TB_OK;
}

/* A convolution whose x, y or residual the graph holds channels-last
 * (nn_layout.c) that cuDNN would not run: im2col over (N, C, H, W) copies,
 * its output copied back channels-last. */
static tb_status conv_held_im2col(conv_im2col_args *ca, int lay, int ri) {
    tbn_ctx *x = ca->x;
    const tbn_conv_geom *g = ca->g;
    const tb_view *xv = &ca->in[0], *o = ca->o;
    size_t es = dt_size(xv->dtype), xb = (size_t)numel(xv) * es, yb = (size_t)numel(o) * es;
    const void *ib2[TB_MAX_INPUTS];
    for (int k = 0; k < TB_MAX_INPUTS; k++) ib2[k] = ca->ib[k];
    if (lay & TBN_LAY_X) {
        TB_TRY(grow(x, &x->lx, &x->lx_bytes, xb, "layout scratch"));
        TB_TRY(relayout(x, x->lx, ca->ib[0], g->n, g->c, g->h * g->w, (int)es, 0));
        ib2[0] = x->lx;
    }
    if ((lay & TBN_LAY_R) && ri >= 0) {
        TB_TRY(grow(x, &x->lr, &x->lr_bytes, yb, "layout scratch"));
        TB_TRY(relayout(x, x->lr, ca->ib[ri], g->n, ca->M, g->oh * g->ow, (int)es, 0));
        ib2[ri] = x->lr;
    }
    tbn_epi_args e = *ca->e;
    if (ri >= 0) e.res = ib2[ri];
    conv_im2col_args c2 = *ca;
    c2.ib = ib2;
    c2.e = &e;
    if (!(lay & TBN_LAY_Y)) return conv_im2col(&c2);
    TB_TRY(grow(x, &x->ly, &x->ly_bytes, yb, "layout scratch"));
    c2.ob = x->ly;
    TB_TRY(conv_im2col(&c2));
    return relayout(x, ca->ob, x->ly, g->n, ca->M, g->oh * g->ow, (int)es, 1);
}

static tb_status run_conv(tbn_ctx *x, const tb_graph *gr, const tb_node *n, const tb_view *in, int n_in,
                          const tb_view *o, const void *const *ib, void *ob) {
    const tb_view *xv = &in[0], *wv = &in[1];
    const int32_t *at = n->i;
    int r4 = xv->rank == 4;
    NEEDR(xv->rank == 3 || xv->rank == 4, "Conv: rank %d", xv->rank);
    tbn_conv_geom g;
    memset(&g, 0, sizeof g);
    int group = at[0] > 0 ? at[0] : 1;
    g.n = xv->dims[0];
    g.c = xv->dims[1];
    g.h = r4 ? xv->dims[2] : 1;
    g.w = xv->dims[xv->rank - 1];
    int64_t M = wv->dims[0];
    g.kh = r4 ? (int)wv->dims[2] : 1;
    g.kw = (int)wv->dims[wv->rank - 1];
    g.sh = r4 && at[1] > 0 ? at[1] : 1;
    g.sw = at[2] > 0 ? at[2] : 1;
    g.dh = r4 && at[7] > 0 ? at[7] : 1;
    g.dw = at[8] > 0 ? at[8] : 1;
    int pt = r4 ? at[3] : 0, pb = r4 ? at[5] : 0, pl = at[4], pr = at[6];
    g.oh = conv_axis(g.h, g.kh, g.sh, g.dh, at[9], &pt, &pb);
    g.ow = conv_axis(g.w, g.kw, g.sw, g.dw, at[9], &pl, &pr);
    g.pt = pt;
    g.pl = pl;
    g.es = (int)dt_size(xv->dtype);
    NEEDR(g.oh == (r4 ? o->dims[2] : 1) && g.ow == o->dims[o->rank - 1], "Conv: output dims disagree");
    int64_t ohw = g.oh * g.ow;
    int flags = at[11], bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    tbn_epi_args e;
    memset(&e, 0, sizeof e);
    e.act = at[10];
    e.p0 = n->f[0];
    e.p1 = n->f[1];
    e.after_res = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    e.beta = 1.0f;
    if (bi >= 0) { e.bias = ib[bi]; e.bdt = in[bi].dtype; e.ncols = ohw; e.bs_m = 1; e.bmod = M; }
    if (ri >= 0) { e.res = ib[ri]; e.rdt = in[ri].dtype; }
    conv_im2col_args ca = {x, in, o, ib, ob, &g, M, pb, pr, group, &e};
    int lay = (tbn_nhwc(x, gr, n->in[0]) ? TBN_LAY_X : 0) | (tbn_nhwc(x, gr, n->out[0]) ? TBN_LAY_Y : 0) |
              (ri >= 0 && tbn_nhwc(x, gr, n->in[ri]) ? TBN_LAY_R : 0);
    int w_const = gr->values[n->in[1]].kind == TB_VAL_WEIGHT;
    tb_status ds;
    if (tbn_conv_cudnn(x, in, o, ib, ob, &g, M, pb, pr, group, &e, conv_im2col, &ca, lay, w_const, &ds)) return ds;
    if (lay) return conv_held_im2col(&ca, lay, ri);
    return conv_im2col(&ca);
}

/* ---- Transposes around sdpa, folded into its strides
 *
 * A model's attention reads q, k, v through Transposes of the projections'
 * (B, S, H, D) outputs (perm (0, 2, 1, 3); k also (0, 2, 3, 1), read as
 * k^T) and writes its (B, H, S, Dv) output through another into (B, S, H,
 * Dv). The f16 tensor-core kernel reads and writes through strides, so those
 * Transposes need not run: sdpa reads the Transpose's input and writes the
 * Transpose's output directly, and the Transpose nodes enqueue nothing. The
 * graph and its memory plan are unchanged, so this is done only where the
 * plan allows it, decided from the run's buffers (the same decision at the
 * Transpose and at the sdpa, and the same in a captured run): the source
 * a folded input Transpose would have read must keep its bytes until the
 * sdpa (no node in between writes over it), and the buffer a folded output
 * Transpose writes must not be read or written by sdpa's inputs or any node
 * in between. The Transpose's output must have no other reader and not be
 * a graph output (on the input side). TB_CUDA_FOLD_TRANSPOSE=0 turns it off. */

static int fold_off(void) {
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("TB_CUDA_FOLD_TRANSPOSE");
        off = e && !strcmp(e, "0");
    }
    return off;
}

static int node_index(const tb_graph *g, const tb_node *n) { return (int)(n - g->nodes); }

static int is_graph_output(const tb_graph *g, int v) {
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return 1;
    return 0;
}

/* the only node reading value v (index), or -1 when none or several */
static int sole_reader(const tb_graph *g, int v) {
    int r = -1;
    for (int k = 0; k < g->n_nodes; k++)
        for (int j = 0; j < g->nodes[k].n_in; j++)
            if (g->nodes[k].in[j] == v) {
                if (r >= 0 && r != k) return -1;
                r = k;
            }
    return r;
}

static int transpose_perm_is(const tb_graph *g, const tb_node *n, const tb_step *st, int a, int b, int c, int d) {
    if (n->op != TB_OP_TRANSPOSE || st->views[n->in[0]].rank != 4) return 0;
    (void)g;
    /* i[0..rank) the permutation, zeros after (tb_nn_transpose_perm) */
    for (int k = 4; k < TB_MAX_RANK && k < TB_NODE_INTS; k++)
        if (n->i[k]) return 0;
    return n->i[0] == a && n->i[1] == b && n->i[2] == c && n->i[3] == d;
}

typedef struct { uintptr_t lo, hi; } byte_range;

static byte_range range_of(const tb_step *st, void *const *bufs, int v) {
    const tb_view *w = &st->views[v];
    byte_range r = {(uintptr_t)bufs[v], (uintptr_t)bufs[v] + (uintptr_t)((size_t)numel(w) * dt_size(w->dtype))};
    return r;
}

static int overlap(byte_range a, byte_range b) { return a.lo < b.hi && b.lo < a.hi && a.lo < a.hi && b.lo < b.hi; }

/* whether node k reads or (writes: outputs only) touches range r */
static int node_touches(const tb_graph *g, const tb_step *st, void *const *bufs, int k, byte_range r, int reads) {
    const tb_node *n = &g->nodes[k];
    for (int o = 0; o < n->n_out; o++)
        if (overlap(range_of(st, bufs, n->out[o]), r)) return 1;
    if (reads)
        for (int j = 0; j < n->n_in; j++)
            if (overlap(range_of(st, bufs, n->in[j]), r)) return 1;
    return 0;
}

/* The sdpa's arguments as its inputs give them (no folding); 0 when the
 * node cannot run (the caller reports it). */
static int sdpa_args(const tb_node *n, const tb_view *in, int n_in, tbn_sdpa_args *a);

/* slot j (0 q, 1 k, 2 v) of sdpa node ks: the index of the Transpose whose
 * input it reads directly, or -1 */
static int fold_in(const tb_graph *g, void *const *bufs, const tb_step *st, int ks, int j) {
    const tb_node *sn = &g->nodes[ks];
    int v = sn->in[j], t = -1;
    for (int k = ks - 1; k >= 0 && t < 0; k--)
        for (int o = 0; o < g->nodes[k].n_out; o++)
            if (g->nodes[k].out[o] == v) { t = k; break; }
    if (t < 0) return -1;
    const tb_node *tn = &g->nodes[t];
    int kt = sn->i[1];
    int ok = transpose_perm_is(g, tn, st, 0, 2, 1, 3) ? !(j == 1 && kt) : j == 1 && kt && transpose_perm_is(g, tn, st, 0, 2, 3, 1);
    if (!ok || is_graph_output(g, v) || sole_reader(g, v) != ks) return -1;
    byte_range src = range_of(st, bufs, tn->in[0]);
    for (int k = t + 1; k < ks; k++)
        if (node_touches(g, st, bufs, k, src, 0)) return -1;
    return t;
}

/* the Transpose after sdpa node ks whose output it writes directly, or -1 */
static int fold_out(const tb_graph *g, void *const *bufs, const tb_step *st, int ks) {
    const tb_node *sn = &g->nodes[ks];
    int y = sn->out[0];
    if (is_graph_output(g, y)) return -1;
    int t = sole_reader(g, y);
    if (t <= ks || !transpose_perm_is(g, &g->nodes[t], st, 0, 2, 1, 3)) return -1;
    byte_range z = range_of(st, bufs, g->nodes[t].out[0]);
    for (int j = 0; j < sn->n_in; j++) {
        int f = j < 3 ? fold_in(g, bufs, st, ks, j) : -1;
        int src = f >= 0 ? g->nodes[f].in[0] : sn->in[j];
        if (overlap(range_of(st, bufs, src), z)) return -1;
    }
    for (int k = ks + 1; k < t; k++)
        if (node_touches(g, st, bufs, k, z, 1)) return -1;
    return t;
}

/* whether sdpa node ks runs on the kernel that reads strides */
static int sdpa_strided(const tb_graph *g, const tb_step *st, int ks) {
    const tb_node *n = &g->nodes[ks];
    if (fold_off() || n->n_in > TB_MAX_INPUTS || n->i[3] > 0) return 0; /* heads layout: no Transposes */
    tb_view in[TB_MAX_INPUTS];
    for (int k = 0; k < n->n_in; k++) in[k] = st->views[n->in[k]];
    if (in[0].rank != 4) return 0;
    tbn_sdpa_args a;
    if (!sdpa_args(n, in, n->n_in, &a)) return 0;
    return tbn_mha_f16_ok(&a);
}

/* Transpose node t (0, 2, 3, 1) giving sdpa node ks its k as (B, H, D, T)
 * where fold_in could not fold it: it runs as (0, 2, 1, 3) instead (the
 * last dim kept: a copy of 16-byte runs rather than a 2-d transpose) into the
 * same buffer, and the sdpa reads k as (B, H, T, D). The buffer has no other
 * reader. */
static int k_relaid(const tb_graph *g, void *const *bufs, const tb_step *st, int ks, int t) {
    const tb_node *sn = &g->nodes[ks];
    return sn->op == TB_OP_SDPA && sn->i[1] && sn->in[1] == g->nodes[t].out[0] &&
           transpose_perm_is(g, &g->nodes[t], st, 0, 2, 3, 1) && !is_graph_output(g, sn->in[1]) &&
           sole_reader(g, sn->in[1]) == ks && sdpa_strided(g, st, ks) && fold_in(g, bufs, st, ks, 1) < 0;
}

/* Transpose node n: 1 when a neighbouring sdpa reads its input or writes
 * its output itself (nothing to enqueue) */
static int transpose_folded(const tb_graph *g, const tb_node *n, void *const *bufs, const tb_step *st) {
    if (fold_off()) return 0;
    int t = node_index(g, n);
    /* input side: the sole reader of the output is an sdpa */
    int r = sole_reader(g, n->out[0]);
    if (r > t && g->nodes[r].op == TB_OP_SDPA && sdpa_strided(g, st, r))
        for (int j = 0; j < 3; j++)
            if (g->nodes[r].in[j] == n->out[0] && fold_in(g, bufs, st, r, j) == t) return 1;
    /* output side: the input is an sdpa's output */
    int v = n->in[0];
    for (int k = t - 1; k >= 0; k--) {
        const tb_node *p = &g->nodes[k];
        if (p->n_out < 1 || p->out[0] != v) continue;
        return p->op == TB_OP_SDPA && sdpa_strided(g, st, k) && fold_out(g, bufs, st, k) == t;
    }
    return 0;
}

static int sdpa_args(const tb_node *n, const tb_view *in, int n_in, tbn_sdpa_args *a) {
    const tb_view *q = &in[0], *v = &in[2];
    int r = q->rank;
    if (r != 3 && r != 4) return 0;
    memset(a, 0, sizeof *a);
    a->B = r == 4 ? q->dims[0] : 1;
    a->H = q->dims[r - 3];
    a->S = q->dims[r - 2];
    a->D = (int)q->dims[r - 1];
    a->T = v->dims[r - 2];
    a->Dv = (int)v->dims[r - 1];
    if (a->D > 256 || a->Dv > 128) return 0;
    a->dt = q->dtype;
    a->causal = n->i[0];
    a->k_t = n->i[1];
    a->mask_kind = n->i[2];
    a->scale = n->f[0] != 0.0f ? n->f[0] : (float)(1.0 / sqrt((double)a->D));
    if (a->mask_kind && n_in > 3) {
        const tb_view *m = &in[3];
        a->mdt = m->dtype;
        int64_t st[4] = {0, 0, 0, 0}, s = 1;
        for (int d = r - 1; d >= 0; d--) {
            int md = d - (r - m->rank);
            if (md < 0) continue;
            st[4 - r + d] = m->dims[md] == 1 ? 0 : s;
            s *= m->dims[md];
        }
        memcpy(a->ms, st, sizeof st);
    } else {
        a->mask_kind = 0;
    }
    tbn_sdpa_strides(a);
    return 1;
}

/* sdpa in the heads layout (ops_nn.h; a graph pass's form): q, k, v as
 * (B, S, H*D) or one packed (B, S, 3*H*D) q | k | v value, out (B, S, H*Dv),
 * read and written through strides; no Transpose runs around it. */
static tb_status run_sdpa_heads(tbn_ctx *x, const tb_node *n, const tb_view *in, int n_in, const void *const *ib,
                                void *ob) {
    tb_nn_sdpa_geom g;
    NEEDR(tb_nn_sdpa_geometry(n, in[0].rank, in[0].dims, in[1].dims, in[2].dims, &g), "sdpa: heads layout mismatch");
    NEEDR(g.D <= 256 && g.Dv <= 128, "sdpa: head dims %lld / %lld (at most 256 / 128)", (long long)g.D,
          (long long)g.Dv);
    tbn_sdpa_args a;
    memset(&a, 0, sizeof a);
    a.B = g.B, a.H = g.H, a.S = g.S, a.T = g.T, a.D = (int)g.D, a.Dv = (int)g.Dv;
    a.dt = in[0].dtype;
    a.causal = n->i[0];
    a.mask_kind = n->i[2];
    a.scale = n->f[0] != 0.0f ? n->f[0] : (float)(1.0 / sqrt((double)a.D));
    if (a.mask_kind && n_in > 3) {
        /* the mask broadcasts to the logical (B, H, S, T) */
        const tb_view *m = &in[3];
        int64_t s = 1;
        for (int d = 3; d >= 0; d--) {
            int md = d - (4 - m->rank);
            if (md < 0) { a.ms[d] = 0; continue; }
            a.ms[d] = m->dims[md] == 1 ? 0 : s;
            s *= m->dims[md];
        }
        a.mdt = m->dtype;
        a.mask = ib[3];
    } else {
        a.mask_kind = 0;
    }
    for (int d = 0; d < 3; d++) a.qs[d] = g.st[0][d], a.vs[d] = g.st[2][d], a.os[d] = g.st[3][d];
    for (int d = 0; d < 4; d++) a.ks[d] = g.st[1][d];
    size_t es = dt_size(in[0].dtype);
    const char *q = (const char *)ib[0] + (size_t)g.off[0] * es, *k = (const char *)ib[1] + (size_t)g.off[1] * es;
    const char *v = (const char *)ib[2] + (size_t)g.off[2] * es;
    CU(tbn_sdpa(&a, q, k, v, ob, x->stream), "sdpa launch");
    return TB_OK;
}

static tb_status run_sdpa(tbn_ctx *x, const tb_graph *g, const tb_node *n, const tb_view *in, int n_in,
                          const tb_view *o, const void *const *ib, void *ob, void *const *bufs, const tb_step *st) {
    tbn_sdpa_args a;
    if (n->i[3] > 0) return run_sdpa_heads(x, n, in, n_in, ib, ob);
    NEEDR(in[0].rank == 3 || in[0].rank == 4, "sdpa: rank %d", in[0].rank);
    NEEDR(sdpa_args(n, in, n_in, &a), "sdpa: head dims %lld / %lld (at most 256 / 128)",
          (long long)in[0].dims[in[0].rank - 1], (long long)in[2].dims[in[2].rank - 1]);
    const void *p[3] = {ib[0], ib[1], ib[2]};
    void *out = ob;
    int ks = node_index(g, n);
    if (in[0].rank == 4 && sdpa_strided(g, st, ks)) {
        /* read (B, S, H, D) sources, write (B, S, H, Dv): see transpose_folded */
        const int64_t H = a.H, S = a.S, T = a.T, D = a.D, Dv = a.Dv;
        for (int j = 0; j < 3; j++) {
            int t = fold_in(g, bufs, st, ks, j);
            if (t < 0) continue;
            p[j] = bufs[g->nodes[t].in[0]];
            if (j == 0) a.qs[0] = S * H * D, a.qs[1] = D, a.qs[2] = H * D;
            else if (j == 1) a.ks[0] = T * H * D, a.ks[1] = D, a.ks[2] = H * D, a.ks[3] = 1;
            else a.vs[0] = T * H * Dv, a.vs[1] = Dv, a.vs[2] = H * Dv;
        }
        if (p[1] == ib[1]) {
            /* k not folded: its Transpose may have written (B, H, T, D) */
            int kt = -1;
            for (int k = ks - 1; k >= 0 && kt < 0; k--)
                if (g->nodes[k].n_out > 0 && g->nodes[k].out[0] == n->in[1]) kt = k;
            if (kt >= 0 && k_relaid(g, bufs, st, ks, kt)) a.ks[0] = H * T * D, a.ks[1] = T * D, a.ks[2] = D, a.ks[3] = 1;
        }
        int t = fold_out(g, bufs, st, ks);
        if (t >= 0) {
            out = bufs[g->nodes[t].out[0]];
            a.os[0] = S * H * Dv, a.os[1] = Dv, a.os[2] = H * Dv;
        }
    }
    if (a.mask_kind) a.mask = ib[3];
    (void)o;
    CU(tbn_sdpa(&a, p[0], p[1], p[2], out, x->stream), "sdpa launch");
    return TB_OK;
}

/* ---------------------------------------------------------------- shapes */

static tb_status run_strided(tbn_ctx *x, const tb_view *o, const void *src, void *ob, const int64_t *st,
                             int64_t base) {
    CU(tbn_strided_copy(ob, src, o->rank, o->dims, st, base, (int)dt_size(o->dtype), x->stream),
       "strided copy launch");
    return TB_OK;
}

static tb_status run_resize(tbn_ctx *x, const tb_node *n, const tb_view *in, int n_in, const tb_view *o,
                            const void *const *ib, void *ob) {
    const tb_view *xv = &in[0], *p = &in[1];
    int r = xv->rank;
    tbn_resize_args a;
    memset(&a, 0, sizeof a);
    a.rank = r;
    a.mode = n->i[0];
    a.coord = n->i[1];
    a.nearest = n->i[2];
    a.excl = n->i[3];
    a.cubic_a = n->f[0];
    a.extrap = n->f[1];
    a.dt = xv->dtype;
    NEEDR(p->data, "Resize: scales / sizes are not known on the host");
    int by_sizes = p->dtype == TB_I64 || p->dtype == TB_I32;
    for (int d = 0; d < r; d++) {
        a.in[d] = xv->dims[d];
        a.out[d] = o->dims[d];
        a.r0[d] = 0;
        a.r1[d] = 1;
    }
    if (n_in > 2 && in[2].data && numel(&in[2]) == 2 * r)
        for (int d = 0; d < r; d++) { a.r0[d] = hget_f(&in[2], d); a.r1[d] = hget_f(&in[2], r + d); }
    for (int d = 0; d < r; d++) {
        if (by_sizes) a.scale[d] = xv->dims[d] ? (double)hget_i(p, d) / (double)xv->dims[d] : 1;
        else a.scale[d] = hget_f(p, d);
    }
    CU(tbn_resize(&a, ib[0], ob, x->stream), "resize launch");
    return TB_OK;
}

/* ---------------------------------------------------------------- dispatch */

tb_status tbn_run_node(tbn_ctx *x, const tb_graph *g, const tb_node *n, void *const *bufs, const tb_step *st) {
    NEEDR(st && st->views, "cuda: general op %s without the run's views", tb_op_name(n->op));
    tb_view in[TB_MAX_INPUTS];
    const void *ib[TB_MAX_INPUTS];
    int n_in = n->n_in;
    for (int k = 0; k < n_in; k++) {
        in[k] = st->views[n->in[k]];
        ib[k] = bufs[n->in[k]];
    }
    const tb_view *o = &st->views[n->out[0]];
    void *ob = bufs[n->out[0]];
    cudaStream_t s = x->stream;
    size_t es = dt_size(o->dtype);
    int64_t N = numel(o);
    switch (n->op) {
    case TB_OP_IDENTITY: case TB_OP_RESHAPE: case TB_OP_SQUEEZE: case TB_OP_UNSQUEEZE: case TB_OP_FLATTEN:
        if (ob != ib[0] && N) CU(cudaMemcpyAsync(ob, ib[0], (size_t)N * es, cudaMemcpyDeviceToDevice, s), "copy");
        return TB_OK;
    case TB_OP_CAST:
        if (in[0].dtype == o->dtype) {
            if (ob != ib[0] && N) CU(cudaMemcpyAsync(ob, ib[0], (size_t)N * es, cudaMemcpyDeviceToDevice, s), "copy");
            return TB_OK;
        }
        CU(tbn_cast(ib[0], in[0].dtype, ob, o->dtype, N, s), "cast launch");
        return TB_OK;
    case TB_OP_SOFTMAX: {
        int axis = n->i[0];
        CU(tbn_softmax(ib[0], ob, o->dtype, prod(in[0].dims, axis), in[0].dims[axis],
                       prod(in[0].dims + axis + 1, in[0].rank - axis - 1), s),
           "softmax launch");
        return TB_OK;
    }
    case TB_OP_LAYERNORM:
        return run_layernorm(x, n, in, n_in, o, ib, ob);
    case TB_OP_BATCHNORM: {
        const void *p[4] = {ib[1], ib[2], ib[3], ib[4]};
        int pdt[4];
        int64_t pn[4];
        for (int k = 0; k < 4; k++) { pdt[k] = in[k + 1].dtype; pn[k] = numel(&in[k + 1]); }
        CU(tbn_batchnorm(ib[0], ob, o->dtype, in[0].dims[0], in[0].dims[1], prod(in[0].dims + 2, in[0].rank - 2), p,
                         pdt, pn, n->f[0], s),
           "batchnorm launch");
        return TB_OK;
    }
    case TB_OP_REDUCE_MEAN: case TB_OP_REDUCE_SUM: case TB_OP_REDUCE_MAX:
        return run_reduce(x, n, in, n_in, o, ib, ob);
    case TB_OP_TRANSPOSE: {
        if (transpose_folded(g, n, bufs, st)) return TB_OK;
        int perm[TB_MAX_RANK];
        TB_TRY(tb_nn_transpose_perm(n, in[0].rank, perm));
        if (!fold_off() && in[0].rank == 4) {
            int r = sole_reader(g, n->out[0]);
            if (r > node_index(g, n) && k_relaid(g, bufs, st, r, node_index(g, n))) {
                /* (B, T, H, D) -> (B, H, T, D) */
                int64_t od[4] = {in[0].dims[0], in[0].dims[2], in[0].dims[1], in[0].dims[3]}, ist[4], stv[4];
                strides_of(in[0].dims, 4, ist);
                stv[0] = ist[0], stv[1] = ist[2], stv[2] = ist[1], stv[3] = ist[3];
                CU(tbn_strided_copy(ob, ib[0], 4, od, stv, 0, (int)dt_size(o->dtype), x->stream), "strided copy launch");
                return TB_OK;
            }
        }
        int64_t ist[TB_MAX_RANK], stv[TB_MAX_RANK];
        strides_of(in[0].dims, in[0].rank, ist);
        for (int k = 0; k < in[0].rank; k++) stv[k] = ist[perm[k]];
        return run_strided(x, o, ib[0], ob, stv, 0);
    }
    case TB_OP_SLICE: {
        int64_t stv[TB_MAX_RANK], base;
        for (int k = 1; k < n_in; k++) NEEDR(in[k].data, "Slice: input %d is not known on the host", k);
        TB_TRY(tb_nn_slice_plan(in, n_in, o, &base, stv));
        return run_strided(x, o, ib[0], ob, stv, base);
    }
    case TB_OP_EXPAND: {
        int64_t stv[TB_MAX_RANK];
        tb_nn_broadcast_strides(&in[0], o, stv);
        return run_strided(x, o, ib[0], ob, stv, 0);
    }
    case TB_OP_CONCAT: {
        int axis = n->i[0];
        int64_t outer = prod(o->dims, axis), inner = prod(o->dims + axis + 1, o->rank - axis - 1);
        size_t dpitch = (size_t)(o->dims[axis] * inner) * es, at = 0;
        for (int k = 0; k < n_in; k++) {
            size_t w = (size_t)(in[k].dims[axis] * inner) * es;
            if (w && outer)
                CU(cudaMemcpy2DAsync((char *)ob + at, dpitch, ib[k], w, w, (size_t)outer, cudaMemcpyDeviceToDevice, s),
                   "concat copy");
            at += w;
        }
        return TB_OK;
    }
    case TB_OP_SPLIT: {
        int axis = n->i[0];
        const tb_view *xv = &in[0];
        int64_t outer = prod(xv->dims, axis), inner = prod(xv->dims + axis + 1, xv->rank - axis - 1);
        size_t spitch = (size_t)(xv->dims[axis] * inner) * es, at = 0;
        for (int k = 0; k < n->n_out; k++) {
            const tb_view *ov = &st->views[n->out[k]];
            size_t w = (size_t)(ov->dims[axis] * inner) * es;
            if (w && outer)
                CU(cudaMemcpy2DAsync(bufs[n->out[k]], w, (const char *)ib[0] + at, spitch, w, (size_t)outer,
                                     cudaMemcpyDeviceToDevice, s),
                   "split copy");
            at += w;
        }
        return TB_OK;
    }
    case TB_OP_SHAPE: {
        int r = in[0].rank;
        int64_t a = n->i[0], b = n->i[2] ? n->i[1] : r;
        if (a < 0) a += r;
        if (b < 0) b += r;
        a = a < 0 ? 0 : a > r ? r : a;
        b = b < 0 ? 0 : b > r ? r : b;
        for (int64_t k = a; k < b; k++)
            CU(tbn_fill((int64_t *)ob + (k - a), 1, 8, (uint64_t)in[0].dims[k], s), "shape fill");
        return TB_OK;
    }
    case TB_OP_GATHER: {
        int axis = n->i[0];
        const tb_view *xv = &in[0];
        CU(tbn_gather(ib[0], ib[1], in[1].dtype, ob, prod(xv->dims, axis), xv->dims[axis], numel(&in[1]),
                      prod(xv->dims + axis + 1, xv->rank - axis - 1), (int)es, s),
           "gather launch");
        return TB_OK;
    }
    case TB_OP_RANGE: {
        for (int k = 0; k < 3; k++) NEEDR(in[k].data, "Range: input %d is not known on the host", k);
        CU(tbn_range(ob, o->dtype, N, hget_f(&in[0], 0), hget_f(&in[2], 0), hget_i(&in[0], 0), hget_i(&in[2], 0), s),
           "range launch");
        return TB_OK;
    }
    case TB_OP_CONSTANT_OF_SHAPE: {
        NEEDR(n_in > 1 && in[1].data, "ConstantOfShape: the value is not known on the host");
        uint64_t v = 0;
        memcpy(&v, in[1].data, es);
        CU(tbn_fill(ob, N, (int)es, v, s), "fill launch");
        return TB_OK;
    }
    case TB_OP_TRILU: {
        int64_t k = 0;
        if (n_in > 1) {
            NEEDR(in[1].data, "Trilu: k is not known on the host");
            k = hget_i(&in[1], 0);
        }
        int r = in[0].rank;
        CU(tbn_trilu(ib[0], ob, prod(in[0].dims, r - 2), in[0].dims[r - 2], in[0].dims[r - 1], k, n->i[0], (int)es, s),
           "trilu launch");
        return TB_OK;
    }
    case TB_OP_RESIZE:
        return run_resize(x, n, in, n_in, o, ib, ob);
    case TB_OP_MAXPOOL: case TB_OP_AVGPOOL: {
        tb_nn_conv_geom gm;
        TB_TRY(tb_nn_pool_geom(n, &in[0], &gm));
        tbn_pool_args a = {
            .is_max = n->op == TB_OP_MAXPOOL, .incl = n->i[11], .dt = in[0].dtype, .planes = gm.n * gm.c,
            .h = gm.h, .w = gm.w, .oh = gm.oh, .ow = gm.ow, .kh = gm.kh, .kw = gm.kw, .sh = gm.sh, .sw = gm.sw,
            .dh = gm.dh, .dw = gm.dw, .pt = gm.pt, .pl = gm.pl, .pb = gm.pb, .pr = gm.pr,
            .nhwc = tbn_nhwc(x, g, n->in[0]), .c = gm.c,
        };
        CU(tbn_pool(&a, ib[0], ob, s), "pool launch");
        return TB_OK;
    }
    case TB_OP_GLOBAL_AVGPOOL:
        if (tbn_nhwc(x, g, n->in[0])) { /* (N, HW, C) in, (N, C) out */
            CU(tbn_global_avgpool_nhwc(ib[0], ob, o->dtype, in[0].dims[0], in[0].dims[1],
                                       prod(in[0].dims + 2, in[0].rank - 2), s),
               "global average pool launch");
            return TB_OK;
        }
        CU(tbn_global_avgpool(ib[0], ob, o->dtype, in[0].dims[0] * in[0].dims[1],
                              prod(in[0].dims + 2, in[0].rank - 2), s),
           "global average pool launch");
        return TB_OK;
    case TB_OP_CONV:
        return run_conv(x, g, n, in, n_in, o, ib, ob);
    case TB_OP_GEMM:
        return run_gemm(x, n, in, n_in, o, ib, ob);
    case TB_OP_NN_MATMUL:
        return run_matmul(x, n, in, n_in, o, ib, ob);
    case TB_OP_SDPA:
        return run_sdpa(x, g, n, in, n_in, o, ib, ob, bufs, st);
    default:
        if (ew_op(n->op) >= 0) return run_elementwise(x, n, in, o, ib, ob);
        return tb_errorf(TB_ERR_UNSUPPORTED, "cuda backend: op %s is not supported", tb_op_name(n->op));
    }
}
