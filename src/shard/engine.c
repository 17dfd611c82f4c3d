/* The FSDP engine's creation and destruction, its buffers (one allocation per class of state) and the
 * views of its shards. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#include "../base/agree.h"
#include "../base/error.h"
#include "engine_internal.h"

/* The wire's buffers, as fsdp_plan_wire_buffers sizes them. The reductions' pieces belong to the
 * reduce communicator and the quantized shards and their gathers' pieces to the gather
 * communicator, so that copy-engine collectives can reach them. */
static void alloc_wire(fsdp_engine *e) {
    fsdp_backend *be = e->be;
    int64_t *shard_len = fsdp_xmalloc((size_t)e->num_units * sizeof(int64_t), "unit sizes");
    for (int u = 0; u < e->num_units; u++) shard_len[u] = e->units[u].shard_len;
    fsdp_wire_buffers w;
    fsdp_plan_wire_buffers(&e->mode, &e->opts, shard_len, e->num_units, e->opts.forward_only, be->kind, &w);
    free(shard_len);
    if (w.send) e->wire_send = be->coll->alloc_shared(be, e->reduce_comm, w.send, "gradient pieces sent");
    if (w.recv) e->wire_recv = be->coll->alloc_shared(be, e->reduce_comm, w.recv, "gradient pieces received");
    if (w.summed) e->summed = be->runtime->alloc(be, w.summed, "summed gradient pieces");
    if (w.replica_piece) e->replica_piece = be->runtime->alloc(be, w.replica_piece, "replica gradient piece");
    if (w.replica_gathered) e->replica_gathered = be->runtime->alloc(be, w.replica_gathered, "replica gradient sums");
    if (!e->mode.quantized_gathers) return;
    e->qshards = be->coll->alloc_shared(be, e->gather_comm, w.quantized_shards, "quantized shards");
    e->gather_staging = be->coll->alloc_shared(be, e->gather_comm, w.gather_staging, "quantized gathers");
    e->qoffset = fsdp_xmalloc((size_t)e->num_units * sizeof(size_t), "quantized shard offsets");
    size_t at = 0;
    for (int u = 0; u < e->num_units; u++) {
        e->qoffset[u] = at;
        at += fsdp_device_piece_bytes(be->kind, e->opts.gather_dtype, (size_t)e->units[u].shard_len);
    }
}

