/* server.c — HTTP routes, the OpenAI wire format, streaming and shutdown;
 * the KServe v2 routes over the table of models (the wire format itself is
 * in kserve.c). */
#define _GNU_SOURCE
#include "serve/server.h"

#include <errno.h>
#include <jansson.h>
#include "serve/mhd_shim.h" /* libmicrohttpd, loaded on first use */
#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "core/kv_layout.h"
#include "backend/backend.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "serve/batcher.h"
#include "serve/chat.h"
#include "serve/kserve.h"
#include "serve/kserve_grpc.h"
#include "serve/metrics.h"
#include "serve/model_repo.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"

#define MAX_STOPS 4
#define MAX_CHOICES 64 /* n: samples of one prompt */
#define MAX_PROMPTS 64 /* completions: prompts of one request (a list of them) */
#define MAX_STOP_LEN 256
#define MAX_MESSAGES 256
#define STREAM_SNDBUF (64 * 1024) /* kernel send buffer of a streaming response (Linux doubles it) */

void tb_serve_options_default(tb_serve_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->max_queue = 256;
    o->max_body_bytes = 1 << 20;
    o->grace_seconds = 30;
    o->connection_timeout_s = 60;
    o->stream_interval = 1;
    o->stream_buffer = 1024;
    o->max_batch_size = -1;
    o->max_queue_delay_us = -1;
    o->max_queue_size = -1;
    o->instance_count = -1;
    o->request_timeout_us = -1;
}

/* ================================================================ state */

#define MAX_MODELS 16

struct server;

/* A model the v2 routes serve: a general engine behind its dynamic batcher
 * (which owns the executors), or the server's LLM engine (b NULL), which
 * answers the health and metadata routes while its requests go through the
 * OpenAI API, or an LLM engine of the model repository (llm set), which
 * answers both APIs through its own scheduler. */
typedef struct {
    char name[TB_KS_MAX_NAME], version[TB_KS_MAX_NAME];
    tb_engine *e;          /* owned when b is set; else the server's LLM engine */
    tb_batcher *b;         /* NULL: an LLM engine */
    _Atomic int ready;
    int is_llm;            /* the server's LLM engine (OpenAI API) */
    struct server *llm;    /* a repository LLM: its engine, context, scheduler
                            * and tokenizer as the OpenAI code reads them
                            * (a server of its own sharing the options and
                            * metrics); kept across unloads, its engine
                            * NULL while unloaded */
    /* Repository state as /v2/repository/index shows it; reason: why not
     * READY. Written under the server's load_mu. */
    const char *state;     /* "READY", "UNAVAILABLE", "LOADING" */
    char reason[512];
    _Atomic int users;     /* infer requests inside the batcher: unload waits for 0 */
    int timeout_override;  /* a request's parameters.timeout is honoured */
    int n_in, n_out;
    tb_io_info in[TB_KS_MAX_IO], out[TB_KS_MAX_IO];
    /* Triton's per-model request statistics (nv_inference_request_*); the
     * inference, execution, queue and compute figures come from the batcher */
    _Atomic unsigned long long n_success, n_fail;
    _Atomic unsigned long long ns_success, ns_fail;
    _Atomic unsigned long long last_ms; /* wall clock of the last inference, ms since the epoch */
    /* Device memory the model's load took (turbine_model_gpu_memory_bytes):
     * the device's used bytes after its executors or context were made less
     * those before, so weights, KV pool, workspaces and library handles
     * created at load; 0 on the CPU */
    _Atomic unsigned long long gpu_bytes;
} model;

typedef struct server {
    tb_serve_options o;
    char model[128];
    struct MHD_Daemon *d;
    _Atomic int ready;
    _Atomic int stopping;
    _Atomic long next_id;
    tb_engine *e;
    tb_context *ctx;
    int warm_steps;           /* the LLM warm-up's steps (llm_warmup) */
    double warm_s;
    tb_sched *sched;
    tb_metrics *metrics;
    const tb_tokenizer *tok;
    tb_engine_info info;
    tb_chat_format chat;
    char bos_text[64];
    model *models[MAX_MODELS];
    _Atomic int n_models;  /* grows under load_mu; entries are never removed */
    pthread_mutex_t load_mu; /* loads, unloads, and readers of a model's batcher pointer */
    tb_ks_grpc *grpc;        /* --grpc-port's service, NULL without it */
    tb_ks_grpc_host grpc_host;
    _Atomic int gen_users; /* generation streams alive (they read tok and sched):
                            * a repository LLM is freed once they are 0 */
} server;

typedef struct {
    char *body;
    size_t n, cap;
    int too_large;
} conn_state;

/* ================================================================ replies */

static enum MHD_Result reply_text(struct MHD_Connection *c, int status, const char *ctype, const char *text) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static json_t *json_text(const char *s, size_t n);

static enum MHD_Result reply_json(struct MHD_Connection *c, int status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return reply_text(c, 500, "application/json", "{\"error\":{\"message\":\"encoding failed\"}}");
    enum MHD_Result r = reply_text(c, status, "application/json", s);
    free(s);
    return r;
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    case 500: return "internal_server_error";
    default: return "invalid_request_error";
    }
}

/* OpenAI's error shape. `type` and `code` default to the status's class
 * and number (an unknown model has its own: NotFoundError, model_not_found). */
static enum MHD_Result reply_error_as(server *s, struct MHD_Connection *c, int status, const char *type,
                                      const char *code, const char *param, const char *msg) {
    if (s->metrics) tb_metrics_http_error(s->metrics, status);
    /* the message may quote the request (a URL, a parameter): not always valid UTF-8 */
    json_t *err = json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", json_text(msg, strlen(msg)), "type",
                            type ? type : error_type(status), "param",
                            param ? json_text(param, strlen(param)) : json_null(), "code",
                            code ? json_string(code) : json_integer(status));
    char *body = err ? json_dumps(err, JSON_COMPACT) : NULL;
    json_decref(err);
    if (!body) /* out of memory: a fixed body, copied by the library (which may fail too) */
        return reply_text(c, status, "application/json",
                          "{\"error\":{\"message\":\"error\",\"type\":\"internal_error\",\"param\":null,\"code\":500}}");
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { /* out of memory: the body is still ours; closing the connection is all that is left */
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (status == 429) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_error(server *s, struct MHD_Connection *c, int status, const char *param,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_error(server *s, struct MHD_Connection *c, int status, const char *param,
                                   const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reply_error_as(s, c, status, NULL, NULL, param, msg);
}

/* ================================================================ parsing */

static int grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

static void append(char **p, size_t *n, size_t *cap, const char *src, size_t len) {
    if (!grow(p, cap, *n + len + 1)) return;
    if (len) memcpy(*p + *n, src, len); /* src may be NULL when len is 0 */
    *n += len;
    (*p)[*n] = 0;
}


/* One prompt of a request: its token ids and, with echo, its text. */
typedef struct {
    int32_t *ids;          /* malloc'd */
    int n;
    char *echo;            /* malloc'd, echo_len bytes (and a NUL) */
    size_t echo_len;
} gen_prompt;

typedef struct {
    int chat, stream, include_usage;
    int max_tokens;
    int logprobs;          /* -1 none */
    int ignore_eos;
    int min_tokens;        /* EOS does not end a choice before this many tokens */
    tb_sampling_params sp;
    char stops[MAX_STOPS][MAX_STOP_LEN]; /* may hold NULs: */
    size_t stop_len[MAX_STOPS];          /* their lengths */
    int n_stops;
    gen_prompt *pr;        /* (n_pr) malloc'd: the prompts, one unless completions got a list */
    int n_pr;
    int n;                 /* choices: independent samples of each prompt */
    int echo;              /* completions: the prompt text before each choice's */
    int score_prompt;      /* echo with logprobs: the prompt's tokens scored too */
} gen_req;

static void gen_req_free(gen_req *g) {
    for (int i = 0; g->pr && i < g->n_pr; i++) {
        free(g->pr[i].ids);
        free(g->pr[i].echo);
    }
    free(g->pr);
    g->pr = NULL;
    g->n_pr = 0;
}

typedef struct {
    int status;
    const char *param;
    const char *type, *code; /* NULL: the status's */
    char msg[512];
} parse_err;

#define PERR(code, prm, ...) do { e->status = (code); e->param = (prm); snprintf(e->msg, sizeof e->msg, __VA_ARGS__); return 0; } while (0)

static int get_number(json_t *root, const char *key, double lo, double hi, double *out, parse_err *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 1;
    if (!json_is_number(v)) PERR(400, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) PERR(400, key, "'%s' must be in [%g, %g], got %g", key, lo, hi, x);
    *out = x;
    return 1;
}

static int get_int(json_t *root, const char *key, long lo, long hi, long *out, parse_err *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 1;
    if (!json_is_integer(v)) PERR(400, key, "'%s' must be an integer", key);
    long x = (long)json_integer_value(v);
    if (x < lo || x > hi) PERR(400, key, "'%s' must be in [%ld, %ld], got %ld", key, lo, hi, x);
    *out = x;
    return 1;
}

static int get_bool(json_t *root, const char *key, int *out, parse_err *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 1;
    if (!json_is_boolean(v)) PERR(400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

/* `len` bytes of `text`: a request's string may hold NULs (\u0000), which
 * are text like any other character. */
static int tokenize(server *s, const char *text, size_t len, int add_bos, int32_t **out, int *n, parse_err *e) {
    int cap = (int)(len + 8 < (size_t)s->info.max_seq_len * 4 ? len + 8 : (size_t)s->info.max_seq_len * 4);
    if (cap < 16) cap = 16;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids) PERR(500, NULL, "out of memory");
    int count = 0;
    tb_status st = tb_tokenizer_encode(s->tok, text, len, add_bos, ids, cap, &count);
    if (st == TB_ERR_RANGE || count > cap) {
        free(ids);
        PERR(400, "prompt", "This model's maximum context length is %d tokens; the prompt is longer",
             s->info.max_seq_len);
    }
    if (st != TB_OK) { free(ids); PERR(400, "prompt", "cannot tokenize the prompt: %s", tb_last_error()); }
    *out = ids;
    *n = count;
    return 1;
}

/* Whether JSON string v is exactly `lit` (length included: "user\u0000x" is not "user"). */
static int json_str_is(json_t *v, const char *lit) {
    size_t n = strlen(lit);
    return json_is_string(v) && json_string_length(v) == n && !memcmp(json_string_value(v), lit, n);
}

/* ---------------------------------------------------------------- request fields
 * Every top-level field a generation request may hold, and what the server
 * does with it. Anything else is a 400 naming the field, so that a client
 * never believes a parameter took effect when it did not. */
enum { F_COMP = 1, F_CHAT = 2, F_BOTH = 3 };
typedef enum {
    F_USED,        /* parsed and honoured                                     */
    F_IGNORED,     /* accepted, no effect here: it labels or routes the request
                    * on OpenAI's side (or only matters with tools)           */
    F_UNSUPPORTED, /* a feature this server lacks: 400 unless null or neutral */
} field_use;

static const struct {
    const char *name;
    int where;     /* F_COMP, F_CHAT */
    field_use use;
    const char *what; /* F_UNSUPPORTED: the feature, for the message */
} k_fields[] = {
    {"model", F_BOTH, F_USED, NULL},
    {"prompt", F_COMP, F_USED, NULL},
    {"messages", F_CHAT, F_USED, NULL},
    {"max_tokens", F_BOTH, F_USED, NULL},
    {"max_completion_tokens", F_BOTH, F_USED, NULL},
    {"temperature", F_BOTH, F_USED, NULL},
    {"top_p", F_BOTH, F_USED, NULL},
    {"top_k", F_BOTH, F_USED, NULL},
    {"min_p", F_BOTH, F_USED, NULL},
    {"repetition_penalty", F_BOTH, F_USED, NULL},
    {"presence_penalty", F_BOTH, F_USED, NULL},
    {"frequency_penalty", F_BOTH, F_USED, NULL},
    {"seed", F_BOTH, F_USED, NULL},
    {"n", F_BOTH, F_USED, NULL},
    {"stop", F_BOTH, F_USED, NULL},
    {"stream", F_BOTH, F_USED, NULL},
    {"stream_options", F_BOTH, F_USED, NULL},
    {"ignore_eos", F_BOTH, F_USED, NULL},
    {"min_tokens", F_BOTH, F_USED, NULL},
    {"logprobs", F_BOTH, F_USED, NULL},
    {"top_logprobs", F_CHAT, F_USED, NULL},
    {"echo", F_COMP, F_USED, NULL},
    {"user", F_BOTH, F_IGNORED, NULL},
    {"safety_identifier", F_BOTH, F_IGNORED, NULL},
    {"prompt_cache_key", F_BOTH, F_IGNORED, NULL},
    {"service_tier", F_BOTH, F_IGNORED, NULL},
    {"store", F_CHAT, F_IGNORED, NULL},
    {"metadata", F_CHAT, F_IGNORED, NULL},
    {"parallel_tool_calls", F_CHAT, F_IGNORED, NULL},
    {"tools", F_CHAT, F_UNSUPPORTED, "tool calling"},
    {"tool_choice", F_CHAT, F_UNSUPPORTED, "tool calling"},
    {"functions", F_CHAT, F_UNSUPPORTED, "function calling"},
    {"function_call", F_CHAT, F_UNSUPPORTED, "function calling"},
    {"response_format", F_CHAT, F_UNSUPPORTED, "structured output (only {\"type\": \"text\"})"},
    {"logit_bias", F_BOTH, F_UNSUPPORTED, "logit bias"},
    {"best_of", F_COMP, F_UNSUPPORTED, "best_of sampling"},
    {"suffix", F_COMP, F_UNSUPPORTED, "insertion (suffix)"},
    {"prediction", F_CHAT, F_UNSUPPORTED, "predicted outputs"},
    {"audio", F_CHAT, F_UNSUPPORTED, "audio output"},
    {"modalities", F_CHAT, F_UNSUPPORTED, "output modalities other than text"},
    {"web_search_options", F_CHAT, F_UNSUPPORTED, "web search"},
    {"reasoning_effort", F_CHAT, F_UNSUPPORTED, "reasoning effort"},
    {"verbosity", F_CHAT, F_UNSUPPORTED, "verbosity"},
};

/* A value that asks for nothing: null, or the feature's off position. */
static int neutral_value(const char *name, json_t *v) {
    if (json_is_null(v)) return 1;
    if (!strcmp(name, "response_format"))
        return json_is_object(v) && json_object_size(v) == 1 && json_str_is(json_object_get(v, "type"), "text");
    if (!strcmp(name, "logit_bias")) return json_is_object(v) && json_object_size(v) == 0;
    if (!strcmp(name, "best_of")) return json_is_integer(v) && json_integer_value(v) == 1;
    if (!strcmp(name, "modalities"))
        return json_is_array(v) && json_array_size(v) == 1 && json_str_is(json_array_get(v, 0), "text");
    return 0;
}

static int check_fields(json_t *root, int chat, parse_err *e) {
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(root, key, klen, v) {
        int k = 0, nk = (int)(sizeof k_fields / sizeof k_fields[0]);
        while (k < nk && !(strlen(k_fields[k].name) == klen && !memcmp(k_fields[k].name, key, klen))) k++;
        if (k == nk || !(k_fields[k].where & (chat ? F_CHAT : F_COMP))) {
            e->status = 400;
            e->param = k < nk ? k_fields[k].name : NULL;
            snprintf(e->msg, sizeof e->msg, "Unrecognized request argument supplied: %s%s", key,
                     k < nk ? (chat ? " (a parameter of /v1/completions)" : " (a parameter of /v1/chat/completions)") : "");
            return 0;
        }
        if (k_fields[k].use == F_UNSUPPORTED && !neutral_value(k_fields[k].name, v))
            PERR(400, k_fields[k].name, "'%s' is not supported by this server (%s)", k_fields[k].name, k_fields[k].what);
    }
    return 1;
}

/* Whether a completions prompt p is a list of prompts (strings or arrays
 * of token ids) rather than one prompt (a string or token ids). */
static int prompt_is_list(json_t *p) {
    return json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0));
}

/* One prompt of a completions request into gp: a string (tokenized) or an
 * array of token ids. idx: its place in a list of several (-1: the only
 * one), named in the messages. */
static int parse_prompt(server *s, json_t *p, int idx, gen_prompt *gp, parse_err *e) {
    char at[32] = "";
    if (idx >= 0) snprintf(at, sizeof at, " (prompt %d)", idx);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) PERR(400, "prompt", "the prompt is empty%s", at);
        return tokenize(s, json_string_value(p), json_string_length(p), s->info.add_bos, &gp->ids, &gp->n, e);
    }
    if (!json_is_array(p))
        PERR(400, "prompt", "'prompt' must be a string, an array of token ids, or a list of either%s", at);
    size_t n = json_array_size(p);
    if (n == 0) PERR(400, "prompt", "the prompt is empty%s", at);
    if (n > (size_t)s->info.max_seq_len)
        PERR(400, "prompt", "This model's maximum context length is %d tokens; the prompt%s has %zu",
             s->info.max_seq_len, at, n);
    gp->ids = malloc(sizeof(int32_t) * n);
    if (!gp->ids) PERR(500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v))
            PERR(400, "prompt", "'prompt' must be a string, an array of token ids, or a list of either%s", at);
        json_int_t t = json_integer_value(v);
        if (t < 0 || t >= s->info.vocab_size)
            PERR(400, "prompt", "token id %lld is outside the vocabulary [0, %d)%s", (long long)t, s->info.vocab_size,
                 at);
        gp->ids[i] = (int32_t)t;
    }
    gp->n = (int)n;
    return 1;
}

