/* cuda_backend.c — the CUDA backend: the vtable over cuda_kernels.h and
 * cuBLAS, device memory, one stream per backend, the step's bindings mirrored
 * on the device, and the GPU fingerprint.
 *
 * Memory: every weight is uploaded once (load_weights) into one device
 * allocation. The runtime's activation arena and KV pool come from `alloc`
 * (cudaMalloc). Scratch (cuBLAS inputs converted to the weight type, split-K
 * partials), the device copies of the step bindings and a pinned buffer for
 * the logits are sized from the graph at load_weights; only the compact block
 * table is sized at the first step (the block size is a context option).
 *
 * Matmuls: T <= TBC_GEMV_MAX_T tokens run the bandwidth-bound GEMV kernel;
 * larger steps run cuBLAS (f32 SGEMM for f32 weights; otherwise x is
 * converted to the weight type and cublasGemmEx accumulates in f32). The
 * GEMV's tactic for T <= 2 is chosen per weight shape by timing the
 * candidates when the engine is built (`turbine build --device cuda` calls
 * cuda_tune through the vtable's `tune`) and stored in each matmul's tactic
 * word (tune/tactic.h); loading never times. An engine without a choice
 * (tuning off at build, or an engine from before) runs the default kernel,
 * TBC_SIMT_ROW; TB_CUDA_TUNE=0 at run time ignores the stored choices.
 *
 * Fusion (GEMV steps, TB_CUDA_FUSE=0 turns it off) follows the choices of
 * the build's cuda_fuse pass (opt/llm_cuda.c), stored in the tactic words
 * and checked against the graph at load; an engine without them runs every
 * node on its own. The pass picks: a matmul whose only
 * consumer is the next node runs that node's work in its epilogue where the
 * pattern allows: matmul -> silu_mul (the silu_mul node is then skipped) and
 * qkv matmul -> attention (RoPE and the KV-cache write move into the GEMV;
 * attention runs with rope_done). For decode steps (SIMT GEMV at T <= 2,
 * the tensor-core GEMV up to T = 8; TB_CUDA_FUSE_NORM=0 turns it off):
 * matmul -> add_rmsnorm -> matmul runs as two kernels, the residual add in
 * the first GEMV's epilogue and the RMSNorm in the second GEMV (the
 * add_rmsnorm node is skipped), and rmsnorm -> matmul runs as the GEMV
 * alone: the build folded the norm weight into the matmul's weights (and
 * set it to ones), so the GEMV only scales its dot products by 1 / rms(x),
 * which it sums while it reads x. Programmatic dependent launch (compute
 * capability 9.0+): inside a captured step every kernel that follows
 * another of ours may start early; on by default for steps of T <= 2
 * (measured faster there on an H200, slower at batch 8 on TinyLlama:
 * docs/GPU.md), TB_CUDA_PDL=1 for every step, 0 for none.
 */
#include "backend/backend.h"
#include "core/comm.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_module.h"
#include "backend/cuda/flash_kernels.h"
#include "backend/cuda/i8gemm.h"
#include "backend/cuda/qgemm.h"
#include "backend/cuda/nn_backend.h"
#include "core/kv_layout.h"
#include "tune/tactic.h"
#include "tune/tune_cache.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <time.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <jansson.h>

#define MAX_SPLITS 32
#define FP8_PLANS 64 /* cached cuBLASLt plans (shapes) a context keeps */
/* the operands of a cuBLASLt plan (struct fp8_plan) */
enum { LT_E4M3 = 0, LT_I8, LT_F16, LT_BF16 };
/* steps of up to this many tokens time cuBLASLt's candidates per shape
 * (TB_CUDA_GEMM_TUNE_T; docs/GPU.md) */
#define TB_CUDA_DEFAULT_GEMM_TUNE_T 256
/* defaults of the tuning switches TB_CUDA_SIMT and TB_CUDA_ATTN_SPLIT_MIN */
#define TB_CUDA_DEFAULT_SIMT TBC_SIMT_ROW
#define TB_CUDA_DEFAULT_SPLIT_MIN 0
#define MAX_GRAPHS 64
#define TB_CUDA_DEFAULT_PREFILL_MIN 32
/* steps of up to 64 tokens run as graphs (cuBLAS included): 64 streams of
 * 7B decode 6160 -> 6527 tok/s on an H200 (docs/GPU.md) */
#define TB_CUDA_DEFAULT_GRAPH_MAX_T 64
/* hd / 16 lanes per key (a lane holds 16 values): at hd = 128 8 lanes (4
 * keys per warp at once), measured faster than one key per warp on the 7B
 * decode; at hd = 64 (TinyLlama) 4 lanes, 8 keys a warp (docs/GPU.md) */
#define TB_CUDA_DEFAULT_ATTN_LANES (-1)
/* decode attention on the tensor cores where it applies (hd 128, f16, e4m3
 * or int8 caches), GQA heads in the mma's rows at large batches (mode 5,
 * "auto"; docs/GPU.md) */
#define TB_CUDA_DEFAULT_ATTN_MMA 5
/* mode 5 takes the warp-a-(token, head) kernel of f16 / e4m3 caches from
 * this many (token, q head) pairs of a step without key splits: a 7B step
 * of 64 tokens (32 heads) and up (H100, 2026-12-05: batch-64 fp8 step
 * -4..-6% at contexts ~140, -2% at ~400, even at ~900; 64 / 256 streams
 * +2% / +3%; batch 32 at ~900 keys, 1024 pairs, was 10% slower) */
#define TB_CUDA_DEFAULT_ATTN_WARP_MIN 2048
/* TB_CUDA_GEMV_ROT (tbc_set_gemv_rot): the f16 / bf16 GEMVs read each
 * block's rows from a rotated start, so that the blocks of a wave do not
 * all read the same columns at once; bit 0 the tensor-core kernel of 3..8
 * tokens (H100, qgemv_bench --t 8 over a 7B layer's matrices: 271.3 ->
 * 256.5 us, every shape faster, down_proj 42.5 -> 38.8; the 7B b4 / b8
 * step ~1% faster, within the run's noise); bit 1 the SIMT row kernel of
 * 1..2 tokens (H200, qgemv_bench --t 1: 190.8 -> 166.1 us, 75.7 -> 86.7%
 * of the read, o_proj 58.6 -> 68.8%, down_proj 58.3 -> 78.1%; with the
 * row tactics timed rotated at build, the 7B b1 step 5.075 -> 4.966 ms and
 * TinyLlama's 1.21 -> 1.18-1.20 on an H100) */
#define TB_CUDA_DEFAULT_GEMV_ROT 3
/* TB_CUDA_GEMV_TMA (tbc_set_gemv_tma): the f16 / bf16 GEMVs of 3..8 tokens
 * on the bulk-copy ring kernel (bit 0), rows of K < 8192 on a ring of 2
 * slots (bit 3). H100, 7B f16 (docs/GPU.md "The f16 GEMV on a bulk-copy
 * ring"): b8 step 5.95 -> 5.69-5.73 ms against 5 (bits 0 and 2: only K >=
 * 8192 on it, 4 slots), 6.12-6.16 with none; b1 even. The one-token steps
 * on it too (11) were 4% slower at b1. Bit 4 (on): the one-token int8 /
 * e4m3 GEMVs on its quantized form (H100, 7B b1 step: fp8 3.35 -> 3.25 ms,
 * int8 3.37 -> 3.29; b8 even; docs/GPU.md "The quantized GEMVs on the
 * bulk-copy ring"). Off: bit 7 (one-token int4, 27% slower alone), bit 5
 * (2..8 tokens, 22-77% slower alone), bit 6 (K split over clusters of two
 * for matrices of few tiles: o_proj 7.7 -> 12.7 us) */
#define TB_CUDA_DEFAULT_GEMV_TMA 25
/* e4m3 matmuls in steps of at least this many tokens take the FP8 tensor
 * cores (cuBLASLt; x rounded to e4m3 a token): H100, 8-layer 7B, a 16-token
 * step 1.05 ms there against 1.92 for 15 tokens on the chunked GEMV */
#define TB_CUDA_DEFAULT_FP8_GEMM 9
/* the largest steps of quantized matmuls run as chunks of TBC_GEMV_MAX_T
 * tokens on the GEMV (qpath_of's QP_CHUNK; 8: none); larger ones take the mixed-input
 * GEMM (qgemm.h). 8-layer 7B, the GEMM against chunks: H200 int8 12 tokens
 * 1.01 against 1.54 ms, int4 9 / 16 tokens 1.11 / 1.13 against 1.12 / 1.22;
 * e4m3 (only where the FP8 GEMM is off) kept at 16, not measured */
#define TB_CUDA_DEFAULT_QCHUNK_I8 8
#define TB_CUDA_DEFAULT_QCHUNK_FP8 16
#define TB_CUDA_DEFAULT_QCHUNK_I4 8
/* quantized steps of more tokens than the chunks take, up to this many: the
 * mixed-input GEMM instead of the dequantised f16 weights and cuBLAS (H200,
 * 8-layer 7B, 64 tokens: int8 1.61 against 2.71 ms, int4 1.72 against 3.15;
 * prefill of 128 tokens int8 2.84 against 2.95, int4 2.81 against 3.28, of
 * 192 3.57 against 3.27 / 4.12 against 3.57) */
#define TB_CUDA_DEFAULT_QGEMM 128
/* scores of one pass of prefill attention (H x query rows x keys, f32) */
#define PREFILL_S_BYTES ((size_t)64 << 20)

/* A captured decode step: every kernel of one step of T tokens and R rows. */
typedef struct {
    int T, R, one; /* one: every token its sequence's only one (attn early) */
    int failed;               /* capture failed once: run this shape eagerly  */
    cudaGraphExec_t exec;
    /* TB_CUDA_GRAPH_TIMES=1: the replays' GPU time (events around each) and
     * the host's time from one replay's launch to the next of the same
     * graph; their difference is what the host adds between steps */
    double gt_sum, gt_min, gap_sum;
    long gt_n, gap_n;
} step_graph;

enum { RUN_EAGER = 0, RUN_CAPTURE, RUN_REPLAY };

/* A general engine's run recorded as a CUDA graph, one per shape (run key);
 * 64 of them, so a batcher's batch sizes 1..max_batch_size (its warm-up
 * captures each) stay captured rather than replacing one another. */
#define MAX_NN_GRAPHS 64
typedef struct {
    uint64_t key;
    int runs;                 /* eager runs of this key so far                  */
    int failed;               /* capture failed: this key runs eagerly          */
    cudaGraphExec_t exec;
} nn_graph;

typedef struct {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    int n_sm, cc_major, cc_minor;
    char name[256];
    int max_ctx;
    void *weights;            /* every weight of the graph, one allocation    */
    /* step bindings: pinned host staging and its device copy, laid out as
     * ids (max_tokens) | pos | seq | rows | block table (max_tokens, mb)    */
    int max_tokens;
    int bt_stride;            /* max_blocks the staging was sized for          */
    int32_t *h_stage, *d_stage;
    size_t stage_ints;
    int32_t *seq_map;         /* (max_tokens) compact slot -> runtime slot     */
    int32_t *seq_last;        /* (max_tokens) highest position per slot         */
    int step_max_len;         /* longest sequence in this step (host side)     */
    /* scratch */
    void *xconv;              /* x converted for cuBLAS (max_tokens, max_K)    */
    size_t xconv_bytes;
    float *partial;           /* split-K partials                              */
    size_t partial_floats;
    float *h_out;             /* pinned logits                                 */
    size_t out_bytes;
    /* sampling on the device: pinned staging of the rows' parameters and
     * penalty pairs, laid out rows (max_tokens) | tok (pen_cap) | cnt
     * (pen_cap), its device copy, the raw logits of penalised tokens, and the
     * results (max_tokens), pinned and on the device */
    void *h_samp, *d_samp;
    float *d_pen_raw;
    size_t pen_cap;
    tbc_sample_out *h_sout, *d_sout;
    /* CUDA graphs: steps of T <= graph_max_t tokens are captured once per
     * (T, R) and replayed, except steps above TBC_GEMV_MAX_T with a prefill
     * run (they take the flash / GEMM attention eagerly); TB_CUDA_GRAPHS=0
     * turns this off */
    int use_graphs;
    int graph_max_t;          /* steps of up to this many tokens are captured
                               * (TB_CUDA_GRAPH_MAX_T; above the GEMV's 8
                               * they include cuBLAS GEMMs)                 */
    int mode;                 /* RUN_* for the current step                    */
    step_graph *cur;
    step_graph graphs[MAX_GRAPHS];
    int n_graphs;
    /* tuning switches, read from the environment at create */
    int pdl;                  /* programmatic dependent launch in captures:
                               * -1 steps of T <= 2 (default), 0 off, 1 all   */
    int pdl_step;             /* ... for the current step                       */
    int fuse;                 /* GEMV epilogue fusion                           */
    tbc_gemv_opts gemv;       /* SIMT/mma cut and SIMT kernel (TB_CUDA_SIMT)    */
    int fuse_norm;            /* RMSNorm / residual add into the GEMVs          */
    int attn_split_min;       /* keys per attention split at least (0: off)     */
    int attn_lanes;           /* lanes per key in decode attention (tbc_attn_args.lanes) */
    int attn_mma;             /* TB_CUDA_ATTN_MMA: tensor-core decode attention */
    int attn_warp_min;        /* TB_CUDA_ATTN_WARP_MIN: mode 5's warp kernel from */
    int attn_merge_loop;      /* TB_CUDA_ATTN_MERGE=loop: tbc_attn_args.merge_loop */
    int attn_early;           /* TB_CUDA_ATTN_EARLY (default 1): tbc_attn_args.early
                               * in steps of one token a sequence           */
    int step_one;             /* this step: every token its sequence's only one */
    int skip_attn;            /* TB_CUDA_SKIP_ATTN=1: decode attention not run
                               * (timing only: what it costs in a step;
                               * the outputs are wrong)                      */
    int tune;                 /* GEMV tactics (TB_CUDA_TUNE): at build, 0 does
                               * not time them, 2 prints the timings; at run,
                               * 0 ignores the engine's choices              */
    float tune_gain;          /* a tactic replaces the default when it is faster
                               * by this fraction (TB_CUDA_TUNE_GAIN)        */
    double tune_min_bytes;    /* matrices smaller than this keep the default
                               * (TB_CUDA_TUNE_MIN_MB, default 20)           */
    int tune_pdl;             /* time with programmatic dependent launch
                               * (TB_CUDA_TUNE_PDL, default 1)               */
    int attn_blocks;          /* decode attention: split (token, head)s until
                               * about this many blocks per SM
                               * (TB_CUDA_ATTN_BLOCKS, default 2)            */
    int prev_kernel;          /* the stream's last operation is one of ours     */
    int *counters;            /* attention split merge counters (zeroed)        */
    size_t n_counters;
    uint8_t *fuse_kind;       /* per node: FUSE_* with the node after it        */
    int fused_node;           /* node whose work the last GEMV did (or -1)      */
    int skip_node;            /* add_rmsnorm / rmsnorm done by the GEMVs (-1)   */
    int norm_node;            /* matmul that norms its x in the prologue (-1)   */
    int x16;                  /* FUSE_X16 on (TB_CUDA_X16)                     */
    int x16_node;             /* matmul whose x the last node wrote to xconv   */
    int x8;                   /* FP8 GEMM x written by its producer (TB_CUDA_FP8_FUSE:
                               * 1, the default, also the product's scales applied by
                               * its reader; 2 only the producers; 0 neither) */
    int x8_node;              /* fp8 matmul whose codes and scales the producer wrote */
    int x8_mask;              /* TB_CUDA_FP8_FUSE_MASK (default 31): 1 rmsnorm, 2
                               * add_rmsnorm, 4 silu_mul as producers, 8 the
                               * deferred scales, 16 the deferred product in f16
                               * (for locating a difference) */
    /* an FP8 GEMM's output left as the raw product of the codes: node ys_node
     * (its one reader: the attention, an add_rmsnorm or silu_mul) applies
     * sx[t] * ys_sw[n] + ys_bias[n] as it reads it (-1: none pending). With
     * ys_raw16 the product is f16, written with alpha 1 / ys_mul (a power of
     * two that keeps any product of K codes inside f16's range), and the
     * reader's token scale is sx[t] * ys_mul */
    int ys_node;
    const float *ys_sw, *ys_bias;
    int ys_raw16;
    float ys_mul;
    const float *norm_x;
    const float *norm_w;      /* its norm weight (quantized matmuls read it) */
    float norm_eps;
    /* quantized matmuls that the GEMV kernels do not take (steps of more
     * than TBC_GEMV_MAX_T tokens, other shapes): the weights dequantised to
     * f16 here (the largest such matrix), then the f16 paths */
    void *wdq;
    size_t wdq_bytes;
    /* e4m3 weights in steps of at least fp8_gemm tokens: the FP8 tensor
     * cores through cuBLASLt, x quantised per token into xconv with its
     * scales in fp8_sx (TB_CUDA_FP8_GEMM=n sets the least step, default
     * TB_CUDA_DEFAULT_FP8_GEMM; 0 never). Smaller steps keep x in f16 on
     * the GEMV, so a few sequences decode as one does. */
    int fp8_gemm;
    /* quantized matmuls in steps of TBC_GEMV_MAX_T < T <= qchunk[tbc_qtype]
     * tokens (not taken by the FP8 GEMM): the tensor-core GEMV over chunks
     * of TBC_GEMV_MAX_T tokens, one read of the codes a chunk, instead of
     * the dequantised f16 weights (TB_CUDA_QCHUNK=n sets all three; 0 off) */
    int qchunk[3];
    /* quantized matmuls in steps of more tokens than qchunk takes, up to
     * qgemm (TB_CUDA_QGEMM=n, default TB_CUDA_DEFAULT_QGEMM; 0 never): the
     * mixed-input GEMM (qgemm.h) on f16 x in xconv, K split across blocks
     * into wdq where its row blocks leave SMs idle */
    int qgemm;
    /* int8 matmuls on int8 activations (W8A8: x rounded per token, cuBLASLt's
     * int8 tensor-core GEMM, i8gemm.h) in steps of at least i8_gemm tokens
     * (TB_CUDA_I8_GEMM, default 9, never below 9): only matmuls whose
     * engine asked for int8 activations (the q8 tactic), every int8 matmul
     * with i8_all (TB_CUDA_I8_GEMM_ALL=1); 0 never */
    int i8_gemm, i8_all;
    cublasLtHandle_t lt;
    void *lt_ws;
    float *fp8_sx;
    /* cuBLASLt's plan per fp8 shape (T, K, N): descriptors and the
     * heuristic's algorithm, made at a shape's first use (the heuristic
     * query alone costs tens of microseconds of host time a call) */
    struct fp8_plan {
        int T, K, N, d16; /* d16: the product in f16 (else f32) */
        int wt;           /* the operands: LT_E4M3, LT_I8 (int8 x int8 -> int32), LT_F16, LT_BF16 */
        cublasLtMatmulDesc_t op;
        cublasLtMatrixLayout_t la, lb, lc;
        cublasLtMatmulAlgo_t algo;
    } fp8_plan[FP8_PLANS];
    int n_fp8_plan, fp8_plan_next;
    /* Timed choice among cuBLASLt's candidates (lt_pick_time): steps of
     * TBC_GEMV_MAX_T < T <= gemm_tune_t tokens (TB_CUDA_GEMM_TUNE_T,
     * default TB_CUDA_DEFAULT_GEMM_TUNE_T; 0: the heuristic's first, as
     * before) time a shape's first GEMM_TUNE_CAND candidates once, on
     * tune_stream, and keep the fastest index per shape (gemm_picks, which
     * outlive the plan cache's evictions). gemm_lt (TB_CUDA_GEMM_LT, default
     * 1): f16 / bf16 weights in those steps take cuBLASLt plans too (0:
     * cublasGemmEx's default algorithm at every T, as before). step_done:
     * recorded before a step that may tune, waited for by a tuning inside
     * that step's capture (the GPU must be idle while candidates run). */
    int gemm_tune_t, gemm_lt;
    void *tune_y; /* the tuning's output scratch: T x N floats of the largest tuned shape */
    size_t tune_y_bytes;
    cudaStream_t tune_stream;
    cudaEvent_t tune_e0, tune_e1, step_done;
    int step_done_set;
    struct gemm_pick {
        int T, K, N, d16, wt, idx;
    } *gemm_picks;
    int n_gemm_picks, cap_gemm_picks;
    /* gemm_picks kept on disk (tune/tune_cache.h; TURBINE_TUNE_CACHE):
     * read at the first tuned plan, each new timed pick appended.
     * tune_cache: 0 not opened yet, 1 on, -1 off */
    int tune_cache;
    char tune_ident[256];
    char tune_path[1024];
    /* prefill attention: a run of >= prefill_min tokens of one sequence in
     * a step (TB_CUDA_PREFILL_GEMM=n; 0 turns it off) takes the flash kernel
     * (flash.cu) or, where it does not apply, GEMMs. Scratch of the GEMMs,
     * grown when a step needs more: q (n, H, hd), k and v (H, pf_ld, hd) in
     * the cache type, scores S (H, nq, L) f32 and probabilities P */
    int prefill_min;
    /* general engines (nn_backend.c): the ops' scratch, and runs captured
     * as CUDA graphs keyed by everything a capture bakes in (buffers, dims,
     * host values); a key runs eagerly once, is captured on its second run
     * and replayed from the third */
    tbn_ctx nn;
    int general;
    nn_graph nn_graphs[MAX_NN_GRAPHS];
    int n_nn_graphs, nn_next;
    nn_graph *nn_cur;
    /* TB_CUDA_GRAPH_TIMES=1: each replay of a general run timed with events
     * (the GPU time of the graph alone, without the input / output copies
     * the run's latency includes), reported when the backend is destroyed */
    int gt_on, gt_pending;
    cudaEvent_t gt0, gt1;
    step_graph *gt_step, *gt_last; /* the replay timed last; the graph launched last */
    double gt_last_ms;             /* when (host clock, ms) */
    double gt_sum, gt_min;
    long gt_n;
    int nn_mode;              /* RUN_* of the current general run             */
    int prefill_flash;        /* 1: such runs take the flash kernel where it
                               * handles the shape (f16 cache, hd 64 / 128);
                               * TB_CUDA_PREFILL=gemm: the GEMMs always     */
    int flash_bf16;           /* 1: runs over a bf16 cache take the flash
                               * kernel's bf16 form (the default;
                               * TB_CUDA_FLASH_BF16=0, and TB_CUDA_PREFILL=
                               * gemm: the attention kernel, as the GEMMs
                               * are f16 only) */
    void *pf_q, *pf_k, *pf_v, *pf_p;
    float *pf_s;
    size_t pf_q_bytes, pf_k_bytes, pf_v_bytes, pf_s_bytes, pf_p_bytes;
    /* tensor parallelism (set up at the first step with ranks): TP_HOST,
     * ranks sharing this device, meet on the host; TP_NCCL, one device per
     * rank, run NCCL collectives on the stream (capturable in graphs) */
    int tp_mode;
    ncclComm_t nccl;
    ncclUniqueId nccl_id;     /* rank 0's, read by the others at set-up */
    float *gather;            /* all_gather's (ranks, rows, C) before its transpose */
    size_t gather_bytes;
} cuda_ctx;

