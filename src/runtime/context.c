/* context.c — execution context: memory plan, paged KV cache, one step.
 *
 * Everything is sized at creation: the activation arena (planned once by
 * liveness over the graph, at the profile's maximum sizes), the step input
 * arrays, the logits buffer and the KV-cache pool. A step allocates nothing.
 * Blocks come from a tb_kv_pool (kv_blocks.h), which also keeps full blocks
 * for reuse by sequences that start with the same tokens (prefix caching).
 */
#include "backend/backend.h"
#include "plan/engine.h"
#include "runtime/kv_blocks.h"
#include "core/kv_layout.h"
#include "runtime/runtime.h"
#include "tune/tactic.h"
#include "core/comm.h"

#include <pthread.h>

void tb_context_options_default(tb_context_options *o) { memset(o, 0, sizeof *o); }

/* ---------------------------------------------------------------- planning */

typedef struct {
    uint64_t off, size;
    int value;
} live_block;

/* Assigns arena offsets to activations so that values not live at the same
 * time share memory (first fit over the gaps between live blocks). */
static tb_status plan_memory(const tb_graph *g, uint64_t *offsets, uint64_t *total) {
    int nv = g->n_values;
    int *last = malloc(sizeof(int) * (size_t)nv);
    live_block *live = malloc(sizeof(live_block) * (size_t)(nv + 1));
    if (!last || !live) { free(last); free(live); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    for (int i = 0; i < nv; i++) last[i] = -1;
    for (int k = 0; k < g->n_nodes; k++)
        for (int j = 0; j < g->nodes[k].n_in; j++) last[g->nodes[k].in[j]] = k;
    /* A node the build marked as running together with the next one
     * (TB_TACTIC_WITH_NEXT: a fused epilogue writes the next node's output
     * while other blocks still read this node's inputs) keeps its inputs
     * until that next node is done. Nothing else is kept: the planner
     * follows the engine's stored choices and matches no patterns. */
    for (int k = 0; k + 1 < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (!(n->tactic & TB_TACTIC_WITH_NEXT)) continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] >= 0 && last[n->in[j]] < k + 1) last[n->in[j]] = k + 1;
    }
    last[g->output] = g->n_nodes; /* kept after the step */
    int n_live = 0;
    uint64_t peak = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        for (int o = 0; o < n->n_out; o++) {
            int v = n->out[o];
            uint64_t size;
            tb_status s = tb_value_bytes(g, &g->values[v], NULL, &size);
            if (s != TB_OK) { free(last); free(live); return s; }
            size = (size + 63) / 64 * 64;
            if (size == 0) size = 64;
            /* live blocks are kept sorted by offset */
            uint64_t pos = 0;
            int at = 0;
            for (; at < n_live; at++) {
                if (live[at].off >= pos + size) break;
                if (live[at].off + live[at].size > pos) pos = live[at].off + live[at].size;
            }
            memmove(&live[at + 1], &live[at], sizeof(live_block) * (size_t)(n_live - at));
            live[at] = (live_block){pos, size, v};
            n_live++;
            offsets[v] = pos;
            if (pos + size > peak) peak = pos + size;
        }
        /* release what this node used for the last time (never the outputs
         * of this node while its inputs are still being read: done after) */
        for (int i = 0; i < n_live;) {
            int v = live[i].value;
            if (last[v] <= k) {
                memmove(&live[i], &live[i + 1], sizeof(live_block) * (size_t)(n_live - i - 1));
                n_live--;
            } else {
                i++;
            }
        }
    }
    free(last);
    free(live);
    *total = peak;
    return TB_OK;
}

/* ---------------------------------------------------------------- create */

typedef struct rank_arg rank_arg;

/* Whether two graphs have the same symbols (a rank's against rank 0's). */
static int same_syms(const tb_graph *a, const tb_graph *b) {
    if (a->n_syms != b->n_syms) return 0;
    for (int i = 0; i < a->n_syms; i++)
        if (strcmp(a->syms[i].name, b->syms[i].name) || a->syms[i].min != b->syms[i].min ||
            a->syms[i].max != b->syms[i].max)
            return 0;
    return 1;
}
static void *rank_main(void *arg);

/* What each tensor-parallel rank holds (one rank without tensor
 * parallelism): its graph, backend, activations and its heads' KV cache. */
typedef struct {
    const tb_graph *g;
    tb_backend *be;
    void **bufs;              /* one per value of g */
    uint8_t *arena;
    uint64_t arena_bytes;
    uint8_t *kv;              /* all layers, k then v */
    void **k_cache, **v_cache;/* (n_layers) */
    int ids_value;
    /* the last step's outcome on a rank's own thread (ranks > 0) */
    tb_status status;
    int primary;              /* the failure was this rank's own, not another's abort */
    char msg[512];
} ctx_rank;

