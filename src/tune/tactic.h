/*
 * tactic.h — what a node's `tactic` word holds. The build chooses it (the
 * tuner in tune/, the passes for the target device in opt/) and stores it in
 * the engine's graph; the backends and the memory planner read it. Loading
 * never chooses again: a field left 0 means the fixed default.
 *
 *   bits  0..7   CPU matmul kernel for steps below TB_CPU_GEMM_MIN_T tokens
 *                (tb_mm_tactic; 0: the own kernels)
 *   bits  8..15  CPU matmul kernel for larger steps
 *   bits 16..23  CUDA decode GEMV kernel (TBC_SIMT_* + 1; 0: the default),
 *                timed by `turbine build --device cuda`; on int8 / int4
 *                qmatmuls TB_GEMV_Q8 (`--qmm-tactics q8`): one-token steps
 *                with x rounded to int8 per block of 32, and int8 steps of
 *                9+ tokens on the int8 GEMM with x rounded to int8 a token
 *   bits 24..28  CUDA fusion with the following node(s) (TB_FUSE_*), set by
 *                the cuda_fuse pass of `--device cuda` builds
 *   bit  29      the node runs together with the next one: the memory
 *                planner keeps its inputs live until the next node is done
 *                (a fused epilogue writes the next node's output while other
 *                blocks still read this node's inputs)
 */
#ifndef TB_TUNE_TACTIC_H
#define TB_TUNE_TACTIC_H

#define TB_TACTIC_GEMV_SHIFT 16
#define TB_TACTIC_FUSE_SHIFT 24
#define TB_TACTIC_WITH_NEXT (1 << 29)
#define TB_GEMV_Q8 0x40

/* Fusion of node k with the nodes after it, as the CUDA backend runs it. */
enum {
    TB_FUSE_ROPE = 1,    /* matmul k -> attention k+1: RoPE and the KV write
                          * in the GEMV's epilogue                           */
    TB_FUSE_GLU = 2,     /* matmul k -> silu_mul k+1: silu_mul in the
                          * epilogue (k+1 skipped)                           */
    TB_FUSE_ADDNORM = 4, /* matmul k -> add_rmsnorm k+1 -> matmul k+2: the add
                          * in k's epilogue, the norm in k+2's prologue; the
                          * norm weight is folded into k+2's weight (ones)    */
    TB_FUSE_NORM = 8,    /* rmsnorm k -> matmul k+1: the norm in the GEMV's
                          * prologue; its weight folded into k+1's (ones)    */
    TB_FUSE_X16 = 16,    /* rmsnorm / add_rmsnorm / silu_mul k -> matmul k+1
                          * with f16/bf16 weights: k writes k+1's converted
                          * input for cuBLAS                                 */
};
#define TB_FUSE_MASK 0x1f

static inline int tb_tactic_fuse(int tactic) { return (tactic >> TB_TACTIC_FUSE_SHIFT) & TB_FUSE_MASK; }
static inline int tb_tactic_gemv(int tactic) { return (tactic >> TB_TACTIC_GEMV_SHIFT) & 0xff; }

#endif /* TB_TUNE_TACTIC_H */
