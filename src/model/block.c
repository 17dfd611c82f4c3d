/* One transformer block's forward over the backend's ops (block.h), shared by training and
 * generation. */
#include "block.h"

fsdp_block_ctx fsdp_block_ctx_make(fsdp_backend *be, const fsdp_model_config *cfg) {
    fsdp_block_ctx k = {0};
    k.be = be;
    k.kind = fsdp_block_kind_of(cfg);
    k.C = cfg->hidden_size, k.F = cfg->intermediate_size;
    k.Hq = cfg->num_heads, k.Hkv = cfg->num_kv_heads, k.D = cfg->head_dim;
    k.Q = k.Hq * k.D, k.QKV = (k.Hq + 2 * k.Hkv) * k.D;
    k.eps = cfg->norm_eps;
    return k;
}

void fsdp_block_linear(const fsdp_block_ctx *k, void *out, const void *inp, const void *w, const void *b,
                       const void *residual, int C, int OC, int relu, fsdp_fp8_amax amax, const fsdp_fp8_weight *w8) {
    fsdp_backend *be = k->be;
    if (k->fp8.granularity != FSDP_FP8_NONE)
        be->ops->matmul_forward_fp8(be, out, inp, w, b, residual, k->N, C, OC, relu, &k->fp8, amax, w8);
    else
        be->ops->matmul_forward(be, out, inp, w, b, residual, k->N, C, OC, relu);
}

void fsdp_block_linear_backward(const fsdp_block_ctx *k, void *dinp, void *dw, void *db, const void *dout,
                                const void *inp, const void *w, int C, int OC, fsdp_fp8_amax amax,
                                const fsdp_fp8_weight *w8) {
    fsdp_backend *be = k->be;
    if (k->fp8.granularity != FSDP_FP8_NONE)
        be->ops->matmul_backward_fp8(be, dinp, dw, db, dout, inp, w, k->N, C, OC, &k->fp8, amax, w8);
    else
        be->ops->matmul_backward(be, dinp, dw, db, dout, inp, w, k->N, C, OC);
}

void fsdp_block_norm(const fsdp_block_ctx *k, void *out, float *mean, float *rstd, const void *inp, const void *w,
                     const void *b, float *out_amax) {
    fsdp_backend *be = k->be;
    if (k->kind.rms)
        be->ops->rmsnorm_forward(be, out, rstd, inp, w, k->N, k->C, k->eps, out_amax);
    else
        be->ops->layernorm_forward(be, out, mean, rstd, inp, w, b, k->N, k->C, k->eps, out_amax);
}

void fsdp_block_norm_backward(const fsdp_block_ctx *k, void *dinp, void *dw, void *db, const void *dout,
                              const void *inp, const void *w, const float *mean, const float *rstd, float *dinp_amax) {
    fsdp_backend *be = k->be;
    if (k->kind.rms)
        be->ops->rmsnorm_backward(be, dinp, dw, dout, inp, w, rstd, k->N, k->C, dinp_amax);
    else
        be->ops->layernorm_backward(be, dinp, dw, db, dout, inp, w, mean, rstd, k->N, k->C, dinp_amax);
}

void fsdp_block_norm_dropout(const fsdp_block_ctx *k, void *res_out, void *out, float *mean, float *rstd,
                             const void *residual, const void *x, const void *w, const void *b,
                             const fsdp_dropout *drop, float *out_amax) {
    fsdp_backend *be = k->be;
    if (k->kind.rms)
        be->ops->rmsnorm_dropout_forward(be, res_out, out, rstd, residual, x, w, k->N, k->T, k->C, k->eps, drop,
                                         out_amax);
    else
        be->ops->layernorm_dropout_forward(be, res_out, out, mean, rstd, residual, x, w, b, k->N, k->T, k->C, k->eps,
                                           drop, out_amax);
}

void fsdp_block_norm_dropout_backward(const fsdp_block_ctx *k, void *dinp, void *dx, void *dw, void *db,
                                      const void *dout, const void *inp, const void *w, const float *mean,
                                      const float *rstd, const fsdp_dropout *drop, float *dx_amax) {
    fsdp_backend *be = k->be;
    if (k->kind.rms)
        be->ops->rmsnorm_dropout_backward(be, dinp, dx, dw, dout, inp, w, rstd, k->N, k->T, k->C, drop, dx_amax);
    else
        be->ops->layernorm_dropout_backward(be, dinp, dx, dw, db, dout, inp, w, mean, rstd, k->N, k->T, k->C, drop,
                                            dx_amax);
}

