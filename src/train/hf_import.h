/* `fsdp train --init-from PATH`: training starts from the weights of a Hugging Face model directory
 * (config.json plus model.safetensors, or model.safetensors.index.json and its files) or of an
 * fsdp.c checkpoint (weights only: the optimizer starts fresh at step 0 and the data at sample 0).
 * The model is the one PATH describes (its config.json, or the config the checkpoint holds).
 *
 * Every rank reads only its own shard of every unit: the parameters' spans in its shard
 * (fsdp_trainer_unit_spans) become positioned reads of the safetensors files, converted from BF16,
 * F16 or F32 to the master precision. A Hugging Face directory is read by a pipeline: reader threads
 * keep several large reads in flight and convert what they read into staging windows of at most
 * 128 MB while the window before goes to the device. Host memory holds three windows and a few read
 * buffers, never the model. Every defect of the files is found before any weight is read and
 * reported on every rank as one message (fsdp_agree). */
#ifndef FSDP_TRAIN_HF_IMPORT_H
#define FSDP_TRAIN_HF_IMPORT_H

#include <mpi.h>

#include "../base/error.h"
#include "../model/config.h"
#include "trainer.h"

/* Collective. The model of PATH; when `model_spec` (--model) is given too, it must describe the
 * same model (usage error otherwise). */
int fsdp_init_from_config(MPI_Comm comm, const char *path, const char *model_spec, fsdp_model_config *cfg,
                          fsdp_err *err);

/* Collective. Fills every master shard from t->opt.init_from (instead of fsdp_trainer_init_weights). */
int fsdp_trainer_init_from(fsdp_trainer *t, fsdp_err *err);

#endif
