#include "schedule.h"

#include <math.h>
#include <string.h>

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
