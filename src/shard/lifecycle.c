/* The unit lifecycle over the backend's streams and events: gather (prefetched by the visiting
 * order) -> compute -> reshard -> reduce into the gradient shards (reduce.c); and the step around
 * it: the micro-batches of a step, the gradient shards, and the update of the shards that starts
 * the next step's gathers. */
#include <string.h>

#include "../base/error.h"
#include "engine_internal.h"

/* ---- gathering ---- */

static int resident(const fsdp_engine *e, int u) { return e->shard_size == 1 || e->units[u].param_slot >= 0; }

/* Starts the all-gather of unit u into a free slot of its ring; returns 0 when no slot is free. */
static int start_gather(fsdp_engine *e, int u) {
    fsdp_backend *be = e->be;
    unit_state *s = &e->units[u];
    slot_ring *r = &e->param_rings[s->param_ring];
    int slot = slot_ring_free_slot(r);
    if (slot < 0) return 0;
    if (r->released_valid[slot]) be->runtime->stream_wait_event(be, e->gather_stream, r->released[slot]);
    /* The shard it sends is what the last update of the shards wrote on the compute stream. */
    if (e->updated_valid) be->runtime->stream_wait_event(be, e->gather_stream, e->updated);
    void *dst = slot_ring_slot(r, slot, e->ce);
    size_t n = (size_t)s->shard_len;
    int u_index = (int)(s - e->units);
    int in_node = s->secondary_ready;
    engine_span span = engine_span_begin(e, e->gather_stream);
    s->fp8_ready = 0;
    if (s->secondary_ready) {
        /* hpZ: the backward's gather, from the slices its forward kept, inside the secondary group. */
        engine_gather_secondary(e, u_index, dst);
    } else if (e->mode.quantized_gathers) {
        /* Codes and scales of every rank's shard, then the unit in the compute dtype: one staging
         * area serves every gather, since the gather stream runs them one after the other. */
        fsdp_dtype q = e->opts.gather_dtype;
        be->coll->all_gather(be, e->gather_comm, (const char *)e->qshards + e->qoffset[u_index], e->gather_staging, n,
                             q, e->gather_stream);
        be->ops->dequantize(be, dst, e->opts.compute_dtype, e->gather_staging, q, n, e->shard_size, e->gather_stream);
        engine_unpack_fp8_weights(e, u_index, slot, dst);
        s->fp8_ready = e->mode.fp8_weights && s->num_fp8 > 0;
        engine_count_pieces(e, FSDP_COMM_GATHER, e->shard_size, engine_wire_bytes(q, n));
    } else {
        const void *src = (const char *)e->working + (size_t)s->offset * e->ce;
        be->coll->all_gather(be, e->gather_comm, src, dst, n, e->opts.compute_dtype, e->gather_stream);
        engine_count_pieces(e, FSDP_COMM_GATHER, e->shard_size, engine_wire_bytes(e->opts.compute_dtype, n));
    }
    /* Before the gather's event, so that on the CPU the wait for that event also times the span's end. */
    engine_span_end(e, span, e->gather_stream, FSDP_TRACK_GATHER, in_node ? "gather in node" : "gather", u_index,
                    e->mode.quantized_gathers && !in_node ? e->opts.gather_dtype : e->opts.compute_dtype);
    be->runtime->event_record(be, engine_timing_event(e, &s->gather_event), e->gather_stream);
    r->owner[slot] = u;
    s->param_slot = slot;
    return 1;
}

static void prefetch(fsdp_engine *e) {
    int ahead = 0;
    for (int k = e->cursor; k < e->active_len && ahead < e->opts.prefetch; k++) {
        int u = e->active[k];
        ahead++;
        if (resident(e, u)) continue;
        if (!start_gather(e, u)) break; /* the ring is full: max_live bounds what is alive */
    }
}

int engine_last_microbatch(const fsdp_engine *e) { return e->microbatch >= e->microbatches - 1; }

