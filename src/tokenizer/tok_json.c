/*
 * tok_json.c — tb_tokenizer_load: tells a tokenizer.json from a llama2.c
 * tokenizer.bin, reads a Hugging Face tokenizer.json (model type BPE) with
 * jansson, and the bos/eos/add_bos/chat template from tokenizer_config.json,
 * generation_config.json and config.json.
 */
#include "tokenizer/tok_internal.h"

#include <jansson.h>

tb_status tok_load_llama2c(const char *path, const uint8_t *d, size_t n, tb_tokenizer **out);

#define TOK_JSON_MAX (512u << 20)
#define TOK_CONFIG_MAX (64u << 20)

static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *jstr(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(const json_t *o, const char *key, int def) {
    const json_t *v = json_object_get(o, key);
    if (json_is_boolean(v)) return json_is_true(v);
    return def;
}

/* A regex matching `s` literally. */
static char *regex_quote(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(4 * n + 1), *o = d;
    if (!d) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (strchr("\\^$.|?*+()[]{}-/#", c) && c) *o++ = '\\';
        *o++ = (char)c;
    }
    *o = 0;
    return d;
}

/* ================================================================ components */

static tb_status add_norm(tb_tokenizer *t, const json_t *n) {
    if (!n || json_is_null(n)) return TB_OK;
    const char *type = jstr(n, "type");
    if (!type) return tb_errorf(TB_ERR_FORMAT, "tokenizer.json: normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(n, "normalizers");
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) TB_TRY(add_norm(t, v));
        return TB_OK;
    }
    if (t->n_norm >= TOK_MAX_STEPS) return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: too many normalizers");
    tok_norm *o = &t->norm[t->n_norm];
    if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p) return tb_errorf(TB_ERR_FORMAT, "tokenizer.json: Prepend normalizer without 'prepend'");
        o->type = TOK_NORM_PREPEND;
        o->a = tok_strdup(p);
    } else if (!strcmp(type, "Replace")) {
        const json_t *pat = json_object_get(n, "pattern");
        const char *from = jstr(pat, "String"), *to = jstr(n, "content");
        if (!from || !to)
            return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: normalizer Replace with a non-string pattern is not supported");
        o->type = TOK_NORM_REPLACE;
        o->a = tok_strdup(from);
        o->b = tok_strdup(to);
        if (!o->b) { free(o->a); o->a = NULL; }
    } else if (!strcmp(type, "NFC")) {
        o->type = TOK_NORM_NFC;
        tb_log(TB_LOG_DEBUG, "tokenizer: NFC normalizer taken as identity (text is assumed NFC)");
    } else {
        return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: normalizer '%s' is not supported", type);
    }
    if (o->type != TOK_NORM_NFC && !o->a) return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
    t->n_norm++;
    return TB_OK;
}

