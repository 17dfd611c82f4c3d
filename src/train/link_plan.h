/* The configurations of a run ranked by their predicted speed on a link (`fsdp plan --link-gbps`,
 * `fsdp train --strategy auto`): for each strategy and, unless the user fixed them, each way of
 * moving fewer bytes (--reduce-dtype, --gather-dtype, FULL's --accumulate, and across nodes FULL's
 * hpZ, --reshard-after-forward with the node's ranks), the memory plan
 * (memory_plan.h) at the given micro-batch or, with --mbs auto, the largest that fits, and the
 * step's predicted time (step_time.h). The table is sorted: configurations that fit first, then by
 * predicted tokens/s per GPU, fastest first; ties keep the enumeration order (FULL, SHARD_GRAD_OP,
 * NO_SHARD, HYBRID; uncompressed before compressed), so the choice is deterministic. */
#ifndef FSDP_TRAIN_LINK_PLAN_H
#define FSDP_TRAIN_LINK_PLAN_H

#include "step_time.h"

typedef struct {
    fsdp_train_options o; /* the configuration (strategy, mbs, grad_accum, dtypes, accumulate, hpZ) */
    fsdp_memory_plan mem;
    fsdp_step_time time;
    int fits;      /* 1, 0, or -1 when no memory budget is known */
    int requested; /* exactly the configuration the flags asked for */
} fsdp_link_row;

typedef struct {
    fsdp_link_row *rows;
    int n;
} fsdp_link_table;

/* What may vary from `base`: */
typedef struct {
    int strategies;    /* every strategy that differs on this layout (else base's only) */
    int reduce_dtypes; /* the model precision, bf16, int8 (else base's) */
    int gather_dtypes; /* the compute precision, int8 (else base's) */
    int accumulate;    /* FULL with several micro-batches: sharded and local (else base's) */
    int reshard;       /* FULL over nodes of equal size: without and with hpZ inside the node (else base's) */
    size_t budget;     /* bytes per GPU to fit into (0: unknown; --mbs auto then needs it) */
} fsdp_link_choices;

/* base->mbs_auto: each row's micro-batch is the largest that fits (rows where none fits are left out). */
void fsdp_link_table_build(const fsdp_model_config *cfg, const fsdp_train_options *base, const fsdp_plan_place *place,
                           const fsdp_link *link, const fsdp_rates *rates, const fsdp_link_choices *choices,
                           fsdp_link_table *out);
void fsdp_link_table_free(fsdp_link_table *t);
/* The fastest row that fits (or whose fit is unknown), or NULL. */
const fsdp_link_row *fsdp_link_table_best(const fsdp_link_table *t);
/* "FULL, reduce int8, gather int8, accumulate local": what distinguishes a row. */
void fsdp_link_row_name(const fsdp_link_row *r, char *buf, size_t cap);

#endif
