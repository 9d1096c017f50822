/*
 * test_warmup.c — tb_context_warmup (turbine serve's LLM warm-up) leaves
 * the context as it found it: the stories260K engine, one context warmed
 * with decode batches of 1..max and one not, then the same work on both:
 * every slot empty (length 0), every KV block free, no cached block, the
 * step count max; a batch of prompts prefilled and decoded greedily for 24
 * steps gives the same tokens and the same logits (bit for bit on a CPU,
 * 1e-3 on a GPU whose graphs and GEMM picks may differ) on both. A warm-up
 * with a slot in use is refused (TB_ERR_INVALID_ARG) and changes nothing;
 * max_n above max_seqs or the free blocks is cut to them.
 * TURBINE_TEST_DEVICE (default "cpu") picks the device ("cuda" on a GPU).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kv_layout.h"
#include "runtime/runtime.h"
#include "turbine/turbine.h"
#include "tb_test.h"

#define NSEQ 6
#define STEPS 24

static tb_context *make_ctx(tb_engine *e, size_t kv_bytes) {
    tb_context_options o;
    tb_context_options_default(&o);
    o.max_seqs = NSEQ;
    o.n_threads = 1;
    o.kv_cache_bytes = kv_bytes;
    o.device = getenv("TURBINE_TEST_DEVICE");
    tb_context *c = NULL;
    CHECK_MSG(tb_context_create(e, &o, &c) == TB_OK, "context: %s", tb_last_error());
    return c;
}

/* Prompts of different lengths for slots 0..NSEQ-1, prefilled in one step,
 * then STEPS greedy decode steps of every slot; tokens[s][t], logits of the
 * last step in `last` ([NSEQ, V]). */
static int run_work(tb_context *c, int V, int32_t tokens[NSEQ][STEPS], float *last) {
    int32_t prompts[NSEQ][20];
    tb_seq_chunk ch[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        for (int j = 0; j < 20; j++) prompts[s][j] = (int32_t)((7 + 13 * s + 31 * j) % V);
        ch[s] = (tb_seq_chunk){.seq = s, .n_tokens = 5 + 3 * s, .tokens = prompts[s], .logits = 1};
    }
    int32_t cur[NSEQ];
    for (int t = 0; t < STEPS; t++) {
        const float *lg = NULL;
        int rows = 0;
        if (tb_context_step(c, ch, NSEQ, &lg, &rows) != TB_OK || rows != NSEQ) {
            CHECK_MSG(0, "step %d: %s", t, tb_last_error());
            return -1;
        }
        for (int s = 0; s < NSEQ; s++) {
            const float *row = lg + (size_t)s * (size_t)V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            tokens[s][t] = cur[s] = best;
            if (t == STEPS - 1) memcpy(last + (size_t)s * (size_t)V, row, sizeof(float) * (size_t)V);
            ch[s] = (tb_seq_chunk){.seq = s, .n_tokens = 1, .tokens = &cur[s], .logits = 1};
        }
    }
    return 0;
}

static void check_empty(tb_context *c, const char *when) {
    for (int s = 0; s < NSEQ; s++) CHECK_MSG(tb_seq_len(c, s) == 0, "%s: slot %d holds %d tokens", when, s, tb_seq_len(c, s));
    CHECK_MSG(tb_kv_free_blocks(c) == tb_kv_total_blocks(c), "%s: %d of %d blocks free", when, tb_kv_free_blocks(c),
              tb_kv_total_blocks(c));
    CHECK_MSG(tb_kv_cached_blocks(c) == 0, "%s: %d cached blocks", when, tb_kv_cached_blocks(c));
}

int main(void) {
    char model[1024], tok[1024], engine[1024];
    const char *sh = tb_test_shared(), *tmp = tb_test_tmp();
    const char *dev = getenv("TURBINE_TEST_DEVICE");
    int gpu = dev && !strncmp(dev, "cuda", 4);
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", sh);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
    tb_build_options bo;
    tb_build_options_default(&bo);
    bo.tokenizer_path = tok;
    bo.device = dev;
    bo.max_batch = NSEQ;
    snprintf(engine, sizeof engine, "%s/warmup_%s.engine", tmp, gpu ? "cuda" : "cpu");
    if (tb_build(model, engine, &bo, NULL) != TB_OK) {
        CHECK_MSG(0, "build: %s", tb_last_error());
        return tb_test_finish("test_warmup");
    }
    tb_engine *e = tb_test_load_engine(engine);
    if (!e) return tb_test_finish("test_warmup");
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    int V = info.vocab_size;

    tb_context *cold = make_ctx(e, 0), *warm = make_ctx(e, 0);
    if (!cold || !warm) return tb_test_finish("test_warmup");
    int steps = -1;
    CHECK_MSG(tb_context_warmup(warm, 0, &steps) == TB_OK, "warm-up: %s", tb_last_error());
    CHECK_MSG(steps == NSEQ, "warm-up of max_n 0: %d steps, want %d (max_seqs)", steps, NSEQ);
    check_empty(warm, "after the warm-up");
    CHECK(tb_context_warmup(warm, 100, &steps) == TB_OK && steps == NSEQ); /* cut to max_seqs */
    CHECK(tb_context_warmup(warm, 3, &steps) == TB_OK && steps == 3);
    check_empty(warm, "after three warm-ups");

    int32_t tc[NSEQ][STEPS], tw[NSEQ][STEPS];
    float *lc = malloc(sizeof(float) * NSEQ * (size_t)V), *lw = malloc(sizeof(float) * NSEQ * (size_t)V);
    if (!lc || !lw) return 1;
    if (run_work(cold, V, tc, lc) == 0 && run_work(warm, V, tw, lw) == 0) {
        CHECK_MSG(!memcmp(tc, tw, sizeof tc), "greedy tokens differ after a warm-up");
        double worst = 0;
        for (size_t i = 0; i < (size_t)NSEQ * (size_t)V; i++) {
            double d = fabs((double)lc[i] - (double)lw[i]);
            if (d > worst) worst = d;
        }
        CHECK_MSG(gpu ? worst <= 1e-3 : worst == 0, "last logits differ by %g after a warm-up", worst);
    }
    /* a slot in use: refused, nothing run, the slot kept */
    int len2 = tb_seq_len(warm, 2);
    CHECK(len2 > 0);
    tb_status st = tb_context_warmup(warm, 0, &steps);
    CHECK_MSG(st == TB_ERR_INVALID_ARG && steps == 0 && strstr(tb_last_error(), "in use"),
              "warm-up over a busy slot: %d, %d steps, '%s'", (int)st, steps, tb_last_error());
    CHECK(tb_seq_len(warm, 2) == len2);
    tb_dtype kvd = tb_context_kv_dtype(cold);
    tb_context_free(cold);
    tb_context_free(warm);

    /* a KV pool of 3 blocks: the warm-up's batches stop at 3 sequences */
    size_t block = (size_t)(16 * tb_kv_bytes_per_token(kvd, 16, info.n_kv_heads, info.head_dim, info.n_layers) + 0.5);
    tb_context *small = make_ctx(e, 3 * block);
    if (small) {
        CHECK_MSG(tb_kv_total_blocks(small) == 3, "pool of %d blocks", tb_kv_total_blocks(small));
        CHECK(tb_context_warmup(small, 0, &steps) == TB_OK && steps == 3);
        CHECK(tb_kv_free_blocks(small) == 3);
        tb_context_free(small);
    }
    free(lc);
    free(lw);
    tb_engine_free(e);
    return tb_test_finish("test_warmup");
}
