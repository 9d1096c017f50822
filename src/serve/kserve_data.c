/* kserve_data.c — inputs[].data arrays read from the JSON text into tensor
 * buffers without a json_t per element (kserve_data.h says how this fits
 * tb_ks_parse_infer and why). */
#define _GNU_SOURCE
#include "serve/kserve_data.h"

#include <errno.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"


static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* ================================================================ scanner
 * A lenient walk of the request's structure that only needs to find where
 * each inputs[i].data array starts and ends. Strings are skipped with their
 * escapes, scalars as runs of their characters; jansson checks all of that
 * on the text that remains, and tb_ks_data_count each span. */

enum { CTX_ANY, CTX_ROOT, CTX_INPUTS, CTX_INPUT };

typedef struct {
    const char *p, *end, *base;
    tb_ks_span *spans;
    int cap, n, depth;
} scanner;

static void sc_ws(scanner *s) {
    while (s->p < s->end && is_ws(*s->p)) s->p++;
}

/* The string at s->p ('"'): its raw bytes (escapes as written). */
static int sc_string(scanner *s, const char **raw, size_t *len) {
    const char *b = ++s->p;
    while (s->p < s->end) {
        char c = *s->p;
        if (c == '"') {
            *raw = b;
            *len = (size_t)(s->p - b);
            s->p++;
            return 1;
        }
        if ((unsigned char)c < 0x20) return 0;
        if (c == '\\') {
            if (s->end - s->p < 2) return 0;
            s->p += 2;
            continue;
        }
        s->p++;
    }
    return 0;
}

static int sc_value(scanner *s, int ctx, int idx);

/* A data array at s->p ('['): to its matching ']' by brackets alone,
 * strings skipped. Whether what lies between is valid is for
 * tb_ks_data_count; when it is and the rest is valid for jansson, the
 * whole text was valid JSON and this is the array's end. */
static int sc_skip_array(scanner *s) {
    int depth = 0;
    while (s->p < s->end) {
        char c = *s->p;
        if (c == '"') {
            const char *r;
            size_t l;
            if (!sc_string(s, &r, &l)) return 0;
            continue;
        }
        s->p++;
        if (c == '[') {
            if (++depth > TB_KS_MAX_DEPTH) return 0;
        } else if (c == ']' && --depth == 0) {
            return 1;
        }
    }
    return 0;
}

static int sc_object(scanner *s, int ctx, int idx) {
    if (++s->depth > TB_KS_MAX_DEPTH) return 0;
    s->p++;
    int seen_inputs = 0, seen_data = 0;
    sc_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        s->depth--;
        return 1;
    }
    for (;;) {
        sc_ws(s);
        const char *k;
        size_t kl;
        if (s->p >= s->end || *s->p != '"' || !sc_string(s, &k, &kl)) return 0;
        /* an escaped key might spell "inputs" or "data" where jansson sees it
         * and this scan does not: let jansson read the whole request */
        if ((ctx == CTX_ROOT || ctx == CTX_INPUT) && memchr(k, '\\', kl)) return 0;
        sc_ws(s);
        if (s->p >= s->end || *s->p != ':') return 0;
        s->p++;
        int is_inputs = ctx == CTX_ROOT && kl == 6 && !memcmp(k, "inputs", 6);
        int is_data = ctx == CTX_INPUT && kl == 4 && !memcmp(k, "data", 4);
        /* a repeated key: jansson keeps the last; again, leave it all to it */
        if ((is_inputs && seen_inputs++) || (is_data && seen_data++)) return 0;
        sc_ws(s);
        if (is_data && s->p < s->end && *s->p == '[') {
            if (s->n == s->cap) return 0;
            const char *b = s->p;
            if (!sc_skip_array(s)) return 0;
            s->spans[s->n++] = (tb_ks_span){(size_t)(b - s->base), (size_t)(s->p - b), idx};
        } else if (!sc_value(s, is_inputs ? CTX_INPUTS : CTX_ANY, 0)) {
            return 0;
        }
        sc_ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        if (*s->p != '}') return 0;
        s->p++;
        s->depth--;
        return 1;
    }
}

static int sc_array(scanner *s, int ctx) {
    if (++s->depth > TB_KS_MAX_DEPTH) return 0;
    s->p++;
    sc_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        s->depth--;
        return 1;
    }
    for (int i = 0;; i++) {
        if (!sc_value(s, ctx == CTX_INPUTS ? CTX_INPUT : CTX_ANY, i)) return 0;
        sc_ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        if (*s->p != ']') return 0;
        s->p++;
        s->depth--;
        return 1;
    }
}

