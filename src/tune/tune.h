/*
 * tune.h — kernel auto-tuning: time every candidate tactic of each node on
 * this machine and keep the fastest ("measure, don't estimate").
 *
 * Matmuls are timed at two sizes of the `tokens` symbol: 1 (decode) and the
 * profile's prefill size; the choice for each is stored in the node's
 * `tactic` (low byte: small batches, next byte: large). Timings are cached
 * per (K, N, dtype) shape so equal layers are timed once.
 */
#ifndef TB_TUNE_H
#define TB_TUNE_H

#include "ir/ir.h"

typedef struct {
    int n_timed;        /* distinct shapes timed            */
    int n_blas_small;   /* nodes choosing BLAS at tokens=1  */
    int n_blas_large;   /* nodes choosing BLAS for prefill  */
    double seconds;
} tb_tune_report;

tb_status tb_tune_graph(tb_graph *g, int n_threads, int prefill_tokens,
                        tb_tune_report *rep);

#endif
