/*
 * interp.h — the reference interpreter: runs a general graph with the
 * reference kernels (ops_nn.h), every value in its own malloc'd buffer,
 * shapes computed per run from the inputs given. It defines what a graph
 * means: passes are checked by interpreting the graph before and after them,
 * and the executor (runtime/exec.c) is tested against it.
 */
#ifndef TB_IR_INTERP_H
#define TB_IR_INTERP_H
#include "ir/ops_nn.h"

/* inputs: one view per graph input (g->inputs order), concrete. outputs:
 * n_out = g->n_outputs views filled with malloc'd data the caller frees
 * (tb_interp_free_outputs). */
tb_status tb_interp_run(const tb_graph *g, const tb_view *inputs, int n_in, tb_view *outputs, int n_out);
void tb_interp_free_outputs(tb_view *outputs, int n_out);

/* Concrete shapes of every value for these inputs (shape rules in order,
 * host inputs evaluated with the reference kernels where needed): views[v]
 * for each value; data is set for weights, for the inputs given and for the
 * values evaluated on the host (owned by *host, freed with
 * tb_interp_free_host), NULL for the rest. Checks the inputs against the
 * graph (dtype, rank, fixed dims, one value per symbol) and every computed
 * shape against the graph's, naming the first mismatch. */
typedef struct tb_interp_host tb_interp_host;
tb_status tb_interp_shapes(const tb_graph *g, const tb_view *inputs, int n_in, tb_view *views,
                           tb_interp_host **host);
void tb_interp_free_host(tb_interp_host *host);
/* Values whose contents some shape rule reads (host inputs, through the
 * nodes computing them): need[v] = 1. Shape reads dims only. */
void tb_interp_host_values(const tb_graph *g, uint8_t *need);
/* Bytes of a concrete view (TB_ERR_FORMAT on overflow). */
tb_status tb_view_bytes(const tb_view *v, uint64_t *out);

#endif /* TB_IR_INTERP_H */
