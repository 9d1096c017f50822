/*
 * bench_cli.c — `turbine bench`: parses the options, runs each sweep point
 * through src/bench (HTTP only) and writes the reports. `--engine` hands the
 * whole command line to engine mode (bench_engine.c).
 *
 * Before running it fits the default synthetic lengths into the model's
 * context (max_model_len of /v1/models, tokens per word from /tokenize when
 * the server has it), loads every prompt of the run at once and gives each
 * sweep point (and its warm-up) its own slice, so no point reuses a prompt
 * an earlier one sent. Exit status: 0, 1 when the run failed (setup, a
 * report not written, or a point whose failed share of requests is above
 * --max-error-rate or that completed none), 2 for a usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli.h"

/* bench_engine.c */
int tb_bench_engine_main(int argc, char **argv);

#define MAX_SWEEP 64

static void print_usage(FILE *f) {
    fprintf(f,
        "usage: turbine bench BASE_URL [options]          load-test an HTTP server\n"
        "       turbine bench --engine FILE.engine [...]    time an engine in-process\n"
        "\ntarget:\n"
        "  --endpoint completions|chat|kserve|get  (default completions; get fetches BASE_URL)\n"
        "  --model NAME          default: the first of BASE_URL/v1/models\n"
        "  --api-key KEY         sent as 'Authorization: Bearer KEY' (or $OPENAI_API_KEY)\n"
        "  -H, --header 'K: V'   extra header (repeatable)\n"
        "  --timeout S           per-request timeout (default 300s); --connect-timeout S (10s)\n"
        "  --http-client auto|builtin|curl  auto (default): the built-in HTTP/1.1 client for\n"
        "                        http://, libcurl for https://\n"
        "load (one of; a comma list sweeps):\n"
        "  -c, --concurrency N[,N...]  closed loop: N clients (default 1)\n"
        "  --rate R[,R...]       open loop: R requests/s, latency from the intended send time\n"
        "  --arrivals poisson|constant  (default poisson); --max-inflight N (default 10000)\n"
        "  -n, --requests N      requests per point (default 100 unless --duration)\n"
        "  -d, --duration S      seconds per point; --warmup N requests not counted\n"
        "  --max-error-rate F    exit 1 when a point's failed share exceeds F (default 0.5);\n"
        "                        a point with no successful request always exits 1\n"
        "workload:\n"
        "  --input-len N --output-len N [--input-len-stddev S] [--output-len-stddev S]\n"
        "                        (default 512 and 128, made to fit the model's max_model_len)\n"
        "  --prefix-len N        every synthetic prompt starts with the same N words (a\n"
        "                        shared system prompt; input length = N + --input-len)\n"
        "  --prompts FILE.jsonl  one {\"prompt\": ..., \"output_len\": N} or string per line\n"
        "  --sharegpt FILE.json  ShareGPT conversations (first turn asks, the second's length,\n"
        "                        chars/4, is max_tokens unless --output-len is given)\n"
        "  --body FILE.json      kserve: the request body, sent as is\n"
        "kserve (KServe v2 / Triton; without --body):\n"
        "  --input NAME:DATATYPE:SHAPE  an input (repeatable), e.g. input:FP32:1x3x224x224;\n"
        "                        default: the inputs of BASE_URL/v2/models/MODEL\n"
        "  --shape NAME:DIMS     the shape of a metadata input with -1 dims (else they are 1)\n"
        "  --batch-size N        multiplies dim 0 of every input (default 1)\n"
        "  --input-data DIR|FILE.json  DIR/NAME.bin, raw little-endian per input (the whole\n"
        "                        tensor or one batch item), or perf_analyzer's input-data JSON\n"
        "                        ({\"data\": [{NAME: [...]}, ...]}, a body per step); default:\n"
        "                        random values from --seed\n"
        "  --tensor-format json|binary  (default json; binary: the binary tensor extension,\n"
        "                        binary outputs asked for too)\n"
        "  --request-rate R      the same as --rate\n"
        "  --num-prompts N       distinct prompts per point (default: min(requests, 1000));\n"
        "                        each point and warm-up gets prompts no earlier one sent\n"
        "  --no-stream           non-streaming requests (no TTFT/ITL); --no-ignore-eos; --seed N\n"
        "  --slo ttft=200ms,tpot=50ms,e2e=2s   goodput counts requests meeting all of them\n"
        "multi-turn chat (--endpoint chat, closed loop):\n"
        "  --sessions N          N conversations per point, -c of them at once; each turn sends\n"
        "                        the conversation so far (the server's replies included) and a\n"
        "                        new user message of --input-len words; no -n, --rate, --warmup\n"
        "  --turns K             turns per conversation (default 4)\n"
        "  --system-prompt-len L  words of the system prompt every conversation shares (default 64)\n"
        "  --session-header NAME  the header carrying the conversation's id (default X-Session-ID),\n"
        "                        for a load balancer's affinity\n"
        "replicas:\n"
        "  --replica-metrics URL[,URL...]  each replica's /metrics, read before and after each\n"
        "                        point: requests served, share, prefix-cache hit rate per replica\n"
        "output:\n"
        "  --json FILE --csv FILE --html FILE\n"
        "  --sample-interval S (0.5)  --no-metrics (skip BASE_URL/metrics)  --no-gpu (skip NVML)\n"
        "  --progress / --no-progress (default: when stderr is a terminal)\n"
        "engine mode: turbine bench --engine FILE.engine [--batch 1,8,32] [--input-len N]\n"
        "  [--output-len N] [--threads N] [--profile] [--device cpu|cuda[:N]]\n"
        "  (batches above the engine's max batch are skipped with a message)\n"
        "exit status: 0 ok, 1 the run failed (see --max-error-rate), 2 usage error\n");
}

