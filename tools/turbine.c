/*
 * turbine.c — the command-line interface: build, run, inspect, help and the
 * dispatch to serve, bench and perplexity.
 *
 * Only this file prints to the user and exits; everything else returns a
 * tb_status with a message.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/core.h"
#include "core/kv_layout.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"
#include "tune/calib.h"
#include "turbine/turbine.h"

#define TB_VERSION "0.1.0"

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "turbine: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see turbine --help)\n");
    return 2;
}

static int fail(const char *what) {
    fprintf(stderr, "turbine: error: %s%s%s\n", what ? what : "", what && *tb_last_error() ? ": " : "",
            tb_last_error());
    return 1;
}

/* ---------------------------------------------------------------- build */

typedef struct {
    const char *model, *out, *tokenizer, *dtype, *device;
    const char *shapes, *min_shapes, *opt_shapes, *max_shapes, *calib_data;
    tb_cli_strs profiles;
    int max_seq_len, max_batch, max_step_tokens, verbose;
    /* calibration (quantized engines) */
    const char *calib, *calibrator, *calib_cache;
    int calib_tokens, calib_threads;
    /* quantized engines */
    tb_cli_strs overrides;
    int group_size, zero_point, awq;
    const char *qmm_tactics;
    int tp;
} build_args;

static void build_defaults(void *p) {
    build_args *a = p;
    memset(a, 0, sizeof *a);
    a->dtype = "f32";
    a->max_batch = 8;
}

