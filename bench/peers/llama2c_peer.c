/*
 * llama2c_peer.c — a plain single-file Llama inference program for the
 * llama2.c checkpoint format, used as the baseline Turbine is compared with.
 *
 * It is deliberately simple: f32 weights mapped from the checkpoint, one
 * row-parallel matrix-vector loop (OpenMP when compiled with -fopenmp), the
 * prompt processed one token at a time, greedy sampling. It is not part of
 * the CMake build; bench/run_cpu.sh compiles it with
 *     gcc -O3 -march=native -fopenmp bench/peers/llama2c_peer.c -lm
 *
 * Usage:
 *   llama2c_peer MODEL.bin [-z TOKENIZER.bin] (-p TEXT | --prompt-ids 1,2,3)
 *                [-n GEN_TOKENS | --steps POSITIONS] [-t THREADS]
 * -n bounds the number of sampled tokens; --steps bounds the number of
 * positions (prompt included), the meaning of llama2.c's -n. The text goes
 * to stdout (the sampled token ids without -z), one timing line to stderr in
 * the format of
 * `turbine run`:
 *   timing: load_ms=X prompt_tokens=N prompt_ms=X prompt_tok_s=X
 *           gen_tokens=N gen_ms=X gen_tok_s=X threads=N
 * prompt_ms covers the forward passes over the prompt (they also yield the
 * first sampled token); gen_ms covers every later forward pass, and
 * gen_tok_s is the number of those passes per second.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_PROMPT_TOKENS 8192

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "llama2c_peer: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(1);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------ checkpoint */

/* The 7-int header of a llama2.c checkpoint. A negative vocab_size means the
 * classifier is stored after the other weights instead of being shared with
 * the embedding. */
typedef struct {
    int dim;        /* model width */
    int hidden_dim; /* feed-forward width */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int vocab_size;
    int seq_len;    /* maximum positions */
} Config;

/* Pointers into the mapped checkpoint. */
typedef struct {
    const float *tok_emb;  /* (vocab, dim) */
    const float *rms_att;  /* (layer, dim) */
    const float *wq;       /* (layer, dim, dim) */
    const float *wk;       /* (layer, kv_dim, dim) */
    const float *wv;       /* (layer, kv_dim, dim) */
    const float *wo;       /* (layer, dim, dim) */
    const float *rms_ffn;  /* (layer, dim) */
    const float *w1;       /* (layer, hidden, dim) */
    const float *w2;       /* (layer, dim, hidden) */
    const float *w3;       /* (layer, hidden, dim) */
    const float *rms_final;/* (dim,) */
    const float *wcls;     /* (vocab, dim) */
} Weights;

/* Every activation buffer and the KV cache, allocated once. */
typedef struct {
    float *x;      /* (dim,) residual stream */
    float *xb;     /* (dim,) */
    float *xb2;    /* (dim,) */
    float *hb;     /* (hidden,) */
    float *hb2;    /* (hidden,) */
    float *q;      /* (dim,) */
    float *att;    /* (n_heads, seq_len) */
    float *logits; /* (vocab,) */
    float *kcache; /* (layer, seq_len, kv_dim) */
    float *vcache; /* (layer, seq_len, kv_dim) */
} RunState;

typedef struct {
    Config c;
    Weights w;
    RunState s;
    void *map;
    size_t map_size;
} Transformer;

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (!p) die("out of memory%s", "");
    return p;
}

