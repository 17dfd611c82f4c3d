/* The whole model on the CUDA backend against the CPU backend: the loss and every parameter
 * gradient of one forward and backward, for tiny Llama (GQA, tied, llama3 rope), tiny OPT, tiny
 * Qwen2 (q/k/v biases, untied), inputs holding the padding_idx where the model has one, a small
 * Llama with head dimension 64 (the tensor-core attention path), tiny Qwen3 (per-head q/k norms),
 * tiny Mistral (a window of 5 in 37 tokens) and a small Mistral at head dimension 64 (a window of
 * 50 in 200 tokens, across the tensor-core kernels' key blocks), with flash and eager
 * attention, in fp32 (tolerance 1e-4) and bf16 mixed precision against the CPU's bf16 emulation
 * (loss 1e-2, gradients 6e-2 with flash and 2e-1 with eager, whose dP is bf16). Then the same as
 * training micro-batches with dropout (OPT: 0.1 on the attention and MLP outputs and 0.1 on the
 * probabilities; Llama, Qwen2 and the head-dimension-64 Llama: 0.1 on the probabilities): both
 * backends draw bit-identical masks from the same samples, so the tolerances stay the same.
 * Exit 77 without a GPU. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "check.h"
#include "device_copy.h"
#include "model/model.h"

typedef struct {
    fsdp_backend *be;
    fsdp_model *model;
    void **params, **grads;
    float *loss;
} side;

static void run_side(side *s, const fsdp_model_config *cfg, const fsdp_layout *l, float **host_params,
                     const int32_t *tok, const int32_t *tgt, int B, int T, fsdp_attn attn, int counted) {
    fsdp_backend *be = s->be;
    fsdp_err err = {0};
    fsdp_model_shape shape = {.batch = B, .seq = T, .attn = attn, .head_chunk_rows = 17};
    if (fsdp_model_dropout_rates(cfg, 0, 0.0, &shape.dropout, &err) == 0)
        s->model = fsdp_model_create(be, cfg, l, &shape, &err);
    if (!s->model) {
        printf("model creation failed: %s\n", err.msg);
        exit(1);
    }
    /* A training micro-batch of the samples from global index 5000 (the masks' samples). */
    fsdp_model_set_dropout(s->model, shape.dropout.hidden > 0 || shape.dropout.attention > 0, 99, 5000);
    int U = l->num_units;
    s->params = calloc((size_t)U, sizeof(void *));
    s->grads = calloc((size_t)U, sizeof(void *));
    for (int u = 0; u < U; u++) {
        s->params[u] = test_to_device(be, host_params[u], (size_t)l->units[u].numel, be->act_dtype);
        size_t grad_bytes = (size_t)l->units[u].numel * be->runtime->dtype_size(be, be->grad_dtype);
        s->grads[u] = be->runtime->alloc(be, grad_bytes, "grads");
    }
    be->runtime->copy_h2d(be, fsdp_model_tokens(s->model), tok, (size_t)B * T * 4, be->compute);
    be->runtime->copy_h2d(be, fsdp_model_targets(s->model), tgt, (size_t)B * T * 4, be->compute);
    s->loss = be->runtime->alloc(be, 4, "loss");
    int L = cfg->num_layers, E = 0, H = U - 1;
    fsdp_model_embed_forward(s->model, s->params[E]);
    for (int i = 0; i < L; i++) fsdp_model_block_forward(s->model, i, s->params[1 + i]);
    fsdp_model_head(s->model, s->params[H], s->grads[H], s->params[E], s->grads[E], 1.0f / (float)counted, s->loss);
    for (int i = L - 1; i >= 0; i--) fsdp_model_block_backward(s->model, i, s->params[1 + i], s->grads[1 + i]);
    fsdp_model_embed_backward(s->model, s->params[E], s->grads[E]);
    be->runtime->stream_synchronize(be, be->compute);
}

static void free_side(side *s, int U) {
    for (int u = 0; u < U; u++) s->be->runtime->free(s->be, s->params[u]), s->be->runtime->free(s->be, s->grads[u]);
    s->be->runtime->free(s->be, s->loss);
    fsdp_model_destroy(s->model);
    free(s->params), free(s->grads);
}

