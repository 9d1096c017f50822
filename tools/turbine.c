/*
 * turbine.c — the command-line interface: build, run, inspect.
 *
 * Only this file prints to the user and exits; everything else returns a
 * tb_status with a message.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/core.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"
#include "turbine/turbine.h"

#define TB_VERSION "0.1.0"

static int fail(const char *what) {
    fprintf(stderr, "turbine: error: %s%s%s\n", what ? what : "", what && *tb_last_error() ? ": " : "",
            tb_last_error());
    return 1;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "turbine: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see turbine --help)\n");
    return 2;
}

static void print_help(void) {
    printf("turbine %s — an inference compiler and runtime\n\n"
           "usage:\n"
           "  turbine build MODEL -o FILE.engine [--tokenizer FILE] [--dtype f32|f16|bf16]\n"
           "                [--max-seq-len N] [--max-batch N] [--device cpu|cuda[:N]]\n"
           "      MODEL: a Hugging Face folder (config.json + *.safetensors) or a llama2.c .bin\n"
           "  turbine run FILE.engine (-p PROMPT | --prompt-ids 1,2,3) [-n N] [--temperature T]\n"
           "                [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S]\n"
           "                [--stop STR ...] [--logits-out FILE] [--threads N] [--device cpu|cuda[:N]]\n"
           "      -n N: total tokens, prompt included (llama2.c's convention; default 256)\n"
           "  turbine inspect FILE.engine\n"
           "  turbine serve [FILE.engine] [--host 127.0.0.1] [--port 8000] [--max-num-seqs N]\n"
           "                [--max-batched-tokens N] [--kv-cache-mem SIZE] [--max-queue N] [--api-key KEY]\n"
           "                [--threads N] [--model-name NAME] [--timeout S] [--grace S] [--device cpu|cuda[:N]]\n"
           "                [--gpu-memory-fraction F] [--no-prefix-caching] [--stream-interval N] [--stream-buffer N]\n"
           "      with no engine: serves the bundled Shakespeare demo model\n"
           "  turbine bench BASE_URL|--engine FILE.engine [options]   (turbine bench --help)\n"
           "  turbine perplexity FILE.engine (--text FILE | --ids 1,2,3) [--ctx N] [--threads N]\n"
           "                [--device cpu|cuda[:N]]\n",
           TB_VERSION);
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* ---------------------------------------------------------------- build */

static int cmd_build(int argc, char **argv) {
    tb_build_options o;
    tb_build_options_default(&o);
    const char *model = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) { if (!v) return usage_error("%s needs a value", a); out = v; i++; }
        else if (!strcmp(a, "--tokenizer")) { if (!v) return usage_error("%s needs a value", a); o.tokenizer_path = v; i++; }
        else if (!strcmp(a, "--dtype")) {
            if (!v) return usage_error("%s needs a value", a);
            if (tb_dtype_parse(v, &o.weight_dtype) != TB_OK) return usage_error("unknown --dtype '%s' (f32, f16, bf16)", v);
            i++;
        } else if (!strcmp(a, "--max-seq-len")) {
            if (!v || !tb_cli_parse_int(v, 1, 1 << 20, &o.max_seq_len)) return usage_error("--max-seq-len needs a positive integer", "");
            i++;
        } else if (!strcmp(a, "--max-batch")) {
            if (!v || !tb_cli_parse_int(v, 1, 1024, &o.max_batch)) return usage_error("--max-batch needs an integer in [1, 1024]", "");
            i++;
        } else if (!strcmp(a, "--device")) {
            if (!v) return usage_error("%s needs a value", a);
            o.device = v;
            i++;
        } else if (a[0] == '-') return usage_error("unknown option '%s' for build", a);
        else if (!model) model = a;
        else return usage_error("unexpected argument '%s'", a);
    }
    if (!model) return usage_error("build needs a MODEL%s", "");
    if (!out) return usage_error("build needs -o FILE.engine%s", "");
    o.progress = isatty(2);
    tb_build_report r;
    if (tb_build(model, out, &o, &r) != TB_OK) return fail("build failed");
    fprintf(stderr,
            "built %s\n  build time    %.2f s\n  engine size   %.1f MB (%llu bytes)\n  dtype         %s\n"
            "  max batch     %d\n  max seq len   %d\n",
            out, r.seconds, (double)r.engine_bytes / 1e6, (unsigned long long)r.engine_bytes,
            tb_dtype_name(o.weight_dtype), r.max_batch, r.max_seq_len);
    return 0;
}

