/*
 * fuzz_common.h — what the libFuzzer harnesses of tests/fuzz share.
 *
 * Every fuzz_*.c here is one harness (one LLVMFuzzerTestOneInput) built by
 * tests/fuzz/CMakeLists.txt against the library compiled with clang,
 * AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's coverage.
 * A harness hands the bytes to a parser through its in-memory entry point,
 * and when the parser accepts them, uses what it built (lookups, encoding,
 * decoding, a serialization round trip) so that a structure the parser let
 * through inconsistent shows up as a sanitizer report.
 */
#ifndef TB_FUZZ_COMMON_H
#define TB_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "tokenizer/tokenizer.h"

/* Logging off once per process: a parser that warns would flood the run. */
static void fuzz_quiet(void) {
    static int done;
    if (!done) tb_log_set_level(TB_LOG_ERROR), done = 1;
}

/* A violated expectation about a structure a parser accepted: a crash that
 * libFuzzer records with its input. */
#define FUZZ_ASSERT(cond)                                                              \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: fuzz expectation failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* Encodes `text` and decodes the ids: every id within the vocabulary, the
 * decoded text NUL-terminated within its buffer. */
static void fuzz_encode_text(const tb_tokenizer *t, const char *text, size_t len) {
    enum { CAP = 1024 };
    static int32_t ids[CAP];
    static char out[1 << 16];
    int n = 0;
    tb_status s = tb_tokenizer_encode(t, text, len, 1, ids, CAP, &n);
    int vocab = tb_tokenizer_vocab_size(t);
    if (s == TB_OK) {
        FUZZ_ASSERT(n >= 0 && n <= CAP);
        for (int i = 0; i < n; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < vocab);
        size_t k = tb_tokenizer_decode(t, ids, n, out, sizeof out);
        FUZZ_ASSERT(k < sizeof out && out[k] == 0);
    }
}

/* Encodes and decodes `text` (fuzz_encode_text), asks for every piece (of the
 * first 4096 ids) and round-trips the tokenizer through its serialized form.
 * The pieces and the round trip depend on the tokenizer only: a harness that
 * encodes a second text calls fuzz_encode_text for it. */
static void fuzz_use_tokenizer(const tb_tokenizer *t, const char *text, size_t len) {
    fuzz_encode_text(t, text, len);
    int vocab = tb_tokenizer_vocab_size(t);
    char piece[512];
    int prev = -1;
    for (int id = -1; id < vocab && id < 4096; id++) {
        size_t k = tb_tokenizer_piece(t, prev, id, piece, sizeof piece);
        FUZZ_ASSERT(k <= sizeof piece);
        tb_tokenizer_token_str(t, id);
        prev = id;
    }
    tb_tokenizer_piece(t, -1, vocab, piece, sizeof piece); /* past the vocabulary: U+FFFD */
    int32_t eos[8];
    int ne = tb_tokenizer_eos(t, eos, 8);
    FUZZ_ASSERT(ne >= 0 && ne <= 8);
    uint8_t *blob = NULL;
    size_t bn = 0;
    if (tb_tokenizer_serialize(t, &blob, &bn) == TB_OK) {
        tb_tokenizer *u = NULL;
        /* what serialize writes, deserialize reads back */
        FUZZ_ASSERT(tb_tokenizer_deserialize(blob, bn, &u) == TB_OK);
        FUZZ_ASSERT(tb_tokenizer_vocab_size(u) == vocab);
        FUZZ_ASSERT(tb_tokenizer_get_kind(u) == tb_tokenizer_get_kind(t));
        tb_tokenizer_free(u);
        free(blob);
    }
}

/* Text every tokenizer harness encodes besides its own input: spaces,
 * digits, added-token spellings, multi-byte and invalid UTF-8. */
static const char FUZZ_TEXT[] = "Hello world!  The 42 cats\n\tsat <s> </s> <|endoftext|> caf\xC3\xA9 "
                                "\xE2\x96\x81x \xF0\x9F\x98\x80 \xFF\xFE\xC3 end";

/* A small llama2.c tokenizer built in memory (the harnesses that need one
 * to run must not depend on files): <unk>, BOS, EOS, the 256 byte tokens,
 * printable ASCII and a few merges. Loaded once; never freed. */
static const tb_tokenizer *fuzz_small_tokenizer(void) {
    static tb_tokenizer *t;
    if (t) return t;
    static const char *merges[] = {"th", "he", "the", " t", " the", "in", "ing", " a", "er", "on", "<|", "|>"};
    char toks[512][8];
    int n = 0;
    snprintf(toks[n++], 8, "<unk>");
    snprintf(toks[n++], 8, "\n<s>\n");
    snprintf(toks[n++], 8, "\n</s>\n");
    for (int b = 0; b < 256; b++) snprintf(toks[n++], 8, "<0x%02X>", b);
    for (int c = 32; c < 127; c++) snprintf(toks[n++], 8, "%c", c);
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) snprintf(toks[n++], 8, "%s", merges[i]);
    static uint8_t buf[512 * 16];
    size_t k = 0;
    int32_t max_len = 8;
    memcpy(buf + k, &max_len, 4), k += 4;
    for (int i = 0; i < n; i++) {
        float score = i > 3 + 256 + 95 ? (float)i : 0.0f;
        int32_t len = (int32_t)strlen(toks[i]);
        memcpy(buf + k, &score, 4), k += 4;
        memcpy(buf + k, &len, 4), k += 4;
        memcpy(buf + k, toks[i], (size_t)len), k += (size_t)len;
    }
    if (tb_tokenizer_load_mem("small.bin", buf, k, NULL, &t) != TB_OK) {
        fprintf(stderr, "fuzz: the small tokenizer does not load: %s\n", tb_last_error());
        abort();
    }
    return t;
}

#endif
