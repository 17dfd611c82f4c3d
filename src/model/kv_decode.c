/* Generation's forward with a KV cache (kv_decode.h): the training's block (block.c) run over the
 * new tokens with the cache as its attention's keys and values. */
#include "kv_decode.h"

#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "block.h"
#include "carver.h"
#include "model.h"
#include "unit_params.h"

struct fsdp_kv_decoder {
    fsdp_backend *be;
    fsdp_model_config cfg;
    const fsdp_layout *layout;
    fsdp_kv_shape shape;
    int C, F, Hq, Hkv, D, QKV, Q, V, L;
    fsdp_block_ctx blk; /* the block's shapes and kinds; rows and rotary rows set per forward */
    size_t ae;
    int length;

    void *arena;
    int32_t *tokens;
    float *cos_sin;        /* [capacity, D] (RoPE) */
    void *cache;           /* per layer: k [Hkv, cap, D] then v [Hkv, cap, D] */
    void *x, *ln, *qkv, *att, *fc, *fc_act; /* [max_tokens, ...] */
    void *qkv_in;          /* q|k|v before qk_norm (Qwen3), else NULL */
    float *mean, *rstd, *lse, *qk_rstd;
    void *logits;          /* [rows, V] act dtype */
    float *logits32;       /* its fp32 copy when act is bf16 (else == logits) */
};

/* ---- the arena: one walk sizes it and carves it (carver.h) ---- */

size_t fsdp_kv_cache_bytes(const fsdp_model_config *cfg, int capacity, size_t ae) {
    return 2 * (size_t)cfg->num_layers * cfg->num_kv_heads * (size_t)capacity * cfg->head_dim * ae;
}

static void plan(carver *c, const fsdp_model_config *cfg, const fsdp_kv_shape *s, size_t ae, fsdp_kv_decoder *d) {
    size_t T = (size_t)s->max_tokens, C = (size_t)cfg->hidden_size, F = (size_t)cfg->intermediate_size;
    size_t D = (size_t)cfg->head_dim, Hq = (size_t)cfg->num_heads, Hkv = (size_t)cfg->num_kv_heads;
    size_t V = (size_t)cfg->vocab_size, rows = s->all_logits ? T : 1;
    const fsdp_block_kind kind = fsdp_block_kind_of(cfg);
    const int swiglu = kind.swiglu, rope = kind.rope;
    int32_t *tokens = carve(c, T * sizeof(int32_t));
    float *cos_sin = rope ? carve(c, (size_t)s->capacity * D * sizeof(float)) : NULL;
    void *cache = carve(c, fsdp_kv_cache_bytes(cfg, s->capacity, ae));
    void *x = carve(c, T * C * ae), *ln = carve(c, T * C * ae);
    float *mean = carve(c, T * sizeof(float)), *rstd = carve(c, T * sizeof(float));
    void *qkv = carve(c, T * (Hq + 2 * Hkv) * D * ae), *att = carve(c, T * Hq * D * ae);
    void *qkv_in = kind.qk_norm ? carve(c, T * (Hq + 2 * Hkv) * D * ae) : NULL;
    float *qk_rstd = kind.qk_norm ? carve(c, T * (Hq + Hkv) * sizeof(float)) : NULL;
    float *lse = carve(c, T * Hq * sizeof(float));
    void *fc = carve(c, T * (swiglu ? 2 * F : F) * ae);
    void *fc_act = swiglu ? carve(c, T * F * ae) : fc;
    void *logits = carve(c, rows * V * ae);
    float *logits32 = ae == sizeof(float) ? logits : carve(c, rows * V * sizeof(float));
    if (d) {
        d->tokens = tokens, d->cos_sin = cos_sin, d->cache = cache, d->x = x, d->ln = ln, d->mean = mean;
        d->rstd = rstd, d->qkv = qkv, d->att = att, d->lse = lse, d->fc = fc, d->fc_act = fc_act;
        d->logits = logits, d->logits32 = logits32, d->qkv_in = qkv_in, d->qk_rstd = qk_rstd;
    }
}