enum { TP_NONE = 0, TP_HOST, TP_NCCL };

/* ---------------------------------------------------------------- NCCL
 * Loaded with dlopen on the first multi-GPU step (the system's
 * libnccl.so.2): a single-GPU run never needs it. */
typedef struct {
    ncclResult_t (*get_unique_id)(ncclUniqueId *id);
    ncclResult_t (*comm_init_rank)(ncclComm_t *comm, int n, ncclUniqueId id, int rank);
    ncclResult_t (*all_reduce)(const void *x, void *y, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t s);
    ncclResult_t (*all_gather)(const void *x, void *y, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s);
    ncclResult_t (*comm_destroy)(ncclComm_t c);
    const char *(*error_string)(ncclResult_t r);
} nccl_api;

static nccl_api nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static char nccl_error[256];

static void nccl_load(void) {
    /* NVLink multicast (NVLS) off unless asked for: it helps large
     * all-reduces, not a decode step's few KiB, and on shared hosts a
     * program using it can take GPUs others use out of service */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nccl_error, sizeof nccl_error, "cannot load NCCL (libnccl.so.2): %s", dlerror());
        return;
    }
#define NCCL_SYM(f, name) *(void **)&nccl.f = dlsym(h, name)
    NCCL_SYM(get_unique_id, "ncclGetUniqueId");
    NCCL_SYM(comm_init_rank, "ncclCommInitRank");
    NCCL_SYM(all_reduce, "ncclAllReduce");
    NCCL_SYM(all_gather, "ncclAllGather");
    NCCL_SYM(comm_destroy, "ncclCommDestroy");
    NCCL_SYM(error_string, "ncclGetErrorString");
#undef NCCL_SYM
    if (!nccl.get_unique_id || !nccl.comm_init_rank || !nccl.all_reduce || !nccl.all_gather || !nccl.comm_destroy ||
        !nccl.error_string) {
        snprintf(nccl_error, sizeof nccl_error, "libnccl.so.2 lacks an NCCL entry point");
        memset(&nccl, 0, sizeof nccl);
    }
}

#define NCCL_TRY(call, what)                                                                                         \
    do {                                                                                                             \
        ncclResult_t r_ = (call);                                                                                    \
        if (r_ != ncclSuccess) return tb_errorf(TB_ERR_HARDWARE, "cuda: %s: NCCL: %s", (what), nccl.error_string(r_)); \
    } while (0)

/* The fusions are chosen at build time (opt/llm_cuda.c) and stored in the
 * nodes' tactic words; these are tune/tactic.h's TB_FUSE_* values. */
enum { FUSE_NONE = 0, FUSE_ROPE = TB_FUSE_ROPE, FUSE_GLU = TB_FUSE_GLU };
/* per node, with the nodes after it: a matmul followed by add_rmsnorm and a
 * matmul that reads only its normed output (FUSE_ADDNORM on the first
 * matmul), or rmsnorm followed by a matmul (FUSE_NORM on the rmsnorm) */
enum { FUSE_ADDNORM = TB_FUSE_ADDNORM, FUSE_NORM = TB_FUSE_NORM };
/* an rmsnorm / add_rmsnorm / silu_mul whose output only the next node, a
 * matmul with f16/bf16 weights, reads: on the cuBLAS path it writes that
 * matmul's converted input itself (TB_CUDA_X16=0 turns it off) */
enum { FUSE_X16 = TB_FUSE_X16 };

static tb_status cuda_fail(cudaError_t e, const char *what) {
    return tb_errorf(TB_ERR_INTERNAL, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static void nn_graphs_clear(cuda_ctx *c);

#define CU_TRY(call, what)                                                   \
    do {                                                                     \
        cudaError_t cu_e_ = (call);                                          \
        if (cu_e_ != cudaSuccess) return cuda_fail(cu_e_, what);             \
    } while (0)

/* The context's device made current on the calling thread: the runtime
 * enters a backend from whichever thread runs the engine (the scheduler,
 * the batcher's workers, a caller running its own request), and a thread's
 * current device is its own, device 0 until set. Cheap when already set. */
#define CU_ON_DEVICE(c) CU_TRY(cudaSetDevice((c)->device), "cudaSetDevice")

static const char *blas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

static int tbc_of(tb_dtype d, tbc_dtype *out) {
    switch (d) {
    case TB_F32: *out = TBC_F32; return 1;
    case TB_F16: *out = TBC_F16; return 1;
    case TB_BF16: *out = TBC_BF16; return 1;
    default: return 0;
    }
}

/* cuBLASLt workspace of the FP8 matmuls */
#define FP8_LT_WS ((size_t)32 << 20)

/* ---------------------------------------------------------------- vtable */

static int cuda_supports_op(tb_backend *b, const tb_graph *g, const tb_node *n) {
    (void)b;
    tbc_dtype dt;
    switch (n->op) {
    case TB_OP_EMBEDDING:
        return tbc_of(g->values[n->in[1]].dtype, &dt);
    case TB_OP_ALL_REDUCE:
    case TB_OP_ALL_GATHER_COLS:
        return n->i[0] <= TBC_MAX_RANKS;
    case TB_OP_MATMUL:
        return tbc_of(g->values[n->in[1]].dtype, &dt);
    case TB_OP_ATTENTION: {
        int H = n->i[1], KV = n->i[2], hd = n->i[3] & 0xffff;
        return KV > 0 && H % KV == 0 && tbc_attention_supports(hd);
    }
    case TB_OP_ROPE:
        return n->i[1] % 2 == 0;
    case TB_OP_RMSNORM:
    case TB_OP_ADD_RMSNORM:
    case TB_OP_SILU_MUL:
    case TB_OP_ADD:
    case TB_OP_GATHER_ROWS:
        return 1;
    case TB_OP_QMATMUL: {
        tb_dtype d = g->values[n->in[1]].dtype;
        return (d == TB_I8 || d == TB_I4 || d == TB_FP8_E4M3) && g->values[n->in[1]].rank == 2;
    }
    default:
        return tb_op_is_nn(n->op) ? tbn_supports(g, n) : 0;
    }
}

/* alloc, free, read_output and sample make the backend's device current
 * first: a context of several GPU ranks calls them on one thread for every
 * rank's backend in turn. */
static void *cuda_alloc(tb_backend *b, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaSetDevice(((cuda_ctx *)b->ctx)->device);
    if (e == cudaSuccess) e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        tb_errorf(TB_ERR_OOM, "cuda: cannot allocate %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cuda_free(tb_backend *b, void *p) {
    if (!p) return;
    cudaSetDevice(((cuda_ctx *)b->ctx)->device);
    cudaFree(p);
}

static int64_t sym_max(const tb_graph *g, int64_t d) {
    return TB_IS_SYM(d) ? g->syms[TB_SYM_INDEX(d)].max : d;
}

/* The decode GEMV's tactic per matmul, chosen by timing (TB_CUDA_TUNE=0:
 * not; the default kernel then). Batch-1 decode is bound by how the weight
 * reads share the memory system, and the best number of 16-byte loads each
 * lane keeps in flight (1, 2 or 4), with one or two warps per row
 * (TBC_SIMT_ROW1 / ROW2 / ROW1S / ROW2S / ROW), depends on the matrix: on an
 * H200 the 7B's matrices run fastest with one (docs/GPU.md). Each distinct
 * (dtype, K, N) of at least tune_min_bytes is timed at T = 1 over all the
 * matmuls of that shape in turn (their own weights, so the reads come from
 * memory, not from L2), best of 3 rounds; every matmul of the shape takes
 * the fastest. About 0.1 s at a 7B context's creation. */
static tb_status cuda_tune(tb_backend *b, tb_graph *g, void *const *bufs, int *n_timed) {
    cuda_ctx *c = b->ctx;
    *n_timed = 0;
    for (int k = 0; k < g->n_nodes; k++) g->nodes[k].tactic &= ~(0xff << TB_TACTIC_GEMV_SHIFT);
    if (!c->tune || c->gemv.simt_kind != TBC_SIMT_ROW || c->gemv.simt_max_t < 1) return TB_OK;
    CU_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    int maxK = 0, maxN = 0, any = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (n->op != TB_OP_MATMUL) continue;
        const tb_value *w = &g->values[n->in[1]];
        if ((w->dtype != TB_F16 && w->dtype != TB_BF16) || w->dims[1] % 8) continue;
        if (w->dims[1] > maxK) maxK = (int)w->dims[1];
        if (w->dims[0] > maxN) maxN = (int)w->dims[0];
        any = 1;
    }
    if (!any) return TB_OK;
    uint8_t *row_kind = calloc((size_t)g->n_nodes, 1); /* TBC_SIMT_* + 1 per matmul, 0: not yet */
    int *list = malloc(sizeof(int) * (size_t)g->n_nodes);
    if (!row_kind || !list) { free(row_kind); free(list); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    float *x = NULL, *y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    tb_status st = TB_OK;
    enum { NK = 5 };
    static const int kinds[NK] = {TBC_SIMT_ROW1, TBC_SIMT_ROW2, TBC_SIMT_ROW1S, TBC_SIMT_ROW2S, TBC_SIMT_ROW};
    static const char *names[NK] = {"row1", "row2", "row1s", "row2s", "row"};
    if (cudaMalloc((void **)&x, sizeof(float) * (size_t)maxK) != cudaSuccess ||
        cudaMalloc((void **)&y, sizeof(float) * (size_t)maxN) != cudaSuccess ||
        cudaMemsetAsync(x, 0, sizeof(float) * (size_t)maxK, c->stream) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        st = cuda_fail(cudaGetLastError(), "GEMV tuning scratch");
        goto done;
    }
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (n->op != TB_OP_MATMUL || row_kind[k]) continue;
        const tb_value *w = &g->values[n->in[1]];
        if ((w->dtype != TB_F16 && w->dtype != TB_BF16) || w->dims[1] % 8) continue;
        int K = (int)w->dims[1], N = (int)w->dims[0], nl = 0;
        for (int j = k; j < g->n_nodes; j++) {
            const tb_node *m = &g->nodes[j];
            if (m->op != TB_OP_MATMUL) continue;
            const tb_value *v = &g->values[m->in[1]];
            if (v->dtype == w->dtype && v->dims[0] == N && v->dims[1] == K) list[nl++] = j;
        }
        tbc_dtype wdt = w->dtype == TB_F16 ? TBC_F16 : TBC_BF16;
        if ((double)K * N * 2 < c->tune_min_bytes) {
            /* small matrices: the kernel's ramp and tail overlap its
             * neighbours in a captured step, which a timing in isolation
             * misjudges (TinyLlama's 8-10 MB matrices ran slower with the
             * tactics that timed faster alone): the default */
            for (int i = 0; i < nl; i++) row_kind[list[i]] = TBC_SIMT_ROW + 1;
            continue;
        }
        int reps = nl >= 8 ? 1 : (8 + nl - 1) / nl;
        float best[NK];
        for (int ki = 0; ki < NK; ki++) best[ki] = 1e30f;
        for (int round = -1; round < 3; round++) {
            for (int ki = 0; ki < NK; ki++) {
                tbc_gemv_opts o = c->gemv;
                o.simt_kind = kinds[ki];
                cudaEventRecord(e0, c->stream);
                /* with programmatic dependent launch, as in a captured step */
                tbc_set_pdl(c->tune_pdl && c->pdl != 0);
                for (int r = 0; r < reps; r++)
                    for (int i = 0; i < nl; i++)
                        if (tbc_gemv_ex(x, bufs[g->nodes[list[i]].in[1]], wdt, NULL, y, 1, K, N, NULL, &o,
                                        c->stream) != cudaSuccess) {
                            st = cuda_fail(cudaGetLastError(), "GEMV tuning");
                            goto done;
                        }
                tbc_set_pdl(0);
                cudaEventRecord(e1, c->stream);
                float ms = 0.0f;
                if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
                    st = cuda_fail(cudaGetLastError(), "GEMV tuning");
                    goto done;
                }
                ms /= (float)(reps * nl);
                if (round >= 0 && ms < best[ki]) best[ki] = ms;
            }
        }
        /* the default (four in flight) unless another is faster by the
         * margin c->tune_gain */
        int bi = NK - 1;
        for (int ki = 0; ki < NK - 1; ki++)
            if (best[ki] * (1.0f + c->tune_gain) < best[NK - 1] && best[ki] < best[bi]) bi = ki;
        for (int i = 0; i < nl; i++) row_kind[list[i]] = (uint8_t)(kinds[bi] + 1);
        ++*n_timed;
        if (c->tune > 1) {
            fprintf(stderr, "cuda: gemv %d x %d (%d matmuls):", N, K, nl);
            for (int ki = 0; ki < NK; ki++)
                fprintf(stderr, " %s %.1f us%s", names[ki], best[ki] * 1e3, ki < NK - 1 ? "," : "");
            fprintf(stderr, " -> %s\n", names[bi]);
        }
    }
done:
    tbc_set_pdl(0);
    if (st == TB_OK)
        for (int k = 0; k < g->n_nodes; k++) g->nodes[k].tactic |= row_kind[k] << TB_TACTIC_GEMV_SHIFT;
    free(row_kind);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(x);
    cudaFree(y);
    free(list);
    return st;
}

/* Node k's stored fusion `kind` (TB_FUSE_*) names nodes after it that do
 * what the fused kernels assume (a stored choice is checked, not remade). */
static int is_mm(const tb_node *n) { return n->op == TB_OP_MATMUL || n->op == TB_OP_QMATMUL; }

static int fusion_fits(const tb_graph *g, int k, int kind) {
    const tb_node *m = &g->nodes[k], *nx = k + 1 < g->n_nodes ? &g->nodes[k + 1] : NULL;
    if (!nx || (kind & ~TB_FUSE_MASK)) return 0;
    if (kind & (TB_FUSE_X16 | TB_FUSE_NORM)) {
        int act = m->op == TB_OP_RMSNORM || m->op == TB_OP_SILU_MUL ? m->out[0]
                  : m->op == TB_OP_ADD_RMSNORM                       ? m->out[1]
                                                                     : -1;
        if (act < 0 || !is_mm(nx) || nx->in[0] != act) return 0;
        if ((kind & TB_FUSE_NORM) && m->op != TB_OP_RMSNORM) return 0;
    }
    if (kind & (TB_FUSE_ROPE | TB_FUSE_GLU | TB_FUSE_ADDNORM)) {
        if (!is_mm(m)) return 0;
        const tb_value *w = &g->values[m->in[1]];
        if ((kind & TB_FUSE_ROPE) &&
            (nx->op != TB_OP_ATTENTION || nx->in[0] != m->out[0] ||
             w->dims[0] != (int64_t)(nx->i[1] + 2 * nx->i[2]) * (nx->i[3] & 0xffff)))
            return 0;
        if ((kind & TB_FUSE_GLU) && (nx->op != TB_OP_SILU_MUL || nx->in[0] != m->out[0] || w->dims[0] % 2)) return 0;
        if (kind & TB_FUSE_ADDNORM) {
            const tb_node *m2 = k + 2 < g->n_nodes ? &g->nodes[k + 2] : NULL;
            if (nx->op != TB_OP_ADD_RMSNORM || nx->in[1] != m->out[0] || !m2 || !is_mm(m2) ||
                m2->in[0] != nx->out[1])
                return 0;
        }
    }
    return 1;
}

/* ---- the weight upload: host memory (the engine's mapped file) to the
 * device through pinned staging buffers. A cudaMemcpy from pageable memory
 * stages through the driver's own small buffers on one thread; here
 * UP_THREADS host threads copy each UP_CHUNK piece into one of UP_BUFS pinned
 * buffers while the copy engine moves the ones filled before. Small weights
 * share a buffer (one cudaMemcpyAsync each). Engines under UP_CHUNK of
 * weights, TB_CUDA_UPLOAD=0, or pinned memory that cannot be had take the
 * plain cudaMemcpy per weight; TB_CUDA_UPLOAD=1 stages every engine. */
#define UP_BUFS 3
#define UP_CHUNK ((size_t)64 << 20)
#define UP_THREADS 8
typedef struct {
    int on;                 /* staging in use */
    uint8_t *pin[UP_BUFS];  /* pinned, UP_CHUNK each */
    cudaEvent_t done[UP_BUFS];
    int cur;                /* the buffer being filled */
    size_t used;            /* bytes of it filled */
} up_stage;

typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
} up_slice;

static void *up_memcpy_thread(void *arg) {
    up_slice *sl = arg;
    memcpy(sl->dst, sl->src, sl->n);
    return NULL;
}

/* memcpy of n bytes on up to UP_THREADS threads (one below 4 MiB). */
static void up_memcpy(uint8_t *dst, const uint8_t *src, size_t n) {
    int nt = n >= ((size_t)4 << 20) ? UP_THREADS : 1;
    pthread_t tid[UP_THREADS];
    up_slice sl[UP_THREADS];
    int started = 0;
    size_t per = (n / (size_t)nt + 4095) & ~(size_t)4095;
    for (int t = 0; t < nt; t++) {
        size_t a = per * (size_t)t, b = a + per < n ? a + per : n;
        if (a >= n) break;
        sl[t] = (up_slice){dst + a, src + a, b - a};
        if (t == 0 || pthread_create(&tid[t], NULL, up_memcpy_thread, &sl[t]) != 0) {
            if (t > 0) memcpy(sl[t].dst, sl[t].src, sl[t].n);
            continue;
        }
        started |= 1 << t;
    }
    memcpy(sl[0].dst, sl[0].src, sl[0].n);
    for (int t = 1; t < nt; t++)
        if (started & (1 << t)) pthread_join(tid[t], NULL);
}

