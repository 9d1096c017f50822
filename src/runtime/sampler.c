/* sampler.c — picking the next token from a row of logits.
 *
 * Order: penalties (repeat, presence, frequency) over the history, then
 * greedy at temperature 0; else temperature, top-k, softmax, min-p, top-p,
 * and a draw from a seeded xorshift generator, so a seed gives the same text.
 * Buffers are allocated once at creation. */
#define _GNU_SOURCE
#include <math.h>

#include "core/core.h"
#include "runtime/runtime.h"

struct tb_sampler {
    int vocab;
    tb_sampling_params p;
    uint64_t rng;
    int32_t *idx;    /* (vocab) candidate ids */
    float *prob;     /* (vocab) */
    int32_t *count;  /* (vocab) occurrences in the penalty window */
    int32_t *pcnt;   /* (vocab) counts of the window's distinct tokens */
};

void tb_sampling_params_default(tb_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
    p->seed = 0x2545F4914F6CDD1Dull;
}

tb_status tb_sampler_create(int vocab, const tb_sampling_params *p, tb_sampler **out) {
    *out = NULL;
    if (vocab <= 0) return tb_errorf(TB_ERR_INVALID_ARG, "vocabulary size must be positive");
    if (p->temperature < 0 || !isfinite(p->temperature))
        return tb_errorf(TB_ERR_INVALID_ARG, "temperature must be >= 0");
    if (p->top_p <= 0 || p->top_p > 1) return tb_errorf(TB_ERR_INVALID_ARG, "top_p must be in (0, 1]");
    if (p->min_p < 0 || p->min_p > 1) return tb_errorf(TB_ERR_INVALID_ARG, "min_p must be in [0, 1]");
    if (p->top_k < 0) return tb_errorf(TB_ERR_INVALID_ARG, "top_k must be >= 0");
    if (p->repeat_penalty <= 0) return tb_errorf(TB_ERR_INVALID_ARG, "repeat penalty must be > 0");
    tb_sampler *s = calloc(1, sizeof *s);
    if (!s) return tb_errorf(TB_ERR_OOM, "out of memory");
    s->vocab = vocab;
    s->p = *p;
    s->rng = p->seed ? p->seed : 0x2545F4914F6CDD1Dull;
    s->idx = malloc(sizeof(int32_t) * (size_t)vocab);
    s->prob = malloc(sizeof(float) * (size_t)vocab);
    s->count = calloc((size_t)vocab, sizeof(int32_t));
    s->pcnt = malloc(sizeof(int32_t) * (size_t)vocab);
    if (!s->idx || !s->prob || !s->count || !s->pcnt) {
        tb_sampler_free(s);
        return tb_errorf(TB_ERR_OOM, "out of memory");
    }
    *out = s;
    return TB_OK;
}

void tb_sampler_free(tb_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->prob);
    free(s->count);
    free(s->pcnt);
    free(s);
}

static uint32_t next_u32(tb_sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (uint32_t)((s->rng * 0x2545F4914F6CDD1Dull) >> 32);
}