/* One line for each loss and each failure; the passing gradients are only counted. */
static void check(const char *what, double err, double tol) {
    int ok = isfinite(err) && err <= tol;
    if (!ok || strstr(what, "loss"))
        check_that(ok, "%-60s rel err %.2e (tol %.0e)", what, err, tol);
    else
        check_count(ok);
}

static void compare_model(const char *label, const fsdp_model_config *cfg, fsdp_dtype act, fsdp_attn attn, int B,
                          int T) {
    fsdp_err err = {0};
    fsdp_layout l;
    fsdp_layout_build(cfg, &l);
    /* In bf16 mode the CPU side emulates bf16 (every op's output rounded to bf16, as the GPU stores
     * it): against plain fp32, small models' attention gradients differ by more than bf16 noise
     * because they are small differences of large terms. */
    fsdp_backend_options co = {.kind = "cpu", .act_dtype = act, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend_options go = {.kind = "cuda", .act_dtype = act, .grad_dtype = FSDP_F32, .local_size = 1};
    side c = {fsdp_backend_create(&co, &err), 0, 0, 0, 0}, g = {fsdp_backend_create(&go, &err), 0, 0, 0, 0};
    int U = l.num_units;
    float **hp = calloc((size_t)U, sizeof(float *));
    for (int u = 0; u < U; u++) hp[u] = malloc((size_t)l.units[u].numel * 4);
    for (int i = 0; i < l.num_params; i++) {
        const fsdp_param_desc *p = &l.params[i];
        for (int64_t k = 0; k < p->numel; k++) {
            float v = fsdp_param_init_value(cfg, p, 3, k);
            if (p->ndim == 1) v += 0.1f * (float)fsdp_rand_normal(4, (uint64_t)i, (uint64_t)k);
            /* Both sides start from the same (bf16-representable, in bf16 mode) weights. */
            hp[p->unit][p->offset + k] = act == FSDP_BF16 ? fsdp_round_bf16(v) : v;
        }
    }
    int N = B * T, counted = 0;
    int32_t *tok = malloc((size_t)N * 4), *tgt = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)fsdp_rand_below(8, 1, (uint64_t)i, (uint32_t)cfg->vocab_size);
        if (i % 6 == 2 && fsdp_model_padding_idx(cfg) >= 0) tok[i] = fsdp_model_padding_idx(cfg); /* padding_idx */
        tgt[i] = i % 9 == 4 ? -1 : (int32_t)fsdp_rand_below(8, 2, (uint64_t)i, (uint32_t)cfg->vocab_size);
        counted += tgt[i] >= 0;
    }
    run_side(&c, cfg, &l, hp, tok, tgt, B, T, attn, counted);
    run_side(&g, cfg, &l, hp, tok, tgt, B, T, attn, counted);
    /* Eager bf16 keeps dP = dO V^T in bf16, as PyTorch's eager attention does; the softmax backward
     * then takes the small difference dP - rowsum(dP P), so the q and k gradients of near-uniform
     * attention (tiny OPT) carry up to ~15% of bf16 rounding noise that the CPU's fused backward
     * (dP in fp32) does not have. Flash computes dP in fp32 and meets the tighter bound. */
    double tol_loss = act == FSDP_BF16 ? 1e-2 : 1e-5;
    double tol_grad = act == FSDP_F32 ? 1e-4 : attn == FSDP_ATTN_EAGER ? 2e-1 : 6e-2;
    char what[192];
    float *gl = test_to_host(g.be, g.loss, 1, FSDP_F32);
    snprintf(what, sizeof what, "%s %s %s%s: loss %.5f vs %.5f", label, act == FSDP_BF16 ? "bf16" : "fp32",
             attn == FSDP_ATTN_FLASH ? "flash" : "eager", cfg->dropout > 0 || cfg->attention_dropout > 0 ? " dropout" : "",
             *gl / counted, *c.loss / counted);
    check(what, fabs(*gl - *c.loss) / fabs(*c.loss), tol_loss);
    double worst = 0;
    for (int i = 0; i < l.num_params; i++) {
        const fsdp_param_desc *p = &l.params[i];
        if (strstr(p->name, "k_proj.bias")) continue; /* exactly zero in exact arithmetic */
        float *gg = test_to_host(g.be, (char *)g.grads[p->unit], (size_t)l.units[p->unit].numel, FSDP_F32);
        const float *cg = (const float *)c.grads[p->unit] + p->offset;
        double num = 0, den = 0;
        for (int64_t k = 0; k < p->numel; k++) {
            double d = (double)gg[p->offset + k] - cg[k];
            num += d * d, den += (double)cg[k] * cg[k];
        }
        double e = sqrt(num / (den > 0 ? den : 1e-30));
        if (e > worst) worst = e;
        snprintf(what, sizeof what, "%s grad %s", label, p->name);
        check(what, e, tol_grad);
        free(gg);
    }
    printf("  %s %s %s%s: %d gradients, worst rel err %.2e (tol %.0e)\n", label, act == FSDP_BF16 ? "bf16" : "fp32",
           attn == FSDP_ATTN_FLASH ? "flash" : "eager", cfg->dropout > 0 || cfg->attention_dropout > 0 ? " dropout" : "",
           l.num_params, worst, tol_grad);
    free(gl);
    free_side(&c, U), free_side(&g, U);
    c.be->runtime->destroy(c.be), g.be->runtime->destroy(g.be);
    for (int u = 0; u < U; u++) free(hp[u]);
    free(hp), free(tok), free(tgt);
    fsdp_layout_free(&l);
}

