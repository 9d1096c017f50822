/*
 * perplexity_cli.c — `turbine perplexity FILE.engine (--text FILE | --ids 1,2,3) [--ctx N]`:
 * how well an engine predicts a text, the measure that justifies a change of
 * precision (f32 -> f16/bf16) on real weights.
 *
 * The text is tokenized once (BOS first when the model adds one) and cut
 * into non-overlapping windows of --ctx input tokens (default: the engine's
 * context, at most 512); each window is one step with every row's logits, in
 * a fresh sequence, and row r scores the token after it (for the last row,
 * the first token of the next window): the usual evaluation of a language
 * model's test loss. A remainder shorter than a window is left out when the
 * text fills at least one window. Perplexity = exp(mean negative
 * log-likelihood) over the scored tokens, log-softmax in double precision.
 * Prints one line on stdout:
 *   perplexity P nll N tokens T windows W ctx C
 */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"
#include "turbine/turbine.h"

typedef struct {
    const char *engine, *text, *ids, *device, *kv_dtype;
    int ctx, threads;
} ppl_args;

static void ppl_defaults(void *p) { memset(p, 0, sizeof(ppl_args)); }

#define P(f) offsetof(ppl_args, f)
static const tb_cli_opt ppl_opts[] = {
    {"--engine", NULL, TB_OPT_STR, "FILE.engine", 0, 0, TB_OPT_SEE_ALSO, 0, 0, P(engine), NULL,
     TB_CLI_HELP_ENGINE},
    {"--text", NULL, TB_OPT_STR, "FILE", 0, 0, 0, 1, 0, P(text), NULL, "the text to score (at most 256 MiB)"},
    {"--ids", NULL, TB_OPT_STR, "1,2,3", 0, 0, 0, 1, 0, P(ids), NULL, "the token ids to score"},
    {"--ctx", NULL, TB_OPT_INT, "N", 2, 1 << 20, 0, 0, 0, P(ctx), "the engine's context, at most 512",
     "tokens per window; at most the engine's context and step profile"},
    {"--threads", "-t", TB_OPT_INT, "N", 1, 256, 0, 0, 0, P(threads), "one per core", "CPU threads"},
    {"--device", NULL, TB_OPT_STR, "cpu|cuda[:N]", 0, 0, 0, 0, 0, P(device), "the engine's backend",
     TB_CLI_HELP_DEVICE},
    {"--kv-dtype", NULL, TB_OPT_CHOICE, "auto|f32|f16|bf16|int8|fp8", 0, 0, 0, 0, 0, P(kv_dtype), "auto",
     TB_CLI_HELP_KV_DTYPE},
};
#undef P

const tb_cli_cmd tb_cmd_perplexity = {
    "perplexity",
    "Scores a text with an engine in non-overlapping windows of --ctx tokens (each row predicting the next "
    "token) and prints one line on stdout: perplexity P nll N tokens T windows W ctx C.",
    {"FILE.engine"}, {offsetof(ppl_args, engine)}, 1, 1,
    ppl_opts, sizeof ppl_opts / sizeof ppl_opts[0],
    "A remainder shorter than a window is left out when the text fills at least one window. The measure "
    "that justifies a precision: compare an f16 or bf16 engine's perplexity with the f32 one's.",
    sizeof(ppl_args), ppl_defaults,
};

/* -log softmax(row)[target], in double (compare_cli.c scores with it too). */
double tb_cli_nll(const float *row, int V, int target) {
    double m = row[0];
    for (int i = 1; i < V; i++) if (row[i] > m) m = row[i];
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)row[i] - m);
    return m + log(s) - (double)row[target];
}

int tb_cli_text_tokens(const tb_engine *e, const char *path, int32_t **toks, int *n) {
    char *text = NULL;
    size_t len = 0;
    *toks = NULL;
    *n = 0;
    if (tb_file_read_all(path, &text, &len, (size_t)1 << 28) != TB_OK) {
        fprintf(stderr, "turbine: error: %s\n", tb_last_error());
        return 0;
    }
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    int cap = (int)len + 2;
    *toks = malloc(sizeof(int32_t) * (size_t)cap);
    if (!*toks || tb_tokenizer_encode(tb_engine_tokenizer(e), text, len, info.add_bos, *toks, cap, n) != TB_OK) {
        fprintf(stderr, "turbine: error: cannot tokenize %s: %s\n", path, tb_last_error());
        free(text);
        free(*toks);
        *toks = NULL;
        return 0;
    }
    free(text);
    return 1;
}