static void up_begin(up_stage *st, size_t total) {
    memset(st, 0, sizeof(*st));
    const char *e = getenv("TB_CUDA_UPLOAD");
    if (e && !strcmp(e, "0")) return;
    if (total < UP_CHUNK && !(e && !strcmp(e, "1"))) return; /* small engines: the plain copy */
    for (int i = 0; i < UP_BUFS; i++) {
        if (cudaMallocHost((void **)&st->pin[i], UP_CHUNK) != cudaSuccess ||
            cudaEventCreateWithFlags(&st->done[i], cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            for (int k = 0; k <= i; k++) {
                if (st->pin[k]) cudaFreeHost(st->pin[k]);
                if (st->done[k]) cudaEventDestroy(st->done[k]);
            }
            memset(st, 0, sizeof(*st));
            return;
        }
    }
    st->on = 1;
}

/* Moves to the next staging buffer, waiting until its last copy is done. */
static tb_status up_next(up_stage *st) {
    st->cur = (st->cur + 1) % UP_BUFS;
    st->used = 0;
    CU_TRY(cudaEventSynchronize(st->done[st->cur]), "uploading weights");
    return TB_OK;
}

/* Without staging (small engines), a copy on the context's stream: a
 * plain cudaMemcpy from pageable memory may return before its DMA lands,
 * and the context's stream (non-blocking) would not wait for it — another
 * rank's kernel, or this context's, could read the weight unwritten. The
 * copy is staged before the call returns (the source may go), and up_end
 * waits for the stream. */
static tb_status up_copy(up_stage *st, cudaStream_t s, uint8_t *dst, const void *src, size_t n) {
    if (!st->on) {
        CU_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "uploading weights");
        return TB_OK;
    }
    const uint8_t *p = src;
    while (n) {
        if (st->used == UP_CHUNK) {
            tb_status e = up_next(st);
            if (e != TB_OK) return e;
        }
        size_t k = UP_CHUNK - st->used < n ? UP_CHUNK - st->used : n;
        uint8_t *b = st->pin[st->cur] + st->used;
        up_memcpy(b, p, k);
        CU_TRY(cudaMemcpyAsync(dst, b, k, cudaMemcpyHostToDevice, s), "uploading weights");
        CU_TRY(cudaEventRecord(st->done[st->cur], s), "uploading weights");
        st->used += k;
        p += k;
        dst += k;
        n -= k;
    }
    return TB_OK;
}

static tb_status up_end(up_stage *st, cudaStream_t s) {
    cudaError_t e = cudaStreamSynchronize(s);
    if (!st->on) return e == cudaSuccess ? TB_OK : cuda_fail(e, "uploading weights");
    for (int i = 0; i < UP_BUFS; i++) {
        cudaFreeHost(st->pin[i]);
        cudaEventDestroy(st->done[i]);
    }
    st->on = 0;
    return e == cudaSuccess ? TB_OK : cuda_fail(e, "uploading weights");
}

/* Uploads the weights and sizes every buffer whose size the graph sets. */
static tb_status cuda_load_weights(tb_backend *b, const tb_graph *g, void **bufs) {
    cuda_ctx *c = b->ctx;
    CU_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    tbn_cudnn_weights_reset(&c->nn); /* channels-last copies of the old weights */
    size_t total = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind == TB_VAL_WEIGHT) total += (g->values[i].nbytes + 255) / 256 * 256;
    if (c->weights) { cudaFree(c->weights); c->weights = NULL; }
    cudaError_t e = cudaMalloc(&c->weights, total ? total : 256);
    if (e != cudaSuccess)
        return tb_errorf(TB_ERR_OOM, "cuda: cannot allocate %.2f GiB of device memory for the weights on %s: %s",
                         (double)total / (1 << 30), c->name, cudaGetErrorString(e));
    size_t off = 0;
    up_stage st;
    up_begin(&st, total);
    for (int i = 0; i < g->n_values; i++) {
        const tb_value *v = &g->values[i];
        if (v->kind != TB_VAL_WEIGHT) continue;
        uint8_t *dst = (uint8_t *)c->weights + off;
        if (v->nbytes) {
            tb_status s = up_copy(&st, c->stream, dst, v->data, v->nbytes);
            if (s != TB_OK) { up_end(&st, c->stream); return s; }
        }
        bufs[i] = dst;
        off += (v->nbytes + 255) / 256 * 256;
    }
    { tb_status s = up_end(&st, c->stream); if (s != TB_OK) return s; }
    if (g->n_outputs > 0) { /* a general engine: no step bindings, no LLM fusions */
        c->general = 1;
        nn_graphs_clear(c);
        c->nn.stream = c->stream;
        c->nn.blas = c->blas;
        return TB_OK;
    }

    /* sizes at the profile's maxima */
    int64_t max_tokens = 1;
    for (int i = 0; i < g->n_syms; i++) if (g->syms[i].max > max_tokens) max_tokens = g->syms[i].max;
    c->max_tokens = (int)max_tokens;
    size_t xconv = 0, part = 0, wdq = 0;
    int attn_sm = c->attn_blocks > 2 ? c->attn_blocks : 2;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        if (n->op == TB_OP_MATMUL || n->op == TB_OP_QMATMUL) {
            const tb_value *w = &g->values[n->in[1]];
            size_t need = (size_t)sym_max(g, g->values[n->in[0]].dims[0]) * (size_t)w->dims[1] * 2;
            if (w->dtype != TB_F32 && need > xconv) xconv = need;
            if (n->op == TB_OP_QMATMUL && (size_t)w->dims[0] * (size_t)w->dims[1] * 2 > wdq)
                wdq = (size_t)w->dims[0] * (size_t)w->dims[1] * 2;
        } else if (n->op == TB_OP_ATTENTION) {
            int H = n->i[1], hd = n->i[3] & 0xffff;
            /* splits are used only while H * T < attn_blocks * n_sm */
            size_t need = (size_t)(attn_sm * c->n_sm) * MAX_SPLITS * (size_t)(hd + 2) + (size_t)H * (hd + 2);
            if (need > part) part = need;
        }
    }
    if (xconv && !c->xconv) {
        CU_TRY(cudaMalloc(&c->xconv, xconv), "allocating matmul scratch");
        c->xconv_bytes = xconv;
    }
    int any_fp8 = 0, any_i8 = 0, any_16 = 0;
    size_t tune_y = 0; /* T x N floats of the largest shape a step may tune */
    const int tune_t = max_tokens < c->gemm_tune_t ? (int)max_tokens : c->gemm_tune_t;
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *qn = &g->nodes[k];
        if (qn->op == TB_OP_MATMUL || qn->op == TB_OP_QMATMUL) {
            const tb_value *wv = &g->values[qn->in[1]];
            if (qn->op == TB_OP_MATMUL && (wv->dtype == TB_F16 || wv->dtype == TB_BF16)) any_16 = 1;
            if (tune_t > TBC_GEMV_MAX_T && (size_t)tune_t * (size_t)wv->dims[0] * 4 > tune_y)
                tune_y = (size_t)tune_t * (size_t)wv->dims[0] * 4;
        }
        if (qn->op != TB_OP_QMATMUL) continue;
        const tb_dtype qd = g->values[qn->in[1]].dtype;
        if (qd == TB_FP8_E4M3) any_fp8 = 1;
        if (qd == TB_I8 && (c->i8_all || tb_tactic_gemv(qn->tactic) == TB_GEMV_Q8)) any_i8 = 1;
    }
    if (((any_fp8 && c->fp8_gemm > 0) || (any_i8 && c->i8_gemm > 0) || (any_16 && c->gemm_lt && c->gemm_tune_t > 0)) &&
        !c->lt) {
        if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
            c->lt = NULL;
            c->fp8_gemm = 0;
            c->i8_gemm = 0;
        } else {
            CU_TRY(cudaMalloc(&c->lt_ws, FP8_LT_WS), "allocating cuBLASLt workspace");
            CU_TRY(cudaMalloc((void **)&c->fp8_sx, sizeof(float) * (size_t)max_tokens), "allocating fp8 scales");
        }
    }
    if (c->lt && tune_y > c->tune_y_bytes) {
        if (c->tune_y) cudaFree(c->tune_y);
        c->tune_y = NULL;
        c->tune_y_bytes = 0;
        CU_TRY(cudaMalloc(&c->tune_y, tune_y), "allocating matmul tuning scratch");
        c->tune_y_bytes = tune_y;
    }
    if (wdq > c->wdq_bytes) {
        if (c->wdq) cudaFree(c->wdq);
        c->wdq = NULL;
        c->wdq_bytes = 0;
        CU_TRY(cudaMalloc(&c->wdq, wdq), "allocating dequantised weight scratch");
        c->wdq_bytes = wdq;
    }
    if (part && !c->partial) {
        CU_TRY(cudaMalloc((void **)&c->partial, part * sizeof(float)), "allocating attention scratch");
        c->partial_floats = part;
    }
    if (part && !c->counters) {
        /* splits are used only while H * T < attn_blocks * n_sm */
        size_t nc = (size_t)(attn_sm * c->n_sm);
        CU_TRY(cudaMalloc((void **)&c->counters, nc * sizeof(int)), "allocating attention counters");
        CU_TRY(cudaMemset(c->counters, 0, nc * sizeof(int)), "zeroing attention counters");
        c->n_counters = nc;
    }
    /* the fusions the build chose (cuda_fuse pass, tune/tactic.h); an engine
     * without them runs every node on its own */
    free(c->fuse_kind);
    c->fuse_kind = calloc((size_t)g->n_nodes + 1, 1);
    if (!c->fuse_kind) return tb_errorf(TB_ERR_OOM, "out of memory");
    for (int k = 0; k < g->n_nodes; k++) {
        c->fuse_kind[k] = (uint8_t)tb_tactic_fuse(g->nodes[k].tactic);
        if (c->fuse_kind[k] && !fusion_fits(g, k, c->fuse_kind[k]))
            return tb_errorf(TB_ERR_FORMAT, "engine graph: node %d (%s) has fusion tactic %d, which does not match "
                             "the nodes after it", k, tb_op_name(g->nodes[k].op), c->fuse_kind[k]);
    }
    c->fused_node = -1;
    const tb_value *ov = &g->values[g->output];
    size_t out_bytes = (size_t)tb_value_numel(g, ov, NULL) * sizeof(float);
    if (!c->h_out) {
        CU_TRY(cudaMallocHost((void **)&c->h_out, out_bytes ? out_bytes : 256), "allocating pinned logits");
        c->out_bytes = out_bytes;
    }
    free(c->seq_map); /* a second load replaces them */
    free(c->seq_last);
    c->seq_map = calloc((size_t)max_tokens, sizeof(int32_t));
    c->seq_last = calloc((size_t)max_tokens, sizeof(int32_t));
    if (!c->seq_map || !c->seq_last) return tb_errorf(TB_ERR_OOM, "out of memory");
    return TB_OK;
}

static void nn_graphs_clear(cuda_ctx *c) {
    for (int i = 0; i < c->n_nn_graphs; i++)
        if (c->nn_graphs[i].exec) cudaGraphExecDestroy(c->nn_graphs[i].exec);
    c->n_nn_graphs = 0;
    c->nn_next = 0;
    c->nn_cur = NULL;
    c->nn_mode = RUN_EAGER;
}

static double host_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* TB_CUDA_GRAPH_TIMES=1: adds the last timed step replay's GPU time to its
 * graph (its events are done: the step's outputs were read since). */
static void step_time_collect(cuda_ctx *c) {
    step_graph *sg = c->gt_step;
    c->gt_step = NULL;
    if (!sg) return;
    float ms = 0;
    if (cudaEventSynchronize(c->gt1) == cudaSuccess && cudaEventElapsedTime(&ms, c->gt0, c->gt1) == cudaSuccess) {
        sg->gt_min = sg->gt_n && sg->gt_min < ms ? sg->gt_min : ms;
        sg->gt_sum += ms;
        sg->gt_n++;
    }
    cudaGetLastError();
}

/* The step graphs' times, one line each (TB_CUDA_GRAPH_TIMES=1). */
static void step_times_log(cuda_ctx *c) {
    step_time_collect(c);
    for (int i = 0; i < c->n_graphs; i++) {
        const step_graph *sg = &c->graphs[i];
        if (!sg->gt_n) continue;
        const double gpu = sg->gt_sum / (double)sg->gt_n, gap = sg->gap_n ? sg->gap_sum / (double)sg->gap_n : 0.0;
        tb_log(TB_LOG_WARN, "cuda: step graph of %d tokens (%d rows): %ld replays, GPU time mean %.4f ms, min %.4f ms; "
               "launch to launch %.4f ms over %ld back-to-back replays (host gap %.4f ms)", sg->T, sg->R, sg->gt_n, gpu,
               sg->gt_min, gap, sg->gap_n, sg->gap_n ? gap - gpu : 0.0);
    }
}

static void graphs_clear(cuda_ctx *c) {
    if (c->gt_on) step_times_log(c);
    c->gt_step = c->gt_last = NULL;
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    c->n_graphs = 0;
}

/* (Re)sizes the staging buffers for block tables of `mb` columns. */
static tb_status stage_reserve(cuda_ctx *c, int mb) {
    if (c->h_stage && mb <= c->bt_stride) return TB_OK;
    graphs_clear(c); /* captured kernels point into the old buffers */
    if (c->h_stage) cudaFreeHost(c->h_stage);
    if (c->d_stage) cudaFree(c->d_stage);
    c->h_stage = c->d_stage = NULL;
    size_t n = (size_t)c->max_tokens * (4 + (size_t)mb);
    CU_TRY(cudaMallocHost((void **)&c->h_stage, n * sizeof(int32_t)), "allocating pinned step bindings");
    CU_TRY(cudaMalloc((void **)&c->d_stage, n * sizeof(int32_t)), "allocating device step bindings");
    c->stage_ints = n;
    c->bt_stride = mb;
    return TB_OK;
}

/* Copies the step's ids, positions, sequences, rows and the block-table rows
 * of the step's sequences (renumbered 0.. in order of appearance) to the
 * device in one transfer, and points *st at the device copies. */
/* The first step with ranks: ranks learn each other's devices through the
 * step's communicator; on distinct devices rank 0 makes an NCCL id, the
 * others read it, and all join one NCCL communicator (every rank's thread
 * is here at once: ncclCommInitRank waits for all of them). */
static tb_status tp_setup(cuda_ctx *c, const tb_step *st) {
    if (!st->comm || st->tp_size > TBC_MAX_RANKS)
        return tb_errorf(TB_ERR_INTERNAL, "cuda: a step over %d ranks without a communicator", st->tp_size);
    void *all[TBC_MAX_RANKS];
    TB_TRY(tb_comm_exchange(st->comm, st->tp_rank, &c->device, all));
    int distinct = 1;
    for (int k = 0; k < st->tp_size; k++)
        for (int j = 0; j < k; j++)
            if (*(int *)all[j] == *(int *)all[k]) distinct = 0;
    if (!distinct) {
        c->tp_mode = TP_HOST;
        return TB_OK;
    }
    pthread_once(&nccl_once, nccl_load);
    int have = nccl.comm_init_rank != NULL;
    if (st->tp_rank == 0 && have && nccl.get_unique_id(&c->nccl_id) != ncclSuccess) have = 0;
    /* every rank learns whether rank 0 has an id (and NCCL) before any waits in NCCL */
    TB_TRY(tb_comm_exchange(st->comm, st->tp_rank, have ? (void *)&c->nccl_id : NULL, all));
    for (int k = 0; k < st->tp_size; k++)
        if (!all[k])
            return tb_errorf(TB_ERR_HARDWARE, "cuda: tensor parallelism over %d GPUs needs NCCL on every rank (rank %d: "
                             "%s)", st->tp_size, k, nccl_error[0] ? nccl_error : "no NCCL id");
    ncclUniqueId id = *(ncclUniqueId *)all[0];
    CU_ON_DEVICE(c);
    NCCL_TRY(nccl.comm_init_rank(&c->nccl, st->tp_size, id, st->tp_rank), "joining the ranks' communicator");
    /* the gathered logits before their transpose: at most the output's size */
    CU_TRY(cudaMalloc((void **)&c->gather, c->out_bytes ? c->out_bytes : 64), "all_gather_cols scratch");
    c->gather_bytes = c->out_bytes;
    c->tp_mode = TP_NCCL;
    return TB_OK;
}

static tb_status cuda_step_begin(tb_backend *b, const tb_graph *g, void **bufs, int ids_value, const int32_t *ids,
                                 tb_step *st) {
    (void)g;
    cuda_ctx *c = b->ctx;
    CU_ON_DEVICE(c);
    int T = st->n_tokens, R = st->n_rows, mb = st->max_blocks;
    if (T < 1 || T > c->max_tokens || R < 0 || R > c->max_tokens)
        return tb_errorf(TB_ERR_RANGE, "cuda: a step of %d tokens (%d rows) exceeds the %d the backend was sized for",
                         T, R, c->max_tokens);
    /* the previous step's kernels (and its use of the staging) are done */
    CU_TRY(cudaStreamSynchronize(c->stream), "previous step");
    step_time_collect(c);
    TB_TRY(stage_reserve(c, mb));
    int32_t *h = c->h_stage, *h_ids = h, *h_pos = h + c->max_tokens, *h_seq = h_pos + c->max_tokens,
            *h_rows = h_seq + c->max_tokens, *h_bt = h_rows + c->max_tokens;
    memcpy(h_ids, ids, sizeof(int32_t) * (size_t)T);
    memcpy(h_pos, st->pos, sizeof(int32_t) * (size_t)T);
    memcpy(h_rows, st->rows, sizeof(int32_t) * (size_t)R);
    int n_seq = 0, max_len = 0, run = 0, longest = 0;
    for (int t = 0; t < T; t++) {
        run = t > 0 && st->seq[t] == st->seq[t - 1] ? run + 1 : 1;
        if (run > longest) longest = run;
        int s = st->seq[t], k = (t > 0 && st->seq[t - 1] == s) ? h_seq[t - 1] : -1;
        for (int i = n_seq - 1; k < 0 && i >= 0; i--) if (c->seq_map[i] == s) k = i;
        if (k < 0) {
            k = n_seq++;
            c->seq_map[k] = s;
            c->seq_last[k] = 0;
        }
        h_seq[t] = k;
        if (st->pos[t] > c->seq_last[k]) c->seq_last[k] = st->pos[t];
        if (st->pos[t] + 1 > max_len) max_len = st->pos[t] + 1;
    }
    for (int k = 0; k < n_seq; k++) {
        int nb = c->seq_last[k] / st->block_size + 1;
        memcpy(h_bt + (size_t)k * mb, st->block_tables + (size_t)c->seq_map[k] * mb, sizeof(int32_t) * (size_t)nb);
    }
    size_t n = (size_t)(h_bt - h) + (size_t)n_seq * mb;
    CU_TRY(cudaMemcpyAsync(c->d_stage, h, n * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream), "step bindings");
    int32_t *d = c->d_stage;
    bufs[ids_value] = d;
    st->pos = d + c->max_tokens;
    st->seq = d + 2 * c->max_tokens;
    st->rows = d + 3 * c->max_tokens;
    st->block_tables = d + 4 * c->max_tokens;
    c->step_max_len = max_len;
    c->step_one = n_seq == T;
    c->pdl_step = c->pdl == 1 || (c->pdl < 0 && T <= TBC_GEMV_SIMT_MAX_T);
    c->prev_kernel = 0; /* the bindings copy comes first */
    c->fused_node = -1;
    c->skip_node = -1;
    c->norm_node = -1;
    c->x16_node = -1;
    c->x8_node = -1;
    c->ys_node = -1;

    if (st->tp_size > 1 && c->tp_mode == TP_NONE) TB_TRY(tp_setup(c, st));

    /* decode buckets (and steps without a long prefill run) run as graphs */
    c->mode = RUN_EAGER;
    c->cur = NULL;
    /* steps with a run long enough for the prefill attention kernels stay
     * eager (a capture takes the decode attention kernel for every token) */
    int prefill_run = c->prefill_min > 0 && longest >= c->prefill_min;
    if (c->use_graphs && (st->tp_size <= 1 || c->tp_mode == TP_NCCL) && T <= c->graph_max_t && (T <= TBC_GEMV_MAX_T || !prefill_run)) {
        step_graph *sg = NULL;
        for (int i = 0; i < c->n_graphs && !sg; i++)
            if (c->graphs[i].T == T && c->graphs[i].R == R && c->graphs[i].one == c->step_one) sg = &c->graphs[i];
        if (!sg && c->n_graphs < MAX_GRAPHS) {
            sg = &c->graphs[c->n_graphs++];
            memset(sg, 0, sizeof *sg);
            sg->T = T;
            sg->R = R;
            sg->one = c->step_one;
        }
        if (sg && !sg->failed) {
            c->cur = sg;
            if (sg->exec) {
                c->mode = RUN_REPLAY;
            } else {
                /* a capture may time cuBLASLt's candidates (lt_pick_time):
                 * the point where the GPU has done the earlier steps */
                c->step_done_set = 0;
                if (c->lt && T > TBC_GEMV_MAX_T && T <= c->gemm_tune_t &&
                    (c->step_done || cudaEventCreateWithFlags(&c->step_done, cudaEventDisableTiming) == cudaSuccess))
                    c->step_done_set = cudaEventRecord(c->step_done, c->stream) == cudaSuccess;
                cudaGetLastError();
                CU_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "begin graph capture");
                c->mode = RUN_CAPTURE;
            }
        }
    }
    return TB_OK;
}

