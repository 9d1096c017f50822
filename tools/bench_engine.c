/* bench_engine.c — `turbine bench --engine`: placeholder. */
#include <stdio.h>

int tb_bench_engine_main(int argc, char **argv);

int tb_bench_engine_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "turbine bench: --engine is not available yet\n");
    return 2;
}
