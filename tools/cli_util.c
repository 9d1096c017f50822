/* cli_util.c — the generic option parser over the tables of cli.h, the help,
 * synopsis and Markdown printers that read the same tables, and the value
 * parsers (integers, sizes, token-id lists) every command shares. */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

#define TB_CLI_MAX_OPTS 64
#define HELP_COL 30   /* help text starts here in `--help`      */
#define HELP_WIDTH 100
#define NBSP '\x01'  /* a space put_wrapped never breaks at (inside "0 < P <= 1") */

/* ================================================================ values */

int tb_cli_parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

int tb_cli_parse_size(const char *s, size_t *out) {
    /* digits first: no sign, no hex, no "inf"/"nan" that strtold takes */
    if (!((*s >= '0' && *s <= '9') || (*s == '.' && s[1] >= '0' && s[1] <= '9'))) return 0;
    char *end;
    errno = 0;
    long double v = strtold(s, &end);
    if (errno || end == s) return 0;
    static const struct { const char *u[3]; int shift; } units[] = {
        {{"b", "", ""}, 0},
        {{"k", "kb", "kib"}, 10},
        {{"m", "mb", "mib"}, 20},
        {{"g", "gb", "gib"}, 30},
        {{"t", "tb", "tib"}, 40},
    };
    int shift = -1;
    if (!*end) shift = 0;
    for (size_t i = 0; shift < 0 && i < sizeof units / sizeof units[0]; i++)
        for (int k = 0; k < 3; k++)
            if (*units[i].u[k] && !strcasecmp(end, units[i].u[k])) { shift = units[i].shift; break; }
    if (shift < 0) return 0;
    long double bytes = ldexpl(v, shift);
    /* long double holds every integer below 2^64 exactly on the hosts we
     * build for; a size must fit size_t, not wrap */
    if (!(bytes >= 0)) return 0;
    if (bytes >= ldexpl(1.0L, (int)(sizeof(size_t) * 8))) return -1;
    *out = (size_t)bytes;
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

/* "1GiB", "512KiB" or a plain byte count: the largest unit that divides. */
static const char *fmt_size(double bytes, char *buf, size_t cap) {
    static const char *names[] = {"", "KiB", "MiB", "GiB", "TiB"};
    unsigned long long b = (unsigned long long)bytes;
    int u = 0;
    while (u < 4 && b >= 1024 && b % 1024 == 0) { b /= 1024; u++; }
    snprintf(buf, cap, "%llu%s", b, names[u]);
    return buf;
}

static const char *fmt_num(double v, char *buf, size_t cap) {
    snprintf(buf, cap, "%.10g", v);
    return buf;
}

/* ================================================================ errors */

int tb_cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "turbine %s: error: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see turbine %s --help)\n", cmd);
    va_end(ap);
    return 2;
}

/* The range an option accepts, worded for an error message: "between 1 and
 * 1048576", "in (0, 1]", "at least 0". Empty when any value goes. */
static const char *range_words(const tb_cli_opt *o, char *buf, size_t cap) {
    char a[48], b[48];
    buf[0] = 0;
    if (o->kind == TB_OPT_INT) {
        if (o->hi >= INT_MAX) snprintf(buf, cap, "at least %s", fmt_num(o->lo, a, sizeof a));
        else snprintf(buf, cap, "between %s and %s", fmt_num(o->lo, a, sizeof a), fmt_num(o->hi, b, sizeof b));
    } else if (o->kind == TB_OPT_FLOAT) {
        if (isinf(o->hi))
            snprintf(buf, cap, "%s %s", o->flags & TB_OPT_LO_OPEN ? "greater than" : "at least",
                     fmt_num(o->lo, a, sizeof a));
        else
            snprintf(buf, cap, "in %c%s, %s%c", o->flags & TB_OPT_LO_OPEN ? '(' : '[', fmt_num(o->lo, a, sizeof a),
                     fmt_num(o->hi, b, sizeof b), o->flags & TB_OPT_HI_OPEN ? ')' : ']');
    } else if (o->kind == TB_OPT_SIZE) {
        snprintf(buf, cap, "between %s and %s", fmt_size(o->lo, a, sizeof a), fmt_size(o->hi, b, sizeof b));
    }
    return buf;
}

