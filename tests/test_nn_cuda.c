/*
 * test_nn_cuda.c — every general op (ops_nn.def) on the CUDA backend against
 * its reference kernel (tb_op_get_def(op)->ref), f32 and f16.
 *
 * Each case is one node over inputs of given shapes: random data (or given
 * values for host inputs: shapes, axes, starts, scalars), uploaded with the
 * backend's own upload; the node runs through the vtable (supports_op,
 * run_begin, run_node, run_end) three times over the same buffers: eagerly,
 * captured as a CUDA graph, and replayed, with the outputs poisoned (all
 * bits set: NaN for floats) before each run, downloaded and compared with
 * the reference after each. f16 cases: the inputs are drawn in f16; the
 * reference runs on their exact f32 values and its output is compared with
 * the f16 output.
 *
 * The backend is required when TURBINE_TEST_DEVICE=cuda[:N]; otherwise,
 * without a GPU (or without the CUDA module), the test prints that it is
 * skipped and passes (the repository's convention, as test_backend_ops).
 * Ops whose reference kernel this build lacks are listed as skipped.
 *
 * Error: max |gpu - ref| / max |ref| over the output (integer and bool
 * outputs: exact). Bounds, and why:
 *
 *   class                        f32     f16
 *   copies, data movement, Relu  0       0       exact: the result is one
 *   Neg Abs Floor Ceil Clip,                     of the inputs' values
 *   Where, Cast, compares, max
 *   pools, nearest Resize
 *   Add Sub Mul Div (f32: IEEE   0       1e-3    f32: correctly rounded in
 *   ops, no fast math)                           both; f16: the f16 output
 *                                                against the reference's
 *                                                f32 one, half an f16 ulp
 *                                                (2^-11 of the largest)
 *   transcendental unary, Pow,   2e-6    1e-3    f32 libm vs double (a few
 *   Softmax, BatchNorm, Reduce,                  ulp); f16 as above
 *   avg pools, linear / cubic
 *   Resize
 *   LayerNormalization           1e-5    2e-3    f32 sums of the mean and
 *                                                variance in another order
 *   MatMul, Gemm, Conv           1e-5    3e-3    f32 cuBLAS (no TF32) /
 *                                                f16 tensor cores with f32
 *                                                accumulation, one rounding
 *   sdpa                         2e-5    3e-3    f32 online softmax; f16 D 32 /
 *                                                64 / 128: tensor cores, P
 *                                                rounded to f16
 *
 * Prints one line per case and, at the end, one line per op with its worst
 * error.
 */
#include <math.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ir/ops_nn.h"
#include "tb_test.h"

#define MAXV 12

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* one input: dtype, shape, and either given values (host inputs) or a
 * random range */
typedef struct {
    tb_dtype dt;
    int rank;
    int64_t dims[TB_MAX_RANK];
    const void *data; /* given values (their dtype is dt), or NULL */
    double lo, hi;    /* random: uniform [lo, hi) (ints: floor), bool: P(1) = hi */
} tin;

static tb_backend *B;
static double worst[TB_OP_COUNT];
static int ran[TB_OP_COUNT], skipped_ref[TB_OP_COUNT];
static int n_cases, n_fail;

/* Conv cases: the path the backend took, read from its info log (one line
 * per convolution geometry, on its first run), and the path the case
 * expects: 0 either, 1 cudnn, 2 im2col. */
static int want_path, conv_paths; /* conv_paths: on a CUDA backend */
static char conv_path[48];
static int saved_fd = -1;
static FILE *cap_file;

static void log_capture_begin(void) {
    fflush(stderr);
    tb_log_set_level(TB_LOG_INFO); /* the backend's info lines name each convolution's path */
    cap_file = tmpfile();
    if (!cap_file) return;
    saved_fd = dup(2);
    dup2(fileno(cap_file), 2);
}

/* ends the capture; echoes the backend's lines (indented) and names the path */
static void log_capture_end(void) {
    snprintf(conv_path, sizeof conv_path, "path ?");
    tb_log_set_level(TB_LOG_WARN);
    if (!cap_file) return;
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    saved_fd = -1;
    rewind(cap_file);
    char line[1024];
    while (fgets(line, sizeof line, cap_file)) {
        const char *c = strstr(line, ": cudnn"), *i = strstr(line, ": im2col");
        if (c) snprintf(conv_path, sizeof conv_path, "path cudnn%s", strstr(c, " fused") == c + 7 ? " fused" : "");
        else if (i) snprintf(conv_path, sizeof conv_path, "path im2col");
        printf("      | %s", line);
    }
    fclose(cap_file);
    cap_file = NULL;
}

static int64_t nel(int rank, const int64_t *d) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= d[i];
    return n;
}

