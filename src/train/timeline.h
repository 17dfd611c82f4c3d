/* A training step as tasks on the three GPU streams fsdp.c's engine uses (compute, gathers,
 * reductions), run without a device to predict how long the step takes (`fsdp plan --link-gbps`).
 *
 * Each stream runs its tasks in the order they were added; a task starts once the task before it on
 * its stream and every task it depends on have ended: the schedule the engine builds with events
 * (src/shard/lifecycle.c). A task's `ms` is how long it takes alone. While compute and a transfer
 * run at the same time they interfere, each progressing at 1 / (1 + k) of its own speed, k the
 * transfer's stream's interference (0: a perfect overlap; 1: the two take turns, as two processes
 * sharing the GPU would); with both streams busy, compute runs at 1 / (1 + k_gather + k_reduce).
 * A gather and a reduction running at once on the same link (their `link`) share its bandwidth: each
 * runs at 1 / (2 - c) of its speed alone, c the link's concurrency (0 by default: half speed, one
 * NIC, NVLink or PCIe path carrying both; 1: neither slows the other, as with NCCL's socket transport
 * between two GPUs of one host, where each communicator has its own connections and threads;
 * bench/link_concurrency.py measures c).
 *
 * Promises: deterministic; every task gets its start and end (ms from the first task's start);
 * a dependency on a task that never ends (a cycle) is an internal error. */
#ifndef FSDP_TRAIN_TIMELINE_H
#define FSDP_TRAIN_TIMELINE_H

typedef enum { FSDP_TL_COMPUTE = 0, FSDP_TL_GATHER = 1, FSDP_TL_REDUCE = 2, FSDP_TL_STREAMS = 3 } fsdp_tl_stream;

#define FSDP_TL_MAX_DEPS 4

typedef struct {
    int stream;
    int link;                       /* a transfer's link (> 0): transfers on one link share its bandwidth */
    double ms;                      /* its duration alone */
    int deps[FSDP_TL_MAX_DEPS], ndeps;
    double start, end;              /* filled by fsdp_timeline_run; -1 before */
} fsdp_tl_task;

/* Links are numbered from 1 (0: none); the step's plan uses 1 between nodes and 2 inside one. */
#define FSDP_TL_LINKS 3

typedef struct {
    fsdp_tl_task *tasks;
    int n, cap;
    double concurrency[FSDP_TL_LINKS]; /* per link, in [0, 1]; 0 (as zeroed) when not set */
} fsdp_timeline;

/* Adds a task at the end of `stream`'s queue; returns its index. */
int fsdp_timeline_add(fsdp_timeline *t, int stream, double ms);
/* `task` starts only after `on` has ended (on < 0: nothing). */
void fsdp_timeline_after(fsdp_timeline *t, int task, int on);
/* Runs every task; returns the time the last one ends. interference[s] is the interference of a
 * transfer on stream s (FSDP_TL_GATHER, FSDP_TL_REDUCE) with compute. */
double fsdp_timeline_run(fsdp_timeline *t, const double interference[FSDP_TL_STREAMS]);
void fsdp_timeline_free(fsdp_timeline *t);

#endif
