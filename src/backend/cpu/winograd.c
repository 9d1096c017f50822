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
 * This form runs in three phases over whole images (transform, 36 GEMMs,
 * transform), each split between the threads; the second form of F(4x4),
 * at the end of the file, runs blocks of 32 tiles start to end on one
 * thread each (tb_cpu_conv_winograd4_fused). Build-time timing picks
 * between them (nn_tune.c).
 */
#include "backend/cpu/nn_conv_impl.h"

#include <immintrin.h>
#include <math.h>
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

/* u[xi] = (G g G^T)[xi] (6x6) for one 3x3 g, G of Lavin and Gray, in
 * double (U is made once, and 1/6, 1/12, 1/24 are not floats) */
static void wino4_g(const float *g, double u[36]) {
    static const double G[6][3] = {{1.0 / 4, 0, 0},
                                   {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                   {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                   {0, 0, 1}};
    double t[6][3]; /* G g */
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 3; k++) t[i][k] = G[i][0] * g[k] + G[i][1] * g[3 + k] + G[i][2] * g[6 + k];
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 6; k++) u[i * 6 + k] = t[i][0] * G[k][0] + t[i][1] * G[k][1] + t[i][2] * G[k][2];
}

/* F(4x4, 3x3): U[xi][m][c] = (G g G^T)[xi] */
static void weights_transform4(const float *w, int64_t M, int64_t C, float *u) {
    size_t plane = (size_t)(M * C);
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < C; c++) {
            double r[36];
            wino4_g(w + (m * C + c) * 9, r);
            for (int xi = 0; xi < 36; xi++) u[(size_t)xi * plane + (size_t)(m * C + c)] = (float)r[xi];
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

/* P = the plane xc with its pads. Only the image's own rows and columns
 * are written: the pads around them are the same positions for every
 * plane, zeroed once per call by input_run (a memset of the whole padded
 * plane per channel, and a libc memcpy per 14- to 56-float row, cost more
 * than the transform itself on the 28x28 and 14x14 maps). */
static W512 void pad_plane(const wino_job *j, const float *xc, float *P) {
    const tb_nn_conv_geom *g = j->g;
    int64_t n = g->w;
    if (g->pl + n > j->wp) n = j->wp - g->pl;
    for (int64_t yy = 0; yy < g->h; yy++) {
        int64_t py = yy + g->pt;
        if (py >= j->hp) break;
        float *d = P + py * j->wp + g->pl;
        const float *s = xc + yy * g->w;
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
            _mm512_mask_storeu_ps(d + i, m, _mm512_maskz_loadu_ps(m, s + i));
        }
    }
}

static W512 void input_transform512(const wino_job *j, int64_t c0, int64_t c1, float *P) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = (size_t)(g->c * j->ld);
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int64_t c = c0; c < c1; c++) {
        /* the plane with its pads, zero outside the image */
        const float *xc = j->x + c * g->h * g->w;
        pad_plane(j, xc, P);
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
        pad_plane(j, xc, P);
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
    if (j->wide && c0 < c1) memset(pad, 0, sizeof(float) * (size_t)(j->hp * j->wp)); /* the pads, for every plane */
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

/* ---------------------------------------------------------------- F(4x4, 3x3) fused by tile blocks
 *
 * The form above transforms a whole chunk of images into V (36, C, tiles),
 * runs 36 GEMMs and transforms M (36, M, tiles) back: V and M are 3.6 MB
 * for a 56x56 map of 64 channels, so every phase streams them through L3,
 * and the threads meet at a barrier between phases with half of V made on
 * the other core. This form works on blocks of WF_NT tiles (the images'
 * tiles flattened: a block crosses tile rows and images, so a 7x7 tile map
 * wastes no lanes), each block on one thread start to end:
 *   Vb (36, C, WF_NT) = B^T d B of the block's tiles, all input channels;
 *   per group of WF_MB output channels: Mb (36, WF_MB, WF_NT) = U x Vb by a
 *   register-tiled kernel (WF_MB channels by WF_NT tiles in 16 zmm, the
 *   weights U packed (36, M / WF_MB, C, WF_MB) once per context), then
 *   y = A^T Mb A with the epilogue (bias, ReLU / Clip, residual) applied in
 *   registers on the way to the output.
 * Vb (295 KB at 64 channels) stays in L2, Mb (37 KB) in L1. A map of few
 * blocks (batch 1 at 28x28 or 14x14) is split by groups of output channels
 * too, so both threads have work; each then transforms the block itself.
 */

#define WF_NT 32 /* tiles per block: two vectors */
#define WF_MB 8  /* output channels per register tile */
/* the floats between Vb's (Mb's) planes xi: a cache line more than the
 * plane, since a power-of-2 stride put all 36 stores (loads) of a tile into
 * one L1 set: the input transform ran 7x slower than its instructions */
#define WF_VPLANE(C) ((size_t)(C) * WF_NT + 16)
#define WF_MPLANE ((size_t)(WF_MB * WF_NT + 16))
#define WF_STRIP 80 /* floats of a run's input row: 16 tiles read 66 */

/* U packed for the fused form: [xi][m / WF_MB][c][m % WF_MB], the channels
 * past M zero */
static void make_u4f(const float *w, float *u, const void *arg) {
    const wshape *s = arg;
    int64_t M = s->m, C = s->c, nmb = (M + WF_MB - 1) / WF_MB;
    memset(u, 0, sizeof(float) * (size_t)(36 * nmb * C * WF_MB));
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < C; c++) {
            double r[36];
            wino4_g(w + (m * C + c) * 9, r);
            for (int xi = 0; xi < 36; xi++)
                u[((size_t)(xi * nmb + m / WF_MB) * (size_t)C + (size_t)c) * WF_MB + (size_t)(m % WF_MB)] = (float)r[xi];
        }
}

