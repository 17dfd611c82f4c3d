/* Small argument types shared by the ops of every backend. */
#ifndef FSDP_KERNELS_OP_ARGS_H
#define FSDP_KERNELS_OP_ARGS_H

#include <stdint.h>

typedef enum { FSDP_ATTN_EAGER = 0, FSDP_ATTN_FLASH = 1 } fsdp_attn;

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
