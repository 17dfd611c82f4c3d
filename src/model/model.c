/* Forward and backward of the units over the backend's ops; a block's forward is block.c's (shared
 * with generation), and what varies between families (norm, MLP, positions, biases, qk_norm, the
 * attention window) comes from fsdp_block_kind_of. */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "model_internal.h"
#include "unit_params.h"

/* ---- creation ---- */

fsdp_model *fsdp_model_create(fsdp_backend *be, const fsdp_model_config *cfg, const fsdp_layout *layout,
                              const fsdp_model_shape *shape, fsdp_err *err) {
    if (shape->batch <= 0 || shape->seq <= 0) {
        fsdp_errf(err, "micro-batch size and sequence length must be positive");
        return NULL;
    }
    if (cfg->family->pos == FSDP_POS_LEARNED && shape->seq > cfg->max_position_embeddings) {
        fsdp_usagef(err, "--seq %d exceeds the model's max_position_embeddings %d (%s has learned positions)",
                    shape->seq, cfg->max_position_embeddings, cfg->family->model_type);
        return NULL;
    }
    if ((long long)shape->batch * shape->seq > (1LL << 30)) {
        fsdp_errf(err, "micro-batch x sequence (%lld tokens) is too large", (long long)shape->batch * shape->seq);
        return NULL;
    }
    if (shape->recompute != FSDP_RECOMPUTE_NONE && shape->recompute != FSDP_RECOMPUTE_SELECTIVE &&
        shape->recompute != FSDP_RECOMPUTE_FULL) {
        fsdp_errf(err, "unknown activation recomputation mode %d", (int)shape->recompute);
        return NULL;
    }
    if (!fsdp_dropout_rate_ok(shape->dropout.hidden) || !fsdp_dropout_rate_ok(shape->dropout.attention)) {
        fsdp_errf(err, "dropout rates %g and %g must lie in [0, 1)", (double)shape->dropout.hidden,
                  (double)shape->dropout.attention);
        return NULL;
    }
    fsdp_model *m = fsdp_xcalloc(1, sizeof *m, "the model");
    m->be = be;
    m->cfg = *cfg;
    m->layout = layout;
    m->ae = be->runtime->dtype_size(be, be->act_dtype);
    m->ge = be->runtime->dtype_size(be, be->grad_dtype);
    fsdp_model_dims d = fsdp_model_make_dims(cfg, shape, m->ae);
    m->B = d.B, m->T = d.T, m->N = d.N, m->C = d.C, m->F = d.F, m->Hq = d.Hq, m->Hkv = d.Hkv, m->D = d.D;
    m->QKV = d.QKV, m->Q = d.Q, m->V = d.V, m->chunk_rows = d.chunk, m->attn = d.attn, m->recompute = d.recompute;
    m->blk = fsdp_block_ctx_make(be, cfg);
    m->blk.N = d.N, m->blk.B = d.B, m->blk.T = d.T;
    m->blk.fp8 = fsdp_fp8_recipe_of(shape->fp8);
    m->rms = m->blk.kind.rms, m->swiglu = m->blk.kind.swiglu, m->rope = m->blk.kind.rope;
    m->pos_offset = m->blk.kind.pos_offset;
    m->padding_idx = fsdp_model_padding_idx(cfg);
    m->rates = shape->dropout;
    m->layers = fsdp_xcalloc((size_t)cfg->num_layers, sizeof *m->layers, "layer activations");

    m->arena_bytes = fsdp_model_arena_walk(&d, NULL, NULL, NULL);
    m->arena = be->runtime->alloc(be, m->arena_bytes, "activations");
    fsdp_model_arena_walk(&d, m->arena, m, NULL);
    m->blk.cos_sin = m->cos_sin;

    float *table = fsdp_xmalloc((size_t)d.T * d.D * sizeof(float), "the rotary table");
    fsdp_model_rope_table(cfg, d.T, table);
    be->runtime->copy_h2d(be, m->cos_sin, table, (size_t)d.T * d.D * sizeof(float), be->compute);
    be->runtime->stream_synchronize(be, be->compute);
    free(table);
    return m;
}

