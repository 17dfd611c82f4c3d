/* A step laid out on the engine's streams (step_time.h): the trainer's micro-batch (trainer.c:
 * microbatch) and the engine's gathers, prefetches, slots and reductions (src/shard/lifecycle.c),
 * replayed in the host's order as tasks of a timeline. */
#include "step_time.h"

#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "timeline.h"

/* Units of one size share a ring of slots (src/shard/rings.c): who holds each slot, and the task
 * whose end frees it on the device. */
typedef struct {
    int64_t numel;
    int capacity;
    int *holder, *release; /* capacity each */
} ring;

typedef struct {
    const fsdp_model_config *cfg;
    const fsdp_train_options *o;
    fsdp_layout layout;
    int *order, order_len, *pinned;
    fsdp_shard_options so;
    fsdp_wire_plan wire;
    int U, K, S, R, reshard, rows, tied, direct;
    double shard_bw, replica_bw, world_bw, secondary_bw; /* bytes per ms */
    int shard_link, replica_link, world_link, secondary_link; /* 1: between nodes, 2: inside a node (timeline.h) */
    double *fwd_ms, *bwd_ms, head_ms, *upd_ms, rows_bytes;
    fsdp_timeline tl;
    ring *prings, *grings;
    int nprings, ngrings, *pring_of, *gring_of;
    int *resident, *ready;  /* per unit: gathered (or gathering), and the gather task it waits for */
    int *secondary;         /* per unit: resharded after its forward into hpZ's secondary copy */
    int *grad_slot;         /* per unit: the gradient slot it holds, or -1 */
    int *unit_update;       /* per unit: the previous update's task (-1 before the first) */
    int last_update, last_reduce, rows_task;
    int counting;           /* bytes of this step are counted */
    fsdp_comm_bytes bytes;
} sim;

static int ring_of(ring *rings, int *n, int64_t numel) {
    for (int r = 0; r < *n; r++)
        if (rings[r].numel == numel) return r;
    memset(&rings[*n], 0, sizeof rings[*n]);
    rings[*n].numel = numel;
    return (*n)++;
}

/* Rings as fsdp_plan_rings makes them: max_live plus the ring's pinned units, or a slot per unit. */
static void make_rings(sim *s, ring *rings, int *n, int *of, int keep_all) {
    *n = 0;
    for (int u = 0; u < s->U; u++) of[u] = ring_of(rings, n, s->layout.units[u].numel);
    for (int r = 0; r < *n; r++) {
        int units = 0, pinned = 0;
        for (int u = 0; u < s->U; u++)
            if (of[u] == r) units++, pinned += s->pinned[u];
        int cap = keep_all ? units : s->o->max_live + pinned;
        rings[r].capacity = cap < units ? cap : units;
        rings[r].holder = fsdp_xmalloc((size_t)rings[r].capacity * sizeof(int), "the step's plan");
        rings[r].release = fsdp_xmalloc((size_t)rings[r].capacity * sizeof(int), "the step's plan");
        for (int k = 0; k < rings[r].capacity; k++) rings[r].holder[k] = -1, rings[r].release[k] = -1;
    }
}

static int take_slot(ring *r, int u) {
    for (int k = 0; k < r->capacity; k++)
        if (r->holder[k] < 0) {
            r->holder[k] = u;
            return k;
        }
    return -1;
}

static void free_slot(ring *r, int u, int task) {
    for (int k = 0; k < r->capacity; k++)
        if (r->holder[k] == u) {
            r->holder[k] = -1;
            r->release[k] = task;
            return;
        }
}

static void count(sim *s, fsdp_comm_kind k, double bytes) {
    if (s->counting) s->bytes.bytes[k] += bytes;
}