/* Ends a capture that went wrong: the shape runs eagerly from now on. */
static void capture_abort(cuda_ctx *c) {
    cudaGraph_t gr = NULL;
    cudaStreamEndCapture(c->stream, &gr);
    if (gr) cudaGraphDestroy(gr);
    cudaGetLastError();
    if (c->cur) c->cur->failed = 1;
    c->mode = RUN_EAGER;
}

/* After the last node: instantiate a new capture, then launch the graph. */
static tb_status graph_finish(cuda_ctx *c) {
    step_graph *sg = c->cur;
    if (c->mode == RUN_CAPTURE) {
        cudaGraph_t gr = NULL;
        cudaError_t e = cudaStreamEndCapture(c->stream, &gr);
        if (e == cudaSuccess) e = cudaGraphInstantiate(&sg->exec, gr, 0);
        if (gr) cudaGraphDestroy(gr);
        if (e != cudaSuccess) {
            sg->failed = 1;
            sg->exec = NULL;
            c->mode = RUN_EAGER;
            return cuda_fail(e, "capturing the decode step as a CUDA graph");
        }
    }
    const int timed = c->gt_on && c->mode == RUN_REPLAY && c->gt0 && c->gt1;
    c->mode = RUN_EAGER;
    if (timed) {
        const double now = host_ms();
        if (c->gt_last == sg) {
            sg->gap_sum += now - c->gt_last_ms;
            sg->gap_n++;
        }
        c->gt_last = sg;
        c->gt_last_ms = now;
        cudaEventRecord(c->gt0, c->stream);
    } else {
        c->gt_last = NULL;
    }
    CU_TRY(cudaGraphLaunch(sg->exec, c->stream), "graph launch");
    if (timed) c->gt_step = cudaEventRecord(c->gt1, c->stream) == cudaSuccess ? sg : NULL;
    return TB_OK;
}

static tb_status cuda_read_output(tb_backend *b, const void *src, size_t bytes, const float **out) {
    cuda_ctx *c = b->ctx;
    *out = NULL;
    CU_ON_DEVICE(c);
    if (bytes > c->out_bytes)
        return tb_errorf(TB_ERR_INTERNAL, "cuda: output of %zu bytes exceeds the %zu sized at load", bytes,
                         c->out_bytes);
    cudaError_t e = cudaMemcpyAsync(c->h_out, src, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return cuda_fail(e, "reading the logits");
    *out = c->h_out;
    return TB_OK;
}


/* The attention arguments of node n for this step (no split yet). */
static tbc_attn_args attn_args_of(cuda_ctx *c, const tb_node *n, void *const *bufs, const tb_step *st, int T) {
    int H = n->i[1], KV = n->i[2], hd = n->i[3] & 0xffff;
    tbc_attn_args a = {
        .T = T, .n_heads = H, .n_kv = KV, .hd = hd, .interleaved = (n->i[3] >> 16) & 1, .scale = n->f[0],
        .pos = st->pos, .seq = st->seq, .block_tables = st->block_tables, .max_blocks = st->max_blocks,
        .block_size = st->block_size, .k_cache = st->k_cache[n->i[0]], .v_cache = st->v_cache[n->i[0]],
        .kv_f16 = st->kv_dtype == TB_F16, .kv_bf16 = st->kv_dtype == TB_BF16,
        .kv_q = st->kv_dtype == TB_I8 ? TBC_KVQ_I8 : st->kv_dtype == TB_FP8_E4M3 ? TBC_KVQ_FP8 : TBC_KVQ_NONE,
        .kv_block_bytes = tb_kv_block_bytes(st->kv_dtype, st->block_size, KV, hd),
        .kv_scale_off = tb_kv_codes_bytes(st->kv_dtype, st->block_size, KV, hd), .inv_freq = bufs[n->in[1]],
        .n_splits = 1, .partial = c->partial,
        .counters = c->counters, .rope_done = 0, .split_min = c->attn_split_min, .lanes = c->attn_lanes,
        .mma = c->attn_mma, .warp_min = c->attn_warp_min, .early = c->attn_early && c->step_one,
        .merge_loop = c->attn_merge_loop,
    };
    return a;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = a, *y = b;
    return x < y + nb && y < x + na;
}

/* qmatmul node n's weight (codes, scales, zeros) and bias, as bound now. */
static void qweight_of(const tb_graph *g, const tb_node *n, void *const *bufs, tbc_qweight *w, const float **bias) {
    const tb_value *cv = &g->values[n->in[1]], *sv = &g->values[n->in[2]];
    /* inputs x, codes, scales, [bias (N)], [zeros (N, K/group)] (ir/ops.c
     * checks them against has_bias / has_zeros) */
    int has_bias = n->n_in > 3 && g->values[n->in[3]].rank == 1;
    int has_zeros = n->n_in > 3 + has_bias;
    w->type = cv->dtype == TB_I8 ? TBC_Q_I8 : cv->dtype == TB_I4 ? TBC_Q_I4 : TBC_Q_FP8;
    w->codes = bufs[n->in[1]];
    w->scales = bufs[n->in[2]];
    w->zeros = has_zeros ? bufs[n->in[3 + has_bias]] : NULL;
    w->group = sv->dims[1] > 0 ? (int)(cv->dims[1] / sv->dims[1]) : 0;
    if (bias) *bias = has_bias ? bufs[n->in[3]] : NULL;
}

static int fp8_gemm_ok(const cuda_ctx *c, const tbc_qweight *qw, const float *x, const float *bias, const float *y,
                       int T, int K, int N);

/* The matmul at `mm` can norm x (T, K) = xb in its prologue (GEMV, x and the
 * weights aligned, x not overlapping the matmul's output). A quantized
 * matmul multiplies x by the norm weight nw itself; a float one has it
 * folded into its weights by the build. */
static int norm_into_ok(cuda_ctx *c, const tb_graph *g, int mm, void *const *bufs, int T, const void *xb,
                        const void *nw) {
    const tb_node *m = &g->nodes[mm];
    const tb_value *wv = &g->values[m->in[1]];
    tbc_dtype wdt;
    int K = (int)wv->dims[1], N = (int)wv->dims[0];
    if (!c->fuse || !c->fuse_norm) return 0;
    if (m->op == TB_OP_QMATMUL) {
        tbc_qweight qw;
        const float *bias = m->n_in > 2 ? bufs[m->in[2]] : NULL;
        qweight_of(g, m, bufs, &qw, &bias);
        if (!tbc_qgemv_supports(&qw, xb, T, K) || ((uintptr_t)nw & 15)) return 0;
        /* a step that takes the FP8 GEMM (TB_CUDA_FP8_GEMM <= 8) reads a normed x */
        if (fp8_gemm_ok(c, &qw, bufs[m->in[0]], bias, bufs[m->out[0]], T, K, N)) return 0;
    } else if (!tbc_of(wv->dtype, &wdt) || K % 8 || !tbc_gemv_fuses_norm(wdt, T, K, &c->gemv) ||
               (((uintptr_t)xb | (uintptr_t)bufs[m->in[1]]) & 15)) {
        return 0;
    }
    return !overlaps(bufs[m->out[0]], sizeof(float) * (size_t)T * (size_t)N, xb, sizeof(float) * (size_t)T * K);
}

/* matmul k -> add_rmsnorm k + 1 -> matmul k + 2 can run as two GEMVs. */
static int addnorm_ok(cuda_ctx *c, const tb_graph *g, int k, void *const *bufs, int T) {
    const tb_node *m = &g->nodes[k], *an = &g->nodes[k + 1];
    const tb_value *wv = &g->values[m->in[1]];
    tbc_dtype wdt;
    int K = (int)wv->dims[1], N = (int)wv->dims[0];
    if (g->values[an->in[0]].dims[1] != N) return 0;
    if (m->op == TB_OP_QMATMUL) {
        tbc_qweight qw;
        qweight_of(g, m, bufs, &qw, NULL);
        if (!tbc_qgemv_supports(&qw, bufs[m->in[0]], T, K)) return 0;
    } else if (!tbc_of(wv->dtype, &wdt) || !tbc_gemv_fuses_norm(wdt, T, K, &c->gemv) ||
               (((uintptr_t)bufs[m->in[0]] | (uintptr_t)bufs[m->in[1]]) & 15)) {
        return 0;
    }
    size_t rb = sizeof(float) * (size_t)T * (size_t)N;
    /* res_out is written while other blocks read x */
    if (overlaps(bufs[an->out[0]], rb, bufs[m->in[0]], sizeof(float) * (size_t)T * (size_t)K)) return 0;
    if (bufs[an->out[0]] != bufs[an->in[0]] && overlaps(bufs[an->out[0]], rb, bufs[an->in[0]], rb)) return 0;
    return norm_into_ok(c, g, k + 2, bufs, T, bufs[an->out[0]], bufs[an->in[2]]);
}

/* Whether a step of T tokens of qmatmul weights qw (N, K) takes the FP8
 * tensor cores (fp8_gemm_run). */
static int fp8_gemm_ok(const cuda_ctx *c, const tbc_qweight *qw, const float *x, const float *bias, const float *y,
                       int T, int K, int N) {
    return c->fp8_gemm > 0 && c->lt && qw->type == TBC_Q_FP8 && T >= c->fp8_gemm &&
           K % 16 == 0 && N % 16 == 0 && T <= 65535 &&
           !(((uintptr_t)qw->codes | (uintptr_t)qw->scales | (uintptr_t)x | (uintptr_t)y | (uintptr_t)bias) & 15) &&
           (size_t)T * (size_t)K <= c->xconv_bytes && T <= c->max_tokens;
}

/* Whether a step of T tokens of int8 weights qw (node tactic `tactic`)
 * takes the int8 GEMM (i8_gemm_run). */
static int i8_gemm_ok(const cuda_ctx *c, const tbc_qweight *qw, const float *x, const float *bias, const float *y,
                      int T, int K, int N, uint32_t tactic) {
    return c->i8_gemm > 0 && c->lt && c->fp8_sx && qw->type == TBC_Q_I8 && T >= c->i8_gemm &&
           (c->i8_all || tb_tactic_gemv(tactic) == TB_GEMV_Q8) && K % 16 == 0 && N % 16 == 0 && T <= 65535 &&
           !(((uintptr_t)qw->codes | (uintptr_t)qw->scales | (uintptr_t)x | (uintptr_t)y | (uintptr_t)bias) & 15) &&
           (size_t)T * (size_t)K <= c->xconv_bytes && T <= c->max_tokens;
}

/* Whether a step of T tokens of quantized weights qw (N, K) can take the
 * mixed-input GEMM (its x in f16 in xconv). */
static int qgemm_ok(const cuda_ctx *c, const tbc_qweight *qw, int T, int K) {
    return c->qgemm > 0 && T > TBC_GEMV_MAX_T && T <= c->qgemm && (size_t)T * (size_t)K * 2 <= c->xconv_bytes &&
           tbc_qgemm_supports(qw, c->xconv, T, K);
}

/* The path a matmul of quantized weights qw (N, K) takes in a step of T
 * tokens: the one place that decides (run_matmul switches on it; lt 0:
 * the cuBLASLt GEMMs left out, after one declined the shape). */
enum { QP_NONE, QP_I8, QP_FP8, QP_GEMV, QP_CHUNK, QP_GEMM, QP_DEQUANT };
static int qpath_of(const cuda_ctx *c, const tbc_qweight *qw, const float *x, const float *bias, const float *y,
                    int T, int K, int N, uint32_t tactic, int lt) {
    if (lt && i8_gemm_ok(c, qw, x, bias, y, T, K, N, tactic)) return QP_I8;
    if (lt && fp8_gemm_ok(c, qw, x, bias, y, T, K, N)) return QP_FP8;
    if (T <= TBC_GEMV_MAX_T) return tbc_qgemv_supports(qw, x, T, K) ? QP_GEMV : QP_DEQUANT;
    /* chunks: ceil(T / 8) reads of the codes (int4: 0.5 bytes a weight
     * each) against the GEMM's one read and its 64-token tiles */
    if ((unsigned)qw->type <= 2 && T <= c->qchunk[qw->type] && tbc_qgemv_supports(qw, x, TBC_GEMV_MAX_T, K))
        return QP_CHUNK;
    return qgemm_ok(c, qw, T, K) ? QP_GEMM : QP_DEQUANT;
}

/* qpath_of for node n (QP_NONE: not a quantized matmul). */
static int qpath(const cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, int T) {
    if (n->op != TB_OP_QMATMUL) return QP_NONE;
    const tb_value *wv = &g->values[n->in[1]];
    const int K = (int)wv->dims[1], N = (int)wv->dims[0];
    const float *bias = NULL;
    tbc_qweight qw;
    qweight_of(g, n, bufs, &qw, &bias);
    return qpath_of(c, &qw, bufs[n->in[0]], bias, bufs[n->out[0]], T, K, N, n->tactic, 1);
}

/* Whether node n is an int8 matmul that takes the int8 GEMM in a step of T. */
static int i8_node(const cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, int T) {
    return n->op == TB_OP_QMATMUL && c->i8_gemm > 0 && T >= c->i8_gemm && qpath(c, g, n, bufs, T) == QP_I8;
}

/* Whether node n is an e4m3 matmul that takes the FP8 GEMM in a step of T. */
static int fp8_node(const cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, int T) {
    return n->op == TB_OP_QMATMUL && c->fp8_gemm > 0 && T >= c->fp8_gemm && qpath(c, g, n, bufs, T) == QP_FP8;
}

static void fp8_plan_free(struct fp8_plan *p) {
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* The weights a tuning times its candidates on: node n's and those of up
 * to LT_TUNE_W - 1 other matmuls of the same op, shape and dtype (a 7B's
 * layers), so that the products stream their weights from device memory as
 * the step does, not from L2. */
#define LT_TUNE_W 8
#define GEMM_TUNE_CAND 16
struct lt_io {
    const void *w[LT_TUNE_W];
    int nw;
};
static void lt_io_of(const tb_graph *g, const tb_node *n, void *const *bufs, struct lt_io *io) {
    const tb_value *wv = &g->values[n->in[1]];
    io->nw = 0;
    for (int k = (int)(n - g->nodes), i = 0; i < g->n_nodes && io->nw < LT_TUNE_W; i++) {
        const tb_node *m = &g->nodes[(k + i) % g->n_nodes]; /* n first */
        if (m->op != n->op) continue;
        const tb_value *mv = &g->values[m->in[1]];
        if (mv->dtype != wv->dtype || mv->dims[0] != wv->dims[0] || mv->dims[1] != wv->dims[1]) continue;
        if (m->op == TB_OP_QMATMUL) {
            tbc_qweight q;
            const float *b = NULL;
            memset(&q, 0, sizeof q);
            qweight_of(g, m, bufs, &q, &b);
            io->w[io->nw++] = q.codes;
        } else {
            io->w[io->nw++] = bufs[m->in[1]];
        }
    }
}

/* The index of the fastest of cuBLASLt's candidates h[0, n) for plan p (-1
 * where nothing could be timed: the caller takes the first): each runs io's weights once (a candidate
 * that refuses is skipped), then twice more between two events on
 * tune_stream (x: xconv's contents, whatever they are; y: tune_y, the
 * context's own scratch, as any buffer of the step's may still hold a live
 * value; launched back to back, the GPU stays ahead of the host at these
 * sizes), and must beat the best so far by 3%. The GPU is first drained of
 * the step's earlier work: the stream (eager), or the step_done event
 * recorded before a capture began. */
static int lt_pick_time(cuda_ctx *c, const struct fp8_plan *p, const cublasLtMatmulHeuristicResult_t *h, int n,
                        const struct lt_io *io) {
    void *y = c->tune_y;
    if (n < 2 || !io || io->nw < 1 || !y || (size_t)p->T * (size_t)p->N * 4 > c->tune_y_bytes) return -1;
    if (c->mode == RUN_CAPTURE ? (c->step_done_set && cudaEventSynchronize(c->step_done) != cudaSuccess)
                               : cudaStreamSynchronize(c->stream) != cudaSuccess)
        return -1;
    if (!c->tune_stream && cudaStreamCreateWithFlags(&c->tune_stream, cudaStreamNonBlocking) != cudaSuccess) {
        c->tune_stream = NULL;
        return -1;
    }
    if ((!c->tune_e0 && cudaEventCreate(&c->tune_e0) != cudaSuccess) ||
        (!c->tune_e1 && cudaEventCreate(&c->tune_e1) != cudaSuccess)) {
        cudaGetLastError();
        return -1;
    }
    const int32_t one_i = 1, zero_i = 0;
    const float one_f = p->d16 ? 1.0f / 65536.0f : 1.0f, zero_f = 0.0f;
    const void *one = p->wt == LT_I8 ? (const void *)&one_i : (const void *)&one_f;
    const void *zero = p->wt == LT_I8 ? (const void *)&zero_i : (const void *)&zero_f;
    int best = 0;
    float best_ms = -1.0f;
    for (int i = 0; i < n; i++) {
        if (h[i].state != CUBLAS_STATUS_SUCCESS || h[i].workspaceSize > FP8_LT_WS) continue;
        int ok = 1;
        for (int r = 0; r < 3 && ok; r++) {
            if (r == 1) ok = cudaEventRecord(c->tune_e0, c->tune_stream) == cudaSuccess;
            for (int j = 0; j < io->nw && ok; j++)
                ok = cublasLtMatmul(c->lt, p->op, one, io->w[j], p->la, c->xconv, p->lb, zero, y, p->lc, y, p->lc,
                                    &h[i].algo, c->lt_ws, FP8_LT_WS, c->tune_stream) == CUBLAS_STATUS_SUCCESS;
        }
        float ms = -1.0f;
        if (ok && cudaEventRecord(c->tune_e1, c->tune_stream) == cudaSuccess &&
            cudaEventSynchronize(c->tune_e1) == cudaSuccess &&
            cudaEventElapsedTime(&ms, c->tune_e0, c->tune_e1) == cudaSuccess)
            ms /= (float)(2 * io->nw);
        else
            ms = -1.0f;
        cudaStreamSynchronize(c->tune_stream);
        cudaGetLastError();
        if (ms > 0.0f && (best_ms < 0.0f || ms < best_ms * 0.97f)) {
            best = i;
            best_ms = ms;
        }
    }
    const char *wn = p->wt == LT_E4M3 ? "e4m3" : p->wt == LT_I8 ? "int8" : p->wt == LT_F16 ? "f16" : "bf16";
    if (best_ms < 0.0f) {
        tb_log(TB_LOG_DEBUG, "cuda: cuBLASLt %s matmul %d x %d x %d: none of %d candidates could be timed; the "
               "heuristic's first", wn, p->T, p->K, p->N, n);
        return -1;
    }
    tb_log(TB_LOG_DEBUG, "cuda: cuBLASLt %s matmul %d x %d x %d: candidate %d of %d timed fastest (%.2f us)", wn,
           p->T, p->K, p->N, best, n, best_ms * 1e3f);
    return best;
}

/* The kept pick of shape q's (T, K, N, d16, wt), or NULL. */
static const struct gemm_pick *gemm_pick_find(const cuda_ctx *c, const struct gemm_pick *q) {
    for (int i = 0; i < c->n_gemm_picks; i++) {
        const struct gemm_pick *o = &c->gemm_picks[i];
        if (o->T == q->T && o->K == q->K && o->N == q->N && o->d16 == q->d16 && o->wt == q->wt) return o;
    }
    return NULL;
}

/* Keeps pick q in memory (gemm_picks); a shape already there keeps its first. */
static void gemm_pick_keep(cuda_ctx *c, const struct gemm_pick *q) {
    if (gemm_pick_find(c, q)) return;
    if (c->n_gemm_picks == c->cap_gemm_picks) {
        int nc = c->cap_gemm_picks ? 2 * c->cap_gemm_picks : 32;
        void *m = realloc(c->gemm_picks, sizeof *c->gemm_picks * (size_t)nc);
        if (!m) return;
        c->gemm_picks = m;
        c->cap_gemm_picks = nc;
    }
    c->gemm_picks[c->n_gemm_picks++] = *q;
}

/* A record "lt T K N d16 wt idx" of the tune cache, checked before use. */
static void tune_cache_record(void *user, const int *v) {
    cuda_ctx *c = user;
    const struct gemm_pick q = {v[0], v[1], v[2], v[3], v[4], v[5]};
    if (q.T <= TBC_GEMV_MAX_T || q.T > (1 << 20) || q.K < 1 || q.K > (1 << 24) || q.N < 1 || q.N > (1 << 24) ||
        (q.d16 != 0 && q.d16 != 1) || q.wt < LT_E4M3 || q.wt > LT_BF16 || q.idx < 0 || q.idx >= GEMM_TUNE_CAND)
        return;
    gemm_pick_keep(c, &q);
}

/* Opens the tune cache of this device (once): its identity names all that
 * cuBLASLt's candidate list depends on (GPU, driver, cuBLASLt, the count of
 * candidates and workspace asked for, TBC_LT_PLAN_VERSION for the plans'
 * own attributes); the picks there join gemm_picks. */
#define TBC_LT_PLAN_VERSION 1
static void tune_cache_open(cuda_ctx *c) {
    c->tune_cache = -1;
    int drv = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    snprintf(c->tune_ident, sizeof c->tune_ident, "cuda gpu=%s cc=%d.%d sms=%d driver=%d cublasLt=%zu cand=%d ws=%zu plan=%d",
             c->name, c->cc_major, c->cc_minor, c->n_sm, drv, cublasLtGetVersion(), GEMM_TUNE_CAND, FP8_LT_WS,
             TBC_LT_PLAN_VERSION);
    if (!tb_tune_cache_open(c->tune_ident, c->tune_path, sizeof c->tune_path, "lt", 6, tune_cache_record, c,
                            "cuBLASLt picks"))
        return;
    c->tune_cache = 1;
}

/* Makes p's descriptors and algorithm for shape (T, K, N) of operands wt
 * (the product in f32, f16 with d16, int32 for LT_I8). 0 when cuBLASLt has
 * no algorithm for it. Steps of TBC_GEMV_MAX_T < T <= gemm_tune_t with io
 * (the weights to time on) take the fastest of the heuristic's first
 * GEMM_TUNE_CAND candidates (lt_pick_time; once per shape, gemm_picks),
 * others its first. (Asking for the two scales as cuBLASLt's outer-vector
 * scale modes, which would drop scale_out, was tried: cuBLAS 13.1 on the
 * H200 gave no plan for these f32 outputs at any 7B shape.) */
static int fp8_plan_make(cuda_ctx *c, struct fp8_plan *p, int T, int K, int N, int d16, int wt,
                         const struct lt_io *io) {
    memset(p, 0, sizeof *p);
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h[GEMM_TUNE_CAND];
    int found = 0;
    const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    const size_t ws = FP8_LT_WS;
    memset(h, 0, sizeof h);
    const int i8 = wt == LT_I8;
    const cudaDataType_t ab = i8 ? CUDA_R_8I : wt == LT_F16 ? CUDA_R_16F : wt == LT_BF16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
    const cudaDataType_t cd = i8 ? CUDA_R_32I : d16 ? CUDA_R_16F : CUDA_R_32F;
    const int tune = io && c->gemm_tune_t > 0 && T > TBC_GEMV_MAX_T && T <= c->gemm_tune_t;
    if (tune && c->tune_cache == 0) tune_cache_open(c);
    const struct gemm_pick key = {T, K, N, d16, wt, 0}, *kept = tune ? gemm_pick_find(c, &key) : NULL;
    const int pick = kept ? kept->idx : -1;
    /* a kept index refers to the whole list (asked for in full: no
     * assumption that a shorter list is its prefix) */
    const int want = tune ? GEMM_TUNE_CAND : 1;
    int bad = cublasLtMatmulDescCreate(&p->op, i8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                       i8 ? CUDA_R_32I : CUDA_R_32F) ||
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) ||
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    bad = bad || cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)K, (uint64_t)N, K) ||
          cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)K, (uint64_t)T, K) ||
          cublasLtMatrixLayoutCreate(&p->lc, cd, (uint64_t)N, (uint64_t)T, N) ||
          cublasLtMatmulPreferenceCreate(&pref) ||
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ||
          cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, want, h, &found) ||
          found < 1;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (bad) {
        fp8_plan_free(p);
        return 0;
    }
    p->T = T;
    p->K = K;
    p->N = N;
    p->d16 = d16;
    p->wt = wt;
    int idx = 0;
    if (pick >= 0) {
        idx = pick < found ? pick : 0;
    } else if (tune) {
        const int timed = lt_pick_time(c, p, h, found, io);
        idx = timed < 0 ? 0 : timed;
        const struct gemm_pick q = {T, K, N, d16, wt, idx};
        gemm_pick_keep(c, &q);
        if (timed >= 0 && c->tune_cache > 0) { /* kept for the next run */
            const int v[6] = {T, K, N, d16, wt, idx};
            tb_tune_cache_append(c->tune_path, c->tune_ident, "lt", 6, v);
        }
    }
    p->algo = h[idx].algo;
    return 1;
}

