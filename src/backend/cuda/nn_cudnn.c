/*
 * nn_cudnn.c — Conv on cuDNN (cudnn_shim.h), the first choice of run_conv
 * (nn_backend.c) when the library loads; im2col + cuBLAS otherwise.
 *
 * Each convolution geometry (input, weight and output dims, group, strides,
 * pads, dilations, dtypes, epilogue) gets one entry on its first run: its
 * descriptors, the algorithm (cudnnFindConvolutionForwardAlgorithmEx timed
 * over the real buffers into a scratch workspace; TB_CUDA_CUDNN_FIND=0: the
 * _v7 heuristics) and the workspace it needs, which then lives in the
 * backend's scratch. Entries are made on eager runs only: a run captured
 * into a CUDA graph is always the second of its key (cuda_backend.c), so
 * the capture finds the entry made and allocates nothing. A geometry first
 * seen inside a capture (not expected) runs as im2col there.
 *
 * Paths, logged once per geometry at info level:
 *   cudnn fused  cudnnConvolutionBiasActivationForward: y = act(conv(x) +
 *                z + bias), act relu or identity, z the residual (alpha2 1)
 *                or none (alpha2 0, z = y). Taken for act(conv + bias +
 *                residual) (TB_NN_ACT_AFTER_RESIDUAL, ResNet's blocks),
 *                act(conv + bias), and conv + bias + residual; bias and
 *                residual in the output's dtype. A missing bias reads a
 *                zero vector the entry owns. Identity needs the
 *                IMPLICIT_PRECOMP_GEMM algorithm (cuDNN's rule): those
 *                convolutions run it whatever is fastest otherwise.
 *   cudnn        cudnnConvolutionForward into y, then the epilogue kernel
 *                in place over y (other activations, act before residual).
 *   cudnn channels-last  f16, group 1: w copied to (M, kh, kw, C), x (and
 *                a fused residual) to (N, H, W, C), cuDNN on the tensor cores,
 *                y copied back to (N, C, H, W), every run; timed after the two paths here and kept when
 *                faster (cuDNN's NCHW f16 kernels are 10x off the tensor
 *                cores' rate on ResNet's layers at batch 8).
 *                TB_CUDA_CUDNN_NHWC=0 never, =1 wherever it runs.
 *   im2col       cuDNN absent or off (TB_CUDA_CUDNN=0), asymmetric pads,
 *                an output dtype other than the input's, cuDNN refused, or
 *                faster: on a geometry's first run both paths are timed
 *                (5 runs each, CUDA events) and the faster one is kept
 *                (cuDNN's f32 FMA kernels lose to cuBLAS on small ResNet
 *                convolutions at batch 1). TB_CUDA_CUDNN=1 takes cuDNN
 *                wherever it can without timing.
 * Math: f16 on the tensor cores (CUDNN_TENSOR_OP_MATH, f32 accumulation);
 * f32 in plain FMA (exact f32, like the cuBLAS path) and without the FFT and
 * non-fused Winograd algorithms (their rounding is 30x the GEMM forms') unless
 * TB_CUDA_TF32=1, which allows TF32 tensor cores and every algorithm.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cudnn_shim.h"
#include "backend/cuda/nn_backend.h"
#include "ir/ops_nn.h"

#define FIND_WS ((size_t)256 << 20) /* workspace offered to the timed search */

enum { P_IM2COL = 0, P_FUSED, P_PLAIN };

typedef struct {
    int64_t n, c, h, w, m, oh, ow;
    int kh, kw, sh, sw, dh, dw, ph, pw, group;
    int xdt, ydt, bdt, rdt;      /* -1: absent */
    int act, after_res;
    float p0, p1;
    int lay;                     /* TBN_LAY_*: held channels-last by the graph's plan */
} conv_key;

typedef struct {
    conv_key k;
    int path, algo, math, direct;
    int nhwc;                    /* channels-last: x, y, residual transposed around cuDNN */
    void *wt;                    /* nhwc: the weights as (M, kh, kw, C), rewritten each run */
    size_t ws;
    cudnnTensorDescriptor_t xd, yd, bd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnActivationDescriptor_t ad;
    void *zero_bias;
} conv_entry;

typedef struct {
    const tbd_api *api;
    cudnnHandle_t h;
    int off, force, tf32, find; /* force: TB_CUDA_CUDNN=1, cuDNN without timing im2col */
    conv_entry *e;
    int n, cap;
    void *ws;
    size_t ws_bytes;
    void *xs, *ys, *rs;          /* nhwc: x, y and the residual in channels-last */
    size_t xs_bytes, ys_bytes, rs_bytes;
    int nhwc_off, nhwc_force;    /* TB_CUDA_CUDNN_NHWC=0 / =1 (taken wherever it runs) */
    struct { const void *src; void *dst; size_t bytes; } *wc; /* the engine's weights as (M, kh, kw, C) */
    int n_wc, cap_wc;
    int w_const;                 /* the convolution being run reads the engine's weights */
} dnn_state;

static const char *algo_name(int a) {
    static const char *const names[] = {"implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft",
                                        "fft_tiling", "winograd", "winograd_nonfused"};
    return a >= 0 && a < TBD_FWD_ALGO_COUNT ? names[a] : "?";
}
static const char *math_name(int m) {
    return m == TBD_TENSOR_OP_MATH ? "tensor-op" : m == TBD_TENSOR_OP_MATH_ALLOW_CONVERSION ? "tensor-op-conv"
           : m == TBD_FMA_MATH ? "fma" : "default";
}
static const char *act_name(int a) {
    switch (a) {
    case TB_NN_ACT_NONE: return "none";
    case TB_NN_ACT_RELU: return "relu";
    case TB_NN_ACT_GELU_ERF: return "gelu";
    case TB_NN_ACT_GELU_TANH: return "gelu_tanh";
    case TB_NN_ACT_SIGMOID: return "sigmoid";
    case TB_NN_ACT_CLIP: return "clip";
    case TB_NN_ACT_TANH: return "tanh";
    default: return "?";
    }
}

