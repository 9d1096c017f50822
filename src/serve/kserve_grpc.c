/* kserve_grpc.c — the KServe v2 gRPC service (see kserve_grpc.h): the
 * ModelInfer messages (protobuf-c code generated from kserve_grpc.proto)
 * checked into the same tb_ks_request the HTTP side builds, then the gRPC C
 * core loaded with dlopen, a pool of workers that each take one call at a
 * time from their own completion queue, the unary calls, and
 * ModelStreamInfer on threads of its own. */
#define _GNU_SOURCE
#include "serve/kserve_grpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

int tb_ks_grpc_code(int http) {
    switch (http) {
    case 200: return 0;  /* OK */
    case 400: return 3;  /* INVALID_ARGUMENT */
    case 401: return 16; /* UNAUTHENTICATED */
    case 404: return 5;  /* NOT_FOUND */
    case 413:            /* a message over the bound, as gRPC itself answers it */
    case 429: return 8;  /* RESOURCE_EXHAUSTED */
    case 501: return 12; /* UNIMPLEMENTED */
    case 503: return 14; /* UNAVAILABLE */
    case 504: return 4;  /* DEADLINE_EXCEEDED */
    default: return 13;  /* INTERNAL */
    }
}

#ifndef TB_HAVE_GRPC

#define MISSING "turbine was built without the gRPC service (it needs libgrpc-dev, libprotobuf-c-dev and protoc-c)"

int tb_ks_grpc_compiled(void) { return 0; }
tb_status tb_ks_grpc_start(const tb_ks_grpc_options *o, const tb_ks_grpc_host *h, tb_ks_grpc **out) {
    (void)o; (void)h;
    *out = NULL;
    return tb_errorf(TB_ERR_UNSUPPORTED, "--grpc-port: %s", MISSING);
}
void tb_ks_grpc_stop(tb_ks_grpc *g, double grace_s) { (void)g; (void)grace_s; }
static int missing(tb_ks_error *e) {
    e->status = 500;
    snprintf(e->msg, sizeof e->msg, "%s", MISSING);
    return 500;
}
int tb_ks_grpc_decode_infer(const void *msg, size_t n, tb_ks_grpc_request **out, tb_ks_error *err) {
    (void)msg; (void)n;
    *out = NULL;
    return missing(err);
}
const char *tb_ks_grpc_request_model(const tb_ks_grpc_request *q) { (void)q; return ""; }
const char *tb_ks_grpc_request_version(const tb_ks_grpc_request *q) { (void)q; return ""; }
void tb_ks_grpc_request_free(tb_ks_grpc_request *q) { (void)q; }
int tb_ks_grpc_request_check_opt(const tb_ks_grpc_request *q, const tb_io_info *in, int n_in, uint64_t optional,
                                 const tb_io_info *out, int n_out, size_t max_elems, tb_ks_request *r,
                                 tb_ks_error *err) {
    (void)q; (void)in; (void)n_in; (void)optional; (void)out; (void)n_out; (void)max_elems;
    memset(r, 0, sizeof *r);
    return missing(err);
}
int tb_ks_grpc_encode_infer(const char *model, const char *version, const tb_ks_request *r, const tb_io_info *out,
                            const tb_tensor *outputs, int n_out, void **msg, size_t *n, tb_ks_error *err) {
    (void)model; (void)version; (void)r; (void)out; (void)outputs; (void)n_out;
    *msg = NULL;
    *n = 0;
    return missing(err);
}

#else /* TB_HAVE_GRPC */

#include <dlfcn.h>
#include <grpc/byte_buffer.h>
#include <jansson.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>

#include "kserve_grpc.pb-c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "raw tensor contents are little-endian; this host is not"
#endif

#define ALIGN 64

int tb_ks_grpc_compiled(void) { return 1; }


/* ================================================================ ModelInfer messages */

struct tb_ks_grpc_request {
    Inference__ModelInferRequest *m;
};

int tb_ks_grpc_decode_infer(const void *msg, size_t n, tb_ks_grpc_request **out, tb_ks_error *e) {
    *out = NULL;
    e->status = 200;
    e->msg[0] = 0;
    tb_ks_grpc_request *q = calloc(1, sizeof *q);
    if (!q) return tb_ks_fail(e, 500, "out of memory");
    q->m = inference__model_infer_request__unpack(NULL, n, msg);
    if (!q->m) {
        free(q);
        return tb_ks_fail(e, 400, "the message is not a ModelInferRequest (%zu bytes that do not decode)", n);
    }
    *out = q;
    return 200;
}

const char *tb_ks_grpc_request_model(const tb_ks_grpc_request *q) { return q->m->model_name; }
const char *tb_ks_grpc_request_version(const tb_ks_grpc_request *q) { return q->m->model_version; }

void tb_ks_grpc_request_free(tb_ks_grpc_request *q) {
    if (!q) return;
    inference__model_infer_request__free_unpacked(q->m, NULL);
    free(q);
}

static int find_io(const tb_io_info *io, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(io[i].name, name)) return i;
    return -1;
}


/* Values of each typed field of contents, and which field a datatype uses
 * (-1: none, FP16 and BF16 travel raw). */
enum { F_BOOL, F_INT, F_INT64, F_UINT, F_UINT64, F_FP32, F_FP64, F_BYTES, N_FIELDS };
static const char *const k_field_names[N_FIELDS] = {"bool_contents",   "int_contents",  "int64_contents",
                                                    "uint_contents",   "uint64_contents", "fp32_contents",
                                                    "fp64_contents",   "bytes_contents"};

static int field_of(tb_dtype t) {
    if (t == TB_KS_BYTES) return F_BYTES; /* no tb_dtype */
    switch (t) {
    case TB_BOOL: return F_BOOL;
    case TB_I8:
    case TB_I32: return F_INT;
    case TB_I64: return F_INT64;
    case TB_U8: return F_UINT;
    case TB_F32: return F_FP32;
    case TB_F64: return F_FP64;
    default: return -1;
    }
}

static void field_counts(const Inference__InferTensorContents *c, size_t n[N_FIELDS]) {
    memset(n, 0, N_FIELDS * sizeof n[0]);
    if (!c) return;
    n[F_BOOL] = c->n_bool_contents;
    n[F_INT] = c->n_int_contents;
    n[F_INT64] = c->n_int64_contents;
    n[F_UINT] = c->n_uint_contents;
    n[F_UINT64] = c->n_uint64_contents;
    n[F_FP32] = c->n_fp32_contents;
    n[F_FP64] = c->n_fp64_contents;
    n[F_BYTES] = c->n_bytes_contents;
}

/* Typed contents of input `name` (el values, checked by the caller) into dst. */
static int copy_contents(const char *name, tb_dtype t, const Inference__InferTensorContents *c, int64_t el,
                         void *dst, tb_ks_error *e) {
    for (int64_t i = 0; i < el; i++) {
        switch (t) {
        case TB_BOOL: ((uint8_t *)dst)[i] = c->bool_contents[i] ? 1 : 0; break;
        case TB_U8:
            if (c->uint_contents[i] > 255) return tb_ks_fail(e, 400, "input '%s': %u is out of range for UINT8", name,
                                                       c->uint_contents[i]);
            ((uint8_t *)dst)[i] = (uint8_t)c->uint_contents[i];
            break;
        case TB_I8:
            if (c->int_contents[i] < -128 || c->int_contents[i] > 127)
                return tb_ks_fail(e, 400, "input '%s': %d is out of range for INT8", name, c->int_contents[i]);
            ((int8_t *)dst)[i] = (int8_t)c->int_contents[i];
            break;
        case TB_I32: ((int32_t *)dst)[i] = c->int_contents[i]; break;
        case TB_I64: ((int64_t *)dst)[i] = c->int64_contents[i]; break;
        case TB_F32: ((float *)dst)[i] = c->fp32_contents[i]; break;
        case TB_F64: ((double *)dst)[i] = c->fp64_contents[i]; break;
        default: return tb_ks_fail(e, 400, "input '%s': its datatype has no typed contents", name);
        }
    }
    return 200;
}

/* The request's parameters but "timeout" as a compact JSON object into
 * r->params (left NULL when there are none). */
