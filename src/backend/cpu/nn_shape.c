/*
 * nn_shape.c — fast CPU kernels of the shape, data-movement and pooling ops
 * (nn.h); the ops left out (Shape, Range, ConstantOfShape, Trilu, Resize)
 * run their references.
 *
 * Data movement is one engine: an output walked in order reads its input
 * through element strides (Transpose, Slice, Expand). Dims are coalesced
 * first, then the walk is row copies (memcpy) when the innermost stride is 1,
 * tiled 2-d transposes when another dim has input stride 1 (BERT's
 * (0, 2, 1, 3) keeps rows of head_dim; (0, 2, 3, 1) and (0, 1, 3, 2) become
 * batched transposes), and element copies otherwise. Work is split over the
 * pool by output rows or tiles.
 *
 * Pools (f32, NCHW) reduce over rows: the kh input rows of an output row are
 * combined into one padded row (vectorised), split into `stride` phases, and
 * each of the kw taps is then one vectorised pass over a contiguous slice of
 * a phase. Planes (n, c) are split over the pool.
 */
#include "backend/cpu/nn.h"
#include "ir/nn_shape.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TB_NN_X86 1
#define AVX2_FN __attribute__((target("avx2,fma")))
#endif

/* ================================================================ parallel loops */

typedef void (*range_fn)(void *arg, int64_t lo, int64_t hi);

typedef struct {
    range_fn fn;
    void *arg;
    int64_t n;
} par_job;

static void par_run(void *a, int ith, int nth) {
    par_job *j = a;
    int64_t per = (j->n + nth - 1) / nth, lo = per * ith, hi = lo + per < j->n ? lo + per : j->n;
    if (lo < hi) j->fn(j->arg, lo, hi);
}

/* fn over [0, n) items, split over the pool when the work (bytes moved or
 * touched) is worth it. */
static void par_for(tb_cpu_nn_ctx *c, int64_t n, int64_t work, range_fn fn, void *arg) {
    if (!c || !c->pool || tb_pool_size(c->pool) < 2 || n < 2 || work < (1 << 16)) {
        if (n > 0) fn(arg, 0, n);
        return;
    }
    par_job j = {fn, arg, n};
    tb_pool_run(c->pool, par_run, &j);
}

static int nthreads(tb_cpu_nn_ctx *c) { return c && c->pool ? tb_pool_size(c->pool) : 1; }

/* ================================================================ copies */

typedef struct {
    uint8_t *dst;
    const uint8_t *src;
} copy_job;

#define COPY_CHUNK ((int64_t)1 << 18)

static void copy_range(void *a, int64_t lo, int64_t hi) {
    copy_job *j = a;
    memcpy(j->dst + lo * COPY_CHUNK, j->src + lo * COPY_CHUNK, (size_t)((hi - lo) * COPY_CHUNK));
}

static void par_memcpy(tb_cpu_nn_ctx *c, void *dst, const void *src, size_t n) {
    if (!n || dst == src) return;
    int64_t chunks = (int64_t)(n / COPY_CHUNK);
    copy_job j = {dst, src};
    if (chunks >= 2) par_for(c, chunks, (int64_t)n, copy_range, &j);
    else chunks = 0;
    size_t done = (size_t)chunks * COPY_CHUNK;
    memcpy((uint8_t *)dst + done, (const uint8_t *)src + done, n - done);
}

/* Reshape, Squeeze, Unsqueeze, Flatten: the bytes as they are (nothing when
 * the executor aliased the buffers). */
static tb_status fast_copy(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                           int n_out) {
    int64_t ne = tb_view_numel(&in[0]);
    if (ne != tb_view_numel(&out[0]))
        return tb_errorf(TB_ERR_FORMAT, "%s: %lld elements into %lld", tb_op_name(n->op), (long long)ne,
                         (long long)tb_view_numel(&out[0]));
    par_memcpy(c, out[0].data, in[0].data, (size_t)ne * tb_dtype_size(in[0].dtype));
    return TB_OK;
}

/* ================================================================ the strided walk */

typedef struct {
    int r;
    int64_t od[TB_MAX_RANK]; /* output dims, coalesced                      */
    int64_t st[TB_MAX_RANK]; /* input element stride of each output dim    */
    int64_t os[TB_MAX_RANK]; /* output element stride                       */
    int64_t base;
    size_t es;
    const uint8_t *src;
    uint8_t *dst;
    int tk;                  /* transpose: the out dim read with stride 1    */
    int64_t tiles;           /* tiles of dim tk per outer index            */
} walk;

