/* Gradient rows (fsdp_engine_add_rows): a unit's gradient given as rows instead of a dense buffer.
 * Every rank's rows and row indices are all-gathered over the world on the reduce stream and each
 * rank adds those that fall in its own shard. */
#include <string.h>

#include "../base/error.h"
#include "engine_internal.h"

void engine_reserve_rows(fsdp_engine *e, int count, int row_len) {
    fsdp_backend *be = e->be;
    if ((size_t)count <= e->rows_capacity && row_len <= e->rows_len) return;
    if (e->reduce_stream) be->runtime->stream_synchronize(be, e->reduce_stream);
    if (e->rows_values) be->runtime->free(be, e->rows_values);
    if (e->rows_index) be->runtime->free(be, e->rows_index);
    size_t n = (size_t)e->world_size * (size_t)count;
    e->rows_values = be->runtime->alloc(be, n * (size_t)row_len * e->ce, "gathered gradient rows");
    e->rows_index = be->runtime->alloc(be, FSDP_MAX_ROW_SETS * n * sizeof(int32_t), "gathered gradient row indices");
    e->rows_capacity = (size_t)count;
    e->rows_len = row_len;
}

void fsdp_engine_add_rows(fsdp_engine *e, int u, const fsdp_row_set *sets, int nsets, const void *values,
                          int count, int row_len) {
    fsdp_backend *be = e->be;
    if (e->opts.master_dtype != FSDP_F32)
        fsdp_fatal("internal error: gradient rows need fp32 gradient shards (unit %d)", u);
    if (e->mode.defer_replicas)
        fsdp_fatal("internal error: gradient rows of unit %d under replicas reduced once per step", u);
    if (nsets < 1 || nsets > FSDP_MAX_ROW_SETS)
        fsdp_fatal("internal error: %d row sets for unit %d (at most %d)", nsets, u, FSDP_MAX_ROW_SETS);
    be->runtime->event_record(be, e->rows_ready, be->compute);
    be->runtime->stream_wait_event(be, e->reduce_stream, e->rows_ready);
    engine_span span = engine_span_begin(e, e->reduce_stream);
    if (!e->written[u]) { /* rows are added: the shard needs its zeros first */
        be->runtime->zero(be, engine_grad_shard(e, &e->units[u]), (size_t)e->units[u].shard_len * e->me, e->reduce_stream);
        e->written[u] = 1;
    }
    fsdp_row_set all[FSDP_MAX_ROW_SETS];
    memcpy(all, sets, (size_t)nsets * sizeof *sets);
    const void *all_values = values;
    int entries = count;
    if (e->world_size > 1) {
        engine_reserve_rows(e, count, row_len); /* made at creation when the options foresaw them */
        size_t n = (size_t)e->world_size * (size_t)count;
        be->coll->all_gather(be, e->rows_comm, values, e->rows_values, (size_t)count * (size_t)row_len,
                             e->opts.compute_dtype, e->reduce_stream);
        engine_count_pieces(e, FSDP_COMM_OTHER, e->world_size,
                            engine_wire_bytes(e->opts.compute_dtype, (size_t)count * (size_t)row_len));
        for (int k = 0; k < nsets; k++) {
            if (!sets[k].rows) continue; /* periodic rows: entry n of every rank maps the same way */
            int32_t *dst = e->rows_index + (size_t)k * n;
            /* Indices travel as 4-byte words: an all-gather only moves bytes. */
            be->coll->all_gather(be, e->rows_comm, sets[k].rows, dst, (size_t)count, FSDP_F32, e->reduce_stream);
            engine_count_pieces(e, FSDP_COMM_OTHER, e->world_size, (size_t)count * sizeof(int32_t));
            all[k].rows = dst;
        }
        all_values = e->rows_values;
        entries = (int)n;
    }
    fsdp_shard_view v = fsdp_engine_view(e, u);
    be->ops->add_rows(be, v.grad, v.start, v.len, all, nsets, all_values, entries, row_len, e->reduce_stream);
    engine_span_end(e, span, e->reduce_stream, FSDP_TRACK_REDUCE, "gradient rows", u, e->opts.compute_dtype);
    be->runtime->event_record(be, e->rows_done, e->reduce_stream);
    e->rows_pending = 1;
}
