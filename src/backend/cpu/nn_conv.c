/*
 * nn_conv.c — fast CPU kernels of the compute group (nn.h): Conv, Gemm,
 * MatMul and the fused attention, all over the packed sgemm (sgemm.c) with
 * its fused epilogue.
 *
 * Conv (NCHW), per image and group, picks one tactic:
 *   - 1x1, stride 1, no pads: the GEMM w (M, C) x (C, H W) straight on x;
 *   - depthwise (one input channel per group): a direct loop per channel;
 *   - 3x3, stride 1, dilation 1, enough channels and tiles: Winograd
 *     F(4x4, 3x3) (AVX-512: in phases at 40 tiles an image, by blocks of
 *     32 tiles for a batch of smaller maps) or F(2x2, 3x3) (winograd.c;
 *     the transformed weights made once per context, below);
 *   - otherwise, one group with AVX-512: the direct form with 64 output
 *     channels in the vector lanes (conv_direct.c; no im2col, and no waste
 *     on small maps such as 7x7, the stem's 7x7 stride 2 over 3 channels,
 *     the stride-2 3x3 and 1x1 convs);
 *   - otherwise im2col into scratch, then the GEMM (C kh kw, oh ow).
 * The node's tactic field can force one (TB_CONV_TACTIC_*; 0: choose);
 * `turbine build` sets it where timing beats the rule (nn_tune.c).
 * Weights in a kernel's layout (GEMM panels, Winograd U, direct panels) are
 * kept in the context's one packed-weight cache (tb_cpu_nn_wpack).
 */
#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"

#include <immintrin.h>
#include <math.h>
#include <sys/mman.h>

/* ---------------------------------------------------------------- shared */

/* The epilogue inputs of a node: bias index (or -1), residual index (or -1);
 * the same reading as the reference (src/ir/nn_conv.c). */
static void epi_inputs(int flags, int n_in, int *bias, int *res) {
    int has_res = (flags & TB_NN_HAS_RESIDUAL) != 0;
    *res = has_res ? n_in - 1 : -1;
    *bias = n_in - has_res > 2 ? 2 : -1;
}

static int pool_threads(tb_pool *p) { return p ? tb_pool_size(p) : 1; }

/* ---------------------------------------------------------------- Conv */

/* im2col of one image's group, output rows [oy0, oy1): col (cg kh kw,
 * (oy1 - oy0) ow) */
typedef struct {
    const tb_nn_conv_geom *g;
    const float *x; /* (cg, h, w) */
    float *col;
    int64_t rows;   /* cg kh kw */
    int wide;       /* AVX-512 row copies */
    int64_t oy0, oy1;
} im2col_job;

#define IM2COL_MAX_BYTES ((size_t)16 << 20) /* col is made in chunks of output rows up to this */

/* d[0, n) = s[0], s[2], s[4], ... (a stride-2 row of im2col) */
__attribute__((target("avx512f"))) static void copy_stride2_512(float *d, const float *s, int64_t n) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) /* reads s[2i, 2i + 30] only */
        _mm512_storeu_ps(d + i, _mm512_permutex2var_ps(_mm512_loadu_ps(s + 2 * i), ev,
                                                       _mm512_maskz_loadu_ps(0x7fff, s + 2 * i + 16)));
    for (; i < n; i++) d[i] = s[2 * i];
}

static void im2col_rows(const im2col_job *j, int64_t r0, int64_t r1) {
    const tb_nn_conv_geom *g = j->g;
    int64_t ohw = (j->oy1 - j->oy0) * g->ow;
    for (int64_t r = r0; r < r1; r++) {
        int64_t c = r / (g->kh * g->kw);
        int ky = (int)(r / g->kw % g->kh), kx = (int)(r % g->kw);
        const float *xc = j->x + c * g->h * g->w;
        float *dst = j->col + r * ohw;
        /* the range of ox whose input column is inside the image */
        int64_t off = (int64_t)kx * g->dw - g->pl;
        int64_t lo = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;
        int64_t hi = g->w - 1 - off < 0 ? 0 : (g->w - 1 - off) / g->sw + 1;
        if (hi > g->ow) hi = g->ow;
        if (lo > hi) lo = hi;
        for (int64_t oy = j->oy0; oy < j->oy1; oy++) {
            int64_t iy = oy * g->sh - g->pt + (int64_t)ky * g->dh;
            float *d = dst + (oy - j->oy0) * g->ow;
            if (iy < 0 || iy >= g->h) {
                memset(d, 0, sizeof(float) * (size_t)g->ow);
                continue;
            }
            const float *s = xc + iy * g->w + off;
            for (int64_t ox = 0; ox < lo; ox++) d[ox] = 0.0f;
            if (g->sw == 1) memcpy(d + lo, s + lo, sizeof(float) * (size_t)(hi - lo));
            else if (g->sw == 2 && j->wide) copy_stride2_512(d + lo, s + 2 * lo, hi - lo);
            else
                for (int64_t ox = lo; ox < hi; ox++) d[ox] = s[ox * g->sw];
            for (int64_t ox = hi; ox < g->ow; ox++) d[ox] = 0.0f;
        }
    }
}

