/*
 * kserve.c — what `turbine bench --endpoint kserve` knows of the KServe v2
 * (Open Inference Protocol) beyond HTTP: the input tensors of a request
 * (from the command line or the model's metadata), the request bodies (JSON
 * tensors or the binary tensor extension), the check of a response, and the
 * server's per-model histograms read from Prometheus text.
 *
 * Bodies are built once before the load (a pool), so the load loop does no
 * encoding. Random values are multiples of 1/1024 in [-1, 1) for floats
 * (exact in FP16, BF16 and FP32, short in JSON) and integers in [0, 100)
 * (valid indices for most embedding tables), BOOL 0/1.
 *
 * The binary form is Triton's: the JSON header with
 * parameters.binary_data_size per input and no "data", then the tensors'
 * raw little-endian bytes in input order; the header's length goes in the
 * Inference-Header-Content-Length request header (the caller adds it: it
 * is the same for every body of one spec).
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include "bench/bench.h"

#define TB_KS_MAX_BODY ((size_t)1 << 30)
#define TB_PROM_MAX_LINE 4096

/* ---------------------------------------------------------------- tensors */

static int dtype_size(const char *dt) {
    static const struct { const char *n; int s; } k[] = {
        {"BOOL", 1}, {"UINT8", 1}, {"INT8", 1}, {"UINT16", 2}, {"INT16", 2}, {"FP16", 2},
        {"BF16", 2}, {"UINT32", 4}, {"INT32", 4}, {"FP32", 4}, {"UINT64", 8}, {"INT64", 8},
        {"FP64", 8},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(dt, k[i].n)) return k[i].s;
    return 0;
}

static tb_status set_dtype(tb_ks_tensor *t, const char *dt, size_t n) {
    if (n == 0 || n >= sizeof t->datatype) return tb_errorf(TB_ERR_INVALID_ARG, "bad datatype '%.*s'", (int)n, dt);
    for (size_t i = 0; i < n; i++) {
        char ch = dt[i];
        t->datatype[i] = (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
    }
    t->datatype[n] = 0;
    t->elem_size = dtype_size(t->datatype);
    if (!t->elem_size)
        return tb_errorf(TB_ERR_UNSUPPORTED, "datatype %s is not supported (BOOL, [U]INT8-64, FP16, BF16, FP32, FP64)",
                         t->datatype);
    return TB_OK;
}

int64_t tb_ks_elems(const tb_ks_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) {
        if (t->dims[i] < 0) return -1;
        if (t->dims[i] && n > TB_KS_MAX_ELEMS / t->dims[i]) return TB_KS_MAX_ELEMS + 1;
        n *= t->dims[i];
    }
    return n;
}

/* "D0xD1x..." (also ',' between dims); -1 allowed when dyn. */
static tb_status parse_dims(const char *s, int dyn, int64_t *dims, int *n_dims) {
    *n_dims = 0;
    if (!*s || !strcmp(s, "scalar")) return TB_OK;
    const char *p = s;
    for (;;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < (dyn ? -1 : 0) || v > TB_KS_MAX_ELEMS || *n_dims >= TB_KS_MAX_DIMS)
            return tb_errorf(TB_ERR_INVALID_ARG, "bad shape '%s' (e.g. 1x3x224x224, at most %d dims)", s, TB_KS_MAX_DIMS);
        dims[(*n_dims)++] = v;
        if (!*end) return TB_OK;
        if (*end != 'x' && *end != ',') return tb_errorf(TB_ERR_INVALID_ARG, "bad shape '%s'", s);
        p = end + 1;
    }
}

tb_status tb_ks_parse_input(const char *arg, tb_ks_tensor *t) {
    memset(t, 0, sizeof *t);
    const char *c1 = strchr(arg, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || !c2 || c1 == arg || (size_t)(c1 - arg) >= sizeof t->name)
        return tb_errorf(TB_ERR_INVALID_ARG, "bad --input '%s' (NAME:DATATYPE:SHAPE, e.g. input:FP32:1x3x224x224)", arg);
    memcpy(t->name, arg, (size_t)(c1 - arg));
    TB_TRY(set_dtype(t, c1 + 1, (size_t)(c2 - c1 - 1)));
    TB_TRY(parse_dims(c2 + 1, 0, t->dims, &t->n_dims));
    if (tb_ks_elems(t) > TB_KS_MAX_ELEMS) return tb_errorf(TB_ERR_INVALID_ARG, "--input '%s': too many elements", arg);
    return TB_OK;
}

