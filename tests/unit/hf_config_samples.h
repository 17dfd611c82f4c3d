/* Sample config.json texts for test_hf_config.c: the published Llama-3.2-1B, OPT-1.3b and
 * Qwen2.5-0.5B files as transformers 4 wrote them, and transformers 5's spelling of two of them;
 * and edit(), which makes variants of them. */
#ifndef FSDP_TESTS_HF_CONFIG_SAMPLES_H
#define FSDP_TESTS_HF_CONFIG_SAMPLES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *LLAMA_3_2_1B =
    "{\n"
    "  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 128000,\n"
    "  \"eos_token_id\": 128001,\n"
    "  \"head_dim\": 64,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 2048,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 8192,\n"
    "  \"max_position_embeddings\": 131072,\n"
    "  \"mlp_bias\": false,\n"
    "  \"model_type\": \"llama\",\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_hidden_layers\": 16,\n"
    "  \"num_key_value_heads\": 8,\n"
    "  \"pretraining_tp\": 1,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_scaling\": {\n"
    "    \"factor\": 32.0,\n"
    "    \"high_freq_factor\": 4.0,\n"
    "    \"low_freq_factor\": 1.0,\n"
    "    \"original_max_position_embeddings\": 8192,\n"
    "    \"rope_type\": \"llama3\"\n"
    "  },\n"
    "  \"rope_theta\": 500000.0,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.45.0.dev0\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 128256\n"
    "}\n";

/* The same model as transformers 5 writes it: rope_parameters holds theta, dtype replaces torch_dtype. */
static const char *LLAMA_3_2_1B_V5 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,\n"
    " \"bos_token_id\": 128000, \"dtype\": \"bfloat16\", \"eos_token_id\": 128001, \"head_dim\": 64,\n"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,\n"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\",\n"
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pad_token_id\": null,\n"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,\n"
    " \"rope_parameters\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,\n"
    "   \"original_max_position_embeddings\": 8192, \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"},\n"
    " \"tie_word_embeddings\": true, \"transformers_version\": \"5.0.0\", \"use_cache\": true,\n"
    " \"vocab_size\": 128256}\n";

static const char *OPT_1_3B =
    "{\n"
    "  \"_name_or_path\": \"facebook/opt-1.3b\",\n"
    "  \"activation_dropout\": 0.0,\n"
    "  \"activation_function\": \"relu\",\n"
    "  \"architectures\": [\n    \"OPTForCausalLM\"\n  ],\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 2,\n"
    "  \"do_layer_norm_before\": true,\n"
    "  \"dropout\": 0.1,\n"
    "  \"eos_token_id\": 2,\n"
    "  \"ffn_dim\": 8192,\n"
    "  \"hidden_size\": 2048,\n"
    "  \"init_std\": 0.02,\n"
    "  \"layerdrop\": 0.0,\n"
    "  \"max_position_embeddings\": 2048,\n"
    "  \"model_type\": \"opt\",\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_hidden_layers\": 24,\n"
    "  \"pad_token_id\": 1,\n"
    "  \"prefix\": \"</s>\",\n"
    "  \"torch_dtype\": \"float16\",\n"
    "  \"transformers_version\": \"4.21.0.dev0\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 50272,\n"
    "  \"word_embed_proj_dim\": 2048\n"
    "}\n";

static const char *QWEN2_5_0_5B =
    "{\n"
    "  \"architectures\": [\n    \"Qwen2ForCausalLM\"\n  ],\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 151643,\n"
    "  \"eos_token_id\": 151643,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 896,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 4864,\n"
    "  \"max_position_embeddings\": 32768,\n"
    "  \"max_window_layers\": 24,\n"
    "  \"model_type\": \"qwen2\",\n"
    "  \"num_attention_heads\": 14,\n"
    "  \"num_hidden_layers\": 24,\n"
    "  \"num_key_value_heads\": 2,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_theta\": 1000000.0,\n"
    "  \"sliding_window\": 32768,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.40.1\",\n"
    "  \"use_cache\": true,\n"
    "  \"use_mrope\": false,\n"
    "  \"use_sliding_window\": false,\n"
    "  \"vocab_size\": 151936\n"
    "}\n";

static const char *QWEN2_5_0_5B_V5 =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,\n"
    " \"dtype\": \"bfloat16\", \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896,\n"
    " \"initializer_range\": 0.02, \"intermediate_size\": 4864,\n"
    " \"layer_types\": [\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\"],\n"
    " \"max_position_embeddings\": 32768, \"max_window_layers\": 24, \"model_type\": \"qwen2\",\n"
    " \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2, \"pad_token_id\": null,\n"
    " \"rms_norm_eps\": 1e-06, \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"},\n"
    " \"sliding_window\": null, \"tie_word_embeddings\": true, \"transformers_version\": \"5.0.0\",\n"
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}\n";

/* Qwen/Qwen3-0.6B's config.json (head_dim 128 with hidden 1024 and 16 heads). */
static const char *QWEN3_0_6B =
    "{\n"
    "  \"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ],\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 151643,\n"
    "  \"eos_token_id\": 151645,\n"
    "  \"head_dim\": 128,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 1024,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 3072,\n"
    "  \"max_position_embeddings\": 40960,\n"
    "  \"max_window_layers\": 28,\n"
    "  \"model_type\": \"qwen3\",\n"
    "  \"num_attention_heads\": 16,\n"
    "  \"num_hidden_layers\": 28,\n"
    "  \"num_key_value_heads\": 8,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000,\n"
    "  \"sliding_window\": null,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.51.0\",\n"
    "  \"use_cache\": true,\n"
    "  \"use_sliding_window\": false,\n"
    "  \"vocab_size\": 151936\n"
    "}\n";

/* mistralai/Mistral-7B-v0.1's config.json (a 4096-token sliding window, no head_dim field). */
static const char *MISTRAL_7B =
    "{\n"
    "  \"architectures\": [\n    \"MistralForCausalLM\"\n  ],\n"
    "  \"bos_token_id\": 1,\n"
    "  \"eos_token_id\": 2,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 4096,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 14336,\n"
    "  \"max_position_embeddings\": 32768,\n"
    "  \"model_type\": \"mistral\",\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_hidden_layers\": 32,\n"
    "  \"num_key_value_heads\": 8,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_theta\": 10000.0,\n"
    "  \"sliding_window\": 4096,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.34.0.dev0\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 32000\n"
    "}\n";

/* `text` with the first occurrence of `from` replaced by `to` (in one of two static buffers, so
 * that edits can be nested once). */
static const char *edit(const char *text, const char *from, const char *to) {
    static char bufs[2][8192];
    static int next;
    char *buf = bufs[next ^= 1];
    const char *at = strstr(text, from);
    if (!at) {
        fprintf(stderr, "test bug: '%s' not found\n", from);
        exit(1);
    }
    snprintf(buf, sizeof bufs[0], "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return buf;
}

#endif
