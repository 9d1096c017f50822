/*
 * http1.c — the load tester's own HTTP/1.1 client for plain http:// targets.
 *
 * One connection per slot, at most one request in flight on it (no
 * pipelining), kept alive from request to request. Everything runs on the
 * caller's epoll set: a connection's events carry TB_H1_TAG | its index. The
 * request bytes (request line, headers, body) are formatted once per workload
 * item at setup, so sending a request is one send() on a warm connection.
 *
 * Responses are parsed as they arrive: status line and headers (at most
 * H1_MAX_HEADER bytes), then a body framed by Content-Length, chunked
 * transfer encoding or the end of the connection (at most H1_MAX_BODY bytes).
 * Body bytes go to the caller as soon as they are read, with the time taken
 * right after the read that returned them.
 *
 * Timeouts: every request has the same timeout and every connect the same
 * connect timeout, so deadlines arrive in start order; each kind is a
 * doubly-linked list kept sorted by deadline (insertion walks back from the
 * tail, O(1) in practice), and the earliest deadline is always at the head.
 *
 * Failures are reported with the kinds (and the libcurl messages) the libcurl
 * transport produces for the same event, so both report alike. A request
 * that fails on a kept-alive connection before any byte of its response
 * arrived (the server closed the idle connection) is sent once more on a new
 * connection, as libcurl does.
 *
 * Completions found while starting a request are queued and delivered from
 * tb_h1_poll, so callbacks never run inside tb_h1_start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench/bench.h"

#define H1_MAX_HEADER ((size_t)100 << 10)   /* status line + headers per response */
#define H1_MAX_TRAILER ((size_t)100 << 10)  /* chunked trailers per response      */
#define H1_MAX_CHUNK_EXT 4096               /* a chunk-size line's extensions     */
#define H1_READ_BUF ((size_t)256 << 10)     /* bytes per recv()                   */
#define H1_READS_PER_EVENT 16               /* recv() calls per readiness event   */
#define H1_MAX_ADDRS 8
#define H1_MAX_RETRIES 1

/* libcurl's messages for the same failures (curl_easy_strerror) */
#define MSG_RESOLVE "Couldn't resolve host name"
#define MSG_CONNECT "Couldn't connect to server"
#define MSG_TIMEOUT "Timeout was reached"
#define MSG_NOTHING "Server returned nothing (no headers, no data)"
#define MSG_SEND "Failed sending data to the peer"
#define MSG_RECV "Failure when receiving data from the peer"
#define MSG_PARTIAL "Transferred a partial file"
#define MSG_WEIRD "Weird server reply"
#define MSG_NOT_HTTP "Unsupported protocol"
#define MSG_TOO_BIG "Maximum file size exceeded"
#define MSG_OOM "Out of memory"

enum { C_CLOSED, C_CONNECTING, C_SENDING, C_READING, C_IDLE };

enum {
    P_HEAD,
    P_BODY_LEN,
    P_BODY_CLOSE,
    P_CHUNK_SIZE,
    P_CHUNK_EXT,
    P_CHUNK_SIZE_LF,
    P_CHUNK_DATA,
    P_CHUNK_DATA_CR,
    P_CHUNK_DATA_LF,
    P_TRAILER_START,
    P_TRAILER_LINE,
    P_TRAILER_CR,
    P_DONE
};

enum { L_REQ = 0, L_CONN = 1, L_COUNT };

typedef struct h1_conn {
    int fd, state;
    uint32_t ev;            /* events registered with epoll (0: none)          */
    int n_served;           /* responses completed on this connection          */
    int retries, addr;
    int got_any;            /* response bytes seen for the current request     */
    void *ud;               /* the caller's request (NULL: none)               */
    const char *req;
    size_t req_len, sent;
    char *own;              /* tb_h1_start_body: this request's own bytes      */
    size_t own_cap;
    double deadline[L_COUNT];
    struct h1_conn *prev[L_COUNT], *next[L_COUNT];
    int listed[L_COUNT];
    /* response parser */
    int ps, status, keep;
    int chunk_digits;
    uint64_t remaining, body_total;
    size_t ext_bytes, trailer_bytes;
    char *hbuf;
    size_t hlen, hcap;
    /* a queued completion */
    int pend_err;
    const char *pend_msg;
    struct h1_conn *pend_next;
} h1_conn;

typedef struct {
    char *p;
    size_t n;
} h1_bytes;

