/* cpu_backend.c — the CPU backend: the vtable over kernels.h. */
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/nn.h"
#include "ir/ops.h"
#include "core/comm.h"

#include <jansson.h>
#include <sys/mman.h>

typedef struct {
    tb_pool *pool;
    float *scratch; /* attention scores, per thread */
    int max_ctx;
    tb_cpu_nn_ctx nn; /* general ops: the pool and their scratch */
} cpu_ctx;

/* What cpu_run_node implements: per op, the dtypes each input may have (a
 * bit per dtype; an op absent here is not implemented). Weights of matmul
 * and embedding are converted on the fly from f32, f16 or bf16; every
 * activation is f32; ids and positions are i32. */
#define DT(t) (1u << (t))
#define F32 DT(TB_F32)
#define WEIGHTS (DT(TB_F32) | DT(TB_F16) | DT(TB_BF16))
static const uint32_t cpu_in_dtypes[TB_OP_COUNT][TB_MAX_INPUTS] = {
    [TB_OP_EMBEDDING] = {DT(TB_I32), WEIGHTS},
    [TB_OP_RMSNORM] = {F32, F32},
    [TB_OP_ADD_RMSNORM] = {F32, F32, F32},
    [TB_OP_MATMUL] = {F32, WEIGHTS, F32},
    [TB_OP_ROPE] = {F32, DT(TB_I32), F32},
    [TB_OP_ATTENTION] = {F32, F32},
    [TB_OP_SILU_MUL] = {F32},
    [TB_OP_ADD] = {F32, F32},
    [TB_OP_GATHER_ROWS] = {F32},
    [TB_OP_CONCAT_COLS] = {F32, F32, F32, F32, F32, F32, F32, F32},
    [TB_OP_SILU] = {F32},
    [TB_OP_EMUL] = {F32, F32},
    /* x, codes, scales, then bias and/or zeros (the flags say which) */
    [TB_OP_QMATMUL] = {F32, DT(TB_I8) | DT(TB_I4) | DT(TB_FP8_E4M3), F32, F32, F32},
    [TB_OP_ALL_REDUCE] = {F32},
    [TB_OP_ALL_GATHER_COLS] = {F32},
};

static int cpu_supports_op(tb_backend *b, const tb_graph *g, const tb_node *n) {
    (void)b;
    const tb_op_def *d = tb_op_get_def(n->op);
    if (d && tb_op_is_nn(n->op)) /* general ops: a fast kernel or the reference (every dtype it takes) */
        return d->ref || tb_cpu_nn_elem_kernel(n->op) || tb_cpu_nn_shape_kernel(n->op) ||
               tb_cpu_nn_conv_kernel(n->op);
    if (!d || !cpu_in_dtypes[n->op][0] || n->n_in < d->min_in || n->n_in > d->max_in) return 0;
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] < 0 || n->in[k] >= g->n_values) return 0;
        if (!(cpu_in_dtypes[n->op][k] & DT(g->values[n->in[k]].dtype))) return 0;
    }
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] < 0 || n->out[k] >= g->n_values || g->values[n->out[k]].dtype != TB_F32) return 0;
    /* add runs over (rows, D): rank 1 or 2 */
    if (n->op == TB_OP_ADD && g->values[n->in[0]].rank > 2) return 0;
    return 1;
}
#undef F32

/* Arenas of 2 MB and more (activations, KV caches) are asked for in huge
 * pages, as the packed weights are: the GEMMs read A's rows and write C's
 * rows in place, rows 3-12 KB apart at BERT's widths, so with 4 KB pages
 * each micro-kernel call touches ~24 pages. The gain measured on BERT-base
 * was small, within the host's noise (docs/PERFORMANCE.md, 2026-12-03
 * 16:04). */
static void *cpu_alloc(tb_backend *b, size_t bytes) {
    (void)b;
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge) return tb_alloc_aligned(bytes, 64);
    size_t sz = (bytes + huge - 1) / huge * huge;
    void *p = tb_alloc_aligned(sz, huge);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, sz, MADV_HUGEPAGE); /* advice only: 4 KB pages where refused */
#endif
    return p;
}
static void cpu_free(tb_backend *b, void *p) { (void)b; tb_free_aligned(p); }

