/* Private to src/model/model.c and arena.c: the model's state and the arena walk that sizes and
 * carves its activations. */
#ifndef FSDP_MODEL_MODEL_INTERNAL_H
#define FSDP_MODEL_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "block.h"
#include "model.h"

/* Saved activations of one transformer layer (pointers into the arena; block.h says what each is).
 * Under recomputation the tensors a layer does not keep point into the one shared layer's worth
 * (model.h). */
typedef fsdp_block_acts layer_acts;

struct fsdp_model {
    fsdp_backend *be;
    fsdp_model_config cfg;
    const fsdp_layout *layout;
    int B, T, N, C, F, Hq, Hkv, D, QKV, Q, V;
    int chunk_rows;
    fsdp_attn attn;
    fsdp_recompute recompute;
    fsdp_block_ctx blk;    /* the block's shapes and kinds (fsdp_block_kind_of), over all N rows */
    int rms, swiglu, rope; /* blk.kind's, for brevity */
    int pos_offset;        /* learned positions: table row of position 0 */
    int padding_idx;       /* token embedding row without input gradient, or -1 */
    size_t ae, ge; /* bytes per act / grad element */
    fsdp_dropout_rates rates; /* of training micro-batches (the shape's) */
    int training;             /* fsdp_model_set_dropout: drop at `rates` */
    uint64_t drop_seed;
    int64_t sample_base;

    void *arena;
    size_t arena_bytes;
    int32_t *tokens, *targets;
    float *cos_sin;
    layer_acts *layers;
    void *res_out; /* [N,C] output of the last layer */
    void *lnf;
    float *lnf_mean, *lnf_rstd;
    /* backward scratch, shared by all layers */
    void *dres, *dln, *dqkv, *datt, *dfc, *dh, *logits;
    float *losses;
    /* With residual dropout only: a block's attention or MLP output before the norm that drops it
     * into the residual stream, and in backward the gradient of that output. */
    void *branch, *dbranch;
};

/* The shapes the walk needs. */
typedef struct {
    int B, T, N, C, F, Hq, Hkv, D, QKV, Q, V, L, chunk, rms, swiglu, qk_norm;
    int residual_dropout; /* branch buffers exist */
    int fp8_amax;         /* tensorwise FP8: each layer keeps its products' amax (block.h) */
    fsdp_attn attn;
    fsdp_recompute recompute;
    size_t ae;
} fsdp_model_dims;

fsdp_model_dims fsdp_model_make_dims(const fsdp_model_config *cfg, const fsdp_model_shape *s, size_t ae);

/* The walk over the arena: with base NULL it only measures (bytes, and *parts when not NULL);
 * with a base it also points m's tensors into it. The same walk does both, so the plan is the
 * allocation. Returns the bytes used. */
size_t fsdp_model_arena_walk(const fsdp_model_dims *d, char *base, fsdp_model *m, fsdp_activation_parts *parts);

#endif
