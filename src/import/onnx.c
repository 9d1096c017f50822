/*
 * onnx.c — the ONNX front end (onnx.h): a ModelProto read with protobuf-c
 * (code generated at build time from python3-onnx's onnx.proto) into a
 * general graph whose node attributes follow ops_nn.h.
 *
 * The file is checked before protobuf-c sees it (size, and a walk of the wire
 * format that bounds the nesting of messages: protobuf-c's unpack recurses
 * without a limit), then unpacked. Every count, dim and byte size read from
 * it is checked before it is used.
 *
 * Import runs in three steps:
 *   1. the graph's inputs (symbols and their profiles from the shape specs)
 *      and initializers (weights);
 *   2. a static check of every node (domain, op type, attribute names, types
 *      and values, outputs this importer cannot produce): every refusal is
 *      collected, so one message lists all the nodes a model needs;
 *   3. the nodes in order, attributes translated with the ranks the shape
 *      rules computed (axes normalised); refusals that need those ranks are
 *      collected too, and the nodes that read a refused node's outputs are
 *      skipped.
 */
#include "import/onnx.h"
#include "ir/ops.h"
#include "ir/ops_nn.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>

/* ---------------------------------------------------------------- shape specs */

static tb_status parse_dims(const char *s, size_t n, int64_t *dims, int *rank, const char *name) {
    *rank = 0;
    size_t i = 0;
    /* no dims: a scalar */
    while (i < n) {
        if (*rank >= TB_MAX_RANK)
            return tb_errorf(TB_ERR_INVALID_ARG, "shape of '%s' has more than %d dims", name, TB_MAX_RANK);
        if (!isdigit((unsigned char)s[i]))
            return tb_errorf(TB_ERR_INVALID_ARG, "shape of '%s': '%.*s' is not NxNx... with whole numbers", name,
                             (int)n, s);
        int64_t v = 0;
        while (i < n && isdigit((unsigned char)s[i])) {
            v = v * 10 + (s[i++] - '0');
            if (v > ((int64_t)1 << 31))
                return tb_errorf(TB_ERR_INVALID_ARG, "shape of '%s': a dim is larger than 2^31", name);
        }
        dims[(*rank)++] = v;
        if (i < n) {
            if (s[i] != 'x' && s[i] != 'X')
                return tb_errorf(TB_ERR_INVALID_ARG, "shape of '%s': '%.*s' is not NxNx... with whole numbers", name,
                                 (int)n, s);
            if (++i == n)
                return tb_errorf(TB_ERR_INVALID_ARG, "shape of '%s': '%.*s' ends with 'x'", name, (int)n, s);
        }
    }
    return TB_OK;
}

tb_status tb_onnx_parse_shapes(const char *text, int which, tb_onnx_shape_spec *specs, int *n_specs, int cap) {
    if (!text || !specs || !n_specs || which < 0 || which > 3 || *n_specs < 0 || *n_specs > cap)
        return tb_errorf(TB_ERR_INVALID_ARG, "tb_onnx_parse_shapes: bad arguments");
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        /* the last ':' splits: names such as "input:0" keep theirs */
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (p[i] == ':') colon = p + i;
        if (!colon || colon == p)
            return tb_errorf(TB_ERR_INVALID_ARG, "'%.*s' is not name:NxNx... (e.g. input:1x3x224x224)", (int)len, p);
        size_t nl = (size_t)(colon - p);
        if (nl >= TB_NAME_LEN)
            return tb_errorf(TB_ERR_INVALID_ARG, "input name '%.*s...' is longer than %d characters", 40, p,
                             TB_NAME_LEN - 1);
        char name[TB_NAME_LEN];
        memcpy(name, p, nl);
        name[nl] = 0;
        int64_t dims[TB_MAX_RANK];
        int rank;
        TB_TRY(parse_dims(colon + 1, len - nl - 1, dims, &rank, name));
        tb_onnx_shape_spec *s = NULL;
        for (int i = 0; i < *n_specs; i++)
            if (!strcmp(specs[i].name, name)) s = &specs[i];
        if (!s) {
            if (*n_specs >= cap) return tb_errorf(TB_ERR_INVALID_ARG, "more than %d input shapes", cap);
            s = &specs[(*n_specs)++];
            memset(s, 0, sizeof *s);
            memcpy(s->name, name, nl + 1);
            s->rank = rank;
            memcpy(s->min, dims, sizeof dims);
            memcpy(s->opt, dims, sizeof dims);
            memcpy(s->max, dims, sizeof dims);
        } else if (s->rank != rank) {
            return tb_errorf(TB_ERR_INVALID_ARG, "input '%s' is given %d dims here and %d elsewhere", name, rank,
                             s->rank);
        }
        if (which == 0 || which == 3) memcpy(s->min, dims, sizeof dims);
        if (which == 1 || which == 3) memcpy(s->opt, dims, sizeof dims);
        if (which == 2 || which == 3) memcpy(s->max, dims, sizeof dims);
        p += len;
        if (*p == ',') p++;
    }
    return TB_OK;
}

#ifndef TB_HAVE_ONNX
/* ---------------------------------------------------------------- compiled out */
#ifndef TB_ONNX_MISSING
#define TB_ONNX_MISSING "protobuf-c-compiler, libprotobuf-c-dev or python3-onnx"
#endif

static tb_status not_built(void) {
    return tb_errorf(TB_ERR_UNSUPPORTED,
                     "ONNX import is not in this build: %s was missing when it was built (install it and rebuild)",
                     TB_ONNX_MISSING);
}

tb_status tb_onnx_import(const char *path, const tb_onnx_options *o, tb_graph **out) {
    *out = NULL;
    return not_built();
}

tb_status tb_onnx_import_buffer(const void *buf, size_t n, const char *base_dir, const tb_onnx_options *o,
                                tb_graph **out) {
    *out = NULL;
    return not_built();
}

char *tb_onnx_supported_ops(void) { return calloc(1, 1); }

tb_status tb_onnx_read_tensor(const char *path, tb_tensor *out, char *name, size_t name_cap) {
    memset(out, 0, sizeof *out);
    if (name && name_cap) name[0] = 0;
    return not_built();
}

tb_status tb_onnx_write_tensor(const char *path, const char *name, const tb_tensor *t) { return not_built(); }

#else /* TB_HAVE_ONNX */

#include "onnx.pb-c.h"

#define ONNX_MAX_FILE ((size_t)INT32_MAX) /* protobuf's 2 GiB limit       */
#define ONNX_MAX_DEPTH 64                 /* nested messages (subgraphs)  */
#define ONNX_OPSET_MIN 13
#define ONNX_OPSET_MAX 21
#define ONNX_MSG_CAP 900                  /* the part of tb_last_error() the node list may fill */

/* ---------------------------------------------------------------- supported ops */

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

char *tb_onnx_supported_ops(void) {
    const char *names[TB_OP_COUNT + 2];
    int n = 0;
    size_t len = 1;
    for (int k = TB_OP_NN_FIRST; k < TB_OP_COUNT; k++) {
        const char *o = tb_nn_onnx_name((tb_op_kind)k);
        if (o && tb_op_get_def((tb_op_kind)k)) names[n++] = o;
    }
    names[n++] = "Constant";
    if (tb_op_get_def(TB_OP_IDENTITY)) names[n++] = "Dropout";
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) len += strlen(names[i]) + 1;
    char *s = malloc(len), *p = s;
    if (!s) return NULL;
    for (int i = 0; i < n; i++) p += sprintf(p, "%s\n", names[i]);
    *p = 0;
    return s;
}

/* ---------------------------------------------------------------- wire check
 * A walk of the protobuf wire format along onnx.proto's message fields: every
 * length inside its parent, no groups, nesting at most ONNX_MAX_DEPTH. */

static int wire_varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v) {
    *v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (*i >= n) return 0;
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) return 1;
    }
    return 0;
}

static int wire_ok(const uint8_t *p, size_t n, const ProtobufCMessageDescriptor *d, int depth) {
    if (depth > ONNX_MAX_DEPTH) return 0;
    size_t i = 0;
    while (i < n) {
        uint64_t key, v;
        if (!wire_varint(p, n, &i, &key)) return 0;
        switch (key & 7) {
        case 0: if (!wire_varint(p, n, &i, &v)) return 0; break;
        case 1: if (n - i < 8) return 0; i += 8; break;
        case 5: if (n - i < 4) return 0; i += 4; break;
        case 2: {
            if (!wire_varint(p, n, &i, &v) || v > n - i) return 0;
            const ProtobufCFieldDescriptor *f =
                d && (key >> 3) <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && !wire_ok(p + i, (size_t)v, f->descriptor, depth + 1))
                return 0;
            i += (size_t)v;
            break;
        }
        default: return 0; /* groups (3, 4) are not in onnx.proto; 6, 7 are not wire types */
        }
    }
    return 1;
}

/* protobuf-c allocates with these, so a tensor's raw_data can be handed to the
 * graph (which frees owned weights with free()) instead of copied. */
static void *pb_alloc(void *ud, size_t n) { return malloc(n ? n : 1); }
static void pb_free(void *ud, void *p) { free(p); }
static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* ---------------------------------------------------------------- string map
 * Open addressing, keys copied: ONNX value name -> value index, and the set of
 * value names the graph already holds. */

typedef struct {
    char **keys;
    int *vals;
    size_t cap, n;
} strmap;

static void strmap_free(strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t strmap_slot(const strmap *m, const char *k) {
    size_t i = (size_t)tb_hash64(k, strlen(k)) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], k)) i = (i + 1) & (m->cap - 1);
    return i;
}

static int strmap_get(const strmap *m, const char *k, int *v) {
    if (!m->cap) return 0;
    size_t i = strmap_slot(m, k);
    if (!m->keys[i]) return 0;
    if (v) *v = m->vals[i];
    return 1;
}

static tb_status strmap_put(strmap *m, const char *k, int v) {
    if ((m->n + 1) * 2 > m->cap) {
        strmap old = *m;
        m->cap = old.cap ? old.cap * 2 : 256;
        m->keys = calloc(m->cap, sizeof *m->keys);
        m->vals = calloc(m->cap, sizeof *m->vals);
        if (!m->keys || !m->vals) {
            free(m->keys);
            free(m->vals);
            *m = old;
            return tb_errorf(TB_ERR_OOM, "out of memory (name table)");
        }
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i]) {
                size_t j = strmap_slot(m, old.keys[i]);
                m->keys[j] = old.keys[i];
                m->vals[j] = old.vals[i];
            }
        free(old.keys);
        free(old.vals);
    }
    size_t i = strmap_slot(m, k);
    if (!m->keys[i]) {
        if (!(m->keys[i] = strdup(k))) return tb_errorf(TB_ERR_OOM, "out of memory (name table)");
        m->n++;
    }
    m->vals[i] = v;
    return TB_OK;
}

/* ---------------------------------------------------------------- importer state */

#define VAL_REFUSED (-2) /* a value a refused node would have written */

typedef struct {
    char *location;
    tb_mapped_file map;
} ext_file;

typedef struct {
    const char *label;    /* the model's path (or "ONNX model") for messages */
    const char *base_dir; /* external data folder; NULL: refused             */
    const tb_onnx_options *opt;
    Onnx__ModelProto *m;
    Onnx__GraphProto *gp;
    tb_graph *g;
    int opset;            /* of the default domain                           */
    strmap values;        /* ONNX name -> value index (or VAL_REFUSED)       */
    strmap names;         /* graph value names taken                         */
    strmap used;          /* ONNX names some node or graph output reads      */
    ext_file *ext;
    int n_ext;
    char **reasons;       /* refused nodes, "node 'x' (op Y): why"           */
    int n_reasons;
} imp;

