/* The FSDP engine: sharded flat buffers per unit and the unit lifecycle
 * gather -> compute -> reshard -> reduce-scatter, under four strategies.
 *
 * It knows units only as flat arrays of `numel` elements whose first `decay_numel` take weight
 * decay; it knows nothing of what the elements mean. Every strategy is a pair of process groups
 * (docs/DESIGN.md): parameters are sharded over the shard group (size S) and gradients are summed
 * over the replica group (size R) after the reduce-scatter:
 *
 *   FULL           S = world, R = 1     reshard after forward, gather again for backward
 *   SHARD_GRAD_OP  S = world, R = 1     keep gathered parameters from forward to backward
 *   NO_SHARD       S = 1,     R = world parameters always resident; gradients all-reduced
 *   HYBRID         S = node,  R = nodes FULL inside a node, replicas across nodes
 *
 * FULL with reshard_size N (ZeRO++'s hierarchical partitioning, hpZ; FSDP2's
 * reshard_after_forward=N): parameters, gradients and optimizer state stay sharded over the world
 * and the forward gathers over the world, but after a unit's forward each rank keeps a secondary
 * copy of the unit's gathered working weights sharded over its secondary group (N ranks: the node),
 * the 1/N slice it holds of the unit, so that the backward's gather runs inside that group and
 * never crosses nodes. Gradients are reduce-scattered over the world as FULL does. The secondary
 * copy is derived state (rebuilt every forward; checkpoints never see it), in the compute dtype
 * also under quantized gathers (the backward then moves compute-dtype values inside the node), one
 * allocation for every unit the backward gathers again (src/shard/secondary.c).
 *
 * The engine owns parameters, gradients and the lifecycle only. State an optimizer keeps per element
 * of the shards is the optimizer's own: it allocates it from the extents the engine gives
 * (fsdp_engine_extent, fsdp_shard_view.offset) and writes the shards through the engine's update
 * visitor (fsdp_engine_update_shards), which schedules the gathers around the update, so an
 * optimizer needs nothing of src/shard beyond these.
 *
 * Memory, one allocation per class of state: master weights, gradients (both in the master dtype,
 * sharded: padded_numel / S per unit), the compute-dtype copy of the shard that the update of the
 * shards writes and gathers send from (aliases the master when the dtypes agree), gathered units
 * (rings of slots shared by units of equal size, at most max_live gathered at once per ring) and
 * full-unit gradient buffers in the reduce dtype (rings of max_live slots). With S == 1 the
 * compute copy of the shard IS the full working copy and nothing is gathered.
 *
 * The gathered units and the compute-dtype shard they are gathered from are allocated through the
 * gather communicator (alloc_shared), so that with copy_engine_gathers the all-gathers can run on
 * copy engines and leave every SM to the compute they overlap; likewise the unit gradient buffers
 * and a staging buffer through the reduce communicator with copy_engine_reductions.
 *
 * Bytes on the wire are a budget (DeepSpeed ZeRO++'s idea), set by three options:
 *  - reduce_dtype: what gradient reductions send. fp32 is summed by NCCL (a reduce-scatter, and an
 *    all-reduce over replicas). bf16 and the blockwise int8 are sent as an all-to-all of each rank's
 *    pieces (int8 quantized from the gradient buffer, with its block scales) and summed in fp32 on
 *    the rank that owns the shard, so a sum is rounded once, not at every hop; over replicas the
 *    fp32 sums of each rank's piece are then all-gathered in bf16 (every replica ends with the same
 *    bits).
 *  - gather_dtype: what parameter all-gathers send. compute_dtype, or a blockwise dtype (int8, fp8
 *    e4m3): each rank quantizes its shard from the master weights once per update of the shards,
 *    gathers move codes and scales, and every rank dequantizes the same bytes into the
 *    compute-dtype unit (its own piece too, so that all ranks compute with the same weights). The
 *    working copy of the shards is then not kept. Master weights and optimizer state stay exact.
 *    With fp8_weights (tensorwise FP8 products; torchao's float8 all-gather), the units' FP8 weights
 *    (fsdp_unit_spec.fp8_matrices) are encoded with one scale per weight instead of their blocks'
 *    (src/kernels/fp8.h): after the update each rank measures the amax of its part of every weight,
 *    the amaxes of all units are all-gathered once the update is done (4 floats a unit, on the compute
 *    stream), and every rank encodes its part with the scale of their maximum. Each gather then also unpacks every weight's codes as W
 *    and W^T beside the unit's slot, which the products read as they are (fsdp_engine_fp8_weights):
 *    no product casts a weight, and the weights are rounded to FP8 once, from the master weights.
 *    A forward-only engine has none (it has no communicator on the compute stream).
 *  - accumulate_local: how a step of K micro-batches accumulates. Off ("sharded"), every micro-batch
 *    reduces its gradients into the shards. On ("local"), the step's gradients cross the network
 *    once: FULL and SHARD_GRAD_OP keep every unit's full gradient buffer over the K micro-batches
 *    (grad_dtype, one slot per unit) and reduce them in the last one, and SHARD_GRAD_OP also keeps
 *    its gathered units from the first micro-batch's forward to the last one's backward (one
 *    gather per step); NO_SHARD and HYBRID sum each micro-batch into their shards and all-reduce
 *    over replicas once, in the last micro-batch (HYBRID's reduce-scatter inside the node still
 *    runs every micro-batch). PyTorch's no_sync / FSDP2's set_requires_gradient_sync(False).
 *
 * Ordering: gathers run on a gather stream, reductions on a reduce stream, each with its own
 * communicator; compute waits on events only. Calls must follow the visiting order given at
 * creation (one micro-batch), which is also what drives prefetching. A forward-only micro-batch
 * (evaluation) follows a second order, also given at creation, and releases every unit after its
 * forward; an engine made forward_only serves nothing else and holds no gradient state
 * (`fsdp eval`). */
