/*
 * test_kernels.c — every tb_cpu_* kernel against its tb_ref_* reference, on
 * random inputs, for every SIMD path this CPU can run (forced one at a time)
 * and with 1 and 2 pool threads.
 *
 * Error bounds (stated per check): f32 arithmetic in a different order, so
 * outputs are compared with a relative bound of 1e-5 against the largest
 * reference magnitude of the output (matmul, attention) or per element
 * (elementwise ops). f16/bf16 weights are converted identically on both
 * sides, so they get the same bound. Attention sums up to ~100 softmax
 * terms of magnitude ~1 before normalising, so its bound is 2e-5.
 */
#include "backend/cpu/kernels.h"
#include "tb_test.h"

/* ---------------------------------------------------------------- helpers */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { return tb_test_frand(&rng_state); }

static void fill(float *v, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
}

/* max over i of |a - b| / (|b| + floor): per-element relative error. */
static double elem_err(const float *a, const float *b, size_t n, double floor) {
    double err = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == b[i]) continue; /* also 0 == 0 with floor 0, not 0/0 */
        double d = fabs((double)a[i] - b[i]) / (fabs(b[i]) + floor);
        if (d > err || d != d) err = d != d ? INFINITY : d;
    }
    return err;
}

/* Weights (n) in dtype dt made from random f32. */
static void *make_weights(size_t n, tb_dtype dt) {
    float *f = tb_test_xmalloc(n * sizeof(float));
    fill(f, n, 1.0f);
    void *w = tb_test_xmalloc(n * tb_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        if (dt == TB_F32) ((float *)w)[i] = f[i];
        else if (dt == TB_F16) ((uint16_t *)w)[i] = tb_f32_to_f16(f[i]);
        else ((uint16_t *)w)[i] = tb_f32_to_bf16(f[i]);
    }
    free(f);
    return w;
}

static const char *ctx_path;
static int ctx_threads;
static double worst_mm, worst_attn;

#define CHECK_ERR(err, bound, ...)                                             \
    do {                                                                       \
        char what_[160];                                                       \
        double err_ = (err);                                                   \
        snprintf(what_, sizeof what_, __VA_ARGS__);                            \
        CHECK_MSG(err_ <= (bound), "[%s, %d threads] err %.3g > %.3g: %s",     \
                  ctx_path, ctx_threads, err_, (double)(bound), what_);        \
    } while (0)

/* ---------------------------------------------------------------- matmul */
static void test_matmul(tb_pool *p) {
    static const int Ts[] = {1, 2, 3, 5, 8, 11, 12, 17, 47, 64, 100}; /* 5..47: f32 k-sliced tiles */
    static const int KN[][2] = {{13, 100}, {100, 13}, {768, 131}, {64, 768}, {1100, 200}, {7, 5}};
    static const tb_dtype dts[] = {TB_F32, TB_F16, TB_BF16};
    for (size_t s = 0; s < sizeof KN / sizeof KN[0]; s++)
        for (size_t d = 0; d < 3; d++) {
            int K = KN[s][0], N = KN[s][1];
            void *w = make_weights((size_t)N * K, dts[d]);
            float *bias = tb_test_xmalloc((size_t)N * sizeof(float));
            fill(bias, (size_t)N, 1.0f);
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                int T = Ts[ti];
                float *x = tb_test_xmalloc((size_t)T * K * sizeof(float));
                float *y = tb_test_xmalloc((size_t)T * N * sizeof(float));
                float *yr = tb_test_xmalloc((size_t)T * N * sizeof(float));
                fill(x, (size_t)T * K, 1.0f);
                for (int b = 0; b < 2; b++) {
                    const float *bs = b ? bias : NULL;
                    tb_ref_matmul(x, w, dts[d], bs, yr, T, K, N);
                    for (size_t i = 0; i < (size_t)T * N; i++) y[i] = NAN;
                    tb_cpu_matmul(p, x, w, dts[d], bs, y, T, K, N);
                    double e = tb_test_rel_err(y, yr, (size_t)T * N, 1e-3);
                    if (e > worst_mm) worst_mm = e;
                    CHECK_ERR(e, 1e-5, "matmul %s T=%d K=%d N=%d bias=%d", tb_dtype_name(dts[d]),
                              T, K, N, b);
                    for (int t = TB_MM_OWN; t <= TB_MM_BLAS; t++) {
                        if (!tb_cpu_matmul_tactic_available((tb_mm_tactic)t, dts[d])) continue;
                        for (size_t i = 0; i < (size_t)T * N; i++) y[i] = NAN;
                        tb_cpu_matmul_tactic(p, (tb_mm_tactic)t, x, w, dts[d], bs, y, T, K, N);
                        e = tb_test_rel_err(y, yr, (size_t)T * N, 1e-3);
                        CHECK_ERR(e, 1e-5, "matmul tactic %d %s T=%d K=%d N=%d", t,
                                  tb_dtype_name(dts[d]), T, K, N);
                    }
                }
                free(x);
                free(y);
                free(yr);
            }
            free(w);
            free(bias);
        }
}