static void transformer_build(Transformer *t, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0) die("cannot stat %s", path);
    t->map_size = (size_t)st.st_size;
    if (t->map_size < sizeof(Config)) die("%s: too small", path);
    t->map = mmap(NULL, t->map_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (t->map == MAP_FAILED) die("cannot map %s", path);
    memcpy(&t->c, t->map, sizeof(Config));
    Config *c = &t->c;
    int shared = c->vocab_size > 0;
    if (c->vocab_size < 0) c->vocab_size = -c->vocab_size;
    if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 ||
        c->n_kv_heads <= 0 || c->vocab_size <= 0 || c->seq_len <= 0 ||
        c->dim % c->n_heads != 0 || c->n_heads % c->n_kv_heads != 0)
        die("%s: bad header", path);

    size_t dim = c->dim, hid = c->hidden_dim, L = c->n_layers;
    size_t hs = dim / c->n_heads, kv_dim = hs * c->n_kv_heads;
    size_t need = (size_t)c->vocab_size * dim + L * dim * 2 + L * dim * dim * 2 +
                  L * kv_dim * dim * 2 + L * hid * dim * 3 + dim +
                  (size_t)c->seq_len * hs + (shared ? 0 : (size_t)c->vocab_size * dim);
    if (sizeof(Config) + need * sizeof(float) > t->map_size)
        die("%s: file shorter than its header says", path);

    const float *p = (const float *)((const char *)t->map + sizeof(Config));
    Weights *w = &t->w;
    w->tok_emb = p;   p += (size_t)c->vocab_size * dim;
    w->rms_att = p;   p += L * dim;
    w->wq = p;        p += L * dim * dim;
    w->wk = p;        p += L * kv_dim * dim;
    w->wv = p;        p += L * kv_dim * dim;
    w->wo = p;        p += L * dim * dim;
    w->rms_ffn = p;   p += L * dim;
    w->w1 = p;        p += L * hid * dim;
    w->w2 = p;        p += L * dim * hid;
    w->w3 = p;        p += L * hid * dim;
    w->rms_final = p; p += dim;
    p += (size_t)c->seq_len * hs; /* legacy RoPE tables (cos, sin), unused */
    w->wcls = shared ? w->tok_emb : p;

    RunState *s = &t->s;
    s->x = xcalloc(dim, sizeof(float));
    s->xb = xcalloc(dim, sizeof(float));
    s->xb2 = xcalloc(dim, sizeof(float));
    s->hb = xcalloc(hid, sizeof(float));
    s->hb2 = xcalloc(hid, sizeof(float));
    s->q = xcalloc(dim, sizeof(float));
    s->att = xcalloc((size_t)c->n_heads * c->seq_len, sizeof(float));
    s->logits = xcalloc(c->vocab_size, sizeof(float));
    s->kcache = xcalloc(L * c->seq_len * kv_dim, sizeof(float));
    s->vcache = xcalloc(L * c->seq_len * kv_dim, sizeof(float));
}

static void transformer_free(Transformer *t) {
    RunState *s = &t->s;
    free(s->x); free(s->xb); free(s->xb2); free(s->hb); free(s->hb2);
    free(s->q); free(s->att); free(s->logits); free(s->kcache); free(s->vcache);
    munmap(t->map, t->map_size);
}

/* ------------------------------------------------------------ forward */

static void rmsnorm(float *o, const float *x, const float *weight, int n) {
    float ss = 0.0f;
    for (int j = 0; j < n; j++) ss += x[j] * x[j];
    ss /= n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++) o[j] = weight[j] * (ss * x[j]);
}

static void softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* out (d,) = W (d, n) @ x (n,); rows are split across threads. */
static void matmul(float *out, const float *x, const float *w, int n, int d) {
    int i;
#pragma omp parallel for private(i)
    for (i = 0; i < d; i++) {
        const float *row = w + (size_t)i * n;
        float val = 0.0f;
#pragma omp simd reduction(+ : val)
        for (int j = 0; j < n; j++) val += row[j] * x[j];
        out[i] = val;
    }
}

