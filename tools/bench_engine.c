/*
 * bench_engine.c — `turbine bench --engine FILE.engine`: the trtexec side of
 * the load tester. Runs the engine in-process (no HTTP) and prints, per
 * batch size, the prefill latency, the per-step decode latency, tokens per
 * second and the process's peak memory, after the engine's build metadata.
 * `--profile` adds the time per decode step spent in each op kind. Batch
 * sizes above the engine's max batch are skipped with a message (listed in
 * the JSON); only a list of which none fits is an error.
 *
 * Uses only the public API and runtime.h; the build metadata comes from the
 * engine's meta section through tb_engine_describe.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/kv_layout.h"
#include "cli.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "turbine/turbine.h"

int tb_bench_engine_main(int argc, char **argv);

#define MAX_BATCHES 32
#define MAX_KINDS 96

static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "turbine bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: turbine bench --engine FILE.engine [--batch 1,8,32] [--input-len N]\n"
                    "           [--output-len N] [--threads N] [--kv-dtype auto|f32|f16|bf16|int8|fp8]\n"
                    "           [--profile] [--json FILE]\n");
    return 2;
}

/* Peak resident memory of this process (VmHWM), in MiB; -1 when unknown. */
static double peak_rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) { kb = strtod(line + 6, NULL); break; }
    fclose(f);
    return kb < 0 ? -1 : kb / 1024.0;
}

/* The meta JSON from tb_engine_describe's text ("meta: {...}"). */
static json_t *engine_meta(const char *path) {
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    json_t *meta = NULL;
    if (tb_engine_describe(path, buf, cap) == TB_OK) {
        buf[cap - 1] = 0;
        char *m = strstr(buf, "meta: {");
        if (m) {
            json_error_t err;
            meta = json_loads(m + 6, JSON_DISABLE_EOF_CHECK, &err);
        }
    }
    free(buf);
    return meta;
}

/* Greedy picks made by the step itself (on the GPU for a GPU engine, as the
 * server does): rows (n_seqs), each with its sequence's sampler, results. */
typedef struct {
    tb_row_sampling *rows;
    tb_sample_result *res;
} picks;

/* One step; next[owner[i]] gets chunk i's pick where it asks for one. */
static tb_status step_pick(tb_context *c, const tb_seq_chunk *ch, int n, const int *owner, int32_t *next,
                           const picks *pk) {
    int rows = 0;
    TB_TRY(tb_context_step_sample(c, ch, n, pk->rows, pk->res, &rows));
    for (int i = 0, r = 0; i < n && r < rows; i++)
        if (ch[i].logits) next[owner ? owner[i] : i] = pk->res[r++].token;
    return TB_OK;
}

/* Prefills `n_seqs` prompts of `len` tokens, in steps of at most max_step
 * tokens; the last piece of each prompt asks for its logits row. */
