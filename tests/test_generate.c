/*
 * test_generate.c — the generation loop (tb_gen, src/runtime/generate.c)
 * that `turbine run`, the server and `bench --engine` drive: stop strings
 * split across tokens are held back and cut, EOS ends, BOS ends only with
 * stop_at_bos, max and min tokens, ignore_eos, UTF-8 characters split across
 * tokens are held back until whole, llama2.c's unprintable pieces, bad
 * options, and a randomised comparison of the released text with the text
 * cut at its earliest stop string.
 *
 * Tokens are spelled with the byte-fallback tokens of stories260K's
 * tokenizer (tok512.bin: <0xXX> is id 3 + XX), so every byte sequence, split
 * anywhere, can be fed one byte per token.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"
#include "tb_test.h"
#include "tokenizer/tokenizer.h"
#include "turbine/turbine.h"

static tb_tokenizer *tok;
static tb_engine_info info;

static int byte_id(unsigned char b) { return 3 + b; }

/* Feeds `s` (n bytes) one byte per token; appends released text to out.
 * Returns the first end seen (or TB_GEN_GOING). */
static tb_gen_end feed(tb_gen *g, const char *s, size_t n, char *out, size_t *on) {
    tb_gen_end e = TB_GEN_GOING;
    for (size_t i = 0; i < n && e == TB_GEN_GOING; i++) {
        const char *t;
        size_t k;
        e = tb_gen_step(g, byte_id((unsigned char)s[i]), &t, &k);
        memcpy(out + *on, t, k);
        *on += k;
    }
    return e;
}

static void init(tb_gen *g, const tb_gen_options *o) {
    tb_status st = tb_gen_init(g, &info, tok, -1, o);
    CHECK_MSG(st == TB_OK, "%s", tb_last_error());
}

static void opts_stops(tb_gen_options *o, const char *a, const char *b) {
    tb_gen_options_default(o);
    o->n_stops = 0;
    if (a) o->stops[o->n_stops++] = a;
    if (b) o->stops[o->n_stops++] = b;
}

static void test_stop_strings(void) {
    tb_gen g;
    tb_gen_options o;
    char out[1024];
    size_t on = 0;
    const char *t;
    size_t k;
    /* "END" arrives over three tokens: its first bytes are held, then cut */
    opts_stops(&o, "END", NULL);
    init(&g, &o);
    CHECK(tb_gen_step(&g, byte_id('a'), &t, &k) == TB_GEN_GOING && k == 1 && t[0] == 'a');
    CHECK(tb_gen_step(&g, byte_id('E'), &t, &k) == TB_GEN_GOING && k == 0);
    CHECK(tb_gen_held(&g) == 1);
    CHECK(tb_gen_step(&g, byte_id('N'), &t, &k) == TB_GEN_GOING && k == 0);
    CHECK(tb_gen_held(&g) == 2);
    CHECK(tb_gen_step(&g, byte_id('D'), &t, &k) == TB_GEN_STOP_STRING && k == 0);
    CHECK(tb_gen_flush(&g, &t) == 0); /* nothing of the stop string comes out */
    CHECK(tb_gen_step(&g, byte_id('x'), &t, &k) == TB_GEN_STOP_STRING && k == 0);
    tb_gen_free(&g);

    /* a false start is released once it can no longer be the stop string */
    init(&g, &o);
    on = 0;
    CHECK(feed(&g, "xENx", 4, out, &on) == TB_GEN_GOING);
    CHECK(on == 4 && !memcmp(out, "xENx", 4));
    /* "EEN": the held suffix moves along ("E" released, "EN" held) */
    on = 0;
    CHECK(feed(&g, "EEN", 3, out, &on) == TB_GEN_GOING);
    CHECK(on == 1 && out[0] == 'E' && tb_gen_held(&g) == 2);
    CHECK(feed(&g, "Dtail", 5, out, &on) == TB_GEN_STOP_STRING);
    CHECK(on == 1);
    tb_gen_free(&g);

    /* the text before the stop in the same token as its end is released */
    opts_stops(&o, "\n\n", "STOP");
    init(&g, &o);
    on = 0;
    CHECK(feed(&g, "one\ntwo\n\nthree", 14, out, &on) == TB_GEN_STOP_STRING);
    CHECK(on == 7 && !memcmp(out, "one\ntwo", 7));
    tb_gen_free(&g);

    /* two stops: the earliest in the text wins, whichever is listed first */
    opts_stops(&o, "cd", "bcde");
    init(&g, &o);
    const char *pc;
    /* a multi-byte piece: a token whose text holds both */
    int32_t ids[64];
    int n = 0;
    CHECK(tb_tokenizer_encode(tok, "abcdef", 6, 0, ids, 64, &n) == TB_OK);
    on = 0;
    tb_gen_end e = TB_GEN_GOING;
    for (int i = 0; i < n && e == TB_GEN_GOING; i++) {
        e = tb_gen_step(&g, ids[i], &pc, &k);
        memcpy(out + on, pc, k);
        on += k;
    }
    if (e == TB_GEN_GOING) on += (k = tb_gen_flush(&g, &pc)), memcpy(out + on - k, pc, k);
    CHECK(e == TB_GEN_STOP_STRING);
    /* the first piece may begin with a space (SentencePiece's dummy prefix) */
    CHECK_MSG((on == 2 && !memcmp(out, "ab", 2)) || (on == 3 && !memcmp(out, " ab", 3)), "got '%.*s'", (int)on, out);
    tb_gen_free(&g);
}

