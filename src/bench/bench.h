/*
 * bench.h — the HTTP load tester behind `turbine bench`.
 *
 * It knows only HTTP: it drives any OpenAI-compatible server (completions,
 * chat), a KServe v2 infer endpoint or a plain URL, from one thread through
 * one epoll loop (its own HTTP/1.1 client for http://, libcurl's multi
 * interface for https:// or when asked), in a closed loop (N clients) or an open loop
 * (a Poisson or constant arrival rate, latency measured from each request's
 * intended send time so that a stalled server cannot hide its queue).
 *
 * Pieces, in the order a run uses them:
 *   tb_hist       log-bucketed latency histogram (relative error < 0.4%)
 *   tb_workload   the request bodies (synthetic, JSONL, ShareGPT, a file)
 *   tb_bench_run  one sweep point: the load loop, metrics, timelines
 *   tb_h1_*       the built-in HTTP/1.1 client the load loop drives
 *   tb_report_*   summary table, JSON, CSV, self-contained HTML
 *
 * Ownership: every *_create/_load has a matching *_free that accepts NULL.
 */
#ifndef TB_BENCH_H
#define TB_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "core/core.h"

/* ---------------------------------------------------------------- histogram */
/* Values are non-negative integers (the load tester uses nanoseconds) up to
 * 2^44 (about 4.9 hours); larger values are clamped. Buckets are exact below
 * 256 and 1/128 of an octave wide above, so a reported value (the bucket
 * midpoint, clamped to [min, max]) is within 1/256 of the true one. Mean,
 * stddev, min and max are exact. */
#define TB_HIST_SUB_BITS 8
#define TB_HIST_MAX_BITS 44
#define TB_HIST_BUCKETS ((TB_HIST_MAX_BITS - TB_HIST_SUB_BITS + 2) << (TB_HIST_SUB_BITS - 1))

typedef struct {
    uint64_t count;
    uint64_t min, max;
    double sum, sumsq;
    uint64_t *buckets; /* [TB_HIST_BUCKETS] */
} tb_hist;

tb_status tb_hist_init(tb_hist *h);
void tb_hist_free(tb_hist *h);
void tb_hist_reset(tb_hist *h);
void tb_hist_add(tb_hist *h, uint64_t v);
void tb_hist_merge(tb_hist *dst, const tb_hist *src);
double tb_hist_mean(const tb_hist *h);
double tb_hist_stddev(const tb_hist *h);
/* The value at quantile q in [0, 1] (0 when empty). */
double tb_hist_quantile(const tb_hist *h, double q);
/* Index <-> value range of a bucket (for CDF plots). */
int tb_hist_index(uint64_t v);
uint64_t tb_hist_bucket_low(int idx);
uint64_t tb_hist_bucket_high(int idx); /* exclusive */

/* ---------------------------------------------------------------- workload */
typedef enum {
    TB_EP_COMPLETIONS = 0,
    TB_EP_CHAT,
    TB_EP_KSERVE,
    TB_EP_GET,
} tb_endpoint;

const char *tb_endpoint_name(tb_endpoint e);

typedef struct {
    char *body;      /* the request body (NULL for GET)                  */
    size_t body_len;
    int input_len;   /* prompt tokens as intended (estimated for files)  */
    int output_len;  /* max_tokens asked for (0 when not an LLM request) */
} tb_bench_request;

