/*
 * tok_bpe.c — encoding: added tokens split out first, then per segment the
 * normalizers, the pre-tokenizer steps, and the merge engine.
 *
 * One merge engine serves every kind. Symbols sit in an array as a doubly
 * linked list; candidate pairs go into a binary heap ordered by (key, left
 * position), where the key is the merge rank (tokenizer.json) or minus the
 * merged token's score (llama2.c). Popping the smallest valid candidate is
 * the same choice llama2.c's quadratic loop makes (best score, leftmost on
 * ties) and the same as Hugging Face's BPE (lowest rank, leftmost).
 * All buffers live in one work struct per call and only grow.
 */
#include "tokenizer/tok_internal.h"

typedef struct {
    int32_t id, prev, next;
} tok_sym;

typedef struct {
    double key;
    int32_t pos, left, right, result;
} tok_cand;

typedef struct {
    uint32_t start, end;
    uint8_t match;
} tok_span;

typedef struct {
    void *p;
    size_t cap; /* elements */
} tok_vec;

typedef struct {
    const tb_tokenizer *t;
    int32_t *ids;
    int cap;
    long n;
    tb_status err;
    tok_sym *syms;
    size_t nsym, csym;
    tok_cand *heap;
    size_t nheap, cheap;
    char *cat;
    size_t ccat;
    tok_vec nbuf[2];                /* normalizer output, ping-pong      */
    tok_vec sbuf[TOK_MAX_STEPS];    /* per pre-tokenizer step: text copy */
    tok_vec spans[TOK_MAX_STEPS];   /* per step: regex spans             */
    tok_vec pieces[TOK_MAX_STEPS];  /* per step: resulting pieces        */
    pcre2_match_data *md;
} tok_work;

static int grow(tok_work *w, void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) {
        if (w->err == TB_OK) w->err = tb_errorf(TB_ERR_OOM, "tokenizer: out of memory while encoding");
        return 0;
    }
    *p = q;
    *cap = c;
    return 1;
}

static int vgrow(tok_work *w, tok_vec *v, size_t need, size_t elem) {
    return grow(w, &v->p, &v->cap, need, elem);
}

static void emit(tok_work *w, int32_t id) {
    if (w->n < w->cap) w->ids[w->n] = id;
    w->n++;
}

/* ================================================================ merges */

static int cand_less(const tok_cand *a, const tok_cand *b) {
    if (a->key != b->key) return a->key < b->key;
    return a->pos < b->pos;
}

static void heap_push(tok_work *w, const tok_cand *c) {
    if (!grow(w, (void **)&w->heap, &w->cheap, w->nheap + 1, sizeof *w->heap)) return;
    size_t i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = *c;
}