typedef struct {
    const char *name;
    const fsdp_model_config *cfg;
    int T;
} model_case;

/* Each case (B = 2) in fp32 and bf16, eager and flash. */
static void compare_models(const model_case *cases, int n) {
    for (int act = 0; act < 2; act++)
        for (int attn = 0; attn < 2; attn++)
            for (int i = 0; i < n; i++)
                compare_model(cases[i].name, cases[i].cfg, act ? FSDP_BF16 : FSDP_F32, (fsdp_attn)attn, 2, cases[i].T);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (!fsdp_backend_cuda_available()) {
        printf("test_gpu_model: SKIPPED (no GPU)\n");
        MPI_Finalize();
        return 77;
    }
    fsdp_model_config tl, to, tq, sl;
    fsdp_model_preset("tiny-llama", &tl);
    fsdp_model_preset("tiny-opt", &to);
    fsdp_model_preset("tiny-qwen2", &tq);
    tq.pad_token_id = 3; /* Qwen2's block with a padding_idx */
    fsdp_model_preset("tiny-llama", &sl);
    snprintf(sl.name, sizeof sl.name, "small-llama-d64");
    sl.hidden_size = 256, sl.num_heads = 4, sl.num_kv_heads = 2, sl.head_dim = 64, sl.intermediate_size = 512;
    /* Qwen3's per-head q/k norms, and Mistral's window at head dimension 64 (the tensor-core path):
     * a window of 5 in 37 tokens, and of 50 in 200 (across the kernels' key blocks). */
    fsdp_model_config q3, mi, sm;
    fsdp_model_preset("tiny-qwen3", &q3);
    fsdp_model_preset("tiny-mistral", &mi);
    fsdp_model_preset("tiny-mistral", &sm);
    snprintf(sm.name, sizeof sm.name, "small-mistral-d64");
    sm.hidden_size = 256, sm.num_heads = 4, sm.num_kv_heads = 2, sm.head_dim = 64, sm.intermediate_size = 512;
    sm.sliding_window = 50;
    const model_case plain[] = {{"tiny-llama", &tl, 37},        {"tiny-opt", &to, 37},     {"tiny-qwen2", &tq, 37},
                                {"small-llama-d64", &sl, 200},  {"tiny-qwen3", &q3, 37},   {"tiny-mistral", &mi, 37},
                                {"small-mistral-d64", &sm, 200}};
    compare_models(plain, 7);
    /* Training with dropout: tiny-opt's `dropout` and every model's attention_dropout. */
    to.dropout = 0.1f, to.attention_dropout = 0.1f;
    tl.attention_dropout = tq.attention_dropout = sl.attention_dropout = 0.1f;
    q3.attention_dropout = sm.attention_dropout = 0.1f;
    const model_case dropout[] = {{"tiny-opt", &to, 37},       {"tiny-llama", &tl, 37},
                                  {"tiny-qwen2", &tq, 37},     {"small-llama-d64", &sl, 200},
                                  {"tiny-qwen3", &q3, 37},     {"small-mistral-d64", &sm, 200}};
    compare_models(dropout, 6);
    int status = check_summary("test_gpu_model");
    MPI_Finalize();
    return status;
}
