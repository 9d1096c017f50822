/*
 * runtime.h — runtime pieces beyond the public API: context introspection
 * used by the CLI, the server and the benchmarks.
 */
#ifndef TB_RUNTIME_H
#define TB_RUNTIME_H

#include "backend/backend.h"
#include "core/core.h"

int tb_context_max_seqs(const tb_context *c);
int tb_context_max_step(const tb_context *c);
int tb_context_threads(const tb_context *c);
tb_engine *tb_context_engine(const tb_context *c);
/* 1 when the context keeps full KV blocks for reuse (prefix caching). */
int tb_context_prefix_caching(const tb_context *c);

/* Per-op-kind timing for `turbine bench --engine --profile`: when on, every
 * step adds each node's wall time to its op kind's total. */
tb_status tb_context_set_profiling(tb_context *c, int on);
/* Copies up to `cap` (kind name, seconds) pairs; returns how many kinds ran. */
int tb_context_profile(const tb_context *c, const char **names, double *seconds, int cap);

/* Sampling on a device: fills *row from s's parameters (the uniform draw
 * taken from s's generator as tb_sampler_sample would) and writes the
 * distinct tokens of the penalty window with their counts to tok / cnt (at
 * most cap); returns how many (row->pen_n; the caller sets pen_off). */
int tb_sampler_prepare(tb_sampler *s, const int32_t *hist, int n_hist, tb_sample_row *row, int32_t *tok,
                       int32_t *cnt, int cap);
/* Tokens of the penalty window for a history of n_hist (0: no penalties). */
int tb_sampler_window(const tb_sampler *s, int n_hist);
/* The log-probability of tok and the n_top most likely tokens under
 * log-softmax(logits) into out (token left alone). */
void tb_sample_logprobs(const float *logits, int V, int tok, int n_top, tb_sample_result *out);

#endif
