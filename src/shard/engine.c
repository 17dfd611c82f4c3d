/* The FSDP engine's creation and destruction, its buffers (one allocation per class of state) and the
 * views of its shards. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#include "../base/agree.h"
#include "../base/error.h"
#include "engine_internal.h"

fsdp_engine *fsdp_engine_create(fsdp_backend *be, MPI_Comm world, const fsdp_topology *topo,
                                const fsdp_unit_spec *specs, int num_units, const fsdp_shard_options *opts,
                                fsdp_err *err) {
    if (opts->strategy == FSDP_HYBRID && !topo->uniform_nodes) {
        fsdp_errf(err, "--strategy HYBRID needs the same number of ranks on every node (use --ranks-per-node)");
        return NULL;
    }
    if (opts->max_live < 1) {
        fsdp_usagef(err, "--max-live-units must be at least 1");
        return NULL;
    }
    fsdp_engine *e = fsdp_xcalloc(1, sizeof *e, "the FSDP engine");
    e->be = be;
    e->opts = *opts;
    e->num_units = num_units;
    e->order = fsdp_xmalloc((size_t)opts->order_len * sizeof(int), "the unit order");
    memcpy(e->order, opts->order, (size_t)opts->order_len * sizeof(int));
    e->forward_len = opts->forward_order_len;
    e->forward_order = fsdp_xmalloc((size_t)(e->forward_len > 0 ? e->forward_len : 1) * sizeof(int), "the unit order");
    if (e->forward_len > 0) memcpy(e->forward_order, opts->forward_order, (size_t)e->forward_len * sizeof(int));
    e->active = e->order, e->active_len = opts->order_len;
    e->pinned = fsdp_xcalloc((size_t)num_units, sizeof(int), "pinned units");
    if (opts->pinned) memcpy(e->pinned, opts->pinned, (size_t)num_units * sizeof(int));
    e->me = be->runtime->dtype_size(be, opts->master_dtype);
    e->ce = be->runtime->dtype_size(be, opts->compute_dtype);
    e->re = be->runtime->dtype_size(be, opts->reduce_dtype);

    /* The communicators first: the buffers gathers send from and receive into belong to the gather
     * communicator. */
    engine_open_groups(e, world, topo);
    int S = e->shard_size;
    e->units = fsdp_xcalloc((size_t)num_units, sizeof *e->units, "unit state");
    for (int u = 0; u < num_units; u++) {
        unit_state *s = &e->units[u];
        s->numel = specs[u].numel;
        s->decay_numel = specs[u].decay_numel;
        s->padded = fsdp_shard_padded(s->numel, S);
        s->shard_len = s->padded / S;
        s->offset = e->total_shard;
        s->param_slot = -1;
        s->grad_slot = -1;
        s->gather_event = -1;
        e->total_shard += s->shard_len;
    }

    /* One allocation per class of state. */
    size_t reserved_before = be->reserved_bytes;
    size_t shard_bytes = (size_t)e->total_shard * e->me;
    int aliased = opts->compute_dtype == opts->master_dtype;
    e->master = aliased ? be->coll->alloc_shared(be, e->gather_comm, shard_bytes, "master weights")
                        : be->runtime->alloc(be, shard_bytes, "master weights");
    if (!opts->forward_only) {
        e->grad = be->runtime->alloc(be, shard_bytes, "gradient shards");
    }
    if (aliased) {
        e->working = e->master;
    } else {
        e->working = be->coll->alloc_shared(be, e->gather_comm, (size_t)e->total_shard * e->ce, "working copy of the shards");
    }

    int *which = fsdp_xmalloc((size_t)num_units * sizeof(int), "unit rings");
    if (S > 1) {
        int keep_all = opts->strategy == FSDP_SHARD_GRAD_OP;
        e->num_param_rings = engine_build_rings(e, &e->param_rings, which, keep_all);
        for (int u = 0; u < num_units; u++) e->units[u].param_ring = which[u];
        for (int r = 0; r < e->num_param_rings; r++)
            slot_ring_alloc(e, &e->param_rings[r], e->ce, e->gather_comm, "gathered units");
    }
    e->direct_grads = S == 1 && e->replica_size == 1 && opts->reduce_dtype == opts->master_dtype;
    e->written = fsdp_xcalloc((size_t)num_units, 1, "gradient shard flags");
    e->step_begun = be->runtime->event_create(be, 0);
    e->num_grad_rings = e->direct_grads || opts->forward_only ? 0 : engine_build_rings(e, &e->grad_rings, which, 0);
    for (int u = 0; u < num_units; u++) e->units[u].grad_ring = e->num_grad_rings ? which[u] : -1;
    int grad_slots = 0;
    for (int r = 0; r < e->num_grad_rings; r++) {
        slot_ring_alloc(e, &e->grad_rings[r], e->re, opts->copy_engine_reductions ? e->reduce_comm : NULL,
                        "unit gradient buffers");
        grad_slots += e->grad_rings[r].capacity;
    }
    free(which);
    e->grad_ready = fsdp_xcalloc((size_t)grad_slots, sizeof *e->grad_ready, "gradient events");
    for (int i = 0; i < grad_slots; i++) e->grad_ready[i] = be->runtime->event_create(be, 0);
    /* What the first step would otherwise size: nothing is allocated once training runs. */
    if (e->world_size > 1 && opts->rows_capacity > 0 && !opts->forward_only)
        engine_reserve_rows(e, opts->rows_capacity, opts->row_len);
    if (S > 1 && opts->copy_engine_reductions && !opts->forward_only) {
        int64_t largest = 0;
        for (int u = 0; u < num_units; u++) largest = e->units[u].padded > largest ? e->units[u].padded : largest;
        engine_reserve_staging(e, largest);
    }
    /* The memory plans count with the same functions; this keeps them honest. */
    if (!be->oom.failures && !opts->copy_engine_gathers && !opts->copy_engine_reductions) {
        fsdp_engine_memory plan;
        fsdp_engine_memory_plan(specs, num_units, opts, topo->world, topo->node_size, be->kind, &plan);
        if (be->reserved_bytes - reserved_before != plan.total)
            fsdp_fatal("internal error: the engine allocated %zu bytes, its memory plan says %zu",
                       be->reserved_bytes - reserved_before, plan.total);
    }

    e->gather_stream = be->runtime->stream_create(be, "gather");
    e->reduce_stream = be->runtime->stream_create(be, "reduce");
    e->updated = be->runtime->event_create(be, 0);
    e->rows_ready = be->runtime->event_create(be, 0);
    e->rows_done = be->runtime->event_create(be, 0);
    if (fsdp_agree(world, err)) {
        fsdp_engine_destroy(e);
        return NULL;
    }
    return e;
}

