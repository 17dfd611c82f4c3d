/* `fsdp report`: the course's tables and plots from the metrics of finished runs.
 *
 * Every *.jsonl file under the given directories is read as one run (src/io/metrics_read.h); runs
 * are grouped into experiments by what varies between them (experiments.h), and report.md gets one
 * table per experiment (the ladder, the sharding strategies, scaling), the cost per billion tokens,
 * and loss curves, with PNG plots drawn by gnuplot. All output is made in a staging folder inside
 * --out and moved into place only when everything succeeded. */
#ifndef FSDP_REPORT_REPORT_H
#define FSDP_REPORT_REPORT_H

#include "../base/error.h"

typedef struct {
    const char *const *dirs; /* results folders (or single metrics files) */
    int num_dirs;
    const char *out_dir;
    double gpu_hour_price; /* per GPU-hour; 0 = no cost column, GPU-hours only */
    const char *currency;
    int plots; /* 0: tables only (no gnuplot needed) */
} fsdp_report_options;

/* Returns 0, or -1 with err set (nothing written into out_dir then). */
int fsdp_report_write(const fsdp_report_options *o, fsdp_err *err);

#endif
