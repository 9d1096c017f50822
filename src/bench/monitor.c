/*
 * monitor.c — what the load tester samples beside its own requests: the
 * target's Prometheus /metrics and, when an NVIDIA driver is present, the
 * GPUs through NVML, loaded with dlopen so that nothing here needs NVML to
 * build or to run.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>

#include "bench/bench.h"

/* ---------------------------------------------------------------- /metrics */

static const char *const k_running[] = {
    "turbine_requests_running", "turbine_batch_size", "vllm:num_requests_running",
    "llamacpp:requests_processing", "tgi_batch_current_size", "sglang:num_running_reqs", NULL};
static const char *const k_waiting[] = {
    "turbine_requests_waiting", "turbine_queue_length", "vllm:num_requests_waiting",
    "llamacpp:requests_deferred", "tgi_queue_size", "sglang:num_queue_reqs", NULL};
static const char *const k_kv[] = {
    "turbine_kv_cache_usage_ratio", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
    "llamacpp:kv_cache_usage_ratio", "sglang:token_usage", NULL};
/* counters in tokens (vLLM V1 counts tokens the same way) */
static const char *const k_prefix_hits[] = {"turbine_prefix_cache_hits_total", "vllm:prefix_cache_hits_total", NULL};
static const char *const k_prefix_queries[] = {"turbine_prefix_cache_queries_total", "vllm:prefix_cache_queries_total",
                                               NULL};

/* generation requests received and prompt tokens processed (counters) */
static const char *const k_requests[] = {"turbine_http_requests_total", "vllm:request_success_total",
                                         "llamacpp:requests_processed_total", "tgi_request_count",
                                         "sglang:num_requests_total", NULL};
static const char *const k_prompt_tokens[] = {"turbine_prompt_tokens_total", "vllm:prompt_tokens_total",
                                              "llamacpp:prompt_tokens_total", "sglang:prompt_tokens_total", NULL};

static int name_in(const char *name, size_t len, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (strlen(list[i]) == len && !memcmp(list[i], name, len)) return 1;
    return 0;
}

void tb_bench_parse_prometheus(const char *text, tb_server_metrics *m) {
    m->running = m->waiting = m->kv = m->prefix_hits = m->prefix_queries = m->requests = m->prompt_tokens = NAN;
    const char *p = text;
    int lines = 0;
    while (p && *p && lines++ < 200000) {
        const char *eol = strchr(p, '\n');
        const char *end = eol ? eol : p + strlen(p);
        if (*p != '#') {
            const char *n = p;
            while (n < end && *n != '{' && *n != ' ' && *n != '\t') n++;
            size_t nlen = (size_t)(n - p);
            const char *v = n;
            if (v < end && *v == '{') {
                while (v < end && *v != '}') v++;
                if (v < end) v++;
            }
            char *vend;
            double val = strtod(v, &vend);
            if (vend != v && vend <= end && isfinite(val)) {
                double *dst = name_in(p, nlen, k_running)          ? &m->running
                              : name_in(p, nlen, k_waiting)        ? &m->waiting
                              : name_in(p, nlen, k_kv)             ? &m->kv
                              : name_in(p, nlen, k_prefix_hits)    ? &m->prefix_hits
                              : name_in(p, nlen, k_prefix_queries) ? &m->prefix_queries
                              : name_in(p, nlen, k_requests)       ? &m->requests
                              : name_in(p, nlen, k_prompt_tokens)  ? &m->prompt_tokens
                                                                   : NULL;
                if (dst) *dst = isnan(*dst) ? val : *dst + val;
            }
        }
        p = eol ? eol + 1 : NULL;
    }
}

/* ---------------------------------------------------------------- NVML */

typedef struct { unsigned int gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;
typedef int (*fn_init)(void);
typedef int (*fn_shutdown)(void);
typedef int (*fn_count)(unsigned int *);
typedef int (*fn_handle)(unsigned int, void **);
typedef int (*fn_util)(void *, nvml_util *);
typedef int (*fn_mem)(void *, nvml_mem *);
typedef int (*fn_power)(void *, unsigned int *);

static struct {
    void *lib;
    int n;
    void *dev[16];
    fn_shutdown shutdown;
    fn_util util;
    fn_mem mem;
    fn_power power;
} g_nvml;

int tb_nvml_open(void) {
    if (g_nvml.lib) return g_nvml.n;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    fn_init init = (fn_init)dlsym(lib, "nvmlInit_v2");
    fn_count count = (fn_count)dlsym(lib, "nvmlDeviceGetCount_v2");
    fn_handle handle = (fn_handle)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    g_nvml.shutdown = (fn_shutdown)dlsym(lib, "nvmlShutdown");
    g_nvml.util = (fn_util)dlsym(lib, "nvmlDeviceGetUtilizationRates");
    g_nvml.mem = (fn_mem)dlsym(lib, "nvmlDeviceGetMemoryInfo");
    g_nvml.power = (fn_power)dlsym(lib, "nvmlDeviceGetPowerUsage");
    unsigned int n = 0;
    if (!init || !count || !handle || !g_nvml.shutdown || init() != 0) {
        dlclose(lib);
        return 0;
    }
    if (count(&n) != 0) n = 0;
    if (n > 16) n = 16;
    int k = 0;
    for (unsigned int i = 0; i < n; i++)
        if (handle(i, &g_nvml.dev[k]) == 0) k++;
    g_nvml.lib = lib;
    g_nvml.n = k;
    return k;
}

int tb_nvml_sample(double *util, double *mem_gib, double *power_w) {
    *util = *mem_gib = *power_w = NAN;
    if (!g_nvml.lib || !g_nvml.n) return 0;
    double u = 0, m = 0, pw = 0;
    int nu = 0, nm = 0, np = 0;
    for (int i = 0; i < g_nvml.n; i++) {
        nvml_util ur;
        nvml_mem mr;
        unsigned int mw;
        if (g_nvml.util && g_nvml.util(g_nvml.dev[i], &ur) == 0) { u += ur.gpu; nu++; }
        if (g_nvml.mem && g_nvml.mem(g_nvml.dev[i], &mr) == 0) { m += (double)mr.used / 1073741824.0; nm++; }
        if (g_nvml.power && g_nvml.power(g_nvml.dev[i], &mw) == 0) { pw += mw / 1000.0; np++; }
    }
    if (nu) *util = u / nu;
    if (nm) *mem_gib = m;
    if (np) *power_w = pw;
    return g_nvml.n;
}

void tb_nvml_close(void) {
    if (!g_nvml.lib) return;
    g_nvml.shutdown();
    dlclose(g_nvml.lib);
    memset(&g_nvml, 0, sizeof g_nvml);
}
