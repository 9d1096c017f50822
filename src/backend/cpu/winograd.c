/*
 * winograd.c — Conv 3x3, stride 1, by Winograd F(2x2, 3x3) or F(4x4, 3x3)
 * (Lavin and Gray): each 2x2 (4x4) output tile costs 16 (36) products per
 * (input, output) channel pair instead of 36 (144), done as 16 (36) GEMMs
 *   M[xi] (M, tiles) = U[xi] (M, C) x V[xi] (C, tiles)
 * with U = G g G^T (the weights, transformed once per context into its
 * packed-weight cache, nn_conv_impl.h) and V = B^T d B (the input, per
 * call), then y = A^T M A with the fused epilogue applied per output plane
 * while it is in cache. With AVX-512 the transforms work on 16 tiles of a
 * tile row per vector (F(4x4) has only that form: without AVX-512 it runs as
 * F(2x2), whose scalar transforms serve the other ISAs).
 */
#include "backend/cpu/nn_conv_impl.h"

#include <immintrin.h>
#include <pthread.h>

/* ---------------------------------------------------------------- weights */

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

/* F(4x4, 3x3): U[xi][m][c] = (G g G^T)[xi] (6x6), G of Lavin and Gray */
static void weights_transform4(const float *w, int64_t M, int64_t C, float *u) {
    static const float G[6][3] = {{1.0f / 4, 0, 0},
                                  {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                  {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                  {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                  {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                  {0, 0, 1}};
    size_t plane = (size_t)(M * C);
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < C; c++) {
            const float *g = w + (m * C + c) * 9;
            double t[6][3]; /* G g */
            for (int i = 0; i < 6; i++)
                for (int k = 0; k < 3; k++) t[i][k] = (double)G[i][0] * g[k] + (double)G[i][1] * g[3 + k] + (double)G[i][2] * g[6 + k];
            for (int i = 0; i < 6; i++)
                for (int k = 0; k < 6; k++)
                    u[(size_t)(i * 6 + k) * plane + (size_t)(m * C + c)] =
                        (float)(t[i][0] * G[k][0] + t[i][1] * G[k][1] + t[i][2] * G[k][2]);
        }
}

typedef struct {
    int64_t m, c;
} wshape;

static void make_u2(const float *w, float *u, const void *arg) {
    const wshape *s = arg;
    weights_transform(w, s->m, s->c, u);
}

static void make_u4(const float *w, float *u, const void *arg) {
    const wshape *s = arg;
    weights_transform4(w, s->m, s->c, u);
}

/* U of node n's weights w (M, C, 3, 3): from the context's cache when w is
 * a graph weight (transformed on its first use), else transformed now into
 * *own (the caller frees it); NULL on OOM. */
static const float *weights_get(tb_cpu_nn_ctx *ctx, const tb_node *n, const float *w, int64_t M, int64_t C, int f4,
                                float **own) {
    size_t floats = (f4 ? 36 : 16) * (size_t)(M * C);
    wshape sh = {M, C};
    *own = NULL;
    const float *u = tb_cpu_nn_wpack(ctx, n, 1, w, f4 ? TB_WPACK_WINO4 : TB_WPACK_WINO2, M, C, 0, floats,
                                     f4 ? make_u4 : make_u2, &sh);
    if (u) return u;
    float *p = tb_alloc_aligned(sizeof(float) * floats, 64);
    if (!p) return NULL;
    (f4 ? make_u4 : make_u2)(w, p, &sh);
    *own = p;
    return p;
}

/* ---------------------------------------------------------------- transforms */

#define WINO_CHUNK_BYTES ((size_t)24 << 20) /* V and M of the images transformed together */
#define WINO_CHUNK_TILES 128                /* tiles (GEMM columns) worth batching images for */

typedef struct {
    const tb_nn_conv_geom *g;
    const float *x;     /* (C, H, W) of one image */
    float *v;           /* (16, C, ld): the image's tiles from column b T */
    const float *mx;    /* (16, M, ld) */
    float *y;           /* (M, oh, ow) of one image */
    int64_t th, tw, T;  /* tiles of an image */
    int64_t ld, nb;     /* the rows of V and M hold the tiles of nb images (ld = nb T) */
    float *pad;         /* per thread: one zero-padded input plane (AVX-512 path) */
    int64_t hp, wp;     /* its rows and row stride */
    const tb_cpu_sgemm_epi *e; /* the epilogue, applied per output plane */
    int wide;           /* AVX-512 transforms */
    const float *u;     /* (nxi, M, C) transformed weights */
    int f4, nxi;        /* F(4x4, 3x3): 36 products (else F(2x2, 3x3): 16) */
} wino_job;

/* V[xi][c][t] = (B^T d B)[xi], d the 4x4 input patch at (2 ty - pt, 2 tx - pl) */
static void input_transform(const wino_job *j, int64_t c0, int64_t c1) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->c * j->ld);
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
                float *v = j->v + (size_t)(c * j->ld + ty * j->tw + tx);
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
    size_t plane = (size_t)(g->m * j->ld);
    for (int64_t m = m0; m < m1; m++) {
        float *ym = j->y + m * g->oh * g->ow;
        const float *mm = j->mx + (size_t)(m * j->ld);
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


/* ---- AVX-512 transforms: 16 tiles of a tile row per vector */

#define W512 __attribute__((target("avx512f,avx2,fma")))

static W512 void input_transform512(const wino_job *j, int64_t c0, int64_t c1, float *P) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->c * j->ld);
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int64_t c = c0; c < c1; c++) {
        /* the plane with its pads, zero outside the image */
        const float *xc = j->x + c * g->h * g->w;
        memset(P, 0, sizeof(float) * (size_t)(j->hp * j->wp));
        for (int64_t yy = 0; yy < g->h; yy++) {
            int64_t py = yy + g->pt;
            if (py >= j->hp) break;
            int64_t n = g->w;
            if (g->pl + n > j->wp) n = j->wp - g->pl;
            memcpy(P + py * j->wp + g->pl, xc + yy * g->w, sizeof(float) * (size_t)n);
        }
        for (int64_t ty = 0; ty < j->th; ty++) {
            const float *r0 = P + 2 * ty * j->wp;
            for (int64_t tx = 0; tx < j->tw; tx += 16) {
                __m512 d[4][4];
                for (int i = 0; i < 4; i++) {
                    const float *p = r0 + i * j->wp + 2 * tx;
                    __m512 a0 = _mm512_loadu_ps(p), a1 = _mm512_loadu_ps(p + 16);
                    __m512 b0 = _mm512_loadu_ps(p + 2), b1 = _mm512_loadu_ps(p + 18);
                    d[i][0] = _mm512_permutex2var_ps(a0, ev, a1);
                    d[i][1] = _mm512_permutex2var_ps(a0, od, a1);
                    d[i][2] = _mm512_permutex2var_ps(b0, ev, b1);
                    d[i][3] = _mm512_permutex2var_ps(b0, od, b1);
                }
                __m512 t[4][4];
                for (int k = 0; k < 4; k++) {
                    t[0][k] = _mm512_sub_ps(d[0][k], d[2][k]);
                    t[1][k] = _mm512_add_ps(d[1][k], d[2][k]);
                    t[2][k] = _mm512_sub_ps(d[2][k], d[1][k]);
                    t[3][k] = _mm512_sub_ps(d[1][k], d[3][k]);
                }
                int64_t left = j->tw - tx;
                __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
                float *v = j->v + (size_t)(c * j->ld + ty * j->tw + tx);
                for (int i = 0; i < 4; i++) {
                    _mm512_mask_storeu_ps(v + (size_t)(i * 4 + 0) * plane, m, _mm512_sub_ps(t[i][0], t[i][2]));
                    _mm512_mask_storeu_ps(v + (size_t)(i * 4 + 1) * plane, m, _mm512_add_ps(t[i][1], t[i][2]));
                    _mm512_mask_storeu_ps(v + (size_t)(i * 4 + 2) * plane, m, _mm512_sub_ps(t[i][2], t[i][1]));
                    _mm512_mask_storeu_ps(v + (size_t)(i * 4 + 3) * plane, m, _mm512_sub_ps(t[i][1], t[i][3]));
                }
            }
        }
    }
}

