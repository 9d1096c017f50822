/*
 * tok_serialize.c — the engine-file form of a tokenizer.
 *
 * Little-endian throughout:
 *   "TBTK" u32 version | kind u8 | mflags u32 | n_vocab u32 | unk i32 |
 *   bos i32 | add_bos u8 | n_eos u8 | eos i32 * n_eos | has_scores u8 |
 *   per token: len u32, bytes, flags u8, [score f32] |
 *   n_merges u32, (left, right, result) i32 * 3 each |
 *   n_norm u8, per step: type u8, str a, str b |
 *   n_pre u8, per step: type, behavior, flag1, flag2 u8, str |
 *   chat template str | XXH3-64 of everything before, u64.
 * A str is u32 length (0xFFFFFFFF: none) then the bytes. Every read is bounds
 * checked, every value range checked; the derived tables are rebuilt.
 */
#include "tokenizer/tok_internal.h"

#define TOK_MAGIC 0x4B544254u /* "TBTK" */
#define TOK_VERSION 1u
#define TOK_NOSTR 0xFFFFFFFFu

/* ================================================================ writer */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} tok_wr;

static void wr_bytes(tok_wr *w, const void *d, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t c = w->cap ? w->cap : 4096;
        while (c < w->n + n) c *= 2;
        uint8_t *q = realloc(w->p, c);
        if (!q) { w->oom = 1; return; }
        w->p = q;
        w->cap = c;
    }
    memcpy(w->p + w->n, d, n);
    w->n += n;
}

static void wr_u8(tok_wr *w, uint8_t v) { wr_bytes(w, &v, 1); }
static void wr_u32(tok_wr *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    wr_bytes(w, b, 4);
}
static void wr_u64(tok_wr *w, uint64_t v) {
    wr_u32(w, (uint32_t)v);
    wr_u32(w, (uint32_t)(v >> 32));
}
static void wr_str(tok_wr *w, const char *s) {
    if (!s) { wr_u32(w, TOK_NOSTR); return; }
    size_t n = strlen(s);
    wr_u32(w, (uint32_t)n);
    wr_bytes(w, s, n);
}

tb_status tb_tokenizer_serialize(const tb_tokenizer *t, uint8_t **buf, size_t *n) {
    if (!t || !buf || !n) return tb_errorf(TB_ERR_INVALID_ARG, "tb_tokenizer_serialize: bad arguments");
    *buf = NULL;
    *n = 0;
    tok_wr w = {0};
    wr_u32(&w, TOK_MAGIC);
    wr_u32(&w, TOK_VERSION);
    wr_u8(&w, (uint8_t)t->kind);
    wr_u32(&w, t->mflags);
    wr_u32(&w, (uint32_t)t->n_vocab);
    wr_u32(&w, (uint32_t)t->unk);
    wr_u32(&w, (uint32_t)t->bos);
    wr_u8(&w, (uint8_t)t->add_bos);
    wr_u8(&w, (uint8_t)t->n_eos);
    for (int i = 0; i < t->n_eos; i++) wr_u32(&w, (uint32_t)t->eos[i]);
    wr_u8(&w, t->score != NULL);
    for (int id = 0; id < t->n_vocab; id++) {
        wr_u32(&w, t->len[id]);
        wr_bytes(&w, t->pool + t->off[id], t->len[id]);
        wr_u8(&w, (uint8_t)(t->tflags[id] & ~TOK_F_LEADSP));
        if (t->score) {
            uint32_t b;
            memcpy(&b, &t->score[id], 4);
            wr_u32(&w, b);
        }
    }
    wr_u32(&w, (uint32_t)t->n_merges);
    for (size_t i = 0; i < 3 * (size_t)t->n_merges; i++) wr_u32(&w, (uint32_t)t->merges[i]);
    wr_u8(&w, (uint8_t)t->n_norm);
    for (int i = 0; i < t->n_norm; i++) {
        wr_u8(&w, t->norm[i].type);
        wr_str(&w, t->norm[i].a);
        wr_str(&w, t->norm[i].b);
    }
    wr_u8(&w, (uint8_t)t->n_pre);
    for (int i = 0; i < t->n_pre; i++) {
        const tok_pre *p = &t->pre[i];
        wr_u8(&w, p->type);
        wr_u8(&w, p->behavior);
        wr_u8(&w, p->flag1);
        wr_u8(&w, p->flag2);
        wr_str(&w, p->str);
    }
    wr_str(&w, t->chat_template);
    if (!w.oom) wr_u64(&w, tb_hash64(w.p, w.n));
    if (w.oom) {
        free(w.p);
        return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory while serializing");
    }
    *buf = w.p;
    *n = w.n;
    return TB_OK;
}

