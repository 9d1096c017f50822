/*
 * source_impl.h — what the import front ends share: the tb_model_source
 * layout, its file list and tensor table, and the front-end entry points.
 *
 * A source owns every file it maps (unmapped by tb_source_free) and a flat
 * tensor table whose data pointers point into those mappings. Lookup by name
 * goes through an open-addressing hash built once after loading.
 */
#ifndef TB_IMPORT_SOURCE_IMPL_H
#define TB_IMPORT_SOURCE_IMPL_H

#include "import/import.h"

#define TB_SOURCE_PATH_MAX 4096

struct tb_model_source {
    tb_model_config cfg;
    char dir[TB_SOURCE_PATH_MAX];       /* HF folder; "" for llama2.c       */
    char tok_path[TB_SOURCE_PATH_MAX];  /* DIR/tokenizer.json or ""         */
    char origin[TB_SOURCE_PATH_MAX];    /* what was opened, for messages    */

    tb_mapped_file *files;              /* (n_files) owned mappings         */
    int n_files, cap_files;

    tb_src_tensor *tensors;             /* (n_tensors)                      */
    int n_tensors, cap_tensors;

    int *slots;                         /* (n_slots) tensor index or -1     */
    int n_slots;
};

/* ---------------------------------------------------------------- source.c */
/* Maps `path` and keeps the mapping for the life of the source. */
tb_status tb_source_map_file(tb_model_source *s, const char *path,
                             const tb_mapped_file **out);
/* Appends a tensor; a second tensor of the same name is a format error.
 * Lookups work only after tb_source_index(). */
tb_status tb_source_add_tensor(tb_model_source *s, const tb_src_tensor *t);
tb_status tb_source_index(tb_model_source *s);

/* ---------------------------------------------------------------- front ends */
/* Parses one mapped safetensors file and appends its tensors; `path` is for
 * messages only. */
tb_status tb_safetensors_parse(tb_model_source *s, const tb_mapped_file *m,
                               const char *path);
tb_status tb_hf_open(tb_model_source *s, const char *dir);
/* The `n` bytes of DIR/config.json (`dir` is for messages); *tie_present:
 * whether it sets tie_word_embeddings. */
tb_status tb_hf_config_parse(tb_model_config *c, const char *text, size_t n,
                             const char *dir, int *tie_present);
tb_status tb_llama2c_open(tb_model_source *s, const char *path);
/* The checkpoint in `m` (which must outlive `s`); `path` is for messages. */
tb_status tb_llama2c_parse(tb_model_source *s, const tb_mapped_file *m,
                           const char *path);

#endif /* TB_IMPORT_SOURCE_IMPL_H */