#define B(f) offsetof(build_args, f)
static const tb_cli_opt build_opts[] = {
    {"-o", "--output", TB_OPT_STR, "FILE.engine", 0, 0, TB_OPT_REQUIRED, 0, 0, B(out), NULL,
     "the engine file to write"},
    {"--tokenizer", NULL, TB_OPT_STR, "FILE", 0, 0, 0, 0, 0, B(tokenizer), "MODEL's tokenizer.json",
     "a tokenizer.json (byte-level or SentencePiece-style BPE) or a llama2.c tokenizer.bin; needed for a "
     "llama2.c .bin checkpoint"},
    {"--dtype", NULL, TB_OPT_STR, "f32|f16|bf16|int8|int4|fp8", 0, 0, 0, 0, 0, B(dtype), "f32",
     "the weights' precision in the engine (ONNX: f32, f16 computing in f16 too, or int8: Conv / Gemm / MatMul "
     "quantized, calibrated on --calib-data, CPU only); int8: symmetric, a "
     "scale per output channel; int4: a scale per --group-size weights of a row; fp8: E4M3 with a scale per "
     "output channel. Quantized engines keep the embedding f16, norms and biases f32, and the LM head f16 "
     "(int8 in int4 engines: it is the largest matmul of a small model); --override changes that. An engine runs "
     "on the backend it is built for (--device): int8, int4 and fp8 engines built with --device cuda take the "
     "GPU's quantized kernels"},
    {"--group-size", NULL, TB_OPT_INT, "32|64|128", 32, 128, 0, 0, 0, B(group_size), "128",
     "--dtype int4: weights of a row sharing one scale (smaller: more accurate, larger engine; 128 measured as "
     "accurate as 32 and 64 on the demo model, docs/PERFORMANCE.md). A matrix whose rows are not whole groups "
     "is int8"},
    {"--zero-point", NULL, TB_OPT_FLAG, NULL, 0, 0, 0, 0, 1, B(zero_point), NULL,
     "--dtype int4: asymmetric groups, a zero point per group beside the scale (default symmetric)"},
    {"--awq", NULL, TB_OPT_FLAG, NULL, 0, 0, 0, 0, 1, B(awq), NULL,
     "--dtype int4: activation-aware quantization (AWQ), searched on the calibration activations (needs "
     "--calib or --calib-cache) to minimise each matmul's output error: per-input-channel scales folded into "
     "the RMSNorm before q|k|v and gate|up, into wv's rows before wo and into wup's before wdown; then a clip "
     "range per row and group for every int4 matmul (the head is int8 by default and gets neither)"},
    {"--qmm-tactics", NULL, TB_OPT_CHOICE, "auto|exact|q8", 0, 0, 0, 0, 0, B(qmm_tactics), "auto",
     "quantized engines: the CPU kernels of the quantized matmuls. auto times them on this machine and keeps the "
     "fastest, the one that rounds the activations to int8 per block of 32 (Q8, integer dot products) included; "
     "exact only those that dequantise the weights and sum in f32 (the logits then equal an f32 engine's of the "
     "dequantised weights); q8 takes Q8 wherever it applies (int8 and int4 weights; with --device cuda also the "
     "GPU's one-token GEMVs, and int8 weights in steps of 9+ tokens on the int8 tensor cores with x rounded "
     "to int8 a token). `turbine inspect` shows "
     "how many matmuls run Q8 (q8_decode_nodes, q8_prefill_nodes)"},
    {"--override", NULL, TB_OPT_STRS, "NAME_GLOB=DTYPE", 0, 0, 0, 0, 0, B(overrides), NULL,
     "a weight's dtype instead of the default, by its name in the engine (`turbine inspect` lists them: embed, "
     "l0.wqkv, l0.wo, l0.wgu, l0.wdown, ..., lm_head), e.g. 'lm_head=int8' or 'l0.*=f16'; repeatable, the "
     "last match wins; DTYPE f32, f16, bf16, int8, int4 or fp8. ONNX --dtype int8: GLOB matches a Conv / Gemm / "
     "MatMul's output or weight name, 'GLOB=f32' keeps it in f32"},
    {"--max-seq-len", NULL, TB_OPT_INT, "N", 1, 1 << 20, 0, 0, 0, B(max_seq_len), "the model's context length",
     "the engine's context length in tokens"},
    {"--max-batch", NULL, TB_OPT_INT, "N", 1, 1024, 0, 0, 0, B(max_batch), "8",
     "sequences decoded together (serve's --max-num-seqs is at most this)"},
    {"--max-step-tokens", NULL, TB_OPT_INT, "N", 16, 1 << 16, 0, 0, 0, B(max_step_tokens), "2048 for --device cuda, else 512",
     "the most tokens one engine step carries, prompt chunks and decodes together (serve's --max-batched-tokens "
     "is at most this; larger steps prefill many prompts faster on a GPU and take more activation memory)"},
    {"--device", NULL, TB_OPT_STR, "cpu|cuda[:N]", 0, 0, 0, 0, 0, B(device), "cpu",
     "the backend the engine is built and tuned for"},
    {"--tp", NULL, TB_OPT_INT, "1|2|4|8", 1, 8, 0, 0, 0, B(tp), "1",
     "tensor parallelism: the model split over this many ranks (Megatron-style: attention heads and the MLP's "
     "columns divided, an all-reduce after o_proj and down, embedding and LM head split by vocabulary), each "
     "rank's shard a section of the engine; heads, KV heads, MLP size and vocabulary must divide by it. The ranks "
     "run as threads of one process: on the CPU they share the cores; with --device cuda:I rank r runs on GPU "
     "I + r, NCCL between them (TURBINE_TP_ONE_DEVICE=1 puts every rank on GPU I, for testing)"},
    {"--shapes", NULL, TB_OPT_STR, "IN:1x3x224x224,...", 0, 0, 0, 0, 0, B(shapes), "the model's fixed dims",
     "ONNX: fixed input shapes (min = opt = max)"},
    {"--min-shapes", NULL, TB_OPT_STR, "IN:1x3x224x224,...", 0, 0, 0, 0, 0, B(min_shapes), NULL,
     "ONNX: the optimisation profile's smallest input shapes"},
    {"--opt-shapes", NULL, TB_OPT_STR, "IN:8x3x224x224,...", 0, 0, 0, 0, 0, B(opt_shapes), NULL,
     "ONNX: the shapes kernels are tuned for"},
    {"--max-shapes", NULL, TB_OPT_STR, "IN:32x3x224x224,...", 0, 0, 0, 0, 0, B(max_shapes), NULL,
     "ONNX: the largest input shapes the engine accepts"},
    {"--profile", NULL, TB_OPT_STRS, "IN:MIN/OPT/MAX,...", 0, 0, 0, 0, 0, B(profiles), NULL,
     "ONNX: one optimisation profile per value, e.g. x:1x3x224x224/8x3x224x224/32x3x224x224 (one shape: "
     "fixed); repeatable, instead of --shapes / --min-shapes / --opt-shapes / --max-shapes"},
    {"--calib-data", NULL, TB_OPT_STR, "DIR", 0, 0, 0, 0, 0, B(calib_data), "random inputs at the opt shapes",
     "ONNX: input sets, DIR/test_data_set_N/input_K.pb (or DIR/input_K.pb) or DIR/NAME_N.npy / "
     "DIR/input_K_N.npy (f32 or int64, C order); --dtype int8 calibrates on them (required unless the model "
     "has Q/DQ nodes or --calib-cache exists), and int8 / f16 engines are checked on them against f32 "
     "(top-1 agreement, max error)"},
    {"--verbose", "-v", TB_OPT_FLAG, NULL, 0, 0, 0, 0, 1, B(verbose), NULL,
     "list every optimisation pass with what it changed"},
    /* ---- calibration (quantized engines: src/tune/calib.h, src/plan/calib_run.c) ---- */
    {"--calib", NULL, TB_OPT_STR, "FILE", 0, 0, 0, 0, 0, B(calib), NULL,
     "calibration data: a text (tokenized with the model's tokenizer) or a file of token ids (numbers "
     "separated by spaces, newlines or commas); an f32 engine of the model runs over it on the CPU and "
     "collects each matmul input's statistics (at most 256 MiB)"},
    {"--calib-tokens", NULL, TB_OPT_INT, "N", 2, 1 << 24, 0, 0, 0, B(calib_tokens), "4096",
     "calibration tokens taken from the start of --calib, in windows of the engine's context"},
    {"--calibrator", NULL, TB_OPT_STR, "entropy|minmax|percentile[=P]|mse", 0, 0, 0, 0, 0, B(calibrator),
     "entropy",
     "how activation ranges are chosen: entropy (least KL divergence, as TensorRT's EntropyCalibrator2), minmax "
     "(the largest |x| seen), percentile=P (the P-th percentile of |x|, default 99.99), mse (least int8 "
     "quantisation error). ONNX --dtype int8 defaults to percentile=99.99"},
    {"--calib-cache", NULL, TB_OPT_STR, "FILE", 0, 0, 0, 0, 0, B(calib_cache), NULL,
     "the calibration cache: read when it exists (the model is not run; a cache of another model, calibrator "
     "or format version is refused), else written after calibrating (LLM checkpoints and ONNX --dtype int8)"},
    {"--calib-threads", NULL, TB_OPT_INT, "N", 1, 256, 0, 0, 0, B(calib_threads), "one per core",
     "CPU threads of the calibration run"},
    /* ---- end of calibration options ---- */
};
#undef B

