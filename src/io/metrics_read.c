/* The --metrics reader of metrics_read.h. */
#include "metrics_read.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/log.h"
#include "metrics_lines.h"

typedef struct {
    fsdp_metrics_point *v;
    int n, cap;
    long *order; /* arrival order, so the last record of a step wins */
} series;

static void series_add(series *s, int step, double value) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        fsdp_metrics_point *v = realloc(s->v, (size_t)s->cap * sizeof *v);
        long *order = realloc(s->order, (size_t)s->cap * sizeof *order);
        if (!v || !order) fsdp_fatal("out of host memory reading a metrics file");
        s->v = v, s->order = order;
    }
    s->v[s->n].step = step;
    s->v[s->n].value = value;
    s->order[s->n] = s->n;
    s->n++;
}

typedef struct {
    fsdp_metrics_point p;
    long order;
} ordered_point;

static int by_step_then_arrival(const void *a, const void *b) {
    const ordered_point *x = a, *y = b;
    if (x->p.step != y->p.step) return x->p.step < y->p.step ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* Ascending steps, one point per step: the last one written (a resumed run repeats steps it had
 * logged after its last checkpoint). */
static void series_finish(series *s, fsdp_metrics_point **out, int *count) {
    *out = NULL, *count = 0;
    if (s->n == 0) return;
    ordered_point *tmp = fsdp_xmalloc((size_t)s->n * sizeof *tmp, "metrics points");
    for (int i = 0; i < s->n; i++) tmp[i].p = s->v[i], tmp[i].order = s->order[i];
    qsort(tmp, (size_t)s->n, sizeof *tmp, by_step_then_arrival);
    int m = 0;
    for (int i = 0; i < s->n; i++) {
        if (i + 1 < s->n && tmp[i + 1].p.step == tmp[i].p.step) continue;
        s->v[m++] = tmp[i].p;
    }
    free(tmp);
    free(s->order);
    s->order = NULL;
    *out = s->v, *count = m;
}

/* ---- the summary's fields ---- */

static int need(const json_t *rec, const char *key, const char *path, json_t **v, fsdp_err *err) {
    *v = json_object_get(rec, key);
    if (!*v) return fsdp_errf(err, "%s: the summary record has no \"%s\" (written by an older fsdp.c?)", path, key);
    return 0;
}

static int get_string(const json_t *rec, const char *key, char *dst, size_t cap, const char *path, fsdp_err *err) {
    json_t *v;
    if (need(rec, key, path, &v, err)) return -1;
    if (!json_is_string(v)) return fsdp_errf(err, "%s: summary field \"%s\" is not a string", path, key);
    if (json_string_length(v) >= cap)
        return fsdp_errf(err, "%s: summary field \"%s\" is longer than %zu bytes", path, key, cap - 1);
    snprintf(dst, cap, "%s", json_string_value(v));
    return 0;
}

static int get_int(const json_t *rec, const char *key, long long lo, long long hi, long long *dst, const char *path,
                   fsdp_err *err) {
    json_t *v;
    if (need(rec, key, path, &v, err)) return -1;
    if (!json_is_integer(v)) return fsdp_errf(err, "%s: summary field \"%s\" is not an integer", path, key);
    long long x = (long long)json_integer_value(v);
    if (x < lo || x > hi)
        return fsdp_errf(err, "%s: summary field \"%s\" = %lld is out of range [%lld, %lld]", path, key, x, lo, hi);
    *dst = x;
    return 0;
}

static int get_number(const json_t *rec, const char *key, double *dst, const char *path, fsdp_err *err) {
    json_t *v;
    if (need(rec, key, path, &v, err)) return -1;
    if (!json_is_number(v) || !(json_number_value(v) >= 0))
        return fsdp_errf(err, "%s: summary field \"%s\" is not a non-negative number", path, key);
    *dst = json_number_value(v);
    return 0;
}

/* Fields older records lack, or that may be null (a MFU without a known peak): 0 then. */
static double optional_number(const json_t *rec, const char *key) {
    json_t *v = json_object_get(rec, key);
    return json_is_number(v) && json_number_value(v) >= 0 ? json_number_value(v) : 0.0;
}

static int parse_summary(const json_t *rec, const char *path, fsdp_metrics_summary *s, fsdp_err *err) {
    memset(s, 0, sizeof *s);
    const long long BIG = 1ll << 40;
    long long mbs, seq, accum, world, nodes, rpn, steps, final_step;
    if (get_string(rec, "model", s->model, sizeof s->model, path, err) ||
        get_string(rec, "model_precision", s->model_precision, sizeof s->model_precision, path, err) ||
        get_string(rec, "mixed_precision", s->mixed_precision, sizeof s->mixed_precision, path, err) ||
        get_string(rec, "attn", s->attn, sizeof s->attn, path, err) ||
        get_string(rec, "strategy", s->strategy, sizeof s->strategy, path, err) ||
        get_string(rec, "device", s->device, sizeof s->device, path, err) ||
        get_int(rec, "mbs", 1, 1 << 30, &mbs, path, err) || get_int(rec, "seq", 1, 1 << 30, &seq, path, err) ||
        get_int(rec, "grad_accum", 1, 1 << 30, &accum, path, err) ||
        get_int(rec, "world_size", 1, 1 << 30, &world, path, err) ||
        get_int(rec, "nodes", 1, 1 << 30, &nodes, path, err) ||
        get_int(rec, "ranks_per_node", 1, 1 << 30, &rpn, path, err) ||
        get_int(rec, "steps", 0, 1 << 30, &steps, path, err) ||
        get_int(rec, "final_step", 0, 1 << 30, &final_step, path, err) ||
        get_number(rec, "tokens_per_s_per_gpu", &s->tokens_per_s_per_gpu, path, err) ||
        get_number(rec, "max_reserved_gib", &s->max_reserved_gib, path, err))
        return -1;
    s->mbs = (int)mbs, s->seq = (int)seq, s->grad_accum = (int)accum, s->world_size = (int)world;
    s->nodes = (int)nodes, s->ranks_per_node = (int)rpn, s->steps = (int)steps, s->final_step = (int)final_step;
    /* Derived when absent; checked when present, since the report divides by them. */
    s->global_batch = (long long)s->mbs * s->grad_accum * s->world_size;
    s->tokens_per_step = s->global_batch * s->seq;
    if (json_object_get(rec, "global_batch") && get_int(rec, "global_batch", 1, BIG, &s->global_batch, path, err))
        return -1;
    if (json_object_get(rec, "tokens_per_step") &&
        get_int(rec, "tokens_per_step", 1, BIG, &s->tokens_per_step, path, err))
        return -1;
    if (json_object_get(rec, "params") && get_int(rec, "params", 0, BIG * 1024, &s->params, path, err)) return -1;
    s->tflops_per_gpu = optional_number(rec, "tflops_per_gpu");
    s->mfu = optional_number(rec, "mfu");
    return 0;
}

/* ---- the file ---- */

static int integer_step(const json_t *rec, int *step) {
    json_t *v = json_object_get(rec, "step");
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30)) return 0;
    *step = (int)json_integer_value(v);
    return 1;
}