static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "turbine bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see turbine bench --help)\n");
    return 2;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v) || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* "200ms", "2s", "1.5" (in `unit` seconds when bare) */
static int parse_time(const char *s, double unit, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return 0;
    if (!strcmp(end, "ms")) v *= 1e-3;
    else if (!strcmp(end, "us")) v *= 1e-6;
    else if (!strcmp(end, "s")) ;
    else if (!strcmp(end, "m") || !strcmp(end, "min")) v *= 60;
    else if (!*end) v *= unit;
    else return 0;
    *out = v;
    return 1;
}

static int parse_list(const char *s, double lo, double hi, double *vals, int *n) {
    char tmp[512];
    if (strlen(s) >= sizeof tmp) return 0;
    strcpy(tmp, s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_SWEEP || !parse_double(t, lo, hi, &vals[*n])) return 0;
        (*n)++;
    }
    return *n > 0;
}

static int parse_slo(const char *s, tb_bench_config *c) {
    char tmp[256];
    if (strlen(s) >= sizeof tmp) return 0;
    strcpy(tmp, s);
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) return 0;
        *eq = 0;
        double v;
        if (!parse_time(eq + 1, 1e-3, &v) || v <= 0) return 0;
        if (!strcmp(t, "ttft")) c->slo_ttft = v;
        else if (!strcmp(t, "tpot")) c->slo_tpot = v;
        else if (!strcmp(t, "e2e")) c->slo_e2e = v;
        else return 0;
    }
    return 1;
}

static char *join_url(const char *base, const char *path) {
    size_t n = strlen(base) + strlen(path) + 2;
    char *u = malloc(n);
    if (u) snprintf(u, n, "%s%s", base, path);
    return u;
}

static char *command_line(int argc, char **argv) {
    size_t n = 16;
    for (int i = 0; i < argc; i++) n += strlen(argv[i]) * 2 + 3;
    char *s = malloc(n), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "turbine bench");
    for (int i = 0; i < argc; i++) {
        int q = strpbrk(argv[i], " \t'\"$") != NULL || !*argv[i];
        *p++ = ' ';
        if (q) *p++ = '\'';
        for (const char *a = argv[i]; *a; a++) {
            if (*a == '\'') { memcpy(p, "'\\''", 4); p += 4; }
            else *p++ = *a;
        }
        if (q) *p++ = '\'';
    }
    *p = 0;
    return s;
}

/* Tokens per synthetic word on this server: POST /tokenize (vLLM's and
 * Turbine's route) with a long synthetic text; 0 when the server has no
 * such route. */
static double tokens_per_word(const char *root, const tb_bench_config *c, const char *model) {
    enum { N_WORDS = 1000 };
    double t = 0;
    char *text = tb_workload_sample_text(N_WORDS, 7), *u = join_url(root, "/tokenize"), *resp = NULL, *body = NULL;
    json_t *b = text ? json_pack("{s:s, s:s, s:b}", "model", model, "prompt", text, "add_special_tokens", 0) : NULL;
    if (b) body = json_dumps(b, JSON_COMPACT);
    long code = 0;
    if (body && u && tb_bench_http_post(u, c, body, 10, 4 << 20, &resp, &code) == TB_OK && code == 200) {
        json_error_t err;
        json_t *j = json_loads(resp, 0, &err);
        json_t *n = json_object_get(j, "count");
        if (json_is_integer(n) && json_integer_value(n) > 0) t = (double)json_integer_value(n) / N_WORDS;
        else if (json_is_array(json_object_get(j, "tokens")) && json_array_size(json_object_get(j, "tokens")))
            t = (double)json_array_size(json_object_get(j, "tokens")) / N_WORDS;
        json_decref(j);
    }
    json_decref(b);
    free(body);
    free(resp);
    free(text);
    free(u);
    return t;
}

/* Fits synthetic lengths the user did not give into the model's context
 * (max_len tokens) and says so on stderr; warns when the lengths given
 * cannot fit. Lengths are words; tpw tokens per word (0: unknown, taken as
 * 1, the estimate the workload documents). The margin covers BOS, a chat
 * template, and prompts whose words happen to be longer than the average. */
