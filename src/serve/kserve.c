/* kserve.c — the KServe v2 wire format: routes, infer requests into checked
 * tb_tensors, responses and metadata out (see kserve.h). The request is
 * read with jansson; responses are written by hand into one growing buffer,
 * since an output of many thousand numbers would otherwise cost a json_t
 * per element. */
#define _GNU_SOURCE
#include "serve/kserve.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve/kserve_data.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the binary tensor extension is little-endian; this host is not"
#endif

#define ALIGN 64

int tb_ks_fail(tb_ks_error *e, int status, const char *fmt, ...) {
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return status;
}

/* ================================================================ routes */

/* Copies segment [s, s+n) into dst (TB_KS_MAX_NAME); 0 when empty or too long. */
static int take(char *dst, const char *s, size_t n) {
    if (n == 0 || n >= TB_KS_MAX_NAME) return 0;
    memcpy(dst, s, n);
    dst[n] = 0;
    return 1;
}

tb_ks_route tb_ks_parse_route(const char *url, char *name, char *version) {
    name[0] = version[0] = 0;
    if (strncmp(url, "/v2", 3) != 0 || (url[3] != 0 && url[3] != '/')) return TB_KS_ROUTE_NONE;
    const char *p = url + 3;
    if (!strcmp(p, "") || !strcmp(p, "/")) return TB_KS_ROUTE_SERVER;
    if (!strcmp(p, "/health/live")) return TB_KS_ROUTE_LIVE;
    if (!strcmp(p, "/health/ready")) return TB_KS_ROUTE_READY;
    if (strncmp(p, "/models/", 8) != 0) return TB_KS_ROUTE_UNKNOWN;
    /* segments after /models/: NAME [versions V] [ready|infer|stats] */
    const char *seg[4];
    size_t len[4];
    int ns = 0;
    const char *q = p + 8;
    while (1) {
        const char *slash = strchr(q, '/');
        size_t l = slash ? (size_t)(slash - q) : strlen(q);
        if (ns == 4) return TB_KS_ROUTE_UNKNOWN;
        seg[ns] = q;
        len[ns++] = l;
        if (!slash) break;
        q = slash + 1;
    }
    if (!take(name, seg[0], len[0])) return TB_KS_ROUTE_UNKNOWN;
    int i = 1;
    if (ns >= 3 && len[1] == 8 && !strncmp(seg[1], "versions", 8)) {
        if (!take(version, seg[2], len[2])) return TB_KS_ROUTE_UNKNOWN;
        i = 3;
    }
    if (i == ns) return TB_KS_ROUTE_MODEL;
    if (i + 1 != ns) return TB_KS_ROUTE_UNKNOWN;
    if (len[i] == 5 && !strncmp(seg[i], "ready", 5)) return TB_KS_ROUTE_MODEL_READY;
    if (len[i] == 5 && !strncmp(seg[i], "infer", 5)) return TB_KS_ROUTE_INFER;
    if (len[i] == 5 && !strncmp(seg[i], "stats", 5)) return TB_KS_ROUTE_STATS;
    return TB_KS_ROUTE_UNKNOWN;
}

/* ================================================================ dtypes */

static const struct {
    tb_dtype t;
    const char *name;
    size_t size;
} k_types[] = {
    {TB_BOOL, "BOOL", 1}, {TB_U8, "UINT8", 1}, {TB_I8, "INT8", 1},   {TB_I32, "INT32", 4},
    {TB_I64, "INT64", 8}, {TB_F16, "FP16", 2}, {TB_BF16, "BF16", 2}, {TB_F32, "FP32", 4},
    {TB_F64, "FP64", 8}, {TB_KS_BYTES, "BYTES", 0},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

const char *tb_ks_dtype_name(tb_dtype t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (k_types[i].t == t) return k_types[i].name;
    return NULL;
}

int tb_ks_dtype_parse(const char *name, tb_dtype *out) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (!strcmp(k_types[i].name, name)) {
            *out = k_types[i].t;
            return 1;
        }
    return 0;
}

size_t tb_ks_dtype_size(tb_dtype t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (k_types[i].t == t) return k_types[i].size;
    return 0;
}

/* ================================================================ BYTES */

