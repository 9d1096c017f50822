/*
 * test_exec.c — the executor of general engines (runtime/exec.c) against the
 * reference interpreter (ir/interp.c): a graph with a symbolic batch whose
 * Reshape target is computed at run time (Shape -> Gather -> Concat), run
 * through an engine file and in memory at several batch sizes (replanned on
 * each new shape, bit-identical to the interpreter), refused outside its
 * profile (TB_ERR_RANGE naming the range) and on wrong inputs; and the
 * engine file's general kind checked on load. Then: zero-copy views
 * (Reshape / Flatten / Unsqueeze / Identity outputs sharing memory with an
 * input, an activation and a weight, outputs among them returned right
 * after the caller reuses its input buffer); an engine with two disjoint
 * profiles taking inputs inside either and refusing the gap between them
 * with every profile's range in the message; and the f16 pass (Casts at the
 * f32 input and outputs, names kept) run through the executor within f16
 * error of the f32 interpreter. And a run whose data-dependent shape needs
 * more memory than the machine has free refused before it allocates.
 */
#include <unistd.h>

#include "core/core.h"
#include "ir/interp.h"
#include "opt/opt.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "tb_test.h"

/* X (batch, 3, 8, 8) -> MaxPool 2x2/2 -> P (batch, 3, 4, 4);
 * R = Reshape(P, Concat(Gather(Shape(P), [0]), [-1])) (batch, 48);
 * T = Transpose(P, 0 2 3 1) (batch, 4, 4, 3). Outputs R, T. */
static tb_graph *make_graph(void) {
    tb_graph *g = tb_graph_new();
    int b = tb_graph_add_sym(g, "batch", 1, 2, 4);
    int64_t xd[4] = {TB_SYM(b), 3, 8, 8};
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 4, xd);
    g->inputs[g->n_inputs++] = x;
    int32_t pa[TB_NODE_INTS] = {2, 2, 2, 2, 0, 0, 0, 0, 1, 1};
    const char *pn = "p";
    int kp = tb_graph_add_node_ex(g, TB_OP_MAXPOOL, &x, 1, &pn, 1, pa, NULL);
    CHECK_MSG(kp >= 0, "maxpool: %s", tb_last_error());
    int p = g->nodes[kp].out[0];
    const char *sn = "s";
    int ks = tb_graph_add_node_ex(g, TB_OP_SHAPE, &p, 1, &sn, 1, NULL, NULL);
    CHECK_MSG(ks >= 0, "shape: %s", tb_last_error());
    int64_t *i0 = malloc(sizeof *i0), *m1 = malloc(sizeof *m1);
    *i0 = 0;
    *m1 = -1;
    int64_t one = 1;
    int wi0 = tb_graph_add_weight(g, "idx0", TB_I64, 1, &one, i0, 1);
    int wm1 = tb_graph_add_weight(g, "minus1", TB_I64, 1, &one, m1, 1);
    int gin[2] = {g->nodes[ks].out[0], wi0};
    const char *gn = "n";
    int kg = tb_graph_add_node_ex(g, TB_OP_GATHER, gin, 2, &gn, 1, NULL, NULL);
    CHECK_MSG(kg >= 0, "gather: %s", tb_last_error());
    int cin[2] = {g->nodes[kg].out[0], wm1};
    const char *cn = "target";
    int kc = tb_graph_add_node_ex(g, TB_OP_CONCAT, cin, 2, &cn, 1, NULL, NULL);
    CHECK_MSG(kc >= 0, "concat: %s", tb_last_error());
    int rin[2] = {p, g->nodes[kc].out[0]};
    const char *rn = "r";
    int kr = tb_graph_add_node_ex(g, TB_OP_RESHAPE, rin, 2, &rn, 1, NULL, NULL);
    CHECK_MSG(kr >= 0, "reshape: %s", tb_last_error());
    int32_t perm[TB_NODE_INTS] = {0, 2, 3, 1};
    const char *tn = "t";
    int kt = tb_graph_add_node_ex(g, TB_OP_TRANSPOSE, &p, 1, &tn, 1, perm, NULL);
    CHECK_MSG(kt >= 0, "transpose: %s", tb_last_error());
    if (kr < 0 || kt < 0) { tb_graph_free(g); return NULL; }
    g->outputs[g->n_outputs++] = g->nodes[kr].out[0];
    g->outputs[g->n_outputs++] = g->nodes[kt].out[0];
    CHECK_MSG(tb_graph_check(g) == TB_OK, "check: %s", tb_last_error());
    return g;
}

