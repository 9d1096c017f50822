/*
 * test_attn_split.c — the position split of a one-token decode step
 * (tb_cpu_attention on several threads: each thread attends over its own
 * range of cache blocks, the partial softmax results merged per head).
 *
 * For every SIMD path this CPU runs, pools of 2 and 3 threads, and every KV
 * dtype (f32, f16, bf16, int8, fp8 e4m3), with the split forced on:
 *   - tb_cpu_attention_split says the step is split (so the cases below run
 *     the split, not the heads split) whenever the context has 2 blocks;
 *   - the output agrees with tb_ref_attention within 2e-5 of its largest
 *     magnitude (the same cached values, summed in another order) and the
 *     step's cache writes are the same bytes, for contexts of 1, 2, 3, 17
 *     and 600 positions (a thread with no blocks; ranges ending inside a
 *     block), block sizes 1, 5 and 16, GQA groups 1, 3, 4 and 8, head sizes
 *     8, 36 (the per-head path), 64 and 128;
 * and with the split forced off, the same cases still agree (the heads
 * split). In the automatic mode, a 134M-shaped decode at position 599 on 2
 * threads takes the split, and one at position 20 does not.
 */
#include "backend/cpu/kernels.h"
#include "core/kv_layout.h"
#include "tb_test.h"

#include <math.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { return tb_test_frand(&rng); } /* uniform in [-1, 1) */

static const char *cur_path = "?";
static int cur_threads;
static double worst;

/* A pool of n_blocks blocks of random history in dtype dt. */
static void fill_cache(uint8_t *cache, tb_dtype dt, int n_blocks, int bs, int n_kv, int hd) {
    size_t blkb = tb_kv_block_bytes(dt, bs, n_kv, hd), cb = tb_kv_codes_bytes(dt, bs, n_kv, hd);
    size_t esz = tb_kv_elem_bytes(dt);
    float x[256];
    memset(cache, 0, blkb * (size_t)n_blocks);
    for (int b = 0; b < n_blocks; b++)
        for (int r = 0; r < bs; r++)
            for (int h = 0; h < n_kv; h++) {
                for (int d = 0; d < hd; d++) x[d] = frand();
                uint8_t *row = cache + (size_t)b * blkb + ((size_t)r * n_kv + h) * hd * esz;
                if (tb_kv_quantized(dt))
                    tb_ref_kv_quantize(x, hd, dt, row, (float *)(cache + (size_t)b * blkb + cb) + (size_t)r * n_kv + h);
                else
                    tb_convert(x, TB_F32, row, dt, (size_t)hd);
            }
}

static void test_case(tb_pool *p, int ctx, int n_heads, int n_kv, int hd, int bs, int max_ctx, tb_dtype dt,
                      int split) {
    int max_blocks = (max_ctx + bs - 1) / bs, n_blocks = max_blocks + 3;
    int stride = (n_heads + 2 * n_kv) * hd, nth = tb_pool_size(p);
    size_t bytes = tb_kv_block_bytes(dt, bs, n_kv, hd) * (size_t)n_blocks;
    int32_t *tables = tb_test_xmalloc(sizeof(int32_t) * (size_t)max_blocks);
    tb_test_block_tables(&rng, n_blocks, 1, max_blocks, tables); /* scattered over the pool */
    uint8_t *kc = tb_test_xmalloc(bytes), *vc = tb_test_xmalloc(bytes);
    uint8_t *kr = tb_test_xmalloc(bytes), *vr = tb_test_xmalloc(bytes);
    fill_cache(kc, dt, n_blocks, bs, n_kv, hd);
    fill_cache(vc, dt, n_blocks, bs, n_kv, hd);
    memcpy(kr, kc, bytes);
    memcpy(vr, vc, bytes);

    float *qkv = tb_test_xmalloc((size_t)stride * 4);
    for (int i = 0; i < stride; i++) qkv[i] = 2.0f * frand();
    size_t on = (size_t)n_heads * hd;
    float *out = tb_test_xmalloc(on * 4), *outr = tb_test_xmalloc(on * 4);
    float *scratch = tb_test_xmalloc(tb_attention_scratch_floats(nth, max_ctx) * 4);
    int32_t pos = ctx - 1, seq = 0;

    tb_attn_args a = {1, n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), &pos, &seq, tables, max_blocks, bs, kr, vr, dt};
    tb_ref_attention(&a, qkv, outr, scratch);
    a.k_cache = kc;
    a.v_cache = vc;
    tb_cpu_attention_force_split(split);
    int taken = tb_cpu_attention_split(&a, nth, max_ctx);
    int want = split && nth > 1 && ctx > bs;
    CHECK_MSG(taken == want, "[%s, %d threads] split forced %d, ctx %d bs %d: split %d, expected %d", cur_path, nth,
              split, ctx, bs, taken, want);
    tb_cpu_attention(p, &a, qkv, out, scratch, max_ctx);
    tb_cpu_attention_force_split(-1);

    CHECK_MSG(memcmp(kc, kr, bytes) == 0 && memcmp(vc, vr, bytes) == 0,
              "[%s, %d threads] %s cache write differs (ctx=%d heads=%d kv=%d hd=%d bs=%d)", cur_path, nth,
              tb_dtype_name(dt), ctx, n_heads, n_kv, hd, bs);
    double e = tb_test_rel_err(out, outr, on, 0.1);
    if (e > worst) worst = e;
    if (getenv("TB_TEST_VERBOSE"))
        printf("  %s split=%d ctx=%d heads=%d kv=%d hd=%d bs=%d: %.2e\n", tb_dtype_name(dt), split, ctx, n_heads, n_kv,
               hd, bs, e);
    CHECK_MSG(e <= 2e-5, "[%s, %d threads] %s split=%d ctx=%d heads=%d kv=%d hd=%d bs=%d: err %.3g vs the reference",
              cur_path, nth, tb_dtype_name(dt), split, ctx, n_heads, n_kv, hd, bs, e);
    free(tables); free(kc); free(vc); free(kr); free(vr); free(qkv); free(out); free(outr); free(scratch);
}

