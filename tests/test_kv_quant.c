/*
 * test_kv_quant.c — the int8 and fp8 (e4m3) KV cache on the CPU.
 *
 *   1. tb_ref_kv_quantize against its definition in double precision:
 *      scale = absmax / 127 (int8) or / 448 (e4m3), the largest element
 *      takes the largest code, every element within half a step of its code
 *      (int8: scale / 2; e4m3: 2^-4 of its magnitude, or 2^-10 * scale in
 *      the subnormal range), a row of zeros gives scale 0 and codes 0;
 *   2. tb_cpu_kv_quantize (what the fast paths store) against the reference
 *      byte for byte, over rows of wide range and every f32 on a fine grid of
 *      e4m3's range; the fp8 table of the scalar path against e4m3's
 *      definition;
 *   3. tb_cpu_attention (every SIMD path this CPU runs, 1 and 2 threads)
 *      against tb_ref_attention for both dtypes over odd shapes: GQA groups
 *      1..12, hd 5/8/32/36/64/128, block sizes 1/5/8/16/32, decode, prefill
 *      and mixed batches with positions across blocks. The step's cache
 *      writes must be the same bytes; outputs agree within 2e-5 of their
 *      largest magnitude (the same dequantised values, summed in another
 *      order: the fast paths apply a row's scale once per dot product);
 *   4. the quantised attention against the f32 one on the same inputs:
 *      int8 within 2e-2 and fp8 within 0.12 of the largest output (the
 *      rounding of the cache itself: half a step is 1/254 of a row's absmax
 *      for int8, 2^-4 of each value for e4m3's 3 mantissa bits; measured at
 *      most 9.2e-3 and 7.8e-2, on early positions where an output is nearly
 *      one V row), so a scale applied twice or not at all on every path is
 *      caught too.
 */
#include "backend/cpu/kernels.h"
#include "core/kv_layout.h"
#include "tb_test.h"

#include <math.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { return tb_test_frand(&rng); } /* uniform in [-1, 1) */

static const char *cur_path = "?";
static int cur_threads;
static double worst[2];

/* ---------------------------------------------------------------- 1, 2 */
static double fp8_value(uint8_t b) {
    int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return sign ? -v : v;
}

static void test_quantize_row(const float *x, int hd, tb_dtype dt) {
    uint8_t codes[256];
    float scale = -1;
    tb_ref_kv_quantize(x, hd, dt, codes, &scale);
    double amax = 0;
    int imax = 0;
    for (int d = 0; d < hd; d++)
        if (fabs(x[d]) > amax) { amax = fabs(x[d]); imax = d; }
    double qmax = dt == TB_I8 ? 127 : 448;
    CHECK_MSG(scale == (float)(amax / qmax), "%s hd %d: scale %g, absmax/%g = %g", tb_dtype_name(dt), hd, scale,
              qmax, amax / qmax);
    if (amax == 0) {
        int zero = 1;
        for (int d = 0; d < hd; d++) zero &= codes[d] == 0;
        CHECK_MSG(zero && scale == 0, "%s: a row of zeros gives nonzero codes", tb_dtype_name(dt));
        return;
    }
    double top = dt == TB_I8 ? (double)(int8_t)codes[imax] : fp8_value(codes[imax]);
    CHECK_MSG(fabs(top) == qmax && (top > 0) == (x[imax] > 0), "%s hd %d: the largest element's code is %g",
              tb_dtype_name(dt), hd, top);
    for (int d = 0; d < hd; d++) {
        double v = x[d] / (double)scale; /* in code units */
        if (dt == TB_I8) {
            double c = (int8_t)codes[d];
            CHECK_MSG(fabs(c - v) <= 0.5 + 1e-4 && fabs(c) <= 127, "int8: element %d: %g coded %g", d, v, c);
        } else {
            double c = fp8_value(codes[d]);
            double bound = fabs(v) >= ldexp(1, -6) ? fabs(v) * ldexp(1, -4) : ldexp(1, -10);
            CHECK_MSG(fabs(c - v) <= bound * (1 + 1e-4) && fabs(c) <= 448 && codes[d] != 0x7f && codes[d] != 0xff,
                      "fp8: element %d: %.9g coded %.9g (byte 0x%02x)", d, v, c, codes[d]);
        }
    }
}

