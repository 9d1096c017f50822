/*
 * kernels_ref.c — scalar references for every CPU kernel.
 *
 * Written for clarity, not speed: one output element at a time, f32
 * arithmetic in the obvious order. The tests compare every fast path
 * against these.
 */
#include "backend/cpu/kernels.h"
#include "core/kv_layout.h"

#include <math.h>

/* Element i of a weight tensor of dtype dt, as f32. */
static float ref_load(const void *w, tb_dtype dt, size_t i) {
    switch (dt) {
    case TB_F32: return ((const float *)w)[i];
    case TB_F16: return tb_f16_to_f32(((const uint16_t *)w)[i]);
    case TB_BF16: return tb_bf16_to_f32(((const uint16_t *)w)[i]);
    default: TB_ASSERT(!"unsupported weight dtype"); return 0.0f;
    }
}

static void ref_store(void *dst, tb_dtype dt, size_t i, float v) {
    switch (dt) {
    case TB_F32: ((float *)dst)[i] = v; break;
    case TB_F16: ((uint16_t *)dst)[i] = tb_f32_to_f16(v); break;
    case TB_BF16: ((uint16_t *)dst)[i] = tb_f32_to_bf16(v); break;
    default: TB_ASSERT(!"unsupported dtype");
    }
}

/* ---------------------------------------------------------------- embedding */
void tb_ref_embedding(const int32_t *ids, const void *table, tb_dtype wdt,
                      float *y, int T, int D) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++)
            y[(size_t)t * D + d] = ref_load(table, wdt, (size_t)ids[t] * D + d);
}

void tb_ref_embedding_range(const int32_t *ids, const void *table, tb_dtype wdt, float *y, int T, int D, int32_t lo,
                            int32_t V) {
    for (int t = 0; t < T; t++) {
        int64_t id = (int64_t)ids[t] - lo;
        for (int d = 0; d < D; d++)
            y[(size_t)t * D + d] = id >= 0 && id < V ? ref_load(table, wdt, (size_t)id * D + d) : 0.0f;
    }
}

/* ---------------------------------------------------------------- rmsnorm */
void tb_ref_rmsnorm(const float *x, const float *w, float *y, int T, int D,
                    float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * D;
        float ss = 0.0f;
        for (int d = 0; d < D; d++) ss += xr[d] * xr[d];
        float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (int d = 0; d < D; d++) y[(size_t)t * D + d] = xr[d] * inv * w[d];
    }
}

void tb_ref_add_rmsnorm(const float *x, const float *d, const float *w,
                        float *r, float *y, int T, int D, float eps) {
    for (size_t i = 0; i < (size_t)T * D; i++) r[i] = x[i] + d[i];
    tb_ref_rmsnorm(r, w, y, T, D, eps);
}

/* ---------------------------------------------------------------- matmul */
void tb_ref_matmul(const float *x, const void *w, tb_dtype wdt,
                   const float *bias, float *y, int T, int K, int N) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += x[(size_t)t * K + k] * ref_load(w, wdt, (size_t)n * K + k);
            y[(size_t)t * N + n] = s + (bias ? bias[n] : 0.0f);
        }
}

/* ---------------------------------------------------------------- elementwise */
void tb_ref_silu_mul(const float *gu, float *y, int T, int F) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < F; i++) {
            float g = gu[(size_t)t * 2 * F + i], u = gu[(size_t)t * 2 * F + F + i];
            y[(size_t)t * F + i] = g / (1.0f + expf(-g)) * u;
        }
}

void tb_ref_concat_cols(const float *const *x, const int *cols, int n_in, float *y, int T) {
    int C = 0;
    for (int i = 0; i < n_in; i++) C += cols[i];
    for (int t = 0; t < T; t++) {
        float *row = y + (size_t)t * (size_t)C;
        for (int i = 0; i < n_in; i++) {
            memcpy(row, x[i] + (size_t)t * (size_t)cols[i], sizeof(float) * (size_t)cols[i]);
            row += cols[i];
        }
    }
}

void tb_ref_silu(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

void tb_ref_mul(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

void tb_ref_add(const float *a, const float *b, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* ---------------------------------------------------------------- rope */
void tb_ref_rope(float *x, int row_stride, const int32_t *pos,
                 const float *inv_freq, int T, int n_heads, int hd,
                 int interleaved) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)t * row_stride + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float a = (float)pos[t] * inv_freq[i];
                float c = cosf(a), s = sinf(a);
                int i0 = interleaved ? 2 * i : i;
                int i1 = interleaved ? 2 * i + 1 : i + half;
                float x0 = v[i0], x1 = v[i1];
                v[i0] = x0 * c - x1 * s;
                v[i1] = x0 * s + x1 * c;
            }
        }
}

/* ---------------------------------------------------------------- attention */
size_t tb_attention_scratch_floats(int n_threads, int max_ctx) {
    /* TB_ATTN_GROUP_MAX rows of scores, each padded by 16 so that fast
     * paths may store whole vectors past the last position. */
    size_t per = (((size_t)max_ctx + 15) & ~(size_t)15) + 16;
    per *= TB_ATTN_GROUP_MAX;
    return (size_t)(n_threads > 0 ? n_threads : 1) * per;
}

