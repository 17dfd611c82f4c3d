/* TensorBoard event files (--tensorboard DIR): what TensorFlow's and PyTorch's SummaryWriter write, so
 * that `tensorboard --logdir` (or its EventAccumulator) reads a run live.
 *
 * A file DIR/events.out.tfevents.<unix time>.<host> (".N" added should that name exist) is a sequence
 * of TFRecords: the data's length as a little-endian uint64, the masked CRC32C of those 8 bytes, the
 * data, the masked CRC32C of the data (masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8). Each record
 * is an Event protocol buffer: wall_time (field 1, double), step (2, int64) and either file_version
 * (3, "brain.Event:2", the first record) or a Summary (5) of Values with a tag (1) and a simple_value
 * (2, float). The encoding is written by hand: it is a few varints and fixed-width fields, and no C
 * library for TensorBoard's format is packaged in Debian; CRC32C (Castagnoli) is by hand too, as
 * Debian's C CRC32C library is not in every release fsdp.c builds on (zlib's crc32 is another
 * polynomial).
 *
 * Promises: every event is written whole and flushed to the kernel before the call returns (a live
 * TensorBoard sees each step; a crash leaves whole records); a write error is an fsdp_err naming the
 * file. Rank 0 alone writes (the caller's rule). */
#ifndef FSDP_IO_TFEVENTS_H
#define FSDP_IO_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"

typedef struct fsdp_tfevents fsdp_tfevents;

/* Makes DIR (and its missing parents) and a new event file in it, starting with the file_version
 * record. `flag` names the option for messages. */
fsdp_tfevents *fsdp_tfevents_open(const char *dir, const char *flag, fsdp_err *err);
/* One event at `step`: the scalars tags[i] = values[i]. */
int fsdp_tfevents_scalars(fsdp_tfevents *w, int64_t step, const char *const *tags, const double *values, int n,
                          fsdp_err *err);
/* The file's path. */
const char *fsdp_tfevents_path(const fsdp_tfevents *w);
void fsdp_tfevents_close(fsdp_tfevents *w);
/* 1 when DIR holds an event file (a fresh run there would mix its steps with an earlier run's). */
int fsdp_tfevents_present(const char *dir);

/* CRC32C of data (exposed for the unit test). */
uint32_t fsdp_crc32c(const void *data, size_t n);

#endif
