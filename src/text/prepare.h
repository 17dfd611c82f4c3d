/* `fsdp prepare`: documents (io/documents.h) -> token file version 2 (io/tokens.h), streamed.
 *
 * Documents are read in order into groups of bounded size, tokenized by N threads (each with its own
 * tokenizer state; a document is tokenized whole by one thread, so the output does not depend on N),
 * and written in input order. Each document goes to the training file or, with probability
 * val_fraction drawn from (seed, document number), to the validation file. Peak memory stays within
 * max_memory beyond the tokenizer itself for any document accepted: a group holds at most
 * max_memory/64 bytes of text (so one document at most that much), tokenizing takes at most 42 bytes
 * per byte of the group (measured: prepare.c), and after each group the threads give back what a
 * large document made them hold. A training file left without documents (--val-fraction near 1) is
 * refused, and no output may be an input or the tokenizer (base/output_paths.h).
 *
 * Alpaca records become the Stanford Alpaca prompt (with or without input) tokenized with the
 * tokenizer's special tokens (BOS, per its post-processor), then the response tokenized without them,
 * then EOS, as LitGPT's SFTDataset builds them for the course's Llama-2-7B fine-tune; the loss mask
 * is 0 over the prompt and 1 over the response and its EOS. */
#ifndef FSDP_TEXT_PREPARE_H
#define FSDP_TEXT_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"
#include "../io/documents.h"

typedef struct {
    const char *tokenizer;
    const char *const *inputs;
    int num_inputs;
    fsdp_docs_format format;
    const char *field;      /* jsonl, parquet */
    const char *out;        /* training file */
    double val_fraction;    /* documents to the validation file (0: none) */
    uint64_t seed;
    int threads;
    size_t max_memory;      /* bytes */
    int add_special_tokens; /* the post-processor's special tokens around each document (prompt) */
    const char *eos_token;  /* alpaca: the EOS token's text; NULL = tokenizer_config.json's eos_token, else the first
                             * of </s>, <|end_of_text|>, <|endoftext|> */
    int progress;           /* a progress line on stderr */
} fsdp_prepare_options;

typedef struct {
    uint64_t documents[2], tokens[2], counted[2]; /* [0] training, [1] validation; counted = mask 1 */
    uint64_t model_max_length; /* tokenizer_config.json's (0: none) */
    uint64_t longer;           /* documents of more tokens than that (transformers warns; nothing is cut) */
    uint64_t nulls;                               /* records skipped for a null text (Parquet) */
    uint64_t bytes;
    double seconds;
    uint32_t vocab_size;
    uint64_t tokenizer_hash;
} fsdp_prepare_stats;

/* The validation file's name: OUT with ".val" before its extension (data.bin -> data.val.bin), or
 * OUT.val when it has none. */
void fsdp_prepare_val_path(const char *out, char *buf, size_t cap);
int fsdp_prepare(const fsdp_prepare_options *o, fsdp_prepare_stats *stats, fsdp_err *err);

#endif
