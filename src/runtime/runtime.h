/*
 * runtime.h — runtime pieces beyond the public API: context introspection
 * used by the CLI, the server and the benchmarks.
 */
#ifndef TB_RUNTIME_H
#define TB_RUNTIME_H

#include "core/core.h"

int tb_context_max_seqs(const tb_context *c);
int tb_context_max_step(const tb_context *c);
int tb_context_threads(const tb_context *c);
tb_engine *tb_context_engine(const tb_context *c);

/* Per-op-kind timing for `turbine bench --engine --profile`: when on, every
 * step adds each node's wall time to its op kind's total. */
tb_status tb_context_set_profiling(tb_context *c, int on);
/* Copies up to `cap` (kind name, seconds) pairs; returns how many kinds ran. */
int tb_context_profile(const tb_context *c, const char **names, double *seconds, int cap);

#endif
