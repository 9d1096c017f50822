/*
 * gpu_bench.c — decode and prefill latency of one engine on one device,
 * through the public API (the logits of every step are read back to the
 * host, as a generation loop would).
 *
 *   gpu_bench ENGINE [--device cuda] [--prefill 512] [--decode 128]
 *             [--ctx 16] [--batch 1,8] [--variants "base;A=1 B=0;..."]
 *             [--kv-dtype auto|f32|f16|bf16|int8|fp8]
 *
 * Prints one line per measurement: "prefill P: X ms" (median of 5) and
 * "decode bB: X ms/step (median), Y ms mean" after a prompt of --ctx tokens.
 * --variants: after the first ("base": the environment as given), each
 * ';'-separated entry sets its space-separated VAR=VALUE pairs, creates a
 * fresh context (the backend reads its switches at create), repeats the
 * decode timings with lines prefixed "[entry] ", and unsets them again.
 *
 * Also printed: "load: X ms" (tb_engine_load_for: map, verify, upload) and
 * "first token: Y ms" (context create and a one-token step after the load).
 * The decode batches' prompts are prefilled in steps of up to --step-tokens
 * tokens (whole prompts; default 0: the engine's step, `turbine build
 * --max-step-tokens`, which is also what `turbine serve` batches; 512 until
 * 2026-12-07). With --streams N[,N2...] (--stream-in P, --stream-out G: default 128 / 128)
 * "streams N: X gen tok/s": N sequences that start together, their prompts
 * prefilled in steps of up to --step-tokens (the same default) tokens, then
 * decoded together for G tokens each (greedy ids are not needed: the next
 * input ids are fixed), wall time from the first prefill step to the last
 * decode step (one such run per N of the list). Each stream has its own
 * prompt; "picks" is a digest of every stream's first token and of the last
 * step's picks (equal across variants that should compute the same thing).
 * A variant's TB_BENCH_STEP_TOKENS=N replaces --step-tokens for its streams
 * (at most the engine's step profile, `turbine build --max-step-tokens`).
 * --kv-dtype: the KV cache's element type in every context (default: the
 * engine's own), printed as "kv dtype: X" after the first token.
 * TB_BENCH_LOG=info|debug: the library's log (stderr) at that level.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"      /* tb_log_set_level */
#include "core/kv_layout.h" /* tb_kv_dtype_label */
#include "plan/engine.h"    /* tb_engine_load_for */
#include "runtime/runtime.h" /* tb_context_max_step */
#include "turbine/turbine.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A step and its greedy picks, made on the device as the server does
 * (tb_context_step_sample); with TB_BENCH_LOGITS=1 the step copies its
 * logits to the host instead (the path before sampling on the device). */
#define MAX_ROWS 1024
static tb_sampler *greedy;
static int host_logits; /* TB_BENCH_LOGITS=1, read when each variant starts */
static tb_row_sampling g_rows[MAX_ROWS];
static tb_sample_result g_res[MAX_ROWS];
static const char *g_kv_dtype; /* --kv-dtype, NULL: the engine's default */

static int step(tb_context *c, const tb_seq_chunk *ch, int n) {
    const float *lg = NULL;
    int rows = 0, want = 0;
    for (int i = 0; i < n; i++) want += ch[i].logits == 2 ? ch[i].n_tokens : ch[i].logits != 0;
    if (host_logits || want > MAX_ROWS) {
        if (tb_context_step(c, ch, n, &lg, &rows) != TB_OK || !lg) {
            fprintf(stderr, "gpu_bench: step failed: %s\n", tb_last_error());
            return 0;
        }
        return 1;
    }
    for (int r = 0; r < want; r++) g_rows[r] = (tb_row_sampling){greedy, NULL, 0, -1, NULL};
    if (tb_context_step_sample(c, ch, n, g_rows, g_res, &rows) != TB_OK) {
        fprintf(stderr, "gpu_bench: step failed: %s\n", tb_last_error());
        return 0;
    }
    return 1;
}

/* FNV-1a step over one token id */
static uint64_t fnv1a(uint64_t h, int32_t tok) { return (h ^ (uint32_t)tok) * 1099511628211ull; }

