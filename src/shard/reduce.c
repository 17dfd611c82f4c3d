/* The reductions of a unit's gradients into its gradient shard, on the reduce stream (engine.h:
 * "Bytes on the wire are a budget"): over the shard group by NCCL's reduce-scatter (fp32) or as an
 * all-to-all of pieces summed in fp32 where they land (bf16, int8), then over replicas by NCCL's
 * all-reduce (fp32) or as pieces summed in fp32 and their sums all-gathered in bf16. */
#include "../base/error.h"
#include "engine_internal.h"

static int unit_index(const fsdp_engine *e, const unit_state *s) { return (int)(s - e->units); }

/* `src` (the unit's shard length of t) into the gradient shard: written by the step's first
 * reduction, added by later ones. */
static void into_shard(fsdp_engine *e, unit_state *s, const void *src, fsdp_dtype t) {
    fsdp_backend *be = e->be;
    int u = unit_index(e, s), first = !e->written[u];
    e->written[u] = 1;
    if (first)
        be->ops->cast(be, engine_grad_shard(e, s), e->opts.master_dtype, src, t, (size_t)s->shard_len, e->reduce_stream);
    else
        be->ops->accumulate(be, engine_grad_shard(e, s), e->opts.master_dtype, src, t, (size_t)s->shard_len,
                            e->reduce_stream);
}

/* x (n elements of t) summed over the replicas, in place. */
static void reduce_replicas(fsdp_engine *e, void *x, fsdp_dtype t, size_t n) {
    fsdp_backend *be = e->be;
    int R = e->replica_size;
    if (e->mode.nccl_replicas) {
        be->coll->all_reduce(be, e->replica_comm, x, n, t, e->reduce_stream);
        engine_count_all_reduce(e, FSDP_COMM_REPLICA, R, engine_wire_bytes(t, n));
        return;
    }
    fsdp_dtype w = e->opts.reduce_dtype;
    size_t c = (size_t)fsdp_replica_piece((int64_t)n, R);
    /* Piece q of every replica goes to replica q, which sums them in fp32... */
    be->ops->quantize(be, e->wire_send, w, x, t, c, R, n, e->reduce_stream);
    be->coll->all_to_all(be, e->replica_comm, e->wire_send, e->wire_recv, c, w, e->reduce_stream);
    be->ops->sum_pieces(be, e->replica_piece, FSDP_F32, e->wire_recv, w, c, R, 0, e->reduce_stream);
    /* ...and every replica gets every sum in bf16, so that all of them hold the same bits. */
    size_t be16 = be->runtime->dtype_size(be, FSDP_BF16);
    char *mine = (char *)e->replica_gathered + (size_t)e->replica_rank * c * be16;
    be->ops->cast(be, mine, FSDP_BF16, e->replica_piece, FSDP_F32, c, e->reduce_stream);
    be->coll->all_gather(be, e->replica_comm, mine, e->replica_gathered, c, FSDP_BF16, e->reduce_stream);
    be->ops->cast(be, x, t, e->replica_gathered, FSDP_BF16, n, e->reduce_stream);
    engine_count_pieces(e, FSDP_COMM_REPLICA, R, engine_wire_bytes(w, c));
    engine_count_pieces(e, FSDP_COMM_REPLICA, R, engine_wire_bytes(FSDP_BF16, c));
}

/* NCCL's reduce-scatter in the buffer's dtype (fp32). */
static void reduce_scatter_by_nccl(fsdp_engine *e, unit_state *s, char *buf, int replicas_now) {
    fsdp_backend *be = e->be;
    fsdp_dtype g = e->opts.grad_dtype;
    size_t n = (size_t)s->shard_len;
    int u = unit_index(e, s);
    engine_count_pieces(e, FSDP_COMM_REDUCE, e->shard_size, engine_wire_bytes(g, n));
    if (!e->written[u] && !replicas_now && g == e->opts.master_dtype) {
        /* The first reduction of the step lands in the shard itself: no add, no zeroing. */
        be->coll->reduce_scatter(be, e->reduce_comm, buf, engine_grad_shard(e, s), n, g, e->reduce_stream);
        e->written[u] = 1;
        return;
    }
    char *mine = buf + (size_t)e->shard_rank * n * e->ge;
    be->coll->reduce_scatter(be, e->reduce_comm, buf, mine, n, g, e->reduce_stream);
    if (replicas_now) reduce_replicas(e, mine, g, n);
    into_shard(e, s, mine, g);
}

/* An all-to-all of every rank's pieces (converted to the reduce dtype first when it is not the
 * buffer's), summed in fp32 by the rank that owns the shard. */
static void reduce_scatter_by_pieces(fsdp_engine *e, unit_state *s, char *buf, int replicas_now) {
    fsdp_backend *be = e->be;
    fsdp_dtype g = e->opts.grad_dtype, w = e->opts.reduce_dtype;
    int S = e->shard_size, u = unit_index(e, s);
    size_t n = (size_t)s->shard_len;
    const void *send = buf;
    if (e->mode.quantize_sends) {
        be->ops->quantize(be, e->wire_send, w, buf, g, n, S, (size_t)S * n, e->reduce_stream);
        send = e->wire_send;
    }
    be->coll->all_to_all(be, e->reduce_comm, send, e->wire_recv, n, w, e->reduce_stream);
    engine_count_pieces(e, FSDP_COMM_REDUCE, S, engine_wire_bytes(w, n));
    if (replicas_now) {
        be->ops->sum_pieces(be, e->summed, FSDP_F32, e->wire_recv, w, n, S, 0, e->reduce_stream);
        reduce_replicas(e, e->summed, FSDP_F32, n);
        into_shard(e, s, e->summed, FSDP_F32);
        return;
    }
    int first = !e->written[u];
    e->written[u] = 1;
    be->ops->sum_pieces(be, engine_grad_shard(e, s), e->opts.master_dtype, e->wire_recv, w, n, S, !first,
                        e->reduce_stream);
}

void engine_reduce_replicas_of_shard(fsdp_engine *e, unit_state *s) {
    reduce_replicas(e, engine_grad_shard(e, s), e->opts.master_dtype, (size_t)s->shard_len);
    e->replicas_done[unit_index(e, s)] = 1;
}

void engine_reduce_unit(fsdp_engine *e, unit_state *s, void *buf) {
    int replicas_now = e->replica_size > 1 && !e->mode.defer_replicas;
    if (e->shard_size == 1) {
        if (replicas_now) reduce_replicas(e, buf, e->opts.grad_dtype, (size_t)s->shard_len);
        into_shard(e, s, buf, e->opts.grad_dtype);
    } else if (e->mode.piece_reductions) {
        reduce_scatter_by_pieces(e, s, buf, replicas_now);
    } else {
        reduce_scatter_by_nccl(e, s, buf, replicas_now);
    }
    if (e->mode.defer_replicas && engine_last_microbatch(e)) engine_reduce_replicas_of_shard(e, s);
}
