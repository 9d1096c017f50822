/* cli.h — subcommands implemented outside turbine.c. Each returns the
 * process exit code (0 ok, 1 error, 2 usage). */
#ifndef TB_CLI_H
#define TB_CLI_H

#include <stdint.h>

/* `turbine bench ...` (argv[0] is the first argument after "bench"). */
int tb_cli_bench(int argc, char **argv);
/* `turbine serve ...` */
int tb_cli_serve(int argc, char **argv);
/* `turbine perplexity ...` */
int tb_cli_perplexity(int argc, char **argv);

/* Parses a whole decimal integer in [lo, hi]; 0 when it is not one. */
int tb_cli_parse_int(const char *s, int lo, int hi, int *out);
/* Parses a comma list of token ids in [0, vocab), at most `max` of them, into
 * ids; on a bad list prints "turbine: error: OPT: ..." and returns 0. */
int tb_cli_parse_ids(const char *opt, const char *s, int vocab, int32_t *ids, int max, int *n);

#endif
