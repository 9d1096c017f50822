/*
 * models.h — model builders: from an imported model to a graph of the IR.
 *
 * A builder knows one family's wiring and emits the fused form directly:
 * q|k|v projections concatenated into one matmul (biases too), gate|up into
 * one matmul followed by silu_mul, each residual add fused with the next
 * RMSNorm, RoPE and the KV-cache write inside the attention op, and the LM
 * head applied only to the rows whose logits a step asks for. Weights are
 * converted to the engine's dtype here (norms, biases and RoPE frequencies
 * stay f32).
 */
#ifndef TB_MODELS_H
#define TB_MODELS_H

#include "import/import.h"
#include "ir/ir.h"

typedef struct {
    tb_dtype weight_dtype;
    int max_seq_len;      /* longest sequence (context)        */
    int max_step_tokens;  /* the `tokens` profile maximum      */
    void (*progress)(void *arg, int done, int total);
    void *progress_arg;
    /* 1: matmul and embedding weights are not converted but point at the
     * source's mapped tensors, in the source's dtype (owned = 0), for a later
     * pass (the quantize pass) to convert one at a time: a quantized build
     * never holds the whole model converted. The source must outlive the
     * graph. weight_dtype is then ignored. */
    int source_weights;
    /* Tensor parallelism (Megatron-style): the graph of rank tp_rank of
     * tp_size (0 or 1: the whole model). Each rank holds the heads
     * [r H/n, (r+1) H/n) (q, k, v rows: column-parallel) and the matching
     * columns of o_proj (row-parallel, an all_reduce after it), the rows
     * [r F/n, ...) of gate and up and the columns of down (an all_reduce
     * after it), and the vocabulary rows [r V/n, ...) of the embedding
     * (vocab_offset, then an all_reduce) and of the LM head (an
     * all_gather_cols of the logits). H, KV, F and V must divide by n. */
    int tp_size, tp_rank;
} tb_model_build_opts;

/* Supported families: llama, mistral, qwen2 (one wiring, differing in
 * biases and tying). */
tb_status tb_model_build_graph(const tb_model_source *src,
                               const tb_model_build_opts *o, tb_graph **out);

/* RoPE inverse frequencies (hd/2) with the config's scaling applied. */
void tb_rope_inv_freq(const tb_model_config *c, float *inv_freq);

#endif
