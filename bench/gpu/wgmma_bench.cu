/*
 * wgmma_bench.cu — a skinny f16 GEMM on Hopper's warpgroup MMA (wgmma) fed
 * by the tensor-memory accelerator (TMA), checked against cuBLAS and timed
 * against it and against the card's streaming read.
 *
 *   wgmma_bench [--reps N] [--t 16,32,64,128] [--only qkv|o|gu|down] [--no-int8]
 *
 * The product of a decode step of T tokens (16..128): y[T][N] (f32) =
 * x[T][K] (f16) . W[N][K]^T (f16, the engine's row-major weights). The weights
 * are the wgmma's A operand (M = 128 weight rows a block, two m64 halves),
 * the tokens its B operand (N = T); both come into shared memory by TMA
 * tiles of 64 values of K (128 bytes a row, the 128-byte swizzle) through a
 * ring of NST slots: one producer warp waits for a slot's "empty" barrier and
 * issues the two tile copies on its "full" barrier; one consumer warpgroup
 * waits on "full", issues 4 x 2 wgmmas (k16 steps, the two halves), commits
 * and, once the previous group has finished (wait_group 1), releases that
 * group's slot. K is split over S blocks of a cluster (grid y): each block
 * keeps its partial tile in its own shared memory and block r adds rows
 * [r 128 / S, (r + 1) 128 / S) of all S partials in rank order (distributed
 * shared memory), so the sums do not depend on timing.
 *
 * Checks: every shape and T against cublasGemmEx (f16 in, f32 out, f32
 * compute) within 2e-3 of the output's largest magnitude; a second launch
 * bit-identical. Timing: cudaEvents over --reps launches (50) rotating over
 * copies of W that together exceed 4x the L2, median of 5 rounds; the same
 * for cublasGemmEx; GB/s of W and the ratio to a streaming read of 1 GiB.
 * Last line "wgmma_bench: PASS" (exit 0) or "wgmma_bench: FAIL" (exit 1).
 * Built for sm_90a only (wgmma and the arch-specific features).
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                \
            exit(2);                                                                                           \
        }                                                                                                      \
    } while (0)

#define BM 128      /* weight rows a block: two m64 halves */
#define BK 64       /* values of K a stage: 128 bytes a row, the swizzle's span */
#define A_BYTES (BM * BK * 2)
#define WG_MAX_S 4 /* the most blocks a K split (a cluster) takes */

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WG_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WG_WAIT_%=;\n"
                 "}\n" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
}
/* a 2-d TMA tile (c0: the innermost coordinate, K) into shared memory */
__device__ __forceinline__ void tma_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(smem_u32(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
/* the generic address of the same shared variable in block `rank` of the cluster */
template <class T> __device__ __forceinline__ T *cluster_map(T *p, unsigned rank) {
    uint64_t out;
    asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
    return reinterpret_cast<T *>(out);
}

/* A shared-memory matrix descriptor: K-major rows of 128 bytes, 128-byte
 * swizzle, 8-row groups 1024 bytes apart (the stride byte offset); the
 * leading byte offset is unused in this mode (1). */
__device__ __forceinline__ uint64_t wg_desc(const void *p) {
    const uint64_t a = smem_u32(p);
    return ((a & 0x3ffffull) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int NPEND> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(NPEND) : "memory");
}
/* Pins the accumulators at this point of the program: the compiler may not
 * move their zeroing past it nor the epilogue's reads and writes before it
 * (the wgmmas write them asynchronously, unseen by it). */
template <int N> __device__ __forceinline__ void wg_pin(float *d) {
#pragma unroll
    for (int j = 0; j < N / 2; j++) asm volatile("" : "+f"(d[j])::"memory");
}
/* d (64 x N f32, the m64nNk16 accumulator fragment) += A (64 x 16) B (16 x N) */
template <int N> __device__ __forceinline__ void wg_mma(float *d, uint64_t da, uint64_t db);
template <> __device__ __forceinline__ void wg_mma<16>(float *d, uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "%8, %9, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db));
}
template <> __device__ __forceinline__ void wg_mma<32>(float *d, uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db));
}
template <> __device__ __forceinline__ void wg_mma<64>(float *d, uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db));
}
template <> __device__ __forceinline__ void wg_mma<128>(float *d, uint64_t da, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, 1, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db));
}

