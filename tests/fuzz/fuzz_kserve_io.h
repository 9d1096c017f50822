/* fuzz_kserve_io.h — the model profile both KServe harnesses parse
 * against: four inputs covering a fixed dim, dynamic dims, BOOL and FP16.
 * g_io[] is filled once by kserve_io_setup(). */
#ifndef TB_FUZZ_KSERVE_IO_H
#define TB_FUZZ_KSERVE_IO_H

#include <stdio.h>

#include "core/core.h"

/* x FP32 [1..4, 3], ids INT64 [1..4], b BOOL [0..2, 2], h FP16 [1..2] */
static tb_io_info g_io[4];

static void kserve_io_setup(void) {
    static int done;
    if (done) return;
    done = 1;
    static const struct {
        const char *name;
        tb_dtype t;
        int rank;
        int64_t min[2], max[2];
    } d[4] = {{"x", TB_F32, 2, {1, 3}, {4, 3}},
              {"ids", TB_I64, 1, {1}, {4}},
              {"b", TB_BOOL, 2, {0, 2}, {2, 2}},
              {"h", TB_F16, 1, {1}, {2}}};
    for (int i = 0; i < 4; i++) {
        snprintf(g_io[i].name, sizeof g_io[i].name, "%s", d[i].name);
        g_io[i].dtype = d[i].t;
        g_io[i].rank = d[i].rank;
        for (int k = 0; k < d[i].rank; k++) g_io[i].min[k] = d[i].min[k], g_io[i].opt[k] = d[i].max[k], g_io[i].max[k] = d[i].max[k];
    }
}

#endif