/* The plan of shape (T, K, N): cached, or made now (the oldest entry gives
 * way when all FP8_PLANS are taken; a shape tuned once keeps its pick). NULL
 * when cuBLASLt has no algorithm. g, n, bufs (NULL: no tuning) name the
 * matmul, for the weights a tuning times on. */
static struct fp8_plan *fp8_plan_of(cuda_ctx *c, int T, int K, int N, int d16, int wt, const tb_graph *g,
                                    const tb_node *n, void *const *bufs) {
    for (int i = 0; i < c->n_fp8_plan; i++) {
        struct fp8_plan *q = &c->fp8_plan[i];
        if (q->T == T && q->K == K && q->N == N && q->d16 == d16 && q->wt == wt) return q;
    }
    struct fp8_plan p;
    struct lt_io io;
    io.nw = 0;
    if (g && n && bufs) lt_io_of(g, n, bufs, &io);
    if (!fp8_plan_make(c, &p, T, K, N, d16, wt, io.nw ? &io : NULL)) return NULL;
    int slot = c->n_fp8_plan < FP8_PLANS ? c->n_fp8_plan++ : c->fp8_plan_next++ % FP8_PLANS;
    fp8_plan_free(&c->fp8_plan[slot]);
    c->fp8_plan[slot] = p;
    return &c->fp8_plan[slot];
}

/* y (T, N) = x dq(w)^T (+ bias) on the FP8 tensor cores: x quantised per
 * token to e4m3, cuBLASLt's product of the codes in f32 (TN: both operands
 * K-contiguous, as FP8 needs), then both scales and the bias. A shape
 * cuBLASLt refuses returns TB_ERR_UNSUPPORTED before anything is launched,
 * and fp8_gemm turns off (logged once). */
static tb_status fp8_gemm_run(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, const float *x,
                              const tbc_qweight *qw, const float *bias, float *y, int T, int K, int N, int x_done,
                              int ys_to) {
    /* a reader that takes the scales takes an f16 product (half the bytes
     * written and read) where cuBLASLt has a plan for it */
    struct fp8_plan *p = ys_to >= 0 && (c->x8_mask & 16) ? fp8_plan_of(c, T, K, N, 1, LT_E4M3, g, n, bufs) : NULL;
    if (!p) p = fp8_plan_of(c, T, K, N, 0, LT_E4M3, g, n, bufs);
    if (!p) {
        tb_log(TB_LOG_WARN, "cuda: cuBLASLt has no fp8 matmul for %d x %d x %d; e4m3 weights take the dequantised "
               "f16 path from now on", T, K, N);
        c->fp8_gemm = 0;
        return TB_ERR_UNSUPPORTED;
    }
    /* f16: |sum of K products of codes| <= K 448^2 < 4 K 2^16, so alpha =
     * 2^-e with 2^e >= 4 K keeps it below 65504 */
    float one = 1.0f, mul = 1.0f;
    const float zero = 0.0f;
    if (p->d16) {
        while (mul < 4.0f * (float)K) mul *= 2.0f;
        one = 1.0f / mul;
    }
    cudaError_t e = cudaSuccess;
    if (!x_done) { /* else the RMSNorm before wrote xconv and fp8_sx (x8_target) */
        e = tbc_quant_x_fp8(x, T, K, c->xconv, c->fp8_sx, c->stream);
        if (e != cudaSuccess) return cuda_fail(e, "fp8 quantise launch");
    }
    cublasStatus_t bs = cublasLtMatmul(c->lt, p->op, &one, qw->codes, p->la, c->xconv, p->lb, &zero, y, p->lc, y, p->lc,
                                       &p->algo, c->lt_ws, FP8_LT_WS, c->stream);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return tb_errorf(TB_ERR_INTERNAL, "cublasLt: fp8 matmul (%d x %d x %d): %s", T, K, N, blas_status_name(bs));
    if (ys_to >= 0) { /* node ys_to scales y as it reads it (ys_target) */
        c->ys_node = ys_to;
        c->ys_sw = qw->scales;
        c->ys_bias = bias;
        c->ys_raw16 = p->d16;
        c->ys_mul = mul;
        return TB_OK;
    }
    e = tbc_scale_out(y, T, N, c->fp8_sx, qw->scales, bias, c->stream);
    return e == cudaSuccess ? TB_OK : cuda_fail(e, "fp8 scale launch");
}

/* y (T, N) = x dq(w)^T (+ bias) for int8 weights on the int8 tensor cores
 * (W8A8): x rounded per token to int8 (tbc_quant_x_i8), cuBLASLt's int32
 * product of the codes (TN), then both scales and the bias in place. A
 * shape cuBLASLt refuses returns TB_ERR_UNSUPPORTED before any launch, and
 * i8_gemm turns off (logged once). */
static tb_status i8_gemm_run(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, const float *x,
                             const tbc_qweight *qw, const float *bias, float *y, int T, int K, int N) {
    struct fp8_plan *p = fp8_plan_of(c, T, K, N, 0, LT_I8, g, n, bufs);
    if (!p) {
        tb_log(TB_LOG_WARN, "cuda: cuBLASLt has no int8 matmul for %d x %d x %d; int8 weights keep f16 activations "
               "from now on", T, K, N);
        c->i8_gemm = 0;
        return TB_ERR_UNSUPPORTED;
    }
    const int32_t one = 1, zero = 0;
    cudaError_t e = tbc_quant_x_i8(x, T, K, c->xconv, c->fp8_sx, c->stream);
    if (e != cudaSuccess) return cuda_fail(e, "int8 quantise launch");
    cublasStatus_t bs = cublasLtMatmul(c->lt, p->op, &one, qw->codes, p->la, c->xconv, p->lb, &zero, y, p->lc, y, p->lc,
                                       &p->algo, c->lt_ws, FP8_LT_WS, c->stream);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return tb_errorf(TB_ERR_INTERNAL, "cublasLt: int8 matmul (%d x %d x %d): %s", T, K, N, blas_status_name(bs));
    e = tbc_scale_out_i32(y, T, N, c->fp8_sx, qw->scales, bias, c->stream);
    return e == cudaSuccess ? TB_OK : cuda_fail(e, "int8 scale launch");
}

static int ys_target(cuda_ctx *c, const tb_graph *g, int k, void *const *bufs, int T);