static void copy_string(const json_t *rec, const char *key, char *dst, size_t cap) {
    const char *v = json_string_value(json_object_get(rec, key));
    snprintf(dst, cap, "%s", v ? v : "");
}

static void add_evaluation(fsdp_metrics_run *run, const json_t *rec) {
    fsdp_metrics_evaluation e;
    memset(&e, 0, sizeof e);
    integer_step(rec, &e.step);
    e.loss = json_is_number(json_object_get(rec, "eval_loss")) ? json_number_value(json_object_get(rec, "eval_loss")) : NAN;
    e.ppl = json_is_number(json_object_get(rec, "eval_ppl")) ? json_number_value(json_object_get(rec, "eval_ppl")) : NAN;
    copy_string(rec, "evaluated", e.evaluated, sizeof e.evaluated);
    copy_string(rec, "data", e.data, sizeof e.data);
    fsdp_metrics_evaluation *v = realloc(run->evaluations, (size_t)(run->num_evaluations + 1) * sizeof *v);
    if (!v) fsdp_fatal("out of host memory reading a metrics file");
    run->evaluations = v;
    v[run->num_evaluations++] = e;
}

typedef struct {
    fsdp_metrics_run *run;
    series loss, eval;
    json_t *summary; /* the last summary record */
} reading;

static void visit(json_t *rec, void *ctx) {
    reading *r = ctx;
    int step;
    const char *kind = json_string_value(json_object_get(rec, "record"));
    if (kind && !strcmp(kind, "evaluation")) {
        add_evaluation(r->run, rec);
    } else if (json_is_true(json_object_get(rec, "summary"))) {
        json_decref(r->summary);
        r->summary = json_incref(rec);
        r->run->num_records++;
    } else if (integer_step(rec, &step)) {
        json_t *l = json_object_get(rec, "loss"), *e = json_object_get(rec, "eval_loss");
        if (json_is_number(l)) series_add(&r->loss, step, json_number_value(l));
        if (json_is_number(e)) series_add(&r->eval, step, json_number_value(e));
        r->run->num_records++;
    }
}

int fsdp_metrics_read(const char *path, fsdp_metrics_run *run, fsdp_err *err) {
    memset(run, 0, sizeof *run);
    reading r = {.run = run};
    int rc = fsdp_metrics_each_record(path, visit, &r, err);
    series_finish(&r.loss, &run->loss, &run->num_loss);
    series_finish(&r.eval, &run->eval, &run->num_eval);
    if (rc == 0 && run->num_records == 0 && run->num_evaluations == 0)
        rc = fsdp_errf(err, "%s: no fsdp.c metrics record in it", path);
    else if (rc == 0 && r.summary) {
        rc = parse_summary(r.summary, path, &run->summary, err);
        run->has_summary = rc == 0;
    }
    json_decref(r.summary);
    if (rc) fsdp_metrics_run_free(run);
    return rc;
}

void fsdp_metrics_run_free(fsdp_metrics_run *run) {
    free(run->loss);
    free(run->eval);
    free(run->evaluations);
    memset(run, 0, sizeof *run);
}