/* The same range for help: "1 <= N <= 1048576", "0 < P <= 1". */
static const char *range_help(const tb_cli_opt *o, char *buf, size_t cap) {
    char a[48], b[48];
    const char *m = o->metavar ? o->metavar : "V";
    buf[0] = 0;
    if (o->kind == TB_OPT_INT) {
        if (o->hi >= INT_MAX) snprintf(buf, cap, "%s >= %s", m, fmt_num(o->lo, a, sizeof a));
        else snprintf(buf, cap, "%s <= %s <= %s", fmt_num(o->lo, a, sizeof a), m, fmt_num(o->hi, b, sizeof b));
    } else if (o->kind == TB_OPT_FLOAT) {
        const char *lo_op = o->flags & TB_OPT_LO_OPEN ? "<" : "<=", *hi_op = o->flags & TB_OPT_HI_OPEN ? "<" : "<=";
        if (isinf(o->hi)) snprintf(buf, cap, "%s %s %s", m, o->flags & TB_OPT_LO_OPEN ? ">" : ">=", fmt_num(o->lo, a, sizeof a));
        else snprintf(buf, cap, "%s %s %s %s %s", fmt_num(o->lo, a, sizeof a), lo_op, m, hi_op, fmt_num(o->hi, b, sizeof b));
    } else if (o->kind == TB_OPT_SIZE) {
        snprintf(buf, cap, "%s <= %s <= %s", fmt_size(o->lo, a, sizeof a), m, fmt_size(o->hi, b, sizeof b));
    }
    return buf;
}

/* ================================================================ parser */

static int choice_ok(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, v, n)) return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* "--name VALUE" spelled as the synopsis does. */
static const char *opt_words(const tb_cli_opt *o, char *buf, size_t cap) {
    if (o->kind == TB_OPT_FLAG) snprintf(buf, cap, "%s", o->name);
    else snprintf(buf, cap, "%s %s%s", o->name, o->metavar ? o->metavar : "VALUE", o->kind == TB_OPT_STRS ? " ..." : "");
    return buf;
}

/* Parses one value into its field; prints the error and returns 0 on a bad one. */
static int set_value(const tb_cli_cmd *cmd, const tb_cli_opt *o, const char *used, const char *v, char *args) {
    void *dst = args + o->off;
    char r[96];
    switch (o->kind) {
    case TB_OPT_FLAG:
        *(int *)dst = o->flag_value;
        return 1;
    case TB_OPT_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end) {
            tb_cli_usage_error(cmd->name, "%s needs an integer, got '%s'", used, v);
            return 0;
        }
        if (errno == ERANGE || x < (long long)o->lo || x > (long long)o->hi) {
            tb_cli_usage_error(cmd->name, "%s must be %s, got %s", used, range_words(o, r, sizeof r), v);
            return 0;
        }
        *(int *)dst = (int)x;
        return 1;
    }
    case TB_OPT_U64: {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (!(*v >= '0' && *v <= '9') || *end) {
            tb_cli_usage_error(cmd->name, "%s needs an unsigned integer, got '%s'", used, v);
            return 0;
        }
        if (errno == ERANGE) {
            tb_cli_usage_error(cmd->name, "%s must be at most %llu, got %s", used, (unsigned long long)UINT64_MAX, v);
            return 0;
        }
        *(uint64_t *)dst = (uint64_t)x;
        return 1;
    }
    case TB_OPT_FLOAT: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x)) {
            tb_cli_usage_error(cmd->name, "%s needs a number, got '%s'", used, v);
            return 0;
        }
        int below = o->flags & TB_OPT_LO_OPEN ? x <= o->lo : x < o->lo;
        int above = o->flags & TB_OPT_HI_OPEN ? x >= o->hi : x > o->hi;
        if (below || above) {
            tb_cli_usage_error(cmd->name, "%s must be %s, got %s", used, range_words(o, r, sizeof r), v);
            return 0;
        }
        *(double *)dst = x;
        return 1;
    }
    case TB_OPT_SIZE: {
        size_t x;
        int got = tb_cli_parse_size(v, &x);
        if (got < 0) {
            tb_cli_usage_error(cmd->name, "%s must be %s, got %s", used, range_words(o, r, sizeof r), v);
            return 0;
        }
        if (got == 0) {
            tb_cli_usage_error(cmd->name,
                               "%s needs a size such as 512MiB (a number with an optional unit K, M, G, T, "
                               "KiB, MiB, GiB, TiB), got '%s'", used, v);
            return 0;
        }
        if ((double)x < o->lo || (double)x > o->hi) {
            tb_cli_usage_error(cmd->name, "%s must be %s, got %s", used, range_words(o, r, sizeof r), v);
            return 0;
        }
        *(size_t *)dst = x;
        return 1;
    }
    case TB_OPT_CHOICE:
        if (!choice_ok(o->metavar, v)) {
            char list[128];
            snprintf(list, sizeof list, "%s", o->metavar);
            for (char *p = list; *p; p++) if (*p == '|') *p = '/';
            tb_cli_usage_error(cmd->name, "%s must be one of %s, got '%s'", used, list, v);
            return 0;
        }
        *(const char **)dst = v;
        return 1;
    case TB_OPT_STR:
        *(const char **)dst = v;
        return 1;
    case TB_OPT_STRS: {
        tb_cli_strs *l = dst;
        if (!*v) {
            tb_cli_usage_error(cmd->name, "%s needs a non-empty string", used);
            return 0;
        }
        if (l->n >= TB_CLI_MAX_STRS) {
            tb_cli_usage_error(cmd->name, "at most %d %s values", TB_CLI_MAX_STRS, o->name);
            return 0;
        }
        l->v[l->n++] = v;
        return 1;
    }
    }
    return 0;
}

