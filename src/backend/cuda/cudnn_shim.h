/*
 * cudnn_shim.h — the few cuDNN legacy-API entry points the CUDA backend uses
 * (convolution forward, with bias, activation and a residual fused), loaded
 * with dlopen at run time: no cuDNN header or library is needed to build,
 * and a machine without cuDNN runs convolutions as im2col + cuBLAS.
 *
 * The types, enum values and prototypes below are cuDNN's stable C ABI
 * (cudnn_graph.h / cudnn_ops.h / cudnn_cnn.h of cuDNN 8 and 9; the legacy
 * convolution API is unchanged since cuDNN 7). Only what the backend calls
 * is declared.
 *
 * Where the library comes from (the first that loads):
 *   TB_CUDNN_LIB (a path or a file name), libcudnn.so.9 and libcudnn.so
 *   through the loader's search path, then the copies PyTorch's pip wheels
 *   install (nvidia/cudnn/lib under /opt/torch/.venv/lib/python3.12/
 *   site-packages and /usr/local/lib/python3.N/dist-packages). cuDNN 9's
 *   libcudnn.so.9 loads its sub-libraries (libcudnn_cnn.so.9, ...) by name;
 *   those in the same folder are loaded first by path, so a folder outside
 *   the loader's search path works too.
 */
#ifndef TB_CUDA_CUDNN_SHIM_H
#define TB_CUDA_CUDNN_SHIM_H

#include <stddef.h>

#include <cuda_runtime.h>

typedef struct cudnnContext *cudnnHandle_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct *cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct *cudnnConvolutionDescriptor_t;
typedef struct cudnnActivationStruct *cudnnActivationDescriptor_t;

typedef int cudnnStatus_t; /* CUDNN_STATUS_SUCCESS = 0 */
enum { TBD_STATUS_SUCCESS = 0 }; /* other codes differ between cuDNN 8 and 9 */
/* cudnnDataType_t */
enum { TBD_DATA_FLOAT = 0, TBD_DATA_DOUBLE = 1, TBD_DATA_HALF = 2 };
/* cudnnTensorFormat_t */
enum { TBD_TENSOR_NCHW = 0, TBD_TENSOR_NHWC = 1 };
/* cudnnConvolutionMode_t */
enum { TBD_CONVOLUTION = 0, TBD_CROSS_CORRELATION = 1 };
/* cudnnMathType_t */
enum { TBD_DEFAULT_MATH = 0, TBD_TENSOR_OP_MATH = 1, TBD_TENSOR_OP_MATH_ALLOW_CONVERSION = 2, TBD_FMA_MATH = 3 };
/* cudnnActivationMode_t */
enum { TBD_ACTIVATION_RELU = 1, TBD_ACTIVATION_IDENTITY = 5 };
/* cudnnNanPropagation_t */
enum { TBD_NOT_PROPAGATE_NAN = 0, TBD_PROPAGATE_NAN = 1 };
/* cudnnConvolutionFwdAlgo_t */
enum {
    TBD_FWD_IMPLICIT_GEMM = 0, TBD_FWD_IMPLICIT_PRECOMP_GEMM, TBD_FWD_GEMM, TBD_FWD_DIRECT, TBD_FWD_FFT,
    TBD_FWD_FFT_TILING, TBD_FWD_WINOGRAD, TBD_FWD_WINOGRAD_NONFUSED, TBD_FWD_ALGO_COUNT
};

typedef struct {
    int algo;             /* cudnnConvolutionFwdAlgo_t */
    cudnnStatus_t status;
    float time;           /* ms */
    size_t memory;        /* workspace bytes */
    int determinism;      /* cudnnDeterminism_t */
    int mathType;         /* cudnnMathType_t */
    int reserved[3];
} tbd_fwd_perf;           /* cudnnConvolutionFwdAlgoPerf_t */