typedef struct {
    const tb_nn_conv_geom *g;
    const float *x;      /* (n, c, h, w) */
    const float *u;      /* make_u4f */
    const float *bias, *res;
    float *y;
    int act, after, fuse;
    float p0, p1;
    int64_t th, tw, T, total; /* tiles of an image, of all images */
    int64_t nblk, nmb, msplit, items;
    float *buf;          /* per thread: Vb then Mb */
    size_t per_thread;
} wf_job;

/* acc[r][v] = sum over c of u[c][r] v[c][16 v, 16 v + 16): the WF_MB x 16 nv
 * register tile over K = C; out (WF_MB, WF_NT) */
static inline __attribute__((target("avx512f,avx2,fma"), always_inline)) void
wf_gemm_t(const float *u, const float *v, int64_t C, float *out, const int nv) {
    __m512 acc[WF_MB][2];
#pragma GCC unroll 8
    for (int r = 0; r < WF_MB; r++)
#pragma GCC unroll 2
        for (int k = 0; k < nv; k++) acc[r][k] = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; c++, u += WF_MB, v += WF_NT) {
        __m512 v0 = _mm512_load_ps(v), v1 = nv > 1 ? _mm512_load_ps(v + 16) : v0;
#pragma GCC unroll 8
        for (int r = 0; r < WF_MB; r++) {
            __m512 b = _mm512_set1_ps(u[r]);
            acc[r][0] = _mm512_fmadd_ps(b, v0, acc[r][0]);
            if (nv > 1) acc[r][1] = _mm512_fmadd_ps(b, v1, acc[r][1]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < WF_MB; r++)
#pragma GCC unroll 2
        for (int k = 0; k < nv; k++) _mm512_store_ps(out + r * WF_NT + 16 * k, acc[r][k]);
}

static W512 void wf_gemm1(const float *u, const float *v, int64_t C, float *out) { wf_gemm_t(u, v, C, out, 1); }
static W512 void wf_gemm2(const float *u, const float *v, int64_t C, float *out) { wf_gemm_t(u, v, C, out, 2); }

/* the tiles [t0, t1) of the flattened tile index as runs within one tile row:
 * image, tile row, first tile column, count (at most 16) */
typedef struct {
    int64_t img, ty, tx, n, off; /* off: the run's first lane in the block */
} wf_run;

static int wf_runs(const wf_job *j, int64_t t0, int64_t t1, wf_run *r) {
    int nr = 0;
    for (int64_t t = t0; t < t1;) {
        int64_t img = t / j->T, q = t % j->T, ty = q / j->tw, tx = q % j->tw;
        int64_t n = j->tw - tx;
        if (n > 16) n = 16;
        if (n > t1 - t) n = t1 - t;
        r[nr++] = (wf_run){img, ty, tx, n, t - t0};
        t += n;
    }
    return nr;
}

/* d[k][t] = p[4 t + k], k < 6, t < 16: the six columns of 16 tiles' patch
 * row from 4 loads, a two-level 4-way deinterleave and two lane shifts (8
 * two-source permutes and 3 shifts, against 18 shuffles and 24 loads as six
 * stride4_512 gathers); reads p[0, 66) */
static inline __attribute__((target("avx512f,avx2,fma"), always_inline)) void wf_row6(const float *p, __m512 d[6]) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 a0 = _mm512_loadu_ps(p), a1 = _mm512_loadu_ps(p + 16), a2 = _mm512_loadu_ps(p + 32),
           a3 = _mm512_loadu_ps(p + 48);
    __m512 e01 = _mm512_permutex2var_ps(a0, ev, a1), o01 = _mm512_permutex2var_ps(a0, od, a1);
    __m512 e23 = _mm512_permutex2var_ps(a2, ev, a3), o23 = _mm512_permutex2var_ps(a2, od, a3);
    d[0] = _mm512_permutex2var_ps(e01, ev, e23); /* p[4 t] */
    d[2] = _mm512_permutex2var_ps(e01, od, e23); /* p[4 t + 2] */
    d[1] = _mm512_permutex2var_ps(o01, ev, o23); /* p[4 t + 1] */
    d[3] = _mm512_permutex2var_ps(o01, od, o23); /* p[4 t + 3] */
    __m512i tail = _mm512_castps_si512(_mm512_maskz_loadu_ps(0x3, p + 64)); /* p[64], p[65] */
    d[4] = _mm512_castsi512_ps(_mm512_alignr_epi32(tail, _mm512_castps_si512(d[0]), 1));
    __m512i t5 = _mm512_alignr_epi32(tail, tail, 1); /* lane 0: p[65] */
    d[5] = _mm512_castsi512_ps(_mm512_alignr_epi32(t5, _mm512_castps_si512(d[1]), 1));
}

