/* status.c — status names and the per-thread error message. */
#include "core.h"

static _Thread_local char tb_err_msg[1024];
static _Thread_local tb_status tb_err_code;

const char *tb_status_str(tb_status s) {
    switch (s) {
    case TB_OK: return "ok";
    case TB_ERR_INVALID_ARG: return "invalid argument";
    case TB_ERR_IO: return "i/o error";
    case TB_ERR_FORMAT: return "malformed file";
    case TB_ERR_UNSUPPORTED: return "unsupported";
    case TB_ERR_NOT_FOUND: return "not found";
    case TB_ERR_VERSION: return "unsupported format version";
    case TB_ERR_HARDWARE: return "hardware mismatch";
    case TB_ERR_CHECKSUM: return "checksum mismatch";
    case TB_ERR_OOM: return "out of memory";
    case TB_ERR_RANGE: return "out of range";
    case TB_ERR_INTERNAL: return "internal error";
    case TB_ERR_QUEUE_FULL: return "queue full";
    case TB_ERR_TIMEOUT: return "timed out";
    }
    return "unknown status";
}

const char *tb_last_error(void) { return tb_err_msg; }
void tb_error_clear(void) { tb_err_msg[0] = 0; tb_err_code = TB_OK; }
tb_status tb_last_status(void) { return tb_err_code; }

tb_status tb_errorf(tb_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tb_err_msg, sizeof tb_err_msg, fmt, ap);
    va_end(ap);
    tb_err_code = code;
    return code;
}

tb_status tb_error_prefix(tb_status code, const char *fmt, ...) {
    char prefix[512], old[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tb_err_msg, sizeof old);
    snprintf(tb_err_msg, sizeof tb_err_msg, "%s: %s", prefix, old);
    return code;
}
