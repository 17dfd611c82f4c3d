/* --attn cudnn: causal attention forward and backward by cuDNN's fused attention graphs
 * (cuda_cudnn_attention.c), on fsdp.c's own layouts, so they slot in where the flash kernels run:
 * q|k|v packed per token [B, T, (Hq + 2 Hkv) D] (grouped-query heads), out [B, T, Hq, D], and the
 * natural-log log-sum-exp of the scaled scores per query row, [B, Hq, T] fp32, which is what the
 * flash kernels keep too (either backward can follow either forward). bf16 only, no sliding
 * window shorter than T, no attention dropout; fsdp_cuda_cudnn_attention_unsupported says why a
 * case is refused. */
#ifndef FSDP_BACKEND_CUDA_CUDNN_ATTENTION_H
#define FSDP_BACKEND_CUDA_CUDNN_ATTENTION_H

#include <stddef.h>

#include "backend.h"

/* NULL when cuDNN can run this attention over T tokens (and its backward, with `backward`), else why
 * not (one line, static storage): a window of at least T is no window; cuDNN 9.15 and older run the
 * backward only at T a multiple of 128 (the padding mask their frontend adds is left out here). */
const char *fsdp_cuda_cudnn_attention_unsupported(fsdp_dtype act, int T, int D, int window, const fsdp_dropout *drop,
                                                  int backward);

void fsdp_cuda_cudnn_attention_forward(fsdp_backend *be, void *out, float *lse, const void *qkv, int B, int T, int Hq,
                                       int Hkv, int D);
void fsdp_cuda_cudnn_attention_backward(fsdp_backend *be, void *dqkv, const void *dout, const void *qkv,
                                        const void *out, const float *lse, int B, int T, int Hq, int Hkv, int D);

/* The workspace a shape's two graphs ask for (the larger), building them if need be; 0 without
 * cuDNN. */
size_t fsdp_cuda_cudnn_attention_workspace(fsdp_backend *be, int B, int T, int Hq, int Hkv, int D);

/* Frees the handle and the cached plans. */
void fsdp_cuda_cudnn_destroy(fsdp_backend *be);

#endif
