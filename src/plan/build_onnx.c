/*
 * build_onnx.c — `turbine build MODEL.onnx`: import with the optimisation
 * profile, run the pass pipeline (opt/), write a general engine (meta kind
 * "onnx", no tokenizer section); and the same in memory for `turbine exec`.
 */
#include <jansson.h>
#include <time.h>

#include "backend/backend.h"
#include "import/onnx.h"
#include "opt/opt.h"
#include "plan/engine.h"

int tb_is_onnx_path(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n >= 5 && !strcmp(path + n - 5, ".onnx");
}

/* The specs from --shapes / --min-shapes / --opt-shapes / --max-shapes. */
static tb_status parse_profile(const tb_build_options *o, tb_onnx_shape_spec *specs, int *n, int cap) {
    *n = 0;
    const char *texts[4] = {o->shapes, o->min_shapes, o->opt_shapes, o->max_shapes};
    const int which[4] = {3, 0, 1, 2};
    for (int i = 0; i < 4; i++)
        if (texts[i] && *texts[i]) TB_TRY(tb_onnx_parse_shapes(texts[i], which[i], specs, n, cap));
    for (int i = 0; i < *n; i++)
        for (int d = 0; d < specs[i].rank; d++)
            if (specs[i].min[d] < 0 || specs[i].min[d] > specs[i].opt[d] || specs[i].opt[d] > specs[i].max[d])
                return tb_errorf(TB_ERR_INVALID_ARG,
                                 "input %s dim %d: the profile needs min <= opt <= max (got %lld, %lld, %lld); give "
                                 "--min-shapes, --opt-shapes and --max-shapes for it",
                                 specs[i].name, d, (long long)specs[i].min[d], (long long)specs[i].opt[d],
                                 (long long)specs[i].max[d]);
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

tb_status tb_build_onnx(const char *model_path, const char *engine_path, const tb_build_options *opt,
                        tb_build_report *report) {
    double t0 = tb_now();
    tb_build_options o;
    if (opt) o = *opt; else tb_build_options_default(&o);
    if (o.weight_dtype != TB_F32)
        return tb_errorf(TB_ERR_UNSUPPORTED, "ONNX engines are built in f32 for now (--dtype %s asked)",
                         tb_dtype_name(o.weight_dtype));
    tb_onnx_shape_spec specs[TB_MAX_IO];
    int n_specs = 0;
    TB_TRY(parse_profile(&o, specs, &n_specs, TB_MAX_IO));
    tb_graph *g = NULL;
    uint8_t *graph_buf = NULL, *weights = NULL;
    char *meta = NULL, *hw = NULL;
    size_t graph_n = 0;
    uint64_t weights_n = 0;
    tb_status s;
    if ((s = compile(model_path, specs, n_specs, o.device, o.verbose, &g)) != TB_OK) goto done;
    if ((s = tb_pack_weights(g, &weights, &weights_n)) != TB_OK) goto done;
    if ((s = tb_graph_serialize(g, &graph_buf, &graph_n)) != TB_OK) goto done;
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *prof = json_array();
    for (int i = 0; i < g->n_syms; i++)
        json_array_append_new(prof, json_pack("{s:s, s:I, s:I, s:I}", "name", g->syms[i].name, "min",
                                              (json_int_t)g->syms[i].min, "opt", (json_int_t)g->syms[i].opt, "max",
                                              (json_int_t)g->syms[i].max));
    json_t *m = json_pack("{s:i, s:s, s:{s:s, s:o, s:o, s:i}, s:{s:s, s:f, s:s}, s:o}", "format_version",
                          (int)TB_ENGINE_VERSION, "kind", "onnx", "model", "source", model_path, "inputs",
                          io_json(g, g->inputs, g->n_inputs), "outputs", io_json(g, g->outputs, g->n_outputs),
                          "nodes", g->n_nodes, "build", "dtype", tb_dtype_name(o.weight_dtype), "build_seconds",
                          tb_now() - t0, "built_at", when, "profiles", prof);
    if (!m) { s = tb_errorf(TB_ERR_INTERNAL, "cannot encode engine metadata"); goto done; }
    meta = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(m);
    if (!meta) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    hw = tb_backend_fingerprint(o.device);
    if (!hw) { s = TB_ERR_HARDWARE; goto done; }
    tb_section_src secs[4] = {{"meta", meta, strlen(meta)},
                              {"hardware", hw, strlen(hw)},
                              {"graph", graph_buf, graph_n},
                              {"weights", weights, weights_n}};
    if ((s = tb_engine_write(engine_path, secs, 4)) != TB_OK) goto done;
    if (report) {
        memset(report, 0, sizeof *report);
        report->seconds = tb_now() - t0;
        FILE *f = fopen(engine_path, "rb");
        if (f) { fseek(f, 0, SEEK_END); report->engine_bytes = (uint64_t)ftell(f); fclose(f); }
    }
done:
    free(meta);
    free(hw);
    free(graph_buf);
    tb_free_aligned(weights);
    tb_graph_free(g);
    return s;
}

tb_status tb_engine_from_onnx(const char *model_path, const char *shapes, const char *device, int verbose,
                              tb_engine **out) {
    *out = NULL;
    tb_onnx_shape_spec specs[TB_MAX_IO];
    int n_specs = 0;
    if (shapes && *shapes) TB_TRY(tb_onnx_parse_shapes(shapes, 3, specs, &n_specs, TB_MAX_IO));
    tb_graph *g = NULL;
    TB_TRY(compile(model_path, specs, n_specs, device, verbose, &g));
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
