/*
 * engine.h — the engine file: one binary holding everything a run needs.
 *
 * Layout (little-endian):
 *   header   64 bytes: magic "TBENGINE", u32 format version, u32 section
 *            count, u64 file size, u64 checksum of the section table,
 *            32 reserved bytes that must be zero
 *   table    one 48-byte entry per section: name[24], offset, size, checksum
 *   sections each 4096-aligned:
 *     "meta"      JSON: model config, build options, special tokens,
 *                 optimisation profiles, build time
 *     "hardware"  JSON: the fingerprint (backend, CPU ISA the kernels need)
 *     "tokenizer" the tokenizer's serialized form
 *     "graph"     the IR with tactic choices (ir.h serialization)
 *     "weights"   every weight, 64-byte aligned, read in place through mmap
 *                 (quantized matmul weights: codes, scales and zeros as
 *                 separate weights; docs/ARCHITECTURE.md has the encodings)
 *     "graph.R", "weights.R"  a tensor-parallel engine's rank R > 0 (meta
 *                 build.tensor_parallel ranks; "graph" / "weights" are rank 0)
 * A section checksum is XXH3-64 over the XXH3-64s of its 64 MiB chunks, so
 * big sections verify in parallel. Whole zero MiB chunks of a section (at
 * MiB-aligned file offsets) and the padding are written as holes: the
 * zero weights of a shape-only checkpoint take no disk space. Loading verifies every byte and every
 * field and names what does not match; it never re-optimises.
 */
#ifndef TB_ENGINE_H
#define TB_ENGINE_H

#include "ir/ir.h"
#include "tokenizer/tokenizer.h"

#define TB_ENGINE_MAGIC "TBENGINE"
#define TB_ENGINE_VERSION 4u /* 2: general ops, rank 8, 16 int attribute slots; 3: qmatmul and
                              * quantized weights (the general ops numbered one up); 4: tensor
                              * parallelism (all_reduce, all_gather_cols: general ops two up;
                              * sections "graph.R" / "weights.R" per rank R > 0) */

#define TB_MAX_TP 8 /* tensor-parallel ranks of one engine */

struct tb_engine {
    tb_mapped_file map;
    tb_graph *graph;        /* weight data points into map; rank 0's with tensor parallelism */
    int tp;                 /* tensor-parallel ranks (1: none)                             */
    tb_graph *rank_graph[TB_MAX_TP]; /* rank r's graph ([0] = graph)                       */
    tb_tokenizer *tok;
    tb_engine_info info;
    char *meta_json;        /* NUL-terminated copy */
    char *hw_json;
    char backend[16];       /* the backend the engine was built for */
    int max_step_tokens;
    int rope_interleaved;
    double load_seconds;
    int borrowed;           /* map.data is the caller's (tb_engine_load_mem) */
};

typedef struct {
    const char *name;
    const void *data;
    uint64_t size;
} tb_section_src;

/* Writes an engine file from sections given in order. */
tb_status tb_engine_write(const char *path, const tb_section_src *sections,
                          int n_sections);

/* Loads an engine for `device` ("cpu", "cuda:N"; NULL: the backend the
 * engine was built for), checking the fingerprint against that device. */
tb_status tb_engine_load_for(const char *path, const char *device,
                             tb_engine **out);

/* The same from an engine image already in memory (tests, fuzzing): `data`
 * must outlive the engine, which reads weights in place; `name` is for
 * messages. */
tb_status tb_engine_load_mem(const void *data, size_t size, const char *name,
                             const char *device, tb_engine **out);

/* Section checksum (chunked XXH3, see above); TB_ERR_OOM when the chunk
 * table cannot be allocated (never reported as a corrupt file). */
tb_status tb_section_hash(const uint8_t *p, uint64_t n, uint64_t *out);

/* Lays every weight of g out 64-byte aligned in one zero-padded buffer
 * (offsets set; free() it). */
tb_status tb_pack_weights(tb_graph *g, uint8_t **out, uint64_t *size);

/* ONNX models (build_onnx.c): a path ending in .onnx; the build behind
 * tb_build for them; and an engine made in memory (no file) from a model and
 * fixed input shapes ("name:1x3x224x224,..."; NULL: the model's own), for
 * `turbine exec MODEL.onnx`. */
int tb_is_onnx_path(const char *path);
tb_status tb_build_onnx(const char *model_path, const char *engine_path, const tb_build_options *opt,
                        tb_build_report *report);
tb_status tb_engine_from_onnx(const char *model_path, const char *shapes, const char *device, int verbose,
                              tb_engine **out);
/* A general graph (g->n_outputs > 0) written as an engine file; and an
 * engine in memory that takes g (freed with it, or at once on failure). */
tb_status tb_engine_write_general(tb_graph *g, const char *engine_path, const char *device, const char *source,
                                  double build_seconds);
tb_status tb_engine_from_graph(tb_graph *g, const char *device, tb_engine **out);

#endif