static tb_status tensor_from_json(json_t *j, tb_ks_tensor *t) {
    memset(t, 0, sizeof *t);
    const char *name = json_string_value(json_object_get(j, "name"));
    const char *dt = json_string_value(json_object_get(j, "datatype"));
    json_t *shape = json_object_get(j, "shape");
    if (!name || !dt || !json_is_array(shape) || strlen(name) >= sizeof t->name)
        return tb_errorf(TB_ERR_FORMAT, "model metadata: a tensor without name, datatype or shape");
    strcpy(t->name, name);
    TB_TRY(set_dtype(t, dt, strlen(dt)));
    if (json_array_size(shape) > TB_KS_MAX_DIMS) return tb_errorf(TB_ERR_FORMAT, "model metadata: %s has too many dims", name);
    size_t i;
    json_t *d;
    json_array_foreach(shape, i, d) {
        if (!json_is_integer(d) || json_integer_value(d) < -1 || json_integer_value(d) > TB_KS_MAX_ELEMS)
            return tb_errorf(TB_ERR_FORMAT, "model metadata: bad dim in the shape of %s", name);
        t->dims[t->n_dims++] = json_integer_value(d);
    }
    return TB_OK;
}

tb_status tb_ks_spec_from_metadata(const char *text, tb_ks_spec *s) {
    memset(s, 0, sizeof *s);
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!json_is_object(j)) { json_decref(j); return tb_errorf(TB_ERR_FORMAT, "model metadata: not a JSON object"); }
    json_t *in = json_object_get(j, "inputs"), *out = json_object_get(j, "outputs");
    tb_status st = TB_OK;
    if (!json_is_array(in) || !json_array_size(in)) st = tb_errorf(TB_ERR_FORMAT, "model metadata: no inputs");
    else if (json_array_size(in) > TB_KS_MAX_TENSORS || json_array_size(out) > TB_KS_MAX_TENSORS)
        st = tb_errorf(TB_ERR_FORMAT, "model metadata: more than %d inputs or outputs", TB_KS_MAX_TENSORS);
    for (size_t i = 0; st == TB_OK && i < json_array_size(in); i++)
        if ((st = tensor_from_json(json_array_get(in, i), &s->inputs[i])) == TB_OK) s->n_inputs++;
    for (size_t i = 0; st == TB_OK && i < json_array_size(out); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(out, i), "name"));
        if (!n || strlen(n) >= TB_KS_MAX_NAME) st = tb_errorf(TB_ERR_FORMAT, "model metadata: an output without a name");
        else strcpy(s->outputs[s->n_outputs++], n);
    }
    json_decref(j);
    return st;
}

tb_status tb_ks_apply_shape(tb_ks_spec *s, const char *arg) {
    const char *c = strchr(arg, ':');
    if (!c) return tb_errorf(TB_ERR_INVALID_ARG, "bad --shape '%s' (NAME:DIMS, e.g. input:1x3x224x224)", arg);
    for (int i = 0; i < s->n_inputs; i++) {
        tb_ks_tensor *t = &s->inputs[i];
        if (strlen(t->name) != (size_t)(c - arg) || strncmp(t->name, arg, (size_t)(c - arg))) continue;
        int64_t d[TB_KS_MAX_DIMS];
        int nd;
        TB_TRY(parse_dims(c + 1, 0, d, &nd));
        if (nd != t->n_dims)
            return tb_errorf(TB_ERR_INVALID_ARG, "--shape '%s': input %s has %d dims", arg, t->name, t->n_dims);
        for (int k = 0; k < nd; k++) {
            if (t->dims[k] >= 0 && t->dims[k] != d[k])
                return tb_errorf(TB_ERR_INVALID_ARG, "--shape '%s': dim %d of %s is fixed at %lld", arg, k,
                                 t->name, (long long)t->dims[k]);
            t->dims[k] = d[k];
        }
        return TB_OK;
    }
    return tb_errorf(TB_ERR_INVALID_ARG, "--shape '%s': the model has no input of that name", arg);
}

