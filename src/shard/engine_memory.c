/* The engine's memory without a device: every buffer fsdp_engine_create allocates, from the groups a
 * strategy forms and the rings (engine.h: fsdp_engine_memory_plan). */
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "engine.h"
#include "engine_plan.h"

/* Adds one allocation of `bytes` to a class of state, as the device counts it. */
static size_t take(fsdp_engine_memory *m, size_t *klass, fsdp_device_kind kind, size_t bytes) {
    size_t counted = fsdp_device_alloc_size(kind, bytes);
    *klass += counted;
    m->total += counted;
    return counted;
}

static size_t ring_bytes(fsdp_engine_memory *m, size_t *klass, fsdp_device_kind kind, const fsdp_ring_shape *rings,
                         int n, size_t esize, int *slots) {
    size_t sum = 0;
    for (int r = 0; r < n; r++) {
        sum += take(m, klass, kind, (size_t)rings[r].capacity * (size_t)rings[r].elems * esize);
        *slots += rings[r].capacity;
    }
    return sum;
}

void fsdp_engine_memory_plan(const fsdp_unit_spec *units, int num_units, const fsdp_shard_options *opts, int world,
                             int node_size, fsdp_device_kind kind, fsdp_engine_memory *out) {
    memset(out, 0, sizeof *out);
    int S, R;
    fsdp_strategy_groups(opts->strategy, world, node_size, &S, &R);
    out->shard_size = S, out->replica_size = R;
    fsdp_engine_mode mode;
    fsdp_engine_mode_of(opts, S, R, &mode);
    size_t me = fsdp_device_dtype_size(kind, opts->master_dtype), ce = fsdp_device_dtype_size(kind, opts->compute_dtype);
    size_t ge = fsdp_device_dtype_size(kind, opts->grad_dtype);

    int64_t *padded = fsdp_xmalloc((size_t)num_units * sizeof(int64_t), "unit sizes");
    int64_t *shard_len = fsdp_xmalloc((size_t)num_units * sizeof(int64_t), "unit sizes");
    for (int u = 0; u < num_units; u++) {
        padded[u] = fsdp_shard_padded(units[u].numel, S);
        shard_len[u] = padded[u] / S;
        out->total_shard += shard_len[u];
        if (shard_len[u] > out->largest_shard) out->largest_shard = shard_len[u];
    }
    size_t shard_bytes = (size_t)out->total_shard * me;
    take(out, &out->master, kind, shard_bytes);
    int training = !opts->forward_only; /* a forward-only engine holds weights and gathered units only */
    if (training) take(out, &out->grads, kind, shard_bytes);
    if (mode.working_copy) take(out, &out->working, kind, (size_t)out->total_shard * ce);

    fsdp_ring_shape *rings = fsdp_xcalloc((size_t)num_units, sizeof *rings, "unit rings");
    int *which = fsdp_xmalloc((size_t)num_units * sizeof(int), "unit rings");
    if (S > 1) {
        out->gathered_rings = fsdp_plan_rings(padded, opts->pinned, num_units, opts->max_live,
                                              opts->strategy == FSDP_SHARD_GRAD_OP, rings, which);
        ring_bytes(out, &out->gathered, kind, rings, out->gathered_rings, ce, &out->gathered_slots);
    }
    if (mode.fp8_weights) { /* the FP8 weights' codes beside each gathered slot, and their scales */
        for (int r = 0; r < out->gathered_rings; r++) {
            size_t slot = fsdp_plan_fp8_slot_bytes(units, num_units, which, r);
            if (slot) take(out, &out->fp8_weights, kind, (size_t)rings[r].capacity * slot);
        }
        take(out, &out->fp8_weights, kind, fsdp_plan_fp8_scale_bytes(num_units, S));
    }
    if (!mode.direct_grads && training) {
        out->grad_rings = fsdp_plan_rings(padded, opts->pinned, num_units, opts->max_live, mode.hold_grads, rings, which);
        ring_bytes(out, &out->grad_buffers, kind, rings, out->grad_rings, ge, &out->grad_slots);
    }
    if (world > 1 && opts->rows_capacity > 0 && training) {
        size_t n = (size_t)world * (size_t)opts->rows_capacity;
        take(out, &out->grad_rows, kind, n * (size_t)opts->row_len * ce);
        take(out, &out->grad_rows, kind, FSDP_MAX_ROW_SETS * n * sizeof(int32_t));
    }
    fsdp_wire_buffers w;
    fsdp_plan_wire_buffers(&mode, opts, shard_len, num_units, opts->forward_only, kind, &w);
    const size_t staging[] = {w.send, w.recv, w.summed, w.replica_piece, w.replica_gathered};
    for (size_t i = 0; i < sizeof staging / sizeof staging[0]; i++)
        if (staging[i]) take(out, &out->staging, kind, staging[i]);
    if (w.quantized_shards) take(out, &out->quantized, kind, w.quantized_shards);
    if (w.gather_staging) take(out, &out->quantized, kind, w.gather_staging);
    /* hpZ: the secondary copy of every unit the backward gathers again (src/shard/secondary.c). */
    out->secondary_size = mode.secondary_size;
    int64_t *secondary_len = fsdp_xmalloc((size_t)num_units * sizeof(int64_t), "unit sizes");
    int64_t secondary = fsdp_plan_secondary(&mode, opts, padded, num_units, secondary_len);
    if (secondary > 0) take(out, &out->secondary, kind, (size_t)secondary * ce);
    free(secondary_len);

    if (training) {
        out->communicators = (S > 1 ? 3 : 0) + (R > 1 ? 1 : 0) + (world > 1 && S != world && R != world ? 1 : 0) +
                             (mode.secondary_size ? 1 : 0);
        out->all_reduce_communicators = R > 1 ? 1 : 0;
    } else {
        out->communicators = S > 1 ? 1 : 0; /* the gathers' */
    }
    free(rings);
    free(which);
    free(padded);
    free(shard_len);
}