static void run_against_interp(tb_exec *x, const tb_graph *g, int batch, uint64_t seed) {
    int64_t n = (int64_t)batch * 3 * 8 * 8;
    float *data = malloc((size_t)n * sizeof *data);
    for (int64_t i = 0; i < n; i++) data[i] = tb_test_frand(&seed);
    tb_tensor in = {.dtype = TB_F32, .rank = 4, .dims = {batch, 3, 8, 8}, .data = data};
    tb_tensor out[2];
    tb_status s = tb_exec_run(x, &in, 1, out, 2);
    CHECK_MSG(s == TB_OK, "batch %d: %s", batch, tb_last_error());
    tb_view iv = {.dtype = TB_F32, .rank = 4, .dims = {batch, 3, 8, 8}, .data = data};
    tb_view ref[2];
    s = tb_interp_run(g, &iv, 1, ref, 2);
    CHECK_MSG(s == TB_OK, "interp batch %d: %s", batch, tb_last_error());
    if (s == TB_OK) {
        CHECK(out[0].rank == 2 && out[0].dims[0] == batch && out[0].dims[1] == 48);
        CHECK(out[1].rank == 4 && out[1].dims[0] == batch && out[1].dims[1] == 4 && out[1].dims[3] == 3);
        CHECK(ref[0].rank == 2 && ref[0].dims[1] == 48);
        CHECK(!memcmp(out[0].data, ref[0].data, (size_t)batch * 48 * sizeof(float)));
        CHECK(!memcmp(out[1].data, ref[1].data, (size_t)batch * 48 * sizeof(float)));
        /* the max of each 2x2 window, computed here */
        const float *r = out[0].data;
        int bad = 0;
        for (int bb = 0; bb < batch; bb++)
            for (int c = 0; c < 3; c++)
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) {
                        const float *xp = data + ((bb * 3 + c) * 8 + 2 * i) * 8 + 2 * j;
                        float m = fmaxf(fmaxf(xp[0], xp[1]), fmaxf(xp[8], xp[9]));
                        bad += r[bb * 48 + (c * 4 + i) * 4 + j] != m;
                    }
        CHECK_MSG(!bad, "batch %d: %d pooled values wrong", batch, bad);
        tb_interp_free_outputs(ref, 2);
    }
    free(data);
}

/* ---------------------------------------------------------------- views */

/* x (batch, 3, 4) input, w (2, 6) weight:
 *   r  = Reshape(x, [-1, 12])     (an input's view, a graph output)
 *   f  = Flatten(Relu(x), 1)      (an activation's view)
 *   u  = Unsqueeze(f, [0])        (a view of a view)
 *   s  = Sigmoid(u)               (a kernel reading the view)
 *   wi = Identity(w)              (a weight's view, a graph output)
 * Outputs r, s, wi, u. */
