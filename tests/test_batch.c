/*
 * test_batch.c — decoding several sequences in one flattened batch gives the
 * same logits as decoding each alone, including a batch that mixes one
 * sequence's prefill with the others' decode steps; and the KV cache returns
 * every block when sequences are reset.
 *
 * Engines: stories260K f32; a random qwen2 checkpoint in f32, f16 and the
 * quantized dtypes int8, int4 (group 32, whole groups in every matmul but
 * the head, int8 as int4 engines make it) and fp8.
 *
 * TURBINE_TEST_DEVICE (default "cpu") picks the device the engines are built
 * for and run on, e.g. "cuda" on a GPU machine; TURBINE_PYTHON (default
 * /usr/bin/python3) runs gen_checkpoints.py; TURBINE_TEST_BATCH_ENGINES
 * "float" runs only the f32/f16 engines, "quant" only the quantized ones
 * (bench/gpu/run.sh reports them apart), anything else all of them.
 * TURBINE_TEST_FP8_TOL replaces the fp8 engine's bound: on a GPU its steps
 * of >= 9 tokens take the FP8 tensor cores with x rounded to e4m3 (the
 * batched prompts among them, the lone short ones not), so run.sh checks
 * it at the f16 bound with that path off and again on it at the bound for
 * e4m3 activations. The first batched step has a 32-token prompt between
 * short ones: on a GPU the long run takes the prefill kernel and the short
 * runs after it the decode kernel at a token offset.
 */
#include <math.h>

#include "runtime/runtime.h"
#include "tb_test.h"
#include "turbine/turbine.h"

/* 12 sequences: the batched decode steps have more tokens than the GEMV
 * path's 8 (the matmul GEMMs, and on a GPU steps captured with them) */
#define NSEQ 12
#define NGEN 16

static void check_engine(const char *engine_path, float tol) {
    tb_engine *e = tb_test_load_engine(engine_path);
    if (!e) return;
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    int V = info.vocab_size;
    tb_context_options o;
    tb_context_options_default(&o);
    o.max_seqs = NSEQ;
    o.n_threads = 2;
    o.device = getenv("TURBINE_TEST_DEVICE");
    tb_context *c = NULL;
    CHECK(tb_context_create(e, &o, &c) == TB_OK);
    if (!c) { tb_engine_free(e); return; }
    int total_blocks = tb_kv_total_blocks(c);
    int plen[NSEQ] = {7, 32, 1, 19, 5, 9, 3, 11, 2, 8, 4, 6};
    int32_t toks[NSEQ][64];
    for (int s = 0; s < NSEQ; s++)
        for (int j = 0; j < plen[s]; j++) toks[s][j] = 3 + (s * 37 + j * 11) % (V - 3);
    /* logits of the last prompt token + NGEN decode steps, per sequence */
    static float alone[NSEQ][NGEN + 1][32000];
    TB_ASSERT(V <= 32000);
    const float *lg;
    int rows;
    for (int s = 0; s < NSEQ; s++) {
        CHECK(tb_seq_reset(c, 0) == TB_OK);
        tb_seq_chunk ch = {0, plen[s], toks[s], 1};
        CHECK(tb_context_step(c, &ch, 1, &lg, &rows) == TB_OK && rows == 1);
        memcpy(alone[s][0], lg, sizeof(float) * (size_t)V);
        for (int g = 0; g < NGEN; g++) {
            toks[s][plen[s] + g] = tb_test_argmax(alone[s][g], V);
            tb_seq_chunk d = {0, 1, &toks[s][plen[s] + g], 1};
            CHECK(tb_context_step(c, &d, 1, &lg, &rows) == TB_OK);
            memcpy(alone[s][g + 1], lg, sizeof(float) * (size_t)V);
        }
    }
    CHECK(tb_seq_reset(c, 0) == TB_OK);
    CHECK(tb_kv_free_blocks(c) == total_blocks);

    /* batched: sequence 3 starts two steps late, so its prefill shares a step
     * with the others' decode tokens */
    int done[NSEQ] = {0}; /* steps completed: 0 = prefill pending */
    float worst = 0;
    for (int step = 0; step < NGEN + 3; step++) {
        tb_seq_chunk ch[NSEQ];
        int map[NSEQ], n = 0;
        for (int s = 0; s < NSEQ; s++) {
            if (s == 3 && step < 2) continue;
            if (done[s] > NGEN) continue;
            if (done[s] == 0) ch[n] = (tb_seq_chunk){s, plen[s], toks[s], 1};
            else ch[n] = (tb_seq_chunk){s, 1, &toks[s][plen[s] + done[s] - 1], 1};
            map[n++] = s;
        }
        if (n == 0) break;
        CHECK(tb_context_step(c, ch, n, &lg, &rows) == TB_OK && rows == n);
        for (int k = 0; k < n; k++) {
            int s = map[k];
            float r = tb_test_max_rel(lg + (size_t)k * V, alone[s][done[s]], V);
            if (r > worst) worst = r;
            done[s]++;
        }
    }
    printf("%s: batched vs alone max rel err %.3g (tol %.g)\n", engine_path, worst, tol);
    CHECK_MSG(worst <= tol, "batched logits differ from unbatched: %g", worst);
    for (int s = 0; s < NSEQ; s++) CHECK(done[s] == NGEN + 1);

    /* errors: a step past the profile, an unknown slot, a bad token */
    int32_t big[1024] = {0};
    tb_seq_chunk bad = {0, 1000, big, 1};
    CHECK(tb_context_step(c, &bad, 1, &lg, &rows) == TB_ERR_RANGE);
    bad = (tb_seq_chunk){NSEQ, 1, big, 1};
    CHECK(tb_context_step(c, &bad, 1, &lg, &rows) == TB_ERR_INVALID_ARG);
    int32_t oov = V;
    bad = (tb_seq_chunk){0, 1, &oov, 1};
    CHECK(tb_context_step(c, &bad, 1, &lg, &rows) == TB_ERR_INVALID_ARG);
    for (int s = 0; s < NSEQ; s++) tb_seq_reset(c, s);
    CHECK(tb_kv_free_blocks(c) == total_blocks);
    tb_context_free(c);
    tb_engine_free(e);
}