static float *forward(Transformer *t, int token, int pos) {
    const Config *c = &t->c;
    const Weights *w = &t->w;
    RunState *s = &t->s;
    int dim = c->dim, hid = c->hidden_dim;
    int hs = dim / c->n_heads, kv_dim = hs * c->n_kv_heads;
    int kv_mul = c->n_heads / c->n_kv_heads;
    size_t D = dim, KV = kv_dim, H = hid;

    memcpy(s->x, w->tok_emb + (size_t)token * D, D * sizeof(float));

    for (size_t l = 0; l < (size_t)c->n_layers; l++) {
        rmsnorm(s->xb, s->x, w->rms_att + l * D, dim);

        size_t loff = l * c->seq_len * KV;
        float *k = s->kcache + loff + (size_t)pos * KV;
        float *v = s->vcache + loff + (size_t)pos * KV;
        matmul(s->q, s->xb, w->wq + l * D * D, dim, dim);
        matmul(k, s->xb, w->wk + l * KV * D, dim, kv_dim);
        matmul(v, s->xb, w->wv + l * KV * D, dim, kv_dim);

        /* RoPE on adjacent pairs (the llama2.c layout). */
        for (int i = 0; i < dim; i += 2) {
            int hd = i % hs;
            float freq = 1.0f / powf(10000.0f, hd / (float)hs);
            float val = pos * freq;
            float fcr = cosf(val), fci = sinf(val);
            int rotn = i < kv_dim ? 2 : 1;
            for (int r = 0; r < rotn; r++) {
                float *vec = r == 0 ? s->q : k;
                float v0 = vec[i], v1 = vec[i + 1];
                vec[i] = v0 * fcr - v1 * fci;
                vec[i + 1] = v0 * fci + v1 * fcr;
            }
        }

        int h;
#pragma omp parallel for private(h)
        for (h = 0; h < c->n_heads; h++) {
            const float *q = s->q + (size_t)h * hs;
            float *att = s->att + (size_t)h * c->seq_len;
            size_t koff = (size_t)(h / kv_mul) * hs;
            for (int tt = 0; tt <= pos; tt++) {
                const float *kt = s->kcache + loff + (size_t)tt * KV + koff;
                float score = 0.0f;
                for (int i = 0; i < hs; i++) score += q[i] * kt[i];
                att[tt] = score / sqrtf((float)hs);
            }
            softmax(att, pos + 1);
            float *xb = s->xb + (size_t)h * hs;
            memset(xb, 0, hs * sizeof(float));
            for (int tt = 0; tt <= pos; tt++) {
                const float *vt = s->vcache + loff + (size_t)tt * KV + koff;
                float a = att[tt];
                for (int i = 0; i < hs; i++) xb[i] += a * vt[i];
            }
        }

        matmul(s->xb2, s->xb, w->wo + l * D * D, dim, dim);
        for (int i = 0; i < dim; i++) s->x[i] += s->xb2[i];

        rmsnorm(s->xb, s->x, w->rms_ffn + l * D, dim);
        matmul(s->hb, s->xb, w->w1 + l * H * D, dim, hid);
        matmul(s->hb2, s->xb, w->w3 + l * H * D, dim, hid);
        for (int i = 0; i < hid; i++) {
            float val = s->hb[i];
            val *= 1.0f / (1.0f + expf(-val));
            s->hb[i] = val * s->hb2[i];
        }
        matmul(s->xb, s->hb, w->w2 + l * D * H, hid, dim);
        for (int i = 0; i < dim; i++) s->x[i] += s->xb[i];
    }

    rmsnorm(s->x, s->x, w->rms_final, dim);
    matmul(s->logits, s->x, w->wcls, dim, c->vocab_size);
    return s->logits;
}

/* ------------------------------------------------------------ tokenizer */

typedef struct {
    const char *str;
    int id;
} TokenIndex;

typedef struct {
    char **vocab;
    float *scores;
    TokenIndex *sorted; /* vocab sorted by string, for lookups */
    int vocab_size;
    unsigned max_token_length;
    unsigned char byte_pieces[512]; /* "c\0" for every byte c */
} Tokenizer;

static int token_index_cmp(const void *a, const void *b) {
    return strcmp(((const TokenIndex *)a)->str, ((const TokenIndex *)b)->str);
}