static tb_graph *make_views_graph(void) {
    tb_graph *g = tb_graph_new();
    int b = tb_graph_add_sym(g, "batch", 1, 2, 4);
    int64_t xd[3] = {TB_SYM(b), 3, 4};
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 3, xd);
    g->inputs[g->n_inputs++] = x;
    int64_t one = 1, two = 2, wd[2] = {2, 6};
    int64_t *shp = malloc(2 * sizeof *shp), *ax = malloc(sizeof *ax);
    shp[0] = -1, shp[1] = 12, *ax = 0;
    float *wdat = malloc(12 * sizeof *wdat);
    for (int i = 0; i < 12; i++) wdat[i] = 0.25f * (float)i - 1.0f;
    int ws = tb_graph_add_weight(g, "shape", TB_I64, 1, &two, shp, 1);
    int wa = tb_graph_add_weight(g, "axes", TB_I64, 1, &one, ax, 1);
    int w = tb_graph_add_weight(g, "w", TB_F32, 2, wd, wdat, 1);
    int rin[2] = {x, ws};
    const char *nm[1];
    nm[0] = "r";
    int kr = tb_graph_add_node_ex(g, TB_OP_RESHAPE, rin, 2, nm, 1, NULL, NULL);
    nm[0] = "relu";
    int ku = tb_graph_add_node_ex(g, TB_OP_RELU, &x, 1, nm, 1, NULL, NULL);
    int32_t fa[TB_NODE_INTS] = {1};
    nm[0] = "f";
    int kf = ku >= 0 ? tb_graph_add_node_ex(g, TB_OP_FLATTEN, &g->nodes[ku].out[0], 1, nm, 1, fa, NULL) : -1;
    int uin[2] = {kf >= 0 ? g->nodes[kf].out[0] : 0, wa};
    nm[0] = "u";
    int kq = kf >= 0 ? tb_graph_add_node_ex(g, TB_OP_UNSQUEEZE, uin, 2, nm, 1, NULL, NULL) : -1;
    nm[0] = "s";
    int ks = kq >= 0 ? tb_graph_add_node_ex(g, TB_OP_SIGMOID, &g->nodes[kq].out[0], 1, nm, 1, NULL, NULL) : -1;
    nm[0] = "wi";
    int ki = tb_graph_add_node_ex(g, TB_OP_IDENTITY, &w, 1, nm, 1, NULL, NULL);
    CHECK_MSG(kr >= 0 && ks >= 0 && ki >= 0, "views graph: %s", tb_last_error());
    if (kr < 0 || ks < 0 || ki < 0) { tb_graph_free(g); return NULL; }
    g->outputs[g->n_outputs++] = g->nodes[kr].out[0];
    g->outputs[g->n_outputs++] = g->nodes[ks].out[0];
    g->outputs[g->n_outputs++] = g->nodes[ki].out[0];
    g->outputs[g->n_outputs++] = g->nodes[kq].out[0];
    CHECK_MSG(tb_graph_check(g) == TB_OK, "check: %s", tb_last_error());
    return g;
}

static void test_views(void) {
    tb_graph *g = make_views_graph();
    if (!g) return;
    tb_engine *e = NULL;
    CHECK_MSG(tb_engine_from_graph(g, "cpu", &e) == TB_OK, "%s", tb_last_error());
    tb_exec *x = NULL;
    if (e) CHECK_MSG(tb_exec_create(e, NULL, &x) == TB_OK, "%s", tb_last_error());
    for (int batch = 1; x && batch <= 4; batch += 3) {
        int64_t n = (int64_t)batch * 12;
        float *data = malloc((size_t)n * sizeof *data);
        uint64_t seed = 11 + (uint64_t)batch;
        for (int64_t i = 0; i < n; i++) data[i] = tb_test_frand(&seed);
        tb_tensor in = {.dtype = TB_F32, .rank = 3, .dims = {batch, 3, 4}, .data = data};
        tb_tensor out[4];
        tb_status s = tb_exec_run(x, &in, 1, out, 4);
        CHECK_MSG(s == TB_OK, "views batch %d: %s", batch, tb_last_error());
        CHECK_MSG(tb_exec_n_aliased(x) == 4, "%d views", tb_exec_n_aliased(x));
        tb_view iv = {.dtype = TB_F32, .rank = 3, .dims = {batch, 3, 4}, .data = data};
        tb_view ref[4];
        CHECK(tb_interp_run(e->graph, &iv, 1, ref, 4) == TB_OK);
        /* the caller reuses its input buffer: outputs stay as they were */
        float *keep = malloc((size_t)n * sizeof *keep);
        memcpy(keep, data, (size_t)n * sizeof *keep);
        for (int64_t i = 0; i < n; i++) data[i] = 99.0f;
        if (s == TB_OK) {
            CHECK(out[0].data != data && !memcmp(out[0].data, keep, (size_t)n * sizeof(float)));
            CHECK(out[0].rank == 2 && out[0].dims[0] == batch && out[0].dims[1] == 12);
            for (int64_t i = 0; i < n; i++) /* the fast sigmoid is within 1e-6 of the reference */
                CHECK(fabsf(((float *)out[1].data)[i] - ((float *)ref[1].data)[i]) < 1e-5f);
            CHECK(!memcmp(out[2].data, ref[2].data, 12 * sizeof(float)) && out[2].rank == 2);
            CHECK(out[3].rank == 3 && out[3].dims[0] == 1 && out[3].dims[1] == batch && out[3].dims[2] == 12);
            CHECK(!memcmp(out[3].data, ref[3].data, (size_t)n * sizeof(float)));
            for (int64_t i = 0; i < n; i++) CHECK(((float *)out[3].data)[i] == (keep[i] > 0 ? keep[i] : 0));
        }
        tb_interp_free_outputs(ref, 4);
        free(keep);
        free(data);
    }
    tb_exec_free(x);
    tb_engine_free(e);
}

