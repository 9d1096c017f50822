/*
 * test_prefix_cache.c — KV reuse across sequences.
 *
 * 1. The block pool alone (kv_blocks.h), against a shadow model under random
 *    traffic from a small alphabet (prefixes collide, the key table wraps and
 *    deletes): a match returns exactly the longest published prefix, every
 *    matched block holds that prefix, and the counts add up.
 * 2. A context: a sequence that takes a cached prefix gives the same logits
 *    (prompt tail and greedy decode) as one that computed everything, also
 *    while the sequence that wrote the blocks still runs beside it; a prefix
 *    that differs inside block k reuses k blocks; the last token is always
 *    computed; evicted blocks are not matched; with no_prefix_cache nothing
 *    is reused; every block comes back after resets. The f32 engine runs
 *    this with an int8 KV cache too (codes and scales in each block: a
 *    shared block carries its scales along).
 *
 * TURBINE_TEST_DEVICE (default "cpu") picks the device, as in test_batch.
 */
#include <math.h>

#include "core/kv_layout.h"
#include "runtime/kv_blocks.h"
#include "runtime/runtime.h"
#include "tb_test.h"
#include "turbine/turbine.h"

/* ---------------------------------------------------------------- pool vs shadow */

#define PB 12 /* blocks */
#define PS 4  /* tokens per block */
#define PMAXB 8

/* shadow: what each block holds when published, as the whole prefix */
static int sh_pub[PB], sh_len[PB];
static int32_t sh_pre[PB][PMAXB * PS];

static int shadow_find(const int32_t *t, int len) {
    for (int b = 0; b < PB; b++)
        if (sh_pub[b] && sh_len[b] == len && !memcmp(sh_pre[b], t, sizeof(int32_t) * (size_t)len)) return b;
    return -1;
}

static void test_pool(void) {
    tb_kv_pool *p = NULL;
    CHECK(tb_kv_pool_create(PB, PS, 1, &p) == TB_OK);
    if (!p) return;
    uint64_t rng = 12345;
    int held = 0, matched_total = 0, evicted = 0;
    for (int it = 0; it < 4000; it++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int nb = 1 + (int)((rng >> 33) % 5); /* 1..5 blocks */
        int32_t t[PMAXB * PS];
        for (int j = 0; j < nb * PS; j++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            t[j] = (int32_t)((rng >> 40) % 2); /* two symbols: many shared prefixes */
        }
        /* expected: the longest chain of published prefixes */
        int want = 0;
        while (want < nb - 1 && shadow_find(t, (want + 1) * PS) >= 0) want++;
        int32_t bl[PMAXB];
        uint64_t key;
        int n = tb_kv_pool_match(p, t, nb - 1, bl, &key);
        CHECK_MSG(n == want, "iteration %d: matched %d blocks, the shadow has %d", it, n, want);
        for (int j = 0; j < n; j++) {
            CHECK(sh_pub[bl[j]] && sh_len[bl[j]] == (j + 1) * PS &&
                  !memcmp(sh_pre[bl[j]], t, sizeof(int32_t) * (size_t)(j + 1) * PS));
        }
        matched_total += n;
        /* the rest: new blocks (an evicted one leaves the shadow), then publish */
        int ok = 1;
        for (int j = n; j < nb; j++) {
            int32_t b = tb_kv_pool_take(p);
            if (b < 0) { ok = 0; nb = j; break; }
            evicted += sh_pub[b];
            sh_pub[b] = 0;
            bl[j] = b;
        }
        held = nb;
        CHECK(tb_kv_pool_available(p) + held == PB || !ok);
        for (int j = n; j < nb; j++) {
            uint64_t k2 = tb_kv_pool_publish(p, bl[j], key, t + j * PS);
            CHECK(k2 == tb_kv_pool_key(p, key, t + j * PS));
            key = k2;
            if (shadow_find(t, (j + 1) * PS) < 0) {
                sh_pub[bl[j]] = 1;
                sh_len[bl[j]] = (j + 1) * PS;
                memcpy(sh_pre[bl[j]], t, sizeof(int32_t) * (size_t)(j + 1) * PS);
            }
        }
        /* release in order: older blocks leave the idle list first */
        for (int j = 0; j < nb; j++) tb_kv_pool_release(p, bl[j]);
        held = 0;
        CHECK(tb_kv_pool_available(p) == PB);
        int pub = 0;
        for (int b = 0; b < PB; b++) pub += sh_pub[b];
        CHECK_MSG(tb_kv_pool_idle_cached(p) == pub, "idle cached %d, shadow published %d",
                  tb_kv_pool_idle_cached(p), pub);
    }
    printf("pool: 4000 random sequences, %d blocks reused, %d evicted\n", matched_total, evicted);
    CHECK(matched_total > 200 && evicted > 200); /* the traffic exercised both */
    tb_kv_pool_free(p);

    /* caching off: nothing is published or matched */
    CHECK(tb_kv_pool_create(4, PS, 0, &p) == TB_OK);
    int32_t t[PS] = {1, 2, 3, 4}, bl[1];
    uint64_t key;
    int32_t b = tb_kv_pool_take(p);
    tb_kv_pool_publish(p, b, 0, t);
    tb_kv_pool_release(p, b);
    CHECK(tb_kv_pool_match(p, t, 1, bl, &key) == 0 && tb_kv_pool_idle_cached(p) == 0);
    tb_kv_pool_free(p);
}

