/*
 * mhd_shim.c — the wrappers of mhd_shim.h: libmicrohttpd's functions through
 * pointers filled by dlsym the first time any of them is called.
 *
 * The variadic start function forwards its options to MHD_start_daemon_va;
 * the two variadic info getters take no extra argument for any info type
 * this version of the library defines, so none is forwarded.
 */
#define _GNU_SOURCE
#include <microhttpd.h>

#include <dlfcn.h>
#include <pthread.h>

#include "core/core.h"

tb_status tb_mhd_load(void);

/* X(name, return type, parameters): every function the wrappers reach */
#define TB_MHD_FUNCS(X)                                                                                       \
    X(MHD_start_daemon_va, struct MHD_Daemon *,                                                               \
      (unsigned int, uint16_t, MHD_AcceptPolicyCallback, void *, MHD_AccessHandlerCallback, void *, va_list)) \
    X(MHD_stop_daemon, void, (struct MHD_Daemon *))                                                           \
    X(MHD_quiesce_daemon, MHD_socket, (struct MHD_Daemon *))                                                  \
    X(MHD_get_daemon_info, const union MHD_DaemonInfo *, (struct MHD_Daemon *, enum MHD_DaemonInfoType, ...)) \
    X(MHD_get_connection_info, const union MHD_ConnectionInfo *,                                              \
      (struct MHD_Connection *, enum MHD_ConnectionInfoType, ...))                                            \
    X(MHD_lookup_connection_value, const char *, (struct MHD_Connection *, enum MHD_ValueKind, const char *)) \
    X(MHD_get_connection_values, int,                                                                         \
      (struct MHD_Connection *, enum MHD_ValueKind, MHD_KeyValueIterator, void *))                            \
    X(MHD_queue_response, enum MHD_Result, (struct MHD_Connection *, unsigned int, struct MHD_Response *))    \
    X(MHD_suspend_connection, void, (struct MHD_Connection *))                                                \
    X(MHD_resume_connection, void, (struct MHD_Connection *))                                                 \
    X(MHD_create_response_from_buffer, struct MHD_Response *, (size_t, void *, enum MHD_ResponseMemoryMode))  \
    X(MHD_create_response_from_callback, struct MHD_Response *,                                               \
      (uint64_t, size_t, MHD_ContentReaderCallback, void *, MHD_ContentReaderFreeCallback))                   \
    X(MHD_add_response_header, enum MHD_Result, (struct MHD_Response *, const char *, const char *))          \
    X(MHD_del_response_header, enum MHD_Result, (struct MHD_Response *, const char *, const char *))          \
    X(MHD_get_response_header, const char *, (struct MHD_Response *, const char *))                           \
    X(MHD_destroy_response, void, (struct MHD_Response *))

static struct {
    pthread_once_t once;
    int ok;
    char err[512];
#define X(name, ret, params) ret(*name) params;
    TB_MHD_FUNCS(X)
#undef X
} lib = {.once = PTHREAD_ONCE_INIT};

