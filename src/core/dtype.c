/*
 * dtype.c — one traits entry per dtype (name, block of elements, bytes per
 * block, whether it holds quantized codes, row conversions to and from f32),
 * the size of rows and tensors in bytes, and the f32 <-> f16/bf16 row
 * conversions that the model builder and the tuner use.
 *
 * Every size in bytes goes through tb_dtype_row_size / tb_dtype_tensor_bytes
 * so that a block type (i4: two codes in a byte) is never 0 bytes and a shape
 * that does not fill whole blocks is refused where it enters (builder, file
 * loaders) rather than read past its end later.
 *
 * The f16 conversions take the F16C instructions when the CPU has them (the
 * builder converts whole checkpoints); everything else is scalar code that the
 * compiler vectorises well enough for build-time use. The run-time kernels keep
 * their own inlined loads (backend/cpu).
 */
#include "core.h"

#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- scalar fp8
 * OCP fp8 e4m3 ("fn"): bias 7, no infinities, S.1111.111 is NaN, largest
 * finite 448. Conversion from f32 rounds to nearest even and saturates. */

static float fp8_e4m3_to_f32(uint8_t b) {
    int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 0xf && man == 7) return sign ? -NAN : NAN;
    if (exp == 0) v = ldexpf((float)man, -9); /* subnormal: man/8 * 2^-6 */
    else v = ldexpf((float)(8 + man), exp - 10);
    return sign ? -v : v;
}

static uint8_t f32_to_fp8_e4m3(float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7f;
    if (a >= 448.0f) return sign | 0x7e; /* saturate (no infinity in e4m3fn) */
    if (a < ldexpf(1.0f, -6)) {
        /* subnormal grid: steps of 2^-9; rintf rounds half to even */
        int m = (int)rintf(ldexpf(a, 9));
        return sign | (uint8_t)m; /* m == 8 is the smallest normal: same bits */
    }
    int e;
    frexpf(a, &e);                            /* a = fr * 2^e, fr in [0.5, 1) */
    int exp = e - 1;                          /* a in [2^exp, 2^(exp+1)) */
    int q = (int)rintf(ldexpf(a, 3 - exp));   /* in [8, 16] */
    if (q == 16) { q = 8; exp++; }
    int be = exp + 7;
    if (be > 15 || (be == 15 && q - 8 == 7)) return sign | 0x7e;
    return sign | (uint8_t)(be << 3) | (uint8_t)(q - 8);
}

/* ---------------------------------------------------------------- rows */

static void f32_to_f32(const void *src, float *dst, size_t n) { memcpy(dst, src, n * sizeof(float)); }
static void f32_from_f32(const float *src, void *dst, size_t n) { memcpy(dst, src, n * sizeof(float)); }

#if defined(__x86_64__)
#define F16C_FN __attribute__((target("avx,f16c")))
static F16C_FN size_t f16_to_f32_f16c(const uint16_t *h, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    return i;
}
static F16C_FN size_t f16_from_f32_f16c(const float *src, uint16_t *h, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}
static int have_f16c(void) {
    static int known = -1; /* races are benign: every thread computes the same */
    if (known < 0) known = (tb_cpu_features() & TB_CPU_F16C) != 0;
    return known;
}
#endif

static void f16_to_f32_row(const void *src, float *dst, size_t n) {
    const uint16_t *h = src;
    size_t i = 0;
#if defined(__x86_64__)
    if (have_f16c()) i = f16_to_f32_f16c(h, dst, n);
#endif
    for (; i < n; i++) dst[i] = tb_f16_to_f32(h[i]);
}

static void f16_from_f32_row(const float *src, void *dst, size_t n) {
    uint16_t *h = dst;
    size_t i = 0;
#if defined(__x86_64__)
    /* F16C rounds to nearest even as tb_f32_to_f16 does: same bits either way */
    if (have_f16c()) i = f16_from_f32_f16c(src, h, n);
#endif
    for (; i < n; i++) h[i] = tb_f32_to_f16(src[i]);
}

static void bf16_to_f32_row(const void *src, float *dst, size_t n) {
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++) dst[i] = tb_bf16_to_f32(h[i]);
}

static void bf16_from_f32_row(const float *src, void *dst, size_t n) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) h[i] = tb_f32_to_bf16(src[i]);
}

/* i32 holds token ids and positions: read as numbers, never written from f32 */
static void i32_to_f32_row(const void *src, float *dst, size_t n) {
    const int32_t *p = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)p[i];
}

/* i8 and i4 are quantized codes: the conversions move the integer values
 * (round to nearest even, saturated); a scale lives in its own tensor. */
