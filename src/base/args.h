/* Declarative long-flag parsing for the subcommands.
 *
 * A command describes its flags in a table; fsdp_args_parse fills the destinations, rejects unknown
 * flags, missing values, malformed numbers and values out of range with a message naming the flag,
 * and prints the generated --help text. Flags take `--name VALUE` or `--name=VALUE`; booleans take
 * no value (`--name`) or an explicit `--name=yes|no`. Choice values match case-insensitively. An
 * unknown flag that is Hugging Face's name for one of the command's flags (`--learning_rate`,
 * `--max_steps`, `--bf16`, ...) or ours spelled with '_' is answered with our name. */
#ifndef FSDP_BASE_ARGS_H
#define FSDP_BASE_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "error.h"

typedef enum {
    FSDP_ARG_INT,    /* int, within [min, max] */
    FSDP_ARG_INT64,  /* int64_t, within [min, max] */
    FSDP_ARG_FLOAT,  /* double, within [min, max] */
    FSDP_ARG_STRING, /* const char * pointing into argv */
    FSDP_ARG_CHOICE, /* const char * set to the table's spelling of one of `choices` */
    FSDP_ARG_BOOL    /* int 0/1 */
} fsdp_arg_type;

typedef struct {
    const char *name;    /* without the dashes: "mbs" */
    fsdp_arg_type type;
    void *dest;
    const char *metavar; /* shown in help: "N", "FILE" */
    const char *help;    /* one or more sentences; the default is appended automatically */
    double min, max;     /* numeric range; ignored when min > max */
    /* For FSDP_ARG_CHOICE: NULL-terminated list of accepted values. */
    const char *const *choices;
    int seen;            /* set by the parser when the flag was given */
} fsdp_arg;

typedef struct {
    const char *command;  /* "train" */
    const char *summary;  /* one line */
    const char *usage;    /* "fsdp train [FLAGS]" */
    const char *epilogue; /* text after the flag list, may be NULL */
    fsdp_arg *args;
    int num_args;
} fsdp_arg_spec;

/* Returns 0 on success, 1 when --help was printed to `help_out` (caller exits 0), -1 on error (err set,
 * status 2). argv[0] is the subcommand name and is skipped. */
int fsdp_args_parse(fsdp_arg_spec *spec, int argc, char **argv, FILE *help_out, fsdp_err *err);
void fsdp_args_print_help(const fsdp_arg_spec *spec, FILE *out);
/* The flag named `name` in the spec (NULL if none): lets callers ask whether a flag was given. */
const fsdp_arg *fsdp_args_find(const fsdp_arg_spec *spec, const char *name);

#endif
