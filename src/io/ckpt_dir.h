/* The checkpoint directory (--ckpt-dir): step files "step-%08d.h5", a text file "latest" naming the
 * newest complete one, temporaries "*.tmp" of saves in progress, and ".lock", held by the one run
 * that owns the directory.
 *
 * Promises: 'latest' only ever names a file that was complete and verified when it was written
 * (fsdp_ckpt_commit renames a file only after every byte and checksum is on disk, and the pointer is
 * replaced atomically after that); pruning never deletes the file 'latest' names nor any file newer
 * than it; two runs never write into one directory at the same time. */
#ifndef FSDP_IO_CKPT_DIR_H
#define FSDP_IO_CKPT_DIR_H

#include <mpi.h>
#include <stdint.h>

#include "../base/error.h"

/* Writes dir/latest atomically (write a temporary, fsync, rename). Rank 0 only. */
int fsdp_ckpt_set_latest(const char *dir, const char *file_name, fsdp_err *err);
/* Resolves dir/latest to a path in `out`. Returns 1 when found, 0 when the directory has no latest
 * pointer, -1 on a malformed or dangling pointer. */
int fsdp_ckpt_find_latest(const char *dir, char *out, int cap, fsdp_err *err);
/* Deletes the oldest step files so that `keep` remain among those up to the one 'latest' names
 * (keep <= 0 keeps all). Never deletes the file 'latest' names or anything newer; deletes nothing
 * without a 'latest'. Rank 0 only. */
int fsdp_ckpt_prune(const char *dir, int keep, fsdp_err *err);

typedef struct {
    long long step;
    char name[256];
} fsdp_ckpt_file;

/* The step files of dir, newest first, in a malloc'ed array (free()). */
int fsdp_ckpt_list(const char *dir, fsdp_ckpt_file **out, int *count, fsdp_err *err);
/* The step of a "step-<digits>.h5" name, or -1 for any other name. */
long long fsdp_ckpt_step_of(const char *name);

/* The run's claim on the directory: an flock(2) on dir/.lock, released by the kernel when the
 * process dies, so a crashed run never blocks the next one. The file names the holder's host and
 * pid for the message a second run gets. Rank 0 only. */
typedef struct fsdp_ckpt_lock fsdp_ckpt_lock;
/* NULL with err: "--ckpt-dir D is in use by another run (host H, pid P)", or that D is not
 * writable. On file systems without locks, warns and returns a lock that holds nothing. */
fsdp_ckpt_lock *fsdp_ckpt_lock_acquire(const char *dir, fsdp_err *err);
void fsdp_ckpt_lock_release(fsdp_ckpt_lock *lock);

/* Removes the temporaries of saves that never finished ("step-*.h5.tmp", "latest.tmp"); call while
 * holding the lock. Calls `removed` with each path. Rank 0 only. */
int fsdp_ckpt_remove_stale(const char *dir, void (*removed)(const char *path), fsdp_err *err);

/* Collective: every rank can create files in dir and sees what rank 0 writes there (the bytes of a
 * checkpoint are written by every rank into one file, so the directory must be on storage all
 * nodes share). Fills *free_bytes (rank 0's view, agreed) with the space left. */
int fsdp_ckpt_dir_check(MPI_Comm comm, const char *dir, int64_t *free_bytes, fsdp_err *err);

#endif
