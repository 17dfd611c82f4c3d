/* Every op of the CUDA backend against the same op of the CPU backend, through the backend table
 * (kernels, cuBLASLt products, eager and flash attention, optimizer and reductions), on fresh random
 * inputs, forward and backward, in fp32 mode (tolerance 1e-4, TF32 off) and bf16 mode (inputs
 * rounded to bf16 for both sides; tolerance 2e-2); attention and the residual ops also with dropout
 * (the same descriptor on both sides, so the same masks); in bf16 mode --attn cudnn too, where the
 * build has cuDNN (and its scratch as the plan counts it). Outputs that ops overwrite are poisoned with
 * NaN first; accumulated outputs start from random values. Exit 77 without a GPU. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/sizes.h"
#if FSDP_HAVE_CUDNN
#include "backend/cuda_cudnn_attention.h"
#include "backend/cuda_cudnn_graph.h"
#endif
#include "base/rng.h"
#include "check.h"
#include "device_copy.h"

static fsdp_backend *cpu, *gpu;
static fsdp_dtype ACT, GRAD;
static uint64_t draw;

/* ---- host <-> device helpers ---- */

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    draw++;
    for (size_t i = 0; i < n; i++) {
        x[i] = scale * (float)fsdp_rand_normal(99, draw, i);
        if (ACT == FSDP_BF16) x[i] = fsdp_round_bf16(x[i]);
    }
    return x;
}

/* 16 bytes of slack after every tensor. */
static void *upload(const float *x, size_t n, fsdp_dtype t) {
    void *d = gpu->runtime->alloc(gpu, n * gpu->runtime->dtype_size(gpu, t) + 16, "test");
    test_copy_to_device(gpu, d, x, n, t);
    return d;
}

static void *poisoned(size_t n, fsdp_dtype t) {
    float *nan = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    void *d = upload(nan, n, t);
    free(nan);
    return d;
}

static float *download(const void *d, size_t n, fsdp_dtype t) { return test_to_host(gpu, d, n, t); }

static float *copy(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double tolerance(void) { return ACT == FSDP_BF16 ? 2e-2 : 1e-4; }

static void compare(const char *what, const float *ref, const void *dev, size_t n, fsdp_dtype t, double tol) {
    float *got = download(dev, n, t);
    double num = 0, den = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) && isfinite(ref[i])) nan = 1;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    double err = sqrt(num / (den > 0 ? den : 1e-30));
    check_that(!nan && err <= tol, "%-46s %s rel err %.2e (tol %.0e)%s", what, ACT == FSDP_BF16 ? "bf16" : "fp32", err,
               tol, nan ? " NaN" : "");
    free(got);
}

/* ---- ops ---- */

static void test_matmul(int N, int C, int OC, int with_bias, int with_residual, int relu) {
    char name[96];
    float *x = randn((size_t)N * C, 1.0f), *w = randn((size_t)OC * C, 0.05f), *b = randn(OC, 0.1f);
    float *r = randn((size_t)N * OC, 1.0f);
    float *out = malloc((size_t)N * OC * 4);
    cpu->ops->matmul_forward(cpu, out, x, w, with_bias ? b : NULL, with_residual ? r : NULL, N, C, OC, relu);
    void *dx = upload(x, (size_t)N * C, ACT), *dw = upload(w, (size_t)OC * C, ACT), *db = upload(b, OC, ACT);
    void *dr = upload(r, (size_t)N * OC, ACT), *dout = poisoned((size_t)N * OC, ACT);
    gpu->ops->matmul_forward(gpu, dout, dx, dw, with_bias ? db : NULL, with_residual ? dr : NULL, N, C, OC, relu);
    snprintf(name, sizeof name, "matmul fwd %dx%dx%d%s%s%s", N, C, OC, with_bias ? " bias" : "",
             with_residual ? " residual" : "", relu ? " relu" : "");
    compare(name, out, dout, (size_t)N * OC, ACT, tolerance());

    /* backward: dinp overwritten, dW and dbias accumulated onto random values */
    float *dy = randn((size_t)N * OC, 1.0f), *dw0 = randn((size_t)OC * C, 1.0f), *db0 = randn(OC, 1.0f);
    if (GRAD == FSDP_BF16)
        for (size_t i = 0; i < (size_t)OC * C; i++) dw0[i] = fsdp_round_bf16(dw0[i]);
    float *dinp = malloc((size_t)N * C * 4), *dwc = copy(dw0, (size_t)OC * C), *dbc = copy(db0, OC);
    cpu->ops->matmul_backward(cpu, dinp, dwc, with_bias ? dbc : NULL, dy, x, w, N, C, OC);
    void *ddy = upload(dy, (size_t)N * OC, ACT), *ddinp = poisoned((size_t)N * C, ACT);
    void *ddw = upload(dw0, (size_t)OC * C, GRAD), *ddb = upload(db0, OC, GRAD);
    gpu->ops->matmul_backward(gpu, ddinp, ddw, with_bias ? ddb : NULL, ddy, dx, dw, N, C, OC);
    snprintf(name, sizeof name, "matmul bwd dinp %dx%dx%d", N, C, OC);
    compare(name, dinp, ddinp, (size_t)N * C, ACT, tolerance());
    snprintf(name, sizeof name, "matmul bwd dweight (+=) %dx%dx%d", N, C, OC);
    compare(name, dwc, ddw, (size_t)OC * C, GRAD, tolerance());
    if (with_bias) {
        snprintf(name, sizeof name, "matmul bwd dbias (+=) %dx%d", N, OC);
        compare(name, dbc, ddb, OC, GRAD, tolerance());
    }
    free(x), free(w), free(b), free(r), free(out), free(dy), free(dw0), free(db0), free(dinp), free(dwc), free(dbc);
    void *ptrs[] = {dx, dw, db, dr, dout, ddy, ddinp, ddw, ddb};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) gpu->runtime->free(gpu, ptrs[i]);
}