void tb_ks_fix_dynamic(tb_ks_spec *s) {
    for (int i = 0; i < s->n_inputs; i++)
        for (int k = 0; k < s->inputs[i].n_dims; k++)
            if (s->inputs[i].dims[k] < 0) s->inputs[i].dims[k] = 1;
}

tb_status tb_ks_apply_batch(tb_ks_spec *s, int batch) {
    if (batch < 1 || batch > 1 << 20) return tb_errorf(TB_ERR_INVALID_ARG, "bad batch size %d", batch);
    for (int i = 0; i < s->n_inputs; i++) {
        tb_ks_tensor *t = &s->inputs[i];
        if (t->n_dims < 1) continue;
        t->dims[0] *= batch;
        if (tb_ks_elems(t) > TB_KS_MAX_ELEMS)
            return tb_errorf(TB_ERR_INVALID_ARG, "input %s: too many elements at batch %d", t->name, batch);
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- bodies */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int is_float(const char *dt) { return dt[0] == 'F' || (dt[0] == 'B' && dt[1] == 'F'); }

/* n elements of t's datatype, little-endian, into p. */
static void random_fill(const tb_ks_tensor *t, int64_t n, uint64_t *seed, unsigned char *p) {
    const char *dt = t->datatype;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = rng_next(seed);
        unsigned char *q = p + i * t->elem_size;
        if (is_float(dt)) {
            float f = (float)((int)(r % 2048) - 1024) / 1024.0f;
            if (!strcmp(dt, "FP32")) memcpy(q, &f, 4);
            else if (!strcmp(dt, "FP64")) { double d = f; memcpy(q, &d, 8); }
            else if (!strcmp(dt, "FP16")) { uint16_t h = tb_f32_to_f16(f); memcpy(q, &h, 2); }
            else { uint32_t b; memcpy(&b, &f, 4); uint16_t h = (uint16_t)(b >> 16); memcpy(q, &h, 2); }
        } else if (!strcmp(dt, "BOOL")) {
            q[0] = (unsigned char)(r & 1);
        } else {
            uint64_t v = r % 100; /* little-endian host: the low bytes */
            memcpy(q, &v, (size_t)t->elem_size);
        }
    }
}

/* A growing text buffer; oom sticks. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} ks_sb;

static void sb_add(ks_sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(ks_sb *b, const char *s) { sb_add(b, s, strlen(s)); }
static void sb_fmt(ks_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(ks_sb *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) sb_add(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}
/* a JSON string (names come from the user or the server) */
static void sb_json_str(ks_sb *b, const char *s) {
    json_t *j = json_string(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    if (t) sb_str(b, t);
    else b->oom = 1;
    free(t);
    json_decref(j);
}

/* The elements of a little-endian buffer as a JSON array's contents, written
 * directly (per-element JSON objects cost ~3 us each on a 150k-element
 * image). Floats print with enough digits to read back the same value.
 * 0: a value JSON cannot hold (NaN, infinity). */
static int sb_data(ks_sb *b, const tb_ks_tensor *t, const unsigned char *p, int64_t n) {
    const char *dt = t->datatype;
    int kind = !strcmp(dt, "FP32") ? 1 : !strcmp(dt, "FP64") ? 2 : !strcmp(dt, "FP16") ? 3
             : !strcmp(dt, "BF16") ? 4 : !strcmp(dt, "BOOL") ? 5 : dt[0] == 'I' ? 6 : 7;
    int es = t->elem_size, bits = es * 8;
    for (int64_t i = 0; i < n && !b->oom; i++) {
        const unsigned char *q = p + i * es;
        if (i) sb_add(b, ",", 1);
        double v;
        switch (kind) {
        case 1: { float f; memcpy(&f, q, 4); v = f; break; }
        case 2: memcpy(&v, q, 8); break;
        case 3: { uint16_t h; memcpy(&h, q, 2); v = tb_f16_to_f32(h); break; }
        case 4: { uint16_t h; memcpy(&h, q, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); v = f; break; }
        case 5: sb_str(b, q[0] ? "true" : "false"); continue;
        default: {
            uint64_t u = 0;
            memcpy(&u, q, (size_t)es);
            if (kind == 6 && bits < 64 && ((u >> (bits - 1)) & 1)) u |= ~0ull << bits;
            if (kind == 6) sb_fmt(b, "%lld", (long long)(int64_t)u);
            else sb_fmt(b, "%llu", (unsigned long long)u);
            continue;
        }
        }
        if (!isfinite(v)) return 0;
        /* %.9g reads back any float, %.17g any double; a value with no
         * fraction gets ".0" so it stays a real for strict parsers */
        char tmp[40];
        int k = snprintf(tmp, sizeof tmp, kind == 2 ? "%.17g" : "%.9g", v);
        if (k > 0 && !strpbrk(tmp, ".eEn")) { tmp[k++] = '.'; tmp[k++] = '0'; tmp[k] = 0; }
        sb_str(b, tmp);
    }
    return 1;
}

tb_status tb_ks_build_body(const tb_ks_spec *s, const void *const *data, uint64_t *seed, char **body,
                           size_t *len, size_t *header_len) {
    *body = NULL;
    *len = *header_len = 0;
    unsigned char *bufs[TB_KS_MAX_TENSORS] = {0};
    size_t sizes[TB_KS_MAX_TENSORS] = {0}, total = 0;
    tb_status st = TB_OK;
    ks_sb b = {0};
    sb_str(&b, "{\"inputs\":[");
    for (int i = 0; i < s->n_inputs && st == TB_OK; i++) {
        const tb_ks_tensor *t = &s->inputs[i];
        int64_t n = tb_ks_elems(t);
        if (n < 0 || n > TB_KS_MAX_ELEMS) { st = tb_errorf(TB_ERR_INVALID_ARG, "input %s: bad shape", t->name); break; }
        sizes[i] = (size_t)n * (size_t)t->elem_size;
        total += sizes[i];
        if (total > TB_KS_MAX_BODY) { st = tb_errorf(TB_ERR_INVALID_ARG, "a request over %zu bytes", TB_KS_MAX_BODY); break; }
        if (data && data[i]) bufs[i] = (unsigned char *)data[i];
        else {
            bufs[i] = malloc(sizes[i] ? sizes[i] : 1);
            if (!bufs[i]) { st = tb_errorf(TB_ERR_OOM, "kserve: out of memory"); break; }
            random_fill(t, n, seed, bufs[i]);
        }
        sb_str(&b, i ? ",{\"name\":" : "{\"name\":");
        sb_json_str(&b, t->name);
        sb_str(&b, ",\"shape\":[");
        for (int k = 0; k < t->n_dims; k++) sb_fmt(&b, k ? ",%lld" : "%lld", (long long)t->dims[k]);
        sb_fmt(&b, "],\"datatype\":\"%s\",", t->datatype);
        if (s->binary) sb_fmt(&b, "\"parameters\":{\"binary_data_size\":%zu}}", sizes[i]);
        else {
            sb_str(&b, "\"data\":[");
            if (!sb_data(&b, t, bufs[i], n))
                st = tb_errorf(TB_ERR_INVALID_ARG, "input %s: NaN or infinity cannot go in JSON tensors "
                               "(use --tensor-format binary)", t->name);
            sb_str(&b, "]}");
        }
    }
    sb_str(&b, "]");
    if (s->n_outputs) {
        sb_str(&b, ",\"outputs\":[");
        for (int i = 0; i < s->n_outputs; i++) {
            sb_str(&b, i ? ",{\"name\":" : "{\"name\":");
            sb_json_str(&b, s->outputs[i]);
            sb_fmt(&b, ",\"parameters\":{\"binary_data\":%s}}", s->binary ? "true" : "false");
        }
        sb_str(&b, "]");
    }
    /* Triton's switch for outputs not named */
    if (s->binary) sb_str(&b, ",\"parameters\":{\"binary_data_output\":true}");
    sb_str(&b, "}");
    if (st == TB_OK && b.oom) st = tb_errorf(TB_ERR_OOM, "kserve: out of memory");
    if (st == TB_OK) {
        size_t hl = b.n;
        for (int i = 0; s->binary && i < s->n_inputs; i++) sb_add(&b, (const char *)bufs[i], sizes[i]);
        if (b.oom) st = tb_errorf(TB_ERR_OOM, "kserve: out of memory");
        else {
            *body = b.p;
            *len = b.n;
            *header_len = hl;
            b.p = NULL;
        }
    }
    free(b.p);
    for (int i = 0; i < s->n_inputs; i++)
        if (!(data && data[i])) free(bufs[i]);
    return st;
}

tb_status tb_ks_read_input(const char *dir, const tb_ks_tensor *t, int batch, void **data) {
    *data = NULL;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s.bin", dir, t->name) >= (int)sizeof path)
        return tb_errorf(TB_ERR_INVALID_ARG, "--input-data: path too long");
    char *text = NULL;
    size_t size = 0;
    int64_t n = tb_ks_elems(t);
    size_t want = (size_t)n * (size_t)t->elem_size;
    TB_TRY(tb_file_read_all(path, &text, &size, want + 1));
    if (size == want) { *data = text; return TB_OK; }
    if (batch > 1 && want % (size_t)batch == 0 && size == want / (size_t)batch && size) {
        char *b = malloc(want);
        if (!b) { free(text); return tb_errorf(TB_ERR_OOM, "kserve: out of memory"); }
        for (int i = 0; i < batch; i++) memcpy(b + (size_t)i * size, text, size);
        free(text);
        *data = b;
        return TB_OK;
    }
    free(text);
    return tb_errorf(TB_ERR_FORMAT, "%s: %zu bytes, input %s (%s, %lld elements) needs %zu%s", path, size, t->name,
                     t->datatype, (long long)n, want, batch > 1 ? " (or one batch item's share)" : "");
}

/* One JSON value into element i of t's little-endian form; 0: not a number. */
static int put_elem(const tb_ks_tensor *t, json_t *v, unsigned char *p, int64_t i) {
    unsigned char *q = p + i * t->elem_size;
    const char *dt = t->datatype;
    if (!json_is_number(v) && !json_is_boolean(v)) return 0;
    double d = json_is_boolean(v) ? json_is_true(v) : json_number_value(v);
    if (!strcmp(dt, "FP32")) { float f = (float)d; memcpy(q, &f, 4); }
    else if (!strcmp(dt, "FP64")) memcpy(q, &d, 8);
    else if (!strcmp(dt, "FP16")) { uint16_t h = tb_f32_to_f16((float)d); memcpy(q, &h, 2); }
    else if (!strcmp(dt, "BF16")) {
        float f = (float)d;
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16); /* nearest, ties to even */
        memcpy(q, &h, 2);
    } else if (!strcmp(dt, "BOOL")) q[0] = d != 0;
    else {
        int64_t x = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)d;
        memcpy(q, &x, (size_t)t->elem_size); /* little-endian: the low bytes */
    }
    return 1;
}