/* d (64 x N f32) += A (64 x 16, f16 fragments in registers: each warp its 16 rows as
 * mma.sync's m16n8k16 A) B (16 x N from shared memory) */
template <int N> __device__ __forceinline__ void wg_mma_ra(float *d, const uint32_t *a, uint64_t db);
template <> __device__ __forceinline__ void wg_mma_ra<16>(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
template <> __device__ __forceinline__ void wg_mma_ra<32>(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
template <> __device__ __forceinline__ void wg_mma_ra<64>(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}


/* The consumer warpgroup's accumulators (acc0: rows row0 .. + 63, acc1:
 * the next 64; times scale[row] when scale is set): into y when the block
 * holds all of K (S == 1), else into its partial tile. d[j] of an m64 half:
 * row 16 warp + lane / 4 + 8 ((j / 2) % 2), column (token) 8 (j / 4) +
 * 2 (lane % 4) + j % 2. */
template <int TN>
__device__ __forceinline__ void wg_out(float *acc0, float *acc1, float *part, float *__restrict__ y,
                                       const float *__restrict__ scale, int T, int N, int row0, int S, int warp,
                                       int lane) {
    constexpr int PS = TN + 4;
    const int ra = 16 * warp + (lane >> 2);
    float sa0 = 1.0f, sa1 = 1.0f, sb0 = 1.0f, sb1 = 1.0f; /* rows ra, ra + 8, 64 + ra, 72 + ra */
    if (scale) {
        sa0 = row0 + ra < N ? scale[row0 + ra] : 0.0f;
        sa1 = row0 + ra + 8 < N ? scale[row0 + ra + 8] : 0.0f;
        sb0 = row0 + 64 + ra < N ? scale[row0 + 64 + ra] : 0.0f;
        sb1 = row0 + 72 + ra < N ? scale[row0 + 72 + ra] : 0.0f;
    }
    if (S == 1) {
#pragma unroll
        for (int j = 0; j < TN / 2; j++) {
            const int hi = (j >> 1) & 1, r = ra + 8 * hi, c = 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
            if (c < T) {
                if (row0 + r < N) y[(size_t)c * N + row0 + r] = acc0[j] * (hi ? sa1 : sa0);
                if (row0 + 64 + r < N) y[(size_t)c * N + row0 + 64 + r] = acc1[j] * (hi ? sb1 : sb0);
            }
        }
        return;
    }
    asm volatile("bar.sync 1, 128;\n" ::: "memory"); /* the whole warpgroup is past its last wgmma */
#pragma unroll
    for (int j = 0; j < TN / 2; j += 2) { /* d[j], d[j + 1]: columns c, c + 1 */
        const int hi = (j >> 1) & 1, r = ra + 8 * hi, c = 8 * (j >> 2) + 2 * (lane & 3);
        const float fa = hi ? sa1 : sa0, fb = hi ? sb1 : sb0;
        *reinterpret_cast<float2 *>(&part[r * PS + c]) = make_float2(acc0[j] * fa, acc0[j + 1] * fa);
        *reinterpret_cast<float2 *>(&part[(64 + r) * PS + c]) = make_float2(acc1[j] * fb, acc1[j + 1] * fb);
    }
}

/* After every block of the cluster left its partial tile in its shared
 * memory: block `rank` adds rows [rank BM / S, (rank + 1) BM / S) of all S
 * (in rank order) into y; both cluster barriers included. Every thread of
 * every block calls it. */
template <int TN>
__device__ __forceinline__ void wg_split_sum(float *part, float *__restrict__ y, int T, int N, int row0, int S,
                                             int tid) {
    constexpr int PS = TN + 4;
    __syncwarp(); /* a producer's lane 0 rejoins its warp: the cluster barrier is warp-aligned */
    cluster_sync(); /* every block's partial is in its shared memory */
    const unsigned rank = cluster_rank();
    const int r0 = (int)rank * BM / S, nr = ((int)rank + 1) * BM / S - r0;
    const float *pp[WG_MAX_S];
#pragma unroll
    for (int q = 0; q < WG_MAX_S; q++) pp[q] = cluster_map(part, (unsigned)(q < S ? q : 0));
    /* a unit: 4 tokens of one row; rows fastest, so y's stores coalesce;
     * the S partials' loads are issued before they are added (in rank order) */
    for (int u = tid; u < nr * (TN / 4); u += blockDim.x) {
        const int r = r0 + u % nr, c = 4 * (u / nr);
        if (c >= T || row0 + r >= N) continue;
        float4 v[WG_MAX_S];
#pragma unroll
        for (int q = 0; q < WG_MAX_S; q++)
            if (q < S) v[q] = *reinterpret_cast<const float4 *>(pp[q] + r * PS + c);
        float4 a = v[0];
#pragma unroll
        for (int q = 1; q < WG_MAX_S; q++)
            if (q < S) {
                a.x += v[q].x;
                a.y += v[q].y;
                a.z += v[q].z;
                a.w += v[q].w;
            }
        float *yo = y + (size_t)c * N + row0 + r;
        yo[0] = a.x;
        if (c + 1 < T) yo[N] = a.y;
        if (c + 2 < T) yo[2 * (size_t)N] = a.z;
        if (c + 3 < T) yo[3 * (size_t)N] = a.w;
    }
    cluster_sync(); /* the other blocks have read this one's partial */
}

/* A block's place: its ring (the dynamic shared memory, 1024-byte aligned,
 * as the swizzle needs), thread ids, its 128 rows and its share of the K
 * steps of bk values (split S ways by grid y). */
struct wg_block {
    uint8_t *ring;
    int tid, warp, lane, S, row0, k0, n;
};
__device__ __forceinline__ wg_block wg_block_of(uint8_t *dyn, int K, int bk) {
    wg_block b;
    b.ring = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(dyn) + 1023) & ~(uintptr_t)1023);
    b.tid = threadIdx.x;
    b.warp = b.tid >> 5;
    b.lane = b.tid & 31;
    b.S = gridDim.y;
    b.row0 = blockIdx.x * BM;
    const int nk = (K + bk - 1) / bk, s = blockIdx.y;
    b.k0 = (int)((long)s * nk / b.S);
    b.n = (int)((long)(s + 1) * nk / b.S) - b.k0;
    return b;
}

