/* fuzz_safetensors.c — a .safetensors file (src/import/safetensors.c): the
 * header length, the JSON header and every tensor's dtype, shape and data
 * offsets against the file size. What it accepts is indexed, looked up and
 * read at both ends of every tensor. */
#include "fuzz_common.h"
#include "import/source_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_model_source *s = calloc(1, sizeof *s);
    if (!s) return 0;
    snprintf(s->origin, sizeof s->origin, "fuzz.safetensors");
    tb_mapped_file m = {.data = data, .size = size, .fd = -1}; /* not the source's: never unmapped */
    if (tb_safetensors_parse(s, &m, "fuzz.safetensors") == TB_OK && tb_source_index(s) == TB_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < tb_source_tensor_count(s); i++) {
            const tb_src_tensor *t = tb_source_tensor_at(s, i);
            FUZZ_ASSERT(tb_source_find(s, t->name) == t);
            FUZZ_ASSERT(t->rank >= 0 && t->rank <= 4);
            const uint8_t *p = t->data;
            FUZZ_ASSERT(p >= data && p + t->nbytes <= data + size);
            if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1];
            const tb_src_tensor *g = NULL;
            tb_source_get(s, t->name, t->dims[0], t->rank == 2 ? t->dims[1] : -1, &g);
        }
        (void)sink;
    }
    tb_source_free(s);
    return 0;
}
