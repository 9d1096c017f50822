/* scheduler.c — the continuous-batching loop (see scheduler.h). */
#define _GNU_SOURCE
#include "serve/scheduler.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/kv_layout.h"
#include "runtime/runtime.h"

const char *tb_finish_reason_str(tb_finish_reason r) {
    switch (r) {
    case TB_FINISH_STOP: return "stop";
    case TB_FINISH_LENGTH: return "length";
    case TB_FINISH_CANCELLED: return "cancelled";
    case TB_FINISH_ERROR: return "error";
    default: return "none";
    }
}

/* ---------------------------------------------------------------- requests */

/* What a request holds before it generates: its buffers grow (doubling) with
 * what is in flight, up to what max_tokens allows, so that a request that may
 * run to a long context (a chat request without max_tokens, times n choices)
 * takes memory only for the tokens it makes and the events its reader has
 * not taken yet. */
#define TB_EVENTS_INITIAL 16 /* events a request's ring holds before it grows */
#define TB_TOKENS_INITIAL 64 /* generated tokens room is made for at first */

struct tb_request {
    _Atomic int refs;
    _Atomic int cancel;          /* a tb_finish_reason, 0 = none */
    tb_request_params p;
    int vocab;
    int32_t *tokens;             /* (tok_cap) prompt, then generated; grown up to n_prompt + max_tokens */
    int tok_cap;
    int n_prompt, n_gen, n_computed; /* n_computed: tokens in the KV cache */
    int seq;                     /* context slot, -1 when not running */
    /* the runtime's generation loop on tokens: its sampler and the end
     * check (EOS, min/max tokens, the context); the text side (stop
     * strings) runs on the reader's thread (server.c) */
    tb_gen gen;
    tb_request *next;            /* in the scheduler's lists */
    /* events, guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tb_token_event *events;      /* ring of ev_cap entries, grown up to ev_limit */
    int ev_head, ev_count, ev_cap, ev_limit;
    tb_finish_reason finished;
    double t_submit, t_admit, t_first, t_last;
    int preemptions;
    int cached;                  /* prompt tokens found in the prefix cache at first admission */
    tb_token_event *plp;         /* (n_prompt) score_prompt: entry i scores prompt token i >= 1 */
    int plp_done;                /* entries 1 .. plp_done written (guarded by mu) */
};

tb_request *tb_request_new(const int32_t *prompt, int n_prompt, const tb_request_params *p,
                           const tb_engine_info *info) {
    if (n_prompt <= 0 || p->max_tokens <= 0) return NULL;
    tb_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->p = *p;
    r->vocab = info->vocab_size;
    r->n_prompt = n_prompt;
    r->seq = -1;
    r->tok_cap = n_prompt + (p->max_tokens < TB_TOKENS_INITIAL ? p->max_tokens : TB_TOKENS_INITIAL);
    r->tokens = malloc(sizeof(int32_t) * (size_t)r->tok_cap);
    /* what a reader keeps up with fits the first allocation; the ring grows
     * (doubling) only while one falls behind */
    r->ev_limit = p->max_buffered > 0 && p->max_buffered <= p->max_tokens ? p->max_buffered : p->max_tokens + 1;
    r->ev_cap = r->ev_limit < TB_EVENTS_INITIAL ? r->ev_limit : TB_EVENTS_INITIAL;
    r->p.label[sizeof r->p.label - 1] = 0;
    r->events = malloc(sizeof(tb_token_event) * (size_t)r->ev_cap);
    if (p->score_prompt) r->plp = calloc((size_t)n_prompt, sizeof(tb_token_event));
    tb_gen_options go;
    tb_gen_options_default(&go);
    go.max_tokens = p->max_tokens;
    if (info->max_seq_len > n_prompt && info->max_seq_len - n_prompt < go.max_tokens)
        go.max_tokens = info->max_seq_len - n_prompt; /* the context ends it too */
    go.min_tokens = p->min_tokens;
    go.ignore_eos = p->ignore_eos;
    go.sampling = &p->sampling;
    if (!r->tokens || !r->events || (p->score_prompt && !r->plp) ||
        tb_gen_init(&r->gen, info, NULL, prompt[n_prompt - 1], &go) != TB_OK) {
        tb_gen_free(&r->gen);
        free(r->tokens);
        free(r->events);
        free(r->plp);
        free(r);
        return NULL;
    }
    memcpy(r->tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
    pthread_mutex_init(&r->mu, NULL);
    /* timed waits count on the monotonic clock: a step of the wall clock
     * (NTP, an operator) must neither end them early nor stretch them */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_store(&r->refs, 1);
    return r;
}

void tb_request_release(tb_request *r) {
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    tb_gen_free(&r->gen);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->tokens);
    free(r->events);
    free(r->plp);
    free(r);
}

