/*
 * run.c — the load loop: one thread, one epoll set. Requests go through one
 * of two transports: the built-in HTTP/1.1 client (http1.c, plain http://)
 * or libcurl's multi interface driven through curl_multi_socket_action
 * (https://, or --http-client curl). Either way thousands of transfers cost
 * one wakeup per ready socket rather than a scan of all of them, and both
 * feed the same functions: body_data() with response bytes as they are
 * read, release() when a request ends (finish() classifies and records it).
 * The /metrics scraper always uses libcurl.
 *
 * Each transfer lives in a slot (with libcurl an easy handle, with the
 * built-in client the connection of the same index, reused from request to
 * request so the connection is kept alive). A streaming response is parsed as
 * it arrives: every SSE event with text is a token, stamped on arrival, which
 * gives TTFT and the inter-token gaps. Latencies are measured from the
 * request's intended start: its send time in a closed loop, its scheduled
 * arrival in an open loop, so a request that waited for a free slot or a
 * stalled server is charged for the wait (the coordinated-omission
 * correction of wrk2).
 *
 * Bounds: the issue phase stops at --requests or --duration; the drain phase
 * then waits at most the request timeout (plus a margin) and aborts what is
 * left as timeouts. Buffers per transfer are capped (TB_SLOT_MAX_BUF).
 */
#define _GNU_SOURCE
#include "bench/curl_shim.h" /* libcurl, loaded on first use */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "bench/bench.h"

#define TB_SLOT_MAX_BUF ((size_t)8 << 20) /* bytes kept per response            */
#define TB_SLOT_MAX_GAPS 1000000          /* inter-token gaps kept per request  */
#define TB_MAX_SLOTS 100000
#define TB_DRAIN_MARGIN 5.0               /* seconds beyond the timeout         */
#define TB_SLOT_ERR_BODY ((size_t)64 << 10) /* bytes of an error reply kept for its message */

const char *tb_bench_error_name(tb_bench_error_kind k) {
    static const char *const names[] = {"connect", "timeout", "http", "stream", "other"};
    return k < TB_BERR_COUNT ? names[k] : "?";
}

void tb_bench_config_default(tb_bench_config *c) {
    memset(c, 0, sizeof *c);
    c->concurrency = 1;
    c->poisson = 1;
    c->max_inflight = 10000;
    c->timeout = 300;
    c->connect_timeout = 10;
    c->sample_interval = 0.5;
    c->scrape_metrics = 1;
    c->gpu = 1;
    c->seed = 1;
}

tb_status tb_bench_result_init(tb_bench_result *r) {
    memset(r, 0, sizeof *r);
    tb_status s;
    if ((s = tb_hist_init(&r->ttft)) || (s = tb_hist_init(&r->tpot)) ||
        (s = tb_hist_init(&r->itl)) || (s = tb_hist_init(&r->e2e))) {
        tb_bench_result_free(r);
        return s;
    }
    return TB_OK;
}

void tb_bench_result_free(tb_bench_result *r) {
    if (!r) return;
    tb_hist_free(&r->ttft);
    tb_hist_free(&r->tpot);
    tb_hist_free(&r->itl);
    tb_hist_free(&r->e2e);
    free(r->samples);
    r->samples = NULL;
    free(r->server);
    r->server = NULL;
    for (int i = 0; i < r->n_turns; i++) {
        tb_hist_free(&r->turns[i].ttft);
        tb_hist_free(&r->turns[i].e2e);
    }
    free(r->turns);
    r->turns = NULL;
    r->n_turns = 0;
    free(r->replicas);
    r->replicas = NULL;
    r->n_replicas = 0;
}

/* ---------------------------------------------------------------- slots */

enum { SLOT_REQUEST, SLOT_METRICS };

typedef struct run run;

typedef struct slot {
    int kind;
    run *r;
    CURL *easy;
    struct slot *next_free;
    int counted;
    int busy;
    const tb_bench_request *req;
    double t_intended, t_first, t_last;
    long n_tokens;   /* SSE events carrying text                          */
    long usage_out;  /* usage.completion_tokens (-1: not reported)         */
    long usage_in;
    int done_marker; /* saw data: [DONE]                                   */
    int bad;         /* malformed stream or an error object                */
    int overflow;
    char msg[160];
    char *buf;       /* SSE: the unfinished line; else the body            */
    size_t len, cap;
    uint64_t *gaps;
    int n_gaps, cap_gaps;
    /* sessions: this turn's conversation, its body and the reply's text */
    int conv, turn;
    char *body;
    size_t body_len;
    char *reply;
    size_t reply_len, reply_cap;
    int reply_over;
    struct curl_slist *own_hdrs; /* libcurl: the shared headers + the id   */
} slot;

struct run {
    const tb_bench_config *c;
    const tb_workload *w;
    tb_bench_result *out;
    tb_endpoint ep;
    int stream;
    CURLM *multi;
    tb_h1_client *h1;   /* the built-in client, or NULL for libcurl */
    int epfd;
    long curl_timer_ms; /* -1: none */
    double curl_timer_at;
    struct curl_slist *hdrs;
    slot *slots;
    int n_slots;
    slot *free_list;
    slot mon;           /* the /metrics scraper */
    int mon_busy, mon_fail;
    char *metrics_url;
    tb_server_metrics srv;
    int inflight;
    long next_req;
    int slice0, slice_n; /* the phase's requests: w->reqs[slice0, slice0 + slice_n) */
    /* sessions */
    const tb_sessions *sess;
    int *conv_turn;      /* [n]: the next turn to send                      */
    char **replies;      /* [n * turns]: the assistant's text of each turn  */
    size_t *reply_len;
    int *ready;          /* conversations whose next turn can go: those
                          * under way at the front, new ones behind        */
    int ready_head, ready_len;
    int conv_open;       /* conversations not finished                      */
    /* current phase */
    int counted;
    long done_ok, done_all, tok_done;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud);
static void release(run *r, slot *s, int err, const char *msg, long code, double now);

const char *tb_http_client_name(tb_http_client k) {
    return k == TB_HTTP_CLIENT_CURL ? "curl" : k == TB_HTTP_CLIENT_BUILTIN ? "builtin" : "auto";
}

tb_http_client tb_bench_client_for(const tb_bench_config *c) {
    if (c->http_client == TB_HTTP_CLIENT_AUTO)
        return c->url && tb_h1_supports(c->url) ? TB_HTTP_CLIENT_BUILTIN : TB_HTTP_CLIENT_CURL;
    return c->http_client;
}

static void slot_reset(slot *s) {
    s->t_first = s->t_last = 0;
    s->n_tokens = 0;
    s->usage_out = s->usage_in = -1;
    s->done_marker = s->bad = s->overflow = 0;
    s->msg[0] = 0;
    s->len = 0;
    s->n_gaps = 0;
    s->reply_len = 0;
    s->reply_over = 0;
    s->conv = s->turn = -1;
}

