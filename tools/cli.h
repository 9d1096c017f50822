/* cli.h — subcommands implemented outside turbine.c. Each returns the
 * process exit code (0 ok, 1 error, 2 usage). */
#ifndef TB_CLI_H
#define TB_CLI_H

/* `turbine bench ...` (argv[0] is the first argument after "bench"). */
int tb_cli_bench(int argc, char **argv);
/* `turbine serve ...` */
int tb_cli_serve(int argc, char **argv);
/* `turbine perplexity ...` */
int tb_cli_perplexity(int argc, char **argv);

/* Parses a whole decimal integer in [lo, hi]; 0 when it is not one. */
int tb_cli_parse_int(const char *s, int lo, int hi, int *out);

#endif
