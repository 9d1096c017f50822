/* test_import.c — the import layer against generated checkpoints (written by
 * tests/gen_checkpoints.py into $TURBINE_TMP/import), the real stories260K
 * llama2.c file, and hand-made broken files for every error path. Each error
 * case checks the status and that the message names the problem. */
#define _GNU_SOURCE
#include "import/import.h"

#include <sys/stat.h>

#include "tb_test.h"

static char g_tmp[1024];
static char g_src[1024];

/* ---------------------------------------------------------------- helpers */

static void path_join(char *out, size_t cap, const char *a, const char *b) {
    int r = snprintf(out, cap, "%s/%s", a, b);
    TB_ASSERT(r >= 0 && (size_t)r < cap);
}

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return fclose(f) == 0 && w == n;
}

static void make_dir(const char *path) { mkdir(path, 0755); }

static int gen(const char *preset, const char *dtype, const char *name, int seed) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/gen_checkpoints.py --preset %s --dtype %s "
             "--out %s/%s --seed %d > /dev/null",
             g_src, preset, dtype, g_tmp, name, seed);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "%s failed", cmd);
    return rc == 0;
}

static tb_model_source *open_ok(const char *name) {
    char p[2048];
    path_join(p, sizeof p, g_tmp, name);
    tb_model_source *s = NULL;
    tb_status st = tb_source_open(p, &s);
    CHECK_MSG(st == TB_OK, "open %s: %s", p, tb_last_error());
    return s;
}

/* Expects `path` to fail with `code` and a message containing both needles. */
static void expect_open_fail(const char *path, tb_status code, const char *needle1,
                             const char *needle2) {
    tb_model_source *s = NULL;
    tb_error_clear();
    tb_status st = tb_source_open(path, &s);
    CHECK_MSG(st == code, "%s: got status %s, want %s (%s)", path, tb_status_str(st),
              tb_status_str(code), tb_last_error());
    CHECK(s == NULL);
    const char *m = tb_last_error();
    CHECK_MSG(strstr(m, needle1) != NULL, "message '%s' lacks '%s'", m, needle1);
    if (needle2) CHECK_MSG(strstr(m, needle2) != NULL, "message '%s' lacks '%s'", m, needle2);
    tb_source_free(s);
}

/* A folder `name` with the llama-gqa config and `st` as model.safetensors. */
static void make_bad_folder(const char *name, const char *config_text,
                            const void *st, size_t n, char *dir, size_t cap) {
    path_join(dir, cap, g_tmp, name);
    make_dir(dir);
    char p[2048];
    path_join(p, sizeof p, dir, "config.json");
    CHECK(write_file(p, config_text, strlen(config_text)));
    path_join(p, sizeof p, dir, "model.safetensors");
    remove(p);
    if (st) CHECK(write_file(p, st, n));
}

/* header JSON + `data_bytes` zero bytes, as a safetensors file in memory. */
static size_t build_st(uint8_t *buf, size_t cap, const char *json, size_t data_bytes,
                       uint64_t declared_len) {
    size_t jl = strlen(json);
    size_t n = 8 + jl + data_bytes;
    TB_ASSERT(n <= cap);
    uint64_t hl = declared_len ? declared_len : jl;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, 0, data_bytes);
    return n;
}

/* ---------------------------------------------------------------- good models */

