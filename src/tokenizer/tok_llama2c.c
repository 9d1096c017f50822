/*
 * tok_llama2c.c — llama2.c's tokenizer.bin: int32 max_token_length, then per
 * token float32 score, int32 length, the bytes. The file does not store the
 * vocab size; it is the number of records up to the end of the file.
 */
#include "tokenizer/tok_internal.h"

static int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

tb_status tok_load_llama2c(const char *path, const uint8_t *d, size_t n, tb_tokenizer **out);

tb_status tok_load_llama2c(const char *path, const uint8_t *d, size_t n, tb_tokenizer **out) {
    *out = NULL;
    if (n < 4) return tb_errorf(TB_ERR_FORMAT, "%s: too short for a llama2.c tokenizer", path);
    int32_t max_len = rd_i32(d);
    if (max_len <= 0 || max_len > TOK_MAX_PIECE)
        return tb_errorf(TB_ERR_FORMAT, "%s: max_token_length %d is not plausible", path, max_len);
    /* first pass: count and validate records */
    size_t pos = 4, strings = 0;
    int count = 0;
    while (pos < n) {
        if (n - pos < 8)
            return tb_errorf(TB_ERR_FORMAT, "%s: truncated record for token %d at byte %zu", path, count, pos);
        int32_t len = rd_i32(d + pos + 4);
        if (len < 0 || len > max_len || (size_t)len > n - pos - 8)
            return tb_errorf(TB_ERR_FORMAT, "%s: token %d has bad length %d at byte %zu", path, count, len, pos);
        pos += 8 + (size_t)len;
        strings += (size_t)len + 1;
        if (++count > TOK_MAX_VOCAB) return tb_errorf(TB_ERR_FORMAT, "%s: too many tokens", path);
    }
    if (count < 3) return tb_errorf(TB_ERR_FORMAT, "%s: only %d tokens", path, count);
    tb_tokenizer *t;
    TB_TRY(tok_alloc(count, strings, &t));
    t->kind = TB_TOK_LLAMA2C;
    t->score = malloc((size_t)count * sizeof *t->score);
    if (!t->score) { tb_tokenizer_free(t); return tb_errorf(TB_ERR_OOM, "%s: out of memory", path); }
    pos = 4;
    size_t used = 0;
    for (int i = 0; i < count; i++) {
        memcpy(&t->score[i], d + pos, 4);
        int32_t len = rd_i32(d + pos + 4);
        tok_set_piece(t, i, (const char *)d + pos + 8, (uint32_t)len, &used);
        pos += 8 + (size_t)len;
    }
    t->unk = 0;
    t->bos = 1;
    t->eos[0] = 2;
    t->n_eos = 1;
    t->add_bos = 1;
    tb_status s = tok_finalize(t);
    if (s != TB_OK) {
        tb_tokenizer_free(t);
        return tb_error_prefix(s, "%s", path);
    }
    *out = t;
    return TB_OK;
}
