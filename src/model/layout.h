/* The parameters of a model, their Hugging Face names and shapes, and how they are grouped into
 * FSDP units with one flat buffer each.
 *
 * Units, in forward order: EMBED (token embeddings; OPT also learned positions), one BLOCK per
 * transformer layer, HEAD (final norm; the LM head matrix when it is not tied). With tied
 * embeddings the head reads the EMBED unit's token embedding.
 *
 * Inside a unit, parameters are laid out so that (1) every matrix that takes weight decay comes
 * before every parameter that does not (norm weights, biases), so a unit's shard splits into at most
 * two optimizer ranges at `decay_numel`; and (2) weights applied to the same input are adjacent, so
 * the model can run them as one product: q,k,v rows form one [(Hq+2Hkv)*D, C] matrix (and their
 * biases one vector), gate and up one [2F, C] matrix.
 *
 * Llama block: q k v o gate up down | input_layernorm post_attention_layernorm
 * OPT block:   q k v out fc1 fc2 | q.bias k.bias v.bias out.bias fc1.bias fc2.bias
 *              self_attn_layer_norm.{weight,bias} final_layer_norm.{weight,bias} */
#ifndef FSDP_MODEL_LAYOUT_H
#define FSDP_MODEL_LAYOUT_H

#include <stdint.h>

#include "config.h"

typedef enum { FSDP_UNIT_EMBED = 0, FSDP_UNIT_BLOCK = 1, FSDP_UNIT_HEAD = 2 } fsdp_unit_kind;

typedef struct {
    char name[96];     /* Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight" */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* natural shape; shape[1] == 1 for vectors */
    int64_t numel;
    int unit;          /* owning unit */
    int64_t offset;    /* element offset inside the unit's flat buffer */
    int decay;         /* weight decay applies */
} fsdp_param_desc;

typedef struct {
    fsdp_unit_kind kind;
    int layer;           /* block index, -1 for EMBED and HEAD */
    int first_param;     /* index into fsdp_layout.params */
    int num_params;
    int64_t numel;       /* sum of the parameters' numel (no padding) */
    int64_t decay_numel; /* elements [0, decay_numel) take weight decay, the rest do not */
} fsdp_unit_desc;

typedef struct {
    fsdp_param_desc *params;
    int num_params;
    fsdp_unit_desc *units;
    int num_units;       /* num_layers + 2 */
    int64_t total_numel;
} fsdp_layout;

/* Builds the layout for a validated config. */
void fsdp_layout_build(const fsdp_model_config *cfg, fsdp_layout *out);
void fsdp_layout_free(fsdp_layout *layout);
/* Index of the parameter with this Hugging Face name, or -1. */
int fsdp_layout_find(const fsdp_layout *layout, const char *name);
/* Unit indices. */
static inline int fsdp_unit_embed(const fsdp_layout *l) { (void)l; return 0; }
static inline int fsdp_unit_block(const fsdp_layout *l, int layer) { (void)l; return 1 + layer; }
static inline int fsdp_unit_head(const fsdp_layout *l) { return l->num_units - 1; }

/* Initial value of element `index` (row-major) of parameter `p`: normal(0, initializer_range) for
 * matrices and embeddings, 1 for norm weights, 0 for biases; a pure function of (seed, name, index)
 * so that any sharding initialises the same model. */
float fsdp_param_init_value(const fsdp_model_config *cfg, const fsdp_param_desc *p, uint64_t seed, int64_t index);

#endif
