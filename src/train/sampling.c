/* Logits warpers and the draw (sampling.h). */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/rng.h"

struct fsdp_sampler {
    fsdp_sampling cfg;
    int V;
    double *scores, *work, *probs;
    int32_t *order;
};

fsdp_sampler *fsdp_sampler_create(const fsdp_sampling *cfg, int vocab) {
    fsdp_sampler *s = fsdp_xcalloc(1, sizeof *s, "the sampler");
    s->cfg = *cfg;
    s->V = vocab;
    s->scores = fsdp_xmalloc((size_t)vocab * sizeof(double), "the sampler");
    s->work = fsdp_xmalloc((size_t)vocab * sizeof(double), "the sampler");
    s->probs = fsdp_xmalloc((size_t)vocab * sizeof(double), "the sampler");
    s->order = fsdp_xmalloc((size_t)vocab * sizeof(int32_t), "the sampler");
    return s;
}

void fsdp_sampler_free(fsdp_sampler *s) {
    if (!s) return;
    free(s->scores), free(s->work), free(s->probs), free(s->order);
    free(s);
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

double fsdp_logit_margin(const float *logits, int vocab) {
    int32_t best = argmax(logits, vocab);
    double second = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (i != best && logits[i] > second) second = logits[i];
    return (double)logits[best] - second;
}

/* The k-th largest (k >= 1) of a[0..n), which it reorders: quickselect, expected O(n). */
static double kth_largest(double *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1; /* index in descending order */
    while (lo < hi) {
        double pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                double t = a[i];
                a[i] = a[j], a[j] = t;
                i++, j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            return a[want];
    }
    return a[want];
}

static const double *g_sort_scores; /* qsort has no context argument */

/* Ascending score, then ascending id. */
static int by_score(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    double sx = g_sort_scores[x], sy = g_sort_scores[y];
    if (sx != sy) return sx < sy ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* softmax of the finite scores into probs (0 elsewhere). */
static void softmax(const double *scores, int V, double *probs) {
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < V; i++)
        if (scores[i] > mx) mx = scores[i];
    for (int i = 0; i < V; i++) {
        probs[i] = isfinite(scores[i]) ? exp(scores[i] - mx) : 0.0;
        sum += probs[i];
    }
    for (int i = 0; i < V; i++) probs[i] /= sum;
}

void fsdp_sampler_distribution(fsdp_sampler *s, const float *logits, double *probs) {
    const int V = s->V;
    const fsdp_sampling *c = &s->cfg;
    if (!c->do_sample) {
        memset(probs, 0, (size_t)V * sizeof(double));
        probs[argmax(logits, V)] = 1.0;
        return;
    }
    double *sc = s->scores;
    for (int i = 0; i < V; i++) sc[i] = (double)logits[i] / c->temperature;
    if (c->top_k > 0 && c->top_k < V) {
        memcpy(s->work, sc, (size_t)V * sizeof(double));
        double kth = kth_largest(s->work, V, c->top_k);
        for (int i = 0; i < V; i++)
            if (sc[i] < kth) sc[i] = -INFINITY;
    }
    if (c->top_p < 1.0) {
        int n = 0;
        for (int i = 0; i < V; i++)
            if (isfinite(sc[i])) s->order[n++] = i;
        g_sort_scores = sc;
        qsort(s->order, (size_t)n, sizeof(int32_t), by_score);
        softmax(sc, V, s->probs);
        double cum = 0.0;
        for (int r = 0; r < n - 1; r++) { /* the most likely token always stays */
            cum += s->probs[s->order[r]];
            if (cum > 1.0 - c->top_p) break;
            sc[s->order[r]] = -INFINITY;
        }
    }
    softmax(sc, V, probs);
}

int32_t fsdp_sampler_next(fsdp_sampler *s, const float *logits, uint64_t step) {
    if (!s->cfg.do_sample) return argmax(logits, s->V);
    fsdp_sampler_distribution(s, logits, s->probs);
    double u = fsdp_rand_uniform(s->cfg.seed, FSDP_SAMPLE_STREAM, step), acc = 0.0;
    int32_t last = 0;
    for (int i = 0; i < s->V; i++) {
        if (s->probs[i] <= 0.0) continue;
        acc += s->probs[i];
        last = i;
        if (u < acc) return i;
    }
    return last; /* u above the rounded total */
}
