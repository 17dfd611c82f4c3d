/* The --metrics file: one JSON object per line (JSON Lines), written by rank 0 and flushed after
 * every line so that a crashed run keeps what it measured; and, with --tensorboard, the same records
 * as TensorBoard scalars (io/tfevents.h): every number of a record (and of its objects, one level
 * down) under "train/KEY" (a step's record), "eval/KEY" (an evaluation's, "eval_" taken off: eval/loss,
 * eval/ppl) or "summary/KEY" (the run's summary, at its final step). */
#ifndef FSDP_IO_METRICS_H
#define FSDP_IO_METRICS_H

#include <jansson.h>

#include "../base/error.h"

typedef struct fsdp_metrics fsdp_metrics;

/* Opens for writing (truncate) or appending (a resumed run continues the same file). */
fsdp_metrics *fsdp_metrics_open(const char *path, int append, fsdp_err *err);
/* Adds TensorBoard event files in `dir` to *m (made without a JSON Lines file when *m is NULL). A
 * fresh run (resumed 0) refuses a folder that holds event files already: TensorBoard would show both
 * runs' steps as one; a resumed run adds a new file beside them. */
int fsdp_metrics_tensorboard(fsdp_metrics **m, const char *dir, int resumed, fsdp_err *err);
/* Writes `record` (a JSON object) as one compact line, reals with 10 significant digits. */
int fsdp_metrics_write(fsdp_metrics *m, const json_t *record, fsdp_err *err);
void fsdp_metrics_close(fsdp_metrics *m);

#endif