void fsdp_engine_begin_microbatch(fsdp_engine *e) {
    if (e->opts.forward_only) fsdp_fatal("internal error: a training micro-batch on a forward-only engine");
    e->microbatch++;
    e->cursor = 0;
    e->active = e->order, e->active_len = e->opts.order_len, e->forward_mode = 0;
    engine_reset_secondary(e);
    /* The last micro-batch's gradient rows are still read on the reduce stream. */
    if (e->rows_pending) {
        e->be->runtime->stream_wait_event(e->be, e->be->compute, e->rows_done);
        e->rows_pending = 0;
    }
    if (e->shard_size > 1) prefetch(e);
}

void fsdp_engine_begin_forward(fsdp_engine *e) {
    e->cursor = 0;
    e->active = e->forward_order, e->active_len = e->forward_len, e->forward_mode = 1;
    engine_reset_secondary(e);
    if (e->shard_size > 1) prefetch(e);
}

const void *fsdp_engine_params(fsdp_engine *e, int u) {
    if (e->cursor >= e->active_len || e->active[e->cursor] != u)
        fsdp_fatal("internal error: unit %d visited out of the declared %s order (position %d)", u,
                   e->forward_mode ? "forward-only" : "training", e->cursor);
    e->cursor++;
    unit_state *s = &e->units[u];
    if (e->shard_size == 1) return (const char *)e->working + (size_t)s->offset * e->ce;
    if (s->param_slot < 0 && !start_gather(e, u))
        fsdp_fatal("internal error: no free slot to gather unit %d (--max-live-units %d)", u, e->opts.max_live);
    /* Each gather is waited for once: a unit kept across uses (SHARD_GRAD_OP) is already there. */
    if (s->gather_event >= 0) {
        engine_compute_waits(e, s->gather_event, u);
        s->gather_event = -1;
    }
    prefetch(e);
    return slot_ring_slot(&e->param_rings[s->param_ring], s->param_slot, e->ce);
}

static void release_params(fsdp_engine *e, int u) {
    unit_state *s = &e->units[u];
    if (e->shard_size == 1 || s->param_slot < 0) return;
    slot_ring *r = &e->param_rings[s->param_ring];
    e->be->runtime->event_record(e->be, r->released[s->param_slot], e->be->compute);
    r->released_valid[s->param_slot] = 1;
    r->owner[s->param_slot] = -1;
    s->param_slot = -1;
}

void fsdp_engine_done_forward(fsdp_engine *e, int u) {
    int reshard = e->opts.strategy == FSDP_FULL || e->opts.strategy == FSDP_HYBRID;
    /* hpZ: the slice the backward gathers back inside the secondary group, kept before the release. */
    if (!e->forward_mode && reshard && !e->pinned[u]) engine_keep_secondary(e, u);
    if (e->forward_mode || (reshard && !e->pinned[u])) release_params(e, u); /* forward-only: no backward */
    /* Gathers held back by a full ring can start now that a slot is free. */
    if (e->shard_size > 1) prefetch(e);
}

/* ---- gradients ---- */

static int grad_slot_index(const fsdp_engine *e, int ring_index, int slot) {
    int base = 0;
    for (int r = 0; r < ring_index; r++) base += e->grad_rings[r].capacity;
    return base + slot;
}

/* grad_slot of a unit whose backward writes straight into its gradient shard (direct_grads). */
#define DIRECT_SLOT (-2)

void *engine_grad_shard(const fsdp_engine *e, const unit_state *s) {
    return (char *)e->grad + (size_t)s->offset * e->me;
}

void *fsdp_engine_grads(fsdp_engine *e, int u) {
    fsdp_backend *be = e->be;
    unit_state *s = &e->units[u];
    if (e->forward_mode) fsdp_fatal("internal error: gradients of unit %d asked for in a forward-only micro-batch", u);
    if (e->mode.direct_grads) {
        if (!e->written[u]) be->runtime->zero(be, engine_grad_shard(e, s), (size_t)s->shard_len * e->me, be->compute);
        e->written[u] = 1;
        s->grad_slot = DIRECT_SLOT;
        return engine_grad_shard(e, s);
    }
    slot_ring *r = &e->grad_rings[s->grad_ring];
    if (s->grad_slot < 0) {
        int slot = slot_ring_free_slot(r);
        if (slot < 0) fsdp_fatal("internal error: no free gradient buffer for unit %d", u);
        /* The buffer's previous reduction must be finished before it is zeroed and reused. */
        if (r->released_valid[slot]) engine_compute_waits_for(e, r->released[slot], u); /* a stall on a reduction */
        be->runtime->zero(be, slot_ring_slot(r, slot, e->ge), (size_t)r->elems * e->ge, be->compute);
        r->owner[slot] = u;
        s->grad_slot = slot;
    }
    return slot_ring_slot(r, s->grad_slot, e->ge);
}

