/*
 * tok_common.c — building the derived tables, the accessors, and decoding
 * (token -> bytes) for every tokenizer kind.
 */
#include "tokenizer/tok_internal.h"

#include <ctype.h>

char *tok_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* ================================================================ building */

tb_status tok_alloc(int n_vocab, size_t pool_cap, tb_tokenizer **out) {
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB)
        return tb_errorf(TB_ERR_FORMAT, "tokenizer: vocab size %d out of range", n_vocab);
    tb_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
    t->n_vocab = n_vocab;
    t->unk = t->bos = -1;
    t->pool = malloc(pool_cap + 1);
    t->off = calloc((size_t)n_vocab, sizeof *t->off);
    t->len = calloc((size_t)n_vocab, sizeof *t->len);
    t->tflags = calloc((size_t)n_vocab, 1);
    if (!t->pool || !t->off || !t->len || !t->tflags) {
        tb_tokenizer_free(t);
        return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
    }
    *out = t;
    return TB_OK;
}

void tok_set_piece(tb_tokenizer *t, int id, const char *s, uint32_t n, size_t *used) {
    t->off[id] = (uint32_t)*used;
    t->len[id] = n;
    memcpy(t->pool + *used, s, n);
    t->pool[*used + n] = 0;
    *used += (size_t)n + 1;
    t->pool_len = *used;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint32_t table_size(size_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    return cap;
}

int tok_lookup(const tb_tokenizer *t, const char *s, size_t n) {
    uint32_t h = (uint32_t)tb_hash64(s, n) & t->vmap_mask;
    for (;;) {
        int32_t id = t->vmap[h];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->pool + t->off[id], s, n) == 0) return id;
        h = (h + 1) & t->vmap_mask;
    }
}

int tok_pair_rank(const tb_tokenizer *t, int a, int b) {
    if (!t->pkeys) return -1;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t h = (uint32_t)mix64(key) & t->pmask;
    for (;;) {
        if (t->pvals[h] < 0) return -1;
        if (t->pkeys[h] == key) return t->pvals[h];
        h = (h + 1) & t->pmask;
    }
}

uint32_t tok_byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint32_t)b;
    /* The others are numbered 256, 257, ... in byte order. */
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) n++;
    return 256u + (uint32_t)n;
}

static int utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Decodes one UTF-8 character at s (n bytes left); returns its length, or 0
 * when malformed. */
static int utf8_get(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned c = s[0];
    int l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!l || (size_t)l > n) return 0;
    uint32_t v = l == 1 ? c : l == 2 ? (c & 0x1F) : l == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < l; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return l;
}

/* "<0xXX>" (exactly) -> the byte, else -1. */
static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        int c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* llama2.c's decode reads byte tokens with sscanf("<0x%02hhX>"): "<0x" then
 * one or two hex digits, the rest ignored. */
static int parse_byte_token_l2c(const char *s, size_t n) {
    if (n < 4 || s[0] != '<' || s[1] != '0' || s[2] != 'x') return -1;
    int v = 0, k = 0;
    for (size_t i = 3; i < n && k < 2 && isxdigit((unsigned char)s[i]); i++, k++)
        v = v * 16 + (isdigit((unsigned char)s[i]) ? s[i] - '0' : (tolower((unsigned char)s[i]) - 'a' + 10));
    return k ? v : -1;
}

