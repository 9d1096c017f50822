/* test_bench_kserve.c — what `turbine bench --endpoint kserve` builds and
 * reads: --input parsing, a spec from model metadata (--shape, dynamic dims,
 * --batch-size), JSON and binary request bodies (shapes, sizes, seeded
 * values, file data carried verbatim), the response check, and the
 * Prometheus histograms of /metrics (per model, summed over versions,
 * deltas, mean and bucket quantiles). */
#include <jansson.h>
#include <math.h>
#include <unistd.h>

#include "bench/bench.h"
#include "tb_test.h"

static const char k_meta[] =
    "{\"name\":\"resnet\",\"versions\":[\"1\"],\"platform\":\"turbine\","
    "\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":[-1,3,4,-1]},"
    "{\"name\":\"ids\",\"datatype\":\"INT64\",\"shape\":[-1,5]}],"
    "\"outputs\":[{\"name\":\"logits\",\"datatype\":\"FP32\",\"shape\":[-1,10]}]}";

static void test_inputs(void) {
    tb_ks_tensor t;
    CHECK(tb_ks_parse_input("input:fp32:1x3x224x224", &t) == TB_OK);
    CHECK(!strcmp(t.name, "input") && !strcmp(t.datatype, "FP32") && t.elem_size == 4);
    CHECK(t.n_dims == 4 && t.dims[0] == 1 && t.dims[1] == 3 && t.dims[3] == 224);
    CHECK(tb_ks_elems(&t) == 3 * 224 * 224);
    CHECK(tb_ks_parse_input("x:INT8:", &t) == TB_OK && t.n_dims == 0 && tb_ks_elems(&t) == 1);
    CHECK(tb_ks_parse_input("x:FP16:2,8", &t) == TB_OK && t.n_dims == 2 && t.elem_size == 2);
    CHECK(tb_ks_parse_input("x:FP32", &t) != TB_OK);
    CHECK(tb_ks_parse_input("x:BYTES:1", &t) != TB_OK);
    CHECK(tb_ks_parse_input("x:FP32:1x-1", &t) != TB_OK);
    CHECK(tb_ks_parse_input("x:FP32:1xx2", &t) != TB_OK);
    CHECK(tb_ks_parse_input(":FP32:1", &t) != TB_OK);
    CHECK(tb_ks_parse_input("x:FP32:1x2x3x4x5x6x7x8x9", &t) != TB_OK);

    tb_ks_spec s;
    CHECK(tb_ks_spec_from_metadata(k_meta, &s) == TB_OK);
    CHECK(s.n_inputs == 2 && s.n_outputs == 1 && !strcmp(s.outputs[0], "logits"));
    CHECK(s.inputs[0].dims[0] == -1 && s.inputs[0].dims[3] == -1 && tb_ks_elems(&s.inputs[0]) < 0);
    CHECK(tb_ks_apply_shape(&s, "input:2x3x4x7") == TB_OK);
    CHECK(s.inputs[0].dims[0] == 2 && s.inputs[0].dims[3] == 7);
    CHECK(tb_ks_apply_shape(&s, "input:2x9x4x7") != TB_OK); /* a fixed dim differs */
    CHECK(tb_ks_apply_shape(&s, "input:2x3x4") != TB_OK);   /* rank */
    CHECK(tb_ks_apply_shape(&s, "nope:1") != TB_OK);
    tb_ks_fix_dynamic(&s);
    CHECK(s.inputs[1].dims[0] == 1 && s.inputs[1].dims[1] == 5);
    CHECK(tb_ks_apply_batch(&s, 4) == TB_OK);
    CHECK(s.inputs[0].dims[0] == 8 && s.inputs[1].dims[0] == 4 && s.inputs[0].dims[1] == 3);
    CHECK(tb_ks_spec_from_metadata("{\"inputs\":[]}", &s) != TB_OK);
    CHECK(tb_ks_spec_from_metadata("not json", &s) != TB_OK);
}

