/*
 * model_repo.c — config.json parsing and model repository scanning
 * (model_repo.h). The config takes Triton's JSON field names so that a
 * Triton user's config reads the same; fields Triton has and this server
 * does not honour are refused by name rather than silently ignored, as is
 * any unknown key (a typo must not leave a setting at its default).
 */
#include "serve/model_repo.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

void tb_repo_config_default(tb_repo_config *c) {
    memset(c, 0, sizeof *c);
    c->instance_count = 1;
    c->warmup = -1;
    c->policy = TB_VERSIONS_LATEST;
    c->latest_n = 1;
    c->dtype = TB_F32;
}

void tb_repo_config_batcher(const tb_repo_config *c, tb_batcher_config *out) {
    tb_batcher_config_default(out);
    out->max_batch_size = c->dynamic_batching && c->max_batch_size > 1 ? c->max_batch_size : 1;
    memcpy(out->preferred_batch_size, c->preferred_batch_size, sizeof out->preferred_batch_size);
    out->n_preferred = out->max_batch_size > 1 ? c->n_preferred : 0;
    out->max_queue_delay_us = c->max_queue_delay_us;
    out->max_queue_size = c->max_queue_size;
    out->default_timeout_us = c->default_timeout_us;
    out->instance_count = c->instance_count;
    out->threads_per_instance = c->threads_per_instance;
    out->device = c->device[0] ? c->device : NULL;
    out->warmup = c->warmup;
}

/* ---------------------------------------------------------------- config */

/* Every key of obj must be one of keys[] (NULL-terminated). */
static tb_status only_keys(json_t *obj, const char *where, const char *const *keys) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        int ok = 0;
        for (int i = 0; keys[i]; i++) ok |= !strcmp(k, keys[i]);
        if (!ok) return tb_errorf(TB_ERR_FORMAT, "%s: unknown field '%s'", where, k);
    }
    return TB_OK;
}

/* An integer field in [lo, hi]; absent leaves *out. */
static tb_status get_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return TB_OK;
    if (!json_is_integer(v)) return tb_errorf(TB_ERR_FORMAT, "'%s' is not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return tb_errorf(TB_ERR_FORMAT, "'%s' is %lld, outside [%lld, %lld]", key, (long long)x, (long long)lo,
                         (long long)hi);
    *out = x;
    return TB_OK;
}

static tb_status get_str(json_t *obj, const char *key, char *out, size_t cap) {
    json_t *v = json_object_get(obj, key);
    if (!v) return TB_OK;
    if (!json_is_string(v)) return tb_errorf(TB_ERR_FORMAT, "'%s' is not a string", key);
    if (json_string_length(v) >= cap) return tb_errorf(TB_ERR_FORMAT, "'%s' is longer than %zu bytes", key, cap - 1);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return tb_errorf(TB_ERR_FORMAT, "'%s' holds a NUL byte", key);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return TB_OK;
}

static tb_status get_obj(json_t *obj, const char *key, json_t **out) {
    *out = json_object_get(obj, key);
    if (*out && !json_is_object(*out)) return tb_errorf(TB_ERR_FORMAT, "'%s' is not an object", key);
    return TB_OK;
}