#ifndef FSDP_SHARD_ENGINE_H
#define FSDP_SHARD_ENGINE_H

#include <mpi.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../backend/stream_marks.h"

typedef enum { FSDP_FULL = 0, FSDP_SHARD_GRAD_OP = 1, FSDP_NO_SHARD = 2, FSDP_HYBRID = 3 } fsdp_strategy;

/* Case-insensitive; accepts FULL_SHARD and HYBRID_SHARD as aliases. */
int fsdp_strategy_parse(const char *text, fsdp_strategy *out);
const char *fsdp_strategy_name(fsdp_strategy s);

typedef struct {
    int64_t numel;
    int64_t decay_numel;
    /* The weights of tensorwise FP8 products inside the unit (src/kernels/fp8.h), which with
     * fp8_weights (below) travel as e4m3 codes with one scale each; 0: none. */
    int num_fp8_matrices;
    fsdp_fp8_matrix fp8_matrices[FSDP_FP8_MAX_MATRICES];
} fsdp_unit_spec;

/* Where this rank sits. `local_*` describe the physical node (the GPU to use); `node*` the node as
 * the strategy sees it (emulated by --ranks-per-node). */
typedef struct {
    int rank, world;
    int local_rank, local_size; /* physical node, from MPI_Comm_split_type */
    int node, num_nodes;        /* logical node */
    int node_rank, node_size;   /* rank inside the logical node */
    int uniform_nodes;          /* every logical node has node_size ranks */
} fsdp_topology;

/* Collective. ranks_per_node <= 0 means "the physical nodes". Fails (err) when ranks_per_node does
 * not divide the world. */
int fsdp_topology_detect(MPI_Comm world, int ranks_per_node, fsdp_topology *out, fsdp_err *err);

