/* What `fsdp train` and `fsdp eval` write, kept apart from what they read (base/output_paths.h).
 *
 * Written: --metrics (truncated by a fresh run, appended to by a resumed one and by eval) and the
 * files --ckpt-dir manages (step-*.h5, latest, *.tmp, .lock; --keep and --overwrite delete step
 * files). Read: --data, --eval-data, --model (a config.json or the directory holding one),
 * --init-from (a checkpoint, or a model directory's config, tokenizer and weights) and --resume
 * (a checkpoint, or with auto the files of --ckpt-dir). --metrics may be none of these, nor a file
 * --ckpt-dir manages; --ckpt-dir's files may be none of the inputs but --resume's (resuming reads
 * the directory it writes, by design). Checked before anything is opened for writing: one line
 * naming both flags, exit status 2. */
#ifndef FSDP_TRAIN_RUN_OUTPUTS_H
#define FSDP_TRAIN_RUN_OUTPUTS_H

#include <mpi.h>

#include "../base/error.h"
#include "options.h"

/* Collective: rank 0 looks, every rank gets its verdict. */
int fsdp_run_outputs_apart(MPI_Comm comm, const fsdp_train_options *o, fsdp_err *err);

/* Rank 0, right before --metrics is opened: the folders of `path` that do not exist yet are made (as
 * --ckpt-dir is made, and as `report --out` makes its parents), so that `--metrics runs/a/m.jsonl`
 * works in a fresh tree. A part of the path that exists and is not a directory (or a link to one)
 * is refused in one line naming it; nothing is made above it. */
int fsdp_run_outputs_metrics_dir(const char *path, fsdp_err *err);

#endif
