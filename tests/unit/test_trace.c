/* The trace's arithmetic and naming against answers worked out by hand: busy time per track, the union
 * of communication, the part of it hidden under compute, per step (src/base/trace_summary.h); the
 * recording window and host phases (src/base/trace.h); the per-rank file names (src/io/trace_json.h). */
#include <math.h>
#include <string.h>

#include "base/trace.h"
#include "base/trace_summary.h"
#include "check.h"
#include "io/trace_json.h"

static fsdp_span span(fsdp_track track, int step, double t0, double t1, double bytes) {
    fsdp_span s;
    memset(&s, 0, sizeof s);
    s.track = track, s.step = step, s.unit = -1, s.t0_us = t0, s.t1_us = t1, s.bytes = bytes;
    return s;
}

static void test_summary(void) {
    /* Two steps. Compute: [0,100] [150,250] and [1000,1100]. Communication: gather [50,120] and
     * [140,160], reduce [110,200] (overlapping the gather: the union counts it once) and [1100,1300].
     * Union of communication: [50,200] (150) + [1100,1300] (200) = 350 us. Under compute:
     * [50,100] (50) + [150,200] (50) + nothing of [1100,1300] = 100 us. Waits: 30 us. */
    fsdp_span v[] = {
        span(FSDP_TRACK_COMPUTE, 1, 0, 100, -1),   span(FSDP_TRACK_COMPUTE, 1, 150, 250, -1),
        span(FSDP_TRACK_GATHER, 1, 50, 120, 1000), span(FSDP_TRACK_GATHER, 1, 140, 160, 500),
        span(FSDP_TRACK_REDUCE, 1, 110, 200, 300), span(FSDP_TRACK_WAIT, 1, 100, 120, -1),
        span(FSDP_TRACK_COMPUTE, 2, 1000, 1100, -1), span(FSDP_TRACK_REDUCE, 2, 1100, 1300, 200),
        span(FSDP_TRACK_WAIT, 2, 1100, 1110, -1),  span(FSDP_TRACK_HOST, 2, 900, 1000, -1),
    };
    fsdp_trace_summary s;
    fsdp_trace_summarize(v, sizeof v / sizeof v[0], &s);
    check_that(s.steps == 2, "two steps (%d)", s.steps);
    check_close("busy compute per step, ms", fabs(s.busy_ms[FSDP_TRACK_COMPUTE] - 0.150), 1e-12);
    check_close("busy gather per step, ms", fabs(s.busy_ms[FSDP_TRACK_GATHER] - 0.045), 1e-12);
    check_close("busy reduce per step, ms", fabs(s.busy_ms[FSDP_TRACK_REDUCE] - 0.145), 1e-12);
    check_close("busy wait per step, ms", fabs(s.busy_ms[FSDP_TRACK_WAIT] - 0.015), 1e-12);
    check_close("busy host per step, ms", fabs(s.busy_ms[FSDP_TRACK_HOST] - 0.050), 1e-12);
    check_close("communication per step, ms", fabs(s.comm_ms - 0.175), 1e-12);
    check_close("hidden per step, ms", fabs(s.hidden_ms - 0.050), 1e-12);
    check_close("exposed per step, ms", fabs(s.exposed_ms - 0.125), 1e-12);
    check_close("overlap", fabs(s.overlap - 100.0 / 350.0), 1e-12);
    check_close("bytes per step", fabs(s.bytes - 1000.0), 1e-9);

    fsdp_trace_summarize(v, 0, &s);
    check_that(s.steps == 0 && s.comm_ms == 0.0 && s.overlap == 0.0, "no spans: all zero");
    fsdp_span compute_only[] = {span(FSDP_TRACK_COMPUTE, 5, 10, 20, -1)};
    fsdp_trace_summarize(compute_only, 1, &s);
    check_that(s.overlap == 0.0 && s.comm_ms == 0.0 && fabs(s.busy_ms[FSDP_TRACK_COMPUTE] - 0.01) < 1e-12,
               "no communication: overlap 0");
}

static void test_window(void) {
    fsdp_trace *tr = fsdp_trace_create(3, 4);
    size_t n;
    for (int step = 1; step <= 6; step++) {
        fsdp_trace_set_step(tr, step);
        check_count(fsdp_trace_active(tr) == (step >= 3 && step <= 4));
        fsdp_trace_host_end(tr, fsdp_trace_host_begin(tr), "data");
        fsdp_span s = span(FSDP_TRACK_COMPUTE, step, 5, 1, -1); /* reversed: clamped to length 0 */
        if (fsdp_trace_active(tr)) fsdp_trace_add(tr, &s);
    }
    const fsdp_span *v = fsdp_trace_spans(tr, &n);
    check_that(n == 4, "host phases and spans only inside the window (%zu)", n);
    int ok = n == 4;
    for (size_t i = 0; ok && i < n; i++) ok = v[i].step >= 3 && v[i].step <= 4 && v[i].t1_us >= v[i].t0_us;
    check_that(ok, "every span in steps 3-4, none ending before it begins");
    check_that(n >= 1 && !strcmp(v[0].name, "data") && v[0].track == FSDP_TRACK_HOST, "a host phase is named");
    fsdp_trace_destroy(tr);
    check_that(!fsdp_trace_active(NULL) && fsdp_trace_host_begin(NULL) < 0, "a NULL recorder records nothing");
}

static void test_paths(void) {
    static const char *const cases[][2] = {
        {"trace.json", "trace.rank3.json"},       {"runs/a.b/trace", "runs/a.b/trace.rank3"},
        {"/tmp/x/t.tar.json", "/tmp/x/t.tar.rank3.json"}, {".hidden", ".hidden.rank3"},
        {"dir/.trace", "dir/.trace.rank3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[256];
        int rc = fsdp_trace_rank_path(cases[i][0], 3, out, sizeof out);
        check_that(rc == 0 && !strcmp(out, cases[i][1]), "%s -> %s (%s)", cases[i][0], cases[i][1], out);
    }
    char small[8];
    check_that(fsdp_trace_rank_path("trace.json", 0, small, sizeof small) == -1, "a name that does not fit: -1");
}

int main(void) {
    test_summary();
    test_window();
    test_paths();
    return check_summary("test_trace");
}