/* ---------------------------------------------------------------- profiles */

static void test_profiles(void) {
    tb_graph *g = make_graph(); /* batch [1, 2, 4] */
    if (!g) return;
    tb_profile_set ps;
    memset(&ps, 0, sizeof ps);
    ps.n = 2;
    ps.syms[0][0] = g->syms[0];
    ps.syms[0][0].min = 1, ps.syms[0][0].opt = 1, ps.syms[0][0].max = 2;
    ps.syms[1][0] = g->syms[0];
    ps.syms[1][0].min = 4, ps.syms[1][0].opt = 4, ps.syms[1][0].max = 4;
    snprintf(ps.text[0], sizeof ps.text[0], "x:1x3x8x8/1x3x8x8/2x3x8x8");
    snprintf(ps.text[1], sizeof ps.text[1], "x:4x3x8x8");
    char path[512];
    snprintf(path, sizeof path, "%s/tb_test_exec_prof_%d.engine", tb_test_tmp(), (int)getpid());
    CHECK_MSG(tb_engine_write_profiles(g, path, "cpu", "test", 0.0, &ps) == TB_OK, "%s", tb_last_error());
    tb_graph_free(g);
    tb_engine *e = NULL;
    CHECK_MSG(tb_engine_load(path, &e) == TB_OK, "load: %s", tb_last_error());
    tb_exec *x = NULL;
    if (e) CHECK_MSG(tb_exec_create(e, NULL, &x) == TB_OK, "%s", tb_last_error());
    if (x) {
        const tb_profile_set *got = tb_exec_profiles(x);
        CHECK(got->n == 2 && got->syms[1][0].min == 4 && got->syms[0][0].max == 2 && !strcmp(got->text[1], "x:4x3x8x8"));
        char text[1024];
        tb_profiles_describe(got, e->graph, "", text, sizeof text);
        CHECK_MSG(strstr(text, "profile 2: batch [4, 4, 4]"), "%s", text);
        CHECK(tb_exec_last_profile(x) == -1);
        int ok_batches[] = {2, 4, 1};
        for (int i = 0; i < 3; i++) {
            run_against_interp(x, e->graph, ok_batches[i], 40 + (uint64_t)i);
            CHECK(tb_exec_last_profile(x) == (ok_batches[i] == 4 ? 1 : 0));
        }
        float buf[5 * 3 * 8 * 8] = {0};
        tb_tensor in = {.dtype = TB_F32, .rank = 4, .dims = {3, 3, 8, 8}, .data = buf};
        tb_tensor out[2];
        CHECK(tb_exec_run(x, &in, 1, out, 2) == TB_ERR_RANGE); /* between the profiles */
        CHECK_MSG(strstr(tb_last_error(), "profile 1: batch [1, 2]") && strstr(tb_last_error(), "profile 2: batch [4, 4]") &&
                      strstr(tb_last_error(), "is 3"),
                  "%s", tb_last_error());
        in.dims[0] = 5;
        CHECK(tb_exec_run(x, &in, 1, out, 2) == TB_ERR_RANGE);
        run_against_interp(x, e->graph, 4, 77);
    }
    tb_exec_free(x);
    tb_engine_free(e);
    remove(path);
}

/* ---------------------------------------------------------------- f16 */

/* x (batch, 8) f32 -> MatMul(x, w (8, 5)) + bias -> Relu -> y (batch, 5);
 * z = Reshape(y, [-1]) (batch * 5); a second output. */
