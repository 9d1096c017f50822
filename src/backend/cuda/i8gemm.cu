/* i8gemm.cu — the kernels of the int8 tensor-core GEMM path (i8gemm.h):
 * per-token int8 activations for cuBLASLt's int8 x int8 -> int32 matmul,
 * and the int32 product scaled into f32 in place. */
#include <stdint.h>

#include "backend/cuda/i8gemm.h"

/* one block a token: the row's absmax, then four codes a thread and store */
__global__ void quant_x_i8_kernel(const float *__restrict__ x, int K, signed char *__restrict__ q,
                                  float *__restrict__ sx) {
    __shared__ float wmax[32];
    const int t = blockIdx.x;
    const float4 *r4 = reinterpret_cast<const float4 *>(x + (size_t)t * K);
    const int K4 = K >> 2;
    float m = 0.0f;
    for (int k = threadIdx.x; k < K4; k += blockDim.x) {
        const float4 v = r4[k];
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, wmax[i]);
    const float id = m > 0.0f ? __fdiv_rn(127.0f, m) : 0.0f;
    if (threadIdx.x == 0) sx[t] = __fdiv_rn(m, 127.0f);
    char4 *qr = reinterpret_cast<char4 *>(q + (size_t)t * K);
    for (int k = threadIdx.x; k < K4; k += blockDim.x) {
        const float4 v = r4[k];
        int a = __float2int_rn(__fmul_rn(v.x, id)), b = __float2int_rn(__fmul_rn(v.y, id));
        int c = __float2int_rn(__fmul_rn(v.z, id)), d = __float2int_rn(__fmul_rn(v.w, id));
        a = max(-127, min(127, a)); b = max(-127, min(127, b));
        c = max(-127, min(127, c)); d = max(-127, min(127, d));
        qr[k] = make_char4((signed char)a, (signed char)b, (signed char)c, (signed char)d);
    }
}

/* a block row a token, four outputs a thread */
__global__ void scale_out_i32_kernel(float *__restrict__ y, int N, const float *__restrict__ sx,
                                     const float *__restrict__ sw, const float *__restrict__ bias) {
    const int t = blockIdx.y;
    const float st = sx[t];
    int4 *yi = reinterpret_cast<int4 *>(y + (size_t)t * N);
    float4 *yf = reinterpret_cast<float4 *>(y + (size_t)t * N);
    const float4 *w4 = reinterpret_cast<const float4 *>(sw);
    const float4 *b4 = reinterpret_cast<const float4 *>(bias);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (N >> 2); i += gridDim.x * blockDim.x) {
        const int4 a = yi[i];
        const float4 w = w4[i];
        float4 v = make_float4((float)a.x * st * w.x, (float)a.y * st * w.y, (float)a.z * st * w.z,
                               (float)a.w * st * w.w);
        if (bias) {
            const float4 b = b4[i];
            v.x += b.x;
            v.y += b.y;
            v.z += b.z;
            v.w += b.w;
        }
        yf[i] = v;
    }
}

extern "C" cudaError_t tbc_quant_x_i8(const float *x, int T, int K, void *q, float *sx, cudaStream_t s) {
    if (T < 1 || K < 4 || K % 4 || ((uintptr_t)x & 15) || ((uintptr_t)q & 3)) return cudaErrorInvalidValue;
    quant_x_i8_kernel<<<T, 256, 0, s>>>(x, K, static_cast<signed char *>(q), sx);
    return cudaGetLastError();
}

extern "C" cudaError_t tbc_scale_out_i32(float *y, int T, int N, const float *sx, const float *sw, const float *bias,
                                         cudaStream_t s) {
    if (T < 1 || N < 1 || N % 4 || T > 65535 || ((uintptr_t)y | (uintptr_t)sw | (uintptr_t)bias) & 15)
        return cudaErrorInvalidValue;
    unsigned bx = (unsigned)((N / 4 + 255) / 256);
    scale_out_i32_kernel<<<dim3(bx, (unsigned)T), 256, 0, s>>>(y, N, sx, sw, bias);
    return cudaGetLastError();
}
