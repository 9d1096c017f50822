/* cuda_util.cuh — helpers shared by the .cu files: typed loads, warp and
 * block reductions, one RoPE rotation, programmatic dependent launch. */
#ifndef TB_CUDA_UTIL_CUH
#define TB_CUDA_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_kernels.h"

/* Element i of a weight array of type wdt, as f32. */
__device__ __forceinline__ float tbc_load(const void *p, int wdt, size_t i) {
    if (wdt == TBC_F16) return __half2float(((const __half *)p)[i]);
    if (wdt == TBC_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ float tbc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32); every thread gets it.
 * red: 32 floats of shared memory. */
__device__ __forceinline__ float tbc_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tbc_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return tbc_warp_sum(v);
}

/* Four e4m3 codes of v * inv (round to nearest even, saturating at +-448),
 * packed low byte first: the FP8 GEMM's x, four codes a 32-bit store. */
__device__ __forceinline__ unsigned int tbc_e4m3x4(float4 v, float inv) {
    const unsigned int b0 = __nv_cvt_float_to_fp8(v.x * inv, __NV_SATFINITE, __NV_E4M3);
    const unsigned int b1 = __nv_cvt_float_to_fp8(v.y * inv, __NV_SATFINITE, __NV_E4M3);
    const unsigned int b2 = __nv_cvt_float_to_fp8(v.z * inv, __NV_SATFINITE, __NV_E4M3);
    const unsigned int b3 = __nv_cvt_float_to_fp8(v.w * inv, __NV_SATFINITE, __NV_E4M3);
    return (b0 & 0xffu) | ((b1 & 0xffu) << 8) | ((b2 & 0xffu) << 16) | ((b3 & 0xffu) << 24);
}

/* Two int8 / e4m3 KV-cache codes (the low 16 bits of w, first code in the
 * low byte; kv_q TBC_KVQ_I8 or TBC_KVQ_FP8) as f32 code values, exact (every
 * e4m3 value is an f16: one cvt.rn.f16x2.e4m3x2 for the pair). The decode
 * attention and the flash prefill's tile loads both read codes this way. */
template <int KVQ>
__device__ __forceinline__ float2 tbc_kv_codes2(uint32_t w) {
    if (KVQ == TBC_KVQ_FP8)
        return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3)));
    return make_float2((float)(int8_t)(w & 0xffu), (float)(int8_t)((w >> 8) & 0xffu));
}

/* Rotates pair j of one head by `angle` (the reference's layouts:
 * interleaved = 0 pairs (j, j + half), 1 pairs (2j, 2j + 1)). Accurate
 * sin/cos: positions reach thousands of radians. */
__device__ __forceinline__ void tbc_rotate_pair(float *v, int j, int half, int interleaved, float angle) {
    float sn, cs;
    sincosf(angle, &sn, &cs);
    int i0 = interleaved ? 2 * j : j;
    int i1 = interleaved ? 2 * j + 1 : j + half;
    float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * cs - x1 * sn;
    v[i1] = x0 * sn + x1 * cs;
}

/* ---- programmatic dependent launch (see tbc_set_pdl). A kernel launched
 * with tbc_launch calls tbc_pdl_wait before it reads or writes anything the
 * previous kernel may write or read, and may call tbc_pdl_trigger once its
 * remaining work is short, so the next kernel's blocks start arriving. Both
 * are no-ops below compute capability 9.0 and in kernels launched without
 * the attribute. */
extern int tbc_pdl_on;

__device__ __forceinline__ void tbc_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void tbc_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Starts moving the 128-byte line at p into L2 (read-only data only). */
__device__ __forceinline__ void tbc_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* Raises kern's dynamic shared-memory limit to bytes on device dev once
 * (*done: one bit a device, the caller's static for that kernel; a benign
 * race: two threads may both set it); carveout: also ask for the whole
 * unified L1 as shared memory (when that decides the blocks an SM). */
template <typename... KArgs>
static cudaError_t tbc_smem_optin(void (*kern)(KArgs...), int bytes, int dev, unsigned *done, bool carveout = false) {
    if (dev < 32 && (*done >> dev & 1u)) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && carveout)
        e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 (int)cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess && dev < 32) *done |= 1u << dev;
    return e;
}

/* kern<<<grid, block, smem, s>>>(args...), with the programmatic-serialization
 * attribute while tbc_pdl_on, in clusters of cluster blocks when it holds
 * more than one (grid a multiple of it in each dimension; compute
 * capability 9.0+: the blocks of a cluster co-scheduled on one GPC, each
 * able to reach the others' shared memory); returns the launch status. */
template <typename... KArgs, typename... Args>
static cudaError_t tbc_launch_cluster_dim(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                          cudaStream_t s, dim3 cluster, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2] = {};
    unsigned n = 0;
    if (tbc_pdl_on) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster.x * cluster.y * cluster.z > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster.x;
        attr[n].val.clusterDim.y = cluster.y;
        attr[n++].val.clusterDim.z = cluster.z;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...);
    cudaError_t e2 = cudaGetLastError();
    return e != cudaSuccess ? e : e2;
}

/* tbc_launch_cluster_dim in clusters of cluster_x blocks along x. */
template <typename... KArgs, typename... Args>
static cudaError_t tbc_launch_cluster(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                      unsigned cluster_x, Args... args) {
    return tbc_launch_cluster_dim(kern, grid, block, smem, s, dim3(cluster_x, 1, 1), args...);
}

/* tbc_launch_cluster without clusters. */
template <typename... KArgs, typename... Args>
static cudaError_t tbc_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              Args... args) {
    return tbc_launch_cluster(kern, grid, block, smem, s, 1u, args...);
}

/* Cluster barrier halves (sm_90; the forms without .aligned, safe where a
 * warp has diverged before them): arrive (release; relaxed: orders
 * nothing, for "every block has started") and wait (acquire). Every thread
 * of every block of the cluster takes part. */
__device__ __forceinline__ void tbc_cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tbc_cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tbc_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}
/* This block's rank in its cluster, and the generic address of the same
 * shared-memory location p in the block of rank r. */
__device__ __forceinline__ unsigned tbc_cluster_rank() {
    unsigned r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
    return r;
}
template <typename T>
__device__ __forceinline__ T *tbc_cluster_map(T *p, unsigned r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t q;
    asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(q) : "l"(reinterpret_cast<uint64_t>(p)), "r"(r));
    return reinterpret_cast<T *>(q);
#else
    (void)r;
    return p;
#endif
}

#endif /* TB_CUDA_UTIL_CUH */
