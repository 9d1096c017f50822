/*
 * test_kserve.c — the KServe v2 wire format (src/serve/kserve.c) without a
 * server: routes, infer requests parsed into tensors (JSON flat and nested,
 * the binary extension, both mixed) with the values checked, every refusal
 * with its status, responses encoded and read back (JSON values equal to
 * the floats bit for bit, binary outputs byte for byte), metadata and the
 * error body.
 */
#include <jansson.h>
#include <math.h>

#include "core/core.h" /* tb_f32_to_f16, tb_f32_to_bf16 */
#include "serve/kserve.h"
#include "tb_test.h"

/* a model of two inputs: x FP32 [1..8, 3] and ids INT64 [1..8] ; outputs
 * y FP32 [-1, 2] and mask BOOL [-1] */
static tb_io_info g_in[2], g_out[2];

static void setup(void) {
    memset(g_in, 0, sizeof g_in);
    memset(g_out, 0, sizeof g_out);
    snprintf(g_in[0].name, sizeof g_in[0].name, "x");
    g_in[0].dtype = TB_F32;
    g_in[0].rank = 2;
    g_in[0].min[0] = 1, g_in[0].opt[0] = 4, g_in[0].max[0] = 8;
    g_in[0].min[1] = g_in[0].opt[1] = g_in[0].max[1] = 3;
    snprintf(g_in[1].name, sizeof g_in[1].name, "ids");
    g_in[1].dtype = TB_I64;
    g_in[1].rank = 1;
    g_in[1].min[0] = 1, g_in[1].opt[0] = 4, g_in[1].max[0] = 8;
    snprintf(g_out[0].name, sizeof g_out[0].name, "y");
    g_out[0].dtype = TB_F32;
    g_out[0].rank = 2;
    g_out[0].min[0] = g_out[0].max[0] = -1;
    g_out[0].min[1] = g_out[0].max[1] = 2;
    snprintf(g_out[1].name, sizeof g_out[1].name, "mask");
    g_out[1].dtype = TB_BOOL;
    g_out[1].rank = 1;
    g_out[1].min[0] = g_out[1].max[0] = -1;
}

static int parse(const char *body, tb_ks_request *r, tb_ks_error *e) {
    return tb_ks_parse_infer(body, strlen(body), -1, g_in, 2, g_out, 2, 0, r, e);
}

static void test_routes(void) {
    char n[TB_KS_MAX_NAME], v[TB_KS_MAX_NAME];
    CHECK(tb_ks_parse_route("/v1/models", n, v) == TB_KS_ROUTE_NONE);
    CHECK(tb_ks_parse_route("/v2x", n, v) == TB_KS_ROUTE_NONE);
    CHECK(tb_ks_parse_route("/v2", n, v) == TB_KS_ROUTE_SERVER);
    CHECK(tb_ks_parse_route("/v2/", n, v) == TB_KS_ROUTE_SERVER);
    CHECK(tb_ks_parse_route("/v2/health/live", n, v) == TB_KS_ROUTE_LIVE);
    CHECK(tb_ks_parse_route("/v2/health/ready", n, v) == TB_KS_ROUTE_READY);
    CHECK(tb_ks_parse_route("/v2/health/other", n, v) == TB_KS_ROUTE_UNKNOWN);
    CHECK(tb_ks_parse_route("/v2/models/mlp", n, v) == TB_KS_ROUTE_MODEL && !strcmp(n, "mlp") && !v[0]);
    CHECK(tb_ks_parse_route("/v2/models/mlp/ready", n, v) == TB_KS_ROUTE_MODEL_READY && !strcmp(n, "mlp"));
    CHECK(tb_ks_parse_route("/v2/models/mlp/infer", n, v) == TB_KS_ROUTE_INFER);
    CHECK(tb_ks_parse_route("/v2/models/mlp/stats", n, v) == TB_KS_ROUTE_STATS);
    CHECK(tb_ks_parse_route("/v2/models/mlp/versions/3", n, v) == TB_KS_ROUTE_MODEL && !strcmp(v, "3"));
    CHECK(tb_ks_parse_route("/v2/models/mlp/versions/3/infer", n, v) == TB_KS_ROUTE_INFER && !strcmp(n, "mlp") &&
          !strcmp(v, "3"));
    CHECK(tb_ks_parse_route("/v2/models/mlp/versions/3/ready", n, v) == TB_KS_ROUTE_MODEL_READY);
    /* a model called "versions" is still a model */
    CHECK(tb_ks_parse_route("/v2/models/versions/ready", n, v) == TB_KS_ROUTE_MODEL_READY && !strcmp(n, "versions"));
    CHECK(tb_ks_parse_route("/v2/models/mlp/versions", n, v) == TB_KS_ROUTE_UNKNOWN);
    CHECK(tb_ks_parse_route("/v2/models/mlp/versions//infer", n, v) == TB_KS_ROUTE_UNKNOWN);
    CHECK(tb_ks_parse_route("/v2/models/mlp/run", n, v) == TB_KS_ROUTE_UNKNOWN);
    CHECK(tb_ks_parse_route("/v2/models/mlp/infer/x", n, v) == TB_KS_ROUTE_UNKNOWN);
    CHECK(tb_ks_parse_route("/v2/models/mlp/versions/1/infer/x/y", n, v) == TB_KS_ROUTE_UNKNOWN);
    CHECK(tb_ks_parse_route("/v2/models/", n, v) == TB_KS_ROUTE_UNKNOWN);
    CHECK(tb_ks_parse_route("/v2/models", n, v) == TB_KS_ROUTE_UNKNOWN);
    char longp[400];
    snprintf(longp, sizeof longp, "/v2/models/%0200d/ready", 7);
    CHECK(tb_ks_parse_route(longp, n, v) == TB_KS_ROUTE_UNKNOWN);
}

static void test_dtypes(void) {
    static const char *names[] = {"BOOL", "UINT8", "INT8", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tb_dtype t;
        CHECK(tb_ks_dtype_parse(names[i], &t));
        CHECK(!strcmp(tb_ks_dtype_name(t), names[i]));
        CHECK(tb_ks_dtype_size(t) > 0);
    }
    tb_dtype t;
    CHECK(tb_ks_dtype_parse("BYTES", &t) && t == TB_KS_BYTES && tb_ks_dtype_size(t) == 0);
    CHECK(!strcmp(tb_ks_dtype_name(TB_KS_BYTES), "BYTES"));
    CHECK(!tb_ks_dtype_parse("fp32", &t));
    CHECK(tb_ks_dtype_name(TB_I4) == NULL);
    CHECK(tb_ks_dtype_size(TB_F16) == 2 && tb_ks_dtype_size(TB_I64) == 8 && tb_ks_dtype_size(TB_BOOL) == 1);
}

