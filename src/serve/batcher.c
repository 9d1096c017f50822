/*
 * batcher.c — the dynamic batcher of general engines (batcher.h).
 *
 * One mutex guards the queue (a doubly linked list of requests that live
 * on their callers' stacks: a caller blocks until its request is done, so
 * queueing allocates nothing) and the counters. A worker per instance waits
 * on `work`, picks a batch under the mutex, runs it unlocked on its own
 * tb_exec and hands each request its outputs; the caller waits on its own
 * condition variable with its deadline and takes itself out of the queue
 * when the deadline passes first. All waits use CLOCK_MONOTONIC.
 *
 * The batch choice follows Triton's dynamic batcher: walking the queue from
 * the oldest request, requests whose non-batch dims equal the oldest's are
 * gathered in order while their rows fit max_batch_size. A full batch goes
 * at once; else the largest gathered prefix whose rows equal a preferred
 * size goes at once; else everything gathered goes when the oldest request
 * has waited max_queue_delay_us (or the batcher drains). Requests of other
 * shapes stay queued for a later call.
 *
 * A request that finds the queue empty, is due at once (no delay, a full or
 * preferred size, or no merging) and an instance idle runs on its caller's
 * thread (the instance marked busy, so its worker leaves it alone): the
 * hand-offs to a worker and back cost more than a tiny model's call.
 */
#include "serve/batcher.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "ir/ir.h"

/* A graph's inputs and outputs fit the batcher's fixed arrays. */
_Static_assert(TB_BATCHER_MAX_IO >= TB_MAX_IO, "TB_BATCHER_MAX_IO below the graph's TB_MAX_IO");

const int64_t TB_BATCHER_US_BOUNDS[TB_BATCHER_US_BUCKETS - 1] = {
    50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000, 5000000};

enum { REQ_QUEUED, REQ_RUNNING, REQ_DONE };

typedef struct tb_breq {
    struct tb_breq *prev, *next;
    const tb_tensor *in;          /* the caller's inputs, read while running */
    int rows;                     /* dim 0 (1 when the engine does not batch) */
    double t_enqueue, deadline;   /* seconds, monotonic; deadline 0: none    */
    int state;
    tb_status status;
    char err[512];
    tb_batcher_result *r;
    pthread_cond_t done;
} tb_breq;

typedef struct {
    struct tb_batcher *b;
    tb_exec *x;
    pthread_t th;
    int started;
    int busy;                     /* running a batch: its worker or a caller */
    /* (max rows seen, row bytes) per input: merged inputs, grown on demand
     * to the largest batch and kept, so a steady load allocates nothing. */
    void *stage[TB_BATCHER_MAX_IO];
    size_t stage_cap[TB_BATCHER_MAX_IO];
} tb_binst;

struct tb_batcher {
    tb_batcher_config c;
    int max_batch;                /* 1: no merging                           */
    int batches;                  /* dim 0 of every input is dynamic         */
    char note[256];
    int n_in, n_out;
    tb_io_info in_info[TB_BATCHER_MAX_IO], out_info[TB_BATCHER_MAX_IO];

    pthread_mutex_t mu;
    pthread_cond_t work;          /* a request arrived or the batcher stops  */
    pthread_cond_t idle;          /* a caller left tb_batcher_infer          */
    tb_breq *head, *tail;
    int stopping, callers;
    int n_claimed;                /* instances callers run requests on now   */
    int direct;                   /* callers may run their requests (env
                                     TURBINE_BATCHER_DIRECT=0: never)        */
    tb_batcher_stats st;
    FILE *trace;                  /* env TURBINE_BATCHER_TRACE: a line per
                                     engine call (see trace_batch)           */
    double t_origin;              /* the trace's time zero                   */

    int n_inst;
    tb_binst inst[TB_BATCHER_MAX_INSTANCES];
};

void tb_batcher_config_default(tb_batcher_config *c) {
    memset(c, 0, sizeof *c);
    c->max_batch_size = 8;
    c->max_queue_size = 1024;
    c->instance_count = 1;
    c->warmup = -1;
}

/* ---------------------------------------------------------------- helpers */

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct timespec to_timespec(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    if (ts.tv_nsec < 0) ts.tv_nsec = 0;
    return ts;
}

static int cond_init_mono(pthread_cond_t *c) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a)) return -1;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

static int us_bucket(int64_t us) {
    for (int i = 0; i < TB_BATCHER_US_BUCKETS - 1; i++)
        if (us <= TB_BATCHER_US_BOUNDS[i]) return i;
    return TB_BATCHER_US_BUCKETS - 1;
}