#define TILE 32

/* Drops dims of 1 and merges neighbours that are contiguous in the input. */
static void walk_coalesce(walk *w, int r, const int64_t *od, const int64_t *st) {
    int k = 0;
    for (int i = 0; i < r; i++) {
        if (od[i] == 1) continue;
        if (k > 0 && w->st[k - 1] == st[i] * od[i]) {
            w->od[k - 1] *= od[i];
            w->st[k - 1] = st[i];
            continue;
        }
        w->od[k] = od[i];
        w->st[k] = st[i];
        k++;
    }
    w->r = k;
    int64_t s = 1;
    for (int i = k - 1; i >= 0; i--) { w->os[i] = s; s *= w->od[i]; }
}

/* Input offset of the start of output row `row` (dims [0, r - 1)), and the
 * odometer of that row, skipping dim `skip` (-1: none). */
static int64_t walk_offset(const walk *w, int64_t row, int last, int skip, int64_t *idx) {
    int64_t off = w->base;
    for (int d = last - 1; d >= 0; d--) {
        if (d == skip) { idx[d] = 0; continue; }
        idx[d] = row % w->od[d];
        row /= w->od[d];
        off += idx[d] * w->st[d];
    }
    return off;
}

static int64_t walk_next(const walk *w, int last, int skip, int64_t *idx, int64_t off) {
    for (int d = last - 1; d >= 0; d--) {
        if (d == skip) continue;
        if (++idx[d] < w->od[d]) return off + w->st[d];
        off -= w->st[d] * (w->od[d] - 1);
        idx[d] = 0;
    }
    return off;
}

/* rows [lo, hi) of the output, each od[r-1] elements */
static void walk_rows(void *a, int64_t lo, int64_t hi) {
    walk *w = a;
    int r = w->r;
    int64_t n = w->od[r - 1], s = w->st[r - 1], idx[TB_MAX_RANK];
    size_t es = w->es;
    int64_t off = walk_offset(w, lo, r - 1, -1, idx);
    for (int64_t row = lo; row < hi; row++) {
        uint8_t *d = w->dst + (size_t)(row * n) * es;
        const uint8_t *src = w->src + off * (int64_t)es;
        if (s == 1) memcpy(d, src, (size_t)n * es);
        else if (es == 4)
            for (int64_t i = 0; i < n; i++) ((uint32_t *)d)[i] = *(const uint32_t *)(src + i * s * 4);
        else if (es == 2)
            for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i] = *(const uint16_t *)(src + i * s * 2);
        else
            for (int64_t i = 0; i < n; i++) memcpy(d + i * es, src + i * s * (int64_t)es, es);
        off = walk_next(w, r - 1, -1, idx, off);
    }
}

/* A TILE x (all of dim r-1) block: out[.., i, .., j] = in[off + i + j * sj]. */
#define TRANSPOSE_TILE(T)                                                                  \
    do {                                                                                   \
        const T *s_ = (const T *)src;                                                      \
        T *d_ = (T *)dst;                                                                  \
        for (int64_t j0 = 0; j0 < nj; j0 += TILE) {                                        \
            int64_t j1 = j0 + TILE < nj ? j0 + TILE : nj;                                  \
            for (int64_t i = i0; i < i1; i++) {                                            \
                T *dr = d_ + i * osk;                                                      \
                const T *sr = s_ + i;                                                      \
                for (int64_t j = j0; j < j1; j++) dr[j] = sr[j * sj];                      \
            }                                                                              \
        }                                                                                  \
    } while (0)

static void walk_tiles(void *a, int64_t lo, int64_t hi) {
    walk *w = a;
    int r = w->r, k = w->tk;
    int64_t nj = w->od[r - 1], sj = w->st[r - 1], osk = w->os[k], ni = w->od[k], idx[TB_MAX_RANK];
    for (int64_t t = lo; t < hi; t++) {
        int64_t outer = t / w->tiles, i0 = t % w->tiles * TILE, i1 = i0 + TILE < ni ? i0 + TILE : ni;
        int64_t off = walk_offset(w, outer, r - 1, k, idx), ooff = 0;
        for (int d = 0; d < r - 1; d++)
            if (d != k) ooff += idx[d] * w->os[d];
        const uint8_t *src = w->src + off * (int64_t)w->es;
        uint8_t *dst = w->dst + ooff * (int64_t)w->es;
        switch (w->es) {
        case 4: TRANSPOSE_TILE(uint32_t); break;
        case 2: TRANSPOSE_TILE(uint16_t); break;
        case 1: TRANSPOSE_TILE(uint8_t); break;
        case 8: TRANSPOSE_TILE(uint64_t); break;
        default:
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = 0; j < nj; j++)
                    memcpy(dst + (i * osk + j) * w->es, src + (i + j * sj) * w->es, w->es);
        }
    }
}

