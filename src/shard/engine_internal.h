/* Private to the FSDP engine (the .c files of src/shard): its state, and the parts its concerns
 * share. engine.c creates and destroys the engine and gives views of its shards; groups.c the process
 * groups and communicators; rings.c the slot rings; wire_plan.c the mode and the wire's buffers;
 * lifecycle.c the unit lifecycle and the step; reduce.c the reductions of a unit's gradients;
 * grad_rows.c gradient rows; comm_bytes.c what the collectives send; wait_timing.c the measured
 * communication waits; secondary.c hpZ's secondary copy. */
#ifndef FSDP_SHARD_ENGINE_INTERNAL_H
#define FSDP_SHARD_ENGINE_INTERNAL_H

#include "../base/trace.h"
#include "engine.h"
#include "engine_plan.h"

/* Units of the same padded size share buffers: a ring of slots, each holding one unit at a time. */
typedef struct {
    int64_t elems;          /* padded unit size */
    int capacity;
    void *base;             /* capacity * elems elements, one allocation */
    int *owner;             /* unit in the slot, or -1 */
    fsdp_event **released;  /* recorded on the stream that last used the slot */
    int *released_valid;
} slot_ring;

typedef struct {
    int64_t numel, decay_numel, padded, shard_len, offset; /* offset: into the shard arrays */
    int param_ring, param_slot;                            /* gathered copy, or slot -1 */
    int gather_event;                                      /* pool index of its pending gather, or -1 */
    int grad_ring, grad_slot;
    int64_t secondary_len, secondary_offset; /* hpZ: its secondary shard (0: none) and where it lies */
    int secondary_ready;                     /* kept by its forward, not yet gathered for its backward */
    int num_fp8;                             /* FP8 weights (fp8_weights.c): how many, where, and */
    fsdp_fp8_matrix fp8[FSDP_FP8_MAX_MATRICES];
    int fp8_ready;                           /* whether its slot's codes came with its current gather */
} unit_state;

struct fsdp_engine {
    fsdp_backend *be;
    fsdp_shard_options opts;
    int *order, *pinned;
    int *forward_order, forward_len;
    const int *active;  /* the order of the current micro-batch: order, or forward_order */
    int active_len;
    int forward_mode;   /* the current micro-batch is forward-only */
    int num_units, cursor;
    unit_state *units;

    int shard_rank, shard_size, replica_rank, replica_size;
    fsdp_engine_mode mode;
    int microbatches, microbatch; /* of the current step (fsdp_engine_begin_step, _begin_microbatch) */
    MPI_Comm shard_mpi, replica_mpi;
    fsdp_comm *gather_comm, *reduce_comm, *replica_comm, *norm_comm;
    fsdp_stream *gather_stream, *reduce_stream;

    size_t me, ce, ge; /* bytes per master / compute / gradient-buffer element */
    int64_t total_shard;
    void *master, *grad, *working;
    slot_ring *param_rings, *grad_rings;
    int num_param_rings, num_grad_rings;
    fsdp_event **grad_ready;   /* per grad-ring slot, recorded on compute when its backward is done */
    fsdp_event *updated;       /* recorded on compute after the shards were updated (fsdp_engine_update_shards) */
    int updated_valid;

    /* Timing events for the measured communication wait, reused every step. */
    fsdp_event **pool;
    int pool_used, pool_cap;
    int *wait_pairs; /* (begin, end, what) per wait: pool indices; the unit gathered, or -1: reductions */
    int num_wait_pairs, wait_pairs_cap;
    /* --trace (trace_hooks.c): spans of collectives and waits, NULL when off. */
    fsdp_stream_marks *marks;
    const char *const *unit_names;

    /* Gradient rows (fsdp_engine_add_rows): every rank's rows gathered over the world. */
    int world_size;
    fsdp_comm *rows_comm;      /* a world communicator used on the reduce stream */
    fsdp_comm *own_rows_comm;  /* created for it (HYBRID), else NULL: rows_comm aliases another */
    void *rows_values;         /* world * capacity * row_len compute-dtype elements */
    int32_t *rows_index;       /* FSDP_MAX_ROW_SETS * world * capacity */
    size_t rows_capacity;      /* entries per rank the buffers hold */
    int rows_len;              /* of row_len elements */
    fsdp_event *rows_ready, *rows_done;
    int rows_pending;          /* rows_done recorded and not yet waited for by compute */

    /* The wire's buffers (fsdp_plan_wire_buffers; NULL where the mode needs none): pieces sent and
     * received by all-to-all reductions, a shard's fp32 sum before its replicas' all-reduce, a
     * replica all-reduce's own fp32 piece and gathered bf16 result; the quantized shards (unit u's
     * at qoffset[u] bytes) and the pieces their gathers land in. */
    void *wire_send, *wire_recv, *summed, *replica_piece, *replica_gathered;
    void *qshards, *gather_staging;
    size_t *qoffset;

