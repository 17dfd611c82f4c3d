/* Dropout in the whole model (CPU backend, fp32), where the model's API can see it:
 *  - the rate: over a run of micro-batches, the fraction of the attention output's and of the MLP
 *    output's elements that a training micro-batch zeroes is p (within 5 sigma), and the kept ones
 *    are scaled by 1 / (1 - p). Layer 0's other branch is zeroed by its weights, so that the
 *    residual stream entering layer 1 is layer 0's input plus exactly one dropped branch, compared
 *    with the same micro-batch run without dropout;
 *  - different samples draw different masks; the same sample draws the same mask again;
 *  - a model whose shape has rates but that does not train (fsdp_model_set_dropout(m, 0, ...)) gives
 *    bit for bit the loss and gradients of a model without rates;
 *  - masks follow the samples: one micro-batch of 4 samples from global index s trains like two of 2
 *    from s and s + 2 (loss and gradients within rounding), and unlike one from s + 1.
 * The gradient with dropout is checked against finite differences in test_model_grad.c and against
 * the independent PyTorch reference in tests/scripts/oracle_torch.py. */
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

/* Eager attention; the preset's initialisation (seed 7) with matrices * 4 and norms and biases
 * + 0.1 N(0, 1). */
static void rig_create(rig *r, const char *preset, int B, int T, float dropout, float attention_dropout) {
    model_rig_create(r, preset, B, T, dropout, attention_dropout, (fsdp_model_shape){.attn = FSDP_ATTN_EAGER});
    model_rig_init_params(r, 7, 4.0f, 0.1f, 9);
}

/* Zeroes a module of layer 0 (weight and bias): its branch adds exactly nothing. */
static void zero_module(rig *r, fsdp_module mod) {
    const fsdp_unit_desc *u = &r->layout.units[fsdp_unit_block(&r->layout, 0)];
    int idx[2] = {u->weight[mod], u->bias[mod]};
    for (int k = 0; k < 2; k++)
        if (idx[k] >= 0) {
            const fsdp_param_desc *p = &r->layout.params[idx[k]];
            memset(r->params[p->unit] + p->offset, 0, (size_t)p->numel * sizeof(float));
        }
}

/* Tokens of samples first, first + 1, ...: each sample's tokens depend only on its index. */
static void set_tokens(rig *r, int64_t first) {
    int32_t *tok = fsdp_model_tokens(r->model), *tgt = fsdp_model_targets(r->model);
    for (int b = 0; b < r->B; b++)
        for (int t = 0; t < r->T; t++) {
            uint64_t at = (uint64_t)(first + b) * 1000u + (uint64_t)t;
            tok[b * r->T + t] = (int32_t)fsdp_rand_below(5, 1, at, (uint32_t)r->cfg.vocab_size);
            tgt[b * r->T + t] = (int32_t)fsdp_rand_below(5, 2, at, (uint32_t)r->cfg.vocab_size);
        }
}

/* One forward (and backward when `backward`) of the tokens of samples [first, first + B) with
 * dropout on or off, drawing the masks of samples [mask_first, ...). */
static void step_masks(rig *r, int64_t first, int64_t mask_first, int training, int backward) {
    int U = r->layout.num_units, L = r->cfg.num_layers, E = fsdp_unit_embed(&r->layout), H = fsdp_unit_head(&r->layout);
    for (int u = 0; u < U; u++) memset(r->grads[u], 0, (size_t)r->layout.units[u].numel * sizeof(float));
    *r->loss = 0.0f;
    set_tokens(r, first);
    fsdp_model_set_dropout(r->model, training, 1234, mask_first);
    fsdp_model_embed_forward(r->model, r->params[E]);
    for (int l = 0; l < L; l++) fsdp_model_block_forward(r->model, l, r->params[fsdp_unit_block(&r->layout, l)]);
    fsdp_model_head(r->model, r->params[H], r->grads[H], r->params[E], r->grads[E], 1.0f, r->loss);
    if (backward) {
        for (int l = L - 1; l >= 0; l--) {
            int u = fsdp_unit_block(&r->layout, l);
            fsdp_model_block_backward(r->model, l, r->params[u], r->grads[u]);
        }
        fsdp_model_embed_backward(r->model, r->params[E], r->grads[E]);
    }
}

static void step(rig *r, int64_t first, int training, int backward) { step_masks(r, first, first, training, backward); }

/* The residual stream entering layer 1 minus layer 0's input: layer 0's branches as added. */
static float *layer0_delta(rig *r) {
    size_t n = (size_t)r->B * r->T * r->cfg.hidden_size;
    const float *in = fsdp_model_layer_input(r->model, 0), *out = fsdp_model_layer_input(r->model, 1);
    float *d = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) d[i] = out[i] - in[i];
    return d;
}

/* The dropped fraction and the scale of the kept elements of one residual site over `batches`
 * micro-batches; `other` is layer 0's module whose zeroed weights leave only that site's branch. */
