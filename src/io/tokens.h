/* Token files: the binary format fsdp.c trains on with --data FILE (docs/FORMATS.md), all fields
 * little-endian.
 *
 *   offset  size  field
 *        0     8  magic "FSDPTOK\0"
 *        8     4  version (uint32) = 1 or 2
 *       12     4  bytes per token (uint32): 2 (uint16) or 4 (uint32)
 *       16     8  number of tokens N (uint64)
 *       24     8  vocabulary size (uint64): every id is < this
 *   version 1:
 *       32    32  reserved, zero
 *   version 2:
 *       32     8  number of documents D (uint64)
 *       40     8  tokenizer hash (uint64): FNV-1a 64 of the tokenizer.json's canonical JSON; 0 = unknown
 *       48     4  flags (uint32): bit 0 = a loss mask follows the documents; bit 1 = a tokenizer record ends
 *                 the file
 *       52    12  reserved, zero
 *       64     -  the N tokens
 *   version 2, after the tokens:
 *              8(D+1)  document starts (uint64 token positions): 0, ..., N (document d is [s[d], s[d+1]))
 *              ceil(N/8)  loss mask (when flag bit 0): bit i%8 of byte i/8 set = token i counts in the loss
 *              L + 4   tokenizer record (when flag bit 1): the absolute path of the tokenizer prepare read
 *                      (a tokenizer.json or its directory; L bytes, no NUL), then L (uint32), so that
 *                      `fsdp export` can find it again
 *
 * A version 1 file is one document without a mask. A file whose size disagrees with its header, or
 * whose header or document table is malformed, is rejected when it is opened; an id >= the
 * vocabulary size is reported when a read reaches it. */
#ifndef FSDP_IO_TOKENS_H
#define FSDP_IO_TOKENS_H

#include <stdint.h>

#include "../base/error.h"

#define FSDP_TOKENS_MAGIC "FSDPTOK"
#define FSDP_TOKENS_HEADER_BYTES 64

typedef struct {
    int fd;
    char path[1024];
    int version;
    int bytes_per_token;
    uint64_t count;
    uint64_t vocab_size;
    uint64_t num_documents;  /* 1 for a version 1 file */
    uint64_t tokenizer_hash; /* 0: unknown (version 1, or written without a tokenizer) */
    int has_mask;
    uint64_t documents_offset, mask_offset; /* byte offsets in the file (version 2) */
    uint64_t tokenizer_offset, tokenizer_len; /* the tokenizer record (0, 0: none) */
    char tokenizer_path[4096];              /* its path; "" when the file has none */
} fsdp_token_file;

int fsdp_tokens_open(const char *path, fsdp_token_file *f, fsdp_err *err);
/* Reads tokens [start, start+n) into out; fails (naming the file and the position) when the range is
 * past the end or an id is >= the header's vocabulary size. Thread-safe (pread). */
int fsdp_tokens_read(const fsdp_token_file *f, uint64_t start, int n, int32_t *out, fsdp_err *err);
/* The token positions where documents [first, first+n] start (n+1 values; the last may be the end,
 * N, when first+n = D). */
int fsdp_tokens_documents(const fsdp_token_file *f, uint64_t first, uint64_t n, uint64_t *starts, fsdp_err *err);
/* The loss mask of tokens [start, start+n): 1 = counted (every token of a file without a mask). */
int fsdp_tokens_read_mask(const fsdp_token_file *f, uint64_t start, int n, uint8_t *out, fsdp_err *err);
void fsdp_tokens_close(fsdp_token_file *f);

/* Writes a version 1 file atomically (temporary name, then rename). bytes_per_token 0 picks the
 * smallest width that holds vocab_size. */
int fsdp_tokens_write(const char *path, const uint32_t *tokens, uint64_t count, uint64_t vocab_size,
                      int bytes_per_token, fsdp_err *err);

/* Streaming version 2 writer: documents are appended one at a time, memory stays bounded (document
 * starts and mask bits are spooled to temporary files beside the output), and nothing appears under
 * `path` until fsdp_tokens_writer_finish renames the complete file into place. */
typedef struct fsdp_tokens_writer fsdp_tokens_writer;
fsdp_tokens_writer *fsdp_tokens_writer_open(const char *path, uint64_t vocab_size, uint64_t tokenizer_hash,
                                            int with_mask, fsdp_err *err);
/* mask: one byte per token (0 or 1), or NULL when every token counts. */
int fsdp_tokens_writer_add(fsdp_tokens_writer *w, const uint32_t *ids, const uint8_t *mask, uint64_t n,
                           fsdp_err *err);
uint64_t fsdp_tokens_writer_count(const fsdp_tokens_writer *w);
/* Records the tokenizer's path (absolute) in the file (flag bit 1), before fsdp_tokens_writer_finish. */
int fsdp_tokens_writer_set_tokenizer(fsdp_tokens_writer *w, const char *tokenizer, fsdp_err *err);
/* Completes the file and renames it into place; always frees w. */
int fsdp_tokens_writer_finish(fsdp_tokens_writer *w, fsdp_err *err);
/* Removes the temporary files and frees w. */
void fsdp_tokens_writer_abort(fsdp_tokens_writer *w);

#endif
