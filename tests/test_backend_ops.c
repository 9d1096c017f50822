/*
 * test_backend_ops.c — every op of the IR, for every weight dtype, on every
 * backend present, against the scalar reference kernels (tb_ref_*).
 *
 * Each case builds a graph of one node whose inputs are weights (uploaded by
 * the backend's own load_weights, so a GPU sees them in device memory), runs
 * it through the backend vtable (supports_op, load_weights, step_begin,
 * run_node, read_output) with a step's bindings (positions, sequences, block
 * tables, the KV cache of layer 0), reads the outputs back and compares them
 * with the reference computed here on the same inputs. The embedding case
 * reads its ids as the step's token input, as the engine does.
 *
 * Backends: "cpu" once per SIMD path this CPU runs (avx512, avx2, scalar:
 * forced one at a time), and "cuda" when TURBINE_TEST_DEVICE=cuda (then it
 * must work) or when the CUDA module loads and finds a GPU (else skipped).
 * A case whose op or dtype the backend does not support (supports_op, or
 * TB_ERR_UNSUPPORTED from run_node) is printed as skipped.
 * TURBINE_TEST_ONLY=attention runs the attention cases alone (every KV
 * dtype's shapes and the e4m3 qkv > attention chains), for checking the
 * GPU's decode attention variants (TB_CUDA_ATTN_MMA, TB_CUDA_ATTN_BLOCKS)
 * quickly; the other ops' coverage is not checked then.
 *
 * Error: err = max |out - ref| / max |ref| over the output (the relative
 * error against the output's scale). Every case prints its bound and its
 * measured error; a case fails when err > bound (a NaN fails). Bounds:
 *
 *   op           dtype       cpu     cuda    why
 *   embedding    f32/f16/bf16 0      0       a copy; conversions are exact
 *   rmsnorm      f32         1e-5    1e-5    f32 sums in another order
 *   add_rmsnorm  f32  r:     0       0       one f32 add per element
 *                     y:     1e-5    1e-5    as rmsnorm
 *   matmul       f32         1e-5    1e-5    f32 sums in another order (no TF32)
 *   matmul       f16         1e-5    2e-3    cuda: x is rounded to f16 for the
 *                                            tensor-core GEMV and cuBLAS (T > 2)
 *   matmul       bf16        1e-5    1.6e-2  cuda: x rounded to bf16 likewise
 *   rope         f32         2e-5    1e-4    sin/cos of angles up to ~250 rad
 *   attention    kv f32      5e-5    2e-4    rope, then softmax sums of up to
 *                                            ~250 terms in another order
 *   attention    kv f16      1e-4    4e-3    as f32, plus a rotated key that
 *                                            rounds to the other f16 neighbour;
 *                                            cuda: f16 q and P in flash prefill
 *   attention    kv bf16     1e-3    1e-2    as f16 with the bf16 ulp (8x);
 *                                            cuda: the attention kernel for all
 *                                            T (no GEMM or flash prefill)
 *   attention    kv int8/fp8 5e-5    5e-3    against the reference attending
 *                                            the rows the backend stored (their
 *                                            values stand in for the reference's
 *                                            k and v: it quantises them back to
 *                                            the same codes); cuda: q, the
 *                                            dequantised k, v and P in f16 in
 *                                            the flash prefill (4e-3 of an f16
 *                                            cache plus k and v rounded to f16)
 *   (kv cache written by attention: f32 2e-5 / 1e-4, f16 1e-3 / 1e-3, bf16
 *    8e-3 / 8e-3: rope error, plus one f16 or bf16 ulp; int8 / fp8: the
 *    values within one code step of the row's absmax (1/127, 32/448) plus
 *    the rope's bound (a matmul's 5e-3 on cuda after f16 / bf16 weights),
 *    at most 1e-3 (or 2) of the step's codes and scales other than the
 *    reference's (a rotated key rounding to the neighbouring code), and no
 *    byte outside the step's rows changed)
 *   silu_mul     f32         1e-5    1e-5    exp in another form
 *   add          f32         0       0       one f32 add per element
 *   gather_rows  f32         0       0       a copy
 *   chains       f32         3e-5    1e-4    matmul>silu_mul, silu_mul>matmul,
 *                f16         3e-5    5e-3    rmsnorm>matmul,
 *                bf16        3e-5    3e-2    matmul>add_rmsnorm>matmul,
 *                                            matmul>silu_mul>matmul: the
 *                                            GPU fuses them; x or the folded
 *                                            norm weight in the weight type
 *                e4m3, T>=9  3e-5    8e-2    x rounded to e4m3 (FP8 GEMM;
 *                                            TB_CUDA_FP8_GEMM sets the 9)
 *   matmul>attention: the attention bounds, at least 2e-3 with an f16 cache
 *    (a key one f16 ulp off), the chain bound for f16/bf16 weights on cuda,
 *    never below the bf16 cache's bounds
 *
 * The cuda column is derived from the arithmetic above (rounding of x to
 * the weight type, f16 q and P, __expf); docs/TESTING.md keeps the errors
 * measured.
 *
 * Shapes include dims that are no multiple of 8, 16 or 32, T = 1, 3, 8, 9,
 * 17 and 100 (CPU GEMM from 96 rows, CUDA GEMV up to 8, cuBLAS above),
 * head_dim 64 and 128 (and 32, 20, 6), grouped-query heads, several
 * sequences in one step, non-zero start positions over a cache already
 * holding earlier positions, blocks out of order in the block tables, and a
 * 40-token run of one sequence (the CUDA prefill attention path). Chains of
 * two or three nodes (the patterns the CUDA backend fuses) run at 1, 2, 8
 * and 17 tokens. KV caches in f32, f16, bf16, int8 and fp8 (e4m3); the
 * int8 / fp8 caches are blocks of core/kv_layout.h held in U8 weights.
 */
#include <math.h>
#include <pthread.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "core/comm.h"
#include "core/kv_layout.h"
#include "core/quant.h"
#include "ir/ops.h"
#include "opt/opt.h"
#include "tb_test.h"

#define TMAX 128         /* the `tokens` / `rows` profile maximum            */
#define MAX_SEQS 4
#define MAX_BLOCKS 16
#define BLOCK_SIZE 16
#define MAX_CTX (MAX_BLOCKS * BLOCK_SIZE)

/* ---------------------------------------------------------------- helpers */
static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float frand(void) { return tb_test_frand(&rng_state); }

static int irand(int n) { return (int)((frand() * 0.5f + 0.5f) * (float)n) % n; }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    TB_ASSERT(p);
    return p;
}

static float *frandn(size_t n, float scale) {
    float *v = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}

static void *dupmem(const void *p, size_t n) {
    void *q = xmalloc(n);
    memcpy(q, p, n);
    return q;
}

static const char *dt_name(tb_dtype t) {
    return t == TB_F32 ? "f32" : t == TB_F16 ? "f16" : t == TB_BF16 ? "bf16" : t == TB_I4 ? "i4"
           : tb_kv_quantized(t) ? tb_kv_dtype_label(t) : "?";
}

/* n f32 values stored in dtype dt (malloc'd). */
static void *to_dtype(const float *x, size_t n, tb_dtype dt) {
    void *o = xmalloc(n * tb_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        if (dt == TB_F32) ((float *)o)[i] = x[i];
        else if (dt == TB_F16) ((uint16_t *)o)[i] = tb_f32_to_f16(x[i]);
        else ((uint16_t *)o)[i] = tb_f32_to_bf16(x[i]);
    }
    return o;
}

/* n values of dtype dt as f32 (into out). */
static void from_dtype(const void *p, size_t n, tb_dtype dt, float *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = dt == TB_F32 ? ((const float *)p)[i]
                 : dt == TB_F16 ? tb_f16_to_f32(((const uint16_t *)p)[i])
                                : tb_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* max |a - b| / max |b|; a NaN anywhere gives infinity. */
static double rel_err(const float *a, const float *b, size_t n) {
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e != e || a[i] != a[i]) return INFINITY;
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
        if (e > d) d = e;
    }
    return d / (m > 0 ? m : 1);
}

/* ---------------------------------------------------------------- backends */
typedef struct {
    char label[16];   /* printed: cpu/avx2, cuda, ...                     */
    const char *device;
    const char *path; /* the CPU SIMD path to force, or NULL              */
    int cuda;
} backend_desc;

static backend_desc backends[4];
static int n_backends;
static const backend_desc *cur_bk;
static int n_run, n_skip;
static double worst[TB_OP_COUNT];
static int covered[TB_OP_COUNT]; /* ops with a case run or skipped on this backend */

/* ---------------------------------------------------------------- one case */
/* The graph of one case, its step bindings and what to read back. */
typedef struct {
    tb_graph *g;
    int ids;                     /* the step's token input                  */
    int kc, vc;                  /* weights standing for layer 0's KV cache */
    tb_dtype kv_dtype;
    int T, R;
    int32_t tok[TMAX], pos[TMAX], seq[TMAX], rows[TMAX];
    int32_t bt[MAX_SEQS * MAX_BLOCKS];
    char desc[96];
    int tp_rank, tp_size;        /* collectives: this case's rank of tp_size */
    tb_comm *comm;
} tcase;

static void case_init(tcase *c, int T) {
    memset(c, 0, sizeof *c);
    c->g = tb_graph_new();
    TB_ASSERT(c->g);
    int tok = tb_graph_add_sym(c->g, "tokens", 1, 1, TMAX);
    tb_graph_add_sym(c->g, "rows", 1, 1, TMAX);
    int64_t d[1] = {TB_SYM(tok)};
    c->ids = tb_graph_add_value(c->g, "ids", TB_VAL_INPUT, TB_I32, 1, d);
    TB_ASSERT(c->ids >= 0 && T <= TMAX);
    c->kc = c->vc = -1;
    c->kv_dtype = TB_F32;
    c->T = T;
    c->R = 1; /* rows[0] = 0: the backends copy at least the rows they are given */
    /* one sequence from position 0, blocks in order */
    for (int t = 0; t < T; t++) c->pos[t] = t;
    for (int i = 0; i < MAX_SEQS * MAX_BLOCKS; i++) c->bt[i] = i;
}

/* A weight holding a copy of n elements of dtype dt at p. */
static int add_w(tcase *c, const char *name, tb_dtype dt, int rank, const int64_t *dims, const void *p) {
    size_t n = 1;
    for (int i = 0; i < rank; i++) n *= (size_t)dims[i];
    int v = tb_graph_add_weight(c->g, name, dt, rank, dims, dupmem(p, n * tb_dtype_size(dt)), 1);
    TB_ASSERT(v >= 0);
    return v;
}

static int add_node(tcase *c, tb_op_kind op, const int *in, int n_in, const int32_t *ia, const float *fa) {
    int k = tb_graph_add_node(c->g, op, in, n_in, "y", ia, fa);
    if (k < 0) fprintf(stderr, "adding %s: %s\n", tb_op_name(op), tb_last_error());
    TB_ASSERT(k >= 0);
    return k;
}

/* Output i of node k (a separate call: adding a node moves the node array,
 * so `g->nodes[add_node(...)]` would read the old one). */
static int node_out(const tcase *c, int k, int i) { return c->g->nodes[k].out[i]; }

/* Runs c's graph on the current backend and copies the n_read values
 * read_v[i] (read_n[i] elements each, raw bytes) into out[i]. Returns 1 when
 * it ran, 0 when the backend does not support it (printed), -1 on an error
 * (counted as a failed check). */