static tb_status add_pre(tb_tokenizer *t, const json_t *n, int *byte_level) {
    if (!n || json_is_null(n)) return TB_OK;
    const char *type = jstr(n, "type");
    if (!type) return tb_errorf(TB_ERR_FORMAT, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(n, "pretokenizers");
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) TB_TRY(add_pre(t, v, byte_level));
        return TB_OK;
    }
    if (t->n_pre >= TOK_MAX_STEPS) return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: too many pre-tokenizers");
    tok_pre *o = &t->pre[t->n_pre];
    memset(o, 0, sizeof *o);
    if (!strcmp(type, "Split")) {
        const json_t *pat = json_object_get(n, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        const char *beh = jstr(n, "behavior");
        if (jbool(n, "invert", 0))
            return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: pre-tokenizer Split with invert=true is not supported");
        if (!beh || !strcmp(beh, "Isolated")) o->behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(beh, "Removed")) o->behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(beh, "MergedWithPrevious")) o->behavior = TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext")) o->behavior = TOK_SPLIT_MERGED_NEXT;
        else return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: Split behavior '%s' is not supported", beh);
        if (re) o->str = tok_strdup(re);
        else if (lit) o->str = regex_quote(lit);
        else return tb_errorf(TB_ERR_FORMAT, "tokenizer.json: Split without a pattern");
        o->type = TOK_PRE_SPLIT;
    } else if (!strcmp(type, "ByteLevel")) {
        o->type = TOK_PRE_BYTELEVEL;
        o->flag1 = (uint8_t)jbool(n, "add_prefix_space", 0);
        o->flag2 = (uint8_t)jbool(n, "use_regex", 1);
        o->str = tok_strdup(GPT2_PATTERN);
        *byte_level = 1;
    } else if (!strcmp(type, "Metaspace")) {
        const char *rep = jstr(n, "replacement");
        const char *scheme = jstr(n, "prepend_scheme");
        o->type = TOK_PRE_METASPACE;
        if (scheme) {
            if (!strcmp(scheme, "always")) o->flag1 = TOK_PREPEND_ALWAYS;
            else if (!strcmp(scheme, "first")) o->flag1 = TOK_PREPEND_FIRST;
            else if (!strcmp(scheme, "never")) o->flag1 = TOK_PREPEND_NEVER;
            else return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: Metaspace prepend_scheme '%s' is not supported", scheme);
        } else {
            o->flag1 = jbool(n, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        }
        /* an empty replacement has no meaning (Hugging Face's is one character) and would make
         * every position a split point */
        if (rep && !rep[0]) return tb_errorf(TB_ERR_FORMAT, "tokenizer.json: Metaspace replacement is empty");
        o->flag2 = (uint8_t)jbool(n, "split", 1);
        o->str = tok_strdup(rep ? rep : "\xE2\x96\x81"); /* after every check: an error leaves nothing to free */
    } else if (!strcmp(type, "Digits")) {
        o->type = TOK_PRE_SPLIT;
        o->behavior = TOK_SPLIT_ISOLATED;
        o->str = tok_strdup(jbool(n, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+");
    } else {
        return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: pre-tokenizer '%s' is not supported", type);
    }
    if (!o->str) return tb_errorf(TB_ERR_OOM, "tokenizer: out of memory");
    t->n_pre++;
    return TB_OK;
}

static tb_status check_decoder(tb_tokenizer *t, const json_t *n) {
    if (!n || json_is_null(n)) return TB_OK;
    const char *type = jstr(n, "type");
    if (!type) return tb_errorf(TB_ERR_FORMAT, "tokenizer.json: decoder without a type");
    if (!strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(n, "decoders");
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) TB_TRY(check_decoder(t, v));
        return TB_OK;
    }
    if (!strcmp(type, "Strip")) {
        const json_t *st = json_object_get(n, "start");
        if (json_is_integer(st) && json_integer_value(st) > 0) t->mflags |= TOK_M_STRIP_LEAD;
        return TB_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        const char *scheme = jstr(n, "prepend_scheme");
        int strip = scheme ? strcmp(scheme, "never") != 0 : jbool(n, "add_prefix_space", 1);
        if (strip) t->mflags |= TOK_M_STRIP_LEAD;
        return TB_OK;
    }
    if (!strcmp(type, "ByteLevel") || !strcmp(type, "Replace") || !strcmp(type, "ByteFallback") ||
        !strcmp(type, "Fuse"))
        return TB_OK;
    return tb_errorf(TB_ERR_UNSUPPORTED, "tokenizer.json: decoder '%s' is not supported", type);
}

/* ================================================================ tokenizer.json */

static tb_status merge_ids(tb_tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                           int32_t *m, char **buf, size_t *bcap) {
    m[0] = tok_lookup(t, a, na);
    m[1] = tok_lookup(t, b, nb);
    if (na + nb > *bcap) {
        size_t c = 2 * (na + nb);
        char *q = realloc(*buf, c);
        if (!q) return TB_ERR_OOM;
        *buf = q;
        *bcap = c;
    }
    /* both halves may be empty (a merge of " "): then *buf may still be NULL */
    if (na) memcpy(*buf, a, na);
    if (nb) memcpy(*buf + na, b, nb);
    m[2] = tok_lookup(t, na + nb ? *buf : a, na + nb);
    return (m[0] < 0 || m[1] < 0 || m[2] < 0) ? TB_ERR_FORMAT : TB_OK;
}

static tb_status parse_tokenizer_json(const char *path, const json_t *root, tb_tokenizer **out) {
    *out = NULL;
    if (!json_is_object(root)) return tb_errorf(TB_ERR_FORMAT, "%s: not a JSON object", path);
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return tb_errorf(TB_ERR_FORMAT, "%s: no 'model' object", path);
    const char *mtype = jstr(model, "type");
    if (!mtype && json_object_get(model, "merges")) mtype = "BPE";
    if (!mtype || strcmp(mtype, "BPE") != 0)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: tokenizer model type '%s' is not supported (only BPE)",
                         path, mtype ? mtype : "(none)");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) return tb_errorf(TB_ERR_FORMAT, "%s: model.vocab is not an object", path);
    if (merges && !json_is_array(merges)) return tb_errorf(TB_ERR_FORMAT, "%s: model.merges is not an array", path);
    const char *cont = jstr(model, "continuing_subword_prefix"), *suf = jstr(model, "end_of_word_suffix");
    if ((cont && *cont) || (suf && *suf))
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: BPE with continuing_subword_prefix/end_of_word_suffix is not supported", path);

    /* sizes */
    long max_id = -1;
    size_t strings = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= TOK_MAX_VOCAB)
            return tb_errorf(TB_ERR_FORMAT, "%s: vocab entry '%s' has a bad id", path, key);
        if (json_integer_value(val) > max_id) max_id = (long)json_integer_value(val);
        strings += strlen(key) + 1;
    }
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) {
        const json_t *id = json_object_get(v, "id");
        const char *c = jstr(v, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_VOCAB || !c)
            return tb_errorf(TB_ERR_FORMAT, "%s: added_tokens[%zu] needs an id and a content", path, i);
        if (json_integer_value(id) > max_id) max_id = (long)json_integer_value(id);
        strings += strlen(c) + 1;
    }
    if (max_id < 0) return tb_errorf(TB_ERR_FORMAT, "%s: empty vocab", path);
    int n_vocab = (int)max_id + 1;
    tb_tokenizer *t;
    TB_TRY(tok_alloc(n_vocab, strings + (size_t)n_vocab, &t));
    tb_status s = TB_OK;
    char *cat = NULL;
    size_t ccap = 0;
    size_t used = 0;
    uint8_t *seen = calloc((size_t)n_vocab, 1);
    if (!seen) { s = tb_errorf(TB_ERR_OOM, "tokenizer: out of memory"); goto fail; }
    json_object_foreach((json_t *)vocab, key, val) {
        int id = (int)json_integer_value(val);
        if (seen[id]) continue;
        seen[id] = 1;
        tok_set_piece(t, id, key, (uint32_t)strlen(key), &used);
    }
    json_array_foreach(added, i, v) {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        const char *c = jstr(v, "content");
        if (!seen[id]) {
            seen[id] = 1;
            tok_set_piece(t, id, c, (uint32_t)strlen(c), &used);
        }
        t->tflags[id] |= TOK_F_ADDED;
        if (jbool(v, "special", 0)) t->tflags[id] |= TOK_F_SPECIAL;
        if (jbool(v, "lstrip", 0)) t->tflags[id] |= TOK_F_LSTRIP;
        if (jbool(v, "rstrip", 0)) t->tflags[id] |= TOK_F_RSTRIP;
    }
    for (int id = 0; id < n_vocab; id++)
        if (!seen[id]) tok_set_piece(t, id, "", 0, &used);
    free(seen);

    /* components */
    int byte_level = 0;
    if ((s = add_norm(t, json_object_get(root, "normalizer"))) != TB_OK) goto fail;
    if ((s = add_pre(t, json_object_get(root, "pre_tokenizer"), &byte_level)) != TB_OK) goto fail;
    if ((s = check_decoder(t, json_object_get(root, "decoder"))) != TB_OK) goto fail;
    t->kind = byte_level ? TB_TOK_BYTE_BPE : TB_TOK_SPM_BPE;
    if (byte_level) t->mflags |= TOK_M_BYTE_LEVEL;
    if (jbool(model, "byte_fallback", 0)) t->mflags |= TOK_M_BYTE_FALLBACK;
    if (jbool(model, "ignore_merges", 0)) t->mflags |= TOK_M_IGNORE_MERGES;
    if (jbool(model, "fuse_unk", 0)) t->mflags |= TOK_M_FUSE_UNK;

    /* the vocab map first, so merges can be resolved to ids */
    {
        int nm = (int)json_array_size(merges);
        if ((s = tok_build_vmap(t)) != TB_OK) goto fail;
        const char *unk = jstr(model, "unk_token");
        if (unk) t->unk = tok_lookup(t, unk, strlen(unk));
        t->merges = malloc((size_t)(nm ? nm : 1) * 3 * sizeof *t->merges);
        if (!t->merges) { s = tb_errorf(TB_ERR_OOM, "tokenizer: out of memory"); goto fail; }
        json_array_foreach(merges, i, v) {
            int32_t *m = t->merges + 3 * i;
            tb_status r;
            if (json_is_string(v)) {
                const char *ms = json_string_value(v);
                const char *sp = strchr(ms, ' ');
                if (!sp || strchr(sp + 1, ' ')) {
                    s = tb_errorf(TB_ERR_FORMAT, "%s: merge %zu '%s' is not two tokens", path, i, ms);
                    goto fail;
                }
                r = merge_ids(t, ms, (size_t)(sp - ms), sp + 1, strlen(sp + 1), m, &cat, &ccap);
            } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                       json_is_string(json_array_get(v, 1))) {
                const char *a = json_string_value(json_array_get(v, 0));
                const char *b = json_string_value(json_array_get(v, 1));
                r = merge_ids(t, a, strlen(a), b, strlen(b), m, &cat, &ccap);
            } else {
                s = tb_errorf(TB_ERR_FORMAT, "%s: merge %zu is neither \"a b\" nor [a, b]", path, i);
                goto fail;
            }
            if (r == TB_ERR_OOM) { s = tb_errorf(TB_ERR_OOM, "tokenizer: out of memory"); goto fail; }
            if (r != TB_OK) { s = tb_errorf(TB_ERR_FORMAT, "%s: merge %zu uses a token not in the vocab", path, i); goto fail; }
        }
        t->n_merges = nm;
    }

    /* special tokens from the post-processor and the usual names */
    const json_t *pp = json_object_get(root, "post_processor");
    const char *ppt = jstr(pp, "type");
    t->add_bos = 0;
    if (ppt && !strcmp(ppt, "TemplateProcessing")) {
        const json_t *first = json_array_get(json_object_get(pp, "single"), 0);
        const char *bos = jstr(json_object_get(first, "SpecialToken"), "id");
        if (bos) {
            t->bos = tok_lookup(t, bos, strlen(bos));
            t->add_bos = t->bos >= 0;
        }
    }
    if (t->kind == TB_TOK_SPM_BPE) {
        if (t->bos < 0) {
            t->bos = tok_lookup(t, "<s>", 3);
            t->add_bos = t->bos >= 0;
        }
        int e = tok_lookup(t, "</s>", 4);
        if (e >= 0) { t->eos[0] = e; t->n_eos = 1; }
    } else {
        int e = tok_lookup(t, "<|endoftext|>", 13);
        if (e >= 0) { t->eos[0] = e; t->n_eos = 1; }
    }
    free(cat);
    *out = t;
    return TB_OK;