static uint32_t get_le32(const void *p) {
    const unsigned char *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void put_le32(void *p, uint32_t v) {
    unsigned char *b = p;
    b[0] = (unsigned char)v;
    b[1] = (unsigned char)(v >> 8);
    b[2] = (unsigned char)(v >> 16);
    b[3] = (unsigned char)(v >> 24);
}

int tb_ks_bytes_size(const void *p, size_t n, int64_t elems, size_t *size) {
    const char *c = p;
    size_t at = 0;
    for (int64_t i = 0; i < elems; i++) {
        if (n - at < 4) return 0;
        uint32_t len = get_le32(c + at);
        at += 4;
        if (len > n - at) return 0;
        at += len;
    }
    *size = at;
    return 1;
}

int tb_ks_bytes_get(const void *p, size_t size, int64_t i, const char **s, size_t *len) {
    const char *c = p;
    size_t at = 0;
    for (int64_t k = 0;; k++) {
        if (size - at < 4) return 0;
        uint32_t l = get_le32(c + at);
        at += 4;
        if (l > size - at) return 0;
        if (k == i) {
            *s = c + at;
            *len = l;
            return 1;
        }
        at += l;
    }
}

/* ================================================================ writer */

/* A growing text buffer; `oom` sticks once an allocation failed. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} wbuf;

static int wb_reserve(wbuf *w, size_t more) {
    if (w->oom) return 0;
    if (more > SIZE_MAX / 2 - w->n) { w->oom = 1; return 0; }
    if (w->n + more + 1 <= w->cap) return 1;
    size_t c = w->cap ? w->cap : 1024;
    while (c < w->n + more + 1) c *= 2;
    char *q = realloc(w->p, c);
    if (!q) { w->oom = 1; return 0; }
    w->p = q;
    w->cap = c;
    return 1;
}

static void wb_put(wbuf *w, const void *s, size_t n) {
    if (!wb_reserve(w, n)) return;
    if (n) memcpy(w->p + w->n, s, n);
    w->n += n;
    w->p[w->n] = 0;
}

static void wb_str(wbuf *w, const char *s) { wb_put(w, s, strlen(s)); }

static void wb_fmt(wbuf *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wb_fmt(wbuf *w, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) wb_put(w, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* Bytes of the valid UTF-8 sequence at s (1-4), 0 when it is not one. */
static int utf8_len(const unsigned char *s) {
    int n = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || (n == 2 && s[0] < 0xc2) || (n == 4 && s[0] > 0xf4)) return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0; /* overlong, surrogate */
    if (n == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
    return n;
}

/* A JSON string of the n bytes at s: quotes, backslashes and control
 * bytes (NUL too) escaped; a byte that is not valid UTF-8 (a model name or
 * a path quoted in a message may hold one) becomes U+FFFD, so the body
 * stays valid JSON. */
static void wb_jstrn(wbuf *w, const char *s, size_t len) {
    wb_put(w, "\"", 1);
    const unsigned char *c = (const unsigned char *)s, *end = c + len;
    while (c < end) {
        /* utf8_len reads up to 4 bytes: a sequence cut by the end is invalid */
        unsigned char tmp[4] = {0};
        size_t avail = (size_t)(end - c) < 4 ? (size_t)(end - c) : 4;
        memcpy(tmp, c, avail);
        int n = *c ? utf8_len(tmp) : 1;
        if (n == 0) {
            wb_str(w, "\\ufffd");
            c++;
        } else if (*c == '"' || *c == '\\') {
            char esc[2] = {'\\', (char)*c};
            wb_put(w, esc, 2);
            c++;
        } else if (*c < 0x20) {
            wb_fmt(w, "\\u%04x", *c);
            c++;
        } else {
            wb_put(w, c, (size_t)n);
            c += n;
        }
    }
    wb_put(w, "\"", 1);
}

static void wb_jstr(wbuf *w, const char *s) { wb_jstrn(w, s, strlen(s)); }

/* ================================================================ infer request */

static int64_t shape_elems(const int64_t *d, int rank) {
    int64_t e = 1;
    for (int i = 0; i < rank; i++) {
        if (d[i] < 0 || (d[i] > 0 && e > INT64_MAX / d[i])) return -1;
        e *= d[i];
    }
    return e;
}

static void shape_str(char *buf, size_t cap, const int64_t *d, int rank) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)d[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* The profile's range of an input as [1..8,4] for messages. */
void tb_ks_range_str(char *buf, size_t cap, const tb_io_info *io) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < io->rank && k < cap; i++) {
        if (io->min[i] == io->max[i])
            k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)io->min[i]);
        else
            k += (size_t)snprintf(buf + k, cap - k, "%s%lld..%lld", i ? "," : "", (long long)io->min[i],
                                  (long long)io->max[i]);
    }
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* What pass one learned of each input before the buffer exists. */
typedef struct {
    json_t *data;       /* NULL: binary, or the span below */
    const char *span;   /* the data array's text, read by kserve_data.c */
    size_t span_len;
    json_t *owned;      /* a span jansson read after all (BYTES): freed at the end */
    size_t bin_off;     /* binary: offset in the body's binary part */
    size_t off;         /* offset in the request's buffer */
    size_t bytes;
    int64_t elems;
} in_plan;