static void test_quantize(void) {
    static const int hds[] = {5, 8, 32, 64, 128};
    static const tb_dtype dts[] = {TB_I8, TB_FP8_E4M3};
    float x[128];
    for (int di = 0; di < 2; di++)
        for (int hi = 0; hi < 5; hi++)
            for (int rep = 0; rep < 50; rep++) {
                int hd = hds[hi];
                /* magnitudes from 1e-6 to 1e4, and a spread of 2^16 inside
                 * a row (small elements reach e4m3's subnormals) */
                float mag = powf(10.0f, -6.0f + 10.0f * (frand() + 1.0f) * 0.5f);
                for (int d = 0; d < hd; d++) x[d] = frand() * mag * ldexpf(1.0f, -(int)((frand() + 1) * 8));
                if (rep == 0) memset(x, 0, sizeof x);
                if (rep == 1) { memset(x, 0, sizeof x); x[hd / 2] = -3.5f; }
                test_quantize_row(x, hd, dts[di]);
            }
    /* the fast quantiser stores the reference's bytes: rows spanning 2^-40
     * to 2^10 within themselves (e4m3 subnormals, underflow to 0, ties),
     * signed zeros and NaN-free values */
    for (int di = 0; di < 2; di++)
        for (int rep = 0; rep < 2000; rep++) {
            int hd = hds[rep % 5];
            for (int d = 0; d < hd; d++) x[d] = frand() * ldexpf(1.0f, (int)((frand() + 1.0f) * 25.0f) - 40);
            if (rep % 7 == 0) x[0] = -0.0f;
            if (rep % 11 == 0) x[hd - 1] = x[0] * 448.0f / 3.0f; /* a tie-prone ratio */
            uint8_t cr[128], cf[128];
            float sr, sf;
            tb_ref_kv_quantize(x, hd, dts[di], cr, &sr);
            tb_cpu_kv_quantize(x, hd, dts[di], cf, &sf);
            CHECK_MSG(sr == sf && !memcmp(cr, cf, (size_t)hd), "%s: tb_cpu_kv_quantize differs from the reference "
                      "(row %d)", tb_dtype_name(dts[di]), rep);
        }
    /* every f32 in e4m3's range on a grid of 2^-12 of each binade, through a
     * row whose absmax makes the scale 1 */
    {
        float row[2];
        int bad = 0;
        for (int e = -12; e <= 8 && !bad; e++)
            for (int m = 0; m < 4096 && !bad; m++) {
                row[0] = 448.0f;
                row[1] = ldexpf(1.0f + (float)m / 4096.0f, e) * (m & 1 ? -1.0f : 1.0f);
                uint8_t cr[2], cf[2];
                float sr, sf;
                tb_ref_kv_quantize(row, 2, TB_FP8_E4M3, cr, &sr);
                tb_cpu_kv_quantize(row, 2, TB_FP8_E4M3, cf, &sf);
                bad = memcmp(cr, cf, 2) != 0;
                CHECK_MSG(!bad, "fp8 code of %.9g: reference 0x%02x, fast 0x%02x", row[1], cr[1], cf[1]);
            }
    }
    const float *lut = tb_cpu_fp8_table();
    int same = 1;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) { same &= isnan(lut[b]); continue; }
        same &= lut[b] == (float)fp8_value((uint8_t)b);
    }
    CHECK_MSG(same, "the fp8 table differs from e4m3's definition");
}