static void entry_free(const tbd_api *a, conv_entry *e) {
    if (a) {
        if (e->xd) a->DestroyTensorDescriptor(e->xd);
        if (e->yd) a->DestroyTensorDescriptor(e->yd);
        if (e->bd) a->DestroyTensorDescriptor(e->bd);
        if (e->wd) a->DestroyFilterDescriptor(e->wd);
        if (e->cd) a->DestroyConvolutionDescriptor(e->cd);
        if (e->ad) a->DestroyActivationDescriptor(e->ad);
    }
    cudaFree(e->zero_bias);
    cudaFree(e->wt);
    memset(e, 0, sizeof *e);
}

void tbn_cudnn_free(tbn_ctx *x) {
    dnn_state *d = x->dnn;
    if (!d) return;
    for (int i = 0; i < d->n; i++) entry_free(d->api, &d->e[i]);
    free(d->e);
    if (d->h && d->api) d->api->Destroy(d->h);
    tbn_cudnn_weights_reset(x);
    free(d->wc);
    cudaFree(d->ws);
    cudaFree(d->xs);
    cudaFree(d->ys);
    cudaFree(d->rs);
    free(d);
    x->dnn = NULL;
}

static dnn_state *state(tbn_ctx *x) {
    if (x->dnn) return x->dnn;
    dnn_state *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    const char *off = getenv("TB_CUDA_CUDNN"), *tf = getenv("TB_CUDA_TF32"), *fi = getenv("TB_CUDA_CUDNN_FIND");
    d->off = off && !strcmp(off, "0");
    d->force = off && !strcmp(off, "1");
    d->tf32 = tf && !strcmp(tf, "1");
    d->find = !(fi && !strcmp(fi, "0"));
    const char *nh = getenv("TB_CUDA_CUDNN_NHWC");
    d->nhwc_off = nh && !strcmp(nh, "0");
    d->nhwc_force = nh && !strcmp(nh, "1");
    if (d->off) tb_log(TB_LOG_INFO, "cuda: cuDNN off (TB_CUDA_CUDNN=0): convolutions run as im2col + cuBLAS");
    else d->api = tbd_get();
    x->dnn = d;
    return d;
}

void tbn_cudnn_weights_reset(tbn_ctx *x) {
    dnn_state *d = x->dnn;
    if (!d) return;
    if (d->n_wc && x->stream) cudaStreamSynchronize(x->stream);
    for (int i = 0; i < d->n_wc; i++) cudaFree(d->wc[i].dst);
    d->n_wc = 0;
}

int tbn_cudnn_nhwc_ok(tbn_ctx *x) {
    dnn_state *d = state(x);
    return d && d->api && !d->off && !d->nhwc_off;
}

static void describe(const conv_key *k, char *buf, size_t n) {
    snprintf(buf, n,
             "Conv x (%lld, %lld, %lld, %lld) w (%lld, %lld, %d, %d) -> (%lld, %lld, %lld, %lld) group %d stride "
             "%dx%d pad %dx%d dil %dx%d %s%s%s%s act %s%s%s%s",
             (long long)k->n, (long long)k->c, (long long)k->h, (long long)k->w, (long long)k->m,
             (long long)(k->c / k->group), k->kh, k->kw, (long long)k->n, (long long)k->m, (long long)k->oh,
             (long long)k->ow, k->group, k->sh, k->sw, k->ph, k->pw, k->dh, k->dw, k->xdt == TB_F16 ? "f16" : "f32",
             k->bdt >= 0 ? " +bias" : "", k->rdt >= 0 ? " +residual" : "",
             k->rdt >= 0 ? (k->after_res ? " (before act)" : " (after act)") : "", act_name(k->act),
             k->lay ? " held channels-last:" : "", k->lay & TBN_LAY_X ? " x" : "", k->lay & TBN_LAY_Y ? " y" : "");
}

static tb_status dnn_fail(cudnnStatus_t s, const char *what) {
    return tb_errorf(TB_ERR_INTERNAL, "cudnn: %s: %s (status %d)", what, tbd_error(s), (int)s);
}

/* descriptors of entry e; 0 on success, else the failing status */
static cudnnStatus_t make_descs(const tbd_api *a, conv_entry *e, int math) {
    const conv_key *k = &e->k;
    int dt = k->xdt == TB_F16 ? TBD_DATA_HALF : TBD_DATA_FLOAT;
    int fmt = e->nhwc ? TBD_TENSOR_NHWC : TBD_TENSOR_NCHW;
    cudnnStatus_t s;
#define T(call) do { if ((s = (call)) != TBD_STATUS_SUCCESS) return s; } while (0)
    T(a->CreateTensorDescriptor(&e->xd));
    T(a->SetTensor4dDescriptor(e->xd, fmt, dt, (int)k->n, (int)k->c, (int)k->h, (int)k->w));
    T(a->CreateTensorDescriptor(&e->yd));
    T(a->SetTensor4dDescriptor(e->yd, fmt, dt, (int)k->n, (int)k->m, (int)k->oh, (int)k->ow));
    T(a->CreateFilterDescriptor(&e->wd));
    T(a->SetFilter4dDescriptor(e->wd, dt, fmt, (int)k->m, (int)(k->c / k->group), k->kh, k->kw));
    T(a->CreateConvolutionDescriptor(&e->cd));
    T(a->SetConvolution2dDescriptor(e->cd, k->ph, k->pw, k->sh, k->sw, k->dh, k->dw, TBD_CROSS_CORRELATION,
                                    TBD_DATA_FLOAT));
    if (k->group > 1) T(a->SetConvolutionGroupCount(e->cd, k->group));
    T(a->SetConvolutionMathType(e->cd, math));
    T(a->CreateTensorDescriptor(&e->bd));
    T(a->SetTensor4dDescriptor(e->bd, fmt, dt, 1, (int)k->m, 1, 1));
    T(a->CreateActivationDescriptor(&e->ad));
    T(a->SetActivationDescriptor(e->ad, k->act == TB_NN_ACT_RELU ? TBD_ACTIVATION_RELU : TBD_ACTIVATION_IDENTITY,
                                 TBD_PROPAGATE_NAN, 0.0));
#undef T
    return TBD_STATUS_SUCCESS;
}

/* Picks e->algo / e->math / e->ws (the path may drop from fused to plain:
 * identity needs IMPLICIT_PRECOMP_GEMM). 0 on success. */
typedef struct { int algo, math; size_t mem; float ms; } algo_cand;
#define MAX_CANDS 8