static void test_norm(int llama, int N, int C) {
    char name[96];
    const char *kind = llama ? "rmsnorm" : "layernorm";
    float *x = randn((size_t)N * C, 1.0f), *w = randn(C, 0.5f), *b = randn(C, 0.2f);
    for (int i = 0; i < C; i++) w[i] += 1.0f;
    float *out = malloc((size_t)N * C * 4), *mean = malloc((size_t)N * 4), *rstd = malloc((size_t)N * 4);
    void *dx = upload(x, (size_t)N * C, ACT), *dw = upload(w, C, ACT), *db = upload(b, C, ACT);
    void *dout = poisoned((size_t)N * C, ACT), *dmean = poisoned(N, FSDP_F32), *drstd = poisoned(N, FSDP_F32);
    if (llama) {
        cpu->ops->rmsnorm_forward(cpu, out, rstd, x, w, N, C, 1e-5f, NULL);
        gpu->ops->rmsnorm_forward(gpu, dout, drstd, dx, dw, N, C, 1e-5f, NULL);
    } else {
        cpu->ops->layernorm_forward(cpu, out, mean, rstd, x, w, b, N, C, 1e-5f, NULL);
        gpu->ops->layernorm_forward(gpu, dout, dmean, drstd, dx, dw, db, N, C, 1e-5f, NULL);
    }
    snprintf(name, sizeof name, "%s fwd %dx%d", kind, N, C);
    compare(name, out, dout, (size_t)N * C, ACT, tolerance());
    snprintf(name, sizeof name, "%s fwd rstd", kind);
    compare(name, rstd, drstd, N, FSDP_F32, ACT == FSDP_BF16 ? 1e-3 : 1e-5);

    float *dy = randn((size_t)N * C, 1.0f), *dx0 = randn((size_t)N * C, 1.0f), *dw0 = randn(C, 1.0f),
          *db0 = randn(C, 1.0f);
    float *dxc = copy(dx0, (size_t)N * C), *dwc = copy(dw0, C), *dbc = copy(db0, C);
    void *ddy = upload(dy, (size_t)N * C, ACT), *ddx = upload(dx0, (size_t)N * C, ACT);
    void *ddw = upload(dw0, C, GRAD), *ddb = upload(db0, C, GRAD);
    /* Both sides use the GPU's saved statistics' CPU twins: recompute on the CPU from its own. */
    if (llama) {
        cpu->ops->rmsnorm_backward(cpu, dxc, dwc, dy, x, w, rstd, N, C, NULL);
        gpu->ops->rmsnorm_backward(gpu, ddx, ddw, ddy, dx, dw, drstd, N, C, NULL);
    } else {
        cpu->ops->layernorm_backward(cpu, dxc, dwc, dbc, dy, x, w, mean, rstd, N, C, NULL);
        gpu->ops->layernorm_backward(gpu, ddx, ddw, ddb, ddy, dx, dw, dmean, drstd, N, C, NULL);
    }
    snprintf(name, sizeof name, "%s bwd dinp (+=)", kind);
    compare(name, dxc, ddx, (size_t)N * C, ACT, tolerance());
    snprintf(name, sizeof name, "%s bwd dweight (+=)", kind);
    compare(name, dwc, ddw, C, GRAD, tolerance());
    if (!llama) compare("layernorm bwd dbias (+=)", dbc, ddb, C, GRAD, tolerance());
    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dy), free(dx0), free(dw0), free(db0);
    free(dxc), free(dwc), free(dbc);
    void *ptrs[] = {dx, dw, db, dout, dmean, drstd, ddy, ddx, ddw, ddb};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) gpu->runtime->free(gpu, ptrs[i]);
}

