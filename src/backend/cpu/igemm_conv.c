/*
 * igemm_conv.c — the direct int8 convolution of igemm.h (tb_cpu_iconv_*):
 * stride 1 or 2, dilation 1, one group, on AVX-512 VNNI;
 * QConv (nn_quant.c) runs it instead of im2row + tb_cpu_igemm there.
 *
 * The activation codes of one image are laid out (ceil(C / 4), Hp, Wp, 4):
 * the input padded by its pads (the border, and the channels past C of the
 * last group, hold the zero point's code, which adds nothing) and 4
 * channels interleaved per pixel, so that 16
 * consecutive pixels of one 4-channel group are one 64-byte vpdpbusd
 * operand. Each (Hp, Wp) plane is read flat: output position q = oy Wp + ox
 * (ox in [0, Wp), the last kw - 1 columns of each row wasted) takes tap
 * (ky, kx) from plane position q + ky Wp + kx, so a vector of 16 outputs
 * reads 16 consecutive codes per tap and no im2row copy is made; the
 * planes carry a slack of zero-point codes so the last vector's reads stay
 * inside. Stride 2 splits each padded plane into its 4 phases (even / odd
 * rows x even / odd columns, each (hq, wq) plus the slack): tap (ky, kx)
 * reads phase (ky % 2, kx % 2) at q + (ky / 2) wq + kx / 2, the same flat
 * walk as stride 1 with wq in place of wp.
 * The weight is packed per block of 8 output channels as [ceil(C / 4)][kh]
 * [kw][8][4] codes (channels past M or C zero) with the row sums after the blocks.
 * Register tile: 8 output channels x 3 vectors of 16 positions (24
 * accumulators; per tap 3 loads of A, 8 broadcasts of W). The tile is
 * finished in registers with the im2row path's operations in its order
 * ((float)sum * (a_scale * w_scale), + bias, residual, ReLU), the valid
 * lanes compressed and stored straight into the NCHW output: the same bits
 * as tb_cpu_igemm + its transposed epilogue, and as the reference within
 * float rounding (the integer sums are exact).
 */
#include "backend/cpu/igemm_impl.h"

#include <immintrin.h>
#include <string.h>

enum { CMR = 8, CNV = 3 }; /* the tile: 8 channels x 3 vectors of 16 positions */

int tb_cpu_iconv_supported(int64_t C, int kh, int kw, int sh, int sw, int dh, int dw, int group, int act) {
    return !strcmp(tb_cpu_igemm_kernel(), "avx512vnni") && C > 0 && group <= 1 && sh == sw &&
           (sh == 1 || sh == 2) && dh == 1 && dw == 1 && kh >= 1 && kw >= 1 && kh * kw <= TB_ICONV_MAX_TAPS &&
           (act == TB_NN_ACT_NONE || act == TB_NN_ACT_RELU);
}

void tb_cpu_iconv_geometry(int64_t C, int64_t H, int64_t W, int kh, int kw, int s, int pt, int pl, int pb, int pr,
                           tb_iconv_geom *g) {
    memset(g, 0, sizeof *g);
    g->c = C, g->cg = (C + 3) / 4, g->h = H, g->w = W, g->kh = kh, g->kw = kw, g->s = s, g->pt = pt, g->pl = pl;
    g->hp = H + pt + pb;
    g->wp = W + pl + pr;
    g->hq = (g->hp + s - 1) / s;
    g->wq = (g->wp + s - 1) / s;
    g->oh = (g->hp - kh) / s + 1;
    g->ow = (g->wp - kw) / s + 1;
    /* the last vector reads up to 15 positions past oh * wq, plus the taps */
    g->sub = (g->hq * g->wq + kw + 16 + 15) / 16 * 16;
    g->plane = g->sub * s * s;
    g->nvec = (g->oh * g->wq + 15) / 16;
}

size_t tb_cpu_iconv_codes_bytes(const tb_iconv_geom *g) { return (size_t)(g->cg * g->plane * 4); }