static const tb_cli_cmd cmd_build_spec = {
    "build",
    "Compiles a model into an engine file: imports the weights, converts them to --dtype, tunes the kernels "
    "on this machine and writes one file that run, serve, bench and perplexity load.",
    {"MODEL"}, {offsetof(build_args, model)}, 1, 1,
    build_opts, sizeof build_opts / sizeof build_opts[0],
    "MODEL is a folder with config.json and model.safetensors (or a sharded model.safetensors.index.json) of "
    "a LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM with f32, f16 or bf16 tensors, or a llama2.c "
    ".bin checkpoint, or an .onnx model (opsets 13 to 21; `turbine exec --list-ops` lists the op types). A "
    "tokenizer with more tokens than the model's vocabulary is refused; one with fewer (models that pad their "
    "vocabulary, such as Qwen2) is accepted with a warning, and an id beyond it prints as U+FFFD. An ONNX "
    "model's dynamic dims need a profile (--min-shapes, --opt-shapes, --max-shapes, or --shapes for fixed "
    "ones, or several --profile values: the engine is compiled once for their envelope and accepts inputs "
    "inside any of them); inputs outside are refused when the engine runs. An ONNX engine built with --dtype "
    "f16 computes in f16 (inputs and outputs keep the model's dtypes); the build prints its error against "
    "the f32 graph. f16 is meant for the GPU: on the CPU, f16 ops run the scalar reference kernels.",
    sizeof(build_args), build_defaults,
};

static int cmd_build(int argc, char **argv) {
    build_args a;
    build_defaults(&a);
    int rc = tb_cli_parse(&cmd_build_spec, argc, argv, &a);
    if (rc >= 0) return rc;
    tb_build_options o;
    tb_build_options_default(&o);
    o.tokenizer_path = a.tokenizer;
    /* the quantized dtypes by their usual names; other dtype names the
     * builder does not support (i32...) are its error, exit 1 */
    static const struct { const char *cli, *dt; } qnames[] = {{"int8", "i8"}, {"int4", "i4"}, {"fp8", "fp8_e4m3"}};
    const char *dtn = a.dtype;
    for (size_t i = 0; i < sizeof qnames / sizeof qnames[0]; i++)
        if (!strcmp(dtn, qnames[i].cli)) dtn = qnames[i].dt;
    if (tb_dtype_parse(dtn, &o.weight_dtype) != TB_OK)
        return tb_cli_usage_error("build", "unknown --dtype '%s' (f32, f16, bf16, int8, int4, fp8)", a.dtype);
    if (a.group_size && a.group_size != 32 && a.group_size != 64 && a.group_size != 128)
        return tb_cli_usage_error("build", "--group-size %d: int4 groups are 32, 64 or 128", a.group_size);
    if (a.group_size && o.weight_dtype != TB_I4)
        return tb_cli_usage_error("build", "--group-size is for --dtype int4");
    o.group_size = a.group_size;
    o.zero_point = a.zero_point;
    o.awq = a.awq;
    o.qmm_tactics = !a.qmm_tactics || !strcmp(a.qmm_tactics, "auto") ? TB_QMM_TACTICS_AUTO
                    : !strcmp(a.qmm_tactics, "exact")                 ? TB_QMM_TACTICS_EXACT
                                                                       : TB_QMM_TACTICS_Q8;
    o.overrides = a.overrides.v;
    o.n_overrides = a.overrides.n;
    o.max_seq_len = a.max_seq_len;
    o.max_batch = a.max_batch;
    o.max_step_tokens = a.max_step_tokens;
    o.device = a.device;
    if (a.tp && (a.tp & (a.tp - 1)))
        return tb_cli_usage_error("build", "--tp %d: tensor parallelism takes 1, 2, 4 or 8 ranks", a.tp);
    if (a.tp > 1 && tb_is_onnx_path(a.model))
        return tb_cli_usage_error("build", "--tp is for LLM checkpoints (ONNX engines run on one device)");
    o.tp = a.tp;
    o.progress = isatty(2);
    o.shapes = a.shapes;
    o.min_shapes = a.min_shapes;
    o.opt_shapes = a.opt_shapes;
    o.max_shapes = a.max_shapes;
    o.profiles = a.profiles.v;
    o.n_profiles = a.profiles.n;
    o.calib_data = a.calib_data;
    o.verbose = a.verbose;
    /* calibration */
    o.calib = a.calib;
    o.calib_tokens = a.calib_tokens;
    o.calibrator = a.calibrator;
    o.calib_cache = a.calib_cache;
    o.calib_threads = a.calib_threads;
    tb_calibrator cal;
    if (a.calibrator && tb_calibrator_parse(a.calibrator, &cal) != TB_OK)
        return tb_cli_usage_error("build", "%s", tb_last_error());
    if (a.calib && tb_is_onnx_path(a.model))
        return tb_cli_usage_error("build", "--calib is for LLM checkpoints (ONNX builds take --calib-data DIR)");
    if (a.calib_cache && tb_is_onnx_path(a.model) && o.weight_dtype != TB_I8)
        return tb_cli_usage_error("build", "--calib-cache is for quantized builds (ONNX: --dtype int8)");
    if (a.verbose) tb_log_set_level(TB_LOG_INFO);
    tb_build_report r;
    if (tb_build(a.model, a.out, &o, &r) != TB_OK) return fail("build failed");
    if (tb_is_onnx_path(a.model)) {
        fprintf(stderr, "built %s\n  build time    %.2f s\n  engine size   %.1f MB (%llu bytes)\n  dtype         %s\n",
                a.out, r.seconds, (double)r.engine_bytes / 1e6, (unsigned long long)r.engine_bytes,
                tb_dtype_name(o.weight_dtype));
        if (r.accuracy[0]) fprintf(stderr, "  %s", r.accuracy);
        return 0;
    }
    fprintf(stderr,
            "built %s\n  build time    %.2f s\n  engine size   %.1f MB (%llu bytes)\n  dtype         %s%s\n"
            "  max batch     %d\n  max seq len   %d\n",
            a.out, r.seconds, (double)r.engine_bytes / 1e6, (unsigned long long)r.engine_bytes,
            tb_dtype_name(o.weight_dtype),
            o.weight_dtype == TB_I4 ? (o.zero_point ? " (asymmetric groups)" : " (symmetric groups)") : "",
            r.max_batch, r.max_seq_len);
    if (o.tp > 1) fprintf(stderr, "  tensor par.   %d ranks\n", o.tp);
    return 0;
}