struct tb_h1_client {
    int epfd;
    double timeout, connect_timeout;
    tb_h1_body_fn body;
    tb_h1_done_fn done;
    struct sockaddr_storage addrs[H1_MAX_ADDRS];
    socklen_t addr_len[H1_MAX_ADDRS];
    int addr_family[H1_MAX_ADDRS];
    int n_addrs;
    h1_bytes *reqs;
    int n_reqs;
    char *rq_head;          /* request line and headers, for tb_h1_start_body */
    size_t head_len;
    int own_len;            /* add Content-Length                             */
    h1_conn *conns;
    int n_conns;
    h1_conn *head[L_COUNT], *tail[L_COUNT];
    h1_conn *pend_head, *pend_tail;
    int starting;           /* inside tb_h1_start: queue completions          */
    char *rbuf;
};

/* ---------------------------------------------------------------- URLs */

/* Splits http://host[:port]/path into its parts (pointers into the URL).
 * Returns 0 for anything this client does not handle. */
typedef struct {
    const char *host; size_t host_len; /* as written, brackets included */
    const char *port; size_t port_len; /* empty: 80                       */
    const char *path; size_t path_len; /* empty: "/"                      */
} h1_url;

static int parse_url(const char *url, h1_url *u) {
    memset(u, 0, sizeof *u);
    if (strncasecmp(url, "http://", 7)) return 0;
    const char *a = url + 7, *e = a;
    while (*e && *e != '/' && *e != '?' && *e != '#') e++;
    if (e == a || memchr(a, '@', (size_t)(e - a))) return 0;
    const char *colon = NULL;
    if (*a == '[') {
        const char *rb = memchr(a, ']', (size_t)(e - a));
        if (!rb) return 0;
        if (rb + 1 < e) {
            if (rb[1] != ':') return 0;
            colon = rb + 1;
        }
    } else {
        colon = memchr(a, ':', (size_t)(e - a));
    }
    u->host = a;
    u->host_len = (size_t)((colon ? colon : e) - a);
    if (colon) {
        u->port = colon + 1;
        u->port_len = (size_t)(e - u->port);
        if (u->port_len > 5) return 0;
        long v = 0;
        for (size_t i = 0; i < u->port_len; i++) {
            if (u->port[i] < '0' || u->port[i] > '9') return 0;
            v = v * 10 + (u->port[i] - '0');
        }
        if (u->port_len && (v < 1 || v > 65535)) return 0;
    }
    if (!u->host_len || u->host_len > 255) return 0;
    const char *p = e, *q = p;
    while (*q && *q != '#') {
        if ((unsigned char)*q <= 0x20 || (unsigned char)*q >= 0x7f) return 0;
        q++;
    }
    u->path = p;
    u->path_len = (size_t)(q - p);
    return 1;
}

int tb_h1_supports(const char *url) {
    h1_url u;
    return url && parse_url(url, &u);
}

/* ---------------------------------------------------------------- requests */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} h1_sb;

static void sb_add(h1_sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 512;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(h1_sb *b, const char *s) { sb_add(b, s, strlen(s)); }

/* The length of a header line's name (up to ':'), trailing blanks dropped. */
static size_t header_name_len(const char *h) {
    const char *c = strchr(h, ':');
    size_t n = c ? (size_t)(c - h) : strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t')) n--;
    return n;
}

/* 1 when `h` is "Name:" with nothing but blanks after the colon. */
static int header_is_empty(const char *h) {
    const char *c = strchr(h, ':');
    if (!c) return 0;
    for (c++; *c; c++)
        if (*c != ' ' && *c != '\t' && *c != '\r' && *c != '\n') return 0;
    return 1;
}

/* The caller's header list: extra headers as libcurl treats them: one that
 * names a default header replaces it, "Name:" with no value drops it. */
static int user_has(const char *const *hs, int n, const char *name) {
    size_t nl = strlen(name);
    for (int i = 0; i < n; i++)
        if (header_name_len(hs[i]) == nl && !strncasecmp(hs[i], name, nl)) return 1;
    return 0;
}

static tb_status format_requests(tb_h1_client *cl, const tb_bench_config *c, const tb_workload *w,
                                 const h1_url *u) {
    const char *hs[TB_BENCH_MAX_HEADERS + 4];
    char auth[1100];
    int nh = 0;
    int post = c->endpoint != TB_EP_GET;
    if (post) hs[nh++] = "Content-Type: application/json";
    hs[nh++] = "Expect:";
    if (c->api_key) {
        if (strlen(c->api_key) > 1000) return tb_errorf(TB_ERR_INVALID_ARG, "--api-key is too long");
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->api_key);
        hs[nh++] = auth;
    }
    for (int i = 0; i < c->n_headers && nh < TB_BENCH_MAX_HEADERS + 4; i++) hs[nh++] = c->headers[i];

    h1_sb head = {0};
    sb_str(&head, post ? "POST " : "GET ");
    if (u->path_len == 0 || u->path[0] != '/') sb_str(&head, "/");
    sb_add(&head, u->path, u->path_len);
    sb_str(&head, " HTTP/1.1\r\n");
    if (!user_has(hs, nh, "Host")) {
        sb_str(&head, "Host: ");
        sb_add(&head, u->host, u->host_len);
        if (u->port_len) { sb_str(&head, ":"); sb_add(&head, u->port, u->port_len); }
        sb_str(&head, "\r\n");
    }
    if (!user_has(hs, nh, "Accept")) sb_str(&head, "Accept: */*\r\n");
    for (int i = 0; i < nh; i++) {
        if (header_is_empty(hs[i])) continue;
        size_t l = strlen(hs[i]);
        while (l && (hs[i][l - 1] == '\r' || hs[i][l - 1] == '\n')) l--;
        sb_add(&head, hs[i], l);
        sb_str(&head, "\r\n");
    }
    int own_len = post && !user_has(hs, nh, "Content-Length");
    if (head.oom) { free(head.p); return tb_errorf(TB_ERR_OOM, "bench: out of memory"); }

    cl->n_reqs = post ? w->n : 1;
    cl->reqs = calloc((size_t)cl->n_reqs, sizeof *cl->reqs);
    if (!cl->reqs) { free(head.p); return tb_errorf(TB_ERR_OOM, "bench: out of memory"); }
    for (int i = 0; i < cl->n_reqs; i++) {
        h1_sb b = {0};
        sb_add(&b, head.p, head.n);
        if (own_len) {
            char cl_line[64];
            snprintf(cl_line, sizeof cl_line, "Content-Length: %zu\r\n", w->reqs[i].body_len);
            sb_str(&b, cl_line);
        }
        sb_str(&b, "\r\n");
        if (post && w->reqs[i].body_len) sb_add(&b, w->reqs[i].body, w->reqs[i].body_len);
        if (b.oom) { free(b.p); free(head.p); return tb_errorf(TB_ERR_OOM, "bench: out of memory"); }
        cl->reqs[i].p = b.p;
        cl->reqs[i].n = b.n;
    }
    cl->rq_head = head.p;
    cl->head_len = head.n;
    cl->own_len = own_len;
    return TB_OK;
}