typedef struct {
    tb_endpoint endpoint;
    const char *model;       /* required for completions/chat/kserve        */
    int stream;              /* completions/chat: SSE streaming             */
    int ignore_eos;          /* ask for exactly output_len tokens           */
    /* synthetic prompts (used when no file is given) */
    int input_len, output_len;
    double input_stddev, output_stddev;
    int prefix_len;          /* words every synthetic prompt starts with (a
                              * shared system prompt), before its input_len */
    /* files: at most one of these */
    const char *jsonl_path;  /* {"prompt": ..., "output_len": N} per line    */
    const char *sharegpt_path;
    const char *body_path;   /* kserve: the JSON body sent as is            */
    const struct tb_ks_spec_ *kserve_spec; /* kserve: bodies built from this
                              * spec (tb_ks_build_body), a pool of up to
                              * TB_KS_POOL random ones, or one from files    */
    const char *input_data_dir; /* kserve: NAME.bin per input in a folder, or
                              * a perf_analyzer input-data FILE.json        */
    int batch_size;          /* kserve: --batch-size (files repeat per item)  */
    int n_prompts;           /* distinct requests to prepare, all of them
                              * different (a file too short is cycled)       */
    uint64_t seed;
} tb_workload_options;

typedef struct {
    tb_bench_request *reqs;
    int n;
    int n_warmup;   /* tb_bench_run: the warm-up cycles over reqs[0, n_warmup),
                     * the measured phase over the rest (0: both over all)  */
    size_t ks_header_len; /* kserve binary bodies: the JSON header's bytes
                     * (the same for every body of the pool)                */
    int n_source;   /* distinct prompts the file held (synthetic: n); fewer
                     * than n means prompts repeat                          */
} tb_workload;

tb_status tb_workload_load(const tb_workload_options *o, tb_workload **out);

/* Multi-turn chat sessions: n conversations of `turns` turns each, all
 * starting with one system prompt of system_len words (the same for every
 * conversation of a run). Turn t of a conversation sends the system prompt,
 * every earlier user message with the assistant's reply the server returned,
 * and the new user message (input_len words, drawn as synthetic prompts are);
 * its id goes out in a header so that a load balancer can keep the
 * conversation on one replica. */
typedef struct {
    int n, turns;
    int system_len;
    char *system;            /* the shared system prompt                    */
    char **user;             /* [n * turns]: conversation c's turn t at c * turns + t */
    int *user_words;         /* [n * turns]                                  */
    int *out_len;            /* [n * turns]: max_tokens                      */
    char (*id)[40];          /* [n]: each conversation's id                  */
    const char *model;
    int stream, ignore_eos;
} tb_sessions;

/* o: model, stream, ignore_eos, input/output lengths and stddevs, seed (the
 * system prompt's words come from the seed alone, the rest also from
 * `point`, so each sweep point talks in new conversations). */
tb_status tb_sessions_create(const tb_workload_options *o, int n, int turns, int system_len, int point,
                             tb_sessions **out);
void tb_sessions_free(tb_sessions *s);
/* The body of turn `turn` of conversation `conv`: replies[k] (reply_len[k]
 * bytes) is the assistant's answer to turn k < turn. Malloc'd into *body. */
tb_status tb_sessions_body(const tb_sessions *s, int conv, int turn, const char *const *replies,
                           const size_t *reply_len, char **body, size_t *len);
/* A synthetic prompt of n_words words as the workload makes them (to ask a
 * server how many tokens they are); malloc'd. */
char *tb_workload_sample_text(int n_words, uint64_t seed);
void tb_workload_free(tb_workload *w);

/* ---------------------------------------------------------------- KServe v2 */
/* The tensors of a KServe v2 infer request (kserve.c): given on the command
 * line (NAME:DATATYPE:SHAPE) or read from the model's metadata, filled with
 * seeded random values or from files, encoded as JSON or with the binary
 * tensor extension. The pool of bodies is built once, before the load. */
#define TB_KS_MAX_TENSORS 16
#define TB_KS_MAX_DIMS 8
#define TB_KS_MAX_NAME 128
#define TB_KS_MAX_ELEMS ((int64_t)1 << 28) /* elements per input tensor */

typedef struct {
    char name[TB_KS_MAX_NAME];
    char datatype[16];      /* "FP32", "INT64", ... as the protocol spells it */
    int elem_size;          /* bytes per element in binary form              */
    int n_dims;
    int64_t dims[TB_KS_MAX_DIMS]; /* -1: dynamic (metadata only)               */
} tb_ks_tensor;