static void q_unlink(tb_batcher *b, tb_breq *q) {
    if (q->prev) q->prev->next = q->next; else b->head = q->next;
    if (q->next) q->next->prev = q->prev; else b->tail = q->prev;
    q->prev = q->next = NULL;
    b->st.pending--;
}

/* Bytes of one row (dims 1.. of t); the request was checked, so no overflow. */
static size_t row_bytes(const tb_tensor *t) {
    uint64_t n = 1;
    for (int d = 1; d < t->rank; d++) n *= (uint64_t)t->dims[d];
    return (size_t)(n * tb_dtype_size(t->dtype));
}

static size_t tensor_bytes(const tb_tensor *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= (uint64_t)t->dims[d];
    return (size_t)(n * tb_dtype_size(t->dtype));
}

/* Requests merge only when every input's dims past dim 0 are equal. */
static int compatible(const tb_batcher *b, const tb_breq *a, const tb_breq *q) {
    for (int i = 0; i < b->n_in; i++)
        for (int d = 1; d < a->in[i].rank; d++)
            if (a->in[i].dims[d] != q->in[i].dims[d]) return 0;
    return 1;
}

static int is_preferred(const tb_batcher *b, int rows) {
    for (int i = 0; i < b->c.n_preferred; i++)
        if (b->c.preferred_batch_size[i] == rows) return 1;
    return 0;
}

/* Under the mutex: requests past their deadline leave the queue. */
static void expire(tb_batcher *b, double now) {
    for (tb_breq *q = b->head, *nx; q; q = nx) {
        nx = q->next;
        if (q->deadline > 0 && now >= q->deadline) {
            q_unlink(b, q);
            q->state = REQ_DONE;
            q->status = TB_ERR_TIMEOUT;
            snprintf(q->err, sizeof q->err, "the request waited %.0f us in the queue, past its timeout",
                     (now - q->t_enqueue) * 1e6);
            b->st.timeouts++;
            pthread_cond_signal(&q->done);
        }
    }
}

/* Under the mutex, queue not empty: fills batch[] and returns 1 when a batch
 * should go now, else 0 with *wake the time to look again. */
static int pick(tb_batcher *b, tb_breq **batch, int *n_out, int *rows_out, double now, double *wake) {
    tb_breq *head = b->head;
    if (b->max_batch <= 1) {
        batch[0] = head;
        *n_out = 1;
        *rows_out = head->rows;
        return 1;
    }
    int n = 0, rows = 0, pref_n = 0, pref_rows = 0, blocked = 0;
    for (tb_breq *q = head; q; q = q->next) {
        if (!compatible(b, head, q)) continue;
        /* The next request in order does not fit: the batch cannot grow. */
        if (rows + q->rows > b->max_batch) { blocked = 1; break; }
        batch[n++] = q;
        rows += q->rows;
        if (is_preferred(b, rows)) { pref_n = n; pref_rows = rows; }
        if (rows == b->max_batch) break;
    }
    double due = head->t_enqueue + (double)b->c.max_queue_delay_us * 1e-6;
    if (rows == b->max_batch || blocked || b->stopping || b->c.max_queue_delay_us == 0 || now >= due) {
        /* Full, draining or the oldest has waited enough: a preferred
         * prefix still wins over the rest when the batch is not full. */
        if (rows != b->max_batch && !blocked && !b->stopping && pref_n) { n = pref_n; rows = pref_rows; }
        *n_out = n;
        *rows_out = rows;
        return 1;
    }
    if (pref_n) {
        *n_out = pref_n;
        *rows_out = pref_rows;
        return 1;
    }
    *wake = due;
    for (tb_breq *q = head; q; q = q->next)
        if (q->deadline > 0 && q->deadline < *wake) *wake = q->deadline;
    return 0;
}

/* ---------------------------------------------------------------- running */

/* One line of the trace per batch, written unlocked after its run (stdio
 * locks the stream): "<start> <end> <instance> <requests> <rows> <worker|
 * caller> <enqueue times...>", seconds since the batcher was made, so the
 * arrivals' spacing, the queue and the gaps between runs can be read
 * back. */
static void trace_batch(const tb_binst *in, tb_breq *const *batch, int n, int rows, double t0, double t1, int caller) {
    tb_batcher *b = in->b;
    char line[64 + TB_BATCHER_MAX_BATCH * 16];
    int at = snprintf(line, sizeof line, "%.6f %.6f %d %d %d %s", t0 - b->t_origin, t1 - b->t_origin,
                      (int)(in - b->inst), n, rows, caller ? "caller" : "worker");
    for (int k = 0; k < n && at < (int)sizeof line - 16; k++)
        at += snprintf(line + at, sizeof line - (size_t)at, " %.6f", batch[k]->t_enqueue - b->t_origin);
    fprintf(b->trace, "%s\n", line);
}