fail:
    free(cat);
    tb_tokenizer_free(t);
    return s;
}

/* ================================================================ configs */

static json_t *load_json_opt(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!tb_file_exists(path)) return NULL;
    char *buf;
    size_t n;
    if (tb_file_read_all(path, &buf, &n, TOK_CONFIG_MAX) != TB_OK) {
        tb_log(TB_LOG_WARN, "tokenizer: cannot read %s: %s", path, tb_last_error());
        return NULL;
    }
    json_error_t err;
    json_t *j = json_loadb(buf, n, 0, &err);
    free(buf);
    if (!j) tb_log(TB_LOG_WARN, "tokenizer: %s:%d: %s (ignored)", path, err.line, err.text);
    return j;
}

static int token_id_of(const tb_tokenizer *t, const json_t *v) {
    const char *s = json_is_string(v) ? json_string_value(v) : jstr(v, "content");
    if (!s) return -1;
    return tok_lookup(t, s, strlen(s));
}

static void add_eos(tb_tokenizer *t, long id) {
    if (id < 0 || id >= t->n_vocab) return;
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos[i] == id) return;
    if (t->n_eos < TOK_MAX_EOS) t->eos[t->n_eos++] = (int32_t)id;
}

static void add_eos_json(tb_tokenizer *t, const json_t *v) {
    if (json_is_integer(v)) add_eos(t, (long)json_integer_value(v));
    size_t i;
    json_t *e;
    if (json_is_array(v)) json_array_foreach(v, i, e) if (json_is_integer(e)) add_eos(t, (long)json_integer_value(e));
}