static int case_run(tcase *c, const int *read_v, const size_t *read_n, int n_read, void **out) {
    tb_graph *g = c->g;
    const backend_desc *bd = cur_bk;
    /* the largest value read (the first of equal ones) is the graph's
     * output: the GPU sizes its read-back buffer by it */
    size_t most = 0;
    for (int i = 0; i < n_read; i++) {
        size_t b = read_n[i] * tb_dtype_size(g->values[read_v[i]].dtype);
        if (b > most) { most = b; g->output = read_v[i]; }
    }
    /* a collective's ranks run on threads: the path is forced before they start */
    if (bd->path && !c->tp_size) TB_ASSERT(tb_cpu_kernel_force_path(bd->path) == 0);
    /* the GPU fuses what a `--device cuda` build marks (the cuda_fuse pass
     * stores its choices in the tactic words and folds norm weights) */
    if (bd->cuda) {
        tb_opt_options oo;
        tb_pass_report pr;
        memset(&oo, 0, sizeof oo);
        memset(&pr, 0, sizeof pr);
        snprintf(oo.device, sizeof oo.device, "cuda");
        TB_ASSERT(tb_opt_cuda_fuse(g, &oo, &pr) == TB_OK);
    }
    tb_backend *b = NULL;
    if (tb_backend_create(bd->device, 2, MAX_CTX, &b) != TB_OK) {
        CHECK_MSG(0, "%s: creating the backend: %s", bd->label, tb_last_error());
        return -1;
    }
    if (bd->path && !c->tp_size) CHECK_MSG(strcmp(tb_cpu_kernel_path(), bd->path) == 0, "runs %s, not %s", tb_cpu_kernel_path(),
                            bd->path);
    for (int k = 0; k < g->n_nodes; k++)
        if (!b->iface->supports_op(b, g, &g->nodes[k])) {
            printf("  %-10s %-13s %-4s %-44s skipped (not supported)\n", bd->label, tb_op_name(g->nodes[k].op),
                   dt_name(c->kv_dtype), c->desc);
            covered[g->nodes[k].op] = 1;
            tb_backend_free(b);
            n_skip++;
            return 0;
        }
    void **bufs = calloc((size_t)g->n_values, sizeof *bufs);
    TB_ASSERT(bufs);
    int rc = -1;
    tb_status s = b->iface->load_weights(b, g, bufs);
    for (int v = 0; s == TB_OK && v < g->n_values; v++) {
        const tb_value *val = &g->values[v];
        if (val->kind != TB_VAL_ACT) continue;
        size_t bytes = (size_t)tb_value_numel(g, val, NULL) * tb_dtype_size(val->dtype);
        bufs[v] = b->iface->alloc(b, bytes);
        if (!bufs[v]) s = TB_ERR_OOM;
        /* NaNs where a kernel fails to write (host memory only; on a GPU
         * each case's fresh random inputs keep a stale buffer from passing) */
        else if (!bd->cuda) memset(bufs[v], 0xff, bytes);
    }
    void *kp = c->kc >= 0 ? bufs[c->kc] : NULL, *vp = c->vc >= 0 ? bufs[c->vc] : NULL;
    tb_step st = {
        .n_tokens = c->T, .n_rows = c->R, .pos = c->pos, .seq = c->seq, .rows = c->rows,
        .block_tables = c->bt, .max_blocks = MAX_BLOCKS, .block_size = BLOCK_SIZE, .max_ctx = MAX_CTX,
        .k_cache = &kp, .v_cache = &vp, .kv_dtype = c->kv_dtype,
        .tp_rank = c->tp_rank, .tp_size = c->tp_size, .comm = c->comm,
    };
    if (s == TB_OK) s = b->iface->step_begin(b, g, bufs, c->ids, c->tok, &st);
    for (int k = 0; s == TB_OK && k < g->n_nodes; k++) s = b->iface->run_node(b, g, &g->nodes[k], bufs, &st);
    for (int i = 0; s == TB_OK && i < n_read; i++) {
        size_t bytes = read_n[i] * tb_dtype_size(g->values[read_v[i]].dtype);
        const float *p = NULL;
        s = b->iface->read_output(b, bufs[read_v[i]], bytes, &p);
        if (s == TB_OK) memcpy(out[i], p, bytes);
    }
    if (s == TB_OK) {
        rc = 1;
    } else if (s == TB_ERR_UNSUPPORTED) {
        printf("  %-10s %-13s %-4s %-44s skipped (%s)\n", bd->label, tb_op_name(g->nodes[0].op), dt_name(c->kv_dtype),
               c->desc, tb_last_error());
        for (int k = 0; k < g->n_nodes; k++) covered[g->nodes[k].op] = 1;
        n_skip++;
        rc = 0;
    } else {
        CHECK_MSG(0, "%s %s: %s", bd->label, c->desc, tb_last_error());
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == TB_VAL_ACT && bufs[v]) b->iface->free(b, bufs[v]);
    free(bufs);
    tb_backend_free(b);
    return rc;
}

/* Prints one comparison and checks it against its bound. */
static void report(const tcase *c, tb_op_kind op, tb_dtype dt, const char *what, double err, double bound) {
    int ok = err <= bound;
    char name[24];
    snprintf(name, sizeof name, "%s%s%s", tb_op_name(op), what ? ":" : "", what ? what : "");
    printf("  %-10s %-13s %-4s %-44s err %.2e bound %.1e %s\n", cur_bk->label, name, dt_name(dt), c->desc, err, bound,
           ok ? "ok" : "FAIL");
    CHECK_MSG(ok, "%s %s %s %s: error %.3e exceeds %.1e", cur_bk->label, name, dt_name(dt), c->desc, err, bound);
    if (err > worst[op]) worst[op] = err;
    covered[op] = 1;
    n_run++;
}

/* The bound of an op on the current backend (table above). */
static double bound_of(double cpu, double cuda) { return cur_bk->cuda ? cuda : cpu; }

/* The least step of e4m3 weights that the CUDA backend runs on the FP8
 * tensor cores: TB_CUDA_FP8_GEMM as the backend reads it (0: never), else
 * its default (TB_CUDA_DEFAULT_FP8_GEMM in cuda_backend.c). */
static int fp8_gemm_min(void) {
    const char *e = getenv("TB_CUDA_FP8_GEMM");
    int v = e && *e ? atoi(e) : 9;
    return v > 0 ? v : 1 << 30;
}

/* The least step of int8 weights that the CUDA backend runs on int8
 * activations (the int8 GEMM) in these cases: only with
 * TB_CUDA_I8_GEMM_ALL=1 (the cases carry no q8 tactic), from
 * TB_CUDA_I8_GEMM tokens (default 9, never below 9; 0: never). */
static int i8_gemm_min(void) {
    const char *a = getenv("TB_CUDA_I8_GEMM_ALL"), *e = getenv("TB_CUDA_I8_GEMM");
    if (!(a && !strcmp(a, "1"))) return 1 << 30;
    int v = e && *e ? atoi(e) : 9;
    return v <= 0 ? 1 << 30 : v < 9 ? 9 : v;
}

/* ---------------------------------------------------------------- ops */
/* lo > 0: the table is a vocabulary shard holding ids [lo, lo + V); the
 * ids are drawn from [0, 2 lo + V), so some fall on either side of it. */
static void op_embedding(tb_dtype wdt, int V, int D, int T, int lo) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "V %d D %d T %d%s", V, D, T, lo ? " shard" : "");
    float *tab = frandn((size_t)V * D, 2.0f);
    void *tw = to_dtype(tab, (size_t)V * D, wdt);
    for (int t = 0; t < T; t++) c.tok[t] = irand(V + 2 * lo);
    c.tok[T - 1] = lo + V - 1; /* the last row of the table */
    if (lo && T > 2) c.tok[0] = lo - 1, c.tok[1] = lo + V; /* just outside it */
    int64_t d[2] = {V, D};
    int in[2] = {c.ids, add_w(&c, "table", wdt, 2, d, tw)};
    int32_t ia[4] = {0};
    tb_attr_set_i(TB_OP_EMBEDDING, TB_EMB_VOCAB_OFFSET, ia, lo);
    int k = add_node(&c, TB_OP_EMBEDDING, in, 2, ia, NULL);
    float *y = xmalloc(sizeof(float) * (size_t)T * D), *ref = xmalloc(sizeof(float) * (size_t)T * D);
    int rv = c.g->nodes[k].out[0];
    size_t rn = (size_t)T * D;
    void *o[1] = {y};
    if (case_run(&c, &rv, &rn, 1, o) == 1) {
        tb_ref_embedding_range(c.tok, tw, wdt, ref, T, D, lo, V);
        report(&c, TB_OP_EMBEDDING, wdt, NULL, rel_err(y, ref, rn), 0);
    }
    free(tab); free(tw); free(y); free(ref);
    tb_graph_free(c.g);
}

/* ---------------------------------------------------------------- collectives
 * all_reduce and all_gather_cols over `ranks` ranks, each a case of its own
 * (its own backend) run on a thread of its own, the ranks joined by one
 * communicator; against the reference: the sum in rank order (exact) and the
 * columns side by side. */
typedef struct {
    tcase *c;
    int rv;
    size_t n;
    float *y;
    int rc;
} rank_job;

static void *rank_job_main(void *arg) {
    rank_job *j = arg;
    void *o[1] = {j->y};
    j->rc = case_run(j->c, &j->rv, &j->n, 1, o);
    return NULL;
}

static void op_collective(tb_op_kind op, int ranks, int T, int C) {
    enum { MAXR = 8 };
    tcase c[MAXR];
    rank_job job[MAXR];
    pthread_t th[MAXR];
    float *x[MAXR];
    tb_comm *comm = NULL;
    TB_ASSERT(ranks <= MAXR && tb_comm_create(ranks, &comm) == TB_OK);
    int W = op == TB_OP_ALL_GATHER_COLS ? C * ranks : C;
    size_t n = (size_t)T * (size_t)W;
    for (int r = 0; r < ranks; r++) {
        case_init(&c[r], T);
        snprintf(c[r].desc, sizeof c[r].desc, "ranks %d T %d C %d", ranks, T, C);
        c[r].tp_rank = r;
        c[r].tp_size = ranks;
        c[r].comm = comm;
        x[r] = frandn((size_t)T * C, 1.0f);
        int64_t d[2] = {T, C};
        int in[1] = {add_w(&c[r], "x", TB_F32, 2, d, x[r])};
        int32_t ia[4] = {0};
        if (op == TB_OP_ALL_GATHER_COLS) tb_attr_set_i(op, TB_GATHER_RANKS, ia, ranks);
        int k = add_node(&c[r], op, in, 1, ia, NULL);
        job[r] = (rank_job){&c[r], node_out(&c[r], k, 0), n, xmalloc(sizeof(float) * n), -1};
    }
    if (cur_bk->path) TB_ASSERT(tb_cpu_kernel_force_path(cur_bk->path) == 0);
    for (int r = 0; r < ranks; r++) TB_ASSERT(pthread_create(&th[r], NULL, rank_job_main, &job[r]) == 0);
    for (int r = 0; r < ranks; r++) pthread_join(th[r], NULL);
    float *ref = xmalloc(sizeof(float) * n);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < W; j++) {
            size_t i = (size_t)t * W + j;
            if (op == TB_OP_ALL_REDUCE) {
                float sum = x[0][i];
                for (int r = 1; r < ranks; r++) sum += x[r][i];
                ref[i] = sum;
            } else {
                ref[i] = x[j / C][(size_t)t * C + j % C];
            }
        }
    for (int r = 0; r < ranks; r++) {
        if (job[r].rc == 1) {
            char what[16];
            snprintf(what, sizeof what, "rank%d", r);
            report(&c[r], op, TB_F32, what, rel_err(job[r].y, ref, n), 0);
        }
        free(job[r].y);
        free(x[r]);
        tb_graph_free(c[r].g);
    }
    free(ref);
    tb_comm_free(comm);
}