static void test_parse_json(void) {
    tb_ks_request r;
    tb_ks_error e;
    /* nested x, flat ids, inputs in another order than the model's */
    int st = parse("{\"id\":\"req-1\",\"inputs\":[{\"name\":\"ids\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[-5,"
                   "9007199254740993]},{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[[1,2.5,-3],[0.1,"
                   "1e-3,7]]}],\"outputs\":[{\"name\":\"mask\"},{\"name\":\"y\",\"parameters\":{\"binary_data\":true}}]}",
                   &r, &e);
    CHECK_MSG(st == 200, "%d %s", st, e.msg);
    if (st == 200) {
        CHECK(!strcmp(r.id, "req-1"));
        CHECK(r.n_inputs == 2);
        CHECK(r.inputs[0].dtype == TB_F32 && r.inputs[0].rank == 2 && r.inputs[0].dims[0] == 2 && r.inputs[0].dims[1] == 3);
        const float *x = r.inputs[0].data;
        CHECK(x[0] == 1.f && x[1] == 2.5f && x[2] == -3.f && x[3] == 0.1f && x[4] == 1e-3f && x[5] == 7.f);
        const int64_t *ids = r.inputs[1].data;
        CHECK(r.inputs[1].dims[0] == 2 && ids[0] == -5 && ids[1] == 9007199254740993LL);
        CHECK(((uintptr_t)r.inputs[0].data & 63) == 0 && ((uintptr_t)r.inputs[1].data & 63) == 0);
        CHECK(r.n_outputs == 2 && r.outputs[0] == 1 && r.outputs[1] == 0 && r.binary[0] == 0 && r.binary[1] == 1);
        tb_ks_request_free(&r);
        tb_ks_request_free(&r); /* twice is fine */
    }
    /* binary_data_output: every output binary unless an output says otherwise */
    st = parse("{\"parameters\":{\"binary_data_output\":true},\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":"
               "\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}],"
               "\"outputs\":[{\"name\":\"y\",\"parameters\":{\"binary_data\":false}},{\"name\":\"mask\"}]}",
               &r, &e);
    CHECK_MSG(st == 200, "%s", e.msg);
    if (st == 200) {
        CHECK(r.binary_all == 1 && r.binary[0] == 0 && r.binary[1] == 1 && r.id[0] == 0);
        tb_ks_request_free(&r);
    }
}

/* A binary request: JSON header then x's 24 bytes, ids as JSON. */
static void test_parse_binary(void) {
    const char *hdr = "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"parameters\":{"
                      "\"binary_data_size\":24}},{\"name\":\"ids\",\"shape\":[3],\"datatype\":\"INT64\",\"parameters\":"
                      "{\"binary_data_size\":24}}]}";
    float x[6] = {1.5f, -2, NAN, 1e30f, -0.0f, 3};
    int64_t ids[3] = {INT64_MIN, 0, INT64_MAX};
    size_t hl = strlen(hdr);
    char body[1024];
    memcpy(body, hdr, hl);
    memcpy(body + hl, x, sizeof x);
    memcpy(body + hl + sizeof x, ids, sizeof ids);
    size_t n = hl + sizeof x + sizeof ids;
    tb_ks_request r;
    tb_ks_error e;
    int st = tb_ks_parse_infer(body, n, (long long)hl, g_in, 2, g_out, 2, 0, &r, &e);
    CHECK_MSG(st == 200, "%s", e.msg);
    if (st == 200) {
        CHECK(!memcmp(r.inputs[0].data, x, sizeof x)); /* NaN and -0 kept bit for bit */
        CHECK(!memcmp(r.inputs[1].data, ids, sizeof ids));
        tb_ks_request_free(&r);
    }
    /* refusals of the binary extension */
    CHECK(tb_ks_parse_infer(body, n, -1, g_in, 2, g_out, 2, 0, &r, &e) == 400 && strstr(e.msg, "after its JSON"));
    CHECK(tb_ks_parse_infer(body, hl, -1, g_in, 2, g_out, 2, 0, &r, &e) == 400 && strstr(e.msg, "Inference-Header"));
    CHECK(tb_ks_parse_infer(body, n - 1, (long long)hl, g_in, 2, g_out, 2, 0, &r, &e) == 400 && strstr(e.msg, "ends"));
    body[n] = 0;
    CHECK(tb_ks_parse_infer(body, n + 1, (long long)hl, g_in, 2, g_out, 2, 0, &r, &e) == 400 &&
          strstr(e.msg, "after the JSON header"));
    CHECK(tb_ks_parse_infer(body, n, (long long)n + 1, g_in, 2, g_out, 2, 0, &r, &e) == 400);
    CHECK(tb_ks_parse_infer(body, n, (long long)hl - 1, g_in, 2, g_out, 2, 0, &r, &e) == 400); /* JSON cut */
    /* a size that does not match the shape */
    const char *bad = "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"parameters\":{"
                      "\"binary_data_size\":20}},{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}]}";
    char b2[512];
    memcpy(b2, bad, strlen(bad));
    memset(b2 + strlen(bad), 0, 20);
    CHECK(tb_ks_parse_infer(b2, strlen(bad) + 20, (long long)strlen(bad), g_in, 2, g_out, 2, 0, &r, &e) == 400 &&
          strstr(e.msg, "binary_data_size is 20"));
}