/* Parses the fields shared by completions and chat. */
static int parse_gen(server *s, json_t *root, int chat, gen_req *g, parse_err *e) {
    memset(g, 0, sizeof *g);
    g->chat = chat;
    g->logprobs = -1;
    tb_sampling_params_default(&g->sp);
    g->sp.temperature = 1.0f;
    g->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)atomic_fetch_add(&s->next_id, 1) << 32);
    if (!check_fields(root, chat, e)) return 0;
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) PERR(400, "model", "'model' must be a string");
        if (!json_str_is(model, s->model)) {
            /* as OpenAI answers it: the official clients raise NotFoundError */
            e->type = "NotFoundError";
            e->code = "model_not_found";
            PERR(404, "model", "The model '%s' does not exist (this server serves '%s')", json_string_value(model),
                 s->model);
        }
    }
    if (!get_bool(root, "stream", &g->stream, e)) return 0;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) PERR(400, "stream_options", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &g->include_usage, e)) return 0;
    }
    double d;
    long l;
    d = g->sp.temperature; if (!get_number(root, "temperature", 0, 2, &d, e)) return 0; g->sp.temperature = (float)d;
    d = g->sp.top_p; if (!get_number(root, "top_p", 1e-9, 1, &d, e)) return 0; g->sp.top_p = (float)d;
    d = 0; if (!get_number(root, "min_p", 0, 1, &d, e)) return 0; g->sp.min_p = (float)d;
    d = 1; if (!get_number(root, "repetition_penalty", 1e-6, 10, &d, e)) return 0; g->sp.repeat_penalty = (float)d;
    d = 0; if (!get_number(root, "presence_penalty", -2, 2, &d, e)) return 0; g->sp.presence_penalty = (float)d;
    d = 0; if (!get_number(root, "frequency_penalty", -2, 2, &d, e)) return 0; g->sp.frequency_penalty = (float)d;
    l = 0; if (!get_int(root, "top_k", -1, 1 << 30, &l, e)) return 0; g->sp.top_k = l < 0 ? 0 : (int)l;
    l = -1; if (!get_int(root, "seed", -(1L << 62), 1L << 62, &l, e)) return 0;
    if (json_object_get(root, "seed") && !json_is_null(json_object_get(root, "seed"))) g->sp.seed = (uint64_t)l;
    l = 1; if (!get_int(root, "n", 1, MAX_CHOICES, &l, e)) return 0;
    g->n = (int)l;
    if (!get_bool(root, "ignore_eos", &g->ignore_eos, e)) return 0;
    if (chat) {
        int lp = 0;
        if (!get_bool(root, "logprobs", &lp, e)) return 0;
        l = 0; if (!get_int(root, "top_logprobs", 0, TB_MAX_TOP_LOGPROBS, &l, e)) return 0;
        if (lp) g->logprobs = (int)l;
        else if (l > 0) PERR(400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        l = -1; if (!get_int(root, "logprobs", 0, TB_MAX_TOP_LOGPROBS, &l, e)) return 0;
        g->logprobs = (int)l;
    }
    json_t *stop = json_object_get(root, "stop");
    if (stop && !json_is_null(stop)) {
        if (json_is_string(stop)) {
            if (json_string_length(stop) == 0) PERR(400, "stop", "'stop' strings must not be empty");
            if (json_string_length(stop) >= MAX_STOP_LEN) PERR(400, "stop", "'stop' strings are limited to %d bytes", MAX_STOP_LEN - 1);
            g->stop_len[g->n_stops] = json_string_length(stop);
            memcpy(g->stops[g->n_stops++], json_string_value(stop), json_string_length(stop));
        } else if (json_is_array(stop)) {
            if (json_array_size(stop) > MAX_STOPS) PERR(400, "stop", "at most %d stop strings", MAX_STOPS);
            size_t i;
            json_t *v;
            json_array_foreach(stop, i, v) {
                if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= MAX_STOP_LEN)
                    PERR(400, "stop", "'stop' must hold non-empty strings of < %d bytes", MAX_STOP_LEN);
                g->stop_len[g->n_stops] = json_string_length(v);
                memcpy(g->stops[g->n_stops++], json_string_value(v), json_string_length(v));
            }
        } else {
            PERR(400, "stop", "'stop' must be a string or an array of strings");
        }
    }
    /* the prompt: a string or token ids; completions also take a list of
     * either (each prompt's choices in turn, as OpenAI orders them) */
    if (!chat) {
        json_t *p = json_object_get(root, "prompt");
        if (!p) PERR(400, "prompt", "'prompt' is required");
        const int list = prompt_is_list(p);
        const size_t np = list ? json_array_size(p) : 1;
        if (np > MAX_PROMPTS) PERR(400, "prompt", "at most %d prompts a request, got %zu", MAX_PROMPTS, np);
        g->pr = calloc(np, sizeof *g->pr);
        if (!g->pr) PERR(500, NULL, "out of memory");
        g->n_pr = (int)np;
        for (size_t k = 0; k < np; k++)
            if (!parse_prompt(s, list ? json_array_get(p, k) : p, np > 1 ? (int)k : -1, &g->pr[k], e)) return 0;
    } else {
        json_t *msgs = json_object_get(root, "messages");
        if (!json_is_array(msgs) || json_array_size(msgs) == 0)
            PERR(400, "messages", "'messages' must be a non-empty array");
        if (json_array_size(msgs) > MAX_MESSAGES) PERR(400, "messages", "at most %d messages", MAX_MESSAGES);
        tb_chat_message m[MAX_MESSAGES];
        size_t i;
        json_t *v;
        json_array_foreach(msgs, i, v) {
            json_t *role = json_object_get(v, "role"), *content = json_object_get(v, "content");
            if (!json_is_object(v) || !json_is_string(role)) PERR(400, "messages", "each message needs a string 'role'");
            static const char *const roles[] = {"system", "user", "assistant", "developer"};
            const char *r = NULL;
            for (int k = 0; k < 4 && !r; k++)
                if (json_str_is(role, roles[k])) r = roles[k];
            if (!r) PERR(400, "messages", "unknown role '%s'", json_string_value(role));
            if (!strcmp(r, "developer")) r = "system";
            if (json_is_array(content)) { /* [{"type":"text","text":...}] with one text part */
                json_t *part = json_array_size(content) == 1 ? json_array_get(content, 0) : NULL;
                content = part ? json_object_get(part, "text") : NULL;
            }
            if (!json_is_string(content)) PERR(400, "messages", "each message needs a string 'content'");
            m[i] = (tb_chat_message){r, json_string_value(content), json_string_length(content)};
        }
        g->pr = calloc(1, sizeof *g->pr);
        if (!g->pr) PERR(500, NULL, "out of memory");
        g->n_pr = 1;
        size_t tlen = 0;
        char *text = tb_chat_render(s->chat, m, (int)json_array_size(msgs), s->bos_text, &tlen);
        if (!text) PERR(500, NULL, "out of memory");
        /* formats that spell BOS out need none added */
        int add_bos = s->info.add_bos && !(s->bos_text[0] && !strncmp(text, s->bos_text, strlen(s->bos_text)));
        int ok = tokenize(s, text, tlen, add_bos, &g->pr[0].ids, &g->pr[0].n, e);
        free(text);
        if (!ok) return 0;
    }
    for (int k = 0; k < g->n_pr; k++)
        if (g->pr[k].n == 0) PERR(400, "prompt", "the prompt is empty");
    if (!chat) {
        if (!get_bool(root, "echo", &g->echo, e)) return 0;
        /* echo with logprobs: the prompt's tokens get theirs too (scoring a text) */
        g->score_prompt = g->echo && g->logprobs >= 0;
        json_t *p = json_object_get(root, "prompt");
        const int list = prompt_is_list(p);
        for (int k = 0; g->echo && k < g->n_pr; k++) { /* the prompt as given, or its token ids decoded */
            gen_prompt *gp = &g->pr[k];
            json_t *q = list ? json_array_get(p, (size_t)k) : p;
            if (json_is_string(q)) {
                gp->echo_len = json_string_length(q);
                gp->echo = malloc(gp->echo_len + 1);
                if (!gp->echo) PERR(500, NULL, "out of memory");
                memcpy(gp->echo, json_string_value(q), gp->echo_len + 1);
            } else {
                size_t cap = 0;
                int prev = -1;
                for (int i = 0; i < gp->n; i++) {
                    char piece[256];
                    size_t n = tb_tokenizer_piece(s->tok, prev, gp->ids[i], piece, sizeof piece);
                    append(&gp->echo, &gp->echo_len, &cap, piece, n);
                    prev = gp->ids[i];
                }
                if (!gp->echo) append(&gp->echo, &gp->echo_len, &cap, "", 0);
                if (!gp->echo) PERR(500, NULL, "out of memory");
            }
        }
    }
    int ctx = s->info.max_seq_len;
    int longest = 0; /* the prompt that leaves the least room */
    for (int k = 1; k < g->n_pr; k++)
        if (g->pr[k].n > g->pr[longest].n) longest = k;
    const int np = g->pr[longest].n;
    l = chat ? ctx - np : 16;
    const char *mt_key = json_object_get(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    /* 0 with echo: the prompt alone (scored with logprobs), nothing generated */
    if (!get_int(root, mt_key, !chat && g->echo ? 0 : 1, 1L << 30, &l, e)) return 0;
    g->max_tokens = (int)l;
    l = 0; if (!get_int(root, "min_tokens", 0, g->max_tokens, &l, e)) return 0;
    g->min_tokens = (int)l;
    if (np >= ctx || (long)np + g->max_tokens > ctx) {
        char which[32] = "the prompt";
        if (g->n_pr > 1) snprintf(which, sizeof which, "prompt %d", longest);
        PERR(400, "max_tokens",
             "This model's maximum context length is %d tokens. However, you requested %ld tokens (%d in %s, "
             "%d in the completion). Please reduce the length of the prompt or the completion",
             ctx, (long)np + g->max_tokens, np, which, g->max_tokens);
    }
    return 1;
}

