/* The engine's part of --trace (engine.h: fsdp_engine_set_trace): each collective bracketed by two
 * marks on the stream that runs it, with the bytes comm_bytes.c counted in between, and each measured
 * wait of the compute stream as a span. Everything is a no-op without marks. */
#include <stdio.h>

#include "../backend/stream_marks.h"
#include "engine_internal.h"

void fsdp_engine_set_trace(fsdp_engine *e, fsdp_stream_marks *marks, const char *const *unit_names) {
    e->marks = marks;
    e->unit_names = unit_names;
}

static double sent_total(const fsdp_engine *e) {
    double sum = 0.0;
    for (int k = 0; k < FSDP_COMM_KINDS; k++) sum += e->sent.bytes[k];
    return sum;
}

static void span_name(const fsdp_engine *e, const char *what, int u, char *out, size_t cap) {
    if (u < 0)
        snprintf(out, cap, "%s", what);
    else if (e->unit_names)
        snprintf(out, cap, "%s %s", what, e->unit_names[u]);
    else
        snprintf(out, cap, "%s unit %d", what, u);
}

engine_span engine_span_begin(fsdp_engine *e, fsdp_stream *s) {
    engine_span b = {-1, 0.0};
    if (!e->marks) return b;
    b.mark = fsdp_marks_record(e->marks, s);
    b.sent = sent_total(e);
    return b;
}

void engine_span_end(fsdp_engine *e, engine_span b, fsdp_stream *s, int track, const char *what, int u,
                     fsdp_dtype dtype) {
    if (!e->marks || b.mark < 0) return;
    char name[48];
    span_name(e, what, u, name, sizeof name);
    int end = fsdp_marks_record(e->marks, s);
    fsdp_marks_span(e->marks, (fsdp_track)track, b.mark, end, name, u, sent_total(e) - b.sent, fsdp_dtype_name(dtype));
}

void engine_trace_wait(fsdp_engine *e, fsdp_event *begin, fsdp_event *ready, int what) {
    if (!e->marks) return;
    char name[48];
    int u = what >= 0 ? what : what <= -2 ? -2 - what : -1;
    span_name(e, what >= 0 ? "wait gather" : what == -1 ? "wait reductions" : "wait gradient buffer", u, name,
              sizeof name);
    fsdp_marks_span_events(e->marks, FSDP_TRACK_WAIT, begin, ready, name, u);
}
