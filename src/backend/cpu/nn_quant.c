/*
 * nn_quant.c — CPU kernels of the quantized general ops (QConv, QGemm:
 * src/ir/nn_quant.c) over the int8 GEMM of igemm.h.
 *
 * QGemm: x (M, K) quantized to uint8 codes in scratch (tb_cpu_quantize_u8),
 * then tb_cpu_igemm against the packed weight with the epilogue fused (bias
 * per column, activation, residual (M, N)).
 *
 * QConv on AVX-512 VNNI with stride 1 or 2, dilation 1, one group and
 * activation none / ReLU (tb_cpu_iconv_supported): the direct int8 conv of
 * igemm_conv.c over padded, 4-channel-interleaved codes of each chunk of
 * images, straight into NCHW with the epilogue (two pool dispatches a chunk).
 *
 * Other QConv (one group; grouped ones run the reference): per image, x
 * (C, H, W) is quantized and transposed into uint8 (H, W, C) once, so that
 * a row of the im2row matrix (one output pixel, K = kh kw C) is kh kw
 * copies of C contiguous codes (padding: the zero point's code, which adds nothing);
 * the weight is packed once in the same (M, kh, kw, C) order. A 1x1 stride-1
 * unpadded conv reads the (H W, C) codes directly. Each thread takes a range
 * of output pixels and runs tb_cpu_igemm on its own tiles (two pool
 * dispatches an image in all), writing each (pixels, M) tile back
 * transposed into NCHW with the bias, activation and residual applied.
 * Scratch comes from the context (grown on the first run of a shape); the
 * packed weights from its cache (tb_cpu_nn_wpack): nothing is allocated per
 * call once warm.
 */
#include "backend/cpu/igemm.h"
#include "backend/cpu/nn_conv_impl.h"

#include <math.h>
#include <stdlib.h>

/* A kind of the packed-weight cache beside nn_conv_impl.h's (1..4). */
#define WPACK_IGEMM 0x51
#define WPACK_ICONV 0x52

static void epi_inputs(int flags, int n_in, int *bias, int *res) {
    int has_res = (flags & TB_NN_HAS_RESIDUAL) != 0;
    *res = has_res ? n_in - 1 : -1;
    *bias = n_in - has_res > 3 ? 3 : -1;
}

/* ---------------------------------------------------------------- packing */

typedef struct {
    int64_t N, K;
    int64_t c, kh, kw; /* conv: reorder (N, c, kh, kw) into (N, kh, kw, c) first; c 0: as it is */
} pack_arg;

static void pack_make(const float *w, float *dst, const void *arg) {
    const pack_arg *a = arg;
    const int8_t *codes = (const int8_t *)w;
    int8_t *tmp = NULL;
    if (a->c && (a->kh > 1 || a->kw > 1)) {
        /* once per weight, at its first use */
        tmp = malloc((size_t)(a->N * a->K));
        if (tmp) {
            for (int64_t n = 0; n < a->N; n++)
                for (int64_t c = 0; c < a->c; c++)
                    for (int64_t r = 0; r < a->kh * a->kw; r++)
                        tmp[n * a->K + r * a->c + c] = codes[n * a->K + c * a->kh * a->kw + r];
            codes = tmp;
        }
    }
    tb_cpu_igemm_pack(codes, a->K, a->N, a->K, dst);
    free(tmp);
}

/* The packed weight of node n (input 1), made on first use; NULL when the
 * input is not a weight of the graph or the conv reorder failed. */
static const void *packed_weight(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *w, int64_t N, int64_t K,
                                 const pack_arg *a) {
    size_t bytes = tb_cpu_igemm_packed_bytes(N, K);
    return tb_cpu_nn_wpack(ctx, n, 1, (const float *)w->data, WPACK_IGEMM, N, K, a->c, (bytes + 3) / 4, pack_make,
                           a);
}

/* ---------------------------------------------------------------- parallel helpers */

typedef struct {
    const float *x;
    uint8_t *q;
    int64_t n;
    float inv;
    int zero;
} quant_job;

static void quant_run(void *arg, int ith, int nth) {
    const quant_job *j = arg;
    int64_t a = j->n * ith / nth / 64 * 64, b = ith == nth - 1 ? j->n : j->n * (ith + 1) / nth / 64 * 64;
    if (b > a) tb_cpu_quantize_u8(j->x + a, j->q + a, b - a, j->inv, j->zero);
}

