/* Training and evaluation samples: which samples make up a global batch and what their tokens are.
 *
 * A step's global batch is the samples [first, first + G) with G = mbs * grad_accum * world and
 * `first` = samples consumed before the step. Rank r's micro-batch a holds samples
 * first + a*world*mbs + r*mbs + [0, mbs): the same set of samples whatever the split into ranks and
 * accumulation steps, and each rank reads only its own. A sample is seq inputs and seq targets (the
 * inputs shifted by one); a target of -1 does not count in the loss.
 *
 * Synthetic samples (the course's DummyDataset) are uniform in [0, synthetic_vocab), drawn from
 * (seed, sample index). A token file (docs/FORMATS.md) is packed into samples one of two ways:
 *
 *   stream  the documents joined into one stream of tokens, cut into windows of seq + 1 tokens that
 *           start at multiples of seq (continued pre-training). After every non-empty document the
 *           stream holds the model's EOS, unless the document already ends with EOS (what prepare
 *           writes for Alpaca) or the next document starts with it (OPT's tokenizer opens every
 *           document with </s>, its EOS): one EOS between documents, never two. BOS is whatever
 *           the file holds (prepare writes the tokenizer's, e.g. Llama's <s>). A version 1 file
 *           has no documents: it is a stream already, taken as it is.
 *   pad     one example per document: its first seq + 1 tokens at most (seq inputs, seq targets),
 *           the rest of the sample padded with the pad id (the model's pad_token_id, else its
 *           EOS, else 0) whose targets are -1 (instruction tuning).
 *
 * In both a target whose token the file's loss mask marks 0 is -1, so only unmasked tokens count.
 * The default (FSDP_PACK_AUTO) is pad for a file with a loss mask (prepare --format alpaca) and
 * stream otherwise (text, JSON Lines, version 1 files); pad needs documents (not version 1).
 *
 * Training visits the samples of an epoch (all windows or examples) in a fresh permutation per epoch
 * drawn from (seed, epoch); sample index i belongs to epoch i / samples, so the data position is
 * samples_seen alone and a step may straddle two epochs. Evaluation visits every sample once in
 * file order, and its stream ends with a shorter window when the tokens do not fill the last one:
 * every token of the stream but the first is predicted exactly once.
 *
 * Memory: nothing per token; a stream over documents keeps 2 bits per document (where EOS goes, and
 * a running count per 64 documents) and reads the document table as it goes. */
#ifndef FSDP_TRAIN_DATA_H
#define FSDP_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"
#include "../io/tokens.h"

typedef enum { FSDP_PACK_AUTO = 0, FSDP_PACK_STREAM = 1, FSDP_PACK_PAD = 2 } fsdp_packing;

/* How to open a data source. */
typedef struct {
    const char *path;        /* "synthetic" (or NULL) or a token file */
    const char *flag;        /* the flag that named it, for messages ("--data", "--eval-data") */
    int synthetic_vocab;
    fsdp_packing packing;
    int seq;
    uint64_t seed;
    int eval;                /* evaluation: file order, every token once */
    /* The model's: every id must be below vocab_size; eos_id and pad_id -1 = none. */
    int vocab_size, eos_id, pad_id;
} fsdp_data_spec;

typedef struct {
    int synthetic, synthetic_vocab;
    fsdp_token_file file;
    char flag[32];
    uint64_t seed;
    int seq, eval;
    fsdp_packing packing;    /* resolved for a file: STREAM or PAD */
    uint64_t samples;        /* file: windows or examples (per epoch in training) */
    int32_t eos_id, pad_id;  /* eos_id: inserted between documents (-1: a version 1 stream) */
    /* stream over documents (data_stream.c): EOS follows document d when bit d of eos_after is set;
     * eos_before[k] counts those of the documents before 64k. */
    uint64_t *eos_after, *eos_before;
    uint64_t stream_len;     /* tokens of the stream, inserted EOS included */
    uint64_t inserted;       /* EOS inserted */
    uint64_t cut, cut_tokens; /* pad: examples longer than seq + 1, and the tokens past it never trained on */
    int32_t *tokens;         /* one sample's seq + 1 tokens and mask bytes (scratch) */
    uint8_t *mask;
} fsdp_data;

int fsdp_data_open(fsdp_data *d, const fsdp_data_spec *spec, fsdp_err *err);
void fsdp_data_close(fsdp_data *d);
/* Fills inputs[seq] and targets[seq] of sample `index` (any index in training: epochs wrap; below
 * d->samples in evaluation, and a row past them is all padding with no counted target). */
int fsdp_data_sample(fsdp_data *d, uint64_t index, int32_t *inputs, int32_t *targets, fsdp_err *err);
/* Refuses a file where no target counts in the loss (every token masked, or cut off by --seq, or
 * padding): training on it would report a loss of 0 and learn nothing, and its evaluation would
 * divide by zero. fsdp_data_open checks every file so, reading samples in file order until the
 * first counted target (one sample, unless the file has few or none). */
int fsdp_data_require_targets(fsdp_data *d, fsdp_err *err);
/* The sample index of row b of rank r's micro-batch a in the step starting at `first`. */
static inline uint64_t fsdp_data_index(uint64_t first, int world, int mbs, int rank, int micro, int row) {
    return first + ((uint64_t)micro * (uint64_t)world + (uint64_t)rank) * (uint64_t)mbs + (uint64_t)row;
}
/* The optimizer steps of `epochs` passes over the data at `global_batch` samples per step:
 * ceil(epochs * samples / global_batch) (the last step may take the next epoch's first samples). */
int fsdp_data_epoch_steps(const fsdp_data *d, double epochs, uint64_t global_batch, int *steps, fsdp_err *err);
/* Refuses a token file made with another tokenizer than `tokenizer_json` (when that file exists and
 * the token file records a tokenizer hash): the model directory's tokenizer.json. */
int fsdp_data_check_tokenizer(const fsdp_data *d, const char *tokenizer_json, fsdp_err *err);
/* What the ids of a data source mean, as checkpoints record it: synthetic tokens in [0, vocab), or a
 * token file's tokenizer (its hash, 0 when the file records none, and its vocabulary). */
typedef struct {
    int synthetic;
    uint64_t tokenizer_hash;
    uint64_t vocab_size;
} fsdp_data_identity;
fsdp_data_identity fsdp_data_identity_of(const fsdp_data *d);
/* 1 when ids of `a` and `b` may mean other words: another source, another vocabulary, or two
 * tokenizer hashes that differ (a hash of 0 is unknown and compared with nothing, as in
 * fsdp_data_check_tokenizer). */
int fsdp_data_identity_differs(const fsdp_data_identity *a, const fsdp_data_identity *b);
/* One line for the run's description: the file, its documents and how they become samples. */
void fsdp_data_describe(const fsdp_data *d, char *buf, size_t cap);
/* "stream" or "pad". */
const char *fsdp_packing_name(fsdp_packing p);

#endif
