/*
 * flash_test.cu — checks and times tbc_flash_prefill (src/backend/cuda/flash.cu).
 *
 *   flash_test [--quick] [--no-bench] [--no-check] [--only NAME] [--reps N]
 *
 * Correctness: for every case of (H, KV, hd) x n x pos0 x block_size it
 * builds a random paged f16 KV cache (3 sequences' block tables, the tested
 * one in slot 1 with shuffled, non-contiguous blocks; every cache row that is
 * not a key of the sequence, and the table entries past its keys, point at
 * NaN), a random qkv buffer whose run starts at token t0 > 0 with other
 * tokens before and after it, and compares the kernel's output with a
 * double-precision host reference over the same f16-rounded q, k, v:
 * max abs error and max relative error (abs error over the max abs of the
 * reference row (token, head)); a case fails above 2e-2 relative, on any
 * non-finite value, if a row outside the run was touched (out is poisoned
 * first), or if a second launch does not give bit-identical output.
 * Every case runs both kernel variants (warps of 16 and of 32 query rows,
 * tbc_flash_force_rows), whichever the launcher would choose, and again
 * over an fp8 (e4m3) and an int8 cache (core/kv_layout.h blocks: random
 * codes and per-row scales, NaN codes / scales on the rows that are no key
 * of the sequence), the reference over the codes dequantised as the GEMM
 * prefill's gather does (code x scale in f32, rounded to f16), and over a
 * bf16 cache (kv_bf16: q rounded to bf16 in the reference; every other case
 * with values of up to 3e5, past f16's range).
 * --quick: block size 16 only, pos0 in {0, 200}. --no-check: timing only;
 * --only NAME: only the timing cases whose name contains NAME.
 *
 * Timing (cudaEvent; a warm-up of 30 ms, then --reps launches, 50 by default,
 * on the stream and as one CUDA graph, median of 5 replays): the
 * Llama-2-7B (H 32, KV 32, hd 128) and TinyLlama (H 32, KV 4, hd 64) prefill
 * of 512 tokens from position 0, plus longer and chunked runs; microseconds
 * per launch and TFLOP/s of causal FLOPs, 4 hd H sum_rows (pos + 1). The same
 * cases run through the GEMM path it replaces (tbc_attn_gather, cuBLAS
 * S = scale Q K^T, tbc_attn_softmax, cuBLAS O = P V, as cuda_backend.c's
 * attention_gemm_run) for comparison, with the max difference between the
 * two outputs.
 *
 * Last line: "flash_test: PASS" (exit 0) or "flash_test: FAIL" (exit 1).
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/flash_kernels.h"
#include "core/kv_layout.h"

#include <cuda_fp8.h>

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            printf("flash_test: FAIL\n");                                                              \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

#define CB(x)                                                                                          \
    do {                                                                                               \
        cublasStatus_t e_ = (x);                                                                       \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)e_);       \
            printf("flash_test: FAIL\n");                                                              \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

static const float POISON = -7777.25f; /* out rows outside the run keep this */
static const int KV_BF16 = 16;          /* the cases' cache kind: bf16 (beside 0 = f16 and TBC_KVQ_*) */
static const double TOL_REL = 2e-2;

/* ---------------------------------------------------------------- random numbers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rng_uniform() { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; } /* [-1, 1) */
static int rng_int(int n) { return (int)(rng_u64() % (uint64_t)n); }

static float round16(float x) { return __half2float(__float2half_rn(x)); }
static float roundbf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
/* a bf16 value's bits in the f16-typed cache arrays */
static __half bf_bits(float x) { return __ushort_as_half(__bfloat16_as_ushort(__float2bfloat16_rn(x))); }

/* ---------------------------------------------------------------- one problem */

