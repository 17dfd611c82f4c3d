/* Private to the FSDP engine (src/shard): how units are padded into shards and grouped into rings of
 * slots (rings.c). fsdp_engine_create builds its buffers with these, and fsdp_engine_memory_plan
 * (engine_memory.c) counts the same buffers without a device. */
#ifndef FSDP_SHARD_ENGINE_PLAN_H
#define FSDP_SHARD_ENGINE_PLAN_H

#include <stdint.h>

#include "engine.h"

/* Shards are multiples of this many elements: 256-byte aligned fp32, and wide vector accesses. */
#define FSDP_SHARD_ALIGN 64

/* A unit of numel elements padded to a multiple of shard_size * FSDP_SHARD_ALIGN. */
static inline int64_t fsdp_shard_padded(int64_t numel, int shard_size) {
    int64_t align = (int64_t)shard_size * FSDP_SHARD_ALIGN;
    return (numel + align - 1) / align * align;
}

/* Units of the same padded size share a ring of slots, each slot holding one unit at a time. */
typedef struct {
    int64_t elems; /* padded unit size */
    int capacity;  /* slots */
} fsdp_ring_shape;

/* Groups units into rings (rings has room for num_units); which[u] gets unit u's ring. A ring has
 * one slot per unit when keep_all, else max_live plus its pinned units, and never more slots than
 * units. Returns the number of rings. */
int fsdp_plan_rings(const int64_t *padded, const int *pinned, int num_units, int max_live, int keep_all,
                    fsdp_ring_shape *rings, int *which);

/* How an engine runs, derived from its options and groups; fsdp_engine_create and
 * fsdp_engine_memory_plan both derive it here, so the plan counts what the engine allocates. */
typedef struct {
    int shard_size, replica_size;
    int direct_grads;      /* the backward accumulates into the gradient shard itself: no buffers */
    int hold_grads;        /* unit gradient buffers held over a step's micro-batches: one slot per unit */
    int hold_params;       /* gathered units held over a step's micro-batches (SHARD_GRAD_OP) */
    int defer_replicas;    /* the replicas' all-reduce runs once per step, on the shards */
    int piece_reductions;  /* shard-group reductions as an all-to-all of pieces summed in fp32 */
    int quantize_sends;    /* those pieces are converted from the gradient buffer first (int8) */
    int nccl_replicas;     /* replicas all-reduced by NCCL (fp32), else as pieces summed in fp32 */
    int quantized_gathers; /* gathers move blockwise codes from quantized shards */
    int working_copy;      /* a compute-dtype working copy of the shards exists apart from the master */
    int secondary_size;    /* hpZ: the secondary group's ranks (engine.h: reshard_size), 0 = none */
    int fp8_weights;       /* FP8 weights travel with one scale each and are unpacked per gather */
} fsdp_engine_mode;
void fsdp_engine_mode_of(const fsdp_shard_options *o, int shard_size, int replica_size, fsdp_engine_mode *out);

/* hpZ (src/shard/secondary.c): len[u] gets the elements of unit u's secondary shard, padded[u] / N
 * (padded over the shard group, which N divides), for every unit the training order visits again
 * after its forward and that is not pinned (the blocks: the backward gathers them again), else 0.
 * Returns their sum: the secondary copy's elements. 0 for all without m->secondary_size. */
int64_t fsdp_plan_secondary(const fsdp_engine_mode *m, const fsdp_shard_options *o, const int64_t *padded,
                            int num_units, int64_t *len);

/* FP8 weights (src/shard/fp8_weights.c): the bytes beside one gathered slot of ring `ring` (the most
 * any of its units needs: W and W^T of each weight, 256-byte aligned), given which[u], the ring of
 * unit u; and the bytes of every unit's scales and of the amaxes exchanged (one allocation). */
size_t fsdp_plan_fp8_slot_bytes(const fsdp_unit_spec *units, int num_units, const int *which, int ring);
size_t fsdp_plan_fp8_scale_bytes(int num_units, int shard_size);

/* Elements of each of the R pieces a replica all-reduce of n elements is cut into: n / R rounded up
 * to FSDP_SHARD_ALIGN (the last piece is ragged and padded with zeros). */
static inline int64_t fsdp_replica_piece(int64_t n, int replicas) {
    int64_t per = (n + replicas - 1) / replicas;
    return (per + FSDP_SHARD_ALIGN - 1) / FSDP_SHARD_ALIGN * FSDP_SHARD_ALIGN;
}

/* Bytes of the buffers the wire needs, for the largest shard (one reduction and one gather at a time
 * on their streams): pieces sent and received by all-to-all reductions, the fp32 sum of a shard
 * before its replicas' all-reduce, a replica all-reduce's own fp32 piece and its gathered bf16
 * result, the quantized shards (one allocation) and the pieces their gathers land in. 0 = none. */
typedef struct {
    size_t send, recv, summed, replica_piece, replica_gathered;
    size_t quantized_shards, gather_staging;
} fsdp_wire_buffers;
void fsdp_plan_wire_buffers(const fsdp_engine_mode *m, const fsdp_shard_options *o, const int64_t *shard_len,
                            int num_units, int forward_only, fsdp_device_kind kind, fsdp_wire_buffers *out);

#endif