static int buf_append(slot *s, const char *p, size_t n) {
    if (s->len + n + 1 > s->cap) {
        if (s->len + n + 1 > TB_SLOT_MAX_BUF) { s->overflow = 1; return 0; }
        size_t nc = s->cap ? s->cap : 4096;
        while (nc < s->len + n + 1) nc *= 2;
        if (nc > TB_SLOT_MAX_BUF) nc = TB_SLOT_MAX_BUF;
        char *nb = realloc(s->buf, nc);
        if (!nb) { s->overflow = 1; return 0; }
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = 0;
    return 1;
}

static void add_gap(slot *s, double gap) {
    if (s->n_gaps >= s->cap_gaps) {
        if (s->cap_gaps >= TB_SLOT_MAX_GAPS) return;
        int nc = s->cap_gaps ? s->cap_gaps * 2 : 256;
        uint64_t *ng = realloc(s->gaps, (size_t)nc * sizeof *ng);
        if (!ng) return;
        s->gaps = ng;
        s->cap_gaps = nc;
    }
    s->gaps[s->n_gaps++] = (uint64_t)(gap > 0 ? gap * 1e9 : 0);
}

/* sessions: the assistant's text, to send back in the next turn */
static void reply_append(slot *s, const char *p, size_t n) {
    if (s->reply_over) return;
    if (s->reply_len + n + 1 > s->reply_cap) {
        if (s->reply_len + n + 1 > TB_SLOT_MAX_BUF) { s->reply_over = 1; return; }
        size_t nc = s->reply_cap ? s->reply_cap : 1024;
        while (nc < s->reply_len + n + 1) nc *= 2;
        char *nb = realloc(s->reply, nc);
        if (!nb) { s->reply_over = 1; return; }
        s->reply = nb;
        s->reply_cap = nc;
    }
    memcpy(s->reply + s->reply_len, p, n);
    s->reply_len += n;
    s->reply[s->reply_len] = 0;
}

static void set_msg(slot *s, const char *fmt, const char *a) {
    if (!s->msg[0]) snprintf(s->msg, sizeof s->msg, fmt, a);
}

static long json_long(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

/* One SSE "data:" payload of an OpenAI stream. */
static void sse_event(slot *s, const char *data, size_t n, double now) {
    while (n && (*data == ' ' || *data == '\t')) { data++; n--; }
    while (n && (data[n - 1] == '\r' || data[n - 1] == ' ')) n--;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) { s->done_marker = 1; return; }
    if (!n) return;
    json_error_t err;
    /* a token whose text is U+0000 arrives as "\u0000": valid JSON, so
     * decoded with JSON_ALLOW_NUL and measured by length, not strlen */
    json_t *j = json_loadb(data, n, JSON_ALLOW_NUL, &err);
    if (!j || !json_is_object(j)) {
        s->bad = 1;
        set_msg(s, "malformed SSE event: %s", j ? "not an object" : err.text);
        json_decref(j);
        return;
    }
    json_t *e = json_object_get(j, "error");
    if (e && !json_is_null(e)) {
        s->bad = 1;
        const char *m = json_string_value(json_object_get(e, "message"));
        set_msg(s, "error event: %s", m ? m : (json_string_value(e) ? json_string_value(e) : "?"));
    }
    json_t *ch = json_object_get(j, "choices");
    json_t *c0 = json_is_array(ch) ? json_array_get(ch, 0) : NULL;
    json_t *text = NULL;
    if (c0) {
        text = json_object_get(c0, "text");
        if (!json_is_string(text)) text = json_object_get(json_object_get(c0, "delta"), "content");
    }
    if (json_is_string(text) && json_string_length(text) > 0) {
        if (s->r->sess) reply_append(s, json_string_value(text), json_string_length(text));
        if (s->n_tokens == 0) s->t_first = now;
        else add_gap(s, now - s->t_last);
        s->t_last = now;
        s->n_tokens++;
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        long co = json_long(u, "completion_tokens"), pr = json_long(u, "prompt_tokens");
        if (co >= 0) s->usage_out = co;
        if (pr >= 0) s->usage_in = pr;
    }
    json_decref(j);
}

static void sse_feed(slot *s, const char *p, size_t n, double now) {
    if (!buf_append(s, p, n)) { s->bad = 1; set_msg(s, "%s", "SSE line too long"); return; }
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl) break;
        size_t end = (size_t)(nl - s->buf);
        const char *line = s->buf + start;
        size_t ll = end - start;
        if (ll >= 5 && !memcmp(line, "data:", 5)) sse_event(s, line + 5, ll - 5, now);
        start = end + 1;
    }
    if (start) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
        s->buf[s->len] = 0;
    }
}

/* Response body bytes of a request slot, from either transport. `now` is
 * the time they were read; < 0: take it here. */
static void body_data(slot *s, long code, const char *ptr, size_t n, double now) {
    if (code < 200 || code > 299) {
        /* the start of an error reply, for the server's message */
        if (s->len < TB_SLOT_ERR_BODY)
            buf_append(s, ptr, n < TB_SLOT_ERR_BODY - s->len ? n : TB_SLOT_ERR_BODY - s->len);
        return;
    }
    if (s->r->ep == TB_EP_GET || (s->r->ep == TB_EP_KSERVE && !s->r->c->kserve)) return;
    if (s->r->ep == TB_EP_KSERVE) { buf_append(s, ptr, n); return; } /* checked in finish() */
    if (now < 0) now = tb_now();
    if (s->r->stream) sse_feed(s, ptr, n, now);
    else {
        if (!s->t_first) s->t_first = now;
        buf_append(s, ptr, n);
    }
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    slot *s = ud;
    size_t n = size * nmemb;
    if (s->kind == SLOT_METRICS) {
        buf_append(s, ptr, n);
        return n;
    }
    long code = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &code);
    body_data(s, code, ptr, n, -1);
    return n;
}

/* ---------------------------------------------------------------- built-in client glue */

static void h1_body(void *ud, int status, const char *p, size_t n, double now) {
    slot *s = ud;
    body_data(s, status, p, n, now);
}

static void h1_done(void *ud, int err, const char *msg, int status, double now) {
    slot *s = ud;
    release(s->r, s, err, msg, status, now);
}

/* ---------------------------------------------------------------- epoll glue */

static int on_socket(CURL *e, curl_socket_t fd, int what, void *ud, void *sockp) {
    run *r = ud;
    (void)e;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(r->epfd, EPOLL_CTL_DEL, fd, NULL);
        curl_multi_assign(r->multi, fd, NULL);
        return 0;
    }
    struct epoll_event ev = {0};
    ev.data.fd = fd;
    if (what & CURL_POLL_IN) ev.events |= EPOLLIN;
    if (what & CURL_POLL_OUT) ev.events |= EPOLLOUT;
    if (sockp) {
        epoll_ctl(r->epfd, EPOLL_CTL_MOD, fd, &ev);
    } else {
        if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
            epoll_ctl(r->epfd, EPOLL_CTL_MOD, fd, &ev);
        curl_multi_assign(r->multi, fd, (void *)1);
    }
    return 0;
}

