/* Hugging Face config.json <-> fsdp_model_config.
 *
 * Understands model_type "llama" (Llama 2 and 3.x, with rope_scaling of type "llama3") and "opt"
 * (pre-LayerNorm OPT with word_embed_proj_dim == hidden_size). Anything else, or a field fsdp.c
 * cannot honour (attention_bias, mlp_bias, do_layer_norm_before=false, a non-relu OPT activation,
 * a non-silu Llama activation, an unknown rope_scaling type), is rejected with a message that names
 * the file and the field. */
#ifndef FSDP_IO_HF_CONFIG_H
#define FSDP_IO_HF_CONFIG_H

#include <stddef.h>

#include "../base/error.h"
#include "../model/config.h"

/* `path` is a config.json file or a directory holding one. */
int fsdp_hf_config_load(const char *path, fsdp_model_config *out, fsdp_err *err);
/* Parses config.json text; `origin` names the source in messages. */
int fsdp_hf_config_parse(const char *text, size_t len, const char *origin, fsdp_model_config *out, fsdp_err *err);
/* Writes the config as Hugging Face config.json text (the fields transformers needs to build the
 * same model). Returns the length, or -1 if cap is too small. */
int fsdp_hf_config_write(const fsdp_model_config *cfg, char *buf, size_t cap);

#endif
