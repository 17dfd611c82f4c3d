/* Shared by test_model_recompute.c (CPU) and test_gpu_recompute.c (CUDA): one model trained for
 * two micro-batches with an evaluation pass between them, under a given activation-recomputation
 * mode, on a given backend, and the comparison of two such runs.
 *
 * A run: micro-batch A (forward, head, backward of every layer and the embedding), a forward-only
 * evaluation of other tokens with dropout off (fsdp_model_set_dropout(m, 0, ...)), then micro-batch
 * B with its own samples' masks, its gradients added to A's. It returns the training loss sum, the
 * evaluation loss sum, every unit's accumulated gradient and the gradient at the embedding's output
 * after A's backward (the values of fsdp_model_embed_grad_rows, what the embedding's backward and
 * the row reduction read). Header-only: each test program includes it once. */
#ifndef FSDP_TESTS_RECOMPUTE_RIG_H
#define FSDP_TESTS_RECOMPUTE_RIG_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "model/model.h"
#include "check.h"
#include "device_copy.h"

typedef struct {
    float loss, eval_loss;
    float **grads; /* per unit, fp32, host */
    float *dres;   /* [B*T, hidden]: the gradient at the embedding output of micro-batch A */
    size_t arena;  /* the model's activation bytes */
} rc_result;

/* Initial weights of every unit (host fp32; bf16-representable when `bf16`), larger than the 0.02
 * init so that the attention is not uniform and every layer matters. */
static float **rc_weights(const fsdp_model_config *cfg, const fsdp_layout *l, int bf16) {
    float **hp = calloc((size_t)l->num_units, sizeof(float *));
    for (int u = 0; u < l->num_units; u++) hp[u] = malloc((size_t)l->units[u].numel * 4);
    for (int i = 0; i < l->num_params; i++) {
        const fsdp_param_desc *p = &l->params[i];
        for (int64_t k = 0; k < p->numel; k++) {
            float v = fsdp_param_init_value(cfg, p, 13, k);
            v = p->ndim == 1 ? v + 0.1f * (float)fsdp_rand_normal(17, (uint64_t)i, (uint64_t)k) : 4.0f * v;
            hp[p->unit][p->offset + k] = bf16 ? fsdp_round_bf16(v) : v;
        }
    }
    return hp;
}

static void rc_tokens(int32_t *tok, int32_t *tgt, int N, int vocab, int padding_idx, uint64_t stream) {
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)fsdp_rand_below(23, stream, (uint64_t)i, (uint32_t)vocab);
        if (i % 7 == 3 && padding_idx >= 0) tok[i] = padding_idx;
        tgt[i] = i % 9 == 4 ? -1 : (int32_t)fsdp_rand_below(23, stream + 100, (uint64_t)i, (uint32_t)vocab);
    }
}

/* One forward (and with `train` the head's and blocks' backward) of tokens `stream`. */
static void rc_pass(fsdp_model *m, const fsdp_model_config *cfg, fsdp_backend *be, void **params, void **grads,
                    float *loss, int B, int T, uint64_t stream, int train, float **dres_out) {
    int N = B * T, L = cfg->num_layers, U = L + 2, E = 0, H = U - 1, counted = 0;
    int32_t *tok = malloc((size_t)N * 4), *tgt = malloc((size_t)N * 4);
    rc_tokens(tok, tgt, N, cfg->vocab_size, fsdp_model_padding_idx(cfg), stream);
    for (int i = 0; i < N; i++) counted += tgt[i] >= 0;
    be->runtime->copy_h2d(be, fsdp_model_tokens(m), tok, (size_t)N * 4, be->compute);
    be->runtime->copy_h2d(be, fsdp_model_targets(m), tgt, (size_t)N * 4, be->compute);
    fsdp_model_embed_forward(m, params[E]);
    for (int l = 0; l < L; l++) fsdp_model_block_forward(m, l, params[1 + l]);
    if (!train) {
        fsdp_model_head_loss(m, params[H], params[E], loss);
    } else {
        fsdp_model_head(m, params[H], grads[H], params[E], grads[E], 1.0f / (float)counted, loss);
        for (int l = L - 1; l >= 0; l--) fsdp_model_block_backward(m, l, params[1 + l], grads[1 + l]);
        if (dres_out) {
            fsdp_row_set sets[FSDP_MAX_ROW_SETS];
            const void *values;
            int count, row_len;
            fsdp_model_embed_grad_rows(m, sets, &values, &count, &row_len);
            *dres_out = test_to_host(be, values, (size_t)count * row_len, be->act_dtype);
        }
        fsdp_model_embed_backward(m, params[E], grads[E]);
    }
    be->runtime->stream_synchronize(be, be->compute);
    free(tok), free(tgt);
}