/* A request body as JSON: an object, or NULL with the 400's message in `msg`. */
static json_t *body_json(const char *body, size_t n, char *msg, size_t cap) {
    json_error_t je;
    /* "\u0000" is valid JSON: strings keep their lengths from here on */
    json_t *root = body ? json_loadb(body, n, JSON_ALLOW_NUL, &je) : NULL;
    if (!root) {
        snprintf(msg, cap, "the body is not valid JSON%s%s", body ? ": " : "", body ? je.text : "");
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        snprintf(msg, cap, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

/* The BOS token's text for chat formats that spell it ("" when none). */
static void set_bos_text(server *s) {
    s->bos_text[0] = 0;
    if (s->info.bos_id >= 0) {
        const char *b = tb_tokenizer_token_str(s->tok, s->info.bos_id);
        if (b) snprintf(s->bos_text, sizeof s->bos_text, "%s", b);
    }
}

int tb_serve_check_request(const char *body, size_t n, int chat, const char *model, const tb_tokenizer *tok,
                           const tb_engine_info *info, tb_chat_format format, char *msg, size_t cap) {
    server *s = calloc(1, sizeof *s);
    if (!s) { snprintf(msg, cap, "out of memory"); return 500; }
    snprintf(s->model, sizeof s->model, "%s", model);
    s->tok = tok;
    s->info = *info;
    s->chat = format;
    set_bos_text(s);
    int status = 200;
    msg[0] = 0;
    json_t *root = body_json(body, n, msg, cap);
    if (!root) {
        status = 400;
    } else {
        gen_req g;
        parse_err pe = {0};
        if (!parse_gen(s, root, chat, &g, &pe)) {
            status = pe.status;
            snprintf(msg, cap, "%s", pe.msg);
        }
        gen_req_free(&g);
        json_decref(root);
    }
    free(s);
    return status;
}

/* ================================================================ generation stream */

/* One choice: a scheduler request and the text decoded from it. */
typedef struct {
    tb_request *req;
    int prev;                       /* previous token (for the log-probabilities' pieces) */
    /* the runtime's generation loop on text: stop strings and split
     * characters held back; the scheduler's own tb_gen decides the token ends
     * (EOS, min/max tokens), so this one only filters */
    tb_gen gen;
    char *text; size_t tn, tcap;    /* released text (non-streaming) or this chunk's delta */
    json_t *lp_items;               /* logprob entries of this chunk / whole reply */
    int n_gen;
    int finished;                   /* request over, all events read */
    tb_finish_reason reason;
    int stop_hit;
    int sent_role, sent_echo, sent_final; /* streaming */
    int in_chunk;                   /* tokens taken since the last event sent */
    size_t text_offset;
} gen_choice;

typedef struct {
    server *s;
    gen_req g;
    char id[48];
    long created;
    int fd;
    int http11;                     /* the client speaks HTTP/1.1: it must accept 1xx interim responses */
    int half_closed;                /* the client has sent all it will (it may still read) */
    int probed;                     /* non-streaming: the interim response that tests the client was sent */
    int n;                          /* choices */
    gen_choice *ch;                 /* (n) */
    int interval;                   /* tokens per streamed event */
    /* streaming */
    char *out; size_t on, ocap, opos;
    int sent_done;
    double last_write;
} gen_stream;

/* Replaces invalid UTF-8 with U+FFFD so the JSON encoder accepts it. */
static json_t *json_text(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *fixed = malloc(n * 3 + 1);
    if (!fixed) return json_string(""); /* out of memory: NULL only if that fails too (callers' json_pack then fails) */
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int ok = len > 0 && i + len <= n;
        for (size_t t = 1; ok && t < len; t++) ok = ((unsigned char)s[i + t] & 0xC0) == 0x80;
        json_t *probe = ok ? json_stringn(s + i, len) : NULL; /* jansson's own test of the character */
        ok = probe != NULL;
        json_decref(probe);
        if (ok) {
            memcpy(fixed + k, s + i, len);
            k += len;
            i += len;
        } else {
            memcpy(fixed + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    j = json_stringn(fixed, k);
    free(fixed);
    return j ? j : json_string("");
}

/* `prev`: the token before this position, so alternatives decode as they
 * would have appeared in the text. */
static json_t *token_lp_json(server *s, int chat, int prev, float lp, const tb_token_event *ev, const char *piece,
                             size_t plen) {
    if (chat) {
        json_t *top = json_array();
        for (int k = 0; k < ev->n_top; k++) {
            char pc[256];
            size_t n = tb_tokenizer_piece(s->tok, prev, ev->top_ids[k], pc, sizeof pc);
            json_array_append_new(top, json_pack("{s:o, s:f}", "token", json_text(pc, n), "logprob",
                                                 (double)ev->top_logprobs[k]));
        }
        json_t *bytes = json_array();
        for (size_t i = 0; i < plen; i++) json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
        return json_pack("{s:o, s:f, s:o, s:o}", "token", json_text(piece, plen), "logprob", (double)lp, "bytes",
                         bytes, "top_logprobs", top);
    }
    json_t *top = json_object();
    for (int k = 0; k < ev->n_top; k++) {
        char pc[256];
        size_t n = tb_tokenizer_piece(s->tok, prev, ev->top_ids[k], pc, sizeof pc);
        json_t *key = json_text(pc, n);
        json_object_set_new(top, json_string_value(key), json_real(ev->top_logprobs[k]));
        json_decref(key);
    }
    return json_pack("{s:o, s:f, s:o}", "token", json_text(piece, plen), "logprob", (double)lp, "top", top);
}

typedef enum { PEER_OPEN, PEER_HALF_CLOSED, PEER_GONE } peer_state;

/* What the socket says of the client, without reading from it. A reset or an
 * error (POLLERR, POLLHUP: also what a write to a peer that had closed brings
 * back) means it is gone. The end of its input (POLLRDHUP) does not: a client
 * may shut down its write side after its request (shutdown(SHUT_WR)) and
 * still read the reply; whether it closed instead, only a write tells. */
static peer_state peer_check(int fd) {
    if (fd < 0) return PEER_OPEN;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return PEER_OPEN;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return PEER_GONE;
    return p.revents & POLLRDHUP ? PEER_HALF_CLOSED : PEER_OPEN;
}

/* A non-streaming reply writes nothing until it is complete, so a client that
 * ended its input is asked by a write: an interim "100 Continue", which an
 * HTTP/1.1 client accepts before any final response (RFC 9110, 15.2). A
 * client that closed answers it with a reset (seen by peer_check); one that
 * only half-closed reads past it. Sent once, on this connection's thread while
 * the library writes nothing (the reply is not queued yet), and only when
 * nothing is left unsent, so it never lands inside other bytes. Returns 1 when
 * the write failed: the client is gone. */
static int probe_client(gen_stream *gs) {
    static const char k_continue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (gs->probed || !gs->http11) return 0;
    int unsent = 0;
    if (ioctl(gs->fd, SIOCOUTQ, &unsent) != 0 || unsent != 0) return 0; /* try again at the next check */
    gs->probed = 1;
    ssize_t k = send(gs->fd, k_continue, sizeof k_continue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    return k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

/* Decodes one generated token of choice g: its text into g->pending (and
 * what may be released into g->text), its log-probabilities into g->lp_items.
 * 0 when the token is dropped (max_tokens 0: the prompt alone). */
static int consume_event(gen_stream *gs, gen_choice *g, const tb_token_event *ev) {
    if (gs->g.max_tokens == 0) return 0;
    int prev = g->prev;
    g->prev = ev->token;
    g->n_gen++;
    if (gs->g.logprobs >= 0) {
        char piece[256];
        size_t plen = tb_tokenizer_piece(gs->s->tok, prev, ev->token, piece, sizeof piece);
        json_t *item = token_lp_json(gs->s, gs->g.chat, prev, ev->logprob, ev, piece, plen);
        json_object_set_new(item, "offset", json_integer((json_int_t)(g->text_offset + g->tn + tb_gen_held(&g->gen))));
        json_array_append_new(g->lp_items, item);
    }
    const char *text;
    size_t n;
    if (tb_gen_step(&g->gen, ev->token, &text, &n) == TB_GEN_STOP_STRING) g->stop_hit = 1;
    append(&g->text, &g->tn, &g->tcap, text, n);
    return 1;
}

/* After taking events: a stop string ends the choice (and its request);
 * so does the request's end (`fr`), which releases the rest of the text. */
static void settle(gen_stream *gs, gen_choice *g, tb_finish_reason fr) {
    if (g->finished) return;
    if (g->stop_hit) {
        tb_request_cancel(g->req, TB_FINISH_STOP);
        g->finished = 1;
        g->reason = TB_FINISH_STOP;
    } else if (fr != TB_FINISH_NONE) {
        const char *text;
        size_t n = tb_gen_flush(&g->gen, &text);
        append(&g->text, &g->tn, &g->tcap, text, n);
        g->finished = 1;
        g->reason = fr;
    }
}

/* Waits up to `timeout` for choice g's tokens; decodes them into g->text. */
static void pump(gen_stream *gs, gen_choice *g, double timeout) {
    if (g->finished) return;
    tb_token_event ev[64];
    tb_finish_reason fr = TB_FINISH_NONE;
    int n = tb_request_wait(g->req, ev, 64, &fr, timeout);
    for (int i = 0; i < n && !g->stop_hit; i++) consume_event(gs, g, &ev[i]);
    settle(gs, g, fr);
}

/* Ends every choice when the client has gone. Returns 1 then. */
static int check_client(gen_stream *gs) {
    peer_state ps = peer_check(gs->fd);
    if (ps == PEER_HALF_CLOSED) {
        gs->half_closed = 1;
        if (!gs->g.stream && probe_client(gs)) ps = PEER_GONE;
    }
    if (ps != PEER_GONE) return 0;
    for (int i = 0; i < gs->n; i++) {
        gen_choice *g = &gs->ch[i];
        if (g->finished) continue;
        tb_request_cancel(g->req, TB_FINISH_CANCELLED);
        g->finished = 1;
        g->reason = TB_FINISH_CANCELLED;
    }
    return 1;
}

/* Waits up to `timeout` for tokens of any choice (on the first unfinished
 * one: the choices run in the same steps), then takes what the others have.
 * Returns 1 when every choice is over. */
static int pump_all(gen_stream *gs, double timeout) {
    int waited = 0, open = 0;
    for (int i = 0; i < gs->n; i++) {
        gen_choice *g = &gs->ch[i];
        if (g->finished) continue;
        pump(gs, g, waited ? 0 : timeout);
        waited = 1;
        open += !g->finished;
    }
    if (open) check_client(gs);
    for (int i = 0; i < gs->n; i++)
        if (!gs->ch[i].finished) return 0;
    return 1;
}

/* The prompt of choice i: choices are each prompt's n in turn. */
static const gen_prompt *choice_prompt(const gen_stream *gs, int i) { return &gs->g.pr[i / gs->g.n]; }

/* Each prompt's tokens once (as OpenAI counts them for n > 1), completion
 * tokens of every choice; cached: each prompt's most among its choices. */
static json_t *usage_json(const gen_stream *gs) {
    int gen = 0, cached = 0, prompt = 0;
    for (int k = 0; k < gs->g.n_pr; k++) {
        prompt += gs->g.pr[k].n;
        int most = 0;
        for (int i = k * gs->g.n; i < (k + 1) * gs->g.n && i < gs->n; i++) {
            gen += gs->ch[i].n_gen;
            int c = tb_request_cached_tokens(gs->ch[i].req);
            if (c > most) most = c;
        }
        cached += most;
    }
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", prompt, "completion_tokens", gen, "total_tokens",
                     prompt + gen, "prompt_tokens_details", "cached_tokens", cached);
}

static const char *finish_str(tb_finish_reason r) {
    return r == TB_FINISH_LENGTH ? "length" : r == TB_FINISH_STOP ? "stop" : r == TB_FINISH_ERROR ? "error" : "stop";
}

/* The items (as consume_event's) of choice i's prompt tokens, scored by the
 * scheduler (score_prompt): the first token has no log-probability (null),
 * offsets count from the start of the echoed text. Those scored so far. */
static json_t *prompt_lp_items(gen_stream *gs, int i) {
    const gen_prompt *gp = choice_prompt(gs, i);
    const tb_token_event *ev = NULL;
    int scored = tb_request_prompt_logprobs(gs->ch[i].req, &ev);
    json_t *items = json_array();
    size_t off = 0;
    for (int k = 0; k <= scored && k < gp->n; k++) {
        char piece[256];
        int prev = k > 0 ? gp->ids[k - 1] : -1;
        size_t plen = tb_tokenizer_piece(gs->s->tok, prev, gp->ids[k], piece, sizeof piece);
        json_t *item;
        if (k == 0)
            item = json_pack("{s:o, s:n, s:n}", "token", json_text(piece, plen), "logprob", "top");
        else
            item = token_lp_json(gs->s, 0, prev, ev[k - 1].logprob, &ev[k - 1], piece, plen);
        json_object_set_new(item, "offset", json_integer((json_int_t)off));
        json_array_append_new(items, item);
        off += plen;
    }
    return items;
}

/* Whether choice i's prompt is scored (or its request over without it). */
static int prompt_ready(gen_stream *gs, int i) {
    const tb_token_event *ev;
    if (tb_request_prompt_logprobs(gs->ch[i].req, &ev) >= choice_prompt(gs, i)->n - 1) return 1;
    tb_finish_reason fr = TB_FINISH_NONE;
    tb_request_wait(gs->ch[i].req, NULL, 0, &fr, 0);
    return fr != TB_FINISH_NONE;
}

/* Completions' legacy logprobs object from the collected items. */
static json_t *completion_logprobs(json_t *items) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        json_array_append(tokens, json_object_get(it, "token"));
        json_array_append(lps, json_object_get(it, "logprob"));
        json_array_append(tops, json_object_get(it, "top"));
        json_array_append(offs, json_object_get(it, "offset"));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static json_t *chat_logprobs(json_t *items) {
    json_t *content = json_array();
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        json_t *c = json_deep_copy(it);
        json_object_del(c, "offset");
        json_array_append_new(content, c);
    }
    return json_pack("{s:o}", "content", content);
}

/* A chunk of choice `idx`: its text delta (and finish reason). */
static json_t *chunk_json(gen_stream *gs, int idx, const char *delta, size_t dn, const char *finish) {
    gen_choice *g = &gs->ch[idx];
    json_t *choice;
    json_t *lp = json_null();
    if (gs->g.logprobs >= 0 && json_array_size(g->lp_items) > 0)
        lp = gs->g.chat ? chat_logprobs(g->lp_items) : completion_logprobs(g->lp_items);
    if (gs->g.chat) {
        json_t *d = json_object();
        if (!g->sent_role) { json_object_set_new(d, "role", json_string("assistant")); g->sent_role = 1; }
        if (!finish || dn) json_object_set_new(d, "content", json_text(delta, dn));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", idx, "delta", d, "logprobs", lp, "finish_reason",
                           finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", idx, "text", json_text(delta, dn), "logprobs", lp,
                           "finish_reason", finish ? json_string(finish) : json_null());
    }
    json_array_clear(g->lp_items);
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", gs->id, "object",
                          gs->g.chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)gs->created,
                          "model", gs->s->model, "choices", choice);
    if (gs->g.include_usage) json_object_set_new(j, "usage", json_null());
    return j;
}

static void emit_sse(gen_stream *g, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return;
    append(&g->out, &g->on, &g->ocap, "data: ", 6);
    append(&g->out, &g->on, &g->ocap, s, strlen(s));
    append(&g->out, &g->on, &g->ocap, "\n\n", 2);
    free(s);
}

/* The event of the tokens choice i took since its last one: their text
 * (what is releasable of it) and their log-probabilities. */
static void emit_tokens(gen_stream *gs, int i) {
    gen_choice *c = &gs->ch[i];
    emit_sse(gs, chunk_json(gs, i, c->text, c->tn, NULL));
    c->text_offset += c->tn;
    c->tn = 0;
    c->in_chunk = 0;
}

/* Takes up to `budget` of choice i's ready tokens and emits one event per
 * `interval` of them, in order. A token whose text is held back (half a
 * character, a possible stop string) still gets its event, with empty text:
 * clients count tokens and read per-token log-probabilities from the events. */
static int stream_tokens(gen_stream *gs, int i, int budget) {
    gen_choice *c = &gs->ch[i];
    int emitted = 0;
    tb_token_event ev[16];
    while (!c->finished && budget > 0) {
        tb_finish_reason fr = TB_FINISH_NONE;
        int n = tb_request_wait(c->req, ev, budget < 16 ? budget : 16, &fr, 0);
        budget -= n;
        for (int k = 0; k < n && !c->stop_hit; k++) {
            if (!consume_event(gs, c, &ev[k])) continue;
            if (++c->in_chunk >= gs->interval) {
                emit_tokens(gs, i);
                emitted++;
            }
        }
        settle(gs, c, fr);
        if (n == 0) break;
    }
    return emitted;
}

/* Waits up to `timeout` until some choice has a token or has ended (on the
 * first unfinished one: the choices run in the same steps). */
static void wait_any(gen_stream *gs, double timeout) {
    for (int i = 0; i < gs->n; i++) {
        gen_choice *c = &gs->ch[i];
        if (c->finished) continue;
        tb_finish_reason fr;
        tb_request_wait(c->req, NULL, 0, &fr, timeout);
        return;
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen_stream *g = cls;
    for (;;) {
        if (g->opos < g->on) {
            size_t n = g->on - g->opos < max ? g->on - g->opos : max;
            memcpy(buf, g->out + g->opos, n);
            g->opos += n;
            g->last_write = tb_now();
            return (ssize_t)n;
        }
        g->on = g->opos = 0;
        if (g->sent_done) return MHD_CONTENT_READER_END_OF_STREAM;
        int all_done = 1, progressed = 0;
        for (int i = 0; i < g->n; i++) {
            gen_choice *c = &g->ch[i];
            if (g->g.chat && !c->sent_role) { /* chat: the role comes first, at once */
                emit_sse(g, chunk_json(g, i, "", 0, NULL));
                progressed = 1;
            }
            if (g->g.echo && !c->sent_echo) { /* completions: the prompt, as its own event */
                if (g->g.score_prompt) { /* with its tokens' scores, once the prefill has made them */
                    if (!prompt_ready(g, i)) {
                        all_done = 0;
                        continue;
                    }
                    json_decref(c->lp_items);
                    c->lp_items = prompt_lp_items(g, i);
                }
                emit_sse(g, chunk_json(g, i, choice_prompt(g, i)->echo, choice_prompt(g, i)->echo_len, NULL));
                c->sent_echo = 1;
                progressed = 1;
            }
            progressed |= stream_tokens(g, i, 16) > 0;
            /* the client went away, or stopped reading until its buffer filled */
            if (c->reason == TB_FINISH_CANCELLED) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (c->finished && !c->sent_final) {
                if (c->in_chunk > 0) emit_tokens(g, i); /* the last tokens, fewer than --stream-interval */
                emit_sse(g, chunk_json(g, i, c->text, c->tn, finish_str(c->reason)));
                c->tn = 0;
                c->sent_final = 1;
                progressed = 1;
            }
            all_done &= c->sent_final;
        }
        if (progressed) continue;
        if (all_done) {
            if (g->g.include_usage) {
                json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", g->id, "object",
                                      g->g.chat ? "chat.completion.chunk" : "text_completion", "created",
                                      (json_int_t)g->created, "model", g->s->model, "choices", "usage", usage_json(g));
                emit_sse(g, j);
            }
            append(&g->out, &g->on, &g->ocap, "data: [DONE]\n\n", 14);
            g->sent_done = 1;
            continue;
        }
        if (check_client(g)) continue; /* ends the choices: answered above */
        /* a client that ended its input is asked sooner whether it still reads */
        if (tb_now() - g->last_write > (g->half_closed ? 0.25 : 2.0)) {
            append(&g->out, &g->on, &g->ocap, ": keep-alive\n\n", 14); /* also detects a gone client */
            continue;
        }
        wait_any(g, 0.5); /* nothing to send: wait for more */
    }
}

static void gen_stream_free(gen_stream *g) {
    if (!g) return;
    for (int i = 0; g->ch && i < g->n; i++) {
        gen_choice *c = &g->ch[i];
        if (c->req) {
            if (!c->finished) tb_request_cancel(c->req, TB_FINISH_CANCELLED);
            tb_request_release(c->req);
        }
        tb_gen_free(&c->gen);
        free(c->text);
        json_decref(c->lp_items);
    }
    free(g->ch);
    gen_req_free(&g->g);
    free(g->out);
    if (g->s) atomic_fetch_sub(&g->s->gen_users, 1);
    free(g);
}

static void stream_free_cb(void *cls) { gen_stream_free(cls); }

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Makes g's choices (g->n of them, g->ch allocated: each prompt's g->g.n in
 * turn) into scheduler requests and submits them: each choice is a request
 * of its own, with its prompt and another seed (the j-th choice of every
 * prompt the same, so a prompt of a list samples as it would alone; the
 * prefix cache shares a prompt once its blocks are written). 0 with the
 * refusal in *e; the caller frees g either way. */
static int gen_start(server *s, gen_stream *g, parse_err *e) {
    for (int i = 0; i < g->n; i++) {
        gen_choice *ch = &g->ch[i];
        /* max_tokens 0 (echo): one token is made and dropped (the prefill computes its row anyway) */
        tb_request_params rp = {.max_tokens = g->g.max_tokens > 0 ? g->g.max_tokens : 1, .ignore_eos = g->g.ignore_eos,
                                .min_tokens = g->g.min_tokens, .logprobs = g->g.logprobs,
                                .score_prompt = g->g.score_prompt, .sampling = g->g.sp,
                                /* a stream's reader is the client: bounded; otherwise this thread */
                                .max_buffered = g->g.stream ? s->o.stream_buffer : 0};
        if (g->n > 1) snprintf(rp.label, sizeof rp.label, "%s choice %d", g->id, i);
        else snprintf(rp.label, sizeof rp.label, "%s", g->id);
        rp.sampling.seed += (uint64_t)(i % g->g.n) * 0x9E3779B97F4A7C15ull;
        const gen_prompt *gp = choice_prompt(g, i);
        ch->lp_items = json_array();
        ch->prev = gp->ids[gp->n - 1];
        if (g->g.echo) ch->text_offset = gp->echo_len; /* offsets count the echoed prompt */
        tb_gen_options go;
        tb_gen_options_default(&go);
        go.ignore_eos = 1; /* every event is text: the scheduler withholds the end tokens */
        go.n_stops = g->g.n_stops;
        for (int k = 0; k < g->g.n_stops; k++) {
            go.stops[k] = g->g.stops[k];
            go.stop_len[k] = g->g.stop_len[k];
        }
        if (tb_gen_init(&ch->gen, &s->info, s->tok, ch->prev, &go) != TB_OK) PERR(400, "stop", "%s", tb_last_error());
        ch->req = tb_request_new(gp->ids, gp->n, &rp, &s->info);
        if (!ch->req || !ch->lp_items) PERR(500, NULL, "out of memory");
    }
    for (int i = 0; i < g->n; i++) {
        tb_status st = tb_sched_submit(s->sched, g->ch[i].req);
        if (st == TB_OK) continue;
        for (int k = i; k < g->n; k++) g->ch[k].finished = 1; /* never submitted; earlier ones are cancelled */
        if (st == TB_ERR_RANGE) PERR(429, NULL, "%s; retry later", tb_last_error());
        if (atomic_load(&s->stopping)) PERR(503, NULL, "the server is shutting down");
        PERR(400, "prompt", "%s", tb_last_error());
    }
    return 1;
}

static enum MHD_Result handle_generate(server *s, struct MHD_Connection *c, json_t *root, int chat, int http11) {
    parse_err pe = {0};
    gen_stream *g = calloc(1, sizeof *g);
    if (!g) return reply_error(s, c, 500, NULL, "out of memory");
    g->s = s;
    atomic_fetch_add(&s->gen_users, 1);
    g->fd = connection_fd(c);
    g->http11 = http11;
    tb_metrics_request(s->metrics, chat ? "chat" : "completions");
    if (!parse_gen(s, root, chat, &g->g, &pe)) {
        gen_stream_free(g);
        return reply_error_as(s, c, pe.status, pe.type, pe.code, pe.param, pe.msg);
    }
    const int total = g->g.n * g->g.n_pr; /* choices: n for each prompt */
    if (total > tb_sched_queue_capacity(s->sched)) {
        int n = g->g.n, np = g->g.n_pr;
        gen_stream_free(g);
        if (np > 1)
            return reply_error(s, c, 400, "n", "%d prompts x n = %d choices exceed the %d requests this server queues "
                               "(--max-queue)", np, n, tb_sched_queue_capacity(s->sched));
        return reply_error(s, c, 400, "n", "n = %d choices exceed the %d requests this server queues (--max-queue)", n,
                           tb_sched_queue_capacity(s->sched));
    }
    g->ch = calloc((size_t)total, sizeof(gen_choice));
    if (!g->ch) { gen_stream_free(g); return reply_error(s, c, 500, NULL, "out of memory"); }
    g->n = total;
    g->interval = s->o.stream_interval > 0 ? s->o.stream_interval : 1;
    snprintf(g->id, sizeof g->id, "%s-%ld", chat ? "chatcmpl" : "cmpl", atomic_fetch_add(&s->next_id, 1));
    g->created = (long)time(NULL);
    parse_err se = {0};
    if (!gen_start(s, g, &se)) {
        gen_stream_free(g);
        return reply_error_as(s, c, se.status, se.type, se.code, se.param, se.msg);
    }
    if (g->g.stream) {
        g->last_write = tb_now();
        /* a client that stops reading is held to --stream-buffer tokens, not to
         * what the kernel's autotuned send buffer (megabytes) would swallow first */
        int sndbuf = STREAM_SNDBUF;
        if (g->fd >= 0) setsockopt(g->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, g,
                                                                   stream_free_cb);
        if (!r) { gen_stream_free(g); return MHD_NO; }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    while (!pump_all(g, 0.25)) {}
    json_t *choices = json_array();
    int failed = 0;
    for (int i = 0; i < g->n; i++) {
        gen_choice *ch = &g->ch[i];
        if (ch->reason == TB_FINISH_CANCELLED) { json_decref(choices); gen_stream_free(g); return MHD_NO; }
        failed |= ch->reason == TB_FINISH_ERROR;
        json_t *lp = json_null();
        if (g->g.score_prompt) { /* the prompt's tokens, then the completion's */
            json_t *all = prompt_lp_items(g, i);
            json_array_extend(all, ch->lp_items);
            lp = completion_logprobs(all);
            json_decref(all);
        } else if (g->g.logprobs >= 0) {
            lp = chat ? chat_logprobs(ch->lp_items) : completion_logprobs(ch->lp_items);
        }
        if (chat)
            json_array_append_new(choices, json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", i, "message", "role",
                                                     "assistant", "content", json_text(ch->text, ch->tn), "logprobs",
                                                     lp, "finish_reason", finish_str(ch->reason)));
        else {
            json_t *text = json_text(ch->text, ch->tn);
            if (g->g.echo) { /* the prompt, then the completion */
                const gen_prompt *gp = choice_prompt(g, i);
                char *both = malloc(gp->echo_len + ch->tn + 1);
                if (both) {
                    memcpy(both, gp->echo, gp->echo_len);
                    if (ch->tn) memcpy(both + gp->echo_len, ch->text, ch->tn);
                    json_decref(text);
                    text = json_text(both, gp->echo_len + ch->tn);
                    free(both);
                }
            }
            json_array_append_new(choices, json_pack("{s:i, s:o, s:o, s:s}", "index", i, "text", text, "logprobs", lp,
                                                     "finish_reason", finish_str(ch->reason)));
        }
    }
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", g->id, "object",
                          chat ? "chat.completion" : "text_completion", "created", (json_int_t)g->created, "model",
                          s->model, "choices", choices, "usage", usage_json(g));
    gen_stream_free(g);
    if (failed) { json_decref(j); return reply_error(s, c, 500, NULL, "generation failed"); }
    return reply_json(c, 200, j);
}

