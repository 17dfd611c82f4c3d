/* --trace (trace_run.h). */
#include "trace_run.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../backend/stream_marks.h"
#include "../base/agree.h"
#include "../base/files.h"
#include "../base/log.h"
#include "../base/output_paths.h"
#include "../base/trace_summary.h"
#include "../base/watchdog.h"
#include "../io/jsonio.h"
#include "../io/trace_json.h"

struct fsdp_trace_run {
    fsdp_trace *tr;
    fsdp_stream_marks *marks;
    char **unit_names;
    int num_units;
    char path[4200];    /* this rank's file */
    int written;
    fsdp_trace_summary mean; /* over the ranks, once written */
};

int fsdp_trace_parse_steps(const char *text, int *first, int *last, fsdp_err *err) {
    char *end = NULL;
    errno = 0;
    long a = strtol(text, &end, 10), b = -1;
    if (!errno && end != text && *end == ':') {
        const char *rest = end + 1;
        b = strtol(rest, &end, 10);
        if (errno || end == rest || *end) b = -1;
    }
    if (b < 0 || a < 1 || b < a || b > INT_MAX)
        return fsdp_usagef(err, "train: --trace-steps '%s' is not A:B with 1 <= A <= B (the steps to record, e.g. 3:5)",
                           text);
    *first = (int)a, *last = (int)b;
    return 0;
}

/* The window, or a usage error when the given one is outside the run. */
static int window(const fsdp_trainer *t, int *first, int *last, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    int start = t->step; /* steps done before this run (a resume) */
    if (o->trace_first > 0) {
        if (o->trace_last > o->steps || o->trace_first <= start) {
            char resumed[64] = "";
            if (start > 0) snprintf(resumed, sizeof resumed, " (it resumes after step %d)", start);
            return fsdp_usagef(err, "--trace-steps %d:%d is outside this run's steps %d..%d%s", o->trace_first,
                               o->trace_last, start + 1, o->steps, resumed);
        }
        *first = o->trace_first, *last = o->trace_last;
        return 0;
    }
    /* Three steps after two of warm-up (allocation, GEMM selection), or the last three there are. */
    *first = start + 3, *last = start + 5;
    if (*last > o->steps) *last = o->steps;
    if (*first > *last) *first = *last - 2 > start ? *last - 2 : start + 1;
    return 0;
}

/* This rank's file can be written: its folder exists and is writable, it is not a directory or
 * another special file, and it is not a file the run reads or --metrics. */
static int check_path(const fsdp_trainer *t, const char *path, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0)
        return fsdp_usagef(err, "--trace %s: the folder %s: %s (rank %d)", o->trace, dir, strerror(errno), fsdp_rank());
    if (!S_ISDIR(st.st_mode))
        return fsdp_usagef(err, "--trace %s: %s is %s, not a folder (rank %d)", o->trace, dir,
                           fsdp_file_type_name(st.st_mode), fsdp_rank());
    if (access(dir, W_OK | X_OK) != 0)
        return fsdp_usagef(err, "--trace %s: cannot write in the folder %s: %s (rank %d)", o->trace, dir,
                           strerror(errno), fsdp_rank());
    if (fsdp_regular_or_absent(path, "--trace", err) < 0) return -1;
    const char *data = o->data && strcmp(o->data, "synthetic") ? o->data : NULL;
    const char *resume = o->resume && strcmp(o->resume, "auto") ? o->resume : NULL;
    fsdp_io_path inputs[] = {FSDP_IO_FILE("--data", data), FSDP_IO_FILE("--eval-data", o->eval_data),
                             FSDP_IO_FILE("--resume", resume), FSDP_IO_FILE("--metrics", o->metrics),
                             FSDP_IO_FILE("--init-from", o->init_from)};
    fsdp_io_path outputs[] = {FSDP_IO_FILE("--trace", path)};
    return fsdp_outputs_apart(outputs, 1, inputs, (int)(sizeof inputs / sizeof inputs[0]), err);
}