static void tokenizer_build(Tokenizer *t, const char *path, int vocab_size) {
    t->vocab_size = vocab_size;
    t->vocab = xcalloc(vocab_size, sizeof(char *));
    t->scores = xcalloc(vocab_size, sizeof(float));
    for (int i = 0; i < 256; i++) {
        t->byte_pieces[i * 2] = (unsigned char)i;
        t->byte_pieces[i * 2 + 1] = 0;
    }
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s", path);
    int mtl;
    if (fread(&mtl, sizeof(int), 1, f) != 1 || mtl <= 0 || mtl > 1024)
        die("%s: bad header", path);
    t->max_token_length = (unsigned)mtl;
    for (int i = 0; i < vocab_size; i++) {
        int len;
        if (fread(&t->scores[i], sizeof(float), 1, f) != 1 ||
            fread(&len, sizeof(int), 1, f) != 1 || len < 0 || len > 1024)
            die("%s: truncated or corrupt", path);
        t->vocab[i] = xcalloc((size_t)len + 1, 1);
        if (fread(t->vocab[i], 1, (size_t)len, f) != (size_t)len)
            die("%s: truncated", path);
    }
    fclose(f);
    t->sorted = xcalloc(vocab_size, sizeof(TokenIndex));
    for (int i = 0; i < vocab_size; i++) {
        t->sorted[i].str = t->vocab[i];
        t->sorted[i].id = i;
    }
    qsort(t->sorted, vocab_size, sizeof(TokenIndex), token_index_cmp);
}

static void tokenizer_free(Tokenizer *t) {
    if (!t->vocab) return;
    for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted);
}

static int str_lookup(const Tokenizer *t, const char *s) {
    TokenIndex key = {s, 0};
    const TokenIndex *r =
        bsearch(&key, t->sorted, t->vocab_size, sizeof(TokenIndex), token_index_cmp);
    return r ? r->id : -1;
}

/* BOS, a leading-space token, one token per UTF-8 code point (raw bytes + 3
 * when the code point is not in the vocabulary), then greedy merges of the
 * adjacent pair with the highest score until none applies. */
static int tokenizer_encode(const Tokenizer *t, const char *text, int *tokens, int max) {
    size_t tl = strlen(text);
    if ((size_t)max < tl + 3) die("prompt too long%s", "");
    char *buf = xcalloc((size_t)t->max_token_length * 2 + 3, 1);
    int n = 0;
    tokens[n++] = 1;
    if (text[0] != '\0') {
        int sp = str_lookup(t, " ");
        if (sp >= 0) tokens[n++] = sp;
    }
    size_t len = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) len = 0;
        buf[len++] = *c;
        buf[len] = '\0';
        if ((c[1] & 0xC0) == 0x80 && len < 4) continue;
        int id = str_lookup(t, buf);
        if (id >= 0) {
            tokens[n++] = id;
        } else {
            for (size_t i = 0; i < len; i++) tokens[n++] = (unsigned char)buf[i] + 3;
        }
        len = 0;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1, best_at = -1;
        for (int i = 0; i + 1 < n; i++) {
            const char *a = t->vocab[tokens[i]], *b = t->vocab[tokens[i + 1]];
            if (strlen(a) + strlen(b) > t->max_token_length * 2) continue;
            sprintf(buf, "%s%s", a, b);
            int id = str_lookup(t, buf);
            if (id >= 0 && t->scores[id] > best) {
                best = t->scores[id];
                best_id = id;
                best_at = i;
            }
        }
        if (best_at < 0) break;
        tokens[best_at] = best_id;
        memmove(tokens + best_at + 1, tokens + best_at + 2,
                (size_t)(n - best_at - 2) * sizeof(int));
        n--;
    }
    free(buf);
    return n;
}

/* The text of `token` following `prev`: the space after BOS is dropped and
 * "<0xNN>" pieces become the raw byte. */
static const char *tokenizer_decode(Tokenizer *t, int prev, int token) {
    const char *piece = t->vocab[token];
    if (prev == 1 && piece[0] == ' ') piece++;
    unsigned char byte;
    if (sscanf(piece, "<0x%02hhX>", &byte) == 1)
        piece = (const char *)t->byte_pieces + byte * 2;
    return piece;
}

static void print_piece(const char *piece) {
    if (!piece || !piece[0]) return;
    if (piece[1] == '\0') {
        unsigned char b = (unsigned char)piece[0];
        if (!(isprint(b) || isspace(b))) return;
    }
    fputs(piece, stdout);
}

