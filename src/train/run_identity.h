/* What trained a checkpoint, recorded in it (attribute 'identity', docs/FORMATS.md) so that
 * --resume refuses to continue it on something else without being told:
 *
 *   data    what its ids meant: synthetic tokens of a vocabulary, or a token file's tokenizer (its
 *           hash and vocabulary). Ids of another tokenizer are other words to the trained
 *           embeddings, and nothing else would notice: the training just goes on.
 *   config  the values of the config fields that change the computation but no shape (shapes are
 *           fsdp_model_config_same_shape's): the norm's epsilon, RoPE (rope_theta and
 *           rope_scaling), the dropout rates the config sets, the EOS id (inserted between
 *           documents) and the pad id (the embedding's padding_idx, whose row gets no gradient).
 *           Keyed by their config.json names, valued as config.json writes them.
 *
 * A difference is refused in one line naming the data or the fields, with both values, unless
 * --allow-data-change / --allow-config-change says it is meant; then one line says what changed. A
 * checkpoint without a record (written before checkpoints carried one) resumes with a one-line
 * note that nothing could be checked. Deterministic: every rank reaches the same verdict from the
 * same record. */
#ifndef FSDP_TRAIN_RUN_IDENTITY_H
#define FSDP_TRAIN_RUN_IDENTITY_H

#include <stddef.h>

#include "../base/error.h"
#include "../model/config.h"
#include "data.h"

/* This run's record, JSON text (malloc'ed). */
char *fsdp_identity_text(const fsdp_model_config *cfg, const fsdp_data *data);

/* What --resume checks before it reads the tensors. `saved`: the checkpoint's record, NULL when it
 * has none. `model` and `data_flag` name this run's --model and --data in messages. 0 (notes
 * printed on rank 0), or -1 with one line. */
typedef struct {
    const char *path, *model;
    const fsdp_model_config *cfg;
    const fsdp_data *data;
    const char *data_flag;
    int allow_data_change, allow_config_change;
} fsdp_identity_resume;
int fsdp_identity_check_resume(const fsdp_identity_resume *r, const char *saved, fsdp_err *err);

/* fsdp eval --checkpoint: one line (rank 0) when the evaluated data's ids are not those the
 * checkpoint was trained on (another tokenizer or vocabulary, or synthetic tokens): the loss is then
 * no measure of the model. Nothing when the record is missing or agrees. */
void fsdp_identity_note_eval(const char *path, const char *saved, const fsdp_data *data, const char *data_flag);

/* fsdp verify: the record's config values must be those of the checkpoint's own config (`cfg`,
 * parsed from it); `desc` gets what the record says, for the verify line ("no record ..." when
 * `saved` is NULL). 0, or -1 with one line naming the file and the field. */
int fsdp_identity_verify(const char *path, const char *saved, const fsdp_model_config *cfg, char *desc, size_t cap,
                         fsdp_err *err);

#endif
