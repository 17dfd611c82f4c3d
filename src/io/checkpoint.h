/* Checkpoints: one HDF5 file per checkpoint, written and read by every rank at disk speed, each
 * tensor checksummed.
 *
 * File layout (docs/FORMATS.md):
 *   /<hf name>                         fp32 master weights, natural shape, e.g.
 *                                      /model.layers.0.self_attn.q_proj.weight [2048, 2048]
 *   /optimizer/exp_avg/<hf name>       AdamW first moment, same shape
 *   /optimizer/exp_avg_sq/<hf name>    AdamW second moment, same shape
 *   every dataset: attribute checksum (uint64, ckpt_checksum.h), contiguous storage
 *   root attributes: format = "fsdp.c checkpoint", format_version = 2, step, samples_seen, seed,
 *   config, schedule, run, world_size, strategy, checksum_algorithm, attributes_checksum; and, in
 *   files written since they existed, identity (what trained it: its data and the config fields
 *   that change the computation, JSON) with identity_checksum (chained from attributes_checksum).
 *   Older files without the pair are still read: meta.identity_json is then NULL.
 *
 * The checkpoint knows nothing of shards: each rank hands over "pieces", flat row-major element
 * ranges of named tensors, and gets pieces back on reading. Rank 0 alone talks to HDF5 (the
 * file's metadata, serially); every rank moves its own bytes with pread/pwrite at the datasets'
 * offsets (ckpt_internal.h). Every wait for another rank is bounded by FSDP_SYNC_TIMEOUT.
 *
 * Writing happens in stages so that the bytes can go to disk while training continues:
 *   fsdp_ckpt_begin    collective, quick: rank 0 creates "<path>.tmp" with every dataset's storage
 *                      reserved (out of space is found here), every rank learns its offsets;
 *   fsdp_ckpt_start    local: worker threads write this rank's pieces (no MPI, no HDF5), hashing
 *                      them and refusing non-finite values; the pieces' buffers must stay
 *                      unchanged until the writer is done;
 *   fsdp_ckpt_done     local poll;
 *   fsdp_ckpt_commit   collective, once every rank is done: the ranks agree on every rank's outcome,
 *                      combine the checksums; rank 0 stores them, syncs, renames to <path>.
 * A file under its final name is therefore always complete and verified. On any failure the
 * temporary file is removed and every rank returns -1 with the same message (naming the rank,
 * file and cause); a file that was published before is never touched. */
#ifndef FSDP_IO_CHECKPOINT_H
#define FSDP_IO_CHECKPOINT_H

#include <mpi.h>
#include <stdint.h>

#include "../base/dtype.h"
#include "../base/error.h"
#include "ckpt_dir.h" /* the checkpoint directory: 'latest', step files, the lock */

#define FSDP_CKPT_FORMAT "fsdp.c checkpoint"
#define FSDP_CKPT_FORMAT_VERSION 2

typedef struct {
    const char *name; /* Hugging Face name */
    int ndim;         /* 1 or 2 */
    int64_t shape[2];
} fsdp_ckpt_tensor;

typedef struct {
    int tensor;       /* index into the tensor table */
    int64_t start;    /* first element, row-major */
    int64_t count;    /* number of elements */
    void *param;      /* host buffers of `count` elements of the call's host dtype (fp32 unless */
    void *exp_avg;    /* said otherwise); exp_avg/exp_avg_sq may be NULL when the optimizer */
    void *exp_avg_sq; /* state is not wanted (reading weights only) */
} fsdp_ckpt_piece;

typedef struct {
    int64_t step;
    int64_t samples_seen;
    uint64_t seed;
    int world_size;
    char strategy[32];
    char *config_json;   /* malloc'ed strings (fsdp_ckpt_meta_free) */
    char *schedule_json;
    char *run_json;
    int format_version;  /* set when read: 1 = written before checksums existed (nothing to verify) */
    /* JSON {"data": {...}, "config": {...}} (docs/FORMATS.md), malloc'ed; NULL: not recorded (a file
     * written before checkpoints carried it; a writer passing NULL writes none). The reader checks
     * its form and checksum; what it means is the trainer's (src/train/run_identity.h). */
    char *identity_json;
} fsdp_ckpt_meta;

/* ---- writing ---- */

typedef struct fsdp_ckpt_writer fsdp_ckpt_writer;

/* Collective over comm. Every rank passes the same tensor table; pieces are this rank's (any rank
 * may pass none; at most one piece per tensor per rank) and together cover every tensor exactly
 * once. host_dtype: FSDP_F32, or FSDP_BF16 for buffers of raw bf16 (uint16) values, written as
 * fp32. NULL with err (agreed) on failure, with nothing left on disk. */
