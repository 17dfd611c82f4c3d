/* The FSDP unit lifecycle over the backend's streams, events and collectives. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/agree.h"
#include "../base/env.h"
#include "../base/error.h"
#include "../base/log.h"
#include "engine_plan.h"

/* Units of the same padded size share buffers: a ring of slots, each holding one unit at a time. */
typedef struct {
    int64_t elems;          /* padded unit size */
    int capacity;
    void *base;             /* capacity * elems elements, one allocation */
    int *owner;             /* unit in the slot, or -1 */
    fsdp_event **released;  /* recorded on the stream that last used the slot */
    int *released_valid;
} ring;

typedef struct {
    int64_t numel, decay_numel, padded, shard_len, offset; /* offset: into the shard arrays */
    int param_ring, param_slot;                            /* gathered copy, or slot -1 */
    int gather_event;                                      /* pool index of its pending gather, or -1 */
    int grad_ring, grad_slot;
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
    MPI_Comm shard_mpi, replica_mpi;
    fsdp_comm *gather_comm, *reduce_comm, *replica_comm, *norm_comm;
    fsdp_stream *gather_stream, *reduce_stream;

    size_t me, ce, re; /* bytes per master / compute / reduce element */
    int64_t total_shard;
    void *master, *grad, *m, *v, *working;
    ring *param_rings, *grad_rings;
    int num_param_rings, num_grad_rings;
    fsdp_event **grad_ready;   /* per grad-ring slot, recorded on compute when its backward is done */
    fsdp_event *updated;       /* recorded on compute after the optimizer wrote the working shards */
    int updated_valid;

    /* Timing events for the measured communication wait, reused every step. */
    fsdp_event **pool;
    int pool_used, pool_cap;
    int *wait_pairs; /* (begin, end, what) per wait: pool indices; the unit gathered, or -1: reductions */
    int num_wait_pairs, wait_pairs_cap;
    size_t bytes;

    /* Gradient rows (fsdp_engine_add_rows): every rank's rows gathered over the world. */
    int world_size;
    fsdp_comm *rows_comm;      /* a world communicator used on the reduce stream */
    fsdp_comm *own_rows_comm;  /* created for it (HYBRID), else NULL: rows_comm aliases another */
    void *rows_values;         /* world * capacity * row_len compute-dtype elements */
    int32_t *rows_index;       /* FSDP_MAX_ROW_SETS * world * capacity */
    size_t rows_capacity;      /* entries per rank the buffers hold */
    int rows_len;              /* of row_len elements */
    size_t rows_bytes;
    fsdp_event *rows_ready, *rows_done;
    int rows_pending;          /* rows_done recorded and not yet waited for by compute */

    /* Copy-engine reductions: every rank's pieces of a unit's gradient land here (S * shard_len
     * reduce-dtype elements of the largest unit reduced so far), then are summed locally. */
    void *staging;
    int64_t staging_elems;

    /* Gradient shards are written, not zeroed and added to, by the first reduction of each unit in
     * a step (written[u] = 0 until then); units nothing wrote are zeroed before the optimizer.
     * direct_grads (one rank, no replicas, reduce dtype = master dtype): the backward accumulates
     * straight into the shard, which then IS the unit's gradient, and no buffers are needed. */
    unsigned char *written;
    int direct_grads;
    fsdp_event *step_begun; /* recorded on compute by fsdp_engine_begin_step */
};

static const char *const STRATEGY_NAMES[] = {"FULL", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID"};

int fsdp_strategy_parse(const char *text, fsdp_strategy *out) {
    static const struct {
        const char *name;
        fsdp_strategy s;
    } names[] = {{"FULL", FSDP_FULL},         {"FULL_SHARD", FSDP_FULL}, {"SHARD_GRAD_OP", FSDP_SHARD_GRAD_OP},
                 {"NO_SHARD", FSDP_NO_SHARD}, {"HYBRID", FSDP_HYBRID}, {"HYBRID_SHARD", FSDP_HYBRID}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!strcasecmp(text, names[i].name)) {
            *out = names[i].s;
            return 0;
        }
    }
    return -1;
}

const char *fsdp_strategy_name(fsdp_strategy s) { return STRATEGY_NAMES[s]; }

/* ---- timing pool ---- */

