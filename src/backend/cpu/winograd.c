/*
 * winograd.c — Conv 3x3, stride 1, by Winograd F(2x2, 3x3) (Lavin and Gray):
 * each 2x2 output tile costs 16 products per (input, output) channel pair
 * instead of 36, done as 16 GEMMs
 *   M[xi] (M, tiles) = U[xi] (M, C) x V[xi] (C, tiles),  xi in 4x4
 * with U = G g G^T (the weights, transformed once and cached by the weight
 * buffer's address, shape and content hash: weights are constant, but a
 * buffer may be freed and reused) and V = B^T d B (the input, per call), then
 * y = A^T M A with the fused epilogue.
 */
#include "backend/cpu/nn_conv_impl.h"

#include <pthread.h>

/* ---------------------------------------------------------------- weight cache */

#define WCACHE_SLOTS 64

typedef struct {
    const float *w;
    int64_t m, c;
    uint64_t hash;
    float *u; /* (16, M, C) */
    uint64_t used;
} wcache_entry;

static wcache_entry wcache[WCACHE_SLOTS];
static uint64_t wcache_clock;
static pthread_mutex_t wcache_lock = PTHREAD_MUTEX_INITIALIZER;

/* U[xi][m][c] = (G g G^T)[xi] for g = w[m][c] (3x3) */
static void weights_transform(const float *w, int64_t M, int64_t C, float *u) {
    size_t plane = (size_t)(M * C);
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < C; c++) {
            const float *g = w + (m * C + c) * 9;
            float t[4][3]; /* G g: 4 x 3 */
            for (int j = 0; j < 3; j++) {
                float g0 = g[0 * 3 + j], g1 = g[1 * 3 + j], g2 = g[2 * 3 + j];
                t[0][j] = g0;
                t[1][j] = 0.5f * (g0 + g1 + g2);
                t[2][j] = 0.5f * (g0 - g1 + g2);
                t[3][j] = g2;
            }
            for (int i = 0; i < 4; i++) {
                float r[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]), 0.5f * (t[i][0] - t[i][1] + t[i][2]),
                              t[i][2]};
                for (int j = 0; j < 4; j++) u[(size_t)(i * 4 + j) * plane + (size_t)(m * C + c)] = r[j];
            }
        }
}

/* The transformed weights of w, from the cache or made now; NULL on OOM. The
 * entry stays valid while this call runs: entries are replaced only by the
 * least recently used rule, and one conv uses one at a time per thread of
 * the calling executor (callers do not run two convs at once on one ctx). */
static const float *weights_get(const float *w, int64_t M, int64_t C) {
    uint64_t h = tb_hash64(w, sizeof(float) * (size_t)(M * C * 9));
    pthread_mutex_lock(&wcache_lock);
    wcache_entry *hit = NULL, *victim = &wcache[0];
    for (int i = 0; i < WCACHE_SLOTS; i++) {
        wcache_entry *e = &wcache[i];
        if (e->u && e->w == w && e->m == M && e->c == C && e->hash == h) { hit = e; break; }
        if (!e->u || (victim->u && e->used < victim->used)) victim = e;
    }
    if (!hit) {
        float *u = tb_alloc_aligned(sizeof(float) * 16 * (size_t)(M * C), 64);
        if (!u) { pthread_mutex_unlock(&wcache_lock); return NULL; }
        weights_transform(w, M, C, u);
        tb_free_aligned(victim->u);
        *victim = (wcache_entry){w, M, C, h, u, 0};
        hit = victim;
    }
    hit->used = ++wcache_clock;
    const float *u = hit->u;
    pthread_mutex_unlock(&wcache_lock);
    return u;
}

/* ---------------------------------------------------------------- transforms */

typedef struct {
    const tb_nn_conv_geom *g;
    const float *x;     /* (C, H, W) of one image */
    float *v;           /* (16, C, T) */
    const float *mx;    /* (16, M, T) */
    float *y;           /* (M, oh, ow) of one image */
    int64_t th, tw, T;
} wino_job;

/* V[xi][c][t] = (B^T d B)[xi], d the 4x4 input patch at (2 ty - pt, 2 tx - pl) */
static void input_transform(const wino_job *j, int64_t c0, int64_t c1) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->c * j->T);
    for (int64_t c = c0; c < c1; c++) {
        const float *xc = j->x + c * g->h * g->w;
        for (int64_t ty = 0; ty < j->th; ty++)
            for (int64_t tx = 0; tx < j->tw; tx++) {
                float d[4][4];
                int64_t y0 = 2 * ty - g->pt, x0 = 2 * tx - g->pl;
                int inside = y0 >= 0 && x0 >= 0 && y0 + 4 <= g->h && x0 + 4 <= g->w;
                for (int i = 0; i < 4; i++)
                    for (int k = 0; k < 4; k++) {
                        int64_t yy = y0 + i, xx = x0 + k;
                        d[i][k] = inside || (yy >= 0 && yy < g->h && xx >= 0 && xx < g->w) ? xc[yy * g->w + xx] : 0.0f;
                    }
                float t[4][4]; /* B^T d */
                for (int k = 0; k < 4; k++) {
                    t[0][k] = d[0][k] - d[2][k];
                    t[1][k] = d[1][k] + d[2][k];
                    t[2][k] = d[2][k] - d[1][k];
                    t[3][k] = d[1][k] - d[3][k];
                }
                float *v = j->v + (size_t)(c * j->T + ty * j->tw + tx);
                for (int i = 0; i < 4; i++) {
                    v[(size_t)(i * 4 + 0) * plane] = t[i][0] - t[i][2];
                    v[(size_t)(i * 4 + 1) * plane] = t[i][1] + t[i][2];
                    v[(size_t)(i * 4 + 2) * plane] = t[i][2] - t[i][1];
                    v[(size_t)(i * 4 + 3) * plane] = t[i][1] - t[i][3];
                }
            }
    }
}

