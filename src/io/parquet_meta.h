/* Parquet's metadata: the footer (FileMetaData: the schema, the row groups and their column chunks)
 * and page headers, decoded from Thrift's compact protocol (io/thrift_compact.h) into the few fields
 * `fsdp prepare` reads (parquet-format's parquet.thrift names them). Written by hand, as the rest of
 * io/parquet*.c: no C library for Parquet is packaged in Debian (Arrow's C++ and GLib libraries are
 * not), and prepare needs only flat string columns.
 *
 * Promises: the footer is read and checked whole before any page (magic at both ends, its length
 * within the file, every structure well formed); a malformed footer or page header is one message
 * naming the file; nothing outside the buffers given is read. */
#ifndef FSDP_IO_PARQUET_META_H
#define FSDP_IO_PARQUET_META_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"

/* parquet.thrift's enums, the values used here */
enum { PQ_BYTE_ARRAY = 6 };
enum { PQ_REQUIRED = 0, PQ_OPTIONAL = 1, PQ_REPEATED = 2 };
enum { PQ_CONVERTED_UTF8 = 0 };
enum { PQ_DATA_PAGE = 0, PQ_INDEX_PAGE = 1, PQ_DICTIONARY_PAGE = 2, PQ_DATA_PAGE_V2 = 3 };
enum { PQ_PLAIN = 0, PQ_PLAIN_DICTIONARY = 2, PQ_RLE = 3, PQ_BIT_PACKED = 4, PQ_RLE_DICTIONARY = 8 };
enum { PQ_UNCOMPRESSED = 0, PQ_SNAPPY = 1, PQ_GZIP = 2, PQ_ZSTD = 6 };

/* A top-level field of the schema. */
typedef struct {
    const char *name; /* in the footer buffer, not terminated */
    size_t name_len;
    int is_group;     /* a struct, list or map */
    int type;         /* physical type (-1 for a group) */
    int repetition;
    int utf8;         /* annotated as text: ConvertedType UTF8 or LogicalType STRING */
    int leaf;         /* its column's index among the leaves (a group: its first leaf) */
} fsdp_pq_field;

/* A column chunk of a row group. */
typedef struct {
    int codec;
    int type;
    int external;             /* file_path set: the data is in another file */
    int64_t num_values;
    int64_t start, size;      /* the chunk's bytes in the file: its first page and total_compressed_size */
} fsdp_pq_chunk;

typedef struct {
    uint8_t *footer;          /* the FileMetaData bytes */
    size_t footer_len;
    fsdp_pq_field *fields;
    int num_fields;
    int num_leaves;
    int64_t num_rows;
    const uint8_t **row_groups; /* where each RowGroup struct starts in the footer */
    int num_row_groups;
} fsdp_pq_meta;

/* Reads and decodes the footer of the open file `fd` of `size` bytes (path for messages); a footer
 * above max_footer bytes is refused. */
int fsdp_pq_meta_read(int fd, const char *path, uint64_t size, size_t max_footer, fsdp_pq_meta *m, fsdp_err *err);
void fsdp_pq_meta_free(fsdp_pq_meta *m);
/* Row group g: its row count and the chunk of leaf column `leaf`. */
int fsdp_pq_row_group(const fsdp_pq_meta *m, int g, int leaf, int64_t *rows, fsdp_pq_chunk *c, const char *path,
                      fsdp_err *err);
/* The names of the top-level fields, comma-separated, for messages. */
void fsdp_pq_field_names(const fsdp_pq_meta *m, char *buf, size_t cap);

typedef struct {
    int type;
    int64_t uncompressed, compressed; /* page bytes after the header */
    int64_t num_values;
    int encoding;
    int def_encoding;                 /* v1: definition levels' encoding */
    int64_t def_len, rep_len;         /* v2: level bytes (never compressed) before the values */
    int is_compressed;                /* v2: the values are compressed (default 1) */
    size_t header_len;
} fsdp_pq_page;

/* Decodes a page header from buf[0..n): 1 and the header, 0 when it does not decode from these bytes
 * (cut short: read more; malformed when n already reaches the chunk's end), -1 when its values are
 * impossible. */
int fsdp_pq_page_header(const uint8_t *buf, size_t n, fsdp_pq_page *h);

#endif
