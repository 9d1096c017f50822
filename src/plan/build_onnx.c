/*
 * build_onnx.c — `turbine build MODEL.onnx`: import with the optimisation
 * profiles (their envelope), run the pass pipeline (opt/) and for --dtype
 * f16 the precision pass, checking the f16 graph against the f32 one with
 * the reference interpreter; for --dtype int8 the calibration (calib_onnx.c)
 * and the INT8 pass (opt/nn_quant.c), checked against f32 the same way; write a general engine (meta kind "onnx", the
 * profiles in the meta, no tokenizer section); and the same in memory for
 * `turbine exec`.
 */
#include <jansson.h>
#include <math.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/nn.h"
#include "import/onnx.h"
#include "ir/interp.h"
#include "opt/opt.h"
#include "plan/calib_onnx.h"
#include "plan/engine.h"
#include "runtime/runtime.h"

int tb_is_onnx_path(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n >= 5 && !strcmp(path + n - 5, ".onnx");
}

/* ---------------------------------------------------------------- profiles */

/* Checks min <= opt <= max in every spec. */
static tb_status check_specs(const tb_onnx_shape_spec *specs, int n, const char *hint) {
    for (int i = 0; i < n; i++)
        for (int d = 0; d < specs[i].rank; d++)
            if (specs[i].min[d] < 0 || specs[i].min[d] > specs[i].opt[d] || specs[i].opt[d] > specs[i].max[d])
                return tb_errorf(TB_ERR_INVALID_ARG,
                                 "input %s dim %d: the profile needs min <= opt <= max (got %lld, %lld, %lld); %s",
                                 specs[i].name, d, (long long)specs[i].min[d], (long long)specs[i].opt[d],
                                 (long long)specs[i].max[d], hint);
    return TB_OK;
}

/* The specs from --shapes / --min-shapes / --opt-shapes / --max-shapes. */
static tb_status parse_profile(const tb_build_options *o, tb_onnx_shape_spec *specs, int *n, int cap) {
    *n = 0;
    const char *texts[4] = {o->shapes, o->min_shapes, o->opt_shapes, o->max_shapes};
    const int which[4] = {3, 0, 1, 2};
    for (int i = 0; i < 4; i++)
        if (texts[i] && *texts[i]) TB_TRY(tb_onnx_parse_shapes(texts[i], which[i], specs, n, cap));
    return check_specs(specs, *n, "give --min-shapes, --opt-shapes and --max-shapes for it");
}

/* One --profile value: "x:MIN/OPT/MAX,y:SHAPE" (each shape NxN...). */
static tb_status parse_profile_text(const char *text, tb_onnx_shape_spec *specs, int *n, int cap) {
    *n = 0;
    const char *p = text;
    if (!p || !*p) return tb_errorf(TB_ERR_INVALID_ARG, "an empty --profile");
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (p[i] == ':') colon = p + i;
        if (!colon || colon == p || len >= 1024)
            return tb_errorf(TB_ERR_INVALID_ARG, "'%.*s' is not name:MIN/OPT/MAX (e.g. x:1x3x224x224/8x3x224x224/"
                             "32x3x224x224) nor name:SHAPE", (int)(len < 200 ? len : 200), p);
        size_t nl = (size_t)(colon - p);
        const char *q = colon + 1, *qe = p + len;
        const char *parts[3];
        size_t plen[3];
        int np = 0;
        while (np < 4) {
            const char *sl = memchr(q, '/', (size_t)(qe - q));
            if (np == 3) { np = 4; break; }
            parts[np] = q;
            plen[np] = sl ? (size_t)(sl - q) : (size_t)(qe - q);
            np++;
            if (!sl) break;
            q = sl + 1;
        }
        if (np != 1 && np != 3)
            return tb_errorf(TB_ERR_INVALID_ARG, "'%.*s': give one shape (fixed) or three, MIN/OPT/MAX", (int)len, p);
        for (int k = 0; k < np; k++) {
            char one[1200];
            snprintf(one, sizeof one, "%.*s:%.*s", (int)nl, p, (int)plen[k], parts[k]);
            TB_TRY(tb_onnx_parse_shapes(one, np == 1 ? 3 : k, specs, n, cap));
        }
        p += len;
        if (*p == ',') p++;
    }
    return check_specs(specs, *n, "each profile's shapes are MIN/OPT/MAX");
}

