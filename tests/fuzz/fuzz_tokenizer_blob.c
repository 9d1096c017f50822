/* fuzz_tokenizer_blob.c — the tokenizer's serialized form, as an engine's
 * "tokenizer" section holds it (src/tokenizer/tok_serialize.c). The blob
 * ends in a checksum of the rest; the harness appends the right one to the
 * input so that mutations reach the fields behind it (and feeds the input
 * as it is too, for the checksum check itself). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_tokenizer *t = NULL;
    if (tb_tokenizer_deserialize(data, size, &t) == TB_OK) tb_tokenizer_free(t);
    uint8_t *b = malloc(size + 8);
    if (!b) return 0;
    if (size) memcpy(b, data, size);
    uint64_t h = tb_hash64(b, size);
    for (int i = 0; i < 8; i++) b[size + i] = (uint8_t)(h >> (8 * i));
    t = NULL;
    if (tb_tokenizer_deserialize(b, size + 8, &t) == TB_OK) {
        fuzz_use_tokenizer(t, FUZZ_TEXT, sizeof FUZZ_TEXT - 1);
        tb_tokenizer_free(t);
    }
    free(b);
    return 0;
}
