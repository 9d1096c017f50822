/*
 * nn_conv_impl.h — the pieces the compute kernels of this folder share
 * (nn_conv.c, sgemm.c, winograd.c); not used outside backend/cpu.
 */
#ifndef TB_CPU_NN_CONV_IMPL_H
#define TB_CPU_NN_CONV_IMPL_H
#include "backend/cpu/nn.h"

/* Conv tactics (tb_node.tactic; 0: the kernel chooses) */
enum {
    TB_CONV_TACTIC_AUTO = 0,
    TB_CONV_TACTIC_IM2COL = 1,
    TB_CONV_TACTIC_WINOGRAD = 2,  /* F(2x2, 3x3) */
    TB_CONV_TACTIC_WINOGRAD4 = 3, /* F(4x4, 3x3) (AVX-512; F(2x2) elsewhere) */
    TB_CONV_TACTIC_DIRECT = 4,    /* direct, channels in the lanes (AVX-512, one group; im2col elsewhere) */
    TB_CONV_TACTIC_WINOGRAD4F = 5, /* F(4x4, 3x3) by tile blocks, one pass (AVX-512; F(2x2) elsewhere) */
};

/* Bits 8..15 of a Conv node's tactic word: the batch its tactic was timed
 * at (nn_tune.c); at another batch the kernel's rule runs instead (one
 * tactic word serves every shape of the profiles, and a kernel that wins at
 * batch 1 can lose by a third at batch 8). 0: every batch. */
#define TB_CONV_TACTIC_BATCH_SHIFT 8

/* The tactic Conv node n runs at geometry g: its own (bits 0..7) where it
 * has one for g's batch, else the rule's (nn_conv.c). */
int tb_cpu_conv_tactic(const tb_node *n, const tb_nn_conv_geom *g);

/* The tactic the kernel's rule (TB_CONV_TACTIC_AUTO) runs for geometry g
 * (one group; AUTO for grouped and depthwise convs, which have one kernel
 * each) (nn_conv.c). */
int tb_cpu_conv_rule(const tb_nn_conv_geom *g);

/* The sgemm epilogue (bias, activation, residual) over C (M, N) with leading
 * dim ldc, in place, with the vector code of the sgemm's ISA (sgemm.c). */
void tb_cpu_nn_epilogue(float *c, int64_t ldc, int64_t M, int64_t N, const tb_cpu_sgemm_epi *e);
/* x[0, n) = softmax(x) in place; a row of -inf only gives zeros (sgemm.c). */
void tb_cpu_nn_softmax_row(float *x, int64_t n);

/* GEMM with B packed once (a weight): tb_cpu_sgemm_pack_b writes op(B)
 * (K, N) into the kernel's panel layout, tb_cpu_sgemm_packed_floats(K, N)
 * floats at a 64-byte aligned dst; tb_cpu_sgemm_packed is tb_cpu_sgemm_ex
 * reading those panels in place (no packing of B per call). (sgemm.c) */
size_t tb_cpu_sgemm_packed_floats(int64_t K, int64_t N);
void tb_cpu_sgemm_pack_b(int tb, int64_t K, int64_t N, const float *B, int64_t ldb, float *dst);
void tb_cpu_sgemm_packed(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                         const float *Bp, float beta, float *C, int64_t ldc, const tb_cpu_sgemm_epi *epi,
                         tb_pool *pool);

/* The context's cache of weights in a kernel's layout (nn_conv.c): the
 * form `kind` (TB_WPACK_*) of weight w, node n's input `input`, with shape
 * key (d0, d1, d2), `floats` floats made by make(w, dst, arg) on its first
 * use and kept until the context is released. NULL when that input is not a
 * weight of the context's graph (its contents may change between calls:
 * the caller makes its own copy per call) or on OOM. */
enum { TB_WPACK_GEMM_B = 1, TB_WPACK_WINO2, TB_WPACK_WINO4, TB_WPACK_DIRECT, TB_WPACK_WINO4F };
typedef void (*tb_cpu_wpack_make)(const float *w, float *dst, const void *arg);
const float *tb_cpu_nn_wpack(tb_cpu_nn_ctx *ctx, const tb_node *n, int input, const float *w, int kind, int64_t d0,
                             int64_t d1, int64_t d2, size_t floats, tb_cpu_wpack_make make, const void *arg);
/* Frees the context's packed weights (nn_conv.c). */
void tb_cpu_nn_wpack_free(tb_cpu_nn_ctx *c);

/* Conv by Winograd F(2x2, 3x3), or F(4x4, 3x3) with f4 (AVX-512): 3x3,
 * stride 1, dilation 1, one group (winograd.c). */
tb_status tb_cpu_conv_winograd(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_nn_conv_geom *g, int f4,
                               const float *x, const float *w, const float *bias, const float *res, float *y);

/* Conv by Winograd F(4x4, 3x3) in blocks of 32 tiles, each block's input
 * transform, products, output transform and epilogue on one thread while
 * its tiles are in L1/L2 (winograd.c; same geometry as above; without
 * AVX-512 it runs tb_cpu_conv_winograd's F(2x2)). */
tb_status tb_cpu_conv_winograd4_fused(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_nn_conv_geom *g, const float *x,
                                      const float *w, const float *bias, const float *res, float *y);

/* Conv directly over output pixels, 64 output channels in the lanes
 * (conv_direct.c): one group, AVX-512 (tb_cpu_conv_direct_ok). */
int tb_cpu_conv_direct_ok(const tb_nn_conv_geom *g);
tb_status tb_cpu_conv_direct(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_nn_conv_geom *g, const float *x,
                             const float *w, const float *bias, const float *res, float *y);

#endif /* TB_CPU_NN_CONV_IMPL_H */
