/* pool.c — a fixed pool of workers for one parallel loop at a time.
 *
 * Decode steps run hundreds of short ops per token, so workers spin on a
 * generation counter for a while before sleeping on a condition variable:
 * waking a sleeping thread costs tens of microseconds, a spin costs nothing
 * when the next op follows at once. */
#define _GNU_SOURCE
#include "core.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>

#define TB_POOL_SPIN 200000

struct tb_pool {
    int n;
    pthread_t *threads;
    tb_pool_fn fn;
    void *arg;
    _Atomic uint64_t gen;     /* bumped once per job            */
    _Atomic int pending;      /* workers still running this job */
    _Atomic int stop;
    _Atomic int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct {
    tb_pool *p;
    int ith;
} tb_worker_arg;

static void *worker_main(void *varg) {
    tb_worker_arg *wa = varg;
    tb_pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < TB_POOL_SPIN) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        p->fn(p->arg, ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
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
        tb_worker_arg *wa = malloc(sizeof *wa);
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
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
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) _mm_pause();
}
