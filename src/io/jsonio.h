/* JSON through Jansson: the one place where JSON text is read or written.
 *
 * Reading names the origin (a file path, or what the text came from) with Jansson's line and column
 * in one message: "config.json: line 3, column 7: ']' expected". Writing turns a Jansson value into
 * text with a stated real-number precision, and json_real-like constructors that accept non-finite
 * numbers (written as null) so a NaN loss never makes a record vanish. */
#ifndef FSDP_IO_JSONIO_H
#define FSDP_IO_JSONIO_H

#include <jansson.h>
#include <stddef.h>

#include "../base/args.h"
#include "../base/error.h"

/* Parses a whole file, opened through fsdp_open_regular (a FIFO or device is refused without
 * blocking); NULL with err naming the file (and line/column) on failure. */
json_t *fsdp_json_load_path(const char *path, fsdp_err *err);
/* The same with every number read as a real: for files whose integers may pass Jansson's 64-bit
 * ones (tokenizer_config.json writes "no limit" as model_max_length 1000000000000000019884624838656). */
json_t *fsdp_json_load_path_reals(const char *path, fsdp_err *err);
/* Parses len bytes of text; `origin` names the source in messages. Duplicate keys are refused. */
json_t *fsdp_json_load_text(const char *text, size_t len, const char *origin, fsdp_err *err);

/* Parses one JSON value of any kind (a bare string too; \u0000 allowed in strings), for line-based
 * inputs such as `fsdp tokenize --json` and JSON Lines records. */
json_t *fsdp_json_load_value(const char *text, size_t len, const char *origin, fsdp_err *err);
/* The JSON literal of a string of n bytes (UTF-8): malloc'ed, NULL when the bytes are not UTF-8. */
char *fsdp_json_string_literal(const char *s, size_t n);

/* A real, or null when x is not finite (Jansson refuses NaN and infinities). */
json_t *fsdp_json_number(double x);
/* A real holding the shortest decimal that reads back as the same float (1e-05, not
 * 9.9999997473787516e-06): for config fields that are floats in fsdp.c. */
json_t *fsdp_json_float(float x);

/* Text of v: compact on one line (indent 0) or indented by `indent` spaces, reals with `precision`
 * significant digits (1..17; 17 round-trips every double). Keys keep their insertion order.
 * malloc'ed; NULL only when memory runs out. */
char *fsdp_json_text(const json_t *v, int indent, int precision);

/* The values of every flag of a command as a JSON object ({"mbs": 4, "lr": 5e-05, ...}), for the
 * run record that checkpoints keep. */
json_t *fsdp_json_from_args(const fsdp_arg_spec *spec);

#endif
