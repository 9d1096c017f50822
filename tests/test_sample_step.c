/*
 * test_sample_step.c — tb_context_step_sample: the step picks each row's
 * next token itself (on the device for a GPU engine). Checked against the
 * logits of a plain step of the same sequence:
 *   greedy pick = argmax; the pick's log-probability and the top
 *   alternatives = log-softmax of the logits; penalties as the host sampler;
 *   a seeded draw repeats with the same seed and stays inside the top-k /
 *   min-p / top-p set the host computes; 600 draws at top-k 4 follow the
 *   softmax of those 4 logits; a batch of prefill and decode chunks picks
 *   each row's argmax; rows that score a given token (a prompt's) give its
 *   log-probability and alternatives and leave the generator alone; bad
 *   rows are refused. And the host half of device
 *   sampling (tb_sampler_prepare): penalty pairs and the generator.
 *
 * TURBINE_TEST_DEVICE (default "cpu") picks the device, e.g. "cuda".
 */
#include <math.h>

#include "runtime/runtime.h"
#include "tb_test.h"
#include "turbine/turbine.h"

#define PLEN 8
#define VMAX 65536

static float ref[4][VMAX];

static double lse_of(const float *x, int n) {
    double m = x[tb_test_argmax(x, n)], s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - m);
    return m + log(s);
}