static int start_gather(sim *s, int u) {
    if (s->S == 1 || s->resident[u]) return 1;
    ring *r = &s->prings[s->pring_of[u]];
    int slot = take_slot(r, u);
    if (slot < 0) return 0;
    /* hpZ: a unit resharded after its forward is gathered for its backward inside its secondary group. */
    int inside = s->secondary[u];
    double bytes = inside ? s->wire.units[u].secondary : s->wire.units[u].gather;
    int t = fsdp_timeline_add(&s->tl, FSDP_TL_GATHER, bytes / (inside ? s->secondary_bw : s->shard_bw));
    s->tl.tasks[t].link = inside ? s->secondary_link : s->shard_link;
    fsdp_timeline_after(&s->tl, t, r->release[slot]);
    fsdp_timeline_after(&s->tl, t, s->unit_update[u] >= 0 && s->last_update < 0 ? s->unit_update[u] : s->last_update);
    count(s, inside ? FSDP_COMM_GATHER_SECONDARY : FSDP_COMM_GATHER, bytes);
    s->resident[u] = 1, s->ready[u] = t, s->secondary[u] = 0;
    return 1;
}

static void prefetch(sim *s, int cursor) {
    for (int k = cursor, ahead = 0; k < s->order_len && ahead < s->o->prefetch; k++, ahead++)
        if (!start_gather(s, s->order[k])) break;
}

/* params(u) at position k of the order: the gather it waits for, and the prefetch behind it. */
static int params(sim *s, int k, int compute) {
    int u = s->order[k];
    if (!start_gather(s, u)) fsdp_fatal("internal error: the step's plan found no slot for unit %d", u);
    if (s->S > 1) fsdp_timeline_after(&s->tl, compute, s->ready[u]);
    prefetch(s, k + 1);
    return u;
}

static void release_params(sim *s, int u, int task) {
    if (s->S == 1 || !s->resident[u]) return;
    free_slot(&s->prings[s->pring_of[u]], u, task);
    s->resident[u] = 0;
}

static void ask_grads(sim *s, int u, int compute) {
    if (s->direct || s->grad_slot[u] >= 0) return;
    ring *r = &s->grings[s->gring_of[u]];
    int slot = take_slot(r, u);
    if (slot < 0) fsdp_fatal("internal error: the step's plan found no gradient buffer for unit %d", u);
    fsdp_timeline_after(&s->tl, compute, r->release[slot]);
    s->grad_slot[u] = slot;
}

static int reduce_task(sim *s, fsdp_comm_kind k, double bytes, double bw, int link, int after) {
    int t = fsdp_timeline_add(&s->tl, FSDP_TL_REDUCE, bytes / bw);
    s->tl.tasks[t].link = link;
    fsdp_timeline_after(&s->tl, t, after);
    count(s, k, bytes);
    return s->last_reduce = t;
}

/* done_backward(u) after compute task c (lifecycle.c): the reductions, then the slots. */
static void done_backward(sim *s, int u, int c, int last) {
    const fsdp_unit_wire *w = &s->wire.units[u];
    int t = -1;
    if (s->direct && s->grad_slot[u] == -2) {
        s->grad_slot[u] = -1;
        if (s->wire.defer_replicas && last)
            reduce_task(s, FSDP_COMM_REPLICA, w->replica_step, s->replica_bw, s->replica_link, c);
    }
    if (s->grad_slot[u] >= 0 && !(s->wire.hold_grads && !last)) {
        if (s->S > 1) t = reduce_task(s, FSDP_COMM_REDUCE, w->reduce, s->shard_bw, s->shard_link, c);
        if (s->R > 1 && !s->wire.defer_replicas)
            t = reduce_task(s, FSDP_COMM_REPLICA, w->replica, s->replica_bw, s->replica_link, c);
        if (s->R > 1 && s->wire.defer_replicas && last)
            t = reduce_task(s, FSDP_COMM_REPLICA, w->replica_step, s->replica_bw, s->replica_link, c);
        if (t < 0) t = c; /* one rank, no replicas: nothing to send */
        free_slot(&s->grings[s->gring_of[u]], u, t);
        s->grad_slot[u] = -1;
    }
    if (!(s->wire.hold_params && !last)) release_params(s, u, c);
}

static void mark_direct(sim *s, int u) {
    if (s->direct) s->grad_slot[u] = -2; /* written straight into its shard */
}