static fsdp_event *pool_event(fsdp_engine *e, int *index) {
    if (e->pool_used == e->pool_cap) {
        int cap = e->pool_cap ? 2 * e->pool_cap : 64;
        e->pool = realloc(e->pool, (size_t)cap * sizeof *e->pool);
        if (!e->pool) fsdp_fatal("out of host memory for timing events");
        for (int i = e->pool_cap; i < cap; i++) e->pool[i] = e->be->event_create(e->be, 1);
        e->pool_cap = cap;
    }
    *index = e->pool_used;
    return e->pool[e->pool_used++];
}

/* Makes compute wait for `ready` (a pool event) and remembers the pair to measure the stall. */
static void compute_waits(fsdp_engine *e, int ready_index, int what) {
    int begin;
    fsdp_event *b = pool_event(e, &begin);
    e->be->event_record(e->be, b, e->be->compute);
    e->be->stream_wait_event(e->be, e->be->compute, e->pool[ready_index]);
    if (e->num_wait_pairs == e->wait_pairs_cap) {
        e->wait_pairs_cap = e->wait_pairs_cap ? 2 * e->wait_pairs_cap : 64;
        e->wait_pairs = realloc(e->wait_pairs, (size_t)e->wait_pairs_cap * 3 * sizeof(int));
        if (!e->wait_pairs) fsdp_fatal("out of host memory for timing events");
    }
    e->wait_pairs[3 * e->num_wait_pairs] = begin;
    e->wait_pairs[3 * e->num_wait_pairs + 1] = ready_index;
    e->wait_pairs[3 * e->num_wait_pairs + 2] = what;
    e->num_wait_pairs++;
}