static void mhd_load(void) {
    const char *names[] = {"libmicrohttpd.so.12", "libmicrohttpd.so", NULL};
    char why[400];
    void *h = tb_dl_open_first(names, why, sizeof why);
    if (!h) {
        snprintf(lib.err, sizeof lib.err, "libmicrohttpd cannot be loaded: %s", why);
        tb_log(TB_LOG_ERROR, "%s", lib.err);
        return;
    }
#define X(name, ret, params)                                                                              \
    if (!(*(void **)&lib.name = dlsym(h, #name))) {                                                       \
        snprintf(lib.err, sizeof lib.err, "the libmicrohttpd found lacks %s: it is older than the one " \
                 "turbine was built with", #name);                                                        \
        tb_log(TB_LOG_ERROR, "%s", lib.err);                                                              \
        return;                                                                                           \
    }
    TB_MHD_FUNCS(X)
#undef X
    lib.ok = 1;
}

static int loaded(void) {
    pthread_once(&lib.once, mhd_load);
    return lib.ok;
}

tb_status tb_mhd_load(void) { return loaded() ? TB_OK : tb_errorf(TB_ERR_UNSUPPORTED, "%s", lib.err); }

struct MHD_Daemon *tb_mhd_start_daemon(unsigned int flags, uint16_t port, MHD_AcceptPolicyCallback apc,
                                       void *apc_cls, MHD_AccessHandlerCallback dh, void *dh_cls, ...) {
    if (!loaded()) return NULL;
    va_list ap;
    va_start(ap, dh_cls);
    struct MHD_Daemon *d = lib.MHD_start_daemon_va(flags, port, apc, apc_cls, dh, dh_cls, ap);
    va_end(ap);
    return d;
}
void tb_mhd_stop_daemon(struct MHD_Daemon *d) { if (loaded()) lib.MHD_stop_daemon(d); }
MHD_socket tb_mhd_quiesce_daemon(struct MHD_Daemon *d) { return loaded() ? lib.MHD_quiesce_daemon(d) : MHD_INVALID_SOCKET; }
const union MHD_DaemonInfo *tb_mhd_get_daemon_info(struct MHD_Daemon *d, enum MHD_DaemonInfoType t, ...) {
    return loaded() ? lib.MHD_get_daemon_info(d, t) : NULL;
}
const union MHD_ConnectionInfo *tb_mhd_get_connection_info(struct MHD_Connection *c,
                                                           enum MHD_ConnectionInfoType t, ...) {
    return loaded() ? lib.MHD_get_connection_info(c, t) : NULL;
}
const char *tb_mhd_lookup_connection_value(struct MHD_Connection *c, enum MHD_ValueKind kind, const char *key) {
    return loaded() ? lib.MHD_lookup_connection_value(c, kind, key) : NULL;
}
int tb_mhd_get_connection_values(struct MHD_Connection *c, enum MHD_ValueKind kind, MHD_KeyValueIterator it,
                                 void *cls) {
    return loaded() ? lib.MHD_get_connection_values(c, kind, it, cls) : -1;
}
enum MHD_Result tb_mhd_queue_response(struct MHD_Connection *c, unsigned int status, struct MHD_Response *r) {
    return loaded() ? lib.MHD_queue_response(c, status, r) : MHD_NO;
}
void tb_mhd_suspend_connection(struct MHD_Connection *c) { if (loaded()) lib.MHD_suspend_connection(c); }
void tb_mhd_resume_connection(struct MHD_Connection *c) { if (loaded()) lib.MHD_resume_connection(c); }
struct MHD_Response *tb_mhd_create_response_from_buffer(size_t size, void *buf, enum MHD_ResponseMemoryMode mode) {
    return loaded() ? lib.MHD_create_response_from_buffer(size, buf, mode) : NULL;
}
struct MHD_Response *tb_mhd_create_response_from_callback(uint64_t size, size_t block, MHD_ContentReaderCallback crc,
                                                          void *crc_cls, MHD_ContentReaderFreeCallback crfc) {
    return loaded() ? lib.MHD_create_response_from_callback(size, block, crc, crc_cls, crfc) : NULL;
}
enum MHD_Result tb_mhd_add_response_header(struct MHD_Response *r, const char *h, const char *v) {
    return loaded() ? lib.MHD_add_response_header(r, h, v) : MHD_NO;
}
enum MHD_Result tb_mhd_del_response_header(struct MHD_Response *r, const char *h, const char *v) {
    return loaded() ? lib.MHD_del_response_header(r, h, v) : MHD_NO;
}
const char *tb_mhd_get_response_header(struct MHD_Response *r, const char *key) {
    return loaded() ? lib.MHD_get_response_header(r, key) : NULL;
}
void tb_mhd_destroy_response(struct MHD_Response *r) { if (loaded()) lib.MHD_destroy_response(r); }