/* ---------------------------------------------------------------- 3, 4 */
/* Fills a pool of n_blocks blocks with rows of random history. */
static void fill_cache(uint8_t *cache, tb_dtype dt, int n_blocks, int bs, int n_kv, int hd, const float *src) {
    size_t blkb = tb_kv_block_bytes(dt, bs, n_kv, hd), cb = tb_kv_codes_bytes(dt, bs, n_kv, hd);
    size_t esz = tb_kv_elem_bytes(dt);
    memset(cache, 0, blkb * (size_t)n_blocks);
    for (int b = 0; b < n_blocks; b++)
        for (int r = 0; r < bs; r++)
            for (int h = 0; h < n_kv; h++) {
                const float *x = src + (((size_t)b * bs + r) * n_kv + h) * hd;
                uint8_t *row = cache + (size_t)b * blkb + ((size_t)r * n_kv + h) * hd * esz;
                if (tb_kv_quantized(dt))
                    tb_ref_kv_quantize(x, hd, dt, row, (float *)(cache + (size_t)b * blkb + cb) + (size_t)r * n_kv + h);
                else
                    tb_convert(x, TB_F32, row, dt, (size_t)hd);
            }
}

static void test_case(tb_pool *p, const tb_test_attn_batch *c, int n_heads, int n_kv, int hd, int bs, tb_dtype dt) {
    int max_ctx = 160, max_blocks = (max_ctx + bs - 1) / bs, n_blocks = c->n_seqs * max_blocks + 3;
    int T = c->T, stride = (n_heads + 2 * n_kv) * hd;
    size_t elems = (size_t)n_blocks * bs * n_kv * hd;
    size_t qbytes = tb_kv_block_bytes(dt, bs, n_kv, hd) * (size_t)n_blocks;
    size_t fbytes = tb_kv_block_bytes(TB_F32, bs, n_kv, hd) * (size_t)n_blocks;

    int32_t *tables = tb_test_xmalloc(sizeof(int32_t) * (size_t)c->n_seqs * max_blocks);
    tb_test_block_tables(&rng, n_blocks, c->n_seqs, max_blocks, tables); /* scattered over the pool */

    float *hk = tb_test_xmalloc(elems * 4), *hv = tb_test_xmalloc(elems * 4);
    for (size_t i = 0; i < elems; i++) { hk[i] = frand(); hv[i] = frand(); }
    uint8_t *kq = tb_test_xmalloc(qbytes), *vq = tb_test_xmalloc(qbytes);
    uint8_t *kr = tb_test_xmalloc(qbytes), *vr = tb_test_xmalloc(qbytes);
    uint8_t *kf = tb_test_xmalloc(fbytes), *vf = tb_test_xmalloc(fbytes);
    fill_cache(kq, dt, n_blocks, bs, n_kv, hd, hk);
    fill_cache(vq, dt, n_blocks, bs, n_kv, hd, hv);
    /* the f32 cache holds the history's original values: check 4 measures
     * the rounding of the whole quantised cache, as a model sees it */
    fill_cache(kf, TB_F32, n_blocks, bs, n_kv, hd, hk);
    fill_cache(vf, TB_F32, n_blocks, bs, n_kv, hd, hv);
    memcpy(kr, kq, qbytes);
    memcpy(vr, vq, qbytes);

    float *qkv = tb_test_xmalloc((size_t)T * stride * 4);
    for (size_t i = 0; i < (size_t)T * stride; i++) qkv[i] = 2.0f * frand();
    size_t on = (size_t)T * n_heads * hd;
    float *out = tb_test_xmalloc(on * 4), *outr = tb_test_xmalloc(on * 4), *outf = tb_test_xmalloc(on * 4);
    float *scratch = tb_test_xmalloc(tb_attention_scratch_floats(tb_pool_size(p), max_ctx) * 4);

    tb_attn_args a = {T, n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), c->pos, c->seq, tables, max_blocks, bs,
                      kr, vr, dt};
    tb_ref_attention(&a, qkv, outr, scratch);
    a.k_cache = kq;
    a.v_cache = vq;
    tb_cpu_attention(p, &a, qkv, out, scratch, max_ctx);
    a.k_cache = kf;
    a.v_cache = vf;
    a.kv_dtype = TB_F32;
    tb_ref_attention(&a, qkv, outf, scratch);

    CHECK_MSG(memcmp(kq, kr, qbytes) == 0 && memcmp(vq, vr, qbytes) == 0,
              "[%s, %d threads] %s cache write differs (T=%d heads=%d kv=%d hd=%d bs=%d)", cur_path, cur_threads,
              tb_dtype_name(dt), T, n_heads, n_kv, hd, bs);
    double e = tb_test_rel_err(out, outr, on, 0.1), q = tb_test_rel_err(outr, outf, on, 0.1);
    int di = dt == TB_I8 ? 0 : 1;
    if (e > worst[di]) worst[di] = e;
    if (getenv("TB_TEST_VERBOSE"))
        printf("  %s T=%d heads=%d kv=%d hd=%d bs=%d: vs ref %.2e, vs f32 %.2e\n", tb_dtype_name(dt), T, n_heads, n_kv,
               hd, bs, e, q);
    CHECK_MSG(e <= 2e-5, "[%s, %d threads] %s T=%d heads=%d kv=%d hd=%d bs=%d: err %.3g vs the reference", cur_path,
              cur_threads, tb_dtype_name(dt), T, n_heads, n_kv, hd, bs, e);
    CHECK_MSG(q <= (dt == TB_I8 ? 2e-2 : 0.12), "%s T=%d heads=%d kv=%d hd=%d: err %.3g vs the f32 cache",
              tb_dtype_name(dt), T, n_heads, n_kv, hd, q);
    free(tables); free(hk); free(hv); free(kq); free(vq); free(kr); free(vr); free(kf); free(vf);
    free(qkv); free(out); free(outr); free(outf); free(scratch);
}

