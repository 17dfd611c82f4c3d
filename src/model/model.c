/* Forward and backward of the units over the backend's ops; what varies between families (norm,
 * MLP, positions, biases) comes from the family descriptor. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"

static const double PI = 3.14159265358979323846;

/* Saved activations of one transformer layer (pointers into the arena). */
typedef struct {
    void *res_in;           /* [N,C] input of the layer (the residual stream) */
    void *ln1;              /* [N,C] */
    float *ln1_mean, *ln1_rstd;
    void *qkv;              /* [N,QKV] after rotary */
    void *att;              /* [N,Q] attention output (before o_proj) */
    float *lse;             /* [B,Hq,T] */
    void *probs;            /* [B,Hq,T,T], eager only */
    void *res_mid;          /* [N,C] after the attention residual add */
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *fc;               /* SwiGLU: gate|up [N,2F]; ReLU: relu(fc1) [N,F] */
    void *fc_act;           /* SwiGLU: its output [N,F]; ReLU: == fc */
} layer_acts;

struct fsdp_model {
    fsdp_backend *be;
    fsdp_model_config cfg;
    const fsdp_layout *layout;
    int B, T, N, C, F, Hq, Hkv, D, QKV, Q, V;
    int chunk_rows;
    fsdp_attn attn;
    int rms, swiglu, rope; /* the family's norm, MLP and position kinds */
    int pos_offset;        /* learned positions: table row of position 0 */
    int padding_idx;       /* token embedding row without input gradient, or -1 */
    size_t ae, ge; /* bytes per act / grad element */

    void *arena;
    size_t arena_bytes;
    int32_t *tokens, *targets;
    float *cos_sin;
    layer_acts *layers;
    void *res_out; /* [N,C] output of the last layer */
    void *lnf;
    float *lnf_mean, *lnf_rstd;
    /* backward scratch, shared by all layers */
    void *dres, *dln, *dqkv, *datt, *dfc, *dh, *logits;
    float *losses;
};

/* ---- arena planning: the same walk sizes the arena and carves it ---- */

typedef struct {
    char *base; /* NULL while only measuring */
    size_t used;
} carver;

static void *carve(carver *c, size_t bytes) {
    size_t off = (c->used + 255) & ~(size_t)255;
    c->used = off + bytes;
    return c->base ? c->base + off : NULL;
}

typedef struct {
    int B, T, N, C, F, Hq, Hkv, D, QKV, Q, V, L, chunk, rms, swiglu;
    fsdp_attn attn;
    size_t ae;
} dims;

static dims make_dims(const fsdp_model_config *cfg, const fsdp_model_shape *s, size_t ae) {
    dims d;
    d.B = s->batch, d.T = s->seq, d.N = s->batch * s->seq;
    d.C = cfg->hidden_size, d.F = cfg->intermediate_size;
    d.Hq = cfg->num_heads, d.Hkv = cfg->num_kv_heads, d.D = cfg->head_dim;
    d.Q = d.Hq * d.D, d.QKV = (d.Hq + 2 * d.Hkv) * d.D, d.V = cfg->vocab_size, d.L = cfg->num_layers;
    d.rms = cfg->family->norm == FSDP_NORM_RMS;
    d.swiglu = cfg->family->mlp == FSDP_MLP_SWIGLU;
    d.attn = s->attn;
    d.ae = ae;
    int chunk = s->head_chunk_rows;
    if (chunk <= 0) {
        /* About 512 MiB of logits per chunk: large enough for efficient products, small next to
         * the full [N, V] logits it replaces. */
        size_t rows = ((size_t)512 << 20) / ((size_t)d.V * ae);
        chunk = rows > 128 ? (int)(rows / 128 * 128) : 128;
    }
    d.chunk = chunk < d.N ? chunk : d.N;
    return d;
}

