/*
 * kv_layout.h — the bytes of one block of a layer's paged KV cache: the
 * contract between the runtime, which sizes and allocates the pools, and
 * every backend, which writes and reads them.
 *
 * f32, f16, bf16: a block is (block_size, n_kv, hd) elements, nothing else.
 *
 * int8 and fp8 (e4m3): a block is
 *   codes  (block_size, n_kv, hd) one byte each, padded to 64 bytes, then
 *   scales (block_size, n_kv)     f32, padded to 64 bytes,
 * so a block is self-contained: the prefix cache shares and the pool reuses
 * blocks by id, and nothing ever has to follow a block to a second pool.
 * Element d of (row r, kv head h) is  code * scale[r, h]  where code is the
 * int8 value, or the e4m3 value of the byte. The scale is symmetric absmax
 * per (token, kv head): absmax / 127 (int8) or absmax / 448 (e4m3's largest
 * finite value); a row of zeros has scale 0 and codes 0.
 *
 * The scales are f32, not f16: they cost 4 bytes per hd bytes (3% of a row
 * at hd 128, 6% at hd 64), and f16 would put the scale of a row whose
 * absmax is below ~0.008 among f16's subnormals, with fewer significant
 * bits than the codes themselves.
 */
#ifndef TB_KV_LAYOUT_H
#define TB_KV_LAYOUT_H

#include <stddef.h>

#include "turbine/turbine.h"

/* Whether `dt` is a KV dtype stored as codes plus per-row scales. */
static inline int tb_kv_quantized(tb_dtype dt) { return dt == TB_I8 || dt == TB_FP8_E4M3; }

/* Bytes of one KV element (code) of dtype dt: 4, 2 or 1. */
static inline size_t tb_kv_elem_bytes(tb_dtype dt) {
    return dt == TB_F32 ? 4 : (dt == TB_F16 || dt == TB_BF16) ? 2 : 1;
}

/* Bytes of a block's codes (for f32/f16/bf16: the whole block). */
static inline size_t tb_kv_codes_bytes(tb_dtype dt, int block_size, int n_kv, int hd) {
    size_t b = (size_t)block_size * (size_t)n_kv * (size_t)hd * tb_kv_elem_bytes(dt);
    return tb_kv_quantized(dt) ? (b + 63) & ~(size_t)63 : b;
}

/* Bytes of one whole block (codes and, when quantized, its scales). */
static inline size_t tb_kv_block_bytes(tb_dtype dt, int block_size, int n_kv, int hd) {
    size_t b = tb_kv_codes_bytes(dt, block_size, n_kv, hd);
    if (tb_kv_quantized(dt)) b += ((size_t)block_size * (size_t)n_kv * sizeof(float) + 63) & ~(size_t)63;
    return b;
}

/* The largest code magnitude of a quantized KV dtype. */
static inline float tb_kv_code_max(tb_dtype dt) { return dt == TB_I8 ? 127.0f : 448.0f; }

/* The word that names a KV dtype on the command line and in reports:
 * "int8" and "fp8" for the quantized ones, else the dtype's name. */
static inline const char *tb_kv_dtype_label(tb_dtype dt) {
    return dt == TB_I8 ? "int8" : dt == TB_FP8_E4M3 ? "fp8" : tb_dtype_name(dt);
}

/* Bytes of one token's keys and values in all n_layers layers, the
 * block's scales and padding shared out over its block_size rows. */
static inline double tb_kv_bytes_per_token(tb_dtype dt, int block_size, int n_kv, int hd, int n_layers) {
    return 2.0 * (double)n_layers * (double)tb_kv_block_bytes(dt, block_size, n_kv, hd) / (double)block_size;
}

#endif /* TB_KV_LAYOUT_H */
