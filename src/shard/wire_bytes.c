/* What each unit's collectives send per rank, without an engine or a device (engine.h:
 * fsdp_engine_wire_plan): the arithmetic of the engine's own counting (comm_bytes.c) applied to the
 * shards a strategy forms, so that a plan of a step's time (src/train/step_time.c) moves the bytes
 * the engine moves. tests/scripts/plan_links.py checks the sums against the engine's count. */
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "engine_internal.h"

double fsdp_wire_piece_bytes(fsdp_dtype t, size_t count) { return (double)engine_wire_bytes(t, count); }

/* As reduce.c's reduce_replicas sends n elements of t over R replicas: NCCL's all-reduce (the ring's
 * 2 (R - 1) / R), or every rank's pieces in the reduce dtype and their sums gathered back in bf16. */
static double replica_bytes(const fsdp_engine_mode *m, const fsdp_shard_options *o, fsdp_dtype t, size_t n) {
    int R = m->replica_size;
    if (m->nccl_replicas) return 2.0 * (R - 1) / R * (double)engine_wire_bytes(t, n);
    size_t c = (size_t)fsdp_replica_piece((int64_t)n, R);
    return (double)(R - 1) * (double)(engine_wire_bytes(o->reduce_dtype, c) + engine_wire_bytes(FSDP_BF16, c));
}

void fsdp_engine_unit_wire(const fsdp_engine_mode *m, const fsdp_shard_options *o, int64_t shard_len,
                           fsdp_unit_wire *w) {
    memset(w, 0, sizeof *w);
    int S = m->shard_size, R = m->replica_size;
    size_t n = (size_t)shard_len;
    if (S > 1) {
        fsdp_dtype g = m->quantized_gathers ? o->gather_dtype : o->compute_dtype;
        w->gather = (double)(S - 1) * (double)engine_wire_bytes(g, n);
        if (!o->forward_only) {
            fsdp_dtype r = m->piece_reductions ? o->reduce_dtype : o->grad_dtype;
            w->reduce = (double)(S - 1) * (double)engine_wire_bytes(r, n);
        }
    }
    if (R > 1 && !o->forward_only) {
        /* Per micro-batch the reduced gradient goes in fp32 (NCCL's path holds fp32 buffers, the
         * pieces' path its fp32 sums); once per step the shard itself, in the master dtype. */
        w->replica = replica_bytes(m, o, S > 1 || m->nccl_replicas ? FSDP_F32 : o->grad_dtype, n);
        w->replica_step = replica_bytes(m, o, o->master_dtype, n);
    }
}

double fsdp_engine_secondary_wire(int secondary_size, fsdp_dtype compute_dtype, int64_t secondary_len) {
    if (secondary_size < 2 || secondary_len <= 0) return 0.0;
    return (double)(secondary_size - 1) * (double)engine_wire_bytes(compute_dtype, (size_t)secondary_len);
}

void fsdp_engine_wire_plan(const fsdp_unit_spec *units, int num_units, const fsdp_shard_options *opts, int world,
                           int node_size, fsdp_wire_plan *out) {
    memset(out, 0, sizeof *out);
    int S, R;
    fsdp_strategy_groups(opts->strategy, world, node_size, &S, &R);
    fsdp_engine_mode m;
    fsdp_engine_mode_of(opts, S, R, &m);
    out->shard_size = S, out->replica_size = R;
    out->hold_params = m.hold_params, out->hold_grads = m.hold_grads, out->defer_replicas = m.defer_replicas;
    out->norm = S > 1 && !opts->forward_only ? 2.0 * (S - 1) / S * (double)sizeof(float) : 0.0;
    out->num_units = num_units;
    out->secondary_size = m.secondary_size;
    out->units = fsdp_xcalloc((size_t)num_units, sizeof *out->units, "the units' wire plan");
    int64_t *padded = fsdp_xmalloc((size_t)num_units * sizeof *padded, "the units' wire plan");
    int64_t *secondary_len = fsdp_xmalloc((size_t)num_units * sizeof *secondary_len, "the units' wire plan");
    for (int u = 0; u < num_units; u++) padded[u] = fsdp_shard_padded(units[u].numel, S);
    fsdp_plan_secondary(&m, opts, padded, num_units, secondary_len);
    for (int u = 0; u < num_units; u++) {
        fsdp_engine_unit_wire(&m, opts, padded[u] / S, &out->units[u]);
        out->units[u].secondary = fsdp_engine_secondary_wire(m.secondary_size, opts->compute_dtype, secondary_len[u]);
    }
    free(padded), free(secondary_len);
}

void fsdp_wire_plan_free(fsdp_wire_plan *w) {
    free(w->units);
    memset(w, 0, sizeof *w);
}
