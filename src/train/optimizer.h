/* AdamW over the engine's shards, after clipping the global gradient norm.
 *
 * The optimizer owns its state, as PyTorch keeps optimizer state outside FSDP: the first and second
 * moments of every element of this rank's shards, in the master dtype, one allocation per moment,
 * laid out like the engine's shards (fsdp_shard_extent: unit u's at its view's offset). It writes
 * the shards through the engine's update visitor (fsdp_engine_update_shards), which starts the next
 * step's first gathers behind the rest of the update; the engine knows nothing of AdamW.
 *
 * Decoupled weight decay applies to each unit's decay range only (matrices and embeddings), never
 * to norms and biases. The clip coefficient is computed on the device from the global sum of squares,
 * so the step needs no host round trip. */
#ifndef FSDP_TRAIN_OPTIMIZER_H
#define FSDP_TRAIN_OPTIMIZER_H

#include "../backend/backend.h"
#include "../shard/engine.h"

typedef struct fsdp_optimizer fsdp_optimizer;

/* Device bytes the state of shards of `total_shard` elements takes on `kind`, as reserved_bytes
 * counts it (memory plans). fsdp_optimizer_create checks that it allocates exactly this. */
size_t fsdp_optimizer_memory_plan(int64_t total_shard, fsdp_dtype master_dtype, fsdp_device_kind kind);

/* Zeroed moments for the engine's shards. */
fsdp_optimizer *fsdp_optimizer_create(fsdp_backend *be, const fsdp_engine *eng);
void fsdp_optimizer_destroy(fsdp_optimizer *opt);

/* Unit u's moments on the device: its view's len elements each, in the master dtype (checkpoints). */
typedef struct {
    void *m, *v;
} fsdp_optimizer_state;
fsdp_optimizer_state fsdp_optimizer_unit_state(const fsdp_optimizer *opt, int unit);

typedef struct {
    float *sumsq; /* device: global sum of squares of the gradients (before clipping) */
    float *scale; /* device: the clip coefficient applied */
} fsdp_optimizer_scalars;

/* The two halves of a step, for a caller that looks at the gradient norm before updating (a step
 * with a non-finite norm is skipped): *sumsq of the gradients, then clipping and AdamW. */
void fsdp_optimizer_grad_sumsq(fsdp_engine *eng, const fsdp_optimizer_scalars *scalars);
void fsdp_optimizer_update(fsdp_optimizer *opt, fsdp_engine *eng, const fsdp_adamw_args *args, float max_grad_norm,
                           const fsdp_optimizer_scalars *scalars);

#endif