static int on_timer(CURLM *m, long timeout_ms, void *ud) {
    run *r = ud;
    (void)m;
    r->curl_timer_ms = timeout_ms;
    r->curl_timer_at = timeout_ms < 0 ? INFINITY : timeout_ms == 0 ? 0 : tb_now() + timeout_ms / 1000.0;
    return 0;
}

/* ---------------------------------------------------------------- setup */

static tb_status slot_setup(run *r, slot *s, int kind) {
    const tb_bench_config *c = r->c;
    s->kind = kind;
    s->r = r;
    s->easy = curl_easy_init();
    if (!s->easy) return tb_errorf(TB_ERR_OOM, "bench: curl_easy_init failed");
    CURL *e = s->easy;
    curl_easy_setopt(e, CURLOPT_PRIVATE, s);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(c->connect_timeout * 1000));
    if (kind == SLOT_METRICS) {
        curl_easy_setopt(e, CURLOPT_URL, r->metrics_url);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 2000L);
        return TB_OK;
    }
    curl_easy_setopt(e, CURLOPT_URL, c->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdrs);
    if (c->timeout > 0) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(c->timeout * 1000));
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)TB_BENCH_MAX_BODY);
    if (r->ep == TB_EP_GET) curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    else curl_easy_setopt(e, CURLOPT_POST, 1L);
    return TB_OK;
}

static struct curl_slist *build_headers(const tb_bench_config *c, tb_endpoint ep, tb_status *st) {
    struct curl_slist *h = NULL, *t;
    char auth[1100];
    *st = TB_OK;
#define ADD(x) do { t = curl_slist_append(h, (x)); if (!t) goto oom; h = t; } while (0)
    if (ep != TB_EP_GET) ADD("Content-Type: application/json");
    ADD("Expect:");
    if (c->api_key) {
        if (strlen(c->api_key) > 1000) {
            curl_slist_free_all(h);
            *st = tb_errorf(TB_ERR_INVALID_ARG, "--api-key is too long");
            return NULL;
        }
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->api_key);
        ADD(auth);
    }
    for (int i = 0; i < c->n_headers; i++) ADD(c->headers[i]);
#undef ADD
    return h;
oom:
    curl_slist_free_all(h);
    *st = tb_errorf(TB_ERR_OOM, "bench: out of memory");
    return NULL;
}

static void run_free(run *r) {
    for (int i = 0; i < r->n_slots; i++) {
        slot *s = &r->slots[i];
        if (s->easy) {
            curl_multi_remove_handle(r->multi, s->easy);
            curl_easy_cleanup(s->easy);
        }
        free(s->buf);
        free(s->gaps);
        free(s->body);
        free(s->reply);
        curl_slist_free_all(s->own_hdrs);
    }
    free(r->slots);
    if (r->replies && r->sess)
        for (size_t k = 0; k < (size_t)r->sess->n * (size_t)r->sess->turns; k++) free(r->replies[k]);
    free(r->replies);
    free(r->reply_len);
    free(r->conv_turn);
    free(r->ready);
    tb_h1_free(r->h1);
    r->h1 = NULL;
    if (r->mon.easy) {
        curl_multi_remove_handle(r->multi, r->mon.easy);
        curl_easy_cleanup(r->mon.easy);
    }
    free(r->mon.buf);
    free(r->metrics_url);
    if (r->multi) curl_multi_cleanup(r->multi);
    if (r->epfd >= 0) close(r->epfd);
    curl_slist_free_all(r->hdrs);
}

/* ---------------------------------------------------------------- accounting */

static void count_status(tb_bench_result *o, int code) {
    for (int i = 0; i < o->n_status; i++)
        if (o->status_code[i] == code) { o->status_count[i]++; return; }
    if (o->n_status < TB_BENCH_MAX_STATUS) {
        o->status_code[o->n_status] = code;
        o->status_count[o->n_status++] = 1;
    }
}

/* Copies src into dst as valid UTF-8 (the reports are JSON and HTML): an
 * invalid byte becomes '?', and a sequence that does not fit is left out. */
static void copy_utf8(char *dst, size_t cap, const char *src) {
    size_t w = 0;
    const unsigned char *p = (const unsigned char *)src;
    while (*p && w + 1 < cap) {
        int n = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 && *p >= 0xC2 ? 2 : (*p & 0xF0) == 0xE0 ? 3
                : (*p & 0xF8) == 0xF0 && *p <= 0xF4 ? 4 : 0;
        for (int i = 1; i < n; i++)
            if ((p[i] & 0xC0) != 0x80) { n = 0; break; }
        if (n == 3 && ((p[0] == 0xE0 && p[1] < 0xA0) || (p[0] == 0xED && p[1] >= 0xA0))) n = 0;
        if (n == 4 && ((p[0] == 0xF0 && p[1] < 0x90) || (p[0] == 0xF4 && p[1] >= 0x90))) n = 0;
        if (!n) { dst[w++] = '?'; p++; continue; }
        if (w + (size_t)n >= cap) break;
        memcpy(dst + w, p, (size_t)n);
        w += (size_t)n;
        p += n;
    }
    dst[w] = 0;
}

static void count_error(run *r, slot *s, tb_bench_error_kind k, const char *what) {
    tb_bench_result *o = r->out;
    if (!s->counted) return;
    o->err[k]++;
    o->n_err++;
    if (!o->first_error[0]) {
        int n = snprintf(o->first_error, sizeof o->first_error, "%s: ", tb_bench_error_name(k));
        copy_utf8(o->first_error + n, sizeof o->first_error - (size_t)n, what);
    }
    if (!o->first_msg[k][0]) copy_utf8(o->first_msg[k], sizeof o->first_msg[k], what);
}

/* "HTTP 400: <the server's message>" from an error reply kept in s->buf:
 * OpenAI's {"error": {"message": ...}}, {"error": "..."}, {"message": ...},
 * {"detail": ...}, else the start of the body as text. */
