/* Reading a --metrics file (JSON Lines, docs/FORMATS.md) back into one run: the configuration and
 * results of its last summary record, and its loss curves.
 *
 * Promises: a line that is not a JSON object is skipped with a notice naming the file and line (a
 * crashed run may leave a torn last line); keys this reader does not know are ignored, so newer
 * records stay readable. A run whose last summary lacks a field the report needs, or holds one of the
 * wrong type, is refused with an error naming the file and the field. A resumed run appends to its
 * file: per step the last record wins, and the last summary describes the run. Records of `fsdp
 * eval` ("record": "evaluation") are kept apart from the run's own: a file of them alone is an
 * evaluation, not a run that stopped. */
#ifndef FSDP_IO_METRICS_READ_H
#define FSDP_IO_METRICS_READ_H

#include "../base/error.h"

typedef struct {
    int step;
    double value;
} fsdp_metrics_point;

/* The fields of a summary record that say what the run was and what it measured. */
typedef struct {
    char model[256]; /* as given to --model: a preset name or a config.json path */
    char model_precision[16], mixed_precision[16], attn[16], strategy[32], device[128];
    int mbs, seq, grad_accum, world_size, nodes, ranks_per_node;
    long long params, global_batch, tokens_per_step; /* params: 0 when the record has none */
    int steps, final_step;                           /* steps run by the last segment; step reached */
    double tokens_per_s_per_gpu;                     /* steady state */
    double tflops_per_gpu, mfu;                      /* 0 when unknown */
    double max_reserved_gib;
} fsdp_metrics_summary;

/* One `fsdp eval` record: what was scored, on which data, at the checkpoint's step. */
typedef struct {
    int step;
    double loss, ppl;
    char evaluated[256], data[256]; /* "" when the record has none */
} fsdp_metrics_evaluation;

typedef struct {
    int has_summary; /* 0: the run failed or is still running */
    fsdp_metrics_summary summary;
    fsdp_metrics_point *loss; /* training loss per step, ascending steps */
    int num_loss;
    fsdp_metrics_point *eval; /* eval_loss records (validation), ascending steps */
    int num_eval;
    int num_records; /* lines that were training metrics records (steps, validation, summaries) */
    fsdp_metrics_evaluation *evaluations; /* `fsdp eval` records, in file order */
    int num_evaluations;
} fsdp_metrics_run;

/* Reads `path`. Returns 0 (a file with no summary record gives has_summary = 0), or -1 with err
 * naming the file when it cannot be read, holds no metrics record, or its summary is unusable. */
int fsdp_metrics_read(const char *path, fsdp_metrics_run *run, fsdp_err *err);
void fsdp_metrics_run_free(fsdp_metrics_run *run);

#endif
