/* Documents for `fsdp prepare`, read one at a time from the input files whatever their size:
 *  - text, one document per file (the whole file);
 *  - text, documents separated by blank lines (lines of only spaces, tabs or carriage returns), as
 *    WikiText-style corpora are: a document is its lines, each with its newline;
 *  - JSON Lines, one document per line: a string field of each object (--field);
 *  - Parquet, one document per row: a string column (--field), streamed row group by row group
 *    (io/parquet.h); a null is skipped and counted (fsdp_docs_nulls);
 *  - Alpaca records (instruction, input, output) as a JSON array, as JSON Lines or as the columns of
 *    a Parquet file (found by its PAR1 magic); a record whose instruction or output is null is skipped
 *    and counted, a null input is empty.
 * Text must be valid UTF-8 without NUL bytes (JSON strings may hold \u0000). Every refusal is one
 * message naming the file and the line (or the record of a JSON array): a directory, a FIFO or device
 * (refused without opening it, so nothing blocks), an unreadable file, a malformed JSON line, a
 * missing field, a binary file, a file without documents, a document larger than the bound. */
#ifndef FSDP_IO_DOCUMENTS_H
#define FSDP_IO_DOCUMENTS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"

typedef enum {
    FSDP_DOCS_TEXT_FILE,
    FSDP_DOCS_TEXT_BLANK_LINES,
    FSDP_DOCS_JSONL,
    FSDP_DOCS_ALPACA,
    FSDP_DOCS_PARQUET
} fsdp_docs_format;

typedef struct {
    const char *text; /* text formats and jsonl: the document; alpaca: the instruction */
    size_t len;
    const char *input, *output; /* alpaca (input may be empty) */
    size_t input_len, output_len;
    long line;                  /* line where it starts (alpaca JSON array: the record's number; Parquet: the row) */
} fsdp_document;

typedef struct fsdp_docs_reader fsdp_docs_reader;

/* Checks the path (regular, readable) without blocking on FIFOs; max_document bounds one document's
 * bytes (a JSON array file's too). */
int fsdp_docs_check_path(const char *path, fsdp_err *err);
fsdp_docs_reader *fsdp_docs_open(const char *path, fsdp_docs_format format, const char *field, size_t max_document,
                                 fsdp_err *err);
/* 1 and the next document (valid until the next call), 0 at the end, -1 on an error. A file that ends
 * without any document is an error. */
int fsdp_docs_next(fsdp_docs_reader *r, fsdp_document *d, fsdp_err *err);
/* Bytes of the file consumed so far (for progress). */
uint64_t fsdp_docs_bytes(const fsdp_docs_reader *r);
/* Records skipped so far because their text (Alpaca: instruction or output) was null (Parquet). */
uint64_t fsdp_docs_nulls(const fsdp_docs_reader *r);
void fsdp_docs_close(fsdp_docs_reader *r);

#endif