static void fit_lengths(tb_workload_options *wo, int max_len, double tpw, int in_explicit, int out_explicit) {
    double t = tpw > 0 ? tpw : 1.0;
    long margin = 8 + max_len / 16 + (wo->endpoint == TB_EP_CHAT ? 32 : 0);
    double sd_in = 3 * wo->input_stddev, sd_out = 3 * wo->output_stddev;
#define TB_NEED(in, out) ((long)ceil((wo->prefix_len + (in) + sd_in) * t) + (out) + (long)ceil(sd_out) + margin)
    int in = wo->input_len, out = wo->output_len;
    long before = TB_NEED(in, out);
    if (before <= max_len) return;
    if (!out_explicit && out > max_len / 4) out = max_len / 4 > 0 ? max_len / 4 : 1;
    if (!in_explicit) {
        double room = (double)(max_len - margin - out) - ceil(sd_out);
        long words = (long)floor(room / t - wo->prefix_len - sd_in);
        in = words < 1 ? 1 : words > in ? in : (int)words;
    }
    if (!out_explicit && TB_NEED(in, out) > max_len) {
        long o = max_len - margin - (long)ceil((wo->prefix_len + in + sd_in) * t) - (long)ceil(sd_out);
        out = o < 1 ? 1 : (int)o;
    }
    long after = TB_NEED(in, out);
    if (in != wo->input_len || out != wo->output_len)
        fprintf(stderr, "turbine bench: note: the model's max_model_len is %d; --input-len %d --output-len %d "
                        "would need about %ld tokens (%.2f tokens per word%s), so this run uses --input-len %d "
                        "--output-len %d (give them to override)\n", max_len, wo->input_len, wo->output_len, before,
                t, tpw > 0 ? " from /tokenize" : ", assumed", in, out);
    if (after > max_len)
        fprintf(stderr, "turbine bench: warning: --prefix-len %d --input-len %d --output-len %d need about %ld "
                        "tokens, more than the model's max_model_len %d: requests will likely fail\n",
                wo->prefix_len, in, out, after, max_len);
#undef TB_NEED
    wo->input_len = in;
    wo->output_len = out;
}

/* Sessions: the last turn holds the system prompt, every user message and
 * every reply; fits the lengths not given so that it stays within max_len
 * (a chat template's few tokens per message in the margin). */
static void fit_sessions(tb_workload_options *wo, int max_len, double tpw, int turns, int system_len,
                         int in_explicit, int out_explicit) {
    double t = tpw > 0 ? tpw : 1.0;
    long margin = 8 + max_len / 16 + 8L * (2 * turns + 1);
#define TB_NEED(in, out) ((long)ceil((system_len + (double)turns * ((in) + 3 * wo->input_stddev)) * t) + \
                          (long)turns * ((out) + (long)ceil(3 * wo->output_stddev)) + margin)
    int in = wo->input_len, out = wo->output_len;
    long before = TB_NEED(in, out);
    if (before > max_len) {
        if (!out_explicit && out > max_len / (4 * turns)) out = max_len / (4 * turns) > 0 ? max_len / (4 * turns) : 1;
        if (!in_explicit) {
            double room = (double)(max_len - margin) - (double)turns * (out + ceil(3 * wo->output_stddev));
            long words = (long)floor((room / t - system_len) / turns - 3 * wo->input_stddev);
            in = words < 1 ? 1 : words > in ? in : (int)words;
        }
        if (in != wo->input_len || out != wo->output_len)
            fprintf(stderr, "turbine bench: note: the model's max_model_len is %d; %d turns of --input-len %d "
                            "--output-len %d after a %d-word system prompt would need about %ld tokens, so this "
                            "run uses --input-len %d --output-len %d (give them to override)\n", max_len, turns,
                    wo->input_len, wo->output_len, system_len, before, in, out);
        if (TB_NEED(in, out) > max_len)
            fprintf(stderr, "turbine bench: warning: the last turn of a conversation needs about %ld tokens, more "
                            "than the model's max_model_len %d: later turns will likely fail\n", TB_NEED(in, out),
                    max_len);
    }
#undef TB_NEED
    wo->input_len = in;
    wo->output_len = out;
}

static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* The server's turbine_inference_* figures for `model` now (all zero, seen 0,
 * when /metrics is missing or has none). */
static void server_metrics(const char *root, const tb_bench_config *c, const char *model, tb_ks_metrics *m) {
    char *u = join_url(root, "/metrics"), *text = NULL;
    long code = 0;
    memset(m, 0, sizeof *m);
    if (u && tb_bench_http_get(u, c, 5, 16 << 20, &text, &code) == TB_OK && code == 200 && text)
        tb_ks_metrics_parse(text, model, m);
    free(text);
    free(u);
}

/* kserve without --body: the inputs from --input or the model's metadata
 * (GET /v2/models/MODEL, which also names the outputs responses must
 * hold), --shape for dynamic dims, --batch-size. 0: ready; else the error
 * is printed. */
