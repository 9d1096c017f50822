/* onnx.c — placeholder until the protobuf-c reader lands: refuses every
 * model with a message. */
#include "import/onnx.h"

tb_status tb_onnx_import(const char *path, const tb_onnx_options *o, tb_graph **out) {
    (void)o;
    *out = NULL;
    return tb_errorf(TB_ERR_UNSUPPORTED, "%s: this build cannot read ONNX models", path);
}

tb_status tb_onnx_import_buffer(const void *buf, size_t n, const char *base_dir, const tb_onnx_options *o,
                                tb_graph **out) {
    (void)buf, (void)n, (void)base_dir, (void)o;
    *out = NULL;
    return tb_errorf(TB_ERR_UNSUPPORTED, "this build cannot read ONNX models");
}

tb_status tb_onnx_parse_shapes(const char *text, int which, tb_onnx_shape_spec *specs, int *n_specs, int cap) {
    (void)text, (void)which, (void)specs, (void)cap;
    *n_specs = 0;
    return tb_errorf(TB_ERR_UNSUPPORTED, "this build cannot read ONNX models");
}

char *tb_onnx_supported_ops(void) { return NULL; }

tb_status tb_onnx_read_tensor(const char *path, tb_tensor *out, char *name, size_t name_cap) {
    (void)out, (void)name, (void)name_cap;
    return tb_errorf(TB_ERR_UNSUPPORTED, "%s: this build cannot read ONNX tensors", path);
}

tb_status tb_onnx_write_tensor(const char *path, const char *name, const tb_tensor *t) {
    (void)name, (void)t;
    return tb_errorf(TB_ERR_UNSUPPORTED, "%s: this build cannot write ONNX tensors", path);
}
