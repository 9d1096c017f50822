/*
 * nn_shape.h — what the shape and pooling ops' reference kernels
 * (nn_shape.c) share with the backends' kernels, so that ONNX's clamping and
 * padding rules live in one place: the walk a Transpose / Slice / Expand
 * output takes through its input, and pooling geometry.
 */
#ifndef TB_IR_NN_SHAPE_H
#define TB_IR_NN_SHAPE_H
#include "ir/ops_nn.h"

/* Transpose's perm from n's attributes for a rank-`rank` input. */
tb_status tb_nn_transpose_perm(const tb_node *n, int rank, int *perm);
/* Output element (j_0, ..., j_r-1) of Slice reads input element
 * base + sum_k j_k * strides[k] (element units; a stride is negative for a
 * negative step). Checks out's dims against the rule. in: the node's inputs
 * with their data (host inputs included). */
tb_status tb_nn_slice_plan(const tb_view *in, int n_in, const tb_view *out, int64_t *base, int64_t *strides);
/* Strides reading x broadcast to out's dims (0 along broadcast dims). */
void tb_nn_broadcast_strides(const tb_view *x, const tb_view *out, int64_t *strides);
/* MaxPool / AveragePool geometry of node n over x (N, C, [H,] W), pads
 * resolved (auto_pad applied; h = 1 for rank 3). */
tb_status tb_nn_pool_geom(const tb_node *n, const tb_view *x, tb_nn_conv_geom *g);

#endif /* TB_IR_NN_SHAPE_H */