static void http_error_message(const slot *s, long code, char *m, size_t cap) {
    int k = snprintf(m, cap, "HTTP %ld", code);
    if (!s->len || k < 0 || (size_t)k + 3 >= cap) return;
    json_error_t jerr;
    json_t *j = json_loadb(s->buf, s->len, JSON_ALLOW_NUL, &jerr);
    const char *txt = NULL;
    if (json_is_object(j)) {
        json_t *e = json_object_get(j, "error");
        if (json_is_object(e)) txt = json_string_value(json_object_get(e, "message"));
        else if (json_is_string(e)) txt = json_string_value(e);
        if (!txt) txt = json_string_value(json_object_get(j, "message"));
        if (!txt) txt = json_string_value(json_object_get(j, "detail"));
    }
    size_t n = txt ? strlen(txt) : s->len;
    if (!txt) txt = s->buf;
    char *p = m + k;
    size_t room = cap - (size_t)k - 1;
    memcpy(p, ": ", 2);
    p += 2;
    room -= 2;
    /* one line: control characters (newlines of a text body) become spaces */
    size_t w = 0;
    for (size_t i = 0; i < n && w < room; i++) {
        unsigned char ch = (unsigned char)txt[i];
        if (ch < 0x20 || ch == 0x7f) {
            if (w && p[w - 1] == ' ') continue;
            ch = ' ';
        }
        p[w++] = (char)ch;
    }
    while (w && p[w - 1] == ' ') w--;
    p[w] = 0;
    if (!w) m[k] = 0;
    json_decref(j);
}

static tb_bench_error_kind curl_kind(CURLcode rc) {
    switch (rc) {
    case CURLE_COULDNT_CONNECT: case CURLE_COULDNT_RESOLVE_HOST: case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SEND_ERROR: case CURLE_RECV_ERROR: case CURLE_GOT_NOTHING: case CURLE_SSL_CONNECT_ERROR:
        return TB_BERR_CONNECT;
    case CURLE_OPERATION_TIMEDOUT:
        return TB_BERR_TIMEOUT;
    case CURLE_PARTIAL_FILE: case CURLE_WRITE_ERROR: case CURLE_BAD_CONTENT_ENCODING:
        return TB_BERR_STREAM;
    default:
        return TB_BERR_OTHER;
    }
}

/* A finished transfer: classify it, then record its figures. `err`: < 0 the
 * transfer itself succeeded, else the transport's tb_bench_error_kind with
 * its message; `code`: the HTTP status (0: none). */
static void finish(run *r, slot *s, int err, const char *msg, long code, double now) {
    tb_bench_result *o = r->out;
    const tb_bench_config *c = r->c;
    if (s->counted && code) count_status(o, (int)code);
    r->done_all++;
    if (err >= 0) { count_error(r, s, (tb_bench_error_kind)err, msg ? msg : "?"); return; }
    if (code < 200 || code > 299) {
        char m[512] = "";
        if (s->counted) http_error_message(s, code, m, sizeof m);
        count_error(r, s, TB_BERR_HTTP, m);
        return;
    }
    long out_tok = 0, in_tok = s->req ? s->req->input_len : 0;
    int llm = r->ep == TB_EP_COMPLETIONS || r->ep == TB_EP_CHAT;
    if (llm && r->stream) {
        if (s->bad) { count_error(r, s, TB_BERR_STREAM, s->msg); return; }
        if (!s->done_marker) { count_error(r, s, TB_BERR_STREAM, "stream ended without [DONE]"); return; }
        if (s->n_tokens == 0 && s->usage_out <= 0) { count_error(r, s, TB_BERR_STREAM, "no tokens in the stream"); return; }
        out_tok = s->usage_out >= 0 ? s->usage_out : s->n_tokens;
    } else if (llm) {
        json_error_t err;
        json_t *j = s->overflow ? NULL : json_loadb(s->buf ? s->buf : "", s->len, JSON_ALLOW_NUL, &err);
        if (!j || json_object_get(j, "error") || !json_is_array(json_object_get(j, "choices"))) {
            json_decref(j);
            count_error(r, s, TB_BERR_STREAM, "malformed response body");
            return;
        }
        json_t *u = json_object_get(j, "usage");
        long co = json_long(u, "completion_tokens"), pr = json_long(u, "prompt_tokens");
        if (co >= 0) s->usage_out = co;
        if (pr >= 0) s->usage_in = pr;
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        json_t *t = json_object_get(c0, "text");
        if (!json_is_string(t)) t = json_object_get(json_object_get(c0, "message"), "content");
        if (r->sess && json_is_string(t)) reply_append(s, json_string_value(t), json_string_length(t));
        if (co < 0) out_tok = json_is_string(t) ? (long)(json_string_length(t) + 3) / 4 : 0;
        else out_tok = co;
        json_decref(j);
    }
    if (r->ep == TB_EP_KSERVE && c->kserve) {
        char m[256];
        if (s->overflow) { count_error(r, s, TB_BERR_STREAM, "response over the bytes kept per request"); return; }
        if (!tb_ks_check_response(c->kserve, s->buf ? s->buf : "", s->len, m, sizeof m)) {
            count_error(r, s, TB_BERR_STREAM, m);
            return;
        }
    }
    if (s->usage_in >= 0) in_tok = s->usage_in;
    r->done_ok++;
    r->tok_done += out_tok;
    if (!s->counted) return;
    o->n_ok++;
    o->in_tokens += in_tok;
    o->out_tokens += out_tok;
    double e2e = now - s->t_intended;
    tb_hist_add(&o->e2e, (uint64_t)(e2e * 1e9));
    tb_bench_turn *tt = s->turn >= 0 && s->turn < o->n_turns ? &o->turns[s->turn] : NULL;
    if (tt) {
        tt->in_tokens += in_tok;
        tb_hist_add(&tt->e2e, (uint64_t)(e2e * 1e9));
        if (llm && r->stream) tb_hist_add(&tt->ttft, (uint64_t)((s->t_first - s->t_intended) * 1e9));
    }
    int good = !(c->slo_e2e > 0 && e2e > c->slo_e2e);
    if (llm && r->stream) {
        double ttft = s->t_first - s->t_intended;
        tb_hist_add(&o->ttft, (uint64_t)(ttft * 1e9));
        if (c->slo_ttft > 0 && ttft > c->slo_ttft) good = 0;
        if (out_tok > 1) {
            double tpot = (e2e - ttft) / (double)(out_tok - 1);
            tb_hist_add(&o->tpot, (uint64_t)(tpot * 1e9));
            if (c->slo_tpot > 0 && tpot > c->slo_tpot) good = 0;
        }
        for (int i = 0; i < s->n_gaps; i++) tb_hist_add(&o->itl, s->gaps[i]);
    }
    if (good) o->n_good++;
}

/* ---------------------------------------------------------------- the loop */

/* A request slot's transfer ended: record it and free the slot. */
static void session_done(run *r, slot *s, int ok);

static void release(run *r, slot *s, int err, const char *msg, long code, double now) {
    s->busy = 0;
    long ok_before = r->done_ok;
    finish(r, s, err, msg, code, now);
    if (r->sess && s->conv >= 0) session_done(r, s, r->done_ok > ok_before);
    r->inflight--;
    s->next_free = r->free_list;
    r->free_list = s;
}

