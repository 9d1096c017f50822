/* llama2c.c — a llama2.c checkpoint (the original "version 0" export): seven
 * int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len),
 * then f32 arrays in run.c's order. A negative vocab_size means a separate
 * classifier follows the (unused) RoPE tables. Per-layer slices are exposed
 * under the Hugging Face names; q/k keep the Meta pair layout. */
#include "import/source_impl.h"

#define TB_L2C_HEADER_BYTES 28

static int32_t read_i32le(const uint8_t *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    return (int32_t)v;
}

/* Appends a rank-1 or rank-2 f32 tensor at float offset `off`. */
static tb_status add(tb_model_source *s, const uint8_t *base, uint64_t off,
                     const char *name, int64_t d0, int64_t d1) {
    tb_src_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = TB_F32;
    t.rank = d1 < 0 ? 1 : 2;
    t.dims[0] = d0;
    t.dims[1] = d1 < 0 ? 0 : d1;
    t.data = base + off * 4;
    t.nbytes = (size_t)(d0 * (d1 < 0 ? 1 : d1)) * 4;
    return tb_source_add_tensor(s, &t);
}

tb_status tb_llama2c_open(tb_model_source *s, const char *path) {
    const tb_mapped_file *m;
    TB_TRY(tb_source_map_file(s, path, &m));
    return tb_llama2c_parse(s, m, path);
}

tb_status tb_llama2c_parse(tb_model_source *s, const tb_mapped_file *m, const char *path) {
    if (m->size >= 4 && memcmp(m->data, "ak42", 4) == 0)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s is a llama2.c version-1/2 export (magic "
                         "ak42), which is not supported; export it with --version 0",
                         path);
    if (m->size < TB_L2C_HEADER_BYTES)
        return tb_errorf(TB_ERR_FORMAT, "%s: %zu bytes is too short for a llama2.c "
                         "checkpoint (not a model file?)", path, m->size);
    int32_t h[7];
    for (int i = 0; i < 7; i++) h[i] = read_i32le(m->data + 4 * i);
    int dim = h[0], hidden = h[1], L = h[2], nh = h[3], nkv = h[4], seq = h[6];
    int shared = h[5] > 0;
    int64_t vocab = h[5] < 0 ? -(int64_t)h[5] : h[5];
    if (dim <= 0 || dim > (1 << 16) || hidden <= 0 || hidden > (1 << 18) || L <= 0 ||
        L > 1024 || nh <= 0 || nh > dim || nkv <= 0 || nkv > nh || vocab <= 0 ||
        vocab > (1 << 22) || seq <= 0 || seq > (1 << 22) || dim % nh || nh % nkv ||
        (dim / nh) % 2)
        return tb_errorf(TB_ERR_FORMAT, "%s: implausible llama2.c header (dim %d, "
                         "hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
                         "vocab_size %d, seq_len %d): not a llama2.c checkpoint?",
                         path, dim, hidden, L, nh, nkv, h[5], seq);
    int64_t hs = dim / nh, kv_dim = (int64_t)nkv * hs;

    /* Float offsets of each array; all products fit easily in 64 bits
     * under the limits above. */
    uint64_t o = 0;
    uint64_t o_emb = o;     o += (uint64_t)vocab * dim;
    uint64_t o_att = o;     o += (uint64_t)L * dim;
    uint64_t o_wq = o;      o += (uint64_t)L * dim * dim;
    uint64_t o_wk = o;      o += (uint64_t)L * kv_dim * dim;
    uint64_t o_wv = o;      o += (uint64_t)L * kv_dim * dim;
    uint64_t o_wo = o;      o += (uint64_t)L * dim * dim;
    uint64_t o_ffn = o;     o += (uint64_t)L * dim;
    uint64_t o_w1 = o;      o += (uint64_t)L * hidden * dim;
    uint64_t o_w2 = o;      o += (uint64_t)L * dim * hidden;
    uint64_t o_w3 = o;      o += (uint64_t)L * hidden * dim;
    uint64_t o_fin = o;     o += (uint64_t)dim;
    o += (uint64_t)seq * (hs / 2) * 2; /* freq_cis_real, freq_cis_imag */
    uint64_t o_cls = o;     if (!shared) o += (uint64_t)vocab * dim;
    uint64_t expect = TB_L2C_HEADER_BYTES + o * 4;
    if (expect != m->size)
        return tb_errorf(TB_ERR_FORMAT, "%s: %s llama2.c checkpoint: expected %llu bytes, "
                         "file has %zu", path, m->size < expect ? "truncated" : "oversized",
                         (unsigned long long)expect, m->size);

    const uint8_t *base = m->data + TB_L2C_HEADER_BYTES;
    TB_TRY(add(s, base, o_emb, "model.embed_tokens.weight", vocab, dim));
    char name[128];
    for (int l = 0; l < L; l++) {
        const struct { uint64_t off; const char *fmt; int64_t d0, d1; } t[] = {
            {o_att + (uint64_t)l * dim, "model.layers.%d.input_layernorm.weight", dim, -1},
            {o_wq + (uint64_t)l * dim * dim, "model.layers.%d.self_attn.q_proj.weight", dim, dim},
            {o_wk + (uint64_t)l * kv_dim * dim, "model.layers.%d.self_attn.k_proj.weight", kv_dim, dim},
            {o_wv + (uint64_t)l * kv_dim * dim, "model.layers.%d.self_attn.v_proj.weight", kv_dim, dim},
            {o_wo + (uint64_t)l * dim * dim, "model.layers.%d.self_attn.o_proj.weight", dim, dim},
            {o_ffn + (uint64_t)l * dim, "model.layers.%d.post_attention_layernorm.weight", dim, -1},
            {o_w1 + (uint64_t)l * hidden * dim, "model.layers.%d.mlp.gate_proj.weight", hidden, dim},
            {o_w2 + (uint64_t)l * dim * hidden, "model.layers.%d.mlp.down_proj.weight", dim, hidden},
            {o_w3 + (uint64_t)l * hidden * dim, "model.layers.%d.mlp.up_proj.weight", hidden, dim},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(name, sizeof name, t[i].fmt, l);
            TB_TRY(add(s, base, t[i].off, name, t[i].d0, t[i].d1));
        }
    }
    TB_TRY(add(s, base, o_fin, "model.norm.weight", dim, -1));
    if (!shared) TB_TRY(add(s, base, o_cls, "lm_head.weight", vocab, dim));

    tb_model_config *c = &s->cfg;
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "llama");
    c->vocab_size = (int)vocab;
    c->dim = dim;
    c->hidden_dim = hidden;
    c->n_layers = L;
    c->n_heads = nh;
    c->n_kv_heads = nkv;
    c->head_dim = (int)hs;
    c->max_seq_len = seq;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_scaling = TB_ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    c->rope_interleaved = 1;
    c->tie_embeddings = shared;
    c->attn_bias = 0;
    c->bos_id = 1;
    for (int i = 0; i < TB_MAX_EOS; i++) c->eos_ids[i] = -1;
    c->eos_ids[0] = 2;
    c->n_eos = 1;
    c->src_dtype = TB_F32;
    s->dir[0] = 0;
    s->tok_path[0] = 0;
    return TB_OK;
}
