/*
 * bench_exec.c — `turbine bench --engine FILE.engine` for a general (ONNX)
 * engine, as trtexec times one: inputs of the given shapes (--shapes, else
 * the opt shapes of the first profile, or of --profile-index K) filled with fixed
 * pseudo-random data, warm-up
 * runs, then timed runs for --iterations and at least --duration seconds;
 * prints throughput and latency min / mean / median / p90 / p99 / max and,
 * with --dump-profile, each layer's mean time and share.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "import/onnx.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "turbine/turbine.h"

int tb_bench_exec_main(int argc, char **argv);

static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "turbine bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: turbine bench --engine FILE.engine [--shapes IN:1x3x224x224,...] [--profile-index K]\n"
                    "           [--warmup N] [--iterations N] [--duration S] [--threads N] [--device D]\n"
                    "           [--dump-profile] [--json FILE]\n");
    return 2;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fill(tb_tensor *t, uint64_t seed) {
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dims[d];
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0; /* [0, 1) */
        switch (t->dtype) {
        case TB_F32: ((float *)t->data)[i] = (float)(2 * u - 1); break;
        case TB_F16: ((uint16_t *)t->data)[i] = tb_f32_to_f16((float)(2 * u - 1)); break;
        case TB_F64: ((double *)t->data)[i] = 2 * u - 1; break;
        case TB_I64: ((int64_t *)t->data)[i] = (int64_t)(u * 10); break;  /* small ids: valid indices */
        case TB_I32: ((int32_t *)t->data)[i] = (int32_t)(u * 10); break;
        case TB_BOOL: ((uint8_t *)t->data)[i] = 1; break;
        default: ((uint8_t *)t->data)[i] = (uint8_t)(u * 10); break;
        }
    }
}