static void op_rmsnorm(int fused, int T, int D) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d D %d", T, D);
    float *x = frandn((size_t)T * D, 3.0f), *dd = frandn((size_t)T * D, 1.0f), *w = frandn((size_t)D, 1.5f);
    int64_t xd[2] = {T, D}, wd[1] = {D};
    float eps = 1e-5f, fa[4] = {eps};
    size_t n = (size_t)T * D;
    float *y = xmalloc(n * 4), *r = xmalloc(n * 4), *yr = xmalloc(n * 4), *rr = xmalloc(n * 4);
    if (!fused) {
        int in[2] = {add_w(&c, "x", TB_F32, 2, xd, x), add_w(&c, "w", TB_F32, 1, wd, w)};
        int k = add_node(&c, TB_OP_RMSNORM, in, 2, NULL, fa);
        int rv = c.g->nodes[k].out[0];
        void *o[1] = {y};
        if (case_run(&c, &rv, &n, 1, o) == 1) {
            tb_ref_rmsnorm(x, w, yr, T, D, eps);
            report(&c, TB_OP_RMSNORM, TB_F32, NULL, rel_err(y, yr, n), bound_of(1e-5, 1e-5));
        }
    } else {
        int in[3] = {add_w(&c, "x", TB_F32, 2, xd, x), add_w(&c, "d", TB_F32, 2, xd, dd),
                     add_w(&c, "w", TB_F32, 1, wd, w)};
        int k = add_node(&c, TB_OP_ADD_RMSNORM, in, 3, NULL, fa);
        int rv[2] = {c.g->nodes[k].out[0], c.g->nodes[k].out[1]};
        size_t rn[2] = {n, n};
        void *o[2] = {r, y};
        if (case_run(&c, rv, rn, 2, o) == 1) {
            tb_ref_add_rmsnorm(x, dd, w, rr, yr, T, D, eps);
            report(&c, TB_OP_ADD_RMSNORM, TB_F32, "r", rel_err(r, rr, n), 0);
            report(&c, TB_OP_ADD_RMSNORM, TB_F32, "y", rel_err(y, yr, n), bound_of(1e-5, 1e-5));
        }
    }
    free(x); free(dd); free(w); free(y); free(r); free(yr); free(rr);
    tb_graph_free(c.g);
}

static void op_matmul(tb_dtype wdt, int T, int K, int N, int bias) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d K %d N %d%s", T, K, N, bias ? " +bias" : "");
    float *x = frandn((size_t)T * K, 1.0f), *w = frandn((size_t)N * K, 1.0f), *bv = frandn((size_t)N, 1.0f);
    void *wq = to_dtype(w, (size_t)N * K, wdt);
    int64_t xd[2] = {T, K}, wd[2] = {N, K}, bd[1] = {N};
    int in[3] = {add_w(&c, "x", TB_F32, 2, xd, x), add_w(&c, "w", wdt, 2, wd, wq), -1};
    if (bias) in[2] = add_w(&c, "b", TB_F32, 1, bd, bv);
    int k = add_node(&c, TB_OP_MATMUL, in, bias ? 3 : 2, NULL, NULL);
    size_t n = (size_t)T * N;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        tb_ref_matmul(x, wq, wdt, bias ? bv : NULL, yr, T, K, N);
        double cuda_b = wdt == TB_F32 ? 1e-5 : wdt == TB_F16 ? 2e-3 : 1.6e-2;
        report(&c, TB_OP_MATMUL, wdt, NULL, rel_err(y, yr, n), bound_of(1e-5, cuda_b));
    }
    free(x); free(w); free(bv); free(wq); free(y); free(yr);
    tb_graph_free(c.g);
}

/* Whether the CUDA backend runs a one-token int8 / int4 qmatmul with x
 * rounded to int8 per block of 32 (TB_CUDA_QGEMV_V=15, the Q8 GEMV): its
 * reference is then tb_ref_qmatmul_q8 (on the shapes of tbc_qgemv: K a
 * multiple of 64, int4 of 128). */
static int cuda_q8(tb_dtype dt, int T, int K) {
    const char *v = getenv("TB_CUDA_QGEMV_V");
    return cur_bk->cuda && T == 1 && (dt == TB_I8 ? K % 64 == 0 : dt == TB_I4 && K % 128 == 0) && v && atoi(v) == 15;
}

static void ref_qmm(const float *x, const tb_qweight *w, const float *bias, float *y, int T, int K, int N) {
    if (cuda_q8(w->dtype, T, K))
        tb_ref_qmatmul_q8(x, w, bias, y, T, K, N);
    else
        tb_ref_qmatmul(x, w, bias, y, T, K, N);
}

/* qmatmul over weights quantized by core/quant.h, against tb_ref_qmatmul
 * (the kernels' own tests cover the kernels; this is the backend's wiring:
 * the inputs the flags select and the group taken from the scales' shape). */
static void op_qmatmul(tb_dtype qdt, int T, int K, int N, int group, int bias, int asym) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "%s T %d K %d N %d g %d%s%s", tb_dtype_name(qdt), T, K, N, group,
             bias ? " +bias" : "", asym ? " +zeros" : "");
    int G = K / group;
    float *x = frandn((size_t)T * K, 1.0f), *w = frandn((size_t)N * K, 1.0f), *bv = frandn((size_t)N, 1.0f);
    float *sc = xmalloc(sizeof(float) * (size_t)N * G), *z = xmalloc(sizeof(float) * (size_t)N * G);
    size_t cb = (size_t)tb_quant_codes_bytes(qdt, N, K);
    uint8_t *codes = xmalloc(cb);
    TB_ASSERT(tb_quantize_rows(qdt, w, N, K, group, asym, codes, sc, asym ? z : NULL) == TB_OK);
    int64_t xd[2] = {T, K}, wd[2] = {N, K}, sd[2] = {N, G}, bd[1] = {N};
    int in[5], n_in = 0;
    in[n_in++] = add_w(&c, "x", TB_F32, 2, xd, x);
    in[n_in++] = tb_graph_add_weight(c.g, "codes", qdt, 2, wd, dupmem(codes, cb), 1);
    in[n_in++] = add_w(&c, "scales", TB_F32, 2, sd, sc);
    if (bias) in[n_in++] = add_w(&c, "b", TB_F32, 1, bd, bv);
    if (asym) in[n_in++] = add_w(&c, "zeros", TB_F32, 2, sd, z);
    int32_t ia[4] = {0};
    tb_attr_set_i(TB_OP_QMATMUL, TB_QMM_HAS_BIAS, ia, bias);
    tb_attr_set_i(TB_OP_QMATMUL, TB_QMM_HAS_ZEROS, ia, asym);
    int k = add_node(&c, TB_OP_QMATMUL, in, n_in, ia, NULL);
    size_t n = (size_t)T * N;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        tb_qweight qw = {.dtype = qdt, .codes = codes, .scales = sc, .zeros = asym ? z : NULL, .group = group};
        /* the backend's int8 GEMM takes K and N multiples of 16 (i8_gemm_ok) */
        const int i8g = qdt == TB_I8 && cur_bk->cuda && T >= i8_gemm_min() && K % 16 == 0 && N % 16 == 0;
        if (i8g) {
            /* the int8 GEMM's x: rint(x * (127 / absmax)) a token, times absmax / 127 */
            for (int t = 0; t < T; t++) {
                float *r = x + (size_t)t * K, am = 0.0f;
                for (int k = 0; k < K; k++) am = fmaxf(am, fabsf(r[k]));
                const float id = am > 0.0f ? 127.0f / am : 0.0f, d = am / 127.0f;
                for (int k = 0; k < K; k++) {
                    float q = rintf(r[k] * id);
                    r[k] = (q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q) * d;
                }
            }
        }
        ref_qmm(x, &qw, bias ? bv : NULL, yr, T, K, N);
        /* cuda: x rounded to f16 (and int4's code * scale) as for f16
         * weights; e4m3 on the FP8 GEMM to e4m3 (pattern_bound) */
        double b = qdt == TB_FP8_E4M3 && cur_bk->cuda && T >= fp8_gemm_min() ? bound_of(1e-5, 8e-2)
                   : i8g ? bound_of(1e-5, 1e-4) /* against the same rounded x */
                         : bound_of(1e-5, 3e-3);
        report(&c, TB_OP_QMATMUL, TB_F32, NULL, rel_err(y, yr, n), b);
    }
    free(x); free(w); free(bv); free(sc); free(z); free(codes); free(y); free(yr);
    tb_graph_free(c.g);
}

static float *inv_freq_of(int hd) {
    float *f = xmalloc(sizeof(float) * (size_t)(hd / 2));
    for (int i = 0; i < hd / 2; i++) f[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
    return f;
}

/* x (T, C) with `heads` heads of hd rotated from column 0 (C may be wider). */
static void op_rope(int T, int heads, int hd, int C, int inter, int start) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d heads %d hd %d C %d %s pos %d..", T, heads, hd, C,
             inter ? "interleaved" : "half", start);
    for (int t = 0; t < T; t++) c.pos[t] = start + t;
    float *x = frandn((size_t)T * C, 2.0f), *f = inv_freq_of(hd);
    int64_t xd[2] = {T, C}, pd[1] = {T}, fd[1] = {hd / 2};
    /* the positions input holds the step's positions: the CPU reads the
     * input, the GPU the step's (the runtime binds no other) */
    int in[3] = {add_w(&c, "x", TB_F32, 2, xd, x), add_w(&c, "pos", TB_I32, 1, pd, c.pos),
                 add_w(&c, "inv_freq", TB_F32, 1, fd, f)};
    int32_t ia[4] = {heads, hd, inter};
    int k = add_node(&c, TB_OP_ROPE, in, 3, ia, NULL);
    size_t n = (size_t)T * C;
    float *y = xmalloc(n * 4), *yr = dupmem(x, n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        tb_ref_rope(yr, C, c.pos, f, T, heads, hd, inter);
        report(&c, TB_OP_ROPE, TB_F32, NULL, rel_err(y, yr, n), bound_of(2e-5, 1e-4));
    }
    free(x); free(f); free(y); free(yr);
    tb_graph_free(c.g);
}

/* ---- int8 / fp8 KV caches: n_blocks blocks of core/kv_layout.h, (BLOCK_SIZE,
 * KV, hd) one-byte codes then (BLOCK_SIZE, KV) f32 scales. */
typedef struct {
    tb_dtype dt;
    int KV, hd;
    size_t block_bytes, codes_bytes;
} kvq_layout;

static kvq_layout kvq_of(tb_dtype dt, int KV, int hd) {
    kvq_layout l = {dt, KV, hd, tb_kv_block_bytes(dt, BLOCK_SIZE, KV, hd), tb_kv_codes_bytes(dt, BLOCK_SIZE, KV, hd)};
    return l;
}

/* The codes of (block b, row r, kv head h) and, through *scale, its scale. */
static uint8_t *kvq_row(const kvq_layout *l, uint8_t *cache, int b, int r, int h, float **scale) {
    uint8_t *blk = cache + (size_t)b * l->block_bytes;
    *scale = (float *)(blk + l->codes_bytes) + (size_t)r * l->KV + h;
    return blk + ((size_t)r * l->KV + h) * (size_t)l->hd;
}

