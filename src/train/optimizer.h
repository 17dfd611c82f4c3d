/* AdamW over the engine's shards, after clipping the global gradient norm.
 *
 * Decoupled weight decay applies to each unit's decay range only (matrices and embeddings), never
 * to norms and biases. The clip coefficient is computed on the device from the global sum of squares,
 * so the step needs no host round trip. */
#ifndef FSDP_TRAIN_OPTIMIZER_H
#define FSDP_TRAIN_OPTIMIZER_H

#include "../backend/backend.h"
#include "../shard/engine.h"

typedef struct {
    float *sumsq; /* device: global sum of squares of the gradients (before clipping) */
    float *scale; /* device: the clip coefficient applied */
} fsdp_optimizer_scalars;

/* The two halves of a step, for a caller that looks at the gradient norm before updating (a step
 * with a non-finite norm is skipped): *sumsq of the gradients, then clipping and AdamW. */
void fsdp_optimizer_grad_sumsq(fsdp_engine *eng, const fsdp_optimizer_scalars *scalars);
void fsdp_optimizer_update(fsdp_backend *be, fsdp_engine *eng, int num_units, fsdp_dtype master_dtype,
                           fsdp_dtype compute_dtype, const fsdp_adamw_args *args, float max_grad_norm,
                           const fsdp_optimizer_scalars *scalars);
/* Both. */
void fsdp_optimizer_step(fsdp_backend *be, fsdp_engine *eng, int num_units, fsdp_dtype master_dtype,
                         fsdp_dtype compute_dtype, const fsdp_adamw_args *args, float max_grad_norm,
                         const fsdp_optimizer_scalars *scalars);

#endif
