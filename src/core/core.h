/*
 * core.h — the pieces every layer uses: error messages, logging, arenas,
 * the thread pool, fp16/bf16 scalars, the dtype traits (sizes of rows and
 * tensors, row conversions: dtype.c), read-only file mapping, the CPU
 * feature probe and the hardware fingerprint, and a monotonic clock.
 *
 * Errors: library code returns tb_status and records a message with
 * tb_errorf(); only the CLI prints and exits. Programmer errors use TB_ASSERT,
 * which prints file:line and aborts.
 */
#ifndef TB_CORE_H
#define TB_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "turbine/turbine.h"

/* ---------------------------------------------------------------- errors */
/* Records a message for tb_last_error() and returns `code`. */
tb_status tb_errorf(tb_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prepends "context: " to the current message, returns `code`. */
tb_status tb_error_prefix(tb_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void tb_error_clear(void);
/* The code of the last tb_errorf on this thread (TB_OK after a clear): lets
 * a caller that only saw -1 from a builder pass on the real cause. */
tb_status tb_last_status(void);

#define TB_ASSERT(cond)                                                      \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__,       \
                    __LINE__, #cond);                                        \
            abort();                                                         \
        }                                                                    \
    } while (0)

#define TB_TRY(expr)                                                         \
    do {                                                                     \
        tb_status tb_try_s_ = (expr);                                        \
        if (tb_try_s_ != TB_OK) return tb_try_s_;                            \
    } while (0)