/* ================================================================ other routes */

static enum MHD_Result handle_tokenize(server *s, struct MHD_Connection *c, json_t *root) {
    json_t *p = json_object_get(root, "prompt");
    if (!p) p = json_object_get(root, "text");
    if (!json_is_string(p)) return reply_error(s, c, 400, "prompt", "'prompt' must be a string");
    int add = s->info.add_bos;
    parse_err pe = {0};
    if (!get_bool(root, "add_special_tokens", &add, &pe)) return reply_error(s, c, 400, pe.param, "%s", pe.msg);
    int32_t *ids = NULL;
    int n = 0;
    if (!tokenize(s, json_string_value(p), json_string_length(p), add, &ids, &n, &pe))
        return reply_error(s, c, pe.status, pe.param, "%s", pe.msg);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    return reply_json(c, 200, json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", n, "max_model_len",
                                        s->info.max_seq_len));
}

static enum MHD_Result handle_detokenize(server *s, struct MHD_Connection *c, json_t *root) {
    json_t *t = json_object_get(root, "tokens");
    if (!json_is_array(t)) return reply_error(s, c, 400, "tokens", "'tokens' must be an array of token ids");
    size_t n = json_array_size(t);
    char *out = NULL;
    size_t on = 0, cap = 0;
    int prev = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->info.vocab_size) {
            free(out);
            return reply_error(s, c, 400, "tokens", "token %zu is not an id in [0, %d)", i, s->info.vocab_size);
        }
        char piece[256];
        int tok = (int)json_integer_value(v);
        size_t k = tb_tokenizer_piece(s->tok, prev, tok, piece, sizeof piece);
        append(&out, &on, &cap, piece, k);
        prev = tok;
    }
    json_t *j = json_pack("{s:o}", "prompt", json_text(out ? out : "", on));
    free(out);
    return reply_json(c, 200, j);
}

static enum MHD_Result handle_models(server *s, struct MHD_Connection *c) {
    return reply_json(c, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id",
                                        s->model, "object", "model", "created", (json_int_t)time(NULL), "owned_by",
                                        "turbine", "max_model_len", s->info.max_seq_len));
}

static int authorized(server *s, struct MHD_Connection *c) {
    if (!s->o.api_key || !*s->o.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7;
    size_t a = strlen(k), b = strlen(s->o.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(k[i] ^ s->o.api_key[i]);
    return diff == 0;
}

/* Whether the request's Content-Length exceeds `limit` bytes. */
static int body_declared_too_large(struct MHD_Connection *c, size_t limit) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl) return 0;
    while (*cl == ' ' || *cl == '\t') cl++;
    if (*cl < '0' || *cl > '9') return 0; /* malformed: the library answers it */
    unsigned long long v = 0;
    for (; *cl >= '0' && *cl <= '9'; cl++) {
        if (v > (ULLONG_MAX - 9) / 10) return 1; /* beyond any limit */
        v = v * 10 + (unsigned)(*cl - '0');
    }
    return v > (unsigned long long)limit;
}

/* ================================================================ KServe v2 */

#define TB_SERVE_VERSION "0.1.0" /* /v2's "version": as `turbine --version` */

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* {"error": msg} with the status; counted with the server's HTTP errors. */
static enum MHD_Result v2_error(server *s, struct MHD_Connection *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result v2_error(server *s, struct MHD_Connection *c, int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->metrics) tb_metrics_http_error(s->metrics, status);
    char *body = tb_ks_error_json(msg);
    if (!body) return reply_text(c, status, "application/json", "{\"error\":\"error\"}");
    enum MHD_Result r = reply_text(c, status, "application/json", body);
    free(body);
    return r;
}

static enum MHD_Result reply_owned(struct MHD_Connection *c, int status, const char *ctype, char *body, size_t n,
                                   size_t header_len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (header_len) {
        char hl[32];
        snprintf(hl, sizeof hl, "%zu", header_len);
        MHD_add_response_header(r, "Inference-Header-Content-Length", hl);
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* The model a v2 path names: 404's message in `msg` when none (an unknown
 * name, or a version the model does not have). Without a version: the
 * highest ready version, else the highest one (its requests get 503). */
static model *find_model(server *s, const char *name, const char *version, char *msg, size_t cap) {
    model *best = NULL;
    int n = atomic_load(&s->n_models), named = 0;
    for (int i = 0; i < n; i++) {
        model *m = s->models[i];
        if (strcmp(m->name, name) != 0 || !m->version[0]) { named |= !strcmp(m->name, name); continue; }
        named = 1;
        if (version[0]) {
            if (!strcmp(m->version, version)) return m;
            continue;
        }
        int r = atomic_load(&m->ready), br = best ? atomic_load(&best->ready) : 0;
        if (!best || r > br || (r == br && atoll(m->version) > atoll(best->version))) best = m;
    }
    if (best) return best;
    if (named && version[0]) snprintf(msg, cap, "model '%s' has no version '%s'", name, version);
    else snprintf(msg, cap, "unknown model '%s'", name);
    return NULL;
}

/* Adds a model to the table; NULL when out of memory or the table is full. */
static model *model_add(server *s, const char *name, const char *version, tb_engine *e) {
    if (s->n_models == MAX_MODELS) return NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->version, sizeof m->version, "%s", version);
    m->e = e;
    m->state = "LOADING";
    s->models[s->n_models] = m;
    atomic_fetch_add(&s->n_models, 1);
    return m;
}

/* "4,8" into c->preferred_batch_size. */
static tb_status parse_preferred(const char *text, tb_batcher_config *c) {
    c->n_preferred = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > TB_BATCHER_MAX_BATCH || (*end && *end != ','))
            return tb_errorf(TB_ERR_INVALID_ARG, "--preferred-batch-size '%s': expected sizes like 4,8", text);
        if (c->n_preferred == TB_BATCHER_MAX_PREFERRED)
            return tb_errorf(TB_ERR_INVALID_ARG, "--preferred-batch-size: at most %d sizes", TB_BATCHER_MAX_PREFERRED);
        c->preferred_batch_size[c->n_preferred++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return TB_OK;
}

/* --model-warmup as tb_batcher_config.warmup: -1 auto (unset too), 1 on, 0
 * off, -2 not a value. */
static int warmup_flag(const char *w) {
    if (!w || !*w || !strcmp(w, "auto")) return -1;
    return !strcmp(w, "on") ? 1 : !strcmp(w, "off") ? 0 : -2;
}

/* The batcher settings of `turbine serve FILE.engine`: the serve flags over
 * the defaults. Merging is on (max batch 8, lowered by the batcher to the
 * profile's largest dim 0) only when dim 0 of the engine's first input
 * varies in its profile; the delay defaults to 0, so requests merge only
 * when they arrive while the engine is busy and an idle server adds no
 * latency (Triton's default too). */
static tb_status serve_batcher_config(const tb_serve_options *o, const tb_engine *e, tb_batcher_config *c) {
    tb_batcher_config_default(c);
    (void)e;
    if (o->max_batch_size >= 0) c->max_batch_size = o->max_batch_size;
    if (o->preferred_batch_size && *o->preferred_batch_size) TB_TRY(parse_preferred(o->preferred_batch_size, c));
    if (o->max_queue_delay_us >= 0) c->max_queue_delay_us = o->max_queue_delay_us;
    if (o->max_queue_size >= 0) c->max_queue_size = o->max_queue_size;
    if (o->instance_count > 0) c->instance_count = o->instance_count;
    if (o->request_timeout_us >= 0) c->default_timeout_us = o->request_timeout_us;
    if (o->threads > 0) c->threads_per_instance = o->threads / c->instance_count > 0 ? o->threads / c->instance_count : 1;
    c->device = o->device;
    if ((c->warmup = warmup_flag(o->model_warmup)) < -1)
        return tb_errorf(TB_ERR_INVALID_ARG, "--model-warmup '%s': auto, on or off", o->model_warmup);
    return TB_OK;
}

/* A general engine's batcher and its inputs' and outputs' descriptions.
 * On failure m->b is NULL and the engine is still the caller's. */
/* Bytes in use on `device` (total less free, the driver's figure), or 0
 * when it is not a GPU or cannot say. `device` NULL or a bare kind ("cuda")
 * means its first device. */
static uint64_t device_used_bytes(const char *device) {
    char kind[16];
    int idx;
    if (!device || tb_device_parse(device, kind, &idx) != TB_OK || strcmp(kind, "cuda") != 0) return 0;
    uint64_t total = 0, avail = 0;
    if (tb_backend_memory(device, &total, &avail) != TB_OK || avail > total) return 0;
    return total - avail;
}

/* The device a model's executors or context run on: the option, else the
 * backend its engine was built for. */
static const char *model_device(const char *option, const tb_engine *e) {
    return option && *option ? option : e->backend;
}

/* The gauge's value: what the device lost between `before` and now (0 when
 * it gained: another process freed memory meanwhile). */
static uint64_t used_since(const char *device, uint64_t before) {
    uint64_t now = device_used_bytes(device);
    return now > before ? now - before : 0;
}

static tb_status model_load_batcher(model *m, const tb_batcher_config *c) {
    tb_batcher_config bc = *c;
    /* engines without a dynamic dim 0 cannot merge: no batching unless asked */
    TB_TRY(tb_batcher_create(m->e, &bc, &m->b));
    m->n_in = tb_batcher_n_inputs(m->b);
    m->timeout_override = 1;
    m->n_out = tb_batcher_n_outputs(m->b);
    tb_status st = TB_OK;
    if (m->n_in > TB_KS_MAX_IO || m->n_out > TB_KS_MAX_IO)
        st = tb_errorf(TB_ERR_UNSUPPORTED, "the engine has %d inputs and %d outputs; the server takes at most %d",
                       m->n_in, m->n_out, TB_KS_MAX_IO);
    for (int i = 0; st == TB_OK && i < m->n_in; i++) st = tb_batcher_input_info(m->b, i, &m->in[i]);
    for (int i = 0; st == TB_OK && i < m->n_out; i++) st = tb_batcher_output_info(m->b, i, &m->out[i]);
    if (st != TB_OK) {
        tb_batcher_free(m->b);
        m->b = NULL;
        return st;
    }
    const char *note = tb_batcher_note(m->b);
    if (note[0]) fprintf(stderr, "turbine: warning: model '%s': %s\n", m->name, note);
    return TB_OK;
}

static void llm_close(struct server *s);

static void model_free(model *m) {
    if (!m) return;
    if (m->b) {
        tb_batcher_free(m->b); /* runs what is queued first */
        tb_engine_free(m->e);
    }
    if (m->llm) {
        llm_close(m->llm); /* the engine is the LLM's own */
        tb_metrics_free(m->llm->metrics);
        free(m->llm);
    }
    free(m);
}

/* Whether a model version holds an engine (a batcher or a repository LLM's
 * scheduler) that an unload would free. */
static int model_loaded(const model *m) { return m->b || (m->llm && m->llm->sched); }

/* The engine call of one infer request, through the model's dynamic
 * batcher: inputs in the model's order; out[] points into *owned, one
 * buffer the caller frees. timeout_us as tb_batcher_infer takes it. This
 * is the one place a request meets the engine. */
static tb_status model_infer(model *m, const tb_tensor *in, int n_in, int64_t timeout_us, tb_tensor *out, int n_out,
                             void **owned) {
    *owned = NULL;
    tb_batcher_result r;
    TB_TRY(tb_batcher_infer(m->b, in, n_in, timeout_us, &r));
    for (int k = 0; k < n_out && k < r.n_outputs; k++) out[k] = r.outputs[k];
    *owned = r.block_; /* the outputs' one allocation (tb_batcher_result_free frees just this) */
    return TB_OK;
}

/* The value of Inference-Header-Content-Length: -1 when absent, -2 when
 * not a decimal number. */
static long long header_length(struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    if (!h) return -1;
    while (*h == ' ' || *h == '\t') h++;
    if (*h < '0' || *h > '9') return -2;
    long long v = 0;
    for (; *h >= '0' && *h <= '9'; h++) {
        if (v > (LLONG_MAX - 9) / 10) return -2;
        v = v * 10 + (*h - '0');
    }
    while (*h == ' ' || *h == '\t') h++;
    return *h ? -2 : v;
}

/* Sampling parameters a v2 request of an LLM may give in its "parameters"
 * (the names of the OpenAI API, which checks their ranges); others are
 * refused by name, but for the protocol's own. */
static const char *const k_llm_params[] = {"temperature", "top_p", "top_k", "min_p", "seed", "max_tokens",
                                           "min_tokens", "stop", "ignore_eos", "repetition_penalty",
                                           "presence_penalty", "frequency_penalty", NULL};

/* The generation of a parsed v2 request rq of LLM model m (text_input,
 * optional max_tokens, rq->params), submitted and left running: the prompt
 * as /v1/completions takes it, greedy unless parameters.temperature says
 * otherwise, max_tokens from the input, else parameters.max_tokens, else 16.
 * fd: the client's socket, whose closing cancels the generation (-1: none).
 * streaming (gRPC ModelStreamInfer): parameters "stream" and
 * "triton_enable_empty_final_response" are the streaming call's own, acted
 * on by the service, and passed over. 200 with *out (free it with
 * gen_stream_free), else an HTTP status and msg. */
