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

#include "backend/cpu/kernels.h"
#include "ir/ir.h"

typedef struct {
    int n_timed;        /* distinct shapes timed            */
    int n_blas_small;   /* nodes choosing BLAS at tokens=1  */
    int n_blas_large;   /* nodes choosing BLAS for prefill  */
    int n_q8_small;     /* qmatmul nodes choosing Q8 at tokens=1   */
    int n_q8_large;     /* qmatmul nodes choosing Q8 for prefill   */
    double seconds;
    int n_device_timed; /* shapes the target device timed (tb_tune_device) */
} tb_tune_report;

/* qmm_tactics: TB_QMM_TACTICS_AUTO, _EXACT or _Q8 (turbine.h) for the
 * quantized matmuls. */
tb_status tb_tune_graph(tb_graph *g, int n_threads, int prefill_tokens, int qmm_tactics,
                        tb_tune_report *rep);

/* Times the target device's own tactics for g (the CUDA backend's decode
 * GEMV kernels) on that device and stores them in the nodes' tactic words
 * (tune/tactic.h): `turbine build --device cuda` does, so loading an engine
 * never times. Does nothing for "cpu" (NULL) or a backend without tactics.
 * max_ctx: the engine's context (the backend sizes its scratch by it). */
tb_status tb_tune_device(tb_graph *g, const char *device, int max_ctx, tb_tune_report *rep);

/* The CPU bytes of a quantized matmul's tactic word (tune/tactic.h: low
 * byte timed at 1 token, next byte at prefill_tokens), by
 * tb_cpu_qmatmul_pick on this machine: another tactic (tb_qmm_tactic) only
 * where it is more than 7% faster than the default, else 0. qmm_tactics
 * (turbine.h): AUTO times Q8 too, EXACT leaves it out, Q8 takes it without
 * timing wherever it applies. w is the node's weight (codes, scales,
 * zeros), (N, K); x (prefill_tokens, K) and y (prefill_tokens, N) are the
 * caller's scratch. For the qmatmul op's node in tb_tune_graph:
 * nd->tactic = (nd->tactic & ~0xffff) | word. */
int tb_tune_qmatmul(tb_pool *p, const tb_qweight *w, int K, int N, int prefill_tokens, int qmm_tactics,
                    const float *x, float *y);

#endif
