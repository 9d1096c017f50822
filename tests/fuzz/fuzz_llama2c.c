/* fuzz_llama2c.c — a llama2.c checkpoint (src/import/llama2c.c): the
 * seven-int header, its plausibility limits and the file size it implies.
 * What it accepts is indexed and every tensor read at both ends. */
#include "fuzz_common.h"
#include "import/source_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_model_source *s = calloc(1, sizeof *s);
    if (!s) return 0;
    snprintf(s->origin, sizeof s->origin, "fuzz.bin");
    tb_mapped_file m = {.data = data, .size = size, .fd = -1};
    if (tb_llama2c_parse(s, &m, "fuzz.bin") == TB_OK && tb_source_index(s) == TB_OK) {
        const tb_model_config *c = tb_source_config(s);
        FUZZ_ASSERT(c->dim > 0 && c->n_heads > 0 && c->head_dim * c->n_heads == c->dim);
        volatile uint8_t sink = 0;
        for (int i = 0; i < tb_source_tensor_count(s); i++) {
            const tb_src_tensor *t = tb_source_tensor_at(s, i);
            FUZZ_ASSERT(tb_source_find(s, t->name) == t);
            const uint8_t *p = t->data;
            FUZZ_ASSERT(p >= data && p + t->nbytes <= data + size);
            if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1];
        }
        const tb_src_tensor *t = NULL;
        FUZZ_ASSERT(tb_source_get(s, "model.embed_tokens.weight", c->vocab_size, c->dim, &t) == TB_OK);
        (void)sink;
    }
    tb_source_free(s);
    return 0;
}