struct tb_context {
    tb_engine *e;
    tb_backend *be;           /* rank 0's */
    int max_seqs, max_step, max_ctx, vocab, n_layers;
    void **bufs;              /* rank 0's: one per value */
    int tp;                   /* tensor-parallel ranks (1: none) */
    ctx_rank rk[TB_MAX_TP];
    /* ranks > 0 run on threads of their own, started for each step */
    tb_comm *comm;
    pthread_t threads[TB_MAX_TP];
    int n_threads_started;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned go_gen;
    int n_done, quit;
    tb_step cur;              /* the step every rank runs */
    struct rank_arg { struct tb_context *c; int rank; } rank_args[TB_MAX_TP];
    int32_t *ids, *pos, *seq, *rows;  /* (max_step) */
    /* paged KV cache */
    int block_size, n_blocks, max_blocks;
    tb_dtype kv_dtype;
    int32_t *block_tables;    /* (max_seqs, max_blocks) */
    int32_t *seq_len;         /* (max_seqs) */
    int32_t *seq_blocks;      /* (max_seqs) blocks held */
    tb_kv_pool *pool;
    uint64_t *seq_key;        /* (max_seqs) prefix-cache key of the last full block */
    int32_t *seq_part;        /* (max_seqs, block_size) tokens of the block being filled */
    int ids_value;
    double t_step;            /* seconds spent in steps */
    int profiling;
    double prof_seconds[TB_OP_COUNT];
    tb_node_observer observer;/* NULL: none (calibration sets one) */
    void *observer_user;
    /* sampled steps: a host copy of one row, the rows' device parameters and
     * their penalty pairs (grown when a step needs more) */
    float *srow;              /* (vocab) */
    tb_sample_row *srows;     /* (max rows of a step) */
    int32_t *pen_tok, *pen_cnt;
    size_t pen_cap;
};

tb_status tb_context_set_profiling(tb_context *c, int on) {
    if (!c) return tb_errorf(TB_ERR_INVALID_ARG, "profiling: no context");
    c->profiling = on != 0;
    memset(c->prof_seconds, 0, sizeof c->prof_seconds);
    return TB_OK;
}

tb_status tb_context_set_observer(tb_context *c, tb_node_observer fn, void *user) {
    if (!c) return tb_errorf(TB_ERR_INVALID_ARG, "observer: no context");
    if (fn && strcmp(c->be->iface->name, "cpu") != 0)
        return tb_errorf(TB_ERR_UNSUPPORTED, "a node observer needs a CPU context (this one runs on %s)",
                         c->be->iface->name);
    c->observer = fn;
    c->observer_user = user;
    return TB_OK;
}

int tb_context_profile(const tb_context *c, const char **names, double *seconds, int cap) {
    int n = 0;
    for (int k = 0; k < TB_OP_COUNT; k++) {
        if (c->prof_seconds[k] <= 0) continue;
        if (n < cap) {
            names[n] = tb_op_name((tb_op_kind)k);
            seconds[n] = c->prof_seconds[k];
        }
        n++;
    }
    return n < cap ? n : cap;
}