static const tb_cli_opt *find_opt(const tb_cli_cmd *cmd, const char *name, size_t len) {
    for (int k = 0; k < cmd->n_opts; k++) {
        const tb_cli_opt *o = &cmd->opts[k];
        if ((strlen(o->name) == len && !strncmp(o->name, name, len)) ||
            (o->alias && strlen(o->alias) == len && !strncmp(o->alias, name, len)))
            return o;
    }
    return NULL;
}

/* The positional slot an option fills too (run's --engine FILE), or -1. */
static int pos_slot(const tb_cli_cmd *cmd, const tb_cli_opt *o) {
    if (o->kind != TB_OPT_STR) return -1;
    for (int p = 0; p < cmd->n_pos; p++)
        if (cmd->pos_off[p] == o->off) return p;
    return -1;
}

int tb_cli_parse(const tb_cli_cmd *cmd, int argc, char **argv, void *args_) {
    char *args = args_;
    unsigned char seen[TB_CLI_MAX_OPTS] = {0};
    assert(cmd->n_opts <= TB_CLI_MAX_OPTS && cmd->n_pos <= TB_CLI_MAX_POS); /* a table too long: raise the limit */
    int n_pos = 0, only_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || !a[1]) {
            /* a positional: the next slot an option has not filled */
            while (n_pos < cmd->n_pos && *(const char **)(args + cmd->pos_off[n_pos])) n_pos++;
            if (n_pos >= cmd->n_pos) return tb_cli_usage_error(cmd->name, "unexpected argument '%s'", a);
            *(const char **)(args + cmd->pos_off[n_pos++]) = a;
            continue;
        }
        if (!strcmp(a, "--")) { only_pos = 1; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tb_cli_print_help(cmd, stdout);
            return 0;
        }
        /* --name=value for every long option */
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const tb_cli_opt *o = find_opt(cmd, a, len);
        if (!o) return tb_cli_usage_error(cmd->name, "unknown option '%.*s'", (int)len, a);
        char used[64];
        snprintf(used, sizeof used, "%.*s", (int)len, a);
        int k = (int)(o - cmd->opts);
        if (o->kind == TB_OPT_FLAG) {
            if (eq) return tb_cli_usage_error(cmd->name, "%s takes no value", used);
            set_value(cmd, o, used, NULL, args);
        } else if (o->kind == TB_OPT_STRS && !eq) {
            /* values up to the next argument that starts with '-' (a value
             * that itself starts with '-' is written --stop=-x) */
            int n = 0;
            while (i + 1 < argc && !(argv[i + 1][0] == '-' && argv[i + 1][1])) {
                if (!set_value(cmd, o, used, argv[++i], args)) return 2;
                n++;
            }
            if (!n) return tb_cli_usage_error(cmd->name, "%s needs a value (write --%s=VALUE for one that starts "
                                                         "with '-')", used, o->name + 2);
        } else {
            const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
            if (!v) return tb_cli_usage_error(cmd->name, "%s needs a value (%s)", used, o->metavar ? o->metavar : "VALUE");
            int slot = pos_slot(cmd, o);
            if (slot >= 0 && *(const char **)(args + o->off))
                return tb_cli_usage_error(cmd->name, "%s given twice ('%s' and '%s')", cmd->pos[slot],
                                          *(const char **)(args + o->off), v);
            if (!set_value(cmd, o, used, v, args)) return 2;
        }
        seen[k] = 1;
    }
    for (int p = 0; p < cmd->n_pos_required; p++)
        if (!*(const char **)(args + cmd->pos_off[p])) return tb_cli_usage_error(cmd->name, "needs %s", cmd->pos[p]);
    char w[96];
    for (int k = 0; k < cmd->n_opts; k++)
        if ((cmd->opts[k].flags & TB_OPT_REQUIRED) && !seen[k])
            return tb_cli_usage_error(cmd->name, "needs %s", opt_words(&cmd->opts[k], w, sizeof w));
    for (int k = 0; k < cmd->n_opts; k++) {
        int g = cmd->opts[k].group, n = 0, first = 1;
        if (g <= 0) continue;
        int earlier = 0;
        for (int j = 0; j < k; j++) earlier |= cmd->opts[j].group == g;
        if (earlier) continue;
        for (int j = 0; j < cmd->n_opts; j++) n += cmd->opts[j].group == g && seen[j];
        if (n == 1) continue;
        char list[256] = "";
        for (int j = 0; j < cmd->n_opts; j++) {
            if (cmd->opts[j].group != g || (cmd->opts[j].flags & TB_OPT_SEE_ALSO)) continue;
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%s", first ? "" : " or ", opt_words(&cmd->opts[j], w, sizeof w));
            first = 0;
        }
        return tb_cli_usage_error(cmd->name, "needs exactly one of %s", list);
    }
    return -1;
}