static tb_graph *make_mlp(void) {
    tb_graph *g = tb_graph_new();
    int b = tb_graph_add_sym(g, "batch", 1, 2, 4);
    int64_t xd[2] = {TB_SYM(b), 8}, wd[2] = {8, 5}, bd[1] = {5}, one = 1;
    int x = tb_graph_add_value(g, "x", TB_VAL_INPUT, TB_F32, 2, xd);
    g->inputs[g->n_inputs++] = x;
    float *w = malloc(40 * sizeof *w), *bias = malloc(5 * sizeof *bias);
    uint64_t seed = 3;
    for (int i = 0; i < 40; i++) w[i] = tb_test_frand(&seed);
    for (int i = 0; i < 5; i++) bias[i] = 0.1f * (float)i;
    int64_t *m1 = malloc(sizeof *m1);
    *m1 = -1;
    int wv = tb_graph_add_weight(g, "w", TB_F32, 2, wd, w, 1);
    int bv = tb_graph_add_weight(g, "bias", TB_F32, 1, bd, bias, 1);
    int sv = tb_graph_add_weight(g, "flat", TB_I64, 1, &one, m1, 1);
    int min[3] = {x, wv, bv};
    int32_t ma[TB_NODE_INTS] = {0, 0, TB_NN_ACT_RELU, TB_NN_HAS_BIAS};
    const char *nm = "y";
    int km = tb_graph_add_node_ex(g, TB_OP_NN_MATMUL, min, 3, &nm, 1, ma, NULL);
    CHECK_MSG(km >= 0, "matmul: %s", tb_last_error());
    if (km < 0) { tb_graph_free(g); return NULL; }
    int rin[2] = {g->nodes[km].out[0], sv};
    nm = "z";
    int kr = tb_graph_add_node_ex(g, TB_OP_RESHAPE, rin, 2, &nm, 1, NULL, NULL);
    CHECK_MSG(kr >= 0, "reshape: %s", tb_last_error());
    if (kr < 0) { tb_graph_free(g); return NULL; }
    g->outputs[g->n_outputs++] = g->nodes[km].out[0];
    g->outputs[g->n_outputs++] = g->nodes[kr].out[0];
    return g;
}

static void test_f16(void) {
    tb_graph *g = make_mlp(), *g32 = make_mlp();
    if (!g || !g32) { tb_graph_free(g); tb_graph_free(g32); return; }
    tb_opt_options oo;
    memset(&oo, 0, sizeof oo);
    snprintf(oo.device, sizeof oo.device, "cpu");
    oo.dtype = TB_F16;
    static const tb_pass pass[] = {{"precision-f16", tb_opt_precision, ""}};
    CHECK_MSG(tb_opt_run(g, pass, 1, &oo) == TB_OK, "f16: %s", tb_last_error());
    /* the weights are f16, the input and outputs keep f32 and their names */
    CHECK(g->values[g->inputs[0]].dtype == TB_F32 && !strcmp(g->values[g->inputs[0]].name, "x"));
    CHECK(g->values[g->outputs[0]].dtype == TB_F32 && !strcmp(g->values[g->outputs[0]].name, "y"));
    CHECK(g->values[g->outputs[1]].dtype == TB_F32 && !strcmp(g->values[g->outputs[1]].name, "z"));
    int n16 = 0, n_cast = 0;
    for (int v = 0; v < g->n_values; v++)
        n16 += g->values[v].kind == TB_VAL_WEIGHT && g->values[v].dtype == TB_F16;
    for (int k = 0; k < g->n_nodes; k++) n_cast += g->nodes[k].op == TB_OP_CAST;
    CHECK_MSG(n16 == 2 && n_cast == 3, "%d f16 weights, %d Casts", n16, n_cast);
    int shape_w = tb_graph_find_value(g, "flat");
    CHECK(shape_w >= 0 && g->values[shape_w].dtype == TB_I64);
    tb_engine *e = NULL;
    tb_exec *x = NULL;
    CHECK_MSG(tb_engine_from_graph(g, "cpu", &e) == TB_OK, "%s", tb_last_error());
    if (e) CHECK_MSG(tb_exec_create(e, NULL, &x) == TB_OK, "%s", tb_last_error());
    for (int batch = 1; x && batch <= 4; batch++) {
        float data[32];
        uint64_t seed = 5 + (uint64_t)batch;
        for (int i = 0; i < batch * 8; i++) data[i] = tb_test_frand(&seed);
        tb_tensor in = {.dtype = TB_F32, .rank = 2, .dims = {batch, 8}, .data = data};
        tb_tensor out[2];
        tb_status s = tb_exec_run(x, &in, 1, out, 2);
        CHECK_MSG(s == TB_OK, "f16 batch %d: %s", batch, tb_last_error());
        tb_view iv = {.dtype = TB_F32, .rank = 2, .dims = {batch, 8}, .data = data};
        tb_view ref[2];
        CHECK(tb_interp_run(g32, &iv, 1, ref, 2) == TB_OK);
        if (s == TB_OK) {
            CHECK(out[0].dtype == TB_F32 && out[1].dtype == TB_F32 && out[1].rank == 1 && out[1].dims[0] == batch * 5);
            double worst = 0;
            for (int i = 0; i < batch * 5; i++) {
                double a = ((float *)out[0].data)[i], r = ((float *)ref[0].data)[i];
                double err = fabs(a - r) / (fabs(r) + 0.05);
                if (err > worst) worst = err;
                CHECK(((float *)out[1].data)[i] == (float)a);
            }
            /* f16 weights and activations: a few ulps of 2^-11 per step */
            CHECK_MSG(worst < 1e-2, "f16 batch %d: relative error %g", batch, worst);
        }
        tb_interp_free_outputs(ref, 2);
    }
    tb_exec_free(x);
    tb_engine_free(e);
    tb_graph_free(g32);
}

