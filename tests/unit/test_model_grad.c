/* The whole model's gradient against finite differences, on tiny Llama (GQA, tied, llama3 rope),
 * tiny OPT (biases, learned positions) and tiny Qwen2, fp32 on the CPU backend; and again as training
 * micro-batches with dropout (OPT: on the attention and MLP outputs and the probabilities; Llama:
 * on the probabilities), whose masks are a fixed function of the samples, so that the loss is a
 * smooth function of the weights and the gradient must be the one of the forward's masks.
 *
 * For every parameter tensor, three directional derivatives of the mean loss are compared with
 * central differences: along the gradient itself (checks its length), along a sparse random
 * direction of 8 elements (checks individual entries) and along a dense random direction. The test
 * also plants a 5% error into one gradient and requires the check to catch it. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "model/model.h"

typedef struct {
    fsdp_backend *be;
    fsdp_model_config cfg;
    fsdp_layout layout;
    fsdp_model *model;
    float **params, **grads;
    float *loss_sum;
    int counted;
} rig;

/* Mean loss; when `keep_grads` the gradients of this evaluation are left in r->grads. */
static double evaluate(rig *r, int keep_grads) {
    fsdp_backend *be = r->be;
    int U = r->layout.num_units, E = 0, H = U - 1, L = r->cfg.num_layers;
    for (int u = 0; u < U; u++) memset(r->grads[u], 0, (size_t)r->layout.units[u].numel * sizeof(float));
    *r->loss_sum = 0.0f;
    fsdp_model_embed_forward(r->model, r->params[E]);
    for (int l = 0; l < L; l++) fsdp_model_block_forward(r->model, l, r->params[1 + l]);
    fsdp_model_head(r->model, r->params[H], r->grads[H], r->params[E], r->grads[E], 1.0f / (float)r->counted,
                    r->loss_sum);
    if (keep_grads) {
        for (int l = L - 1; l >= 0; l--) fsdp_model_block_backward(r->model, l, r->params[1 + l], r->grads[1 + l]);
        fsdp_model_embed_backward(r->model, r->params[E], r->grads[E]);
    }
    be->runtime->stream_synchronize(be, be->compute);
    return (double)*r->loss_sum / r->counted;
}

static void setup(rig *r, const char *preset, int B, int T, double dropout, double attention_dropout) {
    fsdp_err err = {0};
    memset(r, 0, sizeof *r);
    if (fsdp_model_preset(preset, &r->cfg)) exit(1);
    fsdp_layout_build(&r->cfg, &r->layout);
    fsdp_backend_options bo = {.kind = "cpu", .act_dtype = FSDP_F32, .grad_dtype = FSDP_F32, .local_size = 1};
    r->be = fsdp_backend_create(&bo, &err);
    fsdp_model_shape shape = {.batch = B, .seq = T, .attn = FSDP_ATTN_FLASH, .head_chunk_rows = 5}; /* several LM-head chunks */
    r->cfg.dropout = (float)dropout, r->cfg.attention_dropout = (float)attention_dropout;
    if (fsdp_model_dropout_rates(&r->cfg, 0, 0.0, &shape.dropout, &err)) exit(1);
    r->model = fsdp_model_create(r->be, &r->cfg, &r->layout, &shape, &err);
    if (r->model) fsdp_model_set_dropout(r->model, dropout > 0 || attention_dropout > 0, 29, 1000);
    if (!r->be || !r->model) {
        fprintf(stderr, "setup failed: %s\n", err.msg);
        exit(1);
    }
    int U = r->layout.num_units;
    r->params = calloc((size_t)U, sizeof *r->params);
    r->grads = calloc((size_t)U, sizeof *r->grads);
    for (int u = 0; u < U; u++) {
        r->params[u] = r->be->runtime->alloc(r->be, (size_t)r->layout.units[u].numel * sizeof(float), "params");
        r->grads[u] = r->be->runtime->alloc(r->be, (size_t)r->layout.units[u].numel * sizeof(float), "grads");
    }
    for (int i = 0; i < r->layout.num_params; i++) {
        const fsdp_param_desc *p = &r->layout.params[i];
        for (int64_t k = 0; k < p->numel; k++) {
            float v = fsdp_param_init_value(&r->cfg, p, 11, k);
            /* Larger weights than the 0.02 init make the loss less flat, so differences stand out
             * from rounding; norms and biases get non-trivial values too. */
            v = p->ndim == 1 ? v + 0.2f * (float)fsdp_rand_normal(5, (uint64_t)i, (uint64_t)k) : 8.0f * v;
            r->params[p->unit][p->offset + k] = v;
        }
    }
    int32_t *tok = fsdp_model_tokens(r->model), *tgt = fsdp_model_targets(r->model);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)fsdp_rand_below(3, 1, (uint64_t)i, (uint32_t)r->cfg.vocab_size);
        tgt[i] = i % 5 == 2 ? -1 : (int32_t)fsdp_rand_below(3, 2, (uint64_t)i, (uint32_t)r->cfg.vocab_size);
        r->counted += tgt[i] >= 0;
    }
    r->loss_sum = r->be->runtime->alloc(r->be, sizeof(float), "loss");
}

static void teardown(rig *r) {
    for (int u = 0; u < r->layout.num_units; u++) r->be->runtime->free(r->be, r->params[u]), r->be->runtime->free(r->be, r->grads[u]);
    free(r->params), free(r->grads);
    r->be->runtime->free(r->be, r->loss_sum);
    fsdp_model_destroy(r->model);
    r->be->runtime->destroy(r->be);
    fsdp_layout_free(&r->layout);
}