/* p > 0 drops the probabilities (attention_forward / _backward with a dropout descriptor) on both
 * backends; p = 0 passes no descriptor. window > 0: Mistral's sliding window. */
static void test_attention_pair(fsdp_attn mode, fsdp_attn bwd_mode, int B, int T, int Hq, int Hkv, int D, double p,
                                int window) {
    char name[128], m[48];
    if (bwd_mode == mode) snprintf(m, sizeof m, "%s", fsdp_attn_name(mode));
    else snprintf(m, sizeof m, "%s+%s", fsdp_attn_name(mode), fsdp_attn_name(bwd_mode));
    const fsdp_dropout drop = fsdp_dropout_make(p, 4321, 777, 3, FSDP_DROPOUT_ATTN_PROBS);
    size_t W = (size_t)(Hq + 2 * Hkv) * D, nq = (size_t)B * T * W, no = (size_t)B * T * Hq * D;
    size_t nl = (size_t)B * Hq * T, np = (size_t)B * Hq * T * T;
    float *qkv = randn(nq, 1.0f), *out = malloc(no * 4), *lse = malloc(nl * 4), *probs = malloc(np * 4);
    void *cprobs = mode == FSDP_ATTN_EAGER ? probs : NULL;
    void *dqkvin = upload(qkv, nq, ACT), *dout = poisoned(no, ACT), *dlse = poisoned(nl, FSDP_F32);
    void *dprobs = mode == FSDP_ATTN_EAGER ? poisoned(np, ACT) : NULL;
    const fsdp_dropout *dr = p > 0 ? &drop : NULL;
    cpu->ops->attention_forward(cpu, mode, out, lse, cprobs, qkv, B, T, Hq, Hkv, D, window, dr);
    gpu->ops->attention_forward(gpu, mode, dout, dlse, dprobs, dqkvin, B, T, Hq, Hkv, D, window, dr);
    snprintf(name, sizeof name, "attention %s fwd B%d T%d H%d/%d D%d p%.1f W%d", m, B, T, Hq, Hkv, D, p, window);
    compare(name, out, dout, no, ACT, tolerance());
    snprintf(name, sizeof name, "attention %s fwd lse", m);
    compare(name, lse, dlse, nl, FSDP_F32, ACT == FSDP_BF16 ? 2e-3 : 1e-5);

    float *dy = randn(no, 1.0f), *dq = malloc(nq * 4);
    /* The backward reads the forward's output; give both sides their own. */
    void *ddy = upload(dy, no, ACT), *ddq = poisoned(nq, ACT);
    cpu->ops->attention_backward(cpu, mode, dq, dy, qkv, out, lse, cprobs, B, T, Hq, Hkv, D, window, dr);
    gpu->ops->attention_backward(gpu, bwd_mode, ddq, ddy, dqkvin, dout, dlse, dprobs, B, T, Hq, Hkv, D, window, dr);
    snprintf(name, sizeof name, "attention %s bwd dqkv B%d T%d H%d/%d D%d p%.1f W%d", m, B, T, Hq, Hkv, D, p, window);
    compare(name, dq, ddq, nq, ACT, ACT == FSDP_BF16 ? 3e-2 : 1e-4);
    free(qkv), free(out), free(lse), free(probs), free(dy), free(dq);
    gpu->runtime->free(gpu, dqkvin), gpu->runtime->free(gpu, dout), gpu->runtime->free(gpu, dlse);
    gpu->runtime->free(gpu, ddy), gpu->runtime->free(gpu, ddq);
    if (dprobs) gpu->runtime->free(gpu, dprobs);
}

static void test_attention(fsdp_attn mode, int B, int T, int Hq, int Hkv, int D, double p, int window) {
    test_attention_pair(mode, mode, B, T, Hq, Hkv, D, p, window);
}

#if FSDP_HAVE_CUDNN
/* --attn cudnn against the CPU's exact attention (bf16 only, no dropout or window), alone and
 * following the flash forward (the two keep the same log-sum-exp rows); and its scratch as
 * sizes.c plans it. cuDNN 9.15 and older run the backward only at T a multiple of 128. */
