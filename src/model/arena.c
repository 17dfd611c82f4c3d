/* The model's arena: one allocation per micro-batch shape, carved by one walk that the memory plans
 * run without a device (fsdp_model_activation_parts) and the model runs to point its tensors into
 * the allocation, so that a plan is the allocation to the byte. What a layer keeps depends on
 * the recomputation mode (model.h). */
#include <string.h>

#include "carver.h"
#include "model_internal.h"

const char *fsdp_recompute_name(fsdp_recompute r) {
    return r == FSDP_RECOMPUTE_FULL ? "full" : r == FSDP_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

int fsdp_recompute_parse(const char *name, fsdp_recompute *out) {
    static const fsdp_recompute modes[] = {FSDP_RECOMPUTE_NONE, FSDP_RECOMPUTE_SELECTIVE, FSDP_RECOMPUTE_FULL};
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, fsdp_recompute_name(modes[i]))) {
            *out = modes[i];
            return 0;
        }
    return -1;
}

fsdp_model_dims fsdp_model_make_dims(const fsdp_model_config *cfg, const fsdp_model_shape *s, size_t ae) {
    fsdp_model_dims d;
    d.B = s->batch, d.T = s->seq, d.N = s->batch * s->seq;
    d.C = cfg->hidden_size, d.F = cfg->intermediate_size;
    d.Hq = cfg->num_heads, d.Hkv = cfg->num_kv_heads, d.D = cfg->head_dim;
    d.Q = d.Hq * d.D, d.QKV = (d.Hq + 2 * d.Hkv) * d.D, d.V = cfg->vocab_size, d.L = cfg->num_layers;
    const fsdp_block_kind kind = fsdp_block_kind_of(cfg);
    d.rms = kind.rms;
    d.swiglu = kind.swiglu;
    d.qk_norm = kind.qk_norm;
    d.attn = s->attn;
    d.recompute = s->recompute;
    d.residual_dropout = s->dropout.hidden > 0.0f;
    d.fp8_amax = s->fp8 == FSDP_FP8_TENSORWISE;
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

/* Carves the saved tensors of a layer that it keeps itself (own = 1) or that live in the shared
 * layer (own = 0): each tensor once, on the side its keep flag says. With NONE every flag is 1, in
 * the order the arena always had. */
static void carve_layer(carver *c, const fsdp_model_dims *d, layer_acts *a, int own) {
    const int all = d->recompute == FSDP_RECOMPUTE_NONE;      /* nothing is recomputed */
    const int products = d->recompute != FSDP_RECOMPUTE_FULL; /* matrix products' outputs are kept */
    /* Flash's backward rebuilds the probabilities from lse, so selective keeps it; eager under
     * selective recomputes it with the probabilities. */
    const int lse = all || (products && fsdp_attn_flash(d->attn));
    size_t N = (size_t)d->N, C = (size_t)d->C, ae = d->ae;
    size_t fc_cols = d->swiglu ? 2 * (size_t)d->F : (size_t)d->F;
#define PART(keep, field, bytes) \
    if ((keep) == own) a->field = carve(c, bytes)
    PART(1, res_in, N * C * ae);
    PART(all, ln1, N * C * ae);
    if (!d->rms) PART(all, ln1_mean, N * sizeof(float));
    PART(all, ln1_rstd, N * sizeof(float));
    /* With qk_norm the product's output (q|k|v before the norm) is what the norm's backward reads;
     * kept with the products, and the normalised, rotated q|k|v beside it. */
    if (d->qk_norm) {
        PART(products, qkv_in, N * d->QKV * ae);
        PART(products, qk_rstd, N * (size_t)(d->Hq + d->Hkv) * sizeof(float));
    }
    PART(products, qkv, N * d->QKV * ae);
    PART(products, att, N * d->Q * ae);
    PART(lse, lse, (size_t)d->B * d->Hq * d->T * sizeof(float));
    if (d->attn == FSDP_ATTN_EAGER) PART(all, probs, (size_t)d->B * d->Hq * d->T * d->T * ae);
    PART(products, res_mid, N * C * ae);
    PART(all, ln2, N * C * ae);
    if (!d->rms) PART(all, ln2_mean, N * sizeof(float));
    PART(all, ln2_rstd, N * sizeof(float));
    PART(products, fc, N * fc_cols * ae);
    if (d->swiglu) PART(all, fc_act, N * d->F * ae);
    /* A recomputed forward writes the same amax again. */
    if (d->fp8_amax) PART(1, fp8_amax, FSDP_BLOCK_PRODUCTS * FSDP_BLOCK_AMAX * sizeof(float));
#undef PART
}

size_t fsdp_model_arena_walk(const fsdp_model_dims *d, char *base, fsdp_model *m, fsdp_activation_parts *parts) {
    carver cv = {base, 0}, *c = &cv;
    size_t N = (size_t)d->N, ae = d->ae;
    size_t fc_cols = d->swiglu ? 2 * (size_t)d->F : (size_t)d->F;
    int32_t *tokens = carve(c, N * sizeof(int32_t));
    int32_t *targets = carve(c, N * sizeof(int32_t));
    float *cos_sin = carve(c, (size_t)d->T * d->D * sizeof(float));
    size_t at = c->used;
    layer_acts shared;
    memset(&shared, 0, sizeof shared);
    carve_layer(c, d, &shared, 0); /* nothing with NONE */
    size_t recompute_bytes = c->used - at;
    at = c->used;
    for (int l = 0; l < d->L; l++) {
        layer_acts a = shared;
        carve_layer(c, d, &a, 1);
        if (!d->swiglu) a.fc_act = a.fc;
        if (m) m->layers[l] = a;
    }
    size_t layer_bytes = c->used - at;
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
    void *branch = d->residual_dropout ? carve(c, N * d->C * ae) : NULL;
    void *dbranch = d->residual_dropout ? carve(c, N * d->C * ae) : NULL;
    if (m) {
        m->tokens = tokens, m->targets = targets, m->cos_sin = cos_sin;
        m->res_out = res_out, m->lnf = lnf, m->lnf_mean = lnf_mean, m->lnf_rstd = lnf_rstd;
        m->dres = dres, m->dln = dln, m->dqkv = dqkv, m->datt = datt, m->dfc = dfc, m->dh = dh;
        m->logits = logits, m->losses = losses;
        m->branch = branch, m->dbranch = dbranch;
    }
    if (parts) {
        parts->total = c->used;
        parts->layers = layer_bytes;
        parts->recompute = recompute_bytes;
        parts->other = c->used - layer_bytes - recompute_bytes;
    }
    return c->used;
}

void fsdp_model_activation_parts(const fsdp_model_config *cfg, const fsdp_model_shape *shape, size_t act_esize,
                                 fsdp_activation_parts *out) {
    fsdp_model_dims d = fsdp_model_make_dims(cfg, shape, act_esize);
    fsdp_model_arena_walk(&d, NULL, NULL, out);
}
