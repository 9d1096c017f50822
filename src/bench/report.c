/*
 * report.c — what a run leaves behind: a summary table on the terminal, a
 * JSON document with every figure, a CSV with one row per sweep point, and
 * one self-contained HTML page (inline SVG charts, a few lines of inline
 * script, no external URL). A figure nothing was measured for (no request
 * succeeded, or no stream) is "-" on the terminal, null in JSON, empty in
 * CSV and "–" in HTML, never a 0 that reads like a latency. Each error kind
 * comes with its first message (for HTTP errors, the server's).
 */
#include <jansson.h>
#include <math.h>

#include "bench/bench.h"

#define MS(ns) ((ns) / 1e6)

static const double k_quant[] = {0.5, 0.9, 0.95, 0.99, 0.999};
static const char *const k_qname[] = {"p50", "p90", "p95", "p99", "p99.9"};
#define N_QUANT 5

typedef struct { const char *name; const tb_hist *(*get)(const tb_bench_result *); } metric;
static const tb_hist *get_ttft(const tb_bench_result *p) { return &p->ttft; }
static const tb_hist *get_tpot(const tb_bench_result *p) { return &p->tpot; }
static const tb_hist *get_itl(const tb_bench_result *p) { return &p->itl; }
static const tb_hist *get_e2e(const tb_bench_result *p) { return &p->e2e; }
static const metric k_metrics[] = {
    {"ttft", get_ttft}, {"tpot", get_tpot}, {"itl", get_itl}, {"e2e", get_e2e}};
#define N_METRICS 4

static const char *point_name(const tb_bench_result *p, char *buf, size_t cap) {
    if (p->label[0]) snprintf(buf, cap, "%s", p->label);
    else if (p->rate > 0) snprintf(buf, cap, "rate=%g", p->rate);
    else snprintf(buf, cap, "c=%d", p->concurrency);
    return buf;
}

/* ---------------------------------------------------------------- summary */

/* One latency column of the summary: width w, "-" when nothing measured. */
static void ms_col(FILE *f, int w, int prec, const tb_hist *h, double v) {
    if (h->count) fprintf(f, " %*.*f", w, prec, MS(v));
    else fprintf(f, " %*s", w, "-");
}

static long status_count(const tb_bench_result *p, int code) {
    for (int i = 0; i < p->n_status; i++)
        if (p->status_code[i] == code) return p->status_count[i];
    return 0;
}

/* The server's own view of a kserve point (from its /metrics). */
static void server_summary(FILE *f, const tb_bench_result *p) {
    const tb_ks_metrics *m = p->server;
    if (!m) return;
    if (!m->seen) {
        fprintf(f, "%12s server: /metrics has no turbine_inference_* series for this model (skipped)\n", "");
        return;
    }
    if (!m->valid) {
        fprintf(f, "%12s server: its counters went backwards during the point (a restart?): skipped\n", "");
        return;
    }
    fprintf(f, "%12s server: %.0f ok, %.0f failed, %.0f inferences in %.0f executions", "", m->success, m->failure,
            m->inferences, m->executions);
    if (m->batch.count > 0) fprintf(f, "; batch size mean %.2f", tb_prom_mean(&m->batch));
    fprintf(f, "\n");
    if (m->batch.count > 0) {
        fprintf(f, "%12s batch sizes:", "");
        for (int i = 0; i < m->batch.n; i++) {
            double c = m->batch.cum[i] - (i ? m->batch.cum[i - 1] : 0);
            if (c <= 0) continue;
            if (isinf(m->batch.le[i])) fprintf(f, " >%g: %.0f", i ? m->batch.le[i - 1] : 0, c);
            else fprintf(f, " <=%g: %.0f", m->batch.le[i], c);
        }
        fprintf(f, "\n");
    }
    if (m->queue_us.count > 0)
        fprintf(f, "%12s queue ms mean/p50/p99: %.3f / %.3f / %.3f; compute ms mean/p50/p99: %.3f / %.3f / %.3f\n", "",
                tb_prom_mean(&m->queue_us) / 1e3, tb_prom_quantile(&m->queue_us, 0.5) / 1e3,
                tb_prom_quantile(&m->queue_us, 0.99) / 1e3, tb_prom_mean(&m->compute_us) / 1e3,
                tb_prom_quantile(&m->compute_us, 0.5) / 1e3, tb_prom_quantile(&m->compute_us, 0.99) / 1e3);
}

/* ---------------------------------------------------------------- sessions, replicas */

static double hit_rate(double hits, double queries) {
    return isfinite(hits) && isfinite(queries) && queries > 0 ? hits / queries : NAN;
}

/* Sums over the replicas read both times; *n: how many. */
static tb_bench_replica replica_total(const tb_bench_result *p, int *n) {
    tb_bench_replica t;
    memset(&t, 0, sizeof t);
    snprintf(t.url, sizeof t.url, "all");
    int k = 0, hq = 0;
    for (int i = 0; i < p->n_replicas; i++) {
        const tb_bench_replica *x = &p->replicas[i];
        if (!x->scraped) continue;
        k++;
        t.requests += x->requests;
        if (isfinite(x->prompt_tokens)) t.prompt_tokens += x->prompt_tokens;
        if (isfinite(x->prefix_hits) && isfinite(x->prefix_queries)) {
            t.prefix_hits += x->prefix_hits;
            t.prefix_queries += x->prefix_queries;
            hq++;
        }
    }
    if (!hq) t.prefix_hits = t.prefix_queries = NAN;
    t.scraped = k > 0;
    *n = k;
    return t;
}

static double share_of(const tb_bench_replica *x, const tb_bench_replica *all) {
    return x->scraped && all->requests > 0 ? x->requests / all->requests : NAN;
}

static void pct(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%5.1f%%", 100 * v);
    else fprintf(f, "%6s", "-");
}