/* ---------------------------------------------------------------- setup */

tb_status tb_h1_create(const tb_bench_config *c, const tb_workload *w, int epfd, int max_conns,
                       tb_h1_body_fn body, tb_h1_done_fn done, tb_h1_client **out) {
    *out = NULL;
    h1_url u;
    if (!parse_url(c->url, &u)) return tb_errorf(TB_ERR_INVALID_ARG, "bench: the built-in client takes plain http://host[:port]/path URLs, not '%s'", c->url);
    if (max_conns < 1) return tb_errorf(TB_ERR_INVALID_ARG, "bench: no connections");
    tb_h1_client *cl = calloc(1, sizeof *cl);
    if (!cl) return tb_errorf(TB_ERR_OOM, "bench: out of memory");
    cl->epfd = epfd;
    cl->timeout = c->timeout;
    cl->connect_timeout = c->connect_timeout > 0 ? c->connect_timeout : 300;
    cl->body = body;
    cl->done = done;
    tb_status st = format_requests(cl, c, w, &u);
    if (st != TB_OK) { tb_h1_free(cl); return st; }
    cl->conns = calloc((size_t)max_conns, sizeof *cl->conns);
    cl->rbuf = malloc(H1_READ_BUF);
    if (!cl->conns || !cl->rbuf) { tb_h1_free(cl); return tb_errorf(TB_ERR_OOM, "bench: out of memory"); }
    cl->n_conns = max_conns;
    for (int i = 0; i < max_conns; i++) cl->conns[i].fd = -1;

    /* resolve once; a name that does not resolve fails each request as a connect error */
    char host[260], port[8];
    const char *h = u.host;
    size_t hl = u.host_len;
    if (hl >= 2 && h[0] == '[') { h++; hl -= 2; }
    snprintf(host, sizeof host, "%.*s", (int)hl, h);
    snprintf(port, sizeof port, "%.*s", (int)u.port_len, u.port_len ? u.port : "80");
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) == 0) {
        for (struct addrinfo *a = res; a && cl->n_addrs < H1_MAX_ADDRS; a = a->ai_next) {
            if (a->ai_addrlen > sizeof cl->addrs[0]) continue;
            memcpy(&cl->addrs[cl->n_addrs], a->ai_addr, a->ai_addrlen);
            cl->addr_len[cl->n_addrs] = a->ai_addrlen;
            cl->addr_family[cl->n_addrs] = a->ai_family;
            cl->n_addrs++;
        }
        freeaddrinfo(res);
    }
    *out = cl;
    return TB_OK;
}