/* Every refusal of a request, with its status and a word of its message. */
static void test_errors(void) {
    static const struct {
        const char *body, *word;
    } cases[] = {
        {"{", "not valid JSON"},
        {"[1]", "JSON object"},
        {"{}", "'inputs'"},
        {"{\"inputs\":{}}", "'inputs'"},
        {"{\"id\":5,\"inputs\":[]}", "'id'"},
        {"{\"parameters\":[],\"inputs\":[]}", "'parameters'"},
        {"{\"parameters\":{\"binary_data_output\":1},\"inputs\":[]}", "binary_data_output"},
        {"{\"inputs\":[]}", "missing"},
        {"{\"inputs\":[5]}", "object"},
        {"{\"inputs\":[{\"shape\":[1]}]}", "'name'"},
        {"{\"inputs\":[{\"name\":\"z\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", "unknown input 'z'"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]},{\"name\":\"ids\",\"shape\":"
         "[1],\"datatype\":\"INT64\",\"data\":[1]}]}", "twice"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}]}", "'x' is missing"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"data\":[1]}]}", "'datatype'"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"FP8\",\"data\":[1]}]}", "unsupported datatype"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1]}]}", "takes INT64"},
        {"{\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT64\",\"data\":[1]}]}", "'shape'"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1,1],\"datatype\":\"INT64\",\"data\":[1]}]}", "rank 2"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[-1],\"datatype\":\"INT64\",\"data\":[1]}]}", "non-negative"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1.5],\"datatype\":\"INT64\",\"data\":[1]}]}", "non-negative"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[9],\"datatype\":\"INT64\",\"data\":[1]}]}", "takes [1..8]"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[0],\"datatype\":\"INT64\",\"data\":[]}]}", "takes [1..8]"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}]}", "takes [1..8,3]"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\"}]}", "no 'data'"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":5}]}", "must be an array"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"parameters\":5,\"data\":[1]}]}",
         "parameters"},
        {"{\"inputs\":[{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"parameters\":{\"binary_data_size\":-1}}]}",
         "non-negative"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[1,2,3]}]}", "has 3 values"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[[[1,2]]]}]}", "deeper"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[1.5,2]}]}", "integers"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[\"1\",2]}]}", "integers"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,true,3]},{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}]}", "numbers"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}]}", "has 3 values"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\","
         "\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}],\"outputs\":[{\"name\":\"q\"}]}", "unknown output 'q'"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\","
         "\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}],\"outputs\":[{\"name\":\"y\"},{\"name\":\"y\"}]}",
         "twice"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\","
         "\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}],\"outputs\":{}}", "'outputs'"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},{\"name\":\"ids\","
         "\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}],\"outputs\":[{\"name\":\"y\",\"parameters\":{"
         "\"binary_data\":\"yes\"}}]}", "binary_data"},
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3],\"parameters\":{"
         "\"binary_data_size\":12}},{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}]}",
         "Inference-Header-Content-Length"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tb_ks_request r;
        tb_ks_error e;
        memset(&r, 0x5a, sizeof r);
        int st = parse(cases[i].body, &r, &e);
        CHECK_MSG(st == 400 && e.status == 400, "case %zu: status %d (%s)", i, st, e.msg);
        CHECK_MSG(strstr(e.msg, cases[i].word) != NULL, "case %zu: '%s' not in '%s'", i, cases[i].word, e.msg);
        CHECK(r.buf == NULL); /* nothing held on failure */
    }
    /* an id longer than the bound */
    char body[1024];
    char id[400];
    memset(id, 'a', sizeof id - 1);
    id[sizeof id - 1] = 0;
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"inputs\":[]}", id);
    tb_ks_request r;
    tb_ks_error e;
    CHECK(parse(body, &r, &e) == 400 && strstr(e.msg, "'id'"));
    /* values out of range for small integer types, BOOL as anything else */
    tb_io_info small[1];
    memset(small, 0, sizeof small);
    snprintf(small[0].name, sizeof small[0].name, "b");
    small[0].rank = 1;
    small[0].min[0] = 1, small[0].max[0] = 4;
    static const struct {
        tb_dtype t;
        const char *body;
        int status;
    } vals[] = {
        {TB_I8, "{\"inputs\":[{\"name\":\"b\",\"shape\":[2],\"datatype\":\"INT8\",\"data\":[-128,127]}]}", 200},
        {TB_I8, "{\"inputs\":[{\"name\":\"b\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[128]}]}", 400},
        {TB_U8, "{\"inputs\":[{\"name\":\"b\",\"shape\":[1],\"datatype\":\"UINT8\",\"data\":[-1]}]}", 400},
        {TB_U8, "{\"inputs\":[{\"name\":\"b\",\"shape\":[1],\"datatype\":\"UINT8\",\"data\":[255]}]}", 200},
        {TB_I32, "{\"inputs\":[{\"name\":\"b\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[2147483648]}]}", 400},
        {TB_BOOL, "{\"inputs\":[{\"name\":\"b\",\"shape\":[2],\"datatype\":\"BOOL\",\"data\":[true,false]}]}", 200},
        {TB_BOOL, "{\"inputs\":[{\"name\":\"b\",\"shape\":[1],\"datatype\":\"BOOL\",\"data\":[1]}]}", 400},
        {TB_F16, "{\"inputs\":[{\"name\":\"b\",\"shape\":[2],\"datatype\":\"FP16\",\"data\":[1.5,-2]}]}", 200},
        {TB_BF16, "{\"inputs\":[{\"name\":\"b\",\"shape\":[1],\"datatype\":\"BF16\",\"data\":[1]}]}", 200},
        {TB_F64, "{\"inputs\":[{\"name\":\"b\",\"shape\":[1],\"datatype\":\"FP64\",\"data\":[0.1]}]}", 200},
    };
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        small[0].dtype = vals[i].t;
        int st = tb_ks_parse_infer(vals[i].body, strlen(vals[i].body), -1, small, 1, NULL, 0, 0, &r, &e);
        CHECK_MSG(st == vals[i].status, "value case %zu: %d (%s)", i, st, e.msg);
        if (st == 200) {
            if (vals[i].t == TB_F16) CHECK(((uint16_t *)r.inputs[0].data)[0] == 0x3e00 && ((uint16_t *)r.inputs[0].data)[1] == 0xc000);
            if (vals[i].t == TB_BF16) CHECK(((uint16_t *)r.inputs[0].data)[0] == 0x3f80);
            if (vals[i].t == TB_F64) CHECK(((double *)r.inputs[0].data)[0] == 0.1);
            if (vals[i].t == TB_I8) CHECK(((int8_t *)r.inputs[0].data)[0] == -128 && ((int8_t *)r.inputs[0].data)[1] == 127);
            tb_ks_request_free(&r);
        }
    }
    /* BOOL bytes other than 0 and 1 in binary */
    small[0].dtype = TB_BOOL;
    const char *bh = "{\"inputs\":[{\"name\":\"b\",\"shape\":[2],\"datatype\":\"BOOL\",\"parameters\":{\"binary_data_size\":2}}]}";
    char bb[256];
    size_t bl = strlen(bh);
    memcpy(bb, bh, bl);
    bb[bl] = 1, bb[bl + 1] = 2;
    CHECK(tb_ks_parse_infer(bb, bl + 2, (long long)bl, small, 1, NULL, 0, 0, &r, &e) == 400 && strstr(e.msg, "0 or 1"));
    bb[bl + 1] = 0;
    CHECK(tb_ks_parse_infer(bb, bl + 2, (long long)bl, small, 1, NULL, 0, 0, &r, &e) == 200);
    tb_ks_request_free(&r);
    /* element counts: a profile without a practical bound, a shape whose
     * product overflows int64, and the caller's max_elems */
    small[0].dtype = TB_F32;
    small[0].rank = 3;
    for (int d = 0; d < 3; d++) small[0].min[d] = 0, small[0].max[d] = INT64_MAX;
    const char *big = "{\"inputs\":[{\"name\":\"b\",\"shape\":[4294967296,4294967296,4],\"datatype\":\"FP32\","
                      "\"data\":[]}]}";
    CHECK(tb_ks_parse_infer(big, strlen(big), -1, small, 1, NULL, 0, 0, &r, &e) == 400 && strstr(e.msg, "too many"));
    const char *wide = "{\"inputs\":[{\"name\":\"b\",\"shape\":[1,1,4611686018427387904],\"datatype\":\"FP32\","
                       "\"parameters\":{\"binary_data_size\":0}}]}";
    CHECK(tb_ks_parse_infer(wide, strlen(wide), (long long)strlen(wide), small, 1, NULL, 0, 0, &r, &e) == 400 &&
          strstr(e.msg, "too many"));
    /* a shape the profile allows but the body does not back: refused before
     * any memory is reserved for it (400 GB here) */
    const char *huge = "{\"inputs\":[{\"name\":\"b\",\"shape\":[1000000,1000,100],\"datatype\":\"FP32\","
                       "\"data\":[1]}]}";
    CHECK(tb_ks_parse_infer(huge, strlen(huge), -1, small, 1, NULL, 0, 0, &r, &e) == 400 && strstr(e.msg, "has 1 values"));
    const char *ten = "{\"inputs\":[{\"name\":\"b\",\"shape\":[1,2,5],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5,6,7,8,"
                      "9,10]}]}";
    CHECK(tb_ks_parse_infer(ten, strlen(ten), -1, small, 1, NULL, 0, 9, &r, &e) == 400);
    CHECK(tb_ks_parse_infer(ten, strlen(ten), -1, small, 1, NULL, 0, 10, &r, &e) == 200);
    tb_ks_request_free(&r);
    /* an empty tensor where the profile allows it */
    const char *empty = "{\"inputs\":[{\"name\":\"b\",\"shape\":[0,2,5],\"datatype\":\"FP32\",\"data\":[]}]}";
    CHECK(tb_ks_parse_infer(empty, strlen(empty), -1, small, 1, NULL, 0, 0, &r, &e) == 200);
    tb_ks_request_free(&r);
    /* NULL body */
    CHECK(tb_ks_parse_infer(NULL, 0, -1, small, 1, NULL, 0, 0, &r, &e) == 400);
}

