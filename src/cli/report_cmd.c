/* `fsdp report RESULTS_DIR... --out DIR`: flags -> fsdp_report_options -> src/report. */
#include <stdlib.h>
#include <string.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../report/report.h"
#include "commands.h"

static const char EPILOGUE[] =
    "Reads every *.jsonl under the RESULTS_DIRs (the --metrics files of fsdp train; the job scripts in jobs/\n"
    "write RESULTS/<experiment>/<run>/metrics.jsonl) and writes into --out:\n"
    "  report.md     the ladder (throughput, speed-up, memory, micro-batch per rung), the sharding strategies,\n"
    "                scaling (per-GPU and total throughput, speed-up, efficiency), cost per 1e9 tokens, all runs\n"
    "  *.png         a plot per experiment, cost against GPUs for scaling, loss curves per folder (gnuplot)\n"
    "  gnuplot/      each plot's data and script (cd gnuplot && gnuplot NAME.gp redraws it)\n"
    "Runs are compared with the runs of the same folder, grouped by what varies between them (README,\n"
    "\"Sweeps and reports\"). Example:\n"
    "  fsdp report results --out results/report --gpu-hour-price 2.5\n";

int fsdp_cmd_report(int argc, char **argv) {
    fsdp_err err = {0};
    const char *out = NULL, *currency = "EUR";
    double price = 0.0;
    int plots = 1;
    fsdp_arg args[] = {
        {"out", FSDP_ARG_STRING, &out, "DIR", "Folder for report.md and the plots (created if missing).", 1, 0, NULL,
         0},
        {"gpu-hour-price", FSDP_ARG_FLOAT, &price, "X",
         "Price of one GPU-hour: adds the cost per 1e9 tokens (GPU-hours per 1e9 tokens x X); 0 = GPU-hours only.",
         0, 1e9, NULL, 0},
        {"currency", FSDP_ARG_STRING, &currency, "NAME", "Currency of --gpu-hour-price in the tables.", 1, 0, NULL, 0},
        {"plots", FSDP_ARG_BOOL, &plots, NULL, "Draw the PNG plots with gnuplot (--plots=no: the tables alone).", 1,
         0, NULL, 0},
    };
    fsdp_arg_spec spec = {"report", "Tables and plots of the course's experiments from the metrics of finished runs.",
                          "fsdp report RESULTS_DIR... --out DIR [--gpu-hour-price X]", EPILOGUE, args,
                          (int)(sizeof args / sizeof args[0])};

    /* The flag parser takes flags only: the results folders are taken out first. A word is a flag's
     * value when it follows a flag that takes one (--out DIR); any other word is a folder. */
    char **flags = calloc((size_t)argc + 1, sizeof *flags);
    const char **dirs = calloc((size_t)argc + 1, sizeof *dirs);
    if (!flags || !dirs) fsdp_fatal("out of host memory parsing flags");
    int nflags = 0, ndirs = 0;
    flags[nflags++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0 || !argv[i][2]) {
            dirs[ndirs++] = argv[i];
            continue;
        }
        flags[nflags++] = argv[i];
        char name[128];
        size_t len = strcspn(argv[i] + 2, "=");
        snprintf(name, sizeof name, "%.*s", (int)len, argv[i] + 2);
        const fsdp_arg *a = fsdp_args_find(&spec, name);
        if (a && a->type != FSDP_ARG_BOOL && !argv[i][2 + len] && i + 1 < argc) flags[nflags++] = argv[++i];
    }
    int rc = fsdp_args_parse(&spec, nflags, flags, stdout, &err);
    if (rc == 1) {
        free(flags);
        free(dirs);
        return 0;
    }
    if (rc == 0 && !out) fsdp_usagef(&err, "report: --out DIR is required (see fsdp report --help)");
    if (rc == 0 && !err.failed && ndirs == 0)
        fsdp_usagef(&err, "report: no RESULTS_DIR given (usage: %s)", spec.usage);
    if (err.failed) fsdp_exit_error(&err, 0);

    fsdp_report_options o = {dirs, ndirs, out, price, currency, plots};
    int failed = fsdp_report_write(&o, &err);
    free(flags);
    free(dirs);
    if (failed) fsdp_exit_error(&err, 0);
    return 0;
}
