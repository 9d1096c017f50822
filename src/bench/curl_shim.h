/*
 * curl_shim.h — libcurl for the load tester, loaded with dlopen on first use.
 *
 * Linking libcurl made every turbine command map it and its long tail of
 * libraries (gnutls, krb5, ldap, ssh2, ...) before main: a large share of
 * the start-up time of `turbine --help`. Only `turbine bench` uses it, so
 * the files that call libcurl include this header instead of
 * <curl/curl.h>: it keeps curl's types and constants and renames the
 * functions to wrappers (curl_shim.c) that load libcurl.so.4 the first time
 * one of them is called. The code calling libcurl reads as before.
 *
 * When libcurl cannot be loaded the wrappers fail the way libcurl reports
 * failure (NULL handles, CURLE_FAILED_INIT, CURLM_INTERNAL_ERROR) and the
 * reason is logged once; tb_curl_load() returns it as a tb_status for a
 * caller that wants to check first.
 */
#ifndef TB_CURL_SHIM_H
#define TB_CURL_SHIM_H

#define CURL_DISABLE_TYPECHECK /* the wrappers are plain functions */
#include <curl/curl.h>

#include "core/core.h"

/* Loads libcurl once; TB_ERR_UNSUPPORTED naming the missing library. */
tb_status tb_curl_load(void);

CURL *tb_curl_easy_init(void);
void tb_curl_easy_cleanup(CURL *e);
void tb_curl_easy_reset(CURL *e);
CURLcode tb_curl_easy_setopt(CURL *e, CURLoption opt, ...);
CURLcode tb_curl_easy_getinfo(CURL *e, CURLINFO info, ...);
CURLcode tb_curl_easy_perform(CURL *e);
const char *tb_curl_easy_strerror(CURLcode c);
char *tb_curl_easy_escape(CURL *e, const char *s, int len);
void tb_curl_free(void *p);
CURLM *tb_curl_multi_init(void);
CURLMcode tb_curl_multi_cleanup(CURLM *m);
CURLMcode tb_curl_multi_add_handle(CURLM *m, CURL *e);
CURLMcode tb_curl_multi_remove_handle(CURLM *m, CURL *e);
CURLMcode tb_curl_multi_setopt(CURLM *m, CURLMoption opt, ...);
CURLMcode tb_curl_multi_assign(CURLM *m, curl_socket_t fd, void *p);
CURLMsg *tb_curl_multi_info_read(CURLM *m, int *left);
CURLMcode tb_curl_multi_socket_action(CURLM *m, curl_socket_t fd, int ev, int *running);
CURLMcode tb_curl_multi_perform(CURLM *m, int *running);
CURLMcode tb_curl_multi_poll(CURLM *m, struct curl_waitfd *fds, unsigned n, int timeout_ms, int *numfds);
CURLMcode tb_curl_multi_wakeup(CURLM *m);
const char *tb_curl_multi_strerror(CURLMcode c);
struct curl_slist *tb_curl_slist_append(struct curl_slist *l, const char *s);
void tb_curl_slist_free_all(struct curl_slist *l);

/* curl.h defines these three as macros that check the argument count */
#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_multi_setopt
#define curl_easy_init tb_curl_easy_init
#define curl_easy_cleanup tb_curl_easy_cleanup
#define curl_easy_reset tb_curl_easy_reset
#define curl_easy_setopt tb_curl_easy_setopt
#define curl_easy_getinfo tb_curl_easy_getinfo
#define curl_easy_perform tb_curl_easy_perform
#define curl_easy_strerror tb_curl_easy_strerror
#define curl_easy_escape tb_curl_easy_escape
#define curl_free tb_curl_free
#define curl_multi_init tb_curl_multi_init
#define curl_multi_cleanup tb_curl_multi_cleanup
#define curl_multi_add_handle tb_curl_multi_add_handle
#define curl_multi_remove_handle tb_curl_multi_remove_handle
#define curl_multi_setopt tb_curl_multi_setopt
#define curl_multi_assign tb_curl_multi_assign
#define curl_multi_info_read tb_curl_multi_info_read
#define curl_multi_socket_action tb_curl_multi_socket_action
#define curl_multi_perform tb_curl_multi_perform
#define curl_multi_poll tb_curl_multi_poll
#define curl_multi_wakeup tb_curl_multi_wakeup
#define curl_multi_strerror tb_curl_multi_strerror
#define curl_slist_append tb_curl_slist_append
#define curl_slist_free_all tb_curl_slist_free_all

#endif /* TB_CURL_SHIM_H */