static void sessions_summary(FILE *f, const tb_bench_result *p) {
    if (!p->n_turns) return;
    fprintf(f, "%12s sessions: %d conversations x %d turns, %d-word system prompt", "", p->n_sessions, p->n_turns,
            p->system_len);
    if (p->sessions_cut) fprintf(f, "; %d cut short by a failed turn", p->sessions_cut);
    fprintf(f, "\n%12s %-5s %6s %6s %12s %12s %12s\n", "", "turn", "ok", "err", "TTFT p50 ms", "E2E p50 ms",
            "prompt tok");
    for (int t = 0; t < p->n_turns; t++) {
        const tb_bench_turn *x = &p->turns[t];
        fprintf(f, "%12s %-5d %6ld %6ld", "", t + 1, x->n_ok, x->n_err);
        if (x->ttft.count) fprintf(f, " %12.2f", tb_hist_quantile(&x->ttft, 0.5) / 1e6);
        else fprintf(f, " %12s", "-");
        if (x->e2e.count) fprintf(f, " %12.2f", tb_hist_quantile(&x->e2e, 0.5) / 1e6);
        else fprintf(f, " %12s", "-");
        if (x->n_ok) fprintf(f, " %12.1f\n", (double)x->in_tokens / (double)x->n_ok);
        else fprintf(f, " %12s\n", "-");
    }
}

static void replicas_summary(FILE *f, const tb_bench_result *p) {
    if (!p->n_replicas) return;
    int n;
    tb_bench_replica all = replica_total(p, &n);
    fprintf(f, "%12s replicas (their /metrics before and after the point):\n", "");
    fprintf(f, "%12s %-40s %9s %7s %10s %12s\n", "", "replica", "requests", "share", "prefix hit", "prompt tok");
    for (int i = 0; i <= p->n_replicas; i++) {
        const tb_bench_replica *x = i < p->n_replicas ? &p->replicas[i] : &all;
        if (i == p->n_replicas && n == 0) break;
        fprintf(f, "%12s %-40.40s", "", i < p->n_replicas ? x->url : "all");
        if (!x->scraped) { fprintf(f, " not read: %s\n", x->error); continue; }
        fprintf(f, " %9.0f ", x->requests);
        pct(f, i < p->n_replicas ? share_of(x, &all) : (n ? 1.0 : NAN));
        fprintf(f, "     ");
        pct(f, hit_rate(x->prefix_hits, x->prefix_queries));
        if (isfinite(x->prompt_tokens)) fprintf(f, " %12.0f\n", x->prompt_tokens);
        else fprintf(f, " %12s\n", "-");
    }
}

void tb_report_summary(FILE *f, const tb_bench_report *r) {
    fprintf(f, "\nturbine bench: %s (%s%s%s)\n", r->target, r->endpoint,
            r->model && *r->model ? ", model " : "", r->model ? r->model : "");
    fprintf(f, "%-12s %7s %6s %9s %9s %9s | %-23s | %-23s | %-17s | %-17s\n", "point", "ok", "err",
            "req/s", "out tok/s", "goodput", "TTFT ms mean/p50/p99", "E2E ms mean/p50/p99",
            "TPOT ms mean/p99", "ITL ms mean/p99");
    for (int i = 0; i < r->n_points; i++) {
        const tb_bench_result *p = &r->points[i];
        char nm[64];
        fprintf(f, "%-12s %7ld %6ld %9.2f %9.1f %9.2f |", point_name(p, nm, sizeof nm), p->n_ok, p->n_err,
                p->qps, p->out_tps, p->goodput);
        ms_col(f, 7, 1, &p->ttft, tb_hist_mean(&p->ttft));
        ms_col(f, 7, 1, &p->ttft, tb_hist_quantile(&p->ttft, 0.5));
        ms_col(f, 7, 1, &p->ttft, tb_hist_quantile(&p->ttft, 0.99));
        fprintf(f, " |");
        ms_col(f, 7, 1, &p->e2e, tb_hist_mean(&p->e2e));
        ms_col(f, 7, 1, &p->e2e, tb_hist_quantile(&p->e2e, 0.5));
        ms_col(f, 7, 1, &p->e2e, tb_hist_quantile(&p->e2e, 0.99));
        fprintf(f, " |");
        ms_col(f, 8, 2, &p->tpot, tb_hist_mean(&p->tpot));
        ms_col(f, 8, 2, &p->tpot, tb_hist_quantile(&p->tpot, 0.99));
        fprintf(f, " |");
        ms_col(f, 8, 2, &p->itl, tb_hist_mean(&p->itl));
        ms_col(f, 8, 2, &p->itl, tb_hist_quantile(&p->itl, 0.99));
        fprintf(f, "\n");
        if (isfinite(p->prefix_hit_rate))
            fprintf(f, "%12s server prefix cache: %.1f%% of the prompt tokens looked up were reused\n", "",
                    100 * p->prefix_hit_rate);
        server_summary(f, p);
        sessions_summary(f, p);
        replicas_summary(f, p);
        if (status_count(p, 429))
            fprintf(f, "%12s rejected (HTTP 429, the server's queue full): %ld\n", "", status_count(p, 429));
        if (p->n_err) {
            fprintf(f, "%12s errors:", "");
            for (int k = 0; k < TB_BERR_COUNT; k++)
                if (p->err[k]) fprintf(f, " %s %ld", tb_bench_error_name(k), p->err[k]);
            fprintf(f, "\n");
            for (int k = 0; k < TB_BERR_COUNT; k++)
                if (p->err[k]) fprintf(f, "%14s%-8s first: %s\n", "", tb_bench_error_name(k), p->first_msg[k]);
        }
    }
}

/* ---------------------------------------------------------------- JSON */

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* A histogram's figures in ms; null when it holds nothing. */
static json_t *hist_json(const tb_hist *h) {
    json_t *o = json_object();
    double none = h->count ? 0 : NAN;
    json_object_set_new(o, "count", json_integer((json_int_t)h->count));
    json_object_set_new(o, "mean_ms", num(none + MS(tb_hist_mean(h))));
    json_object_set_new(o, "stddev_ms", num(none + MS(tb_hist_stddev(h))));
    json_object_set_new(o, "min_ms", num(none + MS((double)h->min)));
    json_object_set_new(o, "max_ms", num(none + MS((double)h->max)));
    for (int q = 0; q < N_QUANT; q++) {
        char k[32];
        snprintf(k, sizeof k, "%s_ms", k_qname[q]);
        json_object_set_new(o, k, num(none + MS(tb_hist_quantile(h, k_quant[q]))));
    }
    return o;
}