static void imp_free(imp *s) {
    strmap_free(&s->values);
    strmap_free(&s->names);
    strmap_free(&s->used);
    for (int i = 0; i < s->n_ext; i++) {
        free(s->ext[i].location);
        tb_file_unmap(&s->ext[i].map);
    }
    free(s->ext);
    for (int i = 0; i < s->n_reasons; i++) free(s->reasons[i]);
    free(s->reasons);
}

static const char *str_or(const char *s, const char *def) { return s && *s ? s : def; }

/* "node 'conv1' (op Conv)", or by index and first output when unnamed */
static void node_label(const Onnx__NodeProto *n, int k, char *buf, size_t cap) {
    const char *op = str_or(n->op_type, "?");
    if (n->name && *n->name)
        snprintf(buf, cap, "node '%.80s' (op %.40s)", n->name, op);
    else if (n->n_output && n->output[0] && *n->output[0])
        snprintf(buf, cap, "node %d (op %.40s, output '%.80s')", k, op, n->output[0]);
    else
        snprintf(buf, cap, "node %d (op %.40s)", k, op);
}

/* Records that node k is refused; returns TB_OK (the import goes on to find
 * the others) or TB_ERR_OOM. */
static tb_status refuse(imp *s, const Onnx__NodeProto *n, int k, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static tb_status refuse(imp *s, const Onnx__NodeProto *n, int k, const char *fmt, ...) {
    char why[300], label[256], *r;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    node_label(n, k, label, sizeof label);
    char **p = realloc(s->reasons, (size_t)(s->n_reasons + 1) * sizeof *p);
    if (!p) return tb_errorf(TB_ERR_OOM, "out of memory");
    s->reasons = p;
    size_t len = strlen(label) + strlen(why) + 3;
    if (!(r = malloc(len))) return tb_errorf(TB_ERR_OOM, "out of memory");
    snprintf(r, len, "%s: %s", label, why);
    s->reasons[s->n_reasons++] = r;
    return TB_OK;
}

/* One message listing every refused node (as many as fit; the rest logged). */
static tb_status report_refused(imp *s) {
    char msg[ONNX_MSG_CAP + 1];
    size_t n = (size_t)snprintf(msg, sizeof msg, "%d node%s not supported: ", s->n_reasons,
                                s->n_reasons == 1 ? " is" : "s are");
    int shown = 0;
    for (; shown < s->n_reasons; shown++) {
        size_t need = strlen(s->reasons[shown]) + 2;
        if (n + need + 40 > ONNX_MSG_CAP && shown > 0) break;
        n += (size_t)snprintf(msg + n, sizeof msg - n, "%s%s", shown ? "; " : "", s->reasons[shown]);
        if (n >= sizeof msg) n = sizeof msg - 1;
    }
    if (shown < s->n_reasons) {
        snprintf(msg + n, sizeof msg - n, "; and %d more (logged)", s->n_reasons - shown);
        for (int i = shown; i < s->n_reasons; i++) tb_log(TB_LOG_WARN, "%s: %s", s->label, s->reasons[i]);
    }
    return tb_errorf(TB_ERR_UNSUPPORTED, "%s: %s", s->label, msg);
}

/* A graph value name for ONNX name `on` (or a made-up one): the name itself
 * when it fits and is free, else a shortened one made unique with a hash. */
static tb_status take_name(imp *s, const char *on, char out[TB_NAME_LEN]) {
    size_t len = strlen(on);
    if (len < TB_NAME_LEN && len > 0 && !strmap_get(&s->names, on, NULL)) {
        memcpy(out, on, len + 1);
        return strmap_put(&s->names, out, 1);
    }
    unsigned h = (unsigned)tb_hash64(on, len);
    for (unsigned salt = 0; salt < 1000; salt++) {
        char suffix[32];
        int sl = salt ? snprintf(suffix, sizeof suffix, "~%08x.%u", h, salt) : snprintf(suffix, sizeof suffix, "~%08x", h);
        int keep = TB_NAME_LEN - 1 - sl;
        if ((size_t)keep > len) keep = (int)len;
        snprintf(out, TB_NAME_LEN, "%.*s%s", keep, on, suffix);
        if (!strmap_get(&s->names, out, NULL)) return strmap_put(&s->names, out, 1);
    }
    return tb_errorf(TB_ERR_INTERNAL, "%s: no free value name for '%.40s'", s->label, on);
}

/* ---------------------------------------------------------------- dtypes */

static const char *onnx_type_name(int t) {
    static const char *const names[] = {"UNDEFINED", "FLOAT",  "UINT8",     "INT8",       "UINT16", "INT16",
                                        "INT32",     "INT64",  "STRING",    "BOOL",       "FLOAT16", "DOUBLE",
                                        "UINT32",    "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16"};
    if (t >= 0 && t < (int)(sizeof names / sizeof names[0])) return names[t];
    if (t == 17) return "FLOAT8E4M3FN";
    if (t == 18) return "FLOAT8E4M3FNUZ";
    if (t == 19) return "FLOAT8E5M2";
    if (t == 20) return "FLOAT8E5M2FNUZ";
    if (t == 21) return "UINT4";
    if (t == 22) return "INT4";
    return "an unknown type";
}

#define ONNX_TYPES_SUPPORTED "FLOAT, FLOAT16, BFLOAT16, DOUBLE, INT64, INT32, INT8, UINT8, BOOL"

static int onnx_dtype(int t, tb_dtype *out) {
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: *out = TB_F32; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: *out = TB_F16; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: *out = TB_BF16; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: *out = TB_F64; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: *out = TB_I64; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: *out = TB_I32; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: *out = TB_I8; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: *out = TB_U8; return 1;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: *out = TB_BOOL; return 1;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- tensors */

static tb_status parse_u64(const char *v, uint64_t *out) {
    if (!v || !*v) return TB_ERR_FORMAT;
    uint64_t x = 0;
    for (const char *p = v; *p; p++) {
        if (!isdigit((unsigned char)*p) || x > (UINT64_MAX - 9) / 10) return TB_ERR_FORMAT;
        x = x * 10 + (uint64_t)(*p - '0');
    }
    *out = x;
    return TB_OK;
}

/* location must stay inside the model's folder: relative, no ".." part */
static int location_ok(const char *loc) {
    if (!*loc || loc[0] == '/' || loc[0] == '\\') return 0;
    const char *p = loc;
    while (*p) {
        const char *e = p;
        while (*e && *e != '/' && *e != '\\') e++;
        if (e - p == 2 && p[0] == '.' && p[1] == '.') return 0;
        p = *e ? e + 1 : e;
    }
    return 1;
}

static tb_status ext_map(imp *s, const char *tname, const char *loc, const tb_mapped_file **out) {
    for (int i = 0; i < s->n_ext; i++)
        if (!strcmp(s->ext[i].location, loc)) {
            *out = &s->ext[i].map;
            return TB_OK;
        }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", s->base_dir, loc) >= sizeof path)
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s': external data path is too long", s->label, tname);
    ext_file *p = realloc(s->ext, (size_t)(s->n_ext + 1) * sizeof *p);
    if (!p) return tb_errorf(TB_ERR_OOM, "out of memory");
    s->ext = p;
    ext_file *e = &s->ext[s->n_ext];
    memset(e, 0, sizeof *e);
    e->map.fd = -1;
    if (!(e->location = strdup(loc))) return tb_errorf(TB_ERR_OOM, "out of memory");
    tb_status st = tb_file_map(path, &e->map);
    if (st != TB_OK) {
        free(e->location);
        return tb_error_prefix(st, "%s: tensor '%s': external data", s->label, tname);
    }
    s->n_ext++;
    *out = &e->map;
    return TB_OK;
}

static tb_status read_external(imp *s, Onnx__TensorProto *t, const char *tname, uint64_t nbytes, void *dst) {
    const char *loc = NULL;
    uint64_t off = 0, len = 0;
    int has_len = 0;
    for (size_t i = 0; i < t->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = t->external_data[i];
        if (!e || !e->key) continue;
        if (!strcmp(e->key, "location")) loc = e->value;
        else if (!strcmp(e->key, "offset")) {
            if (parse_u64(e->value, &off) != TB_OK)
                return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s': external data offset '%.40s' is not a number",
                                 s->label, tname, str_or(e->value, ""));
        } else if (!strcmp(e->key, "length")) {
            if (parse_u64(e->value, &len) != TB_OK)
                return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s': external data length '%.40s' is not a number",
                                 s->label, tname, str_or(e->value, ""));
            has_len = 1;
        } /* checksum and others: not needed to read */
    }
    if (!loc || !*loc)
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' is external but names no location", s->label, tname);
    if (!location_ok(loc))
        return tb_errorf(TB_ERR_FORMAT,
                         "%s: tensor '%s': external data location '%.200s' leaves the model's folder (absolute or "
                         "with '..')",
                         s->label, tname, loc);
    if (!s->base_dir)
        return tb_errorf(TB_ERR_INVALID_ARG, "%s: tensor '%s' has external data and no folder was given to find it",
                         s->label, tname);
    if (has_len && len != nbytes)
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s': external data length %llu, the shape needs %llu bytes",
                         s->label, tname, (unsigned long long)len, (unsigned long long)nbytes);
    const tb_mapped_file *f;
    TB_TRY(ext_map(s, tname, loc, &f));
    if (off > f->size || nbytes > f->size - off)
        return tb_errorf(TB_ERR_FORMAT,
                         "%s: tensor '%s': external data [%llu, +%llu) is past the end of %s (%zu bytes)", s->label,
                         tname, (unsigned long long)off, (unsigned long long)nbytes, loc, f->size);
    if (nbytes && dst) memcpy(dst, f->data + off, (size_t)nbytes); /* dst NULL: check only */
    return TB_OK;
}

/* The contents of a TensorProto, checked: dtype, shape and a malloc'd copy
 * of its data (taken from raw_data without a copy where it can). */