/* ---------------------------------------------------------------- elementwise */
static void test_elementwise(tb_pool *p) {
    static const int Ts[] = {1, 3, 17, 64};
    static const int Ds[] = {13, 100, 768};
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t di = 0; di < 3; di++) {
            int T = Ts[ti], D = Ds[di];
            size_t n = (size_t)T * D;
            float *x = tb_test_xmalloc(n * 4), *d = tb_test_xmalloc(n * 4), *w = tb_test_xmalloc((size_t)D * 4);
            float *y = tb_test_xmalloc(n * 4), *yr = tb_test_xmalloc(n * 4);
            float *r = tb_test_xmalloc(n * 4), *rr = tb_test_xmalloc(n * 4);
            float *gu = tb_test_xmalloc(2 * n * 4);
            fill(x, n, 2.0f);
            fill(d, n, 1.0f);
            fill(w, (size_t)D, 1.5f);
            fill(gu, 2 * n, 8.0f);

            tb_ref_rmsnorm(x, w, yr, T, D, 1e-5f);
            tb_cpu_rmsnorm(p, x, w, y, T, D, 1e-5f);
            CHECK_ERR(elem_err(y, yr, n, 1e-6), 1e-5, "rmsnorm T=%d D=%d", T, D);

            tb_ref_add_rmsnorm(x, d, w, rr, yr, T, D, 1e-5f);
            tb_cpu_add_rmsnorm(p, x, d, w, r, y, T, D, 1e-5f);
            CHECK_ERR(elem_err(r, rr, n, 0), 0, "add_rmsnorm residual T=%d D=%d", T, D);
            CHECK_ERR(elem_err(y, yr, n, 1e-6), 1e-5, "add_rmsnorm T=%d D=%d", T, D);
            memcpy(r, x, n * 4); /* r aliasing x */
            tb_cpu_add_rmsnorm(p, r, d, w, r, y, T, D, 1e-5f);
            CHECK_ERR(elem_err(r, rr, n, 0), 0, "add_rmsnorm in place T=%d D=%d", T, D);
            CHECK_ERR(elem_err(y, yr, n, 1e-6), 1e-5, "add_rmsnorm in place T=%d D=%d", T, D);

            tb_ref_silu_mul(gu, yr, T, D);
            tb_cpu_silu_mul(p, gu, y, T, D);
            CHECK_ERR(elem_err(y, yr, n, 1e-6), 1e-5, "silu_mul T=%d F=%d", T, D);

            tb_ref_add(x, d, yr, n);
            tb_cpu_add(p, x, d, y, n);
            CHECK_ERR(elem_err(y, yr, n, 0), 0, "add n=%zu", n);

            free(x); free(d); free(w); free(y); free(yr); free(r); free(rr); free(gu);
        }
    /* a large add and silu that take the threaded branch */
    size_t n = 3 * 65536 + 5;
    float *a = tb_test_xmalloc(n * 4), *b = tb_test_xmalloc(n * 4);
    float *y = tb_test_xmalloc(n * 4), *yr = tb_test_xmalloc(n * 4);
    fill(a, n, 1.0f);
    fill(b, n, 1.0f);
    tb_ref_add(a, b, yr, n);
    tb_cpu_add(p, a, b, y, n);
    CHECK_ERR(elem_err(y, yr, n, 0), 0, "add n=%zu", n);
    free(a); free(b); free(y); free(yr);
}