/* After a unit's backward: its gathered parameters go, unless SHARD_GRAD_OP keeps them for the
 * step's next micro-batch. */
static void release_after_backward(fsdp_engine *e, int u) {
    if (!(e->mode.hold_params && !engine_last_microbatch(e))) release_params(e, u);
    if (e->shard_size > 1) prefetch(e);
}

/* The reduce stream waits for the backward the compute stream has enqueued so far. */
static void reduce_after_compute(fsdp_engine *e, fsdp_event *ready) {
    e->be->runtime->event_record(e->be, ready, e->be->compute);
    e->be->runtime->stream_wait_event(e->be, e->reduce_stream, ready);
}

void fsdp_engine_done_backward(fsdp_engine *e, int u) {
    fsdp_backend *be = e->be;
    unit_state *s = &e->units[u];
    int last = engine_last_microbatch(e);
    if (s->grad_slot == DIRECT_SLOT) {
        s->grad_slot = -1; /* already in its shard; the replicas' all-reduce waits for the last one */
        if (e->mode.defer_replicas && last) {
            reduce_after_compute(e, e->direct_ready);
            engine_span span = engine_span_begin(e, e->reduce_stream);
            engine_reduce_replicas_of_shard(e, s);
            engine_span_end(e, span, e->reduce_stream, FSDP_TRACK_REDUCE, "all-reduce", u, e->opts.master_dtype);
        }
    }
    /* No dense gradient this micro-batch (rows only, or already reduced), or one that stays local. */
    if (s->grad_slot < 0 || (e->mode.hold_grads && !last)) {
        release_after_backward(e, u);
        return;
    }
    slot_ring *r = &e->grad_rings[s->grad_ring];
    int slot = s->grad_slot;
    reduce_after_compute(e, e->grad_ready[grad_slot_index(e, s->grad_ring, slot)]);
    engine_span span = engine_span_begin(e, e->reduce_stream);
    engine_reduce_unit(e, s, slot_ring_slot(r, slot, e->ge));
    engine_span_end(e, span, e->reduce_stream, FSDP_TRACK_REDUCE, e->shard_size > 1 ? "reduce-scatter" : "all-reduce", u,
                    e->mode.piece_reductions ? e->opts.reduce_dtype : e->opts.grad_dtype);
    be->runtime->event_record(be, r->released[slot], e->reduce_stream);
    r->released_valid[slot] = 1;
    r->owner[slot] = -1;
    s->grad_slot = -1;
    release_after_backward(e, u);
}

/* ---- one step ---- */

void fsdp_engine_begin_step(fsdp_engine *e, int microbatches) {
    /* Lazily: each unit's first gradient overwrites its shard, the rest are zeroed at the end. */
    memset(e->written, 0, (size_t)e->num_units);
    memset(e->replicas_done, 0, (size_t)e->num_units);
    e->microbatches = microbatches > 0 ? microbatches : 1;
    e->microbatch = -1;
    e->be->runtime->event_record(e->be, e->step_begun, e->be->compute);
}