size_t fsdp_kv_decoder_bytes(const fsdp_model_config *cfg, const fsdp_kv_shape *shape, size_t act_esize) {
    carver c = {NULL, 0};
    plan(&c, cfg, shape, act_esize, NULL);
    return c.used;
}

/* ---- creation ---- */

fsdp_kv_decoder *fsdp_kv_decoder_create(fsdp_backend *be, const fsdp_model_config *cfg, const fsdp_layout *layout,
                                        const fsdp_kv_shape *shape, fsdp_err *err) {
    if (shape->capacity <= 0 || shape->max_tokens <= 0 || shape->max_tokens > shape->capacity) {
        fsdp_errf(err, "the KV cache needs a positive capacity (%d) of at least the tokens of one forward (%d)",
                  shape->capacity, shape->max_tokens);
        return NULL;
    }
    if (!fsdp_block_kind_of(cfg).rope && shape->capacity > cfg->max_position_embeddings) {
        fsdp_usagef(err, "the prompt and the new tokens (%d positions) exceed the model's max_position_embeddings %d "
                    "(%s has learned positions)", shape->capacity, cfg->max_position_embeddings,
                    cfg->family->model_type);
        return NULL;
    }
    fsdp_kv_decoder *d = fsdp_xcalloc(1, sizeof *d, "the KV decoder");
    d->be = be;
    d->cfg = *cfg;
    d->layout = layout;
    d->shape = *shape;
    d->C = cfg->hidden_size, d->F = cfg->intermediate_size, d->Hq = cfg->num_heads, d->Hkv = cfg->num_kv_heads;
    d->D = cfg->head_dim, d->Q = d->Hq * d->D, d->QKV = (d->Hq + 2 * d->Hkv) * d->D, d->V = cfg->vocab_size;
    d->L = cfg->num_layers;
    d->blk = fsdp_block_ctx_make(be, cfg);
    d->ae = be->runtime->dtype_size(be, be->act_dtype);

    carver c = {NULL, 0};
    plan(&c, cfg, shape, d->ae, NULL);
    d->arena = be->runtime->alloc(be, c.used, "the KV cache and generation activations");
    if (!d->arena) { /* a deferred out-of-memory (backend.h) */
        fsdp_errf(err, "out of device memory for the KV cache and activations (%.2f GiB)",
                  (double)c.used / (1 << 30));
        free(d);
        return NULL;
    }
    c.base = d->arena;
    c.used = 0;
    plan(&c, cfg, shape, d->ae, d);
    /* The attention's split scratch for the longest row, now rather than while tokens stream. */
    be->runtime->reserve_scratch(be, fsdp_device_decode_scratch(be->kind, d->Hq, d->D, shape->capacity));
    if (d->blk.kind.rope) {
        size_t bytes = (size_t)shape->capacity * d->D * sizeof(float);
        float *table = fsdp_xmalloc(bytes, "the rotary table");
        fsdp_model_rope_table(cfg, shape->capacity, table);
        be->runtime->copy_h2d(be, d->cos_sin, table, bytes, be->compute);
        be->runtime->stream_synchronize(be, be->compute);
        free(table);
    }
    return d;
}

void fsdp_kv_decoder_destroy(fsdp_kv_decoder *d) {
    if (!d) return;
    d->be->runtime->free(d->be, d->arena);
    free(d);
}

int fsdp_kv_decoder_length(const fsdp_kv_decoder *d) { return d->length; }
void fsdp_kv_decoder_reset(fsdp_kv_decoder *d) { d->length = 0; }

/* ---- forward ---- */

static void *layer_cache(fsdp_kv_decoder *d, int layer, int v) {
    size_t one = (size_t)d->Hkv * d->shape.capacity * d->D * d->ae;
    return (char *)d->cache + (2 * (size_t)layer + (size_t)v) * one;
}

/* The training's block over the n new rows: its attention appends their keys and values to the
 * layer's cache and reads it. */