int tb_cli_window(int n, int ctx, int start) {
    if (start + 1 >= n) return 0;
    int full = (n - 1) / ctx; /* windows whose ctx targets all exist */
    int len = n - 1 - start < ctx ? n - 1 - start : ctx; /* inputs with a target */
    return full > 0 && len < ctx ? 0 : len;
}

int tb_cli_perplexity(int argc, char **argv) {
    ppl_args a;
    ppl_defaults(&a);
    int prc = tb_cli_parse(&tb_cmd_perplexity, argc, argv, &a);
    if (prc >= 0) return prc;
    const char *engine = a.engine, *text_path = a.text, *ids_arg = a.ids, *device = a.device;
    int ctx_len = a.ctx, threads = a.threads;

    tb_engine *e = NULL;
    if (tb_engine_load_for(engine, device, &e) != TB_OK) {
        fprintf(stderr, "turbine: error: %s\n", tb_last_error());
        return 1;
    }
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    int V = info.vocab_size, rc = 1;
    if (ctx_len == 0) ctx_len = info.max_seq_len < 512 ? info.max_seq_len : 512;
    if (ctx_len > info.max_seq_len) {
        fprintf(stderr, "turbine: error: --ctx %d exceeds the engine's context (%d)\n", ctx_len, info.max_seq_len);
        tb_engine_free(e);
        return 1;
    }
    tb_context_options co;
    tb_context_options_default(&co);
    co.n_threads = threads;
    co.max_seqs = 1;
    co.device = device;
    co.kv_dtype = a.kv_dtype;
    co.no_prefix_cache = 1; /* every window is new */
    tb_context *ctx = NULL;
    int32_t *toks = NULL;
    int n = 0;
    char *text = NULL;
    if (tb_context_create(e, &co, &ctx) != TB_OK) {
        fprintf(stderr, "turbine: error: %s\n", tb_last_error());
        goto done;
    }
    if (ctx_len > tb_context_max_step(ctx)) {
        fprintf(stderr, "turbine: error: --ctx %d exceeds the engine's step profile (%d tokens)\n", ctx_len,
                tb_context_max_step(ctx));
        goto done;
    }
    if (text_path) {
        if (!tb_cli_text_tokens(e, text_path, &toks, &n)) goto done;
    } else {
        int cap = (int)strlen(ids_arg) / 2 + 2;
        toks = malloc(sizeof(int32_t) * (size_t)cap);
        if (!toks || !tb_cli_parse_ids("--ids", ids_arg, V, toks, cap, &n)) goto done;
    }
    if (n < 2) { fprintf(stderr, "turbine: error: need at least 2 tokens to score, got %d\n", n); goto done; }

    double nll = 0;
    long scored = 0;
    int windows = 0;
    double t0 = tb_now();
    for (int start = 0, len; (len = tb_cli_window(n, ctx_len, start)) > 0; start += ctx_len) {
        tb_seq_reset(ctx, 0);
        tb_seq_chunk ch = {0, len, toks + start, 2};
        const float *lg = NULL;
        int rows = 0;
        if (tb_context_step(ctx, &ch, 1, &lg, &rows) != TB_OK || rows != len) {
            fprintf(stderr, "turbine: error: window at token %d: %s\n", start, tb_last_error());
            goto done;
        }
        for (int r = 0; r < len; r++) {
            nll += tb_cli_nll(lg + (size_t)r * (size_t)V, V, toks[start + r + 1]);
            scored++;
        }
        windows++;
    }
    double secs = tb_now() - t0;
    printf("perplexity %.6f nll %.6f tokens %ld windows %d ctx %d\n", exp(nll / (double)scored), nll / (double)scored,
           scored, windows, ctx_len);
    fprintf(stderr, "turbine: %ld tokens scored in %.2f s (%.0f tok/s)\n", scored, secs, scored / (secs > 0 ? secs : 1));
    rc = 0;
done:
    free(text);
    free(toks);
    tb_context_free(ctx);
    tb_engine_free(e);
    return rc;
}