static tb_status apply_configs(tb_tokenizer *t, const char *dir) {
    json_t *tc = load_json_opt(dir, "tokenizer_config.json");
    json_t *gc = load_json_opt(dir, "generation_config.json");
    json_t *mc = load_json_opt(dir, "config.json");
    int bos_set = 0, eos_reset = 0;
    if (tc) {
        const json_t *b = json_object_get(tc, "bos_token");
        if (b && !json_is_null(b)) {
            int id = token_id_of(t, b);
            if (id >= 0) { t->bos = id; bos_set = 1; }
        }
        const json_t *e = json_object_get(tc, "eos_token");
        if (e && !json_is_null(e)) {
            int id = token_id_of(t, e);
            if (id >= 0) { t->n_eos = 0; eos_reset = 1; add_eos(t, id); }
        }
        const json_t *ab = json_object_get(tc, "add_bos_token");
        if (json_is_boolean(ab)) t->add_bos = json_is_true(ab);
        const json_t *ct = json_object_get(tc, "chat_template");
        const char *tmpl = NULL;
        if (json_is_string(ct)) {
            tmpl = json_string_value(ct);
        } else if (json_is_array(ct)) {
            size_t i;
            json_t *e2;
            json_array_foreach(ct, i, e2) {
                const char *name = jstr(e2, "name");
                if (!tmpl || (name && !strcmp(name, "default"))) tmpl = jstr(e2, "template");
            }
        }
        if (tmpl) {
            free(t->chat_template);
            t->chat_template = tok_strdup(tmpl);
        }
    }
    json_t *srcs[2] = {gc, mc};
    for (int k = 0; k < 2; k++) {
        json_t *c = srcs[k];
        if (!c) continue;
        const json_t *b = json_object_get(c, "bos_token_id");
        if (!bos_set && json_is_integer(b) && json_integer_value(b) >= 0 && json_integer_value(b) < t->n_vocab) {
            t->bos = (int)json_integer_value(b);
            bos_set = 1;
        }
        const json_t *e = json_object_get(c, "eos_token_id");
        if (e && (json_is_integer(e) || json_is_array(e))) {
            if (!eos_reset) { t->n_eos = 0; eos_reset = 1; }
            if (k == 0 || t->n_eos == 0) add_eos_json(t, e);
        }
    }
    if (t->bos < 0) t->add_bos = 0;
    json_decref(tc);
    json_decref(gc);
    json_decref(mc);
    return TB_OK;
}

