/* Private to the FSDP engine (src/shard): how units are padded into shards and grouped into rings of
 * slots (rings.c). fsdp_engine_create builds its buffers with these, and fsdp_engine_memory_plan
 * (engine_memory.c) counts the same buffers without a device. */
#ifndef FSDP_SHARD_ENGINE_PLAN_H
#define FSDP_SHARD_ENGINE_PLAN_H

#include <stdint.h>

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

#endif
