/* Llama (2 and 3.x): RMSNorm, rotary positions (default, linear or llama3 scaling), grouped-query
 * attention, SwiGLU; biases only when attention_bias / mlp_bias say so; tied or untied head.
 * Field names and defaults follow transformers' LlamaConfig (4.x and 5.x). */
#include "../config.h"
#include "llama_modules.h"

extern const fsdp_family fsdp_family_llama;

static const fsdp_hf_field FIELDS[] = {
    FSDP_HF_SHAPE("vocab_size", vocab_size, 32000),
    FSDP_HF_SHAPE("hidden_size", hidden_size, 4096),
    FSDP_HF_SHAPE("intermediate_size", intermediate_size, 11008),
    FSDP_HF_SHAPE("num_hidden_layers", num_layers, 32),
    FSDP_HF_SHAPE("num_attention_heads", num_heads, 32),
    FSDP_HF_VALUE("num_key_value_heads", FSDP_HF_INT, num_kv_heads, 0), /* 0: num_attention_heads */
    FSDP_HF_VALUE("head_dim", FSDP_HF_INT, head_dim, 0),                /* 0: hidden_size / heads */
    FSDP_HF_SHAPE("max_position_embeddings", max_position_embeddings, 2048),
    FSDP_HF_VALUE("rms_norm_eps", FSDP_HF_REAL, norm_eps, 1e-6),
    FSDP_HF_VALUE("rope_theta", FSDP_HF_ROPE, rope_theta, 10000.0),
    FSDP_HF_ONLY("hidden_act", FSDP_HF_ONLY_STRING, 0, "silu", "the MLP is SwiGLU with SiLU"),
    {.key = "attention_bias", .kind = FSDP_HF_BIASES, .bits = FSDP_BIAS_QKV | FSDP_BIAS_O, .dflt = 0},
    {.key = "mlp_bias", .kind = FSDP_HF_BIASES, .bits = FSDP_BIAS_MLP, .dflt = 0},
    FSDP_HF_VALUE("tie_word_embeddings", FSDP_HF_BOOL, tie_word_embeddings, 0),
    FSDP_HF_VALUE("initializer_range", FSDP_HF_REAL, initializer_range, 0.02),
    FSDP_HF_VALUE("attention_dropout", FSDP_HF_RATE, attention_dropout, 0.0),
    FSDP_HF_VALUE("bos_token_id", FSDP_HF_TOKEN_ID, bos_token_id, 1),
    FSDP_HF_VALUE("eos_token_id", FSDP_HF_TOKEN_ID, eos_token_id, 2),
    FSDP_HF_VALUE("pad_token_id", FSDP_HF_TOKEN_ID, pad_token_id, -1),
    FSDP_HF_IGNORE("pretraining_tp", "transformers 4 splits the products into slices and sums them: the same "
                                     "function, another rounding; transformers 5 dropped it"),
    FSDP_HF_IGNORE("use_cache", "generation only"),
    FSDP_HF_IGNORE("torch_dtype", "the stored weights' dtype; fsdp.c trains in --model-precision"),
    FSDP_HF_IGNORE("dtype", "transformers 5's name for torch_dtype"),
    {.key = NULL},
};

static const fsdp_model_config PRESETS[] = {
    {.family = &fsdp_family_llama, .name = "llama-3.2-1b", .vocab_size = 128256, .hidden_size = 2048,
     .intermediate_size = 8192, .num_layers = 16, .num_heads = 32, .num_kv_heads = 8, .head_dim = 64,
     .max_position_embeddings = 131072, .norm_eps = 1e-5f, .tie_word_embeddings = 1, .initializer_range = 0.02f,
     .rope_theta = 500000.0f, .rope_type = FSDP_ROPE_LLAMA3, .rope_factor = 32.0f, .rope_low_freq_factor = 1.0f,
     .rope_high_freq_factor = 4.0f, .rope_original_max_position = 8192, .bos_token_id = 128000,
     .eos_token_id = 128001, .pad_token_id = -1},
    {.family = &fsdp_family_llama, .name = "llama-2-7b", .vocab_size = 32000, .hidden_size = 4096,
     .intermediate_size = 11008, .num_layers = 32, .num_heads = 32, .num_kv_heads = 32, .head_dim = 128,
     .max_position_embeddings = 4096, .norm_eps = 1e-5f, .tie_word_embeddings = 0, .initializer_range = 0.02f,
     .rope_theta = 10000.0f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = -1},
    /* Small, not powers of two, grouped-query, tied, and with llama3 rope scaling whose smooth band
     * covers a frequency (theta 100, original context 32). */
    {.family = &fsdp_family_llama, .name = "tiny-llama", .vocab_size = 1031, .hidden_size = 48,
     .intermediate_size = 88, .num_layers = 2, .num_heads = 6, .num_kv_heads = 2, .head_dim = 8,
     .max_position_embeddings = 256, .norm_eps = 1e-5f, .tie_word_embeddings = 1, .initializer_range = 0.02f,
     .rope_theta = 100.0f, .rope_type = FSDP_ROPE_LLAMA3, .rope_factor = 4.0f, .rope_low_freq_factor = 1.0f,
     .rope_high_freq_factor = 4.0f, .rope_original_max_position = 32, .bos_token_id = -1, .eos_token_id = -1,
     .pad_token_id = -1},
};

const fsdp_family fsdp_family_llama = {
    .model_type = "llama",
    .architecture = "LlamaForCausalLM",
    .norm = FSDP_NORM_RMS,
    .mlp = FSDP_MLP_SWIGLU,
    .pos = FSDP_POS_ROPE,
    .padding_idx = 1,
    .modules = {FSDP_LLAMA_MODULE_NAMES},
    .fields = FIELDS,
    .presets = PRESETS,
    .num_presets = (int)(sizeof PRESETS / sizeof *PRESETS),
};