static void test_llama_gqa(void) {
    tb_model_source *s = open_ok("llama-gqa-f32");
    if (!s) return;
    const tb_model_config *c = tb_source_config(s);
    CHECK(strcmp(c->arch, "llama") == 0);
    CHECK(c->dim == 64 && c->hidden_dim == 172 && c->n_layers == 3);
    CHECK(c->n_heads == 8 && c->n_kv_heads == 2 && c->head_dim == 8);
    CHECK(c->vocab_size == 512 && c->max_seq_len == 256);
    CHECK(fabsf(c->norm_eps - 1e-5f) < 1e-12f);
    CHECK(c->rope_theta == 10000.0f && c->rope_scaling == TB_ROPE_SCALING_NONE);
    CHECK(c->rope_interleaved == 0 && c->tie_embeddings == 0 && c->attn_bias == 0);
    CHECK(c->bos_id == 1 && c->n_eos == 1 && c->eos_ids[0] == 2 && c->eos_ids[1] == -1);
    CHECK(c->src_dtype == TB_F32);
    CHECK(tb_source_tensor_count(s) == 1 + 3 * 9 + 2);
    CHECK(strcmp(tb_source_tokenizer_path(s), "") == 0);
    CHECK(strstr(tb_source_dir(s), "llama-gqa-f32") != NULL);

    const tb_src_tensor *t = NULL;
    CHECK(tb_source_get(s, "model.layers.2.self_attn.k_proj.weight", 16, 64, &t) == TB_OK);
    CHECK(t && t->dtype == TB_F32 && t->rank == 2 && t->nbytes == 16 * 64 * 4);
    CHECK(tb_source_get(s, "lm_head.weight", 512, 64, &t) == TB_OK);
    CHECK(tb_source_get(s, "model.norm.weight", 64, -1, &t) == TB_OK);
    CHECK(t && t->rank == 1);
    if (t) {
        float v;
        memcpy(&v, t->data, 4);
        CHECK(v > 0.3f && v < 1.7f); /* norm weights sit around 1 */
    }
    CHECK(tb_source_find(s, "model.layers.0.self_attn.q_proj.bias") == NULL);
    for (int i = 0; i < tb_source_tensor_count(s); i++) {
        const tb_src_tensor *x = tb_source_tensor_at(s, i);
        CHECK(x && tb_source_find(s, x->name) == x);
    }
    CHECK(tb_source_tensor_at(s, -1) == NULL);
    CHECK(tb_source_tensor_at(s, tb_source_tensor_count(s)) == NULL);

    /* Missing tensor and wrong shape through the checked lookup. */
    tb_error_clear();
    tb_status st = tb_source_get(s, "model.layers.7.mlp.up_proj.weight", 172, 64, &t);
    CHECK(st == TB_ERR_NOT_FOUND && t == NULL);
    CHECK_MSG(strstr(tb_last_error(), "model.layers.7.mlp.up_proj.weight") != NULL, "%s",
              tb_last_error());
    tb_error_clear();
    st = tb_source_get(s, "model.layers.0.mlp.up_proj.weight", 64, 172, &t);
    CHECK(st == TB_ERR_FORMAT && t == NULL);
    CHECK_MSG(strstr(tb_last_error(), "model.layers.0.mlp.up_proj.weight") &&
              strstr(tb_last_error(), "[172, 64]") && strstr(tb_last_error(), "[64, 172]"),
              "%s", tb_last_error());
    tb_error_clear();
    st = tb_source_get(s, "model.norm.weight", 64, 1, &t);
    CHECK(st == TB_ERR_FORMAT);
    CHECK_MSG(strstr(tb_last_error(), "[64]") != NULL, "%s", tb_last_error());

    /* The bf16 file from the same seed holds the round-to-nearest-even
     * halves of these f32 weights. */
    tb_model_source *b = open_ok("llama-gqa-bf16");
    if (b) {
        const tb_model_config *cb = tb_source_config(b);
        CHECK(cb->src_dtype == TB_BF16);
        CHECK(tb_source_tensor_count(b) == tb_source_tensor_count(s));
        size_t mismatches = 0, total = 0;
        for (int i = 0; i < tb_source_tensor_count(s); i++) {
            const tb_src_tensor *x = tb_source_tensor_at(s, i);
            const tb_src_tensor *y = tb_source_find(b, x->name);
            CHECK_MSG(y != NULL, "bf16 file lacks %s", x->name);
            if (!y) continue;
            CHECK(y->dtype == TB_BF16 && y->nbytes * 2 == x->nbytes);
            size_t n = x->nbytes / 4;
            for (size_t k = 0; k < n; k++) {
                float f;
                uint16_t h;
                memcpy(&f, (const uint8_t *)x->data + 4 * k, 4);
                memcpy(&h, (const uint8_t *)y->data + 2 * k, 2);
                mismatches += h != tb_f32_to_bf16(f);
                total++;
            }
        }
        CHECK_MSG(mismatches == 0, "%zu of %zu bf16 values differ", mismatches, total);
        tb_source_free(b);
    }
    tb_source_free(s);
}

static void test_qwen2(void) {
    tb_model_source *s = open_ok("qwen2-bf16");
    if (!s) return;
    const tb_model_config *c = tb_source_config(s);
    CHECK(strcmp(c->arch, "qwen2") == 0);
    CHECK(c->attn_bias == 1 && c->tie_embeddings == 1);
    CHECK(c->n_heads == 4 && c->n_kv_heads == 2 && c->head_dim == 16);
    CHECK(c->rope_theta == 1000000.0f && fabsf(c->norm_eps - 1e-6f) < 1e-13f);
    CHECK(c->src_dtype == TB_BF16);
    CHECK(tb_source_find(s, "lm_head.weight") == NULL);
    const tb_src_tensor *t = NULL;
    CHECK(tb_source_get(s, "model.layers.1.self_attn.q_proj.bias", 64, -1, &t) == TB_OK);
    CHECK(t && t->dtype == TB_BF16 && t->nbytes == 128);
    CHECK(tb_source_get(s, "model.layers.1.self_attn.k_proj.bias", 32, -1, &t) == TB_OK);
    CHECK(tb_source_get(s, "model.layers.1.self_attn.v_proj.bias", 32, -1, &t) == TB_OK);
    CHECK(tb_source_tensor_count(s) == 1 + 2 * 12 + 1);
    tb_source_free(s);
}