/* The ring's barriers, by thread 0: "full" completes on the producer's
 * arrival and a stage's bytes, "empty" on one arrival a consumer warp. */
template <int NST> __device__ __forceinline__ void wg_ring_init(uint64_t *full, uint64_t *empty) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}
/* The producer (one thread): stages 0 .. n - 1 into slot i % NST once that
 * slot's "empty" completed, `issue(slot memory, i, full barrier)` sending
 * the stage's copies, `stage` bytes in all. */
template <int NST, class Issue>
__device__ __forceinline__ void wg_produce(int n, int stage, uint8_t *ring, uint64_t *full, uint64_t *empty,
                                           Issue issue) {
    for (int i = 0; i < n; i++) {
        const int slot = i % NST;
        if (i >= NST) mbar_wait(&empty[slot], (unsigned)((i / NST - 1) & 1));
        mbar_expect(&full[slot], (unsigned)stage);
        issue(ring + (size_t)slot * stage, i, &full[slot]);
    }
}

/* grid (ceil(N / BM), S), clusters of (1, S); 160 threads: warps 0-3 the
 * consumer warpgroup, warp 4 the producer. Shared memory: NST slots of
 * [A: BM x BK][B: TN x BK] f16 (1024-byte aligned, as the swizzle needs),
 * after the loop the partial tile [BM][TN + 4] f32 in their place (rows of
 * 16-byte units, so the reduction reads float4s). */
