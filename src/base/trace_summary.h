/* The figures of a trace (trace.h), computed in this one place for the end-of-run line, the
 * metrics' summary and the trace file (docs/FORMATS.md: "Trace files").
 *
 * Per step, averaged over the steps that have spans: each track's busy time (the sum of its spans'
 * durations: a stream runs one thing at a time), the time communication ran (the union of the gather
 * and reduce spans), how much of it compute ran beside (that union intersected with the union of the
 * compute spans: hidden), the rest (exposed), and their ratio, the overlap fraction. The wait track's
 * busy time is the measured communication wait (the compute stream stalled on a gather or on the
 * reductions): what the exposed communication costs the step. */
#ifndef FSDP_BASE_TRACE_SUMMARY_H
#define FSDP_BASE_TRACE_SUMMARY_H

#include <stddef.h>

#include "trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int steps;                      /* distinct steps among the spans */
    double busy_ms[FSDP_TRACKS];    /* per step */
    double comm_ms;                 /* per step: gather or reduce running */
    double hidden_ms, exposed_ms;   /* per step: of comm_ms, with and without compute running */
    double overlap;                 /* hidden_ms / comm_ms; 0 without communication */
    double bytes;                   /* per step: the spans' bytes */
} fsdp_trace_summary;

/* The summary of `count` spans (any order). */
void fsdp_trace_summarize(const fsdp_span *spans, size_t count, fsdp_trace_summary *out);

#ifdef __cplusplus
}
#endif

#endif
