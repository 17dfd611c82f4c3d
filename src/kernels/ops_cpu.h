/* The CPU reference ops: plain fp32 C with OpenMP, one function per op and direction.
 *
 * These define what every op computes. The CPU backend runs the model with them, and each CUDA
 * kernel is tested against them. Semantics, shapes and accumulation rules are exactly those of the
 * matching entry in src/backend/backend.h (the backend passes its arguments straight through):
 * parameter gradients and norm input gradients are ADDED (+=); every other output is overwritten.
 *
 * Reductions (sums over rows, sums of squares, attention softmax) are evaluated in an order that
 * does not depend on the number of OpenMP threads, so results are bitwise reproducible. */
#ifndef FSDP_KERNELS_OPS_CPU_H
#define FSDP_KERNELS_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "../base/dtype.h"
#include "dropout.h"
#include "op_args.h"

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int pos_offset,
                           int N, int T, int C);
/* padding_idx: the token row that gets no gradient (nn.Embedding's padding_idx), -1 for none. */
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int padding_idx,
                            int pos_offset, int N, int T, int C);

/* dst[e - window_start] += values[n * C + c] for e = set.base + row(n) * C + c of every row set, when e
 * lies in [window_start, window_start + window_len) and row(n) is not the set's skip row: the part
 * of a scatter-add that lands in one rank's shard of a flat buffer. Deterministic: rows are
 * visited in order. */
void cpu_add_rows(float *dst, int64_t window_start, int64_t window_len, const fsdp_row_set *sets, int nsets,
                  const float *values, int N, int C);

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps);
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, int N, int C);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C, float eps);
void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int N, int C);

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, const float *residual,
                        int N, int C, int OC, int relu);
void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC);
void cpu_relu_backward(float *d, const float *out, size_t n);

void cpu_rope_forward(float *qkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D);
void cpu_rope_backward(float *dqkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D);

/* probs may be NULL (flash semantics: nothing T x T is kept). With dropout (drop active), out =
 * (keep . P) V / (1 - p) with the mask of src/kernels/dropout.h (row b is sample
 * drop->sample_base + b); lse and probs stay those of the undropped softmax. drop may be NULL. */
void cpu_attention_forward(float *out, float *lse, float *probs, const float *qkv, int B, int T, int Hq, int Hkv,
                           int D, const fsdp_dropout *drop);
/* When probs is NULL they are recomputed from qkv and lse. The mask is regenerated from drop,
 * which must be the forward's. */
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            const float *probs, int B, int T, int Hq, int Hkv, int D, const fsdp_dropout *drop);

/* The same with a sliding window (window > 0: query t sees keys t - window < j <= t; 0: the plain
 * causal attention above, which these are with window 0). */
void cpu_attention_forward_window(float *out, float *lse, float *probs, const float *qkv, int B, int T, int Hq,
                                  int Hkv, int D, int window, const fsdp_dropout *drop);
void cpu_attention_backward_window(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, const float *probs, int B, int T, int Hq, int Hkv, int D,
                                   int window, const fsdp_dropout *drop);

/* Per-head RMSNorm of the q and k heads of qkv[N, (Hq + 2 Hkv) D] (Qwen3's q_norm and k_norm, before
 * rotary): out's query head h of row n = inp's / sqrt(mean(x^2) + eps) * wq, key heads with wk; the
 * value heads are copied. rstd[N, Hq + Hkv] saved (row n: the query heads, then the key heads). out
 * must not alias inp. */
void cpu_qk_norm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int N, int Hq,
                         int Hkv, int D, float eps);
/* dinp of the q and k heads from dout and the saved inp and rstd (overwritten; the value heads'
 * dout copied), dwq += and dwk += the weights' gradients. dinp may alias dout. */
void cpu_qk_norm_backward(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp, const float *wq,
                          const float *wk, const float *rstd, int N, int Hq, int Hkv, int D);

/* Generation over a KV cache (attention_decode.c; shapes as kv_cache_append and attention_decode in
 * src/backend/backend.h): caches [Hkv, cap, D]; query row n of qkv is position pos0 + n and attends
 * to cache positions 0 .. pos0 + n. */
