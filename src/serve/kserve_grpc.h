/*
 * kserve_grpc.h — the KServe v2 gRPC service (package inference, service
 * GRPCInferenceService, the messages of src/serve/kserve_grpc.proto):
 * ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
 * ModelInfer, ModelStatistics and ModelStreamInfer, on `turbine serve
 * --grpc-port`. ModelInfer serves engines through their batcher and LLM
 * engines as the HTTP v2 route does (text_input / max_tokens / text_output,
 * BYTES). ModelStreamInfer answers each request of a bidirectional stream
 * in order, as Triton does: one response of an engine's outputs, or an
 * error_message for that request alone; an LLM request with
 * parameters["stream"] true gets a response per piece of generated text,
 * the last marked with parameters["triton_final_response"] true.
 *
 * The service knows no engines: the server hands it a tb_ks_grpc_host, a
 * few callbacks that find a model and run a request through that model's
 * dynamic batcher, so gRPC and HTTP requests share one queue, one model
 * table and one set of per-model counters. Decisions are made as the HTTP
 * side makes them and answered with the status code gRPC has for each
 * (tb_ks_grpc_code): 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404
 * NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504
 * DEADLINE_EXCEEDED, 500 INTERNAL.
 *
 * The gRPC C core (Debian libgrpc-dev at build time) is loaded with dlopen
 * when the service starts, as libmicrohttpd is (mhd_shim.h): its fifty
 * shared libraries cost every other command nothing. Calls are served by
 * TB_KS_GRPC_WORKERS threads, each with its own completion queue and one
 * call at a time, since a request blocks in the batcher until its result;
 * more calls wait in gRPC's queue. ModelStreamInfer is a registered method
 * with threads of its own (TB_KS_GRPC_STREAMS, one stream each for its
 * whole life), so open streams never hold the workers of the other calls.
 * A request message is bounded by max_message_bytes (larger:
 * RESOURCE_EXHAUSTED, by gRPC itself).
 *
 * Without TB_HAVE_GRPC (no grpc headers or protobuf-c when built) every
 * function here reports TB_ERR_UNSUPPORTED / 500 with what is missing.
 */
#ifndef TB_KSERVE_GRPC_H
#define TB_KSERVE_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "serve/kserve.h"
#include "turbine/turbine.h"

#define TB_KS_GRPC_WORKERS 16 /* calls served at once */
#define TB_KS_GRPC_STREAMS 16 /* ModelStreamInfer streams served at once */

/* One model as the server's table holds it, for the length of one call. */
typedef struct {
    const char *name, *version;
    int ready;             /* the model serves requests now */
    int is_llm;            /* an LLM engine: ModelInfer through llm_infer */
    uint64_t optional;     /* bit k: input k may be left out of a request */
    int n_in, n_out;
    const tb_io_info *in, *out;
    int timeout_override;  /* parameters["timeout"] is honoured */
    void *handle;          /* the server's; passed back to it */
} tb_ks_model_view;

/* One model version's counters for ModelStatistics, as the HTTP
 * statistics extension reports them. */
typedef struct {
    char name[TB_KS_MAX_NAME], version[TB_KS_MAX_NAME];
    uint64_t last_ms;                      /* last inference, ms since the epoch */
    uint64_t inference_count, execution_count;
    uint64_t success_n, success_ns, fail_n, fail_ns;
    uint64_t queue_n, queue_ns, compute_n, compute_ns;
} tb_ks_model_stats;

/* What the service asks of the server. Every function may be called from
 * any worker thread at once. */
typedef struct {
    void *ctx;
    /* 1 when every model is loaded and the server is not stopping. */
    int (*server_ready)(void *ctx);
    /* The model of name/version ("": the server picks, as over HTTP) into
     * *m; returns 200, or 404 / 503 (still loading) with err. pin 1, for
     * ModelInfer: the model must be ready (else 503; 400 for an LLM) and
     * stays loaded until model_done, which must follow every pinned 200. */
    int (*model_find)(void *ctx, const char *name, const char *version, int pin, tb_ks_model_view *m,
                      tb_ks_error *err);
    /* Runs inputs (in the model's order) through the model's batcher;
     * outputs point into *owned, which the caller frees. */
    tb_status (*model_infer)(void *ctx, const tb_ks_model_view *m, const tb_tensor *in, int n_in, int64_t timeout_us,
                             tb_tensor *out, int n_out, void **owned);
    /* An LLM's request (text_input, optional max_tokens, sampling in
     * rq->params): 200 with *out its one output (text_output, BYTES),
     * whose data *owned holds (the caller frees it), else an HTTP status
     * and err. */
    int (*llm_infer)(void *ctx, const tb_ks_model_view *m, const tb_ks_request *rq, tb_tensor *out, void **owned,
                     tb_ks_error *err);
    /* The counters of model name/version ("" for either: all of them) into
     * out[0..cap): the count, or minus an HTTP status (404) with err. */
    int (*model_stats)(void *ctx, const char *name, const char *version, tb_ks_model_stats *out, int cap,
                       tb_ks_error *err);
    /* A pinned request ended (ok: answered with outputs) after ns. */
    void (*model_done)(void *ctx, const tb_ks_model_view *m, int ok, uint64_t ns);
    /* ModelStreamInfer of an LLM. llm_stream_start submits rq (as
     * llm_infer takes it; parameters["stream"] is the service's) and
     * returns 200 with *gen, else an HTTP status and err. llm_stream_next
     * waits up to timeout_s for more of gen's text: *text / *n the text
     * released since the previous call (valid until the next call), and
     * 0 while it runs, 200 once it has ended (its last text given), else
     * an HTTP status and err. llm_stream_end cancels gen when it still
     * runs and frees it. One thread reads a gen at a time. */
    int (*llm_stream_start)(void *ctx, const tb_ks_model_view *m, const tb_ks_request *rq, void **gen,
                            tb_ks_error *err);
    int (*llm_stream_next)(void *ctx, void *gen, double timeout_s, const char **text, size_t *n, tb_ks_error *err);
    void (*llm_stream_end)(void *ctx, void *gen);
} tb_ks_grpc_host;