/* ---------------------------------------------------------------- inspect */

typedef struct {
    const char *engine;
} inspect_args;

static void inspect_defaults(void *p) { memset(p, 0, sizeof(inspect_args)); }

static const tb_cli_opt inspect_opts[] = {
    {"--engine", NULL, TB_OPT_STR, "FILE.engine", 0, 0, TB_OPT_SEE_ALSO, 0, 0, offsetof(inspect_args, engine), NULL,
     TB_CLI_HELP_ENGINE},
};

static const tb_cli_cmd cmd_inspect_spec = {
    "inspect",
    "Describes an engine file: format version, sections and their checksums, the model, the tokenizer, the "
    "build options, the hardware it was tuned for and the kernels chosen.",
    {"FILE.engine"}, {offsetof(inspect_args, engine)}, 1, 1,
    inspect_opts, sizeof inspect_opts / sizeof inspect_opts[0],
    "After the graph's ops comes one line per weight: its name (the names --override matches), dtype (f32, "
    "f16, bf16; i8, i4, fp8_e4m3 for the codes of a quantized matmul, whose NAME.scales and NAME.zeros "
    "follow), shape, bytes and offset in the weights section. Then the bits per weight: over the matmul weights (codes, scales and zeros "
    "divided by the elements of the matrices; f32 is 32, int8 about 8.1, int4 group 64 about 4.5) and over "
    "all weights (embedding, norms and the rest included). An engine built with --calib then lists the static "
    "activation scale of each quantized matmul's input (int8 and fp8: the calibrator's threshold / 127 or / 448).",
    sizeof(inspect_args), inspect_defaults,
};