static void test_cudnn_attention(void) {
    char why[320];
    const fsdp_cudnn_api *api = fsdp_cudnn_load(why, sizeof why);
    if (!check_that(api != NULL, "--attn cudnn: libcudnn loads (%s)", api ? "yes" : why)) return;
    const size_t v = api->get_version();
    printf("cuDNN %zu\n", v);
    const int cases[][5] = {{2, 37, 6, 2, 8}, {1, 200, 4, 4, 64}, {2, 256, 32, 8, 64},
                            {1, 128, 4, 1, 128}, {2, 384, 8, 8, 128}, {1, 1024, 4, 2, 128}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *c = cases[i];
        if (v <= 91500 && c[1] % 128 != 0) continue;
        test_attention(FSDP_ATTN_CUDNN, c[0], c[1], c[2], c[3], c[4], 0.0, 0);
        const size_t planned = fsdp_cudnn_attention_scratch(c[0], c[1], c[2], c[3], c[4]);
        const size_t used = fsdp_cuda_cudnn_attention_workspace(gpu, c[0], c[1], c[2], c[3], c[4]);
        check_that(planned == used, "cudnn scratch B%d T%d H%d/%d D%d: planned %zu, used %zu", c[0], c[1], c[2], c[3],
                   c[4], planned, used);
    }
    test_attention_pair(FSDP_ATTN_FLASH, FSDP_ATTN_CUDNN, 2, 256, 32, 8, 64, 0.0, 0);
    test_attention_pair(FSDP_ATTN_CUDNN, FSDP_ATTN_FLASH, 1, 128, 4, 1, 128, 0.0, 0);
}
#endif

/* Qwen3's per-head q/k RMSNorm: forward (out, rstd), backward (dinp overwritten, in place as the
 * model runs it; the weights' gradients accumulated). */
static void test_qk_norm(int N, int Hq, int Hkv, int D) {
    char name[96];
    const size_t n = (size_t)N * (Hq + 2 * Hkv) * D, nr = (size_t)N * (Hq + Hkv);
    float *x = randn(n, 1.5f), *wq = randn(D, 0.3f), *wk = randn(D, 0.3f);
    for (int i = 0; i < D; i++) wq[i] += 1.0f, wk[i] += 1.0f;
    float *out = malloc(n * 4), *rstd = malloc(nr * 4);
    void *dx = upload(x, n, ACT), *dwq = upload(wq, D, ACT), *dwk = upload(wk, D, ACT);
    void *dout = poisoned(n, ACT), *drstd = poisoned(nr, FSDP_F32);
    cpu->ops->qk_norm_forward(cpu, out, rstd, x, wq, wk, N, Hq, Hkv, D, 1e-6f);
    gpu->ops->qk_norm_forward(gpu, dout, drstd, dx, dwq, dwk, N, Hq, Hkv, D, 1e-6f);
    snprintf(name, sizeof name, "qk_norm fwd N%d H%d/%d D%d", N, Hq, Hkv, D);
    compare(name, out, dout, n, ACT, tolerance());
    compare("qk_norm fwd rstd", rstd, drstd, nr, FSDP_F32, ACT == FSDP_BF16 ? 1e-3 : 1e-5);
    float *dy = randn(n, 1.0f), *gq0 = randn(D, 1.0f), *gk0 = randn(D, 1.0f);
    float *dxc = malloc(n * 4), *gqc = copy(gq0, D), *gkc = copy(gk0, D);
    void *ddy = upload(dy, n, ACT), *dgq = upload(gq0, D, GRAD), *dgk = upload(gk0, D, GRAD);
    cpu->ops->qk_norm_backward(cpu, dxc, gqc, gkc, dy, x, wq, wk, rstd, N, Hq, Hkv, D);
    gpu->ops->qk_norm_backward(gpu, ddy, dgq, dgk, ddy, dx, dwq, dwk, drstd, N, Hq, Hkv, D); /* in place */
    snprintf(name, sizeof name, "qk_norm bwd dinp (in place) N%d H%d/%d D%d", N, Hq, Hkv, D);
    compare(name, dxc, ddy, n, ACT, tolerance());
    compare("qk_norm bwd d q_norm (+=)", gqc, dgq, D, GRAD, tolerance());
    compare("qk_norm bwd d k_norm (+=)", gkc, dgk, D, GRAD, tolerance());
    free(x), free(wq), free(wk), free(out), free(rstd), free(dy), free(gq0), free(gk0), free(dxc), free(gqc), free(gkc);
    void *ptrs[] = {dx, dwq, dwk, dout, drstd, ddy, dgq, dgk};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) gpu->runtime->free(gpu, ptrs[i]);
}

/* The residual-dropout ops of the table: stand-alone forward and backward, and the norms with the
 * dropout fused (res_out, out and statistics; dinp, dweight, dbias and dx). */
