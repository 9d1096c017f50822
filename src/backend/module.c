/* module.c — the search for turbine's shared modules (order: module.h). */
#define _GNU_SOURCE
#include "backend/module.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#ifndef TB_MODULE_REL_DIR
#define TB_MODULE_REL_DIR "lib/turbine"
#endif
#ifndef TB_MODULE_INSTALL_DIR
#define TB_MODULE_INSTALL_DIR "/usr/local/lib/turbine"
#endif

#define TB_MODULE_MAX_DIRS 4

/* The folders to search, in order (module.h); returns how many. */
static int module_dirs(char dirs[TB_MODULE_MAX_DIRS][PATH_MAX]) {
    const char *env = getenv("TURBINE_MODULE_DIR");
    if (env && *env) {
        snprintf(dirs[0], PATH_MAX, "%s", env);
        return 1;
    }
    int n = 0;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[n++], PATH_MAX, "%s", exe[0] ? exe : "/");
            snprintf(dirs[n++], PATH_MAX, "%s/../%s", exe, TB_MODULE_REL_DIR);
        }
    }
    snprintf(dirs[n++], PATH_MAX, "%s", TB_MODULE_INSTALL_DIR);
    return n;
}

tb_status tb_module_open(const char *file, const char *what, void **handle, char *path, size_t cap) {
    char dirs[TB_MODULE_MAX_DIRS][PATH_MAX];
    int n = module_dirs(dirs);
    *handle = NULL;
    char searched[TB_MODULE_MAX_DIRS * 256] = "";
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/%s", dirs[i], file);
        if (access(p, F_OK) != 0) {
            size_t used = strlen(searched);
            snprintf(searched + used, sizeof searched - used, "%s%s", i ? ", " : "", dirs[i]);
            continue;
        }
        snprintf(path, cap, "%s", p);
        dlerror();
        *handle = dlopen(p, RTLD_NOW | RTLD_LOCAL);
        if (!*handle) {
            const char *e = dlerror();
            return tb_errorf(TB_ERR_UNSUPPORTED, "cannot load the %s module %s: %s", what, p,
                             e ? e : "unknown dlopen error");
        }
        return TB_OK;
    }
    snprintf(path, cap, "%s", file);
    return tb_errorf(TB_ERR_NOT_FOUND, "the %s module %s was not found (searched %s; TURBINE_MODULE_DIR names "
                                       "its folder)", what, file, searched);
}