/* ------------------------------------------------------------ main */

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int parse_ids(const char *s, int *ids, int max) {
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > 0x7fffffff) die("bad --prompt-ids: %s", s);
        if (n >= max) die("too many prompt ids%s", "");
        ids[n++] = (int)v;
        s = end;
        if (*s == ',') s++;
    }
    return n;
}

static void usage(void) {
    fprintf(stderr,
            "usage: llama2c_peer MODEL.bin [-z TOKENIZER.bin] (-p TEXT | --prompt-ids 1,2,3)\n"
            "                    [-n GEN_TOKENS | --steps POSITIONS] [-t THREADS]\n");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    const char *model = argv[1], *tok_path = NULL, *text = NULL, *ids_arg = NULL;
    long n_gen = 256, steps = -1;
    int threads = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(a, "-z")) tok_path = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "-i")) text = v;
        else if (!strcmp(a, "--prompt-ids")) ids_arg = v;
        else if (!strcmp(a, "-n")) n_gen = atol(v);
        else if (!strcmp(a, "--steps")) steps = atol(v);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) threads = atoi(v);
        else usage();
    }
    if (!text == !ids_arg) usage();
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
    threads = omp_get_max_threads();
#else
    threads = 1;
#endif

    double t0 = now_ms();
    static Transformer tr;
    transformer_build(&tr, model);
    static Tokenizer tk;
    if (tok_path) tokenizer_build(&tk, tok_path, tr.c.vocab_size);
    double load_ms = now_ms() - t0;

    static int prompt[MAX_PROMPT_TOKENS];
    int n_prompt;
    if (text) {
        if (!tok_path) die("-p needs -z TOKENIZER%s", "");
        n_prompt = tokenizer_encode(&tk, text, prompt, MAX_PROMPT_TOKENS);
    } else {
        n_prompt = parse_ids(ids_arg, prompt, MAX_PROMPT_TOKENS);
    }
    if (n_prompt < 1) die("empty prompt%s", "");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= tr.c.vocab_size) die("prompt id out of range%s", "");
    if (steps > 0) n_gen = steps - n_prompt + 1;
    if (n_gen < 0) n_gen = 0;
    if (n_prompt + n_gen - 1 > tr.c.seq_len) {
        n_gen = tr.c.seq_len - n_prompt + 1;
        if (n_gen < 0) die("prompt longer than the model's seq_len%s", "");
    }

    /* Positions 0..n_prompt-1 consume the prompt; every later position
     * consumes the token sampled before it. */
    double t_start = now_ms(), t_prompt_end = t_start;
    long gen = 0;
    int token = prompt[0];
    for (int pos = 0; pos < n_prompt + n_gen - 1; pos++) {
        float *logits = forward(&tr, token, pos);
        int next;
        if (pos < n_prompt - 1) {
            next = prompt[pos + 1];
        } else {
            next = argmax(logits, tr.c.vocab_size);
            gen++;
            if (pos == n_prompt - 1) t_prompt_end = now_ms();
        }
        if (next == 1 && pos >= n_prompt - 1) break;
        if (tok_path) {
            print_piece(tokenizer_decode(&tk, token, next));
            fflush(stdout);
        } else if (pos >= n_prompt - 1) {
            printf("%s%d", gen > 1 ? " " : "", next);
        }
        token = next;
    }
    double t_end = now_ms();
    if (n_gen == 0) t_prompt_end = t_end;
    printf("\n");

    double prompt_ms = t_prompt_end - t_start, gen_ms = t_end - t_prompt_end;
    long decode_steps = gen > 0 ? gen - 1 : 0;
    fprintf(stderr,
            "timing: load_ms=%.3f prompt_tokens=%d prompt_ms=%.3f prompt_tok_s=%.3f "
            "gen_tokens=%ld gen_ms=%.3f gen_tok_s=%.3f threads=%d\n",
            load_ms, n_prompt, prompt_ms, prompt_ms > 0 ? n_prompt / (prompt_ms / 1e3) : 0.0,
            gen, gen_ms, gen_ms > 0 ? decode_steps / (gen_ms / 1e3) : 0.0, threads);

    tokenizer_free(&tk);
    transformer_free(&tr);
    return 0;
}
