/*
 * opt.h — the pass pipeline: every front end (ONNX, the Llama-family
 * builder) emits plain ops and the same pipeline folds, fuses and plans.
 *
 * A pass takes the graph and rewrites it in place (nodes only ever read
 * values written by earlier nodes; a pass keeps that order), reporting what
 * it changed. Passes are listed by `turbine build --verbose` with their
 * reports. Editing helpers below keep the graph consistent: a pass kills
 * nodes and redirects uses, and tb_opt_compact drops what nothing reads.
 * Each pass is tested by running the graph before and after it on random
 * inputs (the reference interpreter, ir/interp.h) and comparing outputs.
 */
#ifndef TB_OPT_H
#define TB_OPT_H
#include "ir/ops_nn.h"

/* What the quantize pass (llm_quant.c) does with the weights of an LLM
 * graph. Names are the fused graph's weight names ("embed", "l0.wqkv",
 * "l0.wo", "l0.wgu", "l0.wdown", "lm_head"; `turbine inspect` lists them). */
typedef struct {
    const char *weight;    /* a matmul weight's name                            */
    float act_scale;       /* static scale of its input activations, >= 0 (0: none) */
    const float *in_scale; /* (K) per-input-channel multipliers (AWQ), or NULL:
                              the weight is quantised as W * diag(in_scale) and
                              1 / in_scale is folded into the RMSNorm weight
                              that produces the matmul's input               */
} tb_quant_calib;

typedef struct {
    tb_dtype dtype;        /* matmul weights: i8, i4, fp8_e4m3, or f32/f16/bf16 */
    int group;             /* i4: elements per scale, 32, 64 or 128             */
    int asym;              /* i4: a zero point per group                        */
    /* "GLOB=DTYPE" (fnmatch over the names above; DTYPE f32, f16, bf16,
     * int8, int4, fp8), applied in order: the last match wins. Without a
     * match: the embedding and the LM head f16 when dtype is quantized,
     * every other matmul weight dtype. */
    const char *const *overrides;
    int n_overrides;
    const tb_quant_calib *calib; /* from calibration, or NULL              */
    int n_calib;
    /* AWQ (int4): asked once per weight group whose input scales can be
     * folded into what writes that input: q|k|v and gate|up (an RMSNorm
     * feeding only the group: 1 / in_scale into the norm weight), wo (the
     * attention output: into wv's rows) and wdown (the SwiGLU product: into
     * the up projection's rows). w (N, K) is the whole group's f32 weight,
     * its parts' rows stacked. tie (K) or NULL: channels of one class
     * (tie[k] in [0, n_tie)) must share one multiplier (wo under grouped
     * attention: the query heads of one kv head read one v row). Writes
     * in_scale (K) and sets *found, or leaves *found 0 (no calibration for
     * `weight`). Takes precedence over calib[].in_scale. NULL: no search. */
    tb_status (*awq)(void *user, const char *weight, const float *w, int N, int K, int group, int asym,
                     const int *tie, int n_tie, float *in_scale, int *found);
    /* AWQ's clipping (int4), asked for every int4 matmul weight `part`
     * (calibration keyed by `weight`, the fused name): w (N, K) f32 as it is
     * quantised (times in_scale (K) when not NULL); writes bound (N, K /
     * group), each group clamped to +-bound before quantising, and sets
     * *found (0: no calibration, no clipping). NULL: no clipping. */
    tb_status (*awq_clip)(void *user, const char *weight, const char *part, const float *w, int N, int K, int group,
                          int asym, const float *in_scale, float *bound, int *found);
    void *awq_user;
} tb_quant_options;

/* INT8 general (ONNX) graphs (nn_quant.c): the calibrated activations. */
typedef struct {
    char tensor[TB_NAME_LEN]; /* a value's name: the input of a Conv / Gemm / MatMul */
    float scale;           /* its per-tensor scale                               */
    int zero;              /* its uint8 zero point: 128 (signed values), 0 (never negative) */
} tb_nn_act_quant;

typedef struct {
    const tb_nn_act_quant *acts;
    int n_acts;
    /* "GLOB=f32" keeps the Conv / Gemm / MatMul whose output or weight name
     * matches (fnmatch) in f32, "GLOB=int8" quantizes it; the last match
     * wins. */
    const char *const *overrides;
    int n_overrides;
} tb_nn_quant_options;

