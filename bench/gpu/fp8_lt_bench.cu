/* fp8_lt_bench.cu — cuBLASLt's e4m3 x e4m3 -> f32 matmul (TN, as the CUDA
 * backend's fp8 GEMM calls it) at a 7B Llama layer's shapes: every algorithm
 * of the heuristic's first --algos candidates timed against the first one,
 * the one the backend takes today. --dtype f16 / bf16: the same for f16 /
 * bf16 weights and x (f32 out), with cublasGemmEx's default algorithm (the
 * backend's call for f16 / bf16 steps past the GEMV) timed first as row -1,
 * the ratios against it.
 *
 *   fp8_lt_bench [--t 16,64,256,512] [--shapes NxK,...] [--algos 16] [--reps 5] [--dtype e4m3|f16|bf16]
 *
 * Each (shape, candidate) is timed as a CUDA graph of L launches cycling over
 * enough weight copies to fill 512 MiB (so the weights come from device
 * memory, not L2); the best of --reps replays counts. Printed: microseconds a
 * matmul, the weight bytes' rate, and the candidate's ratio to candidate 0.
 * Built with the CUDA backend (target fp8_lt_bench), packed by pack.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CK(x)                                                                                                   \
    do {                                                                                                        \
        cudaError_t e_ = (x);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                \
            fprintf(stderr, "fp8_lt_bench: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);          \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)

/* e4m3 codes of magnitude 1/8..2 with random signs and mantissas */
__global__ void fill_e4m3(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = (unsigned)i * 2654435761u ^ seed;
        v ^= v >> 13;
        v *= 0x5bd1e995u;
        v ^= v >> 15;
        unsigned e = 4 + (v >> 8) % 5; /* exponent field 4..8 (bias 7) */
        p[i] = (unsigned char)(((v >> 16) & 1) << 7 | e << 3 | (v & 7));
    }
}

/* f16 / bf16 values in [-1, 1) */
template <typename T>
__global__ void fill_16(T *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = (unsigned)i * 2654435761u ^ seed;
        v ^= v >> 13;
        v *= 0x5bd1e995u;
        v ^= v >> 15;
        p[i] = (T)((float)(v & 0xffff) / 32768.0f - 1.0f);
    }
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