tb_status tb_context_create(tb_engine *e, const tb_context_options *opt, tb_context **out) {
    *out = NULL;
    if (!tb_engine_is_llm(e))
        return tb_errorf(TB_ERR_INVALID_ARG, "this engine was compiled from an ONNX model: run it with turbine exec "
                                             "or turbine bench --engine, or serve it over KServe");
    tb_context_options o;
    if (opt) o = *opt; else tb_context_options_default(&o);
    const tb_graph *g = e->graph;
    tb_context *c = calloc(1, sizeof *c);
    if (!c) return tb_errorf(TB_ERR_OOM, "out of memory");
    c->e = e;
    tb_status s;
    c->max_seqs = o.max_seqs > 0 ? o.max_seqs : e->info.max_batch;
    c->max_step = e->max_step_tokens;
    if (o.max_step_tokens > 0 && o.max_step_tokens < c->max_step) c->max_step = o.max_step_tokens;
    /* the arena is planned for the profile's maxima: a step may never carry
     * more tokens or logits rows than that, whatever the meta section says */
    for (int i = 0; i < g->n_syms; i++)
        if ((!strcmp(g->syms[i].name, "tokens") || !strcmp(g->syms[i].name, "rows")) && g->syms[i].max < c->max_step) {
            int declared = c->max_step;
            free(c);
            return tb_errorf(TB_ERR_FORMAT, "engine meta allows steps of %d tokens but the graph's profile plans "
                             "%s <= %lld", declared, g->syms[i].name, (long long)g->syms[i].max);
        }
    if (tb_graph_find_sym(g, "tokens") < 0 || c->max_step < 1) {
        free(c);
        return tb_errorf(TB_ERR_FORMAT, "engine graph has no tokens profile or the step bound is not positive");
    }
    c->max_ctx = e->info.max_seq_len;
    c->vocab = e->info.vocab_size;
    c->n_layers = e->info.n_layers;
    c->block_size = o.kv_block_size > 0 ? o.kv_block_size : 16;
    c->max_blocks = (c->max_ctx + c->block_size - 1) / c->block_size;
    /* The cache holds what the engine computes in: an f16 cache under a bf16
     * engine overflows where keys or values pass 65504, which bf16 carries. */
    c->kv_dtype = e->info.weight_dtype == TB_F16 || e->info.weight_dtype == TB_BF16 ? e->info.weight_dtype : TB_F32;
    /* A quantized engine on the CPU: f16. Its weights are a third or less
     * of an f32 engine's, so an f32 cache is a large share of what a decode
     * step reads (134M int4 at 576 positions: 42.5 of 112 MB); f16 halves
     * it at +0.00% perplexity on the demo model (docs/PERFORMANCE.md). On
     * the GPU too: its quantized matmuls compute in f16 (x rounded to f16),
     * and f16 is the cache its flash prefill reads. */
    tb_dtype wd = e->info.weight_dtype;
    if (wd == TB_I8 || wd == TB_I4 || wd == TB_FP8_E4M3) c->kv_dtype = TB_F16;
    if (o.kv_dtype && *o.kv_dtype && strcmp(o.kv_dtype, "auto") != 0) {
        tb_dtype kd;
        if (!strcmp(o.kv_dtype, "int8")) kd = TB_I8;
        else if (!strcmp(o.kv_dtype, "fp8")) kd = TB_FP8_E4M3;
        else if (tb_dtype_parse(o.kv_dtype, &kd) != TB_OK ||
                 (kd != TB_F32 && kd != TB_F16 && kd != TB_BF16 && kd != TB_I8 && kd != TB_FP8_E4M3)) {
            free(c);
            return tb_errorf(TB_ERR_INVALID_ARG, "kv dtype '%.32s' is not auto, f32, f16, bf16, int8 or fp8",
                             o.kv_dtype);
        }
        c->kv_dtype = kd;
    }
    if (tb_graph_find_value(g, "token_ids") < 0) {
        free(c);
        return tb_errorf(TB_ERR_FORMAT, "engine graph has no token_ids input");
    }
    c->tp = e->tp > 1 ? e->tp : 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->go, NULL);
    pthread_cond_init(&c->done, NULL);

    const char *device = o.device && *o.device ? o.device : e->backend;
    if ((s = tb_backend_check(e->hw_json, device)) != TB_OK) goto fail;
    /* GPU ranks: rank r on device index + r (NCCL between them); with
     * TURBINE_TP_ONE_DEVICE=1 every rank on the device given (one GPU
     * holding all ranks: the collectives meet on the host, no NCCL) */
    char kind[16];
    int dev_index = 0;
    if ((s = tb_device_parse(device, kind, &dev_index)) != TB_OK) goto fail;
    int gpu = strcmp(kind, "cpu") != 0;
    const char *one = getenv("TURBINE_TP_ONE_DEVICE");
    int one_device = one && !strcmp(one, "1");
    (void)gpu;
    /* the CPU's threads shared among the ranks */
    int rank_threads = o.n_threads;
    if (c->tp > 1) {
        int total = o.n_threads > 0 ? o.n_threads : tb_default_threads();
        rank_threads = total / c->tp > 0 ? total / c->tp : 1;
    }
    int KV = e->info.n_kv_heads / c->tp, hd = e->info.head_dim;
    for (int r = 0; r < c->tp; r++) {
        ctx_rank *k = &c->rk[r];
        const tb_graph *rg = k->g = e->rank_graph[r] ? e->rank_graph[r] : g;
        k->ids_value = tb_graph_find_value(rg, "token_ids");
        if (k->ids_value < 0 || !same_syms(rg, g)) {
            s = tb_errorf(TB_ERR_FORMAT, "engine graph of rank %d does not match rank 0's inputs and profile", r);
            goto fail;
        }
        char rank_dev[32];
        if (gpu && !one_device) snprintf(rank_dev, sizeof rank_dev, "%s:%d", kind, dev_index + r);
        else snprintf(rank_dev, sizeof rank_dev, "%s", device);
        if ((s = tb_backend_create(rank_dev, rank_threads, c->max_ctx, &k->be)) != TB_OK) {
            if (c->tp > 1) tb_error_prefix(s, "tensor-parallel rank %d of %d", r, c->tp);
            goto fail;
        }
        /* a backend without the hook reads f32, f16 and bf16 caches only */
        if (k->be->iface->check_kv_dtype) {
            if ((s = k->be->iface->check_kv_dtype(k->be, c->kv_dtype)) != TB_OK) goto fail;
        } else if (tb_kv_quantized(c->kv_dtype)) {
            s = tb_errorf(TB_ERR_UNSUPPORTED, "backend %s has no %s KV cache", k->be->iface->name,
                          tb_dtype_name(c->kv_dtype));
            goto fail;
        }
        /* attention nodes index the KV cache: their attributes must match it */
        for (int j = 0; j < rg->n_nodes; j++) {
            const tb_node *n = &rg->nodes[j];
            if (n->op != TB_OP_ATTENTION) continue;
            if (n->i[0] < 0 || n->i[0] >= c->n_layers || n->i[2] != KV || (n->i[3] & 0xffff) != hd) {
                s = tb_errorf(TB_ERR_FORMAT, "engine graph: attention node %d does not match the model (layer %d of "
                              "%d)", j, n->i[0], c->n_layers);
                goto fail;
            }
        }
        for (int j = 0; j < rg->n_nodes; j++)
            if (!k->be->iface->supports_op(k->be, rg, &rg->nodes[j])) {
                s = tb_errorf(TB_ERR_UNSUPPORTED, "backend %s does not support op %s (node %d)", k->be->iface->name,
                              tb_op_name(rg->nodes[j].op), j);
                goto fail;
            }
        /* symbols at their maxima, bounded by this context */
        uint64_t *offsets = calloc((size_t)rg->n_values, sizeof *offsets);
        k->bufs = calloc((size_t)rg->n_values, sizeof(void *));
        if (!offsets || !k->bufs) { free(offsets); s = tb_errorf(TB_ERR_OOM, "out of memory"); goto fail; }
        if ((s = plan_memory(rg, offsets, &k->arena_bytes)) != TB_OK) { free(offsets); goto fail; }
        k->arena = k->be->iface->alloc(k->be, k->arena_bytes);
        if (!k->arena) {
            free(offsets);
            s = tb_errorf(TB_ERR_OOM, "cannot allocate %llu bytes of activations", (unsigned long long)k->arena_bytes);
            goto fail;
        }
        for (int i = 0; i < rg->n_values; i++)
            if (rg->values[i].kind == TB_VAL_ACT) k->bufs[i] = k->arena + offsets[i];
        free(offsets);
        if ((s = k->be->iface->load_weights(k->be, rg, k->bufs)) != TB_OK) goto fail;
    }
    c->be = c->rk[0].be;
    c->bufs = c->rk[0].bufs;
    size_t ms = (size_t)g->syms[0].max;
    for (int i = 0; i < g->n_syms; i++) if ((size_t)g->syms[i].max > ms) ms = (size_t)g->syms[i].max;
    c->ids = calloc(ms, sizeof(int32_t));
    c->pos = calloc(ms, sizeof(int32_t));
    c->seq = calloc(ms, sizeof(int32_t));
    c->rows = calloc(ms, sizeof(int32_t));
    c->srow = malloc(sizeof(float) * (size_t)c->vocab);
    c->srows = calloc(ms, sizeof(tb_sample_row));
    if (!c->ids || !c->pos || !c->seq || !c->rows || !c->srow || !c->srows) {
        s = tb_errorf(TB_ERR_OOM, "out of memory");
        goto fail;
    }

    /* KV cache: each rank holds its KV heads of every block (the block
     * tables are shared) */
    /* int8 / fp8: one byte a code plus an f32 scale per (token, kv head), so
     * the same bytes hold about twice the tokens of f16 (kv_layout.h) */
    size_t block_bytes = tb_kv_block_bytes(c->kv_dtype, c->block_size, KV, hd);
    size_t per_block_all_layers = block_bytes * 2 * (size_t)c->n_layers * (size_t)c->tp;
    if (o.kv_cache_bytes > 0) c->n_blocks = (int)(o.kv_cache_bytes / per_block_all_layers);
    else c->n_blocks = c->max_seqs * c->max_blocks;
    if (c->n_blocks < 1) {
        s = tb_errorf(TB_ERR_INVALID_ARG, "KV cache of %zu bytes holds no block (one block needs %zu bytes)",
                      o.kv_cache_bytes, per_block_all_layers);
        goto fail;
    }
    size_t layer_bytes = block_bytes * (size_t)c->n_blocks;
    c->block_tables = calloc((size_t)c->max_seqs * (size_t)c->max_blocks, sizeof(int32_t));
    c->seq_len = calloc((size_t)c->max_seqs, sizeof(int32_t));
    c->seq_blocks = calloc((size_t)c->max_seqs, sizeof(int32_t));
    c->seq_key = calloc((size_t)c->max_seqs, sizeof(uint64_t));
    c->seq_part = calloc((size_t)c->max_seqs * (size_t)c->block_size, sizeof(int32_t));
    if ((s = tb_kv_pool_create(c->n_blocks, c->block_size, !o.no_prefix_cache, &c->pool)) != TB_OK) goto fail;
    if (!c->block_tables || !c->seq_len || !c->seq_blocks || !c->seq_key || !c->seq_part) {
        s = tb_errorf(TB_ERR_OOM, "out of memory");
        goto fail;
    }
    for (int r = 0; r < c->tp; r++) {
        ctx_rank *k = &c->rk[r];
        k->kv = k->be->iface->alloc(k->be, layer_bytes * 2 * (size_t)c->n_layers);
        k->k_cache = calloc((size_t)c->n_layers, sizeof(void *));
        k->v_cache = calloc((size_t)c->n_layers, sizeof(void *));
        if (!k->kv || !k->k_cache || !k->v_cache) {
            s = tb_errorf(TB_ERR_OOM, "cannot allocate the KV cache (%d blocks of %zu bytes)", c->n_blocks,
                          per_block_all_layers);
            goto fail;
        }
        for (int l = 0; l < c->n_layers; l++) {
            k->k_cache[l] = k->kv + layer_bytes * (size_t)(2 * l);
            k->v_cache[l] = k->kv + layer_bytes * (size_t)(2 * l + 1);
        }
    }
    if (c->tp > 1) {
        if ((s = tb_comm_create(c->tp, &c->comm)) != TB_OK) goto fail;
        for (int r = 1; r < c->tp; r++) {
            rank_arg *a = &c->rank_args[r];
            a->c = c;
            a->rank = r;
            if (pthread_create(&c->threads[r], NULL, rank_main, a) != 0) {
                s = tb_errorf(TB_ERR_INTERNAL, "cannot start the thread of tensor-parallel rank %d", r);
                goto fail;
            }
            c->n_threads_started = r;
        }
    }
    *out = c;
    return TB_OK;
