/*
 * conv_direct.c — Conv (one group, any kernel, stride, dilation and pads) as
 * a direct product over output pixels, AVX-512:
 *
 *   Y^T (pixels, M) = X~ (pixels, C kh kw) W^T (C kh kw, M)
 *
 * with the output channels in the vector lanes and the input pixels
 * broadcast from the (zero-padded) input plane itself, so no im2col is made.
 * The register tile is RT (6) output pixels by 64 output channels (24 zmm
 * accumulators; per tap 4 weight loads and 6 broadcasts for 24 FMAs); its
 * pixels are any 6 of the block (from a table of their input addresses), so
 * a tile runs across row and image ends, and a small map (7x7, 14x14) wastes
 * nothing, unlike the (M, pixels) GEMM whose 32-wide kernel runs over the
 * pixels.
 *
 * The weights are packed once per context into panels of 64 channels,
 * [panel][k][64] (k = (c kh + ky) kw + kx, the missing channels zero), in
 * the context's packed-weight cache (nn_conv_impl.h), as the Winograd and
 * GEMM weights are. The work items are (panel, block of output rows of all the
 * images):
 * the block's Y^T (at most a few hundred pixels by 64) stays in a per-thread
 * buffer in L1/L2 while the K loop runs in blocks of channels whose weights
 * (32 KB at most) stay in L1; then it is transposed into Y (NCHW) and the
 * epilogue (bias, activation, residual) runs on it while it is in cache.
 */
#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>

#define D512 __attribute__((target("avx512f,avx512dq,avx2,fma")))
#define D512_INLINE static inline __attribute__((target("avx512f,avx512dq,avx2,fma"), always_inline))

#define PANEL 64              /* output channels per weight panel */
#define RT 6                  /* output pixels per register tile */
#define KBLOCK_TAPS 128       /* K taps per block: 128 x 64 floats of weights (32 KB) */
#define BLOCK_PIXELS 512      /* output pixels per work item (its Y^T: 128 KB) */

/* ---------------------------------------------------------------- weights */

typedef struct {
    int64_t m, k;
} wshape;

static void weights_pack(const float *w, float *p, const void *arg) {
    const wshape *s = arg;
    int64_t M = s->m, K = s->k, np = (M + PANEL - 1) / PANEL;
    for (int64_t pi = 0; pi < np; pi++)
        for (int64_t k = 0; k < K; k++) {
            float *d = p + (pi * K + k) * PANEL;
            for (int j = 0; j < PANEL; j++) {
                int64_t m = pi * PANEL + j;
                d[j] = m < M ? w[m * K + k] : 0.0f;
            }
        }
}

/* The packed weights of node n's w (M, K): from the context's cache when w
 * is a graph weight (packed on its first use), else packed now into *own
 * (the caller frees it); NULL on OOM. */
static const float *weights_get(tb_cpu_nn_ctx *ctx, const tb_node *n, const float *w, int64_t M, int64_t K,
                                float **own) {
    size_t floats = (size_t)((M + PANEL - 1) / PANEL * K * PANEL);
    wshape sh = {M, K};
    *own = NULL;
    const float *p = tb_cpu_nn_wpack(ctx, n, 1, w, TB_WPACK_DIRECT, M, K, 0, floats, weights_pack, &sh);
    if (p) return p;
    float *q = tb_alloc_aligned(sizeof(float) * floats, 64);
    if (!q) return NULL;
    weights_pack(w, q, &sh);
    *own = q;
    return q;
}

/* ---------------------------------------------------------------- tile kernel */

/* out[i][0, 64) (+)= sum over the taps of w[tap][0, 64) px[i][tap offset],
 * i < R: the pixels' first taps px[i] (any pixels: the tile may cross rows
 * and images), the taps by rows (nrow offsets rowoff, a channel and a ky
 * each) of kw taps dw apart; w: the taps' weights in order, 64 a tap. */
