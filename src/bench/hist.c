/*
 * hist.c — a log-bucketed histogram in the manner of HdrHistogram.
 *
 * Below 2^SUB the bucket index is the value itself. Above, a value with its
 * highest set bit at e keeps its top SUB bits: shift = e - (SUB - 1), and the
 * index is shift * 2^(SUB-1) + (v >> shift), which continues the exact range
 * without a gap. Each octave thus has 2^(SUB-1) buckets of width 2^shift, at
 * most 1/2^(SUB-1) of their lower bound.
 */
#include <math.h>

#include "bench/bench.h"

#define HALF (1 << (TB_HIST_SUB_BITS - 1))
#define VMAX ((((uint64_t)1) << TB_HIST_MAX_BITS) - 1)

static int msb64(uint64_t v) { return 63 - __builtin_clzll(v); }

int tb_hist_index(uint64_t v) {
    if (v > VMAX) v = VMAX;
    if (v < (1u << TB_HIST_SUB_BITS)) return (int)v;
    int shift = msb64(v) - (TB_HIST_SUB_BITS - 1);
    return shift * HALF + (int)(v >> shift);
}

uint64_t tb_hist_bucket_low(int idx) {
    if (idx < (1 << TB_HIST_SUB_BITS)) return (uint64_t)idx;
    int shift = idx / HALF - 1;
    uint64_t mant = (uint64_t)(idx - shift * HALF);
    return mant << shift;
}

uint64_t tb_hist_bucket_high(int idx) {
    if (idx < (1 << TB_HIST_SUB_BITS)) return (uint64_t)idx + 1;
    int shift = idx / HALF - 1;
    uint64_t mant = (uint64_t)(idx - shift * HALF);
    return (mant + 1) << shift;
}

tb_status tb_hist_init(tb_hist *h) {
    memset(h, 0, sizeof *h);
    h->buckets = calloc(TB_HIST_BUCKETS, sizeof *h->buckets);
    if (!h->buckets) return tb_errorf(TB_ERR_OOM, "histogram: out of memory");
    h->min = UINT64_MAX;
    return TB_OK;
}

void tb_hist_free(tb_hist *h) {
    if (!h) return;
    free(h->buckets);
    h->buckets = NULL;
}

void tb_hist_reset(tb_hist *h) {
    if (h->buckets) memset(h->buckets, 0, TB_HIST_BUCKETS * sizeof *h->buckets);
    h->count = 0;
    h->min = UINT64_MAX;
    h->max = 0;
    h->sum = h->sumsq = 0;
}

void tb_hist_add(tb_hist *h, uint64_t v) {
    if (v > VMAX) v = VMAX;
    h->buckets[tb_hist_index(v)]++;
    h->count++;
    if (v < h->min) h->min = v;
    if (v > h->max) h->max = v;
    double d = (double)v;
    h->sum += d;
    h->sumsq += d * d;
}

void tb_hist_merge(tb_hist *dst, const tb_hist *src) {
    if (!src->count) return;
    for (int i = 0; i < TB_HIST_BUCKETS; i++) dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    if (src->min < dst->min) dst->min = src->min;
    if (src->max > dst->max) dst->max = src->max;
    dst->sum += src->sum;
    dst->sumsq += src->sumsq;
}

double tb_hist_mean(const tb_hist *h) { return h->count ? h->sum / (double)h->count : 0.0; }

double tb_hist_stddev(const tb_hist *h) {
    if (h->count < 2) return 0.0;
    double n = (double)h->count, m = h->sum / n;
    double var = h->sumsq / n - m * m;
    return var > 0 ? sqrt(var) : 0.0;
}

double tb_hist_quantile(const tb_hist *h, double q) {
    if (!h->count) return 0.0;
    if (q <= 0) return (double)h->min;
    if (q >= 1) return (double)h->max;
    /* the smallest value with at least ceil(q * n) values at or below it */
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < TB_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t lo = tb_hist_bucket_low(i), hi = tb_hist_bucket_high(i);
            double v = hi - lo <= 1 ? (double)lo : 0.5 * ((double)lo + (double)(hi - 1));
            if (v < (double)h->min) v = (double)h->min;
            if (v > (double)h->max) v = (double)h->max;
            return v;
        }
    }
    return (double)h->max;
}
