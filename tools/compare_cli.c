/*
 * compare_cli.c — `turbine compare A.engine B.engine --text FILE [--ctx N]
 * [--max-tokens N] [--kv-dtype D]`: the accuracy of an engine (B: quantized, f16, ...)
 * against a reference (A: usually f32) on the same text.
 *
 * The text is tokenized with A's tokenizer (B's must give the same ids and
 * the engines the same vocabulary size, else the command refuses) and cut
 * into the windows `turbine perplexity` uses (perplexity_cli.c: same
 * tokenization, same windows, same scoring), each run once through each
 * engine. Per scored position: each engine's negative log-likelihood of the
 * next token, the KL divergence KL(P_A || P_B) of B's next-token distribution
 * from A's (log-softmax in double), and whether the argmaxes agree. Prints:
 *   A perplexity P nll N                       (P: what `turbine perplexity` prints for A)
 *   B perplexity P nll N
 *   kl mean M p99 Q max X
 *   top1 agreement F
 *   tokens T windows W ctx C
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"
#include "turbine/turbine.h"

typedef struct {
    const char *a, *b, *text, *device, *kv_dtype;
    int ctx, max_tokens, threads;
} cmp_args;

static void cmp_defaults(void *p) { memset(p, 0, sizeof(cmp_args)); }

#define P(f) offsetof(cmp_args, f)
static const tb_cli_opt cmp_opts[] = {
    {"--text", NULL, TB_OPT_STR, "FILE", 0, 0, TB_OPT_REQUIRED, 0, 0, P(text), NULL,
     "the text both engines score (at most 256 MiB), tokenized with A's tokenizer"},
    {"--ctx", NULL, TB_OPT_INT, "N", 2, 1 << 20, 0, 0, 0, P(ctx), "the smaller context, at most 512",
     "tokens per window; at most both engines' context and step profile"},
    {"--max-tokens", NULL, TB_OPT_INT, "N", 1, 1 << 30, 0, 0, 0, P(max_tokens), "the whole text",
     "score at most N positions (the text is cut to its first N + 1 tokens)"},
    {"--kv-dtype", NULL, TB_OPT_CHOICE, "auto|f32|f16|bf16|int8|fp8", 0, 0, 0, 0, 0, P(kv_dtype), "auto",
     "B's KV-cache dtype (A keeps its default): with A and B the same engine, the accuracy of a quantized KV "
     "cache"},
    {"--threads", "-t", TB_OPT_INT, "N", 1, 256, 0, 0, 0, P(threads), "one per core", "CPU threads"},
    {"--device", NULL, TB_OPT_STR, "cpu|cuda[:N]", 0, 0, 0, 0, 0, P(device), "each engine's backend",
     TB_CLI_HELP_DEVICE},
};
#undef P

const tb_cli_cmd tb_cmd_compare = {
    "compare",
    "Compares engine B with engine A on a text: each one's perplexity, the mean and p99 KL divergence of B's "
    "next-token distribution from A's, and the top-1 agreement.",
    {"A.engine", "B.engine"}, {offsetof(cmp_args, a), offsetof(cmp_args, b)}, 2, 2,
    cmp_opts, sizeof cmp_opts / sizeof cmp_opts[0],
    "Both engines must share the vocabulary (the same size, and B's tokenizer giving A's ids for the text). "
    "The windows and the scoring are `turbine perplexity`'s, so A's and B's perplexities equal what it prints "
    "for each engine with the same --ctx. KL is in nats, per scored position.",
    sizeof(cmp_args), cmp_defaults,
};

/* log-softmax of a row into out (V), in double; returns the argmax. */
static int log_softmax(const float *row, int V, double *out) {
    int arg = 0;
    for (int i = 1; i < V; i++)
        if (row[i] > row[arg]) arg = i;
    double m = row[arg], s = 0;
    for (int i = 0; i < V; i++) s += exp((double)row[i] - m);
    double lse = m + log(s);
    for (int i = 0; i < V; i++) out[i] = (double)row[i] - lse;
    return arg;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static int open_engine(const char *path, const char *device, const char *kv_dtype, int threads, tb_engine **e,
                       tb_context **c) {
    if (tb_engine_load_for(path, device, e) != TB_OK) {
        fprintf(stderr, "turbine: error: %s\n", tb_last_error());
        return 0;
    }
    if (!tb_engine_is_llm(*e)) {
        fprintf(stderr, "turbine: error: %s is not an LLM engine (compare scores text)\n", path);
        return 0;
    }
    tb_context_options co;
    tb_context_options_default(&co);
    co.n_threads = threads;
    co.max_seqs = 1;
    co.device = device;
    co.kv_dtype = kv_dtype;
    co.no_prefix_cache = 1; /* every window is new */
    if (tb_context_create(*e, &co, c) != TB_OK) {
        fprintf(stderr, "turbine: error: %s: %s\n", path, tb_last_error());
        return 0;
    }
    return 1;
}

int tb_cli_compare(int argc, char **argv) {
    cmp_args a;
    cmp_defaults(&a);
    int prc = tb_cli_parse(&tb_cmd_compare, argc, argv, &a);
    if (prc >= 0) return prc;
    int rc = 1;
    tb_engine *ea = NULL, *eb = NULL;
    tb_context *ca = NULL, *cb = NULL;
    int32_t *toks = NULL, *toks_b = NULL;
    double *la = NULL, *lb = NULL, *kls = NULL;
    int n = 0, nb = 0;
    if (!open_engine(a.a, a.device, NULL, a.threads, &ea, &ca) ||
        !open_engine(a.b, a.device, a.kv_dtype, a.threads, &eb, &cb))
        goto done;
    tb_engine_info ia, ib;
    tb_engine_get_info(ea, &ia);
    tb_engine_get_info(eb, &ib);
    if (ia.vocab_size != ib.vocab_size) {
        fprintf(stderr, "turbine: error: the engines do not share a vocabulary: %s has %d tokens, %s has %d\n", a.a,
                ia.vocab_size, a.b, ib.vocab_size);
        goto done;
    }
    int V = ia.vocab_size;
    if (!tb_cli_text_tokens(ea, a.text, &toks, &n) || !tb_cli_text_tokens(eb, a.text, &toks_b, &nb)) goto done;
    if (n != nb || memcmp(toks, toks_b, sizeof(int32_t) * (size_t)n) != 0) {
        int at = 0;
        while (at < n && at < nb && toks[at] == toks_b[at]) at++;
        fprintf(stderr, "turbine: error: the engines do not share a vocabulary: their tokenizers split %s "
                        "differently (token %d: %d in %s, %d in %s)\n", a.text, at, at < n ? toks[at] : -1, a.a,
                at < nb ? toks_b[at] : -1, a.b);
        goto done;
    }
    if (a.max_tokens > 0 && n > a.max_tokens + 1) n = a.max_tokens + 1;
    if (n < 2) { fprintf(stderr, "turbine: error: need at least 2 tokens to score, got %d\n", n); goto done; }
    int ctx_len = a.ctx;
    int lim = ia.max_seq_len < ib.max_seq_len ? ia.max_seq_len : ib.max_seq_len;
    int step = tb_context_max_step(ca) < tb_context_max_step(cb) ? tb_context_max_step(ca) : tb_context_max_step(cb);
    if (ctx_len == 0) ctx_len = lim < 512 ? lim : 512;
    if (ctx_len > lim) {
        fprintf(stderr, "turbine: error: --ctx %d exceeds the engines' context (%d)\n", ctx_len, lim);
        goto done;
    }
    if (ctx_len > step) {
        fprintf(stderr, "turbine: error: --ctx %d exceeds the engines' step profile (%d tokens)\n", ctx_len, step);
        goto done;
    }
    la = malloc(sizeof(double) * (size_t)V);
    lb = malloc(sizeof(double) * (size_t)V);
    kls = malloc(sizeof(double) * (size_t)n);
    if (!la || !lb || !kls) { fprintf(stderr, "turbine: error: out of memory\n"); goto done; }
    double nll_a = 0, nll_b = 0, kl_sum = 0;
    long scored = 0, agree = 0;
    int windows = 0;
    double t0 = tb_now();
    for (int start = 0, len; (len = tb_cli_window(n, ctx_len, start)) > 0; start += ctx_len) {
        tb_seq_chunk ch = {0, len, toks + start, 2};
        const float *ga = NULL, *gb = NULL;
        int ra = 0, rb = 0;
        /* each context keeps its own logits buffer: A's rows stay valid while B steps */
        if (tb_seq_reset(ca, 0) != TB_OK || tb_context_step(ca, &ch, 1, &ga, &ra) != TB_OK || ra != len) {
            fprintf(stderr, "turbine: error: %s: window at token %d: %s\n", a.a, start, tb_last_error());
            goto done;
        }
        if (tb_seq_reset(cb, 0) != TB_OK || tb_context_step(cb, &ch, 1, &gb, &rb) != TB_OK || rb != len) {
            fprintf(stderr, "turbine: error: %s: window at token %d: %s\n", a.b, start, tb_last_error());
            goto done;
        }
        for (int r = 0; r < len; r++) {
            const float *rowa = ga + (size_t)r * (size_t)V, *rowb = gb + (size_t)r * (size_t)V;
            int target = toks[start + r + 1];
            /* the same nll as `turbine perplexity` (identical sums) */
            nll_a += tb_cli_nll(rowa, V, target);
            nll_b += tb_cli_nll(rowb, V, target);
            int ma = log_softmax(rowa, V, la), mb = log_softmax(rowb, V, lb);
            double kl = 0;
            for (int i = 0; i < V; i++) kl += exp(la[i]) * (la[i] - lb[i]);
            kls[scored] = kl > 0 ? kl : 0; /* rounding can leave -1e-17 */
            kl_sum += kls[scored];
            agree += ma == mb;
            scored++;
        }
        windows++;
    }
    double secs = tb_now() - t0;
    qsort(kls, (size_t)scored, sizeof(double), cmp_double);
    /* p99: the nearest-rank percentile */
    long k99 = (long)ceil(0.99 * (double)scored) - 1;
    if (k99 < 0) k99 = 0;
    printf("A perplexity %.6f nll %.6f %s\n", exp(nll_a / (double)scored), nll_a / (double)scored, a.a);
    printf("B perplexity %.6f nll %.6f %s\n", exp(nll_b / (double)scored), nll_b / (double)scored, a.b);
    printf("kl mean %.6g p99 %.6g max %.6g\n", kl_sum / (double)scored, kls[k99], kls[scored - 1]);
    printf("top1 agreement %.6f (%ld of %ld)\n", (double)agree / (double)scored, agree, scored);
    printf("tokens %ld windows %d ctx %d\n", scored, windows, ctx_len);
    fprintf(stderr, "turbine: %ld positions compared in %.2f s\n", scored, secs);
    rc = 0;
done:
    free(la);
    free(lb);
    free(kls);
    free(toks);
    free(toks_b);
    tb_context_free(ca);
    tb_context_free(cb);
    tb_engine_free(ea);
    tb_engine_free(eb);
    return rc;
}
