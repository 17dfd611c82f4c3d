/* The unigram baseline of an evaluation: what a model that knows only how often each token occurs
 * would score on the validation file, the bar a language model must clear to show it learned more
 * than token frequencies.
 *
 * The frequencies are counted over the targets of every training sample (each window or example of
 * `train` once, as an epoch visits them: the EOS inserted between documents included, masked and
 * padded positions not), add-one smoothed over the model's vocabulary so that a token never seen in
 * training costs log(N + V) rather than infinity. The baseline is the mean of -log p(token) over
 * exactly the targets that evaluation counts (`eval`, opened for evaluation), so it compares with
 * eval_loss directly (natural log, nats). Memory: one 64-bit count per vocabulary entry; time: one
 * pass over both files. */
#ifndef FSDP_TRAIN_UNIGRAM_H
#define FSDP_TRAIN_UNIGRAM_H

#include <stdint.h>

#include "data.h"

typedef struct {
    double loss;           /* mean cross-entropy of the evaluation targets, nats */
    double ppl;            /* exp(loss) */
    int64_t eval_tokens;   /* evaluation targets counted */
    int64_t train_tokens;  /* training targets the frequencies come from */
    int64_t unseen;        /* evaluation targets whose token never occurs in the training targets */
} fsdp_unigram_result;

/* Local (no communication). `train` and `eval` are token files opened by fsdp_data_open with the
 * model's vocabulary; vocab_size is the model's. */
int fsdp_unigram_baseline(fsdp_data *train, fsdp_data *eval, int vocab_size, fsdp_unigram_result *out,
                          fsdp_err *err);

#endif