typedef struct {
    const char *host;          /* the address to listen on, as --host */
    int port;
    size_t max_message_bytes;  /* largest request message */
    const char *api_key;       /* NULL: none; else 'authorization: Bearer KEY'
                                * metadata on all calls but ServerLive/Ready */
    const char *version;       /* ServerMetadata's version */
} tb_ks_grpc_options;

typedef struct tb_ks_grpc tb_ks_grpc;

/* 1 when the service is compiled in. */
int tb_ks_grpc_compiled(void);

/* Loads the gRPC library, listens on host:port and starts the workers.
 * TB_ERR_UNSUPPORTED when not compiled in or the library cannot be
 * loaded, TB_ERR_IO when the port cannot be bound. `h` must outlive the
 * service. */
tb_status tb_ks_grpc_start(const tb_ks_grpc_options *o, const tb_ks_grpc_host *h, tb_ks_grpc **out);

/* Stops taking calls, lets the calls in progress finish for up to grace_s
 * seconds (then cancels them), joins the workers and frees everything.
 * NULL is fine. */
void tb_ks_grpc_stop(tb_ks_grpc *g, double grace_s);

/* The gRPC status code of a status the HTTP side would answer with. */
int tb_ks_grpc_code(int http_status);

/* ---------------------------------------------------------------- messages
 * The ModelInfer request and response, without sockets: for the service,
 * its tests and a fuzzer. */

typedef struct tb_ks_grpc_request tb_ks_grpc_request;

/* Decodes a ModelInferRequest of n bytes: 200 with *out (free it with
 * tb_ks_grpc_request_free), or 400 when it is not one. */
int tb_ks_grpc_decode_infer(const void *msg, size_t n, tb_ks_grpc_request **out, tb_ks_error *err);
const char *tb_ks_grpc_request_model(const tb_ks_grpc_request *q);
const char *tb_ks_grpc_request_version(const tb_ks_grpc_request *q);
void tb_ks_grpc_request_free(tb_ks_grpc_request *q); /* NULL is fine */

/* The request's inputs checked against the model's in[0..n_in) (names,
 * datatypes, shapes within the profile, element counts, typed contents of
 * the datatype's field and range, or raw_input_contents of exactly the
 * bytes each input needs) into r, as tb_ks_parse_infer does for HTTP:
 * 200 (release r with tb_ks_request_free) or 400 / 500. Outputs named must
 * be among out[0..n_out); parameters["timeout"] (int64, microseconds) goes
 * to r->timeout_us. max_elems bounds one input (0: none). */
int tb_ks_grpc_request_check(const tb_ks_grpc_request *q, const tb_io_info *in, int n_in, const tb_io_info *out,
                             int n_out, size_t max_elems, tb_ks_request *r, tb_ks_error *err);
/* As tb_ks_grpc_request_check; input k may be left out when bit k of
 * `optional` is set (r->given[k] says whether it came). BYTES inputs come
 * in contents.bytes_contents or raw_input_contents (each element a 4-byte
 * little-endian length and its bytes); r->in_size[k] holds each input's
 * bytes. Parameters other than "timeout" go to r->params as a JSON object
 * (bool, int64, uint64, double and string values). */
int tb_ks_grpc_request_check_opt(const tb_ks_grpc_request *q, const tb_io_info *in, int n_in, uint64_t optional,
                                 const tb_io_info *out, int n_out, size_t max_elems, tb_ks_request *r,
                                 tb_ks_error *err);

/* The ModelInferResponse of a run: every output the request asked for
 * (all when it named none) with its datatype and shape, and its bytes in
 * raw_output_contents, as Triton answers. *msg is malloc'd (*n bytes).
 * 200, or 500 (an output the protocol cannot carry, out of memory). */
int tb_ks_grpc_encode_infer(const char *model, const char *version, const tb_ks_request *r, const tb_io_info *out,
                            const tb_tensor *outputs, int n_out, void **msg, size_t *n, tb_ks_error *err);

#endif