static tb_status parse_dynamic(json_t *d, tb_repo_config *c) {
    static const char *const keys[] = {"preferred_batch_size", "max_queue_delay_microseconds",
                                       "default_queue_policy", NULL};
    tb_status s;
    int64_t x;
    if ((s = only_keys(d, "dynamic_batching", keys)) != TB_OK) return s;
    c->dynamic_batching = 1;
    json_t *p = json_object_get(d, "preferred_batch_size");
    if (p) {
        if (!json_is_array(p)) return tb_errorf(TB_ERR_FORMAT, "'preferred_batch_size' is not an array");
        if (json_array_size(p) > TB_BATCHER_MAX_PREFERRED)
            return tb_errorf(TB_ERR_FORMAT, "'preferred_batch_size' has more than %d sizes", TB_BATCHER_MAX_PREFERRED);
        for (size_t i = 0; i < json_array_size(p); i++) {
            json_t *v = json_array_get(p, i);
            if (!json_is_integer(v)) return tb_errorf(TB_ERR_FORMAT, "'preferred_batch_size' holds a non-integer");
            json_int_t n = json_integer_value(v);
            if (n < 1 || n > c->max_batch_size)
                return tb_errorf(TB_ERR_FORMAT, "preferred batch size %lld outside [1, max_batch_size %d]",
                                 (long long)n, c->max_batch_size);
            c->preferred_batch_size[c->n_preferred++] = (int)n;
        }
    }
    x = c->max_queue_delay_us;
    if ((s = get_int(d, "max_queue_delay_microseconds", 0, 60000000, &x)) != TB_OK) return s;
    c->max_queue_delay_us = x;
    json_t *q;
    if ((s = get_obj(d, "default_queue_policy", &q)) != TB_OK) return s;
    if (q) {
        static const char *const qkeys[] = {"max_queue_size", "default_timeout_microseconds", "timeout_action",
                                            "allow_timeout_override", NULL};
        if ((s = only_keys(q, "default_queue_policy", qkeys)) != TB_OK) return s;
        x = c->max_queue_size;
        if ((s = get_int(q, "max_queue_size", 0, 1 << 24, &x)) != TB_OK) return s;
        c->max_queue_size = (int)x;
        x = c->default_timeout_us;
        if ((s = get_int(q, "default_timeout_microseconds", 0, (int64_t)3600 * 1000000, &x)) != TB_OK) return s;
        c->default_timeout_us = x;
        char act[16] = "REJECT";
        if ((s = get_str(q, "timeout_action", act, sizeof act)) != TB_OK) return s;
        if (strcmp(act, "REJECT"))
            return tb_errorf(TB_ERR_FORMAT, "timeout_action '%s': only REJECT is supported", act);
        json_t *o = json_object_get(q, "allow_timeout_override");
        if (o && !json_is_boolean(o)) return tb_errorf(TB_ERR_FORMAT, "'allow_timeout_override' is not a boolean");
        if (o) c->allow_timeout_override = json_is_true(o);
    }
    return TB_OK;
}

static tb_status parse_instances(json_t *a, tb_repo_config *c) {
    if (!json_is_array(a)) return tb_errorf(TB_ERR_FORMAT, "'instance_group' is not an array");
    if (json_array_size(a) > 1)
        return tb_errorf(TB_ERR_FORMAT, "'instance_group' has %zu groups; one is supported", json_array_size(a));
    if (json_array_size(a) == 0) return TB_OK;
    json_t *g = json_array_get(a, 0);
    if (!json_is_object(g)) return tb_errorf(TB_ERR_FORMAT, "'instance_group' holds a non-object");
    static const char *const keys[] = {"count", "kind", "gpus", "threads", "name", NULL};
    tb_status s;
    if ((s = only_keys(g, "instance_group", keys)) != TB_OK) return s;
    int64_t x = c->instance_count;
    if ((s = get_int(g, "count", 1, TB_BATCHER_MAX_INSTANCES, &x)) != TB_OK) return s;
    c->instance_count = (int)x;
    x = c->threads_per_instance;
    if ((s = get_int(g, "threads", 0, 1024, &x)) != TB_OK) return s;
    c->threads_per_instance = (int)x;
    char kind[16] = "KIND_AUTO", name[TB_MODEL_NAME_MAX];
    if ((s = get_str(g, "kind", kind, sizeof kind)) != TB_OK) return s;
    if ((s = get_str(g, "name", name, sizeof name)) != TB_OK) return s;
    json_t *gpus = json_object_get(g, "gpus");
    int64_t gpu = 0;
    if (gpus) {
        if (!json_is_array(gpus) || json_array_size(gpus) != 1 || !json_is_integer(json_array_get(gpus, 0)))
            return tb_errorf(TB_ERR_FORMAT, "'gpus' must be an array of one GPU index");
        gpu = json_integer_value(json_array_get(gpus, 0));
        if (gpu < 0 || gpu > 255) return tb_errorf(TB_ERR_FORMAT, "GPU index %lld outside [0, 255]", (long long)gpu);
    }
    if (!strcmp(kind, "KIND_CPU")) {
        if (gpus) return tb_errorf(TB_ERR_FORMAT, "'gpus' given with KIND_CPU");
        snprintf(c->device, sizeof c->device, "cpu");
    } else if (!strcmp(kind, "KIND_GPU")) {
        snprintf(c->device, sizeof c->device, "cuda:%d", (int)gpu);
    } else if (!strcmp(kind, "KIND_AUTO")) {
        if (gpus) snprintf(c->device, sizeof c->device, "cuda:%d", (int)gpu);
    } else {
        return tb_errorf(TB_ERR_FORMAT, "instance kind '%s': KIND_AUTO, KIND_CPU or KIND_GPU", kind);
    }
    return TB_OK;
}