static void test_dropout_ops(int llama, int B, int T, int C, double p) {
    char name[96];
    const char *kind = llama ? "rmsnorm" : "layernorm";
    const int N = B * T;
    const size_t n = (size_t)N * C;
    const fsdp_dropout drop = fsdp_dropout_make(p, 99, 12345, 4, FSDP_DROPOUT_ATTN_OUT);
    float *res = randn(n, 1.0f), *x = randn(n, 1.0f), *w = randn(C, 0.5f), *b = randn(C, 0.2f);
    for (int i = 0; i < C; i++) w[i] = ACT == FSDP_BF16 ? fsdp_round_bf16(w[i] + 1.0f) : w[i] + 1.0f;
    float *ro = malloc(n * 4), *out = malloc(n * 4), *mean = malloc((size_t)N * 4), *rstd = malloc((size_t)N * 4);
    void *dres = upload(res, n, ACT), *dx = upload(x, n, ACT), *dw = upload(w, C, ACT), *db = upload(b, C, ACT);
    void *dro = poisoned(n, ACT), *dout = poisoned(n, ACT), *dmean = poisoned(N, FSDP_F32);
    void *drstd = poisoned(N, FSDP_F32);
    cpu->ops->residual_dropout_forward(cpu, ro, res, x, N, T, C, &drop);
    gpu->ops->residual_dropout_forward(gpu, dro, dres, dx, N, T, C, &drop);
    snprintf(name, sizeof name, "residual_dropout fwd %dx%d p%.1f", N, C, p);
    compare(name, ro, dro, n, ACT, tolerance());
    cpu->ops->dropout_backward(cpu, out, x, N, T, C, &drop);
    gpu->ops->dropout_backward(gpu, dout, dx, N, T, C, &drop);
    snprintf(name, sizeof name, "dropout bwd %dx%d p%.1f", N, C, p);
    compare(name, out, dout, n, ACT, tolerance());

    if (llama) {
        cpu->ops->rmsnorm_dropout_forward(cpu, ro, out, rstd, res, x, w, N, T, C, 1e-5f, &drop, NULL);
        gpu->ops->rmsnorm_dropout_forward(gpu, dro, dout, drstd, dres, dx, dw, N, T, C, 1e-5f, &drop, NULL);
    } else {
        cpu->ops->layernorm_dropout_forward(cpu, ro, out, mean, rstd, res, x, w, b, N, T, C, 1e-5f, &drop, NULL);
        gpu->ops->layernorm_dropout_forward(gpu, dro, dout, dmean, drstd, dres, dx, dw, db, N, T, C, 1e-5f, &drop, NULL);
    }
    snprintf(name, sizeof name, "%s_dropout fwd res_out %dx%d p%.1f", kind, N, C, p);
    compare(name, ro, dro, n, ACT, tolerance());
    snprintf(name, sizeof name, "%s_dropout fwd out", kind);
    compare(name, out, dout, n, ACT, tolerance());
    snprintf(name, sizeof name, "%s_dropout fwd rstd", kind);
    compare(name, rstd, drstd, N, FSDP_F32, ACT == FSDP_BF16 ? 1e-3 : 1e-5);

    float *dy = randn(n, 1.0f), *dinp0 = randn(n, 1.0f), *dw0 = randn(C, 1.0f), *db0 = randn(C, 1.0f);
    float *dinp = copy(dinp0, n), *dwc = copy(dw0, C), *dbc = copy(db0, C), *dxc = malloc(n * 4);
    void *ddy = upload(dy, n, ACT), *ddinp = upload(dinp0, n, ACT), *ddw = upload(dw0, C, GRAD);
    void *ddb = upload(db0, C, GRAD), *ddx = poisoned(n, ACT);
    if (llama) {
        cpu->ops->rmsnorm_dropout_backward(cpu, dinp, dxc, dwc, dy, ro, w, rstd, N, T, C, &drop, NULL);
        gpu->ops->rmsnorm_dropout_backward(gpu, ddinp, ddx, ddw, ddy, dro, dw, drstd, N, T, C, &drop, NULL);
    } else {
        cpu->ops->layernorm_dropout_backward(cpu, dinp, dxc, dwc, dbc, dy, ro, w, mean, rstd, N, T, C, &drop, NULL);
        gpu->ops->layernorm_dropout_backward(gpu, ddinp, ddx, ddw, ddb, ddy, dro, dw, dmean, drstd, N, T, C, &drop, NULL);
    }
    snprintf(name, sizeof name, "%s_dropout bwd dinp (+=)", kind);
    compare(name, dinp, ddinp, n, ACT, tolerance());
    snprintf(name, sizeof name, "%s_dropout bwd dx", kind);
    compare(name, dxc, ddx, n, ACT, tolerance());
    snprintf(name, sizeof name, "%s_dropout bwd dweight (+=)", kind);
    compare(name, dwc, ddw, C, GRAD, tolerance());
    if (!llama) compare("layernorm_dropout bwd dbias (+=)", dbc, ddb, C, GRAD, tolerance());
    free(res), free(x), free(w), free(b), free(ro), free(out), free(mean), free(rstd), free(dy), free(dinp0);
    free(dw0), free(db0), free(dinp), free(dwc), free(dbc), free(dxc);
    void *ptrs[] = {dres, dx, dw, db, dro, dout, dmean, drstd, ddy, ddinp, ddw, ddb, ddx};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) gpu->runtime->free(gpu, ptrs[i]);
}