static void block(fsdp_kv_decoder *d, int layer, const void *params) {
    fsdp_block_params w = fsdp_block_view(d->layout, d->blk.kind.swiglu, layer, params, d->ae);
    fsdp_block_acts a = {0};
    a.res_in = a.res_mid = d->x;
    a.ln1 = a.ln2 = d->ln;
    a.ln1_mean = a.ln2_mean = d->mean;
    a.ln1_rstd = a.ln2_rstd = d->rstd;
    a.qkv_in = d->qkv_in, a.qk_rstd = d->qk_rstd, a.qkv = d->qkv;
    a.att = d->att, a.lse = d->lse, a.fc = d->fc, a.fc_act = d->fc_act;
    fsdp_block_attention at = {FSDP_ATTN_FLASH, NULL, layer_cache(d, layer, 0), layer_cache(d, layer, 1), d->length,
                               d->shape.capacity};
    fsdp_block_forward(&d->blk, &a, &w, &at, d->x);
}

int fsdp_kv_decoder_forward(fsdp_kv_decoder *d, const void *const *units, const int32_t *tokens, int n, int all,
                            float *logits, fsdp_err *err) {
    fsdp_backend *be = d->be;
    if (all && !d->shape.all_logits) return fsdp_errf(err, "the decoder was made for the last token's logits only");
    if (n <= 0 || n > d->shape.max_tokens)
        return fsdp_errf(err, "%d tokens in one forward (the decoder takes 1 to %d)", n, d->shape.max_tokens);
    if (d->length + n > d->shape.capacity)
        return fsdp_errf(err, "position %d is past the KV cache's capacity of %d", d->length + n - 1,
                         d->shape.capacity);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->V)
            return fsdp_errf(err, "token id %d is outside the model's vocabulary of %d", (int)tokens[i], d->V);

    const fsdp_layout *l = d->layout;
    const void *embed = units[fsdp_unit_embed(l)], *head = units[fsdp_unit_head(l)];
    be->runtime->copy_h2d(be, d->tokens, tokens, (size_t)n * sizeof(int32_t), be->compute);
    const void *wte = fsdp_unit_param(l, fsdp_unit_embed(l), FSDP_MOD_EMBED_TOKENS, 0, embed, d->ae);
    const void *wpe = fsdp_unit_param(l, fsdp_unit_embed(l), FSDP_MOD_EMBED_POSITIONS, 0, embed, d->ae);
    be->ops->embedding_forward(be, d->x, d->tokens, wte, wpe, d->blk.kind.pos_offset + d->length, n, n, d->C);
    d->blk.N = d->blk.T = n, d->blk.B = 1;
    d->blk.cos_sin = d->cos_sin ? d->cos_sin + (size_t)d->length * d->D : NULL;
    for (int i = 0; i < d->L; i++) block(d, i, units[fsdp_unit_block(l, i)]);

    int rows = all ? n : 1, first = all ? 0 : n - 1;
    int hu = fsdp_unit_head(l);
    const void *normw = fsdp_unit_param(l, hu, FSDP_MOD_NORM_FINAL, 0, head, d->ae);
    const void *normb = fsdp_unit_param(l, hu, FSDP_MOD_NORM_FINAL, 1, head, d->ae);
    const void *w_head = d->cfg.tie_word_embeddings ? wte
                                                    : fsdp_unit_param(l, hu, FSDP_MOD_LM_HEAD, 0, head, d->ae);
    d->blk.N = rows;
    fsdp_block_norm(&d->blk, d->ln, d->mean, d->rstd, (const char *)d->x + (size_t)first * d->C * d->ae, normw,
                    normb, NULL);
    be->ops->matmul_forward(be, d->logits, d->ln, w_head, NULL, NULL, rows, d->C, d->V, 0);
    size_t count = (size_t)rows * d->V;
    if ((void *)d->logits32 != d->logits)
        be->ops->cast(be, d->logits32, FSDP_F32, d->logits, be->act_dtype, count, be->compute);
    be->runtime->copy_d2h(be, logits, d->logits32, count * sizeof(float), be->compute);
    be->runtime->stream_synchronize(be, be->compute);
    d->length += n;
    return 0;
}