static cudnnStatus_t pick_algo_c(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *xb, const void *wb, void *yb,
                                 float *ms, algo_cand *cand, int *n_cand);

static cudnnStatus_t pick_algo(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *xb, const void *wb, void *yb,
                               float *ms) {
    return pick_algo_c(x, d, e, xb, wb, yb, ms, NULL, NULL);
}

/* as pick_algo, and the eligible candidates in cuDNN's order (fastest by
 * its own timing first) into cand (MAX_CANDS), where cand is given */
static cudnnStatus_t pick_algo_c(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *xb, const void *wb, void *yb,
                                 float *ms, algo_cand *cand, int *n_cand) {
    const tbd_api *a = d->api;
    tbd_fwd_perf perf[2 * TBD_FWD_ALGO_COUNT];
    int got = 0;
    cudnnStatus_t s;
    *ms = -1;
    if (d->find) {
        void *ws = NULL;
        size_t wsb = FIND_WS;
        while (wsb && cudaMalloc(&ws, wsb) != cudaSuccess) {
            cudaGetLastError();
            ws = NULL;
            wsb /= 4;
            if (wsb < ((size_t)1 << 20)) wsb = 0;
        }
        s = a->FindConvolutionForwardAlgorithmEx(d->h, e->xd, xb, e->wd, wb, e->cd, e->yd, yb,
                                                 (int)(sizeof perf / sizeof perf[0]), &got, perf, ws, wsb);
        cudaFree(ws);
    } else {
        s = a->GetConvolutionForwardAlgorithm_v7(d->h, e->xd, e->wd, e->cd, e->yd, (int)(sizeof perf / sizeof perf[0]),
                                                 &got, perf);
    }
    if (s != TBD_STATUS_SUCCESS) return s;
    int strict = e->k.xdt == TB_F32 && !d->tf32; /* exact f32: no TF32 tensor cores */
    int best = -1, precomp = -1;
    for (int i = 0; i < got; i++) {
        if (perf[i].status != TBD_STATUS_SUCCESS) continue;
        if (strict && perf[i].mathType != TBD_FMA_MATH && perf[i].mathType != TBD_DEFAULT_MATH) continue;
        /* exact f32: no FFT / non-fused Winograd transforms either (errors of 1e-5 of the largest output
         * on ResNet's 512-channel 3x3, against 4e-7 for the GEMM forms) */
        if (strict && (perf[i].algo == TBD_FWD_FFT || perf[i].algo == TBD_FWD_FFT_TILING ||
                       perf[i].algo == TBD_FWD_WINOGRAD_NONFUSED))
            continue;
        if (best < 0) best = i; /* sorted fastest first */
        if (precomp < 0 && perf[i].algo == TBD_FWD_IMPLICIT_PRECOMP_GEMM) precomp = i;
        /* identity in the fused call needs IMPLICIT_PRECOMP_GEMM */
        int fused_id = e->path == P_FUSED && e->k.act != TB_NN_ACT_RELU;
        if (cand && *n_cand < MAX_CANDS && (!fused_id || perf[i].algo == TBD_FWD_IMPLICIT_PRECOMP_GEMM)) {
            int m = perf[i].mathType;
            if (strict && m == TBD_DEFAULT_MATH) m = TBD_FMA_MATH;
            cand[*n_cand] = (algo_cand){perf[i].algo, m, perf[i].memory, perf[i].time};
            (*n_cand)++;
        }
    }
    if (best < 0) return -1;
    int pick = best;
    if (e->path == P_FUSED && e->k.act != TB_NN_ACT_RELU) {
        if (precomp >= 0) pick = precomp;
        else e->path = P_PLAIN; /* identity without precomp: convolution, then the epilogue kernel */
    }
    e->algo = perf[pick].algo;
    e->math = perf[pick].mathType;
    if (strict && e->math == TBD_DEFAULT_MATH) e->math = TBD_FMA_MATH;
    if ((s = a->SetConvolutionMathType(e->cd, e->math)) != TBD_STATUS_SUCCESS) return s;
    size_t need = 0;
    if ((s = a->GetConvolutionForwardWorkspaceSize(d->h, e->xd, e->wd, e->cd, e->yd, e->algo, &need)) !=
        TBD_STATUS_SUCCESS)
        return s;
    e->ws = need > perf[pick].memory ? need : perf[pick].memory;
    if (d->find) *ms = perf[pick].time;
    (void)x;
    return TBD_STATUS_SUCCESS;
}

/* Enqueues entry e's convolution (and epilogue); a cuDNN refusal returns
 * its status in *cs with TB_OK (nothing enqueued). */
/* (N, C, H, W) <-> (N, H, W, C) of f16 / f32 elements (es bytes) */
static tb_status to_nhwc(tbn_ctx *x, void *out, const void *in, int64_t n, int64_t c, int64_t hw, int es) {
    int64_t od[3] = {n, hw, c}, st[3] = {c * hw, 1, hw};
    cudaError_t ce = tbn_strided_copy(out, in, 3, od, st, 0, es, x->stream);
    return ce == cudaSuccess ? TB_OK : tb_errorf(TB_ERR_INTERNAL, "cuda: nhwc copy: %s", cudaGetErrorString(ce));
}
static tb_status to_nchw(tbn_ctx *x, void *out, const void *in, int64_t n, int64_t c, int64_t hw, int es) {
    int64_t od[3] = {n, c, hw}, st[3] = {c * hw, 1, c};
    cudaError_t ce = tbn_strided_copy(out, in, 3, od, st, 0, es, x->stream);
    return ce == cudaSuccess ? TB_OK : tb_errorf(TB_ERR_INTERNAL, "cuda: nchw copy: %s", cudaGetErrorString(ce));
}

/* Entry e's weights wb as (M, kh, kw, C): the engine's weights are
 * transposed once and kept (tbn_cudnn_weights_reset drops them when the
 * engine's weights change); others (and a first sight inside a capture,
 * where nothing is allocated) are transposed into the entry's buffer on
 * every run. */
