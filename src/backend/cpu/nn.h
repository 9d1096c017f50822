/*
 * nn.h — CPU kernels of the general ops (ops_nn.h): one table per group
 * (nn_elem.c, nn_shape.c, nn_conv.c, nn_quant.c in this folder) giving a fast kernel for
 * an op, or NULL where the op's reference kernel (src/ir/nn_*.c) is used as
 * it is. Kernels see concrete views, may split work over the pool and take
 * scratch memory from the context (grown on the first runs of a shape, never
 * per call afterwards).
 */
#ifndef TB_CPU_NN_H
#define TB_CPU_NN_H
#include "ir/ops_nn.h"

typedef struct {
    tb_pool *pool;      /* NULL: the calling thread alone */
    void *scratch;      /* tb_alloc_aligned'd, 64-byte aligned */
    size_t scratch_cap;
    const tb_graph *graph; /* the running graph (NULL: unknown): tells which inputs are weights */
    void *wpack;        /* weights packed for the GEMM, made on first use (nn_conv.c) */
} tb_cpu_nn_ctx;

/* At least `bytes` of scratch (valid until the next call); NULL on OOM. */
void *tb_cpu_nn_scratch(tb_cpu_nn_ctx *c, size_t bytes);
/* Frees the scratch and the packed weights. */
void tb_cpu_nn_ctx_release(tb_cpu_nn_ctx *c);

typedef tb_status (*tb_cpu_nn_fn)(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in,
                                  const tb_view *out, int n_out);

tb_cpu_nn_fn tb_cpu_nn_elem_kernel(tb_op_kind k);
tb_cpu_nn_fn tb_cpu_nn_shape_kernel(tb_op_kind k);
tb_cpu_nn_fn tb_cpu_nn_conv_kernel(tb_op_kind k);
tb_cpu_nn_fn tb_cpu_nn_quant_kernel(tb_op_kind k); /* QConv, QGemm (nn_quant.c) */

/* Runs general op n: the fast kernel when there is one, else the reference. */
tb_status tb_cpu_nn_run(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                        int n_out);

/* Times the Conv tactics of g at its symbols' opt values on n_threads and
 * stores the fastest in each Conv node's tactic (nn_tune.c; a graph whose
 * shapes cannot be computed there keeps the kernels' rules). *n_tuned: the
 * Conv nodes timed. */
tb_status tb_cpu_nn_tune_convs(tb_graph *g, int n_threads, int verbose, int *n_tuned);

/* C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, row-major f32
 * with leading dims (op: transposed when ta / tb); beta 0 ignores C's
 * contents. Split over the pool when given. (sgemm.c) */
void tb_cpu_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, tb_pool *pool);

/* The fused epilogue of Conv / Gemm / MatMul (ops_nn.h) applied to each
 * tile of C while it is in cache, after alpha * op(A) op(B) + beta * C:
 *   v += bias_scale * bias[i * bias_rs + j * bias_cs]   (bias: per row,
 *        per column, a whole matrix or a scalar, by the strides)
 *   C = act(v) + res, or act(v + res) with act_after_res.
 * A zero struct (act 0, no bias, no residual) is the plain GEMM. */
typedef struct {
    const float *bias;
    int64_t bias_rs, bias_cs;
    float bias_scale;       /* 0 reads as 1 */
    const float *res;       /* (M, N) with leading dim ld_res */
    int64_t ld_res;
    int act;                /* tb_nn_act */
    float p0, p1;           /* its parameters */
    int act_after_res;
} tb_cpu_sgemm_epi;

/* tb_cpu_sgemm with an epilogue (NULL: none). */
void tb_cpu_sgemm_ex(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float beta, float *C, int64_t ldc, const tb_cpu_sgemm_epi *epi,
                     tb_pool *pool);

#endif /* TB_CPU_NN_H */
