/* backend.c — choosing a backend by device string; the one place that knows
 * which backends this build has. */
#include "backend/backend.h"

#include <jansson.h>

tb_status tb_device_parse(const char *device, char kind[16], int *index) {
    if (!device || !*device) device = "cpu";
    const char *colon = strchr(device, ':');
    size_t n = colon ? (size_t)(colon - device) : strlen(device);
    if (n == 0 || n >= 16) return tb_errorf(TB_ERR_INVALID_ARG, "unknown device '%s' (use cpu or cuda[:N])", device);
    memcpy(kind, device, n);
    kind[n] = 0;
    *index = 0;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (*end || end == colon + 1 || v < 0 || v > 255)
            return tb_errorf(TB_ERR_INVALID_ARG, "bad device index in '%s'", device);
        *index = (int)v;
    }
    if (strcmp(kind, "cpu") && strcmp(kind, "cuda"))
        return tb_errorf(TB_ERR_INVALID_ARG, "unknown device '%s' (use cpu or cuda[:N])", device);
    if (!strcmp(kind, "cpu") && *index != 0) return tb_errorf(TB_ERR_INVALID_ARG, "device 'cpu' takes no index");
    return TB_OK;
}

int64_t tb_step_rows(const tb_graph *g, int v, const tb_step *st) {
    int64_t d = g->values[v].dims[0];
    if (!TB_IS_SYM(d)) return d;
    return strcmp(g->syms[TB_SYM_INDEX(d)].name, "rows") == 0 ? st->n_rows : st->n_tokens;
}

static __attribute__((unused)) tb_status no_cuda(void) {
    return tb_errorf(TB_ERR_UNSUPPORTED, "this turbine was built without CUDA (nvcc was not found at build time)");
}

tb_status tb_backend_create(const char *device, int n_threads, int max_ctx, tb_backend **out) {
    char kind[16];
    int idx;
    *out = NULL;
    TB_TRY(tb_device_parse(device, kind, &idx));
    if (!strcmp(kind, "cpu")) return tb_backend_cpu_create(n_threads, max_ctx, out);
#ifdef TB_HAVE_CUDA
    return tb_backend_cuda_create(idx, max_ctx, out);
#else
    (void)n_threads;
    return no_cuda();
#endif
}

void tb_backend_free(tb_backend *b) {
    if (!b) return;
    if (b->iface && b->iface->destroy) b->iface->destroy(b);
    free(b);
}

char *tb_backend_fingerprint(const char *device) {
    char kind[16];
    int idx;
    if (tb_device_parse(device, kind, &idx) != TB_OK) return NULL;
    if (!strcmp(kind, "cpu")) return tb_backend_cpu_fingerprint();
#ifdef TB_HAVE_CUDA
    return tb_backend_cuda_fingerprint(idx);
#else
    no_cuda();
    return NULL;
#endif
}

tb_status tb_backend_memory(const char *device, uint64_t *total, uint64_t *free_bytes) {
    char kind[16];
    int idx;
    *total = *free_bytes = 0;
    TB_TRY(tb_device_parse(device, kind, &idx));
    if (!strcmp(kind, "cpu")) return tb_errorf(TB_ERR_INVALID_ARG, "device '%s' has no GPU memory", device);
#ifdef TB_HAVE_CUDA
    return tb_backend_cuda_memory(idx, total, free_bytes);
#else
    return no_cuda();
#endif
}

void tb_backend_kind_of(const char *hw_json, char kind[16]) {
    snprintf(kind, 16, "cpu");
    json_error_t err;
    json_t *o = json_loads(hw_json, 0, &err);
    const char *b = o ? json_string_value(json_object_get(o, "backend")) : NULL;
    if (b) snprintf(kind, 16, "%s", b);
    json_decref(o);
}

tb_status tb_backend_check(const char *hw_json, const char *device) {
    char rec[16], kind[16];
    int idx = 0;
    tb_backend_kind_of(hw_json, rec);
    if (device && *device) {
        TB_TRY(tb_device_parse(device, kind, &idx));
        if (strcmp(kind, rec))
            return tb_errorf(TB_ERR_HARDWARE, "engine was built for the %s backend; device '%s' needs an engine built "
                                              "for %s (rebuild with --device %s)", rec, device, kind, device);
    }
    if (!strcmp(rec, "cpu")) return tb_backend_cpu_check(hw_json);
    if (!strcmp(rec, "cuda")) {
#ifdef TB_HAVE_CUDA
        return tb_backend_cuda_check(hw_json, idx);
#else
        return tb_errorf(TB_ERR_HARDWARE, "engine was built for a CUDA GPU; this turbine was built without CUDA");
#endif
    }
    return tb_errorf(TB_ERR_HARDWARE, "engine was built for unknown backend '%s'", rec);
}