static tb_status tensor_data(imp *s, Onnx__TensorProto *t, const char *tname, tb_dtype *dt_out, int *rank_out,
                             int64_t *dims_out, void **data_out, uint64_t *nbytes_out) {
    tb_dtype dt;
    int type = t->has_data_type ? t->data_type : 0;
    if (!onnx_dtype(type, &dt))
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: tensor '%s' has data type %s, which is not supported (" ONNX_TYPES_SUPPORTED ")",
                         s->label, tname, onnx_type_name(type));
    if (t->n_dims > TB_MAX_RANK)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: tensor '%s' has rank %zu (at most %d)", s->label, tname, t->n_dims,
                         TB_MAX_RANK);
    if (t->segment) return tb_errorf(TB_ERR_UNSUPPORTED, "%s: tensor '%s' is segmented", s->label, tname);
    int rank = (int)t->n_dims;
    int64_t dims[TB_MAX_RANK] = {0};
    uint64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        if (t->dims[i] < 0 || t->dims[i] > ((int64_t)1 << 40))
            return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' has dim %lld", s->label, tname, (long long)t->dims[i]);
        dims[i] = t->dims[i];
        if (dims[i] && numel > (UINT64_MAX >> 4) / (uint64_t)dims[i])
            return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s': its size overflows", s->label, tname);
        numel *= (uint64_t)dims[i];
    }
    uint64_t nbytes;
    if (tb_dtype_tensor_bytes(dt, rank, dims, &nbytes) != TB_OK || nbytes > ((uint64_t)1 << 40))
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s': bad size", s->label, tname);
    size_t typed = t->n_float_data + t->n_int32_data + t->n_int64_data + t->n_double_data + t->n_uint64_data +
                   t->n_string_data;
    int external = t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    if ((external || t->has_raw_data) && typed)
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' has both %s data and typed fields", s->label, tname,
                         external ? "external" : "raw");
    void *data = NULL;
    if (t->has_raw_data && !external) {
        if (t->raw_data.len != nbytes)
            return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' has %zu bytes of raw data, its shape and type need %llu",
                             s->label, tname, t->raw_data.len, (unsigned long long)nbytes);
        if (nbytes) { /* protobuf-c malloc'd it (pb_allocator): the graph takes it */
            data = t->raw_data.data;
            t->raw_data.data = NULL;
            t->raw_data.len = 0;
        }
    }
    /* typed fields: one entry per element, checked before anything the
     * shape claims is allocated (a crafted shape must not reserve memory) */
    if (!data && !external && numel) {
        size_t have = dt == TB_F32 ? t->n_float_data : dt == TB_F64 ? t->n_double_data
                    : dt == TB_I64 ? t->n_int64_data : t->n_int32_data;
        if (have != numel || typed != have) {
            if (!typed) return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' has no data", s->label, tname);
            return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' (%s, %llu elements) has %zu typed entries%s", s->label,
                             tname, onnx_type_name(type), (unsigned long long)numel, have,
                             typed != have ? " and data in other fields" : "");
        }
    }
    if (external) TB_TRY(read_external(s, t, tname, nbytes, NULL)); /* the file holds it: then allocate */
    if (!data && !(data = malloc(nbytes ? (size_t)nbytes : 1)))
        return tb_errorf(TB_ERR_OOM, "%s: out of memory reading tensor '%s'", s->label, tname);
    if (external) {
        tb_status st = read_external(s, t, tname, nbytes, data);
        if (st != TB_OK) { free(data); return st; }
    } else if (!t->has_raw_data && numel) {
        /* the typed field this dtype is stored in, with one entry per element */
        size_t have = 0;
        const char *field = "float_data";
        switch (dt) {
        case TB_F32: have = t->n_float_data; break;
        case TB_F64: have = t->n_double_data; field = "double_data"; break;
        case TB_I64: have = t->n_int64_data; field = "int64_data"; break;
        default: have = t->n_int32_data; field = "int32_data"; break;
        }
        if (have != numel || typed != have) {
            free(data);
            if (!typed) return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' has no data", s->label, tname);
            return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' (%s, %llu elements) has %zu entries in %s%s", s->label,
                             tname, onnx_type_name(type), (unsigned long long)numel, have, field,
                             typed != have ? " and data in other fields" : "");
        }
        switch (dt) {
        case TB_F32: memcpy(data, t->float_data, numel * 4); break;
        case TB_F64: memcpy(data, t->double_data, numel * 8); break;
        case TB_I64: memcpy(data, t->int64_data, numel * 8); break;
        case TB_I32: memcpy(data, t->int32_data, numel * 4); break;
        case TB_F16: case TB_BF16:
            for (uint64_t i = 0; i < numel; i++) ((uint16_t *)data)[i] = (uint16_t)t->int32_data[i];
            break;
        case TB_I8: for (uint64_t i = 0; i < numel; i++) ((int8_t *)data)[i] = (int8_t)t->int32_data[i]; break;
        case TB_U8: for (uint64_t i = 0; i < numel; i++) ((uint8_t *)data)[i] = (uint8_t)t->int32_data[i]; break;
        case TB_BOOL: for (uint64_t i = 0; i < numel; i++) ((uint8_t *)data)[i] = t->int32_data[i] != 0; break;
        default: TB_ASSERT(0);
        }
    } else if (!t->has_raw_data && typed) {
        free(data);
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor '%s' has no elements and %zu data entries", s->label, tname,
                         typed);
    }
    if (dt == TB_BOOL) /* one byte per element, 0 or 1 */
        for (uint64_t i = 0; i < numel; i++) ((uint8_t *)data)[i] = ((uint8_t *)data)[i] != 0;
    *dt_out = dt;
    *rank_out = rank;
    memcpy(dims_out, dims, sizeof(int64_t) * TB_MAX_RANK);
    *data_out = data;
    *nbytes_out = nbytes;
    return TB_OK;
}

/* A TensorProto (initializer or constant) as a weight named `vname`; returns
 * the value index in *id. */
static tb_status tensor_weight(imp *s, Onnx__TensorProto *t, const char *tname, const char *vname, int *id) {
    tb_dtype dt;
    int rank;
    int64_t dims[TB_MAX_RANK];
    void *data;
    uint64_t nbytes;
    TB_TRY(tensor_data(s, t, tname, &dt, &rank, dims, &data, &nbytes));
    *id = tb_graph_add_weight(s->g, vname, dt, rank, dims, data, 1);
    if (*id < 0) return tb_error_prefix(tb_last_status(), "%s: tensor '%s'", s->label, tname);
    return TB_OK;
}

/* A small constant made by the importer (fills of optional inputs). */
static tb_status add_const(imp *s, const char *base, const char *suffix, tb_dtype dt, int rank, const int64_t *dims,
                           const void *src, size_t nbytes, int *id) {
    char on[TB_NAME_LEN * 2], name[TB_NAME_LEN];
    snprintf(on, sizeof on, "%.*s.%s", TB_NAME_LEN - 20, base, suffix);
    TB_TRY(take_name(s, on, name));
    void *data = malloc(nbytes ? nbytes : 1);
    if (!data) return tb_errorf(TB_ERR_OOM, "out of memory");
    memcpy(data, src, nbytes);
    *id = tb_graph_add_weight(s->g, name, dt, rank, dims, data, 1);
    return *id < 0 ? tb_last_status() : TB_OK;
}

/* ---------------------------------------------------------------- inputs and symbols */

typedef struct {
    char param[256];   /* dim_param, or "" for an unnamed dim            */
    int has_profile;
    int64_t min, opt, max;
    const char *input; /* where it first appears, for messages           */
    int dim;
} sym_info;

/* A spec names its input, or its position as "#K" (K-th graph input). */
static int spec_is(const tb_onnx_shape_spec *sp, const char *name, int k) {
    if (sp->name[0] == '#' && isdigit((unsigned char)sp->name[1])) {
        char *end;
        long v = strtol(sp->name + 1, &end, 10);
        if (!*end) return v == k;
    }
    return !strcmp(sp->name, name);
}

static const tb_onnx_shape_spec *find_spec(const imp *s, const char *name, int k) {
    if (!s->opt || !s->opt->shapes) return NULL;
    for (int i = 0; i < s->opt->n_shapes; i++)
        if (spec_is(&s->opt->shapes[i], name, k)) return &s->opt->shapes[i];
    return NULL;
}

static int is_initializer(const imp *s, const char *name) {
    for (size_t i = 0; i < s->gp->n_initializer; i++)
        if (s->gp->initializer[i] && s->gp->initializer[i]->name && !strcmp(s->gp->initializer[i]->name, name))
            return 1;
    return 0;
}

static tb_status new_sym(imp *s, sym_info *syms, int *n_syms, const char *param, const char *input, int dim,
                         int *out) {
    if (param && *param)
        for (int i = 0; i < *n_syms; i++)
            if (!strcmp(syms[i].param, param)) { *out = i; return TB_OK; }
    if (*n_syms >= TB_MAX_SYMS)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: input '%s' dim %d: more than %d symbolic dims in the model's inputs",
                         s->label, input, dim, TB_MAX_SYMS);
    sym_info *y = &syms[*n_syms];
    memset(y, 0, sizeof *y);
    snprintf(y->param, sizeof y->param, "%s", param ? param : "");
    y->input = input;
    y->dim = dim;
    *out = (*n_syms)++;
    return TB_OK;
}

static tb_status set_profile(imp *s, sym_info *y, const char *input, int d, int64_t mn, int64_t op, int64_t mx) {
    if (mn < 1 || mn > op || op > mx || mx > (1 << 24))
        return tb_errorf(TB_ERR_INVALID_ARG, "%s: input '%s' dim %d: the range min %lld, opt %lld, max %lld is not "
                         "1 <= min <= opt <= max <= 2^24", s->label, input, d, (long long)mn, (long long)op,
                         (long long)mx);
    if (y->has_profile && (y->min != mn || y->opt != op || y->max != mx))
        return tb_errorf(TB_ERR_INVALID_ARG, "%s: dim '%s' gets two ranges: %lld/%lld/%lld (input '%s') and "
                         "%lld/%lld/%lld (input '%s')", s->label, y->param, (long long)y->min, (long long)y->opt,
                         (long long)y->max, y->input, (long long)mn, (long long)op, (long long)mx, input);
    y->has_profile = 1;
    y->min = mn; y->opt = op; y->max = mx;
    return TB_OK;
}