static int sc_value(scanner *s, int ctx, int idx) {
    sc_ws(s);
    if (s->p >= s->end) return 0;
    char c = *s->p;
    if (c == '{') return sc_object(s, ctx, idx);
    if (c == '[') return sc_array(s, ctx);
    if (c == '"') {
        const char *r;
        size_t l;
        return sc_string(s, &r, &l);
    }
    const char *b = s->p; /* a number or a literal */
    while (s->p < s->end && (is_digit(*s->p) || (*s->p >= 'a' && *s->p <= 'z') || *s->p == '-' || *s->p == '+' ||
                             *s->p == '.' || *s->p == 'E'))
        s->p++;
    return s->p > b;
}

int tb_ks_data_scan(const char *text, size_t n, tb_ks_span *spans, int cap) {
    scanner s = {text, text + n, text, spans, cap, 0, 0};
    sc_ws(&s);
    if (s.p >= s.end || *s.p != '{') return -1;
    if (!sc_value(&s, CTX_ROOT, 0)) return -1;
    return s.n;
}

/* ================================================================ reader */

/* The JSON number at p (at most up to end): its length, 0 when it is none;
 * *is_int: no fraction and no exponent (what jansson calls an integer). */
static size_t num_token(const char *p, const char *end, int *is_int) {
    const char *q = p;
    *is_int = 1;
    if (q < end && *q == '-') q++;
    if (q >= end) return 0;
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9')
        while (q < end && is_digit(*q)) q++;
    else
        return 0;
    if (q < end && *q == '.') {
        *is_int = 0;
        if (++q >= end || !is_digit(*q)) return 0;
        while (q < end && is_digit(*q)) q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        *is_int = 0;
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q >= end || !is_digit(*q)) return 0;
        while (q < end && is_digit(*q)) q++;
    }
    return (size_t)(q - p);
}

static size_t lit_token(const char *p, const char *end, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(end - p) >= n && !memcmp(p, lit, n) ? n : 0;
}

static const char *type_words(tb_dtype t) {
    switch (t) {
    case TB_BOOL: return "BOOL data must be true or false";
    case TB_U8: return "UINT8 data must be integers";
    case TB_I8: return "INT8 data must be integers";
    case TB_I32: return "INT32 data must be integers";
    case TB_I64: return "INT64 data must be integers";
    case TB_F16: return "FP16 data must be numbers";
    case TB_BF16: return "BF16 data must be numbers";
    case TB_F32: return "FP32 data must be numbers";
    case TB_F64: return "FP64 data must be numbers";
    default: return "unsupported datatype";
    }
}

/* Counts the leaves of the array at r->p, `depth` levels allowed. */
typedef struct {
    const char *p, *end, *begin;
} reader;

static void rd_ws(reader *r) {
    while (r->p < r->end && is_ws(*r->p)) r->p++;
}

/* 200, or 400: 'n' not valid JSON, 'd' too deep, 't' a leaf that is no number or literal */
static int rd_count(reader *r, int depth, int64_t *count, char *why) {
    if (depth <= 0) { *why = 'd'; return 400; }
    r->p++; /* '[' */
    rd_ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        return 200;
    }
    for (;;) {
        rd_ws(r);
        if (r->p >= r->end) { *why = 'n'; return 400; }
        char c = *r->p;
        if (c == '[') {
            int st = rd_count(r, depth - 1, count, why);
            if (st != 200) return st;
        } else {
            int is_int;
            size_t k = (c == '-' || is_digit(c)) ? num_token(r->p, r->end, &is_int)
                       : c == 't'              ? lit_token(r->p, r->end, "true")
                       : c == 'f'              ? lit_token(r->p, r->end, "false")
                                               : 0;
            if (!k) { /* a string, null or an object: no number; or broken text */
                *why = (c == '"' || c == '{' || c == 'n') ? 't' : 'n';
                return 400;
            }
            r->p += k;
            (*count)++;
        }
        rd_ws(r);
        if (r->p >= r->end) { *why = 'n'; return 400; }
        if (*r->p == ',') {
            r->p++;
            continue;
        }
        if (*r->p != ']') { *why = 'n'; return 400; }
        r->p++;
        return 200;
    }
}