static int cmd_inspect(int argc, char **argv) {
    inspect_args a;
    inspect_defaults(&a);
    int rc = tb_cli_parse(&cmd_inspect_spec, argc, argv, &a);
    if (rc >= 0) return rc;
    size_t cap = 4u << 20; /* a line per weight: thousands in an ONNX engine */
    char *buf = malloc(cap);
    if (!buf) return 1;
    if (tb_engine_describe(a.engine, buf, cap) != TB_OK) { free(buf); return fail("cannot inspect"); }
    fputs(buf, stdout);
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------- run */

/* Text appears as it is produced, as in llama2.c: on a terminal every piece
 * is flushed; into a pipe or file the flushes (a write each) are batched to
 * one per TB_RUN_FLUSH_S, which matters at tens of thousands of tokens/s. */
#define TB_RUN_FLUSH_S 0.05

typedef struct {
    int tty;           /* stdout is a terminal: flush every piece */
    double last_flush; /* otherwise flush at most every TB_RUN_FLUSH_S */
} out_state;

static void out_write(out_state *o, const char *p, size_t n) {
    if (n) fwrite(p, 1, n, stdout);
    if (o->tty) {
        fflush(stdout);
        return;
    }
    double now = tb_now();
    if (now - o->last_flush >= TB_RUN_FLUSH_S) {
        fflush(stdout);
        o->last_flush = now;
    }
}

/* A prompt token's text, as llama2.c prints it (safe_printf's rule). */
static void print_piece(const tb_tokenizer *tok, int prev, int t) {
    char piece[256];
    size_t n = tb_tokenizer_piece(tok, prev, t, piece, sizeof piece);
    if (tb_piece_is_printable(piece, n)) fwrite(piece, 1, n, stdout);
}

typedef struct {
    const char *engine, *prompt, *prompt_ids, *logits_out, *device, *kv_dtype;
    int steps, threads, top_k;
    double temperature, top_p, min_p, repeat_penalty;
    uint64_t seed;
    tb_cli_strs stop;
} run_args;

static void run_defaults(void *p) {
    run_args *a = p;
    memset(a, 0, sizeof *a);
    tb_sampling_params sp;
    tb_sampling_params_default(&sp);
    a->steps = 256;
    a->temperature = 1.0; /* llama2.c's default: sampling, not greedy */
    a->top_k = sp.top_k;
    a->top_p = sp.top_p;
    a->min_p = sp.min_p;
    a->repeat_penalty = sp.repeat_penalty;
    a->seed = sp.seed;
}

#define R(f) offsetof(run_args, f)
static const tb_cli_opt run_opts[] = {
    {"--engine", NULL, TB_OPT_STR, "FILE.engine", 0, 0, TB_OPT_SEE_ALSO, 0, 0, R(engine), NULL,
     TB_CLI_HELP_ENGINE},
    {"-p", "--prompt", TB_OPT_STR, "PROMPT", 0, 0, 0, 1, 0, R(prompt), NULL,
     "the prompt text (tokenized, BOS added when the model adds one)"},
    {"--prompt-ids", NULL, TB_OPT_STR, "1,2,3", 0, 0, 0, 1, 0, R(prompt_ids), NULL,
     "the prompt as token ids (no tokenization, no BOS added)"},
    {"-n", "--steps", TB_OPT_INT, "N", 1, INT_MAX, 0, 0, 0, R(steps), "256",
     "tokens in all, prompt included (llama2.c's convention), at most the engine's context"},
    {"--temperature", NULL, TB_OPT_FLOAT, "T", 0, INFINITY, 0, 0, 0, R(temperature), "1", "0 is greedy"},
    {"--top-k", NULL, TB_OPT_INT, "K", 0, INT_MAX, 0, 0, 0, R(top_k), "0, off",
     "sample among the K likeliest tokens"},
    {"--top-p", NULL, TB_OPT_FLOAT, "P", 0, 1, TB_OPT_LO_OPEN, 0, 0, R(top_p), "1, off",
     "nucleus sampling: the likeliest tokens holding P of the probability"},
    {"--min-p", NULL, TB_OPT_FLOAT, "P", 0, 1, 0, 0, 0, R(min_p), "0, off",
     "drop tokens less likely than P times the likeliest"},
    {"--repeat-penalty", NULL, TB_OPT_FLOAT, "R", 0, INFINITY, TB_OPT_LO_OPEN, 0, 0, R(repeat_penalty), "1, off",
     "divide the logits of tokens already seen by R (llama.cpp's rule)"},
    {"--seed", NULL, TB_OPT_U64, "S", 0, 0, 0, 0, 0, R(seed), "a fixed seed",
     "the sampler's seed: the same seed gives the same text; without --seed every run uses the same fixed "
     "seed (0 means that seed too), so runs repeat"},
    {"--stop", NULL, TB_OPT_STRS, "STR", 0, 0, 0, 0, 0, R(stop), NULL,
     "end the text before the first of these strings (up to 16, of up to 255 bytes each; values run to the "
     "next argument that starts with '-'; write --stop=-x for one that starts with '-')"},
    {"--logits-out", NULL, TB_OPT_STR, "FILE", 0, 0, 0, 0, 0, R(logits_out), NULL,
     "write the f32 logits of every evaluated position as raw little-endian rows of vocab floats"},
    {"--threads", "-t", TB_OPT_INT, "N", 1, 256, 0, 0, 0, R(threads), "one per core", "CPU threads"},
    {"--device", NULL, TB_OPT_STR, "cpu|cuda[:N]", 0, 0, 0, 0, 0, R(device), "the engine's backend",
     TB_CLI_HELP_DEVICE},
    {"--kv-dtype", NULL, TB_OPT_CHOICE, "auto|f32|f16|bf16|int8|fp8", 0, 0, 0, 0, 0, R(kv_dtype), "auto",
     TB_CLI_HELP_KV_DTYPE},
};
#undef R

static const tb_cli_cmd cmd_run_spec = {
    "run",
    "Generates text from a prompt: prints the prompt and then the generated text on stdout as it is produced, "
    "followed by a newline (llama2.c's convention); timings go to stderr.",
    {"FILE.engine"}, {offsetof(run_args, engine)}, 1, 1,
    run_opts, sizeof run_opts / sizeof run_opts[0],
    "Generation ends at -n tokens, at the engine's context, at an end-of-sequence token, at BOS (llama2.c's "
    "convention, which its models' text follows) or at a --stop string. The server runs the same generation loop "
    "and gives the same text for the same prompt, sampling and stop strings, except that BOS does not end it.",
    sizeof(run_args), run_defaults,
};

static int cmd_run(int argc, char **argv) {
    run_args a;
    run_defaults(&a);
    int prc = tb_cli_parse(&cmd_run_spec, argc, argv, &a);
    if (prc >= 0) return prc;
    const char *engine = a.engine, *prompt = a.prompt, *ids_arg = a.prompt_ids, *logits_out = a.logits_out,
               *device = a.device;
    int steps = a.steps, threads = a.threads;
    for (int i = 0; i < a.stop.n; i++)
        if (!a.stop.v[i][0] || strlen(a.stop.v[i]) > TB_GEN_MAX_STOP_LEN)
            return tb_cli_usage_error("run", "--stop strings must hold 1 to %d bytes", TB_GEN_MAX_STOP_LEN);
    tb_sampling_params sp;
    tb_sampling_params_default(&sp);
    sp.temperature = (float)a.temperature;
    sp.top_k = a.top_k;
    sp.top_p = (float)a.top_p;
    sp.min_p = (float)a.min_p;
    sp.repeat_penalty = (float)a.repeat_penalty;
    sp.seed = a.seed;

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
    co.kv_dtype = a.kv_dtype;
    tb_context *ctx = NULL;
    if (tb_context_create(e, &co, &ctx) != TB_OK) { tb_engine_free(e); return fail("cannot create a context"); }
    double load_ms = (tb_now() - t_load0) * 1e3;
    const tb_tokenizer *tok = tb_engine_tokenizer(e);

    int cap = info.max_seq_len + 1, n_prompt = 0, rc = 1;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(cap + 1));
    float *row = malloc(sizeof(float) * (size_t)info.vocab_size);
    tb_gen gen;
    memset(&gen, 0, sizeof gen);
    FILE *lf = NULL;
    out_state os = {isatty(fileno(stdout)), 0.0};
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
    /* the runtime's generation loop, with llama2.c's conventions: BOS ends the
     * text and unprintable one-byte pieces print nothing (byte-exact with
     * run.c); -n counts the prompt, and the context bounds the rest */
    int n_gen_max = steps - n_prompt + 1;
    if (n_gen_max > info.max_seq_len - n_prompt) n_gen_max = info.max_seq_len - n_prompt;
    tb_gen_options go;
    tb_gen_options_default(&go);
    go.max_tokens = n_gen_max;
    go.stop_at_bos = 1;
    go.skip_unprintable = 1;
    go.sampling = &sp;
    if (a.stop.n > TB_GEN_MAX_STOPS) { tb_errorf(TB_ERR_INVALID_ARG, "at most %d --stop strings", TB_GEN_MAX_STOPS); fail(NULL); goto done; }
    go.n_stops = a.stop.n;
    for (int i = 0; i < a.stop.n; i++) go.stops[i] = a.stop.v[i];
    if (tb_gen_init(&gen, &info, tok, toks[n_prompt - 1], &go) != TB_OK) { fail("bad sampling or stop options"); goto done; }
    if (logits_out && !(lf = fopen(logits_out, "wb"))) {
        fprintf(stderr, "turbine: error: cannot write %s: %s\n", logits_out, strerror(errno));
        goto done;
    }

    /* the prompt, printed as llama2.c does: each piece after the first token */
    for (int i = 0; i < n_prompt; i++) print_piece(tok, i ? toks[i - 1] : -1, toks[i]);
    fflush(stdout);

    /* prefill in chunks of the step profile */
    double t0 = tb_now();
    /* without --logits-out the step picks the token itself (on the GPU for
     * a GPU engine: no logits cross to the host) */
    const float *lg = NULL;
    int n_rows = 0, max_step = tb_context_max_step(ctx), next = 0;
    tb_row_sampling rsm = {gen.sampler, toks, 0, -1, NULL};
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
    int n_gen = 0, len = n_prompt;
    double t1 = tb_now();
    while (n_gen < n_gen_max) {
        if (lf) {
            memcpy(row, lg + (size_t)(n_rows - 1) * (size_t)info.vocab_size, sizeof(float) * (size_t)info.vocab_size);
            next = tb_sampler_sample(gen.sampler, row, toks, len);
        }
        const char *text;
        size_t tn;
        tb_gen_end end = tb_gen_step(&gen, next, &text, &tn);
        if (end == TB_GEN_END_TOKEN) break;
        out_write(&os, text, tn);
        toks[len++] = next;
        n_gen++;
        if (end != TB_GEN_GOING) break;
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
    const char *held;
    size_t hn = tb_gen_flush(&gen, &held); /* nothing after a stop string */
    fwrite(held, 1, hn, stdout);
    double t_gen = tb_now() - t1;
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "timing: load_ms=%.2f prompt_tokens=%d prompt_ms=%.2f prompt_tok_s=%.1f gen_tokens=%d gen_ms=%.2f "
            "gen_tok_s=%.1f threads=%d kv_dtype=%s\n",
            load_ms, n_prompt, t_prompt * 1e3, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9), n_gen, t_gen * 1e3,
            n_gen > 0 ? n_gen / (t_gen > 0 ? t_gen : 1e-9) : 0.0, tb_context_threads(ctx),
            tb_kv_dtype_label(tb_context_kv_dtype(ctx)));
    rc = 0;
