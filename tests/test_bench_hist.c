/* test_bench_hist.c — the load tester's histogram and metric helpers:
 * quantiles within 1% of the exact nearest-rank value, exact mean, stddev,
 * min and max, bucket bounds that tile the range, merging, and the
 * Prometheus parser. */
#include <math.h>

#include "bench/bench.h"
#include "tb_test.h"

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void check_dist(const char *name, uint64_t *v, int n) {
    tb_hist h;
    CHECK(tb_hist_init(&h) == TB_OK);
    double sum = 0;
    for (int i = 0; i < n; i++) { tb_hist_add(&h, v[i]); sum += (double)v[i]; }
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    CHECK(h.count == (uint64_t)n);
    CHECK(h.min == v[0] && h.max == v[n - 1]);
    CHECK_MSG(fabs(tb_hist_mean(&h) - sum / n) <= 1e-9 * (sum / n) + 1e-9, "%s mean", name);
    double var = 0, m = sum / n;
    for (int i = 0; i < n; i++) var += ((double)v[i] - m) * ((double)v[i] - m);
    double sd = sqrt(var / n);
    CHECK_MSG(fabs(tb_hist_stddev(&h) - sd) <= 1e-6 * sd + 1e-6, "%s stddev %g vs %g", name, tb_hist_stddev(&h), sd);
    const double qs[] = {0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999};
    for (size_t k = 0; k < sizeof qs / sizeof qs[0]; k++) {
        size_t rank = (size_t)ceil(qs[k] * n);
        double exact = (double)v[rank - 1], got = tb_hist_quantile(&h, qs[k]);
        CHECK_MSG(fabs(got - exact) <= 0.01 * exact, "%s q%.3f: %g vs exact %g", name, qs[k], got, exact);
    }
    tb_hist_free(&h);
}

int main(void) {
    /* buckets tile [0, 2^44) without gaps and stay narrow */
    int prev = -1;
    for (uint64_t v = 0; v < ((uint64_t)1 << 44); v = v < 4096 ? v + 1 : v + v / 97 + 1) {
        int i = tb_hist_index(v);
        CHECK(i >= prev && i < TB_HIST_BUCKETS);
        CHECK(tb_hist_bucket_low(i) <= v && v < tb_hist_bucket_high(i));
        CHECK((double)(tb_hist_bucket_high(i) - tb_hist_bucket_low(i)) <= 1 + tb_hist_bucket_low(i) / 127.0);
        prev = i;
    }
    for (int i = 1; i < TB_HIST_BUCKETS; i++) CHECK(tb_hist_bucket_low(i) == tb_hist_bucket_high(i - 1));

    enum { N = 200000 };
    uint64_t *v = malloc(N * sizeof *v);
    /* uniform 1 us .. 1 s in ns */
    for (int i = 0; i < N; i++) v[i] = 1000 + next() % 1000000000ull;
    check_dist("uniform", v, N);
    /* log-normal-ish latencies: 5 ms median, long tail */
    for (int i = 0; i < N; i++) {
        double u = ((next() >> 11) + 0.5) / 9007199254740992.0, w = ((next() >> 11) + 0.5) / 9007199254740992.0;
        double z = sqrt(-2 * log(u)) * cos(2 * M_PI * w);
        v[i] = (uint64_t)(5e6 * exp(0.8 * z));
    }
    check_dist("lognormal", v, N);
    /* small exact values and a bimodal one with a 1 s stall */
    for (int i = 0; i < 1000; i++) v[i] = (uint64_t)(i % 200);
    check_dist("small", v, 1000);
    for (int i = 0; i < 1000; i++) v[i] = i % 50 == 0 ? 1000000000ull + (uint64_t)i : 20000000ull + (uint64_t)i * 1000;
    check_dist("stall", v, 1000);
    free(v);

    /* merge equals adding everything to one histogram */
    tb_hist a, b, c;
    CHECK(tb_hist_init(&a) == TB_OK && tb_hist_init(&b) == TB_OK && tb_hist_init(&c) == TB_OK);
    for (int i = 0; i < 1000; i++) {
        uint64_t x = next() % 100000000ull;
        tb_hist_add(i % 2 ? &a : &b, x);
        tb_hist_add(&c, x);
    }
    tb_hist_merge(&a, &b);
    CHECK(a.count == c.count && a.min == c.min && a.max == c.max);
    CHECK(tb_hist_quantile(&a, 0.99) == tb_hist_quantile(&c, 0.99));
    tb_hist_free(&a);
    tb_hist_free(&b);
    tb_hist_free(&c);

    /* Prometheus text: sums label sets, ignores comments and other names */
    tb_server_metrics sm;
    tb_bench_parse_prometheus("# HELP x\nvllm:num_requests_running{model_name=\"a\"} 3\n"
                              "vllm:num_requests_running{model_name=\"b\"} 2\n"
                              "vllm:num_requests_waiting 7\nvllm:gpu_cache_usage_perc 0.25\n"
                              "vllm:num_requests_running_total 99\nvllm:prefix_cache_hits_total 30\n"
                              "vllm:prefix_cache_queries_total 120\n", &sm);
    CHECK(sm.running == 5 && sm.waiting == 7 && sm.kv == 0.25 && sm.prefix_hits == 30 && sm.prefix_queries == 120);
    tb_bench_parse_prometheus("other 1\n", &sm);
    CHECK(isnan(sm.running) && isnan(sm.waiting) && isnan(sm.kv) && isnan(sm.prefix_hits));
    /* Turbine's own names, as its /metrics writes them */
    tb_bench_parse_prometheus("turbine_requests_running{model=\"m\"} 2\nturbine_requests_waiting{model=\"m\"} 1\n"
                              "turbine_kv_cache_usage_ratio{model=\"m\"} 0.5\n"
                              "turbine_prefix_cache_hits_total{model=\"m\"} 64\n"
                              "turbine_prefix_cache_queries_total{model=\"m\"} 80\n", &sm);
    CHECK(sm.running == 2 && sm.waiting == 1 && sm.kv == 0.5 && sm.prefix_hits == 64 && sm.prefix_queries == 80);

    char *m = tb_bench_first_model("{\"object\":\"list\",\"data\":[{\"id\":\"m1\"},{\"id\":\"m2\"}]}");
    CHECK(m && !strcmp(m, "m1"));
    free(m);

    printf("test_bench_hist: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