/* "x:1x3/2x3/4x3,y:1x8" from specs. */
static void specs_text(const tb_onnx_shape_spec *sp, int n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
#define PUT(...) do { if (k < cap) k += (size_t)snprintf(buf + k, cap - k, __VA_ARGS__); } while (0)
    for (int i = 0; i < n; i++) {
        PUT("%s%s:", i ? "," : "", sp[i].name);
        int fixed = 1;
        for (int j = 0; j < sp[i].rank; j++) fixed &= sp[i].min[j] == sp[i].max[j] && sp[i].min[j] == sp[i].opt[j];
        for (int w = 0; w < (fixed ? 1 : 3); w++) {
            const int64_t *d = w == 0 ? sp[i].min : w == 1 ? sp[i].opt : sp[i].max;
            if (w) PUT("/");
            for (int j = 0; j < sp[i].rank; j++) PUT("%s%lld", j ? "x" : "", (long long)d[j]);
        }
    }
#undef PUT
}

typedef struct {
    int n;
    tb_onnx_shape_spec specs[TB_MAX_PROFILES][TB_MAX_IO];
    int n_specs[TB_MAX_PROFILES];
    tb_onnx_shape_spec env[TB_MAX_IO]; /* the envelope: what the importer sees */
    int n_env;
} profile_specs;

/* The profiles asked for (--profile, else the one of --shapes etc.) and
 * their envelope. */
static tb_status parse_profiles(const tb_build_options *o, profile_specs *ps) {
    memset(ps, 0, sizeof *ps);
    if (o->n_profiles <= 0) {
        TB_TRY(parse_profile(o, ps->specs[0], &ps->n_specs[0], TB_MAX_IO));
        ps->n = 1;
    } else {
        if ((o->shapes && *o->shapes) || (o->min_shapes && *o->min_shapes) || (o->opt_shapes && *o->opt_shapes) ||
            (o->max_shapes && *o->max_shapes))
            return tb_errorf(TB_ERR_INVALID_ARG, "give the profiles either with --profile or with --shapes / "
                             "--min-shapes / --opt-shapes / --max-shapes, not both");
        if (o->n_profiles > TB_MAX_PROFILES)
            return tb_errorf(TB_ERR_INVALID_ARG, "%d profiles given, at most %d", o->n_profiles, TB_MAX_PROFILES);
        for (int p = 0; p < o->n_profiles; p++) {
            tb_status s = parse_profile_text(o->profiles[p], ps->specs[p], &ps->n_specs[p], TB_MAX_IO);
            if (s != TB_OK) return tb_error_prefix(s, "--profile %d", p + 1);
        }
        ps->n = o->n_profiles;
    }
    /* every profile names the same inputs, with the same ranks */
    for (int p = 0; p < ps->n; p++)
        for (int i = 0; i < ps->n_specs[p]; i++) {
            const tb_onnx_shape_spec *a = &ps->specs[p][i];
            for (int q = 0; q < ps->n; q++) {
                int found = 0;
                for (int j = 0; j < ps->n_specs[q] && !found; j++) {
                    const tb_onnx_shape_spec *b = &ps->specs[q][j];
                    if (strcmp(a->name, b->name)) continue;
                    found = 1;
                    if (a->rank != b->rank)
                        return tb_errorf(TB_ERR_INVALID_ARG, "input %s has %d dims in profile %d, %d in profile %d",
                                         a->name, a->rank, p + 1, b->rank, q + 1);
                }
                if (!found)
                    return tb_errorf(TB_ERR_INVALID_ARG, "profile %d gives a shape for input %s, profile %d none: "
                                     "every profile gives every input's shapes", p + 1, a->name, q + 1);
            }
        }
    /* the envelope: smallest min, largest max, the first profile's opt */
    ps->n_env = ps->n_specs[0];
    memcpy(ps->env, ps->specs[0], sizeof(tb_onnx_shape_spec) * (size_t)ps->n_env);
    for (int p = 1; p < ps->n; p++)
        for (int i = 0; i < ps->n_specs[p]; i++)
            for (int j = 0; j < ps->n_env; j++) {
                if (strcmp(ps->env[j].name, ps->specs[p][i].name)) continue;
                for (int d = 0; d < ps->env[j].rank; d++) {
                    if (ps->specs[p][i].min[d] < ps->env[j].min[d]) ps->env[j].min[d] = ps->specs[p][i].min[d];
                    if (ps->specs[p][i].max[d] > ps->env[j].max[d]) ps->env[j].max[d] = ps->specs[p][i].max[d];
                }
            }
    return TB_OK;
}

/* Each profile's range of every symbol of g (imported for the envelope):
 * the dims of the inputs bound to it, intersected over the inputs naming
 * it; a symbol no spec names keeps the envelope's range. */