/* ---------------------------------------------------------------- logging */
typedef enum { TB_LOG_ERROR, TB_LOG_WARN, TB_LOG_INFO, TB_LOG_DEBUG } tb_log_level;
void tb_log_set_level(tb_log_level l);
void tb_log(tb_log_level l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- memory */
/* Aligned allocation (64 bytes unless stated); free with tb_free_aligned. */
void *tb_alloc_aligned(size_t n, size_t align);
void tb_free_aligned(void *p);

/* A bump arena over one block; everything is released at once. */
typedef struct {
    uint8_t *base;
    size_t cap;
    size_t used;
} tb_arena;

/* Bytes of memory a new allocation can still take without the kernel
 * having to reclaim it: /proc/meminfo's MemAvailable, or less when the
 * process's cgroup (v2 memory.max, v1 limit_in_bytes) leaves less. 0 when
 * neither can be read. TURBINE_MEM_AVAILABLE=N (bytes) replaces it. */
uint64_t tb_mem_available(void);

tb_status tb_arena_init(tb_arena *a, size_t cap);
void *tb_arena_alloc(tb_arena *a, size_t n, size_t align); /* NULL when full */
void tb_arena_reset(tb_arena *a);
void tb_arena_free(tb_arena *a);

/* ---------------------------------------------------------------- threads */
/* A fixed pool of spinning workers for short parallel loops (one op at a
 * time). tb_pool_run calls fn(arg, i, n) for i in [0, n) threads, the caller
 * being thread 0, and returns when all are done. */
typedef struct tb_pool tb_pool;
typedef void (*tb_pool_fn)(void *arg, int ith, int nth);

tb_status tb_pool_create(int n_threads, tb_pool **out);
void tb_pool_free(tb_pool *p);
int tb_pool_size(const tb_pool *p);
void tb_pool_run(tb_pool *p, tb_pool_fn fn, void *arg);
/* Threads to use when the user asks for 0: the online core count. */
int tb_default_threads(void);

/* ---------------------------------------------------------------- halves */
float tb_f16_to_f32(uint16_t h);
uint16_t tb_f32_to_f16(float f);
static inline float tb_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
uint16_t tb_f32_to_bf16(float f); /* round to nearest even */

/* ---------------------------------------------------------------- dtypes
 * One traits entry per dtype (dtype.c), as ggml's type traits: a dtype
 * stores blocks of block_elems elements in block_bytes bytes (1 element for
 * the plain types; i4 packs 2 per byte). A tensor's rows (its innermost dim)
 * must be whole blocks. to_f32 / from_f32 convert a row of n elements (n a
 * multiple of block_elems); NULL where the direction means nothing. */
typedef struct {
    const char *name;
    int block_elems;    /* elements per block (>= 1)                        */
    size_t block_bytes; /* bytes per block (>= 1)                           */
    int is_quantized;   /* codes read with a scale tensor (i8, i4, fp8)     */
    int is_float;       /* a floating-point encoding                        */
    void (*to_f32)(const void *src, float *dst, size_t n);
    void (*from_f32)(const float *src, void *dst, size_t n);
} tb_dtype_traits;

/* NULL for a value outside the enum. */
const tb_dtype_traits *tb_dtype_get_traits(tb_dtype t);
/* Bytes per block (per element for the plain types); never 0 for a dtype,
 * 0 for a value outside the enum. Sizes of tensors use the two below. */
size_t tb_dtype_size(tb_dtype t);
int tb_dtype_block_elems(tb_dtype t);
/* Bytes of n elements, rounded up to whole blocks. */
uint64_t tb_dtype_row_size(tb_dtype t, uint64_t n);
/* Bytes of a tensor of shape dims[rank] (rows of dims[rank-1] elements):
 * TB_ERR_FORMAT when a row is not whole blocks, a dim is negative or the
 * size overflows. */
tb_status tb_dtype_tensor_bytes(tb_dtype t, int rank, const int64_t *dims, uint64_t *out);
/* Converts n elements (whole blocks of both dtypes) through the traits'
 * row conversions; TB_ERR_UNSUPPORTED when a direction has none. */
tb_status tb_dtype_convert(const void *src, tb_dtype sdt, void *dst, tb_dtype ddt, size_t n);

/* ---------------------------------------------------------------- files */
typedef struct {
    const uint8_t *data;
    size_t size;
    int fd;
} tb_mapped_file;

/* Maps a whole file read-only. */
tb_status tb_file_map(const char *path, tb_mapped_file *out);
void tb_file_unmap(tb_mapped_file *m);
/* Gives back the resident pages of [p, p + n) inside a tb_file_map'd file
 * (whole pages only): read for the last time, they leave the process's
 * resident set; a later read faults them in from the file again. */
void tb_file_release_pages(const void *p, size_t n);
/* Whether the n bytes at p are all zero (n == 0: yes); the engine writer
 * and the weight packer skip whole zero chunks with it. */
int tb_all_zero(const void *p, size_t n);
/* Reads a whole (small) file into a NUL-terminated malloc'd buffer. */
tb_status tb_file_read_all(const char *path, char **out, size_t *size,
                           size_t max_size);
int tb_file_exists(const char *path);
int tb_is_dir(const char *path);
/* dlopen (RTLD_NOW | RTLD_LOCAL) of the first of the NULL-terminated `names`
 * that opens; NULL when none does, with the last dlerror() text in err. For
 * optional libraries loaded on first use (OpenBLAS, libcurl, libmicrohttpd). */
void *tb_dl_open_first(const char *const *names, char *err, size_t cap);

/* ---------------------------------------------------------------- cpu */
enum {
    TB_CPU_AVX2 = 1u << 0,
    TB_CPU_FMA = 1u << 1,
    TB_CPU_F16C = 1u << 2,
    TB_CPU_AVX512F = 1u << 3,
    TB_CPU_AVX512BW = 1u << 4,
    TB_CPU_AVX512VL = 1u << 5,
    TB_CPU_AVX512BF16 = 1u << 6,
    TB_CPU_AVX512FP16 = 1u << 7,
};
/* Feature bits of this CPU (CPUID + XGETBV), honouring TB_CPU_MASK in the
 * environment (a hex mask ANDed in, so tests can pretend to lack features). */
uint32_t tb_cpu_features(void);
/* "avx2 fma f16c" ... into buf. */
void tb_cpu_features_str(uint32_t f, char *buf, size_t cap);
void tb_cpu_model_name(char *buf, size_t cap);

/* ---------------------------------------------------------------- time */
double tb_now(void); /* seconds, monotonic */

/* ---------------------------------------------------------------- checksum */
uint64_t tb_hash64(const void *data, size_t n); /* XXH3-64 */

#endif /* TB_CORE_H */
