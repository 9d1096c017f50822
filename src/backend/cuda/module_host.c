/*
 * module_host.c — the CUDA module's side of cuda_module.h: its entry point,
 * and the core functions the backend calls, defined here as forwarders to
 * the table the host handed over (why a table: cuda_module.h).
 *
 * Built into libturbine_cuda.so only. The module is compiled with hidden
 * visibility, so these definitions bind the module's own calls and never
 * interpose on the host's functions of the same names.
 */
#include "backend/cuda/cuda_module.h"
#include "core/comm.h"

static tb_cuda_host_api host;

tb_status tb_errorf(tb_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tb_status s = host.verrorf(code, fmt, ap);
    va_end(ap);
    return s;
}

tb_status tb_error_prefix(tb_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tb_status s = host.verror_prefix(code, fmt, ap);
    va_end(ap);
    return s;
}

void tb_log(tb_log_level l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    host.vlog(l, fmt, ap);
    va_end(ap);
}

const char *tb_op_name(tb_op_kind k) { return host.op_name(k); }
const char *tb_dtype_name(tb_dtype t) { return host.dtype_name(t); }
int64_t tb_value_numel(const tb_graph *g, const tb_value *v, const int64_t *symval) {
    return host.value_numel(g, v, symval);
}
int64_t tb_step_rows(const tb_graph *g, int v, const tb_step *st) { return host.step_rows(g, v, st); }
void tb_backend_free(tb_backend *b) { host.backend_free(b); }
tb_status tb_comm_exchange(tb_comm *c, int rank, void *mine, void **all) {
    return host.comm_exchange(c, rank, mine, all);
}
tb_status tb_comm_barrier(tb_comm *c, int rank) { return host.comm_barrier(c, rank); }
tb_status tb_nn_transpose_perm(const tb_node *n, int rank, int *perm) { return host.nn_transpose_perm(n, rank, perm); }
tb_status tb_nn_slice_plan(const tb_view *in, int n_in, const tb_view *out, int64_t *base, int64_t *strides) {
    return host.nn_slice_plan(in, n_in, out, base, strides);
}
void tb_nn_broadcast_strides(const tb_view *x, const tb_view *out, int64_t *strides) {
    host.nn_broadcast_strides(x, out, strides);
}
tb_status tb_nn_pool_geom(const tb_node *n, const tb_view *x, tb_nn_conv_geom *g) { return host.nn_pool_geom(n, x, g); }

__attribute__((visibility("default"))) uint64_t tb_cuda_module_init(const tb_cuda_host_api *h,
                                                                    tb_cuda_module_api *out) {
    uint64_t abi = tb_cuda_module_abi();
    if (!h || h->abi != abi || !out) return abi;
    host = *h;
    *out = (tb_cuda_module_api){
        .abi = abi,
        .create = tb_backend_cuda_create,
        .fingerprint = tb_backend_cuda_fingerprint,
        .memory = tb_backend_cuda_memory,
        .check = tb_backend_cuda_check,
    };
    return abi;
}
