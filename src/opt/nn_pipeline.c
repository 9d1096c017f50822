/* nn_pipeline.c — the ordered pass list for general (ONNX) graphs (opt.h).
 * Clean-up first (so patterns see constants and no Identity), then the
 * fusions that need the plain ops (LayerNorm, GELU, attention) before the
 * ones that rewrite Conv / Gemm / MatMul (which would hide them), the
 * epilogue, the INT8 pass (quantized ops keep the fused epilogues), then
 * the attention layout passes (nn_merge.c: after the epilogue, so the
 * projections carry their biases), then the memory account. */
#include "opt/opt.h"

static const tb_pass nn_passes[] = {
    {"remove-identity", tb_opt_remove_identity, "Identity (and Dropout, imported as Identity) bypassed"},
    {"fold-constants", tb_opt_fold_constants,
     "nodes whose inputs are constants evaluated into weights (Shape of fixed dims too), up to 64 MiB each"},
    {"dead-nodes", tb_opt_dead_nodes, "nodes whose outputs nothing reads removed"},
    {"merge-transpose-reshape", tb_opt_merge_transpose_reshape,
     "consecutive Transposes composed, Reshape chains merged, no-op Transpose / Reshape removed"},
    {"fuse-layernorm", tb_opt_fuse_layernorm,
     "ReduceMean / Sub / Pow / ReduceMean / Add eps / Sqrt / Div [* gamma + beta] as LayerNormalization"},
    {"fuse-gelu", tb_opt_fuse_gelu, "x * 0.5 * (1 + erf(x / sqrt 2)) and the tanh form as Gelu"},
    {"fuse-attention", tb_opt_fuse_attention,
     "MatMul(q, k^T) [scale] [+ mask] -> Softmax -> MatMul(., v) as the fused sdpa op"},
    {"fold-batchnorm", tb_opt_fold_batchnorm,
     "BatchNormalization and per-channel constant Mul after Conv / Gemm / MatMul folded into weights and bias"},
    {"fold-transpose-matmul", tb_opt_fold_transpose_matmul, "Transpose of the last two dims read through trans flags"},
    {"fuse-epilogue", tb_opt_fuse_epilogue,
     "constant bias Add, activation and residual Add after Conv / Gemm / MatMul fused into its epilogue"},
    {"quantize-int8", tb_opt_quantize_nn,
     "Q/DQ around Conv / Gemm / MatMul folded into int8 QConv / QGemm; with --dtype int8 the calibrated ones"},
    {"attention-heads", tb_opt_attention_heads,
     "head split / merge Reshape + Transpose around sdpa folded: sdpa reads and writes (B, S, H*D)"},
    {"merge-qkv", tb_opt_merge_qkv,
     "the q / k / v MatMuls [+ bias] of one input as one MatMul over concatenated weights, read packed by sdpa"},
    {"plan-memory", tb_opt_plan_memory_pass, "activation bytes without reuse vs. the planned arena"},
};

const tb_pass *tb_opt_nn_pipeline(int *n) {
    *n = (int)(sizeof nn_passes / sizeof nn_passes[0]);
    return nn_passes;
}