struct Problem {
    int H, KV, hd, n, pos0, bs, t0, T, slot, n_seqs, max_blocks, n_phys, L;
    float q_amp;
    std::vector<float> qkv;      /* (T, (H + 2 KV) hd) */
    std::vector<int32_t> pos;    /* (T) */
    std::vector<int32_t> bt;     /* (n_seqs, max_blocks) */
    int kvq = 0;                 /* TBC_KVQ_*: the cache's codes */
    bool bf = false;             /* a bf16 cache (kc, vc hold bf16 bits) */
    std::vector<__half> kc, vc;  /* (n_phys, bs, KV, hd) */
    std::vector<uint8_t> kq, vq; /* kvq: (n_phys) blocks of codes and scales */
    std::vector<float> kref, vref; /* (L, KV, hd): the sequence's keys, as stored */
    /* device */
    float *d_qkv = nullptr, *d_out = nullptr;
    int32_t *d_pos = nullptr, *d_bt = nullptr, *d_seq = nullptr;
    void *d_kc = nullptr, *d_vc = nullptr;
    tbc_attn_args args;
};

/* A random code of the cache type (no NaN) and its value. */
static uint8_t rand_code(int kvq) {
    for (;;) {
        const uint8_t c = (uint8_t)rng_int(256);
        if (kvq == TBC_KVQ_I8 ? c != 0x80 : (c & 0x7f) != 0x7f) return c;
    }
}
static float code_value(uint8_t c, int kvq) {
    if (kvq == TBC_KVQ_I8) return (float)(int8_t)c;
    __nv_fp8_e4m3 f;
    f.__x = c;
    return (float)f;
}

/* kind: 0 (f16 cache), TBC_KVQ_FP8 / _I8 (codes), KV_BF16 (bf16 cache, values
 * scaled by v_amp) */
