/*
 * turbine.h — the public C API of Turbine, an inference compiler and runtime.
 *
 * Offline, `tb_build` turns a model (a Hugging Face folder or a llama2.c
 * checkpoint) into one engine file. Online, `tb_engine_load` maps and verifies
 * an engine, `tb_context_create` allocates everything a generation needs (the
 * activation arena and the paged KV cache) once, and `tb_context_step` runs one
 * flattened batch of tokens from any number of sequences, each at its own
 * position. Nothing is allocated per token.
 *
 * Every fallible call returns a tb_status; on failure `tb_last_error()` holds a
 * message for the user (per thread). Objects come in create/free pairs and
 * every free accepts NULL.
 */
#ifndef TURBINE_H
#define TURBINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */
typedef enum {
    TB_OK = 0,
    TB_ERR_INVALID_ARG,  /* a caller passed something out of range        */
    TB_ERR_IO,           /* a file could not be opened, read or written    */
    TB_ERR_FORMAT,       /* a file is malformed, truncated or corrupted    */
    TB_ERR_UNSUPPORTED,  /* an architecture, dtype, op or tokenizer type  */
    TB_ERR_NOT_FOUND,    /* a tensor, key or file that should be there     */
    TB_ERR_VERSION,      /* an engine written by a newer/unknown format    */
    TB_ERR_HARDWARE,     /* the engine needs features this machine lacks  */
    TB_ERR_CHECKSUM,     /* a section's checksum does not match            */
    TB_ERR_OOM,          /* an allocation or a KV-cache reservation failed */
    TB_ERR_RANGE,        /* an input outside an optimisation profile       */
    TB_ERR_INTERNAL,
    TB_ERR_QUEUE_FULL,   /* a server queue is at its limit: retry later     */
    TB_ERR_TIMEOUT,      /* a request waited past its deadline unserved     */
} tb_status;

const char *tb_status_str(tb_status s);
/* The message of the last failure on this thread ("" when none). */
const char *tb_last_error(void);

/* ---------------------------------------------------------------- dtypes */
typedef enum {
    TB_F32 = 0,
    TB_F16 = 1,
    TB_BF16 = 2,
    TB_I32 = 3,
    TB_I8 = 4,
    TB_I4 = 5,
    TB_FP8_E4M3 = 6,
    TB_I64 = 7,     /* ONNX graphs: shapes, indices                       */
    TB_BOOL = 8,    /* one byte, 0 or 1                                   */
    TB_U8 = 9,
    TB_F64 = 10,    /* ONNX graphs: Cast only                             */
    TB_DTYPE_COUNT
} tb_dtype;

const char *tb_dtype_name(tb_dtype t);
/* Parses "f32", "f16", "bf16", ... Returns TB_ERR_UNSUPPORTED on others. */
tb_status tb_dtype_parse(const char *s, tb_dtype *out);