size_t tb_cpu_iconv_packed_bytes(int64_t M, int64_t C, int kh, int kw) {
    int64_t nb = (M + CMR - 1) / CMR, kg = (C + 3) / 4 * kh * kw;
    return (size_t)(nb * kg * CMR * 4) + (size_t)(nb * CMR) * sizeof(int32_t);
}

void tb_cpu_iconv_pack(const int8_t *W, int64_t M, int64_t C, int kh, int kw, void *dst) {
    int64_t nb = (M + CMR - 1) / CMR, kg = (C + 3) / 4 * kh * kw, taps = (int64_t)kh * kw;
    int8_t *blk = dst;
    int32_t *sums = (int32_t *)(blk + nb * kg * CMR * 4);
    memset(dst, 0, tb_cpu_iconv_packed_bytes(M, C, kh, kw));
    for (int64_t m = 0; m < M; m++) {
        int8_t *d = blk + (m / CMR) * kg * CMR * 4 + (m % CMR) * 4;
        int32_t s = 0;
        for (int64_t c = 0; c < C; c++)
            for (int64_t t = 0; t < taps; t++) {
                int8_t v = W[(m * C + c) * taps + t];
                d[((c / 4) * taps + t) * CMR * 4 + c % 4] = v;
                s += v;
            }
        sums[m] = s;
    }
}

/* ---------------------------------------------------------------- codes */

#define V_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma"
#define V_FN __attribute__((target(V_TARGET)))
#define V_INLINE static inline __attribute__((target(V_TARGET), always_inline))

/* 16 codes of x[0..n) (tb_cpu_quantize_u8's formula) as int32 lanes */
V_INLINE __m512i codes16(const float *x, __mmask16 k, __m512 vi, __m512 vz) {
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x), vi);
    v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(255.f));
    return _mm512_cvtps_epi32(v);
}

static inline __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Stride 2: the padded (hp, wp) words p into the 4 phases of dst (each
 * (hq, wq) + slack), 16 words of each phase row from 32 of a padded row
 * (past wp or hp: the zero point's code). */
V_INLINE void phases2(const tb_iconv_geom *g, const uint32_t *p, uint32_t *dst, uint32_t zp) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1)), vz = _mm512_set1_epi32((int)zp);
    const int64_t Wp = g->wp, wq = g->wq;
    for (int64_t py = 0; py < 2; py++) {
        uint32_t *ph0 = dst + py * 2 * g->sub, *ph1 = ph0 + g->sub;
        for (int64_t yy = 0; yy < g->hq; yy++) {
            int64_t y = 2 * yy + py;
            const uint32_t *r = p + y * Wp;
            for (int64_t xx = 0; xx < wq; xx += 16) {
                int64_t left = y < g->hp ? Wp - 2 * xx : 0; /* words of the row from column 2 xx */
                __m512i lo = _mm512_mask_loadu_epi32(vz, first_lanes(left), r + 2 * xx);
                __m512i hi = _mm512_mask_loadu_epi32(vz, first_lanes(left - 16), r + 2 * xx + 16);
                __mmask16 k = first_lanes(wq - xx);
                _mm512_mask_storeu_epi32(ph0 + yy * wq + xx, k, _mm512_permutex2var_epi32(lo, ie, hi));
                _mm512_mask_storeu_epi32(ph1 + yy * wq + xx, k, _mm512_permutex2var_epi32(lo, io, hi));
            }
        }
    }
    for (int64_t ph = 0; ph < 4; ph++)
        for (int64_t i = g->hq * wq; i < g->sub; i++) dst[ph * g->sub + i] = zp;
}

