/* serve_cli.c — `turbine serve`: the option table, then the server. With no
 * engine argument it serves the bundled demo model, built once into the
 * user's cache and rebuilt whenever its source files or the engine format
 * change (see demo_engine). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"
#include "plan/engine.h"
#include "serve/server.h"
#include "turbine/turbine.h"

#ifndef TB_DEMO_MODEL_DIR
#define TB_DEMO_MODEL_DIR "models/demo/shakespeare"
#endif

/* ---------------------------------------------------------------- options */

/* The parser writes straight into the server's options. */
typedef struct {
    tb_serve_options o;
} serve_args;

static void serve_defaults(void *p) {
    serve_args *a = p;
    memset(a, 0, sizeof *a);
    tb_serve_options_default(&a->o);
}

#define S(f) offsetof(serve_args, o.f)
#define GIB (1024.0 * 1024 * 1024)
#define PIB (1024.0 * 1024 * GIB)
static const tb_cli_opt serve_opts[] = {
    {"--engine", NULL, TB_OPT_STR, "FILE.engine", 0, 0, TB_OPT_SEE_ALSO, 0, 0, S(engine_path), NULL,
     TB_CLI_HELP_ENGINE},
    {"--model-repository", NULL, TB_OPT_STR, "DIR", 0, 0, 0, 0, 0, S(model_repository), NULL,
     "serve every model of a Triton-layout repository (DIR/NAME/VERSION/model.engine or model.onnx, "
     "DIR/NAME/config.json; docs/SERVING.md): general engines over KServe v2, LLM engines over KServe v2 and the "
     "OpenAI API (the LLM flags apply to each); instead of FILE.engine"},
    {"--host", NULL, TB_OPT_STR, "ADDR", 0, 0, 0, 0, 0, S(host), "127.0.0.1",
     "the address to listen on: an IPv4 or IPv6 address or a host name (0.0.0.0 or :: for all)"},
    {"--port", NULL, TB_OPT_INT, "N", 1, 65535, 0, 0, 0, S(port), "8000", "the TCP port"},
    {"--grpc-port", NULL, TB_OPT_INT, "N", 1, 65535, 0, 0, 0, S(grpc_port), "none",
     "KServe v2: also serve the gRPC API (inference.GRPCInferenceService, as Triton's) on this port of --host"},
    {"--max-num-seqs", NULL, TB_OPT_INT, "N", 1, 4096, 0, 0, 0, S(max_num_seqs), "the engine's max batch",
     "requests decoded together"},
    {"--max-batched-tokens", NULL, TB_OPT_INT, "N", 1, 1 << 20, 0, 0, 0, S(max_batched_tokens),
     "the engine's step profile", "tokens per engine step (prefill chunks and decodes together)"},
    {"--kv-cache-mem", NULL, TB_OPT_SIZE, "SIZE", 1, PIB, 0, 0, 0, S(kv_cache_bytes),
     "room for --max-num-seqs full contexts", "memory of the paged KV cache"},
    {"--gpu-memory-fraction", NULL, TB_OPT_FLOAT, "F", 0, 1, TB_OPT_LO_OPEN, 0, 0,
     S(gpu_memory_fraction), NULL,
     "GPU engines: size the KV cache to what is left of this fraction of the GPU's memory after what is "
     "in use and the weights"},
    {"--max-queue", NULL, TB_OPT_INT, "N", 1, 1 << 20, 0, 0, 0, S(max_queue), "256",
     "requests waiting beyond the running ones; more get 503"},
    {"--max-body", NULL, TB_OPT_SIZE, "SIZE", 1, GIB, 0, 0, 0, S(max_body_bytes), "1MiB",
     "the largest request body; larger get 413"},
    {"--timeout", NULL, TB_OPT_INT, "S", 1, 3600, 0, 0, 0, S(connection_timeout_s), "60",
     "seconds an idle client connection is kept"},
    {"--grace", NULL, TB_OPT_FLOAT, "S", 0, 3600, TB_OPT_LO_OPEN, 0, 0, S(grace_seconds), "30",
     "seconds SIGINT/SIGTERM lets running requests finish before the server exits"},
    {"--stream-interval", NULL, TB_OPT_INT, "N", 1, 4096, 0, 0, 0, S(stream_interval), "1",
     "generated tokens per Server-Sent Event (1: one event per token, as OpenAI sends; more merges them)"},
    {"--stream-buffer", NULL, TB_OPT_INT, "N", 1, 1 << 20, 0, 0, 0, S(stream_buffer), "1024",
     "unread tokens buffered per streamed choice; a client that leaves more unread is cancelled (logged)"},
    {"--api-key", NULL, TB_OPT_STR, "KEY", 0, 0, 0, 0, 0, S(api_key), "$TURBINE_API_KEY, else none",
     "require 'Authorization: Bearer KEY'"},
    {"--threads", "-t", TB_OPT_INT, "N", 1, 256, 0, 0, 0, S(threads), "one per core", "CPU threads of the engine"},
    {"--served-model-name", "--model-name", TB_OPT_STR, "NAME", 0, 0, 0, 0, 0, S(model_name),
     "the engine file's base name", "the model name /v1/models lists and requests must use (v2: /v2/models/NAME)"},
    {"--device", NULL, TB_OPT_STR, "cpu|cuda[:N]", 0, 0, 0, 0, 0, S(device), "the engine's backend",
     TB_CLI_HELP_DEVICE},
    {"--kv-dtype", NULL, TB_OPT_CHOICE, "auto|f32|f16|bf16|int8|fp8", 0, 0, 0, 0, 0, S(kv_dtype), "auto",
     TB_CLI_HELP_KV_DTYPE},
    {"--no-prefix-caching", "--no-enable-prefix-caching", TB_OPT_FLAG, NULL, 0, 0, 0, 0, 1, S(no_prefix_cache),
     NULL, "do not reuse the KV cache of a prompt prefix another request computed"},
    {"--max-batch-size", NULL, TB_OPT_INT, "N", 0, 4096, 0, 0, 0, S(max_batch_size),
     "8 when the engine's dim 0 is dynamic, else 1",
     "KServe v2: rows the dynamic batcher merges into one engine call (0 or 1: no merging; lowered to the "
     "engine profile's largest dim 0)"},
    {"--preferred-batch-size", NULL, TB_OPT_STR, "N[,N...]", 0, 0, 0, 0, 0, S(preferred_batch_size), "none",
     "KServe v2: batch sizes sent at once without waiting for --max-queue-delay-us"},
    {"--max-queue-delay-us", NULL, TB_OPT_INT, "US", 0, 60000000, 0, 0, 0, S(max_queue_delay_us), "0",
     "KServe v2: how long the oldest queued request waits for others to join its batch"},
    {"--max-queue-size", NULL, TB_OPT_INT, "N", 0, 1 << 20, 0, 0, 0, S(max_queue_size), "1024",
     "KServe v2: requests waiting in the batcher's queue; more get 429 (0: no limit)"},
    {"--instance-count", NULL, TB_OPT_INT, "N", 1, 64, 0, 0, 0, S(instance_count), "1",
     "KServe v2: engine instances (an executor and a worker thread each; --threads divided among them)"},
    {"--model-warmup", NULL, TB_OPT_STR, "auto|on|off", 0, 0, 0, 0, 0, S(model_warmup), "auto (on for GPUs)",
     "before the model is ready, run the batch sizes it will meet, so that no request pays for a shape's first run "
     "(a GPU captures each shape's CUDA graph and times its GEMMs): an LLM one decode step of each size "
     "1..min(--max-num-seqs, 256); KServe v2 each batch size the batcher can form, twice, with zero inputs. "
     "The GEMMs' timed picks are kept on disk (TURBINE_TUNE_CACHE: a folder, or off; default "
     "$XDG_CACHE_HOME/turbine or ~/.cache/turbine), so a restart on the same GPU times only shapes not seen before"},
    {"--request-timeout-us", NULL, TB_OPT_INT, "US", 0, 2000000000, 0, 0, 0, S(request_timeout_us), "0 (none)",
     "KServe v2: a request not started within this gets 504; a request's parameters.timeout overrides it"},
    {"--enable-prefix-caching", NULL, TB_OPT_FLAG, NULL, 0, 0, 0, 0, 0, S(no_prefix_cache), "on",
     "reuse cached prompt prefixes"},
};
#undef S