typedef struct tb_ks_spec_ {
    tb_ks_tensor inputs[TB_KS_MAX_TENSORS];
    int n_inputs;
    char outputs[TB_KS_MAX_TENSORS][TB_KS_MAX_NAME]; /* expected in responses */
    int n_outputs;
    int binary;             /* the binary tensor extension, both ways       */
} tb_ks_spec;
#define TB_KS_POOL 16

/* "NAME:DATATYPE:D0xD1x..." (datatype case-insensitive; "" or "scalar" for
 * rank 0). */
tb_status tb_ks_parse_input(const char *arg, tb_ks_tensor *t);
/* Inputs and outputs from a GET /v2/models/{name} document. */
tb_status tb_ks_spec_from_metadata(const char *json, tb_ks_spec *s);
/* "NAME:D0xD1x..." replaces the dynamic (-1) dims of input NAME; the other
 * dims must agree. Afterwards every dim left dynamic becomes 1. */
tb_status tb_ks_apply_shape(tb_ks_spec *s, const char *arg);
void tb_ks_fix_dynamic(tb_ks_spec *s);
/* Multiplies dim 0 of every input of rank >= 1 by batch. */
tb_status tb_ks_apply_batch(tb_ks_spec *s, int batch);
int64_t tb_ks_elems(const tb_ks_tensor *t);
/* One body: data[i] holds input i in little-endian binary form (NULL:
 * seeded random values from *seed). *header_len: the JSON header's bytes
 * (binary form; the whole body in JSON form). Malloc'd into *body. */
tb_status tb_ks_build_body(const tb_ks_spec *s, const void *const *data, uint64_t *seed, char **body,
                           size_t *len, size_t *header_len);
/* Input i's bytes from DIR/NAME.bin (raw little-endian), either the whole
 * tensor or one batch item repeated along dim 0 (batch copies). Malloc'd. */
tb_status tb_ks_read_input(const char *dir, const tb_ks_tensor *t, int batch, void **data);
/* Triton perf_analyzer's input-data JSON: {"data": [{NAME: [v, ...] or
 * {"content": [...], "shape": [...]}, ...}, ...]}, one step per body (at
 * most max_steps), each input a flat array of the whole tensor or of one
 * batch item (repeated). *out: n_steps * n_inputs malloc'd buffers, step
 * major. */
tb_status tb_ks_read_json_data(const char *path, const tb_ks_spec *s, int batch, int max_steps, void ***out,
                               int *n_steps);
/* Checks a 200 response body: JSON (a binary reply: its header) with an
 * "outputs" array naming every expected output, JSON data of the stated
 * shape's size, or binary_data_size that add up to the bytes after the
 * header. 1: fine; 0: msg says why. */
int tb_ks_check_response(const tb_ks_spec *s, const char *body, size_t n, char *msg, size_t cap);

/* A Prometheus histogram summed over the series of one model (every
 * version): cumulative counts per upper bound, ascending, +Inf last. */
#define TB_PROM_MAX_BUCKETS 64
typedef struct {
    int n;
    double le[TB_PROM_MAX_BUCKETS];
    double cum[TB_PROM_MAX_BUCKETS];
    double sum, count;
    int seen;
} tb_prom_hist;

/* The server-side figures of one model: turbine_inference_* from /metrics. */
typedef struct {
    tb_prom_hist batch, queue_us, compute_us;
    double success, failure, inferences, executions;
    int seen;               /* any of the names appeared for the model    */
    int valid;              /* a delta: 0 when a counter went backwards     */
} tb_ks_metrics;

/* Reads the lines it knows from Prometheus text, others ignored; lines over
 * 4 KiB are skipped. model NULL: every model. */
void tb_ks_metrics_parse(const char *text, const char *model, tb_ks_metrics *m);
/* d = after - before, bucket by bucket (matched by bound). */
void tb_ks_metrics_delta(const tb_ks_metrics *after, const tb_ks_metrics *before, tb_ks_metrics *d);
/* histogram_quantile as Prometheus computes it: linear within the bucket
 * that holds rank q * count (the lower bound of the first bucket is 0; the
 * +Inf bucket answers its lower bound). NaN when empty. */