static void test_embedding(tb_pool *p) {
    static const tb_dtype dts[] = {TB_F32, TB_F16, TB_BF16};
    static const int Ts[] = {1, 3, 64};
    int V = 50, D = 777;
    for (int d = 0; d < 3; d++) {
        void *table = make_weights((size_t)V * D, dts[d]);
        for (int ti = 0; ti < 3; ti++) {
            int T = Ts[ti];
            int32_t ids[64];
            for (int t = 0; t < T; t++) ids[t] = (t * 17 + 3) % V;
            float *y = tb_test_xmalloc((size_t)T * D * 4), *yr = tb_test_xmalloc((size_t)T * D * 4);
            tb_ref_embedding(ids, table, dts[d], yr, T, D);
            tb_cpu_embedding(p, ids, table, dts[d], y, T, D);
            CHECK_ERR(elem_err(y, yr, (size_t)T * D, 0), 0, "embedding %s T=%d",
                      tb_dtype_name(dts[d]), T);
            free(y);
            free(yr);
        }
        free(table);
    }
}

static void test_rope(tb_pool *p) {
    static const int Ts[] = {1, 3, 17, 64};
    static const int hds[] = {64, 12, 128};
    for (int ti = 0; ti < 4; ti++)
        for (int hi = 0; hi < 3; hi++)
            for (int il = 0; il < 2; il++) {
                int T = Ts[ti], hd = hds[hi], nh = 5, stride = (nh + 4) * hd + 3;
                size_t n = (size_t)T * stride;
                float *x = tb_test_xmalloc(n * 4), *xr = tb_test_xmalloc(n * 4), inv[64];
                int32_t pos[64];
                fill(x, n, 1.0f);
                memcpy(xr, x, n * 4);
                for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / hd);
                for (int t = 0; t < T; t++) pos[t] = 3 * t + 1000 * (t & 1);
                tb_ref_rope(xr, stride, pos, inv, T, nh, hd, il);
                tb_cpu_rope(p, x, stride, pos, inv, T, nh, hd, il);
                CHECK_ERR(tb_test_rel_err(x, xr, n, 1.0), 1e-6, "rope T=%d hd=%d interleaved=%d", T, hd, il);
                free(x);
                free(xr);
            }
}