static tb_status nhwc_weights(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *wb, const void **out) {
    const conv_key *k = &e->k;
    int es = k->xdt == TB_F16 ? 2 : 4;
    size_t bytes = (size_t)(k->m * k->c * k->kh * k->kw) * (size_t)es;
    int64_t od[3] = {k->m, (int64_t)k->kh * k->kw, k->c}, wst[3] = {k->c * k->kh * k->kw, 1, (int64_t)k->kh * k->kw};
    void *dst = e->wt;
    if (d->w_const) {
        for (int i = 0; i < d->n_wc; i++)
            if (d->wc[i].src == wb && d->wc[i].bytes == bytes) { *out = d->wc[i].dst; return TB_OK; }
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(x->stream, &cap);
        if (cap == cudaStreamCaptureStatusNone) {
            if (d->n_wc == d->cap_wc) {
                int nc = d->cap_wc ? 2 * d->cap_wc : 32;
                void *p = realloc(d->wc, sizeof *d->wc * (size_t)nc);
                if (p) { d->wc = p; d->cap_wc = nc; }
            }
            void *p = NULL;
            if (d->n_wc < d->cap_wc && cudaMalloc(&p, bytes) == cudaSuccess) {
                d->wc[d->n_wc].src = wb;
                d->wc[d->n_wc].dst = p;
                d->wc[d->n_wc].bytes = bytes;
                d->n_wc++;
                dst = p;
            }
            cudaGetLastError();
        }
    }
    if (!dst) return tb_errorf(TB_ERR_INTERNAL, "cuda: channels-last weights: no buffer");
    cudaError_t we = tbn_strided_copy(dst, wb, 3, od, wst, 0, es, x->stream);
    if (we != cudaSuccess) return tb_errorf(TB_ERR_INTERNAL, "cuda: nhwc weights: %s", cudaGetErrorString(we));
    *out = dst;
    return TB_OK;
}

static tb_status launch(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *xb, const void *wb, void *yb,
                        const tbn_epi_args *ep0, const tb_view *o, cudnnStatus_t *cs) {
    tbn_epi_args epc = *ep0, *ep = &epc;
    const tbd_api *a = d->api;
    float one = 1.0f, zero = 0.0f;
    void *ws = e->ws ? d->ws : NULL;
    *cs = TBD_STATUS_SUCCESS;
    void *yout = yb; /* where cuDNN writes */
    const void *res = ep->res;
    const conv_key *k = &e->k;
    int es = k->xdt == TB_F16 ? 2 : 4;
    int ylast = e->nhwc && (k->lay & TBN_LAY_Y); /* y stays channels-last */
    if (e->nhwc) {
        /* channels-last around cuDNN: w, and x and a fused residual where
         * the graph holds them (N, C, H, W), in; y out where it does */
        TB_TRY(nhwc_weights(x, d, e, wb, &wb));
        if (!(k->lay & TBN_LAY_X)) {
            TB_TRY(to_nhwc(x, d->xs, xb, k->n, k->c, k->h * k->w, es));
            xb = d->xs;
        }
        yout = ylast ? yb : d->ys;
        if (res && e->path == P_FUSED && !(k->lay & TBN_LAY_R)) {
            TB_TRY(to_nhwc(x, d->rs, res, k->n, k->m, k->oh * k->ow, es));
            res = d->rs;
        }
    }
    if (e->path == P_FUSED) {
        float alpha2 = res ? 1.0f : 0.0f;
        const void *z = res ? res : yout;
        const void *bias = ep->bias ? ep->bias : e->zero_bias;
        *cs = a->ConvolutionBiasActivationForward(d->h, &one, e->xd, xb, e->wd, wb, e->cd, e->algo, ws, e->ws, &alpha2,
                                                  e->yd, z, e->bd, bias, e->ad, e->yd, yout);
        if (*cs == TBD_STATUS_SUCCESS && e->nhwc && !ylast) TB_TRY(to_nchw(x, yb, yout, k->n, k->m, k->oh * k->ow, es));
        return TB_OK;
    }
    *cs = a->ConvolutionForward(d->h, &one, e->xd, xb, e->wd, wb, e->cd, e->algo, ws, e->ws, &zero, e->yd, yout);
    if (*cs == TBD_STATUS_SUCCESS && e->nhwc && !ylast) TB_TRY(to_nchw(x, yb, yout, k->n, k->m, k->oh * k->ow, es));
    if (*cs != TBD_STATUS_SUCCESS || e->direct) return TB_OK;
    ep->n = (int64_t)(e->k.n * e->k.m * e->k.oh * e->k.ow);
    ep->ydt = o->dtype;
    ep->adt = o->dtype; /* the product is y itself */
    if (ylast && ep->bias) { /* bias by channel, the fastest dim (the residual is held as y) */
        ep->ncols = k->m;
        ep->bs_n = 1;
        ep->bs_m = 0;
        ep->bmod = INT64_MAX;
    }
    if (!ep->bmod) ep->bmod = INT64_MAX;
    if (!ep->ncols) ep->ncols = 1;
    cudaError_t ce = tbn_epilogue(ep, (const float *)yb, yb, x->stream);
    if (ce != cudaSuccess)
        return tb_errorf(TB_ERR_INTERNAL, "cuda: epilogue launch: %s (%s)", cudaGetErrorString(ce), cudaGetErrorName(ce));
    return TB_OK;
}

/* one run of cuDNN (which 0) or im2col (1) on the stream */
static tb_status run_path(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *const *ib, void *ob,
                          const tbn_epi_args *ep, const tb_view *o, int which, tb_status (*im2col)(void *), void *arg) {
    if (which) return im2col(arg);
    cudnnStatus_t cs;
    tb_status st = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs);
    if (st == TB_OK && cs != TBD_STATUS_SUCCESS) st = dnn_fail(cs, "convolution forward");
    return st;
}

/* Times `reps` runs of cuDNN (which 0) or im2col (1) on the stream, in ms
 * per run; -1 when the events fail. The runs are captured into a CUDA graph
 * and the replay is timed, as the engine's runs are replayed: timed eagerly,
 * a legacy cuDNN call's host time (~0.1 ms a call, more than many of
 * ResNet's convolutions take on the GPU) starved the GPU and made cuDNN lose
 * to im2col everywhere. Eager timing when the capture fails (or
 * TB_CUDA_CONV_TIME_EAGER=1). */