static W512 void output_transform512(const wino_job *j, int64_t m0, int64_t m1) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->m * j->ld);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int64_t m = m0; m < m1; m++) {
        float *ym = j->y + m * g->oh * g->ow;
        const float *mm = j->mx + (size_t)(m * j->ld);
        for (int64_t ty = 0; ty < j->th; ty++)
            for (int64_t tx = 0; tx < j->tw; tx += 16) {
                int64_t left = j->tw - tx;
                __mmask16 tm = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
                const float *src = mm + ty * j->tw + tx;
                __m512 a[16];
                for (int xi = 0; xi < 16; xi++) a[xi] = _mm512_maskz_loadu_ps(tm, src + (size_t)xi * plane);
                for (int i = 0; i < 2; i++) {
                    int64_t oy = 2 * ty + i;
                    if (oy >= g->oh) break;
                    __m512 r[4];
                    for (int k = 0; k < 4; k++)
                        r[k] = i == 0 ? _mm512_add_ps(_mm512_add_ps(a[k], a[4 + k]), a[8 + k])
                                      : _mm512_sub_ps(_mm512_sub_ps(a[4 + k], a[8 + k]), a[12 + k]);
                    __m512 o0 = _mm512_add_ps(_mm512_add_ps(r[0], r[1]), r[2]);
                    __m512 o1 = _mm512_sub_ps(_mm512_sub_ps(r[1], r[2]), r[3]);
                    int64_t cols = g->ow - 2 * tx;
                    if (cols > 32) cols = 32;
                    __mmask16 k0 = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
                    __mmask16 k1 = cols >= 32 ? (__mmask16)0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
                    float *dst = ym + oy * g->ow + 2 * tx;
                    _mm512_mask_storeu_ps(dst, k0, _mm512_permutex2var_ps(o0, lo, o1));
                    if (k1) _mm512_mask_storeu_ps(dst + 16, k1, _mm512_permutex2var_ps(o0, hi, o1));
                }
            }
        if (j->e) { /* the epilogue on the plane while it is in cache */
            tb_cpu_sgemm_epi e = *j->e;
            if (e.bias) e.bias += m;
            if (e.res) e.res += m * g->oh * g->ow;
            tb_cpu_nn_epilogue(ym, g->oh * g->ow, 1, g->oh * g->ow, &e);
        }
    }
}


