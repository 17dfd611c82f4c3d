/* Launch functions of the CUDA kernels (the .cu files in src/kernels/cuda), callable from C.
 *
 * Each op computes what its CPU twin in ops_cpu.h computes (same shapes, same "+=" versus
 * "overwrite" rules, documented in src/backend/backend.h), on device pointers, enqueued on stream
 * `s`. `act` is the dtype of activations and working weights (FSDP_BF16 or FSDP_F32), `grad` the
 * dtype of parameter gradients; statistics (rstd, mean, lse, losses, scale) are fp32. Arithmetic is
 * fp32 whatever the storage dtype. Ops that reduce across rows (weight and bias gradients, sums)
 * do so deterministically through `scratch` (fp32, size from the matching function of cuda_scratch.h), so
 * that the same inputs give bitwise the same outputs on every run.
 *
 * A failed launch is fatal: the launcher names the kernel (fsdp_fatal). Launchers never
 * synchronise.
 *
 * out_amax (the norms' and SwiGLU's forward, SwiGLU's backward): NULL, or one fp32 of device memory
 * that gets max |out| over the values as stored (bf16-rounded when act is bf16; NaN if any is NaN):
 * the amax a tensorwise FP8 product of out needs (src/kernels/fp8.h), reported by the kernel that
 * writes out, so that no pass over memory measures it again. */
#ifndef FSDP_KERNELS_OPS_CUDA_H
#define FSDP_KERNELS_OPS_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/dtype.h"
#include "cuda_scratch.h"
#include "dropout.h"
#include "op_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- embeddings ---- */
void fsdp_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe, int pos_offset,
                                 int N, int T, int C, fsdp_dtype act, cudaStream_t s);
/* dwte/dwpe accumulate (no token gradient for padding_idx, -1: none); rows hit by several tokens are summed (atomics in fp32 are acceptable here:
 * the order of a few additions into one row is the only non-determinism allowed in this file). */
void fsdp_cuda_embedding_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tokens, int padding_idx,
                                  int pos_offset, int N, int T, int C, fsdp_dtype act, fsdp_dtype grad,
                                  cudaStream_t s);
/* The CUDA twin of cpu_add_rows (values in `act`, dst fp32); atomics, so the order of additions
 * into one element is not fixed. */
void fsdp_cuda_add_rows(float *dst, int64_t window_start, int64_t window_len, const fsdp_row_set *sets, int nsets,
                        const void *values, int N, int C, fsdp_dtype act, cudaStream_t s);

/* ---- norms ---- */
void fsdp_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps,
                               fsdp_dtype act, cudaStream_t s, float *out_amax);
/* The backwards' out_amax (NULL: none) gets max |dinp| as stored (the dropout variants: max |dx|),
 * the amax of the output gradient of the projection before the norm. */
void fsdp_cuda_rmsnorm_backward(void *dinp, void *dweight, const void *dout, const void *inp, const void *weight,
                                const float *rstd, int N, int C, fsdp_dtype act, fsdp_dtype grad, float *scratch,
                                cudaStream_t s, float *out_amax);
void fsdp_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                                 const void *bias, int N, int C, float eps, fsdp_dtype act, cudaStream_t s,
                                 float *out_amax);
void fsdp_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, const void *dout, const void *inp,
                                  const void *weight, const float *mean, const float *rstd, int N, int C,
                                  fsdp_dtype act, fsdp_dtype grad, float *scratch, cudaStream_t s, float *out_amax);

/* ---- bias gradients: dbias[OC] += sum over n of dout[n, OC] ---- */
void fsdp_cuda_column_sum(void *dbias, const void *dout, int N, int OC, fsdp_dtype act, fsdp_dtype grad,
                          float *scratch, cudaStream_t s);

/* ---- pointwise ---- */
void fsdp_cuda_relu_backward(void *d, const void *out, size_t n, fsdp_dtype act, cudaStream_t s);
void fsdp_cuda_rope_forward(void *qkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D, fsdp_dtype act,
                            cudaStream_t s);
/* out_amax (NULL: none): max |dqkv| as stored over all three parts, after the rotation (the value
 * part is read for it). */
void fsdp_cuda_rope_backward(void *dqkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D, fsdp_dtype act,
                             cudaStream_t s, float *out_amax);
void fsdp_cuda_swiglu_forward(void *out, const void *gateup, int N, int F, fsdp_dtype act, cudaStream_t s,
                              float *out_amax);
void fsdp_cuda_swiglu_backward(void *dgateup, const void *dout, const void *gateup, int N, int F, fsdp_dtype act,
                               cudaStream_t s, float *dgateup_amax);

/* ---- loss: logits[n, V] (act) replaced in place by grad_scale * dloss/dlogits; losses[n] fp32 ---- */
void fsdp_cuda_cross_entropy(float *losses, void *logits, const int32_t *targets, int n, int V, float grad_scale,
                             fsdp_dtype act, cudaStream_t s);

/* ---- optimizer and utilities ---- */
void fsdp_cuda_adamw(void *param, const void *grad, void *m, void *v, fsdp_dtype master, size_t n,
                     const fsdp_adamw_args *a, const float *grad_scale, void *working, fsdp_dtype working_t,
                     cudaStream_t s);
