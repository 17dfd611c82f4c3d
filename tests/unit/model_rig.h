/* The whole model on the CPU backend in fp32, for the tests that drive it directly through its API
 * (test_model_grad.c, test_model_dropout.c): a preset's config with the given dropout rates, its
 * layout, the backend, the model, one parameter and one gradient buffer per unit and a loss sum.
 * Header-only; every failure to build it exits. */
#ifndef FSDP_TESTS_UNIT_MODEL_RIG_H
#define FSDP_TESTS_UNIT_MODEL_RIG_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "model/model.h"

typedef struct {
    fsdp_model_config cfg;
    fsdp_layout layout;
    fsdp_backend *be;
    fsdp_model *model;
    float **params, **grads, *loss; /* params[u], grads[u]: unit u's; loss: the loss sum of the head */
    int B, T;
} model_rig;

/* shape gets batch B and seq T here, and the dropout rates of the config; the rest (attention
 * path, head chunking) is the caller's. */
static void model_rig_create(model_rig *r, const char *preset, int B, int T, float dropout, float attention_dropout,
                             fsdp_model_shape shape) {
    fsdp_err err = {0};
    memset(r, 0, sizeof *r);
    if (fsdp_model_preset(preset, &r->cfg)) exit(1);
    r->cfg.dropout = dropout, r->cfg.attention_dropout = attention_dropout;
    r->B = B, r->T = T;
    fsdp_layout_build(&r->cfg, &r->layout);
    fsdp_backend_options bo = {.kind = "cpu", .act_dtype = FSDP_F32, .grad_dtype = FSDP_F32, .local_size = 1};
    r->be = fsdp_backend_create(&bo, &err);
    shape.batch = B, shape.seq = T;
    if (r->be && !fsdp_model_dropout_rates(&r->cfg, 0, 0.0, &shape.dropout, &err))
        r->model = fsdp_model_create(r->be, &r->cfg, &r->layout, &shape, &err);
    if (!r->model) {
        fprintf(stderr, "%s: the CPU model could not be built: %s\n", preset, err.msg);
        exit(1);
    }
    int U = r->layout.num_units;
    r->params = calloc((size_t)U, sizeof *r->params), r->grads = calloc((size_t)U, sizeof *r->grads);
    for (int u = 0; u < U; u++) {
        r->params[u] = r->be->runtime->alloc(r->be, (size_t)r->layout.units[u].numel * sizeof(float), "params");
        r->grads[u] = r->be->runtime->alloc(r->be, (size_t)r->layout.units[u].numel * sizeof(float), "grads");
    }
    r->loss = r->be->runtime->alloc(r->be, sizeof(float), "loss");
}

/* The preset's initialisation (seed init_seed) with larger weights, which make the loss less flat
 * so that differences stand out from rounding: matrices scaled by matrix_scale, and norms and biases
 * given non-trivial values (plus vector_noise times a normal draw of seed noise_seed). */
static void model_rig_init_params(model_rig *r, uint64_t init_seed, float matrix_scale, float vector_noise,
                                  uint64_t noise_seed) {
    for (int i = 0; i < r->layout.num_params; i++) {
        const fsdp_param_desc *p = &r->layout.params[i];
        for (int64_t k = 0; k < p->numel; k++) {
            float v = fsdp_param_init_value(&r->cfg, p, init_seed, k);
            v = p->ndim == 1 ? v + vector_noise * (float)fsdp_rand_normal(noise_seed, (uint64_t)i, (uint64_t)k)
                             : matrix_scale * v;
            r->params[p->unit][p->offset + k] = v;
        }
    }
}

static void model_rig_destroy(model_rig *r) {
    for (int u = 0; u < r->layout.num_units; u++)
        r->be->runtime->free(r->be, r->params[u]), r->be->runtime->free(r->be, r->grads[u]);
    free(r->params), free(r->grads);
    r->be->runtime->free(r->be, r->loss);
    fsdp_model_destroy(r->model);
    r->be->runtime->destroy(r->be);
    fsdp_layout_free(&r->layout);
}

#endif