static int kserve_setup(const char *root, tb_bench_config *c, tb_workload_options *wo, tb_ks_spec *ks,
                        const char *const *shapes, int n_shapes) {
    char p[1200];
    if (strlen(wo->model) > 1000) { fprintf(stderr, "turbine bench: error: model name too long\n"); return 1; }
    snprintf(p, sizeof p, "%s/v2/models/%s", root, wo->model);
    char *meta = NULL;
    long code = 0;
    if (tb_bench_http_get(p, c, 10, 1 << 20, &meta, &code) != TB_OK || code != 200) {
        free(meta);
        meta = NULL;
    }
    tb_ks_spec md;
    int have_md = meta && tb_ks_spec_from_metadata(meta, &md) == TB_OK;
    if (meta && !have_md && !ks->n_inputs)
        fprintf(stderr, "turbine bench: error: %s: %s\n", p, tb_last_error());
    int got = meta != NULL;
    free(meta);
    if (!ks->n_inputs) {
        if (!have_md) {
            if (!got) fprintf(stderr, "turbine bench: error: no --input given and %s answered no metadata (HTTP %ld)\n", p, code);
            return 1;
        }
        int binary = ks->binary;
        *ks = md;
        ks->binary = binary;
        for (int i = 0; i < n_shapes; i++)
            if (tb_ks_apply_shape(ks, shapes[i]) != TB_OK) {
                fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
                return 1;
            }
        tb_ks_fix_dynamic(ks);
    } else {
        if (n_shapes) { fprintf(stderr, "turbine bench: error: --shape applies to inputs from the metadata; --input gives whole shapes\n"); return 1; }
        if (have_md) { /* the outputs every response must hold */
            memcpy(ks->outputs, md.outputs, sizeof md.outputs);
            ks->n_outputs = md.n_outputs;
        }
    }
    if (tb_ks_apply_batch(ks, wo->batch_size > 0 ? wo->batch_size : 1) != TB_OK) {
        fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
        return 1;
    }
    fprintf(stderr, "turbine bench: %s request:", ks->binary ? "binary" : "JSON");
    for (int i = 0; i < ks->n_inputs; i++) {
        const tb_ks_tensor *t = &ks->inputs[i];
        fprintf(stderr, " %s:%s:", t->name, t->datatype);
        for (int k = 0; k < t->n_dims; k++) fprintf(stderr, "%s%lld", k ? "x" : "", (long long)t->dims[k]);
    }
    fprintf(stderr, "%s\n", ks->n_outputs ? "" : " (outputs unknown: responses checked for any)");
    wo->kserve_spec = ks;
    c->kserve = ks;
    return 0;
}

int tb_cli_bench(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--engine")) return tb_bench_engine_main(argc, argv);
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { print_usage(stdout); return 0; }
    }
    tb_bench_config c;
    tb_bench_config_default(&c);
    tb_workload_options wo;
    memset(&wo, 0, sizeof wo);
    wo.input_len = 512;
    wo.output_len = 128;
    wo.stream = 1;
    wo.ignore_eos = 1;
    c.stream = 1;
    const char *base_arg = NULL, *json_path = NULL, *csv_path = NULL, *html_path = NULL;
    const char *endpoint = "completions";
    double conc[MAX_SWEEP] = {1}, rates[MAX_SWEEP];
    int n_conc = 1, n_rates = 0, progress = isatty(2);
    long num_prompts = 0;
    int in_explicit = 0, out_explicit = 0;
    double max_err_rate = 0.5;
    c.api_key = getenv("OPENAI_API_KEY");
    static tb_ks_spec ks; /* large; one per process */
    memset(&ks, 0, sizeof ks);
    const char *shapes[TB_KS_MAX_TENSORS];
    int n_shapes = 0, ks_format_given = 0;
    char icl_header[96];
    long n_sessions = 0, n_turns = 0, system_len = -1;
    const char *session_header = NULL, *replica_arg = NULL;
    int requests_given = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