/* Encodes outputs and reads them back. */
static void test_encode(void) {
    float y[3 * 2] = {0.1f, -1e-30f, 3.4028235e38f, 1.17549435e-38f, 123456.789f, -0.0f};
    uint8_t mask[3] = {1, 0, 1};
    tb_tensor outs[2] = {{.dtype = TB_F32, .rank = 2, .dims = {3, 2}, .data = y},
                         {.dtype = TB_BOOL, .rank = 1, .dims = {3}, .data = mask}};
    tb_ks_request r;
    memset(&r, 0, sizeof r);
    snprintf(r.id, sizeof r.id, "a\"b");
    char *body;
    size_t n, hl;
    tb_ks_error e;
    /* all outputs as JSON */
    CHECK(tb_ks_encode_response("mlp", "1", &r, g_out, outs, 2, &body, &n, &hl, &e) == 200);
    CHECK(hl == 0 && n == strlen(body));
    json_error_t je;
    json_t *j = json_loadb(body, n, 0, &je);
    CHECK_MSG(j != NULL, "%s", body);
    if (j) {
        CHECK(!strcmp(json_string_value(json_object_get(j, "model_name")), "mlp"));
        CHECK(!strcmp(json_string_value(json_object_get(j, "model_version")), "1"));
        CHECK(!strcmp(json_string_value(json_object_get(j, "id")), "a\"b"));
        json_t *o = json_object_get(j, "outputs");
        CHECK(json_array_size(o) == 2);
        json_t *o0 = json_array_get(o, 0), *o1 = json_array_get(o, 1);
        CHECK(!strcmp(json_string_value(json_object_get(o0, "name")), "y"));
        CHECK(!strcmp(json_string_value(json_object_get(o0, "datatype")), "FP32"));
        CHECK(json_integer_value(json_array_get(json_object_get(o0, "shape"), 0)) == 3);
        json_t *d = json_object_get(o0, "data");
        CHECK(json_array_size(d) == 6);
        for (int i = 0; i < 6; i++) {
            float v = (float)json_number_value(json_array_get(d, (size_t)i));
            CHECK_MSG(!memcmp(&v, &y[i], 4), "y[%d] %.9g read back as %.9g", i, y[i], v);
        }
        json_t *d1 = json_object_get(o1, "data");
        CHECK(!strcmp(json_string_value(json_object_get(o1, "datatype")), "BOOL"));
        CHECK(json_is_true(json_array_get(d1, 0)) && json_is_false(json_array_get(d1, 1)) && json_is_true(json_array_get(d1, 2)));
        json_decref(j);
    }
    free(body);
    /* mask as JSON, y binary, in that order */
    r.n_outputs = 2;
    r.outputs[0] = 1, r.binary[0] = 0;
    r.outputs[1] = 0, r.binary[1] = 1;
    r.id[0] = 0;
    CHECK(tb_ks_encode_response("mlp", "1", &r, g_out, outs, 2, &body, &n, &hl, &e) == 200);
    CHECK(hl > 0 && n == hl + sizeof y);
    j = json_loadb(body, hl, 0, &je);
    CHECK(j != NULL);
    if (j) {
        CHECK(json_object_get(j, "id") == NULL);
        json_t *o = json_object_get(j, "outputs");
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(o, 0), "name")), "mask"));
        json_t *o1 = json_array_get(o, 1);
        CHECK(!strcmp(json_string_value(json_object_get(o1, "name")), "y"));
        CHECK(json_object_get(o1, "data") == NULL);
        CHECK(json_integer_value(json_object_get(json_object_get(o1, "parameters"), "binary_data_size")) == (json_int_t)sizeof y);
        json_decref(j);
    }
    CHECK(!memcmp(body + hl, y, sizeof y));
    free(body);
    /* a non-finite value cannot be JSON; binary carries it */
    y[2] = INFINITY;
    r.binary[1] = 0;
    CHECK(tb_ks_encode_response("mlp", "1", &r, g_out, outs, 2, &body, &n, &hl, &e) == 500 && strstr(e.msg, "binary_data"));
    CHECK(body == NULL);
    r.binary[1] = 1;
    CHECK(tb_ks_encode_response("mlp", "1", &r, g_out, outs, 2, &body, &n, &hl, &e) == 200);
    CHECK(!memcmp(body + hl, y, sizeof y));
    free(body);
    /* other dtypes as JSON */
    int64_t i64[2] = {INT64_MIN, INT64_MAX};
    uint16_t h[2] = {0x3e00, 0xc000}; /* 1.5, -2 */
    tb_tensor o2[2] = {{.dtype = TB_I64, .rank = 1, .dims = {2}, .data = i64},
                       {.dtype = TB_F16, .rank = 1, .dims = {2}, .data = h}};
    memset(&r, 0, sizeof r);
    CHECK(tb_ks_encode_response("m", "1", &r, g_out, o2, 2, &body, &n, &hl, &e) == 200);
    CHECK(strstr(body, "[-9223372036854775808,9223372036854775807]") != NULL);
    CHECK(strstr(body, "[1.5,-2]") != NULL);
    free(body);
    /* a dtype the protocol has no name for */
    tb_tensor o3 = {.dtype = TB_I4, .rank = 1, .dims = {2}, .data = h};
    CHECK(tb_ks_encode_response("m", "1", &r, g_out, &o3, 1, &body, &n, &hl, &e) == 500);
}

