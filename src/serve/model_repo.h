/*
 * model_repo.h — a model repository in Triton's layout and the per-model
 * config file (docs/BATCHING.md gives the format with examples):
 *
 *   DIR/<model>/config.json            optional; JSON with Triton's field names
 *   DIR/<model>/<version>/model.engine an engine built by `turbine build`
 *   DIR/<model>/<version>/model.onnx   or an ONNX model, built at load
 *
 * Versions are folders named by positive integers; the config's
 * version_policy chooses among them (latest N, all, or specific ones).
 * Scanning never fails for one bad model: each model comes back with its
 * chosen versions and config, or its own status and message, so a server
 * serves the good ones and reports the others. Nothing here loads an
 * engine; the server does that with the paths and build options given.
 */
#ifndef TB_SERVE_MODEL_REPO_H
#define TB_SERVE_MODEL_REPO_H

#include <stddef.h>
#include <stdint.h>

#include "serve/batcher.h"
#include "turbine/turbine.h"

#define TB_MODEL_NAME_MAX 64             /* bytes of a model name, with the NUL */
#define TB_MODEL_MAX_VERSIONS 64         /* version folders looked at per model */
#define TB_MODEL_REPO_MAX_MODELS 1024
#define TB_MODEL_CONFIG_MAX_BYTES (1u << 20)
#define TB_MODEL_PATH_MAX 1024

typedef enum { TB_VERSIONS_LATEST = 0, TB_VERSIONS_ALL, TB_VERSIONS_SPECIFIC } tb_version_policy;

typedef struct {
    /* Rows a request may carry and a merged call may hold; 0: the model's
     * inputs are taken whole (no batch dim declared), as in Triton. */
    int max_batch_size;
    int dynamic_batching;                /* the "dynamic_batching" object is there */
    int preferred_batch_size[TB_BATCHER_MAX_PREFERRED];
    int n_preferred;
    int64_t max_queue_delay_us;
    int max_queue_size;                  /* 0: no limit (Triton's meaning)    */
    int64_t default_timeout_us;          /* 0: none                           */
    int allow_timeout_override;          /* a request may give its own timeout */
    int instance_count;                  /* default 1                         */
    int threads_per_instance;            /* 0: the cores divided among them   */
    char device[32];                     /* "": the engine's own; "cpu"; "cuda:N" */
    int warmup;                          /* "warmup": -1 auto (GPUs), 0 off, 1 on */
    tb_version_policy policy;
    int latest_n;                        /* TB_VERSIONS_LATEST: default 1     */
    int64_t versions[TB_MODEL_MAX_VERSIONS]; /* TB_VERSIONS_SPECIFIC          */
    int n_versions;
    /* Building a model.onnx at load ("build" object): weight dtype and the
     * optimisation profile as `turbine build` takes them ("" when unset). */
    tb_dtype dtype;                      /* f32 (default), f16 or i8 ("int8") */
    char shapes[512], min_shapes[512], opt_shapes[512], max_shapes[512];
    /* int8 (and f16's accuracy check): a folder of input_N.pb as
     * `turbine build --calib-data` takes; a relative path is resolved
     * against the model's folder by the scan ("" when unset). */
    char calib_data[TB_MODEL_PATH_MAX];
} tb_repo_config;

/* No dynamic batching, one instance, the latest version, f32 builds. */
void tb_repo_config_default(tb_repo_config *c);

/* Parses a config file's text (len bytes, not NUL-terminated). model_name:
 * the folder's name, which a "name" field must equal (NULL: not checked).
 * TB_ERR_FORMAT with the field named (or the JSON error's line and
 * column) for anything malformed, unknown or out of range. */
tb_status tb_repo_config_parse(const char *text, size_t len, const char *model_name, tb_repo_config *out);

/* The batcher settings the config asks for: merging only with
 * dynamic_batching and max_batch_size above 1. */
void tb_repo_config_batcher(const tb_repo_config *c, tb_batcher_config *out);

typedef struct {
    int64_t version;
    int is_onnx;                         /* model.onnx (else model.engine)    */
    char path[TB_MODEL_PATH_MAX];        /* DIR/<model>/<version>/model.*     */
} tb_model_version;

typedef struct {
    char name[TB_MODEL_NAME_MAX];
    tb_status status;                    /* TB_OK or why it cannot be served  */
    char error[512];
    tb_repo_config config;
    int n_versions;                      /* chosen, ascending                 */
    tb_model_version *versions;          /* malloc'ed, n_versions             */
} tb_model_entry;

typedef struct {
    tb_model_entry *models;              /* sorted by name                    */
    int n_models;
} tb_model_repo;

/* Scans every model folder of dir (names starting with '.' and plain files
 * skipped). Fails only when dir itself cannot be read (TB_ERR_NOT_FOUND /
 * TB_ERR_IO) or holds more than TB_MODEL_REPO_MAX_MODELS folders. */
tb_status tb_model_repo_scan(const char *dir, tb_model_repo *out);
/* Scans one model (a load request). TB_ERR_NOT_FOUND when DIR/name is not a
 * folder or name is not a valid model name; else TB_OK with the entry's own
 * status inside (free it with tb_model_entry_free). */
tb_status tb_model_repo_scan_model(const char *dir, const char *name, tb_model_entry *out);
const tb_model_entry *tb_model_repo_find(const tb_model_repo *r, const char *name);
void tb_model_entry_free(tb_model_entry *m);
void tb_model_repo_free(tb_model_repo *r);

#endif