/* The run described at the top, under `mode`. */
static void rc_run(fsdp_backend *be, const fsdp_model_config *cfg, const fsdp_layout *l, float **hp, fsdp_attn attn,
                   int B, int T, fsdp_recompute mode, rc_result *out) {
    fsdp_err err = {0};
    fsdp_model_shape shape = {.batch = B, .seq = T, .attn = attn, .head_chunk_rows = 13, .recompute = mode};
    fsdp_model *m = NULL;
    if (fsdp_model_dropout_rates(cfg, 0, 0.0, &shape.dropout, &err) == 0) m = fsdp_model_create(be, cfg, l, &shape, &err);
    if (!m) {
        printf("model creation failed: %s\n", err.msg);
        exit(1);
    }
    int U = l->num_units, training = shape.dropout.hidden > 0 || shape.dropout.attention > 0;
    void **params = calloc((size_t)U, sizeof(void *)), **grads = calloc((size_t)U, sizeof(void *));
    for (int u = 0; u < U; u++) {
        size_t n = (size_t)l->units[u].numel, bytes = n * be->runtime->dtype_size(be, be->grad_dtype);
        params[u] = test_to_device(be, hp[u], n, be->act_dtype);
        grads[u] = be->runtime->alloc(be, bytes, "grads");
        be->runtime->zero(be, grads[u], bytes, be->compute);
    }
    float *sums = be->runtime->alloc(be, 2 * sizeof(float), "losses");
    be->runtime->zero(be, sums, 2 * sizeof(float), be->compute);
    fsdp_model_set_dropout(m, training, 77, 3000);
    rc_pass(m, cfg, be, params, grads, sums, B, T, 1, 1, &out->dres);
    fsdp_model_set_dropout(m, 0, 0, 0);
    rc_pass(m, cfg, be, params, grads, sums + 1, B, T, 2, 0, NULL);
    fsdp_model_set_dropout(m, training, 77, 3000 + B);
    rc_pass(m, cfg, be, params, grads, sums, B, T, 3, 1, NULL);
    float *s = test_to_host(be, sums, 2, FSDP_F32);
    out->loss = s[0], out->eval_loss = s[1];
    free(s);
    out->grads = calloc((size_t)U, sizeof(float *));
    for (int u = 0; u < U; u++) out->grads[u] = test_to_host(be, grads[u], (size_t)l->units[u].numel, be->grad_dtype);
    fsdp_activation_parts parts;
    fsdp_model_activation_parts(cfg, &shape, be->runtime->dtype_size(be, be->act_dtype), &parts);
    out->arena = parts.total;
    for (int u = 0; u < U; u++) be->runtime->free(be, params[u]), be->runtime->free(be, grads[u]);
    be->runtime->free(be, sums);
    free(params), free(grads);
    fsdp_model_destroy(m);
}

static void rc_free(rc_result *r, int U) {
    for (int u = 0; u < U; u++) free(r->grads[u]);
    free(r->grads), free(r->dres);
}

/* Counts the elements of x and y whose bits differ and their largest relative difference. */
static size_t rc_diff(const float *x, const float *y, size_t n, double *rel) {
    size_t differ = 0;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        differ += memcmp(&x[i], &y[i], sizeof(float)) != 0;
        double d = (double)x[i] - y[i];
        num += d * d, den += (double)y[i] * y[i];
    }
    *rel = sqrt(num / (den > 0 ? den : 1e-30));
    return differ;
}

/* Returns how many of the compared quantities differ in any bit. Every one must be bit for bit the
 * same, except the EMBED unit's gradient when embed_tol > 0 (the GPU's embedding backward adds with
 * atomics): that one within a relative embed_tol. Prints one line per comparison that fails (and
 * one summary line) when `expect_same`. */
