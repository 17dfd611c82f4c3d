/* A whole model resident on one device, for one process that runs it without sharding (generation):
 * where its weights come from, and all of them read into one buffer per FSDP unit in the backend's
 * act dtype, in the flat layout of src/model/layout.h — the layout the training units have, so the
 * model's per-unit views (unit_params.h) apply unchanged.
 *
 * Sources: a Hugging Face model directory (config.json + safetensors, read by parameter name through
 * hf_weights.h; BF16, F16 and F32 converted) or an fsdp.c checkpoint (its fp32 weights, whole
 * tensors, one unit at a time; a --ckpt-dir means its latest). Host memory holds one unit in fp32 at
 * a time; the device a staging buffer of at most 128 MiB besides the weights. Collective calls run
 * over MPI_COMM_SELF: the caller is one process. */
#ifndef FSDP_TRAIN_RESIDENT_H
#define FSDP_TRAIN_RESIDENT_H

#include <stdint.h>
#include <stdio.h>

#include "../backend/backend.h"
#include "../model/config.h"
#include "../model/layout.h"

typedef struct {
    int is_checkpoint;   /* else a Hugging Face directory */
    char path[4200];     /* the directory, or the checkpoint file */
    fsdp_model_config cfg;
} fsdp_model_source;

/* `init_from` (a Hugging Face directory or a checkpoint file, as `train --init-from`) or
 * `checkpoint` (a checkpoint file or a --ckpt-dir): exactly one is not NULL. Reads the model's
 * config; -1 with err naming the flag and the path on any defect. */
int fsdp_model_source_resolve(const char *init_from, const char *checkpoint, fsdp_model_source *src, fsdp_err *err);

typedef struct {
    fsdp_layout layout;
    void **units;      /* device buffer of unit u, act dtype */
    size_t bytes;      /* their size on the device */
    int64_t bytes_read;
    double seconds;
} fsdp_resident_model;

/* Reads every weight (-1 with err naming the file and tensor on a defect; nothing stays allocated).
 * `progress` (NULL: quiet) gets a line every 2 s while it reads. */
int fsdp_resident_load(fsdp_backend *be, const fsdp_model_source *src, fsdp_resident_model *m, FILE *progress,
                       fsdp_err *err);
void fsdp_resident_free(fsdp_backend *be, fsdp_resident_model *m);

#endif