int main(void) {
    char model[1024], tok[1024], engine[1024], cmd[4096];
    const char *sh = tb_test_shared(), *tmp = tb_test_tmp();
    const char *which = getenv("TURBINE_TEST_BATCH_ENGINES");
    int run_float = !which || strcmp(which, "quant") != 0, run_quant = !which || strcmp(which, "float") != 0;
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", sh);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
    snprintf(engine, sizeof engine, "%s/batch_stories.engine", tmp);
    tb_build_options bo;
    tb_build_options_default(&bo);
    bo.tokenizer_path = tok;
    bo.device = getenv("TURBINE_TEST_DEVICE");
    bo.max_batch = NSEQ;
    if (run_float) {
        CHECK_MSG(tb_build(model, engine, &bo, NULL) == TB_OK, "%s", tb_last_error());
        check_engine(engine, 1e-5f);
    }

    /* a random GQA checkpoint with q/k/v biases, f32 and f16 engines */
    const char *src = getenv("TURBINE_SRC");
    snprintf(model, sizeof model, "%s/ckpt_batch_qwen2", tmp);
    const char *py = getenv("TURBINE_PYTHON");
    snprintf(cmd, sizeof cmd, "%s %s/tests/gen_checkpoints.py --preset qwen2 --dtype f32 --out %s >/dev/null",
             py && *py ? py : "/usr/bin/python3", src ? src : ".", model);
    CHECK(system(cmd) == 0);
    if (run_float) {
        snprintf(engine, sizeof engine, "%s/batch_qwen2.engine", tmp);
        CHECK_MSG(tb_build(model, engine, &bo, NULL) == TB_OK, "%s", tb_last_error());
        check_engine(engine, 1e-5f);
        bo.weight_dtype = TB_F16;
        snprintf(engine, sizeof engine, "%s/batch_qwen2_f16.engine", tmp);
        CHECK_MSG(tb_build(model, engine, &bo, NULL) == TB_OK, "%s", tb_last_error());
        check_engine(engine, 1e-3f);
    }
    /* Quantized engines: the 12-token batched steps take the quantized
     * matmuls' prefill path (on a GPU: dequantised to f16 for cuBLAS) where
     * the single sequences' steps take the decode kernels (on a GPU: the
     * GEMV on the codes), so the bound is the f16 engine's doubled. */
    if (run_quant) {
        static const struct { tb_dtype dt; int group; const char *name; } q[] = {
            {TB_I8, 0, "int8"}, {TB_I4, 32, "int4_g32"}, {TB_FP8_E4M3, 0, "fp8"}};
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
            bo.weight_dtype = q[i].dt;
            bo.group_size = q[i].group;
            snprintf(engine, sizeof engine, "%s/batch_qwen2_%s.engine", tmp, q[i].name);
            CHECK_MSG(tb_build(model, engine, &bo, NULL) == TB_OK, "%s: %s", q[i].name, tb_last_error());
            const char *ft = getenv("TURBINE_TEST_FP8_TOL");
            check_engine(engine, q[i].dt == TB_FP8_E4M3 && ft && *ft ? (float)atof(ft) : 2e-3f);
        }
    }
    return tb_test_finish("test_batch");
}