static float time_path(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *const *ib, void *ob,
                       const tbn_epi_args *ep, const tb_view *o, int which, tb_status (*im2col)(void *), void *arg,
                       tb_status *st) {
    cudaEvent_t a = NULL, b = NULL;
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ge = NULL;
    float ms = -1;
    const int reps = 5;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) goto out;
    *st = run_path(x, d, e, ib, ob, ep, o, which, im2col, arg); /* warms up (im2col's scratch, cuBLAS) */
    if (*st != TB_OK) goto out;
    const char *ee = getenv("TB_CUDA_CONV_TIME_EAGER");
    if (!(ee && !strcmp(ee, "1")) && cudaStreamSynchronize(x->stream) == cudaSuccess &&
        cudaStreamBeginCapture(x->stream, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
        tb_status cst = TB_OK;
        for (int r = 0; r < reps && cst == TB_OK; r++) cst = run_path(x, d, e, ib, ob, ep, o, which, im2col, arg);
        cudaError_t ce = cudaStreamEndCapture(x->stream, &gr);
        if (cst == TB_OK && ce == cudaSuccess && gr && cudaGraphInstantiate(&ge, gr, 0) == cudaSuccess &&
            cudaGraphLaunch(ge, x->stream) == cudaSuccess && cudaEventRecord(a, x->stream) == cudaSuccess &&
            cudaGraphLaunch(ge, x->stream) == cudaSuccess && cudaEventRecord(b, x->stream) == cudaSuccess &&
            cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&ms, a, b) == cudaSuccess) {
            ms /= reps;
            goto out;
        }
        ms = -1;
        cudaGetLastError();
        /* the stream left capture; its scratch may have grown there (x->grew): harmless eagerly */
    }
    for (int r = 0; r <= reps && *st == TB_OK; r++) {
        if (r == 1) cudaEventRecord(a, x->stream);
        *st = run_path(x, d, e, ib, ob, ep, o, which, im2col, arg);
    }
    cudaEventRecord(b, x->stream);
    if (*st == TB_OK && cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&ms, a, b) == cudaSuccess)
        ms /= reps;
    else ms = -1;
out:
    cudaGetLastError();
    if (ge) cudaGraphExecDestroy(ge);
    if (gr) cudaGraphDestroy(gr);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    return ms;
}

/* Channels-last: f16 convolutions on cuDNN with x, y (and a fused
 * residual) transposed to (N, H, W, C) around it and the weights kept as
 * (M, kh, kw, C), where cuDNN's tensor-core kernels want them: tried on a
 * geometry's first run after the paths above, timed the same way, and
 * taken when faster than best_ms (the time of the path chosen so far).
 * 1: entry e is now the channels-last one and its output is in ob (*st the
 * status); 0: not taken (nothing changed but the output, which the caller
 * recomputes when ran is set). */
static int try_nhwc(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *const *ib, void *ob,
                    const tbn_epi_args *ep, const tb_view *o, float best_ms, const char *desc, int *ran,
                    tb_status *st) {
    *ran = 0;
    const conv_key *k = &e->k;
    if (d->nhwc_off || !d->api || !d->h || k->xdt != TB_F16 || k->ydt != TB_F16 || k->group != 1 || best_ms < 0)
        return 0;
    conv_entry ne;
    memset(&ne, 0, sizeof ne);
    ne.k = *k;
    ne.nhwc = 1;
    ne.direct = k->bdt < 0 && k->rdt < 0 && k->act == TB_NN_ACT_NONE;
    int relu_or_none = k->act == TB_NN_ACT_NONE || k->act == TB_NN_ACT_RELU;
    int bias_ok = k->bdt < 0 || k->bdt == k->ydt;
    int res_ok = k->rdt < 0 || (k->rdt == k->ydt && (k->after_res || k->act == TB_NN_ACT_NONE));
    ne.path = !ne.direct && relu_or_none && bias_ok && res_ok ? P_FUSED : P_PLAIN;
    size_t xb = (size_t)(k->n * k->c * k->h * k->w) * 2, yb = (size_t)(k->n * k->m * k->oh * k->ow) * 2;
    size_t wb = (size_t)(k->m * k->c * k->kh * k->kw) * 2;
    cudnnStatus_t s = make_descs(d->api, &ne, TBD_TENSOR_OP_MATH);
    if (s == TBD_STATUS_SUCCESS && (tbn_grow(x, &d->xs, &d->xs_bytes, xb, "nhwc scratch") != TB_OK ||
                                    tbn_grow(x, &d->ys, &d->ys_bytes, yb, "nhwc scratch") != TB_OK ||
                                    (k->rdt >= 0 && tbn_grow(x, &d->rs, &d->rs_bytes, yb, "nhwc scratch") != TB_OK) ||
                                    cudaMalloc(&ne.wt, wb) != cudaSuccess))
        s = -2;
    if (s == TBD_STATUS_SUCCESS && ne.path == P_FUSED && k->bdt < 0) {
        if (cudaMalloc(&ne.zero_bias, (size_t)k->m * 2) != cudaSuccess ||
            cudaMemset(ne.zero_bias, 0, (size_t)k->m * 2) != cudaSuccess)
            s = -2;
    }
    if (s == TBD_STATUS_SUCCESS) {
        /* w (M, C, kh, kw) -> (M, kh, kw, C) and x, for the timed search */
        int64_t od[3] = {k->m, (int64_t)k->kh * k->kw, k->c}, wst[3] = {k->c * k->kh * k->kw, 1, (int64_t)k->kh * k->kw};
        if (tbn_strided_copy(ne.wt, ib[1], 3, od, wst, 0, 2, x->stream) != cudaSuccess) s = -2;
        else if (to_nhwc(x, d->xs, ib[0], k->n, k->c, k->h * k->w, 2) != TB_OK) s = -2;
    }
    float ms = -1;
    if (s == TBD_STATUS_SUCCESS) s = pick_algo(x, d, &ne, d->xs, ne.wt, d->ys, &ms);
    if (s == TBD_STATUS_SUCCESS && ne.ws && tbn_grow(x, &d->ws, &d->ws_bytes, ne.ws, "cudnn workspace") != TB_OK) s = -2;
    float tn = -1;
    if (s == TBD_STATUS_SUCCESS) {
        *ran = 1;
        tn = time_path(x, d, &ne, ib, ob, ep, o, 0, NULL, NULL, st);
        if (*st != TB_OK) { cudaGetLastError(); *st = TB_OK; tn = -1; }
    }
    cudaGetLastError();
    if (tn < 0 || (tn >= best_ms && !d->nhwc_force)) {
        if (s == TBD_STATUS_SUCCESS)
            tb_log(TB_LOG_INFO, "cuda: %s: channels-last cudnn algo %s %.4f ms, not faster than %.4f ms", desc,
                   algo_name(ne.algo), tn, best_ms);
        entry_free(d->api, &ne);
        return 0;
    }
    tb_log(TB_LOG_INFO, "cuda: %s: cudnn channels-last%s algo %s, %s math, workspace %zu B, %.4f ms against %.4f ms",
           desc, ne.path == P_FUSED ? " fused" : "", algo_name(ne.algo), math_name(ne.math), ne.ws, tn, best_ms);
    entry_free(d->api, e);
    *e = ne;
    /* its output last */
    cudnnStatus_t cs;
    *st = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs);
    if (*st == TB_OK && cs != TBD_STATUS_SUCCESS) *st = dnn_fail(cs, "convolution forward");
    return 1;
}

