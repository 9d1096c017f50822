/* cli_util.c — argument parsing shared by the subcommands. */
#include <errno.h>
#include <stdlib.h>

#include "cli.h"

int tb_cli_parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}
