/*
 * mhd_shim.h — libmicrohttpd for the server, loaded with dlopen on first use.
 *
 * Linking libmicrohttpd made every turbine command map it and GnuTLS behind
 * it (with p11-kit, nettle, gmp, ...) and run their initialisers before
 * main: several milliseconds of each `turbine --help`. Only `turbine serve`
 * uses it, so the server includes this header instead of <microhttpd.h>: it
 * keeps the library's types and constants and renames the functions to
 * wrappers (mhd_shim.c) that load libmicrohttpd.so.12 the first time one is
 * called. The server's code reads as before.
 *
 * When the library cannot be loaded the wrappers fail as the library
 * reports failure (NULL, MHD_NO) and log the reason once.
 */
#ifndef TB_MHD_SHIM_H
#define TB_MHD_SHIM_H

#include <microhttpd.h>

#include "core/core.h"

/* Loads libmicrohttpd once; TB_ERR_UNSUPPORTED naming the missing library. */
tb_status tb_mhd_load(void);

struct MHD_Daemon *tb_mhd_start_daemon(unsigned int flags, uint16_t port, MHD_AcceptPolicyCallback apc,
                                       void *apc_cls, MHD_AccessHandlerCallback dh, void *dh_cls, ...);
void tb_mhd_stop_daemon(struct MHD_Daemon *d);
MHD_socket tb_mhd_quiesce_daemon(struct MHD_Daemon *d);
const union MHD_DaemonInfo *tb_mhd_get_daemon_info(struct MHD_Daemon *d, enum MHD_DaemonInfoType t, ...);
const union MHD_ConnectionInfo *tb_mhd_get_connection_info(struct MHD_Connection *c,
                                                           enum MHD_ConnectionInfoType t, ...);
const char *tb_mhd_lookup_connection_value(struct MHD_Connection *c, enum MHD_ValueKind kind, const char *key);
int tb_mhd_get_connection_values(struct MHD_Connection *c, enum MHD_ValueKind kind, MHD_KeyValueIterator it,
                                 void *cls);
enum MHD_Result tb_mhd_queue_response(struct MHD_Connection *c, unsigned int status, struct MHD_Response *r);
void tb_mhd_suspend_connection(struct MHD_Connection *c);
void tb_mhd_resume_connection(struct MHD_Connection *c);
struct MHD_Response *tb_mhd_create_response_from_buffer(size_t size, void *buf, enum MHD_ResponseMemoryMode mode);
struct MHD_Response *tb_mhd_create_response_from_callback(uint64_t size, size_t block, MHD_ContentReaderCallback crc,
                                                          void *crc_cls, MHD_ContentReaderFreeCallback crfc);
enum MHD_Result tb_mhd_add_response_header(struct MHD_Response *r, const char *h, const char *v);
enum MHD_Result tb_mhd_del_response_header(struct MHD_Response *r, const char *h, const char *v);
const char *tb_mhd_get_response_header(struct MHD_Response *r, const char *key);
void tb_mhd_destroy_response(struct MHD_Response *r);

#define MHD_start_daemon tb_mhd_start_daemon
#define MHD_stop_daemon tb_mhd_stop_daemon
#define MHD_quiesce_daemon tb_mhd_quiesce_daemon
#define MHD_get_daemon_info tb_mhd_get_daemon_info
#define MHD_get_connection_info tb_mhd_get_connection_info
#define MHD_lookup_connection_value tb_mhd_lookup_connection_value
#define MHD_get_connection_values tb_mhd_get_connection_values
#define MHD_queue_response tb_mhd_queue_response
#define MHD_suspend_connection tb_mhd_suspend_connection
#define MHD_resume_connection tb_mhd_resume_connection
#define MHD_create_response_from_buffer tb_mhd_create_response_from_buffer
#define MHD_create_response_from_callback tb_mhd_create_response_from_callback
#define MHD_add_response_header tb_mhd_add_response_header
#define MHD_del_response_header tb_mhd_del_response_header
#define MHD_get_response_header tb_mhd_get_response_header
#define MHD_destroy_response tb_mhd_destroy_response

#endif /* TB_MHD_SHIM_H */
