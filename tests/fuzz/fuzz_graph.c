/* fuzz_graph.c — the serialized IR, as an engine's "graph" section holds it
 * (src/ir/ir.c tb_graph_deserialize: values, symbols, nodes, attributes,
 * shapes checked against each op's rule). */
#include "fuzz_common.h"
#include "ir/ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_graph *g = NULL;
    if (tb_graph_deserialize(data, size, &g) == TB_OK) {
        for (int i = 0; i < g->n_values; i++) {
            uint64_t bytes;
            tb_value_bytes(g, &g->values[i], NULL, &bytes);
        }
        tb_graph_free(g);
    }
    return 0;
}
