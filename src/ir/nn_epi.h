/*
 * nn_epi.h — the fused epilogue of the reference compute kernels (Conv,
 * Gemm, MatMul in nn_conv.c; QConv, QGemm in nn_quant.c): where a node's
 * optional bias and residual inputs are, and the activation / residual
 * applied to one output element. Internal to src/ir.
 */
#ifndef TB_IR_NN_EPI_H
#define TB_IR_NN_EPI_H
#include "ir/ops_nn.h"

/* Where the optional inputs are, after `n_operands` fixed ones: bias index
 * (or -1), residual index (or -1). */
static inline void epi_inputs(int flags, int n_in, int n_operands, int *bias, int *res) {
    int has_res = (flags & TB_NN_HAS_RESIDUAL) != 0;
    *res = has_res ? n_in - 1 : -1;
    *bias = n_in - has_res > n_operands ? n_operands : -1;
}

/* y = epilogue(v) for one output element; bias already folded into v. */
static inline float epi_apply(double v, int act, float p0, float p1, int after_res, const float *res, int64_t i) {
    if (res && after_res) v += res[i];
    v = tb_nn_act_apply((tb_nn_act)act, v, p0, p1);
    if (res && !after_res) v += res[i];
    return (float)v;
}

#endif /* TB_IR_NN_EPI_H */
