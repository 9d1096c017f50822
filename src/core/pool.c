/* pool.c — a fixed pool of workers for one parallel loop at a time.
 *
 * A job is split into as many chunks as the pool has threads; the caller and
 * the workers claim chunk indices from one atomic word (job generation in the
 * high half, next chunk in the low half), so whoever is running does the
 * work: when a worker is not scheduled (more runnable threads than cores), the
 * caller runs its chunks itself instead of waiting a time slice for it.
 * Workers spin (yielding now and then) before sleeping on a condition
 * variable, because a decode step runs hundreds of short jobs in a row. */
#define _GNU_SOURCE
#include "core.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define TB_POOL_SPIN 100000   /* pause iterations before sleeping */
#define TB_POOL_YIELD 64      /* pause iterations between yields  */

struct tb_pool {
    int n;
    pthread_t *threads;
    tb_pool_fn fn;                 /* stable while the job's chunks run */
    void *arg;
    _Atomic uint64_t word;         /* gen << 32 | next chunk            */
    _Atomic int done;              /* chunks finished of this job       */
    _Atomic int stop;
    _Atomic int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Claims and runs chunks of job `gen` until none is left. */
static void run_chunks(tb_pool *p, uint32_t gen) {
    for (;;) {
        uint64_t w = atomic_load_explicit(&p->word, memory_order_acquire);
        if ((uint32_t)(w >> 32) != gen) return;
        uint32_t idx = (uint32_t)w;
        if (idx >= (uint32_t)p->n) return;
        if (!atomic_compare_exchange_weak_explicit(&p->word, &w, w + 1, memory_order_acq_rel, memory_order_relaxed))
            continue;
        p->fn(p->arg, (int)idx, p->n);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *varg) {
    tb_pool *p = varg;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = (uint32_t)(atomic_load_explicit(&p->word, memory_order_acquire) >> 32)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < TB_POOL_SPIN) {
                _mm_pause();
                if (spins % TB_POOL_YIELD == 0) sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((uint32_t)(atomic_load(&p->word) >> 32) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        run_chunks(p, gen);
    }
}

tb_status tb_pool_create(int n_threads, tb_pool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = tb_default_threads();
    if (n_threads > 256) return tb_errorf(TB_ERR_INVALID_ARG, "too many threads: %d", n_threads);
    tb_pool *p = calloc(1, sizeof *p);
    if (!p) return tb_errorf(TB_ERR_OOM, "out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            p->n = i;
            tb_pool_free(p);
            return tb_errorf(TB_ERR_INTERNAL, "cannot start worker thread %d", i);
        }
    }
    *out = p;
    return TB_OK;
}

void tb_pool_free(tb_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int tb_pool_size(const tb_pool *p) { return p ? p->n : 1; }

void tb_pool_run(tb_pool *p, tb_pool_fn fn, void *arg) {
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t gen = (uint32_t)(atomic_load(&p->word) >> 32) + 1;
    atomic_store(&p->word, (uint64_t)gen << 32); /* seq_cst: pairs with the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, gen);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n) {
        _mm_pause();
        if (++spins % TB_POOL_YIELD == 0) sched_yield();
    }
}