/* ---------------------------------------------------------------- context */

#define NDEC 8
#define MAXV 512

/* Runs `n` prompt tokens on slot s from its current length, then NDEC greedy
 * steps; out: (NDEC + 1, V) logits of the last prompt token and each step. */
static int run_seq(tb_context *c, int s, const int32_t *prompt, int n, int V, float *out) {
    const float *lg;
    int rows;
    int from = tb_seq_len(c, s);
    tb_seq_chunk ch = {s, n - from, prompt + from, 1};
    if (tb_context_step(c, &ch, 1, &lg, &rows) != TB_OK || rows != 1) return 0;
    memcpy(out, lg, sizeof(float) * (size_t)V);
    for (int k = 0; k < NDEC; k++) {
        int32_t t = tb_test_argmax(out + (size_t)k * V, V);
        ch = (tb_seq_chunk){s, 1, &t, 1};
        if (tb_context_step(c, &ch, 1, &lg, &rows) != TB_OK || rows != 1) return 0;
        memcpy(out + (size_t)(k + 1) * V, lg, sizeof(float) * (size_t)V);
    }
    return 1;
}

static float cmp_runs(const float *a, const float *b, int V) {
    float w = 0;
    for (int k = 0; k <= NDEC; k++) {
        float r = tb_test_max_rel(a + (size_t)k * V, b + (size_t)k * V, V);
        if (r > w) w = r;
        CHECK(tb_test_argmax(a + (size_t)k * V, V) == tb_test_argmax(b + (size_t)k * V, V));
    }
    return w;
}