void tb_h1_free(tb_h1_client *cl) {
    if (!cl) return;
    for (int i = 0; i < cl->n_conns; i++) {
        if (cl->conns[i].fd >= 0) close(cl->conns[i].fd);
        free(cl->conns[i].hbuf);
        free(cl->conns[i].own);
    }
    free(cl->rq_head);
    for (int i = 0; i < cl->n_reqs; i++) free(cl->reqs ? cl->reqs[i].p : NULL);
    free(cl->reqs);
    free(cl->conns);
    free(cl->rbuf);
    free(cl);
}

/* ---------------------------------------------------------------- deadlines */

static void list_del(tb_h1_client *cl, h1_conn *c, int k) {
    if (!c->listed[k]) return;
    if (c->prev[k]) c->prev[k]->next[k] = c->next[k];
    else cl->head[k] = c->next[k];
    if (c->next[k]) c->next[k]->prev[k] = c->prev[k];
    else cl->tail[k] = c->prev[k];
    c->prev[k] = c->next[k] = NULL;
    c->listed[k] = 0;
}

static void list_add(tb_h1_client *cl, h1_conn *c, int k, double deadline) {
    list_del(cl, c, k);
    c->deadline[k] = deadline;
    h1_conn *after = cl->tail[k];
    while (after && after->deadline[k] > deadline) after = after->prev[k];
    c->prev[k] = after;
    c->next[k] = after ? after->next[k] : cl->head[k];
    if (c->next[k]) c->next[k]->prev[k] = c;
    else cl->tail[k] = c;
    if (after) after->next[k] = c;
    else cl->head[k] = c;
    c->listed[k] = 1;
}

double tb_h1_next_deadline(const tb_h1_client *cl) {
    if (!cl) return INFINITY;
    if (cl->pend_head) return 0;
    double d = INFINITY;
    for (int k = 0; k < L_COUNT; k++)
        if (cl->head[k] && cl->head[k]->deadline[k] < d) d = cl->head[k]->deadline[k];
    return d;
}

/* ---------------------------------------------------------------- connections */

static void conn_close(h1_conn *c) {
    if (c->fd >= 0) close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
    c->ev = 0;
    c->state = C_CLOSED;
    c->n_served = 0;
}

static int set_events(tb_h1_client *cl, h1_conn *c, uint32_t ev) {
    if (c->ev == ev) return 0;
    struct epoll_event e = {0};
    e.events = ev;
    e.data.u64 = TB_H1_TAG | (uint64_t)(c - cl->conns);
    int rc = epoll_ctl(cl->epfd, c->ev ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &e);
    if (rc == 0) c->ev = ev;
    return rc;
}

static void parser_reset(h1_conn *c) {
    c->ps = P_HEAD;
    c->status = 0;
    c->keep = 1;
    c->remaining = c->body_total = 0;
    c->chunk_digits = 0;
    c->ext_bytes = c->trailer_bytes = 0;
    c->hlen = 0;
}

/* The status of a status line at h (0: none there), as far as it came. */
static int peek_status(const char *h, size_t n) {
    if (n < 12 || memcmp(h, "HTTP/1.", 7) || (h[7] != '0' && h[7] != '1') || h[8] != ' ') return 0;
    for (int i = 9; i < 12; i++)
        if (h[i] < '0' || h[i] > '9') return 0;
    return (h[9] - '0') * 100 + (h[10] - '0') * 10 + (h[11] - '0');
}

/* Ends the current request: err < 0 is success. The connection stays open
 * only after a complete response the server let us keep. */
static void complete(tb_h1_client *cl, h1_conn *c, int err, const char *msg, double now) {
    list_del(cl, c, L_REQ);
    list_del(cl, c, L_CONN);
    /* a failure amid the headers still reports a status line that arrived */
    if (c->ps == P_HEAD && !c->status && c->hlen) c->status = peek_status(c->hbuf, c->hlen);
    if (err >= 0 || !c->keep || c->state != C_READING || c->ps != P_DONE) conn_close(c);
    else {
        c->state = C_IDLE;
        c->n_served++;
    }
    if (cl->starting) {
        c->pend_err = err;
        c->pend_msg = msg;
        c->pend_next = NULL;
        if (cl->pend_tail) cl->pend_tail->pend_next = c;
        else cl->pend_head = c;
        cl->pend_tail = c;
        return;
    }
    void *ud = c->ud;
    c->ud = NULL;
    cl->done(ud, err, msg, c->status, now);
}

static void open_conn(tb_h1_client *cl, h1_conn *c, double now);

/* A failure. Before any response byte on a reused connection it is the
 * server having closed an idle connection: send again on a new one. */
static void fail(tb_h1_client *cl, h1_conn *c, int err, const char *msg, double now) {
    int reused = c->n_served > 0;
    if (err == TB_BERR_CONNECT && reused && !c->got_any && c->retries < H1_MAX_RETRIES) {
        c->retries++;
        conn_close(c);
        open_conn(cl, c, now);
        return;
    }
    complete(cl, c, err, msg, now);
}