D512_INLINE void tile_t(const float *const *px, const int64_t *rowoff, int nrow, int kw, int64_t dw, const float *w,
                        float *out, int first, const int R) {
    __m512 acc[RT][4];
    const float *p[RT];
#pragma GCC unroll 6
    for (int i = 0; i < R; i++) p[i] = px[i];
#pragma GCC unroll 6
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[i][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(out + i * PANEL + 16 * v);
    for (int q = 0; q < nrow; q++) {
        int64_t t = rowoff[q];
        for (int kx = 0; kx < kw; kx++, t += dw, w += PANEL) {
            __m512 w0 = _mm512_load_ps(w), w1 = _mm512_load_ps(w + 16), w2 = _mm512_load_ps(w + 32),
                   w3 = _mm512_load_ps(w + 48);
#pragma GCC unroll 6
            for (int i = 0; i < R; i++) {
                __m512 b = _mm512_set1_ps(p[i][t]);
                acc[i][0] = _mm512_fmadd_ps(w0, b, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(w1, b, acc[i][1]);
                acc[i][2] = _mm512_fmadd_ps(w2, b, acc[i][2]);
                acc[i][3] = _mm512_fmadd_ps(w3, b, acc[i][3]);
            }
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) _mm512_store_ps(out + i * PANEL + 16 * v, acc[i][v]);
}

typedef void (*tile_fn)(const float *const *px, const int64_t *rowoff, int nrow, int kw, int64_t dw, const float *w,
                        float *out, int first);

#define TILE_FN(R)                                                                                                   \
    static D512 void tile_##R(const float *const *px, const int64_t *rowoff, int nrow, int kw, int64_t dw,            \
                              const float *w, float *out, int first) {                                               \
        tile_t(px, rowoff, nrow, kw, dw, w, out, first, R);                                                          \
    }
TILE_FN(1)
TILE_FN(2)
TILE_FN(3)
TILE_FN(4)
TILE_FN(5)
TILE_FN(6)

static const tile_fn tile_fns[RT + 1] = {NULL, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};

/* r[q][l] = r[l][q]: 16 x 16 in registers */
D512_INLINE void tr16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
            t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
        }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
    }
}

/* y[j][0, np) = epi(buf[0, np)[j]) for j < nm: the block's Y^T (np, 64)
 * into its NCHW place (rows of ld), by 16 x 16 transposes, with the bias,
 * activation (none, relu, clip; fuse 0: none at all) and residual (rows of
 * ld) on the way */
static D512 void transpose_out(const float *buf, int64_t np, int nm, float *y, int64_t ld, const float *bias,
                               const float *res, int fuse, int act, float p0, float p1, int after) {
    const __m512 lo = _mm512_set1_ps(act == TB_NN_ACT_RELU ? 0.0f : p0);
    const __m512 hi = _mm512_set1_ps(act == TB_NN_ACT_RELU ? INFINITY : p1);
    int clamp = fuse && act != TB_NN_ACT_NONE;
    for (int64_t p = 0; p < np; p += 16) {
        int n = (int)(np - p < 16 ? np - p : 16);
        __mmask16 m = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
        for (int j0 = 0; j0 < nm; j0 += 16) {
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = _mm512_maskz_load_ps(i < n ? (__mmask16)0xffff : 0, buf + (p + (i < n ? i : 0)) * PANEL + j0);
            tr16(r);
            int nj = nm - j0 < 16 ? nm - j0 : 16;
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; jj++) {
                if (jj >= nj) break;
                int64_t o = (int64_t)(j0 + jj) * ld + p;
                __m512 v = r[jj];
                if (fuse) {
                    if (bias) v = _mm512_add_ps(v, _mm512_set1_ps(bias[j0 + jj]));
                    __m512 q = res ? _mm512_maskz_loadu_ps(m, res + o) : _mm512_setzero_ps();
                    if (after) v = _mm512_add_ps(v, q);
                    if (clamp) v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                    if (!after) v = _mm512_add_ps(v, q);
                }
                _mm512_mask_storeu_ps(y + o, m, v);
            }
        }
    }
}

/* ---------------------------------------------------------------- driver */

typedef struct {
    const tb_nn_conv_geom *g;
    const float *wp; /* packed weights */
    const float *x;  /* input (n, c, hp, wpd): padded, or x itself */
    int64_t hp, wpd;
    const float *bias, *res;
    float *y;
    tb_cpu_sgemm_epi e; /* act, p0, p1, after (bias and res set per block) */
    int64_t rows_blk, nrb, npanel, items;
    int cb; /* input channels per K block */
    float *buf;
    size_t buf_floats; /* Y^T of a block */
    size_t per_thread; /* floats of scratch a thread */
} dconv_job;