void fsdp_cuda_cast(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t n, cudaStream_t s);
void fsdp_cuda_accumulate(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t n, cudaStream_t s);
/* Blockwise quantization (src/kernels/cuda/quantize.cu): what cpu_quantize_pieces,
 * cpu_dequantize_pieces and cpu_sum_pieces compute, bit for bit, with the plain side in fp32 or real
 * bf16 and every byte of a piece written (padding zeroed). Buffers holding pieces of a blockwise
 * dtype must be 16-byte aligned (pieces are 16-byte multiples, so every piece then is; fatal
 * otherwise). Any plain buffer and any count work; the fast path wants plain buffers 16-byte aligned
 * and count a multiple of 8. The plain-dtype forms are casts (quantize zero-fills from `valid` on).
 * Buffers must not overlap. */
void fsdp_cuda_quantize(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count, int pieces,
                        size_t valid, cudaStream_t s);
void fsdp_cuda_dequantize(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count, int pieces,
                          cudaStream_t s);
void fsdp_cuda_sum_pieces(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count, int pieces,
                          int accumulate, cudaStream_t s);
/* *out += sum(x^2) / sum(x), fp32, fixed order. */
void fsdp_cuda_sum_squares(float *out, const void *x, fsdp_dtype t, size_t n, float *scratch, cudaStream_t s);
void fsdp_cuda_sum(float *out, const float *x, size_t n, float *scratch, cudaStream_t s);
void fsdp_cuda_clip_scale(float *scale, const float *sumsq, float max_norm, cudaStream_t s);

/* ---- residual dropout (dropout.cu; fused with the norms in norms.cu) ---- */
/* [N, C] tensors whose row n is position n % T of sample drop->sample_base + n / T (masks of
 * src/kernels/dropout.h). drop NULL or inactive: no mask. */
void fsdp_cuda_residual_dropout_forward(void *out, const void *residual, const void *x, int N, int T, int C,
                                        const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s);
void fsdp_cuda_dropout_backward(void *dx, const void *dout, int N, int T, int C, const fsdp_dropout *drop,
                                fsdp_dtype act, cudaStream_t s);
/* res_out = residual + keep . x / (1 - p), then the norm of the stored res_out (as the plain
 * forward of res_out); the backward adds into dinp as the plain one and then writes
 * dx = keep . dinp / (1 - p). */
void fsdp_cuda_rmsnorm_dropout_forward(void *res_out, void *out, float *rstd, const void *residual, const void *x,
                                       const void *weight, int N, int T, int C, float eps, const fsdp_dropout *drop,
                                       fsdp_dtype act, cudaStream_t s, float *out_amax);
void fsdp_cuda_layernorm_dropout_forward(void *res_out, void *out, float *mean, float *rstd, const void *residual,
                                         const void *x, const void *weight, const void *bias, int N, int T, int C,
                                         float eps, const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s,
                                         float *out_amax);
void fsdp_cuda_rmsnorm_dropout_backward(void *dinp, void *dx, void *dweight, const void *dout, const void *inp,
                                        const void *weight, const float *rstd, int N, int T, int C,
                                        const fsdp_dropout *drop, fsdp_dtype act, fsdp_dtype grad, float *scratch,
                                        cudaStream_t s, float *out_amax);
void fsdp_cuda_layernorm_dropout_backward(void *dinp, void *dx, void *dweight, void *dbias, const void *dout,
                                          const void *inp, const void *weight, const float *mean, const float *rstd,
                                          int N, int T, int C, const fsdp_dropout *drop, fsdp_dtype act,
                                          fsdp_dtype grad, float *scratch, cudaStream_t s, float *out_amax);

/* ---- attention (src/kernels/cuda/attention_*) ---- */
/* Flash: causal, grouped-query, never materialises T x T. qkv[B,T,(Hq+2Hkv)*D]; out[B,T,Hq*D];
 * lse[B,Hq,T]. Tensor-core paths for bf16 with D in {64, 128}; every other case (fp32, other D <=
 * 256) runs a slower exact path. drop (NULL: none) drops probabilities before P V as
 * cpu_attention_forward does; the backward takes the forward's descriptor. */
void fsdp_cuda_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int Hq, int Hkv, int D,
                             const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s);
void fsdp_cuda_flash_backward(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int B, int T, int Hq, int Hkv, int D, const fsdp_dropout *drop, fsdp_dtype act,
                              float *scratch, cudaStream_t s);
/* The same with a sliding window (window > 0: query t attends keys t - window < j <= t, as
 * cpu_attention_forward_window; 0: the causal kernels above, which are these with window 0). */
void fsdp_cuda_flash_forward_window(void *out, float *lse, const void *qkv, int B, int T, int Hq, int Hkv, int D,
                                    int window, const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s);
void fsdp_cuda_flash_backward_window(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                     int B, int T, int Hq, int Hkv, int D, int window, const fsdp_dropout *drop,
                                     fsdp_dtype act, float *scratch, cudaStream_t s);