void fsdp_model_destroy(fsdp_model *m) {
    if (!m) return;
    m->be->runtime->free(m->be, m->arena);
    free(m->layers);
    free(m);
}

int32_t *fsdp_model_tokens(fsdp_model *m) { return m->tokens; }
int32_t *fsdp_model_targets(fsdp_model *m) { return m->targets; }
const void *fsdp_model_final_hidden(const fsdp_model *m) { return m->lnf; }
const void *fsdp_model_layer_input(const fsdp_model *m, int layer) {
    return layer < m->cfg.num_layers ? m->layers[layer].res_in : m->res_out;
}

void fsdp_model_set_dropout(fsdp_model *m, int training, uint64_t seed, int64_t sample_base) {
    m->training = training;
    m->drop_seed = seed;
    m->sample_base = sample_base;
}

/* ---- dropout of this micro-batch ---- */

/* Residual dropout is on: blocks write their outputs to `branch` and the norms drop them in. */
static int residual_dropping(const fsdp_model *m) { return m->training && m->rates.hidden > 0.0f; }

/* The descriptor of (layer, site) at rate p in *buf, or NULL when nothing is dropped there. */
static const fsdp_dropout *dropout_at(const fsdp_model *m, fsdp_dropout *buf, float p, int layer, int site) {
    if (!m->training || !(p > 0.0f)) return NULL;
    *buf = fsdp_dropout_make(p, m->drop_seed, m->sample_base, layer, site);
    return buf;
}

/* ---- parameter addressing inside a unit's flat buffer (unit_params.h, shared with kv_decode.c) ---- */

static void *param(const fsdp_model *m, int unit, fsdp_module mod, int bias, const void *base, size_t esize) {
    return fsdp_unit_param(m->layout, unit, mod, bias, base, esize);
}

typedef fsdp_block_params block_ptrs;

static block_ptrs block_view(const fsdp_model *m, int layer, const void *base, size_t esize) {
    return fsdp_block_view(m->layout, m->swiglu, layer, base, esize);
}

/* out_amax: where a tensorwise FP8 product of out wants its amax (fsdp_block_input_amax; NULL: none). */
static void norm_forward(fsdp_model *m, void *out, float *mean, float *rstd, const void *inp, const void *w,
                         const void *b, float *out_amax) {
    fsdp_block_norm(&m->blk, out, mean, rstd, inp, w, b, out_amax);
}

/* dinp_amax (NULL: none): where the projection whose output gradient dinp becomes wants its amax. */
static void norm_backward(fsdp_model *m, void *dinp, void *dw, void *db, const void *dout, const void *inp,
                          const void *w, const float *mean, const float *rstd, float *dinp_amax) {
    fsdp_block_norm_backward(&m->blk, dinp, dw, db, dout, inp, w, mean, rstd, dinp_amax);
}

/* res_out = residual + dropped x, then the norm of res_out (the fused backend ops). */
static void norm_dropout_forward(fsdp_model *m, void *res_out, void *out, float *mean, float *rstd,
                                 const void *residual, const void *x, const void *w, const void *b,
                                 const fsdp_dropout *drop, float *out_amax) {
    fsdp_block_norm_dropout(&m->blk, res_out, out, mean, rstd, residual, x, w, b, drop, out_amax);
}

/* The norm's backward (dinp +=) and then dx = the dropped dinp: the gradient of the branch (dx_amax:
 * as norm_backward's, of dx). */
static void norm_dropout_backward(fsdp_model *m, void *dinp, void *dx, void *dw, void *db, const void *dout,
                                  const void *inp, const void *w, const float *mean, const float *rstd,
                                  const fsdp_dropout *drop, float *dx_amax) {
    fsdp_block_norm_dropout_backward(&m->blk, dinp, dx, dw, db, dout, inp, w, mean, rstd, drop, dx_amax);
}

static void *layer_output(fsdp_model *m, int layer) {
    return layer + 1 < m->cfg.num_layers ? m->layers[layer + 1].res_in : m->res_out;
}

