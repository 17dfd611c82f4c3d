/* report.md: the course's tables (ladder, strategies, scaling), cost per billion tokens, the loss
 * plots and every run, in Markdown. */
#ifndef FSDP_REPORT_TABLES_H
#define FSDP_REPORT_TABLES_H

#include <stdio.h>

#include "experiments.h"
#include "report.h"

typedef struct {
    const fsdp_report_options *opt;
    const fsdp_report_run *runs;
    int num_runs;
    const fsdp_experiment *exps;
    int num_exps;
    const fsdp_loss_group *losses;
    int num_losses;
} fsdp_report_content;

/* Writes the whole report to fp (plots are referenced as <slug>.png when opt->plots). */
void fsdp_report_write_markdown(FILE *fp, const fsdp_report_content *c);

#endif