/* x (n_blocks, BLOCK_SIZE, KV, hd) quantised row by row (malloc'd blocks). */
static uint8_t *kvq_from_f32(const kvq_layout *l, const float *x, int n_blocks) {
    uint8_t *c = xmalloc((size_t)n_blocks * l->block_bytes);
    memset(c, 0, (size_t)n_blocks * l->block_bytes); /* the padding */
    for (int b = 0; b < n_blocks; b++)
        for (int r = 0; r < BLOCK_SIZE; r++)
            for (int h = 0; h < l->KV; h++) {
                float *sc;
                uint8_t *codes = kvq_row(l, c, b, r, h, &sc);
                tb_ref_kv_quantize(x + (((size_t)b * BLOCK_SIZE + r) * l->KV + h) * l->hd, l->hd, l->dt, codes, sc);
            }
    return c;
}

/* The row's values: code * scale. */
static void kvq_row_f32(const kvq_layout *l, uint8_t *cache, int b, int r, int h, float *out) {
    float *sc;
    const uint8_t *codes = kvq_row(l, cache, b, r, h, &sc);
    for (int d = 0; d < l->hd; d++)
        out[d] = (l->dt == TB_I8 ? (float)(int8_t)codes[d] : tb_fp8_e4m3_to_f32(codes[d])) * *sc;
}

/* The whole cache's values (n_blocks, BLOCK_SIZE, KV, hd). */
static void kvq_to_f32(const kvq_layout *l, uint8_t *cache, int n_blocks, float *out) {
    for (int b = 0; b < n_blocks; b++)
        for (int r = 0; r < BLOCK_SIZE; r++)
            for (int h = 0; h < l->KV; h++)
                kvq_row_f32(l, cache, b, r, h, out + (((size_t)b * BLOCK_SIZE + r) * l->KV + h) * l->hd);
}

/* One run of tokens of a sequence in an attention step. */
typedef struct { int seq, start, n; } run_spec;

/* The checks of an f32 / f16 / bf16 cache case: the output against the
 * reference on the same inputs; the caches after the step against the
 * reference's writes. q_r: the reference's rotated qkv (T, (H + 2 KV) hd);
 * kq, vq: the caches before the step (the reference writes into them). */
static void check_plain(const tcase *c, int H, int KV, int hd, const float *q_r, void *kq, void *vq, const void *kg,
                        const void *vg, const float *y, int mm_K, tb_dtype mm_dt) {
    tb_dtype kvdt = c->kv_dtype;
    int T = c->T;
    size_t cn = (size_t)MAX_SEQS * MAX_BLOCKS * BLOCK_SIZE * KV * hd, on = (size_t)T * H * hd;
    float fa[1] = {1.0f / sqrtf((float)hd)}, *yr = xmalloc(on * 4), *scratch = xmalloc(sizeof(float) * MAX_CTX);
    {
        tb_attn_args a = {
            .T = T, .n_heads = H, .n_kv = KV, .hd = hd, .scale = fa[0], .pos = c->pos, .seq = c->seq,
            .block_tables = c->bt, .max_blocks = MAX_BLOCKS, .block_size = BLOCK_SIZE, .k_cache = kq,
            .v_cache = vq, .kv_dtype = kvdt,
        };
        tb_ref_attention(&a, q_r, yr, scratch);
        int f16 = kvdt == TB_F16, bf16 = kvdt == TB_BF16;
        double ab = bf16 ? bound_of(1e-3, 1e-2) : f16 ? bound_of(1e-4, 4e-3) : bound_of(5e-5, 2e-4);
        double cb = bf16 ? 8e-3 : f16 ? 1e-3 : bound_of(2e-5, 1e-4);
        /* after a matmul, the keys and values differ from the reference's
         * by its rounding: an f16 cache may hold the other neighbour (one
         * ulp, 4.9e-4); on the GPU x is rounded to the weight type too */
        if (mm_K && f16 && ab < 2e-3) ab = 2e-3;
        /* x rounded as the GPU rounds it (above): f16 and bf16 weights alike */
        if (mm_K && cur_bk->cuda && mm_dt != TB_F32) ab = cb = 5e-3;
        /* a bf16 cache: a key may hold the other bf16 neighbour (one ulp,
         * 2^-8 to 2^-7 of the value) whatever fed it */
        if (bf16 && cb < 8e-3) cb = 8e-3;
        if (bf16 && ab < bound_of(1e-3, 1e-2)) ab = bound_of(1e-3, 1e-2);
        report(c, TB_OP_ATTENTION, kvdt, NULL, rel_err(y, yr, on), ab);
        float *got = xmalloc(cn * 4), *want = xmalloc(cn * 4);
        from_dtype(kg, cn, kvdt, got);
        from_dtype(kq, cn, kvdt, want);
        report(c, TB_OP_ATTENTION, kvdt, "k", rel_err(got, want, cn), cb);
        from_dtype(vg, cn, kvdt, got);
        from_dtype(vq, cn, kvdt, want);
        report(c, TB_OP_ATTENTION, kvdt, "v", rel_err(got, want, cn), cb);
        free(got); free(want);
    }
    free(yr); free(scratch);
}

/* The (block, row) that token t of c writes. */
static void step_row(const tcase *c, int t, int *blk, int *row) {
    *blk = c->bt[(size_t)c->seq[t] * MAX_BLOCKS + c->pos[t] / BLOCK_SIZE];
    *row = c->pos[t] % BLOCK_SIZE;
}

/* The checks of an int8 / fp8 cache case (the header's table):
 *   attention   the output against the reference attending the rows the
 *               backend stored: their values (code * scale) stand in for
 *               the reference's rotated k and v, which it quantises back
 *               to the same codes, so a code rounded the other way in the
 *               write is the cache checks' finding, not this one's;
 *   k, v        the values of the whole cache after the step against the
 *               cache the reference writes: within one code step of the
 *               row's absmax (int8 1/127, e4m3 32/448) plus the error of
 *               what fed the write (the rope; a matmul's bound after one):
 *               a key the backend rotated in another order may round to
 *               the neighbouring code;
 *   k, v codes  (no matmul before) the share of the step's codes, and of
 *               its scales off by more than 1e-5, that differ from the
 *               reference's: at most 1e-3, or 2 of them;
 *   k, v rest   bytes outside the step's rows that changed: none.
 * q_r: the reference's rotated qkv (T, (H + 2 KV) hd); kq, vq: the caches
 * before the step; kg, vg: the backend's after it. */
static void check_quantized(const tcase *c, int H, int KV, int hd, const float *q_r, const void *kq, const void *vq,
                            uint8_t *kg, uint8_t *vg, const float *y, int mm_K, tb_dtype mm_dt) {
    tb_dtype dt = c->kv_dtype;
    int T = c->T, W = (H + 2 * KV) * hd, n_blocks = MAX_SEQS * MAX_BLOCKS;
    kvq_layout l = kvq_of(dt, KV, hd);
    size_t cbytes = (size_t)n_blocks * l.block_bytes, cn = (size_t)n_blocks * BLOCK_SIZE * KV * hd;
    size_t on = (size_t)T * H * hd;
    float *yr = xmalloc(on * 4), *scratch = xmalloc(sizeof(float) * MAX_CTX);
    uint8_t *kw = dupmem(kq, cbytes), *vw = dupmem(vq, cbytes);
    tb_attn_args a = {
        .T = T, .n_heads = H, .n_kv = KV, .hd = hd, .scale = 1.0f / sqrtf((float)hd), .pos = c->pos, .seq = c->seq,
        .block_tables = c->bt, .max_blocks = MAX_BLOCKS, .block_size = BLOCK_SIZE, .k_cache = kw, .v_cache = vw,
        .kv_dtype = dt,
    };
    /* attention over the backend's rows */
    float *q_g = dupmem(q_r, (size_t)T * W * 4);
    for (int t = 0; t < T; t++) {
        int b, r;
        step_row(c, t, &b, &r);
        for (int h = 0; h < KV; h++) {
            kvq_row_f32(&l, kg, b, r, h, q_g + (size_t)t * W + (size_t)(H + h) * hd);
            kvq_row_f32(&l, vg, b, r, h, q_g + (size_t)t * W + (size_t)(H + KV + h) * hd);
        }
    }
    tb_ref_attention(&a, q_g, yr, scratch);
    report(c, TB_OP_ATTENTION, dt, NULL, rel_err(y, yr, on), bound_of(5e-5, 5e-3));

    /* the caches the reference writes from its own rotation */
    memcpy(kw, kq, cbytes);
    memcpy(vw, vq, cbytes);
    tb_ref_attention(&a, q_r, yr, scratch);
    double step = dt == TB_I8 ? 1.0 / 127 : 32.0 / 448;
    double fed = mm_K && cur_bk->cuda && mm_dt != TB_F32 ? 5e-3 : bound_of(2e-5, 1e-4);
    uint8_t *mine = calloc(cbytes, 1); /* 1: a byte the step writes */
    TB_ASSERT(mine);
    for (int t = 0; t < T; t++) {
        int b, r;
        step_row(c, t, &b, &r);
        for (int h = 0; h < KV; h++) {
            float *sc;
            uint8_t *codes = kvq_row(&l, kw, b, r, h, &sc);
            memset(mine + (codes - kw), 1, (size_t)hd);
            memset(mine + ((uint8_t *)sc - kw), 1, sizeof(float));
        }
    }
    float *gf = xmalloc(cn * 4), *wf = xmalloc(cn * 4);
    for (int kv = 0; kv < 2; kv++) {
        uint8_t *got = kv ? vg : kg, *want = kv ? vw : kw;
        kvq_to_f32(&l, got, n_blocks, gf);
        kvq_to_f32(&l, want, n_blocks, wf);
        report(c, TB_OP_ATTENTION, dt, kv ? "v" : "k", rel_err(gf, wf, cn), step * 1.001 + fed);
        size_t differ = 0, n = 0, rest = 0;
        for (int t = 0; t < T; t++) {
            int b, r;
            step_row(c, t, &b, &r);
            for (int h = 0; h < KV; h++) {
                float *sg, *sw;
                const uint8_t *cg = kvq_row(&l, got, b, r, h, &sg), *cw = kvq_row(&l, want, b, r, h, &sw);
                for (int d = 0; d < hd; d++) differ += cg[d] != cw[d];
                differ += fabsf(*sg - *sw) > 1e-5f * fabsf(*sw);
                n += (size_t)hd + 1;
            }
        }
        for (size_t i = 0; i < cbytes; i++) rest += !mine[i] && got[i] != want[i];
        if (!mm_K) {
            double share = (double)differ / (double)n, most = 2.0 / (double)n;
            report(c, TB_OP_ATTENTION, dt, kv ? "v codes" : "k codes", share, most > 1e-3 ? most : 1e-3);
        }
        report(c, TB_OP_ATTENTION, dt, kv ? "v rest" : "k rest", (double)rest, 0);
    }
    free(gf); free(wf); free(mine); free(q_g); free(kw); free(vw); free(yr); free(scratch);
}

/* A pattern's matmul weight: a float dtype (a matmul node) or codes of
 * core/quant.h (a qmatmul node; the GPU multiplies x by the norm weight in
 * the GEMV instead of folding it into the codes). */
typedef struct {
    tb_dtype dt;
    void *wq;                /* float dtypes: the weight in dt      */
    uint8_t *codes;          /* quantized: codes, scales, zeros     */
    float *sc, *z;
    int group;
    size_t cb;
} pat_w;