static tb_status profile_symbols(const tb_graph *g, const profile_specs *ps, tb_profile_set *out) {
    memset(out, 0, sizeof *out);
    out->n = ps->n;
    for (int p = 0; p < ps->n; p++) {
        int set[TB_MAX_SYMS] = {0};
        memcpy(out->syms[p], g->syms, sizeof(tb_symbol) * (size_t)g->n_syms);
        specs_text(ps->specs[p], ps->n_specs[p], out->text[p], sizeof out->text[p]);
        for (int i = 0; i < g->n_inputs; i++) {
            const tb_value *v = &g->values[g->inputs[i]];
            char idx[16];
            snprintf(idx, sizeof idx, "#%d", i);
            const tb_onnx_shape_spec *sp = NULL;
            for (int k = 0; k < ps->n_specs[p] && !sp; k++)
                if (!strcmp(ps->specs[p][k].name, v->name) || !strcmp(ps->specs[p][k].name, idx))
                    sp = &ps->specs[p][k];
            if (!sp || sp->rank != v->rank) continue;
            for (int d = 0; d < v->rank; d++) {
                if (!TB_IS_SYM(v->dims[d])) continue;
                int y = TB_SYM_INDEX(v->dims[d]);
                tb_symbol *s = &out->syms[p][y];
                if (!set[y]) {
                    s->min = sp->min[d], s->opt = sp->opt[d], s->max = sp->max[d];
                    set[y] = 1;
                    continue;
                }
                if (sp->min[d] > s->min) s->min = sp->min[d];
                if (sp->max[d] < s->max) s->max = sp->max[d];
                if (s->opt < s->min) s->opt = s->min;
                if (s->opt > s->max) s->opt = s->max;
                if (s->min > s->max)
                    return tb_errorf(TB_ERR_INVALID_ARG, "profile %d: the inputs bound to dim %s give it ranges "
                                     "with nothing in common", p + 1, s->name);
            }
        }
    }
    return TB_OK;
}

static json_t *io_json(const tb_graph *g, const int *vals, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        const tb_value *v = &g->values[vals[i]];
        char shape[256];
        tb_value_shape_str(g, v, shape, sizeof shape);
        json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "name", v->name, "dtype", tb_dtype_name(v->dtype),
                                           "shape", shape));
    }
    return a;
}

/* Import and optimise. */
static tb_status compile(const char *model_path, const tb_onnx_shape_spec *specs, int n_specs, const char *device,
                         int verbose, tb_graph **out) {
    *out = NULL;
    tb_onnx_options io = {.shapes = specs, .n_shapes = n_specs};
    tb_graph *g = NULL;
    TB_TRY(tb_onnx_import(model_path, &io, &g));
    tb_opt_options oo;
    memset(&oo, 0, sizeof oo);
    char kind[16];
    int idx;
    if (tb_device_parse(device ? device : "cpu", kind, &idx) != TB_OK) snprintf(kind, sizeof kind, "cpu");
    snprintf(oo.device, sizeof oo.device, "%s", kind);
    oo.dtype = TB_F32;
    oo.verbose = verbose;
    int n_passes;
    const tb_pass *passes = tb_opt_nn_pipeline(&n_passes);
    if (verbose) tb_log(TB_LOG_INFO, "%s: %d nodes, %d values imported", model_path, g->n_nodes, g->n_values);
    tb_status s = tb_opt_run(g, passes, n_passes, &oo);
    if (s != TB_OK) { tb_graph_free(g); return s; }
    *out = g;
    return TB_OK;
}

tb_status tb_engine_write_general(tb_graph *g, const char *engine_path, const char *device, const char *source,
                                  double build_seconds) {
    return tb_engine_write_profiles(g, engine_path, device, source, build_seconds, NULL);
}

static json_t *symbols_json(const tb_symbol *syms, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:I}", "name", syms[i].name, "min",
                                           (json_int_t)syms[i].min, "opt", (json_int_t)syms[i].opt, "max",
                                           (json_int_t)syms[i].max));
    return a;
}

