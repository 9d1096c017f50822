/*
 * tokenizer.h — text <-> token ids, one implementation for every command.
 *
 * Three sources load into one tb_tokenizer:
 *   - a llama2.c `tokenizer.bin` (vocab with scores; SentencePiece-style
 *     encoding exactly as llama2.c's run.c does it: a dummy-prefix space,
 *     then greedy best-score pair merges, byte fallback <0xXX>);
 *   - a Hugging Face `tokenizer.json` with model.type "BPE":
 *       * byte-level BPE (GPT-2 / Llama-3 / Qwen2 style): the regex
 *         pre-tokenizer (PCRE2, from the pre_tokenizer's Split pattern or the
 *         ByteLevel default), bytes mapped to unicode, merges by rank;
 *       * SentencePiece-style BPE (Llama-2 / Mistral / TinyLlama style):
 *         "▁" replacement (Metaspace or the Prepend+Replace normalizer),
 *         merges by rank, byte_fallback to <0xXX> tokens;
 *     added_tokens / special tokens are matched verbatim before the model runs.
 *   - the serialized form written into engine files (tb_tokenizer_serialize),
 *     which loads fast and needs no JSON parsing.
 * Optional `tokenizer_config.json` / `generation_config.json` / config.json in
 * the same folder supply bos/eos ids, add_bos_token and the chat template.
 *
 * Anything unsupported (model type WordPiece/Unigram, unknown pre-tokenizer
 * or normalizer) fails with TB_ERR_UNSUPPORTED and a message naming it.
 */
#ifndef TB_TOKENIZER_H
#define TB_TOKENIZER_H

#include "core/core.h"

typedef enum {
    TB_TOK_LLAMA2C = 0,   /* llama2.c tokenizer.bin                 */
    TB_TOK_SPM_BPE = 1,   /* tokenizer.json, SentencePiece-style BPE */
    TB_TOK_BYTE_BPE = 2,  /* tokenizer.json, byte-level BPE          */
} tb_tokenizer_kind;

/* `path`: a tokenizer.json or a llama2.c tokenizer.bin (told apart by
 * content). `config_dir`: a folder to look for tokenizer_config.json,
 * generation_config.json and config.json in, or NULL. */
tb_status tb_tokenizer_load(const char *path, const char *config_dir,
                            tb_tokenizer **out);
/* The same from `n` bytes in memory (not kept); `name` is for messages. */
tb_status tb_tokenizer_load_mem(const char *name, const uint8_t *data, size_t n,
                                const char *config_dir, tb_tokenizer **out);
void tb_tokenizer_free(tb_tokenizer *t);

/* The engine-file form. The buffer is malloc'd; the caller frees it. */
tb_status tb_tokenizer_serialize(const tb_tokenizer *t, uint8_t **buf,
                                 size_t *n);
/* Does not keep pointers into `buf`. */
tb_status tb_tokenizer_deserialize(const uint8_t *buf, size_t n,
                                   tb_tokenizer **out);

tb_tokenizer_kind tb_tokenizer_get_kind(const tb_tokenizer *t);
int tb_tokenizer_vocab_size(const tb_tokenizer *t);
int tb_tokenizer_bos(const tb_tokenizer *t);     /* -1: none */
/* Up to `cap` end-of-sequence ids; returns how many. */
int tb_tokenizer_eos(const tb_tokenizer *t, int32_t *ids, int cap);
int tb_tokenizer_add_bos(const tb_tokenizer *t); /* default for prompts */
/* Chat template text (Jinja source from tokenizer_config.json) or NULL. */
const char *tb_tokenizer_chat_template(const tb_tokenizer *t);
/* Overrides, e.g. from the model's config.json. */
void tb_tokenizer_set_special(tb_tokenizer *t, int bos, const int32_t *eos,
                              int n_eos, int add_bos);

/* Encodes `len` bytes of UTF-8 text. With add_bos, the BOS id (if any)
 * comes first. Special/added tokens written in the text are recognised.
 * Writes at most `cap` ids; *n_out is the full count (> cap: TB_ERR_RANGE). */
tb_status tb_tokenizer_encode(const tb_tokenizer *t, const char *text,
                              size_t len, int add_bos, int32_t *ids, int cap,
                              int *n_out);

/* The bytes token `tok` contributes to the text when it follows `prev`
 * (-1 at the start): byte-fallback tokens give their byte, "▁" becomes a
 * space, byte-level tokens are mapped back to bytes, and the leading space of
 * the first piece after BOS is dropped (SentencePiece / llama2.c rule).
 * Special tokens (BOS/EOS/control) give "". An id past the tokenizer's
 * vocabulary (a model that pads its vocabulary) gives U+FFFD, the
 * replacement character; a negative id gives "". Returns the byte count (may be 0);
 * out is not NUL-terminated. Bytes of one UTF-8 character may be split across
 * tokens: streaming callers buffer incomplete characters themselves. */
size_t tb_tokenizer_piece(const tb_tokenizer *t, int prev, int tok,
                          char *out, size_t cap);

/* Decodes a whole sequence (concatenated pieces). Returns bytes written
 * (excluding the NUL it always writes when cap > 0). */
size_t tb_tokenizer_decode(const tb_tokenizer *t, const int32_t *ids, int n,
                           char *out, size_t cap);

/* The raw vocab string of a token (for inspection), or NULL. */
const char *tb_tokenizer_token_str(const tb_tokenizer *t, int tok);

/* llama2.c's safe_printf rule for printing a piece: 0 for an empty piece or
 * a single byte that is neither printable nor whitespace (control codes from
 * byte-fallback tokens), else 1. */
int tb_piece_is_printable(const char *p, size_t n);

#endif /* TB_TOKENIZER_H */
