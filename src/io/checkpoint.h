/* Checkpoints: one parallel-HDF5 file per checkpoint, written and read collectively over MPI-IO.
 *
 * File layout (docs/FORMATS.md):
 *   /<hf name>                         fp32 master weights, natural shape, e.g.
 *                                      /model.layers.0.self_attn.q_proj.weight [2048, 2048]
 *   /optimizer/exp_avg/<hf name>       AdamW first moment, same shape
 *   /optimizer/exp_avg_sq/<hf name>    AdamW second moment, same shape
 *   root attributes: format = "fsdp.c checkpoint", format_version = 1, step (completed optimizer
 *   steps), samples_seen (samples consumed: the data position), seed (RNG state: every random draw
 *   is a function of the seed and a counter), config (the model as Hugging Face config.json text),
 *   schedule (the LR schedule as JSON), run (the run's flags as JSON), world_size and strategy (the
 *   layout that wrote it, for information: any layout can read it).
 *
 * The checkpoint knows nothing of shards: each rank hands over "pieces", flat row-major element
 * ranges of named tensors, and gets pieces back on reading. Writing goes to "<path>.tmp" and is
 * renamed to <path> only when every rank has finished; on failure the temporary file is removed and
 * every rank returns -1 with the same message. */
#ifndef FSDP_IO_CHECKPOINT_H
#define FSDP_IO_CHECKPOINT_H

#include <mpi.h>
#include <stdint.h>

#include "../base/error.h"

#define FSDP_CKPT_FORMAT "fsdp.c checkpoint"
#define FSDP_CKPT_FORMAT_VERSION 1

typedef struct {
    const char *name; /* Hugging Face name */
    int ndim;         /* 1 or 2 */
    int64_t shape[2];
} fsdp_ckpt_tensor;

typedef struct {
    int tensor;        /* index into the tensor table */
    int64_t start;     /* first element, row-major */
    int64_t count;     /* number of elements */
    float *param;      /* host buffers of `count` floats; exp_avg/exp_avg_sq may be NULL when the */
    float *exp_avg;    /* optimizer state is not wanted (reading weights only) */
    float *exp_avg_sq;
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
} fsdp_ckpt_meta;

/* Collective over comm. Every rank passes the same tensor table; pieces are this rank's (any rank
 * may pass none; at most one piece per tensor per rank). */
int fsdp_ckpt_write(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                    const fsdp_ckpt_piece *pieces, int num_pieces, const fsdp_ckpt_meta *meta, fsdp_err *err);

/* Collective. Opens `path`, checks it is an fsdp.c checkpoint of a version this build reads, and
 * fills meta. A missing, truncated or foreign file gives -1 with a message naming the file. */
int fsdp_ckpt_read_meta(MPI_Comm comm, const char *path, fsdp_ckpt_meta *meta, fsdp_err *err);

/* Collective. Checks that every tensor exists with the expected shape (the message names the first
 * that does not) and fills the pieces' buffers; exp_avg/exp_avg_sq are read where non-NULL. */
int fsdp_ckpt_read(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                   fsdp_ckpt_piece *pieces, int num_pieces, fsdp_err *err);

void fsdp_ckpt_meta_free(fsdp_ckpt_meta *meta);

/* The checkpoint directory: files "step-%08lld.h5" and a text file "latest" naming the newest. */
/* Writes dir/latest atomically (rank 0 only; call on rank 0). */
int fsdp_ckpt_set_latest(const char *dir, const char *file_name, fsdp_err *err);
/* Resolves dir/latest to a path in `out`. Returns 1 when found, 0 when the directory has no latest
 * pointer, -1 on a malformed pointer. */
int fsdp_ckpt_find_latest(const char *dir, char *out, int cap, fsdp_err *err);
/* Deletes the oldest step-*.h5 files so that `keep` remain (keep <= 0 keeps all). Rank 0 only. */
int fsdp_ckpt_prune(const char *dir, int keep, fsdp_err *err);

#endif
