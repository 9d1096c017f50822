/* engine.c — writing, verifying and mapping engine files. */
#define _GNU_SOURCE
#include "plan/engine.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ir/ops.h"

#define HDR_SIZE 64
#define ENTRY_SIZE 48
#define ALIGN 4096
#define CHUNK (64ull << 20)
#define MAX_SECTIONS 32

typedef struct {
    char name[24];
    uint64_t offset, size, hash;
} entry;

/* ---------------------------------------------------------------- hashing */

typedef struct {
    const uint8_t *p;
    uint64_t n;
    uint64_t *out;
    uint64_t first, count, step;
} hash_job;

static void *hash_worker(void *arg) {
    hash_job *j = arg;
    for (uint64_t c = j->first; c < j->count; c += j->step) {
        uint64_t off = c * CHUNK, len = j->n - off < CHUNK ? j->n - off : CHUNK;
        j->out[c] = tb_hash64(j->p + off, len);
    }
    return NULL;
}

tb_status tb_section_hash(const uint8_t *p, uint64_t n, uint64_t *out) {
    uint64_t count = (n + CHUNK - 1) / CHUNK;
    if (count <= 1) {
        uint64_t h = tb_hash64(p, n);
        *out = tb_hash64(&h, sizeof h);
        return TB_OK;
    }
    uint64_t *hs = calloc(count, sizeof *hs);
    if (!hs) return tb_errorf(TB_ERR_OOM, "out of memory hashing a section of %llu bytes", (unsigned long long)n);
    int nth = tb_default_threads();
    if (nth > 8) nth = 8;
    if ((uint64_t)nth > count) nth = (int)count;
    pthread_t th[8];
    hash_job jobs[8];
    for (int i = 0; i < nth; i++) {
        jobs[i] = (hash_job){p, n, hs, (uint64_t)i, count, (uint64_t)nth};
        if (i && pthread_create(&th[i], NULL, hash_worker, &jobs[i]) != 0) {
            jobs[i].first = count; /* ran by nobody: do it here */
            for (uint64_t c = (uint64_t)i; c < count; c += (uint64_t)nth) {
                uint64_t off = c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
                hs[c] = tb_hash64(p + off, len);
            }
            th[i] = 0;
        }
    }
    hash_worker(&jobs[0]);
    for (int i = 1; i < nth; i++)
        if (th[i]) pthread_join(th[i], NULL);
    *out = tb_hash64(hs, count * sizeof *hs);
    free(hs);
    return TB_OK;
}

/* ---------------------------------------------------------------- writing */

static uint64_t align_up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* Writes n bytes of a section; runs of zero bytes a whole HOLE_CHUNK long
 * (at HOLE_CHUNK-aligned file offsets) are skipped with a seek, so the file
 * system leaves holes there: an engine of zero weights (a checkpoint made
 * only to time a shape, bench/gpu/torch_ckpt.py --empty) takes no disk space
 * for them and reads back as zeros. */
#define HOLE_CHUNK ((uint64_t)1 << 20)
static int write_sparse(FILE *f, const uint8_t *p, uint64_t pos, uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
        uint64_t at = pos + done, next = (at / HOLE_CHUNK + 1) * HOLE_CHUNK, len = next - at;
        if (len > n - done) len = n - done;
        if (len == HOLE_CHUNK && tb_all_zero(p + done, (size_t)len)) {
            if (fseeko(f, (off_t)len, SEEK_CUR) != 0) return 0;
        } else if (fwrite(p + done, 1, (size_t)len, f) != len) {
            return 0;
        }
        done += len;
    }
    return 1;
}

