/* Activation recomputation gives the gradients of keeping everything, bit for bit, on the CPU
 * backend: for Llama (tied and untied), OPT (LayerNorm, ReLU, learned positions, biases) and Qwen2
 * (q/k/v biases, untied and tied), Qwen3 (per-head q/k norms, whose input selective keeps) and
 * Mistral (a sliding window of 5 keys), three layers each, eager and flash attention, fp32 and emulated
 * bf16, without and with dropout (OPT: on the attention and MLP outputs and the probabilities;
 * Llama and Qwen2: on the probabilities), --recompute selective and full are compared with none
 * over two training micro-batches with an evaluation pass between them (tests/unit/recompute_rig.h):
 * the losses, the gradient at the embedding output and every unit's gradient must be identical, and
 * each mode's arena smaller than the one before. A changed weight must show in the same comparison. */
#include <mpi.h>

#include "recompute_rig.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    fsdp_err err = {0};
    const char *presets[] = {"tiny-llama", "tiny-opt", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"};
    for (int act = 0; act < 2; act++) {
        fsdp_backend_options bo = {.kind = "cpu", .act_dtype = act ? FSDP_BF16 : FSDP_F32, .grad_dtype = FSDP_F32,
                                   .local_size = 1};
        fsdp_backend *be = fsdp_backend_create(&bo, &err);
        if (!be) {
            printf("backend: %s\n", err.msg);
            return 1;
        }
        for (int p = 0; p < 5; p++)
            for (int variant = 0; variant < 2; variant++)
                for (int attn = 0; attn < 2; attn++) {
                    fsdp_model_config cfg;
                    fsdp_model_preset(presets[p], &cfg);
                    cfg.num_layers = 3;
                    /* Llama, Qwen2, Qwen3, Mistral both ways tied; OPT without and with its dropout. */
                    if (p != 1 && variant) cfg.tie_word_embeddings = !cfg.tie_word_embeddings;
                    /* Llama and Qwen2 drop their probabilities with eager attention in fp32, with flash in bf16. */
                    int dropout = p == 1 ? variant : attn == (int)(act ? FSDP_ATTN_FLASH : FSDP_ATTN_EAGER);
                    if (dropout) {
                        cfg.attention_dropout = 0.15f;
                        if (p == 1) cfg.dropout = 0.1f;
                    }
                    rc_configuration(be, presets[p], &cfg, (fsdp_attn)attn, 2, 11, 0.0);
                }
        be->runtime->destroy(be);
    }
    int status = check_summary("test_model_recompute");
    MPI_Finalize();
    return status;
}
