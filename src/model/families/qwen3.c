/* Qwen3: Llama's block with an RMSNorm on each query and key head before rotary (q_norm, k_norm:
 * head_dim weights each, as transformers' Qwen3Attention), head_dim a field of its own (128 by
 * default, not hidden_size / heads), biases on q, k, v and o only when attention_bias says so; tied
 * or untied head. Sliding-window attention (use_sliding_window, layer_types) is refused as for
 * Qwen2. Field names and defaults follow transformers' Qwen3Config (4.x and 5.x). */
#include "../config.h"
#include "llama_modules.h"

extern const fsdp_family fsdp_family_qwen3;

static const fsdp_hf_field FIELDS[] = {
    FSDP_HF_SHAPE("vocab_size", vocab_size, 151936),
    FSDP_HF_SHAPE("hidden_size", hidden_size, 4096),
    FSDP_HF_SHAPE("intermediate_size", intermediate_size, 22016),
    FSDP_HF_SHAPE("num_hidden_layers", num_layers, 32),
    FSDP_HF_SHAPE("num_attention_heads", num_heads, 32),
    /* Qwen3Config's default is 32 kv heads; only an explicit null means num_attention_heads. */
    {.key = "num_key_value_heads", .kind = FSDP_HF_INT, .offset = FSDP_HF_OFF(num_kv_heads),
     .flags = FSDP_HF_NULL_DERIVES, .dflt = 32},
    /* 128 when absent; an explicit null falls back to hidden_size / heads, as Qwen3Attention's
     * getattr does. */
    {.key = "head_dim", .kind = FSDP_HF_INT, .offset = FSDP_HF_OFF(head_dim), .flags = FSDP_HF_NULL_DERIVES,
     .dflt = 128},
    FSDP_HF_SHAPE("max_position_embeddings", max_position_embeddings, 32768),
    FSDP_HF_VALUE("rms_norm_eps", FSDP_HF_REAL, norm_eps, 1e-6),
    FSDP_HF_VALUE("rope_theta", FSDP_HF_ROPE, rope_theta, 10000.0),
    FSDP_HF_ONLY("hidden_act", FSDP_HF_ONLY_STRING, 0, "silu", "the MLP is SwiGLU with SiLU"),
    {.key = "attention_bias", .kind = FSDP_HF_BIASES, .bits = FSDP_BIAS_QKV | FSDP_BIAS_O, .dflt = 0},
    FSDP_HF_ONLY("use_sliding_window", FSDP_HF_ONLY_BOOL, 0, NULL,
                 "Qwen3's per-layer sliding windows are not implemented (Mistral's window is)"),
    {.key = "layer_types", .kind = FSDP_HF_ONLY_STRINGS, .flags = FSDP_HF_UNWRITTEN, .text = "full_attention",
     .why = "Qwen3's per-layer sliding windows are not implemented"},
    FSDP_HF_VALUE("tie_word_embeddings", FSDP_HF_BOOL, tie_word_embeddings, 0),
    FSDP_HF_VALUE("initializer_range", FSDP_HF_REAL, initializer_range, 0.02),
    FSDP_HF_VALUE("attention_dropout", FSDP_HF_RATE, attention_dropout, 0.0),
    FSDP_HF_VALUE("bos_token_id", FSDP_HF_TOKEN_ID, bos_token_id, -1),
    FSDP_HF_VALUE("eos_token_id", FSDP_HF_TOKEN_ID, eos_token_id, -1),
    FSDP_HF_VALUE("pad_token_id", FSDP_HF_TOKEN_ID, pad_token_id, -1),
    FSDP_HF_IGNORE("sliding_window", "used only with use_sliding_window"),
    FSDP_HF_IGNORE("max_window_layers", "used only with use_sliding_window"),
    FSDP_HF_IGNORE("use_cache", "generation only"),
    FSDP_HF_IGNORE("torch_dtype", "the stored weights' dtype; fsdp.c trains in --model-precision"),
    FSDP_HF_IGNORE("dtype", "transformers 5's name for torch_dtype"),
    {.key = NULL},
};

static const fsdp_model_config PRESETS[] = {
    /* Qwen/Qwen3-0.6B's config.json: head_dim 128 with hidden 1024 and 16 heads (16 x 128 = 2048
     * query features), tied. */
    {.family = &fsdp_family_qwen3, .name = "qwen3-0.6b", .vocab_size = 151936, .hidden_size = 1024,
     .intermediate_size = 3072, .num_layers = 28, .num_heads = 16, .num_kv_heads = 8, .head_dim = 128,
     .max_position_embeddings = 40960, .norm_eps = 1e-6f, .tie_word_embeddings = 1, .initializer_range = 0.02f,
     .rope_theta = 1000000.0f, .bos_token_id = 151643, .eos_token_id = 151645, .pad_token_id = -1},
    /* Small, grouped-query, untied, and head_dim (12) not hidden / heads (40 / 4 = 10), so that the
     * per-head norms and the head width are both exercised. */
    {.family = &fsdp_family_qwen3, .name = "tiny-qwen3", .vocab_size = 1019, .hidden_size = 40,
     .intermediate_size = 72, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 12,
     .max_position_embeddings = 256, .norm_eps = 1e-6f, .tie_word_embeddings = 0, .initializer_range = 0.02f,
     .rope_theta = 1000.0f, .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1},
};

const fsdp_family fsdp_family_qwen3 = {
    .model_type = "qwen3",
    .architecture = "Qwen3ForCausalLM",
    .norm = FSDP_NORM_RMS,
    .mlp = FSDP_MLP_SWIGLU,
    .pos = FSDP_POS_ROPE,
    .qk_norm = 1,
    .padding_idx = 1,
    .modules = {FSDP_LLAMA_MODULE_NAMES, [FSDP_MOD_Q_NORM] = "model.layers.%d.self_attn.q_norm", [FSDP_MOD_K_NORM] = "model.layers.%d.self_attn.k_norm"},
    .fields = FIELDS,
    .presets = PRESETS,
    .num_presets = (int)(sizeof PRESETS / sizeof *PRESETS),
};