static json_t *prom_json(const tb_prom_hist *h, double scale) {
    json_t *o = json_object(), *b = json_array();
    json_object_set_new(o, "count", num(h->count));
    json_object_set_new(o, "sum", num(h->sum * scale));
    json_object_set_new(o, "mean", num(tb_prom_mean(h) * scale));
    json_object_set_new(o, "p50", num(tb_prom_quantile(h, 0.5) * scale));
    json_object_set_new(o, "p99", num(tb_prom_quantile(h, 0.99) * scale));
    for (int i = 0; i < h->n; i++) { /* per bucket, not cumulative */
        json_t *x = json_object();
        json_object_set_new(x, "le", isinf(h->le[i]) ? json_string("+Inf") : json_real(h->le[i] * scale));
        json_object_set_new(x, "count", num(h->cum[i] - (i ? h->cum[i - 1] : 0)));
        json_array_append_new(b, x);
    }
    json_object_set_new(o, "buckets", b);
    return o;
}

/* The server's per-model figures over the point; null figures when its
 * /metrics has none. Times in ms. */
static json_t *server_json(const tb_ks_metrics *m) {
    json_t *o = json_object();
    json_object_set_new(o, "found", json_boolean(m->seen));
    json_object_set_new(o, "valid", json_boolean(m->valid));
    if (!m->seen || !m->valid) return o;
    json_object_set_new(o, "request_success", num(m->success));
    json_object_set_new(o, "request_failure", num(m->failure));
    json_object_set_new(o, "inference_count", num(m->inferences));
    json_object_set_new(o, "execution_count", num(m->executions));
    json_object_set_new(o, "batch_size", prom_json(&m->batch, 1));
    json_object_set_new(o, "queue_ms", prom_json(&m->queue_us, 1e-3));
    json_object_set_new(o, "compute_ms", prom_json(&m->compute_us, 1e-3));
    return o;
}

static json_t *replica_json(const tb_bench_replica *x, double share) {
    json_t *o = json_object();
    json_object_set_new(o, "url", json_string(x->url));
    json_object_set_new(o, "scraped", json_boolean(x->scraped));
    if (!x->scraped) {
        json_object_set_new(o, "error", json_string(x->error));
        return o;
    }
    json_object_set_new(o, "requests", num(x->requests));
    json_object_set_new(o, "share", num(share));
    json_object_set_new(o, "prompt_tokens", num(x->prompt_tokens));
    json_object_set_new(o, "prefix_cache_hits", num(x->prefix_hits));
    json_object_set_new(o, "prefix_cache_queries", num(x->prefix_queries));
    json_object_set_new(o, "prefix_cache_hit_rate", num(hit_rate(x->prefix_hits, x->prefix_queries)));
    return o;
}

static void sessions_replicas_json(json_t *o, const tb_bench_result *p) {
    if (p->n_turns) {
        json_t *s = json_object(), *bt = json_array();
        json_object_set_new(s, "conversations", json_integer(p->n_sessions));
        json_object_set_new(s, "turns", json_integer(p->n_turns));
        json_object_set_new(s, "system_prompt_len", json_integer(p->system_len));
        json_object_set_new(s, "cut_short", json_integer(p->sessions_cut));
        for (int t = 0; t < p->n_turns; t++) {
            const tb_bench_turn *x = &p->turns[t];
            json_t *j = json_object();
            json_object_set_new(j, "turn", json_integer(t + 1));
            json_object_set_new(j, "requests_ok", json_integer(x->n_ok));
            json_object_set_new(j, "requests_failed", json_integer(x->n_err));
            json_object_set_new(j, "prompt_tokens_mean", num(x->n_ok ? (double)x->in_tokens / (double)x->n_ok : NAN));
            json_object_set_new(j, "ttft_p50_ms", num(x->ttft.count ? tb_hist_quantile(&x->ttft, 0.5) / 1e6 : NAN));
            json_object_set_new(j, "ttft_p99_ms", num(x->ttft.count ? tb_hist_quantile(&x->ttft, 0.99) / 1e6 : NAN));
            json_object_set_new(j, "e2e_p50_ms", num(x->e2e.count ? tb_hist_quantile(&x->e2e, 0.5) / 1e6 : NAN));
            json_array_append_new(bt, j);
        }
        json_object_set_new(s, "by_turn", bt);
        json_object_set_new(o, "sessions", s);
    }
    if (p->n_replicas) {
        int n;
        tb_bench_replica all = replica_total(p, &n);
        json_t *a = json_array();
        for (int i = 0; i < p->n_replicas; i++)
            json_array_append_new(a, replica_json(&p->replicas[i], share_of(&p->replicas[i], &all)));
        json_object_set_new(o, "replicas", a);
        json_object_set_new(o, "replicas_total", n ? replica_json(&all, 1.0) : json_null());
    }
}

static json_t *point_json(const tb_bench_result *p) {
    json_t *o = json_object();
    char nm[64];
    json_object_set_new(o, "label", json_string(point_name(p, nm, sizeof nm)));
    json_object_set_new(o, "concurrency", json_integer(p->concurrency));
    json_object_set_new(o, "rate", num(p->rate));
    json_object_set_new(o, "duration_s", num(p->duration));
    json_object_set_new(o, "requests_sent", json_integer(p->n_sent));
    json_object_set_new(o, "requests_ok", json_integer(p->n_ok));
    json_object_set_new(o, "requests_failed", json_integer(p->n_err));
    json_object_set_new(o, "input_tokens", json_integer(p->in_tokens));
    json_object_set_new(o, "output_tokens", json_integer(p->out_tokens));
    json_object_set_new(o, "request_throughput", num(p->qps));
    json_object_set_new(o, "output_token_throughput", num(p->out_tps));
    json_object_set_new(o, "total_token_throughput", num(p->total_tps));
    json_object_set_new(o, "good_requests", json_integer(p->n_good));
    json_object_set_new(o, "goodput", num(p->goodput));
    json_object_set_new(o, "server_prefix_cache_hit_rate", num(p->prefix_hit_rate));
    json_t *e = json_object();
    for (int k = 0; k < TB_BERR_COUNT; k++) json_object_set_new(e, tb_bench_error_name(k), json_integer(p->err[k]));
    json_object_set_new(o, "errors", e);
    if (p->first_error[0]) json_object_set_new(o, "first_error", json_string(p->first_error));
    json_t *fe = json_object();
    for (int k = 0; k < TB_BERR_COUNT; k++)
        if (p->err[k]) json_object_set_new(fe, tb_bench_error_name(k), json_string(p->first_msg[k]));
    json_object_set_new(o, "first_error_by_kind", fe);
    json_t *sc = json_object();
    for (int i = 0; i < p->n_status; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", p->status_code[i]);
        json_object_set_new(sc, k, json_integer(p->status_count[i]));
    }
    json_object_set_new(o, "http_status", sc);
    json_object_set_new(o, "rejected", json_integer(status_count(p, 429)));
    if (p->server) json_object_set_new(o, "server", server_json(p->server));
    sessions_replicas_json(o, p);
    for (int m = 0; m < N_METRICS; m++) json_object_set_new(o, k_metrics[m].name, hist_json(k_metrics[m].get(p)));
    json_t *ts = json_array();
    for (int i = 0; i < p->n_samples; i++) {
        const tb_bench_sample *s = &p->samples[i];
        json_t *x = json_object();
        json_object_set_new(x, "t", num(s->t));
        json_object_set_new(x, "requests_per_s", num(s->done_rate));
        json_object_set_new(x, "output_tokens_per_s", num(s->tok_rate));
        json_object_set_new(x, "in_flight", json_integer(s->inflight));
        json_object_set_new(x, "server_running", num(s->srv_running));
        json_object_set_new(x, "server_waiting", num(s->srv_waiting));
        json_object_set_new(x, "server_kv_cache", num(s->srv_kv));
        json_object_set_new(x, "gpu_util_pct", num(s->gpu_util));
        json_object_set_new(x, "gpu_mem_gib", num(s->gpu_mem_gib));
        json_object_set_new(x, "gpu_power_w", num(s->gpu_power_w));
        json_array_append_new(ts, x);
    }
    json_object_set_new(o, "timeline", ts);
    return o;
}