static const float *sort_key;
static int by_desc(const void *a, const void *b) {
    float x = sort_key[*(const int *)a], y = sort_key[*(const int *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const int *)a - *(const int *)b;
}

/* The host's candidate set (runtime/sampler.c order): top-k, softmax at
 * temperature T, min-p, top-p; in[i] = 1 for kept tokens, probs of the
 * top-k candidates in prob[] (sorted order in idx[]). Returns the count. */
static int allowed(const float *x, int V, float T, int top_k, float min_p, float top_p, char *in, int *idx,
                   double *prob) {
    for (int i = 0; i < V; i++) idx[i] = i;
    sort_key = x;
    qsort(idx, (size_t)V, sizeof(int), by_desc);
    int n = top_k > 0 && top_k < V ? top_k : V;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += prob[i] = exp(((double)x[idx[i]] - x[idx[0]]) / T);
    for (int i = 0; i < n; i++) prob[i] /= sum;
    int k = n;
    if (min_p > 0) {
        k = 1;
        while (k < n && prob[k] >= min_p * prob[0]) k++;
    }
    if (top_p < 1) {
        double cum = 0;
        int j = 0;
        while (j < k) {
            cum += prob[j++];
            if (cum >= top_p) break;
        }
        k = j;
    }
    memset(in, 0, (size_t)V);
    for (int i = 0; i < k; i++) in[idx[i]] = 1;
    return k;
}

/* Resets slot 0 and runs the prompt, picking its next token with `sm`. */
static tb_status pick(tb_context *c, const int32_t *prompt, tb_sampler *sm, const int32_t *hist, int n_hist, int top,
                      tb_sample_result *res) {
    tb_seq_reset(c, 0);
    tb_seq_chunk ch = {0, PLEN, prompt, 1};
    tb_row_sampling rs = {sm, hist, n_hist, top, NULL};
    int rows = 0;
    tb_status s = tb_context_step_sample(c, &ch, 1, &rs, res, &rows);
    if (s == TB_OK && rows != 1) return TB_ERR_INTERNAL;
    return s;
}

static tb_sampler *sampler(int V, float T, int top_k, float top_p, float min_p, uint64_t seed) {
    tb_sampling_params p;
    tb_sampling_params_default(&p);
    p.temperature = T;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    tb_sampler *s = NULL;
    TB_ASSERT(tb_sampler_create(V, &p, &s) == TB_OK);
    return s;
}

static void check_engine(const char *path) {
    tb_engine *e = tb_test_load_engine(path);
    if (!e) return;
    tb_engine_info info;
    tb_engine_get_info(e, &info);
    int V = info.vocab_size;
    TB_ASSERT(V <= VMAX);
    tb_context_options o;
    tb_context_options_default(&o);
    o.max_seqs = 4;
    o.n_threads = 2;
    o.device = getenv("TURBINE_TEST_DEVICE");
    tb_context *c = NULL;
    CHECK(tb_context_create(e, &o, &c) == TB_OK);
    if (!c) { tb_engine_free(e); return; }
    int32_t prompt[4][PLEN + 1];
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < PLEN + 1; j++) prompt[s][j] = 3 + (s * 131 + j * 17) % (V - 3);
    /* reference logits of each prompt's last token, by a plain step */
    const float *lg;
    int rows;
    for (int s = 0; s < 4; s++) {
        tb_seq_reset(c, 0);
        tb_seq_chunk ch = {0, PLEN, prompt[s], 1};
        CHECK(tb_context_step(c, &ch, 1, &lg, &rows) == TB_OK && rows == 1);
        memcpy(ref[s], lg, sizeof(float) * (size_t)V);
    }
    const float *x = ref[0];
    double lse = lse_of(x, V);

    /* greedy, with the pick's log-probability and 5 alternatives */
    tb_sampler *g = sampler(V, 0, 0, 1, 0, 1);
    tb_sample_result r;
    CHECK(pick(c, prompt[0], g, prompt[0], PLEN, 5, &r) == TB_OK);
    int am = tb_test_argmax(x, V);
    CHECK_MSG(r.token == am, "greedy pick %d, argmax %d", r.token, am);
    CHECK_MSG(fabs(r.logprob - (x[am] - lse)) < 1e-3, "logprob %g, want %g", r.logprob, x[am] - lse);
    static int idx[VMAX];
    static double prob[VMAX];
    static char in[VMAX];
    allowed(x, V, 1, 0, 0, 1, in, idx, prob);
    CHECK(r.n_top == 5);
    for (int k = 0; k < r.n_top && k < 5; k++) {
        CHECK_MSG(r.top_ids[k] == idx[k], "alternative %d: %d, want %d", k, r.top_ids[k], idx[k]);
        CHECK(fabs(r.top_logprobs[k] - (x[idx[k]] - lse)) < 1e-3);
    }

    /* penalties: the history holds the argmax twice and the runner-up once */
    tb_sampling_params pp;
    tb_sampling_params_default(&pp);
    pp.repeat_penalty = 1.5f;
    pp.presence_penalty = 0.05f;
    pp.frequency_penalty = 0.1f;
    int32_t hist[PLEN + 3];
    memcpy(hist, prompt[0], sizeof(int32_t) * PLEN);
    hist[PLEN] = idx[0];
    hist[PLEN + 1] = idx[1];
    hist[PLEN + 2] = idx[0];
    tb_sampler *ph = NULL, *pd = NULL;
    CHECK(tb_sampler_create(V, &pp, &ph) == TB_OK && tb_sampler_create(V, &pp, &pd) == TB_OK);
    static float row[VMAX];
    memcpy(row, x, sizeof(float) * (size_t)V);
    int want = tb_sampler_sample(ph, row, hist, PLEN + 3);
    CHECK(pick(c, prompt[0], pd, hist, PLEN + 3, 0, &r) == TB_OK);
    CHECK_MSG(r.token == want, "penalised pick %d, host sampler %d", r.token, want);
    CHECK_MSG(fabs(r.logprob - (x[r.token] - lse)) < 1e-3, "penalised pick's logprob is not the raw one");
    tb_sampler_free(ph);
    tb_sampler_free(pd);

    /* seeded draws: repeatable, inside the host's candidate set */
    float T = 0.8f, top_p = 0.9f, min_p = 0.02f;
    int top_k = V > 1000 ? 2000 : 40;
    int kept = allowed(x, V, T, top_k, min_p, top_p, in, idx, prob);
    tb_sampler *a = sampler(V, T, top_k, top_p, min_p, 7), *b = sampler(V, T, top_k, top_p, min_p, 7);
    int same = 1, inside = 1, distinct = 0;
    static char seen[VMAX];
    memset(seen, 0, (size_t)V);
    for (int i = 0; i < 24; i++) {
        tb_sample_result ra, rb;
        CHECK(pick(c, prompt[0], a, NULL, 0, -1, &ra) == TB_OK);
        CHECK(pick(c, prompt[0], b, NULL, 0, -1, &rb) == TB_OK);
        same &= ra.token == rb.token;
        inside &= ra.token >= 0 && ra.token < V && in[ra.token];
        if (ra.token >= 0 && ra.token < V && !seen[ra.token]) { seen[ra.token] = 1; distinct++; }
    }
    printf("%s: seeded draws: %d candidates, %d distinct picks of 24\n", path, kept, distinct);
    CHECK_MSG(same, "the same seed gave different picks");
    CHECK_MSG(inside, "a pick outside the top-k / min-p / top-p set");
    CHECK_MSG(kept < 2 || distinct > 1, "24 draws over %d candidates all gave one token", kept);
    tb_sampler_free(a);
    tb_sampler_free(b);

    /* 600 draws at top-k 4, temperature 1: counts near 600 p */
    tb_sampler *d = sampler(V, 1, 4, 1, 0, 99);
    allowed(x, V, 1, 4, 0, 1, in, idx, prob);
    int count[4] = {0}, other = 0;
    for (int i = 0; i < 600; i++) {
        CHECK(pick(c, prompt[0], d, NULL, 0, -1, &r) == TB_OK);
        int k = 0;
        while (k < 4 && idx[k] != r.token) k++;
        if (k < 4) count[k]++;
        else other++;
    }
    CHECK_MSG(other == 0, "%d of 600 top-k 4 draws outside the top 4", other);
    for (int k = 0; k < 4; k++) {
        double mu = 600 * prob[k], sd = sqrt(600 * prob[k] * (1 - prob[k]));
        printf("%s: top-4 token %d: %d draws, expected %.1f\n", path, k, count[k], mu);
        CHECK_MSG(fabs(count[k] - mu) <= 4.5 * sd + 2, "token %d drawn %d times, expected %.1f", k, count[k], mu);
    }
    tb_sampler_free(d);

    /* a batch: slot 3 prefills in two pieces (the first asks for no pick) */
    for (int s = 0; s < 4; s++) tb_seq_reset(c, s);
    tb_seq_chunk ch[4];
    tb_row_sampling rs[4];
    tb_sample_result res[4];
    for (int s = 0; s < 3; s++) ch[s] = (tb_seq_chunk){s, PLEN, prompt[s + 1], 1};
    ch[3] = (tb_seq_chunk){3, PLEN - 3, prompt[0], 0};
    for (int s = 0; s < 4; s++) rs[s] = (tb_row_sampling){g, NULL, 0, 0, NULL};
    CHECK(tb_context_step_sample(c, ch, 4, rs, res, &rows) == TB_OK && rows == 3);
    for (int s = 0; s < 3; s++) CHECK_MSG(res[s].token == tb_test_argmax(ref[s + 1], V), "batch row %d", s);
    tb_seq_chunk rest = {3, 3, prompt[0] + PLEN - 3, 1};
    CHECK(tb_context_step_sample(c, &rest, 1, rs, res, &rows) == TB_OK && rows == 1);
    CHECK_MSG(res[0].token == am, "a prefill in two steps picks %d, want %d", res[0].token, am);

    /* scored rows: a prompt of PLEN + 1 tokens with one row per token; rows
     * 0 .. PLEN - 1 take the next prompt token (its log-probability and 3
     * alternatives, the generator left alone), the last row is drawn */
    static float all[PLEN + 1][VMAX];
    tb_seq_reset(c, 0);
    tb_seq_chunk full = {0, PLEN + 1, prompt[1], 2};
    CHECK(tb_context_step(c, &full, 1, &lg, &rows) == TB_OK && rows == PLEN + 1);
    for (int j = 0; j < rows && j <= PLEN; j++) memcpy(all[j], lg + (size_t)j * (size_t)V, sizeof(float) * (size_t)V);
    tb_sampler *s1 = sampler(V, 1.0f, 0, 1, 0, 42), *s2 = sampler(V, 1.0f, 0, 1, 0, 42);
    tb_row_sampling srs[PLEN + 1];
    static tb_sample_result sres[PLEN + 1];
    for (int j = 0; j < PLEN; j++) srs[j] = (tb_row_sampling){s1, prompt[1], j + 1, 3, &prompt[1][j + 1]};
    srs[PLEN] = (tb_row_sampling){s1, prompt[1], PLEN + 1, -1, NULL};
    tb_seq_reset(c, 0);
    CHECK(tb_context_step_sample(c, &full, 1, srs, sres, &rows) == TB_OK && rows == PLEN + 1);
    int scored_ok = 1;
    for (int j = 0; j < PLEN; j++) {
        const float *xr = all[j];
        double l = lse_of(xr, V);
        int t = prompt[1][j + 1];
        allowed(xr, V, 1, 0, 0, 1, in, idx, prob);
        scored_ok &= sres[j].token == t && fabs(sres[j].logprob - (xr[t] - l)) < 1e-3 && sres[j].n_top == 3;
        for (int k = 0; k < 3 && k < sres[j].n_top; k++)
            scored_ok &= sres[j].top_ids[k] == idx[k] && fabs(sres[j].top_logprobs[k] - (xr[idx[k]] - l)) < 1e-3;
    }
    CHECK_MSG(scored_ok, "scored rows: a token, log-probability or alternative differs from the plain step's logits");
    /* the drawn row equals a draw of a fresh sampler of the same seed: scoring did not move the generator */
    tb_seq_reset(c, 0);
    tb_seq_chunk last = {0, PLEN + 1, prompt[1], 1};
    tb_row_sampling one_rs = {s2, prompt[1], PLEN + 1, -1, NULL};
    tb_sample_result r2;
    CHECK(tb_context_step_sample(c, &last, 1, &one_rs, &r2, &rows) == TB_OK && rows == 1);
    CHECK_MSG(sres[PLEN].token == r2.token, "the draw after scored rows %d, alone %d", sres[PLEN].token, r2.token);
    int32_t out_of_range = V;
    tb_row_sampling bad_score = {s1, NULL, 0, 0, &out_of_range};
    tb_seq_chunk one_tok = {0, 1, prompt[0], 1};
    tb_seq_reset(c, 0);
    CHECK(tb_context_step_sample(c, &one_tok, 1, &bad_score, res, &rows) == TB_ERR_INVALID_ARG);
    tb_sampler_free(s1);
    tb_sampler_free(s2);

    /* refused: a row without a sampler, too many alternatives */
    tb_row_sampling bad = {NULL, NULL, 0, -1, NULL};
    tb_seq_chunk one = {0, 1, prompt[0], 1};
    CHECK(tb_context_step_sample(c, &one, 1, &bad, res, &rows) == TB_ERR_INVALID_ARG);
    bad = (tb_row_sampling){g, NULL, 0, TB_TOP_LOGPROBS_MAX + 1, NULL};
    CHECK(tb_context_step_sample(c, &one, 1, &bad, res, &rows) == TB_ERR_INVALID_ARG);
    tb_sampler_free(g);
    tb_context_free(c);
    tb_engine_free(e);
}

