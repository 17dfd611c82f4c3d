/* Private to src/train/data.c: the token stream of `--packing stream` (data.h): a file's documents
 * joined with EOS, addressed by stream position without holding the document table. */
#ifndef FSDP_TRAIN_DATA_STREAM_H
#define FSDP_TRAIN_DATA_STREAM_H

#include "data.h"

/* Decides where EOS goes (one pass over the document table and the tokens around every boundary)
 * and sets d->stream_len; with d->eos_id < 0 the stream is the file's tokens as they are. */
int fsdp_stream_build(fsdp_data *d, fsdp_err *err);
/* Stream tokens [pos, pos + n) into d->tokens and their mask bytes into d->mask; n <= stream_len - pos. */
int fsdp_stream_read(fsdp_data *d, uint64_t pos, int n, fsdp_err *err);
void fsdp_stream_free(fsdp_data *d);

#endif