static int32_t round_sat(float v, int lo, int hi) {
    if (isnan(v)) return 0;
    float r = rintf(v);
    return r < (float)lo ? lo : r > (float)hi ? hi : (int32_t)r;
}

static void i8_to_f32_row(const void *src, float *dst, size_t n) {
    const int8_t *p = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)p[i];
}

static void i8_from_f32_row(const float *src, void *dst, size_t n) {
    int8_t *p = dst;
    for (size_t i = 0; i < n; i++) p[i] = (int8_t)round_sat(src[i], -128, 127);
}

/* i4: two's complement codes in [-8, 7], element 2k in the low nibble of
 * byte k, element 2k+1 in the high nibble. */
static void i4_to_f32_row(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        int v = (p[i / 2] >> ((i & 1) * 4)) & 0xf;
        dst[i] = (float)(v >= 8 ? v - 16 : v);
    }
}

static void i4_from_f32_row(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i += 2) {
        uint8_t lo = (uint8_t)(round_sat(src[i], -8, 7) & 0xf);
        uint8_t hi = i + 1 < n ? (uint8_t)(round_sat(src[i + 1], -8, 7) & 0xf) : 0;
        p[i / 2] = (uint8_t)(lo | hi << 4);
    }
}

static void fp8_to_f32_row(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) dst[i] = fp8_e4m3_to_f32(p[i]);
}

static void fp8_from_f32_row(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i++) p[i] = f32_to_fp8_e4m3(src[i]);
}

/* ---------------------------------------------------------------- table */

/* The plain integer and double types of ONNX graphs: to f32 by value; from
 * f32 rounding to nearest (ties away from zero) and saturating, as a cast. */
static void i64_to_f32_row(const void *src, float *dst, size_t n) {
    const int64_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
}
static void i64_from_f32_row(const float *src, void *dst, size_t n) {
    int64_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        float v = roundf(src[i]);
        d[i] = isnan(v) ? 0 : v >= 9.2233720e18f ? INT64_MAX : v <= -9.2233720e18f ? INT64_MIN : (int64_t)v;
    }
}
static void bool_to_f32_row(const void *src, float *dst, size_t n) {
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = s[i] ? 1.0f : 0.0f;
}
static void bool_from_f32_row(const float *src, void *dst, size_t n) {
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = src[i] != 0.0f;
}
static void u8_to_f32_row(const void *src, float *dst, size_t n) {
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
}
static void u8_from_f32_row(const float *src, void *dst, size_t n) {
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        float v = roundf(src[i]);
        d[i] = !(v > 0.0f) ? 0 : v >= 255.0f ? 255 : (uint8_t)v;
    }
}
static void f64_to_f32_row(const void *src, float *dst, size_t n) {
    const double *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
}
static void f64_from_f32_row(const float *src, void *dst, size_t n) {
    double *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = src[i];
}

static const tb_dtype_traits traits[TB_DTYPE_COUNT] = {
    [TB_F32] = {"f32", 1, 4, 0, 1, f32_to_f32, f32_from_f32},
    [TB_F16] = {"f16", 1, 2, 0, 1, f16_to_f32_row, f16_from_f32_row},
    [TB_BF16] = {"bf16", 1, 2, 0, 1, bf16_to_f32_row, bf16_from_f32_row},
    [TB_I32] = {"i32", 1, 4, 0, 0, i32_to_f32_row, NULL},
    [TB_I8] = {"i8", 1, 1, 1, 0, i8_to_f32_row, i8_from_f32_row},
    [TB_I4] = {"i4", 2, 1, 1, 0, i4_to_f32_row, i4_from_f32_row},
    [TB_FP8_E4M3] = {"fp8_e4m3", 1, 1, 1, 1, fp8_to_f32_row, fp8_from_f32_row},
    [TB_I64] = {"i64", 1, 8, 0, 0, i64_to_f32_row, i64_from_f32_row},
    [TB_BOOL] = {"bool", 1, 1, 0, 0, bool_to_f32_row, bool_from_f32_row},
    [TB_U8] = {"u8", 1, 1, 0, 0, u8_to_f32_row, u8_from_f32_row},
    [TB_F64] = {"f64", 1, 8, 0, 1, f64_to_f32_row, f64_from_f32_row},
};

const tb_dtype_traits *tb_dtype_get_traits(tb_dtype t) {
    return (unsigned)t < TB_DTYPE_COUNT ? &traits[t] : NULL;
}

const char *tb_dtype_name(tb_dtype t) {
    return (unsigned)t < TB_DTYPE_COUNT ? traits[t].name : "?";
}

