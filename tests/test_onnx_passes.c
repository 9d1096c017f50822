/* test_onnx_passes.c — the pass pipeline on real PyTorch exports (the BERT-
 * and GPT-2-style models of tests/onnx/make_models.py --small, opsets 13 and
 * 17), through the reference interpreter: the imported graph as it is, after
 * the pipeline for the cpu backend and after the pipeline for cuda (whose
 * attention layout passes, opt/nn_merge.c, only fire there), each against
 * PyTorch's outputs of every test data set (worst |d| <= 1e-4 of the largest
 * magnitude). For cuda every sdpa must end in the packed heads layout. The
 * exports ($TURBINE_TMP/onnx_passes_models) are made once; without
 * python3-onnx / python3-torch the test says so and checks nothing. */
#include <dirent.h>
#include <math.h>
#include <string.h>

#include "import/onnx.h"
#include "ir/interp.h"
#include "opt/opt.h"
#include "plan/engine.h"
#include "tb_test.h"

#define MAX_IN 8

typedef struct {
    tb_tensor t[MAX_IN];
    int n;
} tensors;

static void tensors_free(tensors *s) {
    for (int i = 0; i < s->n; i++) free(s->t[i].data);
    s->n = 0;
}

/* PREFIX_0.pb, PREFIX_1.pb, ... of folder dir */
static int read_all(const char *dir, const char *prefix, tensors *s) {
    s->n = 0;
    for (int k = 0; k < MAX_IN; k++) {
        char p[1024], nm[256];
        snprintf(p, sizeof p, "%s/%s_%d.pb", dir, prefix, k);
        FILE *f = fopen(p, "rb");
        if (!f) break;
        fclose(f);
        if (tb_onnx_read_tensor(p, &s->t[s->n], nm, sizeof nm) != TB_OK) {
            CHECK_MSG(0, "%s: %s", p, tb_last_error());
            tensors_free(s);
            return 0;
        }
        s->n++;
    }
    return s->n > 0;
}

/* worst |out - ref| / max |ref| over the outputs */
static double worst_error(const tb_view *out, const tensors *ref) {
    double worst = 0;
    for (int o = 0; o < ref->n; o++) {
        const tb_tensor *t = &ref->t[o];
        if (t->dtype != TB_F32 || out[o].dtype != TB_F32 || out[o].rank != t->rank) return INFINITY;
        int64_t ne = 1;
        for (int d = 0; d < t->rank; d++) {
            if (out[o].dims[d] != t->dims[d]) return INFINITY;
            ne *= t->dims[d];
        }
        double m = 0, e = 0;
        for (int64_t i = 0; i < ne; i++) {
            double a = ((const float *)out[o].data)[i], b = ((const float *)t->data)[i];
            if (fabs(b) > m) m = fabs(b);
            if (!(fabs(a - b) <= e)) e = fabs(a - b); /* NaN counts as worst */
        }
        double rel = e / (m > 0 ? m : 1);
        if (!(rel <= worst)) worst = rel;
    }
    return worst;
}

