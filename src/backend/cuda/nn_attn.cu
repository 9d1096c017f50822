/* nn_attn.cu — the fused attention of the general ops (sdpa, nn_cuda.h):
 * one block per (32 query rows, batch x head), keys in tiles of 32 through
 * shared memory with an online softmax (the flash-attention recurrence), f32
 * arithmetic whatever the storage type. Each of the 4 warps owns 8 query
 * rows; a lane owns one key of the tile for the scores and the output
 * columns lane, lane + 32, ... for the accumulation. Operands are read
 * through the strides of tbn_sdpa_args (the last dim of q, v, out
 * contiguous), like the tensor-core kernel of nn_mha.cu. */
#include <stdlib.h>

#include "backend/cuda/nn_common.cuh"

#define QT 32 /* query rows per block */
#define KT 32 /* keys per tile        */
#define ROWS 8
#define MAXC 4 /* Dv <= 128           */

__global__ void __launch_bounds__(128) sdpa_kernel(tbn_sdpa_args a, const void *q, const void *k, const void *v,
                                                   void *out) {
    extern __shared__ float sm[];
    const int D = a.D, Dv = a.Dv;
    float *Qs = sm;                   /* [QT][D], scaled          */
    float *Ks = Qs + QT * D;          /* [D][KT + 1]              */
    float *Vs = Ks + D * (KT + 1);    /* [KT][Dv]                 */
    const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H;
    const int64_t q0 = (int64_t)blockIdx.x * QT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* element offsets through the strides (nn_cuda.h): any layout whose last
     * dim of q, v, out is contiguous, k by (key, d) strides */
    const int64_t qoff = b * a.qs[0] + h * a.qs[1], koff = b * a.ks[0] + h * a.ks[1];
    const int64_t voff = b * a.vs[0] + h * a.vs[1], ooff = b * a.os[0] + h * a.os[1];
    for (int i = tid; i < QT * D; i += blockDim.x) {
        int64_t r = q0 + i / D;
        Qs[i] = r < a.S ? tbn_ldf(q, a.dt, qoff + r * a.qs[2] + i % D) * a.scale : 0.0f;
    }
    float m[ROWS], l[ROWS], acc[ROWS][MAXC];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
#pragma unroll
        for (int c = 0; c < MAXC; c++) acc[r][c] = 0;
    }
    int64_t t_end = a.T;
    if (a.causal && q0 + QT < t_end) t_end = q0 + QT; /* keys past the last row are masked */
    for (int64_t t0 = 0; t0 < t_end; t0 += KT) {
        __syncthreads();
        if (a.k_t) {
            for (int i = tid; i < D * KT; i += blockDim.x) {
                int d = i / KT, j = i % KT;
                int64_t t = t0 + j;
                Ks[d * (KT + 1) + j] = t < a.T ? tbn_ldf(k, a.dt, koff + t * a.ks[2] + (int64_t)d * a.ks[3]) : 0.0f;
            }
        } else {
            for (int i = tid; i < D * KT; i += blockDim.x) {
                int j = i / D, d = i % D;
                int64_t t = t0 + j;
                Ks[d * (KT + 1) + j] = t < a.T ? tbn_ldf(k, a.dt, koff + t * a.ks[2] + (int64_t)d * a.ks[3]) : 0.0f;
            }
        }
        for (int i = tid; i < KT * Dv; i += blockDim.x) {
            int64_t t = t0 + i / Dv;
            Vs[i] = t < a.T ? tbn_ldf(v, a.dt, voff + t * a.vs[2] + i % Dv) : 0.0f;
        }
        __syncthreads();
        const int64_t t = t0 + lane;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int rl = warp * ROWS + r;
            const int64_t s = q0 + rl;
            if (s >= a.S) break; /* uniform over the warp */
            float sc = 0;
            const float *qr = Qs + rl * D;
            for (int d = 0; d < D; d++) sc += qr[d] * Ks[d * (KT + 1) + lane];
            bool keep = t < a.T && !(a.causal && t > s);
            if (keep && a.mask_kind) {
                int64_t mo = b * a.ms[0] + h * a.ms[1] + s * a.ms[2] + t * a.ms[3];
                if (a.mask_kind == 1) sc += tbn_ldf(a.mask, a.mdt, mo);
                else keep = ((const uint8_t *)a.mask)[mo] != 0;
            }
            if (!keep) sc = -INFINITY;
            float mt = tbn_warp_max(sc), mn = fmaxf(m[r], mt);
            float p = mn == -INFINITY ? 0.0f : expf(sc - mn);
            float corr = mn == -INFINITY ? 1.0f : expf(m[r] - mn);
            l[r] = l[r] * corr + tbn_warp_sum(p);
            m[r] = mn;
#pragma unroll
            for (int c = 0; c < MAXC; c++) acc[r][c] *= corr;
            for (int j = 0; j < KT; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                const float *vr = Vs + j * Dv;
#pragma unroll
                for (int c = 0; c < MAXC; c++) {
                    int e = lane + 32 * c;
                    if (e < Dv) acc[r][c] += pj * vr[e];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int64_t s = q0 + warp * ROWS + r;
        if (s >= a.S) break;
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int c = 0; c < MAXC; c++) {
            int e = lane + 32 * c;
            if (e < Dv) tbn_stf(out, a.dt, ooff + s * a.os[2] + e, acc[r][c] * inv);
        }
    }
}

extern "C" void tbn_sdpa_strides(tbn_sdpa_args *a) {
    const int64_t H = a->H, S = a->S, T = a->T, D = a->D, Dv = a->Dv;
    a->qs[0] = H * S * D, a->qs[1] = S * D, a->qs[2] = D;
    a->ks[0] = H * T * D, a->ks[1] = T * D;
    if (a->k_t) a->ks[2] = 1, a->ks[3] = T;
    else a->ks[2] = D, a->ks[3] = 1;
    a->vs[0] = H * T * Dv, a->vs[1] = T * Dv, a->vs[2] = Dv;
    a->os[0] = H * S * Dv, a->os[1] = S * Dv, a->os[2] = Dv;
}

extern "C" cudaError_t tbn_sdpa(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out,
                                cudaStream_t s) {
    if (a->B * a->H * a->S <= 0 || a->Dv <= 0) return cudaSuccess;
    cudaError_t me;
    if (tbn_mha_f16(a, q, k, v, out, s, &me)) return me;
    if (a->D > 256 || a->Dv > 32 * MAXC) return cudaErrorInvalidValue;
    size_t smem = sizeof(float) * ((size_t)QT * a->D + (size_t)a->D * (KT + 1) + (size_t)KT * a->Dv);
    static size_t opted = 0;
    if (smem > 48 * 1024 && smem > opted) {
        cudaError_t e = cudaFuncSetAttribute(sdpa_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        opted = smem;
    }
    dim3 grid((unsigned)((a->S + QT - 1) / QT), (unsigned)(a->B * a->H));
    sdpa_kernel<<<grid, 128, smem, s>>>(*a, q, k, v, out);
    return cudaGetLastError();
}