static int params_json(const Inference__ModelInferRequest *m, tb_ks_request *r, tb_ks_error *e) {
    if (m->n_parameters == 0) return 200; /* the common case: no JSON object to build */
    json_t *o = json_object();
    if (!o) return tb_ks_fail(e, 500, "out of memory");
    for (size_t i = 0; i < m->n_parameters; i++) {
        const Inference__ModelInferRequest__ParametersEntry *p = m->parameters[i];
        const Inference__InferParameter *v = p->value;
        if (!strcmp(p->key, "timeout") || !v) continue;
        json_t *j = NULL;
        switch (v->parameter_choice_case) {
        case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM: j = json_boolean(v->bool_param); break;
        case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM: j = json_integer(v->int64_param); break;
        case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
            if (v->uint64_param > (uint64_t)INT64_MAX) {
                json_decref(o);
                return tb_ks_fail(e, 400, "parameters[\"%.64s\"] is out of range", p->key);
            }
            j = json_integer((json_int_t)v->uint64_param);
            break;
        case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM: j = json_real(v->double_param); break;
        case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM: j = json_string(v->string_param); break;
        default: continue; /* no value set */
        }
        if (!j || json_object_set_new(o, p->key, j)) {
            json_decref(o);
            return tb_ks_fail(e, 400, "parameters[\"%.64s\"]: a key or string that is not UTF-8", p->key);
        }
    }
    if (json_object_size(o) > 0) {
        r->params = json_dumps(o, JSON_COMPACT);
        if (!r->params) {
            json_decref(o);
            return tb_ks_fail(e, 500, "out of memory");
        }
    }
    json_decref(o);
    return 200;
}

int tb_ks_grpc_request_check_opt(const tb_ks_grpc_request *q, const tb_io_info *in, int n_in, uint64_t optional,
                                 const tb_io_info *out, int n_out, size_t max_elems, tb_ks_request *r,
                                 tb_ks_error *e) {
    memset(r, 0, sizeof *r);
    e->status = 200;
    e->msg[0] = 0;
    if (n_in > TB_KS_MAX_IO || n_out > TB_KS_MAX_IO) return tb_ks_fail(e, 500, "the model has too many inputs or outputs");
    const Inference__ModelInferRequest *m = q->m;
    if (strlen(m->id) >= sizeof r->id) return tb_ks_fail(e, 400, "'id' is longer than %d bytes", TB_KS_MAX_ID - 1);
    snprintf(r->id, sizeof r->id, "%s", m->id);
    for (size_t i = 0; i < m->n_parameters; i++) {
        const Inference__ModelInferRequest__ParametersEntry *p = m->parameters[i];
        if (strcmp(p->key, "timeout") != 0) continue; /* others (priority, ...) are not acted on */
        const Inference__InferParameter *v = p->value;
        if (v && v->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM &&
            v->int64_param >= 0)
            r->timeout_us = v->int64_param;
        else if (v && v->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM &&
                 v->uint64_param <= (uint64_t)INT64_MAX)
            r->timeout_us = (long long)v->uint64_param;
        else
            return tb_ks_fail(e, 400, "parameters[\"timeout\"] must be a non-negative int64_param (microseconds)");
    }
    int raw = m->n_raw_input_contents > 0;
    if (raw && m->n_raw_input_contents != m->n_inputs)
        return tb_ks_fail(e, 400, "raw_input_contents has %zu entries; the request has %zu inputs (one each, in order)",
                    m->n_raw_input_contents, m->n_inputs);
    int seen[TB_KS_MAX_IO] = {0};
    int src[TB_KS_MAX_IO];    /* request index of each model input */
    size_t bytes[TB_KS_MAX_IO] = {0};
    int64_t elems[TB_KS_MAX_IO] = {0};
    /* more inputs than the model's: one is unknown or given twice, and the
     * loop stops there, naming it */
    for (size_t j = 0; j < m->n_inputs; j++) {
        const Inference__ModelInferRequest__InferInputTensor *it = m->inputs[j];
        const char *nm = it->name;
        int k = find_io(in, n_in, nm);
        if (k < 0) return tb_ks_fail(e, 400, "unknown input '%s'", nm);
        if (seen[k]) return tb_ks_fail(e, 400, "input '%s' is given twice", nm);
        seen[k] = 1;
        src[k] = (int)j;
        const tb_io_info *io = &in[k];
        tb_dtype t;
        if (!tb_ks_dtype_parse(it->datatype, &t))
            return tb_ks_fail(e, 400, "input '%s': unsupported datatype '%s'", nm, it->datatype);
        if (t != io->dtype)
            return tb_ks_fail(e, 400, "input '%s' has datatype %s; the model takes %s", nm, it->datatype,
                        tb_ks_dtype_name(io->dtype) ? tb_ks_dtype_name(io->dtype) : tb_dtype_name(io->dtype));
        char want[256];
        tb_ks_range_str(want, sizeof want, io);
        if (it->n_shape != (size_t)io->rank)
            return tb_ks_fail(e, 400, "input '%s' has rank %zu; the model takes shape %s", nm, it->n_shape, want);
        tb_tensor *x = &r->inputs[k];
        x->dtype = t;
        x->rank = io->rank;
        int64_t el = 1;
        for (int d = 0; d < io->rank; d++) {
            int64_t v = it->shape[d];
            if (v < io->min[d] || v > io->max[d])
                return tb_ks_fail(e, 400, "input '%s': dim %d is %lld; the model takes shape %s", nm, d, (long long)v, want);
            x->dims[d] = v;
            if (v > 0 && el > INT64_MAX / v) return tb_ks_fail(e, 400, "input '%s' has too many elements", nm);
            el *= v;
        }
        const int is_bytes = t == TB_KS_BYTES;
        size_t es = is_bytes ? 4 : tb_ks_dtype_size(t); /* BYTES: at least its length */
        if ((uint64_t)el > SIZE_MAX / 2 / es || (max_elems && (uint64_t)el > max_elems))
            return tb_ks_fail(e, 400, "input '%s' has too many elements", nm);
        elems[k] = el;
        bytes[k] = (size_t)el * es;
        size_t cnt[N_FIELDS], total = 0;
        field_counts(it->contents, cnt);
        for (int f = 0; f < N_FIELDS; f++) total += cnt[f];
        if (raw && is_bytes) {
            if (total) return tb_ks_fail(e, 400, "input '%s' has contents, but the request sends raw_input_contents", nm);
            const ProtobufCBinaryData *rb = &m->raw_input_contents[j];
            size_t sz = 0;
            if (!tb_ks_bytes_size(rb->data, rb->len, el, &sz) || sz != rb->len)
                return tb_ks_fail(e, 400, "input '%s': raw_input_contents[%zu] (%zu bytes) is not %lld BYTES elements "
                                  "(each a 4-byte little-endian length, then its bytes)", nm, j, rb->len, (long long)el);
            bytes[k] = rb->len;
            continue;
        }
        if (raw) {
            if (total) return tb_ks_fail(e, 400, "input '%s' has contents, but the request sends raw_input_contents", nm);
            if (m->raw_input_contents[j].len != bytes[k])
                return tb_ks_fail(e, 400, "input '%s': raw_input_contents[%zu] has %zu bytes; its shape and %s need %zu", nm,
                            j, m->raw_input_contents[j].len, it->datatype, bytes[k]);
            continue;
        }
        int f = field_of(t);
        if (f < 0 && el > 0)
            return tb_ks_fail(e, 400, "input '%s': %s data has no typed contents; send it in raw_input_contents", nm,
                        it->datatype);
        if (f >= 0 && total != cnt[f])
            return tb_ks_fail(e, 400, "input '%s': %s data goes in contents.%s", nm, it->datatype, k_field_names[f]);
        if (total != (size_t)el)
            return tb_ks_fail(e, 400, "input '%s' has %zu values; its shape needs %lld", nm, total, (long long)el);
        if (is_bytes) {
            size_t sz = 0;
            for (int64_t i = 0; i < el; i++) {
                size_t l = it->contents->bytes_contents[i].len;
                if (l > TB_KS_MAX_ELEM_BYTES)
                    return tb_ks_fail(e, 400, "input '%s': a BYTES element is longer than %u bytes", nm,
                                      TB_KS_MAX_ELEM_BYTES);
                if (l > SIZE_MAX / 4 - sz - 4) return tb_ks_fail(e, 400, "input '%s' is too large", nm);
                sz += 4 + l;
            }
            bytes[k] = sz;
        }
    }
    for (int k = 0; k < n_in; k++)
        if (!seen[k] && !(k < 64 && (optional >> k & 1))) return tb_ks_fail(e, 400, "input '%s' is missing", in[k].name);
    if (m->n_outputs > TB_KS_MAX_IO || (int)m->n_outputs > n_out)
        return tb_ks_fail(e, 400, "'outputs' lists %zu tensors; the model has %d outputs", m->n_outputs, n_out);
    for (size_t j = 0; j < m->n_outputs; j++) {
        const char *nm = m->outputs[j]->name;
        int k = find_io(out, n_out, nm);
        if (k < 0) return tb_ks_fail(e, 400, "unknown output '%s'", nm);
        for (int i = 0; i < r->n_outputs; i++)
            if (r->outputs[i] == k) return tb_ks_fail(e, 400, "output '%s' is requested twice", nm);
        r->outputs[r->n_outputs] = k;
        r->binary[r->n_outputs++] = 1;
    }
    /* one buffer for all inputs, each at a 64-byte boundary */
    size_t off[TB_KS_MAX_IO], total = 0;
    for (int k = 0; k < n_in; k++) {
        off[k] = total;
        if (bytes[k] > SIZE_MAX / 4 - total) return tb_ks_fail(e, 400, "the inputs are too large");
        total += (bytes[k] + ALIGN - 1) / ALIGN * ALIGN;
    }
    r->in_bytes = total;
    r->buf = aligned_alloc(ALIGN, total ? total : ALIGN);
    if (!r->buf) return tb_ks_fail(e, 500, "out of memory for %zu bytes of inputs", total);
    r->n_inputs = n_in;
    for (int k = 0; k < n_in; k++) {
        tb_tensor *x = &r->inputs[k];
        r->given[k] = seen[k];
        r->in_size[k] = bytes[k];
        if (!seen[k]) { /* an optional input left out: zeroed, data NULL */
            memset(x, 0, sizeof *x);
            continue;
        }
        x->data = (char *)r->buf + off[k];
        const Inference__ModelInferRequest__InferInputTensor *it = m->inputs[src[k]];
        int st = 200;
        if (!raw && x->dtype == TB_KS_BYTES) {
            char *at = x->data;
            for (int64_t i = 0; i < elems[k]; i++) {
                const ProtobufCBinaryData *bd = &it->contents->bytes_contents[i];
                uint32_t l = (uint32_t)bd->len;
                memcpy(at, &l, 4); /* little-endian host (checked above) */
                if (l) memcpy(at + 4, bd->data, l);
                at += 4 + l;
            }
        } else if (raw) {
            if (bytes[k]) memcpy(x->data, m->raw_input_contents[src[k]].data, bytes[k]);
            if (x->dtype == TB_BOOL)
                for (size_t i = 0; i < bytes[k] && st == 200; i++)
                    if (((uint8_t *)x->data)[i] > 1) st = tb_ks_fail(e, 400, "input '%s': BOOL bytes must be 0 or 1", it->name);
        } else if (elems[k] > 0) {
            st = copy_contents(it->name, x->dtype, it->contents, elems[k], x->data, e);
        }
        if (st != 200) {
            tb_ks_request_free(r);
            return st;
        }
    }
    int st = params_json(m, r, e);
    if (st != 200) tb_ks_request_free(r);
    return st;
}