void fsdp_engine_destroy(fsdp_engine *e) {
    if (!e) return;
    fsdp_backend *be = e->be;
    be->runtime->stream_synchronize(be, e->gather_stream);
    be->runtime->stream_synchronize(be, e->reduce_stream);
    be->runtime->stream_synchronize(be, be->compute);
    int grad_slots = 0;
    for (int r = 0; r < e->num_grad_rings; r++) grad_slots += e->grad_rings[r].capacity;
    for (int r = 0; r < e->num_param_rings; r++) slot_ring_free(be, &e->param_rings[r]);
    for (int r = 0; r < e->num_grad_rings; r++) slot_ring_free(be, &e->grad_rings[r]);
    for (int i = 0; i < grad_slots; i++) be->runtime->event_destroy(be, e->grad_ready[i]);
    engine_free_timing(e);
    be->runtime->event_destroy(be, e->updated);
    be->runtime->event_destroy(be, e->step_begun);
    free(e->written);
    if (e->rows_values) be->runtime->free(be, e->rows_values);
    if (e->rows_index) be->runtime->free(be, e->rows_index);
    be->runtime->event_destroy(be, e->rows_ready);
    be->runtime->event_destroy(be, e->rows_done);
    be->runtime->stream_destroy(be, e->gather_stream);
    be->runtime->stream_destroy(be, e->reduce_stream);
    if (e->staging) be->runtime->free(be, e->staging);
    if (e->working != e->master) be->runtime->free(be, e->working);
    be->runtime->free(be, e->master);
    be->runtime->free(be, e->grad);
    /* After the memory that alloc_shared gave for them. */
    engine_close_groups(e);
    free(e->param_rings);
    free(e->grad_rings);
    free(e->grad_ready);
    free(e->units);
    free(e->order);
    free(e->forward_order);
    free(e->pinned);
    free(e);
}


static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

fsdp_shard_view fsdp_engine_view(const fsdp_engine *e, int unit) {
    const unit_state *s = &e->units[unit];
    fsdp_shard_view v;
    size_t off = (size_t)s->offset;
    v.master = (char *)e->master + off * e->me;
    v.grad = e->grad ? (char *)e->grad + off * e->me : NULL; /* NULL: a forward-only engine */
    v.working = (char *)e->working + off * e->ce;
    v.offset = s->offset;
    v.start = (int64_t)e->shard_rank * s->shard_len;
    v.len = s->shard_len;
    v.valid = clamp64(s->numel - v.start, 0, s->shard_len);
    v.decay_len = clamp64(s->decay_numel - v.start, 0, s->shard_len);
    return v;
}

fsdp_shard_extent fsdp_engine_extent(const fsdp_engine *e) {
    fsdp_shard_extent x = {e->num_units, e->total_shard, e->opts.master_dtype, e->opts.compute_dtype};
    return x;
}

void fsdp_engine_refresh_working(fsdp_engine *e) {
    if (e->working == e->master) return;
    e->be->ops->cast(e->be, e->working, e->opts.compute_dtype, e->master, e->opts.master_dtype, (size_t)e->total_shard,
                     e->be->compute);
}
