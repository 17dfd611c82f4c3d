/* The post-processor: tokenizers' TemplateProcessing for a single sequence, step after step (a
 * Sequence of processors). With add_special_tokens the template's special tokens are placed around
 * the ids; without, only the sequence's ids remain. ByteLevel post-processing changes only offsets,
 * which fsdp.c does not keep, so it has no step here. */
#ifndef FSDP_TEXT_POSTPROCESS_H
#define FSDP_TEXT_POSTPROCESS_H

#include "../io/tokenizer_json.h"
#include "textbuf.h"

/* Rewrites ids through every template; tmp is scratch. */
void fsdp_postprocess(const fsdp_tokenizer_spec *spec, int add_special_tokens, fsdp_ids *ids, fsdp_ids *tmp);
/* How many ids the templates put before and after the sequence (for the prompt masks of prepare). */
void fsdp_postprocess_counts(const fsdp_tokenizer_spec *spec, int add_special_tokens, size_t *before, size_t *after);

#endif