static void im2col_run(void *arg, int ith, int nth) {
    im2col_job *j = arg;
    im2col_rows(j, j->rows * ith / nth, j->rows * (ith + 1) / nth);
}

/* depthwise: each output channel m reads input channel m / mg alone */
typedef struct {
    const tb_nn_conv_geom *g;
    const float *x, *w, *bias, *res;
    float *y;
    int act, after;
    float p0, p1;
} dw_job;

static void dw_channel(const dw_job *j, int64_t b, int64_t m) {
    const tb_nn_conv_geom *g = j->g;
    int64_t mg = g->m / g->group;
    const float *xc = j->x + (b * g->c + m / mg) * g->h * g->w;
    const float *wk = j->w + m * g->kh * g->kw;
    int64_t o0 = (b * g->m + m) * g->oh * g->ow;
    float *y = j->y + o0;
    float bv = j->bias ? j->bias[m] : 0.0f;
    for (int64_t oy = 0; oy < g->oh; oy++)
        for (int64_t ox = 0; ox < g->ow; ox++) {
            float acc = bv;
            for (int ky = 0; ky < g->kh; ky++) {
                int64_t iy = oy * g->sh - g->pt + (int64_t)ky * g->dh;
                if (iy < 0 || iy >= g->h) continue;
                const float *xr = xc + iy * g->w;
                for (int kx = 0; kx < g->kw; kx++) {
                    int64_t ix = ox * g->sw - g->pl + (int64_t)kx * g->dw;
                    if (ix >= 0 && ix < g->w) acc += xr[ix] * wk[ky * g->kw + kx];
                }
            }
            y[oy * g->ow + ox] = acc;
        }
    /* the epilogue over the channel's plane, vectorised by the sgemm code */
    tb_cpu_sgemm_epi e = {0};
    e.res = j->res ? j->res + o0 : NULL;
    e.ld_res = g->oh * g->ow;
    e.act = j->act;
    e.p0 = j->p0;
    e.p1 = j->p1;
    e.act_after_res = j->after;
    tb_cpu_nn_epilogue(y, g->oh * g->ow, 1, g->oh * g->ow, &e);
}

static void dw_run(void *arg, int ith, int nth) {
    dw_job *j = arg;
    int64_t total = j->g->n * j->g->m;
    for (int64_t t = total * ith / nth; t < total * (ith + 1) / nth; t++) dw_channel(j, t / j->g->m, t % j->g->m);
}

/* The Winograd form that pays for a 3x3 stride-1 geometry, else AUTO
 * (im2col): enough channels and tiles (a GEMM of N = tiles under 32 wastes
 * most of the kernel's width), tile buffers within 256 MB; F(4x4) (a quarter
 * of the products, AVX-512 transforms) in phases when an image has 40
 * tiles or more, by tile blocks when a batch of smaller maps has 32. A map
 * of fewer tiles (7x7: 16) takes F(2x2) when enough images share its GEMMs
 * (winograd.c batches up to 128 tiles): 96 or more, as at batch 8 of
 * ResNet-18's layer4, where it beat the direct kernel by ~8% on one thread
 * (bench/nn_bench -b 8). */
static int conv_winograd_tactic(const tb_nn_conv_geom *g) {
    int64_t t2 = ((g->oh + 1) / 2) * ((g->ow + 1) / 2), t4 = ((g->oh + 3) / 4) * ((g->ow + 3) / 4);
    if (g->c < 16 || g->m < 16) return TB_CONV_TACTIC_AUTO;
    /* F(4x4) by tile blocks (its buffers are per thread, a block's) where a
     * batch of small maps fills blocks of 32 tiles: 7x7, 14x14 and 28x28
     * maps at batch 8 (6.5-8.2, 6.8-8.5 and 5.6-7.6 ms on one thread,
     * against 9.1-10.9 and 7.8-8.8 for F(2x2), 9.3-10.8 for the direct
     * kernel on 7x7 and 6.6-8.9 for F(4x4) in phases on 28x28, nn_bench -b 8
     * -c). One image's large map keeps F(4x4) in phases: every block
     * reads all of U again, which lost on weights from memory (28x28 at
     * batch 1, cold: 0.75 against 0.68 ms) and on 56x56 at batch 8. */
    if (tb_cpu_features() & TB_CPU_AVX512F) {
        if (g->n > 1 && t4 < 100 && g->n * t4 >= 32) return TB_CONV_TACTIC_WINOGRAD4F;
        if (t4 >= 40) return TB_CONV_TACTIC_WINOGRAD4;
    }
    if (16.0 * (double)(g->c + g->m) * (double)t2 * 4 >= 256e6) return TB_CONV_TACTIC_AUTO;
    int64_t per_gemm = t2 > 0 ? (128 + t2 - 1) / t2 : 1, imgs = g->n < per_gemm ? g->n : per_gemm;
    return t2 >= 32 || (t2 >= 9 && t2 * imgs >= 96) ? TB_CONV_TACTIC_WINOGRAD : TB_CONV_TACTIC_AUTO;
}