static void dconv_item(const dconv_job *j, int64_t t, float *buf) {
    const tb_nn_conv_geom *g = j->g;
    /* rows r of all the images' output rows (image r / oh, row r % oh) */
    int64_t rb = t % j->nrb, pi = t / j->nrb, rows = g->n * g->oh;
    int64_t r0 = rb * j->rows_blk, r1 = r0 + j->rows_blk < rows ? r0 + j->rows_blk : rows;
    int64_t K = g->c * g->kh * g->kw, cs = j->hp * j->wpd, ohw = g->oh * g->ow;
    const float *wpanel = j->wp + pi * K * PANEL;
    /* the block's pixels' first taps (channel 0), and the tap rows of a
     * block of channels */
    float *obuf = buf;
    const float **px = (const float **)(buf + j->buf_floats);
    int64_t *rowoff = (int64_t *)(px + j->rows_blk * g->ow);
    int64_t npx = (r1 - r0) * g->ow;
    for (int64_t r = r0, q = 0; r < r1; r++) {
        const float *xr = j->x + r / g->oh * g->c * cs + r % g->oh * g->sh * j->wpd;
        for (int64_t ox = 0; ox < g->ow; ox++) px[q++] = xr + ox * g->sw;
    }
    for (int c = 0; c < j->cb; c++)
        for (int ky = 0; ky < g->kh; ky++) rowoff[c * g->kh + ky] = c * cs + ky * g->dh * j->wpd;
    for (int64_t c0 = 0; c0 < g->c; c0 += j->cb) {
        int nc = (int)(g->c - c0 < j->cb ? g->c - c0 : j->cb);
        const float *wk = wpanel + c0 * g->kh * g->kw * PANEL;
        int64_t shift = c0 * cs;
        for (int64_t q = 0; q < npx; q += RT) {
            int R = (int)(npx - q < RT ? npx - q : RT);
            const float *p[RT];
            for (int i = 0; i < R; i++) p[i] = px[q + i] + shift;
            tile_fns[R](p, rowoff, nc * (int)g->kh, (int)g->kw, g->dw, wk, obuf + q * PANEL, c0 == 0);
        }
    }
    int64_t m0 = pi * PANEL;
    int nm = (int)(g->m - m0 < PANEL ? g->m - m0 : PANEL);
    const float *bias = j->bias ? j->bias + m0 : NULL;
    int act = j->e.act;
    int fuse = act == TB_NN_ACT_NONE || act == TB_NN_ACT_RELU || act == TB_NN_ACT_CLIP;
    /* into Y by runs of rows of one image */
    for (int64_t r = r0; r < r1;) {
        int64_t b = r / g->oh, oy = r % g->oh, e1 = (b + 1) * g->oh < r1 ? (b + 1) * g->oh : r1;
        int64_t np = (e1 - r) * g->ow, o = (b * g->m + m0) * ohw + oy * g->ow;
        float *y = j->y + o;
        const float *res = j->res ? j->res + o : NULL;
        transpose_out(buf + (r - r0) * g->ow * PANEL, np, nm, y, ohw, bias, res, fuse, act, j->e.p0, j->e.p1,
                      j->e.act_after_res);
        if (!fuse) { /* the other activations by the sgemm epilogue, on the block while it is in cache */
            tb_cpu_sgemm_epi e = j->e;
            e.bias = bias;
            e.bias_rs = 1;
            e.res = res;
            e.ld_res = ohw;
            tb_cpu_nn_epilogue(y, ohw, nm, np, &e);
        }
        r = e1;
    }
}

static void dconv_run(void *arg, int ith, int nth) {
    dconv_job *j = arg;
    float *buf = j->buf + j->per_thread * (size_t)ith;
    for (int64_t t = j->items * ith / nth; t < j->items * (ith + 1) / nth; t++) dconv_item(j, t, buf);
}

/* the zero-padded input planes: (n c, hp, wpd) */
typedef struct {
    const tb_nn_conv_geom *g;
    const float *x;
    float *xp;
    int64_t hp, wpd;
} pad_job;

static void pad_run(void *arg, int ith, int nth) {
    pad_job *j = arg;
    const tb_nn_conv_geom *g = j->g;
    int64_t planes = g->n * g->c;
    for (int64_t p = planes * ith / nth; p < planes * (ith + 1) / nth; p++) {
        const float *s = j->x + p * g->h * g->w;
        float *d = j->xp + p * j->hp * j->wpd;
        memset(d, 0, sizeof(float) * (size_t)(g->pt * j->wpd));
        for (int64_t r = 0; r < g->h; r++) {
            float *dr = d + (g->pt + r) * j->wpd;
            memset(dr, 0, sizeof(float) * (size_t)g->pl);
            memcpy(dr + g->pl, s + r * g->w, sizeof(float) * (size_t)g->w);
            memset(dr + g->pl + g->w, 0, sizeof(float) * (size_t)(j->wpd - g->pl - g->w));
        }
        memset(d + (g->pt + g->h) * j->wpd, 0, sizeof(float) * (size_t)((j->hp - g->pt - g->h) * j->wpd));
    }
}