static void try_send(tb_h1_client *cl, h1_conn *c, double now) {
    for (int k = 0; k < 1024 && c->sent < c->req_len; k++) {
        ssize_t n = send(c->fd, c->req + c->sent, c->req_len - c->sent, MSG_NOSIGNAL);
        if (n > 0) { c->sent += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (set_events(cl, c, EPOLLIN | EPOLLOUT)) fail(cl, c, TB_BERR_CONNECT, MSG_SEND, now);
            return;
        }
        fail(cl, c, TB_BERR_CONNECT, MSG_SEND, now);
        return;
    }
    if (c->sent < c->req_len) {
        if (set_events(cl, c, EPOLLIN | EPOLLOUT)) fail(cl, c, TB_BERR_CONNECT, MSG_SEND, now);
        return;
    }
    if (c->state == C_SENDING) c->state = C_READING;
    if (set_events(cl, c, EPOLLIN)) fail(cl, c, TB_BERR_CONNECT, MSG_SEND, now);
}

/* Connects from address c->addr on; failures move to the next address. */
static void connect_from(tb_h1_client *cl, h1_conn *c, double now) {
    for (; c->addr < cl->n_addrs; c->addr++) {
        int a = c->addr;
        int fd = socket(cl->addr_family[a], SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int rc = connect(fd, (struct sockaddr *)&cl->addrs[a], cl->addr_len[a]);
        if (rc != 0 && errno != EINPROGRESS) { close(fd); continue; }
        c->fd = fd;
        c->ev = 0;
        if (rc == 0) {
            list_del(cl, c, L_CONN);
            c->state = C_SENDING;
            try_send(cl, c, now);
            return;
        }
        c->state = C_CONNECTING;
        if (set_events(cl, c, EPOLLOUT)) { conn_close(c); continue; }
        return;
    }
    c->state = C_CLOSED;
    complete(cl, c, TB_BERR_CONNECT, cl->n_addrs ? MSG_CONNECT : MSG_RESOLVE, now);
}

static void open_conn(tb_h1_client *cl, h1_conn *c, double now) {
    c->addr = 0;
    c->got_any = 0;
    c->sent = 0;
    parser_reset(c);
    list_add(cl, c, L_CONN, now + cl->connect_timeout);
    connect_from(cl, c, now);
}

static void on_connected(tb_h1_client *cl, h1_conn *c, double now) {
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (err) {
        conn_close(c);
        c->addr++;
        connect_from(cl, c, now);
        return;
    }
    list_del(cl, c, L_CONN);
    c->state = C_SENDING;
    try_send(cl, c, now);
}

/* ---------------------------------------------------------------- responses */

static int hex_value(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* The end of a header block (just past its empty line), searching from
 * `from`; 0 when not there yet. */
static size_t head_end(const char *b, size_t n, size_t from) {
    size_t i = from > 2 ? from - 2 : 0;
    for (;;) {
        const char *nl = memchr(b + i, '\n', n - i);
        if (!nl) return 0;
        size_t k = (size_t)(nl - b) + 1;
        if (k < n && b[k] == '\n') return k + 1;
        if (k + 1 < n && b[k] == '\r' && b[k + 1] == '\n') return k + 2;
        if (k >= n) return 0;
        i = k;
    }
}

static int value_has(const char *v, size_t n, const char *word) {
    size_t wl = strlen(word);
    for (size_t i = 0; i + wl <= n; i++)
        if (!strncasecmp(v + i, word, wl)) return 1;
    return 0;
}

/* Parses one header block. 0: fine; -1: malformed; -2: not HTTP/1.x. */
static int parse_head(h1_conn *c, const char *h, size_t n) {
    const char *end = h + n, *p = h;
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol || !peek_status(p, (size_t)(eol - p))) return -2;
    int http10 = p[7] == '0';
    if (eol - p > 12 && p[12] != ' ' && p[12] != '\r') return -1;
    c->status = peek_status(p, (size_t)(eol - p));
    int chunked = 0, has_len = 0, conn_close_hdr = 0, conn_keep = 0;
    uint64_t len = 0;
    for (p = eol + 1; p < end;) {
        eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *le = eol;
        if (le > p && le[-1] == '\r') le--;
        const char *colon = memchr(p, ':', (size_t)(le - p));
        /* folded continuation lines and lines without a colon are skipped */
        if (le > p && *p != ' ' && *p != '\t' && colon) {
            size_t nl = (size_t)(colon - p);
            const char *v = colon + 1;
            while (v < le && (*v == ' ' || *v == '\t')) v++;
            const char *ve = le;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            size_t vl = (size_t)(ve - v);
            if (nl == 14 && !strncasecmp(p, "Content-Length", 14)) {
                if (!vl) return -1;
                uint64_t x = 0;
                for (size_t i = 0; i < vl; i++) {
                    if (v[i] < '0' || v[i] > '9' || x > UINT64_MAX / 10 - 10) return -1;
                    x = x * 10 + (uint64_t)(v[i] - '0');
                }
                if (has_len && x != len) return -1;
                has_len = 1;
                len = x;
            } else if (nl == 17 && !strncasecmp(p, "Transfer-Encoding", 17)) {
                if (value_has(v, vl, "chunked")) chunked = 1;
            } else if (nl == 10 && !strncasecmp(p, "Connection", 10)) {
                if (value_has(v, vl, "close")) conn_close_hdr = 1;
                if (value_has(v, vl, "keep-alive")) conn_keep = 1;
            }
        }
        p = eol + 1;
    }
    c->keep = http10 ? conn_keep && !conn_close_hdr : !conn_close_hdr;
    if (c->status >= 100 && c->status < 200) {
        if (c->status == 101) return -1;
        c->ps = P_HEAD; /* an interim response: the real one follows */
        return 0;
    }
    c->remaining = 0;
    if (c->status == 204 || c->status == 304) c->ps = P_DONE;
    else if (chunked) { c->ps = P_CHUNK_SIZE; c->chunk_digits = 0; }
    else if (has_len) { c->remaining = len; c->ps = len ? P_BODY_LEN : P_DONE; }
    else { c->ps = P_BODY_CLOSE; c->keep = 0; }
    return 0;
}

/* Hands body bytes to the caller. 0: fine; -1: over the size limit. */
static int deliver(tb_h1_client *cl, h1_conn *c, const char *p, size_t n, double now) {
    c->body_total += n;
    if (c->body_total > TB_BENCH_MAX_BODY) return -1;
    cl->body(c->ud, c->status, p, n, now);
    return 0;
}

#define PARSE_MORE 0
#define PARSE_DONE 1
#define PARSE_ERROR 2

/* Consumes n bytes of response. On PARSE_ERROR *err and *msg are set. */
static int parse(tb_h1_client *cl, h1_conn *c, const char *p, size_t n, double now,
                 int *err, const char **msg) {
    while (n > 0 && c->ps != P_DONE) {
        switch (c->ps) {
        case P_HEAD: {
            size_t e;
            const char *h;
            size_t used;
            if (c->hlen == 0 && (e = head_end(p, n, 0)) != 0) {
                h = p;
                used = e;
            } else {
                size_t old = c->hlen, take = n;
                if (old + take > H1_MAX_HEADER) take = H1_MAX_HEADER - old;
                if (old + take > c->hcap) {
                    size_t nc = c->hcap ? c->hcap : 1024;
                    while (nc < old + take) nc *= 2;
                    if (nc > H1_MAX_HEADER) nc = H1_MAX_HEADER;
                    char *nb = realloc(c->hbuf, nc);
                    if (!nb) { *err = TB_BERR_OTHER; *msg = MSG_OOM; return PARSE_ERROR; }
                    c->hbuf = nb;
                    c->hcap = nc;
                }
                memcpy(c->hbuf + old, p, take);
                c->hlen = old + take;
                e = head_end(c->hbuf, c->hlen, old);
                if (!e) {
                    if (c->hlen >= H1_MAX_HEADER) {
                        *err = TB_BERR_OTHER;
                        *msg = "response headers larger than 100 KiB";
                        return PARSE_ERROR;
                    }
                    return PARSE_MORE;
                }
                h = c->hbuf;
                used = e - old;
            }
            int hr = parse_head(c, h, e);
            if (hr != 0) { *err = TB_BERR_OTHER; *msg = hr == -2 ? MSG_NOT_HTTP : MSG_WEIRD; return PARSE_ERROR; }
            c->hlen = 0;
            p += used;
            n -= used;
            break;
        }
        case P_BODY_LEN: {
            size_t k = n < c->remaining ? n : (size_t)c->remaining;
            if (deliver(cl, c, p, k, now)) { *err = TB_BERR_OTHER; *msg = MSG_TOO_BIG; return PARSE_ERROR; }
            c->remaining -= k;
            p += k;
            n -= k;
            if (!c->remaining) c->ps = P_DONE;
            break;
        }
        case P_BODY_CLOSE:
            if (deliver(cl, c, p, n, now)) { *err = TB_BERR_OTHER; *msg = MSG_TOO_BIG; return PARSE_ERROR; }
            n = 0;
            break;
        case P_CHUNK_DATA: {
            size_t k = n < c->remaining ? n : (size_t)c->remaining;
            if (deliver(cl, c, p, k, now)) { *err = TB_BERR_OTHER; *msg = MSG_TOO_BIG; return PARSE_ERROR; }
            c->remaining -= k;
            p += k;
            n -= k;
            if (!c->remaining) c->ps = P_CHUNK_DATA_CR;
            break;
        }
        default: {
            /* the byte-wise states of the chunked framing */
            char ch = *p++;
            n--;
            int bad = 0, line_end = 0;
            switch (c->ps) {
            case P_CHUNK_SIZE: {
                int v = hex_value(ch);
                if (v >= 0) {
                    if (c->chunk_digits >= 16) bad = 1;
                    else { c->remaining = c->remaining * 16 + (uint64_t)v; c->chunk_digits++; }
                } else if (ch == ';' || ch == ' ' || ch == '\t') {
                    c->ps = P_CHUNK_EXT;
                    c->ext_bytes = 0;
                } else if (ch == '\r') c->ps = P_CHUNK_SIZE_LF;
                else if (ch == '\n') line_end = 1;
                else bad = 1;
                break;
            }
            case P_CHUNK_EXT:
                if (ch == '\n') line_end = 1;
                else if (++c->ext_bytes > H1_MAX_CHUNK_EXT) bad = 1;
                break;
            case P_CHUNK_SIZE_LF:
                if (ch == '\n') line_end = 1;
                else bad = 1;
                break;
            case P_CHUNK_DATA_CR:
                if (ch == '\r') c->ps = P_CHUNK_DATA_LF;
                else if (ch == '\n') { c->ps = P_CHUNK_SIZE; c->chunk_digits = 0; c->remaining = 0; }
                else bad = 1;
                break;
            case P_CHUNK_DATA_LF:
                if (ch == '\n') { c->ps = P_CHUNK_SIZE; c->chunk_digits = 0; c->remaining = 0; }
                else bad = 1;
                break;
            case P_TRAILER_START:
                if (ch == '\r') c->ps = P_TRAILER_CR;
                else if (ch == '\n') c->ps = P_DONE;
                else c->ps = P_TRAILER_LINE;
                break;
            case P_TRAILER_LINE:
                if (ch == '\n') c->ps = P_TRAILER_START;
                break;
            case P_TRAILER_CR:
                if (ch == '\n') c->ps = P_DONE;
                else bad = 1;
                break;
            default:
                bad = 1;
            }
            if (line_end) {
                if (!c->chunk_digits) bad = 1;
                else if (c->remaining == 0) { c->ps = P_TRAILER_START; c->trailer_bytes = 0; }
                else c->ps = P_CHUNK_DATA;
            }
            if (c->ps == P_TRAILER_LINE || c->ps == P_TRAILER_START || c->ps == P_TRAILER_CR)
                if (++c->trailer_bytes > H1_MAX_TRAILER) bad = 1;
            if (bad) { *err = TB_BERR_CONNECT; *msg = MSG_RECV; return PARSE_ERROR; }
        }
        }
    }
    if (c->ps != P_DONE) return PARSE_MORE;
    if (n > 0) c->keep = 0; /* bytes beyond the response: do not reuse */
    return PARSE_DONE;
}

/* The connection hit its end: what that means depends on where the response is. */
static void on_eof(tb_h1_client *cl, h1_conn *c, double now) {
    if (c->state == C_IDLE) { conn_close(c); return; }
    if (!c->got_any) { fail(cl, c, TB_BERR_CONNECT, MSG_NOTHING, now); return; }
    if (c->ps == P_HEAD) { fail(cl, c, TB_BERR_CONNECT, MSG_RECV, now); return; }
    if (c->ps == P_BODY_CLOSE) {
        c->ps = P_DONE;
        c->keep = 0;
        c->state = C_READING;
        complete(cl, c, -1, NULL, now);
        return;
    }
    fail(cl, c, TB_BERR_STREAM, MSG_PARTIAL, now);
}

static void on_readable(tb_h1_client *cl, h1_conn *c) {
    for (int k = 0; k < H1_READS_PER_EVENT; k++) {
        ssize_t n = recv(c->fd, cl->rbuf, H1_READ_BUF, 0);
        double now = tb_now();
        if (n == 0) { on_eof(cl, c, now); return; }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (c->state == C_IDLE) { conn_close(c); return; }
            /* a reset after a body that ends with the connection ends it */
            if (c->got_any && c->ps == P_BODY_CLOSE) { on_eof(cl, c, now); return; }
            fail(cl, c, TB_BERR_CONNECT, MSG_RECV, now);
            return;
        }
        if (c->state == C_IDLE) { conn_close(c); return; } /* unsolicited bytes */
        c->got_any = 1;
        int err = 0;
        const char *msg = NULL;
        int r = parse(cl, c, cl->rbuf, (size_t)n, now, &err, &msg);
        if (r == PARSE_ERROR) { c->keep = 0; fail(cl, c, err, msg, now); return; }
        if (r == PARSE_DONE) {
            if (c->state == C_SENDING) c->keep = 0; /* answered before we finished sending */
            c->state = C_READING;
            complete(cl, c, -1, NULL, now);
            return;
        }
        if ((size_t)n < H1_READ_BUF) return;
    }
}