done:
    if (lf && fclose(lf) != 0 && rc == 0) { fprintf(stderr, "turbine: error: cannot write %s\n", logits_out); rc = 1; }
    tb_gen_free(&gen);
    free(toks);
    free(row);
    tb_context_free(ctx);
    tb_engine_free(e);
    return rc;
}

/* ---------------------------------------------------------------- help */

static const tb_cli_cmd *const commands[] = {&cmd_build_spec, &cmd_run_spec, &cmd_inspect_spec, &tb_cmd_serve,
                                             &tb_cmd_perplexity, &tb_cmd_exec, &tb_cmd_compare};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static const tb_cli_cmd *find_command(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i]->name, name)) return commands[i];
    return NULL;
}

/* bench keeps its own parser: its usage is what `bench --help` prints. */
static void print_bench_help(FILE *f) {
    fflush(f);
    char *argv[] = {"--help", NULL};
    tb_cli_bench(1, argv);
    fflush(stdout);
}

#define BENCH_SYNOPSIS "turbine bench BASE_URL [options] | turbine bench --engine FILE.engine [options]\n"

/* The README's command list (between its commands:begin/end markers). */
static void print_synopses(FILE *f) {
    for (int i = 0; i < N_COMMANDS; i++) tb_cli_print_synopsis(commands[i], f, 100);
    fputs(BENCH_SYNOPSIS, f);
}