    /* hpZ (secondary.c): the secondary group, its communicator (used on the gather stream), the
     * secondary copy of every unit that has one, and the event recorded on compute after the last
     * slice was kept. */
    int secondary_size, secondary_rank;
    MPI_Comm secondary_mpi;
    fsdp_comm *secondary_comm;
    void *secondary;
    fsdp_event *secondary_written;

    /* FP8 weights (fp8_weights.c, with mode.fp8_weights): per param ring, the codes beside its slots
     * (W then W^T of each weight, fp8_slot_bytes[ring] a slot); every unit's weights' scales
     * [u][j], FSDP_FP8_SCALES_STRIDE floats each; this rank's amaxes of every unit's weights
     * (FSDP_FP8_MAX_MATRICES a unit), then every rank's. */
    void **fp8_codes;
    size_t *fp8_slot_bytes;
    float *fp8_scales, *fp8_amax;

    fsdp_comm_bytes sent; /* since fsdp_engine_take_comm_bytes */

    /* Gradient shards are written, not zeroed and added to, by the first reduction of each unit in
     * a step (written[u] = 0 until then); units nothing wrote are zeroed before the optimizer.
     * mode.direct_grads: the backward accumulates straight into the shard, which then IS the
     * unit's gradient, and no buffers are needed. */
    unsigned char *written;
    unsigned char *replicas_done; /* deferred replicas: the unit's shard was all-reduced this step */
    fsdp_event *step_begun; /* recorded on compute by fsdp_engine_begin_step */
    fsdp_event *direct_ready; /* recorded on compute when a direct gradient's replicas are reduced */
};

/* ---- process groups and communicators (groups.c) ---- */

/* Splits the shard and replica groups of the strategy and creates the backend communicators a
 * training (or forward-only) engine uses. Collective over world. */
void engine_open_groups(fsdp_engine *e, MPI_Comm world, const fsdp_topology *topo);
/* After the memory that alloc_shared gave for them was freed. */
void engine_close_groups(fsdp_engine *e);

/* ---- hpZ's secondary copy (secondary.c) ---- */

/* A reshard_size the engine cannot take: a usage error (0 = fine, or none asked for). */
int engine_check_reshard(const fsdp_shard_options *o, const fsdp_topology *topo, fsdp_err *err);
/* The secondary group and its communicator, after the shard group is split (collective over world;
 * nothing without hpZ). */
void engine_open_secondary(fsdp_engine *e, MPI_Comm world, const fsdp_topology *topo);
void engine_close_secondary(fsdp_engine *e);
/* The secondary copy and each unit's place in it (the units' sizes known); and its release. */
void engine_alloc_secondary(fsdp_engine *e);
void engine_free_secondary(fsdp_engine *e);
/* After unit u's forward, before its slot is released: keeps this rank's slice of the gathered unit
 * (compute stream). No-op for a unit without a secondary shard. */
void engine_keep_secondary(fsdp_engine *e, int u);
/* Gathers unit u, whose slice was kept, from its secondary group into dst on the gather stream. */
void engine_gather_secondary(fsdp_engine *e, int u, void *dst);
/* Forgets every kept slice (a new micro-batch gathers over the world first). */
void engine_reset_secondary(fsdp_engine *e);

/* ---- FP8 weights (fp8_weights.c) ---- */

/* The codes beside the param rings' slots and the scales (after the rings are built), and their release. */
void engine_alloc_fp8_weights(fsdp_engine *e);
void engine_free_fp8_weights(fsdp_engine *e);
/* After unit u's quantized shard was written from its master weights (compute stream): the amax of
 * this rank's part of each of its FP8 weights. */
void engine_measure_fp8_weights(fsdp_engine *e, int u);
/* Once every unit was measured: the amaxes exchanged (one all-gather over the shard group, collective),
 * every weight's scales, and its codes in the quantized shards re-encoded with them (compute stream). */
void engine_encode_fp8_weights(fsdp_engine *e);
/* On the gather stream, after unit u's pieces were gathered into the staging and dequantized into dst
 * (slot `slot` of its ring): its FP8 weights' codes beside that slot, and their values in dst. */
void engine_unpack_fp8_weights(fsdp_engine *e, int u, int slot, void *dst);

/* ---- slot rings (rings.c) ---- */