static tb_ks_spec small_spec(int binary) {
    tb_ks_spec s;
    memset(&s, 0, sizeof s);
    CHECK(tb_ks_parse_input("a:FP32:2x3", &s.inputs[0]) == TB_OK);
    CHECK(tb_ks_parse_input("b:INT32:4", &s.inputs[1]) == TB_OK);
    CHECK(tb_ks_parse_input("c:FP16:2", &s.inputs[2]) == TB_OK);
    s.n_inputs = 3;
    strcpy(s.outputs[0], "y");
    s.n_outputs = 1;
    s.binary = binary;
    return s;
}

static void test_json_body(void) {
    tb_ks_spec s = small_spec(0);
    uint64_t seed = 5, seed2 = 5, seed3 = 6;
    char *b1, *b2, *b3;
    size_t n1, n2, n3, h1, h2, h3;
    CHECK(tb_ks_build_body(&s, NULL, &seed, &b1, &n1, &h1) == TB_OK);
    CHECK(tb_ks_build_body(&s, NULL, &seed2, &b2, &n2, &h2) == TB_OK);
    CHECK(tb_ks_build_body(&s, NULL, &seed3, &b3, &n3, &h3) == TB_OK);
    CHECK(n1 == h1 && n1 == strlen(b1));
    CHECK(n1 == n2 && !memcmp(b1, b2, n1)); /* seeded */
    CHECK(n1 != n3 || memcmp(b1, b3, n1));  /* another seed, other values */
    json_error_t err;
    json_t *j = json_loads(b1, 0, &err);
    CHECK(json_is_object(j));
    json_t *ins = json_object_get(j, "inputs");
    CHECK(json_array_size(ins) == 3);
    json_t *a = json_array_get(ins, 0), *b = json_array_get(ins, 1);
    CHECK(!strcmp(json_string_value(json_object_get(a, "name")), "a"));
    CHECK(!strcmp(json_string_value(json_object_get(a, "datatype")), "FP32"));
    CHECK(json_integer_value(json_array_get(json_object_get(a, "shape"), 0)) == 2);
    CHECK(json_integer_value(json_array_get(json_object_get(a, "shape"), 1)) == 3);
    json_t *ad = json_object_get(a, "data"), *bd = json_object_get(b, "data");
    CHECK(json_array_size(ad) == 6 && json_array_size(bd) == 4);
    for (size_t i = 0; i < json_array_size(ad); i++) {
        /* FP32 values: exact multiples of 1/1024 once read as a float */
        float v = (float)json_number_value(json_array_get(ad, i));
        CHECK(v >= -1 && v < 1 && v * 1024 == floorf(v * 1024));
    }
    for (size_t i = 0; i < json_array_size(bd); i++) {
        json_t *v = json_array_get(bd, i);
        CHECK(json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < 100);
    }
    json_t *outs = json_object_get(j, "outputs");
    CHECK(json_array_size(outs) == 1);
    CHECK(json_is_false(json_object_get(json_object_get(json_array_get(outs, 0), "parameters"), "binary_data")));
    json_decref(j);
    free(b1);
    free(b2);
    free(b3);
}

