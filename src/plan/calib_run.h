/*
 * calib_run.h — the build's calibration step: runs an f32 engine of the model
 * (built in memory from the same checkpoint, on the CPU backend) over
 * calibration tokens with the statistics collector of tune/calib.h as the
 * context's node observer, and turns the statistics into the table the
 * quantization pass reads (activation scale per matmul input, and the
 * per-input-channel mean |x| and sampled rows AWQ needs). With a cache file
 * that exists it reads the table from it instead (no model run).
 */
#ifndef TB_PLAN_CALIB_RUN_H
#define TB_PLAN_CALIB_RUN_H

#include "import/import.h"
#include "tokenizer/tokenizer.h"
#include "tune/calib.h"

#define TB_CALIB_DEFAULT_TOKENS 4096
#define TB_CALIB_MAX_FILE ((size_t)256 << 20)

/* The model's fingerprint: XXH3 over its configuration and every tensor's
 * name, dtype, shape and bytes. Calibration caches are keyed by it. */
tb_status tb_model_fingerprint(const tb_model_source *src, uint64_t *out);

/* The calibration tokens of `path`: a file of token ids (decimal numbers
 * separated by white space or commas, nothing else) is read as ids (each
 * checked against `vocab`); anything else is text, encoded with `tok`
 * (BOS first when the tokenizer adds one). At most `max_tokens`; *ids is
 * malloc'd. */
tb_status tb_calib_read_tokens(const char *path, const tb_tokenizer *tok, int vocab, int max_tokens, int32_t **ids,
                               int *n);

/* Calibration for `turbine build` (o: the calib* fields of the build
 * options): the cache when o->calib_cache exists, else a run over o->calib
 * (written to o->calib_cache when given). max_seq_len: the window length.
 * progress: draw tokens done / total on stderr. *out: free with
 * tb_calib_table_free. */
tb_status tb_calibrate_for_build(const tb_model_source *src, const tb_tokenizer *tok, const tb_build_options *o,
                                 int max_seq_len, int progress, tb_calib_table **out);

#endif