typedef struct {
    char device[16];   /* the target backend kind: "cpu" or "cuda"          */
    tb_dtype dtype;    /* weight precision wanted (f32, f16, bf16)           */
    int verbose;       /* 1: log every pass and its report (info level)      */
    /* LLM graphs built with source weights (models.h): the dtypes to give
     * them; NULL: the quantize pass changes nothing. */
    const tb_quant_options *quant;
    /* general graphs: the calibrated INT8 quantization, or NULL (explicit
     * Q/DQ nodes are folded either way) */
    const tb_nn_quant_options *nn_quant;
} tb_opt_options;

typedef struct {
    int changes;       /* rewrites made (0: the pass found nothing)          */
    char what[512];    /* a short account: "folded 20 BatchNormalization"   */
} tb_pass_report;

typedef tb_status (*tb_pass_fn)(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);

typedef struct {
    const char *name;
    tb_pass_fn run;
    const char *doc;
} tb_pass;

/* Runs passes in order (each followed by tb_opt_compact and tb_graph_check);
 * with o->verbose logs "pass NAME: what" and node counts. */
tb_status tb_opt_run(tb_graph *g, const tb_pass *passes, int n, const tb_opt_options *o);

/* ---- editing helpers (graph_edit.c) */

/* The node writing value v, or -1 (inputs, weights). */
int tb_opt_producer(const tb_graph *g, int v);
/* Readers of v among live nodes (+1 for each graph output / g->output use). */
int tb_opt_uses(const tb_graph *g, int v);
/* Makes every reader of `from` (nodes, graph outputs) read `to` instead. */
void tb_opt_replace_uses(tb_graph *g, int from, int to);
/* Marks node k dead (removed by tb_opt_compact). */
void tb_opt_kill(tb_graph *g, int k);
static inline int tb_opt_dead(const tb_node *n) { return n->op == TB_OP_COUNT; }
/* Adds a node as tb_graph_add_node_ex does, then moves it to index pos
 * (before the node now at pos). Returns pos or -1. */
int tb_opt_insert_node(tb_graph *g, int pos, tb_op_kind op, const int *in, int n_in,
                       const char *const *out_names, int n_names, const int32_t *iattr, const float *fattr);
/* Drops dead nodes, nodes whose outputs nothing reads (dead-node
 * elimination), and values nothing refers to; renumbers values. Returns the
 * nodes removed. */
int tb_opt_compact(tb_graph *g);



/* ---- the LLM pipeline (llm_fuse.c, llm_cuda.c) */

/* The passes that turn the Llama-family builder's plain graph into the fused
 * graph the backends run (add_rmsnorm, silu_mul, merged q|k|v and gate|up
 * matmuls), then, for o->device "cuda", cuda_fuse. *n: how many. */
const tb_pass *tb_opt_llm_pipeline(int *n);
/* For o->device "cuda" (no change otherwise): stores in each node's tactic
 * word (tune/tactic.h) the fusions the CUDA backend runs with the next
 * node(s), and folds the RMSNorm weights of the norm fusions into the
 * following matmul's weight (the norm weight becomes ones). */
