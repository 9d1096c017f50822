/* hf.c — a Hugging Face model folder: config.json for the hyperparameters,
 * model.safetensors or model.safetensors.index.json + shards for the weights.
 * The config is checked for what the runtime cannot do (architectures,
 * activations, rope scaling types, biases) so that a build fails here with a
 * message rather than producing wrong logits later. */
#include "import/source_impl.h"

#include <jansson.h>
#include <math.h>

#define TB_CONFIG_MAX_BYTES ((size_t)16 << 20)
#define TB_INDEX_MAX_BYTES ((size_t)64 << 20)

/* ---------------------------------------------------------------- config fields */

static tb_status get_int(json_t *o, const char *key, int required, long long def,
                         long long lo, long long hi, long long *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return tb_errorf(TB_ERR_FORMAT, "config.json: missing required field %s", key);
        *out = def;
        return TB_OK;
    }
    long long x;
    if (json_is_integer(v)) {
        x = (long long)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);
    } else {
        return tb_errorf(TB_ERR_FORMAT, "config.json: %s must be an integer", key);
    }
    if (x < lo || x > hi)
        return tb_errorf(TB_ERR_FORMAT, "config.json: %s = %lld is outside [%lld, %lld]",
                         key, x, lo, hi);
    *out = x;
    return TB_OK;
}

static tb_status get_num(json_t *o, const char *key, int required, double def,
                         double *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return tb_errorf(TB_ERR_FORMAT, "config.json: missing required field %s", key);
        *out = def;
        return TB_OK;
    }
    if (!json_is_number(v))
        return tb_errorf(TB_ERR_FORMAT, "config.json: %s must be a number", key);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return tb_errorf(TB_ERR_FORMAT, "config.json: %s is not finite", key);
    return TB_OK;
}

/* -1 when absent; `*present` says whether the key was there at all. */
static int get_bool(json_t *o, const char *key, int def, int *present) {
    json_t *v = json_object_get(o, key);
    if (present) *present = v && json_is_boolean(v);
    if (!v || !json_is_boolean(v)) return def;
    return json_is_true(v);
}

static tb_status parse_rope_scaling(tb_model_config *c, json_t *rs) {
    if (!rs || json_is_null(rs)) return TB_OK;
    if (!json_is_object(rs))
        return tb_errorf(TB_ERR_FORMAT, "config.json: rope_scaling must be an object");
    json_t *t = json_object_get(rs, "rope_type");
    if (!json_is_string(t)) t = json_object_get(rs, "type");
    if (!json_is_string(t))
        return tb_errorf(TB_ERR_FORMAT, "config.json: rope_scaling has no rope_type");
    const char *type = json_string_value(t);
    double v;
    long long n;
    if (strcmp(type, "default") == 0) return TB_OK;
    if (strcmp(type, "linear") == 0) {
        TB_TRY(get_num(rs, "factor", 1, 1.0, &v));
        if (!(v > 0)) return tb_errorf(TB_ERR_FORMAT, "config.json: rope_scaling factor must be > 0");
        c->rope_scaling = TB_ROPE_SCALING_LINEAR;
        c->rope_factor = (float)v;
        return TB_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = TB_ROPE_SCALING_LLAMA3;
        TB_TRY(get_num(rs, "factor", 1, 1.0, &v));
        c->rope_factor = (float)v;
        TB_TRY(get_num(rs, "low_freq_factor", 1, 1.0, &v));
        c->rope_low_freq_factor = (float)v;
        TB_TRY(get_num(rs, "high_freq_factor", 1, 1.0, &v));
        c->rope_high_freq_factor = (float)v;
        TB_TRY(get_int(rs, "original_max_position_embeddings", 1, 0, 1, 1 << 24, &n));
        c->rope_orig_max_pos = (int)n;
        if (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0) ||
            !(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return tb_errorf(TB_ERR_FORMAT, "config.json: llama3 rope_scaling needs factor "
                             "> 0 and high_freq_factor > low_freq_factor > 0");
        return TB_OK;
    }
    return tb_errorf(TB_ERR_UNSUPPORTED, "config.json: rope_scaling type '%s' is not "
                     "supported (supported: llama3, linear)", type);
}

static const struct { const char *hf, *arch; } archs[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},
};