/* ---------------------------------------------------------------- attention */
static void test_attention_case(tb_pool *p, const tb_test_attn_batch *c, int n_heads, int n_kv, int hd,
                                tb_dtype kvdt) {
    int bs = 16, max_blocks = 8, n_blocks = 40, max_ctx = bs * max_blocks;
    int T = c->T, stride = (n_heads + 2 * n_kv) * hd;
    size_t cache_elems = (size_t)n_blocks * bs * n_kv * hd, esz = tb_dtype_size(kvdt);

    int32_t tables[4 * 8]; /* scattered over the pool */
    tb_test_block_tables(&rng_state, n_blocks, c->n_seqs, max_blocks, tables);

    float *f = tb_test_xmalloc(cache_elems * 4);
    void *kc = tb_test_xmalloc(cache_elems * esz), *vc = tb_test_xmalloc(cache_elems * esz);
    void *kr = tb_test_xmalloc(cache_elems * esz), *vr = tb_test_xmalloc(cache_elems * esz);
    fill(f, cache_elems, 1.0f); /* earlier positions: random history */
    tb_convert(f, TB_F32, kc, kvdt, cache_elems);
    fill(f, cache_elems, 1.0f);
    tb_convert(f, TB_F32, vc, kvdt, cache_elems);
    memcpy(kr, kc, cache_elems * esz);
    memcpy(vr, vc, cache_elems * esz);

    float *qkv = tb_test_xmalloc((size_t)T * stride * 4);
    float *out = tb_test_xmalloc((size_t)T * n_heads * hd * 4), *outr = tb_test_xmalloc((size_t)T * n_heads * hd * 4);
    fill(qkv, (size_t)T * stride, 2.0f);
    float *scratch = tb_test_xmalloc(tb_attention_scratch_floats(tb_pool_size(p), max_ctx) * 4);

    tb_attn_args a = {T, n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), c->pos, c->seq, tables,
                      max_blocks, bs, kr, vr, kvdt};
    tb_ref_attention(&a, qkv, outr, scratch);
    a.k_cache = kc;
    a.v_cache = vc;
    tb_cpu_attention(p, &a, qkv, out, scratch, max_ctx);

    CHECK_MSG(memcmp(kc, kr, cache_elems * esz) == 0 && memcmp(vc, vr, cache_elems * esz) == 0,
              "[%s, %d threads] attention cache write differs (T=%d %s)", ctx_path, ctx_threads, T,
              tb_dtype_name(kvdt));
    double e = tb_test_rel_err(out, outr, (size_t)T * n_heads * hd, 0.1);
    if (e > worst_attn) worst_attn = e;
    if (getenv("TB_TEST_VERBOSE")) printf("  attention T=%d heads=%d kv=%d hd=%d %s: %.2e\n", T, n_heads, n_kv, hd, tb_dtype_name(kvdt), e);
    CHECK_ERR(e, 2e-5, "attention T=%d heads=%d kv=%d hd=%d %s", T, n_heads, n_kv, hd,
              tb_dtype_name(kvdt));
    free(f); free(kc); free(vc); free(kr); free(vr); free(qkv); free(out); free(outr); free(scratch);
}

static void test_attention(tb_pool *p) {
    /* a single decode step, a mixed batch (its last decode at 100), a
     * 64-token prefill */
    tb_test_attn_batch one, mixed, pre;
    tb_test_attn_batches(100, &one, &mixed, &pre);

    static const tb_dtype kvdts[] = {TB_F32, TB_F16};
    for (int d = 0; d < 2; d++) {
        test_attention_case(p, &one, 12, 12, 64, kvdts[d]);
        test_attention_case(p, &one, 12, 4, 64, kvdts[d]);
        test_attention_case(p, &mixed, 6, 2, 64, kvdts[d]);
        test_attention_case(p, &mixed, 4, 1, 36, kvdts[d]);
        test_attention_case(p, &pre, 8, 2, 32, kvdts[d]);
        /* small heads (stories260K: hd 8, groups of 2), every group size of
         * the grouped fast path, groups split into slices (6 = 3 + 3, 8 =
         * 4 + 4), and odd head sizes on the per-head path */
        test_attention_case(p, &one, 8, 4, 8, kvdts[d]);
        test_attention_case(p, &mixed, 8, 4, 8, kvdts[d]);
        test_attention_case(p, &pre, 8, 4, 8, kvdts[d]);
        test_attention_case(p, &mixed, 3, 1, 16, kvdts[d]);
        test_attention_case(p, &pre, 4, 1, 24, kvdts[d]);
        test_attention_case(p, &mixed, 6, 1, 8, kvdts[d]);
        test_attention_case(p, &pre, 8, 1, 16, kvdts[d]);
        test_attention_case(p, &mixed, 4, 2, 5, kvdts[d]);
        /* runs of heads that span kv heads: groups of 3 taken 2 at a time
         * (9 heads: runs 0-5, 6-8), groups of 10 and 12 split in halves */
        test_attention_case(p, &mixed, 9, 3, 8, kvdts[d]);
        test_attention_case(p, &pre, 10, 1, 16, kvdts[d]);
        test_attention_case(p, &one, 24, 2, 8, kvdts[d]);
    }
}