static void pat_w_make(pat_w *m, const float *w, int N, int K, tb_dtype dt, int group, int asym) {
    memset(m, 0, sizeof *m);
    m->dt = dt;
    if (dt != TB_I8 && dt != TB_I4 && dt != TB_FP8_E4M3) {
        m->wq = to_dtype(w, (size_t)N * K, dt);
        return;
    }
    m->group = dt == TB_I4 ? group : K;
    int G = K / m->group;
    m->cb = (size_t)tb_quant_codes_bytes(dt, N, K);
    m->codes = xmalloc(m->cb);
    m->sc = xmalloc(sizeof(float) * (size_t)N * G);
    m->z = asym ? xmalloc(sizeof(float) * (size_t)N * G) : NULL;
    TB_ASSERT(tb_quantize_rows(dt, w, N, K, m->group, asym, m->codes, m->sc, m->z) == TB_OK);
}

/* Adds the matmul (qmatmul) of x value xv by m (N, K); returns the node. */
static int pat_w_node(tcase *c, int xv, const char *name, const pat_w *m, int N, int K) {
    int64_t wd[2] = {N, K}, sd[2] = {N, m->codes ? K / m->group : 0};
    if (!m->codes) {
        int a[2] = {xv, add_w(c, name, m->dt, 2, wd, m->wq)};
        return add_node(c, TB_OP_MATMUL, a, 2, NULL, NULL);
    }
    char nm[32];
    int in[4], n_in = 0;
    in[n_in++] = xv;
    in[n_in++] = tb_graph_add_weight(c->g, name, m->dt, 2, wd, dupmem(m->codes, m->cb), 1);
    snprintf(nm, sizeof nm, "%s.scales", name);
    in[n_in++] = add_w(c, nm, TB_F32, 2, sd, m->sc);
    if (m->z) {
        snprintf(nm, sizeof nm, "%s.zeros", name);
        in[n_in++] = add_w(c, nm, TB_F32, 2, sd, m->z);
    }
    int32_t ia[4] = {0};
    tb_attr_set_i(TB_OP_QMATMUL, TB_QMM_HAS_ZEROS, ia, m->z != NULL);
    return add_node(c, TB_OP_QMATMUL, in, n_in, ia, NULL);
}

static void pat_w_ref(const pat_w *m, const float *x, float *y, int T, int K, int N) {
    if (!m->codes) {
        tb_ref_matmul(x, m->wq, m->dt, NULL, y, T, K, N);
        return;
    }
    tb_qweight qw = {.dtype = m->dt, .codes = m->codes, .scales = m->sc, .zeros = m->z, .group = m->group};
    ref_qmm(x, &qw, NULL, y, T, K, N);
}

static void pat_w_free(pat_w *m) {
    free(m->wq); free(m->codes); free(m->sc); free(m->z);
}

/* qkv is a weight, or with mm_K > 0 the output of a matmul x (T, mm_K) by
 * w ((H + 2 KV) hd, mm_K) of dtype mm_dt (the pattern the GPU fuses; e4m3:
 * a qmatmul, which the GPU runs on the FP8 GEMM from 16 tokens, the
 * attention's RoPE kernel applying its scales). */
static void attention_case(tb_dtype kvdt, int H, int KV, int hd, int inter, const run_spec *runs, int n_runs,
                           const char *label, int mm_K, tb_dtype mm_dt) {
    tcase c;
    int T = 0;
    for (int i = 0; i < n_runs; i++) T += runs[i].n;
    case_init(&c, T);
    c.kv_dtype = kvdt;
    if (mm_K)
        snprintf(c.desc, sizeof c.desc, "%s K %d > H %d KV %d hd %d %s %s", dt_name(mm_dt), mm_K, H, KV, hd,
                 inter ? "il" : "hf", label);
    else
        snprintf(c.desc, sizeof c.desc, "H %d KV %d hd %d %s %s", H, KV, hd, inter ? "il" : "hf", label);
    for (int i = 0, t = 0; i < n_runs; i++)
        for (int j = 0; j < runs[i].n; j++, t++) {
            c.seq[t] = runs[i].seq;
            c.pos[t] = runs[i].start + j;
            TB_ASSERT(c.pos[t] < MAX_CTX && c.seq[t] < MAX_SEQS);
        }
    /* every sequence's blocks out of order: a shuffled pool */
    int n_blocks = MAX_SEQS * MAX_BLOCKS;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = irand(i + 1), tmp = c.bt[i];
        c.bt[i] = c.bt[j];
        c.bt[j] = tmp;
    }
    int W = (H + 2 * KV) * hd, quant = tb_kv_quantized(kvdt);
    size_t cn = (size_t)n_blocks * BLOCK_SIZE * KV * hd;
    /* q and k scaled so that the softmax is not flat */
    float *qkv = frandn((size_t)T * W, 2.0f), *f = inv_freq_of(hd);
    float *k0 = frandn(cn, 2.0f), *v0 = frandn(cn, 1.0f); /* earlier positions */
    /* int8 / fp8: blocks of codes and scales, as bytes (a U8 weight) */
    kvq_layout ql = kvq_of(kvdt, KV, hd);
    size_t cbytes = quant ? (size_t)n_blocks * ql.block_bytes : cn * tb_dtype_size(kvdt);
    void *kq = quant ? (void *)kvq_from_f32(&ql, k0, n_blocks) : to_dtype(k0, cn, kvdt);
    void *vq = quant ? (void *)kvq_from_f32(&ql, v0, n_blocks) : to_dtype(v0, cn, kvdt);
    int64_t qd[2] = {T, W}, fd[1] = {hd / 2}, cd[4] = {n_blocks, BLOCK_SIZE, KV, hd};
    int64_t qcd[2] = {n_blocks, (int64_t)ql.block_bytes};
    float *mx = NULL, *mw = NULL;
    void *mwq = NULL;
    const int mq = mm_dt == TB_FP8_E4M3;
    pat_w pm;
    memset(&pm, 0, sizeof pm);
    int in[2] = {-1, add_w(&c, "inv_freq", TB_F32, 1, fd, f)};
    if (mm_K) {
        mx = frandn((size_t)T * mm_K, 1.0f);
        mw = frandn((size_t)W * mm_K, 2.0f / sqrtf((float)mm_K));
        int64_t xd[2] = {T, mm_K}, wd[2] = {W, mm_K};
        int xv = add_w(&c, "x", TB_F32, 2, xd, mx);
        if (mq) {
            pat_w_make(&pm, mw, W, mm_K, mm_dt, 0, 0);
            in[0] = node_out(&c, pat_w_node(&c, xv, "w_qkv", &pm, W, mm_K), 0);
        } else {
            mwq = to_dtype(mw, (size_t)W * mm_K, mm_dt);
            int mi[2] = {xv, add_w(&c, "w_qkv", mm_dt, 2, wd, mwq)};
            in[0] = node_out(&c, add_node(&c, TB_OP_MATMUL, mi, 2, NULL, NULL), 0);
        }
    } else {
        in[0] = add_w(&c, "qkv", TB_F32, 2, qd, qkv);
    }
    c.kc = quant ? add_w(&c, "k_cache", TB_U8, 2, qcd, kq) : add_w(&c, "k_cache", kvdt, 4, cd, kq);
    c.vc = quant ? add_w(&c, "v_cache", TB_U8, 2, qcd, vq) : add_w(&c, "v_cache", kvdt, 4, cd, vq);
    int32_t ia[4] = {0, H, KV, hd | inter << 16};
    float fa[4] = {1.0f / sqrtf((float)hd)};
    int k = add_node(&c, TB_OP_ATTENTION, in, 2, ia, fa);
    size_t on = (size_t)T * H * hd;
    float *y = xmalloc(on * 4);
    void *kg = xmalloc(cbytes), *vg = xmalloc(cbytes);
    int rv[3] = {c.g->nodes[k].out[0], c.kc, c.vc};
    size_t rn[3] = {on, quant ? cbytes : cn, quant ? cbytes : cn};
    void *o[3] = {y, kg, vg};
    if (case_run(&c, rv, rn, 3, o) == 1) {
        float *q_r = dupmem(qkv, (size_t)T * W * 4);
        if (mm_K) {
            /* the GPU's tensor-core GEMV and cuBLAS (T > 2) read x rounded to
             * the weight type: the reference does the same, so the bound
             * measures the kernels and not how sharply a random softmax
             * amplifies that rounding (one draw of inputs moved the error
             * 100-fold before) */
            float *xr = mx;
            if (mq && cur_bk->cuda && T >= fp8_gemm_min()) {
                /* the FP8 GEMM's x: e4m3 codes with one scale a token */
                uint8_t *xc = xmalloc((size_t)T * mm_K);
                float *xs = xmalloc(sizeof(float) * (size_t)T);
                xr = xmalloc((size_t)T * mm_K * 4);
                TB_ASSERT(tb_quantize_rows(TB_FP8_E4M3, mx, T, mm_K, mm_K, 0, xc, xs, NULL) == TB_OK);
                tb_dequantize_rows(TB_FP8_E4M3, xc, xs, NULL, T, mm_K, mm_K, xr);
                free(xc);
                free(xs);
            } else if (!mq && cur_bk->cuda && mm_dt != TB_F32 && T > 2) {
                void *xq = to_dtype(mx, (size_t)T * mm_K, mm_dt);
                xr = xmalloc((size_t)T * mm_K * 4);
                from_dtype(xq, (size_t)T * mm_K, mm_dt, xr);
                free(xq);
            }
            if (mq) pat_w_ref(&pm, xr, q_r, T, mm_K, W);
            else tb_ref_matmul(xr, mwq, mm_dt, NULL, q_r, T, mm_K, W);
            if (xr != mx) free(xr);
        }
        tb_ref_rope(q_r, W, c.pos, f, T, H + KV, hd, inter);
        if (quant) check_quantized(&c, H, KV, hd, q_r, kq, vq, kg, vg, y, mm_K, mm_dt);
        else check_plain(&c, H, KV, hd, q_r, kq, vq, kg, vg, y, mm_K, mm_dt);
        free(q_r);
    }
    free(qkv); free(f); free(k0); free(v0); free(kq); free(vq); free(y); free(kg); free(vg);
    free(mx); free(mw); free(mwq);
    pat_w_free(&pm);
    tb_graph_free(c.g);
}

static void op_attention(tb_dtype kvdt, int H, int KV, int hd, int inter, const run_spec *runs, int n_runs,
                         const char *label) {
    attention_case(kvdt, H, KV, hd, inter, runs, n_runs, label, 0, TB_F32);
}

static void op_silu_mul(int T, int F) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d F %d", T, F);
    float *gu = frandn((size_t)T * 2 * F, 6.0f);
    int64_t d[2] = {T, 2 * F};
    int in[1] = {add_w(&c, "gu", TB_F32, 2, d, gu)};
    int k = add_node(&c, TB_OP_SILU_MUL, in, 1, NULL, NULL);
    size_t n = (size_t)T * F;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        tb_ref_silu_mul(gu, yr, T, F);
        report(&c, TB_OP_SILU_MUL, TB_F32, NULL, rel_err(y, yr, n), bound_of(1e-5, 1e-5));
    }
    free(gu); free(y); free(yr);
    tb_graph_free(c.g);
}

static void op_add(int T, int D) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d D %d", T, D);
    float *a = frandn((size_t)T * D, 3.0f), *bb = frandn((size_t)T * D, 3.0f);
    int64_t d[2] = {T, D};
    int in[2] = {add_w(&c, "a", TB_F32, 2, d, a), add_w(&c, "b", TB_F32, 2, d, bb)};
    int k = add_node(&c, TB_OP_ADD, in, 2, NULL, NULL);
    size_t n = (size_t)T * D;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        tb_ref_add(a, bb, yr, n);
        report(&c, TB_OP_ADD, TB_F32, NULL, rel_err(y, yr, n), 0);
    }
    free(a); free(bb); free(y); free(yr);
    tb_graph_free(c.g);
}