/* Entry e (new, key set, lay != 0): the channels-last convolution for a
 * graph that holds x, y (and the residual, as y) channels-last, chosen
 * without timing the (N, C, H, W) paths (their transposes are what the
 * layout saves). 1: made and run (*st its status); 0: cuDNN refused
 * (nothing enqueued that matters: the caller runs im2col). */
/* cuDNN's Find times each algorithm on its own, eagerly: a legacy call's
 * ~0.1 ms of host time is in each figure, more than many of ResNet-18's
 * convolutions take on the GPU, so its order says little (it put the 7x7
 * stem and a stride-2 3x3 on FMA kernels at batch 8). Where y is held
 * channels-last (launch writes the y scratch itself then), the eligible
 * candidates are timed again as the engine runs them, CUDA-graph replays
 * into the scratch (time_path), and the fastest kept (a later one must beat
 * an earlier by 3%). TB_CUDA_CUDNN_RETIME=0: cuDNN's pick. */
static void retime_held(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *const *ib, const tbn_epi_args *ep,
                        const tb_view *o, const algo_cand *c, int n, const char *desc, float *ms_out) {
    const char *ev = getenv("TB_CUDA_CUDNN_RETIME");
    if ((ev && !strcmp(ev, "0")) || n < 2 || !(e->k.lay & TBN_LAY_Y) || !d->find) return;
    const tbd_api *a = d->api;
    int keep_algo = e->algo, keep_math = e->math;
    size_t keep_ws = e->ws;
    float best = -1;
    int bi = -1;
    size_t best_ws = 0;
    char line[600];
    size_t at = 0;
    line[0] = 0;
    for (int i = 0; i < n; i++) {
        if (a->SetConvolutionMathType(e->cd, c[i].math) != TBD_STATUS_SUCCESS) continue;
        size_t need = 0;
        if (a->GetConvolutionForwardWorkspaceSize(d->h, e->xd, e->wd, e->cd, e->yd, c[i].algo, &need) !=
            TBD_STATUS_SUCCESS)
            continue;
        if (need < c[i].mem) need = c[i].mem;
        if (need && tbn_grow(x, &d->ws, &d->ws_bytes, need, "cudnn workspace") != TB_OK) { cudaGetLastError(); continue; }
        e->algo = c[i].algo;
        e->math = c[i].math;
        e->ws = need;
        tb_status st = TB_OK;
        float ms = time_path(x, d, e, ib, d->ys, ep, o, 0, NULL, NULL, &st);
        if (st != TB_OK) ms = -1;
        cudaGetLastError();
        if (at < sizeof line - 80)
            at += (size_t)snprintf(line + at, sizeof line - at, "%s%s/%s %.4f (find %.4f)", i ? ", " : "",
                                   algo_name(c[i].algo), math_name(c[i].math), ms, c[i].ms);
        if (ms >= 0 && (best < 0 || ms < best * 0.97f)) { best = ms; bi = i; best_ws = need; }
    }
    if (bi < 0) {
        e->algo = keep_algo, e->math = keep_math, e->ws = keep_ws;
    } else {
        e->algo = c[bi].algo, e->math = c[bi].math, e->ws = best_ws;
        *ms_out = best;
    }
    a->SetConvolutionMathType(e->cd, e->math);
    tb_log(TB_LOG_INFO, "cuda: %s: cudnn candidates as graph replays, ms: %s; kept %s", desc, line,
           algo_name(e->algo));
}