static tb_status prefill(tb_context *c, int n_seqs, int len, const int32_t *prompt, int max_step,
                         tb_seq_chunk *chunks, int32_t *next, const picks *pk) {
    int *done = calloc((size_t)n_seqs, sizeof *done);
    if (!done) return tb_errorf(TB_ERR_OOM, "out of memory");
    tb_status st = TB_OK;
    for (int guard = 0; guard < 1000000 && st == TB_OK; guard++) {
        int budget = max_step, n = 0;
        int owner[MAX_BATCHES * 64];
        for (int s = 0; s < n_seqs && budget > 0 && n < MAX_BATCHES * 64; s++) {
            int take = len - done[s];
            if (take <= 0) continue;
            if (take > budget) take = budget;
            chunks[n] = (tb_seq_chunk){.seq = s, .n_tokens = take, .tokens = prompt + done[s],
                                       .logits = done[s] + take == len ? 1 : 0};
            owner[n++] = s;
            done[s] += take;
            budget -= take;
        }
        if (!n) break;
        st = step_pick(c, chunks, n, owner, next, pk);
    }
    free(done);
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int tb_bench_exec_main(int argc, char **argv); /* bench_exec.c: general engines */

int tb_bench_engine_main(int argc, char **argv) {
    /* a general (ONNX) engine has its own options and figures */
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--engine")) {
            json_t *m = engine_meta(argv[i + 1]);
            const char *kind = json_string_value(json_object_get(m, "kind"));
            int general = kind && !strcmp(kind, "onnx");
            json_decref(m);
            if (general) return tb_bench_exec_main(argc, argv);
        }
    const char *path = NULL, *json_path = NULL, *device = NULL, *kv_dtype = NULL;
    int batches[MAX_BATCHES], n_batches = 0, in_len = 128, out_len = 128, threads = 0, profile = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--engine")) { if (!v) return usage("%s needs a value", a); path = v; i++; }
        else if (!strcmp(a, "--batch")) {
            if (!v) return usage("%s needs a value", a);
            char tmp[256];
            if (strlen(v) >= sizeof tmp) return usage("bad --batch '%s'", v);
            strcpy(tmp, v);
            n_batches = 0;
            for (char *sv = NULL, *t = strtok_r(tmp, ",", &sv); t; t = strtok_r(NULL, ",", &sv))
                if (n_batches >= MAX_BATCHES || !tb_cli_parse_int(t, 1, 4096, &batches[n_batches++]))
                    return usage("bad --batch '%s'", v);
            i++;
        } else if (!strcmp(a, "--input-len")) { if (!v || !tb_cli_parse_int(v, 1, 1 << 20, &in_len)) return usage("bad --input-len '%s'", v ? v : ""); i++; }
        else if (!strcmp(a, "--output-len")) { if (!v || !tb_cli_parse_int(v, 1, 1 << 20, &out_len)) return usage("bad --output-len '%s'", v ? v : ""); i++; }
        else if (!strcmp(a, "--threads")) { if (!v || !tb_cli_parse_int(v, 0, 1024, &threads)) return usage("bad --threads '%s'", v ? v : ""); i++; }
        else if (!strcmp(a, "--json")) { if (!v) return usage("%s needs a value", a); json_path = v; i++; }
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--device")) { if (!v) return usage("%s needs a value", a); device = v; i++; }
        else if (!strcmp(a, "--kv-dtype")) { if (!v) return usage("%s needs a value", a); kv_dtype = v; i++; }
        else return usage("unknown option for engine mode: '%s'", a);
    }
    if (!path) return usage("%s", "--engine needs FILE.engine");

    json_t *meta = engine_meta(path);
    tb_engine *e = NULL;
    double t_load = tb_now();
    if (tb_engine_load_for(path, device, &e) != TB_OK) {
        fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
        json_decref(meta);
        return 1;
    }
    t_load = tb_now() - t_load;
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    if (!n_batches) {
        batches[n_batches++] = 1;
        if (info.max_batch > 1) batches[n_batches++] = info.max_batch;
    }
    json_t *build = json_object_get(meta, "build");
    FILE *ef = fopen(path, "rb");
    long fsize = -1;
    if (ef) { fseek(ef, 0, SEEK_END); fsize = ftell(ef); fclose(ef); }
    printf("engine: %s\n", path);
    printf("  arch %s, %d layers, dim %d, vocab %d, weights %s\n", info.arch, info.n_layers, info.dim,
           info.vocab_size, tb_dtype_name(info.weight_dtype));
    printf("  size %.2f MiB, max batch %d, max sequence %d, load %.1f ms\n", fsize / 1048576.0,
           info.max_batch, info.max_seq_len, t_load * 1e3);
    if (build)
        printf("  built %s in %.2f s\n", json_string_value(json_object_get(build, "built_at")) ?
               json_string_value(json_object_get(build, "built_at")) : "?",
               json_number_value(json_object_get(build, "build_seconds")));
    if (in_len + out_len > info.max_seq_len) {
        fprintf(stderr, "turbine bench: error: --input-len + --output-len = %d exceeds the engine's "
                        "max sequence length %d\n", in_len + out_len, info.max_seq_len);
        tb_engine_free(e);
        json_decref(meta);
        return 1;
    }
    int max_b = 0, n_fit = 0, skipped[MAX_BATCHES], n_skipped = 0;
    for (int i = 0; i < n_batches; i++) {
        if (batches[i] > info.max_batch) {
            fprintf(stderr, "turbine bench: %s: batch %d exceeds the engine's max batch %d%s "
                            "(build the engine with --max-batch %d to run it)\n",
                    n_batches > 1 ? "note" : "error", batches[i], info.max_batch,
                    n_batches > 1 ? ", skipped" : "", batches[i]);
            skipped[n_skipped++] = batches[i];
            continue;
        }
        batches[n_fit++] = batches[i];
        if (batches[i] > max_b) max_b = batches[i];
    }
    n_batches = n_fit;
    if (!n_batches) {
        if (n_skipped > 1)
            fprintf(stderr, "turbine bench: error: no batch size fits the engine's max batch %d\n", info.max_batch);
        tb_engine_free(e);
        json_decref(meta);
        return 1;
    }
    tb_context_options co;
    tb_context_options_default(&co);
    co.n_threads = threads;
    co.device = device;
    co.max_seqs = max_b;
    co.kv_dtype = kv_dtype;
    tb_context *c = NULL;
    if (tb_context_create(e, &co, &c) != TB_OK) {
        fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
        tb_engine_free(e);
        json_decref(meta);
        return 1;
    }
    int max_step = tb_context_max_step(c);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)in_len);
    int32_t *next = calloc((size_t)max_b, sizeof *next);
    tb_seq_chunk *chunks = calloc((size_t)max_b * 64 + 64, sizeof *chunks);
    double *steps = malloc(sizeof(double) * (size_t)out_len);
    tb_sampling_params gp;
    tb_sampling_params_default(&gp);
    /* each sequence runs the runtime's generation loop (tb_gen), as `turbine
     * run` and the server do: greedy, and a fixed length (end tokens ignored)
     * so every point decodes --output-len steps; it counts --output-len + 1
     * tokens, the prefill's pick first */
    tb_gen_options go;
    tb_gen_options_default(&go);
    go.max_tokens = out_len + 1;
    go.ignore_eos = 1;
    go.sampling = &gp;
    tb_gen *gens = calloc((size_t)max_b, sizeof *gens);
    picks pk = {calloc((size_t)max_b, sizeof(tb_row_sampling)), calloc((size_t)max_b, sizeof(tb_sample_result))};
    json_t *out = json_object(), *jpts = json_array();
    int rc = 1;
    if (!prompt || !next || !chunks || !steps || !out || !jpts || !gens || !pk.rows || !pk.res) { fprintf(stderr, "turbine bench: error: out of memory\n"); goto done; }
    uint64_t s = 12345;
    for (int i = 0; i < in_len; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)(3 + (s >> 33) % (uint64_t)(info.vocab_size > 4 ? info.vocab_size - 3 : 1));
    }
    if (info.bos_id >= 0 && info.add_bos) prompt[0] = info.bos_id;
    for (int q = 0; q < max_b; q++) {
        if (tb_gen_init(&gens[q], &info, NULL, prompt[in_len - 1], &go) != TB_OK) {
            fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
            goto done;
        }
        pk.rows[q] = (tb_row_sampling){gens[q].sampler, NULL, 0, -1, NULL};
    }
    /* warm up: one short prefill and a few decode steps */
    if (tb_seq_reset(c, 0) != TB_OK || prefill(c, 1, in_len < 16 ? in_len : 16, prompt, max_step, chunks, next, &pk) != TB_OK) {
        fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
        goto done;
    }
    printf("\n%6s %12s %12s %12s %12s %12s %12s %10s\n", "batch", "prefill ms", "prefill t/s",
           "decode ms", "decode p50", "decode p99", "decode t/s", "peak MiB");
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        for (int q = 0; q < max_b; q++) tb_seq_reset(c, q);
        if (profile && tb_context_set_profiling(c, 1) != TB_OK) profile = 0;
        double t0 = tb_now();
        if (prefill(c, B, in_len, prompt, max_step, chunks, next, &pk) != TB_OK) {
            fprintf(stderr, "turbine bench: error: batch %d prefill: %s\n", B, tb_last_error());
            goto done;
        }
        double t_prefill = tb_now() - t0;
        if (profile) tb_context_set_profiling(c, 1); /* the profile covers the decode steps only */
        int32_t tok[4096];
        double t_decode = 0;
        /* a new generation of each sequence: the prefill's pick is its first token */
        tb_gen_end end = TB_GEN_GOING;
        for (int q = 0; q < B; q++) {
            tb_gen_free(&gens[q]);
            if (tb_gen_init(&gens[q], &info, NULL, prompt[in_len - 1], &go) != TB_OK) {
                fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
                goto done;
            }
            pk.rows[q].sampler = gens[q].sampler;
            end = tb_gen_step(&gens[q], next[q], NULL, NULL);
        }
        for (int k = 0; k < out_len && end == TB_GEN_GOING; k++) {
            for (int q = 0; q < B; q++) {
                tok[q] = next[q];
                chunks[q] = (tb_seq_chunk){.seq = q, .n_tokens = 1, .tokens = &tok[q], .logits = 1};
            }
            double ts = tb_now();
            if (step_pick(c, chunks, B, NULL, next, &pk) != TB_OK) {
                fprintf(stderr, "turbine bench: error: batch %d decode step %d: %s\n", B, k, tb_last_error());
                goto done;
            }
            steps[k] = tb_now() - ts;
            t_decode += steps[k];
            for (int q = 0; q < B; q++) end = tb_gen_step(&gens[q], next[q], NULL, NULL);
        }
        qsort(steps, (size_t)out_len, sizeof *steps, cmp_double);
        double p50 = steps[(out_len - 1) / 2], p99 = steps[(int)ceil(0.99 * out_len) - 1];
        double peak = peak_rss_mib();
        double pre_tps = B * in_len / t_prefill, dec_tps = B * out_len / t_decode;
        printf("%6d %12.2f %12.1f %12.3f %12.3f %12.3f %12.1f %10.1f\n", B, t_prefill * 1e3, pre_tps,
               t_decode / out_len * 1e3, p50 * 1e3, p99 * 1e3, dec_tps, peak);
        json_t *p = json_object();
        json_object_set_new(p, "batch", json_integer(B));
        json_object_set_new(p, "prefill_ms", json_real(t_prefill * 1e3));
        json_object_set_new(p, "prefill_tokens_per_s", json_real(pre_tps));
        json_object_set_new(p, "decode_step_mean_ms", json_real(t_decode / out_len * 1e3));
        json_object_set_new(p, "decode_step_p50_ms", json_real(p50 * 1e3));
        json_object_set_new(p, "decode_step_p99_ms", json_real(p99 * 1e3));
        json_object_set_new(p, "decode_tokens_per_s", json_real(dec_tps));
        json_object_set_new(p, "peak_rss_mib", json_real(peak));
        if (profile) {
            const char *names[MAX_KINDS];
            double secs[MAX_KINDS];
            int nk = tb_context_profile(c, names, secs, MAX_KINDS);
            if (nk > MAX_KINDS) nk = MAX_KINDS;
            json_t *jp = json_object();
            double tot = 0;
            for (int k = 0; k < nk; k++) tot += secs[k];
            if (nk == 0) printf("       profile: no per-op timing recorded (the runtime's step loop does not report it)\n");
            else printf("       decode steps, ms per step by op kind (the rest: outside the ops):\n");
            int ns = out_len > 0 ? out_len : 1;
            for (int k = 0; k < nk; k++) {
                printf("       %-24s %10.3f ms %5.1f%%\n", names[k], secs[k] * 1e3 / ns, 100 * secs[k] / t_decode);
                json_object_set_new(jp, names[k], json_real(secs[k] * 1e3 / ns));
            }
            if (nk) printf("       %-24s %10.3f ms %5.1f%%\n", "(rest)", (t_decode - tot) * 1e3 / ns,
                           100 * (t_decode - tot) / t_decode);
            json_object_set_new(p, "profile_ms", jp);
            tb_context_set_profiling(c, 0);
        }
        json_array_append_new(jpts, p);
    }
    json_object_set_new(out, "engine", json_string(path));
    json_object_set_new(out, "file_bytes", json_integer(fsize));
    json_object_set_new(out, "max_batch", json_integer(info.max_batch));
    json_object_set_new(out, "max_seq_len", json_integer(info.max_seq_len));
    json_object_set_new(out, "load_ms", json_real(t_load * 1e3));
    json_object_set_new(out, "input_len", json_integer(in_len));
    json_object_set_new(out, "output_len", json_integer(out_len));
    json_object_set_new(out, "threads", json_integer(tb_context_threads(c)));
    json_object_set_new(out, "kv_dtype", json_string(tb_kv_dtype_label(tb_context_kv_dtype(c))));
    json_object_set_new(out, "build", build ? json_incref(build) : json_null());
    json_object_set_new(out, "points", jpts);
    json_t *js = json_array();
    for (int i = 0; i < n_skipped; i++) json_array_append_new(js, json_integer(skipped[i]));
    json_object_set_new(out, "skipped_batches", js);
    jpts = NULL;
    rc = 0;
    if (json_path && json_dump_file(out, json_path, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
        fprintf(stderr, "turbine bench: error: cannot write %s\n", json_path);
        rc = 1;
    }
done:
    json_decref(jpts);
    json_decref(out);
    json_decref(meta);
    free(prompt);
    free(next);
    free(chunks);
    free(steps);
    free(pk.rows);
    free(pk.res);
    for (int q = 0; gens && q < max_b; q++) tb_gen_free(&gens[q]);
    free(gens);
    tb_context_free(c);
    tb_engine_free(e);
    return rc;
}
