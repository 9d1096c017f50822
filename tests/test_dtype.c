/*
 * test_dtype.c — the dtype traits (core/dtype.c): every entry consistent,
 * row and tensor sizes of block types (i4 is never 0 bytes, rows that are
 * not whole blocks are refused), and round trips through each conversion.
 *
 * Error bounds: rounding to nearest gives a relative error of at most half a
 * unit in the last place, 2^-(p) for p stored+implicit mantissa bits:
 * f16 (11 bits) 2^-11, bf16 (8 bits) 2^-8, fp8 e4m3 (4 bits) 2^-4, each for
 * values in the type's normal range; below it the absolute error is at most
 * half the subnormal step (f16 2^-25, fp8 2^-10). Every 16-bit and 8-bit
 * pattern that is a number converts to f32 and back to the same bits.
 */
#include "core/core.h"
#include "ir/ir.h"
#include "tb_test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static float frand(void) { return tb_test_frand(&rng_state); }

static void test_traits(void) {
    for (int i = 0; i < TB_DTYPE_COUNT; i++) {
        tb_dtype t = (tb_dtype)i;
        const tb_dtype_traits *tr = tb_dtype_get_traits(t);
        CHECK_MSG(tr != NULL, "dtype %d has no traits", i);
        if (!tr) continue;
        CHECK_MSG(tr->name && tr->name[0] && !strcmp(tr->name, tb_dtype_name(t)), "dtype %d: name", i);
        tb_dtype back = TB_DTYPE_COUNT;
        CHECK_MSG(tb_dtype_parse(tr->name, &back) == TB_OK && back == t, "%s: parse(name) gives it back", tr->name);
        CHECK_MSG(tr->block_elems >= 1 && tr->block_bytes >= 1, "%s: empty block", tr->name);
        CHECK_MSG(tb_dtype_size(t) == tr->block_bytes && tb_dtype_size(t) > 0, "%s: tb_dtype_size", tr->name);
        CHECK_MSG(tb_dtype_block_elems(t) == tr->block_elems, "%s: block_elems", tr->name);
        /* at most 32 bits and at least 1 bit an element */
        CHECK_MSG(tr->block_bytes * 8 <= (size_t)tr->block_elems * 64 && tr->block_bytes * 8 >= (size_t)tr->block_elems,
                  "%s: %zu bytes for %d elements", tr->name, tr->block_bytes, tr->block_elems);
        CHECK_MSG(tb_dtype_row_size(t, (uint64_t)tr->block_elems) == tr->block_bytes, "%s: one block", tr->name);
        CHECK_MSG(tr->to_f32 != NULL, "%s: every dtype reads as f32", tr->name);
        if (tr->is_float || tr->is_quantized)
            CHECK_MSG(tr->from_f32 != NULL, "%s: floats and quantized codes are written from f32", tr->name);
        CHECK_MSG(!(tr->block_elems > 1) || tr->is_quantized, "%s: packed blocks are quantized codes", tr->name);
    }
    CHECK(tb_dtype_get_traits((tb_dtype)TB_DTYPE_COUNT) == NULL);
    CHECK(tb_dtype_get_traits((tb_dtype)-1) == NULL);
    CHECK(tb_dtype_size((tb_dtype)TB_DTYPE_COUNT) == 0);
    CHECK(tb_dtype_get_traits(TB_F32)->is_float && !tb_dtype_get_traits(TB_F32)->is_quantized);
    CHECK(tb_dtype_get_traits(TB_I4)->is_quantized && tb_dtype_get_traits(TB_I8)->is_quantized);
    CHECK(!tb_dtype_get_traits(TB_I32)->is_quantized && !tb_dtype_get_traits(TB_I32)->is_float);
}