int tb_ks_data_count(const char *p, size_t n, int depth, const char *name, tb_dtype t, int64_t *count,
                     tb_ks_error *e) {
    reader r = {p, p + n, p};
    *count = 0;
    char why = 0;
    rd_ws(&r);
    int st = r.p < r.end && *r.p == '[' ? rd_count(&r, depth, count, &why) : (why = 'n', 400);
    if (st == 200) {
        rd_ws(&r);
        if (r.p != r.end) why = 'n', st = 400;
    }
    if (st == 200) return 200;
    if (why == 'd') return tb_ks_fail(e, 400, "input '%s': data is nested deeper than its shape", name);
    if (why == 't') return tb_ks_fail(e, 400, "input '%s': %s", name, type_words(t));
    return tb_ks_fail(e, 400, "the body is not valid JSON: input '%s': data, at byte %zu of the array", name,
                (size_t)(r.p - r.begin));
}

/* strtod in the C locale whatever the process's (jansson takes the same
 * care), so that "1.5" is 1.5 under a locale that writes 1,5. */
static locale_t g_c_locale;
static pthread_once_t g_c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void) { g_c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

#if LDBL_MANT_DIG == 64 && defined(__x86_64__)
static const long double k_pow10l[28] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
                                         1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
                                         1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};
#endif
static const double k_pow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int int_value(const char *p, size_t len, int64_t *out);

/* A JSON number (a valid token of len bytes) as jansson gives it as a
 * double. An integer (no fraction, no exponent) is an int64 first, then
 * converted ("-0" is +0.0); 0 beyond int64 (jansson refuses it). A real is
 * the nearest double, as strtod gives it: exactly when the digits fit 2^53
 * and the power of ten is itself exact (Clinger's fast path: one correctly
 * rounded multiply or divide), through x87 extended precision for up to 19
 * digits, else strtod on a copy; 0 when it overflows (jansson refuses those
 * too). */
static int number_value(const char *p, size_t len, double *out) {
    const char *q = p, *end = p + len;
    int neg = *q == '-';
    q += neg;
    uint64_t m = 0;
    int sig = 0, exp10 = 0;
    for (; q < end && is_digit(*q); q++)
        if (m || *q != '0') m = m * 10 + (uint64_t)(*q - '0'), sig++;
    if (q == end) { /* an integer */
        int64_t iv;
        if (sig <= 18) iv = neg ? -(int64_t)m : (int64_t)m;
        else if (!int_value(p, len, &iv)) return 0;
        *out = (double)iv;
        return 1;
    }
    if (q < end && *q == '.')
        for (q++; q < end && is_digit(*q); q++) {
            if (m || *q != '0') m = m * 10 + (uint64_t)(*q - '0'), sig++;
            exp10--;
            if (sig > 19) break;
        }
    if (sig <= 19 && q < end && (*q == 'e' || *q == 'E')) {
        q++;
        int es = 1, ev = 0;
        if (*q == '+' || *q == '-') es = *q++ == '-' ? -1 : 1;
        for (; q < end && is_digit(*q) && ev < 10000; q++) ev = ev * 10 + (*q - '0');
        exp10 += es * ev;
    }
    if (sig <= 15 && q == end && exp10 >= -22 && exp10 <= 22) {
        double d = (double)m;
        d = exp10 < 0 ? d / k_pow10[-exp10] : d * k_pow10[exp10];
        *out = neg ? -d : d;
        return 1;
    }
#if LDBL_MANT_DIG == 64 && defined(__x86_64__)
    /* 16 to 19 digits (what %.17g and Python print): the digits and the
     * power of ten are exact in the x87's 64-bit significand, the product or
     * quotient rounds once there; rounding that to 53 bits is the correct
     * rounding of the decimal unless the 64-bit result sits exactly on a
     * halfway point of doubles (its low 11 bits 0x400), where the true value
     * might lie on either side: strtod decides those. */
    if (sig <= 19 && q == end && exp10 >= -27 && exp10 <= 27) {
        long double ld = (long double)m;
        ld = exp10 < 0 ? ld / k_pow10l[-exp10] : ld * k_pow10l[exp10];
        uint64_t mant;
        memcpy(&mant, &ld, sizeof mant); /* x87 extended: the significand's 64 bits first */
        if ((mant & 0x7ff) != 0x400) {
            double d = (double)ld;
            *out = neg ? -d : d;
            return 1;
        }
    }
#endif
    char small[128], *buf = len < sizeof small ? small : malloc(len + 1);
    if (!buf) return 0;
    memcpy(buf, p, len);
    buf[len] = 0;
    pthread_once(&g_c_locale_once, c_locale_init);
    errno = 0;
    double d = g_c_locale ? strtod_l(buf, NULL, g_c_locale) : strtod(buf, NULL);
    int over = (d == HUGE_VAL || d == -HUGE_VAL) && errno == ERANGE;
    if (buf != small) free(buf);
    *out = d;
    return !over;
}