/* Stores one JSON value as element `i` of a tensor of type t. */
static int put_value(const char *name, tb_dtype t, json_t *v, void *dst, int64_t i, tb_ks_error *e) {
    if (t == TB_BOOL) {
        if (!json_is_boolean(v)) return tb_ks_fail(e, 400, "input '%s': BOOL data must be true or false", name);
        ((uint8_t *)dst)[i] = json_is_true(v);
        return 200;
    }
    if (t == TB_U8 || t == TB_I8 || t == TB_I32 || t == TB_I64) {
        if (!json_is_integer(v))
            return tb_ks_fail(e, 400, "input '%s': %s data must be integers", name, tb_ks_dtype_name(t));
        json_int_t x = json_integer_value(v);
        long long lo = t == TB_U8 ? 0 : t == TB_I8 ? -128 : t == TB_I32 ? INT32_MIN : INT64_MIN;
        long long hi = t == TB_U8 ? 255 : t == TB_I8 ? 127 : t == TB_I32 ? INT32_MAX : INT64_MAX;
        if (x < lo || x > hi)
            return tb_ks_fail(e, 400, "input '%s': %lld is out of range for %s", name, (long long)x, tb_ks_dtype_name(t));
        switch (t) {
        case TB_U8: ((uint8_t *)dst)[i] = (uint8_t)x; break;
        case TB_I8: ((int8_t *)dst)[i] = (int8_t)x; break;
        case TB_I32: ((int32_t *)dst)[i] = (int32_t)x; break;
        default: ((int64_t *)dst)[i] = (int64_t)x; break;
        }
        return 200;
    }
    if (!json_is_number(v)) return tb_ks_fail(e, 400, "input '%s': %s data must be numbers", name, tb_ks_dtype_name(t));
    double x = json_number_value(v);
    switch (t) {
    case TB_F32: ((float *)dst)[i] = (float)x; break;
    case TB_F64: ((double *)dst)[i] = x; break;
    case TB_F16: ((uint16_t *)dst)[i] = tb_f32_to_f16((float)x); break;
    case TB_BF16: ((uint16_t *)dst)[i] = tb_f32_to_bf16((float)x); break;
    default: return tb_ks_fail(e, 400, "input '%s': unsupported datatype", name);
    }
    return 200;
}

/* Walks "data", flat or nested (at most `depth` levels of arrays), storing
 * values at *k onwards; refuses more than `want`. */
static int put_data(const char *name, tb_dtype t, json_t *v, int depth, void *dst, int64_t *k, int64_t want,
                    tb_ks_error *e) {
    if (json_is_array(v)) {
        if (depth <= 0) return tb_ks_fail(e, 400, "input '%s': data is nested deeper than its shape", name);
        size_t n = json_array_size(v);
        for (size_t j = 0; j < n; j++) {
            int st = put_data(name, t, json_array_get(v, j), depth - 1, dst, k, want, e);
            if (st != 200) return st;
        }
        return 200;
    }
    if (*k >= want) return tb_ks_fail(e, 400, "input '%s': data has more than the shape's %lld elements", name, (long long)want);
    int st = put_value(name, t, v, dst, *k, e);
    if (st == 200) (*k)++;
    return st;
}

void tb_ks_request_free(tb_ks_request *r) {
    if (!r) return;
    free(r->buf);
    r->buf = NULL;
    free(r->params);
    r->params = NULL;
}

static int find_io(const tb_io_info *io, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(io[i].name, name)) return i;
    return -1;
}

/* Parses the "outputs" list into r. */
static int parse_outputs(json_t *outs, const tb_io_info *out, int n_out, tb_ks_request *r, tb_ks_error *e) {
    if (!outs || json_is_null(outs)) return 200;
    if (!json_is_array(outs)) return tb_ks_fail(e, 400, "'outputs' must be an array");
    size_t n = json_array_size(outs);
    if (n > TB_KS_MAX_IO || (int)n > n_out)
        return tb_ks_fail(e, 400, "'outputs' lists %zu tensors; the model has %d outputs", n, n_out);
    for (size_t j = 0; j < n; j++) {
        json_t *o = json_array_get(outs, j);
        json_t *nmv = json_is_object(o) ? json_object_get(o, "name") : NULL;
        const char *nm = json_string_value(nmv);
        if (!nm || strlen(nm) != json_string_length(nmv))
            return tb_ks_fail(e, 400, "outputs[%zu] must be an object with a string 'name'", j);
        int k = find_io(out, n_out, nm);
        if (k < 0) return tb_ks_fail(e, 400, "unknown output '%s'", nm);
        for (int i = 0; i < r->n_outputs; i++)
            if (r->outputs[i] == k) return tb_ks_fail(e, 400, "output '%s' is requested twice", nm);
        int bin = r->binary_all;
        json_t *p = json_object_get(o, "parameters");
        if (p && !json_is_null(p)) {
            if (!json_is_object(p)) return tb_ks_fail(e, 400, "outputs[%zu].parameters must be an object", j);
            json_t *b = json_object_get(p, "binary_data");
            if (b) {
                if (!json_is_boolean(b)) return tb_ks_fail(e, 400, "output '%s': binary_data must be true or false", nm);
                bin = json_is_true(b);
            }
        }
        r->outputs[r->n_outputs] = k;
        r->binary[r->n_outputs++] = bin;
    }
    return 200;
}

/* The values in "data", flat or nested at most `depth` arrays deep; 0 when
 * deeper. */
static int count_leaves(json_t *v, int depth, int64_t *n) {
    if (!json_is_array(v)) {
        (*n)++;
        return 1;
    }
    if (depth <= 0) return 0;
    size_t k = json_array_size(v);
    for (size_t j = 0; j < k; j++)
        if (!count_leaves(json_array_get(v, j), depth - 1, n)) return 0;
    return 1;
}

/* The serialized size of a BYTES input's JSON data (nesting already
 * checked by count_leaves): every value a string of at most
 * TB_KS_MAX_ELEM_BYTES, each counted with its 4-byte length. */
