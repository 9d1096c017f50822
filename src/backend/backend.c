/* backend.c — choosing a backend by device string; the one place that knows
 * which backends this build has. The CPU backend is linked in; the CUDA
 * backend is a module (cuda/cuda_module.h) loaded here on first use. */
#define _GNU_SOURCE
#include "backend/backend.h"
#include "core/comm.h"

#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>

#ifdef TB_HAVE_CUDA
#include "backend/cuda/cuda_module.h"
#include "backend/module.h"
#endif

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

#ifdef TB_HAVE_CUDA
/* ---------------------------------------------------------------- CUDA module */

/* The host side of the table (cuda_module.h): the va_list forms the module
 * needs, over the core's functions. */
static tb_status host_verrorf(tb_status code, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return tb_errorf(code, "%s", msg);
}
static tb_status host_verror_prefix(tb_status code, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return tb_error_prefix(code, "%s", msg);
}
static void host_vlog(tb_log_level l, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    tb_log(l, "%s", msg);
}

/* Loaded once per process; a failure is kept and reported to every caller. */
static struct {
    pthread_once_t once;
    tb_status st;
    char err[1536];
    tb_cuda_module_api api;
} cuda_mod = {.once = PTHREAD_ONCE_INIT};

static void cuda_module_load(void) {
    void *h = NULL;
    char path[4096];
    tb_status st = tb_module_open(TB_CUDA_MODULE_FILE, "CUDA backend", &h, path, sizeof path);
    if (st == TB_OK) {
        tb_cuda_module_init_fn init = (tb_cuda_module_init_fn)dlsym(h, TB_CUDA_MODULE_ENTRY);
        const tb_cuda_host_api host = {
            .abi = tb_cuda_module_abi(),
            .verrorf = host_verrorf,
            .verror_prefix = host_verror_prefix,
            .vlog = host_vlog,
            .op_name = tb_op_name,
            .dtype_name = tb_dtype_name,
            .value_numel = tb_value_numel,
            .step_rows = tb_step_rows,
            .comm_exchange = tb_comm_exchange,
            .comm_barrier = tb_comm_barrier,
            .backend_free = tb_backend_free,
            .nn_transpose_perm = tb_nn_transpose_perm,
            .nn_slice_plan = tb_nn_slice_plan,
            .nn_broadcast_strides = tb_nn_broadcast_strides,
            .nn_pool_geom = tb_nn_pool_geom,
        };
        uint64_t abi = init ? init(&host, &cuda_mod.api) : 0;
        if (!init)
            st = tb_errorf(TB_ERR_VERSION, "%s is not a turbine CUDA backend module (no %s)", path,
                           TB_CUDA_MODULE_ENTRY);
        else if (abi != host.abi || !cuda_mod.api.create)
            st = tb_errorf(TB_ERR_VERSION, "%s was built from another version of turbine (module interface "
                           "%016llx, this turbine %016llx): install the module built with this binary", path,
                           (unsigned long long)abi, (unsigned long long)host.abi);
        /* a refused module stays mapped: unloading code that may have run
         * (its static constructors) is not worth the risk */
    }
    cuda_mod.st = st;
    if (st != TB_OK) snprintf(cuda_mod.err, sizeof cuda_mod.err, "%s", tb_last_error());
}

static tb_status cuda_module(const tb_cuda_module_api **api) {
    pthread_once(&cuda_mod.once, cuda_module_load);
    *api = &cuda_mod.api;
    return cuda_mod.st == TB_OK ? TB_OK : tb_errorf(cuda_mod.st, "%s", cuda_mod.err);
}
#else
static tb_status no_cuda(void) {
    return tb_errorf(TB_ERR_UNSUPPORTED, "this turbine was built without the CUDA backend (nvcc was not found "
                                         "at build time, or -DTB_CUDA=OFF)");
}
#endif

tb_status tb_backend_create(const char *device, int n_threads, int max_ctx, tb_backend **out) {
    char kind[16];
    int idx;
    *out = NULL;
    TB_TRY(tb_device_parse(device, kind, &idx));
    if (!strcmp(kind, "cpu")) return tb_backend_cpu_create(n_threads, max_ctx, out);
#ifdef TB_HAVE_CUDA
    const tb_cuda_module_api *m;
    TB_TRY(cuda_module(&m));
    return m->create(idx, max_ctx, out);
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
    const tb_cuda_module_api *m;
    if (cuda_module(&m) != TB_OK) return NULL;
    return m->fingerprint(idx);
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
    const tb_cuda_module_api *m;
    TB_TRY(cuda_module(&m));
    return m->memory(idx, total, free_bytes);
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
        const tb_cuda_module_api *m;
        TB_TRY(cuda_module(&m));
        return m->check(hw_json, idx);
#else
        return tb_errorf(TB_ERR_HARDWARE, "engine was built for a CUDA GPU; this turbine was built without the "
                                          "CUDA backend");
#endif
    }
    return tb_errorf(TB_ERR_HARDWARE, "engine was built for unknown backend '%s'", rec);
}
