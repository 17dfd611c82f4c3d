/* A model's configuration: its family (src/model/family.h) and the values of one model of it.
 *
 * A config comes from a preset (fsdp_model_preset; presets live in the family files) or from a
 * Hugging Face config.json (src/io/hf_config.c). fsdp_model_config_validate says, in one line,
 * what fsdp.c cannot train. Shapes, parameter counts and FLOPs derive from the family descriptor
 * and these values. */
#ifndef FSDP_MODEL_CONFIG_H
#define FSDP_MODEL_CONFIG_H

#include "../base/error.h"
#include "family.h"

typedef enum { FSDP_ROPE_DEFAULT = 0, FSDP_ROPE_LLAMA3 = 1, FSDP_ROPE_LINEAR = 2 } fsdp_rope_type;

typedef struct fsdp_model_config {
    const fsdp_family *family;
    char name[64];              /* preset name or the config file's model_type/path, for messages */
    int vocab_size;
    int hidden_size;
    int intermediate_size;      /* intermediate_size (Llama, Qwen2), ffn_dim (OPT) */
    int num_layers;
    int num_heads;
    int num_kv_heads;           /* 0 before derivation: num_heads */
    int head_dim;               /* 0 before derivation: hidden_size / num_heads */
    int max_position_embeddings;
    int sliding_window;         /* Mistral: query i attends keys i - window < j <= i; 0: no window */
    float norm_eps;
    int tie_word_embeddings;
    unsigned biases;            /* FSDP_BIAS_*: the projections that carry a bias */
    float initializer_range;    /* std of the normal init of matrices and embeddings */
    /* Rotary embedding (FSDP_POS_ROPE families) */
    float rope_theta;
    fsdp_rope_type rope_type;
    float rope_factor;          /* linear and llama3 */
    float rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    /* Dropout probabilities as the config states them, read and written back; what a training run
     * applies of them is fsdp_model_dropout_rates. OPT: dropout after attention and the MLP;
     * attention_dropout on the probabilities (every family); activation_dropout, which
     * transformers' OPT never applies. */
    float dropout, attention_dropout, activation_dropout;
    /* Special token ids, -1 when none. pad_token_id is also the embedding's padding_idx. */
    int bos_token_id, eos_token_id, pad_token_id;
} fsdp_model_config;

/* The dropout a training run applies, as transformers applies a config's rates in training:
 * `hidden` on the attention block's output (after o_proj) and on the MLP's output (after
 * down_proj / fc2), each before its residual add (OPT's `dropout`; Llama and Qwen2 have none);
 * `attention` on the attention probabilities before they multiply V (`attention_dropout`, every
 * family). Like transformers, fsdp.c never drops the embeddings and never applies OPT's
 * `activation_dropout` (OPTDecoderLayer reads it and does not use it). */
typedef struct {
    float hidden, attention;
} fsdp_dropout_rates;

/* The rates a run of cfg applies: the config's, or with override_set `override` for every site
 * the family has (`--dropout P`: Llama and Qwen2 then drop only attention probabilities). -1 with
 * a message naming the field (or --dropout) when a rate is not below 1: a rate of 1 drops
 * everything and scales by infinity. */
int fsdp_model_dropout_rates(const fsdp_model_config *cfg, int override_set, double override,
                             fsdp_dropout_rates *out, fsdp_err *err);
/* "0.1 on attention and MLP outputs, 0.1 on attention probabilities", or "none". */
void fsdp_dropout_rates_describe(const fsdp_dropout_rates *r, char *buf, int cap);

/* Fills `out` with the named preset (case-insensitive). Returns -1 when the name is unknown. */
int fsdp_model_preset(const char *name, fsdp_model_config *out);
/* NULL-terminated list of preset names, for help text and error messages. */
const char *const *fsdp_model_preset_names(void);
/* Fills the derived values (num_kv_heads, head_dim) left 0 by a reader; -1 with a message naming
 * the field when they cannot be derived. */
int fsdp_model_config_derive(fsdp_model_config *cfg, fsdp_err *err);
/* Bounds on a config, so that the layout, the plans and the int row counts of the ops never
 * overflow and a config is refused before anything of its size is allocated: at most
 * FSDP_MAX_LAYERS layers, FSDP_MAX_TENSOR_NUMEL elements in one matrix and FSDP_MAX_PARAMS
 * parameters (with biases and norms, counted from the config alone). */
#define FSDP_MAX_LAYERS 16384
#define FSDP_MAX_TENSOR_NUMEL (1LL << 40)
#define FSDP_MAX_PARAMS (1LL << 44)
/* Checks that the model is one fsdp.c can train, the bounds above included; returns -1 with a
 * message naming the field. */
int fsdp_model_config_validate(const fsdp_model_config *cfg, fsdp_err *err);
/* 1 when two configs describe the same parameters: family, shapes, biases, tying (the name and
 * non-shape values such as epsilons or token ids are ignored). */
int fsdp_model_config_same_shape(const fsdp_model_config *a, const fsdp_model_config *b);
/* One line: "qwen2, 24 layers, hidden 896, 14/2 heads of 64, ffn 4864, vocab 151936, tied embeddings,
 * biases on q/k/v" (", q/k norms" for Qwen3, ", sliding window 4096" with a window). */
void fsdp_model_config_describe(const fsdp_model_config *cfg, char *buf, int cap);
/* FLOPs per token for training (forward+backward), the reference's formula:
 * 6 * (matrix-product parameters, LM head once) + 6 * layers * hidden * seq, with the attention's
 * width num_heads x head_dim (hidden unless head_dim is a field of its own, as Qwen3's) and seq
 * capped by a sliding window. */
double fsdp_model_flops_per_token(const fsdp_model_config *cfg, int seq);
/* Total number of parameters (tied embeddings counted once, biases and norms included). */
long long fsdp_model_num_params(const fsdp_model_config *cfg);
/* The embedding row that gets no gradient from input tokens (transformers' padding_idx), or -1. */
int fsdp_model_padding_idx(const fsdp_model_config *cfg);

#endif
