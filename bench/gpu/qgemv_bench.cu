/* qgemv_bench.cu — the decode matmuls of src/backend/cuda/gemv.cu on their own,
 * at the shapes of a 7B Llama layer, as achieved read bandwidth against the
 * read bandwidth of a plain streaming kernel measured in the same run.
 *
 *   qgemv_bench [--t 1,8] [--kinds f16,int8,fp8,int4] [--u 2] [--variant -1,0,1,2,3]
 *               [--shapes NxK,...] [--reps 5]
 *
 * Each case captures one CUDA graph of L launches (programmatic dependent
 * launch on, as in the engine) that cycle over enough copies of the weights
 * to fill 512 MiB, so every launch reads its matrix from device memory and
 * not from L2; the best of --reps replays counts. Bytes per launch are the
 * codes plus the scales (and zeros) plus x; the figure is bytes / time.
 * --gemm 1,4,... times the mixed-input GEMM (qgemm.cu) instead, with
 * tbc_set_qgemm_cfg's block shapes, on f16 x, K splits by its rule or
 * --split 1,2,... (0: the rule); its workspace holds 8 splits;
 * TB_CUDA_QGEMM_CLUSTER=0 adds the splits through it (tbc_set_qgemm_cluster).
 * --variant picks tbc_set_qgemv_variant's kernel (see cuda_kernels.h; 4..9, 12, 13 the
 * pipelined kernels, 15 the one-token Q8 kernel of int8 / int4); TB_CUDA_QGEMV_XW=1 stages x per warp (tbc_set_qgemv_xw).
 * Built with the CUDA backend (target qgemv_bench) and packed by
 * bench/gpu/pack.sh beside the other GPU binaries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/qgemm.h"

#define CK(x)                                                                                                   \
    do {                                                                                                        \
        cudaError_t e_ = (x);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                \
            fprintf(stderr, "qgemv_bench: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);           \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)

__global__ void fill_kernel(unsigned *p, size_t n, unsigned seed, unsigned mask) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = (unsigned)i * 2654435761u ^ seed;
        v ^= v >> 13;
        v *= 0x5bd1e995u;
        v ^= v >> 15;
        p[i] = v & mask;
    }
}

__global__ void fillf_kernel(float *p, size_t n, float lo, float hi, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = (unsigned)i * 2654435761u ^ seed;
        v ^= v >> 13;
        v *= 0x5bd1e995u;
        v ^= v >> 15;
        p[i] = lo + (hi - lo) * (float)(v >> 8) / 16777216.0f;
    }
}

/* The roofline: every thread streams 16-byte loads with four in flight. */
__global__ void read_kernel(const uint4 *__restrict__ p, size_t n, unsigned *out) {
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
        acc ^= a.x ^ a.w ^ b.y ^ b.z ^ c.x ^ c.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) acc ^= __ldg(p + i).x;
    if (acc == 0x12345678u) *out = acc;
}

static void fill(void *p, size_t bytes, unsigned seed, unsigned mask) {
    fill_kernel<<<1024, 256>>>((unsigned *)p, bytes / 4, seed, mask);
    CK(cudaGetLastError());
}
static void fillf(float *p, size_t n, float lo, float hi, unsigned seed) {
    fillf_kernel<<<1024, 256>>>(p, n, lo, hi, seed);
    CK(cudaGetLastError());
}

static double time_graph(cudaGraphExec_t ge, cudaStream_t s, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(ge, s)); /* warm up */
    CK(cudaStreamSynchronize(s));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

static double read_bw(cudaStream_t s, int reps) {
    size_t bytes = (size_t)2 << 30;
    void *p;
    unsigned *o;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMalloc(&o, 4));
    fill(p, bytes, 7, 0xffffffffu);
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    read_kernel<<<sms * 8, 256, 0, s>>>((const uint4 *)p, bytes / 16, o);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    double ms = time_graph(ge, s, reps);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(p);
    cudaFree(o);
    return bytes / (ms * 1e-3) / 1e9;
}