static int bytes_json_size(const char *name, json_t *v, size_t *size, tb_ks_error *e) {
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        for (size_t j = 0; j < n; j++) {
            int st = bytes_json_size(name, json_array_get(v, j), size, e);
            if (st != 200) return st;
        }
        return 200;
    }
    if (!json_is_string(v)) return tb_ks_fail(e, 400, "input '%s': BYTES data must be strings", name);
    size_t len = json_string_length(v);
    if (len > TB_KS_MAX_ELEM_BYTES)
        return tb_ks_fail(e, 400, "input '%s': a BYTES element is longer than %u bytes", name, TB_KS_MAX_ELEM_BYTES);
    if (*size > SIZE_MAX / 4 - len - 4) return tb_ks_fail(e, 400, "input '%s' is too large", name);
    *size += 4 + len;
    return 200;
}

/* Writes a BYTES input's JSON strings in the serialized form at *at. */
static void put_bytes_json(json_t *v, char *dst, size_t *at) {
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        for (size_t j = 0; j < n; j++) put_bytes_json(json_array_get(v, j), dst, at);
        return;
    }
    size_t len = json_string_length(v);
    put_le32(dst + *at, (uint32_t)len);
    if (len) memcpy(dst + *at + 4, json_string_value(v), len);
    *at += 4 + len;
}