int tb_cpu_conv_direct_ok(const tb_nn_conv_geom *g) {
    return g->group == 1 && (tb_cpu_features() & TB_CPU_AVX512F) && g->oh > 0 && g->ow > 0;
}

tb_status tb_cpu_conv_direct(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_nn_conv_geom *g, const float *x,
                             const float *w, const float *bias, const float *res, float *y) {
    TB_ASSERT(tb_cpu_conv_direct_ok(g));
    dconv_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    int64_t K = g->c * g->kh * g->kw;
    int nth = ctx->pool ? tb_pool_size(ctx->pool) : 1;
    /* the padded plane: the rows and columns the taps read (pads may be
     * larger than needed, or the last rows and columns never read) */
    int64_t need_h = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1;
    int64_t need_w = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1;
    int pad = g->pt || g->pl || need_h > g->h || need_w > g->w;
    j.hp = pad ? (g->pt + g->h > need_h ? g->pt + g->h : need_h) : g->h;
    j.wpd = pad ? (g->pl + g->w > need_w ? g->pl + g->w : need_w) : g->w;
    j.npanel = (g->m + PANEL - 1) / PANEL;
    /* blocks of rows over all the images (a panel's weights serve them all) */
    int64_t rows = g->n * g->oh;
    j.rows_blk = BLOCK_PIXELS / g->ow;
    if (j.rows_blk < 1) j.rows_blk = 1;
    if (j.rows_blk > rows) j.rows_blk = rows;
    /* enough items for the threads */
    int64_t want = 2 * (int64_t)nth;
    if (nth > 1 && j.npanel * ((rows + j.rows_blk - 1) / j.rows_blk) < want) {
        int64_t split = (want + j.npanel - 1) / j.npanel;
        j.rows_blk = (rows + split - 1) / split;
        if (j.rows_blk < 1) j.rows_blk = 1;
    }
    j.nrb = (rows + j.rows_blk - 1) / j.rows_blk;
    j.items = j.npanel * j.nrb;
    j.cb = K <= KBLOCK_TAPS * 5 / 4 ? (int)g->c : (int)(KBLOCK_TAPS / (g->kh * g->kw));
    if (j.cb < 1) j.cb = 1;
    j.buf_floats = (size_t)(j.rows_blk * g->ow * PANEL);
    /* per thread: Y^T (buf_floats), then the pixel pointers and tap rows */
    size_t per_thread = j.buf_floats + (size_t)(j.rows_blk * g->ow + j.cb * g->kh) * 2 + 16;
    per_thread = (per_thread + 15) & ~(size_t)15;
    j.per_thread = per_thread;
    size_t xp_floats = pad ? (size_t)(g->n * g->c * j.hp * j.wpd) : 0;
    xp_floats = (xp_floats + 15) & ~(size_t)15;
    float *scratch = tb_cpu_nn_scratch(ctx, sizeof(float) * (xp_floats + per_thread * (size_t)nth));
    if (!scratch) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for the direct conv buffers");
    j.buf = scratch + xp_floats;
    float *own;
    j.wp = weights_get(ctx, n, w, g->m, K, &own);
    if (!j.wp) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for packed weights");
    if (pad) {
        pad_job pj = {g, x, scratch, j.hp, j.wpd};
        if (nth > 1 && g->n * g->c > 1) tb_pool_run(ctx->pool, pad_run, &pj);
        else pad_run(&pj, 0, 1);
        j.x = scratch;
    } else {
        j.x = x;
    }
    j.bias = bias;
    j.res = res;
    j.y = y;
    j.e.act = n->i[10];
    j.e.p0 = n->f[0];
    j.e.p1 = n->f[1];
    j.e.act_after_res = (n->i[11] & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    if (nth > 1 && j.items > 1) tb_pool_run(ctx->pool, dconv_run, &j);
    else dconv_run(&j, 0, 1);
    tb_free_aligned(own);
    return TB_OK;
}