fail:
    tb_context_free(c);
    return s;
}

void tb_context_free(tb_context *c) {
    if (!c) return;
    if (c->n_threads_started) {
        pthread_mutex_lock(&c->mu);
        c->quit = 1;
        pthread_cond_broadcast(&c->go);
        pthread_mutex_unlock(&c->mu);
        for (int r = 1; r <= c->n_threads_started; r++) pthread_join(c->threads[r], NULL);
    }
    tb_comm_free(c->comm);
    for (int r = 0; r < TB_MAX_TP; r++) {
        ctx_rank *k = &c->rk[r];
        if (k->be) {
            if (k->arena) k->be->iface->free(k->be, k->arena);
            if (k->kv) k->be->iface->free(k->be, k->kv);
        }
        tb_backend_free(k->be);
        free(k->bufs);
        free(k->k_cache);
        free(k->v_cache);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->go);
    pthread_cond_destroy(&c->done);
    free(c->ids); free(c->pos); free(c->seq); free(c->rows);
    free(c->srow); free(c->srows); free(c->pen_tok); free(c->pen_cnt);
    free(c->block_tables); free(c->seq_len); free(c->seq_blocks); free(c->seq_key); free(c->seq_part);
    tb_kv_pool_free(c->pool);
    free(c);
}

/* ---------------------------------------------------------------- sequences */