double tb_prom_quantile(const tb_prom_hist *h, double q);
double tb_prom_mean(const tb_prom_hist *h);

/* ---------------------------------------------------------------- run */
/* Error kinds, each counted separately. */
typedef enum {
    TB_BERR_CONNECT = 0, /* refused, reset, DNS                          */
    TB_BERR_TIMEOUT,     /* --timeout passed                             */
    TB_BERR_HTTP,        /* a status other than 2xx                      */
    TB_BERR_STREAM,      /* malformed SSE/JSON or an error in the body   */
    TB_BERR_OTHER,
    TB_BERR_COUNT
} tb_bench_error_kind;

const char *tb_bench_error_name(tb_bench_error_kind k);

#define TB_BENCH_MAX_HEADERS 32
#define TB_BENCH_MAX_STATUS 16
#define TB_BENCH_MAX_BODY ((uint64_t)1 << 30) /* bytes per response, both clients */

/* Which HTTP client carries the requests. */
typedef enum {
    TB_HTTP_CLIENT_AUTO = 0, /* built-in for http://, libcurl for https://   */
    TB_HTTP_CLIENT_BUILTIN,  /* built-in only (http:// URLs)                  */
    TB_HTTP_CLIENT_CURL,     /* libcurl for everything                        */
} tb_http_client;

const char *tb_http_client_name(tb_http_client k);

typedef struct {
    /* target */
    tb_endpoint endpoint;
    int stream;              /* completions/chat: the bodies ask for SSE    */
    const char *url;         /* the full URL requests go to                 */
    const char *base_url;    /* for /metrics                                */
    const char *api_key;     /* "Authorization: Bearer ..." when set        */
    const char *headers[TB_BENCH_MAX_HEADERS];
    int n_headers;
    double timeout;          /* seconds per request (0: none)              */
    double connect_timeout;  /* seconds                                     */
    tb_http_client http_client;
    /* load model: concurrency > 0 (closed) or rate > 0 (open) */
    int concurrency;
    double rate;
    int poisson;             /* open loop: 1 Poisson arrivals, 0 constant   */
    int max_inflight;        /* open loop: cap on requests in flight        */
    long requests;           /* 0: bounded by duration only                 */
    double duration;         /* 0: bounded by requests only                 */
    long warmup;             /* requests run and discarded before timing    */
    uint64_t seed;
    /* SLOs for goodput (seconds; 0: not set) */
    double slo_ttft, slo_tpot, slo_e2e;
    /* sampling */
    double sample_interval;  /* seconds between timeline samples          */
    int scrape_metrics;      /* GET base_url/metrics while running          */
    int gpu;                 /* sample NVML when present                    */
    int progress;            /* draw a progress line on stderr              */
    const char *label;       /* e.g. "c=16", shown in the progress line      */
    const tb_ks_spec *kserve; /* kserve: responses checked against it (NULL:
                              * only the status is checked)                 */
    /* multi-turn chat (NULL: independent requests from the workload): the
     * run sends every turn of every conversation, a conversation's turns one
     * after another, `concurrency` conversations in progress at once (a new
     * one starts when one ends; closed loop only); requests and warmup do not
     * apply */
    const tb_sessions *sessions;
    const char *session_header; /* the header carrying a conversation's id
                              * (default X-Session-ID)                       */
    /* each replica's /metrics URL: read before and after the measured phase */
    const char *const *replica_urls;
    int n_replicas;
} tb_bench_config;

void tb_bench_config_default(tb_bench_config *c);

/* One timeline sample (per sample_interval). NaN: not available. */
typedef struct {
    double t;            /* seconds since the point started              */
    double done_rate;    /* requests completed per second in the interval */
    double tok_rate;     /* output tokens per second in the interval     */
    int inflight;
    double srv_running;  /* from /metrics                                */
    double srv_waiting;
    double srv_kv;       /* KV-cache use, 0..1                            */
    double gpu_util;     /* percent                                       */
    double gpu_mem_gib;
    double gpu_power_w;
} tb_bench_sample;

