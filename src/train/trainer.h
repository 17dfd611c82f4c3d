/* The training loop: builds the model, the backend, the FSDP engine and the optimizer from the options,
 * drives the unit lifecycle for every micro-batch, steps the optimizer, logs, and writes and resumes
 * checkpoints. Every function here is collective over the world communicator. */
#ifndef FSDP_TRAIN_TRAINER_H
#define FSDP_TRAIN_TRAINER_H

#include <mpi.h>
#include <stdint.h>

#include "../io/checkpoint.h"
#include "../io/metrics.h"
#include "../model/model.h"
#include "../shard/engine.h"
#include "data.h"
#include "memory_plan.h"
#include "optimizer.h"
#include "options.h"
#include "schedule.h"

typedef struct fsdp_saver fsdp_saver; /* checkpoints of the run (src/train/ckpt_saver.c) */

typedef struct {
    fsdp_train_options opt;
    MPI_Comm world;
    fsdp_topology topo;
    fsdp_model_config cfg;
    fsdp_layout layout;
    fsdp_backend *be;
    fsdp_engine *eng;
    fsdp_optimizer *optim; /* its state; NULL for a forward-only run */
    fsdp_model *model;
    fsdp_data data;
    fsdp_data eval_data;   /* --eval-data (opened when given) */
    fsdp_schedule sched;
    fsdp_metrics *metrics;

    int step;              /* completed optimizer steps */
    uint64_t samples_seen; /* data position */
    int *order, order_len; /* unit visiting order of one micro-batch */
    int *pinned;
    int embed_rows;        /* the embedding gradient goes as rows (fsdp_engine_add_rows), not dense */
    fsdp_comm_bytes comm_min; /* the least a step sends per rank (fsdp_engine_comm_minimum) */
    fsdp_comm_bytes comm_sum; /* what the timed steps sent, summed (the summary's mean) */
    int comm_steps;
    fsdp_saver *saver;
    struct fsdp_trace_run *trace; /* --trace (src/train/trace_run.h), NULL without */
    int skipped_steps, consecutive_skips; /* steps not applied: non-finite loss or gradients */
    int first_step;                       /* the step this run started from */

    int32_t *host_inputs, *host_targets; /* [grad_accum][mbs*seq], pinned */
    float *dev_scalars;                  /* loss sum, grad sum of squares, clip scale, evaluation loss sum */
    float *host_scalars;
    /* Timing events on the compute stream at the phases of a step (PHASE_* in trainer.c). */
    fsdp_event *phase[6]; /* PHASES */

    /* Memory (src/train/memory_fit.c): the plan of this run, the memory it must fit in, set-ups
     * that ran out of memory and were built again smaller (--mbs auto). */
    fsdp_memory_plan plan;
    size_t fit_budget;     /* bytes per rank (agreed minimum), 0 = unknown */
    int oom_at_setup;      /* the last set-up ran out of memory on some rank (agreed) */
    int step_downs;
} fsdp_trainer;

/* Runs `fsdp train` to the end. Returns 0; FSDP_EXIT_PREEMPTED (src/train/preemption.h) when a
 * signal stopped it after its checkpoint was written; or -1 with err set (agreed across ranks). */
int fsdp_train(const fsdp_train_options *opt, fsdp_err *err);

/* The device scalar that forward-only passes add their loss into (src/train/eval.c). */
#define FSDP_SCALAR_EVAL_LOSS 3

/* The run's set-up (t->opt, t->world set; backend, model, engine, optimizer, data) and its tear-down, for
 * commands that drive the model otherwise (fsdp eval). Collective; weights are not initialised. */
int fsdp_trainer_setup(fsdp_trainer *t, fsdp_err *err);
void fsdp_trainer_teardown(fsdp_trainer *t);

/* What one rank drives, for the per-rank figures of messages: "GPU" on the CUDA backend, else "rank". */
const char *fsdp_trainer_per_what(const fsdp_trainer *t);

