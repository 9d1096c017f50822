/* metrics.c — Prometheus text exposition of the server's metrics. */
#define _GNU_SOURCE
#include "serve/metrics.h"

#include "bench/bench.h" /* tb_nvml_* */

#include <pthread.h>
#include <stdarg.h>

#define MAX_BUCKETS 20

typedef struct {
    const char *name, *help;
    int n;
    double le[MAX_BUCKETS];
    uint64_t count[MAX_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t total;
} histo;

static void histo_add(histo *h, double v) {
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

enum { H_TTFT, H_ITL, H_E2E, H_QUEUE, H_BATCH, H_STEP, H_COUNT };
#define N_STATUS 8
static const int status_codes[N_STATUS] = {400, 401, 404, 405, 413, 429, 500, 503};

/* Everything that is counted, apart from the lock that guards it, so that
 * rendering copies the values and never a mutex. */
typedef struct {
    uint64_t prompt_tokens, gen_tokens, preemptions, steps, overflows;
    uint64_t prefix_queries, prefix_hits; /* tokens */
    uint64_t finish[5];
    uint64_t errors[N_STATUS];
    uint64_t req_completions, req_chat, req_other;
    histo h[H_COUNT];
} metrics_values;

struct tb_metrics {
    pthread_mutex_t mu; /* guards v */
    metrics_values v;
};

static const double lat_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                     0.3, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80};
static const double batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

static void histo_init(histo *h, const char *name, const char *help, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->n = n;
    memcpy(h->le, le, sizeof(double) * (size_t)n);
}

tb_metrics *tb_metrics_new(void) {
    tb_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    int nl = (int)(sizeof lat_buckets / sizeof lat_buckets[0]), nb = (int)(sizeof batch_buckets / sizeof batch_buckets[0]);
    histo_init(&m->v.h[H_TTFT], "turbine_time_to_first_token_seconds", "Time from request arrival to its first token.", lat_buckets, nl);
    histo_init(&m->v.h[H_ITL], "turbine_inter_token_latency_seconds", "Time between consecutive tokens of a request.", lat_buckets, nl);
    histo_init(&m->v.h[H_E2E], "turbine_e2e_request_latency_seconds", "Time from request arrival to its end.", lat_buckets, nl);
    histo_init(&m->v.h[H_QUEUE], "turbine_request_queue_time_seconds", "Time a request waited before it was admitted.", lat_buckets, nl);
    histo_init(&m->v.h[H_BATCH], "turbine_batch_size", "Sequences per engine step.", batch_buckets, nb);
    histo_init(&m->v.h[H_STEP], "turbine_step_duration_seconds", "Duration of one engine step.", lat_buckets, nl);
    return m;
}

void tb_metrics_free(tb_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void on_step(void *arg, int n_seqs, int n_tokens, double sec) {
    tb_metrics *m = arg;
    (void)n_tokens;
    pthread_mutex_lock(&m->mu);
    m->v.steps++;
    histo_add(&m->v.h[H_BATCH], n_seqs);
    histo_add(&m->v.h[H_STEP], sec);
    pthread_mutex_unlock(&m->mu);
}
static void on_first(void *arg, double ttft, double queue) {
    tb_metrics *m = arg;
    pthread_mutex_lock(&m->mu);
    histo_add(&m->v.h[H_TTFT], ttft);
    histo_add(&m->v.h[H_QUEUE], queue);
    pthread_mutex_unlock(&m->mu);
}
static void on_token(void *arg, double itl) {
    tb_metrics *m = arg;
    pthread_mutex_lock(&m->mu);
    histo_add(&m->v.h[H_ITL], itl);
    pthread_mutex_unlock(&m->mu);
}
static void on_finish(void *arg, tb_finish_reason r, int prompt, int gen, double e2e) {
    tb_metrics *m = arg;
    pthread_mutex_lock(&m->mu);
    if ((unsigned)r < 5) m->v.finish[r]++;
    m->v.prompt_tokens += (uint64_t)prompt;
    m->v.gen_tokens += (uint64_t)gen;
    histo_add(&m->v.h[H_E2E], e2e);
    pthread_mutex_unlock(&m->mu);
}
static void on_prefix_lookup(void *arg, int queried, int hit) {
    tb_metrics *m = arg;
    pthread_mutex_lock(&m->mu);
    m->v.prefix_queries += (uint64_t)queried;
    m->v.prefix_hits += (uint64_t)hit;
    pthread_mutex_unlock(&m->mu);
}

static void on_overflow(void *arg) {
    tb_metrics *m = arg;
    pthread_mutex_lock(&m->mu);
    m->v.overflows++;
    pthread_mutex_unlock(&m->mu);
}

static void on_preempt(void *arg) {
    tb_metrics *m = arg;
    pthread_mutex_lock(&m->mu);
    m->v.preemptions++;
    pthread_mutex_unlock(&m->mu);
}

tb_sched_observer tb_metrics_observer(tb_metrics *m) {
    return (tb_sched_observer){.arg = m, .on_step = on_step, .on_first_token = on_first, .on_token = on_token,
                               .on_finish = on_finish, .on_preempt = on_preempt, .on_overflow = on_overflow,
                               .on_prefix_lookup = on_prefix_lookup};
}

void tb_metrics_http_error(tb_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < N_STATUS; i++)
        if (status_codes[i] == status) m->v.errors[i]++;
    pthread_mutex_unlock(&m->mu);
}

void tb_metrics_request(tb_metrics *m, const char *endpoint) {
    pthread_mutex_lock(&m->mu);
    if (!strcmp(endpoint, "completions")) m->v.req_completions++;
    else if (!strcmp(endpoint, "chat")) m->v.req_chat++;
    else m->v.req_other++;
    pthread_mutex_unlock(&m->mu);
}

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static void sb(sbuf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->n) { b->n += (size_t)k; return; }
        size_t cap = b->cap * 2 + (size_t)(k > 0 ? k : 256);
        char *q = realloc(b->p, cap);
        if (!q) return;
        b->p = q;
        b->cap = cap;
    }
}

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_gpus;
static void nvml_init(void) { nvml_gpus = tb_nvml_open(); }