/* libcurl's outcome of a transfer in the terms of release(). */
static void curl_release(run *r, slot *s, CURLcode rc, double now) {
    long code = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &code);
    release(r, s, rc == CURLE_OK ? -1 : (int)curl_kind(rc), curl_easy_strerror(rc), code, now);
}

/* A conversation's turn ended: keep the reply and queue its next turn first, or
 * end it (its last turn, or a failed one: the next turn would lack the
 * reply it continues). */
static void session_done(run *r, slot *s, int ok) {
    const tb_sessions *ss = r->sess;
    int c = s->conv;
    tb_bench_turn *tt = s->counted && s->turn < r->out->n_turns ? &r->out->turns[s->turn] : NULL;
    if (tt) { if (ok) tt->n_ok++; else tt->n_err++; }
    if (ok && !s->reply_over && r->conv_turn[c] < ss->turns) {
        size_t k = (size_t)c * (size_t)ss->turns + (size_t)s->turn;
        char *copy = malloc(s->reply_len + 1);
        if (copy) {
            memcpy(copy, s->reply ? s->reply : "", s->reply_len);
            copy[s->reply_len] = 0;
            free(r->replies[k]);
            r->replies[k] = copy;
            r->reply_len[k] = s->reply_len;
            /* at the front: a conversation under way goes on before a new
             * one starts, so at most -c conversations are in progress */
            r->ready_head = (r->ready_head + ss->n - 1) % ss->n;
            r->ready[r->ready_head] = c;
            r->ready_len++;
            return;
        }
    }
    if (r->conv_turn[c] < ss->turns && s->counted) r->out->sessions_cut++;
    r->conv_turn[c] = ss->turns;
    r->conv_open--;
}

/* Sends the next turn of the conversation at the head of the ready queue. */
static void launch_session(run *r, slot *s, double now) {
    const tb_sessions *ss = r->sess;
    int c = r->ready[r->ready_head];
    r->ready_head = (r->ready_head + 1) % ss->n;
    r->ready_len--;
    int t = r->conv_turn[c]++;
    s->conv = c;
    s->turn = t;
    size_t k0 = (size_t)c * (size_t)ss->turns;
    free(s->body);
    s->body = NULL;
    char hdr[512];
    snprintf(hdr, sizeof hdr, "%s: %s", r->c->session_header ? r->c->session_header : "X-Session-ID", ss->id[c]);
    tb_status st = tb_sessions_body(ss, c, t, (const char *const *)(r->replies + k0), r->reply_len + k0, &s->body,
                                    &s->body_len);
    if (st == TB_OK && r->h1) {
        st = tb_h1_start_body(r->h1, (int)(s - r->slots), s->body, s->body_len, hdr, s, now);
        if (st != TB_OK) release(r, s, TB_BERR_OTHER, tb_last_error(), 0, now);
        return;
    }
    if (st == TB_OK) {
        curl_slist_free_all(s->own_hdrs);
        s->own_hdrs = NULL;
        for (struct curl_slist *h = r->hdrs; h; h = h->next) {
            struct curl_slist *n = curl_slist_append(s->own_hdrs, h->data);
            if (!n) { st = tb_errorf(TB_ERR_OOM, "bench: out of memory"); break; }
            s->own_hdrs = n;
        }
        struct curl_slist *n = st == TB_OK ? curl_slist_append(s->own_hdrs, hdr) : NULL;
        if (n) s->own_hdrs = n;
        else if (st == TB_OK) st = tb_errorf(TB_ERR_OOM, "bench: out of memory");
    }
    if (st != TB_OK) {
        release(r, s, TB_BERR_OTHER, tb_last_error(), 0, now);
        return;
    }
    curl_easy_setopt(s->easy, CURLOPT_HTTPHEADER, s->own_hdrs);
    curl_easy_setopt(s->easy, CURLOPT_POSTFIELDSIZE, (long)s->body_len);
    curl_easy_setopt(s->easy, CURLOPT_POSTFIELDS, s->body);
    curl_multi_add_handle(r->multi, s->easy);
}

static void launch(run *r, double intended, double now) {
    slot *s = r->free_list;
    r->free_list = s->next_free;
    slot_reset(s);
    s->busy = 1;
    s->counted = r->counted;
    s->t_intended = intended;
    if (r->sess) {
        r->next_req++;
        r->inflight++;
        if (s->counted) r->out->n_sent++;
        launch_session(r, s, now);
        return;
    }
    long idx = r->slice0 + r->next_req % r->slice_n;
    s->req = r->ep != TB_EP_GET ? &r->w->reqs[idx] : NULL;
    if (s->req && !r->h1) {
        curl_easy_setopt(s->easy, CURLOPT_POSTFIELDSIZE, (long)s->req->body_len);
        curl_easy_setopt(s->easy, CURLOPT_POSTFIELDS, s->req->body);
    }
    r->next_req++;
    r->inflight++;
    if (s->counted) r->out->n_sent++;
    if (r->h1) tb_h1_start(r->h1, (int)(s - r->slots), idx, s, now);
    else curl_multi_add_handle(r->multi, s->easy);
}

static void drain_messages(run *r) {
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(r->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        CURL *e = m->easy_handle;
        CURLcode rc = m->data.result;
        double now = tb_now();
        slot *s = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&s);
        curl_multi_remove_handle(r->multi, e);
        if (s->kind == SLOT_METRICS) {
            long code = 0;
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
            r->mon_busy = 0;
            if (rc == CURLE_OK && code == 200 && s->buf) {
                tb_bench_parse_prometheus(s->buf, &r->srv);
                r->mon_fail = 0;
            } else {
                r->mon_fail++;
            }
            continue;
        }
        curl_release(r, s, rc, now);
    }
}

static void socket_action(run *r, curl_socket_t fd, int ev) {
    int running = 0;
    curl_multi_socket_action(r->multi, fd, ev, &running);
}

static void abort_all(run *r, double now) {
    for (int i = 0; i < r->n_slots; i++) {
        slot *s = &r->slots[i];
        if (!s->busy) continue;
        if (r->h1) {
            tb_h1_cancel(r->h1, i, now);
        } else {
            curl_multi_remove_handle(r->multi, s->easy);
            curl_release(r, s, CURLE_OPERATION_TIMEDOUT, now);
        }
    }
}

static void add_sample(run *r, double t, double dt, long d_done, long d_tok) {
    tb_bench_result *o = r->out;
    if (o->n_samples >= o->cap_samples) {
        int nc = o->cap_samples ? o->cap_samples * 2 : 64;
        if (nc > 1000000) return;
        tb_bench_sample *ns = realloc(o->samples, (size_t)nc * sizeof *ns);
        if (!ns) return;
        o->samples = ns;
        o->cap_samples = nc;
    }
    tb_bench_sample *p = &o->samples[o->n_samples++];
    p->t = t;
    p->done_rate = dt > 0 ? d_done / dt : 0;
    p->tok_rate = dt > 0 ? d_tok / dt : 0;
    p->inflight = r->inflight;
    p->srv_running = r->srv.running;
    p->srv_waiting = r->srv.waiting;
    p->srv_kv = r->srv.kv;
    p->gpu_util = p->gpu_mem_gib = p->gpu_power_w = NAN;
    if (r->c->gpu) tb_nvml_sample(&p->gpu_util, &p->gpu_mem_gib, &p->gpu_power_w);
}