tb_status tb_engine_write_profiles(tb_graph *g, const char *engine_path, const char *device, const char *source,
                                   double build_seconds, const tb_profile_set *ps) {
    uint8_t *graph_buf = NULL, *weights = NULL;
    char *meta = NULL, *hw = NULL;
    size_t graph_n = 0;
    uint64_t weights_n = 0;
    tb_status s;
    if ((s = tb_pack_weights(g, &weights, &weights_n)) != TB_OK) goto done;
    if ((s = tb_graph_serialize(g, &graph_buf, &graph_n)) != TB_OK) goto done;
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *prof = json_array();
    if (!ps) {
        json_array_append_new(prof, json_pack("{s:s, s:o}", "inputs", "", "symbols", symbols_json(g->syms, g->n_syms)));
    } else {
        for (int p = 0; p < ps->n; p++)
            json_array_append_new(prof, json_pack("{s:s, s:o}", "inputs", ps->text[p], "symbols",
                                                  symbols_json(ps->syms[p], g->n_syms)));
    }
    tb_dtype wdt = TB_F32;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == TB_VAL_WEIGHT && (g->values[v].dtype == TB_F16 || g->values[v].dtype == TB_BF16))
            wdt = g->values[v].dtype;
    for (int k = 0; k < g->n_nodes; k++) /* quantized ops: an INT8 engine */
        if (g->nodes[k].op == TB_OP_QCONV || g->nodes[k].op == TB_OP_QGEMM) wdt = TB_I8;
    json_t *m = json_pack("{s:i, s:s, s:{s:s, s:o, s:o, s:i}, s:{s:s, s:f, s:s}, s:o}", "format_version",
                          (int)TB_ENGINE_VERSION, "kind", "onnx", "model", "source", source ? source : "?", "inputs",
                          io_json(g, g->inputs, g->n_inputs), "outputs", io_json(g, g->outputs, g->n_outputs),
                          "nodes", g->n_nodes, "build", "dtype", tb_dtype_name(wdt), "build_seconds", build_seconds,
                          "built_at", when, "profiles", prof);
    if (!m) { s = tb_errorf(TB_ERR_INTERNAL, "cannot encode engine metadata"); goto done; }
    meta = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(m);
    if (!meta) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    hw = tb_backend_fingerprint(device);
    if (!hw) { s = TB_ERR_HARDWARE; goto done; }
    tb_section_src secs[4] = {{"meta", meta, strlen(meta)},
                              {"hardware", hw, strlen(hw)},
                              {"graph", graph_buf, graph_n},
                              {"weights", weights, weights_n}};
    s = tb_engine_write(engine_path, secs, 4);
done:
    free(meta);
    free(hw);
    free(graph_buf);
    free(weights);
    return s;
}

/* ---------------------------------------------------------------- f16 */

/* A deep copy of g (weights' data copied, owned). */
static tb_graph *graph_clone(const tb_graph *g) {
    tb_graph *c = tb_graph_new();
    if (!c) return NULL;
    *c = *g;
    c->values = malloc(((size_t)g->n_values + 1) * sizeof *c->values);
    c->nodes = malloc(((size_t)g->n_nodes + 1) * sizeof *c->nodes);
    c->cap_values = g->n_values + 1;
    c->cap_nodes = g->n_nodes + 1;
    c->n_values = 0;
    if (!c->values || !c->nodes) { tb_graph_free(c); return NULL; }
    memcpy(c->nodes, g->nodes, (size_t)g->n_nodes * sizeof *c->nodes);
    for (int v = 0; v < g->n_values; v++) {
        tb_value x = g->values[v];
        if (x.data) {
            void *d = malloc(x.nbytes ? (size_t)x.nbytes : 1);
            if (!d) { tb_graph_free(c); return NULL; }
            memcpy(d, x.data, (size_t)x.nbytes);
            x.data = d;
            x.owned = 1;
        } else {
            x.owned = 0;
        }
        c->values[c->n_values++] = x;
    }
    return c;
}

/* Pseudo-random contents for an input: floats in [-1, 1), integers in
 * [0, 10) (valid ids and indices for any table), bools 1. */
static void fill_input(tb_view *v, uint64_t seed) {
    int64_t n = tb_view_numel(v);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        switch (v->dtype) {
        case TB_F32: ((float *)v->data)[i] = (float)(2 * u - 1); break;
        case TB_F16: ((uint16_t *)v->data)[i] = tb_f32_to_f16((float)(2 * u - 1)); break;
        case TB_BF16: ((uint16_t *)v->data)[i] = tb_f32_to_bf16((float)(2 * u - 1)); break;
        case TB_F64: ((double *)v->data)[i] = 2 * u - 1; break;
        case TB_I64: ((int64_t *)v->data)[i] = (int64_t)(u * 10); break;
        case TB_I32: ((int32_t *)v->data)[i] = (int32_t)(u * 10); break;
        case TB_BOOL: ((uint8_t *)v->data)[i] = 1; break;
        default: ((uint8_t *)v->data)[i] = (uint8_t)(u * 10); break;
        }
    }
}

/* The inputs of sample `k`: calibration data from dir (calib_onnx.h's
 * layouts), else random at the opt shapes. 1: filled; 0: no such sample. */