static tb_status parse_policy(json_t *p, tb_repo_config *c) {
    if (json_object_size(p) != 1)
        return tb_errorf(TB_ERR_FORMAT, "'version_policy' must hold exactly one of latest, all, specific");
    json_t *v;
    tb_status s;
    if ((v = json_object_get(p, "latest"))) {
        static const char *const keys[] = {"num_versions", NULL};
        if (!json_is_object(v)) return tb_errorf(TB_ERR_FORMAT, "'latest' is not an object");
        if ((s = only_keys(v, "latest", keys)) != TB_OK) return s;
        if (!json_object_get(v, "num_versions")) return tb_errorf(TB_ERR_FORMAT, "'latest' needs 'num_versions'");
        int64_t n = 1;
        if ((s = get_int(v, "num_versions", 1, TB_MODEL_MAX_VERSIONS, &n)) != TB_OK) return s;
        c->policy = TB_VERSIONS_LATEST;
        c->latest_n = (int)n;
    } else if ((v = json_object_get(p, "all"))) {
        if (!json_is_object(v) || json_object_size(v)) return tb_errorf(TB_ERR_FORMAT, "'all' must be {}");
        c->policy = TB_VERSIONS_ALL;
    } else if ((v = json_object_get(p, "specific"))) {
        static const char *const keys[] = {"versions", NULL};
        if (!json_is_object(v)) return tb_errorf(TB_ERR_FORMAT, "'specific' is not an object");
        if ((s = only_keys(v, "specific", keys)) != TB_OK) return s;
        json_t *a = json_object_get(v, "versions");
        if (!json_is_array(a) || json_array_size(a) == 0)
            return tb_errorf(TB_ERR_FORMAT, "'specific' needs a non-empty 'versions' array");
        if (json_array_size(a) > TB_MODEL_MAX_VERSIONS)
            return tb_errorf(TB_ERR_FORMAT, "'versions' lists more than %d", TB_MODEL_MAX_VERSIONS);
        c->policy = TB_VERSIONS_SPECIFIC;
        c->n_versions = 0;
        for (size_t i = 0; i < json_array_size(a); i++) {
            json_t *e = json_array_get(a, i);
            if (!json_is_integer(e) || json_integer_value(e) < 1)
                return tb_errorf(TB_ERR_FORMAT, "'versions' holds something other than a positive integer");
            int64_t ver = json_integer_value(e);
            for (int k = 0; k < c->n_versions; k++)
                if (c->versions[k] == ver) return tb_errorf(TB_ERR_FORMAT, "version %lld listed twice", (long long)ver);
            c->versions[c->n_versions++] = ver;
        }
    } else {
        const char *k = json_object_iter_key(json_object_iter(p));
        return tb_errorf(TB_ERR_FORMAT, "version_policy '%s': latest, all or specific", k);
    }
    return TB_OK;
}

static tb_status parse_build(json_t *b, tb_repo_config *c) {
    static const char *const keys[] = {"dtype", "shapes", "min_shapes", "opt_shapes", "max_shapes", "calib_data",
                                       NULL};
    tb_status s;
    if ((s = only_keys(b, "build", keys)) != TB_OK) return s;
    char dt[16] = "f32";
    if ((s = get_str(b, "dtype", dt, sizeof dt)) != TB_OK) return s;
    if (!strcmp(dt, "int8")) c->dtype = TB_I8;
    else if (tb_dtype_parse(dt, &c->dtype) != TB_OK || (c->dtype != TB_F32 && c->dtype != TB_F16 && c->dtype != TB_I8))
        return tb_errorf(TB_ERR_FORMAT, "build dtype '%s': f32, f16 or int8", dt);
    if ((s = get_str(b, "shapes", c->shapes, sizeof c->shapes)) != TB_OK) return s;
    if ((s = get_str(b, "min_shapes", c->min_shapes, sizeof c->min_shapes)) != TB_OK) return s;
    if ((s = get_str(b, "opt_shapes", c->opt_shapes, sizeof c->opt_shapes)) != TB_OK) return s;
    if ((s = get_str(b, "max_shapes", c->max_shapes, sizeof c->max_shapes)) != TB_OK) return s;
    if ((s = get_str(b, "calib_data", c->calib_data, sizeof c->calib_data)) != TB_OK) return s;
    if (c->shapes[0] && (c->min_shapes[0] || c->opt_shapes[0] || c->max_shapes[0]))
        return tb_errorf(TB_ERR_FORMAT, "build: 'shapes' sets all three; not with min/opt/max_shapes");
    return TB_OK;
}

