/* `fsdp export`: a model as a Hugging Face model directory that transformers' from_pretrained loads
 * (config.json, generation_config.json, safetensors weights; hf_model_dir.h, safetensors_write.h).
 *
 * The weights come from an fsdp.c checkpoint (a file, or a --ckpt-dir meaning its latest), from
 * another Hugging Face directory (re-exported in another dtype or shard size), or from fsdp.c's own
 * initial values of a model for a seed (the model `fsdp train --model M --seed S` starts from).
 *
 * Collective over every rank of comm. Each tensor is split into one contiguous element range per
 * rank; in rounds of at most FSDP_EXPORT_ROUND_ELEMENTS elements per rank, every rank reads its
 * ranges (a collective parallel-HDF5 read for a checkpoint), encodes them and hands them to a writer
 * thread that pwrites them into the preallocated files while the next round is read. The files go
 * into a staging directory beside --out that rank 0 creates (io/export_dir.h), under temporary
 * names renamed once every rank wrote and synced its part; then rank 0 swaps the staging directory
 * in for --out in one rename, so a reader of --out sees the old model or the new one, never a mix,
 * and removes the old model. Rank 0 holds --out's lock throughout: a second export into it fails at
 * once. On any failure or SIGTERM/SIGINT the staging directory is removed and --out is untouched.
 * What the export writes is never what it reads (base/output_paths.h); a directory that already
 * holds a model is refused unless `force`.
 *
 * The export carries a tokenizer (io/tokenizer_export.h): --tokenizer, else a Hugging Face source
 * directory's own, else the one a checkpoint's token file was prepared with (recorded in the
 * checkpoint's identity) while that file is still there with the same hash; without one a line says
 * so and how to add it.
 *
 * FSDP_TEST_FAIL (base/fault.h) counts, on each rank, the pieces it reads (1..P), then on rank 0
 * P+1: the new model complete beside --out, and P+2: --out switched, the old model not yet removed. */
#ifndef FSDP_TRAIN_HF_EXPORT_H
#define FSDP_TRAIN_HF_EXPORT_H

#include <mpi.h>
#include <stdint.h>

#include "../base/error.h"

#define FSDP_EXPORT_ROUND_ELEMENTS (32ll << 20)

typedef struct {
    const char *checkpoint; /* checkpoint file, --ckpt-dir or Hugging Face directory; NULL with model */
    const char *model;      /* preset or config.json: fsdp.c's initial weights for `seed` */
    uint64_t seed;
    const char *out;
    int bf16;               /* else fp32 */
    int force;
    uint64_t max_shard_bytes; /* 0 = one file */
    const char *tokenizer;    /* tokenizer.json or its directory; NULL = the source's (find_tokenizer) */
} fsdp_export_options;

int fsdp_export(MPI_Comm comm, const fsdp_export_options *o, fsdp_err *err);

#endif
