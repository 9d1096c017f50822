/*
 * nn_cuda.h — the CUDA kernels of the general ops (ops_nn.def), as C
 * launchers, and the host side that runs a general node (nn_backend.c).
 *
 * The semantics are those of the reference kernels (ir/nn_*.c, contract in
 * ir/ops_nn.h). Element types are tb_dtype values (TBN_* below mirror them;
 * cuda_backend.c checks that they agree). Float ops compute in f32 whatever
 * the storage (f32, f16, bf16); integer ops in int64 with wrap-around, as the
 * references do. Shapes reach the kernels as plain int64 arrays of at most
 * TBN_MAX_RANK dims, passed by value in the argument structs.
 *
 * Every launcher enqueues on `s` and returns cudaGetLastError() after its
 * launch(es). Pointers are device pointers.
 */
#ifndef TB_CUDA_NN_CUDA_H
#define TB_CUDA_NN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TBN_MAX_RANK 8
/* tb_dtype's values */
enum { TBN_F32 = 0, TBN_F16 = 1, TBN_BF16 = 2, TBN_I32 = 3, TBN_I8 = 4, TBN_I64 = 7, TBN_BOOL = 8, TBN_U8 = 9,
       TBN_F64 = 10 };

/* Elementwise ops, numbered as the kernels know them. */
enum {
    TBN_RELU = 0, TBN_SIGMOID, TBN_TANH, TBN_EXP, TBN_LOG, TBN_NEG, TBN_ABS, TBN_SQRT, TBN_RECIP, TBN_ERF,
    TBN_FLOOR, TBN_CEIL, TBN_NOT, TBN_IDENTITY, TBN_CLIP, TBN_GELU,
    TBN_ADD, TBN_SUB, TBN_MUL, TBN_DIV, TBN_POW, TBN_EQ, TBN_LT, TBN_LE, TBN_GT, TBN_GE, TBN_AND, TBN_OR,
    TBN_WHERE,
};

/* How input k of an elementwise op is read at output element i: */
enum {
    TBN_IDX_FLAT = 0,   /* i (same shape as the output)              */
    TBN_IDX_SCALAR,     /* 0                                          */
    TBN_IDX_MOD,        /* i % p (repeats along the leading dims)     */
    TBN_IDX_DIV,        /* i / p (constant along the trailing dims)   */
    TBN_IDX_STRIDED,    /* sum over dims of coord * st[d]              */
};

typedef struct {
    int op, n_in, rank;
    int odt, dt[3];
    int mode[3];
    int attr;                    /* Gelu: 1 tanh form                  */
    int64_t n;                   /* output elements                    */
    int64_t p[3];                /* MOD / DIV period                   */
    int64_t dims[TBN_MAX_RANK];  /* output dims (STRIDED)              */
    int64_t st[3][TBN_MAX_RANK]; /* per input, per output dim          */
    double lo, hi;               /* Clip (floats)                      */
    int64_t ilo, ihi;            /* Clip (integers)                    */
} tbn_ew_args;

cudaError_t tbn_elementwise(const tbn_ew_args *a, const void *const *in, void *out, cudaStream_t s);
/* y = x converted (n elements) */
cudaError_t tbn_cast(const void *x, int xdt, void *y, int ydt, int64_t n, cudaStream_t s);

/* Softmax over the middle dim of (O, A, I). */
cudaError_t tbn_softmax(const void *x, void *y, int dt, int64_t O, int64_t A, int64_t I, cudaStream_t s);

/* LayerNormalization over rows of D: scale / bias (may be NULL) are read at
 * index j (pmode 0), 0 (pmode 1) or through the broadcast of their dims
 * pdims[pr] over x's normalised dims nd[nr] (pmode 2). */
typedef struct {
    int64_t rows, D;
    int dt, sdt, bdt;
    int smode, bmode;
    int nr, sr, br;
    int64_t nd[TBN_MAX_RANK], sd[TBN_MAX_RANK], bd[TBN_MAX_RANK];
    float eps;
} tbn_ln_args;
cudaError_t tbn_layernorm(const tbn_ln_args *a, const void *x, const void *scale, const void *bias, void *y,
                          cudaStream_t s);

/* BatchNormalization (inference): x (N, C, S); params p[0..3] = scale, bias,
 * mean, var, each of pn[k] elements (C or 1) of dtype pdt[k]. */
cudaError_t tbn_batchnorm(const void *x, void *y, int dt, int64_t N, int64_t C, int64_t S, const void *const *p,
                          const int *pdt, const int64_t *pn, float eps, cudaStream_t s);

/* ReduceMean / Sum / Max: output element o reads x at base(o) + the
 * reduced offsets; kd/ks kept dims and strides, rd/rs reduced ones. */
typedef struct {
    int op;                      /* 0 mean, 1 sum, 2 max              */
    int xdt, ydt;
    int nk, nr;
    int64_t nout, nred;
    int64_t kd[TBN_MAX_RANK], ks[TBN_MAX_RANK], rd[TBN_MAX_RANK], rs[TBN_MAX_RANK];
} tbn_reduce_args;
cudaError_t tbn_reduce(const tbn_reduce_args *a, const void *x, void *y, cudaStream_t s);

/* ---- data movement */

/* out (contiguous, dims od[r]) = in[base + sum_k j_k st[k]], elements of es
 * bytes (1, 2, 4 or 8); dims are collapsed and the 2-d transpose case tiled
 * inside. */
cudaError_t tbn_strided_copy(void *out, const void *in, int r, const int64_t *od, const int64_t *st, int64_t base,
                             int es, cudaStream_t s);