/* Runs `n` requests (0: unbounded) for at most `duration` seconds (0: no
 * limit). `counted`: record figures into r->out. */
static tb_status phase(run *r, long n, double duration, int counted) {
    const tb_bench_config *c = r->c;
    r->counted = counted;
    r->done_ok = r->done_all = r->tok_done = 0;
    uint64_t rng = c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)counted + 1;
    int open = c->rate > 0;
    double t0 = tb_now();
    double issue_end = duration > 0 ? t0 + duration : INFINITY;
    double drain_limit = (c->timeout > 0 ? c->timeout : 600) + TB_DRAIN_MARGIN;
    double hard_end = INFINITY; /* set once issuing stops */
    double next_arrival = t0;
    long issued = 0;
    double next_tick = t0 + c->sample_interval, last_tick = t0;
    long last_done = 0, last_tok = 0;
    double next_progress = t0 + 0.25;
    int cap = open ? r->n_slots : c->concurrency;
    struct epoll_event evs[256];
    for (long iter = 0;; iter++) {
        double now = tb_now();
        /* issue what is due */
        int more = (r->sess ? r->conv_open > 0 : n == 0 || issued < n) && now < issue_end;
        while (more && r->inflight < cap && r->free_list && (!r->sess || r->ready_len > 0)) {
            double intended;
            if (open) {
                if (next_arrival > now) break;
                intended = next_arrival;
                double gap = c->poisson ? -log(1.0 - ((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 11) *
                                                         (1.0 / 9007199254740992.0)) / c->rate
                                        : 1.0 / c->rate;
                next_arrival += gap;
            } else {
                intended = now;
            }
            launch(r, intended, now);
            issued++;
            more = (r->sess ? r->conv_open > 0 : n == 0 || issued < n) && now < issue_end;
        }
        if (!more && hard_end == INFINITY) hard_end = now + drain_limit;
        if (!more && r->inflight == 0) break;
        if (now >= hard_end) { abort_all(r, now); break; }
        /* samples, /metrics, progress */
        if (now >= next_tick) {
            if (counted) add_sample(r, now - t0, now - last_tick, r->done_ok - last_done, r->tok_done - last_tok);
            last_done = r->done_ok;
            last_tok = r->tok_done;
            last_tick = now;
            next_tick = now + c->sample_interval;
            if (c->scrape_metrics && r->metrics_url && !r->mon_busy && r->mon_fail < 3) {
                slot_reset(&r->mon);
                r->mon_busy = 1;
                curl_multi_add_handle(r->multi, r->mon.easy);
            }
        }
        if (c->progress && now >= next_progress) {
            next_progress = now + 0.25;
            fprintf(stderr, "\r\033[K%s%s %ld/%ld done, %ld errors, %.1f req/s, %d in flight, %.1fs",
                    counted ? "" : "warmup ", c->label ? c->label : "", r->done_all,
                    n ? n : issued, counted ? r->out->n_err : 0,
                    r->done_all / (now - t0 > 1e-9 ? now - t0 : 1e-9), r->inflight, now - t0);
        }
        /* wait */
        double wake = fmin(next_tick, hard_end);
        if (c->progress) wake = fmin(wake, next_progress);
        if (more && r->inflight < cap && r->free_list && (!r->sess || r->ready_len > 0))
            wake = fmin(wake, open ? next_arrival : now);
        if (more) wake = fmin(wake, issue_end);
        wake = fmin(wake, r->curl_timer_at);
        if (r->h1) wake = fmin(wake, tb_h1_next_deadline(r->h1));
        int ms = 0;
        now = tb_now();
        if (wake > now) {
            double d = (wake - now) * 1000.0;
            ms = d > 1000 ? 1000 : (int)ceil(d);
        }
        int ne = epoll_wait(r->epfd, evs, 256, ms);
        if (ne < 0 && errno != EINTR) return tb_errorf(TB_ERR_IO, "bench: epoll_wait: %s", strerror(errno));
        for (int i = 0; i < ne; i++) {
            if (evs[i].data.u64 & TB_H1_TAG) {
                tb_h1_event(r->h1, evs[i].data.u64, evs[i].events);
                continue;
            }
            int ev = 0;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ev |= CURL_CSELECT_IN;
            if (evs[i].events & EPOLLOUT) ev |= CURL_CSELECT_OUT;
            if (evs[i].events & EPOLLERR) ev |= CURL_CSELECT_ERR;
            socket_action(r, evs[i].data.fd, ev);
        }
        if (r->h1) tb_h1_poll(r->h1, tb_now());
        if (tb_now() >= r->curl_timer_at) {
            r->curl_timer_at = INFINITY;
            socket_action(r, CURL_SOCKET_TIMEOUT, 0);
        }
        drain_messages(r);
    }
    if (counted) {
        double t_end = tb_now();
        r->out->duration = t_end - t0;
        if (r->out->n_samples == 0 || t_end - last_tick > 0.05)
            add_sample(r, t_end - t0, t_end - last_tick, r->done_ok - last_done, r->tok_done - last_tok);
    }
    if (c->progress) fprintf(stderr, "\r\033[K");
    return TB_OK;
}

/* Reads the target's /metrics now (blocking, between phases). */
static int scrape_now(run *r, tb_server_metrics *m) {
    char *body = NULL;
    long code = 0;
    if (tb_bench_http_get(r->metrics_url, r->c, 5, 16 << 20, &body, &code) != TB_OK || code != 200) {
        free(body);
        return 0;
    }
    tb_bench_parse_prometheus(body, m);
    free(body);
    return 1;
}

/* Reads each --replica-metrics URL now (blocking); NaN where unread. */
static void scrape_replicas(const tb_bench_config *c, tb_server_metrics *m, char (*err)[160]) {
    for (int i = 0; i < c->n_replicas; i++) {
        char *body = NULL;
        long code = 0;
        m[i].requests = NAN;
        err[i][0] = 0;
        if (tb_bench_http_get(c->replica_urls[i], c, 5, 16 << 20, &body, &code) != TB_OK)
            snprintf(err[i], sizeof err[i], "%s", tb_last_error());
        else if (code != 200)
            snprintf(err[i], sizeof err[i], "HTTP %ld", code);
        else
            tb_bench_parse_prometheus(body, &m[i]);
        if (!err[i][0] && !isfinite(m[i].requests))
            snprintf(err[i], sizeof err[i], "no request counter (turbine_http_requests_total) in its /metrics");
        free(body);
    }
}

