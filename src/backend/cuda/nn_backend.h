/*
 * nn_backend.h — the general ops inside the CUDA backend (nn_backend.c): the
 * state they keep (scratch for matmul products and im2col) and the two
 * entry points cuda_backend.c calls.
 */
#ifndef TB_CUDA_NN_BACKEND_H
#define TB_CUDA_NN_BACKEND_H

#include "backend/backend.h"
#include "backend/cuda/nn_cuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>

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
} tbn_ctx;

/* Whether the backend runs node n (a general op) with its graph dtypes. */
int tbn_supports(const tb_graph *g, const tb_node *n);
/* Enqueues node n on x->stream; shapes and host inputs from st->views. */
tb_status tbn_run_node(tbn_ctx *x, const tb_graph *g, const tb_node *n, void *const *bufs, const tb_step *st);
void tbn_ctx_free(tbn_ctx *x);

#endif /* TB_CUDA_NN_BACKEND_H */