/* Central difference of the loss along direction d (unit norm) of parameter p. */
static double directional_fd(rig *r, const fsdp_param_desc *p, const double *d, double eps) {
    float *w = r->params[p->unit] + p->offset;
    float *saved = malloc((size_t)p->numel * sizeof(float));
    memcpy(saved, w, (size_t)p->numel * sizeof(float));
    double h[2];
    for (int s = 0; s < 2; s++) {
        double sign = s ? -1.0 : 1.0;
        for (int64_t k = 0; k < p->numel; k++) w[k] = (float)(saved[k] + sign * eps * d[k]);
        h[s] = evaluate(r, 0);
    }
    memcpy(w, saved, (size_t)p->numel * sizeof(float));
    free(saved);
    return (h[0] - h[1]) / (2.0 * eps);
}

static void normalise(double *d, int64_t n) {
    double s = 0;
    for (int64_t k = 0; k < n; k++) s += d[k] * d[k];
    s = sqrt(s);
    for (int64_t k = 0; k < n; k++) d[k] = s > 0 ? d[k] / s : 0;
}

/* Returns the worst error / tolerance over the three directions for parameter p, with its gradient
 * optionally scaled by `corrupt` (to prove the check can fail). */
static double check_param(rig *r, const fsdp_param_desc *p, int index, const float *grad_all, double corrupt) {
    const float *g = grad_all;
    double *d = calloc((size_t)p->numel, sizeof(double)), gnorm = 0.0, worst = 0.0;
    for (int64_t k = 0; k < p->numel; k++) gnorm += (double)g[k] * g[k];
    gnorm = sqrt(gnorm) * corrupt;
    for (int kind = 0; kind < 3; kind++) {
        memset(d, 0, (size_t)p->numel * sizeof(double));
        if (kind == 0) {
            for (int64_t k = 0; k < p->numel; k++) d[k] = g[k];
        } else if (kind == 1) {
            for (int j = 0; j < 8; j++) {
                int64_t k = (int64_t)fsdp_rand_below(17, (uint64_t)index, (uint64_t)j, (uint32_t)p->numel);
                d[k] = fsdp_rand_normal(19, (uint64_t)index, (uint64_t)j);
            }
        } else {
            for (int64_t k = 0; k < p->numel; k++) d[k] = fsdp_rand_normal(23, (uint64_t)index, (uint64_t)k);
        }
        normalise(d, p->numel);
        double analytic = 0.0;
        for (int64_t k = 0; k < p->numel; k++) analytic += corrupt * (double)g[k] * d[k];
        /* Three step sizes: large steps lose to curvature and to ReLU kinks crossed on the way,
         * small ones to the fp32 rounding of a loss near 7 (about 1e-6, so 1e-6/eps of noise in
         * the difference). A correct gradient agrees at one of them; a 5% error at none. */
        double ratio = 1e30;
        for (double eps = 1e-2; eps > 4e-4; eps /= 4.5) {
            double r1 = fabs(directional_fd(r, p, d, eps) - analytic) / (3e-3 * gnorm + 1e-6 / eps);
            if (r1 < ratio) ratio = r1;
        }
        if (ratio > worst) worst = ratio;
    }
    free(d);
    return worst;
}

static int run(const char *preset, double dropout, double attention_dropout) {
    rig r;
    setup(&r, preset, 2, 7, dropout, attention_dropout);
    double loss = evaluate(&r, 1);
    /* Keep the gradients of the unperturbed model: later evaluations overwrite r.grads. */
    float **grads = calloc((size_t)r.layout.num_units, sizeof *grads);
    for (int u = 0; u < r.layout.num_units; u++) {
        size_t bytes = (size_t)r.layout.units[u].numel * sizeof(float);
        grads[u] = malloc(bytes);
        memcpy(grads[u], r.grads[u], bytes);
    }
    int failures = 0;
    printf("%s, dropout %g, attention_dropout %g: loss %.6f over %d tokens\n", preset, dropout, attention_dropout, loss,
           r.counted);
    for (int i = 0; i < r.layout.num_params; i++) {
        const fsdp_param_desc *p = &r.layout.params[i];
        /* Without rotary positions a k_proj bias has an exactly zero gradient (softmax ignores a
         * shift shared by all keys); rotated, the shift differs per key position and counts. */
        if (p->module == FSDP_MOD_K && p->is_bias && r.cfg.family->pos != FSDP_POS_ROPE) continue;
        double worst = check_param(&r, p, i, grads[p->unit] + p->offset, 1.0);
        int ok = worst <= 1.0;
        failures += !ok;
        printf("  %-4s %-48s error/tolerance %.3f\n", ok ? "ok" : "FAIL", p->name, worst);
    }
    /* The check must notice a gradient that is 5% off. */
    const fsdp_param_desc *probe = &r.layout.params[r.layout.units[fsdp_unit_block(&r.layout, 1)].weight[FSDP_MOD_UP]];
    double planted = check_param(&r, probe, 0, grads[probe->unit] + probe->offset, 1.05);
    int caught = planted > 1.0;
    failures += !caught;
    printf("  %-4s a 5%% error planted in %s is detected (error/tolerance %.2f)\n", caught ? "ok" : "FAIL",
           probe->name, planted);
    for (int u = 0; u < r.layout.num_units; u++) free(grads[u]);
    free(grads);
    teardown(&r);
    return failures;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int failures = run("tiny-llama", 0, 0) + run("tiny-opt", 0, 0) + run("tiny-qwen2", 0, 0);
    failures += run("tiny-opt", 0.2, 0.2) + run("tiny-llama", 0, 0.25);
    printf(failures ? "test_model_grad: %d FAILED\n" : "test_model_grad: all passed\n", failures);
    MPI_Finalize();
    return failures ? 1 : 0;
}
