/* calib_onnx.c — calibration of INT8 ONNX engines (calib_onnx.h): the
 * calibration inputs (.pb sets, .npy arrays), the observed f32 run and the
 * thresholds. */
#include "plan/calib_onnx.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>

#include "import/onnx.h"
#include "plan/engine.h"
#include "runtime/runtime.h"

/* ---------------------------------------------------------------- .npy */

/* Finds 'key': VALUE in a .npy header dict; returns the value's start or NULL. */
static const char *npy_field(const char *h, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(h, pat);
    if (!p) return NULL;
    p = strchr(p + strlen(pat), ':');
    if (!p) return NULL;
    for (p++; *p == ' '; p++) {}
    return p;
}

tb_status tb_npy_read(const char *path, tb_dtype want, tb_tensor *t) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return tb_errorf(TB_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    tb_status s = TB_OK;
    char *hdr = NULL;
    void *raw = NULL;
    unsigned char pre[12];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) || pre[6] < 1 || pre[6] > 3) {
        s = tb_errorf(TB_ERR_FORMAT, "%s is not a .npy file (NumPy format 1 to 3)", path);
        goto done;
    }
    uint32_t hl = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
    if (pre[6] >= 2) {
        if (fread(pre + 10, 1, 2, f) != 2) { s = tb_errorf(TB_ERR_FORMAT, "%s: truncated header", path); goto done; }
        hl |= (uint32_t)pre[10] << 16 | (uint32_t)pre[11] << 24;
    }
    if (hl == 0 || hl > 65536) { s = tb_errorf(TB_ERR_FORMAT, "%s: header of %u bytes", path, hl); goto done; }
    if (!(hdr = malloc(hl + 1))) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    if (fread(hdr, 1, hl, f) != hl) { s = tb_errorf(TB_ERR_FORMAT, "%s: truncated header", path); goto done; }
    hdr[hl] = 0;
    const char *d = npy_field(hdr, "descr"), *fo = npy_field(hdr, "fortran_order"), *sh = npy_field(hdr, "shape");
    if (!d || !fo || !sh || *sh != '(') {
        s = tb_errorf(TB_ERR_FORMAT, "%s: header without descr / fortran_order / shape", path);
        goto done;
    }
    if (strncmp(fo, "False", 5)) { s = tb_errorf(TB_ERR_UNSUPPORTED, "%s: Fortran order (save it in C order)", path); goto done; }
    tb_dtype src;
    size_t es;
    if (!strncmp(d, "'<f4'", 5)) src = TB_F32, es = 4;
    else if (!strncmp(d, "'<f8'", 5)) src = TB_F64, es = 8;
    else if (!strncmp(d, "'<i8'", 5)) src = TB_I64, es = 8;
    else if (!strncmp(d, "'<i4'", 5)) src = TB_I32, es = 4;
    else {
        s = tb_errorf(TB_ERR_UNSUPPORTED, "%s: dtype %.8s (f32, f64, int64 or int32, little-endian)", path, d);
        goto done;
    }
    uint64_t n = 1;
    const char *p = sh + 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || t->rank >= TB_TENSOR_MAX_RANK || (v && n > TB_NPY_MAX_BYTES / (uint64_t)v)) {
            s = tb_errorf(TB_ERR_FORMAT, "%s: bad or too large shape", path);
            goto done;
        }
        t->dims[t->rank++] = v;
        n *= (uint64_t)v;
        p = end;
    }
    if (n * 8 > TB_NPY_MAX_BYTES) { s = tb_errorf(TB_ERR_FORMAT, "%s: larger than %llu bytes", path, (unsigned long long)TB_NPY_MAX_BYTES); goto done; }
    if (!(raw = malloc(n * es + 1))) { s = tb_errorf(TB_ERR_OOM, "out of memory reading %s", path); goto done; }
    if (fread(raw, es, n, f) != n) { s = tb_errorf(TB_ERR_FORMAT, "%s: truncated data", path); goto done; }
    size_t os = want == TB_F32 || want == TB_I32 ? 4 : 8;
    void *o = malloc(n * os + 1);
    if (!o) { s = tb_errorf(TB_ERR_OOM, "out of memory reading %s", path); goto done; }
    for (uint64_t i = 0; i < n; i++) {
        double v = src == TB_F32 ? ((float *)raw)[i] : src == TB_F64 ? ((double *)raw)[i]
                 : src == TB_I64 ? (double)((int64_t *)raw)[i] : ((int32_t *)raw)[i];
        int64_t iv = src == TB_I64 ? ((int64_t *)raw)[i] : (int64_t)v;
        if (want == TB_F32) ((float *)o)[i] = (float)v;
        else if (want == TB_F64) ((double *)o)[i] = v;
        else if (want == TB_I32) ((int32_t *)o)[i] = (int32_t)iv;
        else ((int64_t *)o)[i] = iv;
    }
    t->dtype = want;
    t->data = o;