int tb_cpu_conv_rule(const tb_nn_conv_geom *g) {
    if (g->group != 1 || g->c == 1) return TB_CONV_TACTIC_AUTO;
    int wino_ok = g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1;
    int t = wino_ok ? conv_winograd_tactic(g) : TB_CONV_TACTIC_AUTO;
    if (t != TB_CONV_TACTIC_AUTO) return t;
    int direct = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && !g->pt && !g->pl && !g->pb && !g->pr;
    return tb_cpu_conv_direct_ok(g) && !direct ? TB_CONV_TACTIC_DIRECT : TB_CONV_TACTIC_IM2COL;
}

int tb_cpu_conv_tactic(const tb_node *n, const tb_nn_conv_geom *g) {
    int t = n->tactic & 0xff, batch = (n->tactic >> TB_CONV_TACTIC_BATCH_SHIFT) & 0xff;
    if (t == TB_CONV_TACTIC_AUTO || (batch && g->n != batch)) return tb_cpu_conv_rule(g);
    return t;
}

static tb_status conv_kernel(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    tb_nn_conv_geom g;
    TB_TRY(tb_nn_conv_geometry(n, &in[0], &in[1], &g));
    int flags = n->i[11], act = n->i[10];
    int bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    const float *x = in[0].data, *w = in[1].data;
    const float *bias = bi >= 0 ? in[bi].data : NULL, *res = ri >= 0 ? in[ri].data : NULL;
    float *y = out[0].data;
    int64_t cg = g.c / g.group, mg = g.m / g.group, ohw = g.oh * g.ow, hw = g.h * g.w;
    int tactic = tb_cpu_conv_tactic(n, &g); /* the node's, or the rule's at this batch */

    if (cg == 1 && tactic != TB_CONV_TACTIC_IM2COL) {
        dw_job j = {&g, x, w, bias, res, y, act, (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0, n->f[0], n->f[1]};
        if (pool_threads(ctx->pool) > 1 && g.n * g.m > 1) tb_pool_run(ctx->pool, dw_run, &j);
        else dw_run(&j, 0, 1);
        return TB_OK;
    }
    int wino_ok = g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.group == 1;
    if (wino_ok && tactic == TB_CONV_TACTIC_AUTO) tactic = conv_winograd_tactic(&g);
    if (wino_ok && tactic == TB_CONV_TACTIC_WINOGRAD4F)
        return tb_cpu_conv_winograd4_fused(ctx, n, &g, x, w, bias, res, y);
    if (wino_ok && (tactic == TB_CONV_TACTIC_WINOGRAD || tactic == TB_CONV_TACTIC_WINOGRAD4))
        return tb_cpu_conv_winograd(ctx, n, &g, tactic == TB_CONV_TACTIC_WINOGRAD4, x, w, bias, res, y);

    int direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && !g.pt && !g.pl && !g.pb && !g.pr;
    if (tb_cpu_conv_direct_ok(&g) && (tactic == TB_CONV_TACTIC_DIRECT || (tactic == TB_CONV_TACTIC_AUTO && !direct)))
        return tb_cpu_conv_direct(ctx, n, &g, x, w, bias, res, y);
    int64_t krows = cg * g.kh * g.kw;
    int64_t chunk = g.oh; /* output rows per im2col chunk */
    float *col = NULL;
    if (!direct) {
        size_t row_bytes = sizeof(float) * (size_t)(krows * g.ow);
        chunk = (int64_t)(IM2COL_MAX_BYTES / row_bytes);
        chunk = chunk < 1 ? 1 : chunk > g.oh ? g.oh : chunk;
        col = tb_cpu_nn_scratch(ctx, row_bytes * (size_t)chunk);
        if (!col) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for im2col (%lld x %lld)", (long long)krows,
                                   (long long)(chunk * g.ow));
    }
    tb_cpu_sgemm_epi e = {0};
    e.bias_rs = 1;
    e.ld_res = ohw;
    e.act = act;
    e.p0 = n->f[0];
    e.p1 = n->f[1];
    e.act_after_res = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    for (int64_t b = 0; b < g.n; b++)
        for (int gi = 0; gi < g.group; gi++) {
            const float *xg = x + (b * g.c + gi * cg) * hw;
            int64_t o0 = (b * g.m + gi * mg) * ohw;
            e.bias = bias ? bias + gi * mg : NULL;
            if (direct) {
                e.res = res ? res + o0 : NULL;
                tb_cpu_sgemm_ex(0, 0, mg, ohw, krows, 1.0f, w + gi * mg * krows, krows, xg, ohw, 0.0f, y + o0, ohw, &e,
                                ctx->pool);
                continue;
            }
            for (int64_t oy = 0; oy < g.oh; oy += chunk) {
                int64_t oy1 = oy + chunk < g.oh ? oy + chunk : g.oh, cols = (oy1 - oy) * g.ow;
                im2col_job j = {&g, xg, col, krows, (tb_cpu_features() & TB_CPU_AVX512F) != 0, oy, oy1};
                if (pool_threads(ctx->pool) > 1 && krows * cols >= 16384) tb_pool_run(ctx->pool, im2col_run, &j);
                else im2col_rows(&j, 0, krows);
                e.res = res ? res + o0 + oy * g.ow : NULL;
                tb_cpu_sgemm_ex(0, 0, mg, cols, krows, 1.0f, w + gi * mg * krows, krows, col, cols, 0.0f,
                                y + o0 + oy * g.ow, ohw, &e, ctx->pool);
            }
        }
    return TB_OK;
}

