/*
 * ir.h — the graph IR: typed values with (possibly symbolic) shapes, and ops.
 *
 * A graph is a list of values and a topologically ordered list of nodes.
 * A value is an input (fed per step), a weight (constant data, written into
 * the engine file), or an activation (produced by one node). A dim is either
 * a number or a symbol such as `tokens` (the tokens of one flattened step) or
 * `rows` (the tokens whose logits are wanted); symbols are bound per step and
 * bounded by the optimisation profile.
 *
 * Every op has one definition in ops.c (name, arity, attribute schema,
 * shape rule; ops.h) and a CPU reference kernel (backend/cpu/kernels.h). Fused ops (add_rmsnorm, attention with its KV
 * write, silu_mul over a fused gate|up matmul) are ordinary ops with their own
 * references. The op set is not LLM-only: general ops are added here with a
 * shape rule and a kernel each.
 */
#ifndef TB_IR_H
#define TB_IR_H

#include "core/core.h"

#define TB_MAX_RANK 8
#define TB_MAX_INPUTS 8
#define TB_MAX_OUTPUTS 4
#define TB_MAX_SYMS 8
#define TB_MAX_IO 16      /* graph inputs and outputs (general graphs)       */
#define TB_NODE_INTS 16   /* int attribute slots of a node                   */
#define TB_NODE_FLOATS 4  /* float attribute slots of a node                 */
#define TB_NAME_LEN 96

typedef enum {
    TB_OP_EMBEDDING = 0, /* ids (tokens) i32, table (V, D) -> (tokens, D)            */
    TB_OP_RMSNORM,       /* x (n, D), w (D) -> (n, D); eps                          */
    TB_OP_ADD_RMSNORM,   /* x, d (n, D), w (D) -> r = x + d, y = norm(r); eps       */
    TB_OP_MATMUL,        /* x (n, K), w (N, K) [, bias (N)] -> (n, N)               */
    TB_OP_ROPE,          /* x (n, C), pos (n), inv_freq (hd/2) -> (n, C) rotated;
                            heads (rotated from column 0), head_dim, interleaved  */
    TB_OP_ATTENTION,     /* qkv (tokens, (H + 2 KV) hd), inv_freq -> (tokens, H hd);
                            RoPE on q and k, KV-cache write, paged causal GQA attention;
                            layer, heads, kv_heads, head_dim, interleaved, scale
                            (ops.c maps them onto i[4] / f[4])                       */
    TB_OP_SILU_MUL,      /* gu (n, 2F) -> (n, F)                                    */
    TB_OP_ADD,           /* a, b (same shape) -> a + b                              */
    TB_OP_GATHER_ROWS,   /* x (tokens, D) -> (rows, D): rows chosen per step        */
    /* Plain ops of the Llama-family builder, fused by the passes (opt/llm_fuse.c) */
    TB_OP_CONCAT_COLS,   /* x1 (n, C1), ..., xk (n, Ck) -> (n, C1 + ... + Ck)      */
    TB_OP_SILU,          /* x (n, C) -> x * sigmoid(x)                              */
    TB_OP_EMUL,           /* a, b (n, C) -> a * b                                    */
    TB_OP_QMATMUL,       /* x (n, K), codes (N, K) i8|i4|fp8, scales (N, K/G) f32
                            [, bias (N)] [, zeros (N, K/G)] -> (n, N): a matmul
                            over quantized weights (core/quant.h encodings);
                            has_bias, has_zeros, act_scale                        */
    /* Tensor parallelism: collectives over the ranks of one engine (each
     * rank runs its own shard of the graph; tb_step carries the rank and
     * the communicator). One rank: a copy.                                */
    TB_OP_ALL_REDUCE,    /* x (n, C) -> (n, C): the sum over the ranks              */
    TB_OP_ALL_GATHER_COLS, /* x (n, C) -> (n, C * ranks): the ranks' columns side
                              by side, rank 0 first; ranks                         */
    /* General ops (ONNX semantics, any rank up to TB_MAX_RANK, broadcasting
     * where ONNX broadcasts). Their definitions, attribute layouts, shape
     * rules and reference kernels are in ops_nn.h / nn_*.c.               */
#define TB_NN_OP(e, onnx) e,
#include "ir/ops_nn.def"
#undef TB_NN_OP
    TB_OP_COUNT
} tb_op_kind;

#define TB_OP_NN_FIRST TB_OP_RELU /* the first general op (ops_nn.def)  */

const char *tb_op_name(tb_op_kind k);

typedef enum {
    TB_VAL_INPUT = 0,  /* bound per step (token ids, positions)      */
    TB_VAL_WEIGHT,     /* constant data                              */
    TB_VAL_ACT,        /* produced by a node                         */
} tb_value_kind;