static int llm_text_start(server *s, model *m, const tb_ks_request *rq, int fd, int streaming, gen_stream **out,
                          char *msg, size_t cap) {
    server *ls = m->llm ? m->llm : s; /* a repository LLM, or the server's own */
    json_t *root = NULL, *params = NULL;
    gen_stream *g = NULL;
    int st = 200;
    *out = NULL;
    const char *text;
    size_t tlen;
    if (!tb_ks_bytes_get(rq->inputs[0].data, rq->in_size[0], 0, &text, &tlen)) {
        snprintf(msg, cap, "text_input holds no element");
        return 400;
    }
    root = json_object();
    if (!root || json_object_set_new(root, "prompt", json_stringn(text, tlen)) ||
        json_object_set_new(root, "temperature", json_integer(0)) ||
        json_object_set_new(root, "max_tokens", json_integer(16))) {
        st = 500;
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    if (rq->params) {
        json_error_t je;
        params = json_loads(rq->params, JSON_ALLOW_NUL, &je);
        if (!params) {
            st = 500;
            snprintf(msg, cap, "out of memory");
            goto done;
        }
        const char *k;
        json_t *v;
        json_object_foreach(params, k, v) {
            /* stream: the service's; triton_enable_empty_final_response: met already, the last
             * response always saying triton_final_response */
            if (!strcmp(k, "binary_data_output") || !strcmp(k, "timeout") ||
                (streaming && (!strcmp(k, "stream") || !strcmp(k, "triton_enable_empty_final_response"))))
                continue;
            int known = 0;
            for (int i = 0; k_llm_params[i]; i++) known |= !strcmp(k, k_llm_params[i]);
            if (!known) {
                st = 400;
                snprintf(msg, cap, "parameters.%s is not a parameter of this model (it takes %stemperature, "
                         "top_p, top_k, min_p, seed, max_tokens, min_tokens, stop, ignore_eos, repetition_penalty, "
                         "presence_penalty, frequency_penalty)", k, streaming ? "stream, " : "");
                goto done;
            }
            json_object_set(root, k, v);
        }
    }
    if (rq->given[1]) json_object_set_new(root, "max_tokens", json_integer(*(const int32_t *)rq->inputs[1].data));
    g = calloc(1, sizeof *g);
    gen_choice *ch = g ? calloc(1, sizeof *ch) : NULL;
    if (!ch) {
        free(g);
        g = NULL;
        st = 500;
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    g->s = ls;
    atomic_fetch_add(&ls->gen_users, 1);
    g->ch = ch;
    g->fd = fd; /* a client that leaves cancels its generation (-1: the caller sees to it) */
    parse_err pe = {0};
    if (!parse_gen(ls, root, 0, &g->g, &pe)) {
        st = pe.status;
        snprintf(msg, cap, "%s", pe.msg);
        goto done;
    }
    g->n = 1;
    g->interval = 1;
    snprintf(g->id, sizeof g->id, "v2-%ld", atomic_fetch_add(&ls->next_id, 1));
    if (!gen_start(ls, g, &pe)) {
        st = pe.status;
        snprintf(msg, cap, "%s", pe.msg);
        goto done;
    }
    *out = g;
    g = NULL;
done:
    json_decref(root);
    json_decref(params);
    gen_stream_free(g);
    return st;
}


/* v2 infer of an LLM (a repository's or the server's own engine), as
 * Triton's vLLM and TensorRT-LLM backends take it (see llm_text_start);
 * text_output is the generated text alone. The request goes through the
 * same parse_gen and scheduler as the OpenAI API. 200 with *ser (malloc'd)
 * text_output's one BYTES element serialized (*ser_n bytes), else an HTTP
 * status and msg; 0 when the client left (fd closed) and the generation was
 * cancelled. Shared by the HTTP and gRPC v2 routes. */
static int llm_text_infer(server *s, model *m, const tb_ks_request *rq, int fd, char **ser_out, size_t *ser_n,
                          char *msg, size_t cap) {
    *ser_out = NULL;
    *ser_n = 0;
    gen_stream *g = NULL;
    int st = llm_text_start(s, m, rq, fd, 0, &g, msg, cap);
    if (st != 200) return st;
    gen_choice *ch = g->ch;
    while (!pump_all(g, 0.25)) {}
    if (ch->reason == TB_FINISH_CANCELLED) { /* the client is gone */
        st = 0;
        goto done;
    }
    if (ch->reason == TB_FINISH_ERROR) {
        st = 500;
        snprintf(msg, cap, "generation failed");
        goto done;
    }
    /* text_output: one BYTES element, the generated text */
    if (ch->tn > TB_KS_MAX_ELEM_BYTES) ch->tn = TB_KS_MAX_ELEM_BYTES;
    char *ser = malloc(4 + ch->tn);
    if (!ser) {
        st = 500;
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    uint32_t len = (uint32_t)ch->tn;
    memcpy(ser, &len, 4); /* little-endian host (kserve.c checks) */
    if (ch->tn) memcpy(ser + 4, ch->text, ch->tn);
    *ser_out = ser;
    *ser_n = 4 + ch->tn;
done:
    gen_stream_free(g);
    return st;
}

/* v2 infer of an LLM (a repository's or the server's own engine), as
 * Triton's vLLM and TensorRT-LLM backends take it: text_input's one string
 * is the prompt (as /v1/completions takes it), generated greedily unless
 * parameters.temperature says otherwise, max_tokens from the input, else
 * parameters.max_tokens, else 16; text_output is the generated text alone.
 * The request goes through the same parse_gen and scheduler as the OpenAI
 * API. */
static enum MHD_Result v2_llm_infer(server *s, struct MHD_Connection *c, model *m, conn_state *cs) {
    uint64_t t0 = mono_ns();
    tb_ks_request rq;
    tb_ks_error err;
    int st;
    char msg[1024] = "";
    long long hl = header_length(c);
    char *body = NULL, *ser = NULL;
    size_t ser_n = 0;
    memset(&rq, 0, sizeof rq);
    if (cs->too_large) {
        st = 413;
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes", s->o.max_body_bytes);
        goto fail;
    }
    if (hl == -2) {
        st = 400;
        snprintf(msg, sizeof msg, "Inference-Header-Content-Length must be a decimal byte count");
        goto fail;
    }
    st = tb_ks_parse_infer_opt(cs->body, cs->n, hl, m->in, m->n_in, 2 /* max_tokens */, m->out, m->n_out, 0, &rq,
                               &err);
    if (st != 200) {
        snprintf(msg, sizeof msg, "%s", err.msg);
        goto fail;
    }
    st = llm_text_infer(s, m, &rq, connection_fd(c), &ser, &ser_n, msg, sizeof msg);
    if (st == 0) { /* the client is gone */
        tb_ks_request_free(&rq);
        return MHD_NO;
    }
    if (st != 200) goto fail;
    tb_tensor out = {.dtype = TB_KS_BYTES, .rank = 1, .dims = {1}, .data = ser};
    size_t n = 0, hlen = 0;
    st = tb_ks_encode_response(m->name, m->version, &rq, m->out, &out, 1, &body, &n, &hlen, &err);
    free(ser);
    if (st != 200) {
        snprintf(msg, sizeof msg, "%s", err.msg);
        goto fail;
    }
    tb_ks_request_free(&rq);
    atomic_fetch_add(&m->n_success, 1);
    atomic_fetch_add(&m->ns_success, mono_ns() - t0);
    atomic_store(&m->last_ms, (unsigned long long)time(NULL) * 1000ull);
    return reply_owned(c, 200, hlen ? "application/octet-stream" : "application/json", body, n, hlen);
fail:
    tb_ks_request_free(&rq);
    atomic_fetch_add(&m->n_fail, 1);
    atomic_fetch_add(&m->ns_fail, mono_ns() - t0);
    return v2_error(s, c, st, "%s", msg);
}

static enum MHD_Result v2_infer(server *s, struct MHD_Connection *c, model *m, conn_state *cs) {
    uint64_t t0 = mono_ns();
    if (m->llm || m->is_llm) return v2_llm_infer(s, c, m, cs);
    tb_ks_request rq;
    tb_ks_error err;
    int st;
    long long hl = header_length(c);
    if (cs->too_large) {
        st = 413;
        snprintf(err.msg, sizeof err.msg, "the request body exceeds %zu bytes", s->o.max_body_bytes);
    } else if (hl == -2) {
        st = 400;
        snprintf(err.msg, sizeof err.msg, "Inference-Header-Content-Length must be a decimal byte count");
    } else {
        st = tb_ks_parse_infer(cs->body, cs->n, hl, m->in, m->n_in, m->out, m->n_out, 0, &rq, &err);
    }
    if (st != 200) {
        atomic_fetch_add(&m->n_fail, 1);
        atomic_fetch_add(&m->ns_fail, mono_ns() - t0);
        return v2_error(s, c, st, "%s", err.msg);
    }
    tb_tensor outs[TB_KS_MAX_IO];
    memset(outs, 0, sizeof outs);
    void *owned = NULL;
    /* parameters.timeout when the model allows it; 0: the model's default */
    int64_t timeout_us = m->timeout_override && rq.timeout_us > 0 ? (int64_t)rq.timeout_us : 0;
    tb_status ts = model_infer(m, rq.inputs, rq.n_inputs, timeout_us, outs, m->n_out, &owned);
    if (ts != TB_OK) {
        tb_ks_request_free(&rq);
        atomic_fetch_add(&m->n_fail, 1);
        atomic_fetch_add(&m->ns_fail, mono_ns() - t0);
        /* a shape outside the profile that the per-dim check could not see
         * (dims that must agree) or rows above max_batch_size are the
         * request's fault; a full queue is 429 and a request that waited
         * past its deadline 504 (Triton answers both with 400 over HTTP;
         * these say what happened and that a retry may succeed) */
        int code = ts == TB_ERR_RANGE || ts == TB_ERR_INVALID_ARG ? 400
                   : ts == TB_ERR_QUEUE_FULL                      ? 429
                   : ts == TB_ERR_TIMEOUT                         ? 504
                                                                  : 500;
        return v2_error(s, c, code, "inference failed: %s", tb_last_error());
    }
    char *body = NULL;
    size_t n = 0, hlen = 0;
    st = tb_ks_encode_response(m->name, m->version, &rq, m->out, outs, m->n_out, &body, &n, &hlen, &err);
    tb_ks_request_free(&rq);
    free(owned);
    if (st != 200) {
        atomic_fetch_add(&m->n_fail, 1);
        atomic_fetch_add(&m->ns_fail, mono_ns() - t0);
        return v2_error(s, c, st, "%s", err.msg);
    }
    atomic_fetch_add(&m->n_success, 1);
    atomic_fetch_add(&m->ns_success, mono_ns() - t0);
    atomic_store(&m->last_ms, (unsigned long long)time(NULL) * 1000ull);
    return reply_owned(c, 200, hlen ? "application/octet-stream" : "application/json", body, n, hlen);
}

/* A model version's counters for the statistics extension (HTTP and
 * gRPC). The caller holds s->load_mu (the batcher may be unloaded). */
static void model_stats_of(model *m, tb_ks_model_stats *o) {
    tb_batcher_stats bs;
    memset(&bs, 0, sizeof bs);
    if (m->b) tb_batcher_get_stats(m->b, &bs);
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", m->name);
    snprintf(o->version, sizeof o->version, "%s", m->version);
    o->last_ms = atomic_load(&m->last_ms);
    o->inference_count = bs.inferences;
    o->execution_count = bs.executions;
    o->success_n = atomic_load(&m->n_success);
    o->success_ns = atomic_load(&m->ns_success);
    o->fail_n = atomic_load(&m->n_fail);
    o->fail_ns = atomic_load(&m->ns_fail);
    o->queue_n = o->compute_n = bs.success;
    o->queue_ns = bs.queue_us_sum * 1000;
    o->compute_ns = bs.compute_us_sum * 1000;
}

/* Triton's statistics extension, for one model. */
static enum MHD_Result v2_stats(server *s, struct MHD_Connection *c, model *m) {
    tb_ks_model_stats o;
    pthread_mutex_lock(&s->load_mu);
    model_stats_of(m, &o);
    pthread_mutex_unlock(&s->load_mu);
    json_t *j = json_pack(
        "{s:[{s:s, s:s, s:I, s:I, s:I, s:{s:{s:I, s:I}, s:{s:I, s:I}, s:{s:I, s:I}, s:{s:I, s:I}}}]}", "model_stats",
        "name", o.name, "version", o.version, "last_inference", (json_int_t)o.last_ms,
        "inference_count", (json_int_t)o.inference_count, "execution_count", (json_int_t)o.execution_count,
        "inference_stats", "success", "count", (json_int_t)o.success_n, "ns", (json_int_t)o.success_ns, "fail",
        "count", (json_int_t)o.fail_n, "ns", (json_int_t)o.fail_ns, "queue", "count", (json_int_t)o.queue_n, "ns",
        (json_int_t)o.queue_ns, "compute_infer", "count", (json_int_t)o.compute_n, "ns", (json_int_t)o.compute_ns);
    if (!j) return reply_text(c, 500, "application/json", "{\"error\":\"out of memory\"}");
    return reply_json(c, 200, j);
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static void label_escape(char *dst, size_t cap, const char *src) {
    size_t k = 0;
    for (; *src && k + 3 < cap; src++) {
        if (*src == '\\' || *src == '"') { dst[k++] = '\\'; dst[k++] = *src; }
        else if (*src == '\n') { dst[k++] = '\\'; dst[k++] = 'n'; }
        else dst[k++] = *src;
    }
    dst[k] = 0;
}

/* Appends to the metrics text; false once it would not fit (cap bounds it). */
typedef struct {
    char *p;
    size_t n, cap;
} text_buf;

static void tput(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tput(text_buf *t, const char *fmt, ...) {
    if (t->n >= t->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    t->n = k < 0 || (size_t)k >= t->cap - t->n ? t->cap : t->n + (size_t)k;
}

/* One histogram family of one model: `counts` per bucket (not cumulative),
 * `bounds` the upper bounds of all but the last (+Inf) bucket. */
static void put_hist(text_buf *t, const char *name, const char *ln, const char *lv, const double *bounds,
                     const uint64_t *counts, int n_buckets, double sum) {
    uint64_t cum = 0;
    for (int i = 0; i < n_buckets; i++) {
        cum += counts[i];
        if (i < n_buckets - 1)
            tput(t, "%s_bucket{model=\"%s\",version=\"%s\",le=\"%.9g\"} %llu\n", name, ln, lv, bounds[i],
                 (unsigned long long)cum);
        else
            tput(t, "%s_bucket{model=\"%s\",version=\"%s\",le=\"+Inf\"} %llu\n", name, ln, lv,
                 (unsigned long long)cum);
    }
    tput(t, "%s_sum{model=\"%s\",version=\"%s\"} %.17g\n", name, ln, lv, sum);
    tput(t, "%s_count{model=\"%s\",version=\"%s\"} %llu\n", name, ln, lv, (unsigned long long)cum);
}

#define N_BATCH_LE 8 /* le 1 2 4 8 16 32 64 +Inf */

/* The per-model counters, histograms and gauge in the Prometheus text
 * format, after the rest; every figure but the requests' own comes from
 * the model's batcher (one snapshot per model, so they agree). */
/* A repository's metrics: the scheduler gauges of each loaded language
 * model under its name and version (read under the load lock, as
 * v2_metrics reads the batchers), then the shared token and latency series. */
static char *repo_metrics(server *s) {
    enum { MAX_LLM = 64 };
    tb_sched_stats st[MAX_LLM];
    tb_metrics *per[MAX_LLM];
    char names[MAX_LLM][4 * TB_KS_MAX_NAME + 32];
    const char *np[MAX_LLM];
    int n = 0;
    /* under load_mu: an unload may not free a model's metrics meanwhile */
    pthread_mutex_lock(&s->load_mu);
    if (atomic_load(&s->ready)) {
        int nm = atomic_load(&s->n_models);
        for (int i = 0; i < nm && n < MAX_LLM; i++) {
            model *m = s->models[i];
            if (!m->llm || !m->llm->sched || !atomic_load(&m->ready) || !m->llm->metrics) continue;
            tb_sched_get_stats(m->llm->sched, &st[n]);
            per[n] = m->llm->metrics;
            char ln[2 * TB_KS_MAX_NAME], lv[2 * TB_KS_MAX_NAME];
            label_escape(ln, sizeof ln, m->name);
            label_escape(lv, sizeof lv, m->version);
            snprintf(names[n], sizeof names[n], "model=\"%s\",version=\"%s\"", ln, lv);
            np[n] = names[n];
            n++;
        }
    }
    char *text = tb_metrics_render_n(s->metrics, n ? per : NULL, st, np, n, s->model);
    pthread_mutex_unlock(&s->load_mu);
    return text;
}

static void v2_metrics(server *s, char **text) {
    static const struct {
        const char *name, *help, *type;
    } fam[] = {
        {"turbine_inference_request_success_total", "KServe v2 infer requests answered (nv_inference_request_success).",
         "counter"},
        {"turbine_inference_request_failure_total", "KServe v2 infer requests refused or failed "
         "(nv_inference_request_failure).", "counter"},
        {"turbine_inference_count_total", "Inferences: batch rows computed (nv_inference_count).", "counter"},
        {"turbine_inference_exec_count_total", "Engine calls (nv_inference_exec_count).", "counter"},
        {"turbine_inference_request_duration_seconds_total", "Time of successful infer requests from parse to "
         "encoded response (nv_inference_request_duration_us).", "counter"},
        {"turbine_inference_queue_duration_seconds_total", "Time successful requests waited in the batcher's queue "
         "(nv_inference_queue_duration_us).", "counter"},
        {"turbine_inference_compute_duration_seconds_total", "Time of the engine calls of successful requests "
         "(nv_inference_compute_infer_duration_us).", "counter"},
        {"turbine_inference_pending_requests", "Requests waiting in the batcher's queue now "
         "(nv_inference_pending_request_count).", "gauge"},
        {"turbine_inference_batch_size", "Rows of each engine call the dynamic batcher made.", "histogram"},
        {"turbine_inference_queue_duration_us", "Microseconds each successful request waited in the queue.",
         "histogram"},
        {"turbine_inference_compute_duration_us", "Microseconds of the engine call of each successful request "
         "(merge, run, split).", "histogram"},
        {"turbine_model_gpu_memory_bytes", "Device memory the model's load took: weights, KV pool, workspaces "
         "(driver's used bytes after less before; 0 on the CPU).", "gauge"},
    };
    enum { N_FAM = sizeof fam / sizeof fam[0] };
    int nm = atomic_load(&s->n_models);
    size_t n = strlen(*text), cap = n + 1 + 8192 + (size_t)nm * 64 * 256;
    char *p = realloc(*text, cap);
    if (!p) return;
    *text = p;
    text_buf t = {p, n, cap - 1};
    tb_batcher_stats *bs = calloc((size_t)nm + 1, sizeof *bs);
    if (!bs) return;
    char bs_valid[MAX_MODELS] = {0};
    pthread_mutex_lock(&s->load_mu);
    for (int i = 0; i < nm; i++)
        if (s->models[i]->b) {
            tb_batcher_get_stats(s->models[i]->b, &bs[i]);
            bs_valid[i] = 1;
        }
    pthread_mutex_unlock(&s->load_mu);
    static const double batch_le[N_BATCH_LE - 1] = {1, 2, 4, 8, 16, 32, 64};
    double us_le[TB_BATCHER_US_BUCKETS - 1];
    for (int k = 0; k < TB_BATCHER_US_BUCKETS - 1; k++) us_le[k] = (double)TB_BATCHER_US_BOUNDS[k];
    for (int f = 0; f < N_FAM; f++) {
        tput(&t, "# HELP %s %s\n# TYPE %s %s\n", fam[f].name, fam[f].help, fam[f].name, fam[f].type);
        for (int i = 0; i < nm; i++) {
            model *m = s->models[i];
            /* LLM entries have the scheduler's metrics; an unloaded or failed
             * version has no batcher: its series go until it is loaded again */
            if (f == 11) {
                /* every loaded model, the LLM too: LLM entries are always loaded */
                if (!m->is_llm && !bs_valid[i]) continue;
                char ln[2 * TB_KS_MAX_NAME], lv[2 * TB_KS_MAX_NAME];
                label_escape(ln, sizeof ln, m->name);
                label_escape(lv, sizeof lv, m->version);
                tput(&t, "%s{model=\"%s\",version=\"%s\"} %llu\n", fam[f].name, ln, lv,
                     (unsigned long long)atomic_load(&m->gpu_bytes));
                continue;
            }
            if (m->is_llm || !bs_valid[i]) continue;
            const tb_batcher_stats *st = &bs[i];
            char ln[2 * TB_KS_MAX_NAME], lv[2 * TB_KS_MAX_NAME];
            label_escape(ln, sizeof ln, m->name);
            label_escape(lv, sizeof lv, m->version);
            if (f == 8) {
                /* batch_hist[r]: calls of exactly r rows (the last: more than 63) */
                uint64_t c[N_BATCH_LE] = {0};
                double sum = 0;
                for (int r = 0; r < TB_BATCHER_BATCH_BUCKETS; r++) {
                    int k = 0;
                    while (k < N_BATCH_LE - 1 && r > batch_le[k]) k++;
                    if (r == TB_BATCHER_BATCH_BUCKETS - 1) k = N_BATCH_LE - 1;
                    c[k] += st->batch_hist[r];
                    if (r < TB_BATCHER_BATCH_BUCKETS - 1) sum += (double)r * (double)st->batch_hist[r];
                }
                /* the rows of calls above 63 are not kept one by one: every
                 * row computed, less those of the smaller calls */
                if (st->batch_hist[TB_BATCHER_BATCH_BUCKETS - 1] && (double)st->inferences > sum)
                    sum = (double)st->inferences;
                put_hist(&t, fam[f].name, ln, lv, batch_le, c, N_BATCH_LE, sum);
                continue;
            }
            if (f == 9 || f == 10) {
                put_hist(&t, fam[f].name, ln, lv, us_le, f == 9 ? st->queue_us_hist : st->compute_us_hist,
                         TB_BATCHER_US_BUCKETS, (double)(f == 9 ? st->queue_us_sum : st->compute_us_sum));
                continue;
            }
            double v;
            switch (f) {
            case 0: v = (double)atomic_load(&m->n_success); break;
            case 1: v = (double)atomic_load(&m->n_fail); break;
            case 2: v = (double)st->inferences; break;
            case 3: v = (double)st->executions; break;
            case 4: v = (double)atomic_load(&m->ns_success) * 1e-9; break;
            case 5: v = (double)st->queue_us_sum * 1e-6; break;
            case 6: v = (double)st->compute_us_sum * 1e-6; break;
            default: v = (double)st->pending; break;
            }
            tput(&t, "%s{model=\"%s\",version=\"%s\"} %.9g\n", fam[f].name, ln, lv, v);
        }
    }
    free(bs);
    p[t.n < cap ? t.n : cap - 1] = 0;
}

/* ================================================================ gRPC */

/* The gRPC service's view of the model table (kserve_grpc.h): the same
 * lookup, readiness rules, batcher and counters as the v2 HTTP routes. */
static int grpc_server_ready(void *ctx) {
    server *s = ctx;
    return atomic_load(&s->ready) && !atomic_load(&s->stopping);
}

/* 503 with err while the server loads its models, else 0 (err cleared). */
static int grpc_loading(server *s, tb_ks_error *err) {
    err->status = 200;
    err->msg[0] = 0;
    if (atomic_load(&s->ready)) return 0;
    snprintf(err->msg, sizeof err->msg, "the server is still loading its models");
    return err->status = 503;
}

static int grpc_model_find(void *ctx, const char *name, const char *version, int pin, tb_ks_model_view *v,
                           tb_ks_error *err) {
    server *s = ctx;
    if (grpc_loading(s, err)) return 503;
    model *m = find_model(s, name, version, err->msg, sizeof err->msg);
    if (!m) return err->status = 404;
    *v = (tb_ks_model_view){.name = m->name, .version = m->version, .ready = atomic_load(&m->ready),
                            .is_llm = m->is_llm, .n_in = m->n_in, .n_out = m->n_out, .in = m->in, .out = m->out,
                            .timeout_override = m->timeout_override, .handle = m};
    if (m->is_llm) v->optional = 2; /* max_tokens */
    if (!pin) return 200;
    /* counted in before ready is read, as handle_v2 does */
    atomic_fetch_add(&m->users, 1);
    if (!atomic_load(&m->ready) || atomic_load(&s->stopping)) {
        atomic_fetch_sub(&m->users, 1);
        snprintf(err->msg, sizeof err->msg, "model '%s' version %s is not ready%s%.300s", m->name, m->version,
                 m->reason[0] ? ": " : "", m->reason);
        return err->status = 503;
    }
    return 200;
}

static tb_status grpc_model_infer(void *ctx, const tb_ks_model_view *v, const tb_tensor *in, int n_in,
                                  int64_t timeout_us, tb_tensor *out, int n_out, void **owned) {
    (void)ctx;
    return model_infer(v->handle, in, n_in, timeout_us, out, n_out, owned);
}

static int grpc_llm_infer(void *ctx, const tb_ks_model_view *v, const tb_ks_request *rq, tb_tensor *out,
                          void **owned, tb_ks_error *err) {
    char *ser = NULL;
    size_t n = 0;
    int st = llm_text_infer(ctx, v->handle, rq, -1, &ser, &n, err->msg, sizeof err->msg);
    err->status = st;
    if (st != 200) return st;
    *out = (tb_tensor){.dtype = TB_KS_BYTES, .rank = 1, .dims = {1}, .data = ser};
    *owned = ser;
    return 200;
}

static int grpc_model_stats(void *ctx, const char *name, const char *version, tb_ks_model_stats *out, int cap,
                            tb_ks_error *err) {
    server *s = ctx;
    if (grpc_loading(s, err)) return -503;
    int k = 0;
    pthread_mutex_lock(&s->load_mu);
    if (name[0] && version[0]) { /* one version, as /v2/models/{name}/versions/{v}/stats */
        model *m = find_model(s, name, version, err->msg, sizeof err->msg);
        if (m) model_stats_of(m, &out[k++]);
    } else { /* every ready version of the name, or of every model */
        int nm = atomic_load(&s->n_models);
        for (int i = 0; i < nm && k < cap; i++) {
            model *m = s->models[i];
            if (!m->version[0] || !atomic_load(&m->ready) || (name[0] && strcmp(m->name, name) != 0)) continue;
            model_stats_of(m, &out[k++]);
        }
        if (name[0] && k == 0) find_model(s, name, version, err->msg, sizeof err->msg);
    }
    pthread_mutex_unlock(&s->load_mu);
    if (name[0] && k == 0) {
        if (!err->msg[0]) snprintf(err->msg, sizeof err->msg, "model '%s' has no version loaded", name);
        return -(err->status = 404);
    }
    return k;
}

static void grpc_model_done(void *ctx, const tb_ks_model_view *v, int ok, uint64_t ns) {
    (void)ctx;
    model *m = v->handle;
    atomic_fetch_add(ok ? &m->n_success : &m->n_fail, 1);
    atomic_fetch_add(ok ? &m->ns_success : &m->ns_fail, ns);
    if (ok) atomic_store(&m->last_ms, (unsigned long long)time(NULL) * 1000ull);
    atomic_fetch_sub(&m->users, 1);
}

/* ================================================================ gRPC ModelStreamInfer */

static int grpc_llm_stream_start(void *ctx, const tb_ks_model_view *v, const tb_ks_request *rq, void **gen,
                                 tb_ks_error *err) {
    gen_stream *g = NULL;
    err->msg[0] = 0;
    int st = llm_text_start(ctx, v->handle, rq, -1, 1, &g, err->msg, sizeof err->msg);
    err->status = st;
    *gen = g;
    return st;
}

/* The text released since the last call (the stop strings and split
 * characters held back as for any generation); the buffer is the choice's
 * own, reused from call to call. */
static int grpc_llm_stream_next(void *ctx, void *gen, double timeout_s, const char **text, size_t *n,
                                tb_ks_error *err) {
    (void)ctx;
    gen_stream *g = gen;
    gen_choice *ch = &g->ch[0];
    ch->tn = 0; /* the caller has taken the previous piece */
    int over = pump_all(g, timeout_s);
    *text = ch->text;
    *n = ch->tn;
    if (!over) return 0;
    if (ch->reason == TB_FINISH_ERROR || ch->reason == TB_FINISH_CANCELLED) {
        snprintf(err->msg, sizeof err->msg, "%s", ch->reason == TB_FINISH_ERROR ? "generation failed"
                                                                                 : "the generation was cancelled");
        return err->status = 500;
    }
    return 200;
}

static void grpc_llm_stream_end(void *ctx, void *gen) {
    (void)ctx;
    gen_stream_free(gen); /* cancels a generation still running */
}

/* Decode batches warmed at load: on the GPU, steps of up to 64 tokens are
 * captured as CUDA graphs and those of 9..256 time their GEMMs' candidates,
 * once per size; larger decode batches keep no per-size state. */
#define TB_SERVE_WARMUP_MAX 256

/* --model-warmup for an LLM (auto: on for GPUs): a decode step of every
 * batch size the scheduler can form, up to TB_SERVE_WARMUP_MAX, before the
 * first request, so that no request's step pays for a size's first run. A
 * failed warm-up is logged and serving goes on (requests then pay as
 * without it). */
static void llm_warmup(server *s) {
    s->warm_steps = 0;
    s->warm_s = 0;
    int warm = warmup_flag(s->o.model_warmup);
    if (warm < 0) warm = !strncmp(tb_context_backend(s->ctx), "cuda", 4);
    if (!warm) return;
    int n = tb_context_max_seqs(s->ctx), steps = 0;
    if (n > TB_SERVE_WARMUP_MAX) n = TB_SERVE_WARMUP_MAX;
    double t0 = tb_now();
    if (tb_context_warmup(s->ctx, n, &steps) != TB_OK)
        tb_log(TB_LOG_WARN, "serve: %s (after %d steps); requests pay for the first run of each batch size",
               tb_last_error(), steps);
    s->warm_steps = steps;
    s->warm_s = tb_now() - t0;
}

/* An LLM engine's serving state in s: its info, a context (KV cache sized
 * by the serve options), its tokenizer and chat format, and a scheduler
 * thread. s takes the engine (s->e) even on failure, where the caller
 * frees what is set (llm_close). `path`: the engine file, for
 * --gpu-memory-fraction's weight size. Used for `turbine serve FILE.engine`
 * and for each LLM model of a repository. */
static tb_status llm_open(server *s, tb_engine *e, const char *path) {
    s->e = e;
    tb_engine_get_info(s->e, &s->info);
    tb_context_options co;
    tb_context_options_default(&co);
    co.n_threads = s->o.threads;
    co.max_seqs = s->o.max_num_seqs > 0 ? s->o.max_num_seqs : s->info.max_batch;
    co.kv_cache_bytes = s->o.kv_cache_bytes;
    co.device = s->o.device;
    co.no_prefix_cache = s->o.no_prefix_cache;
    co.kv_dtype = s->o.kv_dtype;
    if (s->o.gpu_memory_fraction > 0 && !s->o.kv_cache_bytes) {
        const char *dev = s->o.device ? s->o.device : s->e->backend;
        uint64_t total = 0, avail = 0;
        TB_TRY(tb_backend_memory(dev, &total, &avail));
        struct stat est;
        uint64_t weights = stat(path, &est) == 0 ? (uint64_t)est.st_size : 0;
        /* tensor-parallel ranks on GPUs of their own (tb_context_create:
         * rank r on cuda:(I + r)) each hold 1/N of the weights and of the
         * cache: the budget is the tightest device's, times N */
        int tp = s->info.tensor_parallel > 1 ? s->info.tensor_parallel : 1;
        const char *one = getenv("TURBINE_TP_ONE_DEVICE");
        int spread = tp > 1 && !(one && !strcmp(one, "1")), dev_index = 0;
        char kind[16];
        if (spread && tb_device_parse(dev, kind, &dev_index) == TB_OK)
            for (int r = 1; r < tp; r++) {
                char rd[32];
                uint64_t t2 = 0, a2 = 0;
                snprintf(rd, sizeof rd, "%s:%d", kind, dev_index + r);
                TB_TRY(tb_backend_memory(rd, &t2, &a2));
                if ((double)a2 - (1 - s->o.gpu_memory_fraction) * (double)t2 <
                    (double)avail - (1 - s->o.gpu_memory_fraction) * (double)total)
                    total = t2, avail = a2;
            }
        if (spread) weights /= (uint64_t)tp;
        /* activations, cuBLAS and graphs: a fixed allowance */
        double budget = s->o.gpu_memory_fraction * (double)total - (double)(total - avail) - (double)weights -
                        (double)(1ull << 30);
        if (budget < (double)(16ull << 20))
            return tb_errorf(TB_ERR_INVALID_ARG,
                             "--gpu-memory-fraction %.2f leaves no room for the KV cache on %s (%.1f GiB total, %.1f "
                             "GiB in use, %.1f GiB of weights)",
                             s->o.gpu_memory_fraction, dev, total / 1073741824.0, (total - avail) / 1073741824.0,
                             weights / 1073741824.0);
        co.kv_cache_bytes = (size_t)budget * (size_t)(spread ? tp : 1);
    }
    TB_TRY(tb_context_create(s->e, &co, &s->ctx));
    llm_warmup(s);
    s->tok = tb_engine_tokenizer(s->e);
    s->chat = tb_chat_detect(tb_tokenizer_chat_template(s->tok));
    set_bos_text(s);
    tb_sched_options so = {.max_num_seqs = co.max_seqs, .max_batched_tokens = s->o.max_batched_tokens,
                           .max_queue = s->o.max_queue};
    tb_sched_observer obs = tb_metrics_observer(s->metrics);
    TB_TRY(tb_sched_start(s->ctx, &so, &obs, &s->sched));
    return TB_OK;
}

/* Frees an LLM's scheduler (draining it within the grace time), context
 * and engine; s stays, ready for llm_open again. */
static void llm_close(server *s) {
    tb_sched_stop(s->sched, 1, s->o.grace_seconds);
    /* streams still sending their last events read the tokenizer; a client
     * that reads nothing is cut off by the connection timeout */
    while (atomic_load(&s->gen_users) > 0) usleep(1000);
    tb_sched_free(s->sched);
    s->sched = NULL;
    tb_context_free(s->ctx);
    s->ctx = NULL;
    tb_engine_free(s->e);
    s->e = NULL;
    s->tok = NULL;
}

/* ================================================================ repository */

/* Stops a model version: new requests get 503 from now on; the batcher
 * runs every request already accepted (their callers get their answers),
 * then it and the engine are freed. Under load_mu. */
static void model_unload(model *m, const char *reason) {
    atomic_store(&m->ready, 0);
    m->state = "UNAVAILABLE";
    snprintf(m->reason, sizeof m->reason, "%s", reason);
    while (atomic_load(&m->users) > 0) usleep(1000);
    if (m->llm) { /* its accepted generations finish (within --grace), then it goes */
        llm_close(m->llm);
        m->e = NULL;
        return;
    }
    tb_batcher_free(m->b);
    m->b = NULL;
    tb_engine_free(m->e);
    m->e = NULL;
}

/* The engine of one version: model.engine loaded, model.onnx built first
 * with the config's build options by the same tb_build as `turbine build`,
 * into a temporary file removed once loaded. */
static tb_status repo_engine(const tb_model_version *v, const tb_repo_config *cfg, const char *device,
                             tb_engine **out) {
    const char *dev = cfg->device[0] ? cfg->device : device;
    if (!v->is_onnx) return tb_engine_load_for(v->path, dev, out);
    char tmp[PATH_MAX];
    const char *td = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/turbine-repo-%ld-%p.engine", td && *td ? td : "/tmp", (long)getpid(), (void *)v);
    tb_build_options o;
    tb_build_options_default(&o);
    o.weight_dtype = cfg->dtype;
    o.device = dev;
    o.shapes = cfg->shapes[0] ? cfg->shapes : NULL;
    o.min_shapes = cfg->min_shapes[0] ? cfg->min_shapes : NULL;
    o.opt_shapes = cfg->opt_shapes[0] ? cfg->opt_shapes : NULL;
    o.max_shapes = cfg->max_shapes[0] ? cfg->max_shapes : NULL;
    o.calib_data = cfg->calib_data[0] ? cfg->calib_data : NULL;
    tb_status st = tb_build(v->path, tmp, &o, NULL);
    if (st == TB_OK) st = tb_engine_load_for(tmp, dev, out);
    unlink(tmp);
    return st;
}

/* The v2 face of a repository LLM, as Triton's vLLM and TensorRT-LLM
 * backends name it: text_input BYTES [1], max_tokens INT32 [1] (optional),
 * text_output BYTES [1]. */
static void llm_v2_io(model *m) {
    memset(m->in, 0, sizeof m->in[0] * 2);
    memset(m->out, 0, sizeof m->out[0]);
    snprintf(m->in[0].name, sizeof m->in[0].name, "text_input");
    m->in[0].dtype = TB_KS_BYTES;
    snprintf(m->in[1].name, sizeof m->in[1].name, "max_tokens");
    m->in[1].dtype = TB_I32;
    snprintf(m->out[0].name, sizeof m->out[0].name, "text_output");
    m->out[0].dtype = TB_KS_BYTES;
    tb_io_info *all[3] = {&m->in[0], &m->in[1], &m->out[0]};
    for (int i = 0; i < 3; i++) {
        all[i]->rank = 1;
        all[i]->min[0] = all[i]->opt[0] = all[i]->max[0] = 1;
    }
    m->n_in = 2;
    m->n_out = 1;
}

/* A repository LLM: its own context and scheduler (the serve options'
 * --max-num-seqs, --kv-cache and so on, applied per model), answering the
 * OpenAI API under the model's name and v2 infer on text_input. Takes e. */
static tb_status model_load_llm(server *s, model *m, tb_engine *e, const tb_model_version *v,
                                const tb_repo_config *cfg) {
    if (!m->llm) {
        m->llm = calloc(1, sizeof *m->llm);
        if (!m->llm) {
            tb_engine_free(e);
            return tb_errorf(TB_ERR_OOM, "out of memory");
        }
    }
    server *ls = m->llm;
    ls->o = s->o;
    if (cfg->device[0]) ls->o.device = cfg->device;
    if (cfg->warmup >= 0) ls->o.model_warmup = cfg->warmup ? "on" : "off";
    ls->o.engine_path = v->path;
    ls->o.model_repository = NULL;
    /* its own token counters and latency histograms (labelled by model and
     * version in /metrics), kept across its unloads and loads */
    if (!ls->metrics && !(ls->metrics = tb_metrics_new())) {
        tb_engine_free(e);
        return tb_errorf(TB_ERR_OOM, "out of memory");
    }
    atomic_store(&ls->stopping, 0);
    atomic_store(&ls->ready, 1);
    snprintf(ls->model, sizeof ls->model, "%s", m->name);
    const char *dev = model_device(cfg->device[0] ? cfg->device : s->o.device, e);
    uint64_t before = device_used_bytes(dev);
    tb_status st = llm_open(ls, e, v->path);
    /* both point into the scanned entry, which is freed after the load */
    ls->o.device = s->o.device;
    ls->o.engine_path = NULL;
    if (st != TB_OK) {
        llm_close(ls);
        return st;
    }
    m->e = ls->e;
    llm_v2_io(m);
    atomic_store(&m->gpu_bytes, used_since(dev, before));
    return TB_OK;
}

/* Loads one version into m (a table entry in state LOADING). */
static tb_status model_load_version(server *s, model *m, const tb_model_version *v, const tb_repo_config *cfg) {
    tb_engine *e = NULL;
    TB_TRY(repo_engine(v, cfg, s->o.device, &e));
    if (tb_engine_is_llm(e)) return model_load_llm(s, m, e, v, cfg);
    if (m->llm) tb_metrics_free(m->llm->metrics);
    free(m->llm); /* was an LLM before this load (closed by its unload) */
    m->llm = NULL;
    tb_batcher_config bc;
    tb_repo_config_batcher(cfg, &bc);
    if (bc.warmup < 0 && warmup_flag(s->o.model_warmup) >= 0) bc.warmup = warmup_flag(s->o.model_warmup);
    if (!bc.threads_per_instance && s->o.threads > 0)
        bc.threads_per_instance = s->o.threads / bc.instance_count > 0 ? s->o.threads / bc.instance_count : 1;
    m->e = e;
    const char *dev = model_device(cfg->device[0] ? cfg->device : s->o.device, e);
    uint64_t before = device_used_bytes(dev);
    tb_status st = model_load_batcher(m, &bc);
    if (st != TB_OK) {
        tb_engine_free(e);
        m->e = NULL;
        return st;
    }
    atomic_store(&m->gpu_bytes, used_since(dev, before));
    m->timeout_override = cfg->allow_timeout_override;
    return TB_OK;
}

/* The table entry of name/version ("" version: the model's own error row),
 * added when missing; NULL when the table is full. Under load_mu. */
static model *entry_for(server *s, const char *name, const char *version) {
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++)
        if (!strcmp(s->models[i]->name, name) && !strcmp(s->models[i]->version, version)) return s->models[i];
    return model_add(s, name, version, NULL);
}

/* (Re)loads a scanned model: every loaded version of it unloaded first,
 * then each chosen version loaded; a failure is kept in the entry's state
 * and reason and logged. Returns how many versions are READY; *why gets
 * the first failure. Under load_mu. */
static int repo_load_entry(server *s, const tb_model_entry *me, char *why, size_t cap) {
    why[0] = 0;
    int n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++) {
        model *m = s->models[i];
        if (strcmp(m->name, me->name) != 0) continue;
        if (model_loaded(m)) model_unload(m, "unloaded");
        if (!m->version[0]) m->state = "UNAVAILABLE"; /* an earlier error row: superseded below */
    }
    if (me->status != TB_OK) {
        model *m = entry_for(s, me->name, "");
        if (m) {
            m->state = "UNAVAILABLE";
            snprintf(m->reason, sizeof m->reason, "%s", me->error);
        }
        snprintf(why, cap, "%s", me->error);
        fprintf(stderr, "turbine: model '%s' cannot be served: %s\n", me->name, me->error);
        return 0;
    }
    int ready = 0;
    for (int k = 0; k < me->n_versions; k++) {
        char ver[32];
        snprintf(ver, sizeof ver, "%lld", (long long)me->versions[k].version);
        model *m = entry_for(s, me->name, ver);
        if (!m) {
            if (!why[0]) snprintf(why, cap, "the server holds at most %d model versions", MAX_MODELS);
            fprintf(stderr, "turbine: model '%s' version %s: the server holds at most %d model versions\n",
                    me->name, ver, MAX_MODELS);
            continue;
        }
        m->state = "LOADING";
        m->reason[0] = 0;
        double t0 = tb_now();
        if (model_load_version(s, m, &me->versions[k], &me->config) != TB_OK) {
            m->state = "UNAVAILABLE";
            snprintf(m->reason, sizeof m->reason, "%s", tb_last_error());
            if (!why[0]) snprintf(why, cap, "version %s: %s", ver, m->reason);
            fprintf(stderr, "turbine: model '%s' version %s cannot be served: %s\n", me->name, ver, m->reason);
            continue;
        }
        m->state = "READY";
        atomic_store(&m->ready, 1);
        ready++;
        if (m->llm && m->llm->sched) {
            char warm[64] = "";
            if (m->llm->warm_steps) snprintf(warm, sizeof warm, ", %d warm-up steps", m->llm->warm_steps);
            fprintf(stderr, "turbine: model '%s' version %s ready (LLM %s, context %d, %d sequences%s; OpenAI API and "
                    "v2 text_input) in %.2f s\n", me->name, ver, m->llm->info.arch, m->llm->info.max_seq_len,
                    tb_context_max_seqs(m->llm->ctx), warm, tb_now() - t0);
        } else
            fprintf(stderr, "turbine: model '%s' version %s ready (%s, %d inputs, %d outputs, max batch %d) in %.2f s\n",
                    me->name, ver, me->versions[k].is_onnx ? "built from model.onnx" : "model.engine", m->n_in,
                    m->n_out, tb_batcher_max_batch_size(m->b), tb_now() - t0);
    }
    /* the model's error row, if any, is gone once a version serves */
    model *err = NULL;
    n = atomic_load(&s->n_models);
    for (int i = 0; i < n; i++)
        if (!strcmp(s->models[i]->name, me->name) && !s->models[i]->version[0]) err = s->models[i];
    if (err) {
        err->state = ready ? "READY" : "UNAVAILABLE";
        snprintf(err->reason, sizeof err->reason, "%s", ready ? "" : why);
    }
    return ready;
}

/* Every model of --model-repository at start; fails only when the folder
 * cannot be read (each model's own failure is in the index). */
static tb_status load_repository(server *s) {
    tb_model_repo r;
    TB_TRY(tb_model_repo_scan(s->o.model_repository, &r));
    pthread_mutex_lock(&s->load_mu);
    int ready = 0;
    for (int i = 0; i < r.n_models; i++) {
        char why[512];
        ready += repo_load_entry(s, &r.models[i], why, sizeof why);
    }
    pthread_mutex_unlock(&s->load_mu);
    int n_models = r.n_models; /* tb_model_repo_free zeroes it */
    tb_model_repo_free(&r);
    fprintf(stderr, "turbine: model repository %s: %d models, %d versions ready\n", s->o.model_repository,
            n_models, ready);
    return TB_OK;
}

/* GET|POST /v2/repository/index, POST /v2/repository/models/NAME/load|unload. */
static enum MHD_Result handle_repository(server *s, struct MHD_Connection *c, const char *url, const char *method) {
    int is_post = !strcmp(method, "POST");
    if (!authorized(s, c)) return v2_error(s, c, 401, "a valid API key is required (Authorization: Bearer KEY)");
    if (!strcmp(url, "/v2/repository/index")) {
        if (!is_post && strcmp(method, "GET") != 0) return v2_error(s, c, 405, "use GET or POST");
        json_t *a = json_array();
        pthread_mutex_lock(&s->load_mu);
        int n = atomic_load(&s->n_models);
        for (int i = 0; a && i < n; i++) {
            model *m = s->models[i];
            if (m->is_llm) continue;
            if (!m->version[0] && !strcmp(m->state, "READY")) continue; /* a cleared error row */
            json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s}", "name", m->name, "version", m->version,
                                               "state", m->state, "reason", m->reason));
        }
        pthread_mutex_unlock(&s->load_mu);
        if (!a) return v2_error(s, c, 500, "out of memory");
        return reply_json(c, 200, a);
    }
    const char *p = url + strlen("/v2/repository/models/");
    const char *slash = strncmp(url, "/v2/repository/models/", 22) ? NULL : strchr(p, '/');
    int load = slash && !strcmp(slash, "/load"), unload = slash && !strcmp(slash, "/unload");
    if (!load && !unload) return reply_error(s, c, 404, NULL, "no route for %s %s", method, url);
    if (!is_post) return v2_error(s, c, 405, "use POST");
    char name[TB_MODEL_NAME_MAX];
    size_t nl = (size_t)(slash - p);
    if (nl == 0 || nl >= sizeof name) return v2_error(s, c, 400, "a model name of 1 to %d bytes", TB_MODEL_NAME_MAX - 1);
    memcpy(name, p, nl);
    name[nl] = 0;
    if (!s->o.model_repository) return v2_error(s, c, 400, "the server has no --model-repository");
    if (atomic_load(&s->stopping)) return v2_error(s, c, 503, "the server is shutting down");
    pthread_mutex_lock(&s->load_mu);
    if (unload) {
        int found = 0, n = atomic_load(&s->n_models);
        for (int i = 0; i < n; i++) {
            model *m = s->models[i];
            if (strcmp(m->name, name) != 0 || m->is_llm) continue;
            found = 1;
            if (model_loaded(m)) model_unload(m, "unloaded");
        }
        pthread_mutex_unlock(&s->load_mu);
        if (!found) return v2_error(s, c, 404, "unknown model '%s'", name);
        fprintf(stderr, "turbine: model '%s' unloaded\n", name);
        return reply_text(c, 200, "application/json", "{}");
    }
    tb_model_entry me;
    tb_status st = tb_model_repo_scan_model(s->o.model_repository, name, &me);
    if (st != TB_OK) {
        pthread_mutex_unlock(&s->load_mu);
        return v2_error(s, c, 404, "no model '%s' in the repository: %s", name, tb_last_error());
    }
    char why[512];
    int ready = repo_load_entry(s, &me, why, sizeof why);
    pthread_mutex_unlock(&s->load_mu);
    tb_model_entry_free(&me);
    if (!ready) return v2_error(s, c, 400, "failed to load '%s': %s", name, why);
    return reply_text(c, 200, "application/json", "{}");
}

/* The /v2 routes. `r` is the parsed route; name and version from the path. */
static enum MHD_Result handle_v2(server *s, struct MHD_Connection *c, const char *url, tb_ks_route r,
                                 const char *name, const char *version, const char *method, conn_state *cs) {
    int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    int ready = atomic_load(&s->ready) && !atomic_load(&s->stopping);
    /* a path under /v2 that is no route: the server's one 404 for unknown routes */
    if (r == TB_KS_ROUTE_UNKNOWN) return reply_error(s, c, 404, NULL, "no route for %s %s", method, url);
    if (r == TB_KS_ROUTE_INFER ? !is_post : !is_get)
        return v2_error(s, c, 405, "use %s", r == TB_KS_ROUTE_INFER ? "POST" : "GET");
    if (r == TB_KS_ROUTE_LIVE) return reply_text(c, 200, "application/json", "{\"live\":true}");
    if (r == TB_KS_ROUTE_READY)
        return reply_text(c, ready ? 200 : 503, "application/json", ready ? "{\"ready\":true}" : "{\"ready\":false}");
    if (!authorized(s, c)) return v2_error(s, c, 401, "a valid API key is required (Authorization: Bearer KEY)");
    if (r == TB_KS_ROUTE_SERVER)
        return reply_json(c, 200, json_pack("{s:s, s:s, s:[s, s]}", "name", "turbine", "version", TB_SERVE_VERSION,
                                            "extensions", "binary_tensor_data", "statistics"));
    if (!atomic_load(&s->ready)) return v2_error(s, c, 503, "the server is still loading its models");
    char msg[512];
    model *m = find_model(s, name, version, msg, sizeof msg);
    if (!m) return v2_error(s, c, 404, "%s", msg);
    if (r == TB_KS_ROUTE_MODEL_READY) {
        int mr = ready && atomic_load(&m->ready);
        return reply_json(c, mr ? 200 : 503, json_pack("{s:s, s:b}", "name", m->name, "ready", mr));
    }
    if (r == TB_KS_ROUTE_MODEL) {
        char *j = tb_ks_model_metadata(m->name, m->version, m->in, m->n_in, m->out, m->n_out);
        if (!j) return v2_error(s, c, 500, "out of memory");
        return reply_owned(c, 200, "application/json", j, strlen(j), 0);
    }
    if (r == TB_KS_ROUTE_STATS) return v2_stats(s, c, m);
    /* counted in before ready is read: an unload that clears ready waits
     * for every request counted in, so the batcher outlives them */
    atomic_fetch_add(&m->users, 1);
    if (!atomic_load(&m->ready) || atomic_load(&s->stopping)) {
        atomic_fetch_sub(&m->users, 1);
        return v2_error(s, c, 503, "model '%s' version %s is not ready%s%s", m->name, m->version,
                        m->reason[0] ? ": " : "", m->reason);
    }
    enum MHD_Result res = v2_infer(s, c, m, cs);
    atomic_fetch_sub(&m->users, 1);
    return res;
}

/* The OpenAI routes of a model repository: /v1/models lists its ready LLMs;
 * the others go to the LLM the body's "model" names (it may be left out
 * when the repository serves one), through that model's scheduler. */
static enum MHD_Result handle_repo_openai(server *s, struct MHD_Connection *c, const char *url, const char *method,
                                          const char *version, conn_state *cs) {
    if (!strcmp(url, "/v1/models")) {
        if (strcmp(method, "GET") != 0) return reply_error(s, c, 405, NULL, "use GET");
        json_t *data = json_array();
        int n = atomic_load(&s->n_models);
        for (int i = 0; data && i < n; i++) {
            model *m = s->models[i];
            char msg[64];
            /* once per name: the version find_model picks */
            if (!m->llm || !atomic_load(&m->ready) || find_model(s, m->name, "", msg, sizeof msg) != m) continue;
            json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", m->name, "object", "model",
                                                  "created", (json_int_t)time(NULL), "owned_by", "turbine",
                                                  "max_model_len", m->llm->info.max_seq_len));
        }
        if (!data) return reply_error(s, c, 500, NULL, "out of memory");
        return reply_json(c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
    }
    if (strcmp(method, "POST") != 0) return reply_error(s, c, 405, NULL, "use POST");
    if (cs->too_large) return reply_error(s, c, 413, NULL, "the request body exceeds %zu bytes", s->o.max_body_bytes);
    if (atomic_load(&s->stopping)) return reply_error(s, c, 503, NULL, "the server is shutting down");
    char jmsg[256];
    json_t *root = body_json(cs->body, cs->n, jmsg, sizeof jmsg);
    if (!root) return reply_error(s, c, 400, NULL, "%s", jmsg);
    json_t *mv = json_object_get(root, "model");
    model *m = NULL;
    char msg[512] = "";
    if (mv && !json_is_null(mv)) {
        if (!json_is_string(mv) || strlen(json_string_value(mv)) != json_string_length(mv)) {
            json_decref(root);
            return reply_error(s, c, 400, "model", "'model' must be a string");
        }
        m = find_model(s, json_string_value(mv), "", msg, sizeof msg);
    } else { /* no name: the one LLM of the repository, if there is one */
        int n = atomic_load(&s->n_models), names = 0;
        for (int i = 0; i < n; i++) {
            model *x = s->models[i];
            if (!x->llm || (m && !strcmp(m->name, x->name))) continue;
            names++;
            m = find_model(s, x->name, "", msg, sizeof msg);
        }
        if (names != 1) {
            json_decref(root);
            return reply_error(s, c, 400, "model", "'model' is required: the repository serves %d language models",
                               names);
        }
    }
    if (!m) {
        json_decref(root);
        return reply_error_as(s, c, 404, "NotFoundError", "model_not_found", "model", msg);
    }
    if (!m->llm) {
        json_decref(root);
        return reply_error(s, c, 400, "model",
                           "'%s' is not a language model: it is served by the KServe v2 API (POST /v2/models/%s/infer)",
                           m->name, m->name);
    }
    /* counted in before ready is read, as v2 infer: an unload waits for it */
    atomic_fetch_add(&m->users, 1);
    enum MHD_Result r;
    if (!atomic_load(&m->ready) || !m->llm->sched) {
        r = reply_error(s, c, 503, NULL, "model '%s' version %s is not ready%s%s", m->name, m->version,
                        m->reason[0] ? ": " : "", m->reason);
    } else {
        server *ls = m->llm;
        /* "model" names the model; parse_gen compares it with ls->model */
        if (!mv || json_is_null(mv)) json_object_set_new(root, "model", json_string(m->name));
        int http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        if (!strcmp(url, "/v1/completions")) r = handle_generate(ls, c, root, 0, http11);
        else if (!strcmp(url, "/v1/chat/completions")) r = handle_generate(ls, c, root, 1, http11);
        else if (!strcmp(url, "/tokenize")) r = handle_tokenize(ls, c, root);
        else r = handle_detokenize(ls, c, root);
    }
    atomic_fetch_sub(&m->users, 1);
    json_decref(root);
    return r;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        /* A body declared larger than --max-body is answered now, from the
         * headers, as nginx's client_max_body_size: nothing of it is read and
         * the connection closes after the reply. (A chunked body, whose size
         * is not declared, is counted as it arrives and its rest discarded.) */
        if (!body_declared_too_large(c, s->o.max_body_bytes)) return MHD_YES;
        cs->too_large = 1; /* on to the routes: the reply the request gets without its body */
    }
    if (*upload_size) {
        if (cs->n + *upload_size > s->o.max_body_bytes) cs->too_large = 1;
        else if (grow(&cs->body, &cs->cap, cs->n + *upload_size + 1)) {
            memcpy(cs->body + cs->n, upload, *upload_size);
            cs->n += *upload_size;
            cs->body[cs->n] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!is_get) return reply_error(s, c, 405, NULL, "use GET");
        if (!atomic_load(&s->ready) || atomic_load(&s->stopping))
            return reply_text(c, 503, "application/json", "{\"status\":\"loading\"}");
        return reply_text(c, 200, "application/json", "{\"status\":\"ok\"}");
    }
    if (!strcmp(url, "/metrics")) {
        char *m = s->o.model_repository ? repo_metrics(s)
                                         : tb_metrics_render(s->metrics, atomic_load(&s->ready) ? s->sched : NULL,
                                                             s->model);
        if (!m) return reply_error(s, c, 500, NULL, "out of memory");
        if (atomic_load(&s->ready)) v2_metrics(s, &m);
        enum MHD_Result r = reply_text(c, 200, "text/plain; version=0.0.4", m);
        free(m);
        return r;
    }
    if (!strncmp(url, "/v2/repository/", 15)) {
        if (!atomic_load(&s->ready)) return v2_error(s, c, 503, "the server is still loading its models");
        return handle_repository(s, c, url, method);
    }
    char mname[TB_KS_MAX_NAME], mver[TB_KS_MAX_NAME];
    tb_ks_route vr = tb_ks_parse_route(url, mname, mver);
    if (vr != TB_KS_ROUTE_NONE) return handle_v2(s, c, url, vr, mname, mver, method, cs);
    int known = !strcmp(url, "/v1/models") || !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions") ||
                !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize");
    if (!known) return reply_error(s, c, 404, NULL, "no route for %s %s", method, url);
    if (!authorized(s, c)) return reply_error(s, c, 401, NULL, "a valid API key is required (Authorization: Bearer KEY)");
    if (!atomic_load(&s->ready)) return reply_error(s, c, 503, NULL, "the model is still loading");
    if (s->o.model_repository) return handle_repo_openai(s, c, url, method, version, cs);
    if (!s->sched) { /* a general engine: no language model to list or run */
        if (!strcmp(url, "/v1/models")) {
            if (!is_get) return reply_error(s, c, 405, NULL, "use GET");
            return reply_json(c, 200, json_pack("{s:s, s:[]}", "object", "list", "data"));
        }
        return reply_error(s, c, 400, NULL,
                           "'%s' is not a language model: it is served by the KServe v2 API (POST /v2/models/%s/infer)",
                           s->model, s->model);
    }
    if (!strcmp(url, "/v1/models")) {
        if (!is_get) return reply_error(s, c, 405, NULL, "use GET");
        return handle_models(s, c);
    }
    if (!is_post) return reply_error(s, c, 405, NULL, "use POST");
    if (cs->too_large)
        return reply_error(s, c, 413, NULL, "the request body exceeds %zu bytes", s->o.max_body_bytes);
    if (atomic_load(&s->stopping)) return reply_error(s, c, 503, NULL, "the server is shutting down");
    char jmsg[256];
    json_t *root = body_json(cs->body, cs->n, jmsg, sizeof jmsg);
    if (!root) return reply_error(s, c, 400, NULL, "%s", jmsg);
    enum MHD_Result r;
    int http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
    if (!strcmp(url, "/v1/completions")) r = handle_generate(s, c, root, 0, http11);
    else if (!strcmp(url, "/v1/chat/completions")) r = handle_generate(s, c, root, 1, http11);
    else if (!strcmp(url, "/tokenize")) r = handle_tokenize(s, c, root);
    else r = handle_detokenize(s, c, root);
    json_decref(root);
    return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)c; (void)toe;
    conn_state *cs = *con_cls;
    if (cs) {
        free(cs->body);
        free(cs);
        *con_cls = NULL;
    }
}