void fsdp_engine_wait_reductions(fsdp_engine *e) {
    fsdp_backend *be = e->be;
    /* Only once the last step's update, which read these shards on the compute stream, is done. */
    be->runtime->stream_wait_event(be, e->reduce_stream, e->step_begun);
    for (int u = 0; u < e->num_units; u++) {
        /* A unit whose last gradient came before the step's last micro-batch (none does in the
         * models today) still needs its replicas' sum; a unit no micro-batch wrote is zero on all. */
        if (e->written[u] && e->mode.defer_replicas && !e->replicas_done[u]) {
            reduce_after_compute(e, e->direct_ready);
            engine_span span = engine_span_begin(e, e->reduce_stream);
            engine_reduce_replicas_of_shard(e, &e->units[u]);
            engine_span_end(e, span, e->reduce_stream, FSDP_TRACK_REDUCE, "all-reduce", u, e->opts.master_dtype);
        }
        if (e->written[u]) continue;
        be->runtime->zero(be, engine_grad_shard(e, &e->units[u]), (size_t)e->units[u].shard_len * e->me, e->reduce_stream);
        e->written[u] = 1;
    }
    int idx;
    fsdp_event *done = engine_timing_event(e, &idx);
    e->be->runtime->event_record(e->be, done, e->reduce_stream);
    engine_compute_waits(e, idx, -1);
    e->rows_pending = 0; /* behind the same wait */
}

void fsdp_engine_grad_sumsq(fsdp_engine *e, float *out) {
    fsdp_backend *be = e->be;
    engine_span span = engine_span_begin(e, be->compute);
    be->runtime->zero(be, out, sizeof(float), be->compute);
    be->ops->sum_squares(be, out, e->grad, e->opts.master_dtype, (size_t)e->total_shard, be->compute);
    if (e->shard_size > 1) {
        be->coll->all_reduce(be, e->norm_comm, out, 1, FSDP_F32, be->compute);
        engine_count_all_reduce(e, FSDP_COMM_OTHER, e->shard_size, sizeof(float));
    }
    engine_span_end(e, span, be->compute, FSDP_TRACK_COMPUTE, "grad norm", -1, FSDP_F32);
}

void engine_quantize_shard(fsdp_engine *e, int u) {
    const unit_state *s = &e->units[u];
    e->be->ops->quantize(e->be, (char *)e->qshards + e->qoffset[u], e->opts.gather_dtype,
                         (const char *)e->master + (size_t)s->offset * e->me, e->opts.master_dtype,
                         (size_t)s->shard_len, 1, (size_t)s->shard_len, e->be->compute);
    engine_measure_fp8_weights(e, u);
}

/* Unit u's shard and its quantized copy are written (compute stream): if the next step opens with u,
 * its gather starts now, behind the rest of the update. */
static void shard_ready(fsdp_engine *e, int u) {
    e->be->runtime->event_record(e->be, e->updated, e->be->compute);
    e->updated_valid = 1;
    /* The next step opens with these units: gathering them now hides the gathers behind the rest
     * of the update instead of exposing them at the start of the next step. */
    for (int k = 0; k <= e->opts.prefetch && k < e->opts.order_len; k++)
        if (e->order[k] == u && !resident(e, u)) start_gather(e, u);
}

/* A unit with FP8 weights waits for every unit's amax (engine_encode_fp8_weights) before its gather. */
static int waits_for_fp8(const fsdp_engine *e, int u) { return e->mode.fp8_weights && e->units[u].num_fp8 > 0; }

void fsdp_engine_update_shards(fsdp_engine *e, fsdp_shard_update update, void *ctx) {
    for (int u = 0; u < e->num_units; u++) {
        fsdp_shard_view v = fsdp_engine_view(e, u);
        update(ctx, u, &v);
        if (e->shard_size == 1) continue;
        if (e->mode.quantized_gathers) engine_quantize_shard(e, u);
        if (!waits_for_fp8(e, u)) shard_ready(e, u);
    }
    if (e->mode.fp8_weights) {
        engine_encode_fp8_weights(e);
        for (int u = 0; u < e->num_units; u++)
            if (waits_for_fp8(e, u)) shard_ready(e, u);
    }
    /* Only the gathers just started for the next step may hold a slot: every other unit was
     * released by its backward. */
    for (int u = 0; u < e->num_units; u++)
        if (e->shard_size > 1 && e->units[u].param_slot >= 0 && e->units[u].gather_event < 0)
            fsdp_fatal("internal error: unit %d still gathered at the update of the shards", u);
    /* Gathers issued later wait for the whole update. */
    e->be->runtime->event_record(e->be, e->updated, e->be->compute);
    e->updated_valid = 1;
}