/* out (contiguous, dims od[r]) = in[base + sum_k j_k st[k]]. */
static void strided_copy(tb_cpu_nn_ctx *c, void *dst, const void *src, int r, const int64_t *od,
                         const int64_t *st, int64_t base, size_t es) {
    int64_t total = 1;
    for (int i = 0; i < r; i++) total *= od[i];
    if (total == 0) return;
    walk w;
    memset(&w, 0, sizeof w);
    walk_coalesce(&w, r, od, st);
    w.base = base;
    w.es = es;
    w.src = src;
    w.dst = dst;
    if (w.r == 0) { memcpy(dst, (const uint8_t *)src + base * (int64_t)es, es); return; }
    int64_t bytes = total * (int64_t)es;
    int last = w.r - 1;
    w.tk = -1;
    if (w.st[last] != 1 && w.od[last] >= 4)
        for (int k = 0; k < last; k++)
            if (w.st[k] == 1 && w.od[k] >= 4) w.tk = k;
    if (w.tk < 0) {
        par_for(c, total / w.od[last], bytes, walk_rows, &w);
        return;
    }
    w.tiles = (w.od[w.tk] + TILE - 1) / TILE;
    par_for(c, total / (w.od[last] * w.od[w.tk]) * w.tiles, bytes, walk_tiles, &w);
}

static tb_status fast_transpose(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                                int n_out) {
    int perm[TB_MAX_RANK], r = in[0].rank;
    TB_TRY(tb_nn_transpose_perm(n, r, perm));
    int64_t ist[TB_MAX_RANK], st[TB_MAX_RANK], s = 1;
    for (int i = r - 1; i >= 0; i--) { ist[i] = s; s *= in[0].dims[i]; }
    for (int k = 0; k < r; k++) st[k] = ist[perm[k]];
    strided_copy(c, out[0].data, in[0].data, r, out[0].dims, st, 0, tb_dtype_size(in[0].dtype));
    return TB_OK;
}

static tb_status fast_slice(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                            int n_out) {
    int64_t st[TB_MAX_RANK], base;
    TB_TRY(tb_nn_slice_plan(in, n_in, &out[0], &base, st));
    strided_copy(c, out[0].data, in[0].data, out[0].rank, out[0].dims, st, base, tb_dtype_size(in[0].dtype));
    return TB_OK;
}

static tb_status fast_expand(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    int64_t st[TB_MAX_RANK];
    tb_nn_broadcast_strides(&in[0], &out[0], st);
    strided_copy(c, out[0].data, in[0].data, out[0].rank, out[0].dims, st, 0, tb_dtype_size(in[0].dtype));
    return TB_OK;
}

/* ================================================================ Concat, Split, Gather */

/* Blocks (outer row j, part k): the part's row of inner elements. */
typedef struct {
    int parts;
    const uint8_t *src[TB_MAX_INPUTS];
    uint8_t *dst[TB_MAX_INPUTS];
    size_t row[TB_MAX_INPUTS];  /* bytes of part k in one outer row      */
    size_t prefix[TB_MAX_INPUTS];
    size_t whole;               /* bytes of one outer row of the joined  */
    int join;                   /* 1: Concat (parts -> whole), 0: Split  */
} join_job;

static void join_range(void *a, int64_t lo, int64_t hi) {
    join_job *j = a;
    for (int64_t t = lo; t < hi; t++) {
        int64_t o = t / j->parts;
        int k = (int)(t % j->parts);
        size_t n = j->row[k];
        if (!n) continue;
        if (j->join) memcpy(j->dst[0] + (size_t)o * j->whole + j->prefix[k], j->src[k] + (size_t)o * n, n);
        else memcpy(j->dst[k] + (size_t)o * n, j->src[0] + (size_t)o * j->whole + j->prefix[k], n);
    }
}

