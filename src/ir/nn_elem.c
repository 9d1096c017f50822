/*
 * nn_elem.c — definitions of the general ops of this group (ops_nn.def):
 * attribute schema, shape rule and scalar reference kernel each.
 */
#include "ir/ops_nn.h"

const tb_op_def *tb_nn_elem_def(tb_op_kind k) {
    (void)k;
    return NULL;
}
