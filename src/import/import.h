/*
 * import.h — reading trained models into one neutral form.
 *
 * A tb_model_source is a model's configuration plus its named tensors, read
 * without copying (tensor data points into mmapped files). Two front ends:
 *   - a Hugging Face folder: config.json + model.safetensors, or sharded
 *     model.safetensors.index.json + shards; f32/f16/bf16 tensors;
 *     architectures LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM;
 *   - a llama2.c checkpoint (.bin): the 7-int header (negative vocab_size
 *     means a separate classifier), f32 weights. Its tensors are exposed under
 *     the Hugging Face names (model.embed_tokens.weight,
 *     model.layers.N.self_attn.q_proj.weight, ..., lm_head.weight) with the
 *     Meta q/k layout kept, so cfg.rope_interleaved = 1.
 * Everything unsupported (architecture, dtype, missing tensor, malformed
 * header, sizes that disagree with the config) fails with a message that
 * names it.
 */
#ifndef TB_IMPORT_H
#define TB_IMPORT_H

#include "core/core.h"

#define TB_MAX_EOS 4

typedef enum { TB_ROPE_SCALING_NONE = 0, TB_ROPE_SCALING_LLAMA3 = 1,
               TB_ROPE_SCALING_LINEAR = 2 } tb_rope_scaling;

typedef struct {
    char arch[32];          /* "llama", "mistral", "qwen2"                 */
    int vocab_size;
    int dim;                /* hidden_size                                 */
    int hidden_dim;         /* intermediate_size                           */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;           /* config head_dim, else dim / n_heads         */
    int max_seq_len;        /* max_position_embeddings (llama2.c: seq_len) */
    float norm_eps;         /* rms_norm_eps (llama2.c: 1e-5)               */
    float rope_theta;       /* default 10000                               */
    tb_rope_scaling rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;   /* llama3: low_freq_factor  */
    float rope_high_freq_factor;  /* llama3: high_freq_factor */
    int rope_orig_max_pos;        /* llama3: original_max_position_embeddings */
    int rope_interleaved;   /* 1: Meta/llama2.c pair layout                */
    int tie_embeddings;     /* lm_head shares embed_tokens                 */
    int attn_bias;          /* q/k/v projections have biases (qwen2)       */
    int bos_id;             /* -1 when unknown                             */
    int eos_ids[TB_MAX_EOS];/* -1 padded                                   */
    int n_eos;
    tb_dtype src_dtype;     /* torch_dtype / dominant tensor dtype         */
} tb_model_config;

typedef struct {
    char name[128];
    tb_dtype dtype;         /* f32, f16 or bf16                            */
    int rank;
    int64_t dims[4];        /* PyTorch order, e.g. (out, in) for Linear    */
    const void *data;       /* into a mapped file; little-endian           */
    size_t nbytes;
} tb_src_tensor;

typedef struct tb_model_source tb_model_source;

/* `path`: a folder (Hugging Face) or a .bin file (llama2.c). */
tb_status tb_source_open(const char *path, tb_model_source **out);
void tb_source_free(tb_model_source *s);

const tb_model_config *tb_source_config(const tb_model_source *s);
/* NULL when absent (no error recorded). */
const tb_src_tensor *tb_source_find(const tb_model_source *s, const char *name);
/* Like find, but a missing tensor or a shape other than (d0, d1) [d1 = -1 for
 * rank 1] is an error naming the tensor and the shapes. */
tb_status tb_source_get(const tb_model_source *s, const char *name,
                        int64_t d0, int64_t d1, const tb_src_tensor **out);
int tb_source_tensor_count(const tb_model_source *s);
const tb_src_tensor *tb_source_tensor_at(const tb_model_source *s, int i);

/* Where the model's own tokenizer is: "DIR/tokenizer.json" for a folder that
 * has one, else "" (the caller then needs --tokenizer). The folder to read
 * tokenizer_config.json etc. from ("" for a llama2.c file). */
const char *tb_source_tokenizer_path(const tb_model_source *s);
const char *tb_source_dir(const tb_model_source *s);

#endif /* TB_IMPORT_H */