tb_status tb_ks_read_json_data(const char *path, const tb_ks_spec *s, int batch, int max_steps, void ***out,
                               int *n_steps) {
    *out = NULL;
    *n_steps = 0;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) return tb_errorf(TB_ERR_FORMAT, "%s:%d: %s", path, err.line, err.text);
    json_t *steps = json_object_get(root, "data");
    tb_status st = TB_OK;
    size_t ns = json_array_size(steps);
    if (!json_is_array(steps) || !ns) st = tb_errorf(TB_ERR_FORMAT, "%s: want {\"data\": [{NAME: [...], ...}, ...]}", path);
    if (ns > (size_t)max_steps) ns = (size_t)max_steps;
    void **bufs = st == TB_OK ? calloc(ns * (size_t)s->n_inputs, sizeof *bufs) : NULL;
    if (st == TB_OK && !bufs) st = tb_errorf(TB_ERR_OOM, "kserve: out of memory");
    for (size_t k = 0; st == TB_OK && k < ns; k++) {
        json_t *step = json_array_get(steps, k);
        for (int i = 0; st == TB_OK && i < s->n_inputs; i++) {
            const tb_ks_tensor *t = &s->inputs[i];
            json_t *v = json_object_get(step, t->name);
            if (json_is_object(v)) v = json_object_get(v, "content"); /* {"content": [...], "shape": [...]} */
            int64_t n = tb_ks_elems(t), b = batch > 0 ? batch : 1;
            size_t got = json_array_size(v);
            if (!json_is_array(v) || (got != (size_t)n && (b == 1 || n % b || got != (size_t)(n / b)))) {
                st = tb_errorf(TB_ERR_FORMAT, "%s: step %zu: input %s wants a flat array of %lld values%s", path, k,
                               t->name, (long long)n, b > 1 ? " (or one batch item's)" : "");
                break;
            }
            unsigned char *p = malloc((size_t)n * (size_t)t->elem_size + 1);
            bufs[k * (size_t)s->n_inputs + (size_t)i] = p;
            if (!p) { st = tb_errorf(TB_ERR_OOM, "kserve: out of memory"); break; }
            for (int64_t e = 0; e < n; e++)
                if (!put_elem(t, json_array_get(v, (size_t)(e % (int64_t)got)), p, e)) {
                    st = tb_errorf(TB_ERR_FORMAT, "%s: step %zu: input %s: value %lld is not a number", path, k,
                                   t->name, (long long)(e % (int64_t)got));
                    break;
                }
        }
    }
    json_decref(root);
    if (st != TB_OK) {
        for (size_t k = 0; bufs && k < ns * (size_t)s->n_inputs; k++) free(bufs[k]);
        free(bufs);
        return st;
    }
    *out = bufs;
    *n_steps = (int)ns;
    return TB_OK;
}

