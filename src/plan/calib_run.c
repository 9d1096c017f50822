/* calib_run.c — the build's calibration step (calib_run.h): an f32 engine in
 * memory, run over the calibration tokens with the statistics collector as
 * the node observer; or the calibration cache. */
#include "plan/calib_run.h"

#include <ctype.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "models/models.h"
#include "opt/opt.h"
#include "plan/engine.h"
#include "runtime/runtime.h"

/* ---------------------------------------------------------------- fingerprint */

tb_status tb_model_fingerprint(const tb_model_source *src, uint64_t *out) {
    const tb_model_config *c = tb_source_config(src);
    /* the fields that change what the model computes (not its dtype on disk:
     * an f16 and an f32 copy of one model calibrate differently, so the bytes
     * below tell them apart anyway) */
    struct {
        char arch[32];
        int32_t v[10];
        float f[5];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    memcpy(cfg.arch, c->arch, sizeof cfg.arch);
    int32_t v[10] = {c->vocab_size, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
                     c->rope_interleaved, c->tie_embeddings, c->attn_bias};
    memcpy(cfg.v, v, sizeof v);
    float f[5] = {c->norm_eps, c->rope_theta, c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor};
    memcpy(cfg.f, f, sizeof f);
    uint64_t h[2] = {tb_hash64(&cfg, sizeof cfg), 0};
    int n = tb_source_tensor_count(src);
    for (int i = 0; i < n; i++) {
        const tb_src_tensor *t = tb_source_tensor_at(src, i);
        struct {
            char name[128];
            int64_t dims[4];
            int32_t dtype, rank;
            uint64_t data;
        } th;
        memset(&th, 0, sizeof th);
        memcpy(th.name, t->name, sizeof th.name);
        memcpy(th.dims, t->dims, sizeof th.dims);
        th.dtype = (int32_t)t->dtype;
        th.rank = t->rank;
        th.data = tb_hash64(t->data, t->nbytes);
        h[1] = tb_hash64(&th, sizeof th);
        h[0] = tb_hash64(h, sizeof h);
    }
    *out = h[0];
    return TB_OK;
}

/* ---------------------------------------------------------------- tokens */

static int looks_like_ids(const char *t, size_t n) {
    int digits = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)t[i];
        if (isdigit(ch)) digits = 1;
        else if (!isspace(ch) && ch != ',') return 0;
    }
    return digits;
}

tb_status tb_calib_read_tokens(const char *path, const tb_tokenizer *tok, int vocab, int max_tokens, int32_t **ids,
                               int *n_out) {
    *ids = NULL;
    *n_out = 0;
    char *text = NULL;
    size_t len = 0;
    TB_TRY(tb_file_read_all(path, &text, &len, TB_CALIB_MAX_FILE));
    tb_status s = TB_OK;
    int n = 0;
    int32_t *v = NULL;
    if (looks_like_ids(text, len)) {
        v = malloc(sizeof(int32_t) * (size_t)(max_tokens > 0 ? max_tokens : 1));
        if (!v) { free(text); return tb_errorf(TB_ERR_OOM, "out of memory"); }
        char *p = text;
        while (n < max_tokens) {
            while (*p && (isspace((unsigned char)*p) || *p == ',')) p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long id = strtol(p, &end, 10);
            if (end == p || errno || id < 0 || id >= vocab) {
                s = tb_errorf(TB_ERR_INVALID_ARG, "%s: token id %.20s is outside the vocabulary [0, %d)", path, p,
                              vocab);
                break;
            }
            v[n++] = (int32_t)id;
            p = end;
        }
    } else {
        /* only a prefix is needed: a token holds at least one byte, so
         * encode growing prefixes (cut at a character boundary) until one
         * gives max_tokens; the tokens far from the cut are the whole
         * text's */
        size_t pre = (size_t)max_tokens * 16;
        for (;;) {
            if (pre > len) pre = len;
            while (pre < len && pre > 0 && ((unsigned char)text[pre] & 0xc0) == 0x80) pre--;
            int cap = (int)pre + 2;
            free(v);
            v = malloc(sizeof(int32_t) * (size_t)cap);
            if (!v) { free(text); return tb_errorf(TB_ERR_OOM, "out of memory"); }
            s = tb_tokenizer_encode(tok, text, pre, tb_tokenizer_add_bos(tok), v, cap, &n);
            if (s != TB_OK) { tb_error_prefix(s, "cannot tokenize %s", path); break; }
            if (n > max_tokens + 16 || pre == len) break; /* + 16: clear of the cut */
            pre *= 2;
        }
        if (n > max_tokens) n = max_tokens;
    }
    free(text);
    if (s == TB_OK && n < 2) s = tb_errorf(TB_ERR_INVALID_ARG, "%s holds %d calibration tokens; at least 2 needed",
                                           path, n);
    if (s != TB_OK) { free(v); return s; }
    *ids = v;
    *n_out = n;
    return TB_OK;
}

