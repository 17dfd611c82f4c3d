/* A small JSON reader (into a tree) and a string builder for writing JSON.
 *
 * The reader accepts RFC 8259 JSON (UTF-8, \u escapes including surrogate pairs) and reports the
 * first syntax error as "line L, column C: <what>". Numbers are kept as double and as the original
 * text, so integers up to 2^53 are exact. */
#ifndef FSDP_IO_JSON_H
#define FSDP_IO_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { FSDP_JSON_NULL, FSDP_JSON_BOOL, FSDP_JSON_NUMBER, FSDP_JSON_STRING, FSDP_JSON_ARRAY,
               FSDP_JSON_OBJECT } fsdp_json_type;

typedef struct fsdp_json fsdp_json;
struct fsdp_json {
    fsdp_json_type type;
    int boolean;
    double number;
    char *string;        /* STRING: the decoded text (NUL-terminated) */
    fsdp_json *items;    /* ARRAY and OBJECT: `count` values */
    char **keys;         /* OBJECT: `count` keys */
    int count;
};

/* Parses `len` bytes. Returns NULL and writes "line L, column C: <what>" into errbuf on error. */
fsdp_json *fsdp_json_parse(const char *text, size_t len, char *errbuf, size_t errcap);
void fsdp_json_free(fsdp_json *v);
/* Member of an object (last one wins for duplicate keys), or NULL. */
const fsdp_json *fsdp_json_get(const fsdp_json *obj, const char *key);

/* Growable string for building JSON text. */
typedef struct {
    char *buf;
    size_t len, cap;
} fsdp_sb;
void fsdp_sb_init(fsdp_sb *sb);
void fsdp_sb_free(fsdp_sb *sb);
void fsdp_sb_printf(fsdp_sb *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a quoted, escaped JSON string. */
void fsdp_sb_json_string(fsdp_sb *sb, const char *s);
/* Appends a number that round-trips (%.17g), or null for NaN/inf. */
void fsdp_sb_json_number(fsdp_sb *sb, double x);

/* Reads a whole file into a NUL-terminated buffer (free with free()). Returns NULL and writes
 * "<path>: <strerror>" into errbuf on failure. */
char *fsdp_read_file(const char *path, size_t *len, char *errbuf, size_t errcap);

#endif