static void run_on(tb_pool *p, tb_pool_fn fn, void *arg) {
    if (p) tb_pool_run(p, fn, arg);
    else fn(arg, 0, 1);
}

/* ---------------------------------------------------------------- QGemm */

static tb_status qgemm_kernel(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                              int n_out) {
    const tb_view *x = &in[0], *w = &in[1];
    int64_t K = x->dims[x->rank - 1], N = w->dims[0], M = K ? tb_view_numel(x) / K : 0;
    int act = n->i[0], flags = n->i[1], zero = n->i[2];
    if (M == 0 || N == 0) return TB_OK;
    int bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    pack_arg pa = {N, K, 0, 1, 1};
    const void *wp = packed_weight(ctx, n, w, N, K, &pa);
    size_t abytes = ((size_t)(M * K) + 63) / 64 * 64, pbytes = wp ? 0 : tb_cpu_igemm_packed_bytes(N, K);
    uint8_t *A = tb_cpu_nn_scratch(ctx, abytes + pbytes);
    if (!A) return tb_errorf(TB_ERR_OOM, "QGemm: out of memory for %lld x %lld codes", (long long)M, (long long)K);
    if (!wp) { /* codes not a weight of the graph (a test's): packed per call */
        tb_cpu_igemm_pack(w->data, K, N, K, A + abytes);
        wp = A + abytes;
    }
    quant_job qj = {x->data, A, M * K, 1.0f / n->f[0], zero};
    run_on(ctx->pool, quant_run, &qj);
    tb_cpu_sgemm_epi e = {0};
    if (bi >= 0) e.bias = in[bi].data, e.bias_cs = 1, e.bias_rs = 0;
    e.res = ri >= 0 ? in[ri].data : NULL;
    e.ld_res = N;
    e.act = act;
    e.p0 = n->f[2];
    e.p1 = n->f[3];
    e.act_after_res = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    tb_cpu_igemm(M, N, K, A, K, zero, n->f[0], wp, in[2].data, out[0].data, N, &e, ctx->pool);
    (void)n_out;
    return TB_OK;
}

/* ---------------------------------------------------------------- QConv */

/* x (C, H, W) f32 -> q (H, W, C) uint8, rows of pixels split over threads */
typedef struct {
    const float *x;
    uint8_t *q;
    int64_t c, hw;
    float inv;
    int zero;
} hwc_job;

static void hwc_run(void *arg, int ith, int nth) {
    const hwc_job *j = arg;
    int64_t p0 = j->hw * ith / nth, p1 = j->hw * (ith + 1) / nth;
    enum { T = 64 };
    for (int64_t p = p0; p < p1; p += T) {
        int64_t np = p1 - p < T ? p1 - p : T;
        for (int64_t c = 0; c < j->c; c++) {
            uint8_t qb[T];
            tb_cpu_quantize_u8(j->x + c * j->hw + p, qb, np, j->inv, j->zero);
            for (int64_t i = 0; i < np; i++) j->q[(p + i) * j->c + c] = qb[i];
        }
    }
}

/* im2row of output pixels [p0, p0 + np) of one image from the (H, W, C)
 * codes: A (np, kh kw C) */
static void im2row(const tb_nn_conv_geom *g, const uint8_t *q, uint8_t *A, int64_t p0, int64_t np, int64_t K,
                   int zero) {
    size_t C = (size_t)g->c;
    for (int64_t r = 0; r < np; r++) {
        int64_t p = p0 + r, oy = p / g->ow, ox = p % g->ow;
        uint8_t *row = A + r * K;
        for (int ky = 0; ky < g->kh; ky++) {
            int64_t iy = oy * g->sh - g->pt + (int64_t)ky * g->dh;
            for (int kx = 0; kx < g->kw; kx++, row += C) {
                int64_t ix = ox * g->sw - g->pl + (int64_t)kx * g->dw;
                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) memset(row, zero, C);
                else memcpy(row, q + (iy * g->w + ix) * (int64_t)C, C);
            }
        }
    }
}