typedef struct {
    fsdp_strategy strategy;
    int prefetch;          /* units gathered ahead of use (0 = none) */
    int max_live;          /* gathered units (and gradient buffers) alive at once per ring, >= 1 */
    fsdp_dtype master_dtype, compute_dtype;
    fsdp_dtype grad_dtype;   /* unit gradient buffers, which the backward accumulates into (fp32 or bf16) */
    fsdp_dtype reduce_dtype; /* what gradient reductions send: fp32, bf16 or int8 (above) */
    fsdp_dtype gather_dtype; /* what parameter gathers send: compute_dtype, int8 or fp8 (above) */
    int fp8_weights;         /* with gather_dtype fp8: the units' FP8 weights as gathered codes (above) */
    int accumulate_local;    /* gradients cross the network once per step (above) */
    const int *order;      /* units as the trainer visits them for parameters in one micro-batch */
    int order_len;
    const int *pinned;     /* per unit: 1 = once gathered, keep until its backward is done */
    const int *forward_order; /* units as a forward-only micro-batch visits them (evaluation) */
    int forward_order_len;
    /* 1: forward-only micro-batches only: no gradient shards, gradient buffers or rows, and no
     * communicators but the gathers' (fsdp eval). */
    int forward_only;
    int copy_engine_gathers; /* 1: gathers on copy engines where the backend can (FSDP_COMM_COPY_ENGINES) */
    /* 1: reduce-scatters as an all-to-all on copy engines plus a local sum of the S pieces (the sum
     * is a short full-width kernel instead of NCCL kernels that hold SMs for the whole transfer). */
    int copy_engine_reductions;
    /* Gradient rows (fsdp_engine_add_rows) a rank adds per call, at most, and their length: their
     * buffers are made with the others (0: none expected; made at the first call if any come). */
    int rows_capacity, row_len;
    /* hpZ (above): ranks of the secondary group, 0 = none. Only with FULL, 1 <= N < world and N
     * dividing the world; an N equal to the node size groups the ranks of each node. Ignored by a
     * forward-only engine, which has no backward. */
    int reshard_size;
} fsdp_shard_options;

/* ---- memory, without a device ---- */

/* Shard group size S and replica group size R of a strategy on `world` ranks in nodes of
 * `node_size` ranks (the table at the top). */
void fsdp_strategy_groups(fsdp_strategy s, int world, int node_size, int *shard_size, int *replica_size);

/* What fsdp_engine_create (and the first fsdp_engine_add_rows) allocate on each rank, per class of
 * state, as reserved_bytes counts it on `kind`. The engine builds its buffers from the same
 * functions and checks at creation that it allocated exactly this (copy engines aside, whose
 * shared buffers NCCL rounds to its window alignment). */
typedef struct {
    int shard_size, replica_size;
    int64_t total_shard;                 /* elements of this rank's shards of all units */
    int64_t largest_shard;               /* elements of this rank's largest unit shard */
    size_t master, grads, working;
    size_t gathered;                     /* gathered units: rings of slots (S > 1) */
    size_t grad_buffers;                 /* full-unit gradient buffers in the reduce dtype */
    size_t grad_rows;                    /* every rank's gradient rows, gathered (embedding rows) */
    size_t staging;                      /* pieces of all-to-all reductions (sent, received, summed) */
    size_t quantized;                    /* quantized shards and the staging their gathers land in */
    size_t secondary;                    /* hpZ's secondary copy (compute dtype), 0 without */
    size_t fp8_weights;                  /* FP8 weights' codes per gathered slot, and their scales */
    int secondary_size;                  /* hpZ's secondary group, 0 = none */
    int gathered_rings, gathered_slots, grad_rings, grad_slots;
    int communicators;                   /* backend communicators the engine creates */
    int all_reduce_communicators;        /* of them, the replicas' (large all-reduces) */
    size_t total;
} fsdp_engine_memory;
void fsdp_engine_memory_plan(const fsdp_unit_spec *units, int num_units, const fsdp_shard_options *opts, int world,
                             int node_size, fsdp_device_kind kind, fsdp_engine_memory *out);

typedef struct fsdp_engine fsdp_engine;

/* This rank's shard of one unit. Elements [0, len) of each array map to unit elements
 * [start, start + len); elements at or past numel are padding (zero forever). Elements
 * [0, decay_len) take weight decay. */