/* ---------------------------------------------------------------- memory */

/* y = ConstantOfShape(n) (f32 ones): the activation's size comes from the
 * input's value. A run needing more than tb_mem_available() is refused
 * with TB_ERR_OOM naming both sizes, before anything is allocated, and the
 * executor keeps running smaller ones. */
static void test_memory_cap(void) {
    tb_graph *g = tb_graph_new();
    int64_t nd[1] = {1};
    int nv = tb_graph_add_value(g, "n", TB_VAL_INPUT, TB_I64, 1, nd);
    g->inputs[g->n_inputs++] = nv;
    float *one = malloc(sizeof *one);
    *one = 1.0f;
    int in[2] = {nv, tb_graph_add_weight(g, "value", TB_F32, 0, NULL, one, 1)};
    const char *yn = "y";
    int k = tb_graph_add_node_ex(g, TB_OP_CONSTANT_OF_SHAPE, in, 2, &yn, 1, NULL, NULL);
    CHECK_MSG(k >= 0, "constant_of_shape: %s", tb_last_error());
    if (k < 0) { tb_graph_free(g); return; }
    g->outputs[g->n_outputs++] = g->nodes[k].out[0];
    tb_engine *e = NULL;
    tb_exec *x = NULL;
    CHECK_MSG(tb_engine_from_graph(g, "cpu", &e) == TB_OK, "%s", tb_last_error());
    if (e) CHECK_MSG(tb_exec_create(e, NULL, &x) == TB_OK, "%s", tb_last_error());
    if (!x) { tb_engine_free(e); return; }
    int64_t n = 1000;
    tb_tensor t = {.dtype = TB_I64, .rank = 1, .dims = {1}, .data = &n};
    tb_tensor out[1];
    setenv("TURBINE_MEM_AVAILABLE", "1000", 1); /* 1,000 bytes: 4,000 of activations are too many */
    CHECK(tb_mem_available() == 1000);
    CHECK(tb_exec_run(x, &t, 1, out, 1) == TB_ERR_OOM);
    CHECK_MSG(strstr(tb_last_error(), "need 0.00 GB of activations, more than the 0.00 GB of memory available"),
              "%s", tb_last_error());
    unsetenv("TURBINE_MEM_AVAILABLE");
    uint64_t avail = tb_mem_available();
    CHECK(avail > 0); /* /proc/meminfo */
    CHECK(tb_exec_run(x, &t, 1, out, 1) == TB_OK && out[0].rank == 1 && out[0].dims[0] == 1000 &&
          ((float *)out[0].data)[999] == 1.0f);
    /* the machine's own figure: an eighth (at least 1 GB) more than it has free */
    uint64_t extra = avail / 8 > (1ull << 30) ? avail / 8 : (1ull << 30);
    n = (int64_t)((avail + extra) / 4);
    CHECK(tb_exec_run(x, &t, 1, out, 1) == TB_ERR_OOM);
    CHECK_MSG(strstr(tb_last_error(), "GB of memory available"), "%s", tb_last_error());
    n = 7;
    CHECK(tb_exec_run(x, &t, 1, out, 1) == TB_OK && out[0].dims[0] == 7);
    tb_exec_free(x);
    tb_engine_free(e);
}