static tb_status sample_inputs(const tb_graph *g, const char *dir, int k, tb_view *in, int *got) {
    *got = 0;
    memset(in, 0, sizeof(tb_view) * (size_t)g->n_inputs);
    if (dir) return tb_calib_onnx_sample(g, dir, k, in, got);
    for (int i = 0; i < g->n_inputs; i++) {
        const tb_value *v = &g->values[g->inputs[i]];
        in[i].dtype = v->dtype;
        in[i].rank = v->rank;
        for (int d = 0; d < v->rank; d++)
            in[i].dims[d] = TB_IS_SYM(v->dims[d]) ? g->syms[TB_SYM_INDEX(v->dims[d])].opt : v->dims[d];
        int64_t n = tb_view_numel(&in[i]);
        in[i].data = malloc((size_t)(n > 0 ? n : 1) * tb_dtype_size(v->dtype));
        if (!in[i].data) {
            for (int j = 0; j < i; j++) free(in[j].data);
            return tb_errorf(TB_ERR_OOM, "out of memory");
        }
        fill_input(&in[i], 1000 + 31 * (uint64_t)k + (uint64_t)i);
    }
    *got = 1;
    return TB_OK;
}

typedef struct {
    double max_abs, max_rel, ref_max;
    int64_t rows, agree; /* top-1 over the last dim */
} out_err;

/* Compares output y (f16 graph) with ref (f32 graph), elements as doubles. */
static void compare_output(const tb_view *y, const tb_view *ref, out_err *e) {
    int64_t n = tb_view_numel(ref);
    if (tb_view_numel(y) != n) { e->max_abs = e->max_rel = INFINITY; return; }
    double big = 0;
    for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(tb_view_get_f(ref, i)));
    e->ref_max = fmax(e->ref_max, big);
    /* relative to each element, small ones (under 1e-3 of the largest)
     * against that floor */
    double floor_ = fmax(1e-2 * big, 1e-30);
    for (int64_t i = 0; i < n; i++) {
        double a = tb_view_get_f(y, i), b = tb_view_get_f(ref, i), d = fabs(a - b);
        if (d != d) d = INFINITY;
        e->max_abs = fmax(e->max_abs, d);
        e->max_rel = fmax(e->max_rel, d / fmax(fabs(b), floor_));
    }
    int64_t last = ref->rank ? ref->dims[ref->rank - 1] : 1;
    if (last > 1 && n > 0)
        for (int64_t r = 0; r < n / last; r++) {
            int64_t ia = 0, ib = 0;
            for (int64_t j = 1; j < last; j++) {
                if (tb_view_get_f(y, r * last + j) > tb_view_get_f(y, r * last + ia)) ia = j;
                if (tb_view_get_f(ref, r * last + j) > tb_view_get_f(ref, r * last + ib)) ib = j;
            }
            e->rows++;
            e->agree += ia == ib;
        }
}

/* Runs both graphs on a few inputs and writes one line per output into
 * text: the f32 graph on the CPU's kernels, the f16 graph on the device the
 * engine is built for (on the CPU that is the reference kernels: past
 * TB_F16_CHECK_CPU_MAX bytes of weights the check is skipped there, with a
 * line saying so). Takes g32 and g16c (copies), frees both. */
