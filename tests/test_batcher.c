/*
 * test_batcher.c — the dynamic batcher (serve/batcher.c) over an engine made
 * in memory from a small general graph with a dynamic batch and a dynamic
 * sequence dim:
 *   x (batch, seq, 16), z (batch, seq, 8);
 *   y = MatMul(x, W (16, 8)) + z  (batch, seq, 8);  r = Relu(y)  (batch, seq, 8).
 * Checked: every result of a merged call equals the same request run alone
 * on its own executor. The tolerance, stated: a request whose MatMul has
 * more than 4 rows (rows x seq > 4) alone must match bit for bit, since the
 * CPU sgemm sums each output over K in one fixed order for every M above 4
 * and merging only adds rows; a request of 4 rows or fewer alone runs the
 * small-M kernel (backend/cpu/sgemm.c, SMALL_M), which keeps two partial
 * sums over even and odd k, so its bits may differ from the merged call's,
 * within the bound of two orders of summing K products:
 * |a - b| <= 2 K u sum_k |x_k W_kj| + 2 u |y_j| (u = 2^-24), checked per
 * element and the largest ratio to it printed. Then: many threads
 * submitting at once; a preferred size sent at once and a lone request held
 * for the delay, both seen in the batch-size histogram; a full queue
 * refused at once; a deadline passed in the queue; requests of different
 * sequence lengths never merged; two instances; requests still queued when
 * the batcher is freed served (drain); an engine whose dim 0 is fixed run
 * with max_batch_size 1 and a note; bad inputs refused before queueing;
 * and the whole path from a model repository (engine file + config.json).
 */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "plan/engine.h"
#include "serve/batcher.h"
#include "serve/model_repo.h"
#include "tb_test.h"

#define K_IN 16
#define N_OUT 8
#define SMALL_M 4 /* backend/cpu/sgemm.c: rows up to which the small-M kernel runs */

static float g_w[K_IN * N_OUT];          /* (16, 8) the MatMul's weight         */
static double g_worst;                   /* largest |diff| / bound seen         */
static int g_inexact;                    /* small requests whose bits differed  */

/* batch_max 0: the batch dim fixed at 2 (no batching possible). */
static tb_graph *make_graph(int batch_max) {
    tb_graph *g = tb_graph_new();
    int64_t b0 = 2;
    if (batch_max > 0) b0 = TB_SYM(tb_graph_add_sym(g, "batch", 1, 4, batch_max));
    int sq = tb_graph_add_sym(g, "seq", 1, 2, 4);
    int64_t xd[3] = {b0, TB_SYM(sq), K_IN}, zd[3] = {b0, TB_SYM(sq), N_OUT};
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 3, xd);
    int z = tb_graph_add_value(g, "z", TB_VAL_INPUT, TB_F32, 3, zd);
    g->inputs[g->n_inputs++] = x;
    g->inputs[g->n_inputs++] = z;
    float *w = malloc(K_IN * N_OUT * sizeof *w);
    uint64_t seed = 7;
    for (int i = 0; i < K_IN * N_OUT; i++) g_w[i] = w[i] = tb_test_frand(&seed) * 0.7f;
    int64_t wd[2] = {K_IN, N_OUT};
    int wv = tb_graph_add_weight(g, "w", TB_F32, 2, wd, w, 1);
    int min_[2] = {x, wv};
    const char *mn = "m";
    int km = tb_graph_add_node_ex(g, TB_OP_NN_MATMUL, min_, 2, &mn, 1, NULL, NULL);
    CHECK_MSG(km >= 0, "matmul: %s", tb_last_error());
    if (km < 0) { tb_graph_free(g); return NULL; }
    int ain[2] = {g->nodes[km].out[0], z};
    const char *yn = "y";
    int ka = tb_graph_add_node_ex(g, TB_OP_NN_ADD, ain, 2, &yn, 1, NULL, NULL);
    CHECK_MSG(ka >= 0, "add: %s", tb_last_error());
    if (ka < 0) { tb_graph_free(g); return NULL; }
    int y = g->nodes[ka].out[0];
    const char *rn = "r";
    int kr = tb_graph_add_node_ex(g, TB_OP_RELU, &y, 1, &rn, 1, NULL, NULL);
    CHECK_MSG(kr >= 0, "relu: %s", tb_last_error());
    if (kr < 0) { tb_graph_free(g); return NULL; }
    g->outputs[g->n_outputs++] = y;
    g->outputs[g->n_outputs++] = g->nodes[kr].out[0];
    CHECK_MSG(tb_graph_check(g) == TB_OK, "check: %s", tb_last_error());
    return g;
}