/* ---------------------------------------------------------------- packed weights */

/* The one cache of weights in a kernel's own layout (the GEMM's B panels,
 * Winograd's transformed U, the direct conv's 64-channel panels): a weight
 * of the graph is constant for the context's life (weights are never
 * written), so each form is made once, on its first use, and read from
 * there on every run; found by address, form and shape (no content hash:
 * only graph weights are cached, inputs of any other kind are the caller's
 * to transform per call). Freed with the context (tb_cpu_nn_ctx_release).
 * Like the scratch, the table belongs to the context's one running node at
 * a time. */
typedef struct {
    const float *w;
    int kind;
    int64_t d0, d1, d2;
    float *p;
} wpack_entry;

typedef struct {
    wpack_entry *slots; /* open addressing; cap a power of 2, at most half full */
    size_t cap, n;
    /* the packed copies, bump-allocated from chunks advised to take huge
     * pages: a first touch of 4 KB pages costs about as much as the packing
     * itself (seconds for BERT-base's 340 MB in a VM), and the streams of
     * B miss the TLB less */
    void **chunks;
    size_t n_chunks, cap_chunks;
    uint8_t *free_at;
    size_t left;
} wpack_table;

#define WPACK_CHUNK ((size_t)64 << 20)
#define WPACK_HUGE ((size_t)2 << 20)

static float *wpack_alloc(wpack_table *t, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (bytes > t->left) {
        size_t sz = bytes > WPACK_CHUNK ? (bytes + WPACK_HUGE - 1) / WPACK_HUGE * WPACK_HUGE : WPACK_CHUNK;
        if (t->n_chunks == t->cap_chunks) {
            size_t cap = t->cap_chunks ? 2 * t->cap_chunks : 8;
            void **c = realloc(t->chunks, cap * sizeof *c);
            if (!c) return NULL;
            t->chunks = c;
            t->cap_chunks = cap;
        }
        uint8_t *p = tb_alloc_aligned(sz, WPACK_HUGE);
        if (!p) return NULL;
#ifdef MADV_HUGEPAGE
        madvise(p, sz, MADV_HUGEPAGE); /* advice only: 4 KB pages where refused */
#endif
        t->chunks[t->n_chunks++] = p;
        t->free_at = p;
        t->left = sz;
    }
    float *r = (float *)t->free_at;
    t->free_at += bytes;
    t->left -= bytes;
    return r;
}

static size_t wpack_slot(const wpack_table *t, const float *w, int kind, int64_t d0, int64_t d1) {
    uint64_t h = (uint64_t)(uintptr_t)w * 0x9e3779b97f4a7c15ull ^ (uint64_t)d0 * 0xc2b2ae3d27d4eb4full ^
                 (uint64_t)d1 ^ (uint64_t)kind << 56;
    return (size_t)(h ^ h >> 29) & (t->cap - 1);
}

static int wpack_insert(wpack_table *t, wpack_entry e) {
    if (2 * (t->n + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        wpack_entry *s = calloc(cap, sizeof *s);
        if (!s) return 0;
        wpack_entry *old = t->slots;
        size_t old_cap = t->cap;
        t->slots = s;
        t->cap = cap;
        t->n = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].p) wpack_insert(t, old[i]);
        free(old);
    }
    size_t i = wpack_slot(t, e.w, e.kind, e.d0, e.d1);
    while (t->slots[i].p) i = (i + 1) & (t->cap - 1);
    t->slots[i] = e;
    t->n++;
    return 1;
}

