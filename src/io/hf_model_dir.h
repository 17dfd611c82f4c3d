/* A Hugging Face model directory as fsdp.c writes it for transformers' from_pretrained: config.json
 * (the model, its architectures and the dtype of the weights), generation_config.json (the special
 * token ids) and the weights (safetensors_write.h); and the check that refuses to write over a
 * model that is already there. */
#ifndef FSDP_IO_HF_MODEL_DIR_H
#define FSDP_IO_HF_MODEL_DIR_H

#include <stddef.h>

#include <jansson.h>

#include "../base/error.h"
#include "../model/config.h"

/* 1 when DIR holds a model (config.json, generation_config.json, model.safetensors.index.json or
 * any *.safetensors file; `what` gets the first name found), 0 when not or when DIR does not exist. */
int fsdp_hf_dir_has_model(const char *dir, char *what, size_t cap);

/* Writes DIR/config.json.tmp and DIR/generation_config.json.tmp (fsync'ed). `dtype` is the weights'
 * dtype as transformers names it ("bfloat16", "float32"): written as "dtype" (transformers 5) and
 * "torch_dtype" (what transformers 4 reads). The generation config carries the bos/eos/pad token
 * ids that the model config has. */
/* Write JSON value v as DIR/NAME.tmp (indented, one final newline, numbers with `precision`
 * significant digits), for the export's staging: every JSON file of a Hugging Face directory. */
int fsdp_hf_write_json_tmp(const char *dir, const char *name, const json_t *v, int precision, fsdp_err *err);
int fsdp_hf_stage_configs(const char *dir, const fsdp_model_config *cfg, const char *dtype, fsdp_err *err);
/* Renames them to their final names, config.json last: a directory with a config.json is complete. */
int fsdp_hf_publish_configs(const char *dir, fsdp_err *err);

#endif