static tb_status parse_config(tb_model_config *c, json_t *root) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(root))
        return tb_errorf(TB_ERR_FORMAT, "config.json is not a JSON object");
    json_t *ja = json_object_get(root, "architectures");
    const char *hf = NULL;
    if (json_is_array(ja) && json_array_size(ja) > 0 && json_is_string(json_array_get(ja, 0)))
        hf = json_string_value(json_array_get(ja, 0));
    if (!hf) {
        json_t *mt = json_object_get(root, "model_type");
        return tb_errorf(TB_ERR_UNSUPPORTED, "config.json names no architecture "
                         "(model_type %s); supported: LlamaForCausalLM, "
                         "MistralForCausalLM, Qwen2ForCausalLM",
                         json_is_string(mt) ? json_string_value(mt) : "absent");
    }
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(hf, archs[i].hf) == 0) snprintf(c->arch, sizeof c->arch, "%s", archs[i].arch);
    if (!c->arch[0])
        return tb_errorf(TB_ERR_UNSUPPORTED, "architecture %s is not supported (supported: "
                         "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)", hf);

    const char *act_keys[] = {"hidden_act", "hidden_activation"};
    for (int i = 0; i < 2; i++) {
        json_t *a = json_object_get(root, act_keys[i]);
        if (json_is_string(a) && strcmp(json_string_value(a), "silu") != 0)
            return tb_errorf(TB_ERR_UNSUPPORTED, "config.json: %s '%s' is not supported "
                             "(supported: silu)", act_keys[i], json_string_value(a));
    }
    if (get_bool(root, "mlp_bias", 0, NULL))
        return tb_errorf(TB_ERR_UNSUPPORTED, "config.json: mlp_bias is not supported");

    long long v;
    TB_TRY(get_int(root, "hidden_size", 1, 0, 1, 1 << 20, &v)); c->dim = (int)v;
    TB_TRY(get_int(root, "intermediate_size", 1, 0, 1, 1 << 22, &v)); c->hidden_dim = (int)v;
    TB_TRY(get_int(root, "num_hidden_layers", 1, 0, 1, 4096, &v)); c->n_layers = (int)v;
    TB_TRY(get_int(root, "num_attention_heads", 1, 0, 1, 4096, &v)); c->n_heads = (int)v;
    TB_TRY(get_int(root, "num_key_value_heads", 0, c->n_heads, 1, c->n_heads, &v));
    c->n_kv_heads = (int)v;
    TB_TRY(get_int(root, "vocab_size", 1, 0, 1, 1 << 24, &v)); c->vocab_size = (int)v;
    if (!json_object_get(root, "max_position_embeddings"))
        tb_log(TB_LOG_WARN, "config.json has no max_position_embeddings; using 2048");
    TB_TRY(get_int(root, "max_position_embeddings", 0, 2048, 1, 1 << 24, &v));
    c->max_seq_len = (int)v;
    if (c->n_heads % c->n_kv_heads != 0)
        return tb_errorf(TB_ERR_FORMAT, "config.json: num_attention_heads %d is not a "
                         "multiple of num_key_value_heads %d", c->n_heads, c->n_kv_heads);
    json_t *jh = json_object_get(root, "head_dim");
    if (jh && !json_is_null(jh)) {
        TB_TRY(get_int(root, "head_dim", 1, 0, 1, 1 << 16, &v));
        c->head_dim = (int)v;
    } else {
        if (c->dim % c->n_heads != 0)
            return tb_errorf(TB_ERR_FORMAT, "config.json: hidden_size %d is not a multiple "
                             "of num_attention_heads %d and head_dim is not given",
                             c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim % 2 != 0)
        return tb_errorf(TB_ERR_FORMAT, "config.json: head_dim %d is odd (rotary "
                         "embeddings need pairs)", c->head_dim);

    double d;
    TB_TRY(get_num(root, "rms_norm_eps", 0, 1e-6, &d));
    if (!(d > 0 && d < 1)) return tb_errorf(TB_ERR_FORMAT, "config.json: rms_norm_eps %g is out of range", d);
    c->norm_eps = (float)d;

    /* Newer configs keep theta and scaling together in rope_parameters. */
    json_t *rp = json_object_get(root, "rope_parameters");
    json_t *rs = json_object_get(root, "rope_scaling");
    if ((!rs || json_is_null(rs)) && json_is_object(rp)) rs = rp;
    double theta_def = 10000.0;
    if (json_is_object(rp)) TB_TRY(get_num(rp, "rope_theta", 0, 10000.0, &theta_def));
    TB_TRY(get_num(root, "rope_theta", 0, theta_def, &d));
    if (!(d > 1)) return tb_errorf(TB_ERR_FORMAT, "config.json: rope_theta %g is out of range", d);
    c->rope_theta = (float)d;
    c->rope_factor = 1.0f;
    TB_TRY(parse_rope_scaling(c, rs));
    c->rope_interleaved = 0;

    /* Tie and bias flags are settled in hf_open once the tensors are known. */
    c->tie_embeddings = get_bool(root, "tie_word_embeddings", 0, NULL);
    c->attn_bias = strcmp(c->arch, "qwen2") == 0 || get_bool(root, "attention_bias", 0, NULL);

    c->bos_id = -1;
    json_t *jb = json_object_get(root, "bos_token_id");
    if (json_is_integer(jb)) c->bos_id = (int)json_integer_value(jb);
    for (int i = 0; i < TB_MAX_EOS; i++) c->eos_ids[i] = -1;
    json_t *je = json_object_get(root, "eos_token_id");
    if (json_is_integer(je)) {
        c->eos_ids[0] = (int)json_integer_value(je);
        c->n_eos = 1;
    } else if (json_is_array(je)) {
        size_t i;
        json_t *x;
        json_array_foreach(je, i, x) {
            if (!json_is_integer(x)) continue;
            if (c->n_eos == TB_MAX_EOS) {
                tb_log(TB_LOG_WARN, "config.json lists more than %d eos_token_id values; "
                       "keeping the first %d", TB_MAX_EOS, TB_MAX_EOS);
                break;
            }
            c->eos_ids[c->n_eos++] = (int)json_integer_value(x);
        }
    }

    /* Sliding-window attention: the runtime attends over the whole context. */
    json_t *sw = json_object_get(root, "sliding_window");
    int sw_on = json_is_integer(sw);
    int present = 0;
    int use_sw = get_bool(root, "use_sliding_window", 1, &present);
    if (present) sw_on = sw_on && use_sw;
    if (sw_on && json_integer_value(sw) < c->max_seq_len)
        tb_log(TB_LOG_WARN, "config.json sets sliding_window %lld < max_position_embeddings "
               "%d; Turbine attends over the full context, so outputs past %lld tokens "
               "differ from the reference model", (long long)json_integer_value(sw),
               c->max_seq_len, (long long)json_integer_value(sw));

    c->src_dtype = (tb_dtype)-1;
    const char *dt_keys[] = {"torch_dtype", "dtype"};
    for (int i = 0; i < 2 && (int)c->src_dtype < 0; i++) {
        json_t *t = json_object_get(root, dt_keys[i]);
        if (!json_is_string(t)) continue;
        const char *s = json_string_value(t);
        if (strcmp(s, "float32") == 0) c->src_dtype = TB_F32;
        else if (strcmp(s, "float16") == 0) c->src_dtype = TB_F16;
        else if (strcmp(s, "bfloat16") == 0) c->src_dtype = TB_BF16;
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- weights */

static tb_status load_shard(tb_model_source *s, const char *dir, const char *file) {
    char path[TB_SOURCE_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path)
        return tb_errorf(TB_ERR_INVALID_ARG, "path %s/%s is too long", dir, file);
    if (!tb_file_exists(path))
        return tb_errorf(TB_ERR_NOT_FOUND, "%s: model.safetensors.index.json names shard "
                         "%s, which is missing", dir, file);
    const tb_mapped_file *m;
    TB_TRY(tb_source_map_file(s, path, &m));
    return tb_safetensors_parse(s, m, path);
}

static tb_status load_sharded(tb_model_source *s, const char *dir, const char *index_path) {
    char *text = NULL;
    size_t n = 0;
    TB_TRY(tb_file_read_all(index_path, &text, &n, TB_INDEX_MAX_BYTES));
    json_error_t jerr;
    json_t *root = json_loadb(text, n, 0, &jerr);
    free(text);
    if (!root)
        return tb_errorf(TB_ERR_FORMAT, "%s is not valid JSON (%s, line %d)", index_path,
                         jerr.text, jerr.line);
    tb_status st = TB_OK;
    json_t *wm = json_object_get(root, "weight_map");
    json_t *seen = json_object();
    if (!json_is_object(wm)) {
        st = tb_errorf(TB_ERR_FORMAT, "%s has no weight_map object", index_path);
    } else if (!seen) {
        st = tb_errorf(TB_ERR_OOM, "out of memory reading %s", index_path);
    } else {
        const char *name;
        json_t *file;
        json_object_foreach(wm, name, file) {
            if (!json_is_string(file)) {
                st = tb_errorf(TB_ERR_FORMAT, "%s: weight_map entry %s is not a file name",
                               index_path, name);
                break;
            }
            const char *f = json_string_value(file);
            if (!*f || f[0] == '/' || strstr(f, "..")) {
                st = tb_errorf(TB_ERR_FORMAT, "%s: shard name '%s' must be a file inside "
                               "the model folder", index_path, f);
                break;
            }
            if (json_object_get(seen, f)) continue;
            json_object_set_new(seen, f, json_true());
            st = load_shard(s, dir, f);
            if (st != TB_OK) break;
        }
        if (st == TB_OK && json_object_size(wm) == 0)
            st = tb_errorf(TB_ERR_FORMAT, "%s: weight_map is empty", index_path);
        if (st == TB_OK) st = tb_source_index(s);
        if (st == TB_OK) {
            json_object_foreach(wm, name, file) {
                if (!tb_source_find(s, name)) {
                    st = tb_errorf(TB_ERR_FORMAT, "%s: tensor %s is listed in shard %s but "
                                   "that shard does not contain it", index_path, name,
                                   json_string_value(file));
                    break;
                }
            }
        }
    }
    json_decref(seen);
    json_decref(root);
    return st;
}

/* Which dtype holds most of the weight bytes. */
static tb_dtype dominant_dtype(const tb_model_source *s) {
    size_t bytes[TB_DTYPE_COUNT] = {0};
    for (int i = 0; i < s->n_tensors; i++) bytes[s->tensors[i].dtype] += s->tensors[i].nbytes;
    tb_dtype best = TB_F32;
    for (int t = 0; t < TB_DTYPE_COUNT; t++)
        if (bytes[t] > bytes[best]) best = (tb_dtype)t;
    return best;
}

/* Biases on o_proj or the MLP have no place in the runtime's graph. */
static tb_status check_unsupported_tensors(const tb_model_source *s) {
    for (int i = 0; i < s->n_tensors; i++) {
        const char *n = s->tensors[i].name;
        size_t len = strlen(n);
        if (len > 5 && strcmp(n + len - 5, ".bias") == 0 &&
            (strstr(n, ".o_proj.") || strstr(n, ".mlp.")))
            return tb_errorf(TB_ERR_UNSUPPORTED, "%s: tensor %s: output-projection and MLP "
                             "biases are not supported", s->origin, n);
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- entry */

tb_status tb_hf_config_parse(tb_model_config *c, const char *text, size_t n,
                             const char *dir, int *tie_present) {
    *tie_present = 0;
    json_error_t jerr;
    json_t *root = json_loadb(text, n, 0, &jerr);
    if (!root)
        return tb_errorf(TB_ERR_FORMAT, "%s/config.json is not valid JSON (%s, line %d)", dir,
                         jerr.text, jerr.line);
    get_bool(root, "tie_word_embeddings", 0, tie_present);
    tb_status st = parse_config(c, root);
    json_decref(root);
    return st == TB_OK ? st : tb_error_prefix(st, "%s", dir);
}

tb_status tb_hf_open(tb_model_source *s, const char *dir_in) {
    char dir[TB_SOURCE_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", dir_in);
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dir[--dl] = 0;
    snprintf(s->dir, sizeof s->dir, "%s", dir);

    char path[TB_SOURCE_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!tb_file_exists(path))
        return tb_errorf(TB_ERR_NOT_FOUND, "%s has no config.json (expected a Hugging Face "
                         "model folder or a llama2.c .bin file)", dir);
    char *text = NULL;
    size_t n = 0;
    TB_TRY(tb_file_read_all(path, &text, &n, TB_CONFIG_MAX_BYTES));
    int tie_present = 0;
    tb_status st = tb_hf_config_parse(&s->cfg, text, n, dir, &tie_present);
    free(text);
    if (st != TB_OK) return st;

    char index_path[TB_SOURCE_PATH_MAX + 64];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (tb_file_exists(index_path)) {
        TB_TRY(load_sharded(s, dir, index_path));
    } else if (tb_file_exists(path)) {
        const tb_mapped_file *m;
        TB_TRY(tb_source_map_file(s, path, &m));
        TB_TRY(tb_safetensors_parse(s, m, path));
        TB_TRY(tb_source_index(s));
    } else {
        char bin[TB_SOURCE_PATH_MAX + 64];
        snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
        if (tb_file_exists(bin))
            return tb_errorf(TB_ERR_UNSUPPORTED, "%s holds PyTorch pickle weights "
                             "(pytorch_model.bin), which are not supported; convert them "
                             "to model.safetensors", dir);
        return tb_errorf(TB_ERR_NOT_FOUND, "%s has neither model.safetensors nor "
                         "model.safetensors.index.json", dir);
    }
    if (s->n_tensors == 0)
        return tb_errorf(TB_ERR_FORMAT, "%s: the safetensors files hold no tensors", dir);
    TB_TRY(check_unsupported_tensors(s));

    tb_model_config *c = &s->cfg;
    int has_head = tb_source_find(s, "lm_head.weight") != NULL;
    if (!tie_present && !has_head) {
        tb_log(TB_LOG_INFO, "%s: no lm_head.weight and no tie_word_embeddings; tying the "
               "output to the embeddings", dir);
        c->tie_embeddings = 1;
    }
    if (!c->attn_bias && tb_source_find(s, "model.layers.0.self_attn.q_proj.bias"))
        c->attn_bias = 1;
    if ((int)c->src_dtype < 0) c->src_dtype = dominant_dtype(s);

    if (snprintf(s->tok_path, sizeof s->tok_path, "%s/tokenizer.json", s->dir) >=
            (int)sizeof s->tok_path || !tb_file_exists(s->tok_path))
        s->tok_path[0] = 0;
    return TB_OK;
}