/* Vb[xi][c][lanes of the runs] = (B^T d B)[xi]: along each patch row first
 * (d B), then down the columns */
static W512 void wf_input(const wf_job *j, const wf_run *runs, int nr, float *vb) {
    const tb_nn_conv_geom *g = j->g;
    size_t plane = WF_VPLANE(g->c);
    int64_t hw = g->h * g->w;
    float strip[6][WF_STRIP] __attribute__((aligned(64)));
    /* by channels, then runs: the block's rows of one plane are read in
     * order (its tiles are consecutive tile rows) */
    for (int64_t c = 0; c < g->c; c++)
        for (int q = 0; q < nr; q++) {
            const wf_run *r = &runs[q];
            __mmask16 m = (__mmask16)((1u << r->n) - 1);
            /* the run's six input rows, zero outside the image (the pads):
             * no padded copy of the input, which at batch 8 was a pass over
             * 7 MB out to memory and back per conv */
            const float *xc = j->x + (r->img * g->c + c) * hw;
            int64_t x0 = 4 * r->tx - g->pl;
            for (int i = 0; i < 6; i++) {
                int64_t yy = 4 * r->ty + i - g->pt;
                int inside = yy >= 0 && yy < g->h;
                for (int v = 0; v < WF_STRIP / 16; v++) {
                    int64_t s0 = x0 + 16 * v, lb = s0 < 0 ? -s0 : 0, ub = g->w - s0;
                    if (ub > 16) ub = 16;
                    __mmask16 k = 0;
                    if (inside && ub > lb) k = (__mmask16)(((1u << ub) - 1) & ~((1u << lb) - 1));
                    _mm512_store_ps(strip[i] + 16 * v, _mm512_maskz_loadu_ps(k, xc + yy * g->w + s0));
                }
            }
            __m512 t[6][6]; /* t[k][i]: row i of d B, column k */
            for (int i = 0; i < 6; i++) {
                __m512 d[6], w[6];
                wf_row6(strip[i], d);
                WINO4_BT(d, w);
                for (int k = 0; k < 6; k++) t[k][i] = w[k];
            }
            float *v = vb + (size_t)(c * WF_NT + r->off);
            for (int k = 0; k < 6; k++) {
                __m512 w[6];
                WINO4_BT(t[k], w);
                for (int i = 0; i < 6; i++) _mm512_mask_storeu_ps(v + (size_t)(i * 6 + k) * plane, m, w[i]);
            }
        }
}