static void test_mistral_llama3(void) {
    tb_model_source *s = open_ok("mistral-f16");
    if (s) {
        const tb_model_config *c = tb_source_config(s);
        CHECK(strcmp(c->arch, "mistral") == 0 && c->n_kv_heads == 4);
        CHECK(c->src_dtype == TB_F16 && c->max_seq_len == 512);
        const tb_src_tensor *t = NULL;
        CHECK(tb_source_get(s, "model.embed_tokens.weight", 512, 64, &t) == TB_OK);
        CHECK(t && t->dtype == TB_F16);
        tb_source_free(s);
    }
    s = open_ok("llama3-rope-f32");
    if (s) {
        const tb_model_config *c = tb_source_config(s);
        CHECK(c->rope_scaling == TB_ROPE_SCALING_LLAMA3);
        CHECK(c->rope_factor == 8.0f && c->rope_low_freq_factor == 1.0f);
        CHECK(c->rope_high_freq_factor == 4.0f && c->rope_orig_max_pos == 256);
        CHECK(c->rope_theta == 500000.0f && c->tie_embeddings == 1);
        CHECK(c->n_eos == 2 && c->eos_ids[0] == 2 && c->eos_ids[1] == 3 && c->eos_ids[2] == -1);
        CHECK(c->head_dim == 16 && c->max_seq_len == 1024);
        tb_source_free(s);
    }
}

static void test_sharded(void) {
    tb_model_source *s = open_ok("llama-sharded-f32");
    tb_model_source *r = open_ok("llama-gqa-f32");
    if (s && r) {
        CHECK(tb_source_tensor_count(s) == tb_source_tensor_count(r));
        int same = 1;
        for (int i = 0; i < tb_source_tensor_count(r); i++) {
            const tb_src_tensor *x = tb_source_tensor_at(r, i);
            const tb_src_tensor *y = tb_source_find(s, x->name);
            if (!y || y->nbytes != x->nbytes || memcmp(x->data, y->data, x->nbytes) != 0) {
                same = 0;
                fprintf(stderr, "sharded tensor %s differs\n", x->name);
            }
        }
        CHECK(same);
        /* Tensors of the first and the last shard both resolve. */
        const tb_src_tensor *t;
        CHECK(tb_source_get(s, "model.embed_tokens.weight", 512, 64, &t) == TB_OK);
        CHECK(tb_source_get(s, "lm_head.weight", 512, 64, &t) == TB_OK);
    }
    tb_source_free(s);
    tb_source_free(r);
}