V_FN void tb_cpu_iconv_quantize(const tb_iconv_geom *g, const float *x, float inv_scale, int zero, uint8_t *q,
                                uint32_t *tmp, int64_t cg0, int64_t cg1) {
    const __m512 vi = _mm512_set1_ps(inv_scale), vz = _mm512_set1_ps((float)zero);
    const uint32_t zp = (uint32_t)zero * 0x01010101u;
    const int64_t H = g->h, W = g->w, Wp = g->wp, HW = H * W, s = g->s;
    for (int64_t cg = cg0; cg < cg1; cg++) {
        uint32_t *dst = (uint32_t *)q + cg * g->plane;
        /* the padded (hp, wp) words: in place for stride 1, else in tmp
         * and split into the s * s phases after */
        uint32_t *p = s == 1 ? dst : tmp;
        const float *x0 = x + cg * 4 * HW;
        int64_t i = 0, top = g->pt * Wp;
        for (; i < top; i++) p[i] = zp;
        for (int64_t y = 0; y < H; y++) {
            uint32_t *row = p + (y + g->pt) * Wp;
            for (int64_t c = 0; c < g->pl; c++) row[c] = zp;
            for (int64_t c = g->pl + W; c < Wp; c++) row[c] = zp;
            const float *xr = x0 + y * W;
            for (int64_t c = 0; c < W; c += 16) {
                __mmask16 k = W - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (W - c)) - 1);
                __m512i v = codes16(xr + c, k, vi, vz);
                for (int i = 1; i < 4; i++) /* channels past C (the last group): the zero point's code */
                    v = _mm512_or_si512(v, _mm512_slli_epi32(cg * 4 + i < g->c ? codes16(xr + i * HW + c, k, vi, vz)
                                                                              : _mm512_set1_epi32(zero),
                                                             (unsigned)(8 * i)));
                _mm512_mask_storeu_epi32(row + g->pl + c, k, v);
            }
        }
        int64_t end = (g->pt + H) * Wp;
        if (s == 1) {
            for (i = end; i < g->plane; i++) p[i] = zp;
            continue;
        }
        for (i = end; i < g->hp * Wp; i++) p[i] = zp;
        phases2(g, p, dst, zp); /* s == 2: tb_cpu_iconv_supported allows 1 and 2 */
    }
}

/* ---------------------------------------------------------------- the kernel */

#ifdef IGEMM_SANITIZED
#define DPBUSD(acc, a, w) ((acc) = _mm512_dpbusd_epi32((acc), (a), (w)))
#else
/* as asm: see igemm_avx512.c (GCC spilled the intrinsic's accumulators) */
#define DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))
#endif