static tb_status fast_join(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *whole, const tb_view *parts,
                           int n_parts, int join) {
    int axis = n->i[0], r = whole->rank;
    size_t es = tb_dtype_size(whole->dtype);
    int64_t outer = 1, inner = 1, sum = 0;
    for (int d = 0; d < axis; d++) outer *= whole->dims[d];
    for (int d = axis + 1; d < r; d++) inner *= whole->dims[d];
    join_job j;
    memset(&j, 0, sizeof j);
    j.parts = n_parts;
    j.join = join;
    for (int k = 0; k < n_parts; k++) {
        j.row[k] = (size_t)(parts[k].dims[axis] * inner) * es;
        j.prefix[k] = (size_t)(sum * inner) * es;
        sum += parts[k].dims[axis];
        if (join) j.src[k] = parts[k].data;
        else j.dst[k] = parts[k].data;
    }
    if (sum != whole->dims[axis])
        return tb_errorf(TB_ERR_FORMAT, "%s: parts add up to %lld along axis %d, not %lld", tb_op_name(n->op),
                         (long long)sum, axis, (long long)whole->dims[axis]);
    j.whole = (size_t)(sum * inner) * es;
    if (join) j.dst[0] = whole->data;
    else j.src[0] = whole->data;
    par_for(c, outer * n_parts, (int64_t)(outer * j.whole), join_range, &j);
    return TB_OK;
}

static tb_status fast_concat(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    return fast_join(c, n, &out[0], in, n_in, 1);
}

static tb_status fast_split(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                            int n_out) {
    return fast_join(c, n, &in[0], out, n_out, 0);
}

typedef struct {
    const tb_view *ix;
    const uint8_t *src;
    uint8_t *dst;
    size_t row;
    int64_t A;
} gather_job;

static void gather_range(void *a, int64_t lo, int64_t hi) {
    gather_job *j = a;
    for (int64_t t = lo; t < hi; t++) {
        int64_t i = tb_view_get_i(j->ix, t);
        if (i < 0) i += j->A;
        memcpy(j->dst + (size_t)t * j->row, j->src + (size_t)i * j->row, j->row);
    }
}

/* Gather along axis 0 (embeddings): one row copy per index. */
static tb_status fast_gather(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                             int n_out) {
    if (n->i[0] != 0) return tb_op_get_def(n->op)->ref(n, in, n_in, out, n_out);
    const tb_view *x = &in[0], *ix = &in[1];
    int64_t A = x->dims[0], ni = tb_view_numel(ix), inner = 1;
    for (int d = 1; d < x->rank; d++) inner *= x->dims[d];
    for (int64_t t = 0; t < ni; t++) {
        int64_t i = tb_view_get_i(ix, t);
        if (i < -A || i >= A)
            return tb_errorf(TB_ERR_INVALID_ARG, "Gather: index %lld outside [-%lld, %lld)", (long long)i,
                             (long long)A, (long long)A);
    }
    gather_job j = {ix, x->data, out[0].data, (size_t)inner * tb_dtype_size(x->dtype), A};
    par_for(c, ni, (int64_t)(ni * j.row), gather_range, &j);
    return TB_OK;
}

/* ================================================================ row primitives (f32) */

static int use_avx2(void) {
#ifdef TB_NN_X86
    static int v = -1;
    if (v < 0) {
        uint32_t f = tb_cpu_features();
        v = (f & (TB_CPU_AVX2 | TB_CPU_FMA)) == (TB_CPU_AVX2 | TB_CPU_FMA);
    }
    return v;
#else
    return 0;
#endif
}

#ifdef TB_NN_X86
AVX2_FN static void row_max_avx2(float *d, const float *s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_max_ps(_mm256_loadu_ps(d + i), _mm256_loadu_ps(s + i)));
    for (; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];
}
AVX2_FN static void row_add_avx2(float *d, const float *s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i), _mm256_loadu_ps(s + i)));
    for (; i < n; i++) d[i] += s[i];
}
AVX2_FN static float row_sum_avx2(const float *s, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(s + i + 8));
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s + i));
    a0 = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float t = _mm_cvtss_f32(h);
    for (; i < n; i++) t += s[i];
    return t;
}
AVX2_FN static int64_t deinterleave2_avx2(float *e, float *o, const float *s, int64_t n) {
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 a = _mm256_loadu_ps(s + 2 * t), b = _mm256_loadu_ps(s + 2 * t + 8);
        __m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        _mm256_storeu_ps(e + t, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), _MM_SHUFFLE(3, 1, 2, 0))));
        _mm256_storeu_ps(o + t, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), _MM_SHUFFLE(3, 1, 2, 0))));
    }
    return t;
}
#endif