const float *tb_cpu_nn_wpack(tb_cpu_nn_ctx *ctx, const tb_node *n, int input, const float *w, int kind, int64_t d0,
                             int64_t d1, int64_t d2, size_t floats, tb_cpu_wpack_make make, const void *arg) {
    const tb_graph *g = ctx->graph;
    if (!g || input >= n->n_in || n->in[input] < 0 || n->in[input] >= g->n_values ||
        g->values[n->in[input]].kind != TB_VAL_WEIGHT || floats == 0)
        return NULL;
    wpack_table *t = ctx->wpack;
    if (!t) {
        t = ctx->wpack = calloc(1, sizeof *t);
        if (!t) return NULL;
    }
    if (t->cap)
        for (size_t i = wpack_slot(t, w, kind, d0, d1); t->slots[i].p; i = (i + 1) & (t->cap - 1)) {
            const wpack_entry *e = &t->slots[i];
            if (e->w == w && e->kind == kind && e->d0 == d0 && e->d1 == d1 && e->d2 == d2) return e->p;
        }
    float *p = wpack_alloc(t, sizeof(float) * floats);
    if (!p || !wpack_insert(t, (wpack_entry){w, kind, d0, d1, d2, p})) return NULL; /* a chunk's tail lost */
    make(w, p, arg);
    return p;
}

typedef struct {
    int tb;
    int64_t K, N, ldb;
} gemm_pack_arg;

static void gemm_pack_make(const float *w, float *dst, const void *arg) {
    const gemm_pack_arg *a = arg;
    tb_cpu_sgemm_pack_b(a->tb, a->K, a->N, w, a->ldb, dst);
}

/* The packed op(B) (K, N) of node n's input `input` when it is a weight,
 * packed now on its first use; NULL when it is not a weight (or on OOM:
 * the caller packs per call as before). */
static const float *wpack_get(tb_cpu_nn_ctx *ctx, const tb_node *n, int input, int tb, int64_t K, int64_t N,
                              const float *b, int64_t ldb) {
    if (K <= 0 || N <= 0) return NULL;
    gemm_pack_arg a = {tb, K, N, ldb};
    return tb_cpu_nn_wpack(ctx, n, input, b, TB_WPACK_GEMM_B, K, N, 2 * ldb + tb, tb_cpu_sgemm_packed_floats(K, N),
                           gemm_pack_make, &a);
}

void tb_cpu_nn_wpack_free(tb_cpu_nn_ctx *ctx) {
    wpack_table *t = ctx->wpack;
    if (!t) return;
    for (size_t i = 0; i < t->n_chunks; i++) tb_free_aligned(t->chunks[i]);
    free(t->chunks);
    free(t->slots);
    free(t);
    ctx->wpack = NULL;
}

/* ---------------------------------------------------------------- Gemm */

static tb_status gemm_kernel(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    int ta = n->i[0], tb = n->i[1], act = n->i[2], flags = n->i[3];
    int64_t M = out[0].dims[0], N = out[0].dims[1], K = in[0].dims[ta ? 0 : 1];
    int bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    tb_cpu_sgemm_epi e = {0};
    if (bi >= 0 && n->f[1] != 0.0f) {
        const tb_view *c = &in[bi];
        int64_t cm = c->rank == 2 ? c->dims[0] : 1, cn = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
        e.bias = c->data;
        e.bias_cs = cn == 1 ? 0 : 1;
        e.bias_rs = cm == 1 ? 0 : cn;
        e.bias_scale = n->f[1];
    }
    e.res = ri >= 0 ? in[ri].data : NULL;
    e.ld_res = N;
    e.act = act;
    e.p0 = n->f[2];
    e.p1 = n->f[3];
    e.act_after_res = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    const float *bp = wpack_get(ctx, n, 1, tb, K, N, in[1].data, in[1].dims[1]);
    if (bp)
        tb_cpu_sgemm_packed(ta, M, N, K, n->f[0], in[0].data, in[0].dims[1], bp, 0.0f, out[0].data, N, &e,
                            ctx->pool);
    else
        tb_cpu_sgemm_ex(ta, tb, M, N, K, n->f[0], in[0].data, in[0].dims[1], in[1].data, in[1].dims[1], 0.0f,
                        out[0].data, N, &e, ctx->pool);
    return TB_OK;
}

/* ---------------------------------------------------------------- MatMul */

/* offset in matrices of an operand with batch dims bd[nb] for output batch
 * index ob over the output's batch dims obd[rb] (broadcasting) */
static int64_t batch_offset(int nb, const int64_t *bd, int rb, const int64_t *obd, int64_t ob) {
    int64_t off = 0, stride = 1;
    for (int d = rb - 1; d >= 0; d--) {
        int64_t idx = ob % obd[d];
        ob /= obd[d];
        int sd = d - (rb - nb);
        if (sd < 0) continue;
        if (bd[sd] != 1) off += idx * stride;
        stride *= bd[sd];
    }
    return off;
}