static tb_status parse_root(json_t *root, const char *model_name, tb_repo_config *c) {
    static const char *const keys[] = {"name", "max_batch_size", "dynamic_batching", "instance_group",
                                       "version_policy", "build", "warmup", NULL};
    tb_status s;
    if (!json_is_object(root)) return tb_errorf(TB_ERR_FORMAT, "the config is not a JSON object");
    if ((s = only_keys(root, "config", keys)) != TB_OK) return s;
    char name[TB_MODEL_NAME_MAX] = "";
    if ((s = get_str(root, "name", name, sizeof name)) != TB_OK) return s;
    if (name[0] && model_name && strcmp(name, model_name))
        return tb_errorf(TB_ERR_FORMAT, "'name' is '%s' but the folder is '%s'", name, model_name);
    int64_t x = 0;
    if ((s = get_int(root, "max_batch_size", 0, TB_BATCHER_MAX_BATCH, &x)) != TB_OK) return s;
    c->max_batch_size = (int)x;
    json_t *o;
    if ((s = get_obj(root, "dynamic_batching", &o)) != TB_OK) return s;
    if (o && (s = parse_dynamic(o, c)) != TB_OK) return s;
    if ((o = json_object_get(root, "instance_group")) && (s = parse_instances(o, c)) != TB_OK) return s;
    if ((s = get_obj(root, "version_policy", &o)) != TB_OK) return s;
    if (o && (s = parse_policy(o, c)) != TB_OK) return s;
    if ((s = get_obj(root, "build", &o)) != TB_OK) return s;
    if (o && (s = parse_build(o, c)) != TB_OK) return s;
    /* Turbine's own: "auto" (GPU instances), "on" / true, "off" / false */
    if ((o = json_object_get(root, "warmup"))) {
        const char *w = json_is_string(o) ? json_string_value(o) : NULL;
        if (json_is_boolean(o)) c->warmup = json_is_true(o);
        else if (w && !strcmp(w, "auto")) c->warmup = -1;
        else if (w && !strcmp(w, "on")) c->warmup = 1;
        else if (w && !strcmp(w, "off")) c->warmup = 0;
        else return tb_errorf(TB_ERR_FORMAT, "'warmup' is \"auto\", \"on\", \"off\" or a boolean");
    }
    return TB_OK;
}

tb_status tb_repo_config_parse(const char *text, size_t len, const char *model_name, tb_repo_config *out) {
    tb_repo_config_default(out);
    if (len > TB_MODEL_CONFIG_MAX_BYTES)
        return tb_errorf(TB_ERR_FORMAT, "the config is larger than %u bytes", TB_MODEL_CONFIG_MAX_BYTES);
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) return tb_errorf(TB_ERR_FORMAT, "JSON error at line %d column %d: %s", err.line, err.column, err.text);
    tb_status s = parse_root(root, model_name, out);
    json_decref(root);
    if (s != TB_OK) tb_repo_config_default(out);
    return s;
}

/* ---------------------------------------------------------------- scanning */

static int valid_name(const char *n) {
    size_t len = strlen(n);
    if (len == 0 || len >= TB_MODEL_NAME_MAX || n[0] == '.') return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = n[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '-' || ch == '.'))
            return 0;
    }
    return 1;
}

