/* fuzz_kserve_grpc.c — a KServe v2 gRPC ModelInferRequest as the server
 * takes it apart (src/serve/kserve_grpc.c: the protobuf decoding, then
 * every input's name, datatype, shape within the profile, typed contents of
 * the datatype's field and range or raw_input_contents of exactly its
 * bytes, outputs named, the timeout parameter), then, when it is accepted,
 * the ModelInferResponse encoded from the parsed inputs (an identity model:
 * output k is input k). The whole input is the message. Without the gRPC
 * service compiled in, every call answers 500 and the harness checks that. */
#include <jansson.h>

#include "fuzz_common.h"
#include "fuzz_kserve_io.h"
#include "serve/kserve_grpc.h"

/* An LLM's profile: text_input BYTES [1..2], max_tokens INT32 [1] (may be
 * left out) -> text_output BYTES [1..2]; parameters become JSON. */
static int llm_request(tb_ks_grpc_request *q) {
    static tb_io_info io[2];
    if (!io[0].rank) {
        snprintf(io[0].name, sizeof io[0].name, "text_input");
        io[0].dtype = TB_KS_BYTES;
        io[0].rank = 1, io[0].min[0] = 1, io[0].opt[0] = 1, io[0].max[0] = 2;
        snprintf(io[1].name, sizeof io[1].name, "max_tokens");
        io[1].dtype = TB_I32;
        io[1].rank = 1, io[1].min[0] = io[1].opt[0] = io[1].max[0] = 1;
    }
    tb_ks_request r;
    tb_ks_error e;
    int st = tb_ks_grpc_request_check_opt(q, io, 2, 2, io, 1, 1 << 16, &r, &e);
    tb_ks_grpc_request_free(q);
    FUZZ_ASSERT(st == 200 || st == 400 || st == 500);
    FUZZ_ASSERT(memchr(e.msg, 0, sizeof e.msg) != NULL);
    if (st != 200) {
        FUZZ_ASSERT(r.buf == NULL && r.params == NULL);
        return 0;
    }
    FUZZ_ASSERT(r.given[0] == 1 && r.inputs[0].dtype == TB_KS_BYTES);
    size_t sz = 0;
    FUZZ_ASSERT(tb_ks_bytes_size(r.inputs[0].data, r.in_size[0], r.inputs[0].dims[0], &sz) && sz == r.in_size[0]);
    for (int64_t i = 0; i < r.inputs[0].dims[0]; i++) {
        const char *p;
        size_t n;
        FUZZ_ASSERT(tb_ks_bytes_get(r.inputs[0].data, r.in_size[0], i, &p, &n));
        volatile uint8_t sink = 0;
        for (size_t k = 0; k < n; k++) sink ^= (uint8_t)p[k];
        (void)sink;
    }
    if (r.given[1]) FUZZ_ASSERT(r.inputs[1].dtype == TB_I32 && r.inputs[1].dims[0] == 1 && r.in_size[1] == 4);
    else FUZZ_ASSERT(r.inputs[1].data == NULL);
    if (r.params) {
        json_t *j = json_loads(r.params, JSON_ALLOW_NUL, NULL);
        FUZZ_ASSERT(j && json_is_object(j) && !json_object_get(j, "timeout"));
        json_decref(j);
    }
    void *out = NULL;
    size_t on = 0;
    st = tb_ks_grpc_encode_infer("l", "1", &r, io, r.inputs, 1, &out, &on, &e);
    FUZZ_ASSERT(st == 200 && out != NULL && on >= sz);
    free(out);
    tb_ks_request_free(&r);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    kserve_io_setup();
    tb_ks_grpc_request *q = NULL;
    tb_ks_error e;
    int st = tb_ks_grpc_decode_infer(data, size, &q, &e);
    FUZZ_ASSERT(memchr(e.msg, 0, sizeof e.msg) != NULL);
    if (!tb_ks_grpc_compiled()) {
        FUZZ_ASSERT(st == 500 && q == NULL);
        return 0;
    }
    FUZZ_ASSERT(st == 200 || st == 400);
    if (st != 200) {
        FUZZ_ASSERT(q == NULL);
        return 0;
    }
    FUZZ_ASSERT(tb_ks_grpc_request_model(q) != NULL && tb_ks_grpc_request_version(q) != NULL);
    if (tb_ks_grpc_request_model(q)[0] == 'l') return llm_request(q);
    tb_ks_request r;
    st = tb_ks_grpc_request_check(q, g_io, 4, g_io, 4, 1 << 16, &r, &e);
    tb_ks_grpc_request_free(q);
    FUZZ_ASSERT(st == 200 || st == 400 || st == 500);
    FUZZ_ASSERT(memchr(e.msg, 0, sizeof e.msg) != NULL);
    if (st != 200) {
        FUZZ_ASSERT(r.buf == NULL);
        return 0;
    }
    FUZZ_ASSERT(r.n_inputs == 4 && r.timeout_us >= 0 && strlen(r.id) < TB_KS_MAX_ID);
    size_t bytes = 0;
    for (int k = 0; k < 4; k++) {
        const tb_tensor *t = &r.inputs[k];
        FUZZ_ASSERT(t->dtype == g_io[k].dtype && t->rank == g_io[k].rank);
        size_t el = 1;
        for (int d = 0; d < t->rank; d++) {
            FUZZ_ASSERT(t->dims[d] >= g_io[k].min[d] && t->dims[d] <= g_io[k].max[d]);
            el *= (size_t)t->dims[d];
        }
        bytes += el * tb_ks_dtype_size(t->dtype);
        /* every byte of the tensor readable (ASan checks the bounds) */
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < el * tb_ks_dtype_size(t->dtype); i++) sink ^= ((const uint8_t *)t->data)[i];
        (void)sink;
        if (t->dtype == TB_BOOL)
            for (size_t i = 0; i < el; i++) FUZZ_ASSERT(((const uint8_t *)t->data)[i] <= 1);
    }
    FUZZ_ASSERT(bytes <= r.in_bytes);
    FUZZ_ASSERT(r.n_outputs >= 0 && r.n_outputs <= 4);
    void *out = NULL;
    size_t on = 0;
    st = tb_ks_grpc_encode_infer("fuzz", "1", &r, g_io, r.inputs, 4, &out, &on, &e);
    FUZZ_ASSERT(st == 200);
    /* the raw outputs alone are the inputs' bytes: the message holds at least those */
    FUZZ_ASSERT(out != NULL && on >= (r.n_outputs ? 0 : bytes));
    free(out);
    tb_ks_request_free(&r);
    return 0;
}
