/*
 * curl_shim.c — the wrappers of curl_shim.h: libcurl's functions through
 * pointers filled by dlsym the first time any of them is called.
 *
 * The variadic setters forward the one argument each option takes; its C
 * type follows from the option number's range (CURLOPTTYPE_*), the same
 * rule libcurl applies when it reads the argument.
 */
#define _GNU_SOURCE
#include "bench/curl_shim.h"

#include <dlfcn.h>
#include <pthread.h>

/* X(name, return type, parameters): every function the wrappers reach */
#define TB_CURL_FUNCS(X)                                                                     \
    X(curl_easy_init, CURL *, (void))                                                        \
    X(curl_easy_cleanup, void, (CURL *))                                                     \
    X(curl_easy_reset, void, (CURL *))                                                       \
    X(curl_easy_setopt, CURLcode, (CURL *, CURLoption, ...))                                 \
    X(curl_easy_getinfo, CURLcode, (CURL *, CURLINFO, ...))                                  \
    X(curl_easy_perform, CURLcode, (CURL *))                                                 \
    X(curl_easy_strerror, const char *, (CURLcode))                                          \
    X(curl_easy_escape, char *, (CURL *, const char *, int))                                 \
    X(curl_free, void, (void *))                                                             \
    X(curl_multi_init, CURLM *, (void))                                                      \
    X(curl_multi_cleanup, CURLMcode, (CURLM *))                                              \
    X(curl_multi_add_handle, CURLMcode, (CURLM *, CURL *))                                   \
    X(curl_multi_remove_handle, CURLMcode, (CURLM *, CURL *))                                \
    X(curl_multi_setopt, CURLMcode, (CURLM *, CURLMoption, ...))                             \
    X(curl_multi_assign, CURLMcode, (CURLM *, curl_socket_t, void *))                        \
    X(curl_multi_info_read, CURLMsg *, (CURLM *, int *))                                     \
    X(curl_multi_socket_action, CURLMcode, (CURLM *, curl_socket_t, int, int *))             \
    X(curl_multi_perform, CURLMcode, (CURLM *, int *))                                       \
    X(curl_multi_poll, CURLMcode, (CURLM *, struct curl_waitfd *, unsigned, int, int *))     \
    X(curl_multi_wakeup, CURLMcode, (CURLM *))                                               \
    X(curl_multi_strerror, const char *, (CURLMcode))                                        \
    X(curl_slist_append, struct curl_slist *, (struct curl_slist *, const char *))           \
    X(curl_slist_free_all, void, (struct curl_slist *))

/* the real names: this file calls libcurl only through the pointers */
#undef curl_easy_init
#undef curl_easy_cleanup
#undef curl_easy_reset
#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_easy_perform
#undef curl_easy_strerror
#undef curl_easy_escape
#undef curl_free
#undef curl_multi_init
#undef curl_multi_cleanup
#undef curl_multi_add_handle
#undef curl_multi_remove_handle
#undef curl_multi_setopt
#undef curl_multi_assign
#undef curl_multi_info_read
#undef curl_multi_socket_action
#undef curl_multi_perform
#undef curl_multi_poll
#undef curl_multi_wakeup
#undef curl_multi_strerror
#undef curl_slist_append
#undef curl_slist_free_all

static struct {
    pthread_once_t once;
    int ok;
    char err[512];
#define X(name, ret, params) ret(*name) params;
    TB_CURL_FUNCS(X)
#undef X
} lib = {.once = PTHREAD_ONCE_INIT};

