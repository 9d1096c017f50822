/*
 * cuda_kernels.h — the CUDA kernels behind the CUDA backend, as C launchers.
 *
 * Each launcher enqueues its kernel(s) on `stream` and returns the launch
 * status (cudaGetLastError() after the launch), so the host code can turn a
 * failed launch into a tb_status. The semantics of every op are those of the
 * CPU reference (backend/cpu/kernels.h); pointers are device pointers.
 *
 * Activations are f32. Weights are f32, f16 or bf16 (tbc_dtype), converted
 * on load with f32 accumulation. The KV cache is f32, f16, bf16, or int8 /
 * fp8 (e4m3) codes with per-row f32 scales (core/kv_layout.h).
 *
 * Included from C (cuda_backend.c) and from the .cu files; only this folder
 * includes CUDA headers.
 */
#ifndef TB_CUDA_KERNELS_H
#define TB_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types as the kernels see them (the host maps tb_dtype onto these). */
typedef enum { TBC_F32 = 0, TBC_F16 = 1, TBC_BF16 = 2 } tbc_dtype;

/* y[t,:] = table[ids[t] - lo,:] for ids in [lo, lo + V), else zeros (a
 * tensor-parallel rank's vocabulary shard; lo 0, V INT32_MAX: the whole
 * table); ids (T), table (V, D) wdt, y (T, D). */
cudaError_t tbc_embedding(const int32_t *ids, const void *table, tbc_dtype wdt,
                          float *y, int T, int D, int lo, int V, cudaStream_t s);

/* Tensor parallelism without NCCL (ranks whose buffers one device reaches):
 * bufs[0..n) each (count), of every rank; this rank sums its slice
 * [rank, rank + 1) * ceil(count / n) over the n buffers in rank order and
 * writes the sum into all of them. */
#define TBC_MAX_RANKS 8
typedef struct { float *p[TBC_MAX_RANKS]; } tbc_rank_ptrs;
cudaError_t tbc_allreduce_slice(tbc_rank_ptrs bufs, int n, size_t count, int rank, cudaStream_t s);
/* y (rows, n C) = every rank's x (rows, C) side by side, rank 0 first. */
cudaError_t tbc_gather_cols(tbc_rank_ptrs xs, int n, float *y, int rows, int C, cudaStream_t s);

/* Activations that feed a cuBLAS matmul may be written for it directly: with
 * y16 set, the kernels below write their output rounded to dt16 (f16 or
 * bf16) into y16 instead of y (y is not written), so the matmul needs no
 * conversion pass. y16 = NULL: y in f32. */

/* y = rmsnorm(x) * w; x, y (T, D), w (D). */
cudaError_t tbc_rmsnorm(const float *x, const float *w, float *y, int T,
                        int D, float eps, void *y16, tbc_dtype dt16,
                        cudaStream_t s);

/* r = x + d; y = rmsnorm(r) * w; all (T, D) but w (D). r may alias x. */
cudaError_t tbc_add_rmsnorm(const float *x, const float *d, const float *w,
                            float *r, float *y, int T, int D, float eps,
                            void *y16, tbc_dtype dt16, cudaStream_t s);

/* y[t,i] = silu(gu[t,i]) * gu[t,F+i]; gu (T, 2F), y (T, F). */
cudaError_t tbc_silu_mul(const float *gu, float *y, int T, int F,
                         void *y16, tbc_dtype dt16, cudaStream_t s);

/* y = a + b, (n). */
cudaError_t tbc_add(const float *a, const float *b, float *y, size_t n,
                    cudaStream_t s);

/* y[r,:] = x[rows[r],:]; x (T, D), rows (R), y (R, D). */
cudaError_t tbc_gather_rows(const float *x, const int32_t *rows, float *y,
                            int R, int D, cudaStream_t s);

/* y[t,n] += bias[n]; y (T, N). */
cudaError_t tbc_add_bias(float *y, const float *bias, int T, int N,
                         cudaStream_t s);

/* dst (n) = src (n) rounded to dt (f16 or bf16). */
cudaError_t tbc_convert_f32(const float *src, void *dst, tbc_dtype dt,
                            size_t n, cudaStream_t s);

/* Rotates `n_heads` heads of hd from column 0 of each row of x in place:
 * x (T, row_stride), pos (T), inv_freq (hd/2). */