enum { K_F16 = 0, K_I8, K_FP8, K_I4 };
static const char *kind_name[] = {"f16", "int8", "fp8", "int4-g128"};

/* The mixed-input GEMM's f16 x and split workspace (gemm >= 0). */
static const void *g_x16;
static float *g_ws;
static size_t g_ws_bytes;

/* One launch of kind's matmul (N, K) over T tokens of x into y; gemm >= 0:
 * the mixed-input GEMM on g_x16. */
static cudaError_t launch_one(int kind, void *codes, float *scales, int group, const float *x, float *y, int T, int K,
                              int N, int simt, int gemm, cudaStream_t s) {
    if (kind == K_F16) {
        tbc_gemv_opts o = {simt, TBC_SIMT_ROW};
        return tbc_gemv_ex(x, codes, TBC_F16, NULL, y, T, K, N, NULL, &o, s);
    }
    tbc_qweight w = {kind == K_I8 ? TBC_Q_I8 : kind == K_FP8 ? TBC_Q_FP8 : TBC_Q_I4, codes, scales, NULL, group};
    if (gemm >= 0) return tbc_qgemm(g_x16, &w, NULL, y, T, K, N, g_ws, g_ws_bytes, s);
    return tbc_qgemv(x, &w, NULL, y, T, K, N, NULL, s);
}

/* One case: kind at (N, K) with T tokens; returns GB/s (0 when refused). */
static double run_case(int kind, int N, int K, int T, int simt, int gemm, cudaStream_t s, int reps, double *us) {
    size_t code_bytes = kind == K_F16 ? (size_t)N * K * 2 : kind == K_I4 ? (size_t)N * K / 2 : (size_t)N * K;
    int group = kind == K_I4 ? 128 : K;
    size_t n_scales = kind == K_F16 ? 0 : (size_t)N * (K / group);
    size_t per = code_bytes + n_scales * 4;
    int copies = (int)(((size_t)512 << 20) / per) + 1;
    if (copies > 64) copies = 64;
    if (copies < 2) copies = 2;
    void **codes = (void **)calloc(copies, sizeof(void *));
    float **scales = (float **)calloc(copies, sizeof(float *));
    for (int c = 0; c < copies; c++) {
        CK(cudaMalloc(&codes[c], code_bytes));
        /* f16: values in [-1, 1) (exponent bits masked); fp8: codes with the exponent below 0x78 (no NaN) */
        unsigned mask = kind == K_F16 ? 0xbbffbbffu : kind == K_FP8 ? 0xb7ffb7ffu : 0xffffffffu;
        fill(codes[c], code_bytes, 11 + c, mask);
        if (n_scales) {
            CK(cudaMalloc(&scales[c], n_scales * 4));
            fillf(scales[c], n_scales, 1e-3f, 2e-3f, 13 + c);
        }
    }
    float *x, *y;
    CK(cudaMalloc(&x, (size_t)T * K * 4));
    CK(cudaMalloc(&y, (size_t)T * N * 4));
    fillf(x, (size_t)T * K, -1.0f, 1.0f, 5);
    void *x16 = NULL;
    if (gemm >= 0) {
        CK(cudaMalloc(&x16, (size_t)T * K * 2));
        CK(tbc_convert_f32(x, x16, TBC_F16, (size_t)T * K, s));
        g_ws_bytes = (size_t)8 * T * N * sizeof(float);
        CK(cudaMalloc(&g_ws, g_ws_bytes));
        g_x16 = x16;
    }
    CK(cudaDeviceSynchronize());
    int launches = copies < 16 ? 64 : copies * 2;
    /* one launch outside the capture: a kernel's first launch may set its
     * attributes (shared memory size) */
    {
        cudaError_t e0 = launch_one(kind, codes[0], scales[0], group, x, y, T, K, N, simt, gemm, s);
        if (e0 == cudaSuccess) e0 = cudaStreamSynchronize(s);
        if (e0 != cudaSuccess) {
            fprintf(stderr, "qgemv_bench: %s %dx%d T=%d: %s\n", kind_name[kind], N, K, T, cudaGetErrorString(e0));
            cudaGetLastError();
        }
    }
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaError_t err = cudaSuccess;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches && err == cudaSuccess; i++)
        err = launch_one(kind, codes[i % copies], scales[i % copies], group, x, y, T, K, N, simt, gemm, s);
    CK(cudaStreamEndCapture(s, &g));
    double gbs = 0.0;
    if (err == cudaSuccess) {
        CK(cudaGraphInstantiate(&ge, g, 0));
        double ms = time_graph(ge, s, reps);
        size_t bytes = per + (size_t)T * K * (gemm >= 0 ? 2 : 4);
        gbs = (double)bytes * launches / (ms * 1e-3) / 1e9;
        *us = ms * 1e3 / launches;
        cudaGraphExecDestroy(ge);
    } else {
        fprintf(stderr, "qgemv_bench: %s %dx%d T=%d refused: %s\n", kind_name[kind], N, K, T, cudaGetErrorString(err));
        cudaGetLastError();
    }
    cudaGraphDestroy(g);
    for (int c = 0; c < copies; c++) {
        cudaFree(codes[c]);
        if (scales[c]) cudaFree(scales[c]);
    }
    free(codes);
    free(scales);
    cudaFree(x);
    cudaFree(y);
    if (x16) {
        cudaFree(x16);
        cudaFree(g_ws);
        g_ws = NULL;
    }
    return gbs;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (s && *s && n < max) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s) s++;
    }
    return n;
}