static void problem_build(Problem &p, int H, int KV, int hd, int n, int pos0, int bs, int t0, int after, float q_amp,
                          int kind = 0, float v_amp = 1.0f) {
    const int kvq = kind == KV_BF16 ? 0 : kind;
    p.H = H; p.KV = KV; p.hd = hd; p.n = n; p.pos0 = pos0; p.bs = bs; p.t0 = t0; p.kvq = kvq;
    p.bf = kind == KV_BF16;
    p.T = t0 + n + after;
    p.q_amp = q_amp;
    p.L = pos0 + n;
    const int nb = (p.L + bs - 1) / bs;
    p.n_seqs = 3;
    p.slot = 1;
    p.max_blocks = nb + 2;
    p.n_phys = nb + nb / 2 + 4; /* the last one is the NaN block */
    const int row = (H + 2 * KV) * hd;
    const size_t blk_elems = (size_t)bs * KV * hd;

    p.qkv.resize((size_t)p.T * row);
    for (int t = 0; t < p.T; t++)
        for (int e = 0; e < row; e++)
            p.qkv[(size_t)t * row + e] = rng_uniform() * (e < H * hd ? q_amp : 1.0f);
    p.pos.resize(p.T);
    for (int t = 0; t < p.T; t++) p.pos[t] = (t >= t0 && t < t0 + n) ? pos0 + (t - t0) : rng_int(1000);

    /* shuffled physical blocks (the NaN block last, never handed out) */
    std::vector<int> perm(p.n_phys - 1);
    for (int i = 0; i < p.n_phys - 1; i++) perm[i] = i;
    for (int i = p.n_phys - 2; i > 0; i--) std::swap(perm[i], perm[rng_int(i + 1)]);
    const int nan_blk = p.n_phys - 1;
    p.bt.assign((size_t)p.n_seqs * p.max_blocks, nan_blk);
    for (int b = 0; b < nb; b++) p.bt[(size_t)p.slot * p.max_blocks + b] = perm[b];
    /* other sequences' rows: the rest of the blocks */
    for (int s = 0; s < p.n_seqs; s++) {
        if (s == p.slot) continue;
        for (int b = 0; b < p.max_blocks; b++) p.bt[(size_t)s * p.max_blocks + b] = perm[(nb + b) % (p.n_phys - 1)];
    }

    /* everything NaN, then the sequence's keys random */
    const __half hnan = __ushort_as_half((unsigned short)(p.bf ? 0x7fc0 : 0x7e00)); /* a NaN of the cache type */
    p.kc.assign((size_t)p.n_phys * blk_elems, hnan);
    p.vc.assign((size_t)p.n_phys * blk_elems, hnan);
    p.kref.resize((size_t)p.L * KV * hd);
    p.vref.resize((size_t)p.L * KV * hd);
    const tb_dtype qdt = kvq == TBC_KVQ_I8 ? TB_I8 : TB_FP8_E4M3;
    const size_t qbb = kvq ? tb_kv_block_bytes(qdt, bs, KV, hd) : 0, qso = kvq ? tb_kv_codes_bytes(qdt, bs, KV, hd) : 0;
    if (kvq) { /* NaN codes (e4m3) and NaN scales everywhere, then the keys */
        p.kq.assign((size_t)p.n_phys * qbb, 0x7f); /* e4m3 NaN; int8 127 (its scale NaN) */
        for (int b = 0; b < p.n_phys; b++)
            for (int r = 0; r < bs * KV; r++) {
                const float nanf_ = NAN;
                memcpy(&p.kq[(size_t)b * qbb + qso + 4 * (size_t)r], &nanf_, 4);
            }
        p.vq = p.kq;
        for (int j = 0; j < p.L; j++)
            for (int h = 0; h < KV; h++) {
                const size_t blk = (size_t)perm[j / bs] * qbb, r = (size_t)(j % bs) * KV + h;
                for (int c = 0; c < 2; c++) {
                    std::vector<uint8_t> &buf = c ? p.vq : p.kq;
                    std::vector<float> &ref = c ? p.vref : p.kref;
                    const float sc = 0.002f + 0.01f * (rng_uniform() + 1.0f);
                    memcpy(&buf[blk + qso + 4 * r], &sc, 4);
                    for (int d = 0; d < hd; d++) {
                        const uint8_t code = rand_code(kvq);
                        buf[blk + r * hd + d] = code;
                        ref[((size_t)j * KV + h) * hd + d] = round16(code_value(code, kvq) * sc);
                    }
                }
            }
    }
    for (int j = 0; j < p.L && !kvq; j++) {
        const size_t base = ((size_t)perm[j / bs] * bs + j % bs) * KV * hd;
        for (int e = 0; e < KV * hd; e++) {
            if (p.bf) {
                const float k = roundbf(rng_uniform()), v = roundbf(rng_uniform() * v_amp);
                p.kc[base + e] = bf_bits(k);
                p.vc[base + e] = bf_bits(v);
                p.kref[(size_t)j * KV * hd + e] = k;
                p.vref[(size_t)j * KV * hd + e] = v;
                continue;
            }
            __half k = __float2half_rn(rng_uniform()), v = __float2half_rn(rng_uniform());
            p.kc[base + e] = k;
            p.vc[base + e] = v;
            p.kref[(size_t)j * KV * hd + e] = __half2float(k);
            p.vref[(size_t)j * KV * hd + e] = __half2float(v);
        }
    }

    CK(cudaMalloc(&p.d_qkv, p.qkv.size() * sizeof(float)));
    CK(cudaMalloc(&p.d_out, (size_t)p.T * H * hd * sizeof(float)));
    CK(cudaMalloc(&p.d_pos, p.T * sizeof(int32_t)));
    CK(cudaMalloc(&p.d_seq, p.T * sizeof(int32_t)));
    CK(cudaMalloc(&p.d_bt, p.bt.size() * sizeof(int32_t)));
    if (kvq) {
        p.kc.clear();
        p.vc.clear();
        CK(cudaMalloc(&p.d_kc, p.kq.size()));
        CK(cudaMalloc(&p.d_vc, p.vq.size()));
        CK(cudaMemcpy(p.d_kc, p.kq.data(), p.kq.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(p.d_vc, p.vq.data(), p.vq.size(), cudaMemcpyHostToDevice));
    } else {
        CK(cudaMalloc(&p.d_kc, p.kc.size() * sizeof(__half)));
        CK(cudaMalloc(&p.d_vc, p.vc.size() * sizeof(__half)));
    }
    CK(cudaMemcpy(p.d_qkv, p.qkv.data(), p.qkv.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_pos, p.pos.data(), p.T * sizeof(int32_t), cudaMemcpyHostToDevice));
    std::vector<int32_t> seq(p.T);
    for (int t = 0; t < p.T; t++) seq[t] = (t >= t0 && t < t0 + n) ? p.slot : (t % 2 ? 0 : 2);
    CK(cudaMemcpy(p.d_seq, seq.data(), p.T * sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_bt, p.bt.data(), p.bt.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    if (!kvq) {
        CK(cudaMemcpy(p.d_kc, p.kc.data(), p.kc.size() * sizeof(__half), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(p.d_vc, p.vc.data(), p.vc.size() * sizeof(__half), cudaMemcpyHostToDevice));
    }

    tbc_attn_args &a = p.args;
    memset(&a, 0, sizeof a);
    a.T = p.T;
    a.n_heads = H;
    a.n_kv = KV;
    a.hd = hd;
    a.scale = 1.0f / sqrtf((float)hd);
    a.pos = p.d_pos;
    a.seq = p.d_seq;
    a.block_tables = p.d_bt;
    a.max_blocks = p.max_blocks;
    a.block_size = bs;
    a.k_cache = p.d_kc;
    a.v_cache = p.d_vc;
    a.kv_f16 = !kvq && !p.bf;
    a.kv_bf16 = p.bf;
    a.kv_q = kvq;
    a.kv_block_bytes = qbb;
    a.kv_scale_off = qso;
    a.n_splits = 1;
    a.rope_done = 1;
}

static void problem_free(Problem &p) {
    cudaFree(p.d_qkv); cudaFree(p.d_out); cudaFree(p.d_pos); cudaFree(p.d_seq);
    cudaFree(p.d_bt); cudaFree(p.d_kc); cudaFree(p.d_vc);
}

static void poison_out(Problem &p) {
    std::vector<float> o((size_t)p.T * p.H * p.hd, POISON);
    CK(cudaMemcpy(p.d_out, o.data(), o.size() * sizeof(float), cudaMemcpyHostToDevice));
}

/* Reference rows (n, H, hd) in double, from f16-rounded q (bf16-rounded over
 * a bf16 cache) and the stored k, v. */
static void reference(const Problem &p, std::vector<double> &ref) {
    const int H = p.H, KV = p.KV, hd = p.hd, G = H / KV, row = (H + 2 * KV) * hd;
    const double scale = (double)(1.0f / sqrtf((float)hd));
    ref.assign((size_t)p.n * H * hd, 0.0);
    auto work = [&](int w, int nw) {
        std::vector<double> q(hd), s, acc(hd);
        for (int job = w; job < p.n * H; job += nw) {
            const int i = job / H, h = job % H, kvh = h / G, t = p.t0 + i;
            for (int d = 0; d < hd; d++) {
                const float x = p.qkv[(size_t)t * row + h * hd + d];
                q[d] = p.bf ? roundbf(x) : round16(x);
            }
            const int len = p.pos[t] + 1;
            s.resize(len);
            double m = -INFINITY;
            for (int j = 0; j < len; j++) {
                const float *k = &p.kref[((size_t)j * KV + kvh) * hd];
                double dot = 0.0;
                for (int d = 0; d < hd; d++) dot += q[d] * (double)k[d];
                s[j] = dot * scale;
                m = std::max(m, s[j]);
            }
            double sum = 0.0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = 0; j < len; j++) {
                const double e = exp(s[j] - m);
                sum += e;
                const float *v = &p.vref[((size_t)j * KV + kvh) * hd];
                for (int d = 0; d < hd; d++) acc[d] += e * (double)v[d];
            }
            double *r = &ref[((size_t)i * H + h) * hd];
            for (int d = 0; d < hd; d++) r[d] = acc[d] / sum;
        }
    };
    int nw = (int)std::thread::hardware_concurrency();
    if (nw < 1) nw = 1;
    if (nw > 64) nw = 64;
    std::vector<std::thread> th;
    for (int w = 0; w < nw; w++) th.emplace_back(work, w, nw);
    for (auto &x : th) x.join();
}

struct Errs {
    double max_abs = 0, max_rel = 0;
    long bad_nonfinite = 0, bad_untouched = 0;
    int worst_i = -1, worst_h = -1;
};

/* out (T, H hd) from the device against ref (rows of the run) and POISON elsewhere */
static Errs compare(const Problem &p, const std::vector<float> &out, const std::vector<double> &ref) {
    Errs e;
    const int H = p.H, hd = p.hd;
    for (int t = 0; t < p.T; t++) {
        const float *o = &out[(size_t)t * H * hd];
        if (t < p.t0 || t >= p.t0 + p.n) {
            for (int x = 0; x < H * hd; x++)
                if (memcmp(&o[x], &POISON, sizeof(float)) != 0) e.bad_untouched++;
            continue;
        }
        const int i = t - p.t0;
        for (int h = 0; h < H; h++) {
            const double *r = &ref[((size_t)i * H + h) * hd];
            double ra = 0, ea = 0;
            for (int d = 0; d < hd; d++) {
                const float v = o[h * hd + d];
                if (!std::isfinite(v)) {
                    e.bad_nonfinite++;
                    continue;
                }
                ra = std::max(ra, fabs(r[d]));
                ea = std::max(ea, fabs((double)v - r[d]));
            }
            const double rel = ea / std::max(ra, 1e-30);
            e.max_abs = std::max(e.max_abs, ea);
            if (rel > e.max_rel) {
                e.max_rel = rel;
                e.worst_i = i;
                e.worst_h = h;
            }
        }
    }
    return e;
}

/* ---------------------------------------------------------------- the GEMM path (for timing) */

struct GemmPath {
    cublasHandle_t blas = nullptr;
    void *qx = nullptr, *kx = nullptr, *vx = nullptr, *P = nullptr;
    float *S = nullptr;
    int ld = 0, nq = 0, L = 0;
};

static const size_t PREFILL_S_BYTES = (size_t)64 << 20; /* as cuda_backend.c */

static void gemm_setup(GemmPath &g, const Problem &p, cudaStream_t s) {
    const int H = p.H, hd = p.hd;
    g.L = p.pos0 + p.n;
    g.ld = (g.L + 255) / 256 * 256;
    g.nq = (int)(PREFILL_S_BYTES / ((size_t)H * g.L * sizeof(float)));
    g.nq = std::max(1, std::min(g.nq, p.n));
    CB(cublasCreate(&g.blas));
    CB(cublasSetStream(g.blas, s));
    CK(cudaMalloc(&g.qx, (size_t)p.n * H * hd * 2));
    CK(cudaMalloc(&g.kx, (size_t)H * g.ld * hd * 2));
    CK(cudaMalloc(&g.vx, (size_t)H * g.ld * hd * 2));
    CK(cudaMalloc(&g.S, (size_t)H * g.nq * g.L * sizeof(float)));
    CK(cudaMalloc(&g.P, (size_t)H * g.nq * g.L * 2));
}

static void gemm_free(GemmPath &g) {
    cublasDestroy(g.blas);
    cudaFree(g.qx); cudaFree(g.kx); cudaFree(g.vx); cudaFree(g.S); cudaFree(g.P);
}

static void gemm_run(GemmPath &g, const Problem &p, cudaStream_t s) {
    const int H = p.H, hd = p.hd, n = p.n;
    const tbc_attn_args *a = &p.args;
    CK(tbc_attn_gather(a, p.d_qkv, p.slot, p.t0, n, g.L, g.ld, g.qx, g.kx, g.vx, s));
    const float one = 1.0f, zero = 0.0f, scale = a->scale;
    for (int i0 = 0; i0 < n; i0 += g.nq) {
        const int ni = std::min(g.nq, n - i0), Lc = p.pos0 + i0 + ni; /* pos of the pass's last row + 1 */
        const char *q = (const char *)g.qx + (size_t)i0 * H * hd * 2;
        CB(cublasGemmStridedBatchedEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, Lc, ni, hd, &scale, g.kx, CUDA_R_16F, hd,
                                      (long long)g.ld * hd, q, CUDA_R_16F, H * hd, hd, &zero, g.S, CUDA_R_32F, Lc,
                                      (long long)ni * Lc, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CK(tbc_attn_softmax(g.S, g.P, 1, a->pos + p.t0 + i0, H, ni, Lc, s));
        CB(cublasGemmStridedBatchedEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, ni, Lc, &one, g.vx, CUDA_R_16F, hd,
                                      (long long)g.ld * hd, g.P, CUDA_R_16F, Lc, (long long)ni * Lc, &zero,
                                      p.d_out + (size_t)(p.t0 + i0) * H * hd, CUDA_R_32F, H * hd, hd, H,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

/* ---------------------------------------------------------------- timing */

/* Microseconds per fn() over reps calls on stream s, after a warm-up of at
 * least 30 ms of the same work (clocks up, caches warm). */
template <typename F>
static double time_stream(F fn, int reps, cudaStream_t s) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int round = 0; round < 100 && ms < 30.0f; round++) {
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < reps; i++) fn();
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float r = 0;
        CK(cudaEventElapsedTime(&r, e0, e1));
        ms += r;
    }
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; i++) fn();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms * 1e3 / reps;
}

/* The same with the reps calls captured in one CUDA graph (no host launch
 * cost between them); the median of 5 replays. */
template <typename F>
static double time_graph(F fn, int reps, cudaStream_t s) {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; i++) fn();
    CK(cudaStreamEndCapture(s, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int round = 0; round < 200 && ms < 30.0f; round++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float r = 0;
        CK(cudaEventElapsedTime(&r, e0, e1));
        ms += r;
    }
    float t[5];
    for (int k = 0; k < 5; k++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[k], e0, e1));
    }
    std::sort(t, t + 5);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    return t[2] * 1e3 / reps;
}

/* ---------------------------------------------------------------- main */

static double causal_flops(const Problem &p) {
    double rows = 0;
    for (int i = 0; i < p.n; i++) rows += (double)(p.pos0 + i + 1);
    return 4.0 * p.hd * p.H * rows;
}

int main(int argc, char **argv) {
    bool quick = false, bench = true, check = true;
    const char *only = nullptr;
    int reps = 50;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--no-bench")) bench = false;
        else if (!strcmp(argv[i], "--no-check")) check = false;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, atoi(argv[++i]));
        else {
            fprintf(stderr, "usage: flash_test [--quick] [--no-bench] [--no-check] [--only NAME] [--reps N]\n");
            return 2;
        }
    }
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("flash_test: device %d: %s, cc %d.%d, %d SMs\n", dev, prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));

    bool ok = true;
    /* ---- unsupported arguments are refused */
    {
        tbc_attn_args a;
        memset(&a, 0, sizeof a);
        a.n_heads = 4; a.n_kv = 4; a.hd = 96; a.kv_f16 = 1; a.block_size = 16;
        const bool refuse = tbc_flash_supports(96, 1, 0, 0) == 0 && tbc_flash_supports(128, 0, 0, 0) == 0 &&
                            tbc_flash_supports(64, 1, 0, 0) == 1 && tbc_flash_supports(128, 1, 0, 0) == 1 &&
                            tbc_flash_supports(128, 0, 0, TBC_KVQ_FP8) == 1 &&
                            tbc_flash_supports(64, 0, 0, TBC_KVQ_I8) == 1 && tbc_flash_supports(96, 0, 0, TBC_KVQ_FP8) == 0 &&
                            tbc_flash_supports(128, 0, 1, 0) == 1 && tbc_flash_supports(64, 0, 1, 0) == 1 &&
                            tbc_flash_supports(96, 0, 1, 0) == 0 && tbc_flash_supports(128, 1, 1, 0) == 0 &&
                            tbc_flash_supports(128, 0, 1, TBC_KVQ_FP8) == 0 &&
                            tbc_flash_prefill(&a, nullptr, nullptr, 0, 0, 1, s) == cudaErrorInvalidValue;
        cudaGetLastError();
        printf("supports / refusals: %s\n", refuse ? "ok" : "WRONG");
        ok = ok && refuse;
    }

    /* ---- correctness */
    struct Shape { int H, KV, hd; };
    const Shape shapes[] = {{32, 32, 128}, {32, 4, 64}, {8, 2, 64}, {4, 4, 128}};
    const int ns[] = {1, 17, 64, 100, 512};
    std::vector<int> pos0s = quick ? std::vector<int>{0, 200} : std::vector<int>{0, 37, 200};
    std::vector<int> bss = quick ? std::vector<int>{16} : std::vector<int>{16, 32};
    printf("%-14s %5s %5s %3s %3s %4s %11s %11s  %s\n", "H/KV/hd", "n", "pos0", "bs", "t0", "rows", "max_abs",
           "max_rel", "result");
    int n_cases = 0, n_fail = 0;
    double worst_rel = 0;
    const int n_shapes = check ? (int)(sizeof shapes / sizeof shapes[0]) : 0;
    for (int kind : {0, (int)TBC_KVQ_FP8, (int)TBC_KVQ_I8, KV_BF16})
    for (int si = 0; si < n_shapes; si++)
        for (int n : ns)
            for (int pos0 : pos0s)
                for (int bs : bss) {
                    const Shape &sh = shapes[si];
                    Problem p;
                    const int t0 = 1 + rng_int(5), after = rng_int(3);
                    const float amp = (n_cases % 3 == 2) ? 8.0f : 2.0f; /* some peaked softmaxes */
                    const float v_amp = kind == KV_BF16 && n_cases % 4 >= 2 ? 3.0e5f : 1.0f; /* past f16's range */
                    problem_build(p, sh.H, sh.KV, sh.hd, n, pos0, bs, t0, after, amp, kind, v_amp);
                    std::vector<double> ref;
                    reference(p, ref);
                    char tag[32];
                    snprintf(tag, sizeof tag, "%d/%d/%d%s", sh.H, sh.KV, sh.hd,
                             kind == TBC_KVQ_FP8 ? " fp8" : kind == TBC_KVQ_I8 ? " i8"
                             : kind == KV_BF16 ? (v_amp > 1.0f ? " bf16 3e5" : " bf16") : "");
                    /* both kernel variants: warps of 16 and of 32 query rows */
                    for (int rows : {16, 32}) {
                        tbc_flash_force_rows(rows);
                        std::vector<float> out((size_t)p.T * p.H * p.hd), out2(out.size());
                        poison_out(p);
                        CK(tbc_flash_prefill(&p.args, p.d_qkv, p.d_out, p.slot, p.t0, p.n, s));
                        CK(cudaStreamSynchronize(s));
                        CK(cudaMemcpy(out.data(), p.d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
                        /* a second launch must give the same bits */
                        poison_out(p);
                        CK(tbc_flash_prefill(&p.args, p.d_qkv, p.d_out, p.slot, p.t0, p.n, s));
                        CK(cudaStreamSynchronize(s));
                        CK(cudaMemcpy(out2.data(), p.d_out, out2.size() * sizeof(float), cudaMemcpyDeviceToHost));
                        const bool same = memcmp(out.data(), out2.data(), out.size() * sizeof(float)) == 0;
                        Errs e = compare(p, out, ref);
                        const bool pass =
                            same && e.bad_nonfinite == 0 && e.bad_untouched == 0 && e.max_rel <= TOL_REL;
                        printf("%-14s %5d %5d %3d %3d %4d %11.3e %11.3e  %s", tag, n, pos0, bs, t0, rows, e.max_abs,
                               e.max_rel, pass ? "ok" : "FAIL");
                        if (!pass)
                            printf(" (nonfinite %ld, touched outside run %ld, repeatable %s, worst row i=%d h=%d)",
                                   e.bad_nonfinite, e.bad_untouched, same ? "yes" : "NO", e.worst_i, e.worst_h);
                        printf("\n");
                        fflush(stdout);
                        n_cases++;
                        if (!pass) n_fail++;
                        worst_rel = std::max(worst_rel, e.max_rel);
                    }
                    tbc_flash_force_rows(0);
                    problem_free(p);
                }
    printf("correctness: %d cases, %d failed, worst relative error %.3e (tolerance %.0e)\n", n_cases, n_fail,
           worst_rel, TOL_REL);
    if (n_fail) ok = false;

    /* ---- timing */
    if (bench) {
        struct Bench { const char *name; int H, KV, hd, n, pos0; bool main; int kvq; };
        const Bench benches[] = {
            {"7B n=512 pos0=0", 32, 32, 128, 512, 0, true},
            {"TinyLlama n=512 pos0=0", 32, 4, 64, 512, 0, true},
            {"7B n=2048 pos0=0", 32, 32, 128, 2048, 0, false},
            {"7B n=512 pos0=1536", 32, 32, 128, 512, 1536, false},
            {"TinyLlama n=2048 pos0=0", 32, 4, 64, 2048, 0, false},
            {"TinyLlama n=512 pos0=1536", 32, 4, 64, 512, 1536, false},
            {"7B n=128 pos0=0", 32, 32, 128, 128, 0, false},
            {"7B n=512 pos0=0 fp8", 32, 32, 128, 512, 0, false, TBC_KVQ_FP8},
            {"7B n=128 pos0=0 fp8", 32, 32, 128, 128, 0, false, TBC_KVQ_FP8},
        };
        printf("\ntiming, block size 16, microseconds per call, TFLOP/s of causal FLOPs:\n"
               "  flash    tbc_flash_prefill as chosen per launch, in a graph of %d launches (median of 5)\n"
               "  rows16, rows32   the same with warps of 16 / 32 query rows forced\n"
               "  heavy1st the same with the blocks in heaviest-first order (tbc_flash_pair_order(0))\n"
               "  stream   as flash, %d launches straight on a stream (host launch cost included)\n"
               "  gemm     the GEMM path it replaces (gather, cuBLAS, softmax, cuBLAS), graph\n",
               reps, reps);
        printf("%-26s %8s %8s %8s %8s %8s %8s %8s %8s %8s %9s\n", "case", "flash", "TFLOP/s", "rows16", "rows32",
               "heavy1st", "stream", "gemm", "TFLOP/s", "speedup", "max|diff|");
        for (const Bench &b : benches) {
            if (only && !strstr(b.name, only)) continue;
            Problem p;
            problem_build(p, b.H, b.KV, b.hd, b.n, b.pos0, 16, 0, 0, 2.0f, b.kvq);
            const double fl = causal_flops(p);
            /* flash: plain launches on the stream, then a graph of `reps` launches */
            auto flash = [&]() { CK(tbc_flash_prefill(&p.args, p.d_qkv, p.d_out, p.slot, p.t0, p.n, s)); };
            tbc_flash_force_rows(16);
            const double us_16 = time_graph(flash, reps, s);
            tbc_flash_force_rows(32);
            const double us_32 = time_graph(flash, reps, s);
            tbc_flash_force_rows(0);
            tbc_flash_pair_order(0);
            const double us_heavy = time_graph(flash, reps, s);
            tbc_flash_pair_order(1);
            const double us_s = time_stream(flash, reps, s);
            const double us_f = time_graph(flash, reps, s);
            std::vector<float> of((size_t)p.T * p.H * p.hd), og(of.size());
            CK(cudaMemcpy(of.data(), p.d_out, of.size() * sizeof(float), cudaMemcpyDeviceToHost));
            /* GEMM path */
            GemmPath g;
            gemm_setup(g, p, s);
            const double us_g = time_graph([&]() { gemm_run(g, p, s); }, reps, s);
            CK(cudaMemcpy(og.data(), p.d_out, og.size() * sizeof(float), cudaMemcpyDeviceToHost));
            double diff = 0;
            for (size_t i = 0; i < of.size(); i++) diff = std::max(diff, (double)fabsf(of[i] - og[i]));
            if (!(diff < 1e-2)) {
                printf("  (flash and GEMM paths differ by %.3e)\n", diff);
                ok = false;
            }
            printf("%-26s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %7.2fx %9.2e%s\n", b.name, us_f,
                   fl / (us_f * 1e-6) / 1e12, us_16, us_32, us_heavy, us_s, us_g, fl / (us_g * 1e-6) / 1e12,
                   us_g / us_f, diff, b.main ? "" : "  (extra)");
            fflush(stdout);
            gemm_free(g);
            problem_free(p);
        }
    }
    CK(cudaStreamDestroy(s));
    printf("flash_test: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
