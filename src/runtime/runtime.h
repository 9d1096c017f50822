/*
 * runtime.h — runtime pieces beyond the public API: context introspection
 * used by the CLI, the server and the benchmarks.
 */
#ifndef TB_RUNTIME_H
#define TB_RUNTIME_H

#include "backend/backend.h"
#include "core/core.h"
#include "tokenizer/tokenizer.h"

int tb_context_max_seqs(const tb_context *c);
int tb_context_max_step(const tb_context *c);
int tb_context_threads(const tb_context *c);
/* Tensor-parallel ranks of the context's engine (1: none). */
int tb_context_tp(const tb_context *c);
tb_engine *tb_context_engine(const tb_context *c);
/* 1 when the context keeps full KV blocks for reuse (prefix caching). */
int tb_context_prefix_caching(const tb_context *c);

/* The backend the context's rank 0 runs on: "cuda", or a CPU kernel set's
 * name ("avx512", "avx2", "scalar", "cpu"). */
const char *tb_context_backend(const tb_context *c);
/* Warm-up before the first request (`turbine serve --model-warmup`): one
 * decode step of every batch size 1..max_n (0: the context's max_seqs;
 * never above its step or free KV blocks), so that a GPU captures each
 * decode size's CUDA graph and times its GEMMs' candidates now rather than
 * inside some request's step. Every sequence slot must be empty; it is
 * again afterwards, and nothing is added to the prefix cache. *steps: the
 * steps run. */
tb_status tb_context_warmup(tb_context *c, int max_n, int *steps);

/* Per-op-kind timing for `turbine bench --engine --profile`: when on, every
 * step adds each node's wall time to its op kind's total. */
tb_status tb_context_set_profiling(tb_context *c, int on);
/* Copies up to `cap` (kind name, seconds) pairs; returns how many kinds ran. */
int tb_context_profile(const tb_context *c, const char **names, double *seconds, int cap);

/* A per-node observer (calibration: tune/calib.h): when set, every step
 * calls fn(user, graph, node index, bufs, step) after each node has run,
 * with bufs[v] the host buffer of every value (inputs and outputs of the
 * node). CPU contexts only (TB_ERR_UNSUPPORTED otherwise: a device's buffers
 * are not host memory). NULL fn removes it; unset, a step pays one test per
 * node. */
typedef void (*tb_node_observer)(void *user, const tb_graph *g, int node, void *const *bufs, const tb_step *st);
tb_status tb_context_set_observer(tb_context *c, tb_node_observer fn, void *user);
/* The same for a general engine's executor (exec.c; CPU only): fn sees
 * every node that ran, its inputs in bufs with st->views' dims. */
tb_status tb_exec_set_observer(tb_exec *x, tb_node_observer fn, void *user);

/* Per-node timing of a general engine (`turbine bench --engine
 * --dump-profile`): when on, every run adds each node's wall time. */
typedef struct {
    int node;
    const char *op;
    const char *output;   /* the node's first output, names the layer */
    double seconds;       /* mean per run                              */
} tb_exec_node_time;
tb_status tb_exec_set_profiling(tb_exec *x, int on);
int tb_exec_profile(const tb_exec *x, tb_exec_node_time *out, int cap);
const tb_graph *tb_exec_graph(const tb_exec *x);
/* Seconds spent copying inputs to and outputs from a device, summed over
 * runs (0 on the CPU), and the activation arena of the current shape. */
void tb_exec_copy_seconds(const tb_exec *x, double *h2d, double *d2h);
uint64_t tb_exec_arena_bytes(const tb_exec *x);

/* ---------------------------------------------------------------- profiles
 *
 * A general engine has one or more optimisation profiles (meta "profiles":
 * [{"inputs": "x:1x3x8x8/2x3x8x8/4x3x8x8", "symbols": [{"name", "min",
 * "opt", "max"}, ...]}, ...]). Its graph is compiled once for their
 * envelope (each symbol from the smallest min to the largest max, opt from
 * the first profile); a run's inputs must bind every symbol inside the
 * ranges of at least one profile. An engine without the list (built in
 * memory, or by an older build) has one profile: the graph's symbols. */