static int rc_compare(const char *label, const fsdp_layout *l, int B, int T, int C, const rc_result *a,
                      const rc_result *b, double embed_tol, int expect_same) {
    int differ = 0;
    double rel;
    int same_loss = memcmp(&a->loss, &b->loss, sizeof(float)) == 0 && memcmp(&a->eval_loss, &b->eval_loss, 4) == 0;
    differ += !same_loss;
    if (expect_same && !same_loss)
        printf("  %s: loss %.9g vs %.9g, evaluation loss %.9g vs %.9g\n", label, (double)a->loss, (double)b->loss,
               (double)a->eval_loss, (double)b->eval_loss);
    size_t n = rc_diff(a->dres, b->dres, (size_t)B * T * C, &rel);
    differ += n > 0;
    if (expect_same && n)
        printf("  %s: gradient at the embedding output: %zu elements differ (rel %.2e)\n", label, n, rel);
    for (int u = 0; u < l->num_units; u++) {
        n = rc_diff(a->grads[u], b->grads[u], (size_t)l->units[u].numel, &rel);
        int embed_ok = u == 0 && embed_tol > 0 && rel <= embed_tol;
        differ += n > 0 && !embed_ok;
        if (expect_same && n && !embed_ok)
            printf("  %s: unit %d gradient: %zu of %lld elements differ (rel %.2e)\n", label, u, n,
                   (long long)l->units[u].numel, rel);
    }
    if (expect_same)
        check_that(!differ, "%s: loss %.6f, evaluation loss and %d units' gradients %s", label, (double)a->loss,
                   l->num_units, embed_tol > 0 ? "bit for bit (embedding within rounding)" : "bit for bit");
    return differ;
}

/* Every mode against NONE for one configuration; and, once per configuration, that the comparison
 * can fail: NONE with one weight of layer 0 changed differs. */
static void rc_configuration(fsdp_backend *be, const char *name, const fsdp_model_config *cfg, fsdp_attn attn, int B,
                             int T, double embed_tol) {
    fsdp_layout l;
    fsdp_layout_build(cfg, &l);
    float **hp = rc_weights(cfg, &l, be->act_dtype == FSDP_BF16);
    char label[256];
    snprintf(label, sizeof label, "%s %s %s%s%s", name, be->act_dtype == FSDP_BF16 ? "bf16" : "fp32",
             attn == FSDP_ATTN_FLASH ? "flash" : "eager", cfg->tie_word_embeddings ? " tied" : " untied",
             cfg->dropout > 0 || cfg->attention_dropout > 0 ? " dropout" : "");
    rc_result none, other;
    rc_run(be, cfg, &l, hp, attn, B, T, FSDP_RECOMPUTE_NONE, &none);
    size_t last = none.arena;
    for (int mode = FSDP_RECOMPUTE_SELECTIVE; mode <= FSDP_RECOMPUTE_FULL; mode++) {
        rc_run(be, cfg, &l, hp, attn, B, T, (fsdp_recompute)mode, &other);
        char what[320];
        snprintf(what, sizeof what, "%s, --recompute %s vs none", label, fsdp_recompute_name((fsdp_recompute)mode));
        rc_compare(what, &l, B, T, cfg->hidden_size, &other, &none, embed_tol, 1);
        check_quiet(other.arena < last, "%s: the arena does not shrink (%zu bytes, %zu before)", what, other.arena,
                    last);
        last = other.arena;
        rc_free(&other, l.num_units);
    }
    int b0 = fsdp_unit_block(&l, 0);
    hp[b0][l.units[b0].numel / 2] += 0.25f;
    rc_run(be, cfg, &l, hp, attn, B, T, FSDP_RECOMPUTE_NONE, &other);
    check_quiet(rc_compare(label, &l, B, T, cfg->hidden_size, &other, &none, embed_tol, 0) != 0,
                "%s: a changed weight of layer 0 changes nothing the comparison sees", label);
    rc_free(&other, l.num_units);
    rc_free(&none, l.num_units);
    for (int u = 0; u < l.num_units; u++) free(hp[u]);
    free(hp);
    fsdp_layout_free(&l);
}

#endif