static double get_d(tb_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case TB_F32: return ((const float *)p)[i];
    case TB_F16: return tb_f16_to_f32(((const uint16_t *)p)[i]);
    case TB_F64: return ((const double *)p)[i];
    case TB_I64: return (double)((const int64_t *)p)[i];
    case TB_I32: return ((const int32_t *)p)[i];
    case TB_I8: return ((const int8_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static void put_d(tb_dtype dt, void *p, int64_t i, double x) {
    switch (dt) {
    case TB_F32: ((float *)p)[i] = (float)x; break;
    case TB_F16: ((uint16_t *)p)[i] = tb_f32_to_f16((float)x); break;
    case TB_F64: ((double *)p)[i] = x; break;
    case TB_I64: ((int64_t *)p)[i] = (int64_t)x; break;
    case TB_I32: ((int32_t *)p)[i] = (int32_t)x; break;
    case TB_I8: ((int8_t *)p)[i] = (int8_t)x; break;
    default: ((uint8_t *)p)[i] = (uint8_t)x; break;
    }
}

/* the backend's copies (a backend without them, the CPU: memcpy) */
static tb_status copy_to(void *dst, const void *src, size_t n) {
    if (B->iface->upload) return B->iface->upload(B, dst, src, n);
    memcpy(dst, src, n);
    return TB_OK;
}
static tb_status copy_from(void *dst, const void *src, size_t n) {
    if (B->iface->download) return B->iface->download(B, dst, src, n);
    memcpy(dst, src, n);
    return TB_OK;
}

static int is_float(tb_dtype t) { return t == TB_F32 || t == TB_F16 || t == TB_BF16 || t == TB_F64; }

/* Runs node `n` (op, attributes, n_in, n_out set; value indices filled
 * here) over the inputs, in the test dtype `dt` (F32 or F16: float inputs
 * declared F32 are drawn in dt), against the reference. */
static void run_case(const char *what, tb_node n, const tin *ins, tb_dtype dt, double bound) {
    const tb_op_def *def = tb_op_get_def(n.op);
    const char *opn = tb_op_name(n.op);
    const char *dtn = dt == TB_F16 ? "f16" : "f32";
    if (!def || !def->ref || !def->infer) {
        skipped_ref[n.op] = 1;
        return;
    }
    n_cases++;
    int n_in = n.n_in, n_out = n.n_out, nv = n_in + n_out;
    tb_view rv[MAXV], gv[MAXV]; /* reference (f32) and device views */
    void *host[MAXV] = {0}, *refd[MAXV] = {0}, *dev[MAXV] = {0};
    memset(rv, 0, sizeof rv);
    memset(gv, 0, sizeof gv);
    int ok = 1;
    char why[160] = "";
    for (int k = 0; k < n_in; k++) {
        const tin *t = &ins[k];
        tb_dtype gdt = t->dt == TB_F32 && !t->data ? dt : t->dt;
        int64_t ne = nel(t->rank, t->dims);
        size_t es = tb_dtype_size(gdt);
        host[k] = calloc((size_t)(ne ? ne : 1), es);
        refd[k] = calloc((size_t)(ne ? ne : 1), gdt == TB_F16 ? 4 : es);
        for (int64_t i = 0; i < ne; i++) {
            double v;
            if (t->data) v = get_d(t->dt, t->data, i);
            else if (gdt == TB_BOOL) v = urand() < t->hi;
            else if (is_float(gdt)) v = t->lo + (t->hi - t->lo) * urand();
            else v = floor(t->lo + (t->hi - t->lo) * urand());
            put_d(gdt, host[k], i, v);
            /* the reference sees the exact value the device has */
            put_d(gdt == TB_F16 ? TB_F32 : gdt, refd[k], i, get_d(gdt, host[k], i));
        }
        gv[k] = (tb_view){gdt, t->rank, {0}, host[k]};
        rv[k] = (tb_view){gdt == TB_F16 ? TB_F32 : gdt, t->rank, {0}, refd[k]};
        memcpy(gv[k].dims, t->dims, sizeof t->dims);
        memcpy(rv[k].dims, t->dims, sizeof t->dims);
        n.in[k] = k;
    }
    tb_op_shape sh;
    tb_status s = tb_op_infer_views(&n, rv, n_in, &sh); /* outputs default to input 0's dtype */
    if (s != TB_OK) {
        printf("  %-18s %-3s %-44s FAIL (shape rule: %s)\n", opn, dtn, what, tb_last_error());
        n_fail++;
        tb_test_failures++;
        goto done;
    }
    if (sh.n_out != n_out) {
        printf("  %-18s %-3s %-44s FAIL (the rule gives %d outputs, the case %d)\n", opn, dtn, what, sh.n_out, n_out);
        n_fail++;
        tb_test_failures++;
        goto done;
    }
    for (int o = 0; o < n_out; o++) {
        int v = n_in + o;
        tb_dtype odt = sh.dtype[o];
        tb_dtype gdt = odt == TB_F32 && dt == TB_F16 && n.op != TB_OP_CAST ? TB_F16 : odt;
        if (n.op == TB_OP_CAST) gdt = (tb_dtype)n.i[0];
        int64_t ne = nel(sh.rank[o], sh.dims[o]);
        refd[v] = calloc((size_t)(ne ? ne : 1), tb_dtype_size(odt));
        host[v] = calloc((size_t)(ne ? ne : 1), tb_dtype_size(gdt));
        rv[v] = (tb_view){odt, sh.rank[o], {0}, refd[v]};
        gv[v] = (tb_view){gdt, sh.rank[o], {0}, NULL};
        memcpy(rv[v].dims, sh.dims[o], sizeof rv[v].dims);
        memcpy(gv[v].dims, sh.dims[o], sizeof gv[v].dims);
        n.out[o] = v;
    }
    if ((s = def->ref(&n, rv, n_in, rv + n_in, n_out)) != TB_OK) {
        printf("  %-18s %-3s %-44s FAIL (reference: %s)\n", opn, dtn, what, tb_last_error());
        n_fail++;
        tb_test_failures++;
        goto done;
    }
    /* the one-node graph the backend sees */
    tb_value vals[MAXV];
    memset(vals, 0, sizeof vals);
    tb_graph g;
    memset(&g, 0, sizeof g);
    for (int v = 0; v < nv; v++) {
        snprintf(vals[v].name, sizeof vals[v].name, "v%d", v);
        vals[v].kind = v < n_in ? TB_VAL_INPUT : TB_VAL_ACT;
        vals[v].dtype = gv[v].dtype;
        vals[v].rank = gv[v].rank;
        memcpy(vals[v].dims, gv[v].dims, sizeof vals[v].dims);
    }
    g.values = vals;
    g.n_values = g.cap_values = nv;
    g.nodes = &n;
    g.n_nodes = g.cap_nodes = 1;
    g.output = -1;
    for (int k = 0; k < n_in; k++) g.inputs[g.n_inputs++] = k;
    for (int o = 0; o < n_out; o++) g.outputs[g.n_outputs++] = n_in + o;
    if (!B->iface->supports_op(B, &g, &n)) {
        printf("  %-18s %-3s %-44s FAIL (not supported)\n", opn, dtn, what);
        n_fail++;
        tb_test_failures++;
        goto done;
    }
    void *bufs[MAXV];
    for (int v = 0; v < nv; v++) {
        size_t bytes = (size_t)nel(gv[v].rank, gv[v].dims) * tb_dtype_size(gv[v].dtype);
        dev[v] = B->iface->alloc(B, bytes ? bytes : 64);
        bufs[v] = dev[v];
        if (v < n_in && bytes) copy_to(dev[v], host[v], bytes);
    }
    tb_step st;
    memset(&st, 0, sizeof st);
    st.views = gv;
    double err = 0;
    int is_conv = n.op == TB_OP_CONV;
    if (is_conv && conv_paths) log_capture_begin();
    for (int run = 0; run < 3 && ok; run++) {
        for (int o = 0; o < n_out; o++) {
            int v = n_in + o;
            size_t bytes = (size_t)nel(gv[v].rank, gv[v].dims) * tb_dtype_size(gv[v].dtype);
            memset(host[v], 0xff, bytes);
            if (bytes) copy_to(dev[v], host[v], bytes);
        }
        s = TB_OK;
        if (B->iface->run_begin) s = B->iface->run_begin(B, &g, bufs, &st);
        if (s == TB_OK) s = B->iface->run_node(B, &g, &n, bufs, &st);
        if (s == TB_OK && B->iface->run_end) s = B->iface->run_end(B, &g, bufs, &st);
        if (s != TB_OK) {
            snprintf(why, sizeof why, "run %d: %s", run, tb_last_error());
            ok = 0;
            break;
        }
        for (int o = 0; o < n_out; o++) {
            int v = n_in + o;
            int64_t ne = nel(gv[v].rank, gv[v].dims);
            size_t bytes = (size_t)ne * tb_dtype_size(gv[v].dtype);
            if (bytes && copy_from(host[v], dev[v], bytes) != TB_OK) {
                snprintf(why, sizeof why, "download: %s", tb_last_error());
                ok = 0;
                break;
            }
            double mx = 0, d = 0;
            int exact = !is_float(rv[v].dtype);
            for (int64_t i = 0; i < ne; i++) {
                double r = get_d(rv[v].dtype, refd[v], i), x = get_d(gv[v].dtype, host[v], i);
                if (rv[v].dtype == TB_I64) { /* exact in int64 */
                    int64_t xi = gv[v].dtype == TB_I64 ? ((int64_t *)host[v])[i] : (int64_t)x;
                    if (xi != ((int64_t *)refd[v])[i]) d = 1;
                    continue;
                }
                if (fabs(r) > mx) mx = fabs(r);
                double e = fabs(x - r);
                if (isnan(r) && isnan(x)) e = 0;
                else if (isinf(r) && x == r) e = 0;
                else if (e != e) e = INFINITY;
                if (e > d) d = e;
            }
            double er = exact ? (d > 0) : d / (mx > 0 ? mx : 1);
            if (er > err) err = er;
        }
        if (!(err <= bound)) {
            snprintf(why, sizeof why, "run %d (%s)", run, run == 0 ? "eager" : run == 1 ? "captured" : "replayed");
            ok = 0;
        }
    }
    if (is_conv && !conv_paths) conv_path[0] = 0;
    if (is_conv && conv_paths) {
        log_capture_end();
        int cud = !strncmp(conv_path, "path cudnn", 10), im = !strcmp(conv_path, "path im2col");
        if (ok && ((want_path == 1 && !cud) || (want_path == 2 && !im))) {
            snprintf(why, sizeof why, "expected the %s path", want_path == 1 ? "cudnn" : "im2col");
            ok = 0;
        }
    }
    for (int v = 0; v < nv; v++) B->iface->free(B, dev[v]);
    if (ok) {
        if (err > worst[n.op]) worst[n.op] = err;
    } else {
        worst[n.op] = INFINITY;
        n_fail++;
        tb_test_failures++;
    }
    ran[n.op] = 1;
    printf("  %-18s %-3s %-44s err %.2e bound %.0e %s%s%s%s%s\n", opn, dtn, what, err, bound, ok ? "ok" : "FAIL",
           why[0] ? " " : "", why, conv_path[0] && is_conv ? " " : "", is_conv ? conv_path : "");
done:
    for (int v = 0; v < nv; v++) {
        free(host[v]);
        free(refd[v]);
    }
}

/* ---------------------------------------------------------------- case builders */

#define D(...) {__VA_ARGS__}
static tin T(tb_dtype dt, int rank, const int64_t *d, double lo, double hi) {
    tin t;
    memset(&t, 0, sizeof t);
    t.dt = dt;
    t.rank = rank;
    memcpy(t.dims, d, sizeof(int64_t) * (size_t)rank);
    t.lo = lo;
    t.hi = hi;
    return t;
}
/* given values */
static tin V(tb_dtype dt, int rank, const int64_t *d, const void *data) {
    tin t = T(dt, rank, d, 0, 0);
    t.data = data;
    return t;
}
static tb_node N(tb_op_kind op, int n_in, int n_out) {
    tb_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.n_in = n_in;
    n.n_out = n_out;
    return n;
}

static const tb_dtype DTS[2] = {TB_F32, TB_F16};
static int n_dts = 2; /* the CPU check: f32 only */
#define FOR_DT for (int di = 0; di < n_dts; di++)
#define DT DTS[di]
#define BND(b32, b16) (DT == TB_F16 ? (b16) : (b32))

static void unary_cases(void) {
    static const int64_t s1[] = {3, 5, 7}, s2[] = {1000}, s3[] = {2, 3, 17, 33};
    const int64_t *shapes[] = {s1, s2, s3};
    int ranks[] = {3, 1, 4};
    struct { tb_op_kind op; double lo, hi, b32, b16; } u[] = {
        {TB_OP_RELU, -3, 3, 0, 0},         {TB_OP_SIGMOID, -8, 8, 2e-6, 1e-3}, {TB_OP_TANH, -4, 4, 2e-6, 1e-3},
        {TB_OP_EXP, -5, 5, 2e-6, 1e-3},    {TB_OP_LOG, 0.05, 9, 2e-6, 1e-3},   {TB_OP_NEG, -3, 3, 0, 0},
        {TB_OP_ABS, -3, 3, 0, 0},          {TB_OP_SQRT, 0, 9, 2e-6, 1e-3},     {TB_OP_RECIPROCAL, 0.5, 4, 2e-6, 1e-3},
        {TB_OP_ERF, -3, 3, 2e-6, 1e-3},    {TB_OP_FLOOR, -9, 9, 0, 0},         {TB_OP_CEIL, -9, 9, 0, 0},
        {TB_OP_IDENTITY, -3, 3, 0, 0},
    };
    for (size_t k = 0; k < sizeof u / sizeof u[0]; k++)
        FOR_DT for (int si = 0; si < 3; si++) {
            tb_node n = N(u[k].op, 1, 1);
            tin in[1] = {T(TB_F32, ranks[si], shapes[si], u[k].lo, u[k].hi)};
            char w[64];
            snprintf(w, sizeof w, "shape %d", si);
            run_case(w, n, in, DT, BND(u[k].b32, u[k].b16));
        }
    FOR_DT for (int form = 0; form < 2; form++) {
        tb_node n = N(TB_OP_GELU, 1, 1);
        n.i[0] = form;
        tin in[1] = {T(TB_F32, 4, s3, -6, 6)};
        run_case(form ? "tanh form" : "erf form", n, in, DT, BND(2e-6, 1e-3));
    }
    /* Clip: min and max as host scalars, each optional */
    static const float lo[] = {-0.5f}, hi[] = {1.25f};
    static const int64_t one[] = {1}, zero[] = {0};
    FOR_DT {
        tb_node n = N(TB_OP_CLIP, 3, 1);
        tin in[3] = {T(TB_F32, 3, s1, -3, 3), V(TB_F32, 1, one, lo), V(TB_F32, 1, one, hi)};
        run_case("min and max", n, in, DT, 0);
        n.n_in = 2;
        run_case("min only", n, in, DT, 0);
        tin in2[3] = {T(TB_F32, 3, s1, -3, 3), V(TB_F32, 1, zero, lo), V(TB_F32, 1, one, hi)};
        n.n_in = 3;
        run_case("no min (empty), max", n, in2, DT, 0);
    }
    {
        static const int64_t il[] = {-3}, ih[] = {40};
        tb_node n = N(TB_OP_CLIP, 3, 1);
        tin in[3] = {T(TB_I64, 2, s1, -100, 100), V(TB_I64, 1, one, il), V(TB_I64, 1, one, ih)};
        run_case("i64", n, in, TB_F32, 0);
        tin in2[1] = {T(TB_I32, 2, s1, -100, 100)};
        n = N(TB_OP_RELU, 1, 1);
        run_case("relu i32", n, in2, TB_F32, 0);
        n = N(TB_OP_NEG, 1, 1);
        run_case("neg i32", n, in2, TB_F32, 0);
    }
    {
        tb_node n = N(TB_OP_NOT, 1, 1);
        tin in[1] = {T(TB_BOOL, 3, s1, 0, 0.5)};
        run_case("bool", n, in, TB_F32, 0);
    }
    /* Cast */
    struct { tb_dtype from, to; double lo, hi; } c[] = {
        {TB_F32, TB_F16, -60000, 60000}, {TB_F16, TB_F32, -100, 100}, {TB_F32, TB_I64, -1e6, 1e6},
        {TB_I64, TB_F32, -1e6, 1e6},     {TB_BOOL, TB_F32, 0, 0.5},    {TB_F32, TB_BOOL, -1, 1},
        {TB_I32, TB_I64, -1e9, 1e9},     {TB_I64, TB_I32, -1e9, 1e9},  {TB_F32, TB_F32, -1, 1},
        {TB_F16, TB_I32, -300, 300},     {TB_I64, TB_F16, -3000, 3000},
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        tb_node n = N(TB_OP_CAST, 1, 1);
        n.i[0] = c[k].to;
        tin in[1] = {T(c[k].from, 3, s1, c[k].lo, c[k].hi)};
        char w[64];
        snprintf(w, sizeof w, "%s -> %s", tb_dtype_name(c[k].from), tb_dtype_name(c[k].to));
        run_case(w, n, in, TB_F32, 0);
    }
}

static void binary_cases(void) {
    struct { int ra; int64_t a[4]; int rb; int64_t b[4]; const char *w; } sh[] = {
        {3, {3, 5, 7}, 3, {3, 5, 7}, "same shape"},
        {2, {4, 17}, 1, {17}, "row broadcast (i % N)"},
        {2, {6, 5}, 2, {6, 1}, "column broadcast (i / N)"},
        {3, {2, 1, 5}, 2, {3, 1}, "both broadcast (strided)"},
        {3, {3, 4, 5}, 1, {1}, "scalar"},
        {1, {1}, 4, {2, 3, 4, 5}, "scalar first"},
        {4, {2, 3, 4, 5}, 3, {3, 1, 5}, "middle broadcast"},
    };
    struct { tb_op_kind op; double lo, hi, b32, b16; } ops[] = {
        {TB_OP_NN_ADD, -3, 3, 0, 1e-3}, {TB_OP_SUB, -3, 3, 0, 1e-3},  {TB_OP_MUL, -3, 3, 0, 1e-3},
        {TB_OP_DIV, 0.5, 3, 0, 1e-3}, {TB_OP_POW, 0.2, 2, 2e-6, 1e-3}, {TB_OP_EQUAL, -2, 2, 0, 0},
        {TB_OP_LESS, -3, 3, 0, 0},   {TB_OP_LESS_OR_EQUAL, -2, 2, 0, 0}, {TB_OP_GREATER, -3, 3, 0, 0},
        {TB_OP_GREATER_OR_EQUAL, -2, 2, 0, 0},
    };
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        FOR_DT for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++) {
            tb_node n = N(ops[k].op, 2, 1);
            int cmp = ops[k].op >= TB_OP_EQUAL;
            /* compares on integers drawn from [lo, hi) so that equality happens */
            tb_dtype idt = cmp ? TB_I32 : TB_F32;
            tin in[2] = {T(TB_F32, sh[si].ra, sh[si].a, ops[k].lo, ops[k].hi),
                         T(TB_F32, sh[si].rb, sh[si].b, ops[k].lo, ops[k].hi)};
            if (cmp && di == 1) { in[0].dt = in[1].dt = idt; }
            run_case(sh[si].w, n, in, DT, BND(ops[k].b32, ops[k].b16));
        }
    /* integers */
    struct { tb_op_kind op; tb_dtype dt; double lo, hi; } io[] = {
        {TB_OP_NN_ADD, TB_I64, -1e12, 1e12}, {TB_OP_MUL, TB_I32, -1000, 1000}, {TB_OP_DIV, TB_I64, -50, 50},
        {TB_OP_SUB, TB_I8, -100, 100},       {TB_OP_EQUAL, TB_I64, -3, 3},      {TB_OP_POW, TB_I64, -3, 4},
    };
    for (size_t k = 0; k < sizeof io / sizeof io[0]; k++)
        for (size_t si = 0; si < 4; si++) {
            tb_node n = N(io[k].op, 2, 1);
            tin in[2] = {T(io[k].dt, sh[si].ra, sh[si].a, io[k].lo, io[k].hi),
                         T(io[k].dt, sh[si].rb, sh[si].b, io[k].lo, io[k].hi)};
            char w[80];
            snprintf(w, sizeof w, "%s %s", tb_dtype_name(io[k].dt), sh[si].w);
            run_case(w, n, in, TB_F32, 0);
        }
    for (int k = 0; k < 2; k++)
        for (size_t si = 0; si < 4; si++) {
            tb_node n = N(k ? TB_OP_OR : TB_OP_AND, 2, 1);
            tin in[2] = {T(TB_BOOL, sh[si].ra, sh[si].a, 0, 0.5), T(TB_BOOL, sh[si].rb, sh[si].b, 0, 0.5)};
            run_case(sh[si].w, n, in, TB_F32, 0);
        }
    FOR_DT {
        tb_node n = N(TB_OP_WHERE, 3, 1);
        static const int64_t c[] = {3, 1, 5}, x[] = {1, 4, 5}, y[] = {5};
        tin in[3] = {T(TB_BOOL, 3, c, 0, 0.5), T(TB_F32, 3, x, -2, 2), T(TB_F32, 1, y, -2, 2)};
        run_case("broadcast cond, x, y", n, in, DT, 0);
        static const int64_t s[] = {4, 33};
        tin in2[3] = {T(TB_BOOL, 2, s, 0, 0.5), T(TB_F32, 2, s, -2, 2), T(TB_F32, 2, s, -2, 2)};
        run_case("same shape", n, in2, DT, 0);
        tin in3[3] = {T(TB_BOOL, 2, s, 0, 0.5), T(TB_I64, 2, s, -9, 9), T(TB_I64, 1, s + 1, -9, 9)};
        if (di == 0) run_case("i64", n, in3, DT, 0);
    }
}

static void norm_cases(void) {
    struct { int r; int64_t d[4]; int axis; const char *w; } sm[] = {
        {2, {7, 33}, 1, "(7, 33) last"},        {2, {3, 1500}, 1, "(3, 1500) last"},
        {2, {2, 3000}, 1, "(2, 3000) last, long"}, {3, {4, 9, 5}, 1, "(4, 9, 5) axis 1"},
        {3, {4, 9, 5}, 0, "(4, 9, 5) axis 0"},  {4, {1, 12, 128, 128}, 3, "(1, 12, 128, 128) last"},
    };
    FOR_DT for (size_t k = 0; k < sizeof sm / sizeof sm[0]; k++) {
        tb_node n = N(TB_OP_SOFTMAX, 1, 1);
        n.i[0] = sm[k].axis;
        tin in[1] = {T(TB_F32, sm[k].r, sm[k].d, -8, 8)};
        run_case(sm[k].w, n, in, DT, BND(2e-6, 1e-3));
    }
    FOR_DT {
        static const int64_t x1[] = {6, 77}, p1[] = {77}, x2[] = {2, 3, 16}, p2[] = {3, 16}, x3[] = {1, 128, 768},
                             p3[] = {768}, p4[] = {1, 16}, one16[] = {1};
        tb_node n = N(TB_OP_LAYERNORM, 3, 1);
        n.i[0] = 1;
        n.f[0] = 1e-5f;
        tin in[3] = {T(TB_F32, 2, x1, -3, 5), T(TB_F32, 1, p1, 0.5, 1.5), T(TB_F32, 1, p1, -1, 1)};
        run_case("(6, 77) scale, bias", n, in, DT, BND(1e-5, 2e-3));
        n.n_in = 2;
        tin in2[2] = {T(TB_F32, 3, x2, -3, 5), T(TB_F32, 2, p2, 0.5, 1.5)};
        run_case("(2, 3, 16) axis 1, scale (3, 16)", n, in2, DT, BND(1e-5, 2e-3));
        tin in4[3] = {T(TB_F32, 3, x2, -3, 5), T(TB_F32, 2, p4, 0.5, 1.5), T(TB_F32, 1, one16, -1, 1)};
        n.n_in = 3;
        run_case("(2, 3, 16) axis 1, scale (1, 16)", n, in4, DT, BND(1e-5, 2e-3));
        n.i[0] = 2;
        tin in3[3] = {T(TB_F32, 3, x3, -3, 5), T(TB_F32, 1, p3, 0.5, 1.5), T(TB_F32, 1, p3, -1, 1)};
        run_case("(1, 128, 768) BERT", n, in3, DT, BND(1e-5, 2e-3));
    }
    FOR_DT {
        static const int64_t x[] = {2, 5, 7, 3}, c[] = {5};
        tb_node n = N(TB_OP_BATCHNORM, 5, 1);
        n.f[0] = 1e-5f;
        tin in[5] = {T(TB_F32, 4, x, -3, 3), T(TB_F32, 1, c, 0.5, 1.5), T(TB_F32, 1, c, -1, 1),
                     T(TB_F32, 1, c, -1, 1), T(TB_F32, 1, c, 0.5, 2)};
        run_case("(2, 5, 7, 3)", n, in, DT, BND(2e-6, 1e-3));
    }
    static const int64_t x[] = {4, 6, 5}, ax2[] = {2}, ax1[] = {1};
    static const int64_t axes02[] = {0, -1};
    tb_op_kind rops[] = {TB_OP_REDUCE_MEAN, TB_OP_REDUCE_SUM, TB_OP_REDUCE_MAX};
    for (int k = 0; k < 3; k++) FOR_DT {
        tb_node n = N(rops[k], 1, 1);
        tin in[2] = {T(TB_F32, 3, x, -3, 3), V(TB_I64, 1, ax2, axes02)};
        n.i[0] = 1;
        n.i[1] = 2; /* mask: axis 1 */
        run_case("axis 1 (attribute), keepdims", n, in, DT, BND(2e-6, 1e-3));
        n.i[0] = 0;
        n.i[1] = 0;
        run_case("all axes", n, in, DT, BND(2e-6, 1e-3));
        n.n_in = 2;
        run_case("axes input [0, -1]", n, in, DT, BND(2e-6, 1e-3));
        static const int64_t big[] = {3, 5000};
        tin in2[2] = {T(TB_F32, 2, big, -3, 3), V(TB_I64, 1, ax1, axes02 + 1)};
        run_case("(3, 5000) last", n, in2, DT, BND(2e-6, 1e-3));
    }
    {
        tb_node n = N(TB_OP_REDUCE_SUM, 1, 1);
        n.i[1] = 5;
        tin in[1] = {T(TB_I64, 3, x, -100, 100)};
        run_case("i64 axes 0, 2", n, in, TB_F32, 0);
        n.op = TB_OP_REDUCE_MAX;
        run_case("i64 max axes 0, 2", n, in, TB_F32, 0);
    }
}

static void shape_cases(void) {
    static const int64_t x24[] = {6, 4}, two[] = {2}, one[] = {1}, three[] = {3}, four[] = {4};
    static const int64_t shp[] = {4, 6}, ax0[] = {0}, x3[] = {3, 4, 5};
    tb_dtype dts[] = {TB_F32, TB_F16, TB_I64, TB_U8};
    for (int k = 0; k < 4; k++) {
        tb_dtype dt = dts[k];
        tb_dtype cdt = dt == TB_F16 ? TB_F16 : TB_F32; /* f16 data: an f16 case */
        double lo = dt == TB_U8 ? 0 : -100, hi = 100;
        tb_node n = N(TB_OP_RESHAPE, 2, 1);
        tin in[2] = {T(dt, 2, x24, lo, hi), V(TB_I64, 1, two, shp)};
        run_case(tb_dtype_name(dt), n, in, cdt, 0);
        n = N(TB_OP_UNSQUEEZE, 2, 1);
        tin in2[2] = {T(dt, 2, x24, lo, hi), V(TB_I64, 1, one, ax0)};
        run_case(tb_dtype_name(dt), n, in2, cdt, 0);
        n = N(TB_OP_FLATTEN, 1, 1);
        n.i[0] = 2;
        tin in3[1] = {T(dt, 3, x3, lo, hi)};
        run_case(tb_dtype_name(dt), n, in3, cdt, 0);
        static const int64_t sq[] = {1, 6, 1, 4};
        n = N(TB_OP_SQUEEZE, 1, 1);
        tin in4[1] = {T(dt, 4, sq, lo, hi)};
        run_case(tb_dtype_name(dt), n, in4, cdt, 0);
        /* Transpose */
        struct { int r; int64_t d[4]; int perm[4]; const char *w; } tp[] = {
            {4, {2, 3, 4, 5}, {0, 2, 1, 3}, "(0, 2, 1, 3)"},
            {2, {37, 45}, {1, 0}, "(37, 45) -> (45, 37) tiled"},
            {3, {3, 4, 5}, {2, 0, 1}, "(2, 0, 1)"},
            {3, {64, 1, 96}, {2, 1, 0}, "(64, 1, 96) reversed"},
            {4, {1, 128, 12, 64}, {0, 2, 1, 3}, "BERT heads (0, 2, 1, 3)"},
            {4, {2, 12, 64, 33}, {0, 1, 3, 2}, "last two swapped"},
        };
        for (size_t t = 0; t < sizeof tp / sizeof tp[0]; t++) {
            n = N(TB_OP_TRANSPOSE, 1, 1);
            for (int j = 0; j < tp[t].r; j++) n.i[j] = tp[t].perm[j];
            tin ti[1] = {T(dt, tp[t].r, tp[t].d, lo, hi)};
            char w[80];
            snprintf(w, sizeof w, "%s %s", tb_dtype_name(dt), tp[t].w);
            run_case(w, n, ti, cdt, 0);
        }
        /* Slice */
        static const int64_t x79[] = {7, 9}, st[] = {1, -8}, en[] = {6, 9}, axs[] = {0, 1}, sp[] = {2, 3};
        static const int64_t st2[] = {-1}, en2[] = {-100}, ax2[] = {1}, sp2[] = {-2};
        n = N(TB_OP_SLICE, 5, 1);
        tin si[5] = {T(dt, 2, x79, lo, hi), V(TB_I64, 1, two, st), V(TB_I64, 1, two, en), V(TB_I64, 1, two, axs),
                     V(TB_I64, 1, two, sp)};
        run_case(tb_dtype_name(dt), n, si, cdt, 0);
        tin si2[5] = {T(dt, 2, x79, lo, hi), V(TB_I64, 1, one, st2), V(TB_I64, 1, one, en2), V(TB_I64, 1, one, ax2),
                      V(TB_I64, 1, one, sp2)};
        run_case("negative step", n, si2, cdt, 0);
        n.n_in = 3;
        run_case("starts, ends only", n, si, cdt, 0);
        /* Concat */
        static const int64_t c1[] = {2, 3, 4}, c2[] = {2, 5, 4}, c3[] = {2, 1, 4};
        n = N(TB_OP_CONCAT, 3, 1);
        n.i[0] = 1;
        tin ci[3] = {T(dt, 3, c1, lo, hi), T(dt, 3, c2, lo, hi), T(dt, 3, c3, lo, hi)};
        run_case("axis 1", n, ci, cdt, 0);
        n.i[0] = 2;
        static const int64_t c4[] = {2, 3, 7}, c5[] = {2, 3, 1};
        tin ci2[3] = {T(dt, 3, c1, lo, hi), T(dt, 3, c4, lo, hi), T(dt, 3, c5, lo, hi)};
        run_case("axis 2", n, ci2, cdt, 0);
        /* Split */
        static const int64_t x49[] = {4, 9}, parts[] = {2, 3, 4};
        n = N(TB_OP_SPLIT, 2, 3);
        n.i[0] = 1;
        n.i[1] = 3;
        tin spi[2] = {T(dt, 2, x49, lo, hi), V(TB_I64, 1, three, parts)};
        run_case("axis 1 [2, 3, 4]", n, spi, cdt, 0);
        n = N(TB_OP_SPLIT, 1, 2);
        n.i[0] = 0;
        n.i[1] = 2;
        run_case("axis 0 equal", n, spi, cdt, 0);
        /* Gather */
        static const int64_t x57[] = {5, 7}, idx1[] = {4, -1, 0}, i2[] = {2, 2};
        static const int32_t idx2[] = {6, 0, -7, 3};
        n = N(TB_OP_GATHER, 2, 1);
        tin gi[2] = {T(dt, 2, x57, lo, hi), V(TB_I64, 1, three, idx1)};
        run_case("axis 0 i64", n, gi, cdt, 0);
        n.i[0] = 1;
        tin gi2[2] = {T(dt, 2, x57, lo, hi), V(TB_I32, 2, i2, idx2)};
        run_case("axis 1 i32 (2, 2)", n, gi2, cdt, 0);
        /* Expand */
        static const int64_t x31[] = {3, 1}, es[] = {2, 3, 4};
        n = N(TB_OP_EXPAND, 2, 1);
        tin ei[2] = {T(dt, 2, x31, lo, hi), V(TB_I64, 1, three, es)};
        run_case("(3, 1) -> (2, 3, 4)", n, ei, cdt, 0);
        /* Trilu */
        static const int64_t x256[] = {2, 5, 6}, k1[] = {1}, km1[] = {-1};
        n = N(TB_OP_TRILU, 2, 1);
        n.i[0] = 1;
        tin tri[2] = {T(dt, 3, x256, lo, hi), V(TB_I64, 1, one, k1)};
        run_case("upper k 1", n, tri, cdt, 0);
        n.i[0] = 0;
        tin tri2[2] = {T(dt, 3, x256, lo, hi), V(TB_I64, 1, one, km1)};
        run_case("lower k -1", n, tri2, cdt, 0);
        (void)four;
    }
    {
        tb_node n = N(TB_OP_SHAPE, 1, 1);
        n.i[0] = 1;
        tin in[1] = {T(TB_F32, 3, x3, -1, 1)};
        run_case("start 1", n, in, TB_F32, 0);
    }
    {
        static const float fs[] = {1.0f}, fl[] = {10.0f}, fd[] = {0.7f};
        static const int64_t is[] = {10}, il[] = {-3}, id[] = {-3};
        tb_node n = N(TB_OP_RANGE, 3, 1);
        tin in[3] = {V(TB_F32, 0, one, fs), V(TB_F32, 0, one, fl), V(TB_F32, 0, one, fd)};
        run_case("f32 1 .. 10 by 0.7", n, in, TB_F32, 0);
        tin in2[3] = {V(TB_I64, 0, one, is), V(TB_I64, 0, one, il), V(TB_I64, 0, one, id)};
        run_case("i64 10 .. -3 by -3", n, in2, TB_F32, 0);
    }
    {
        static const int64_t s[] = {3, 4};
        static const float v[] = {2.5f};
        static const int64_t iv[] = {7};
        tb_node n = N(TB_OP_CONSTANT_OF_SHAPE, 2, 1);
        tin in[2] = {V(TB_I64, 1, two, s), V(TB_F32, 1, one, v)};
        run_case("f32 2.5", n, in, TB_F32, 0);
        tin in2[2] = {V(TB_I64, 1, two, s), V(TB_I64, 1, one, iv)};
        run_case("i64 7", n, in2, TB_F32, 0);
    }
}

static void pool_resize_cases(void) {
    static const int64_t x[] = {1, 2, 5, 7}, four[] = {4};
    static const float sc[] = {1, 1, 2, 1.5f};
    static const int64_t sz[] = {1, 2, 9, 4};
    FOR_DT {
        tb_node n = N(TB_OP_RESIZE, 2, 1);
        n.i[0] = TB_NN_RESIZE_NEAREST;
        n.i[1] = TB_NN_COORD_ASYMMETRIC;
        n.i[2] = TB_NN_NEAREST_FLOOR;
        tin in[2] = {T(TB_F32, 4, x, -3, 3), V(TB_F32, 1, four, sc)};
        run_case("nearest asymmetric floor x(2, 1.5)", n, in, DT, 0);
        n.i[1] = TB_NN_COORD_HALF_PIXEL;
        n.i[2] = TB_NN_NEAREST_ROUND_PREFER_FLOOR;
        run_case("nearest half_pixel", n, in, DT, 0);
        n.i[0] = TB_NN_RESIZE_LINEAR;
        tin in2[2] = {T(TB_F32, 4, x, -3, 3), V(TB_I64, 1, four, sz)};
        run_case("linear half_pixel sizes (9, 4)", n, in2, DT, BND(2e-6, 1e-3));
        n.i[1] = TB_NN_COORD_ALIGN_CORNERS;
        run_case("linear align_corners", n, in2, DT, BND(2e-6, 1e-3));
        n.i[0] = TB_NN_RESIZE_CUBIC;
        n.i[1] = TB_NN_COORD_HALF_PIXEL;
        n.f[0] = -0.75f;
        run_case("cubic half_pixel", n, in2, DT, BND(2e-6, 1e-3));
    }
    static const int64_t px[] = {2, 3, 11, 13}, p3[] = {2, 3, 17};
    FOR_DT for (int mx = 0; mx < 2; mx++) {
        tb_node n = N(mx ? TB_OP_MAXPOOL : TB_OP_AVGPOOL, 1, 1);
        n.i[0] = n.i[1] = 3;
        n.i[2] = n.i[3] = 2;
        n.i[4] = n.i[5] = n.i[6] = n.i[7] = 1;
        tin in[1] = {T(TB_F32, 4, px, -3, 3)};
        double b = mx ? 0 : BND(2e-6, 1e-3);
        run_case("3x3 s2 p1", n, in, DT, b);
        n.i[10] = 1; /* ceil */
        n.i[11] = 1; /* count_include_pad */
        run_case("3x3 s2 p1 ceil, include pad", n, in, DT, b);
        tb_node m = N(n.op, 1, 1);
        m.i[1] = 4;
        m.i[3] = 3;
        tin in3[1] = {T(TB_F32, 3, p3, -3, 3)};
        run_case("rank 3, k4 s3", m, in3, DT, b);
        m = N(n.op, 1, 1);
        m.i[0] = m.i[1] = 2;
        m.i[8] = m.i[9] = 2;
        m.i[12] = TB_NN_PAD_SAME_UPPER;
        run_case("2x2 dilation 2 same_upper", m, in, DT, b);
    }
    FOR_DT {
        static const int64_t g[] = {2, 5, 7, 9}, g2[] = {1, 512, 7, 7};
        tb_node n = N(TB_OP_GLOBAL_AVGPOOL, 1, 1);
        tin in[1] = {T(TB_F32, 4, g, -3, 3)};
        run_case("(2, 5, 7, 9)", n, in, DT, BND(2e-6, 1e-3));
        tin in2[1] = {T(TB_F32, 4, g2, -3, 3)};
        run_case("(1, 512, 7, 7) ResNet", n, in2, DT, BND(2e-6, 1e-3));
    }
}

/* Conv, on the backend B as it is (mode 0: cuDNN when it loads; with
 * TURBINE_TEST_CUDNN=1 forced and required), on one made with
 * TB_CUDA_CUDNN=0 (mode 1: every case on im2col), or on one that picks the
 * faster path per geometry (mode 2: either). */
static int need_cudnn;
static void conv_cases(int mode) {
    enum { A = TB_NN_HAS_BIAS, R = TB_NN_HAS_RESIDUAL, AR = TB_NN_ACT_AFTER_RESIDUAL };
    struct {
        int r; int64_t x[4], w[4]; int group, s, p, dil, act, flags; const char *what;
        int pads[4]; /* top, left, bottom, right when any is set (else p everywhere) */
        int no_cudnn; /* cuDNN's legacy API cannot run it (asymmetric pads) */
    } cv[] = {
        {4, {1, 3, 17, 19}, {8, 3, 3, 3}, 1, 2, 1, 1, TB_NN_ACT_RELU, A, "3x3 s2 p1 bias relu", {0}, 0},
        {4, {2, 16, 7, 9}, {12, 16, 1, 1}, 1, 1, 0, 1, TB_NN_ACT_RELU, A | R | AR, "1x1 bias relu(+res)", {0}, 0},
        {4, {1, 8, 10, 10}, {8, 1, 3, 3}, 8, 1, 1, 1, 0, A, "depthwise 3x3", {0}, 0},
        {4, {1, 8, 9, 9}, {6, 4, 3, 3}, 2, 1, 2, 2, TB_NN_ACT_CLIP, 0, "group 2 dil 2 clip", {0}, 0},
        {3, {2, 4, 20}, {5, 4, 3}, 1, 2, 0, 1, 0, A | R, "rank 3 s2 +res", {0}, 0},
        {3, {2, 8, 30}, {8, 8, 5}, 1, 1, 2, 1, TB_NN_ACT_RELU, A | R | AR, "rank 3 k5 p2 relu(+res)", {0}, 0},
        {4, {1, 16, 12, 12}, {32, 16, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A | R, "3x3 relu(conv+b) then +res", {0}, 0},
        {4, {1, 16, 12, 12}, {16, 16, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, 0, "3x3 no bias relu", {0}, 0},
        {4, {2, 16, 12, 12}, {24, 16, 3, 3}, 1, 1, 1, 1, 0, 0, "3x3 no bias no act (plain)", {0}, 0},
        {4, {1, 16, 12, 12}, {20, 16, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_SIGMOID, A, "3x3 bias sigmoid", {0}, 0},
        {4, {1, 16, 12, 12}, {16, 16, 3, 3}, 1, 1, 1, 1, 0, A | R | AR, "3x3 bias + res, no act", {0}, 0},
        {4, {1, 8, 15, 15}, {16, 2, 3, 3}, 4, 2, 2, 2, TB_NN_ACT_RELU, A, "group 4 s2 p2 dil 2 relu", {0}, 0},
        {4, {1, 8, 10, 11}, {8, 8, 3, 3}, 1, 2, 0, 1, TB_NN_ACT_RELU, A, "asymmetric pads (0,0,1,1)", {0, 0, 1, 1}, 1},
        {4, {1, 8, 10, 11}, {8, 8, 3, 2}, 1, 1, 0, 3, 0, A, "3x2 kernel pads (2,1,2,1) dil 3", {2, 1, 2, 1}, 0},
        /* ResNet-18 (224x224): every convolution shape, batch 1, and two at batch 8 */
        {4, {1, 3, 224, 224}, {64, 3, 7, 7}, 1, 2, 3, 1, TB_NN_ACT_RELU, A, "ResNet stem 7x7 s2", {0}, 0},
        {4, {1, 64, 56, 56}, {64, 64, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A, "ResNet l1 3x3 64 relu", {0}, 0},
        {4, {1, 64, 56, 56}, {64, 64, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A | R | AR, "ResNet 3x3 64 +res relu", {0}, 0},
        {4, {1, 64, 56, 56}, {128, 64, 3, 3}, 1, 2, 1, 1, TB_NN_ACT_RELU, A, "ResNet l2 3x3 s2 128 relu", {0}, 0},
        {4, {1, 128, 28, 28}, {128, 128, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A | R | AR, "ResNet l2 3x3 128 +res relu", {0}, 0},
        {4, {1, 64, 56, 56}, {128, 64, 1, 1}, 1, 2, 0, 1, 0, A, "ResNet l2 1x1 s2 downsample", {0}, 0},
        {4, {1, 128, 28, 28}, {256, 128, 3, 3}, 1, 2, 1, 1, TB_NN_ACT_RELU, A, "ResNet l3 3x3 s2 256 relu", {0}, 0},
        {4, {1, 256, 14, 14}, {256, 256, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A | R | AR, "ResNet l3 3x3 256 +res relu", {0}, 0},
        {4, {1, 128, 28, 28}, {256, 128, 1, 1}, 1, 2, 0, 1, 0, A, "1x1 s2 downsample", {0}, 0},
        {4, {1, 256, 14, 14}, {512, 256, 3, 3}, 1, 2, 1, 1, TB_NN_ACT_RELU, A, "ResNet l4 3x3 s2 512 relu", {0}, 0},
        {4, {1, 512, 7, 7}, {512, 512, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A | R | AR, "ResNet l4 3x3 512 +res relu", {0}, 0},
        {4, {1, 256, 14, 14}, {512, 256, 1, 1}, 1, 2, 0, 1, 0, A, "ResNet l4 1x1 s2 downsample", {0}, 0},
        {4, {8, 64, 56, 56}, {64, 64, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A | R | AR, "ResNet b8 3x3 64 +res relu", {0}, 0},
        {4, {8, 512, 7, 7}, {512, 512, 3, 3}, 1, 1, 1, 1, TB_NN_ACT_RELU, A | R | AR, "ResNet b8 3x3 512 +res relu", {0}, 0},
    };
    const char *env = getenv("TB_CUDA_CUDNN");
    printf("Conv on %s:\n", mode == 1 ? "im2col + cuBLAS (TB_CUDA_CUDNN=0)"
                             : mode == 2 ? "the faster of cuDNN and im2col per geometry (the default)"
                             : env && !strcmp(env, "1") ? "cuDNN wherever it can run (TB_CUDA_CUDNN=1)"
                                                        : "the default path");
    FOR_DT for (size_t k = 0; k < sizeof cv / sizeof cv[0]; k++) {
        tb_node n = N(TB_OP_CONV, 2, 1);
        n.i[0] = cv[k].group;
        n.i[1] = n.i[2] = cv[k].s;
        n.i[3] = n.i[4] = n.i[5] = n.i[6] = cv[k].p;
        if (cv[k].pads[0] || cv[k].pads[1] || cv[k].pads[2] || cv[k].pads[3])
            for (int q = 0; q < 4; q++) n.i[3 + q] = cv[k].pads[q];
        n.i[7] = n.i[8] = cv[k].dil;
        n.i[10] = cv[k].act;
        n.i[11] = cv[k].flags;
        n.f[0] = -0.5f;
        n.f[1] = 0.5f;
        int r = cv[k].r;
        tin in[4];
        in[0] = T(TB_F32, r, cv[k].x, -1, 1);
        in[1] = T(TB_F32, r, cv[k].w, -0.5, 0.5);
        int ni = 2;
        int64_t m = cv[k].w[0];
        if (cv[k].flags & TB_NN_HAS_BIAS) in[ni++] = T(TB_F32, 1, &m, -1, 1);
        if (cv[k].flags & TB_NN_HAS_RESIDUAL) {
            /* the output's shape, from the rule */
            tb_view rv[2] = {{TB_F32, r, {0}, NULL}, {TB_F32, r, {0}, NULL}};
            memcpy(rv[0].dims, cv[k].x, sizeof cv[k].x);
            memcpy(rv[1].dims, cv[k].w, sizeof cv[k].w);
            tb_op_shape sh;
            tb_node t = n;
            t.n_in = 2;
            t.i[11] = 0;
            if (tb_op_infer_views(&t, rv, 2, &sh) != TB_OK) continue;
            in[ni++] = T(TB_F32, r, sh.dims[0], -1, 1);
        }
        n.n_in = ni;
        want_path = !conv_paths ? 0 : mode == 1 || cv[k].no_cudnn ? 2 : mode == 0 && need_cudnn ? 1 : 0;
        run_case(cv[k].what, n, in, DT, BND(1e-5, 3e-3));
    }
    want_path = 0;
}

static void compute_cases(void) {
    /* Gemm */
    FOR_DT {
        static const int64_t a[] = {5, 7}, b[] = {7, 9}, c[] = {9}, at[] = {7, 5}, bt[] = {9, 7}, c51[] = {5, 1},
                             r59[] = {5, 9}, big_a[] = {128, 768}, big_b[] = {3072, 768}, big_c[] = {3072};
        tb_node n = N(TB_OP_GEMM, 3, 1);
        n.f[0] = 0.5f;
        n.f[1] = 2.0f;
        n.i[3] = TB_NN_HAS_BIAS;
        tin in[3] = {T(TB_F32, 2, a, -1, 1), T(TB_F32, 2, b, -1, 1), T(TB_F32, 1, c, -1, 1)};
        run_case("alpha 0.5 beta 2 c (N)", n, in, DT, BND(1e-5, 3e-3));
        n.i[0] = n.i[1] = 1;
        n.i[2] = TB_NN_ACT_GELU_ERF;
        tin in2[4] = {T(TB_F32, 2, at, -1, 1), T(TB_F32, 2, bt, -1, 1), T(TB_F32, 2, c51, -1, 1),
                      T(TB_F32, 2, r59, -1, 1)};
        run_case("transA transB c (M, 1) gelu", n, in2, DT, BND(1e-5, 3e-3));
        n.i[3] = TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL;
        n.n_in = 4;
        run_case("... + residual", n, in2, DT, BND(1e-5, 3e-3));
        n = N(TB_OP_GEMM, 2, 1);
        n.f[0] = 1.0f;
        run_case("no c", n, in, DT, BND(1e-5, 3e-3));
        n = N(TB_OP_GEMM, 3, 1);
        n.f[0] = n.f[1] = 1.0f;
        n.i[1] = 1;
        n.i[2] = TB_NN_ACT_GELU_TANH;
        n.i[3] = TB_NN_HAS_BIAS;
        tin in3[3] = {T(TB_F32, 2, big_a, -1, 1), T(TB_F32, 2, big_b, -0.1, 0.1), T(TB_F32, 1, big_c, -1, 1)};
        run_case("BERT FFN 128x768x3072 gelu", n, in3, DT, BND(1e-5, 3e-3));
    }
    /* MatMul */
    struct { int ra; int64_t a[4]; int rb; int64_t b[4]; int ta, tb, bias, act; const char *w; } mm[] = {
        {4, {2, 3, 17, 33}, 2, {33, 20}, 0, 0, 1, 0, "(2, 3, 17, 33) x (33, 20) + bias"},
        {4, {2, 1, 4, 8}, 4, {1, 3, 8, 5}, 0, 0, 0, 0, "batch broadcast (2,1) x (1,3)"},
        {3, {4, 6, 10}, 3, {4, 12, 10}, 0, 1, 0, TB_NN_ACT_RELU, "trans_b batched relu"},
        {3, {4, 10, 6}, 3, {4, 10, 12}, 1, 0, 1, 0, "trans_a batched + bias"},
        {1, {7}, 2, {7, 5}, 0, 0, 0, 0, "(7) x (7, 5)"},
        {2, {3, 7}, 1, {7}, 0, 0, 0, 0, "(3, 7) x (7)"},
        {4, {1, 12, 128, 64}, 4, {1, 12, 64, 128}, 0, 0, 0, 0, "attention scores"},
        {3, {1, 128, 768}, 2, {768, 768}, 0, 0, 1, 0, "BERT projection"},
        /* f16: cuBLASLt's tanh-form epilogue (nn_backend.c gelu_tanh_ok), within the f16 bound of the erf form */
        {3, {1, 128, 768}, 2, {768, 3072}, 0, 0, 1, TB_NN_ACT_GELU_ERF, "BERT FFN + bias, erf gelu"},
        {3, {2, 5, 9}, 3, {1, 9, 4}, 0, 0, 0, TB_NN_ACT_SIGMOID, "b batch 1 sigmoid"},
    };
    FOR_DT for (size_t k = 0; k < sizeof mm / sizeof mm[0]; k++) {
        tb_node n = N(TB_OP_NN_MATMUL, 2, 1);
        n.i[0] = mm[k].ta;
        n.i[1] = mm[k].tb;
        n.i[2] = mm[k].act;
        n.f[0] = k == 0 ? 0.25f : 0.0f;
        tin in[3] = {T(TB_F32, mm[k].ra, mm[k].a, -1, 1), T(TB_F32, mm[k].rb, mm[k].b, -1, 1)};
        if (mm[k].bias) {
            int64_t N_ = mm[k].rb > 1 ? mm[k].b[mm[k].rb - (mm[k].tb ? 2 : 1)] : 1;
            in[2] = T(TB_F32, 1, &N_, -1, 1);
            n.n_in = 3;
            n.i[3] = TB_NN_HAS_BIAS;
        }
        run_case(mm[k].w, n, in, DT, BND(1e-5, 3e-3));
    }
    /* sdpa */
    struct { int64_t B, H, S, T; int D, Dv, causal, kt, mask; int64_t mdims[4]; int mr; const char *w; } at[] = {
        {1, 2, 37, 45, 64, 64, 0, 0, 0, {0}, 0, "S 37 T 45 D 64"},
        {1, 2, 37, 37, 64, 64, 1, 0, 0, {0}, 0, "causal"},
        {1, 2, 37, 45, 64, 64, 0, 0, 1, {1, 1, 37, 45}, 4, "additive mask (1, 1, S, T)"},
        {2, 3, 20, 45, 32, 48, 0, 0, 2, {2, 1, 1, 45}, 4, "bool mask (B, 1, 1, T), Dv 48"},
        {1, 2, 130, 130, 128, 128, 1, 0, 0, {0}, 0, "D 128 causal S 130"},
        {1, 3, 33, 40, 64, 64, 0, 1, 0, {0}, 0, "k transposed"},
        {1, 12, 128, 128, 64, 64, 0, 0, 1, {1, 1, 1, 128}, 4, "BERT (1, 12, 128, 64) mask (1,1,1,T)"},
        {1, 2, 512, 512, 64, 64, 1, 0, 0, {0}, 0, "S 512 causal"},
        {1, 1, 8, 16, 20, 20, 0, 0, 1, {8, 16}, 2, "D 20 mask (S, T)"},
        /* f16 D 32 / 64 / 128: the tensor-core kernel (nn_mha.cu), BERT's k layout */
        {1, 12, 128, 128, 64, 64, 0, 1, 1, {1, 1, 1, 128}, 4, "BERT k transposed mask (1,1,1,T)"},
        {2, 4, 70, 77, 64, 64, 0, 1, 1, {2, 1, 1, 77}, 4, "B 2 k transposed T 77 mask (B,1,1,T)"},
        {2, 3, 100, 100, 32, 32, 1, 0, 2, {2, 1, 1, 100}, 4, "D 32 causal bool mask"},
        {8, 12, 128, 128, 64, 64, 0, 1, 1, {8, 1, 1, 128}, 4, "BERT batch 8"},
    };
    FOR_DT for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        tb_node n = N(TB_OP_SDPA, 3, 1);
        n.i[0] = at[k].causal;
        n.i[1] = at[k].kt;
        n.i[2] = at[k].mask;
        n.f[0] = k == 2 ? 0.1f : 0.0f;
        int64_t q[4] = {at[k].B, at[k].H, at[k].S, at[k].D}, kk[4] = {at[k].B, at[k].H, at[k].T, at[k].D},
                v[4] = {at[k].B, at[k].H, at[k].T, at[k].Dv};
        if (at[k].kt) { kk[2] = at[k].D; kk[3] = at[k].T; }
        tin in[4] = {T(TB_F32, 4, q, -1, 1), T(TB_F32, 4, kk, -1, 1), T(TB_F32, 4, v, -1, 1)};
        if (at[k].mask) {
            in[3] = T(at[k].mask == 1 ? TB_F32 : TB_BOOL, at[k].mr, at[k].mdims, at[k].mask == 1 ? -2 : 0,
                      at[k].mask == 1 ? 2 : 0.7);
            if (at[k].mask == 1) in[3].data = NULL;
            n.n_in = 4;
        }
        /* f16 cases: an additive mask in f16 too (the reference reads its
         * exact f32 values) */
        run_case(at[k].w, n, in, DT, BND(2e-5, 3e-3));
    }
    /* sdpa in the heads layout (i[3] heads: (B, S, H*D) operands, no head
     * Transposes), packed (i[4]: q | k | v column blocks of (B, S, 3*H*D)
     * inputs, a merged projection's output) or not */
    struct { int64_t B, H, S, T; int D, Dv, packed, mask; const char *w; } hl[] = {
        {1, 12, 128, 128, 64, 64, 1, 1, "heads packed BERT (1, 128, 2304) mask"},
        {2, 4, 70, 70, 64, 64, 1, 1, "heads packed B 2 S 70 mask (B,1,1,T)"},
        {2, 2, 33, 33, 20, 20, 1, 0, "heads packed D 20"},
        {2, 3, 33, 40, 32, 48, 0, 1, "heads T 40 Dv 48 mask (B,1,1,T)"},
        {1, 2, 50, 50, 64, 64, 0, 0, "heads D 64"},
    };
    /* (the CPU backend's sdpa kernel reads the (B, H, S, D) layout only: the
     * passes make this layout for cuda alone) */
    if (conv_paths) FOR_DT for (size_t k = 0; k < sizeof hl / sizeof hl[0]; k++) {
        tb_node n = N(TB_OP_SDPA, 3, 1);
        n.i[2] = hl[k].mask;
        n.i[3] = (int32_t)hl[k].H;
        n.i[4] = hl[k].packed;
        int64_t HD = hl[k].H * hl[k].D, W = hl[k].packed ? 3 * HD : HD;
        int64_t q[3] = {hl[k].B, hl[k].S, W}, kk[3] = {hl[k].B, hl[k].T, W},
                v[3] = {hl[k].B, hl[k].T, hl[k].packed ? W : hl[k].H * hl[k].Dv}, md[4] = {hl[k].B, 1, 1, hl[k].T};
        tin in[4] = {T(TB_F32, 3, q, -1, 1), T(TB_F32, 3, kk, -1, 1), T(TB_F32, 3, v, -1, 1)};
        if (hl[k].mask) {
            in[3] = T(TB_F32, 4, md, -2, 2);
            n.n_in = 4;
        }
        run_case(hl[k].w, n, in, DT, BND(2e-5, 3e-3));
    }
}

/* A small f16 convolutional graph (a ResNet stem and block) run as one
 * graph: on cuda the backend holds the activations between the
 * convolutions, pools and adds channels-last (nn_layout.c) and transposes
 * only at the graph's edges, so this checks that plan end to end (x
 * channels-last into a 1x1 conv whose output is a graph output, a residual
 * held channels-last, a binary Add tied to its inputs' layout, MaxPool and
 * GlobalAveragePool reading channels-last), eagerly, captured and replayed,
 * against the reference kernels chained in f32 on the f16 inputs. When
 * cuDNN ran the convolutions, their info lines must say that x / y were
 * held channels-last. Bound 1e-2 of the largest output: the device rounds
 * each intermediate to f16 (five roundings deep), the reference does not. */
static const char *test_dev = "cuda";
enum { G_X, G_W1, G_B1, G_A, G_P, G_W2, G_B2, G_C, G_W3, G_B3, G_D, G_E, G_W4, G_B4, G_F, G_G, G_NV };
static void layout_graph_case(void) {
    static const int64_t dims[G_NV][4] = {
        [G_X] = {2, 3, 12, 12}, [G_W1] = {16, 3, 3, 3}, [G_B1] = {16}, [G_A] = {2, 16, 12, 12},
        [G_P] = {2, 16, 6, 6}, [G_W2] = {16, 16, 3, 3}, [G_B2] = {16}, [G_C] = {2, 16, 6, 6},
        [G_W3] = {16, 16, 3, 3}, [G_B3] = {16}, [G_D] = {2, 16, 6, 6}, [G_E] = {2, 16, 6, 6},
        [G_W4] = {32, 16, 1, 1}, [G_B4] = {32}, [G_F] = {2, 32, 3, 3}, [G_G] = {2, 16, 1, 1},
    };
    static const int rank[G_NV] = {4, 4, 1, 4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 1, 4, 4};
    tb_node nodes[7];
    /* conv1 3x3 pad 1 + bias + relu; maxpool 3x3 s2 p1; conv2 + bias + relu;
     * conv3 + bias + residual (pool), relu after; add (conv3, conv2); conv4
     * 1x1 s2 + bias (graph output); global average pool (graph output) */
    nodes[0] = N(TB_OP_CONV, 3, 1);
    nodes[0].i[3] = nodes[0].i[4] = nodes[0].i[5] = nodes[0].i[6] = 1;
    nodes[0].i[10] = TB_NN_ACT_RELU;
    nodes[0].i[11] = TB_NN_HAS_BIAS;
    nodes[0].in[0] = G_X, nodes[0].in[1] = G_W1, nodes[0].in[2] = G_B1, nodes[0].out[0] = G_A;
    nodes[1] = N(TB_OP_MAXPOOL, 1, 1);
    nodes[1].i[0] = nodes[1].i[1] = 3;
    nodes[1].i[2] = nodes[1].i[3] = 2;
    nodes[1].i[4] = nodes[1].i[5] = nodes[1].i[6] = nodes[1].i[7] = 1;
    nodes[1].in[0] = G_A, nodes[1].out[0] = G_P;
    nodes[2] = nodes[0];
    nodes[2].in[0] = G_P, nodes[2].in[1] = G_W2, nodes[2].in[2] = G_B2, nodes[2].out[0] = G_C;
    nodes[3] = N(TB_OP_CONV, 4, 1);
    nodes[3].i[3] = nodes[3].i[4] = nodes[3].i[5] = nodes[3].i[6] = 1;
    nodes[3].i[10] = TB_NN_ACT_RELU;
    nodes[3].i[11] = TB_NN_HAS_BIAS | TB_NN_HAS_RESIDUAL | TB_NN_ACT_AFTER_RESIDUAL;
    nodes[3].in[0] = G_C, nodes[3].in[1] = G_W3, nodes[3].in[2] = G_B3, nodes[3].in[3] = G_P, nodes[3].out[0] = G_D;
    nodes[4] = N(TB_OP_NN_ADD, 2, 1);
    nodes[4].in[0] = G_D, nodes[4].in[1] = G_C, nodes[4].out[0] = G_E;
    nodes[5] = N(TB_OP_CONV, 3, 1);
    nodes[5].i[1] = nodes[5].i[2] = 2;
    nodes[5].i[11] = TB_NN_HAS_BIAS;
    nodes[5].in[0] = G_E, nodes[5].in[1] = G_W4, nodes[5].in[2] = G_B4, nodes[5].out[0] = G_F;
    nodes[6] = N(TB_OP_GLOBAL_AVGPOOL, 1, 1);
    nodes[6].in[0] = G_E, nodes[6].out[0] = G_G;
    const int n_nodes = 7;
    int is_in[G_NV] = {[G_X] = 1, [G_W1] = 2, [G_B1] = 2, [G_W2] = 2, [G_B2] = 2, [G_W3] = 2, [G_B3] = 2,
                       [G_W4] = 2, [G_B4] = 2};
    tb_view rv[G_NV], gv[G_NV];
    void *ref[G_NV] = {0}, *host[G_NV] = {0}, *dev[G_NV] = {0};
    tb_value vals[G_NV];
    memset(vals, 0, sizeof vals);
    memset(rv, 0, sizeof rv);
    memset(gv, 0, sizeof gv);
    for (int v = 0; v < G_NV; v++) {
        int64_t ne = nel(rank[v], dims[v]);
        ref[v] = calloc((size_t)ne, 4);
        host[v] = calloc((size_t)ne, 2);
        rv[v] = (tb_view){TB_F32, rank[v], {0}, ref[v]};
        gv[v] = (tb_view){TB_F16, rank[v], {0}, NULL};
        memcpy(rv[v].dims, dims[v], sizeof(int64_t) * (size_t)rank[v]);
        memcpy(gv[v].dims, dims[v], sizeof(int64_t) * (size_t)rank[v]);
        if (is_in[v]) {
            double sc = v == G_X ? 1.0 : rank[v] == 1 ? 0.2 : 0.3;
            for (int64_t i = 0; i < ne; i++) {
                put_d(TB_F16, host[v], i, sc * (2 * urand() - 1));
                ((float *)ref[v])[i] = (float)get_d(TB_F16, host[v], i);
            }
        }
        snprintf(vals[v].name, sizeof vals[v].name, "v%d", v);
        vals[v].kind = is_in[v] == 1 ? TB_VAL_INPUT : is_in[v] == 2 ? TB_VAL_WEIGHT : TB_VAL_ACT;
        vals[v].dtype = TB_F16;
        vals[v].rank = rank[v];
        memcpy(vals[v].dims, dims[v], sizeof(int64_t) * (size_t)rank[v]);
    }
    n_cases++;
    int ok = 1;
    char why[200] = "";
    for (int k = 0; k < n_nodes && ok; k++) {
        const tb_op_def *def = tb_op_get_def(nodes[k].op);
        tb_view in[4];
        for (int j = 0; j < nodes[k].n_in; j++) in[j] = rv[nodes[k].in[j]];
        if (!def || !def->ref || def->ref(&nodes[k], in, nodes[k].n_in, &rv[nodes[k].out[0]], 1) != TB_OK) {
            snprintf(why, sizeof why, "reference of node %d: %s", k, tb_last_error());
            ok = 0;
        }
    }
    tb_graph g;
    memset(&g, 0, sizeof g);
    g.values = vals;
    g.n_values = g.cap_values = G_NV;
    g.nodes = nodes;
    g.n_nodes = g.cap_nodes = n_nodes;
    g.output = -1;
    g.inputs[g.n_inputs++] = G_X;
    g.outputs[g.n_outputs++] = G_F;
    g.outputs[g.n_outputs++] = G_G;
    tb_backend *b = NULL, *keep = B;
    if (ok && tb_backend_create(test_dev, 1, 0, &b) != TB_OK) {
        snprintf(why, sizeof why, "backend: %s", tb_last_error());
        ok = 0;
    }
    B = b;
    void *bufs[G_NV];
    for (int v = 0; ok && v < G_NV; v++) {
        size_t bytes = (size_t)nel(rank[v], dims[v]) * 2;
        dev[v] = b->iface->alloc(b, bytes);
        bufs[v] = dev[v];
        if (is_in[v]) copy_to(dev[v], host[v], bytes);
    }
    for (int k = 0; ok && k < n_nodes; k++)
        if (!b->iface->supports_op(b, &g, &nodes[k])) {
            snprintf(why, sizeof why, "node %d not supported", k);
            ok = 0;
        }
    tb_step st;
    memset(&st, 0, sizeof st);
    st.views = gv;
    double err = 0;
    int held = 0, cudnn_lines = 0;
    for (int run = 0; run < 3 && ok; run++) {
        for (int o = 0; o < g.n_outputs; o++) {
            int v = g.outputs[o];
            size_t bytes = (size_t)nel(rank[v], dims[v]) * 2;
            memset(host[v], 0xff, bytes);
            copy_to(dev[v], host[v], bytes);
        }
        if (run == 0) log_capture_begin();
        tb_status s = b->iface->run_begin(b, &g, bufs, &st);
        for (int k = 0; s == TB_OK && k < n_nodes; k++) s = b->iface->run_node(b, &g, &nodes[k], bufs, &st);
        if (s == TB_OK) s = b->iface->run_end(b, &g, bufs, &st);
        if (run == 0 && cap_file) { /* the convolutions' paths */
            fflush(stderr);
            rewind(cap_file);
            char line[1024];
            while (fgets(line, sizeof line, cap_file)) {
                cudnn_lines += strstr(line, ": cudnn") != NULL;
                held += strstr(line, "held channels-last") != NULL && strstr(line, ": cudnn") != NULL;
            }
        }
        if (run == 0) log_capture_end();
        if (s != TB_OK) {
            snprintf(why, sizeof why, "run %d: %s", run, tb_last_error());
            ok = 0;
            break;
        }
        for (int o = 0; o < g.n_outputs && ok; o++) {
            int v = g.outputs[o];
            int64_t ne = nel(rank[v], dims[v]);
            copy_from(host[v], dev[v], (size_t)ne * 2);
            double mx = 0, d = 0;
            for (int64_t i = 0; i < ne; i++) {
                double r = ((float *)ref[v])[i], x = get_d(TB_F16, host[v], i), e = fabs(x - r);
                if (fabs(r) > mx) mx = fabs(r);
                if (e != e) e = INFINITY;
                if (e > d) d = e;
            }
            double er = d / (mx > 0 ? mx : 1);
            if (er > err) err = er;
        }
        if (!(err <= 1e-2)) {
            snprintf(why, sizeof why, "run %d (%s): error %.3g", run, run == 0 ? "eager" : run == 1 ? "captured" : "replayed",
                     err);
            ok = 0;
        }
    }
    /* every convolution here reads or writes a held activation (conv1 y, conv2 and conv3 both, conv4 x) */
    if (ok && held < cudnn_lines) {
        snprintf(why, sizeof why, "cuDNN ran %d convolutions, %d of them with activations held channels-last (want all)",
                 cudnn_lines, held);
        ok = 0;
    }
    printf("  %-18s %-3s %-44s %s err %.2e, %d/%d cudnn convolutions channels-last%s%s\n", "graph", "f16",
           "stem + block, channels-last between convs", ok ? "ok  " : "FAIL", err, held, cudnn_lines, ok ? "" : ": ",
           why);
    if (!ok) {
        n_fail++;
        tb_test_failures++;
    }
    for (int v = 0; v < G_NV; v++) {
        if (dev[v]) b->iface->free(b, dev[v]);
        free(ref[v]);
        free(host[v]);
    }
    if (b) tb_backend_free(b);
    B = keep;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* TURBINE_TEST_DEVICE=cpu runs the same cases on the CPU backend (a
     * check of the cases themselves on a machine without a GPU) */
    const char *want = getenv("TURBINE_TEST_DEVICE");
    int need = want && (!strncmp(want, "cuda", 4) || !strcmp(want, "cpu"));
    const char *dev = need ? want : "cuda";
    test_dev = dev;
    if (tb_backend_create(dev, 1, 0, &B) != TB_OK) {
        printf("%s: %s (%s)\n", dev, need ? "FAILED" : "not present, test_nn_cuda skipped", tb_last_error());
        CHECK_MSG(!need, "TURBINE_TEST_DEVICE=%s but the backend cannot be created", want);
        return tb_test_finish("test_nn_cuda");
    }
    if (!strcmp(dev, "cpu")) n_dts = 1;
    int on_cuda = strcmp(dev, "cpu") != 0;
    conv_paths = on_cuda;
    const char *nc = getenv("TURBINE_TEST_CUDNN");
    const char *off = getenv("TB_CUDA_CUDNN");
    need_cudnn = on_cuda && nc && !strcmp(nc, "1") && !(off && !strcmp(off, "0"));
    /* TURBINE_TEST_CUDNN=1: the first pass takes cuDNN wherever it can
     * (TB_CUDA_CUDNN=1: no timing against im2col) and must find it */
    if (need_cudnn && !off) setenv("TB_CUDA_CUDNN", "1", 1);
    double t0 = tb_now();
    unary_cases();
    binary_cases();
    norm_cases();
    shape_cases();
    pool_resize_cases();
    compute_cases();
    conv_cases(on_cuda && off && !strcmp(off, "0") ? 1 : 0);
    if (on_cuda) layout_graph_case();
    if (on_cuda && !(off && !strcmp(off, "0"))) {
        /* the same convolutions on a backend with cuDNN off (the im2col
         * path), then, after a forced first pass, on one that times both
         * paths per geometry and keeps the faster (the default) */
        tb_backend *b1 = B;
        for (int pass = 0; pass < (need_cudnn && !off ? 2 : 1); pass++) {
            tb_backend *b2 = NULL;
            if (pass == 0) setenv("TB_CUDA_CUDNN", "0", 1);
            else unsetenv("TB_CUDA_CUDNN");
            if (tb_backend_create(dev, 1, 0, &b2) == TB_OK) {
                B = b2;
                conv_cases(pass == 0 ? 1 : 2);
                tb_backend_free(b2);
            } else {
                printf("%s (pass %d): FAILED (%s)\n", dev, pass, tb_last_error());
                tb_test_failures++;
            }
        }
        if (off) setenv("TB_CUDA_CUDNN", off, 1);
        else unsetenv("TB_CUDA_CUDNN");
        B = b1;
    }
    printf("worst error per op (%s vs reference):\n", dev);
    for (int k = TB_OP_NN_FIRST; k < TB_OP_COUNT; k++) {
        if (ran[k]) printf("  %-20s %.2e%s\n", tb_op_name((tb_op_kind)k), worst[k], isinf(worst[k]) ? " FAIL" : "");
        else if (skipped_ref[k]) printf("  %-20s skipped (no reference kernel in this build)\n", tb_op_name((tb_op_kind)k));
        else printf("  %-20s no case\n", tb_op_name((tb_op_kind)k));
    }
    printf("%s: %d cases, %d failed, %.1f s\n", dev, n_cases, n_fail, tb_now() - t0);
    tb_backend_free(B);
    return tb_test_finish("test_nn_cuda");
}
