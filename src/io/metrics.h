/* The --metrics file: one JSON object per line (JSON Lines), written by rank 0 and flushed after
 * every line so that a crashed run keeps what it measured. */
#ifndef FSDP_IO_METRICS_H
#define FSDP_IO_METRICS_H

#include <jansson.h>

#include "../base/error.h"

typedef struct fsdp_metrics fsdp_metrics;

/* Opens for writing (truncate) or appending (a resumed run continues the same file). */
fsdp_metrics *fsdp_metrics_open(const char *path, int append, fsdp_err *err);
/* Writes `record` (a JSON object) as one compact line, reals with 10 significant digits. */
int fsdp_metrics_write(fsdp_metrics *m, const json_t *record, fsdp_err *err);
void fsdp_metrics_close(fsdp_metrics *m);

#endif
