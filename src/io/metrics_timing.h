/* A run's measured step time, read back from its --metrics file (docs/FORMATS.md, "Metrics") for
 * `fsdp plan --compute-from`: the configuration its last summary record names and the medians of
 * its timed steps (every step record but the first step, whose set-up, tuning and first gathers
 * are not the steady state).
 *
 * Promises: one error naming the file for a file that cannot be read, has no summary record
 * (the run did not finish), lacks a field of the summary it needs, or times fewer than one step
 * after the first; unknown keys and torn lines are skipped as fsdp_metrics_read does (metrics_lines.h). */
#ifndef FSDP_IO_METRICS_TIMING_H
#define FSDP_IO_METRICS_TIMING_H

#include "../base/error.h"

typedef struct {
    char model[256]; /* as given to --model */
    char strategy[32], model_precision[16], mixed_precision[16], reduce_dtype[16], gather_dtype[16];
    char accumulate[16], attn[16], recompute[16], device[128];
    int mbs, seq, grad_accum, world_size, nodes, ranks_per_node;
    int timed_steps;     /* step records the medians are over */
    double step_ms;      /* median step time */
    double comm_wait_ms; /* median time the compute stream waited for communication */
    double optimizer_ms; /* median update time (the phases' optimizer_ms), -1 when the records have none */
} fsdp_metrics_timing;

int fsdp_metrics_read_timing(const char *path, fsdp_metrics_timing *out, fsdp_err *err);

#endif