static void curl_load(void) {
    const char *names[] = {"libcurl.so.4", "libcurl.so", NULL};
    char why[400];
    void *h = tb_dl_open_first(names, why, sizeof why);
    if (!h) {
        snprintf(lib.err, sizeof lib.err, "libcurl cannot be loaded: %s", why);
        tb_log(TB_LOG_ERROR, "%s", lib.err);
        return;
    }
#define X(name, ret, params)                                                                       \
    if (!(*(void **)&lib.name = dlsym(h, #name))) {                                                \
        snprintf(lib.err, sizeof lib.err, "the libcurl found (libcurl.so.4) lacks %s: it is older " \
                 "than the %s it was built with", #name, LIBCURL_VERSION);                         \
        tb_log(TB_LOG_ERROR, "%s", lib.err);                                                       \
        return;                                                                                    \
    }
    TB_CURL_FUNCS(X)
#undef X
    lib.ok = 1;
}

static int loaded(void) {
    pthread_once(&lib.once, curl_load);
    return lib.ok;
}

tb_status tb_curl_load(void) { return loaded() ? TB_OK : tb_errorf(TB_ERR_UNSUPPORTED, "%s", lib.err); }

CURL *tb_curl_easy_init(void) { return loaded() ? lib.curl_easy_init() : NULL; }
void tb_curl_easy_cleanup(CURL *e) { if (loaded()) lib.curl_easy_cleanup(e); }
void tb_curl_easy_reset(CURL *e) { if (loaded()) lib.curl_easy_reset(e); }
CURLcode tb_curl_easy_perform(CURL *e) { return loaded() ? lib.curl_easy_perform(e) : CURLE_FAILED_INIT; }
const char *tb_curl_easy_strerror(CURLcode c) { return loaded() ? lib.curl_easy_strerror(c) : lib.err; }
char *tb_curl_easy_escape(CURL *e, const char *s, int len) { return loaded() ? lib.curl_easy_escape(e, s, len) : NULL; }
void tb_curl_free(void *p) { if (loaded()) lib.curl_free(p); }

CURLcode tb_curl_easy_setopt(CURL *e, CURLoption opt, ...) {
    if (!loaded()) return CURLE_FAILED_INIT;
    va_list ap;
    va_start(ap, opt);
    CURLcode rc;
    if (opt < CURLOPTTYPE_OBJECTPOINT) rc = lib.curl_easy_setopt(e, opt, va_arg(ap, long));
    else if (opt >= CURLOPTTYPE_OFF_T && opt < CURLOPTTYPE_BLOB) rc = lib.curl_easy_setopt(e, opt, va_arg(ap, curl_off_t));
    else rc = lib.curl_easy_setopt(e, opt, va_arg(ap, void *)); /* data, function and blob pointers */
    va_end(ap);
    return rc;
}

CURLcode tb_curl_easy_getinfo(CURL *e, CURLINFO info, ...) {
    if (!loaded()) return CURLE_FAILED_INIT;
    va_list ap;
    va_start(ap, info);
    CURLcode rc = lib.curl_easy_getinfo(e, info, va_arg(ap, void *)); /* always a pointer to the result */
    va_end(ap);
    return rc;
}

CURLM *tb_curl_multi_init(void) { return loaded() ? lib.curl_multi_init() : NULL; }
CURLMcode tb_curl_multi_cleanup(CURLM *m) { return loaded() ? lib.curl_multi_cleanup(m) : CURLM_INTERNAL_ERROR; }
CURLMcode tb_curl_multi_add_handle(CURLM *m, CURL *e) {
    return loaded() ? lib.curl_multi_add_handle(m, e) : CURLM_INTERNAL_ERROR;
}
CURLMcode tb_curl_multi_remove_handle(CURLM *m, CURL *e) {
    return loaded() ? lib.curl_multi_remove_handle(m, e) : CURLM_INTERNAL_ERROR;
}
CURLMcode tb_curl_multi_setopt(CURLM *m, CURLMoption opt, ...) {
    if (!loaded()) return CURLM_INTERNAL_ERROR;
    va_list ap;
    va_start(ap, opt);
    CURLMcode rc;
    if (opt < CURLOPTTYPE_OBJECTPOINT) rc = lib.curl_multi_setopt(m, opt, va_arg(ap, long));
    else if (opt >= CURLOPTTYPE_OFF_T && opt < CURLOPTTYPE_BLOB) rc = lib.curl_multi_setopt(m, opt, va_arg(ap, curl_off_t));
    else rc = lib.curl_multi_setopt(m, opt, va_arg(ap, void *));
    va_end(ap);
    return rc;
}
CURLMcode tb_curl_multi_assign(CURLM *m, curl_socket_t fd, void *p) {
    return loaded() ? lib.curl_multi_assign(m, fd, p) : CURLM_INTERNAL_ERROR;
}
CURLMsg *tb_curl_multi_info_read(CURLM *m, int *left) { return loaded() ? lib.curl_multi_info_read(m, left) : NULL; }
CURLMcode tb_curl_multi_socket_action(CURLM *m, curl_socket_t fd, int ev, int *running) {
    return loaded() ? lib.curl_multi_socket_action(m, fd, ev, running) : CURLM_INTERNAL_ERROR;
}
CURLMcode tb_curl_multi_perform(CURLM *m, int *running) {
    return loaded() ? lib.curl_multi_perform(m, running) : CURLM_INTERNAL_ERROR;
}
CURLMcode tb_curl_multi_poll(CURLM *m, struct curl_waitfd *fds, unsigned n, int timeout_ms, int *numfds) {
    return loaded() ? lib.curl_multi_poll(m, fds, n, timeout_ms, numfds) : CURLM_INTERNAL_ERROR;
}
CURLMcode tb_curl_multi_wakeup(CURLM *m) { return loaded() ? lib.curl_multi_wakeup(m) : CURLM_INTERNAL_ERROR; }
const char *tb_curl_multi_strerror(CURLMcode c) { return loaded() ? lib.curl_multi_strerror(c) : lib.err; }
struct curl_slist *tb_curl_slist_append(struct curl_slist *l, const char *s) {
    return loaded() ? lib.curl_slist_append(l, s) : NULL;
}
void tb_curl_slist_free_all(struct curl_slist *l) { if (loaded()) lib.curl_slist_free_all(l); }