static void test_end_tokens(void) {
    tb_gen g;
    tb_gen_options o;
    const char *t;
    size_t k;
    /* EOS ends; it is neither counted nor printed; held text is flushed */
    opts_stops(&o, "xyz", NULL);
    init(&g, &o);
    CHECK(tb_gen_step(&g, byte_id('a'), &t, &k) == TB_GEN_GOING && k == 1);
    CHECK(tb_gen_step(&g, byte_id('x'), &t, &k) == TB_GEN_GOING && k == 0);
    CHECK(tb_gen_step(&g, info.eos_ids[0], &t, &k) == TB_GEN_END_TOKEN && k == 0);
    CHECK(g.n_gen == 2);
    CHECK(tb_gen_flush(&g, &t) == 1 && t[0] == 'x');
    tb_gen_free(&g);

    /* BOS is an ordinary token by default (the server's rule) */
    tb_gen_options_default(&o);
    init(&g, &o);
    CHECK(tb_gen_step(&g, info.bos_id, &t, &k) == TB_GEN_GOING && k == 0);
    CHECK(g.n_gen == 1);
    tb_gen_free(&g);
    /* and ends the text with stop_at_bos (llama2.c's, `turbine run`'s) */
    o.stop_at_bos = 1;
    init(&g, &o);
    CHECK(tb_gen_step(&g, byte_id('a'), &t, &k) == TB_GEN_GOING);
    CHECK(tb_gen_step(&g, info.bos_id, &t, &k) == TB_GEN_END_TOKEN && k == 0);
    CHECK(tb_gen_step(&g, byte_id('b'), &t, &k) == TB_GEN_END_TOKEN && k == 0);
    CHECK(g.n_gen == 1);
    tb_gen_free(&g);

    /* min_tokens: EOS before it is an ordinary token */
    tb_gen_options_default(&o);
    o.min_tokens = 2;
    init(&g, &o);
    CHECK(tb_gen_step(&g, info.eos_ids[0], &t, &k) == TB_GEN_GOING);
    CHECK(tb_gen_step(&g, byte_id('a'), &t, &k) == TB_GEN_GOING);
    CHECK(tb_gen_is_end(&g, info.eos_ids[0]));
    CHECK(tb_gen_step(&g, info.eos_ids[0], &t, &k) == TB_GEN_END_TOKEN);
    CHECK(g.n_gen == 2);
    tb_gen_free(&g);

    /* ignore_eos: never an end token */
    tb_gen_options_default(&o);
    o.ignore_eos = 1;
    o.stop_at_bos = 1;
    init(&g, &o);
    CHECK(!tb_gen_is_end(&g, info.eos_ids[0]) && !tb_gen_is_end(&g, info.bos_id));
    CHECK(tb_gen_step(&g, info.eos_ids[0], &t, &k) == TB_GEN_GOING);
    tb_gen_free(&g);
}

static void test_max_tokens(void) {
    tb_gen g;
    tb_gen_options o;
    const char *t;
    size_t k;
    tb_gen_options_default(&o);
    o.max_tokens = 3;
    init(&g, &o);
    CHECK(tb_gen_step(&g, byte_id('a'), &t, &k) == TB_GEN_GOING);
    CHECK(tb_gen_step(&g, byte_id('b'), &t, &k) == TB_GEN_GOING);
    /* the last token's text still comes out with the end */
    CHECK(tb_gen_step(&g, byte_id('c'), &t, &k) == TB_GEN_MAX_TOKENS && k == 1 && t[0] == 'c');
    CHECK(tb_gen_step(&g, byte_id('d'), &t, &k) == TB_GEN_MAX_TOKENS && k == 0);
    CHECK(g.n_gen == 3);
    tb_gen_free(&g);

    /* a stop string completed by the last token wins over max tokens */
    opts_stops(&o, "bc", NULL);
    o.max_tokens = 3;
    init(&g, &o);
    char out[16];
    size_t on = 0;
    CHECK(feed(&g, "abc", 3, out, &on) == TB_GEN_STOP_STRING);
    CHECK(on == 1 && out[0] == 'a');
    tb_gen_free(&g);

    /* tokens only (no tokenizer): the end checks, no text */
    tb_gen_options_default(&o);
    o.max_tokens = 2;
    CHECK(tb_gen_init(&g, &info, NULL, -1, &o) == TB_OK);
    CHECK(tb_gen_step(&g, byte_id('a'), &t, &k) == TB_GEN_GOING && k == 0);
    CHECK(tb_gen_step(&g, info.eos_ids[0], &t, &k) == TB_GEN_END_TOKEN);
    tb_gen_free(&g);
}