/* The rings of the engine's units (fsdp_plan_rings), not yet allocated; which[u] gets unit u's ring. */
int engine_build_rings(fsdp_engine *e, slot_ring **out, int *which, int keep_all);
/* `shared_with`: the communicator whose collectives write into the ring (NULL: none). */
void slot_ring_alloc(fsdp_engine *e, slot_ring *r, size_t esize, fsdp_comm *shared_with, const char *what);
void slot_ring_free(fsdp_backend *be, slot_ring *r);
void *slot_ring_slot(const slot_ring *r, int slot, size_t esize);
/* A slot that holds no unit, or -1. */
int slot_ring_free_slot(const slot_ring *r);

/* ---- buffers sized by their first use, unless the options foresaw it ---- */

/* Room for `count` gradient rows of `row_len` per rank, gathered from every rank (grad_rows.c). */
void engine_reserve_rows(fsdp_engine *e, int count, int row_len);
/* ---- the gradient shards (lifecycle.c) and their reductions (reduce.c) ---- */

void *engine_grad_shard(const fsdp_engine *e, const unit_state *s);
/* 1 in the step's last micro-batch (the one that reduces under local accumulation). */
int engine_last_microbatch(const fsdp_engine *e);
/* Reduces unit u's gradient buffer `buf` (grad dtype) into its gradient shard on the reduce stream,
 * which must already wait for the backward that wrote it: over the shard group, then over
 * replicas unless they are deferred. */
void engine_reduce_unit(fsdp_engine *e, unit_state *s, void *buf);
/* The replicas' all-reduce of a gradient shard that holds the whole step (deferred replicas). */
void engine_reduce_replicas_of_shard(fsdp_engine *e, unit_state *s);
/* Unit u's quantized shard from its master weights, on the compute stream (quantized gathers); its FP8
 * weights then wait for engine_encode_fp8_weights. */
void engine_quantize_shard(fsdp_engine *e, int u);

/* ---- bytes on the wire (comm_bytes.c) ---- */

/* Counts what one collective sends from this rank: `bytes` per piece over a group of `ranks`. */
void engine_count_pieces(fsdp_engine *e, fsdp_comm_kind k, int ranks, size_t piece_bytes);
void engine_count_all_reduce(fsdp_engine *e, fsdp_comm_kind k, int ranks, size_t bytes);
/* A piece of `count` elements of t as the wire counts it: the dtype's own bytes. */
size_t engine_wire_bytes(fsdp_dtype t, size_t count);
/* What one collective of a unit whose shard has shard_len elements sends (engine.h: fsdp_unit_wire),
 * under mode m (wire_bytes.c); fsdp_engine_comm_minimum and fsdp plan both count with it. */
void fsdp_engine_unit_wire(const fsdp_engine_mode *m, const fsdp_shard_options *o, int64_t shard_len,
                           fsdp_unit_wire *w);
/* hpZ: what the backward's all-gather of a unit whose secondary shard has secondary_len elements sends
 * inside its group of secondary_size ranks (compute dtype); 0 without a secondary shard. */
double fsdp_engine_secondary_wire(int secondary_size, fsdp_dtype compute_dtype, int64_t secondary_len);

/* ---- spans of --trace (trace_hooks.c) ---- */

/* A span being made: its first mark and what had been sent when it began. */
typedef struct {
    int mark;
    double sent;
} engine_span;
/* Marks the start of a span on stream s (nothing when not tracing). */
engine_span engine_span_begin(fsdp_engine *e, fsdp_stream *s);
/* Ends it on s: a span on `track` named "<what> <unit name>" carrying the bytes sent since its begin
 * (dtype: what went on the wire). */
void engine_span_end(fsdp_engine *e, engine_span b, fsdp_stream *s, int track, const char *what, int u,
                     fsdp_dtype dtype);
/* A measured wait as a span (wait_timing.c): compute stalled from `begin` to `ready`; `what` as the
 * wait pairs say (a unit's gather, the reductions, a unit's gradient buffer). */
void engine_trace_wait(fsdp_engine *e, fsdp_event *begin, fsdp_event *ready, int what);

/* ---- wait timing (wait_timing.c) ---- */

/* A timing event of the pool; *index gets its pool index. */
fsdp_event *engine_timing_event(fsdp_engine *e, int *index);
/* Makes compute wait for `ready` (a pool event) and remembers the pair to measure the stall; `what`:
 * the unit gathered, or -1 for the reductions (-2 - u: unit u's gradient buffer, engine_compute_waits_for). */
void engine_compute_waits(fsdp_engine *e, int ready_index, int what);
/* Makes compute wait for `ready` (any event: it may be recorded again before the step's waits are
 * read) to reuse unit u's gradient buffer, still being reduced; measured by two pool events on the
 * compute stream around the wait. */
void engine_compute_waits_for(fsdp_engine *e, fsdp_event *ready, int u);
/* Destroys the pool's events. */
void engine_free_timing(fsdp_engine *e);

#endif