/* y[m] tiles = A^T M A */
static void output_transform(const wino_job *j, int64_t m0, int64_t m1) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->m * j->T);
    for (int64_t m = m0; m < m1; m++) {
        float *ym = j->y + m * g->oh * g->ow;
        const float *mm = j->mx + (size_t)(m * j->T);
        for (int64_t ty = 0; ty < j->th; ty++)
            for (int64_t tx = 0; tx < j->tw; tx++) {
                int64_t t = ty * j->tw + tx;
                float a[4][4];
                for (int xi = 0; xi < 16; xi++) a[xi / 4][xi % 4] = mm[(size_t)xi * plane + (size_t)t];
                float r[2][4]; /* A^T a */
                for (int k = 0; k < 4; k++) {
                    r[0][k] = a[0][k] + a[1][k] + a[2][k];
                    r[1][k] = a[1][k] - a[2][k] - a[3][k];
                }
                for (int i = 0; i < 2; i++) {
                    int64_t oy = 2 * ty + i;
                    if (oy >= g->oh) break;
                    float o0 = r[i][0] + r[i][1] + r[i][2], o1 = r[i][1] - r[i][2] - r[i][3];
                    int64_t ox = 2 * tx;
                    ym[oy * g->ow + ox] = o0;
                    if (ox + 1 < g->ow) ym[oy * g->ow + ox + 1] = o1;
                }
            }
    }
}

static void input_run(void *arg, int ith, int nth) {
    wino_job *j = arg;
    input_transform(j, j->g->c * ith / nth, j->g->c * (ith + 1) / nth);
}

static void output_run(void *arg, int ith, int nth) {
    wino_job *j = arg;
    output_transform(j, j->g->m * ith / nth, j->g->m * (ith + 1) / nth);
}

tb_status tb_cpu_conv_winograd(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_nn_conv_geom *g, const float *x,
                               const float *w, const float *bias, const float *res, float *y) {
    TB_ASSERT(g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 && g->group == 1);
    const float *u = weights_get(w, g->m, g->c);
    if (!u) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for Winograd weights");
    wino_job j = {g, NULL, NULL, NULL, NULL, (g->oh + 1) / 2, (g->ow + 1) / 2, 0};
    j.T = j.th * j.tw;
    size_t vn = (size_t)(16 * g->c * j.T), mn = (size_t)(16 * g->m * j.T);
    float *buf = tb_cpu_nn_scratch(ctx, sizeof(float) * (vn + mn));
    if (!buf) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for Winograd tiles");
    j.v = buf;
    j.mx = buf + vn;
    int nth = ctx->pool ? tb_pool_size(ctx->pool) : 1;
    int64_t ohw = g->oh * g->ow;
    for (int64_t b = 0; b < g->n; b++) {
        j.x = x + b * g->c * g->h * g->w;
        j.y = y + b * g->m * ohw;
        if (nth > 1) tb_pool_run(ctx->pool, input_run, &j);
        else input_run(&j, 0, 1);
        for (int xi = 0; xi < 16; xi++)
            tb_cpu_sgemm(0, 0, g->m, j.T, g->c, 1.0f, u + (size_t)xi * g->m * g->c, g->c, j.v + (size_t)xi * g->c * j.T,
                         j.T, 0.0f, (float *)j.mx + (size_t)xi * g->m * j.T, j.T, ctx->pool);
        if (nth > 1) tb_pool_run(ctx->pool, output_run, &j);
        else output_run(&j, 0, 1);
        tb_cpu_sgemm_epi e = {0};
        e.bias = bias;
        e.bias_rs = 1;
        e.res = res ? res + b * g->m * ohw : NULL;
        e.ld_res = ohw;
        e.act = n->i[10];
        e.p0 = n->f[0];
        e.p1 = n->f[1];
        e.act_after_res = (n->i[11] & TB_NN_ACT_AFTER_RESIDUAL) != 0;
        if (e.bias || e.res || e.act) tb_cpu_nn_epilogue(j.y, ohw, g->m, ohw, &e);
    }
    return TB_OK;
}
