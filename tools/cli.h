/* cli.h — the subcommands and the option tables they are parsed from.
 *
 * Each subcommand (except bench, which keeps its own parser) describes its
 * options in one table of tb_cli_opt rows: name, alias, value kind and range,
 * default text, help text and where the parsed value goes (an offset into
 * the command's argument struct). One generic parser reads argv through that
 * table, and the same table prints `turbine CMD --help`, the README's command
 * synopsis and docs/COMMANDS.md (`turbine help --markdown`), so a flag cannot
 * be parsed without being documented. Adding an option is one row.
 *
 * Exit codes of every command: 0 ok, 1 runtime or input error, 2 usage error.
 */
#ifndef TB_CLI_H
#define TB_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------- tables */

typedef enum {
    TB_OPT_FLAG,   /* int, set to .flag_value; takes no value                    */
    TB_OPT_INT,    /* int in [lo, hi]                                            */
    TB_OPT_U64,    /* uint64_t, any decimal                                      */
    TB_OPT_FLOAT,  /* double in lo..hi (TB_OPT_LO_OPEN/HI_OPEN: bound excluded)  */
    TB_OPT_SIZE,   /* size_t bytes: 512MiB, 2G, 1T...; in [lo, hi]               */
    TB_OPT_STR,    /* const char *                                               */
    TB_OPT_CHOICE, /* const char *, one of the '|'-separated words of .metavar   */
    TB_OPT_STRS,   /* tb_cli_strs: one or more values                            */
} tb_opt_kind;

enum {
    TB_OPT_LO_OPEN = 1,  /* FLOAT: lo itself is out of range        */
    TB_OPT_HI_OPEN = 2,  /* FLOAT: hi itself is out of range        */
    TB_OPT_REQUIRED = 4, /* must be given                           */
    TB_OPT_SEE_ALSO = 8, /* an alternative form: help only, not in the synopsis */
};

typedef struct {
    const char *name;    /* "--max-seq-len" or a short "-n"                         */
    const char *alias;   /* another spelling ("-o", "--model-name") or NULL         */
    tb_opt_kind kind;
    const char *metavar; /* "N", "FILE"; CHOICE: "f32|f16|bf16"                      */
    double lo, hi;       /* INT, FLOAT, SIZE: the accepted range                    */
    unsigned flags;      /* TB_OPT_*                                                */
    int group;           /* > 0: exactly one option of the group must be given      */
    int flag_value;      /* FLAG: the value stored                                  */
    size_t off;          /* where the value goes in the command's argument struct   */
    const char *def;     /* default, as help shows it; NULL: none worth saying      */
    const char *help;
} tb_cli_opt;

#define TB_CLI_MAX_STRS 16
typedef struct {
    const char *v[TB_CLI_MAX_STRS];
    int n;
} tb_cli_strs;

#define TB_CLI_MAX_POS 2
typedef struct {
    const char *name;              /* "serve"                                          */
    const char *summary;           /* one line                                         */
    const char *pos[TB_CLI_MAX_POS];     /* positional metavars, in order ("FILE.engine") */
    size_t pos_off[TB_CLI_MAX_POS];      /* const char * fields they go to            */
    int n_pos, n_pos_required;
    const tb_cli_opt *opts;
    int n_opts;
    const char *notes;             /* paragraphs after the options, or NULL             */
    size_t args_size;              /* the argument struct, for `turbine help --parse`  */
    void (*args_default)(void *args);
} tb_cli_cmd;

/* Parses argv (the arguments after the command's name) into args, which
 * holds the defaults. Returns -1 to go on, 0 when --help was printed (exit
 * 0), 2 after printing a usage error (exit 2). */
int tb_cli_parse(const tb_cli_cmd *cmd, int argc, char **argv, void *args);
/* `turbine CMD --help`. */
void tb_cli_print_help(const tb_cli_cmd *cmd, FILE *f);
/* The command's one-line synopsis ("turbine run FILE.engine (-p ...) [...]"),
 * wrapped at `width` columns with continuation lines indented. */
void tb_cli_print_synopsis(const tb_cli_cmd *cmd, FILE *f, int width);
/* The command's section of docs/COMMANDS.md. */
void tb_cli_print_markdown(const tb_cli_cmd *cmd, FILE *f);
/* Prints every field of a parsed argument struct ("--name value" lines). */
void tb_cli_print_values(const tb_cli_cmd *cmd, const void *args, FILE *f);
/* A value the parser accepts for opt (for the table's self-test), or NULL
 * for a flag. */
const char *tb_cli_example_value(const tb_cli_opt *opt, char *buf, size_t cap);

/* Prints "turbine CMD: error: ...\n(see turbine CMD --help)" and returns 2. */
int tb_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- commands */

extern const tb_cli_cmd tb_cmd_serve;
extern const tb_cli_cmd tb_cmd_perplexity;
extern const tb_cli_cmd tb_cmd_exec;

/* `turbine bench ...` (argv[0] is the first argument after "bench"). */
int tb_cli_bench(int argc, char **argv);
/* `turbine serve ...` */
int tb_cli_serve(int argc, char **argv);
/* `turbine exec ...` */
int tb_cli_exec(int argc, char **argv);
/* `turbine perplexity ...` */
int tb_cli_perplexity(int argc, char **argv);
/* `turbine compare ...` */
extern const tb_cli_cmd tb_cmd_compare;
int tb_cli_compare(int argc, char **argv);

/* Scoring a text (perplexity_cli.c; compare uses the same): the text of
 * `path` (at most 256 MiB) tokenized with the engine's tokenizer, BOS first
 * when the engine adds one (prints the error and returns 0 on failure;
 * *toks malloc'd); -log softmax(row)[target] in double; and the inputs of
 * the window starting at `start` of n tokens cut in windows of ctx (each
 * row predicting the next token; a remainder shorter than a window is left
 * out when the text fills one): 0 when there is none. */
struct tb_engine;
int tb_cli_text_tokens(const struct tb_engine *e, const char *path, int32_t **toks, int *n);
double tb_cli_nll(const float *row, int V, int target);
int tb_cli_window(int n, int ctx, int start);

/* ---------------------------------------------------------------- values */

/* Parses a whole decimal integer in [lo, hi]; 0 when it is not one. */
int tb_cli_parse_int(const char *s, int lo, int hi, int *out);
/* Parses a size: a decimal number (a fraction allowed) with an optional
 * unit K, M, G or T, each also written KB/KiB, MB/MiB, GB/GiB, TB/TiB (any
 * case); every unit is binary (K = KB = KiB = 1024). Returns 1, 0 for a
 * malformed size, -1 for one that does not fit in size_t. */
int tb_cli_parse_size(const char *s, size_t *out);
/* Parses a comma list of token ids in [0, vocab), at most `max` of them, into
 * ids; on a bad list prints "turbine: error: OPT: ..." and returns 0. */
int tb_cli_parse_ids(const char *opt, const char *s, int vocab, int32_t *ids, int max, int *n);

/* Help texts of the options several commands share (one wording each). */
#define TB_CLI_HELP_ENGINE "the engine, as an option (same as the positional FILE.engine)"
#define TB_CLI_HELP_DEVICE "where to run; must match what the engine was built for"
#define TB_CLI_HELP_KV_DTYPE                                                                                    \
    "the KV cache's element type; auto: the engine's activation dtype (f32, f16 or bf16), and f16 for an " \
    "int8, int4 or fp8 engine; int8, fp8: one-byte codes with a scale per token and head (CPU and GPU), " \
    "about twice the tokens of f16 in the same memory"

#endif
