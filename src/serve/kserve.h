/*
 * kserve.h — the KServe v2 / Open Inference Protocol (what Triton speaks)
 * as pure functions, without sockets or engines: route parsing, infer
 * requests (JSON tensors and the binary tensor extension) parsed into
 * tb_tensor inputs checked against a model's tb_io_info, responses encoded
 * (JSON data or binary outputs), model metadata and the error body.
 *
 * Every function that can fail returns the HTTP status the server answers
 * with (200: accepted) and writes the message into a tb_ks_error, so the
 * server, the tests and a fuzzer all see the same decisions. Everything a
 * request states is bounded: the body (by the caller), the number of
 * tensors, ranks, element counts and byte counts (with overflow checks).
 *
 * The protocol: https://github.com/kserve/open-inference-protocol
 * (REST), Triton's binary tensor data extension.
 */
#ifndef TB_KSERVE_H
#define TB_KSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "turbine/turbine.h"

#define TB_KS_MAX_IO 64       /* inputs or outputs of a model a request may name */
#define TB_KS_MAX_ID 256      /* bytes of a request's "id" echoed back */
#define TB_KS_MAX_NAME 128    /* bytes of a model name or version */

typedef struct {
    int status; /* HTTP: 400 bad request, 404 unknown model, 413, 500, 503 */
    char msg[512];
} tb_ks_error;

/* ---------------------------------------------------------------- routes */

typedef enum {
    TB_KS_ROUTE_NONE = 0,      /* not a /v2 path */
    TB_KS_ROUTE_SERVER,        /* /v2 */
    TB_KS_ROUTE_LIVE,          /* /v2/health/live */
    TB_KS_ROUTE_READY,         /* /v2/health/ready */
    TB_KS_ROUTE_MODEL,         /* /v2/models/{name}[/versions/{v}] */
    TB_KS_ROUTE_MODEL_READY,   /* .../ready */
    TB_KS_ROUTE_INFER,         /* .../infer */
    TB_KS_ROUTE_STATS,         /* .../stats (Triton's statistics extension) */
    TB_KS_ROUTE_UNKNOWN,       /* under /v2 but no such route: 404 */
} tb_ks_route;

/* Splits a request path. `name` and `version` (TB_KS_MAX_NAME bytes each)
 * get the model's name and version ("" when the path names none); a name or
 * version longer than that, empty, or with a '/' makes the route UNKNOWN. */
tb_ks_route tb_ks_parse_route(const char *url, char *name, char *version);

/* Fills e (status, printf-formatted message) and returns status: the one
 * way the parsers here report an error. */