static const char *sval(json_t *j, const char *dflt) {
    const char *v = json_string_value(j);
    return v ? v : dflt;
}

int tb_ks_check_response(const tb_ks_spec *s, const char *body, size_t n, char *msg, size_t cap) {
    json_error_t err;
    /* a binary reply is its JSON header followed by raw bytes: decode the
     * first value only, then account for what follows */
    json_t *j = json_loadb(body, n, JSON_DISABLE_EOF_CHECK, &err);
    if (!json_is_object(j)) {
        snprintf(msg, cap, "response is not a JSON object%s%s", j ? "" : ": ", j ? "" : err.text);
        json_decref(j);
        return 0;
    }
    size_t hl = (size_t)err.position, bin = 0;
    int ok = 1;
    json_t *outs = json_object_get(j, "outputs");
    if (json_object_get(j, "error")) {
        const char *e = json_string_value(json_object_get(j, "error"));
        snprintf(msg, cap, "error in a 200 response: %s", e ? e : "?");
        ok = 0;
    } else if (!json_is_array(outs) || !json_array_size(outs)) {
        snprintf(msg, cap, "response without outputs");
        ok = 0;
    }
    for (int i = 0; ok && i < s->n_outputs; i++) {
        int found = 0;
        for (size_t k = 0; k < json_array_size(outs); k++)
            if (!strcmp(sval(json_object_get(json_array_get(outs, k), "name"), ""), s->outputs[i])) found = 1;
        if (!found) { snprintf(msg, cap, "output %.128s missing from the response", s->outputs[i]); ok = 0; }
    }
    for (size_t k = 0; ok && k < json_array_size(outs); k++) {
        json_t *o = json_array_get(outs, k), *sh = json_object_get(o, "shape");
        json_t *bs = json_object_get(json_object_get(o, "parameters"), "binary_data_size");
        const char *name = sval(json_object_get(o, "name"), "?");
        int64_t elems = 1;
        for (size_t d = 0; d < json_array_size(sh); d++) elems *= json_integer_value(json_array_get(sh, d));
        int es = dtype_size(sval(json_object_get(o, "datatype"), ""));
        if (!json_is_array(sh)) { snprintf(msg, cap, "output %.128s without a shape", name); ok = 0; }
        else if (json_is_integer(bs)) {
            if (es && (int64_t)json_integer_value(bs) != elems * es) {
                snprintf(msg, cap, "output %.128s: binary_data_size %lld for %lld elements of %d bytes", name,
                         (long long)json_integer_value(bs), (long long)elems, es);
                ok = 0;
            }
            bin += (size_t)json_integer_value(bs);
        } else {
            json_t *d = json_object_get(o, "data");
            if (!json_is_array(d) || (int64_t)json_array_size(d) != elems) {
                snprintf(msg, cap, "output %.128s: %zu values for shape of %lld elements", name,
                         json_is_array(d) ? json_array_size(d) : 0, (long long)elems);
                ok = 0;
            }
        }
    }
    if (ok && hl + bin != n) {
        snprintf(msg, cap, "response of %zu bytes, header %zu + binary outputs %zu", n, hl, bin);
        ok = 0;
    }
    json_decref(j);
    return ok;
}