cudaError_t tbc_rope(float *x, int row_stride, const int32_t *pos,
                     const float *inv_freq, int T, int n_heads, int hd,
                     int interleaved, cudaStream_t s);

/* ---- paged attention of one layer (see tb_attn_args in cpu/kernels.h).
 * qkv (T, (H + 2 KV) hd) before RoPE; rotates q and k in place, writes k and
 * v into the cache at (seq[t], pos[t]), then attends causally. */
/* Quantised KV caches (tbc_attn_args.kv_q). */
enum { TBC_KVQ_NONE = 0, TBC_KVQ_I8 = 1, TBC_KVQ_FP8 = 2 };
typedef struct {
    int T, n_heads, n_kv, hd, interleaved;
    float scale;
    const int32_t *pos, *seq;      /* (T), device                         */
    const int32_t *block_tables;   /* (n_seqs, max_blocks), device        */
    int max_blocks, block_size;
    void *k_cache, *v_cache;       /* (n_blocks, block_size, n_kv, hd)    */
    int kv_f16;                    /* 1: f16 cache                        */
    int kv_bf16;                   /* 1: bf16 cache (the attention and
                                    * rope_kv kernels, the GEMV's ROPE
                                    * epilogue; not the GEMM or flash
                                    * prefill); all three 0: f32         */
    /* TBC_KVQ_I8 / TBC_KVQ_FP8: blocks of kv_block_bytes, each codes
     * (block_size, n_kv, hd) one byte each then, from byte kv_scale_off,
     * scales (block_size, n_kv) f32 (core/kv_layout.h: tb_kv_block_bytes,
     * tb_kv_codes_bytes; both multiples of 64). Written and read by the
     * rope_kv and attention kernels, the flash prefill and the GEMM
     * prefill's gather; not by the GEMV's ROPE epilogue. */
    int kv_q;
    size_t kv_block_bytes, kv_scale_off;
    const float *inv_freq;         /* (hd/2)                              */
    /* split-K: each (token, head) is cut into n_splits ranges of keys whose
     * partial results (n_splits * (hd + 2) floats per (t, h)) go to
     * `partial` and are merged by a second kernel. n_splits = 1: direct. */
    int n_splits;
    float *partial;
    /* (>= n_heads * T) zeroed ints: with n_splits > 1 the last split block
     * of each (t, h) to finish merges the partials (and re-zeroes its int) */
    int *counters;
    /* 1: q and k are already rotated and k, v already stored in the cache
     * (the qkv GEMV's TBC_EPI_ROPE epilogue did it) */
    int rope_done;
    /* > 0: a (token, head) uses at most ceil(len / split_min) of the
     * n_splits splits (the others return at once), so a short context is
     * not cut into tiny ranges; 0: always n_splits */
    int split_min;
    /* lanes that share one key: 0 = the largest power of two dividing hd,
     * at most 32 (one key per warp for hd >= 32); a smaller power of two
     * with hd / lanes == 16 makes each warp score 32 / lanes keys at once;
     * -1: hd / 16 lanes where that is such a power of two (8 at hd 128, 4
     * at hd 64: a lane holds 16 values) */
    int lanes;
    /* 1: decode on the tensor cores (attn_mma_kernel) where it applies:
     * hd 128, f16 or e4m3 caches, block_size a multiple of 16; 2: the same
     * kernel built for five blocks an SM (96 registers); 3: the same steps
     * with each warp's tiles copied ahead into shared memory
     * (attn_mma_pipe_kernel), int8 caches too; 4: as 3, and with 2..8 q
     * heads a kv head one block takes them all, a head a row of the mma
     * (tbc_attention_q_heads_per_block); 5 (auto): 4's GQA blocks where a
     * step has many (token, kv head) pairs, 3's kernel for int8 caches, else
     * 1, and 6's kernel for f16 / e4m3 caches where a step has no key splits
     * and at least warp_min (token, q head) pairs; 6: as 1, but a warp takes
     * a whole (token, head) where the step has no key splits
     * (attn_mma_warp_kernel; 7: two tiles in flight a warp); 0: attn_kernel */
    int mma;
    /* mode 5's least (token, q head) pairs for the warp kernel (0: never) */
    int warp_min;
    /* with ys_sw set, qkv is the raw product of an FP8 GEMM whose
     * tbc_scale_out was skipped: rope_kv scales each value it reads,
     * qkv[t][n] * (ys_sx[t] * ys_sw[n]) + ys_bias[n] (ys_bias may be NULL),
     * before the rotation; q is written back scaled and rotated, k and v go
     * to the cache only (qkv's k and v parts are left as they were: no
     * reader after rope_kv takes them); needs rope_done = 0.
     * ys_raw16 set: that product is f16 (the GEMM's alpha 1 / ys_mul, so
     * read as qkv16[t][n] * (ys_sx[t] * ys_mul * ys_sw[n]) + ys_bias[n],
     * qkv16 the buffer as f16 with the same row stride in elements), and
     * rope_kv writes q back as f16 in place: the attention kernels after
     * it then take q16 = 1 */
    const float *ys_sx, *ys_sw, *ys_bias;
    int ys_raw16;
    float ys_mul;
    /* 1: q in qkv is f16 (rope_kv wrote it so from an f16 product); the
     * attention, flash and GEMM prefill kernels read it so */
    int q16;
    /* 1: every token of the step is its sequence's only one, so the one
     * key (and value) of (seq[t], ...) the step writes is that at pos[t]:
     * attn_mma_kernel (and attn_kernel with f16 / bf16 caches at 16
     * values a lane) then reads the positions, the block table and the
     * other keys of its first tile (pass) before it waits on the previous
     * kernel (which writes q and that key), and the key at pos[t] after,
     * past L1. 0: everything after the wait. */
    int early;
    /* 1: the key splits' merge loops over the splits (TB_CUDA_ATTN_MERGE=loop,
     * the form before 2026-12-07, for comparison); 0: every split's loads
     * at once */
    int merge_loop;
} tbc_attn_args;

