/* Rows of Parquet files: the values of a few top-level string columns, row by row, streamed row group
 * by row group and page by page, for `fsdp prepare` (io/documents.h). What is read: flat columns
 * (REQUIRED or OPTIONAL, not nested) of BYTE_ARRAY annotated as UTF-8 (ConvertedType UTF8 or
 * LogicalType STRING); PLAIN, PLAIN_DICTIONARY and RLE_DICTIONARY encodings; data pages v1 and v2;
 * UNCOMPRESSED, SNAPPY, GZIP and ZSTD pages; definition levels (a null is a value with `null` set);
 * any number of row groups. The reader is hand-written (io/parquet_meta.h, io/parquet_page.h,
 * io/thrift_compact.h) because no C library for Parquet is packaged in Debian.
 *
 * Memory: the footer, and per column the current page (compressed and decompressed) and the column
 * chunk's dictionary, each refused above `max_bytes` (prepare gives it --max-memory's bound on one
 * document). Every refusal is one message naming the file, and the row group and column where it
 * applies: not Parquet, a truncated footer, a missing column (the columns found listed), a column not
 * UTF-8 BYTE_ARRAY, an unsupported codec or encoding, a malformed page. */
#ifndef FSDP_IO_PARQUET_H
#define FSDP_IO_PARQUET_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"

typedef struct fsdp_parquet fsdp_parquet;

typedef struct {
    const char *s; /* valid until the next call; not terminated */
    size_t len;
    int null;      /* a null (or the column is absent and optional) */
} fsdp_pq_value;

/* Opens `path` and finds the columns (top-level names); a name with optional[i] set may be absent
 * (its values then read as null). `flag` names the option that chose the columns, for messages. */
fsdp_parquet *fsdp_parquet_open(const char *path, const char *const *columns, const int *optional, int num_columns,
                                const char *flag, size_t max_bytes, fsdp_err *err);
/* 1 and the next row's values (one per column), 0 after the last row, -1 on an error. */
int fsdp_parquet_next(fsdp_parquet *p, fsdp_pq_value *values, fsdp_err *err);
/* The row last returned (1-based over the file), for messages. */
int64_t fsdp_parquet_row(const fsdp_parquet *p);
/* Bytes of the file read so far (for progress). */
uint64_t fsdp_parquet_bytes(const fsdp_parquet *p);
void fsdp_parquet_close(fsdp_parquet *p);

#endif