done:
    free(hdr);
    free(raw);
    fclose(f);
    return s;
}

/* ---------------------------------------------------------------- samples */

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

tb_status tb_calib_onnx_sample(const tb_graph *g, const char *dir, int k, tb_view *in, int *got) {
    *got = 0;
    memset(in, 0, sizeof(tb_view) * (size_t)g->n_inputs);
    char base[4096], path[4400];
    int pb = 0;
    snprintf(path, sizeof path, "%s/test_data_set_%d/input_0.pb", dir, k);
    if (exists(path)) {
        snprintf(base, sizeof base, "%s/test_data_set_%d", dir, k);
        pb = 1;
    } else {
        snprintf(path, sizeof path, "%s/input_0.pb", dir);
        if (exists(path)) {
            if (k > 0) return TB_OK;
            snprintf(base, sizeof base, "%s", dir);
            pb = 1;
        }
    }
    for (int i = 0; i < g->n_inputs; i++) {
        const tb_value *v = &g->values[g->inputs[i]];
        tb_tensor t;
        tb_status s;
        if (pb) {
            snprintf(path, sizeof path, "%s/input_%d.pb", base, i);
            char name[96];
            s = tb_onnx_read_tensor(path, &t, name, sizeof name);
        } else {
            snprintf(path, sizeof path, "%s/%s_%d.npy", dir, v->name, k);
            if (!exists(path)) snprintf(path, sizeof path, "%s/input_%d_%d.npy", dir, i, k);
            if (!exists(path)) {
                for (int j = 0; j < i; j++) free(in[j].data);
                memset(in, 0, sizeof(tb_view) * (size_t)g->n_inputs);
                if (k == 0 || i > 0)
                    return tb_errorf(TB_ERR_INVALID_ARG, "--calib-data %s: no input %d (%s) of sample %d: give "
                                     "test_data_set_N/input_K.pb, %s_N.npy or input_K_N.npy files", dir, i, v->name,
                                     k, v->name);
                return TB_OK; /* no sample k */
            }
            s = tb_npy_read(path, v->dtype == TB_F32 || v->dtype == TB_I32 || v->dtype == TB_F64 ? v->dtype : TB_I64,
                            &t);
        }
        if (s == TB_OK && t.dtype != v->dtype) {
            free(t.data);
            s = tb_errorf(TB_ERR_INVALID_ARG, "%s is %s, input %s is %s", path, tb_dtype_name(t.dtype), v->name,
                          tb_dtype_name(v->dtype));
        }
        if (s != TB_OK) {
            for (int j = 0; j < i; j++) free(in[j].data);
            memset(in, 0, sizeof(tb_view) * (size_t)g->n_inputs);
            return tb_error_prefix(s, "--calib-data");
        }
        in[i].dtype = t.dtype;
        in[i].rank = t.rank;
        memcpy(in[i].dims, t.dims, sizeof in[i].dims);
        in[i].data = t.data;
    }
    *got = 1;
    return TB_OK;
}

