/* hpZ, ZeRO++'s hierarchical partitioning (engine.h: FULL with reshard_size N): after a unit's
 * forward each rank keeps the 1/N slice of the gathered unit that it holds in its secondary group
 * (N ranks: the node), and the backward gathers the unit again from those slices, inside the group,
 * instead of over the world.
 *
 * Promises: the backward computes with exactly the bits the forward computed with (the slices are
 * copies of the forward's gathered unit, so a quantized gather's dequantized weights too), and so
 * gives FULL's gradients bit for bit; the secondary copy is derived state, rebuilt by every training
 * forward and never read by checkpoints or the optimizer; its bytes are what
 * fsdp_engine_memory_plan counts (fsdp_plan_secondary) and what the backward sends is counted as
 * FSDP_COMM_GATHER_SECONDARY.
 *
 * Why slices of the gathered unit rather than a second sharding of the master weights: the forward
 * already holds the whole unit in the compute dtype, so keeping a slice is a local copy; re-sharding
 * the masters would need a second working copy updated by the optimizer. The secondary copy is one
 * allocation for every unit that has one (all of them are alive between the end of the forward and
 * the start of the backward, so rings would not save memory), in the compute dtype: its gather runs
 * inside the node, where bandwidth is plentiful, and re-quantizing dequantized weights would change
 * them between the forward and the backward. */
#include <stdlib.h>

#include "../base/error.h"
#include "engine_internal.h"

int64_t fsdp_plan_secondary(const fsdp_engine_mode *m, const fsdp_shard_options *o, const int64_t *padded,
                            int num_units, int64_t *len) {
    int64_t total = 0;
    for (int u = 0; u < num_units; u++) {
        /* A unit visited again after its forward is gathered again for its backward, unless pinned
         * (kept gathered from the forward: a tied embedding). The head runs forward and backward in
         * one visit; the embedding's backward needs no parameters. */
        int visits = 0;
        for (int k = 0; k < o->order_len; k++) visits += o->order[k] == u;
        int pinned = o->pinned && o->pinned[u];
        len[u] = m->secondary_size && visits > 1 && !pinned ? padded[u] / m->secondary_size : 0;
        total += len[u];
    }
    return total;
}

int engine_check_reshard(const fsdp_shard_options *o, const fsdp_topology *topo, fsdp_err *err) {
    int N = o->reshard_size;
    if (N == 0) return 0;
    if (o->strategy != FSDP_FULL)
        return fsdp_usagef(err, "--reshard-after-forward needs --strategy FULL, not %s", fsdp_strategy_name(o->strategy));
    if (N < 1 || N >= topo->world || topo->world % N)
        return fsdp_usagef(err, "--reshard-after-forward %d: the secondary group must be a divisor of the %d ranks "
                                "smaller than %d",
                           N, topo->world, topo->world);
    return 0;
}

void engine_open_secondary(fsdp_engine *e, MPI_Comm world, const fsdp_topology *topo) {
    fsdp_engine_mode m;
    fsdp_engine_mode_of(&e->opts, e->shard_size, e->replica_size, &m);
    e->secondary_size = m.secondary_size;
    e->secondary_mpi = MPI_COMM_NULL;
    if (!e->secondary_size) return;
    int N = e->secondary_size;
    /* The node's ranks when N is its size (a real node's ranks need not be consecutive), else N
     * consecutive ranks. The slice a rank keeps is the one its place in the group names, so any
     * grouping rebuilds the unit. */
    int color = N == topo->node_size && topo->uniform_nodes ? topo->node : topo->rank / N;
    FSDP_CHECK_MPI(MPI_Comm_split(world, color, topo->rank, &e->secondary_mpi));
    FSDP_CHECK_MPI(MPI_Comm_rank(e->secondary_mpi, &e->secondary_rank));
    int size = 0;
    FSDP_CHECK_MPI(MPI_Comm_size(e->secondary_mpi, &size));
    FSDP_ASSERT(size == N);
    /* Its own communicator: NCCL orders a communicator's operations, and the world gathers share the
     * gather stream with it but not the group. Never on copy engines: the slots it writes belong to
     * the world gathers' symmetric window, not to its own. */
    e->secondary_comm = e->be->coll->comm_create(e->be, e->secondary_mpi, "secondary gather", 0);
}

void engine_close_secondary(fsdp_engine *e) {
    if (!e->secondary_size) return;
    e->be->coll->comm_destroy(e->be, e->secondary_comm);
    FSDP_CHECK_MPI(MPI_Comm_free(&e->secondary_mpi));
}

void engine_alloc_secondary(fsdp_engine *e) {
    if (!e->secondary_size) return;
    fsdp_backend *be = e->be;
    int64_t *padded = fsdp_xmalloc((size_t)e->num_units * sizeof(int64_t), "unit sizes");
    int64_t *len = fsdp_xmalloc((size_t)e->num_units * sizeof(int64_t), "unit sizes");
    for (int u = 0; u < e->num_units; u++) padded[u] = e->units[u].padded;
    int64_t total = fsdp_plan_secondary(&e->mode, &e->opts, padded, e->num_units, len), at = 0;
    for (int u = 0; u < e->num_units; u++) {
        e->units[u].secondary_len = len[u];
        e->units[u].secondary_offset = at;
        at += len[u];
    }
    free(padded);
    free(len);
    if (total > 0) e->secondary = be->runtime->alloc(be, (size_t)total * e->ce, "secondary copy (hpZ)");
    e->secondary_written = be->runtime->event_create(be, 0);
}

void engine_free_secondary(fsdp_engine *e) {
    if (!e->secondary_size) return;
    if (e->secondary) e->be->runtime->free(e->be, e->secondary);
    e->be->runtime->event_destroy(e->be, e->secondary_written);
}

void engine_keep_secondary(fsdp_engine *e, int u) {
    unit_state *s = &e->units[u];
    if (!s->secondary_len || s->param_slot < 0) return;
    fsdp_backend *be = e->be;
    size_t n = (size_t)s->secondary_len;
    const char *unit = slot_ring_slot(&e->param_rings[s->param_ring], s->param_slot, e->ce);
    /* On the compute stream, behind the forward that read the unit and before its slot is released:
     * the slice's last reader (the previous backward's gather) finished before that forward began,
     * since compute waited for it. */
    be->ops->cast(be, (char *)e->secondary + (size_t)s->secondary_offset * e->ce, e->opts.compute_dtype,
                  unit + (size_t)e->secondary_rank * n * e->ce, e->opts.compute_dtype, n, be->compute);
    be->runtime->event_record(be, e->secondary_written, be->compute);
    s->secondary_ready = 1;
}

void engine_gather_secondary(fsdp_engine *e, int u, void *dst) {
    unit_state *s = &e->units[u];
    fsdp_backend *be = e->be;
    size_t n = (size_t)s->secondary_len;
    /* The last slice kept is at or after this unit's: waiting for it covers this one. */
    be->runtime->stream_wait_event(be, e->gather_stream, e->secondary_written);
    be->coll->all_gather(be, e->secondary_comm, (const char *)e->secondary + (size_t)s->secondary_offset * e->ce, dst,
                         n, e->opts.compute_dtype, e->gather_stream);
    engine_count_pieces(e, FSDP_COMM_GATHER_SECONDARY, e->secondary_size, engine_wire_bytes(e->opts.compute_dtype, n));
    s->secondary_ready = 0;
}

void engine_reset_secondary(fsdp_engine *e) {
    for (int u = 0; u < e->num_units; u++) e->units[u].secondary_ready = 0;
}

int fsdp_engine_secondary_size(const fsdp_engine *e) { return e->secondary_size; }