tb_status tb_opt_cuda_fuse(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_cuda_fuse_quant(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
/* concat_cols of matmuls (or of qmatmuls with equal encodings) of one input
 * becomes one matmul (qmatmul) over the stacked weights (codes, scales,
 * biases, zeros): the llm_concat_matmul pass, which in a quantized build
 * (o->quant) leaves it to tb_opt_quantize, run after the quantisation. */
tb_status tb_opt_merge_concat_matmul(tb_graph *g, tb_pass_report *r);
/* The name of a value made of `vals`: their common prefix, then what follows
 * it in each ("l0.wq", "l0.wk", "l0.wv" -> "l0.wqkv"). */
void tb_opt_joined_name(const tb_graph *g, const int *vals, int n, char out[TB_NAME_LEN]);
/* The last pass of the LLM pipeline (llm_quant.c): with o->quant, gives
 * every matmul and embedding weight its dtype; a matmul whose weight becomes
 * i8 / i4 / fp8_e4m3 becomes qmatmul over codes, scales (and zeros). Each
 * weight is converted from its source data in row chunks and the source
 * released right after, so the pass never holds two copies of the model. */
tb_status tb_opt_quantize(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
/* Parses an override's dtype: f32, f16, bf16, int8 (i8), int4 (i4), fp8
 * (fp8_e4m3). TB_ERR_INVALID_ARG naming the choices. */
tb_status tb_quant_parse_dtype(const char *s, tb_dtype *out);
static inline int tb_dtype_is_quant(tb_dtype t) { return t == TB_I8 || t == TB_I4 || t == TB_FP8_E4M3; }

/* ---- the pipeline for general (ONNX) graphs (nn_*.c)
 *
 * In order: identity removal, constant folding (Shape of fixed dims
 * included, so shape arithmetic chains fold away), dead nodes, merging of
 * consecutive Transposes / Reshapes, LayerNorm and GELU pattern fusion,
 * attention fusion (sdpa), BatchNormalization and per-channel Mul folding
 * into Conv / Gemm / MatMul weights, Transpose folding into MatMul / Gemm,
 * epilogue fusion (bias, activation, residual) and the memory plan report.
 * Every rewrite checks shapes, dtypes, attributes and constant values first
 * and leaves the graph alone when anything differs from the pattern. */
const tb_pass *tb_opt_nn_pipeline(int *n);

tb_status tb_opt_remove_identity(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_dead_nodes(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_fold_constants(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_merge_transpose_reshape(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_fuse_layernorm(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_fuse_gelu(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_fuse_attention(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_fold_batchnorm(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_fold_transpose_matmul(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_fuse_epilogue(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
/* nn_merge.c, for o->device "cuda" or "cpu" (no change otherwise): sdpa in the
 * heads layout without the head split / merge Transposes, then its q / k /
 * v projections merged into one MatMul read packed (ops_nn.h sdpa). */
tb_status tb_opt_attention_heads(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_merge_qkv(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
tb_status tb_opt_plan_memory_pass(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
/* The INT8 pass (nn_quant.c): Q/DQ around Conv / Gemm / MatMul folded into
 * QConv / QGemm (always), and with o->nn_quant the calibrated nodes
 * quantized. In tb_opt_nn_pipeline after the epilogue fusion; a build
 * asking for int8 runs it again with the calibration. */
tb_status tb_opt_quantize_nn(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);
/* The activation (a value) that calibration measures for node k, when the
 * pass would quantize k (q: overrides, may be NULL); -1 otherwise. */
int tb_opt_nn_quant_input(const tb_graph *g, int k, const tb_nn_quant_options *q);
/* The f16 pass (nn_precision.c): for o->dtype f16, f32 weights and
 * activations become f16, graph inputs and outputs keep their dtypes
 * through Casts, values read by shape rules stay as they are; no change for
 * other dtypes. Not in tb_opt_nn_pipeline's list: a build asking for f16
 * runs it after the pipeline. */
tb_status tb_opt_precision(tb_graph *g, const tb_opt_options *o, tb_pass_report *r);

/* Largest tensor constant folding writes (bigger results stay nodes). */
#define TB_OPT_FOLD_MAX_BYTES ((uint64_t)64 << 20)

/* ---- matching helpers for the passes (nn_match.c) */

/* Producer and reader count of every value over the live nodes; rebuilt
 * after each rewrite (the arrays are sized for the values of that moment). */
typedef struct {
    int *prod;  /* prod[v]: the node writing v, -1 for inputs and weights    */
    int *uses;  /* uses[v]: as tb_opt_uses                                   */
    /* dims[v]: v's dims where the pass can tell more than the shape rules
     * (which answer TB_DIM_DYN after a Range or a Reshape of computed
     * shape): followed through Range(0, dim, 1), elementwise ops, Gather,
     * Unsqueeze, MatMul, Reshape of a constant target, Transpose and sdpa,
     * so that e.g. a position embedding of length `seq` is seen as such.
     * Matching only; the values keep the rules' dims. */
    int64_t (*dims)[TB_MAX_RANK];
    int n_values;
} tb_opt_index;
tb_status tb_opt_index_build(const tb_graph *g, tb_opt_index *ix);
void tb_opt_index_free(tb_opt_index *ix);
/* The live node writing v when op is its kind (-1 otherwise). */
int tb_opt_producer_op(const tb_graph *g, const tb_opt_index *ix, int v, tb_op_kind op);
/* The only live node reading v (and v no graph output), else -1. */
int tb_opt_single_reader(const tb_graph *g, const tb_opt_index *ix, int v);

/* The dim d when it is fixed: a number, or a symbol whose profile has
 * min == max. */
int tb_opt_fixed_dim(const tb_graph *g, int64_t d, int64_t *out);
/* An element of a shape tensor computed from dims: a number, or dim `axis`
 * of value `src` (a symbol or a dim known only at run time). */
typedef struct {
    int src, axis; /* src -1: the number c */
    int64_t c;
} tb_opt_shape_el;
/* The elements (at most TB_MAX_RANK) of 1-d or scalar i64/i32 value v as
 * Shape, Gather, Unsqueeze, Squeeze, Concat and Cast compute them from
 * constants and dims: their count, or -1. */
int tb_opt_shape_expr(const tb_graph *g, const tb_opt_index *ix, int v, tb_opt_shape_el *out);
/* A constant (weight) with one element, any integer or float dtype; its
 * rank must not exceed max_rank (so broadcasting it changes no shape). */
int tb_opt_const_scalar(const tb_graph *g, int v, int max_rank, double *out);
/* The f32 data of weight v, or NULL (not a weight, or another dtype). */
const float *tb_opt_weight_f32(const tb_graph *g, int v);
/* The same with the index's dims (equal dims proved by following them). */
int tb_opt_shape_eq_ix(const tb_graph *g, const tb_opt_index *ix, int a, int b);
/* Same rank and dims, no TB_DIM_DYN (symbols compare by index; a symbol
 * whose profile is one value equals that number). */
int tb_opt_shape_eq(const tb_graph *g, int a, int b);
/* A per-channel constant of a tensor of rank `rank` whose channel axis
 * `axis` has `ch` elements: rank <= rank, every dim 1 except the one
 * aligned with axis, which is ch (or 1: one value for every channel).
 * Writes the ch values (f32 weight) into out. */
int tb_opt_const_per_channel(const tb_graph *g, int v, int rank, int axis, int64_t ch, float *out);
/* Adds an f32 weight taking `data` (malloc'd; freed on failure). */
int tb_opt_add_weight_f32(tb_graph *g, const char *name, int rank, const int64_t *dims, float *data);
/* Whether node cand (not in the graph) is valid there and writes a value of
 * exactly the shape and dtype of value `like` (its single output). Clears
 * the error message it causes. */
int tb_opt_node_fits(const tb_graph *g, const tb_node *cand, int like);
/* Puts cand at node position k writing value out_v (the node there is
 * replaced: a fused node takes the place of the last node of its pattern). */
void tb_opt_place(tb_graph *g, int k, const tb_node *cand, int out_v);
/* Runs every shape rule in order and writes the dims back into the values
 * (after constants became known, TB_DIM_DYN dims may become numbers). */
tb_status tb_opt_refresh_shapes(tb_graph *g);

/* ---- memory plan (plan_mem.c)
 *
 * Values live from the node writing them (the start for values no node
 * writes) to the last node reading them (the end for graph outputs); each
 * value with bytes[v] > 0 gets an offset in one arena such that no two values
 * live at the same time overlap. Greedy by size: the largest value first,
 * each placed in the smallest gap between values it conflicts with that fits
 * it (else above them all). Offsets and sizes are aligned to TB_PLAN_ALIGN.
 * The executor calls this with concrete sizes at run time, setting bytes 0
 * for what it keeps elsewhere (inputs, outputs, weights); their offsets
 * are set to UINT64_MAX. The node order is the execution order. */
#define TB_PLAN_ALIGN 256
tb_status tb_plan_memory(const tb_graph *g, const uint64_t *bytes, uint64_t *offsets, uint64_t *arena_bytes);
/* The build-time account for the profile's max shapes (symval NULL) or the
 * symbol values given: activations other than graph outputs, summed
 * without reuse (*unplanned) and as planned (*planned); *n_dynamic counts
 * values left out because a dim is known only at run time. */
tb_status tb_plan_memory_report(const tb_graph *g, const int64_t *symval, uint64_t *unplanned, uint64_t *planned,
                                int *n_dynamic);

#endif /* TB_OPT_H */