template <int TN, int NST>
__global__ void __launch_bounds__(160)
wg_gemm_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap, float *__restrict__ y,
               int T, int K, int N) {
    extern __shared__ uint8_t dyn[];
    __shared__ __align__(8) uint64_t full[NST], empty[NST];
    constexpr int B_BYTES = TN * BK * 2, STAGE = A_BYTES + B_BYTES;
    static_assert(STAGE % 1024 == 0, "stages stay 1024-byte aligned");
    static_assert(BM * (TN + 4) * 4 <= NST * STAGE, "the partial tile fits in the ring");
    const wg_block b = wg_block_of(dyn, K, BK);
    uint8_t *ring = b.ring;
    float *part = reinterpret_cast<float *>(ring);
    const int tid = b.tid, warp = b.warp, lane = b.lane, S = b.S, row0 = b.row0, k0 = b.k0, n = b.n;
    wg_ring_init<NST>(full, empty);
    if (warp == 4) {
        if (lane == 0)
            wg_produce<NST>(n, STAGE, ring, full, empty, [&](uint8_t *st, int i, uint64_t *bar) {
                tma_2d(st, &wmap, (k0 + i) * BK, row0, bar);
                tma_2d(st + A_BYTES, &xmap, (k0 + i) * BK, 0, bar);
            });
    } else {
        float acc0[TN / 2], acc1[TN / 2];
#pragma unroll
        for (int j = 0; j < TN / 2; j++) acc0[j] = acc1[j] = 0.0f;
        wg_pin<TN>(acc0);
        wg_pin<TN>(acc1);
        for (int i = 0; i < n; i++) {
            const int slot = i % NST;
            mbar_wait(&full[slot], (unsigned)((i / NST) & 1));
            const uint8_t *st = ring + (size_t)slot * STAGE;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint64_t db = wg_desc(st + A_BYTES + kk * 32);
                wg_mma<TN>(acc0, wg_desc(st + kk * 32), db);
                wg_mma<TN>(acc1, wg_desc(st + 64 * 128 + kk * 32), db);
            }
            wg_commit();
            wg_wait<1>();
            if (i > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % NST]);
        }
        wg_wait<0>();
        wg_pin<TN>(acc0);
        wg_pin<TN>(acc1);
        wg_out<TN>(acc0, acc1, part, y, nullptr, T, N, row0, S, warp, lane);
    }
    if (S > 1) wg_split_sum<TN>(part, y, T, N, row0, S, tid);
}

/* ------------------------------------------------ int8 weights, A from registers
 * The same pipeline over int8 codes (core/quant.h: row-major, one f32 scale
 * a row): a stage holds BKQ = 128 codes of BM rows (one 128-byte swizzled
 * TMA box) and the two 64-value x boxes of those K. The consumer warpgroup
 * reads each thread's A fragment (rows g, g + 8 of its warp's 16; codes
 * 2t, 2t + 1 and 2t + 8, 2t + 9 of a k16 step: two bytes at a time, through
 * the swizzle, conflict-free) and widens it to f16 pairs exactly (code +
 * 1152 in the mantissa of 1024, less 1152), so the wgmma takes A from
 * registers and x from shared memory; the row scale multiplies the f32 sums.
 * A stage's 8 k16 steps go out as two commit groups of 4 (two register sets:
 * one set widens while the other's group runs); a slot is released once
 * the group after its last one has completed. */
#define BKQ 128
#define AQ_BYTES (BM * BKQ)

/* two int8 codes (the low 16 bits of w) -> one f16 pair, exactly */
__device__ __forceinline__ uint32_t widen2_i8(uint32_t w) {
    const uint32_t u = (w ^ 0x8080u) & 0xffffu;
    uint32_t h = __byte_perm(u, 0x64646464u, 0x5140);
    __half2 r = __hsub2(*reinterpret_cast<__half2 *>(&h), __half2(__float2half(1152.0f), __float2half(1152.0f)));
    return *reinterpret_cast<uint32_t *>(&r);
}
/* the two codes at byte b (even) of row r of a [BM][128] box with the 128-byte swizzle */
__device__ __forceinline__ uint32_t code2(const uint8_t *a, int r, int b) {
    return *reinterpret_cast<const uint16_t *>(a + r * 128 + ((((b >> 4) ^ (r & 7))) << 4) + (b & 15));
}
/* A fragments of k16 steps kk0 .. kk0 + 3 for both halves: f[(kk - kk0) * 2 + half][4] */
__device__ __forceinline__ void widen_frags(const uint8_t *a, int kk0, int warp, int lane, uint32_t (*f)[4]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 64 * h + 16 * warp + g, b = 16 * (kk0 + s) + 2 * t;
            f[s * 2 + h][0] = widen2_i8(code2(a, r, b));
            f[s * 2 + h][1] = widen2_i8(code2(a, r + 8, b));
            f[s * 2 + h][2] = widen2_i8(code2(a, r, b + 8));
            f[s * 2 + h][3] = widen2_i8(code2(a, r + 8, b + 8));
        }
}

