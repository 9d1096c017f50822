/* fuzz_kserve.c — a KServe v2 infer request as the server takes it apart
 * (src/serve/kserve.c tb_ks_parse_infer: the JSON header, every input's
 * name, datatype, shape within the profile, flat or nested data, the
 * binary tensor extension's framing), then, when it is accepted, the
 * response encoded from the parsed inputs (an identity model: output k is
 * input k) and its JSON header read back; the bytes also go through the
 * route parser.
 * Byte 0 bit 0: the request has Inference-Header-Content-Length, whose
 * value is bytes 1-2 (little-endian); the rest is the body. */
#include <jansson.h>

#include "fuzz_common.h"
#include "fuzz_kserve_io.h"
#include "serve/kserve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    kserve_io_setup();
    if (size < 3) return 0;
    long long hl = (data[0] & 1) ? (long long)(data[1] | data[2] << 8) : -1;
    const char *body = (const char *)data + 3;
    size_t n = size - 3;
    /* the route parser on the bytes as a path */
    char url[512], name[TB_KS_MAX_NAME], ver[TB_KS_MAX_NAME];
    size_t un = n < sizeof url - 1 ? n : sizeof url - 1;
    memcpy(url, body, un);
    url[un] = 0;
    tb_ks_route rt = tb_ks_parse_route(url, name, ver);
    FUZZ_ASSERT(rt >= TB_KS_ROUTE_NONE && rt <= TB_KS_ROUTE_UNKNOWN);
    FUZZ_ASSERT(strlen(name) < TB_KS_MAX_NAME && strlen(ver) < TB_KS_MAX_NAME);

    tb_ks_request r;
    tb_ks_error e;
    int st = tb_ks_parse_infer(body, n, hl, g_io, 4, g_io, 4, 1 << 16, &r, &e);
    FUZZ_ASSERT(st == 200 || (st >= 400 && st < 600));
    FUZZ_ASSERT(memchr(e.msg, 0, sizeof e.msg) != NULL);
    if (st != 200) {
        FUZZ_ASSERT(r.buf == NULL);
        return 0;
    }
    FUZZ_ASSERT(r.n_inputs == 4);
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
    char *out;
    size_t on, ohl;
    st = tb_ks_encode_response("fuzz", "1", &r, g_io, r.inputs, 4, &out, &on, &ohl, &e);
    FUZZ_ASSERT(st == 200 || st == 500);
    if (st == 200) {
        FUZZ_ASSERT(ohl <= on);
        json_error_t je;
        json_t *j = json_loadb(out, ohl ? ohl : on, 0, &je);
        FUZZ_ASSERT(j != NULL && json_is_array(json_object_get(j, "outputs")));
        json_decref(j);
        free(out);
    } else {
        FUZZ_ASSERT(out == NULL);
    }
    tb_ks_request_free(&r);
    return 0;
}
