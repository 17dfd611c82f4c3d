/* Small argument types shared by the ops of every backend. */
#ifndef FSDP_KERNELS_OP_ARGS_H
#define FSDP_KERNELS_OP_ARGS_H

typedef enum { FSDP_ATTN_EAGER = 0, FSDP_ATTN_FLASH = 1 } fsdp_attn;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay; /* weight_decay already 0 for non-decayed ranges */
    int step;                                  /* 1-based optimizer step, for bias correction */
} fsdp_adamw_args;

#endif
