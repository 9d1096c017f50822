/*
 * ops.h — one definition per op (ops.c): name, arity, outputs, the schema of
 * its attributes and its shape rule. The graph (ir.c) takes names, arity and
 * shape inference from here, and validates attributes against the schema
 * whenever a node is added or a loaded graph is checked.
 *
 * Attributes are named and typed here, but a node still stores them as
 * int32_t i[4] / float f[4], the engine file's node record: each attribute
 * names its slot and, for small ints and flags, a bit field of that slot
 * (attention keeps head_dim in bits 0..15 of i[3] and the interleaved flag in
 * bit 16). Bits and slots no attribute uses must be zero, so a later
 * attribute can take them without old files reading as something else.
 *
 * Adding an op: an enum value in ir.h, one entry in the table of ops.c (with
 * its shape rule), a reference kernel (backend/cpu/kernels_ref.c) and the
 * backends' implementations; supports_op of each backend says what it runs.
 */
#ifndef TB_IR_OPS_H
#define TB_IR_OPS_H
#include "ir/ir.h"

#define TB_MAX_ATTRS 16

typedef enum {
    TB_ATTR_INT = 0, /* an integer in [lo, hi]     */
    TB_ATTR_BOOL,    /* 0 or 1                      */
    TB_ATTR_FLOAT,   /* a finite float in [lo, hi]  */
} tb_attr_type;

typedef struct {
    const char *name;
    tb_attr_type type;
    int slot;        /* i[slot] (int, bool) or f[slot] (float)               */
    int shift, bits; /* bit field [shift, shift + bits) of i[slot]; 32: all  */
    double lo, hi;   /* accepted values, inclusive                          */
    const char *doc;
} tb_attr_def;

/* The outputs a shape rule computes. */
typedef struct {
    int n_out;
    int rank[TB_MAX_OUTPUTS];
    int64_t dims[TB_MAX_OUTPUTS][TB_MAX_RANK];
    tb_dtype dtype[TB_MAX_OUTPUTS];
} tb_op_shape;

/* A shape rule: inputs already resolved (in[k] is value n->in[k]), arity and
 * attributes already checked. TB_ERR_FORMAT naming the mismatch. */
typedef tb_status (*tb_op_shape_fn)(const tb_graph *g, const tb_node *n, const tb_value *const *in,
                                    tb_op_shape *out);

/* A tensor as general shape rules and kernels see it (ops_nn.h). */
typedef struct {
    tb_dtype dtype;
    int rank;
    int64_t dims[TB_MAX_RANK];
    void *data;           /* kernel: the buffer; rule: known contents or NULL */
} tb_view;

/* A general shape rule: sets n_out, and dtype/rank/dims of each output
 * (ops_nn.h says when dims may be symbols or TB_DIM_DYN). */
typedef tb_status (*tb_op_infer_fn)(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out);
/* A kernel over concrete views: out[k] sized by the rule, data set. */
typedef tb_status (*tb_op_kernel_fn)(const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                                     int n_out);

typedef struct {
    const char *name;
    int min_in, max_in;   /* arity                                         */
    int n_out;            /* outputs                                       */
    const char *signature;/* inputs and outputs with shapes, for messages  */
    int n_attrs;
    tb_attr_def attrs[TB_MAX_ATTRS];
    tb_op_shape_fn shape; /* LLM ops: the rule over graph values           */
    /* general ops (ops_nn.h) */
    tb_op_infer_fn infer; /* the rule over views                           */
    tb_op_kernel_fn ref;  /* the scalar reference kernel                   */
    uint32_t host_inputs; /* bit k: input k is read on the host by infer   */
    int max_out;          /* outputs up to (variadic: Split); 0: n_out     */
} tb_op_def;

/* Attribute indices into each op's schema. */
enum { TB_NORM_EPS = 0 };                                          /* rmsnorm, add_rmsnorm */
enum { TB_ROPE_HEADS = 0, TB_ROPE_HEAD_DIM, TB_ROPE_INTERLEAVED }; /* rope                 */
enum {                                                             /* attention            */
    TB_ATTN_LAYER = 0,
    TB_ATTN_HEADS,
    TB_ATTN_KV_HEADS,
    TB_ATTN_HEAD_DIM,
    TB_ATTN_INTERLEAVED,
    TB_ATTN_SCALE,
};

enum { TB_QMM_HAS_BIAS = 0, TB_QMM_HAS_ZEROS, TB_QMM_ACT_SCALE }; /* qmatmul      */
enum { TB_EMB_VOCAB_OFFSET = 0 };                                  /* embedding    */
enum { TB_GATHER_RANKS = 0 };                                      /* all_gather_cols */

/* The definition of op k; NULL outside the enum. */
const tb_op_def *tb_op_get_def(tb_op_kind k);

/* Attribute a of op's schema read from / written into the packed slots.
 * Programmer errors (a wrong index or type) assert. */
int32_t tb_attr_get_i(tb_op_kind op, int a, const int32_t *i);
float tb_attr_get_f(tb_op_kind op, int a, const float *f);
void tb_attr_set_i(tb_op_kind op, int a, int32_t *i, int32_t v);
void tb_attr_set_f(tb_op_kind op, int a, float *f, float v);
static inline int32_t tb_node_attr_i(const tb_node *n, int a) { return tb_attr_get_i(n->op, a, n->i); }
static inline float tb_node_attr_f(const tb_node *n, int a) { return tb_attr_get_f(n->op, a, n->f); }

/* Checks n's attributes against its op's schema (ranges, unused bits zero):
 * TB_ERR_FORMAT naming the op and the attribute. */
tb_status tb_op_check_attrs(const tb_node *n);

/* Resolves n's inputs, checks its arity and attributes and runs its shape
 * rule. TB_ERR_FORMAT (or TB_ERR_UNSUPPORTED for an unknown op). General
 * ops see weights' data (constants) and no other. */
tb_status tb_op_infer(const tb_graph *g, const tb_node *n, tb_op_shape *out);
/* The same for a general op over views (run time: concrete dims). */
tb_status tb_op_infer_views(const tb_node *n, const tb_view *in, int n_in, tb_op_shape *out);
/* The view of graph value v at build time (data: the weight's or NULL). */
void tb_value_view(const tb_graph *g, int v, tb_view *out);

#endif /* TB_IR_OPS_H */