static inline float act_f(int act, float v, float a0, float a1) {
    switch (act) {
    case TB_NN_ACT_NONE: return v;
    case TB_NN_ACT_RELU: return v > 0 ? v : 0;
    case TB_NN_ACT_CLIP: return v < a0 ? a0 : v > a1 ? a1 : v;
    default: return (float)tb_nn_act_apply((tb_nn_act)act, v, a0, a1);
    }
}

/* One image's conv after its codes are made: each thread takes a range of
 * output pixels and, tile by tile, builds its im2row rows, runs the int8
 * GEMM on them alone (one pool dispatch per image: a dispatch is a wait on
 * every thread) and writes the (pixels, M) tile into y (M, P) with the
 * epilogue. */
typedef struct {
    const tb_nn_conv_geom *g;
    const uint8_t *Q;       /* (H W, C) codes */
    uint8_t *A;             /* per thread: (tile, K)   */
    float *Yt;              /* per thread: (tile, M)   */
    size_t a_stride, y_stride; /* bytes between threads' parts */
    int64_t K, M, P, tile;
    int zero, direct;
    float a_scale;
    const void *wp;
    const float *ws, *bias, *res; /* res: (M, P) of this image or NULL */
    float *y;                     /* (M, P) of this image */
    int act, after;
    float a0, a1;
} conv_job;

static void conv_run(void *arg, int ith, int nth) {
    const conv_job *j = arg;
    int64_t pa = j->P * ith / nth, pb = j->P * (ith + 1) / nth;
    uint8_t *A = j->A + (size_t)ith * j->a_stride;
    float *Yt = (float *)((uint8_t *)j->Yt + (size_t)ith * j->y_stride);
    int64_t C = j->g->c, M = j->M;
    for (int64_t p0 = pa; p0 < pb; p0 += j->tile) {
        int64_t np = pb - p0 < j->tile ? pb - p0 : j->tile;
        const uint8_t *a = j->Q + p0 * C;
        if (!j->direct) {
            im2row(j->g, j->Q, A, p0, np, j->K, j->zero);
            a = A;
        }
        tb_cpu_igemm(np, M, j->K, a, j->K, j->zero, j->a_scale, j->wp, j->ws, Yt, M, NULL, NULL);
        for (int64_t m = 0; m < M; m++) {
            float b = j->bias ? j->bias[m] : 0.0f;
            float *y = j->y + m * j->P + p0;
            const float *res = j->res ? j->res + m * j->P + p0 : NULL;
            const float *src = Yt + m;
            for (int64_t i = 0; i < np; i++) {
                float v = src[i * M] + b;
                if (res && j->after) v += res[i];
                v = act_f(j->act, v, j->a0, j->a1);
                if (res && !j->after) v += res[i];
                y[i] = v;
            }
        }
    }
}

#define QCONV_TILE_BYTES ((size_t)256 << 10) /* im2row codes per thread's tile, about */
#define QCONV_CODES_BYTES ((size_t)4 << 20)  /* direct conv: codes of the images per chunk, about */

/* ---------------------------------------------------------------- QConv, direct (igemm_conv.c) */

typedef struct {
    int64_t m, c;
    int kh, kw;
} iconv_pack_arg;

static void iconv_pack_make(const float *w, float *dst, const void *arg) {
    const iconv_pack_arg *a = arg;
    tb_cpu_iconv_pack((const int8_t *)w, a->m, a->c, a->kh, a->kw, dst);
}

typedef struct {
    const tb_iconv_geom *g;
    const float *x; /* the first image's (C, H, W) */
    int64_t n_img, chw;
    float inv;
    int zero;
    uint8_t *q;
    size_t q_stride;
    uint8_t *tmp; /* stride 2: per thread, tmp_stride bytes */
    size_t tmp_stride;
} iconv_quant_job;

/* the (image, 4-channel group) pairs split over the threads */
static void iconv_quant_run(void *arg, int ith, int nth) {
    const iconv_quant_job *j = arg;
    int64_t cgs = j->g->cg, units = cgs * j->n_img, a = units * ith / nth, b = units * (ith + 1) / nth;
    uint32_t *tmp = j->tmp ? (uint32_t *)(j->tmp + (size_t)ith * j->tmp_stride) : NULL;
    for (int64_t u = a; u < b;) {
        int64_t img = u / cgs, c0 = u % cgs, c1 = cgs < c0 + (b - u) ? cgs : c0 + (b - u);
        tb_cpu_iconv_quantize(j->g, j->x + img * j->chw, j->inv, j->zero, j->q + (size_t)img * j->q_stride, tmp, c0,
                              c1);
        u += c1 - c0;
    }
}

