/*
 * workload.c — the request bodies a run cycles through.
 *
 * The load tester has no tokenizer (it knows only HTTP), so a synthetic
 * prompt of N tokens is N common English words, each one token in the BPE
 * vocabularies of current models; the server's usage.prompt_tokens, when
 * reported, replaces the estimate. File prompts are estimated at four
 * characters per token.
 *
 * Every request of a workload is a different prompt, so that a sweep can
 * give each point (and its warm-up) prompts no earlier point sent: the CLI
 * loads the whole run at once and hands each point its own slice. A file
 * with fewer prompts than that is cycled (n_source says so). Strings keep
 * their lengths: a prompt may hold U+0000.
 */
#include <jansson.h>
#include <math.h>

#include "bench/bench.h"

#define TB_WL_MAX_PROMPTS 100000
#define TB_WL_MAX_TOKENS 1000000
#define TB_WL_MAX_FILE ((size_t)4 << 30)

static const char *const k_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
    "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
    "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
    "so", "no", "time", "people", "water", "day", "year", "world", "house", "city",
    "light", "story", "river", "music", "book", "road", "tree", "small", "great", "good",
};
#define N_WORDS ((int)(sizeof k_words / sizeof k_words[0]))

const char *tb_endpoint_name(tb_endpoint e) {
    switch (e) {
    case TB_EP_COMPLETIONS: return "completions";
    case TB_EP_CHAT: return "chat";
    case TB_EP_KSERVE: return "kserve";
    case TB_EP_GET: return "get";
    }
    return "?";
}