static void test_pointwise(int N, int C, int F, int T, int Hq, int Hkv, int D, int V) {
    char name[96];
    int B = N / T;
    /* embedding */
    int32_t *tok = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)fsdp_rand_below(5, draw, (uint64_t)i, (uint32_t)(i % 3 ? V : 7));
    float *wte = randn((size_t)V * C, 1.0f), *wpe = randn((size_t)(T + 2) * C, 1.0f), *out = malloc((size_t)N * C * 4);
    void *dtok = gpu->runtime->alloc(gpu, (size_t)N * 4, "tokens");
    gpu->runtime->copy_h2d(gpu, dtok, tok, (size_t)N * 4, gpu->compute);
    void *dwte = upload(wte, (size_t)V * C, ACT), *dwpe = upload(wpe, (size_t)(T + 2) * C, ACT);
    void *dout = poisoned((size_t)N * C, ACT);
    cpu->ops->embedding_forward(cpu, out, tok, wte, wpe, 2, N, T, C);
    gpu->ops->embedding_forward(gpu, dout, dtok, dwte, dwpe, 2, N, T, C);
    compare("embedding fwd (positions +2)", out, dout, (size_t)N * C, ACT, tolerance());
    float *dy = randn((size_t)N * C, 1.0f), *g0 = randn((size_t)V * C, 1.0f), *p0 = randn((size_t)(T + 2) * C, 1.0f);
    float *gc = copy(g0, (size_t)V * C), *pc = copy(p0, (size_t)(T + 2) * C);
    /* The first token is the padding_idx: its row gets no gradient from the inputs. */
    cpu->ops->embedding_backward(cpu, gc, pc, dy, tok, tok[0], 2, N, T, C);
    void *ddy = upload(dy, (size_t)N * C, ACT), *dg = upload(g0, (size_t)V * C, GRAD);
    void *dp = upload(p0, (size_t)(T + 2) * C, GRAD);
    gpu->ops->embedding_backward(gpu, dg, dp, ddy, dtok, tok[0], 2, N, T, C);
    compare("embedding bwd dwte (+=, repeated tokens, padding_idx)", gc, dg, (size_t)V * C, GRAD, tolerance());
    compare("embedding bwd dwpe (+=)", pc, dp, (size_t)(T + 2) * C, GRAD, tolerance());

    /* swiglu */
    float *gu = randn((size_t)N * 2 * F, 2.0f), *sw = malloc((size_t)N * F * 4);
    void *dgu = upload(gu, (size_t)N * 2 * F, ACT), *dsw = poisoned((size_t)N * F, ACT);
    cpu->ops->swiglu_forward(cpu, sw, gu, N, F, NULL);
    gpu->ops->swiglu_forward(gpu, dsw, dgu, N, F, NULL);
    compare("swiglu fwd", sw, dsw, (size_t)N * F, ACT, tolerance());
    float *dsy = randn((size_t)N * F, 1.0f), *dgc = malloc((size_t)N * 2 * F * 4);
    void *ddsy = upload(dsy, (size_t)N * F, ACT), *ddg = poisoned((size_t)N * 2 * F, ACT);
    cpu->ops->swiglu_backward(cpu, dgc, dsy, gu, N, F, NULL);
    gpu->ops->swiglu_backward(gpu, ddg, ddsy, dgu, N, F, NULL);
    compare("swiglu bwd", dgc, ddg, (size_t)N * 2 * F, ACT, tolerance());

    /* relu backward (out has exact zeros, as a relu output would) */
    float *ro = randn((size_t)N * F, 1.0f), *rd = randn((size_t)N * F, 1.0f);
    for (size_t i = 0; i < (size_t)N * F; i++) ro[i] = ro[i] > 0 ? ro[i] : 0.0f;
    void *dro = upload(ro, (size_t)N * F, ACT), *drd = upload(rd, (size_t)N * F, ACT);
    cpu->ops->relu_backward(cpu, rd, ro, (size_t)N * F);
    gpu->ops->relu_backward(gpu, drd, dro, (size_t)N * F);
    compare("relu bwd", rd, drd, (size_t)N * F, ACT, tolerance());

    /* rope */
    size_t nq = (size_t)N * (Hq + 2 * Hkv) * D;
    float *cs = malloc((size_t)T * D * 4);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D / 2; i++) {
            double a = t * pow(500000.0, -2.0 * i / D);
            cs[((size_t)t * (D / 2) + i) * 2] = (float)cos(a), cs[((size_t)t * (D / 2) + i) * 2 + 1] = (float)sin(a);
        }
    void *dcs = gpu->runtime->alloc(gpu, (size_t)T * D * 4, "rope table");
    gpu->runtime->copy_h2d(gpu, dcs, cs, (size_t)T * D * 4, gpu->compute);
    float *q = randn(nq, 1.0f);
    void *dq = upload(q, nq, ACT);
    cpu->ops->rope_forward(cpu, q, cs, B, T, Hq, Hkv, D);
    gpu->ops->rope_forward(gpu, dq, dcs, B, T, Hq, Hkv, D);
    compare("rope fwd (in place, v untouched)", q, dq, nq, ACT, tolerance());
    cpu->ops->rope_backward(cpu, q, cs, B, T, Hq, Hkv, D, NULL);
    gpu->ops->rope_backward(gpu, dq, dcs, B, T, Hq, Hkv, D, NULL);
    compare("rope bwd", q, dq, nq, ACT, tolerance());

    /* cross-entropy with an ignored row */
    int n = N < 64 ? N : 64;
    float *lg = randn((size_t)n * V, 3.0f), *loss = malloc((size_t)n * 4);
    int32_t *tg = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) tg[i] = i == 1 ? -1 : (int32_t)fsdp_rand_below(6, draw, (uint64_t)i, (uint32_t)V);
    void *dlg = upload(lg, (size_t)n * V, ACT), *dloss = poisoned(n, FSDP_F32);
    void *dtg = gpu->runtime->alloc(gpu, (size_t)n * 4, "targets");
    gpu->runtime->copy_h2d(gpu, dtg, tg, (size_t)n * 4, gpu->compute);
    cpu->ops->cross_entropy(cpu, loss, lg, tg, n, V, 0.37f);
    gpu->ops->cross_entropy(gpu, dloss, dlg, dtg, n, V, 0.37f);
    snprintf(name, sizeof name, "cross-entropy losses V%d", V);
    compare(name, loss, dloss, n, FSDP_F32, ACT == FSDP_BF16 ? 1e-3 : 1e-5);
    compare("cross-entropy dlogits (in place)", lg, dlg, (size_t)n * V, ACT, tolerance());

    free(tok), free(wte), free(wpe), free(out), free(dy), free(g0), free(p0), free(gc), free(pc), free(gu), free(sw);
    free(dsy), free(dgc), free(ro), free(rd), free(cs), free(q), free(lg), free(loss), free(tg);
    void *ptrs[] = {dtok, dwte, dwpe, dout, ddy, dg, dp, dgu, dsw, ddsy, ddg, dro, drd, dcs, dq, dlg, dloss, dtg};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) gpu->runtime->free(gpu, ptrs[i]);
}

