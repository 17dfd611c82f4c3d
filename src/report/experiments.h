/* The runs `fsdp report` found, and the experiments they form.
 *
 * A run is one metrics file: RESULTS/<experiment folder>/<run folder>/metrics.jsonl as the job
 * scripts write it (its name is the path without "/metrics.jsonl"), or any other FILE.jsonl (its
 * name is the path without ".jsonl"). Its folder is the folder holding it: runs are compared only
 * with runs of the same folder, so a ladder and a strategy sweep written side by side do not mix.
 *
 * Inside a folder, runs form an experiment of a kind when they agree on every field of their
 * configuration but that kind's own (and at least two configurations differ):
 *   ladder      model precision, mixed precision, attention, micro-batch, accumulation
 *   strategies  sharding strategy
 *   scaling     world size, nodes, ranks per node
 * The fields compared are the model, sequence length, micro-batch, accumulation, both precisions,
 * attention, strategy, world size, nodes, ranks per node and device. A run can be in several
 * experiments (the ladder's last rung can be the first point of a scaling series). Runs without a
 * summary (failed, unfinished) are listed but in no experiment. */
#ifndef FSDP_REPORT_EXPERIMENTS_H
#define FSDP_REPORT_EXPERIMENTS_H

#include "../base/error.h"
#include "../io/metrics_read.h"

typedef struct {
    char path[4096];      /* the metrics file as found */
    char name[4096];      /* see above */
    char group[4096];     /* the folder its name sits in ("." for none) */
    const char *short_name; /* last component of name (points into name) */
    char model_name[256]; /* the preset, or the folder of a config.json */
    fsdp_metrics_run m;
} fsdp_report_run;

typedef enum { FSDP_EXP_LADDER = 0, FSDP_EXP_STRATEGIES = 1, FSDP_EXP_SCALING = 2, FSDP_EXP_KINDS = 3 } fsdp_exp_kind;

typedef struct {
    fsdp_exp_kind kind;
    int *rows; /* indices into the runs, in table order; rows[0] is the reference row */
    int num_rows;
    char slug[256]; /* file-name stem of its plots: unique, [A-Za-z0-9._-] */
} fsdp_experiment;

/* Finds every *.jsonl under each path (a folder, searched recursively, or a file) and reads it. An
 * unreadable or unusable file is skipped with a notice naming it. Fails (err) when a path does not
 * exist or no run at all was read. Runs come sorted by name. */
int fsdp_report_collect(const char *const *paths, int num_paths, fsdp_report_run **runs, int *num_runs,
                        fsdp_err *err);
void fsdp_report_runs_free(fsdp_report_run *runs, int num_runs);

/* Groups the runs into experiments (see above); returns how many, *out malloc'ed. */
int fsdp_report_experiments(const fsdp_report_run *runs, int num_runs, fsdp_experiment **out);
void fsdp_report_experiments_free(fsdp_experiment *exps, int num_exps);

/* The runs of one folder that have loss records, for one plot of loss curves. */
typedef struct {
    const char *group; /* points into a run */
    int *rows;
    int num_rows;
    char slug[256]; /* "loss-<folder>", unique */
} fsdp_loss_group;

int fsdp_report_loss_groups(const fsdp_report_run *runs, int num_runs, fsdp_loss_group **out);
void fsdp_report_loss_groups_free(fsdp_loss_group *groups, int n);

const char *fsdp_exp_kind_name(fsdp_exp_kind kind); /* "ladder", "strategies", "scaling" */

/* GPU-hours to train on 1e9 tokens at a run's per-GPU throughput (N GPUs take 1/N of the time):
 * 1e9 / (tokens/s/GPU x 3600). 0 when the throughput is 0. */
double fsdp_report_gpu_hours_per_billion(const fsdp_report_run *run);

/* A file-name-safe copy of text: characters outside [A-Za-z0-9._-] become '-'. */
void fsdp_report_slugify(const char *text, char *out, size_t cap);

#endif