/* ---- forward ---- */

void fsdp_model_embed_forward(fsdp_model *m, const void *embed_params) {
    fsdp_backend *be = m->be;
    int u = fsdp_unit_embed(m->layout);
    const void *wte = param(m, u, FSDP_MOD_EMBED_TOKENS, 0, embed_params, m->ae);
    const void *wpe = param(m, u, FSDP_MOD_EMBED_POSITIONS, 0, embed_params, m->ae); /* NULL with RoPE */
    be->ops->embedding_forward(be, m->layers[0].res_in, m->tokens, wte, wpe, m->pos_offset, m->N, m->T, m->C);
}

/* The block's attention over its own micro-batch, probabilities dropped at the layer's rate. */
static fsdp_block_attention own_attention(const fsdp_model *m, fsdp_dropout *buf, int layer) {
    fsdp_block_attention at = {m->attn, dropout_at(m, buf, m->rates.attention, layer, FSDP_DROPOUT_ATTN_PROBS), NULL,
                               NULL, 0, 0};
    return at;
}

/* A layer from its first norm's output on (block.c's body): q|k|v, qk_norm, rotary, attention, the
 * output projection with the residual add (with residual dropout: into branch, added and dropped by
 * the post-attention norm), the post-attention norm, and the MLP's first product and activation.
 * Everything but the last product: what block_backward reads, and what FULL recomputes. */
static void layer_body(fsdp_model *m, int layer, layer_acts *a, const block_ptrs *w) {
    fsdp_dropout d_probs, d_attn;
    fsdp_block_attention at = own_attention(m, &d_probs, layer);
    const fsdp_dropout *attn_out =
        residual_dropping(m) ? dropout_at(m, &d_attn, m->rates.hidden, layer, FSDP_DROPOUT_ATTN_OUT) : NULL;
    fsdp_block_body(&m->blk, a, w, &at, m->branch, attn_out);
}

static void block_forward(fsdp_model *m, int layer, const void *params) {
    layer_acts *a = &m->layers[layer];
    block_ptrs w = block_view(m, layer, params, m->ae);
    const int dropping = residual_dropping(m);
    fsdp_dropout d_mlp;

    if (!dropping) { /* the block as generation runs it (block.c) */
        fsdp_dropout d_probs;
        fsdp_block_attention at = own_attention(m, &d_probs, layer);
        fsdp_block_forward(&m->blk, a, &w, &at, layer_output(m, layer));
        return;
    }
    if (layer > 0) /* completes the previous layer's output: its MLP branch, dropped */
        norm_dropout_forward(m, a->res_in, a->ln1, a->ln1_mean, a->ln1_rstd, m->layers[layer - 1].res_mid, m->branch,
                             w.ln1w, w.ln1b, dropout_at(m, &d_mlp, m->rates.hidden, layer - 1, FSDP_DROPOUT_MLP_OUT),
                             fsdp_block_input_amax(a, FSDP_PRODUCT_QKV));
    else
        norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, a->res_in, w.ln1w, w.ln1b,
                     fsdp_block_input_amax(a, FSDP_PRODUCT_QKV));
    layer_body(m, layer, a, &w);
    /* The next layer's input norm (or the final norm) adds the MLP output to res_mid. */
    fsdp_block_linear(&m->blk, m->branch, a->fc_act, w.w2, w.b2, NULL, m->F, m->C, 0,
                      fsdp_block_amax(a, FSDP_PRODUCT_MLP_OUT, m->swiglu, 0),
                      fsdp_block_weight8(&m->blk, FSDP_PRODUCT_MLP_OUT));
}

void fsdp_model_block_forward(fsdp_model *m, int layer, const void *params) {
    block_forward(m, layer, params);
    m->blk.weights8 = NULL;
}

_Static_assert(FSDP_BLOCK_PRODUCTS == FSDP_FP8_MAX_MATRICES, "a block's FP8 weights are its products'");