/* The Llama builder's plain ops (fused away by the passes before a backend
 * runs them): concat_cols of n inputs, silu, emul. */
static void op_concat_cols(int T, int n_in) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d inputs %d", T, n_in);
    float *x[TB_MAX_INPUTS];
    const float *xc[TB_MAX_INPUTS];
    int in[TB_MAX_INPUTS], cols[TB_MAX_INPUTS], C = 0;
    for (int i = 0; i < n_in; i++) {
        cols[i] = 1 + irand(70);
        C += cols[i];
        x[i] = frandn((size_t)T * cols[i], 3.0f);
        xc[i] = x[i];
        int64_t d[2] = {T, cols[i]};
        char nm[16];
        snprintf(nm, sizeof nm, "x%d", i);
        in[i] = add_w(&c, nm, TB_F32, 2, d, x[i]);
    }
    int k = add_node(&c, TB_OP_CONCAT_COLS, in, n_in, NULL, NULL);
    size_t n = (size_t)T * C;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        tb_ref_concat_cols(xc, cols, n_in, yr, T);
        report(&c, TB_OP_CONCAT_COLS, TB_F32, NULL, rel_err(y, yr, n), 0);
    }
    for (int i = 0; i < n_in; i++) free(x[i]);
    free(y); free(yr);
    tb_graph_free(c.g);
}

static void op_silu_emul(tb_op_kind op, int T, int D) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d D %d", T, D);
    float *a = frandn((size_t)T * D, 6.0f), *bb = frandn((size_t)T * D, 3.0f);
    int64_t d[2] = {T, D};
    int in[2] = {add_w(&c, "a", TB_F32, 2, d, a), add_w(&c, "b", TB_F32, 2, d, bb)};
    int k = add_node(&c, op, in, op == TB_OP_SILU ? 1 : 2, NULL, NULL);
    size_t n = (size_t)T * D;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        if (op == TB_OP_SILU) tb_ref_silu(a, yr, n);
        else tb_ref_mul(a, bb, yr, n);
        report(&c, op, TB_F32, NULL, rel_err(y, yr, n), 0);
    }
    free(a); free(bb); free(y); free(yr);
    tb_graph_free(c.g);
}

static void op_gather_rows(int T, int D, int R) {
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "T %d D %d rows %d", T, D, R);
    c.R = R;
    for (int r = 0; r < R; r++) c.rows[r] = r == R - 1 ? T - 1 : irand(T);
    float *x = frandn((size_t)T * D, 3.0f);
    int64_t d[2] = {T, D};
    int in[1] = {add_w(&c, "x", TB_F32, 2, d, x)};
    int k = add_node(&c, TB_OP_GATHER_ROWS, in, 1, NULL, NULL);
    size_t n = (size_t)R * D;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4);
    int rv = c.g->nodes[k].out[0];
    void *o[1] = {y};
    if (case_run(&c, &rv, &n, 1, o) == 1) {
        /* the reference: the rows themselves (there is no kernel to mirror) */
        for (int r = 0; r < R; r++) memcpy(yr + (size_t)r * D, x + (size_t)c.rows[r] * D, sizeof(float) * (size_t)D);
        report(&c, TB_OP_GATHER_ROWS, TB_F32, NULL, rel_err(y, yr, n), 0);
    }
    free(x); free(y); free(yr);
    tb_graph_free(c.g);
}

/* ---------------------------------------------------------------- patterns */
/* Chains of nodes that a backend may run as one (the CUDA backend fuses
 * them on its GEMV path, T <= 8, and on cuBLAS steps writes the next
 * matmul's converted input from the producer, T > 8): each against the
 * chain of references. Bounds: cpu 3e-5 (f32 ops in a row); cuda f32 1e-4,
 * f16 5e-3, bf16 3e-2 (x, or the RMSNorm weight folded into the matmul's,
 * rounded to the weight type). */
typedef enum { PAT_MM_SILU, PAT_SILU_MM, PAT_NORM_MM, PAT_MM_ADDNORM_MM, PAT_MM_SILU_MM } pat_kind;

static double pattern_bound(tb_dtype wdt, int T) {
    /* quantized weights on the GPU: x (times the norm weight) rounded to
     * f16, int4's code * scale rounded to f16: the f16 bound; e4m3 weights
     * in steps of >= fp8_gemm_min() tokens run on the FP8 tensor cores
     * with x rounded to e4m3 (3 mantissa bits: up to 1/16 of an element) */
    if (wdt == TB_FP8_E4M3 && cur_bk->cuda && T >= fp8_gemm_min()) return bound_of(3e-5, 8e-2);
    /* int8 on int8 activations (7 bits a token, TB_CUDA_I8_GEMM_ALL) */
    if (wdt == TB_I8 && cur_bk->cuda && T >= i8_gemm_min()) return bound_of(3e-5, 3e-2);
    return bound_of(3e-5, wdt == TB_F32 ? 1e-4 : wdt == TB_BF16 ? 3e-2 : 5e-3);
}

/* x (T, K); the first matmul's weight (N1, K) where there is one; the last
 * output (T, N). asym 1: int4 with zero points; 2 ("flat"): x all 1 and the
 * first weight constant, so every e4m3 code of both is 448 and the first
 * product of codes is its largest, K 448^2 (the GPU's f16 product must
 * still hold it). */
static void pattern_q(pat_kind pk, tb_dtype wdt, int group, int asym, int T, int K, int N) {
    static const char *names[] = {"matmul>silu_mul", "silu_mul>matmul", "rmsnorm>matmul",
                                  "matmul>add_rmsnorm>matmul", "matmul>silu_mul>matmul"};
    tcase c;
    case_init(&c, T);
    snprintf(c.desc, sizeof c.desc, "%s T %d K %d N %d%s", names[pk], T, K, N,
             asym == 2 ? " +flat" : asym ? " +zeros" : "");
    float eps = 1e-5f, fa[4] = {eps};
    int xw = pk == PAT_SILU_MM ? 2 * K : K; /* width of the input */
    int N1 = pk == PAT_MM_SILU ? 2 * N : pk == PAT_MM_SILU_MM ? 2 * K : K; /* the first matmul's outputs */
    float *x = frandn((size_t)T * xw, 2.0f), *w1 = frandn((size_t)N1 * K, 2.0f / sqrtf((float)K));
    float *w2 = frandn((size_t)N * K, 2.0f / sqrtf((float)K)), *wn = frandn((size_t)K, 1.5f);
    float *res = frandn((size_t)T * K, 1.0f);
    if (asym == 2) {
        for (size_t i = 0; i < (size_t)T * xw; i++) x[i] = 1.0f;
        for (size_t i = 0; i < (size_t)N1 * K; i++) w1[i] = 2.0f / sqrtf((float)K);
    }
    pat_w m1, m2;
    pat_w_make(&m1, w1, N1, K, wdt, group, asym == 1);
    pat_w_make(&m2, w2, N, K, wdt, group, asym == 1);
    int64_t xd[2] = {T, xw}, nd[1] = {K}, rd[2] = {T, K};
    int xv = add_w(&c, "x", TB_F32, 2, xd, x), last = -1, rv = -1;
    switch (pk) {
    case PAT_MM_SILU: {
        int gu = node_out(&c, pat_w_node(&c, xv, "w1", &m1, N1, K), 0);
        last = add_node(&c, TB_OP_SILU_MUL, &gu, 1, NULL, NULL);
        break;
    }
    case PAT_SILU_MM: {
        int h = node_out(&c, add_node(&c, TB_OP_SILU_MUL, &xv, 1, NULL, NULL), 0);
        last = pat_w_node(&c, h, "w2", &m2, N, K);
        break;
    }
    case PAT_MM_SILU_MM: { /* gate|up (2K, K), SiLU·mul, down (N, K) */
        int gu = node_out(&c, pat_w_node(&c, xv, "w1", &m1, N1, K), 0);
        int h = node_out(&c, add_node(&c, TB_OP_SILU_MUL, &gu, 1, NULL, NULL), 0);
        last = pat_w_node(&c, h, "w2", &m2, N, K);
        break;
    }
    case PAT_NORM_MM: {
        int a[2] = {xv, add_w(&c, "wn", TB_F32, 1, nd, wn)};
        int h = node_out(&c, add_node(&c, TB_OP_RMSNORM, a, 2, NULL, fa), 0);
        last = pat_w_node(&c, h, "w2", &m2, N, K);
        break;
    }
    case PAT_MM_ADDNORM_MM: {
        int d = node_out(&c, pat_w_node(&c, xv, "w1", &m1, N1, K), 0);
        int b[3] = {add_w(&c, "res", TB_F32, 2, rd, res), d, add_w(&c, "wn", TB_F32, 1, nd, wn)};
        int an = add_node(&c, TB_OP_ADD_RMSNORM, b, 3, NULL, fa);
        rv = node_out(&c, an, 0);
        last = pat_w_node(&c, node_out(&c, an, 1), "w2", &m2, N, K);
        break;
    }
    }
    size_t n = (size_t)T * N, nk = (size_t)T * K;
    float *y = xmalloc(n * 4), *yr = xmalloc(n * 4), *r = xmalloc(nk * 4), *rr = xmalloc(nk * 4);
    float *h = xmalloc(sizeof(float) * (size_t)T * N1), *h2 = xmalloc(nk * 4);
    /* the residual is read only where it stays smaller than the output (the
     * output must be the last matmul's for the fusion to form) */
    int rvs[2] = {c.g->nodes[last].out[0], rv};
    size_t rns[2] = {n, nk};
    void *o[2] = {y, r};
    int n_read = rv >= 0 && nk < n ? 2 : 1;
    if (case_run(&c, rvs, rns, n_read, o) == 1) {
        switch (pk) {
        case PAT_MM_SILU:
            pat_w_ref(&m1, x, h, T, K, N1);
            tb_ref_silu_mul(h, yr, T, N);
            break;
        case PAT_SILU_MM:
            tb_ref_silu_mul(x, h2, T, K);
            pat_w_ref(&m2, h2, yr, T, K, N);
            break;
        case PAT_MM_SILU_MM:
            pat_w_ref(&m1, x, h, T, K, N1);
            tb_ref_silu_mul(h, h2, T, K);
            pat_w_ref(&m2, h2, yr, T, K, N);
            break;
        case PAT_NORM_MM:
            tb_ref_rmsnorm(x, wn, h2, T, K, eps);
            pat_w_ref(&m2, h2, yr, T, K, N);
            break;
        case PAT_MM_ADDNORM_MM:
            pat_w_ref(&m1, x, h, T, K, K);
            tb_ref_add_rmsnorm(res, h, wn, rr, h2, T, K, eps);
            pat_w_ref(&m2, h2, yr, T, K, N);
            break;
        }
        tb_op_kind lk = c.g->nodes[last].op;
        report(&c, lk, wdt, "chain", rel_err(y, yr, n), pattern_bound(wdt, T));
        if (n_read == 2) report(&c, TB_OP_ADD_RMSNORM, wdt, "chain r", rel_err(r, rr, nk), pattern_bound(wdt, T));
    }
    free(x); free(w1); free(w2); free(wn); free(res);
    pat_w_free(&m1);
    pat_w_free(&m2);
    free(y); free(yr); free(r); free(rr); free(h); free(h2);
    tb_graph_free(c.g);
}

static void pattern(pat_kind pk, tb_dtype wdt, int T, int K, int N) { pattern_q(pk, wdt, 0, 0, T, K, N); }