int main(int argc, char **argv) {
    int ts[16] = {16, 64, 256, 512}, nt = 4, reps = 5, max_algos = 16;
    int shapes[16][2] = {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}, {32000, 4096}};
    int ns = 5, dt = 0; /* 0 e4m3, 1 f16, 2 bf16 */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--t")) nt = parse_list(argv[i + 1], ts, 16);
        else if (!strcmp(argv[i], "--dtype")) dt = !strcmp(argv[i + 1], "f16") ? 1 : !strcmp(argv[i + 1], "bf16") ? 2 : 0;
        else if (!strcmp(argv[i], "--algos")) max_algos = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--shapes")) {
            ns = 0;
            for (const char *s = argv[i + 1]; *s && ns < 16;) {
                if (sscanf(s, "%dx%d", &shapes[ns][0], &shapes[ns][1]) == 2) ns++;
                const char *c = strchr(s, ',');
                if (!c) break;
                s = c + 1;
            }
        } else {
            fprintf(stderr, "usage: fp8_lt_bench [--t 16,64] [--shapes NxK,...] [--algos 16] [--reps 5] [--dtype e4m3|f16|bf16]\n");
            return 2;
        }
    }
    if (max_algos < 1) max_algos = 1;
    if (max_algos > 64) max_algos = 64;
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "fp8_lt_bench: cublasLtCreate / cublasCreate failed\n");
        return 1;
    }
    const size_t es = dt ? 2 : 1; /* bytes an element */
    const cudaDataType_t ab = dt == 1 ? CUDA_R_16F : dt == 2 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
    const size_t ws_bytes = (size_t)32 << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cublasSetStream(blas, st);
    cublasSetWorkspace(blas, ws, ws_bytes);
    printf("%-6s %-13s %5s %10s %9s %7s  %s\n", "T", "N x K", "algo", "us", "GB/s", "vs base", "tile/stages/splitK");
    for (int si = 0; si < ns; si++) {
        const int N = shapes[si][0], K = shapes[si][1];
        const size_t wbytes = (size_t)N * K * es;
        int copies = (int)(((size_t)512 << 20) / wbytes);
        if (copies < 2) copies = 2;
        if (copies > 64) copies = 64;
        unsigned char *w, *x;
        float *y;
        CK(cudaMalloc(&w, wbytes * copies));
        int tmax = 0;
        for (int i = 0; i < nt; i++) tmax = ts[i] > tmax ? ts[i] : tmax;
        CK(cudaMalloc(&x, (size_t)tmax * K * es));
        CK(cudaMalloc(&y, (size_t)tmax * N * sizeof(float)));
        if (dt == 1) {
            fill_16<<<1024, 256, 0, st>>>((__half *)w, wbytes * copies / 2, 1234u + si);
            fill_16<<<256, 256, 0, st>>>((__half *)x, (size_t)tmax * K, 77u);
        } else if (dt == 2) {
            fill_16<<<1024, 256, 0, st>>>((__nv_bfloat16 *)w, wbytes * copies / 2, 1234u + si);
            fill_16<<<256, 256, 0, st>>>((__nv_bfloat16 *)x, (size_t)tmax * K, 77u);
        } else {
            fill_e4m3<<<1024, 256, 0, st>>>(w, wbytes * copies, 1234u + si);
            fill_e4m3<<<256, 256, 0, st>>>(x, (size_t)tmax * K, 77u);
        }
        CK(cudaStreamSynchronize(st));
        for (int ti = 0; ti < nt; ti++) {
            const int T = ts[ti];
            cublasLtMatmulDesc_t op;
            cublasLtMatrixLayout_t la, lb, lc;
            cublasLtMatmulPreference_t pref;
            const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
            cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
            cublasLtMatrixLayoutCreate(&la, ab, K, N, K);
            cublasLtMatrixLayoutCreate(&lb, ab, K, T, K);
            cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, T, N);
            cublasLtMatmulPreferenceCreate(&pref);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof ws_bytes);
            cublasLtMatmulHeuristicResult_t h[64];
            int found = 0;
            if (cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, max_algos, h, &found) !=
                    CUBLAS_STATUS_SUCCESS ||
                found < 1) {
                printf("%-6d %6dx%-6d  no algorithm\n", T, N, K);
                found = 0;
            }
            const float one = 1.0f, zero = 0.0f;
            float base = 0;
            for (int a = dt ? -1 : 0; a < found; a++) {
                const int L = copies * 2;
                cudaGraph_t g = NULL;
                cudaGraphExec_t ge = NULL;
                int bad = 0;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int l = 0; l < L && !bad; l++)
                    bad = (a < 0 ? cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one,
                                                w + (size_t)(l % copies) * wbytes, ab, K, x, ab, K, &zero, y, CUDA_R_32F,
                                                N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                                 : cublasLtMatmul(lt, op, &one, w + (size_t)(l % copies) * wbytes, la, x, lb, &zero, y,
                                                  lc, y, lc, &h[a].algo, ws, ws_bytes, st)) != CUBLAS_STATUS_SUCCESS;
                cudaStreamEndCapture(st, &g);
                if (bad || !g || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
                    cudaGetLastError();
                    printf("%-6d %6dx%-6d %5d  failed\n", T, N, K, a);
                    if (g) cudaGraphDestroy(g);
                    continue;
                }
                float best = 1e30f;
                for (int r = 0; r < reps + 1; r++) {
                    CK(cudaEventRecord(e0, st));
                    CK(cudaGraphLaunch(ge, st));
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r > 0 && ms < best) best = ms; /* the first replay warms up */
                }
                cudaGraphExecDestroy(ge);
                cudaGraphDestroy(g);
                const float us = best * 1000.0f / L;
                if (a == (dt ? -1 : 0)) base = us;
                int tile = 0, stages = 0, splitk = 0;
                size_t sz;
                if (a < 0) {
                    printf("%-6d %6dx%-6d %5s %10.2f %9.0f %7.3f  cublasGemmEx default\n", T, N, K, "-1", us,
                           wbytes / (us * 1e3), 1.0);
                    continue;
                }
                cublasLtMatmulAlgoConfigGetAttribute(&h[a].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
                cublasLtMatmulAlgoConfigGetAttribute(&h[a].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                                     sizeof stages, &sz);
                cublasLtMatmulAlgoConfigGetAttribute(&h[a].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                     sizeof splitk, &sz);
                printf("%-6d %6dx%-6d %5d %10.2f %9.0f %7.3f  %d/%d/%d\n", T, N, K, a, us, wbytes / (us * 1e3),
                       base / us, tile, stages, splitk);
            }
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatmulDescDestroy(op);
            fflush(stdout);
        }
        CK(cudaFree(y));
        CK(cudaFree(x));
        CK(cudaFree(w));
    }
    cublasLtDestroy(lt);
    cublasDestroy(blas);
    return 0;
}