static tb_status import_inputs(imp *s) {
    const Onnx__GraphProto *gp = s->gp;
    sym_info syms[TB_MAX_SYMS];
    int n_syms = 0;
    /* per graph input: its dims as numbers or symbol indices (TB_SYM) */
    typedef struct { const char *name; tb_dtype dt; int rank; int64_t dims[TB_MAX_RANK]; } in_info;
    in_info ins[TB_MAX_IO];
    int n_in = 0;
    if (s->opt && s->opt->n_shapes > 0 && !s->opt->shapes)
        return tb_errorf(TB_ERR_INVALID_ARG, "tb_onnx_import: n_shapes without shapes");
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (!vi || !vi->name || !*vi->name) return tb_errorf(TB_ERR_FORMAT, "%s: graph input %zu has no name", s->label, i);
        if (is_initializer(s, vi->name)) continue; /* a weight with a default: IR >= 4 reads it as constant */
        if (n_in >= TB_MAX_IO)
            return tb_errorf(TB_ERR_UNSUPPORTED, "%s: more than %d graph inputs", s->label, TB_MAX_IO);
        in_info *x = &ins[n_in++];
        x->name = vi->name;
        const Onnx__TypeProto *tp = vi->type;
        if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
            return tb_errorf(TB_ERR_UNSUPPORTED, "%s: input '%s' is not a tensor", s->label, vi->name);
        int et = tp->tensor_type->has_elem_type ? tp->tensor_type->elem_type : 0;
        if (!onnx_dtype(et, &x->dt))
            return tb_errorf(TB_ERR_UNSUPPORTED, "%s: input '%s' has data type %s, which is not supported (" ONNX_TYPES_SUPPORTED ")",
                             s->label, vi->name, onnx_type_name(et));
        const tb_onnx_shape_spec *sp = find_spec(s, vi->name, n_in - 1);
        const Onnx__TensorShapeProto *sh = tp->tensor_type->shape;
        if (!sh && !sp)
            return tb_errorf(TB_ERR_INVALID_ARG, "%s: input '%s' has no shape in the model: give it with --shapes %s:NxN...",
                             s->label, vi->name, vi->name);
        x->rank = sh ? (int)sh->n_dim : sp->rank;
        if (sh && sh->n_dim > TB_MAX_RANK)
            return tb_errorf(TB_ERR_UNSUPPORTED, "%s: input '%s' has rank %zu (at most %d)", s->label, vi->name,
                             sh->n_dim, TB_MAX_RANK);
        if (sp && sp->rank != x->rank)
            return tb_errorf(TB_ERR_INVALID_ARG, "%s: input '%s' has %d dims, the shape given has %d", s->label,
                             vi->name, x->rank, sp->rank);
        for (int d = 0; d < x->rank; d++) {
            const Onnx__TensorShapeProto__Dimension *dm = sh ? sh->dim[d] : NULL;
            if (sh && !dm) return tb_errorf(TB_ERR_FORMAT, "%s: input '%s': dim %d is missing", s->label, vi->name, d);
            if (dm && dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
                if (dm->dim_value < 0 || dm->dim_value > ((int64_t)1 << 31))
                    return tb_errorf(TB_ERR_FORMAT, "%s: input '%s' dim %d is %lld", s->label, vi->name, d,
                                     (long long)dm->dim_value);
                x->dims[d] = dm->dim_value;
                if (sp && (sp->min[d] != dm->dim_value || sp->opt[d] != dm->dim_value || sp->max[d] != dm->dim_value))
                    return tb_errorf(TB_ERR_INVALID_ARG, "%s: input '%s' dim %d is %lld in the model, the shapes given "
                                     "say %lld/%lld/%lld", s->label, vi->name, d, (long long)dm->dim_value,
                                     (long long)sp->min[d], (long long)sp->opt[d], (long long)sp->max[d]);
                continue;
            }
            const char *param = dm && dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
                                    ? dm->dim_param : NULL;
            if (!dm && sp && sp->min[d] == sp->max[d]) { /* no shape in the model: the spec's fixed dims */
                x->dims[d] = sp->min[d];
                continue;
            }
            int y = 0;
            TB_TRY(new_sym(s, syms, &n_syms, param, vi->name, d, &y));
            x->dims[d] = TB_SYM(y);
            if (sp) TB_TRY(set_profile(s, &syms[y], vi->name, d, sp->min[d], sp->opt[d], sp->max[d]));
        }
    }
    /* every shape given names an input */
    for (int i = 0; s->opt && i < s->opt->n_shapes; i++) {
        int found = 0;
        for (int k = 0; k < n_in && !found; k++) found = spec_is(&s->opt->shapes[i], ins[k].name, k);
        if (!found) {
            char list[400];
            size_t n = 0;
            list[0] = 0;
            for (int k = 0; k < n_in && n < sizeof list; k++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s'%.60s'", k ? ", " : "", ins[k].name);
            return tb_errorf(TB_ERR_INVALID_ARG, "%s: a shape is given for '%s', which is not an input of the model "
                             "(inputs: %s)", s->label, s->opt->shapes[i].name, n_in ? list : "none");
        }
    }
    for (int y = 0; y < n_syms; y++) {
        if (syms[y].has_profile) continue;
        char what[300];
        if (syms[y].param[0]) snprintf(what, sizeof what, " ('%.200s')", syms[y].param);
        else what[0] = 0;
        return tb_errorf(TB_ERR_INVALID_ARG,
                         "%s: input '%s' dim %d%s is symbolic and no shape gives its range: pass --shapes %s:NxN... "
                         "or --min-shapes/--opt-shapes/--max-shapes",
                         s->label, syms[y].input, syms[y].dim, what, syms[y].input);
    }
    /* a symbol whose profile fixes it (min == max) is that number: shapes
     * then fold as fixed ones do, and no pass sees a symbol standing for a
     * constant */
    int remap[TB_MAX_SYMS], n_kept = 0;
    for (int y = 0; y < n_syms; y++) remap[y] = syms[y].min == syms[y].max ? -1 : n_kept++;
    for (int i = 0; i < n_in; i++)
        for (int d = 0; d < ins[i].rank; d++)
            if (TB_IS_SYM(ins[i].dims[d])) {
                int y = TB_SYM_INDEX(ins[i].dims[d]);
                ins[i].dims[d] = remap[y] < 0 ? syms[y].min : TB_SYM(remap[y]);
            }
    /* symbols: the graph keeps 15 characters of a name */
    for (int y = 0; y < n_syms; y++) {
        if (remap[y] < 0) continue;
        char nm[16];
        if (syms[y].param[0]) snprintf(nm, sizeof nm, "%s", syms[y].param);
        else snprintf(nm, sizeof nm, "dim%d", y);
        if (strlen(syms[y].param) > 15 || tb_graph_find_sym(s->g, nm) >= 0) snprintf(nm, sizeof nm, "%.10s~%d", syms[y].param, y);
        if (tb_graph_add_sym(s->g, nm, syms[y].min, syms[y].opt, syms[y].max) != remap[y])
            return tb_errorf(TB_ERR_INTERNAL, "%s: symbol %s", s->label, nm);
    }
    for (int i = 0; i < n_in; i++) {
        char name[TB_NAME_LEN];
        TB_TRY(take_name(s, ins[i].name, name));
        int v = tb_graph_add_value(s->g, name, TB_VAL_INPUT, ins[i].dt, ins[i].rank, ins[i].dims);
        if (v < 0) return tb_error_prefix(tb_last_status(), "%s", s->label);
        if (strmap_get(&s->values, ins[i].name, NULL))
            return tb_errorf(TB_ERR_FORMAT, "%s: graph input '%s' is listed twice", s->label, ins[i].name);
        TB_TRY(strmap_put(&s->values, ins[i].name, v));
        s->g->inputs[s->g->n_inputs++] = v;
    }
    return TB_OK;
}

static tb_status import_initializers(imp *s) {
    for (size_t i = 0; i < s->gp->n_initializer; i++) {
        Onnx__TensorProto *t = s->gp->initializer[i];
        if (!t || !t->name || !*t->name) return tb_errorf(TB_ERR_FORMAT, "%s: initializer %zu has no name", s->label, i);
        if (strmap_get(&s->values, t->name, NULL))
            return tb_errorf(TB_ERR_FORMAT, "%s: initializer '%s' is defined twice", s->label, t->name);
        char name[TB_NAME_LEN];
        int id;
        TB_TRY(take_name(s, t->name, name));
        TB_TRY(tensor_weight(s, t, t->name, name, &id));
        TB_TRY(strmap_put(&s->values, t->name, id));
    }
    if (s->gp->n_sparse_initializer)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: sparse initializers are not supported", s->label);
    return TB_OK;
}

/* ---------------------------------------------------------------- attributes */

static int attr_type(const Onnx__AttributeProto *a) {
    if (a->has_type && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED) return a->type;
    /* IR 1 had no type field: the field in use says it */
    if (a->has_f) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    if (a->has_i) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    if (a->has_s) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    if (a->t) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
    if (a->n_floats) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
    if (a->n_ints) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    return 0;
}

static const Onnx__AttributeProto *attr_find(const Onnx__NodeProto *n, const char *name) {
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i] && n->attribute[i]->name && !strcmp(n->attribute[i]->name, name)) return n->attribute[i];
    return NULL;
}

/* Values of checked attributes (step 2 checked names and types). */
static int64_t attr_i(const Onnx__NodeProto *n, const char *name, int64_t def) {
    const Onnx__AttributeProto *a = attr_find(n, name);
    return a ? a->i : def;
}
static float attr_f(const Onnx__NodeProto *n, const char *name, float def) {
    const Onnx__AttributeProto *a = attr_find(n, name);
    return a ? a->f : def;
}
/* 1 when string attribute `name` is `v` (absent: def is compared) */
static int attr_s_is(const Onnx__NodeProto *n, const char *name, const char *def, const char *v) {
    const Onnx__AttributeProto *a = attr_find(n, name);
    if (!a) return !strcmp(def, v);
    return a->s.len == strlen(v) && !memcmp(a->s.data, v, a->s.len);
}
/* the ints of `name`: count, or -1 when absent */
static int attr_ints(const Onnx__NodeProto *n, const char *name, const int64_t **v) {
    const Onnx__AttributeProto *a = attr_find(n, name);
    if (!a) return -1;
    *v = a->ints;
    return a->n_ints > INT_MAX ? INT_MAX : (int)a->n_ints;
}

/* The attributes each op takes ("name:type", types i f s t I F) and,
 * separately, those it ignores because they do not change inference results.
 * An op absent here takes none. */
typedef struct {
    const char *op, *attrs;
} op_attrs;

static const op_attrs known_attrs[] = {
    {"Cast", "to:i saturate:i"},
    {"Gelu", "approximate:s"},
    {"Softmax", "axis:i"},
    {"LayerNormalization", "axis:i epsilon:f stash_type:i"},
    {"BatchNormalization", "epsilon:f momentum:f training_mode:i"},
    {"ReduceMean", "axes:I keepdims:i noop_with_empty_axes:i"},
    {"ReduceSum", "axes:I keepdims:i noop_with_empty_axes:i"},
    {"ReduceMax", "axes:I keepdims:i noop_with_empty_axes:i"},
    {"Reshape", "allowzero:i"},
    {"Transpose", "perm:I"},
    {"Flatten", "axis:i"},
    {"Concat", "axis:i"},
    {"Split", "axis:i num_outputs:i split:I"},
    {"Shape", "start:i end:i"},
    {"Gather", "axis:i"},
    {"ConstantOfShape", "value:t"},
    {"Trilu", "upper:i"},
    {"Resize", "mode:s coordinate_transformation_mode:s nearest_mode:s cubic_coeff_a:f exclude_outside:i "
               "extrapolation_value:f antialias:i axes:I keep_aspect_ratio_policy:s"},
    {"MaxPool", "auto_pad:s ceil_mode:i dilations:I kernel_shape:I pads:I strides:I storage_order:i"},
    {"AveragePool", "auto_pad:s ceil_mode:i count_include_pad:i dilations:I kernel_shape:I pads:I strides:I"},
    {"Conv", "auto_pad:s dilations:I group:i kernel_shape:I pads:I strides:I"},
    {"Gemm", "alpha:f beta:f transA:i transB:i"},
    {"Constant", "value:t value_float:f value_floats:F value_int:i value_ints:I"},
    {"Dropout", "seed:i"},
    {"QuantizeLinear", "axis:i saturate:i block_size:i output_dtype:i"},
    {"DequantizeLinear", "axis:i block_size:i"},
};

static int type_of_letter(char c) {
    switch (c) {
    case 'i': return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    case 'f': return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    case 's': return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    case 't': return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
    case 'I': return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    case 'F': return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
    }
    return -1;
}

/* The type letter of attribute `name` of op `op`, 0 when it takes none such. */
static char known_attr(const char *op, const char *name) {
    for (size_t i = 0; i < sizeof known_attrs / sizeof known_attrs[0]; i++) {
        if (strcmp(known_attrs[i].op, op)) continue;
        size_t nl = strlen(name);
        for (const char *p = known_attrs[i].attrs; *p;) {
            const char *c = strchr(p, ':');
            if ((size_t)(c - p) == nl && !memcmp(p, name, nl)) return c[1];
            p = c + 2;
            while (*p == ' ') p++;
        }
    }
    return 0;
}

static int str_in(const ProtobufCBinaryData *s, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (s->len == strlen(list[i]) && !memcmp(s->data, list[i], s->len)) return i;
    return -1;
}