static int pack(const ProtobufCMessage *msg, void **out, size_t *n, tb_ks_error *e) {
    size_t sz = protobuf_c_message_get_packed_size(msg);
    void *p = malloc(sz ? sz : 1);
    if (!p) return tb_ks_fail(e, 500, "out of memory for a %zu-byte response", sz);
    *n = protobuf_c_message_pack(msg, p);
    *out = p;
    return 200;
}

int tb_ks_grpc_encode_infer(const char *model, const char *version, const tb_ks_request *r, const tb_io_info *out,
                            const tb_tensor *outputs, int n_out, void **msg, size_t *n, tb_ks_error *e) {
    *msg = NULL;
    *n = 0;
    e->status = 200;
    e->msg[0] = 0;
    if (n_out > TB_KS_MAX_IO) return tb_ks_fail(e, 500, "the model has too many outputs");
    int sel[TB_KS_MAX_IO], ns = 0;
    if (r->n_outputs == 0)
        for (int k = 0; k < n_out; k++) sel[ns++] = k;
    else
        for (int i = 0; i < r->n_outputs; i++) sel[ns++] = r->outputs[i];
    Inference__ModelInferResponse__InferOutputTensor ot[TB_KS_MAX_IO], *otp[TB_KS_MAX_IO];
    ProtobufCBinaryData raw[TB_KS_MAX_IO];
    for (int i = 0; i < ns; i++) {
        const tb_tensor *t = &outputs[sel[i]];
        const char *dt = tb_ks_dtype_name(t->dtype);
        int64_t el = 1;
        for (int d = 0; d < t->rank; d++) el *= t->dims[d];
        if (!dt) return tb_ks_fail(e, 500, "output '%s' cannot be sent (datatype %s)", out[sel[i]].name, tb_dtype_name(t->dtype));
        inference__model_infer_response__infer_output_tensor__init(&ot[i]);
        ot[i].name = (char *)out[sel[i]].name;
        ot[i].datatype = (char *)dt;
        ot[i].n_shape = (size_t)t->rank;
        ot[i].shape = (int64_t *)t->dims;
        otp[i] = &ot[i];
        raw[i].len = (size_t)el * tb_ks_dtype_size(t->dtype);
        if (t->dtype == TB_KS_BYTES && !tb_ks_bytes_size(t->data, SIZE_MAX / 2, el, &raw[i].len))
            return tb_ks_fail(e, 500, "output '%s' is not serialized BYTES", out[sel[i]].name);
        raw[i].data = t->data;
    }
    Inference__ModelInferResponse resp;
    inference__model_infer_response__init(&resp);
    resp.model_name = (char *)model;
    resp.model_version = (char *)version;
    resp.id = (char *)r->id;
    resp.n_outputs = (size_t)ns;
    resp.outputs = otp;
    resp.n_raw_output_contents = (size_t)ns;
    resp.raw_output_contents = raw;
    return pack(&resp.base, msg, n, e);
}

/* ================================================================ the gRPC library */

/* X(name, return type, parameters): every function of libgrpc (and libgpr
 * behind it) the service calls */
#define TB_GRPC_FUNCS(X)                                                                                       \
    X(grpc_init, void, (void))                                                                                 \
    X(grpc_shutdown, void, (void))                                                                             \
    X(grpc_server_create, grpc_server *, (const grpc_channel_args *, void *))                                  \
    X(grpc_server_register_completion_queue, void, (grpc_server *, grpc_completion_queue *, void *))           \
    X(grpc_insecure_server_credentials_create, grpc_server_credentials *, (void))                              \
    X(grpc_server_credentials_release, void, (grpc_server_credentials *))                                      \
    X(grpc_server_add_http2_port, int, (grpc_server *, const char *, grpc_server_credentials *))               \
    X(grpc_server_start, void, (grpc_server *))                                                                \
    X(grpc_server_shutdown_and_notify, void, (grpc_server *, grpc_completion_queue *, void *))                 \
    X(grpc_server_cancel_all_calls, void, (grpc_server *))                                                     \
    X(grpc_server_destroy, void, (grpc_server *))                                                              \
    X(grpc_server_request_call, grpc_call_error,                                                               \
      (grpc_server *, grpc_call **, grpc_call_details *, grpc_metadata_array *, grpc_completion_queue *,       \
       grpc_completion_queue *, void *))                                                                       \
    X(grpc_completion_queue_create_for_next, grpc_completion_queue *, (void *))                                \
    X(grpc_completion_queue_next, grpc_event, (grpc_completion_queue *, gpr_timespec, void *))                 \
    X(grpc_completion_queue_shutdown, void, (grpc_completion_queue *))                                         \
    X(grpc_completion_queue_destroy, void, (grpc_completion_queue *))                                          \
    X(grpc_call_start_batch, grpc_call_error, (grpc_call *, const grpc_op *, size_t, void *, void *))          \
    X(grpc_call_unref, void, (grpc_call *))                                                                    \
    X(grpc_call_cancel, grpc_call_error, (grpc_call *, void *))                                                \
    X(grpc_server_register_method, void *,                                                                     \
      (grpc_server *, const char *, const char *, grpc_server_register_method_payload_handling, uint32_t))    \
    X(grpc_server_request_registered_call, grpc_call_error,                                                    \
      (grpc_server *, void *, grpc_call **, gpr_timespec *, grpc_metadata_array *, grpc_byte_buffer **,        \
       grpc_completion_queue *, grpc_completion_queue *, void *))                                              \
    X(grpc_slice_from_copied_buffer, grpc_slice, (const char *, size_t))                                       \
    X(grpc_call_details_init, void, (grpc_call_details *))                                                     \
    X(grpc_call_details_destroy, void, (grpc_call_details *))                                                  \
    X(grpc_metadata_array_init, void, (grpc_metadata_array *))                                                 \
    X(grpc_metadata_array_destroy, void, (grpc_metadata_array *))                                              \
    X(grpc_byte_buffer_reader_init, int, (grpc_byte_buffer_reader *, grpc_byte_buffer *))                      \
    X(grpc_byte_buffer_reader_readall, grpc_slice, (grpc_byte_buffer_reader *))                                \
    X(grpc_byte_buffer_reader_destroy, void, (grpc_byte_buffer_reader *))                                      \
    X(grpc_byte_buffer_destroy, void, (grpc_byte_buffer *))                                                    \
    X(grpc_raw_byte_buffer_create, grpc_byte_buffer *, (grpc_slice *, size_t))                                 \
    X(grpc_slice_new, grpc_slice, (void *, size_t, void (*)(void *)))                                          \
    X(grpc_slice_from_copied_string, grpc_slice, (const char *))                                               \
    X(grpc_slice_unref, void, (grpc_slice))                                                                    \
    X(gpr_now, gpr_timespec, (gpr_clock_type))                                                                 \
    X(gpr_inf_future, gpr_timespec, (gpr_clock_type))                                                          \
    X(gpr_inf_past, gpr_timespec, (gpr_clock_type))                                                            \
    X(gpr_convert_clock_type, gpr_timespec, (gpr_timespec, gpr_clock_type))