void fsdp_model_set_fp8_weights(fsdp_model *m, const fsdp_fp8_weight *weights8) {
    /* Only tensorwise products take a weight cast ahead (one scale for W and W^T alike). */
    m->blk.weights8 = m->blk.fp8.granularity == FSDP_FP8_TENSORWISE ? weights8 : NULL;
}

int fsdp_model_fp8_matrices(const fsdp_model_config *cfg, const fsdp_layout *layout, int u,
                            fsdp_fp8_matrix out[FSDP_FP8_MAX_MATRICES]) {
    const fsdp_unit_desc *d = &layout->units[u];
    if (d->kind != FSDP_UNIT_BLOCK) return 0;
    const fsdp_block_kind k = fsdp_block_kind_of(cfg);
    const int C = cfg->hidden_size, F = cfg->intermediate_size, Q = cfg->num_heads * cfg->head_dim;
    const int QKV = (cfg->num_heads + 2 * cfg->num_kv_heads) * cfg->head_dim;
    /* q|k|v and gate|up are adjacent (layout.c): the first of each starts the fused weight. */
    const int first[FSDP_BLOCK_PRODUCTS] = {d->weight[FSDP_MOD_Q], d->weight[FSDP_MOD_O],
                                            d->weight[k.swiglu ? FSDP_MOD_GATE : FSDP_MOD_UP],
                                            d->weight[FSDP_MOD_DOWN]};
    const int rows[FSDP_BLOCK_PRODUCTS] = {QKV, C, k.swiglu ? 2 * F : F, C}, cols[FSDP_BLOCK_PRODUCTS] = {C, Q, C, F};
    for (int p = 0; p < FSDP_BLOCK_PRODUCTS; p++)
        out[p] = (fsdp_fp8_matrix){layout->params[first[p]].offset, rows[p], cols[p]};
    return FSDP_BLOCK_PRODUCTS;
}

/* ---- recomputation: what block_backward reads of a layer that the layer did not keep ---- */

/* Where a dropped branch joins the residual stream the forward ran a norm fused with the dropout
 * (*norm_dropout_forward); those ops normalise the stored (rounded) residual row exactly as the
 * plain norm does, so the plain norm of the kept residual recomputes their output. */
static void recompute_layer(fsdp_model *m, int layer, layer_acts *a, const block_ptrs *w) {
    fsdp_backend *be = m->be;
    /* the amax the forward reported: equal values, reported again */
    norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, a->res_in, w->ln1w, w->ln1b,
                 fsdp_block_input_amax(a, FSDP_PRODUCT_QKV));
    if (m->recompute == FSDP_RECOMPUTE_FULL) {
        layer_body(m, layer, a, w);
        return;
    }
    /* SELECTIVE: the products' outputs are kept. Eager attention's probabilities (and lse) come from
     * a second run of its forward, whose output, equal to the kept one, lands in datt: the backward
     * overwrites datt before it reads it. */
    if (m->attn == FSDP_ATTN_EAGER) {
        fsdp_dropout d_probs;
        be->ops->attention_forward(be, m->attn, m->datt, a->lse, a->probs, a->qkv, m->B, m->T, m->Hq, m->Hkv, m->D,
                                   m->blk.kind.window,
                                   dropout_at(m, &d_probs, m->rates.attention, layer, FSDP_DROPOUT_ATTN_PROBS));
    }
    norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w->ln2w, w->ln2b,
                 fsdp_block_input_amax(a, FSDP_PRODUCT_MLP_IN));
    if (m->swiglu) be->ops->swiglu_forward(be, a->fc_act, a->fc, m->N, m->F, fsdp_block_input_amax(a, FSDP_PRODUCT_MLP_OUT));
}

/* ---- head: final norm, chunked LM head + cross-entropy, and their backward ---- */

/* The head's forward, and with `backward` its backward: one walk over the chunks, so that the loss
 * of evaluation is the loss of training. Forward-only passes NULL gradient buffers. */
