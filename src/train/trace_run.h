/* --trace FILE and --trace-steps A:B of `fsdp train` (README: "Seeing where a step waits"): the
 * run's timeline recorder (src/base/trace.h), its marks on the streams (src/backend/stream_marks.h),
 * the engine's hooks, the trainer's spans (each unit's forward and backward on the compute stream,
 * the host's phases), the per-rank files (src/io/trace_json.h) and the summary (a log line and the
 * metrics' "trace" object, the ranks' mean). Everything is a no-op when the run has no --trace. */
#ifndef FSDP_TRAIN_TRACE_RUN_H
#define FSDP_TRAIN_TRACE_RUN_H

#include <jansson.h>

#include "../base/error.h"
#include "../base/trace.h"
#include "trainer.h"

/* Parses --trace-steps "A:B" (1 <= A <= B); -1 with a usage error naming the value. */
int fsdp_trace_parse_steps(const char *text, int *first, int *last, fsdp_err *err);

/* Collective, before the run is set up: every rank's file can be written (below). */
int fsdp_trace_check_paths(fsdp_trainer *t, fsdp_err *err);
/* Collective, once the run knows its steps and where it starts (after a resume): checks the window
 * against them and every rank's file (its folder exists and is writable, it is not a directory nor
 * an input), then starts recording. Without --trace-steps the window is three steps after the
 * first two of the run (fewer when the run is shorter). */
int fsdp_trace_run_open(fsdp_trainer *t, fsdp_err *err);
void fsdp_trace_run_close(fsdp_trainer *t);

/* The recorder (NULL without --trace), for host phases: fsdp_trace_host_begin / _end. */
fsdp_trace *fsdp_trace_run_recorder(const fsdp_trainer *t);
/* A mark on the compute stream (-1 when not recording), and the span from it to now on the compute
 * track: "<what> <unit name>", or the unit's name alone when what is NULL. */
int fsdp_trace_mark(fsdp_trainer *t);
void fsdp_trace_compute(fsdp_trainer *t, int begin, const char *what, int unit);
/* Right after the step's last synchronisation of the compute stream. */
void fsdp_trace_step_end(fsdp_trainer *t);
/* After step t->step is complete (its checkpoint boundary passed): the next spans belong to the next
 * step, and once the window is over the files are written (collective). */
int fsdp_trace_after_step(fsdp_trainer *t, fsdp_err *err);
/* At the end of the run: writes the files if the window did not end before (collective). */
int fsdp_trace_run_finish(fsdp_trainer *t, fsdp_err *err);
/* The metrics summary's "trace" object (the ranks' mean), or NULL when nothing was written. */
json_t *fsdp_trace_run_json(const fsdp_trainer *t);

#endif