/* A preset name, or a Hugging Face config.json or its directory (--model). */
int fsdp_train_load_model(const char *spec, fsdp_model_config *cfg, fsdp_err *err);

/* Memory (src/train/memory_fit.c), collective over the world. */
/* The memory limit this rank's backend enforces: --memory-limit, or for tests
 * FSDP_TEST_MEMORY_LIMIT=RANK:GIB, a lower limit on one rank that the plan does not know of (its
 * set-up then runs out of memory alone, which exercises the agreement and the step down). */
size_t fsdp_fit_backend_limit(const fsdp_trainer *t);
/* Before the backend allocates: the budget (--memory-limit, or the GPU's memory), the micro-batch
 * of --mbs auto and the accumulation steps of --global-batch. */
int fsdp_fit_choose(fsdp_trainer *t, fsdp_err *err);
/* After the set-up's allocations: agrees whether any rank ran out of memory; if so err says where,
 * with the plan and what would fit, and t->oom_at_setup is set. Then installs the out-of-memory
 * hook that turns a later failure into one line with the same. */
int fsdp_fit_check_setup(fsdp_trainer *t, fsdp_err *err);
/* After a set-up that ran out of memory (`reason`) under --mbs auto: the next smaller micro-batch
 * to build (logged), or 0 when there is none. */
int fsdp_fit_step_down(fsdp_trainer *t, const char *reason);

/* Data (src/train/data_setup.c), collective: opens --data (evaluated, for a forward_only run) and
 * --eval-data, checks them against the model (its vocabulary, and the tokenizer.json of an
 * --init-from directory) and turns --epochs into t->opt.steps. */
int fsdp_trainer_open_data(fsdp_trainer *t, fsdp_err *err);

/* Checkpoints (src/train/checkpointing.c). */
int fsdp_trainer_save(fsdp_trainer *t, const char *path, fsdp_err *err);
/* Restores weights, optimizer state, step and data position; checks the model matches. */
int fsdp_trainer_load(fsdp_trainer *t, const char *path, fsdp_err *err);
/* Sets every parameter to its initial value (src/model/layout.h), on any layout. */
void fsdp_trainer_init_weights(fsdp_trainer *t);
/* The parameters' elements in this rank's shard of unit u, in shard order: per parameter that has
 * any, which of its elements (start, count) and where they sit in the shard (offset, in elements).
 * Returns how many (at most the unit's parameter count); the rest of the shard is alignment and
 * padding. */
typedef struct {
    int tensor;
    int64_t start, count, offset;
} fsdp_shard_span;
int fsdp_trainer_unit_spans(const fsdp_trainer *t, int u, fsdp_shard_span *out);
/* The same as checkpoint pieces, pointing into host arrays of the shard's length (m and v may be
 * NULL). */
int fsdp_trainer_unit_pieces(const fsdp_trainer *t, int u, float *master, float *m, float *v, fsdp_ckpt_piece *out);
/* Copies a host fp32 array of unit u's shard length into its master shard (rounded to the master
 * dtype); call fsdp_engine_refresh_working after the last unit. */
void fsdp_trainer_unit_set_master(fsdp_trainer *t, int u, const float *master);
/* Elements [start, start + count) of unit u's master shard from a host fp32 array of count
 * elements, through a caller's buffer of fsdp_trainer_master_staging_bytes(t, count) (0: none
 * needed, the fp32 array is copied as it is): for callers that set the shards piece by piece from
 * one buffer, page-locked on a GPU host, instead of an allocation per piece. */
size_t fsdp_trainer_master_staging_bytes(const fsdp_trainer *t, int64_t elems);
void fsdp_trainer_unit_set_master_range(fsdp_trainer *t, int u, int64_t start, int64_t count, const float *master,
                                        void *staged);
/* Test hook (FSDP_TEST_FAIL=...:poison): makes this rank's first master weight NaN. */
void fsdp_trainer_poison(fsdp_trainer *t);

#endif