#define NEED() do { if (!v) return usage("%s needs a value", a); i++; } while (0)
        if (a[0] != '-') {
            if (base_arg) return usage("unexpected argument '%s'", a);
            base_arg = a;
        } else if (!strcmp(a, "--endpoint")) { NEED(); endpoint = v; }
        else if (!strcmp(a, "--model")) { NEED(); wo.model = v; }
        else if (!strcmp(a, "--api-key")) { NEED(); c.api_key = v; }
        else if (!strcmp(a, "-H") || !strcmp(a, "--header")) {
            NEED();
            if (c.n_headers >= TB_BENCH_MAX_HEADERS || !strchr(v, ':') || strlen(v) > 4096)
                return usage("bad or too many headers at '%s'", v);
            c.headers[c.n_headers++] = v;
        } else if (!strcmp(a, "--timeout")) { NEED(); if (!parse_time(v, 1, &c.timeout)) return usage("bad --timeout '%s'", v); }
        else if (!strcmp(a, "--connect-timeout")) { NEED(); if (!parse_time(v, 1, &c.connect_timeout) || c.connect_timeout <= 0) return usage("bad --connect-timeout '%s'", v); }
        else if (!strcmp(a, "--http-client")) {
            NEED();
            if (!strcmp(v, "auto")) c.http_client = TB_HTTP_CLIENT_AUTO;
            else if (!strcmp(v, "builtin")) c.http_client = TB_HTTP_CLIENT_BUILTIN;
            else if (!strcmp(v, "curl")) c.http_client = TB_HTTP_CLIENT_CURL;
            else return usage("--http-client is auto, builtin or curl, not '%s'", v);
        }
        else if (!strcmp(a, "-c") || !strcmp(a, "--concurrency")) { NEED(); if (!parse_list(v, 1, 100000, conc, &n_conc)) return usage("bad --concurrency '%s' (N or N,N,... in [1, 100000])", v); }
        else if (!strcmp(a, "--rate") || !strcmp(a, "--request-rate")) { NEED(); if (!parse_list(v, 1e-3, 1e6, rates, &n_rates)) return usage("bad --rate '%s'", v); }
        else if (!strcmp(a, "--arrivals")) {
            NEED();
            if (!strcmp(v, "poisson")) c.poisson = 1;
            else if (!strcmp(v, "constant")) c.poisson = 0;
            else return usage("--arrivals is poisson or constant, not '%s'", v);
        } else if (!strcmp(a, "--max-inflight")) { NEED(); if (!parse_long(v, 1, 100000, &l)) return usage("bad --max-inflight '%s'", v); c.max_inflight = (int)l; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--requests")) { NEED(); if (!parse_long(v, 1, 100000000, &c.requests)) return usage("bad --requests '%s'", v); requests_given = 1; }
        else if (!strcmp(a, "--sessions")) { NEED(); if (!parse_long(v, 1, 100000, &n_sessions)) return usage("bad --sessions '%s' (conversations, in [1, 100000])", v); }
        else if (!strcmp(a, "--turns")) { NEED(); if (!parse_long(v, 1, 1000, &n_turns)) return usage("bad --turns '%s' (turns per conversation, in [1, 1000])", v); }
        else if (!strcmp(a, "--system-prompt-len")) { NEED(); if (!parse_long(v, 0, 1000000, &system_len)) return usage("bad --system-prompt-len '%s' (words, in [0, 1000000])", v); }
        else if (!strcmp(a, "--session-header")) {
            NEED();
            size_t hl = strlen(v);
            if (!hl || hl > 100 || strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != hl)
                return usage("bad --session-header '%s' (a header name: letters, digits, '-' or '_', at most 100)", v);
            session_header = v;
        }
        else if (!strcmp(a, "--replica-metrics")) { NEED(); replica_arg = v; }
        else if (!strcmp(a, "-d") || !strcmp(a, "--duration")) { NEED(); if (!parse_time(v, 1, &c.duration) || c.duration <= 0 || c.duration > 7 * 86400) return usage("bad --duration '%s'", v); }
        else if (!strcmp(a, "--max-error-rate")) { NEED(); if (!parse_double(v, 0, 1, &max_err_rate)) return usage("bad --max-error-rate '%s' (a fraction in [0, 1])", v); }
        else if (!strcmp(a, "--warmup")) { NEED(); if (!parse_long(v, 0, 1000000, &c.warmup)) return usage("bad --warmup '%s'", v); }
        else if (!strcmp(a, "--input-len")) { NEED(); if (!parse_long(v, 1, 1000000, &l)) return usage("bad --input-len '%s'", v); wo.input_len = (int)l; in_explicit = 1; }
        else if (!strcmp(a, "--prefix-len")) { NEED(); if (!parse_long(v, 0, 1000000, &l)) return usage("bad --prefix-len '%s'", v); wo.prefix_len = (int)l; }
        else if (!strcmp(a, "--output-len")) { NEED(); if (!parse_long(v, 1, 1000000, &l)) return usage("bad --output-len '%s'", v); wo.output_len = (int)l; out_explicit = 1; }
        else if (!strcmp(a, "--input-len-stddev")) { NEED(); if (!parse_double(v, 0, 1e6, &wo.input_stddev)) return usage("bad --input-len-stddev '%s'", v); }
        else if (!strcmp(a, "--output-len-stddev")) { NEED(); if (!parse_double(v, 0, 1e6, &wo.output_stddev)) return usage("bad --output-len-stddev '%s'", v); }
        else if (!strcmp(a, "--prompts")) { NEED(); wo.jsonl_path = v; }
        else if (!strcmp(a, "--sharegpt")) { NEED(); wo.sharegpt_path = v; }
        else if (!strcmp(a, "--body")) { NEED(); wo.body_path = v; }
        else if (!strcmp(a, "--input")) {
            NEED();
            if (ks.n_inputs >= TB_KS_MAX_TENSORS) return usage("more than %s --input", "16");
            if (tb_ks_parse_input(v, &ks.inputs[ks.n_inputs]) != TB_OK) return usage("%s", tb_last_error());
            ks.n_inputs++;
        } else if (!strcmp(a, "--shape")) {
            NEED();
            if (n_shapes >= TB_KS_MAX_TENSORS || !strchr(v, ':')) return usage("bad or too many --shape at '%s'", v);
            shapes[n_shapes++] = v;
        } else if (!strcmp(a, "--batch-size")) { NEED(); if (!parse_long(v, 1, 1 << 20, &l)) return usage("bad --batch-size '%s'", v); wo.batch_size = (int)l; }
        else if (!strcmp(a, "--input-data")) { NEED(); wo.input_data_dir = v; }
        else if (!strcmp(a, "--tensor-format")) {
            NEED();
            if (!strcmp(v, "json")) ks.binary = 0;
            else if (!strcmp(v, "binary")) ks.binary = 1;
            else return usage("--tensor-format is json or binary, not '%s'", v);
            ks_format_given = 1;
        }
        else if (!strcmp(a, "--num-prompts")) { NEED(); if (!parse_long(v, 1, 100000, &num_prompts)) return usage("bad --num-prompts '%s'", v); }
        else if (!strcmp(a, "--seed")) { NEED(); if (!parse_long(v, 0, 1L << 62, &l)) return usage("bad --seed '%s'", v); wo.seed = c.seed = (uint64_t)l; }
        else if (!strcmp(a, "--stream")) { wo.stream = c.stream = 1; }
        else if (!strcmp(a, "--no-stream")) { wo.stream = c.stream = 0; }
        else if (!strcmp(a, "--no-ignore-eos")) { wo.ignore_eos = 0; }
        else if (!strcmp(a, "--slo")) { NEED(); if (!parse_slo(v, &c)) return usage("bad --slo '%s' (e.g. ttft=200ms,tpot=50ms,e2e=2s)", v); }
        else if (!strcmp(a, "--json")) { NEED(); json_path = v; }
        else if (!strcmp(a, "--csv")) { NEED(); csv_path = v; }
        else if (!strcmp(a, "--html")) { NEED(); html_path = v; }
        else if (!strcmp(a, "--sample-interval")) { NEED(); if (!parse_time(v, 1, &d) || d < 0.01 || d > 3600) return usage("bad --sample-interval '%s'", v); c.sample_interval = d; }
        else if (!strcmp(a, "--no-metrics")) { c.scrape_metrics = 0; }
        else if (!strcmp(a, "--no-gpu")) { c.gpu = 0; }
        else if (!strcmp(a, "--progress")) { progress = 1; }
        else if (!strcmp(a, "--no-progress")) { progress = 0; }
        else return usage("unknown option '%s'", a);
#undef NEED
    }
    if (!base_arg) return usage("%s", "needs BASE_URL (e.g. http://127.0.0.1:8000)");
    if (strncmp(base_arg, "http://", 7) && strncmp(base_arg, "https://", 8))
        return usage("BASE_URL must start with http:// or https://, not '%s'", base_arg);
    if (strlen(base_arg) > 2000) return usage("%s", "BASE_URL is too long");
    if (!strcmp(endpoint, "completions")) wo.endpoint = TB_EP_COMPLETIONS;
    else if (!strcmp(endpoint, "chat")) wo.endpoint = TB_EP_CHAT;
    else if (!strcmp(endpoint, "kserve")) wo.endpoint = TB_EP_KSERVE;
    else if (!strcmp(endpoint, "get")) wo.endpoint = TB_EP_GET;
    else return usage("--endpoint is completions, chat, kserve or get, not '%s'", endpoint);
    if (c.http_client == TB_HTTP_CLIENT_BUILTIN && !tb_h1_supports(base_arg))
        return usage("--http-client builtin takes plain http://host[:port]/path URLs, not '%s'", base_arg);
    if (wo.jsonl_path && wo.sharegpt_path) return usage("%s", "--prompts and --sharegpt exclude each other");
    if (wo.prefix_len && (wo.jsonl_path || wo.sharegpt_path))
        return usage("%s", "--prefix-len applies to synthetic prompts, not to --prompts or --sharegpt");
    if (n_sessions) {
        if (wo.endpoint != TB_EP_CHAT) return usage("%s", "--sessions are chat conversations: give --endpoint chat");
        if (n_rates) return usage("%s", "--rate does not apply to --sessions: a conversation's next turn waits for "
                                        "the reply; -c sets how many conversations are in flight");
        if (requests_given) return usage("%s", "-n does not apply to --sessions: a point sends --sessions x --turns requests");
        if (c.warmup) return usage("%s", "--warmup does not apply to --sessions");
        if (wo.jsonl_path || wo.sharegpt_path || wo.prefix_len)
            return usage("%s", "--sessions make their own prompts: no --prompts, --sharegpt or --prefix-len "
                               "(--system-prompt-len gives the shared start)");
        if (!n_turns) n_turns = 4;
        if (system_len < 0) system_len = 64;
        if (n_sessions * n_turns > 100000) return usage("%s", "--sessions x --turns is at most 100000 requests");
    } else if (n_turns || system_len >= 0 || session_header) {
        return usage("%s", "--turns, --system-prompt-len and --session-header need --sessions N");
    }
    static char replica_buf[TB_BENCH_MAX_REPLICAS][600];
    static const char *replica_urls[TB_BENCH_MAX_REPLICAS];
    if (replica_arg) {
        char tmp[TB_BENCH_MAX_REPLICAS * 520];
        if (strlen(replica_arg) >= sizeof tmp) return usage("%s", "--replica-metrics is too long");
        strcpy(tmp, replica_arg);
        for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (c.n_replicas >= TB_BENCH_MAX_REPLICAS) return usage("more than %s --replica-metrics URLs", "64");
            if ((strncmp(t, "http://", 7) && strncmp(t, "https://", 8)) || strlen(t) > 500)
                return usage("bad --replica-metrics URL '%s' (http:// or https://, at most 500 characters)", t);
            /* a bare http://host:port means its /metrics */
            const char *path = strchr(t + (t[4] == 's' ? 8 : 7), '/');
            snprintf(replica_buf[c.n_replicas], sizeof replica_buf[0], "%s%s", t,
                     !path || !strcmp(path, "/") ? (path ? "metrics" : "/metrics") : "");
            replica_urls[c.n_replicas] = replica_buf[c.n_replicas];
            c.n_replicas++;
        }
        if (!c.n_replicas) return usage("%s", "--replica-metrics needs at least one URL");
        c.replica_urls = replica_urls;
    }
    c.session_header = session_header;
    if (c.requests == 0 && c.duration == 0 && !n_sessions) c.requests = 100;
    int ks_opts = ks.n_inputs || n_shapes || wo.batch_size || wo.input_data_dir || ks_format_given;
    if (ks_opts && wo.endpoint != TB_EP_KSERVE)
        return usage("%s", "--input, --shape, --batch-size, --input-data and --tensor-format are for --endpoint kserve");
    if (ks_opts && wo.body_path) return usage("%s", "--body is sent as is: it excludes --input, --shape, --batch-size, --input-data and --tensor-format");
    /* ShareGPT: each answer's own length, unless --output-len is given */
    if (wo.sharegpt_path && !out_explicit) wo.output_len = 0;
    c.endpoint = wo.endpoint;
    if (wo.endpoint != TB_EP_COMPLETIONS && wo.endpoint != TB_EP_CHAT) c.stream = 0;
    c.progress = progress;
    raise_fd_limit();

    char base[2048];
    snprintf(base, sizeof base, "%s", base_arg);
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] == '/') base[--bl] = 0;
    /* a base given as .../v1 keeps working */
    int has_v1 = bl >= 3 && !strcmp(base + bl - 3, "/v1");
    char root[2048];
    snprintf(root, sizeof root, "%.*s", (int)(has_v1 ? bl - 3 : bl), base);
    c.base_url = root;

    int rc = 1;
    char *models_json = NULL, *model_owned = NULL, *url = NULL, *cmd = command_line(argc, argv);
    tb_workload *w = NULL;
    tb_bench_result *points = NULL;
    int n_points = 0;

    if (wo.endpoint != TB_EP_GET) {
        char *mu = join_url(root, "/v1/models");
        long code = 0;
        if (mu && tb_bench_http_get(mu, &c, 10, 1 << 20, &models_json, &code) == TB_OK && code != 200) {
            free(models_json);
            models_json = NULL;
        }
        free(mu);
        if (!wo.model && models_json) wo.model = model_owned = tb_bench_first_model(models_json);
        if (!wo.model) {
            fprintf(stderr, "turbine bench: error: no --model given and %s/v1/models named none%s%s\n",
                    root, *tb_last_error() ? ": " : "", tb_last_error());
            goto done;
        }
        int max_len = tb_bench_max_model_len(models_json, wo.model);
        int synthetic = !wo.jsonl_path && !wo.sharegpt_path &&
                        (wo.endpoint == TB_EP_COMPLETIONS || wo.endpoint == TB_EP_CHAT);
        if (max_len > 0 && synthetic && n_sessions)
            fit_sessions(&wo, max_len, tokens_per_word(root, &c, wo.model), (int)n_turns, (int)system_len,
                         in_explicit, out_explicit);
        else if (max_len > 0 && synthetic)
            fit_lengths(&wo, max_len, tokens_per_word(root, &c, wo.model), in_explicit, out_explicit);
    }
    if (wo.endpoint == TB_EP_KSERVE && !wo.body_path && kserve_setup(root, &c, &wo, &ks, shapes, n_shapes) != 0)
        goto done;
    if (wo.endpoint == TB_EP_COMPLETIONS) url = join_url(root, "/v1/completions");
    else if (wo.endpoint == TB_EP_CHAT) url = join_url(root, "/v1/chat/completions");
    else if (wo.endpoint == TB_EP_KSERVE) {
        char p[1100];
        if (strlen(wo.model) > 1000) { fprintf(stderr, "turbine bench: error: model name too long\n"); goto done; }
        snprintf(p, sizeof p, "/v2/models/%s/infer", wo.model);
        url = join_url(root, p);
    } else url = strdup(base_arg);
    if (!url) { fprintf(stderr, "turbine bench: error: out of memory\n"); goto done; }
    c.url = url;

    int open = n_rates > 0;
    int n_sweep = open ? n_rates : n_conc;
    /* every point gets warm + per prompts of its own (warm-up first) */
    long want = c.requests > 0 ? c.requests : 1000;
    long per = num_prompts > 0 ? num_prompts : want < 1000 ? want : 1000;
    long warm = c.warmup < per ? c.warmup : per;
    int sliced = wo.endpoint == TB_EP_COMPLETIONS || wo.endpoint == TB_EP_CHAT;
    if (sliced && (long)n_sweep * (warm + per) > 100000) {
        long p2 = 100000 / n_sweep - warm;
        if (p2 < 1) { warm = 100000 / n_sweep / 2; p2 = 100000 / n_sweep - warm; }
        fprintf(stderr, "turbine bench: note: %ld distinct prompts per point instead of %ld (at most 100000 in a run)\n",
                p2, per);
        per = p2;
    }
    wo.n_prompts = (int)(sliced ? n_sweep * (warm + per) : per);
    if (n_sessions) sliced = 0;
    if (!n_sessions && tb_workload_load(&wo, &w) != TB_OK) {
        fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
        goto done;
    }
    if (sliced && (long)w->n < (long)n_sweep * (warm + per)) { /* tb_workload_load fills what it is asked */
        fprintf(stderr, "turbine bench: error: the workload has %d requests, the run needs %ld\n", w->n,
                (long)n_sweep * (warm + per));
        goto done;
    }
    if (sliced && w && w->n_source < w->n)
        fprintf(stderr, "turbine bench: note: %s holds %d prompts and the run sends %d different ones (%ld per "
                        "point%s): prompts repeat, so a server's prefix cache may reuse earlier ones\n",
                wo.jsonl_path ? wo.jsonl_path : wo.sharegpt_path, w->n_source, w->n, warm + per,
                warm ? " with the warm-up" : "");
    tb_bench_config scrape_c = c; /* /metrics GETs: without the infer-only header below */
    if (wo.kserve_spec && ks.binary) {
        if (c.n_headers >= TB_BENCH_MAX_HEADERS) { fprintf(stderr, "turbine bench: error: too many headers\n"); goto done; }
        snprintf(icl_header, sizeof icl_header, "Inference-Header-Content-Length: %zu", w->ks_header_len);
        c.headers[c.n_headers++] = icl_header;
    }
    points = calloc((size_t)n_sweep, sizeof *points);
    if (!points) goto done;
    time_t now_t = time(NULL);
    char started[32];
    strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now_t));
    for (int i = 0; i < n_sweep; i++) {
        char label[64];
        if (open) { c.rate = rates[i]; snprintf(label, sizeof label, "rate=%g", rates[i]); }
        else { c.rate = 0; c.concurrency = (int)conc[i]; snprintf(label, sizeof label, "c=%d", c.concurrency); }
        c.label = label;
        if (tb_bench_result_init(&points[i]) != TB_OK) { fprintf(stderr, "turbine bench: error: %s\n", tb_last_error()); goto done; }
        n_points++;
        tb_workload view = {0};
        if (w) view = *w;
        tb_sessions *sess = NULL;
        if (n_sessions && tb_sessions_create(&wo, (int)n_sessions, (int)n_turns, (int)system_len, i, &sess) != TB_OK) {
            fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
            goto done;
        }
        c.sessions = sess;
        if (sliced) {
            view.reqs = w->reqs + (size_t)i * (size_t)(warm + per);
            view.n = (int)(warm + per);
            view.n_warmup = (int)warm;
        }
        tb_ks_metrics before;
        int scrape = wo.endpoint == TB_EP_KSERVE && c.scrape_metrics;
        if (scrape) server_metrics(root, &scrape_c, wo.model, &before);
        tb_status rs = tb_bench_run(&c, w ? &view : NULL, &points[i]);
        c.sessions = NULL;
        tb_sessions_free(sess);
        if (rs != TB_OK) {
            fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
            goto done;
        }
        if (scrape) {
            tb_ks_metrics after;
            server_metrics(root, &scrape_c, wo.model, &after);
            points[i].server = malloc(sizeof *points[i].server);
            if (points[i].server) {
                tb_ks_metrics_delta(&after, &before, points[i].server);
                points[i].server->seen = before.seen && after.seen;
            }
        }
        const tb_bench_result *p = &points[i];
        fprintf(stderr, "%s: %ld ok, %ld failed in %.2fs, %.2f req/s, %.1f output tok/s\n", label,
                p->n_ok, p->n_err, p->duration, p->qps, p->out_tps);
    }
    tb_bench_report rep = {
        .command_line = cmd, .target = url, .endpoint = tb_endpoint_name(wo.endpoint),
        .model = wo.model, .models_json = models_json, .started_at = started, .config = &c,
        .workload = &wo, .points = points, .n_points = n_points};
    c.rate = open ? rates[0] : 0;
    tb_report_summary(stdout, &rep);
    rc = 0;
    if (json_path && tb_report_json(json_path, &rep) != TB_OK) rc = 1;
    if (rc == 0 && csv_path && tb_report_csv(csv_path, &rep) != TB_OK) rc = 1;
    if (rc == 0 && html_path && tb_report_html(html_path, &rep) != TB_OK) rc = 1;
    if (rc) fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
    /* a run whose requests failed is a failed run, for scripts and CI */
    for (int i = 0; i < n_points; i++) {
        const tb_bench_result *p = &points[i];
        long done_n = p->n_ok + p->n_err;
        double er = done_n ? (double)p->n_err / (double)done_n : 1.0;
        if (p->n_ok > 0 && er <= max_err_rate) continue;
        if (!done_n) fprintf(stderr, "turbine bench: error: %s: no request completed\n", points[i].label);
        else fprintf(stderr, "turbine bench: error: %s: %ld of %ld requests failed (%.0f%%%s)%s%s\n", p->label,
                     p->n_err, done_n, 100 * er, p->n_ok ? ", above --max-error-rate" : "",
                     p->first_error[0] ? "; first: " : "", p->first_error);
        rc = 1;
    }
done:
    for (int i = 0; i < n_points; i++) tb_bench_result_free(&points[i]);
    free(points);
    tb_workload_free(w);
    tb_nvml_close();
    free(models_json);
    free(model_owned);
    free(url);
    free(cmd);
    return rc;
}
