/*
 * quant.c — round-to-nearest weight quantisers and their inverse (quant.h
 * gives the encodings). Build-time code: clear before fast; the run-time
 * kernels (backend/cpu/qgemm*.c) read what these write.
 */
#include "core/quant.h"

#include <math.h>

tb_status tb_quant_check(tb_dtype dt, int K, int group, int asym) {
    if (K <= 0) return tb_errorf(TB_ERR_INVALID_ARG, "quantize: K = %d", K);
    switch (dt) {
    case TB_I8:
    case TB_FP8_E4M3:
        if (group != K)
            return tb_errorf(TB_ERR_INVALID_ARG, "quantize: %s weights take one scale per output channel (group %d, K %d)",
                             tb_dtype_name(dt), group, K);
        if (asym) return tb_errorf(TB_ERR_INVALID_ARG, "quantize: %s weights are symmetric", tb_dtype_name(dt));
        return TB_OK;
    case TB_I4:
        if (group != 32 && group != 64 && group != 128)
            return tb_errorf(TB_ERR_INVALID_ARG, "quantize: int4 group size %d (32, 64 or 128)", group);
        if (K % group)
            return tb_errorf(TB_ERR_INVALID_ARG, "quantize: int4 rows of %d elements are not whole groups of %d", K,
                             group);
        return TB_OK;
    default:
        return tb_errorf(TB_ERR_UNSUPPORTED, "quantize: %s is not a quantized weight encoding (i8, i4, fp8_e4m3)",
                         tb_dtype_name(dt));
    }
}

uint64_t tb_quant_codes_bytes(tb_dtype dt, int N, int K) {
    return (uint64_t)N * (dt == TB_I4 ? (uint64_t)(K + 1) / 2 : (uint64_t)K);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* One group of n values (already multiplied by any input scale) to codes. */
static void quant_group(tb_dtype dt, const float *v, int n, int asym, uint8_t *codes, int k0, float *scale,
                        float *zero) {
    float amax = 0, mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        if (a > amax) amax = a;
        if (v[i] < mn) mn = v[i];
        if (v[i] > mx) mx = v[i];
    }
    if (dt == TB_I8) {
        float s = amax > 0 ? amax / 127.0f : 1.0f;
        for (int i = 0; i < n; i++) ((int8_t *)codes)[k0 + i] = (int8_t)clampi((int)rintf(v[i] / s), -127, 127);
        *scale = s;
    } else if (dt == TB_FP8_E4M3) {
        float s = amax > 0 ? amax / 448.0f : 1.0f;
        for (int i = 0; i < n; i++) codes[k0 + i] = tb_f32_to_fp8_e4m3(v[i] / s);
        *scale = s;
    } else { /* TB_I4 */
        float s, z = 0;
        if (asym) {
            s = mx > mn ? (mx - mn) / 15.0f : 1.0f;
            z = mn + 8.0f * s;
        } else {
            s = amax > 0 ? amax / 7.0f : 1.0f;
        }
        for (int i = 0; i < n; i++) {
            int c = asym ? clampi((int)rintf((v[i] - z) / s), -8, 7) : clampi((int)rintf(v[i] / s), -7, 7);
            int k = k0 + i;
            uint8_t nib = (uint8_t)(c & 0xf);
            if (k & 1) codes[k >> 1] = (uint8_t)((codes[k >> 1] & 0x0f) | (nib << 4));
            else codes[k >> 1] = (uint8_t)((codes[k >> 1] & 0xf0) | nib);
        }
        *scale = s;
        if (zero) *zero = z;
    }
}

tb_status tb_quantize_rows_scaled(tb_dtype dt, const float *w, const float *in_scale, int N, int K, int group,
                                  int asym, void *codes, float *scales, float *zeros) {
    tb_status st = tb_quant_check(dt, K, group, asym);
    if (st != TB_OK) return st;
    if (asym && !zeros) return tb_errorf(TB_ERR_INVALID_ARG, "quantize: asymmetric int4 needs a zeros buffer");
    float *tmp = malloc(sizeof(float) * (size_t)group);
    if (!tmp) return tb_errorf(TB_ERR_OOM, "quantize: out of memory");
    int G = K / group;
    uint64_t row_bytes = tb_quant_codes_bytes(dt, 1, K);
    for (int n = 0; n < N; n++) {
        const float *wr = w + (size_t)n * (size_t)K;
        uint8_t *cr = (uint8_t *)codes + (size_t)n * row_bytes;
        if (dt == TB_I4) memset(cr, 0, row_bytes);
        for (int g = 0; g < G; g++) {
            for (int i = 0; i < group; i++) {
                float v = wr[g * group + i] * (in_scale ? in_scale[g * group + i] : 1.0f);
                if (!isfinite(v)) {
                    free(tmp);
                    return tb_errorf(TB_ERR_FORMAT, "quantize: row %d holds a value that is not finite", n);
                }
                tmp[i] = v;
            }
            quant_group(dt, tmp, group, asym, cr, g * group, &scales[(size_t)n * G + g],
                        asym ? &zeros[(size_t)n * G + g] : NULL);
        }
    }
    free(tmp);
    return TB_OK;
}

tb_status tb_quantize_rows(tb_dtype dt, const float *w, int N, int K, int group, int asym, void *codes, float *scales,
                           float *zeros) {
    return tb_quantize_rows_scaled(dt, w, NULL, N, K, group, asym, codes, scales, zeros);
}

void tb_dequantize_rows(tb_dtype dt, const void *codes, const float *scales, const float *zeros, int N, int K,
                        int group, float *out) {
    int G = K / group;
    uint64_t row_bytes = tb_quant_codes_bytes(dt, 1, K);
    for (int n = 0; n < N; n++) {
        const uint8_t *cr = (const uint8_t *)codes + (size_t)n * row_bytes;
        float *o = out + (size_t)n * (size_t)K;
        for (int k = 0; k < K; k++) {
            float s = scales[(size_t)n * G + k / group];
            float z = zeros ? zeros[(size_t)n * G + k / group] : 0.0f;
            float c = dt == TB_I8 ? (float)((const int8_t *)cr)[k]
                    : dt == TB_FP8_E4M3 ? tb_fp8_e4m3_to_f32(cr[k])
                                        : (float)tb_i4_code(cr, k);
            o[k] = c * s + z;
        }
    }
}