static void plan(carver *c, const dims *d, fsdp_model *m) {
    size_t N = (size_t)d->N, ae = d->ae;
    size_t fc_cols = d->swiglu ? 2 * (size_t)d->F : (size_t)d->F;
    int32_t *tokens = carve(c, N * sizeof(int32_t));
    int32_t *targets = carve(c, N * sizeof(int32_t));
    float *cos_sin = carve(c, (size_t)d->T * d->D * sizeof(float));
    for (int l = 0; l < d->L; l++) {
        layer_acts a;
        memset(&a, 0, sizeof a);
        a.res_in = carve(c, N * d->C * ae);
        a.ln1 = carve(c, N * d->C * ae);
        if (!d->rms) a.ln1_mean = carve(c, N * sizeof(float));
        a.ln1_rstd = carve(c, N * sizeof(float));
        a.qkv = carve(c, N * d->QKV * ae);
        a.att = carve(c, N * d->Q * ae);
        a.lse = carve(c, (size_t)d->B * d->Hq * d->T * sizeof(float));
        if (d->attn == FSDP_ATTN_EAGER) a.probs = carve(c, (size_t)d->B * d->Hq * d->T * d->T * ae);
        a.res_mid = carve(c, N * d->C * ae);
        a.ln2 = carve(c, N * d->C * ae);
        if (!d->rms) a.ln2_mean = carve(c, N * sizeof(float));
        a.ln2_rstd = carve(c, N * sizeof(float));
        a.fc = carve(c, N * fc_cols * ae);
        a.fc_act = d->swiglu ? carve(c, N * d->F * ae) : a.fc;
        if (m) m->layers[l] = a;
    }
    void *res_out = carve(c, N * d->C * ae);
    void *lnf = carve(c, N * d->C * ae);
    float *lnf_mean = d->rms ? NULL : carve(c, N * sizeof(float));
    float *lnf_rstd = carve(c, N * sizeof(float));
    void *dres = carve(c, N * d->C * ae);
    void *dln = carve(c, N * d->C * ae);
    void *dqkv = carve(c, N * d->QKV * ae);
    void *datt = carve(c, N * d->Q * ae);
    void *dfc = carve(c, N * fc_cols * ae);
    void *dh = d->swiglu ? carve(c, N * d->F * ae) : NULL;
    void *logits = carve(c, (size_t)d->chunk * d->V * ae);
    float *losses = carve(c, N * sizeof(float));
    if (m) {
        m->tokens = tokens, m->targets = targets, m->cos_sin = cos_sin;
        m->res_out = res_out, m->lnf = lnf, m->lnf_mean = lnf_mean, m->lnf_rstd = lnf_rstd;
        m->dres = dres, m->dln = dln, m->dqkv = dqkv, m->datt = datt, m->dfc = dfc, m->dh = dh;
        m->logits = logits, m->losses = losses;
    }
}

size_t fsdp_model_activation_bytes(const fsdp_model_config *cfg, const fsdp_model_shape *shape, size_t act_esize) {
    dims d = make_dims(cfg, shape, act_esize);
    carver c = {NULL, 0};
    plan(&c, &d, NULL);
    return c.used;
}

/* ---- rotary table ---- */