/* ================================================================ lifecycle */

/* Loads the engine: a general one becomes a v2 model with its executor; an
 * LLM gets its context and scheduler (the OpenAI API) and a v2 entry for
 * the health and metadata routes. */
static tb_status load_engine(server *s) {
    tb_engine *e = NULL;
    TB_TRY(tb_engine_load_for(s->o.engine_path, s->o.device, &e));
    if (!tb_engine_is_llm(e)) {
        tb_batcher_config bc;
        tb_status st = serve_batcher_config(&s->o, e, &bc);
        model *m = st == TB_OK ? model_add(s, s->model, "1", e) : NULL;
        if (st == TB_OK && !m) st = tb_errorf(TB_ERR_OOM, "out of memory");
        const char *dev = model_device(s->o.device, e);
        uint64_t before = device_used_bytes(dev);
        if (st == TB_OK) st = model_load_batcher(m, &bc);
        if (st == TB_OK) atomic_store(&m->gpu_bytes, used_since(dev, before));
        if (st != TB_OK) { /* model_free frees the engine only with its batcher */
            tb_engine_free(e);
            return st;
        }
        m->state = "READY";
        atomic_store(&m->ready, 1);
        return TB_OK;
    }
    const char *dev = model_device(s->o.device, e);
    uint64_t before = device_used_bytes(dev);
    TB_TRY(llm_open(s, e, s->o.engine_path));
    model *m = model_add(s, s->model, "1", s->e);
    if (!m) return tb_errorf(TB_ERR_OOM, "out of memory");
    m->is_llm = 1;
    llm_v2_io(m);
    atomic_store(&m->gpu_bytes, used_since(dev, before));
    m->state = "READY";
    atomic_store(&m->ready, 1);
    return TB_OK;
}

