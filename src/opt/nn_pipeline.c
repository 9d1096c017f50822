/* nn_pipeline.c — the pass pipeline for general (ONNX) graphs (opt.h). */
#include "opt/opt.h"

static tb_status remove_identity(tb_graph *g, const tb_opt_options *o, tb_pass_report *r) {
    (void)o;
    for (int k = 0; k < g->n_nodes; k++) {
        tb_node *n = &g->nodes[k];
        if (tb_opt_dead(n) || n->op != TB_OP_IDENTITY) continue;
        int in = n->in[0], out = n->out[0];
        /* a graph output keeps its name: only bypass identities it does not end in */
        int is_output = 0;
        for (int i = 0; i < g->n_outputs; i++) is_output |= g->outputs[i] == out;
        if (is_output) continue;
        tb_opt_kill(g, k);
        tb_opt_replace_uses(g, out, in);
        r->changes++;
    }
    snprintf(r->what, sizeof r->what, "removed %d Identity", r->changes);
    return TB_OK;
}

static const tb_pass nn_passes[] = {
    {"identity-removal", remove_identity, "Identity (and Dropout, imported as Identity) bypassed"},
};

const tb_pass *tb_opt_nn_pipeline(int *n) {
    *n = (int)(sizeof nn_passes / sizeof nn_passes[0]);
    return nn_passes;
}