static void test_stories260k(void) {
    char p[2048];
    path_join(p, sizeof p, tb_test_shared(), "models/stories260K/stories260K.bin");
    tb_model_source *s = NULL;
    tb_status st = tb_source_open(p, &s);
    CHECK_MSG(st == TB_OK, "%s", tb_last_error());
    if (!s) return;
    const tb_model_config *c = tb_source_config(s);
    CHECK(strcmp(c->arch, "llama") == 0);
    CHECK(c->dim == 64 && c->hidden_dim == 172 && c->n_layers == 5);
    CHECK(c->n_heads == 8 && c->n_kv_heads == 4 && c->head_dim == 8);
    CHECK(c->vocab_size == 512 && c->max_seq_len == 512);
    CHECK(c->rope_interleaved == 1 && c->tie_embeddings == 1 && c->attn_bias == 0);
    CHECK(fabsf(c->norm_eps - 1e-5f) < 1e-12f && c->rope_theta == 10000.0f);
    CHECK(c->bos_id == 1 && c->n_eos == 1 && c->eos_ids[0] == 2);
    CHECK(c->src_dtype == TB_F32);
    CHECK(tb_source_tensor_count(s) == 1 + 5 * 9 + 1);
    CHECK(strcmp(tb_source_tokenizer_path(s), "") == 0 && strcmp(tb_source_dir(s), "") == 0);
    CHECK(tb_source_find(s, "lm_head.weight") == NULL);

    const tb_src_tensor *emb = NULL, *q1 = NULL, *t = NULL;
    CHECK(tb_source_get(s, "model.embed_tokens.weight", 512, 64, &emb) == TB_OK);
    CHECK(tb_source_get(s, "model.layers.1.self_attn.q_proj.weight", 64, 64, &q1) == TB_OK);
    CHECK(tb_source_get(s, "model.layers.4.self_attn.k_proj.weight", 32, 64, &t) == TB_OK);
    CHECK(tb_source_get(s, "model.layers.4.mlp.down_proj.weight", 64, 172, &t) == TB_OK);
    CHECK(tb_source_get(s, "model.layers.4.mlp.gate_proj.weight", 172, 64, &t) == TB_OK);
    CHECK(tb_source_get(s, "model.layers.0.post_attention_layernorm.weight", 64, -1, &t) == TB_OK);
    CHECK(tb_source_get(s, "model.norm.weight", 64, -1, &t) == TB_OK);
    if (emb && q1) {
        /* emb (512*64) + rms_att (5*64) + wq layer 0 (64*64) floats in. */
        const uint8_t *base = (const uint8_t *)emb->data - 28;
        CHECK((const uint8_t *)q1->data == base + 28 + 4 * (512 * 64 + 5 * 64 + 64 * 64));
    }
    if (t) {
        /* model.norm is the last array before the RoPE tables. */
        const uint8_t *end = (const uint8_t *)emb->data - 28 + 1056540;
        CHECK((const uint8_t *)t->data + 64 * 4 + 2 * 512 * 4 * 4 == end);
    }
    tb_source_free(s);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(const char *config_text) {
    char dir[2048], p[2048];
    static uint8_t buf[1 << 16];

    /* Paths that are not models. */
    path_join(dir, sizeof dir, g_tmp, "no-such-model");
    expect_open_fail(dir, TB_ERR_IO, "no-such-model", NULL);
    path_join(dir, sizeof dir, g_tmp, "err-empty");
    make_dir(dir);
    path_join(p, sizeof p, dir, "config.json");
    remove(p);
    expect_open_fail(dir, TB_ERR_NOT_FOUND, "config.json", NULL);

    /* Config problems. */
    const char *gpt2 = "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64}";
    make_bad_folder("err-arch", gpt2, NULL, 0, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_UNSUPPORTED, "GPT2LMHeadModel", "not supported");
    char cfg[8192];
    snprintf(cfg, sizeof cfg, "%s", config_text);
    char *rs = strstr(cfg, "\"rope_scaling\": null");
    CHECK(rs != NULL);
    if (rs) {
        char yarn[8192];
        snprintf(yarn, sizeof yarn, "%.*s\"rope_scaling\": {\"rope_type\": \"yarn\", "
                 "\"factor\": 4.0}%s", (int)(rs - cfg), cfg, rs + strlen("\"rope_scaling\": null"));
        make_bad_folder("err-yarn", yarn, NULL, 0, dir, sizeof dir);
        expect_open_fail(dir, TB_ERR_UNSUPPORTED, "yarn", "rope_scaling");
    }
    make_bad_folder("err-nojson", "{\"architectures\": [", NULL, 0, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "config.json", "JSON");
    make_bad_folder("err-noweights", config_text, NULL, 0, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_NOT_FOUND, "model.safetensors", NULL);

    /* safetensors problems. */
    size_t n;
    n = build_st(buf, sizeof buf, "{\"model.bad\": {\"dtype\": \"I8\", \"shape\": [4], "
                 "\"data_offsets\": [0, 4]}}", 4, 0);
    make_bad_folder("err-i8", config_text, buf, n, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_UNSUPPORTED, "model.bad", "I8");
    n = build_st(buf, sizeof buf, "{\"model.f64\": {\"dtype\": \"F64\", \"shape\": [2, 2], "
                 "\"data_offsets\": [0, 32]}}", 32, 0);
    make_bad_folder("err-f64", config_text, buf, n, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_UNSUPPORTED, "model.f64", "F64");

    make_bad_folder("err-short", config_text, "\x10\x00\x00", 3, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "too short", NULL);
    n = build_st(buf, sizeof buf, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
                 "\"data_offsets\": [0, 4]}}", 4, 0);
    make_bad_folder("err-cut-header", config_text, buf, 30, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "header length", "does not fit");
    n = build_st(buf, sizeof buf, "{}", 0, 1ull << 40);
    make_bad_folder("err-huge-header", config_text, buf, n, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "header length 1099511627776", NULL);
    n = build_st(buf, sizeof buf, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
                 "\"data_offse", 0, 0);
    make_bad_folder("err-bad-json", config_text, buf, n, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "not valid JSON", NULL);
    n = build_st(buf, sizeof buf, "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", "
                 "\"shape\": [512, 64], \"data_offsets\": [0, 131072]}}", 64, 0);
    make_bad_folder("err-offsets", config_text, buf, n, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "model.embed_tokens.weight", "past the end");
    n = build_st(buf, sizeof buf, "{\"w\": {\"dtype\": \"BF16\", \"shape\": [3, 4], "
                 "\"data_offsets\": [0, 20]}}", 20, 0);
    make_bad_folder("err-size", config_text, buf, n, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "holds 20 bytes", "need 24");
    n = build_st(buf, sizeof buf, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], "
                 "\"data_offsets\": [0, 4]}, \"w\": {\"dtype\": \"F32\", \"shape\": [1], "
                 "\"data_offsets\": [0, 4]}}", 4, 0);
    make_bad_folder("err-dup", config_text, buf, n, dir, sizeof dir);
    expect_open_fail(dir, TB_ERR_FORMAT, "JSON", NULL);

    /* A shard named in the index that is not there. */
    make_bad_folder("err-shard", config_text, NULL, 0, dir, sizeof dir);
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    const char *idx = "{\"weight_map\": {\"model.norm.weight\": \"model-00009.safetensors\"}}";
    CHECK(write_file(p, idx, strlen(idx)));
    expect_open_fail(dir, TB_ERR_NOT_FOUND, "model-00009.safetensors", NULL);

    /* llama2.c files one float short and one float long. */
    char src[2048];
    path_join(src, sizeof src, tb_test_shared(), "models/stories260K/stories260K.bin");
    char *bin = NULL;
    size_t bn = 0;
    CHECK(tb_file_read_all(src, &bin, &bn, 1 << 24) == TB_OK);
    if (bin && bn == 1056540) {
        path_join(p, sizeof p, g_tmp, "truncated.bin");
        CHECK(write_file(p, bin, bn - 4));
        expect_open_fail(p, TB_ERR_FORMAT, "truncated", "expected 1056540 bytes, file has 1056536");
        path_join(p, sizeof p, g_tmp, "oversized.bin");
        FILE *f = fopen(p, "wb");
        if (f) {
            fwrite(bin, 1, bn, f);
            fwrite("\0\0\0\0", 1, 4, f);
            fclose(f);
        }
        expect_open_fail(p, TB_ERR_FORMAT, "oversized", "file has 1056544");
        path_join(p, sizeof p, g_tmp, "header-only.bin");
        CHECK(write_file(p, bin, 20));
        expect_open_fail(p, TB_ERR_FORMAT, "too short", NULL);
        int32_t bad[7] = {64, 172, 5, 7, 4, 512, 512}; /* 64 % 7 != 0 */
        path_join(p, sizeof p, g_tmp, "bad-header.bin");
        CHECK(write_file(p, bad, sizeof bad));
        expect_open_fail(p, TB_ERR_FORMAT, "implausible", NULL);
    } else {
        CHECK_MSG(0, "cannot read %s (%zu bytes)", src, bn);
    }
    free(bin);
}