/* One replica over a point: counter deltas of its /metrics (NaN: not
 * exported or not read both times). */
#define TB_BENCH_MAX_REPLICAS 64
typedef struct {
    char url[512];
    int scraped;            /* 1: read before and after                     */
    char error[160];        /* why not, when not                            */
    double requests;        /* generation requests it counted               */
    double prompt_tokens;
    double prefix_hits, prefix_queries; /* tokens                           */
} tb_bench_replica;

/* Figures of turn index t (0-based) over every conversation of a point. */
typedef struct {
    long n_ok, n_err;
    long in_tokens;         /* prompt tokens (the server's usage when given)  */
    tb_hist ttft, e2e;      /* nanoseconds                                  */
} tb_bench_turn;

typedef struct {
    char label[64];
    int concurrency;
    double rate;
    double duration;        /* seconds of the measured phase              */
    long n_sent, n_ok, n_err;
    long err[TB_BERR_COUNT];
    int status_code[TB_BENCH_MAX_STATUS];
    long status_count[TB_BENCH_MAX_STATUS];
    int n_status;
    char first_error[256];  /* the first error of the point, "kind: message" */
    char first_msg[TB_BERR_COUNT][512]; /* the first message of each kind (for
                             * http: "HTTP 400: " and the server's message)  */
    long in_tokens, out_tokens;
    long n_good;            /* requests meeting every SLO                  */
    double prefix_hit_rate; /* the server's prefix-cache hits / lookups over
                             * the point (its /metrics before and after); NaN
                             * when it reports none                        */
    double qps, out_tps, total_tps, goodput;
    tb_hist ttft, tpot, itl, e2e; /* nanoseconds */
    tb_bench_sample *samples;
    int n_samples, cap_samples;
    tb_ks_metrics *server;  /* kserve: the server's per-model histograms
                             * over the point (/metrics after - before);
                             * NULL when not scraped; freed with the result */
    tb_bench_replica *replicas; /* [n_replicas] (--replica-metrics) or NULL */
    int n_replicas;
    tb_bench_turn *turns;   /* [n_turns] (sessions) or NULL                 */
    int n_turns;
    int n_sessions;         /* conversations run                           */
    int system_len;         /* words of their shared system prompt         */
    int sessions_cut;       /* conversations ended early by a failed turn   */
} tb_bench_result;

tb_status tb_bench_result_init(tb_bench_result *r);
void tb_bench_result_free(tb_bench_result *r);

/* Runs one point: c->warmup requests over w's first n_warmup requests (not
 * counted), then the measured phase over the rest. Takes nothing over from its
 * arguments. Fails only on setup errors; request failures are counted. */
tb_status tb_bench_run(const tb_bench_config *c, const tb_workload *w,
                       tb_bench_result *out);

/* The client a run with this configuration uses (AUTO resolved). */
tb_http_client tb_bench_client_for(const tb_bench_config *c);

/* GET url into a malloc'd NUL-terminated string (at most max bytes).
 * *http_status gets the status (0 when the connection failed). */
tb_status tb_bench_http_get(const char *url, const tb_bench_config *c, double timeout,
                            size_t max, char **body, long *http_status);

/* POST a JSON body to url, otherwise as tb_bench_http_get. */
tb_status tb_bench_http_post(const char *url, const tb_bench_config *c, const char *json, double timeout,
                             size_t max, char **body, long *http_status);

/* The max_model_len a /v1/models document gives for `model` (the first
 * entry's when none is named or none matches); 0 when it gives none. */
int tb_bench_max_model_len(const char *models_json, const char *model);

/* The first model id of a /v1/models document (malloc'd), or NULL. */
char *tb_bench_first_model(const char *models_json);