static char *unit_name(const fsdp_layout *l, int u) {
    char buf[16];
    if (u == fsdp_unit_embed(l))
        snprintf(buf, sizeof buf, "embed");
    else if (u == fsdp_unit_head(l))
        snprintf(buf, sizeof buf, "head");
    else
        snprintf(buf, sizeof buf, "B%d", u - fsdp_unit_block(l, 0));
    char *s = fsdp_xmalloc(strlen(buf) + 1, "a unit name");
    memcpy(s, buf, strlen(buf) + 1);
    return s;
}

/* This rank's file, checked; -1 with a usage error. */
static int rank_path(const fsdp_trainer *t, char *path, size_t cap, fsdp_err *err) {
    if (fsdp_trace_rank_path(t->opt.trace, fsdp_rank(), path, cap))
        return fsdp_usagef(err, "--trace %s: path too long", t->opt.trace);
    return check_path(t, path, err);
}

int fsdp_trace_check_paths(fsdp_trainer *t, fsdp_err *err) {
    char path[4200];
    if (!t->opt.trace) return 0; /* the same options on every rank */
    rank_path(t, path, sizeof path, err);
    return fsdp_agree(t->world, err);
}

int fsdp_trace_run_open(fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    if (!o->trace) return 0;
    int first = 0, last = 0;
    char path[4200];
    if (window(t, &first, &last, err) == 0) rank_path(t, path, sizeof path, err);
    if (fsdp_agree(t->world, err)) return -1;
    struct fsdp_trace_run *r = fsdp_xcalloc(1, sizeof *r, "the trace");
    snprintf(r->path, sizeof r->path, "%s", path);
    r->num_units = t->layout.num_units;
    r->unit_names = fsdp_xcalloc((size_t)r->num_units, sizeof *r->unit_names, "unit names");
    for (int u = 0; u < r->num_units; u++) r->unit_names[u] = unit_name(&t->layout, u);
    /* One origin for every rank's clock (to the barrier's skew), so their files line up. */
    FSDP_CHECK_MPI(MPI_Barrier(t->world));
    r->tr = fsdp_trace_create(first, last);
    fsdp_trace_set_step(r->tr, t->step + 1);
    r->marks = fsdp_marks_create(t->be, r->tr);
    fsdp_engine_set_trace(t->eng, r->marks, (const char *const *)r->unit_names);
    t->trace = r;
    return 0;
}

void fsdp_trace_run_close(fsdp_trainer *t) {
    struct fsdp_trace_run *r = t->trace;
    if (!r) return;
    if (t->eng) fsdp_engine_set_trace(t->eng, NULL, NULL);
    fsdp_marks_destroy(r->marks);
    fsdp_trace_destroy(r->tr);
    for (int u = 0; u < r->num_units; u++) free(r->unit_names[u]);
    free(r->unit_names);
    free(r);
    t->trace = NULL;
}

fsdp_trace *fsdp_trace_run_recorder(const fsdp_trainer *t) { return t->trace ? t->trace->tr : NULL; }

int fsdp_trace_mark(fsdp_trainer *t) { return t->trace ? fsdp_marks_record(t->trace->marks, t->be->compute) : -1; }

void fsdp_trace_compute(fsdp_trainer *t, int begin, const char *what, int unit) {
    struct fsdp_trace_run *r = t->trace;
    if (!r || begin < 0) return;
    char name[48];
    if (what && unit >= 0)
        snprintf(name, sizeof name, "%s %s", what, r->unit_names[unit]);
    else
        snprintf(name, sizeof name, "%s", what ? what : r->unit_names[unit]);
    int end = fsdp_marks_record(r->marks, t->be->compute);
    fsdp_marks_span(r->marks, FSDP_TRACK_COMPUTE, begin, end, name, unit, -1.0, NULL);
}

void fsdp_trace_step_end(fsdp_trainer *t) {
    if (t->trace) fsdp_marks_step_end(t->trace->marks);
}