static void free_wire(fsdp_engine *e) {
    fsdp_backend *be = e->be;
    void *bufs[] = {e->wire_send, e->wire_recv, e->summed, e->replica_piece, e->replica_gathered, e->qshards,
                    e->gather_staging};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->runtime->free(be, bufs[i]);
    free(e->qoffset);
}

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
    if (engine_check_reshard(opts, topo, err)) return NULL;
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
    e->ge = be->runtime->dtype_size(be, opts->grad_dtype);

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
        s->num_fp8 = specs[u].num_fp8_matrices;
        if (s->num_fp8 < 0 || s->num_fp8 > FSDP_FP8_MAX_MATRICES)
            fsdp_fatal("internal error: unit %d with %d FP8 weights", u, s->num_fp8);
        memcpy(s->fp8, specs[u].fp8_matrices, sizeof s->fp8);
        e->total_shard += s->shard_len;
    }

    fsdp_engine_mode_of(opts, S, e->replica_size, &e->mode);

    /* One allocation per class of state. */
    size_t reserved_before = be->reserved_bytes;
    size_t shard_bytes = (size_t)e->total_shard * e->me;
    /* Gathers send from the master itself when it is the compute copy (and not quantized). */
    int gathers_from_master = opts->compute_dtype == opts->master_dtype && !e->mode.quantized_gathers;
    e->master = gathers_from_master ? be->coll->alloc_shared(be, e->gather_comm, shard_bytes, "master weights")
                                    : be->runtime->alloc(be, shard_bytes, "master weights");
    if (!opts->forward_only) {
        e->grad = be->runtime->alloc(be, shard_bytes, "gradient shards");
    }
    if (e->mode.working_copy)
        e->working = be->coll->alloc_shared(be, e->gather_comm, (size_t)e->total_shard * e->ce, "working copy of the shards");
    else
        e->working = e->master; /* the compute copy (S == 1), or nothing: quantized gathers read qshards */

    int *which = fsdp_xmalloc((size_t)num_units * sizeof(int), "unit rings");
    if (S > 1) {
        int keep_all = opts->strategy == FSDP_SHARD_GRAD_OP;
        e->num_param_rings = engine_build_rings(e, &e->param_rings, which, keep_all);
        for (int u = 0; u < num_units; u++) e->units[u].param_ring = which[u];
        for (int r = 0; r < e->num_param_rings; r++)
            slot_ring_alloc(e, &e->param_rings[r], e->ce, e->gather_comm, "gathered units");
    }
    e->written = fsdp_xcalloc((size_t)num_units, 1, "gradient shard flags");
    e->replicas_done = fsdp_xcalloc((size_t)num_units, 1, "gradient shard flags");
    e->step_begun = be->runtime->event_create(be, 0);
    e->direct_ready = be->runtime->event_create(be, 0);
    e->num_grad_rings =
        e->mode.direct_grads || opts->forward_only ? 0 : engine_build_rings(e, &e->grad_rings, which, e->mode.hold_grads);
    for (int u = 0; u < num_units; u++) e->units[u].grad_ring = e->num_grad_rings ? which[u] : -1;
    int grad_slots = 0;
    for (int r = 0; r < e->num_grad_rings; r++) {
        slot_ring_alloc(e, &e->grad_rings[r], e->ge, opts->copy_engine_reductions ? e->reduce_comm : NULL,
                        "unit gradient buffers");
        grad_slots += e->grad_rings[r].capacity;
    }
    free(which);
    e->grad_ready = fsdp_xcalloc((size_t)grad_slots, sizeof *e->grad_ready, "gradient events");
    for (int i = 0; i < grad_slots; i++) e->grad_ready[i] = be->runtime->event_create(be, 0);
    /* What the first step would otherwise size: nothing is allocated once training runs. */
    if (e->world_size > 1 && opts->rows_capacity > 0 && !opts->forward_only)
        engine_reserve_rows(e, opts->rows_capacity, opts->row_len);
    alloc_wire(e);
    engine_alloc_secondary(e);
    engine_alloc_fp8_weights(e);
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
    be->runtime->event_destroy(be, e->direct_ready);
    free(e->written);
    free(e->replicas_done);
    if (e->rows_values) be->runtime->free(be, e->rows_values);
    if (e->rows_index) be->runtime->free(be, e->rows_index);
    be->runtime->event_destroy(be, e->rows_ready);
    be->runtime->event_destroy(be, e->rows_done);
    be->runtime->stream_destroy(be, e->gather_stream);
    be->runtime->stream_destroy(be, e->reduce_stream);
    free_wire(e);
    engine_free_secondary(e);
    engine_free_fp8_weights(e);
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
    /* Without a working copy (the compute copy is the master, or gathers read quantized shards) it is
     * the master itself, which tells the update of the shards to write nothing else. */
    v.working = e->mode.working_copy ? (char *)e->working + off * e->ce : v.master;
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
    fsdp_backend *be = e->be;
    if (e->mode.quantized_gathers) {
        for (int u = 0; u < e->num_units; u++) engine_quantize_shard(e, u);
        engine_encode_fp8_weights(e);
    } else if (e->working != e->master) {
        be->ops->cast(be, e->working, e->opts.compute_dtype, e->master, e->opts.master_dtype, (size_t)e->total_shard,
                      be->compute);
    }
    /* Gathers read what the compute stream just wrote (or loaded): they wait for it. */
    be->runtime->event_record(be, e->updated, be->compute);
    e->updated_valid = 1;
}