V_INLINE int32_t ld32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define ACC_DECL(r) __m512i c##r##0 = _mm512_set1_epi32(-j->zero * ws8[r]), c##r##1 = c##r##0, c##r##2 = c##r##0
#define ACC_ROW(r)                                                \
    {                                                             \
        __m512i b = _mm512_set1_epi32(ld32(wp + 4 * (r)));        \
        DPBUSD(c##r##0, a0, b);                                   \
        if (nv > 1) DPBUSD(c##r##1, a1, b);                       \
        if (nv > 2) DPBUSD(c##r##2, a2, b);                       \
    }
/* channel m0 + r, vector v: scale, bias, residual, activation, the valid
 * lanes compressed into the output row */
#define ACC_STORE(r, v)                                                                                    \
    if (nv > v && mr > r && vm[v].kc) {                                                                    \
        int64_t m_ = m0 + r;                                                                               \
        __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(c##r##v), _mm512_set1_ps(j->a_scale * j->w_scale[m_])); \
        if (j->bias) y = _mm512_add_ps(y, _mm512_set1_ps(j->bias[m_]));                                    \
        __m512 rv = _mm512_setzero_ps();                                                                   \
        if (j->res)                                                                                        \
            rv = _mm512_maskz_expand_ps(vm[v].kv, _mm512_maskz_loadu_ps(vm[v].kc, res + m_ * P + vm[v].p0)); \
        if (j->res && j->after) y = _mm512_add_ps(y, rv);                                                  \
        if (j->act == TB_NN_ACT_RELU) y = _mm512_max_ps(y, _mm512_setzero_ps());                           \
        if (j->res && !j->after) y = _mm512_add_ps(y, rv);                                                 \
        _mm512_mask_storeu_ps(out + m_ * P + vm[v].p0, vm[v].kc, _mm512_maskz_compress_ps(vm[v].kv, y));   \
    }

/* Where the valid lanes of a vector of 16 flat output positions go */
typedef struct {
    int64_t p0;        /* the output index of its first valid lane */
    __mmask16 kv, kc;  /* the valid lanes (ox < ow, oy < oh); the first popcount(kv) lanes */
} vmask;

static void vmasks(const tb_iconv_geom *g, int64_t vec, int64_t n, vmask *vm) {
    const int64_t Wp = g->wq, qend = g->oh * Wp;
    for (int64_t v = 0; v < n; v++) {
        int64_t q = (vec + v) * 16, oy = q / Wp, ox = q % Wp;
        vm[v].p0 = oy * g->ow + (ox < g->ow ? ox : g->ow);
        unsigned k = 0;
        for (int i = 0; i < 16; i++, ox++) {
            if (ox == Wp) ox = 0, oy++;
            if (q + i < qend && ox < g->ow) k |= 1u << i;
        }
        vm[v].kv = (__mmask16)k;
        vm[v].kc = (__mmask16)((1u << __builtin_popcount(k)) - 1);
    }
}

/* Image img's output channels [m0, m0 + mr) (block mb) x vectors [vec, vec
 * + nv) (their masks vm[0, nv)) */
V_INLINE void tile(const tb_iconv_job *j, int64_t img, int64_t mb, int64_t vec, const vmask *vm, const int nv) {
    const tb_iconv_geom *g = j->g;
    const int32_t *ws8 = j->wsum + mb * CMR;
    ACC_DECL(0); ACC_DECL(1); ACC_DECL(2); ACC_DECL(3); ACC_DECL(4); ACC_DECL(5); ACC_DECL(6); ACC_DECL(7);
    const int taps = g->kh * g->kw;
    const int64_t cgs = g->cg, pstride = g->plane * 4;
    const int8_t *wp = j->w + mb * cgs * taps * CMR * 4;
    const uint8_t *ap = j->q + img * j->q_stride + vec * 64;
    const __m512i z = _mm512_setzero_si512();
    for (int64_t cg = 0; cg < cgs; cg++, ap += pstride)
        for (int t = 0; t < taps; t++, wp += CMR * 4) {
            const uint8_t *a = ap + j->toff[t];
            __m512i a0 = _mm512_loadu_si512((const void *)a), a1 = z, a2 = z;
            if (nv > 1) a1 = _mm512_loadu_si512((const void *)(a + 64));
            if (nv > 2) a2 = _mm512_loadu_si512((const void *)(a + 128));
            ACC_ROW(0) ACC_ROW(1) ACC_ROW(2) ACC_ROW(3) ACC_ROW(4) ACC_ROW(5) ACC_ROW(6) ACC_ROW(7)
        }
    const int64_t P = g->oh * g->ow, m0 = mb * CMR;
    const int64_t mr = j->m - m0 < CMR ? j->m - m0 : CMR;
    const float *res = j->res ? j->res + img * j->y_stride : NULL;
    float *out = j->y + img * j->y_stride;
#define ACC_STORE_ROW(r) ACC_STORE(r, 0) ACC_STORE(r, 1) ACC_STORE(r, 2)
    ACC_STORE_ROW(0) ACC_STORE_ROW(1) ACC_STORE_ROW(2) ACC_STORE_ROW(3)
    ACC_STORE_ROW(4) ACC_STORE_ROW(5) ACC_STORE_ROW(6) ACC_STORE_ROW(7)
#undef ACC_STORE_ROW
}

#define TILE_FN(nv)                                                                                           \
    static V_FN void tile##nv(const tb_iconv_job *j, int64_t i, int64_t mb, int64_t vec, const vmask *vm) { \
        tile(j, i, mb, vec, vm, nv);                                                                          \
    }
TILE_FN(1)
TILE_FN(2)
TILE_FN(3)
#undef TILE_FN

void tb_cpu_iconv_job_init(tb_iconv_job *j) {
    const tb_iconv_geom *g = j->g;
    int t = 0;
    for (int ky = 0; ky < g->kh; ky++)
        for (int kx = 0; kx < g->kw; kx++) {
            int64_t phase = (ky % g->s) * g->s + kx % g->s;
            j->toff[t++] = (int32_t)((phase * g->sub + (ky / g->s) * g->wq + kx / g->s) * 4);
        }
    int64_t nb = (j->m + CMR - 1) / CMR;
    j->wsum = (const int32_t *)(j->w + nb * g->cg * g->kh * g->kw * CMR * 4);
    j->nblocks = nb;
}

enum { VCHUNK = 255 }; /* vectors whose masks are made at once (a multiple of the tile's 3) */

V_FN void tb_cpu_iconv_run(const tb_iconv_job *j, int64_t mb0, int64_t mb1, int64_t v0, int64_t v1) {
    /* channel blocks outside: a block's weights stay in L1 while the
     * images' vectors go by (each image's codes, at most a few hundred KiB,
     * from L2); the weights are read once per chunk of vectors for all the
     * images. The lane masks are made once per chunk, not per tile (on the
     * stem's short K they cost a sixth of the products). */
    int64_t n_img = j->n_img > 0 ? j->n_img : 1;
    vmask vm[VCHUNK];
    for (int64_t vc = v0; vc < v1; vc += VCHUNK) {
        int64_t ve = v1 - vc < VCHUNK ? v1 : vc + VCHUNK;
        vmasks(j->g, vc, ve - vc, vm);
        for (int64_t mb = mb0; mb < mb1; mb++)
            for (int64_t i = 0; i < n_img; i++)
                for (int64_t v = vc; v < ve; v += CNV) {
                    int64_t nv = ve - v < CNV ? ve - v : CNV;
                    if (nv == 3) tile3(j, i, mb, v, vm + (v - vc));
                    else if (nv == 2) tile2(j, i, mb, v, vm + (v - vc));
                    else tile1(j, i, mb, v, vm + (v - vc));
                }
    }
}

/* ---------------------------------------------------------------- reference */

void tb_ref_iconv(const tb_iconv_job *j) {
    const tb_iconv_geom *g = j->g;
    const int taps = g->kh * g->kw;
    const int64_t P = g->oh * g->ow, cgs = g->cg, n_img = j->n_img > 0 ? j->n_img : 1;
    for (int64_t im = 0; im < n_img * j->m; im++) { /* (image, output channel) */
        const int64_t img = im / j->m, m = im % j->m;
        const int8_t *wb = j->w + (m / CMR) * cgs * taps * CMR * 4 + (m % CMR) * 4;
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int32_t acc = -j->zero * j->wsum[m];
                for (int64_t cg = 0; cg < cgs; cg++)
                    for (int t = 0; t < taps; t++) {
                        const uint8_t *a =
                            j->q + img * j->q_stride + cg * g->plane * 4 + (oy * g->wq + ox) * 4 + j->toff[t];
                        const int8_t *w = wb + (cg * taps + t) * CMR * 4;
                        for (int i = 0; i < 4; i++) acc += (int32_t)a[i] * w[i];
                    }
                int64_t o = img * j->y_stride + m * P + oy * g->ow + ox;
                float v = (float)acc * (j->a_scale * j->w_scale[m]);
                if (j->bias) v += j->bias[m];
                if (j->res && j->after) v += j->res[o];
                if (j->act == TB_NN_ACT_RELU) v = v > 0 ? v : 0;
                if (j->res && !j->after) v += j->res[o];
                j->y[o] = v;
            }
    }
}