/* ---------------------------------------------------------------- metrics */

/* The value of label `key` in "{k="v",...}" into out (escapes undone). 1: found. */
static int label(const char *lb, size_t n, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key), i = 0;
    while (i < n) {
        while (i < n && (lb[i] == ' ' || lb[i] == ',')) i++;
        size_t k0 = i;
        while (i < n && lb[i] != '=') i++;
        if (i + 1 >= n || lb[i + 1] != '"') return 0;
        int match = i - k0 == kl && !memcmp(lb + k0, key, kl);
        i += 2;
        size_t w = 0;
        while (i < n && lb[i] != '"') {
            char ch = lb[i++];
            if (ch == '\\' && i < n) { ch = lb[i++]; if (ch == 'n') ch = '\n'; }
            if (match && w + 1 < cap) out[w++] = ch;
        }
        if (i >= n) return 0;
        i++;
        if (match) { out[w] = 0; return 1; }
    }
    return 0;
}

static void hist_add_bucket(tb_prom_hist *h, double le, double v) {
    int i = 0;
    while (i < h->n && h->le[i] < le) i++;
    if (i < h->n && h->le[i] == le) { h->cum[i] += v; return; }
    if (h->n >= TB_PROM_MAX_BUCKETS) return;
    memmove(&h->le[i + 1], &h->le[i], (size_t)(h->n - i) * sizeof h->le[0]);
    memmove(&h->cum[i + 1], &h->cum[i], (size_t)(h->n - i) * sizeof h->cum[0]);
    h->le[i] = le;
    h->cum[i] = v;
    h->n++;
}