const tb_cli_cmd tb_cmd_serve = {
    "serve",
    "Serves an engine over HTTP: an LLM engine over an OpenAI-compatible API (/v1/completions, "
    "/v1/chat/completions, /v1/models), batching the requests continuously; a general engine (built from ONNX) "
    "over KServe v2, the Open Inference Protocol Triton speaks (POST /v2/models/NAME/infer with JSON or binary "
    "tensors). Both answer /v2, /v2/health/live|ready, /v2/models/NAME[/ready], /health and /metrics; with --grpc-port the KServe v2 calls "
    "are served over gRPC too.",
    {"FILE.engine"}, {offsetof(serve_args, o.engine_path)}, 1, 0,
    serve_opts, sizeof serve_opts / sizeof serve_opts[0],
    "With no engine it serves the bundled Shakespeare demo model as 'shakespeare-demo', built on first use into "
    "$XDG_CACHE_HOME/turbine (else ~/.cache/turbine) and rebuilt when the demo's files or the engine format "
    "change. The v2 API, its errors and curl examples: docs/SERVING.md.",
    sizeof(serve_args), serve_defaults,
};

/* ---------------------------------------------------------------- demo */

/* XXH3 of a whole file into the running state; 0 when it cannot be read. */
static int hash_file(XXH3_state_t *st, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) XXH3_64bits_update(st, buf, (size_t)n);
    close(fd);
    return n == 0;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The demo's key: XXH3 over the engine format version and every file of the
 * demo folder (names and contents, in name order). An engine in the cache is
 * served only when its sidecar records this key and the XXH3 of the engine
 * file itself, so a changed model, tokenizer, config or format — or another
 * engine copied over the cached one — means a rebuild, not a stale demo. */
