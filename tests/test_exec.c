/*
 * test_exec.c — the executor of general engines (runtime/exec.c) against the
 * reference interpreter (ir/interp.c): a graph with a symbolic batch whose
 * Reshape target is computed at run time (Shape -> Gather -> Concat), run
 * through an engine file and in memory at several batch sizes (replanned on
 * each new shape, bit-identical to the interpreter), refused outside its
 * profile (TB_ERR_RANGE naming the range) and on wrong inputs; and the
 * engine file's general kind checked on load.
 */
#include <unistd.h>

#include "ir/interp.h"
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
    return tb_test_finish("test_exec");
}