static tb_status run_matmul(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, const tb_step *st,
                            int T) {
    const tb_value *wv = &g->values[n->in[1]];
    int K = (int)wv->dims[1], N = (int)wv->dims[0];
    const float *x = bufs[n->in[0]], *bias = n->n_in > 2 ? bufs[n->in[2]] : NULL;
    const void *w = bufs[n->in[1]];
    float *y = bufs[n->out[0]];
    tbc_dtype wdt = TBC_F16;
    const int quant = n->op == TB_OP_QMATMUL;
    tbc_qweight qw;
    memset(&qw, 0, sizeof qw);
    if (quant) qweight_of(g, n, bufs, &qw, &bias);
    else if (!tbc_of(wv->dtype, &wdt)) return tb_errorf(TB_ERR_UNSUPPORTED, "cuda: matmul weight dtype");
    const int k = (int)(n - g->nodes);
    const float *xq = c->norm_node == k ? c->norm_x : x;
    const int x8 = c->x8_node == k;
    c->x8_node = -1;
    int qp = quant ? qpath_of(c, &qw, x, bias, y, T, K, N, n->tactic, 1) : QP_NONE;
    if (qp == QP_I8 || qp == QP_FP8) {
        tb_status ls = qp == QP_I8 ? i8_gemm_run(c, g, n, bufs, x, &qw, bias, y, T, K, N)
                                   : fp8_gemm_run(c, g, n, bufs, x, &qw, bias, y, T, K, N, x8,
                                                  ys_target(c, g, k, bufs, T));
        if (ls != TB_ERR_UNSUPPORTED) return ls;
        qp = qpath_of(c, &qw, x, bias, y, T, K, N, n->tactic, 0); /* declined: the next path */
    }
    /* x8_target checked that this matmul takes the FP8 path: its f32 x was never written */
    if (x8)
        return tb_errorf(TB_ERR_INTERNAL, "cuda: fp8 matmul %d x %d x %d left the FP8 path after its x was quantised",
                         T, K, N);
    if (qp == QP_CHUNK && c->x16_node != k) {
        /* chunks of TBC_GEMV_MAX_T tokens on the quantized GEMV, no epilogue
         * (the nodes after the matmul run on their own at this T) */
        tbc_gemv_epi epi;
        memset(&epi, 0, sizeof epi);
        for (int t0 = 0; t0 < T; t0 += TBC_GEMV_MAX_T) {
            const int tc = T - t0 < TBC_GEMV_MAX_T ? T - t0 : TBC_GEMV_MAX_T;
            CU_TRY(tbc_qgemv(x + (size_t)t0 * K, &qw, bias, y + (size_t)t0 * N, tc, K, N, &epi, c->stream),
                   "quantized gemv launch");
        }
        return TB_OK;
    }
    if (qp == QP_GEMM || (qp == QP_CHUNK && qgemm_ok(c, &qw, T, K))) {
        /* the mixed-input GEMM on f16 x (written by the node before, or
         * converted now); K splits' partials added in a cluster or through
         * the dequantisation scratch (qgemm.h) */
        if (c->x16_node != k)
            CU_TRY(tbc_convert_f32(x, c->xconv, TBC_F16, (size_t)T * K, c->stream), "convert launch");
        c->x16_node = -1;
        CU_TRY(tbc_qgemm(c->xconv, &qw, bias, y, T, K, N, (float *)c->wdq, c->wdq_bytes, c->stream),
               "quantized gemm launch");
        return TB_OK;
    }
    if (quant && !(T <= TBC_GEMV_MAX_T && tbc_qgemv_supports(&qw, xq, T, K))) {
        /* not for the quantized GEMV: the weights dequantised to f16, then
         * the f16 paths (the norm fusion was not chosen for this shape) */
        if ((size_t)N * (size_t)K * 2 > c->wdq_bytes)
            return tb_errorf(TB_ERR_INTERNAL, "cuda: dequantised weight scratch of %zu bytes is short of %zu",
                             c->wdq_bytes, (size_t)N * (size_t)K * 2);
        CU_TRY(tbc_dequant_f16(&qw, K, N, c->wdq, c->stream), "dequantise launch");
        w = c->wdq;
    }
    if (T <= TBC_GEMV_MAX_T) {
        tbc_gemv_epi epi;
        memset(&epi, 0, sizeof epi);
        int kind = c->fuse ? c->fuse_kind[k] & 3 : FUSE_NONE;
        if (c->norm_node == k) {
            /* the skipped (add_)rmsnorm: norm x in the prologue */
            x = c->norm_x;
            epi.norm = 1;
            epi.norm_eps = c->norm_eps;
            epi.norm_w = quant ? c->norm_w : NULL;
            c->norm_node = -1;
        }
        const tb_node *nx = kind ? &g->nodes[k + 1] : NULL;
        if (kind == FUSE_GLU) {
            float *act = bufs[nx->out[0]];
            size_t act_bytes = sizeof(float) * (size_t)T * (size_t)(N / 2);
            if (!overlaps(act, act_bytes, x, sizeof(float) * (size_t)T * (size_t)K) &&
                !(bias && overlaps(act, act_bytes, bias, sizeof(float) * (size_t)N))) {
                epi.mode = TBC_EPI_GLU;
                epi.glu = act;
            }
        } else if (kind == FUSE_ROPE && (st->kv_dtype == TB_F16 || st->kv_dtype == TB_BF16 || st->kv_dtype == TB_F32)) {
            epi.mode = TBC_EPI_ROPE;
            epi.attn = attn_args_of(c, nx, bufs, st, T);
        } else if (c->fuse && (c->fuse_kind[k] & FUSE_ADDNORM) && addnorm_ok(c, g, k, bufs, T)) {
            const tb_node *an = &g->nodes[k + 1];
            epi.mode = TBC_EPI_ADD;
            epi.res = bufs[an->in[0]];
            epi.res_out = bufs[an->out[0]];
            c->skip_node = k + 1;
            c->norm_node = k + 2;
            c->norm_x = bufs[an->out[0]];
            c->norm_w = bufs[an->in[2]];
            c->norm_eps = an->f[0];
        }
        if (quant && w != c->wdq) {
            epi.q8 = tb_tactic_gemv(n->tactic) == TB_GEMV_Q8;
            CU_TRY(tbc_qgemv(x, &qw, bias, y, T, K, N, &epi, c->stream), "quantized gemv launch");
            if (epi.mode == TBC_EPI_GLU || epi.mode == TBC_EPI_ROPE) c->fused_node = k + 1;
            return TB_OK;
        }
        tbc_gemv_opts o = c->gemv;
        /* the kernel `turbine build --device cuda` timed fastest for this
         * weight (none stored: the default) */
        int rk = tb_tactic_gemv(n->tactic);
        if (c->tune && c->gemv.simt_kind == TBC_SIMT_ROW && rk && !quant) o.simt_kind = rk - 1;
        CU_TRY(tbc_gemv_ex(x, w, wdt, bias, y, T, K, N, &epi, &o, c->stream), "gemv launch");
        if (epi.mode == TBC_EPI_GLU || epi.mode == TBC_EPI_ROPE) c->fused_node = k + 1;
        return TB_OK;
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t bs;
    /* row-major y (T, N) = x (T, K) w^T is column-major y^T (N, T) = w^T' x^T */
    if (wdt == TBC_F32) {
        bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, K, x, K, &zero, y, N);
    } else {
        size_t need = (size_t)T * (size_t)K * 2;
        if (need > c->xconv_bytes)
            return tb_errorf(TB_ERR_INTERNAL, "cuda: matmul scratch of %zu bytes is short of %zu", c->xconv_bytes,
                             need);
        if (c->x16_node != (int)(n - g->nodes))
            CU_TRY(tbc_convert_f32(x, c->xconv, wdt, (size_t)T * K, c->stream), "convert launch");
        c->x16_node = -1;
        cudaDataType_t ab = wdt == TBC_F16 ? CUDA_R_16F : CUDA_R_16BF;
        /* steps that time cuBLASLt's candidates: its plan (fp8_plan_make);
         * others, dequantised weights (their node's codes are no f16
         * matrix to time on) or none made, cublasGemmEx's default */
        struct fp8_plan *p = !quant && c->gemm_lt && c->lt && c->gemm_tune_t > 0 && T <= c->gemm_tune_t
                                 ? fp8_plan_of(c, T, K, N, 0, wdt == TBC_F16 ? LT_F16 : LT_BF16, g, n, bufs)
                                 : NULL;
        if (p)
            bs = cublasLtMatmul(c->lt, p->op, &one, w, p->la, c->xconv, p->lb, &zero, y, p->lc, y, p->lc, &p->algo,
                                c->lt_ws, FP8_LT_WS, c->stream);
        else
            bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, ab, K, c->xconv, ab, K, &zero, y,
                              CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (bs != CUBLAS_STATUS_SUCCESS)
        return tb_errorf(TB_ERR_INTERNAL, "cublas: matmul (%d x %d x %d): %s", T, K, N, blas_status_name(bs));
    if (bias) CU_TRY(tbc_add_bias(y, bias, T, N, c->stream), "bias launch");
    return TB_OK;
}

/* Splits the keys of a (token, head) when the blocks of (heads x tokens)
 * leave the SMs idle (a block takes one q head, or a kv head's q heads with
 * TB_CUDA_ATTN_MMA=4, and 5 at large batches). */
static void attn_splits(cuda_ctx *c, tbc_attn_args *a) {
    const int pairs = a->n_heads * a->T; /* (token, q head)s: a partial and a counter each */
    int blocks = pairs / tbc_attention_q_heads_per_block(a), target = c->attn_blocks * c->n_sm;
    int graphed = c->mode == RUN_CAPTURE; /* the split count is baked into the graph */
    if (blocks < target && (graphed || c->step_max_len >= 128)) {
        int sp = (target + blocks - 1) / blocks, by_len = c->step_max_len / 64;
        if (!graphed && sp > by_len) sp = by_len;
        if (sp > MAX_SPLITS) sp = MAX_SPLITS;
        if (sp > 1 && (size_t)pairs * (size_t)sp * (size_t)(a->hd + 2) <= c->partial_floats &&
            (size_t)pairs <= c->n_counters)
            a->n_splits = sp;
    }
}

/* The attention kernel for tokens t0 .. t1-1 of the step (q, k, v rotated
 * and stored). With a->q16 the rows of qkv hold f16 (rope_kv wrote q so
 * after an FP8 GEMM's f16 product): token t0's row starts t0 rows of
 * halves in, not of floats. */
static tb_status attn_kernel_range(cuda_ctx *c, const tbc_attn_args *a, float *qkv, float *out, int t0, int t1) {
    tbc_attn_args r = *a;
    r.T = t1 - t0;
    r.pos += t0;
    r.seq += t0;
    r.rope_done = 1;
    r.n_splits = 1;
    attn_splits(c, &r);
    size_t row = (size_t)(a->n_heads + 2 * a->n_kv) * (size_t)a->hd;
    float *q0 = a->q16 ? (float *)((uint16_t *)qkv + (size_t)t0 * row) : qkv + (size_t)t0 * row;
    CU_TRY(tbc_attention(&r, q0, out + (size_t)t0 * (size_t)a->n_heads * a->hd, c->stream), "attention launch");
    return TB_OK;
}

static tb_status grow(void **p, size_t *have, size_t need, const char *what) {
    if (need <= *have) return TB_OK;
    cudaFree(*p);
    *p = NULL;
    *have = 0;
    CU_TRY(cudaMalloc(p, need), what);
    *have = need;
    return TB_OK;
}

/* Attention of the n tokens t0.. of one sequence (compact slot `slot`) as
 * GEMMs: S = scale Q K^T, P = causal softmax(S), O = P V, per query head,
 * in passes of at most PREFILL_S_BYTES of scores. */
static tb_status attention_gemm_run(cuda_ctx *c, const tbc_attn_args *a, float *qkv, float *out, int slot, int t0,
                                    int n) {
    const int32_t *hp = c->h_stage + c->max_tokens;
    int H = a->n_heads, hd = a->hd, L = 0;
    for (int t = t0; t < t0 + n; t++) if (hp[t] + 1 > L) L = hp[t] + 1;
    /* f16 GEMMs for an f16 cache and for int8 / fp8 (gathered dequantised) */
    int h16 = a->kv_f16 || a->kv_q != TBC_KVQ_NONE;
    size_t esz = h16 ? 2 : 4;
    size_t ld = c->pf_k_bytes / ((size_t)H * hd * esz); /* keys the scratch has room for */
    if ((size_t)L > ld) {
        ld = ((size_t)L + 255) / 256 * 256;
        size_t kvb = (size_t)H * ld * hd * esz;
        TB_TRY(grow(&c->pf_k, &c->pf_k_bytes, kvb, "allocating prefill attention keys"));
        TB_TRY(grow(&c->pf_v, &c->pf_v_bytes, kvb, "allocating prefill attention values"));
    }
    TB_TRY(grow(&c->pf_q, &c->pf_q_bytes, (size_t)n * H * hd * esz, "allocating prefill attention queries"));
    int nq = (int)(PREFILL_S_BYTES / ((size_t)H * (size_t)L * sizeof(float)));
    if (nq < 1) nq = 1;
    if (nq > n) nq = n;
    TB_TRY(grow((void **)&c->pf_s, &c->pf_s_bytes, (size_t)H * nq * L * sizeof(float),
                "allocating prefill attention scores"));
    TB_TRY(grow(&c->pf_p, &c->pf_p_bytes, (size_t)H * nq * L * esz, "allocating prefill attention scratch"));
    CU_TRY(tbc_attn_gather(a, qkv, slot, t0, n, L, (int)ld, c->pf_q, c->pf_k, c->pf_v, c->stream),
           "prefill attention gather");
    cudaDataType_t ty = h16 ? CUDA_R_16F : CUDA_R_32F;
    const float one = 1.0f, zero = 0.0f, scale = a->scale;
    for (int i0 = 0; i0 < n; i0 += nq) {
        int ni = n - i0 < nq ? n - i0 : nq, Lc = 0;
        for (int t = t0 + i0; t < t0 + i0 + ni; t++) if (hp[t] + 1 > Lc) Lc = hp[t] + 1;
        /* column-major: S^T (Lc, ni) = K (hd, Lc)^T Q (hd, ni), per head */
        const char *q = (const char *)c->pf_q + (size_t)i0 * H * hd * esz;
        cublasStatus_t bs = cublasGemmStridedBatchedEx(
            c->blas, CUBLAS_OP_T, CUBLAS_OP_N, Lc, ni, hd, &scale, c->pf_k, ty, hd, (long long)ld * hd, q, ty,
            H * hd, hd, &zero, c->pf_s, CUDA_R_32F, Lc, (long long)ni * Lc, H, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS)
            return tb_errorf(TB_ERR_INTERNAL, "cublas: prefill attention scores: %s", blas_status_name(bs));
        CU_TRY(tbc_attn_softmax(c->pf_s, c->pf_p, h16, a->pos + t0 + i0, H, ni, Lc, c->stream),
               "prefill attention softmax");
        /* O^T (hd, ni) = V^T (hd, Lc) P^T (Lc, ni), written into out's rows */
        bs = cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, ni, Lc, &one, c->pf_v, ty, hd,
                                        (long long)ld * hd, c->pf_p, ty, Lc, (long long)ni * Lc, &zero,
                                        out + (size_t)(t0 + i0) * H * hd, CUDA_R_32F, H * hd, hd, H,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS)
            return tb_errorf(TB_ERR_INTERNAL, "cublas: prefill attention output: %s", blas_status_name(bs));
    }
    return TB_OK;
}

static void ys_take(cuda_ctx *c, const tb_graph *g, const tb_node *n, const float **sw, const float **bias,
                    int *raw16, float *mul);

static tb_status run_attention(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs,
                               const tb_step *st, int T, int rope_done) {
    tbc_attn_args a = attn_args_of(c, n, bufs, st, T);
    a.rope_done = rope_done;
    ys_take(c, g, n, &a.ys_sw, &a.ys_bias, &a.ys_raw16, &a.ys_mul); /* rope_kv applies the qkv GEMM's scales */
    if (a.ys_sw) a.ys_sx = c->fp8_sx;
    if (st->kv_dtype != TB_F16 && st->kv_dtype != TB_BF16 && st->kv_dtype != TB_F32 && !tb_kv_quantized(st->kv_dtype))
        return tb_errorf(TB_ERR_UNSUPPORTED, "cuda: KV cache dtype %s", tb_dtype_name(st->kv_dtype));
    float *qkv = bufs[n->in[0]], *out = bufs[n->out[0]];
    /* a bf16 cache takes the flash kernel's bf16 form (TB_CUDA_FLASH_BF16=0:
     * the attention kernel also for long prefills): the GEMM path rounds q and P to f16 for cuBLAS, which a
     * bf16 cache's values may exceed. An int8 / fp8 cache takes the flash
     * kernel too (its tiles dequantised to f16 as they are staged; the GEMMs
     * with TB_CUDA_PREFILL=gemm: rows gathered dequantised to f16) */
    const int bf16_flash = a.kv_bf16 && c->prefill_flash && c->flash_bf16 && tbc_flash_supports(a.hd, 0, 1, 0);
    if (c->prefill_min > 0 && c->mode == RUN_EAGER && T >= c->prefill_min && (!a.kv_bf16 || bf16_flash)) {
        /* runs of one sequence long enough for GEMMs; the other tokens take
         * the attention kernel */
        const int32_t *hs = c->h_stage + 2 * c->max_tokens;
        if (!a.rope_done) CU_TRY(tbc_rope_kv(&a, qkv, c->stream), "rope/kv launch");
        a.rope_done = 1;
        a.ys_sx = a.ys_sw = a.ys_bias = NULL; /* qkv is scaled now */
        a.q16 = a.ys_raw16;                   /* and q f16 if the product was */
        a.ys_raw16 = 0;
        int t = 0, small = -1;
        while (t < T) {
            int u = t + 1;
            while (u < T && hs[u] == hs[t]) u++;
            if (u - t >= c->prefill_min) {
                if (small >= 0) TB_TRY(attn_kernel_range(c, &a, qkv, out, small, t));
                small = -1;
                if (c->prefill_flash && tbc_flash_supports(a.hd, a.kv_f16, a.kv_bf16, a.kv_q))
                    CU_TRY(tbc_flash_prefill(&a, qkv, out, hs[t], t, u - t, c->stream), "flash prefill launch");
                else
                    TB_TRY(attention_gemm_run(c, &a, qkv, out, hs[t], t, u - t));
            } else if (small < 0) {
                small = t;
            }
            t = u;
        }
        if (small >= 0) TB_TRY(attn_kernel_range(c, &a, qkv, out, small, T));
        return TB_OK;
    }
    attn_splits(c, &a);
    if (c->skip_attn) return TB_OK;
    CU_TRY(tbc_attention(&a, qkv, out, c->stream), "attention launch");
    return TB_OK;
}

static tb_status run_node_eager(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs,
                                const tb_step *st);
static void nn_capture_abort(cuda_ctx *c);

static tb_status cuda_run_node(tb_backend *b, const tb_graph *g, const tb_node *n, void *const *bufs,
                               const tb_step *st) {
    cuda_ctx *c = b->ctx;
    if (tb_op_is_nn(n->op)) {
        if (c->nn_mode == RUN_REPLAY) return TB_OK;
        if (!c->nn.stream) { c->nn.stream = c->stream; c->nn.blas = c->blas; }
        tb_status s = tbn_run_node(&c->nn, g, n, bufs, st);
        if (s != TB_OK && c->nn_mode == RUN_CAPTURE) nn_capture_abort(c);
        return s;
    }
    int last = n == &g->nodes[g->n_nodes - 1];
    if (c->mode == RUN_REPLAY) return last ? graph_finish(c) : TB_OK;
    tb_status s = run_node_eager(c, g, n, bufs, st);
    if (c->mode == RUN_CAPTURE) {
        if (s != TB_OK) capture_abort(c);
        else if (last) return graph_finish(c);
    }
    return s;
}

static tb_status run_node_op(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs,
                             const tb_step *st, int fused);

/* The tensor-parallel collectives between ranks whose buffers this device
 * reaches (ranks on one GPU; the NCCL path for several GPUs is not built):
 * the ranks meet on the host through the step's communicator (core/comm.h)
 * after their streams drained, exchange buffer pointers, and each sums (or
 * copies) its share on its own stream. Eager only: a step with ranks is
 * never captured (the host meetings would not replay). */
static tb_status run_collective(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs,
                                const tb_step *st, int T) {
    const tb_value *x = &g->values[n->in[0]];
    int C = (int)x->dims[1], ranks = st->tp_size > 1 ? st->tp_size : 1;
    size_t count = (size_t)T * (size_t)C;
    cudaStream_t s = c->stream;
    if (n->op == TB_OP_ALL_GATHER_COLS && n->i[0] /* ranks */ != ranks)
        return tb_errorf(TB_ERR_INVALID_ARG, "all_gather_cols over %d ranks in a step of %d", n->i[0], ranks);
    if (ranks > 1 && c->tp_mode == TP_NCCL) {
        if (n->op == TB_OP_ALL_REDUCE) {
            NCCL_TRY(nccl.all_reduce(bufs[n->in[0]], bufs[n->out[0]], count, ncclFloat32, ncclSum, c->nccl, s),
                     "all_reduce");
            return TB_OK;
        }
        size_t need = sizeof(float) * count * (size_t)ranks;
        if (need > c->gather_bytes) /* sized at set-up for the largest output (captures point at it) */
            return tb_errorf(TB_ERR_INTERNAL, "cuda: all_gather_cols of %zu bytes exceeds the %zu sized at load",
                             need, c->gather_bytes);
        NCCL_TRY(nccl.all_gather(bufs[n->in[0]], c->gather, count, ncclFloat32, c->nccl, s), "all_gather");
        tbc_rank_ptrs p;
        memset(&p, 0, sizeof p);
        for (int k = 0; k < ranks; k++) p.p[k] = c->gather + count * (size_t)k;
        CU_TRY(tbc_gather_cols(p, ranks, bufs[n->out[0]], T, C, s), "all_gather_cols launch");
        return TB_OK;
    }
    if (ranks == 1 || n->op == TB_OP_ALL_REDUCE)
        if (bufs[n->out[0]] != bufs[n->in[0]])
            CU_TRY(cudaMemcpyAsync(bufs[n->out[0]], bufs[n->in[0]], sizeof(float) * count, cudaMemcpyDeviceToDevice,
                                   s),
                   "collective copy");
    if (ranks == 1) return TB_OK;
    if (!st->comm || ranks > TBC_MAX_RANKS || c->mode != RUN_EAGER || c->tp_mode != TP_HOST)
        return tb_errorf(TB_ERR_INTERNAL, "cuda: %s over %d ranks needs the step's communicator and an eager step",
                         tb_op_name(n->op), ranks);
    void *all[TBC_MAX_RANKS];
    tbc_rank_ptrs p;
    memset(&p, 0, sizeof p);
    CU_TRY(cudaStreamSynchronize(s), "collective: this rank's work");
    void *mine = n->op == TB_OP_ALL_REDUCE ? bufs[n->out[0]] : bufs[n->in[0]];
    TB_TRY(tb_comm_exchange(st->comm, st->tp_rank, mine, all));
    for (int k = 0; k < ranks; k++) p.p[k] = all[k];
    if (n->op == TB_OP_ALL_REDUCE)
        CU_TRY(tbc_allreduce_slice(p, ranks, count, st->tp_rank, s), "all_reduce launch");
    else
        CU_TRY(tbc_gather_cols(p, ranks, bufs[n->out[0]], T, C, s), "all_gather_cols launch");
    CU_TRY(cudaStreamSynchronize(s), "collective");
    return tb_comm_barrier(st->comm, st->tp_rank);
}

/* Runs node n's kernels. Programmatic dependent launch only inside a capture
 * and only after another of our kernels (not after a copy or cuBLAS). */
static tb_status run_node_eager(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs,
                                const tb_step *st) {
    int k = (int)(n - g->nodes), fused = c->fused_node == k;
    c->fused_node = -1;
    if (c->ys_node >= 0 && c->ys_node != k) /* its reader never ran: y would stay unscaled */
        return tb_errorf(TB_ERR_INTERNAL, "cuda: the deferred fp8 scales of node %d's input were not applied",
                         c->ys_node);
    if (fused && n->op == TB_OP_SILU_MUL) return TB_OK; /* the GEMV wrote its output */
    if (c->skip_node == k) { /* add_rmsnorm: the GEMVs around it do its work */
        c->skip_node = -1;
        return TB_OK;
    }
    int T = (int)tb_step_rows(g, n->in[0], st);
    if (n->op == TB_OP_RMSNORM && (c->fuse_kind[k] & FUSE_NORM) &&
        norm_into_ok(c, g, k + 1, bufs, T, bufs[n->in[0]], bufs[n->in[1]])) {
        c->norm_node = k + 1;
        c->norm_x = bufs[n->in[0]];
        c->norm_w = bufs[n->in[1]];
        c->norm_eps = n->f[0];
        return TB_OK;
    }
    const int qp = qpath(c, g, n, bufs, T);
    int ours = n->op != TB_OP_ROPE && !(is_mm(n) && T > TBC_GEMV_MAX_T && qp != QP_CHUNK && qp != QP_GEMM) &&
               qp != QP_FP8 && qp != QP_I8;
    tbc_set_pdl(c->pdl_step && ours && c->prev_kernel && c->mode == RUN_CAPTURE);
    tb_status r = run_node_op(c, g, n, bufs, st, fused);
    tbc_set_pdl(0);
    c->prev_kernel = ours;
    return r;
}

/* Whether node k, an rmsnorm, add_rmsnorm or silu_mul, writes the next
 * node's x as e4m3 codes and token scales (tbc_act_fp8) for the FP8 GEMM:
 * the next node is an e4m3 matmul that will take that path (every condition
 * of fp8_gemm_ok and a cuBLASLt plan for the shape, checked now) and reads
 * only k's output (FUSE_X16's condition). */
static int x8_ok(cuda_ctx *c, const tb_graph *g, int k, void *const *bufs, int T) {
    const tb_node *n = &g->nodes[k];
    if (!c->x8 || !c->x16 || !(c->fuse_kind[k] & FUSE_X16) || !c->lt || !c->fp8_sx ||
        k + 1 >= g->n_nodes)
        return 0;
    const int bit = n->op == TB_OP_RMSNORM ? 1 : n->op == TB_OP_ADD_RMSNORM ? 2 : n->op == TB_OP_SILU_MUL ? 4 : 0;
    if (!(c->x8_mask & bit)) return 0;
    const tb_node *mm = &g->nodes[k + 1];
    if (mm->op != TB_OP_QMATMUL || g->values[mm->in[1]].dtype != TB_FP8_E4M3) return 0;
    if (bufs[mm->in[0]] != bufs[n->out[n->op == TB_OP_ADD_RMSNORM ? 1 : 0]]) return 0;
    const tb_value *wv = &g->values[mm->in[1]];
    const int K = (int)wv->dims[1], N = (int)wv->dims[0];
    if (K > TBC_ACT_FP8_MAX_D) return 0;
    tbc_qweight qw;
    const float *bias = mm->n_in > 2 ? bufs[mm->in[2]] : NULL;
    memset(&qw, 0, sizeof qw);
    qweight_of(g, mm, bufs, &qw, &bias);
    return fp8_gemm_ok(c, &qw, bufs[mm->in[0]], bias, bufs[mm->out[0]], T, K, N) &&
           fp8_plan_of(c, T, K, N, 0, LT_E4M3, g, mm, bufs);
}

/* Where node n (x8_ok) writes its output: the codes into xconv, the scales
 * into fp8_sx, and the matmul after it skips tbc_quant_x_fp8. NULL: the
 * usual output. */