static void parse_line(const char *line, size_t n, const char *model, tb_ks_metrics *m) {
    static const char pre[] = "turbine_inference_";
    if (n < sizeof pre || memcmp(line, pre, sizeof pre - 1)) return;
    size_t i = 0;
    while (i < n && line[i] != '{' && line[i] != ' ' && line[i] != '\t') i++;
    const char *name = line + sizeof pre - 1;
    size_t nl = i - (sizeof pre - 1);
    const char *lb = "";
    size_t lbn = 0;
    if (i < n && line[i] == '{') {
        size_t j = i + 1;
        int q = 0;
        while (j < n && (q || line[j] != '}')) {
            if (line[j] == '\\') j++;
            else if (line[j] == '"') q = !q;
            j++;
        }
        if (j >= n) return;
        lb = line + i + 1;
        lbn = j - i - 1;
        i = j + 1;
    }
    char vb[64];
    while (i < n && (line[i] == ' ' || line[i] == '\t')) i++;
    size_t v0 = i;
    while (i < n && line[i] != ' ' && line[i] != '\t') i++;
    if (i == v0 || i - v0 >= sizeof vb) return;
    memcpy(vb, line + v0, i - v0);
    vb[i - v0] = 0;
    char *end;
    double v = strtod(vb, &end);
    if (*end || !isfinite(v)) return;
    char lm[TB_KS_MAX_NAME];
    if (model && (!label(lb, lbn, "model", lm, sizeof lm) || strcmp(lm, model))) return;
#define IS(s) (nl == sizeof(s) - 1 && !memcmp(name, s, nl))
    static const struct { const char *base; size_t off; } hs[] = {
        {"batch_size", offsetof(tb_ks_metrics, batch)},
        {"queue_duration_us", offsetof(tb_ks_metrics, queue_us)},
        {"compute_duration_us", offsetof(tb_ks_metrics, compute_us)},
    };
    for (size_t k = 0; k < sizeof hs / sizeof hs[0]; k++) {
        size_t bl = strlen(hs[k].base);
        if (nl <= bl || memcmp(name, hs[k].base, bl)) continue;
        tb_prom_hist *h = (tb_prom_hist *)((char *)m + hs[k].off);
        const char *suf = name + bl;
        size_t sl = nl - bl;
        if (sl == 7 && !memcmp(suf, "_bucket", 7)) {
            char le[64];
            if (!label(lb, lbn, "le", le, sizeof le)) return;
            double b = !strcmp(le, "+Inf") ? INFINITY : strtod(le, &end);
            if (isnan(b)) return;
            hist_add_bucket(h, b, v);
        } else if (sl == 4 && !memcmp(suf, "_sum", 4)) h->sum += v;
        else if (sl == 6 && !memcmp(suf, "_count", 6)) h->count += v;
        else return;
        h->seen = m->seen = 1;
        return;
    }
    if (IS("request_success_total")) m->success += v;
    else if (IS("request_failure_total")) m->failure += v;
    else if (IS("count_total")) m->inferences += v;
    else if (IS("exec_count_total")) m->executions += v;
    else return;
    m->seen = 1;
#undef IS
}

