/*
 * metrics.h — the server's counters, gauges and histograms, exposed in the
 * Prometheus text format. Updated where the events happen (scheduler thread,
 * HTTP threads) under one short lock; rendering copies under the same lock.
 */
#ifndef TB_METRICS_H
#define TB_METRICS_H

#include "serve/scheduler.h"

typedef struct tb_metrics tb_metrics;

tb_metrics *tb_metrics_new(void);
void tb_metrics_free(tb_metrics *m);

/* The scheduler observer that feeds these metrics. */
tb_sched_observer tb_metrics_observer(tb_metrics *m);
void tb_metrics_http_error(tb_metrics *m, int status);
void tb_metrics_request(tb_metrics *m, const char *endpoint);

/* Renders everything (gauges read from the scheduler). Returns a malloc'd
 * NUL-terminated string. */
char *tb_metrics_render(tb_metrics *m, tb_sched *s, const char *model_name);
/* The same with the scheduler gauges (running, waiting, KV cache, batch
 * size) of n language models: stats sts[i] under labels[i], the label
 * pairs as written inside the braces (model="a",version="1", values
 * escaped); n 0: one zero series with model="". per NULL: the token
 * counters and latency histograms are m's, labelled model=model_name; else
 * per[i] holds model i's, each under labels[i] (a model repository's LLMs),
 * and m only the server's own HTTP counters, which are summed with
 * theirs. model_name labels the GPU gauges. */
char *tb_metrics_render_n(tb_metrics *m, tb_metrics *const *per, const tb_sched_stats *sts,
                          const char *const *labels, int n, const char *model_name);

#endif
