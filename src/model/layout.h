/* The parameters of a model, their Hugging Face names and shapes, and how they are grouped into
 * FSDP units with one flat buffer each. Everything here derives from the family descriptor
 * (family.h) and the config: names from its module table, which biases and norm parameters exist
 * from its kinds and the config's biases.
 *
 * Units, in forward order: EMBED (token embeddings; learned positions too), one BLOCK per
 * transformer layer, HEAD (final norm; the LM head matrix when it is not tied). With tied
 * embeddings the head reads the EMBED unit's token embedding.
 *
 * Inside a unit, parameters are laid out so that (1) every matrix that takes weight decay comes
 * before every parameter that does not (norm weights, biases), so a unit's shard splits into at most
 * two optimizer ranges at `decay_numel`; and (2) weights applied to the same input are adjacent, so
 * the model can run them as one product: q,k,v rows form one [(Hq+2Hkv)*D, C] matrix (and their
 * biases one vector), gate and up one [2F, C] matrix (and their biases one vector).
 *
 * Block: q k v o [gate] up down | [q k v biases] [o bias] [gate up down biases]
 *        [q_norm k_norm] norm_attn.weight [.bias] norm_mlp.weight [.bias]
 * (Llama: no biases unless attention_bias/mlp_bias; Qwen2: q/k/v biases; OPT: every bias unless
 * enable_bias is false, LayerNorm biases; Qwen3: q_norm and k_norm, head_dim weights each.) */
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
    fsdp_module module;
    int is_bias;       /* the module's .bias (else its .weight) */
} fsdp_param_desc;

typedef struct {
    fsdp_unit_kind kind;
    int layer;           /* block index, -1 for EMBED and HEAD */
    int first_param;     /* index into fsdp_layout.params */
    int num_params;
    int64_t numel;       /* sum of the parameters' numel (no padding) */
    int64_t decay_numel; /* elements [0, decay_numel) take weight decay, the rest do not */
    int weight[FSDP_MOD_COUNT], bias[FSDP_MOD_COUNT]; /* parameter index of each module's tensors, or -1 */
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

/* Initial value of element `index` (row-major) of parameter `p`, as transformers initialises a
 * fresh model: normal(0, initializer_range) for matrices and embeddings (the padding_idx row of the
 * token embedding 0), 1 for norm weights, 0 for biases. A pure function of (seed, name, index), so
 * that any sharding initialises the same model. */
float fsdp_param_init_value(const fsdp_model_config *cfg, const fsdp_param_desc *p, uint64_t seed, int64_t index);
/* The same values for elements first .. first + count - 1 into out[0 .. count), on every OpenMP thread. */
void fsdp_param_init_fill(const fsdp_model_config *cfg, const fsdp_param_desc *p, uint64_t seed, int64_t first,
                          int64_t count, float *out);

#endif
