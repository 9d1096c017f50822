/* log.c — leveled logging to stderr. */
#include "core.h"

static tb_log_level tb_level = TB_LOG_WARN;

void tb_log_set_level(tb_log_level l) { tb_level = l; }

void tb_log(tb_log_level l, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (l > tb_level) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "turbine %s: ", names[l]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