static void test_context(const char *engine_path, const char *kv_dtype) {
    tb_engine *e = tb_test_load_engine(engine_path);
    if (!e) return;
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    int V = info.vocab_size;
    TB_ASSERT(V <= MAXV);
    tb_context_options o;
    tb_context_options_default(&o);
    o.max_seqs = 4;
    o.n_threads = 2;
    o.device = getenv("TURBINE_TEST_DEVICE");
    o.kv_dtype = kv_dtype;
    /* 16 blocks of 16 tokens: small enough to evict */
    tb_dtype kdt = kv_dtype ? TB_I8 : info.weight_dtype == TB_F32 ? TB_F32 : TB_F16;
    size_t per_block = tb_kv_block_bytes(kdt, 16, info.n_kv_heads, info.head_dim) * 2 * (size_t)info.n_layers;
    o.kv_cache_bytes = 16 * per_block;
    tb_context *c = NULL;
    CHECK_MSG(tb_context_create(e, &o, &c) == TB_OK, "%s", tb_last_error());
    if (!c) { tb_engine_free(e); return; }
    int bs = tb_kv_block_size(c), total = tb_kv_total_blocks(c);
    CHECK(bs == 16 && total == 16);
    static float ref[NDEC + 1][MAXV], got[NDEC + 1][MAXV], ref2[NDEC + 1][MAXV], got2[NDEC + 1][MAXV];
    int32_t P[70], P2[70], Q[240];
    for (int j = 0; j < 70; j++) P[j] = 3 + (j * 37 + 5) % (V - 3);
    memcpy(P2, P, sizeof P);
    for (int j = 64; j < 70; j++) P2[j] = 3 + (j * 11 + 1) % (V - 3); /* same 64, another tail */
    for (int j = 0; j < 240; j++) Q[j] = 3 + (j * 53 + 17) % (V - 3);
    float worst = 0;

    /* references, computed in full */
    CHECK(run_seq(c, 0, P, 70, V, &ref[0][0]));
    CHECK(run_seq(c, 1, P2, 70, V, &ref2[0][0]));
    tb_seq_reset(c, 0);
    tb_seq_reset(c, 1);
    /* P's 4 full blocks (78 tokens) and P2's tail beyond them are idle; P2's first 4 were P's */
    CHECK_MSG(tb_kv_cached_blocks(c) == 4, "cached %d", tb_kv_cached_blocks(c));
    CHECK(tb_kv_free_blocks(c) == total);

    /* takes 64 of 70 tokens, runs the tail: same logits */
    CHECK(tb_seq_reuse_prefix(c, 2, P, 70) == 64 && tb_seq_len(c, 2) == 64);
    CHECK(tb_kv_cached_blocks(c) == 0);
    CHECK(run_seq(c, 2, P, 70, V, &got[0][0]));
    float w = cmp_runs(&got[0][0], &ref[0][0], V);
    if (w > worst) worst = w;
    /* slot 2 still runs: slot 3 shares its first 4 blocks and writes its own tail */
    CHECK(tb_seq_reuse_prefix(c, 3, P2, 70) == 64);
    CHECK(run_seq(c, 3, P2, 70, V, &got2[0][0]));
    w = cmp_runs(&got2[0][0], &ref2[0][0], V);
    if (w > worst) worst = w;
    /* and slot 2's blocks were not touched by slot 3: one more step of each, batched */
    {
        int32_t t2 = tb_test_argmax(got[NDEC], V), t3 = tb_test_argmax(got2[NDEC], V);
        tb_seq_chunk ch[2] = {{2, 1, &t2, 1}, {3, 1, &t3, 1}};
        const float *lg;
        int rows;
        CHECK(tb_context_step(c, ch, 2, &lg, &rows) == TB_OK && rows == 2);
        /* the same step on fresh copies of both sequences */
        static float both[2][MAXV];
        if (rows == 2) memcpy(both, lg, sizeof both);
        tb_seq_reset(c, 0);
        tb_seq_reset(c, 1);
        int32_t h0[80], h1[80];
        memcpy(h0, P, sizeof P);
        memcpy(h1, P2, sizeof P2);
        for (int k = 0; k < NDEC; k++) {
            h0[70 + k] = tb_test_argmax(got[k], V);
            h1[70 + k] = tb_test_argmax(got2[k], V);
        }
        h0[78] = t2;
        h1[78] = t3;
        tb_seq_chunk f[2] = {{0, 79, h0, 1}, {1, 79, h1, 1}};
        CHECK(tb_context_step(c, f, 2, &lg, &rows) == TB_OK && rows == 2);
        if (rows == 2) {
            w = tb_test_max_rel(both[0], lg, V);
            float w2 = tb_test_max_rel(both[1], lg + V, V);
            if (w2 > w) w = w2;
            if (w > worst) worst = w;
        }
    }
    for (int s = 0; s < 4; s++) tb_seq_reset(c, s);
    CHECK(tb_kv_free_blocks(c) == total);

    /* a prefix that differs inside block 1 reuses block 0 only */
    int32_t D[70];
    memcpy(D, P, sizeof P);
    D[20] = D[20] == 3 ? 4 : 3;
    CHECK(tb_seq_reuse_prefix(c, 0, D, 70) == 16);
    tb_seq_reset(c, 0);
    /* exactly 64 known tokens: the last is computed, so 48 come from the cache */
    CHECK(tb_seq_reuse_prefix(c, 0, P, 64) == 48);
    tb_seq_reset(c, 0);
    /* a slot that is not empty, and one outside the context */
    int32_t one = P[0];
    tb_seq_chunk ch1 = {0, 1, &one, 0};
    CHECK(tb_context_step(c, &ch1, 1, NULL, NULL) == TB_OK);
    CHECK(tb_seq_reuse_prefix(c, 0, P, 70) == -1 && tb_seq_reuse_prefix(c, 9, P, 70) == -1);
    tb_seq_reset(c, 0);

    /* pressure that evicts two cached blocks takes P's tail, not its head: 32 of its 64 tokens stay */
    {
        CHECK(tb_kv_cached_blocks(c) == 4 && tb_kv_free_blocks(c) == total);
        int32_t F[200];
        for (int j = 0; j < 200; j++) F[j] = 3 + (j * 29 + 7) % (V - 3);
        tb_seq_chunk f = {1, 14 * 16, F, 0}; /* 14 blocks: the 12 never used and 2 cached ones */
        int32_t G[224];
        for (int j = 0; j < 224; j++) G[j] = F[j % 200];
        f.tokens = G;
        CHECK(tb_context_step(c, &f, 1, NULL, NULL) == TB_OK);
        tb_seq_reset(c, 1);
        int kept = tb_seq_reuse_prefix(c, 2, P, 70);
        CHECK_MSG(kept == 32, "after evicting two of P's four cached blocks, %d tokens match (want its head: 32)", kept);
        tb_seq_reset(c, 2);
    }
    /* Q (240 + 8 tokens) needs all 16 blocks: every cached block of P is evicted */
    CHECK(run_seq(c, 0, Q, 240, V, &ref[0][0]));
    tb_seq_reset(c, 0);
    CHECK(tb_kv_free_blocks(c) == total);
    int pr = tb_seq_reuse_prefix(c, 1, P, 70);
    CHECK_MSG(pr == 0, "an evicted prefix matched %d tokens", pr);
    CHECK(tb_seq_reuse_prefix(c, 0, Q, 240) == 224);
    CHECK(run_seq(c, 0, Q, 240, V, &got[0][0]));
    w = cmp_runs(&got[0][0], &ref[0][0], V);
    if (w > worst) worst = w;
    for (int s = 0; s < 4; s++) tb_seq_reset(c, s);
    CHECK(tb_kv_free_blocks(c) == total);
    tb_context_free(c);
    /* an int8 cache: the tail's k and v come from a step of another shape,
     * and a last-bit difference may move a code by one step (1/254 of the
     * row's absmax) */
    float tol = info.weight_dtype == TB_F32 && !kv_dtype ? 1e-5f : 1e-3f;
    printf("%s%s%s: reused prefix vs computed max rel err %.3g (tol %.g)\n", engine_path, kv_dtype ? ", kv " : "",
           kv_dtype ? kv_dtype : "", worst, tol);
    CHECK_MSG(worst <= tol, "logits after a reused prefix differ: %g", worst);

    /* no_prefix_cache: nothing kept */
    o.no_prefix_cache = 1;
    CHECK(tb_context_create(e, &o, &c) == TB_OK);
    if (c) {
        CHECK(run_seq(c, 0, P, 70, V, &got[0][0]));
        tb_seq_reset(c, 0);
        CHECK(tb_kv_cached_blocks(c) == 0 && tb_seq_reuse_prefix(c, 1, P, 70) == 0);
        tb_context_free(c);
    }
    tb_engine_free(e);
}

int main(void) {
    test_pool();
    char model[1024], tok[1024], engine[1024];
    const char *sh = tb_test_shared(), *tmp = tb_test_tmp();
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", sh);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
    tb_build_options bo;
    tb_build_options_default(&bo);
    bo.tokenizer_path = tok;
    bo.device = getenv("TURBINE_TEST_DEVICE");
    bo.max_batch = 4;
    snprintf(engine, sizeof engine, "%s/prefix_stories.engine", tmp);
    CHECK_MSG(tb_build(model, engine, &bo, NULL) == TB_OK, "%s", tb_last_error());
    test_context(engine, NULL);
    /* quantized KV is a CPU cache so far */
    const char *dev = getenv("TURBINE_TEST_DEVICE");
    if (!dev || !strcmp(dev, "cpu")) test_context(engine, "int8");
    bo.weight_dtype = TB_F16;
    snprintf(engine, sizeof engine, "%s/prefix_stories_f16.engine", tmp);
    CHECK_MSG(tb_build(model, engine, &bo, NULL) == TB_OK, "%s", tb_last_error());
    test_context(engine, NULL);
    return tb_test_finish("test_prefix_cache");
}