static void test_binary_body(void) {
    tb_ks_spec s = small_spec(1);
    float a[6] = {0.1f, 2, 3, 4, 5, 6.5f};
    int32_t bb[4] = {-1, 7, 8, 100000};
    uint16_t c[2] = {0x3c00, 0xc000};
    const void *data[3] = {a, bb, c};
    char *body;
    size_t n, hl;
    CHECK(tb_ks_build_body(&s, data, NULL, &body, &n, &hl) == TB_OK);
    CHECK(n == hl + sizeof a + sizeof bb + sizeof c);
    CHECK(!memcmp(body + hl, a, sizeof a));
    CHECK(!memcmp(body + hl + sizeof a, bb, sizeof bb));
    CHECK(!memcmp(body + hl + sizeof a + sizeof bb, c, sizeof c));
    json_error_t err;
    json_t *j = json_loadb(body, hl, 0, &err);
    CHECK(json_is_object(j));
    json_t *a0 = json_array_get(json_object_get(j, "inputs"), 0);
    CHECK(json_object_get(a0, "data") == NULL);
    CHECK(json_integer_value(json_object_get(json_object_get(a0, "parameters"), "binary_data_size")) == 24);
    CHECK(json_is_true(json_object_get(json_object_get(j, "parameters"), "binary_data_output")));
    json_t *o0 = json_array_get(json_object_get(j, "outputs"), 0);
    CHECK(json_is_true(json_object_get(json_object_get(o0, "parameters"), "binary_data")));
    json_decref(j);
    free(body);

    /* the same data as JSON: the values, not the bytes */
    s.binary = 0;
    CHECK(tb_ks_build_body(&s, data, NULL, &body, &n, &hl) == TB_OK);
    j = json_loads(body, 0, &err);
    json_t *ins = json_object_get(j, "inputs");
    CHECK(json_real_value(json_array_get(json_object_get(json_array_get(ins, 0), "data"), 5)) == 6.5);
    /* a float with no short decimal form reads back as the same float */
    CHECK((float)json_real_value(json_array_get(json_object_get(json_array_get(ins, 0), "data"), 0)) == 0.1f);
    CHECK(json_is_real(json_array_get(json_object_get(json_array_get(ins, 0), "data"), 1))); /* "2.0", not 2 */
    CHECK(json_integer_value(json_array_get(json_object_get(json_array_get(ins, 1), "data"), 0)) == -1);
    CHECK(json_integer_value(json_array_get(json_object_get(json_array_get(ins, 1), "data"), 3)) == 100000);
    CHECK(json_real_value(json_array_get(json_object_get(json_array_get(ins, 2), "data"), 1)) == -2.0);
    json_decref(j);
    free(body);
    /* NaN has no JSON form: refused, not sent as garbage */
    float nanv[6] = {0, NAN, 0, 0, 0, 0};
    const void *nd[3] = {nanv, bb, c};
    CHECK(tb_ks_build_body(&s, nd, NULL, &body, &n, &hl) != TB_OK);

    /* --input-data: a file of one batch item repeated along dim 0 */
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/kserve_in_%d", tb_test_tmp(), (int)getpid());
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    CHECK(system(path) == 0);
    snprintf(path, sizeof path, "%s/a.bin", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(a, 4, 3, f) == 3);
    if (f) fclose(f);
    void *d = NULL;
    CHECK(tb_ks_read_input(dir, &s.inputs[0], 2, &d) == TB_OK);
    CHECK(d && !memcmp(d, a, 12) && !memcmp((char *)d + 12, a, 12));
    free(d);
    CHECK(tb_ks_read_input(dir, &s.inputs[0], 1, &d) != TB_OK); /* 12 bytes for 24 */
    CHECK(tb_ks_read_input(dir, &s.inputs[1], 1, &d) != TB_OK); /* no b.bin */
    remove(path);
    rmdir(dir);
}

