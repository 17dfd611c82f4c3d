/* Training samples: which samples make up a global batch and what their tokens are.
 *
 * A step's global batch is the samples [first, first + G) with G = mbs * grad_accum * world and
 * `first` = samples consumed before the step. Rank r's micro-batch a holds samples
 * first + a*world*mbs + r*mbs + [0, mbs): the same set of samples whatever the split into ranks and
 * accumulation steps, and each rank reads only its own. Each sample is seq+1 tokens; inputs are the
 * first seq, targets the last seq.
 *
 * Synthetic samples (the course's DummyDataset) are uniform in [0, synthetic_vocab), drawn from
 * (seed, sample index). File samples are windows of seq+1 tokens at multiples of seq, visited in an
 * order that is a fresh permutation of all windows every epoch, drawn from (seed, epoch). */
#ifndef FSDP_TRAIN_DATA_H
#define FSDP_TRAIN_DATA_H

#include <stdint.h>

#include "../base/error.h"
#include "../io/tokens.h"

typedef struct {
    int synthetic;
    int synthetic_vocab;
    fsdp_token_file file;
    uint64_t seed;
    int seq;
    uint64_t windows; /* file: number of windows */
} fsdp_data;

/* Opens the data source; `vocab_size` is the model's, which every id must be below. */
int fsdp_data_open(fsdp_data *d, const char *spec, int synthetic_vocab, int vocab_size, int seq, uint64_t seed,
                   fsdp_err *err);
void fsdp_data_close(fsdp_data *d);
/* Fills inputs[seq] and targets[seq] of sample `index`. */
int fsdp_data_sample(const fsdp_data *d, uint64_t index, int32_t *inputs, int32_t *targets, fsdp_err *err);
/* The sample index of row b of rank r's micro-batch a in the step starting at `first`. */
static inline uint64_t fsdp_data_index(uint64_t first, int world, int mbs, int rank, int micro, int row) {
    return first + ((uint64_t)micro * (uint64_t)world + (uint64_t)rank) * (uint64_t)mbs + (uint64_t)row;
}

#endif
