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
#include "check.h"
#include "model/model.h"
#include "model_rig.h"

typedef model_rig rig;

static int counted_targets(const rig *r) {
    const int32_t *tgt = fsdp_model_targets(r->model);
    int counted = 0;
    for (int i = 0; i < r->B * r->T; i++) counted += tgt[i] >= 0;
    return counted;
}

/* Mean loss; when `keep_grads` the gradients of this evaluation are left in r->grads. */
static double evaluate(rig *r, int keep_grads) {
    fsdp_backend *be = r->be;
    int U = r->layout.num_units, E = 0, H = U - 1, L = r->cfg.num_layers, counted = counted_targets(r);
    for (int u = 0; u < U; u++) memset(r->grads[u], 0, (size_t)r->layout.units[u].numel * sizeof(float));
    *r->loss = 0.0f;
    fsdp_model_embed_forward(r->model, r->params[E]);
    for (int l = 0; l < L; l++) fsdp_model_block_forward(r->model, l, r->params[1 + l]);
    fsdp_model_head(r->model, r->params[H], r->grads[H], r->params[E], r->grads[E], 1.0f / (float)counted, r->loss);
    if (keep_grads) {
        for (int l = L - 1; l >= 0; l--) fsdp_model_block_backward(r->model, l, r->params[1 + l], r->grads[1 + l]);
        fsdp_model_embed_backward(r->model, r->params[E], r->grads[E]);
    }
    be->runtime->stream_synchronize(be, be->compute);
    return (double)*r->loss / counted;
}

/* Flash attention in several LM-head chunks; the preset's initialisation (seed 11) with matrices * 8
 * and norms and biases + 0.2 N(0, 1); tokens and targets (every fifth ignored) drawn from seed 3. */
static void setup(rig *r, const char *preset, int B, int T, double dropout, double attention_dropout) {
    model_rig_create(r, preset, B, T, (float)dropout, (float)attention_dropout,
                     (fsdp_model_shape){.attn = FSDP_ATTN_FLASH, .head_chunk_rows = 5});
    fsdp_model_set_dropout(r->model, dropout > 0 || attention_dropout > 0, 29, 1000);
    model_rig_init_params(r, 11, 8.0f, 0.2f, 5);
    int32_t *tok = fsdp_model_tokens(r->model), *tgt = fsdp_model_targets(r->model);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)fsdp_rand_below(3, 1, (uint64_t)i, (uint32_t)r->cfg.vocab_size);
        tgt[i] = i % 5 == 2 ? -1 : (int32_t)fsdp_rand_below(3, 2, (uint64_t)i, (uint32_t)r->cfg.vocab_size);
    }
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

static void run(const char *preset, double dropout, double attention_dropout) {
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
    printf("%s, dropout %g, attention_dropout %g: loss %.6f over %d tokens\n", preset, dropout, attention_dropout, loss,
           counted_targets(&r));
    for (int i = 0; i < r.layout.num_params; i++) {
        const fsdp_param_desc *p = &r.layout.params[i];
        /* Without rotary positions a k_proj bias has an exactly zero gradient (softmax ignores a
         * shift shared by all keys); rotated, the shift differs per key position and counts. */
        if (p->module == FSDP_MOD_K && p->is_bias && r.cfg.family->pos != FSDP_POS_ROPE) continue;
        double worst = check_param(&r, p, i, grads[p->unit] + p->offset, 1.0);
        check_that(worst <= 1.0, "%-48s error/tolerance %.3f", p->name, worst);
    }
    /* The check must notice a gradient that is 5% off. */
    const fsdp_param_desc *probe = &r.layout.params[r.layout.units[fsdp_unit_block(&r.layout, 1)].weight[FSDP_MOD_UP]];
    double planted = check_param(&r, probe, 0, grads[probe->unit] + probe->offset, 1.05);
    check_that(planted > 1.0, "a 5%% error planted in %s is detected (error/tolerance %.2f)", probe->name, planted);
    for (int u = 0; u < r.layout.num_units; u++) free(grads[u]);
    free(grads);
    model_rig_destroy(&r);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    run("tiny-llama", 0, 0);
    run("tiny-opt", 0, 0);
    run("tiny-qwen2", 0, 0);
    run("tiny-qwen3", 0, 0);   /* per-head q/k norms: their weights' and inputs' gradients */
    run("tiny-mistral", 0, 0); /* a sliding window shorter than the sequence */
    run("tiny-opt", 0.2, 0.2);
    run("tiny-llama", 0, 0.25);
    int status = check_summary("test_model_grad");
    MPI_Finalize();
    return status;
}