static void *x8_target(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, int T) {
    int k = (int)(n - g->nodes);
    if (!x8_ok(c, g, k, bufs, T)) return NULL;
    c->x8_node = k + 1;
    return c->xconv;
}

/* The node that applies FP8 matmul k's scales as it reads its output (its
 * tbc_scale_out skipped), or -1: the next node is k's output's only reader
 * and either the attention (FUSE_ROPE: its rope_kv kernel scales the row
 * first, each block the heads it owns) or writes the FP8 GEMM's codes after
 * it (x8_ok; FUSE_GLU: a silu_mul; FUSE_ADDNORM: an add_rmsnorm's d, its
 * normed output read by a matmul alone). */
static int ys_target(cuda_ctx *c, const tb_graph *g, int k, void *const *bufs, int T) {
    const tb_node *m = &g->nodes[k], *nx = k + 1 < g->n_nodes ? &g->nodes[k + 1] : NULL;
    const int kind = c->fuse ? c->fuse_kind[k] : 0;
    if (!nx || c->x8 != 1 || !(c->x8_mask & 8)) return -1;
    if ((kind & FUSE_ROPE) && nx->op == TB_OP_ATTENTION && nx->in[0] == m->out[0] && c->fused_node != k + 1)
        return k + 1;
    if (!((kind & FUSE_GLU) && nx->op == TB_OP_SILU_MUL && nx->in[0] == m->out[0]) &&
        !((kind & FUSE_ADDNORM) && nx->op == TB_OP_ADD_RMSNORM && nx->in[1] == m->out[0] && nx->in[0] != m->out[0]))
        return -1;
    return x8_ok(c, g, k + 1, bufs, T) ? k + 1 : -1;
}

/* Where node n writes its output for the next node, a cuBLAS matmul, in the
 * matmul's weight type (FUSE_X16); NULL: in f32 as usual. */
static void *x16_target(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, int T, tbc_dtype *dt) {
    int k = (int)(n - g->nodes);
    if (!c->x16 || !(c->fuse_kind[k] & FUSE_X16) || T <= TBC_GEMV_MAX_T) return NULL;
    const tb_node *mm = &g->nodes[k + 1];
    const tb_value *wv = &g->values[mm->in[1]];
    if (mm->op == TB_OP_QMATMUL) {
        /* f16 x for the mixed-input GEMM and for cuBLAS on dequantised
         * weights; the FP8 and int8 GEMMs and the chunked GEMV read f32 x */
        const int qp = qpath(c, g, mm, bufs, T);
        if (qp == QP_FP8 || qp == QP_I8 || qp == QP_CHUNK) return NULL;
        *dt = TBC_F16;
    } else if (!tbc_of(wv->dtype, dt)) {
        return NULL;
    }
    if (*dt == TBC_F32 || (size_t)T * (size_t)wv->dims[1] * 2 > c->xconv_bytes) return NULL;
    c->x16_node = k + 1;
    return c->xconv;
}

/* The deferred scales of node n's input (ys_target), or NULLs: taken (the
 * pending state cleared); *raw16 and *mul as c->ys_raw16, ys_mul (0 and 1
 * when none). */
static void ys_take(cuda_ctx *c, const tb_graph *g, const tb_node *n, const float **sw, const float **bias,
                    int *raw16, float *mul) {
    *sw = *bias = NULL;
    *raw16 = 0;
    *mul = 1.0f;
    if (c->ys_node != (int)(n - g->nodes)) return;
    c->ys_node = -1;
    *sw = c->ys_sw;
    *bias = c->ys_bias;
    *raw16 = c->ys_raw16;
    *mul = c->ys_mul;
}

/* Node n did not take the fused kernel after all: its input `in` gets the
 * skipped tbc_scale_out now (never expected: ys_target checked x8_ok; an
 * f16 product cannot be scaled in place into f32 and fails the step). */
static tb_status ys_apply(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs, int T, int in,
                          const float *sw, const float *bias, int raw16) {
    if (!sw) return TB_OK;
    if (raw16)
        return tb_errorf(TB_ERR_INTERNAL, "cuda: node %d left the fused kernel after its input came as an f16 product",
                         (int)(n - g->nodes));
    const tb_value *v = &g->values[n->in[in]];
    CU_TRY(tbc_scale_out(bufs[n->in[in]], T, (int)v->dims[1], c->fp8_sx, sw, bias, c->stream), "fp8 scale launch");
    return TB_OK;
}

static tb_status run_node_op(cuda_ctx *c, const tb_graph *g, const tb_node *n, void *const *bufs,
                             const tb_step *st, int fused) {
    const tb_value *v0 = &g->values[n->in[0]];
    int T = (int)tb_step_rows(g, n->in[0], st);
    cudaStream_t s = c->stream;
    switch (n->op) {
    case TB_OP_EMBEDDING: {
        const tb_value *tab = &g->values[n->in[1]];
        tbc_dtype dt;
        if (!tbc_of(tab->dtype, &dt)) return tb_errorf(TB_ERR_UNSUPPORTED, "cuda: embedding dtype");
        CU_TRY(tbc_embedding(bufs[n->in[0]], bufs[n->in[1]], dt, bufs[n->out[0]], T, (int)tab->dims[1],
                             n->i[0] /* vocab_offset */, (int)tab->dims[0], s),
               "embedding launch");
        return TB_OK;
    }
    case TB_OP_ALL_REDUCE:
    case TB_OP_ALL_GATHER_COLS:
        return run_collective(c, g, n, bufs, st, T);
    case TB_OP_RMSNORM: {
        void *q8 = x8_target(c, g, n, bufs, T);
        if (q8) {
            CU_TRY(tbc_act_fp8(TBC_ACT_NORM, bufs[n->in[0]], NULL, bufs[n->in[1]], NULL, T, (int)v0->dims[1], n->f[0],
                               NULL, NULL, 0, 1.0f, q8, c->fp8_sx, s),
                   "rmsnorm launch");
            return TB_OK;
        }
        tbc_dtype dt16 = TBC_F16;
        void *y16 = x16_target(c, g, n, bufs, T, &dt16);
        CU_TRY(tbc_rmsnorm(bufs[n->in[0]], bufs[n->in[1]], bufs[n->out[0]], T, (int)v0->dims[1], n->f[0], y16, dt16,
                           s),
               "rmsnorm launch");
        return TB_OK;
    }
    case TB_OP_ADD_RMSNORM: {
        const float *sw = NULL, *sb = NULL;
        int r16;
        float mul;
        ys_take(c, g, n, &sw, &sb, &r16, &mul);
        void *q8 = x8_target(c, g, n, bufs, T);
        if (q8) {
            CU_TRY(tbc_act_fp8(TBC_ACT_ADDNORM, bufs[n->in[0]], bufs[n->in[1]], bufs[n->in[2]], bufs[n->out[0]], T,
                               (int)v0->dims[1], n->f[0], sw, sb, r16, mul, q8, c->fp8_sx, s),
                   "add_rmsnorm launch");
            return TB_OK;
        }
        TB_TRY(ys_apply(c, g, n, bufs, T, 1, sw, sb, r16));
        tbc_dtype dt16 = TBC_F16;
        void *y16 = x16_target(c, g, n, bufs, T, &dt16);
        CU_TRY(tbc_add_rmsnorm(bufs[n->in[0]], bufs[n->in[1]], bufs[n->in[2]], bufs[n->out[0]], bufs[n->out[1]], T,
                               (int)v0->dims[1], n->f[0], y16, dt16, s),
               "add_rmsnorm launch");
        return TB_OK;
    }
    case TB_OP_MATMUL:
    case TB_OP_QMATMUL:
        return run_matmul(c, g, n, bufs, st, T);
    case TB_OP_ROPE: {
        /* positions: the step's (the runtime binds no other position input) */
        int C = (int)v0->dims[1];
        CU_TRY(cudaMemcpyAsync(bufs[n->out[0]], bufs[n->in[0]], sizeof(float) * (size_t)T * (size_t)C,
                               cudaMemcpyDeviceToDevice, s),
               "rope copy");
        CU_TRY(tbc_rope(bufs[n->out[0]], C, st->pos, bufs[n->in[2]], T, n->i[0], n->i[1], n->i[2], s),
               "rope launch");
        return TB_OK;
    }
    case TB_OP_ATTENTION:
        return run_attention(c, g, n, bufs, st, T, fused);
    case TB_OP_SILU_MUL: {
        const float *sw = NULL, *sb = NULL;
        int r16;
        float mul;
        ys_take(c, g, n, &sw, &sb, &r16, &mul);
        void *q8 = x8_target(c, g, n, bufs, T);
        if (q8) {
            CU_TRY(tbc_act_fp8(TBC_ACT_SILU, bufs[n->in[0]], NULL, NULL, NULL, T, (int)v0->dims[1] / 2, 0.0f, sw, sb,
                               r16, mul, q8, c->fp8_sx, s),
                   "silu_mul launch");
            return TB_OK;
        }
        TB_TRY(ys_apply(c, g, n, bufs, T, 0, sw, sb, r16));
        tbc_dtype dt16 = TBC_F16;
        void *y16 = x16_target(c, g, n, bufs, T, &dt16);
        CU_TRY(tbc_silu_mul(bufs[n->in[0]], bufs[n->out[0]], T, (int)v0->dims[1] / 2, y16, dt16, s),
               "silu_mul launch");
        return TB_OK;
    }
    case TB_OP_ADD:
        CU_TRY(tbc_add(bufs[n->in[0]], bufs[n->in[1]], bufs[n->out[0]],
                       (size_t)T * (size_t)(v0->rank > 1 ? v0->dims[1] : 1), s),
               "add launch");
        return TB_OK;
    case TB_OP_GATHER_ROWS:
        CU_TRY(tbc_gather_rows(bufs[n->in[0]], st->rows, bufs[n->out[0]], st->n_rows, (int)v0->dims[1], s),
               "gather_rows launch");
        return TB_OK;
    default:
        return tb_errorf(TB_ERR_UNSUPPORTED, "cuda backend: op %s is not supported", tb_op_name(n->op));
    }
}

/* ---------------------------------------------------------------- general engines */

static tb_status cuda_upload(tb_backend *b, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = b->ctx;
    if (!bytes) return TB_OK;
    CU_ON_DEVICE(c);
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "copying to the device");
    CU_TRY(cudaStreamSynchronize(c->stream), "copying to the device");
    return TB_OK;
}

static tb_status cuda_download(tb_backend *b, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = b->ctx;
    CU_ON_DEVICE(c);
    /* a copy of nothing still waits for the stream: the executor's per-node
     * profile (--dump-profile) relies on it */
    if (!bytes) {
        CU_TRY(cudaStreamSynchronize(c->stream), "waiting for the device");
        return TB_OK;
    }
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "copying from the device");
    CU_TRY(cudaStreamSynchronize(c->stream), "copying from the device");
    return TB_OK;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* Everything a captured run bakes in: the nodes (op, inputs, outputs,
 * attributes: one backend may run several graphs, even at one address),
 * every value's buffer, dtype and dims, which values the host computed and
 * their contents (shapes, axes, starts, ... that kernels took as
 * arguments). Inputs' host data and weights are not hashed: their device
 * copies are what the kernels read. */
static uint64_t nn_run_key(const tb_graph *g, void *const *bufs, const tb_step *st) {
    uint64_t h = 0x243f6a8885a308d3ull;
    h = mix(h, (uint64_t)(uintptr_t)g);
    for (int k = 0; k < g->n_nodes; k++) {
        const tb_node *n = &g->nodes[k];
        h = mix(h, (uint64_t)n->op << 32 | (uint64_t)(uint32_t)n->tactic);
        for (int i = 0; i < n->n_in; i++) h = mix(h, (uint64_t)n->in[i]);
        for (int o = 0; o < n->n_out; o++) h = mix(h, (uint64_t)n->out[o] << 1);
        for (int i = 0; i < TB_NODE_INTS; i++) h = mix(h, (uint64_t)(uint32_t)n->i[i]);
        for (int i = 0; i < TB_NODE_FLOATS; i++) {
            uint32_t u;
            memcpy(&u, &n->f[i], 4);
            h = mix(h, u);
        }
    }
    for (int v = 0; v < g->n_values; v++) {
        const tb_view *w = &st->views[v];
        h = mix(h, (uint64_t)(uintptr_t)bufs[v]);
        h = mix(h, (uint64_t)w->dtype << 8 | (uint64_t)w->rank);
        for (int d = 0; d < w->rank; d++) h = mix(h, (uint64_t)w->dims[d]);
        if (g->values[v].kind != TB_VAL_ACT) continue;
        h = mix(h, w->data != NULL);
        if (!w->data) continue;
        int64_t n = 1;
        for (int d = 0; d < w->rank; d++) n *= w->dims[d];
        size_t bytes = (size_t)n * (w->dtype == TB_I64 || w->dtype == TB_F64 ? 8 : w->dtype == TB_F32 || w->dtype == TB_I32 ? 4
                                    : w->dtype == TB_F16 || w->dtype == TB_BF16 ? 2 : 1);
        const uint8_t *p = w->data;
        size_t i = 0;
        for (; i + 8 <= bytes; i += 8) {
            uint64_t u;
            memcpy(&u, p + i, 8);
            h = mix(h, u);
        }
        for (; i < bytes; i++) h = mix(h, p[i]);
    }
    return h;
}

static void nn_capture_abort(cuda_ctx *c) {
    cudaGraph_t gr = NULL;
    cudaStreamEndCapture(c->stream, &gr);
    if (gr) cudaGraphDestroy(gr);
    cudaGetLastError();
    if (c->nn_cur) c->nn_cur->failed = 1;
    c->nn_cur = NULL;
    c->nn_mode = RUN_EAGER;
}

static tb_status cuda_run_begin(tb_backend *b, const tb_graph *g, void *const *bufs, const tb_step *st) {
    cuda_ctx *c = b->ctx;
    CU_ON_DEVICE(c);
    if (c->nn_mode == RUN_CAPTURE) nn_capture_abort(c); /* a run that never ended */
    c->nn_mode = RUN_EAGER;
    c->nn_cur = NULL;
    tbn_layout_plan(&c->nn, g); /* which activations this run holds channels-last */
    if (!c->use_graphs || !st || !st->views) return TB_OK;
    if (c->nn.grew) { /* scratch moved: every capture points at freed memory */
        for (int i = 0; i < c->n_nn_graphs; i++)
            if (c->nn_graphs[i].exec) {
                cudaGraphExecDestroy(c->nn_graphs[i].exec);
                c->nn_graphs[i].exec = NULL;
            }
        c->nn.grew = 0;
    }
    if (c->gt_pending) { /* the previous replay: its events are done (its outputs were read) */
        float ms = 0;
        if (cudaEventSynchronize(c->gt1) == cudaSuccess && cudaEventElapsedTime(&ms, c->gt0, c->gt1) == cudaSuccess) {
            c->gt_sum += ms;
            c->gt_min = c->gt_n && c->gt_min < ms ? c->gt_min : ms;
            c->gt_n++;
        }
        cudaGetLastError();
        c->gt_pending = 0;
    }
    uint64_t key = nn_run_key(g, bufs, st);
    nn_graph *e = NULL;
    for (int i = 0; i < c->n_nn_graphs && !e; i++)
        if (c->nn_graphs[i].key == key) e = &c->nn_graphs[i];
    if (!e) { /* a new key: a free slot, else round robin */
        if (c->n_nn_graphs < MAX_NN_GRAPHS) {
            e = &c->nn_graphs[c->n_nn_graphs++];
        } else {
            e = &c->nn_graphs[c->nn_next];
            c->nn_next = (c->nn_next + 1) % MAX_NN_GRAPHS;
            if (e->exec) cudaGraphExecDestroy(e->exec);
        }
        memset(e, 0, sizeof *e);
        e->key = key;
    }
    if (e->failed) return TB_OK;
    c->nn_cur = e;
    if (e->exec) {
        c->nn_mode = RUN_REPLAY;
    } else if (e->runs >= 1) {
        CU_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "begin graph capture");
        c->nn_mode = RUN_CAPTURE;
    } else {
        e->runs++;
    }
    return TB_OK;
}

static tb_status cuda_run_end(tb_backend *b, const tb_graph *g, void *const *bufs, const tb_step *st) {
    (void)g; (void)bufs; (void)st;
    cuda_ctx *c = b->ctx;
    nn_graph *e = c->nn_cur;
    int mode = c->nn_mode;
    c->nn_mode = RUN_EAGER;
    c->nn_cur = NULL;
    if (mode == RUN_EAGER || !e) return TB_OK;
    if (mode == RUN_CAPTURE) {
        cudaGraph_t gr = NULL;
        cudaError_t err = cudaStreamEndCapture(c->stream, &gr);
        if (err == cudaSuccess && c->nn.grew) err = cudaErrorInvalidValue; /* scratch moved while capturing */
        if (err == cudaSuccess && c->gt_on) {
            /* with the graph times: how many kernels (and copies) the run is */
            size_t nodes = 0;
            if (cudaGraphGetNodes(gr, NULL, &nodes) == cudaSuccess)
                tb_log(TB_LOG_WARN, "cuda: general run captured as a CUDA graph of %zu nodes (kernels and copies)",
                       nodes);
        }
        if (err == cudaSuccess) err = cudaGraphInstantiate(&e->exec, gr, 0);
        if (gr) cudaGraphDestroy(gr);
        if (err != cudaSuccess) {
            cudaGetLastError();
            e->failed = 1;
            e->exec = NULL;
            return cuda_fail(err, "capturing the run as a CUDA graph (it runs eagerly from now on; run it again)");
        }
    }
    int timed = c->gt_on && mode == RUN_REPLAY && c->gt0 && c->gt1;
    if (timed) cudaEventRecord(c->gt0, c->stream);
    CU_TRY(cudaGraphLaunch(e->exec, c->stream), "graph launch");
    if (timed) c->gt_pending = cudaEventRecord(c->gt1, c->stream) == cudaSuccess;
    return TB_OK;
}

static void cuda_destroy(tb_backend *b) {
    cuda_ctx *c = b->ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->gt_n)
        tb_log(TB_LOG_WARN, "cuda: %ld graph replays of general runs: GPU time mean %.4f ms, min %.4f ms "
               "(TB_CUDA_GRAPH_TIMES, CUDA events around each replay)", c->gt_n, c->gt_sum / (double)c->gt_n,
               c->gt_min);
    if (c->gt0) cudaEventDestroy(c->gt0);
    if (c->gt1) cudaEventDestroy(c->gt1);
    graphs_clear(c);
    nn_graphs_clear(c);
    if (c->nccl) nccl.comm_destroy(c->nccl);
    cudaFree(c->gather);
    tbn_ctx_free(&c->nn);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->weights);
    cudaFree(c->xconv);
    cudaFree(c->wdq);
    cudaFree(c->lt_ws);
    cudaFree(c->fp8_sx);
    cudaFree(c->tune_y);
    free(c->gemm_picks);
    if (c->tune_e0) cudaEventDestroy(c->tune_e0);
    if (c->tune_e1) cudaEventDestroy(c->tune_e1);
    if (c->step_done) cudaEventDestroy(c->step_done);
    if (c->tune_stream) cudaStreamDestroy(c->tune_stream);
    for (int i = 0; i < c->n_fp8_plan; i++) fp8_plan_free(&c->fp8_plan[i]);
    if (c->lt) cublasLtDestroy(c->lt);
    cudaFree(c->partial);
    cudaFree(c->counters);
    cudaFree(c->pf_q);
    cudaFree(c->pf_k);
    cudaFree(c->pf_v);
    cudaFree(c->pf_s);
    cudaFree(c->pf_p);
    free(c->fuse_kind);
    cudaFree(c->d_stage);
    if (c->h_stage) cudaFreeHost(c->h_stage);
    if (c->h_out) cudaFreeHost(c->h_out);
    if (c->h_samp) cudaFreeHost(c->h_samp);
    if (c->h_sout) cudaFreeHost(c->h_sout);
    cudaFree(c->d_samp);
    cudaFree(c->d_pen_raw);
    cudaFree(c->d_sout);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->seq_map);
    free(c->seq_last);
    free(c);
    b->ctx = NULL;
}