template <int TN, int NST>
__global__ void __launch_bounds__(160)
wg_qgemm_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                const float *__restrict__ scale, float *__restrict__ y, int T, int K, int N) {
    extern __shared__ uint8_t dyn[];
    __shared__ __align__(8) uint64_t full[NST], empty[NST];
    constexpr int XB = TN * 64 * 2, STAGE = AQ_BYTES + 2 * XB;
    static_assert(STAGE % 1024 == 0, "stages stay 1024-byte aligned");
    static_assert(BM * (TN + 4) * 4 <= NST * STAGE, "the partial tile fits in the ring");
    const wg_block b = wg_block_of(dyn, K, BKQ);
    uint8_t *ring = b.ring;
    float *part = reinterpret_cast<float *>(ring);
    const int tid = b.tid, warp = b.warp, lane = b.lane, S = b.S, row0 = b.row0, k0 = b.k0, n = b.n;
    wg_ring_init<NST>(full, empty);
    if (warp == 4) {
        if (lane == 0)
            wg_produce<NST>(n, STAGE, ring, full, empty, [&](uint8_t *st, int i, uint64_t *bar) {
                tma_2d(st, &wmap, (k0 + i) * BKQ, row0, bar);
                tma_2d(st + AQ_BYTES, &xmap, (k0 + i) * BKQ, 0, bar);
                tma_2d(st + AQ_BYTES + XB, &xmap, (k0 + i) * BKQ + 64, 0, bar);
            });
    } else {
        float acc0[TN / 2], acc1[TN / 2];
#pragma unroll
        for (int j = 0; j < TN / 2; j++) acc0[j] = acc1[j] = 0.0f;
        wg_pin<TN>(acc0);
        wg_pin<TN>(acc1);
        uint32_t fa[8][4], fb[8][4];
        for (int i = 0; i < n; i++) {
            const int slot = i % NST;
            mbar_wait(&full[slot], (unsigned)((i / NST) & 1));
            const uint8_t *st = ring + (size_t)slot * STAGE;
            /* k16 steps 0-3 (x box 0) */
            widen_frags(st, 0, warp, lane, fa);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint64_t db = wg_desc(st + AQ_BYTES + kk * 32);
                wg_mma_ra<TN>(acc0, fa[kk * 2], db);
                wg_mma_ra<TN>(acc1, fa[kk * 2 + 1], db);
            }
            wg_commit();
            wg_wait<1>(); /* the previous stage's second group: fb free, that slot read */
            if (i > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % NST]);
            /* k16 steps 4-7 (x box 1) */
            widen_frags(st, 4, warp, lane, fb);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint64_t db = wg_desc(st + AQ_BYTES + XB + kk * 32);
                wg_mma_ra<TN>(acc0, fb[kk * 2], db);
                wg_mma_ra<TN>(acc1, fb[kk * 2 + 1], db);
            }
            wg_commit();
            wg_wait<1>(); /* this stage's first group: fa free */
        }
        wg_wait<0>();
        wg_pin<TN>(acc0);
        wg_pin<TN>(acc1);
        wg_out<TN>(acc0, acc1, part, y, scale, T, N, row0, S, warp, lane);
    }
    if (S > 1) wg_split_sum<TN>(part, y, T, N, row0, S, tid);
}

/* ------------------------------------------------------------------ host */
static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled;

/* a row-major [rows][cols] matrix of f16 (or bytes: u8) in boxes of box_rows
 * rows of 128 bytes, the 128-byte swizzle */
static CUtensorMap tile_map(const void *base, int rows, int cols, int box_rows, bool u8 = false) {
    CUtensorMap m;
    const int es = u8 ? 1 : 2;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)cols * es};
    cuuint32_t box[2] = {(cuuint32_t)(128 / es), (cuuint32_t)box_rows};
    cuuint32_t estr[2] = {1, 1};
    CUresult r = encode_tiled(&m, u8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                              const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled failed (%d): rows %d cols %d box %d\n", (int)r, rows, cols, box_rows);
        exit(2);
    }
    return m;
}

/* kern over (ceil(N / BM), S) blocks of 160 threads in clusters of (1, S) */
template <class... KArgs, class... Args>
static void launch_cluster(void (*kern)(KArgs...), size_t smem, int N, int S, cudaStream_t st, Args... args) {
    static std::vector<const void *> seen;
    if (std::find(seen.begin(), seen.end(), (const void *)kern) == seen.end()) {
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        seen.push_back((const void *)kern);
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((N + BM - 1) / BM), (unsigned)S, 1);
    cfg.blockDim = dim3(160, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = (unsigned)S;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kern, args...));
}