/* A dim >= 0 is concrete; a dim in [-TB_MAX_SYMS, -1] is symbol -(d + 1);
 * TB_DIM_DYN (general graphs only) is a dim known only when the graph runs
 * (the output of Reshape with a computed shape, of Range, ...): shape rules
 * see concrete dims at run time and compute it then. */
#define TB_SYM(i) (-(int64_t)(i)-1)
#define TB_DIM_DYN ((int64_t)-1000)
#define TB_IS_SYM(d) ((d) < 0 && (d) != TB_DIM_DYN)
#define TB_SYM_INDEX(d) ((int)(-(d)-1))

typedef struct {
    char name[TB_NAME_LEN];
    tb_value_kind kind;
    tb_dtype dtype;
    int rank;
    int64_t dims[TB_MAX_RANK];
    /* weights only */
    const void *data;   /* build: owned buffer; runtime: into the engine map */
    uint64_t nbytes;
    uint64_t offset;    /* in the engine's weight section                   */
    int owned;          /* data is malloc'd and freed with the graph         */
} tb_value;

typedef struct {
    tb_op_kind op;
    int n_in, n_out;
    int in[TB_MAX_INPUTS];
    int out[TB_MAX_OUTPUTS];
    int32_t i[TB_NODE_INTS];  /* attributes, as the op's schema says (ops.h) */
    float f[TB_NODE_FLOATS];
    int tactic;         /* backend-specific kernel choice (tune/)            */
} tb_node;

typedef struct {
    char name[16];
    int64_t min, opt, max; /* the optimisation profile */
} tb_symbol;

typedef struct tb_graph {
    tb_value *values;
    int n_values, cap_values;
    tb_node *nodes;
    int n_nodes, cap_nodes;
    tb_symbol syms[TB_MAX_SYMS];
    int n_syms;
    int output;         /* the value holding the logits (LLM graphs)       */
    /* General graphs: inputs fed and outputs returned per run, in order
     * (an LLM graph leaves these empty). */
    int inputs[TB_MAX_IO], n_inputs;
    int outputs[TB_MAX_IO], n_outputs;
} tb_graph;

tb_graph *tb_graph_new(void);
void tb_graph_free(tb_graph *g);

int tb_graph_add_sym(tb_graph *g, const char *name, int64_t min, int64_t opt,
                     int64_t max);
int tb_graph_find_sym(const tb_graph *g, const char *name);

/* Returns the value index, or -1 on allocation failure. */
int tb_graph_add_value(tb_graph *g, const char *name, tb_value_kind kind,
                       tb_dtype dt, int rank, const int64_t *dims);
/* A weight with data; `owned` = 1 hands the malloc'd buffer to the graph
 * (freed with it, or at once when adding fails). */
int tb_graph_add_weight(tb_graph *g, const char *name, tb_dtype dt, int rank,
                        const int64_t *dims, const void *data, int owned);
int tb_graph_find_value(const tb_graph *g, const char *name);
/* Adds a node; outputs are created by the shape rule. Returns the node index
 * or -1 (message in tb_last_error()). iattr / fattr: NULL or the first 4
 * slots (the LLM ops use no more). Outputs are named out_name, out_name.1,
 * ... */
int tb_graph_add_node(tb_graph *g, tb_op_kind op, const int *in, int n_in,
                      const char *out_name, const int32_t *iattr,
                      const float *fattr);
/* The general form: all TB_NODE_INTS / TB_NODE_FLOATS slots (NULL: zeros)
 * and one name per output (n_names of them; outputs past n_names are named
 * after the first as above). */
int tb_graph_add_node_ex(tb_graph *g, tb_op_kind op, const int *in, int n_in,
                         const char *const *out_names, int n_names,
                         const int32_t *iattr, const float *fattr);

/* Runs every shape rule again over the whole graph (after a load or a pass)
 * and checks dtypes and dims; TB_ERR_FORMAT with the node named on mismatch. */
tb_status tb_graph_check(tb_graph *g);

/* Elements of a value with symbols bound to `symval` (NULL: each max). */
int64_t tb_value_numel(const tb_graph *g, const tb_value *v,
                       const int64_t *symval);
/* Bytes of a value with symbols bound as for tb_value_numel; TB_ERR_FORMAT
 * when its rows are not whole blocks of its dtype or the size overflows. */
tb_status tb_value_bytes(const tb_graph *g, const tb_value *v, const int64_t *symval, uint64_t *out);
void tb_value_shape_str(const tb_graph *g, const tb_value *v, char *buf,
                        size_t cap);

/* Serialized form for the engine file (weights excluded: their offsets are
 * kept and resolved against the weight section at load). */
tb_status tb_graph_serialize(const tb_graph *g, uint8_t **buf, size_t *n);
tb_status tb_graph_deserialize(const uint8_t *buf, size_t n, tb_graph **out);

#endif /* TB_IR_H */