char *tb_metrics_render(tb_metrics *m, tb_sched *s, const char *model) {
    tb_sched_stats st = {0};
    if (s) tb_sched_get_stats(s, &st);
    char label[320];
    snprintf(label, sizeof label, "model=\"%s\"", model ? model : "");
    const char *lp = label;
    return tb_metrics_render_n(m, NULL, &st, &lp, 1, model);
}

/* The per-model families (tokens, finish reasons, latency histograms) of
 * the values c under the label pairs lb (HELP / TYPE lines by the caller). */
enum { F_PROMPT, F_GEN, F_PREEMPT, F_PQUERY, F_PHIT, F_OVERFLOW, F_FINISH, F_COUNT };
static const struct {
    const char *name, *help;
} fam_info[F_COUNT] = {
    {"turbine_prompt_tokens_total", "Prompt tokens processed."},
    {"turbine_generation_tokens_total", "Tokens generated."},
    {"turbine_preemptions_total", "Sequences preempted for lack of KV-cache blocks."},
    {"turbine_prefix_cache_queries_total", "Tokens looked up in the prefix cache at admission."},
    {"turbine_prefix_cache_hits_total", "Tokens whose KV came from the prefix cache."},
    {"turbine_stream_overflows_total", "Streams cancelled because their client left --stream-buffer tokens unread."},
    {"turbine_requests_finished_total", "Finished requests by finish reason."},
};