static tok_cand heap_pop(tok_work *w) {
    tok_cand top = w->heap[0];
    tok_cand last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const tok_cand *mc = &last;
        if (l < n && cand_less(&w->heap[l], mc)) { m = l; mc = &w->heap[l]; }
        if (r < n && cand_less(&w->heap[r], mc)) { m = r; mc = &w->heap[r]; }
        if (m == i) break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

/* Pushes the candidate for symbols (a, b) if the pair merges. */
static void try_pair(tok_work *w, int32_t a, int32_t b) {
    const tb_tokenizer *t = w->t;
    if (a < 0 || b < 0) return;
    int32_t la = w->syms[a].id, lb = w->syms[b].id;
    tok_cand c;
    if (t->kind == TB_TOK_LLAMA2C) {
        /* llama2.c: the concatenated string, looked up in the vocab */
        size_t na = t->len[la], nb = t->len[lb];
        if (na + nb > t->max_len) return;
        if (!grow(w, (void **)&w->cat, &w->ccat, na + nb + 1, 1)) return; /* never NULL, even for two empty pieces */
        memcpy(w->cat, t->pool + t->off[la], na);
        memcpy(w->cat + na, t->pool + t->off[lb], nb);
        int id = tok_lookup(t, w->cat, na + nb);
        if (id < 0 || !(t->score[id] > -1e10f)) return;
        c.key = -(double)t->score[id];
        c.result = id;
    } else {
        int r = tok_pair_rank(t, la, lb);
        if (r < 0) return;
        c.key = r;
        c.result = t->merges[3 * (size_t)r + 2];
    }
    c.pos = a;
    c.left = la;
    c.right = lb;
    heap_push(w, &c);
}

/* Merges w->syms[0..nsym) (linked in order) and emits the result. */
static void merge_and_emit(tok_work *w) {
    size_t n = w->nsym;
    if (n == 0) return;
    for (size_t i = 0; i < n; i++) {
        w->syms[i].prev = (int32_t)i - 1;
        w->syms[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(w, (int32_t)i, (int32_t)i + 1);
    while (w->nheap > 0 && w->err == TB_OK) {
        tok_cand c = heap_pop(w);
        tok_sym *s = &w->syms[c.pos];
        if (s->id != c.left || s->next < 0) continue;
        int32_t r = s->next;
        if (w->syms[r].id != c.right) continue;
        s->id = c.result;
        s->next = w->syms[r].next;
        if (s->next >= 0) w->syms[s->next].prev = c.pos;
        w->syms[r].id = -1;
        try_pair(w, s->prev, c.pos);
        try_pair(w, c.pos, s->next);
    }
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) emit(w, w->syms[i].id);
}

static void push_sym(tok_work *w, int32_t id) {
    if (!grow(w, (void **)&w->syms, &w->csym, w->nsym + 1, sizeof *w->syms)) return;
    w->syms[w->nsym++].id = id;
}

static void push_unknown(tok_work *w, const unsigned char *s, size_t n, int32_t *last_unk) {
    const tb_tokenizer *t = w->t;
    if (t->mflags & TOK_M_BYTE_FALLBACK) {
        size_t k = 0;
        while (k < n && t->byte_tok[s[k]] >= 0) k++;
        if (k == n) {
            for (k = 0; k < n; k++) push_sym(w, t->byte_tok[s[k]]);
            return;
        }
    }
    if (t->unk < 0) return;
    if ((t->mflags & TOK_M_FUSE_UNK) && *last_unk >= 0 && *last_unk == (int32_t)w->nsym - 1) return;
    push_sym(w, t->unk);
    *last_unk = (int32_t)w->nsym - 1;
}

/* Length of the character at s: a lead byte and up to 3 continuation bytes
 * (llama2.c's grouping; also used for malformed text elsewhere). */
static size_t char_len(const unsigned char *s, size_t n) {
    size_t l = 1;
    while (l < n && l < 4 && (s[l] & 0xC0) == 0x80) l++;
    return l;
}

/* One word (pre-token) through the BPE model. */
static void model_word(tok_work *w, const char *word, size_t n) {
    const tb_tokenizer *t = w->t;
    const unsigned char *s = (const unsigned char *)word;
    if (n == 0) return;
    w->nsym = 0;
    int32_t last_unk = -1;
    if (t->mflags & TOK_M_BYTE_LEVEL) {
        if (t->mflags & TOK_M_IGNORE_MERGES) {
            if (!grow(w, (void **)&w->cat, &w->ccat, 2 * n, 1)) return;
            size_t m = 0;
            for (size_t i = 0; i < n; i++) {
                uint32_t cp = tok_byte_to_cp(s[i]);
                if (cp < 0x80) w->cat[m++] = (char)cp;
                else { w->cat[m++] = (char)(0xC0 | cp >> 6); w->cat[m++] = (char)(0x80 | (cp & 0x3F)); }
            }
            int id = tok_lookup(t, w->cat, m);
            if (id >= 0) { emit(w, id); return; }
        }
        for (size_t i = 0; i < n; i++) {
            if (t->byte_sym[s[i]] >= 0) push_sym(w, t->byte_sym[s[i]]);
            else push_unknown(w, s + i, 1, &last_unk);
        }
    } else {
        if (t->mflags & TOK_M_IGNORE_MERGES) {
            int id = tok_lookup(t, word, n);
            if (id >= 0) { emit(w, id); return; }
        }
        for (size_t i = 0; i < n;) {
            size_t l = char_len(s + i, n - i);
            int id = tok_lookup(t, word + i, l);
            if (id >= 0) push_sym(w, id);
            else push_unknown(w, s + i, l, &last_unk);
            i += l;
        }
    }
    if (w->err == TB_OK) merge_and_emit(w);
}

/* ================================================================ pre-tokenizers */

static void run_pre(tok_work *w, const char *s, size_t n, int step, int at_start);

/* Regex matches over s as spans (gaps and matches), like the Rust crate's
 * find_matches; empty matches are skipped. Returns the count. */
static size_t find_spans(tok_work *w, const pcre2_code *re, const char *s, size_t n, int step) {
    tok_vec *v = &w->spans[step];
    size_t k = 0, prev = 0, pos = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, w->md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t a = ov[0], b = ov[1];
        if (b == a) {
            /* empty match: step one character on */
            if (a >= n) break;
            pos = a + char_len((const unsigned char *)s + a, n - a);
            continue;
        }
        if (!vgrow(w, v, k + 2, sizeof(tok_span))) return 0;
        tok_span *sp = v->p;
        if (a > prev) sp[k++] = (tok_span){(uint32_t)prev, (uint32_t)a, 0};
        sp[k++] = (tok_span){(uint32_t)a, (uint32_t)b, 1};
        prev = pos = b;
    }
    if (!vgrow(w, v, k + 1, sizeof(tok_span))) return 0;
    if (prev < n) ((tok_span *)v->p)[k++] = (tok_span){(uint32_t)prev, (uint32_t)n, 0};
    return k;
}

/* Applies a split behaviour to the spans of step `step` and recurses. */
static void split_and_run(tok_work *w, const char *s, size_t n, size_t k, int behavior,
                          int step, int at_start) {
    tok_span *sp = w->spans[step].p;
    tok_vec *pv = &w->pieces[step];
    if (!vgrow(w, pv, k + 1, sizeof(tok_span))) return;
    tok_span *out = pv->p;
    size_t m = 0;
    switch (behavior) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < k; i++)
            if (!sp[i].match) out[m++] = sp[i];
        break;
    case TOK_SPLIT_MERGED_PREV: {
        int prev_match = 0;
        for (size_t i = 0; i < k; i++) {
            if (sp[i].match && !prev_match && m > 0) out[m - 1].end = sp[i].end;
            else out[m++] = sp[i];
            prev_match = sp[i].match;
        }
        break;
    }
    case TOK_SPLIT_MERGED_NEXT: {
        /* the mirror image: a match joins the piece after it unless that
         * piece is itself a match */
        for (size_t i = 0; i < k; i++) {
            if (sp[i].match && i + 1 < k && !sp[i + 1].match) {
                out[m++] = (tok_span){sp[i].start, sp[i + 1].end, 0};
                i++;
            } else {
                out[m++] = sp[i];
            }
        }
        break;
    }
    default:
        for (size_t i = 0; i < k; i++) out[m++] = sp[i];
    }
    (void)n;
    for (size_t i = 0; i < m && w->err == TB_OK; i++) {
        tok_span p = ((tok_span *)w->pieces[step].p)[i];
        if (p.end > p.start) run_pre(w, s + p.start, p.end - p.start, step + 1, at_start && p.start == 0);
    }
}