tb_status tb_onnx_fingerprint(const char *model_path, uint64_t *out) {
    tb_mapped_file m;
    TB_TRY(tb_file_map(model_path, &m));
    *out = tb_hash64(m.data, m.size);
    tb_file_unmap(&m);
    return TB_OK;
}

/* ---------------------------------------------------------------- the observed run */

typedef struct {
    int n;              /* tensors observed                              */
    int *of_value;      /* (n_values) tensor index of a value, or -1     */
    int *value;         /* (n) the value                                 */
    float *amax, *amin; /* (n) max |x|, min x                            */
    double *hist;       /* (n, TB_CALIB_BINS)                            */
    int *seen;          /* (n) the run that last added it                */
    int run;
} observer;

static void observe(void *user, const tb_graph *g, int node, void *const *bufs, const tb_step *st) {
    observer *o = user;
    const tb_node *n = &g->nodes[node];
    for (int j = 0; j < n->n_in && j < 1; j++) {
        int v = n->in[j], t = o->of_value[v];
        if (t < 0 || o->seen[t] == o->run || !bufs[v]) continue;
        o->seen[t] = o->run;
        const tb_view *w = &st->views[v];
        int64_t ne = tb_view_numel(w);
        const float *x = bufs[v];
        float mn = o->amin[t];
        for (int64_t i = 0; i < ne; i++) mn = x[i] < mn ? x[i] : mn;
        o->amin[t] = mn;
        tb_calib_hist_add(o->hist + (size_t)t * TB_CALIB_BINS, &o->amax[t], x, (size_t)ne);
    }
}

