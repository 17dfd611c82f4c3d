/* Token files: the binary format fsdp.c trains on with --data FILE (docs/FORMATS.md).
 *
 *   offset  size  field
 *        0     8  magic "FSDPTOK\0"
 *        8     4  version (uint32, little-endian) = 1
 *       12     4  bytes per token (uint32): 2 (uint16) or 4 (uint32)
 *       16     8  number of tokens (uint64)
 *       24     8  vocabulary size (uint64): every id is < this
 *       32    32  reserved, zero
 *       64     -  the tokens, little-endian
 *
 * A file whose size disagrees with its header, or whose header is malformed, is rejected when it is
 * opened; an id >= the vocabulary size is reported when a read reaches it. */
#ifndef FSDP_IO_TOKENS_H
#define FSDP_IO_TOKENS_H

#include <stdint.h>

#include "../base/error.h"

#define FSDP_TOKENS_MAGIC "FSDPTOK"
#define FSDP_TOKENS_HEADER_BYTES 64

typedef struct {
    int fd;
    char path[1024];
    int bytes_per_token;
    uint64_t count;
    uint64_t vocab_size;
} fsdp_token_file;

int fsdp_tokens_open(const char *path, fsdp_token_file *f, fsdp_err *err);
/* Reads tokens [start, start+n) into out; fails (naming the file and the position) when the range is
 * past the end or an id is >= the header's vocabulary size. Thread-safe (pread). */
int fsdp_tokens_read(const fsdp_token_file *f, uint64_t start, int n, int32_t *out, fsdp_err *err);
void fsdp_tokens_close(fsdp_token_file *f);
/* Writes a token file atomically (temporary name, then rename). bytes_per_token 0 picks the
 * smallest width that holds vocab_size. */
int fsdp_tokens_write(const char *path, const uint32_t *tokens, uint64_t count, uint64_t vocab_size,
                      int bytes_per_token, fsdp_err *err);

#endif
