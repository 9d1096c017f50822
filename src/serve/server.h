/*
 * server.h — `turbine serve`: the OpenAI-compatible HTTP server.
 *
 * HTTP threads (libmicrohttpd, one per connection) parse and validate
 * requests, tokenize prompts, hand them to the scheduler and stream tokens
 * back as Server-Sent Events, detokenizing on their side (UTF-8 safe, stop
 * strings matched across token boundaries and never emitted). The scheduler
 * thread owns the engine. Bad input gets an OpenAI-style error and the server
 * keeps serving.
 */
#ifndef TB_SERVER_H
#define TB_SERVER_H

#include <stddef.h>

#include "serve/chat.h"
#include "turbine/turbine.h"

typedef struct {
    const char *engine_path;    /* required unless model_repository */
    const char *model_repository; /* a Triton-layout folder of general models (docs/SERVING.md) */
    const char *model_name;     /* NULL: the engine file's base name */
    const char *host;           /* default 127.0.0.1 */
    int port;                   /* default 8000 */
    int grpc_port;              /* > 0: the KServe v2 gRPC service on this port too */
    int max_num_seqs;           /* 0: the engine's max batch */
    int max_batched_tokens;     /* 0: the engine's step profile */
    size_t kv_cache_bytes;      /* 0: room for max_num_seqs full contexts */
    double gpu_memory_fraction; /* > 0 (GPU engines): the KV pool is what is left
                                 * of this fraction of the GPU's memory after
                                 * what is in use and the engine's weights */
    int max_queue;              /* default 256 */
    const char *api_key;        /* NULL: no authentication */
    int threads;                /* 0: one per core */
    size_t max_body_bytes;      /* default 1 MiB */
    double grace_seconds;       /* shutdown drain, default 30 */
    int connection_timeout_s;   /* idle client timeout, default 60 */
    const char *device;         /* NULL: the engine's backend; "cpu", "cuda:N" */
    int no_prefix_cache;        /* 1: no KV reuse across requests */
    const char *kv_dtype;       /* NULL/"auto": the engine's; "f32", "f16", "bf16" */
    int stream_interval;        /* generated tokens per streamed event, default 1 */
    int stream_buffer;          /* tokens a stream holds for a client that is not
                                 * reading; past it the request is cancelled.
                                 * Default 1024 */
    /* The dynamic batcher of a general engine (Triton's dynamic_batching;
     * docs/SERVING.md gives the defaults). -1: unset, the default applies. */
    int max_batch_size;         /* rows per engine call; 0 or 1: no merging */
    const char *preferred_batch_size; /* "4,8": sizes sent without waiting */
    int max_queue_delay_us;     /* wait of the oldest request for others */
    int max_queue_size;         /* waiting requests; more get 429; 0: no limit */
    int instance_count;         /* workers, an executor each */
    int request_timeout_us;     /* a request's deadline before it runs; 0: none */
    const char *model_warmup;   /* "auto" (NULL), "on", "off": see tb_batcher_config.warmup */
} tb_serve_options;

void tb_serve_options_default(tb_serve_options *o);

/* Serves until SIGINT or SIGTERM, then drains and returns 0; returns 1 when
 * it cannot start (message on stderr). */
int tb_serve_run(const tb_serve_options *o);

/* What the server does with a generation request's body before it runs it
 * (JSON, fields, the prompt tokenized or the messages rendered and
 * tokenized, the limits), without an engine: `chat` 0 for /v1/completions,
 * 1 for /v1/chat/completions, for a model named `model` with tokenizer
 * `tok`, `info` and chat format `format`. Returns the HTTP status the
 * server would answer with (200: accepted) and its message in `msg`. For
 * tests and fuzzing. */
int tb_serve_check_request(const char *body, size_t n, int chat, const char *model,
                           const tb_tokenizer *tok, const tb_engine_info *info,
                           tb_chat_format format, char *msg, size_t cap);

#endif
