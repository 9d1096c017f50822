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
 * for each value (data NULL except for host-evaluated values, which point
 * into *host_data, one malloc'd block the caller frees). */
tb_status tb_interp_shapes(const tb_graph *g, const tb_view *inputs, int n_in, tb_view *views, void **host_data);

#endif /* TB_IR_INTERP_H */
