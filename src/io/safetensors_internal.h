/* Pieces of the safetensors reader shared by its files (safetensors.c: framing, headers, reads;
 * safetensors_index.c: model.safetensors.index.json). Not for use outside src/io. */
#ifndef FSDP_IO_SAFETENSORS_INTERNAL_H
#define FSDP_IO_SAFETENSORS_INTERNAL_H

#include "safetensors.h"

char *fsdp_st_strdup(const char *s);
/* pread of exactly n bytes, retrying on EINTR; -1 on failure (errno 0: the file ended first). */
int fsdp_st_pread_full(int fd, void *buf, size_t n, uint64_t off);
/* Opens a regular file for reading without blocking on FIFOs; refuses anything else by name. */
int fsdp_st_open_regular(const char *path, int *fd, uint64_t *size, fsdp_err *err);
/* Opens one .safetensors file, checks its header and data, and adds its tensors to the set. */
int fsdp_st_add_file(fsdp_st_set *s, const char *path, fsdp_err *err);
/* Sorts the set's tensors by name. */
void fsdp_st_sort(fsdp_st_set *s);
/* Reads an index and adds every file it names, checking the map against the files' headers. */
int fsdp_st_open_index(fsdp_st_set *s, const char *index_path, fsdp_err *err);

#endif