static void test_metadata(void) {
    char *m = tb_ks_model_metadata("mlp", "1", g_in, 2, g_out, 2);
    CHECK(m != NULL);
    json_error_t je;
    json_t *j = m ? json_loads(m, 0, &je) : NULL;
    CHECK(j != NULL);
    if (j) {
        CHECK(!strcmp(json_string_value(json_object_get(j, "name")), "mlp"));
        CHECK(!strcmp(json_string_value(json_object_get(j, "platform")), "turbine"));
        CHECK(!strcmp(json_string_value(json_array_get(json_object_get(j, "versions"), 0)), "1"));
        json_t *x = json_array_get(json_object_get(j, "inputs"), 0);
        CHECK(!strcmp(json_string_value(json_object_get(x, "name")), "x"));
        CHECK(!strcmp(json_string_value(json_object_get(x, "datatype")), "FP32"));
        json_t *sh = json_object_get(x, "shape");
        CHECK(json_array_size(sh) == 2 && json_integer_value(json_array_get(sh, 0)) == -1 &&
              json_integer_value(json_array_get(sh, 1)) == 3);
        json_t *y = json_array_get(json_object_get(j, "outputs"), 0);
        sh = json_object_get(y, "shape");
        CHECK(json_integer_value(json_array_get(sh, 0)) == -1 && json_integer_value(json_array_get(sh, 1)) == 2);
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "outputs"), 1), "datatype")),
                      "BOOL"));
        json_decref(j);
    }
    free(m);
    char *err = tb_ks_error_json("bad \"x\"\n\\");
    j = err ? json_loads(err, 0, &je) : NULL;
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "error")), "bad \"x\"\n\\"));
    json_decref(j);
    free(err);
    /* bytes that are not UTF-8 become U+FFFD; valid multi-byte text stays */
    err = tb_ks_error_json("unknown model '\xff\xc3\xa9\xe2\x82'");
    j = err ? json_loads(err, 0, &je) : NULL;
    CHECK_MSG(j && !strcmp(json_string_value(json_object_get(j, "error")), "unknown model '\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd'"),
              "%s", err ? err : "(null)");
    json_decref(j);
    free(err);
}

/* BYTES: a model of text [1..4] BYTES and an optional n INT32 [1], output
 * out BYTES [-1]. JSON strings and the binary form (4-byte length + bytes
 * per element) parse to the same serialized tensor; the encoder writes it
 * back as JSON strings (NUL and quotes escaped) and as the same bytes. */
static void test_bytes(void) {
    tb_io_info in[2], out[1];
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    snprintf(in[0].name, sizeof in[0].name, "text");
    in[0].dtype = TB_KS_BYTES;
    in[0].rank = 1;
    in[0].min[0] = 1, in[0].opt[0] = in[0].max[0] = 4;
    snprintf(in[1].name, sizeof in[1].name, "n");
    in[1].dtype = TB_I32;
    in[1].rank = 1;
    in[1].min[0] = in[1].opt[0] = in[1].max[0] = 1;
    snprintf(out[0].name, sizeof out[0].name, "out");
    out[0].dtype = TB_KS_BYTES;
    out[0].rank = 1;
    out[0].min[0] = out[0].max[0] = -1;
    /* the serialized form of "héllo", "", "a\"b\0c" */
    static const char want[] = "\x06\0\0\0h\xc3\xa9llo" "\0\0\0\0" "\x05\0\0\0a\"b\0c";
    const size_t want_n = sizeof want - 1;
    const char *js = "{\"inputs\":[{\"name\":\"text\",\"shape\":[3],\"datatype\":\"BYTES\",\"data\":[\"h\u00e9llo\",\"\","
                     "\"a\\\"b\\u0000c\"]}],\"parameters\":{\"temperature\":0.5}}";
    tb_ks_request r;
    tb_ks_error e;
    int st = tb_ks_parse_infer_opt(js, strlen(js), -1, in, 2, 2, out, 1, 0, &r, &e);
    CHECK_MSG(st == 200, "%d %s", st, e.msg);
    if (st == 200) {
        CHECK(r.given[0] == 1 && r.given[1] == 0 && r.inputs[1].data == NULL);
        CHECK_MSG(r.in_size[0] == want_n && !memcmp(r.inputs[0].data, want, want_n), "size %zu", r.in_size[0]);
        const char *p;
        size_t len;
        CHECK(tb_ks_bytes_get(r.inputs[0].data, r.in_size[0], 2, &p, &len) && len == 5 && !memcmp(p, "a\"b\0c", 5));
        CHECK(!tb_ks_bytes_get(r.inputs[0].data, r.in_size[0], 3, &p, &len));
        CHECK_MSG(r.params && !strcmp(r.params, "{\"temperature\":0.5}"), "%s", r.params ? r.params : "(null)");
        /* encoded back: JSON strings, then binary bytes */
        tb_tensor o = r.inputs[0];
        char *body;
        size_t n, hl;
        CHECK(tb_ks_encode_response("m", "1", &r, out, &o, 1, &body, &n, &hl, &e) == 200);
        json_error_t je;
        json_t *j = json_loadb(body, n, JSON_ALLOW_NUL, &je);
        json_t *d = j ? json_object_get(json_array_get(json_object_get(j, "outputs"), 0), "data") : NULL;
        CHECK_MSG(json_array_size(d) == 3, "%s", body);
        if (json_array_size(d) == 3) {
            CHECK(!strcmp(json_string_value(json_array_get(d, 0)), "h\xc3\xa9llo"));
            CHECK(json_string_length(json_array_get(d, 1)) == 0);
            CHECK(json_string_length(json_array_get(d, 2)) == 5 && !memcmp(json_string_value(json_array_get(d, 2)), "a\"b\0c", 5));
            CHECK(!strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "outputs"), 0), "datatype")), "BYTES"));
        }
        json_decref(j);
        free(body);
        r.binary_all = 1;
        CHECK(tb_ks_encode_response("m", "1", &r, out, &o, 1, &body, &n, &hl, &e) == 200);
        CHECK(hl > 0 && n == hl + want_n && !memcmp(body + hl, want, want_n));
        char bds[64];
        snprintf(bds, sizeof bds, "\"binary_data_size\":%zu}", want_n);
        CHECK(strstr(body, bds) != NULL);
        free(body);
        tb_ks_request_free(&r);
    }
    /* the same tensor as binary data, with n given as JSON */
    char hdr[256], body[512];
    snprintf(hdr, sizeof hdr, "{\"inputs\":[{\"name\":\"n\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[7]},{\"name\":"
             "\"text\",\"shape\":[3],\"datatype\":\"BYTES\",\"parameters\":{\"binary_data_size\":%zu}}]}", want_n);
    size_t hl = strlen(hdr);
    memcpy(body, hdr, hl);
    memcpy(body + hl, want, want_n);
    st = tb_ks_parse_infer_opt(body, hl + want_n, (long long)hl, in, 2, 2, out, 1, 0, &r, &e);
    CHECK_MSG(st == 200, "%s", e.msg);
    if (st == 200) {
        CHECK(r.given[1] && *(const int32_t *)r.inputs[1].data == 7 && r.params == NULL);
        CHECK(r.in_size[0] == want_n && !memcmp(r.inputs[0].data, want, want_n));
        tb_ks_request_free(&r);
    }
    /* a length that runs past the data, and one that leaves bytes over */
    char bad[512];
    memcpy(bad, body, hl + want_n);
    bad[hl + 14] = 9; /* the third element's length: 9 bytes where 5 are left */
    CHECK(tb_ks_parse_infer_opt(bad, hl + want_n, (long long)hl, in, 2, 2, out, 1, 0, &r, &e) == 400 &&
          strstr(e.msg, "BYTES elements"));
    memcpy(bad, body, hl + want_n);
    bad[hl + 14] = 1; /* leaves 4 of the last element's bytes over */
    CHECK(tb_ks_parse_infer_opt(bad, hl + want_n, (long long)hl, in, 2, 2, out, 1, 0, &r, &e) == 400 &&
          strstr(e.msg, "BYTES elements"));
    bad[hl + 14] = 5;
    CHECK(tb_ks_parse_infer_opt(bad, hl + want_n, (long long)hl, in, 2, 2, out, 1, 0, &r, &e) == 200);
    tb_ks_request_free(&r);
    /* JSON refusals: a number as BYTES, a missing required input, an element count off the shape */
    const char *b1 = "{\"inputs\":[{\"name\":\"text\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[3]}]}";
    CHECK(tb_ks_parse_infer_opt(b1, strlen(b1), -1, in, 2, 2, out, 1, 0, &r, &e) == 400 && strstr(e.msg, "strings"));
    const char *b2 = "{\"inputs\":[{\"name\":\"n\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[3]}]}";
    CHECK(tb_ks_parse_infer_opt(b2, strlen(b2), -1, in, 2, 2, out, 1, 0, &r, &e) == 400 && strstr(e.msg, "missing"));
    const char *b3 = "{\"inputs\":[{\"name\":\"text\",\"shape\":[2],\"datatype\":\"BYTES\",\"data\":[\"x\"]}]}";
    CHECK(tb_ks_parse_infer_opt(b3, strlen(b3), -1, in, 2, 2, out, 1, 0, &r, &e) == 400 && strstr(e.msg, "values"));
    /* BYTES sent to a numeric input */
    const char *b4 = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"BYTES\",\"data\":[\"a\",\"b\",\"c\"]},"
                     "{\"name\":\"ids\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[1]}]}";
    CHECK(parse(b4, &r, &e) == 400 && strstr(e.msg, "the model takes FP32"));
}