typedef struct {
    void *master, *grad;         /* master dtype */
    void *working;               /* compute dtype copy of the shard (== master when aliased) */
    int64_t offset;              /* elements of this rank's shards before this one (fsdp_shard_extent) */
    int64_t start, len, valid;   /* valid: elements < numel (checkpoints skip padding) */
    int64_t decay_len;
} fsdp_shard_view;

/* This rank's shards as a whole: the units' shards one after the other (unit u's at its view's
 * offset), `total` elements. State kept per element of the shards (an optimizer's) is laid out
 * alike: one allocation of `total` elements per class of state. */
typedef struct {
    int num_units;
    int64_t total;
    fsdp_dtype master_dtype, compute_dtype;
} fsdp_shard_extent;

/* Collective over world. */
fsdp_engine *fsdp_engine_create(fsdp_backend *be, MPI_Comm world, const fsdp_topology *topo,
                                const fsdp_unit_spec *units, int num_units, const fsdp_shard_options *opts,
                                fsdp_err *err);
void fsdp_engine_destroy(fsdp_engine *e);

int fsdp_engine_shard_rank(const fsdp_engine *e);
int fsdp_engine_shard_size(const fsdp_engine *e);
int fsdp_engine_replica_rank(const fsdp_engine *e);
int fsdp_engine_replica_size(const fsdp_engine *e);
/* hpZ's secondary group size, 0 = none (src/shard/secondary.c). */
int fsdp_engine_secondary_size(const fsdp_engine *e);
fsdp_shard_view fsdp_engine_view(const fsdp_engine *e, int unit);
fsdp_shard_extent fsdp_engine_extent(const fsdp_engine *e);

/* ---- one micro-batch: call in the visiting order ---- */
/* Starts a micro-batch: resets the visiting cursor and prefetches the first units. */
void fsdp_engine_begin_microbatch(fsdp_engine *e);
/* The unit's gathered working weights (compute dtype, full padded unit), ready on the compute
 * stream; starts prefetching the next units in the order. */
const void *fsdp_engine_params(fsdp_engine *e, int unit);
/* With fp8_weights: the FP8 weights of unit u (fsdp_unit_spec.fp8_matrices, in that order) as the
 * gather of its current parameters brought them, valid until those are released; returns how many,
 * or 0 when they did not come so (nothing gathered: S == 1; hpZ's gather inside the node, which moves
 * compute-dtype values): the products then cast from fsdp_engine_params. Call after
 * fsdp_engine_params(u). */
int fsdp_engine_fp8_weights(const fsdp_engine *e, int unit, fsdp_fp8_weight out[FSDP_FP8_MAX_MATRICES]);
/* 1 when this engine's gathers bring FP8 weights (fp8_weights with fp8 gathers over S > 1 ranks). */
int fsdp_engine_gathers_fp8_weights(const fsdp_engine *e);
/* After the unit's forward: reshard (FULL, HYBRID) unless pinned. */
void fsdp_engine_done_forward(fsdp_engine *e, int unit);
/* A full-unit gradient buffer (grad dtype) for the unit's backward to accumulate into, ready on
 * the compute stream: zeroed at the step's first use, or, with one rank in the shard group and
 * grad dtype = master dtype (and no replicas, or replicas reduced once per step), the unit's
 * gradient shard itself. With local accumulation (FULL, SHARD_GRAD_OP) the buffer holds the step's
 * earlier micro-batches. Calling it again for the same unit before done_backward returns the same
 * buffer. */
void *fsdp_engine_grads(fsdp_engine *e, int unit);
/* After the unit's backward: reduce its gradients on the reduce stream into the gradient shard
 * (written by the step's first reduction, added by later ones) and release its gathered
 * parameters; with local accumulation, only in the step's last micro-batch (the others keep the
 * buffer, and SHARD_GRAD_OP its parameters). A unit whose dense gradient buffer was not asked for
 * this micro-batch (or was already reduced) only releases its parameters. */
