/*
 * exec_cli.c — `turbine exec MODEL.onnx|FILE.engine --inputs DIR --outputs DIR`:
 * runs a general engine once on TensorProto files laid out as ONNX's backend
 * tests lay them out: DIR/input_K.pb for the K-th graph input, and writes
 * DIR/output_K.pb (named after the graph outputs). Given an .onnx file it
 * builds the engine in memory for exactly the inputs' shapes (every dim
 * fixed, so shape computations fold away). `--list-ops` prints the ONNX op
 * types this build imports, one per line.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "import/onnx.h"
#include "plan/engine.h"
#include "runtime/runtime.h"
#include "turbine/turbine.h"

typedef struct {
    const char *model, *inputs, *outputs, *device;
    int threads, list_ops, verbose, repeat;
} exec_args;

static void exec_defaults(void *p) {
    exec_args *a = p;
    memset(a, 0, sizeof *a);
    a->repeat = 1;
}

#define X(f) offsetof(exec_args, f)
static const tb_cli_opt exec_opts[] = {
    {"--inputs", NULL, TB_OPT_STR, "DIR", 0, 0, 0, 0, 0, X(inputs), NULL,
     "a folder of input_0.pb, input_1.pb, ... (TensorProto), one per graph input in order"},
    {"--outputs", NULL, TB_OPT_STR, "DIR", 0, 0, 0, 0, 0, X(outputs), NULL,
     "the folder output_0.pb, ... are written to (created when missing)"},
    {"--device", NULL, TB_OPT_STR, "cpu|cuda[:N]", 0, 0, 0, 0, 0, X(device), "the engine's backend",
     TB_CLI_HELP_DEVICE},
    {"--threads", "-t", TB_OPT_INT, "N", 1, 256, 0, 0, 0, X(threads), "one per core", "CPU threads"},
    {"--repeat", NULL, TB_OPT_INT, "N", 1, 1000000, 0, 0, 0, X(repeat), "1",
     "runs (the outputs of the last are written; the mean time is printed)"},
    {"--verbose", "-v", TB_OPT_FLAG, NULL, 0, 0, 0, 0, 1, X(verbose), NULL,
     "list the passes and what each changed (for an .onnx MODEL)"},
    {"--list-ops", NULL, TB_OPT_FLAG, NULL, 0, 0, 0, 0, 1, X(list_ops), NULL,
     "print the ONNX op types this build imports, one per line, and exit"},
};
#undef X

const tb_cli_cmd tb_cmd_exec = {
    "exec",
    "Runs an ONNX model or a general engine once on TensorProto input files and writes the outputs as "
    "TensorProto files (the layout of ONNX's backend tests).",
    {"MODEL"}, {offsetof(exec_args, model)}, 1, 0,
    exec_opts, sizeof exec_opts / sizeof exec_opts[0],
    "MODEL is an .onnx file (compiled in memory for the inputs' shapes) or an engine built from one by "
    "`turbine build MODEL.onnx`; an engine refuses inputs outside its optimisation profile.",
    sizeof(exec_args), exec_defaults,
};

static int fail(const char *what) {
    fprintf(stderr, "turbine exec: error: %s%s%s\n", what, *tb_last_error() ? ": " : "", tb_last_error());
    return 1;
}

static void shape_text(const tb_tensor *t, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int d = 0; d < t->rank && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? "x" : "", (long long)t->dims[d]);
    if (t->rank == 0) snprintf(buf, cap, "scalar");
}

int tb_cli_exec(int argc, char **argv) {
    exec_args a;
    exec_defaults(&a);
    int rc = tb_cli_parse(&tb_cmd_exec, argc, argv, &a);
    if (rc >= 0) return rc;
    if (a.list_ops) {
        char *ops = tb_onnx_supported_ops();
        if (!ops) return fail("cannot list the ONNX ops");
        fputs(ops, stdout);
        free(ops);
        return 0;
    }
    if (!a.model) return tb_cli_usage_error("exec", "MODEL is required");
    if (!a.inputs) return tb_cli_usage_error("exec", "--inputs DIR is required");
    /* inputs: input_0.pb, input_1.pb, ... until one is missing */
    tb_tensor in[TB_MAX_IO];
    char names[TB_MAX_IO][96];
    int n_in = 0;
    memset(in, 0, sizeof in);
    for (; n_in < TB_MAX_IO; n_in++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/input_%d.pb", a.inputs, n_in);
        struct stat sb;
        if (stat(path, &sb) != 0) break;
        if (tb_onnx_read_tensor(path, &in[n_in], names[n_in], sizeof names[n_in]) != TB_OK) {
            for (int i = 0; i < n_in; i++) free(in[i].data);
            return fail("cannot read an input");
        }
    }
    tb_engine *e = NULL;
    tb_exec *x = NULL;
    rc = 1;
    if (tb_is_onnx_path(a.model)) {
        /* the profile is the inputs' own shapes, by position */
        char shapes[4096];
        size_t n = 0;
        shapes[0] = 0;
        for (int i = 0; i < n_in && n < sizeof shapes; i++) {
            char s[256];
            shape_text(&in[i], s, sizeof s);
            n += (size_t)snprintf(shapes + n, sizeof shapes - n, "%s#%d:%s", i ? "," : "", i,
                                  in[i].rank ? s : "");
        }
        if (tb_engine_from_onnx(a.model, shapes, a.device, a.verbose, &e) != TB_OK) {
            fail("cannot compile the model");
            goto done;
        }
    } else if (tb_engine_load_for(a.model, a.device, &e) != TB_OK) {
        fail("cannot load the engine");
        goto done;
    }
    tb_exec_options xo;
    tb_exec_options_default(&xo);
    xo.n_threads = a.threads;
    xo.device = a.device;
    if (tb_exec_create(e, &xo, &x) != TB_OK) { fail("cannot run the engine"); goto done; }
    if (n_in != tb_exec_n_inputs(x)) {
        fprintf(stderr, "turbine exec: error: the model takes %d inputs, %s has %d (input_0.pb ...)\n",
                tb_exec_n_inputs(x), a.inputs, n_in);
        goto done;
    }
    int n_out = tb_exec_n_outputs(x);
    tb_tensor out[TB_MAX_IO];
    double t0 = tb_now(), first = 0;
    for (int r = 0; r < a.repeat; r++) {
        if (tb_exec_run(x, in, n_in, out, n_out) != TB_OK) { fail("run failed"); goto done; }
        if (r == 0) first = tb_now() - t0;
    }
    double mean = (tb_now() - t0) / a.repeat;
    fprintf(stderr, "ran %s: %d inputs, %d outputs, first run %.3f ms, mean %.3f ms over %d\n", a.model, n_in, n_out,
            first * 1e3, mean * 1e3, a.repeat);
    if (a.outputs) {
        mkdir(a.outputs, 0755);
        for (int i = 0; i < n_out; i++) {
            tb_io_info info;
            tb_exec_output_info(x, i, &info);
            char path[4096];
            snprintf(path, sizeof path, "%s/output_%d.pb", a.outputs, i);
            if (tb_onnx_write_tensor(path, info.name, &out[i]) != TB_OK) { fail("cannot write an output"); goto done; }
        }
    }
    rc = 0;
done:
    tb_exec_free(x);
    tb_engine_free(e);
    for (int i = 0; i < n_in; i++) free(in[i].data);
    return rc;
}
