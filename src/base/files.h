/* Opening files named by the user without ever blocking or misreading them.
 *
 * open(2) of a FIFO blocks until the other end appears, and a character device can stream forever,
 * so every path fsdp.c reads or writes as a file (--data, --model, --resume, --metrics, checkpoints,
 * config files) is checked first with stat(2), which never blocks, and opened with O_NONBLOCK and
 * checked again with fstat(2) (the path may change in between). The messages say what the path is
 * ("a FIFO", "a directory") and which flag named it. */
#ifndef FSDP_BASE_FILES_H
#define FSDP_BASE_FILES_H

#include <stdio.h>
#include <sys/types.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "a regular file", "a directory", "a FIFO", "a character device", "a block device", "a socket",
 * "a special file" for st_mode. */
const char *fsdp_file_type_name(mode_t mode);

/* 0 when `path` exists and is a regular file (following symbolic links); -1 with err otherwise:
 * "<what> PATH is a FIFO, not a regular file", "<what> PATH: No such file or directory". `what`
 * names the flag or role ("--data", "checkpoint"). */
int fsdp_require_regular(const char *path, const char *what, fsdp_err *err);

/* 1 when `path` exists, 0 when it does not, -1 with err when it exists but is not a regular file
 * or cannot be looked at (for files that are about to be created or appended to). */
int fsdp_regular_or_absent(const char *path, const char *what, fsdp_err *err);

/* open(2) that refuses anything but a regular file without blocking: returns the descriptor (with
 * O_CLOEXEC, blocking mode restored) or -1 with err naming `what`, the path and the cause. */
int fsdp_open_regular(const char *path, int flags, mode_t mode, const char *what, fsdp_err *err);

/* The same opened for reading as a stdio stream ("rb"): NULL with err when it is not a regular file
 * or cannot be opened. */
FILE *fsdp_fopen_regular(const char *path, const char *what, fsdp_err *err);

#ifdef __cplusplus
}
#endif

#endif