void fsdp_engine_done_backward(fsdp_engine *e, int unit);

/* Adds gradient rows to unit u without a dense gradient buffer: for every rank's entries n < count
 * and each row set, elements [base + row(n) * row_len, ... + row_len) of the unit get
 * values[n * row_len ...] (compute dtype) added. Every rank's rows are gathered over the world and
 * each rank adds those that fall in its shard (replicas add the same sum), so the traffic is
 * world * count * row_len elements instead of a reduce-scatter of the whole unit: the cheaper way
 * when few rows are touched (token embeddings). Runs on the reduce stream after the compute
 * stream's work so far; `values` and the row indices must stay unchanged until the next
 * fsdp_engine_begin_microbatch or fsdp_engine_wait_reductions. Needs fp32 master weights. A periodic
 * row set (rows == NULL) needs count to be a multiple of its period. */
void fsdp_engine_add_rows(fsdp_engine *e, int u, const fsdp_row_set *sets, int nsets, const void *values,
                          int count, int row_len);

/* ---- one forward-only micro-batch (evaluation): call in opts.forward_order ---- */
/* Starts a forward-only micro-batch: resets the cursor to the forward order and prefetches by it.
 * Use fsdp_engine_params and fsdp_engine_done_forward as in training; here done_forward releases
 * the unit's gathered parameters whatever the strategy or pinning (no backward follows), so a unit
 * still read after the next ones (a tied embedding, which the head reads) gets its done_forward
 * after that last use. The next fsdp_engine_begin_microbatch returns to the training order. */
void fsdp_engine_begin_forward(fsdp_engine *e);

/* ---- one step ---- */
/* Starts a step of `microbatches` training micro-batches: every unit's shard is overwritten by its
 * first gradient of the step; with accumulate_local the last micro-batch is the one that reduces. */
void fsdp_engine_begin_step(fsdp_engine *e, int microbatches);
/* Zeroes the shards of units that got no gradient this step and makes the compute stream wait for
 * every reduction of the step. The gradient shards (views' grad) then hold the step's gradients. */
void fsdp_engine_wait_reductions(fsdp_engine *e);
/* *out (device fp32) = global sum of squares of the gradient shards, summed over the shard group
 * (replicas hold the same values and are not counted twice). On the compute stream. */
void fsdp_engine_grad_sumsq(fsdp_engine *e, float *out);
/* Writes one unit's shard: enqueues on the compute stream the work that updates view->master and,
 * unless it is the master itself, view->working (from view->grad and whatever state `ctx` keeps). */
typedef void (*fsdp_shard_update)(void *ctx, int unit, const fsdp_shard_view *view);
/* Updates every shard: calls `update` for each unit in unit order, after the step's reductions
 * (fsdp_engine_wait_reductions). As soon as a unit the next step opens with is written, its gather
 * starts, behind the rest of the update; gathers issued later wait for the whole update. */
void fsdp_engine_update_shards(fsdp_engine *e, fsdp_shard_update update, void *ctx);
/* Copies master -> working for every unit (after initialisation or loading a checkpoint). */
void fsdp_engine_refresh_working(fsdp_engine *e);

/* ---- bytes on the wire ---- */
/* What this rank sends, by kind of collective, in the bytes of the dtypes themselves (a bf16 value
 * is 2 bytes, an int8 piece its codes and scales, also where the CPU backend emulates bf16 in fp32):
 * an all-gather or all-to-all over G ranks sends G - 1 pieces, a reduce-scatter G - 1 pieces of the
 * result, an all-reduce of n bytes 2 (G - 1) / G n (the ring's, NCCL's bus bandwidth convention). */
