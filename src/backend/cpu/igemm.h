/*
 * igemm.h — int8 GEMM for the quantized general ops (INT8 ONNX engines):
 * activations quantized per tensor (uint8 codes with a zero point, a float
 * scale), weights int8 per output channel (symmetric, codes in [-127, 127]),
 * int32 accumulation, dequantized into f32 in the epilogue of the f32 GEMM
 * (bias, activation, residual: tb_cpu_sgemm_epi, nn.h):
 *
 *   Y[m, n] = epi( a_scale * w_scale[n] * sum_k (A[m, k] - a_zero) * W[n, k] )
 *
 * A (M, K) uint8 row-major with leading dim lda; W (N, K) int8 row-major,
 * packed once (it is a weight) by tb_cpu_igemm_pack into the kernel's layout
 * (tb_cpu_igemm_packed_bytes bytes, 64-byte aligned dst); the packed form
 * keeps each row's sum of codes, so the zero point costs one multiply-add
 * per output. Integer sums are exact: every path equals tb_ref_igemm bit for
 * bit before the f32 epilogue (which rounds like the sgemm's).
 * Symmetric int8 activations are a_zero = 128 (code = int8 + 128).
 *
 * Paths (chosen per call from tb_cpu_kernel_path(), so a forced path
 * applies): AVX-512 VNNI (vpdpbusd, igemm_avx512.c), AVX2 (exact int16
 * vpmaddwd, igemm_avx2.c), portable (igemm.c). All read the same packed
 * layout (igemm_impl.h), so a weight packed once serves every path.
 */
#ifndef TB_CPU_IGEMM_H
#define TB_CPU_IGEMM_H
#include "backend/cpu/nn.h"
#include <stdint.h>

size_t tb_cpu_igemm_packed_bytes(int64_t N, int64_t K);
void tb_cpu_igemm_pack(const int8_t *W, int64_t ldw, int64_t N, int64_t K, void *dst);

/* q[i] = clamp(round_half_even(x[i] * inv_scale) + zero, 0, 255): ONNX's
 * QuantizeLinear to uint8 (inv_scale = 1 / scale); NaN gives 0. */
void tb_cpu_quantize_u8(const float *x, uint8_t *q, int64_t n, float inv_scale, int zero);

/* Y (M, N), leading dim ldy, = the formula above; epi NULL: none. Split over
 * the pool when given. */
void tb_cpu_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const void *Wp, const float *w_scale, float *Y, int64_t ldy, const tb_cpu_sgemm_epi *epi,
                  tb_pool *pool);

/* The scalar reference, on W unpacked (N, K) with leading dim ldw. */
void tb_ref_igemm(int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_zero, float a_scale,
                  const int8_t *W, int64_t ldw, const float *w_scale, float *Y, int64_t ldy,
                  const tb_cpu_sgemm_epi *epi);

/* The direct int8 convolution (igemm_conv.c): stride 1 or 2 (both axes),
 * dilation 1, one group, any C, kh kw <= TB_ICONV_MAX_TAPS,
 * activation none or ReLU, on AVX-512 VNNI (tb_cpu_iconv_supported says
 * whether it runs here). One image's codes are (ceil(C / 4), plane) uint32
 * words, each word 4 channels' codes (past C: the zero point's), a plane being the input padded to
 * (hp, wp) (stride 2: split into 4 phases of (hq, wq)) plus a slack; the
 * weight (M, C, kh, kw) int8 packed by tb_cpu_iconv_pack. */
#define TB_ICONV_MAX_TAPS 64
typedef struct {
    int64_t c, cg, h, w;  /* input (one image); cg = ceil(c / 4) groups */
    int kh, kw, s, pt, pl; /* kernel, stride, top and left pads         */
    int64_t hp, wp;       /* padded input                               */
    int64_t hq, wq;       /* a phase of it: (hp, wp) / s rounded up     */
    int64_t sub;          /* words per phase (hq wq + slack)            */
    int64_t oh, ow;       /* output                                     */
    int64_t plane;        /* words per 4-channel plane (hp wp + slack)  */
    int64_t nvec;         /* vectors of 16 flat output positions        */
} tb_iconv_geom;
typedef struct {
    const tb_iconv_geom *g;
    int64_t n_img;                   /* images (0: 1)                     */
    const uint8_t *q;                /* the images' codes                 */
    size_t q_stride;                 /* bytes between images' codes      */
    int64_t y_stride;                /* floats between images' y and res  */
    const int8_t *w;                 /* packed weight                     */
    int64_t m;                       /* output channels                   */
    int zero;
    float a_scale;
    const float *w_scale, *bias;     /* (M); bias NULL: none              */
    const float *res;                /* (n_img, M, oh, ow) or NULL        */
    float *y;                        /* (n_img, M, oh, ow)                */
    int act, after;                  /* TB_NN_ACT_NONE / RELU; act after the residual */
    /* set by tb_cpu_iconv_job_init: */
    const int32_t *wsum;
    int64_t nblocks;                 /* blocks of 8 output channels       */
    int32_t toff[TB_ICONV_MAX_TAPS]; /* byte offset of each tap           */
} tb_iconv_job;
int tb_cpu_iconv_supported(int64_t C, int kh, int kw, int sh, int sw, int dh, int dw, int group, int act);
void tb_cpu_iconv_geometry(int64_t C, int64_t H, int64_t W, int kh, int kw, int s, int pt, int pl, int pb, int pr,
                           tb_iconv_geom *g);
size_t tb_cpu_iconv_codes_bytes(const tb_iconv_geom *g);
size_t tb_cpu_iconv_packed_bytes(int64_t M, int64_t C, int kh, int kw);
void tb_cpu_iconv_pack(const int8_t *W, int64_t M, int64_t C, int kh, int kw, void *dst);
/* x (C, H, W) f32 of one image -> the codes of 4-channel planes [cg0, cg1)
 * (tb_cpu_quantize_u8's formula; border and slack the zero point's code).
 * tmp: hp wp words of the caller's (stride 2; NULL for stride 1). */
void tb_cpu_iconv_quantize(const tb_iconv_geom *g, const float *x, float inv_scale, int zero, uint8_t *q,
                           uint32_t *tmp, int64_t cg0, int64_t cg1);
void tb_cpu_iconv_job_init(tb_iconv_job *j);
/* Channel blocks [mb0, mb1) x output vectors [v0, v1) of the job. */
void tb_cpu_iconv_run(const tb_iconv_job *j, int64_t mb0, int64_t mb1, int64_t v0, int64_t v1);
/* The scalar reference on the same codes and packed weight (every output). */
void tb_ref_iconv(const tb_iconv_job *j);

#endif /* TB_CPU_IGEMM_H */
