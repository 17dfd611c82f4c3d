/* The maths of trace_summary.h: sums per track, and unions and intersections of intervals. */
#include "trace_summary.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef struct {
    double a, b;
} interval;

static int by_start(const void *x, const void *y) {
    double a = ((const interval *)x)->a, b = ((const interval *)y)->a;
    return (a > b) - (a < b);
}

/* Sorts and merges v in place into disjoint intervals; returns how many. */
static size_t merge(interval *v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, by_start);
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        if (v[i].a <= v[k].b) {
            if (v[i].b > v[k].b) v[k].b = v[i].b;
        } else {
            v[++k] = v[i];
        }
    }
    return k + 1;
}

static double length(const interval *v, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += v[i].b - v[i].a;
    return sum;
}

/* The length of the intersection of two sets of disjoint sorted intervals. */
static double intersection(const interval *x, size_t nx, const interval *y, size_t ny) {
    double sum = 0.0;
    size_t i = 0, j = 0;
    while (i < nx && j < ny) {
        double a = x[i].a > y[j].a ? x[i].a : y[j].a, b = x[i].b < y[j].b ? x[i].b : y[j].b;
        if (b > a) sum += b - a;
        if (x[i].b < y[j].b)
            i++;
        else
            j++;
    }
    return sum;
}

static int int_less(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

void fsdp_trace_summarize(const fsdp_span *spans, size_t count, fsdp_trace_summary *out) {
    memset(out, 0, sizeof *out);
    if (count == 0) return;
    interval *comm = fsdp_xmalloc(count * sizeof *comm, "trace intervals");
    interval *compute = fsdp_xmalloc(count * sizeof *compute, "trace intervals");
    int *steps = fsdp_xmalloc(count * sizeof *steps, "trace steps");
    size_t nc = 0, nk = 0;
    double busy_us[FSDP_TRACKS] = {0}, bytes = 0.0;
    for (size_t i = 0; i < count; i++) {
        const fsdp_span *s = &spans[i];
        interval v = {s->t0_us, s->t1_us};
        busy_us[s->track] += v.b - v.a;
        if (s->bytes > 0) bytes += s->bytes;
        if (s->track == FSDP_TRACK_GATHER || s->track == FSDP_TRACK_REDUCE) comm[nc++] = v;
        if (s->track == FSDP_TRACK_COMPUTE) compute[nk++] = v;
        steps[i] = s->step;
    }
    qsort(steps, count, sizeof *steps, int_less);
    int distinct = 1;
    for (size_t i = 1; i < count; i++) distinct += steps[i] != steps[i - 1];
    nc = merge(comm, nc);
    nk = merge(compute, nk);
    double comm_us = length(comm, nc), hidden_us = intersection(comm, nc, compute, nk);
    double per = 1e-3 / distinct; /* microseconds to milliseconds per step */
    out->steps = distinct;
    for (int k = 0; k < FSDP_TRACKS; k++) out->busy_ms[k] = busy_us[k] * per;
    out->comm_ms = comm_us * per;
    out->hidden_ms = hidden_us * per;
    out->exposed_ms = (comm_us - hidden_us) * per;
    out->overlap = comm_us > 0.0 ? hidden_us / comm_us : 0.0;
    out->bytes = bytes / distinct;
    free(comm);
    free(compute);
    free(steps);
}
