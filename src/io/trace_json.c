/* The trace file writer of trace_json.h, through Jansson. */
#include "trace_json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

int fsdp_trace_rank_path(const char *path, int rank, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    if (!dot || dot == base) dot = path + strlen(path); /* no extension (or a hidden file's name) */
    int n = snprintf(out, cap, "%.*s.rank%d%s", (int)(dot - path), path, rank, dot);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static void must(int failed) {
    if (failed) fsdp_fatal("out of host memory building the trace");
}

static json_t *metadata(int rank, int tid, const char *what, const char *key, json_t *value) {
    json_t *m = json_pack("{s:s, s:i, s:s, s:{s:o}}", "ph", "M", "pid", rank, "name", what, "args", key, value);
    must(!m);
    if (tid >= 0) must(json_object_set_new(m, "tid", json_integer(tid)));
    return m;
}

static json_t *summary_json(const fsdp_trace_summary *s, int first, int last) {
    json_t *busy = json_object();
    must(!busy);
    for (int k = 0; k < FSDP_TRACKS; k++)
        must(json_object_set_new(busy, fsdp_track_name((fsdp_track)k), fsdp_json_number(s->busy_ms[k])));
    json_t *v = json_pack("{s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "first_step", first, "last_step", last,
                          "steps", s->steps, "busy_ms", busy, "comm_ms", fsdp_json_number(s->comm_ms), "hidden_ms",
                          fsdp_json_number(s->hidden_ms), "exposed_ms", fsdp_json_number(s->exposed_ms), "overlap",
                          fsdp_json_number(s->overlap), "comm_wait_ms", fsdp_json_number(s->busy_ms[FSDP_TRACK_WAIT]),
                          "bytes", fsdp_json_number(s->bytes));
    must(!v);
    return v;
}

static json_t *trace_json(int rank, const fsdp_trace *tr, const fsdp_trace_summary *sum) {
    static const char *const threads[FSDP_TRACKS] = {"host", "compute stream", "gather stream", "reduce stream",
                                                      "compute waits for communication"};
    json_t *events = json_array();
    must(!events);
    char process[32];
    snprintf(process, sizeof process, "rank %d", rank);
    must(json_array_append_new(events, metadata(rank, -1, "process_name", "name", json_string(process))));
    must(json_array_append_new(events, metadata(rank, -1, "process_sort_index", "sort_index", json_integer(rank))));
    for (int k = 0; k < FSDP_TRACKS; k++) {
        must(json_array_append_new(events, metadata(rank, k, "thread_name", "name", json_string(threads[k]))));
        must(json_array_append_new(events, metadata(rank, k, "thread_sort_index", "sort_index", json_integer(k))));
    }
    size_t n;
    const fsdp_span *spans = fsdp_trace_spans(tr, &n);
    for (size_t i = 0; i < n; i++) {
        const fsdp_span *s = &spans[i];
        json_t *args = json_pack("{s:i}", "step", s->step);
        must(!args);
        if (s->unit >= 0) must(json_object_set_new(args, "unit", json_integer(s->unit)));
        if (s->bytes >= 0) must(json_object_set_new(args, "bytes", json_integer((json_int_t)(s->bytes + 0.5))));
        if (s->dtype[0]) must(json_object_set_new(args, "dtype", json_string(s->dtype)));
        /* A span name is ASCII made by fsdp.c; json_string refuses only invalid UTF-8. */
        json_t *ev = json_pack("{s:s, s:s, s:s, s:i, s:i, s:o, s:o, s:o}", "ph", "X", "name", s->name, "cat",
                               fsdp_track_name(s->track), "pid", rank, "tid", (int)s->track, "ts",
                               fsdp_json_number(s->t0_us), "dur", fsdp_json_number(s->t1_us - s->t0_us), "args", args);
        must(!ev || json_array_append_new(events, ev));
    }
    /* No "displayTimeUnit": Perfetto's importer reads it as the unit of "ts", which stays microseconds. */
    json_t *root = json_pack("{s:o, s:{s:i, s:o}}", "traceEvents", events, "otherData", "rank", rank, "summary",
                             summary_json(sum, fsdp_trace_first(tr), fsdp_trace_last(tr)));
    must(!root);
    return root;
}

int fsdp_trace_write(const char *path, int rank, const fsdp_trace *tr, const fsdp_trace_summary *sum, fsdp_err *err) {
    json_t *root = trace_json(rank, tr, sum);
    /* Microsecond times of a long run need about 12 significant digits to keep sub-microsecond steps. */
    char *text = fsdp_json_text(root, 0, 15);
    json_decref(root);
    if (!text) fsdp_fatal("out of host memory writing the trace %s", path);
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(text);
        return fsdp_errf(err, "--trace %s: path too long (rank %d)", path, rank);
    }
    FILE *fp = fopen(tmp, "w");
    if (!fp) {
        free(text);
        return fsdp_errf(err, "--trace: cannot create %s: %s (rank %d)", tmp, strerror(errno), rank);
    }
    errno = 0;
    int bad = fputs(text, fp) == EOF || fputc('\n', fp) == EOF;
    bad |= fclose(fp) != 0;
    free(text);
    if (bad) {
        int code = errno;
        remove(tmp);
        return fsdp_errf(err, "--trace: cannot write %s: %s (rank %d)", tmp, code ? strerror(code) : "I/O error", rank);
    }
    if (rename(tmp, path) != 0) {
        int code = errno;
        remove(tmp);
        return fsdp_errf(err, "--trace: cannot rename %s to %s: %s (rank %d)", tmp, path, strerror(code), rank);
    }
    return 0;
}
