/* fuzz_tokenizer_json.c — a Hugging Face tokenizer.json (src/tokenizer/
 * tok_json.c): vocab, merges, added tokens, normalizer, pre-tokenizer and
 * decoder steps. An accepted tokenizer encodes a fixed text and the input
 * itself, decodes both, and round-trips once through its serialized form
 * (pieces and round trip do not depend on the text). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_tokenizer *t = NULL;
    if (tb_tokenizer_load_mem("tokenizer.json", data, size, NULL, &t) != TB_OK) return 0;
    fuzz_use_tokenizer(t, FUZZ_TEXT, sizeof FUZZ_TEXT - 1);
    fuzz_encode_text(t, (const char *)data, size < 512 ? size : 512);
    tb_tokenizer_free(t);
    return 0;
}
