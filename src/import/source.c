/* source.c — the tb_source_* calls common to every front end: opening by
 * path kind, the tensor table and its hash, checked lookup, and freeing. */
#include "import/source_impl.h"

/* ---------------------------------------------------------------- tables */

tb_status tb_source_map_file(tb_model_source *s, const char *path,
                             const tb_mapped_file **out) {
    if (s->n_files == s->cap_files) {
        int cap = s->cap_files ? s->cap_files * 2 : 4;
        tb_mapped_file *f = realloc(s->files, (size_t)cap * sizeof *f);
        if (!f) return tb_errorf(TB_ERR_OOM, "out of memory opening %s", path);
        s->files = f;
        s->cap_files = cap;
    }
    tb_mapped_file *m = &s->files[s->n_files];
    TB_TRY(tb_file_map(path, m));
    s->n_files++;
    *out = m;
    return TB_OK;
}

/* FNV-1a; names are short and the table is built once. */
static uint32_t name_hash(const char *name) {
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h;
}

tb_status tb_source_add_tensor(tb_model_source *s, const tb_src_tensor *t) {
    if (s->n_tensors == s->cap_tensors) {
        int cap = s->cap_tensors ? s->cap_tensors * 2 : 64;
        tb_src_tensor *n = realloc(s->tensors, (size_t)cap * sizeof *n);
        if (!n) return tb_errorf(TB_ERR_OOM, "out of memory reading tensor table");
        s->tensors = n;
        s->cap_tensors = cap;
    }
    s->tensors[s->n_tensors++] = *t;
    return TB_OK;
}

tb_status tb_source_index(tb_model_source *s) {
    free(s->slots);
    s->slots = NULL;
    int n = 16;
    while (n < 2 * s->n_tensors) n *= 2;
    s->slots = malloc((size_t)n * sizeof *s->slots);
    if (!s->slots) return tb_errorf(TB_ERR_OOM, "out of memory indexing tensors");
    for (int i = 0; i < n; i++) s->slots[i] = -1;
    s->n_slots = n;
    for (int i = 0; i < s->n_tensors; i++) {
        uint32_t h = name_hash(s->tensors[i].name) & (uint32_t)(n - 1);
        while (s->slots[h] >= 0) {
            if (strcmp(s->tensors[s->slots[h]].name, s->tensors[i].name) == 0)
                return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s appears twice",
                                 s->origin, s->tensors[i].name);
            h = (h + 1) & (uint32_t)(n - 1);
        }
        s->slots[h] = i;
    }
    return TB_OK;
}

/* ---------------------------------------------------------------- open/free */

tb_status tb_source_open(const char *path, tb_model_source **out) {
    *out = NULL;
    if (!path || !*path) return tb_errorf(TB_ERR_INVALID_ARG, "no model path given");
    if (strlen(path) >= TB_SOURCE_PATH_MAX - 64)
        return tb_errorf(TB_ERR_INVALID_ARG, "model path is too long");
    tb_model_source *s = calloc(1, sizeof *s);
    if (!s) return tb_errorf(TB_ERR_OOM, "out of memory opening %s", path);
    snprintf(s->origin, sizeof s->origin, "%s", path);

    tb_status st;
    if (tb_is_dir(path)) {
        st = tb_hf_open(s, path);
    } else if (tb_file_exists(path)) {
        /* A config.json or .safetensors file stands for its folder. */
        size_t n = strlen(path);
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        int hf_file = strcmp(base, "config.json") == 0 ||
                      (n > 12 && strcmp(path + n - 12, ".safetensors") == 0);
        if (hf_file) {
            char dir[TB_SOURCE_PATH_MAX];
            if (base == path) snprintf(dir, sizeof dir, ".");
            else snprintf(dir, sizeof dir, "%.*s", (int)(base - path - 1), path);
            if (!dir[0]) snprintf(dir, sizeof dir, "/");
            st = tb_hf_open(s, dir);
        } else {
            st = tb_llama2c_open(s, path);
        }
    } else {
        st = tb_errorf(TB_ERR_IO, "cannot open model %s: no such file or folder",
                       path);
    }
    if (st == TB_OK && !s->slots) st = tb_source_index(s);
    if (st != TB_OK) {
        tb_source_free(s);
        return st;
    }
    *out = s;
    return TB_OK;
}

void tb_source_free(tb_model_source *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) tb_file_unmap(&s->files[i]);
    free(s->files);
    free(s->tensors);
    free(s->slots);
    free(s);
}

/* ---------------------------------------------------------------- queries */

const tb_model_config *tb_source_config(const tb_model_source *s) { return &s->cfg; }

const tb_src_tensor *tb_source_find(const tb_model_source *s, const char *name) {
    if (!s->slots || !name) return NULL;
    uint32_t mask = (uint32_t)(s->n_slots - 1);
    uint32_t h = name_hash(name) & mask;
    while (s->slots[h] >= 0) {
        const tb_src_tensor *t = &s->tensors[s->slots[h]];
        if (strcmp(t->name, name) == 0) return t;
        h = (h + 1) & mask;
    }
    return NULL;
}

static void shape_str(const tb_src_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "",
                              (long long)t->dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

tb_status tb_source_get(const tb_model_source *s, const char *name,
                        int64_t d0, int64_t d1, const tb_src_tensor **out) {
    *out = NULL;
    const tb_src_tensor *t = tb_source_find(s, name);
    if (!t) return tb_errorf(TB_ERR_NOT_FOUND, "tensor %s not found in %s", name, s->origin);
    int ok = d1 < 0 ? (t->rank == 1 && t->dims[0] == d0)
                    : (t->rank == 2 && t->dims[0] == d0 && t->dims[1] == d1);
    if (!ok) {
        char got[96], want[64];
        shape_str(t, got, sizeof got);
        if (d1 < 0) snprintf(want, sizeof want, "[%lld]", (long long)d0);
        else snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
        return tb_errorf(TB_ERR_FORMAT, "tensor %s in %s has shape %s, expected %s "
                         "(does config.json match the weights?)", name, s->origin,
                         got, want);
    }
    *out = t;
    return TB_OK;
}

int tb_source_tensor_count(const tb_model_source *s) { return s->n_tensors; }

const tb_src_tensor *tb_source_tensor_at(const tb_model_source *s, int i) {
    return i >= 0 && i < s->n_tensors ? &s->tensors[i] : NULL;
}

const char *tb_source_tokenizer_path(const tb_model_source *s) { return s->tok_path; }
const char *tb_source_dir(const tb_model_source *s) { return s->dir; }