static void test_optimizer(size_t n) {
    fsdp_dtype master = FSDP_F32;
    float *p = randn(n, 0.1f), *g = randn(n, 0.01f), *m = randn(n, 0.001f), *v = randn(n, 0.001f);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *pc = copy(p, n), *mc = copy(m, n), *vc = copy(v, n), *work = malloc(n * 4);
    fsdp_adamw_args a = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
    float scale = 0.5f;
    cpu->ops->adamw(cpu, pc, g, mc, vc, master, n, &a, &scale, work, ACT, cpu->compute);
    void *dp = upload(p, n, master), *dg = upload(g, n, master), *dm = upload(m, n, master), *dv = upload(v, n, master);
    void *dwk = poisoned(n, ACT);
    float *dscale = gpu->runtime->alloc(gpu, 4, "scale");
    gpu->runtime->copy_h2d(gpu, dscale, &scale, 4, gpu->compute);
    gpu->ops->adamw(gpu, dp, dg, dm, dv, master, n, &a, dscale, dwk, ACT, gpu->compute);
    compare("adamw param", pc, dp, n, master, 1e-6);
    compare("adamw exp_avg", mc, dm, n, master, 1e-6);
    compare("adamw exp_avg_sq", vc, dv, n, master, 1e-6);
    compare("adamw working copy", work, dwk, n, ACT, ACT == FSDP_BF16 ? 5e-3 : 1e-6);

    /* sums, clip scale, cast, accumulate */
    float *sumsq = calloc(2, 4), *dsum = gpu->runtime->alloc(gpu, 8, "sums");
    gpu->runtime->zero(gpu, dsum, 8, gpu->compute);
    cpu->ops->sum_squares(cpu, &sumsq[0], g, FSDP_F32, n, cpu->compute);
    cpu->ops->sum(cpu, &sumsq[1], g, n, cpu->compute);
    gpu->ops->sum_squares(gpu, dsum, dg, FSDP_F32, n, gpu->compute);
    gpu->ops->sum(gpu, dsum + 1, dg, n, gpu->compute);
    compare("sum of squares", &sumsq[0], dsum, 1, FSDP_F32, 1e-5);
    compare("sum", &sumsq[1], dsum + 1, 1, FSDP_F32, 1e-4);
    float clip_c, *dclip = gpu->runtime->alloc(gpu, 4, "clip");
    cpu->ops->clip_scale(cpu, &clip_c, &sumsq[0], 0.01f, cpu->compute);
    gpu->ops->clip_scale(gpu, dclip, dsum, 0.01f, gpu->compute);
    compare("clip scale", &clip_c, dclip, 1, FSDP_F32, 1e-5);
    void *dc = poisoned(n, FSDP_BF16);
    float *rounded = copy(g, n);
    for (size_t i = 0; i < n; i++) rounded[i] = fsdp_round_bf16(rounded[i]);
    gpu->ops->cast(gpu, dc, FSDP_BF16, dg, FSDP_F32, n, gpu->compute);
    compare("cast fp32 -> bf16", rounded, dc, n, FSDP_BF16, 1e-7);
    for (size_t i = 0; i < n; i++) rounded[i] += p[i];
    void *dacc = upload(p, n, FSDP_F32);
    gpu->ops->accumulate(gpu, dacc, FSDP_F32, dc, FSDP_BF16, n, gpu->compute);
    compare("accumulate bf16 into fp32", rounded, dacc, n, FSDP_F32, 1e-6);
    free(p), free(g), free(m), free(v), free(pc), free(mc), free(vc), free(work), free(sumsq), free(rounded);
    void *ptrs[] = {dp, dg, dm, dv, dwk, dscale, dsum, dclip, dc, dacc};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) gpu->runtime->free(gpu, ptrs[i]);
}

