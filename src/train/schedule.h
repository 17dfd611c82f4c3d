/* The learning-rate schedule: linear warm-up over `warmup` steps (step s <= warmup runs at
 * lr * s / warmup), then cosine decay from lr at step warmup+1 towards min_lr, which step total+1
 * would reach. Steps are 1-based: lr(1) is the rate of the first update. */
#ifndef FSDP_TRAIN_SCHEDULE_H
#define FSDP_TRAIN_SCHEDULE_H

#include <jansson.h>
#include <stdint.h>

#include "../base/error.h"

typedef struct {
    double lr, min_lr;
    int warmup, total;
} fsdp_schedule;

double fsdp_schedule_lr(const fsdp_schedule *s, int step);
/* The schedule after `step` steps as a JSON object ({"type": "warmup_cosine", ...}), for checkpoints. */
json_t *fsdp_schedule_json(const fsdp_schedule *s, int step);

/* Checks a checkpoint's schedule record (fsdp_schedule_json text) against the step it was saved at:
 * last_lr must be the rate its own schedule gives at `step`. -1 with a message naming `origin`. */
int fsdp_schedule_check_record(const char *json_text, int64_t step, const char *origin, fsdp_err *err);

#endif
