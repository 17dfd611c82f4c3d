/* Qwen2 (and Qwen2.5): Llama's block with biases on the q, k and v projections (always; o_proj and
 * the MLP have none), its own rope_theta and rms_norm_eps; tied or untied head. Sliding-window
 * attention (use_sliding_window) is refused; sliding_window and max_window_layers matter only with
 * it. Field names and defaults follow transformers' Qwen2Config (4.x and 5.x). */
#include "../config.h"
#include "llama_modules.h"

extern const fsdp_family fsdp_family_qwen2;

static const fsdp_hf_field FIELDS[] = {
    FSDP_HF_SHAPE("vocab_size", vocab_size, 151936),
    FSDP_HF_SHAPE("hidden_size", hidden_size, 4096),
    FSDP_HF_SHAPE("intermediate_size", intermediate_size, 22016),
    FSDP_HF_SHAPE("num_hidden_layers", num_layers, 32),
    FSDP_HF_SHAPE("num_attention_heads", num_heads, 32),
    /* Qwen2Config's default is 32 kv heads; only an explicit null means num_attention_heads. */
    {.key = "num_key_value_heads", .kind = FSDP_HF_INT, .offset = FSDP_HF_OFF(num_kv_heads),
     .flags = FSDP_HF_NULL_DERIVES, .dflt = 32},
    /* Not a Qwen2Config field, but Qwen2Attention reads it when the file has it. */
    FSDP_HF_VALUE("head_dim", FSDP_HF_INT, head_dim, 0),
    FSDP_HF_SHAPE("max_position_embeddings", max_position_embeddings, 32768),
    FSDP_HF_VALUE("rms_norm_eps", FSDP_HF_REAL, norm_eps, 1e-6),
    FSDP_HF_VALUE("rope_theta", FSDP_HF_ROPE, rope_theta, 10000.0),
    FSDP_HF_ONLY("hidden_act", FSDP_HF_ONLY_STRING, 0, "silu", "the MLP is SwiGLU with SiLU"),
    FSDP_HF_ONLY("use_sliding_window", FSDP_HF_ONLY_BOOL, 0, NULL, "sliding-window attention is not implemented"),
    {.key = "layer_types", .kind = FSDP_HF_ONLY_STRINGS, .flags = FSDP_HF_UNWRITTEN, .text = "full_attention",
     .why = "sliding-window attention is not implemented"},
    FSDP_HF_VALUE("tie_word_embeddings", FSDP_HF_BOOL, tie_word_embeddings, 0),
    FSDP_HF_VALUE("initializer_range", FSDP_HF_REAL, initializer_range, 0.02),
    FSDP_HF_VALUE("attention_dropout", FSDP_HF_RATE, attention_dropout, 0.0),
    FSDP_HF_VALUE("bos_token_id", FSDP_HF_TOKEN_ID, bos_token_id, -1),
    FSDP_HF_VALUE("eos_token_id", FSDP_HF_TOKEN_ID, eos_token_id, -1),
    FSDP_HF_VALUE("pad_token_id", FSDP_HF_TOKEN_ID, pad_token_id, -1),
    FSDP_HF_IGNORE("sliding_window", "used only with use_sliding_window"),
    FSDP_HF_IGNORE("max_window_layers", "used only with use_sliding_window"),
    FSDP_HF_IGNORE("use_mrope", "not a Qwen2Config field (Qwen2-VL's); Qwen2 ignores it"),
    FSDP_HF_IGNORE("use_cache", "generation only"),
    FSDP_HF_IGNORE("torch_dtype", "the stored weights' dtype; fsdp.c trains in --model-precision"),
    FSDP_HF_IGNORE("dtype", "transformers 5's name for torch_dtype"),
    {.key = NULL},
};

static const fsdp_model_config PRESETS[] = {
    /* Qwen/Qwen2.5-0.5B's config.json */
    {.family = &fsdp_family_qwen2, .name = "qwen2.5-0.5b", .vocab_size = 151936, .hidden_size = 896,
     .intermediate_size = 4864, .num_layers = 24, .num_heads = 14, .num_kv_heads = 2, .head_dim = 64,
     .max_position_embeddings = 32768, .norm_eps = 1e-6f, .tie_word_embeddings = 1, .biases = FSDP_BIAS_QKV,
     .initializer_range = 0.02f, .rope_theta = 1000000.0f, .bos_token_id = 151643, .eos_token_id = 151643,
     .pad_token_id = -1},
    /* Small, odd sizes, grouped-query (4 query heads share 2 kv heads), untied (the config-file test
     * case in tests/data is the tied one). */
    {.family = &fsdp_family_qwen2, .name = "tiny-qwen2", .vocab_size = 1013, .hidden_size = 40,
     .intermediate_size = 76, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 10,
     .max_position_embeddings = 256, .norm_eps = 1e-6f, .tie_word_embeddings = 0, .biases = FSDP_BIAS_QKV,
     .initializer_range = 0.02f, .rope_theta = 1000.0f, .bos_token_id = -1, .eos_token_id = -1,
     .pad_token_id = -1},
};

const fsdp_family fsdp_family_qwen2 = {
    .model_type = "qwen2",
    .architecture = "Qwen2ForCausalLM",
    .norm = FSDP_NORM_RMS,
    .mlp = FSDP_MLP_SWIGLU,
    .pos = FSDP_POS_ROPE,
    .biases = FSDP_BIAS_QKV,
    .padding_idx = 1,
    .modules = {FSDP_LLAMA_MODULE_NAMES},
    .fields = FIELDS,
    .presets = PRESETS,
    .num_presets = (int)(sizeof PRESETS / sizeof *PRESETS),
};