tb_status tb_seq_reset(tb_context *c, int seq) {
    if (seq < 0 || seq >= c->max_seqs)
        return tb_errorf(TB_ERR_INVALID_ARG, "sequence slot %d is outside [0, %d)", seq, c->max_seqs);
    int32_t *bt = c->block_tables + (size_t)seq * (size_t)c->max_blocks;
    /* last block first: cached blocks are evicted oldest release first, so a prefix loses its tail
     * before its head (a head without its tail still serves shorter matches; the reverse serves none) */
    for (int j = c->seq_blocks[seq] - 1; j >= 0; j--) tb_kv_pool_release(c->pool, bt[j]);
    c->seq_blocks[seq] = 0;
    c->seq_len[seq] = 0;
    c->seq_key[seq] = 0;
    return TB_OK;
}

int tb_seq_reuse_prefix(tb_context *c, int seq, const int32_t *tokens, int n_tokens) {
    if (seq < 0 || seq >= c->max_seqs || c->seq_len[seq] != 0 || c->seq_blocks[seq] != 0) return -1;
    if (n_tokens > c->max_ctx) n_tokens = c->max_ctx;
    int max = n_tokens > 0 ? (n_tokens - 1) / c->block_size : 0;
    int32_t *bt = c->block_tables + (size_t)seq * (size_t)c->max_blocks;
    int n = tb_kv_pool_match(c->pool, tokens, max, bt, &c->seq_key[seq]);
    c->seq_blocks[seq] = n;
    c->seq_len[seq] = n * c->block_size;
    return n * c->block_size;
}

/* After a step wrote chunk `ch`: the blocks it filled go into the prefix cache. */
static void publish_blocks(tb_context *c, const tb_seq_chunk *ch) {
    int s = ch->seq, bs = c->block_size, len = c->seq_len[s]; /* before the chunk */
    int32_t *part = c->seq_part + (size_t)s * (size_t)bs;
    const int32_t *bt = c->block_tables + (size_t)s * (size_t)c->max_blocks;
    for (int j = 0; j < ch->n_tokens; j++) {
        int p = len + j;
        part[p % bs] = ch->tokens[j];
        if (p % bs == bs - 1) c->seq_key[s] = tb_kv_pool_publish(c->pool, bt[p / bs], c->seq_key[s], part);
    }
}

int tb_seq_len(const tb_context *c, int seq) {
    return seq >= 0 && seq < c->max_seqs ? c->seq_len[seq] : -1;
}
int tb_kv_free_blocks(const tb_context *c) { return tb_kv_pool_available(c->pool); }
int tb_kv_cached_blocks(const tb_context *c) { return tb_kv_pool_idle_cached(c->pool); }
int tb_kv_total_blocks(const tb_context *c) { return c->n_blocks; }
int tb_kv_block_size(const tb_context *c) { return c->block_size; }
int tb_context_max_seqs(const tb_context *c) { return c->max_seqs; }
int tb_context_max_step(const tb_context *c) { return c->max_step; }
tb_dtype tb_context_kv_dtype(const tb_context *c) { return c->kv_dtype; }
int tb_context_threads(const tb_context *c) { return c->be->n_threads * c->tp; }
int tb_context_tp(const tb_context *c) { return c->tp; }
tb_engine *tb_context_engine(const tb_context *c) { return c->e; }
int tb_context_prefix_caching(const tb_context *c) { return tb_kv_pool_caching(c->pool); }