/* ---- decode matmul: y[t,n] = sum_k x[t,k] w[n,k] (+ bias[n]) for T <= 8.
 * Reads w once at full bandwidth (16-byte loads, one warp per row). For f16
 * and bf16 weights, x is rounded to the weight type first, so the result
 * equals the cuBLAS path's (which converts x) up to summation order. */
#define TBC_GEMV_MAX_T 8
cudaError_t tbc_gemv(const float *x, const void *w, tbc_dtype wdt,
                     const float *bias, float *y, int T, int K, int N,
                     cudaStream_t s);

/* The same with an epilogue that fuses the next op, an optional RMSNorm of
 * x in the prologue, and the kernel choice (tbc_gemv_opts).
 *   TBC_EPI_PLAIN  as tbc_gemv
 *   TBC_EPI_GLU    y is not written; glu (T, N/2) = silu(y[:, :N/2]) *
 *                  y[:, N/2:] (tbc_silu_mul of the product); N even
 *   TBC_EPI_ROPE   y = qkv of `attn` (N = (H + 2 KV) hd): q and k rotated,
 *                  k and v stored in the cache, as tbc_attention's first
 *                  kernel does; then run tbc_attention with rope_done = 1
 *   TBC_EPI_ADD    y is not written; res_out (T, N) = res + x w^T (+ bias)
 *                  (the residual add of tbc_add_rmsnorm); res_out may alias
 *                  res; T <= 2, or a step on the tensor-core kernel
 * norm set (as TBC_EPI_ADD for T; K % 8 == 0, 16-byte aligned x):
 * y = (x w^T) / rms(x),
 * rms(x) = sqrt(mean(x^2) + norm_eps) per token, bias added after: with the
 * RMSNorm weight folded into w (by the build: opt/llm_cuda.c), what tbc_rmsnorm followed by
 * the GEMV computes, with no extra pass over x. */
enum { TBC_EPI_PLAIN = 0, TBC_EPI_GLU = 1, TBC_EPI_ROPE = 2, TBC_EPI_ADD = 3 };
#define TBC_GEMV_SIMT_MAX_T 2
typedef struct {
    int mode;
    float *glu;
    tbc_attn_args attn;
    const float *res;
    float *res_out;
    int norm;
    float norm_eps;
    /* with norm, quantized weights only (tbc_qgemv): the RMSNorm weight (K),
     * multiplied into x as it is read (a norm weight cannot be folded into
     * codes with one scale per row or group); NULL: folded into w */
    const float *norm_w;
    /* quantized int8 / int4 weights, T = 1: x rounded to int8 per block of
     * 32 (tb_ref_qmatmul_q8), the products in integers (the engine's
     * TB_GEMV_Q8 tactic; TB_CUDA_QGEMV_V=15 takes it everywhere) */
    int q8;
} tbc_gemv_epi;

