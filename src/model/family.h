/* Model families as data: what makes Llama, OPT, Qwen2, Qwen3 or Mistral what they are.
 *
 * A family descriptor says which norm, MLP and position scheme the decoder uses, which pieces of its
 * own the block carries (Qwen3's RMSNorm on q and k per head), which projections
 * always carry a bias, whether the token embedding has transformers' padding_idx, the Hugging Face
 * module names of its parameters, its presets, and how each field of its config.json is treated.
 * The parameter layout (layout.c), the block (block.c, shared by training and generation), the
 * config.json reader and writer (src/io/hf_config.c) and so the checkpoint names all come from it;
 * no code outside src/model/families/ asks which family a model is, and what a block computes is
 * asked of fsdp_block_kind_of (one function) rather than worked out again by each user.
 *
 * The config.json knowledge is a declarative table (fsdp_hf_field) in the family file rather than
 * code in src/io: the field names, transformers' defaults and the values fsdp.c refuses are facts
 * about the family, so one family stays one file, while src/model stays free of JSON; hf_config.c
 * interprets the table with Jansson.
 *
 * Adding a family: src/model/families/NAME.c defines `const fsdp_family fsdp_family_NAME` (its
 * names, fields and presets), family.c lists it in the registry, and the tests grow a case (the
 * PyTorch oracle in tests/oracle, test_hf_config.c). */
#ifndef FSDP_MODEL_FAMILY_H
#define FSDP_MODEL_FAMILY_H

#include <stddef.h>

struct fsdp_model_config;

typedef enum { FSDP_NORM_RMS = 0, FSDP_NORM_LAYER = 1 } fsdp_norm_kind;  /* LayerNorm: weight and bias */
typedef enum { FSDP_MLP_SWIGLU = 0, FSDP_MLP_RELU = 1 } fsdp_mlp_kind;  /* down(silu(gate) * up) / fc2(relu(fc1)) */
typedef enum { FSDP_POS_ROPE = 0, FSDP_POS_LEARNED = 1 } fsdp_pos_kind; /* rotary / a learned table added */

/* Projections that carry a bias (fsdp_model_config.biases). */
enum { FSDP_BIAS_QKV = 1, FSDP_BIAS_O = 2, FSDP_BIAS_MLP = 4 };

/* The Hugging Face modules of a decoder. Each has a .weight; projections may have a .bias, and so
 * do LayerNorms. A ReLU MLP has UP (fc1) and DOWN (fc2) and no GATE. */
typedef enum {
    FSDP_MOD_EMBED_TOKENS,
    FSDP_MOD_EMBED_POSITIONS, /* learned positions only */
    FSDP_MOD_Q,
    FSDP_MOD_K,
    FSDP_MOD_V,
    FSDP_MOD_O,
    FSDP_MOD_GATE,
    FSDP_MOD_UP,
    FSDP_MOD_DOWN,
    FSDP_MOD_NORM_ATTN,  /* before attention */
    FSDP_MOD_NORM_MLP,   /* before the MLP */
    FSDP_MOD_NORM_FINAL,
    FSDP_MOD_LM_HEAD,    /* untied head only */
    FSDP_MOD_Q_NORM,     /* RMSNorm of each query head (head_dim weights; Qwen3) */
    FSDP_MOD_K_NORM,     /* RMSNorm of each key head */
    FSDP_MOD_COUNT
} fsdp_module;

/* How src/io/hf_config.c treats one config.json field. A null value counts as absent, except where
 * said. Fields a family's table does not name are ignored, as transformers ignores them. */
typedef enum {
    FSDP_HF_INT,          /* a positive integer -> int at .offset; absent: .dflt (0 = derived, see config.h) */
    FSDP_HF_REAL,         /* a positive finite number -> float at .offset */
    FSDP_HF_RATE,         /* a probability in [0, 1] -> float at .offset (dropout rates) */
    FSDP_HF_BOOL,         /* true or false -> int at .offset */
    FSDP_HF_BIASES,       /* true or false: sets or clears .bits in fsdp_model_config.biases */
    FSDP_HF_TOKEN_ID,     /* a token id, or a list of them (the first is kept); null = none (-1) */
    FSDP_HF_ROPE,         /* rope_theta, rope_scaling (transformers 4) and rope_parameters (5) together;
                           * .dflt is the default theta */
    FSDP_HF_ONLY_BOOL,    /* refused unless it is .dflt (0 false, 1 true) */
    FSDP_HF_ONLY_NUMBER,  /* refused unless it equals .dflt */
    FSDP_HF_ONLY_STRING,  /* refused unless it is .text */
    FSDP_HF_ONLY_STRINGS, /* a list, refused unless every entry is .text (Qwen2's layer_types) */
    FSDP_HF_SAME_AS,      /* refused unless it equals the int at .offset (OPT word_embed_proj_dim) */
    FSDP_HF_IGNORED       /* does not change training (use_cache, torch_dtype, ...): any value */
} fsdp_hf_kind;

