/* tokenizer_config.json, the transformers file read beside a tokenizer.json, and where a --tokenizer
 * FILE|DIR finds both.
 *
 * What fsdp.c takes from it (the rest, chat_template included, is left to transformers):
 *   add_bos_token, add_eos_token  whether each key is given and its value: when either is given,
 *                                 transformers (TokenizersBackend, as LlamaTokenizerFast before it)
 *                                 replaces the tokenizer.json's post-processor by [bos] $A [eos];
 *   bos/eos/pad/unk_token and additional_special_tokens
 *                                 by content (a string, or an AddedToken object with its flags), or null;
 *   added_tokens_decoder          id -> AddedToken: transformers re-adds each with these flags;
 *   model_max_length              0 when absent or transformers' "no limit" (1e30);
 *   chat_template                 only whether there is one.
 * Every value is checked; a wrong type is refused in one line naming the file and the key. */
#ifndef FSDP_IO_TOKENIZER_CONFIG_H
#define FSDP_IO_TOKENIZER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"
#include "tokenizer_json.h"

typedef struct {
    int named;           /* the key is there and not null */
    fsdp_tj_str content;
    int has_flags;       /* given as an object: the flags are its own */
    int single_word, lstrip, rstrip, normalized, special;
} fsdp_tc_token;

typedef struct {
    uint32_t id;
    fsdp_tc_token token;
} fsdp_tc_decoder_entry;

typedef struct {
    char path[4200];
    int has_add_bos, add_bos, has_add_eos, add_eos;
    fsdp_tc_token bos, eos, pad, unk;
    fsdp_tc_token *extra; /* additional_special_tokens */
    int num_extra;
    fsdp_tc_decoder_entry *decoder; /* added_tokens_decoder */
    int num_decoder;
    uint64_t model_max_length;
    int has_chat_template;
} fsdp_tokenizer_config;

/* Where a --tokenizer argument's files are: a directory gives DIR/tokenizer.json, a file itself; the
 * config is tokenizer_config.json in that folder, or "" when there is none. -1 with err when the
 * directory has no tokenizer.json. */
int fsdp_tokenizer_files(const char *arg, char *json, size_t json_cap, char *config, size_t config_cap,
                         fsdp_err *err);
int fsdp_tokenizer_config_load(const char *path, fsdp_tokenizer_config *c, fsdp_err *err);
void fsdp_tokenizer_config_free(fsdp_tokenizer_config *c);

#endif