typedef struct {
    int ta, tb;
    int64_t M, N, K, lda, ldb, nbatch;
    int rb, nba, nbb;
    const int64_t *obd, *bda, *bdb;
    const float *A, *B;
    const float *Bp; /* B packed (a weight shared by every batch), else NULL */
    float *Y;
    float alpha;
    const tb_cpu_sgemm_epi *e;
    tb_pool *pool; /* the inner GEMMs' pool (NULL when the batches are split) */
} mm_job;

static void mm_batch(const mm_job *j, int64_t ob) {
    const float *A = j->A + batch_offset(j->nba, j->bda, j->rb, j->obd, ob) * j->M * j->K;
    const float *B = j->B + batch_offset(j->nbb, j->bdb, j->rb, j->obd, ob) * j->K * j->N;
    tb_cpu_sgemm_epi e = *j->e;
    if (e.res) e.res += ob * j->M * j->N;
    if (j->Bp)
        tb_cpu_sgemm_packed(j->ta, j->M, j->N, j->K, j->alpha, A, j->lda, j->Bp, 0.0f, j->Y + ob * j->M * j->N, j->N,
                            &e, j->pool);
    else
        tb_cpu_sgemm_ex(j->ta, j->tb, j->M, j->N, j->K, j->alpha, A, j->lda, B, j->ldb, 0.0f,
                        j->Y + ob * j->M * j->N, j->N, &e, j->pool);
}

static void mm_run(void *arg, int ith, int nth) {
    mm_job *j = arg;
    for (int64_t b = j->nbatch * ith / nth; b < j->nbatch * (ith + 1) / nth; b++) mm_batch(j, b);
}

static tb_status matmul_kernel(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in,
                               const tb_view *out, int n_out) {
    const tb_view *a = &in[0], *b = &in[1];
    int ta = a->rank > 1 && n->i[0], tb = b->rank > 1 && n->i[1], act = n->i[2], flags = n->i[3];
    int64_t M = a->rank > 1 ? a->dims[a->rank - (ta ? 1 : 2)] : 1;
    int64_t K = a->rank > 1 ? a->dims[a->rank - (ta ? 2 : 1)] : a->dims[0];
    int64_t N = b->rank > 1 ? b->dims[b->rank - (tb ? 2 : 1)] : 1;
    int64_t lda = a->rank > 1 ? a->dims[a->rank - 1] : K, ldb = b->rank > 1 ? b->dims[b->rank - 1] : 1;
    int rb = out[0].rank - (a->rank > 1) - (b->rank > 1);
    int nba = a->rank > 1 ? a->rank - 2 : 0, nbb = b->rank > 1 ? b->rank - 2 : 0;
    int64_t nbatch = 1, nb_b = 1;
    for (int d = 0; d < rb; d++) nbatch *= out[0].dims[d];
    for (int d = 0; d < nbb; d++) nb_b *= b->dims[d];
    int bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    tb_cpu_sgemm_epi e = {0};
    if (bi >= 0) {
        e.bias = in[bi].data;
        e.bias_cs = 1;
    }
    e.res = ri >= 0 ? in[ri].data : NULL;
    e.ld_res = N;
    e.act = act;
    e.p0 = n->f[2];
    e.p1 = n->f[3];
    e.act_after_res = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    float alpha = n->f[0] != 0.0f ? n->f[0] : 1.0f;
    /* one weight-like b shared by every batch and a stored (..., M, K): one
     * GEMM over all the rows of a (the (B, S, K) x (K, N) case) */
    const float *bp = nb_b == 1 ? wpack_get(ctx, n, 1, tb, K, N, b->data, ldb) : NULL;
    if (nb_b == 1 && !ta && nbatch * M == tb_view_numel(a) / K) {
        if (bp)
            tb_cpu_sgemm_packed(0, nbatch * M, N, K, alpha, a->data, lda, bp, 0.0f, out[0].data, N, &e, ctx->pool);
        else
            tb_cpu_sgemm_ex(0, tb, nbatch * M, N, K, alpha, a->data, lda, b->data, ldb, 0.0f, out[0].data, N, &e,
                            ctx->pool);
        return TB_OK;
    }
    mm_job j = {ta, tb, M, N, K, lda, ldb, nbatch, rb, nba, nbb, out[0].dims, a->dims, b->dims,
                a->data, b->data, bp, out[0].data, alpha, &e, ctx->pool};
    int nth = pool_threads(ctx->pool);
    /* many small products: the threads take whole batches */
    if (nth > 1 && nbatch >= 2 * nth && (double)M * N * K < 4e6) {
        j.pool = NULL;
        tb_pool_run(ctx->pool, mm_run, &j);
    } else {
        mm_run(&j, 0, 1);
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- sdpa */

#define SDPA_SB 128 /* query rows per block: their scores (SB, T) stay in L1/L2 */

typedef struct {
    const tb_node *n;
    const float *q, *k, *v, *mask;
    const uint8_t *bmask;
    float *y, *scratch;
    tb_nn_sdpa_geom g; /* every layout's strides: (B, H, S, D), or (B, S, H*D) and packed q | k | v */
    int64_t B, H, S, T, D, Dv, mst[4];
    int kt, causal, mk;
    int wide; /* AVX-512 */
    int prefetch; /* q, k and v too big for the caches: the next block's prefetched */
    float scale;
    int64_t blocks_per_head, total;
    size_t per_thread;
} sdpa_job;

/* x[0, n) += m[0, n) */
__attribute__((target("avx512f"))) static void add_row512(float *x, const float *m, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(m + i)));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, m + i)));
    }
}

