/* Spans of a trace (src/base/trace.h) timed on the backend's streams.
 *
 * A mark is a timing event recorded on a stream: on a GPU it takes its time when the stream reaches
 * it, on the CPU backend when the work before it was done (backend_cpu.c). A span is a pair of marks.
 * Nothing waits for a mark when it is made: the marks of a step are turned into times once, at the
 * end of the NEXT step (fsdp_marks_step_end), when the device has long passed them, against an anchor
 * mark recorded on the idle compute stream right after the host synchronised with it, whose host
 * time is therefore known. So tracing adds event records and no device synchronisation; the events
 * come from a pool reused every step. Every function accepts NULL marks (tracing off) and does
 * nothing, and marks are only made while the recorder's step is in its window. */
#ifndef FSDP_BACKEND_STREAM_MARKS_H
#define FSDP_BACKEND_STREAM_MARKS_H

#include "../base/trace.h"
#include "backend.h"

typedef struct fsdp_stream_marks fsdp_stream_marks;

/* Marks for recorder `tr` (kept, not owned). Synchronises the compute stream for the first anchor. */
fsdp_stream_marks *fsdp_marks_create(fsdp_backend *be, fsdp_trace *tr);
/* Frees the events; spans not yet resolved are lost (call fsdp_marks_flush first). */
void fsdp_marks_destroy(fsdp_stream_marks *m);
fsdp_trace *fsdp_marks_trace(const fsdp_stream_marks *m);

/* Records a mark on stream s; returns its handle, or -1 when not recording. */
int fsdp_marks_record(fsdp_stream_marks *m, fsdp_stream *s);
/* A span from mark `begin` to mark `end` (either -1: nothing) in the current step. bytes < 0: not
 * communication; dtype may be NULL. */
void fsdp_marks_span(fsdp_stream_marks *m, fsdp_track track, int begin, int end, const char *name, int unit,
                     double bytes, const char *dtype);
/* A span from two events of the caller's that have completed (the engine's measured waits): timed
 * now, [begin, max(begin, end)], and only when that is longer than zero. */
void fsdp_marks_span_events(fsdp_stream_marks *m, fsdp_track track, fsdp_event *begin, fsdp_event *end,
                            const char *name, int unit);
/* At the end of a step, right after the host synchronised the compute stream (which then waited for
 * everything of the step before): resolves the previous step's marks and records a new anchor. */
void fsdp_marks_step_end(fsdp_stream_marks *m);
/* Waits for every outstanding mark and resolves them all (the end of the trace or of the run). */
void fsdp_marks_flush(fsdp_stream_marks *m);

#endif