static void test_pool(tb_pool *p) {
    static const tb_dtype dts[] = {TB_F32, TB_F16, TB_BF16, TB_I8, TB_FP8_E4M3};
    static const int ctxs[] = {1, 2, 3, 17, 600};
    /* heads, kv heads, head size, block size, max_ctx (the scratch holds
     * the partial results of the 7B-like shape from 2048 on) */
    static const int shapes[][5] = {
        {12, 12, 64, 16, 640}, /* 134M */
        {12, 4, 64, 5, 640},   /* GQA 3 */
        {8, 4, 8, 1, 640},     /* stories260K-like: hd 8, a block per position */
        {32, 8, 128, 16, 2048}, /* 7B-like GQA 4 */
        {8, 1, 36, 5, 640},    /* hd % 8 != 0: the per-head path; GQA 8 */
    };
    for (int d = 0; d < 5; d++)
        for (int s = 0; s < 5; s++)
            for (int c = 0; c < 5; c++)
                for (int split = 1; split >= 0; split--)
                    test_case(p, ctxs[c], shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], dts[d],
                              split);
}

static void run_path(tb_pool *p, const char *path, int threads) {
    cur_path = path;
    cur_threads = threads;
    if (threads < 2) return; /* one thread never splits (checked by test_case's expectation on 2 and 3) */
    worst = 0;
    int before = tb_test_failures;
    test_pool(p);
    tb_pool *p3 = NULL;
    CHECK(tb_pool_create(3, &p3) == TB_OK);
    if (p3) {
        test_pool(p3);
        tb_pool_free(p3);
    }
    printf("path %-6s threads 2, 3: worst err vs reference %.2e, %s\n", path, worst,
           tb_test_failures == before ? "ok" : "FAILED");
}

/* The automatic choice: a long decode of the 134M shape splits on 2
 * threads, a short one, a prefill chunk and one thread do not. */
static void test_auto(void) {
    int32_t tables[40], pos = 599, seq[2] = {0, 0}, pos2[2] = {10, 11};
    for (int i = 0; i < 40; i++) tables[i] = i;
    tb_attn_args a = {1, 12, 12, 64, 0.125f, &pos, seq, tables, 40, 16, NULL, NULL, TB_F16};
    tb_cpu_attention_force_split(-1);
    CHECK_MSG(tb_cpu_attention_split(&a, 2, 640) == 1, "auto: 134M decode at 599 on 2 threads not split");
    CHECK_MSG(tb_cpu_attention_split(&a, 1, 640) == 0, "auto: split on 1 thread");
    pos = 20;
    CHECK_MSG(tb_cpu_attention_split(&a, 2, 640) == 0, "auto: 134M decode at 20 split");
    a.T = 2;
    a.pos = pos2;
    CHECK_MSG(tb_cpu_attention_split(&a, 2, 640) == 0, "auto: a 2-token chunk split");
}

int main(void) {
    test_auto();
    tb_test_each_kernel_path(run_path);
    return tb_test_finish("test_attn_split");
}