/* A JSON integer token as int64; 0 when beyond its range. */
static int int_value(const char *p, size_t len, int64_t *out) {
    const char *q = p, *end = p + len;
    int neg = *q == '-';
    q += neg;
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; q < end; q++) {
        uint64_t d = (uint64_t)(*q - '0');
        if (v > (lim - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

int tb_ks_data_fill(const char *p, size_t n, const char *name, tb_dtype t, void *dst, int64_t want, tb_ks_error *e) {
    const char *q = p, *end = p + n;
    int64_t k = 0;
    const char *tn = tb_ks_dtype_name(t);
    while (q < end) {
        char c = *q;
        if (c == '[' || c == ']' || c == ',' || is_ws(c)) { /* the structure, checked by tb_ks_data_count */
            q++;
            continue;
        }
        if (k >= want)
            return tb_ks_fail(e, 400, "input '%s': data has more than the shape's %lld elements", name, (long long)want);
        int is_int = 0;
        size_t len;
        int is_bool = c == 't' || c == 'f';
        int fp = t == TB_F32 || t == TB_F64 || t == TB_F16 || t == TB_BF16;
        if (is_bool) {
            len = c == 't' ? 4 : 5;
        } else if (fp) { /* a number (tb_ks_data_count checked it): up to its delimiter */
            const char *z = q;
            while (z < end && *z != ',' && *z != ']' && !is_ws(*z)) z++;
            len = (size_t)(z - q);
        } else {
            len = num_token(q, end, &is_int);
        }
        if (!len) return tb_ks_fail(e, 400, "input '%s': data is not valid JSON", name);
        if (t == TB_BOOL) {
            if (!is_bool) return tb_ks_fail(e, 400, "input '%s': %s", name, type_words(t));
            ((uint8_t *)dst)[k] = c == 't';
        } else if (is_bool || (!is_int && (t == TB_U8 || t == TB_I8 || t == TB_I32 || t == TB_I64))) {
            return tb_ks_fail(e, 400, "input '%s': %s", name, type_words(t));
        } else if (t == TB_U8 || t == TB_I8 || t == TB_I32 || t == TB_I64) {
            int64_t x;
            long long lo = t == TB_U8 ? 0 : t == TB_I8 ? -128 : t == TB_I32 ? INT32_MIN : INT64_MIN;
            long long hi = t == TB_U8 ? 255 : t == TB_I8 ? 127 : t == TB_I32 ? INT32_MAX : INT64_MAX;
            if (!int_value(q, len, &x))
                return tb_ks_fail(e, 400, "input '%s': %.*s is out of range for %s", name, (int)(len < 40 ? len : 40), q, tn);
            if (x < lo || x > hi)
                return tb_ks_fail(e, 400, "input '%s': %lld is out of range for %s", name, (long long)x, tn);
            switch (t) {
            case TB_U8: ((uint8_t *)dst)[k] = (uint8_t)x; break;
            case TB_I8: ((int8_t *)dst)[k] = (int8_t)x; break;
            case TB_I32: ((int32_t *)dst)[k] = (int32_t)x; break;
            default: ((int64_t *)dst)[k] = x; break;
            }
        } else {
            double x;
            if (!number_value(q, len, &x))
                return tb_ks_fail(e, 400, "input '%s': %.*s is out of range for %s", name, (int)(len < 40 ? len : 40), q,
                            tn);
            switch (t) {
            case TB_F32: ((float *)dst)[k] = (float)x; break;
            case TB_F64: ((double *)dst)[k] = x; break;
            case TB_F16: ((uint16_t *)dst)[k] = tb_f32_to_f16((float)x); break;
            case TB_BF16: ((uint16_t *)dst)[k] = tb_f32_to_bf16((float)x); break;
            default: return tb_ks_fail(e, 400, "input '%s': unsupported datatype", name);
            }
        }
        q += len;
        k++;
    }
    if (k != want)
        return tb_ks_fail(e, 400, "input '%s' has %lld values; the shape needs %lld", name, (long long)k, (long long)want);
    return 200;
}
