/* The next-token choice (src/train/sampling.c) against hand-computed expectations of transformers'
 * rules: greedy is the argmax with the lowest id on ties; temperature divides the logits; top-k keeps
 * the ties of the k-th largest; top-p removes, in ascending order, the tokens whose cumulative
 * probability is at most 1 - p and always keeps the most likely; the warpers run in transformers'
 * order (temperature, top-k, top-p), which two cases prove by giving another set in any other
 * order; draws follow the distribution (frequencies over 40,000 steps) and are a pure function of
 * (seed, step). Top-p is checked on either side of each boundary, not on it (there float rounding
 * decides, in transformers too). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/sampling.h"
#include "check.h"

/* Logits whose softmax is p (p sums to 1). */
static void logits_of(const double *p, int V, float *out) {
    for (int i = 0; i < V; i++) out[i] = (float)log(p[i]);
}

/* The distribution of a configuration equals `want` (renormalised over its non-zero entries) within 1e-6. */
static void expect(const char *what, fsdp_sampling cfg, const float *logits, int V, const double *want) {
    fsdp_sampler *s = fsdp_sampler_create(&cfg, V);
    double got[16], sum = 0.0, worst = 0.0;
    fsdp_sampler_distribution(s, logits, got);
    for (int i = 0; i < V; i++) sum += want[i];
    for (int i = 0; i < V; i++) {
        double d = fabs(got[i] - want[i] / sum);
        if (d > worst || isnan(got[i])) worst = isnan(got[i]) ? INFINITY : d;
    }
    check_that(worst < 1e-6, "%s (largest difference %.1e)", what, worst);
    fsdp_sampler_free(s);
}

int main(void) {
    const fsdp_sampling greedy = {0, 1.0, 0, 1.0, 1}, plain = {1, 1.0, 0, 1.0, 1};

    /* Greedy. */
    float tie[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    fsdp_sampler *g = fsdp_sampler_create(&greedy, 5);
    check_that(fsdp_sampler_next(g, tie, 0) == 1 && fsdp_sampler_next(g, tie, 99) == 1,
               "greedy: argmax, lowest id on ties");
    fsdp_sampler_free(g);
    check_that(fabs(fsdp_logit_margin(tie, 5)) < 1e-12 && fabs(fsdp_logit_margin((float[]){3, 1, 2}, 3) - 1.0) < 1e-12,
               "logit margin: top-1 minus top-2 (0 on a tie)");

    /* Temperature: softmax(logits / T). */
    const double p4[4] = {0.4, 0.3, 0.2, 0.1};
    float l4[4];
    logits_of(p4, 4, l4);
    fsdp_sampling t = plain;
    t.temperature = 0.5;
    const double sq[4] = {0.16, 0.09, 0.04, 0.01};
    expect("temperature 0.5 squares the probabilities", t, l4, 4, sq);
    expect("temperature 1, no top-k or top-p: the softmax", plain, l4, 4, p4);

    /* Top-k, ties with the k-th kept. */
    float lk[5] = {3.0f, 1.0f, 2.0f, 2.0f, 0.0f};
    double ek[5];
    for (int i = 0; i < 5; i++) ek[i] = exp(lk[i] - 3.0);
    fsdp_sampling k = plain;
    k.top_k = 2;
    double want_k2[5] = {ek[0], 0, ek[2], ek[3], 0};
    expect("top-k 2 keeps both tokens tied at the 2nd largest", k, lk, 5, want_k2);
    k.top_k = 1;
    double want_k1[5] = {1, 0, 0, 0, 0};
    expect("top-k 1 keeps the argmax only", k, lk, 5, want_k1);
    k.top_k = 5;
    expect("top-k equal to the vocabulary keeps all", k, lk, 5, ek);

    /* Top-p on probabilities 0.5, 0.25, 0.125, 0.125 (ascending: ids 2, 3, 1, 0; cumulative 0.125, 0.25,
     * 0.5, 1). */
    const double pp[4] = {0.5, 0.25, 0.125, 0.125};
    float lp[4];
    logits_of(pp, 4, lp);
    struct {
        double top_p, want[4];
        const char *what;
    } cases[] = {
        {0.76, {0.5, 0.25, 0, 0.125}, "top-p 0.76 removes the first of the tied least likely (cumulative 0.125 <= 0.24)"},
        {0.74, {0.5, 0.25, 0, 0}, "top-p 0.74 removes both least likely (cumulative 0.25 <= 0.26)"},
        {0.51, {0.5, 0.25, 0, 0}, "top-p 0.51 keeps the two most likely (cumulative 0.5 > 0.49)"},
        {0.49, {1, 0, 0, 0}, "top-p 0.49 keeps the most likely only (cumulative 0.5 <= 0.51)"},
        {1e-9, {1, 0, 0, 0}, "top-p 1e-9: the most likely always stays"},
        {1.0, {0.5, 0.25, 0.125, 0.125}, "top-p 1 keeps all"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fsdp_sampling p = plain;
        p.top_p = cases[i].top_p;
        expect(cases[i].what, p, lp, 4, cases[i].want);
    }

    /* Order: top-k before top-p (top-p first would keep ids 0 and 1), temperature before top-p
     * (after it, top-p would keep ids 0, 1 and 2). */
    fsdp_sampling kp = plain;
    kp.top_k = 2, kp.top_p = 0.5;
    const double want_kp[4] = {1, 0, 0, 0};
    expect("top-k 2 then top-p 0.5 on 0.4/0.3/0.2/0.1: top-p sees 4/7, 3/7 and keeps id 0", kp, l4, 4, want_kp);
    fsdp_sampling tp = plain;
    tp.temperature = 0.5, tp.top_p = 0.8;
    const double want_tp[4] = {0.16, 0.09, 0, 0};
    expect("temperature 0.5 then top-p 0.8: top-p sees the sharpened distribution and keeps ids 0, 1", tp, l4, 4,
           want_tp);

    /* Draws: frequencies, reproducibility, the seed matters. */
    enum { STEPS = 40000 };
    fsdp_sampler *s = fsdp_sampler_create(&plain, 4);
    int count[4] = {0, 0, 0, 0};
    for (int i = 0; i < STEPS; i++) count[fsdp_sampler_next(s, l4, (uint64_t)i)]++;
    double worst = 0.0;
    for (int i = 0; i < 4; i++) worst = fmax(worst, fabs((double)count[i] / STEPS - p4[i]));
    check_that(worst < 0.01, "draws follow the distribution over %d steps (largest frequency error %.4f < 0.01)", STEPS,
               worst);
    fsdp_sampling other = plain;
    other.seed = 2;
    fsdp_sampler *s2 = fsdp_sampler_create(&plain, 4), *s3 = fsdp_sampler_create(&other, 4);
    int same = 1, differ = 0;
    for (int i = 0; i < 200; i++) {
        int32_t a = fsdp_sampler_next(s, l4, (uint64_t)i);
        same &= a == fsdp_sampler_next(s2, l4, (uint64_t)i);
        differ += a != fsdp_sampler_next(s3, l4, (uint64_t)i);
    }
    check_that(same, "the same seed and steps give the same tokens");
    check_that(differ > 50, "another seed gives other tokens");
    fsdp_sampler_free(s), fsdp_sampler_free(s2), fsdp_sampler_free(s3);

    return check_summary("test_sampling");
}