/* tb_sample_row / tb_sample_result and the kernels' views of them */
_Static_assert(sizeof(tb_sample_row) == sizeof(tbc_sample_row), "sample row layout");
_Static_assert(offsetof(tb_sample_row, u) == offsetof(tbc_sample_row, u), "sample row layout");
_Static_assert(offsetof(tb_sample_row, pen_n) == offsetof(tbc_sample_row, pen_n), "sample row layout");
_Static_assert(offsetof(tb_sample_row, top_p) == offsetof(tbc_sample_row, top_p), "sample row layout");
_Static_assert(offsetof(tb_sample_row, top_k) == offsetof(tbc_sample_row, top_k), "sample row layout");
_Static_assert(sizeof(tb_sample_result) == sizeof(tbc_sample_out), "sample result layout");
_Static_assert(offsetof(tb_sample_result, top_logprobs) == offsetof(tbc_sample_out, top_logprobs),
               "sample result layout");
_Static_assert(TB_TOP_LOGPROBS_MAX == TBC_TOP_MAX, "top logprobs");

static tb_status samp_reserve(cuda_ctx *c, size_t pairs) {
    if (c->h_samp && pairs <= c->pen_cap) return TB_OK;
    size_t cap = pairs > c->pen_cap ? pairs + pairs / 2 : c->pen_cap;
    if (cap < 4096) cap = 4096;
    if (c->h_samp) cudaFreeHost(c->h_samp);
    cudaFree(c->d_samp);
    cudaFree(c->d_pen_raw);
    c->h_samp = c->d_samp = NULL;
    c->d_pen_raw = NULL;
    c->pen_cap = 0;
    size_t bytes = sizeof(tbc_sample_row) * (size_t)c->max_tokens + 2 * sizeof(int32_t) * cap;
    CU_TRY(cudaMallocHost(&c->h_samp, bytes), "allocating pinned sampling parameters");
    CU_TRY(cudaMalloc(&c->d_samp, bytes), "allocating sampling parameters");
    CU_TRY(cudaMalloc((void **)&c->d_pen_raw, sizeof(float) * cap), "allocating sampling scratch");
    if (!c->h_sout) {
        CU_TRY(cudaMallocHost((void **)&c->h_sout, sizeof(tbc_sample_out) * (size_t)c->max_tokens),
               "allocating pinned sampling results");
        CU_TRY(cudaMalloc((void **)&c->d_sout, sizeof(tbc_sample_out) * (size_t)c->max_tokens),
               "allocating sampling results");
    }
    c->pen_cap = cap;
    return TB_OK;
}

/* One transfer of parameters and pairs, the kernel, one transfer back. */
static tb_status cuda_sample(tb_backend *b, void *logits, int n_rows, int vocab, const tb_sample_row *rows,
                             const int32_t *pen_tok, const int32_t *pen_cnt, int n_pen, tb_sample_result *out) {
    cuda_ctx *c = b->ctx;
    CU_ON_DEVICE(c);
    if (n_rows < 1 || n_rows > c->max_tokens)
        return tb_errorf(TB_ERR_RANGE, "cuda: sampling %d rows (at most %d)", n_rows, c->max_tokens);
    TB_TRY(samp_reserve(c, (size_t)(n_pen > 0 ? n_pen : 0)));
    size_t rb = sizeof(tbc_sample_row) * (size_t)c->max_tokens;
    uint8_t *h = c->h_samp, *d = c->d_samp;
    int32_t *h_tok = (int32_t *)(h + rb), *h_cnt = h_tok + c->pen_cap;
    memcpy(h, rows, sizeof(tbc_sample_row) * (size_t)n_rows);
    if (n_pen > 0) {
        memcpy(h_tok, pen_tok, sizeof(int32_t) * (size_t)n_pen);
        memcpy(h_cnt, pen_cnt, sizeof(int32_t) * (size_t)n_pen);
    }
    /* rows, and the pairs when there are any (one copy covers both) */
    size_t bytes = n_pen > 0 ? (size_t)((uint8_t *)(h_cnt + n_pen) - h) : sizeof(tbc_sample_row) * (size_t)n_rows;
    CU_TRY(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c->stream), "sampling parameters");
    int32_t *d_tok = (int32_t *)(d + rb), *d_cnt = d_tok + c->pen_cap;
    CU_TRY(tbc_sample(logits, n_rows, vocab, (const tbc_sample_row *)d, d_tok, d_cnt, c->d_pen_raw, c->d_sout,
                      c->stream),
           "sampling launch");
    CU_TRY(cudaMemcpyAsync(c->h_sout, c->d_sout, sizeof(tbc_sample_out) * (size_t)n_rows, cudaMemcpyDeviceToHost,
                           c->stream),
           "sampling results");
    CU_TRY(cudaStreamSynchronize(c->stream), "sampling");
    memcpy(out, c->h_sout, sizeof(tbc_sample_out) * (size_t)n_rows);
    return TB_OK;
}

/* The attention kernels read f32, f16 and bf16 caches and int8 / fp8 KV
 * blocks (core/kv_layout.h; the runtime sizes the pool by
 * tb_kv_block_bytes). */
static tb_status cuda_check_kv_dtype(tb_backend *b, tb_dtype kv) {
    (void)b;
    if (kv == TB_F32 || kv == TB_F16 || kv == TB_BF16 || tb_kv_quantized(kv)) return TB_OK;
    return tb_errorf(TB_ERR_UNSUPPORTED, "the cuda backend has no %s KV cache kernels; use --kv-dtype f16, bf16, f32, "
                     "int8 or fp8", tb_kv_dtype_label(kv));
}

static const tb_backend_i cuda_iface = {
    .name = "cuda",
    .supports_op = cuda_supports_op,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .load_weights = cuda_load_weights,
    .step_begin = cuda_step_begin,
    .run_node = cuda_run_node,
    .read_output = cuda_read_output,
    .sample = cuda_sample,
    .upload = cuda_upload,
    .download = cuda_download,
    .run_begin = cuda_run_begin,
    .run_end = cuda_run_end,
    .check_kv_dtype = cuda_check_kv_dtype,
    .destroy = cuda_destroy,
    .tune = cuda_tune,
};

/* ---------------------------------------------------------------- device */

/* Selects `device` and reads its properties; a clear error when there is no
 * GPU or no such index. */
static tb_status device_open(int device, struct cudaDeviceProp *prop) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return tb_errorf(TB_ERR_HARDWARE, "no CUDA GPU is available on this machine (%s); device cuda:%d needs one",
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", device);
    if (device < 0 || device >= count)
        return tb_errorf(TB_ERR_HARDWARE, "device cuda:%d does not exist (this machine has %d CUDA GPU%s: cuda:0%s)",
                         device, count, count == 1 ? "" : "s", count > 1 ? " .. cuda:N-1" : "");
    CU_TRY(cudaSetDevice(device), "cudaSetDevice");
    CU_TRY(cudaGetDeviceProperties(prop, device), "cudaGetDeviceProperties");
    return TB_OK;
}

tb_status tb_backend_cuda_memory(int device, uint64_t *total, uint64_t *free_bytes) {
    struct cudaDeviceProp prop;
    TB_TRY(device_open(device, &prop));
    size_t f = 0, t = 0;
    CU_TRY(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *total = t;
    *free_bytes = f;
    return TB_OK;
}

tb_status tb_backend_cuda_create(int device, int max_ctx, tb_backend **out) {
    *out = NULL;
    struct cudaDeviceProp prop;
    TB_TRY(device_open(device, &prop));
    tb_backend *b = calloc(1, sizeof *b);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) { free(b); free(c); return tb_errorf(TB_ERR_OOM, "out of memory"); }
    b->iface = &cuda_iface;
    b->ctx = c;
    b->n_threads = 1;
    c->device = device;
    c->max_ctx = max_ctx;
    c->n_sm = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) { tb_status s = cuda_fail(e, "cudaStreamCreate"); tb_backend_free(b); return s; }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        tb_backend_free(b);
        return tb_errorf(TB_ERR_INTERNAL, "cublas: cannot create a handle: %s", blas_status_name(bs));
    }
    cublasSetStream(c->blas, c->stream);
    /* exact f32 products for f32 engines: no TF32 */
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
    const char *ge = getenv("TB_CUDA_GRAPHS");
    c->use_graphs = !(ge && !strcmp(ge, "0"));
    const char *gtimes = getenv("TB_CUDA_GRAPH_TIMES");
    if (gtimes && !strcmp(gtimes, "1") && cudaEventCreate(&c->gt0) == cudaSuccess && cudaEventCreate(&c->gt1) == cudaSuccess)
        c->gt_on = 1;
    cudaGetLastError();
    const char *gre = getenv("TB_CUDA_GEMV_ROT");
    tbc_set_gemv_rot(gre && *gre ? atoi(gre) : TB_CUDA_DEFAULT_GEMV_ROT);
    const char *gtm = getenv("TB_CUDA_GEMV_TMA");
    tbc_set_gemv_tma(gtm && *gtm ? atoi(gtm) : TB_CUDA_DEFAULT_GEMV_TMA);
    const char *que = getenv("TB_CUDA_QGEMV_U");
    const char *qve = getenv("TB_CUDA_QGEMV_V");
    tbc_set_qgemv_unroll(que && *que ? atoi(que) : 2);
    tbc_set_qgemv_variant(qve && *qve ? atoi(qve) : -1);
    const char *qxw = getenv("TB_CUDA_QGEMV_XW");
    tbc_set_qgemv_xw(qxw && *qxw ? atoi(qxw) : -1);
    const char *qse = getenv("TB_CUDA_QGEMV_SIMT"), *qsu = getenv("TB_CUDA_QGEMV_SIMT_U");
    tbc_set_qgemv_simt(qse && *qse ? atoi(qse) : 0, qsu && *qsu ? atoi(qsu) : 1);
    const char *f8e = getenv("TB_CUDA_FP8_GEMM");
    c->fp8_gemm = f8e && *f8e ? atoi(f8e) : TB_CUDA_DEFAULT_FP8_GEMM;
    if (c->fp8_gemm < 0) c->fp8_gemm = 0;
    const char *qce = getenv("TB_CUDA_QCHUNK");
    c->qchunk[TBC_Q_I8] = TB_CUDA_DEFAULT_QCHUNK_I8;
    c->qchunk[TBC_Q_FP8] = TB_CUDA_DEFAULT_QCHUNK_FP8;
    c->qchunk[TBC_Q_I4] = TB_CUDA_DEFAULT_QCHUNK_I4;
    if (qce && *qce) c->qchunk[TBC_Q_I8] = c->qchunk[TBC_Q_FP8] = c->qchunk[TBC_Q_I4] = atoi(qce);
    const char *qge = getenv("TB_CUDA_QGEMM");
    c->qgemm = qge && *qge ? atoi(qge) : TB_CUDA_DEFAULT_QGEMM;
    const char *qgb = getenv("TB_CUDA_QGEMM_BN");
    tbc_set_qgemm_bn(qgb && *qgb ? atoi(qgb) : 0);
    const char *qgc = getenv("TB_CUDA_QGEMM_CFG"), *qgs = getenv("TB_CUDA_QGEMM_SPLIT");
    if (qgc && *qgc) tbc_set_qgemm_cfg(atoi(qgc));
    tbc_set_qgemm_split(qgs && *qgs ? atoi(qgs) : 0);
    const char *qgl = getenv("TB_CUDA_QGEMM_CLUSTER");
    tbc_set_qgemm_cluster(qgl && *qgl ? atoi(qgl) : -1);
    const char *i8e = getenv("TB_CUDA_I8_GEMM"), *i8a = getenv("TB_CUDA_I8_GEMM_ALL");
    c->i8_gemm = i8e && *i8e ? atoi(i8e) : TBC_GEMV_MAX_T + 1;
    if (c->i8_gemm < 0) c->i8_gemm = 0;
    if (c->i8_gemm > 0 && c->i8_gemm <= TBC_GEMV_MAX_T) c->i8_gemm = TBC_GEMV_MAX_T + 1;
    c->i8_all = i8a && !strcmp(i8a, "1");
    const char *xe = getenv("TB_CUDA_X16");
    c->x16 = !(xe && !strcmp(xe, "0"));
    const char *x8e = getenv("TB_CUDA_FP8_FUSE"), *acte = getenv("TB_CUDA_ACT_THREADS");
    c->x8 = x8e && *x8e ? atoi(x8e) : 1;
    const char *x8m = getenv("TB_CUDA_FP8_FUSE_MASK");
    c->x8_mask = x8m && *x8m ? atoi(x8m) : 31;
    tbc_set_act_threads(acte && *acte ? atoi(acte) : 0);
    const char *rte = getenv("TB_CUDA_ROPE_TOK"), *rtt = getenv("TB_CUDA_ROPE_TT");
    tbc_set_rope_tok(rte && *rte ? atoi(rte) : 64, rtt && *rtt ? atoi(rtt) : 0);
    const char *gtt = getenv("TB_CUDA_GEMM_TUNE_T"), *gle = getenv("TB_CUDA_GEMM_LT");
    c->gemm_tune_t = gtt && *gtt ? atoi(gtt) : TB_CUDA_DEFAULT_GEMM_TUNE_T;
    c->gemm_lt = !(gle && !strcmp(gle, "0"));
    const char *gte = getenv("TB_CUDA_GRAPH_MAX_T");
    c->graph_max_t = gte && *gte ? atoi(gte) : TB_CUDA_DEFAULT_GRAPH_MAX_T;
    const char *pe = getenv("TB_CUDA_PDL"), *fe = getenv("TB_CUDA_FUSE"), *me = getenv("TB_CUDA_GEMV"),
               *te = getenv("TB_CUDA_SIMT_T");
    c->pdl = c->cc_major < 9 ? 0 : pe && *pe ? (atoi(pe) != 0) : -1;
    c->fuse = !(fe && !strcmp(fe, "0"));
    c->gemv.simt_max_t = TBC_GEMV_SIMT_MAX_T;
    if (me && !strcmp(me, "simt")) c->gemv.simt_max_t = TBC_GEMV_MAX_T;
    if (me && !strcmp(me, "mma")) c->gemv.simt_max_t = 0;
    if (te && *te) c->gemv.simt_max_t = atoi(te);
    const char *ke = getenv("TB_CUDA_SIMT"), *ne = getenv("TB_CUDA_FUSE_NORM"), *se = getenv("TB_CUDA_ATTN_SPLIT_MIN");
    c->gemv.simt_kind = TB_CUDA_DEFAULT_SIMT;
    if (ke && !strcmp(ke, "pair")) c->gemv.simt_kind = TBC_SIMT_PAIR;
    if (ke && !strcmp(ke, "row")) c->gemv.simt_kind = TBC_SIMT_ROW;
    if (ke && !strcmp(ke, "row2")) c->gemv.simt_kind = TBC_SIMT_ROW2;
    if (ke && !strcmp(ke, "row1")) c->gemv.simt_kind = TBC_SIMT_ROW1;
    if (ke && !strcmp(ke, "row1s")) c->gemv.simt_kind = TBC_SIMT_ROW1S;
    if (ke && !strcmp(ke, "row2s")) c->gemv.simt_kind = TBC_SIMT_ROW2S;
    const char *ate = getenv("TB_CUDA_ATTN_BLOCKS");
    c->attn_blocks = ate && *ate ? atoi(ate) : 2;
    const char *tue = getenv("TB_CUDA_TUNE");
    c->tune = tue && *tue ? atoi(tue) : 1;
    const char *tge = getenv("TB_CUDA_TUNE_GAIN"), *tpe = getenv("TB_CUDA_TUNE_PDL");
    c->tune_gain = tge && *tge ? (float)atof(tge) : 0.0f;
    c->tune_pdl = tpe && *tpe ? atoi(tpe) : 1;
    const char *tme = getenv("TB_CUDA_TUNE_MIN_MB");
    c->tune_min_bytes = (tme && *tme ? atof(tme) : 20.0) * 1e6;
    c->fuse_norm = !(ne && !strcmp(ne, "0"));
    c->attn_split_min = se && *se ? atoi(se) : TB_CUDA_DEFAULT_SPLIT_MIN;
    const char *ale = getenv("TB_CUDA_ATTN_LANES");
    c->attn_lanes = ale && *ale ? atoi(ale) : TB_CUDA_DEFAULT_ATTN_LANES;
    const char *ame = getenv("TB_CUDA_ATTN_MMA");
    c->attn_mma = ame && *ame ? atoi(ame) : TB_CUDA_DEFAULT_ATTN_MMA;
    const char *awe = getenv("TB_CUDA_ATTN_WARP_MIN");
    c->attn_warp_min = awe && *awe ? atoi(awe) : TB_CUDA_DEFAULT_ATTN_WARP_MIN;
    const char *aee = getenv("TB_CUDA_ATTN_EARLY"), *sae = getenv("TB_CUDA_SKIP_ATTN");
    c->attn_early = !(aee && !strcmp(aee, "0"));
    c->skip_attn = sae && !strcmp(sae, "1");
    const char *ame2 = getenv("TB_CUDA_ATTN_MERGE");
    c->attn_merge_loop = ame2 && !strcmp(ame2, "loop");
    const char *pge = getenv("TB_CUDA_PREFILL_GEMM");
    c->prefill_min = pge && *pge ? atoi(pge) : TB_CUDA_DEFAULT_PREFILL_MIN;
    const char *pfe = getenv("TB_CUDA_PREFILL");
    c->prefill_flash = !(pfe && !strcmp(pfe, "gemm"));
    const char *fbe = getenv("TB_CUDA_FLASH_BF16");
    c->flash_bf16 = !(fbe && !strcmp(fbe, "0")); /* checked on an H100 on 2026-12-07 */
    if (c->prefill_min > 0 && c->prefill_min <= TBC_GEMV_MAX_T) c->prefill_min = TBC_GEMV_MAX_T + 1;
    c->fused_node = c->skip_node = c->norm_node = c->x8_node = c->ys_node = -1;
    *out = b;
    return TB_OK;
}

/* ---------------------------------------------------------------- fingerprint */

static void version_str(int v, char *buf, size_t cap) { snprintf(buf, cap, "%d.%d", v / 1000, (v % 1000) / 10); }

char *tb_backend_cuda_fingerprint(int device) {
    struct cudaDeviceProp prop;
    if (device_open(device, &prop) != TB_OK) return NULL;
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    char cc[16], rts[16], drvs[16];
    snprintf(cc, sizeof cc, "%d.%d", prop.major, prop.minor);
    version_str(rt, rts, sizeof rts);
    version_str(drv, drvs, sizeof drvs);
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s}", "backend", "cuda", "gpu", prop.name, "cc", cc, "sm_count",
                          prop.multiProcessorCount, "cuda_runtime", rts, "driver", drvs);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) tb_errorf(TB_ERR_OOM, "out of memory");
    return s;
}

tb_status tb_backend_cuda_check(const char *hw_json, int device) {
    json_error_t err;
    json_t *o = json_loads(hw_json, 0, &err);
    if (!o) return tb_errorf(TB_ERR_FORMAT, "engine hardware section is not valid JSON");
    const char *backend = json_string_value(json_object_get(o, "backend"));
    const char *cc = json_string_value(json_object_get(o, "cc"));
    const char *gpu = json_string_value(json_object_get(o, "gpu"));
    const char *rt = json_string_value(json_object_get(o, "cuda_runtime"));
    tb_status s = TB_OK;
    struct cudaDeviceProp prop;
    char have[16];
    if (!backend || strcmp(backend, "cuda") != 0) {
        s = tb_errorf(TB_ERR_HARDWARE, "engine was built for backend '%s'; this is the cuda backend",
                      backend ? backend : "?");
    } else if (!cc) {
        s = tb_errorf(TB_ERR_FORMAT, "engine hardware section names no GPU compute capability");
    } else if ((s = device_open(device, &prop)) != TB_OK) {
        s = tb_error_prefix(s, "engine was built for %s (compute capability %s)", gpu ? gpu : "a CUDA GPU", cc);
    } else {
        snprintf(have, sizeof have, "%d.%d", prop.major, prop.minor);
        if (strcmp(have, cc) != 0)
            s = tb_errorf(TB_ERR_HARDWARE,
                          "engine was built for compute capability %s (%s, CUDA %s); cuda:%d is %s with compute "
                          "capability %s. Rebuild the engine on this GPU",
                          cc, gpu ? gpu : "?", rt ? rt : "?", device, prop.name, have);
    }
    json_decref(o);
    return s;
}
