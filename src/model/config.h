/* Model shapes: the decoder-only families fsdp.c trains and the presets it knows by name.
 *
 * A config comes from a preset (fsdp_model_preset) or from a Hugging Face config.json
 * (src/io/hf_config.c). fsdp_model_config_validate says, in one line, what is unsupported. */
#ifndef FSDP_MODEL_CONFIG_H
#define FSDP_MODEL_CONFIG_H

#include "../base/error.h"

typedef enum { FSDP_FAMILY_LLAMA = 0, FSDP_FAMILY_OPT = 1 } fsdp_family;
typedef enum { FSDP_ROPE_DEFAULT = 0, FSDP_ROPE_LLAMA3 = 1 } fsdp_rope_type;

typedef struct {
    fsdp_family family;
    char name[64];              /* preset name or the config file's model_type/path, for messages */
    int vocab_size;
    int hidden_size;
    int intermediate_size;      /* Llama intermediate_size, OPT ffn_dim */
    int num_layers;
    int num_heads;
    int num_kv_heads;           /* == num_heads for OPT and Llama-2-7B */
    int head_dim;               /* hidden_size / num_heads unless the config says otherwise */
    int max_position_embeddings;
    float norm_eps;             /* rms_norm_eps (Llama) or 1e-5 (OPT LayerNorm) */
    int tie_word_embeddings;
    float initializer_range;    /* std of the normal init of matrices and embeddings (HF: 0.02) */
    /* Llama rotary embedding */
    float rope_theta;
    fsdp_rope_type rope_type;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    /* OPT */
    int enable_bias;            /* biases on every linear layer (OPT: 1, Llama: 0) */
    /* Special token ids of the Hugging Face config, -1 when absent (generation, padding). */
    int bos_token_id, eos_token_id, pad_token_id;
} fsdp_model_config;

/* Fills `out` with the named preset ("llama-3.2-1b", "llama-2-7b", "opt-1.3b", "tiny-llama",
 * "tiny-opt"; case-insensitive). Returns -1 when the name is unknown. */
int fsdp_model_preset(const char *name, fsdp_model_config *out);
/* NULL-terminated list of preset names, for help text and error messages. */
const char *const *fsdp_model_preset_names(void);
/* Checks that the shape is one fsdp.c can train; returns -1 with a message naming the field. */
int fsdp_model_config_validate(const fsdp_model_config *cfg, fsdp_err *err);
/* 1 when two configs describe the same architecture and shapes (the name is ignored). */
int fsdp_model_config_same_shape(const fsdp_model_config *a, const fsdp_model_config *b);
/* One-line description: "llama, 16 layers, hidden 2048, 32/8 heads, ffn 8192, vocab 128256, tied". */
void fsdp_model_config_describe(const fsdp_model_config *cfg, char *buf, int cap);
/* FLOPs per token for training (forward+backward), the reference's formula:
 * 6 * (matrix-product parameters, LM head once) + 6 * layers * hidden * seq. */
double fsdp_model_flops_per_token(const fsdp_model_config *cfg, int seq);
/* Total number of parameters (tied embeddings counted once). */
long long fsdp_model_num_params(const fsdp_model_config *cfg);

#endif