/* ================================================================ printing */

/* Writes words, breaking lines before `width`; continuation lines start
 * with `indent` spaces. `col` is where the cursor is. Returns the column. */
static int put_wrapped(FILE *f, const char *text, int col, int indent, int width) {
    const char *p = text;
    while (*p) {
        if (*p == '\n') { fputc('\n', f); for (col = 0; col < indent; col++) fputc(' ', f); p++; continue; }
        const char *sp = p;
        while (*sp == ' ') sp++;
        const char *e = sp;
        while (*e && *e != ' ' && *e != '\n') e++;
        int wlen = (int)(e - sp), gap = (int)(sp - p);
        if (col > indent && col + gap + wlen > width) {
            fputc('\n', f);
            for (col = 0; col < indent; col++) fputc(' ', f);
            gap = 0;
        }
        for (int k = 0; k < gap; k++) fputc(' ', f);
        for (const char *q = sp; q < e; q++) fputc(*q == NBSP ? ' ' : *q, f);
        col += gap + wlen;
        p = e;
    }
    return col;
}

/* The synopsis words of one option: "[--top-k K]", "-o FILE.engine". */
static void synopsis_item(const tb_cli_opt *o, char *buf, size_t cap) {
    char w[96];
    opt_words(o, w, sizeof w);
    if (o->flags & TB_OPT_REQUIRED) snprintf(buf, cap, "%s", w);
    else snprintf(buf, cap, "[%s]", w);
}

void tb_cli_print_synopsis(const tb_cli_cmd *cmd, FILE *f, int width) {
    char head[64];
    snprintf(head, sizeof head, "turbine %s", cmd->name);
    int indent = (int)strlen(head) + 1;
    fputs(head, f);
    int col = indent - 1;
    char item[512];
    for (int p = 0; p < cmd->n_pos; p++) {
        snprintf(item, sizeof item, p < cmd->n_pos_required ? " %s" : " [%s]", cmd->pos[p]);
        col = put_wrapped(f, item, col, indent, width);
    }
    /* required options and one-of groups first, as a reader needs them */
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < cmd->n_opts; k++) {
            const tb_cli_opt *o = &cmd->opts[k];
            if (o->flags & TB_OPT_SEE_ALSO) continue;
            int mandatory = (o->flags & TB_OPT_REQUIRED) || o->group > 0;
            if (mandatory != !pass) continue;
            if (o->group > 0) {
                int earlier = 0;
                for (int j = 0; j < k; j++) earlier |= cmd->opts[j].group == o->group;
                if (earlier) continue;
                char w[96];
                size_t l = 0;
                l += (size_t)snprintf(item + l, sizeof item - l, " (");
                int first = 1;
                for (int j = k; j < cmd->n_opts && l < sizeof item; j++) {
                    if (cmd->opts[j].group != o->group || (cmd->opts[j].flags & TB_OPT_SEE_ALSO)) continue;
                    l += (size_t)snprintf(item + l, sizeof item - l, "%s%s", first ? "" : " | ",
                                          opt_words(&cmd->opts[j], w, sizeof w));
                    first = 0;
                }
                if (l < sizeof item) snprintf(item + l, sizeof item - l, ")");
            } else {
                item[0] = ' ';
                synopsis_item(o, item + 1, sizeof item - 1);
            }
            /* keep an item on one line: wrap only between items */
            int ilen = (int)strlen(item);
            if (col > indent && col + ilen > width) {
                fputc('\n', f);
                for (col = 0; col < indent - 1; col++) fputc(' ', f);
            }
            fputs(item, f);
            col += ilen;
        }
    }
    fputc('\n', f);
}