template <int TN, int NST>
static void launch_t(const CUtensorMap &wm, const CUtensorMap &xm, const float *scale, float *y, int T, int K, int N,
                     int S, cudaStream_t st) {
    if constexpr (TN <= 64) {
        if (scale) {
            launch_cluster(wg_qgemm_kernel<TN, NST>, (size_t)NST * (AQ_BYTES + 2 * TN * 128) + 1024, N, S, st, wm, xm,
                           scale, y, T, K, N);
            return;
        }
    }
    launch_cluster(wg_gemm_kernel<TN, NST>, (size_t)NST * (A_BYTES + TN * BK * 2) + 1024, N, S, st, wm, xm, y, T,
                       K, N);
}

/* one configuration: TN (T rounded up to 16, 32, 64, 128), the ring's depth, the K split */
struct cfg_t {
    int tn, nst, s;
};
/* scale set: the int8 kernel (wm over the codes) */
static void launch(const cfg_t &c, const CUtensorMap &wm, const CUtensorMap &xm, const float *scale, float *y, int T,
                   int K, int N, cudaStream_t st) {
    if (c.s < 1 || c.s > WG_MAX_S) {
        fprintf(stderr, "K split %d out of 1..%d\n", c.s, WG_MAX_S);
        exit(2);
    }
#define WG_CASE(TN_, NST_)                                                                                     \
    if (c.tn == TN_ && c.nst == NST_) return launch_t<TN_, NST_>(wm, xm, scale, y, T, K, N, c.s, st);
    WG_CASE(16, 4) WG_CASE(16, 6) WG_CASE(16, 8) WG_CASE(32, 4) WG_CASE(32, 6) WG_CASE(64, 3) WG_CASE(64, 4)
    WG_CASE(64, 6)
    if (!scale) {
        WG_CASE(128, 3) WG_CASE(128, 4)
    }
#undef WG_CASE
    fprintf(stderr, "no kernel for TN %d NST %d\n", c.tn, c.nst);
    exit(2);
}

__global__ void fill_kernel(__half *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2half(((float)(h & 0xffff) / 32768.0f - 1.0f));
    }
}
/* int8 codes in -127..127 and the same values as f16 */
__global__ void fill_codes_kernel(int8_t *c, __half *f, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const int v = (int)(h % 255u) - 127;
        c[i] = (int8_t)v;
        f[i] = __int2half_rn(v);
    }
}
__global__ void fill_scales_kernel(float *s, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s[i] = 1e-3f * (1.0f + (float)(((uint32_t)i * 2654435761u ^ seed) >> 22) / 1024.0f);
}
__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink) {
    uint32_t a = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i);
        a ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (a == 0x12345678u) *sink = a;
}