static int demo_key(uint64_t *out) {
    DIR *d = opendir(TB_DEMO_MODEL_DIR);
    if (!d) return 0;
    char *names[64];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 64)
        if (de->d_name[0] != '.') names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], name_cmp);
    XXH3_state_t *st = XXH3_createState();
    int ok = st != NULL && n > 0;
    if (st) XXH3_64bits_reset(st);
    uint32_t version = TB_ENGINE_VERSION;
    if (ok) XXH3_64bits_update(st, &version, sizeof version);
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", TB_DEMO_MODEL_DIR, names[i]);
        if (ok) {
            XXH3_64bits_update(st, names[i], strlen(names[i]) + 1);
            ok = hash_file(st, path);
        }
        free(names[i]);
    }
    if (ok) *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return ok;
}

static int engine_hash(const char *path, uint64_t *out) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return 0;
    XXH3_64bits_reset(st);
    int ok = hash_file(st, path);
    if (ok) *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return ok;
}

/* The sidecar: "turbine-demo-cache 1\nkey %016llx\nengine %016llx\n". */
static int sidecar_read(const char *path, uint64_t *key, uint64_t *eng) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long k, e;
    int ok = fscanf(f, "turbine-demo-cache 1 key %llx engine %llx", &k, &e) == 2;
    fclose(f);
    if (ok) { *key = k; *eng = e; }
    return ok;
}

