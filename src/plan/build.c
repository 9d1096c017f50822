/* build.c — `turbine build`: import, build the graph, tune, write the engine. */
#include <jansson.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "import/import.h"
#include "models/models.h"
#include "opt/opt.h"
#include "plan/calib_run.h"
#include "plan/engine.h"
#include "tune/tactic.h"
#include "tune/tune.h"

void tb_build_options_default(tb_build_options *o) {
    memset(o, 0, sizeof *o);
    o->weight_dtype = TB_F32;
    o->max_batch = 8;
}

static void progress_bar(void *arg, int done, int total) {
    (void)arg;
    int width = 40, fill = total ? done * width / total : width;
    fprintf(stderr, "\rbuilding  [");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %3d%%", total ? done * 100 / total : 100);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

/* The quantize pass's AWQ hook (opt.h): searches a group's in_scale on
 * the calibration statistics of its input. */
typedef struct {
    const tb_calib_table *calib;
    int verbose;
} awq_ctx;

static tb_status awq_search_hook(void *user, const char *weight, const float *w, int N, int K, int group, int asym,
                                 const int *tie, int n_tie, float *in_scale, int *found) {
    const awq_ctx *a = user;
    const tb_calib_entry *e = tb_calib_find(a->calib, weight);
    *found = 0;
    if (!e || !e->mean_abs) return TB_OK; /* a cache without channel statistics: round to nearest */
    if (e->K != K) return tb_errorf(TB_ERR_INVALID_ARG, "calibration of %s has %d channels, the weight %d", weight, e->K, K);
    const float *mean = e->mean_abs;
    float *tied = NULL;
    if (tie) { /* channels of one class share one multiplier: the class mean of mean |x| */
        tied = calloc((size_t)K + (size_t)n_tie * 2, sizeof(float));
        if (!tied) return tb_errorf(TB_ERR_OOM, "out of memory");
        float *sum = tied + K, *cnt = sum + n_tie;
        for (int k = 0; k < K; k++) sum[tie[k]] += e->mean_abs[k], cnt[tie[k]] += 1;
        for (int k = 0; k < K; k++) tied[k] = sum[tie[k]] / cnt[tie[k]];
        mean = tied;
    }
    tb_awq_report rep;
    tb_status st = tb_awq_search(w, N, K, mean, e->rows, e->rows ? e->n_rows : 0, group, asym, in_scale, &rep);
    free(tied);
    TB_TRY(st);
    *found = 1;
    if (a->verbose)
        tb_log(TB_LOG_INFO, "awq %s (%d x %d, %d rows): alpha %.2f, output error %.4g of round to nearest's %.4g "
               "(ratio %.3f)", weight, N, K, e->rows ? e->n_rows : 0, (double)rep.alpha, rep.err_best, rep.err_rtn,
               rep.err_rtn > 0 ? rep.err_best / rep.err_rtn : 1.0);
    return TB_OK;
}

/* The quantize pass's AWQ clip hook (opt.h): bounds per row and group on
 * the sampled input rows of `weight` (or its channel means). */
static tb_status awq_clip_hook(void *user, const char *weight, const char *part, const float *w, int N, int K,
                               int group, int asym, const float *in_scale, float *bound, int *found) {
    const awq_ctx *a = user;
    const tb_calib_entry *e = tb_calib_find(a->calib, weight);
    *found = 0;
    if (!e || (!e->rows && !e->mean_abs)) return TB_OK;
    if (e->K != K) return tb_errorf(TB_ERR_INVALID_ARG, "calibration of %s has %d channels, the weight %d", weight, e->K, K);
    tb_awq_clip_report rep;
    TB_TRY(tb_awq_clip(w, N, K, e->rows, e->rows ? e->n_rows : 0, e->mean_abs, in_scale, group, asym, bound, &rep));
    *found = 1;
    if (a->verbose)
        tb_log(TB_LOG_INFO, "awq clip %s (%d x %d): mean range %.3f, group output error %.4g of unclipped %.4g "
               "(ratio %.3f)", part, N, K, rep.mean_ratio, rep.err_best, rep.err_rtn,
               rep.err_rtn > 0 ? rep.err_best / rep.err_rtn : 1.0);
    return TB_OK;
}

/* Lays the weights out 64-byte aligned in one buffer and records offsets.
 * With `release`, each owned weight is freed as soon as it is copied (its
 * data then NULL) and a borrowed one's mapped pages are given back: the
 * buffer's pages are touched only as they are filled, so the peak is the
 * weights once, not twice. The buffer starts zeroed (calloc: fresh pages
 * for large sizes) and whole zero chunks of a weight are not copied, so the
 * zero weights of a shape-only checkpoint (torch_ckpt.py --empty) are never
 * made resident; the engine writer leaves them as holes. */
#define PACK_CHUNK ((size_t)1 << 20)
static tb_status pack_weights(tb_graph *g, int release, uint8_t **out, uint64_t *size) {
    uint64_t off = 0;
    for (int i = 0; i < g->n_values; i++) {
        tb_value *v = &g->values[i];
        if (v->kind != TB_VAL_WEIGHT) continue;
        v->offset = off;
        off = (off + v->nbytes + 63) / 64 * 64;
    }
    uint8_t *buf = calloc(off ? (size_t)off : 64, 1);
    if (!buf) return tb_errorf(TB_ERR_OOM, "out of memory packing %llu bytes of weights", (unsigned long long)off);
    for (int i = 0; i < g->n_values; i++) {
        tb_value *v = &g->values[i];
        if (v->kind != TB_VAL_WEIGHT) continue;
        const uint8_t *src = v->data;
        for (uint64_t d = 0; d < v->nbytes; d += PACK_CHUNK) {
            size_t len = v->nbytes - d < PACK_CHUNK ? (size_t)(v->nbytes - d) : PACK_CHUNK;
            if (!tb_all_zero(src + d, len)) memcpy(buf + v->offset + d, src + d, len);
        }
        if (release && v->owned) {
            free((void *)v->data);
            v->data = NULL;
            v->owned = 0;
        } else if (release) { /* borrowed from the mapped source (models.h source_weights) */
            tb_file_release_pages(v->data, (size_t)v->nbytes);
        }
    }
    *out = buf;
    *size = off;
    return TB_OK;
}

tb_status tb_pack_weights(tb_graph *g, uint8_t **out, uint64_t *size) { return pack_weights(g, 0, out, size); }

tb_status tb_build(const char *model_path, const char *engine_path, const tb_build_options *opt,
                   tb_build_report *report) {
    if (tb_is_onnx_path(model_path)) return tb_build_onnx(model_path, engine_path, opt, report);
    double t0 = tb_now();
    tb_build_options o;
    if (opt) o = *opt; else tb_build_options_default(&o);
    int quant = tb_dtype_is_quant(o.weight_dtype);
    if (o.weight_dtype != TB_F32 && o.weight_dtype != TB_F16 && o.weight_dtype != TB_BF16 && !quant)
        return tb_errorf(TB_ERR_UNSUPPORTED, "engine dtype %s is not supported (use f32, f16, bf16, int8, int4 or fp8)",
                         tb_dtype_name(o.weight_dtype));
    if (!o.group_size) o.group_size = TB_INT4_DEFAULT_GROUP;
    if (o.group_size != 32 && o.group_size != 64 && o.group_size != 128)
        return tb_errorf(TB_ERR_INVALID_ARG, "--group-size %d: int4 groups are 32, 64 or 128 weights", o.group_size);
    if (o.zero_point && o.weight_dtype != TB_I4)
        return tb_errorf(TB_ERR_INVALID_ARG, "--zero-point is for --dtype int4 (int8 and fp8 are symmetric)");
    /* AWQ searches its scales on calibration activations: without them there
     * is nothing to search */
    if (o.awq && o.weight_dtype != TB_I4)
        return tb_errorf(TB_ERR_INVALID_ARG, "--awq is for --dtype int4 (int8 and fp8 keep one scale per output "
                         "channel), not %s", tb_dtype_name(o.weight_dtype));
    if (o.awq && !(o.calib && *o.calib) && !(o.calib_cache && *o.calib_cache))
        return tb_errorf(TB_ERR_INVALID_ARG, "--awq needs calibration data: pass --calib FILE (text the model's "
                         "tokenizer reads) or --calib-cache FILE (a cache with channel statistics)");
    if (o.qmm_tactics < TB_QMM_TACTICS_AUTO || o.qmm_tactics > TB_QMM_TACTICS_Q8)
        return tb_errorf(TB_ERR_INVALID_ARG, "qmm_tactics %d: want auto (0), exact (1) or q8 (2)", o.qmm_tactics);
    int retype = quant || o.n_overrides > 0; /* the quantize pass gives the weights their dtypes */
    /* the target device, parsed once: "cpu" or "cuda" (both build every dtype) */
    char dev_kind[16];
    int dev_index;
    tb_status ds = tb_device_parse(o.device, dev_kind, &dev_index);
    if (ds != TB_OK) return ds;
    const int cpu = !strcmp(dev_kind, "cpu");
    if (o.max_batch <= 0 || o.max_batch > 1024) return tb_errorf(TB_ERR_INVALID_ARG, "--max-batch must be in [1, 1024]");
    int tp = o.tp > 1 ? o.tp : 1;
    if (o.tp < 0 || tp > TB_MAX_TP || (tp & (tp - 1)))
        return tb_errorf(TB_ERR_INVALID_ARG, "--tp %d: tensor parallelism takes 1, 2, 4 or 8 ranks", o.tp);
    if (tp > 1 && o.awq)
        return tb_errorf(TB_ERR_UNSUPPORTED, "--awq with --tp %d: AWQ's per-channel search is not split across "
                         "ranks yet (int4 round-to-nearest, int8 and fp8 are)", tp);
    if (o.max_seq_len < 0) return tb_errorf(TB_ERR_INVALID_ARG, "--max-seq-len must be positive");
    tb_model_source *src = NULL;
    tb_tokenizer *tok = NULL;
    tb_graph *g = NULL;
    uint8_t *tok_buf = NULL, *graph_buf = NULL, *weights = NULL;
    /* ranks past 0 of a tensor-parallel engine: graph and weight sections */
    uint8_t *rank_graph[TB_MAX_TP] = {0}, *rank_weights[TB_MAX_TP] = {0};
    size_t rank_graph_n[TB_MAX_TP] = {0};
    uint64_t rank_weights_n[TB_MAX_TP] = {0};
    tb_quant_calib *qc = NULL;
    char *meta = NULL, *hw = NULL;
    tb_calib_table *calib = NULL; /* activation statistics for the quantization pass */
    size_t tok_n = 0, graph_n = 0;
    uint64_t weights_n = 0;
    tb_status s;
    if ((s = tb_source_open(model_path, &src)) != TB_OK) goto done;
    const tb_model_config *c = tb_source_config(src);

    /* tokenizer: --tokenizer wins, else the model's own */
    const char *tpath = o.tokenizer_path && *o.tokenizer_path ? o.tokenizer_path : tb_source_tokenizer_path(src);
    if (!tpath || !*tpath) {
        s = tb_errorf(TB_ERR_NOT_FOUND, "%s has no tokenizer.json; pass --tokenizer FILE (a tokenizer.json or a "
                                        "llama2.c tokenizer.bin)", model_path);
        goto done;
    }
    const char *cfg_dir = tb_source_dir(src);
    if ((s = tb_tokenizer_load(tpath, cfg_dir && *cfg_dir ? cfg_dir : NULL, &tok)) != TB_OK) goto done;
    if (tb_tokenizer_vocab_size(tok) > c->vocab_size) {
        s = tb_errorf(TB_ERR_FORMAT, "tokenizer %s has %d tokens but the model's vocabulary is %d", tpath,
                      tb_tokenizer_vocab_size(tok), c->vocab_size);
        goto done;
    }
    /* Fewer is how models pad their vocabulary (Qwen2: 151936 rows for 151665
     * tokens), so it builds; the ids past the tokenizer print as U+FFFD
     * (tb_tokenizer_piece), and the warning says so. */
    if (tb_tokenizer_vocab_size(tok) < c->vocab_size)
        tb_log(TB_LOG_WARN,
               "tokenizer %s has %d tokens but the model's vocabulary is %d: ids %d to %d have no text and print "
               "as U+FFFD",
               tpath, tb_tokenizer_vocab_size(tok), c->vocab_size, tb_tokenizer_vocab_size(tok), c->vocab_size - 1);
    /* special tokens: the model's config wins where it says something */
    int32_t eos[TB_MAX_EOS];
    int n_eos = tb_tokenizer_eos(tok, eos, TB_MAX_EOS);
    int bos = tb_tokenizer_bos(tok);
    if (c->n_eos > 0) {
        n_eos = c->n_eos;
        for (int i = 0; i < n_eos; i++) eos[i] = c->eos_ids[i];
    }
    if (c->bos_id >= 0) bos = c->bos_id;
    int add_bos = tb_tokenizer_add_bos(tok);
    tb_tokenizer_set_special(tok, bos, eos, n_eos, add_bos);

    int max_seq = o.max_seq_len ? o.max_seq_len : c->max_seq_len;
    if (max_seq <= 0) max_seq = 2048;
    if (c->max_seq_len > 0 && max_seq > c->max_seq_len)
        tb_log(TB_LOG_WARN, "--max-seq-len %d exceeds the model's %d positions", max_seq, c->max_seq_len);
    /* tokens a step carries: GPU engines take 2048 (several prompts a step:
     * the 256-stream prefill of docs/GPU.md 10% faster), at most the whole
     * contexts of max_batch sequences; CPU ones 512, at most one context */
    const int64_t all_ctx = (int64_t)max_seq * (o.max_batch > 0 ? o.max_batch : 1);
    int max_step = o.max_step_tokens;
    if (max_step <= 0 && !cpu) max_step = all_ctx < 2048 ? (int)all_ctx : 2048;
    else if (max_step <= 0) max_step = max_seq < 512 ? max_seq : 512;
    if (max_step < 16) max_step = 16;
    /* ---- calibration (plan/calib_run.h): an f32 engine of this model runs
     * in memory over --calib, or the --calib-cache is read */
    if ((o.calib && *o.calib) || (o.calib_cache && *o.calib_cache)) {
        if ((s = tb_calibrate_for_build(src, tok, &o, max_seq, 1, &calib)) != TB_OK) {
            tb_error_prefix(s, "calibration");
            goto done;
        }
    }
    tb_model_build_opts mo = {.weight_dtype = o.weight_dtype, .max_seq_len = max_seq, .max_step_tokens = max_step,
                              .progress = o.progress ? progress_bar : NULL, .source_weights = retype || cpu,
                              .tp_size = tp};
    tb_opt_options oo;
    memset(&oo, 0, sizeof oo);
    int n_passes;
    memcpy(oo.device, dev_kind, sizeof oo.device);
    oo.dtype = o.weight_dtype;
    oo.verbose = o.verbose;
    tb_quant_options qo = {.dtype = o.weight_dtype, .group = o.group_size, .asym = o.zero_point,
                           .overrides = o.overrides, .n_overrides = o.n_overrides};
    /* calibration: each matmul's static activation scale (int8, fp8: 0 for
     * other dtypes; a --override'd weight keeps the engine dtype's scale,
     * which its kernel ignores) and, with --awq, the AWQ search hook */
    awq_ctx actx = {calib, o.verbose};
    if (calib && calib->n > 0) {
        if (!(qc = calloc((size_t)calib->n, sizeof *qc))) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
        for (int i = 0; i < calib->n; i++)
            qc[i] = (tb_quant_calib){.weight = calib->e[i].name,
                                     .act_scale = tb_calib_act_scale(&calib->e[i], o.weight_dtype)};
        qo.calib = qc;
        qo.n_calib = calib->n;
    }
    if (o.awq && calib) { qo.awq = awq_search_hook; qo.awq_clip = awq_clip_hook; qo.awq_user = &actx; }
    /* A CPU build of any dtype streams: the graph borrows the source's
     * tensors and the quantize pass converts each weight in turn (f32, f16,
     * bf16 in place; the q|k|v and gate|up merges after it), so the model is
     * never held converted and stacked at once (a 7B-shape f16 build peaked
     * at ~3x its weights before). The CUDA pipeline still takes converted
     * weights (its passes run on them). */
    if (retype || cpu) oo.quant = &qo;
    const tb_pass *passes = tb_opt_llm_pipeline(&n_passes);
    tb_tune_report tr;
    /* One graph per tensor-parallel rank (rank 0 last: its graph stays for
     * the metadata), each through the same passes and tuning. */
    for (int r = tp - 1; r >= 0; r--) {
        tb_graph_free(g);
        g = NULL;
        mo.tp_rank = r;
        mo.progress = o.progress && r == 0 ? progress_bar : NULL;
        if ((s = tb_model_build_graph(src, &mo, &g)) != TB_OK) goto done;
        /* the builder's plain graph, fused by the pass pipeline for the target */
        if ((s = tb_opt_run(g, passes, n_passes, &oo)) != TB_OK) goto done;
        int prefill = max_step < 128 ? max_step : 128;
        if ((s = tb_tune_graph(g, 0, prefill, o.qmm_tactics, &tr)) != TB_OK) goto done;
        /* the target's own tactics (the CUDA GEMV kernels), timed on it */
        if ((s = tb_tune_device(g, o.device, max_seq, &tr)) != TB_OK) goto done;
        /* q8 on the GPU: int8 / int4 one-token GEMVs on int8 activations */
        if (o.qmm_tactics == TB_QMM_TACTICS_Q8 && !strcmp(oo.device, "cuda"))
            for (int k = 0; k < g->n_nodes; k++) {
                tb_node *n = &g->nodes[k];
                tb_dtype wd = n->op == TB_OP_QMATMUL ? g->values[n->in[1]].dtype : TB_F32;
                if (wd == TB_I8 || wd == TB_I4)
                    n->tactic = (n->tactic & ~(0xff << TB_TACTIC_GEMV_SHIFT)) | TB_GEMV_Q8 << TB_TACTIC_GEMV_SHIFT;
            }
        /* the graph's weights are not read after packing: each is released
         * once copied, so a build holds the model about once */
        uint8_t **wb = r ? &rank_weights[r] : &weights, **gb = r ? &rank_graph[r] : &graph_buf;
        uint64_t *wn = r ? &rank_weights_n[r] : &weights_n;
        size_t *gn = r ? &rank_graph_n[r] : &graph_n;
        if ((s = pack_weights(g, 1, wb, wn)) != TB_OK) goto done;
        if ((s = tb_graph_serialize(g, gb, gn)) != TB_OK) goto done;
    }
    if ((s = tb_tokenizer_serialize(tok, &tok_buf, &tok_n)) != TB_OK) goto done;

    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *eos_a = json_array();
    for (int i = 0; i < n_eos; i++) json_array_append_new(eos_a, json_integer(eos[i]));
    json_t *prof = json_array();
    for (int i = 0; i < g->n_syms; i++)
        json_array_append_new(prof, json_pack("{s:s, s:I, s:I, s:I}", "name", g->syms[i].name, "min",
                                              (json_int_t)g->syms[i].min, "opt", (json_int_t)g->syms[i].opt, "max",
                                              (json_int_t)g->syms[i].max));
    json_t *m = json_pack(
        "{s:i, s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:b, s:b, s:s},"
        " s:{s:s, s:i, s:i, s:i, s:s, s:f, s:s},"
        " s:{s:i, s:o, s:i},"
        " s:o, s:{s:i, s:i, s:i, s:f}}",
        "format_version", (int)TB_ENGINE_VERSION,
        "model", "arch", c->arch, "vocab_size", c->vocab_size, "dim", c->dim, "hidden_dim", c->hidden_dim,
        "n_layers", c->n_layers, "n_heads", c->n_heads, "n_kv_heads", c->n_kv_heads, "head_dim", c->head_dim,
        "context_length", c->max_seq_len, "norm_eps", (double)c->norm_eps, "rope_theta", (double)c->rope_theta,
        "rope_interleaved", c->rope_interleaved, "tie_embeddings", c->tie_embeddings, "attn_bias", c->attn_bias,
        "source", model_path,
        "build", "dtype", tb_dtype_name(o.weight_dtype), "max_seq_len", max_seq, "max_batch", o.max_batch,
        "max_step_tokens", max_step, "tokenizer", tpath, "build_seconds", 0.0, "built_at", when,
        "special", "bos", bos, "eos", eos_a, "add_bos", add_bos,
        "profiles", prof,
        "tactics", "shapes_timed", tr.n_timed, "blas_decode_nodes", tr.n_blas_small, "blas_prefill_nodes",
        tr.n_blas_large, "tuning_seconds", tr.seconds);
    if (!m) { s = tb_errorf(TB_ERR_INTERNAL, "cannot encode engine metadata"); goto done; }
    json_object_set_new(json_object_get(m, "build"), "build_seconds", json_real(tb_now() - t0));
    if (tp > 1) json_object_set_new(json_object_get(m, "build"), "tensor_parallel", json_integer(tp));
    if (retype) { /* how the weights were quantized (inspect shows each tensor's dtype) */
        json_t *ovs = json_array();
        for (int i = 0; i < o.n_overrides; i++) json_array_append_new(ovs, json_string(o.overrides[i]));
        json_t *qj = json_pack("{s:s, s:s, s:o}", "method", o.awq ? "awq" : "round-to-nearest", "embedding_head_default",
                               quant ? "f16" : tb_dtype_name(o.weight_dtype), "overrides", ovs);
        /* the LM head's own default (llm_quant.c): int8 in int4 engines */
        json_object_set_new(qj, "lm_head_default", json_string(o.weight_dtype == TB_I4 ? "i8"
                                                               : quant ? "f16" : tb_dtype_name(o.weight_dtype)));
        if (o.weight_dtype == TB_I4) {
            json_object_set_new(qj, "group_size", json_integer(o.group_size));
            json_object_set_new(qj, "zero_point", json_boolean(o.zero_point));
        }
        json_object_set_new(json_object_get(m, "build"), "quantization", qj);
    }
    if (strcmp(oo.device, "cpu"))
        json_object_set_new(json_object_get(m, "tactics"), "device_shapes_timed", json_integer(tr.n_device_timed));
    if (retype) { /* which quantized matmuls run with int8 activations (their logits depend on it) */
        static const char *const qmm_names[] = {"auto", "exact", "q8"};
        json_t *tj = json_object_get(m, "tactics");
        json_object_set_new(tj, "qmm_tactics", json_string(qmm_names[o.qmm_tactics]));
        json_object_set_new(tj, "q8_decode_nodes", json_integer(tr.n_q8_small));
        json_object_set_new(tj, "q8_prefill_nodes", json_integer(tr.n_q8_large));
    }
    if (calib) {
        char fp[24];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)calib->fingerprint);
        json_object_set_new(m, "calibration", json_pack("{s:s, s:I, s:i, s:s}", "calibrator", calib->calibrator,
                                                        "tokens", (json_int_t)calib->tokens, "tensors", calib->n,
                                                        "model_fingerprint", fp));
    }
    meta = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(m);
    hw = tb_backend_fingerprint(o.device);
    if (!hw) { s = TB_ERR_HARDWARE; goto done; }
    if (!meta) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    if (tp > 1) { /* the fingerprint names the devices the ranks take */
        json_t *h = json_loads(hw, 0, NULL);
        free(hw);
        hw = NULL;
        if (h) json_object_set_new(h, "devices", json_integer(tp));
        if (h) hw = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(h);
        if (!hw) { s = tb_errorf(TB_ERR_OOM, "out of memory"); goto done; }
    }
    tb_section_src secs[5 + 2 * TB_MAX_TP] = {
        {"meta", meta, strlen(meta)}, {"hardware", hw, strlen(hw)}, {"tokenizer", tok_buf, tok_n},
        {"graph", graph_buf, graph_n}, {"weights", weights, weights_n}};
    char sec_names[TB_MAX_TP][2][24];
    int n_secs = 5;
    for (int r = 1; r < tp; r++) {
        snprintf(sec_names[r][0], sizeof sec_names[r][0], "graph.%d", r);
        snprintf(sec_names[r][1], sizeof sec_names[r][1], "weights.%d", r);
        secs[n_secs++] = (tb_section_src){sec_names[r][0], rank_graph[r], rank_graph_n[r]};
        secs[n_secs++] = (tb_section_src){sec_names[r][1], rank_weights[r], rank_weights_n[r]};
    }
    if ((s = tb_engine_write(engine_path, secs, n_secs)) != TB_OK) goto done;
    if (report) {
        report->seconds = tb_now() - t0;
        report->max_batch = o.max_batch;
        report->max_seq_len = max_seq;
        FILE *f = fopen(engine_path, "rb");
        report->engine_bytes = 0;
        if (f) { fseek(f, 0, SEEK_END); report->engine_bytes = (uint64_t)ftell(f); fclose(f); }
    }
done:
    free(qc);
    for (int r = 1; r < TB_MAX_TP; r++) {
        free(rank_graph[r]);
        free(rank_weights[r]);
    }
    tb_calib_table_free(calib);
    free(meta);
    free(hw);
    free(tok_buf);
    free(graph_buf);
    free(weights);
    tb_graph_free(g);
    tb_tokenizer_free(tok);
    tb_source_free(src);
    return s;
}
