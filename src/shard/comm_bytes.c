/* What the engine's collectives send, counted where they are issued (engine.h: "bytes on the
 * wire"), and the least a step of its strategy needs. */
#include <string.h>

#include "engine_internal.h"

const char *fsdp_comm_kind_name(fsdp_comm_kind k) {
    static const char *const names[FSDP_COMM_KINDS] = {"all_gather", "reduce", "all_reduce", "other"};
    return names[k];
}

size_t engine_wire_bytes(fsdp_dtype t, size_t count) {
    return fsdp_dtype_blockwise(t) ? fsdp_dtype_piece_bytes(t, count) : count * fsdp_dtype_info_of(t)->bytes;
}

void engine_count_pieces(fsdp_engine *e, fsdp_comm_kind k, int ranks, size_t piece_bytes) {
    e->sent.bytes[k] += (double)(ranks - 1) * (double)piece_bytes;
}

void engine_count_all_reduce(fsdp_engine *e, fsdp_comm_kind k, int ranks, size_t bytes) {
    e->sent.bytes[k] += 2.0 * (ranks - 1) / ranks * (double)bytes;
}

static void sum_total(fsdp_comm_bytes *c) {
    c->total = 0.0;
    for (int k = 0; k < FSDP_COMM_KINDS; k++) c->total += c->bytes[k];
}

void fsdp_engine_take_comm_bytes(fsdp_engine *e, fsdp_comm_bytes *out) {
    *out = e->sent;
    sum_total(out);
    memset(&e->sent, 0, sizeof e->sent);
}

/* Gathers of unit u in one micro-batch: every visit of a resharding strategy that finds it released
 * (a pinned unit stays from its first), one for SHARD_GRAD_OP. */
static int gathers_of(const fsdp_engine *e, int u) {
    int visits = 0;
    for (int k = 0; k < e->opts.order_len; k++) visits += e->order[k] == u;
    int reshard = e->opts.strategy == FSDP_FULL || e->opts.strategy == FSDP_HYBRID;
    if (visits == 0) return 0;
    return reshard && !e->pinned[u] ? visits : 1;
}

void fsdp_engine_comm_minimum(const fsdp_engine *e, fsdp_comm_bytes *out) {
    memset(out, 0, sizeof *out);
    int S = e->shard_size, R = e->replica_size;
    fsdp_dtype gather = e->mode.quantized_gathers ? e->opts.gather_dtype : e->opts.compute_dtype;
    fsdp_dtype reduce = e->mode.piece_reductions ? e->opts.reduce_dtype : e->opts.grad_dtype;
    for (int u = 0; u < e->num_units; u++) {
        size_t n = (size_t)e->units[u].shard_len;
        if (S > 1) {
            out->bytes[FSDP_COMM_GATHER] += (double)gathers_of(e, u) * (S - 1) * (double)engine_wire_bytes(gather, n);
            if (!e->opts.forward_only) out->bytes[FSDP_COMM_REDUCE] += (double)(S - 1) * (double)engine_wire_bytes(reduce, n);
        }
        if (R > 1 && !e->opts.forward_only) {
            if (e->mode.nccl_replicas) {
                out->bytes[FSDP_COMM_REPLICA] += 2.0 * (R - 1) / R * (double)engine_wire_bytes(FSDP_F32, n);
            } else {
                size_t c = (size_t)fsdp_replica_piece((int64_t)n, R);
                out->bytes[FSDP_COMM_REPLICA] +=
                    (double)(R - 1) * (double)(engine_wire_bytes(e->opts.reduce_dtype, c) + engine_wire_bytes(FSDP_BF16, c));
            }
        }
    }
    sum_total(out);
}
