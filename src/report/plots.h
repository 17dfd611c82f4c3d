/* The plots of `fsdp report`, drawn by gnuplot (Debian: gnuplot-nox).
 *
 * Written by hand because no C plotting library is as widely packaged as gnuplot: each plot is a
 * data file and a gnuplot script in STAGE/gnuplot/ (kept beside the report, so a plot can be
 * restyled and redrawn with `cd gnuplot && gnuplot NAME.gp`), and the PNG in STAGE/NAME.png. Every
 * gnuplot run is checked: a non-zero exit is an error naming the script and gnuplot's message. */
#ifndef FSDP_REPORT_PLOTS_H
#define FSDP_REPORT_PLOTS_H

#include "../base/error.h"
#include "experiments.h"
#include "report.h"

/* 0 when gnuplot is on PATH; otherwise one error saying how to get it. */
int fsdp_plots_check_gnuplot(fsdp_err *err);

/* <slug>.png: the ladder (throughput with speed-up, memory with micro-batch per rung), the
 * strategies (throughput and memory per strategy) or scaling (total and per-GPU throughput against
 * GPUs, efficiency); scaling also draws <slug>-cost.png (cost or GPU-hours per 1e9 tokens, and the
 * hours it takes, against GPUs). */
int fsdp_plot_experiment(const char *stage, const fsdp_experiment *e, const fsdp_report_run *runs,
                         const fsdp_report_options *o, fsdp_err *err);

/* <slug>.png: training loss per step of every run of the group, validation loss as points. */
int fsdp_plot_losses(const char *stage, const fsdp_loss_group *g, const fsdp_report_run *runs, fsdp_err *err);

#endif
