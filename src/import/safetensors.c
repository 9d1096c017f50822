/* safetensors.c — one .safetensors file: an 8-byte little-endian header
 * length, a JSON header {name: {dtype, shape, data_offsets}}, then the data.
 * Every field is checked against the file size before a tensor is added. */
#include "import/source_impl.h"

#include <jansson.h>

/* Headers of real checkpoints are well under a megabyte per thousand
 * tensors; anything past this is not a header. */
#define TB_ST_MAX_HEADER ((uint64_t)256 << 20)

static uint64_t read_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* F32/F16/BF16 map to a dtype; other safetensors dtypes are known but
 * refused; anything else is not a safetensors dtype at all. */
static tb_status parse_dtype(const char *path, const char *name, const char *s,
                             tb_dtype *out) {
    if (strcmp(s, "F32") == 0) { *out = TB_F32; return TB_OK; }
    if (strcmp(s, "F16") == 0) { *out = TB_F16; return TB_OK; }
    if (strcmp(s, "BF16") == 0) { *out = TB_BF16; return TB_OK; }
    static const char *known[] = {"F64", "I64", "U64", "I32", "U32", "I16",
                                  "U16", "I8", "U8", "BOOL", "F8_E4M3",
                                  "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                                  "F6_E3M2", "C64"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(s, known[i]) == 0)
            return tb_errorf(TB_ERR_UNSUPPORTED,
                             "%s: tensor %s has dtype %s, which is not supported "
                             "(supported: F32, F16, BF16)", path, name, s);
    return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s has unknown dtype '%s'", path,
                     name, s);
}

static tb_status parse_entry(tb_model_source *s, const char *path, const char *name,
                             json_t *e, const uint8_t *data, uint64_t data_size) {
    if (!json_is_object(e))
        return tb_errorf(TB_ERR_FORMAT, "%s: header entry %s is not an object", path, name);
    tb_src_tensor t;
    memset(&t, 0, sizeof t);
    if (strlen(name) >= sizeof t.name)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: tensor name %.64s... is longer than "
                         "%zu characters", path, name, sizeof t.name - 1);
    snprintf(t.name, sizeof t.name, "%s", name);

    json_t *jd = json_object_get(e, "dtype");
    if (!json_is_string(jd))
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s has no dtype", path, name);
    TB_TRY(parse_dtype(path, name, json_string_value(jd), &t.dtype));

    json_t *js = json_object_get(e, "shape");
    if (!json_is_array(js))
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s has no shape", path, name);
    size_t rank = json_array_size(js);
    if (rank > 4)
        return tb_errorf(TB_ERR_UNSUPPORTED, "%s: tensor %s has rank %zu (at most 4 "
                         "supported)", path, name, rank);
    t.rank = (int)rank;
    uint64_t numel = 1;
    for (size_t i = 0; i < rank; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s has a bad shape", path, name);
        uint64_t v = (uint64_t)json_integer_value(d);
        if (v && numel > UINT64_MAX / 16 / v)
            return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s shape overflows", path, name);
        numel *= v;
        t.dims[i] = (int64_t)v;
    }

    json_t *jo = json_object_get(e, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s has no data_offsets [begin, end]",
                         path, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t en = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || en < b)
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s has bad data_offsets [%lld, %lld]",
                         path, name, (long long)b, (long long)en);
    if ((uint64_t)en > data_size)
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s data_offsets [%lld, %lld] run past "
                         "the end of the data (%llu bytes): the file is truncated or "
                         "corrupted", path, name, (long long)b, (long long)en,
                         (unsigned long long)data_size);
    uint64_t want;
    if (tb_dtype_tensor_bytes(t.dtype, t.rank, t.dims, &want) != TB_OK)
        return tb_error_prefix(TB_ERR_FORMAT, "%s: tensor %s", path, name);
    if ((uint64_t)(en - b) != want)
        return tb_errorf(TB_ERR_FORMAT, "%s: tensor %s holds %lld bytes but its dtype and "
                         "shape need %llu", path, name, (long long)(en - b),
                         (unsigned long long)want);
    t.data = data + b;
    t.nbytes = (size_t)want;
    return tb_source_add_tensor(s, &t);
}

tb_status tb_safetensors_parse(tb_model_source *s, const tb_mapped_file *m,
                               const char *path) {
    if (m->size < 8)
        return tb_errorf(TB_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors "
                         "file", path, m->size);
    uint64_t hlen = read_u64le(m->data);
    if (hlen < 2 || hlen > TB_ST_MAX_HEADER || hlen > m->size - 8)
        return tb_errorf(TB_ERR_FORMAT, "%s: safetensors header length %llu does not fit "
                         "in the file (%zu bytes): not a safetensors file, or truncated",
                         path, (unsigned long long)hlen, m->size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)m->data + 8, (size_t)hlen,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tb_errorf(TB_ERR_FORMAT, "%s: safetensors header is not valid JSON "
                         "(%s at byte %d)", path, jerr.text, jerr.position);
    tb_status st = TB_OK;
    if (!json_is_object(root)) {
        st = tb_errorf(TB_ERR_FORMAT, "%s: safetensors header is not a JSON object", path);
    } else {
        const uint8_t *data = m->data + 8 + hlen;
        uint64_t data_size = m->size - 8 - hlen;
        const char *key;
        json_t *val;
        json_object_foreach(root, key, val) {
            if (strcmp(key, "__metadata__") == 0) continue;
            st = parse_entry(s, path, key, val, data, data_size);
            if (st != TB_OK) break;
        }
    }
    json_decref(root);
    return st;
}