static void run_pre(tok_work *w, const char *s, size_t n, int step, int at_start) {
    const tb_tokenizer *t = w->t;
    if (w->err != TB_OK || n == 0) return;
    if (step >= t->n_pre) { model_word(w, s, n); return; }
    const tok_pre *p = &t->pre[step];
    switch (p->type) {
    case TOK_PRE_SPLIT: {
        size_t k = find_spans(w, p->re, s, n, step);
        split_and_run(w, s, n, k, p->behavior, step, at_start);
        return;
    }
    case TOK_PRE_BYTELEVEL: {
        if (p->flag1 && s[0] != ' ') {
            tok_vec *b = &w->sbuf[step];
            if (!vgrow(w, b, n + 1, 1)) return;
            char *d = b->p;
            d[0] = ' ';
            memcpy(d + 1, s, n);
            s = d;
            n++;
        }
        if (p->flag2) {
            size_t k = find_spans(w, p->re, s, n, step);
            split_and_run(w, s, n, k, TOK_SPLIT_ISOLATED, step, at_start);
        } else {
            run_pre(w, s, n, step + 1, at_start);
        }
        return;
    }
    case TOK_PRE_METASPACE: {
        const char *rep = p->str;
        size_t rl = strlen(rep);
        /* tokenizer.json refuses an empty replacement; one from an engine's tokenizer section is
         * passed over (splitting at every empty match would never advance) */
        if (rl == 0) { run_pre(w, s, n, step + 1, at_start); return; }
        tok_vec *b = &w->sbuf[step];
        if (!vgrow(w, b, (n + 1) * (rl > 1 ? rl : 1), 1)) return;
        char *d = b->p;
        size_t m = 0;
        int starts = n >= rl && memcmp(s, rep, rl) == 0;
        if (s[0] == ' ') starts = 1;
        if (!starts && (p->flag1 == TOK_PREPEND_ALWAYS || (p->flag1 == TOK_PREPEND_FIRST && at_start))) {
            memcpy(d, rep, rl);
            m = rl;
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') { memcpy(d + m, rep, rl); m += rl; }
            else d[m++] = s[i];
        }
        if (!p->flag2) { run_pre(w, d, m, step + 1, at_start); return; }
        /* split: every piece starts at a replacement */
        size_t start = 0;
        for (size_t i = 1; i + rl <= m && w->err == TB_OK; i++) {
            if (memcmp(d + i, rep, rl) == 0) {
                run_pre(w, d + start, i - start, step + 1, at_start && start == 0);
                start = i;
                i += rl - 1;
            }
        }
        run_pre(w, d + start, m - start, step + 1, at_start && start == 0);
        return;
    }
    default:
        model_word(w, s, n);
    }
}