static void fail(tb_breq *q, tb_status s, const char *msg) {
    q->status = s;
    snprintf(q->err, sizeof q->err, "%s", msg);
}

/* Runs batch[0..n) (rows in all) on the instance, unlocked. Each request
 * gets its status and, on success, its result. sizes[]: the rows of each
 * successful engine call, *n_calls of them. */
static void run_batch(tb_binst *in, tb_breq **batch, int n, int rows, int *sizes, int *n_calls) {
    tb_batcher *b = in->b;
    double t0 = mono_now();
    tb_tensor merged[TB_BATCHER_MAX_IO];
    const tb_tensor *args = batch[0]->in;
    if (n > 1) {
        for (int i = 0; i < b->n_in; i++) {
            const tb_tensor *h = &batch[0]->in[i];
            size_t rb = row_bytes(h), need = rb * (size_t)rows;
            if (need > in->stage_cap[i]) {
                void *p = realloc(in->stage[i], need);
                if (!p) {
                    for (int k = 0; k < n; k++) fail(batch[k], TB_ERR_OOM, "out of memory merging a batch");
                    return;
                }
                in->stage[i] = p;
                in->stage_cap[i] = need;
            }
            char *dst = in->stage[i];
            for (int k = 0; k < n; k++) {
                size_t nb = rb * (size_t)batch[k]->rows;
                memcpy(dst, batch[k]->in[i].data, nb);
                dst += nb;
            }
            merged[i] = *h;
            merged[i].dims[0] = rows;
            merged[i].data = in->stage[i];
        }
        args = merged;
    }
    tb_tensor outs[TB_BATCHER_MAX_IO];
    tb_status s = tb_exec_run(in->x, args, b->n_in, outs, b->n_out);
    if (s == TB_OK && n > 1)
        for (int o = 0; o < b->n_out; o++)
            if (outs[o].rank < 1 || outs[o].dims[0] != rows) {
                s = tb_errorf(TB_ERR_UNSUPPORTED, "output '%s' has no batch dim of %d rows to split",
                              b->out_info[o].name, rows);
                break;
            }
    if (s != TB_OK && n > 1) {
        /* One request's inputs, or an output without a batch dim, must not
         * fail its neighbours: each runs alone. */
        tb_log(TB_LOG_DEBUG, "batcher: a merged call of %d requests failed (%s); running them one by one",
               n, tb_last_error());
        for (int k = 0; k < n; k++) run_batch(in, &batch[k], 1, batch[k]->rows, sizes, n_calls);
        return;
    }
    if (s != TB_OK) {
        fail(batch[0], s, tb_last_error());
        return;
    }
    sizes[(*n_calls)++] = rows;
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        tb_breq *q = batch[k];
        tb_batcher_result *r = q->r;
        size_t total = 0, sz[TB_BATCHER_MAX_IO], at[TB_BATCHER_MAX_IO];
        for (int o = 0; o < b->n_out; o++) {
            sz[o] = n > 1 ? row_bytes(&outs[o]) * (size_t)q->rows : tensor_bytes(&outs[o]);
            at[o] = total;
            total += (sz[o] + 63) & ~(size_t)63;
        }
        char *blk = malloc(total ? total : 1);
        if (!blk) {
            fail(q, TB_ERR_OOM, "out of memory for a result");
            off += q->rows;
            continue;
        }
        r->block_ = blk;
        r->n_outputs = b->n_out;
        for (int o = 0; o < b->n_out; o++) {
            r->outputs[o] = outs[o];
            if (n > 1) r->outputs[o].dims[0] = q->rows;
            r->outputs[o].data = blk + at[o];
            size_t src = n > 1 ? row_bytes(&outs[o]) * (size_t)off : 0;
            memcpy(blk + at[o], (const char *)outs[o].data + src, sz[o]);
        }
        r->batch_size = rows;
        r->n_requests = n;
        r->queue_us = (int64_t)((t0 - q->t_enqueue) * 1e6);
        q->status = TB_OK;
        off += q->rows;
    }
    double t1 = mono_now();
    for (int k = 0; k < n; k++) batch[k]->r->compute_us = (int64_t)((t1 - t0) * 1e6);
}

/* Under the mutex after run_batch: counts the batch, marks its requests
 * done (waking their callers) and frees the instance. */