static float next_f32(tb_sampler *s) { return (next_u32(s) >> 8) / 16777216.0f; }

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int by_logit_desc(const void *a, const void *b, void *arg) {
    const float *lg = arg;
    float x = lg[*(const int32_t *)a], y = lg[*(const int32_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The penalty window's distinct tokens with their counts, in order of first
 * appearance (at most cap); returns how many. */
static int window_pairs(tb_sampler *s, const int32_t *hist, int n_hist, int32_t *tok, int32_t *cnt, int cap) {
    const tb_sampling_params *p = &s->p;
    int V = s->vocab, n = 0;
    int use_pen = p->repeat_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0;
    if (!use_pen || n_hist <= 0) return 0;
    int from = p->penalty_last_n > 0 && n_hist > p->penalty_last_n ? n_hist - p->penalty_last_n : 0;
    for (int i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < V) s->count[hist[i]]++;
    for (int i = from; i < n_hist; i++) {
        int t = hist[i];
        if (t < 0 || t >= V || s->count[t] == 0) continue;
        if (n < cap) {
            tok[n] = t;
            cnt[n] = s->count[t];
            n++;
        }
        s->count[t] = 0; /* each distinct token once */
    }
    return n;
}

int tb_sampler_sample(tb_sampler *s, float *logits, const int32_t *hist, int n_hist) {
    const tb_sampling_params *p = &s->p;
    int V = s->vocab;
    int n_pen = window_pairs(s, hist, n_hist, s->idx, s->pcnt, V);
    for (int j = 0; j < n_pen; j++) {
        int t = s->idx[j];
        float l = logits[t];
        if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)s->pcnt[j];
        logits[t] = l;
    }
    if (p->temperature == 0.0f) return argmax(logits, V);

    /* candidates: all, or the top k */
    int n = V;
    for (int i = 0; i < V; i++) s->idx[i] = i;
    if (p->top_k > 0 && p->top_k < V) {
        /* partial selection: keep the k largest by a threshold pass */
        n = p->top_k;
        qsort_r(s->idx, (size_t)V, sizeof(int32_t), by_logit_desc, logits);
    } else if (p->top_p < 1.0f || p->min_p > 0) {
        qsort_r(s->idx, (size_t)V, sizeof(int32_t), by_logit_desc, logits);
    }
    float maxl = logits[s->idx[0]];
    for (int i = 1; i < n; i++) if (logits[s->idx[i]] > maxl) maxl = logits[s->idx[i]];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[s->idx[i]] - maxl) / p->temperature);
        sum += s->prob[i];
    }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (p->min_p > 0) { /* sorted: the first is the most likely */
        float thr = p->min_p * s->prob[0];
        int k = 1;
        while (k < n && s->prob[k] >= thr) k++;
        n = k;
    }
    if (p->top_p < 1.0f) {
        double cum = 0;
        int k = 0;
        while (k < n) {
            cum += s->prob[k++];
            if (cum >= p->top_p) break;
        }
        n = k;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += s->prob[i];
    double r = next_f32(s) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[i];
        if (r < acc) return s->idx[i];
    }
    return s->idx[n - 1];
}

/* ---------------------------------------------------------------- device rows */

int tb_sampler_prepare(tb_sampler *s, const int32_t *hist, int n_hist, tb_sample_row *row, int32_t *tok,
                       int32_t *cnt, int cap) {
    const tb_sampling_params *p = &s->p;
    row->temperature = p->temperature;
    row->top_p = p->top_p;
    row->min_p = p->min_p;
    row->repeat_penalty = p->repeat_penalty;
    row->presence_penalty = p->presence_penalty;
    row->frequency_penalty = p->frequency_penalty;
    row->top_k = p->top_k;
    row->n_top = 0;
    int n = window_pairs(s, hist, n_hist, tok, cnt, cap);
    row->pen_n = n;
    /* the generator moves as in tb_sampler_sample: one draw per sampled pick */
    row->u = p->temperature == 0.0f ? 0.0f : next_f32(s);
    return n;
}

int tb_sampler_window(const tb_sampler *s, int n_hist) {
    const tb_sampling_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0) return 0;
    return p->penalty_last_n > 0 && n_hist > p->penalty_last_n ? p->penalty_last_n : n_hist;
}

void tb_sample_logprobs(const float *logits, int V, int tok, int n_top, tb_sample_result *out) {
    float m = logits[0];
    for (int i = 1; i < V; i++) if (logits[i] > m) m = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(logits[i] - m));
    float lse = m + (float)log(sum);
    out->logprob = logits[tok] - lse;
    out->n_top = 0;
    if (n_top > TB_TOP_LOGPROBS_MAX) n_top = TB_TOP_LOGPROBS_MAX;
    /* the next best after (pv, pi): larger value first, then lower index */
    float pv = INFINITY;
    int pi = -1;
    for (int k = 0; k < n_top; k++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            float v = logits[i];
            if (!(v < pv || (v == pv && i > pi))) continue;
            if (best < 0 || v > logits[best]) best = i;
        }
        if (best < 0) break;
        out->top_ids[k] = best;
        out->top_logprobs[k] = logits[best] - lse;
        out->n_top++;
        pv = logits[best];
        pi = best;
    }
}
