/* The timeline recorder of `fsdp train --trace` (README: "Seeing where a step waits").
 *
 * A trace is a list of spans, each a named interval on one track: the host's phases, the compute
 * stream's units, the gather and reduce streams' collectives, and the stalls of the compute stream on
 * communication. Times are microseconds on the host's monotonic clock since the trace was made.
 * The recorder only stores spans and knows which steps are recorded (a window [first, last] of step
 * numbers, so a long run keeps a bounded trace); spans timed on a device's streams come from
 * src/backend/stream_marks.h, the file from src/io/trace_json.h, the figures from trace_summary.h.
 * Every function accepts a NULL recorder and then does nothing (tracing off). */
#ifndef FSDP_BASE_TRACE_H
#define FSDP_BASE_TRACE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FSDP_TRACK_HOST = 0, /* host phases: data, the step's synchronisation, evaluation, checkpoints */
    FSDP_TRACK_COMPUTE,  /* the compute stream: each unit's forward and backward, the optimizer */
    FSDP_TRACK_GATHER,   /* the gather stream: parameter all-gathers */
    FSDP_TRACK_REDUCE,   /* the reduce stream: gradient reductions, gradient rows */
    FSDP_TRACK_WAIT,     /* the compute stream stalled on a gather or on the step's reductions */
    FSDP_TRACKS
} fsdp_track;

/* "host", "compute", "gather", "reduce", "wait". */
const char *fsdp_track_name(fsdp_track t);

typedef struct {
    fsdp_track track;
    int step;             /* the training step it belongs to */
    int unit;             /* the FSDP unit, or -1 */
    double t0_us, t1_us;  /* since the trace was made; t1_us >= t0_us */
    double bytes;         /* what this rank sent (comm_bytes' count), or -1: no communication */
    char name[48];        /* "fwd B3", "gather B3", "reduce-scatter B3", "data" */
    char dtype[12];       /* the dtype on the wire, or "" */
} fsdp_span;

typedef struct fsdp_trace fsdp_trace;

/* A recorder of steps first..last (1-based step numbers, first <= last); the clock starts now. */
fsdp_trace *fsdp_trace_create(int first, int last);
void fsdp_trace_destroy(fsdp_trace *tr);
/* The step that spans recorded from now on belong to. */
void fsdp_trace_set_step(fsdp_trace *tr, int step);
int fsdp_trace_step(const fsdp_trace *tr);
int fsdp_trace_first(const fsdp_trace *tr);
int fsdp_trace_last(const fsdp_trace *tr);
/* 1 while the current step is in the window (0 for NULL). */
int fsdp_trace_active(const fsdp_trace *tr);
/* Microseconds since the trace was made. */
double fsdp_trace_now_us(const fsdp_trace *tr);

/* A host phase: t0 = fsdp_trace_host_begin (a negative value when not recording), then
 * fsdp_trace_host_end adds [t0, now] named `name` to the current step. */
double fsdp_trace_host_begin(const fsdp_trace *tr);
void fsdp_trace_host_end(fsdp_trace *tr, double t0, const char *name);
/* Adds a copy of *s (its own step, whatever the current one). */
void fsdp_trace_add(fsdp_trace *tr, const fsdp_span *s);
/* The spans recorded so far, in the order they were added. */
const fsdp_span *fsdp_trace_spans(const fsdp_trace *tr, size_t *count);

#ifdef __cplusplus
}
#endif

#endif
