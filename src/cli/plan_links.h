/* The link flags of `fsdp plan` and `fsdp train --strategy auto` (plan_links.c): where the compute
 * rate comes from (--compute-from METRICS, --calibrate FILE, --compute-tflops, or an assumed 50% of
 * an H100/H200's bf16 peak), and the table of configurations ranked by predicted speed
 * (src/train/link_plan.h) printed as text or JSON. */
#ifndef FSDP_CLI_PLAN_LINKS_H
#define FSDP_CLI_PLAN_LINKS_H

#include <jansson.h>

#include "../train/link_plan.h"

typedef struct {
    double link_gbps;      /* inter-node bus bandwidth per GPU (0: not given) */
    double intra_gbps;     /* inside a node */
    double compute_tflops; /* 0: from compute_from / calibrate, else assumed */
    double update_gbps, interference, gather_interference;
    const char *compute_from, *calibrate;
    double link_concurrency; /* the inter-node link's (step_time.h); 0: one NIC shared */
} fsdp_cli_link_flags;
#define FSDP_CLI_LINK_DEFAULTS {0.0, FSDP_INTRA_GBPS_DEFAULT, 0.0, FSDP_UPDATE_GBPS_DEFAULT, FSDP_INTERFERENCE_DEFAULT, \
                                FSDP_GATHER_INTERFERENCE_DEFAULT, NULL, NULL, 0.0}

/* Assumed without a measurement: half the 989 TFLOP/s bf16 dense peak of an H100/H200 SXM (fsdp.c
 * measured 52-55% MFU on Llama-3.2-1B and Llama-2-7B: the links results of bench/results). */
#define FSDP_ASSUMED_TFLOPS 494.5

/* Checks the values (a bandwidth of 0 or below, a file that is not there): one usage line. */
int fsdp_cli_link_check(const char *command, const fsdp_cli_link_flags *f, fsdp_err *err);
/* The rates: measured by --calibrate (a short run of `o` on this rank, its metrics written to the
 * file), read from --compute-from, given by --compute-tflops, or assumed; `source` says which. */
int fsdp_cli_link_rates(const char *command, const fsdp_cli_link_flags *f, const fsdp_model_config *cfg,
                        const fsdp_train_options *o, const fsdp_link *link, fsdp_rates *rates, char *source,
                        size_t cap, fsdp_err *err);
void fsdp_cli_link_print(const fsdp_link_table *t, const fsdp_plan_place *place, const fsdp_link *link,
                         const fsdp_rates *rates, const char *source, size_t budget);
json_t *fsdp_cli_link_json(const fsdp_link_table *t, const fsdp_link *link, const fsdp_rates *rates,
                           const char *source);

#endif