static tb_status build_decoded(tb_tokenizer *t) {
    /* Decoded pieces are never longer than the vocab strings. */
    t->dpool = malloc(t->pool_len + 1);
    t->doff = malloc((size_t)t->n_vocab * sizeof *t->doff);
    t->dlen = malloc((size_t)t->n_vocab * sizeof *t->dlen);
    if (!t->dpool || !t->doff || !t->dlen) return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
    int8_t inv[0x180];  /* code point -> byte for the byte-level table (+1) */
    int16_t inv_b[0x180];
    memset(inv, 0, sizeof inv);
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp(b);
        inv[cp] = 1;
        inv_b[cp] = (int16_t)b;
    }
    const char *rep = "\xE2\x96\x81"; /* ▁ */
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].type == TOK_PRE_METASPACE && t->pre[i].str && t->pre[i].str[0]) rep = t->pre[i].str;
    size_t rl = strlen(rep);
    size_t used = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        const char *s = t->pool + t->off[id];
        size_t n = t->len[id];
        char *o = t->dpool + used;
        size_t m = 0;
        int lead = 0;
        t->doff[id] = (uint32_t)used;
        if (t->tflags[id] & TOK_F_SPECIAL) {
            m = 0;
        } else if (t->kind == TB_TOK_LLAMA2C) {
            int b = parse_byte_token_l2c(s, n);
            if (b >= 0) o[m++] = (char)b;
            else { memcpy(o, s, n); m = n; if (n && s[0] == ' ') lead = 1; }
        } else if (t->kind == TB_TOK_SPM_BPE) {
            int b = (t->mflags & TOK_M_BYTE_FALLBACK) ? parse_byte_token(s, n) : -1;
            if (b >= 0) o[m++] = (char)b;
            else {
                lead = n >= rl && memcmp(s, rep, rl) == 0;
                for (size_t k = 0; k < n;) {
                    if (k + rl <= n && memcmp(s + k, rep, rl) == 0) { o[m++] = ' '; k += rl; }
                    else o[m++] = s[k++];
                }
            }
        } else {
            size_t k = 0;
            while (k < n) {
                uint32_t cp;
                int l = utf8_get((const unsigned char *)s + k, n - k, &cp);
                if (!l || cp >= 0x180 || !inv[cp]) break;
                o[m++] = (char)inv_b[cp];
                k += (size_t)l;
            }
            if (k < n) { memcpy(o, s, n); m = n; } /* not byte-level text: as is */
        }
        t->dlen[id] = (uint32_t)m;
        t->tflags[id] = (uint8_t)((t->tflags[id] & ~TOK_F_LEADSP) | (lead ? TOK_F_LEADSP : 0));
        used += m;
    }
    return TB_OK;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static tb_status compile_regex(tok_pre *p) {
    int err;
    PCRE2_SIZE eoff;
    p->re = pcre2_compile((PCRE2_SPTR)p->str, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &eoff, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return tb_errorf(TB_ERR_UNSUPPORTED,
                         "tokenizer: pre-tokenizer regex does not compile at offset %zu (%s): %s",
                         (size_t)eoff, (const char *)msg, p->str);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    return TB_OK;
}

tb_status tok_build_vmap(tb_tokenizer *t) {
    /* the lowest id wins for duplicate strings */
    uint32_t cap = table_size((size_t)t->n_vocab);
    t->vmap = malloc((size_t)cap * sizeof *t->vmap);
    if (!t->vmap) return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
    memset(t->vmap, 0xFF, (size_t)cap * sizeof *t->vmap);
    t->vmap_mask = cap - 1;
    t->max_len = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        const char *s = t->pool + t->off[id];
        uint32_t n = t->len[id];
        if (n > t->max_len) t->max_len = n;
        uint32_t h = (uint32_t)tb_hash64(s, n) & t->vmap_mask;
        for (;;) {
            int32_t o = t->vmap[h];
            if (o < 0) { t->vmap[h] = id; break; }
            if (t->len[o] == n && memcmp(t->pool + t->off[o], s, n) == 0) break;
            h = (h + 1) & t->vmap_mask;
        }
    }
    return TB_OK;
}

tb_status tok_finalize(tb_tokenizer *t) {
    uint32_t cap;
    if (!t->vmap) TB_TRY(tok_build_vmap(t));
    /* merges map; the first (lowest rank) of duplicates wins */
    if (t->n_merges > 0) {
        cap = table_size((size_t)t->n_merges);
        t->pkeys = malloc((size_t)cap * sizeof *t->pkeys);
        t->pvals = malloc((size_t)cap * sizeof *t->pvals);
        if (!t->pkeys || !t->pvals) return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
        memset(t->pvals, 0xFF, (size_t)cap * sizeof *t->pvals);
        t->pmask = cap - 1;
        for (int r = 0; r < t->n_merges; r++) {
            const int32_t *m = t->merges + 3 * (size_t)r;
            for (int k = 0; k < 3; k++)
                if (m[k] < 0 || m[k] >= t->n_vocab)
                    return tb_errorf(TB_ERR_FORMAT, "tokenizer: merge %d refers to token %d outside the vocab", r, m[k]);
            uint64_t key = (uint64_t)(uint32_t)m[0] << 32 | (uint32_t)m[1];
            uint32_t h = (uint32_t)mix64(key) & t->pmask;
            while (t->pvals[h] >= 0 && t->pkeys[h] != key) h = (h + 1) & t->pmask;
            if (t->pvals[h] < 0) { t->pkeys[h] = key; t->pvals[h] = r; }
        }
    }
    /* byte tables */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (t->kind == TB_TOK_LLAMA2C) {
            t->byte_tok[b] = b + 3 < t->n_vocab ? b + 3 : -1;
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_tok[b] = tok_lookup(t, buf, 6);
        }
        int l = utf8_put(tok_byte_to_cp(b), buf);
        t->byte_sym[b] = tok_lookup(t, buf, (size_t)l);
    }
    /* added tokens, longest first */
    t->n_added = 0;
    for (int id = 0; id < t->n_vocab; id++)
        if ((t->tflags[id] & TOK_F_ADDED) && t->len[id] > 0) t->n_added++;
    if (t->n_added) {
        t->added = malloc((size_t)t->n_added * sizeof *t->added);
        uint64_t *keys = malloc((size_t)t->n_added * sizeof *keys);
        if (!t->added || !keys) { free(keys); return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory"); }
        int k = 0;
        memset(t->added_first, 0, sizeof t->added_first);
        for (int id = 0; id < t->n_vocab; id++)
            if ((t->tflags[id] & TOK_F_ADDED) && t->len[id] > 0) {
                /* longest first, then lowest id */
                keys[k++] = (uint64_t)(0xFFFFFFFFu - t->len[id]) << 32 | (uint32_t)id;
                unsigned c = (unsigned char)t->pool[t->off[id]];
                t->added_first[c >> 3] |= (uint8_t)(1u << (c & 7));
            }
        qsort(keys, (size_t)t->n_added, sizeof *keys, cmp_u64);
        for (k = 0; k < t->n_added; k++) t->added[k] = (int32_t)(keys[k] & 0xFFFFFFFFu);
        free(keys);
    }
    for (int i = 0; i < t->n_pre; i++) {
        tok_pre *p = &t->pre[i];
        if (p->type == TOK_PRE_SPLIT || (p->type == TOK_PRE_BYTELEVEL && p->flag2)) {
            if (!p->str) return tb_errorf(TB_ERR_FORMAT, "tokenizer: pre-tokenizer step %d has no pattern", i);
            TB_TRY(compile_regex(p));
        }
    }
    if (t->bos >= t->n_vocab || t->unk >= t->n_vocab) return tb_errorf(TB_ERR_FORMAT, "tokenizer: special id outside the vocab");
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos[i] < 0 || t->eos[i] >= t->n_vocab) return tb_errorf(TB_ERR_FORMAT, "tokenizer: eos id outside the vocab");
    return build_decoded(t);
}