/* ---------------------------------------------------------------- build */
typedef struct {
    const char *tokenizer_path; /* NULL: the model's own tokenizer            */
    tb_dtype weight_dtype;      /* f32, f16 or bf16                           */
    int max_seq_len;            /* 0: the model's context length              */
    int max_batch;              /* sequences decoded together, default 8      */
    int max_step_tokens;        /* tokens one step carries (prompt chunks and
                                 * decodes together); 0: 2048 for a cuda
                                 * device, else 512, at most max_seq_len      */
    int progress;               /* 1: draw a progress bar on stderr           */
    const char *device;         /* "cpu" (NULL) or "cuda[:N]": the target     */
    /* ONNX models: optimisation profile as "input:1x3x224x224,mask:1x128"
     * (NULL: the model's fixed dims; shapes sets all three) and pass log. */
    const char *shapes, *min_shapes, *opt_shapes, *max_shapes;
    /* ONNX models: several optimisation profiles instead (not with the
     * above), each "input:MIN/OPT/MAX,mask:MIN/OPT/MAX" with shapes as
     * 1x3x224x224 (one shape instead of three: fixed). The graph is compiled
     * once for the envelope of the profiles; a run's inputs must lie inside
     * one of them. At most TB_BUILD_MAX_PROFILES. */
    const char *const *profiles;
    int n_profiles;
    /* ONNX models with weight_dtype f16: a folder of input_0.pb, ... on
     * which the f16 graph is compared with the f32 one (NULL: a few random
     * inputs at the opt shapes). */
    const char *calib_data;
    int verbose;                /* 1: list each pass and what it changed      */
    /* ---- calibration of quantized engines (src/tune/calib.h, docs/COMMANDS.md)
     * An f32 engine of the same model runs in memory on the CPU over the
     * calibration tokens and collects per-matmul activation statistics;
     * the calibrator turns them into activation scales. */
    const char *calib;          /* --calib FILE: text (tokenized with the
                                 * model's tokenizer) or token ids           */
    int calib_tokens;           /* --calib-tokens N; 0: 4096                  */
    const char *calibrator;     /* entropy (NULL), minmax, percentile[=P], mse */
    const char *calib_cache;    /* --calib-cache FILE: reused when it exists
                                 * (no model run), written otherwise          */
    int calib_threads;          /* CPU threads for calibration; 0: all cores  */
    /* ---- end of calibration options */
    /* Quantized engines (Llama-family models, CPU): weight_dtype TB_I8
     * (per output channel), TB_I4 (groups along K) or TB_FP8_E4M3 (per
     * output channel). */
    int group_size;             /* int4: 32, 64 or 128; 0: the default        */
    int zero_point;             /* int4: asymmetric, a zero per group         */
    /* "NAME_GLOB=DTYPE" per weight (DTYPE f32, f16, bf16, int8, int4, fp8),
     * in order, the last match winning; also with a float weight_dtype. */
    const char *const *overrides;
    int n_overrides;
    int awq;                    /* int4: activation-aware scales (needs calibration) */
    /* Quantized matmuls' CPU tactics (docs/PERFORMANCE.md, "Quantized
     * kernels"): TB_QMM_TACTICS_AUTO times them all on this machine and keeps
     * the fastest, the int8-activation one (Q8) included, whose rounding of
     * the activations makes the logits depend on which tactic won;
     * TB_QMM_TACTICS_EXACT times only those that dequantise the weights and
     * sum in f32 (the logits equal an f32 engine's of the dequantised weights
     * up to summation order); TB_QMM_TACTICS_Q8 takes Q8 wherever it
     * applies (i8 and i4 weights on AVX2 or AVX-512). */
    int qmm_tactics;
    /* Tensor parallelism: the model split over this many ranks (1, 2, 4
     * or 8; 0: 1), each rank's shard a section of the engine (models.h
     * says how the heads, the MLP and the vocabulary are split). */
    int tp;
} tb_build_options;

enum { TB_QMM_TACTICS_AUTO = 0, TB_QMM_TACTICS_EXACT = 1, TB_QMM_TACTICS_Q8 = 2 };

/* int4's group size when tb_build_options.group_size is 0. */
#define TB_INT4_DEFAULT_GROUP 128

#define TB_BUILD_MAX_PROFILES 8

void tb_build_options_default(tb_build_options *o);

typedef struct {
    double seconds;
    uint64_t engine_bytes;
    int max_batch;
    int max_seq_len;
    /* ONNX f16 builds: the f16 graph against the f32 one, one line per
     * output (max abs / rel error, top-1 agreement), "" otherwise. */
    char accuracy[2048];
} tb_build_report;

tb_status tb_build(const char *model_path, const char *engine_path,
                   const tb_build_options *opt, tb_build_report *report);

/* ---------------------------------------------------------------- engine */
typedef struct tb_engine tb_engine;

tb_status tb_engine_load(const char *path, tb_engine **out);
void tb_engine_free(tb_engine *e);

typedef struct {
    int vocab_size;
    int dim;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int hidden_dim;
    int max_seq_len;
    int max_batch;
    int bos_id;     /* -1 when none */
    int eos_ids[4]; /* -1 padded */
    int add_bos;    /* 1 when prompts start with BOS */
    tb_dtype weight_dtype;
    char arch[32];
    int tensor_parallel; /* ranks the model is split over (1: none) */
} tb_engine_info;

