/* Shared by the checkpoint modules (ckpt_hdf5.c, ckpt_pio.c, ckpt_write.c, ckpt_read.c,
 * ckpt_verify.c); not part of the public interface (checkpoint.h).
 *
 * Division of work: HDF5 handles only the file's metadata, on one rank (rank 0), serially: it
 * creates the file with every dataset's storage allocated up front (contiguous, never filled), or
 * opens it and describes every dataset (shape, type, byte offset, checksum). The ranks then move
 * the tensor bytes themselves with pread/pwrite at those offsets (ckpt_pio.c): no MPI-IO, no
 * collective inside an I/O call, so a failing disk is an errno on the rank that saw it, and the
 * bytes can be written by a background thread while training goes on. */
#ifndef FSDP_IO_CKPT_INTERNAL_H
#define FSDP_IO_CKPT_INTERNAL_H

#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"

enum { KIND_PARAM, KIND_EXP_AVG, KIND_EXP_AVG_SQ, NUM_KINDS };
extern const char *const FSDP_CKPT_KIND_GROUP[NUM_KINDS]; /* NULL, "exp_avg", "exp_avg_sq" */

/* One collective operation on one file. */
typedef struct {
    MPI_Comm comm;
    int rank, size;
    const char *file; /* named in messages */
    fsdp_err err;     /* this rank's failure, until agreed */
} ckio;

void ckio_init(ckio *c, MPI_Comm comm, const char *file);
/* All ranks learn whether any failed (the lowest failing rank's message); 0 when none did. */
int ckio_agree(ckio *c);
/* Copies the agreed message to the caller's err and returns -1. */
int ckio_give_error(const ckio *c, fsdp_err *err);
/* Bounded collectives (FSDP_SYNC_TIMEOUT, src/base/watchdog.h). */
void ckio_bcast(ckio *c, void *buf, int count, MPI_Datatype type, int root, const char *what);
void ckio_allreduce(ckio *c, void *buf, int count, MPI_Datatype type, MPI_Op op, const char *what);

/* ---- pieces (ckpt_write.c) ---- */

/* Checks the tensor table and this rank's pieces, indexing them by tensor (by_tensor[t] or NULL).
 * Writing needs every buffer; reading only `param`. */
int ckpt_check_pieces(ckio *c, const fsdp_ckpt_tensor *tensors, int num_tensors, const fsdp_ckpt_piece *pieces,
                      int num_pieces, int writing, const fsdp_ckpt_piece **by_tensor);
/* Collective: every rank's (start, count) per tensor and kind, [rank][tensor][kind][2]; count 0
 * where the rank has no buffer for that kind. */
int64_t *ckpt_gather_ranges(ckio *c, int num_tensors, const fsdp_ckpt_piece **by_tensor);
/* qsort order of (start, count) pairs by start. */
int ckpt_by_start(const void *a, const void *b);

/* ---- HDF5 (ckpt_hdf5.c), rank 0 only unless said otherwise ---- */

/* Records a failed HDF5 call with HDF5's innermost description; `what` names the object. */
int ckh_failed(ckio *c, const char *call, const char *what);
int ckh_check(ckio *c, int64_t rc, const char *expr, const char *what);
#define H5OK(c, call, what) ckh_check((c), (int64_t)(call), #call, (what))
void ckh_close(ckio *c, hid_t *id, herr_t (*fn)(hid_t), const char *name, const char *what);
#define CKH_CLOSE(c, id, fn, what) ckh_close((c), &(id), fn, #fn, (what))

/* File access through the POSIX (sec2) driver without HDF5's own file locks (the checkpoint
 * directory has its lock), large datasets aligned to 4 KiB. */
hid_t ckh_fapl(ckio *c);
/* "optimizer/exp_avg/NAME" etc. */
void ckh_label(char *buf, size_t cap, int kind, const char *name);

int ckh_write_int_attr(ckio *c, hid_t loc, const char *name, int64_t value, int is_unsigned);
int ckh_write_string_attr(ckio *c, hid_t loc, const char *name, const char *value);
/* 1 present, 0 absent, -1 failed. */
int ckh_has_attr(ckio *c, hid_t loc, const char *name);
char *ckh_read_string_attr(ckio *c, hid_t loc, const char *name);
int ckh_read_int_attr(ckio *c, hid_t loc, const char *name, int is_unsigned, void *out);

/* Opens `path` read-only after checking, without blocking, that it is a regular HDF5 file; checks
 * the format attributes. Sets *version. -1 with c->err set otherwise. Serial: any rank may call it. */
