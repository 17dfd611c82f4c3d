/* The tokenizer files of an exported model directory, so that AutoTokenizer.from_pretrained(EXPORT)
 * and `fsdp generate --init-from EXPORT` find the tokenizer with the model:
 *
 *   tokenizer.json           copied byte for byte;
 *   tokenizer_config.json    copied when the tokenizer has one beside it, else written:
 *                            tokenizer_class PreTrainedTokenizerFast (transformers then takes the
 *                            tokenizer.json as it is, whatever the model's type), the model's
 *                            bos/eos/pad tokens (by the config's ids) and the tokenizer's unk token
 *                            when they are added tokens, with their tokenizer.json flags (so the
 *                            tokenizer's ids and identity hash stay those of the tokenizer.json), and
 *                            model_max_length = the model's max_position_embeddings;
 *   special_tokens_map.json  copied when there is one, else written from the same special tokens
 *                            (those tokenizer_config.json names, or the ones above).
 *
 * Staged as NAME.tmp in the export's staging directory (written and synced), renamed by
 * fsdp_tokenizer_publish with the rest of the model. A tokenizer with ids beyond the model's
 * vocabulary is refused. */
#ifndef FSDP_IO_TOKENIZER_EXPORT_H
#define FSDP_IO_TOKENIZER_EXPORT_H

#include "../base/error.h"
#include "../model/config.h"

/* The three names, NULL-terminated. */
extern const char *const FSDP_TOKENIZER_FILES[];

/* `arg`: a tokenizer.json or its directory. */
int fsdp_tokenizer_stage(const char *staging, const char *arg, const fsdp_model_config *cfg, fsdp_err *err);
int fsdp_tokenizer_publish(const char *staging, fsdp_err *err);

#endif
