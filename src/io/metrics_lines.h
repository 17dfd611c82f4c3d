/* The record loop every reader of a --metrics file shares (JSON Lines, docs/FORMATS.md).
 *
 * Promises: the file is opened as a regular file (a FIFO or a device is refused at once, never
 * waited on); each line that holds a JSON object goes to `visit`, in file order, and is released
 * after it (a visitor keeps a record with json_incref); blank lines are skipped silently and any
 * other line (a crashed run's torn last line) with one notice naming the file and line. Returns 0, or
 * -1 with one error naming the file when it cannot be opened or read. */
#ifndef FSDP_IO_METRICS_LINES_H
#define FSDP_IO_METRICS_LINES_H

#include <jansson.h>

#include "../base/error.h"

typedef void (*fsdp_metrics_visit)(json_t *record, void *ctx);

int fsdp_metrics_each_record(const char *path, fsdp_metrics_visit visit, void *ctx, fsdp_err *err);

#endif
