/* Shared by test_kv_decode.c (CPU) and test_gpu_decode.c: a model (preset or tests/data config) with
 * random weights of magnitude ~1 resident on a backend, the training forward's logits of a token
 * sequence, and the KV decoder's logits of the same sequence fed in several ways. */
#ifndef FSDP_TEST_KV_RIG_H
#define FSDP_TEST_KV_RIG_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "base/rng.h"
#include "io/hf_config.h"
#include "model/kv_decode.h"
#include "model/model.h"

typedef struct {
    fsdp_backend *be;
    fsdp_model_config cfg;
    fsdp_layout layout;
    void **units; /* resident weights (device) */
    float **host; /* the same, fp32 on the host */
} kv_rig;

static void rig_die(const char *what, const char *msg) {
    fprintf(stderr, "kv rig: %s: %s\n", what, msg);
    exit(1);
}

/* A preset name, or a folder under tests/data. */
static void rig_config(const char *model, fsdp_model_config *cfg) {
    fsdp_err err = {0};
    if (fsdp_model_preset(model, cfg) == 0) return;
    char path[1024];
    const char *src = getenv("FSDP_SOURCE_DIR") ? getenv("FSDP_SOURCE_DIR") : ".";
    snprintf(path, sizeof path, "%s/tests/data/%s", src, model);
    if (fsdp_hf_config_load(path, cfg, &err)) rig_die(model, err.msg);
}

/* Weights of magnitude ~1 through the model (random weights at transformers' 0.02 give nearly
 * uniform attention): matrices N(0, 1/in), embeddings N(0, 1), norm weights 1 + N(0, 0.1^2),
 * biases N(0, 0.1^2). A pure function of (seed, parameter, element). */
static float rig_value(const fsdp_param_desc *p, int index, uint64_t seed, int64_t i) {
    double z = fsdp_rand_normal(seed, (uint64_t)index, (uint64_t)i);
    if (p->is_bias) return (float)(0.1 * z);
    if (p->ndim == 1) return (float)(1.0 + 0.1 * z);
    if (p->module == FSDP_MOD_EMBED_TOKENS || p->module == FSDP_MOD_EMBED_POSITIONS) return (float)z;
    return (float)(z / sqrt((double)p->shape[1]));
}

static void rig_setup(kv_rig *r, const char *kind, const char *model, fsdp_dtype act, uint64_t seed) {
    fsdp_err err = {0};
    memset(r, 0, sizeof *r);
    rig_config(model, &r->cfg);
    fsdp_layout_build(&r->cfg, &r->layout);
    fsdp_backend_options bo = {.kind = kind, .act_dtype = act, .grad_dtype = act, .local_size = 1};
    r->be = fsdp_backend_create(&bo, &err);
    if (!r->be) rig_die(kind, err.msg);
    int U = r->layout.num_units;
    r->units = calloc((size_t)U, sizeof *r->units);
    r->host = calloc((size_t)U, sizeof *r->host);
    for (int u = 0; u < U; u++) r->host[u] = calloc((size_t)r->layout.units[u].numel, sizeof(float));
    for (int i = 0; i < r->layout.num_params; i++) {
        const fsdp_param_desc *p = &r->layout.params[i];
        for (int64_t e = 0; e < p->numel; e++) {
            float v = rig_value(p, i, seed, e);
            r->host[p->unit][p->offset + e] = act == FSDP_BF16 ? fsdp_round_bf16(v) : v;
        }
    }
    fsdp_backend *be = r->be;
    for (int u = 0; u < U; u++) {
        size_t n = (size_t)r->layout.units[u].numel;
        r->units[u] = be->runtime->alloc(be, n * be->runtime->dtype_size(be, act), "weights");
        if (be->runtime->dtype_size(be, act) == sizeof(float)) {
            be->runtime->copy_h2d(be, r->units[u], r->host[u], n * sizeof(float), be->compute);
        } else {
            float *stage = be->runtime->alloc(be, n * sizeof(float), "staging");
            be->runtime->copy_h2d(be, stage, r->host[u], n * sizeof(float), be->compute);
            be->ops->cast(be, r->units[u], act, stage, FSDP_F32, n, be->compute);
            be->runtime->stream_synchronize(be, be->compute);
            be->runtime->free(be, stage);
        }
    }
    be->runtime->stream_synchronize(be, be->compute);
}

static void rig_teardown(kv_rig *r) {
    for (int u = 0; u < r->layout.num_units; u++) {
        r->be->runtime->free(r->be, r->units[u]);
        free(r->host[u]);
    }
    free(r->units);
    free(r->host);
    r->be->runtime->destroy(r->be);
    fsdp_layout_free(&r->layout);
}

/* T token ids in [0, V), a pure function of the seed. */
static void rig_tokens(const kv_rig *r, int T, uint64_t seed, int32_t *out) {
    for (int t = 0; t < T; t++) out[t] = (int32_t)fsdp_rand_below(seed, 7, (uint64_t)t, (uint32_t)r->cfg.vocab_size);
}