void cpu_kv_cache_append(float *k_cache, float *v_cache, const float *qkv, int N, int pos0, int cap, int Hq, int Hkv,
                         int D);
void cpu_attention_decode(float *out, const float *qkv, const float *k_cache, const float *v_cache, int N, int pos0,
                          int cap, int Hq, int Hkv, int D);
/* The same with a sliding window: row t sees cache positions t - window < j <= t (window 0: all). */
void cpu_attention_decode_window(float *out, const float *qkv, const float *k_cache, const float *v_cache, int N,
                                 int pos0, int cap, int Hq, int Hkv, int D, int window);

/* Residual dropout on [N, C] tensors whose row n is position n % T of sample drop->sample_base +
 * n / T: out = residual + keep . x / (1 - p) (out may alias residual or x), and its backward
 * dx = keep . dout / (1 - p) (dx may alias dout). drop NULL or inactive: no mask (out = residual +
 * x, dx = dout). */
void cpu_residual_dropout_forward(float *out, const float *residual, const float *x, int N, int T, int C,
                                  const fsdp_dropout *drop);
void cpu_dropout_backward(float *dx, const float *dout, int N, int T, int C, const fsdp_dropout *drop);

void cpu_swiglu_forward(float *out, const float *gateup, int N, int F);
void cpu_swiglu_backward(float *dgateup, const float *dout, const float *gateup, int N, int F);

void cpu_cross_entropy(float *losses, float *logits, const int32_t *targets, int n, int V, float grad_scale);

/* AdamW on fp32 arrays; grad multiplied by grad_scale first. When round_master, param, m and v are
 * rounded to bf16 after the update (a bf16 model emulated in fp32 storage). When working is not
 * NULL the new parameter is copied there, rounded to bf16 when round_working. */
void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, const fsdp_adamw_args *a,
               float grad_scale, float *working, int round_master, int round_working);

/* Sum of squares / sum in double over fixed-size chunks summed in order (thread-count independent). */
double cpu_sum_squares(const float *x, size_t n);
double cpu_sum(const float *x, size_t n);

/* Rounds n values to the nearest bf16 in place. */
void cpu_round_bf16(float *x, size_t n);

/* Blockwise quantization for the wire (quantize.c; the layout of a piece and the rule for a block
 * are src/base/dtype.h's, the ops those of quantize / dequantize / sum_pieces in
 * src/backend/backend.h). Plain data is fp32 storage, as the CPU backend keeps it; a plain dtype of
 * FSDP_BF16 means "rounded to bf16" on output (inputs are read as they are). Blockwise data is the
 * bytes of `pieces` consecutive pieces of `count` elements, piece p at byte
 * p * fsdp_dtype_piece_bytes(t, count); every byte of a piece is written, its padding with zeros, so
 * equal inputs give equal bytes. A block whose scaling factor max_finite / amax overflows fp32 (amax
 * below about 1e-36) is stored like a zero block, scale 0 and codes 0. Buffers must not overlap
 * (sum_pieces' dst with its src). Results do not depend on the thread count, and the CUDA twins
 * (fsdp_cuda_quantize and friends) produce the same bits. */
/* dst: pieces of dst_t holding src[p * count .. (p + 1) * count), elements at or past `valid` read
 * as zero (src is read below `valid` only). A plain dst_t: pieces * count values, a cast. */
void cpu_quantize_pieces(void *dst, fsdp_dtype dst_t, const float *src, size_t count, int pieces, size_t valid);
/* dst[p * count + i] = element i of piece p of src (src_t blockwise: decode(code) * scale in fp32;
 * plain: the value), rounded to bf16 when dst_t is FSDP_BF16. */
void cpu_dequantize_pieces(float *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                           int pieces);
/* dst[i] = round_dst_t(acc), acc = (accumulate ? dst[i] : 0) + v_0(i) + v_1(i) + ... + v_{pieces-1}(i)
 * added left to right in fp32, v_p(i) element i of piece p as cpu_dequantize_pieces reads it. */
void cpu_sum_pieces(float *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count, int pieces,
                    int accumulate);

#endif