static int make_held(tbn_ctx *x, dnn_state *d, conv_entry *e, const void *const *ib, void *ob,
                     const tbn_epi_args *ep, const tb_view *o, const char *desc, tb_status *st) {
    const conv_key *k = &e->k;
    e->nhwc = 1;
    e->direct = k->bdt < 0 && k->rdt < 0 && k->act == TB_NN_ACT_NONE;
    int relu_or_none = k->act == TB_NN_ACT_NONE || k->act == TB_NN_ACT_RELU;
    int bias_ok = k->bdt < 0 || k->bdt == k->ydt;
    int res_ok = k->rdt < 0 || (k->rdt == k->ydt && (k->after_res || k->act == TB_NN_ACT_NONE));
    e->path = !e->direct && relu_or_none && bias_ok && res_ok ? P_FUSED : P_PLAIN;
    size_t xb = (size_t)(k->n * k->c * k->h * k->w) * 2, yb = (size_t)(k->n * k->m * k->oh * k->ow) * 2;
    size_t wb = (size_t)(k->m * k->c * k->kh * k->kw) * 2;
    if (!d->h) {
        if (d->api->Create(&d->h) != TBD_STATUS_SUCCESS) { d->h = NULL; return 0; }
        d->api->SetStream(d->h, x->stream);
    }
    cudnnStatus_t s = make_descs(d->api, e, TBD_TENSOR_OP_MATH);
    if (s == TBD_STATUS_SUCCESS &&
        ((!(k->lay & TBN_LAY_X) && tbn_grow(x, &d->xs, &d->xs_bytes, xb, "nhwc scratch") != TB_OK) ||
         tbn_grow(x, &d->ys, &d->ys_bytes, yb, "nhwc scratch") != TB_OK ||
         (k->rdt >= 0 && !(k->lay & TBN_LAY_R) && tbn_grow(x, &d->rs, &d->rs_bytes, yb, "nhwc scratch") != TB_OK) ||
         cudaMalloc(&e->wt, wb) != cudaSuccess))
        s = -2;
    if (s == TBD_STATUS_SUCCESS && e->path == P_FUSED && k->bdt < 0 &&
        (cudaMalloc(&e->zero_bias, (size_t)k->m * 2) != cudaSuccess ||
         cudaMemset(e->zero_bias, 0, (size_t)k->m * 2) != cudaSuccess))
        s = -2;
    const void *xs = ib[0], *ws = NULL;
    if (s == TBD_STATUS_SUCCESS && nhwc_weights(x, d, e, ib[1], &ws) != TB_OK) s = -2;
    if (s == TBD_STATUS_SUCCESS && !(k->lay & TBN_LAY_X)) {
        if (to_nhwc(x, d->xs, ib[0], k->n, k->c, k->h * k->w, 2) != TB_OK) s = -2;
        xs = d->xs;
    }
    algo_cand cand[MAX_CANDS];
    int n_cand = 0;
    float ms = -1;
    /* the search writes the scratch, never y (a residual may share its buffer) */
    if (s == TBD_STATUS_SUCCESS) s = pick_algo_c(x, d, e, xs, ws, d->ys, &ms, cand, &n_cand);
    if (s == TBD_STATUS_SUCCESS && e->ws && tbn_grow(x, &d->ws, &d->ws_bytes, e->ws, "cudnn workspace") != TB_OK) s = -2;
    cudaGetLastError();
    if (s == TBD_STATUS_SUCCESS) retime_held(x, d, e, ib, ep, o, cand, n_cand, desc, &ms);
    if (s != TBD_STATUS_SUCCESS) {
        tb_log(TB_LOG_INFO, "cuda: %s: channels-last cudnn refused (%s)", desc,
               s == -1 ? "no algorithm" : s == -2 ? "out of memory" : tbd_error(s));
        return 0;
    }
    cudnnStatus_t cs;
    *st = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs);
    if (*st == TB_OK && cs != TBD_STATUS_SUCCESS && e->path == P_FUSED) {
        e->path = P_PLAIN;
        *st = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs);
    }
    if (*st != TB_OK) return 1;
    if (cs != TBD_STATUS_SUCCESS) {
        tb_log(TB_LOG_INFO, "cuda: %s: channels-last cudnn refused the convolution (%s)", desc, tbd_error(cs));
        return 0;
    }
    tb_log(TB_LOG_INFO, "cuda: %s: cudnn channels-last%s algo %s, %s math, workspace %zu B, %.4f ms in the search", desc,
           e->path == P_FUSED ? " fused" : "", algo_name(e->algo), math_name(e->math), e->ws, ms);
    return 1;
}

