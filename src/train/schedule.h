/* The learning-rate schedule: linear warm-up over `warmup` steps (step s <= warmup runs at
 * lr * s / warmup), then cosine decay from lr at step warmup+1 towards min_lr, which step total+1
 * would reach. Steps are 1-based: lr(1) is the rate of the first update. */
#ifndef FSDP_TRAIN_SCHEDULE_H
#define FSDP_TRAIN_SCHEDULE_H

#include <jansson.h>

typedef struct {
    double lr, min_lr;
    int warmup, total;
} fsdp_schedule;

double fsdp_schedule_lr(const fsdp_schedule *s, int step);
/* The schedule after `step` steps as a JSON object ({"type": "warmup_cosine", ...}), for checkpoints. */
json_t *fsdp_schedule_json(const fsdp_schedule *s, int step);

#endif