const char *tb_context_backend(const tb_context *c) { return c->be->iface->name; }

/* Decode steps of n = max, then 1, 2, ..., max - 1 sequences (the largest
 * first: whatever a step size allocates grows once), each sequence one token
 * at position 0, sampled greedily as the scheduler's steps are; every slot is
 * reset after each step. A one-token sequence fills no KV block, so the
 * prefix cache is untouched. */
tb_status tb_context_warmup(tb_context *c, int max_n, int *steps) {
    if (steps) *steps = 0;
    int n = max_n > 0 && max_n < c->max_seqs ? max_n : c->max_seqs;
    if (n > c->max_step) n = c->max_step;
    int avail = tb_kv_pool_available(c->pool);
    if (n > avail) n = avail;
    for (int s = 0; s < n; s++)
        if (c->seq_len[s] || c->seq_blocks[s])
            return tb_errorf(TB_ERR_INVALID_ARG, "warm-up: sequence slot %d is in use", s);
    if (n < 1) return TB_OK;
    tb_seq_chunk *ch = calloc((size_t)n, sizeof *ch);
    tb_row_sampling *rs = calloc((size_t)n, sizeof *rs);
    tb_sample_result *out = calloc((size_t)n, sizeof *out);
    tb_sampler *greedy = NULL;
    tb_sampling_params sp;
    tb_sampling_params_default(&sp);
    sp.temperature = 0;
    tb_status st = !ch || !rs || !out ? tb_errorf(TB_ERR_OOM, "warm-up: out of memory")
                                      : tb_sampler_create(c->vocab, &sp, &greedy);
    static const int32_t tok = 0;
    for (int k = 0; st == TB_OK && k < n; k++) {
        int m = k == 0 ? n : k, rows = 0;
        for (int i = 0; i < m; i++) {
            ch[i] = (tb_seq_chunk){.seq = i, .n_tokens = 1, .tokens = &tok, .logits = 1};
            rs[i] = (tb_row_sampling){.sampler = greedy, .history = &tok, .n_history = 1, .top_logprobs = -1};
        }
        st = tb_context_step_sample(c, ch, m, rs, out, &rows);
        for (int i = 0; i < m; i++) {
            tb_status r = tb_seq_reset(c, i);
            if (st == TB_OK) st = r;
        }
        if (st == TB_OK && steps) (*steps)++;
    }
    if (st != TB_OK) st = tb_error_prefix(st, "warm-up");
    tb_sampler_free(greedy);
    free(ch);
    free(rs);
    free(out);
    return st;
}

/* ---------------------------------------------------------------- step */

/* Runs rank r's graph over step st (its KV cache and rank set here). On a
 * failure the communicator is aborted, so that no other rank waits in a
 * collective for this one. */
static tb_status run_rank(tb_context *c, int r, const tb_step *st0) {
    ctx_rank *k = &c->rk[r];
    tb_step st = *st0;
    st.k_cache = k->k_cache;
    st.v_cache = k->v_cache;
    st.tp_rank = r;
    const tb_graph *g = k->g;
    k->primary = 0;
    tb_status s = k->be->iface->step_begin(k->be, g, k->bufs, k->ids_value, c->ids, &st);
    int prof = c->profiling && r == 0;
    for (int j = 0; j < g->n_nodes && s == TB_OK; j++) {
        double tn = prof ? tb_now() : 0;
        s = k->be->iface->run_node(k->be, g, &g->nodes[j], k->bufs, &st);
        if (s != TB_OK) {
            tb_error_prefix(s, "node %d (%s)", j, tb_op_name(g->nodes[j].op));
            break;
        }
        if (prof) c->prof_seconds[g->nodes[j].op] += tb_now() - tn;
        if (c->observer && r == 0) c->observer(c->observer_user, g, j, k->bufs, &st);
    }
    if (s != TB_OK && c->comm) k->primary = tb_comm_abort(c->comm);
    return s;
}

/* The thread of rank r > 0: waits for a step, runs it, reports. */
static void *rank_main(void *arg) {
    rank_arg *a = arg;
    tb_context *c = a->c;
    ctx_rank *k = &c->rk[a->rank];
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->quit && c->go_gen == seen) pthread_cond_wait(&c->go, &c->mu);
        if (c->quit) { pthread_mutex_unlock(&c->mu); break; }
        seen = c->go_gen;
        tb_step st = c->cur;
        pthread_mutex_unlock(&c->mu);
        k->status = run_rank(c, a->rank, &st);
        if (k->status != TB_OK) snprintf(k->msg, sizeof k->msg, "%s", tb_last_error());
        pthread_mutex_lock(&c->mu);
        if (++c->n_done == c->tp - 1) pthread_cond_signal(&c->done);
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