static void test_attention(tb_pool *p) {
    /* one decode token, a mixed batch (its last decode at 150), a 64-token
     * prefill, and a decode batch: one token of each of 4 sequences */
    tb_test_attn_batch one, mixed, pre, dec = {4, 4, {0, 1, 2, 3}, {3, 64, 100, 159}};
    tb_test_attn_batches(150, &one, &mixed, &pre);

    static const tb_dtype dts[] = {TB_I8, TB_FP8_E4M3};
    for (int d = 0; d < 2; d++) {
        tb_dtype dt = dts[d];
        test_case(p, &one, 12, 12, 64, 16, dt);
        test_case(p, &one, 12, 4, 64, 16, dt);
        test_case(p, &dec, 8, 8, 128, 16, dt);
        test_case(p, &dec, 32, 8, 128, 32, dt);
        test_case(p, &mixed, 6, 2, 64, 16, dt);
        test_case(p, &mixed, 4, 1, 36, 5, dt);
        test_case(p, &pre, 8, 2, 32, 8, dt);
        test_case(p, &pre, 4, 4, 128, 16, dt);
        test_case(p, &one, 8, 4, 8, 16, dt);
        test_case(p, &mixed, 8, 4, 8, 1, dt);
        test_case(p, &pre, 8, 4, 8, 16, dt);
        test_case(p, &mixed, 3, 1, 16, 8, dt);
        test_case(p, &pre, 4, 1, 24, 32, dt);
        test_case(p, &mixed, 4, 2, 5, 16, dt);
        test_case(p, &mixed, 9, 3, 32, 16, dt);
        test_case(p, &pre, 10, 1, 16, 16, dt);
        test_case(p, &one, 24, 2, 32, 5, dt);
        test_case(p, &dec, 12, 1, 64, 16, dt);
    }
}

static void run_path(tb_pool *p, const char *path, int threads) {
    cur_path = path;
    cur_threads = threads;
    worst[0] = worst[1] = 0;
    int before = tb_test_failures;
    test_attention(p);
    printf("path %-6s threads %d: worst attention err vs reference: int8 %.2e, fp8 %.2e, %s\n", path, threads,
           worst[0], worst[1], tb_test_failures == before ? "ok" : "FAILED");
}

int main(void) {
    test_quantize();
    tb_test_each_kernel_path(run_path);
    return tb_test_finish("test_kv_quant");
}
