/*
 * igemm_impl.h — what the paths of the int8 GEMM (igemm.c, igemm_avx512.c,
 * igemm_avx2.c) share; not used outside backend/cpu.
 *
 * The packed W (tb_cpu_igemm_pack) is one layout for every path:
 *   blocks of 16 output channels (N rounded up to 16, the padding channels
 *   zero), each block Kg = ceil(K / 4) groups of 64 bytes: group g holds,
 *   for each of the 16 channels c, the 4 codes W[n0 + c, 4g .. 4g + 3]
 *   (k past K zero) — one vpdpbusd operand (16 lanes of 4 bytes);
 *   then the row sums, int32 (nb16 * 16, padding 0), for the zero point.
 * A is packed per thread, per tile of mr rows: [Kg][mr][4] codes (k past K
 * zero), uint16, for the int16 AVX2 kernel (tb_cpu_igemm_pack_a); the VNNI
 * kernels read A in place.
 */
#ifndef TB_CPU_IGEMM_IMPL_H
#define TB_CPU_IGEMM_IMPL_H
#include "backend/cpu/igemm.h"

typedef struct {
    int64_t M, N, K, Kg, nb16; /* nb16 = ceil(N / 16) blocks */
    const uint8_t *A;          /* (M, K), leading dim lda */
    int64_t lda, ldy;
    int a_zero;
    float a_scale;
    const int8_t *W;     /* the packed blocks */
    const int32_t *wsum; /* (nb16 * 16) */
    const float *w_scale;
    float *Y; /* (M, N), leading dim ldy */
    const tb_cpu_sgemm_epi *epi;
} tb_igemm_job;

/* One thread's part: rows [m0, m1) x 16-blocks [b0, b1) of Y, epilogue
 * included. */
typedef void (*tb_igemm_range_fn)(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1);
void tb_cpu_igemm_range_vnni512(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1);
void tb_cpu_igemm_range_avx2(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1);
void tb_cpu_igemm_range_avxvnni(const tb_igemm_job *j, int64_t m0, int64_t m1, int64_t b0, int64_t b1);
/* Where the CPU has AVX-VNNI (256-bit vpdpbusd), the "avx2" path (and
 * "avx512" without AVX-512 VNNI) runs it instead of the int16 kernel;
 * allow 0 keeps the int16 kernel, so tests reach both on one CPU. Returns
 * the previous setting (1 at start). */
int tb_cpu_igemm_allow_avxvnni(int allow);
/* The kernel tb_cpu_igemm runs now: "avx512vnni", "avxvnni", "avx2" or "scalar". */
const char *tb_cpu_igemm_kernel(void);

/* Rows [0, mr) of A into dst as [Kg][mr][4] elements of `elem` bytes (1:
 * uint8, 2: uint16), zeros past K. */
void tb_cpu_igemm_pack_a(const uint8_t *A, int64_t lda, int64_t K, int mr, int elem, void *dst);
/* Per-thread scratch of the A tiles: at least `bytes`, 64-byte aligned,
 * kept for the thread's later calls and freed at its exit. */
void *tb_cpu_igemm_scratch(size_t bytes);
/* The epilogue (when j->epi) on the tile rows [m, m + mr) x cols [n, n + nw). */
void tb_cpu_igemm_tile_epi(const tb_igemm_job *j, int64_t m, int64_t n, int64_t mr, int64_t nw);
/* Rows of A per packed block and 16-blocks of W per chunk, so that the A
 * block (about 128 KiB) and the W chunk (about 384 KiB) stay in L2 while
 * the tiles go over them; mc a multiple of mr_tile, nb of nv_tile. */
void tb_cpu_igemm_blocks(int64_t K, int mr_tile, int nv_tile, int elem, int64_t *mc, int64_t *nb);

/* Sanitized builds get loops without forced unrolling (and the kernels one
 * run-time-sized tile): clang with ASan spends many minutes on the
 * unrolled register tiles otherwise. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IGEMM_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define IGEMM_SANITIZED 1
#endif
#define IPRAGMA(x) _Pragma(#x)
#ifdef IGEMM_SANITIZED
#define IUNROLL(n)
#else
#define IUNROLL(n) IPRAGMA(GCC unroll n)
#endif

#endif /* TB_CPU_IGEMM_IMPL_H */
