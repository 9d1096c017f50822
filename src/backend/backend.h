/*
 * backend.h — the interface every backend implements (one vtable each).
 *
 * The runtime owns the graph and the memory plan; a backend owns its memory
 * and kernels. Per step, the runtime hands each node to the backend with the
 * buffers of its inputs and outputs and the step's bindings (tb_step): token
 * positions, sequences, block tables and the layer's KV-cache blocks.
 * `supports_op` is asked at load for every node, so an engine whose graph
 * needs an op the backend lacks is refused with the op named.
 */
#ifndef TB_BACKEND_H
#define TB_BACKEND_H

#include "ir/ir.h"

/* Bindings of one step (all arrays are owned by the runtime). */
typedef struct {
    int n_tokens;               /* the `tokens` symbol                         */
    int n_rows;                 /* the `rows` symbol                           */
    const int32_t *pos;         /* (tokens) position of each token in its seq  */
    const int32_t *seq;         /* (tokens) sequence slot of each token        */
    const int32_t *rows;        /* (rows) token index of each logits row       */
    const int32_t *block_tables;/* (max_seqs, max_blocks)                      */
    int max_blocks;
    int block_size;
    int max_ctx;                /* longest sequence allowed                    */
    /* KV cache: per layer, k and v pools (n_blocks, block_size, n_kv, hd) */
    void **k_cache;             /* (n_layers)                                  */
    void **v_cache;             /* (n_layers)                                  */
    tb_dtype kv_dtype;
} tb_step;

typedef struct tb_backend tb_backend;

typedef struct {
    const char *name;
    int (*supports_op)(tb_backend *b, const tb_graph *g, const tb_node *n);
    void *(*alloc)(tb_backend *b, size_t bytes);
    void (*free)(tb_backend *b, void *p);
    /* bufs: one pointer per graph value (weights, inputs, activations). */
    tb_status (*run_node)(tb_backend *b, const tb_graph *g, const tb_node *n,
                          void *const *bufs, const tb_step *st);
    void (*destroy)(tb_backend *b);
} tb_backend_i;

struct tb_backend {
    const tb_backend_i *iface;
    void *ctx;
    int n_threads;
};

/* The CPU backend; `max_ctx` bounds attention scratch. */
tb_status tb_backend_cpu_create(int n_threads, int max_ctx, tb_backend **out);
void tb_backend_free(tb_backend *b);

/* A pool shared by the CPU backend and other CPU work (tuning, benchmarks). */
tb_pool *tb_backend_cpu_pool(tb_backend *b);

#endif /* TB_BACKEND_H */