static const char *const autopad_names[] = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", NULL};
static const char *const resize_modes[] = {"nearest", "linear", "cubic", NULL};
static const char *const coord_modes[] = {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                          "tf_crop_and_resize", "half_pixel_symmetric", NULL};
static const char *const nearest_modes[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", NULL};

static int is_used(const imp *s, const char *name) { return name && *name && strmap_get(&s->used, name, NULL); }

/* Step 2 for one node: TB_OK with nothing recorded when it can be imported
 * (as far as is known without shapes), else its reason is recorded. */
static tb_status check_node(imp *s, const Onnx__NodeProto *n, int k) {
    const char *op = n->op_type;
    if (!op || !*op) return tb_errorf(TB_ERR_FORMAT, "%s: node %d has no op type", s->label, k);
    const char *dom = n->domain ? n->domain : "";
    if (*dom && strcmp(dom, "ai.onnx")) return refuse(s, n, k, "domain '%.60s' is not supported", dom);
    int kind = tb_nn_from_onnx(op);
    int special = !strcmp(op, "Constant") || !strcmp(op, "Dropout");
    if (!special && kind < 0) return refuse(s, n, k, "op type not supported");
    if (!special && !tb_op_get_def((tb_op_kind)kind)) return refuse(s, n, k, "op type not supported by this build");
    if (!strcmp(op, "Dropout") && !tb_op_get_def(TB_OP_IDENTITY))
        return refuse(s, n, k, "op type not supported by this build (it becomes Identity)");
    if (n->n_input > 1024 || n->n_output > 1024) return refuse(s, n, k, "too many inputs or outputs");
    for (size_t i = 0; i < n->n_input; i++)
        if (!n->input[i]) return tb_errorf(TB_ERR_FORMAT, "%s: node %d: input %zu has no name", s->label, k, i);
    for (size_t i = 0; i < n->n_output; i++)
        if (!n->output[i]) return tb_errorf(TB_ERR_FORMAT, "%s: node %d: output %zu has no name", s->label, k, i);
    if (n->n_output < 1 || !*n->output[0]) return tb_errorf(TB_ERR_FORMAT, "%s: node %d has no output", s->label, k);

    for (size_t i = 0; i < n->n_attribute; i++) {
        const Onnx__AttributeProto *a = n->attribute[i];
        if (!a || !a->name) return tb_errorf(TB_ERR_FORMAT, "%s: node %d: an attribute has no name", s->label, k);
        if (a->ref_attr_name && *a->ref_attr_name)
            return tb_errorf(TB_ERR_FORMAT, "%s: node %d: attribute '%s' refers to a function's attribute", s->label,
                             k, a->name);
        char t = known_attr(op, a->name);
        if (!t) return refuse(s, n, k, "attribute '%.60s' is not supported", a->name);
        if (attr_type(a) != type_of_letter(t)) return refuse(s, n, k, "attribute '%.60s' has the wrong type", a->name);
    }

    /* attribute values that no translation can express */
    const Onnx__AttributeProto *a;
    if (!strcmp(op, "Cast")) {
        tb_dtype dt;
        int64_t to = attr_i(n, "to", -1);
        if (!attr_find(n, "to")) return refuse(s, n, k, "attribute 'to' is missing");
        if (to < 0 || to > INT_MAX || !onnx_dtype((int)to, &dt))
            return refuse(s, n, k, "cast to %s is not supported (" ONNX_TYPES_SUPPORTED ")", onnx_type_name((int)to));
    } else if (!strcmp(op, "Gelu") && (a = attr_find(n, "approximate"))) {
        static const char *const g[] = {"none", "tanh", NULL};
        if (str_in(&a->s, g) < 0) return refuse(s, n, k, "attribute 'approximate' = '%.*s' is not supported",
                                                (int)(a->s.len > 40 ? 40 : a->s.len), (const char *)a->s.data);
    } else if (!strcmp(op, "BatchNormalization")) {
        if (attr_i(n, "training_mode", 0)) return refuse(s, n, k, "training_mode = 1 is not supported (inference only)");
        for (size_t o = 1; o < n->n_output; o++)
            if (is_used(s, n->output[o])) return refuse(s, n, k, "output %zu (training statistics) is used", o);
    } else if (!strcmp(op, "LayerNormalization")) {
        int64_t st = attr_i(n, "stash_type", 1);
        for (size_t o = 1; o < n->n_output; o++)
            if (is_used(s, n->output[o]) && st != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
                return refuse(s, n, k, "output %zu ('%.60s', %s) is used with stash_type %s (FLOAT only)", o,
                              n->output[o], o == 1 ? "Mean" : "InvStdDev", onnx_type_name((int)st));
    } else if (!strcmp(op, "Dropout")) {
        if (n->n_output > 1 && is_used(s, n->output[1]) &&
            (!tb_op_get_def(TB_OP_SHAPE) || !tb_op_get_def(TB_OP_CONSTANT_OF_SHAPE)))
            return refuse(s, n, k, "output 1 ('%.60s', the mask) is used, which needs Shape and ConstantOfShape, "
                          "not in this build", n->output[1]);
    }
    if (!strcmp(op, "MaxPool")) {
        for (size_t o = 1; o < n->n_output; o++)
            if (is_used(s, n->output[o]))
                return refuse(s, n, k, "output %zu ('%.60s', the indices) is used, which is not supported", o,
                              n->output[o]);
    }
    if (!strcmp(op, "Resize")) {
        if ((a = attr_find(n, "mode")) && str_in(&a->s, resize_modes) < 0)
            return refuse(s, n, k, "mode '%.*s' is not supported", (int)(a->s.len > 40 ? 40 : a->s.len), a->s.data);
        if ((a = attr_find(n, "coordinate_transformation_mode")) && str_in(&a->s, coord_modes) < 0)
            return refuse(s, n, k, "coordinate_transformation_mode '%.*s' is not supported",
                          (int)(a->s.len > 40 ? 40 : a->s.len), a->s.data);
        if ((a = attr_find(n, "nearest_mode")) && str_in(&a->s, nearest_modes) < 0)
            return refuse(s, n, k, "nearest_mode '%.*s' is not supported", (int)(a->s.len > 40 ? 40 : a->s.len),
                          a->s.data);
        if (attr_i(n, "antialias", 0)) return refuse(s, n, k, "antialias = 1 is not supported");
        if (!attr_s_is(n, "keep_aspect_ratio_policy", "stretch", "stretch"))
            return refuse(s, n, k, "keep_aspect_ratio_policy other than 'stretch' is not supported");
        if (attr_find(n, "axes")) return refuse(s, n, k, "attribute 'axes' is not supported");
    }
    if (!strcmp(op, "Conv") || !strcmp(op, "MaxPool") || !strcmp(op, "AveragePool")) {
        if ((a = attr_find(n, "auto_pad")) && str_in(&a->s, autopad_names) < 0)
            return refuse(s, n, k, "auto_pad '%.*s' is not supported", (int)(a->s.len > 40 ? 40 : a->s.len),
                          a->s.data);
        const int64_t *ks;
        int nk = attr_ints(n, "kernel_shape", &ks);
        if (nk > 2) return refuse(s, n, k, "%d-d kernels are not supported (1-d and 2-d)", nk);
        if (strcmp(op, "Conv") && nk < 0) return tb_errorf(TB_ERR_FORMAT, "%s: node %d (%s) has no kernel_shape", s->label, k, op);
    }
    if (!strcmp(op, "QuantizeLinear") || !strcmp(op, "DequantizeLinear")) {
        if (attr_i(n, "block_size", 0)) return refuse(s, n, k, "blocked quantization (block_size) is not supported");
        int64_t od = attr_i(n, "output_dtype", 0);
        if (od && od != ONNX__TENSOR_PROTO__DATA_TYPE__INT8 && od != ONNX__TENSOR_PROTO__DATA_TYPE__UINT8)
            return refuse(s, n, k, "output_dtype %s is not supported (int8, uint8)", onnx_type_name((int)od));
    }
    if (!strcmp(op, "Constant")) {
        if (n->n_attribute != 1) return refuse(s, n, k, "wants exactly one value attribute, has %zu", n->n_attribute);
    }
    /* outputs past those the op computes */
    const tb_op_def *d = kind >= 0 ? tb_op_get_def((tb_op_kind)kind) : NULL;
    int most = d ? (d->max_out ? d->max_out : d->n_out) : 1;
    if (d && strcmp(op, "Dropout"))
        for (size_t o = (size_t)most; o < n->n_output; o++)
            if (is_used(s, n->output[o]))
                return refuse(s, n, k, "output %zu ('%.60s') is used, which is not supported", o, n->output[o]);
    return TB_OK;
}

/* ---------------------------------------------------------------- nodes */

typedef struct {
    int in[TB_MAX_INPUTS];
    int n_in;
    int32_t i[TB_NODE_INTS];
    float f[TB_NODE_FLOATS];
} node_spec;

/* Why a node cannot be imported once shapes are known: set by translate()
 * (an error of the model itself is returned as a status instead). */
typedef struct {
    char why[300];
} refusal;

#define REFUSE(...) do { snprintf(r->why, sizeof r->why, __VA_ARGS__); return TB_OK; } while (0)
#define BAD(...) return tb_errorf(TB_ERR_FORMAT, __VA_ARGS__)

static int fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

static tb_status norm_axis(imp *s, const char *lbl, const char *what, int64_t axis, int rank, int extra, int32_t *out) {
    /* extra = 1: axis may equal rank (Flatten) */
    if (axis < -(int64_t)rank || axis >= (int64_t)rank + extra)
        BAD("%s: %s: %s %lld is outside the rank %d of its input", s->label, lbl, what, (long long)axis, rank);
    *out = (int32_t)(axis < 0 ? axis + rank : axis);
    return TB_OK;
}

static const tb_value *val(const imp *s, int id) { return &s->g->values[id]; }

/* Conv / pool geometry into the slots of ops_nn.h: 1-d inputs use the w
 * entries. slots: kernel (or -1), strides, pads (4), dilations, auto_pad. */
static tb_status geometry(imp *s, const Onnx__NodeProto *n, const char *lbl, int rank, refusal *r, int kslot,
                          int sslot, int pslot, int dslot, int aslot, int32_t *i) {
    int sp = rank - 2;
    if (sp != 1 && sp != 2) REFUSE("%d-d input (rank %d): only 1-d and 2-d are supported", sp, rank);
    static const struct { const char *name; int per_dim, def, lo; } f[4] = {
        {"kernel_shape", 1, 1, 1}, {"strides", 1, 1, 1}, {"dilations", 1, 1, 1}, {"pads", 2, 0, 0}};
    const int slots[4] = {kslot, sslot, dslot, pslot};
    for (int a = 0; a < 4; a++) {
        if (slots[a] < 0) continue;
        int given = f[a].per_dim * sp, written = f[a].per_dim * 2;
        int32_t x[4] = {f[a].def, f[a].def, f[a].def, f[a].def};
        const int64_t *v;
        int nv = attr_ints(n, f[a].name, &v);
        if (nv >= 0) {
            if (nv != given) BAD("%s: %s: %s has %d entries for a %d-d input", s->label, lbl, f[a].name, nv, sp);
            for (int j = 0; j < nv; j++)
                if (v[j] < f[a].lo || v[j] > (1 << 20))
                    BAD("%s: %s: %s[%d] = %lld", s->label, lbl, f[a].name, j, (long long)v[j]);
            if (sp == 2) for (int j = 0; j < nv; j++) x[j] = (int32_t)v[j];
            else if (f[a].per_dim == 1) x[1] = (int32_t)v[0];      /* (h, w): w */
            else { x[1] = (int32_t)v[0]; x[3] = (int32_t)v[1]; }   /* (top, left, bottom, right): left, right */
        }
        for (int j = 0; j < written; j++) i[slots[a] + j] = x[j];
    }
    const Onnx__AttributeProto *ap = attr_find(n, "auto_pad");
    i[aslot] = ap ? str_in(&ap->s, autopad_names) : 0;
    return TB_OK;
}

/* An i64 (rank 1) constant input made from ints. */
static tb_status ints_const(imp *s, const char *base, const char *suffix, const int64_t *v, int n, int *id) {
    int64_t dims[1] = {n};
    return add_const(s, base, suffix, TB_I64, 1, dims, v, (size_t)n * 8, id);
}

/* Translates node n (its inputs resolved into ids, -1 for absent) into sp;
 * sets r->why when it cannot be expressed. */
static tb_status translate(imp *s, const Onnx__NodeProto *n, int k, const char *lbl, tb_op_kind op, const int *ids,
                           int n_ids, node_spec *sp, refusal *r) {
    memset(sp, 0, sizeof *sp);
    /* trailing absent inputs are dropped */
    while (n_ids > 0 && ids[n_ids - 1] < 0) n_ids--;
    int rank0 = n_ids > 0 && ids[0] >= 0 ? val(s, ids[0])->rank : 0;
    const char *base = n->output[0];
    int t[TB_MAX_INPUTS + 8];
    int nt = 0;
    if (n_ids > TB_MAX_INPUTS && op != TB_OP_CONCAT) REFUSE("%d inputs (at most %d)", n_ids, TB_MAX_INPUTS);
    /* every op this importer maps takes its first input; an empty name there
     * leaves nothing to read a dtype or shape from */
    if (n_ids > 0 && ids[0] < 0) REFUSE("its first input is left out (an empty name)");
    for (int j = 0; j < n_ids && j < TB_MAX_INPUTS; j++) t[nt++] = ids[j];

    switch (op) {
    case TB_OP_CLIP:
        if (nt == 3 && t[1] < 0) { /* max without min: min = the lowest value */
            const tb_value *x = val(s, t[0]);
            uint8_t lo[8] = {0};
            float ff = -INFINITY;
            double fd = -INFINITY;
            int64_t i64 = INT64_MIN;
            int32_t i32 = INT32_MIN;
            int8_t i8 = INT8_MIN;
            size_t sz = 0;
            switch (x->dtype) {
            case TB_F32: memcpy(lo, &ff, 4); sz = 4; break;
            case TB_F16: { uint16_t h = 0xfc00; memcpy(lo, &h, 2); sz = 2; break; }
            case TB_BF16: { uint16_t h = 0xff80; memcpy(lo, &h, 2); sz = 2; break; }
            case TB_F64: memcpy(lo, &fd, 8); sz = 8; break;
            case TB_I64: memcpy(lo, &i64, 8); sz = 8; break;
            case TB_I32: memcpy(lo, &i32, 4); sz = 4; break;
            case TB_I8: memcpy(lo, &i8, 1); sz = 1; break;
            case TB_U8: sz = 1; break;
            default: REFUSE("min left out for a %s input", tb_dtype_name(x->dtype));
            }
            TB_TRY(add_const(s, base, "min", x->dtype, 0, NULL, lo, sz, &t[1]));
        }
        break;
    case TB_OP_CAST: {
        tb_dtype dt;
        onnx_dtype((int)attr_i(n, "to", 0), &dt);
        sp->i[0] = (int32_t)dt;
        break;
    }
    case TB_OP_GELU: sp->i[0] = attr_s_is(n, "approximate", "none", "tanh"); break;
    case TB_OP_SOFTMAX: TB_TRY(norm_axis(s, lbl, "axis", attr_i(n, "axis", -1), rank0, 0, &sp->i[0])); break;
    case TB_OP_LAYERNORM:
        TB_TRY(norm_axis(s, lbl, "axis", attr_i(n, "axis", -1), rank0, 0, &sp->i[0]));
        sp->f[0] = attr_f(n, "epsilon", 1e-5f);
        /* Mean (1) and InvStdDev (2) computed up to the last one used */
        for (size_t o = 1; o < n->n_output && o < 3; o++)
            if (is_used(s, n->output[o])) sp->i[1] = (int32_t)o + 1;
        break;
    case TB_OP_BATCHNORM: sp->f[0] = attr_f(n, "epsilon", 1e-5f); break;
    case TB_OP_REDUCE_MEAN: case TB_OP_REDUCE_SUM: case TB_OP_REDUCE_MAX: {
        int64_t kd = attr_i(n, "keepdims", 1), noop = attr_i(n, "noop_with_empty_axes", 0);
        if ((kd != 0 && kd != 1) || (noop != 0 && noop != 1)) BAD("%s: %s: keepdims / noop_with_empty_axes not 0 or 1", s->label, lbl);
        sp->i[0] = (int32_t)kd;
        sp->i[2] = (int32_t)noop;
        const int64_t *ax;
        int na = attr_ints(n, "axes", &ax);
        if (na > 0 && nt > 1) BAD("%s: %s: axes given both as attribute and input", s->label, lbl);
        for (int j = 0; j < na; j++) {
            int32_t a = 0;
            TB_TRY(norm_axis(s, lbl, "axis", ax[j], rank0, 0, &a));
            if (sp->i[1] & (1 << a)) BAD("%s: %s: axis %d is listed twice", s->label, lbl, a);
            sp->i[1] |= 1 << a;
        }
        break;
    }
    case TB_OP_RESHAPE: sp->i[0] = attr_i(n, "allowzero", 0) != 0; break;
    case TB_OP_TRANSPOSE: {
        const int64_t *p;
        int np = attr_ints(n, "perm", &p);
        if (np >= 0 && np != rank0) BAD("%s: %s: perm has %d entries for rank %d", s->label, lbl, np, rank0);
        unsigned seen = 0;
        for (int j = 0; j < rank0; j++) {
            int64_t v = np >= 0 ? p[j] : rank0 - 1 - j;
            if (v < 0 || v >= rank0 || (seen & (1u << v))) BAD("%s: %s: perm is not a permutation", s->label, lbl);
            seen |= 1u << v;
            sp->i[j] = (int32_t)v;
        }
        break;
    }
    case TB_OP_FLATTEN: TB_TRY(norm_axis(s, lbl, "axis", attr_i(n, "axis", 1), rank0, 1, &sp->i[0])); break;
    case TB_OP_CONCAT: {
        const Onnx__AttributeProto *a = attr_find(n, "axis");
        if (!a) BAD("%s: %s: Concat has no axis", s->label, lbl);
        for (int j = 0; j < n_ids; j++)
            if (ids[j] < 0) REFUSE("input %d is left out", j);
        TB_TRY(norm_axis(s, lbl, "axis", a->i, rank0, 0, &sp->i[0]));
        break; /* more than TB_MAX_INPUTS inputs: import_node chains them */
    }
    case TB_OP_SPLIT: {
        TB_TRY(norm_axis(s, lbl, "axis", attr_i(n, "axis", 0), rank0, 0, &sp->i[0]));
        int64_t parts = attr_i(n, "num_outputs", (int64_t)n->n_output);
        if (parts < 1 || parts > TB_MAX_OUTPUTS) REFUSE("%lld outputs (at most %d)", (long long)parts, TB_MAX_OUTPUTS);
        if (parts != (int64_t)n->n_output) BAD("%s: %s: num_outputs %lld but %zu outputs", s->label, lbl, (long long)parts, n->n_output);
        sp->i[1] = (int32_t)parts;
        const int64_t *v;
        int nv = attr_ints(n, "split", &v);
        if (nv >= 0) {
            if (nt > 1) BAD("%s: %s: split given both as attribute and input", s->label, lbl);
            TB_TRY(ints_const(s, base, "split", v, nv, &t[1]));
            nt = 2;
        }
        break;
    }
    case TB_OP_SHAPE: {
        int64_t st = attr_i(n, "start", 0);
        const Onnx__AttributeProto *e = attr_find(n, "end");
        /* ONNX clamps to [0, rank] after adding the rank: the same past ±(rank + 1) */
        int64_t lim = TB_MAX_RANK + 1;
        sp->i[0] = (int32_t)(st < -lim ? -lim : st > lim ? lim : st);
        if (e) {
            sp->i[1] = (int32_t)(e->i < -lim ? -lim : e->i > lim ? lim : e->i);
            sp->i[2] = 1;
        }
        break;
    }
    case TB_OP_GATHER: TB_TRY(norm_axis(s, lbl, "axis", attr_i(n, "axis", 0), rank0, 0, &sp->i[0])); break;
    case TB_OP_CONSTANT_OF_SHAPE: {
        const Onnx__AttributeProto *a = attr_find(n, "value");
        if (a) {
            if (!a->t) BAD("%s: %s: value has no tensor", s->label, lbl);
            char on[TB_NAME_LEN * 2], name[TB_NAME_LEN];
            snprintf(on, sizeof on, "%.*s.value", TB_NAME_LEN - 20, base);
            TB_TRY(take_name(s, on, name));
            TB_TRY(tensor_weight(s, a->t, on, name, &t[1]));
            uint64_t ne = 1;
            for (int d = 0; d < val(s, t[1])->rank; d++) ne *= (uint64_t)val(s, t[1])->dims[d];
            if (ne != 1) BAD("%s: %s: value has %llu elements (want 1)", s->label, lbl, (unsigned long long)ne);
        } else {
            float zero = 0;
            int64_t one[1] = {1};
            TB_TRY(add_const(s, base, "value", TB_F32, 1, one, &zero, 4, &t[1]));
        }
        nt = 2;
        break;
    }
    case TB_OP_TRILU: sp->i[0] = attr_i(n, "upper", 1) != 0; break;
    case TB_OP_RESIZE: {
        /* x, roi, scales, sizes -> x, sizes or x, scales */
        int sizes = n_ids > 3 ? ids[3] : -1, scales = n_ids > 2 ? ids[2] : -1;
        if (sizes >= 0 && scales >= 0 && val(s, scales)->kind == TB_VAL_WEIGHT) {
            uint64_t ne = 1;
            for (int d = 0; d < val(s, scales)->rank; d++) ne *= (uint64_t)val(s, scales)->dims[d];
            if (ne) BAD("%s: %s: both scales and sizes are given", s->label, lbl);
        }
        if (sizes < 0 && scales < 0) BAD("%s: %s: neither scales nor sizes is given", s->label, lbl);
        t[1] = sizes >= 0 ? sizes : scales;
        nt = 2;
        const Onnx__AttributeProto *a;
        sp->i[0] = (a = attr_find(n, "mode")) ? str_in(&a->s, resize_modes) : TB_NN_RESIZE_NEAREST;
        sp->i[1] = (a = attr_find(n, "coordinate_transformation_mode")) ? str_in(&a->s, coord_modes) : TB_NN_COORD_HALF_PIXEL;
        if (sp->i[1] == TB_NN_COORD_TF_CROP_AND_RESIZE) { /* roi: only this mode reads it */
            int roi = n_ids > 1 ? ids[1] : -1;
            if (roi < 0) REFUSE("tf_crop_and_resize without a roi input");
            const tb_value *q = val(s, roi);
            if (q->kind == TB_VAL_WEIGHT && q->rank == 1 && q->dims[0] == 0) REFUSE("tf_crop_and_resize with an empty roi");
            t[2] = roi;
            nt = 3;
        }
        sp->i[2] = (a = attr_find(n, "nearest_mode")) ? str_in(&a->s, nearest_modes) : TB_NN_NEAREST_ROUND_PREFER_FLOOR;
        sp->i[3] = attr_i(n, "exclude_outside", 0) != 0;
        sp->f[0] = attr_f(n, "cubic_coeff_a", -0.75f);
        sp->f[1] = attr_f(n, "extrapolation_value", 0.0f);
        break;
    }
    case TB_OP_MAXPOOL: case TB_OP_AVGPOOL:
        TB_TRY(geometry(s, n, lbl, rank0, r, 0, 2, 4, 8, 12, sp->i));
        if (r->why[0]) return TB_OK;
        sp->i[10] = attr_i(n, "ceil_mode", 0) != 0;
        if (op == TB_OP_AVGPOOL) sp->i[11] = attr_i(n, "count_include_pad", 0) != 0;
        break;
    case TB_OP_CONV: {
        TB_TRY(geometry(s, n, lbl, rank0, r, -1, 1, 3, 7, 9, sp->i));
        if (r->why[0]) return TB_OK;
        int64_t grp = attr_i(n, "group", 1);
        if (grp < 1 || grp > INT32_MAX) BAD("%s: %s: group %lld", s->label, lbl, (long long)grp);
        sp->i[0] = (int32_t)grp;
        const int64_t *ks;
        int nk = attr_ints(n, "kernel_shape", &ks);
        if (nk >= 0 && nt > 1) { /* must agree with the weight's spatial dims */
            const tb_value *w = val(s, t[1]);
            if (nk != w->rank - 2) BAD("%s: %s: kernel_shape has %d entries, the weight rank %d", s->label, lbl, nk, w->rank);
            for (int j = 0; j < nk; j++)
                if (w->dims[2 + j] >= 0 && w->dims[2 + j] != ks[j])
                    BAD("%s: %s: kernel_shape[%d] = %lld, the weight has %lld", s->label, lbl, j, (long long)ks[j],
                        (long long)w->dims[2 + j]);
        }
        if (nt > 2) sp->i[11] = TB_NN_HAS_BIAS;
        break;
    }
    case TB_OP_GEMM:
        sp->i[0] = attr_i(n, "transA", 0) != 0;
        sp->i[1] = attr_i(n, "transB", 0) != 0;
        sp->f[0] = attr_f(n, "alpha", 1.0f);
        sp->f[1] = attr_f(n, "beta", 1.0f);
        if (nt > 2) sp->i[3] = TB_NN_HAS_BIAS;
        break;
    case TB_OP_QUANTIZE_LINEAR: case TB_OP_DEQUANTIZE_LINEAR: {
        /* per axis when the scale is 1-d with more than one element */
        const tb_value *sc = nt > 1 && t[1] >= 0 ? val(s, t[1]) : NULL;
        if (sc && sc->rank == 1 && sc->dims[0] != 1)
            TB_TRY(norm_axis(s, lbl, "axis", attr_i(n, "axis", 1), rank0, 0, &sp->i[0]));
        if (op == TB_OP_QUANTIZE_LINEAR)
            sp->i[1] = attr_i(n, "output_dtype", 0) == ONNX__TENSOR_PROTO__DATA_TYPE__INT8 ? TB_I8 : TB_U8;
        break;
    }
    case TB_OP_SLICE:
        if (nt == 5 && t[3] < 0) { /* steps without axes: axes 0 .. len(starts) - 1 */
            if (t[1] < 0) REFUSE("starts left out (an empty name)");
            const tb_value *st = val(s, t[1]);
            if (st->rank != 1 || st->dims[0] < 0 || st->dims[0] > TB_MAX_RANK) REFUSE("axes left out and starts of unknown length");
            int64_t ax[TB_MAX_RANK];
            for (int j = 0; j < st->dims[0]; j++) ax[j] = j;
            TB_TRY(ints_const(s, base, "axes", ax, (int)st->dims[0], &t[3]));
        }
        break;
    case TB_OP_IDENTITY:
        if (!strcmp(n->op_type, "Dropout")) { /* data [, ratio [, training_mode]] */
            if (n_ids > 2 && ids[2] >= 0) {
                const tb_value *tm = val(s, ids[2]);
                if (tm->kind != TB_VAL_WEIGHT || !tm->data)
                    REFUSE("training_mode is not a constant (training, a random mask, is not supported)");
                if (tm->nbytes && ((const uint8_t *)tm->data)[0]) {
                    /* training with ratio 0 keeps every element: still the identity */
                    const tb_value *ra = n_ids > 1 && ids[1] >= 0 ? val(s, ids[1]) : NULL;
                    int zero = ra && ra->kind == TB_VAL_WEIGHT && ra->data && ra->nbytes &&
                               (ra->dtype == TB_F32 || ra->dtype == TB_F64 || ra->dtype == TB_F16 || ra->dtype == TB_BF16);
                    if (zero) {
                        tb_view rv;
                        tb_value_view(s->g, ids[1], &rv);
                        zero = tb_view_numel(&rv) == 1 && tb_view_get_f(&rv, 0) == 0;
                    }
                    if (!zero) REFUSE("training_mode is true (training, a random mask, is not supported)");
                }
            }
            nt = 1;
        }
        break;
    default: break;
    }
    for (int j = 0; j < nt; j++)
        if (t[j] < 0) REFUSE("input %d is left out (an optional input this importer cannot fill)", j);
    for (int j = 0; j < TB_NODE_INTS; j++)
        if (!fits_i32(sp->i[j])) BAD("%s: %s: attribute out of range", s->label, lbl);
    (void)k;
    memcpy(sp->in, t, sizeof(int) * (size_t)nt);
    sp->n_in = op == TB_OP_CONCAT ? n_ids : nt; /* Concat past TB_MAX_INPUTS: import_node chains */
    return TB_OK;
}

static tb_status import_node(imp *s, const Onnx__NodeProto *n, int k) {
    char lbl[256];
    node_label(n, k, lbl, sizeof lbl);
    int *ids = malloc((n->n_input ? n->n_input : 1) * sizeof *ids);
    if (!ids) return tb_errorf(TB_ERR_OOM, "out of memory");
    tb_status st = TB_OK;
    int skip = 0;
    for (size_t j = 0; j < n->n_input; j++) {
        ids[j] = -1;
        if (!*n->input[j]) continue;
        if (!strmap_get(&s->values, n->input[j], &ids[j])) {
            st = tb_errorf(TB_ERR_FORMAT, "%s: %s reads '%.200s', which no input, initializer or earlier node "
                           "defines", s->label, lbl, n->input[j]);
            goto out;
        }
        if (ids[j] == VAL_REFUSED) skip = 1;
    }
    if (skip) goto refused; /* behind a refused node: nothing more to say */

    if (!strcmp(n->op_type, "Constant")) {
        const Onnx__AttributeProto *a = n->attribute[0];
        char name[TB_NAME_LEN];
        int id = -1;
        if (strmap_get(&s->values, n->output[0], NULL)) {
            st = tb_errorf(TB_ERR_FORMAT, "%s: %s writes '%.200s', which is already defined", s->label, lbl,
                           n->output[0]);
            goto out;
        }
        if ((st = take_name(s, n->output[0], name)) != TB_OK) goto out;
        int64_t dims[1] = {(int64_t)a->n_floats};
        if (!strcmp(a->name, "value")) {
            if (!a->t) { st = tb_errorf(TB_ERR_FORMAT, "%s: %s: value has no tensor", s->label, lbl); goto out; }
            st = tensor_weight(s, a->t, n->output[0], name, &id);
            if (st == TB_ERR_UNSUPPORTED) { /* a dtype this importer refuses: listed with the others */
                st = refuse(s, n, k, "%s", tb_last_error());
                goto refused;
            }
        } else if (!strcmp(a->name, "value_float")) {
            float *v = malloc(4);
            if (v) *v = a->f;
            id = v ? tb_graph_add_weight(s->g, name, TB_F32, 0, dims, v, 1) : -1;
        } else if (!strcmp(a->name, "value_int")) {
            int64_t *v = malloc(8);
            if (v) *v = a->i;
            id = v ? tb_graph_add_weight(s->g, name, TB_I64, 0, dims, v, 1) : -1;
        } else if (!strcmp(a->name, "value_floats")) {
            float *v = malloc(a->n_floats * 4 + 4);
            if (v && a->n_floats) memcpy(v, a->floats, a->n_floats * 4);
            id = v ? tb_graph_add_weight(s->g, name, TB_F32, 1, dims, v, 1) : -1;
        } else {
            dims[0] = (int64_t)a->n_ints;
            int64_t *v = malloc(a->n_ints * 8 + 8);
            if (v && a->n_ints) memcpy(v, a->ints, a->n_ints * 8);
            id = v ? tb_graph_add_weight(s->g, name, TB_I64, 1, dims, v, 1) : -1;
        }
        if (st != TB_OK) goto out;
        if (id < 0) { st = tb_error_prefix(tb_last_status() ? tb_last_status() : TB_ERR_OOM, "%s: %s", s->label, lbl); goto out; }
        st = strmap_put(&s->values, n->output[0], id);
        goto out;
    }

    tb_op_kind op = !strcmp(n->op_type, "Dropout") ? TB_OP_IDENTITY : (tb_op_kind)tb_nn_from_onnx(n->op_type);
    node_spec sp;
    refusal r = {{0}};
    if ((st = translate(s, n, k, lbl, op, ids, (int)n->n_input, &sp, &r)) != TB_OK) goto out;
    if (r.why[0]) {
        if ((st = refuse(s, n, k, "%s", r.why)) != TB_OK) goto out;
        goto refused;
    }
    int mask = op == TB_OP_IDENTITY && n->n_output > 1 && is_used(s, n->output[1]); /* Dropout's */
    int x_in = sp.in[0];
    if (mask) { /* inference: every element kept, ConstantOfShape(Shape(x), true) */
        if (strmap_get(&s->values, n->output[1], NULL)) {
            st = tb_errorf(TB_ERR_FORMAT, "%s: %s writes '%.200s', which is already defined", s->label, lbl, n->output[1]);
            goto out;
        }
        char shn[TB_NAME_LEN], mn[TB_NAME_LEN], on[TB_NAME_LEN + 16];
        snprintf(on, sizeof on, "%.*s.shape", TB_NAME_LEN - 16, n->output[1]);
        if ((st = take_name(s, on, shn)) != TB_OK || (st = take_name(s, n->output[1], mn)) != TB_OK) goto out;
        const uint8_t one = 1;
        int64_t d1[1] = {1};
        int tv, in2[2];
        if ((st = add_const(s, n->output[1], "true", TB_BOOL, 1, d1, &one, 1, &tv)) != TB_OK) goto out;
        int32_t zi[TB_NODE_INTS] = {0};
        float zf[TB_NODE_FLOATS] = {0};
        const char *nm = shn;
        int sh = tb_graph_add_node_ex(s->g, TB_OP_SHAPE, &x_in, 1, &nm, 1, zi, zf);
        if (sh >= 0) {
            in2[0] = s->g->nodes[sh].out[0];
            in2[1] = tv;
            nm = mn;
            sh = tb_graph_add_node_ex(s->g, TB_OP_CONSTANT_OF_SHAPE, in2, 2, &nm, 1, zi, zf);
        }
        if (sh < 0) {
            st = tb_error_prefix(tb_last_status() == TB_ERR_OOM ? TB_ERR_OOM : TB_ERR_FORMAT, "%s: %s", s->label, lbl);
            goto out;
        }
        if ((st = strmap_put(&s->values, n->output[1], s->g->nodes[sh].out[0])) != TB_OK) goto out;
    }
    /* output names: ONNX's, or made up for outputs left unnamed */
    char names[TB_MAX_OUTPUTS][TB_NAME_LEN];
    const char *np[TB_MAX_OUTPUTS];
    for (int o = 0; o < TB_MAX_OUTPUTS; o++) {
        char made[TB_NAME_LEN + 16];
        const char *on = (size_t)o < n->n_output && *n->output[o] ? n->output[o] : NULL;
        if (!on) { snprintf(made, sizeof made, "%.*s.out%d", TB_NAME_LEN - 16, n->output[0], o); on = made; }
        if ((st = take_name(s, on, names[o])) != TB_OK) goto out;
        np[o] = names[o];
    }
    int node;
    if (op == TB_OP_CONCAT && sp.n_in > TB_MAX_INPUTS) {
        /* Concat of many: concatenate the first TB_MAX_INPUTS, then that with the next ones */
        int acc = -1, j = 0;
        while (j < sp.n_in) {
            int in[TB_MAX_INPUTS], m = 0;
            if (acc >= 0) in[m++] = acc;
            while (m < TB_MAX_INPUTS && j < sp.n_in) in[m++] = ids[j++];
            char part[TB_NAME_LEN];
            const char *nm = np[0];
            if (j < sp.n_in) {
                char on[TB_NAME_LEN + 16];
                snprintf(on, sizeof on, "%.*s.cat%d", TB_NAME_LEN - 16, n->output[0], j);
                if ((st = take_name(s, on, part)) != TB_OK) goto out;
                nm = part;
            }
            node = tb_graph_add_node_ex(s->g, op, in, m, &nm, 1, sp.i, sp.f);
            if (node < 0) break;
            acc = s->g->nodes[node].out[0];
        }
    } else {
        node = tb_graph_add_node_ex(s->g, op, sp.in, sp.n_in, np, TB_MAX_OUTPUTS, sp.i, sp.f);
    }
    if (node < 0) {
        st = tb_last_status() == TB_ERR_OOM ? TB_ERR_OOM : TB_ERR_FORMAT;
        st = tb_error_prefix(st, "%s: %s", s->label, lbl);
        goto out;
    }
    const tb_node *nd = &s->g->nodes[node];
    for (size_t o = 0; o < n->n_output; o++) {
        if (!*n->output[o] || (mask && o == 1)) continue;
        if (strmap_get(&s->values, n->output[o], NULL)) {
            st = tb_errorf(TB_ERR_FORMAT, "%s: %s writes '%.200s', which is already defined", s->label, lbl, n->output[o]);
            goto out;
        }
        if ((int)o < nd->n_out) {
            if ((st = strmap_put(&s->values, n->output[o], nd->out[o])) != TB_OK) goto out;
        } else if (is_used(s, n->output[o])) { /* check_node saw these for the ops it knows */
            if ((st = refuse(s, n, k, "output %zu ('%.60s') is not computed", o, n->output[o])) != TB_OK) goto out;
        }
    }
    goto out;
refused:
    for (size_t o = 0; o < n->n_output && st == TB_OK; o++)
        if (*n->output[o]) st = strmap_put(&s->values, n->output[o], VAL_REFUSED);
out:
    free(ids);
    return st;
}

/* ---------------------------------------------------------------- the model */

static tb_status check_opsets(imp *s) {
    const Onnx__ModelProto *m = s->m;
    s->opset = -1;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->opset_import[i];
        if (!o) continue;
        const char *dom = o->domain ? o->domain : "";
        if (*dom && strcmp(dom, "ai.onnx")) continue; /* refused only where a node uses it */
        if (!o->has_version) return tb_errorf(TB_ERR_FORMAT, "%s: the default opset import has no version", s->label);
        s->opset = o->version > s->opset ? (int)(o->version > INT_MAX ? INT_MAX : o->version) : s->opset;
    }
    if (s->opset < 0)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: the model imports no opset of the default ONNX domain", s->label);
    if (s->opset < ONNX_OPSET_MIN || s->opset > ONNX_OPSET_MAX)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: opset %d of the default ONNX domain is not supported (%d to %d); "
                         "convert the model (onnx.version_converter) to a supported opset", s->label, s->opset,
                         ONNX_OPSET_MIN, ONNX_OPSET_MAX);
    return TB_OK;
}

