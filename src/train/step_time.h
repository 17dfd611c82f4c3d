/* The time of one training step on a given link, without running it (`fsdp plan --link-gbps`,
 * `fsdp train --strategy auto`): the step's work laid out on the engine's three streams
 * (src/train/timeline.h) as the trainer and the engine issue it, with
 *
 *   - compute: each unit's model FLOPs (2 x parameters x tokens forward, twice that backward, the
 *     causal attention's 2 x hidden x seq per token and layer forward, the LM head's 6 x hidden x
 *     vocab per token) at a measured rate (`tflops`: --compute-from, --calibrate, --compute-tflops),
 *     and the optimizer's update as its memory traffic (7 master-dtype values and the working or
 *     quantized copy per shard element) at `update_gbps`;
 *   - communication: the bytes of every collective as the engine counts them
 *     (fsdp_engine_wire_plan, src/shard/wire_bytes.c) at the bus bandwidth of the link it crosses
 *     (`inter_gbps` when its group spans nodes, else `intra_gbps`), a gather and a reduction in
 *     flight at once sharing it;
 *   - the overlap the engine achieves: gathers prefetched `--prefetch` units ahead into rings of
 *     `--max-live-units` slots (a gather waits for the compute that freed its slot), reductions on
 *     their own stream behind each unit's backward (a backward waits for the reduction that frees
 *     its gradient buffer), the next step's first gathers behind the update, and the step's end
 *     waiting for every reduction; and `interference` between overlapped compute and transfers.
 *
 * Two steps are laid out and the second one's length is the prediction (the steady state: its
 * first gathers overlap the first step's update). Promises: the bytes it counts per step are what
 * the engine's comm_bytes counts (tests/scripts/plan_links.py); no device, no MPI. */
#ifndef FSDP_TRAIN_STEP_TIME_H
#define FSDP_TRAIN_STEP_TIME_H

#include "memory_plan.h"

/* Where the bytes go: the bus bandwidth per GPU (NCCL's busbw, GB/s) between nodes and inside one,
 * and how far a gather and a reduction at once between nodes keep their speed (timeline.h's
 * concurrency: 0, one NIC shared, unless measured otherwise). */
typedef struct {
    int nodes;
    double inter_gbps, intra_gbps;
    double inter_concurrency;
} fsdp_link;

/* What the hardware does, measured: */
typedef struct {
    double tflops;       /* model FLOP/s of forward and backward per GPU, / 1e12 */
    double update_gbps;  /* the optimizer update's memory traffic, GB/s */
    double interference;        /* overlapped compute and reductions each run 1 / (1 + this) as fast (timeline.h) */
    double gather_interference; /* the same for compute and gathers */
} fsdp_rates;

/* Defaults, each measured on two H200s: the update (Llama-3.2-1B's 618 M-element shards in 5.8 ms at 30
 * bytes an element, bench/results/2026-11-22-nvidia-h200-step-phases.md; Llama-2-7B's in 32 ms: the
 * same rate); the interference, from the phases of one Llama-2-7B step on the IB-class link
 * (bench/results/2026-11-26-nvidia-h200-links-7b-overlap.md): its forward took the 137 ms its 3.42 GB
 * of gathers take alone (the compute under them cost the gathers nothing: 0), and its backward 305 ms
 * against ~210 ms of compute and 137 ms of reductions alone: 210 + 0.7 x 137. */
#define FSDP_UPDATE_GBPS_DEFAULT 3200.0
#define FSDP_INTERFERENCE_DEFAULT 0.7
#define FSDP_GATHER_INTERFERENCE_DEFAULT 0.0
/* NVLink inside a node when not told: two H100s/H200s measured 200-270 GB/s (nccl_bw, 64 MiB-1 GiB). */
#define FSDP_INTRA_GBPS_DEFAULT 200.0

typedef struct {
    double step_ms;        /* predicted */
    double compute_ms;     /* forward, backward and update alone, without any wait or interference */
    double optimizer_ms;   /* of it, the update */
    double comm_ms;        /* every transfer alone at its link's bandwidth */
    double exposed_ms;     /* step_ms - compute_ms: what communication costs the step */
    double tokens_per_s_per_gpu;
    fsdp_comm_bytes bytes; /* what a rank sends per step, by kind (as the metrics' comm_bytes) */
    int microbatches;
} fsdp_step_time;

/* The steady-state step of options `o` at `place` over `link`. */
void fsdp_step_time_predict(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place,
                            const fsdp_link *link, const fsdp_rates *rates, fsdp_step_time *out);

/* The compute rate (tflops) at which the prediction for `o` equals a measured step of measured_ms,
 * the other rates as given: what a measured run says the device computes at. */
double fsdp_step_time_rate_for(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place,
                               const fsdp_link *link, const fsdp_rates *rates, double measured_ms);

/* Forward-and-backward model FLOPs of one micro-batch per GPU, as the timeline counts them. */
double fsdp_step_time_microbatch_flops(const fsdp_model_config *cfg, const fsdp_train_options *o);

#endif