static void print_help(FILE *f) {
    fprintf(f, "turbine %s — an inference compiler and runtime\n\nusage:\n", TB_VERSION);
    print_synopses(f);
    fputs("\n`turbine COMMAND --help` prints a command's options with their ranges and defaults;\n"
          "docs/COMMANDS.md has them all.\n\n"
          "exit status: 0 ok, 1 runtime or input error, 2 usage error\n", f);
}

static const char *COMMANDS_INTRO =
    "# Command reference\n\n"
    "<!-- Generated by `turbine help --markdown > docs/COMMANDS.md` from the option tables the parser\n"
    "     reads (tools/turbine.c, tools/serve_cli.c, tools/perplexity_cli.c); tests/test_cli_docs.sh\n"
    "     fails when this file or the README's command list differs from what the binary prints. -->\n\n"
    "`turbine CMD --help` (or `-h`) prints a command's usage on stdout and exits 0; `turbine help CMD` does the\n"
    "same. `turbine help --markdown` prints this file.\n\n"
    "## Conventions\n\n"
    "- **Options**: `--name VALUE` or `--name=VALUE` (every long option); a flag takes no value. `--` ends\n"
    "  the options: what follows is positional. An option given twice keeps the last value; `--stop` adds.\n"
    "- **Engine file**: `run`, `inspect`, `serve` and `perplexity` take the engine as a positional\n"
    "  `FILE.engine` or as `--engine FILE.engine`, as `bench --engine` does.\n"
    "- **Lists**: `--stop A B C` takes the values up to the next argument that starts with `-`;\n"
    "  `--stop=-x` passes one value that starts with `-`.\n"
    "- **Numbers** are checked against the range the tables below give; an error names it\n"
    "  (`--max-seq-len must be between 1 and 1048576, got 100000000`).\n"
    "- **Sizes** (`SIZE`): a number, a fraction allowed, with an optional unit `K`, `M`, `G` or `T`, also\n"
    "  written `KB`/`KiB`, `MB`/`MiB`, `GB`/`GiB`, `TB`/`TiB`, in any case. Every unit is binary:\n"
    "  `K` = `KB` = `KiB` = 1024 bytes, `M` = 1024², `G` = 1024³, `T` = 1024⁴ (as `free` and Docker\n"
    "  read them). No unit, or `B`: bytes. A size that does not fit in 64 bits is refused.\n"
    "- **Exit status** of every command: 0 ok; 1 a runtime or input error (a missing, corrupt or\n"
    "  incompatible engine or model, a prompt longer than the context, a server that cannot start);\n"
    "  2 a usage error (an unknown option, a missing or malformed value, a value out of range).\n\n";