tb_status tb_context_step(tb_context *c, const tb_seq_chunk *ch, int n_chunks, const float **logits, int *n_rows) {
    if (logits) *logits = NULL;
    if (n_rows) *n_rows = 0;
    if (n_chunks <= 0) return tb_errorf(TB_ERR_INVALID_ARG, "a step needs at least one sequence");
    int total = 0, need_blocks = 0, rows = 0;
    for (int i = 0; i < n_chunks; i++) {
        int s = ch[i].seq, n = ch[i].n_tokens;
        if (s < 0 || s >= c->max_seqs)
            return tb_errorf(TB_ERR_INVALID_ARG, "sequence slot %d is outside [0, %d)", s, c->max_seqs);
        for (int j = 0; j < i; j++)
            if (ch[j].seq == s) return tb_errorf(TB_ERR_INVALID_ARG, "sequence %d appears twice in one step", s);
        if (n <= 0) return tb_errorf(TB_ERR_INVALID_ARG, "sequence %d: a chunk needs at least one token", s);
        if (c->seq_len[s] + n > c->max_ctx)
            return tb_errorf(TB_ERR_RANGE, "sequence %d would reach %d tokens; the engine's context is %d", s,
                             c->seq_len[s] + n, c->max_ctx);
        for (int j = 0; j < n; j++)
            if (ch[i].tokens[j] < 0 || ch[i].tokens[j] >= c->vocab)
                return tb_errorf(TB_ERR_INVALID_ARG, "token id %d is outside the vocabulary [0, %d)",
                                 ch[i].tokens[j], c->vocab);
        total += n;
        rows += ch[i].logits == 2 ? n : ch[i].logits == 1 ? 1 : 0;
        int have = c->seq_blocks[s], want = (c->seq_len[s] + n + c->block_size - 1) / c->block_size;
        if (want > have) need_blocks += want - have;
    }
    if (total > c->max_step)
        return tb_errorf(TB_ERR_RANGE, "a step of %d tokens exceeds the engine's profile (tokens <= %d)", total,
                         c->max_step);
    int avail = tb_kv_pool_available(c->pool);
    if (need_blocks > avail)
        return tb_errorf(TB_ERR_OOM, "KV cache full: the step needs %d blocks, %d are free", need_blocks, avail);
    int t = 0, r = 0;
    for (int i = 0; i < n_chunks; i++) {
        int s = ch[i].seq, n = ch[i].n_tokens;
        int32_t *bt = c->block_tables + (size_t)s * (size_t)c->max_blocks;
        int want = (c->seq_len[s] + n + c->block_size - 1) / c->block_size;
        while (c->seq_blocks[s] < want) bt[c->seq_blocks[s]++] = tb_kv_pool_take(c->pool);
        for (int j = 0; j < n; j++, t++) {
            c->ids[t] = ch[i].tokens[j];
            c->pos[t] = c->seq_len[s] + j;
            c->seq[t] = s;
            if (ch[i].logits == 2 || (ch[i].logits == 1 && j == n - 1)) c->rows[r++] = t;
        }
    }
    if (rows == 0) c->rows[r++] = t - 1; /* the graph always yields >= 1 row */
    tb_step st = {
        .n_tokens = total, .n_rows = r, .pos = c->pos, .seq = c->seq, .rows = c->rows,
        .block_tables = c->block_tables, .max_blocks = c->max_blocks, .block_size = c->block_size,
        .max_ctx = c->max_ctx, .kv_dtype = c->kv_dtype, .tp_size = c->tp, .comm = c->comm,
    };
    const tb_graph *g = c->e->graph;
    double t0 = tb_now();
    if (c->tp > 1) { /* the other ranks start on their threads */
        tb_comm_reset(c->comm);
        pthread_mutex_lock(&c->mu);
        c->cur = st;
        c->n_done = 0;
        c->go_gen++;
        pthread_cond_broadcast(&c->go);
        pthread_mutex_unlock(&c->mu);
    }
    tb_status rs0 = run_rank(c, 0, &st);
    int primary0 = c->rk[0].primary;
    if (c->tp > 1) {
        char msg0[512];
        snprintf(msg0, sizeof msg0, "%s", rs0 != TB_OK ? tb_last_error() : "");
        pthread_mutex_lock(&c->mu);
        while (c->n_done < c->tp - 1) pthread_cond_wait(&c->done, &c->mu);
        pthread_mutex_unlock(&c->mu);
        /* the first rank that failed on its own names the error */
        if (rs0 != TB_OK && !primary0)
            for (int k = 1; k < c->tp; k++)
                if (c->rk[k].status != TB_OK && c->rk[k].primary)
                    return tb_errorf(c->rk[k].status, "tensor-parallel rank %d: %s", k, c->rk[k].msg);
        if (rs0 != TB_OK) return tb_errorf(rs0, "%s", msg0);
        for (int k = 1; k < c->tp; k++)
            if (c->rk[k].status != TB_OK)
                return tb_errorf(c->rk[k].status, "tensor-parallel rank %d: %s", k, c->rk[k].msg);
    }
    if (rs0 != TB_OK) return rs0;
    c->t_step += tb_now() - t0;
    for (int i = 0; i < n_chunks; i++) {
        if (tb_kv_pool_caching(c->pool)) publish_blocks(c, &ch[i]);
        c->seq_len[ch[i].seq] += ch[i].n_tokens;
    }
    if (logits) {
        tb_status rs = c->be->iface->read_output(c->be, c->bufs[g->output],
                                                 sizeof(float) * (size_t)(rows ? rows : 1) * (size_t)c->vocab, logits);
        if (rs != TB_OK) return rs;
    }
    if (n_rows) *n_rows = rows;
    return TB_OK;
}