/* ---- F(4x4, 3x3), AVX-512 only: 6x6 input patches at stride 4, 16 tiles of
 * a tile row per vector */

/* lanes t = 0..15 of p[4 t] (p[0, 61] read) */
static W512 __m512 stride4_512(const float *p) {
    const __m512i ix = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    __m512 lo = _mm512_permutex2var_ps(_mm512_loadu_ps(p), ix, _mm512_loadu_ps(p + 16));
    __m512 hi = _mm512_permutex2var_ps(_mm512_loadu_ps(p + 32), ix, _mm512_maskz_loadu_ps(0x3fff, p + 48));
    return _mm512_shuffle_f32x4(lo, hi, 0x44);
}

/* B^T applied to d0..d5 (one column or row of a patch) */
#define WINO4_BT(d, w)                                                                                     \
    do {                                                                                                   \
        const __m512 c4 = _mm512_set1_ps(4.0f), c5 = _mm512_set1_ps(5.0f), c2 = _mm512_set1_ps(2.0f);     \
        __m512 t14 = _mm512_add_ps(d[1], d[2]), t23 = _mm512_sub_ps(d[1], d[2]);                           \
        w[0] = _mm512_add_ps(_mm512_fnmadd_ps(c5, d[2], _mm512_mul_ps(c4, d[0])), d[4]);                   \
        w[1] = _mm512_fnmadd_ps(c4, t14, _mm512_add_ps(d[3], d[4]));                                       \
        w[2] = _mm512_fmadd_ps(c4, t23, _mm512_sub_ps(d[4], d[3]));                                        \
        __m512 s13 = _mm512_sub_ps(d[3], d[1]), s4m2 = _mm512_sub_ps(d[4], d[2]);                          \
        w[3] = _mm512_fmadd_ps(c2, s13, s4m2);                                                             \
        w[4] = _mm512_fnmadd_ps(c2, s13, s4m2);                                                            \
        w[5] = _mm512_add_ps(_mm512_fnmadd_ps(c5, d[3], _mm512_mul_ps(c4, d[1])), d[5]);                   \
    } while (0)