int main(void) {
    tb_graph *g = make_graph();
    if (!g) return tb_test_finish("test_exec");
    char path[512];
    snprintf(path, sizeof path, "%s/tb_test_exec_%d.engine", tb_test_tmp(), (int)getpid());
    CHECK_MSG(tb_engine_write_general(g, path, "cpu", "test", 0.0) == TB_OK, "write: %s", tb_last_error());
    tb_engine *e = NULL;
    CHECK_MSG(tb_engine_load(path, &e) == TB_OK, "load: %s", tb_last_error());
    if (e) {
        CHECK(!tb_engine_is_llm(e));
        tb_context *c = NULL;
        CHECK(tb_context_create(e, NULL, &c) == TB_ERR_INVALID_ARG && !c);
        tb_exec *x = NULL;
        CHECK_MSG(tb_exec_create(e, NULL, &x) == TB_OK, "exec: %s", tb_last_error());
        if (x) {
            CHECK(tb_exec_n_inputs(x) == 1 && tb_exec_n_outputs(x) == 2);
            tb_io_info info;
            CHECK(tb_exec_input_info(x, 0, &info) == TB_OK && !strcmp(info.name, "x") && info.min[0] == 1 &&
                  info.opt[0] == 2 && info.max[0] == 4 && info.min[1] == 3);
            CHECK(tb_exec_output_info(x, 1, &info) == TB_OK && !strcmp(info.name, "t"));
            /* new shapes, a repeated one, and back */
            int batches[] = {2, 2, 1, 4, 3, 2};
            for (int i = 0; i < 6; i++) run_against_interp(x, e->graph, batches[i], 7 + (uint64_t)i);
            /* outside the profile */
            float buf[5 * 3 * 8 * 8] = {0};
            tb_tensor in = {.dtype = TB_F32, .rank = 4, .dims = {5, 3, 8, 8}, .data = buf};
            tb_tensor out[2];
            CHECK(tb_exec_run(x, &in, 1, out, 2) == TB_ERR_RANGE);
            CHECK_MSG(strstr(tb_last_error(), "[1, 4]") && strstr(tb_last_error(), "batch"), "%s", tb_last_error());
            /* a fixed dim that differs, a wrong dtype, a wrong count */
            in.dims[0] = 1;
            in.dims[1] = 4;
            CHECK(tb_exec_run(x, &in, 1, out, 2) == TB_ERR_INVALID_ARG);
            in.dims[1] = 3;
            in.dtype = TB_I32;
            CHECK(tb_exec_run(x, &in, 1, out, 2) != TB_OK);
            in.dtype = TB_F32;
            CHECK(tb_exec_run(x, &in, 0, out, 2) == TB_ERR_INVALID_ARG);
            CHECK(tb_exec_run(x, &in, 1, out, 1) == TB_ERR_INVALID_ARG);
            /* and it still runs */
            run_against_interp(x, e->graph, 3, 99);
            tb_exec_free(x);
        }
        tb_engine_free(e);
    }
    remove(path);
    /* in memory */
    tb_engine *m = NULL;
    CHECK_MSG(tb_engine_from_graph(g, "cpu", &m) == TB_OK, "%s", tb_last_error());
    if (m) {
        tb_exec *x = NULL;
        CHECK(tb_exec_create(m, NULL, &x) == TB_OK);
        if (x) run_against_interp(x, m->graph, 4, 5);
        tb_exec_free(x);
        tb_engine_free(m);
    }
    test_views();
    test_profiles();
    test_f16();
    test_memory_cap();
    return tb_test_finish("test_exec");
}
