/* The next token from a row of logits, as transformers' generate chooses it.
 *
 * Greedy (do_sample off): the argmax of the raw logits, the lowest id on ties (torch.argmax).
 * Sampling: the logits warpers in transformers' order — temperature (scores / T), top-k (every score
 * below the k-th largest becomes -inf; ties with it stay), top-p (sorted ascending, the tokens whose
 * cumulative probability is at most 1 - p become -inf, the most likely always stays) — then a draw
 * from the softmax of what is left. The draw is the uniform number fsdp_rand_uniform(seed,
 * FSDP_SAMPLE_STREAM, step) walked through the probabilities in id order, so the same seed and the
 * same logits give the same tokens on every run and machine. (transformers draws with torch's
 * generator, so sampled tokens cannot equal its sampled tokens; the distribution is the same.)
 * Probabilities and the top-p sums are computed in double. */
#ifndef FSDP_TRAIN_SAMPLING_H
#define FSDP_TRAIN_SAMPLING_H

#include <stdint.h>

#define FSDP_SAMPLE_STREAM 0x73616d706c65ull /* "sample" */

typedef struct {
    int do_sample;     /* 0: greedy */
    double temperature; /* > 0 when sampling */
    int top_k;         /* 0: no top-k */
    double top_p;      /* (0, 1]; 1: no top-p */
    uint64_t seed;
} fsdp_sampling;

typedef struct fsdp_sampler fsdp_sampler;

fsdp_sampler *fsdp_sampler_create(const fsdp_sampling *s, int vocab);
void fsdp_sampler_free(fsdp_sampler *s);

/* The token chosen from logits[vocab] at generation step `step` (0 for the first new token). */
int32_t fsdp_sampler_next(fsdp_sampler *s, const float *logits, uint64_t step);

/* The distribution a draw is made from: probs[vocab] after the warpers (0 for removed tokens); for
 * greedy, 1 at the argmax. For tests. */
void fsdp_sampler_distribution(fsdp_sampler *s, const float *logits, double *probs);

/* The largest logit less the second largest (how far greedy is from a tie), for diagnostics. */
double fsdp_logit_margin(const float *logits, int vocab);

#endif