/* ---------------------------------------------------------------- the caller's side */

static void start_bytes(tb_h1_client *cl, h1_conn *c, const char *p, size_t n, void *ud, double now);

void tb_h1_start(tb_h1_client *cl, int idx, long req, void *ud, double now) {
    const h1_bytes *rq = &cl->reqs[req % cl->n_reqs];
    start_bytes(cl, &cl->conns[idx], rq->p, rq->n, ud, now);
}

tb_status tb_h1_start_body(tb_h1_client *cl, int idx, const char *body, size_t len, const char *extra,
                           void *ud, double now) {
    h1_conn *c = &cl->conns[idx];
    char cl_line[64] = "";
    if (cl->own_len) snprintf(cl_line, sizeof cl_line, "Content-Length: %zu\r\n", len);
    size_t el = extra ? strlen(extra) : 0;
    size_t need = cl->head_len + el + 2 + strlen(cl_line) + 2 + len + 1;
    if (need > c->own_cap) {
        char *np = realloc(c->own, need);
        if (!np) return tb_errorf(TB_ERR_OOM, "bench: out of memory");
        c->own = np;
        c->own_cap = need;
    }
    size_t k = 0;
    memcpy(c->own, cl->rq_head, cl->head_len);
    k += cl->head_len;
    if (el) {
        memcpy(c->own + k, extra, el);
        k += el;
        memcpy(c->own + k, "\r\n", 2);
        k += 2;
    }
    memcpy(c->own + k, cl_line, strlen(cl_line));
    k += strlen(cl_line);
    memcpy(c->own + k, "\r\n", 2);
    k += 2;
    memcpy(c->own + k, body, len);
    k += len;
    start_bytes(cl, c, c->own, k, ud, now);
    return TB_OK;
}