/* The host half of device sampling: the penalty window as distinct
 * (token, count) pairs, and the generator moving as tb_sampler_sample's. */
static void check_prepare(void) {
    tb_sampling_params p;
    tb_sampling_params_default(&p);
    p.temperature = 0.7f;
    p.repeat_penalty = 1.2f;
    p.penalty_last_n = 4;
    p.seed = 3;
    tb_sampler *a = NULL, *b = NULL;
    TB_ASSERT(tb_sampler_create(16, &p, &a) == TB_OK && tb_sampler_create(16, &p, &b) == TB_OK);
    int32_t hist[] = {5, 7, 5, 9, 5}, tok[8], cnt[8];
    tb_sample_row row;
    int n = tb_sampler_prepare(a, hist, 5, &row, tok, cnt, 8);
    CHECK(n == 3 && row.pen_n == 3);
    CHECK(tok[0] == 7 && cnt[0] == 1 && tok[1] == 5 && cnt[1] == 2 && tok[2] == 9 && cnt[2] == 1);
    CHECK(row.temperature == 0.7f && row.repeat_penalty == 1.2f && row.u >= 0 && row.u < 1);
    CHECK(tb_sampler_window(a, 5) == 4 && tb_sampler_window(a, 3) == 3);
    float lg[16];
    for (int i = 0; i < 16; i++) lg[i] = (float)(i % 5);
    tb_sampler_sample(b, lg, hist, 5); /* one draw, as prepare took one */
    tb_sample_row ra, rb;
    tb_sampler_prepare(a, hist, 0, &ra, tok, cnt, 8);
    tb_sampler_prepare(b, hist, 0, &rb, tok, cnt, 8);
    CHECK_MSG(ra.u == rb.u, "prepare and sample move the generator differently");
    CHECK(ra.pen_n == 0);
    tb_sampler_free(a);
    tb_sampler_free(b);
}