/* "(1 <= N <= 1048576; default 256)" or "" */
static void help_extra(const tb_cli_opt *o, char *buf, size_t cap) {
    char r[96];
    range_help(o, r, sizeof r);
    for (char *p = r; *p; p++) if (*p == ' ') *p = NBSP;
    if (r[0] && o->def) snprintf(buf, cap, "(%s; default %s)", r, o->def);
    else if (r[0]) snprintf(buf, cap, "(%s)", r);
    else if (o->def) snprintf(buf, cap, "(default %s)", o->def);
    else buf[0] = 0;
}

/* "-o, --output FILE.engine", "--served-model-name, --model-name NAME": the
 * short spelling first, the value last. */
static void opt_column(const tb_cli_opt *o, char *buf, size_t cap) {
    const char *first = o->name, *second = o->alias;
    if (second && second[1] != '-') { first = o->alias; second = o->name; }
    char names[96];
    if (second) snprintf(names, sizeof names, "%s, %s", first, second);
    else snprintf(names, sizeof names, "%s", first);
    if (o->kind == TB_OPT_FLAG) snprintf(buf, cap, "%s", names);
    else snprintf(buf, cap, "%s %s%s", names, o->metavar ? o->metavar : "VALUE", o->kind == TB_OPT_STRS ? " ..." : "");
}

void tb_cli_print_help(const tb_cli_cmd *cmd, FILE *f) {
    fputs("usage: ", f);
    /* the synopsis, shifted by "usage: " */
    char *syn = NULL;
    size_t syn_n = 0;
    FILE *m = open_memstream(&syn, &syn_n);
    if (m) {
        tb_cli_print_synopsis(cmd, m, HELP_WIDTH - 7);
        fclose(m);
        for (char *p = syn; p && *p; p++) {
            fputc(*p, f);
            if (*p == '\n' && p[1]) fputs("       ", f);
        }
        free(syn);
    }
    fputc('\n', f);
    put_wrapped(f, cmd->summary, 0, 0, HELP_WIDTH);
    fputs("\n\noptions:\n", f);
    char col[128], extra[256];
    for (int k = 0; k <= cmd->n_opts; k++) {
        const char *help;
        if (k < cmd->n_opts) {
            opt_column(&cmd->opts[k], col, sizeof col);
            help = cmd->opts[k].help;
            help_extra(&cmd->opts[k], extra, sizeof extra);
        } else {
            snprintf(col, sizeof col, "-h, --help");
            help = "print this help and exit";
            extra[0] = 0;
        }
        fprintf(f, "  %s", col);
        int c = 2 + (int)strlen(col);
        if (c + 2 > HELP_COL) { fputc('\n', f); c = 0; }
        for (; c < HELP_COL; c++) fputc(' ', f);
        c = put_wrapped(f, help, c, HELP_COL, HELP_WIDTH);
        if (extra[0]) {
            char sp[300];
            snprintf(sp, sizeof sp, " %s", extra);
            put_wrapped(f, sp, c, HELP_COL, HELP_WIDTH);
        }
        fputc('\n', f);
    }
    if (cmd->notes) {
        fputc('\n', f);
        put_wrapped(f, cmd->notes, 0, 0, HELP_WIDTH);
        fputc('\n', f);
    }
    fputs("\nexit status: 0 ok, 1 runtime or input error, 2 usage error\n", f);
}

