/* The unigram baseline of an evaluation: unigram.h. */
#include "unigram.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Calls visit(targets, n, ctx) for the targets of every sample of d (each sample once). */
static int each_sample(fsdp_data *d, int (*visit)(const int32_t *, int, void *, fsdp_err *), void *ctx,
                       fsdp_err *err) {
    int seq = d->seq;
    int32_t *inputs = fsdp_xmalloc((size_t)seq * sizeof(int32_t), "a sample's inputs");
    int32_t *targets = fsdp_xmalloc((size_t)seq * sizeof(int32_t), "a sample's targets");
    int rc = 0;
    for (uint64_t i = 0; i < d->samples && rc == 0; i++) {
        rc = fsdp_data_sample(d, i, inputs, targets, err);
        if (rc == 0) rc = visit(targets, seq, ctx, err);
    }
    free(inputs);
    free(targets);
    return rc;
}

typedef struct {
    uint64_t *counts;
    int vocab_size;
    int64_t total;
} tally;

static int count_targets(const int32_t *targets, int n, void *ctx, fsdp_err *err) {
    tally *t = ctx;
    for (int i = 0; i < n; i++) {
        if (targets[i] < 0) continue;
        if (targets[i] >= t->vocab_size)
            return fsdp_errf(err, "token id %d is not below the model's vocabulary size %d", targets[i],
                             t->vocab_size);
        t->counts[targets[i]]++;
        t->total++;
    }
    return 0;
}

typedef struct {
    const tally *train;
    double log_denominator; /* log(N + V) */
    double nll;
    int64_t tokens, unseen;
} scoring;

static int score_targets(const int32_t *targets, int n, void *ctx, fsdp_err *err) {
    scoring *s = ctx;
    for (int i = 0; i < n; i++) {
        if (targets[i] < 0) continue;
        if (targets[i] >= s->train->vocab_size)
            return fsdp_errf(err, "token id %d is not below the model's vocabulary size %d", targets[i],
                             s->train->vocab_size);
        uint64_t c = s->train->counts[targets[i]];
        s->unseen += c == 0;
        s->nll += s->log_denominator - log((double)c + 1.0);
        s->tokens++;
    }
    return 0;
}

int fsdp_unigram_baseline(fsdp_data *train, fsdp_data *eval, int vocab_size, fsdp_unigram_result *out,
                          fsdp_err *err) {
    memset(out, 0, sizeof *out);
    tally t = {.vocab_size = vocab_size};
    t.counts = calloc((size_t)vocab_size, sizeof *t.counts);
    if (!t.counts) fsdp_fatal("out of host memory for %d unigram counts", vocab_size);
    int rc = each_sample(train, count_targets, &t, err);
    scoring s = {.train = &t, .log_denominator = log((double)t.total + (double)vocab_size)};
    if (rc == 0) rc = each_sample(eval, score_targets, &s, err);
    free(t.counts);
    if (rc) return -1;
    if (s.tokens == 0) return fsdp_errf(err, "%s: no counted tokens to compute a unigram baseline over", eval->flag);
    out->loss = s.nll / (double)s.tokens;
    out->ppl = exp(out->loss);
    out->eval_tokens = s.tokens;
    out->train_tokens = t.total;
    out->unseen = s.unseen;
    return 0;
}