/* rows of `len` floats, `rs` floats apart, as cache lines to prefetch */
typedef struct {
    const char *base;
    int64_t lpr, rs, lines; /* lines per row, row stride in bytes, lines in all */
} sdpa_span;

static sdpa_span span_of(const float *p, int64_t rows, int64_t len, int64_t rs) {
    sdpa_span s = {(const char *)p, (len * (int64_t)sizeof(float) + 63) / 64, rs * (int64_t)sizeof(float), 0};
    s.lines = rows * s.lpr;
    return s;
}

static const char *span_line(const sdpa_span *s, int64_t l) { return s->base + l / s->lpr * s->rs + l % s->lpr * 64; }

static void sdpa_block(const sdpa_job *j, int64_t blk, float *sc) {
    int64_t bh = blk / j->blocks_per_head, s0 = blk % j->blocks_per_head * SDPA_SB;
    int64_t b = bh / j->H, h = bh % j->H, T = j->T;
    int sb = (int)(j->S - s0 < SDPA_SB ? j->S - s0 : SDPA_SB);
    const int64_t(*st)[4] = j->g.st;
    const int64_t *off = j->g.off;
    /* the head's q rows, k, v and output rows through the layout's strides:
     * in the (B, S, H*D) layouts of opt/nn_merge.c a head is a column block,
     * rows a whole width apart (no Transposes around the op, and q | k | v
     * may be column blocks of one merged projection) */
    const float *q = j->q + off[0] + b * st[0][0] + h * st[0][1] + s0 * st[0][2];
    const float *k = j->k + off[1] + b * st[1][0] + h * st[1][1];
    const float *v = j->v + off[2] + b * st[2][0] + h * st[2][1];
    float *y = j->y + off[3] + b * st[3][0] + h * st[3][1] + s0 * st[3][2];
    /* scores (sb, T) = scale q k^T (k rows = keys; with kt, k is (D, T)) */
    tb_cpu_sgemm_ex(0, !j->kt, sb, T, j->D, j->scale, q, st[0][2], k, j->kt ? st[1][3] : st[1][2], 0.0f, sc, T, NULL,
                    NULL);
    /* the next block's q, k and v (at batch 8 BERT-base's are 9 MB, out of
     * the caches) are prefetched into L2 a share per score row, so its
     * products and the gathers that pack k^T do not wait on memory: one
     * thread's sdpa at batch 8 went from 3.40-3.44 to 2.76-2.89 ms
     * (nn_bench -t 1 -c); at batch 1 (1.2 MB, in cache) it is not done */
    sdpa_span sp[3] = {{0}, {0}, {0}};
    if (j->prefetch && blk + 1 < j->total) {
        int64_t bh1 = (blk + 1) / j->blocks_per_head, s1 = (blk + 1) % j->blocks_per_head * SDPA_SB;
        int64_t b1 = bh1 / j->H, h1 = bh1 % j->H;
        int sb1 = (int)(j->S - s1 < SDPA_SB ? j->S - s1 : SDPA_SB);
        sp[0] = span_of(j->q + off[0] + b1 * st[0][0] + h1 * st[0][1] + s1 * st[0][2], sb1, j->D, st[0][2]);
        if (bh1 != bh) {
            const float *k1 = j->k + off[1] + b1 * st[1][0] + h1 * st[1][1];
            sp[1] = j->kt ? span_of(k1, j->D, T, st[1][3]) : span_of(k1, T, j->D, st[1][2]);
            sp[2] = span_of(j->v + off[2] + b1 * st[2][0] + h1 * st[2][1], T, j->Dv, st[2][2]);
        }
    }
    int64_t lines = sp[0].lines + sp[1].lines + sp[2].lines, per = (lines + sb - 1) / sb;
    for (int i = 0; i < sb; i++) {
        float *row = sc + (int64_t)i * T;
        int64_t s = s0 + i;
        for (int64_t l = i * per; l < (i + 1) * per && l < lines; l++) {
            int64_t m = l;
            int w = 0;
            while (m >= sp[w].lines) m -= sp[w++].lines;
            _mm_prefetch(span_line(&sp[w], m), _MM_HINT_T1);
        }
        if (j->mk) {
            int64_t mo = b * j->mst[0] + h * j->mst[1] + s * j->mst[2];
            if (j->mk == 1 && j->mst[3] == 1 && j->wide) /* a contiguous mask row */
                add_row512(row, j->mask + mo, T);
            else if (j->mk == 1)
                for (int64_t t = 0; t < T; t++) row[t] += j->mask[mo + t * j->mst[3]];
            else
                for (int64_t t = 0; t < T; t++)
                    if (!j->bmask[mo + t * j->mst[3]]) row[t] = -INFINITY;
        }
        if (j->causal)
            for (int64_t t = s + 1; t < T; t++) row[t] = -INFINITY;
        tb_cpu_nn_softmax_row(row, T);
    }
    /* out (sb, Dv) = P V */
    tb_cpu_sgemm_ex(0, 0, sb, j->Dv, T, 1.0f, sc, T, v, st[2][2], 0.0f, y, st[3][2], NULL, NULL);
}