/* The attention cases of one KV dtype; with more: hd 256 (8 codes a lane
 * on the GPU for int8 / fp8) and an 8/2-head run of 40. */
static void attention_shapes(tb_dtype kv, int more) {
    run_spec decode1[] = {{0, 0, 1}};
    run_spec decode3[] = {{2, 40, 1}, {0, 0, 1}, {1, 17, 1}};
    run_spec prefill[] = {{0, 0, 17}};
    run_spec mixed[] = {{0, 9, 5}, {3, 130, 1}, {1, 0, 3}};
    run_spec longrun[] = {{1, 7, 40}, {0, 200, 1}};
    op_attention(kv, 4, 4, 64, 0, decode1, 1, "T 1 pos 0");
    op_attention(kv, 8, 2, 64, 0, decode3, 3, "3 seqs decode pos 40,0,17");
    op_attention(kv, 8, 2, 128, 1, decode3, 3, "3 seqs decode pos 40,0,17");
    /* one token a sequence past 64 keys: on the GPU a warp's second tile
     * holds the step's key (attn_mma_kernel's early loads take it apart) */
    run_spec decode2[] = {{0, 100, 1}, {1, 70, 1}};
    op_attention(kv, 8, 2, 128, 0, decode2, 2, "2 seqs decode pos 100,70");
    if (more) op_attention(kv, 2, 1, 256, 0, decode3, 3, "3 seqs decode pos 40,0,17");
    op_attention(kv, 4, 2, 64, 0, prefill, 1, "prefill T 17");
    op_attention(kv, 6, 3, 128, 0, mixed, 3, "chunk 9..13, 130, 0..2");
    op_attention(kv, 4, 1, 32, 1, mixed, 3, "chunk 9..13, 130, 0..2");
    /* head_dim no multiple of 8: the CPU's scalar-tail attention */
    op_attention(kv, 4, 2, 20, 0, mixed, 3, "chunk 9..13, 130, 0..2");
    op_attention(kv, 2, 1, 6, 1, prefill, 1, "prefill T 17");
    op_attention(kv, 4, 2, 128, 0, longrun, 2, "run of 40 at 7, 1 at 200");
    op_attention(kv, 2, 2, 64, 1, longrun, 2, "run of 40 at 7, 1 at 200");
    if (more) op_attention(kv, 8, 2, 128, 0, longrun, 2, "run of 40 at 7, 1 at 200");
    /* 71 tokens of two sequences: from 64 tokens the GPU's RoPE kernel
     * takes one block a token, a warp two heads at a time (the last pass
     * one head where the count is odd); hd 64, 128, 256 (one, two and four
     * rotation pairs a lane) */
    run_spec long2[] = {{0, 9, 50}, {1, 0, 21}};
    op_attention(kv, 3, 1, 64, 1, long2, 2, "runs of 50 at 9, 21 at 0");
    op_attention(kv, 6, 3, 128, 0, long2, 2, "runs of 50 at 9, 21 at 0");
    if (more) op_attention(kv, 2, 1, 256, 0, long2, 2, "runs of 50 at 9, 21 at 0");
    /* 16 tokens of 8 kv heads (128 token x kv-head pairs): the GPU's
     * default decode attention takes its GQA blocks (4 q heads a block) */
    run_spec wide[] = {{0, 200, 4}, {1, 3, 4}, {2, 77, 4}, {3, 0, 4}};
    op_attention(kv, 32, 8, 128, 1, wide, 4, "4 runs of 4 at 200, 3, 77, 0");
}

/* ---------------------------------------------------------------- all */
static const int Ts[] = {1, 3, 17};
static int only_attention; /* TURBINE_TEST_ONLY=attention */
static int only_qgemm;     /* TURBINE_TEST_ONLY=qgemm */

/* The e4m3 qkv > attention chains: at 17 tokens (the attention kernel, RoPE
 * in front) and 40- and 70-token runs (the prefill path; from 64 tokens a
 * RoPE block a token) the GPU's qkv takes the FP8 GEMM and the RoPE kernel
 * applies its scales. */
static void fp8_qkv_attention_chains(void) {
    run_spec pre17[] = {{0, 5, 17}}, pre40[] = {{1, 3, 40}}, dec3[] = {{2, 40, 1}, {0, 0, 1}, {1, 17, 1}};
    run_spec pre70[] = {{1, 3, 70}};
    static const tb_dtype kvs[] = {TB_F16, TB_FP8_E4M3};
    for (int kv = 0; kv < 2; kv++) {
        attention_case(kvs[kv], 4, 2, 128, 1, pre17, 1, "prefill 17 at 5", 64, TB_FP8_E4M3);
        attention_case(kvs[kv], 4, 2, 128, 0, pre40, 1, "prefill 40 at 3", 64, TB_FP8_E4M3);
        attention_case(kvs[kv], 4, 2, 128, 1, pre70, 1, "prefill 70 at 3", 64, TB_FP8_E4M3);
        attention_case(kvs[kv], 8, 2, 64, 0, dec3, 3, "3 seqs decode", 96, TB_FP8_E4M3);
    }
}

/* TURBINE_TEST_ONLY=attention: the attention cases alone, every KV dtype
 * with the larger shapes, and a decode of 251 keys (more tiles a warp than
 * the pipelined kernel's ring holds when the keys are not split), also with
 * 8 q heads a kv head (the most TB_CUDA_ATTN_MMA=4 puts in one block) */
static void run_attention_only(void) {
    static const tb_dtype kvs[] = {TB_F32, TB_F16, TB_BF16, TB_I8, TB_FP8_E4M3};
    run_spec long1[] = {{0, 250, 1}, {1, 77, 1}};
    for (int i = 0; i < 5; i++) {
        attention_shapes(kvs[i], 1);
        op_attention(kvs[i], 4, 2, 128, 0, long1, 2, "decode at 250, 77");
        op_attention(kvs[i], 8, 1, 128, 1, long1, 2, "8 q heads a kv head, decode at 250, 77");
    }
    fp8_qkv_attention_chains();
}

/* Quantized steps of 9+ tokens (also TURBINE_TEST_ONLY=qgemm, the GPU's
 * block shapes through TB_CUDA_QGEMM_CFG / _SPLIT) */
static void qgemm_cases(void) {
    static const tb_dtype qdts[] = {TB_I8, TB_FP8_E4M3, TB_I4};
    /* steps of 9..24 tokens, which the GPU runs on the mixed-input GEMM
     * (16- and 32-token blocks, one 16-row tile a warp) or, with TB_CUDA_QCHUNK=24 (a row of
     * bench/gpu/run.sh), as chunks of 8 tokens on the quantized GEMV (a
     * remainder of 1..7 on the one-token or smaller kernels, x in f32); and
     * one token of int4 with zeros */
    op_qmatmul(TB_I8, 12, 256, 70, 256, 1, 0);
    op_qmatmul(TB_I8, 16, 512, 40, 512, 0, 0);
    op_qmatmul(TB_FP8_E4M3, 13, 256, 33, 256, 1, 0);
    op_qmatmul(TB_I4, 17, 256, 40, 64, 1, 1);
    op_qmatmul(TB_I4, 24, 4096, 24, 128, 0, 0);
    op_qmatmul(TB_I4, 1, 256, 40, 64, 1, 1);
    for (int qi = 0; qi < 3; qi++) {
        pattern_q(PAT_MM_SILU_MM, qdts[qi], 64, 0, 12, 256, 48);
        pattern_q(PAT_NORM_MM, qdts[qi], 128, qdts[qi] == TB_I4, 20, 256, 56);
    }
    /* int8 shapes the int8 GEMM takes (K, N multiples of 16) when asked
     * for (TB_CUDA_I8_GEMM_ALL=1): against x rounded per token as it does */
    op_qmatmul(TB_I8, 24, 256, 48, 256, 1, 0);
    op_qmatmul(TB_I8, 64, 512, 32, 512, 0, 0);
    /* steps past the chunks (int8 > 24, int4 > 40 tokens), which the GPU
     * runs on the mixed-input GEMM (qgemm.cu): rows past a 128-row block,
     * tokens past a 64-token tile, int4 groups of 32 / 64 / 128 with and
     * without zeros, and shapes of few row blocks, whose K is split across
     * blocks (partial sums added in order: int8 past 16 tokens in 2..5
     * splits within a cluster, as 100 and 40 tokens here, else through
     * memory and a second kernel); then chains whose producers write the
     * GEMM's f16 x */
    op_qmatmul(TB_I8, 25, 512, 200, 512, 1, 0);
    op_qmatmul(TB_I8, 64, 4096, 136, 4096, 1, 0);
    op_qmatmul(TB_I8, 100, 1024, 72, 1024, 0, 0);
    op_qmatmul(TB_I8, 40, 2048, 256, 2048, 1, 0);
    op_qmatmul(TB_I4, 41, 1024, 96, 32, 1, 1);
    op_qmatmul(TB_I4, 70, 2048, 300, 64, 0, 1);
    op_qmatmul(TB_I4, 128, 4096, 64, 128, 1, 0);
    op_qmatmul(TB_I4, 64, 11008, 256, 128, 0, 0);
    for (int qi = 0; qi < 3; qi++) {
        pattern_q(PAT_MM_SILU_MM, qdts[qi], 64, 0, 48, 256, 48);
        pattern_q(PAT_NORM_MM, qdts[qi], 128, qdts[qi] == TB_I4, 66, 512, 136);
    }
}