/* ---- calibration and compare: how they work (docs/COMMANDS.md) */
static const char *CALIBRATION_DOC =
    "## Calibration (`turbine build --calib`)\n\n"
    "Quantized engines need the range of every matmul's input. `--calib FILE` runs an f32 engine of the\n"
    "model, built in memory from the same checkpoint, on the CPU over the first `--calib-tokens` tokens of\n"
    "FILE (default 4096; a text is tokenized with the model's tokenizer, BOS first when it adds one; a file of\n"
    "numbers separated by spaces, newlines or commas is read as token ids), in windows of the engine's\n"
    "context, each a fresh sequence. A node observer in the runtime (src/runtime/runtime.h) sees every\n"
    "matmul's input after it runs and collects, keyed by the matmul's weight name (after fusion: `l0.wqkv`,\n"
    "`l0.wgu`, ...): the max |x|, per input channel the mean and max |x|, up to 256 sampled input rows, and a\n"
    "2048-bin histogram of |x| over [0, max |x|], re-binned when a later step raises the max. The build\n"
    "prints `calibrating: DONE/TOTAL tokens` (a bar on a terminal). The calibrator turns each histogram\n"
    "into a threshold T (|x| is clipped there); the activation scale is T / 127 for int8 and T / 448 for fp8:\n\n"
    "| `--calibrator` | T |\n"
    "|---|---|\n"
    "| `entropy` (default) | TensorRT's IInt8EntropyCalibrator2: for each cut-off bin i from 128 to 2048, P = bins [0, i) with the mass beyond folded into bin i - 1, Q = the same bins before the fold merged into 128 levels of i / 128 bins (the last takes the remainder) and spread back evenly over the bins where P is non-zero; T = (i + 0.5) x bin width of the least KL(P \\|\\| Q) |\n"
    "| `minmax` | the largest absolute value seen |\n"
    "| `percentile[=P]` | the upper edge of the bin where the cumulative count reaches P% (default 99.99) |\n"
    "| `mse` | the bin edge minimising the expected squared error of clipping plus int8 rounding, each bin's mass at its centre |\n\n"
    "`--calib-cache FILE` keeps the result. When FILE exists the build reads it and does not run the model\n"
    "(also when `--calib` is given); otherwise it calibrates and writes FILE. The cache is text:\n\n"
    "```\n"
    "TURBINE-CALIB-CACHE 1 calibrator=entropy fingerprint=f74ff1c0f4a40cbf tokens=4096\n"
    "l0.wqkv: 0.00266400352\n"
    "...\n"
    "l0.wqkv mean_abs: 0.5768677 0.559665322 ...\n"
    "```\n\n"
    "The header names the format version, the calibrator (as given, `percentile=99.9`) and the model's\n"
    "fingerprint (XXH3 over its configuration and every tensor's name, dtype, shape and bytes); then one\n"
    "`name: scale` line per matmul input (the int8 scale T / 127, `%.9g`), then one `name mean_abs: ...`\n"
    "line per matmul with its per-input-channel mean |x| (what `--awq` needs). A cache of another format\n"
    "version, calibrator or model is refused with a message naming which (exit 1). The engine's meta\n"
    "records the calibrator, the tokens and the fingerprint (`turbine inspect`).\n\n"
    "ONNX models (`--dtype int8 --calib-data DIR`) calibrate the same way over input sets instead of tokens\n"
    "(docs/ONNX.md): the f32 graph after the pass pipeline runs on the CPU over every sample of DIR, and the\n"
    "histogram is of each tensor that feeds a Conv / Gemm / MatMul with a constant weight, keyed by the\n"
    "tensor's name. The default calibrator there is `percentile=99.99`. A tensor never negative (after a\n"
    "Relu) is listed as `NAME/u8` and quantized to uint8 over [0, T] (scale T / 255, zero point 0); the\n"
    "others over [-T, T] (T / 127, zero point 128). The fingerprint is XXH3 over the .onnx file's bytes\n"
    "and `tokens=` counts the samples.\n\n";

static void print_markdown(FILE *f) {
    fputs(COMMANDS_INTRO, f);
    for (int i = 0; i < N_COMMANDS; i++) tb_cli_print_markdown(commands[i], f);
    fputs(CALIBRATION_DOC, f);
    fputs("## turbine bench\n\n```\n" BENCH_SYNOPSIS "```\n\n"
          "Load-tests an HTTP server, or times an engine in-process (`--engine`); docs/BENCH.md explains "
          "the figures. Its options, as `turbine bench --help` prints them:\n\n```\n", f);
    print_bench_help(f);
    fputs("```\n", f);
}

/* `turbine help [CMD | --markdown | --synopsis | --options | --parse CMD ARGS...]`.
 * --options and --parse serve tests/test_cli_docs.sh: the first lists every
 * table row with a value it must accept, the second runs a command's parser
 * alone and prints what it parsed. */
static int cmd_help(int argc, char **argv) {
    if (argc == 0) { print_help(stdout); return 0; }
    const char *w = argv[0];
    if (!strcmp(w, "--markdown")) { print_markdown(stdout); return 0; }
    if (!strcmp(w, "--synopsis")) { print_synopses(stdout); return 0; }
    if (!strcmp(w, "--options")) {
        char buf[64];
        for (int i = 0; i < N_COMMANDS; i++)
            for (int k = 0; k < commands[i]->n_opts; k++) {
                const tb_cli_opt *o = &commands[i]->opts[k];
                const char *v = tb_cli_example_value(o, buf, sizeof buf);
                printf("%s\t%s\t%s\t%s\n", commands[i]->name, o->name, o->alias ? o->alias : "-", v ? v : "-");
            }
        return 0;
    }
    if (!strcmp(w, "--parse")) {
        const tb_cli_cmd *c = argc > 1 ? find_command(argv[1]) : NULL;
        if (!c) return usage_error("help --parse needs a command%s", "");
        void *args = calloc(1, c->args_size);
        if (!args) return 1;
        c->args_default(args);
        int rc = tb_cli_parse(c, argc - 2, argv + 2, args);
        if (rc < 0) { tb_cli_print_values(c, args, stdout); rc = 0; }
        free(args);
        return rc;
    }
    if (!strcmp(w, "bench")) { print_bench_help(stdout); return 0; }
    const tb_cli_cmd *c = find_command(w);
    if (!c) return usage_error("unknown command '%s'", w);
    tb_cli_print_help(c, stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_help(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) { print_help(stdout); return 0; }
    if (!strcmp(argv[1], "--version")) { printf("turbine %s\n", TB_VERSION); return 0; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help")) return cmd_help(argc - 2, argv + 2);
    if (!strcmp(cmd, "build")) return cmd_build(argc - 2, argv + 2);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return tb_cli_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return tb_cli_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "perplexity")) return tb_cli_perplexity(argc - 2, argv + 2);
    if (!strcmp(cmd, "compare")) return tb_cli_compare(argc - 2, argv + 2);
    if (!strcmp(cmd, "exec")) return tb_cli_exec(argc - 2, argv + 2);
    return usage_error("unknown command '%s'", cmd);
}