/* y for channels [m0, m0 + nm) of the runs = epi(A^T Mb A); Mb (36, WF_MB, WF_NT) */
static W512 void wf_output(const wf_job *j, const wf_run *runs, int nr, const float *mb, int64_t m0, int nm) {
    const tb_nn_conv_geom *g = j->g;
    const __m512i p01l = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i p01h = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i q0 = _mm512_setr_epi32(0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
    const __m512i q1 = _mm512_setr_epi32(8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
    const __m512 lo = _mm512_set1_ps(j->act == TB_NN_ACT_RELU ? 0.0f : j->p0);
    const __m512 hi = _mm512_set1_ps(j->act == TB_NN_ACT_RELU ? INFINITY : j->p1);
    int clamp = j->fuse && j->act != TB_NN_ACT_NONE;
    int64_t ohw = g->oh * g->ow;
    const size_t plane = WF_MPLANE;
    for (int mm = 0; mm < nm; mm++) {
        int64_t m = m0 + mm;
        __m512 bv = _mm512_set1_ps(j->bias ? j->bias[m] : 0.0f);
        for (int q = 0; q < nr; q++) {
            const wf_run *rn = &runs[q];
            __mmask16 tm = (__mmask16)((1u << rn->n) - 1);
            const float *src = mb + (size_t)(mm * WF_NT + rn->off);
            __m512 r[4][6]; /* A^T a, by columns */
            for (int k = 0; k < 6; k++) {
                __m512 a[6], o[4];
                for (int i = 0; i < 6; i++) a[i] = _mm512_maskz_loadu_ps(tm, src + (size_t)(i * 6 + k) * plane);
                WINO4_AT(a, o);
                for (int i = 0; i < 4; i++) r[i][k] = o[i];
            }
            int64_t o0 = (rn->img * g->m + m) * ohw;
            int64_t cols = g->ow - 4 * rn->tx;
            if (cols > 4 * rn->n) cols = 4 * rn->n;
            for (int i = 0; i < 4; i++) {
                int64_t oy = 4 * rn->ty + i;
                if (oy >= g->oh) break;
                __m512 o[4];
                WINO4_AT(r[i], o);
                __m512 a01l = _mm512_permutex2var_ps(o[0], p01l, o[1]), a01h = _mm512_permutex2var_ps(o[0], p01h, o[1]);
                __m512 a23l = _mm512_permutex2var_ps(o[2], p01l, o[3]), a23h = _mm512_permutex2var_ps(o[2], p01h, o[3]);
                __m512 out[4] = {_mm512_permutex2var_ps(a01l, q0, a23l), _mm512_permutex2var_ps(a01l, q1, a23l),
                                 _mm512_permutex2var_ps(a01h, q0, a23h), _mm512_permutex2var_ps(a01h, q1, a23h)};
                int64_t at = o0 + oy * g->ow + 4 * rn->tx;
                float *dst = j->y + at;
                const float *rs = j->res ? j->res + at : NULL;
                for (int k = 0; k < 4 && cols > 16 * k; k++) {
                    int64_t n = cols - 16 * k;
                    __mmask16 km = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
                    __m512 v = out[k];
                    if (j->fuse) {
                        v = _mm512_add_ps(v, bv);
                        __m512 rv = rs ? _mm512_maskz_loadu_ps(km, rs + 16 * k) : _mm512_setzero_ps();
                        if (j->after) v = _mm512_add_ps(v, rv);
                        if (clamp) v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                        if (!j->after) v = _mm512_add_ps(v, rv);
                    }
                    _mm512_mask_storeu_ps(dst + 16 * k, km, v);
                }
                if (!j->fuse) { /* the other activations: the sgemm epilogue on the row just written */
                    tb_cpu_sgemm_epi e = {0};
                    e.bias = j->bias ? j->bias + m : NULL;
                    e.res = rs;
                    e.ld_res = cols;
                    e.act = j->act;
                    e.p0 = j->p0;
                    e.p1 = j->p1;
                    e.act_after_res = j->after;
                    tb_cpu_nn_epilogue(dst, cols, 1, cols, &e);
                }
            }
        }
    }
}

/* The work before item it, in vectors of tiles times groups of output
 * channels: a last block of 16 tiles or fewer costs half a full one. */
static int64_t wf_cost_before(const wf_job *j, int64_t it) {
    int64_t b = it / j->msplit, part = it % j->msplit, last = j->total - (j->nblk - 1) * WF_NT;
    int64_t nv = b == j->nblk - 1 && last <= 16 ? 1 : 2;
    return 2 * b * j->nmb + nv * (j->nmb * part / j->msplit);
}

/* the first item whose work starts at or after cost */
static int64_t wf_item_at(const wf_job *j, int64_t cost) {
    int64_t lo = 0, hi = j->items; /* wf_cost_before rises with it */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (wf_cost_before(j, mid) < cost) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void wf_run_items(void *arg, int ith, int nth) {
    wf_job *j = arg;
    const tb_nn_conv_geom *g = j->g;
    float *vb = j->buf + j->per_thread * (size_t)ith;
    float *mb = vb + 36 * WF_VPLANE(g->c);
    int64_t have = -1; /* the block in vb */
    wf_run runs[WF_NT];
    int nr = 0;
    /* the threads' shares split the work, not the item count: items of a
     * short last block are cheap (56x56 at batch 1: 6 blocks and 4 tiles) */
    int64_t last = j->total - (j->nblk - 1) * WF_NT;
    int64_t work = 2 * (j->nblk - 1) * j->nmb + (last <= 16 ? 1 : 2) * j->nmb;
    int64_t i0 = wf_item_at(j, work * ith / nth), i1 = ith + 1 == nth ? j->items : wf_item_at(j, work * (ith + 1) / nth);
    for (int64_t it = i0; it < i1; it++) {
        int64_t b = it / j->msplit, part = it % j->msplit;
        int64_t t0 = b * WF_NT, t1 = t0 + WF_NT < j->total ? t0 + WF_NT : j->total;
        int nv = t1 - t0 > 16 ? 2 : 1;
        if (b != have) {
            nr = wf_runs(j, t0, t1, runs);
            if (t1 - t0 < 16 * nv) memset(vb, 0, sizeof(float) * 36 * WF_VPLANE(g->c)); /* lanes past the tiles */
            wf_input(j, runs, nr, vb);
            have = b;
        }
        int64_t mb0 = j->nmb * part / j->msplit, mb1 = j->nmb * (part + 1) / j->msplit;
        for (int64_t q = mb0; q < mb1; q++) {
            for (int xi = 0; xi < 36; xi++) {
                const float *u = j->u + (size_t)((xi * j->nmb + q) * g->c) * WF_MB;
                const float *v = vb + (size_t)xi * WF_VPLANE(g->c);
                float *o = mb + (size_t)xi * WF_MPLANE;
                if (nv == 2) wf_gemm2(u, v, g->c, o);
                else wf_gemm1(u, v, g->c, o);
            }
            int64_t m0 = q * WF_MB;
            int nm = (int)(g->m - m0 < WF_MB ? g->m - m0 : WF_MB);
            wf_output(j, runs, nr, mb, m0, nm);
        }
    }
}

tb_status tb_cpu_conv_winograd4_fused(tb_cpu_nn_ctx *ctx, const tb_node *n, const tb_nn_conv_geom *g, const float *x,
                                      const float *w, const float *bias, const float *res, float *y) {
    TB_ASSERT(g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 && g->group == 1);
    if (!(tb_cpu_features() & TB_CPU_AVX512F)) /* the transforms are AVX-512 only */
        return tb_cpu_conv_winograd(ctx, n, g, 0, x, w, bias, res, y);
    wf_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    j.th = (g->oh + 3) / 4;
    j.tw = (g->ow + 3) / 4;
    j.T = j.th * j.tw;
    j.total = g->n * j.T;
    j.nmb = (g->m + WF_MB - 1) / WF_MB;
    j.nblk = (j.total + WF_NT - 1) / WF_NT;
    int nth = ctx->pool ? tb_pool_size(ctx->pool) : 1;
    /* few blocks: groups of output channels as work items too (4 per thread) */
    j.msplit = (4 * nth + j.nblk - 1) / j.nblk;
    if (j.msplit > j.nmb) j.msplit = j.nmb;
    if (j.msplit < 1 || nth == 1) j.msplit = 1;
    j.items = j.nblk * j.msplit;
    j.per_thread = 36 * WF_VPLANE(g->c) + 36 * WF_MPLANE;
    float *scratch = tb_cpu_nn_scratch(ctx, sizeof(float) * j.per_thread * (size_t)nth);
    if (!scratch) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for Winograd tiles");
    j.buf = scratch;
    wshape sh = {g->m, g->c};
    size_t ufloats = (size_t)(36 * j.nmb * WF_MB * g->c);
    float *own = NULL;
    j.u = tb_cpu_nn_wpack(ctx, n, 1, w, TB_WPACK_WINO4F, g->m, g->c, 0, ufloats, make_u4f, &sh);
    if (!j.u) {
        own = tb_alloc_aligned(sizeof(float) * ufloats, 64);
        if (!own) return tb_errorf(TB_ERR_OOM, "Conv: out of memory for Winograd weights");
        make_u4f(w, own, &sh);
        j.u = own;
    }
    j.x = x;
    j.y = y;
    j.bias = bias;
    j.res = res;
    j.act = n->i[10];
    j.p0 = n->f[0];
    j.p1 = n->f[1];
    j.after = (n->i[11] & TB_NN_ACT_AFTER_RESIDUAL) != 0;
    j.fuse = j.act == TB_NN_ACT_NONE || j.act == TB_NN_ACT_RELU || j.act == TB_NN_ACT_CLIP;
    if (nth > 1 && j.items > 1) tb_pool_run(ctx->pool, wf_run_items, &j);
    else wf_run_items(&j, 0, 1);
    tb_free_aligned(own);
    return TB_OK;
}