/* ---------------------------------------------------------------- sampled step */

tb_status tb_context_step_sample(tb_context *c, const tb_seq_chunk *ch, int n_chunks, const tb_row_sampling *rs,
                                 tb_sample_result *out, int *n_rows) {
    if (n_rows) *n_rows = 0;
    int want = 0;
    for (int i = 0; i < n_chunks; i++) want += ch[i].logits == 2 ? ch[i].n_tokens : ch[i].logits == 1 ? 1 : 0;
    for (int r = 0; r < want; r++) {
        if (!rs || !rs[r].sampler) return tb_errorf(TB_ERR_INVALID_ARG, "sampled step: row %d has no sampler", r);
        if (rs[r].score && (*rs[r].score < 0 || *rs[r].score >= c->vocab))
            return tb_errorf(TB_ERR_INVALID_ARG, "sampled step: row %d scores token %d, outside [0, %d)", r,
                             (int)*rs[r].score, c->vocab);
        if (rs[r].top_logprobs > TB_TOP_LOGPROBS_MAX)
            return tb_errorf(TB_ERR_INVALID_ARG, "sampled step: %d alternatives asked, at most %d", rs[r].top_logprobs,
                             TB_TOP_LOGPROBS_MAX);
    }
    const tb_graph *g = c->e->graph;
    int V = c->vocab;
    if (!c->be->iface->sample) {
        const float *lg = NULL;
        int rows = 0;
        TB_TRY(tb_context_step(c, ch, n_chunks, &lg, &rows));
        for (int r = 0; r < rows; r++) {
            const float *row = lg + (size_t)r * (size_t)V;
            tb_sample_result *o = &out[r];
            if (rs[r].score) { /* taken, not drawn: the generator stays where it is */
                o->token = *rs[r].score;
                tb_sample_logprobs(row, V, o->token, rs[r].top_logprobs > 0 ? rs[r].top_logprobs : 0, o);
                continue;
            }
            memcpy(c->srow, row, sizeof(float) * (size_t)V);
            o->token = tb_sampler_sample(rs[r].sampler, c->srow, rs[r].history, rs[r].n_history);
            o->logprob = 0;
            o->n_top = 0;
            if (rs[r].top_logprobs >= 0) tb_sample_logprobs(row, V, o->token, rs[r].top_logprobs, o);
        }
        if (n_rows) *n_rows = rows;
        return TB_OK;
    }
    TB_TRY(tb_context_step(c, ch, n_chunks, NULL, NULL));
    if (want == 0) return TB_OK;
    size_t need = 0;
    for (int r = 0; r < want; r++)
        if (!rs[r].score) need += (size_t)tb_sampler_window(rs[r].sampler, rs[r].n_history);
    if (need > c->pen_cap) {
        size_t cap = need + need / 2 + 1024;
        int32_t *t = realloc(c->pen_tok, cap * sizeof(int32_t));
        if (t) c->pen_tok = t;
        int32_t *n = realloc(c->pen_cnt, cap * sizeof(int32_t));
        if (n) c->pen_cnt = n;
        if (!t || !n) return tb_errorf(TB_ERR_OOM, "out of memory (penalty windows of %zu tokens)", need);
        c->pen_cap = cap;
    }
    int n_pen = 0;
    for (int r = 0; r < want; r++) {
        tb_sample_row *sr = &c->srows[r];
        if (rs[r].score) { /* taken, not drawn: no penalties, the generator stays where it is */
            memset(sr, 0, sizeof *sr);
            sr->top_p = 1.0f;
            sr->repeat_penalty = 1.0f;
        } else {
            tb_sampler_prepare(rs[r].sampler, rs[r].history, rs[r].n_history, sr, c->pen_tok + n_pen,
                               c->pen_cnt + n_pen, (int)(c->pen_cap - (size_t)n_pen));
        }
        /* after prepare, which clears n_top */
        sr->n_top = rs[r].top_logprobs > 0 ? rs[r].top_logprobs : 0;
        sr->pen_off = n_pen;
        sr->force = rs[r].score ? *rs[r].score : -1;
        n_pen += sr->pen_n;
    }
    TB_TRY(c->be->iface->sample(c->be, c->bufs[g->output], want, V, c->srows, c->pen_tok, c->pen_cnt, n_pen, out));
    if (n_rows) *n_rows = want;
    return TB_OK;
}