/* ---------------------------------------------------------------- the run */

static void draw_progress(int done, int total, int tty, int *last_quarter) {
    if (tty) {
        int width = 40, fill = total ? (int)((long)done * width / total) : width;
        fprintf(stderr, "\rcalibrating [");
        for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d tokens", done, total);
        if (done >= total) fputc('\n', stderr);
    } else { /* a log: one line per quarter */
        int q = total ? (int)((long)done * 4 / total) : 4;
        if (q <= *last_quarter) return;
        *last_quarter = q;
        fprintf(stderr, "calibrating: %d/%d tokens\n", done, total);
    }
    fflush(stderr);
}

/* An LLM engine around an f32 graph and a borrowed tokenizer (no file): what
 * tb_context_create needs of it. Free with free_mem_engine. */
static tb_status mem_engine(tb_graph *g, const tb_tokenizer *tok, const tb_model_config *c, int max_seq, int max_step,
                            tb_engine **out) {
    tb_engine *e = calloc(1, sizeof *e);
    if (!e) { tb_graph_free(g); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    e->map.fd = -1;
    e->borrowed = 1;
    e->graph = g;
    e->tok = (tb_tokenizer *)tok;
    snprintf(e->backend, sizeof e->backend, "cpu");
    snprintf(e->info.arch, sizeof e->info.arch, "%s", c->arch);
    e->info.vocab_size = c->vocab_size;
    e->info.dim = c->dim;
    e->info.n_layers = c->n_layers;
    e->info.n_heads = c->n_heads;
    e->info.n_kv_heads = c->n_kv_heads;
    e->info.head_dim = c->head_dim;
    e->info.hidden_dim = c->hidden_dim;
    e->info.max_seq_len = max_seq;
    e->info.max_batch = 1;
    e->info.bos_id = -1;
    for (int i = 0; i < 4; i++) e->info.eos_ids[i] = -1;
    e->info.weight_dtype = TB_F32;
    e->max_step_tokens = max_step;
    e->rope_interleaved = c->rope_interleaved;
    e->meta_json = strdup("{}");
    e->hw_json = tb_backend_fingerprint("cpu");
    *out = e;
    if (!e->meta_json || !e->hw_json) return e->hw_json ? tb_errorf(TB_ERR_OOM, "out of memory") : TB_ERR_HARDWARE;
    return TB_OK;
}

static void free_mem_engine(tb_engine *e) {
    if (!e) return;
    e->tok = NULL; /* borrowed */
    tb_engine_free(e);
}

static tb_status run_calibration(const tb_model_source *src, const tb_tokenizer *tok, const tb_build_options *o,
                                 const tb_calibrator *cal, uint64_t fp, int max_seq, int progress,
                                 tb_calib_table **out) {
    const tb_model_config *c = tb_source_config(src);
    int want = o->calib_tokens > 0 ? o->calib_tokens : TB_CALIB_DEFAULT_TOKENS;
    int32_t *ids = NULL;
    int n = 0;
    TB_TRY(tb_calib_read_tokens(o->calib, tok, c->vocab_size, want, &ids, &n));
    if (n < want)
        tb_log(TB_LOG_WARN, "calibration: %s holds %d tokens, fewer than the %d asked (--calib-tokens)", o->calib, n,
               want);
    double t0 = tb_now(), cpu0 = (double)clock() / CLOCKS_PER_SEC;
    int max_step = max_seq < 512 ? max_seq : 512;
    if (max_step < 16) max_step = 16;
    tb_model_build_opts mo = {.weight_dtype = TB_F32, .max_seq_len = max_seq, .max_step_tokens = max_step};
    tb_graph *g = NULL;
    tb_engine *e = NULL;
    tb_context *ctx = NULL;
    tb_calib_stats *st = NULL;
    tb_status s;
    if ((s = tb_model_build_graph(src, &mo, &g)) != TB_OK) goto done;
    tb_opt_options oo;
    memset(&oo, 0, sizeof oo);
    snprintf(oo.device, sizeof oo.device, "cpu");
    oo.dtype = TB_F32;
    int n_passes;
    const tb_pass *passes = tb_opt_llm_pipeline(&n_passes);
    if ((s = tb_opt_run(g, passes, n_passes, &oo)) != TB_OK) { tb_graph_free(g); goto done; }
    if ((s = mem_engine(g, tok, c, max_seq, max_step, &e)) != TB_OK) goto done;
    tb_context_options co;
    tb_context_options_default(&co);
    co.n_threads = o->calib_threads;
    co.max_seqs = 1;
    co.no_prefix_cache = 1;
    co.device = "cpu";
    if ((s = tb_context_create(e, &co, &ctx)) != TB_OK) goto done;
    if ((s = tb_calib_stats_create(e->graph, TB_CALIB_SAMPLE_ROWS, &st)) != TB_OK) goto done;
    if ((s = tb_context_set_observer(ctx, tb_calib_observe, st)) != TB_OK) goto done;
    /* windows of the context, each a fresh sequence, fed in steps of the
     * profile; every row's logits so the LM head sees every token's input */
    int tty = isatty(2), quarter = 0, done_tok = 0;
    if (progress) draw_progress(0, n, tty, &quarter);
    for (int w0 = 0; w0 < n; w0 += max_seq) {
        int wlen = n - w0 < max_seq ? n - w0 : max_seq;
        if ((s = tb_seq_reset(ctx, 0)) != TB_OK) goto done;
        for (int p = 0; p < wlen; p += max_step) {
            int len = wlen - p < max_step ? wlen - p : max_step;
            tb_seq_chunk ch = {0, len, ids + w0 + p, 2};
            if ((s = tb_context_step(ctx, &ch, 1, NULL, NULL)) != TB_OK) {
                tb_error_prefix(s, "calibration step at token %d", w0 + p);
                goto done;
            }
            done_tok += len;
            if (progress) draw_progress(done_tok, n, tty, &quarter);
        }
    }
    double t_run = tb_now() - t0, cpu_run = (double)clock() / CLOCKS_PER_SEC - cpu0;
    s = tb_calib_table_from_stats(st, cal, fp, n, out);
    if (s == TB_OK)
        tb_log(TB_LOG_INFO, "calibration: %d tokens through %d matmuls: run %.2f s (%.2f s of CPU, statistics %.2f s), "
               "%s thresholds %.2f s", n, (*out)->n, t_run, cpu_run, tb_calib_stats_seconds(st), (*out)->calibrator,
               tb_now() - t0 - t_run);
done:
    tb_calib_stats_free(st);
    tb_context_free(ctx);
    free_mem_engine(e);
    free(ids);
    return s;
}

tb_status tb_calibrate_for_build(const tb_model_source *src, const tb_tokenizer *tok, const tb_build_options *o,
                                 int max_seq_len, int progress, tb_calib_table **out) {
    *out = NULL;
    tb_calibrator cal;
    TB_TRY(tb_calibrator_parse(o->calibrator, &cal));
    char cal_name[48];
    tb_calibrator_name(&cal, cal_name, sizeof cal_name);
    if (o->calib_tokens < 0) return tb_errorf(TB_ERR_INVALID_ARG, "--calib-tokens must be positive");
    uint64_t fp;
    TB_TRY(tb_model_fingerprint(src, &fp));
    if (o->calib_cache && *o->calib_cache && tb_file_exists(o->calib_cache)) {
        tb_status s = tb_calib_cache_read(o->calib_cache, cal_name, fp, out);
        if (s == TB_OK) {
            tb_log(TB_LOG_INFO, "calibration: %d scales from the cache %s (no model run)", (*out)->n, o->calib_cache);
            if (progress) fprintf(stderr, "calibration: %d scales read from %s\n", (*out)->n, o->calib_cache);
        }
        return s;
    }
    if (!o->calib || !*o->calib)
        return tb_errorf(TB_ERR_INVALID_ARG, "calibration needs --calib FILE (the cache %s does not exist yet)",
                         o->calib_cache ? o->calib_cache : "");
    TB_TRY(run_calibration(src, tok, o, &cal, fp, max_seq_len, progress, out));
    if (o->calib_cache && *o->calib_cache) {
        tb_status s = tb_calib_cache_write(o->calib_cache, *out);
        if (s != TB_OK) { tb_calib_table_free(*out); *out = NULL; return s; }
    }
    return TB_OK;
}