/* 64 streams (say) of s_in prompt and s_out generated tokens: prompts as
 * many per step as fit in step_tokens, then every stream decodes together. */
static void run_streams(tb_engine *e, const char *device, const tb_engine_info *in, int streams, int s_in, int s_out,
                        int step_tokens, const char *tag) {
    tb_engine_info info = *in;
    const char *st = getenv("TB_BENCH_STEP_TOKENS"); /* a variant's own step size */
    const int st_n = st ? atoi(st) : 0;
    if (st_n > 0) step_tokens = st_n;
    tb_context_options o;
    tb_context_options_default(&o);
    o.max_seqs = streams;
    o.device = device;
    o.max_step_tokens = step_tokens;
    o.kv_dtype = g_kv_dtype;
    tb_context *c = NULL;
    const int per = s_in + s_out;
    tb_seq_chunk *ch = malloc(sizeof(tb_seq_chunk) * (size_t)streams);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)per * (size_t)streams);
    if (!ch || !ids || tb_context_create(e, &o, &c) != TB_OK) {
        fprintf(stderr, "gpu_bench: streams: %s\n", tb_last_error());
        free(ch);
        free(ids);
        return;
    }
    if (step_tokens <= 0 || tb_context_max_step(c) < step_tokens) step_tokens = tb_context_max_step(c);
    /* every stream its own prompt (and fixed next inputs) */
    for (int q = 0; q < streams; q++)
        for (int i = 0; i < per; i++) ids[(size_t)q * per + i] = 3 + (i * 7919 + q * 104729) % (info.vocab_size - 3);
    for (int rep = 0; rep < 2; rep++) { /* the first run warms up (allocations, graphs) */
        for (int q = 0; q < streams; q++) tb_seq_reset(c, q);
        /* digest of the greedy picks: every stream's first token (its
         * prompt's last logits) and every pick of the last decode step */
        uint64_t dig = 1469598103934665603ull;
        double t0 = now_ms(), tp = 0;
        for (int q = 0; q < streams;) { /* prompts, as many per step as fit */
            int n = 0, used = 0;
            while (q < streams && used + s_in <= step_tokens) {
                ch[n++] = (tb_seq_chunk){q, s_in, ids + (size_t)q * per, 1};
                q++;
                used += s_in;
            }
            if (n == 0) { fprintf(stderr, "gpu_bench: --stream-in exceeds --step-tokens\n"); goto streams_done; }
            if (!step(c, ch, n)) goto streams_done;
            for (int i = 0; i < n && !host_logits; i++) dig = fnv1a(dig, g_res[i].token);
        }
        tp = now_ms() - t0;
        for (int k = 0; k < s_out - 1; k++) { /* the prefill step gave each stream its first token */
            for (int q = 0; q < streams; q++) ch[q] = (tb_seq_chunk){q, 1, ids + (size_t)q * per + s_in + k, 1};
            if (!step(c, ch, streams)) goto streams_done;
        }
        for (int i = 0; i < streams && !host_logits && streams <= MAX_ROWS; i++)
            dig = fnv1a(dig, g_res[i].token);
        double tt = now_ms() - t0;
        if (rep == 1) {
            printf("%s%sstreams %d (%d in, %d out, steps of %d): %.0f gen tok/s; %.1f ms in all, prefill %.1f ms, "
                   "decode %.3f ms/step; picks %016llx\n",
                   tag, *tag ? " " : "", streams, s_in, s_out, step_tokens, (double)streams * s_out / tt * 1e3, tt, tp,
                   (tt - tp) / (s_out - 1), (unsigned long long)dig);
            fflush(stdout);
        }
    }
streams_done:
    for (int q = 0; q < streams; q++) tb_seq_reset(c, q);
    tb_context_free(c);
    free(ch);
    free(ids);
}