static void start_bytes(tb_h1_client *cl, h1_conn *c, const char *p, size_t n, void *ud, double now) {
    cl->starting = 1;
    c->ud = ud;
    c->req = p;
    c->req_len = n;
    c->sent = 0;
    c->got_any = 0;
    c->retries = 0;
    parser_reset(c);
    if (cl->timeout > 0) list_add(cl, c, L_REQ, now + cl->timeout);
    if (c->state == C_IDLE && c->fd >= 0) {
        c->state = C_SENDING;
        try_send(cl, c, now);
    } else {
        conn_close(c);
        open_conn(cl, c, now);
    }
    cl->starting = 0;
}

void tb_h1_event(tb_h1_client *cl, uint64_t tag, uint32_t events) {
    uint64_t idx = tag & ~TB_H1_TAG;
    if (idx >= (uint64_t)cl->n_conns) return;
    h1_conn *c = &cl->conns[idx];
    if (c->fd < 0) return;
    if (c->state == C_CONNECTING) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) on_connected(cl, c, tb_now());
        return;
    }
    if ((events & EPOLLOUT) && c->state == C_SENDING) {
        try_send(cl, c, tb_now());
        if (c->state != C_SENDING && c->state != C_READING) return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(cl, c);
}

/* Delivers the completions queued while starting requests. */
static void flush_pending(tb_h1_client *cl, double now) {
    for (int k = 0; k < cl->n_conns && cl->pend_head; k++) {
        h1_conn *c = cl->pend_head;
        cl->pend_head = c->pend_next;
        if (!cl->pend_head) cl->pend_tail = NULL;
        void *ud = c->ud;
        c->ud = NULL;
        cl->done(ud, c->pend_err, c->pend_msg, c->status, now);
    }
}

void tb_h1_poll(tb_h1_client *cl, double now) {
    if (!cl) return;
    flush_pending(cl, now);
    for (int k = 0; k < L_COUNT; k++) {
        for (int guard = 0; guard < cl->n_conns && cl->head[k] && cl->head[k]->deadline[k] <= now; guard++) {
            h1_conn *c = cl->head[k];
            c->keep = 0;
            complete(cl, c, TB_BERR_TIMEOUT, MSG_TIMEOUT, now);
        }
    }
}

void tb_h1_cancel(tb_h1_client *cl, int idx, double now) {
    flush_pending(cl, now);
    h1_conn *c = &cl->conns[idx];
    if (!c->ud) return;
    c->keep = 0;
    complete(cl, c, TB_BERR_TIMEOUT, MSG_TIMEOUT, now);
}
