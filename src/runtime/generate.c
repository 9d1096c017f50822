/*
 * generate.c — the generation loop every command drives (runtime.h): the end
 * check (EOS, optionally BOS, min and max tokens) and the text filter that
 * holds back what may still become a stop string or is half a UTF-8
 * character. `turbine run`, the server and `bench --engine` keep one tb_gen
 * per sequence, so the rules that decide where text ends live here only.
 *
 * Nothing here allocates after tb_gen_init: the held text fits a fixed
 * buffer because what is held is at most a stop string's length less one
 * plus three bytes of an unfinished character, and a step adds one piece.
 */
#define _GNU_SOURCE
#include <string.h>

#include "runtime/runtime.h"

const char *tb_gen_end_str(tb_gen_end e) {
    switch (e) {
    case TB_GEN_END_TOKEN: return "end token";
    case TB_GEN_STOP_STRING: return "stop string";
    case TB_GEN_MAX_TOKENS: return "max tokens";
    default: return "going";
    }
}

void tb_gen_options_default(tb_gen_options *o) { memset(o, 0, sizeof *o); }

tb_status tb_gen_init(tb_gen *g, const tb_engine_info *info, const tb_tokenizer *tok, int prev_token,
                      const tb_gen_options *o) {
    memset(g, 0, sizeof *g);
    if (o->n_stops < 0 || o->n_stops > TB_GEN_MAX_STOPS)
        return tb_errorf(TB_ERR_INVALID_ARG, "at most %d stop strings", TB_GEN_MAX_STOPS);
    g->o = *o;
    for (int i = 0; i < o->n_stops; i++) {
        size_t n = o->stop_len[i] ? o->stop_len[i] : (o->stops[i] ? strlen(o->stops[i]) : 0);
        if (n == 0) return tb_errorf(TB_ERR_INVALID_ARG, "stop strings must not be empty");
        if (n > TB_GEN_MAX_STOP_LEN)
            return tb_errorf(TB_ERR_INVALID_ARG, "stop strings are limited to %d bytes", TB_GEN_MAX_STOP_LEN);
        memcpy(g->stop_text[i], o->stops[i], n);
        g->o.stops[i] = g->stop_text[i];
        g->o.stop_len[i] = n;
    }
    g->o.sampling = NULL; /* the caller's; not kept */
    int k = 0;
    for (int i = 0; i < 4; i++)
        if (info->eos_ids[i] >= 0) g->end_ids[k++] = info->eos_ids[i];
    if (o->stop_at_bos && info->bos_id >= 0) g->end_ids[k++] = info->bos_id;
    for (; k < 5; k++) g->end_ids[k] = -1;
    g->tok = tok;
    g->prev = prev_token;
    g->end = TB_GEN_GOING;
    if (o->sampling) TB_TRY(tb_sampler_create(info->vocab_size, o->sampling, &g->sampler));
    return TB_OK;
}

void tb_gen_free(tb_gen *g) {
    if (!g) return;
    tb_sampler_free(g->sampler);
    g->sampler = NULL;
}

int tb_gen_is_end(const tb_gen *g, int32_t token) {
    if (g->o.ignore_eos || g->n_gen < g->o.min_tokens) return 0;
    for (int i = 0; i < 5; i++)
        if (g->end_ids[i] >= 0 && token == g->end_ids[i]) return 1;
    return 0;
}

/* Length of the longest prefix of s (n bytes) made of whole UTF-8
 * characters: a lead byte whose continuation bytes have not all come is held
 * (an invalid byte is not: nothing would complete it). */
static size_t utf8_complete(const char *s, size_t n) {
    size_t i = n;
    int back = 0;
    while (i > 0 && back < 4) {
        unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xC0) != 0x80) { /* a lead byte or ASCII */
            int need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
            return back + 1 >= need ? n : i - 1;
        }
        i--;
        back++;
    }
    return n;
}

/* How much of the held text p (n bytes) may be released: up to the earliest
 * stop string (*hit set), else short of a suffix that begins a stop string
 * and of an unfinished character. */
static size_t releasable(const tb_gen *g, const char *p, size_t n, int *hit) {
    size_t emit = n;
    *hit = 0;
    for (int i = 0; i < g->o.n_stops; i++) {
        const char *at = memmem(p, n, g->o.stops[i], g->o.stop_len[i]);
        if (at && (size_t)(at - p) < emit) emit = (size_t)(at - p); /* the earliest stop wins */
        if (at) *hit = 1;
    }
    if (*hit) return emit;
    for (int i = 0; i < g->o.n_stops; i++) {
        const char *st = g->o.stops[i];
        for (size_t k = g->o.stop_len[i] - 1; k > 0; k--) /* the longest suffix that starts it */
            if (k <= n && !memcmp(p + n - k, st, k)) {
                if (n - k < emit) emit = n - k;
                break;
            }
    }
    return utf8_complete(p, emit);
}

tb_gen_end tb_gen_step(tb_gen *g, int32_t token, const char **text, size_t *n) {
    if (text) *text = g->buf;
    if (n) *n = 0;
    if (g->end != TB_GEN_GOING) return g->end;
    if (tb_gen_is_end(g, token)) return g->end = TB_GEN_END_TOKEN;
    g->n_gen++;
    int prev = g->prev;
    g->prev = token;
    if (g->tok) {
        /* the held text moves to the front; the piece is decoded after it */
        size_t held = g->len - g->start;
        memmove(g->buf, g->buf + g->start, held);
        g->start = 0;
        g->len = held;
        size_t room = sizeof g->buf - held;
        size_t pl = tb_tokenizer_piece(g->tok, prev, token, g->buf + held, room < TB_GEN_PIECE_MAX ? room : TB_GEN_PIECE_MAX);
        if (g->o.skip_unprintable && !tb_piece_is_printable(g->buf + held, pl)) pl = 0;
        g->len += pl;
        int hit;
        size_t emit = releasable(g, g->buf, g->len, &hit);
        if (n) *n = emit;
        g->start = emit;
        if (hit) {
            g->start = g->len = 0; /* the stop string and what follows it are dropped */
            return g->end = TB_GEN_STOP_STRING;
        }
    }
    if (g->o.max_tokens > 0 && g->n_gen >= g->o.max_tokens) return g->end = TB_GEN_MAX_TOKENS;
    return TB_GEN_GOING;
}

size_t tb_gen_flush(tb_gen *g, const char **text) {
    size_t n = g->len - g->start;
    if (text) *text = g->buf + g->start;
    g->start = g->len = 0;
    return n;
}