int main(int argc, char **argv) {
    const char *engine = NULL, *device = NULL, *batches = "1", *variants = "base";
    int prefill = 512, decode = 128, ctx_len = 16;
    const char *streams = "";
    int s_in = 128, s_out = 128, step_tokens = 0; /* 0: the engine's step (as turbine serve batches) */
    const char *lv = getenv("TB_BENCH_LOG"); /* info / debug: the library's log at that level */
    if (lv && !strcmp(lv, "debug")) tb_log_set_level(TB_LOG_DEBUG);
    if (lv && !strcmp(lv, "info")) tb_log_set_level(TB_LOG_INFO);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) { device = v; i++; }
        else if (!strcmp(a, "--prefill") && v) { prefill = atoi(v); i++; }
        else if (!strcmp(a, "--decode") && v) { decode = atoi(v); i++; }
        else if (!strcmp(a, "--ctx") && v) { ctx_len = atoi(v); i++; }
        else if (!strcmp(a, "--batch") && v) { batches = v; i++; }
        else if (!strcmp(a, "--variants") && v) { variants = v; i++; }
        else if (!strcmp(a, "--streams") && v) { streams = v; i++; }
        else if (!strcmp(a, "--stream-in") && v) { s_in = atoi(v); i++; }
        else if (!strcmp(a, "--stream-out") && v) { s_out = atoi(v); i++; }
        else if (!strcmp(a, "--step-tokens") && v) { step_tokens = atoi(v); i++; }
        else if (!strcmp(a, "--kv-dtype") && v) { g_kv_dtype = v; i++; }
        else if (!engine) engine = a;
        else { fprintf(stderr, "usage: gpu_bench ENGINE [--device D] [--prefill N] [--decode N] [--ctx N] [--batch 1,8] "
                                "[--variants V] [--streams N,...] [--stream-in N] [--stream-out N] [--step-tokens N] [--kv-dtype D]\n");
              return 2; }
    }
    if (!engine) { fprintf(stderr, "gpu_bench: need ENGINE\n"); return 2; }
    if (ctx_len < 1 || decode < 1) { fprintf(stderr, "gpu_bench: --ctx and --decode must be at least 1\n"); return 2; }
    tb_engine *e = NULL;
    double tl0 = now_ms();
    if (tb_engine_load_for(engine, device, &e) != TB_OK) { fprintf(stderr, "gpu_bench: %s\n", tb_last_error()); return 1; }
    double tl1 = now_ms();
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    tb_sampling_params gp;
    tb_sampling_params_default(&gp);
    if (tb_sampler_create(info.vocab_size, &gp, &greedy) != TB_OK) { fprintf(stderr, "gpu_bench: %s\n", tb_last_error()); return 1; }
    {
        tb_context_options o;
        tb_context_options_default(&o);
        o.max_seqs = 1;
        o.device = device;
        o.kv_dtype = g_kv_dtype;
        tb_context *c = NULL;
        int32_t tok = 1;
        tb_seq_chunk ch = {0, 1, &tok, 1};
        if (tb_context_create(e, &o, &c) != TB_OK || !step(c, &ch, 1)) {
            fprintf(stderr, "gpu_bench: %s\n", tb_last_error());
            return 1;
        }
        double tl2 = now_ms();
        printf("load: %.1f ms\nfirst token: %.1f ms after the load, %.1f ms in all\nkv dtype: %s\n", tl1 - tl0, tl2 - tl1,
               tl2 - tl0, tb_kv_dtype_label(tb_context_kv_dtype(c)));
        fflush(stdout);
        tb_context_free(c);
    }
    int max_b = 1;
    for (const char *p = batches; *p;) {
        int b = atoi(p);
        if (b > max_b) max_b = b;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    char vbuf[1024];
    snprintf(vbuf, sizeof vbuf, "%s", variants);
    char *vsave = NULL;
    int vi = 0;
    for (char *var = strtok_r(vbuf, ";", &vsave); var; var = strtok_r(NULL, ";", &vsave), vi++) {
        char tag[256] = "", names[16][64];
        int n_names = 0;
        if (vi > 0) {
            snprintf(tag, sizeof tag, "[%s]", var);
            char sets[256], *ssave = NULL;
            snprintf(sets, sizeof sets, "%s", var);
            for (char *kv = strtok_r(sets, " ", &ssave); kv && n_names < 16; kv = strtok_r(NULL, " ", &ssave)) {
                char *eq = strchr(kv, '=');
                if (!eq) continue;
                *eq = 0;
                snprintf(names[n_names++], 64, "%s", kv);
                setenv(kv, eq + 1, 1);
            }
        }
        const char *hl = getenv("TB_BENCH_LOGITS");
        host_logits = hl && *hl == '1';
        for (const char *p = streams; *p;) { /* "64,256": one run each */
            int n = atoi(p);
            if (n > 0 && n <= 1024 && s_in > 0 && s_out > 0) run_streams(e, device, &info, n, s_in, s_out, step_tokens, tag);
            p = strchr(p, ',');
            if (!p) break;
            p++;
        }
        tb_context_options o;
        tb_context_options_default(&o);
        o.max_seqs = max_b;
        o.device = device;
        o.kv_dtype = g_kv_dtype;
        tb_context *c = NULL;
        if (tb_context_create(e, &o, &c) != TB_OK) { fprintf(stderr, "gpu_bench: %s\n", tb_last_error()); return 1; }
        int max_step = 512;
        if (prefill > info.max_seq_len - 1) prefill = info.max_seq_len - 1;
        int need = prefill > ctx_len + decode ? prefill : ctx_len + decode;
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)(need + 1) * (size_t)max_b);
        if (!toks) return 1;
        srand(1);
        for (int i = 0; i < (need + 1) * max_b; i++) toks[i] = 3 + rand() % (info.vocab_size - 3);

        /* prefill: one step of `prefill` tokens, logits of the last */
        if (prefill > 0 && prefill <= max_step) {
            double t[6];
            for (int r = 0; r < 6; r++) {
                tb_seq_reset(c, 0);
                tb_seq_chunk ch = {0, prefill, toks, 1};
                double t0 = now_ms();
                if (!step(c, &ch, 1)) return 1;
                t[r] = now_ms() - t0;
            }
            double m = median(t + 1, 5);
            printf("%s%sprefill %d: %.3f ms (%.0f tok/s)\n", tag, *tag ? " " : "", prefill, m, prefill / m * 1e3);
            fflush(stdout);
            tb_seq_reset(c, 0);
        }

        /* decode: B sequences, each with a ctx_len prompt, then `decode` steps */
        for (const char *p = batches; p && *p;) {
            int B = atoi(p);
            p = strchr(p, ',');
            if (p) p++;
            if (B < 1 || B > max_b) continue;
            tb_seq_chunk ch[256];
            if (B > 256) continue;
            for (int s = 0; s < B; s++) {
                tb_seq_reset(c, s);
                ch[s] = (tb_seq_chunk){s, ctx_len, toks + (size_t)s * (need + 1), 1};
            }
            /* the prompts in steps of at most --step-tokens tokens (whole
             * prompts; at most the context's step) */
            const int cap = step_tokens > 0 && step_tokens < tb_context_max_step(c) ? step_tokens : tb_context_max_step(c);
            for (int s0 = 0; s0 < B;) {
                int n = 0, used = 0;
                while (s0 + n < B && (n == 0 || used + ctx_len <= cap)) used += ctx_len, n++;
                if (!step(c, ch + s0, n)) return 1;
                s0 += n;
            }
            double *t = malloc(sizeof(double) * (size_t)decode), sum = 0;
            for (int k = 0; k < decode; k++) {
                for (int s = 0; s < B; s++) ch[s] = (tb_seq_chunk){s, 1, toks + (size_t)s * (need + 1) + ctx_len + k, 1};
                double t0 = now_ms();
                if (!step(c, ch, B)) return 1;
                t[k] = now_ms() - t0;
                sum += t[k];
            }
            double mean = sum / decode, med = median(t, decode);
            printf("%s%sdecode b%d: %.3f ms/step median, %.3f mean (%.1f tok/s) ctx %d..%d\n", tag,
                   *tag ? " " : "", B, med, mean, B / med * 1e3, ctx_len, ctx_len + decode);
            fflush(stdout);
            free(t);
            for (int s = 0; s < B; s++) tb_seq_reset(c, s);
        }
        tb_context_free(c);
        free(toks);
        for (int k = 0; k < n_names; k++) unsetenv(names[k]);
    }
    tb_engine_free(e);
    return 0;
}