#define TB_F16_CHECK_CPU_MAX ((uint64_t)64 << 20)
static tb_status check_accuracy(tb_graph *g32, tb_graph *g16c, const char *device, const char *calib, char *text,
                                size_t cap, const char *what, int max_samples) {
    int n_in = g32->n_inputs, n_out = g32->n_outputs;
    char kind[16];
    int idx;
    if (tb_device_parse(device ? device : "cpu", kind, &idx) != TB_OK) snprintf(kind, sizeof kind, "cpu");
    uint64_t wbytes = 0;
    for (int v = 0; v < g16c->n_values; v++)
        if (g16c->values[v].kind == TB_VAL_WEIGHT) wbytes += g16c->values[v].nbytes;
    if (!strcmp(kind, "cpu") && wbytes > TB_F16_CHECK_CPU_MAX && !strcmp(what, "f16")) {
        snprintf(text, cap, "f16 against f32: not checked (%.0f MB of weights: the CPU runs f16 graphs on the "
                 "reference kernels; build with --device cuda to check on the GPU)\n", (double)wbytes / 1e6);
        tb_graph_free(g32);
        tb_graph_free(g16c);
        return TB_OK;
    }
    tb_engine *e32 = NULL, *e16 = NULL;
    tb_exec *x32 = NULL, *x16 = NULL;
    tb_status s = tb_engine_from_graph(g32, "cpu", &e32);
    tb_status s2 = tb_engine_from_graph(g16c, device ? device : "cpu", &e16);
    if (s == TB_OK) s = s2;
    if (s == TB_OK) s = tb_exec_create(e32, NULL, &x32);
    if (s == TB_OK) s = tb_exec_create(e16, NULL, &x16);
    out_err err[TB_MAX_IO];
    memset(err, 0, sizeof err);
    int n_samples = 0;
    for (int k = 0; k < max_samples && s == TB_OK; k++) {
        tb_view in[TB_MAX_IO];
        int got;
        if ((s = sample_inputs(e32->graph, calib, k, in, &got)) != TB_OK || !got) break;
        tb_tensor ti[TB_MAX_IO], a[TB_MAX_IO], b[TB_MAX_IO];
        for (int i = 0; i < n_in; i++) {
            ti[i].dtype = in[i].dtype;
            ti[i].rank = in[i].rank;
            memcpy(ti[i].dims, in[i].dims, sizeof ti[i].dims);
            ti[i].data = in[i].data;
        }
        s = tb_exec_run(x32, ti, n_in, a, n_out);
        if (s != TB_OK) tb_error_prefix(s, "the f32 graph");
        if (s == TB_OK && (s = tb_exec_run(x16, ti, n_in, b, n_out)) != TB_OK) tb_error_prefix(s, "the %s graph", what);
        for (int i = 0; i < n_out && s == TB_OK; i++) {
            tb_view va = {a[i].dtype, a[i].rank, {0}, a[i].data}, vb = {b[i].dtype, b[i].rank, {0}, b[i].data};
            memcpy(va.dims, a[i].dims, sizeof va.dims);
            memcpy(vb.dims, b[i].dims, sizeof vb.dims);
            if (va.dtype != TB_BOOL && vb.dtype != TB_BOOL) compare_output(&vb, &va, &err[i]);
        }
        for (int i = 0; i < n_in; i++) free(in[i].data);
        if (s == TB_OK) n_samples++;
    }
    size_t n = 0;
    text[0] = 0;
#define PUT(...) do { if (n < cap) n += (size_t)snprintf(text + n, cap - n, __VA_ARGS__); } while (0)
    if (s == TB_OK) {
        PUT("%s on %s against f32 on the CPU (%d %s):\n", what, kind, n_samples,
            calib ? (n_samples == 1 ? "calibration input set" : "calibration input sets") : n_samples == 1 ? "random input at the opt shapes"
                                                             : "random inputs at the opt shapes");
        for (int i = 0; i < n_out; i++) {
            const out_err *e = &err[i];
            PUT("    %-24s max abs err %.3g (of values up to %.3g), max rel err %.3g",
                e32->graph->values[e32->graph->outputs[i]].name, e->max_abs, e->ref_max, e->max_rel);
            if (e->rows) PUT(", top-1 agreement %.1f%% of %lld rows", 100.0 * (double)e->agree / (double)e->rows,
                             (long long)e->rows);
            PUT("\n");
        }
    }
#undef PUT
    tb_exec_free(x32);
    tb_exec_free(x16);
    tb_engine_free(e32);
    tb_engine_free(e16);
    return s == TB_OK ? TB_OK : tb_error_prefix(s, "checking %s accuracy", what);
}

/* ---------------------------------------------------------------- int8 */

#define TB_INT8_CHECK_SAMPLES 64 /* calibration sets the accuracy report runs */

/* The INT8 step of a build: calibration (or the cache), the INT8 pass over
 * g with the activation scales, the accuracy report against f32 into text. */
