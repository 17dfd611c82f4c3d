/* How an engine runs and what its wire needs, without a device (engine_plan.h): the engine builds
 * from these and its memory plan counts with them. */
#include <string.h>

#include "engine_plan.h"

void fsdp_engine_mode_of(const fsdp_shard_options *o, int S, int R, fsdp_engine_mode *m) {
    memset(m, 0, sizeof *m);
    m->shard_size = S, m->replica_size = R;
    int training = !o->forward_only;
    int local = training && o->accumulate_local;
    m->defer_replicas = local && R > 1;
    m->hold_grads = local && S > 1 && R == 1;
    m->hold_params = m->hold_grads && o->strategy == FSDP_SHARD_GRAD_OP;
    m->direct_grads = training && S == 1 && o->grad_dtype == o->master_dtype && (R == 1 || m->defer_replicas);
    /* NCCL sums fp32 exactly enough; any narrower dtype is summed in fp32 where it lands. */
    m->piece_reductions = training && S > 1 &&
                          (o->reduce_dtype != FSDP_F32 || o->grad_dtype != FSDP_F32 || o->copy_engine_reductions);
    m->quantize_sends = m->piece_reductions && o->reduce_dtype != o->grad_dtype;
    m->nccl_replicas = training && R > 1 && o->reduce_dtype == FSDP_F32;
    m->quantized_gathers = S > 1 && fsdp_dtype_blockwise(o->gather_dtype);
    m->working_copy = o->compute_dtype != o->master_dtype && !m->quantized_gathers;
    m->fp8_weights = training && o->fp8_weights && m->quantized_gathers && o->gather_dtype == FSDP_E4M3;
    /* hpZ only where a forward is followed by a backward that gathers again over a larger group. */
    int N = o->reshard_size;
    m->secondary_size = training && o->strategy == FSDP_FULL && N >= 1 && N < S && S % N == 0 ? N : 0;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

void fsdp_plan_wire_buffers(const fsdp_engine_mode *m, const fsdp_shard_options *o, const int64_t *shard_len,
                            int num_units, int forward_only, fsdp_device_kind kind, fsdp_wire_buffers *out) {
    memset(out, 0, sizeof *out);
    int S = m->shard_size, R = m->replica_size;
    int64_t longest = 0;
    for (int u = 0; u < num_units; u++) longest = shard_len[u] > longest ? shard_len[u] : longest;
    if (!forward_only && m->piece_reductions) {
        size_t pieces = (size_t)S * fsdp_device_piece_bytes(kind, o->reduce_dtype, (size_t)longest);
        out->recv = pieces;
        if (m->quantize_sends) out->send = pieces;
        if (R > 1 && !m->defer_replicas) out->summed = (size_t)longest * sizeof(float);
    }
    if (!forward_only && R > 1 && !m->nccl_replicas) {
        int64_t c = fsdp_replica_piece(longest, R);
        size_t pieces = (size_t)R * fsdp_device_piece_bytes(kind, o->reduce_dtype, (size_t)c);
        out->send = max_size(out->send, pieces);
        out->recv = max_size(out->recv, pieces);
        out->replica_piece = (size_t)c * sizeof(float);
        out->replica_gathered = (size_t)R * (size_t)c * fsdp_device_dtype_size(kind, FSDP_BF16);
    }
    if (m->quantized_gathers) {
        for (int u = 0; u < num_units; u++)
            out->quantized_shards += fsdp_device_piece_bytes(kind, o->gather_dtype, (size_t)shard_len[u]);
        out->gather_staging = (size_t)S * fsdp_device_piece_bytes(kind, o->gather_dtype, (size_t)longest);
    }
}
