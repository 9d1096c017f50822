/* fuzz_serve_request.c — the body of a POST to /v1/completions or
 * /v1/chat/completions as the server takes it apart before generating
 * (src/serve/server.c tb_serve_check_request: JSON, every field and its
 * range, stop strings, the prompt as text or token ids, the messages
 * rendered by a chat format, tokenizing, the context limits).
 * The first input byte picks the route (bit 0) and the chat format (the
 * rest, modulo the five formats); the other bytes are the body. */
#include "fuzz_common.h"
#include "serve/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size < 1) return 0;
    const tb_tokenizer *tok = fuzz_small_tokenizer();
    tb_engine_info info;
    memset(&info, 0, sizeof info);
    snprintf(info.arch, sizeof info.arch, "llama");
    info.vocab_size = tb_tokenizer_vocab_size(tok) + 4; /* a padded vocabulary: ids past the tokenizer's */
    info.max_seq_len = 64;
    info.max_batch = 4;
    info.bos_id = tb_tokenizer_bos(tok);
    info.add_bos = 1;
    for (int i = 0; i < 4; i++) info.eos_ids[i] = -1;
    info.eos_ids[0] = 2;
    char msg[1024];
    int status = tb_serve_check_request((const char *)data + 1, size - 1, data[0] & 1, "fuzz-model", tok, &info,
                                        (tb_chat_format)((data[0] >> 1) % 5), msg, sizeof msg);
    FUZZ_ASSERT(status == 200 || (status >= 400 && status < 600));
    FUZZ_ASSERT(memchr(msg, 0, sizeof msg) != NULL);
    return 0;
}