/* Counter deltas; NaN when either side lacks it or it went backwards (a
 * restarted replica). */
static double delta(double after, double before) {
    return isfinite(after) && isfinite(before) && after >= before ? after - before : NAN;
}

static tb_status sessions_setup(run *r, const tb_sessions *ss) {
    size_t m = (size_t)ss->n * (size_t)ss->turns;
    r->sess = ss;
    r->conv_turn = calloc((size_t)ss->n, sizeof *r->conv_turn);
    r->ready = calloc((size_t)ss->n, sizeof *r->ready);
    r->replies = calloc(m, sizeof *r->replies);
    r->reply_len = calloc(m, sizeof *r->reply_len);
    r->out->turns = calloc((size_t)ss->turns, sizeof *r->out->turns);
    if (!r->conv_turn || !r->ready || !r->replies || !r->reply_len || !r->out->turns)
        return tb_errorf(TB_ERR_OOM, "bench: out of memory");
    for (int t = 0; t < ss->turns; t++) {
        TB_TRY(tb_hist_init(&r->out->turns[t].ttft));
        r->out->n_turns = t + 1;
        if (tb_hist_init(&r->out->turns[t].e2e) != TB_OK) {
            tb_hist_free(&r->out->turns[t].ttft);
            r->out->n_turns = t;
            return tb_errorf(TB_ERR_OOM, "bench: out of memory");
        }
    }
    for (int c = 0; c < ss->n; c++) r->ready[c] = c;
    r->ready_head = 0;
    r->ready_len = ss->n;
    r->conv_open = ss->n;
    r->out->n_sessions = ss->n;
    r->out->system_len = ss->system_len;
    return TB_OK;
}

tb_status tb_bench_run(const tb_bench_config *c, const tb_workload *w, tb_bench_result *out) {
    if (!c->url) return tb_errorf(TB_ERR_INVALID_ARG, "bench: no URL");
    if (c->sessions && c->rate > 0)
        return tb_errorf(TB_ERR_INVALID_ARG, "sessions run in a closed loop: a conversation's next turn waits for "
                         "the reply, so -c sets how many conversations are in flight; --rate does not apply");
    if (c->sessions && c->endpoint != TB_EP_CHAT)
        return tb_errorf(TB_ERR_INVALID_ARG, "sessions are chat conversations: --endpoint chat");
    if (c->n_replicas < 0 || c->n_replicas > TB_BENCH_MAX_REPLICAS)
        return tb_errorf(TB_ERR_INVALID_ARG, "at most %d replica /metrics URLs", TB_BENCH_MAX_REPLICAS);
    if (c->rate <= 0 && (c->concurrency < 1 || c->concurrency > TB_MAX_SLOTS))
        return tb_errorf(TB_ERR_INVALID_ARG, "concurrency must be in [1, %d]", TB_MAX_SLOTS);
    if (c->rate > 0 && (c->max_inflight < 1 || c->max_inflight > TB_MAX_SLOTS))
        return tb_errorf(TB_ERR_INVALID_ARG, "--max-inflight must be in [1, %d]", TB_MAX_SLOTS);
    if (c->requests <= 0 && c->duration <= 0 && !c->sessions)
        return tb_errorf(TB_ERR_INVALID_ARG, "a run needs --requests or --duration");
    if (!c->sessions && (!w || w->n < 1)) return tb_errorf(TB_ERR_INVALID_ARG, "bench: empty workload");
    TB_TRY(tb_curl_load());
    run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.w = w;
    r.out = out;
    r.epfd = -1;
    r.curl_timer_ms = -1;
    r.curl_timer_at = INFINITY;
    r.srv.running = r.srv.waiting = r.srv.kv = r.srv.prefix_hits = r.srv.prefix_queries = NAN;
    out->prefix_hit_rate = NAN;
    r.ep = c->endpoint;
    r.stream = c->stream && (r.ep == TB_EP_COMPLETIONS || r.ep == TB_EP_CHAT);
    if (!c->sessions && r.ep != TB_EP_GET && !w->reqs[0].body) {
        run_free(&r);
        return tb_errorf(TB_ERR_INVALID_ARG, "bench: the workload has no request bodies");
    }
    out->concurrency = c->rate > 0 ? 0 : c->concurrency;
    out->rate = c->rate;
    snprintf(out->label, sizeof out->label, "%s", c->label ? c->label : "");
    tb_status st = TB_OK;
    r.hdrs = build_headers(c, r.ep, &st);
    if (st != TB_OK) return st;
    r.epfd = epoll_create1(EPOLL_CLOEXEC);
    r.multi = curl_multi_init();

    if (r.epfd < 0 || !r.multi) { run_free(&r); return tb_errorf(TB_ERR_IO, "bench: cannot set up the event loop"); }
    curl_multi_setopt(r.multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(r.multi, CURLMOPT_SOCKETDATA, &r);
    curl_multi_setopt(r.multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(r.multi, CURLMOPT_TIMERDATA, &r);
    r.n_slots = c->rate > 0 ? c->max_inflight : c->concurrency;
    curl_multi_setopt(r.multi, CURLMOPT_MAXCONNECTS, (long)r.n_slots + 4);
    r.slots = calloc((size_t)r.n_slots, sizeof *r.slots);
    if (!r.slots) { run_free(&r); return tb_errorf(TB_ERR_OOM, "bench: out of memory"); }
    tb_http_client client = tb_bench_client_for(c);
    tb_workload none = {0}; /* sessions make their bodies as they go */
    tb_bench_request one = {0};
    if (c->sessions) {
        none.reqs = &one;
        none.n = 1;
        one.body = "";
        st = sessions_setup(&r, c->sessions);
    }
    if (c->sessions) w = &none;
    if (st == TB_OK && client == TB_HTTP_CLIENT_BUILTIN)
        st = tb_h1_create(c, w, r.epfd, r.n_slots, h1_body, h1_done, &r.h1);
    for (int i = r.n_slots - 1; i >= 0 && st == TB_OK; i--) {
        slot *s = &r.slots[i];
        if (r.h1) {
            s->kind = SLOT_REQUEST;
            s->r = &r;
        } else {
            st = slot_setup(&r, s, SLOT_REQUEST);
        }
        s->next_free = r.free_list;
        r.free_list = s;
    }
    if (st == TB_OK && c->scrape_metrics && c->base_url) {
        size_t l = strlen(c->base_url) + 16;
        r.metrics_url = malloc(l);
        if (r.metrics_url) {
            snprintf(r.metrics_url, l, "%s/metrics", c->base_url);
            st = slot_setup(&r, &r.mon, SLOT_METRICS);
        }
    }
    if (st == TB_OK && c->gpu) tb_nvml_open();
    /* the warm-up sends w's first n_warmup requests, the measured phase the
     * rest, so no measured prompt was seen before (a prefix cache starts
     * cold); a workload without a warm-up part shares its requests */
    int nw = w->n_warmup > 0 && w->n_warmup < w->n ? w->n_warmup : 0;
    r.slice0 = 0;
    r.slice_n = nw ? nw : w->n;
    if (st == TB_OK && c->warmup > 0 && !c->sessions) st = phase(&r, c->warmup, 0, 0);
    tb_server_metrics before, after;
    int prefix = st == TB_OK && r.metrics_url && scrape_now(&r, &before) && isfinite(before.prefix_queries);
    tb_server_metrics rb[TB_BENCH_MAX_REPLICAS], ra[TB_BENCH_MAX_REPLICAS];
    char rerr_b[TB_BENCH_MAX_REPLICAS][160], rerr_a[TB_BENCH_MAX_REPLICAS][160];
    if (st == TB_OK && c->n_replicas > 0) {
        out->replicas = calloc((size_t)c->n_replicas, sizeof *out->replicas);
        if (!out->replicas) st = tb_errorf(TB_ERR_OOM, "bench: out of memory");
        else {
            out->n_replicas = c->n_replicas;
            scrape_replicas(c, rb, rerr_b);
        }
    }
    if (st == TB_OK) {
        r.next_req = 0;
        r.slice0 = nw;
        r.slice_n = w->n - nw;
        long n = c->sessions ? (long)c->sessions->n * c->sessions->turns : c->requests;
        st = phase(&r, n, c->duration, 1);
    }
    if (st == TB_OK && prefix && scrape_now(&r, &after) && after.prefix_queries > before.prefix_queries)
        out->prefix_hit_rate = (after.prefix_hits - before.prefix_hits) / (after.prefix_queries - before.prefix_queries);
    if (st == TB_OK && out->replicas) {
        scrape_replicas(c, ra, rerr_a);
        for (int i = 0; i < c->n_replicas; i++) {
            tb_bench_replica *p = &out->replicas[i];
            snprintf(p->url, sizeof p->url, "%s", c->replica_urls[i]);
            const char *e = rerr_b[i][0] ? rerr_b[i] : rerr_a[i];
            p->scraped = !e[0];
            snprintf(p->error, sizeof p->error, "%s", e);
            p->requests = p->prompt_tokens = p->prefix_hits = p->prefix_queries = NAN;
            if (!p->scraped) continue;
            p->requests = delta(ra[i].requests, rb[i].requests);
            p->prompt_tokens = delta(ra[i].prompt_tokens, rb[i].prompt_tokens);
            p->prefix_hits = delta(ra[i].prefix_hits, rb[i].prefix_hits);
            p->prefix_queries = delta(ra[i].prefix_queries, rb[i].prefix_queries);
            if (!isfinite(p->requests)) {
                p->scraped = 0;
                snprintf(p->error, sizeof p->error, "its request counter went backwards (restarted?)");
            }
        }
    }
    run_free(&r);
    if (st != TB_OK) return st;
    double d = out->duration > 1e-9 ? out->duration : 1e-9;
    out->qps = out->n_ok / d;
    out->out_tps = out->out_tokens / d;
    out->total_tps = (out->in_tokens + out->out_tokens) / d;
    out->goodput = out->n_good / d;
    return TB_OK;
}

/* ---------------------------------------------------------------- one GET */

typedef struct { char *p; size_t n, max; int over; } getbuf;

static size_t on_get(char *ptr, size_t size, size_t nmemb, void *ud) {
    getbuf *b = ud;
    size_t n = size * nmemb;
    if (b->over || b->n + n > b->max) { b->over = 1; return n; }
    char *np = realloc(b->p, b->n + n + 1);
    if (!np) { b->over = 1; return n; }
    b->p = np;
    memcpy(b->p + b->n, ptr, n);
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

/* One GET (post == NULL) or POST of a JSON body. */
static tb_status http_fetch(const char *url, const tb_bench_config *c, const char *post, double timeout,
                            size_t max, char **body, long *http_status) {
    *body = NULL;
    *http_status = 0;
    TB_TRY(tb_curl_load());
    CURL *e = curl_easy_init();
    if (!e) return tb_errorf(TB_ERR_OOM, "bench: curl_easy_init failed");
    tb_status st = TB_OK;
    struct curl_slist *h = c ? build_headers(c, post ? TB_EP_COMPLETIONS : TB_EP_GET, &st) : NULL;
    if (st != TB_OK) { curl_easy_cleanup(e); return st; }
    getbuf b = {0};
    b.max = max;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout * 1000));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_get);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    if (h) curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (post) curl_easy_setopt(e, CURLOPT_POSTFIELDS, post);
    CURLcode rc = curl_easy_perform(e);
    if (rc != CURLE_OK) {
        st = tb_errorf(TB_ERR_IO, "%s %s: %s", post ? "POST" : "GET", url, curl_easy_strerror(rc));
        free(b.p);
    } else {
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, http_status);
        *body = b.p ? b.p : strdup("");
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return st;
}