/* e[t] = s[2t], o[t] = s[2t + 1] for t < n */
static void deinterleave2(float *e, float *o, const float *s, int64_t n) {
    int64_t t = 0;
#ifdef TB_NN_X86
    if (use_avx2()) t = deinterleave2_avx2(e, o, s, n);
#endif
    for (; t < n; t++) { e[t] = s[2 * t]; o[t] = s[2 * t + 1]; }
}

/* d = max(d, s) / d += s over n floats (d and s do not overlap). */
static void row_max(float *restrict d, const float *restrict s, int64_t n) {
#ifdef TB_NN_X86
    if (use_avx2()) { row_max_avx2(d, s, n); return; }
#endif
    for (int64_t i = 0; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];
}

static void row_add(float *restrict d, const float *restrict s, int64_t n) {
#ifdef TB_NN_X86
    if (use_avx2()) { row_add_avx2(d, s, n); return; }
#endif
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
}

static float row_sum(const float *s, int64_t n) {
#ifdef TB_NN_X86
    if (use_avx2()) return row_sum_avx2(s, n);
#endif
    float t = 0;
    for (int64_t i = 0; i < n; i++) t += s[i];
    return t;
}

/* ================================================================ pools (f32) */

typedef struct {
    tb_nn_conv_geom g;
    const float *x;
    float *y;
    float *scratch;    /* per thread: stride */
    int64_t per_thread, lv, pl_len;
    int is_max, incl;
} pool_job;

static void pool_plane_row(const pool_job *j, const float *xp, float *yr, int64_t oh, float *vm, float *ph,
                           float *cw) {
    const tb_nn_conv_geom *g = &j->g;
    float pad = j->is_max ? -INFINITY : 0.0f;
    int64_t W = g->w, OW = g->ow, s = g->sw;
    /* vertical: the valid input rows of this output row into vm[pl, pl + W)
     * (the borders hold the pad value from the first row on) */
    int ch = 0, first = 1;
    for (int a = 0; a < g->kh; a++) {
        int64_t ih = oh * g->sh - g->pt + (int64_t)a * g->dh;
        if (j->incl) ch += ih >= -g->pt && ih < g->h + g->pb;
        if (ih < 0 || ih >= g->h) continue;
        if (!j->incl) ch++;
        const float *row = xp + ih * W;
        if (first) memcpy(vm + g->pl, row, (size_t)W * sizeof(float));
        else if (j->is_max) row_max(vm + g->pl, row, W);
        else row_add(vm + g->pl, row, W);
        first = 0;
    }
    if (first)
        for (int64_t i = 0; i < W; i++) vm[g->pl + i] = pad;
    /* phases: ph[r * pl_len + t] = vm[s t + r] */
    int64_t L = j->pl_len;
    if (s == 2) deinterleave2(ph, ph + L, vm, L);
    else if (s > 2)
        for (int64_t r = 0; r < s; r++)
            for (int64_t t = 0; t < L; t++) ph[r * L + t] = vm[s * t + r];
    /* horizontal: tap b reads vm[s ow + b dw] = phase (b dw) % s at ow + (b dw) / s */
    for (int b = 0; b < g->kw; b++) {
        int64_t o = (int64_t)b * g->dw;
        const float *src = s > 1 ? ph + (o % s) * L + o / s : vm + o;
        if (b == 0) memcpy(yr, src, (size_t)OW * sizeof(float));
        else if (j->is_max) row_max(yr, src, OW);
        else row_add(yr, src, OW);
    }
    if (!j->is_max)
        for (int64_t ow = 0; ow < OW; ow++) {
            float cnt = (float)ch * cw[ow];
            yr[ow] = cnt > 0 ? yr[ow] / cnt : 0.0f;
        }
}

