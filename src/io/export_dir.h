/* The directory `fsdp export` writes (--out): held by one export at a time, replaced as a whole.
 *
 * Promises (docs/FORMATS.md, "How an export replaces --out"):
 *  - One export at a time: an flock(2) on OUT/.fsdp-export.lock, taken without waiting and held for
 *    the export's life; a second export fails at once, naming the holder's host and pid. The kernel
 *    drops the lock when the holder dies, so a killed export never blocks the next one.
 *  - A reader of OUT finds the old complete model or the new complete one, never a mix: the new
 *    files are written into a sibling staging directory OUT.fsdp-export-<pid>.tmp (names no other
 *    export shares), synced, and the two directories are swapped by one renameat2(RENAME_EXCHANGE).
 *    Where the file system lacks it (NFS, Lustre), OUT is renamed aside to
 *    OUT.fsdp-export-<pid>.old and the staging directory into place: for that moment there is no
 *    OUT, and an export killed in it leaves the old model at the .old name, which the next export
 *    into OUT puts back first. The old model's files are removed only after the switch.
 *  - What OUT holds besides the model (a tokenizer.json copied in, a README, subdirectories) is
 *    kept: files are hard-linked into the staging directory before the switch, and whatever could
 *    not be (subdirectories) is moved into the new OUT right after it.
 *  - Stale temporaries: the staging and aside directories of exports that died (a pid that is no
 *    process here and a lock nobody holds) and model temporaries inside OUT ("*.safetensors.tmp",
 *    "config.json.tmp", ...) are removed when the next export into OUT holds the lock; their model
 *    files are deleted, anything else goes back into OUT.
 *  - SIGTERM, SIGINT and SIGHUP (unless ignored, as under nohup) while the files are written remove
 *    the staging directory and the lock (and an OUT this export created) before the process dies of
 *    the signal; during the switch they wait until it is done.
 * Rank 0 only; the other ranks write into the staging directory it names. */
#ifndef FSDP_IO_EXPORT_DIR_H
#define FSDP_IO_EXPORT_DIR_H

#include "../base/error.h"

#define FSDP_EXPORT_LOCK_NAME ".fsdp-export.lock"

typedef struct fsdp_export_dir fsdp_export_dir;

/* Creates OUT when missing (putting back a model a killed switch left aside), takes the lock,
 * removes stale temporaries, refuses a directory that holds fsdp.c checkpoints, a mount point, the
 * current directory, or a model unless `force`, and creates the staging directory. NULL with err
 * (nothing left behind). */
fsdp_export_dir *fsdp_export_dir_begin(const char *out, int force, fsdp_err *err);
/* The export writes tokenizer.json, tokenizer_config.json and special_tokens_map.json: OUT's own
 * are replaced with the model instead of kept. Before the switch. */
void fsdp_export_dir_replace_tokenizer(fsdp_export_dir *d);
/* Where the new files go (a directory of its own, empty at first). */
const char *fsdp_export_dir_staging(const fsdp_export_dir *d);
/* After every file is complete and synced in the staging directory: keeps OUT's other files, makes
 * the staging directory OUT in one rename and syncs the parent. On failure OUT is as it was. */
int fsdp_export_dir_switch(fsdp_export_dir *d, fsdp_err *err);
/* Removes the old model (after a switch) or the staging directory (without one), releases the lock,
 * removes an OUT this export created and left empty, restores the signal handlers and frees d; a
 * signal that came during the switch is then acted on. NULL is allowed. */
void fsdp_export_dir_end(fsdp_export_dir *d);

/* The files of a model directory that an export replaces: config.json, generation_config.json,
 * model.safetensors, model.safetensors.index.json, model-NNNNN-of-NNNNN.safetensors, and each of
 * them with ".tmp" (temporaries of earlier fsdp.c versions, which wrote inside OUT). */
int fsdp_export_replaces(const char *name);
/* The files readers of a model directory read (train/eval/generate --init-from, export of a model
 * directory): config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
 * *.safetensors, *.safetensors.index.json. */
int fsdp_model_dir_reads(const char *name);

#endif