static tb_status import_model(imp *s) {
    const Onnx__GraphProto *gp = s->gp;
    /* the names some node or graph output reads */
    for (size_t k = 0; k < gp->n_node; k++) {
        const Onnx__NodeProto *n = gp->node[k];
        if (!n) return tb_errorf(TB_ERR_FORMAT, "%s: node %zu is empty", s->label, k);
        for (size_t j = 0; j < n->n_input; j++)
            if (n->input[j] && *n->input[j]) TB_TRY(strmap_put(&s->used, n->input[j], 1));
    }
    for (size_t i = 0; i < gp->n_output; i++)
        if (gp->output[i] && gp->output[i]->name) TB_TRY(strmap_put(&s->used, gp->output[i]->name, 1));

    TB_TRY(import_inputs(s));
    TB_TRY(import_initializers(s));
    for (size_t k = 0; k < gp->n_node; k++) TB_TRY(check_node(s, gp->node[k], (int)k));
    if (s->n_reasons) return report_refused(s);
    for (size_t k = 0; k < gp->n_node; k++) TB_TRY(import_node(s, gp->node[k], (int)k));
    if (s->n_reasons) return report_refused(s);

    if (gp->n_output == 0) return tb_errorf(TB_ERR_FORMAT, "%s: the graph has no outputs", s->label);
    if (gp->n_output > TB_MAX_IO)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: %zu graph outputs (at most %d)", s->label, gp->n_output, TB_MAX_IO);
    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        int id;
        if (!vi || !vi->name || !strmap_get(&s->values, vi->name, &id) || id < 0)
            return tb_errorf(TB_ERR_FORMAT, "%s: graph output '%.200s' is not computed by any node", s->label,
                             vi && vi->name ? vi->name : "");
        s->g->outputs[s->g->n_outputs++] = id;
    }
    s->g->output = s->g->outputs[0];
    return tb_graph_check(s->g) == TB_OK ? TB_OK : tb_error_prefix(TB_ERR_FORMAT, "%s", s->label);
}

