/* Activation recomputation on the CUDA backend: --recompute selective and full against none on the
 * same GPU in the same process (so the GEMM algorithms chosen are the same), over two training
 * micro-batches with an evaluation pass between them (tests/unit/recompute_rig.h). The recomputed
 * forward runs the forward's own kernels on the forward's own inputs and draws the same dropout
 * masks, and every kernel on this path reduces in a fixed order, so the losses, the gradient at the
 * embedding output and every block's and the head's gradient must be identical bit for bit; the
 * embedding's own gradient is added with fp32 atomics (docs/DESIGN.md, "Determinism"), so it is
 * held to 1e-5 relative. Models: tiny Llama (tied and untied), tiny OPT (with and without its
 * dropout), tiny Qwen2 (tied and untied) and a small Llama with head dimension 64 (the tensor-core
 * flash kernels), each with flash and eager attention, fp32 and bf16, three layers. Exit 77 without
 * a GPU. */
#include <mpi.h>

#include "recompute_rig.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (!fsdp_backend_cuda_available()) {
        printf("test_gpu_recompute: SKIPPED (no GPU)\n");
        MPI_Finalize();
        return 77;
    }
    fsdp_err err = {0};
    const char *presets[] = {"tiny-llama", "tiny-opt", "tiny-qwen2", "tiny-llama"};
    for (int act = 0; act < 2; act++) {
        fsdp_backend_options bo = {.kind = "cuda", .act_dtype = act ? FSDP_BF16 : FSDP_F32, .grad_dtype = FSDP_F32,
                                   .local_size = 1};
        fsdp_backend *be = fsdp_backend_create(&bo, &err);
        if (!be) {
            printf("backend: %s\n", err.msg);
            return 1;
        }
        for (int p = 0; p < 4; p++)
            for (int variant = 0; variant < 2; variant++)
                for (int attn = 0; attn < 2; attn++) {
                    fsdp_model_config cfg;
                    fsdp_model_preset(presets[p], &cfg);
                    cfg.num_layers = 3;
                    const char *name = presets[p];
                    int T = 37;
                    if (p == 3) {
                        name = "small-llama-d64";
                        cfg.hidden_size = 256, cfg.num_heads = 4, cfg.num_kv_heads = 2, cfg.head_dim = 64;
                        cfg.intermediate_size = 512;
                        T = 200;
                    }
                    if (p != 1 && variant) cfg.tie_word_embeddings = !cfg.tie_word_embeddings;
                    int dropout = p == 1 ? variant : attn == (int)(act ? FSDP_ATTN_FLASH : FSDP_ATTN_EAGER);
                    if (dropout) {
                        cfg.attention_dropout = 0.15f;
                        if (p == 1) cfg.dropout = 0.1f;
                    }
                    rc_configuration(be, name, &cfg, (fsdp_attn)attn, 2, T, 1e-5);
                }
        be->runtime->destroy(be);
    }
    int status = check_summary("test_gpu_recompute");
    MPI_Finalize();
    return status;
}
