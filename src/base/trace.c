/* The span store of trace.h. */
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

struct fsdp_trace {
    int first, last, step;
    double origin; /* fsdp_now() when made */
    fsdp_span *spans;
    size_t count, cap;
};

const char *fsdp_track_name(fsdp_track t) {
    static const char *const names[FSDP_TRACKS] = {"host", "compute", "gather", "reduce", "wait"};
    return t >= 0 && t < FSDP_TRACKS ? names[t] : "?";
}

fsdp_trace *fsdp_trace_create(int first, int last) {
    fsdp_trace *tr = fsdp_xcalloc(1, sizeof *tr, "the trace recorder");
    tr->first = first, tr->last = last, tr->step = 0;
    tr->origin = fsdp_now();
    return tr;
}

void fsdp_trace_destroy(fsdp_trace *tr) {
    if (!tr) return;
    free(tr->spans);
    free(tr);
}

void fsdp_trace_set_step(fsdp_trace *tr, int step) {
    if (tr) tr->step = step;
}
int fsdp_trace_step(const fsdp_trace *tr) { return tr ? tr->step : 0; }
int fsdp_trace_first(const fsdp_trace *tr) { return tr ? tr->first : 0; }
int fsdp_trace_last(const fsdp_trace *tr) { return tr ? tr->last : 0; }
int fsdp_trace_active(const fsdp_trace *tr) { return tr && tr->step >= tr->first && tr->step <= tr->last; }
double fsdp_trace_now_us(const fsdp_trace *tr) { return tr ? (fsdp_now() - tr->origin) * 1e6 : 0.0; }

double fsdp_trace_host_begin(const fsdp_trace *tr) { return fsdp_trace_active(tr) ? fsdp_trace_now_us(tr) : -1.0; }

void fsdp_trace_host_end(fsdp_trace *tr, double t0, const char *name) {
    /* t0 < 0: the phase began outside the window (or with tracing off). */
    if (t0 < 0.0 || !fsdp_trace_active(tr)) return;
    fsdp_span s;
    memset(&s, 0, sizeof s);
    s.track = FSDP_TRACK_HOST, s.step = tr->step, s.unit = -1, s.bytes = -1.0;
    s.t0_us = t0, s.t1_us = fsdp_trace_now_us(tr);
    snprintf(s.name, sizeof s.name, "%s", name);
    fsdp_trace_add(tr, &s);
}

void fsdp_trace_add(fsdp_trace *tr, const fsdp_span *s) {
    if (!tr) return;
    FSDP_GROW(tr->spans, tr->count, tr->cap, 1024, "the trace's spans");
    tr->spans[tr->count] = *s;
    if (tr->spans[tr->count].t1_us < tr->spans[tr->count].t0_us) tr->spans[tr->count].t1_us = tr->spans[tr->count].t0_us;
    tr->count++;
}

const fsdp_span *fsdp_trace_spans(const fsdp_trace *tr, size_t *count) {
    *count = tr ? tr->count : 0;
    return tr ? tr->spans : NULL;
}