/* ---------------------------------------------------------------- HTTP/1.1 client */
/* The load loop's own client for plain http:// URLs (http1.c): one
 * connection per index in [0, max_conns), one request in flight on each,
 * kept alive; the requests of the workload pre-formatted once. Its sockets
 * join the caller's epoll set with data.u64 = TB_H1_TAG | index; the caller
 * hands those events to tb_h1_event and calls tb_h1_poll once per loop
 * iteration (timeouts, completions queued by tb_h1_start). */
#define TB_H1_TAG (1ull << 63)

typedef struct tb_h1_client tb_h1_client;
/* Body bytes as they are read (now: the time right after the read). */
typedef void (*tb_h1_body_fn)(void *ud, int status, const char *p, size_t n, double now);
/* The end of a request: err < 0 success, else a tb_bench_error_kind with a
 * message; status is the HTTP status (0 when none arrived). */
typedef void (*tb_h1_done_fn)(void *ud, int err, const char *msg, int status, double now);

/* Sends a body made for this request (not one of the workload's) on
 * connection `idx`, with one more header line `extra` (NULL: none); body and
 * extra are copied. */
tb_status tb_h1_start_body(tb_h1_client *cl, int idx, const char *body, size_t len, const char *extra,
                           void *ud, double now);
/* 1 when the built-in client can take this URL (http://host[:port]/path). */
int tb_h1_supports(const char *url);
/* For c->url, c->endpoint, headers, api key, timeouts; requests from w. */
tb_status tb_h1_create(const tb_bench_config *c, const tb_workload *w, int epfd, int max_conns,
                       tb_h1_body_fn body, tb_h1_done_fn done, tb_h1_client **out);
void tb_h1_free(tb_h1_client *cl);
/* Sends workload request `req` on connection `idx` (which must be free). */
void tb_h1_start(tb_h1_client *cl, int idx, long req, void *ud, double now);
void tb_h1_event(tb_h1_client *cl, uint64_t tag, uint32_t events);
void tb_h1_poll(tb_h1_client *cl, double now);
/* The earliest time tb_h1_poll has work (INFINITY: none). */
double tb_h1_next_deadline(const tb_h1_client *cl);
/* Ends the request on `idx` now, as a timeout. */
void tb_h1_cancel(tb_h1_client *cl, int idx, double now);

/* ---------------------------------------------------------------- monitors */
/* What the load tester reads of a server's Prometheus /metrics (NaN where
 * none of the known names appear). Knows vLLM, llama.cpp, TGI, SGLang,
 * Turbine. */
typedef struct {
    double running, waiting;     /* requests                                   */
    double kv;                   /* KV-cache use, 0..1                          */
    double prefix_hits, prefix_queries; /* prefix-cache counters, in tokens     */
    double requests;             /* generation requests received (counter)      */
    double prompt_tokens;        /* prompt tokens processed (counter)           */
} tb_server_metrics;
void tb_bench_parse_prometheus(const char *text, tb_server_metrics *m);

/* NVML through dlopen; every call is a no-op returning 0 without a GPU. */
int tb_nvml_open(void);
/* Sums over devices: utilisation (mean %), memory used (GiB), power (W). */
int tb_nvml_sample(double *util, double *mem_gib, double *power_w);
void tb_nvml_close(void);

/* ---------------------------------------------------------------- reports */
typedef struct {
    const char *command_line;
    const char *target;       /* URL */
    const char *endpoint;
    const char *model;
    const char *models_json;  /* the target's /v1/models, may be NULL */
    const char *started_at;   /* ISO-8601 UTC */
    const tb_bench_config *config;
    const tb_workload_options *workload;
    const tb_bench_result *points;
    int n_points;
} tb_bench_report;

void tb_report_summary(FILE *f, const tb_bench_report *r);
tb_status tb_report_json(const char *path, const tb_bench_report *r);
tb_status tb_report_csv(const char *path, const tb_bench_report *r);
tb_status tb_report_html(const char *path, const tb_bench_report *r);

#endif /* TB_BENCH_H */