/* Weights are read in place from the mapped engine. OpenBLAS is loaded here
 * when the tuner chose it for some matmul (and only then); when it cannot
 * be, those matmuls run the own kernels (same result) after one warning. */
static tb_status cpu_load_weights(tb_backend *b, const tb_graph *g, void **bufs) {
    (void)b;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind == TB_VAL_WEIGHT) bufs[i] = (void *)g->values[i].data;
    int n_blas = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TB_OP_MATMUL &&
            ((g->nodes[i].tactic & 0xff) == TB_MM_BLAS || ((g->nodes[i].tactic >> 8) & 0xff) == TB_MM_BLAS))
            n_blas++;
    if (n_blas && !tb_cpu_blas())
        tb_log(TB_LOG_WARN, "the engine's tuner chose OpenBLAS for %d matmuls, but it cannot be loaded (%s): "
                            "they run with turbine's own kernels", n_blas, tb_cpu_blas_error());
    return TB_OK;
}

static tb_status cpu_step_begin(tb_backend *b, const tb_graph *g, void **bufs, int ids_value, const int32_t *ids,
                                tb_step *st) {
    (void)b; (void)g; (void)st;
    bufs[ids_value] = (void *)ids;
    return TB_OK;
}

static tb_status cpu_read_output(tb_backend *b, const void *src, size_t bytes, const float **out) {
    (void)b; (void)bytes;
    *out = src;
    return TB_OK;
}


/* The view of value v in this step: the run's shapes (general graphs) or
 * the graph's with `tokens` / `rows` bound. */
static void step_view(const tb_graph *g, int v, void *const *bufs, const tb_step *st, tb_view *out) {
    if (st && st->views) {
        *out = st->views[v];
    } else {
        tb_value_view(g, v, out);
        for (int d = 0; d < out->rank; d++)
            if (TB_IS_SYM(out->dims[d]))
                out->dims[d] = strcmp(g->syms[TB_SYM_INDEX(out->dims[d])].name, "rows") == 0 ? st->n_rows
                                                                                            : st->n_tokens;
    }
    out->data = bufs[v];
}

static tb_status run_nn(cpu_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, const tb_step *st) {
    tb_view in[TB_MAX_INPUTS], out[TB_MAX_OUTPUTS];
    for (int k = 0; k < n->n_in; k++) step_view(g, n->in[k], bufs, st, &in[k]);
    for (int k = 0; k < n->n_out; k++) step_view(g, n->out[k], bufs, st, &out[k]);
    c->nn.pool = c->pool;
    c->nn.graph = g;
    return tb_cpu_nn_run(&c->nn, n, in, n->n_in, out, n->n_out);
}