int tbn_conv_cudnn(tbn_ctx *x, const tb_view *in, const tb_view *o, const void *const *ib, void *ob,
                   const tbn_conv_geom *g, int64_t M, int pb, int pr, int group, tbn_epi_args *ep,
                   tb_status (*im2col)(void *), void *im2col_arg, int lay, int w_const, tb_status *st) {
    *st = TB_OK;
    dnn_state *d = state(x);
    if (!d) return 0;
    d->w_const = w_const;
    const tb_view *xv = &in[0];
    conv_key k;
    memset(&k, 0, sizeof k);
    k.n = g->n; k.c = g->c; k.h = g->h; k.w = g->w; k.m = M; k.oh = g->oh; k.ow = g->ow;
    k.kh = g->kh; k.kw = g->kw; k.sh = g->sh; k.sw = g->sw; k.dh = g->dh; k.dw = g->dw;
    k.ph = g->pt; k.pw = g->pl; k.group = group;
    k.xdt = xv->dtype; k.ydt = o->dtype;
    k.bdt = ep->bias ? ep->bdt : -1;
    k.rdt = ep->res ? ep->rdt : -1;
    k.act = ep->act; k.after_res = ep->after_res;
    k.p0 = ep->p0; k.p1 = ep->p1;
    k.lay = lay;
    conv_entry *e = NULL;
    for (int i = 0; i < d->n && !e; i++)
        if (!memcmp(&d->e[i].k, &k, sizeof k)) e = &d->e[i];
    if (!e) {
        char desc[400];
        describe(&k, desc, sizeof desc);
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(x->stream, &cap);
        if (cap != cudaStreamCaptureStatusNone) { /* no setup inside a capture */
            tb_log(TB_LOG_INFO, "cuda: %s: im2col (first seen while capturing a CUDA graph)", desc);
            return 0;
        }
        if (d->n == d->cap) {
            int nc = d->cap ? 2 * d->cap : 16;
            conv_entry *ne = realloc(d->e, sizeof *ne * (size_t)nc);
            if (!ne) return 0;
            d->e = ne;
            d->cap = nc;
        }
        e = &d->e[d->n++];
        memset(e, 0, sizeof *e);
        e->k = k;
        const char *why = NULL;
        char whyb[200];
        if (d->off) why = "cuDNN off: TB_CUDA_CUDNN=0";
        else if (!d->api) why = "no cuDNN library";
        else if (g->pt != pb || g->pl != pr) why = "asymmetric pads";
        else if (o->dtype != xv->dtype || (xv->dtype != TB_F32 && xv->dtype != TB_F16)) why = "output dtype differs";
        else if (k.n > INT32_MAX / 2 || k.c > INT32_MAX / 2 || k.m > INT32_MAX / 2) why = "dims too large";
        if (!why && !d->h) {
            cudnnStatus_t s = d->api->Create(&d->h);
            if (s != TBD_STATUS_SUCCESS) {
                d->h = NULL;
                tb_log(TB_LOG_WARN, "cuda: cudnnCreate failed (%s): convolutions run as im2col + cuBLAS", tbd_error(s));
                d->api = NULL;
                e->path = P_IM2COL;
                return 0;
            }
            d->api->SetStream(d->h, x->stream);
        }
        if (!why && lay) {
            if (make_held(x, d, e, ib, ob, ep, o, desc, st)) return 1;
            why = "cuDNN refused the channels-last convolution";
        }
        if (!why) {
            int relu_or_none = k.act == TB_NN_ACT_NONE || k.act == TB_NN_ACT_RELU;
            int bias_ok = k.bdt < 0 || k.bdt == k.ydt;
            int res_ok = k.rdt < 0 || (k.rdt == k.ydt && (k.after_res || k.act == TB_NN_ACT_NONE));
            e->direct = k.bdt < 0 && k.rdt < 0 && k.act == TB_NN_ACT_NONE;
            e->path = !e->direct && relu_or_none && bias_ok && res_ok ? P_FUSED : P_PLAIN;
            int math = xv->dtype == TB_F16 ? TBD_TENSOR_OP_MATH : d->tf32 ? TBD_DEFAULT_MATH : TBD_FMA_MATH;
            cudnnStatus_t s = make_descs(d->api, e, math);
            float ms = -1;
            /* the timed search writes y: a residual that shares y's buffer would be lost */
            void *ytmp = NULL, *yb = ob;
            if (s == TBD_STATUS_SUCCESS && d->find && ep->res == ob) {
                if (cudaMalloc(&ytmp, (size_t)(k.n * k.m * k.oh * k.ow) * (xv->dtype == TB_F16 ? 2 : 4)) ==
                    cudaSuccess)
                    yb = ytmp;
                else cudaGetLastError();
            }
            if (s == TBD_STATUS_SUCCESS) s = pick_algo(x, d, e, ib[0], ib[1], yb, &ms);
            cudaFree(ytmp);
            if (s == TBD_STATUS_SUCCESS && e->ws) {
                tb_status gs = tbn_grow(x, &d->ws, &d->ws_bytes, e->ws, "cudnn workspace");
                if (gs != TB_OK) { cudaGetLastError(); s = -2; }
            }
            if (s == TBD_STATUS_SUCCESS && e->path == P_FUSED && k.bdt < 0) {
                size_t bb = (size_t)k.m * (xv->dtype == TB_F16 ? 2 : 4);
                if (cudaMalloc(&e->zero_bias, bb) != cudaSuccess || cudaMemset(e->zero_bias, 0, bb) != cudaSuccess) {
                    cudaGetLastError();
                    s = -2;
                }
            }
            if (s != TBD_STATUS_SUCCESS) {
                snprintf(whyb, sizeof whyb, "cuDNN refused: %s",
                         s == -1 ? "no algorithm" : s == -2 ? "out of memory" : tbd_error(s));
                why = whyb;
            } else {
                /* the first run: a refusal here demotes the entry before anything is captured */
                cudnnStatus_t cs;
                tb_status ls = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs);
                if (ls != TB_OK) { *st = ls; return 1; }
                if (cs != TBD_STATUS_SUCCESS && e->path == P_FUSED) {
                    tb_log(TB_LOG_INFO, "cuda: %s: fused cudnnConvolutionBiasActivationForward refused (%s); "
                           "convolution + epilogue instead", desc, tbd_error(cs));
                    e->path = P_PLAIN;
                    ls = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs);
                    if (ls != TB_OK) { *st = ls; return 1; }
                }
                if (cs != TBD_STATUS_SUCCESS) {
                    snprintf(whyb, sizeof whyb, "cuDNN refused the convolution: %s", tbd_error(cs));
                    why = whyb;
                } else {
                    char fuse[64] = "";
                    if (e->path == P_FUSED)
                        snprintf(fuse, sizeof fuse, " fused (bias%s%s)", k.act == TB_NN_ACT_RELU ? "+relu" : "",
                                 k.rdt >= 0 ? "+residual" : "");
                    else if (!e->direct) snprintf(fuse, sizeof fuse, " + epilogue kernel");
                    char tm[96] = "";
                    float tc = -1, ti = -1;
                    if (!d->force) { /* the faster of cuDNN and im2col for this geometry */
                        tc = time_path(x, d, e, ib, ob, ep, o, 0, im2col, im2col_arg, st);
                        if (*st == TB_OK) ti = time_path(x, d, e, ib, ob, ep, o, 1, im2col, im2col_arg, st);
                        if (*st != TB_OK) return 1;
                    }
                    if (tc >= 0 && ti >= 0) snprintf(tm, sizeof tm, ", %.4f ms against im2col's %.4f ms", tc, ti);
                    else if (ms >= 0) snprintf(tm, sizeof tm, ", %.4f ms in the search", ms);
                    int nran = 0;
                    if (tc >= 0 && ti >= 0 &&
                        try_nhwc(x, d, e, ib, ob, ep, o, ti < tc ? ti : tc, desc, &nran, st))
                        return 1;
                    if (nran && ti >= 0 && ti < tc && *st == TB_OK) *st = im2col(im2col_arg); /* its output again */
                    if (*st != TB_OK) return 1;
                    if (tc >= 0 && ti >= 0 && ti < tc) {
                        /* im2col ran last: the output is its */
                        snprintf(whyb, sizeof whyb, "faster: cudnn%s algo %s%s", fuse, algo_name(e->algo), tm);
                        why = whyb;
                        tb_log(TB_LOG_INFO, "cuda: %s: im2col (%s)", desc, why);
                        entry_free(d->api, e);
                        e->k = k;
                        e->path = P_IM2COL;
                        return 1;
                    }
                    if (ti >= 0 || nran) { /* cuDNN chosen: its output last */
                        cudnnStatus_t cs2;
                        tb_status ls2 = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs2);
                        if (ls2 == TB_OK && cs2 != TBD_STATUS_SUCCESS) ls2 = dnn_fail(cs2, "convolution forward");
                        *st = ls2;
                    }
                    tb_log(TB_LOG_INFO, "cuda: %s: cudnn%s algo %s, %s math, workspace %zu B%s", desc, fuse,
                           algo_name(e->algo), math_name(e->math), e->ws, tm);
                    return 1;
                }
            }
        }
        tb_log(TB_LOG_INFO, "cuda: %s: im2col (%s)", desc, why);
        entry_free(d->api, e);
        e->k = k;
        e->path = P_IM2COL;
        return 0;
    }
    if (e->path == P_IM2COL) return 0;
    cudnnStatus_t cs;
    *st = launch(x, d, e, ib[0], ib[1], ob, ep, o, &cs);
    if (*st == TB_OK && cs != TBD_STATUS_SUCCESS) *st = dnn_fail(cs, "convolution forward");
    return 1;
}
