/*
 * test_context_kv.c — the KV cache's dtype as a context reports it: the
 * engine's dtype by default (f32, f16, bf16 engines of stories260K), what
 * tb_context_options.kv_dtype names otherwise (int8 / i8 and fp8 / fp8_e4m3
 * too), and a context refused (TB_ERR_INVALID_ARG) for a name that is none
 * of those. The KV cache's memory (kv_cache_bytes) holds as many blocks as
 * the dtype's block size allows: int8 and fp8 blocks of stories260K (hd 8)
 * are 8 bytes of codes and a 4-byte f32 scale per token and kv head, so
 * 1 MiB holds 4/3 the blocks of f16 and 8/3 those of f32 (hd 64: 128/68).
 * Where a GPU is present, the CUDA backend takes f16, int8 and fp8 caches
 * too (its attention kernels read int8 / fp8 blocks).
 */
#include <stdio.h>

#include "backend/backend.h"
#include "core/kv_layout.h"
#include "turbine/turbine.h"
#include "tb_test.h"

/* The dtype of a context created with kv_dtype `kv`, or -1 when refused
 * (the status in *st). */
static int kv_of(tb_engine *e, const char *kv, tb_status *st) {
    tb_context_options co;
    tb_context_options_default(&co);
    co.max_seqs = 1;
    co.n_threads = 1;
    co.kv_dtype = kv;
    tb_context *c = NULL;
    *st = tb_context_create(e, &co, &c);
    if (*st != TB_OK) return -1;
    int d = (int)tb_context_kv_dtype(c);
    tb_context_free(c);
    return d;
}

static void check_engine(const char *path, tb_dtype edt) {
    tb_engine *e = tb_test_load_engine(path);
    if (!e) return;
    tb_status st;
    /* the default follows the engine */
    CHECK_MSG(kv_of(e, NULL, &st) == (int)edt, "%s engine: default %d", tb_dtype_name(edt), kv_of(e, NULL, &st));
    CHECK(kv_of(e, "", &st) == (int)edt);
    CHECK(kv_of(e, "auto", &st) == (int)edt);
    /* any of the three on request */
    CHECK(kv_of(e, "f32", &st) == TB_F32);
    CHECK(kv_of(e, "f16", &st) == TB_F16);
    CHECK(kv_of(e, "bf16", &st) == TB_BF16);
    CHECK(kv_of(e, "int8", &st) == TB_I8);
    CHECK(kv_of(e, "i8", &st) == TB_I8);
    CHECK(kv_of(e, "fp8", &st) == TB_FP8_E4M3);
    CHECK(kv_of(e, "fp8_e4m3", &st) == TB_FP8_E4M3);
    /* dtypes the attention kernels do not store, and words that are none */
    static const char *bad[] = {"i4", "int4", "i32", "F16", "f16 ", "INT8", "bogus"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_MSG(kv_of(e, bad[i], &st) == -1 && st == TB_ERR_INVALID_ARG, "kv_dtype '%s' accepted", bad[i]);
    }
    /* blocks in 1 MiB, per dtype: 2 (k, v) * layers * bytes of a block of 16 */
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    static const char *kvs[] = {"f32", "f16", "int8", "fp8"};
    size_t want_block[4];
    int blocks[4];
    for (int i = 0; i < 4; i++) {
        size_t codes = 16 * (size_t)info.n_kv_heads * (size_t)info.head_dim * (i == 0 ? 4 : i == 1 ? 2 : 1);
        if (i >= 2) codes = (codes + 63) / 64 * 64 + ((16 * (size_t)info.n_kv_heads * 4 + 63) / 64 * 64);
        want_block[i] = codes * 2 * (size_t)info.n_layers;
        tb_context_options co;
        tb_context_options_default(&co);
        co.max_seqs = 1;
        co.n_threads = 1;
        co.kv_dtype = kvs[i];
        co.kv_cache_bytes = 1 << 20;
        tb_context *c = NULL;
        blocks[i] = -1;
        if (tb_context_create(e, &co, &c) == TB_OK) {
            blocks[i] = tb_kv_total_blocks(c);
            CHECK(tb_kv_block_size(c) == 16);
            tb_context_free(c);
        }
        CHECK_MSG(blocks[i] == (int)((1u << 20) / want_block[i]), "kv %s: %d blocks in 1 MiB, want %zu", kvs[i],
                  blocks[i], (size_t)((1u << 20) / want_block[i]));
    }
    /* stories260K: n_kv 4, hd 8 -> 16-token blocks of 2048 / 1024 / 768 bytes a layer side */
    CHECK_MSG(blocks[2] == blocks[3] && blocks[2] * 3 >= blocks[1] * 4 - 3 && blocks[2] * 3 >= blocks[0] * 8 - 3,
              "int8 holds %d blocks, f16 %d, f32 %d", blocks[2], blocks[1], blocks[0]);
    tb_engine_free(e);
}

int main(void) {
    char model[1024], tok[1024], engine[1024];
    const char *sh = tb_test_shared(), *tmp = tb_test_tmp();
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", sh);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
    static const tb_dtype dts[] = {TB_F32, TB_F16, TB_BF16};
    for (int i = 0; i < 3; i++) {
        tb_build_options bo;
        tb_build_options_default(&bo);
        bo.tokenizer_path = tok;
        bo.weight_dtype = dts[i];
        snprintf(engine, sizeof engine, "%s/context_kv_%s.engine", tmp, tb_dtype_name(dts[i]));
        if (tb_build(model, engine, &bo, NULL) != TB_OK) {
            CHECK_MSG(0, "build %s: %s", tb_dtype_name(dts[i]), tb_last_error());
            continue;
        }
        check_engine(engine, dts[i]);
    }
    /* on a machine with a GPU: the CUDA backend's contexts take f16, int8
     * and fp8 caches */
    uint64_t total = 0, avail = 0;
    if (tb_backend_memory("cuda", &total, &avail) == TB_OK) {
        tb_build_options bo;
        tb_build_options_default(&bo);
        bo.tokenizer_path = tok;
        bo.weight_dtype = TB_F16;
        bo.device = "cuda";
        snprintf(engine, sizeof engine, "%s/context_kv_cuda.engine", tmp);
        tb_engine *e = NULL;
        if (tb_build(model, engine, &bo, NULL) == TB_OK && (e = tb_test_load_engine(engine))) {
            tb_status st;
            CHECK(kv_of(e, "f16", &st) == TB_F16);
            CHECK_MSG(kv_of(e, "int8", &st) == TB_I8, "cuda with an int8 cache: %d, '%s'", (int)st, tb_last_error());
            CHECK_MSG(kv_of(e, "fp8", &st) == TB_FP8_E4M3, "cuda with an fp8 cache: %d, '%s'", (int)st,
                      tb_last_error());
            tb_engine_free(e);
        } else {
            CHECK_MSG(0, "build for cuda: %s", tb_last_error());
        }
    } else {
        printf("no CUDA device: the cuda backend's int8/fp8 caches are not checked here\n");
    }
    return tb_test_finish("test_context_kv");
}
