/*
 * comm.h — collectives among the tensor-parallel ranks of one process.
 *
 * A tensor-parallel engine runs one shard of its graph per rank; on the CPU
 * the ranks are threads of one process and exchange data through this
 * communicator (the GPU path uses NCCL inside its backend). Every rank calls
 * the same collectives in the same order; a call returns when every rank's
 * part is done, so buffers may be reused at once.
 *
 * Results are identical on every rank and deterministic: an all-reduce sums
 * the ranks' values in rank order (((x0 + x1) + x2) + ...) for every element.
 * A rank that fails calls tb_comm_abort: every call waiting or made later
 * then fails (TB_ERR_INTERNAL) instead of waiting forever, until
 * tb_comm_reset, which is called with no rank inside a collective.
 */
#ifndef TB_CORE_COMM_H
#define TB_CORE_COMM_H

#include "core/core.h"

typedef struct tb_comm tb_comm;

/* A communicator for n_ranks threads (1..64). */
tb_status tb_comm_create(int n_ranks, tb_comm **out);
void tb_comm_free(tb_comm *c);
int tb_comm_size(const tb_comm *c);

/* In place: buf (n) of every rank becomes the element-wise sum over the ranks. */
tb_status tb_comm_all_reduce(tb_comm *c, int rank, float *buf, size_t n);
/* out (rows, cols * ranks) of every rank: rank r's x (rows, cols) in the
 * columns [r * cols, (r + 1) * cols). x and out must not overlap. */
tb_status tb_comm_all_gather_cols(tb_comm *c, int rank, const float *x, float *out, size_t rows, size_t cols);

/* Returns 1 when this call aborted it, 0 when it already was. */
/* For collectives a backend does itself (device memory): every rank's
 * `mine` into all[0..n) of every rank, once all ranks arrived; and a bare
 * barrier. */
tb_status tb_comm_exchange(tb_comm *c, int rank, void *mine, void **all);
tb_status tb_comm_barrier(tb_comm *c, int rank);

int tb_comm_abort(tb_comm *c);
void tb_comm_reset(tb_comm *c);

#endif /* TB_CORE_COMM_H */
