/* tune.c — timing matmul tactics at build time. */
#include "tune/tune.h"

#include "backend/backend.h"
#include "backend/cpu/kernels.h"

typedef struct {
    int K, N, size_class;
    tb_dtype dt;
    int tactic;
} cache_entry;

static double run_once(tb_pool *p, int tactic, const float *x, const void *w, tb_dtype dt, float *y, int T, int K,
                       int N) {
    double t0 = tb_now();
    if (tactic) tb_cpu_matmul_tactic(p, (tb_mm_tactic)tactic, x, w, dt, NULL, y, T, K, N);
    else tb_cpu_matmul(p, x, w, dt, NULL, y, T, K, N);
    return tb_now() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The two tactics run alternately (so a burst of load on this shared
 * machine hits both) for at least TUNE_MIN_REPS pairs and TUNE_MIN_SECONDS;
 * each is scored by its median time. Small shapes take microseconds, and a
 * few samples of each were too noisy to separate them. */
#define TUNE_MIN_REPS 9
#define TUNE_MAX_REPS 201
#define TUNE_MIN_SECONDS 0.004

static int pick(tb_pool *p, const tb_value *w, int T, float *x, float *y) {
    int K = (int)w->dims[1], N = (int)w->dims[0];
    if (!tb_cpu_matmul_tactic_available(TB_MM_BLAS, w->dtype)) return TB_MM_OWN;
    double own[TUNE_MAX_REPS], blas[TUNE_MAX_REPS], total = 0;
    run_once(p, TB_MM_OWN, x, w->data, w->dtype, y, T, K, N); /* warm caches */
    run_once(p, TB_MM_BLAS, x, w->data, w->dtype, y, T, K, N);
    int n = 0;
    while (n < TUNE_MAX_REPS && (n < TUNE_MIN_REPS || total < TUNE_MIN_SECONDS)) {
        own[n] = run_once(p, TB_MM_OWN, x, w->data, w->dtype, y, T, K, N);
        blas[n] = run_once(p, TB_MM_BLAS, x, w->data, w->dtype, y, T, K, N);
        total += own[n] + blas[n];
        n++;
    }
    qsort(own, (size_t)n, sizeof(double), cmp_double);
    qsort(blas, (size_t)n, sizeof(double), cmp_double);
    /* BLAS only when clearly faster: a near tie keeps the own kernels,
     * which also serve f16/bf16 weights and need no second library. */
    return blas[n / 2] < own[n / 2] * 0.93 ? TB_MM_BLAS : TB_MM_OWN;
}

tb_status tb_tune_graph(tb_graph *g, int n_threads, int prefill_tokens, int qmm_tactics, tb_tune_report *rep) {
    memset(rep, 0, sizeof *rep);
    double t0 = tb_now();
    int64_t maxK = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TB_OP_MATMUL || g->nodes[i].op == TB_OP_QMATMUL) {
            const tb_value *w = &g->values[g->nodes[i].in[1]];
            if (w->dims[1] > maxK) maxK = w->dims[1];
            if (w->dims[0] > maxK) maxK = w->dims[0];
        }
    if (maxK == 0) return TB_OK;
    tb_pool *p = NULL;
    TB_TRY(tb_pool_create(n_threads, &p));
    size_t n = (size_t)prefill_tokens * (size_t)maxK;
    float *x = tb_alloc_aligned(n * sizeof(float), 64), *y = tb_alloc_aligned(n * sizeof(float), 64);
    cache_entry *cache = calloc((size_t)g->n_nodes * 2, sizeof *cache);
    int n_cache = 0;
    if (!x || !y || !cache) {
        tb_free_aligned(x); tb_free_aligned(y); free(cache); tb_pool_free(p);
        return tb_errorf(TB_ERR_OOM, "out of memory for tuning buffers");
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (int i = 0; i < g->n_nodes; i++) {
        tb_node *nd = &g->nodes[i];
        if (nd->op == TB_OP_QMATMUL) { /* timed on its own weights (shapes repeat, codes do not matter) */
            const tb_value *c = &g->values[nd->in[1]], *sc = &g->values[nd->in[2]];
            int has_bias = tb_node_attr_i(nd, TB_QMM_HAS_BIAS), has_zeros = tb_node_attr_i(nd, TB_QMM_HAS_ZEROS);
            int K = (int)c->dims[1], N = (int)c->dims[0], group = K / (int)sc->dims[1], found = -1;
            for (int q = 0; q < n_cache; q++)
                if (cache[q].K == K && cache[q].N == N && cache[q].dt == c->dtype && cache[q].size_class == 2 + group * 2 + has_zeros) {
                    found = cache[q].tactic;
                    break;
                }
            if (found < 0) {
                tb_qweight qw = {.dtype = c->dtype, .codes = c->data, .scales = g->values[nd->in[2]].data,
                                 .zeros = has_zeros ? g->values[nd->in[3 + has_bias]].data : NULL, .group = group};
                found = tb_tune_qmatmul(p, &qw, K, N, prefill_tokens, qmm_tactics, x, y);
                cache[n_cache++] = (cache_entry){K, N, 2 + group * 2 + has_zeros, c->dtype, found};
                rep->n_timed++;
            }
            nd->tactic = (nd->tactic & ~0xffff) | (uint32_t)found;
            rep->n_q8_small += (found & 0xff) == TB_QMM_Q8;
            rep->n_q8_large += ((found >> 8) & 0xff) == TB_QMM_Q8;
            continue;
        }
        if (nd->op != TB_OP_MATMUL) continue;
        const tb_value *w = &g->values[nd->in[1]];
        int tactic[2];
        for (int s = 0; s < 2; s++) {
            int K = (int)w->dims[1], N = (int)w->dims[0], found = -1;
            for (int c = 0; c < n_cache; c++)
                if (cache[c].K == K && cache[c].N == N && cache[c].dt == w->dtype && cache[c].size_class == s) {
                    found = cache[c].tactic;
                    break;
                }
            if (found < 0) {
                found = pick(p, w, s ? prefill_tokens : 1, x, y);
                cache[n_cache++] = (cache_entry){K, N, s, w->dtype, found};
                rep->n_timed++;
            }
            tactic[s] = found;
        }
        nd->tactic = (nd->tactic & ~0xffff) | tactic[0] | (tactic[1] << 8); /* the CPU's bytes (tactic.h) */
        rep->n_blas_small += tactic[0] == TB_MM_BLAS;
        rep->n_blas_large += tactic[1] == TB_MM_BLAS;
    }
    tb_free_aligned(x);
    tb_free_aligned(y);
    free(cache);
    tb_pool_free(p);
    rep->seconds = tb_now() - t0;
    return TB_OK;
}

int tb_tune_qmatmul(tb_pool *p, const tb_qweight *w, int K, int N, int prefill_tokens, int qmm_tactics,
                    const float *x, float *y) {
    int large_ok = prefill_tokens >= TB_CPU_GEMM_MIN_T;
    if (qmm_tactics == TB_QMM_TACTICS_Q8 && tb_cpu_qmatmul_tactic_available(TB_QMM_Q8, w))
        return TB_QMM_Q8 | (large_ok ? TB_QMM_Q8 << 8 : 0);
    /* Q8 rounds the activations, so with it an engine's logits depend on
     * which tactic won the timing (within the rounding bound of
     * tb_ref_qmatmul_q8); EXACT builds leave it out */
    int allow_q8 = qmm_tactics == TB_QMM_TACTICS_AUTO;
    int small = (int)tb_cpu_qmatmul_pick(p, w, 1, K, N, allow_q8, x, y);
    int large = large_ok ? (int)tb_cpu_qmatmul_pick(p, w, prefill_tokens, K, N, allow_q8, x, y) : 0;
    return small | large << 8;
}

tb_status tb_tune_device(tb_graph *g, const char *device, int max_ctx, tb_tune_report *rep) {
    char kind[16];
    int index;
    if (!device || !*device) return TB_OK;
    TB_TRY(tb_device_parse(device, kind, &index));
    if (!strcmp(kind, "cpu")) return TB_OK;
    tb_backend *b = NULL;
    TB_TRY(tb_backend_create(device, 0, max_ctx, &b));
    tb_status s = TB_OK;
    if (b->iface->tune) {
        void **bufs = calloc((size_t)g->n_values + 1, sizeof(void *));
        if (!bufs) s = tb_errorf(TB_ERR_OOM, "out of memory");
        if (s == TB_OK) s = b->iface->load_weights(b, g, bufs);
        if (s == TB_OK) s = b->iface->tune(b, g, bufs, &rep->n_device_timed);
        free(bufs);
    }
    tb_backend_free(b);
    return s == TB_OK ? s : tb_error_prefix(s, "timing the %s tactics", kind);
}