static void finish(tb_binst *in, tb_breq **batch, int n, const int *sizes, int n_calls) {
    tb_batcher *b = in->b;
    b->st.running -= n;
    b->st.executions += (uint64_t)n_calls;
    for (int k = 0; k < n_calls; k++) {
        b->st.inferences += (uint64_t)sizes[k];
        b->st.batch_hist[sizes[k] < TB_BATCHER_BATCH_BUCKETS - 1 ? sizes[k] : TB_BATCHER_BATCH_BUCKETS - 1]++;
    }
    for (int k = 0; k < n; k++) {
        tb_breq *q = batch[k];
        if (q->status == TB_OK) {
            b->st.success++;
            b->st.queue_us_hist[us_bucket(q->r->queue_us)]++;
            b->st.compute_us_hist[us_bucket(q->r->compute_us)]++;
            b->st.queue_us_sum += (uint64_t)q->r->queue_us;
            b->st.compute_us_sum += (uint64_t)q->r->compute_us;
        } else {
            b->st.failures++;
        }
        q->state = REQ_DONE;
        pthread_cond_signal(&q->done);
    }
    in->busy = 0;
}

static void *worker(void *arg) {
    tb_binst *in = arg;
    tb_batcher *b = in->b;
    tb_breq *batch[TB_BATCHER_MAX_BATCH];
    int sizes[TB_BATCHER_MAX_BATCH + 1];
    pthread_mutex_lock(&b->mu);
    for (;;) {
        double now = mono_now();
        expire(b, now);
        if (!b->head || in->busy) {
            /* in->busy here: a caller runs its request on this instance */
            if (!b->head && b->stopping) break;
            pthread_cond_wait(&b->work, &b->mu);
            continue;
        }
        int n = 0, rows = 0;
        double wake = 0;
        if (!pick(b, batch, &n, &rows, now, &wake)) {
            struct timespec ts = to_timespec(wake);
            pthread_cond_timedwait(&b->work, &b->mu, &ts);
            continue;
        }
        for (int k = 0; k < n; k++) {
            q_unlink(b, batch[k]);
            batch[k]->state = REQ_RUNNING;
        }
        b->st.running += n;
        in->busy = 1;
        /* Another worker may be able to start on what is left. */
        if (b->head) pthread_cond_signal(&b->work);
        pthread_mutex_unlock(&b->mu);

        int n_calls = 0;
        double t0 = b->trace ? mono_now() : 0;
        run_batch(in, batch, n, rows, sizes, &n_calls);
        if (b->trace) trace_batch(in, batch, n, rows, t0, mono_now(), 0);

        pthread_mutex_lock(&b->mu);
        finish(in, batch, n, sizes, n_calls);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ---------------------------------------------------------------- create / free */

static void stop_and_join(tb_batcher *b) {
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    pthread_cond_broadcast(&b->work);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n_inst; i++)
        if (b->inst[i].started) pthread_join(b->inst[i].th, NULL);
    /* Callers woken by the drain still read their request under the mutex. */
    pthread_mutex_lock(&b->mu);
    while (b->callers > 0) pthread_cond_wait(&b->idle, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

void tb_batcher_free(tb_batcher *b) {
    if (!b) return;
    stop_and_join(b);
    for (int i = 0; i < b->n_inst; i++) {
        tb_exec_free(b->inst[i].x);
        for (int k = 0; k < TB_BATCHER_MAX_IO; k++) free(b->inst[i].stage[k]);
    }
    if (b->trace) fclose(b->trace);
    pthread_cond_destroy(&b->work);
    pthread_cond_destroy(&b->idle);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static tb_status check_config(const tb_batcher_config *c) {
    if (c->max_batch_size < 0 || c->max_batch_size > TB_BATCHER_MAX_BATCH)
        return tb_errorf(TB_ERR_INVALID_ARG, "max_batch_size %d outside [0, %d]", c->max_batch_size,
                         TB_BATCHER_MAX_BATCH);
    if (c->n_preferred < 0 || c->n_preferred > TB_BATCHER_MAX_PREFERRED)
        return tb_errorf(TB_ERR_INVALID_ARG, "%d preferred batch sizes (at most %d)", c->n_preferred,
                         TB_BATCHER_MAX_PREFERRED);
    for (int i = 0; i < c->n_preferred; i++)
        if (c->preferred_batch_size[i] < 1 ||
            (c->max_batch_size > 1 && c->preferred_batch_size[i] > c->max_batch_size))
            return tb_errorf(TB_ERR_INVALID_ARG, "preferred batch size %d outside [1, max_batch_size %d]",
                             c->preferred_batch_size[i], c->max_batch_size);
    if (c->max_queue_delay_us < 0 || c->max_queue_delay_us > 60000000)
        return tb_errorf(TB_ERR_INVALID_ARG, "max_queue_delay_us %lld outside [0, 60 s]",
                         (long long)c->max_queue_delay_us);
    if (c->max_queue_size < 0) return tb_errorf(TB_ERR_INVALID_ARG, "max_queue_size %d < 0", c->max_queue_size);
    if (c->default_timeout_us < 0)
        return tb_errorf(TB_ERR_INVALID_ARG, "default_timeout_us %lld < 0", (long long)c->default_timeout_us);
    if (c->instance_count < 1 || c->instance_count > TB_BATCHER_MAX_INSTANCES)
        return tb_errorf(TB_ERR_INVALID_ARG, "instance_count %d outside [1, %d]", c->instance_count,
                         TB_BATCHER_MAX_INSTANCES);
    if (c->threads_per_instance < 0 || c->threads_per_instance > 1024)
        return tb_errorf(TB_ERR_INVALID_ARG, "threads_per_instance %d outside [0, 1024]", c->threads_per_instance);
    return TB_OK;
}

/* The warm-up of instance in (see tb_batcher_config.warmup): batch sizes
 * 1..max_batch (the largest first, so the memory plan grows once), each run
 * twice with zero inputs. A run that fails (inputs whose zeros the model
 * refuses) ends the warm-up of that instance quietly: requests then pay as
 * without it. Returns the runs made. */
static int warm_instance(tb_batcher *b, tb_binst *in) {
    size_t bytes = 0;
    for (int i = 0; i < b->n_in; i++) {
        const tb_io_info *ii = &b->in_info[i];
        size_t n = (size_t)tb_dtype_size(ii->dtype);
        for (int d = 0; d < ii->rank; d++) n *= (size_t)(d == 0 && b->max_batch > 1 ? b->max_batch : ii->opt[d]);
        if (n > bytes) bytes = n;
    }
    void *zeros = calloc(1, bytes ? bytes : 1);
    if (!zeros) return 0;
    int sizes = b->max_batch < TB_BATCHER_WARMUP_MAX ? b->max_batch : TB_BATCHER_WARMUP_MAX, runs = 0;
    for (int k = 0; k < sizes; k++) {
        /* max_batch, then 1, 2, ...: the largest plan first */
        int rows = k == 0 ? b->max_batch : k;
        if (b->max_batch <= 1) rows = 0; /* dim 0 as the profile's opt */
        tb_tensor args[TB_BATCHER_MAX_IO], outs[TB_BATCHER_MAX_IO];
        for (int i = 0; i < b->n_in; i++) {
            const tb_io_info *ii = &b->in_info[i];
            memset(&args[i], 0, sizeof args[i]);
            args[i].dtype = ii->dtype;
            args[i].rank = ii->rank;
            for (int d = 0; d < ii->rank; d++) args[i].dims[d] = d == 0 && rows ? rows : ii->opt[d];
            args[i].data = zeros;
        }
        for (int r = 0; r < 2; r++) {
            if (tb_exec_run(in->x, args, b->n_in, outs, b->n_out) != TB_OK) {
                tb_log(TB_LOG_DEBUG, "batcher: warm-up stopped at batch %d: %s", rows, tb_last_error());
                free(zeros);
                return runs;
            }
            runs++;
        }
        if (!rows) break;
    }
    free(zeros);
    return runs;
}

tb_status tb_batcher_create(tb_engine *e, const tb_batcher_config *c, tb_batcher **out) {
    *out = NULL;
    if (!e || !c) return tb_errorf(TB_ERR_INVALID_ARG, "batcher: no engine or config");
    if (tb_engine_is_llm(e))
        return tb_errorf(TB_ERR_UNSUPPORTED, "batcher: an LLM engine is served by the sequence scheduler");
    tb_status s = check_config(c);
    if (s != TB_OK) return tb_error_prefix(s, "batcher config");
    tb_batcher *b = calloc(1, sizeof *b);
    if (!b) return tb_errorf(TB_ERR_OOM, "batcher: out of memory");
    b->c = *c;
    const char *dv = getenv("TURBINE_BATCHER_DIRECT");
    b->direct = !(dv && !strcmp(dv, "0"));
    const char *tp = getenv("TURBINE_BATCHER_TRACE");
    b->t_origin = mono_now();
    if (tp && *tp) {
        /* one file per batcher: PREFIX.<pid>.<n>, n counting the process's batchers */
        static int n_made;
        char path[4096];
        snprintf(path, sizeof path, "%s.%d.%d", tp, (int)getpid(), __atomic_fetch_add(&n_made, 1, __ATOMIC_RELAXED));
        if (!(b->trace = fopen(path, "w")))
            tb_log(TB_LOG_WARN, "batcher: cannot open the trace file %s: %s", path, strerror(errno));
    }
    pthread_mutex_init(&b->mu, NULL);
    cond_init_mono(&b->work);
    cond_init_mono(&b->idle);

    int threads = c->threads_per_instance;
    if (threads == 0) {
        threads = tb_default_threads() / c->instance_count;
        if (threads < 1) threads = 1;
    }
    for (int i = 0; i < c->instance_count; i++) {
        tb_exec_options xo;
        tb_exec_options_default(&xo);
        xo.n_threads = threads;
        xo.device = c->device;
        b->inst[i].b = b;
        if ((s = tb_exec_create(e, &xo, &b->inst[i].x)) != TB_OK) {
            tb_error_prefix(s, "batcher instance %d", i);
            tb_batcher_free(b);
            return s;
        }
        b->n_inst = i + 1;
    }

    tb_exec *x = b->inst[0].x;
    b->n_in = tb_exec_n_inputs(x);
    b->n_out = tb_exec_n_outputs(x);
    if (b->n_in > TB_BATCHER_MAX_IO || b->n_out > TB_BATCHER_MAX_IO) {
        tb_batcher_free(b);
        return tb_errorf(TB_ERR_UNSUPPORTED, "batcher: more than %d inputs or outputs", TB_BATCHER_MAX_IO);
    }
    /* dim 0 is a batch dim when it is dynamic in every input's profile; the
     * smallest of their maxima bounds a merged call. */
    b->batches = b->n_in > 0;
    int64_t prof_max = TB_BATCHER_MAX_BATCH;
    for (int i = 0; i < b->n_in; i++) {
        tb_exec_input_info(x, i, &b->in_info[i]);
        const tb_io_info *ii = &b->in_info[i];
        if (ii->rank < 1 || ii->min[0] == ii->max[0] || ii->max[0] < 1) b->batches = 0;
        else if (ii->max[0] < prof_max) prof_max = ii->max[0];
        if (tb_dtype_block_elems(ii->dtype) != 1) {
            tb_batcher_free(b);
            return tb_errorf(TB_ERR_UNSUPPORTED, "batcher: input '%s' has a packed dtype %s", ii->name,
                             tb_dtype_name(ii->dtype));
        }
    }
    for (int o = 0; o < b->n_out; o++) {
        tb_exec_output_info(x, o, &b->out_info[o]);
        if (b->out_info[o].rank < 1) b->batches = 0;
    }
    b->max_batch = c->max_batch_size < 1 ? 1 : c->max_batch_size;
    if (b->max_batch > 1 && !b->batches) {
        snprintf(b->note, sizeof b->note,
                 "max_batch_size %d lowered to 1: the engine's dim 0 is not dynamic in its profile", b->max_batch);
        b->max_batch = 1;
    } else if (b->max_batch > prof_max) {
        snprintf(b->note, sizeof b->note, "max_batch_size %d lowered to %lld: the profile's largest dim 0",
                 b->max_batch, (long long)prof_max);
        b->max_batch = (int)prof_max;
    }
    if (b->note[0]) tb_log(TB_LOG_WARN, "batcher: %s", b->note);
    /* Preferred sizes above the batch bound can never be formed. */
    int np = 0;
    for (int i = 0; i < b->c.n_preferred; i++)
        if (b->c.preferred_batch_size[i] <= b->max_batch) b->c.preferred_batch_size[np++] = b->c.preferred_batch_size[i];
    b->c.n_preferred = b->max_batch > 1 ? np : 0;

    int warm = c->warmup;
    if (warm < 0) {
        const char *be = tb_exec_backend(x);
        warm = be && !strncmp(be, "cuda", 4);
    }
    if (warm) {
        double t0 = mono_now();
        int runs = 0;
        for (int i = 0; i < b->n_inst; i++) runs += warm_instance(b, &b->inst[i]);
        b->st.warmup_runs = (uint64_t)runs;
        tb_log(TB_LOG_INFO, "batcher: warm-up of %d instance(s), %d runs, %.2f s", b->n_inst, runs, mono_now() - t0);
    }

    for (int i = 0; i < b->n_inst; i++) {
        if (pthread_create(&b->inst[i].th, NULL, worker, &b->inst[i]) != 0) {
            tb_batcher_free(b);
            return tb_errorf(TB_ERR_INTERNAL, "batcher: cannot start a worker thread");
        }
        b->inst[i].started = 1;
    }
    *out = b;
    return TB_OK;
}

int tb_batcher_max_batch_size(const tb_batcher *b) { return b->max_batch; }
const char *tb_batcher_note(const tb_batcher *b) { return b->note; }
int tb_batcher_n_inputs(const tb_batcher *b) { return b->n_in; }
int tb_batcher_n_outputs(const tb_batcher *b) { return b->n_out; }

tb_status tb_batcher_input_info(const tb_batcher *b, int i, tb_io_info *out) {
    if (i < 0 || i >= b->n_in) return tb_errorf(TB_ERR_INVALID_ARG, "no input %d", i);
    *out = b->in_info[i];
    return TB_OK;
}

tb_status tb_batcher_output_info(const tb_batcher *b, int i, tb_io_info *out) {
    if (i < 0 || i >= b->n_out) return tb_errorf(TB_ERR_INVALID_ARG, "no output %d", i);
    *out = b->out_info[i];
    return TB_OK;
}

/* ---------------------------------------------------------------- requests */

/* What the engine cannot take is refused before it waits in the queue. */
static tb_status check_request(const tb_batcher *b, const tb_tensor *in, int n_in, int *rows) {
    if (!in || n_in != b->n_in)
        return tb_errorf(TB_ERR_INVALID_ARG, "%d inputs given, the model takes %d", n_in, b->n_in);
    *rows = 1;
    for (int i = 0; i < n_in; i++) {
        const tb_tensor *t = &in[i];
        const tb_io_info *ii = &b->in_info[i];
        if (t->dtype != ii->dtype)
            return tb_errorf(TB_ERR_INVALID_ARG, "input '%s' is %s, the model takes %s", ii->name,
                             tb_dtype_name(t->dtype), tb_dtype_name(ii->dtype));
        if (t->rank != ii->rank)
            return tb_errorf(TB_ERR_INVALID_ARG, "input '%s' has rank %d, the model takes %d", ii->name, t->rank,
                             ii->rank);
        if (!t->data) return tb_errorf(TB_ERR_INVALID_ARG, "input '%s' has no data", ii->name);
        for (int d = 0; d < t->rank; d++) {
            if (t->dims[d] < 0) return tb_errorf(TB_ERR_INVALID_ARG, "input '%s' has a negative dim", ii->name);
            if (d == 0 && b->batches) continue;
            if (ii->min[d] >= 0 && ii->max[d] >= 0 && (t->dims[d] < ii->min[d] || t->dims[d] > ii->max[d]))
                return tb_errorf(TB_ERR_RANGE, "input '%s' dim %d is %lld, the model takes [%lld, %lld]", ii->name, d,
                                 (long long)t->dims[d], (long long)ii->min[d], (long long)ii->max[d]);
        }
        uint64_t bytes;
        if (tb_dtype_tensor_bytes(t->dtype, t->rank, t->dims, &bytes) != TB_OK || bytes > ((uint64_t)1 << 40))
            return tb_errorf(TB_ERR_RANGE, "input '%s' is too large", ii->name);
        if (b->batches) {
            if (i == 0) *rows = (int)(t->dims[0] > INT32_MAX ? INT32_MAX : t->dims[0]);
            else if (t->dims[0] != in[0].dims[0])
                return tb_errorf(TB_ERR_INVALID_ARG, "input '%s' has %lld rows, input '%s' %lld", ii->name,
                                 (long long)t->dims[0], b->in_info[0].name, (long long)in[0].dims[0]);
        }
    }
    if (b->batches && *rows < 1) return tb_errorf(TB_ERR_INVALID_ARG, "a request of 0 rows");
    if (b->batches && b->max_batch > 1 && *rows > b->max_batch)
        return tb_errorf(TB_ERR_RANGE, "a request of %d rows, above max_batch_size %d", *rows, b->max_batch);
    return TB_OK;
}

/* Under the mutex, q just queued: when q is the whole queue, would be sent
 * at once (pick) and an instance is idle, takes q out of the queue, marks
 * it running and returns the instance, claimed; else NULL. */
static tb_binst *caller_claims(tb_batcher *b, tb_breq *q) {
    if (!b->direct || b->head != q || b->tail != q || b->stopping) return NULL;
    tb_binst *in = NULL;
    for (int i = 0; i < b->n_inst && !in; i++)
        if (!b->inst[i].busy) in = &b->inst[i];
    if (!in) return NULL;
    tb_breq *one[1];
    int n = 0, rows = 0;
    double wake = 0;
    if (!pick(b, one, &n, &rows, q->t_enqueue, &wake) || n != 1) return NULL;
    q_unlink(b, q);
    q->state = REQ_RUNNING;
    b->st.running++;
    b->st.direct++;
    in->busy = 1;
    b->n_claimed++;
    return in;
}

tb_status tb_batcher_infer(tb_batcher *b, const tb_tensor *in, int n_in, int64_t timeout_us,
                           tb_batcher_result *r) {
    if (!b || !r) return tb_errorf(TB_ERR_INVALID_ARG, "batcher: no batcher or result");
    memset(r, 0, sizeof *r);
    tb_breq q;
    memset(&q, 0, sizeof q);
    tb_status s = check_request(b, in, n_in, &q.rows);
    if (s != TB_OK) {
        pthread_mutex_lock(&b->mu);
        b->st.invalid++;
        pthread_mutex_unlock(&b->mu);
        return s;
    }
    if (timeout_us == 0) timeout_us = b->c.default_timeout_us;
    q.in = in;
    q.r = r;
    q.t_enqueue = mono_now();
    q.deadline = timeout_us > 0 ? q.t_enqueue + (double)timeout_us * 1e-6 : 0;
    q.state = REQ_QUEUED;
    if (cond_init_mono(&q.done)) return tb_errorf(TB_ERR_INTERNAL, "batcher: cannot make a condition variable");

    pthread_mutex_lock(&b->mu);
    if (b->stopping) {
        pthread_mutex_unlock(&b->mu);
        pthread_cond_destroy(&q.done);
        return tb_errorf(TB_ERR_INVALID_ARG, "the model is being unloaded");
    }
    if (b->c.max_queue_size > 0 && b->st.pending >= b->c.max_queue_size) {
        b->st.rejected++;
        pthread_mutex_unlock(&b->mu);
        pthread_cond_destroy(&q.done);
        return tb_errorf(TB_ERR_QUEUE_FULL, "the model's queue holds %d requests, its limit", b->c.max_queue_size);
    }
    q.prev = b->tail;
    if (b->tail) b->tail->next = &q; else b->head = &q;
    b->tail = &q;
    b->st.pending++;
    b->st.requests++;
    b->callers++;
    tb_binst *own = caller_claims(b, &q);
    if (own) {
        /* Alone in the queue, due now and an instance idle: the caller runs
         * it itself, sparing the two thread hand-offs of the worker path. */
        tb_breq *one = &q;
        int sizes[2], n_calls = 0;
        pthread_mutex_unlock(&b->mu);
        double t0 = b->trace ? mono_now() : 0;
        run_batch(own, &one, 1, q.rows, sizes, &n_calls);
        if (b->trace) trace_batch(own, &one, 1, q.rows, t0, mono_now(), 1);
        pthread_mutex_lock(&b->mu);
        finish(own, &one, 1, sizes, n_calls);
        b->n_claimed--;
        /* Requests that came meanwhile: any worker, this instance's too. */
        if (b->head) pthread_cond_broadcast(&b->work);
    } else if (b->n_claimed > 0) {
        /* a worker whose instance a caller holds must not swallow the wake-up */
        pthread_cond_broadcast(&b->work);
    } else {
        pthread_cond_signal(&b->work);
    }
    while (q.state != REQ_DONE) {
        if (q.state == REQ_QUEUED && q.deadline > 0) {
            struct timespec ts = to_timespec(q.deadline);
            int rc = pthread_cond_timedwait(&q.done, &b->mu, &ts);
            if (rc == ETIMEDOUT && q.state == REQ_QUEUED) expire(b, mono_now());
        } else {
            pthread_cond_wait(&q.done, &b->mu);
        }
    }
    b->callers--;
    if (b->callers == 0) pthread_cond_broadcast(&b->idle);
    pthread_mutex_unlock(&b->mu);
    pthread_cond_destroy(&q.done);
    if (q.status != TB_OK) {
        tb_batcher_result_free(r);
        return tb_errorf(q.status, "%s", q.err);
    }
    return TB_OK;
}

void tb_batcher_result_free(tb_batcher_result *r) {
    if (!r) return;
    free(r->block_);
    memset(r, 0, sizeof *r);
}

void tb_batcher_get_stats(tb_batcher *b, tb_batcher_stats *out) {
    pthread_mutex_lock(&b->mu);
    *out = b->st;
    pthread_mutex_unlock(&b->mu);
}
