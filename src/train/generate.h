/* Generation: a prompt's ids in, new ids out, one at a time, as transformers' generate does for one
 * sequence: the prompt runs as one prefill over the KV cache (src/model/kv_decode.h), then each new
 * token is chosen from the last logits (sampling.h), handed to the caller, and run to get the next
 * logits, until an end-of-sequence id is chosen (it is handed over too, as transformers keeps it in
 * its output) or max_new_tokens were produced. */
#ifndef FSDP_TRAIN_GENERATE_H
#define FSDP_TRAIN_GENERATE_H

#include <stdint.h>

#include "../backend/backend.h"
#include "../model/config.h"
#include "../model/layout.h"
#include "sampling.h"

typedef struct {
    int max_new_tokens;
    const int32_t *eos;  /* ids that end generation (none: only max_new_tokens does) */
    int num_eos;
    fsdp_sampling sampling;
    /* Called with each new id as soon as it is chosen; non-zero stops with that error. */
    int (*on_token)(void *arg, int32_t id, fsdp_err *err);
    void *arg;
} fsdp_generate_options;

typedef struct {
    int prompt_tokens, new_tokens, stopped_at_eos;
    double prefill_seconds; /* the prompt's forward and the first token's choice (time to first token) */
    double decode_seconds;  /* the rest: one forward and one choice per further token */
    double min_margin;      /* smallest top-1 minus top-2 logit over the steps (how near greedy came to a tie) */
    size_t cache_bytes;     /* the KV cache and generation activations on the device */
} fsdp_generate_stats;

/* units: the resident weights (resident.h). Returns -1 with err set when the prompt does not fit
 * (learned positions: prompt + new tokens past max_position_embeddings), holds an id outside the
 * vocabulary, or the model's logits are not finite. */
int fsdp_generate(fsdp_backend *be, const fsdp_model_config *cfg, const fsdp_layout *layout, const void *const *units,
                  const int32_t *prompt, int prompt_len, const fsdp_generate_options *o, fsdp_generate_stats *st,
                  fsdp_err *err);

#endif
