/* One transformer block's forward, the one code that training (model.c) and generation with a KV
 * cache (kv_decode.c) both run. Internal to src/model.
 *
 * A block, pre-norm: ln1 = norm(x); q|k|v = ln1 W_qkv^T (+ b); with the family's qk_norm, RMSNorm of
 * each q and k head (Qwen3); rotary; attention (causal, or within the sliding window) over the
 * block's own rows or over a KV cache; x += att W_o^T; ln2 = norm(x); the MLP's first product and
 * its activation (SwiGLU or ReLU); x += fc_act W_2^T. What varies between families is asked of
 * fsdp_block_kind_of (family.h) once, into the context.
 *
 * Training splits the block where its dropout and recomputation need it (model.c): the first norm
 * may be fused with the previous block's dropped MLP output, and the last product may be left for
 * the next unit's norm; fsdp_block_body is everything between, and fsdp_block_forward the whole
 * block without dropout, which generation and dropout-free training both call. */
#ifndef FSDP_MODEL_BLOCK_H
#define FSDP_MODEL_BLOCK_H

#include "../backend/backend.h"
#include "config.h"
#include "unit_params.h"

/* The shapes and kinds one block runs with. N rows (B sequences of T tokens); cos_sin the rotary
 * rows of the rows' positions (the table's row pos0 for a decode step). */
typedef struct {
    fsdp_backend *be;
    fsdp_block_kind kind;
    int N, B, T;
    int C, F, Hq, Hkv, D, QKV, Q;
    float eps;
    const float *cos_sin;
    /* How the projections (q|k|v, o, the MLP's two) compute: granularity NONE is bf16 (the
     * backend's act dtype); else FP8 (src/kernels/fp8.h). The LM head never reads it. */
    fsdp_fp8_recipe fp8;
    /* Tensorwise FP8 with weights cast once per gather: the block's FSDP_BLOCK_PRODUCTS weights as the
     * gather brought them (fsdp_fp8_weight, in fsdp_block_product order), set for the block being
     * computed; NULL: each product casts its weight. */
    const fsdp_fp8_weight *weights8;
} fsdp_block_ctx;

/* The block's four products, in the order of a layer's saved FP8 amax. */
typedef enum {
    FSDP_PRODUCT_QKV,
    FSDP_PRODUCT_O,
    FSDP_PRODUCT_MLP_IN,
    FSDP_PRODUCT_MLP_OUT,
    FSDP_BLOCK_PRODUCTS
} fsdp_block_product;

/* Product p's weight as the gather brought it in FP8, or NULL (fsdp_block_ctx.weights8). */
static inline const fsdp_fp8_weight *fsdp_block_weight8(const fsdp_block_ctx *k, fsdp_block_product p) {
    return k->weights8 ? &k->weights8[p] : NULL;
}

/* The tensors of one block's forward (and, in training, what its backward reads). res_mid may be
 * res_in (in-place residual adds); qkv_in and qk_rstd exist with qk_norm only (q|k|v before the
 * norm, and the heads' rstd [N, Hq+Hkv]); mean pointers with LayerNorm only; probs with eager. */
typedef struct {
    void *res_in;
    void *ln1;
    float *ln1_mean, *ln1_rstd;
    void *qkv_in;
    float *qk_rstd;
    void *qkv; /* after qk_norm and rotary: what attention reads */
    void *att;
    float *lse;
    void *probs;
    void *res_mid;
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *fc, *fc_act;
    /* Training with tensorwise FP8: FSDP_BLOCK_PRODUCTS x FSDP_BLOCK_AMAX floats (fsdp_block_amax);
     * else NULL. */
    float *fp8_amax;
} fsdp_block_acts;

/* Per product with tensorwise FP8: the amax of its input and weight that its forward saves for its
 * backward (fsdp_fp8_amax.saved, the input's reported by the norm or SwiGLU that wrote it), then its
 * output gradient's as the op that wrote it reports it (SwiGLU's, a norm's or rotary's backward). */
#define FSDP_BLOCK_AMAX (FSDP_FP8_SAVED_AMAX + 1)