/* ================================================================ entry */

tb_status tb_tokenizer_load(const char *path, const char *config_dir, tb_tokenizer **out) {
    if (!path || !out) return tb_errorf(TB_ERR_INVALID_ARG, "tb_tokenizer_load: bad arguments");
    *out = NULL;
    tb_mapped_file mf;
    TB_TRY(tb_file_map(path, &mf));
    tb_status s = tb_tokenizer_load_mem(path, mf.data, mf.size, config_dir, out);
    tb_file_unmap(&mf);
    return s;
}

tb_status tb_tokenizer_load_mem(const char *name, const uint8_t *d, size_t n, const char *config_dir,
                                tb_tokenizer **out) {
    if (!name || !out || (!d && n)) return tb_errorf(TB_ERR_INVALID_ARG, "tb_tokenizer_load_mem: bad arguments");
    *out = NULL;
    size_t k = 0;
    while (k < n && (d[k] == ' ' || d[k] == '\n' || d[k] == '\r' || d[k] == '\t')) k++;
    tb_tokenizer *t = NULL;
    tb_status s;
    if (k < n && d[k] == '{') {
        if (n > TOK_JSON_MAX) return tb_errorf(TB_ERR_FORMAT, "%s: larger than %u bytes", name, TOK_JSON_MAX);
        json_error_t err;
        json_t *root = json_loadb((const char *)d, n, 0, &err);
        if (!root)
            return tb_errorf(TB_ERR_FORMAT, "%s:%d:%d: malformed JSON: %s", name, err.line, err.column, err.text);
        s = parse_tokenizer_json(name, root, &t);
        json_decref(root);
        if (s != TB_OK) return s;
        if (config_dir) apply_configs(t, config_dir);
        s = tok_finalize(t);
        if (s != TB_OK) {
            tb_tokenizer_free(t);
            return tb_error_prefix(s, "%s", name);
        }
    } else {
        s = tok_load_llama2c(name, d, n, &t);
        if (s != TB_OK) return s;
        if (config_dir) apply_configs(t, config_dir);
    }
    *out = t;
    return TB_OK;
}