/* Markdown table cells: '|' would end the cell. */
static void md_cell(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n') fputc(' ', f);
        else fputc(*s, f);
    }
}

void tb_cli_print_markdown(const tb_cli_cmd *cmd, FILE *f) {
    fprintf(f, "## turbine %s\n\n", cmd->name);
    fprintf(f, "```\n");
    tb_cli_print_synopsis(cmd, f, HELP_WIDTH);
    fprintf(f, "```\n\n");
    md_cell(f, cmd->summary);
    fprintf(f, "\n\n| option | value | default | description |\n|---|---|---|---|\n");
    char r[96];
    for (int k = 0; k < cmd->n_opts; k++) {
        const tb_cli_opt *o = &cmd->opts[k];
        fprintf(f, "| `%s`", o->name);
        if (o->alias) fprintf(f, ", `%s`", o->alias);
        fputs(" | ", f);
        if (o->kind != TB_OPT_FLAG) {
            fputc('`', f);
            md_cell(f, o->metavar);
            if (o->kind == TB_OPT_STRS) fputs(" ...", f);
            fputc('`', f);
        }
        range_help(o, r, sizeof r);
        if (r[0]) { fputs(": ", f); md_cell(f, r); }
        fputs(" | ", f);
        if (o->def) md_cell(f, o->def);
        fputs(" | ", f);
        md_cell(f, o->help);
        fputs(" |\n", f);
    }
    if (cmd->notes) {
        fputc('\n', f);
        fputs(cmd->notes, f);
        fputc('\n', f);
    }
    fputc('\n', f);
}

void tb_cli_print_values(const tb_cli_cmd *cmd, const void *args_, FILE *f) {
    const char *args = args_;
    for (int p = 0; p < cmd->n_pos; p++) {
        const char *v = *(const char *const *)(args + cmd->pos_off[p]);
        fprintf(f, "%s=%s\n", cmd->pos[p], v ? v : "(none)");
    }
    for (int k = 0; k < cmd->n_opts; k++) {
        const tb_cli_opt *o = &cmd->opts[k];
        const void *src = args + o->off;
        if (o->flags & TB_OPT_SEE_ALSO) continue;
        fprintf(f, "%s=", o->name);
        switch (o->kind) {
        case TB_OPT_FLAG: case TB_OPT_INT: fprintf(f, "%d", *(const int *)src); break;
        case TB_OPT_U64: fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)src); break;
        case TB_OPT_FLOAT: fprintf(f, "%.10g", *(const double *)src); break;
        case TB_OPT_SIZE: fprintf(f, "%zu", *(const size_t *)src); break;
        case TB_OPT_STR: case TB_OPT_CHOICE: {
            const char *s = *(const char *const *)src;
            fputs(s ? s : "(none)", f);
            break;
        }
        case TB_OPT_STRS: {
            const tb_cli_strs *l = src;
            for (int i = 0; i < l->n; i++) fprintf(f, "%s[%s]", i ? "," : "", l->v[i]);
            break;
        }
        }
        fputc('\n', f);
    }
}

const char *tb_cli_example_value(const tb_cli_opt *o, char *buf, size_t cap) {
    switch (o->kind) {
    case TB_OPT_FLAG: return NULL;
    case TB_OPT_INT: case TB_OPT_FLOAT:
        /* the upper end when it is finite and included, else the lower */
        if (!isinf(o->hi) && !(o->flags & TB_OPT_HI_OPEN) && o->hi < INT_MAX) fmt_num(o->hi, buf, cap);
        else if (!(o->flags & TB_OPT_LO_OPEN)) fmt_num(o->lo, buf, cap);
        else fmt_num(o->lo + 1, buf, cap);
        return buf;
    case TB_OPT_U64: snprintf(buf, cap, "%llu", (unsigned long long)UINT64_MAX); return buf;
    case TB_OPT_SIZE: return fmt_size(o->hi, buf, cap);
    case TB_OPT_CHOICE: {
        const char *bar = strchr(o->metavar, '|');
        snprintf(buf, cap, "%.*s", bar ? (int)(bar - o->metavar) : (int)strlen(o->metavar), o->metavar);
        return buf;
    }
    case TB_OPT_STR: case TB_OPT_STRS: snprintf(buf, cap, "x"); return buf;
    }
    return NULL;
}