/* SIMT kernel for f16/bf16 steps of T <= 2 tokens:
 *   TBC_SIMT_PAIR   one warp per row pair, 4 warps per block
 *   TBC_SIMT_ROW    one warp per row, 8 warps (4 pairs) per block, four
 *                   16-byte loads per lane in flight
 *   TBC_SIMT_ROW2   as ROW with two loads in flight (ROW1: one)
 *   TBC_SIMT_ROW2S  as ROW2 with two warps per row, taking turns over the
 *                   row's chunks (ROW1S: as ROW1)
 * f32 weights and T > 2 always take the pair kernel. */
enum { TBC_SIMT_PAIR = 0, TBC_SIMT_ROW = 1, TBC_SIMT_ROW2 = 2, TBC_SIMT_ROW1 = 3, TBC_SIMT_ROW1S = 4,
       TBC_SIMT_ROW2S = 5 };
typedef struct {
    int simt_max_t; /* f16/bf16: SIMT up to this T, tensor cores above */
    int simt_kind;  /* TBC_SIMT_* */
} tbc_gemv_opts;
cudaError_t tbc_gemv_ex(const float *x, const void *w, tbc_dtype wdt,
                        const float *bias, float *y, int T, int K, int N,
                        const tbc_gemv_epi *epi, const tbc_gemv_opts *opts,
                        cudaStream_t s);
/* 1 when tbc_gemv_ex with these arguments implements TBC_EPI_ADD and norm
 * (SIMT steps of T <= 2, tensor-core steps up to TBC_GEMV_MAX_T). */
int tbc_gemv_fuses_norm(tbc_dtype wdt, int T, int K, const tbc_gemv_opts *opts);

/* ---- quantized decode matmul: qmatmul's y = x dq(W)^T (+ bias) for T <=
 * TBC_GEMV_MAX_T, with the encodings of core/quant.h (row-major codes, f32
 * scales per output row (int8, fp8) or per row and group of K (int4), int4
 * with optional additive zeros). Tensor cores (mma.sync m16n8k16, f16 in,
 * f32 accumulate) at every T: the codes are widened to f16 in registers
 * (int8 and e4m3 exactly, the row scale applied to the f32 sums; int4 as
 * code * scale (+ zero) rounded to f16) and x is rounded to f16, so the
 * result equals x dq(W)^T up to those roundings and the summation order.
 * The epilogues and the inline RMSNorm of tbc_gemv_ex apply (epi->norm_w:
 * the norm weight). Needs K % 64 == 0 (int8, fp8) or K % 128 == 0 (int4)
 * and 16-byte aligned codes and x (tbc_qgemv_supports); other shapes take
 * tbc_dequant_f16 and the f16 kernels. */
typedef enum { TBC_Q_I8 = 0, TBC_Q_FP8 = 1, TBC_Q_I4 = 2 } tbc_qtype;
typedef struct {
    tbc_qtype type;
    const void *codes;    /* (N, K) bytes; int4: (N, K/2), element k in the
                           * low nibble of byte k/2 when k is even        */
    const float *scales;  /* (N, K / group)                              */
    const float *zeros;   /* (N, K / group) or NULL (int4 only)          */
    int group;            /* K (int8, fp8); 32, 64 or 128 (int4)         */
} tbc_qweight;
int tbc_qgemv_supports(const tbc_qweight *w, const float *x, int T, int K);
cudaError_t tbc_qgemv(const float *x, const tbc_qweight *w, const float *bias, float *y, int T, int K, int N,
                      const tbc_gemv_epi *epi, cudaStream_t s);
/* Steps of K each warp of tbc_qgemv loads at once: 1 or 2 (default).
 * Process-wide; the backend sets it from TB_CUDA_QGEMV_U. */
void tbc_set_qgemv_unroll(int u);
/* the f16 / bf16 GEMVs' rotated row starts (TB_CUDA_GEMV_ROT: bit 0 the
 * tensor-core kernel, bit 1 the SIMT row kernel) */
void tbc_set_gemv_rot(int v);
/* the f16 / bf16 GEMVs on the bulk-copy ring kernel (sm_90; TB_CUDA_GEMV_TMA:
 * bit 0 steps of 3..8 tokens, bit 1 of 1..2, bit 2 only rows of K >= 8192,
 * bit 3 rows of K < 8192 on a 2-slot ring; bits 4, 7 and 5 the quantized
 * GEMVs of one token (int8 / e4m3; int4) and of 2..8 tokens on its
 * quantized form, bit 6 those of few tiles split in K over clusters of two
 * blocks; 0 at load, the backend sets its default 25) */