tb_status tb_report_json(const char *path, const tb_bench_report *r) {
    json_t *o = json_object();
    const tb_bench_config *c = r->config;
    const tb_workload_options *w = r->workload;
    json_object_set_new(o, "tool", json_string("turbine bench"));
    json_object_set_new(o, "command_line", json_string(r->command_line ? r->command_line : ""));
    json_object_set_new(o, "started_at", json_string(r->started_at ? r->started_at : ""));
    json_object_set_new(o, "target", json_string(r->target));
    json_object_set_new(o, "endpoint", json_string(r->endpoint));
    json_object_set_new(o, "model", r->model ? json_string(r->model) : json_null());
    json_error_t err;
    json_t *models = r->models_json ? json_loads(r->models_json, 0, &err) : NULL;
    json_object_set_new(o, "models", models ? models : json_null());
    json_t *cfg = json_object();
    json_object_set_new(cfg, "load", json_string(c->rate > 0 ? "open" : "closed"));
    json_object_set_new(cfg, "arrivals", json_string(c->poisson ? "poisson" : "constant"));
    json_object_set_new(cfg, "requests", json_integer(c->requests));
    json_object_set_new(cfg, "duration_s", num(c->duration));
    json_object_set_new(cfg, "warmup", json_integer(c->warmup));
    json_object_set_new(cfg, "timeout_s", num(c->timeout));
    json_object_set_new(cfg, "stream", json_boolean(c->stream));
    json_object_set_new(cfg, "http_client", json_string(tb_http_client_name(tb_bench_client_for(c))));
    if (r->n_points && r->points[0].n_turns) {
        json_object_set_new(cfg, "sessions", json_integer(r->points[0].n_sessions));
        json_object_set_new(cfg, "turns", json_integer(r->points[0].n_turns));
        json_object_set_new(cfg, "system_prompt_len", json_integer(r->points[0].system_len));
        json_object_set_new(cfg, "session_header", json_string(c->session_header ? c->session_header : "X-Session-ID"));
    }
    if (c->n_replicas) {
        json_t *ru = json_array();
        for (int i = 0; i < c->n_replicas; i++) json_array_append_new(ru, json_string(c->replica_urls[i]));
        json_object_set_new(cfg, "replica_metrics", ru);
    }
    if (w) {
        json_object_set_new(cfg, "input_len", json_integer(w->input_len));
        json_object_set_new(cfg, "input_len_stddev", num(w->input_stddev));
        json_object_set_new(cfg, "prefix_len", json_integer(w->prefix_len));
        json_object_set_new(cfg, "output_len", json_integer(w->output_len));
        json_object_set_new(cfg, "output_len_stddev", num(w->output_stddev));
        json_object_set_new(cfg, "prompt_file", json_string(w->jsonl_path ? w->jsonl_path : w->sharegpt_path ? w->sharegpt_path : ""));
    }
    json_t *slo = json_object();
    if (c->slo_ttft > 0) json_object_set_new(slo, "ttft_ms", num(c->slo_ttft * 1e3));
    if (c->slo_tpot > 0) json_object_set_new(slo, "tpot_ms", num(c->slo_tpot * 1e3));
    if (c->slo_e2e > 0) json_object_set_new(slo, "e2e_ms", num(c->slo_e2e * 1e3));
    json_object_set_new(cfg, "slo", slo);
    json_object_set_new(o, "config", cfg);
    json_t *pts = json_array();
    for (int i = 0; i < r->n_points; i++) json_array_append_new(pts, point_json(&r->points[i]));
    json_object_set_new(o, "points", pts);
    int rc = json_dump_file(o, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (rc) return tb_errorf(TB_ERR_IO, "cannot write %s", path);
    return TB_OK;
}

/* ---------------------------------------------------------------- CSV */

/* A CSV field in double quotes (RFC 4180: quotes doubled). */
static void csv_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

tb_status tb_report_csv(const char *path, const tb_bench_report *r) {
    FILE *f = fopen(path, "w");
    if (!f) return tb_errorf(TB_ERR_IO, "cannot write %s", path);
    fprintf(f, "label,concurrency,rate,duration_s,requests_ok,requests_failed,err_connect,err_timeout,"
               "err_http,err_stream,err_other,input_tokens,output_tokens,request_throughput,"
               "output_token_throughput,total_token_throughput,goodput,server_prefix_cache_hit_rate");
    for (int k = 0; k < TB_BERR_COUNT; k++) fprintf(f, ",first_error_%s", tb_bench_error_name(k));
    for (int m = 0; m < N_METRICS; m++) {
        fprintf(f, ",%s_mean_ms,%s_stddev_ms,%s_min_ms,%s_max_ms", k_metrics[m].name, k_metrics[m].name,
                k_metrics[m].name, k_metrics[m].name);
        for (int q = 0; q < N_QUANT; q++) fprintf(f, ",%s_%s_ms", k_metrics[m].name, k_qname[q]);
    }
    fprintf(f, "\n");
    for (int i = 0; i < r->n_points; i++) {
        const tb_bench_result *p = &r->points[i];
        char nm[64];
        fprintf(f, "%s,%d,%g,%.6f,%ld,%ld", point_name(p, nm, sizeof nm), p->concurrency, p->rate,
                p->duration, p->n_ok, p->n_err);
        for (int k = 0; k < TB_BERR_COUNT; k++) fprintf(f, ",%ld", p->err[k]);
        fprintf(f, ",%ld,%ld,%.4f,%.3f,%.3f,%.4f,", p->in_tokens, p->out_tokens, p->qps, p->out_tps,
                p->total_tps, p->goodput);
        if (isfinite(p->prefix_hit_rate)) fprintf(f, "%.4f", p->prefix_hit_rate); /* empty: not reported */
        for (int k = 0; k < TB_BERR_COUNT; k++) {
            fputc(',', f);
            if (p->err[k]) csv_string(f, p->first_msg[k]);
        }
        for (int m = 0; m < N_METRICS; m++) {
            const tb_hist *h = k_metrics[m].get(p);
            if (!h->count) { /* empty: nothing measured */
                fprintf(f, ",,,,");
                for (int q = 0; q < N_QUANT; q++) fputc(',', f);
                continue;
            }
            fprintf(f, ",%.4f,%.4f,%.4f,%.4f", MS(tb_hist_mean(h)), MS(tb_hist_stddev(h)),
                    MS((double)h->min), MS((double)h->max));
            for (int q = 0; q < N_QUANT; q++) fprintf(f, ",%.4f", MS(tb_hist_quantile(h, k_quant[q])));
        }
        fprintf(f, "\n");
    }
    int bad = ferror(f);
    if (fclose(f) || bad) return tb_errorf(TB_ERR_IO, "cannot write %s", path);
    return TB_OK;
}

/* ---------------------------------------------------------------- HTML */

static const char *const k_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                       "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

typedef struct {
    const char *name;
    int n;
    const double *x, *y;
} series;

static void html_escape(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static double nice_step(double range) {
    if (!(range > 0)) return 1;
    double raw = range / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

/* One line chart; `markers`: draw points as circles too. */
static void svg_chart(FILE *f, const char *title, const char *xl, const char *yl,
                      const series *s, int ns, int markers) {
    const double W = 640, H = 320, L = 64, R = 16, T = 30, B = 44;
    double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = -INFINITY;
    int any = 0;
    for (int i = 0; i < ns; i++)
        for (int k = 0; k < s[i].n; k++) {
            if (!isfinite(s[i].x[k]) || !isfinite(s[i].y[k])) continue;
            any = 1;
            x0 = fmin(x0, s[i].x[k]);
            x1 = fmax(x1, s[i].x[k]);
            y1 = fmax(y1, s[i].y[k]);
            y0 = fmin(y0, s[i].y[k]);
        }
    fprintf(f, "<figure class=\"chart\"><svg viewBox=\"0 0 %g %g\" width=\"%g\" height=\"%g\" "
               "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">\n", W, H, W, H);
    fprintf(f, "<text x=\"%g\" y=\"18\" class=\"title\">", W / 2);
    html_escape(f, title);
    fprintf(f, "</text>\n");
    if (!any) {
        fprintf(f, "<text x=\"%g\" y=\"%g\" class=\"empty\">no data</text></svg></figure>\n", W / 2, H / 2);
        return;
    }
    if (x1 <= x0) { x1 = x0 + 1; x0 = x0 - 1 < 0 && x0 >= 0 ? 0 : x0 - 1; }
    if (y1 <= y0) y1 = y0 + 1;
    double ys = nice_step(y1 - y0), xs = nice_step(x1 - x0);
    y1 = ceil(y1 / ys) * ys;
    y0 = floor(y0 / ys) * ys;
#define PX(v) (L + ((v) - x0) / (x1 - x0) * (W - L - R))
#define PY(v) (H - B - ((v) - y0) / (y1 - y0) * (H - T - B))
    fprintf(f, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" class=\"plot\"/>\n", L, T, W - L - R, H - T - B);
    for (double v = y0; v <= y1 + ys * 1e-6; v += ys)
        fprintf(f, "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                   "<text x=\"%g\" y=\"%.1f\" class=\"yt\">%g</text>\n", L, W - R, PY(v), PY(v), L - 4, PY(v) + 4, v);
    for (double v = ceil(x0 / xs) * xs; v <= x1 + xs * 1e-6; v += xs)
        fprintf(f, "<line y1=\"%g\" y2=\"%g\" x1=\"%.1f\" x2=\"%.1f\" class=\"grid\"/>"
                   "<text y=\"%g\" x=\"%.1f\" class=\"xt\">%g</text>\n", T, H - B, PX(v), PX(v), H - B + 14, PX(v), v);
    fprintf(f, "<text x=\"%g\" y=\"%g\" class=\"xl\">", L + (W - L - R) / 2, H - 8);
    html_escape(f, xl);
    fprintf(f, "</text><text transform=\"translate(14,%g) rotate(-90)\" class=\"yl\">", T + (H - T - B) / 2);
    html_escape(f, yl);
    fprintf(f, "</text>\n");
    for (int i = 0; i < ns; i++) {
        const char *col = k_colors[i % 10];
        fprintf(f, "<g class=\"series\" data-series=\"%d\"><polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" points=\"", i, col);
        for (int k = 0; k < s[i].n; k++)
            if (isfinite(s[i].x[k]) && isfinite(s[i].y[k])) fprintf(f, "%.1f,%.1f ", PX(s[i].x[k]), PY(s[i].y[k]));
        fprintf(f, "\"/>\n");
        if (markers)
            for (int k = 0; k < s[i].n; k++)
                if (isfinite(s[i].x[k]) && isfinite(s[i].y[k]))
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s: %g, %g</title></circle>\n",
                            PX(s[i].x[k]), PY(s[i].y[k]), col, s[i].name, s[i].x[k], s[i].y[k]);
        fprintf(f, "</g>\n");
    }
#undef PX
#undef PY
    fprintf(f, "</svg><figcaption>");
    for (int i = 0; i < ns; i++) {
        fprintf(f, "<span class=\"key\" data-series=\"%d\"><i style=\"background:%s\"></i>", i, k_colors[i % 10]);
        html_escape(f, s[i].name);
        fprintf(f, "</span> ");
    }
    fprintf(f, "</figcaption></figure>\n");
}

/* CDF of a histogram, at most ~200 points, x in ms. */
static int hist_cdf(const tb_hist *h, double *x, double *y, int cap) {
    if (!h->count) return 0;
    int n = 0;
    uint64_t seen = 0;
    int first = tb_hist_index(h->min), last = tb_hist_index(h->max);
    int stride = (last - first) / (cap - 2) + 1;
    x[n] = MS((double)h->min);
    y[n++] = 0;
    for (int i = first; i <= last && n < cap - 1; i++) {
        seen += h->buckets[i];
        if ((i - first) % stride == stride - 1 || i == last) {
            double hi = (double)tb_hist_bucket_high(i);
            x[n] = MS(fmin(hi, (double)h->max));
            y[n++] = (double)seen / (double)h->count;
        }
    }
    return n;
}

static const char k_css[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}"
    "h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}"
    "td:first-child,td.errs{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:12px}"
    ".chart{margin:0;border:1px solid #ddd;padding:4px}.plot{fill:#fcfcfc;stroke:#999}"
    ".grid{stroke:#e4e4e4}.title{text-anchor:middle;font-weight:600;font-size:14px}"
    ".xt{text-anchor:middle;font-size:11px}.yt{text-anchor:end;font-size:11px}"
    ".xl,.yl{text-anchor:middle;font-size:12px}.empty{text-anchor:middle;fill:#999}"
    ".key{cursor:pointer;margin-right:10px;font-size:12px;user-select:none}"
    ".key i{display:inline-block;width:12px;height:3px;margin-right:4px;vertical-align:middle}"
    ".key.off{opacity:.35}.meta{color:#555;font-size:13px}pre{background:#f6f6f6;padding:8px;overflow:auto}";

/* Legend entries toggle their series; the last line marks the page as
 * rendered so a headless check can see that the script ran. */
static const char k_js[] =
    "(function(){document.querySelectorAll('figure.chart').forEach(function(fig){"
    "fig.querySelectorAll('.key').forEach(function(k){k.addEventListener('click',function(){"
    "var g=fig.querySelector('g.series[data-series=\"'+k.dataset.series+'\"]');if(!g)return;"
    "var off=k.classList.toggle('off');g.style.display=off?'none':'';});});});"
    "document.body.setAttribute('data-rendered',String(document.querySelectorAll('figure.chart').length));})();";

/* kserve: the server's per-model figures per point, when it exported them. */
static void html_server(FILE *f, const tb_bench_report *r) {
    int any = 0;
    for (int i = 0; i < r->n_points; i++)
        if (r->points[i].server && r->points[i].server->seen && r->points[i].server->valid) any = 1;
    if (!any) return;
    fprintf(f, "<h2>Server (its /metrics over each point)</h2><table><tr><th>point</th><th>rejected (429)</th>"
               "<th>server ok</th><th>server failed</th><th>executions</th><th>batch size mean</th>"
               "<th>batch sizes</th><th>queue ms mean</th><th>p50</th><th>p99</th><th>compute ms mean</th>"
               "<th>p50</th><th>p99</th></tr>\n");
    for (int i = 0; i < r->n_points; i++) {
        const tb_bench_result *p = &r->points[i];
        const tb_ks_metrics *m = p->server;
        char nm[64];
        if (!m || !m->seen || !m->valid) continue;
        fprintf(f, "<tr><td>%s</td><td>%ld</td><td>%.0f</td><td>%.0f</td><td>%.0f</td><td>%.2f</td><td>",
                point_name(p, nm, sizeof nm), status_count(p, 429), m->success, m->failure, m->executions,
                tb_prom_mean(&m->batch));
        for (int k = 0; k < m->batch.n; k++) {
            double c = m->batch.cum[k] - (k ? m->batch.cum[k - 1] : 0);
            if (c <= 0) continue;
            if (isinf(m->batch.le[k])) fprintf(f, "&gt;%g: %.0f ", k ? m->batch.le[k - 1] : 0, c);
            else fprintf(f, "&le;%g: %.0f ", m->batch.le[k], c);
        }
        fprintf(f, "</td>");
        const double v[6] = {tb_prom_mean(&m->queue_us), tb_prom_quantile(&m->queue_us, 0.5),
                             tb_prom_quantile(&m->queue_us, 0.99), tb_prom_mean(&m->compute_us),
                             tb_prom_quantile(&m->compute_us, 0.5), tb_prom_quantile(&m->compute_us, 0.99)};
        for (int k = 0; k < 6; k++) {
            if (isfinite(v[k])) fprintf(f, "<td>%.3f</td>", v[k] / 1e3);
            else fprintf(f, "<td>\xe2\x80\x93</td>"); /* U+2013: not exported */
        }
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</table>\n");
}

static void html_num(FILE *f, double v, const char *fmt, double scale) {
    if (isfinite(v)) { fprintf(f, "<td>"); fprintf(f, fmt, v * scale); fprintf(f, "</td>"); }
    else fprintf(f, "<td>\xe2\x80\x93</td>");
}

static void html_sessions_replicas(FILE *f, const tb_bench_report *r) {
    char nm[64];
    int any_s = 0, any_r = 0;
    for (int i = 0; i < r->n_points; i++) {
        any_s |= r->points[i].n_turns > 0;
        any_r |= r->points[i].n_replicas > 0;
    }
    if (any_s) {
        fprintf(f, "<h2>Sessions by turn</h2><p class=\"meta\">Turn 1 shares only the system prompt with "
                   "earlier requests; later turns resend the whole conversation, which a replica's prefix cache "
                   "can reuse.</p><table><tr><th>point</th><th>turn</th><th>ok</th><th>failed</th>"
                   "<th>TTFT p50 ms</th><th>TTFT p99 ms</th><th>E2E p50 ms</th><th>prompt tokens mean</th></tr>\n");
        for (int i = 0; i < r->n_points; i++) {
            const tb_bench_result *p = &r->points[i];
            for (int t = 0; t < p->n_turns; t++) {
                const tb_bench_turn *x = &p->turns[t];
                fprintf(f, "<tr><td>");
                html_escape(f, point_name(p, nm, sizeof nm));
                fprintf(f, "</td><td>%d</td><td>%ld</td><td>%ld</td>", t + 1, x->n_ok, x->n_err);
                html_num(f, x->ttft.count ? tb_hist_quantile(&x->ttft, 0.5) : NAN, "%.2f", 1e-6);
                html_num(f, x->ttft.count ? tb_hist_quantile(&x->ttft, 0.99) : NAN, "%.2f", 1e-6);
                html_num(f, x->e2e.count ? tb_hist_quantile(&x->e2e, 0.5) : NAN, "%.2f", 1e-6);
                html_num(f, x->n_ok ? (double)x->in_tokens / (double)x->n_ok : NAN, "%.1f", 1);
                fprintf(f, "</tr>\n");
            }
        }
        fprintf(f, "</table>\n");
    }
    if (any_r) {
        fprintf(f, "<h2>Replicas (their /metrics before and after each point)</h2><table><tr><th>point</th>"
                   "<th>replica</th><th>requests</th><th>share</th><th>prefix-cache hit rate</th>"
                   "<th>prompt tokens</th></tr>\n");
        for (int i = 0; i < r->n_points; i++) {
            const tb_bench_result *p = &r->points[i];
            int n;
            tb_bench_replica all = replica_total(p, &n);
            for (int k = 0; k <= p->n_replicas; k++) {
                const tb_bench_replica *x = k < p->n_replicas ? &p->replicas[k] : &all;
                if (k == p->n_replicas && !n) break;
                fprintf(f, "<tr><td>");
                html_escape(f, point_name(p, nm, sizeof nm));
                fprintf(f, "</td><td>");
                html_escape(f, x->url);
                fprintf(f, "</td>");
                if (!x->scraped) {
                    fprintf(f, "<td colspan=\"4\">not read: ");
                    html_escape(f, x->error);
                    fprintf(f, "</td></tr>\n");
                    continue;
                }
                html_num(f, x->requests, "%.0f", 1);
                html_num(f, k < p->n_replicas ? share_of(x, &all) : 1.0, "%.1f%%", 100);
                html_num(f, hit_rate(x->prefix_hits, x->prefix_queries), "%.1f%%", 100);
                html_num(f, x->prompt_tokens, "%.0f", 1);
                fprintf(f, "</tr>\n");
            }
        }
        fprintf(f, "</table>\n");
    }
}

tb_status tb_report_html(const char *path, const tb_bench_report *r) {
    FILE *f = fopen(path, "w");
    if (!f) return tb_errorf(TB_ERR_IO, "cannot write %s", path);
    int np = r->n_points;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
               "<title>turbine bench: ");
    html_escape(f, r->target);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>turbine bench: ", k_css);
    html_escape(f, r->target);
    fprintf(f, "</h1>\n<p class=\"meta\">endpoint <b>");
    html_escape(f, r->endpoint);
    fprintf(f, "</b>, model <b>");
    html_escape(f, r->model ? r->model : "-");
    fprintf(f, "</b>, started ");
    html_escape(f, r->started_at);
    fprintf(f, "<br>command: <code>");
    html_escape(f, r->command_line);
    fprintf(f, "</code></p>\n");

    /* summary table */
    fprintf(f, "<h2>Summary</h2><table><tr><th>point</th><th>ok</th><th>failed</th><th>req/s</th>"
               "<th>output tok/s</th><th>total tok/s</th><th>goodput req/s</th>");
    for (int m = 0; m < N_METRICS; m++)
        fprintf(f, "<th>%s mean ms</th><th>%s p50</th><th>%s p99</th>", k_metrics[m].name,
                k_metrics[m].name, k_metrics[m].name);
    fprintf(f, "<th>errors</th></tr>\n");
    for (int i = 0; i < np; i++) {
        const tb_bench_result *p = &r->points[i];
        char nm[64];
        fprintf(f, "<tr><td>%s</td><td>%ld</td><td>%ld</td><td>%.2f</td><td>%.1f</td><td>%.1f</td><td>%.2f</td>",
                point_name(p, nm, sizeof nm), p->n_ok, p->n_err, p->qps, p->out_tps, p->total_tps, p->goodput);
        for (int m = 0; m < N_METRICS; m++) {
            const tb_hist *h = k_metrics[m].get(p);
            if (!h->count) fprintf(f, "<td>\xe2\x80\x93</td><td>\xe2\x80\x93</td><td>\xe2\x80\x93</td>" /* U+2013 */);
            else fprintf(f, "<td>%.2f</td><td>%.2f</td><td>%.2f</td>", MS(tb_hist_mean(h)),
                         MS(tb_hist_quantile(h, 0.5)), MS(tb_hist_quantile(h, 0.99)));
        }
        fprintf(f, "<td class=\"errs\">");
        for (int k = 0; k < TB_BERR_COUNT; k++) {
            if (!p->err[k]) continue;
            fprintf(f, "<div>%s %ld: ", tb_bench_error_name(k), p->err[k]);
            html_escape(f, p->first_msg[k]);
            fprintf(f, "</div>");
        }
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</table>\n");
    html_server(f, r);
    html_sessions_replicas(f, r);

    /* latency-throughput across the sweep */
    double *qx = calloc((size_t)np + 1, sizeof *qx), *buf = calloc((size_t)np * 4 + 4, sizeof *buf);
    if (!qx || !buf) { free(qx); free(buf); fclose(f); return tb_errorf(TB_ERR_OOM, "report: out of memory"); }
    double *e50 = buf, *e99 = buf + np, *t50 = buf + 2 * np, *t99 = buf + 3 * np;
    for (int i = 0; i < np; i++) {
        const tb_bench_result *p = &r->points[i];
        qx[i] = p->qps;
        e50[i] = p->e2e.count ? MS(tb_hist_quantile(&p->e2e, 0.5)) : NAN;
        e99[i] = p->e2e.count ? MS(tb_hist_quantile(&p->e2e, 0.99)) : NAN;
        t50[i] = p->ttft.count ? MS(tb_hist_quantile(&p->ttft, 0.5)) : NAN;
        t99[i] = p->ttft.count ? MS(tb_hist_quantile(&p->ttft, 0.99)) : NAN;
    }
    fprintf(f, "<h2>Latency against throughput</h2><div class=\"charts\">\n");
    series lt[4] = {{"E2E p50", np, qx, e50}, {"E2E p99", np, qx, e99},
                    {"TTFT p50", np, qx, t50}, {"TTFT p99", np, qx, t99}};
    svg_chart(f, "Latency vs request throughput (one point per sweep step)", "requests/s",
              "latency (ms)", lt, r->points[0].ttft.count ? 4 : 2, 1);
    fprintf(f, "</div>\n");

    /* CDFs */
    enum { CDF_CAP = 200 };
    double *cx = calloc((size_t)np * CDF_CAP, sizeof *cx), *cy = calloc((size_t)np * CDF_CAP, sizeof *cy);
    series *cs = calloc((size_t)np + 1, sizeof *cs);
    char (*names)[64] = calloc((size_t)np + 1, sizeof *names);
    if (!cx || !cy || !cs || !names) {
        free(qx); free(buf); free(cx); free(cy); free(cs); free(names); fclose(f);
        return tb_errorf(TB_ERR_OOM, "report: out of memory");
    }
    fprintf(f, "<h2>Latency distributions (CDF)</h2><div class=\"charts\">\n");
    for (int m = 0; m < N_METRICS; m++) {
        int any = 0;
        for (int i = 0; i < np; i++) {
            const tb_hist *h = k_metrics[m].get(&r->points[i]);
            cs[i].name = point_name(&r->points[i], names[i], sizeof names[i]);
            cs[i].x = cx + (size_t)i * CDF_CAP;
            cs[i].y = cy + (size_t)i * CDF_CAP;
            cs[i].n = hist_cdf(h, cx + (size_t)i * CDF_CAP, cy + (size_t)i * CDF_CAP, CDF_CAP);
            any |= cs[i].n > 0;
        }
        if (!any) continue;
        char title[64], xl[64];
        snprintf(title, sizeof title, "%s CDF", k_metrics[m].name);
        for (char *c = title; *c && *c != ' '; c++) *c = (char)(*c - 32 * (*c >= 'a' && *c <= 'z'));
        snprintf(xl, sizeof xl, "%s (ms)", k_metrics[m].name);
        svg_chart(f, title, xl, "fraction of requests", cs, np, 0);
    }
    fprintf(f, "</div>\n");

    /* timelines: the points run one after another, so time is cumulative */
    int ns_total = 0;
    for (int i = 0; i < np; i++) ns_total += r->points[i].n_samples;
    double *tl = calloc((size_t)ns_total * 10 + 10, sizeof *tl);
    if (!tl) {
        free(qx); free(buf); free(cx); free(cy); free(cs); free(names); fclose(f);
        return tb_errorf(TB_ERR_OOM, "report: out of memory");
    }
    double *tt = tl, *rq = tl + ns_total, *tk = tl + 2 * ns_total, *inf = tl + 3 * ns_total,
           *run_ = tl + 4 * ns_total, *wait = tl + 5 * ns_total, *kv = tl + 6 * ns_total,
           *gu = tl + 7 * ns_total, *gm = tl + 8 * ns_total, *gp = tl + 9 * ns_total;
    double base = 0;
    int k = 0, has_srv = 0, has_kv = 0, has_gpu = 0;
    for (int i = 0; i < np; i++) {
        const tb_bench_result *p = &r->points[i];
        for (int j = 0; j < p->n_samples; j++, k++) {
            const tb_bench_sample *s = &p->samples[j];
            tt[k] = base + s->t;
            rq[k] = s->done_rate;
            tk[k] = s->tok_rate;
            inf[k] = s->inflight;
            run_[k] = s->srv_running;
            wait[k] = s->srv_waiting;
            kv[k] = s->srv_kv * 100;
            gu[k] = s->gpu_util;
            gm[k] = s->gpu_mem_gib;
            gp[k] = s->gpu_power_w;
            has_srv |= isfinite(s->srv_running) || isfinite(s->srv_waiting);
            has_kv |= isfinite(s->srv_kv);
            has_gpu |= isfinite(s->gpu_util);
        }
        base += p->duration;
    }
    fprintf(f, "<h2>Over time</h2><p class=\"meta\">Sweep points run one after another:");
    base = 0;
    for (int i = 0; i < np; i++) {
        char nm[64];
        fprintf(f, " %s from %.1f s;", point_name(&r->points[i], nm, sizeof nm), base);
        base += r->points[i].duration;
    }
    fprintf(f, "</p><div class=\"charts\">\n");
    series s1[1] = {{"completed requests/s", ns_total, tt, rq}};
    svg_chart(f, "Request throughput", "time (s)", "requests/s", s1, 1, 0);
    series s2[1] = {{"output tokens/s", ns_total, tt, tk}};
    svg_chart(f, "Output token throughput", "time (s)", "tokens/s", s2, 1, 0);
    series s3[3] = {{"client in flight", ns_total, tt, inf}, {"server running (batch)", ns_total, tt, run_},
                    {"server waiting (queue)", ns_total, tt, wait}};
    svg_chart(f, "Requests in flight, server batch and queue", "time (s)", "requests", s3, has_srv ? 3 : 1, 0);
    if (has_kv) {
        series s4[1] = {{"KV cache used %", ns_total, tt, kv}};
        svg_chart(f, "Server KV-cache use", "time (s)", "%", s4, 1, 0);
    }
    if (has_gpu) {
        series s5[1] = {{"GPU utilisation %", ns_total, tt, gu}};
        svg_chart(f, "GPU utilisation (NVML)", "time (s)", "%", s5, 1, 0);
        series s6[1] = {{"GPU memory used GiB", ns_total, tt, gm}};
        svg_chart(f, "GPU memory (NVML)", "time (s)", "GiB", s6, 1, 0);
        series s7[1] = {{"GPU power W", ns_total, tt, gp}};
        svg_chart(f, "GPU power (NVML)", "time (s)", "W", s7, 1, 0);
    }
    fprintf(f, "</div>\n");
    if (r->models_json) {
        fprintf(f, "<h2>Target /v1/models</h2><pre>");
        html_escape(f, r->models_json);
        fprintf(f, "</pre>\n");
    }
    fprintf(f, "<script>%s</script>\n</body></html>\n", k_js);
    free(qx); free(buf); free(cx); free(cy); free(cs); free(names); free(tl);
    int bad = ferror(f);
    if (fclose(f) || bad) return tb_errorf(TB_ERR_IO, "cannot write %s", path);
    return TB_OK;
}