static void run_all(void) {
    static const tb_dtype wdts[] = {TB_F32, TB_F16, TB_BF16};
    if (only_attention) {
        run_attention_only();
        return;
    }
    if (only_qgemm) {
        qgemm_cases();
        return;
    }
    for (int di = 0; di < 3; di++) {
        op_embedding(wdts[di], 37, 67, 1, 0);
        op_embedding(wdts[di], 100, 256, 3, 0);
        op_embedding(wdts[di], 11, 5, 17, 0);
        op_embedding(wdts[di], 16, 33, 17, 20);
    }
    for (int r = 1; r <= 4; r *= 2) {
        op_collective(TB_OP_ALL_REDUCE, r, 1, 64);
        op_collective(TB_OP_ALL_REDUCE, r, 7, 1000);
        op_collective(TB_OP_ALL_GATHER_COLS, r, 1, 37);
        op_collective(TB_OP_ALL_GATHER_COLS, r, 5, 64);
    }
    for (int fused = 0; fused < 2; fused++) {
        op_rmsnorm(fused, 1, 64);
        op_rmsnorm(fused, 3, 67);
        op_rmsnorm(fused, 17, 257);
        op_rmsnorm(fused, 9, 1000);
    }
    for (int di = 0; di < 3; di++) {
        tb_dtype w = wdts[di];
        op_matmul(w, 1, 64, 32, 0);
        op_matmul(w, 1, 67, 45, 1);
        op_matmul(w, 3, 131, 33, 0);
        op_matmul(w, 8, 256, 24, 0);
        op_matmul(w, 9, 40, 70, 1);
        op_matmul(w, 17, 256, 70, 0);
        op_matmul(w, 100, 96, 40, 1);
    }
    op_qmatmul(TB_I8, 1, 67, 45, 67, 1, 0);
    op_qmatmul(TB_I8, 17, 256, 70, 256, 0, 0);
    op_qmatmul(TB_FP8_E4M3, 3, 131, 33, 131, 1, 0);
    op_qmatmul(TB_I4, 1, 128, 40, 32, 0, 0);
    op_qmatmul(TB_I4, 9, 256, 24, 64, 1, 1);
    op_qmatmul(TB_I4, 100, 256, 40, 128, 0, 1);
    for (int i = 0; i < 3; i++) {
        op_rope(Ts[i], 2, 64, 2 * 64, i & 1, 0);
        op_rope(Ts[i], 3, 128, 5 * 128, (i + 1) & 1, 200);
    }
    op_rope(5, 4, 6, 4 * 6 + 3, 0, 37);
    op_rope(5, 4, 6, 4 * 6 + 3, 1, 37);
    static const tb_dtype kvdts[] = {TB_F32, TB_F16, TB_BF16};
    for (int di = 0; di < 3; di++) attention_shapes(kvdts[di], 0);
    for (int i = 0; i < 3; i++) op_silu_mul(Ts[i], (int[]){5, 64, 300}[i]);
    op_silu_mul(100, 35);
    for (int i = 0; i < 3; i++) op_add(Ts[i], (int[]){7, 64, 129}[i]);
    op_gather_rows(1, 64, 1);
    op_gather_rows(17, 67, 3);
    op_gather_rows(40, 33, 40);

    /* chains the GPU fuses: GEMV steps (1, 2, 8 tokens) and cuBLAS steps
     * (17) in every weight dtype */
    static const int pTs[] = {1, 2, 8, 17};
    for (int di = 0; di < 3; di++)
        for (int i = 0; i < 4; i++) {
            int T = pTs[i];
            pattern(PAT_MM_SILU, wdts[di], T, 64, 48);
            pattern(PAT_SILU_MM, wdts[di], T, 72, 40);
            pattern(PAT_NORM_MM, wdts[di], T, 128, 56);
            pattern(PAT_MM_ADDNORM_MM, wdts[di], T, 64, 96);
            pattern(PAT_MM_ADDNORM_MM, wdts[di], T, 40, 24); /* residual not read */
        }
    for (int di = 0; di < 3; di++)
        for (int kv = 0; kv < 3; kv++) {
            run_spec dec[] = {{2, 40, 1}, {0, 0, 1}, {1, 17, 1}};
            run_spec pre[] = {{0, 5, 17}};
            attention_case(kvdts[kv], 8, 2, 64, 0, dec, 3, "3 seqs decode", 96, wdts[di]);
            attention_case(kvdts[kv], 4, 2, 128, 1, pre, 1, "prefill 17 at 5", 64, wdts[di]);
        }
    /* last: the random inputs of the cases above stay what they were */
    for (int i = 0; i < 3; i++) {
        op_concat_cols(Ts[i], 2 + i);
        op_silu_emul(TB_OP_SILU, Ts[i], (int[]){7, 64, 129}[i]);
        op_silu_emul(TB_OP_EMUL, Ts[i], (int[]){7, 64, 129}[i]);
    }
    /* int8 and fp8 (e4m3) KV caches, after all the others (their random
     * inputs stay what they were): the shapes above, hd 256 (the GPU reads
     * 8 codes a lane there; 16 at hd 128, 2 at 64, 1 at 32, 5 at 20, 3 at
     * 6), and the chains (the GPU does not fuse the RoPE and the KV write
     * into the qkv GEMV for these caches: the attention writes them) */
    static const tb_dtype kvqdts[] = {TB_I8, TB_FP8_E4M3};
    for (int di = 0; di < 2; di++) attention_shapes(kvqdts[di], 1);
    for (int di = 0; di < 3; di++)
        for (int kv = 0; kv < 2; kv++) {
            run_spec dec[] = {{2, 40, 1}, {0, 0, 1}, {1, 17, 1}};
            run_spec pre[] = {{0, 5, 17}};
            attention_case(kvqdts[kv], 8, 2, 64, 0, dec, 3, "3 seqs decode", 96, wdts[di]);
            attention_case(kvqdts[kv], 4, 2, 128, 1, pre, 1, "prefill 17 at 5", 64, wdts[di]);
        }
    /* quantized weights on the GPU's GEMV shapes (K a multiple of 64, int4
     * of 128; T <= 8) and in the chains it fuses (the norm weight read by
     * the GEMV); after the cases above so that their inputs stay the same */
    op_qmatmul(TB_I8, 1, 256, 70, 256, 1, 0);
    op_qmatmul(TB_I8, 8, 512, 40, 512, 0, 0);
    op_qmatmul(TB_FP8_E4M3, 2, 192, 33, 192, 0, 0);
    op_qmatmul(TB_FP8_E4M3, 5, 256, 64, 256, 1, 0);
    op_qmatmul(TB_I4, 1, 256, 40, 32, 0, 0);
    op_qmatmul(TB_I4, 4, 512, 24, 128, 0, 1);
    op_qmatmul(TB_I4, 8, 384, 48, 64, 1, 1);
    /* int4 with groups of 128 and no zeros (the GPU's per-step scales):
     * long rows (each warp's steps wrap its ring), several tiles a block */
    op_qmatmul(TB_I4, 1, 8192, 40, 128, 1, 0);
    op_qmatmul(TB_I4, 3, 4096, 72, 128, 0, 0);
    op_qmatmul(TB_I4, 8, 2048, 24, 128, 1, 0);
    op_qmatmul(TB_I4, 8, 11008, 24, 128, 0, 0); /* x of 8 tokens beside a one-tile ring only */
    static const tb_dtype qdts[] = {TB_I8, TB_FP8_E4M3, TB_I4};
    for (int qi = 0; qi < 3; qi++)
        for (int i = 0; i < 4; i++) {
            int T = pTs[i], asym = qdts[qi] == TB_I4 && (i & 1);
            pattern_q(PAT_MM_SILU, qdts[qi], 32, asym, T, 128, 48);
            pattern_q(PAT_SILU_MM, qdts[qi], 64, asym, T, 256, 40);
            pattern_q(PAT_NORM_MM, qdts[qi], 128, asym, T, 256, 56);
            pattern_q(PAT_MM_ADDNORM_MM, qdts[qi], 128, asym, T, 128, 96);
            pattern_q(PAT_MM_ADDNORM_MM, qdts[qi], 32, asym, T, 64, 24); /* K 64: int4 takes the dequantised path */
        }
    /* gate|up > SiLU·mul > down in every quantized dtype; e4m3 at 17 and 40
     * tokens takes the FP8 GEMM twice, the SiLU·mul applying the first
     * product's scales and writing the second's codes. Then e4m3 rows of
     * 12,800 (the GPU keeps a 50 KiB row in shared memory to write codes) */
    for (int qi = 0; qi < 3; qi++)
        for (int i = 0; i < 3; i++) pattern_q(PAT_MM_SILU_MM, qdts[qi], 64, 0, (int[]){8, 17, 40}[i], 256, 48);
    pattern_q(PAT_SILU_MM, TB_FP8_E4M3, 64, 0, 17, 12800, 16);
    /* the largest product of codes there is, into the next kernel */
    pattern_q(PAT_MM_ADDNORM_MM, TB_FP8_E4M3, 64, 2, 17, 2048, 32);
    pattern_q(PAT_MM_SILU_MM, TB_FP8_E4M3, 64, 2, 24, 256, 32);
    pattern_q(PAT_NORM_MM, TB_FP8_E4M3, 64, 0, 20, 12800, 16);
    fp8_qkv_attention_chains();
    qgemm_cases();
    /* rows of several bulk-copy stages (1 KiB of codes each) in every
     * quantized dtype, odd counts among them, alone and in the fused
     * chains: the GPU's one-token int8 / e4m3 GEMVs run on the bulk-copy
     * ring there by default (TB_CUDA_GEMV_TMA bit 4), and with bit 6 split
     * K over clusters of two blocks, the norm's squares summed over the
     * pair */
    op_qmatmul(TB_I8, 1, 3072, 40, 3072, 1, 0);
    op_qmatmul(TB_FP8_E4M3, 8, 2048, 33, 2048, 0, 0);
    op_qmatmul(TB_I4, 1, 6144, 24, 128, 1, 0);
    op_qmatmul(TB_I4, 5, 11008, 40, 128, 0, 0);
    for (int qi = 0; qi < 3; qi++) {
        pattern_q(PAT_NORM_MM, qdts[qi], 128, 0, qi == 1 ? 8 : 1, 5120, 40);
        pattern_q(PAT_MM_ADDNORM_MM, qdts[qi], 128, 0, qi == 2 ? 4 : 1, 3072, 24);
        pattern_q(PAT_MM_SILU, qdts[qi], 128, 0, 1, 2048, 48);
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* the log up to a crash */
    const char *only = getenv("TURBINE_TEST_ONLY");
    if (only && *only) {
        only_attention = !strcmp(only, "attention");
        only_qgemm = !strcmp(only, "qgemm");
        CHECK_MSG(only_attention || only_qgemm, "TURBINE_TEST_ONLY=%s: 'attention' or 'qgemm'", only);
        if (!only_attention && !only_qgemm) return tb_test_finish("test_backend_ops");
    }
    /* the CPU, once per SIMD path it runs */
    static const char *paths[] = {"avx512", "avx2", "scalar"};
    for (int i = 0; i < 3; i++) {
        if (tb_cpu_kernel_force_path(paths[i]) != 0) {
            printf("cpu/%s: not supported by this CPU, skipped\n", paths[i]);
            continue;
        }
        backend_desc *d = &backends[n_backends++];
        snprintf(d->label, sizeof d->label, "cpu/%s", paths[i]);
        d->device = "cpu";
        d->path = paths[i];
    }
    tb_cpu_kernel_force_path(NULL);
    /* the GPU: required when asked for, else when the module finds one */
    const char *want = getenv("TURBINE_TEST_DEVICE");
    int need_cuda = want && !strncmp(want, "cuda", 4);
    const char *cuda_dev = need_cuda ? want : "cuda";
    tb_backend *probe = NULL;
    if (tb_backend_create(cuda_dev, 1, MAX_CTX, &probe) == TB_OK) {
        tb_backend_free(probe);
        backend_desc *d = &backends[n_backends++];
        snprintf(d->label, sizeof d->label, "cuda");
        d->device = cuda_dev;
        d->cuda = 1;
    } else {
        printf("%s: %s (%s)\n", cuda_dev, need_cuda ? "FAILED" : "not present, skipped", tb_last_error());
        CHECK_MSG(!need_cuda, "TURBINE_TEST_DEVICE=%s but the backend cannot be created", want);
    }

    double t0 = tb_now();
    for (int i = 0; i < n_backends; i++) {
        cur_bk = &backends[i];
        int fails = tb_test_failures;
        printf("== %s\n", cur_bk->label);
        for (int k = 0; k < TB_OP_COUNT; k++) worst[k] = 0, covered[k] = 0;
        rng_state = 0x2545f4914f6cdd1dull; /* the same cases on every backend */
        run_all();
        printf("%s: worst error per op:", cur_bk->label);
        for (int k = 0; k < TB_OP_NN_FIRST; k++) printf(" %s %.1e", tb_op_name((tb_op_kind)k), worst[k]);
        /* an LLM op added to the IR fails here until it has a case (the
         * general ops of ops_nn.def: test_nn_*.c, every kernel against its
         * reference) */
        for (int k = 0; k < TB_OP_NN_FIRST && !only_attention && !only_qgemm; k++)
            CHECK_MSG(covered[k], "%s: op %s has no case in test_backend_ops", cur_bk->label,
                      tb_op_name((tb_op_kind)k));
        printf(" -> %s\n", tb_test_failures == fails ? "ok" : "FAILED");
    }
    tb_cpu_kernel_force_path(NULL);
    printf("%d comparisons, %d cases skipped, %.1f s\n", n_run, n_skip, tb_now() - t0);
    CHECK(n_backends >= 1 && n_run > 0);
    return tb_test_finish("test_backend_ops");
}