void fsdp_model_rope_table(const fsdp_model_config *cfg, int T, float *out) {
    int half = cfg->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* inv_freq as transformers computes it; linear scaling divides it by `factor`; the llama3
         * rule slows long wavelengths by `factor`, keeps short ones, and blends the band between. */
        double inv_freq = 1.0 / pow((double)cfg->rope_theta, (2.0 * i) / cfg->head_dim);
        if (cfg->rope_type == FSDP_ROPE_LINEAR) inv_freq /= cfg->rope_factor;
        if (cfg->rope_type == FSDP_ROPE_LLAMA3) {
            double factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
            double old_ctx = cfg->rope_original_max_position;
            double low_freq_wavelen = old_ctx / lo, high_freq_wavelen = old_ctx / hi;
            double wavelen = 2.0 * PI / inv_freq;
            if (wavelen > low_freq_wavelen) {
                inv_freq = inv_freq / factor;
            } else if (wavelen >= high_freq_wavelen) {
                double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                inv_freq = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
            }
        }
        for (int t = 0; t < T; t++) {
            double angle = (double)t * inv_freq;
            out[((size_t)t * half + i) * 2 + 0] = (float)cos(angle);
            out[((size_t)t * half + i) * 2 + 1] = (float)sin(angle);
        }
    }
}

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
    fsdp_model *m = fsdp_xcalloc(1, sizeof *m, "the model");
    m->be = be;
    m->cfg = *cfg;
    m->layout = layout;
    m->ae = be->dtype_size(be, be->act_dtype);
    m->ge = be->dtype_size(be, be->grad_dtype);
    dims d = make_dims(cfg, shape, m->ae);
    m->B = d.B, m->T = d.T, m->N = d.N, m->C = d.C, m->F = d.F, m->Hq = d.Hq, m->Hkv = d.Hkv, m->D = d.D;
    m->QKV = d.QKV, m->Q = d.Q, m->V = d.V, m->chunk_rows = d.chunk, m->attn = d.attn;
    m->rms = d.rms, m->swiglu = d.swiglu, m->rope = cfg->family->pos == FSDP_POS_ROPE;
    m->pos_offset = cfg->family->pos_offset;
    m->padding_idx = fsdp_model_padding_idx(cfg);
    m->layers = fsdp_xcalloc((size_t)cfg->num_layers, sizeof *m->layers, "layer activations");

    carver c = {NULL, 0};
    plan(&c, &d, NULL);
    m->arena_bytes = c.used;
    m->arena = be->alloc(be, m->arena_bytes, "activations");
    c.base = m->arena;
    c.used = 0;
    plan(&c, &d, m);

    float *table = fsdp_xmalloc((size_t)d.T * d.D * sizeof(float), "the rotary table");
    fsdp_model_rope_table(cfg, d.T, table);
    be->copy_h2d(be, m->cos_sin, table, (size_t)d.T * d.D * sizeof(float), be->compute);
    be->stream_synchronize(be, be->compute);
    free(table);
    return m;
}

void fsdp_model_destroy(fsdp_model *m) {
    if (!m) return;
    m->be->free(m->be, m->arena);
    free(m->layers);
    free(m);
}

int32_t *fsdp_model_tokens(fsdp_model *m) { return m->tokens; }
int32_t *fsdp_model_targets(fsdp_model *m) { return m->targets; }
const void *fsdp_model_final_hidden(const fsdp_model *m) { return m->lnf; }

/* ---- parameter addressing inside a unit's flat buffer ---- */

/* Module `mod`'s weight (or bias) inside unit `unit`'s flat buffer at `base`, or NULL when the
 * model has no such tensor (a projection without bias, an RMSNorm's bias). */
static void *param(const fsdp_model *m, int unit, fsdp_module mod, int bias, const void *base, size_t esize) {
    const fsdp_unit_desc *u = &m->layout->units[unit];
    int i = bias ? u->bias[mod] : u->weight[mod];
    if (i < 0 || !base) return NULL; /* !base: no gradient buffer (forward only) */
    return (char *)base + (size_t)m->layout->params[i].offset * esize;
}

typedef struct {
    void *wqkv, *wo, *w1, *w2;       /* w1: gate|up (SwiGLU) or fc1 (ReLU); w2: down or fc2 */
    void *bqkv, *bo, *b1, *b2;       /* NULL where the projection has no bias */
    void *ln1w, *ln1b, *ln2w, *ln2b; /* ln*b: LayerNorm only */
} block_ptrs;