/* ---------------------------------------------------------------- data movement */
static void test_convert_copy(tb_pool *p) {
    size_t n = 1000;
    float *f = tb_test_xmalloc(n * 4), *g = tb_test_xmalloc(n * 4);
    uint16_t *h = tb_test_xmalloc(n * 2), *h2 = tb_test_xmalloc(n * 2);
    fill(f, n, 3.0f);
    f[0] = 0.0f; f[1] = -0.0f; f[2] = 1e-6f; f[3] = -3e-7f; f[4] = 65504.0f; f[5] = 1e9f;
    f[6] = 6.1e-5f; f[7] = 2.98e-8f;
    static const tb_dtype dts[] = {TB_F16, TB_BF16};
    for (int d = 0; d < 2; d++) {
        tb_convert(f, TB_F32, h, dts[d], n);
        int bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += h[i] != (dts[d] == TB_F16 ? tb_f32_to_f16(f[i]) : tb_f32_to_bf16(f[i]));
        CHECK_MSG(bad == 0, "[%s] convert f32 -> %s: %d mismatches", ctx_path, tb_dtype_name(dts[d]), bad);
        tb_convert(h, dts[d], g, TB_F32, n);
        bad = 0;
        for (size_t i = 0; i < n; i++) {
            float r = dts[d] == TB_F16 ? tb_f16_to_f32(h[i]) : tb_bf16_to_f32(h[i]);
            bad += memcmp(&g[i], &r, 4) != 0;
        }
        CHECK_MSG(bad == 0, "[%s] convert %s -> f32: %d mismatches", ctx_path, tb_dtype_name(dts[d]), bad);
    }
    tb_convert(f, TB_F32, h, TB_F16, n);
    tb_convert(h, TB_F16, h2, TB_BF16, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += h2[i] != tb_f32_to_bf16(tb_f16_to_f32(h[i]));
    CHECK_MSG(bad == 0, "[%s] convert f16 -> bf16: %d mismatches", ctx_path, bad);

    int32_t rows[4] = {7, 0, 7, 3};
    float x[8 * 5], y[4 * 5];
    fill(x, 40, 1.0f);
    tb_cpu_gather_rows(x, rows, y, 4, 5);
    CHECK(memcmp(y, x + 35, 20) == 0 && memcmp(y + 5, x, 20) == 0 && memcmp(y + 15, x + 15, 20) == 0);

    size_t bytes = (1 << 20) + 12345;
    uint8_t *s = tb_test_xmalloc(bytes), *t = tb_test_xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) s[i] = (uint8_t)(i * 131 + 7);
    tb_cpu_copy(p, t, s, bytes);
    CHECK(memcmp(s, t, bytes) == 0);
    free(f); free(g); free(h); free(h2); free(s); free(t);
}

static void run_path(tb_pool *p, const char *path, int threads) {
    ctx_path = path;
    ctx_threads = threads;
    worst_mm = worst_attn = 0;
    int before = tb_test_failures;
    test_matmul(p);
    test_elementwise(p);
    test_embedding(p);
    test_rope(p);
    test_attention(p);
    test_convert_copy(p);
    printf("path %-6s threads %d: worst matmul err %.2e, attention err %.2e, %s\n", path, threads, worst_mm,
           worst_attn, tb_test_failures == before ? "ok" : "FAILED");
}

int main(void) {
    tb_test_each_kernel_path(run_path);
    return tb_test_finish("test_kernels");
}