static W512 void input_transform4_512(const wino_job *j, int64_t c0, int64_t c1, float *P) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->c * j->ld);
    for (int64_t c = c0; c < c1; c++) {
        const float *xc = j->x + c * g->h * g->w;
        memset(P, 0, sizeof(float) * (size_t)(j->hp * j->wp));
        for (int64_t yy = 0; yy < g->h; yy++) {
            int64_t py = yy + g->pt;
            if (py >= j->hp) break;
            int64_t n = g->w;
            if (g->pl + n > j->wp) n = j->wp - g->pl;
            memcpy(P + py * j->wp + g->pl, xc + yy * g->w, sizeof(float) * (size_t)n);
        }
        for (int64_t ty = 0; ty < j->th; ty++)
            for (int64_t tx = 0; tx < j->tw; tx += 16) {
                __m512 t[6][6]; /* rows of B^T d, by columns k */
                for (int k = 0; k < 6; k++) {
                    __m512 d[6], w[6];
                    for (int i = 0; i < 6; i++) d[i] = stride4_512(P + (4 * ty + i) * j->wp + 4 * tx + k);
                    WINO4_BT(d, w);
                    for (int i = 0; i < 6; i++) t[i][k] = w[i];
                }
                int64_t left = j->tw - tx;
                __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
                float *v = j->v + (size_t)(c * j->ld + ty * j->tw + tx);
                for (int i = 0; i < 6; i++) {
                    __m512 w[6];
                    WINO4_BT(t[i], w);
                    for (int k = 0; k < 6; k++) _mm512_mask_storeu_ps(v + (size_t)(i * 6 + k) * plane, m, w[k]);
                }
            }
    }
}

/* A^T applied to m0..m5 */
#define WINO4_AT(a, o)                                                                                     \
    do {                                                                                                   \
        __m512 p12 = _mm512_add_ps(a[1], a[2]), m12 = _mm512_sub_ps(a[1], a[2]);                           \
        __m512 p34 = _mm512_add_ps(a[3], a[4]), m34 = _mm512_sub_ps(a[3], a[4]);                           \
        o[0] = _mm512_add_ps(_mm512_add_ps(a[0], p12), p34);                                               \
        o[1] = _mm512_fmadd_ps(_mm512_set1_ps(2.0f), m34, m12);                                            \
        o[2] = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), p34, p12);                                            \
        o[3] = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.0f), m34, m12), a[5]);                       \
    } while (0)