/* The codes of position p of sequence s, kv head kvh (kv_layout.h), and
 * through *scale_out the address of its scale (NULL for f32/f16/bf16). */
static uint8_t *ref_kv_row(const tb_attn_args *a, void *cache, int s, int p, int kvh, float **scale_out) {
    int blk = a->block_tables[(size_t)s * a->max_blocks + p / a->block_size];
    int r = p % a->block_size;
    uint8_t *b = (uint8_t *)cache + (size_t)blk * tb_kv_block_bytes(a->kv_dtype, a->block_size, a->n_kv, a->hd);
    size_t esz = tb_kv_elem_bytes(a->kv_dtype);
    *scale_out = NULL;
    if (tb_kv_quantized(a->kv_dtype))
        *scale_out = (float *)(b + tb_kv_codes_bytes(a->kv_dtype, a->block_size, a->n_kv, a->hd)) +
                     (size_t)r * a->n_kv + kvh;
    return b + (((size_t)r * a->n_kv + (size_t)kvh) * a->hd) * esz;
}

void tb_ref_kv_quantize(const float *x, int hd, tb_dtype dt, void *codes, float *scale) {
    float amax = 0.0f, qmax = tb_kv_code_max(dt);
    for (int d = 0; d < hd; d++)
        if (fabsf(x[d]) > amax) amax = fabsf(x[d]);
    *scale = amax / qmax;
    float inv = amax > 0.0f ? qmax / amax : 0.0f;
    for (int d = 0; d < hd; d++) {
        float v = x[d] * inv;
        if (dt == TB_I8) {
            float r = rintf(v);
            ((int8_t *)codes)[d] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
        } else {
            tb_dtype_get_traits(TB_FP8_E4M3)->from_f32(&v, (uint8_t *)codes + d, 1);
        }
    }
}

/* Element d of a KV row (codes of kv_layout.h times the row's scale). */
static float ref_kv_load(const uint8_t *row, const float *scale, tb_dtype dt, int d) {
    if (dt == TB_I8) return (float)((const int8_t *)row)[d] * *scale;
    if (dt == TB_FP8_E4M3) {
        float v;
        tb_dtype_get_traits(TB_FP8_E4M3)->to_f32(row + d, &v, 1);
        return v * *scale;
    }
    return ref_load(row, dt, (size_t)d);
}

void tb_ref_attention(const tb_attn_args *a, const float *qkv, float *out,
                      float *scratch) {
    int hd = a->hd, stride = (a->n_heads + 2 * a->n_kv) * hd;
    int group = a->n_heads / a->n_kv;
    tb_dtype dt = a->kv_dtype;
    float *ks, *vs;

    for (int t = 0; t < a->T; t++) {
        const float *row = qkv + (size_t)t * stride;
        for (int kvh = 0; kvh < a->n_kv; kvh++) {
            uint8_t *kr = ref_kv_row(a, a->k_cache, a->seq[t], a->pos[t], kvh, &ks);
            uint8_t *vr = ref_kv_row(a, a->v_cache, a->seq[t], a->pos[t], kvh, &vs);
            const float *k = row + (size_t)(a->n_heads + kvh) * hd;
            const float *v = row + (size_t)(a->n_heads + a->n_kv + kvh) * hd;
            if (tb_kv_quantized(dt)) {
                tb_ref_kv_quantize(k, hd, dt, kr, ks);
                tb_ref_kv_quantize(v, hd, dt, vr, vs);
            } else {
                for (int d = 0; d < hd; d++) {
                    ref_store(kr, dt, (size_t)d, k[d]);
                    ref_store(vr, dt, (size_t)d, v[d]);
                }
            }
        }
    }

    for (int t = 0; t < a->T; t++) {
        int s = a->seq[t], ctx = a->pos[t] + 1;
        for (int h = 0; h < a->n_heads; h++) {
            const float *q = qkv + (size_t)t * stride + (size_t)h * hd;
            int kvh = h / group;
            float mx = -INFINITY;
            for (int j = 0; j < ctx; j++) {
                const uint8_t *kr = ref_kv_row(a, a->k_cache, s, j, kvh, &ks);
                float dot = 0.0f;
                for (int d = 0; d < hd; d++) dot += q[d] * ref_kv_load(kr, ks, dt, d);
                scratch[j] = a->scale * dot;
                if (scratch[j] > mx) mx = scratch[j];
            }
            float sum = 0.0f;
            for (int j = 0; j < ctx; j++) {
                scratch[j] = expf(scratch[j] - mx);
                sum += scratch[j];
            }
            float *o_h = out + (size_t)t * a->n_heads * hd + (size_t)h * hd;
            for (int d = 0; d < hd; d++) {
                float acc = 0.0f;
                for (int j = 0; j < ctx; j++) {
                    const uint8_t *vr = ref_kv_row(a, a->v_cache, s, j, kvh, &vs);
                    acc += scratch[j] * ref_kv_load(vr, vs, dt, d);
                }
                o_h[d] = acc / sum;
            }
        }
    }
}
