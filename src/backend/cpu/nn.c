/* nn.c — dispatch of the general ops on the CPU (nn.h). */
#include "backend/cpu/nn.h"
#include "backend/cpu/nn_conv_impl.h"

void *tb_cpu_nn_scratch(tb_cpu_nn_ctx *c, size_t bytes) {
    if (bytes <= c->scratch_cap) return c->scratch;
    size_t cap = bytes + bytes / 4 + 4096;
    void *p = tb_alloc_aligned(cap, 64);
    if (!p) return NULL;
    tb_free_aligned(c->scratch);
    c->scratch = p;
    c->scratch_cap = cap;
    return p;
}

void tb_cpu_nn_ctx_release(tb_cpu_nn_ctx *c) {
    tb_free_aligned(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
    tb_cpu_nn_wpack_free(c);
}

tb_status tb_cpu_nn_run(tb_cpu_nn_ctx *c, const tb_node *n, const tb_view *in, int n_in, const tb_view *out,
                        int n_out) {
    tb_cpu_nn_fn f = tb_cpu_nn_elem_kernel(n->op);
    if (!f) f = tb_cpu_nn_shape_kernel(n->op);
    if (!f) {
        /* the compute group's kernels (Conv, Gemm, MatMul, sdpa) read and
         * write f32 only: 16-bit float engines (--dtype f16) run the
         * references there */
        f = tb_cpu_nn_conv_kernel(n->op);
        for (int k = 0; f && k < n_in; k++)
            if (in[k].dtype == TB_F16 || in[k].dtype == TB_BF16) f = NULL;
        if (f && out[0].dtype != TB_F32) f = NULL;
    }
    if (!f) f = tb_cpu_nn_quant_kernel(n->op);
    if (f) return f(c, n, in, n_in, out, n_out);
    const tb_op_def *d = tb_op_get_def(n->op);
    if (!d || !d->ref) return tb_errorf(TB_ERR_UNSUPPORTED, "cpu backend: op %s has no kernel", tb_op_name(n->op));
    return d->ref(n, in, n_in, out, n_out);
}
