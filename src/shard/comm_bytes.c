/* What the engine's collectives send, counted where they are issued (engine.h: "bytes on the
 * wire"), and the least a step of its strategy needs. */
#include <string.h>

#include "engine_internal.h"

const char *fsdp_comm_kind_name(fsdp_comm_kind k) {
    static const char *const names[FSDP_COMM_KINDS] = {"all_gather", "reduce", "all_reduce", "other",
                                                       "all_gather_secondary"};
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
    for (int u = 0; u < e->num_units; u++) {
        fsdp_unit_wire w; /* the same arithmetic as fsdp plan's (wire_bytes.c) */
        fsdp_engine_unit_wire(&e->mode, &e->opts, e->units[u].shard_len, &w);
        if (S > 1) {
            /* hpZ: the backward's gather of a unit with a secondary shard runs inside its group. */
            int64_t m = e->units[u].secondary_len;
            int secondary = m > 0 && e->secondary_size > 0;
            out->bytes[FSDP_COMM_GATHER] +=
                (double)(gathers_of(e, u) - secondary) * w.gather;
            if (secondary)
                out->bytes[FSDP_COMM_GATHER_SECONDARY] +=
                    fsdp_engine_secondary_wire(e->secondary_size, e->opts.compute_dtype, m);
            out->bytes[FSDP_COMM_REDUCE] += w.reduce;
        }
        if (R > 1) out->bytes[FSDP_COMM_REPLICA] += w.replica;
    }
    sum_total(out);
}