/* perf_analyzer's input-data JSON: steps, flat arrays or {"content": ...} */
static void test_json_data(void) {
    tb_ks_spec s = small_spec(0);
    char path[600];
    snprintf(path, sizeof path, "%s/kserve_data_%d.json", tb_test_tmp(), (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"data\": [{\"a\": [1, 2, 3, 4, 5, 6.5], \"b\": {\"content\": [-1, 2, 3, 4], \"shape\": [4]},"
          " \"c\": [0.5, 1]}, {\"a\": [0, 0, 0, 0, 0, 0], \"b\": [9, 9, 9, 9], \"c\": [true, 0]}]}", f);
    fclose(f);
    void **bufs = NULL;
    int ns = 0;
    CHECK(tb_ks_read_json_data(path, &s, 1, 16, &bufs, &ns) == TB_OK && ns == 2);
    if (ns == 2) {
        const float *a = bufs[0];
        const int32_t *b = bufs[1];
        const uint16_t *c = bufs[2];
        CHECK(a[0] == 1 && a[5] == 6.5f && b[0] == -1 && b[3] == 4 && c[0] == 0x3800 && c[1] == 0x3c00);
        CHECK(((const int32_t *)bufs[4])[2] == 9 && ((const uint16_t *)bufs[5])[0] == 0x3c00);
    }
    for (int i = 0; i < ns * 3; i++) free(bufs[i]);
    free(bufs);
    CHECK(tb_ks_read_json_data(path, &s, 1, 1, &bufs, &ns) == TB_OK && ns == 1); /* max_steps */
    for (int i = 0; i < ns * 3; i++) free(bufs[i]);
    free(bufs);
    /* batch 2 (a becomes 4x3): each array above is one batch item's share,
     * repeated along dim 0 */
    tb_ks_spec s2 = small_spec(0);
    CHECK(tb_ks_apply_batch(&s2, 2) == TB_OK);
    CHECK(tb_ks_read_json_data(path, &s2, 2, 16, &bufs, &ns) == TB_OK && ns == 2); /* every input one item's share */
    if (ns == 2) {
        const float *a = bufs[0];
        CHECK(a[6] == 1 && a[11] == 6.5f); /* repeated along dim 0 */
    }
    for (int i = 0; i < ns * 3; i++) free(bufs[i]);
    free(bufs);
    f = fopen(path, "w");
    if (f) { fputs("{\"data\": [{\"a\": [1, 2], \"b\": [1, 2, 3, 4], \"c\": [1, 2]}]}", f); fclose(f); }
    CHECK(tb_ks_read_json_data(path, &s, 1, 16, &bufs, &ns) != TB_OK); /* a: 2 values for 6 */
    f = fopen(path, "w");
    if (f) { fputs("{\"data\": [{\"a\": [1, 2, 3, 4, 5, \"x\"], \"b\": [1, 2, 3, 4], \"c\": [1, 2]}]}", f); fclose(f); }
    CHECK(tb_ks_read_json_data(path, &s, 1, 16, &bufs, &ns) != TB_OK); /* not a number */
    CHECK(tb_ks_read_json_data("/nonexistent/x.json", &s, 1, 16, &bufs, &ns) != TB_OK);
    remove(path);
}

static void test_response(void) {
    tb_ks_spec s = small_spec(0);
    char m[256];
    const char *good = "{\"model_name\":\"m\",\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,2]}]}";
    CHECK(tb_ks_check_response(&s, good, strlen(good), m, sizeof m));
    const char *missing = "{\"outputs\":[{\"name\":\"z\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}";
    CHECK(!tb_ks_check_response(&s, missing, strlen(missing), m, sizeof m) && strstr(m, "missing"));
    const char *count = "{\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,2]}]}";
    CHECK(!tb_ks_check_response(&s, count, strlen(count), m, sizeof m));
    CHECK(!tb_ks_check_response(&s, "{\"error\":\"x\"}", 13, m, sizeof m));
    CHECK(!tb_ks_check_response(&s, "garbage", 7, m, sizeof m));
    /* binary: header then 8 bytes */
    char bin[256];
    const char *hdr = "{\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[2],\"parameters\":{\"binary_data_size\":8}}]}";
    size_t hl = strlen(hdr);
    memcpy(bin, hdr, hl);
    memset(bin + hl, 0x7b, 8); /* '{' bytes must not confuse the header's end */
    CHECK(tb_ks_check_response(&s, bin, hl + 8, m, sizeof m));
    CHECK(!tb_ks_check_response(&s, bin, hl + 7, m, sizeof m));
    CHECK(!tb_ks_check_response(&s, bin, hl + 9, m, sizeof m));
    const char *hdr2 = "{\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[3],\"parameters\":{\"binary_data_size\":8}}]}";
    hl = strlen(hdr2);
    memcpy(bin, hdr2, hl);
    CHECK(!tb_ks_check_response(&s, bin, hl + 8, m, sizeof m)); /* 3 FP32 are 12 bytes */
}

static void test_metrics(void) {
    const char *before =
        "# HELP turbine_inference_batch_size number of requests per engine call\n"
        "# TYPE turbine_inference_batch_size histogram\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"1\"} 2\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"2\"} 2\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"4\"} 3\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"+Inf\"} 3\n"
        "turbine_inference_batch_size_sum{model=\"m\",version=\"1\"} 6\n"
        "turbine_inference_batch_size_count{model=\"m\",version=\"1\"} 3\n"
        "turbine_inference_batch_size_bucket{model=\"other\",version=\"1\",le=\"1\"} 50\n"
        "turbine_inference_batch_size_count{model=\"other\",version=\"1\"} 50\n"
        "turbine_inference_request_success_total{model=\"m\",version=\"1\"} 10\n"
        "turbine_requests_running 4\n"
        "garbage line {{{\n"
        "turbine_inference_batch_size_bucket{model=\"m\",le=\"1\" 5\n";
    const char *after =
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"1\"} 4\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"2\"} 4\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"4\"} 13\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"1\",le=\"+Inf\"} 13\n"
        "turbine_inference_batch_size_sum{model=\"m\",version=\"1\"} 44\n"
        "turbine_inference_batch_size_count{model=\"m\",version=\"1\"} 13\n"
        /* a second version of the same model adds to the same figures */
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"2\",le=\"1\"} 1\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"2\",le=\"2\"} 1\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"2\",le=\"4\"} 1\n"
        "turbine_inference_batch_size_bucket{model=\"m\",version=\"2\",le=\"+Inf\"} 1\n"
        "turbine_inference_batch_size_sum{model=\"m\",version=\"2\"} 1\n"
        "turbine_inference_batch_size_count{model=\"m\",version=\"2\"} 1\n"
        "turbine_inference_queue_duration_us_bucket{model=\"m\",version=\"1\",le=\"100\"} 10\n"
        "turbine_inference_queue_duration_us_bucket{model=\"m\",version=\"1\",le=\"1000\"} 90\n"
        "turbine_inference_queue_duration_us_bucket{model=\"m\",version=\"1\",le=\"+Inf\"} 100\n"
        "turbine_inference_queue_duration_us_sum{model=\"m\",version=\"1\"} 50000\n"
        "turbine_inference_queue_duration_us_count{model=\"m\",version=\"1\"} 100\n"
        "turbine_inference_request_success_total{model=\"m\",version=\"1\"} 110\n"
        "turbine_inference_request_failure_total{model=\"m\",version=\"1\",reason=\"rejected\"} 3\n"
        "turbine_inference_request_failure_total{model=\"m\",version=\"1\",reason=\"timeout\"} 2\n"
        "turbine_inference_count_total{model=\"m\",version=\"1\"} 40\n"
        "turbine_inference_exec_count_total{model=\"m\",version=\"1\"} 11\n";
    tb_ks_metrics b, a, d;
    tb_ks_metrics_parse(before, "m", &b);
    CHECK(b.seen && b.batch.n == 4 && b.batch.count == 3 && b.batch.sum == 6 && b.success == 10);
    CHECK(b.batch.cum[0] == 2 && isinf(b.batch.le[3])); /* "other" and the broken line left out */
    tb_ks_metrics_parse(after, "m", &a);
    CHECK(a.batch.count == 14 && a.batch.cum[0] == 5 && a.batch.cum[2] == 14 && a.failure == 5);
    tb_ks_metrics_delta(&a, &b, &d);
    CHECK(d.valid && d.batch.count == 11 && d.batch.sum == 39 && d.success == 100);
    CHECK(fabs(tb_prom_mean(&d.batch) - 39.0 / 11) < 1e-12);
    CHECK(d.batch.cum[0] == 3 && d.batch.cum[1] == 3 && d.batch.cum[2] == 11);
    CHECK(d.inferences == 40 && d.executions == 11);
    /* queue: 10 under 100 us, 80 in (100, 1000], 10 above */
    CHECK(tb_prom_mean(&d.queue_us) == 500);
    CHECK(fabs(tb_prom_quantile(&d.queue_us, 0.5) - (100 + 900 * 40.0 / 80)) < 1e-9);
    CHECK(tb_prom_quantile(&d.queue_us, 0.99) == 1000); /* in +Inf: its lower bound */
    CHECK(fabs(tb_prom_quantile(&d.queue_us, 0.05) - 50) < 1e-9);
    /* a counter that went backwards (a restart) makes the delta invalid */
    tb_ks_metrics_delta(&b, &a, &d);
    CHECK(!d.valid);
    /* nothing of ours */
    tb_ks_metrics_parse("# nothing\nfoo 1\n", "m", &a);
    CHECK(!a.seen && isnan(tb_prom_mean(&a.batch)) && isnan(tb_prom_quantile(&a.batch, 0.5)));
    tb_ks_metrics_parse(after, "nope", &a);
    CHECK(!a.seen);
    tb_ks_metrics_parse(after, NULL, &a); /* every model */
    CHECK(a.seen && a.batch.count == 14);
}

int main(void) {
    test_inputs();
    test_json_body();
    test_binary_body();
    test_json_data();
    test_response();
    test_metrics();
    printf("test_bench_kserve: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
