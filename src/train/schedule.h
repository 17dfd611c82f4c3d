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

/* --resume under this run's schedule `now` from a checkpoint saved at `step` with the record
 * `json_text`: a schedule that differs (total steps, lr, min_lr, warm-up) would make the rate jump at
 * step + 1 (transformers and torchtitan rebuild the scheduler from the new total and so re-span the
 * cosine silently). Where the rate of step + 1 differs from the one the checkpoint's schedule gives
 * (by more than 1e-6 relative), refused in one line naming --steps (or the flag that differs), the checkpoint's
 * value and --allow-schedule-change; with `allow`, one line says from which rate to which it jumps.
 * A checkpoint of step 0 (the initial weights) has applied no rate: any schedule may start from it. */
int fsdp_schedule_check_resume(const char *json_text, const fsdp_schedule *now, int64_t step, int allow,
                               const char *origin, fsdp_err *err);

#endif
