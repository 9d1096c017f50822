/* fuzz_repo_config.c — a model repository's config.json (src/serve/
 * model_repo.c): Triton's fields, their limits, version policies, the build
 * object. An accepted config holds only values in range, and its batcher
 * settings are ones tb_batcher_create takes. */
#include "fuzz_common.h"
#include "serve/model_repo.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    tb_repo_config c;
    if (tb_repo_config_parse((const char *)data, size, "fuzz", &c) != TB_OK) return 0;
    FUZZ_ASSERT(c.max_batch_size >= 0 && c.max_batch_size <= TB_BATCHER_MAX_BATCH);
    FUZZ_ASSERT(c.n_preferred >= 0 && c.n_preferred <= TB_BATCHER_MAX_PREFERRED);
    for (int i = 0; i < c.n_preferred; i++)
        FUZZ_ASSERT(c.preferred_batch_size[i] >= 1 && c.preferred_batch_size[i] <= c.max_batch_size);
    FUZZ_ASSERT(c.instance_count >= 1 && c.instance_count <= TB_BATCHER_MAX_INSTANCES);
    FUZZ_ASSERT(c.max_queue_delay_us >= 0 && c.max_queue_size >= 0 && c.default_timeout_us >= 0);
    FUZZ_ASSERT(c.policy != TB_VERSIONS_LATEST || (c.latest_n >= 1 && c.latest_n <= TB_MODEL_MAX_VERSIONS));
    FUZZ_ASSERT(c.policy != TB_VERSIONS_SPECIFIC || (c.n_versions >= 1 && c.n_versions <= TB_MODEL_MAX_VERSIONS));
    FUZZ_ASSERT(memchr(c.device, 0, sizeof c.device) && memchr(c.shapes, 0, sizeof c.shapes) &&
                memchr(c.max_shapes, 0, sizeof c.max_shapes) && memchr(c.calib_data, 0, sizeof c.calib_data));
    FUZZ_ASSERT(c.dtype == TB_F32 || c.dtype == TB_F16 || c.dtype == TB_I8);
    tb_batcher_config bc;
    tb_repo_config_batcher(&c, &bc);
    FUZZ_ASSERT(bc.max_batch_size >= 1 && bc.n_preferred <= TB_BATCHER_MAX_PREFERRED);
    for (int i = 0; i < bc.n_preferred; i++)
        FUZZ_ASSERT(bc.preferred_batch_size[i] >= 1 && bc.preferred_batch_size[i] <= bc.max_batch_size);
    return 0;
}
