/* bench_cli.c — `turbine bench`. */
#include <stdio.h>

#include "cli.h"

int tb_cli_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "turbine: bench is not available in this build\n");
    return 2;
}