void tbc_set_gemv_tma(int v);
/* The quantized GEMV's block shape (process-wide; TB_CUDA_QGEMV_V): -1
 * (default) the pipelined kernel (qpipe_launch_v in gemv.cu: one token 4
 * for int8 / e4m3 (9 for rows of >= 8192 in few tiles), 5 for int4; 2..8
 * tokens 12 on compute capability 9.0, else 5 / 6), 0..3 one of the
 * register-loading shapes listed at qgemv_launch_u, else one pipelined
 * shape (4, 5, 6, 9, 12, 13; 7, 8, 10 and 11 take 4; for comparisons;
 * shapes whose x does not fit in shared memory take the register-loading
 * kernel; 12 and 13, 5 and 6 in clusters of two blocks sharing x's
 * staging, need compute capability 9.0); 15: every one-token int8 / int4
 * step on the Q8 kernel (x rounded to int8 per block of 32, as an engine's
 * TB_GEMV_Q8 tactic does; other steps the default). */
void tbc_set_qgemv_variant(int v);
/* The pipelined quantized GEMV's staging of x when its blocks are not in
 * clusters (TB_CUDA_QGEMV_XW): 0 the block's threads take turns over all
 * of x and meet at a block barrier; 1 each warp stages only its own K
 * range and waits for its own lanes; -1 (default) 1 for int4 steps of one
 * token, else 0. */
void tbc_set_qgemv_xw(int v);
/* int8 / e4m3 steps of up to max_t (0..2, default 0) tokens on the SIMT row kernel
 * (x in f32), u 16-byte loads per lane in flight (1, 2, 4); the backend
 * sets them from TB_CUDA_QGEMV_SIMT and TB_CUDA_QGEMV_SIMT_U. */
void tbc_set_qgemv_simt(int max_t, int u);
/* out (N, K) f16 = dq(W) rounded to f16 (any K). */
cudaError_t tbc_dequant_f16(const tbc_qweight *w, int K, int N, void *out, cudaStream_t s);
/* The FP8 tensor-core path of e4m3 weights for larger steps:
 * tbc_quant_x_fp8: q (T, K) e4m3 = x / sx[t], sx[t] = absmax(x[t]) / 448 (0
 * for a zero row); after the product y = q w^T of the codes (f32),
 * tbc_scale_out: y[t][n] = y[t][n] * sx[t] * sw[n] (+ bias[n]). */
cudaError_t tbc_quant_x_fp8(const float *x, int T, int K, void *q, float *sx, cudaStream_t s);
/* The FP8 GEMM's x written by its producer, one block a token: codes q
 * (T, D) and scales sx (T) of v, as tbc_quant_x_fp8 gives them, where v is
 *   TBC_ACT_NORM     rmsnorm(x) * w                       x (T, D)
 *   TBC_ACT_ADDNORM  rmsnorm(r) * w, r = x + d written    x, d, r (T, D)
 *   TBC_ACT_SILU     silu(g) * u of x = [g | u]           x (T, 2D)
 * With sw set the input d (for SiLU·mul: x) is a raw FP8 product whose
 * tbc_scale_out was skipped: it is read as d * (sx[t] * sw[n]) + bias[n]
 * (sw, bias: D, or 2D for SiLU·mul; bias may be NULL), sx[t] then
 * overwritten; with raw16 that input is f16 (the GEMM's alpha 1 / mul: read
 * as d16 * (sx[t] * mul * sw[n]) + bias[n]). D % 4 == 0, D <= TBC_ACT_FP8_MAX_D
 * (the row is kept in shared memory), every pointer 16-byte aligned. */
typedef enum { TBC_ACT_NORM, TBC_ACT_ADDNORM, TBC_ACT_SILU } tbc_act_kind;
#define TBC_ACT_FP8_MAX_D 49152
cudaError_t tbc_act_fp8(tbc_act_kind kind, const float *x, const float *d, const float *w, float *r, int T, int D,
                        float eps, const float *sw, const float *bias, int raw16, float mul, void *q, float *sx,
                        cudaStream_t s);
/* Threads a block of tbc_act_fp8 (a power of two, 32..1024; 0: the
 * default, 256 in steps of at least 256 tokens, else one float4 a thread
 * up to 1024). Process-wide. */