static tb_status import_buf(const char *label, const uint8_t *buf, size_t n, const char *base_dir,
                            const tb_onnx_options *o, tb_graph **out) {
    *out = NULL;
    if (!buf && n) return tb_errorf(TB_ERR_INVALID_ARG, "tb_onnx_import_buffer: no buffer");
    if (n == 0) return tb_errorf(TB_ERR_FORMAT, "%s is empty", label);
    if (n > ONNX_MAX_FILE)
        return tb_errorf(TB_ERR_FORMAT, "%s: %zu bytes, past protobuf's 2 GiB limit (large weights go in external data)",
                         label, n);
    if (!wire_ok(buf, n, &onnx__model_proto__descriptor, 0))
        return tb_errorf(TB_ERR_FORMAT, "%s: not an ONNX model (the protobuf is malformed or truncated)", label);
    imp s;
    memset(&s, 0, sizeof s);
    s.label = label;
    s.base_dir = base_dir;
    s.opt = o;
    s.m = onnx__model_proto__unpack(&pb_allocator, n, buf);
    if (!s.m) return tb_errorf(TB_ERR_FORMAT, "%s: not an ONNX model (the protobuf does not parse)", label);
    tb_status st;
    if (!s.m->has_ir_version || s.m->ir_version < 3 || !s.m->graph) {
        st = tb_errorf(TB_ERR_FORMAT, "%s: not an ONNX model (%s)", label,
                       !s.m->has_ir_version ? "no ir_version" : !s.m->graph ? "no graph" : "IR version before 3");
        goto done;
    }
    s.gp = s.m->graph;
    if ((st = check_opsets(&s)) != TB_OK) goto done;
    if (!(s.g = tb_graph_new())) { st = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    s.g->output = -1;
    st = import_model(&s);
done:
    if (st == TB_OK) *out = s.g;
    else tb_graph_free(s.g);
    imp_free(&s);
    onnx__model_proto__free_unpacked(s.m, &pb_allocator);
    return st;
}

tb_status tb_onnx_import_buffer(const void *buf, size_t n, const char *base_dir, const tb_onnx_options *o,
                                tb_graph **out) {
    return import_buf("ONNX model", buf, n, base_dir, o, out);
}

tb_status tb_onnx_import(const char *path, const tb_onnx_options *o, tb_graph **out) {
    *out = NULL;
    tb_mapped_file f;
    TB_TRY(tb_file_map(path, &f));
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    tb_status st = import_buf(path, f.data, f.size, dir, o, out);
    tb_file_unmap(&f);
    return st;
}

/* ---------------------------------------------------------------- tensor files */

tb_status tb_onnx_read_tensor(const char *path, tb_tensor *out, char *name, size_t name_cap) {
    memset(out, 0, sizeof *out);
    if (name && name_cap) name[0] = 0;
    tb_mapped_file f;
    TB_TRY(tb_file_map(path, &f));
    if (f.size > ONNX_MAX_FILE || !wire_ok(f.data, f.size, &onnx__tensor_proto__descriptor, 0)) {
        tb_file_unmap(&f);
        return tb_errorf(TB_ERR_FORMAT, "%s: not a TensorProto (the protobuf is malformed or truncated)", path);
    }
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(&pb_allocator, f.size, f.data);
    tb_file_unmap(&f);
    if (!t) return tb_errorf(TB_ERR_FORMAT, "%s: not a TensorProto (the protobuf does not parse)", path);
    /* external data of a tensor file is relative to its folder, as for a model */
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    imp s;
    memset(&s, 0, sizeof s);
    s.label = path;
    s.base_dir = dir;
    tb_dtype dt;
    int rank;
    int64_t dims[TB_MAX_RANK];
    void *data;
    uint64_t nbytes;
    tb_status st = tensor_data(&s, t, t->name && *t->name ? t->name : "(unnamed)", &dt, &rank, dims, &data, &nbytes);
    if (st == TB_OK) {
        out->dtype = dt;
        out->rank = rank;
        memcpy(out->dims, dims, sizeof(int64_t) * (size_t)rank);
        out->data = data;
        if (name && name_cap) snprintf(name, name_cap, "%s", t->name ? t->name : "");
    }
    imp_free(&s);
    onnx__tensor_proto__free_unpacked(t, &pb_allocator);
    return st;
}

tb_status tb_onnx_write_tensor(const char *path, const char *name, const tb_tensor *t) {
    static const int types[TB_DTYPE_COUNT] = {
        [TB_F32] = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,   [TB_F16] = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16,
        [TB_BF16] = ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, [TB_I32] = ONNX__TENSOR_PROTO__DATA_TYPE__INT32,
        [TB_I8] = ONNX__TENSOR_PROTO__DATA_TYPE__INT8,     [TB_I64] = ONNX__TENSOR_PROTO__DATA_TYPE__INT64,
        [TB_BOOL] = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL,   [TB_U8] = ONNX__TENSOR_PROTO__DATA_TYPE__UINT8,
        [TB_F64] = ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE};
    if ((unsigned)t->dtype >= TB_DTYPE_COUNT || !types[t->dtype])
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: a %s tensor has no ONNX type", path, tb_dtype_name(t->dtype));
    if (t->rank < 0 || t->rank > TB_MAX_RANK) return tb_errorf(TB_ERR_INVALID_ARG, "%s: rank %d", path, t->rank);
    uint64_t nbytes;
    TB_TRY(tb_dtype_tensor_bytes(t->dtype, t->rank, t->dims, &nbytes));
    if (nbytes > ONNX_MAX_FILE - 4096)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: %llu bytes, past protobuf's 2 GiB limit", path,
                         (unsigned long long)nbytes);
    Onnx__TensorProto tp = ONNX__TENSOR_PROTO__INIT;
    int64_t dims[TB_MAX_RANK];
    memcpy(dims, t->dims, sizeof(int64_t) * (size_t)t->rank);
    tp.n_dims = (size_t)t->rank;
    tp.dims = dims;
    tp.has_data_type = 1;
    tp.data_type = types[t->dtype];
    tp.name = (char *)(name ? name : "");
    tp.has_raw_data = 1;
    tp.raw_data.len = (size_t)nbytes;
    tp.raw_data.data = t->data;
    size_t n = onnx__tensor_proto__get_packed_size(&tp);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return tb_errorf(TB_ERR_OOM, "%s: out of memory", path);
    onnx__tensor_proto__pack(&tp, buf);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(buf);
        return tb_errorf(TB_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    size_t w = fwrite(buf, 1, n, f);
    int bad = w != n || fclose(f) != 0;
    free(buf);
    return bad ? tb_errorf(TB_ERR_IO, "cannot write %s: %s", path, strerror(errno)) : TB_OK;
}

#endif /* TB_HAVE_ONNX */
