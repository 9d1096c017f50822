/* fuzz_chat.c — chat templates (src/serve/chat.c): recognising a format
 * from a tokenizer_config.json's Jinja text, and rendering messages (roles,
 * contents with NULs) in it and in the format the first byte picks.
 * Input: format byte, the template up to the first NUL, then messages:
 * a role byte, a 16-bit length, the content. */
#include "fuzz_common.h"
#include "serve/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size < 1) return 0;
    static const char *const roles[] = {"system", "user", "assistant"};
    size_t pos = 1;
    const uint8_t *z = memchr(data + pos, 0, size - pos);
    size_t tlen = z ? (size_t)(z - data) - pos : size - pos;
    char *tmpl = malloc(tlen + 1);
    if (!tmpl) return 0;
    memcpy(tmpl, data + pos, tlen);
    tmpl[tlen] = 0;
    pos += tlen + (z ? 1 : 0);
    tb_chat_message m[64];
    int n = 0;
    while (n < 64 && size - pos >= 3) {
        size_t len = (size_t)data[pos + 1] | (size_t)data[pos + 2] << 8;
        const char *role = roles[data[pos] % 3];
        pos += 3;
        if (len > size - pos) len = size - pos;
        /* a length of 0 means a NUL-terminated content (chat.h) */
        m[n++] = (tb_chat_message){role, len ? (const char *)data + pos : "", len};
        pos += len;
    }
    tb_chat_format det = tb_chat_detect(tmpl);
    FUZZ_ASSERT(tb_chat_format_name(det) != NULL);
    tb_chat_format fs[2] = {det, (tb_chat_format)(data[0] % 5)};
    for (int i = 0; i < 2; i++) {
        size_t len = 0;
        char *text = tb_chat_render(fs[i], m, n, (data[0] & 0x80) ? "<s>" : "", &len);
        if (text) {
            FUZZ_ASSERT(text[len] == 0);
            free(text);
        }
    }
    free(tmpl);
    return 0;
}
