/* The CPU attention check shared by test_ops_grad.c (no dropout) and test_dropout_ops.c (dropout on
 * the probabilities): causal GQA attention in double as the reference, L = sum(out * R) as the loss,
 * and the check of both backward paths (stored probabilities and recomputed ones) against it and
 * against each other. Header-only, after grad_check.h. */
#ifndef FSDP_TESTS_UNIT_ATTENTION_RIG_H
#define FSDP_TESTS_UNIT_ATTENTION_RIG_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/dropout.h"
#include "kernels/ops_cpu.h"

#include "grad_check.h"

typedef struct {
    int B, T, Hq, Hkv, D, eager; /* eager: keep probs */
    int window;                  /* sliding window (0: none): query t sees keys t - window < j <= t */
    const fsdp_dropout *drop;    /* NULL: no dropout */
    float *qkv, *out, *lse, *probs, *R;
} attn_ctx;

static size_t attn_qkv_numel(const attn_ctx *c) { return (size_t)c->B * c->T * (c->Hq + 2 * c->Hkv) * c->D; }
static size_t attn_out_numel(const attn_ctx *c) { return (size_t)c->B * c->T * c->Hq * c->D; }

static double attn_loss(void *p) {
    attn_ctx *c = p;
    cpu_attention_forward_window(c->out, c->lse, c->eager ? c->probs : NULL, c->qkv, c->B, c->T, c->Hq, c->Hkv, c->D,
                                 c->window, c->drop);
    return dot_d(c->out, c->R, attn_out_numel(c));
}

/* Whether query t sees key j: causal, and within the window when there is one. */
static int attn_visible(const attn_ctx *c, int t, int j) { return j <= t && (!c->window || j > t - c->window); }

/* The textbook O(T^2) causal GQA attention in double (masked to the window when there is one), the
 * dropout mask (if any) applied to the normalised probabilities; probs and lse are those of the
 * undropped softmax. */
static void attn_reference(const attn_ctx *c, double *out, double *lse, double *probs) {
    int W = (c->Hq + 2 * c->Hkv) * c->D, grp = c->Hq / c->Hkv, T = c->T, D = c->D;
    double keep_scale = c->drop ? 1.0 - (double)c->drop->p : 1.0; /* a division by 1.0 is exact */
    double *s = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->Hq; h++)
            for (int t = 0; t < T; t++) {
                const float *q = c->qkv + (size_t)(b * T + t) * W + h * D;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    if (!attn_visible(c, t, j)) continue;
                    const float *k = c->qkv + (size_t)(b * T + j) * W + (c->Hq + h / grp) * D;
                    s[j] = 0.0;
                    for (int i = 0; i < D; i++) s[j] += (double)q[i] * k[i];
                    s[j] /= sqrt((double)D);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++)
                    if (attn_visible(c, t, j)) sum += exp(s[j] - mx);
                size_t row = ((size_t)b * c->Hq + h) * T + t;
                lse[row] = mx + log(sum);
                double *o = out + (size_t)(b * T + t) * c->Hq * D + h * D;
                for (int i = 0; i < D; i++) o[i] = 0.0;
                for (int j = 0; j < T; j++) {
                    double pj = attn_visible(c, t, j) ? exp(s[j] - lse[row]) : 0.0;
                    probs[row * T + j] = pj;
                    if (!attn_visible(c, t, j) || (c->drop && !fsdp_dropout_keep_probs(c->drop, b, h, t, j, T))) continue;
                    const float *v = c->qkv + (size_t)(b * T + j) * W + (c->Hq + c->Hkv + h / grp) * D;
                    for (int i = 0; i < D; i++) o[i] += pj * v[i] / keep_scale;
                }
            }
    free(s);
}

/* Draws c's qkv (magnitude 1.5) and R and allocates out, lse and probs; the shape and drop are set. */
static void attn_setup(attn_ctx *c) {
    size_t nl = (size_t)c->B * c->Hq * c->T;
    c->qkv = rand_f(attn_qkv_numel(c), 1.5f);
    c->out = alloc_f(attn_out_numel(c));
    c->lse = alloc_f(nl);
    c->probs = alloc_f(nl * c->T);
    c->R = rand_f(attn_out_numel(c), 1.0f);
}

static void attn_free(attn_ctx *c) { free(c->qkv), free(c->out), free(c->lse), free(c->probs), free(c->R); }

/* For both paths (probs kept, then probs=NULL): the forward against attn_reference (out, lse and,
 * kept, P; every output NaN-poisoned first), the gradient of qkv against finite differences; then
 * the two gradients against each other. `label` begins each line of a path, `summary` the last. */
static void attn_check_paths(attn_ctx *c, const char *label, const char *summary) {
    const int B = c->B, T = c->T, Hq = c->Hq, Hkv = c->Hkv, D = c->D;
    size_t nq = attn_qkv_numel(c), no = attn_out_numel(c), nl = (size_t)B * Hq * T, np_ = nl * T;
    double *rout = malloc(no * sizeof(double)), *rlse = malloc(nl * sizeof(double));
    double *rprobs = malloc(np_ * sizeof(double));
    attn_reference(c, rout, rlse, rprobs);
    float *dq[2];
    for (int eager = 1; eager >= 0; eager--) {
        char what[96], sub[128];
        snprintf(what, sizeof what, "%s B%d T%d Hq%d Hkv%d D%d W%d %s", label, B, T, Hq, Hkv, D, c->window,
                 eager ? "probs" : "probs=NULL");
        c->eager = eager;
        fill_nan(c->out, no);
        fill_nan(c->lse, nl);
        fill_nan(c->probs, np_);
        attn_loss(c);
        compare(what, c->out, rout, no, 1e-6, 1e-5);
        snprintf(sub, sizeof sub, "%s lse%s", what, c->drop ? " (undropped)" : "");
        compare(sub, c->lse, rlse, nl, 1e-6, 1e-6);
        if (eager) {
            snprintf(sub, sizeof sub, "%s P %s", what, c->drop ? "(undropped)" : "(0 above diagonal)");
            compare(sub, c->probs, rprobs, np_, 1e-7, 1e-5);
        }
        dq[eager] = alloc_f(nq);
        fill_nan(dq[eager], nq); /* every part of dqkv must be overwritten */
        cpu_attention_backward_window(dq[eager], c->R, c->qkv, c->out, c->lse, eager ? c->probs : NULL, B, T, Hq, Hkv,
                                      D, c->window, c->drop);
        grad_param p = {"qkv", c->qkv, nq, dq[eager]};
        check_grads(what, attn_loss, c, &p, 1);
    }
    double worst = 0.0;
    for (size_t i = 0; i < nq; i++) worst = fmax(worst, fabs((double)dq[0][i] - dq[1][i]));
    check_that(worst <= 1e-6, "%-40s dqkv stored vs recomputed probs: max diff %.2e", summary, worst);
    free(rout), free(rlse), free(rprobs), free(dq[0]), free(dq[1]);
}

#endif