void tbc_set_act_threads(int n);
/* Steps of at least n tokens run the RoPE + KV write with blocks of
 * (tokens, heads) (0: never; default 64), tt tokens a block (1..8; 0: by
 * the step's length). Process-wide. */
void tbc_set_rope_tok(int n, int tt);
cudaError_t tbc_scale_out(float *y, int T, int N, const float *sx, const float *sw, const float *bias,
                          cudaStream_t s);

/* Programmatic dependent launch (compute capability 9.0+): while on, the
 * launchers above mark their kernels as allowed to start before the previous
 * kernel in the stream ends; each kernel waits for it (griddepcontrol.wait)
 * before it touches memory that kernel may write or read. Process-wide; the
 * host turns it on only where the previous stream operation is one of these
 * kernels. */
void tbc_set_pdl(int on);

/* 1 when the attention kernel handles head size hd. */
int tbc_attention_supports(int hd);
/* q heads one decode-attention block takes for these arguments (1, or
 * n_heads / n_kv with mma 4, and with mma 5 at enough tokens): the grid
 * has n_heads / that blocks a token and split. */
int tbc_attention_q_heads_per_block(const tbc_attn_args *a);
cudaError_t tbc_attention(const tbc_attn_args *a, float *qkv, float *out,
                          cudaStream_t s);
/* tbc_attention's first kernel alone: rotate q of the T tokens of `a` in
 * qkv and store k (rotated) and v in the cache. */
cudaError_t tbc_rope_kv(const tbc_attn_args *a, float *qkv, cudaStream_t s);

/* ---- prefill attention through GEMMs, for a run of n query tokens t0.. of
 * one sequence (compact slot seq_slot) whose k, v are already in the cache.
 * The host runs S = scale * Q K^T and O = P V as batched GEMMs over heads.
 * tbc_attn_gather: qx (n, H, hd) = q of the run's tokens, rounded to the
 * cache type; kx, vx (H, ld_l, hd) = keys/values 0..L-1 of the sequence,
 * each KV head repeated for its H / KV query heads, in the cache type
 * (f32 or f16; an int8 / fp8 cache gives f16: code * scale rounded, and q
 * in f16). A bf16 cache is refused.
 * tbc_attn_softmax: S (H, nq, L) f32 -> P (H, nq, L) (f16 when p16, else
 * f32), row (h, i) normalised over keys j <= pos[i] and zero after. */
cudaError_t tbc_attn_gather(const tbc_attn_args *a, const float *qkv,
                            int seq_slot, int t0, int n, int L, int ld_l,
                            void *qx, void *kx, void *vx, cudaStream_t s);
cudaError_t tbc_attn_softmax(const float *S, void *P, int p16,
                             const int32_t *pos, int H, int nq, int L,
                             cudaStream_t s);

/* ---- sampling (sample.cu): one block per logits row picks the row's next
 * token, as the CPU sampler does (runtime/sampler.c): penalties, greedy at
 * temperature 0, else top-k, min-p, top-p and a draw with the host's
 * uniform u; the log-probability of the pick and up to n_top alternatives
 * under the raw logits (log-softmax). The logits rows are modified (the
 * penalties). pen_tok / pen_cnt: (token, occurrences) pairs of the rows'
 * penalty windows, each token once; row r's are [pen_off, pen_off + pen_n);
 * pen_raw (as many floats) receives the penalised tokens' raw logits. */
#define TBC_TOP_MAX 20
typedef struct {
    float temperature;       /* 0: greedy                                   */
    float top_p, min_p;      /* 1, 0: off                                   */
    float repeat_penalty, presence_penalty, frequency_penalty;
    float u;                 /* uniform in [0, 1): the draw                 */
    int top_k;               /* 0: off                                      */
    int n_top;               /* alternatives wanted, 0..TBC_TOP_MAX         */
    int pen_off, pen_n;
    int force;               /* -1: pick; else take this token (scored only) */
} tbc_sample_row;
typedef struct {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[TBC_TOP_MAX];
    float top_logprobs[TBC_TOP_MAX];
} tbc_sample_out;
cudaError_t tbc_sample(float *logits, int R, int V, const tbc_sample_row *rows,
                       const int32_t *pen_tok, const int32_t *pen_cnt,
                       float *pen_raw, tbc_sample_out *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* TB_CUDA_KERNELS_H */
