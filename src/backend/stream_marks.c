/* Marks on streams (stream_marks.h): two generations of events, the current step's and the previous
 * one's, so that a step's marks are read one step later without waiting for them. */
#include "stream_marks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"

typedef struct {
    fsdp_span span; /* times filled at resolution */
    int begin, end; /* events of the generation */
} pending;

typedef struct {
    fsdp_event **events;
    int used, cap;
    pending *spans;
    int count, spans_cap;
} generation;

struct fsdp_stream_marks {
    fsdp_backend *be;
    fsdp_trace *tr;
    generation gen[2];
    int cur;              /* gen[cur] takes new marks; gen[1 - cur] waits to be resolved */
    fsdp_event *anchor;   /* on the compute stream, recorded while it was idle */
    double anchor_us;     /* the trace clock when it was recorded */
};

static void record_anchor(fsdp_stream_marks *m) {
    m->be->runtime->event_record(m->be, m->anchor, m->be->compute);
    m->anchor_us = fsdp_trace_now_us(m->tr);
}

fsdp_stream_marks *fsdp_marks_create(fsdp_backend *be, fsdp_trace *tr) {
    fsdp_stream_marks *m = fsdp_xcalloc(1, sizeof *m, "the trace's stream marks");
    m->be = be, m->tr = tr;
    m->anchor = be->runtime->event_create(be, 1);
    be->runtime->stream_synchronize(be, be->compute);
    record_anchor(m);
    return m;
}

void fsdp_marks_destroy(fsdp_stream_marks *m) {
    if (!m) return;
    for (int g = 0; g < 2; g++) {
        for (int i = 0; i < m->gen[g].cap; i++) m->be->runtime->event_destroy(m->be, m->gen[g].events[i]);
        free(m->gen[g].events);
        free(m->gen[g].spans);
    }
    m->be->runtime->event_destroy(m->be, m->anchor);
    free(m);
}

fsdp_trace *fsdp_marks_trace(const fsdp_stream_marks *m) { return m ? m->tr : NULL; }

int fsdp_marks_record(fsdp_stream_marks *m, fsdp_stream *s) {
    if (!m || !fsdp_trace_active(m->tr)) return -1;
    generation *g = &m->gen[m->cur];
    if (g->used == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256;
        fsdp_event **grown = realloc(g->events, (size_t)cap * sizeof *grown);
        if (!grown) fsdp_fatal("out of host memory for %d trace events", cap);
        g->events = grown;
        for (int i = g->cap; i < cap; i++) g->events[i] = m->be->runtime->event_create(m->be, 1);
        g->cap = cap;
    }
    m->be->runtime->event_record(m->be, g->events[g->used], s);
    return g->used++;
}

static fsdp_span make_span(const fsdp_stream_marks *m, fsdp_track track, const char *name, int unit, double bytes,
                           const char *dtype) {
    fsdp_span s;
    memset(&s, 0, sizeof s);
    s.track = track, s.step = fsdp_trace_step(m->tr), s.unit = unit, s.bytes = bytes;
    snprintf(s.name, sizeof s.name, "%s", name);
    if (dtype) snprintf(s.dtype, sizeof s.dtype, "%s", dtype);
    return s;
}

void fsdp_marks_span(fsdp_stream_marks *m, fsdp_track track, int begin, int end, const char *name, int unit,
                     double bytes, const char *dtype) {
    if (!m || begin < 0 || end < 0) return;
    generation *g = &m->gen[m->cur];
    FSDP_GROW(g->spans, g->count, g->spans_cap, 128, "the trace's spans");
    pending *p = &g->spans[g->count++];
    p->span = make_span(m, track, name, unit, bytes, dtype);
    p->begin = begin, p->end = end;
}

/* The trace clock of a completed event, through the anchor (also complete). */
static double time_of(fsdp_stream_marks *m, fsdp_event *e) {
    return m->anchor_us + 1e3 * (double)m->be->runtime->event_elapsed_ms(m->be, m->anchor, e);
}

void fsdp_marks_span_events(fsdp_stream_marks *m, fsdp_track track, fsdp_event *begin, fsdp_event *end,
                            const char *name, int unit) {
    if (!m || !fsdp_trace_active(m->tr)) return;
    fsdp_span s = make_span(m, track, name, unit, -1.0, NULL);
    s.t0_us = time_of(m, begin);
    s.t1_us = time_of(m, end);
    if (s.t1_us > s.t0_us) fsdp_trace_add(m->tr, &s);
}

/* Every event of g is complete already when a step ends (fsdp_marks_step_end); synchronising costs a
 * query then, and on the CPU runs the stamps still queued behind completed collectives. */
static void resolve(fsdp_stream_marks *m, generation *g) {
    for (int i = 0; i < g->used; i++) m->be->runtime->event_synchronize(m->be, g->events[i]);
    for (int i = 0; i < g->count; i++) {
        pending *p = &g->spans[i];
        p->span.t0_us = time_of(m, g->events[p->begin]);
        p->span.t1_us = time_of(m, g->events[p->end]);
        fsdp_trace_add(m->tr, &p->span);
    }
    g->used = 0, g->count = 0;
}

void fsdp_marks_step_end(fsdp_stream_marks *m) {
    if (!m) return;
    /* The previous step's marks all came before what the compute stream just finished: the step's
     * forward waited for every gather issued before it, and the step's end for every reduction.
     * Reading them waits for nothing, and the anchor recorded at the previous step's end is complete. */
    resolve(m, &m->gen[1 - m->cur]);
    record_anchor(m);
    m->cur = 1 - m->cur;
}

void fsdp_marks_flush(fsdp_stream_marks *m) {
    if (!m) return;
    m->be->runtime->event_synchronize(m->be, m->anchor);
    resolve(m, &m->gen[1 - m->cur]);
    resolve(m, &m->gen[m->cur]);
}
