/*
 * attn_split.h — how a decode step splits the keys of a (token, head) over
 * blocks ("flash-decoding": each block attends over one range, the last to
 * finish merges the partial triples). Plain C, so that the kernels
 * (attention.cu) and a host test (tests/test_attn_split_plan.c) run the same
 * arithmetic.
 *
 * A step is launched with n_splits blocks per (token, head); a (token,
 * head) of len keys uses at most one split per split_min keys (0: no such
 * cap), its splits take chunk keys each, chunk rounded up to a multiple of
 * round (16 for the tensor-core kernels' 16-key tiles), and only the splits
 * that have keys after that rounding are in use: split sp < used attends
 * over [sp * chunk, min(len, (sp + 1) * chunk)), never empty, and the
 * ranges cover [0, len) once. The blocks of splits >= used return at once;
 * the merge counts `used` partials.
 */
#ifndef TB_BACKEND_CUDA_ATTN_SPLIT_H
#define TB_BACKEND_CUDA_ATTN_SPLIT_H

#ifdef __CUDACC__
#define TBC_SPLIT_FN static __host__ __device__ __forceinline__
#else
#define TBC_SPLIT_FN static inline
#endif

/* Splits in use for len >= 1 keys (1 .. n_splits); *chunk the keys of each
 * (the last may have fewer). n_splits >= 1, round >= 1. */
TBC_SPLIT_FN int tbc_split_plan(int n_splits, int split_min, int len, int round, int *chunk) {
    int ns = n_splits;
    if (split_min > 0) {
        int cap = (len + split_min - 1) / split_min;
        if (cap < ns) ns = cap < 1 ? 1 : cap;
    }
    int c = (len + ns - 1) / ns;
    c = (c + round - 1) / round * round;
    *chunk = c;
    return (len + c - 1) / c;
}

#endif