static tb_status build_int8(const tb_build_options *o, const char *model_path, tb_graph *g, char *text, size_t cap) {
    int n_explicit = 0;
    for (int k = 0; k < g->n_nodes; k++) n_explicit += g->nodes[k].op == TB_OP_QCONV || g->nodes[k].op == TB_OP_QGEMM;
    /* percentile=99.99 unless asked: on ResNet-18 with 8 calibration sets
     * entropy kept 66% top-1 agreement, percentile 100% (docs/ONNX.md) */
    tb_calibrator cal = {TB_CALIB_PERCENTILE, 99.99};
    if (o->calibrator) TB_TRY(tb_calibrator_parse(o->calibrator, &cal));
    char cal_name[48];
    tb_calibrator_name(&cal, cal_name, sizeof cal_name);
    FILE *cf = o->calib_cache ? fopen(o->calib_cache, "r") : NULL;
    int have_cache = cf != NULL;
    if (cf) fclose(cf);
    if (!have_cache && !o->calib_data) {
        if (n_explicit) {
            snprintf(text, cap, "int8: %d Conv / Gemm / MatMul quantized by the model's QuantizeLinear / "
                     "DequantizeLinear nodes (no calibration)\n", n_explicit);
            return TB_OK;
        }
        return tb_errorf(TB_ERR_INVALID_ARG, "--dtype int8 needs calibration data: --calib-data DIR (test_data_set_N/"
                         "input_K.pb or NAME_N.npy files, docs/ONNX.md) or an existing --calib-cache FILE (a model "
                         "with QuantizeLinear / DequantizeLinear nodes needs neither)");
    }
    uint64_t fp;
    TB_TRY(tb_onnx_fingerprint(model_path, &fp));
    tb_nn_quant_options q;
    memset(&q, 0, sizeof q);
    q.overrides = o->overrides;
    q.n_overrides = o->n_overrides;
    tb_calib_table *t = NULL;
    tb_graph *g32 = NULL;
    tb_nn_act_quant *acts = NULL;
    tb_status s;
    int n_samples = 0;
    double t0 = tb_now();
    if (have_cache) {
        if ((s = tb_calib_cache_read(o->calib_cache, cal_name, fp, &t)) != TB_OK) goto done;
        if (o->verbose) tb_log(TB_LOG_INFO, "calibration cache %s: %d activations", o->calib_cache, t->n);
    } else {
        tb_graph *gc = graph_clone(g);
        if (!gc) { s = tb_errorf(TB_ERR_OOM, "out of memory copying the graph"); goto done; }
        int threads = o->calib_threads > 0 ? o->calib_threads : tb_default_threads();
        if ((s = tb_calib_onnx_run(gc, o->calib_data, &cal, &q, TB_CALIB_ONNX_MAX_SAMPLES, threads, fp, &t,
                                   &n_samples)) != TB_OK)
            goto done;
        if (o->verbose)
            tb_log(TB_LOG_INFO, "calibrated %d activations over %d samples (%s) in %.2f s", t->n, n_samples, cal_name,
                   tb_now() - t0);
        if (o->calib_cache && (s = tb_calib_cache_write(o->calib_cache, t)) != TB_OK) goto done;
    }
    if ((s = tb_calib_onnx_acts(t, &acts, &q.n_acts)) != TB_OK) goto done;
    q.acts = acts;
    if (o->calib_data && !(g32 = graph_clone(g))) { s = tb_errorf(TB_ERR_OOM, "out of memory copying the graph"); goto done; }
    static const tb_pass int8_passes[] = {
        {"quantize-int8", tb_opt_quantize_nn, "calibrated Conv / Gemm / MatMul to int8 QConv / QGemm"},
        {"plan-memory", tb_opt_plan_memory_pass, "activation bytes without reuse vs. the planned arena"},
    };
    tb_opt_options oo;
    memset(&oo, 0, sizeof oo);
    snprintf(oo.device, sizeof oo.device, "cpu");
    oo.dtype = TB_F32;
    oo.verbose = o->verbose;
    oo.nn_quant = &q;
    if ((s = tb_opt_run(g, int8_passes, 2, &oo)) != TB_OK) goto done;
    int nq = 0, nf = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_op_kind op = g->nodes[k].op;
        nq += op == TB_OP_QCONV || op == TB_OP_QGEMM;
        nf += op == TB_OP_CONV || op == TB_OP_GEMM || op == TB_OP_NN_MATMUL;
    }
    size_t n = (size_t)snprintf(text, cap, "int8: %d Conv / Gemm / MatMul quantized, %d left in f32; %s "
                                "calibration%s\n", nq, nf, cal_name, have_cache ? " from the cache" : "");
    if (g32 && n < cap) {
        tb_graph *gq = graph_clone(g);
        if (!gq) { s = tb_errorf(TB_ERR_OOM, "out of memory copying the graph"); goto done; }
        s = check_accuracy(g32, gq, "cpu", o->calib_data, text + n, cap - n, "int8", TB_INT8_CHECK_SAMPLES);
        g32 = NULL; /* freed */
    }
done:
    tb_graph_free(g32);
    tb_calib_table_free(t);
    free(acts);
    return s;
}

