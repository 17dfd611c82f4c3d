/* The memory a training run reserves per rank, without running it: the course's breakdown (master
 * weights, gradients, optimizer states, the compute-dtype working copy, gathered units, unit
 * gradient buffers, activations, workspace), computed by the functions that size the real
 * allocations: the engine's (fsdp_engine_memory_plan), the optimizer's (fsdp_optimizer_memory_plan),
 * the model's arena walk (fsdp_model_activation_parts) and the backend's own buffers
 * (fsdp_device_workspace_bytes). The
 * trainer builds its engine, model and workspace from the same helpers below (unit order, shard
 * options, op extents), so `reserved` is what the backend's max_reserved_bytes reads after a step.
 *
 * It needs no device and no MPI ranks: `fsdp plan` runs it on a laptop for a GPU cluster. */
#ifndef FSDP_TRAIN_MEMORY_PLAN_H
#define FSDP_TRAIN_MEMORY_PLAN_H

#include <stddef.h>

#include "../backend/sizes.h"
#include "../model/layout.h"
#include "../model/model.h"
#include "../shard/engine.h"
#include "options.h"

/* The trainer's device scalars (loss sum, gradient sum of squares, clip scale, evaluation loss sum). */
#define FSDP_STEP_SCALARS 4

/* Where the run happens: the backend, the ranks, and ranks per node (HYBRID's shard group). */
typedef struct {
    fsdp_device_kind device;
    int world;
    int node_size;
} fsdp_plan_place;

typedef struct {
    fsdp_engine_memory engine;   /* master, grads, working, gathered, grad_buffers, grad_rows, staging */
    size_t optimizer_states;     /* the optimizer's state of the shards (Adam m and v) */
    size_t activations;          /* the model's arena: activations of one micro-batch and backward scratch */
    fsdp_activation_parts activation_parts; /* of `activations`: kept by the layers, the recomputed layer, the rest
                                               (`other` takes the allocation's rounding) */
    size_t step_scalars;
    fsdp_device_workspace workspace;
    size_t reserved;             /* everything above: what max_reserved_bytes reads */
    size_t outside;              /* CUDA context and NCCL (estimate, fsdp_outside_estimate) */
    size_t total;                /* reserved + outside: what must fit in the device */
    int embed_rows;              /* the embedding gradient goes as rows */
} fsdp_memory_plan;

/* The plan of options `o` (o->mbs micro-batch) for model `cfg` at `place`. */
void fsdp_memory_plan_compute(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place,
                              fsdp_memory_plan *out);

/* The largest micro-batch in [1, max_mbs] whose plan's total fits in `budget` bytes and, when
 * per_rank_batch > 0, divides it (the --global-batch per rank); 0 when none. *at gets its plan. */
int fsdp_memory_plan_largest_mbs(const fsdp_model_config *cfg, const fsdp_train_options *o,
                                 const fsdp_plan_place *place, size_t budget, int max_mbs, int per_rank_batch,
                                 fsdp_memory_plan *at);
/* The largest micro-batch the activations of one micro-batch allow (B x T < 2^30 tokens). */
int fsdp_memory_plan_max_mbs(int seq);

/* ---- what the trainer builds from, shared with the plan ---- */

/* The units as the trainer visits them for parameters in one micro-batch (EMBED, blocks, HEAD,
 * blocks reversed: the embedding's backward needs no parameters) and which stay gathered from
 * forward to backward (a tied embedding). Its first num_layers + 2 entries (EMBED, blocks, HEAD)
 * are the order of a forward-only micro-batch (evaluation). malloc'ed. */
void fsdp_plan_unit_order(const fsdp_model_config *cfg, const fsdp_layout *layout, int **order, int *order_len,
                          int **pinned);
/* The unit gradient buffers' dtype (what the backward accumulates into): fp32 for an fp32
 * reduction, bf16 for bf16, the compute dtype for a quantized one (int8). */
fsdp_dtype fsdp_plan_grad_dtype(const fsdp_train_options *o);
/* Micro-batches per optimizer step: --grad-accum, or --global-batch / (micro-batch x ranks). */
int fsdp_plan_microbatches(const fsdp_train_options *o, int world);
/* 1 when a step's gradients are accumulated on each rank and reduced once (--accumulate): more
 * than one micro-batch per step, and local asked for, or auto with any strategy but FULL. */
int fsdp_plan_accumulate_local(const fsdp_train_options *o, int world);
/* 1 when the token-embedding gradient goes as rows (fsdp_engine_add_rows): --embedding-grads rows,
 * or auto when every rank's rows move fewer bytes than the dense matrix (fp32 master weights), never
 * when replicas are all-reduced once per step (local accumulation with NO_SHARD or HYBRID: rows
 * gathered over the world would be summed again by that all-reduce). */
int fsdp_plan_embed_rows(const fsdp_model_config *cfg, const fsdp_train_options *o, int world);
/* --embedding-grads rows where it cannot apply (bf16 master weights; NO_SHARD or HYBRID accumulating
 * locally on `world` ranks): a usage error naming `command`. */
int fsdp_plan_check_embed_rows(const char *command, const fsdp_train_options *o, int world, fsdp_err *err);
/* The engine's options for `o`; order and pinned as fsdp_plan_unit_order made them. */
/* The engine's unit specs of a model's layout (fsdp_unit_spec): sizes, and the FP8 weights of
 * tensorwise products. Free with free(). */
fsdp_unit_spec *fsdp_plan_unit_specs(const fsdp_model_config *cfg, const fsdp_train_options *o,
                                     const fsdp_layout *layout);
void fsdp_plan_shard_options(const fsdp_model_config *cfg, const fsdp_train_options *o, int world, const int *order,
                             int order_len, const int *pinned, fsdp_shard_options *out);
/* The shape of the model's activations for `o`: the micro-batch, attention and the dropout rates a
 * training micro-batch applies (the config's, or --dropout). */
fsdp_model_shape fsdp_plan_model_shape(const fsdp_model_config *cfg, const fsdp_train_options *o);
/* The shapes of the ops that take the backend's op scratch (fsdp_device_op_scratch). */
void fsdp_plan_op_extent(const fsdp_model_config *cfg, const fsdp_train_options *o, int64_t total_shard,
                         fsdp_op_extent *out);

/* ---- reporting ---- */

/* Bytes in GiB. */
static inline double fsdp_gib(size_t bytes) { return (double)bytes / (double)(1u << 30); }
/* The unit a figure of this size reads best in (GiB, MiB or KiB: tiny CPU models too). */
typedef struct {
    const char *name;
    double bytes;
} fsdp_size_unit;
fsdp_size_unit fsdp_size_unit_for(size_t bytes);
/* One line: "master weights 4.60 + gradients 4.60 + ... = 59.16 GiB reserved + 0.50 outside". */
void fsdp_memory_plan_line(const fsdp_memory_plan *p, char *buf, size_t cap);

#endif