double fsdp_engine_take_comm_wait_ms(fsdp_engine *e) {
    for (int u = 0; u < e->num_units; u++)
        if (e->units[u].gather_event >= 0) return 0.0; /* a prefetch is still pending: measure later */
    double total = 0.0;
    /* FSDP_VERBOSE_WAITS=1: one line per step naming every wait of 0.05 ms or more (diagnostics). */
    static int verbose = -1;
    if (verbose < 0) verbose = fsdp_env_verbose_waits();
    char detail[2048];
    size_t used = 0;
    detail[0] = 0;
    for (int i = 0; i < e->num_wait_pairs; i++) {
        int *w = e->wait_pairs + 3 * i;
        fsdp_event *b = e->pool[w[0]], *r = e->pool[w[1]];
        e->be->event_synchronize(e->be, r);
        e->be->event_synchronize(e->be, b);
        float ms = e->be->event_elapsed_ms(e->be, b, r);
        if (ms > 0.0f) total += ms; /* negative: the data was there before compute asked */
        if (verbose && ms >= 0.05f && used + 48 < sizeof detail) {
            int n = w[2] >= 0 ? snprintf(detail + used, sizeof detail - used, " #%d gather(unit %d) %.2f", i, w[2], ms)
                              : snprintf(detail + used, sizeof detail - used, " #%d reductions %.2f", i, ms);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    if (verbose) fsdp_log("comm waits (ms, rank 0, %d waits):%s\n", e->num_wait_pairs, detail);
    e->num_wait_pairs = 0;
    e->pool_used = 0;
    return total;
}

/* ---- buffers sized by their first use, unless the options foresaw it ---- */

/* Room for `count` gradient rows of `row_len` per rank, gathered from every rank. */
static void reserve_rows(fsdp_engine *e, int count, int row_len) {
    fsdp_backend *be = e->be;
    if ((size_t)count <= e->rows_capacity && row_len <= e->rows_len) return;
    if (e->reduce_stream) be->stream_synchronize(be, e->reduce_stream);
    if (e->rows_values) be->free(be, e->rows_values);
    if (e->rows_index) be->free(be, e->rows_index);
    e->bytes -= e->rows_bytes;
    size_t n = (size_t)e->world_size * (size_t)count;
    e->rows_values = be->alloc(be, n * (size_t)row_len * e->ce, "gathered gradient rows");
    e->rows_index = be->alloc(be, FSDP_MAX_ROW_SETS * n * sizeof(int32_t), "gathered gradient row indices");
    e->rows_bytes = n * (size_t)row_len * e->ce + FSDP_MAX_ROW_SETS * n * sizeof(int32_t);
    e->bytes += e->rows_bytes;
    e->rows_capacity = (size_t)count;
    e->rows_len = row_len;
}

/* Room for `need` reduce-dtype elements of copy-engine reductions (collective over the shard group). */
static void reserve_staging(fsdp_engine *e, int64_t need) {
    fsdp_backend *be = e->be;
    if (need <= e->staging_elems) return;
    if (e->reduce_stream) be->stream_synchronize(be, e->reduce_stream);
    if (e->staging) {
        be->free(be, e->staging);
        e->bytes -= (size_t)e->staging_elems * e->re;
    }
    e->staging = be->alloc_shared(be, e->reduce_comm, (size_t)need * e->re, "gradient staging buffer");
    e->staging_elems = need;
    e->bytes += (size_t)need * e->re;
}

/* ---- rings ---- */

/* `shared_with`: the communicator whose collectives write into the ring (NULL: none). */
static void ring_alloc(fsdp_engine *e, ring *r, size_t esize, fsdp_comm *shared_with, const char *what) {
    size_t bytes = (size_t)r->capacity * (size_t)r->elems * esize;
    r->base = shared_with ? e->be->alloc_shared(e->be, shared_with, bytes, what) : e->be->alloc(e->be, bytes, what);
    e->bytes += bytes;
    r->owner = fsdp_xmalloc((size_t)r->capacity * sizeof(int), what);
    r->released = fsdp_xcalloc((size_t)r->capacity, sizeof(fsdp_event *), what);
    r->released_valid = fsdp_xcalloc((size_t)r->capacity, sizeof(int), what);
    for (int s = 0; s < r->capacity; s++) {
        r->owner[s] = -1;
        r->released[s] = e->be->event_create(e->be, 0);
    }
}

static void *slot_ptr(const ring *r, int slot, size_t esize) {
    return (char *)r->base + (size_t)slot * (size_t)r->elems * esize;
}

static int free_slot(const ring *r) {
    for (int s = 0; s < r->capacity; s++)
        if (r->owner[s] < 0) return s;
    return -1;
}

/* The rings of the engine's units (fsdp_plan_rings); which[u] gets unit u's ring. */
static int build_rings(fsdp_engine *e, ring **out, int *which, int keep_all) {
    int64_t *padded = fsdp_xmalloc((size_t)e->num_units * sizeof(int64_t), "unit rings");
    for (int u = 0; u < e->num_units; u++) padded[u] = e->units[u].padded;
    fsdp_ring_shape *shapes = fsdp_xcalloc((size_t)e->num_units, sizeof *shapes, "unit rings");
    int n = fsdp_plan_rings(padded, e->pinned, e->num_units, e->opts.max_live, keep_all, shapes, which);
    ring *rings = fsdp_xcalloc((size_t)e->num_units, sizeof *rings, "unit rings");
    for (int r = 0; r < n; r++) {
        rings[r].elems = shapes[r].elems;
        rings[r].capacity = shapes[r].capacity;
    }
    free(padded);
    free(shapes);
    *out = rings;
    return n;
}

/* ---- creation ---- */

static void split_groups(fsdp_engine *e, MPI_Comm world, const fsdp_topology *t) {
    int shard_color, replica_color;
    switch (e->opts.strategy) {
    case FSDP_FULL:
    case FSDP_SHARD_GRAD_OP: shard_color = 0, replica_color = t->rank; break;
    case FSDP_NO_SHARD: shard_color = t->rank, replica_color = 0; break;
    default: shard_color = t->node, replica_color = t->node_rank; break;
    }
    FSDP_CHECK_MPI(MPI_Comm_split(world, shard_color, t->rank, &e->shard_mpi));
    FSDP_CHECK_MPI(MPI_Comm_split(world, replica_color, t->rank, &e->replica_mpi));
    FSDP_CHECK_MPI(MPI_Comm_rank(e->shard_mpi, &e->shard_rank));
    FSDP_CHECK_MPI(MPI_Comm_size(e->shard_mpi, &e->shard_size));
    FSDP_CHECK_MPI(MPI_Comm_rank(e->replica_mpi, &e->replica_rank));
    FSDP_CHECK_MPI(MPI_Comm_size(e->replica_mpi, &e->replica_size));
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
    e->me = be->dtype_size(be, opts->master_dtype);
    e->ce = be->dtype_size(be, opts->compute_dtype);
    e->re = be->dtype_size(be, opts->reduce_dtype);

    split_groups(e, world, topo);
    int S = e->shard_size;
    int expect_S, expect_R;
    fsdp_strategy_groups(opts->strategy, topo->world, topo->node_size, &expect_S, &expect_R);
    FSDP_ASSERT(expect_S == S && expect_R == e->replica_size);

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

    /* Communicators first: the buffers gathers send from and receive into belong to the gather
     * communicator. */
    if (S > 1) {
        e->gather_comm = be->comm_create(be, e->shard_mpi, "gather",
                                         opts->copy_engine_gathers ? FSDP_COMM_COPY_ENGINES : 0);
        if (!opts->forward_only) {
            e->reduce_comm = be->comm_create(be, e->shard_mpi, "reduce-scatter",
                                             opts->copy_engine_reductions ? FSDP_COMM_COPY_ENGINES : 0);
            e->norm_comm = be->comm_create(be, e->shard_mpi, "gradient norm", 0);
        }
    }
    if (e->replica_size > 1 && !opts->forward_only)
        e->replica_comm = be->comm_create(be, e->replica_mpi, "replica all-reduce", 0);
    FSDP_CHECK_MPI(MPI_Comm_size(world, &e->world_size));
    /* Gradient rows are gathered over the whole world on the reduce stream: reuse the communicator
     * that already spans it there, or make one (HYBRID, whose groups are both smaller). */
    if (e->world_size > 1 && !opts->forward_only) {
        if (S == e->world_size)
            e->rows_comm = e->reduce_comm;
        else if (e->replica_size == e->world_size)
            e->rows_comm = e->replica_comm;
        else
            e->rows_comm = e->own_rows_comm = be->comm_create(be, world, "gradient rows", 0);
    }

    /* One allocation per class of state. */
    size_t reserved_before = be->reserved_bytes;
    size_t shard_bytes = (size_t)e->total_shard * e->me;
    int aliased = opts->compute_dtype == opts->master_dtype;
    e->master = aliased ? be->alloc_shared(be, e->gather_comm, shard_bytes, "master weights")
                        : be->alloc(be, shard_bytes, "master weights");
    e->bytes += shard_bytes;
    if (!opts->forward_only) {
        e->grad = be->alloc(be, shard_bytes, "gradient shards");
        e->m = be->alloc(be, shard_bytes, "Adam first moments");
        e->v = be->alloc(be, shard_bytes, "Adam second moments");
        e->bytes += 3 * shard_bytes;
    }
    if (aliased) {
        e->working = e->master;
    } else {
        e->working = be->alloc_shared(be, e->gather_comm, (size_t)e->total_shard * e->ce, "working copy of the shards");
        e->bytes += (size_t)e->total_shard * e->ce;
    }

    int *which = fsdp_xmalloc((size_t)num_units * sizeof(int), "unit rings");
    if (S > 1) {
        int keep_all = opts->strategy == FSDP_SHARD_GRAD_OP;
        e->num_param_rings = build_rings(e, &e->param_rings, which, keep_all);
        for (int u = 0; u < num_units; u++) e->units[u].param_ring = which[u];
        for (int r = 0; r < e->num_param_rings; r++)
            ring_alloc(e, &e->param_rings[r], e->ce, e->gather_comm, "gathered units");
    }
    e->direct_grads = S == 1 && e->replica_size == 1 && opts->reduce_dtype == opts->master_dtype;
    e->written = fsdp_xcalloc((size_t)num_units, 1, "gradient shard flags");
    e->step_begun = be->event_create(be, 0);
    e->num_grad_rings = e->direct_grads || opts->forward_only ? 0 : build_rings(e, &e->grad_rings, which, 0);
    for (int u = 0; u < num_units; u++) e->units[u].grad_ring = e->num_grad_rings ? which[u] : -1;
    int grad_slots = 0;
    for (int r = 0; r < e->num_grad_rings; r++) {
        ring_alloc(e, &e->grad_rings[r], e->re, opts->copy_engine_reductions ? e->reduce_comm : NULL,
                   "unit gradient buffers");
        grad_slots += e->grad_rings[r].capacity;
    }
    free(which);
    e->grad_ready = fsdp_xcalloc((size_t)grad_slots, sizeof *e->grad_ready, "gradient events");
    for (int i = 0; i < grad_slots; i++) e->grad_ready[i] = be->event_create(be, 0);
    /* What the first step would otherwise size: nothing is allocated once training runs. */
    if (e->world_size > 1 && opts->rows_capacity > 0 && !opts->forward_only)
        reserve_rows(e, opts->rows_capacity, opts->row_len);
    if (S > 1 && opts->copy_engine_reductions && !opts->forward_only) {
        int64_t largest = 0;
        for (int u = 0; u < num_units; u++) largest = e->units[u].padded > largest ? e->units[u].padded : largest;
        reserve_staging(e, largest);
    }
    /* The memory plans count with the same functions; this keeps them honest. */
    if (!be->oom.failures && !opts->copy_engine_gathers && !opts->copy_engine_reductions) {
        fsdp_engine_memory plan;
        fsdp_engine_memory_plan(specs, num_units, opts, topo->world, topo->node_size, be->kind, &plan);
        if (be->reserved_bytes - reserved_before != plan.total)
            fsdp_fatal("internal error: the engine allocated %zu bytes, its memory plan says %zu",
                       be->reserved_bytes - reserved_before, plan.total);
    }

    e->gather_stream = be->stream_create(be, "gather");
    e->reduce_stream = be->stream_create(be, "reduce");
    e->updated = be->event_create(be, 0);
    e->rows_ready = be->event_create(be, 0);
    e->rows_done = be->event_create(be, 0);
    if (fsdp_agree(world, err)) {
        fsdp_engine_destroy(e);
        return NULL;
    }
    return e;
}

static void ring_free(fsdp_backend *be, ring *r) {
    be->free(be, r->base);
    for (int s = 0; s < r->capacity; s++) be->event_destroy(be, r->released[s]);
    free(r->owner);
    free(r->released);
    free(r->released_valid);
}

void fsdp_engine_destroy(fsdp_engine *e) {
    if (!e) return;
    fsdp_backend *be = e->be;
    be->stream_synchronize(be, e->gather_stream);
    be->stream_synchronize(be, e->reduce_stream);
    be->stream_synchronize(be, be->compute);
    int grad_slots = 0;
    for (int r = 0; r < e->num_grad_rings; r++) grad_slots += e->grad_rings[r].capacity;
    for (int r = 0; r < e->num_param_rings; r++) ring_free(be, &e->param_rings[r]);
    for (int r = 0; r < e->num_grad_rings; r++) ring_free(be, &e->grad_rings[r]);
    for (int i = 0; i < grad_slots; i++) be->event_destroy(be, e->grad_ready[i]);
    for (int i = 0; i < e->pool_cap; i++) be->event_destroy(be, e->pool[i]);
    be->event_destroy(be, e->updated);
    be->event_destroy(be, e->step_begun);
    free(e->written);
    if (e->rows_values) be->free(be, e->rows_values);
    if (e->rows_index) be->free(be, e->rows_index);
    be->event_destroy(be, e->rows_ready);
    be->event_destroy(be, e->rows_done);
    be->stream_destroy(be, e->gather_stream);
    be->stream_destroy(be, e->reduce_stream);
    if (e->staging) be->free(be, e->staging);
    if (e->working != e->master) be->free(be, e->working);
    be->free(be, e->master);
    be->free(be, e->grad);
    be->free(be, e->m);
    be->free(be, e->v);
    /* After the memory that alloc_shared gave for them. */
    be->comm_destroy(be, e->gather_comm);
    be->comm_destroy(be, e->reduce_comm);
    be->comm_destroy(be, e->norm_comm);
    be->comm_destroy(be, e->replica_comm);
    be->comm_destroy(be, e->own_rows_comm);
    MPI_Comm_free(&e->shard_mpi);
    MPI_Comm_free(&e->replica_mpi);
    free(e->param_rings);
    free(e->grad_rings);
    free(e->grad_ready);
    free(e->pool);
    free(e->wait_pairs);
    free(e->units);
    free(e->order);
    free(e->forward_order);
    free(e->pinned);
    free(e);
}

int fsdp_engine_shard_rank(const fsdp_engine *e) { return e->shard_rank; }
int fsdp_engine_shard_size(const fsdp_engine *e) { return e->shard_size; }
int fsdp_engine_replica_rank(const fsdp_engine *e) { return e->replica_rank; }
int fsdp_engine_replica_size(const fsdp_engine *e) { return e->replica_size; }
size_t fsdp_engine_bytes(const fsdp_engine *e) { return e->bytes; }

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

fsdp_shard_view fsdp_engine_view(const fsdp_engine *e, int unit) {
    const unit_state *s = &e->units[unit];
    fsdp_shard_view v;
    size_t off = (size_t)s->offset;
    v.master = (char *)e->master + off * e->me;
    v.grad = e->grad ? (char *)e->grad + off * e->me : NULL; /* NULL: a forward-only engine */
    v.m = e->m ? (char *)e->m + off * e->me : NULL;
    v.v = e->v ? (char *)e->v + off * e->me : NULL;
    v.working = (char *)e->working + off * e->ce;
    v.start = (int64_t)e->shard_rank * s->shard_len;
    v.len = s->shard_len;
    v.valid = clamp64(s->numel - v.start, 0, s->shard_len);
    v.decay_len = clamp64(s->decay_numel - v.start, 0, s->shard_len);
    return v;
}

/* ---- gathering ---- */

static int resident(const fsdp_engine *e, int u) { return e->shard_size == 1 || e->units[u].param_slot >= 0; }

/* Starts the all-gather of unit u into a free slot of its ring; returns 0 when no slot is free. */
static int start_gather(fsdp_engine *e, int u) {
    fsdp_backend *be = e->be;
    unit_state *s = &e->units[u];
    ring *r = &e->param_rings[s->param_ring];
    int slot = free_slot(r);
    if (slot < 0) return 0;
    if (r->released_valid[slot]) be->stream_wait_event(be, e->gather_stream, r->released[slot]);
    /* The shard it sends is what the last optimizer step wrote on the compute stream. */
    if (e->updated_valid) be->stream_wait_event(be, e->gather_stream, e->updated);
    void *dst = slot_ptr(r, slot, e->ce);
    const void *src = (const char *)e->working + (size_t)s->offset * e->ce;
    be->all_gather(be, e->gather_comm, src, dst, (size_t)s->shard_len, e->opts.compute_dtype, e->gather_stream);
    be->event_record(be, pool_event(e, &s->gather_event), e->gather_stream);
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

void fsdp_engine_begin_microbatch(fsdp_engine *e) {
    if (e->opts.forward_only) fsdp_fatal("internal error: a training micro-batch on a forward-only engine");
    e->cursor = 0;
    e->active = e->order, e->active_len = e->opts.order_len, e->forward_mode = 0;
    /* The last micro-batch's gradient rows are still read on the reduce stream. */
    if (e->rows_pending) {
        e->be->stream_wait_event(e->be, e->be->compute, e->rows_done);
        e->rows_pending = 0;
    }
    if (e->shard_size > 1) prefetch(e);
}

void fsdp_engine_begin_forward(fsdp_engine *e) {
    e->cursor = 0;
    e->active = e->forward_order, e->active_len = e->forward_len, e->forward_mode = 1;
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
        compute_waits(e, s->gather_event, u);
        s->gather_event = -1;
    }
    prefetch(e);
    return slot_ptr(&e->param_rings[s->param_ring], s->param_slot, e->ce);
}

static void release_params(fsdp_engine *e, int u) {
    unit_state *s = &e->units[u];
    if (e->shard_size == 1 || s->param_slot < 0) return;
    ring *r = &e->param_rings[s->param_ring];
    e->be->event_record(e->be, r->released[s->param_slot], e->be->compute);
    r->released_valid[s->param_slot] = 1;
    r->owner[s->param_slot] = -1;
    s->param_slot = -1;
}

void fsdp_engine_done_forward(fsdp_engine *e, int u) {
    int reshard = e->opts.strategy == FSDP_FULL || e->opts.strategy == FSDP_HYBRID;
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

static void *grad_shard_of(const fsdp_engine *e, const unit_state *s) {
    return (char *)e->grad + (size_t)s->offset * e->me;
}

void *fsdp_engine_grads(fsdp_engine *e, int u) {
    fsdp_backend *be = e->be;
    unit_state *s = &e->units[u];
    if (e->forward_mode) fsdp_fatal("internal error: gradients of unit %d asked for in a forward-only micro-batch", u);
    if (e->direct_grads) {
        if (!e->written[u]) be->zero(be, grad_shard_of(e, s), (size_t)s->shard_len * e->me, be->compute);
        e->written[u] = 1;
        s->grad_slot = DIRECT_SLOT;
        return grad_shard_of(e, s);
    }
    ring *r = &e->grad_rings[s->grad_ring];
    if (s->grad_slot < 0) {
        int slot = free_slot(r);
        if (slot < 0) fsdp_fatal("internal error: no free gradient buffer for unit %d", u);
        /* The buffer's previous reduction must be finished before it is zeroed and reused. */
        if (r->released_valid[slot]) be->stream_wait_event(be, be->compute, r->released[slot]);
        be->zero(be, slot_ptr(r, slot, e->re), (size_t)r->elems * e->re, be->compute);
        r->owner[slot] = u;
        s->grad_slot = slot;
    }
    return slot_ptr(r, s->grad_slot, e->re);
}

/* The reduce-scatter of a unit's gradient buffer `buf` as an all-to-all into the staging buffer and
 * a local sum, on the reduce stream; returns where this rank's summed piece is. */
static char *reduce_scatter_on_copy_engines(fsdp_engine *e, const unit_state *s, char *buf) {
    fsdp_backend *be = e->be;
    /* Made at creation for the largest unit; collective here too (every rank reduces the same units). */
    reserve_staging(e, (int64_t)e->shard_size * s->shard_len);
    size_t piece = (size_t)s->shard_len * e->re;
    char *stage = e->staging;
    be->all_to_all(be, e->reduce_comm, buf, stage, (size_t)s->shard_len, e->opts.reduce_dtype, e->reduce_stream);
    for (int q = 1; q < e->shard_size; q++)
        be->accumulate(be, stage, e->opts.reduce_dtype, stage + (size_t)q * piece, e->opts.reduce_dtype,
                       (size_t)s->shard_len, e->reduce_stream);
    return stage;
}

void fsdp_engine_done_backward(fsdp_engine *e, int u) {
    fsdp_backend *be = e->be;
    unit_state *s = &e->units[u];
    if (s->grad_slot == DIRECT_SLOT) s->grad_slot = -1; /* already in its shard */
    if (s->grad_slot < 0) { /* no dense gradient this micro-batch (rows only, or already reduced) */
        release_params(e, u);
        if (e->shard_size > 1) prefetch(e);
        return;
    }
    ring *r = &e->grad_rings[s->grad_ring];
    int slot = s->grad_slot;
    char *buf = slot_ptr(r, slot, e->re);
    fsdp_event *ready = e->grad_ready[grad_slot_index(e, s->grad_ring, slot)];

    be->event_record(be, ready, be->compute);
    be->stream_wait_event(be, e->reduce_stream, ready);
    void *grad_shard = grad_shard_of(e, s);
    size_t n = (size_t)s->shard_len;
    fsdp_dtype rt = e->opts.reduce_dtype, mt = e->opts.master_dtype;
    int first = !e->written[u];
    e->written[u] = 1;
    if (first && e->shard_size > 1 && !e->opts.copy_engine_reductions && rt == mt) {
        /* The first reduction of the step lands in the shard itself: no add, no zeroing. */
        be->reduce_scatter(be, e->reduce_comm, buf, grad_shard, n, rt, e->reduce_stream);
        if (e->replica_size > 1) be->all_reduce(be, e->replica_comm, grad_shard, n, rt, e->reduce_stream);
    } else {
        char *mine = buf;
        if (e->shard_size > 1 && e->opts.copy_engine_reductions) {
            mine = reduce_scatter_on_copy_engines(e, s, buf);
        } else if (e->shard_size > 1) {
            mine = buf + (size_t)e->shard_rank * n * e->re;
            be->reduce_scatter(be, e->reduce_comm, buf, mine, n, rt, e->reduce_stream);
        }
        if (e->replica_size > 1) be->all_reduce(be, e->replica_comm, mine, n, rt, e->reduce_stream);
        if (first)
            be->cast(be, grad_shard, mt, mine, rt, n, e->reduce_stream);
        else
            be->accumulate(be, grad_shard, mt, mine, rt, n, e->reduce_stream);
    }
    be->event_record(be, r->released[slot], e->reduce_stream);
    r->released_valid[slot] = 1;
    r->owner[slot] = -1;
    s->grad_slot = -1;
    release_params(e, u);
    if (e->shard_size > 1) prefetch(e);
}

void fsdp_engine_add_rows(fsdp_engine *e, int u, const fsdp_row_set *sets, int nsets, const void *values,
                          int count, int row_len) {
    fsdp_backend *be = e->be;
    if (e->opts.master_dtype != FSDP_F32)
        fsdp_fatal("internal error: gradient rows need fp32 gradient shards (unit %d)", u);
    if (nsets < 1 || nsets > FSDP_MAX_ROW_SETS)
        fsdp_fatal("internal error: %d row sets for unit %d (at most %d)", nsets, u, FSDP_MAX_ROW_SETS);
    be->event_record(be, e->rows_ready, be->compute);
    be->stream_wait_event(be, e->reduce_stream, e->rows_ready);
    if (!e->written[u]) { /* rows are added: the shard needs its zeros first */
        be->zero(be, grad_shard_of(e, &e->units[u]), (size_t)e->units[u].shard_len * e->me, e->reduce_stream);
        e->written[u] = 1;
    }
    fsdp_row_set all[FSDP_MAX_ROW_SETS];
    memcpy(all, sets, (size_t)nsets * sizeof *sets);
    const void *all_values = values;
    int entries = count;
    if (e->world_size > 1) {
        reserve_rows(e, count, row_len); /* made at creation when the options foresaw them */
        size_t n = (size_t)e->world_size * (size_t)count;
        be->all_gather(be, e->rows_comm, values, e->rows_values, (size_t)count * (size_t)row_len,
                       e->opts.compute_dtype, e->reduce_stream);
        for (int k = 0; k < nsets; k++) {
            if (!sets[k].rows) continue; /* periodic rows: entry n of every rank maps the same way */
            int32_t *dst = e->rows_index + (size_t)k * n;
            /* Indices travel as 4-byte words: an all-gather only moves bytes. */
            be->all_gather(be, e->rows_comm, sets[k].rows, dst, (size_t)count, FSDP_F32, e->reduce_stream);
            all[k].rows = dst;
        }
        all_values = e->rows_values;
        entries = (int)n;
    }
    fsdp_shard_view v = fsdp_engine_view(e, u);
    be->add_rows(be, v.grad, v.start, v.len, all, nsets, all_values, entries, row_len, e->reduce_stream);
    be->event_record(be, e->rows_done, e->reduce_stream);
    e->rows_pending = 1;
}

/* ---- optimizer step ---- */

void fsdp_engine_begin_step(fsdp_engine *e) {
    /* Lazily: each unit's first gradient overwrites its shard, the rest are zeroed at the end. */
    memset(e->written, 0, (size_t)e->num_units);
    e->be->event_record(e->be, e->step_begun, e->be->compute);
}

void fsdp_engine_wait_reductions(fsdp_engine *e) {
    fsdp_backend *be = e->be;
    /* Only once the last step's optimizer, which read these shards on the compute stream, is done. */
    be->stream_wait_event(be, e->reduce_stream, e->step_begun);
    for (int u = 0; u < e->num_units; u++) {
        if (e->written[u]) continue;
        be->zero(be, grad_shard_of(e, &e->units[u]), (size_t)e->units[u].shard_len * e->me, e->reduce_stream);
        e->written[u] = 1;
    }
    int idx;
    fsdp_event *done = pool_event(e, &idx);
    e->be->event_record(e->be, done, e->reduce_stream);
    compute_waits(e, idx, -1);
    e->rows_pending = 0; /* behind the same wait */
}

void fsdp_engine_grad_sumsq(fsdp_engine *e, float *out) {
    fsdp_backend *be = e->be;
    be->zero(be, out, sizeof(float), be->compute);
    be->sum_squares(be, out, e->grad, e->opts.master_dtype, (size_t)e->total_shard, be->compute);
    if (e->shard_size > 1) be->all_reduce(be, e->norm_comm, out, 1, FSDP_F32, be->compute);
}

void fsdp_engine_unit_updated(fsdp_engine *e, int u) {
    if (e->shard_size == 1) return;
    e->be->event_record(e->be, e->updated, e->be->compute);
    e->updated_valid = 1;
    /* The next step opens with these units: gathering them now hides the gathers behind the rest
     * of the optimizer step instead of exposing them at the start of the next. */
    for (int k = 0; k <= e->opts.prefetch && k < e->opts.order_len; k++)
        if (e->order[k] == u && !resident(e, u)) start_gather(e, u);
}

void fsdp_engine_params_updated(fsdp_engine *e) {
    for (int u = 0; u < e->num_units; u++)
        if (e->shard_size > 1 && e->units[u].param_slot >= 0 && e->units[u].gather_event < 0)
            fsdp_fatal("internal error: unit %d still gathered at the optimizer step", u);
    e->be->event_record(e->be, e->updated, e->be->compute);
    e->updated_valid = 1;
}

void fsdp_engine_refresh_working(fsdp_engine *e) {
    if (e->working == e->master) return;
    e->be->cast(e->be, e->working, e->opts.compute_dtype, e->master, e->opts.master_dtype, (size_t)e->total_shard,
                e->be->compute);
}
