/* Checkpointing a training run, and the checks a run makes before it allocates or trains.
 *
 *   fsdp_ckpt_setup     before step 1 (collective): --ckpt-dir is created, locked for this run,
 *                       cleared of temporaries of dead runs and checked (every rank can write there
 *                       and sees the same files, one checkpoint fits); --resume is resolved (auto:
 *                       'latest', or without it the newest step file that verifies; never a fresh
 *                       start on top of existing checkpoints) and loaded, or the weights initialised.
 *                       A resume continues only what the checkpoint was: its record of data and
 *                       config must be this run's (run_identity.h) unless --allow-data-change /
 *                       --allow-config-change, and a --resume FILE older than --ckpt-dir's newest is
 *                       refused unless --rollback, which then moves the newer files (and a 'latest'
 *                       naming one) into --ckpt-dir/rolled-back-<time>/: renamed, never deleted.
 *   fsdp_ckpt_boundary  after every step (collective, one small allreduce): agrees on signals and on
 *                       the background save in flight; finishes a save whose bytes every rank has
 *                       written (the checksums are combined, the file renamed, 'latest' moved,
 *                       old files pruned); starts a save when one is due. A save snapshots the
 *                       shards into host memory (the only pause of training) and writes them while
 *                       the next steps run; a new save, the end of the run and a signal wait for the
 *                       one in flight.
 *   fsdp_ckpt_settle    after an agreed error: the save in flight is completed.
 *   fsdp_ckpt_teardown  on the way out, whatever happened.
 *
 * A save that fails on any rank (full disk, I/O error, non-finite weights) stops the run on every
 * rank with one message; the previous checkpoint and 'latest' are untouched. Waits are bounded by
 * FSDP_SYNC_TIMEOUT, including a rank's own writer making no progress. */
#ifndef FSDP_TRAIN_CHECKPOINTING_H
#define FSDP_TRAIN_CHECKPOINTING_H

#include "../io/checkpoint.h"
#include "trainer.h"

int fsdp_ckpt_setup(fsdp_trainer *t, int *resumed, fsdp_err *err);
/* *stop: the signal that asked the run to stop (0: none); the checkpoint is then written. */
int fsdp_ckpt_boundary(fsdp_trainer *t, int *stop, fsdp_err *err);
/* After an error every rank agreed on (all alive): completes the save in flight, whose state was
 * good when it was snapshot, so that 'latest' keeps up. Collective; its own failure is only noted. */
void fsdp_ckpt_settle(fsdp_trainer *t);
void fsdp_ckpt_teardown(fsdp_trainer *t);

/* Shards <-> checkpoint pieces (src/train/checkpointing.c). ---- */

/* The host buffer a snapshot of this rank's shards takes (master, m, v of every unit, master dtype
 * as stored on the device), and the pieces that describe it. */
size_t fsdp_trainer_snapshot_bytes(const fsdp_trainer *t);
/* The same from the shard's elements and the master dtype's size on the device (before the engine
 * exists: the memory plan's engine.total_shard). */
size_t fsdp_snapshot_bytes(int64_t shard_elems, size_t master_size);
/* Copies the shards into `host` (fsdp_trainer_snapshot_bytes long) and waits for the copy. */
void fsdp_trainer_snapshot(fsdp_trainer *t, void *host);
/* The element type of snapshot buffers as the checkpoint writer sees them. */
fsdp_dtype fsdp_trainer_snapshot_dtype(const fsdp_trainer *t);
/* The tensor table (malloc'ed; names point into the layout) and this rank's pieces of a snapshot
 * buffer (malloc'ed, *count of them; none on replicas other than the first). */
fsdp_ckpt_tensor *fsdp_trainer_tensor_table(const fsdp_trainer *t);
fsdp_ckpt_piece *fsdp_trainer_pieces(const fsdp_trainer *t, void *host, int writers_only, int *count);
/* The checkpoint's root attributes for the current step; free with fsdp_trainer_meta_free. */
void fsdp_trainer_meta(const fsdp_trainer *t, fsdp_ckpt_meta *meta);
void fsdp_trainer_meta_free(fsdp_ckpt_meta *meta);
/* Restores a checkpoint read into a snapshot-layout buffer `host` (NULL: one is allocated). */
int fsdp_trainer_load_into(fsdp_trainer *t, const char *path, void *host, fsdp_err *err);

/* Refuses, before allocating, a run whose host memory (model state on the CPU backend, checkpoint
 * snapshots on either) exceeds what the node's host has (src/train/host_memory.c). Collective. */
int fsdp_host_memory_check(fsdp_trainer *t, fsdp_err *err);
/* Host bytes fsdp_trainer_init_weights stages the initial weights through: the largest unit shard in
 * fp32, and again in the master dtype when its elements are not 4 bytes. */
size_t fsdp_trainer_init_staging_bytes(int64_t largest_shard, size_t master_size);

#endif