tb_status tb_dtype_parse(const char *s, tb_dtype *out) {
    for (int i = 0; i < TB_DTYPE_COUNT; i++)
        if (strcmp(s, traits[i].name) == 0) { *out = (tb_dtype)i; return TB_OK; }
    if (!strcmp(s, "fp32") || !strcmp(s, "float32")) { *out = TB_F32; return TB_OK; }
    if (!strcmp(s, "fp16") || !strcmp(s, "float16")) { *out = TB_F16; return TB_OK; }
    if (!strcmp(s, "bfloat16")) { *out = TB_BF16; return TB_OK; }
    return tb_errorf(TB_ERR_UNSUPPORTED, "unknown dtype '%s'", s);
}

size_t tb_dtype_size(tb_dtype t) {
    return (unsigned)t < TB_DTYPE_COUNT ? traits[t].block_bytes : 0;
}

int tb_dtype_block_elems(tb_dtype t) {
    return (unsigned)t < TB_DTYPE_COUNT ? traits[t].block_elems : 0;
}

uint64_t tb_dtype_row_size(tb_dtype t, uint64_t n) {
    if ((unsigned)t >= TB_DTYPE_COUNT) return 0;
    const tb_dtype_traits *tr = &traits[t];
    return (n + (uint64_t)tr->block_elems - 1) / (uint64_t)tr->block_elems * tr->block_bytes;
}

tb_status tb_dtype_tensor_bytes(tb_dtype t, int rank, const int64_t *dims, uint64_t *out) {
    *out = 0;
    if ((unsigned)t >= TB_DTYPE_COUNT) return tb_errorf(TB_ERR_FORMAT, "dtype %d is not a dtype", (int)t);
    const tb_dtype_traits *tr = &traits[t];
    /* each row (the innermost dim) starts on a block: rows * row bytes */
    int64_t inner = rank > 0 ? dims[rank - 1] : 1;
    if (inner < 0) return tb_errorf(TB_ERR_FORMAT, "negative dim %lld", (long long)inner);
    if (inner % tr->block_elems)
        return tb_errorf(TB_ERR_FORMAT, "a row of %lld elements is not a whole number of %s blocks (%d elements each)",
                         (long long)inner, tr->name, tr->block_elems);
    uint64_t rows = 1;
    for (int i = 0; i + 1 < rank; i++) {
        if (dims[i] < 0) return tb_errorf(TB_ERR_FORMAT, "negative dim %lld", (long long)dims[i]);
        if (dims[i] && rows > UINT64_MAX / (uint64_t)dims[i]) return tb_errorf(TB_ERR_FORMAT, "shape overflows");
        rows *= (uint64_t)dims[i];
    }
    uint64_t row = (uint64_t)inner / (uint64_t)tr->block_elems * tr->block_bytes;
    if (row && rows > (UINT64_MAX >> 1) / row) return tb_errorf(TB_ERR_FORMAT, "shape overflows");
    *out = rows * row;
    return TB_OK;
}

tb_status tb_dtype_convert(const void *src, tb_dtype sdt, void *dst, tb_dtype ddt, size_t n) {
    const tb_dtype_traits *s = tb_dtype_get_traits(sdt), *d = tb_dtype_get_traits(ddt);
    if (!s || !d) return tb_errorf(TB_ERR_INVALID_ARG, "convert: bad dtype %d -> %d", (int)sdt, (int)ddt);
    if (n % (size_t)s->block_elems || n % (size_t)d->block_elems)
        return tb_errorf(TB_ERR_INVALID_ARG, "convert %s -> %s: %zu elements are not whole blocks", s->name, d->name,
                         n);
    if (sdt == ddt) {
        memcpy(dst, src, (size_t)tb_dtype_row_size(sdt, n));
        return TB_OK;
    }
    if (!s->to_f32 || !d->from_f32)
        return tb_errorf(TB_ERR_UNSUPPORTED, "no conversion from %s to %s", s->name, d->name);
    if (ddt == TB_F32) { s->to_f32(src, dst, n); return TB_OK; }
    if (sdt == TB_F32) { d->from_f32(src, dst, n); return TB_OK; }
    /* through f32 in chunks of whole blocks of both */
    float buf[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t m = n - i < 1024 ? n - i : 1024;
        s->to_f32((const uint8_t *)src + tb_dtype_row_size(sdt, i), buf, m);
        d->from_f32(buf, (uint8_t *)dst + tb_dtype_row_size(ddt, i), m);
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- fp8 scalars
 * The exact conversions above, for the quantisers (core/quant.h). */
#include "core/quant.h"
float tb_fp8_e4m3_to_f32(uint8_t b) { return fp8_e4m3_to_f32(b); }
uint8_t tb_f32_to_fp8_e4m3(float f) { return f32_to_fp8_e4m3(f); }