static void run_mode(fsdp_dtype act, fsdp_dtype grad) {
    fsdp_err err = {0};
    ACT = act, GRAD = grad;
    fsdp_backend_options co = {.kind = "cpu", .act_dtype = FSDP_F32, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend_options go = {.kind = "cuda", .act_dtype = act, .grad_dtype = grad, .local_size = 1};
    cpu = fsdp_backend_create(&co, &err);
    gpu = fsdp_backend_create(&go, &err);
    if (!cpu || !gpu) {
        printf("backend creation failed: %s\n", err.msg);
        exit(1);
    }
    printf("mode: %s activations, %s gradients on %s\n", fsdp_dtype_name(act), fsdp_dtype_name(grad), gpu->device_name);
    test_pointwise(2 * 37, 40, 72, 37, 6, 2, 8, 1031);
    test_pointwise(4 * 256, 2048, 8192, 256, 32, 8, 64, 32000);
    test_norm(1, 37, 40), test_norm(0, 37, 40), test_norm(1, 2048, 2048), test_norm(0, 1024, 2048);
    test_matmul(37, 40, 24, 0, 0, 0), test_matmul(37, 40, 72, 1, 0, 1), test_matmul(37, 72, 40, 1, 1, 0);
    test_matmul(512, 2048, 3072, 0, 0, 0), test_matmul(512, 8192, 2048, 0, 1, 0), test_matmul(256, 2048, 8192, 1, 0, 1);
    for (int mode = 0; mode < 2; mode++) {
        test_attention((fsdp_attn)mode, 2, 37, 6, 2, 8, 0.0, 0);
        test_attention((fsdp_attn)mode, 1, 200, 4, 4, 64, 0.0, 0);
        test_attention((fsdp_attn)mode, 2, 256, 32, 8, 64, 0.0, 0);
        test_attention((fsdp_attn)mode, 1, 128, 4, 1, 128, 0.0, 0);
        test_attention((fsdp_attn)mode, 2, 37, 6, 2, 8, 0.1, 0);
        test_attention((fsdp_attn)mode, 2, 256, 32, 8, 64, 0.1, 0);
        test_attention((fsdp_attn)mode, 1, 128, 4, 1, 128, 0.5, 0);
        test_attention((fsdp_attn)mode, 2, 37, 6, 2, 8, 0.0, 5); /* sliding windows */
        test_attention((fsdp_attn)mode, 2, 200, 4, 2, 64, 0.0, 17);
        test_attention((fsdp_attn)mode, 1, 128, 4, 1, 128, 0.1, 40);
    }
#if FSDP_HAVE_CUDNN
    if (act == FSDP_BF16) test_cudnn_attention();
#endif
    test_qk_norm(37, 4, 2, 12), test_qk_norm(512, 16, 8, 128), test_qk_norm(300, 6, 3, 64);
    test_dropout_ops(1, 2, 37, 40, 0.1), test_dropout_ops(0, 2, 37, 40, 0.1);
    test_dropout_ops(1, 4, 256, 2048, 0.1), test_dropout_ops(0, 4, 256, 2048, 0.1);
    test_optimizer(1000003);
    gpu->runtime->destroy(gpu);
    cpu->runtime->destroy(cpu);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (!fsdp_backend_cuda_available()) {
        printf("test_gpu_backend: SKIPPED (no GPU)\n");
        MPI_Finalize();
        return 77;
    }
    run_mode(FSDP_F32, FSDP_F32);
    run_mode(FSDP_BF16, FSDP_F32);
    run_mode(FSDP_BF16, FSDP_BF16);
    int status = check_summary("test_gpu_backend");
    MPI_Finalize();
    return status;
}
