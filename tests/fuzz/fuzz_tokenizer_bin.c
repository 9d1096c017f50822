/* fuzz_tokenizer_bin.c — a llama2.c tokenizer.bin (src/tokenizer/
 * tok_llama2c.c): max_token_length, then score, length and bytes per token.
 * An accepted tokenizer encodes, decodes and round-trips as in
 * fuzz_tokenizer_json.c. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_tokenizer *t = NULL;
    if (tb_tokenizer_load_mem("tokenizer.bin", data, size, NULL, &t) != TB_OK) return 0;
    fuzz_use_tokenizer(t, FUZZ_TEXT, sizeof FUZZ_TEXT - 1);
    fuzz_encode_text(t, (const char *)data, size < 512 ? size : 512);
    tb_tokenizer_free(t);
    return 0;
}