static double pct(const double *sorted, int n, double p) {
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static int cmp_layer(const void *a, const void *b) {
    double x = ((const tb_exec_node_time *)a)->seconds, y = ((const tb_exec_node_time *)b)->seconds;
    return x > y ? -1 : x < y;
}

int tb_bench_exec_main(int argc, char **argv) {
    const char *path = NULL, *shapes = NULL, *device = NULL, *json_path = NULL;
    int warmup = 10, iters = 50, threads = 0, dump = 0, profile = 1;
    double duration = 2.0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--engine")) { if (!v) return usage("%s needs a value", a); path = v; i++; }
        else if (!strcmp(a, "--shapes")) { if (!v) return usage("%s needs a value", a); shapes = v; i++; }
        else if (!strcmp(a, "--profile-index")) { if (!v || !tb_cli_parse_int(v, 1, TB_MAX_PROFILES, &profile)) return usage("bad --profile-index '%s' (1, 2, ...)", v ? v : ""); i++; }
        else if (!strcmp(a, "--warmup")) { if (!v || !tb_cli_parse_int(v, 0, 1000000, &warmup)) return usage("bad --warmup '%s'", v ? v : ""); i++; }
        else if (!strcmp(a, "--iterations")) { if (!v || !tb_cli_parse_int(v, 1, 10000000, &iters)) return usage("bad --iterations '%s'", v ? v : ""); i++; }
        else if (!strcmp(a, "--duration")) {
            char *end;
            if (!v || (duration = strtod(v, &end), *end) || duration < 0 || duration > 3600)
                return usage("bad --duration '%s' (seconds, 0 to 3600)", v ? v : "");
            i++;
        }
        else if (!strcmp(a, "--threads")) { if (!v || !tb_cli_parse_int(v, 0, 1024, &threads)) return usage("bad --threads '%s'", v ? v : ""); i++; }
        else if (!strcmp(a, "--device")) { if (!v) return usage("%s needs a value", a); device = v; i++; }
        else if (!strcmp(a, "--json")) { if (!v) return usage("%s needs a value", a); json_path = v; i++; }
        else if (!strcmp(a, "--dump-profile")) dump = 1;
        else return usage("unknown option for a general engine: '%s'", a);
    }
    if (!path) return usage("%s", "--engine needs FILE.engine");
    tb_engine *e = NULL;
    tb_exec *x = NULL;
    tb_tensor in[TB_MAX_IO], out[TB_MAX_IO];
    memset(in, 0, sizeof in);
    double *lat = NULL;
    int rc = 1, n_in = 0;
    double t_load = tb_now();
    if (tb_engine_load_for(path, device, &e) != TB_OK) goto fail;
    t_load = tb_now() - t_load;
    tb_exec_options xo;
    tb_exec_options_default(&xo);
    xo.n_threads = threads;
    xo.device = device;
    if (tb_exec_create(e, &xo, &x) != TB_OK) goto fail;
    n_in = tb_exec_n_inputs(x);
    /* shapes: the profile's opt, replaced by --shapes where given */
    tb_onnx_shape_spec specs[TB_MAX_IO];
    int n_specs = 0;
    if (shapes && tb_onnx_parse_shapes(shapes, 3, specs, &n_specs, TB_MAX_IO) != TB_OK) {
        fprintf(stderr, "turbine bench: error: --shapes: %s\n", tb_last_error());
        rc = 2;
        goto done;
    }
    printf("engine: %s (general, %d inputs, %d outputs, load %.1f ms)\n", path, n_in, tb_exec_n_outputs(x),
           t_load * 1e3);
    const tb_profile_set *ps = tb_exec_profiles(x);
    const tb_graph *eg = tb_exec_graph(x);
    if (profile > ps->n) {
        fprintf(stderr, "turbine bench: error: --profile-index %d: the engine has %d profiles\n", profile, ps->n);
        rc = 2;
        goto done;
    }
    char prof_text[4096];
    tb_profiles_describe(ps, eg, "  ", prof_text, sizeof prof_text);
    printf("%s", prof_text);
    char shape_line[1024] = "";
    size_t sl = 0;
    for (int i = 0; i < n_in; i++) {
        tb_io_info info;
        tb_exec_input_info(x, i, &info);
        in[i].dtype = info.dtype;
        in[i].rank = info.rank;
        /* the profile's opt: its symbols' opt values */
        const tb_value *iv = &eg->values[eg->inputs[i]];
        for (int d = 0; d < info.rank; d++)
            in[i].dims[d] = TB_IS_SYM(iv->dims[d]) ? ps->syms[profile - 1][TB_SYM_INDEX(iv->dims[d])].opt : info.opt[d];
        for (int k = 0; k < n_specs; k++) {
            char idx[16];
            snprintf(idx, sizeof idx, "#%d", i);
            if (strcmp(specs[k].name, info.name) && strcmp(specs[k].name, idx)) continue;
            if (specs[k].rank != info.rank) {
                fprintf(stderr, "turbine bench: error: --shapes gives %s rank %d, the engine takes %d\n", info.name,
                        specs[k].rank, info.rank);
                rc = 2;
                goto done;
            }
            for (int d = 0; d < info.rank; d++) in[i].dims[d] = specs[k].opt[d];
        }
        int64_t n = 1;
        for (int d = 0; d < in[i].rank; d++) n *= in[i].dims[d];
        in[i].data = malloc((size_t)(n ? n : 1) * tb_dtype_size(in[i].dtype));
        if (!in[i].data) { fprintf(stderr, "turbine bench: error: out of memory\n"); goto done; }
        fill(&in[i], (uint64_t)i + 1);
        sl += (size_t)snprintf(shape_line + sl, sizeof shape_line - sl, "%s%s:", i ? "," : "", info.name);
        for (int d = 0; d < in[i].rank && sl < sizeof shape_line; d++)
            sl += (size_t)snprintf(shape_line + sl, sizeof shape_line - sl, "%s%lld", d ? "x" : "",
                                   (long long)in[i].dims[d]);
    }
    printf("  shapes %s\n", shape_line);
    int n_out = tb_exec_n_outputs(x);
    double t0 = tb_now();
    for (int w = 0; w < warmup; w++)
        if (tb_exec_run(x, in, n_in, out, n_out) != TB_OK) goto fail;
    double t_warm = tb_now() - t0;
    int cap = iters, n = 0;
    lat = malloc((size_t)cap * sizeof *lat);
    if (!lat) goto fail;
    if (dump) tb_exec_set_profiling(x, 1);
    double h2d0, d2h0;
    tb_exec_copy_seconds(x, &h2d0, &d2h0);
    double start = tb_now();
    /* at least `iters` runs and `duration` seconds, at most 10M runs */
    while (n < iters || (tb_now() - start < duration && n < 10000000)) {
        if (n == cap) {
            double *p = realloc(lat, (size_t)cap * 2 * sizeof *lat);
            if (!p) break;
            lat = p;
            cap *= 2;
        }
        double a = tb_now();
        if (tb_exec_run(x, in, n_in, out, n_out) != TB_OK) goto fail;
        lat[n++] = tb_now() - a;
    }
    double wall = tb_now() - start;
    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += lat[i];
    printf("  warm-up %d runs (%.1f ms), timed %d runs in %.2f s\n", warmup, t_warm * 1e3, n, wall);
    printf("  throughput   %.2f qps\n", n / wall);
    printf("  latency ms   min %.3f  mean %.3f  median %.3f  p90 %.3f  p99 %.3f  max %.3f\n", lat[0] * 1e3,
           sum / n * 1e3, pct(lat, n, 50) * 1e3, pct(lat, n, 90) * 1e3, pct(lat, n, 99) * 1e3, lat[n - 1] * 1e3);
    double h2d1, d2h1;
    tb_exec_copy_seconds(x, &h2d1, &d2h1);
    double h2d = (h2d1 - h2d0) / n, d2h = (d2h1 - d2h0) / n;
    if (h2d1 > 0 || d2h1 > 0)
        printf("  compute ms   mean %.3f, host-to-device %.3f, device-to-host %.3f (the copies are inside the latency)\n",
               (sum / n - h2d - d2h) * 1e3, h2d * 1e3, d2h * 1e3);
    else
        printf("  compute ms   mean %.3f (host memory: no transfers)\n", sum / n * 1e3);
    printf("  activations  %.1f KiB arena, %d views sharing their input's memory, profile %d\n",
           tb_exec_arena_bytes(x) / 1024.0, tb_exec_n_aliased(x), tb_exec_last_profile(x) + 1);
    json_t *j = json_pack("{s:s, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "engine", path, "shapes",
                          shape_line, "runs", n, "throughput_qps", n / wall, "latency_min_ms", lat[0] * 1e3,
                          "latency_mean_ms", sum / n * 1e3, "latency_median_ms", pct(lat, n, 50) * 1e3,
                          "latency_p90_ms", pct(lat, n, 90) * 1e3, "latency_p99_ms", pct(lat, n, 99) * 1e3,
                          "latency_max_ms", lat[n - 1] * 1e3, "compute_mean_ms", (sum / n - h2d - d2h) * 1e3);
    if (j) {
        json_object_set_new(j, "h2d_mean_ms", json_real(h2d * 1e3));
        json_object_set_new(j, "d2h_mean_ms", json_real(d2h * 1e3));
    }
    if (j) {
        json_object_set_new(j, "arena_bytes", json_integer((json_int_t)tb_exec_arena_bytes(x)));
        json_object_set_new(j, "views", json_integer(tb_exec_n_aliased(x)));
        json_object_set_new(j, "profile", json_integer(tb_exec_last_profile(x) + 1));
    }
    if (dump) {
        const tb_graph *g = tb_exec_graph(x);
        tb_exec_node_time *nt = calloc((size_t)g->n_nodes + 1, sizeof *nt);
        if (nt) {
            int m = tb_exec_profile(x, nt, g->n_nodes);
            double total = 0;
            for (int i = 0; i < m; i++) total += nt[i].seconds;
            qsort(nt, (size_t)m, sizeof *nt, cmp_layer);
            printf("  per layer (mean ms per run, share), slowest first:\n");
            json_t *layers = json_array();
            for (int i = 0; i < m; i++) {
                printf("    %4d %-20s %-40s %9.4f  %5.1f%%\n", nt[i].node, nt[i].op, nt[i].output,
                       nt[i].seconds * 1e3, total > 0 ? 100 * nt[i].seconds / total : 0);
                json_array_append_new(layers, json_pack("{s:i, s:s, s:s, s:f}", "node", nt[i].node, "op", nt[i].op,
                                                        "output", nt[i].output, "ms", nt[i].seconds * 1e3));
            }
            if (j) json_object_set_new(j, "layers", layers); else json_decref(layers);
            free(nt);
        }
    }
    if (json_path && j && json_dump_file(j, json_path, JSON_INDENT(2)) != 0)
        fprintf(stderr, "turbine bench: error: cannot write %s\n", json_path);
    json_decref(j);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "turbine bench: error: %s\n", tb_last_error());
done:
    free(lat);
    for (int i = 0; i < n_in; i++) free(in[i].data);
    tb_exec_free(x);
    tb_engine_free(e);
    return rc;
}
