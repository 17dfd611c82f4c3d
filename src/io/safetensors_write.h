/* Writing a model as safetensors, by many processes at once (docs/FORMATS.md, "safetensors").
 *
 * The plan (fsdp_st_plan_build) is a pure function of the tensor list, the dtype and the shard
 * size, so every rank computes the same one: which file each tensor goes to and at which byte.
 * Files follow save_pretrained: one "model.safetensors", or when the tensors' bytes exceed the
 * shard size, "model-00001-of-0000N.safetensors" files filled in tensor order (a tensor that does not
 * fit in the current file starts the next; one larger than the shard size gets a file of its own)
 * plus "model.safetensors.index.json". Inside a file, tensors are in name order, back to back, and
 * the header holds {"__metadata__": {"format": "pt"}} then the tensors in that order, padded with
 * spaces to a multiple of 8 bytes.
 *
 * Writing: one process creates every file under a temporary name "<name>.tmp" with its header and
 * its full size preallocated (fsdp_st_create); then every process opens them (fsdp_st_writer_open),
 * encodes its own elements (fsdp_st_encode: fp32, or bf16 rounded to nearest even) and writes them
 * with pwrite at their computed offsets (fsdp_st_pwrite, thread-safe), syncs and closes; then one
 * process renames the temporaries to their final names and writes the index (fsdp_st_publish).
 * `fsdp export` does all of this in a staging directory of its own (export_dir.h), which replaces
 * the model directory as a whole once complete, or is removed on failure. */
#ifndef FSDP_IO_SAFETENSORS_WRITE_H
#define FSDP_IO_SAFETENSORS_WRITE_H

#include <stdint.h>

#include "safetensors.h"

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[FSDP_ST_MAX_DIMS];
} fsdp_st_spec;

typedef struct {
    fsdp_st_dtype dtype; /* F32 or BF16 */
    int num_tensors;
    fsdp_st_spec *tensors;   /* copies of the names */
    int *file_of;            /* per tensor */
    uint64_t *offset;        /* per tensor: absolute byte offset in its file */
    int num_files;
    char (*file_names)[64];  /* "model.safetensors" or "model-00001-of-00003.safetensors" */
    char **headers;          /* per file: 8-byte length + padded JSON */
    uint64_t *header_bytes;  /* per file, length field included */
    uint64_t *file_bytes;    /* per file: header + data */
    uint64_t total_bytes;    /* data bytes of every tensor (the index's total_size) */
    int64_t total_params;
} fsdp_st_plan;

/* dtype: FSDP_ST_F32 or FSDP_ST_BF16. max_shard_bytes: bytes of tensor data per file before
 * another starts (save_pretrained's rule; 0 = one file whatever the size). */
int fsdp_st_plan_build(const fsdp_st_spec *tensors, int num_tensors, fsdp_st_dtype dtype, uint64_t max_shard_bytes,
                       fsdp_st_plan *plan, fsdp_err *err);
void fsdp_st_plan_free(fsdp_st_plan *plan);

/* One process: creates DIR/<file>.tmp for every file, header written, size preallocated. */
int fsdp_st_create(const char *dir, const fsdp_st_plan *plan, fsdp_err *err);

typedef struct {
    const fsdp_st_plan *plan;
    int *fds;
    char **paths; /* the temporaries, for messages */
} fsdp_st_writer;

/* Every process: opens the temporaries for writing. */
int fsdp_st_writer_open(fsdp_st_writer *w, const char *dir, const fsdp_st_plan *plan, fsdp_err *err);
/* Bytes of `count` elements in the plan's dtype. */
static inline uint64_t fsdp_st_plan_bytes(const fsdp_st_plan *p, int64_t count) {
    return (uint64_t)count * (p->dtype == FSDP_ST_BF16 ? 2u : 4u);
}
/* Encodes fp32 values in the plan's dtype (bf16: round to nearest even, NaN kept), on OpenMP threads. */
void fsdp_st_encode(const fsdp_st_plan *p, const float *in, int64_t count, void *out);
/* Writes encoded elements [start, start + count) of tensor `tensor`. Thread-safe. */
int fsdp_st_pwrite(fsdp_st_writer *w, int tensor, int64_t start, int64_t count, const void *bytes, fsdp_err *err);
/* fsync (when `sync`) and close; reports the first failure. */
int fsdp_st_writer_close(fsdp_st_writer *w, int sync, fsdp_err *err);

/* One process, after every writer closed: renames the temporaries to their final names, writes
 * model.safetensors.index.json when there are several files (temporary, then renamed), removes a
 * stale index when there is one file, and syncs the directory. */
int fsdp_st_publish(const char *dir, const fsdp_st_plan *plan, fsdp_err *err);

/* Writes `len` bytes to DIR/name.tmp and fsyncs it (removed again on failure). */
int fsdp_write_file_tmp(const char *dir, const char *name, const void *data, size_t len, fsdp_err *err);
/* Renames DIR/name.tmp to DIR/name. */
int fsdp_rename_tmp(const char *dir, const char *name, fsdp_err *err);
/* Both: atomically replaces DIR/name with `len` bytes. */
int fsdp_write_file_atomic(const char *dir, const char *name, const void *data, size_t len, fsdp_err *err);
/* fsync of a directory, so that renames in it survive a crash. */
int fsdp_sync_dir(const char *dir, fsdp_err *err);

#endif