#define TB_MAX_PROFILES TB_BUILD_MAX_PROFILES
typedef struct {
    int n;
    tb_symbol syms[TB_MAX_PROFILES][TB_MAX_SYMS]; /* the graph's symbols, in order */
    char text[TB_MAX_PROFILES][512];              /* the shapes as given ("" when none) */
} tb_profile_set;

/* The profiles read from an engine's meta (one from g's symbols when the
 * meta has none). */
tb_status tb_profiles_from_meta(const tb_graph *g, const char *meta_json, tb_profile_set *out);
/* One line per profile: "profile 0: batch [1, 8, 32], seq [...]" (min,
 * opt, max) after `indent`; returns the characters written as snprintf. */
int tb_profiles_describe(const tb_profile_set *ps, const tb_graph *g, const char *indent, char *buf, size_t cap);
/* A general engine file with these profiles (NULL: one from g's symbols). */
tb_status tb_engine_write_profiles(tb_graph *g, const char *engine_path, const char *device, const char *source,
                                   double build_seconds, const tb_profile_set *ps);
/* The profiles of an executor's engine, and the one the last run used (-1
 * before any). */
const tb_profile_set *tb_exec_profiles(const tb_exec *x);
int tb_exec_last_profile(const tb_exec *x);
/* Zero-copy views: values the last plan aliased onto another's memory
 * (Reshape, Squeeze, Unsqueeze, Flatten, Identity) and the arena bytes the
 * plan saved by not copying them. */
int tb_exec_n_aliased(const tb_exec *x);

/* Sampling on a device: fills *row from s's parameters (the uniform draw
 * taken from s's generator as tb_sampler_sample would) and writes the
 * distinct tokens of the penalty window with their counts to tok / cnt (at
 * most cap); returns how many (row->pen_n; the caller sets pen_off). */
int tb_sampler_prepare(tb_sampler *s, const int32_t *hist, int n_hist, tb_sample_row *row, int32_t *tok,
                       int32_t *cnt, int cap);
/* Tokens of the penalty window for a history of n_hist (0: no penalties). */
int tb_sampler_window(const tb_sampler *s, int n_hist);
/* The log-probability of tok and the n_top most likely tokens under
 * log-softmax(logits) into out (token left alone). */
void tb_sample_logprobs(const float *logits, int V, int tok, int n_top, tb_sample_result *out);

/* ---------------------------------------------------------------- generation
 *
 * One generation loop for every command (src/runtime/generate.c): `turbine
 * run`, the server (its scheduler and its reply writer) and `bench --engine`
 * keep one tb_gen per sequence and hand it each sampled token; tb_gen_step
 * says what text to emit and whether and why the sequence ends. The state is
 * a plain struct (embed it; nothing is allocated per token): the stop
 * strings are copied into it and the text not yet released is held in a
 * fixed buffer.
 *
 * A token ends the sequence (TB_GEN_END_TOKEN, neither counted nor printed)
 * when it is one of the engine's EOS ids, or its BOS id with stop_at_bos,
 * unless ignore_eos is set or fewer than min_tokens were generated. Otherwise
 * it is counted and its text (tb_tokenizer_piece after the previous token)
 * joins the held text, of which the step releases what can no longer be part
 * of a stop string nor half a UTF-8 character. A stop string ends the
 * sequence (TB_GEN_STOP_STRING) with the text before it released and the rest
 * dropped; max_tokens ends it after that many tokens (TB_GEN_MAX_TOKENS).
 * Without a tokenizer the state checks tokens only and releases no text.
 */
#define TB_GEN_MAX_STOPS 16
#define TB_GEN_MAX_STOP_LEN 255 /* bytes of one stop string */
#define TB_GEN_PIECE_MAX 256    /* bytes of one token's text (as tb_tokenizer_piece is asked) */