int main(int argc, char **argv) {
    const char *ts = "1,8", *kinds = "f16,int8,fp8,int4", *us = "2", *vs = "-1", *shapes = NULL, *gs = NULL,
               *sps = "0";
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--t") && v) ts = v, i++;
        else if (!strcmp(a, "--kinds") && v) kinds = v, i++;
        else if (!strcmp(a, "--u") && v) us = v, i++;
        else if (!strcmp(a, "--variant") && v) vs = v, i++;
        else if (!strcmp(a, "--shapes") && v) shapes = v, i++;
        else if (!strcmp(a, "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(a, "--gemm") && v) gs = v, i++;
        else if (!strcmp(a, "--split") && v) sps = v, i++;
        else {
            fprintf(stderr, "usage: qgemv_bench [--t 1,8] [--kinds f16,int8,fp8,int4] [--u 2] [--variant -1] "
                            "[--shapes NxK,...] [--reps 5] [--gemm 1,4] [--split 0,2]\n");
            return 2;
        }
    }
    int tl[8], ul[8], vl[8], gl[16], spl[8];
    int nt = parse_list(ts, tl, 8), nu = parse_list(us, ul, 8), nv = parse_list(vs, vl, 8);
    int ng = parse_list(gs, gl, 16), nsp = parse_list(sps, spl, 8);
    int sn[16], sk[16], ns = 0;
    if (shapes) {
        for (const char *p = shapes; p && *p && ns < 16;) {
            if (sscanf(p, "%dx%d", &sn[ns], &sk[ns]) == 2) ns++;
            p = strchr(p, ',');
            if (p) p++;
        }
    } else {
        /* a 7B Llama layer: qkv, o, gate|up, down; and the logits */
        const int d[5][2] = {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}, {32000, 4096}};
        for (int i = 0; i < 5; i++) sn[ns] = d[i][0], sk[ns++] = d[i][1];
    }
    tbc_set_pdl(1);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const char *gre = getenv("TB_CUDA_GEMV_ROT"); /* f16 rotated block starts (tbc_set_gemv_rot); */
    tbc_set_gemv_rot(gre && *gre ? atoi(gre) : 3); /* 3 as the engine's default */
    const char *gte = getenv("TB_CUDA_GEMV_TMA"); /* the bulk-copy ring kernel (tbc_set_gemv_tma) */
    tbc_set_gemv_tma(gte && *gte ? atoi(gte) : 25); /* 25 as the engine's default */
    const char *xwe = getenv("TB_CUDA_QGEMV_XW"); /* x staged per warp (see tbc_set_qgemv_xw) */
    tbc_set_qgemv_xw(xwe && *xwe ? atoi(xwe) : -1);
    const char *qcl = getenv("TB_CUDA_QGEMM_CLUSTER"); /* splits added in a cluster (tbc_set_qgemm_cluster) */
    tbc_set_qgemm_cluster(qcl && *qcl ? atoi(qcl) : -1);
    double rb = read_bw(s, reps);
    printf("device %s, %d SMs; streaming read %.0f GB/s\n", prop.name, prop.multiProcessorCount, rb);
    printf("%-10s %-3s %-2s %-2s %-12s %9s %8s %7s\n", "kind", "T", "u", "v", "N x K", "us", "GB/s", "of read");
    for (int ki = 0; ki < 4; ki++) {
        if (!strstr(kinds, ki == K_F16 ? "f16" : ki == K_I8 ? "int8" : ki == K_FP8 ? "fp8" : "int4")) continue;
        for (int ti = 0; ti < nt; ti++)
            for (int vi = 0; vi < (tl[ti] > TBC_GEMV_MAX_T ? 0 : ki == K_F16 ? 1 : nv); vi++)
                for (int ui = 0; ui < (ki == K_F16 ? 1 : nu); ui++) {
                    tbc_set_qgemv_unroll(ul[ui]);
                    tbc_set_qgemv_variant(vl[vi]);
                    double tot_b = 0, tot_us = 0;
                    for (int si = 0; si < ns; si++) {
                        double t_us = 0;
                        double gbs = run_case(ki, sn[si], sk[si], tl[ti], tl[ti] <= 2 ? 2 : 0, -1, s, reps, &t_us);
                        printf("%-10s %-3d %-2d %-2d %5dx%-6d %9.2f %8.0f %6.1f%%\n", kind_name[ki], tl[ti],
                               ki == K_F16 ? 0 : ul[ui], ki == K_F16 ? 0 : vl[vi], sn[si], sk[si], t_us, gbs,
                               100.0 * gbs / rb);
                        tot_b += gbs * t_us;
                        tot_us += t_us;
                    }
                    printf("%-10s %-3d %-2d %-2d %-12s %9.2f %8.0f %6.1f%%  (all shapes)\n", kind_name[ki], tl[ti],
                           ki == K_F16 ? 0 : ul[ui], ki == K_F16 ? 0 : vl[vi], "sum", tot_us, tot_b / tot_us,
                           100.0 * tot_b / tot_us / rb);
                }
    }
    /* the mixed-input GEMM: column v is the block shape, u the forced splits */
    for (int ki = K_I8; ki <= K_I4 && ng; ki++) {
        if (!strstr(kinds, ki == K_I8 ? "int8" : ki == K_FP8 ? "fp8" : "int4")) continue;
        for (int ti = 0; ti < nt; ti++)
            for (int gi = 0; gi < ng; gi++)
                for (int pi = 0; pi < nsp; pi++) {
                    tbc_set_qgemm_cfg(gl[gi]);
                    tbc_set_qgemm_split(spl[pi]);
                    double tot_b = 0, tot_us = 0;
                    for (int si = 0; si < ns; si++) {
                        double t_us = 0;
                        double gbs = run_case(ki, sn[si], sk[si], tl[ti], 0, gl[gi], s, reps, &t_us);
                        printf("gemm-%-5s %-3d %-2d %-2d %5dx%-6d %9.2f %8.0f %6.1f%%\n", kind_name[ki], tl[ti], spl[pi],
                               gl[gi], sn[si], sk[si], t_us, gbs, 100.0 * gbs / rb);
                        tot_b += gbs * t_us;
                        tot_us += t_us;
                    }
                    printf("gemm-%-5s %-3d %-2d %-2d %-12s %9.2f %8.0f %6.1f%%  (all shapes)\n", kind_name[ki], tl[ti],
                           spl[pi], gl[gi], "sum", tot_us, tot_b / tot_us, 100.0 * tot_b / tot_us / rb);
                }
    }
    return 0;
}