void tb_engine_get_info(const tb_engine *e, tb_engine_info *out);
/* Writes a human-readable description (what `turbine inspect` prints). */
tb_status tb_engine_describe(const char *path, char *buf, size_t cap);

/* 1 for an LLM engine (tb_context), 0 for a general one (ONNX: tb_exec). */
int tb_engine_is_llm(const tb_engine *e);

/* Tokenizer carried inside the engine. */
typedef struct tb_tokenizer tb_tokenizer;
const tb_tokenizer *tb_engine_tokenizer(const tb_engine *e);

/* ---------------------------------------------------------------- context */
typedef struct tb_context tb_context;

typedef struct {
    int n_threads;        /* 0: one per core                                 */
    int max_seqs;         /* 0: the engine's max_batch                       */
    int max_step_tokens;  /* 0: max(max_seq_len, 512): tokens in one step    */
    size_t kv_cache_bytes;/* 0: enough for max_seqs full-length sequences    */
    int kv_block_size;    /* 0: 16 tokens per block                          */
    const char *device;   /* NULL: the backend the engine was built for      */
    int no_prefix_cache;  /* 1: full blocks are not kept for reuse            */
    const char *kv_dtype; /* NULL or "auto": the engine's activation dtype
                           * (f32, f16 or bf16); else "f32", "f16", "bf16"  */
} tb_context_options;

void tb_context_options_default(tb_context_options *o);
tb_status tb_context_create(tb_engine *e, const tb_context_options *o,
                            tb_context **out);
void tb_context_free(tb_context *c);

/* One sequence's share of a step: `n_tokens` new tokens starting at the
 * sequence's current length. `logits`: 0 none, 1 the last token's row,
 * 2 one row per token. */
typedef struct {
    int seq;              /* a slot in [0, max_seqs)                         */
    int n_tokens;
    const int32_t *tokens;
    int logits;
} tb_seq_chunk;

/* Starts (or restarts) sequence slot `seq` as empty, releasing its blocks. */
tb_status tb_seq_reset(tb_context *c, int seq);
/* Current length (tokens already in the KV cache) of a sequence. */
int tb_seq_len(const tb_context *c, int seq);
/* Prefix caching (on unless no_prefix_cache): every full KV block a step
 * writes is kept under the tokens from its sequence's start to its end, also
 * after the sequence is reset, until the space is needed. This attaches to
 * the empty slot `seq` the cached blocks that begin `tokens` and returns how
 * many tokens they cover (a multiple of the block size, below n_tokens so
 * that the last token is still computed), or -1 on a bad slot. The sequence
 * then goes on from there as if it had computed them. */
int tb_seq_reuse_prefix(tb_context *c, int seq, const int32_t *tokens, int n_tokens);
/* Free KV blocks (cached blocks no sequence holds count as free: they are
 * taken when nothing else is left), and the block size in tokens. */
int tb_kv_free_blocks(const tb_context *c);
int tb_kv_cached_blocks(const tb_context *c);
int tb_kv_total_blocks(const tb_context *c);
/* The element type of the KV cache (see tb_context_options.kv_dtype). */
tb_dtype tb_context_kv_dtype(const tb_context *c);
int tb_kv_block_size(const tb_context *c);

/* Runs one flattened step over all chunks. Logit rows are written in chunk
 * order to the context's logits buffer, returned through `logits`
 * ([rows, vocab], valid until the next step) with the row count. */
tb_status tb_context_step(tb_context *c, const tb_seq_chunk *chunks,
                          int n_chunks, const float **logits, int *n_rows);

/* ---------------------------------------------------------------- general engines
 * An engine compiled from an ONNX model runs whole: inputs in, outputs out.
 * Input shapes may vary inside the engine's optimisation profile; a shape
 * outside it is refused (TB_ERR_RANGE, the message gives the allowed range). */
#define TB_TENSOR_MAX_RANK 8

typedef struct {
    tb_dtype dtype;
    int rank;
    int64_t dims[TB_TENSOR_MAX_RANK];
    void *data;             /* contiguous, row-major                          */
} tb_tensor;

