/* Hugging Face config.json <-> fsdp_model_config, through Jansson.
 *
 * The reader finds the family by model_type and interprets that family's field table
 * (src/model/family.h): every field that changes the computation is honoured or, at a value
 * fsdp.c cannot train, refused with one line naming the file and the field; fields that do not
 * matter to training, and fields the family does not have, are ignored, as transformers ignores
 * them. Both transformers 4.x files (rope_theta, rope_scaling, torch_dtype) and 5.x files
 * (rope_parameters, dtype, layer_types) are read. docs/FORMATS.md lists every field per family.
 *
 * The writer emits what transformers needs to build the same model: architectures, model_type,
 * torch_dtype, every field of the family's table at the config's value (floats as the shortest
 * decimal that reads back to the same float) and RoPE as rope_theta + rope_scaling, which
 * transformers 4 and 5 both read. */
#ifndef FSDP_IO_HF_CONFIG_H
#define FSDP_IO_HF_CONFIG_H

#include <jansson.h>
#include <stddef.h>

#include "../base/error.h"
#include "../model/config.h"

/* `path` is a config.json file or a directory holding one. */
int fsdp_hf_config_load(const char *path, fsdp_model_config *out, fsdp_err *err);
/* Parses config.json text; `origin` names the source in messages. */
int fsdp_hf_config_parse(const char *text, size_t len, const char *origin, fsdp_model_config *out, fsdp_err *err);
/* The same from a parsed JSON object. */
int fsdp_hf_config_from_json(const json_t *root, const char *origin, fsdp_model_config *out, fsdp_err *err);
/* Writes the config as config.json text (indented, ending in a newline). Returns the length, or
 * -1 if cap is too small. */
int fsdp_hf_config_write(const fsdp_model_config *cfg, char *buf, size_t cap);
/* The object fsdp_hf_config_write prints, for writers that add or change fields (torch_dtype of
 * an export). The caller owns the reference. */
json_t *fsdp_hf_config_json(const fsdp_model_config *cfg);

#endif