tb_status tb_calib_onnx_run(tb_graph *g, const char *dir, const tb_calibrator *c, const tb_nn_quant_options *q,
                            int max_samples, int n_threads, uint64_t fingerprint, tb_calib_table **out,
                            int *n_samples) {
    *out = NULL;
    *n_samples = 0;
    observer o;
    memset(&o, 0, sizeof o);
    tb_status s = TB_OK;
    tb_engine *e = NULL;
    tb_exec *x = NULL;
    tb_calib_table *t = NULL;
    int nv = g->n_values, n_in = g->n_inputs, n_out = g->n_outputs;
    o.of_value = malloc(sizeof(int) * (size_t)nv);
    o.value = malloc(sizeof(int) * (size_t)nv);
    if (!o.of_value || !o.value) { s = tb_errorf(TB_ERR_OOM, "out of memory"); tb_graph_free(g); goto done; }
    for (int v = 0; v < nv; v++) o.of_value[v] = -1;
    for (int k = 0; k < g->n_nodes; k++) {
        int v = tb_opt_nn_quant_input(g, k, q);
        if (v < 0 || o.of_value[v] >= 0) continue;
        o.of_value[v] = o.n;
        o.value[o.n++] = v;
    }
    o.amax = calloc((size_t)o.n + 1, sizeof(float));
    o.amin = malloc(sizeof(float) * ((size_t)o.n + 1));
    o.seen = calloc((size_t)o.n + 1, sizeof(int));
    o.hist = calloc(((size_t)o.n + 1) * TB_CALIB_BINS, sizeof(double));
    if (!o.amax || !o.amin || !o.seen || !o.hist) { s = tb_errorf(TB_ERR_OOM, "out of memory"); tb_graph_free(g); goto done; }
    for (int i = 0; i < o.n; i++) o.amin[i] = INFINITY;
    if ((s = tb_engine_from_graph(g, "cpu", &e)) != TB_OK) goto done; /* takes g */
    tb_exec_options xo;
    tb_exec_options_default(&xo);
    xo.n_threads = n_threads;
    xo.device = "cpu";
    if ((s = tb_exec_create(e, &xo, &x)) != TB_OK) goto done;
    if ((s = tb_exec_set_observer(x, observe, &o)) != TB_OK) goto done;
    const tb_graph *eg = e->graph;
    for (int k = 0; k < max_samples && o.n > 0; k++) {
        tb_view in[TB_MAX_IO];
        int got;
        if ((s = tb_calib_onnx_sample(eg, dir, k, in, &got)) != TB_OK) goto done;
        if (!got) break;
        tb_tensor ti[TB_MAX_IO], res[TB_MAX_IO];
        for (int i = 0; i < n_in; i++) {
            ti[i].dtype = in[i].dtype;
            ti[i].rank = in[i].rank;
            memcpy(ti[i].dims, in[i].dims, sizeof ti[i].dims);
            ti[i].data = in[i].data;
        }
        o.run = k + 1;
        s = tb_exec_run(x, ti, n_in, res, n_out);
        for (int i = 0; i < n_in; i++) free(in[i].data);
        if (s != TB_OK) { tb_error_prefix(s, "calibration sample %d", k); goto done; }
        (*n_samples)++;
    }
    if (*n_samples == 0 && o.n > 0) {
        s = tb_errorf(TB_ERR_INVALID_ARG, "--calib-data %s holds no calibration sample (test_data_set_N/input_K.pb, "
                      "input_K.pb, NAME_N.npy or input_K_N.npy)", dir);
        goto done;
    }
    if (!(t = calloc(1, sizeof *t)) || !(t->e = calloc((size_t)o.n + 1, sizeof *t->e))) {
        s = tb_errorf(TB_ERR_OOM, "out of memory");
        goto done;
    }
    tb_calibrator_name(c, t->calibrator, sizeof t->calibrator);
    t->fingerprint = fingerprint;
    t->tokens = *n_samples;
    for (int i = 0; i < o.n; i++) {
        tb_calib_entry *en = &t->e[t->n++];
        const char *nm = eg->values[o.value[i]].name;
        int u8 = o.amin[i] >= 0;
        snprintf(en->name, sizeof en->name, "%.*s%s", TB_NAME_LEN - 4, nm, u8 ? "/u8" : "");
        en->amax = o.amax[i];
        const double *h = o.hist + (size_t)i * TB_CALIB_BINS;
        /* a never-negative tensor has 255 steps over [0, T], not 127: mse
         * weighs the rounding error of that many (entropy keeps TensorRT's
         * 128 bins: with 256 it clipped far more on small calibration sets) */
        if (u8 && c->method == TB_CALIB_MSE) en->threshold = (float)tb_calib_mse(h, TB_CALIB_BINS, o.amax[i], 255);
        else en->threshold = (float)tb_calib_threshold(c, h, TB_CALIB_BINS, o.amax[i]);
    }
    *out = t;
    t = NULL;
done:
    tb_calib_table_free(t);
    tb_exec_free(x);
    tb_engine_free(e);
    free(o.of_value);
    free(o.value);
    free(o.amax);
    free(o.amin);
    free(o.seen);
    free(o.hist);
    return s;
}

tb_status tb_calib_onnx_acts(const tb_calib_table *t, tb_nn_act_quant **acts, int *n) {
    *n = 0;
    *acts = calloc((size_t)t->n + 1, sizeof **acts);
    if (!*acts) return tb_errorf(TB_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n; i++) {
        const tb_calib_entry *e = &t->e[i];
        size_t l = strlen(e->name);
        int u8 = l > 3 && !strcmp(e->name + l - 3, "/u8");
        tb_nn_act_quant *a = &(*acts)[(*n)++];
        snprintf(a->tensor, sizeof a->tensor, "%.*s", (int)(u8 ? l - 3 : l), e->name);
        a->zero = u8 ? 0 : 128;
        a->scale = e->threshold > 0 ? e->threshold / (u8 ? 255.0f : 127.0f) : 1.0f;
    }
    return TB_OK;
}