static W512 void output_transform4_512(const wino_job *j, int64_t m0, int64_t m1) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->m * j->ld);
    const __m512i p01l = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i p01h = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i q0 = _mm512_setr_epi32(0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
    const __m512i q1 = _mm512_setr_epi32(8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
    for (int64_t m = m0; m < m1; m++) {
        float *ym = j->y + m * g->oh * g->ow;
        const float *mm = j->mx + (size_t)(m * j->ld);
        for (int64_t ty = 0; ty < j->th; ty++)
            for (int64_t tx = 0; tx < j->tw; tx += 16) {
                int64_t left = j->tw - tx;
                __mmask16 tm = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
                const float *src = mm + ty * j->tw + tx;
                __m512 r[4][6]; /* A^T a, by columns */
                for (int k = 0; k < 6; k++) {
                    __m512 a[6], o[4];
                    for (int i = 0; i < 6; i++) a[i] = _mm512_maskz_loadu_ps(tm, src + (size_t)(i * 6 + k) * plane);
                    WINO4_AT(a, o);
                    for (int i = 0; i < 4; i++) r[i][k] = o[i];
                }
                for (int i = 0; i < 4; i++) {
                    int64_t oy = 4 * ty + i;
                    if (oy >= g->oh) break;
                    __m512 o[4];
                    WINO4_AT(r[i], o);
                    /* interleave o[q][t] into out[4 t + q] */
                    __m512 a01l = _mm512_permutex2var_ps(o[0], p01l, o[1]), a01h = _mm512_permutex2var_ps(o[0], p01h, o[1]);
                    __m512 a23l = _mm512_permutex2var_ps(o[2], p01l, o[3]), a23h = _mm512_permutex2var_ps(o[2], p01h, o[3]);
                    __m512 out[4] = {_mm512_permutex2var_ps(a01l, q0, a23l), _mm512_permutex2var_ps(a01l, q1, a23l),
                                     _mm512_permutex2var_ps(a01h, q0, a23h), _mm512_permutex2var_ps(a01h, q1, a23h)};
                    int64_t cols = g->ow - 4 * tx;
                    float *dst = ym + oy * g->ow + 4 * tx;
                    for (int q = 0; q < 4 && cols > 16 * q; q++) {
                        int64_t n = cols - 16 * q;
                        __mmask16 km = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
                        _mm512_mask_storeu_ps(dst + 16 * q, km, out[q]);
                    }
                }
            }
        if (j->e) {
            tb_cpu_sgemm_epi e = *j->e;
            if (e.bias) e.bias += m;
            if (e.res) e.res += m * g->oh * g->ow;
            tb_cpu_nn_epilogue(ym, g->oh * g->ow, 1, g->oh * g->ow, &e);
        }
    }
}

/* M[xi] (M, nb T) = U[xi] (M, C) x V[xi] (C, nb T) */
static void gemm_one(const wino_job *j, int xi, tb_pool *pool) {
    const tb_nn_conv_geom *g = j->g;
    tb_cpu_sgemm(0, 0, g->m, j->nb * j->T, g->c, 1.0f, j->u + (size_t)xi * g->m * g->c, g->c,
                 j->v + (size_t)xi * g->c * j->ld, j->ld, 0.0f, (float *)j->mx + (size_t)xi * g->m * j->ld, j->ld,
                 pool);
}

static void gemm_run(void *arg, int ith, int nth) {
    wino_job *j = arg;
    for (int xi = j->nxi * ith / nth; xi < j->nxi * (ith + 1) / nth; xi++) gemm_one(j, xi, NULL);
}

/* the job of image b of the chunk: its input, output, residual and tile columns */
static wino_job image_job(const wino_job *j, int64_t b, tb_cpu_sgemm_epi *e) {
    const tb_nn_conv_geom *g = j->g;
    wino_job o = *j;
    int64_t ohw = g->oh * g->ow;
    o.x = j->x + b * g->c * g->h * g->w;
    o.y = j->y + b * g->m * ohw;
    o.v = j->v + b * j->T;
    o.mx = j->mx + b * j->T;
    if (j->e) {
        *e = *j->e;
        if (e->res) e->res += b * g->m * ohw;
        o.e = e;
    }
    return o;
}

static void input_run(void *arg, int ith, int nth) {
    wino_job *j = arg;
    int64_t c0 = j->g->c * ith / nth, c1 = j->g->c * (ith + 1) / nth;
    float *pad = j->pad + (size_t)(j->hp * j->wp) * (size_t)ith;
    for (int64_t b = 0; b < j->nb; b++) {
        tb_cpu_sgemm_epi e;
        wino_job ib = image_job(j, b, &e);
        if (j->f4) input_transform4_512(&ib, c0, c1, pad);
        else if (j->wide) input_transform512(&ib, c0, c1, pad);
        else input_transform(&ib, c0, c1);
    }
}

static void output_run(void *arg, int ith, int nth) {
    wino_job *j = arg;
    int64_t m0 = j->g->m * ith / nth, m1 = j->g->m * (ith + 1) / nth;
    for (int64_t b = 0; b < j->nb; b++) {
        tb_cpu_sgemm_epi e;
        wino_job ib = image_job(j, b, &e);
        if (j->f4) {
            output_transform4_512(&ib, m0, m1);
            continue;
        }
        if (j->wide) {
            output_transform512(&ib, m0, m1);
            continue;
        }
        output_transform(&ib, m0, m1);
        if (ib.e) {
            int64_t ohw = j->g->oh * j->g->ow;
            tb_cpu_sgemm_epi e2 = *ib.e;
            if (e2.bias) e2.bias += m0;
            if (e2.res) e2.res += m0 * ohw;
            tb_cpu_nn_epilogue(ib.y + m0 * ohw, ohw, m1 - m0, ohw, &e2);
        }
    }
}

tb_status tb_cpu_conv_winograd(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_nn_conv_geom *g, int f4,
                               const float *x, const float *w, const float *bias, const float *res, float *y) {
    TB_ASSERT(g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 && g->group == 1);
    wino_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    j.wide = (tb_cpu_features() & TB_CPU_AVX512F) != 0;
    j.f4 = f4 && j.wide; /* F(4x4) has AVX-512 transforms only */
    int tm = j.f4 ? 4 : 2;
    j.nxi = (tm + 2) * (tm + 2);
    j.th = (g->oh + tm - 1) / tm;
    j.tw = (g->ow + tm - 1) / tm;
    j.T = j.th * j.tw;
    /* padded plane: rows of every tile, and columns of whole 16-tile groups
     * plus those the last tile reads past them */
    j.hp = tm * j.th + 2;
    j.wp = (j.tw + 15) / 16 * 16 * tm + 16;
    float *own;
    const float *u = weights_get(ctx, n, w, g->m, g->c, j.f4, &own);
    if (!u) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for Winograd weights");
    int nth = ctx->pool ? tb_pool_size(ctx->pool) : 1;
    /* images per chunk: their tiles side by side in one GEMM per xi (a
     * 14x14 or 7x7 map alone gives the GEMM an N of 16 to 49), up to about
     * WINO_CHUNK_TILES tiles (more only makes V and M leave the caches) and
     * tile buffers of WINO_CHUNK_BYTES */
    size_t per_image = sizeof(float) * (size_t)(j.nxi * (g->c + g->m) * j.T);
    int64_t chunk = (WINO_CHUNK_TILES + j.T - 1) / j.T;
    if (per_image && chunk > (int64_t)(WINO_CHUNK_BYTES / per_image)) chunk = (int64_t)(WINO_CHUNK_BYTES / per_image);
    if (chunk < 1) chunk = 1;
    if (chunk > g->n) chunk = g->n;
    j.ld = chunk * j.T;
    size_t vn = (size_t)(j.nxi * g->c * j.ld), mn = (size_t)(j.nxi * g->m * j.ld);
    size_t pn = j.wide ? (size_t)(j.hp * j.wp) * (size_t)nth : 0;
    float *buf = tb_cpu_nn_scratch(ctx, sizeof(float) * (vn + mn + pn));
    if (!buf) {
        tb_free_aligned(own);
        return tb_errorf(TB_ERR_OOM, "Conv: out of memory for Winograd tiles");
    }
    j.v = buf;
    j.mx = buf + vn;
    j.pad = buf + vn + mn;
    int64_t ohw = g->oh * g->ow;
    tb_cpu_sgemm_epi e = {0};
    e.bias = bias;
    e.bias_rs = 1;
    e.ld_res = ohw;
    e.act = n->i[10];
    e.p0 = n->f[0];
    e.p1 = n->f[1];
    e.act_after_res = (n->i[11] & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    for (int64_t b = 0; b < g->n; b += chunk) {
        j.nb = g->n - b < chunk ? g->n - b : chunk;
        j.x = x + b * g->c * g->h * g->w;
        j.y = y + b * g->m * ohw;
        e.res = res ? res + b * g->m * ohw : NULL;
        j.e = e.bias || e.res || e.act ? &e : NULL;
        if (nth > 1) tb_pool_run(ctx->pool, input_run, &j);
        else input_run(&j, 0, 1);
        j.u = u;
        /* the products: whole ones per thread (one sync, and no split of a
         * small N between threads), unless they are big enough to split */
        if (nth > 1 && (double)g->m * (double)(j.nb * j.T) * (double)g->c < 4e6) {
            tb_pool_run(ctx->pool, gemm_run, &j);
        } else {
            for (int xi = 0; xi < j.nxi; xi++) gemm_one(&j, xi, ctx->pool);
        }
        if (nth > 1) tb_pool_run(ctx->pool, output_run, &j);
        else output_run(&j, 0, 1);
    }
    tb_free_aligned(own);
    return TB_OK;
}