/* A one-input model of type t, shape [1..max]. */
static tb_io_info one_input(tb_dtype t, int64_t max) {
    tb_io_info io;
    memset(&io, 0, sizeof io);
    snprintf(io.name, sizeof io.name, "v");
    io.dtype = t;
    io.rank = 1;
    io.min[0] = 1, io.opt[0] = io.max[0] = max;
    return io;
}

/* The data arrays read without jansson (kserve_data.c) give the values
 * jansson gives: each token of `vals` parsed in a request and compared bit
 * for bit with json_number_value of the same token converted as put_value
 * converts it; an escaped "data" key (read by jansson) gives the same
 * tensor; malformed arrays are refused. */
static void test_fast_data(void) {
    static const char *vals[] = {"0", "-0", "-0.0", "1", "-1", "0.1", "1.5", "3.4028235e38", "3.4028236e38",
                                 "1e-45", "1.4e-45", "7e-46", "1.17549435e-38", "123456.789", "0.30000000000000004",
                                 "2.2250738585072014e-308", "9007199254740993", "-9223372036854775808",
                                 "9223372036854775807", "1E22", "1e23", "1.23456789012345678901234567890e29",
                                 "0.000001234567890123456789", "6.02214076e23", "-1.0000000000000002", "65504",
                                 "65520", "1e-7", "4.9e-324", "1.7976931348623157e308"};
    const int nv = (int)(sizeof vals / sizeof vals[0]);
    static const tb_dtype types[] = {TB_F32, TB_F64, TB_F16, TB_BF16};
    char body[4096], arr[2048];
    size_t k = 0;
    k += (size_t)snprintf(arr + k, sizeof arr - k, "[");
    for (int i = 0; i < nv; i++) k += (size_t)snprintf(arr + k, sizeof arr - k, "%s%s", i ? ", " : "", vals[i]);
    snprintf(arr + k, sizeof arr - k, "]");
    json_error_t je;
    json_t *ref = json_loads(arr, 0, &je);
    CHECK_MSG(ref && (int)json_array_size(ref) == nv, "%s", je.text);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0] && ref; ti++) {
        tb_dtype t = types[ti];
        tb_io_info io = one_input(t, 64);
        snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"v\",\"shape\":[%d],\"datatype\":\"%s\",\"data\":%s}]}", nv,
                 tb_ks_dtype_name(t), arr);
        tb_ks_request r;
        tb_ks_error e;
        int st = tb_ks_parse_infer(body, strlen(body), -1, &io, 1, g_out, 2, 0, &r, &e);
        CHECK_MSG(st == 200, "%s: %s", tb_ks_dtype_name(t), e.msg);
        if (st != 200) continue;
        for (int i = 0; i < nv; i++) {
            double x = json_number_value(json_array_get(ref, (size_t)i));
            int same;
            switch (t) {
            case TB_F32: { float f = (float)x; same = !memcmp(&f, (float *)r.inputs[0].data + i, 4); break; }
            case TB_F64: same = !memcmp(&x, (double *)r.inputs[0].data + i, 8); break;
            case TB_F16: same = tb_f32_to_f16((float)x) == ((uint16_t *)r.inputs[0].data)[i]; break;
            default: same = tb_f32_to_bf16((float)x) == ((uint16_t *)r.inputs[0].data)[i]; break;
            }
            CHECK_MSG(same, "%s value %s differs from jansson's", tb_ks_dtype_name(t), vals[i]);
        }
        tb_ks_request_free(&r);
    }
    json_decref(ref);
    /* integers: exact, range-checked */
    tb_io_info i64 = one_input(TB_I64, 8), i8 = one_input(TB_I8, 8), b1 = one_input(TB_BOOL, 8);
    tb_ks_request r;
    tb_ks_error e;
    const char *bi = "{\"inputs\":[{\"name\":\"v\",\"shape\":[4],\"datatype\":\"INT64\",\"data\":[-9223372036854775808,"
                     "9223372036854775807, 0 ,\n-0 ]}]}";
    CHECK(tb_ks_parse_infer(bi, strlen(bi), -1, &i64, 1, g_out, 2, 0, &r, &e) == 200);
    if (r.buf) {
        const int64_t *v = r.inputs[0].data;
        CHECK(v[0] == INT64_MIN && v[1] == INT64_MAX && v[2] == 0 && v[3] == 0);
        tb_ks_request_free(&r);
    }
    const char *bb = "{\"inputs\":[{\"name\":\"v\",\"shape\":[3],\"datatype\":\"BOOL\",\"data\":[true,false,true]}]}";
    CHECK(tb_ks_parse_infer(bb, strlen(bb), -1, &b1, 1, g_out, 2, 0, &r, &e) == 200);
    if (r.buf) {
        const uint8_t *v = r.inputs[0].data;
        CHECK(v[0] == 1 && v[1] == 0 && v[2] == 1);
        tb_ks_request_free(&r);
    }
    const struct {
        const tb_io_info *io;
        const char *data;
        int n; /* the shape sent */
        const char *word;
    } bad[] = {
        {&i8, "[128]", 1, "out of range"},   {&i8, "[-129]", 1, "out of range"},
        {&i8, "[1.0]", 1, "integers"},       {&i8, "[true]", 1, "integers"},
        {&i64, "[9223372036854775808]", 1, "out of range"},
        {&b1, "[1]", 1, "true or false"},    {&b1, "[null]", 1, "true or false"},
        {&i8, "[1,,2]", 2, "not valid JSON"}, {&i8, "[1 2]", 2, "not valid JSON"},
        {&i8, "[01]", 1, "not valid JSON"},  {&i8, "[1,]", 1, "not valid JSON"},
        {&i8, "[+1]", 1, "not valid JSON"},  {&i8, "[1.]", 1, "not valid JSON"},
        {&i8, "[tru]", 1, "not valid JSON"}, {&i8, "[[1],[[2]]]", 2, "deeper"},
        {&i8, "[{\"a\":1}]", 1, "integers"}, {&i8, "[1,2,3]", 2, "has 3 values"},
        {&i8, "[\"1\"]", 1, "integers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"v\",\"shape\":[%d],\"datatype\":\"%s\",\"data\":%s}]}",
                 bad[i].n, tb_ks_dtype_name(bad[i].io->dtype), bad[i].data);
        int st = tb_ks_parse_infer(body, strlen(body), -1, bad[i].io, 1, g_out, 2, 0, &r, &e);
        CHECK_MSG(st == 400 && strstr(e.msg, bad[i].word), "bad[%zu] %s: %d %s", i, bad[i].data, st, e.msg);
    }
    /* FP32 overflow, as jansson refuses a real it cannot hold */
    tb_io_info f32 = one_input(TB_F32, 8);
    const char *bo = "{\"inputs\":[{\"name\":\"v\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1e400]}]}";
    CHECK(tb_ks_parse_infer(bo, strlen(bo), -1, &f32, 1, g_out, 2, 0, &r, &e) == 400);
    /* an escaped key and a repeated one: jansson reads everything, same result */
    const char *ba = "{\"inputs\":[{\"name\":\"v\",\"shape\":[2],\"datatype\":\"FP32\",\"d\\u0061ta\":[0.1,-2.5]}]}";
    const char *bf = "{\"inputs\":[{\"name\":\"v\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":[0.1,-2.5]}]}";
    const char *bd = "{\"inputs\":[{\"name\":\"v\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":[7,7],\"data\":[0.1,-2.5]}]}";
    float want[2] = {0.1f, -2.5f};
    const char *three[3] = {ba, bf, bd};
    for (int i = 0; i < 3; i++) {
        int st = tb_ks_parse_infer(three[i], strlen(three[i]), -1, &f32, 1, g_out, 2, 0, &r, &e);
        CHECK_MSG(st == 200 && !memcmp(r.inputs[0].data, want, 8), "variant %d: %d %s", i, st, e.msg);
        if (st == 200) tb_ks_request_free(&r);
    }
}