enum {
    FSDP_HF_REQUIRED = 1,     /* a shape the file must state; .dflt is transformers' default, for the message */
    FSDP_HF_NULL_DERIVES = 2, /* null derives the value (0) where absence gives .dflt (Qwen2 num_key_value_heads) */
    FSDP_HF_UNWRITTEN = 4     /* read but never written (an alias or a transformers 5 list) */
};

typedef struct {
    const char *key;  /* config.json field */
    fsdp_hf_kind kind;
    size_t offset;    /* offsetof(fsdp_model_config, ...) for kinds that store or compare a value */
    unsigned flags;
    double dflt;      /* transformers' default, or the only value fsdp.c supports */
    unsigned bits;    /* FSDP_HF_BIASES: the FSDP_BIAS_* the field switches */
    const char *text; /* FSDP_HF_ONLY_STRING(S): the supported string */
    const char *why;  /* refused values: what fsdp.c does not implement; ignored fields: why they do not matter */
} fsdp_hf_field;

/* Table entries, for the family files (which include config.h). */
#define FSDP_HF_OFF(field) offsetof(fsdp_model_config, field)
#define FSDP_HF_SHAPE(k, field, transformers_default)                                                     \
    {.key = (k), .kind = FSDP_HF_INT, .offset = FSDP_HF_OFF(field), .flags = FSDP_HF_REQUIRED,         \
     .dflt = (transformers_default)}
#define FSDP_HF_VALUE(k, kind_, field, transformers_default)                                              \
    {.key = (k), .kind = (kind_), .offset = FSDP_HF_OFF(field), .dflt = (transformers_default)}
#define FSDP_HF_ONLY(k, kind_, value, string, why_)                                                       \
    {.key = (k), .kind = (kind_), .dflt = (value), .text = (string), .why = (why_)}
#define FSDP_HF_IGNORE(k, why_) {.key = (k), .kind = FSDP_HF_IGNORED, .why = (why_)}

typedef struct fsdp_family {
    const char *model_type;   /* config.json model_type */
    const char *architecture; /* config.json architectures[0] */
    fsdp_norm_kind norm;
    fsdp_mlp_kind mlp;
    fsdp_pos_kind pos;
    int pos_offset;           /* learned positions: table rows before position 0 (OPT: 2) */
    unsigned biases;          /* FSDP_BIAS_* that every model of the family has (Qwen2: q, k, v) */
    int padding_idx;          /* the token embedding is nn.Embedding(padding_idx=pad_token_id) */
    float norm_eps;           /* the norm's epsilon when no field sets it (OPT: nn.LayerNorm's 1e-5) */
    int qk_norm;              /* q and k heads pass an RMSNorm of head_dim weights before RoPE (Qwen3) */
    /* Module paths without ".weight"/".bias"; "%d" stands for the layer; NULL where absent. */
    const char *modules[FSDP_MOD_COUNT];
    const fsdp_hf_field *fields; /* ends with a NULL key */
    const struct fsdp_model_config *presets;
    int num_presets;
} fsdp_family;

/* What one transformer block of a model computes, from its family and config: the one answer that
 * the block (block.c), the arenas, the memory plans and `fsdp plan` all use. */
typedef struct {
    int rms;        /* RMSNorm (else LayerNorm with bias) */
    int swiglu;     /* down(silu(gate) * up) (else fc2(relu(fc1))) */
    int rope;       /* rotary positions (else a learned table added to the embedding) */
    int qk_norm;    /* per-head RMSNorm of q and k before RoPE */
    int window;     /* sliding-window attention: query i sees keys i - window < j <= i; 0: all j <= i */
    int pos_offset; /* learned positions: table row of position 0 */
} fsdp_block_kind;
fsdp_block_kind fsdp_block_kind_of(const struct fsdp_model_config *cfg);

/* Every family fsdp.c knows, NULL-terminated. */
const fsdp_family *const *fsdp_families(void);
/* The family whose model_type this is, or NULL. */
const fsdp_family *fsdp_family_find(const char *model_type);
/* "llama, opt, qwen2, qwen3, mistral": the model_types, for messages. */
const char *fsdp_family_names(void);

#endif