static void head_pass(fsdp_model *m, const void *head_params, void *head_grads, const void *embed_params,
                      void *embed_grads, float grad_scale, float *loss_sum, int backward) {
    fsdp_backend *be = m->be;
    int hu = fsdp_unit_head(m->layout), eu = fsdp_unit_embed(m->layout);
    const void *w_head;
    void *dw_head;
    if (m->cfg.tie_word_embeddings) {
        w_head = param(m, eu, FSDP_MOD_EMBED_TOKENS, 0, embed_params, m->ae);
        dw_head = param(m, eu, FSDP_MOD_EMBED_TOKENS, 0, embed_grads, m->ge);
    } else {
        w_head = param(m, hu, FSDP_MOD_LM_HEAD, 0, head_params, m->ae);
        dw_head = param(m, hu, FSDP_MOD_LM_HEAD, 0, head_grads, m->ge);
    }
    const void *normw = param(m, hu, FSDP_MOD_NORM_FINAL, 0, head_params, m->ae);
    const void *normb = param(m, hu, FSDP_MOD_NORM_FINAL, 1, head_params, m->ae);
    void *dnormw = param(m, hu, FSDP_MOD_NORM_FINAL, 0, head_grads, m->ge);
    void *dnormb = param(m, hu, FSDP_MOD_NORM_FINAL, 1, head_grads, m->ge);

    const int L = m->cfg.num_layers;
    fsdp_dropout d_mlp;
    const fsdp_dropout *drop =
        residual_dropping(m) ? dropout_at(m, &d_mlp, m->rates.hidden, L - 1, FSDP_DROPOUT_MLP_OUT) : NULL;
    if (drop) /* completes the last layer's output: its MLP branch, dropped */
        norm_dropout_forward(m, m->res_out, m->lnf, m->lnf_mean, m->lnf_rstd, m->layers[L - 1].res_mid, m->branch,
                             normw, normb, drop, NULL);
    else
        norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->res_out, normw, normb, NULL);
    for (int r0 = 0; r0 < m->N; r0 += m->chunk_rows) {
        int rows = m->N - r0 < m->chunk_rows ? m->N - r0 : m->chunk_rows;
        const char *h = (const char *)m->lnf + (size_t)r0 * m->C * m->ae;
        char *dh = (char *)m->dln + (size_t)r0 * m->C * m->ae;
        be->ops->matmul_forward(be, m->logits, h, w_head, NULL, NULL, rows, m->C, m->V, 0);
        /* Forward-only still gets the (unused) logit gradient: the op is fused, and cheap next to the
         * product. */
        be->ops->cross_entropy(be, m->losses + r0, m->logits, m->targets + r0, rows, m->V, grad_scale);
        if (backward) be->ops->matmul_backward(be, dh, dw_head, NULL, m->logits, h, w_head, rows, m->C, m->V);
    }
    be->ops->sum(be, loss_sum, m->losses, (size_t)m->N, be->compute);
    if (!backward) return;
    /* The norm's backward adds into the residual gradient, which starts here; what it writes is the
     * output gradient of the last layer's MLP projection, whose amax it reports. */
    be->runtime->zero(be, m->dres, (size_t)m->N * m->C * m->ae, be->compute);
    float *mlp_out_amax = fsdp_block_grad_amax(&m->layers[L - 1], FSDP_PRODUCT_MLP_OUT);
    if (drop) /* and the last layer's MLP output gets its dropped share, in dbranch */
        norm_dropout_backward(m, m->dres, m->dbranch, dnormw, dnormb, m->dln, m->res_out, normw, m->lnf_mean,
                              m->lnf_rstd, drop, mlp_out_amax);
    else
        norm_backward(m, m->dres, dnormw, dnormb, m->dln, m->res_out, normw, m->lnf_mean, m->lnf_rstd, mlp_out_amax);
}

void fsdp_model_head(fsdp_model *m, const void *head_params, void *head_grads, const void *embed_params,
                     void *embed_grads, float grad_scale, float *loss_sum) {
    head_pass(m, head_params, head_grads, embed_params, embed_grads, grad_scale, loss_sum, 1);
}

void fsdp_model_head_loss(fsdp_model *m, const void *head_params, const void *embed_params, float *loss_sum) {
    head_pass(m, head_params, NULL, embed_params, NULL, 0.0f, loss_sum, 0);
}