static void microbatch(sim *s, int a) {
    int L = s->cfg->num_layers, E = fsdp_unit_embed(&s->layout), H = fsdp_unit_head(&s->layout);
    int last = a == s->K - 1, k = 0, c;
    if (s->S > 1) prefetch(s, 0);
    c = fsdp_timeline_add(&s->tl, FSDP_TL_COMPUTE, 0.0); /* the embedding: a lookup */
    fsdp_timeline_after(&s->tl, c, s->rows_task);       /* the last micro-batch's rows were read */
    params(s, k++, c);
    if (!s->pinned[E] && s->reshard) release_params(s, E, c);
    if (s->S > 1) prefetch(s, k);
    for (int i = 0; i < L; i++) {
        int u = s->order[k];
        c = fsdp_timeline_add(&s->tl, FSDP_TL_COMPUTE, s->fwd_ms[u]);
        params(s, k++, c);
        if (s->reshard && !s->pinned[u]) {
            release_params(s, u, c);
            s->secondary[u] = s->wire.units[u].secondary > 0.0;
        }
        if (s->S > 1) prefetch(s, k);
    }
    c = fsdp_timeline_add(&s->tl, FSDP_TL_COMPUTE, s->head_ms);
    params(s, k++, c);
    ask_grads(s, H, c), mark_direct(s, H);
    if (s->tied) ask_grads(s, E, c), mark_direct(s, E);
    done_backward(s, H, c, last);
    if (s->rows && s->tied) done_backward(s, E, c, last);
    for (int i = L - 1; i >= 0; i--) {
        int u = s->order[k];
        c = fsdp_timeline_add(&s->tl, FSDP_TL_COMPUTE, s->bwd_ms[u]);
        params(s, k++, c);
        ask_grads(s, u, c), mark_direct(s, u);
        done_backward(s, u, c, last);
    }
    c = fsdp_timeline_add(&s->tl, FSDP_TL_COMPUTE, 0.0); /* the embedding's backward */
    s->rows_task = -1;
    if (s->rows) {
        s->rows_task = fsdp_timeline_add(&s->tl, FSDP_TL_REDUCE, s->rows_bytes / s->world_bw);
        s->tl.tasks[s->rows_task].link = s->world_link;
        fsdp_timeline_after(&s->tl, s->rows_task, c);
        count(s, FSDP_COMM_OTHER, s->rows_bytes);
        s->last_reduce = s->rows_task;
    } else {
        ask_grads(s, E, c), mark_direct(s, E);
    }
    done_backward(s, E, c, last);
}

/* wait_reductions, the gradient norm, the update of the shards and the first gathers of the next. */
static void finish_step(sim *s) {
    int c = fsdp_timeline_add(&s->tl, FSDP_TL_COMPUTE, 0.0);
    fsdp_timeline_after(&s->tl, c, s->last_reduce);
    count(s, FSDP_COMM_OTHER, s->wire.norm);
    s->last_update = -1;
    for (int u = 0; u < s->U; u++) {
        s->unit_update[u] = fsdp_timeline_add(&s->tl, FSDP_TL_COMPUTE, s->upd_ms[u]);
        /* The next step's opening gathers start behind their unit's update; like the engine's count,
         * they belong to the step that starts them. */
        for (int k = 0; k <= s->o->prefetch && k < s->order_len; k++)
                if (s->order[k] == u) start_gather(s, u);
    }
    s->last_update = s->unit_update[s->U - 1];
}

double fsdp_step_time_microbatch_flops(const fsdp_model_config *cfg, const fsdp_train_options *o) {
    double T = (double)o->mbs * o->seq, C = cfg->hidden_size;
    fsdp_layout l;
    fsdp_layout_build(cfg, &l);
    double block = 2.0 * (double)l.units[fsdp_unit_block(&l, 0)].numel * T + 2.0 * C * o->seq * T;
    fsdp_layout_free(&l);
    double back = o->recompute == FSDP_RECOMPUTE_FULL ? 3.0 : 2.0;
    return cfg->num_layers * block * (1.0 + back) + 6.0 * C * cfg->vocab_size * T;
}

static double gbps_to_bytes_per_ms(double gbps) { return gbps * 1e6; }