/* Where the producer of product p's input reports its amax (NULL: nowhere). */
static inline float *fsdp_block_input_amax(const fsdp_block_acts *a, fsdp_block_product p) {
    return a->fp8_amax ? a->fp8_amax + (size_t)p * FSDP_BLOCK_AMAX : NULL;
}
/* Where the producer of product p's output gradient reports its amax (NULL: nowhere). */
static inline float *fsdp_block_grad_amax(const fsdp_block_acts *a, fsdp_block_product p) {
    return a->fp8_amax ? a->fp8_amax + (size_t)p * FSDP_BLOCK_AMAX + FSDP_FP8_SAVED_AMAX : NULL;
}
/* What product p shares with its neighbours: input_reported / grad_reported say whether the kernel
 * that wrote its input / its output gradient reported the amax. */
static inline fsdp_fp8_amax fsdp_block_amax(const fsdp_block_acts *a, fsdp_block_product p, int input_reported,
                                            int grad_reported) {
    fsdp_fp8_amax r = {NULL, NULL, fsdp_block_input_amax(a, p)};
    if (input_reported) r.inp = r.saved;
    if (grad_reported) r.dout = fsdp_block_grad_amax(a, p);
    return r;
}

/* Where the attention's keys come from: the block's own B x T rows (k_cache NULL: training, or a
 * prompt's prefill through the training attention), or a KV cache that the new rows are appended
 * to first (positions pos0 ..). */
typedef struct {
    fsdp_attn mode;
    const fsdp_dropout *drop; /* on the probabilities; NULL: none */
    void *k_cache, *v_cache;
    int pos0, cap;
} fsdp_block_attention;

fsdp_block_ctx fsdp_block_ctx_make(fsdp_backend *be, const fsdp_model_config *cfg);

/* A projection of the block, out[N, OC] = inp[N, C] W^T (+ b) (+ residual) (relu), and its backward
 * (matmul_forward / matmul_backward's contracts): the one place that picks the bf16 or the FP8
 * product, by k->fp8. amax: fsdp_block_amax of the product, w8: fsdp_block_weight8 (FP8 only). */
void fsdp_block_linear(const fsdp_block_ctx *k, void *out, const void *inp, const void *w, const void *b,
                       const void *residual, int C, int OC, int relu, fsdp_fp8_amax amax, const fsdp_fp8_weight *w8);
void fsdp_block_linear_backward(const fsdp_block_ctx *k, void *dinp, void *dw, void *db, const void *dout,
                                const void *inp, const void *w, int C, int OC, fsdp_fp8_amax amax,
                                const fsdp_fp8_weight *w8);

/* The block's norm (RMSNorm or LayerNorm) of ctx->N rows; out_amax as backend.h's (NULL: none). */
void fsdp_block_norm(const fsdp_block_ctx *k, void *out, float *mean, float *rstd, const void *inp, const void *w,
                     const void *b, float *out_amax);
/* dinp_amax: where the projection whose output gradient dinp is wants its amax
 * (fsdp_block_grad_amax; NULL: none). */
void fsdp_block_norm_backward(const fsdp_block_ctx *k, void *dinp, void *dw, void *db, const void *dout,
                              const void *inp, const void *w, const float *mean, const float *rstd, float *dinp_amax);
/* res_out = residual + dropped x, then its norm (the fused backend ops), and the backward (dx_amax:
 * as dinp_amax, of dx, the dropped branch gradient the projection reads). */
void fsdp_block_norm_dropout(const fsdp_block_ctx *k, void *res_out, void *out, float *mean, float *rstd,
                             const void *residual, const void *x, const void *w, const void *b,
                             const fsdp_dropout *drop, float *out_amax);
void fsdp_block_norm_dropout_backward(const fsdp_block_ctx *k, void *dinp, void *dx, void *dw, void *db,
                                      const void *dout, const void *inp, const void *w, const float *mean,
                                      const float *rstd, const fsdp_dropout *drop, float *dx_amax);

/* q|k|v from ln1: the product, the family's qk_norm, rotary. */
void fsdp_block_qkv(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_params *w);
/* The attention of a->qkv into a->att (and lse, probs), from the block's rows or the cache. */
void fsdp_block_attend(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_attention *at);
/* Everything from ln1 to fc_act: q|k|v, attention, o_proj and its residual add (into res_mid; with
 * attn_out_drop, into branch and dropped into res_mid by the fused norm), ln2, the MLP's first
 * product and activation. */
void fsdp_block_body(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_params *w,
                     const fsdp_block_attention *at, void *branch, const fsdp_dropout *attn_out_drop);
/* The whole block without residual dropout: ln1 of res_in, the body, and out = res_mid + the MLP's
 * last product (out may be res_in). */
void fsdp_block_forward(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_params *w,
                        const fsdp_block_attention *at, void *out);

#endif