tb_status tb_engine_write(const char *path, const tb_section_src *sec, int n) {
    if (n > MAX_SECTIONS) return tb_errorf(TB_ERR_INVALID_ARG, "too many sections");
    entry tab[MAX_SECTIONS];
    memset(tab, 0, sizeof tab);
    uint64_t off = align_up(HDR_SIZE + (uint64_t)n * ENTRY_SIZE);
    for (int i = 0; i < n; i++) {
        snprintf(tab[i].name, sizeof tab[i].name, "%s", sec[i].name);
        tab[i].offset = off;
        tab[i].size = sec[i].size;
        TB_TRY(tb_section_hash(sec[i].data, sec[i].size, &tab[i].hash));
        off = align_up(off + sec[i].size);
    }
    uint64_t file_size = off;
    uint8_t hdr[HDR_SIZE];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, TB_ENGINE_MAGIC, 8);
    uint32_t ver = TB_ENGINE_VERSION, cnt = (uint32_t)n;
    memcpy(hdr + 8, &ver, 4);
    memcpy(hdr + 12, &cnt, 4);
    memcpy(hdr + 16, &file_size, 8);
    uint64_t th = tb_hash64(tab, (size_t)n * ENTRY_SIZE);
    memcpy(hdr + 24, &th, 8);

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return tb_errorf(TB_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    int ok = fwrite(hdr, 1, HDR_SIZE, f) == HDR_SIZE && fwrite(tab, ENTRY_SIZE, (size_t)n, f) == (size_t)n;
    /* the gaps between sections (zero padding) are seeked over and the
     * file's length set at the end: unwritten ranges read as zeros */
    for (int i = 0; ok && i < n; i++) {
        ok = fseeko(f, (off_t)tab[i].offset, SEEK_SET) == 0;
        if (ok && sec[i].size) ok = write_sparse(f, sec[i].data, tab[i].offset, sec[i].size);
    }
    if (ok) ok = fflush(f) == 0 && ftruncate(fileno(f), (off_t)file_size) == 0;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        remove(tmp);
        return tb_errorf(TB_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return tb_errorf(TB_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- loading */

static const entry *find_section(const entry *tab, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strncmp(tab[i].name, name, sizeof tab[i].name)) return &tab[i];
    return NULL;
}

static int jint(json_t *o, const char *k, int def) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

static tb_status parse_meta(tb_engine *e) {
    json_error_t err;
    json_t *m = json_loads(e->meta_json, 0, &err);
    if (!m) return tb_errorf(TB_ERR_FORMAT, "engine meta section is not valid JSON: %s", err.text);
    json_t *model = json_object_get(m, "model"), *build = json_object_get(m, "build"),
           *sp = json_object_get(m, "special");
    const char *kind = json_string_value(json_object_get(m, "kind"));
    if (kind && !strcmp(kind, "onnx")) { /* a general engine: inputs and outputs are in the graph */
        tb_engine_info *in = &e->info;
        memset(in, 0, sizeof *in);
        snprintf(in->arch, sizeof in->arch, "onnx");
        in->tensor_parallel = 1;
        in->bos_id = -1;
        for (int i = 0; i < 4; i++) in->eos_ids[i] = -1;
        const char *dt = json_is_object(build) ? json_string_value(json_object_get(build, "dtype")) : NULL;
        tb_status s = dt ? tb_dtype_parse(dt, &in->weight_dtype) : TB_ERR_FORMAT;
        json_decref(m);
        return s == TB_OK ? TB_OK : tb_errorf(TB_ERR_FORMAT, "engine meta section lacks build.dtype");
    }
    if (!json_is_object(model) || !json_is_object(build) || !json_is_object(sp)) {
        json_decref(m);
        return tb_errorf(TB_ERR_FORMAT, "engine meta section lacks model/build/special");
    }
    tb_engine_info *in = &e->info;
    memset(in, 0, sizeof *in);
    snprintf(in->arch, sizeof in->arch, "%s", json_string_value(json_object_get(model, "arch")) ?: "?");
    in->vocab_size = jint(model, "vocab_size", 0);
    in->dim = jint(model, "dim", 0);
    in->n_layers = jint(model, "n_layers", 0);
    in->n_heads = jint(model, "n_heads", 0);
    in->n_kv_heads = jint(model, "n_kv_heads", 0);
    in->head_dim = jint(model, "head_dim", 0);
    in->hidden_dim = jint(model, "hidden_dim", 0);
    e->rope_interleaved = jint(model, "rope_interleaved", 0);
    in->max_seq_len = jint(build, "max_seq_len", 0);
    in->max_batch = jint(build, "max_batch", 1);
    in->tensor_parallel = jint(build, "tensor_parallel", 1);
    e->tp = in->tensor_parallel;
    e->max_step_tokens = jint(build, "max_step_tokens", 512);
    const char *dt = json_string_value(json_object_get(build, "dtype"));
    tb_status s = dt ? tb_dtype_parse(dt, &in->weight_dtype) : TB_ERR_FORMAT;
    in->bos_id = jint(sp, "bos", -1);
    in->add_bos = jint(sp, "add_bos", 0);
    for (int i = 0; i < 4; i++) in->eos_ids[i] = -1;
    json_t *eos = json_object_get(sp, "eos");
    for (size_t i = 0; json_is_array(eos) && i < json_array_size(eos) && i < 4; i++)
        in->eos_ids[i] = (int)json_integer_value(json_array_get(eos, i));
    json_decref(m);
    if (s != TB_OK || in->vocab_size <= 0 || in->n_layers <= 0 || in->max_seq_len <= 0 || in->n_heads <= 0 ||
        in->n_kv_heads <= 0 || in->head_dim <= 0)
        return tb_errorf(TB_ERR_FORMAT, "engine meta section has invalid model sizes");
    if (e->tp < 1 || e->tp > TB_MAX_TP || in->n_kv_heads % e->tp || in->n_heads % e->tp || in->vocab_size % e->tp)
        return tb_errorf(TB_ERR_FORMAT, "engine meta section: tensor_parallel %d does not split the model's heads "
                         "%d/%d and vocabulary %d (1..%d ranks)", e->tp, in->n_heads, in->n_kv_heads, in->vocab_size,
                         TB_MAX_TP);
    return TB_OK;
}

/* Checks the header and table of the `size` bytes at `p`; verifies checksums
 * when `verify`. `path` is for messages. */
static tb_status check_image(const char *path, const uint8_t *p, size_t size, entry *tab, int *n_out, int verify) {
    if (size < HDR_SIZE || memcmp(p, TB_ENGINE_MAGIC, 8) != 0)
        return tb_errorf(TB_ERR_FORMAT, "%s is not a Turbine engine (bad magic)", path);
    uint32_t ver, cnt;
    uint64_t fsize, th;
    memcpy(&ver, p + 8, 4);
    memcpy(&cnt, p + 12, 4);
    memcpy(&fsize, p + 16, 8);
    memcpy(&th, p + 24, 8);
    for (int i = 32; i < HDR_SIZE; i++)
        if (p[i] != 0) /* reserved: written as zeros */
            return tb_errorf(TB_ERR_FORMAT, "%s: corrupted header (reserved byte %d is not zero)", path, i);
    if (ver != TB_ENGINE_VERSION)
        return tb_errorf(TB_ERR_VERSION, "%s has engine format version %u; this turbine reads version %u%s", path, ver,
                         TB_ENGINE_VERSION, ver > TB_ENGINE_VERSION ? " (the engine is newer: upgrade turbine)" : "");
    if (fsize != size)
        return tb_errorf(TB_ERR_FORMAT, "%s is %s: header says %llu bytes, file has %zu", path,
                         fsize > size ? "truncated" : "oversized", (unsigned long long)fsize, size);
    if (cnt == 0 || cnt > MAX_SECTIONS || HDR_SIZE + (uint64_t)cnt * ENTRY_SIZE > size)
        return tb_errorf(TB_ERR_FORMAT, "%s: corrupted section table (%u sections)", path, cnt);
    memcpy(tab, p + HDR_SIZE, (size_t)cnt * ENTRY_SIZE);
    if (tb_hash64(tab, (size_t)cnt * ENTRY_SIZE) != th)
        return tb_errorf(TB_ERR_CHECKSUM, "%s: the section table's checksum does not match (corrupted file)", path);
    for (uint32_t i = 0; i < cnt; i++) {
        tab[i].name[sizeof tab[i].name - 1] = 0;
        if (tab[i].offset > size || tab[i].size > size - tab[i].offset)
            return tb_errorf(TB_ERR_FORMAT, "%s: section '%s' lies outside the file", path, tab[i].name);
        uint64_t h = 0;
        if (verify) TB_TRY(tb_section_hash(p + tab[i].offset, tab[i].size, &h));
        if (verify && h != tab[i].hash)
            return tb_errorf(TB_ERR_CHECKSUM, "%s: section '%s' is corrupted (checksum mismatch)", path, tab[i].name);
    }
    *n_out = (int)cnt;
    return TB_OK;
}

/* Maps and checks the header and table; verifies checksums when `verify`. */
static tb_status open_checked(const char *path, tb_mapped_file *map, entry *tab, int *n_out, int verify) {
    TB_TRY(tb_file_map(path, map));
    tb_status s = check_image(path, map->data, map->size, tab, n_out, verify);
    if (s != TB_OK) tb_file_unmap(map);
    return s;
}

static char *dup_section(const tb_mapped_file *m, const entry *e) {
    char *s = malloc(e->size + 1);
    if (!s) return NULL;
    memcpy(s, m->data + e->offset, e->size);
    s[e->size] = 0;
    return s;
}

tb_status tb_engine_load(const char *path, tb_engine **out) { return tb_engine_load_for(path, NULL, out); }

/* Everything after the header and table (checked: `tab`, `n`); `e->map`
 * holds the image. */
static tb_status load_sections(tb_engine *e, const char *path, const char *device, const entry *tab, int n) {
    const char *need[] = {"meta", "hardware", "tokenizer", "graph", "weights"};
    const entry *sec[5];
    for (int i = 0; i < 5; i++) {
        sec[i] = find_section(tab, n, need[i]);
        /* a general (ONNX) engine has no tokenizer: checked after the meta */
        if (!sec[i] && i != 2) return tb_errorf(TB_ERR_FORMAT, "%s: section '%s' is missing", path, need[i]);
    }
    e->meta_json = dup_section(&e->map, sec[0]);
    e->hw_json = dup_section(&e->map, sec[1]);
    if (!e->meta_json || !e->hw_json) return tb_errorf(TB_ERR_OOM, "out of memory");
    TB_TRY(tb_backend_check(e->hw_json, device));
    tb_backend_kind_of(e->hw_json, e->backend);
    TB_TRY(parse_meta(e));
    int llm = strcmp(e->info.arch, "onnx") != 0;
    if (llm && !sec[2]) return tb_errorf(TB_ERR_FORMAT, "%s: section 'tokenizer' is missing", path);
    if (llm) TB_TRY(tb_tokenizer_deserialize(e->map.data + sec[2]->offset, sec[2]->size, &e->tok));
    if (!llm) e->tp = 1;
    for (int r = 0; r < e->tp; r++) {
        const entry *gs = sec[3], *ws = sec[4];
        char gname[24], wname[24];
        if (r > 0) {
            snprintf(gname, sizeof gname, "graph.%d", r);
            snprintf(wname, sizeof wname, "weights.%d", r);
            gs = find_section(tab, n, gname);
            ws = find_section(tab, n, wname);
            if (!gs || !ws)
                return tb_errorf(TB_ERR_FORMAT, "%s: section '%s' of tensor-parallel rank %d (of %d) is missing", path,
                                 gs ? wname : gname, r, e->tp);
        }
        tb_graph *g;
        TB_TRY(tb_graph_deserialize(e->map.data + gs->offset, gs->size, &g));
        e->rank_graph[r] = g;
        if (r == 0) e->graph = g;
        if (llm != (g->n_outputs == 0))
            return tb_errorf(TB_ERR_FORMAT, "%s: the graph does not match the engine kind", path);
        const uint8_t *w = e->map.data + ws->offset;
        for (int i = 0; i < g->n_values; i++) {
            tb_value *v = &g->values[i];
            if (v->kind != TB_VAL_WEIGHT) continue;
            uint64_t want;
            tb_status s = tb_value_bytes(g, v, NULL, &want);
            if (s != TB_OK) return tb_error_prefix(s, "%s", path);
            if (v->nbytes != want || v->offset > ws->size || v->nbytes > ws->size - v->offset)
                return tb_errorf(TB_ERR_FORMAT, "%s: weight '%s' lies outside the weight section", path, v->name);
            v->data = w + v->offset;
        }
    }
    if (llm && tb_tokenizer_vocab_size(e->tok) > e->info.vocab_size)
        tb_log(TB_LOG_WARN, "tokenizer has %d tokens, model %d", tb_tokenizer_vocab_size(e->tok), e->info.vocab_size);
    return TB_OK;
}

tb_status tb_engine_load_for(const char *path, const char *device, tb_engine **out) {
    *out = NULL;
    double t0 = tb_now();
    tb_engine *e = calloc(1, sizeof *e);
    if (!e) return tb_errorf(TB_ERR_OOM, "out of memory");
    entry tab[MAX_SECTIONS];
    int n = 0;
    tb_status s = open_checked(path, &e->map, tab, &n, 1);
    if (s != TB_OK) { free(e); return s; }
    if ((s = load_sections(e, path, device, tab, n)) != TB_OK) {
        tb_engine_free(e);
        return tb_error_prefix(s, "cannot load engine");
    }
    e->load_seconds = tb_now() - t0;
    *out = e;
    return TB_OK;
}

tb_status tb_engine_load_mem(const void *data, size_t size, const char *name, const char *device, tb_engine **out) {
    *out = NULL;
    double t0 = tb_now();
    tb_engine *e = calloc(1, sizeof *e);
    if (!e) return tb_errorf(TB_ERR_OOM, "out of memory");
    e->map = (tb_mapped_file){.data = data, .size = size, .fd = -1};
    e->borrowed = 1;
    entry tab[MAX_SECTIONS];
    int n = 0;
    tb_status s = check_image(name, data, size, tab, &n, 1);
    if (s != TB_OK) { free(e); return s; }
    if ((s = load_sections(e, name, device, tab, n)) != TB_OK) {
        tb_engine_free(e);
        return tb_error_prefix(s, "cannot load engine");
    }
    e->load_seconds = tb_now() - t0;
    *out = e;
    return TB_OK;
}

void tb_engine_free(tb_engine *e) {
    if (!e) return;
    for (int r = 1; r < TB_MAX_TP; r++) tb_graph_free(e->rank_graph[r]);
    tb_graph_free(e->graph);
    tb_tokenizer_free(e->tok);
    free(e->meta_json);
    free(e->hw_json);
    if (!e->borrowed) tb_file_unmap(&e->map);
    free(e);
}

void tb_engine_get_info(const tb_engine *e, tb_engine_info *out) { *out = e->info; }
const tb_tokenizer *tb_engine_tokenizer(const tb_engine *e) { return e->tok; }

/* The weights: one line per tensor (dtype, shape, bytes, offset in the
 * weights section), then bits per
 * weight over the matmul weights (codes with their scales and zeros, per
 * element of the dequantised matrix) and over every weight. */
static void describe_weights(const tb_graph *g, char *buf, size_t cap, size_t *kp) {
    size_t k = *kp;
#define OUTW(...) do { if (k < cap) k += (size_t)snprintf(buf + k, cap - k, __VA_ARGS__); } while (0)
    uint64_t all_bytes = 0, all_elems = 0, mm_bytes = 0, mm_elems = 0;
    int n_w = 0;
    for (int i = 0; i < g->n_values; i++) n_w += g->values[i].kind == TB_VAL_WEIGHT;
    OUTW("weights: %d tensors\n", n_w);
    for (int i = 0; i < g->n_values; i++) {
        const tb_value *v = &g->values[i];
        if (v->kind != TB_VAL_WEIGHT) continue;
        char shape[96];
        tb_value_shape_str(g, v, shape, sizeof shape);
        OUTW("  %-24s %-9s %-16s %12llu bytes  at %llu\n", v->name, tb_dtype_name(v->dtype), shape,
             (unsigned long long)v->nbytes, (unsigned long long)v->offset);
        all_bytes += v->nbytes;
    }
    /* elements: of the matrices the matmuls compute with (codes count as
     * their matrix; scales and zeros add bytes, not elements) */
    for (int i = 0; i < g->n_nodes; i++) {
        const tb_node *n = &g->nodes[i];
        if (n->op != TB_OP_MATMUL && n->op != TB_OP_QMATMUL) continue;
        const tb_value *w = &g->values[n->in[1]];
        if (w->kind != TB_VAL_WEIGHT || w->rank != 2) continue;
        mm_elems += (uint64_t)w->dims[0] * (uint64_t)w->dims[1];
        mm_bytes += w->nbytes;
        if (n->op == TB_OP_QMATMUL) {
            mm_bytes += g->values[n->in[2]].nbytes;
            if (tb_node_attr_i(n, TB_QMM_HAS_ZEROS)) mm_bytes += g->values[n->in[n->n_in - 1]].nbytes; /* has_zeros: the last input */
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        const tb_value *v = &g->values[i];
        if (v->kind != TB_VAL_WEIGHT) continue;
        int is_side = 0; /* scales / zeros of a qmatmul: bytes of their matrix, no elements of their own */
        for (int j = 0; j < g->n_nodes && !is_side; j++) {
            const tb_node *n = &g->nodes[j];
            if (n->op != TB_OP_QMATMUL) continue;
            is_side = n->in[2] == i || (tb_node_attr_i(n, TB_QMM_HAS_ZEROS) && n->in[n->n_in - 1] == i);
        }
        if (is_side) continue;
        uint64_t e = 1;
        for (int d = 0; d < v->rank; d++) e *= (uint64_t)(v->dims[d] > 0 ? v->dims[d] : 0);
        all_elems += e;
    }
    if (mm_elems)
        OUTW("bits per weight: %.3f over the matmul weights (%llu weights, %llu bytes), %.3f over all weights "
             "(%llu, %llu bytes)\n",
             8.0 * (double)mm_bytes / (double)mm_elems, (unsigned long long)mm_elems, (unsigned long long)mm_bytes,
             all_elems ? 8.0 * (double)all_bytes / (double)all_elems : 0.0, (unsigned long long)all_elems,
             (unsigned long long)all_bytes);
    /* calibrated engines: the static activation scale of each qmatmul's
     * input (int8 / fp8 from --calib; 0, not listed, when none) */
    int n_act = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const tb_node *n = &g->nodes[i];
        if (n->op != TB_OP_QMATMUL || !(tb_node_attr_f(n, TB_QMM_ACT_SCALE) > 0)) continue;
        if (!n_act++) OUTW("activation scales (static, per tensor):\n");
        OUTW("  %-24s %.6g\n", g->values[n->in[1]].name, (double)tb_node_attr_f(n, TB_QMM_ACT_SCALE));
    }
#undef OUTW
    *kp = k;
}

tb_status tb_engine_describe(const char *path, char *buf, size_t cap) {
    tb_mapped_file map;
    entry tab[MAX_SECTIONS];
    int n = 0;
    TB_TRY(open_checked(path, &map, tab, &n, 1));
    size_t k = 0;
#define OUT(...) do { if (k < cap) k += (size_t)snprintf(buf + k, cap - k, __VA_ARGS__); } while (0)
    OUT("engine: %s\nformat version: %u\nfile size: %zu bytes\n", path, TB_ENGINE_VERSION, map.size);
    const entry *meta = find_section(tab, n, "meta"), *hw = find_section(tab, n, "hardware"),
                *graph = find_section(tab, n, "graph");
    if (meta) {
        char *m = dup_section(&map, meta);
        json_error_t err;
        json_t *o = m ? json_loads(m, 0, &err) : NULL;
        if (o) {
            char *pretty = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            OUT("meta: %s\n", pretty ? pretty : "?");
            free(pretty);
            json_decref(o);
        }
        free(m);
    }
    if (hw) {
        char *h = dup_section(&map, hw);
        OUT("hardware fingerprint: %s\n", h ? h : "?");
        if (h && tb_backend_check(h, NULL) != TB_OK) OUT("  (cannot run here: %s)\n", tb_last_error());
        free(h);
    }
    if (graph) {
        tb_graph *g = NULL;
        if (tb_graph_deserialize(map.data + graph->offset, graph->size, &g) == TB_OK) {
            int counts[TB_OP_COUNT] = {0};
            for (int i = 0; i < g->n_nodes; i++) counts[g->nodes[i].op]++;
            OUT("graph: %d nodes, %d values%s\n  ops:", g->n_nodes, g->n_values,
                find_section(tab, n, "graph.1") ? " (tensor-parallel rank 0; graph.R and weights.R hold rank R's "
                                                  "shard, the same ops over its slices)"
                                                : "");
            for (int i = 0; i < TB_OP_COUNT; i++)
                if (counts[i]) OUT(" %s x%d", tb_op_name((tb_op_kind)i), counts[i]);
            OUT("\n  profiles:");
            for (int i = 0; i < g->n_syms; i++)
                OUT(" %s [min %lld, opt %lld, max %lld]", g->syms[i].name, (long long)g->syms[i].min,
                    (long long)g->syms[i].opt, (long long)g->syms[i].max);
            OUT("\n");
            describe_weights(g, buf, cap, &k);
            tb_graph_free(g);
        }
    }
    OUT("sections:\n");
    for (int i = 0; i < n; i++)
        OUT("  %-10s offset %12llu  size %12llu  xxh3 %016llx  ok\n", tab[i].name, (unsigned long long)tab[i].offset,
            (unsigned long long)tab[i].size, (unsigned long long)tab[i].hash);
#undef OUT
    tb_file_unmap(&map);
    return TB_OK;
}
