/* Where a unit's parameters sit inside its flat buffer (the offsets of layout.h), for the code of
 * src/model that computes with them: the training forward/backward (model.c) and the decoder with a
 * KV cache (kv_decode.c). Internal to src/model.
 *
 * Both views work on any buffer laid out like the unit (gathered weights, their gradients, a
 * resident copy), in any element size: the pointer is the base plus the element offset times esize. */
#ifndef FSDP_MODEL_UNIT_PARAMS_H
#define FSDP_MODEL_UNIT_PARAMS_H

#include <stddef.h>

#include "layout.h"

/* Module `mod`'s weight (or bias) inside unit `unit`'s flat buffer at `base`, or NULL when the
 * model has no such tensor (a projection without bias, an RMSNorm's bias). */
static inline void *fsdp_unit_param(const fsdp_layout *l, int unit, fsdp_module mod, int bias, const void *base,
                                    size_t esize) {
    const fsdp_unit_desc *u = &l->units[unit];
    int i = bias ? u->bias[mod] : u->weight[mod];
    if (i < 0 || !base) return NULL; /* !base: no gradient buffer (forward only) */
    return (char *)base + (size_t)l->params[i].offset * esize;
}

/* The tensors of one transformer block. */
typedef struct {
    void *wqkv, *wo, *w1, *w2;       /* w1: gate|up (SwiGLU) or fc1 (ReLU); w2: down or fc2 */
    void *bqkv, *bo, *b1, *b2;       /* NULL where the projection has no bias */
    void *ln1w, *ln1b, *ln2w, *ln2b; /* ln*b: LayerNorm only */
    void *qnorm, *knorm;             /* per-head q and k norm weights [head_dim] (Qwen3), else NULL */
} fsdp_block_params;

static inline fsdp_block_params fsdp_block_view(const fsdp_layout *l, int swiglu, int layer, const void *base,
                                                size_t esize) {
    int u = fsdp_unit_block(l, layer);
    /* q|k|v and gate|up are adjacent (layout.c), so the first of each is the fused tensor. */
    fsdp_module first_fc = swiglu ? FSDP_MOD_GATE : FSDP_MOD_UP;
    fsdp_block_params p;
    p.wqkv = fsdp_unit_param(l, u, FSDP_MOD_Q, 0, base, esize);
    p.wo = fsdp_unit_param(l, u, FSDP_MOD_O, 0, base, esize);
    p.w1 = fsdp_unit_param(l, u, first_fc, 0, base, esize);
    p.w2 = fsdp_unit_param(l, u, FSDP_MOD_DOWN, 0, base, esize);
    p.bqkv = fsdp_unit_param(l, u, FSDP_MOD_Q, 1, base, esize);
    p.bo = fsdp_unit_param(l, u, FSDP_MOD_O, 1, base, esize);
    p.b1 = fsdp_unit_param(l, u, first_fc, 1, base, esize);
    p.b2 = fsdp_unit_param(l, u, FSDP_MOD_DOWN, 1, base, esize);
    p.ln1w = fsdp_unit_param(l, u, FSDP_MOD_NORM_ATTN, 0, base, esize);
    p.ln1b = fsdp_unit_param(l, u, FSDP_MOD_NORM_ATTN, 1, base, esize);
    p.ln2w = fsdp_unit_param(l, u, FSDP_MOD_NORM_MLP, 0, base, esize);
    p.ln2b = fsdp_unit_param(l, u, FSDP_MOD_NORM_MLP, 1, base, esize);
    p.qnorm = fsdp_unit_param(l, u, FSDP_MOD_Q_NORM, 0, base, esize);
    p.knorm = fsdp_unit_param(l, u, FSDP_MOD_K_NORM, 0, base, esize);
    return p;
}

#endif