/* Many doubles printed with 15 to 19 significant digits (every path of
 * the decimal conversion: exact, extended precision, strtod) read as FP64
 * equal jansson's values bit for bit. */
static void test_fast_doubles(void) {
    const int n = 20000;
    char *body = malloc((size_t)n * 40 + 256), *arr = malloc((size_t)n * 40 + 8);
    double *want = malloc((size_t)n * sizeof *want);
    CHECK(body && arr && want);
    if (!body || !arr || !want) { free(body); free(arr); free(want); return; }
    uint64_t seed = 7;
    size_t k = 0;
    arr[k++] = '[';
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double mant = (double)(seed >> 11) / 9007199254740992.0;            /* [0, 1) */
        int ex = (int)((seed >> 3) % 80) - 40;                             /* 1e-40 .. 1e39 */
        double x = (mant + 0.1) * pow(10.0, ex) * ((seed & 1) ? -1 : 1);
        int digits = 15 + (int)((seed >> 7) % 5);
        k += (size_t)sprintf(arr + k, "%s%.*g", i ? "," : "", digits, x);
    }
    arr[k++] = ']';
    arr[k] = 0;
    json_error_t je;
    json_t *ref = json_loadb(arr, k, 0, &je);
    CHECK_MSG(ref != NULL, "%s", je.text);
    for (int i = 0; ref && i < n; i++) want[i] = json_number_value(json_array_get(ref, (size_t)i));
    json_decref(ref);
    tb_io_info io;
    memset(&io, 0, sizeof io);
    snprintf(io.name, sizeof io.name, "v");
    io.dtype = TB_F64;
    io.rank = 1;
    io.min[0] = io.opt[0] = io.max[0] = n;
    size_t bl = (size_t)sprintf(body, "{\"inputs\":[{\"name\":\"v\",\"shape\":[%d],\"datatype\":\"FP64\",\"data\":", n);
    memcpy(body + bl, arr, k);
    bl += k;
    bl += (size_t)sprintf(body + bl, "}]}");
    tb_ks_request r;
    tb_ks_error e;
    int st = tb_ks_parse_infer(body, bl, -1, &io, 1, g_out, 2, 0, &r, &e);
    CHECK_MSG(st == 200, "%s", e.msg);
    if (st == 200) {
        int diff = 0;
        for (int i = 0; i < n; i++) diff += memcmp(&want[i], (double *)r.inputs[0].data + i, 8) != 0;
        CHECK_MSG(diff == 0, "%d of %d doubles differ from jansson's", diff, n);
        tb_ks_request_free(&r);
    }
    free(body);
    free(arr);
    free(want);
}

/* An image-sized FP32 input as JSON (each float printed with 17 digits, as
 * Python prints a numpy float32 converted to float, and with 9 digits) and
 * as binary data: the parsed tensors are identical, bit for bit. */
