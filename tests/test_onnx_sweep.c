/*
 * test_onnx_sweep.c — every op the ONNX importer maps, as a one-node model
 * with inputs left out (the empty name), of odd ranks (0, 6) and of other
 * dtypes (int64, bool): ~22,000 models (tests/onnx_import/sweep_models.py
 * packs them into one file), each imported from memory and, when it
 * imports, run by the reference interpreter on an input of ones:
 *   - the import gives a graph, or an error status with a message and no
 *     graph (never a crash: under test_sanitizers a read past the
 *     importer's tables fails here; one did for Clip with neither x nor
 *     min, and for Slice with steps but no starts);
 *   - an imported graph passes tb_graph_check, and the interpreter gives
 *     its outputs or an error with a message;
 *   - some nodes are refused, and at least 3/4 of the op types import
 *     from x alone (the rest, named in the output, need constants).
 * Skipped when the build has no ONNX reader or python3-onnx is missing.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "import/onnx.h"
#include "ir/interp.h"
#include "tb_test.h"

static void fill_ones(const tb_view *v, void *data, size_t n) {
    size_t es = tb_dtype_size(v->dtype), cnt = es ? n / es : 0;
    for (size_t i = 0; i < cnt; i++) {
        uint8_t *p = (uint8_t *)data + i * es;
        switch (v->dtype) {
        case TB_F32: { float one = 1.0f; memcpy(p, &one, 4); break; }
        case TB_I64: { int64_t one = 1; memcpy(p, &one, 8); break; }
        default: p[0] = 1; break; /* bool, int8, uint8 */
        }
    }
}

int main(void) {
    tb_graph *g = NULL;
    if (tb_onnx_import("/nonexistent.onnx", NULL, &g) == TB_ERR_UNSUPPORTED) {
        CHECK(strstr(tb_last_error(), "not in this build") != NULL);
        printf("skip: %s\n", tb_last_error());
        return tb_test_finish("test_onnx_sweep");
    }
    const char *src = getenv("TURBINE_SRC");
    char pack[600], cmd[2000];
    snprintf(pack, sizeof pack, "%s/onnx_sweep_%d.bin", tb_test_tmp(), (int)getpid());
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/onnx_import/sweep_models.py %s > /dev/null",
             src && *src ? src : "..", pack);
    int rc = system(cmd);
    if (rc != 0) {
        CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 77, "sweep_models.py failed (%d)", rc);
        printf("skip: python3-onnx is not installed\n");
        return tb_test_finish("test_onnx_sweep");
    }
    FILE *f = fopen(pack, "rb");
    CHECK(f != NULL);
    if (!f) return tb_test_finish("test_onnx_sweep");
    tb_log_set_level(TB_LOG_ERROR); /* refusals are warned about */
    int models = 0, imported = 0, refused = 0, ran = 0, run_err = 0, bad = 0, cut = 0;
    char ok_ops[128][32];
    int n_ok_ops = 0;
    char all_ops[128][32];
    int n_all_ops = 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char name[128];
        long len = 0;
        if (sscanf(line, "%127s %ld", name, &len) != 2 || len <= 0 || len > (1 << 20)) {
            cut = 1;
            break;
        }
        uint8_t *buf = malloc((size_t)len);
        if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
            free(buf);
            cut = 1;
            break;
        }
        models++;
        char op[32];
        snprintf(op, sizeof op, "%s", name);
        char *us = strchr(op, '_');
        if (us) *us = '\0';
        int seen = 0;
        for (int i = 0; i < n_all_ops && !seen; i++) seen = !strcmp(all_ops[i], op);
        if (!seen && n_all_ops < 128) snprintf(all_ops[n_all_ops++], 32, "%s", op);

        g = NULL;
        tb_status s = tb_onnx_import_buffer(buf, (size_t)len, NULL, NULL, &g);
        free(buf);
        if (s != TB_OK) {
            refused++;
            if (g != NULL || !tb_last_error()[0]) {
                bad++;
                CHECK_MSG(0, "%s: status %d, graph %p, message '%s'", name, (int)s, (void *)g, tb_last_error());
            }
            tb_graph_free(g);
            continue;
        }
        imported++;
        seen = 0;
        for (int i = 0; i < n_ok_ops && !seen; i++) seen = !strcmp(ok_ops[i], op);
        if (!seen && n_ok_ops < 128) snprintf(ok_ops[n_ok_ops++], 32, "%s", op);
        if (!g || tb_graph_check(g) != TB_OK) {
            bad++;
            CHECK_MSG(0, "%s: imported, but the graph %s: %s", name, g ? "fails its check" : "is missing",
                      tb_last_error());
            tb_graph_free(g);
            continue;
        }
        /* one input of the declared shape, all ones (or none: x unused) */
        tb_view in[1];
        void *data = NULL;
        int n_in = g->n_inputs, fixed = n_in <= 1;
        if (n_in == 1) {
            const tb_value *x = &g->values[g->inputs[0]];
            in[0].dtype = x->dtype;
            in[0].rank = x->rank;
            size_t cnt = 1;
            for (int d = 0; d < x->rank; d++) {
                in[0].dims[d] = x->dims[d];
                if (x->dims[d] < 0) fixed = 0;
                else cnt *= (size_t)x->dims[d];
            }
            size_t nb = cnt * tb_dtype_size(x->dtype);
            data = calloc(1, nb ? nb : 1);
            if (data) fill_ones(&in[0], data, nb);
            in[0].data = data;
        }
        if (fixed && (n_in == 0 || data)) {
            tb_view outs[8];
            int n_out = g->n_outputs;
            if (n_out <= 8) {
                s = tb_interp_run(g, in, n_in, outs, n_out);
                if (s == TB_OK) {
                    ran++;
                    tb_interp_free_outputs(outs, n_out);
                } else {
                    run_err++;
                    if (!tb_last_error()[0]) {
                        bad++;
                        CHECK_MSG(0, "%s: the interpreter failed (%d) without a message", name, (int)s);
                    }
                }
            }
        }
        free(data);
        tb_graph_free(g);
    }
    fclose(f);
    unlink(pack);
    tb_log_set_level(TB_LOG_WARN);
    printf("%d models: %d imported (%d ran, %d refused by the interpreter), %d refused by the importer; "
           "%d of %d op types imported at least once\n",
           models, imported, ran, run_err, refused, n_ok_ops, n_all_ops);
    CHECK_MSG(models > 20000 && !cut, "%d models read from the pack%s", models, cut ? ", then it was cut" : "");
    CHECK(bad == 0);
    CHECK(refused > 0 && imported > 0 && ran > 0);
    /* most op types import from x alone (the rest need constant inputs of
     * their own: named, not failed) */
    printf("never imported (constant inputs needed):");
    for (int i = 0; i < n_all_ops; i++) {
        int ok = 0;
        for (int j = 0; j < n_ok_ops && !ok; j++) ok = !strcmp(all_ops[i], ok_ops[j]);
        if (!ok) printf(" %s", all_ops[i]);
    }
    printf("\n");
    CHECK_MSG(n_ok_ops * 4 >= n_all_ops * 3, "%d of %d op types imported", n_ok_ops, n_all_ops);
    return tb_test_finish("test_onnx_sweep");
}