static void test_utf8(void) {
    tb_gen g;
    tb_gen_options o;
    const char *t;
    size_t k;
    tb_gen_options_default(&o);
    o.max_tokens = 100;
    init(&g, &o);
    /* é = C3 A9 over two tokens */
    CHECK(tb_gen_step(&g, byte_id(0xC3), &t, &k) == TB_GEN_GOING && k == 0 && tb_gen_held(&g) == 1);
    CHECK(tb_gen_step(&g, byte_id(0xA9), &t, &k) == TB_GEN_GOING && k == 2 && !memcmp(t, "\xC3\xA9", 2));
    /* 😀 = F0 9F 98 80 over four */
    const unsigned char em[4] = {0xF0, 0x9F, 0x98, 0x80};
    for (int i = 0; i < 3; i++) {
        CHECK(tb_gen_step(&g, byte_id(em[i]), &t, &k) == TB_GEN_GOING && k == 0);
        CHECK(tb_gen_held(&g) == (size_t)i + 1);
    }
    CHECK(tb_gen_step(&g, byte_id(em[3]), &t, &k) == TB_GEN_GOING && k == 4 && !memcmp(t, em, 4));
    /* ASCII before a split character comes out at once */
    CHECK(tb_gen_step(&g, byte_id('z'), &t, &k) == TB_GEN_GOING && k == 1);
    CHECK(tb_gen_step(&g, byte_id(0xE2), &t, &k) == TB_GEN_GOING && k == 0);
    /* an invalid continuation does not hold text forever */
    CHECK(tb_gen_step(&g, byte_id('q'), &t, &k) == TB_GEN_GOING && k == 2);
    /* a half character at the end is flushed as it is */
    CHECK(tb_gen_step(&g, byte_id(0xE2), &t, &k) == TB_GEN_GOING && k == 0);
    CHECK(tb_gen_step(&g, info.eos_ids[0], &t, &k) == TB_GEN_END_TOKEN);
    CHECK(tb_gen_flush(&g, &t) == 1 && (unsigned char)t[0] == 0xE2);
    tb_gen_free(&g);

    /* a stop string after a split character: both held, then cut */
    opts_stops(&o, "\xC3\xA9!", NULL);
    init(&g, &o);
    char out[16];
    size_t on = 0;
    CHECK(feed(&g, "a\xC3\xA9?\xC3\xA9!b", 9, out, &on) == TB_GEN_STOP_STRING);
    CHECK(on == 4 && !memcmp(out, "a\xC3\xA9?", 4));
    tb_gen_free(&g);
}