static void test_sizes(void) {
    /* plain types: elements times bytes */
    CHECK(tb_dtype_row_size(TB_F32, 7) == 28);
    CHECK(tb_dtype_row_size(TB_F16, 7) == 14);
    CHECK(tb_dtype_row_size(TB_BF16, 0) == 0);
    /* i4: two elements a byte, rounded up to whole blocks; never 0 */
    for (uint64_t n = 1; n <= 257; n++) {
        uint64_t b = tb_dtype_row_size(TB_I4, n);
        CHECK_MSG(b == (n + 1) / 2 && b > 0, "i4 row of %llu: %llu bytes", (unsigned long long)n,
                  (unsigned long long)b);
    }
    uint64_t bytes = 1;
    CHECK(tb_dtype_tensor_bytes(TB_I4, 2, (const int64_t[]){3, 8}, &bytes) == TB_OK && bytes == 12);
    CHECK(tb_dtype_tensor_bytes(TB_I4, 1, (const int64_t[]){4096}, &bytes) == TB_OK && bytes == 2048);
    CHECK(tb_dtype_tensor_bytes(TB_I4, 2, (const int64_t[]){3, 7}, &bytes) == TB_ERR_FORMAT);
    CHECK(tb_dtype_tensor_bytes(TB_I4, 0, NULL, &bytes) == TB_ERR_FORMAT); /* half a byte */
    CHECK(tb_dtype_tensor_bytes(TB_F32, 0, NULL, &bytes) == TB_OK && bytes == 4);
    CHECK(tb_dtype_tensor_bytes(TB_F16, 3, (const int64_t[]){2, 3, 5}, &bytes) == TB_OK && bytes == 60);
    CHECK(tb_dtype_tensor_bytes(TB_F32, 2, (const int64_t[]){0, 5}, &bytes) == TB_OK && bytes == 0);
    CHECK(tb_dtype_tensor_bytes(TB_F32, 2, (const int64_t[]){-1, 5}, &bytes) == TB_ERR_FORMAT);
    CHECK(tb_dtype_tensor_bytes(TB_F32, 2, (const int64_t[]){5, -1}, &bytes) == TB_ERR_FORMAT);
    CHECK(tb_dtype_tensor_bytes(TB_F32, 4, (const int64_t[]){1ll << 40, 1ll << 40, 1, 4}, &bytes) == TB_ERR_FORMAT);
    CHECK(tb_dtype_tensor_bytes((tb_dtype)TB_DTYPE_COUNT, 1, (const int64_t[]){4}, &bytes) == TB_ERR_FORMAT);

    /* a graph weight gets the same size; a shape that splits a block is refused */
    tb_graph *g = tb_graph_new();
    CHECK(g != NULL);
    if (!g) return;
    static uint8_t data[12];
    int w = tb_graph_add_weight(g, "q", TB_I4, 2, (const int64_t[]){3, 8}, data, 0);
    CHECK(w >= 0 && g->values[w].nbytes == 12);
    int n_before = g->n_values;
    CHECK(tb_graph_add_weight(g, "q_odd", TB_I4, 2, (const int64_t[]){3, 7}, data, 0) < 0);
    CHECK(g->n_values == n_before && strstr(tb_last_error(), "q_odd") != NULL);
    uint8_t *owned = malloc(16); /* handed over: freed on failure too (ASan/valgrind see a leak otherwise) */
    CHECK(tb_graph_add_weight(g, "q_owned", TB_I4, 1, (const int64_t[]){5}, owned, 1) < 0);
    uint64_t vb = 0;
    CHECK(w >= 0 && tb_value_bytes(g, &g->values[w], NULL, &vb) == TB_OK && vb == 12);
    tb_graph_free(g);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static void test_halves(void) {
    const tb_dtype_traits *f16 = tb_dtype_get_traits(TB_F16), *bf16 = tb_dtype_get_traits(TB_BF16);
    /* every pattern that is a number comes back as the same bits */
    static uint16_t pat[65536], back[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++) pat[i] = (uint16_t)i;
    const tb_dtype_traits *both[2] = {f16, bf16};
    for (int k = 0; k < 2; k++) {
        const tb_dtype_traits *tr = both[k];
        tr->to_f32(pat, f, 65536);
        tr->from_f32(f, back, 65536);
        int bad = 0, nan_kept = 1;
        for (int i = 0; i < 65536; i++) {
            if (isnan(f[i])) { nan_kept &= (back[i] & 0x7fff) > (k == 0 ? 0x7c00 : 0x7f80); continue; }
            bad += back[i] != pat[i];
        }
        CHECK_MSG(bad == 0, "%s: %d patterns do not come back", tr->name, bad);
        CHECK_MSG(nan_kept, "%s: a NaN comes back as a number", tr->name);
    }
    /* the row conversions (F16C where present) give the scalar bits */
    enum { N = 10007 };
    static float x[N], y[N];
    static uint16_t h[N];
    for (int i = 0; i < N; i++) x[i] = frand() * ldexpf(1.0f, (i % 40) - 24);
    x[0] = 65504.0f; x[1] = 65520.0f; x[2] = 1e9f; x[3] = -0.0f; x[4] = INFINITY; x[5] = 2.98e-8f;
    f16->from_f32(x, h, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += h[i] != tb_f32_to_f16(x[i]);
    CHECK_MSG(bad == 0, "f16 row conversion differs from the scalar one in %d elements", bad);
    f16->to_f32(h, y, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += !same_bits(y[i], tb_f16_to_f32(h[i]));
    CHECK_MSG(bad == 0, "f16 row read differs from the scalar one in %d elements", bad);
    CHECK(h[0] == 0x7bff && h[1] == 0x7c00 && h[2] == 0x7c00 && h[3] == 0x8000 && h[4] == 0x7c00);

    /* bounds of f32 -> half -> f32 */
    double worst_f16 = 0, worst_f16_sub = 0, worst_bf16 = 0;
    for (int i = 6; i < N; i++) {
        float a = fabsf(x[i]);
        float r = tb_f16_to_f32(tb_f32_to_f16(x[i]));
        if (a >= 6.103515625e-05f && a <= 65504.0f) {
            double e = fabs((double)r - x[i]) / a;
            if (e > worst_f16) worst_f16 = e;
        } else if (a < 6.103515625e-05f) {
            double e = fabs((double)r - x[i]);
            if (e > worst_f16_sub) worst_f16_sub = e;
        }
        float rb = tb_bf16_to_f32(tb_f32_to_bf16(x[i]));
        if (a >= 1.1754944e-38f) {
            double e = fabs((double)rb - x[i]) / a;
            if (e > worst_bf16) worst_bf16 = e;
        }
    }
    CHECK_MSG(worst_f16 <= ldexp(1, -11), "f16 round trip: relative error %g > 2^-11", worst_f16);
    CHECK_MSG(worst_f16_sub <= ldexp(1, -25), "f16 subnormal round trip: error %g > 2^-25", worst_f16_sub);
    CHECK_MSG(worst_bf16 <= ldexp(1, -8), "bf16 round trip: relative error %g > 2^-8", worst_bf16);
    /* ties go to even */
    CHECK(tb_f32_to_bf16(1.0f + ldexpf(1.0f, -8)) == 0x3f80);
    CHECK(tb_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);
    CHECK(tb_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02);
}

static void test_fp8(void) {
    const tb_dtype_traits *tr = tb_dtype_get_traits(TB_FP8_E4M3);
    uint8_t codes[256], back[256];
    float f[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    tr->to_f32(codes, f, 256);
    tr->from_f32(f, back, 256);
    int bad = 0, nans = 0;
    for (int i = 0; i < 256; i++) {
        if (isnan(f[i])) { nans++; continue; }
        bad += back[i] != codes[i];
    }
    CHECK_MSG(bad == 0 && nans == 2, "fp8_e4m3: %d codes do not come back, %d NaNs (want 2)", bad, nans);
    CHECK(f[0x7e] == 448.0f && f[0x08] == ldexpf(1, -6) && f[0x01] == ldexpf(1, -9) && f[0x38] == 1.0f);
    float big[4] = {1e6f, -1e6f, INFINITY, 460.0f};
    uint8_t s[4];
    tr->from_f32(big, s, 4);
    CHECK(s[0] == 0x7e && s[1] == 0xfe && s[2] == 0x7e && s[3] == 0x7e); /* saturates */
    double worst = 0, worst_sub = 0;
    for (int i = 0; i < 20000; i++) {
        float v = frand() * ldexpf(1.0f, i % 18 - 9), r;
        uint8_t c;
        tr->from_f32(&v, &c, 1);
        tr->to_f32(&c, &r, 1);
        float a = fabsf(v);
        if (a >= ldexpf(1, -6) && a <= 448.0f) {
            double e = fabs((double)r - v) / a;
            if (e > worst) worst = e;
        } else if (a < ldexpf(1, -6)) {
            double e = fabs((double)r - v);
            if (e > worst_sub) worst_sub = e;
        }
    }
    CHECK_MSG(worst <= ldexp(1, -4), "fp8_e4m3 round trip: relative error %g > 2^-4", worst);
    CHECK_MSG(worst_sub <= ldexp(1, -10), "fp8_e4m3 subnormal round trip: error %g > 2^-10", worst_sub);
}

static void test_ints(void) {
    /* i8: integers come back exactly; the rest rounds half to even and saturates */
    float v[8] = {-128, 127, 0, 2.5f, -2.5f, 300, -300, NAN}, r[8];
    int8_t c8[8];
    const tb_dtype_traits *i8 = tb_dtype_get_traits(TB_I8), *i4 = tb_dtype_get_traits(TB_I4);
    i8->from_f32(v, c8, 8);
    i8->to_f32(c8, r, 8);
    CHECK(r[0] == -128 && r[1] == 127 && r[2] == 0 && r[3] == 2 && r[4] == -2 && r[5] == 127 && r[6] == -128 &&
          r[7] == 0);
    /* i4: element 2k in the low nibble of byte k */
    float q[6] = {-8, 7, 1, -1, 20, -3.5f}, rq[6];
    uint8_t c4[3];
    i4->from_f32(q, c4, 6);
    CHECK(c4[0] == 0x78 && c4[1] == 0xf1 && c4[2] == 0xc7);
    i4->to_f32(c4, rq, 6);
    CHECK(rq[0] == -8 && rq[1] == 7 && rq[2] == 1 && rq[3] == -1 && rq[4] == 7 && rq[5] == -4);
    /* i32 ids read as numbers; nothing is written as i32 from f32 */
    CHECK(tb_dtype_get_traits(TB_I32)->from_f32 == NULL);
}

static void test_convert(void) {
    enum { N = 3001 };
    static float f[N], g[N];
    static uint16_t h[N], b[N];
    for (int i = 0; i < N; i++) f[i] = frand() * 100.0f;
    /* f16 -> bf16 goes through f32 in chunks: the same bits as element by element */
    CHECK(tb_dtype_convert(f, TB_F32, h, TB_F16, N) == TB_OK);
    CHECK(tb_dtype_convert(h, TB_F16, b, TB_BF16, N) == TB_OK);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += b[i] != tb_f32_to_bf16(tb_f16_to_f32(h[i]));
    CHECK_MSG(bad == 0, "f16 -> bf16: %d mismatches", bad);
    CHECK(tb_dtype_convert(b, TB_BF16, g, TB_F32, N) == TB_OK);
    bad = 0;
    for (int i = 0; i < N; i++) bad += !same_bits(g[i], tb_bf16_to_f32(b[i]));
    CHECK_MSG(bad == 0, "bf16 -> f32: %d mismatches", bad);
    CHECK(tb_dtype_convert(f, TB_F32, g, TB_F32, N) == TB_OK && !memcmp(f, g, sizeof f));
    /* i4 through f32 into f16, in whole blocks only */
    uint8_t c4[2] = {0x78, 0xf1};
    uint16_t hq[4];
    CHECK(tb_dtype_convert(c4, TB_I4, hq, TB_F16, 4) == TB_OK);
    CHECK(tb_f16_to_f32(hq[0]) == -8 && tb_f16_to_f32(hq[1]) == 7 && tb_f16_to_f32(hq[3]) == -1);
    CHECK(tb_dtype_convert(c4, TB_I4, hq, TB_F16, 3) == TB_ERR_INVALID_ARG);
    CHECK(tb_dtype_convert(f, TB_F32, hq, TB_I32, 2) == TB_ERR_UNSUPPORTED);
    CHECK(tb_dtype_convert(f, (tb_dtype)99, hq, TB_F16, 2) == TB_ERR_INVALID_ARG);
}

int main(void) {
    test_traits();
    test_sizes();
    test_halves();
    test_fp8();
    test_ints();
    test_convert();
    printf("test_dtype: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
