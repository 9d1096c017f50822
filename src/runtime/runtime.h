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

/* Per-op-kind timing of tb_context_step (profile.c), off by default. While
 * on, the step loop charges each node's run to its op kind's name (a static
 * string such as tb_op_name's). tb_context_profile copies up to `cap`
 * (name, seconds) pairs and returns how many kinds were seen; turning
 * profiling on clears the totals. A context freed while profiled should call
 * tb_context_set_profiling(c, 0). */
tb_status tb_context_set_profiling(tb_context *c, int on);
int tb_context_profile(const tb_context *c, const char **names, double *seconds, int cap);
int tb_profile_enabled(const tb_context *c);
void tb_profile_add(const tb_context *c, const char *kind, double seconds);

#endif
