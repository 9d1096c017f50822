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

#endif