/* Pass one over one input: its name, datatype, shape and where its data is. */
static int plan_input(json_t *it, size_t j, const tb_io_info *in, int n_in, long long header_len, size_t max_elems,
                      const char *span, size_t span_len, const char *bin, size_t bin_n, size_t *bin_used,
                      tb_ks_request *r, in_plan *plan, int *seen, tb_ks_error *e) {
    if (!json_is_object(it)) return tb_ks_fail(e, 400, "inputs[%zu] must be an object", j);
    json_t *nmv = json_object_get(it, "name");
    const char *nm = json_string_value(nmv);
    if (!nm || strlen(nm) != json_string_length(nmv)) return tb_ks_fail(e, 400, "inputs[%zu] needs a string 'name'", j);
    int k = find_io(in, n_in, nm);
    if (k < 0) return tb_ks_fail(e, 400, "unknown input '%s'", nm);
    if (seen[k]) return tb_ks_fail(e, 400, "input '%s' is given twice", nm);
    seen[k] = 1;
    const tb_io_info *io = &in[k];
    const char *dt = json_string_value(json_object_get(it, "datatype"));
    if (!dt) return tb_ks_fail(e, 400, "input '%s' needs a string 'datatype'", nm);
    tb_dtype t;
    if (!tb_ks_dtype_parse(dt, &t)) return tb_ks_fail(e, 400, "input '%s': unsupported datatype '%s'", nm, dt);
    if (t != io->dtype)
        return tb_ks_fail(e, 400, "input '%s' has datatype %s; the model takes %s", nm, dt,
                    tb_ks_dtype_name(io->dtype) ? tb_ks_dtype_name(io->dtype) : tb_dtype_name(io->dtype));
    json_t *sh = json_object_get(it, "shape");
    if (!json_is_array(sh)) return tb_ks_fail(e, 400, "input '%s' needs a 'shape' array", nm);
    size_t rank = json_array_size(sh);
    char want[256];
    tb_ks_range_str(want, sizeof want, io);
    if (rank != (size_t)io->rank)
        return tb_ks_fail(e, 400, "input '%s' has rank %zu; the model takes shape %s", nm, rank, want);
    tb_tensor *x = &r->inputs[k];
    x->dtype = t;
    x->rank = io->rank;
    for (size_t d = 0; d < rank; d++) {
        json_t *v = json_array_get(sh, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return tb_ks_fail(e, 400, "input '%s': shape must be non-negative integers", nm);
        x->dims[d] = json_integer_value(v);
    }
    for (size_t d = 0; d < rank; d++)
        if (x->dims[d] < io->min[d] || x->dims[d] > io->max[d]) {
            char got[256];
            shape_str(got, sizeof got, x->dims, x->rank);
            return tb_ks_fail(e, 400, "input '%s' has shape %s; the model takes %s", nm, got, want);
        }
    int64_t el = shape_elems(x->dims, x->rank);
    int is_bytes = t == TB_KS_BYTES;
    size_t es = is_bytes ? 4 : tb_ks_dtype_size(t); /* BYTES: at least its length */
    if (el < 0 || (uint64_t)el > SIZE_MAX / 2 / es || (max_elems && (uint64_t)el > max_elems))
        return tb_ks_fail(e, 400, "input '%s' has too many elements", nm);
    plan[k].elems = el;
    plan[k].bytes = (size_t)el * es;
    json_t *p = json_object_get(it, "parameters");
    json_t *bs = NULL;
    if (p && !json_is_null(p)) {
        if (!json_is_object(p)) return tb_ks_fail(e, 400, "input '%s': parameters must be an object", nm);
        bs = json_object_get(p, "binary_data_size");
    }
    json_t *data = json_object_get(it, "data");
    if (bs) {
        if (!json_is_integer(bs) || json_integer_value(bs) < 0)
            return tb_ks_fail(e, 400, "input '%s': binary_data_size must be a non-negative integer", nm);
        if (header_len < 0)
            return tb_ks_fail(e, 400, "input '%s' has binary_data_size but the request has no Inference-Header-Content-Length",
                        nm);
        if (data) return tb_ks_fail(e, 400, "input '%s' has both binary_data_size and data", nm);
        unsigned long long b = (unsigned long long)json_integer_value(bs);
        if (is_bytes) {
            size_t sz = 0;
            if (b > bin_n - *bin_used)
                return tb_ks_fail(e, 400, "input '%s': the body ends before its %llu bytes of binary data", nm, b);
            if (!tb_ks_bytes_size(bin + *bin_used, (size_t)b, el, &sz) || sz != b)
                return tb_ks_fail(e, 400, "input '%s': its %llu bytes of binary data are not %lld BYTES elements (each a "
                            "4-byte little-endian length, then that many bytes)", nm, b, (long long)el);
            plan[k].bytes = (size_t)b;
        }
        if (b != plan[k].bytes)
            return tb_ks_fail(e, 400, "input '%s': binary_data_size is %llu bytes; shape and %s need %zu", nm, b, dt,
                        plan[k].bytes);
        if (b > bin_n - *bin_used)
            return tb_ks_fail(e, 400, "input '%s': the body ends before its %llu bytes of binary data", nm, b);
        plan[k].bin_off = *bin_used;
        *bin_used += (size_t)b;
        plan[k].data = NULL;
    } else {
        if (!data) return tb_ks_fail(e, 400, "input '%s' has no 'data'", nm);
        if (!json_is_array(data)) return tb_ks_fail(e, 400, "input '%s': data must be an array", nm);
        /* the array was taken out of the text jansson read: [] stands for it */
        if (span && json_array_size(data) == 0) {
            if (is_bytes) { /* strings: jansson reads them after all */
                json_error_t je;
                data = plan[k].owned = json_loadb(span, span_len, JSON_ALLOW_NUL, &je);
                if (!data) return tb_ks_fail(e, 400, "the body is not valid JSON: input '%s': %s", nm, je.text);
            } else {
                int64_t got = 0;
                int st = tb_ks_data_count(span, span_len, io->rank > 0 ? io->rank : 1, nm, t, &got, e);
                if (st != 200) return st;
                if (got != el) {
                    char s[256];
                    shape_str(s, sizeof s, x->dims, x->rank);
                    return tb_ks_fail(e, 400, "input '%s' has %lld values; shape %s needs %lld", nm, (long long)got, s,
                                (long long)el);
                }
                plan[k].span = span;
                plan[k].span_len = span_len;
                return 200;
            }
        }
        /* counted before anything is allocated: a shape the profile allows
         * must not reserve memory the body's data does not back */
        int64_t got = 0;
        if (!count_leaves(data, io->rank > 0 ? io->rank : 1, &got))
            return tb_ks_fail(e, 400, "input '%s': data is nested deeper than its shape", nm);
        if (got != el) {
            char s[256];
            shape_str(s, sizeof s, x->dims, x->rank);
            return tb_ks_fail(e, 400, "input '%s' has %lld values; shape %s needs %lld", nm, (long long)got, s, (long long)el);
        }
        if (is_bytes) {
            size_t sz = 0;
            int st = bytes_json_size(nm, data, &sz, e);
            if (st != 200) return st;
            plan[k].bytes = sz;
        }
        plan[k].data = data;
    }
    return 200;
}

int tb_ks_parse_infer(const char *body, size_t n, long long header_len, const tb_io_info *in, int n_in,
                      const tb_io_info *out, int n_out, size_t max_elems, tb_ks_request *r, tb_ks_error *e) {
    return tb_ks_parse_infer_opt(body, n, header_len, in, n_in, 0, out, n_out, max_elems, r, e);
}

int tb_ks_parse_infer_opt(const char *body, size_t n, long long header_len, const tb_io_info *in, int n_in,
                          uint64_t optional, const tb_io_info *out, int n_out, size_t max_elems, tb_ks_request *r,
                          tb_ks_error *e) {
    memset(r, 0, sizeof *r);
    e->status = 200;
    e->msg[0] = 0;
    if (n_in > TB_KS_MAX_IO || n_out > TB_KS_MAX_IO) return tb_ks_fail(e, 500, "the model has too many inputs or outputs");
    size_t jn = n;
    if (header_len >= 0) {
        if ((unsigned long long)header_len > n)
            return tb_ks_fail(e, 400, "Inference-Header-Content-Length %lld exceeds the body's %zu bytes", header_len, n);
        jn = (size_t)header_len;
    }
    const char *bin = body + jn;
    size_t bin_n = n - jn;
    json_error_t je;
    /* the inputs' data arrays are read by kserve_data.c, the rest by
     * jansson, from a copy of the text with each array replaced by [] */
    tb_ks_span spans[TB_KS_MAX_IO];
    int n_spans = body ? tb_ks_data_scan(body, jn, spans, TB_KS_MAX_IO) : -1;
    const char *jtext = body;
    size_t jlen = jn;
    char *reduced = NULL;
    if (n_spans > 0) {
        size_t cut = 0;
        for (int i = 0; i < n_spans; i++) cut += spans[i].len - 2;
        reduced = malloc(jn - cut + 1);
        if (!reduced) return tb_ks_fail(e, 500, "out of memory");
        size_t at = 0, from = 0;
        for (int i = 0; i < n_spans; i++) {
            memcpy(reduced + at, body + from, spans[i].off - from);
            at += spans[i].off - from;
            memcpy(reduced + at, "[]", 2);
            at += 2;
            from = spans[i].off + spans[i].len;
        }
        memcpy(reduced + at, body + from, jn - from);
        at += jn - from;
        reduced[at] = 0;
        jtext = reduced;
        jlen = at;
    }
    /* without the header, bytes after the JSON are most likely binary data
     * sent without it: say so rather than "not valid JSON" */
    /* JSON_ALLOW_NUL: a BYTES element may hold NUL bytes ("\u0000"); names
     * holding one are refused where they are read */
    json_t *root = body ? json_loadb(jtext, jlen, (header_len < 0 ? JSON_DISABLE_EOF_CHECK : 0) | JSON_ALLOW_NUL, &je)
                        : NULL;
    if (!root) {
        free(reduced);
        return tb_ks_fail(e, 400, "the body is not valid JSON%s%s", body ? ": " : "", body ? je.text : "");
    }
    if (header_len < 0) {
        size_t used = (size_t)je.position;
        while (used < jlen && (jtext[used] == ' ' || jtext[used] == '\t' || jtext[used] == '\n' || jtext[used] == '\r'))
            used++;
        if (used < jlen) {
            json_decref(root);
            free(reduced);
            return tb_ks_fail(e, 400, "the body has %zu bytes after its JSON; binary tensor data needs the "
                                "Inference-Header-Content-Length header", jlen - used);
        }
    }
    free(reduced);
    int st = 200;
    in_plan plan[TB_KS_MAX_IO];
    int seen[TB_KS_MAX_IO] = {0};
    memset(plan, 0, sizeof plan);
    if (!json_is_object(root)) { st = tb_ks_fail(e, 400, "the body must be a JSON object"); goto done; }
    json_t *id = json_object_get(root, "id");
    if (id && !json_is_null(id)) {
        const char *s = json_string_value(id);
        if (!s) { st = tb_ks_fail(e, 400, "'id' must be a string"); goto done; }
        if (strlen(s) >= sizeof r->id) { st = tb_ks_fail(e, 400, "'id' is longer than %d bytes", TB_KS_MAX_ID - 1); goto done; }
        snprintf(r->id, sizeof r->id, "%s", s);
    }
    json_t *params = json_object_get(root, "parameters");
    if (params && !json_is_null(params)) {
        if (!json_is_object(params)) { st = tb_ks_fail(e, 400, "'parameters' must be an object"); goto done; }
        json_t *b = json_object_get(params, "binary_data_output");
        if (b) {
            if (!json_is_boolean(b)) { st = tb_ks_fail(e, 400, "binary_data_output must be true or false"); goto done; }
            r->binary_all = json_is_true(b);
        }
        /* Triton's per-request timeout, in microseconds */
        json_t *t = json_object_get(params, "timeout");
        if (t) {
            if (!json_is_integer(t) || json_integer_value(t) < 0) {
                st = tb_ks_fail(e, 400, "parameters.timeout must be a non-negative integer (microseconds)");
                goto done;
            }
            r->timeout_us = (long long)json_integer_value(t);
        }
        r->params = json_dumps(params, JSON_COMPACT);
        if (!r->params) { st = tb_ks_fail(e, 500, "out of memory"); goto done; }
    }
    json_t *ins = json_object_get(root, "inputs");
    if (!json_is_array(ins)) { st = tb_ks_fail(e, 400, "the request needs an 'inputs' array"); goto done; }
    /* more inputs than the model's: one is unknown or given twice, and
     * the loop stops there, naming it */
    size_t ni = json_array_size(ins);
    size_t bin_used = 0;
    for (size_t j = 0; j < ni; j++) {
        const tb_ks_span *sp = NULL;
        for (int i = 0; i < n_spans; i++)
            if ((size_t)spans[i].input == j) sp = &spans[i];
        st = plan_input(json_array_get(ins, j), j, in, n_in, header_len, max_elems, sp ? body + sp->off : NULL,
                        sp ? sp->len : 0, bin, bin_n, &bin_used, r, plan, seen, e);
        if (st != 200) goto done;
    }
    for (int k = 0; k < n_in; k++) {
        if (!seen[k] && !(k < 64 && (optional >> k & 1))) {
            st = tb_ks_fail(e, 400, "input '%s' is missing", in[k].name);
            goto done;
        }
        r->given[k] = seen[k];
        r->in_size[k] = plan[k].bytes;
    }
    if (bin_used != bin_n) {
        st = tb_ks_fail(e, 400, "the body has %zu bytes after the JSON header; the inputs' binary_data_size sum to %zu", bin_n,
                  bin_used);
        goto done;
    }
    st = parse_outputs(json_object_get(root, "outputs"), out, n_out, r, e);
    if (st != 200) goto done;
    /* one buffer for all inputs, each at a 64-byte boundary */
    size_t total = 0;
    for (int k = 0; k < n_in; k++) {
        plan[k].off = total;
        if (plan[k].bytes > SIZE_MAX / 4 - total) { st = tb_ks_fail(e, 400, "the inputs are too large"); goto done; }
        total += (plan[k].bytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    r->in_bytes = total;
    r->buf = aligned_alloc(ALIGN, total ? total : ALIGN);
    if (!r->buf) { st = tb_ks_fail(e, 500, "out of memory for %zu bytes of inputs", total); goto done; }
    r->n_inputs = n_in;
    for (int k = 0; k < n_in; k++) {
        tb_tensor *x = &r->inputs[k];
        if (!seen[k]) continue; /* an optional input left out: zeroed */
        x->data = (char *)r->buf + plan[k].off;
        if (plan[k].span) {
            st = tb_ks_data_fill(plan[k].span, plan[k].span_len, in[k].name, x->dtype, x->data, plan[k].elems, e);
            if (st != 200) goto done;
            continue;
        }
        if (plan[k].data && x->dtype == TB_KS_BYTES) {
            size_t at = 0;
            put_bytes_json(plan[k].data, x->data, &at);
            continue;
        }
        if (!plan[k].data) {
            if (plan[k].bytes) memcpy(x->data, bin + plan[k].bin_off, plan[k].bytes);
            if (x->dtype == TB_BOOL)
                for (size_t i = 0; i < plan[k].bytes; i++)
                    if (((uint8_t *)x->data)[i] > 1) {
                        st = tb_ks_fail(e, 400, "input '%s': BOOL bytes must be 0 or 1", in[k].name);
                        goto done;
                    }
            continue;
        }
        int64_t got = 0;
        st = put_data(in[k].name, x->dtype, plan[k].data, x->rank > 0 ? x->rank : 1, x->data, &got, plan[k].elems, e);
        if (st != 200) goto done;
        if (got != plan[k].elems) {
            char s[256];
            shape_str(s, sizeof s, x->dims, x->rank);
            st = tb_ks_fail(e, 400, "input '%s' has %lld values; shape %s needs %lld", in[k].name, (long long)got, s,
                      (long long)plan[k].elems);
            goto done;
        }
    }
done:
    json_decref(root);
    for (int k = 0; k < TB_KS_MAX_IO; k++) json_decref(plan[k].owned);
    if (st != 200) tb_ks_request_free(r);
    return st;
}

/* ================================================================ response */

static int write_data(wbuf *w, const tb_tensor *t, int64_t el, const char *name, tb_ks_error *e) {
    if (t->dtype == TB_KS_BYTES) { /* strings: bytes that are not UTF-8 become U+FFFD (binary keeps them) */
        wb_put(w, "[", 1);
        const char *p = t->data;
        for (int64_t i = 0; i < el; i++) {
            uint32_t len = get_le32(p);
            if (i) wb_put(w, ",", 1);
            wb_jstrn(w, p + 4, len);
            p += 4 + (size_t)len;
        }
        wb_put(w, "]", 1);
        return 200;
    }
    wb_put(w, "[", 1);
    for (int64_t i = 0; i < el; i++) {
        if (i) wb_put(w, ",", 1);
        double f;
        switch (t->dtype) {
        case TB_BOOL: wb_str(w, ((const uint8_t *)t->data)[i] ? "true" : "false"); continue;
        case TB_U8: wb_fmt(w, "%u", ((const uint8_t *)t->data)[i]); continue;
        case TB_I8: wb_fmt(w, "%d", ((const int8_t *)t->data)[i]); continue;
        case TB_I32: wb_fmt(w, "%d", ((const int32_t *)t->data)[i]); continue;
        case TB_I64: wb_fmt(w, "%lld", (long long)((const int64_t *)t->data)[i]); continue;
        case TB_F32: f = ((const float *)t->data)[i]; break;
        case TB_F64: f = ((const double *)t->data)[i]; break;
        case TB_F16: f = tb_f16_to_f32(((const uint16_t *)t->data)[i]); break;
        case TB_BF16: f = tb_bf16_to_f32(((const uint16_t *)t->data)[i]); break;
        default: return tb_ks_fail(e, 500, "output '%s' has a datatype the protocol cannot carry", name);
        }
        if (!isfinite(f))
            return tb_ks_fail(e, 500, "output '%s' holds a non-finite value, which JSON cannot carry; ask for it with "
                                "binary_data", name);
        /* %.9g reads back as the same float, %.17g as the same double; "-0"
         * would read back as the integer 0 */
        if (f == 0 && signbit(f)) wb_str(w, "-0.0");
        else wb_fmt(w, t->dtype == TB_F64 ? "%.17g" : "%.9g", f);
    }
    wb_put(w, "]", 1);
    return 200;
}

int tb_ks_encode_response(const char *model, const char *version, const tb_ks_request *r, const tb_io_info *out,
                          const tb_tensor *outputs, int n_out, char **body, size_t *n, size_t *header_len,
                          tb_ks_error *e) {
    *body = NULL;
    *n = *header_len = 0;
    e->status = 200;
    e->msg[0] = 0;
    int sel[TB_KS_MAX_IO], bin[TB_KS_MAX_IO], ns = 0;
    if (n_out > TB_KS_MAX_IO) return tb_ks_fail(e, 500, "the model has too many outputs");
    if (r->n_outputs == 0)
        for (int k = 0; k < n_out; k++) { sel[ns] = k; bin[ns++] = r->binary_all; }
    else
        for (int i = 0; i < r->n_outputs; i++) { sel[ns] = r->outputs[i]; bin[ns++] = r->binary[i]; }
    int any_bin = 0;
    wbuf w = {0};
    wb_str(&w, "{\"model_name\":");
    wb_jstr(&w, model);
    wb_str(&w, ",\"model_version\":");
    wb_jstr(&w, version);
    if (r->id[0]) {
        wb_str(&w, ",\"id\":");
        wb_jstr(&w, r->id);
    }
    wb_str(&w, ",\"outputs\":[");
    size_t bin_bytes[TB_KS_MAX_IO] = {0};
    for (int i = 0; i < ns; i++) {
        int k = sel[i];
        const tb_tensor *t = &outputs[k];
        const char *dt = tb_ks_dtype_name(t->dtype);
        int64_t el = shape_elems(t->dims, t->rank);
        if (!dt || el < 0 || (uint64_t)el > SIZE_MAX / 8) {
            free(w.p);
            return tb_ks_fail(e, 500, "output '%s' cannot be sent (datatype %s)", out[k].name, tb_dtype_name(t->dtype));
        }
        wb_str(&w, i ? ",{\"name\":" : "{\"name\":");
        wb_jstr(&w, out[k].name);
        wb_str(&w, ",\"datatype\":\"");
        wb_str(&w, dt);
        wb_str(&w, "\",\"shape\":[");
        for (int d = 0; d < t->rank; d++) wb_fmt(&w, d ? ",%lld" : "%lld", (long long)t->dims[d]);
        wb_str(&w, "]");
        if (bin[i]) {
            bin_bytes[i] = (size_t)el * tb_ks_dtype_size(t->dtype);
            /* the server made it: its lengths are trusted to be within it */
            if (t->dtype == TB_KS_BYTES) tb_ks_bytes_size(t->data, SIZE_MAX / 2, el, &bin_bytes[i]);
            wb_fmt(&w, ",\"parameters\":{\"binary_data_size\":%zu}}", bin_bytes[i]);
            any_bin = 1;
            continue;
        }
        wb_str(&w, ",\"data\":");
        if (write_data(&w, t, el, out[k].name, e) != 200) {
            free(w.p);
            return e->status;
        }
        wb_str(&w, "}");
    }
    wb_str(&w, "]}");
    size_t hl = w.n;
    for (int i = 0; i < ns && any_bin; i++)
        if (bin[i]) wb_put(&w, outputs[sel[i]].data, bin_bytes[i]);
    if (w.oom) {
        free(w.p);
        return tb_ks_fail(e, 500, "out of memory encoding the response");
    }
    *body = w.p;
    *n = w.n;
    *header_len = any_bin ? hl : 0;
    return 200;
}

/* ================================================================ metadata */

static void write_ios(wbuf *w, const tb_io_info *io, int n) {
    wb_str(w, "[");
    for (int i = 0; i < n; i++) {
        wb_str(w, i ? ",{\"name\":" : "{\"name\":");
        wb_jstr(w, io[i].name);
        const char *dt = tb_ks_dtype_name(io[i].dtype);
        wb_str(w, ",\"datatype\":");
        wb_jstr(w, dt ? dt : tb_dtype_name(io[i].dtype));
        wb_str(w, ",\"shape\":[");
        for (int d = 0; d < io[i].rank; d++) {
            long long v = io[i].min[d] == io[i].max[d] && io[i].min[d] >= 0 ? (long long)io[i].min[d] : -1;
            wb_fmt(w, d ? ",%lld" : "%lld", v);
        }
        wb_str(w, "]}");
    }
    wb_str(w, "]");
}

char *tb_ks_model_metadata(const char *name, const char *version, const tb_io_info *in, int n_in,
                           const tb_io_info *out, int n_out) {
    wbuf w = {0};
    wb_str(&w, "{\"name\":");
    wb_jstr(&w, name);
    wb_str(&w, ",\"versions\":[");
    wb_jstr(&w, version);
    wb_str(&w, "],\"platform\":\"turbine\",\"inputs\":");
    write_ios(&w, in, n_in);
    wb_str(&w, ",\"outputs\":");
    write_ios(&w, out, n_out);
    wb_str(&w, "}");
    if (w.oom) {
        free(w.p);
        return NULL;
    }
    return w.p;
}

char *tb_ks_error_json(const char *msg) {
    wbuf w = {0};
    wb_str(&w, "{\"error\":");
    wb_jstr(&w, msg);
    wb_str(&w, "}");
    if (w.oom) {
        free(w.p);
        return NULL;
    }
    return w.p;
}