static void sdpa_run(void *arg, int ith, int nth) {
    sdpa_job *j = arg;
    float *sc = j->scratch + j->per_thread * ith;
    for (int64_t t = j->total * ith / nth; t < j->total * (ith + 1) / nth; t++) sdpa_block(j, t, sc);
}

static tb_status sdpa_kernel(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    int r = in[0].rank;
    sdpa_job j;
    memset(&j, 0, sizeof j);
    /* every layout of ops_nn.h: (B, H, S, D), and the (B, S, H*D) "heads"
     * and "packed" layouts of opt/nn_merge.c, whose columns the kernel reads
     * in place */
    if (!tb_nn_sdpa_geometry(n, r, in[0].dims, in[1].dims, in[2].dims, &j.g))
        return tb_errorf(TB_ERR_FORMAT, "sdpa: operands do not fit the layout");
    j.n = n;
    j.q = in[0].data;
    j.k = in[1].data;
    j.v = in[2].data;
    j.y = out[0].data;
    j.B = j.g.B;
    j.H = j.g.H;
    j.S = j.g.S;
    j.D = j.g.D;
    j.T = j.g.T;
    j.Dv = j.g.Dv;
    j.kt = n->i[1];
    j.causal = n->i[0];
    j.mk = n->i[2];
    j.wide = (tb_cpu_features() & TB_CPU_AVX512F) != 0;
    j.scale = n->f[0] != 0.0f ? n->f[0] : (float)(1.0 / sqrt((double)j.D));
    if (j.mk) {
        /* the mask broadcasts to the logical (B, H, S, T) in every layout */
        int mr = n->i[3] > 0 ? 4 : r;
        tb_nn_sdpa_mask_strides(&in[3], mr, j.mst + (4 - mr));
        if (j.mk == 1) j.mask = in[3].data;
        else j.bmask = in[3].data;
    }
    if (j.S == 0 || j.Dv == 0 || j.B * j.H == 0) return TB_OK;
    if (j.T == 0) { /* every layout's output is B H S Dv floats without gaps */
        memset(j.y, 0, sizeof(float) * (size_t)(j.B * j.H * j.S * j.Dv));
        return TB_OK;
    }
    j.blocks_per_head = (j.S + SDPA_SB - 1) / SDPA_SB;
    j.prefetch = (double)sizeof(float) * (double)(j.B * j.H) * (double)(j.S * j.D + j.T * (j.D + j.Dv)) > 4e6;
    j.total = j.B * j.H * j.blocks_per_head;
    int nth = pool_threads(ctx->pool);
    j.per_thread = ((size_t)SDPA_SB * (size_t)j.T + 15) & ~(size_t)15;
    j.scratch = tb_cpu_nn_scratch(ctx, sizeof(float) * j.per_thread * (size_t)nth);
    if (!j.scratch) return tb_errorf(TB_ERR_OOM, "sdpa: out of memory for scores");
    if (nth > 1 && j.total > 1) tb_pool_run(ctx->pool, sdpa_run, &j);
    else sdpa_run(&j, 0, 1);
    (void)n_in;
    (void)n_out;
    return TB_OK;
}

/* ---------------------------------------------------------------- table */

tb_cpu_nn_fn tb_cpu_nn_conv_kernel(tb_op_kind k) {
    switch (k) {
    case TB_OP_CONV: return conv_kernel;
    case TB_OP_GEMM: return gemm_kernel;
    case TB_OP_NN_MATMUL: return matmul_kernel;
    case TB_OP_SDPA: return sdpa_kernel;
    default: return NULL;
    }
}