static tb_status cpu_run_node(tb_backend *b, const tb_graph *g, const tb_node *n, void *const *bufs,
                              const tb_step *st) {
    cpu_ctx *c = b->ctx;
    tb_pool *p = c->pool;
    if (tb_op_is_nn(n->op)) return run_nn(c, g, n, bufs, st);
    const tb_value *v0 = &g->values[n->in[0]];
    int T = (int)tb_step_rows(g, n->in[0], st);
    switch (n->op) {
    case TB_OP_EMBEDDING: {
        const tb_value *tab = &g->values[n->in[1]];
        tb_cpu_embedding_range(p, bufs[n->in[0]], bufs[n->in[1]], tab->dtype, bufs[n->out[0]], T, (int)tab->dims[1],
                               tb_node_attr_i(n, TB_EMB_VOCAB_OFFSET), (int32_t)tab->dims[0]);
        return TB_OK;
    }
    case TB_OP_ALL_REDUCE: {
        size_t cnt = (size_t)T * (size_t)v0->dims[1];
        float *y = bufs[n->out[0]];
        if (y != bufs[n->in[0]]) memcpy(y, bufs[n->in[0]], sizeof(float) * cnt);
        if (st->tp_size <= 1) return TB_OK;
        if (!st->comm) return tb_errorf(TB_ERR_INTERNAL, "all_reduce: %d ranks but no communicator", st->tp_size);
        return tb_comm_all_reduce(st->comm, st->tp_rank, y, cnt);
    }
    case TB_OP_ALL_GATHER_COLS: {
        int ranks = tb_node_attr_i(n, TB_GATHER_RANKS);
        if (ranks != (st->tp_size > 1 ? st->tp_size : 1) || (ranks > 1 && tb_comm_size(st->comm) != ranks))
            return tb_errorf(TB_ERR_INVALID_ARG, "all_gather_cols over %d ranks in a step of %d", ranks,
                             st->tp_size > 1 ? st->tp_size : 1);
        if (ranks == 1) {
            memcpy(bufs[n->out[0]], bufs[n->in[0]], sizeof(float) * (size_t)T * (size_t)v0->dims[1]);
            return TB_OK;
        }
        return tb_comm_all_gather_cols(st->comm, st->tp_rank, bufs[n->in[0]], bufs[n->out[0]], (size_t)T,
                                       (size_t)v0->dims[1]);
    }
    case TB_OP_RMSNORM:
        tb_cpu_rmsnorm(p, bufs[n->in[0]], bufs[n->in[1]], bufs[n->out[0]], T, (int)v0->dims[1],
                       tb_node_attr_f(n, TB_NORM_EPS));
        return TB_OK;
    case TB_OP_ADD_RMSNORM:
        tb_cpu_add_rmsnorm(p, bufs[n->in[0]], bufs[n->in[1]], bufs[n->in[2]], bufs[n->out[0]], bufs[n->out[1]], T,
                           (int)v0->dims[1], tb_node_attr_f(n, TB_NORM_EPS));
        return TB_OK;
    case TB_OP_MATMUL: {
        const tb_value *w = &g->values[n->in[1]];
        const float *bias = n->n_in > 2 ? bufs[n->in[2]] : NULL;
        int tactic = T >= TB_CPU_GEMM_MIN_T ? (n->tactic >> 8) & 0xff : n->tactic & 0xff;
        if (tactic && tb_cpu_matmul_tactic_available((tb_mm_tactic)tactic, w->dtype))
            tb_cpu_matmul_tactic(p, (tb_mm_tactic)tactic, bufs[n->in[0]], bufs[n->in[1]], w->dtype, bias,
                                 bufs[n->out[0]], T, (int)w->dims[1], (int)w->dims[0]);
        else
            tb_cpu_matmul(p, bufs[n->in[0]], bufs[n->in[1]], w->dtype, bias, bufs[n->out[0]], T, (int)w->dims[1],
                          (int)w->dims[0]);
        return TB_OK;
    }
    case TB_OP_QMATMUL: {
        const tb_value *c = &g->values[n->in[1]], *sc = &g->values[n->in[2]];
        int has_bias = tb_node_attr_i(n, TB_QMM_HAS_BIAS), has_zeros = tb_node_attr_i(n, TB_QMM_HAS_ZEROS);
        int K = (int)c->dims[1], N = (int)c->dims[0];
        tb_qweight w = {.dtype = c->dtype, .codes = bufs[n->in[1]], .scales = bufs[n->in[2]],
                        .zeros = has_zeros ? bufs[n->in[3 + has_bias]] : NULL, .group = K / (int)sc->dims[1]};
        /* the tuner's choice for this step's size (tactic.h: low byte small steps, next byte prefill) */
        int tactic = (int)((n->tactic >> (T >= TB_CPU_GEMM_MIN_T ? 8 : 0)) & 0xff);
        if (!tactic || !tb_cpu_qmatmul_tactic_available((tb_qmm_tactic)tactic, &w)) tactic = TB_QMM_AUTO;
        tb_cpu_qmatmul_tactic(p, (tb_qmm_tactic)tactic, bufs[n->in[0]], &w, has_bias ? bufs[n->in[3]] : NULL,
                              bufs[n->out[0]], T, K, N);
        return TB_OK;
    }
    case TB_OP_ROPE: {
        int C = (int)v0->dims[1];
        float *y = bufs[n->out[0]];
        memcpy(y, bufs[n->in[0]], sizeof(float) * (size_t)T * (size_t)C);
        tb_cpu_rope(p, y, C, bufs[n->in[1]], bufs[n->in[2]], T, tb_node_attr_i(n, TB_ROPE_HEADS),
                    tb_node_attr_i(n, TB_ROPE_HEAD_DIM), tb_node_attr_i(n, TB_ROPE_INTERLEAVED));
        return TB_OK;
    }
    case TB_OP_ATTENTION: {
        int H = tb_node_attr_i(n, TB_ATTN_HEADS), KV = tb_node_attr_i(n, TB_ATTN_KV_HEADS);
        int hd = tb_node_attr_i(n, TB_ATTN_HEAD_DIM), inter = tb_node_attr_i(n, TB_ATTN_INTERLEAVED);
        int layer = tb_node_attr_i(n, TB_ATTN_LAYER);
        float *qkv = bufs[n->in[0]]; /* consumed only here: rotated in place */
        tb_cpu_rope(p, qkv, (H + 2 * KV) * hd, st->pos, bufs[n->in[1]], T, H + KV, hd, inter);
        tb_attn_args a = {
            .T = T, .n_heads = H, .n_kv = KV, .hd = hd, .scale = tb_node_attr_f(n, TB_ATTN_SCALE),
            .pos = st->pos, .seq = st->seq, .block_tables = st->block_tables,
            .max_blocks = st->max_blocks, .block_size = st->block_size,
            .k_cache = st->k_cache[layer], .v_cache = st->v_cache[layer], .kv_dtype = st->kv_dtype,
        };
        tb_cpu_attention(p, &a, qkv, bufs[n->out[0]], c->scratch, c->max_ctx);
        return TB_OK;
    }
    case TB_OP_SILU_MUL:
        tb_cpu_silu_mul(p, bufs[n->in[0]], bufs[n->out[0]], T, (int)v0->dims[1] / 2);
        return TB_OK;
    case TB_OP_ADD:
        tb_cpu_add(p, bufs[n->in[0]], bufs[n->in[1]], bufs[n->out[0]],
                   (size_t)T * (size_t)(v0->rank > 1 ? v0->dims[1] : 1));
        return TB_OK;
    case TB_OP_CONCAT_COLS: {
        const float *xs[TB_MAX_INPUTS];
        int cols[TB_MAX_INPUTS];
        for (int i = 0; i < n->n_in; i++) {
            xs[i] = bufs[n->in[i]];
            cols[i] = (int)g->values[n->in[i]].dims[1];
        }
        tb_ref_concat_cols(xs, cols, n->n_in, bufs[n->out[0]], T);
        return TB_OK;
    }
    case TB_OP_SILU:
        tb_ref_silu(bufs[n->in[0]], bufs[n->out[0]], (size_t)T * (size_t)v0->dims[1]);
        return TB_OK;
    case TB_OP_EMUL:
        tb_ref_mul(bufs[n->in[0]], bufs[n->in[1]], bufs[n->out[0]], (size_t)T * (size_t)v0->dims[1]);
        return TB_OK;
    case TB_OP_GATHER_ROWS:
        tb_cpu_gather_rows(bufs[n->in[0]], st->rows, bufs[n->out[0]], st->n_rows, (int)v0->dims[1]);
        return TB_OK;
    default:
        return tb_errorf(TB_ERR_UNSUPPORTED, "cpu backend: op %s is not supported", tb_op_name(n->op));
    }
}

