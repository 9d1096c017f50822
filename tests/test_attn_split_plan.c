/*
 * test_attn_split_plan.c — the key ranges of the CUDA decode attention's
 * splits (backend/cuda/attn_split.h, the arithmetic the kernels run), on the
 * host: for 1 to 32 launched splits, split_min 0, 1, 16, 50 and 64, rounding
 * to 1 and 16 keys, and every context of 1 to 2,100 keys:
 *   - between 1 and the launched count of splits are in use, at most one
 *     per split_min keys, and chunk is a positive multiple of the rounding;
 *   - each split in use has keys, the ranges are contiguous from 0 and end
 *     at len (every key attended once);
 *   - the splits not in use are exactly those that would start past the
 *     last key, so none of them would have had a key.
 * And cases by hand: 144 keys in 32 splits of 16-key tiles use 9 splits of
 * 16 (a batch-1 step of 8 kv heads in GQA blocks is launched with 32 splits:
 * the tensor-core kernels merged 23 empty partials before), 50 keys in 9
 * splits use 4, and 5 keys in 4 splits of the scalar kernel use 3 of 2 keys.
 */
#include "backend/cuda/attn_split.h"
#include "tb_test.h"

static int check_plan(int n_splits, int split_min, int len, int round) {
    int chunk = -1;
    const int used = tbc_split_plan(n_splits, split_min, len, round, &chunk);
    if (used < 1 || used > n_splits) return 1;
    if (split_min > 0 && used > (len + split_min - 1) / split_min && used > 1) return 2;
    if (chunk < 1 || chunk % round) return 3;
    int end = 0;
    for (int sp = 0; sp < used; sp++) {
        const int lo = sp * chunk, hi = lo + chunk < len ? lo + chunk : len;
        if (lo != end) return 4; /* contiguous */
        if (hi <= lo) return 5;  /* never empty */
        end = hi;
    }
    if (end != len) return 6;
    for (int sp = used; sp < n_splits; sp++)
        if (sp * chunk < len) return 7; /* a split left out would have had keys */
    return 0;
}

int main(void) {
    static const int mins[] = {0, 1, 16, 50, 64};
    static const int rounds[] = {1, 16};
    for (int ns = 1; ns <= 32; ns++)
        for (size_t mi = 0; mi < sizeof mins / sizeof *mins; mi++)
            for (size_t ri = 0; ri < sizeof rounds / sizeof *rounds; ri++) {
                int bad = 0, bad_len = 0;
                for (int len = 1; len <= 2100 && !bad; len++)
                    if ((bad = check_plan(ns, mins[mi], len, rounds[ri]))) bad_len = len;
                CHECK_MSG(!bad, "n_splits %d split_min %d round %d len %d: failure %d", ns, mins[mi], rounds[ri],
                          bad_len, bad);
            }
    int chunk = 0;
    CHECK(tbc_split_plan(32, 0, 144, 16, &chunk) == 9 && chunk == 16);
    CHECK(tbc_split_plan(17, 0, 144, 16, &chunk) == 9 && chunk == 16);
    CHECK(tbc_split_plan(9, 0, 50, 16, &chunk) == 4 && chunk == 16);
    CHECK(tbc_split_plan(4, 0, 5, 1, &chunk) == 3 && chunk == 2);
    CHECK(tbc_split_plan(8, 0, 1000, 16, &chunk) == 8 && chunk == 128);
    CHECK(tbc_split_plan(32, 64, 144, 16, &chunk) == 3 && chunk == 48);
    CHECK(tbc_split_plan(1, 0, 1, 16, &chunk) == 1 && chunk == 16);
    return tb_test_finish("test_attn_split_plan");
}
