/*
 * quant.h — weight quantisers shared by the builder, calibration and tests.
 *
 * A quantized Linear weight W (N, K) (N outputs, K inputs, PyTorch layout) is
 * stored as codes plus one f32 scale per group of `group` consecutive inputs
 * of a row (and, for asymmetric int4, one additive zero per group):
 *
 *   TB_I8        codes (N, K) int8 in [-127, 127], group = K (per channel)
 *                dq = code * scale
 *   TB_FP8_E4M3  codes (N, K) e4m3fn bytes, group = K, scale chosen so that
 *                max|W[n,:]| / scale = 448; dq = e4m3(code) * scale
 *   TB_I4        codes (N, K/2) bytes: element k in byte k/2, LOW nibble for
 *                even k; each nibble a signed code c in [-8, 7];
 *                group 32, 64 or 128; dq = c * scale + (zeros ? zero : 0)
 *
 * scales and zeros are (N, K / group) f32. Asymmetric int4 takes a group's
 * min m and max M: s = (M - m) / 15, c = round((w - m) / s) - 8, zero =
 * m + 8 s (so the codes' range [-8, 7] spans [m, M]). Symmetric int4 uses
 * s = max|w| / 7 with codes in [-7, 7] (-8 is never produced, as in the
 * usual symmetric schemes, so that negating W negates the codes).
 *
 * Rounding is to nearest, ties to even (rintf), the same in every quantiser
 * and in tests/reference.py.
 */
#ifndef TB_CORE_QUANT_H
#define TB_CORE_QUANT_H
#include "core/core.h"

/* Whether dt is a weight encoding these functions take, and the groups it
 * allows: i8/fp8 need group == K, i4 group in {32, 64, 128} with K % group
 * == 0. TB_ERR_UNSUPPORTED / TB_ERR_INVALID_ARG with a message otherwise. */
tb_status tb_quant_check(tb_dtype dt, int K, int group, int asym);

/* Bytes of the codes of an (N, K) weight. */
uint64_t tb_quant_codes_bytes(tb_dtype dt, int N, int K);

/* Quantises w (N, K) row by row, round to nearest. codes as above; scales
 * (N, K/group); zeros (N, K/group), written only when asym (i4 only). An
 * all-zero group gets scale 1 (codes 0) so dequantisation never divides by
 * zero. Non-finite weights are refused (TB_ERR_FORMAT naming the row). */
tb_status tb_quantize_rows(tb_dtype dt, const float *w, int N, int K, int group, int asym, void *codes,
                           float *scales, float *zeros);

/* Same, with per-input-channel multipliers: row n is quantised as
 * w[n,k] * in_scale[k] (AWQ's activation-aware scaling); the caller folds
 * 1 / in_scale into whatever produces the matmul's input. in_scale (K). */
tb_status tb_quantize_rows_scaled(tb_dtype dt, const float *w, const float *in_scale, int N, int K, int group,
                                  int asym, void *codes, float *scales, float *zeros);

/* dq of rows [0, N): out (N, K) f32. zeros NULL for symmetric. */
void tb_dequantize_rows(tb_dtype dt, const void *codes, const float *scales, const float *zeros, int N, int K,
                        int group, float *out);

/* One element's code, dequantisation not applied (tests, reference kernels). */
static inline int tb_i4_code(const uint8_t *row, int k) {
    int v = (row[k >> 1] >> ((k & 1) * 4)) & 0xf;
    return v >= 8 ? v - 16 : v;
}
float tb_fp8_e4m3_to_f32(uint8_t b);
uint8_t tb_f32_to_fp8_e4m3(float f);

#endif
