#include "schedule.h"

#include <math.h>
#include <string.h>

#include "../base/log.h"
#include "../io/jsonio.h"

double fsdp_schedule_lr(const fsdp_schedule *s, int step) {
    if (s->warmup > 0 && step <= s->warmup) return s->lr * step / s->warmup;
    int span = s->total - s->warmup;
    if (span <= 0) return s->lr;
    /* The first step after warm-up runs at the peak rate, as transformers' cosine schedule does. */
    double progress = (double)(step - s->warmup - 1) / span;
    if (progress > 1.0) progress = 1.0;
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
}

json_t *fsdp_schedule_json(const fsdp_schedule *s, int step) {
    return json_pack("{s:s, s:f, s:f, s:i, s:i, s:f}", "type", "warmup_cosine", "lr", s->lr, "min_lr", s->min_lr,
                     "warmup", s->warmup, "total_steps", s->total, "last_lr",
                     step > 0 ? fsdp_schedule_lr(s, step) : 0.0);
}

static fsdp_schedule parse_record(const json_t *r) {
    fsdp_schedule s = {json_number_value(json_object_get(r, "lr")), json_number_value(json_object_get(r, "min_lr")),
                       (int)json_integer_value(json_object_get(r, "warmup")),
                       (int)json_integer_value(json_object_get(r, "total_steps"))};
    return s;
}

static int same_rate(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)); }

int fsdp_schedule_check_resume(const char *json_text, const fsdp_schedule *now, int64_t step, int allow,
                               const char *origin, fsdp_err *err) {
    if (step <= 0 || step >= now->total || !json_text) return 0; /* nothing applied yet, or nothing left to train */
    json_t *r = fsdp_json_load_text(json_text, strlen(json_text), origin, err);
    if (!r) return -1;
    fsdp_schedule was = parse_record(r);
    json_decref(r);
    char what[200];
    if (was.total != now->total)
        snprintf(what, sizeof what, "--steps %d, and the checkpoint's schedule decays over %d steps", now->total,
                 was.total);
    else if (!same_rate(was.lr, now->lr))
        snprintf(what, sizeof what, "--lr %g, and the checkpoint's schedule peaks at %g", now->lr, was.lr);
    else if (!same_rate(was.min_lr, now->min_lr))
        snprintf(what, sizeof what, "--min-lr %g, and the checkpoint's schedule decays to %g", now->min_lr, was.min_lr);
    else if (was.warmup != now->warmup)
        snprintf(what, sizeof what, "--warmup %d, and the checkpoint's schedule warms up over %d steps", now->warmup,
                 was.warmup);
    else
        return 0;
    int s = (int)step;
    double before = fsdp_schedule_lr(&was, s), after = fsdp_schedule_lr(now, s + 1), kept = fsdp_schedule_lr(&was, s + 1);
    /* Only a jump is refused: a schedule that goes on from the rate the checkpoint's would give next
     * (a constant rate, or a longer warm-up not yet finished) changes nothing at the seam. */
    if (fabs(after - kept) <= 1e-6 * fmax(fabs(after), fabs(kept))) return 0;
    if (allow) {
        fsdp_warn("--allow-schedule-change: %s: %s; the learning rate goes from %.3g at step %d to %.3g at step %d "
                  "(%.3g under the checkpoint's schedule)",
                  origin, what, before, s, after, s + 1, kept);
        return 0;
    }
    return fsdp_usagef(err,
                       "--resume %s: %s: the learning rate would jump from %.3g at step %d to %.3g at step %d (%.3g "
                       "under the checkpoint's schedule); pass --allow-schedule-change to re-span the schedule from "
                       "here, or the checkpoint's value",
                       origin, what, before, s, after, s + 1, kept);
}

int fsdp_schedule_check_record(const char *json_text, int64_t step, const char *origin, fsdp_err *err) {
    json_t *r = fsdp_json_load_text(json_text ? json_text : "", json_text ? strlen(json_text) : 0, origin, err);
    if (!r) return -1;
    fsdp_schedule s = {json_number_value(json_object_get(r, "lr")), json_number_value(json_object_get(r, "min_lr")),
                       (int)json_integer_value(json_object_get(r, "warmup")),
                       (int)json_integer_value(json_object_get(r, "total_steps"))};
    double last = json_number_value(json_object_get(r, "last_lr"));
    json_decref(r);
    double want = step > 0 ? fsdp_schedule_lr(&s, (int)step) : 0.0;
    if (fabs(last - want) > 1e-12 * fmax(fabs(last), fabs(want)))
        return fsdp_errf(err,
                         "checkpoint %s: attribute 'schedule' says last_lr %.17g, but its schedule gives %.17g at step "
                         "%lld: the attributes disagree",
                         origin, last, want, (long long)step);
    return 0;
}