/* The backward with dQ summed by fp32 atomics in the dK/dV kernel (FlashAttention-2's scheme): 5
 * matrix products per tile instead of 7, in exchange for dQ's bits depending on the order the
 * atomics land (not bitwise reproducible from run to run). scratch: fsdp_cuda_flash_backward_atomic_scratch
 * bytes. Shapes the tensor-core path does not take run the exact path, as above. */
void fsdp_cuda_flash_backward_atomic(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                     int B, int T, int Hq, int Hkv, int D, int window, const fsdp_dropout *drop,
                                     fsdp_dtype act, float *scratch, cudaStream_t s);
/* Eager's softmax over scores[BH, T, T] (act; row t valid from column max(0, t - window + 1) to
 * column t, window 0: from 0): probs = softmax(scale * scores) with the causal (and window) mask,
 * masked entries 0; lse[BH, T] saved. probs may alias scores. */
void fsdp_cuda_causal_softmax_forward(void *probs, float *lse, const void *scores, int BH, int T, float scale,
                                      fsdp_dtype act, cudaStream_t s);
void fsdp_cuda_causal_softmax_forward_window(void *probs, float *lse, const void *scores, int BH, int T, int window,
                                             float scale, fsdp_dtype act, cudaStream_t s);
/* dscores = scale * probs * (dprobs - rowsum(dprobs * probs)); may alias dprobs. Probabilities
 * outside a window are 0, so the same backward serves windowed attention. */
void fsdp_cuda_causal_softmax_backward(void *dscores, const void *dprobs, const void *probs, int BH, int T,
                                       float scale, fsdp_dtype act, cudaStream_t s);

/* ---- per-head q/k RMSNorm (src/kernels/cuda/qk_norm.cu; Qwen3) ---- */
/* What cpu_qk_norm_forward / cpu_qk_norm_backward compute (1 <= D <= 256). The backward takes
 * fsdp_cuda_qk_norm_backward_scratch(N, D) bytes of scratch; dinp may alias dout. */
void fsdp_cuda_qk_norm_forward(void *out, float *rstd, const void *inp, const void *wq, const void *wk, int N, int Hq,
                               int Hkv, int D, float eps, fsdp_dtype act, cudaStream_t s);
void fsdp_cuda_qk_norm_backward(void *dinp, void *dwq, void *dwk, const void *dout, const void *inp, const void *wq,
                                const void *wk, const float *rstd, int N, int Hq, int Hkv, int D, fsdp_dtype act,
                                fsdp_dtype grad, float *scratch, cudaStream_t s);
/* The same with dropout (drop must be active) on [B * Hq, T, T]: the forward also writes
 * dropped = keep . probs / (1 - p) (the P of P V); the backward takes dprobs = d(dropped), uses
 * dP = keep . dprobs / (1 - p), and writes dropped again for dV. dropped aliases nothing. */
void fsdp_cuda_causal_softmax_dropout_forward(void *probs, void *dropped, float *lse, const void *scores, int B,
                                              int Hq, int T, float scale, const fsdp_dropout *drop, fsdp_dtype act,
                                              cudaStream_t s);
void fsdp_cuda_causal_softmax_dropout_backward(void *dscores, void *dropped, const void *dprobs, const void *probs,
                                               int B, int Hq, int T, float scale, const fsdp_dropout *drop,
                                               fsdp_dtype act, cudaStream_t s);
/* The forward within a sliding window (window 0: the one above); the backward above serves it too. */
void fsdp_cuda_causal_softmax_dropout_forward_window(void *probs, void *dropped, float *lse, const void *scores, int B,
                                                     int Hq, int T, int window, float scale, const fsdp_dropout *drop,
                                                     fsdp_dtype act, cudaStream_t s);

/* ---- generation over a KV cache (src/kernels/cuda/attention_decode.cu) ---- */
/* What cpu_kv_cache_append and cpu_attention_decode compute (caches [Hkv, cap, D]; query row n at
 * position pos0 + n attends to cache positions 0 .. pos0 + n). Split over the keys as
 * cuda_scratch.h says; `scratch` holds fsdp_cuda_decode_scratch(N, pos0 + N, Hq, D) bytes (NULL
 * when that is 0). 1 <= D <= 256. */
void fsdp_cuda_kv_cache_append(void *k_cache, void *v_cache, const void *qkv, int N, int pos0, int cap, int Hq,
                               int Hkv, int D, fsdp_dtype act, cudaStream_t s);
void fsdp_cuda_attention_decode(void *out, const void *qkv, const void *k_cache, const void *v_cache, int N, int pos0,
                                int cap, int Hq, int Hkv, int D, fsdp_dtype act, float *scratch, cudaStream_t s);
/* The same with a sliding window: row n (position t = pos0 + n) attends to t - window < j <= t; the
 * scratch is fsdp_cuda_decode_scratch(N, fsdp_cuda_decode_keys(pos0 + N, window), Hq, D). */
void fsdp_cuda_attention_decode_window(void *out, const void *qkv, const void *k_cache, const void *v_cache, int N,
                                       int pos0, int cap, int Hq, int Hkv, int D, int window, fsdp_dtype act,
                                       float *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
