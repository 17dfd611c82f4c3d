/* Small argument types shared by the ops of every backend. */
#ifndef FSDP_KERNELS_OP_ARGS_H
#define FSDP_KERNELS_OP_ARGS_H

#include <stdint.h>
#include <string.h>

/* The attention paths (--attn): eager keeps the T x T probabilities; flash never does, and its
 * backward is deterministic (dQ by a second pass over the keys); flash-atomic is flash with dQ
 * summed by atomics in the dK/dV pass (fewer products, not bitwise reproducible run to run);
 * cudnn is cuDNN's fused attention (Hopper-native kernels; GPUs only, loaded at run time). The
 * CPU backend's attention is exact whichever is named. */
typedef enum { FSDP_ATTN_EAGER = 0, FSDP_ATTN_FLASH = 1, FSDP_ATTN_FLASH_ATOMIC = 2, FSDP_ATTN_CUDNN = 3 } fsdp_attn;
/* Their names, indexed by fsdp_attn (NULL-terminated, as the argument parser's choices). */
#define FSDP_ATTN_NAMES {"eager", "flash", "flash-atomic", "cudnn", NULL}
static inline const char *fsdp_attn_name(fsdp_attn a) {
    static const char *const names[] = FSDP_ATTN_NAMES;
    return a >= FSDP_ATTN_EAGER && a <= FSDP_ATTN_CUDNN ? names[a] : "?";
}
/* The path of a name (flash for one it does not know: callers have checked the choices). */
static inline fsdp_attn fsdp_attn_of(const char *name) {
    if (!strcmp(name, "eager")) return FSDP_ATTN_EAGER;
    if (!strcmp(name, "cudnn")) return FSDP_ATTN_CUDNN;
    return !strcmp(name, "flash-atomic") ? FSDP_ATTN_FLASH_ATOMIC : FSDP_ATTN_FLASH;
}
/* Whether the path keeps no T x T probabilities (the flash kernels' and cuDNN's: the log-sum-exp
 * rows instead). */
static inline int fsdp_attn_flash(fsdp_attn a) { return a != FSDP_ATTN_EAGER; }

typedef struct {
    float lr, beta1, beta2, eps, weight_decay; /* weight_decay already 0 for non-decayed ranges */
    int step;                                  /* 1-based optimizer step, for bias correction */
} fsdp_adamw_args;

/* Rows of a flat row-major [rows x C] block that starts at element `base` of a flat array: entry n
 * of a scatter-add goes to row rows[n], or to row offset + n % period when rows is NULL (learned
 * positions: every sequence of `period` tokens covers the same rows). With rows, an entry whose row
 * is `skip` adds nothing (a token embedding's padding_idx); skip < 0: none. */
typedef struct {
    int64_t base;
    const int32_t *rows;
    int offset, period;
    int skip;
} fsdp_row_set;

#define FSDP_MAX_ROW_SETS 2

#endif
