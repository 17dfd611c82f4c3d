/* The module names of transformers' Llama block (LlamaForCausalLM), which Mistral, Qwen2 and Qwen3
 * keep unchanged: one list, so that the families that share the block cannot drift apart in their
 * checkpoint and safetensors names. A family adds its own modules after it (Qwen3's q_norm, k_norm). */
#ifndef FSDP_FAMILIES_LLAMA_MODULES_H
#define FSDP_FAMILIES_LLAMA_MODULES_H

#define FSDP_LLAMA_MODULE_NAMES                                                                    \
    [FSDP_MOD_EMBED_TOKENS] = "model.embed_tokens", [FSDP_MOD_Q] = "model.layers.%d.self_attn.q_proj", \
    [FSDP_MOD_K] = "model.layers.%d.self_attn.k_proj", [FSDP_MOD_V] = "model.layers.%d.self_attn.v_proj", \
    [FSDP_MOD_O] = "model.layers.%d.self_attn.o_proj", [FSDP_MOD_GATE] = "model.layers.%d.mlp.gate_proj", \
    [FSDP_MOD_UP] = "model.layers.%d.mlp.up_proj", [FSDP_MOD_DOWN] = "model.layers.%d.mlp.down_proj",  \
    [FSDP_MOD_NORM_ATTN] = "model.layers.%d.input_layernorm",                                          \
    [FSDP_MOD_NORM_MLP] = "model.layers.%d.post_attention_layernorm", [FSDP_MOD_NORM_FINAL] = "model.norm", \
    [FSDP_MOD_LM_HEAD] = "lm_head"

#endif
