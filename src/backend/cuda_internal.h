/* Private to the CUDA backend (src/backend/cuda_*.c): its context (the per-instance state),
 * checked-call macros and the pieces split across files (matrix products, attention, the ops). */
#ifndef FSDP_BACKEND_CUDA_INTERNAL_H
#define FSDP_BACKEND_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "backend.h"
#include "cuda_check.h"

/* Every CUDA, cuBLAS(Lt) and NCCL call is checked; a failure names the call, file, line and rank
 * (FSDP_CHECK_CUDA: cuda_check.h). */
#define FSDP_CHECK_CUBLAS(call) \
    FSDP_CHECK_STATUS_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, call, #call)
#define FSDP_CHECK_NCCL(call) FSDP_CHECK_STATUS_(ncclResult_t, ncclSuccess, ncclGetErrorString, call, #call)

struct fsdp_stream {
    cudaStream_t stream;
    char name[32];
};

struct fsdp_event {
    cudaEvent_t event;
};

struct fsdp_comm {
    ncclComm_t comm;
    char name[48];
    int rank, size;
    int copy_engines; /* FSDP_COMM_COPY_ENGINES: zero-CTA policy, alloc_shared gives windows */
    struct fsdp_comm *next; /* all live communicators, polled for asynchronous errors */
};

typedef struct matmul_cache matmul_cache;

/* A live device allocation, so that reserved-memory accounting stays exact. */
typedef struct allocation {
    void *ptr;
    size_t bytes;
    int nccl_memory;        /* from ncclMemAlloc (alloc_shared) */
    ncclComm_t window_comm; /* and registered as a window of this communicator when window is set */
    ncclWindow_t window;
    struct allocation *next;
} allocation;

typedef struct {
    int device;
    struct cudaDeviceProp prop;
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    void *lt_workspace;
    size_t lt_workspace_bytes;
    /* Scratch for deterministic reductions and attention, compute stream only; grows to the
     * largest request (the first step sizes it). */
    void *scratch;
    size_t scratch_bytes;
    matmul_cache *matmuls;
    fsdp_comm *comms;
    allocation *allocations;
    int tf32;
    /* 1 once cuBLASLt refused outer-vector scales: rowwise FP8 products then scale in an epilogue
     * (cuda_fp8.c) */
    int fp8_epilogue;
    /* --attn cudnn's handle and plans (cuda_cudnn_attention.c), made at its first use */
    struct fsdp_cudnn_context *cudnn;
} cuda_context;

static inline cuda_context *cuda_of(fsdp_backend *be) { return (cuda_context *)be->context; }
static inline cudaStream_t compute_stream(fsdp_backend *be) { return be->compute->stream; }

/* Device memory for compute-stream scratch: at least `bytes`, valid until the next call. */
void *fsdp_cuda_scratch(fsdp_backend *be, size_t bytes);

/* cuda_matmul.c */
void fsdp_cuda_matmul_init(fsdp_backend *be);
void fsdp_cuda_matmul_destroy(fsdp_backend *be);
/* D[m,n] (column-major) = alpha * op(A) op(B) + beta * C, the BLAS convention; bias (length m)
 * and relu epilogues. A, B in `in_t`; C, D in `out_t`. C may equal D.
 * FP8 (a_scale set): A in in_t and B in b_t (e4m3 / e5m2, never both e5m2), "TN" (transa = 1,
 * transb = 0), D = a_scale * b_scale * op(A) op(B) + beta * C with device fp32 scales: one each, or
 * with outer_vec one per row of op(A) (m) and one per column of op(B) (n); fast_accum is cuBLASLt's
 * FP8 fast accumulation (no periodic promotion to fp32). */