static void cpu_destroy(tb_backend *b) {
    cpu_ctx *c = b->ctx;
    if (c) {
        tb_pool_free(c->pool);
        tb_free_aligned(c->scratch);
        tb_cpu_nn_ctx_release(&c->nn);
        free(c);
    }
}

/* Every KV dtype of core/kv_layout.h. */
static tb_status cpu_check_kv_dtype(tb_backend *b, tb_dtype kv) {
    (void)b;
    if (kv == TB_F32 || kv == TB_F16 || kv == TB_BF16 || kv == TB_I8 || kv == TB_FP8_E4M3) return TB_OK;
    return tb_errorf(TB_ERR_UNSUPPORTED, "cpu: no %s KV cache", tb_dtype_name(kv));
}

static const tb_backend_i cpu_iface = {
    .name = "cpu",
    .supports_op = cpu_supports_op,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .load_weights = cpu_load_weights,
    .step_begin = cpu_step_begin,
    .run_node = cpu_run_node,
    .read_output = cpu_read_output,
    .check_kv_dtype = cpu_check_kv_dtype,
    .destroy = cpu_destroy,
};

tb_status tb_backend_cpu_create(int n_threads, int max_ctx, tb_backend **out) {
    *out = NULL;
    tb_backend *b = calloc(1, sizeof *b);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) { free(b); free(c); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    b->iface = &cpu_iface;
    b->ctx = c;
    tb_status s = tb_pool_create(n_threads, &c->pool);
    if (s != TB_OK) { free(c); free(b); return s; }
    b->n_threads = tb_pool_size(c->pool);
    c->max_ctx = max_ctx;
    c->scratch = tb_alloc_aligned(sizeof(float) * tb_attention_scratch_floats(b->n_threads, max_ctx), 64);
    if (!c->scratch) { tb_backend_free(b); return tb_errorf(TB_ERR_OOM, "out of memory for attention scratch"); }
    *out = b;
    return TB_OK;
}