hid_t ckh_open(ckio *c, const char *path, int64_t *version);
/* Reads and range-checks the root attributes (format version `version`). */
int ckh_read_meta(ckio *c, hid_t file, int64_t version, fsdp_ckpt_meta *meta);
/* Range and consistency checks of root attributes (also applied before writing them). */
int ckh_check_meta(ckio *c, const fsdp_ckpt_meta *meta);
/* The checksum of the root attributes (docs/FORMATS.md). */
uint64_t ckh_meta_checksum(const fsdp_ckpt_meta *meta, int64_t version);
/* The checksum of the 'identity' attribute, chained from the file's attributes checksum so that an
 * identity copied from another checkpoint does not match (docs/FORMATS.md). */
uint64_t ckh_identity_checksum(const char *identity, uint64_t attributes_checksum);

/* What rank 0 learned about one dataset, broadcast to every rank. */
typedef struct {
    int64_t offset;     /* byte offset of its contiguous little-endian float32 storage; -1: read via HDF5 */
    int64_t dims[2];
    int32_t ndim, exists;
    int32_t is_float, has_checksum;
    uint64_t checksum;
} ckpt_dset;

/* Fills *d for dataset `label` under loc (exists = 0 when there is none). */
int ckh_describe(ckio *c, hid_t loc, const char *label, const char *name, ckpt_dset *d);

/* Reads the flat range [start, start + n) of a dataset of t's shape as float32 through HDF5 (the
 * path for files another tool wrote chunked, compressed or in another float type). */
int ckh_read_range(ckio *c, hid_t dset, const fsdp_ckpt_tensor *t, int64_t start, int64_t n, float *out);

/* ---- parallel positioned I/O (ckpt_pio.c): no MPI, no HDF5; safe off the main thread ---- */

typedef struct {
    int64_t file_offset; /* bytes */
    int64_t count;       /* elements */
    void *host;          /* `count` elements of the host dtype; NULL on a read: hash and discard */
    uint64_t first;      /* element index of host[0] in its tensor (for the checksum) */
    int slot;            /* checksum accumulator (tensor * NUM_KINDS + kind), -1: not hashed */
    int dataset;         /* tensor * NUM_KINDS + kind of the bytes (for messages) */
    int nonneg;          /* a second moment (exp_avg_sq): a negative element is refused too */
} ckpt_extent;

/* Values no checkpoint holds: a non-finite element anywhere, a negative one (below -0) where
 * `nonneg`. The index of the first in bits[0, n), or -1. Every reader and the writer ask this of
 * the elements they hash, so a file edited with its checksums recomputed is still refused. */
int64_t ckpt_first_bad(const uint32_t *bits, int64_t n, int nonneg);
/* The one-line message for the bad element `bits` at `index` of tensor `label`, read (or, with
 * `writing`, about to be written) by `rank`. */
void ckpt_bad_value_text(char *buf, size_t cap, const char *file, const char *label, uint32_t bits, uint64_t index,
                         int rank, int writing);

typedef struct ckpt_pio ckpt_pio;

/* Starts worker threads that read (writing = 0) or write the extents of `fd` with conversions
 * between the host dtype and float32 on the way and hash sums into num_slots accumulators. A write
 * refuses non-finite values (naming the slot's tensor through `slot_label`) and ends with fsync.
 * Owns nothing passed in; the extents and host buffers must outlive it. `fault_step` lets the test
 * hook FSDP_TEST_FAIL inject errors into the transfer of that checkpoint. direct_fd: for writes, the
 * same file opened with O_DIRECT (whole blocks bypass the page cache), or -1; readers open the file
 * themselves (with O_DIRECT unless FSDP_CKPT_IO=buffered). */
ckpt_pio *ckpt_pio_start(int fd, int direct_fd, const char *path, int writing, const ckpt_extent *extents, int num_extents,
                         fsdp_dtype host_dtype, int num_slots,
                         void (*slot_label)(void *ctx, int slot, char *buf, size_t cap), void *slot_ctx,
                         int fault_step);
/* 1 when every worker has finished (err set when one failed), 0 while running. */
int ckpt_pio_done(ckpt_pio *p, fsdp_err *err);
/* Waits until finished (fatal when no chunk moves for FSDP_SYNC_TIMEOUT seconds: stalled
 * storage); 0 or -1 with err. */
int ckpt_pio_wait(ckpt_pio *p, fsdp_err *err);
/* Seconds since any worker last moved a chunk. */
double ckpt_pio_idle_s(const ckpt_pio *p);
int64_t ckpt_pio_bytes_done(const ckpt_pio *p);
/* When the last worker finished (fsdp_now() clock), 0 while running. */
double ckpt_pio_finished_at(const ckpt_pio *p);
int64_t ckpt_pio_bytes_total(const ckpt_pio *p);
/* The hash sums (num_slots) once done. */
const uint64_t *ckpt_pio_sums(const ckpt_pio *p);
/* Asks the workers to stop after their current chunk. */
void ckpt_pio_cancel(ckpt_pio *p);
/* Waits for the workers (after cancel or done) and frees. */
void ckpt_pio_free(ckpt_pio *p);

#endif