/* Flushes the marks, writes this rank's file, takes the ranks' mean of the summaries and logs it. */
static int write_files(fsdp_trainer *t, fsdp_err *err) {
    struct fsdp_trace_run *r = t->trace;
    r->written = 1;
    fsdp_marks_flush(r->marks);
    size_t n;
    const fsdp_span *spans = fsdp_trace_spans(r->tr, &n);
    fsdp_trace_summary mine;
    fsdp_trace_summarize(spans, n, &mine);
    fsdp_trace_write(r->path, fsdp_rank(), r->tr, &mine, err);
    if (fsdp_agree(t->world, err)) return -1;
    /* The mean over the ranks of every figure. */
    double v[FSDP_TRACKS + 6];
    for (int k = 0; k < FSDP_TRACKS; k++) v[k] = mine.busy_ms[k];
    v[FSDP_TRACKS] = mine.comm_ms, v[FSDP_TRACKS + 1] = mine.hidden_ms, v[FSDP_TRACKS + 2] = mine.exposed_ms;
    v[FSDP_TRACKS + 3] = mine.overlap, v[FSDP_TRACKS + 4] = mine.bytes, v[FSDP_TRACKS + 5] = mine.steps;
    fsdp_mpi_allreduce(v, FSDP_TRACKS + 6, MPI_DOUBLE, MPI_SUM, t->world, "the trace summaries");
    const double *sum = v;
    int world = t->topo.world;
    fsdp_trace_summary *m = &r->mean;
    for (int k = 0; k < FSDP_TRACKS; k++) m->busy_ms[k] = sum[k] / world;
    m->comm_ms = sum[FSDP_TRACKS] / world, m->hidden_ms = sum[FSDP_TRACKS + 1] / world;
    m->exposed_ms = sum[FSDP_TRACKS + 2] / world, m->overlap = sum[FSDP_TRACKS + 3] / world;
    m->bytes = sum[FSDP_TRACKS + 4] / world, m->steps = (int)(sum[FSDP_TRACKS + 5] / world + 0.5);
    char pattern[4200];
    fsdp_trace_rank_path(t->opt.trace, 0, pattern, sizeof pattern);
    fsdp_log("trace: steps %d-%d of every rank in %s (rank 0's; open in ui.perfetto.dev) | per step, mean of %d "
             "ranks: busy compute %.1f ms, gather %.1f ms, reduce %.1f ms | communication %.1f ms, %.0f%% hidden under "
             "compute, %.1f ms exposed | compute waited %.1f ms for communication\n",
             fsdp_trace_first(r->tr), fsdp_trace_last(r->tr), pattern, world, m->busy_ms[FSDP_TRACK_COMPUTE],
             m->busy_ms[FSDP_TRACK_GATHER], m->busy_ms[FSDP_TRACK_REDUCE], m->comm_ms, 100.0 * m->overlap,
             m->exposed_ms, m->busy_ms[FSDP_TRACK_WAIT]);
    return 0;
}

int fsdp_trace_after_step(fsdp_trainer *t, fsdp_err *err) {
    struct fsdp_trace_run *r = t->trace;
    if (!r || r->written) return 0;
    fsdp_trace_set_step(r->tr, t->step + 1);
    /* The window's last step was resolved at the end of the step after it. */
    if (t->step <= fsdp_trace_last(r->tr)) return 0;
    return write_files(t, err);
}

int fsdp_trace_run_finish(fsdp_trainer *t, fsdp_err *err) {
    struct fsdp_trace_run *r = t->trace;
    if (!r || r->written) return 0;
    return write_files(t, err);
}

json_t *fsdp_trace_run_json(const fsdp_trainer *t) {
    const struct fsdp_trace_run *r = t->trace;
    if (!r || !r->written) return NULL;
    const fsdp_trace_summary *m = &r->mean;
    json_t *busy = json_object();
    if (!busy) return NULL;
    for (int k = 0; k < FSDP_TRACKS; k++)
        json_object_set_new(busy, fsdp_track_name((fsdp_track)k), fsdp_json_number(m->busy_ms[k]));
    return json_pack("{s:s, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "file", t->opt.trace, "first_step",
                     fsdp_trace_first(r->tr), "last_step", fsdp_trace_last(r->tr), "steps", m->steps, "busy_ms", busy,
                     "comm_ms", fsdp_json_number(m->comm_ms), "hidden_ms", fsdp_json_number(m->hidden_ms),
                     "exposed_ms", fsdp_json_number(m->exposed_ms), "overlap", fsdp_json_number(m->overlap),
                     "comm_wait_ms", fsdp_json_number(m->busy_ms[FSDP_TRACK_WAIT]), "bytes",
                     fsdp_json_number(m->bytes));
}
