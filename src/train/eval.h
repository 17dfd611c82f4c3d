/* Evaluation: the loss and perplexity of the model over a whole token file, forward only.
 *
 * Every sample of the file (data.h in evaluation order: every window or example once) is run
 * through the forward-only path: the engine's forward order (each gathered unit released after its
 * forward, fsdp_engine_begin_forward) and the model's loss-only head (fsdp_model_head_loss): no
 * gradients, no optimizer. The samples are split across the ranks as a training step splits a
 * global batch (row b of rank r's micro-batch a is sample (a * world + r) * mbs + b), so the loss
 * is the same on any number of ranks up to the order of the final sums; rows past the last sample
 * count nothing. loss = summed cross-entropy of the counted targets / their number, ppl = exp(loss).
 *
 * Used by `fsdp train --eval-data` between steps (on the training model, its activations reused)
 * and by `fsdp eval` (an engine made forward_only). */
#ifndef FSDP_TRAIN_EVAL_H
#define FSDP_TRAIN_EVAL_H

#include <stdint.h>

#include "trainer.h"

typedef struct {
    double loss;       /* mean cross-entropy over the counted tokens */
    double ppl;        /* exp(loss) */
    int64_t tokens;    /* counted tokens (targets not -1) */
    uint64_t samples;  /* windows or examples evaluated */
    double seconds;
} fsdp_eval_result;

/* Collective. Evaluates `data` (opened with eval set) with t's model and engine at its current
 * weights; prints progress every 10 s of a long evaluation. */
int fsdp_evaluate(fsdp_trainer *t, fsdp_data *data, fsdp_eval_result *out, fsdp_err *err);
/* Rank 0: one line "<what>: step N | eval loss X | eval ppl Y | T tokens in S samples | s". */
void fsdp_eval_log(const fsdp_trainer *t, const char *what, const fsdp_eval_result *r);
/* Rank 0: the metrics record {"step", "eval_loss", "eval_ppl", "eval_tokens"} (docs/FORMATS.md). */
void fsdp_eval_record(fsdp_trainer *t, const fsdp_eval_result *r, fsdp_err *err);

/* `fsdp eval`: sets up a forward-only run of `o` (o->init_from: a model directory or checkpoint
 * file; o->data: the file to evaluate), loads the weights, evaluates and reports. Collective. */
int fsdp_eval_run(const fsdp_train_options *o, fsdp_err *err);

#endif
