/* A reader of Apache Thrift's compact protocol, the encoding of Parquet's footer and page headers
 * (io/parquet_meta.h): varints, zigzag integers, field headers, strings, list headers, and skipping
 * any value of a type not wanted. Written by hand: it is the few rules of the protocol's spec
 * (thrift/doc/specs/thrift-compact-protocol.md) that Parquet uses, and Debian packages no C Thrift
 * library that reads from memory without code generation.
 *
 * Promises: never reads outside [p, end); a truncated or malformed buffer sets `bad` (every later
 * read returns zeros), and nesting deeper than THRIFT_MAX_DEPTH is malformed (no unbounded recursion
 * on a hostile file). Callers check `bad` once after parsing a structure. */
#ifndef FSDP_IO_THRIFT_COMPACT_H
#define FSDP_IO_THRIFT_COMPACT_H

#include <stddef.h>
#include <stdint.h>

enum {
    THRIFT_STOP = 0,
    THRIFT_TRUE = 1,
    THRIFT_FALSE = 2,
    THRIFT_I8 = 3,
    THRIFT_I16 = 4,
    THRIFT_I32 = 5,
    THRIFT_I64 = 6,
    THRIFT_DOUBLE = 7,
    THRIFT_BINARY = 8,
    THRIFT_LIST = 9,
    THRIFT_SET = 10,
    THRIFT_MAP = 11,
    THRIFT_STRUCT = 12,
    THRIFT_MAX_DEPTH = 32,
};

typedef struct {
    const uint8_t *p, *end;
    int bad;
} fsdp_thrift;

/* The next field of a struct: 1 with its id and type, 0 at the struct's end (STOP). `last` is the
 * previous field's id in this struct (start at 0), as the compact protocol encodes ids as deltas. */
int fsdp_thrift_field(fsdp_thrift *t, int *last, int *id, int *type);
int64_t fsdp_thrift_int(fsdp_thrift *t);   /* i8, i16, i32 or i64 (zigzag varint; i8 one byte) of `type` */
int64_t fsdp_thrift_i8(fsdp_thrift *t);
uint64_t fsdp_thrift_varint(fsdp_thrift *t);
/* A binary/string: its bytes in the buffer (not terminated) and length. */
const uint8_t *fsdp_thrift_binary(fsdp_thrift *t, size_t *len);
/* A list or set header: its element count and element type. */
size_t fsdp_thrift_list(fsdp_thrift *t, int *elem_type);
/* Skips a value of `type` (a struct, list, set or map whole). */
void fsdp_thrift_skip(fsdp_thrift *t, int type);
/* Reads an integer field of any integer type (the caller's `type`), or skips a value of another type and
 * marks the buffer bad. */
int64_t fsdp_thrift_int_of(fsdp_thrift *t, int type);

#endif
