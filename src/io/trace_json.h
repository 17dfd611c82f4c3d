/* Trace files of `fsdp train --trace` (docs/FORMATS.md: "Trace files"): Chrome's JSON Trace Event
 * Format, which Perfetto (ui.perfetto.dev) and chrome://tracing open. One file per rank: the path
 * given with ".rank<R>" inserted before the extension of its last component (trace.json ->
 * trace.rank0.json; runs/trace -> runs/trace.rank0). Each holds {"traceEvents": [...]}: metadata
 * events ("ph": "M") naming the process "rank R" (pid R, so the files of several ranks open side by
 * side) and one thread per track (tid = the fsdp_track), then one complete event ("ph": "X") per span
 * with "ts" and "dur" in microseconds and its step, unit, bytes and dtype in "args"; "otherData"
 * carries the rank's summary (trace_summary.h). */
#ifndef FSDP_IO_TRACE_JSON_H
#define FSDP_IO_TRACE_JSON_H

#include <stddef.h>

#include "../base/error.h"
#include "../base/trace.h"
#include "../base/trace_summary.h"

/* The file of rank `rank` for --trace `path` (the rule above); -1 when it does not fit in cap. */
int fsdp_trace_rank_path(const char *path, int rank, char *out, size_t cap);
/* Writes rank `rank`'s trace into `path` (already the rank's file) through `path`.tmp and a rename,
 * so a failed write leaves no file; -1 with err naming the file and the cause. */
int fsdp_trace_write(const char *path, int rank, const fsdp_trace *tr, const fsdp_trace_summary *sum, fsdp_err *err);

#endif
