/* The residual-dropout ops of the CUDA backend (the kernels of src/kernels/cuda/dropout.cu and the
 * fused norms of rmsnorm.cu / layernorm.cu), on the compute stream. */
#include "../kernels/ops_cuda.h"
#include "cuda_internal.h"

static void cuda_residual_dropout_forward(fsdp_backend *be, void *out, const void *residual, const void *x, int N,
                                          int T, int C, const fsdp_dropout *drop) {
    fsdp_cuda_residual_dropout_forward(out, residual, x, N, T, C, drop, be->act_dtype, compute_stream(be));
}

static void cuda_dropout_backward(fsdp_backend *be, void *dx, const void *dout, int N, int T, int C,
                                  const fsdp_dropout *drop) {
    fsdp_cuda_dropout_backward(dx, dout, N, T, C, drop, be->act_dtype, compute_stream(be));
}

static void cuda_rmsnorm_dropout_forward(fsdp_backend *be, void *res_out, void *out, float *rstd, const void *residual,
                                         const void *x, const void *w, int N, int T, int C, float eps,
                                         const fsdp_dropout *drop) {
    fsdp_cuda_rmsnorm_dropout_forward(res_out, out, rstd, residual, x, w, N, T, C, eps, drop, be->act_dtype,
                                      compute_stream(be));
}

static void cuda_layernorm_dropout_forward(fsdp_backend *be, void *res_out, void *out, float *mean, float *rstd,
                                           const void *residual, const void *x, const void *w, const void *b, int N,
                                           int T, int C, float eps, const fsdp_dropout *drop) {
    fsdp_cuda_layernorm_dropout_forward(res_out, out, mean, rstd, residual, x, w, b, N, T, C, eps, drop,
                                        be->act_dtype, compute_stream(be));
}

static void cuda_rmsnorm_dropout_backward(fsdp_backend *be, void *dinp, void *dx, void *dw, const void *dout,
                                          const void *inp, const void *w, const float *rstd, int N, int T, int C,
                                          const fsdp_dropout *drop) {
    float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_norm_backward_scratch(N, C));
    fsdp_cuda_rmsnorm_dropout_backward(dinp, dx, dw, dout, inp, w, rstd, N, T, C, drop, be->act_dtype,
                                       be->grad_dtype, scratch, compute_stream(be));
}

static void cuda_layernorm_dropout_backward(fsdp_backend *be, void *dinp, void *dx, void *dw, void *db,
                                            const void *dout, const void *inp, const void *w, const float *mean,
                                            const float *rstd, int N, int T, int C, const fsdp_dropout *drop) {
    float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_norm_backward_scratch(N, C));
    fsdp_cuda_layernorm_dropout_backward(dinp, dx, dw, db, dout, inp, w, mean, rstd, N, T, C, drop, be->act_dtype,
                                         be->grad_dtype, scratch, compute_stream(be));
}

void fsdp_cuda_set_dropout_ops(fsdp_backend *be) {
    be->residual_dropout_forward = cuda_residual_dropout_forward;
    be->dropout_backward = cuda_dropout_backward;
    be->rmsnorm_dropout_forward = cuda_rmsnorm_dropout_forward;
    be->layernorm_dropout_forward = cuda_layernorm_dropout_forward;
    be->rmsnorm_dropout_backward = cuda_rmsnorm_dropout_backward;
    be->layernorm_dropout_backward = cuda_layernorm_dropout_backward;
}