typedef enum {
    FSDP_COMM_GATHER,  /* parameter all-gathers */
    FSDP_COMM_REDUCE,  /* gradient reduce-scatters (or their all-to-alls) over the shard group */
    FSDP_COMM_REPLICA, /* gradient all-reduces over replicas */
    FSDP_COMM_OTHER,   /* gradient rows (the token embedding's, gathered) and the gradient norm's all-reduce */
    FSDP_COMM_GATHER_SECONDARY, /* hpZ: the backward's parameter all-gathers inside the secondary group */
    FSDP_COMM_KINDS
} fsdp_comm_kind;
typedef struct {
    double bytes[FSDP_COMM_KINDS];
    double total;
} fsdp_comm_bytes;
/* "all_gather", "reduce", "all_reduce", "other", "all_gather_secondary" */
const char *fsdp_comm_kind_name(fsdp_comm_kind k);
/* Bytes sent since the last call (the trainer takes them once per step). */
void fsdp_engine_take_comm_bytes(fsdp_engine *e, fsdp_comm_bytes *out);
/* The least one optimizer step of this strategy sends with these dtypes: every unit gathered as
 * often as the strategy needs in one micro-batch and its gradient reduced once (the step of one
 * micro-batch, or of local accumulation), gradient rows left out. With hpZ a unit the backward
 * gathers again counts one world gather (all_gather) and one inside its secondary group
 * (all_gather_secondary, compute dtype). */
void fsdp_engine_comm_minimum(const fsdp_engine *e, fsdp_comm_bytes *out);

/* The same bytes without an engine or a device (src/shard/wire_bytes.c), for planning a step's
 * time (`fsdp plan --link-gbps`): what one collective of each unit sends per rank, by the arithmetic
 * the engine counts with where it issues them (engine_wire_bytes, fsdp_replica_piece), and how the
 * engine's mode accumulates. fsdp_engine_comm_minimum sums these. */
typedef struct {
    double gather;       /* one all-gather of the unit's parameters over the shard group (0 when S = 1) */
    double reduce;       /* one reduction of its gradient over the shard group (0 when S = 1) */
    double replica;      /* one all-reduce over replicas of a micro-batch's reduced gradient (R > 1) */
    double replica_step; /* the all-reduce of its gradient shard over replicas once per step (deferred) */
    double secondary;    /* hpZ: the backward's all-gather inside the secondary group (0: the unit has no
                          * secondary copy; fsdp_engine_wire_plan only, per unit) */
} fsdp_unit_wire;
typedef struct {
    int shard_size, replica_size;
    int secondary_size; /* hpZ's group, 0 = none */
    int hold_params;    /* SHARD_GRAD_OP gathers once per step and keeps the units (local accumulation) */
    int hold_grads;     /* reductions over the shard group only in a step's last micro-batch */
    int defer_replicas; /* replicas all-reduced once per step, on the shards */
    double norm;        /* the gradient norm's all-reduce, once per step */
    int num_units;
    fsdp_unit_wire *units; /* malloc'ed; fsdp_wire_plan_free */
} fsdp_wire_plan;
void fsdp_engine_wire_plan(const fsdp_unit_spec *units, int num_units, const fsdp_shard_options *opts, int world,
                           int node_size, fsdp_wire_plan *out);
void fsdp_wire_plan_free(fsdp_wire_plan *w);
/* Bytes an all-gather of `count` elements of t per rank sends to each other rank (a blockwise dtype:
 * its codes and scales). */
double fsdp_wire_piece_bytes(fsdp_dtype t, size_t count);

/* Milliseconds the compute stream waited for communication since the last call (measured with
 * timing events; waits for them, so call it after the step's backward and before the update of
 * the shards starts the next step's gathers). */
double fsdp_engine_take_comm_wait_ms(fsdp_engine *e);

/* --trace (src/shard/trace_hooks.c): from now on every gather and reduction is also a span of `marks`
 * (src/backend/stream_marks.h) on the gather or reduce track, named with unit_names[u] ("gather B3",
 * "reduce-scatter B3") and carrying the bytes it sent, and every measured wait a span on the wait
 * track. unit_names stays the caller's and must outlive the engine's use of it; NULL marks: off. */
void fsdp_engine_set_trace(fsdp_engine *e, fsdp_stream_marks *marks, const char *const *unit_names);

#endif