/* Gather along an axis: out (outer, ni, inner) = x (outer, A, inner) at the
 * indices (i32 or i64, negative wraps; out of range reads index 0 clamped). */
cudaError_t tbn_gather(const void *x, const void *idx, int idt, void *out, int64_t outer, int64_t A, int64_t ni,
                       int64_t inner, int es, cudaStream_t s);
/* out[i] = start + i * delta in dtype dt (f32, f64, i32, i64) */
cudaError_t tbn_range(void *out, int dt, int64_t n, double fstart, double fdelta, int64_t istart, int64_t idelta,
                      cudaStream_t s);
/* n elements of es bytes, each the bytes of `value` */
cudaError_t tbn_fill(void *out, int64_t n, int es, uint64_t value, cudaStream_t s);
/* Trilu over (B, M, N) */
cudaError_t tbn_trilu(const void *x, void *y, int64_t B, int64_t M, int64_t N, int64_t k, int upper, int es,
                      cudaStream_t s);

typedef struct {
    int rank, mode, coord, nearest, excl;
    int dt;
    float cubic_a, extrap;
    int64_t in[TBN_MAX_RANK], out[TBN_MAX_RANK];
    double scale[TBN_MAX_RANK], r0[TBN_MAX_RANK], r1[TBN_MAX_RANK];
} tbn_resize_args;
cudaError_t tbn_resize(const tbn_resize_args *a, const void *x, void *y, cudaStream_t s);

typedef struct {
    int is_max, incl, dt;
    int64_t planes, h, w, oh, ow;
    int kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
    int nhwc;                    /* x (N, H, W, C) and y (N, OH, OW, C): channels-last (nn_layout.c) */
    int64_t c;                   /* C (planes = N * C), read when nhwc */
} tbn_pool_args;
cudaError_t tbn_pool(const tbn_pool_args *a, const void *x, void *y, cudaStream_t s);
cudaError_t tbn_global_avgpool(const void *x, void *y, int dt, int64_t planes, int64_t sp, cudaStream_t s);
/* x (N, sp, C) channels-last -> y (N, C) */
cudaError_t tbn_global_avgpool_nhwc(const void *x, void *y, int dt, int64_t n, int64_t c, int64_t sp, cudaStream_t s);

/* ---- compute */

/* The fused epilogue of Conv / Gemm / MatMul over y (rows, cols), reading
 * the product acc (f32, or y itself in y's dtype: adt):
 *   v = acc + beta * bias[(i / bdiv) % bmod or the (M, N) strides]
 *   y = act(v) + res, or act(v + res) with after_res. */
typedef struct {
    int64_t n;                   /* elements                               */
    int ydt;
    const void *bias; int bdt;   /* NULL: none                             */
    int64_t bs_m, bs_n, ncols, bmod; /* bias offset: ((i / ncols) % bmod) bs_m + (i % ncols) bs_n */
    float beta;
    const void *res; int rdt;
    int act, after_res;
    float p0, p1;
    int adt;                     /* acc's dtype: TBN_F32 (0), or TBN_F16 when acc is y itself */
} tbn_epi_args;
cudaError_t tbn_epilogue(const tbn_epi_args *a, const float *acc, void *y, cudaStream_t s);

/* im2col of x (N, C, H, W) into col (N, C*kh*kw, OH*OW), element size es */
typedef struct {
    int64_t n, c, h, w, oh, ow;
    int kh, kw, sh, sw, dh, dw, pt, pl;
    int es;
} tbn_conv_geom;
cudaError_t tbn_im2col(const tbn_conv_geom *g, const void *x, void *col, cudaStream_t s);
/* Depthwise conv (group == C, M = C * mult) into f32 acc (N, M, OH, OW) */
cudaError_t tbn_depthwise(const tbn_conv_geom *g, int64_t m, const void *x, const void *w, int dt, float *acc,
                          cudaStream_t s);

/* Fused attention: q (BH, S, D), k (BH, T, D) or (BH, D, T), v (BH, T, Dv),
 * out (BH, S, Dv); mask element (b, h, s, t) at b ms[0] + h ms[1] + s ms[2] +
 * t ms[3] (mask_kind 1 additive, 2 bool keep). D, Dv <= 128. */
typedef struct {
    int64_t B, H, S, T;
    int D, Dv;
    int dt;                      /* q, k, v, out */
    int causal, k_t, mask_kind, mdt;
    const void *mask;
    int64_t ms[4];
    float scale;
    /* element strides (the last dim of q, v, out contiguous): q, v, out by
     * (batch, head, row); k by (batch, head, key, d), one of the last two 1.
     * tbn_sdpa_strides fills them for the contiguous layouts above; both
     * kernels (nn_mha.cu, nn_attn.cu) read any. */
    int64_t qs[3], ks[4], vs[3], os[3];
} tbn_sdpa_args;
/* the contiguous strides of the layouts above (a->B .. a->k_t set) */
void tbn_sdpa_strides(tbn_sdpa_args *a);
cudaError_t tbn_sdpa(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out,
                     cudaStream_t s);
/* The f16 tensor-core attention (nn_mha.cu), which tbn_sdpa tries first:
 * whether it takes a (any strides), and the launch (1: launched, *e its
 * status; 0: not its case). */
int tbn_mha_f16_ok(const tbn_sdpa_args *a);
int tbn_mha_f16(const tbn_sdpa_args *a, const void *q, const void *k, const void *v, void *out, cudaStream_t s,
                cudaError_t *e);

#ifdef __cplusplus
}
#endif

#endif /* TB_CUDA_NN_CUDA_H */
