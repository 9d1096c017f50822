/* comm.c — in-process collectives for tensor-parallel ranks (comm.h).
 *
 * Each collective publishes every rank's buffer pointer, waits at a barrier,
 * does this rank's share of the work reading all ranks' buffers, and waits
 * at a second barrier so that no rank reuses a buffer another still reads.
 * The all-reduce splits the elements into one slice per rank; a rank sums
 * its slice over all buffers and writes the sum into all of them. */
#include "core/comm.h"

#include <pthread.h>
#include <stdatomic.h>

#define TB_COMM_MAX 64

struct tb_comm {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int waiting;
    atomic_uint gen;
    atomic_int aborted;
    float *bufs[TB_COMM_MAX];       /* all-reduce: each rank's buffer */
    const float *src[TB_COMM_MAX];  /* all-gather: each rank's part   */
    void *ptr[TB_COMM_MAX];         /* exchange: each rank's pointer  */
};

tb_status tb_comm_create(int n_ranks, tb_comm **out) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > TB_COMM_MAX)
        return tb_errorf(TB_ERR_INVALID_ARG, "a communicator has 1 to %d ranks, not %d", TB_COMM_MAX, n_ranks);
    tb_comm *c = calloc(1, sizeof *c);
    if (!c) return tb_errorf(TB_ERR_OOM, "out of memory");
    c->n = n_ranks;
    atomic_init(&c->waiting, 0);
    atomic_init(&c->gen, 0);
    atomic_init(&c->aborted, 0);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    *out = c;
    return TB_OK;
}

void tb_comm_free(tb_comm *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

int tb_comm_size(const tb_comm *c) { return c ? c->n : 1; }

/* Ranks meet here twice per collective, so a barrier spins a while before
 * it sleeps: a collective of a small step then costs about a cache line's
 * round trip rather than a thread wake-up. 0 when every rank arrived, -1
 * when the communicator was aborted. */
#define SPIN_ITERS 20000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int barrier(tb_comm *c) {
    unsigned gen = atomic_load(&c->gen);
    if (atomic_load(&c->aborted)) return -1;
    if (atomic_fetch_add(&c->waiting, 1) + 1 == c->n) {
        atomic_store(&c->waiting, 0); /* before the release: a released rank may enter the next barrier */
        pthread_mutex_lock(&c->mu);
        atomic_fetch_add(&c->gen, 1);
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return atomic_load(&c->aborted) ? -1 : 0;
    }
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load(&c->gen) != gen || atomic_load(&c->aborted)) return atomic_load(&c->aborted) ? -1 : 0;
        cpu_relax();
    }
    pthread_mutex_lock(&c->mu);
    while (atomic_load(&c->gen) == gen && !atomic_load(&c->aborted)) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return atomic_load(&c->aborted) ? -1 : 0;
}

int tb_comm_abort(tb_comm *c) {
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    int first = !atomic_exchange(&c->aborted, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return first;
}

void tb_comm_reset(tb_comm *c) {
    if (!c) return;
    atomic_store(&c->waiting, 0);
    atomic_store(&c->aborted, 0);
}

static tb_status aborted(int rank) {
    return tb_errorf(TB_ERR_INTERNAL, "tensor-parallel rank %d: another rank failed during the step", rank);
}

static tb_status check_rank(const tb_comm *c, int rank) {
    if (!c || rank < 0 || rank >= c->n)
        return tb_errorf(TB_ERR_INVALID_ARG, "rank %d is outside the communicator (%d ranks)", rank, c ? c->n : 0);
    return TB_OK;
}

tb_status tb_comm_all_reduce(tb_comm *c, int rank, float *buf, size_t n) {
    TB_TRY(check_rank(c, rank));
    if (c->n == 1) return TB_OK;
    c->bufs[rank] = buf;
    if (barrier(c)) return aborted(rank);
    /* this rank's slice, in whole cache lines */
    size_t per = (n + (size_t)c->n - 1) / (size_t)c->n;
    per = (per + 15) / 16 * 16;
    size_t lo = per * (size_t)rank, hi = lo + per;
    if (lo > n) lo = n;
    if (hi > n) hi = n;
    for (size_t i = lo; i < hi; i++) {
        float s = c->bufs[0][i];
        for (int k = 1; k < c->n; k++) s += c->bufs[k][i];
        for (int k = 0; k < c->n; k++) c->bufs[k][i] = s;
    }
    if (barrier(c)) return aborted(rank);
    return TB_OK;
}

tb_status tb_comm_all_gather_cols(tb_comm *c, int rank, const float *x, float *out, size_t rows, size_t cols) {
    TB_TRY(check_rank(c, rank));
    size_t n = (size_t)c->n, w = cols * n;
    if (c->n == 1) {
        memcpy(out, x, sizeof(float) * rows * cols);
        return TB_OK;
    }
    c->src[rank] = x;
    if (barrier(c)) return aborted(rank);
    for (size_t r = 0; r < rows; r++)
        for (size_t k = 0; k < n; k++) memcpy(out + r * w + k * cols, c->src[k] + r * cols, sizeof(float) * cols);
    if (barrier(c)) return aborted(rank);
    return TB_OK;
}

tb_status tb_comm_exchange(tb_comm *c, int rank, void *mine, void **all) {
    TB_TRY(check_rank(c, rank));
    c->ptr[rank] = mine;
    if (barrier(c)) return aborted(rank);
    for (int k = 0; k < c->n; k++) all[k] = c->ptr[k];
    /* nobody publishes again before everyone has read */
    if (barrier(c)) return aborted(rank);
    return TB_OK;
}

tb_status tb_comm_barrier(tb_comm *c, int rank) {
    TB_TRY(check_rank(c, rank));
    return barrier(c) ? aborted(rank) : TB_OK;
}