/* splitmix64: small, seeded, good enough for lengths and words */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return ((rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static double rng_normal(uint64_t *s) {
    double u = rng_unit(s), v = rng_unit(s);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static int draw_len(uint64_t *s, int mean, double sd) {
    if (sd <= 0) return mean;
    long v = lround(mean + sd * rng_normal(s));
    if (v < 1) v = 1;
    if (v > TB_WL_MAX_TOKENS) v = TB_WL_MAX_TOKENS;
    return (int)v;
}

static tb_status make_body(const tb_workload_options *o, const char *prompt, size_t prompt_len,
                           int out_len, tb_bench_request *r) {
    json_t *b = json_object();
    if (!b) return tb_errorf(TB_ERR_OOM, "workload: out of memory");
    json_object_set_new(b, "model", json_string(o->model ? o->model : ""));
    if (o->endpoint == TB_EP_CHAT) {
        json_t *msgs = json_array(), *m = json_object();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set_new(m, "content", json_stringn(prompt, prompt_len));
        json_array_append_new(msgs, m);
        json_object_set_new(b, "messages", msgs);
    } else {
        json_object_set_new(b, "prompt", json_stringn(prompt, prompt_len));
    }
    json_object_set_new(b, "max_tokens", json_integer(out_len));
    json_object_set_new(b, "temperature", json_real(0.0));
    if (o->ignore_eos) {
        json_object_set_new(b, "ignore_eos", json_true());
        json_object_set_new(b, "min_tokens", json_integer(out_len));
    }
    json_object_set_new(b, "stream", json_boolean(o->stream));
    if (o->stream) {
        json_t *so = json_object();
        json_object_set_new(so, "include_usage", json_true());
        json_object_set_new(b, "stream_options", so);
    }
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    if (!s) return tb_errorf(TB_ERR_OOM, "workload: cannot encode a request");
    r->body = s;
    r->body_len = strlen(s);
    r->output_len = out_len;
    return TB_OK;
}

/* Four characters per token, at least one; saturates for absurd lengths. */
static int est_tokens(size_t n) {
    if (n / 4 > TB_WL_MAX_TOKENS) return TB_WL_MAX_TOKENS;
    return (int)(n / 4 > 0 ? n / 4 : 1);
}

static tb_status add_prompt(tb_workload *w, int cap, const tb_workload_options *o,
                            const char *prompt, size_t prompt_len, int in_len, int out_len) {
    if (w->n >= cap) return TB_OK;
    tb_bench_request *r = &w->reqs[w->n];
    TB_TRY(make_body(o, prompt, prompt_len, out_len, r));
    r->input_len = in_len;
    w->n++;
    return TB_OK;
}

/* Appends n random words (the first one `first` when >= 0) to buf at *k. */
static void put_words(char *buf, size_t *k, int n, long first, uint64_t *s) {
    for (int t = 0; t < n; t++) {
        const char *wd = k_words[(t == 0 && first >= 0 ? (uint64_t)first : rng_next(s)) % N_WORDS];
        if (*k) buf[(*k)++] = ' ';
        size_t l = strlen(wd);
        memcpy(buf + *k, wd, l);
        *k += l;
    }
}

static tb_status load_synthetic(const tb_workload_options *o, tb_workload *w, int cap) {
    uint64_t s = o->seed ? o->seed : 1, ps = s ^ 0x5bd1e995ull; /* the shared prefix has its own stream */
    char *buf = NULL;
    size_t bcap = 0;
    for (int i = 0; i < cap; i++) {
        int in = draw_len(&s, o->input_len, o->input_stddev);
        int out = draw_len(&s, o->output_len, o->output_stddev);
        size_t need = (size_t)(in + o->prefix_len) * 8 + 16;
        if (need > bcap) {
            char *nb = realloc(buf, need);
            if (!nb) { free(buf); return tb_errorf(TB_ERR_OOM, "workload: out of memory"); }
            buf = nb;
            bcap = need;
        }
        size_t k = 0;
        uint64_t p = ps;
        put_words(buf, &k, o->prefix_len, -1, &p); /* the same words for every prompt */
        /* then a different start word per prompt: nothing after the prefix is shared */
        put_words(buf, &k, in, i, &s);
        buf[k] = 0;
        tb_status st = add_prompt(w, cap, o, buf, k, in + o->prefix_len, out);
        if (st != TB_OK) { free(buf); return st; }
    }
    free(buf);
    return TB_OK;
}

static tb_status load_jsonl(const tb_workload_options *o, tb_workload *w, int cap) {
    char *text = NULL;
    size_t size = 0;
    TB_TRY(tb_file_read_all(o->jsonl_path, &text, &size, TB_WL_MAX_FILE));
    char *p = text;
    int line_no = 0;
    tb_status st = TB_OK;
    while (p && *p && w->n < cap) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        line_no++;
        char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (*q) {
            json_error_t err;
            json_t *j = json_loads(q, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
            json_t *prompt = NULL;
            int out = o->output_len;
            if (j && json_is_string(j)) prompt = j;
            else if (j && json_is_object(j)) {
                prompt = json_object_get(j, "prompt");
                json_t *ol = json_object_get(j, "output_len");
                if (!ol) ol = json_object_get(j, "max_tokens");
                if (json_is_integer(ol) && json_integer_value(ol) > 0 &&
                    json_integer_value(ol) <= TB_WL_MAX_TOKENS)
                    out = (int)json_integer_value(ol);
            }
            if (!json_is_string(prompt)) {
                json_decref(j);
                st = tb_errorf(TB_ERR_FORMAT, "%s:%d: want a string or {\"prompt\": ...}",
                               o->jsonl_path, line_no);
                break;
            }
            size_t pl = json_string_length(prompt);
            st = add_prompt(w, cap, o, json_string_value(prompt), pl, est_tokens(pl), out);
            json_decref(j);
            if (st != TB_OK) break;
        }
        p = nl ? nl + 1 : NULL;
    }
    free(text);
    return st;
}

static tb_status load_sharegpt(const tb_workload_options *o, tb_workload *w, int cap) {
    json_error_t err;
    json_t *root = json_load_file(o->sharegpt_path, JSON_ALLOW_NUL, &err);
    if (!root)
        return tb_errorf(TB_ERR_FORMAT, "%s:%d: %s", o->sharegpt_path, err.line, err.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return tb_errorf(TB_ERR_FORMAT, "%s: a ShareGPT file is a JSON array", o->sharegpt_path);
    }
    size_t i;
    json_t *conv;
    tb_status st = TB_OK;
    json_array_foreach(root, i, conv) {
        if (w->n >= cap) break;
        json_t *turns = json_object_get(conv, "conversations");
        if (!json_is_array(turns) || json_array_size(turns) < 2) continue;
        json_t *t0 = json_array_get(turns, 0), *t1 = json_array_get(turns, 1);
        json_t *q = json_object_get(t0, "value"), *a = json_object_get(t1, "value");
        if (!json_is_string(q) || !json_is_string(a) || !json_string_length(q)) continue;
        /* the answer's length in the dataset, unless --output-len is given */
        int out = o->output_len > 0 ? o->output_len : est_tokens(json_string_length(a));
        size_t ql = json_string_length(q);
        st = add_prompt(w, cap, o, json_string_value(q), ql, est_tokens(ql), out);
        if (st != TB_OK) break;
    }
    json_decref(root);
    if (st == TB_OK && w->n == 0)
        st = tb_errorf(TB_ERR_FORMAT, "%s: no conversation with a question and an answer",
                       o->sharegpt_path);
    return st;
}

/* A file with fewer prompts than asked for: repeat them up to cap. */
static tb_status cycle_to(tb_workload *w, int cap) {
    int m = w->n;
    for (int i = m; i < cap && m > 0; i++) {
        const tb_bench_request *src = &w->reqs[i % m];
        tb_bench_request *r = &w->reqs[i];
        *r = *src;
        r->body = malloc(src->body_len + 1);
        if (!r->body) return tb_errorf(TB_ERR_OOM, "workload: out of memory");
        memcpy(r->body, src->body, src->body_len + 1);
        w->n = i + 1;
    }
    return TB_OK;
}

static tb_status load_body(const tb_workload_options *o, tb_workload *w) {
    char *text = NULL;
    size_t size = 0;
    TB_TRY(tb_file_read_all(o->body_path, &text, &size, (size_t)64 << 20));
    w->reqs[0].body = text;
    w->reqs[0].body_len = size;
    w->n = 1;
    return TB_OK;
}

/* KServe v2 bodies from a spec: TB_KS_POOL (at most cap) random ones with
 * successive seeds, or one from --input-data files. */
static tb_status load_kserve(const tb_workload_options *o, tb_workload *w, int cap) {
    const tb_ks_spec *s = o->kserve_spec;
    uint64_t seed = o->seed ? o->seed : 1;
    tb_status st = TB_OK;
    size_t pl = o->input_data_dir ? strlen(o->input_data_dir) : 0;
    if (pl > 5 && !strcmp(o->input_data_dir + pl - 5, ".json")) {
        void **bufs;
        int ns;
        TB_TRY(tb_ks_read_json_data(o->input_data_dir, s, o->batch_size, cap < TB_KS_POOL ? cap : TB_KS_POOL,
                                    &bufs, &ns));
        for (int k = 0; k < ns && st == TB_OK; k++) {
            size_t hl;
            st = tb_ks_build_body(s, (const void *const *)(bufs + (size_t)k * (size_t)s->n_inputs), &seed,
                                  &w->reqs[k].body, &w->reqs[k].body_len, &hl);
            if (st == TB_OK) { w->n++; w->ks_header_len = hl; }
        }
        for (int k = 0; k < ns * s->n_inputs; k++) free(bufs[k]);
        free(bufs);
        return st;
    }
    if (o->input_data_dir) {
        void *data[TB_KS_MAX_TENSORS] = {0};
        for (int i = 0; i < s->n_inputs && st == TB_OK; i++)
            st = tb_ks_read_input(o->input_data_dir, &s->inputs[i], o->batch_size > 0 ? o->batch_size : 1, &data[i]);
        size_t hl;
        if (st == TB_OK)
            st = tb_ks_build_body(s, (const void *const *)data, &seed, &w->reqs[0].body, &w->reqs[0].body_len, &hl);
        if (st == TB_OK) { w->n = 1; w->ks_header_len = hl; }
        for (int i = 0; i < s->n_inputs; i++) free(data[i]);
        return st;
    }
    int n = cap < TB_KS_POOL ? cap : TB_KS_POOL;
    size_t bytes = 0;
    /* large tensors: fewer bodies, at most about 64 MiB of them (the HTTP
     * client keeps its own formatted copy of each) */
    for (int i = 0; i < n && st == TB_OK && bytes < ((size_t)64 << 20); i++) {
        size_t hl;
        st = tb_ks_build_body(s, NULL, &seed, &w->reqs[i].body, &w->reqs[i].body_len, &hl);
        if (st == TB_OK) { w->n++; w->ks_header_len = hl; bytes += w->reqs[i].body_len; }
    }
    return st;
}

tb_status tb_workload_load(const tb_workload_options *o, tb_workload **out) {
    *out = NULL;
    int cap = o->n_prompts > 0 ? o->n_prompts : 1000;
    if (cap > TB_WL_MAX_PROMPTS) cap = TB_WL_MAX_PROMPTS;
    tb_workload *w = calloc(1, sizeof *w);
    if (!w) return tb_errorf(TB_ERR_OOM, "workload: out of memory");
    w->reqs = calloc((size_t)cap, sizeof *w->reqs);
    if (!w->reqs) { free(w); return tb_errorf(TB_ERR_OOM, "workload: out of memory"); }
    tb_status st;
    if (o->endpoint == TB_EP_GET) {
        w->n = 1;
        st = TB_OK;
    } else if (o->endpoint == TB_EP_KSERVE) {
        if (o->kserve_spec) st = load_kserve(o, w, cap);
        else if (!o->body_path) st = tb_errorf(TB_ERR_INVALID_ARG, "kserve needs --input, the model's metadata or --body FILE.json");
        else st = load_body(o, w);
    } else if (o->jsonl_path) {
        st = load_jsonl(o, w, cap);
        if (st == TB_OK && w->n == 0) st = tb_errorf(TB_ERR_FORMAT, "%s: no prompts", o->jsonl_path);
    } else if (o->sharegpt_path) {
        st = load_sharegpt(o, w, cap);
    } else {
        if (o->input_len < 1 || o->input_len > TB_WL_MAX_TOKENS || o->output_len < 1 ||
            o->output_len > TB_WL_MAX_TOKENS || o->prefix_len < 0 || o->prefix_len > TB_WL_MAX_TOKENS)
            st = tb_errorf(TB_ERR_INVALID_ARG, "input and output lengths must be in [1, %d]",
                           TB_WL_MAX_TOKENS);
        else st = load_synthetic(o, w, cap);
    }
    if (st != TB_OK) { tb_workload_free(w); return st; }
    w->n_source = w->n;
    if (st == TB_OK && (o->jsonl_path || o->sharegpt_path)) st = cycle_to(w, cap);
    if (st != TB_OK) { tb_workload_free(w); return st; }
    *out = w;
    return TB_OK;
}

char *tb_workload_sample_text(int n_words, uint64_t seed) {
    if (n_words < 1 || n_words > TB_WL_MAX_TOKENS) return NULL;
    char *buf = malloc((size_t)n_words * 8 + 16);
    if (!buf) return NULL;
    size_t k = 0;
    uint64_t s = seed ? seed : 1;
    put_words(buf, &k, n_words, -1, &s);
    buf[k] = 0;
    return buf;
}

void tb_workload_free(tb_workload *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->reqs[i].body);
    free(w->reqs);
    free(w);
}

/* ---------------------------------------------------------------- sessions */

void tb_sessions_free(tb_sessions *s) {
    if (!s) return;
    if (s->user)
        for (int i = 0; i < s->n * s->turns; i++) free(s->user[i]);
    free(s->user);
    free(s->user_words);
    free(s->out_len);
    free(s->id);
    free(s->system);
    free(s);
}

tb_status tb_sessions_create(const tb_workload_options *o, int n, int turns, int system_len, int point,
                             tb_sessions **out) {
    *out = NULL;
    if (n < 1 || n > TB_WL_MAX_PROMPTS || turns < 1 || turns > 1000 || (long)n * turns > TB_WL_MAX_PROMPTS)
        return tb_errorf(TB_ERR_INVALID_ARG, "sessions: conversations in [1, %d], turns in [1, 1000], and at most "
                         "%d requests in all", TB_WL_MAX_PROMPTS, TB_WL_MAX_PROMPTS);
    if (system_len < 0 || system_len > TB_WL_MAX_TOKENS || o->input_len < 1 || o->input_len > TB_WL_MAX_TOKENS ||
        o->output_len < 1 || o->output_len > TB_WL_MAX_TOKENS)
        return tb_errorf(TB_ERR_INVALID_ARG, "sessions: lengths must be in [1, %d] (system prompt [0, %d])",
                         TB_WL_MAX_TOKENS, TB_WL_MAX_TOKENS);
    tb_sessions *s = calloc(1, sizeof *s);
    if (!s) return tb_errorf(TB_ERR_OOM, "workload: out of memory");
    s->n = n;
    s->turns = turns;
    s->system_len = system_len;
    s->model = o->model ? o->model : "";
    s->stream = o->stream;
    s->ignore_eos = o->ignore_eos;
    size_t m = (size_t)n * (size_t)turns;
    s->user = calloc(m, sizeof *s->user);
    s->user_words = calloc(m, sizeof *s->user_words);
    s->out_len = calloc(m, sizeof *s->out_len);
    s->id = calloc((size_t)n, sizeof *s->id);
    uint64_t seed = o->seed ? o->seed : 1;
    if (s->user && s->user_words && s->out_len && s->id && system_len > 0)
        s->system = tb_workload_sample_text(system_len, seed ^ 0x5bd1e995ull);
    if (!s->user || !s->user_words || !s->out_len || !s->id || (system_len > 0 && !s->system)) {
        tb_sessions_free(s);
        return tb_errorf(TB_ERR_OOM, "workload: out of memory");
    }
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + (uint64_t)point * 0xD1B54A32D192ED03ull + 17;
    /* an id unique to the run: a hash of the seed, the point and the clock
     * (two runs against one server must not continue each other's ids) */
    uint64_t tag = rng_next(&r) ^ (uint64_t)(tb_now() * 1e9);
    for (int c = 0; c < n; c++) {
        snprintf(s->id[c], sizeof s->id[c], "conv-%08llx-%d", (unsigned long long)(tag & 0xffffffffull), c);
        for (int t = 0; t < turns; t++) {
            size_t k = (size_t)c * (size_t)turns + (size_t)t;
            int in = draw_len(&r, o->input_len, o->input_stddev);
            s->out_len[k] = draw_len(&r, o->output_len, o->output_stddev);
            char *buf = malloc((size_t)in * 8 + 16);
            if (!buf) { tb_sessions_free(s); return tb_errorf(TB_ERR_OOM, "workload: out of memory"); }
            size_t len = 0;
            /* a different first word per message: nothing after the system
             * prompt is shared between conversations by chance */
            put_words(buf, &len, in, (long)(k * 7 + (size_t)point), &r);
            buf[len] = 0;
            s->user[k] = buf;
            s->user_words[k] = in;
        }
    }
    *out = s;
    return TB_OK;
}

static json_t *chat_msg(const char *role, const char *text, size_t len) {
    json_t *m = json_object();
    if (!m) return NULL;
    json_object_set_new(m, "role", json_string(role));
    json_object_set_new(m, "content", json_stringn(text, len));
    return m;
}

tb_status tb_sessions_body(const tb_sessions *s, int conv, int turn, const char *const *replies,
                           const size_t *reply_len, char **body, size_t *len) {
    *body = NULL;
    *len = 0;
    if (conv < 0 || conv >= s->n || turn < 0 || turn >= s->turns)
        return tb_errorf(TB_ERR_INVALID_ARG, "sessions: no turn %d of conversation %d", turn, conv);
    json_t *b = json_object(), *msgs = json_array();
    if (!b || !msgs) { json_decref(b); json_decref(msgs); return tb_errorf(TB_ERR_OOM, "workload: out of memory"); }
    json_object_set_new(b, "model", json_string(s->model));
    if (s->system) json_array_append_new(msgs, chat_msg("system", s->system, strlen(s->system)));
    for (int t = 0; t <= turn; t++) {
        const char *u = s->user[(size_t)conv * (size_t)s->turns + (size_t)t];
        json_array_append_new(msgs, chat_msg("user", u, strlen(u)));
        if (t < turn)
            json_array_append_new(msgs, chat_msg("assistant", replies[t] ? replies[t] : "", replies[t] ? reply_len[t] : 0));
    }
    json_object_set_new(b, "messages", msgs);
    int out_len = s->out_len[(size_t)conv * (size_t)s->turns + (size_t)turn];
    json_object_set_new(b, "max_tokens", json_integer(out_len));
    json_object_set_new(b, "temperature", json_real(0.0));
    if (s->ignore_eos) {
        json_object_set_new(b, "ignore_eos", json_true());
        json_object_set_new(b, "min_tokens", json_integer(out_len));
    }
    json_object_set_new(b, "stream", json_boolean(s->stream));
    if (s->stream) {
        json_t *so = json_object();
        json_object_set_new(so, "include_usage", json_true());
        json_object_set_new(b, "stream_options", so);
    }
    char *txt = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    if (!txt) return tb_errorf(TB_ERR_OOM, "workload: cannot encode a request");
    *body = txt;
    *len = strlen(txt);
    return TB_OK;
}
