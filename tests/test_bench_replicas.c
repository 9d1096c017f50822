/* test_bench_replicas.c — the pieces of `turbine bench --sessions` and
 * `--replica-metrics` that need no server: the request and prompt-token
 * counters read from Prometheus text (summed over label sets, Turbine's and
 * vLLM's names), and the bodies of a conversation's turns (system prompt
 * shared, earlier user messages and replies resent in order, the new user
 * message last, ids distinct per conversation and per point). */
#include <jansson.h>

#include "bench/bench.h"
#include "tb_test.h"

static json_t *turn_body(const tb_sessions *s, int conv, int turn, const char *const *replies) {
    size_t lens[8];
    for (int i = 0; i < turn; i++) lens[i] = strlen(replies[i]);
    char *b = NULL;
    size_t n = 0;
    CHECK(tb_sessions_body(s, conv, turn, replies, lens, &b, &n) == TB_OK);
    CHECK(b && strlen(b) == n);
    json_error_t err;
    json_t *j = b ? json_loads(b, 0, &err) : NULL;
    free(b);
    CHECK(j != NULL);
    return j;
}

static const char *msg(json_t *j, int i, const char *field) {
    return json_string_value(json_object_get(json_array_get(json_object_get(j, "messages"), (size_t)i), field));
}

int main(void) {
    /* counters: Turbine's endpoint label sets add up */
    tb_server_metrics m;
    tb_bench_parse_prometheus("# TYPE turbine_http_requests_total counter\n"
                              "turbine_http_requests_total{endpoint=\"completions\"} 5\n"
                              "turbine_http_requests_total{endpoint=\"chat\"} 12\n"
                              "turbine_prompt_tokens_total{model=\"m\"} 3547\n"
                              "turbine_prefix_cache_hits_total{model=\"m\"} 2032\n"
                              "turbine_prefix_cache_queries_total{model=\"m\"} 3547\n"
                              "turbine_http_requests_totalx 99\n", &m);
    CHECK(m.requests == 17 && m.prompt_tokens == 3547 && m.prefix_hits == 2032 && m.prefix_queries == 3547);
    tb_bench_parse_prometheus("vllm:request_success_total{finished_reason=\"stop\"} 3\n"
                              "vllm:request_success_total{finished_reason=\"length\"} 4\n"
                              "vllm:prompt_tokens_total 100\nvllm:prompt_tokens_created 7\n", &m);
    CHECK(m.requests == 7 && m.prompt_tokens == 100 && isnan(m.prefix_hits));
    tb_bench_parse_prometheus("turbine_requests_running 1\n", &m);
    CHECK(isnan(m.requests) && isnan(m.prompt_tokens));

    /* sessions */
    tb_workload_options o;
    memset(&o, 0, sizeof o);
    o.model = "m";
    o.stream = 1;
    o.ignore_eos = 1;
    o.input_len = 6;
    o.output_len = 5;
    o.seed = 3;
    tb_sessions *s = NULL, *s2 = NULL;
    CHECK(tb_sessions_create(&o, 3, 3, 10, 0, &s) == TB_OK);
    CHECK(tb_sessions_create(&o, 3, 3, 10, 1, &s2) == TB_OK);
    if (!s || !s2) return 1;
    CHECK(s->n == 3 && s->turns == 3 && s->system && !strcmp(s->system, s2->system));
    int words = 1;
    for (const char *p = s->system; *p; p++) words += *p == ' ';
    CHECK(words == 10);
    for (int c = 0; c < 3; c++) {
        for (int d = 0; d < 3; d++) {
            CHECK(c == d || strcmp(s->id[c], s->id[d]) != 0);
            CHECK(strcmp(s->id[c], s2->id[d]) != 0);
        }
        for (int t = 0; t < 3; t++) CHECK(strcmp(s->user[c * 3 + t], s2->user[c * 3 + t]) != 0);
    }
    const char *replies[2] = {"first reply", "second \"reply\"\nwith a line"};
    json_t *t0 = turn_body(s, 1, 0, replies), *t2 = turn_body(s, 1, 2, replies);
    CHECK(json_array_size(json_object_get(t0, "messages")) == 2);
    CHECK(!strcmp(msg(t0, 0, "role"), "system") && !strcmp(msg(t0, 0, "content"), s->system));
    CHECK(!strcmp(msg(t0, 1, "role"), "user") && !strcmp(msg(t0, 1, "content"), s->user[3]));
    CHECK(json_array_size(json_object_get(t2, "messages")) == 6);
    CHECK(!strcmp(msg(t2, 1, "content"), s->user[3]));
    CHECK(!strcmp(msg(t2, 2, "role"), "assistant") && !strcmp(msg(t2, 2, "content"), replies[0]));
    CHECK(!strcmp(msg(t2, 3, "content"), s->user[4]));
    CHECK(!strcmp(msg(t2, 4, "role"), "assistant") && !strcmp(msg(t2, 4, "content"), replies[1]));
    CHECK(!strcmp(msg(t2, 5, "role"), "user") && !strcmp(msg(t2, 5, "content"), s->user[5]));
    CHECK(json_integer_value(json_object_get(t2, "max_tokens")) == 5);
    CHECK(json_is_true(json_object_get(t2, "stream")) && json_is_true(json_object_get(t2, "ignore_eos")));
    CHECK(!strcmp(json_string_value(json_object_get(t2, "model")), "m"));
    json_decref(t0);
    json_decref(t2);
    /* no system prompt: the conversation starts with the user */
    tb_sessions *s0 = NULL;
    CHECK(tb_sessions_create(&o, 1, 1, 0, 0, &s0) == TB_OK);
    if (s0) {
        json_t *j = turn_body(s0, 0, 0, replies);
        CHECK(json_array_size(json_object_get(j, "messages")) == 1 && !strcmp(msg(j, 0, "role"), "user"));
        json_decref(j);
    }
    /* bad arguments */
    char *b = NULL;
    size_t n = 0;
    CHECK(tb_sessions_body(s, 3, 0, replies, NULL, &b, &n) != TB_OK && !b);
    CHECK(tb_sessions_body(s, 0, 3, replies, NULL, &b, &n) != TB_OK && !b);
    tb_sessions *bad = NULL;
    CHECK(tb_sessions_create(&o, 0, 3, 10, 0, &bad) != TB_OK && !bad);
    CHECK(tb_sessions_create(&o, 3, 0, 10, 0, &bad) != TB_OK && !bad);
    CHECK(tb_sessions_create(&o, 3, 3, -1, 0, &bad) != TB_OK && !bad);
    tb_sessions_free(s);
    tb_sessions_free(s2);
    tb_sessions_free(s0);
    tb_sessions_free(NULL);

    printf("test_bench_replicas: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