/* A version folder's name: digits only, no leading zero, at most 15 of them. */
static int64_t version_of(const char *n) {
    size_t len = strlen(n);
    if (len == 0 || len > 15 || n[0] == '0') return 0;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (n[i] < '0' || n[i] > '9') return 0;
        v = v * 10 + (n[i] - '0');
    }
    return v;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static tb_status read_config(const char *path, const char *name, tb_repo_config *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return tb_errorf(TB_ERR_IO, "config.json: %s", strerror(errno));
    char *buf = malloc(TB_MODEL_CONFIG_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        return tb_errorf(TB_ERR_OOM, "out of memory reading config.json");
    }
    size_t n = fread(buf, 1, TB_MODEL_CONFIG_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    tb_status s;
    if (bad) s = tb_errorf(TB_ERR_IO, "config.json: read error");
    else if (n > TB_MODEL_CONFIG_MAX_BYTES)
        s = tb_errorf(TB_ERR_FORMAT, "config.json is larger than %u bytes", TB_MODEL_CONFIG_MAX_BYTES);
    else if ((s = tb_repo_config_parse(buf, n, name, c)) != TB_OK) tb_error_prefix(s, "config.json");
    free(buf);
    return s;
}

/* Fills m from DIR/<name>; the entry's status says whether it can be served. */
static void scan_model(const char *dir, const char *name, tb_model_entry *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    tb_repo_config_default(&m->config);
    tb_status s = TB_OK;
    char mdir[TB_MODEL_PATH_MAX], path[TB_MODEL_PATH_MAX + 64];
    int64_t found[TB_MODEL_MAX_VERSIONS];
    int n_found = 0, skipped = 0;
    DIR *d = NULL;

    if (!valid_name(name)) {
        s = tb_errorf(TB_ERR_FORMAT, "a model name is 1-%d of A-Z a-z 0-9 _ - . (not starting with '.')",
                      TB_MODEL_NAME_MAX - 1);
        goto done;
    }
    if ((size_t)snprintf(mdir, sizeof mdir, "%s/%s", dir, name) >= sizeof mdir) {
        s = tb_errorf(TB_ERR_FORMAT, "the model's path is longer than %d bytes", TB_MODEL_PATH_MAX - 1);
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", mdir);
    if (is_file(path)) {
        if ((s = read_config(path, name, &m->config)) != TB_OK) goto done;
    } else if (access(path, F_OK) == 0) {
        s = tb_errorf(TB_ERR_FORMAT, "config.json is not a plain file");
        goto done;
    }
    if (m->config.calib_data[0] && m->config.calib_data[0] != '/') {
        char abs[TB_MODEL_PATH_MAX + 64];
        snprintf(abs, sizeof abs, "%s/%s", mdir, m->config.calib_data);
        if (strlen(abs) >= sizeof m->config.calib_data) {
            s = tb_errorf(TB_ERR_FORMAT, "calib_data's path is too long");
            goto done;
        }
        snprintf(m->config.calib_data, sizeof m->config.calib_data, "%s", abs);
    }

    d = opendir(mdir);
    if (!d) {
        s = tb_errorf(TB_ERR_IO, "cannot read the model folder: %s", strerror(errno));
        goto done;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t v = version_of(de->d_name);
        if (v <= 0) continue; /* not a version folder: config.json, notes, ... */
        snprintf(path, sizeof path, "%s/%s", mdir, de->d_name);
        if (!is_dir(path)) continue;
        if (n_found == TB_MODEL_MAX_VERSIONS) { skipped++; continue; }
        found[n_found++] = v;
    }
    closedir(d);
    if (skipped) {
        s = tb_errorf(TB_ERR_FORMAT, "more than %d version folders", TB_MODEL_MAX_VERSIONS);
        goto done;
    }
    if (n_found == 0) {
        s = tb_errorf(TB_ERR_NOT_FOUND, "no version folder (DIR/%s/1/model.engine or model.onnx)", name);
        goto done;
    }
    qsort(found, (size_t)n_found, sizeof *found, cmp_i64);

    int64_t chosen[TB_MODEL_MAX_VERSIONS];
    int n_chosen = 0;
    const tb_repo_config *c = &m->config;
    if (c->policy == TB_VERSIONS_ALL) {
        memcpy(chosen, found, (size_t)n_found * sizeof *found);
        n_chosen = n_found;
    } else if (c->policy == TB_VERSIONS_LATEST) {
        int from = n_found > c->latest_n ? n_found - c->latest_n : 0;
        for (int i = from; i < n_found; i++) chosen[n_chosen++] = found[i];
    } else {
        for (int k = 0; k < c->n_versions; k++) {
            int have = 0;
            for (int i = 0; i < n_found; i++) have |= found[i] == c->versions[k];
            if (!have) {
                s = tb_errorf(TB_ERR_NOT_FOUND, "version %lld of the version policy has no folder",
                              (long long)c->versions[k]);
                goto done;
            }
            chosen[n_chosen++] = c->versions[k];
        }
        qsort(chosen, (size_t)n_chosen, sizeof *chosen, cmp_i64);
    }
    m->versions = calloc((size_t)n_chosen, sizeof *m->versions);
    if (!m->versions) {
        s = tb_errorf(TB_ERR_OOM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_chosen; i++) {
        tb_model_version *v = &m->versions[i];
        v->version = chosen[i];
        int len = snprintf(v->path, sizeof v->path, "%s/%lld/model.engine", mdir, (long long)chosen[i]);
        if (len < 0 || (size_t)len >= sizeof v->path) {
            s = tb_errorf(TB_ERR_FORMAT, "version %lld's path is too long", (long long)chosen[i]);
            goto done;
        }
        if (!is_file(v->path)) {
            snprintf(v->path, sizeof v->path, "%s/%lld/model.onnx", mdir, (long long)chosen[i]);
            v->is_onnx = 1;
            if (!is_file(v->path)) {
                s = tb_errorf(TB_ERR_NOT_FOUND, "version %lld holds neither model.engine nor model.onnx",
                              (long long)chosen[i]);
                goto done;
            }
        }
        m->n_versions = i + 1;
    }
done:
    m->status = s;
    if (s != TB_OK) {
        snprintf(m->error, sizeof m->error, "%s", tb_last_error());
        free(m->versions);
        m->versions = NULL;
        m->n_versions = 0;
    }
}

tb_status tb_model_repo_scan_model(const char *dir, const char *name, tb_model_entry *out) {
    memset(out, 0, sizeof *out);
    char p[TB_MODEL_PATH_MAX];
    if (!valid_name(name) || (size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p || !is_dir(p))
        return tb_errorf(TB_ERR_NOT_FOUND, "no model folder '%s' in %s", name, dir);
    scan_model(dir, name, out);
    return TB_OK;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const tb_model_entry *)a)->name, ((const tb_model_entry *)b)->name);
}

tb_status tb_model_repo_scan(const char *dir, tb_model_repo *out) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) {
        return tb_errorf(errno == ENOENT || errno == ENOTDIR ? TB_ERR_NOT_FOUND : TB_ERR_IO,
                         "model repository %s: %s", dir, strerror(errno));
    }
    /* Names first (bounded), then each model: scanning a model opens its
     * folder, and keeping the repository's DIR open meanwhile is fine, but
     * sorting needs them all anyway. */
    char (*names)[256] = malloc(sizeof *names * TB_MODEL_REPO_MAX_MODELS);
    if (!names) {
        closedir(d);
        return tb_errorf(TB_ERR_OOM, "out of memory");
    }
    int n = 0;
    tb_status s = TB_OK;
    struct dirent *de;
    char p[TB_MODEL_PATH_MAX + 256];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue; /* ., .., hidden folders */
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (!is_dir(p)) continue;           /* a README next to the models */
        if (n == TB_MODEL_REPO_MAX_MODELS) {
            s = tb_errorf(TB_ERR_FORMAT, "model repository %s holds more than %d models", dir,
                          TB_MODEL_REPO_MAX_MODELS);
            break;
        }
        snprintf(names[n++], sizeof names[0], "%s", de->d_name);
    }
    closedir(d);
    if (s == TB_OK && n > 0) {
        out->models = calloc((size_t)n, sizeof *out->models);
        if (!out->models) s = tb_errorf(TB_ERR_OOM, "out of memory");
    }
    if (s == TB_OK) {
        for (int i = 0; i < n; i++) scan_model(dir, names[i], &out->models[i]);
        out->n_models = n;
        qsort(out->models, (size_t)n, sizeof *out->models, cmp_entry);
    }
    free(names);
    return s;
}

const tb_model_entry *tb_model_repo_find(const tb_model_repo *r, const char *name) {
    for (int i = 0; i < r->n_models; i++)
        if (!strcmp(r->models[i].name, name)) return &r->models[i];
    return NULL;
}

void tb_model_entry_free(tb_model_entry *m) {
    if (!m) return;
    free(m->versions);
    m->versions = NULL;
    m->n_versions = 0;
}

void tb_model_repo_free(tb_model_repo *r) {
    if (!r) return;
    for (int i = 0; i < r->n_models; i++) tb_model_entry_free(&r->models[i]);
    free(r->models);
    r->models = NULL;
    r->n_models = 0;
}