/* One model folder: every test data set through the three graphs. */
static void check_model(const char *dir, const char *name) {
    char path[1024];
    for (int ds = 0;; ds++) {
        char dsd[1024];
        snprintf(dsd, sizeof dsd, "%s/test_data_set_%d", dir, ds);
        tensors in, ref;
        if (!read_all(dsd, "input", &in)) {
            CHECK_MSG(ds > 0, "%s: no test data", name);
            return;
        }
        if (!read_all(dsd, "output", &ref)) { tensors_free(&in); return; }
        tb_onnx_shape_spec sp[MAX_IN];
        tb_view iv[MAX_IN];
        memset(iv, 0, sizeof iv);
        for (int i = 0; i < in.n; i++) {
            snprintf(sp[i].name, sizeof sp[i].name, "#%d", i);
            sp[i].rank = in.t[i].rank;
            for (int d = 0; d < in.t[i].rank; d++) sp[i].min[d] = sp[i].opt[d] = sp[i].max[d] = in.t[i].dims[d];
            iv[i].dtype = in.t[i].dtype;
            iv[i].rank = in.t[i].rank;
            memcpy(iv[i].dims, in.t[i].dims, sizeof(int64_t) * (size_t)in.t[i].rank);
            iv[i].data = in.t[i].data;
        }
        tb_onnx_options oo = {sp, in.n};
        snprintf(path, sizeof path, "%s/model.onnx", dir);
        for (int mode = 0; mode < 3; mode++) {
            const char *mn = mode == 0 ? "imported" : mode == 1 ? "cpu pipeline" : "cuda pipeline";
            tb_graph *g = NULL;
            tb_status s = tb_onnx_import(path, &oo, &g);
            CHECK_MSG(s == TB_OK, "%s: import: %s", name, tb_last_error());
            if (s != TB_OK) break;
            if (mode) {
                tb_opt_options o;
                memset(&o, 0, sizeof o);
                snprintf(o.device, sizeof o.device, "%s", mode == 2 ? "cuda" : "cpu");
                o.dtype = TB_F32;
                int n;
                const tb_pass *ps = tb_opt_nn_pipeline(&n);
                s = tb_opt_run(g, ps, n, &o);
                CHECK_MSG(s == TB_OK, "%s: %s: %s", name, mn, tb_last_error());
            }
            int sdpa = 0, packed = 0;
            for (int k = 0; k < g->n_nodes; k++)
                if (g->nodes[k].op == TB_OP_SDPA) {
                    sdpa++;
                    packed += g->nodes[k].i[3] > 0 && g->nodes[k].i[4];
                }
            /* both backends take the layout passes (nn_merge.c) */
            if (mode >= 1) CHECK_MSG(sdpa > 0 && packed == sdpa, "%s: %s: %d of %d sdpa packed", name, mn, packed, sdpa);
            tb_view out[MAX_IN];
            memset(out, 0, sizeof out);
            if (s == TB_OK && g->n_outputs == ref.n) {
                s = tb_interp_run(g, iv, in.n, out, g->n_outputs);
                CHECK_MSG(s == TB_OK, "%s: %s: interp: %s", name, mn, tb_last_error());
                if (s == TB_OK) {
                    double e = worst_error(out, &ref);
                    CHECK_MSG(e <= 1e-4, "%s set %d, %s: outputs off PyTorch's by %g", name, ds, mn, e);
                    printf("%-16s set %d  %-13s %4d nodes, %d sdpa (%d packed heads layout), worst %.2g\n", name, ds,
                           mn, g->n_nodes, sdpa, packed, e);
                    tb_interp_free_outputs(out, g->n_outputs);
                }
            } else {
                CHECK_MSG(0, "%s: %d outputs, %d reference files", name, g->n_outputs, ref.n);
            }
            if (mode == 2 && s == TB_OK && g->n_outputs == ref.n) {
                /* the graph built for cuda also runs on the CPU backend (the
                 * f16 build checks it there): its fast kernels read the
                 * packed heads layout or hand it to the reference */
                tb_engine *e = NULL;
                tb_status se = tb_engine_from_graph(g, "cpu", &e);
                g = NULL; /* the engine took it */
                CHECK_MSG(se == TB_OK, "%s: cuda pipeline as a cpu engine: %s", name, tb_last_error());
                tb_exec *x = NULL;
                if (se == TB_OK) {
                    tb_exec_options xo;
                    tb_exec_options_default(&xo);
                    xo.device = "cpu";
                    se = tb_exec_create(e, &xo, &x);
                    CHECK_MSG(se == TB_OK, "%s: cpu executor: %s", name, tb_last_error());
                }
                if (se == TB_OK) {
                    tb_tensor ti[MAX_IN], to[MAX_IN];
                    memset(ti, 0, sizeof ti);
                    memset(to, 0, sizeof to);
                    for (int i = 0; i < in.n; i++) {
                        ti[i].dtype = iv[i].dtype;
                        ti[i].rank = iv[i].rank;
                        for (int d = 0; d < iv[i].rank; d++) ti[i].dims[d] = iv[i].dims[d];
                        ti[i].data = iv[i].data;
                    }
                    se = tb_exec_run(x, ti, in.n, to, ref.n);
                    CHECK_MSG(se == TB_OK, "%s: cpu run of the cuda pipeline: %s", name, tb_last_error());
                    if (se == TB_OK) {
                        tb_view vo[MAX_IN];
                        memset(vo, 0, sizeof vo);
                        for (int i = 0; i < ref.n; i++) {
                            vo[i].dtype = to[i].dtype;
                            vo[i].rank = to[i].rank;
                            for (int d = 0; d < to[i].rank; d++) vo[i].dims[d] = to[i].dims[d];
                            vo[i].data = to[i].data;
                        }
                        double e2 = worst_error(vo, &ref);
                        CHECK_MSG(e2 <= 1e-4, "%s set %d: cuda pipeline on the cpu backend off PyTorch's by %g", name,
                                  ds, e2);
                        printf("%-16s set %d  cuda pipeline on the cpu backend, worst %.2g\n", name, ds, e2);
                    }
                }
                tb_exec_free(x);
                tb_engine_free(e);
            }
            if (g) tb_graph_free(g);
        }
        tensors_free(&in);
        tensors_free(&ref);
    }
}

int main(void) {
    const char *tmp = getenv("TURBINE_TMP"), *src = getenv("TURBINE_SRC");
    if (!tmp || !src) {
        printf("test_onnx_passes: TURBINE_TMP / TURBINE_SRC not set (run through ctest)\n");
        return tb_test_finish("test_onnx_passes");
    }
    char dir[1024], cmd[4096], man[1100];
    snprintf(dir, sizeof dir, "%s/onnx_passes_models", tmp);
    snprintf(man, sizeof man, "%s/manifest.json", dir);
    FILE *f = fopen(man, "r");
    if (!f) {
        if (system("/usr/bin/python3 -c 'import onnx, torch' 2>/dev/null") != 0) {
            printf("test_onnx_passes: no python3-onnx / python3-torch: nothing checked\n");
            return tb_test_finish("test_onnx_passes");
        }
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/onnx/make_models.py' '%s' --small --models bert,gpt2",
                 src, dir);
        CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    } else {
        fclose(f);
    }
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "no folder %s", dir);
    int models = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "bert_", 5) && strncmp(e->d_name, "gpt2_", 5)) continue;
        char md[2048];
        snprintf(md, sizeof md, "%s/%s", dir, e->d_name);
        check_model(md, e->d_name);
        models++;
    }
    if (d) closedir(d);
    CHECK_MSG(models >= 2, "%d BERT / GPT-2 exports in %s", models, dir);
    return tb_test_finish("test_onnx_passes");
}