static float median5(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    int reps = 50;
    std::vector<int> ts = {16, 32, 64, 128};
    const char *only = nullptr;
    bool int8 = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-int8")) int8 = false;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--t") && i + 1 < argc) {
            ts.clear();
            for (char *p = strtok(argv[++i], ","); p; p = strtok(nullptr, ",")) ts.push_back(atoi(p));
        } else {
            fprintf(stderr, "usage: wgmma_bench [--reps N] [--t 16,32,64,128] [--only NAME] [--no-int8]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MiB, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
           prop.major, prop.minor);
    if (prop.major != 9) {
        printf("wgmma_bench: needs compute capability 9.0\nwgmma_bench: FAIL\n");
        return 1;
    }
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode_tiled, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !encode_tiled) {
        printf("wgmma_bench: no cuTensorMapEncodeTiled\nwgmma_bench: FAIL\n");
        return 1;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) return 2;
    cublasSetStream(cb, st);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* the streaming read of 1 GiB: the roofline */
    const size_t rb = (size_t)1 << 30;
    uint4 *rbuf;
    unsigned *sink;
    CK(cudaMalloc(&rbuf, rb));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(rbuf, 1, rb));
    std::vector<float> rt;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(e0, st));
        read_kernel<<<prop.multiProcessorCount * 8, 512, 0, st>>>(rbuf, rb / 16, sink);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 2) rt.push_back(ms);
    }
    const double read_bw = rb / (median5(rt) * 1e-3) / 1e9;
    printf("streaming read: %.0f GB/s\n", read_bw);
    CK(cudaFree(rbuf));

    struct shape_t {
        const char *name;
        int N, K;
    } shapes[] = {{"qkv", 12288, 4096}, {"o", 4096, 4096}, {"gu", 22016, 4096}, {"down", 4096, 11008}};
    const cfg_t cfgs[] = {{16, 4, 1}, {16, 8, 1}, {16, 4, 2}, {16, 8, 2}, {16, 4, 4}, {16, 8, 4},
                          {32, 4, 1}, {32, 6, 1}, {32, 4, 2}, {32, 6, 2}, {32, 4, 4}, {32, 6, 4},
                          {64, 4, 1}, {64, 6, 1}, {64, 4, 2}, {64, 6, 2}, {64, 6, 4},
                          {64, 4, 4},
                          {128, 3, 1}, {128, 4, 1}, {128, 3, 2}, {128, 4, 2}, {128, 3, 4}, {128, 4, 4}};
    const cfg_t qcfgs[] = {{16, 4, 1}, {16, 6, 1}, {16, 4, 2}, {16, 6, 2}, {16, 4, 4},
                           {32, 4, 1}, {32, 6, 1}, {32, 4, 2}, {32, 6, 2}, {32, 4, 4},
                           {64, 3, 1}, {64, 4, 1}, {64, 3, 2}, {64, 4, 2}, {64, 4, 4}};
    int fails = 0;
    for (int kind = 0; kind < 2; kind++) {
        const bool q8 = kind == 1;
        if (q8 && !int8) continue;
        printf("== %s weights\n", q8 ? "int8 (one scale a row)" : "f16");
        for (const shape_t &sh : shapes) {
            if (only && strcmp(only, sh.name)) continue;
            const size_t wn = (size_t)sh.N * sh.K, wbytes = q8 ? wn + (size_t)sh.N * 4 : wn * 2;
            const int copies = (int)std::max<size_t>(2, (4 * (size_t)prop.l2CacheSize + wbytes - 1) / wbytes);
            /* f16 weights; for int8 the codes' values as f16 (exact), the
             * cuBLAS reference and the dequantised path's timing */
            __half *w;
            int8_t *codes = nullptr;
            float *scales = nullptr;
            CK(cudaMalloc(&w, wn * 2 * copies));
            if (q8) {
                CK(cudaMalloc(&codes, wn * copies));
                CK(cudaMalloc(&scales, (size_t)sh.N * 4 * copies));
                fill_codes_kernel<<<1024, 256, 0, st>>>(codes, w, wn * copies, 5u);
                fill_scales_kernel<<<64, 256, 0, st>>>(scales, (size_t)sh.N * copies, 3u);
            } else {
                fill_kernel<<<1024, 256, 0, st>>>(w, wn * copies, 7u);
            }
            const int tmax = 128;
            __half *x;
            float *y, *yr, *y2;
            CK(cudaMalloc(&x, (size_t)tmax * sh.K * 2));
            CK(cudaMalloc(&y, (size_t)tmax * sh.N * 4));
            CK(cudaMalloc(&y2, (size_t)tmax * sh.N * 4));
            CK(cudaMalloc(&yr, (size_t)tmax * sh.N * 4));
            fill_kernel<<<256, 256, 0, st>>>(x, (size_t)tmax * sh.K, 11u);
            std::vector<CUtensorMap> wm(copies), fm(copies);
            for (int c = 0; c < copies; c++) {
                fm[c] = tile_map(w + wn * c, sh.N, sh.K, BM);
                wm[c] = q8 ? tile_map(codes + wn * c, sh.N, sh.K, BM, true) : fm[c];
            }
            std::vector<float> hs(sh.N);
            if (q8) CK(cudaMemcpyAsync(hs.data(), scales, (size_t)sh.N * 4, cudaMemcpyDeviceToHost, st));
            for (int T : ts) {
                if (T > (q8 ? 64 : 128) || T < 1) continue;
                const int tn = T <= 16 ? 16 : T <= 32 ? 32 : T <= 64 ? 64 : 128;
                const CUtensorMap xm = tile_map(x, T, sh.K, tn);
                const float one = 1.0f, zero = 0.0f;
                auto cublas = [&](int c, float *out) {
                    cublasStatus_t r = cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, T, sh.K, &one, w + wn * c,
                                                    CUDA_R_16F, sh.K, x, CUDA_R_16F, sh.K, &zero, out, CUDA_R_32F,
                                                    sh.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    if (r != CUBLAS_STATUS_SUCCESS) {
                        fprintf(stderr, "cublasGemmEx failed: %d\n", (int)r);
                        exit(2);
                    }
                };
                cublas(0, yr);
                std::vector<float> ref((size_t)T * sh.N), got((size_t)T * sh.N), got2((size_t)T * sh.N);
                CK(cudaMemcpyAsync(ref.data(), yr, ref.size() * 4, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
                if (q8) /* x . codes^T times the row's scale */
                    for (size_t i = 0; i < ref.size(); i++) ref[i] *= hs[i % sh.N];
                double amax = 0;
                for (float v : ref) amax = std::max(amax, (double)fabsf(v));
                auto time_it = [&](auto &&fn) {
                    std::vector<float> v;
                    for (int r = 0; r < 6; r++) {
                        CK(cudaEventRecord(e0, st));
                        for (int i = 0; i < reps; i++) fn(i % copies);
                        CK(cudaEventRecord(e1, st));
                        CK(cudaEventSynchronize(e1));
                        float ms;
                        CK(cudaEventElapsedTime(&ms, e0, e1));
                        if (r > 0) v.push_back(ms * 1e3f / reps);
                    }
                    return median5(v);
                };
                const float us_cb = time_it([&](int c) { cublas(c, y2); });
                const double gb = (double)wbytes / 1e9, gbf = (double)wn * 2 / 1e9;
                printf("%-5s N %5d K %5d T %3d  cublas f16 %8.2f us %6.0f GB/s (%.1f%% of read)\n", sh.name, sh.N,
                       sh.K, T, us_cb, gbf / (us_cb * 1e-6), 100.0 * gbf / (us_cb * 1e-6) / read_bw);
                float best = 1e30f;
                cfg_t bc = {0, 0, 0};
                for (const cfg_t &c : q8 ? std::vector<cfg_t>(std::begin(qcfgs), std::end(qcfgs))
                                         : std::vector<cfg_t>(std::begin(cfgs), std::end(cfgs))) {
                    if (c.tn != tn) continue;
                    const float *sc = q8 ? scales : nullptr;
                    CK(cudaMemsetAsync(y, 0xff, (size_t)T * sh.N * 4, st));
                    launch(c, wm[0], xm, sc, y, T, sh.K, sh.N, st);
                    CK(cudaGetLastError());
                    CK(cudaMemcpyAsync(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost, st));
                    launch(c, wm[0], xm, sc, y, T, sh.K, sh.N, st);
                    CK(cudaMemcpyAsync(got2.data(), y, got2.size() * 4, cudaMemcpyDeviceToHost, st));
                    CK(cudaStreamSynchronize(st));
                    double err = 0;
                    size_t bad = 0, where = 0;
                    for (size_t i = 0; i < got.size(); i++) {
                        double d = fabs((double)got[i] - ref[i]);
                        if (!(d <= 2e-3 * amax)) {
                            if (!bad) where = i;
                            bad++;
                        }
                        if (d > err || d != d) err = d != d ? INFINITY : std::max(err, d);
                    }
                    const bool same = !memcmp(got.data(), got2.data(), got.size() * 4);
                    const float us = time_it([&](int cc) {
                        launch(c, wm[cc], xm, q8 ? scales + (size_t)sh.N * cc : nullptr, y, T, sh.K, sh.N, st);
                    });
                    printf("      TN %3d NST %d S %d: %8.2f us %6.0f GB/s (%.1f%% of read, %.2fx cublas f16)  max err "
                           "%.2e (of %.1f)%s%s\n",
                           c.tn, c.nst, c.s, us, gb / (us * 1e-6), 100.0 * gb / (us * 1e-6) / read_bw, us_cb / us,
                           err, amax, bad ? "  FAIL" : "", same ? "" : "  NOT REPEATABLE");
                    if (bad)
                        printf("        %zu bad, first at token %zu row %zu: %g against %g\n", bad, where / sh.N,
                               where % sh.N, got[where], ref[where]);
                    if (bad || !same) fails++;
                    else if (us < best) {
                        best = us;
                        bc = c;
                    }
                }
                printf("      best: TN %d NST %d S %d %.2f us = %.2fx cublas f16\n", bc.tn, bc.nst, bc.s, best,
                       us_cb / best);
            }
            CK(cudaFree(w));
            if (codes) CK(cudaFree(codes));
            if (scales) CK(cudaFree(scales));
            CK(cudaFree(x));
            CK(cudaFree(y));
            CK(cudaFree(y2));
            CK(cudaFree(yr));
        }
    }
    printf("wgmma_bench: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
