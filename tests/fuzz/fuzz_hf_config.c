/* fuzz_hf_config.c — a Hugging Face config.json (src/import/hf.c): the
 * architecture, the sizes and their limits, rope scaling. */
#include "fuzz_common.h"
#include "import/source_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_model_config c;
    memset(&c, 0, sizeof c);
    int tie = 0;
    if (tb_hf_config_parse(&c, (const char *)data, size, "fuzz", &tie) == TB_OK) {
        FUZZ_ASSERT(memchr(c.arch, 0, sizeof c.arch) != NULL);
        FUZZ_ASSERT(c.n_eos >= 0 && c.n_eos <= TB_MAX_EOS);
    }
    return 0;
}