int tb_ks_fail(tb_ks_error *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An input's profile range as "[1..8,4]" for error messages. */
void tb_ks_range_str(char *buf, size_t cap, const tb_io_info *io);

/* ---------------------------------------------------------------- dtypes */

/* The protocol's datatype name of a tb_dtype ("FP32", ...; NULL for types
 * it has none for: I4, FP8), and the reverse (0 when the name is none of
 * BOOL UINT8 INT8 INT32 INT64 FP16 BF16 FP32 FP64). */
const char *tb_ks_dtype_name(tb_dtype t);
int tb_ks_dtype_parse(const char *name, tb_dtype *out);
/* Bytes of one element of a type the protocol carries (0 for BYTES, whose
 * elements vary in length). */
size_t tb_ks_dtype_size(tb_dtype t);

/* BYTES, the protocol's type of strings and raw byte sequences. No engine
 * holds it (it is no tb_dtype): the server's own models use it (an LLM's
 * text_input and text_output). A tb_tensor of it holds Triton's serialized
 * form, which is also its binary wire form: per element a 4-byte
 * little-endian length, then that many bytes. In JSON an element is a
 * string. */
#define TB_KS_BYTES ((tb_dtype)(TB_DTYPE_COUNT + 32))
#define TB_KS_MAX_ELEM_BYTES (1u << 30) /* bytes of one BYTES element */

/* The serialized size of the `elems` BYTES elements at p into *size; 0
 * when they do not fit in the n bytes there (a length runs past the end),
 * else 1. */
int tb_ks_bytes_size(const void *p, size_t n, int64_t elems, size_t *size);
/* Element i of a serialized BYTES tensor of `size` bytes (its data and its
 * length); 0 when there is none. */
int tb_ks_bytes_get(const void *p, size_t size, int64_t i, const char **s, size_t *len);

/* ---------------------------------------------------------------- infer */

typedef struct {
    char id[TB_KS_MAX_ID];          /* the request's "id", "" when none */
    int n_inputs;                   /* = the model's: every input is required */
    tb_tensor inputs[TB_KS_MAX_IO]; /* in the model's order; data in `buf` */
    int n_outputs;                  /* requested outputs; 0: all, as JSON
                                     * unless binary_all */
    int outputs[TB_KS_MAX_IO];      /* the model's output index of each */
    int binary[TB_KS_MAX_IO];       /* 1: that output as binary data */
    int binary_all;                 /* parameters.binary_data_output */
    long long timeout_us;           /* parameters.timeout (microseconds), 0 when absent */
    int given[TB_KS_MAX_IO];        /* 1: the input is in the request (an
                                     * optional one may be absent: its
                                     * tensor is zeroed, data NULL) */
    size_t in_size[TB_KS_MAX_IO];   /* bytes of each input's data (BYTES:
                                     * its serialized size) */
    char *params;                   /* the request's "parameters" object as
                                     * compact JSON (malloc'd), NULL when
                                     * absent; for parameters a model reads
                                     * itself (an LLM's sampling) */
    size_t in_bytes;                /* bytes of all input data */
    void *buf;                      /* owns the inputs' data (64-byte aligned) */
} tb_ks_request;

/* Parses an infer request body of `n` bytes. `header_len`: the value of
 * the Inference-Header-Content-Length header, or -1 when absent (the whole
 * body is JSON). With it the body is that many bytes of JSON followed by
 * the raw little-endian data of each input that has
 * parameters.binary_data_size, in the order the inputs are listed, and
 * nothing else. Inputs are checked against the model's `in[0..n_in)`
 * (name, datatype, rank, each dim within [min, max]; nested or flat "data"
 * of exactly the shape's element count, each value within its datatype);
 * outputs named must be among `out[0..n_out)`. `max_elems` bounds the
 * elements of one input (0: no bound but the body's). On success (200) `r`
 * owns its buffer: release it with tb_ks_request_free. On failure nothing
 * is held. */
int tb_ks_parse_infer(const char *body, size_t n, long long header_len, const tb_io_info *in, int n_in,
                      const tb_io_info *out, int n_out, size_t max_elems, tb_ks_request *r, tb_ks_error *err);
void tb_ks_request_free(tb_ks_request *r); /* accepts a zeroed or freed request */
/* As tb_ks_parse_infer; input k may be left out of the request when bit k
 * of `optional` is set (r->given[k] says whether it came). */
int tb_ks_parse_infer_opt(const char *body, size_t n, long long header_len, const tb_io_info *in, int n_in,
                          uint64_t optional, const tb_io_info *out, int n_out, size_t max_elems, tb_ks_request *r,
                          tb_ks_error *err);

/* The response of a request: outputs[k] is the model's output k as the run
 * gave it (all n_out of them). The body goes to *body (malloc'd, *n bytes):
 * JSON, or, when some output is binary, a JSON header of *header_len bytes
 * followed by the binary outputs' bytes (*header_len is 0 for plain JSON;
 * the server then sends Inference-Header-Content-Length). Returns 200, or
 * 500 (out of memory, or a non-finite float asked for as JSON, which JSON
 * cannot spell). */
int tb_ks_encode_response(const char *model, const char *version, const tb_ks_request *r, const tb_io_info *out,
                          const tb_tensor *outputs, int n_out, char **body, size_t *n, size_t *header_len,
                          tb_ks_error *err);

/* ---------------------------------------------------------------- metadata */

/* Model metadata: {"name", "versions", "platform": "turbine", "inputs":
 * [{"name", "datatype", "shape"}], "outputs": [...]}, a dim -1 where the
 * profile lets it vary (min != max) or the engine knows it only when it
 * runs. Malloc'd JSON text, NULL when out of memory. */
char *tb_ks_model_metadata(const char *name, const char *version, const tb_io_info *in, int n_in,
                           const tb_io_info *out, int n_out);

/* {"error": "msg"}: malloc'd JSON text, NULL when out of memory. */
char *tb_ks_error_json(const char *msg);

#endif
