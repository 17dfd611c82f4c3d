/* A Hugging Face tokenizer (tokenizer.json, model BPE) that gives the same ids and text as the
 * `tokenizers` library: byte-level BPE (Llama 3, Qwen2, GPT-2/OPT) and SentencePiece-style BPE with
 * byte fallback (Llama 2). What the file asks for and fsdp.c cannot honour is refused when it is
 * loaded (io/tokenizer_json.h), never approximated.
 *
 * encode: added tokens are found (added_tokens.h), the rest normalized (normalize.h) and
 * pre-tokenized (pretokenize.h), each piece run through BPE (bpe.h), then the post-processor
 * (postprocess.h) places special tokens when add_special_tokens is set. decode: the decoder chain
 * (decode.h).
 *
 * A loaded fsdp_tokenizer is read-only and shared by any number of threads; each thread encodes
 * with its own fsdp_tokenizer_state (regex match data, BPE cache, buffers). */
#ifndef FSDP_TEXT_TOKENIZER_H
#define FSDP_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"
#include "textbuf.h"

typedef struct fsdp_tokenizer fsdp_tokenizer;
typedef struct fsdp_tokenizer_state fsdp_tokenizer_state;

/* path: a tokenizer.json, or a directory holding one; a tokenizer_config.json in the same folder is
 * applied as transformers' AutoTokenizer applies it (io/special_tokens.h). */
fsdp_tokenizer *fsdp_tokenizer_load(const char *path, fsdp_err *err);
void fsdp_tokenizer_free(fsdp_tokenizer *t);
/* 1 + the largest id the tokenizer can produce (model and added tokens). */
uint32_t fsdp_tokenizer_vocab_size(const fsdp_tokenizer *t);
/* FNV-1a 64 of the file's canonical JSON (continued over what tokenizer_config.json changes, if
 * anything): the tokenizer's identity in token files. */
uint64_t fsdp_tokenizer_hash(const fsdp_tokenizer *t);
/* tokenizer_config.json's model_max_length; 0 when it gives none (or no limit). */
uint64_t fsdp_tokenizer_model_max_length(const fsdp_tokenizer *t);
/* The id of a special token tokenizer_config.json names (FSDP_SPECIAL_BOS, _EOS, _PAD, _UNK of
 * io/special_tokens.h): 1 and *id, or 0 when it names none. */
int fsdp_tokenizer_special_id(const fsdp_tokenizer *t, int which, uint32_t *id);
/* The id of a token by its text (added tokens first, then the model's vocabulary); 0 when none. */
int fsdp_tokenizer_token_id(const fsdp_tokenizer *t, const char *token, size_t n, uint32_t *id);
/* Whether the token is a special added token. */
int fsdp_tokenizer_is_special(const fsdp_tokenizer *t, uint32_t id);
/* How many ids add_special_tokens puts before and after a sequence. */
void fsdp_tokenizer_special_counts(const fsdp_tokenizer *t, size_t *before, size_t *after);

fsdp_tokenizer_state *fsdp_tokenizer_state_new(const fsdp_tokenizer *t);
void fsdp_tokenizer_state_free(fsdp_tokenizer_state *s);

/* Appends the ids of text[0..n) to out. The text must be valid UTF-8: otherwise -1 with err saying
 * at which byte ("invalid UTF-8 at byte N"), since tokenizers takes only valid strings. */
int fsdp_tokenizer_encode(const fsdp_tokenizer *t, fsdp_tokenizer_state *s, const char *text, size_t n,
                          int add_special_tokens, fsdp_ids *out, fsdp_err *err);
/* Appends the text of ids to out; skip_special_tokens drops special tokens. An id the tokenizer does
 * not have is refused (tokenizers drops it silently). */
int fsdp_tokenizer_decode(const fsdp_tokenizer *t, fsdp_tokenizer_state *s, const uint32_t *ids, size_t n,
                          int skip_special_tokens, fsdp_buf *out, fsdp_err *err);

#endif