tb_status tb_bench_http_get(const char *url, const tb_bench_config *c, double timeout,
                            size_t max, char **body, long *http_status) {
    return http_fetch(url, c, NULL, timeout, max, body, http_status);
}

tb_status tb_bench_http_post(const char *url, const tb_bench_config *c, const char *json, double timeout,
                             size_t max, char **body, long *http_status) {
    return http_fetch(url, c, json, timeout, max, body, http_status);
}

int tb_bench_max_model_len(const char *models_json, const char *model) {
    json_error_t err;
    json_t *j = models_json ? json_loads(models_json, JSON_ALLOW_NUL, &err) : NULL;
    json_t *d = json_object_get(j, "data"), *m;
    size_t i;
    long best = 0;
    json_array_foreach(d, i, m) {
        json_t *v = json_object_get(m, "max_model_len");
        const char *id = json_string_value(json_object_get(m, "id"));
        if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX) continue;
        if (model && id && !strcmp(id, model)) { best = (long)json_integer_value(v); break; }
        if (!best) best = (long)json_integer_value(v); /* the first, unless a later one matches */
    }
    json_decref(j);
    return (int)best;
}

char *tb_bench_first_model(const char *models_json) {
    json_error_t err;
    json_t *j = json_loads(models_json, JSON_ALLOW_NUL, &err);
    if (!j) return NULL;
    json_t *d = json_object_get(j, "data");
    if (!json_is_array(d)) d = json_object_get(j, "models"); /* KServe /v2 style */
    const char *id = NULL;
    json_t *m0 = json_is_array(d) ? json_array_get(d, 0) : NULL;
    if (m0) {
        id = json_string_value(json_object_get(m0, "id"));
        if (!id) id = json_string_value(json_object_get(m0, "name"));
        if (!id) id = json_string_value(m0);
    }
    char *r = id ? strdup(id) : NULL;
    json_decref(j);
    return r;
}