/* Resolves --host (a name such as localhost, an IPv4 or an IPv6 address)
 * and listens on the first of its addresses that binds. Returns the
 * socket, or -1 with a message in `err`; `shown` gets the host as a URL
 * spells it ([::1]) and `addr` the numeric address bound. */
static int listen_on(const char *host, int port, char *shown, size_t shown_cap, char *addr, size_t addr_cap,
                     char *err, size_t err_cap) {
    snprintf(shown, shown_cap, strchr(host, ':') ? "[%s]" : "%s", host);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        snprintf(err, err_cap, "cannot listen on %s:%d: --host does not resolve: %s", shown, port, gai_strerror(rc));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) { last_errno = errno; continue; }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0 ||
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
            continue;
        }
        if (getnameinfo(a->ai_addr, a->ai_addrlen, addr, (socklen_t)addr_cap, NULL, 0, NI_NUMERICHOST) != 0)
            snprintf(addr, addr_cap, "?");
    }
    freeaddrinfo(res);
    if (fd < 0) snprintf(err, err_cap, "cannot listen on %s:%d: %s", shown, port, strerror(last_errno));
    return fd;
}

static volatile sig_atomic_t g_signal = 0;
static void on_signal(int sig) { g_signal = sig; }

int tb_serve_run(const tb_serve_options *opt) {
    if (warmup_flag(opt->model_warmup) < -1) {
        fprintf(stderr, "turbine: error: --model-warmup '%s': auto, on or off\n", opt->model_warmup);
        return 1;
    }
    server *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->o = *opt;
    if (!s->o.host) s->o.host = "127.0.0.1";
    if (s->o.port <= 0) s->o.port = 8000;
    if (s->o.max_body_bytes == 0) s->o.max_body_bytes = 1 << 20;
    if (s->o.grace_seconds <= 0) s->o.grace_seconds = 30;
    if (s->o.connection_timeout_s <= 0) s->o.connection_timeout_s = 60;
    if (s->o.stream_interval <= 0) s->o.stream_interval = 1;
    if (s->o.stream_buffer <= 0) s->o.stream_buffer = 1024;
    if (s->o.model_name && *s->o.model_name) {
        snprintf(s->model, sizeof s->model, "%s", s->o.model_name);
    } else if (s->o.model_repository) {
        snprintf(s->model, sizeof s->model, "repository");
        s->o.engine_path = s->o.model_repository; /* for the start-up log */
    } else {
        const char *b = strrchr(s->o.engine_path, '/');
        snprintf(s->model, sizeof s->model, "%s", b ? b + 1 : s->o.engine_path);
        char *dot = strstr(s->model, ".engine");
        if (dot) *dot = 0;
    }
    pthread_mutex_init(&s->load_mu, NULL);
    s->metrics = tb_metrics_new();
    if (!s->metrics) {
        fprintf(stderr, "turbine: error: out of memory\n");
        free(s);
        return 1;
    }
    char shown[300], bound[INET6_ADDRSTRLEN + 8], err[512];
    int lfd0 = listen_on(s->o.host, s->o.port, shown, sizeof shown, bound, sizeof bound, err, sizeof err);
    if (lfd0 < 0) {
        fprintf(stderr, "turbine: error: %s\n", err);
        tb_metrics_free(s->metrics);
        free(s);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                                MHD_USE_POLL,
                            0, NULL, NULL, handler, s, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)lfd0,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)s->o.connection_timeout_s, MHD_OPTION_CONNECTION_LIMIT, 4096u,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024), MHD_OPTION_LISTEN_BACKLOG_SIZE,
                            1024u, MHD_OPTION_END);
    if (!s->d) {
        fprintf(stderr, "turbine: error: cannot listen on %s:%d: %s\n", shown, s->o.port, strerror(errno));
        close(lfd0);
        tb_metrics_free(s->metrics);
        free(s);
        return 1;
    }
    if (s->o.grpc_port > 0) {
        s->grpc_host = (tb_ks_grpc_host){.ctx = s, .server_ready = grpc_server_ready, .model_find = grpc_model_find,
                                         .model_infer = grpc_model_infer, .llm_infer = grpc_llm_infer,
                                         .model_stats = grpc_model_stats,
                                         .model_done = grpc_model_done,
                                         .llm_stream_start = grpc_llm_stream_start,
                                         .llm_stream_next = grpc_llm_stream_next,
                                         .llm_stream_end = grpc_llm_stream_end};
        tb_ks_grpc_options go = {.host = s->o.host, .port = s->o.grpc_port, .max_message_bytes = s->o.max_body_bytes,
                                 .api_key = s->o.api_key, .version = TB_SERVE_VERSION};
        if (tb_ks_grpc_start(&go, &s->grpc_host, &s->grpc) != TB_OK) {
            fprintf(stderr, "turbine: error: %s\n", tb_last_error());
            MHD_stop_daemon(s->d);
            tb_metrics_free(s->metrics);
            free(s);
            return 1;
        }
        fprintf(stderr, "turbine: KServe v2 gRPC on %s:%d\n", shown, s->o.grpc_port);
    }
    if (!strcmp(s->o.host, bound))
        fprintf(stderr, "turbine: listening on http://%s:%d (loading %s)\n", shown, s->o.port, s->o.engine_path);
    else
        fprintf(stderr, "turbine: listening on http://%s:%d (%s; loading %s)\n", shown, s->o.port, bound,
                s->o.engine_path);
    double t0 = tb_now();
    if ((s->o.model_repository ? load_repository(s) : load_engine(s)) != TB_OK) {
        fprintf(stderr, "turbine: error: %s\n", tb_last_error());
        tb_ks_grpc_stop(s->grpc, 0);
        MHD_stop_daemon(s->d);
        for (int i = 0; i < s->n_models; i++) model_free(s->models[i]);
        tb_sched_free(s->sched);
        tb_context_free(s->ctx);
        tb_engine_free(s->e);
        tb_metrics_free(s->metrics);
        free(s);
        return 1;
    }
    atomic_store(&s->ready, 1);
    if (s->o.model_repository) {
        fprintf(stderr, "turbine: serving the model repository %s over KServe v2, ready in %.2f s\n",
                s->o.model_repository, tb_now() - t0);
    } else if (!s->ctx) {
        const model *m = s->models[0];
        tb_batcher_stats bst;
        tb_batcher_get_stats(m->b, &bst);
        char warm[64] = "";
        if (bst.warmup_runs) snprintf(warm, sizeof warm, ", %llu warm-up runs", (unsigned long long)bst.warmup_runs);
        fprintf(stderr,
                "turbine: serving '%s' version %s over KServe v2 (%d inputs, %d outputs, max batch %d%s) ready in "
                "%.2f s\n",
                m->name, m->version, m->n_in, m->n_out, tb_batcher_max_batch_size(m->b), warm, tb_now() - t0);
    } else {
        char warm[96] = "";
        if (s->warm_steps)
            snprintf(warm, sizeof warm, " (warm-up: decode batches of 1..%d sequences, %d steps, %.2f s)",
                     tb_context_max_seqs(s->ctx) < TB_SERVE_WARMUP_MAX ? tb_context_max_seqs(s->ctx)
                                                                       : TB_SERVE_WARMUP_MAX,
                     s->warm_steps, s->warm_s);
        fprintf(stderr,
                "turbine: serving '%s' (%s, context %d, %d sequences, %d KV blocks of %d tokens = %ld tokens of %s KV "
                "at %.0f bytes each, chat format %s) ready in %.2f s%s\n",
                s->model, s->info.arch, s->info.max_seq_len, tb_context_max_seqs(s->ctx), tb_kv_total_blocks(s->ctx),
                tb_kv_block_size(s->ctx), (long)tb_kv_total_blocks(s->ctx) * tb_kv_block_size(s->ctx),
                tb_kv_dtype_label(tb_context_kv_dtype(s->ctx)),
                tb_kv_bytes_per_token(tb_context_kv_dtype(s->ctx), tb_kv_block_size(s->ctx), s->info.n_kv_heads,
                                      s->info.head_dim, s->info.n_layers),
                tb_chat_format_name(s->chat), tb_now() - t0, warm);
    }
    while (!g_signal) usleep(50 * 1000);
    fprintf(stderr, "turbine: %s received: draining (grace %.0f s)\n", g_signal == SIGINT ? "SIGINT" : "SIGTERM",
            s->o.grace_seconds);
    atomic_store(&s->stopping, 1);
    /* no new connections; stop listening too, else the kernel queues them unanswered */
    MHD_socket lfd = MHD_quiesce_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET) shutdown(lfd, SHUT_RDWR);
    /* gRPC calls in progress finish (their models are still loaded); new ones are refused */
    tb_ks_grpc_stop(s->grpc, s->o.grace_seconds);
    tb_sched_stop(s->sched, 1, s->o.grace_seconds);
    for (int i = 0; i < atomic_load(&s->n_models); i++) { /* the repository's LLMs drain alike */
        server *ls = s->models[i]->llm;
        if (!ls) continue;
        atomic_store(&ls->stopping, 1);
        tb_sched_stop(ls->sched, 1, s->o.grace_seconds);
    }
    /* let streams flush their last chunks */
    const union MHD_DaemonInfo *di;
    double until = tb_now() + 5;
    while (tb_now() < until && (di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS)) &&
           di->num_connections > 0)
        usleep(20 * 1000);
    MHD_stop_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd); /* MHD's threads are gone: now it may be closed */
    for (int i = 0; i < s->n_models; i++) model_free(s->models[i]);
    tb_sched_free(s->sched);
    tb_context_free(s->ctx);
    tb_engine_free(s->e);
    tb_metrics_free(s->metrics);
    free(s);
    fprintf(stderr, "turbine: stopped\n");
    return 0;
}