void tb_ks_metrics_parse(const char *text, const char *model, tb_ks_metrics *m) {
    memset(m, 0, sizeof *m);
    m->valid = 1;
    const char *p = text;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        size_t k = n;
        while (k && (p[k - 1] == '\r' || p[k - 1] == ' ')) k--;
        if (k && k <= TB_PROM_MAX_LINE && p[0] != '#') parse_line(p, k, model, m);
        p = nl ? nl + 1 : NULL;
    }
}

static int hist_delta(const tb_prom_hist *a, const tb_prom_hist *b, tb_prom_hist *d) {
    memset(d, 0, sizeof *d);
    d->seen = a->seen;
    int ok = 1;
    for (int i = 0; i < a->n; i++) {
        double before = 0;
        for (int k = 0; k < b->n; k++)
            if (b->le[k] == a->le[i]) before = b->cum[k];
        d->le[i] = a->le[i];
        d->cum[i] = a->cum[i] - before;
        if (d->cum[i] < 0) ok = 0;
    }
    d->n = a->n;
    d->sum = a->sum - b->sum;
    d->count = a->count - b->count;
    if (d->count < 0) ok = 0;
    return ok;
}

void tb_ks_metrics_delta(const tb_ks_metrics *after, const tb_ks_metrics *before, tb_ks_metrics *d) {
    memset(d, 0, sizeof *d);
    d->seen = after->seen;
    int ok = hist_delta(&after->batch, &before->batch, &d->batch);
    ok &= hist_delta(&after->queue_us, &before->queue_us, &d->queue_us);
    ok &= hist_delta(&after->compute_us, &before->compute_us, &d->compute_us);
    d->success = after->success - before->success;
    d->failure = after->failure - before->failure;
    d->inferences = after->inferences - before->inferences;
    d->executions = after->executions - before->executions;
    if (d->success < 0 || d->failure < 0 || d->inferences < 0 || d->executions < 0) ok = 0;
    d->valid = ok;
}

double tb_prom_mean(const tb_prom_hist *h) { return h->count > 0 ? h->sum / h->count : NAN; }

double tb_prom_quantile(const tb_prom_hist *h, double q) {
    if (h->n == 0 || h->count <= 0) return NAN;
    double total = h->cum[h->n - 1], rank = q * total;
    if (total <= 0) return NAN;
    for (int i = 0; i < h->n; i++) {
        if (h->cum[i] < rank) continue;
        double lo = i ? h->le[i - 1] : 0, below = i ? h->cum[i - 1] : 0;
        if (isinf(h->le[i])) return lo;
        if (i == 0 && h->le[0] <= 0) return h->le[0];
        double in = h->cum[i] - below;
        return in > 0 ? lo + (h->le[i] - lo) * (rank - below) / in : h->le[i];
    }
    return h->le[h->n - 1];
}
