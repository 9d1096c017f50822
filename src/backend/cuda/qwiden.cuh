/* qwiden.cuh — device helpers shared by the quantized tensor-core kernels
 * (gemv.cu's GEMVs, qgemm.cu's GEMM): mma.sync m16n8k16 with f32
 * accumulators, and the widening of int8 / e4m3 / int4 codes to f16 pairs in
 * registers (the layouts are described at gemv.cu's "quantized weights"). */
#ifndef TB_CUDA_QWIDEN_CUH
#define TB_CUDA_QWIDEN_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_kernels.h"

template <int WDT>
__device__ __forceinline__ void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    if (WDT == TBC_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#define QT_I8 0
#define QT_FP8 1
#define QT_I4 2

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

/* One 32-bit word of int8 / e4m3 codes -> two f16x2: (e0, e1), (e2, e3). */
template <int QT>
__device__ __forceinline__ void widen_word8(uint32_t w, uint32_t &h0, uint32_t &h1) {
    if (QT == QT_I8) {
        const uint32_t u = w ^ 0x80808080u;
        const __half2 off = u2h(0x64806480u); /* 1152, 1152 */
        h0 = h2u(__hsub2(u2h(__byte_perm(u, 0x64646464u, 0x5140)), off));
        h1 = h2u(__hsub2(u2h(__byte_perm(u, 0x64646464u, 0x5342)), off));
    } else {
        __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
        __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
        h0 = (uint32_t)a.x | ((uint32_t)a.y << 16);
        h1 = (uint32_t)b.x | ((uint32_t)b.y << 16);
    }
}

/* ((a ^ 0x88888888) & M) | 0x64006400 in one lop3 for the masks M of the
 * low (0x000f000f) and high (0x00f000f0) nibbles of bytes 0 and 2: with b =
 * M and c = (0x88888888 & M) | 0x64006400 it is b ? a ^ c : c (lut 0x6a),
 * since the xor's bits lie inside M and the exponent's outside it. Written
 * out: the compiler splits such an expression into an xor, an and and an
 * or. */
__device__ __forceinline__ uint32_t lop3_lo4(uint32_t a) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;\n" : "=r"(d) : "r"(a), "r"(0x000f000fu), "r"(0x64086408u));
    return d;
}
__device__ __forceinline__ uint32_t lop3_hi4(uint32_t a) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;\n" : "=r"(d) : "r"(a), "r"(0x00f000f0u), "r"(0x64806480u));
    return d;
}

/* One 32-bit word of int4 codes -> four f16x2 of code * s + z (RAW: the
 * codes): (e0, e4), (e1, e5), (e2, e6), (e3, e7).
 * LOP (the pipelined kernel): the low nibble of a byte (sign-flipped:
 * u = code + 8) lands under the exponent of 1024 (1024 + u, less 1032), the
 * high one at 16 times that (1024 + 16 u, times 1/16 less 72): both exact,
 * one lop3 and one f16x2 op a pair, one shift for the word's upper bytes
 * (with its x layout and scale copies the one-token int4 GEMVs of a 7B
 * layer went 111 -> 70 us on the H200).
 * Without LOP each pair is shifted down, masked and offset apiece: the
 * register-loading kernel keeps that form (with LOP the 8-token down_proj,
 * then on that kernel, took 23.3 -> 27.6 us on the H200; its register
 * budget is the likely cause, not looked into further). */
template <bool RAW, bool LOP = true>
__device__ __forceinline__ void widen_word4(uint32_t w, __half2 s, __half2 z, uint32_t *h) {
    if (!LOP) {
        const uint32_t u = w ^ 0x88888888u;
        const __half2 off = u2h(0x64086408u); /* 1032, 1032 */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t m = ((u >> (4 * i)) & 0x000f000fu) | 0x64006400u;
            __half2 c = __hsub2(u2h(m), off);
            h[i] = h2u(RAW ? c : __hfma2(c, s, z));
        }
        return;
    }
    const uint32_t u = w, v = w >> 8; /* the sign flip (^ 8 a nibble) is in lop3_lo4 / lop3_hi4 */
    const __half2 off = u2h(0x64086408u);   /* 1032, 1032 */
    const __half2 sixt = u2h(0x2c002c00u);  /* 1/16 */
    const __half2 off16 = u2h(0xd480d480u); /* -72 */
    const __half2 c0 = __hsub2(u2h(lop3_lo4(u)), off), c1 = __hfma2(u2h(lop3_hi4(u)), sixt, off16);
    const __half2 c2 = __hsub2(u2h(lop3_lo4(v)), off), c3 = __hfma2(u2h(lop3_hi4(v)), sixt, off16);
    h[0] = h2u(RAW ? c0 : __hfma2(c0, s, z));
    h[1] = h2u(RAW ? c1 : __hfma2(c1, s, z));
    h[2] = h2u(RAW ? c2 : __hfma2(c2, s, z));
    h[3] = h2u(RAW ? c3 : __hfma2(c3, s, z));
}

#endif /* TB_CUDA_QWIDEN_CUH */