tb_status tb_build_onnx(const char *model_path, const char *engine_path, const tb_build_options *opt,
                        tb_build_report *report) {
    double t0 = tb_now();
    tb_build_options o;
    if (opt) o = *opt; else tb_build_options_default(&o);
    if (o.weight_dtype != TB_F32 && o.weight_dtype != TB_F16 && o.weight_dtype != TB_I8)
        return tb_errorf(TB_ERR_UNSUPPORTED, "ONNX engines are built in f32, f16 or int8 (--dtype %s asked)",
                         tb_dtype_name(o.weight_dtype));
    if (o.calib_data && o.weight_dtype == TB_F32)
        return tb_errorf(TB_ERR_INVALID_ARG, "--calib-data is for --dtype int8 builds (calibration) and f16 builds "
                         "(their accuracy check)");
    if (o.weight_dtype == TB_I8) {
        char kind[16];
        int idx;
        if (tb_device_parse(o.device ? o.device : "cpu", kind, &idx) != TB_OK) snprintf(kind, sizeof kind, "cpu");
        if (strcmp(kind, "cpu"))
            return tb_errorf(TB_ERR_UNSUPPORTED, "--dtype int8 ONNX engines run on the CPU only (--device %s asked; "
                             "INT8 on the GPU is not supported yet: build --dtype f16 for it)", o.device);
    }
    profile_specs *ps = calloc(1, sizeof *ps);
    tb_profile_set *set = calloc(1, sizeof *set);
    tb_graph *g = NULL, *g32 = NULL;
    char accuracy[2048] = "";
    tb_status s;
    if (!ps || !set) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    if ((s = parse_profiles(&o, ps)) != TB_OK) goto done;
    if ((s = compile(model_path, ps->env, ps->n_env, o.device, o.verbose, &g)) != TB_OK) goto done;
    if ((s = profile_symbols(g, ps, set)) != TB_OK) goto done;
    if (o.weight_dtype == TB_F32 && (!o.device || !strncmp(o.device, "cpu", 3))) {
        /* the CPU's Conv tactics, timed at the opt shapes (backend/cpu/nn_tune.c) */
        int n_tuned = 0;
        if ((s = tb_cpu_nn_tune_convs(g, tb_default_threads(), o.verbose, &n_tuned)) != TB_OK) goto done;
        if (o.verbose && n_tuned) tb_log(TB_LOG_INFO, "conv tactics timed for %d Conv nodes", n_tuned);
    }
    if (o.weight_dtype == TB_F16) {
        if (!(g32 = graph_clone(g))) { s = tb_errorf(TB_ERR_OOM, "out of memory copying the graph"); goto done; }
        static const tb_pass f16_passes[] = {
            {"precision-f16", tb_opt_precision,
             "f32 weights and activations to f16, Casts at the graph's f32 inputs and outputs"},
            {"plan-memory", tb_opt_plan_memory_pass, "activation bytes without reuse vs. the planned arena"},
        };
        tb_opt_options oo;
        memset(&oo, 0, sizeof oo);
        char kind[16];
        int idx;
        if (tb_device_parse(o.device ? o.device : "cpu", kind, &idx) != TB_OK) snprintf(kind, sizeof kind, "cpu");
        snprintf(oo.device, sizeof oo.device, "%s", kind);
        oo.dtype = TB_F16;
        oo.verbose = o.verbose;
        if ((s = tb_opt_run(g, f16_passes, 2, &oo)) != TB_OK) goto done;
        tb_graph *g16c = graph_clone(g);
        if (!g16c) { s = tb_errorf(TB_ERR_OOM, "out of memory copying the graph"); goto done; }
        s = check_accuracy(g32, g16c, o.device, o.calib_data, accuracy, sizeof accuracy, "f16", 3); /* frees both */
        g32 = NULL;
        if (s != TB_OK) goto done;
    }
    if (o.weight_dtype == TB_I8 && (s = build_int8(&o, model_path, g, accuracy, sizeof accuracy)) != TB_OK) goto done;
    s = tb_engine_write_profiles(g, engine_path, o.device, model_path, tb_now() - t0, set);
    if (s == TB_OK && report) {
        memset(report, 0, sizeof *report);
        report->seconds = tb_now() - t0;
        snprintf(report->accuracy, sizeof report->accuracy, "%s", accuracy);
        FILE *f = fopen(engine_path, "rb");
        if (f) { fseek(f, 0, SEEK_END); report->engine_bytes = (uint64_t)ftell(f); fclose(f); }
    }
done:
    tb_graph_free(g);
    tb_graph_free(g32);
    free(ps);
    free(set);
    return s;
}

tb_status tb_engine_from_graph(tb_graph *g, const char *device, tb_engine **out) {
    *out = NULL;
    tb_engine *e = calloc(1, sizeof *e);
    if (!e) { tb_graph_free(g); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    e->map.fd = -1;
    e->graph = g;
    snprintf(e->info.arch, sizeof e->info.arch, "onnx");
    e->info.weight_dtype = TB_F32;
    e->info.bos_id = -1;
    snprintf(e->backend, sizeof e->backend, "%s", device ? device : "cpu");
    e->meta_json = strdup("{\"kind\":\"onnx\"}");
    e->hw_json = tb_backend_fingerprint(device);
    if (!e->meta_json || !e->hw_json) {
        tb_status s = e->hw_json ? tb_errorf(TB_ERR_OOM, "out of memory") : TB_ERR_HARDWARE;
        tb_engine_free(e);
        return s;
    }
    *out = e;
    return TB_OK;
}

tb_status tb_engine_from_onnx(const char *model_path, const char *shapes, const char *device, int verbose,
                              tb_engine **out) {
    *out = NULL;
    tb_onnx_shape_spec specs[TB_MAX_IO];
    int n_specs = 0;
    if (shapes && *shapes) TB_TRY(tb_onnx_parse_shapes(shapes, 3, specs, &n_specs, TB_MAX_IO));
    tb_graph *g = NULL;
    TB_TRY(compile(model_path, specs, n_specs, device, verbose, &g));
    return tb_engine_from_graph(g, device, out);
}