/* ---------------------------------------------------------------- inspect */

static int cmd_inspect(int argc, char **argv) {
    if (argc != 1) return usage_error("inspect needs exactly one FILE.engine%s", "");
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    if (!buf) return 1;
    if (tb_engine_describe(argv[0], buf, cap) != TB_OK) { free(buf); return fail("cannot inspect"); }
    fputs(buf, stdout);
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------- run */

typedef struct {
    char **stop;
    int n_stop;
    char *text;      /* generated text not yet printed */
    size_t len, cap;
    int stopped;
    int tty;           /* stdout is a terminal: flush every piece */
    double last_flush; /* otherwise flush at most every TB_RUN_FLUSH_S */
} stop_filter;

/* Text appears as it is produced, as in llama2.c: on a terminal every piece
 * is flushed; into a pipe or file the flushes (a write each) are batched to
 * one per TB_RUN_FLUSH_S, which matters at tens of thousands of tokens/s. */
#define TB_RUN_FLUSH_S 0.05

static void out_flush(stop_filter *f) {
    if (f->tty) {
        fflush(stdout);
        return;
    }
    double now = tb_now();
    if (now - f->last_flush >= TB_RUN_FLUSH_S) {
        fflush(stdout);
        f->last_flush = now;
    }
}

/* Appends generated bytes; prints what can no longer start a stop string. */
static void stop_feed(stop_filter *f, const char *p, size_t n) {
    if (f->stopped) return;
    if (f->len + n + 1 > f->cap) {
        f->cap = (f->len + n + 1) * 2;
        f->text = realloc(f->text, f->cap);
    }
    memcpy(f->text + f->len, p, n);
    f->len += n;
    f->text[f->len] = 0;
    size_t emit = f->len;
    for (int i = 0; i < f->n_stop; i++) {
        char *hit = memmem(f->text, f->len, f->stop[i], strlen(f->stop[i]));
        if (hit) {
            size_t at = (size_t)(hit - f->text);
            if (at < emit) emit = at;
            f->stopped = 1;
        }
    }
    if (!f->stopped) {
        /* hold back a suffix that is a prefix of some stop string */
        for (int i = 0; i < f->n_stop; i++) {
            size_t sl = strlen(f->stop[i]);
            for (size_t k = sl - 1; k > 0; k--) {
                if (k <= f->len && !memcmp(f->text + f->len - k, f->stop[i], k)) {
                    if (f->len - k < emit) emit = f->len - k;
                    break;
                }
            }
        }
    }
    fwrite(f->text, 1, emit, stdout);
    out_flush(f);
    memmove(f->text, f->text + emit, f->len - emit);
    f->len -= emit;
    if (f->stopped) f->len = 0;
}

static void stop_flush(stop_filter *f) {
    if (!f->stopped && f->len) fwrite(f->text, 1, f->len, stdout);
    f->len = 0;
}

static void print_piece(const tb_tokenizer *tok, int prev, int t, stop_filter *sf) {
    char piece[256];
    size_t n = tb_tokenizer_piece(tok, prev, t, piece, sizeof piece);
    if (!tb_piece_is_printable(piece, n)) return;
    if (sf) stop_feed(sf, piece, n);
    else fwrite(piece, 1, n, stdout);
}

static int cmd_run(int argc, char **argv) {
    const char *engine = NULL, *prompt = NULL, *ids_arg = NULL, *logits_out = NULL, *device = NULL;
    int steps = 256, threads = 0;
    tb_sampling_params sp;
    tb_sampling_params_default(&sp);
    sp.temperature = 1.0f;
    char *stops[16];
    int n_stops = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int has = v != NULL;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { if (!has) return usage_error("%s needs a value", a); prompt = v; i++; }
        else if (!strcmp(a, "--prompt-ids")) { if (!has) return usage_error("%s needs a value", a); ids_arg = v; i++; }
        else if (!strcmp(a, "-n")) { if (!has || !tb_cli_parse_int(v, 1, INT_MAX, &steps)) return usage_error("-n needs a positive integer%s", ""); i++; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!has || !tb_cli_parse_int(v, 1, 256, &threads)) return usage_error("--threads needs an integer in [1, 256]%s", ""); i++; }
        else if (!strcmp(a, "--temperature")) { if (!has || !parse_float(v, &sp.temperature) || sp.temperature < 0) return usage_error("--temperature needs a number >= 0%s", ""); i++; }
        else if (!strcmp(a, "--top-k")) { if (!has || !tb_cli_parse_int(v, 0, INT_MAX, &sp.top_k)) return usage_error("--top-k needs an integer >= 0%s", ""); i++; }
        else if (!strcmp(a, "--top-p")) { if (!has || !parse_float(v, &sp.top_p) || sp.top_p <= 0 || sp.top_p > 1) return usage_error("--top-p needs a number in (0, 1]%s", ""); i++; }
        else if (!strcmp(a, "--min-p")) { if (!has || !parse_float(v, &sp.min_p) || sp.min_p < 0 || sp.min_p > 1) return usage_error("--min-p needs a number in [0, 1]%s", ""); i++; }
        else if (!strcmp(a, "--repeat-penalty")) { if (!has || !parse_float(v, &sp.repeat_penalty) || sp.repeat_penalty <= 0) return usage_error("--repeat-penalty needs a number > 0%s", ""); i++; }
        else if (!strcmp(a, "--seed")) {
            if (!has) return usage_error("--seed needs a value%s", "");
            char *end; errno = 0;
            sp.seed = strtoull(v, &end, 10);
            if (errno || *end) return usage_error("--seed needs an unsigned integer%s", "");
            i++;
        } else if (!strcmp(a, "--stop")) {
            if (!has || !*v) return usage_error("--stop needs a non-empty string%s", "");
            if (n_stops == 16) return usage_error("at most 16 --stop strings%s", "");
            stops[n_stops++] = (char *)v; i++;
        } else if (!strcmp(a, "--logits-out")) { if (!has) return usage_error("%s needs a value", a); logits_out = v; i++; }
        else if (!strcmp(a, "--device")) { if (!has) return usage_error("%s needs a value", a); device = v; i++; }
        else if (a[0] == '-' && a[1]) return usage_error("unknown option '%s' for run", a);
        else if (!engine) engine = a;
        else return usage_error("unexpected argument '%s'", a);
    }
    if (!engine) return usage_error("run needs FILE.engine%s", "");
    if (!prompt == !ids_arg) return usage_error("run needs exactly one of -p PROMPT or --prompt-ids LIST%s", "");

    double t_load0 = tb_now();
    tb_engine *e = NULL;
    if (tb_engine_load_for(engine, device, &e) != TB_OK) return fail(NULL);
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    tb_context_options co;
    tb_context_options_default(&co);
    co.n_threads = threads;
    co.max_seqs = 1;
    co.device = device;
    tb_context *ctx = NULL;
    if (tb_context_create(e, &co, &ctx) != TB_OK) { tb_engine_free(e); return fail("cannot create a context"); }
    double load_ms = (tb_now() - t_load0) * 1e3;
    const tb_tokenizer *tok = tb_engine_tokenizer(e);

    int cap = info.max_seq_len + 1, n_prompt = 0, rc = 1;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(cap + 1));
    float *row = malloc(sizeof(float) * (size_t)info.vocab_size);
    tb_sampler *smp = NULL;
    FILE *lf = NULL;
    stop_filter sf = {stops, n_stops, NULL, 0, 0, 0, isatty(fileno(stdout)), 0.0};
    if (!toks || !row) { tb_errorf(TB_ERR_OOM, "out of memory"); fail(NULL); goto done; }
    if (prompt) {
        if (tb_tokenizer_encode(tok, prompt, strlen(prompt), info.add_bos, toks, cap, &n_prompt) != TB_OK) {
            fail("cannot tokenize the prompt");
            goto done;
        }
    } else if (!tb_cli_parse_ids("--prompt-ids", ids_arg, info.vocab_size, toks, cap - 1, &n_prompt)) {
        goto done;
    }
    if (n_prompt == 0) { fprintf(stderr, "turbine: error: the prompt is empty\n"); goto done; }
    if (n_prompt >= info.max_seq_len) {
        fprintf(stderr, "turbine: error: the prompt has %d tokens; the engine's context is %d\n", n_prompt,
                info.max_seq_len);
        goto done;
    }
    if (steps > info.max_seq_len) steps = info.max_seq_len;
    if (tb_sampler_create(info.vocab_size, &sp, &smp) != TB_OK) { fail("bad sampling parameters"); goto done; }
    if (logits_out && !(lf = fopen(logits_out, "wb"))) {
        fprintf(stderr, "turbine: error: cannot write %s: %s\n", logits_out, strerror(errno));
        goto done;
    }

    /* the prompt, printed as llama2.c does: each piece after the first token */
    for (int i = 0; i < n_prompt; i++) print_piece(tok, i ? toks[i - 1] : -1, toks[i], NULL);
    fflush(stdout);

    /* prefill in chunks of the step profile */
    double t0 = tb_now();
    /* without --logits-out the step picks the token itself (on the GPU for
     * a GPU engine: no logits cross to the host) */
    const float *lg = NULL;
    int n_rows = 0, max_step = tb_context_max_step(ctx), next = 0;
    tb_row_sampling rsm = {smp, toks, 0, -1};
    tb_sample_result res;
    for (int at = 0; at < n_prompt; at += max_step) {
        int n = n_prompt - at < max_step ? n_prompt - at : max_step;
        tb_seq_chunk chn = {0, n, toks + at, lf ? 2 : 1};
        if (!lf) {
            chn.logits = at + n == n_prompt;
            rsm.n_history = at + n;
            if (tb_context_step_sample(ctx, &chn, 1, &rsm, &res, &n_rows) != TB_OK) { fail("prefill failed"); goto done; }
            next = res.token;
            continue;
        }
        if (tb_context_step(ctx, &chn, 1, &lg, &n_rows) != TB_OK) { fail("prefill failed"); goto done; }
        if (fwrite(lg, sizeof(float) * (size_t)info.vocab_size, (size_t)n_rows, lf) != (size_t)n_rows) {
            fprintf(stderr, "turbine: error: cannot write %s\n", logits_out);
            goto done;
        }
    }
    double t_prompt = tb_now() - t0;
    int n_gen_max = steps - n_prompt + 1, n_gen = 0, len = n_prompt;
    double t1 = tb_now();
    while (n_gen < n_gen_max) {
        if (lf) {
            memcpy(row, lg + (size_t)(n_rows - 1) * (size_t)info.vocab_size, sizeof(float) * (size_t)info.vocab_size);
            next = tb_sampler_sample(smp, row, toks, len);
        }
        int end = next == info.bos_id;
        for (int k = 0; k < 4; k++) end |= info.eos_ids[k] >= 0 && next == info.eos_ids[k];
        if (end) break;
        print_piece(tok, toks[len - 1], next, &sf);
        toks[len++] = next;
        n_gen++;
        if (sf.stopped || n_gen >= n_gen_max || len >= info.max_seq_len) break;
        tb_seq_chunk chn = {0, 1, &toks[len - 1], 1};
        if (!lf) {
            rsm.n_history = len;
            if (tb_context_step_sample(ctx, &chn, 1, &rsm, &res, &n_rows) != TB_OK) { fail("decode failed"); goto done; }
            next = res.token;
            continue;
        }
        if (tb_context_step(ctx, &chn, 1, &lg, &n_rows) != TB_OK) { fail("decode failed"); goto done; }
        if (fwrite(lg, sizeof(float) * (size_t)info.vocab_size, 1, lf) != 1) {
            fprintf(stderr, "turbine: error: cannot write %s\n", logits_out);
            goto done;
        }
    }
    stop_flush(&sf);
    double t_gen = tb_now() - t1;
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "timing: load_ms=%.2f prompt_tokens=%d prompt_ms=%.2f prompt_tok_s=%.1f gen_tokens=%d gen_ms=%.2f "
            "gen_tok_s=%.1f threads=%d\n",
            load_ms, n_prompt, t_prompt * 1e3, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9), n_gen, t_gen * 1e3,
            n_gen > 0 ? n_gen / (t_gen > 0 ? t_gen : 1e-9) : 0.0, tb_context_threads(ctx));
    rc = 0;
done:
    if (lf && fclose(lf) != 0 && rc == 0) { fprintf(stderr, "turbine: error: cannot write %s\n", logits_out); rc = 1; }
    free(sf.text);
    tb_sampler_free(smp);
    free(toks);
    free(row);
    tb_context_free(ctx);
    tb_engine_free(e);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_help();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("turbine %s\n", TB_VERSION); return 0; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "build")) return cmd_build(argc - 2, argv + 2);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return tb_cli_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return tb_cli_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "perplexity")) return tb_cli_perplexity(argc - 2, argv + 2);
    return usage_error("unknown command '%s'", cmd);
}
