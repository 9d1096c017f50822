/*
 * onnx.h — the ONNX front end: a ModelProto (protobuf-c, onnx.proto as
 * Debian's python3-onnx ships it) read into a general graph (ops_nn.h).
 *
 * Initializers (inline or in external data files next to the model) become
 * weights; Constant nodes become weights; Dropout becomes Identity. Graph
 * inputs become TB_VAL_INPUT values in order (g->inputs), graph outputs are
 * g->outputs. A dim with a dim_param becomes the graph symbol of that name
 * (shared by every input that names it), an unnamed unknown dim a fresh
 * symbol; each symbol's profile (min/opt/max) comes from the shape specs
 * given, else the dim is refused with a message asking for --min-shapes etc.
 * Opsets 13 to 21 of the default domain. A node whose op type, attribute or
 * opset is not supported is refused naming the node, its op type and why
 * (every such node is listed, not only the first); a malformed file gives a
 * message, never a crash.
 */
#ifndef TB_IMPORT_ONNX_H
#define TB_IMPORT_ONNX_H
#include "ir/ir.h"

/* A shape for one graph input: min/opt/max per dim (all three equal for a
 * fixed shape). A name "#K" means the K-th graph input, whatever its name. */
typedef struct {
    char name[TB_NAME_LEN];
    int rank;
    int64_t min[TB_MAX_RANK], opt[TB_MAX_RANK], max[TB_MAX_RANK];
} tb_onnx_shape_spec;

typedef struct {
    const tb_onnx_shape_spec *shapes; /* may be NULL                       */
    int n_shapes;
} tb_onnx_options;

/* Reads `path` (external data relative to its folder). */
tb_status tb_onnx_import(const char *path, const tb_onnx_options *o, tb_graph **out);
/* The same from memory; external data relative to base_dir (NULL: refused). */
tb_status tb_onnx_import_buffer(const void *buf, size_t n, const char *base_dir, const tb_onnx_options *o,
                                tb_graph **out);
/* Parses "name:1x3x224x224,mask:1x128" into specs (min = opt = max =
 * these) or updates the min/opt/max of existing ones (which: 0 min, 1 opt,
 * 2 max, 3 all). TB_ERR_INVALID_ARG with a message on bad text. */
tb_status tb_onnx_parse_shapes(const char *text, int which, tb_onnx_shape_spec *specs, int *n_specs, int cap);
/* A TensorProto file (the input_K.pb / output_K.pb files of ONNX's tests):
 * read into *out (data malloc'd; free it), its name into name (may be "");
 * and written. */
tb_status tb_onnx_read_tensor(const char *path, tb_tensor *out, char *name, size_t name_cap);
tb_status tb_onnx_write_tensor(const char *path, const char *name, const tb_tensor *t);

/* The ONNX op types this build imports, one per line (malloc'd). */
char *tb_onnx_supported_ops(void);

#endif /* TB_IMPORT_ONNX_H */
