/* cli_util.c — argument parsing shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
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

int tb_cli_parse_ids(const char *opt, const char *s, int vocab, int32_t *ids, int max, int *n) {
    *n = 0;
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= vocab) {
            fprintf(stderr, "turbine: error: %s: '%s' is not a token id in [0, %d)\n", opt, p, vocab);
            return 0;
        }
        if (*n >= max) {
            fprintf(stderr, "turbine: error: %s: more than %d tokens (the engine's context)\n", opt, max);
            return 0;
        }
        ids[(*n)++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "turbine: error: %s: expected ',' at '%s'\n", opt, p);
            return 0;
        }
    }
    return 1;
}