static block_ptrs block_view(const fsdp_model *m, int layer, const void *base, size_t esize) {
    int u = fsdp_unit_block(m->layout, layer);
    /* q|k|v and gate|up are adjacent (layout.c), so the first of each is the fused tensor. */
    fsdp_module first_fc = m->swiglu ? FSDP_MOD_GATE : FSDP_MOD_UP;
    block_ptrs p;
    p.wqkv = param(m, u, FSDP_MOD_Q, 0, base, esize);
    p.wo = param(m, u, FSDP_MOD_O, 0, base, esize);
    p.w1 = param(m, u, first_fc, 0, base, esize);
    p.w2 = param(m, u, FSDP_MOD_DOWN, 0, base, esize);
    p.bqkv = param(m, u, FSDP_MOD_Q, 1, base, esize);
    p.bo = param(m, u, FSDP_MOD_O, 1, base, esize);
    p.b1 = param(m, u, first_fc, 1, base, esize);
    p.b2 = param(m, u, FSDP_MOD_DOWN, 1, base, esize);
    p.ln1w = param(m, u, FSDP_MOD_NORM_ATTN, 0, base, esize);
    p.ln1b = param(m, u, FSDP_MOD_NORM_ATTN, 1, base, esize);
    p.ln2w = param(m, u, FSDP_MOD_NORM_MLP, 0, base, esize);
    p.ln2b = param(m, u, FSDP_MOD_NORM_MLP, 1, base, esize);
    return p;
}

static void norm_forward(fsdp_model *m, void *out, float *mean, float *rstd, const void *inp, const void *w,
                         const void *b) {
    fsdp_backend *be = m->be;
    if (m->rms)
        be->rmsnorm_forward(be, out, rstd, inp, w, m->N, m->C, m->cfg.norm_eps);
    else
        be->layernorm_forward(be, out, mean, rstd, inp, w, b, m->N, m->C, m->cfg.norm_eps);
}

static void norm_backward(fsdp_model *m, void *dinp, void *dw, void *db, const void *dout, const void *inp,
                          const void *w, const float *mean, const float *rstd) {
    fsdp_backend *be = m->be;
    if (m->rms)
        be->rmsnorm_backward(be, dinp, dw, dout, inp, w, rstd, m->N, m->C);
    else
        be->layernorm_backward(be, dinp, dw, db, dout, inp, w, mean, rstd, m->N, m->C);
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
    be->embedding_forward(be, m->layers[0].res_in, m->tokens, wte, wpe, m->pos_offset, m->N, m->T, m->C);
}

void fsdp_model_block_forward(fsdp_model *m, int layer, const void *params) {
    fsdp_backend *be = m->be;
    layer_acts *a = &m->layers[layer];
    block_ptrs w = block_view(m, layer, params, m->ae);
    int N = m->N, C = m->C;

    norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, a->res_in, w.ln1w, w.ln1b);
    be->matmul_forward(be, a->qkv, a->ln1, w.wqkv, w.bqkv, NULL, N, C, m->QKV, 0);
    if (m->rope) be->rope_forward(be, a->qkv, m->cos_sin, m->B, m->T, m->Hq, m->Hkv, m->D);
    be->attention_forward(be, m->attn, a->att, a->lse, a->probs, a->qkv, m->B, m->T, m->Hq, m->Hkv, m->D);
    be->matmul_forward(be, a->res_mid, a->att, w.wo, w.bo, a->res_in, N, m->Q, C, 0);

    norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res_mid, w.ln2w, w.ln2b);
    void *out = layer_output(m, layer);
    if (m->swiglu) {
        be->matmul_forward(be, a->fc, a->ln2, w.w1, w.b1, NULL, N, C, 2 * m->F, 0);
        be->swiglu_forward(be, a->fc_act, a->fc, N, m->F);
    } else {
        be->matmul_forward(be, a->fc, a->ln2, w.w1, w.b1, NULL, N, C, m->F, 1);
    }
    be->matmul_forward(be, out, a->fc_act, w.w2, w.b2, a->res_mid, N, m->F, C, 0);
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

    norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->res_out, normw, normb);
    for (int r0 = 0; r0 < m->N; r0 += m->chunk_rows) {
        int rows = m->N - r0 < m->chunk_rows ? m->N - r0 : m->chunk_rows;
        const char *h = (const char *)m->lnf + (size_t)r0 * m->C * m->ae;
        char *dh = (char *)m->dln + (size_t)r0 * m->C * m->ae;
        be->matmul_forward(be, m->logits, h, w_head, NULL, NULL, rows, m->C, m->V, 0);
        /* Forward-only still gets the (unused) logit gradient: the op is fused, and cheap next to the
         * product. */
        be->cross_entropy(be, m->losses + r0, m->logits, m->targets + r0, rows, m->V, grad_scale);
        if (backward) be->matmul_backward(be, dh, dw_head, NULL, m->logits, h, w_head, rows, m->C, m->V);
    }
    be->sum(be, loss_sum, m->losses, (size_t)m->N, be->compute);
    if (!backward) return;
    /* The norm's backward adds into the residual gradient, which starts here. */
    be->zero(be, m->dres, (size_t)m->N * m->C * m->ae, be->compute);
    norm_backward(m, m->dres, dnormw, dnormb, m->dln, m->res_out, normw, m->lnf_mean, m->lnf_rstd);
}