static void test_unprintable_and_options(void) {
    tb_gen g;
    tb_gen_options o;
    const char *t;
    size_t k;
    /* llama2.c's safe_printf: a lone control byte prints nothing, still counts */
    tb_gen_options_default(&o);
    o.skip_unprintable = 1;
    init(&g, &o);
    CHECK(tb_gen_step(&g, byte_id(0x01), &t, &k) == TB_GEN_GOING && k == 0 && tb_gen_held(&g) == 0);
    CHECK(tb_gen_step(&g, byte_id('\n'), &t, &k) == TB_GEN_GOING && k == 1);
    CHECK(g.n_gen == 2);
    tb_gen_free(&g);
    o.skip_unprintable = 0;
    init(&g, &o);
    CHECK(tb_gen_step(&g, byte_id(0x01), &t, &k) == TB_GEN_GOING && k == 1);
    tb_gen_free(&g);

    /* bad stop strings are refused */
    char big[TB_GEN_MAX_STOP_LEN + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    opts_stops(&o, big, NULL);
    CHECK(tb_gen_init(&g, &info, tok, -1, &o) == TB_ERR_INVALID_ARG);
    big[TB_GEN_MAX_STOP_LEN] = 0; /* the longest allowed */
    CHECK(tb_gen_init(&g, &info, tok, -1, &o) == TB_OK);
    tb_gen_free(&g);
    opts_stops(&o, "", NULL);
    CHECK(tb_gen_init(&g, &info, tok, -1, &o) == TB_ERR_INVALID_ARG);
    tb_gen_options_default(&o);
    o.n_stops = TB_GEN_MAX_STOPS + 1;
    CHECK(tb_gen_init(&g, &info, tok, -1, &o) == TB_ERR_INVALID_ARG);

    /* a sampler is made from the sampling parameters, and freed */
    tb_sampling_params sp;
    tb_sampling_params_default(&sp);
    tb_gen_options_default(&o);
    o.sampling = &sp;
    init(&g, &o);
    CHECK(g.sampler != NULL);
    static float row[4096];
    memset(row, 0, sizeof row);
    row[7] = 5; /* temperature 0 by default: greedy */
    CHECK(tb_sampler_sample(g.sampler, row, NULL, 0) == 7);
    tb_gen_free(&g);
    CHECK(g.sampler == NULL);
    tb_gen_free(NULL);

    /* a stop of the longest length, held back almost whole, then cut */
    char stop[TB_GEN_MAX_STOP_LEN + 1];
    memset(stop, 'a', TB_GEN_MAX_STOP_LEN);
    stop[TB_GEN_MAX_STOP_LEN] = 0;
    opts_stops(&o, stop, NULL);
    init(&g, &o);
    static char out[2 * TB_GEN_MAX_STOP_LEN];
    size_t on = 0;
    CHECK(feed(&g, stop, TB_GEN_MAX_STOP_LEN - 1, out, &on) == TB_GEN_GOING);
    CHECK(on == 0 && tb_gen_held(&g) == TB_GEN_MAX_STOP_LEN - 1);
    CHECK(feed(&g, "b", 1, out, &on) == TB_GEN_GOING && on == TB_GEN_MAX_STOP_LEN);
    CHECK(feed(&g, stop, TB_GEN_MAX_STOP_LEN, out, &on) == TB_GEN_STOP_STRING && on == TB_GEN_MAX_STOP_LEN);
    tb_gen_free(&g);
}

/* Random texts over a small alphabet, one byte per token: what is released
 * (plus the flush at the end) is the text cut before its earliest stop. */
static void test_random(void) {
    uint64_t s = 42;
    const char *stops[][2] = {{"aba", "bb"}, {"ab", NULL}, {"bab", "aab"}, {"a\xC3\xA9", "\xC3\xA9\xC3"}};
    const char *alpha[] = {"a", "b", "\xC3", "\xA9"};
    int bad = 0;
    for (int trial = 0; trial < 4000; trial++) {
        char text[64];
        size_t n = 0;
        int len = 1 + (int)(trial % 40);
        for (int i = 0; i < len; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            text[n++] = alpha[(s >> 33) % (trial % 3 == 0 ? 4 : 2)][0];
        }
        const char **st = stops[trial % 4];
        tb_gen_options o;
        opts_stops(&o, st[0], st[1]);
        tb_gen g;
        init(&g, &o);
        char out[128];
        size_t on = 0;
        tb_gen_end e = feed(&g, text, n, out, &on);
        const char *t;
        if (e == TB_GEN_GOING) {
            size_t k = tb_gen_flush(&g, &t);
            memcpy(out + on, t, k);
            on += k;
        }
        size_t cut = n;
        for (int i = 0; i < 2; i++) {
            if (!st[i]) continue;
            const char *h = memmem(text, n, st[i], strlen(st[i]));
            if (h && (size_t)(h - text) < cut) cut = (size_t)(h - text);
        }
        int ok = on == cut && !memcmp(out, text, cut) && (e == TB_GEN_STOP_STRING) == (cut < n);
        if (!ok && bad++ < 5) fprintf(stderr, "trial %d: released %zu bytes, want %zu\n", trial, on, cut);
        tb_gen_free(&g);
    }
    CHECK(bad == 0);
}

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K/tok512.bin", tb_test_shared());
    if (tb_tokenizer_load(path, NULL, &tok) != TB_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, tb_last_error());
        return 1;
    }
    /* the byte tokens this test spells text with */
    CHECK(tb_tokenizer_token_str(tok, byte_id(0x41)) && !strcmp(tb_tokenizer_token_str(tok, byte_id(0x41)), "<0x41>"));
    memset(&info, 0, sizeof info);
    info.vocab_size = tb_tokenizer_vocab_size(tok);
    info.bos_id = tb_tokenizer_bos(tok);
    for (int i = 0; i < 4; i++) info.eos_ids[i] = -1;
    tb_tokenizer_eos(tok, info.eos_ids, 4);
    CHECK(info.bos_id >= 0 && info.eos_ids[0] >= 0 && info.bos_id != info.eos_ids[0]);

    test_stop_strings();
    test_end_tokens();
    test_max_tokens();
    test_utf8();
    test_unprintable_and_options();
    test_random();

    tb_tokenizer_free(tok);
    printf("test_generate: %d checks, %d failures\n", tb_test_checks, tb_test_failures);
    return tb_test_failures ? 1 : 0;
}
