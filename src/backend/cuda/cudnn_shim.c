/*
 * cudnn_shim.c — loads cuDNN with dlopen (cudnn_shim.h says from where) and
 * resolves the entry points the backend calls. Once per process; the
 * outcome (the path and version, or why none) is logged once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cudnn_shim.h"
#include "core/core.h"

static tbd_api api;
static const tbd_api *loaded;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* cuDNN 9's sub-libraries, loaded from the folder of libcudnn.so.9 before it
 * asks for them by name (graph first: the others need it) */
static const char *const subs[] = {
    "libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9",
    "libcudnn_heuristic.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9",
};

static void *open_with_subs(const char *path) {
    const char *slash = strrchr(path, '/');
    if (slash) {
        char dir[512];
        size_t n = (size_t)(slash - path);
        if (n < sizeof dir - 64) {
            memcpy(dir, path, n);
            dir[n] = 0;
            for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
                char p[600];
                snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
                void *h = dlopen(p, RTLD_NOW | RTLD_GLOBAL);
                if (!h) dlerror(); /* absent or unloadable: libcudnn loads what it needs itself */
            }
        }
    }
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void *try_open(const char *name, char *why, size_t why_n) {
    void *h = strchr(name, '/') ? open_with_subs(name) : dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        size_t u = strlen(why);
        if (u + 4 < why_n) snprintf(why + u, why_n - u, "%s%s", u ? "; " : "", e ? e : name);
        return NULL;
    }
    snprintf(api.path, sizeof api.path, "%s", name);
    return h;
}

static void *find_lib(char *why, size_t why_n) {
    const char *env = getenv("TB_CUDNN_LIB");
    void *h;
    if (env && *env) return try_open(env, why, why_n);
    if ((h = try_open("libcudnn.so.9", why, why_n)) || (h = try_open("libcudnn.so", why, why_n))) {
        /* found through the loader's path: its sub-libraries are there too */
        return h;
    }
    static const char *const pats[] = {
        "/opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/local/lib/python3*/dist-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/local/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/lib/python3/dist-packages/nvidia/cudnn/lib/libcudnn.so.9",
    };
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++) {
        glob_t g;
        if (glob(pats[i], 0, NULL, &g) != 0) continue;
        for (size_t k = g.gl_pathc; k-- > 0;) { /* the newest python first */
            if ((h = try_open(g.gl_pathv[k], why, why_n))) {
                globfree(&g);
                return h;
            }
        }
        globfree(&g);
    }
    return NULL;
}

#define SYM(field, name)                                                                                      \
    do {                                                                                                      \
        *(void **)&api.field = dlsym(h, name);                                                                \
        if (!api.field) { missing = name; goto fail; }                                                        \
    } while (0)

static void load(void) {
    char why[1024] = "";
    void *h = find_lib(why, sizeof why);
    if (!h) {
        tb_log(TB_LOG_DEBUG, "cuda: no cuDNN library (%s): convolutions run as im2col + cuBLAS", why);
        return;
    }
    const char *missing = NULL;
    SYM(Create, "cudnnCreate");
    SYM(Destroy, "cudnnDestroy");
    SYM(SetStream, "cudnnSetStream");
    SYM(GetVersion, "cudnnGetVersion");
    SYM(GetErrorString, "cudnnGetErrorString");
    SYM(CreateTensorDescriptor, "cudnnCreateTensorDescriptor");
    SYM(DestroyTensorDescriptor, "cudnnDestroyTensorDescriptor");
    SYM(SetTensor4dDescriptor, "cudnnSetTensor4dDescriptor");
    SYM(CreateFilterDescriptor, "cudnnCreateFilterDescriptor");
    SYM(DestroyFilterDescriptor, "cudnnDestroyFilterDescriptor");
    SYM(SetFilter4dDescriptor, "cudnnSetFilter4dDescriptor");
    SYM(CreateConvolutionDescriptor, "cudnnCreateConvolutionDescriptor");
    SYM(DestroyConvolutionDescriptor, "cudnnDestroyConvolutionDescriptor");
    SYM(SetConvolution2dDescriptor, "cudnnSetConvolution2dDescriptor");
    SYM(SetConvolutionGroupCount, "cudnnSetConvolutionGroupCount");
    SYM(SetConvolutionMathType, "cudnnSetConvolutionMathType");
    SYM(CreateActivationDescriptor, "cudnnCreateActivationDescriptor");
    SYM(DestroyActivationDescriptor, "cudnnDestroyActivationDescriptor");
    SYM(SetActivationDescriptor, "cudnnSetActivationDescriptor");
    SYM(GetConvolutionForwardAlgorithm_v7, "cudnnGetConvolutionForwardAlgorithm_v7");
    SYM(FindConvolutionForwardAlgorithmEx, "cudnnFindConvolutionForwardAlgorithmEx");
    SYM(GetConvolutionForwardWorkspaceSize, "cudnnGetConvolutionForwardWorkspaceSize");
    SYM(ConvolutionForward, "cudnnConvolutionForward");
    SYM(ConvolutionBiasActivationForward, "cudnnConvolutionBiasActivationForward");
    api.lib = h;
    api.version = api.GetVersion();
    if (api.version < 8000) {
        tb_log(TB_LOG_WARN, "cuda: %s is cuDNN %zu (8.0 or newer needed): convolutions run as im2col + cuBLAS",
               api.path, api.version);
        dlclose(h);
        return;
    }
    size_t v = api.version, major = v >= 90000 ? v / 10000 : v / 1000, minor = v >= 90000 ? v / 100 % 100 : v / 100 % 10;
    tb_log(TB_LOG_INFO, "cuda: cuDNN %zu.%zu.%zu from %s", major, minor, v % 100, api.path);
    loaded = &api;
    return;
fail:
    tb_log(TB_LOG_WARN, "cuda: %s lacks %s: convolutions run as im2col + cuBLAS", api.path, missing);
    dlclose(h);
}

const tbd_api *tbd_get(void) {
    pthread_once(&once, load);
    return loaded;
}

const char *tbd_error(cudnnStatus_t s) {
    if (loaded && loaded->GetErrorString) return loaded->GetErrorString(s);
    return "cuDNN not loaded";
}