static void test_rate(const char *site, fsdp_module other, float p) {
    rig r;
    rig_create(&r, "tiny-opt", 4, 32, p, 0.0f);
    zero_module(&r, other);
    const int batches = 16;
    size_t n = (size_t)r.B * r.T * r.cfg.hidden_size, total = 0, dropped = 0, same_as_first = 0;
    double kept_on = 0.0, kept_off = 0.0;
    char *first_mask = malloc(n); /* 1 dropped, 0 kept, 2 no branch value there */
    memset(first_mask, 2, n);
    for (int k = 0; k < batches; k++) {
        step(&r, 4 * k, 0, 0);
        float *off = layer0_delta(&r);
        step(&r, 4 * k, 1, 0);
        float *on = layer0_delta(&r);
        for (size_t i = 0; i < n; i++) {
            if (off[i] == 0.0f) continue;
            char zero = on[i] == 0.0f;
            total++, dropped += (size_t)zero;
            if (!zero) kept_on += fabs((double)on[i]), kept_off += fabs((double)off[i]);
            if (k == 0) first_mask[i] = zero;
            else same_as_first += first_mask[i] == zero;
        }
        free(off), free(on);
    }
    /* The first micro-batch again: its samples draw their masks again. */
    step(&r, 0, 1, 0);
    float *again = layer0_delta(&r);
    size_t repeated = 0, compared = 0;
    for (size_t i = 0; i < n; i++)
        if (first_mask[i] != 2) compared++, repeated += (again[i] == 0.0f) == first_mask[i];
    double frac = (double)dropped / (double)total, sigma = sqrt(p * (1.0 - p) / (double)total);
    check_that(fabs(frac - p) <= 5 * sigma,
               "%s: %zu of %zu elements dropped over %d micro-batches = %.4f, rate %.2f (5 sigma %.4f)", site, dropped,
               total, batches, frac, (double)p, 5 * sigma);
    check_that(fabs(kept_on / kept_off * (1.0 - p) - 1.0) < 1e-3,
               "%s: kept elements scaled by %.5f (1 / (1 - p) = %.5f)", site, kept_on / kept_off, 1.0 / (1.0 - p));
    /* Independent masks agree where both drop or both keep: p^2 + (1 - p)^2 of the time. */
    double agree = (double)same_as_first / (double)(total - total / batches), expect = p * p + (1 - p) * (1 - p);
    check_that(fabs(agree - expect) < 0.02,
               "%s: other samples' masks agree with the first's %.4f of the time (independent: %.4f)", site, agree,
               expect);
    check_that(compared > n / 2 && repeated == compared, "%s: the same samples draw the same mask again (%zu of %zu)",
               site, repeated, compared);
    free(again), free(first_mask);
    model_rig_destroy(&r);
}

static int same_bits(const rig *a, const rig *b) {
    int same = memcmp(a->loss, b->loss, sizeof(float)) == 0;
    for (int u = 0; u < a->layout.num_units; u++)
        same &= memcmp(a->grads[u], b->grads[u], (size_t)a->layout.units[u].numel * sizeof(float)) == 0;
    return same;
}

static void test_not_training(const char *preset) {
    rig plain, rated;
    rig_create(&plain, preset, 2, 19, 0.0f, 0.0f);
    rig_create(&rated, preset, 2, 19, 0.3f, 0.3f);
    step(&plain, 40, 0, 1);
    step(&rated, 40, 0, 1);
    check_that(same_bits(&plain, &rated),
               "%s: rates without training: loss and gradients bit for bit those of no rates", preset);
    float before = *rated.loss;
    step(&rated, 40, 1, 1);
    check_that(*rated.loss != before, "%s: training drops something (loss %.6f -> %.6f)", preset, (double)before,
               (double)*rated.loss);
    model_rig_destroy(&plain), model_rig_destroy(&rated);
}

/* Relative difference between a's gradients and b. */
static double grad_diff(const rig *a, float **b) {
    double num = 0.0, den = 0.0;
    for (int u = 0; u < a->layout.num_units; u++)
        for (int64_t k = 0; k < a->layout.units[u].numel; k++) {
            double d = (double)a->grads[u][k] - b[u][k];
            num += d * d, den += (double)a->grads[u][k] * a->grads[u][k];
        }
    return sqrt(num / den);
}

static void test_split(const char *preset, float dropout, float attention_dropout) {
    rig four, two;
    rig_create(&four, preset, 4, 21, dropout, attention_dropout);
    rig_create(&two, preset, 2, 21, dropout, attention_dropout);
    int U = four.layout.num_units;
    float **sum = calloc((size_t)U, sizeof *sum);
    for (int u = 0; u < U; u++) sum[u] = calloc((size_t)four.layout.units[u].numel, sizeof(float));
    double loss2 = 0.0;
    for (int half = 0; half < 2; half++) {
        step(&two, 100 + 2 * half, 1, 1);
        loss2 += *two.loss;
        for (int u = 0; u < U; u++)
            for (int64_t k = 0; k < four.layout.units[u].numel; k++) sum[u][k] += two.grads[u][k];
    }
    step(&four, 100, 1, 1);
    double loss_err = fabs(*four.loss - loss2) / loss2, grad_err = grad_diff(&four, sum);
    check_that(loss_err < 1e-6 && grad_err < 1e-5,
               "%s: samples 100-103 as one micro-batch or two: loss rel diff %.1e, gradients %.1e", preset, loss_err,
               grad_err);
    /* The same tokens with the masks of samples 101-104 must differ: masks follow the sample index. */
    step_masks(&four, 100, 101, 1, 0);
    double shifted = fabs(*four.loss - loss2) / loss2;
    check_that(shifted > 1e-4, "%s: the same tokens with the masks of samples 101-104 differ (loss rel diff %.1e)",
               preset, shifted);
    for (int u = 0; u < U; u++) free(sum[u]);
    free(sum);
    model_rig_destroy(&four), model_rig_destroy(&two);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    test_rate("OPT attention output (layer 0, dropout 0.2)", FSDP_MOD_DOWN, 0.2f);
    test_rate("OPT MLP output (layer 0, dropout 0.35)", FSDP_MOD_O, 0.35f);
    test_not_training("tiny-opt");
    test_not_training("tiny-llama");
    test_split("tiny-opt", 0.1f, 0.1f);
    test_split("tiny-qwen2", 0.0f, 0.2f);
    int status = check_summary("test_model_dropout");
    MPI_Finalize();
    return status;
}