/* ---- backward ---- */

static void block_backward(fsdp_model *m, int layer, const void *params, void *grads) {
    fsdp_backend *be = m->be;
    layer_acts *a = &m->layers[layer];
    block_ptrs w = block_view(m, layer, params, m->ae);
    block_ptrs g = block_view(m, layer, grads, m->ge);
    int N = m->N, C = m->C;
    if (m->recompute != FSDP_RECOMPUTE_NONE) recompute_layer(m, layer, a, &w);

    const int dropping = residual_dropping(m);
    fsdp_dropout d_attn, d_probs, d_mlp;
    /* The gradient of a branch output: with residual dropout the dropped share of the residual
     * gradient that the following norm's backward wrote (for the MLP: the next unit's). */
    const void *dbranch = dropping ? m->dbranch : m->dres;

    /* MLP: dres is d(layer output); the residual path passes it through unchanged. The amax of each
     * product's output gradient comes from the op that wrote it: the following norm's backward (for
     * the MLP's: the next layer's or the head's), SwiGLU's backward, rotary's backward. */
    if (m->swiglu) {
        fsdp_block_linear_backward(&m->blk, m->dh, g.w2, g.b2, dbranch, a->fc_act, w.w2, m->F, C,
                                   fsdp_block_amax(a, FSDP_PRODUCT_MLP_OUT, 1, 1),
                                   fsdp_block_weight8(&m->blk, FSDP_PRODUCT_MLP_OUT));
        be->ops->swiglu_backward(be, m->dfc, m->dh, a->fc, N, m->F, fsdp_block_grad_amax(a, FSDP_PRODUCT_MLP_IN));
        fsdp_block_linear_backward(&m->blk, m->dln, g.w1, g.b1, m->dfc, a->ln2, w.w1, C, 2 * m->F,
                                   fsdp_block_amax(a, FSDP_PRODUCT_MLP_IN, 1, 1),
                                   fsdp_block_weight8(&m->blk, FSDP_PRODUCT_MLP_IN));
    } else {
        fsdp_block_linear_backward(&m->blk, m->dfc, g.w2, g.b2, dbranch, a->fc_act, w.w2, m->F, C,
                                   fsdp_block_amax(a, FSDP_PRODUCT_MLP_OUT, 0, 1),
                                   fsdp_block_weight8(&m->blk, FSDP_PRODUCT_MLP_OUT));
        be->ops->relu_backward(be, m->dfc, a->fc, (size_t)N * m->F);
        fsdp_block_linear_backward(&m->blk, m->dln, g.w1, g.b1, m->dfc, a->ln2, w.w1, C, m->F,
                                   fsdp_block_amax(a, FSDP_PRODUCT_MLP_IN, 1, 0),
                                   fsdp_block_weight8(&m->blk, FSDP_PRODUCT_MLP_IN));
    }
    if (dropping)
        norm_dropout_backward(m, m->dres, m->dbranch, g.ln2w, g.ln2b, m->dln, a->res_mid, w.ln2w, a->ln2_mean,
                              a->ln2_rstd, dropout_at(m, &d_attn, m->rates.hidden, layer, FSDP_DROPOUT_ATTN_OUT),
                              fsdp_block_grad_amax(a, FSDP_PRODUCT_O));
    else
        norm_backward(m, m->dres, g.ln2w, g.ln2b, m->dln, a->res_mid, w.ln2w, a->ln2_mean, a->ln2_rstd,
                      fsdp_block_grad_amax(a, FSDP_PRODUCT_O));

    /* Attention: dres is now d(res_mid). */
    fsdp_block_linear_backward(&m->blk, m->datt, g.wo, g.bo, dbranch, a->att, w.wo, m->Q, C,
                               fsdp_block_amax(a, FSDP_PRODUCT_O, 0, 1), fsdp_block_weight8(&m->blk, FSDP_PRODUCT_O));
    be->ops->attention_backward(be, m->attn, m->dqkv, m->datt, a->qkv, a->att, a->lse, a->probs, m->B, m->T, m->Hq,
                                m->Hkv, m->D, m->blk.kind.window,
                                dropout_at(m, &d_probs, m->rates.attention, layer, FSDP_DROPOUT_ATTN_PROBS));
    /* Rotary's backward reports dqkv's amax unless the per-head norms' backward writes dqkv after it. */
    const int rope_reports = m->rope && !m->blk.kind.qk_norm;
    if (m->rope)
        be->ops->rope_backward(be, m->dqkv, m->cos_sin, m->B, m->T, m->Hq, m->Hkv, m->D,
                               rope_reports ? fsdp_block_grad_amax(a, FSDP_PRODUCT_QKV) : NULL);
    if (m->blk.kind.qk_norm) /* through the per-head norms, in place: dqkv becomes d(q|k|v before them) */
        be->ops->qk_norm_backward(be, m->dqkv, g.qnorm, g.knorm, m->dqkv, a->qkv_in, w.qnorm, w.knorm, a->qk_rstd, N,
                                  m->Hq, m->Hkv, m->D);
    fsdp_block_linear_backward(&m->blk, m->dln, g.wqkv, g.bqkv, m->dqkv, a->ln1, w.wqkv, C, m->QKV,
                               fsdp_block_amax(a, FSDP_PRODUCT_QKV, 1, rope_reports),
                               fsdp_block_weight8(&m->blk, FSDP_PRODUCT_QKV));
    /* What this norm's backward writes is the previous layer's MLP output gradient. */
    float *prev_mlp_out_amax = layer > 0 ? fsdp_block_grad_amax(&m->layers[layer - 1], FSDP_PRODUCT_MLP_OUT) : NULL;
    if (dropping && layer > 0) /* the previous layer's MLP output gets its dropped share */
        norm_dropout_backward(m, m->dres, m->dbranch, g.ln1w, g.ln1b, m->dln, a->res_in, w.ln1w, a->ln1_mean,
                              a->ln1_rstd, dropout_at(m, &d_mlp, m->rates.hidden, layer - 1, FSDP_DROPOUT_MLP_OUT),
                              prev_mlp_out_amax);
    else
        norm_backward(m, m->dres, g.ln1w, g.ln1b, m->dln, a->res_in, w.ln1w, a->ln1_mean, a->ln1_rstd,
                      prev_mlp_out_amax);
}

