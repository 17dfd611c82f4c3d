/* The one rule for every path a command writes: it is never a path the command reads.
 *
 * A slip in an output flag (`--metrics d.bin` for `--data d.bin`, `--out tokenizer.json`) must not
 * truncate the input it names, so every command that writes files lists what it will write and
 * what it reads, and calls fsdp_outputs_apart before it opens anything for writing. An output that
 * is an input is a usage error (exit status 2): one line naming both flags and paths, and nothing
 * written. "Is" means the same file by device and inode, symbolic links followed, so a hard link, a
 * symbolic link or another spelling of the path (./d.bin, ../run/d.bin) is caught like the name.
 *
 * A path may stand for a directory's files: those of its entries that a filter accepts (the files
 * a model directory holds, those a checkpoint directory manages); a path that names a file is that
 * file whatever the filter. Standard input and output take part through their descriptors
 * (`fsdp tokenize < f >> f` would read what it appends). Only existing files can collide: a path
 * that does not exist yet is nobody's input. The check only calls stat(2) and reads directories, so
 * a FIFO among the paths cannot block it. */
#ifndef FSDP_BASE_OUTPUT_PATHS_H
#define FSDP_BASE_OUTPUT_PATHS_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which entries of a directory count: 1 for a name that does. */
typedef int (*fsdp_name_filter)(const char *name);

typedef struct {
    const char *flag;         /* as the user gave it: "--data", "--out", "standard output" */
    const char *path;         /* NULL: not given (skipped), unless `stream` */
    fsdp_name_filter entries; /* a directory's entries that count (NULL: every entry) */
    int stream;               /* 1: the open descriptor `fd` rather than a path */
    int fd;
} fsdp_io_path;

#define FSDP_IO_FILE(flag, path) ((fsdp_io_path){(flag), (path), NULL, 0, -1})
#define FSDP_IO_DIR(flag, path, filter) ((fsdp_io_path){(flag), (path), (filter), 0, -1})
#define FSDP_IO_STREAM(flag, fd) ((fsdp_io_path){(flag), NULL, NULL, 1, (fd)})

/* 0 when no output is any input; else -1 with a usage error:
 * "--metrics d.bin would write over --data d.bin: both name one file (...); nothing was written, give
 * --metrics another path". A stream that is not a regular file (a terminal, a pipe) collides with
 * nothing. */
int fsdp_outputs_apart(const fsdp_io_path *outputs, int num_outputs, const fsdp_io_path *inputs, int num_inputs,
                       fsdp_err *err);

#ifdef __cplusplus
}
#endif

#endif