void fsdp_block_qkv(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_params *w) {
    fsdp_backend *be = k->be;
    if (k->kind.qk_norm) { /* transformers' Qwen3Attention: q_norm / k_norm of the projections, then RoPE */
        fsdp_block_linear(k, a->qkv_in, a->ln1, w->wqkv, w->bqkv, NULL, k->C, k->QKV, 0,
                          fsdp_block_amax(a, FSDP_PRODUCT_QKV, 1, 0), fsdp_block_weight8(k, FSDP_PRODUCT_QKV));
        be->ops->qk_norm_forward(be, a->qkv, a->qk_rstd, a->qkv_in, w->qnorm, w->knorm, k->N, k->Hq, k->Hkv, k->D,
                                 k->eps);
    } else {
        fsdp_block_linear(k, a->qkv, a->ln1, w->wqkv, w->bqkv, NULL, k->C, k->QKV, 0,
                          fsdp_block_amax(a, FSDP_PRODUCT_QKV, 1, 0), fsdp_block_weight8(k, FSDP_PRODUCT_QKV));
    }
    if (k->kind.rope) be->ops->rope_forward(be, a->qkv, k->cos_sin, k->B, k->T, k->Hq, k->Hkv, k->D);
}

void fsdp_block_attend(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_attention *at) {
    fsdp_backend *be = k->be;
    const int window = k->kind.window;
    if (!at->k_cache) {
        be->ops->attention_forward(be, at->mode, a->att, a->lse, a->probs, a->qkv, k->B, k->T, k->Hq, k->Hkv, k->D,
                                   window, at->drop);
        return;
    }
    be->ops->kv_cache_append(be, at->k_cache, at->v_cache, a->qkv, k->N, at->pos0, at->cap, k->Hq, k->Hkv, k->D);
    if (at->pos0 == 0 && k->N > 1) /* a prompt's prefill: the training attention over its own tokens */
        be->ops->attention_forward(be, FSDP_ATTN_FLASH, a->att, a->lse, NULL, a->qkv, 1, k->N, k->Hq, k->Hkv, k->D,
                                   window, NULL);
    else
        be->ops->attention_decode(be, a->att, a->qkv, at->k_cache, at->v_cache, k->N, at->pos0, at->cap, k->Hq,
                                  k->Hkv, k->D, window);
}

void fsdp_block_body(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_params *w,
                     const fsdp_block_attention *at, void *branch, const fsdp_dropout *attn_out_drop) {
    fsdp_backend *be = k->be;
    const int N = k->N, C = k->C;
    fsdp_block_qkv(k, a, w);
    fsdp_block_attend(k, a, at);
    if (attn_out_drop) {
        fsdp_block_linear(k, branch, a->att, w->wo, w->bo, NULL, k->Q, C, 0, fsdp_block_amax(a, FSDP_PRODUCT_O, 0, 0),
                          fsdp_block_weight8(k, FSDP_PRODUCT_O));
        fsdp_block_norm_dropout(k, a->res_mid, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_in, branch, w->ln2w, w->ln2b,
                                attn_out_drop, fsdp_block_input_amax(a, FSDP_PRODUCT_MLP_IN));
    } else {
        fsdp_block_linear(k, a->res_mid, a->att, w->wo, w->bo, a->res_in, k->Q, C, 0,
                          fsdp_block_amax(a, FSDP_PRODUCT_O, 0, 0), fsdp_block_weight8(k, FSDP_PRODUCT_O));
        fsdp_block_norm(k, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2w, w->ln2b,
                        fsdp_block_input_amax(a, FSDP_PRODUCT_MLP_IN));
    }
    if (k->kind.swiglu) {
        fsdp_block_linear(k, a->fc, a->ln2, w->w1, w->b1, NULL, C, 2 * k->F, 0,
                          fsdp_block_amax(a, FSDP_PRODUCT_MLP_IN, 1, 0), fsdp_block_weight8(k, FSDP_PRODUCT_MLP_IN));
        be->ops->swiglu_forward(be, a->fc_act, a->fc, N, k->F, fsdp_block_input_amax(a, FSDP_PRODUCT_MLP_OUT));
    } else {
        fsdp_block_linear(k, a->fc, a->ln2, w->w1, w->b1, NULL, C, k->F, 1,
                          fsdp_block_amax(a, FSDP_PRODUCT_MLP_IN, 1, 0), fsdp_block_weight8(k, FSDP_PRODUCT_MLP_IN));
    }
}

void fsdp_block_forward(const fsdp_block_ctx *k, fsdp_block_acts *a, const fsdp_block_params *w,
                        const fsdp_block_attention *at, void *out) {
    fsdp_block_norm(k, a->ln1, a->ln1_mean, a->ln1_rstd, a->res_in, w->ln1w, w->ln1b,
                    fsdp_block_input_amax(a, FSDP_PRODUCT_QKV));
    fsdp_block_body(k, a, w, at, NULL, NULL);
    fsdp_block_linear(k, out, a->fc_act, w->w2, w->b2, a->res_mid, k->F, k->C, 0,
                      fsdp_block_amax(a, FSDP_PRODUCT_MLP_OUT, k->kind.swiglu, 0),
                      fsdp_block_weight8(k, FSDP_PRODUCT_MLP_OUT));
}