void fsdp_model_block_backward(fsdp_model *m, int layer, const void *params, void *grads) {
    block_backward(m, layer, params, grads);
    m->blk.weights8 = NULL;
}

int fsdp_model_embed_grad_rows(fsdp_model *m, fsdp_row_set sets[FSDP_MAX_ROW_SETS], const void **values, int *count,
                               int *row_len) {
    const fsdp_unit_desc *u = &m->layout->units[fsdp_unit_embed(m->layout)];
    const fsdp_param_desc *p = m->layout->params;
    sets[0] = (fsdp_row_set){p[u->weight[FSDP_MOD_EMBED_TOKENS]].offset, m->tokens, 0, 1, m->padding_idx};
    int n = 1;
    int pos = u->weight[FSDP_MOD_EMBED_POSITIONS];
    if (pos >= 0) sets[n++] = (fsdp_row_set){p[pos].offset, NULL, m->pos_offset, m->T, -1};
    *values = m->dres;
    *count = m->N;
    *row_len = m->C;
    return n;
}

void fsdp_model_embed_backward(fsdp_model *m, const void *embed_params, void *embed_grads) {
    (void)embed_params;
    fsdp_backend *be = m->be;
    int u = fsdp_unit_embed(m->layout);
    void *dwte = param(m, u, FSDP_MOD_EMBED_TOKENS, 0, embed_grads, m->ge);
    void *dwpe = param(m, u, FSDP_MOD_EMBED_POSITIONS, 0, embed_grads, m->ge);
    be->ops->embedding_backward(be, dwte, dwpe, m->dres, m->tokens, m->padding_idx, m->pos_offset, m->N, m->T, m->C);
}
