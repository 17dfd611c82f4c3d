/* tokenizer_config.json applied to a tokenizer.json's description as transformers applies it when
 * AutoTokenizer loads the two (TokenizersBackend, transformers 5; LlamaTokenizerFast's
 * update_post_processor before it), so that fsdp.c's ids are a transformers user's:
 *
 *   added_tokens_decoder  each entry must be the tokenizer.json's added token of that id (same
 *                         content); its flags (lstrip, rstrip, single_word, normalized, special) are
 *                         the entry's, as transformers re-adds it;
 *   named special tokens  bos/eos/pad/unk_token and additional_special_tokens are added as special
 *                         tokens: an AddedToken object with its flags, a string as special and not
 *                         normalized; a content that is already an added token takes these flags, one
 *                         in the model's vocabulary becomes an added token with its id, and one the
 *                         tokenizer lacks is refused (transformers would give it a new id: fsdp.c
 *                         does not grow vocabularies);
 *   add_bos/eos_token     when either key is given, the post-processor becomes the template
 *                         [bos] $A [eos] (bos when add_bos_token and a bos_token is named, eos
 *                         likewise), whatever the tokenizer.json had.
 *
 * The tokenizer's identity hash changes only when the config changes some encoding: then the
 * tokenizer.json's hash is continued over a canonical text of the changes (tokens added or
 * re-flagged, the new template), so a config that agrees with its tokenizer.json keeps its hash. */
#ifndef FSDP_IO_SPECIAL_TOKENS_H
#define FSDP_IO_SPECIAL_TOKENS_H

#include <stdint.h>

#include "../io/tokenizer_config.h"
#include "../io/tokenizer_json.h"

typedef enum { FSDP_SPECIAL_BOS, FSDP_SPECIAL_EOS, FSDP_SPECIAL_PAD, FSDP_SPECIAL_UNK, FSDP_SPECIAL_COUNT } fsdp_special;

typedef struct {
    int has[FSDP_SPECIAL_COUNT]; /* the config names the token */
    uint32_t id[FSDP_SPECIAL_COUNT];
    uint64_t model_max_length; /* 0: none */
} fsdp_special_tokens;

/* Applies cfg to spec (which it changes: added tokens, templates, hash); fills out. */
int fsdp_special_tokens_apply(fsdp_tokenizer_spec *spec, const fsdp_tokenizer_config *cfg, fsdp_special_tokens *out,
                              fsdp_err *err);
/* Reads a --tokenizer FILE|DIR (tokenizer.json and the tokenizer_config.json beside it, if any) into
 * spec with the config applied. */
int fsdp_tokenizer_spec_load_with_config(const char *arg, fsdp_tokenizer_spec *spec, fsdp_special_tokens *special,
                                         fsdp_err *err);
/* The identity hash token files record for a tokenizer FILE|DIR: the tokenizer.json's, continued as
 * above when a tokenizer_config.json beside it changes some encoding. A tokenizer.json fsdp.c cannot
 * read (another model type) has its file's hash, whatever the config says. */
int fsdp_tokenizer_identity_hash(const char *arg, uint64_t *hash, fsdp_err *err);

#endif
