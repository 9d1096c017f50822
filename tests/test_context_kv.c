/*
 * test_context_kv.c — the KV cache's dtype as a context reports it: the
 * engine's dtype by default (f32, f16, bf16 engines of stories260K), what
 * tb_context_options.kv_dtype names otherwise, and a context refused
 * (TB_ERR_INVALID_ARG) for a name that is not auto, f32, f16 or bf16.
 */
#include <stdio.h>

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
    /* dtypes the attention kernels do not store, and words that are none */
    static const char *bad[] = {"i8", "i4", "fp8_e4m3", "i32", "F16", "f16 ", "bogus"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_MSG(kv_of(e, bad[i], &st) == -1 && st == TB_ERR_INVALID_ARG, "kv_dtype '%s' accepted", bad[i]);
    }
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
    return tb_test_finish("test_context_kv");
}