/* Threads take blocks of 8 output channels (each reads all the codes, a
 * part of the weight) where there are enough, else ranges of vectors. */
static void iconv_conv_run(void *arg, int ith, int nth) {
    const tb_iconv_job *j = arg;
    int64_t nb = j->nblocks, nv = j->g->nvec;
    if (nb >= 2 * nth || nb % nth == 0) {
        int64_t a = nb * ith / nth, b = nb * (ith + 1) / nth;
        if (b > a) tb_cpu_iconv_run(j, a, b, 0, nv);
    } else {
        int64_t units = (nv + 2) / 3, a = units * ith / nth * 3, b = units * (ith + 1) / nth * 3;
        if (b > nv) b = nv;
        if (b > a) tb_cpu_iconv_run(j, 0, nb, a, b);
    }
}

/* QConv by tb_cpu_iconv (the caller checked tb_cpu_iconv_supported): per
 * chunk of images, the codes of the padded inputs (one pool dispatch), then
 * the conv straight into y with the epilogue (another). */
static tb_status qconv_direct(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                              const tb_nn_conv_geom *cg, const tb_iconv_geom *gp) {
    int flags = n->i[11], zero = n->i[12], bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    tb_iconv_geom g = *gp;
    if (g.oh != cg->oh || g.ow != cg->ow)
        return tb_errorf(TB_ERR_INTERNAL, "QConv: direct geometry %lldx%lld, conv's %lldx%lld", (long long)g.oh,
                         (long long)g.ow, (long long)cg->oh, (long long)cg->ow);
    int64_t M = cg->m;
    iconv_pack_arg pa = {M, cg->c, cg->kh, cg->kw};
    size_t pbytes = tb_cpu_iconv_packed_bytes(M, cg->c, cg->kh, cg->kw);
    const void *wp = tb_cpu_nn_wpack(ctx, n, 1, (const float *)in[1].data, WPACK_ICONV, M, cg->c,
                                     (int64_t)cg->kh * 256 + cg->kw, (pbytes + 3) / 4, iconv_pack_make, &pa);
    int nth = ctx->pool ? tb_pool_size(ctx->pool) : 1;
    /* images in chunks of about QCONV_CODES_BYTES of codes: one quantize and
     * one conv dispatch per chunk, the weights read once per chunk */
    size_t qb = (tb_cpu_iconv_codes_bytes(&g) + 63) / 64 * 64;
    int64_t chunk = (int64_t)(QCONV_CODES_BYTES / qb);
    chunk = chunk < 1 ? 1 : chunk > cg->n ? cg->n : chunk;
    size_t tb = g.s > 1 ? ((size_t)(g.hp * g.wp) * 4 + 63) / 64 * 64 : 0, all = qb * (size_t)chunk;
    uint8_t *s = tb_cpu_nn_scratch(ctx, all + tb * (size_t)nth + (wp ? 0 : pbytes));
    if (!s) return tb_errorf(TB_ERR_OOM, "QConv: out of memory for scratch");
    if (!wp) {
        iconv_pack_make(in[1].data, (float *)(s + all + tb * (size_t)nth), &pa);
        wp = s + all + tb * (size_t)nth;
    }
    const float *x = in[0].data, *res = ri >= 0 ? in[ri].data : NULL;
    float *y = out[0].data;
    int64_t CHW = cg->c * cg->h * cg->w, P = cg->oh * cg->ow;
    tb_iconv_job j;
    memset(&j, 0, sizeof j);
    j.g = &g, j.q = s, j.q_stride = qb, j.y_stride = M * P, j.w = wp, j.m = M, j.zero = zero, j.a_scale = n->f[2];
    j.w_scale = in[2].data, j.bias = bi >= 0 ? in[bi].data : NULL;
    j.act = n->i[10], j.after = (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    tb_cpu_iconv_job_init(&j);
    for (int64_t b = 0; b < cg->n; b += chunk) {
        int64_t nb = cg->n - b < chunk ? cg->n - b : chunk;
        iconv_quant_job qj = {&g, x + b * CHW, nb, CHW, 1.0f / n->f[2], zero, s, qb, tb ? s + all : NULL, tb};
        run_on(ctx->pool, iconv_quant_run, &qj);
        j.n_img = nb;
        j.res = res ? res + b * M * P : NULL;
        j.y = y + b * M * P;
        run_on(ctx->pool, iconv_conv_run, &j);
    }
    return TB_OK;
}

static tb_status qconv_kernel(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                              int n_out) {
    tb_nn_conv_geom g;
    TB_TRY(tb_nn_conv_geometry(n, &in[0], &in[1], &g));
    if (g.group != 1) return tb_op_get_def(n->op)->ref(n, in, n_in, out, n_out);
    if (tb_cpu_iconv_supported(g.c, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.group, n->i[10])) {
        tb_iconv_geom ig;
        tb_cpu_iconv_geometry(g.c, g.h, g.w, g.kh, g.kw, g.sh, g.pt, g.pl, g.pb, g.pr, &ig);
        if (ig.plane < INT32_MAX / 4) /* the taps' byte offsets are int32 */
            return qconv_direct(ctx, n, in, n_in, out, &g, &ig);
    }
    int flags = n->i[11], zero = n->i[12], bi, ri;
    epi_inputs(flags, n_in, &bi, &ri);
    int64_t M = g.m, C = g.c, HW = g.h * g.w, P = g.oh * g.ow, KK = (int64_t)g.kh * g.kw, K = C * KK;
    pack_arg pa = {M, K, C, g.kh, g.kw};
    const void *wp = packed_weight(ctx, n, &in[1], M, K, &pa);
    int direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && !g.pt && !g.pl && !g.pb && !g.pr;
    int nth = ctx->pool ? tb_pool_size(ctx->pool) : 1;
    int64_t tile = (int64_t)(QCONV_TILE_BYTES / (size_t)K);
    if (tile < 16) tile = 16;
    if (tile > (P + nth - 1) / nth) tile = (P + nth - 1) / nth;
    /* each part 64-byte aligned: the packed weight is read with aligned loads */
    size_t qb = ((size_t)(HW * C) + 63) / 64 * 64, ab = direct ? 0 : ((size_t)(tile * K) + 63) / 64 * 64;
    size_t yb = (sizeof(float) * (size_t)(tile * M) + 63) / 64 * 64, pb = wp ? 0 : tb_cpu_igemm_packed_bytes(M, K);
    uint8_t *s = tb_cpu_nn_scratch(ctx, qb + (ab + yb) * (size_t)nth + pb);
    if (!s) return tb_errorf(TB_ERR_OOM, "QConv: out of memory for scratch");
    if (!wp) {
        uint8_t *dst = s + qb + (ab + yb) * (size_t)nth;
        pack_make(in[1].data, (float *)dst, &pa);
        wp = dst;
    }
    const float *x = in[0].data, *bias = bi >= 0 ? in[bi].data : NULL, *res = ri >= 0 ? in[ri].data : NULL;
    float *y = out[0].data;
    for (int64_t b = 0; b < g.n; b++) {
        hwc_job hj = {x + b * C * HW, s, C, HW, 1.0f / n->f[2], zero};
        run_on(ctx->pool, hwc_run, &hj);
        conv_job cj = {&g, s, s + qb, (float *)(s + qb + ab * (size_t)nth), ab, yb, K, M, P, tile, zero, direct,
                       n->f[2], wp, in[2].data, bias, res ? res + b * M * P : NULL, y + b * M * P, n->i[10],
                       (flags & TB_NN_ACT_AFTER_RESIDUAL) != 0, n->f[0], n->f[1]};
        run_on(ctx->pool, conv_run, &cj);
    }
    return TB_OK;
}

tb_cpu_nn_fn tb_cpu_nn_quant_kernel(tb_op_kind k) {
    switch (k) {
    case TB_OP_QCONV: return qconv_kernel;
    case TB_OP_QGEMM: return qgemm_kernel;
    default: return NULL;
    }
}