typedef struct {
    char name[96];
    tb_dtype dtype;
    int rank;
    int64_t min[TB_TENSOR_MAX_RANK], opt[TB_TENSOR_MAX_RANK], max[TB_TENSOR_MAX_RANK];
} tb_io_info;

typedef struct tb_exec tb_exec;

typedef struct {
    int n_threads;          /* 0: one per core                                */
    const char *device;     /* NULL: the backend the engine was built for     */
} tb_exec_options;

void tb_exec_options_default(tb_exec_options *o);
tb_status tb_exec_create(tb_engine *e, const tb_exec_options *o, tb_exec **out);
void tb_exec_free(tb_exec *x);
int tb_exec_n_inputs(const tb_exec *x);
int tb_exec_n_outputs(const tb_exec *x);
/* The backend the context runs on: "cuda" for a GPU, a CPU kernel set's name
 * ("avx512", "avx2", "scalar", "cpu") otherwise. */
const char *tb_exec_backend(const tb_exec *x);
/* Name, dtype and the profile's range of input / output i (output ranges:
 * -1 where a dim is known only when it runs). */
tb_status tb_exec_input_info(const tb_exec *x, int i, tb_io_info *out);
tb_status tb_exec_output_info(const tb_exec *x, int i, tb_io_info *out);
/* Runs once: inputs in graph order; outputs[i] get dtype, shape and data
 * pointing into the executor's memory, valid until the next run. */
tb_status tb_exec_run(tb_exec *x, const tb_tensor *inputs, int n_in, tb_tensor *outputs, int n_out);

/* ---------------------------------------------------------------- sampling */
typedef struct {
    float temperature;      /* 0: greedy                         */
    int top_k;              /* 0: off                            */
    float top_p;            /* 1: off                            */
    float min_p;            /* 0: off                            */
    float repeat_penalty;   /* 1: off (llama.cpp style)           */
    float presence_penalty; /* 0: off                            */
    float frequency_penalty;/* 0: off                            */
    int penalty_last_n;     /* tokens looked back; 0: all        */
    uint64_t seed;
} tb_sampling_params;

void tb_sampling_params_default(tb_sampling_params *p);

typedef struct tb_sampler tb_sampler;
tb_status tb_sampler_create(int vocab_size, const tb_sampling_params *p,
                            tb_sampler **out);
void tb_sampler_free(tb_sampler *s);
/* Picks a token from one row of logits. `history`: tokens so far (prompt and
 * generated) for the penalties. The row may be modified. */
int tb_sampler_sample(tb_sampler *s, float *logits, const int32_t *history,
                      int n_history);

/* ---------------------------------------------------------------- sampled steps */
#define TB_TOP_LOGPROBS_MAX 20

/* How to pick the next token of one logits row of a step. */
typedef struct {
    tb_sampler *sampler;      /* parameters and the seeded generator         */
    const int32_t *history;   /* the sequence's tokens so far (penalties)    */
    int n_history;
    int top_logprobs;         /* -1: no log-probabilities; else the pick's
                               * and this many alternatives (<= 20)        */
    const int32_t *score;     /* NULL: sample; else this token is taken and
                               * only scored (its log-probability and
                               * top_logprobs alternatives; the sampler's
                               * generator does not move): a prompt's   */
} tb_row_sampling;

typedef struct {
    int32_t token;
    float logprob;            /* of `token` under the model's distribution
                               * (log-softmax of the raw logits)           */
    int32_t n_top;
    int32_t top_ids[TB_TOP_LOGPROBS_MAX];     /* most likely first          */
    float top_logprobs[TB_TOP_LOGPROBS_MAX];
} tb_sample_result;

/* Runs one step as tb_context_step and picks the next token of every logits
 * row (chunk order) with rows[r]. On a GPU the picking runs there and only
 * the results cross to the host; greedy picks equal the CPU's; a seeded
 * draw is reproducible on its device but picks its token by another walk
 * of the same distribution. *n_rows gets the number of rows (results). */
tb_status tb_context_step_sample(tb_context *c, const tb_seq_chunk *chunks,
                                 int n_chunks, const tb_row_sampling *rows,
                                 tb_sample_result *out, int *n_rows);

#ifdef __cplusplus
}
#endif
#endif /* TURBINE_H */
