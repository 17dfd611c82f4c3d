/* Mistral: Llama's block with sliding-window attention (sliding_window: query i attends keys
 * i - window < j <= i, as transformers' mask for Mistral; null means no window), head_dim per
 * config (hidden_size / heads when absent or null), no biases; tied or untied head. Field names and
 * defaults follow transformers' MistralConfig (4.x and 5.x). */
#include "../config.h"
#include "llama_modules.h"

extern const fsdp_family fsdp_family_mistral;

static const fsdp_hf_field FIELDS[] = {
    FSDP_HF_SHAPE("vocab_size", vocab_size, 32000),
    FSDP_HF_SHAPE("hidden_size", hidden_size, 4096),
    FSDP_HF_SHAPE("intermediate_size", intermediate_size, 14336),
    FSDP_HF_SHAPE("num_hidden_layers", num_layers, 32),
    FSDP_HF_SHAPE("num_attention_heads", num_heads, 32),
    /* MistralConfig's default is 8 kv heads; only an explicit null means num_attention_heads. */
    {.key = "num_key_value_heads", .kind = FSDP_HF_INT, .offset = FSDP_HF_OFF(num_kv_heads),
     .flags = FSDP_HF_NULL_DERIVES, .dflt = 8},
    FSDP_HF_VALUE("head_dim", FSDP_HF_INT, head_dim, 0), /* 0: hidden_size / heads */
    FSDP_HF_SHAPE("max_position_embeddings", max_position_embeddings, 131072),
    /* 4096 when absent; null: no window (Mistral 7B v0.2 and later). */
    {.key = "sliding_window", .kind = FSDP_HF_INT, .offset = FSDP_HF_OFF(sliding_window),
     .flags = FSDP_HF_NULL_DERIVES, .dflt = 4096},
    FSDP_HF_VALUE("rms_norm_eps", FSDP_HF_REAL, norm_eps, 1e-6),
    FSDP_HF_VALUE("rope_theta", FSDP_HF_ROPE, rope_theta, 10000.0),
    FSDP_HF_ONLY("hidden_act", FSDP_HF_ONLY_STRING, 0, "silu", "the MLP is SwiGLU with SiLU"),
    FSDP_HF_VALUE("tie_word_embeddings", FSDP_HF_BOOL, tie_word_embeddings, 0),
    FSDP_HF_VALUE("initializer_range", FSDP_HF_REAL, initializer_range, 0.02),
    FSDP_HF_VALUE("attention_dropout", FSDP_HF_RATE, attention_dropout, 0.0),
    FSDP_HF_VALUE("bos_token_id", FSDP_HF_TOKEN_ID, bos_token_id, 1),
    FSDP_HF_VALUE("eos_token_id", FSDP_HF_TOKEN_ID, eos_token_id, 2),
    FSDP_HF_VALUE("pad_token_id", FSDP_HF_TOKEN_ID, pad_token_id, -1),
    FSDP_HF_IGNORE("layer_types", "MistralForCausalLM applies sliding_window to every layer and ignores it"),
    FSDP_HF_IGNORE("use_cache", "generation only"),
    FSDP_HF_IGNORE("torch_dtype", "the stored weights' dtype; fsdp.c trains in --model-precision"),
    FSDP_HF_IGNORE("dtype", "transformers 5's name for torch_dtype"),
    {.key = NULL},
};

static const fsdp_model_config PRESETS[] = {
    /* mistralai/Mistral-7B-v0.1's config.json (the release with a 4096-token window). */
    {.family = &fsdp_family_mistral, .name = "mistral-7b", .vocab_size = 32000, .hidden_size = 4096,
     .intermediate_size = 14336, .num_layers = 32, .num_heads = 32, .num_kv_heads = 8, .head_dim = 128,
     .max_position_embeddings = 32768, .sliding_window = 4096, .norm_eps = 1e-5f, .tie_word_embeddings = 0,
     .initializer_range = 0.02f, .rope_theta = 10000.0f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = -1},
    /* Small, grouped-query, tied, with a window of 5 tokens: shorter than any test sequence, so that
     * the window changes training, evaluation and generation alike. */
    {.family = &fsdp_family_mistral, .name = "tiny-mistral", .vocab_size = 1021, .hidden_size = 48,
     .intermediate_size = 80, .num_layers = 2, .num_heads = 6, .num_kv_heads = 2, .head_dim = 8,
     .max_position_embeddings = 256, .sliding_window = 5, .norm_eps = 1e-5f, .tie_word_embeddings = 1,
     .initializer_range = 0.02f, .rope_theta = 10000.0f, .bos_token_id = -1, .eos_token_id = -1,
     .pad_token_id = -1},
};

const fsdp_family fsdp_family_mistral = {
    .model_type = "mistral",
    .architecture = "MistralForCausalLM",
    .norm = FSDP_NORM_RMS,
    .mlp = FSDP_MLP_SWIGLU,
    .pos = FSDP_POS_ROPE,
    .padding_idx = 1,
    .modules = {FSDP_LLAMA_MODULE_NAMES},
    .fields = FIELDS,
    .presets = PRESETS,
    .num_presets = (int)(sizeof PRESETS / sizeof *PRESETS),
};