static struct {
    pthread_once_t once;
    int ok;
    char err[512];
#define X(name, ret, params) ret(*name) params;
    TB_GRPC_FUNCS(X)
#undef X
} G = {.once = PTHREAD_ONCE_INIT};

static void grpc_lib_load(void) {
    const char *names[] = {"libgrpc.so.29", "libgrpc.so", NULL};
    char why[400];
    void *h = tb_dl_open_first(names, why, sizeof why);
    if (!h) {
        snprintf(G.err, sizeof G.err, "the gRPC library cannot be loaded (Debian: libgrpc29): %s", why);
        return;
    }
#define X(name, ret, params)                                                                                   \
    if (!(*(void **)&G.name = dlsym(h, #name))) {                                                              \
        snprintf(G.err, sizeof G.err, "the gRPC library found lacks %s: it is not the one turbine was built with", \
                 #name);                                                                                       \
        return;                                                                                                \
    }
    TB_GRPC_FUNCS(X)
#undef X
    G.ok = 1;
}

/* ================================================================ the service */

typedef struct {
    struct tb_ks_grpc *g;
    grpc_completion_queue *cq;
    pthread_t th;
    int started;
} worker;

struct tb_ks_grpc {
    tb_ks_grpc_options o;
    tb_ks_grpc_host h;
    char api_key[256];
    char version[64];
    grpc_server *server;
    grpc_completion_queue *shut_cq; /* gets the shutdown notification */
    worker w[TB_KS_GRPC_WORKERS];
    atomic_int stopping;            /* tb_ks_grpc_stop has begun: idle streams end */
    void *stream_method;            /* ModelStreamInfer, registered */
    worker sw[TB_KS_GRPC_STREAMS];  /* its threads */
};

#define METHOD_PREFIX "/inference.GRPCInferenceService/"

static int slice_is(grpc_slice s, const char *lit) {
    size_t n = strlen(lit);
    return GRPC_SLICE_LENGTH(s) == n && !memcmp(GRPC_SLICE_START_PTR(s), lit, n);
}

/* 'authorization: Bearer KEY' among the call's metadata, compared in time
 * that does not depend on where the key differs (as the HTTP side). */
static int authorized(const struct tb_ks_grpc *g, const grpc_metadata_array *md) {
    if (!g->api_key[0]) return 1;
    for (size_t i = 0; i < md->count; i++) {
        if (!slice_is(md->metadata[i].key, "authorization")) continue;
        const char *v = (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
        size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
        if (n < 7 || strncasecmp(v, "Bearer ", 7) != 0) return 0;
        v += 7;
        n -= 7;
        size_t b = strlen(g->api_key);
        unsigned diff = (unsigned)(n ^ b);
        for (size_t k = 0; k < n && k < b; k++) diff |= (unsigned)(v[k] ^ g->api_key[k]);
        return diff == 0;
    }
    return 0;
}

/* Microseconds until the call's deadline; -1 when it has none. */
static int64_t deadline_us(gpr_timespec d) {
    if (d.tv_sec >= INT64_MAX / 4) return -1;
    gpr_timespec m = G.gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC), now = G.gpr_now(GPR_CLOCK_MONOTONIC);
    int64_t us = (m.tv_sec - now.tv_sec) * 1000000 + (m.tv_nsec - now.tv_nsec) / 1000;
    return us > 0 ? us : 1;
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The answer to one call: status, and the message when OK. */
typedef struct {
    int http;            /* 200: OK */
    tb_ks_error err;
    void *msg;           /* malloc'd response message */
    size_t n;
} answer;

static void answer_pack(answer *a, const ProtobufCMessage *m) { a->http = pack(m, &a->msg, &a->n, &a->err); }

/* A ModelInferRequest's first steps: decoded into *q, its model found and
 * pinned into *m, its inputs checked into *rq. 200 (the caller ends with
 * model_done and tb_ks_request_free), else a->http and a->err set and
 * nothing held but *q (NULL when it did not decode; the caller frees it). */
static int infer_begin(struct tb_ks_grpc *g, const void *in, size_t n, uint64_t t0, tb_ks_grpc_request **q,
                       tb_ks_model_view *m, tb_ks_request *rq, answer *a) {
    memset(rq, 0, sizeof *rq);
    a->http = tb_ks_grpc_decode_infer(in, n, q, &a->err);
    if (a->http != 200) return a->http;
    a->http = g->h.model_find(g->h.ctx, (*q)->m->model_name, (*q)->m->model_version, 1, m, &a->err);
    if (a->http != 200) return a->http;
    a->http = tb_ks_grpc_request_check_opt(*q, m->in, m->n_in, m->optional, m->out, m->n_out, 0, rq, &a->err);
    if (a->http != 200) g->h.model_done(g->h.ctx, m, 0, mono_ns() - t0);
    return a->http;
}

/* A checked request of an engine (not an LLM) through its batcher: the
 * packed ModelInferResponse in a; releases rq and the model's pin. */
static void infer_run(struct tb_ks_grpc *g, const tb_ks_model_view *m, tb_ks_request *rq, int64_t deadline,
                      uint64_t t0, answer *a) {
    /* parameters["timeout"] when the model allows it, else the model's
     * default; the call's own deadline when sooner (past it gRPC has
     * cancelled the call: the engine need not run) */
    int64_t timeout_us = m->timeout_override && rq->timeout_us > 0 ? (int64_t)rq->timeout_us : 0;
    if (deadline > 0 && (timeout_us == 0 || deadline < timeout_us)) timeout_us = deadline;
    tb_tensor outs[TB_KS_MAX_IO];
    memset(outs, 0, sizeof outs);
    void *owned = NULL;
    tb_status ts = g->h.model_infer(g->h.ctx, m, rq->inputs, rq->n_inputs, timeout_us, outs, m->n_out, &owned);
    if (ts != TB_OK) {
        tb_ks_request_free(rq);
        g->h.model_done(g->h.ctx, m, 0, mono_ns() - t0);
        /* as the HTTP side decides (server.c, v2_infer) */
        a->http = ts == TB_ERR_RANGE || ts == TB_ERR_INVALID_ARG ? 400
                  : ts == TB_ERR_QUEUE_FULL                      ? 429
                  : ts == TB_ERR_TIMEOUT                         ? 504
                                                                 : 500;
        snprintf(a->err.msg, sizeof a->err.msg, "inference failed: %s", tb_last_error());
        return;
    }
    a->http = tb_ks_grpc_encode_infer(m->name, m->version, rq, m->out, outs, m->n_out, &a->msg, &a->n, &a->err);
    tb_ks_request_free(rq);
    free(owned);
    g->h.model_done(g->h.ctx, m, a->http == 200, mono_ns() - t0);
}

static void do_model_infer(struct tb_ks_grpc *g, const void *in, size_t n, int64_t deadline, answer *a) {
    uint64_t t0 = mono_ns();
    tb_ks_grpc_request *q = NULL;
    tb_ks_model_view m;
    tb_ks_request rq;
    int st = infer_begin(g, in, n, t0, &q, &m, &rq, a);
    tb_ks_grpc_request_free(q);
    if (st != 200) return;
    if (!m.is_llm) {
        infer_run(g, &m, &rq, deadline, t0, a);
        return;
    }
    tb_tensor o;
    void *owned = NULL;
    a->http = g->h.llm_infer ? g->h.llm_infer(g->h.ctx, &m, &rq, &o, &owned, &a->err)
                             : tb_ks_fail(&a->err, 400, "model '%s' is served by the OpenAI API", m.name);
    if (a->http == 0) a->http = tb_ks_fail(&a->err, 500, "the generation was cancelled");
    if (a->http == 200)
        a->http = tb_ks_grpc_encode_infer(m.name, m.version, &rq, m.out, &o, 1, &a->msg, &a->n, &a->err);
    tb_ks_request_free(&rq);
    free(owned);
    g->h.model_done(g->h.ctx, &m, a->http == 200, mono_ns() - t0);
}

static void tensor_meta(Inference__ModelMetadataResponse__TensorMetadata *t, int64_t *shape, const tb_io_info *io) {
    inference__model_metadata_response__tensor_metadata__init(t);
    t->name = (char *)io->name;
    const char *dt = tb_ks_dtype_name(io->dtype);
    t->datatype = (char *)(dt ? dt : tb_dtype_name(io->dtype));
    for (int d = 0; d < io->rank; d++) shape[d] = io->min[d] == io->max[d] && io->min[d] >= 0 ? io->min[d] : -1;
    t->n_shape = (size_t)io->rank;
    t->shape = shape;
}

static void duration(Inference__StatisticDuration *d, uint64_t count, uint64_t ns) {
    inference__statistic_duration__init(d);
    d->count = count;
    d->ns = ns;
}

/* ModelStatistics: every version of the name asked for (every model when
 * the name is empty) with the counters of GET .../stats. */
static void do_model_stats(struct tb_ks_grpc *g, const void *in, size_t n, answer *a) {
    enum { CAP = 64 };
    Inference__ModelStatisticsRequest *q = inference__model_statistics_request__unpack(NULL, n, in);
    if (!q) {
        a->http = tb_ks_fail(&a->err, 400, "the message is not a ModelStatisticsRequest");
        return;
    }
    tb_ks_model_stats *st = calloc(CAP, sizeof *st);
    int k = st ? g->h.model_stats(g->h.ctx, q->name, q->version, st, CAP, &a->err)
               : -tb_ks_fail(&a->err, 500, "out of memory");
    inference__model_statistics_request__free_unpacked(q, NULL);
    if (k < 0) {
        a->http = -k;
        free(st);
        return;
    }
    Inference__ModelStatistics ms[CAP], *msp[CAP];
    Inference__InferStatistics is[CAP];
    Inference__StatisticDuration d[CAP][6];
    for (int i = 0; i < k; i++) {
        inference__model_statistics__init(&ms[i]);
        inference__infer_statistics__init(&is[i]);
        ms[i].name = st[i].name;
        ms[i].version = st[i].version;
        ms[i].last_inference = st[i].last_ms;
        ms[i].inference_count = st[i].inference_count;
        ms[i].execution_count = st[i].execution_count;
        duration(&d[i][0], st[i].success_n, st[i].success_ns);
        duration(&d[i][1], st[i].fail_n, st[i].fail_ns);
        duration(&d[i][2], st[i].queue_n, st[i].queue_ns);
        duration(&d[i][3], 0, 0); /* input staging is part of compute_infer here */
        duration(&d[i][4], st[i].compute_n, st[i].compute_ns);
        duration(&d[i][5], 0, 0); /* output copies likewise */
        is[i].success = &d[i][0];
        is[i].fail = &d[i][1];
        is[i].queue = &d[i][2];
        is[i].compute_input = &d[i][3];
        is[i].compute_infer = &d[i][4];
        is[i].compute_output = &d[i][5];
        ms[i].inference_stats = &is[i];
        msp[i] = &ms[i];
    }
    Inference__ModelStatisticsResponse r;
    inference__model_statistics_response__init(&r);
    r.n_model_stats = (size_t)k;
    r.model_stats = msp;
    answer_pack(a, &r.base);
    free(st);
}

/* One call's request message `in` (n bytes) to its answer. */
static void dispatch(struct tb_ks_grpc *g, grpc_slice method, const grpc_metadata_array *md, int64_t deadline,
                     const void *in, size_t n, answer *a) {
    size_t pl = strlen(METHOD_PREFIX);
    const char *mp = (const char *)GRPC_SLICE_START_PTR(method);
    size_t ml = GRPC_SLICE_LENGTH(method);
    char name[64] = "";
    if (ml > pl && ml - pl < sizeof name && !memcmp(mp, METHOD_PREFIX, pl)) {
        memcpy(name, mp + pl, ml - pl);
        name[ml - pl] = 0;
    }
    if (!strcmp(name, "ServerLive") || !strcmp(name, "ServerReady")) {
        /* the request is empty; anything it holds is skipped as unknown fields */
        int live = !strcmp(name, "ServerLive");
        if (live) {
            Inference__ServerLiveResponse r;
            inference__server_live_response__init(&r);
            r.live = 1;
            answer_pack(a, &r.base);
        } else {
            Inference__ServerReadyResponse r;
            inference__server_ready_response__init(&r);
            r.ready = g->h.server_ready(g->h.ctx) ? 1 : 0;
            answer_pack(a, &r.base);
        }
        return;
    }
    int known = !strcmp(name, "ModelReady") || !strcmp(name, "ServerMetadata") || !strcmp(name, "ModelMetadata") ||
                !strcmp(name, "ModelInfer") || !strcmp(name, "ModelStatistics");
    if (!known) {
        a->http = tb_ks_fail(&a->err, 501, "this server has no method %.*s", (int)(ml < 200 ? ml : 200), mp);
        return;
    }
    if (!authorized(g, md)) {
        a->http = tb_ks_fail(&a->err, 401, "a valid API key is required (metadata 'authorization: Bearer KEY')");
        return;
    }
    if (!strcmp(name, "ModelInfer")) {
        do_model_infer(g, in, n, deadline, a);
        return;
    }
    if (!strcmp(name, "ModelStatistics")) {
        do_model_stats(g, in, n, a);
        return;
    }
    if (!strcmp(name, "ServerMetadata")) {
        Inference__ServerMetadataResponse r;
        inference__server_metadata_response__init(&r);
        char *ext[] = {"binary_tensor_data", "statistics"}; /* as GET /v2 lists them */
        r.name = "turbine";
        r.version = g->version;
        r.n_extensions = 2;
        r.extensions = ext;
        answer_pack(a, &r.base);
        return;
    }
    /* ModelReady and ModelMetadata: {name, version} */
    Inference__ModelReadyRequest *q = inference__model_ready_request__unpack(NULL, n, in);
    if (!q) {
        a->http = tb_ks_fail(&a->err, 400, "the message is not a %sRequest", name);
        return;
    }
    tb_ks_model_view m;
    a->http = g->h.model_find(g->h.ctx, q->name, q->version, 0, &m, &a->err);
    inference__model_ready_request__free_unpacked(q, NULL);
    if (a->http != 200) return;
    if (!strcmp(name, "ModelReady")) {
        Inference__ModelReadyResponse r;
        inference__model_ready_response__init(&r);
        r.ready = m.ready && g->h.server_ready(g->h.ctx);
        answer_pack(a, &r.base);
        return;
    }
    Inference__ModelMetadataResponse r;
    inference__model_metadata_response__init(&r);
    Inference__ModelMetadataResponse__TensorMetadata ti[TB_KS_MAX_IO], to[TB_KS_MAX_IO], *tip[TB_KS_MAX_IO],
        *top[TB_KS_MAX_IO];
    int64_t si[TB_KS_MAX_IO][TB_TENSOR_MAX_RANK], so[TB_KS_MAX_IO][TB_TENSOR_MAX_RANK];
    int ni = m.n_in < TB_KS_MAX_IO ? m.n_in : TB_KS_MAX_IO, no = m.n_out < TB_KS_MAX_IO ? m.n_out : TB_KS_MAX_IO;
    for (int i = 0; i < ni; i++) tensor_meta(&ti[i], si[i], &m.in[i]), tip[i] = &ti[i];
    for (int i = 0; i < no; i++) tensor_meta(&to[i], so[i], &m.out[i]), top[i] = &to[i];
    char *versions[1] = {(char *)m.version};
    r.name = (char *)m.name;
    r.n_versions = 1;
    r.versions = versions;
    r.platform = "turbine";
    r.n_inputs = (size_t)ni;
    r.inputs = tip;
    r.n_outputs = (size_t)no;
    r.outputs = top;
    answer_pack(a, &r.base);
}

/* Waits for the one operation a worker has in flight on its queue. */
static int wait_op(grpc_completion_queue *cq) {
    grpc_event ev = G.grpc_completion_queue_next(cq, G.gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* Serves one call: reads its message, answers it, and waits for the client
 * to have it (or to be gone). */
static void serve_call(struct tb_ks_grpc *g, grpc_completion_queue *cq, grpc_call *call, const grpc_call_details *d,
                       const grpc_metadata_array *md) {
    grpc_byte_buffer *payload = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &payload;
    if (G.grpc_call_start_batch(call, &op, 1, &op, NULL) != GRPC_CALL_OK || !wait_op(cq)) {
        if (payload) G.grpc_byte_buffer_destroy(payload);
        return;
    }
    answer a;
    memset(&a, 0, sizeof a);
    if (!payload) {
        a.http = tb_ks_fail(&a.err, 400, "the call sent no request message");
    } else {
        grpc_byte_buffer_reader rd;
        if (!G.grpc_byte_buffer_reader_init(&rd, payload)) {
            a.http = tb_ks_fail(&a.err, 400, "the request message cannot be read (compression?)");
        } else {
            grpc_slice s = G.grpc_byte_buffer_reader_readall(&rd);
            G.grpc_byte_buffer_reader_destroy(&rd);
            dispatch(g, d->method, md, deadline_us(d->deadline), GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), &a);
            G.grpc_slice_unref(s);
        }
        G.grpc_byte_buffer_destroy(payload);
    }
    grpc_byte_buffer *reply = NULL;
    if (a.http == 200) {
        grpc_slice rs = G.grpc_slice_new(a.msg, a.n, free); /* the slice frees the message */
        reply = G.grpc_raw_byte_buffer_create(&rs, 1);
        G.grpc_slice_unref(rs);
        a.msg = NULL;
    }
    free(a.msg);
    grpc_slice details = G.grpc_slice_from_copied_string(a.http == 200 ? "" : a.err.msg);
    int cancelled = 0;
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t k = 0;
    ops[k++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (reply) {
        ops[k].op = GRPC_OP_SEND_MESSAGE;
        ops[k++].data.send_message.send_message = reply;
    }
    ops[k].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[k].data.send_status_from_server.status = (grpc_status_code)tb_ks_grpc_code(a.http);
    ops[k++].data.send_status_from_server.status_details = &details;
    ops[k].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[k++].data.recv_close_on_server.cancelled = &cancelled;
    if (G.grpc_call_start_batch(call, ops, k, ops, NULL) == GRPC_CALL_OK) wait_op(cq);
    G.grpc_slice_unref(details);
    if (reply) G.grpc_byte_buffer_destroy(reply);
}

/* ================================================================ ModelStreamInfer */

/* A stream is a registered method with threads of its own (g->sw), one
 * stream at a time each, for its whole life, so that streams held open
 * never take the workers of the unary calls. Its thread runs a loop over
 * the call's completion queue: a RECV_CLOSE_ON_SERVER outstanding from the
 * start (it completes at once when the client cancels), one RECV_MESSAGE
 * (one request read ahead of the one being answered), and one
 * SEND_MESSAGE at a time. Requests are answered in order. An engine's
 * request runs through the batcher on this thread; an LLM's generation is
 * read between polls of the queue, its text gathered while a send is in
 * flight and sent as one piece when it is done, so a slow reader gets
 * fewer, longer pieces rather than a growing queue. */

enum { TAG_RECV = 1, TAG_SEND, TAG_CLOSE, TAG_STATUS };
#define TAG(k) ((void *)(intptr_t)(k))

typedef struct {
    struct tb_ks_grpc *g;
    grpc_completion_queue *cq;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_byte_buffer *in;           /* RECV_MESSAGE's target */
    grpc_byte_buffer *next;         /* a request read, waiting for the one before it to be answered */
    grpc_byte_buffer *out;          /* the message being sent */
    int recv_busy, send_busy, close_busy, status_busy;
    int close_cancelled;            /* RECV_CLOSE_ON_SERVER's result */
    int half_closed;                /* the client has sent its last request */
    int cancelled;                  /* the client is gone (or the server cancelled the call) */
    int md_sent;                    /* initial metadata went with the first message */
    /* the LLM request in progress (gen non-NULL) */
    void *gen;
    int gen_done;                   /* its end read: gen_st, gen_err */
    int gen_st;
    tb_ks_error gen_err;
    int chunked;                    /* parameters["stream"]: a response per piece */
    tb_ks_model_view m;             /* pinned until the request ends */
    char id[TB_KS_MAX_ID];
    uint64_t t0;
    char *text;                     /* 4-byte length, then the text not yet sent */
    size_t tn, tcap;
} stream;

static void stream_event(stream *s, const grpc_event *ev) {
    switch ((int)(intptr_t)ev->tag) {
    case TAG_RECV:
        s->recv_busy = 0;
        if (!ev->success) s->cancelled = 1;
        else if (!s->in) s->half_closed = 1;
        else s->next = s->in;
        s->in = NULL;
        break;
    case TAG_SEND:
        s->send_busy = 0;
        if (!ev->success) s->cancelled = 1;
        G.grpc_byte_buffer_destroy(s->out);
        s->out = NULL;
        break;
    case TAG_CLOSE:
        s->close_busy = 0;
        if (s->close_cancelled) s->cancelled = 1;
        break;
    case TAG_STATUS: s->status_busy = 0; break;
    default: break;
    }
}

/* Takes the events of s's queue: waits up to `wait` seconds for the first
 * (< 0: until one comes; 0: not at all), then takes those already there.
 * Not waiting is gpr_inf_past: gRPC rounds any other deadline up to its
 * next millisecond, which would cost each look at the queue up to 1 ms. */
static void stream_poll(stream *s, double wait) {
    gpr_timespec until = wait < 0 ? G.gpr_inf_future(GPR_CLOCK_MONOTONIC) : G.gpr_inf_past(GPR_CLOCK_MONOTONIC);
    if (wait > 0) {
        until = G.gpr_now(GPR_CLOCK_MONOTONIC);
        int64_t ns = until.tv_nsec + (int64_t)(wait * 1e9);
        until.tv_sec += ns / 1000000000;
        until.tv_nsec = (int32_t)(ns % 1000000000);
    }
    for (;;) {
        grpc_event ev = G.grpc_completion_queue_next(s->cq, until, NULL);
        if (ev.type != GRPC_OP_COMPLETE) return; /* timeout (the queue is shut down only after the threads end) */
        stream_event(s, &ev);
        until = G.gpr_inf_past(GPR_CLOCK_MONOTONIC);
    }
}

static void stream_recv(stream *s) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->in;
    if (G.grpc_call_start_batch(s->call, &op, 1, TAG(TAG_RECV), NULL) == GRPC_CALL_OK) s->recv_busy = 1;
    else s->cancelled = 1;
}

/* Sends `pre` (np bytes, copied) then `msg` (n bytes, malloc'd: taken). */
static void stream_send(stream *s, const void *pre, size_t np, void *msg, size_t n) {
    grpc_slice sl[2];
    size_t k = 0;
    if (np) sl[k++] = G.grpc_slice_from_copied_buffer(pre, np);
    sl[k++] = G.grpc_slice_new(msg, n, free); /* the slice frees the message */
    s->out = G.grpc_raw_byte_buffer_create(sl, k);
    for (size_t i = 0; i < k; i++) G.grpc_slice_unref(sl[i]);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t no = 0;
    if (!s->md_sent) ops[no++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[no].op = GRPC_OP_SEND_MESSAGE;
    ops[no++].data.send_message.send_message = s->out;
    if (G.grpc_call_start_batch(s->call, ops, no, TAG(TAG_SEND), NULL) == GRPC_CALL_OK) {
        s->send_busy = 1;
        s->md_sent = 1;
    } else {
        G.grpc_byte_buffer_destroy(s->out);
        s->out = NULL;
        s->cancelled = 1;
    }
}

/* A packed ModelInferResponse (taken) as the infer_response (field 2) of a
 * ModelStreamInferResponse: its key and length, then the message as it is. */
static void stream_send_infer(stream *s, void *msg, size_t n) {
    unsigned char pre[12];
    size_t np = 0;
    pre[np++] = 2 << 3 | 2; /* field 2, length-delimited */
    for (uint64_t v = n; ; v >>= 7) {
        pre[np++] = (unsigned char)(v & 0x7f) | (v >= 0x80 ? 0x80 : 0);
        if (v < 0x80) break;
    }
    stream_send(s, pre, np, msg, n);
}

/* An error_message for one request, with its model and id when known. */
static void stream_send_error(stream *s, const char *model, const char *version, const char *id, const char *msg) {
    Inference__ModelInferResponse ir;
    inference__model_infer_response__init(&ir);
    ir.model_name = (char *)model;
    ir.model_version = (char *)version;
    ir.id = (char *)id;
    Inference__ModelStreamInferResponse r;
    inference__model_stream_infer_response__init(&r);
    r.error_message = (char *)(msg[0] ? msg : "the request failed");
    r.infer_response = &ir;
    void *p = NULL;
    size_t n = 0;
    tb_ks_error e;
    if (pack(&r.base, &p, &n, &e) == 200) stream_send(s, NULL, 0, p, n);
    else s->cancelled = 1; /* out of memory: the stream cannot go on as it should */
}

/* The text gathered (s->text) as a response of text_output, one BYTES
 * element, with parameters["triton_final_response"]. */
static void stream_send_text(stream *s, int final) {
    uint32_t len = (uint32_t)(s->tn - 4);
    memcpy(s->text, &len, 4); /* little-endian host (checked above) */
    Inference__ModelInferResponse__InferOutputTensor ot, *otp = &ot;
    inference__model_infer_response__infer_output_tensor__init(&ot);
    int64_t shape[1] = {1};
    ot.name = (char *)(s->m.n_out > 0 ? s->m.out[0].name : "text_output");
    ot.datatype = "BYTES";
    ot.n_shape = 1;
    ot.shape = shape;
    ProtobufCBinaryData raw = {.len = s->tn, .data = (uint8_t *)s->text};
    Inference__InferParameter fin;
    inference__infer_parameter__init(&fin);
    fin.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    fin.bool_param = final ? 1 : 0;
    Inference__ModelInferResponse__ParametersEntry pe, *pep = &pe;
    inference__model_infer_response__parameters_entry__init(&pe);
    pe.key = "triton_final_response";
    pe.value = &fin;
    Inference__ModelInferResponse r;
    inference__model_infer_response__init(&r);
    r.model_name = (char *)s->m.name;
    r.model_version = (char *)s->m.version;
    r.id = s->id;
    r.n_parameters = 1;
    r.parameters = &pep;
    r.n_outputs = 1;
    r.outputs = &otp;
    r.n_raw_output_contents = 1;
    r.raw_output_contents = &raw;
    void *p = NULL;
    size_t n = 0;
    tb_ks_error e;
    if (pack(&r.base, &p, &n, &e) == 200) stream_send_infer(s, p, n);
    else s->cancelled = 1;
    s->tn = 4;
}

/* parameters["stream"]: 1 / 0, or -1 when it is not a bool_param. */
static int stream_param(const Inference__ModelInferRequest *m) {
    for (size_t i = 0; i < m->n_parameters; i++) {
        const Inference__ModelInferRequest__ParametersEntry *p = m->parameters[i];
        if (strcmp(p->key, "stream") != 0) continue;
        if (!p->value || p->value->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
            return -1;
        return p->value->bool_param ? 1 : 0;
    }
    return 0;
}

static void stream_gen_end(stream *s, int ok) {
    s->g->h.llm_stream_end(s->g->h.ctx, s->gen);
    s->gen = NULL;
    s->g->h.model_done(s->g->h.ctx, &s->m, ok, mono_ns() - s->t0);
}

/* Answers one request message: an engine's at once, an LLM's started. */
static void stream_request(stream *s, grpc_byte_buffer *bb) {
    struct tb_ks_grpc *g = s->g;
    uint64_t t0 = mono_ns();
    answer a;
    memset(&a, 0, sizeof a);
    grpc_byte_buffer_reader rd;
    if (!G.grpc_byte_buffer_reader_init(&rd, bb)) {
        G.grpc_byte_buffer_destroy(bb);
        stream_send_error(s, "", "", "", "the request message cannot be read (compression?)");
        return;
    }
    grpc_slice sl = G.grpc_byte_buffer_reader_readall(&rd);
    G.grpc_byte_buffer_reader_destroy(&rd);
    G.grpc_byte_buffer_destroy(bb);
    tb_ks_grpc_request *q = NULL;
    tb_ks_model_view m;
    tb_ks_request rq;
    int st = infer_begin(g, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl), t0, &q, &m, &rq, &a);
    G.grpc_slice_unref(sl);
    char id[TB_KS_MAX_ID] = "";
    if (q) snprintf(id, sizeof id, "%s", q->m->id);
    if (st != 200) {
        stream_send_error(s, q ? q->m->model_name : "", q ? q->m->model_version : "", id, a.err.msg);
        tb_ks_grpc_request_free(q);
        return;
    }
    int chunked = stream_param(q->m);
    tb_ks_grpc_request_free(q);
    if (!m.is_llm) {
        infer_run(g, &m, &rq, deadline_us(s->deadline), t0, &a);
        if (a.http == 200) stream_send_infer(s, a.msg, a.n);
        else stream_send_error(s, m.name, m.version, id, a.err.msg);
        return;
    }
    void *gen = NULL;
    if (!s->text && (s->text = malloc(256))) s->tcap = 256; /* the stream's text buffer, kept for its life */
    if (chunked < 0)
        a.http = tb_ks_fail(&a.err, 400, "parameters[\"stream\"] must be a bool_param");
    else if (!s->text)
        a.http = tb_ks_fail(&a.err, 500, "out of memory");
    else if (!g->h.llm_stream_start)
        a.http = tb_ks_fail(&a.err, 400, "model '%s' is served by the OpenAI API", m.name);
    else
        a.http = g->h.llm_stream_start(g->h.ctx, &m, &rq, &gen, &a.err);
    tb_ks_request_free(&rq);
    if (a.http != 200) {
        g->h.model_done(g->h.ctx, &m, 0, mono_ns() - t0);
        stream_send_error(s, m.name, m.version, id, a.err.msg);
        return;
    }
    s->gen = gen;
    s->gen_done = 0;
    s->chunked = chunked;
    s->m = m;
    s->t0 = t0;
    s->tn = 4;
    memcpy(s->id, id, sizeof id);
}

/* Reads what the generation has (waiting up to `wait` s) and sends what is
 * due: a piece when chunked and no send is in flight, the rest (or the
 * error) at its end, which also ends the request. */
static void stream_gen_step(stream *s, double wait) {
    struct tb_ks_grpc *g = s->g;
    if (!s->gen_done) {
        const char *t = NULL;
        size_t n = 0;
        s->gen_err.msg[0] = 0;
        int st = g->h.llm_stream_next(g->h.ctx, s->gen, wait, &t, &n, &s->gen_err);
        if (n && s->tn - 4 < TB_KS_MAX_ELEM_BYTES) {
            if (s->tn + n > s->tcap) {
                size_t cap = s->tcap;
                while (cap < s->tn + n) cap *= 2;
                char *p = realloc(s->text, cap);
                if (!p) {
                    st = tb_ks_fail(&s->gen_err, 500, "out of memory for the generated text");
                } else {
                    s->text = p;
                    s->tcap = cap;
                }
            }
            if (s->tn + n <= s->tcap) {
                memcpy(s->text + s->tn, t, n);
                s->tn += n;
            }
        }
        if (st != 0) {
            s->gen_done = 1;
            s->gen_st = st;
        }
    }
    if (s->send_busy) return;
    if (s->gen_done) {
        if (s->gen_st == 200) stream_send_text(s, 1);
        else stream_send_error(s, s->m.name, s->m.version, s->id, s->gen_err.msg);
        stream_gen_end(s, s->gen_st == 200);
    } else if (s->chunked && s->tn > 4) {
        stream_send_text(s, 0);
    }
}

static void serve_stream(struct tb_ks_grpc *g, grpc_completion_queue *cq, grpc_call *call, gpr_timespec deadline,
                         const grpc_metadata_array *md) {
    stream s;
    memset(&s, 0, sizeof s);
    s.g = g;
    s.cq = cq;
    s.call = call;
    s.deadline = deadline;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &s.close_cancelled;
    if (G.grpc_call_start_batch(call, &op, 1, TAG(TAG_CLOSE), NULL) == GRPC_CALL_OK) s.close_busy = 1;
    else s.cancelled = 1;
    int code = 0;
    const char *details = "";
    if (!authorized(g, md)) {
        code = tb_ks_grpc_code(401);
        details = "a valid API key is required (metadata 'authorization: Bearer KEY')";
        s.half_closed = 1; /* no request is read */
    }
    for (;;) {
        if (s.cancelled) {
            if (s.gen) stream_gen_end(&s, 0);
            break;
        }
        if (!s.half_closed && !s.recv_busy && !s.next) stream_recv(&s);
        if (s.gen) {
            /* short waits while a send is in flight: its end is seen on the queue */
            stream_gen_step(&s, s.send_busy ? 0.002 : 0.02);
            stream_poll(&s, s.gen && s.gen_done ? -1 : 0);
            continue;
        }
        if (s.next && !s.send_busy) {
            grpc_byte_buffer *bb = s.next;
            s.next = NULL;
            stream_request(&s, bb);
            continue;
        }
        if (s.half_closed && !s.next && !s.send_busy) break; /* every request answered */
        if (atomic_load(&g->stopping) && !s.next && !s.send_busy) { /* idle while the server stops */
            code = tb_ks_grpc_code(503);
            details = "the server is stopping";
            break;
        }
        stream_poll(&s, 0.25);
    }
    if (s.next) G.grpc_byte_buffer_destroy(s.next);
    s.next = NULL;
    grpc_slice det = G.grpc_slice_from_copied_string(details);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t k = 0;
    if (!s.md_sent) ops[k++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[k].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[k].data.send_status_from_server.status = (grpc_status_code)code;
    ops[k++].data.send_status_from_server.status_details = &det;
    /* a call that cannot end with a status (the client gone, out of memory)
     * is cancelled: that completes what it has outstanding */
    if (!s.cancelled && G.grpc_call_start_batch(call, ops, k, TAG(TAG_STATUS), NULL) == GRPC_CALL_OK)
        s.status_busy = 1;
    else
        G.grpc_call_cancel(call, NULL);
    /* every operation started must complete before the queue serves another call */
    while (s.recv_busy || s.send_busy || s.close_busy || s.status_busy) stream_poll(&s, -1);
    G.grpc_slice_unref(det);
    if (s.next) G.grpc_byte_buffer_destroy(s.next);
    free(s.text);
}

static void *stream_main(void *p) {
    worker *w = p;
    for (;;) {
        grpc_call *call = NULL;
        gpr_timespec deadline;
        grpc_metadata_array md;
        G.grpc_metadata_array_init(&md);
        int got = G.grpc_server_request_registered_call(w->g->server, w->g->stream_method, &call, &deadline, &md,
                                                         NULL, w->cq, w->cq, w) == GRPC_CALL_OK &&
                  wait_op(w->cq);
        if (got) serve_stream(w->g, w->cq, call, deadline, &md);
        if (call) G.grpc_call_unref(call);
        G.grpc_metadata_array_destroy(&md);
        if (!got) break; /* the server is shutting down */
    }
    return NULL;
}

static void *worker_main(void *p) {
    worker *w = p;
    for (;;) {
        grpc_call *call = NULL;
        grpc_call_details d;
        grpc_metadata_array md;
        G.grpc_call_details_init(&d);
        G.grpc_metadata_array_init(&md);
        int got = G.grpc_server_request_call(w->g->server, &call, &d, &md, w->cq, w->cq, w) == GRPC_CALL_OK &&
                  wait_op(w->cq);
        if (got) serve_call(w->g, w->cq, call, &d, &md);
        if (call) G.grpc_call_unref(call);
        G.grpc_call_details_destroy(&d);
        G.grpc_metadata_array_destroy(&md);
        if (!got) break; /* the server is shutting down */
    }
    return NULL;
}

static void drain_destroy(grpc_completion_queue *cq) {
    if (!cq) return;
    G.grpc_completion_queue_shutdown(cq);
    while (G.grpc_completion_queue_next(cq, G.gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    G.grpc_completion_queue_destroy(cq);
}

tb_status tb_ks_grpc_start(const tb_ks_grpc_options *o, const tb_ks_grpc_host *h, tb_ks_grpc **out) {
    *out = NULL;
    pthread_once(&G.once, grpc_lib_load);
    if (!G.ok) return tb_errorf(TB_ERR_UNSUPPORTED, "--grpc-port: %s", G.err);
    if (o->api_key && strlen(o->api_key) >= 256) return tb_errorf(TB_ERR_INVALID_ARG, "the API key is too long");
    struct tb_ks_grpc *g = calloc(1, sizeof *g);
    if (!g) return tb_errorf(TB_ERR_OOM, "out of memory");
    g->o = *o;
    g->h = *h;
    snprintf(g->api_key, sizeof g->api_key, "%s", o->api_key ? o->api_key : "");
    snprintf(g->version, sizeof g->version, "%s", o->version ? o->version : "");
    G.grpc_init();
    /* the request bound; and no SO_REUSEPORT, so that a port another
     * process holds is an error rather than a shared listener */
    grpc_arg args[2];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = o->max_message_bytes > INT_MAX ? INT_MAX : (int)o->max_message_bytes;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[1].value.integer = 0;
    grpc_channel_args ca = {2, args};
    g->server = G.grpc_server_create(&ca, NULL);
    g->shut_cq = G.grpc_completion_queue_create_for_next(NULL);
    G.grpc_server_register_completion_queue(g->server, g->shut_cq, NULL);
    for (int i = 0; i < TB_KS_GRPC_WORKERS; i++) {
        g->w[i].g = g;
        g->w[i].cq = G.grpc_completion_queue_create_for_next(NULL);
        G.grpc_server_register_completion_queue(g->server, g->w[i].cq, NULL);
    }
    for (int i = 0; i < TB_KS_GRPC_STREAMS; i++) {
        g->sw[i].g = g;
        g->sw[i].cq = G.grpc_completion_queue_create_for_next(NULL);
        G.grpc_server_register_completion_queue(g->server, g->sw[i].cq, NULL);
    }
    g->stream_method = G.grpc_server_register_method(g->server, METHOD_PREFIX "ModelStreamInfer", NULL,
                                                     GRPC_SRM_PAYLOAD_NONE, 0);
    char addr[320];
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, o->port);
    grpc_server_credentials *cr = G.grpc_insecure_server_credentials_create();
    int bound = G.grpc_server_add_http2_port(g->server, addr, cr);
    G.grpc_server_credentials_release(cr);
    if (bound <= 0) {
        G.grpc_server_destroy(g->server);
        drain_destroy(g->shut_cq);
        for (int i = 0; i < TB_KS_GRPC_WORKERS; i++) drain_destroy(g->w[i].cq);
        for (int i = 0; i < TB_KS_GRPC_STREAMS; i++) drain_destroy(g->sw[i].cq);
        G.grpc_shutdown();
        free(g);
        return tb_errorf(TB_ERR_IO, "cannot listen on %s for gRPC (the port is taken or the address is not this "
                         "machine's)", addr);
    }
    G.grpc_server_start(g->server);
    for (int i = 0; i < TB_KS_GRPC_WORKERS; i++)
        g->w[i].started = pthread_create(&g->w[i].th, NULL, worker_main, &g->w[i]) == 0;
    for (int i = 0; i < TB_KS_GRPC_STREAMS; i++)
        g->sw[i].started = pthread_create(&g->sw[i].th, NULL, stream_main, &g->sw[i]) == 0;
    *out = g;
    return TB_OK;
}

void tb_ks_grpc_stop(tb_ks_grpc *g, double grace_s) {
    if (!g) return;
    int tag;
    atomic_store(&g->stopping, 1);
    G.grpc_server_shutdown_and_notify(g->server, g->shut_cq, &tag);
    long long ms = grace_s > 0 ? (long long)(grace_s * 1000) : 0;
    gpr_timespec until = G.gpr_now(GPR_CLOCK_REALTIME);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (int32_t)((ms % 1000) * 1000000);
    if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
    grpc_event ev = G.grpc_completion_queue_next(g->shut_cq, until, NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
        G.grpc_server_cancel_all_calls(g->server); /* the calls still running past the grace */
        G.grpc_completion_queue_next(g->shut_cq, G.gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    for (int i = 0; i < TB_KS_GRPC_WORKERS; i++)
        if (g->w[i].started) pthread_join(g->w[i].th, NULL);
    for (int i = 0; i < TB_KS_GRPC_STREAMS; i++)
        if (g->sw[i].started) pthread_join(g->sw[i].th, NULL);
    G.grpc_server_destroy(g->server);
    drain_destroy(g->shut_cq);
    for (int i = 0; i < TB_KS_GRPC_WORKERS; i++) drain_destroy(g->w[i].cq);
    for (int i = 0; i < TB_KS_GRPC_STREAMS; i++) drain_destroy(g->sw[i].cq);
    G.grpc_shutdown();
    free(g);
}

#endif /* TB_HAVE_GRPC */

int tb_ks_grpc_request_check(const tb_ks_grpc_request *q, const tb_io_info *in, int n_in, const tb_io_info *out,
                             int n_out, size_t max_elems, tb_ks_request *r, tb_ks_error *err) {
    return tb_ks_grpc_request_check_opt(q, in, n_in, 0, out, n_out, max_elems, r, err);
}
