/* The reader of metrics_timing.h. */
#include "metrics_timing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/log.h"
#include "metrics_lines.h"

typedef struct {
    int *step;
    double *ms, *wait, *opt;
    int n, cap;
} steps;

static void add(steps *s, int step, double ms, double wait, double opt) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->step = realloc(s->step, (size_t)s->cap * sizeof *s->step);
        s->ms = realloc(s->ms, (size_t)s->cap * sizeof *s->ms);
        s->wait = realloc(s->wait, (size_t)s->cap * sizeof *s->wait);
        s->opt = realloc(s->opt, (size_t)s->cap * sizeof *s->opt);
        if (!s->step || !s->ms || !s->wait || !s->opt) fsdp_fatal("out of host memory reading step times");
    }
    s->step[s->n] = step, s->ms[s->n] = ms, s->wait[s->n] = wait, s->opt[s->n] = opt;
    s->n++;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[i] over the records whose step is not the first; -1 when any is negative (absent). */
static double median(const steps *s, const double *v, int first) {
    double *x = malloc((size_t)(s->n ? s->n : 1) * sizeof *x);
    if (!x) fsdp_fatal("out of host memory reading step times");
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->step[i] == first) continue;
        if (v[i] < 0.0) {
            free(x);
            return -1.0;
        }
        x[n++] = v[i];
    }
    qsort(x, (size_t)n, sizeof *x, by_value);
    double m = n == 0 ? -1.0 : n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    free(x);
    return m;
}

static int text(const json_t *rec, const char *key, char *dst, size_t cap, int required, const char *path,
                fsdp_err *err) {
    const char *v = json_string_value(json_object_get(rec, key));
    if (!v) {
        dst[0] = 0;
        return required ? fsdp_errf(err, "%s: the summary record has no string '%s'", path, key) : 0;
    }
    snprintf(dst, cap, "%s", v);
    return 0;
}

static int integer(const json_t *rec, const char *key, int *dst, int fallback, const char *path, fsdp_err *err) {
    json_t *v = json_object_get(rec, key);
    if (!v) {
        if (fallback < 0) return fsdp_errf(err, "%s: the summary record has no '%s'", path, key);
        *dst = fallback;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
        return fsdp_errf(err, "%s: the summary's '%s' is not a positive integer", path, key);
    *dst = (int)json_integer_value(v);
    return 0;
}

static double number_or(const json_t *rec, const char *key, double fallback) {
    json_t *v = json_object_get(rec, key);
    return json_is_number(v) ? json_number_value(v) : fallback;
}

static int parse_summary(const json_t *r, const char *path, fsdp_metrics_timing *t, fsdp_err *err) {
    if (text(r, "model", t->model, sizeof t->model, 1, path, err) ||
        text(r, "strategy", t->strategy, sizeof t->strategy, 1, path, err) ||
        text(r, "model_precision", t->model_precision, sizeof t->model_precision, 1, path, err) ||
        text(r, "mixed_precision", t->mixed_precision, sizeof t->mixed_precision, 1, path, err) ||
        text(r, "attn", t->attn, sizeof t->attn, 1, path, err) ||
        text(r, "reduce_dtype", t->reduce_dtype, sizeof t->reduce_dtype, 0, path, err) ||
        text(r, "gather_dtype", t->gather_dtype, sizeof t->gather_dtype, 0, path, err) ||
        text(r, "accumulate", t->accumulate, sizeof t->accumulate, 0, path, err) ||
        text(r, "recompute", t->recompute, sizeof t->recompute, 0, path, err) ||
        text(r, "device", t->device, sizeof t->device, 0, path, err) ||
        integer(r, "mbs", &t->mbs, -1, path, err) || integer(r, "seq", &t->seq, -1, path, err) ||
        integer(r, "grad_accum", &t->grad_accum, 1, path, err) ||
        integer(r, "world_size", &t->world_size, -1, path, err) || integer(r, "nodes", &t->nodes, 1, path, err) ||
        integer(r, "ranks_per_node", &t->ranks_per_node, t->world_size, path, err))
        return -1;
    return 0;
}

typedef struct {
    steps steps;
    json_t *summary; /* the last summary record */
    int first;       /* the first step recorded: set-up, not the steady state */
} reading;

static void visit(json_t *rec, void *ctx) {
    reading *r = ctx;
    if (json_is_true(json_object_get(rec, "summary"))) {
        json_decref(r->summary);
        r->summary = json_incref(rec);
        return;
    }
    json_t *step = json_object_get(rec, "step"), *ms = json_object_get(rec, "step_ms");
    if (json_is_integer(step) && json_is_number(ms) && !json_object_get(rec, "eval_loss")) {
        int k = (int)json_integer_value(step);
        if (r->first < 0 || k < r->first) r->first = k;
        add(&r->steps, k, json_number_value(ms), number_or(rec, "comm_wait_ms", 0.0),
            number_or(rec, "optimizer_ms", -1.0));
    }
}

int fsdp_metrics_read_timing(const char *path, fsdp_metrics_timing *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    reading r = {.first = -1};
    const steps *s = &r.steps;
    int rc = fsdp_metrics_each_record(path, visit, &r, err);
    if (rc == 0 && !r.summary)
        rc = fsdp_errf(err, "%s: no summary record (the run did not finish): its step time cannot be read", path);
    else if (rc == 0 && parse_summary(r.summary, path, out, err))
        rc = -1;
    else if (rc == 0) {
        out->step_ms = median(s, s->ms, r.first);
        out->comm_wait_ms = median(s, s->wait, r.first);
        out->optimizer_ms = median(s, s->opt, r.first);
        for (int i = 0; i < s->n; i++) out->timed_steps += s->step[i] != r.first;
        if (out->timed_steps < 1 || out->step_ms <= 0.0)
            rc = fsdp_errf(err, "%s: no timed step after the first (train at least 2 steps to measure a rate)", path);
    }
    json_decref(r.summary);
    free(r.steps.step), free(r.steps.ms), free(r.steps.wait), free(r.steps.opt);
    return rc;
}
