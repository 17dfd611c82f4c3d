/* generation_config.json of a Hugging Face model directory: what transformers' generate takes from
 * it when the call does not say otherwise. Read: eos_token_id (one id or a list: generation stops
 * at any of them), do_sample, temperature, top_k, top_p and max_new_tokens; every other field is
 * ignored (docs/FORMATS.md). A field of the wrong type or out of range is refused, naming the file
 * and the field. The same reader takes the eos_token_id list of a config.json, which transformers
 * uses when a directory has no generation_config.json. */
#ifndef FSDP_IO_GENERATION_CONFIG_H
#define FSDP_IO_GENERATION_CONFIG_H

#include <stdint.h>

#include "../base/error.h"

#define FSDP_MAX_EOS 32

typedef struct {
    int32_t eos[FSDP_MAX_EOS];
    int num_eos;         /* 0: the file names none (absent or null) */
    int has_do_sample, do_sample;
    int has_temperature;
    double temperature;  /* >= 0 */
    int has_top_k, top_k; /* >= 0 */
    int has_top_p;
    double top_p;        /* [0, 1] */
    int has_max_new_tokens, max_new_tokens;
} fsdp_generation_config;

/* Reads `path` (a generation_config.json, or with eos_only a config.json). Returns 1 when read, 0
 * when the file does not exist (g zeroed), -1 with err naming the file and field. */
int fsdp_generation_config_load(const char *path, int eos_only, fsdp_generation_config *g, fsdp_err *err);

#endif