int main(void) {
    check_prepare();
    char model[1024], engine[1024], cmd[4096];
    const char *tmp = tb_test_tmp(), *src = getenv("TURBINE_SRC"), *py = getenv("TURBINE_PYTHON");
    tb_build_options bo;
    tb_build_options_default(&bo);
    bo.device = getenv("TURBINE_TEST_DEVICE");
    char tok[1024];
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", tb_test_shared());
    bo.tokenizer_path = tok; /* any tokenizer: the test feeds token ids */
    const char *presets[] = {"llama-gqa", "llama-wide"};
    for (int i = 0; i < 2; i++) {
        snprintf(model, sizeof model, "%s/ckpt_sample_%s", tmp, presets[i]);
        snprintf(cmd, sizeof cmd, "%s %s/tests/gen_checkpoints.py --preset %s --dtype f32 --out %s >/dev/null",
                 py && *py ? py : "/usr/bin/python3", src ? src : ".", presets[i], model);
        CHECK(system(cmd) == 0);
        snprintf(engine, sizeof engine, "%s/sample_%s.engine", tmp, presets[i]);
        CHECK_MSG(tb_build(model, engine, &bo, NULL) == TB_OK, "%s", tb_last_error());
        check_engine(engine);
    }
    return tb_test_finish("test_sample_step");
}
