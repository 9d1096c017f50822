/*
 * cuda_module.h — the boundary between turbine and its CUDA backend module.
 *
 * The CUDA backend (this folder) is built as a shared module,
 * libturbine_cuda.so, that backend.c loads with dlopen the first time a
 * command asks for a CUDA device (--device cuda, an engine built for CUDA, a
 * GPU fingerprint or memory query). Only then do the CUDA runtime, cuBLAS and
 * cuBLASLt (hundreds of MB of mappings and tens of thousands of relocations)
 * enter the process; a CPU command never pays for them, and a machine without
 * them gets an error naming the missing library instead of a binary that does
 * not start.
 *
 * The module calls a few core functions (tb_errorf, tb_op_name, ...). It
 * cannot carry its own copies: the error message is per-thread state of the
 * program that called the public API, and that program must see what the
 * module wrote. Nor does it resolve them against the executable's symbols:
 * that would need every program linking libturbine (the tests, the benches,
 * a user's program on the static library) to export them with -rdynamic. So
 * the host hands the module a table of the functions it needs at init
 * (tb_cuda_host_api), and module_host.c defines those names inside the module
 * as hidden forwarders to the table. The module exports one symbol,
 * TB_CUDA_MODULE_ENTRY; everything else it links (cudart_static) stays
 * local to it.
 *
 * Both sides compute tb_cuda_module_abi() from the sizes of the structures
 * they share: a module left over from another build of turbine is refused
 * with a message instead of misreading a graph.
 */
#ifndef TB_CUDA_MODULE_H
#define TB_CUDA_MODULE_H

#include <stdarg.h>

#include "backend/backend.h"
#include "ir/nn_shape.h"

#define TB_CUDA_MODULE_FILE "libturbine_cuda.so"
#define TB_CUDA_MODULE_ENTRY "tb_cuda_module_init"
/* bump when a function of either table changes meaning */
#define TB_CUDA_MODULE_VERSION 3

/* The core functions the module calls, as the host has them. */
typedef struct {
    uint64_t abi;
    tb_status (*verrorf)(tb_status code, const char *fmt, va_list ap);
    tb_status (*verror_prefix)(tb_status code, const char *fmt, va_list ap);
    void (*vlog)(tb_log_level l, const char *fmt, va_list ap);
    const char *(*op_name)(tb_op_kind k);
    const char *(*dtype_name)(tb_dtype t);
    int64_t (*value_numel)(const tb_graph *g, const tb_value *v, const int64_t *symval);
    int64_t (*step_rows)(const tb_graph *g, int v, const tb_step *st);
    void (*backend_free)(tb_backend *b);
    /* the general ops' geometry (ir/nn_shape.h), one definition for every
     * backend */
    tb_status (*nn_transpose_perm)(const tb_node *n, int rank, int *perm);
    tb_status (*nn_slice_plan)(const tb_view *in, int n_in, const tb_view *out, int64_t *base, int64_t *strides);
    void (*nn_broadcast_strides)(const tb_view *x, const tb_view *out, int64_t *strides);
    tb_status (*nn_pool_geom)(const tb_node *n, const tb_view *x, tb_nn_conv_geom *g);
    /* tensor-parallel ranks meeting on the host (core/comm.h) */
    tb_status (*comm_exchange)(struct tb_comm *c, int rank, void *mine, void **all);
    tb_status (*comm_barrier)(struct tb_comm *c, int rank);
} tb_cuda_host_api;

/* What the module offers: backend.c's four CUDA entry points. */
typedef struct {
    uint64_t abi;
    tb_status (*create)(int device, int max_ctx, tb_backend **out);
    char *(*fingerprint)(int device);
    tb_status (*memory)(int device, uint64_t *total, uint64_t *free_bytes);
    tb_status (*check)(const char *hw_json, int device);
} tb_cuda_module_api;

/* The entry point: when host->abi equals the module's own key, keeps the
 * host table and fills *out; returns the module's key either way. */
typedef uint64_t (*tb_cuda_module_init_fn)(const tb_cuda_host_api *host, tb_cuda_module_api *out);

/* The module's implementations (cuda_backend.c), reached through the table. */
tb_status tb_backend_cuda_create(int device, int max_ctx, tb_backend **out);
char *tb_backend_cuda_fingerprint(int device);
tb_status tb_backend_cuda_memory(int device, uint64_t *total, uint64_t *free_bytes);
tb_status tb_backend_cuda_check(const char *hw_json, int device);

static inline uint64_t tb_cuda_module_abi(void) {
    const size_t sizes[] = {sizeof(tb_graph), sizeof(tb_node), sizeof(tb_value), sizeof(tb_symbol),
                            sizeof(tb_step), sizeof(tb_backend_i), sizeof(tb_backend), sizeof(tb_sample_row),
                            sizeof(tb_sample_result), sizeof(tb_cuda_host_api), sizeof(tb_cuda_module_api)};
    uint64_t k = TB_CUDA_MODULE_VERSION;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) k = k * 1000003u + sizes[i];
    return k;
}

#endif /* TB_CUDA_MODULE_H */
