/* fuzz_onnx.c — an ONNX ModelProto (src/import/onnx.c): the wire-format
 * walk, protobuf-c's unpack, initializers and their sizes, opsets,
 * attributes and every node's shape rule. A graph it accepts is checked and
 * taken through the engine's serialized form and back. */
#include "fuzz_common.h"
#include "import/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_graph *g = NULL;
    if (tb_onnx_import_buffer(data, size, NULL, NULL, &g) == TB_OK) {
        FUZZ_ASSERT(g != NULL);
        FUZZ_ASSERT(tb_graph_check(g) == TB_OK);
        FUZZ_ASSERT(g->n_outputs >= 1 && g->n_outputs <= TB_MAX_IO);
        uint8_t *buf = NULL;
        size_t n = 0;
        if (tb_graph_serialize(g, &buf, &n) == TB_OK) {
            tb_graph *back = NULL;
            /* weights come back without data: the shape check allows it */
            if (tb_graph_deserialize(buf, n, &back) == TB_OK) {
                FUZZ_ASSERT(back->n_nodes == g->n_nodes && back->n_values == g->n_values);
                tb_graph_free(back);
            }
            free(buf);
        }
        tb_graph_free(g);
    }
    return 0;
}
