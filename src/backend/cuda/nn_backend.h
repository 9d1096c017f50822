/*
 * nn_backend.h — the general ops inside the CUDA backend (nn_backend.c): the
 * state they keep (scratch for matmul products and im2col, cuDNN's handle
 * and per-geometry plans) and the entry points cuda_backend.c calls.
 */
#ifndef TB_CUDA_NN_BACKEND_H
#define TB_CUDA_NN_BACKEND_H

#include "backend/backend.h"
#include "backend/cuda/nn_cuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>

/* which activations a graph's run holds channels-last (nn_layout.c) */
typedef struct {
    const tb_graph *g;       /* the graph planned (with its nodes, counts) */
    const tb_node *nodes;
    int n_nodes, n_values;
    uint8_t *nhwc;           /* per value: 1 held (N, H, W, C)           */
    int cap, n_nhwc;
} tbn_layout;

typedef struct {
    cudaStream_t stream;     /* the backend's stream and cuBLAS handle */
    cublasHandle_t blas;
    float *acc;              /* f32 products before an f16 epilogue     */
    size_t acc_bytes;
    void *col;               /* im2col                                  */
    size_t col_bytes;
    int grew;                /* a scratch buffer moved (graphs stale)   */
    cublasLtHandle_t lt;     /* matmuls with a fused epilogue           */
    void *lt_ws;             /* its workspace (TBN_LT_WS bytes)         */
    int lt_off;              /* TB_CUDA_LT=0: the epilogue kernel always */
    struct { uint64_t key; cublasLtMatmulAlgo_t algo; } *lt_picks; /* timed algorithm per shape */
    int n_lt_picks, cap_lt_picks;
    /* picks kept on disk (tune/tune_cache.h, TURBINE_TUNE_CACHE): a shape's
     * index in the heuristic's list; tune_cache 0 not opened, 1 on, -1 off */
    struct { uint64_t key; int idx; } *lt_known;
    int n_lt_known, cap_lt_known;
    int tune_cache;
    char tune_ident[256];
    char tune_path[1024];
    void *dnn;               /* cuDNN convolutions (nn_cudnn.c), or NULL */
    tbn_layout lay;          /* channels-last activations (nn_layout.c) */
    void *lx, *ly, *lr;      /* (N, C, H, W) copies for a channels-last conv on im2col */
    size_t lx_bytes, ly_bytes, lr_bytes;
} tbn_ctx;

/* Whether the backend runs node n (a general op) with its graph dtypes. */
int tbn_supports(const tb_graph *g, const tb_node *n);
/* Enqueues node n on x->stream; shapes and host inputs from st->views. */
tb_status tbn_run_node(tbn_ctx *x, const tb_graph *g, const tb_node *n, void *const *bufs, const tb_step *st);
void tbn_ctx_free(tbn_ctx *x);

/* Scratch buffer *p of at least `need` bytes (grows by a quarter more; the
 * old one is freed after the stream drains, and x->grew is set). */
tb_status tbn_grow(tbn_ctx *x, void **p, size_t *have, size_t need, const char *what);
/* Conv on cuDNN (nn_cudnn.c): 1 when it ran there (*st its status), 0 when
 * the caller runs im2col. g: the geometry with pads top / left (pb, pr the
 * bottom / right ones); ep: the fused epilogue as the im2col path has it;
 * im2col(arg) runs the im2col path (timed against cuDNN on a geometry's
 * first run). */
/* lay: TBN_LAY_X / _Y / _R when x / y / the residual are held
 * channels-last (nn_layout.c; the residual as y); then the convolution runs
 * channels-last on cuDNN without timing the other paths, and 0 (cuDNN
 * refused) leaves the caller to run im2col over (N, C, H, W) copies. w_const:
 * the weights are the engine's (their channels-last copy is kept until
 * tbn_cudnn_weights_reset). */
#define TBN_LAY_X 1
#define TBN_LAY_Y 2
#define TBN_LAY_R 4
int tbn_conv_cudnn(tbn_ctx *x, const tb_view *in, const tb_view *o, const void *const *ib, void *ob,
                   const tbn_conv_geom *g, int64_t M, int pb, int pr, int group, tbn_epi_args *ep,
                   tb_status (*im2col)(void *), void *im2col_arg, int lay, int w_const, tb_status *st);
void tbn_cudnn_free(tbn_ctx *x);
/* the engine's weights are about to change: channels-last copies dropped */
void tbn_cudnn_weights_reset(tbn_ctx *x);
/* whether channels-last convolutions can run (cuDNN loaded, not turned off) */
int tbn_cudnn_nhwc_ok(tbn_ctx *x);

/* The channels-last plan of graph g (nn_layout.c): made by run_begin, and
 * again by tbn_nhwc when another graph runs without it. */
void tbn_layout_plan(tbn_ctx *x, const tb_graph *g);
/* whether value v of graph g is held (N, H, W, C) */
int tbn_nhwc(tbn_ctx *x, const tb_graph *g, int v);
void tbn_layout_free(tbn_ctx *x);

#endif /* TB_CUDA_NN_BACKEND_H */
