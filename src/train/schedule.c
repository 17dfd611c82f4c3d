#include "schedule.h"

#include <math.h>

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