void fsdp_model_head(fsdp_model *m, const void *head_params, void *head_grads, const void *embed_params,
                     void *embed_grads, float grad_scale, float *loss_sum) {
    head_pass(m, head_params, head_grads, embed_params, embed_grads, grad_scale, loss_sum, 1);
}

void fsdp_model_head_loss(fsdp_model *m, const void *head_params, const void *embed_params, float *loss_sum) {
    head_pass(m, head_params, NULL, embed_params, NULL, 0.0f, loss_sum, 0);
}

/* ---- backward ---- */

void fsdp_model_block_backward(fsdp_model *m, int layer, const void *params, void *grads) {
    fsdp_backend *be = m->be;
    layer_acts *a = &m->layers[layer];
    block_ptrs w = block_view(m, layer, params, m->ae);
    block_ptrs g = block_view(m, layer, grads, m->ge);
    int N = m->N, C = m->C;

    /* MLP: dres is d(layer output); the residual path passes it through unchanged. */
    if (m->swiglu) {
        be->matmul_backward(be, m->dh, g.w2, g.b2, m->dres, a->fc_act, w.w2, N, m->F, C);
        be->swiglu_backward(be, m->dfc, m->dh, a->fc, N, m->F);
        be->matmul_backward(be, m->dln, g.w1, g.b1, m->dfc, a->ln2, w.w1, N, C, 2 * m->F);
    } else {
        be->matmul_backward(be, m->dfc, g.w2, g.b2, m->dres, a->fc_act, w.w2, N, m->F, C);
        be->relu_backward(be, m->dfc, a->fc, (size_t)N * m->F);
        be->matmul_backward(be, m->dln, g.w1, g.b1, m->dfc, a->ln2, w.w1, N, C, m->F);
    }
    norm_backward(m, m->dres, g.ln2w, g.ln2b, m->dln, a->res_mid, w.ln2w, a->ln2_mean, a->ln2_rstd);

    /* Attention: dres is now d(res_mid). */
    be->matmul_backward(be, m->datt, g.wo, g.bo, m->dres, a->att, w.wo, N, m->Q, C);
    be->attention_backward(be, m->attn, m->dqkv, m->datt, a->qkv, a->att, a->lse, a->probs, m->B, m->T, m->Hq,
                           m->Hkv, m->D);
    if (m->rope) be->rope_backward(be, m->dqkv, m->cos_sin, m->B, m->T, m->Hq, m->Hkv, m->D);
    be->matmul_backward(be, m->dln, g.wqkv, g.bqkv, m->dqkv, a->ln1, w.wqkv, N, C, m->QKV);
    norm_backward(m, m->dres, g.ln1w, g.ln1b, m->dln, a->res_in, w.ln1w, a->ln1_mean, a->ln1_rstd);
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
    be->embedding_backward(be, dwte, dwpe, m->dres, m->tokens, m->padding_idx, m->pos_offset, m->N, m->T, m->C);
}