/* ================================================================ normalizers */

static void run_segment(tok_work *w, const char *s, size_t n, int at_start) {
    const tb_tokenizer *t = w->t;
    /* s is the caller's text (cur -1) or nbuf[cur]: each normalizer writes
     * into the other buffer, so that a skipped one (nothing to do) never
     * leaves s in the buffer the next one grows */
    int cur = -1;
    for (int i = 0; i < t->n_norm && w->err == TB_OK; i++) {
        const tok_norm *nm = &t->norm[i];
        int next = cur == 0 ? 1 : 0;
        tok_vec *b = &w->nbuf[next];
        if (nm->type == TOK_NORM_PREPEND) {
            if (n == 0) continue;
            size_t al = strlen(nm->a);
            if (!vgrow(w, b, al + n, 1)) return;
            memcpy(b->p, nm->a, al);
            memcpy((char *)b->p + al, s, n);
            s = b->p;
            n += al;
            cur = next;
        } else if (nm->type == TOK_NORM_REPLACE) {
            size_t al = strlen(nm->a), bl = strlen(nm->b);
            if (al == 0) continue;
            if (!vgrow(w, b, n * (bl > al ? bl / al + 1 : 1) + 1, 1)) return;
            char *d = b->p;
            size_t m = 0;
            for (size_t k = 0; k < n;) {
                if (k + al <= n && memcmp(s + k, nm->a, al) == 0) {
                    memcpy(d + m, nm->b, bl);
                    m += bl;
                    k += al;
                } else {
                    d[m++] = s[k++];
                }
            }
            s = d;
            n = m;
            cur = next;
        }
    }
    run_pre(w, s, n, 0, at_start);
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The added token starting at text[i], or -1. */
static int match_added(const tb_tokenizer *t, const char *text, size_t len, size_t i) {
    unsigned c = (unsigned char)text[i];
    if (!(t->added_first[c >> 3] & (1u << (c & 7)))) return -1;
    for (int k = 0; k < t->n_added; k++) {
        int id = t->added[k];
        size_t l = t->len[id];
        if (l <= len - i && memcmp(text + i, t->pool + t->off[id], l) == 0) return id;
    }
    return -1;
}

/* ================================================================ entry */

/* A byte-fallback token, or <unk> (else nothing) for a vocabulary that
 * lacks it: llama2.c's run.c assumes the 256 byte tokens are there. */
static void push_byte_l2c(tok_work *w, int32_t id) {
    if (id < 0) id = w->t->unk;
    if (id >= 0) push_sym(w, id);
}

static void encode_llama2c(tok_work *w, const char *text, size_t len) {
    const tb_tokenizer *t = w->t;
    const unsigned char *s = (const unsigned char *)text;
    w->nsym = 0;
    if (len == 0) return;
    /* the dummy prefix */
    int sp = tok_lookup(t, " ", 1);
    push_byte_l2c(w, sp >= 0 ? sp : t->byte_tok[' ']);
    for (size_t i = 0; i < len && w->err == TB_OK;) {
        size_t l = char_len(s + i, len - i);
        int id = tok_lookup(t, text + i, l);
        if (id >= 0) push_sym(w, id);
        else
            for (size_t k = 0; k < l; k++) push_byte_l2c(w, t->byte_tok[s[i + k]]);
        i += l;
    }
    if (w->err == TB_OK) merge_and_emit(w);
}

tb_status tb_tokenizer_encode(const tb_tokenizer *t, const char *text, size_t len, int add_bos,
                              int32_t *ids, int cap, int *n_out) {
    if (n_out) *n_out = 0;
    if (!t || (!text && len) || cap < 0 || (!ids && cap > 0))
        return tb_errorf(TB_ERR_INVALID_ARG, "tb_tokenizer_encode: bad arguments");
    tok_work w;
    memset(&w, 0, sizeof w);
    w.t = t;
    w.ids = ids;
    w.cap = cap;
    w.err = TB_OK;
    int need_md = 0;
    for (int i = 0; i < t->n_pre; i++) need_md |= t->pre[i].re != NULL;
    if (need_md) {
        w.md = pcre2_match_data_create(32, NULL);
        if (!w.md) return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
    }
    if (add_bos && t->bos >= 0) emit(&w, t->bos);
    if (t->kind == TB_TOK_LLAMA2C) {
        encode_llama2c(&w, text, len);
    } else {
        size_t seg = 0, i = 0;
        while (i < len && w.err == TB_OK) {
            int id = t->n_added ? match_added(t, text, len, i) : -1;
            if (id < 0) { i++; continue; }
            size_t end = i;
            if (t->tflags[id] & TOK_F_LSTRIP)
                while (end > seg && is_ws((unsigned char)text[end - 1])) end--;
            if (end > seg) run_segment(&w, text + seg, end - seg, seg == 0);
            emit(&w, id);
            i += t->len[id];
            if (t->tflags[id] & TOK_F_RSTRIP)
                while (i < len && is_ws((unsigned char)text[i])) i++;
            seg = i;
        }
        if (len > seg && w.err == TB_OK) run_segment(&w, text + seg, len - seg, seg == 0);
    }
    free(w.syms);
    free(w.heap);
    free(w.cat);
    for (int k = 0; k < 2; k++) free(w.nbuf[k].p);
    for (int k = 0; k < TOK_MAX_STEPS; k++) {
        free(w.sbuf[k].p);
        free(w.spans[k].p);
        free(w.pieces[k].p);
    }
    if (w.md) pcre2_match_data_free(w.md);
    if (w.err != TB_OK) return w.err;
    if (w.n > 0x7fffffffL) return tb_errorf(TB_ERR_RANGE, "tokenizer: too many tokens");
    if (n_out) *n_out = (int)w.n;
    if (w.n > cap) return tb_errorf(TB_ERR_RANGE, "tokenizer: %ld tokens do not fit in %d", w.n, cap);
    return TB_OK;
}