tb_pool *tb_backend_cpu_pool(tb_backend *b) { return ((cpu_ctx *)b->ctx)->pool; }


/* ---------------------------------------------------------------- fingerprint */

char *tb_backend_cpu_fingerprint(void) {
    const char *backend = "cpu";
    uint32_t f = tb_cpu_features();
    char feats[256], model[128];
    /* The ISA the chosen kernels need: the widest path this machine runs. */
    uint32_t need = 0;
    if (f & TB_CPU_AVX512F) need = TB_CPU_AVX512F | TB_CPU_AVX2 | TB_CPU_FMA | TB_CPU_F16C;
    else if ((f & (TB_CPU_AVX2 | TB_CPU_FMA | TB_CPU_F16C)) == (TB_CPU_AVX2 | TB_CPU_FMA | TB_CPU_F16C))
        need = TB_CPU_AVX2 | TB_CPU_FMA | TB_CPU_F16C;
    tb_cpu_features_str(need, feats, sizeof feats);
    tb_cpu_model_name(model, sizeof model);
    json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "backend", backend, "arch", "x86_64", "isa", need ? feats : "",
                          "cpu", model);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

tb_status tb_backend_cpu_check(const char *hw_json) {
    json_error_t err;
    json_t *o = json_loads(hw_json, 0, &err);
    if (!o) return tb_errorf(TB_ERR_FORMAT, "engine hardware section is not valid JSON");
    const char *backend = json_string_value(json_object_get(o, "backend"));
    const char *isa = json_string_value(json_object_get(o, "isa"));
    const char *cpu = json_string_value(json_object_get(o, "cpu"));
    tb_status s = TB_OK;
    if (!backend || strcmp(backend, "cpu") != 0) {
        s = tb_errorf(TB_ERR_HARDWARE, "engine was built for backend '%s'; this build runs 'cpu'",
                      backend ? backend : "?");
    } else if (isa && *isa) {
        uint32_t have = tb_cpu_features();
        char have_s[256];
        tb_cpu_features_str(have, have_s, sizeof have_s);
        static const struct { const char *n; uint32_t bit; } names[] = {
            {"avx2", TB_CPU_AVX2}, {"fma", TB_CPU_FMA}, {"f16c", TB_CPU_F16C}, {"avx512f", TB_CPU_AVX512F},
            {"avx512bw", TB_CPU_AVX512BW}, {"avx512vl", TB_CPU_AVX512VL}, {"avx512bf16", TB_CPU_AVX512BF16},
            {"avx512fp16", TB_CPU_AVX512FP16}};
        char buf[256];
        snprintf(buf, sizeof buf, "%s", isa);
        for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
            int known = 0;
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
                if (strcmp(tok, names[i].n)) continue;
                known = 1;
                if (!(have & names[i].bit)) {
                    s = tb_errorf(TB_ERR_HARDWARE,
                                  "engine was built for a CPU with %s (%s: %s); this CPU lacks %s (it has: %s). "
                                  "Rebuild the engine on this machine",
                                  isa, cpu ? cpu : "?", isa, tok, have_s);
                    break;
                }
            }
            if (!known) s = tb_errorf(TB_ERR_HARDWARE, "engine needs unknown CPU feature '%s'", tok);
            if (s != TB_OK) break;
        }
    }
    json_decref(o);
    return s;
}

