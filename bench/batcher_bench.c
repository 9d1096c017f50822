/*
 * batcher_bench.c — closed-loop load on the dynamic batcher (serve/batcher.c)
 * without HTTP: C client threads each send a 1-row request (random inputs at
 * the profile's smallest non-batch dims), wait for it and send the next, for
 * S seconds. Prints requests per second, latency percentiles, the mean
 * engine-call batch size and the batch-size histogram, so batching's gain
 * can be read apart from the server's own costs.
 *
 *   batcher_bench ENGINE [--max-batch N] [--delay-us N] [--clients C]
 *                        [--seconds S] [--instances I] [--threads T]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/batcher.h"

typedef struct {
    tb_batcher *b;
    tb_tensor in[TB_BATCHER_MAX_IO];
    int n_in;
    double until;
    double *lat;      /* seconds per request, this client's */
    int n, cap, errors;
} client;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run_client(void *arg) {
    client *c = arg;
    while (now_s() < c->until) {
        double t0 = now_s();
        tb_batcher_result r;
        if (tb_batcher_infer(c->b, c->in, c->n_in, 0, &r) != TB_OK) {
            c->errors++;
            continue;
        }
        tb_batcher_result_free(&r);
        if (c->n == c->cap) {
            c->cap = c->cap ? c->cap * 2 : 1024;
            c->lat = realloc(c->lat, (size_t)c->cap * sizeof *c->lat);
        }
        c->lat[c->n++] = now_s() - t0;
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: batcher_bench ENGINE [--max-batch N] [--delay-us N] [--clients C] [--seconds S] "
                        "[--instances I] [--threads T]\n");
        return 2;
    }
    tb_batcher_config cfg;
    tb_batcher_config_default(&cfg);
    cfg.max_queue_size = 0;
    int clients = 16;
    double seconds = 8;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--max-batch")) cfg.max_batch_size = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--delay-us")) cfg.max_queue_delay_us = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--clients")) clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--instances")) cfg.instance_count = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) cfg.threads_per_instance = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (clients < 1 || clients > 256) { fprintf(stderr, "--clients in [1, 256]\n"); return 2; }
    tb_engine *e = NULL;
    tb_batcher *b = NULL;
    if (tb_engine_load(argv[1], &e) != TB_OK || tb_batcher_create(e, &cfg, &b) != TB_OK) {
        fprintf(stderr, "error: %s\n", tb_last_error());
        tb_engine_free(e);
        return 1;
    }
    int n_in = tb_batcher_n_inputs(b);
    /* one request's inputs (1 row, the smallest non-batch dims), shared read-only by every client */
    tb_tensor in[TB_BATCHER_MAX_IO];
    uint64_t seed = 1;
    for (int i = 0; i < n_in; i++) {
        tb_io_info ii;
        tb_batcher_input_info(b, i, &ii);
        in[i] = (tb_tensor){.dtype = ii.dtype, .rank = ii.rank};
        size_t n = 1;
        for (int d = 0; d < ii.rank; d++) {
            in[i].dims[d] = d == 0 ? 1 : ii.min[d];
            n *= (size_t)in[i].dims[d];
        }
        if (ii.dtype != TB_F32 && ii.dtype != TB_I64 && ii.dtype != TB_I32) {
            fprintf(stderr, "input %s: dtype %s not generated here\n", ii.name, tb_dtype_name(ii.dtype));
            return 1;
        }
        void *p = calloc(n, 8);
        for (size_t k = 0; k < n; k++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            if (ii.dtype == TB_F32) ((float *)p)[k] = (float)((seed >> 40) & 0xffff) / 65536.0f - 0.5f;
            else if (ii.dtype == TB_I64) ((int64_t *)p)[k] = (int64_t)((seed >> 40) % 1000);
            else ((int32_t *)p)[k] = (int32_t)((seed >> 40) % 1000);
        }
        in[i].data = p;
    }
    client *cs = calloc((size_t)clients, sizeof *cs);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    /* warm-up: every batch size the clients can form, planned once */
    for (int k = 0; k < clients; k++) {
        cs[k].b = b;
        memcpy(cs[k].in, in, sizeof in);
        cs[k].n_in = n_in;
        cs[k].until = now_s() + 1.0;
        pthread_create(&th[k], NULL, run_client, &cs[k]);
    }
    for (int k = 0; k < clients; k++) pthread_join(th[k], NULL);
    tb_batcher_stats s0, s1;
    tb_batcher_get_stats(b, &s0);
    double t0 = now_s();
    for (int k = 0; k < clients; k++) {
        cs[k].n = cs[k].errors = 0;
        cs[k].until = t0 + seconds;
        pthread_create(&th[k], NULL, run_client, &cs[k]);
    }
    for (int k = 0; k < clients; k++) pthread_join(th[k], NULL);
    double wall = now_s() - t0;
    tb_batcher_get_stats(b, &s1);
    int total = 0, errors = 0;
    for (int k = 0; k < clients; k++) total += cs[k].n, errors += cs[k].errors;
    double *all = malloc((size_t)(total ? total : 1) * sizeof *all);
    int at = 0;
    for (int k = 0; k < clients; k++) {
        memcpy(all + at, cs[k].lat, (size_t)cs[k].n * sizeof *all);
        at += cs[k].n;
    }
    qsort(all, (size_t)total, sizeof *all, cmp_d);
    uint64_t calls = s1.executions - s0.executions, rows = s1.inferences - s0.inferences;
    printf("max_batch %d delay %lld us instances %d clients %d: %.2f req/s, p50 %.1f ms, p99 %.1f ms, "
           "mean batch %.2f, %d errors\n",
           tb_batcher_max_batch_size(b), (long long)cfg.max_queue_delay_us, cfg.instance_count, clients,
           total / wall, total ? all[total / 2] * 1e3 : 0, total ? all[(int)(total * 0.99)] * 1e3 : 0,
           calls ? (double)rows / (double)calls : 0, errors);
    printf("batch sizes:");
    for (int i = 1; i < TB_BATCHER_BATCH_BUCKETS; i++)
        if (s1.batch_hist[i] - s0.batch_hist[i]) printf(" %d:%llu", i, (unsigned long long)(s1.batch_hist[i] - s0.batch_hist[i]));
    printf("\n");
    for (int k = 0; k < clients; k++) free(cs[k].lat);
    free(all);
    free(cs);
    free(th);
    for (int i = 0; i < n_in; i++) free(in[i].data);
    tb_batcher_free(b);
    tb_engine_free(e);
    return 0;
}