void tb_request_cancel(tb_request *r, tb_finish_reason why) {
    int none = 0;
    atomic_compare_exchange_strong(&r->cancel, &none, (int)why);
}

/* Queues an event for the reader. Returns 0 when the reader has left
 * ev_limit events unread (or the ring cannot grow): the caller ends it. */
static int push_event(tb_request *r, const tb_token_event *ev) {
    pthread_mutex_lock(&r->mu);
    if (r->ev_count == r->ev_cap && r->ev_cap < r->ev_limit) {
        int cap = r->ev_cap * 2 < r->ev_limit ? r->ev_cap * 2 : r->ev_limit;
        tb_token_event *e = malloc(sizeof(tb_token_event) * (size_t)cap);
        if (e) { /* unrolled so the ring starts at 0 */
            for (int i = 0; i < r->ev_count; i++) e[i] = r->events[(r->ev_head + i) % r->ev_cap];
            free(r->events);
            r->events = e;
            r->ev_head = 0;
            r->ev_cap = cap;
        }
    }
    int ok = r->ev_count < r->ev_cap;
    if (ok) {
        r->events[(r->ev_head + r->ev_count) % r->ev_cap] = *ev;
        r->ev_count++;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* Makes room for one more token of r (scheduler thread). Returns 0 when the
 * buffer cannot grow: the caller ends the request. */
static int reserve_token(tb_request *r) {
    int need = r->n_prompt + r->n_gen + 1;
    if (need <= r->tok_cap) return 1;
    int limit = r->n_prompt + r->p.max_tokens;
    int cap = r->tok_cap * 2 < limit ? r->tok_cap * 2 : limit;
    if (cap < need) return 0; /* past max_tokens: never asked for */
    int32_t *t = realloc(r->tokens, sizeof(int32_t) * (size_t)cap);
    if (!t) return 0;
    r->tokens = t;
    r->tok_cap = cap;
    return 1;
}

static void finish(tb_request *r, tb_finish_reason why) {
    pthread_mutex_lock(&r->mu);
    if (!r->finished) r->finished = why;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int tb_request_wait(tb_request *r, tb_token_event *out, int cap, tb_finish_reason *finished, double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock r->cv waits on */
    double t = ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&r->mu);
    while (r->ev_count == 0 && !r->finished)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0) break;
    int n = 0;
    while (n < cap && r->ev_count > 0) {
        out[n++] = r->events[r->ev_head];
        r->ev_head = (r->ev_head + 1) % r->ev_cap;
        r->ev_count--;
    }
    *finished = r->ev_count == 0 ? r->finished : TB_FINISH_NONE;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void tb_request_times(const tb_request *r, double *submitted, double *admitted, double *first) {
    if (submitted) *submitted = r->t_submit;
    if (admitted) *admitted = r->t_admit;
    if (first) *first = r->t_first;
}
int tb_request_prompt_len(const tb_request *r) { return r->n_prompt; }
int tb_request_generated(const tb_request *r) { return r->n_gen; }
int tb_request_preemptions(const tb_request *r) { return r->preemptions; }
int tb_request_cached_tokens(const tb_request *r) { return r->cached; }
int tb_request_prompt_logprobs(tb_request *r, const tb_token_event **out) {
    *out = r->plp ? r->plp + 1 : NULL;
    pthread_mutex_lock(&r->mu);
    int n = r->plp ? r->plp_done : 0;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---------------------------------------------------------------- scheduler */

struct tb_sched {
    tb_context *ctx;
    tb_engine_info info;
    tb_sched_options o;
    tb_sched_observer obs;
    pthread_t thread;
    pthread_mutex_t mu;          /* guards incoming, stopping, stats */
    pthread_cond_t cv;
    tb_request *in_head, *in_tail; /* submitted, not yet seen by the loop */
    int n_incoming;
    int stopping;                /* 1: no new requests; 2: loop exits */
    double deadline;             /* drain deadline */
    /* owned by the loop thread */
    tb_request *waiting;         /* FIFO: admitted in order */
    tb_request **running;        /* (max_num_seqs) by slot */
    int n_running, n_waiting;
    tb_seq_chunk *chunks;
    tb_request **chunk_req;
    tb_row_sampling *rsamp;      /* (max_batched_tokens) how each row is sampled */
    tb_sample_result *sres;      /* (max_batched_tokens) */
    tb_sched_stats stats;
    int started;
    int share_prefill;           /* the context caches prefixes: defer requests that can share a running prefill */
};

static void list_push_back(tb_request **head, tb_request *r) {
    r->next = NULL;
    while (*head) head = &(*head)->next;
    *head = r;
}

static void list_push_front(tb_request **head, tb_request *r) {
    r->next = *head;
    *head = r;
}

/* Drops the request from the running set and returns its KV blocks. */
static void release_slot(tb_sched *s, tb_request *r) {
    if (r->seq < 0) return;
    tb_seq_reset(s->ctx, r->seq);
    s->running[r->seq] = NULL;
    r->seq = -1;
    s->n_running--;
}

/* Publishes the gauges (running, waiting, KV use; and the step's batch
 * size when batch >= 0) under the lock that /metrics reads them with. */
static void publish_stats(tb_sched *s, int batch) {
    int total_blocks = tb_kv_total_blocks(s->ctx);
    double kv = (double)(total_blocks - tb_kv_free_blocks(s->ctx)) / total_blocks;
    pthread_mutex_lock(&s->mu);
    s->stats.running = s->n_running;
    s->stats.waiting = s->n_waiting + s->n_incoming;
    if (batch >= 0) s->stats.batch_size = batch;
    s->stats.kv_usage = kv;
    pthread_mutex_unlock(&s->mu);
}

/* Ends a request. The gauges and the finish counters are updated before
 * the client is told, so a client that reads /metrics right after its
 * response sees its own request gone. */
static void end_request(tb_sched *s, tb_request *r, tb_finish_reason why) {
    release_slot(s, r);
    publish_stats(s, -1);
    if (s->obs.on_finish)
        s->obs.on_finish(s->obs.arg, why, r->n_prompt, r->n_gen, tb_now() - r->t_submit);
    finish(r, why);
    tb_request_release(r);
}

static int blocks_for(int tokens, int bs) { return (tokens + bs - 1) / bs; }

/* Whether r still scores its prompt: every prompt token must then be
 * computed (nothing from the prefix cache), a logits row each. Once it has
 * generated, the prompt is scored (a recomputation after a preemption
 * scores nothing). */
static int scoring(const tb_request *r) { return r->p.score_prompt && r->n_gen == 0; }
/* The prompt tokens a chunk of n_tokens from position c0 scores (each row
 * scores the token after its own): c0 + 1 .. c0 + the result, all < n_prompt. */
static int scored_rows(int n_prompt, int c0, int n_tokens) {
    int m = n_prompt - 1 - c0;
    return m <= 0 ? 0 : m < n_tokens ? m : n_tokens;
}

/* The alternatives a row of r reports (-1: no log-probabilities). */
static int row_top(const tb_request *r) {
    return r->p.logprobs < 0 ? -1 : r->p.logprobs > TB_MAX_TOP_LOGPROBS ? TB_MAX_TOP_LOGPROBS : r->p.logprobs;
}

/* Whether r's tokens share at least one full KV block with a running
 * request that has not computed that block yet: admitted after it, r takes
 * the block from the prefix cache instead of computing it alongside (n > 1
 * choices of one prompt; clients with one system prompt arriving together). */
static int wants_blocks_of_running(const tb_sched *s, const tb_request *r, int bs) {
    if (scoring(r)) return 0; /* takes no cached blocks */
    int rn = r->n_prompt + r->n_gen - 1; /* the last token is always computed */
    if (rn < bs) return 0;
    for (int i = 0; i < s->o.max_num_seqs; i++) {
        const tb_request *q = s->running[i];
        if (!q) continue;
        int qn = q->n_prompt + q->n_gen;
        if (qn <= bs || q->n_computed >= qn - 1 || memcmp(q->tokens, r->tokens, sizeof(int32_t) * (size_t)bs) != 0)
            continue;
        int lim = rn < qn ? rn : qn, common = bs;
        while (common < lim && q->tokens[common] == r->tokens[common]) common++;
        if (common / bs * bs > q->n_computed) return 1; /* q has yet to write a block r can take */
    }
    return 0;
}

static void *loop_main(void *arg) {
    tb_sched *s = arg;
    int bs = tb_kv_block_size(s->ctx);
    for (;;) {
        /* 1. take what was submitted */
        pthread_mutex_lock(&s->mu);
        while (!s->in_head && s->n_running == 0 && !s->waiting && s->stopping < 2) {
            /* idle: publish it (cancellations end requests without a step) */
            s->stats.running = s->stats.waiting = 0;
            s->stats.kv_usage = (double)(tb_kv_total_blocks(s->ctx) - tb_kv_free_blocks(s->ctx)) / tb_kv_total_blocks(s->ctx);
            if (s->stopping == 1) { s->stopping = 2; break; } /* drained */
            pthread_cond_wait(&s->cv, &s->mu);
        }
        tb_request *in = s->in_head;
        s->in_head = s->in_tail = NULL;
        s->n_incoming = 0;
        int stopping = s->stopping;
        double deadline = s->deadline;
        pthread_mutex_unlock(&s->mu);
        while (in) {
            tb_request *nx = in->next;
            list_push_back(&s->waiting, in);
            s->n_waiting++;
            in = nx;
        }
        if (stopping == 2 && s->n_running == 0 && !s->waiting) break;
        if (stopping && tb_now() > deadline) { /* grace period over */
            for (int i = 0; i < s->o.max_num_seqs; i++)
                if (s->running[i]) tb_request_cancel(s->running[i], TB_FINISH_CANCELLED);
            for (tb_request *w = s->waiting; w; w = w->next) tb_request_cancel(w, TB_FINISH_CANCELLED);
        }

        /* 2. drop cancelled requests */
        for (int i = 0; i < s->o.max_num_seqs; i++) {
            tb_request *r = s->running[i];
            if (r && atomic_load(&r->cancel)) end_request(s, r, (tb_finish_reason)atomic_load(&r->cancel));
        }
        for (tb_request **pp = &s->waiting; *pp;) {
            tb_request *r = *pp;
            if (atomic_load(&r->cancel)) {
                *pp = r->next;
                s->n_waiting--;
                end_request(s, r, (tb_finish_reason)atomic_load(&r->cancel));
            } else {
                pp = &r->next;
            }
        }

        /* 3. admit in FIFO order while slots and blocks allow; a request whose
         * prompt begins like one still being prefilled waits for its blocks */
        for (tb_request **pp = &s->waiting; *pp && s->n_running < s->o.max_num_seqs;) {
            tb_request *r = *pp;
            int need = blocks_for(r->n_prompt + r->n_gen + 1, bs);
            if (need > tb_kv_free_blocks(s->ctx) && s->n_running > 0) break;
            if (need > tb_kv_total_blocks(s->ctx)) { /* can never fit */
                *pp = r->next;
                s->n_waiting--;
                end_request(s, r, TB_FINISH_ERROR);
                continue;
            }
            if (need > tb_kv_free_blocks(s->ctx)) break;
            if (s->share_prefill && wants_blocks_of_running(s, r, bs)) {
                pp = &r->next;
                continue;
            }
            int slot = 0;
            while (s->running[slot]) slot++;
            *pp = r->next;
            s->n_waiting--;
            r->seq = slot;
            s->running[slot] = r;
            s->n_running++;
            /* blocks of the prefix cache need no computing (at least the last token is computed, for logits) */
            int known = r->n_prompt + r->n_gen;
            int hit = scoring(r) ? 0 : tb_seq_reuse_prefix(s->ctx, slot, r->tokens, known);
            r->n_computed = hit > 0 ? hit : 0;
            if (s->obs.on_prefix_lookup) s->obs.on_prefix_lookup(s->obs.arg, known, r->n_computed);
            if (r->t_admit == 0) {
                r->t_admit = tb_now();
                r->cached = r->n_computed < r->n_prompt ? r->n_computed : r->n_prompt;
            }
        }
        if (s->n_running == 0) continue;

        /* 4. build the step: decodes first, then prefill chunks */
        int budget = s->o.max_batched_tokens, n = 0, used = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < s->o.max_num_seqs && used < budget; i++) {
                tb_request *r = s->running[i];
                if (!r) continue;
                int total = r->n_prompt + r->n_gen, left = total - r->n_computed;
                int decoding = left == 1 && r->n_gen > 0;
                if ((pass == 0) != decoding || left <= 0) continue;
                int take = left < budget - used ? left : budget - used;
                /* a prompt being scored: a row per token (the last one's is drawn) */
                int lg = scoring(r) && r->n_computed < r->n_prompt - 1 ? 2 : take == left ? 1 : 0;
                s->chunks[n] = (tb_seq_chunk){r->seq, take, r->tokens + r->n_computed, lg};
                s->chunk_req[n++] = r;
                used += take;
            }
        }
        if (n == 0) continue;
        /* KV blocks: preempt the newest running sequences until the step fits */
        for (;;) {
            int need = 0;
            for (int k = 0; k < n; k++) {
                tb_request *r = s->chunk_req[k];
                need += blocks_for(r->n_computed + s->chunks[k].n_tokens, bs) - blocks_for(r->n_computed, bs);
            }
            if (need <= tb_kv_free_blocks(s->ctx) || s->n_running <= 1) break;
            tb_request *victim = NULL;
            for (int i = 0; i < s->o.max_num_seqs; i++) {
                tb_request *r = s->running[i];
                if (r && (!victim || r->t_admit > victim->t_admit)) victim = r;
            }
            for (int k = 0; k < n; k++)
                if (s->chunk_req[k] == victim) {
                    s->chunks[k] = s->chunks[n - 1];
                    s->chunk_req[k] = s->chunk_req[n - 1];
                    n--;
                    break;
                }
            release_slot(s, victim);
            victim->n_computed = 0;
            victim->preemptions++;
            list_push_front(&s->waiting, victim);
            s->n_waiting++;
            if (s->obs.on_preempt) s->obs.on_preempt(s->obs.arg);
        }
        if (n == 0) continue;

        /* 5. run and sample (on the device where the backend can) */
        int rows = 0;
        for (int k = 0; k < n; k++) {
            tb_request *r = s->chunk_req[k];
            if (!s->chunks[k].logits) continue;
            if (s->chunks[k].logits == 2) { /* rows scoring prompt tokens n_computed + 1 .. */
                int top = row_top(r) < 0 ? 0 : row_top(r);
                int nsc = scored_rows(r->n_prompt, r->n_computed, s->chunks[k].n_tokens);
                for (int j = 0; j < nsc; j++) {
                    int nx = r->n_computed + j + 1;
                    s->rsamp[rows++] = (tb_row_sampling){r->gen.sampler, r->tokens, nx, top, &r->tokens[nx]};
                }
                if (r->n_computed + s->chunks[k].n_tokens < r->n_prompt) continue; /* no draw yet */
            }
            s->rsamp[rows++] = (tb_row_sampling){r->gen.sampler, r->tokens, r->n_prompt + r->n_gen, row_top(r), NULL};
        }
        double t0 = tb_now();
        tb_status st = tb_context_step_sample(s->ctx, s->chunks, n, s->rsamp, s->sres, &rows);
        double t1 = tb_now();
        if (st != TB_OK) {
            tb_log(TB_LOG_ERROR, "step failed: %s", tb_last_error());
            for (int k = 0; k < n; k++) end_request(s, s->chunk_req[k], TB_FINISH_ERROR);
            continue;
        }
        int tokens = 0;
        for (int k = 0; k < n; k++) tokens += s->chunks[k].n_tokens;
        if (s->obs.on_step) s->obs.on_step(s->obs.arg, n, tokens, t1 - t0);
        int row = 0;
        for (int k = 0; k < n; k++) {
            tb_request *r = s->chunk_req[k];
            int c0 = r->n_computed;
            r->n_computed += s->chunks[k].n_tokens;
            if (!s->chunks[k].logits) continue;
            if (s->chunks[k].logits == 2) { /* the prompt tokens' scores, then (final chunk) the draw */
                int nsc = scored_rows(r->n_prompt, c0, s->chunks[k].n_tokens);
                for (int j = 0; j < nsc; j++) {
                    const tb_sample_result *sr = &s->sres[row++];
                    tb_token_event *pe = &r->plp[c0 + 1 + j];
                    pe->token = sr->token;
                    pe->logprob = sr->logprob;
                    pe->n_top = sr->n_top;
                    memcpy(pe->top_ids, sr->top_ids, sizeof(int32_t) * (size_t)sr->n_top);
                    memcpy(pe->top_logprobs, sr->top_logprobs, sizeof(float) * (size_t)sr->n_top);
                }
                pthread_mutex_lock(&r->mu);
                if (c0 + nsc > r->plp_done) r->plp_done = c0 + nsc;
                pthread_mutex_unlock(&r->mu);
                if (r->n_computed < r->n_prompt) continue;
            }
            const tb_sample_result *res = &s->sres[row++];
            int total = r->n_prompt + r->n_gen, tok = res->token;
            tb_token_event ev = {.token = tok};
            if (r->p.logprobs >= 0) { /* log-probabilities of the distribution the model gave */
                ev.logprob = res->logprob;
                ev.n_top = res->n_top;
                memcpy(ev.top_ids, res->top_ids, sizeof(int32_t) * (size_t)res->n_top);
                memcpy(ev.top_logprobs, res->top_logprobs, sizeof(float) * (size_t)res->n_top);
            }
            double now = tb_now();
            tb_gen_end end = tb_gen_step(&r->gen, tok, NULL, NULL);
            int eos = end == TB_GEN_END_TOKEN;
            if (!eos && !reserve_token(r)) {
                tb_log(TB_LOG_ERROR, "%s: out of memory for its generated tokens",
                       r->p.label[0] ? r->p.label : "a request");
                end_request(s, r, TB_FINISH_ERROR);
                continue;
            }
            if (!eos) {
                r->tokens[total] = tok;
                r->n_gen++;
                if (!push_event(r, &ev)) { /* its client stopped reading: free the slot for others */
                    tb_log(TB_LOG_WARN, "%s: cancelled: its client left %d generated tokens unread (--stream-buffer)",
                           r->p.label[0] ? r->p.label : "a request", r->ev_limit);
                    if (s->obs.on_overflow) s->obs.on_overflow(s->obs.arg);
                    end_request(s, r, TB_FINISH_CANCELLED);
                    continue;
                }
                if (r->t_first == 0) {
                    r->t_first = now;
                    if (s->obs.on_first_token) s->obs.on_first_token(s->obs.arg, now - r->t_submit, r->t_admit - r->t_submit);
                } else if (s->obs.on_token) {
                    s->obs.on_token(s->obs.arg, now - r->t_last);
                }
                r->t_last = now;
            }
            if (eos) end_request(s, r, TB_FINISH_STOP);
            else if (end == TB_GEN_MAX_TOKENS) end_request(s, r, TB_FINISH_LENGTH);
        }
        publish_stats(s, n);
    }
    pthread_mutex_lock(&s->mu);
    s->stats.running = s->stats.waiting = s->stats.batch_size = 0;
    s->stats.kv_usage = 0;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

tb_status tb_sched_start(tb_context *ctx, const tb_sched_options *o, const tb_sched_observer *obs, tb_sched **out) {
    *out = NULL;
    tb_sched *s = calloc(1, sizeof *s);
    if (!s) return tb_errorf(TB_ERR_OOM, "out of memory");
    s->ctx = ctx;
    s->o = *o;
    if (obs) s->obs = *obs;
    int slots = tb_context_max_seqs(ctx);
    if (s->o.max_num_seqs <= 0 || s->o.max_num_seqs > slots) s->o.max_num_seqs = slots;
    int max_step = tb_context_max_step(ctx);
    if (s->o.max_batched_tokens <= 0 || s->o.max_batched_tokens > max_step) s->o.max_batched_tokens = max_step;
    if (s->o.max_batched_tokens < s->o.max_num_seqs) s->o.max_batched_tokens = s->o.max_num_seqs;
    if (s->o.max_batched_tokens > max_step) {
        free(s);
        return tb_errorf(TB_ERR_INVALID_ARG, "max-num-seqs %d exceeds the engine's step profile (%d tokens)",
                         o->max_num_seqs, max_step);
    }
    if (s->o.max_queue <= 0) s->o.max_queue = 256;
    tb_engine_get_info(tb_context_engine(ctx), &s->info);
    s->share_prefill = tb_context_prefix_caching(ctx);
    tb_dtype kvd = tb_context_kv_dtype(ctx);
    s->stats.kv_capacity_tokens = (long)tb_kv_total_blocks(ctx) * tb_kv_block_size(ctx);
    s->stats.kv_dtype = tb_kv_dtype_label(kvd);
    s->stats.kv_bytes_per_token =
        tb_kv_bytes_per_token(kvd, tb_kv_block_size(ctx), s->info.n_kv_heads, s->info.head_dim, s->info.n_layers);
    /* a row per token where prompts are scored */
    s->rsamp = calloc((size_t)s->o.max_batched_tokens, sizeof(tb_row_sampling));
    s->sres = calloc((size_t)s->o.max_batched_tokens, sizeof(tb_sample_result));
    s->running = calloc((size_t)s->o.max_num_seqs, sizeof(tb_request *));
    s->chunks = calloc((size_t)s->o.max_num_seqs, sizeof(tb_seq_chunk));
    s->chunk_req = calloc((size_t)s->o.max_num_seqs, sizeof(tb_request *));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->rsamp || !s->sres || !s->running || !s->chunks || !s->chunk_req) {
        tb_sched_free(s);
        return tb_errorf(TB_ERR_OOM, "out of memory");
    }
    if (pthread_create(&s->thread, NULL, loop_main, s) != 0) {
        tb_sched_free(s);
        return tb_errorf(TB_ERR_INTERNAL, "cannot start the scheduler thread");
    }
    s->started = 1;
    *out = s;
    return TB_OK;
}

tb_status tb_sched_submit(tb_sched *s, tb_request *r) {
    if (r->n_prompt >= s->info.max_seq_len)
        return tb_errorf(TB_ERR_INVALID_ARG, "the prompt has %d tokens; the context is %d", r->n_prompt,
                         s->info.max_seq_len);
    int bs = tb_kv_block_size(s->ctx), total = tb_kv_total_blocks(s->ctx);
    int need = blocks_for(r->n_prompt + r->p.max_tokens, bs);
    if (need > total)
        return tb_errorf(TB_ERR_INVALID_ARG,
                         "prompt (%d tokens) + max_tokens (%d) needs %d KV-cache blocks; the whole cache has %d "
                         "(%d tokens)", r->n_prompt, r->p.max_tokens, need, total, total * bs);
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return tb_errorf(TB_ERR_INTERNAL, "the server is shutting down");
    }
    if (s->n_incoming + s->stats.waiting >= s->o.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return tb_errorf(TB_ERR_RANGE, "the queue is full (%d waiting requests)", s->o.max_queue);
    }
    atomic_fetch_add(&r->refs, 1);
    r->t_submit = tb_now();
    r->next = NULL;
    if (s->in_tail) s->in_tail->next = r;
    else s->in_head = r;
    s->in_tail = r;
    s->n_incoming++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return TB_OK;
}

int tb_sched_queue_capacity(const tb_sched *s) { return s->o.max_queue; }

void tb_sched_get_stats(tb_sched *s, tb_sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    st->waiting = s->stats.waiting > s->n_incoming ? s->stats.waiting : s->n_incoming;
    pthread_mutex_unlock(&s->mu);
}

void tb_sched_stop(tb_sched *s, int drain, double grace_s) {
    if (!s || !s->started) return;
    pthread_mutex_lock(&s->mu);
    s->deadline = tb_now() + (drain ? grace_s : 0);
    if (!s->stopping) s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = 0;
}

void tb_sched_free(tb_sched *s) {
    if (!s) return;
    tb_sched_stop(s, 0, 0);
    /* anything never picked up by the loop */
    for (tb_request *r = s->in_head; r;) {
        tb_request *nx = r->next;
        finish(r, TB_FINISH_CANCELLED);
        tb_request_release(r);
        r = nx;
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->rsamp);
    free(s->sres);
    free(s->running);
    free(s->chunks);
    free(s->chunk_req);
    free(s);
}
