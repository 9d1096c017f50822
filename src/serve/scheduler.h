/*
 * scheduler.h — continuous batching over one execution context.
 *
 * HTTP threads create requests (prompt ids + sampling), submit them through a
 * bounded queue and read token events back. One scheduler thread owns the
 * context: every step it drops cancelled sequences, admits waiting requests
 * while sequence slots and KV blocks allow, builds one flattened batch (every
 * running sequence's next decode token first, then prefill chunks under the
 * per-step token budget), runs it, samples, and finishes sequences at EOS,
 * max_tokens or the context limit. When the KV pool runs out, the newest
 * running sequence is preempted: its blocks are freed and it is requeued at
 * the front to be recomputed from its prompt and the tokens it already
 * produced, so nothing accepted is lost and no other sequence is touched.
 * At admission a sequence takes the KV blocks its tokens share with cached
 * ones (the context's prefix cache: a common system prompt, an earlier turn
 * of a chat, its own blocks before a preemption) and computes only the rest.
 *
 * Requests are reference counted: the submitter holds one reference and the
 * scheduler another while it knows the request.
 */
#ifndef TB_SCHEDULER_H
#define TB_SCHEDULER_H

#include "core/core.h"
#include "runtime/runtime.h"

#define TB_MAX_TOP_LOGPROBS TB_TOP_LOGPROBS_MAX

typedef enum {
    TB_FINISH_NONE = 0,
    TB_FINISH_STOP,      /* EOS, or a stop string seen by the reader */
    TB_FINISH_LENGTH,    /* max_tokens or the context limit          */
    TB_FINISH_CANCELLED, /* client gone                              */
    TB_FINISH_ERROR,
} tb_finish_reason;

const char *tb_finish_reason_str(tb_finish_reason r);

typedef struct {
    int32_t token;
    float logprob;                         /* of `token` (when requested) */
    int n_top;
    int32_t top_ids[TB_MAX_TOP_LOGPROBS];
    float top_logprobs[TB_MAX_TOP_LOGPROBS];
} tb_token_event;

typedef struct {
    int max_tokens;         /* generated tokens at most                   */
    int ignore_eos;
    int min_tokens;         /* EOS ends the request only after this many tokens */
    int logprobs;           /* -1: none; else top alternatives (0..20)    */
    /* 1: the prompt's tokens are scored too (their log-probabilities and
     * `logprobs` alternatives, tb_request_prompt_logprobs): its prefill
     * computes a logits row per token and takes nothing from the prefix
     * cache */
    int score_prompt;
    tb_sampling_params sampling;
    /* Events held for a reader that has not taken them yet; when the
     * reader falls this far behind (a streaming client that stopped
     * reading), the request is cancelled rather than holding its slot.
     * 0: max_tokens + 1, i.e. never (a reader inside the server). The
     * buffer grows with what is in flight, up to this bound. */
    int max_buffered;
    char label[48];         /* names the request in log lines */
} tb_request_params;

typedef struct tb_request tb_request;

/* Takes a copy of the prompt. `info`: the engine's (vocabulary, end tokens,
 * context), for the runtime's generation loop (tb_gen) that ends the request.
 * Returns NULL when out of memory or the sampling parameters are bad. */
tb_request *tb_request_new(const int32_t *prompt, int n_prompt,
                           const tb_request_params *p, const tb_engine_info *info);
void tb_request_release(tb_request *r);  /* drops one reference */
/* Asks the scheduler to stop the request at its next step. */
void tb_request_cancel(tb_request *r, tb_finish_reason why);

/* Waits up to `timeout_s` for events; copies at most `cap` of them (cap 0:
 * only waits until there is one, or the request is over).
 * *finished is set to the finish reason once the request is over and every
 * event has been read. Returns the number of events copied. */
int tb_request_wait(tb_request *r, tb_token_event *out, int cap,
                    tb_finish_reason *finished, double timeout_s);

/* Timestamps (tb_now seconds): submitted, admitted, first token. */
void tb_request_times(const tb_request *r, double *submitted,
                      double *admitted, double *first_token);
int tb_request_prompt_len(const tb_request *r);
int tb_request_generated(const tb_request *r);
int tb_request_preemptions(const tb_request *r);
/* Prompt tokens whose KV came from the prefix cache at first admission. */
int tb_request_cached_tokens(const tb_request *r);
/* score_prompt: the events of prompt tokens 1, 2, ... (each token's
 * log-probability given those before it, and its alternatives) scored so
 * far into *out (valid while r is held); their count, n_prompt - 1 once
 * the prefill is over (before the first token's event is queued). */
int tb_request_prompt_logprobs(tb_request *r, const tb_token_event **out);

typedef struct {
    int max_num_seqs;       /* sequences decoded together      */
    int max_batched_tokens; /* tokens per step (chunked prefill) */
    int max_queue;          /* waiting requests before 429      */
} tb_sched_options;

/* Observers for metrics, called on the scheduler thread. */
typedef struct {
    void *arg;
    void (*on_step)(void *arg, int n_seqs, int n_tokens, double seconds);
    void (*on_first_token)(void *arg, double ttft, double queue_time);
    void (*on_token)(void *arg, double itl);
    void (*on_finish)(void *arg, tb_finish_reason r, int prompt_tokens,
                      int gen_tokens, double e2e);
    void (*on_preempt)(void *arg);
    /* a request cancelled because its reader left max_buffered events unread */
    void (*on_overflow)(void *arg);
    /* each admission: tokens looked up in the prefix cache, tokens found */
    void (*on_prefix_lookup)(void *arg, int queried, int hit);
} tb_sched_observer;

typedef struct tb_sched tb_sched;

/* Takes the context (not its ownership) and starts the scheduler thread. */
tb_status tb_sched_start(tb_context *ctx, const tb_sched_options *o,
                         const tb_sched_observer *obs, tb_sched **out);
/* Stops accepting; with `drain`, waits until all accepted requests finish
 * or `grace_s` passes (then cancels the rest). Joins the thread. */
void tb_sched_stop(tb_sched *s, int drain, double grace_s);
void tb_sched_free(tb_sched *s);

/* Takes a reference. TB_ERR_RANGE when the queue is full, TB_ERR_INVALID_ARG
 * when the request can never fit the context, TB_ERR_INTERNAL when stopped. */
tb_status tb_sched_submit(tb_sched *s, tb_request *r);

typedef struct {
    int running, waiting, batch_size;
    double kv_usage;        /* used blocks / total */
    /* the KV pool, fixed at start: tokens it holds in all, its dtype's
     * name ("f16", "int8", ...) and bytes per token (all layers, k and v) */
    long kv_capacity_tokens;
    const char *kv_dtype;
    double kv_bytes_per_token;
} tb_sched_stats;
void tb_sched_get_stats(tb_sched *s, tb_sched_stats *st);
/* Requests that may wait at once (max_queue after defaults). */
int tb_sched_queue_capacity(const tb_sched *s);

#endif
