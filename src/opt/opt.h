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

typedef struct {
    char device[16];   /* the target backend kind: "cpu" or "cuda"          */
    tb_dtype dtype;    /* weight precision wanted (f32, f16, bf16)           */
    int verbose;       /* 1: log every pass and its report (info level)      */
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

/* The pipeline for general (ONNX) graphs, in order (nn_pipeline.c). */
const tb_pass *tb_opt_nn_pipeline(int *n);

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

#endif /* TB_OPT_H */
