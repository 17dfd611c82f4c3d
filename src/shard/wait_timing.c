/* Wait timing: every time the compute stream waits for communication (a gather, the step's
 * reductions, a gradient buffer still being reduced), a pair of timing events brackets the wait; the
 * pairs are read once a step to report how long compute stalled. The events come from a pool reused
 * every step. A pair's `what`: the unit gathered (>= 0), the reductions (-1), or the gradient buffer
 * of unit u (-2 - u). */
#include <stdio.h>
#include <stdlib.h>

#include "../base/env.h"
#include "../base/error.h"
#include "../base/log.h"
#include "engine_internal.h"

fsdp_event *engine_timing_event(fsdp_engine *e, int *index) {
    if (e->pool_used == e->pool_cap) {
        int cap = e->pool_cap ? 2 * e->pool_cap : 64;
        e->pool = realloc(e->pool, (size_t)cap * sizeof *e->pool);
        if (!e->pool) fsdp_fatal("out of host memory for timing events");
        for (int i = e->pool_cap; i < cap; i++) e->pool[i] = e->be->runtime->event_create(e->be, 1);
        e->pool_cap = cap;
    }
    *index = e->pool_used;
    return e->pool[e->pool_used++];
}

/* A timing event recorded on the compute stream now: where a wait begins. */
static int mark_compute(fsdp_engine *e) {
    int index;
    fsdp_event *b = engine_timing_event(e, &index);
    e->be->runtime->event_record(e->be, b, e->be->compute);
    return index;
}

static void add_pair(fsdp_engine *e, int begin, int ready, int what) {
    if (e->num_wait_pairs == e->wait_pairs_cap) {
        e->wait_pairs_cap = e->wait_pairs_cap ? 2 * e->wait_pairs_cap : 64;
        e->wait_pairs = realloc(e->wait_pairs, (size_t)e->wait_pairs_cap * 3 * sizeof(int));
        if (!e->wait_pairs) fsdp_fatal("out of host memory for timing events");
    }
    e->wait_pairs[3 * e->num_wait_pairs] = begin;
    e->wait_pairs[3 * e->num_wait_pairs + 1] = ready;
    e->wait_pairs[3 * e->num_wait_pairs + 2] = what;
    e->num_wait_pairs++;
}

void engine_compute_waits(fsdp_engine *e, int ready_index, int what) {
    int begin = mark_compute(e);
    e->be->runtime->stream_wait_event(e->be, e->be->compute, e->pool[ready_index]);
    add_pair(e, begin, ready_index, what);
}

void engine_compute_waits_for(fsdp_engine *e, fsdp_event *ready, int u) {
    /* The pair is (before, after) the wait, both on the compute stream: `ready` itself is recorded
     * again by the slot's next reduction before the pairs are read. After - before is the stall. */
    int begin = mark_compute(e);
    e->be->runtime->stream_wait_event(e->be, e->be->compute, ready);
    add_pair(e, begin, mark_compute(e), -2 - u);
}

void engine_free_timing(fsdp_engine *e) {
    for (int i = 0; i < e->pool_cap; i++) e->be->runtime->event_destroy(e->be, e->pool[i]);
    free(e->pool);
    free(e->wait_pairs);
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
        e->be->runtime->event_synchronize(e->be, r);
        e->be->runtime->event_synchronize(e->be, b);
        float ms = e->be->runtime->event_elapsed_ms(e->be, b, r);
        if (ms > 0.0f) total += ms; /* negative: the data was there before compute asked */
        engine_trace_wait(e, b, r, w[2]);
        if (verbose && ms >= 0.05f && used + 48 < sizeof detail) {
            int n = w[2] >= 0   ? snprintf(detail + used, sizeof detail - used, " #%d gather(unit %d) %.2f", i, w[2], ms)
                    : w[2] == -1 ? snprintf(detail + used, sizeof detail - used, " #%d reductions %.2f", i, ms)
                                 : snprintf(detail + used, sizeof detail - used, " #%d gradient buffer(unit %d) %.2f", i,
                                            -2 - w[2], ms);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    if (verbose) fsdp_log("comm waits (ms, rank 0, %d waits):%s\n", e->num_wait_pairs, detail);
    e->num_wait_pairs = 0;
    e->pool_used = 0;
    return total;
}
