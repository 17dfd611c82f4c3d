/* OPT: pre-LayerNorm (with biases), learned positions offset by 2 (fairseq's legacy), ReLU MLP,
 * multi-head attention; biases on every projection unless enable_bias is false; tied head by
 * default. Field names and defaults follow transformers' OPTConfig; the variants transformers
 * builds differently (post-LayerNorm 350m, an embedding projection, no final LayerNorm, LayerDrop)
 * are refused. */
#include "../config.h"

extern const fsdp_family fsdp_family_opt;

static const fsdp_hf_field FIELDS[] = {
    FSDP_HF_SHAPE("vocab_size", vocab_size, 50272),
    FSDP_HF_SHAPE("hidden_size", hidden_size, 768),
    FSDP_HF_SHAPE("ffn_dim", intermediate_size, 3072),
    FSDP_HF_SHAPE("num_hidden_layers", num_layers, 12),
    FSDP_HF_SHAPE("num_attention_heads", num_heads, 12),
    FSDP_HF_SHAPE("max_position_embeddings", max_position_embeddings, 2048),
    FSDP_HF_ONLY("do_layer_norm_before", FSDP_HF_ONLY_BOOL, 1, NULL, "fsdp.c's OPT is pre-LayerNorm"),
    FSDP_HF_ONLY("_remove_final_layer_norm", FSDP_HF_ONLY_BOOL, 0, NULL, "fsdp.c's OPT has a final LayerNorm"),
    {.key = "word_embed_proj_dim", .kind = FSDP_HF_SAME_AS, .offset = FSDP_HF_OFF(hidden_size),
     .why = "no project_in/project_out: it must equal hidden_size"},
    FSDP_HF_ONLY("activation_function", FSDP_HF_ONLY_STRING, 0, "relu", "the MLP is fc2(relu(fc1))"),
    {.key = "enable_bias", .kind = FSDP_HF_BIASES, .bits = FSDP_BIAS_QKV | FSDP_BIAS_O | FSDP_BIAS_MLP, .dflt = 1},
    FSDP_HF_ONLY("layer_norm_elementwise_affine", FSDP_HF_ONLY_BOOL, 1, NULL,
                 "fsdp.c's OPT LayerNorms have weights and biases"),
    FSDP_HF_ONLY("layerdrop", FSDP_HF_ONLY_NUMBER, 0, NULL, "LayerDrop (skipping layers at random) is not implemented"),
    FSDP_HF_VALUE("tie_word_embeddings", FSDP_HF_BOOL, tie_word_embeddings, 1),
    FSDP_HF_VALUE("init_std", FSDP_HF_REAL, initializer_range, 0.02),
    FSDP_HF_VALUE("dropout", FSDP_HF_RATE, dropout, 0.1),
    FSDP_HF_VALUE("attention_dropout", FSDP_HF_RATE, attention_dropout, 0.0),
    FSDP_HF_VALUE("activation_dropout", FSDP_HF_RATE, activation_dropout, 0.0),
    FSDP_HF_VALUE("bos_token_id", FSDP_HF_TOKEN_ID, bos_token_id, 2),
    FSDP_HF_VALUE("eos_token_id", FSDP_HF_TOKEN_ID, eos_token_id, 2),
    FSDP_HF_VALUE("pad_token_id", FSDP_HF_TOKEN_ID, pad_token_id, 1),
    FSDP_HF_IGNORE("use_cache", "generation only"),
    FSDP_HF_IGNORE("torch_dtype", "the stored weights' dtype; fsdp.c trains in --model-precision"),
    FSDP_HF_IGNORE("dtype", "transformers 5's name for torch_dtype"),
    FSDP_HF_IGNORE("prefix", "a generation prompt prefix"),
    {.key = NULL},
};

static const fsdp_model_config PRESETS[] = {
    /* facebook/opt-1.3b's config.json */
    {.family = &fsdp_family_opt, .name = "opt-1.3b", .vocab_size = 50272, .hidden_size = 2048,
     .intermediate_size = 8192, .num_layers = 24, .num_heads = 32, .num_kv_heads = 32, .head_dim = 64,
     .max_position_embeddings = 2048, .norm_eps = 1e-5f, .tie_word_embeddings = 1,
     .biases = FSDP_BIAS_QKV | FSDP_BIAS_O | FSDP_BIAS_MLP, .initializer_range = 0.02f, .dropout = 0.1f,
     .bos_token_id = 2, .eos_token_id = 2, .pad_token_id = 1},
    /* Small, odd sizes, OPTConfig's token ids (so token 1 is the padding_idx); no dropout. */
    {.family = &fsdp_family_opt, .name = "tiny-opt", .vocab_size = 1031, .hidden_size = 40,
     .intermediate_size = 72, .num_layers = 2, .num_heads = 5, .num_kv_heads = 5, .head_dim = 8,
     .max_position_embeddings = 128, .norm_eps = 1e-5f, .tie_word_embeddings = 1,
     .biases = FSDP_BIAS_QKV | FSDP_BIAS_O | FSDP_BIAS_MLP, .initializer_range = 0.02f, .bos_token_id = 2,
     .eos_token_id = 2, .pad_token_id = 1},
};

const fsdp_family fsdp_family_opt = {
    .model_type = "opt",
    .architecture = "OPTForCausalLM",
    .norm = FSDP_NORM_LAYER,
    .mlp = FSDP_MLP_RELU,
    .pos = FSDP_POS_LEARNED,
    .pos_offset = 2,
    .padding_idx = 1,
    .norm_eps = 1e-5f, /* nn.LayerNorm's default: OPTConfig has no field for it */
    .modules =
        {
            [FSDP_MOD_EMBED_TOKENS] = "model.decoder.embed_tokens",
            [FSDP_MOD_EMBED_POSITIONS] = "model.decoder.embed_positions",
            [FSDP_MOD_Q] = "model.decoder.layers.%d.self_attn.q_proj",
            [FSDP_MOD_K] = "model.decoder.layers.%d.self_attn.k_proj",
            [FSDP_MOD_V] = "model.decoder.layers.%d.self_attn.v_proj",
            [FSDP_MOD_O] = "model.decoder.layers.%d.self_attn.out_proj",
            [FSDP_MOD_UP] = "model.decoder.layers.%d.fc1",
            [FSDP_MOD_DOWN] = "model.decoder.layers.%d.fc2",
            [FSDP_MOD_NORM_ATTN] = "model.decoder.layers.%d.self_attn_layer_norm",
            [FSDP_MOD_NORM_MLP] = "model.decoder.layers.%d.final_layer_norm",
            [FSDP_MOD_NORM_FINAL] = "model.decoder.final_layer_norm",
            [FSDP_MOD_LM_HEAD] = "lm_head",
        },
    .fields = FIELDS,
    .presets = PRESETS,
    .num_presets = (int)(sizeof PRESETS / sizeof *PRESETS),
};