/* The graph above as an engine in memory (the same weights every time). */
static tb_engine *make_engine(int batch_max) {
    tb_graph *g = make_graph(batch_max);
    if (!g) return NULL;
    tb_engine *e = NULL;
    CHECK_MSG(tb_engine_from_graph(g, "cpu", &e) == TB_OK, "engine: %s", tb_last_error());
    return e;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One request: its inputs and the outputs it gets when run alone. */
typedef struct {
    int rows, seq;
    float *x, *z;                 /* (rows, seq, 16), (rows, seq, 8)         */
    float *ref_y, *ref_r;         /* (rows, seq, 8) each, run alone          */
    tb_tensor in[2];
    /* filled by the submitter */
    tb_status status;
    tb_batcher_result res;
    int64_t timeout_us;
    double t_submit, t_return;
} req;

static void req_make(req *q, int rows, int seq, uint64_t seed, tb_exec *ref) {
    memset(q, 0, sizeof *q);
    q->rows = rows;
    q->seq = seq;
    size_t nx = (size_t)rows * seq * K_IN, nz = (size_t)rows * seq * N_OUT;
    q->x = malloc(nx * sizeof(float));
    q->z = malloc(nz * sizeof(float));
    q->ref_y = malloc(nz * sizeof(float));
    q->ref_r = malloc(nz * sizeof(float));
    for (size_t i = 0; i < nx; i++) q->x[i] = tb_test_frand(&seed);
    for (size_t i = 0; i < nz; i++) q->z[i] = tb_test_frand(&seed);
    q->in[0] = (tb_tensor){.dtype = TB_F32, .rank = 3, .dims = {rows, seq, K_IN}, .data = q->x};
    q->in[1] = (tb_tensor){.dtype = TB_F32, .rank = 3, .dims = {rows, seq, N_OUT}, .data = q->z};
    tb_tensor out[2];
    tb_status s = tb_exec_run(ref, q->in, 2, out, 2);
    CHECK_MSG(s == TB_OK, "reference run: %s", tb_last_error());
    if (s == TB_OK) {
        memcpy(q->ref_y, out[0].data, nz * sizeof(float));
        memcpy(q->ref_r, out[1].data, nz * sizeof(float));
    }
}

static void req_free(req *q) {
    tb_batcher_result_free(&q->res);
    free(q->x);
    free(q->z);
    free(q->ref_y);
    free(q->ref_r);
}

/* The result equals the request run alone: bit for bit when its MatMul
 * alone has more than SMALL_M rows, else within the bound above. */
static int req_matches(const req *q) {
    const tb_batcher_result *r = &q->res;
    size_t nz = (size_t)q->rows * q->seq * N_OUT;
    if (q->status != TB_OK || r->n_outputs != 2) return 0;
    for (int o = 0; o < 2; o++) {
        const tb_tensor *t = &r->outputs[o];
        if (t->dtype != TB_F32 || t->rank != 3 || t->dims[0] != q->rows || t->dims[1] != q->seq ||
            t->dims[2] != N_OUT)
            return 0;
    }
    int exact = !memcmp(r->outputs[0].data, q->ref_y, nz * sizeof(float)) &&
                !memcmp(r->outputs[1].data, q->ref_r, nz * sizeof(float));
    if (exact) return 1;
    if (q->rows * q->seq > SMALL_M) return 0;
    g_inexact++;
    const double u = 1.0 / 16777216.0;
    const float *y = r->outputs[0].data, *rl = r->outputs[1].data;
    for (int64_t m = 0; m < (int64_t)q->rows * q->seq; m++)
        for (int j = 0; j < N_OUT; j++) {
            double mag = 0;
            for (int k = 0; k < K_IN; k++) mag += fabs((double)q->x[m * K_IN + k] * g_w[k * N_OUT + j]);
            size_t at = (size_t)m * N_OUT + (size_t)j;
            double bound = 2.0 * K_IN * u * mag + 2.0 * u * fabs((double)q->ref_y[at]);
            double dy = fabs((double)y[at] - q->ref_y[at]), dr = fabs((double)rl[at] - q->ref_r[at]);
            double worst = (dy > dr ? dy : dr) / bound;
            if (worst > g_worst) g_worst = worst;
            if (worst > 1.0) return 0;
        }
    return 1;
}

typedef struct {
    tb_batcher *b;
    req *reqs;
    int n;
    double start_at;              /* submit no earlier than this             */
} submitter;

static void *submit_all(void *arg) {
    submitter *s = arg;
    while (now_s() < s->start_at) usleep(100);
    for (int i = 0; i < s->n; i++) {
        req *q = &s->reqs[i];
        q->t_submit = now_s();
        q->status = tb_batcher_infer(s->b, q->in, 2, q->timeout_us, &q->res);
        q->t_return = now_s();
    }
    return NULL;
}

/* Each request in its own thread, all released together. */
static void submit_parallel(tb_batcher *b, req *reqs, int n) {
    pthread_t th[64];
    submitter s[64];
    double at = now_s() + 0.02;
    for (int i = 0; i < n; i++) {
        s[i] = (submitter){.b = b, .reqs = &reqs[i], .n = 1, .start_at = at};
        pthread_create(&th[i], NULL, submit_all, &s[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static tb_batcher *make_batcher(tb_engine *e, int max_batch, int64_t delay_us, const int *pref, int n_pref,
                                int max_queue, int instances) {
    tb_batcher_config c;
    tb_batcher_config_default(&c);
    c.max_batch_size = max_batch;
    c.max_queue_delay_us = delay_us;
    for (int i = 0; i < n_pref; i++) c.preferred_batch_size[i] = pref[i];
    c.n_preferred = n_pref;
    c.max_queue_size = max_queue;
    c.instance_count = instances;
    c.threads_per_instance = 1;
    tb_batcher *b = NULL;
    tb_status s = tb_batcher_create(e, &c, &b);
    CHECK_MSG(s == TB_OK, "create: %s", tb_last_error());
    return b;
}

/* ---------------------------------------------------------------- tests */

/* Six requests of 1-3 rows held together by a long delay: merged into
 * calls of up to 8 rows, each result equal to its request run alone. */
static void test_merged_equals_alone(tb_engine *e, tb_exec *ref) {
    tb_batcher *b = make_batcher(e, 8, 300000, NULL, 0, 0, 1);
    if (!b) return;
    CHECK(tb_batcher_max_batch_size(b) == 8 && tb_batcher_note(b)[0] == 0);
    req q[6];
    int rows[6] = {1, 3, 2, 1, 2, 1}; /* seq 3: 3 MatMul rows alone (small-M kernel) up to 9 */
    for (int i = 0; i < 6; i++) req_make(&q[i], rows[i], 3, 100 + (uint64_t)i, ref);
    submit_parallel(b, q, 6);
    int merged = 0, total_calls_rows = 0;
    for (int i = 0; i < 6; i++) {
        CHECK_MSG(req_matches(&q[i]), "request %d (%d rows): status %d, %s", i, rows[i], q[i].status,
                  tb_status_str(q[i].status));
        CHECK(q[i].res.batch_size >= rows[i] && q[i].res.batch_size <= 8);
        if (q[i].res.n_requests > 1) merged++;
        total_calls_rows += rows[i];
    }
    CHECK_MSG(merged >= 2, "only %d requests ran merged", merged);
    tb_batcher_stats st;
    tb_batcher_get_stats(b, &st);
    CHECK(st.success == 6 && st.failures == 0 && st.pending == 0 && st.running == 0);
    CHECK_MSG(st.inferences == (uint64_t)total_calls_rows, "%llu rows", (unsigned long long)st.inferences);
    CHECK(st.executions < 6);
    for (int i = 0; i < 6; i++) req_free(&q[i]);
    tb_batcher_free(b);
}

/* Warm-up: on, every batch size 1..4 twice per instance before the workers
 * start, results unchanged after it; off and auto (a CPU: off) run none. */
static void test_warmup(tb_engine *e, tb_exec *ref) {
    const int modes[3] = {1, 0, -1};
    for (int k = 0; k < 3; k++) {
        tb_batcher_config c;
        tb_batcher_config_default(&c);
        CHECK(c.warmup == -1);
        c.max_batch_size = 4;
        c.instance_count = 2;
        c.threads_per_instance = 1;
        c.warmup = modes[k];
        tb_batcher *b = NULL;
        CHECK_MSG(tb_batcher_create(e, &c, &b) == TB_OK, "create: %s", tb_last_error());
        if (!b) continue;
        tb_batcher_stats st;
        tb_batcher_get_stats(b, &st);
        CHECK_MSG(st.warmup_runs == (modes[k] == 1 ? 16u : 0u), "warmup %d: %llu runs", modes[k],
                  (unsigned long long)st.warmup_runs);
        CHECK(st.executions == 0 && st.requests == 0);
        req q[3];
        for (int i = 0; i < 3; i++) req_make(&q[i], 1 + i % 2, 4, 1500 + (uint64_t)i, ref);
        submit_parallel(b, q, 3);
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(req_matches(&q[i]), "warmup %d, request %d: %s", modes[k], i, tb_status_str(q[i].status));
            req_free(&q[i]);
        }
        tb_batcher_free(b);
    }
}

/* 8 threads x 25 requests of random rows and sequence lengths at no delay. */
static void test_concurrent(tb_engine *e, tb_exec *ref, int instances) {
    tb_batcher *b = make_batcher(e, 8, 500, NULL, 0, 0, instances);
    if (!b) return;
    enum { T = 8, N = 25 };
    req *q = calloc(T * N, sizeof *q);
    uint64_t seed = 99 + (uint64_t)instances;
    for (int i = 0; i < T * N; i++) {
        int r = 1 + (int)(seed = seed * 6364136223846793005ULL + 1442695040888963407ULL, (seed >> 33) % 3);
        int sq = 1 + (i % 7 == 0);
        req_make(&q[i], r, sq, 1000 + (uint64_t)i, ref);
    }
    pthread_t th[T];
    submitter s[T];
    double at = now_s() + 0.02;
    for (int t = 0; t < T; t++) {
        s[t] = (submitter){.b = b, .reqs = &q[t * N], .n = N, .start_at = at};
        pthread_create(&th[t], NULL, submit_all, &s[t]);
    }
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    int bad = 0, merged = 0;
    for (int i = 0; i < T * N; i++) {
        if (!req_matches(&q[i])) bad++;
        if (q[i].res.n_requests > 1) merged++;
    }
    CHECK_MSG(bad == 0, "%d of %d results differ from the request run alone (%d instances)", bad, T * N,
              instances);
    tb_batcher_stats st;
    tb_batcher_get_stats(b, &st);
    CHECK(st.success == T * N && st.requests == T * N);
    uint64_t calls = 0;
    for (int i = 0; i < TB_BATCHER_BATCH_BUCKETS; i++) calls += st.batch_hist[i];
    CHECK(calls == st.executions);
    printf("concurrent, %d instance(s): %d requests in %llu calls, %d merged\n", instances, T * N,
           (unsigned long long)st.executions, merged);
    for (int i = 0; i < T * N; i++) req_free(&q[i]);
    free(q);
    tb_batcher_free(b);
}

/* No delay: a request alone in the queue runs on its caller's thread
 * (stats.direct), one after another from one thread all do; under 8
 * threads x 25 requests on `instances` instances, callers and workers share
 * the instances and every result equals the request run alone. */
static void test_caller_runs(tb_engine *e, tb_exec *ref, int instances) {
    tb_batcher *b = make_batcher(e, 8, 0, NULL, 0, 0, instances);
    if (!b) return;
    enum { T = 8, N = 25, SEQ = 12 };
    req *q = calloc(T * N, sizeof *q);
    for (int i = 0; i < T * N; i++) req_make(&q[i], 1 + i % 3, i < SEQ ? 1 + (i % 5 == 0) : 4, 5000 + (uint64_t)i, ref);
    submitter one = {.b = b, .reqs = q, .n = SEQ, .start_at = 0};
    submit_all(&one);
    tb_batcher_stats st;
    tb_batcher_get_stats(b, &st);
    CHECK_MSG(st.direct == SEQ && st.executions == SEQ, "sequential: %llu of %d run by the caller, %llu calls",
              (unsigned long long)st.direct, SEQ, (unsigned long long)st.executions);
    for (int i = 0; i < SEQ; i++) CHECK_MSG(req_matches(&q[i]), "sequential request %d", i);
    pthread_t th[T];
    submitter s[T];
    double at = now_s() + 0.02;
    for (int t = 0; t < T; t++) {
        s[t] = (submitter){.b = b, .reqs = &q[t * N], .n = N, .start_at = at};
        if (t == 0) s[t].reqs += SEQ, s[t].n -= SEQ;
        pthread_create(&th[t], NULL, submit_all, &s[t]);
    }
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    int bad = 0;
    for (int i = 0; i < T * N; i++) bad += !req_matches(&q[i]);
    tb_batcher_get_stats(b, &st);
    CHECK_MSG(bad == 0, "%d of %d results differ from the request run alone (%d instances, no delay)", bad, T * N,
              instances);
    CHECK(st.success == T * N && st.pending == 0 && st.running == 0 && st.direct <= st.executions);
    printf("no delay, %d instance(s): %d requests in %llu calls, %llu on the caller's thread\n", instances, T * N,
           (unsigned long long)st.executions, (unsigned long long)st.direct);
    for (int i = 0; i < T * N; i++) req_free(&q[i]);
    free(q);
    tb_batcher_free(b);
}

/* Preferred size 4 with a 1 s delay: four 1-row requests go at once as
 * one call of 4 (batch_hist[4]); then three 1-row requests form no
 * preferred size and wait for the delay, one call of 3 (batch_hist[3]). */
static void test_preferred_and_delay(tb_engine *e, tb_exec *ref) {
    const int64_t delay = 1000000;
    int pref[1] = {4};
    tb_batcher *b = make_batcher(e, 8, delay, pref, 1, 0, 1);
    if (!b) return;
    req q[7];
    for (int i = 0; i < 7; i++) req_make(&q[i], 1, 2, 300 + (uint64_t)i, ref);
    submit_parallel(b, q, 4);
    tb_batcher_stats st;
    tb_batcher_get_stats(b, &st);
    CHECK_MSG(st.direct == 0, "%llu requests skipped the delay", (unsigned long long)st.direct);
    CHECK_MSG(st.batch_hist[4] == 1 && st.executions == 1, "preferred: %llu calls, hist[4] %llu",
              (unsigned long long)st.executions, (unsigned long long)st.batch_hist[4]);
    for (int i = 0; i < 4; i++) {
        CHECK(req_matches(&q[i]) && q[i].res.batch_size == 4);
        /* sent when the 4th came, well before the delay */
        CHECK_MSG(q[i].res.queue_us < delay / 2, "queue %lld us", (long long)q[i].res.queue_us);
    }
    submit_parallel(b, q + 4, 3);
    tb_batcher_get_stats(b, &st);
    CHECK_MSG(st.batch_hist[3] == 1 && st.executions == 2, "delay: %llu calls, hist[3] %llu",
              (unsigned long long)st.executions, (unsigned long long)st.batch_hist[3]);
    int64_t oldest = 0;
    for (int i = 4; i < 7; i++) {
        CHECK(req_matches(&q[i]) && q[i].res.batch_size == 3);
        if (q[i].res.queue_us > oldest) oldest = q[i].res.queue_us;
    }
    /* the oldest waited the delay (and not much beyond it on a busy host) */
    CHECK_MSG(oldest >= delay - 1000 && oldest < delay * 3, "oldest waited %lld us", (long long)oldest);
    for (int i = 0; i < 7; i++) req_free(&q[i]);
    tb_batcher_free(b);

    /* A lone request with a delay of 100 ms and no preferred size: it waits
     * the delay and runs alone. */
    b = make_batcher(e, 8, 100000, NULL, 0, 0, 1);
    if (!b) return;
    req one;
    req_make(&one, 2, 1, 77, ref);
    submit_parallel(b, &one, 1);
    CHECK(req_matches(&one) && one.res.batch_size == 2 && one.res.n_requests == 1);
    CHECK_MSG(one.res.queue_us >= 99000, "lone request queued %lld us", (long long)one.res.queue_us);
    tb_batcher_get_stats(b, &st);
    CHECK(st.batch_hist[2] == 1 && st.queue_us_sum >= 99000);
    req_free(&one);
    tb_batcher_free(b);
}

typedef struct {
    tb_batcher *b;
    req *q;
} one_arg;

static void *submit_one(void *arg) {
    one_arg *a = arg;
    a->q->t_submit = now_s();
    a->q->status = tb_batcher_infer(a->b, a->q->in, 2, a->q->timeout_us, &a->q->res);
    a->q->t_return = now_s();
    return NULL;
}

static void wait_pending(tb_batcher *b, int n) {
    tb_batcher_stats st;
    for (int i = 0; i < 5000; i++) {
        tb_batcher_get_stats(b, &st);
        if (st.pending >= n) return;
        usleep(1000);
    }
    CHECK_MSG(0, "the queue never held %d requests", n);
}

/* Queue limit 2, delay 5 s: two requests wait, a third is refused at once,
 * and freeing the batcher runs the two waiting ones at once (drain), not
 * after 5 s. Then, in a queue of its own, a request with a 50 ms deadline
 * times out, and one with the config's default deadline too. */
static void test_queue_full_timeout_drain(tb_engine *e, tb_exec *ref) {
    tb_batcher *b = make_batcher(e, 8, 5000000, NULL, 0, 2, 1);
    if (!b) return;
    req q[3];
    for (int i = 0; i < 3; i++) req_make(&q[i], 1, 2, 500 + (uint64_t)i, ref);
    pthread_t th[2];
    one_arg a[2];
    for (int i = 0; i < 2; i++) {
        a[i] = (one_arg){b, &q[i]};
        pthread_create(&th[i], NULL, submit_one, &a[i]);
    }
    wait_pending(b, 2);
    double t0 = now_s();
    tb_status s = tb_batcher_infer(b, q[2].in, 2, 0, &q[2].res);
    CHECK_MSG(s == TB_ERR_QUEUE_FULL, "third request: %s", tb_status_str(s));
    CHECK(now_s() - t0 < 0.5);
    CHECK(strstr(tb_last_error(), "limit") != NULL);
    CHECK(q[2].res.block_ == NULL && q[2].res.n_outputs == 0);
    tb_batcher_stats st;
    tb_batcher_get_stats(b, &st);
    CHECK(st.rejected == 1 && st.pending == 2 && st.success == 0);
    double t_free = now_s();
    tb_batcher_free(b);
    double freed = now_s() - t_free;
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK_MSG(freed < 2.0, "free took %.2f s", freed);
    for (int i = 0; i < 2; i++) CHECK_MSG(req_matches(&q[i]), "drained request %d: %s", i, tb_status_str(q[i].status));
    CHECK(q[0].res.n_requests == 2); /* the drain sends what is there as one call */
    for (int i = 0; i < 3; i++) req_free(&q[i]);

    /* Timeout: 50 ms in a queue whose delay is 5 s. */
    b = make_batcher(e, 8, 5000000, NULL, 0, 0, 1);
    if (!b) return;
    req t;
    req_make(&t, 1, 2, 600, ref);
    t0 = now_s();
    s = tb_batcher_infer(b, t.in, 2, 50000, &t.res);
    double waited = now_s() - t0;
    CHECK_MSG(s == TB_ERR_TIMEOUT, "timed request: %s", tb_status_str(s));
    CHECK_MSG(waited >= 0.049 && waited < 1.0, "returned after %.3f s", waited);
    CHECK(t.res.block_ == NULL);
    tb_batcher_get_stats(b, &st);
    CHECK(st.timeouts == 1 && st.pending == 0 && st.executions == 0);
    req_free(&t);
    tb_batcher_free(b);

    /* The config's default timeout applies when the call gives 0. */
    tb_batcher_config c;
    tb_batcher_config_default(&c);
    c.max_queue_delay_us = 5000000;
    c.default_timeout_us = 30000;
    c.threads_per_instance = 1;
    b = NULL;
    CHECK(tb_batcher_create(e, &c, &b) == TB_OK);
    if (!b) return;
    req_make(&t, 1, 2, 601, ref);
    s = tb_batcher_infer(b, t.in, 2, 0, &t.res);
    CHECK_MSG(s == TB_ERR_TIMEOUT, "default timeout: %s", tb_status_str(s));
    req_free(&t);
    tb_batcher_free(b);
}

/* Sequence lengths 2, 2 and 3 released together under a delay: the two of
 * length 2 merge, the one of length 3 runs in a call of its own. */
static void test_shapes_not_merged(tb_engine *e, tb_exec *ref) {
    tb_batcher *b = make_batcher(e, 8, 150000, NULL, 0, 0, 1);
    if (!b) return;
    req q[3];
    req_make(&q[0], 1, 2, 700, ref);
    req_make(&q[1], 2, 3, 701, ref);
    req_make(&q[2], 2, 2, 702, ref);
    submit_parallel(b, q, 3);
    for (int i = 0; i < 3; i++) CHECK_MSG(req_matches(&q[i]), "request %d: %s", i, tb_status_str(q[i].status));
    CHECK(q[0].res.n_requests == 2 && q[0].res.batch_size == 3);
    CHECK(q[2].res.n_requests == 2 && q[2].res.batch_size == 3);
    CHECK(q[1].res.n_requests == 1 && q[1].res.batch_size == 2);
    tb_batcher_stats st;
    tb_batcher_get_stats(b, &st);
    CHECK(st.executions == 2 && st.batch_hist[3] == 1 && st.batch_hist[2] == 1);
    for (int i = 0; i < 3; i++) req_free(&q[i]);
    tb_batcher_free(b);
}

/* Bad requests are refused before they wait; config errors at create. */
static void test_refusals(tb_engine *e, tb_exec *ref) {
    tb_batcher *b = make_batcher(e, 4, 0, NULL, 0, 0, 1);
    if (!b) return;
    CHECK(tb_batcher_n_inputs(b) == 2 && tb_batcher_n_outputs(b) == 2);
    tb_io_info ii;
    CHECK(tb_batcher_input_info(b, 1, &ii) == TB_OK && !strcmp(ii.name, "z") && ii.rank == 3);
    CHECK(tb_batcher_output_info(b, 1, &ii) == TB_OK && !strcmp(ii.name, "r"));
    req q;
    req_make(&q, 5, 2, 800, ref); /* 5 rows: inside the profile, above max_batch_size 4 */
    tb_batcher_result r;
    CHECK(tb_batcher_infer(b, q.in, 2, 0, &r) == TB_ERR_RANGE);
    CHECK(tb_batcher_infer(b, q.in, 1, 0, &r) == TB_ERR_INVALID_ARG);
    tb_tensor bad[2] = {q.in[0], q.in[1]};
    bad[0].dims[0] = 2;
    bad[1].dims[0] = 2;
    bad[1].dims[1] = 5; /* seq 5 outside [1, 4] */
    CHECK(tb_batcher_infer(b, bad, 2, 0, &r) == TB_ERR_RANGE);
    bad[1].dims[1] = 2;
    bad[1].dims[0] = 1; /* rows differ between inputs */
    CHECK(tb_batcher_infer(b, bad, 2, 0, &r) == TB_ERR_INVALID_ARG);
    bad[1].dims[0] = 2;
    bad[1].dtype = TB_F16;
    CHECK(tb_batcher_infer(b, bad, 2, 0, &r) == TB_ERR_INVALID_ARG);
    tb_batcher_stats st;
    tb_batcher_get_stats(b, &st);
    CHECK(st.invalid == 5 && st.requests == 0);
    req_free(&q);
    tb_batcher_free(b);

    tb_batcher_config c;
    tb_batcher_config_default(&c);
    c.instance_count = 0;
    CHECK(tb_batcher_create(e, &c, &b) == TB_ERR_INVALID_ARG && strstr(tb_last_error(), "instance_count"));
    tb_batcher_config_default(&c);
    c.preferred_batch_size[0] = 9;
    c.n_preferred = 1;
    CHECK(tb_batcher_create(e, &c, &b) == TB_ERR_INVALID_ARG && strstr(tb_last_error(), "preferred"));
    /* above the profile's largest batch (16): lowered, with a note */
    tb_batcher_config_default(&c);
    c.max_batch_size = 64;
    c.threads_per_instance = 1;
    CHECK(tb_batcher_create(e, &c, &b) == TB_OK);
    if (b) {
        CHECK(tb_batcher_max_batch_size(b) == 16 && strstr(tb_batcher_note(b), "16"));
        tb_batcher_free(b);
    }
    CHECK(!strcmp(tb_status_str(TB_ERR_QUEUE_FULL), "queue full"));
    CHECK(!strcmp(tb_status_str(TB_ERR_TIMEOUT), "timed out"));
    CHECK(TB_ERR_QUEUE_FULL == TB_ERR_INTERNAL + 1 && TB_ERR_TIMEOUT == TB_ERR_INTERNAL + 2);
}

/* dim 0 fixed at 2: no batching, max_batch_size 1 with a note; requests
 * run whole, one per call. */
static void test_fixed_batch(void) {
    tb_engine *e = make_engine(0);
    if (!e) return;
    tb_exec *ref = NULL;
    tb_exec_options xo;
    tb_exec_options_default(&xo);
    xo.n_threads = 1;
    CHECK(tb_exec_create(e, &xo, &ref) == TB_OK);
    tb_batcher *b = make_batcher(e, 8, 2000000, NULL, 0, 0, 1);
    if (b && ref) {
        CHECK(tb_batcher_max_batch_size(b) == 1);
        CHECK_MSG(strstr(tb_batcher_note(b), "not dynamic") != NULL, "note: %s", tb_batcher_note(b));
        req q[3];
        for (int i = 0; i < 3; i++) req_make(&q[i], 2, 2, 900 + (uint64_t)i, ref);
        submit_parallel(b, q, 3);
        for (int i = 0; i < 3; i++) {
            CHECK(req_matches(&q[i]) && q[i].res.n_requests == 1 && q[i].res.batch_size == 1);
            CHECK(q[i].res.queue_us < 1000000); /* no merging: no 2 s delay either */
        }
        tb_batcher_stats st;
        tb_batcher_get_stats(b, &st);
        CHECK(st.executions == 3 && st.batch_hist[1] == 3);
        for (int i = 0; i < 3; i++) req_free(&q[i]);
    }
    tb_batcher_free(b);
    tb_exec_free(ref);
    tb_engine_free(e);
}

/* The path a server takes: the graph written as DIR/mm/1/model.engine with
 * a config.json, the repository scanned, the engine loaded from the path
 * found and the batcher made from the config: preferred size 2 under a
 * 1 s delay sends two requests at once, merged, equal to them alone. */
static void test_from_repository(tb_exec *ref) {
    char root[512], p[700];
    snprintf(root, sizeof root, "%s/batcher_repo_%d", tb_test_tmp(), (int)getpid());
    snprintf(p, sizeof p, "%s/mm/1", root);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", root, p);
    CHECK(system(cmd) == 0);
    tb_graph *g = make_graph(16);
    if (!g) return;
    snprintf(p, sizeof p, "%s/mm/1/model.engine", root);
    CHECK_MSG(tb_engine_write_general(g, p, "cpu", "test", 0.0) == TB_OK, "write: %s", tb_last_error());
    tb_graph_free(g);
    snprintf(p, sizeof p, "%s/mm/config.json", root);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"max_batch_size\": 4, \"dynamic_batching\": {\"preferred_batch_size\": [2],\n"
          " \"max_queue_delay_microseconds\": 1000000, \"default_queue_policy\": {\"max_queue_size\": 8}},\n"
          " \"instance_group\": [{\"count\": 1, \"kind\": \"KIND_CPU\", \"threads\": 1}]}\n",
          f);
    fclose(f);
    tb_model_repo repo;
    CHECK_MSG(tb_model_repo_scan(root, &repo) == TB_OK, "scan: %s", tb_last_error());
    const tb_model_entry *m = tb_model_repo_find(&repo, "mm");
    CHECK_MSG(m && m->status == TB_OK && m->n_versions == 1, "mm: %s", m ? m->error : "absent");
    tb_engine *e = NULL;
    tb_batcher *b = NULL;
    if (m && m->status == TB_OK && m->n_versions == 1) {
        CHECK_MSG(tb_engine_load(m->versions[0].path, &e) == TB_OK, "load: %s", tb_last_error());
        tb_batcher_config bc;
        tb_repo_config_batcher(&m->config, &bc);
        if (e) CHECK_MSG(tb_batcher_create(e, &bc, &b) == TB_OK, "create: %s", tb_last_error());
    }
    if (b) {
        CHECK(tb_batcher_max_batch_size(b) == 4);
        req q[2];
        for (int i = 0; i < 2; i++) req_make(&q[i], 1, 4, 1200 + (uint64_t)i, ref);
        submit_parallel(b, q, 2);
        for (int i = 0; i < 2; i++) {
            CHECK_MSG(req_matches(&q[i]), "request %d: %s", i, tb_status_str(q[i].status));
            CHECK(q[i].res.n_requests == 2 && q[i].res.batch_size == 2 && q[i].res.queue_us < 500000);
        }
        tb_batcher_stats st;
        tb_batcher_get_stats(b, &st);
        CHECK(st.batch_hist[2] == 1 && st.executions == 1);
        for (int i = 0; i < 2; i++) req_free(&q[i]);
    }
    tb_batcher_free(b);
    tb_engine_free(e);
    tb_model_repo_free(&repo);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

int main(void) {
    tb_engine *e = make_engine(16);
    if (!e) return 1;
    tb_exec *ref = NULL;
    tb_exec_options xo;
    tb_exec_options_default(&xo);
    xo.n_threads = 1;
    CHECK_MSG(tb_exec_create(e, &xo, &ref) == TB_OK, "%s", tb_last_error());
    if (ref) {
        test_merged_equals_alone(e, ref);
        test_warmup(e, ref);
        test_concurrent(e, ref, 1);
        test_concurrent(e, ref, 2);
        test_caller_runs(e, ref, 1);
        test_caller_runs(e, ref, 2);
        test_preferred_and_delay(e, ref);
        test_queue_full_timeout_drain(e, ref);
        test_shapes_not_merged(e, ref);
        test_refusals(e, ref);
        test_from_repository(ref);
    }
    test_fixed_batch();
    printf("merged vs alone: small requests (<= %d MatMul rows) differing in some bit: %d, largest "
           "difference %.3f of the bound; larger requests bit-identical\n",
           SMALL_M, g_inexact, g_worst);
    tb_exec_free(ref);
    tb_engine_free(e);
    printf("test_batcher: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