/* The training forward's logits of one sequence (B = 1), [T, V] on the host: the final hidden state
 * of fsdp_model times the head (the model fuses the head with the loss and keeps no logits). */
static void rig_training_logits(kv_rig *r, const int32_t *tokens, int T, float *out) {
    fsdp_err err = {0};
    fsdp_backend *be = r->be;
    fsdp_model_shape shape = {.batch = 1, .seq = T, .attn = FSDP_ATTN_FLASH};
    fsdp_model *m = fsdp_model_create(be, &r->cfg, &r->layout, &shape, &err);
    if (!m) rig_die("model", err.msg);
    int U = r->layout.num_units, E = fsdp_unit_embed(&r->layout), H = fsdp_unit_head(&r->layout);
    size_t V = (size_t)r->cfg.vocab_size;
    void **grads = calloc((size_t)U, sizeof *grads);
    for (int u = 0; u < U; u++)
        grads[u] = be->runtime->alloc(be, (size_t)r->layout.units[u].numel * be->runtime->dtype_size(be, be->grad_dtype), "grads");
    int32_t *targets = malloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) targets[t] = -1;
    be->runtime->copy_h2d(be, fsdp_model_tokens(m), tokens, (size_t)T * sizeof(int32_t), be->compute);
    be->runtime->copy_h2d(be, fsdp_model_targets(m), targets, (size_t)T * sizeof(int32_t), be->compute);
    float *loss = be->runtime->alloc(be, sizeof(float), "loss");
    fsdp_model_embed_forward(m, r->units[E]);
    for (int l = 0; l < r->cfg.num_layers; l++) fsdp_model_block_forward(m, l, r->units[1 + l]);
    fsdp_model_head(m, r->units[H], grads[H], r->units[E], grads[E], 0.0f, loss);
    const void *w = r->cfg.tie_word_embeddings ? r->units[E] : r->units[H]; /* the first tensor of each unit */
    size_t ae = be->runtime->dtype_size(be, be->act_dtype);
    void *logits = be->runtime->alloc(be, (size_t)T * V * ae, "logits");
    be->ops->matmul_forward(be, logits, fsdp_model_final_hidden(m), w, NULL, NULL, T, r->cfg.hidden_size, (int)V, 0);
    if (ae == sizeof(float)) {
        be->runtime->copy_d2h(be, out, logits, (size_t)T * V * sizeof(float), be->compute);
    } else {
        float *l32 = be->runtime->alloc(be, (size_t)T * V * sizeof(float), "logits");
        be->ops->cast(be, l32, FSDP_F32, logits, be->act_dtype, (size_t)T * V, be->compute);
        be->runtime->copy_d2h(be, out, l32, (size_t)T * V * sizeof(float), be->compute);
        be->runtime->stream_synchronize(be, be->compute);
        be->runtime->free(be, l32);
    }
    be->runtime->stream_synchronize(be, be->compute);
    be->runtime->free(be, logits);
    be->runtime->free(be, loss);
    for (int u = 0; u < U; u++) be->runtime->free(be, grads[u]);
    free(grads);
    free(targets);
    fsdp_model_destroy(m);
}

/* The decoder's logits [T, V] of the sequence: the first `prefill` tokens in one forward (0 or 1:
 * token by token), then one token per forward. */
static void rig_decoder_logits(kv_rig *r, const int32_t *tokens, int T, int prefill, float *out) {
    fsdp_err err = {0};
    size_t V = (size_t)r->cfg.vocab_size;
    fsdp_kv_shape shape = {T, prefill > 1 ? prefill : 1, 1};
    fsdp_kv_decoder *d = fsdp_kv_decoder_create(r->be, &r->cfg, &r->layout, &shape, &err);
    if (!d) rig_die("decoder", err.msg);
    const void *const *units = (const void *const *)r->units;
    int t = 0;
    if (prefill > 1) {
        if (fsdp_kv_decoder_forward(d, units, tokens, prefill, 1, out, &err)) rig_die("prefill", err.msg);
        t = prefill;
    }
    for (; t < T; t++)
        if (fsdp_kv_decoder_forward(d, units, tokens + t, 1, 0, out + (size_t)t * V, &err)) rig_die("decode", err.msg);
    fsdp_kv_decoder_destroy(d);
}

/* The largest over positions of ||a_t - b_t|| / ||b_t||; NaN anywhere gives NaN. */
static double rig_worst(const float *a, const float *b, int T, int V) {
    double worst = 0.0;
    for (int t = 0; t < T; t++) {
        double num = 0.0, den = 0.0;
        for (int v = 0; v < V; v++) {
            double x = a[(size_t)t * V + v], y = b[(size_t)t * V + v];
            if (isnan(x) || isnan(y)) return NAN;
            num += (x - y) * (x - y);
            den += y * y;
        }
        double e = sqrt(num / (den > 0 ? den : 1.0));
        if (e > worst) worst = e;
    }
    return worst;
}

#endif