typedef struct {
    void *lib;
    char path[512];
    size_t version;
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*Destroy)(cudnnHandle_t);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(cudnnStatus_t);
    cudnnStatus_t (*CreateTensorDescriptor)(cudnnTensorDescriptor_t *);
    cudnnStatus_t (*DestroyTensorDescriptor)(cudnnTensorDescriptor_t);
    cudnnStatus_t (*SetTensor4dDescriptor)(cudnnTensorDescriptor_t, int format, int dtype, int n, int c, int h, int w);
    cudnnStatus_t (*CreateFilterDescriptor)(cudnnFilterDescriptor_t *);
    cudnnStatus_t (*DestroyFilterDescriptor)(cudnnFilterDescriptor_t);
    /* note the order: data type, then format */
    cudnnStatus_t (*SetFilter4dDescriptor)(cudnnFilterDescriptor_t, int dtype, int format, int k, int c, int h, int w);
    cudnnStatus_t (*CreateConvolutionDescriptor)(cudnnConvolutionDescriptor_t *);
    cudnnStatus_t (*DestroyConvolutionDescriptor)(cudnnConvolutionDescriptor_t);
    cudnnStatus_t (*SetConvolution2dDescriptor)(cudnnConvolutionDescriptor_t, int pad_h, int pad_w, int u, int v,
                                                int dil_h, int dil_w, int mode, int compute_type);
    cudnnStatus_t (*SetConvolutionGroupCount)(cudnnConvolutionDescriptor_t, int groups);
    cudnnStatus_t (*SetConvolutionMathType)(cudnnConvolutionDescriptor_t, int math);
    cudnnStatus_t (*CreateActivationDescriptor)(cudnnActivationDescriptor_t *);
    cudnnStatus_t (*DestroyActivationDescriptor)(cudnnActivationDescriptor_t);
    cudnnStatus_t (*SetActivationDescriptor)(cudnnActivationDescriptor_t, int mode, int nan_opt, double coef);
    cudnnStatus_t (*GetConvolutionForwardAlgorithm_v7)(cudnnHandle_t, cudnnTensorDescriptor_t, cudnnFilterDescriptor_t,
                                                       cudnnConvolutionDescriptor_t, cudnnTensorDescriptor_t,
                                                       int requested, int *returned, tbd_fwd_perf *perf);
    cudnnStatus_t (*FindConvolutionForwardAlgorithmEx)(cudnnHandle_t, cudnnTensorDescriptor_t, const void *x,
                                                       cudnnFilterDescriptor_t, const void *w,
                                                       cudnnConvolutionDescriptor_t, cudnnTensorDescriptor_t, void *y,
                                                       int requested, int *returned, tbd_fwd_perf *perf, void *ws,
                                                       size_t ws_bytes);
    cudnnStatus_t (*GetConvolutionForwardWorkspaceSize)(cudnnHandle_t, cudnnTensorDescriptor_t,
                                                        cudnnFilterDescriptor_t, cudnnConvolutionDescriptor_t,
                                                        cudnnTensorDescriptor_t, int algo, size_t *bytes);
    cudnnStatus_t (*ConvolutionForward)(cudnnHandle_t, const void *alpha, cudnnTensorDescriptor_t, const void *x,
                                        cudnnFilterDescriptor_t, const void *w, cudnnConvolutionDescriptor_t, int algo,
                                        void *ws, size_t ws_bytes, const void *beta, cudnnTensorDescriptor_t, void *y);
    cudnnStatus_t (*ConvolutionBiasActivationForward)(cudnnHandle_t, const void *alpha1, cudnnTensorDescriptor_t,
                                                      const void *x, cudnnFilterDescriptor_t, const void *w,
                                                      cudnnConvolutionDescriptor_t, int algo, void *ws,
                                                      size_t ws_bytes, const void *alpha2, cudnnTensorDescriptor_t,
                                                      const void *z, cudnnTensorDescriptor_t, const void *bias,
                                                      cudnnActivationDescriptor_t, cudnnTensorDescriptor_t, void *y);
} tbd_api;

/* The loaded library (loaded on the first call; NULL when none loads:
 * logged once, at debug level for an absent library). */
const tbd_api *tbd_get(void);
/* A status as text ("CUDNN_STATUS_..." from the library). */
const char *tbd_error(cudnnStatus_t s);

#endif /* TB_CUDA_CUDNN_SHIM_H */
