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
#include "ir/ops.h"

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
    /* General graphs: the concrete view of every value in this run,
     * indexed by value; view.data is a HOST copy where one is known
     * (weights, values computed on the host for shape rules: the host
     * inputs of ops_nn.h), NULL otherwise; the kernels' buffers are bufs[].
     * NULL for LLM graphs (dims from the graph with `tokens` / `rows` bound
     * as above). */
    const tb_view *views;
    /* Tensor parallelism: this rank of the engine's tp_size (0 / 0 or 1:
     * none) and the communicator of the CPU path's collectives
     * (core/comm.h; NULL with one rank). */
    int tp_rank, tp_size;
    struct tb_comm *comm;
} tb_step;

/* The first dim of value v in this step: `tokens` or `rows` bound. */
int64_t tb_step_rows(const tb_graph *g, int v, const tb_step *st);

typedef struct tb_backend tb_backend;

/* One logits row to sample on the device (see `sample`): the row's
 * parameters, the uniform draw from its sampler's generator, and its
 * penalty window as (token, count) pairs [pen_off, pen_off + pen_n) of the
 * step's pair arrays. */
typedef struct {
    float temperature, top_p, min_p;
    float repeat_penalty, presence_penalty, frequency_penalty;
    float u;
    int top_k;
    int n_top;              /* alternatives wanted, 0..TB_TOP_LOGPROBS_MAX */
    int pen_off, pen_n;
    int force;              /* -1: pick; else take this token (only scored) */
} tb_sample_row;

typedef struct {
    const char *name;
    int (*supports_op)(tb_backend *b, const tb_graph *g, const tb_node *n);
    /* Memory the kernels can read and write (device memory for a GPU). */
    void *(*alloc)(tb_backend *b, size_t bytes);
    void (*free)(tb_backend *b, void *p);
    /* Makes every weight of g readable by the kernels: sets bufs[v] for each
     * weight value (CPU: the mapped data itself; GPU: an uploaded copy). */
    tb_status (*load_weights)(tb_backend *b, const tb_graph *g, void **bufs);
    /* Before a step: bring the step's host bindings (token ids into
     * bufs[ids_value], positions, block tables, ...) where the kernels read
     * them; may rewrite the pointers in *st. */
    tb_status (*step_begin)(tb_backend *b, const tb_graph *g, void **bufs,
                            int ids_value, const int32_t *ids, tb_step *st);
    /* bufs: one pointer per graph value (weights, inputs, activations). */
    tb_status (*run_node)(tb_backend *b, const tb_graph *g, const tb_node *n,
                          void *const *bufs, const tb_step *st);
    /* After a step: *out = a host pointer to `bytes` of the output `src`
     * (valid until the next step). */
    tb_status (*read_output)(tb_backend *b, const void *src, size_t bytes,
                             const float **out);
    /* Optional (NULL: the runtime reads the logits and samples on the host).
     * After a step: picks one token per row of `logits` (n_rows, vocab), the
     * output of the step, on the device; only `out` crosses to the host.
     * The rows may be modified. pen_tok / pen_cnt: n_pen pairs (host). */
    tb_status (*sample)(tb_backend *b, void *logits, int n_rows, int vocab,
                        const tb_sample_row *rows, const int32_t *pen_tok,
                        const int32_t *pen_cnt, int n_pen,
                        tb_sample_result *out);
    /* General engines: copies between host memory and memory from alloc
     * (CPU: memcpy), finished when they return. NULL: host memory is the
     * kernels' memory (inputs and outputs are used in place). */
    tb_status (*upload)(tb_backend *b, void *dst, const void *src, size_t bytes);
    tb_status (*download)(tb_backend *b, void *dst, const void *src, size_t bytes);
    /* Optional (NULL: not called). General engines: run_begin before the
     * first run_node of a run (after the inputs' upload), run_end after the
     * last (before the outputs' download), with the run's bufs and views. A
     * backend may record the run between them and replay the recording on a
     * later run of the same views, buffers and host values (the CUDA
     * backend's graphs); run_node then enqueues nothing, and run_end
     * launches the recording. Without these calls every run_node runs at once. */
    tb_status (*run_begin)(tb_backend *b, const tb_graph *g, void *const *bufs, const tb_step *st);
    tb_status (*run_end)(tb_backend *b, const tb_graph *g, void *const *bufs, const tb_step *st);
    /* Optional: TB_OK when the kernels read a KV cache of dtype kv (the
     * layout of core/kv_layout.h), else an error naming why. NULL: f32,
     * f16 and bf16 only. Asked when a context is created. */
    tb_status (*check_kv_dtype)(tb_backend *b, tb_dtype kv);
    void (*destroy)(tb_backend *b);
    /* Optional, at build time only (tb_tune_device): times the backend's own
     * kernel choices for g's nodes, weights loaded by load_weights, and
     * stores them in the nodes' tactic words (tune/tactic.h); *n_timed: the
     * shapes timed. Loading an engine never calls it. */
    tb_status (*tune)(tb_backend *b, tb_graph *g, void *const *bufs, int *n_timed);
} tb_backend_i;

struct tb_backend {
    const tb_backend_i *iface;
    void *ctx;
    int n_threads;
};

/* ---- registry: backends are chosen at run time by a device string,
 * "cpu" or "cuda[:N]"; the engine's hardware section names its backend. */

/* Splits "cuda:1" into kind "cuda" and index 1 ("cpu": index 0). */
tb_status tb_device_parse(const char *device, char kind[16], int *index);
/* Creates the backend for `device`; `max_ctx` bounds attention scratch. */
tb_status tb_backend_create(const char *device, int n_threads, int max_ctx,
                            tb_backend **out);
void tb_backend_free(tb_backend *b);
/* This machine's fingerprint for `device`, as a malloc'd JSON object text
 * ({"backend": kind, ...}), or NULL with an error when the device is absent. */
char *tb_backend_fingerprint(const char *device);
/* Checks a recorded fingerprint against this machine's `device` (NULL: the
 * recorded backend's first device); the error names both sides. */
tb_status tb_backend_check(const char *hw_json, const char *device);
/* Total and free memory of a GPU `device` ("cuda[:N]"), in bytes; an error
 * naming the problem for "cpu" or a build without CUDA. */
tb_status tb_backend_memory(const char *device, uint64_t *total, uint64_t *free_bytes);
/* The backend kind recorded in a fingerprint ("cpu" when unreadable). */
void tb_backend_kind_of(const char *hw_json, char kind[16]);

/* Implementations (each in its own folder). */
tb_status tb_backend_cpu_create(int n_threads, int max_ctx, tb_backend **out);
char *tb_backend_cpu_fingerprint(void);
tb_status tb_backend_cpu_check(const char *hw_json);
/* The CUDA backend lives in a module loaded on first use: cuda/cuda_module.h. */

/* A pool shared by the CPU backend and other CPU work (tuning, benchmarks). */
tb_pool *tb_backend_cpu_pool(tb_backend *b);

#endif /* TB_BACKEND_H */
