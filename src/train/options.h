/* Everything a training run is configured by: the flags of `fsdp train`, parsed and checked. */
#ifndef FSDP_TRAIN_OPTIONS_H
#define FSDP_TRAIN_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/dtype.h"
#include "../kernels/op_args.h"
#include "../model/model.h"
#include "../shard/engine.h"
#include "data.h"

/* How a step's micro-batches accumulate (--accumulate; src/shard/engine.h "accumulate_local"): auto is
 * local for SHARD_GRAD_OP, NO_SHARD and HYBRID and sharded for FULL, whose local accumulation costs a
 * full gradient buffer per unit. */
typedef enum { FSDP_ACCUMULATE_AUTO = 0, FSDP_ACCUMULATE_LOCAL = 1, FSDP_ACCUMULATE_SHARDED = 2 } fsdp_accumulate;

/* How the token-embedding gradient is reduced (--embedding-grads). */
typedef enum { FSDP_EMBED_GRADS_AUTO = 0, FSDP_EMBED_GRADS_DENSE = 1, FSDP_EMBED_GRADS_ROWS = 2 } fsdp_embed_grads;

/* --reshard-after-forward node: the ranks of a node (resolved by fsdp_reshard_resolve). */
#define FSDP_RESHARD_NODE (-1)

typedef struct {
    /* model and parallelism */
    const char *model;          /* preset name, config.json, or a directory holding one; may be NULL with init_from */
    const char *init_from;      /* NULL, a Hugging Face model directory or an fsdp.c checkpoint (hf_import.h) */
    fsdp_strategy strategy;
    /* --strategy auto (link_plan.h, memory_fit.c): the strategy (and with --mbs auto the micro-batch)
     * the time plan predicts fastest among those that fit, on the link given or detected, with the
     * rates of --compute-from / --compute-tflops (else assumed) */
    int strategy_auto;
    double link_gbps, intra_gbps; /* bus bandwidth per GPU between nodes (0: not given) and inside one */
    double auto_tflops, auto_update_gbps, auto_interference, auto_gather_interference;
    char auto_rate_source[512];
    int auto_vary_reduce, auto_vary_gather, auto_vary_accumulate; /* flags not given: auto chooses them too */
    int ranks_per_node;         /* 0: physical nodes */
    /* --reshard-after-forward (hpZ, src/shard/engine.h; reshard.h): 0 = not given, FSDP_RESHARD_NODE,
     * or the secondary group's ranks (what fsdp_reshard_resolve leaves: 0 or N) */
    int reshard_after_forward;
    int prefetch, max_live;
    int copy_engine_gathers;    /* --gather-engine copy */
    int copy_engine_reductions; /* --reduce-engine copy */
    const char *device;         /* auto, cpu, cuda */
    /* batch and schedule */
    int mbs, seq, grad_accum, steps;
    int mbs_auto;               /* --mbs auto: the largest micro-batch the memory plan fits (src/train/memory_fit.c) */
    int global_batch;           /* --global-batch: grad_accum = global_batch / (mbs * ranks); 0 = use grad_accum */
    size_t memory_limit;        /* --memory-limit in bytes per rank, 0 = the device's memory */
    int seq_given;              /* --seq was on the command line (else it may shrink to the model's) */
    int allow_longer_seq;       /* --allow-longer-seq */
    int max_skipped;            /* --max-skipped: consecutive non-finite steps before the run stops */
    double lr, min_lr, weight_decay, beta1, beta2, adam_eps, clip;
    int warmup;
    uint64_t seed;
    /* precision and kernels */
    fsdp_dtype master_dtype, compute_dtype;
    fsdp_dtype reduce_dtype;    /* what gradient reductions send: fp32, bf16 or int8 (auto resolved) */
    fsdp_dtype gather_dtype;    /* what parameter gathers send: compute_dtype, int8 or fp8 */
    fsdp_accumulate accumulate;
    fsdp_attn attn;
    int head_chunk;             /* tokens per LM-head chunk, 0 = automatic */
    fsdp_embed_grads embed_grads;
    fsdp_recompute recompute;   /* --recompute: what a layer keeps for its backward (src/model/model.h) */
    fsdp_fp8_granularity fp8;   /* --fp8: the block projections in FP8 (src/kernels/fp8.h); NONE: bf16 */
    /* --dropout: `dropout_rate` replaces every rate the model's family has (fsdp_model_dropout_rates);
     * without it (dropout_set 0) the config's rates apply. */
    int dropout_set;
    double dropout_rate;
    /* data */
    const char *data;           /* "synthetic" or a token file */
    int synthetic_vocab;        /* synthetic tokens are uniform in [0, synthetic_vocab) */
    fsdp_packing packing;       /* --packing: how a token file's documents become samples (data.h) */
    double epochs;              /* --epochs: steps = passes over the data / global batch (0 = --steps) */
    const char *eval_data;      /* --eval-data FILE: validation loss during training, or NULL */
    int eval_every;             /* evaluate every N steps (0 = only at the end of the run) */
    int unigram_baseline;       /* --unigram-baseline: print eval_data's unigram loss (unigram.h) at the start */
    int forward_only;           /* fsdp eval: no gradients or optimizer states; --data is evaluated */
    /* checkpoints and output */
    const char *ckpt_dir;
    int ckpt_every, keep;
    int overwrite;              /* --overwrite: a fresh run may replace the checkpoints in ckpt_dir */
    const char *resume;         /* NULL, "auto" or a file */
    /* What --resume FILE may change (src/train/run_identity.h, ckpt_saver.c); each refused without: */
    int rollback;               /* --rollback: the --ckpt-dir's newer checkpoints are moved aside */
    int allow_data_change;      /* --allow-data-change: data of another tokenizer or source */
    int allow_config_change;    /* --allow-config-change: other values of config fields that change the maths */
    int allow_schedule_change;  /* --allow-schedule-change: another --steps/--lr/--min-lr/--warmup (schedule.h) */
    const char *metrics;
    const char *tensorboard;    /* --tensorboard DIR: the metrics as TensorBoard event files (io/tfevents.h), or NULL */
    int log_every;
    const char *trace;          /* --trace FILE: a timeline per rank (src/train/trace_run.h), or NULL */
    int trace_first, trace_last; /* --trace-steps A:B; 0: the default window */
    const char *run_json;       /* the flags as JSON, stored in checkpoints */
} fsdp_train_options;

#endif