typedef enum {
    TB_GEN_GOING = 0,
    TB_GEN_END_TOKEN,   /* EOS, or BOS with stop_at_bos               */
    TB_GEN_STOP_STRING, /* a stop string appeared in the text         */
    TB_GEN_MAX_TOKENS,  /* max_tokens generated                       */
} tb_gen_end;

const char *tb_gen_end_str(tb_gen_end e);

typedef struct {
    int max_tokens;      /* generated tokens at most; <= 0: no bound (the caller's context bounds it) */
    int min_tokens;      /* end tokens do not end the sequence before this many */
    int ignore_eos;      /* end tokens never end it (fixed-length benchmarks, the API's ignore_eos) */
    /* llama2.c's convention: BOS ends the text too. Its models (stories260K
     * and the rest of the llama2.c checkpoints) emit BOS where a story ends,
     * and their reference text (run.c) stops there; `turbine run` sets it, the
     * server follows the OpenAI API (EOS only). */
    int stop_at_bos;
    /* llama2.c's safe_printf: a one-byte piece that is neither printable nor
     * white space gives no text (`turbine run`, whose output is compared
     * byte for byte with run.c's) */
    int skip_unprintable;
    int n_stops;
    const char *stops[TB_GEN_MAX_STOPS]; /* may hold NULs: their lengths are stop_len */
    size_t stop_len[TB_GEN_MAX_STOPS];   /* 1..TB_GEN_MAX_STOP_LEN */
    const tb_sampling_params *sampling;  /* NULL: no sampler (the caller picks tokens itself) */
} tb_gen_options;

typedef struct {
    tb_gen_options o;     /* stops point into stop_text */
    char stop_text[TB_GEN_MAX_STOPS][TB_GEN_MAX_STOP_LEN];
    const tb_tokenizer *tok;
    int32_t end_ids[5];   /* EOS ids (and BOS with stop_at_bos), -1 padded */
    tb_sampler *sampler;  /* owned; NULL without o.sampling */
    int prev;             /* the token before the next one (its text depends on it) */
    int n_gen;            /* tokens counted */
    tb_gen_end end;       /* TB_GEN_GOING until the sequence ends */
    /* text generated and not yet released: buf[start, len) */
    char buf[TB_GEN_MAX_STOP_LEN + TB_GEN_PIECE_MAX + 8];
    size_t start, len;
} tb_gen;

void tb_gen_options_default(tb_gen_options *o);
/* Starts a sequence. `tok` may be NULL (tokens only); `prev_token` is the
 * last prompt token (-1: none). Copies the stop strings; creates the sampler
 * when o->sampling is set. TB_ERR_INVALID_ARG for a stop string that is
 * empty or too long, or too many. Pair with tb_gen_free. */
tb_status tb_gen_init(tb_gen *g, const tb_engine_info *info, const tb_tokenizer *tok, int prev_token,
                      const tb_gen_options *o);
/* Frees the sampler; accepts NULL. */
void tb_gen_free(tb_gen *g);
/* Whether `token` would end the sequence as an end token now. */
int tb_gen_is_end(const tb_gen *g, int32_t token);
/* Takes the sampled token. *text / *n (either may be NULL) get the text to
 * emit now, valid until the next call. Returns why the sequence ended, or
 * TB_GEN_GOING. After an end, further steps return that end and emit nothing. */
tb_gen_end tb_gen_step(tb_gen *g, int32_t token, const char **text, size_t *n);
/* At the end of a sequence that ended otherwise than at a stop string (an
 * end token, max tokens, the caller's own limit): the held text, released
 * whole. Returns its length; the state then holds none. */
size_t tb_gen_flush(tb_gen *g, const char **text);
/* Bytes of text generated and not yet released. */
static inline size_t tb_gen_held(const tb_gen *g) { return g->len - g->start; }

#endif