typedef struct {
    int transa, transb;
    int m, n, k;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    const void *C;
    int ldc;
    void *D;
    int ldd;
    fsdp_dtype in_t, out_t;
    const void *bias; /* length m, in out_t; NULL for none */
    int relu;
    float beta;
    fsdp_dtype b_t;                 /* FP8 only */
    const float *a_scale, *b_scale; /* NULL: not an FP8 product */
    int outer_vec, fast_accum;
} fsdp_gemm;
void fsdp_cuda_gemm(fsdp_backend *be, const fsdp_gemm *g, cudaStream_t s);
/* fsdp_cuda_gemm, or -1 without running anything when cuBLASLt has no algorithm for the problem
 * (remembered: later calls of the same problem return -1 at once). */
int fsdp_cuda_gemm_try(fsdp_backend *be, const fsdp_gemm *g, cudaStream_t s);
/* Strided-batched product through cuBLAS for eager attention. */
void fsdp_cuda_gemm_strided_batched(fsdp_backend *be, int transa, int transb, int m, int n, int k, const void *A,
                                    int lda, long long stride_a, const void *B, int ldb, long long stride_b, float beta,
                                    void *C, int ldc, long long stride_c, int batch, fsdp_dtype t, cudaStream_t s);

/* cuda_attention.c: the attention_forward / attention_backward ops (drop NULL: no dropout; window 0:
 * no sliding window), entries of fsdp_cuda_ops. */
void fsdp_cuda_attention_forward_op(fsdp_backend *be, fsdp_attn mode, void *out, float *lse, void *probs,
                                    const void *qkv, int B, int T, int Hq, int Hkv, int D, int window,
                                    const fsdp_dropout *drop);
const char *fsdp_cuda_attention_unsupported_op(fsdp_backend *be, fsdp_attn mode, int T, int D, int window,
                                              double dropout);
void fsdp_cuda_attention_backward_op(fsdp_backend *be, fsdp_attn mode, void *dqkv, const void *dout, const void *qkv,
                                     const void *out, const float *lse, const void *probs, int B, int T, int Hq,
                                     int Hkv, int D, int window, const fsdp_dropout *drop);

/* cuda_attention.c: the kv_cache_append and attention_decode ops, and Qwen3's per-head q/k norms. */
void fsdp_cuda_kv_cache_append_op(fsdp_backend *be, void *k_cache, void *v_cache, const void *qkv, int N, int pos0,
                                  int cap, int Hq, int Hkv, int D);
void fsdp_cuda_attention_decode_op(fsdp_backend *be, void *out, const void *qkv, const void *k_cache,
                                   const void *v_cache, int N, int pos0, int cap, int Hq, int Hkv, int D, int window);
void fsdp_cuda_qk_norm_forward_op(fsdp_backend *be, void *out, float *rstd, const void *inp, const void *wq,
                                  const void *wk, int N, int Hq, int Hkv, int D, float eps);
void fsdp_cuda_qk_norm_backward_op(fsdp_backend *be, void *dinp, void *dwq, void *dwk, const void *dout,
                                   const void *inp, const void *wq, const void *wk, const float *rstd, int N, int Hq,
                                   int Hkv, int D);

/* cuda_fp8.c: the matmul_forward_fp8 / matmul_backward_fp8 ops. */
void fsdp_cuda_matmul_forward_fp8_op(fsdp_backend *be, void *out, const void *inp, const void *weight,
                                     const void *bias, const void *residual, int N, int C, int OC, int relu,
                                     const fsdp_fp8_recipe *r, fsdp_fp8_amax amax, const fsdp_fp8_weight *w8);
void fsdp_cuda_matmul_backward_fp8_op(fsdp_backend *be, void *dinp, void *dweight, void *dbias, const void *dout,
                                      const void *inp, const void *weight, int N, int C, int OC,
                                      const fsdp_fp8_recipe *r, fsdp_fp8_amax amax, const fsdp_fp8_weight *w8);

/* cuda_ops.c: the ops table of the CUDA backend. */
extern const fsdp_backend_ops fsdp_cuda_ops;

/* Waits for an event, polling NCCL communicators for asynchronous errors so that a failure on a
 * peer ends this rank with a message instead of a hang. */
void fsdp_cuda_wait_event(fsdp_backend *be, cudaEvent_t e, const char *what);

#endif
