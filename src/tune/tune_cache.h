/*
 * tune_cache.h — tactics timed on this machine, kept on disk between runs
 * (TensorRT's timing cache): a run that times a shape's candidates appends
 * its pick, the next run on the same device reads it instead of timing
 * again. The CUDA backend keeps cuBLASLt's fastest candidate per GEMM shape
 * there (timed at a shape's first step: ~30 ms a step size at 7B).
 *
 * A file holds the picks of one device identity: a line of text naming
 * everything the picks depend on (GPU, library versions, the plans' own
 * parameters). Its first line is
 *     turbine-tune-cache 1 | IDENT
 * and each further line a record: a tag and integers,
 *     lt 64 4096 12288 0 2 3
 * Records are appended one write(2) each (O_APPEND), so processes sharing
 * the file do not mix their lines; a reader skips malformed or cut lines and
 * takes the last record of a key. A file whose first line names another
 * identity is left alone and read as empty.
 *
 * Where: TURBINE_TUNE_CACHE names the folder ("off" or "0": no cache);
 * unset, $XDG_CACHE_HOME/turbine or else $HOME/.cache/turbine. The file is
 * tune-HASH.txt there (HASH: 16 hex digits of the identity's FNV-1a), so
 * identities never share a file. Self-contained C (libc and tb_log only):
 * the CUDA module compiles this file into itself.
 */
#ifndef TB_TUNE_CACHE_H
#define TB_TUNE_CACHE_H

#include <stddef.h>

#define TB_TUNE_CACHE_VERSION 1
#define TB_TUNE_CACHE_MAX_INTS 8          /* integers a record              */
#define TB_TUNE_CACHE_MAX_BYTES (4 << 20) /* a larger file is not read       */

/* The cache file of identity ident (one line, no newline) into buf: 1, or 0
 * when the cache is turned off or no folder can be named (buf ""). */
int tb_tune_cache_path(const char *ident, char *buf, size_t n);

/* Calls fn(user, v) for each record of path tagged tag with exactly n_int
 * integers (v[0..n_int)), in file order, when the file's first line names
 * ident. The count of records passed; 0 for a missing file or another
 * identity's; -1 when the file cannot be read. *bad (may be NULL): lines
 * skipped as malformed. */
int tb_tune_cache_read(const char *path, const char *ident, const char *tag, int n_int,
                       void (*fn)(void *user, const int *v), void *user, int *bad);

/* Opens the cache of identity ident for a backend: names its file into path
 * (tb_tune_cache_path) and passes its records tagged tag with n_int integers
 * to fn (tb_tune_cache_read), logging what was read (INFO: "N WHAT read from
 * PATH") or that it could not be (WARN). 1 when the file is named (records
 * may then be appended to path), 0 when the cache is off or has no folder. */
int tb_tune_cache_open(const char *ident, char *path, size_t n, const char *tag, int n_int,
                       void (*fn)(void *user, const int *v), void *user, const char *what);

/* Appends one record to path, creating the folders and the file with its
 * first line when they are missing. 0, or -1 (logged once a process) when it
 * cannot be written or path belongs to another identity. */
int tb_tune_cache_append(const char *path, const char *ident, const char *tag, int n_int, const int *v);

#endif