void tb_tokenizer_free(tb_tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->tflags);
    free(t->merges);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); }
    for (int i = 0; i < t->n_pre; i++) {
        free(t->pre[i].str);
        if (t->pre[i].re) pcre2_code_free(t->pre[i].re);
    }
    free(t->chat_template);
    free(t->vmap);
    free(t->pkeys);
    free(t->pvals);
    free(t->dpool);
    free(t->doff);
    free(t->dlen);
    free(t->added);
    free(t);
}

/* ================================================================ accessors */

tb_tokenizer_kind tb_tokenizer_get_kind(const tb_tokenizer *t) { return t->kind; }
int tb_tokenizer_vocab_size(const tb_tokenizer *t) { return t->n_vocab; }
int tb_tokenizer_bos(const tb_tokenizer *t) { return t->bos; }
int tb_tokenizer_add_bos(const tb_tokenizer *t) { return t->add_bos; }
const char *tb_tokenizer_chat_template(const tb_tokenizer *t) { return t->chat_template; }

int tb_tokenizer_eos(const tb_tokenizer *t, int32_t *ids, int cap) {
    int k = 0;
    for (int i = 0; i < t->n_eos && k < cap; i++) ids[k++] = t->eos[i];
    return k;
}

void tb_tokenizer_set_special(tb_tokenizer *t, int bos, const int32_t *eos, int n_eos, int add_bos) {
    if (bos >= -1 && bos < t->n_vocab) t->bos = bos;
    if (eos && n_eos >= 0) {
        t->n_eos = 0;
        for (int i = 0; i < n_eos && t->n_eos < TOK_MAX_EOS; i++)
            if (eos[i] >= 0 && eos[i] < t->n_vocab) t->eos[t->n_eos++] = eos[i];
    }
    if (add_bos >= 0) t->add_bos = add_bos ? 1 : 0;
}

const char *tb_tokenizer_token_str(const tb_tokenizer *t, int tok) {
    if (tok < 0 || tok >= t->n_vocab) return NULL;
    return t->pool + t->off[tok];
}

/* ================================================================ decoding */

size_t tb_tokenizer_piece(const tb_tokenizer *t, int prev, int tok, char *out, size_t cap) {
    if (tok < 0) return 0;
    if (tok >= t->n_vocab) {
        /* An id of a model whose vocabulary is larger than its tokenizer's
         * (padded, as Qwen2's; the build warns): U+FFFD, the Unicode
         * replacement character, so that a generated id with no text shows
         * instead of vanishing. */
        if (cap < 3) return 0;
        memcpy(out, "\xEF\xBF\xBD", 3);
        return 3;
    }
    if (tok == t->bos) return 0;
    for (int i = 0; i < t->n_eos; i++)
        if (tok == t->eos[i]) return 0;
    const char *p = t->dpool + t->doff[tok];
    size_t n = t->dlen[tok];
    if (t->tflags[tok] & TOK_F_LEADSP) {
        /* llama2.c strips after BOS only; the SentencePiece decoders also at
         * the very start. Both look at the vocab string, so a <0x20> byte
         * token keeps its space. */
        int strip = t->kind == TB_TOK_LLAMA2C
                        ? (prev >= 0 && prev == t->bos)
                        : ((t->mflags & TOK_M_STRIP_LEAD) && (prev < 0 || prev == t->bos));
        if (strip) { p++; n--; }
    }
    if (n > cap) n = cap;
    memcpy(out, p, n);
    return n;
}

size_t tb_tokenizer_decode(const tb_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap) {
    size_t used = 0;
    int prev = -1;
    for (int i = 0; i < n; i++) {
        if (cap > 0) used += tb_tokenizer_piece(t, prev, ids[i], out + used, cap - 1 - used);
        prev = ids[i];
    }
    if (cap > 0) out[used] = 0;
    return used;
}

int tb_piece_is_printable(const char *p, size_t n) {
    if (n == 0) return 0;
    if (n == 1) {
        unsigned char c = (unsigned char)p[0];
        return isprint(c) || isspace(c);
    }
    return 1;
}