/* ---------------------------------------------------------------- main */

int main(void) {
    const char *src = getenv("TURBINE_SRC");
    if (src && *src) {
        snprintf(g_src, sizeof g_src, "%s", src);
    } else {
        snprintf(g_src, sizeof g_src, "%s", __FILE__);
        char *slash = strrchr(g_src, '/');
        if (slash) *slash = 0;
        strncat(g_src, "/..", sizeof g_src - strlen(g_src) - 1);
    }
    snprintf(g_tmp, sizeof g_tmp, "%s/import", tb_test_tmp());
    make_dir(tb_test_tmp());
    make_dir(g_tmp);
    tb_log_set_level(TB_LOG_ERROR);

    int ok = gen("llama-gqa", "f32", "llama-gqa-f32", 7) &&
             gen("llama-gqa", "bf16", "llama-gqa-bf16", 7) &&
             gen("llama-sharded", "f32", "llama-sharded-f32", 7) &&
             gen("qwen2", "bf16", "qwen2-bf16", 1) &&
             gen("mistral", "f16", "mistral-f16", 2) &&
             gen("llama3-rope", "f32", "llama3-rope-f32", 3);
    if (ok) {
        test_llama_gqa();
        test_qwen2();
        test_mistral_llama3();
        test_sharded();
    }
    test_stories260k();

    char p[2048];
    path_join(p, sizeof p, g_tmp, "llama-gqa-f32/config.json");
    char *cfg = NULL;
    if (tb_file_read_all(p, &cfg, NULL, 1 << 20) == TB_OK) test_errors(cfg);
    else CHECK_MSG(0, "no %s to build the error cases from", p);
    free(cfg);
    return tb_test_finish("test_import");
}