/* ================================================================ reader */

typedef struct {
    const uint8_t *p;
    size_t n, pos;
    int bad;
} tok_rd;

static const uint8_t *rd_take(tok_rd *r, size_t n) {
    if (r->bad || n > r->n - r->pos) { r->bad = 1; return NULL; }
    const uint8_t *p = r->p + r->pos;
    r->pos += n;
    return p;
}
static uint8_t rd_u8(tok_rd *r) {
    const uint8_t *p = rd_take(r, 1);
    return p ? p[0] : 0;
}
static uint32_t rd_u32(tok_rd *r) {
    const uint8_t *p = rd_take(r, 4);
    return p ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24 : 0;
}
/* A malloc'd NUL-terminated copy (NULL for none); sets *ok = 0 on failure. */
static char *rd_str(tok_rd *r, int *ok) {
    uint32_t n = rd_u32(r);
    if (r->bad) { *ok = 0; return NULL; }
    if (n == TOK_NOSTR) return NULL;
    const uint8_t *p = rd_take(r, n);
    if (!p) { *ok = 0; return NULL; }
    if (memchr(p, 0, n)) { r->bad = 1; *ok = 0; return NULL; }
    char *s = malloc((size_t)n + 1);
    if (!s) { *ok = 0; return NULL; }
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

#define BAD(...) do { s = tb_errorf(TB_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)

tb_status tb_tokenizer_deserialize(const uint8_t *buf, size_t n, tb_tokenizer **out) {
    if (!out) return tb_errorf(TB_ERR_INVALID_ARG, "tb_tokenizer_deserialize: bad arguments");
    *out = NULL;
    if (!buf || n < 16) return tb_errorf(TB_ERR_FORMAT, "tokenizer blob: truncated (%zu bytes)", n);
    /* the checksum catches corruption before anything is parsed */
    const uint8_t *h = buf + n - 8;
    uint64_t want = (uint64_t)h[0] | (uint64_t)h[1] << 8 | (uint64_t)h[2] << 16 | (uint64_t)h[3] << 24 |
                    (uint64_t)h[4] << 32 | (uint64_t)h[5] << 40 | (uint64_t)h[6] << 48 | (uint64_t)h[7] << 56;
    if (tb_hash64(buf, n - 8) != want)
        return tb_errorf(TB_ERR_FORMAT, "tokenizer blob: checksum mismatch (truncated or corrupted)");
    tok_rd r = {buf, n - 8, 0, 0};
    if (rd_u32(&r) != TOK_MAGIC) return tb_errorf(TB_ERR_FORMAT, "tokenizer blob: bad magic");
    uint32_t ver = rd_u32(&r);
    if (ver != TOK_VERSION) return tb_errorf(TB_ERR_FORMAT, "tokenizer blob: version %u, expected %u", ver, TOK_VERSION);
    uint8_t kind = rd_u8(&r);
    uint32_t mflags = rd_u32(&r);
    uint32_t n_vocab = rd_u32(&r);
    int32_t unk = (int32_t)rd_u32(&r), bos = (int32_t)rd_u32(&r);
    uint8_t add_bos = rd_u8(&r), n_eos = rd_u8(&r);
    if (r.bad || kind > TB_TOK_BYTE_BPE || n_vocab == 0 || n_vocab > TOK_MAX_VOCAB || n_eos > TOK_MAX_EOS ||
        n_vocab > (r.n - r.pos) / 5 || unk < -1 || bos < -1 || add_bos > 1)
        return tb_errorf(TB_ERR_FORMAT, "tokenizer blob: bad header");
    tb_tokenizer *t;
    TB_TRY(tok_alloc((int)n_vocab, r.n - r.pos + n_vocab, &t));
    tb_status s = TB_OK;
    t->kind = (tb_tokenizer_kind)kind;
    t->mflags = mflags;
    t->unk = unk;
    t->bos = bos;
    t->add_bos = add_bos;
    t->n_eos = n_eos;
    for (int i = 0; i < n_eos; i++) t->eos[i] = (int32_t)rd_u32(&r);
    uint8_t has_scores = rd_u8(&r);
    if (has_scores > 1 || (kind == TB_TOK_LLAMA2C && !has_scores)) BAD("tokenizer blob: bad score flag");
    if (has_scores) {
        t->score = malloc((size_t)n_vocab * sizeof *t->score);
        if (!t->score) { s = tb_errorf(TB_ERR_OOM, "tokenizer: out of memory"); goto fail; }
    }
    size_t used = 0;
    for (uint32_t id = 0; id < n_vocab; id++) {
        uint32_t len = rd_u32(&r);
        const uint8_t *p = rd_take(&r, len);
        uint8_t fl = rd_u8(&r);
        if (!p || len > TOK_MAX_PIECE) BAD("tokenizer blob: token %u is truncated", id);
        tok_set_piece(t, (int)id, (const char *)p, len, &used);
        t->tflags[id] = fl & (TOK_F_SPECIAL | TOK_F_ADDED | TOK_F_LSTRIP | TOK_F_RSTRIP);
        if (has_scores) {
            uint32_t b = rd_u32(&r);
            memcpy(&t->score[id], &b, 4);
        }
    }
    uint32_t nm = rd_u32(&r);
    if (r.bad || nm > (r.n - r.pos) / 12) BAD("tokenizer blob: bad merge count");
    t->merges = malloc((size_t)(nm ? nm : 1) * 3 * sizeof *t->merges);
    if (!t->merges) { s = tb_errorf(TB_ERR_OOM, "tokenizer: out of memory"); goto fail; }
    for (size_t i = 0; i < 3 * (size_t)nm; i++) t->merges[i] = (int32_t)rd_u32(&r);
    t->n_merges = (int)nm;
    int ok = 1;
    uint8_t nn = rd_u8(&r);
    if (nn > TOK_MAX_STEPS) BAD("tokenizer blob: bad normalizer count");
    for (int i = 0; i < nn; i++) {
        tok_norm *q = &t->norm[i];
        q->type = rd_u8(&r);
        q->a = rd_str(&r, &ok);
        q->b = rd_str(&r, &ok);
        t->n_norm = i + 1;
        if (!ok || r.bad) BAD("tokenizer blob: normalizer %d is truncated", i);
        if (q->type < TOK_NORM_PREPEND || q->type > TOK_NORM_NFC || (q->type != TOK_NORM_NFC && !q->a) ||
            (q->type == TOK_NORM_REPLACE && !q->b))
            BAD("tokenizer blob: normalizer %d is malformed", i);
    }
    uint8_t np = rd_u8(&r);
    if (np > TOK_MAX_STEPS) BAD("tokenizer blob: bad pre-tokenizer count");
    for (int i = 0; i < np; i++) {
        tok_pre *q = &t->pre[i];
        memset(q, 0, sizeof *q);
        q->type = rd_u8(&r);
        q->behavior = rd_u8(&r);
        q->flag1 = rd_u8(&r);
        q->flag2 = rd_u8(&r);
        q->str = rd_str(&r, &ok);
        t->n_pre = i + 1;
        if (!ok || r.bad) BAD("tokenizer blob: pre-tokenizer %d is truncated", i);
        if (q->type < TOK_PRE_SPLIT || q->type > TOK_PRE_METASPACE || q->behavior > TOK_SPLIT_MERGED_NEXT ||
            q->flag1 > 2 || q->flag2 > 1 || !q->str || (q->type == TOK_PRE_METASPACE && !q->str[0]))
            BAD("tokenizer blob: pre-tokenizer %d is malformed", i);
    }
    t->chat_template = rd_str(&r, &ok);
    if (!ok || r.bad) BAD("tokenizer blob: chat template is truncated");
    if (r.pos != r.n) BAD("tokenizer blob: %zu bytes of trailing data", r.n - r.pos);
    if ((s = tok_finalize(t)) != TB_OK) {
        if (s != TB_ERR_OOM) s = TB_ERR_FORMAT;
        tb_error_prefix(s, "tokenizer blob");
        goto fail;
    }
    *out = t;
    return TB_OK;
fail:
    tb_tokenizer_free(t);
    return s;
}