static void put_family(sbuf *b, int f, const metrics_values *c, const char *lb) {
    const uint64_t v[F_FINISH] = {c->prompt_tokens, c->gen_tokens, c->preemptions, c->prefix_queries,
                                  c->prefix_hits, c->overflows};
    if (f < F_FINISH) {
        sb(b, "%s{%s} %llu\n", fam_info[f].name, lb, (unsigned long long)v[f]);
        return;
    }
    for (int r = TB_FINISH_STOP; r <= TB_FINISH_ERROR; r++)
        sb(b, "%s{%s,finished_reason=\"%s\"} %llu\n", fam_info[f].name, lb, tb_finish_reason_str((tb_finish_reason)r),
           (unsigned long long)c->finish[r]);
}

static void put_histo(sbuf *b, const histo *h, const char *lb) {
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        sb(b, "%s_bucket{%s,le=\"%g\"} %llu\n", h->name, lb, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[h->n];
    sb(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n%s_sum{%s} %.9g\n%s_count{%s} %llu\n", h->name, lb,
       (unsigned long long)cum, h->name, lb, h->sum, h->name, lb, (unsigned long long)h->total);
}

char *tb_metrics_render_n(tb_metrics *m, tb_metrics *const *per, const tb_sched_stats *sts,
                          const char *const *labels, int n, const char *model) {
    static const tb_sched_stats none;
    static const char *const no_label = "model=\"\"";
    if (n < 1) sts = &none, labels = &no_label, n = 1, per = NULL;
    sbuf b = {malloc(8192), 0, 8192};
    metrics_values *cs = per ? malloc(sizeof *cs * (size_t)n) : NULL;
    if (!b.p || (per && !cs)) {
        free(b.p);
        free(cs);
        return NULL;
    }
    b.p[0] = 0;
    pthread_mutex_lock(&m->mu);
    metrics_values c = m->v; /* a consistent copy */
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; per && i < n; i++) {
        pthread_mutex_lock(&per[i]->mu);
        cs[i] = per[i]->v;
        pthread_mutex_unlock(&per[i]->mu);
    }
    const char *lb = model ? model : "";
    char own[320];
    snprintf(own, sizeof own, "model=\"%s\"", lb);
    /* the model families: m's under model=..., or each model's under its labels */
    const metrics_values *src = per ? cs : &c;
    const char *const *lab = per ? labels : (const char *const[]){own};
    int ns = per ? n : 1;
    /* the scheduler's gauges: one series per language model */
    sb(&b, "# HELP turbine_requests_running Requests in the running batch.\n# TYPE turbine_requests_running gauge\n");
    for (int i = 0; i < n; i++) sb(&b, "turbine_requests_running{%s} %d\n", labels[i], sts[i].running);
    sb(&b, "# HELP turbine_requests_waiting Requests waiting to be admitted.\n# TYPE turbine_requests_waiting gauge\n");
    for (int i = 0; i < n; i++) sb(&b, "turbine_requests_waiting{%s} %d\n", labels[i], sts[i].waiting);
    sb(&b, "# HELP turbine_kv_cache_usage_ratio Fraction of KV-cache blocks in use.\n"
           "# TYPE turbine_kv_cache_usage_ratio gauge\n");
    for (int i = 0; i < n; i++) sb(&b, "turbine_kv_cache_usage_ratio{%s} %.6f\n", labels[i], sts[i].kv_usage);
    int any_kv = 0;
    for (int i = 0; i < n; i++) any_kv |= sts[i].kv_dtype != NULL;
    if (any_kv) {
        sb(&b, "# HELP turbine_kv_cache_capacity_tokens Tokens the KV cache holds in all (blocks x block size), by "
               "KV dtype.\n# TYPE turbine_kv_cache_capacity_tokens gauge\n");
        for (int i = 0; i < n; i++)
            if (sts[i].kv_dtype)
                sb(&b, "turbine_kv_cache_capacity_tokens{%s,kv_dtype=\"%s\"} %ld\n", labels[i],
                   sts[i].kv_dtype, sts[i].kv_capacity_tokens);
        sb(&b, "# HELP turbine_kv_cache_bytes_per_token KV-cache bytes per token (all layers, keys and values, "
               "int8/fp8 scales included).\n# TYPE turbine_kv_cache_bytes_per_token gauge\n");
        for (int i = 0; i < n; i++)
            if (sts[i].kv_dtype)
                sb(&b, "turbine_kv_cache_bytes_per_token{%s,kv_dtype=\"%s\"} %.1f\n", labels[i],
                   sts[i].kv_dtype, sts[i].kv_bytes_per_token);
    }
    sb(&b, "# HELP turbine_batch_size_current Sequences in the last engine step.\n"
           "# TYPE turbine_batch_size_current gauge\n");
    for (int i = 0; i < n; i++) sb(&b, "turbine_batch_size_current{%s} %d\n", labels[i], sts[i].batch_size);
    /* GPUs of this machine, through NVML when the driver has it (nothing on
     * a machine without NVIDIA GPUs) */
    pthread_once(&nvml_once, nvml_init);
    double gu, gm, gp;
    if (nvml_gpus > 0 && tb_nvml_sample(&gu, &gm, &gp) > 0) {
        if (gu == gu)
            sb(&b, "# HELP turbine_gpu_utilization_ratio GPU busy time fraction (NVML, mean over the machine's GPUs).\n"
                   "# TYPE turbine_gpu_utilization_ratio gauge\nturbine_gpu_utilization_ratio{%s} %.4f\n",
                   lb, gu / 100.0);
        if (gm == gm)
            sb(&b, "# HELP turbine_gpu_memory_used_bytes GPU memory in use (NVML, all the machine's GPUs).\n"
                   "# TYPE turbine_gpu_memory_used_bytes gauge\nturbine_gpu_memory_used_bytes{%s} %.0f\n",
                   lb, gm * 1073741824.0);
        if (gp == gp)
            sb(&b, "# HELP turbine_gpu_power_watts GPU power draw (NVML, all the machine's GPUs).\n"
                   "# TYPE turbine_gpu_power_watts gauge\nturbine_gpu_power_watts{%s} %.1f\n", lb, gp);
    }
    for (int f = 0; f < F_COUNT; f++) {
        sb(&b, "# HELP %s %s\n# TYPE %s counter\n", fam_info[f].name, fam_info[f].help, fam_info[f].name);
        for (int i = 0; i < ns; i++) put_family(&b, f, &src[i], lab[i]);
    }
    /* the HTTP counters: the server's and, in a repository, its LLMs' */
    uint64_t errs[N_STATUS], rq_comp = c.req_completions, rq_chat = c.req_chat;
    memcpy(errs, c.errors, sizeof errs);
    for (int i = 0; per && i < n; i++) {
        for (int k = 0; k < N_STATUS; k++) errs[k] += cs[i].errors[k];
        rq_comp += cs[i].req_completions;
        rq_chat += cs[i].req_chat;
    }
    sb(&b, "# HELP turbine_http_errors_total HTTP error responses by status.\n# TYPE turbine_http_errors_total counter\n");
    for (int i = 0; i < N_STATUS; i++)
        sb(&b, "turbine_http_errors_total{status=\"%d\"} %llu\n", status_codes[i], (unsigned long long)errs[i]);
    sb(&b, "# HELP turbine_http_requests_total Generation requests by endpoint.\n# TYPE turbine_http_requests_total counter\n"
           "turbine_http_requests_total{endpoint=\"completions\"} %llu\nturbine_http_requests_total{endpoint=\"chat\"} %llu\n",
       (unsigned long long)rq_comp, (unsigned long long)rq_chat);
    for (int k = 0; k < H_COUNT; k++) {
        const histo *h = &c.h[k];
        sb(&b, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
        for (int i = 0; i < ns; i++) put_histo(&b, &src[i].h[k], lab[i]);
    }
    free(cs);
    return b.p;
}