static void test_json_equals_binary(void) {
    const int64_t n = 3 * 224 * 224;
    tb_io_info io;
    memset(&io, 0, sizeof io);
    snprintf(io.name, sizeof io.name, "x");
    io.dtype = TB_F32;
    io.rank = 4;
    int64_t dims[4] = {1, 3, 224, 224};
    for (int d = 0; d < 4; d++) io.min[d] = io.opt[d] = io.max[d] = dims[d];
    float *v = malloc((size_t)n * 4);
    char *body = malloc((size_t)n * 32 + 512);
    CHECK(v && body);
    if (!v || !body) { free(v); free(body); return; }
    uint64_t seed = 42;
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int32_t bits = (int32_t)(seed >> 33);
        v[i] = (float)bits / 1073741824.0f * ((i % 7) ? 1.0f : 1e-30f) * ((i % 11) ? 1.0f : 1e30f);
    }
    v[0] = -0.0f;
    v[1] = 3.4028235e38f;
    v[2] = 1.4e-45f;
    for (int fmt = 0; fmt < 2; fmt++) {
        size_t k = (size_t)sprintf(body, "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3,224,224],\"datatype\":\"FP32\","
                                         "\"data\":[");
        for (int64_t i = 0; i < n; i++) {
            if (v[i] == 0 && signbit(v[i])) k += (size_t)sprintf(body + k, "%s-0.0", i ? "," : "");
            else k += (size_t)sprintf(body + k, fmt ? "%s%.9g" : "%s%.17g", i ? "," : "", (double)v[i]);
        }
        k += (size_t)sprintf(body + k, "]}]}");
        tb_ks_request r;
        tb_ks_error e;
        int st = tb_ks_parse_infer(body, k, -1, &io, 1, g_out, 2, 0, &r, &e);
        CHECK_MSG(st == 200, "%s", e.msg);
        if (st == 200) {
            CHECK_MSG(!memcmp(r.inputs[0].data, v, (size_t)n * 4), "%s digits: JSON and binary differ",
                      fmt ? "9" : "17");
            tb_ks_request_free(&r);
        }
    }
    const char *hdr = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3,224,224],\"datatype\":\"FP32\",\"parameters\":"
                      "{\"binary_data_size\":602112}}]}";
    size_t hl = strlen(hdr);
    memcpy(body, hdr, hl);
    memcpy(body + hl, v, (size_t)n * 4);
    tb_ks_request r;
    tb_ks_error e;
    CHECK(tb_ks_parse_infer(body, hl + (size_t)n * 4, (long long)hl, &io, 1, g_out, 2, 0, &r, &e) == 200);
    if (r.buf) {
        CHECK(!memcmp(r.inputs[0].data, v, (size_t)n * 4));
        tb_ks_request_free(&r);
    }
    free(v);
    free(body);
}

/* Differential: requests mutated at random (bytes replaced, flipped,
 * inserted, the text cut) are parsed twice, as sent and with every "data"
 * key escaped ("d\u0061ta"), which makes jansson read the whole request.
 * Both must accept or refuse alike and give the same tensors. */
static void test_fast_data_differential(void) {
    static const char *seeds[] = {
        "{\"id\":\"a\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[[1,2.5,-3e2],[0.1,2,"
        "7]]},{\"name\":\"t\",\"shape\":[2],\"datatype\":\"BYTES\",\"data\":[\"ab\\u0000\",\"c\"]}],\"parameters\":{\"k\":"
        "[1,{\"a\":\"]\"}]},\"outputs\":[{\"name\":\"y\"}]}",
        "{\"inputs\":[{\"data\":[true,false,true],\"name\":\"b\",\"shape\":[3],\"datatype\":\"BOOL\"},{\"name\":\"x\","
        "\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1.000000000000000055511,-0.0,123456789012345678]}]}",
    };
    tb_io_info in[3], out[1];
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    snprintf(in[0].name, sizeof in[0].name, "x");
    in[0].dtype = TB_F32, in[0].rank = 2;
    in[0].min[0] = 1, in[0].max[0] = 4, in[0].min[1] = in[0].max[1] = 3;
    snprintf(in[1].name, sizeof in[1].name, "t");
    in[1].dtype = TB_KS_BYTES, in[1].rank = 1, in[1].min[0] = 1, in[1].max[0] = 4;
    snprintf(in[2].name, sizeof in[2].name, "b");
    in[2].dtype = TB_BOOL, in[2].rank = 1, in[2].min[0] = 1, in[2].max[0] = 4;
    snprintf(out[0].name, sizeof out[0].name, "y");
    out[0].dtype = TB_F32, out[0].rank = 1;
    static const char alphabet[] = "[]{}\",:\\0-e.1 t";
    uint64_t seed = 99;
    int accepted = 0, diffs = 0;
    for (int it = 0; it < 40000; it++) {
        const char *s = seeds[it & 1];
        size_t n = strlen(s);
        char *b = malloc(n + 8), *b2 = malloc(n * 6 + 8);
        if (!b || !b2) { free(b); free(b2); break; }
        memcpy(b, s, n);
        for (int m = 0; m < 3 && n > 0; m++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t p = (size_t)(seed >> 20) % n;
            switch ((seed >> 8) & 3) {
            case 0: b[p] = alphabet[(seed >> 40) % (sizeof alphabet - 1)]; break;
            case 1: b[p] ^= (char)(1 << ((seed >> 40) & 7)); break;
            case 2: if ((seed >> 40) % 4 == 0) n = p; break;
            default: memmove(b + p + 1, b + p, n - p); b[p] = alphabet[(seed >> 40) % (sizeof alphabet - 1)]; n++;
            }
        }
        size_t n2 = 0;
        for (size_t i = 0; i < n;) {
            if (i + 6 <= n && !memcmp(b + i, "\"data\"", 6)) {
                memcpy(b2 + n2, "\"d\\u0061ta\"", 11);
                n2 += 11, i += 6;
            } else {
                b2[n2++] = b[i++];
            }
        }
        tb_ks_request r, r2;
        tb_ks_error e, e2;
        int st = tb_ks_parse_infer_opt(b, n, -1, in, 3, 6, out, 1, 0, &r, &e);
        int st2 = tb_ks_parse_infer_opt(b2, n2, -1, in, 3, 6, out, 1, 0, &r2, &e2);
        if ((st == 200) != (st2 == 200)) {
            if (diffs++ < 3) fprintf(stderr, "differ (%d: %s / %d: %s): %.*s\n", st, e.msg, st2, e2.msg, (int)n, b);
        } else if (st == 200) {
            accepted++;
            for (int k = 0; k < 3; k++)
                if (r.given[k] != r2.given[k] || r.in_size[k] != r2.in_size[k] ||
                    (r.given[k] && memcmp(r.inputs[k].data, r2.inputs[k].data, r.in_size[k])))
                    if (diffs++ < 3) fprintf(stderr, "tensor %d differs: %.*s\n", k, (int)n, b);
        }
        if (st == 200) tb_ks_request_free(&r);
        if (st2 == 200) tb_ks_request_free(&r2);
        free(b);
        free(b2);
    }
    CHECK_MSG(diffs == 0, "%d of 40000 mutated requests read differently with and without jansson", diffs);
    CHECK_MSG(accepted > 100, "only %d mutated requests accepted: the mutations test too little", accepted);
}

int main(void) {
    setup();
    test_routes();
    test_dtypes();
    test_parse_json();
    test_parse_binary();
    test_errors();
    test_encode();
    test_metadata();
    test_bytes();
    test_fast_data();
    test_json_equals_binary();
    test_fast_doubles();
    test_fast_data_differential();
    printf("%d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures != 0;
}