void fsdp_step_time_predict(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place,
                            const fsdp_link *link, const fsdp_rates *rates, fsdp_step_time *out) {
    memset(out, 0, sizeof *out);
    sim s;
    memset(&s, 0, sizeof s);
    s.cfg = cfg, s.o = o;
    fsdp_layout_build(cfg, &s.layout);
    s.U = s.layout.num_units;
    fsdp_plan_unit_order(cfg, &s.layout, &s.order, &s.order_len, &s.pinned);
    fsdp_plan_shard_options(cfg, o, place->world, s.order, s.order_len, s.pinned, &s.so);
    fsdp_unit_spec *specs = fsdp_plan_unit_specs(cfg, o, &s.layout);
    fsdp_engine_wire_plan(specs, s.U, &s.so, place->world, place->node_size, &s.wire);
    free(specs);
    s.K = fsdp_plan_microbatches(o, place->world);
    s.S = s.wire.shard_size, s.R = s.wire.replica_size;
    s.reshard = o->strategy == FSDP_FULL || o->strategy == FSDP_HYBRID;
    s.rows = s.so.rows_capacity > 0 && place->world > 1;
    s.tied = cfg->tie_word_embeddings;
    s.direct = s.S == 1 && s.so.grad_dtype == o->master_dtype && (s.R == 1 || s.wire.defer_replicas);
    int spans = link->nodes > 1;
    double inter = gbps_to_bytes_per_ms(link->inter_gbps), intra = gbps_to_bytes_per_ms(link->intra_gbps);
    s.shard_link = spans && s.S > place->node_size ? 1 : 2;
    s.replica_link = s.world_link = spans ? 1 : 2;
    s.shard_bw = s.shard_link == 1 ? inter : intra;
    s.replica_bw = s.world_bw = spans ? inter : intra;
    /* hpZ's secondary group: ranks of one node when it fits in one (the engine groups consecutive ranks). */
    s.secondary_link = spans && s.wire.secondary_size > place->node_size ? 1 : 2;
    s.secondary_bw = s.secondary_link == 1 ? inter : intra;
    if (s.rows) { /* every rank's rows and their token indices, gathered over the world (grad_rows.c) */
        size_t n = (size_t)s.so.rows_capacity;
        s.rows_bytes = (double)(place->world - 1) *
                       (fsdp_wire_piece_bytes(o->compute_dtype, n * (size_t)s.so.row_len) + (double)(n * sizeof(int32_t)));
    }

    /* Compute: FLOPs at the measured rate; the update as memory traffic. */
    double per_ms = rates->tflops * 1e9, T = (double)o->mbs * o->seq, C = cfg->hidden_size;
    s.fwd_ms = fsdp_xcalloc((size_t)s.U, sizeof(double), "the step's plan");
    s.bwd_ms = fsdp_xcalloc((size_t)s.U, sizeof(double), "the step's plan");
    s.upd_ms = fsdp_xcalloc((size_t)s.U, sizeof(double), "the step's plan");
    double back = o->recompute == FSDP_RECOMPUTE_FULL ? 3.0 : 2.0;
    for (int i = 0; i < cfg->num_layers; i++) {
        int u = fsdp_unit_block(&s.layout, i);
        double f = 2.0 * (double)s.layout.units[u].numel * T + 2.0 * C * o->seq * T;
        s.fwd_ms[u] = f / per_ms, s.bwd_ms[u] = back * f / per_ms;
    }
    s.head_ms = 6.0 * C * cfg->vocab_size * T / per_ms;
    size_t me = fsdp_dtype_info_of(o->master_dtype)->bytes, ce = fsdp_dtype_info_of(o->compute_dtype)->bytes;
    int quantized = s.S > 1 && fsdp_dtype_blockwise(o->gather_dtype);
    double per_elem = 7.0 * (double)me + (quantized ? 1.0 : o->compute_dtype != o->master_dtype ? (double)ce : 0.0);
    for (int u = 0; u < s.U; u++) {
        double shard = (double)((s.layout.units[u].numel + (int64_t)s.S * 64 - 1) / ((int64_t)s.S * 64) * 64);
        s.upd_ms[u] = shard * per_elem / gbps_to_bytes_per_ms(rates->update_gbps);
        out->optimizer_ms += s.upd_ms[u];
    }

    s.prings = fsdp_xcalloc((size_t)s.U, sizeof(ring), "the step's plan");
    s.grings = fsdp_xcalloc((size_t)s.U, sizeof(ring), "the step's plan");
    s.pring_of = fsdp_xcalloc((size_t)s.U, sizeof(int), "the step's plan");
    s.gring_of = fsdp_xcalloc((size_t)s.U, sizeof(int), "the step's plan");
    make_rings(&s, s.prings, &s.nprings, s.pring_of, o->strategy == FSDP_SHARD_GRAD_OP);
    make_rings(&s, s.grings, &s.ngrings, s.gring_of, s.wire.hold_grads);
    s.resident = fsdp_xcalloc((size_t)s.U, sizeof(int), "the step's plan");
    s.ready = fsdp_xcalloc((size_t)s.U, sizeof(int), "the step's plan");
    s.secondary = fsdp_xcalloc((size_t)s.U, sizeof(int), "the step's plan");
    s.grad_slot = fsdp_xmalloc((size_t)s.U * sizeof(int), "the step's plan");
    s.unit_update = fsdp_xmalloc((size_t)s.U * sizeof(int), "the step's plan");
    for (int u = 0; u < s.U; u++) s.grad_slot[u] = -1, s.unit_update[u] = -1;
    s.last_update = s.last_reduce = s.rows_task = -1;

    /* Two steps: the second, whose first gathers ran behind the first one's update, is the steady state. */
    int first_end = -1;
    for (int step = 0; step < 2; step++) {
        s.counting = step == 1;
        for (int a = 0; a < s.K; a++) microbatch(&s, a);
        finish_step(&s);
        if (step == 0) first_end = s.last_update;
    }
    double k[FSDP_TL_STREAMS] = {0.0, rates->gather_interference, rates->interference};
    s.tl.concurrency[1] = link->inter_concurrency; /* link 1: between nodes */
    fsdp_timeline_run(&s.tl, k);
    out->step_ms = s.tl.tasks[s.last_update].end - s.tl.tasks[first_end].end;
    for (int i = s.tl.tasks[first_end].end >= 0 ? first_end + 1 : 0; i < s.tl.n; i++) {
        const fsdp_tl_task *t = &s.tl.tasks[i];
        if (t->stream == FSDP_TL_COMPUTE) out->compute_ms += t->ms;
        else out->comm_ms += t->ms;
    }
    out->exposed_ms = out->step_ms - out->compute_ms;
    out->microbatches = s.K;
    out->tokens_per_s_per_gpu = out->step_ms > 0.0 ? (double)s.K * T / (out->step_ms / 1e3) : 0.0;
    out->bytes = s.bytes;
    out->bytes.total = 0.0;
    for (int k = 0; k < FSDP_COMM_KINDS; k++) out->bytes.total += out->bytes.bytes[k];

    fsdp_timeline_free(&s.tl);
    fsdp_wire_plan_free(&s.wire);
    for (int r = 0; r < s.nprings; r++) free(s.prings[r].holder), free(s.prings[r].release);
    for (int r = 0; r < s.ngrings; r++) free(s.grings[r].holder), free(s.grings[r].release);
    free(s.fwd_ms), free(s.bwd_ms), free(s.upd_ms), free(s.prings), free(s.grings), free(s.pring_of), free(s.gring_of);
    free(s.resident), free(s.ready), free(s.secondary), free(s.grad_slot), free(s.unit_update);
    free(s.order), free(s.pinned);
    fsdp_layout_free(&s.layout);
}

double fsdp_step_time_rate_for(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place,
                               const fsdp_link *link, const fsdp_rates *rates, double measured_ms) {
    fsdp_rates r = *rates;
    if (r.tflops <= 0.0) r.tflops = 100.0;
    /* The step falls as the rate grows: scale the rate by the ratio of predicted to measured time
     * until they agree (the compute part scales exactly; the rest converges in a few rounds). */
    for (int i = 0; i < 60; i++) {
        fsdp_step_time t;
        fsdp_step_time_predict(cfg, o, place, link, &r, &t);
        double ratio = t.step_ms / measured_ms;
        if (ratio > 0.9995 && ratio < 1.0005) break;
        double scale = (t.compute_ms - t.optimizer_ms) > 0.0 ? ratio : 1.0;
        r.tflops *= scale > 4.0 ? 4.0 : scale < 0.25 ? 0.25 : scale;
    }
    return r.tflops;
}