fsdp_ckpt_writer *fsdp_ckpt_begin(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors,
                                  int num_tensors, const fsdp_ckpt_piece *pieces, int num_pieces,
                                  fsdp_dtype host_dtype, const fsdp_ckpt_meta *meta, fsdp_err *err);
/* Starts this rank's background writer. Local; returns at once. */
void fsdp_ckpt_start(fsdp_ckpt_writer *w);
/* Local. 1 when this rank's writer has finished (failed or not), 0 while it runs. */
int fsdp_ckpt_done(fsdp_ckpt_writer *w);
/* Seconds since this rank's writer last made progress, and its bytes written and to write. */
double fsdp_ckpt_idle_s(const fsdp_ckpt_writer *w);
int64_t fsdp_ckpt_bytes_done(const fsdp_ckpt_writer *w);
int64_t fsdp_ckpt_bytes_total(const fsdp_ckpt_writer *w);
/* Seconds from fsdp_ckpt_begin to the end of this rank's writer (its fsync included); 0 before. */
double fsdp_ckpt_write_s(const fsdp_ckpt_writer *w);
/* Collective, after fsdp_ckpt_done returned 1 on this rank (it waits for its writer otherwise).
 * Publishes the file or removes it; frees w. 0, or -1 with the agreed err. */
int fsdp_ckpt_commit(fsdp_ckpt_writer *w, fsdp_err *err);
/* Local, for exits: stops this rank's writer, removes the temporary file (every rank may try) and
 * frees w. */
void fsdp_ckpt_abandon(fsdp_ckpt_writer *w);

/* begin + start + wait + commit: a synchronous write of fp32 pieces. */
int fsdp_ckpt_write(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                    const fsdp_ckpt_piece *pieces, int num_pieces, const fsdp_ckpt_meta *meta, fsdp_err *err);

/* ---- reading ---- */

/* Collective. Opens `path`, checks that it is an fsdp.c checkpoint of a version this build reads and
 * that every root attribute is present, in range and unchanged since writing (attributes_checksum),
 * and fills meta. A missing, non-regular, truncated, foreign or edited file gives -1 with a
 * message naming the file (and the attribute). */
int fsdp_ckpt_read_meta(MPI_Comm comm, const char *path, fsdp_ckpt_meta *meta, fsdp_err *err);

/* Collective. Checks that every tensor exists with the expected shape (the message names the first
 * that does not) and fills the pieces' fp32 buffers; exp_avg/exp_avg_sq are read where non-NULL.
 * Pieces of different ranks may overlap. Every tensor that the ranks' pieces cover completely is
 * verified against its checksum: a damaged tensor gives -1 naming the file and the tensor. A
 * non-finite element, or a negative one in exp_avg_sq, gives -1 naming the tensor and the element,
 * checksum or not (a file edited with its checksums recomputed). */
int fsdp_ckpt_read(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                   fsdp_ckpt_piece *pieces, int num_pieces, fsdp_err *err);
/* The same into buffers of host_dtype (FSDP_BF16: raw bf16, rounded to nearest even). */
int fsdp_ckpt_read_as(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                      fsdp_ckpt_piece *pieces, int num_pieces, fsdp_dtype host_dtype, fsdp_err *err);

void fsdp_ckpt_meta_free(fsdp_ckpt_meta *meta);

/* ---- verifying ---- */

typedef struct {
    fsdp_ckpt_meta meta;
    int format_version;
    int num_datasets;      /* float datasets in the file */
    int num_weights;       /* of which model weights (outside /optimizer) */
    int has_optimizer;     /* /optimizer/exp_avg and /optimizer/exp_avg_sq present */
    int checksummed;       /* 1: every dataset's checksum matched; 0: a version-1 file without them */
    int64_t bytes;         /* bytes of tensor data */
    int64_t weight_elements;
} fsdp_ckpt_info;

/* Collective: checks the whole file (attributes as fsdp_ckpt_read_meta, then every dataset read
 * in full, split between the ranks, against its checksum and for values no checkpoint holds: a
 * non-finite element anywhere, a negative one in exp_avg_sq, each named with the tensor and the
 * first such element) and describes it. 0, or -1 with one
 * message naming the file and the tensor or attribute. info->meta is filled on success (free it
 * with fsdp_ckpt_meta_free). */
int fsdp_ckpt_verify(MPI_Comm comm, const char *path, fsdp_ckpt_info *info, fsdp_err *err);

#endif