static int cached_demo_valid(const char *path, const char *side, uint64_t key) {
    uint64_t k, e, h;
    if (!sidecar_read(side, &k, &e)) return 0;
    if (k != key) {
        fprintf(stderr, "turbine: the demo model's files or the engine format changed since %s was built\n", path);
        return 0;
    }
    if (!engine_hash(path, &h)) return 0;
    if (h != e) {
        fprintf(stderr, "turbine: %s is not the engine built for the demo\n", path);
        return 0;
    }
    tb_engine *en = NULL;
    if (tb_engine_load(path, &en) != TB_OK) return 0; /* e.g. built for CPU features this machine lacks */
    tb_engine_free(en);
    return 1;
}

/* Builds the demo engine into the cache folder unless a valid one is there.
 * The build goes to a temporary file renamed into place, so a server that
 * starts meanwhile never maps a half-written engine. */
static const char *demo_engine(char *path, size_t cap) {
    const char *home = getenv("XDG_CACHE_HOME");
    char dir[PATH_MAX];
    if (home && *home) snprintf(dir, sizeof dir, "%s/turbine", home);
    else snprintf(dir, sizeof dir, "%s/.cache/turbine", getenv("HOME") ? getenv("HOME") : "/tmp");
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) { *slash = 0; mkdir(parent, 0755); }
    mkdir(dir, 0755);
    snprintf(path, cap, "%s/shakespeare-demo.engine", dir);
    char side[PATH_MAX + 8], tmp[PATH_MAX + 32], tmp_side[PATH_MAX + 40];
    snprintf(side, sizeof side, "%s.key", path);
    uint64_t key = 0;
    if (!demo_key(&key)) {
        fprintf(stderr, "turbine: error: cannot read the demo model in %s\n", TB_DEMO_MODEL_DIR);
        return NULL;
    }
    if (cached_demo_valid(path, side, key)) return path;
    fprintf(stderr, "turbine: building the demo model from %s\n", TB_DEMO_MODEL_DIR);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    snprintf(tmp_side, sizeof tmp_side, "%s.%ld.tmp", side, (long)getpid());
    tb_build_options o;
    tb_build_options_default(&o);
    o.max_batch = 16;
    uint64_t eh = 0;
    if (tb_build(TB_DEMO_MODEL_DIR, tmp, &o, NULL) != TB_OK) {
        fprintf(stderr, "turbine: error: cannot build the demo model: %s\n", tb_last_error());
        unlink(tmp);
        return NULL;
    }
    FILE *f = engine_hash(tmp, &eh) ? fopen(tmp_side, "w") : NULL;
    int ok = f && fprintf(f, "turbine-demo-cache 1\nkey %016llx\nengine %016llx\n", (unsigned long long)key,
                          (unsigned long long)eh) > 0;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0 || rename(tmp_side, side) != 0) {
        fprintf(stderr, "turbine: error: cannot write the demo engine to %s: %s\n", dir, strerror(errno));
        unlink(tmp);
        unlink(tmp_side);
        return NULL;
    }
    return path;
}

/* ---------------------------------------------------------------- main */

int tb_cli_serve(int argc, char **argv) {
    serve_args a;
    serve_defaults(&a);
    int rc = tb_cli_parse(&tb_cmd_serve, argc, argv, &a);
    if (rc >= 0) return rc;
    tb_serve_options o = a.o;
    if (!o.api_key) o.api_key = getenv("TURBINE_API_KEY");
    char demo[PATH_MAX];
    if (o.model_repository && o.engine_path) {
        fprintf(stderr, "turbine: error: give FILE.engine or --model-repository DIR, not both\n");
        return 2;
    }
    if (!o.engine_path && !o.model_repository) {
        o.engine_path = demo_engine(demo, sizeof demo);
        if (!o.engine_path) return 1;
        if (!o.model_name) o.model_name = "shakespeare-demo";
    }
    return tb_serve_run(&o);
}