static void pool_range(void *a, int64_t lo, int64_t hi) {
    pool_job *j = a;
    const tb_nn_conv_geom *g = &j->g;
    /* which thread: the range's start picks a scratch slot */
    int64_t per = j->per_thread;
    float *vm = j->scratch + (lo / per) * (j->lv + j->pl_len * g->sw + g->ow + 16);
    float *ph = vm + j->lv, *cw = ph + j->pl_len * g->sw;
    float pad = j->is_max ? -INFINITY : 0.0f;
    for (int64_t i = 0; i < j->lv; i++) vm[i] = pad;
    for (int64_t ow = 0; ow < g->ow; ow++) {
        int cnt = 0;
        for (int b = 0; b < g->kw; b++) {
            int64_t iw = ow * g->sw - g->pl + (int64_t)b * g->dw;
            cnt += j->incl ? iw >= -g->pl && iw < g->w + g->pr : iw >= 0 && iw < g->w;
        }
        cw[ow] = (float)cnt;
    }
    for (int64_t p = lo; p < hi; p++) {
        const float *xp = j->x + p * g->h * g->w;
        float *yp = j->y + p * g->oh * g->ow;
        for (int64_t oh = 0; oh < g->oh; oh++) pool_plane_row(j, xp, yp + oh * g->ow, oh, vm, ph, cw);
    }
}

static tb_status fast_pool(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                           int n_out) {
    if (in[0].dtype != TB_F32) return tb_op_get_def(n->op)->ref(n, in, n_in, out, n_out);
    pool_job j;
    memset(&j, 0, sizeof j);
    TB_TRY(tb_nn_pool_geom(n, &in[0], &j.g));
    const tb_nn_conv_geom *g = &j.g;
    if (out[0].dims[out[0].rank - 1] != g->ow || (in[0].rank == 4 && out[0].dims[2] != g->oh))
        return tb_errorf(TB_ERR_FORMAT, "%s: output dims do not match the geometry", tb_op_name(n->op));
    j.x = in[0].data;
    j.y = out[0].data;
    j.is_max = n->op == TB_OP_MAXPOOL;
    j.incl = n->i[11];
    int64_t s = g->sw, reach = (int64_t)(g->kw - 1) * g->dw;
    j.pl_len = g->ow + reach / s + 1;
    int64_t need = s * j.pl_len + reach + 1, lv = g->pl + g->w;
    j.lv = (need > lv ? need : lv) + 8;
    int64_t planes = g->n * g->c;
    if (planes == 0 || g->oh == 0 || g->ow == 0) return TB_OK;
    int nth = nthreads(c);
    if (planes * g->h * g->w < (1 << 14)) nth = 1;
    j.per_thread = (planes + nth - 1) / nth;
    int64_t slot = j.lv + j.pl_len * s + g->ow + 16;
    j.scratch = tb_cpu_nn_scratch(c, (size_t)(slot * nth) * sizeof(float));
    if (!j.scratch) return tb_errorf(TB_ERR_OOM, "%s: scratch", tb_op_name(n->op));
    if (nth == 1) pool_range(&j, 0, planes);
    else {
        par_job pj = {pool_range, &j, planes};
        tb_pool_run(c->pool, par_run, &pj);
    }
    return TB_OK;
}

typedef struct {
    const float *x;
    float *y;
    int64_t sp;
} gap_job;

static void gap_range(void *a, int64_t lo, int64_t hi) {
    gap_job *j = a;
    for (int64_t p = lo; p < hi; p++) j->y[p] = j->sp ? row_sum(j->x + p * j->sp, j->sp) / (float)j->sp : 0.0f;
}

static tb_status fast_global_avgpool(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in,
                                     const tb_view *out, int n_out) {
    if (in[0].dtype != TB_F32) return tb_op_get_def(n->op)->ref(n, in, n_in, out, n_out);
    gap_job j = {in[0].data, out[0].data, 1};
    for (int d = 2; d < in[0].rank; d++) j.sp *= in[0].dims[d];
    int64_t planes = in[0].dims[0] * in[0].dims[1];
    par_for(c, planes, planes * j.sp * 4, gap_range, &j);
    return TB_OK;
}

/* ================================================================ the table */

tb_cpu_nn_fn tb_cpu_nn_shape_kernel(tb_op_kind k) {
    switch (k) {
    case TB_OP_RESHAPE:
    case TB_OP_UNSQUEEZE:
    case TB_OP_SQUEEZE:
    case TB_OP_FLATTEN: return fast_copy;
    case TB_OP_TRANSPOSE: return fast_transpose;
    case TB_OP_SLICE: return fast_slice;
    case TB_OP_EXPAND: return fast_expand;
    case TB_OP_CONCAT: return fast_concat;
    case TB_OP_SPLIT: return fast_split;
    case TB_OP_GATHER: return fast_gather;
    case TB_OP_MAXPOOL:
    case TB_OP_AVGPOOL: return fast_pool;
    case TB_OP_GLOBAL_AVGPOOL: return fast_global_avgpool;
    default: return NULL;
    }
}
