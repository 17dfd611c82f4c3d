/* The streams of a step as a fluid simulation (timeline.h): between two events every running task
 * progresses at a constant rate, so the next event is the earliest end among the running tasks. */
#include "timeline.h"

#include <stdlib.h>
#include <string.h>

#include "../base/error.h"

int fsdp_timeline_add(fsdp_timeline *t, int stream, double ms) {
    FSDP_GROW(t->tasks, t->n, t->cap, 256, "the step's timeline");
    fsdp_tl_task *k = &t->tasks[t->n];
    memset(k, 0, sizeof *k);
    k->stream = stream;
    k->ms = ms > 0.0 ? ms : 0.0;
    k->start = k->end = -1.0;
    return t->n++;
}

void fsdp_timeline_after(fsdp_timeline *t, int task, int on) {
    if (on < 0) return;
    fsdp_tl_task *k = &t->tasks[task];
    if (k->ndeps == FSDP_TL_MAX_DEPS) fsdp_fatal("internal error: timeline task %d has too many dependencies", task);
    k->deps[k->ndeps++] = on;
}

static int ready(const fsdp_timeline *t, const fsdp_tl_task *k) {
    for (int d = 0; d < k->ndeps; d++)
        if (t->tasks[k->deps[d]].end < 0.0) return 0;
    return 1;
}

double fsdp_timeline_run(fsdp_timeline *t, const double interference[FSDP_TL_STREAMS]) {
    int next[FSDP_TL_STREAMS] = {0}, running[FSDP_TL_STREAMS];
    double left[FSDP_TL_STREAMS] = {0}, now = 0.0;
    for (int s = 0; s < FSDP_TL_STREAMS; s++) running[s] = -1;
    for (int i = 0; i < t->n; i++) t->tasks[i].start = t->tasks[i].end = -1.0; /* a timeline may run again */
    for (;;) {
        /* Start what can start: the next task of every idle stream whose dependencies have ended. */
        int busy = 0, progress = 1;
        while (progress) {
            progress = 0;
            for (int s = 0; s < FSDP_TL_STREAMS; s++) {
                if (running[s] >= 0) continue;
                while (next[s] < t->n && t->tasks[next[s]].stream != s) next[s]++;
                if (next[s] >= t->n || !ready(t, &t->tasks[next[s]])) continue;
                fsdp_tl_task *k = &t->tasks[next[s]++];
                k->start = now;
                if (k->ms <= 0.0) { /* nothing to wait for: it ends as it starts */
                    k->end = now;
                    progress = 1;
                    continue;
                }
                running[s] = (int)(k - t->tasks);
                left[s] = k->ms;
            }
        }
        for (int s = 0; s < FSDP_TL_STREAMS; s++) busy += running[s] >= 0;
        if (!busy) break;
        double slow = 1.0, rate[FSDP_TL_STREAMS];
        int computing = running[FSDP_TL_COMPUTE] >= 0;
        for (int s = FSDP_TL_GATHER; s < FSDP_TL_STREAMS; s++) {
            if (running[s] >= 0) slow += interference[s];
            rate[s] = computing ? 1.0 / (1.0 + interference[s]) : 1.0;
            int other = s == FSDP_TL_GATHER ? FSDP_TL_REDUCE : FSDP_TL_GATHER;
            const int link = running[s] >= 0 ? t->tasks[running[s]].link : 0;
            if (running[s] >= 0 && running[other] >= 0 && link > 0 && link == t->tasks[running[other]].link)
                rate[s] /= 2.0 - (link < FSDP_TL_LINKS ? t->concurrency[link] : 0.0);
        }
        rate[FSDP_TL_COMPUTE] = 1.0 / slow;
        double dt = -1.0;
        for (int s = 0; s < FSDP_TL_STREAMS; s++)
            if (running[s] >= 0 && (dt < 0.0 || left[s] / rate[s] < dt)) dt = left[s] / rate[s];
        now += dt;
        for (int s = 0; s < FSDP_TL_STREAMS; s++) {
            if (running[s] < 0) continue;
            left[s] -= dt * rate[s];
            if (left[s] <= 1e-9 * (1.0 + t->tasks[running[s]].ms)) {
                t->tasks[running[s]].end = now;
                running[s] = -1;
            }
        }
    }
    for (int i = 0; i < t->n; i++)
        if (t->tasks[i].end < 0.0) fsdp_fatal("internal error: timeline task %d never ran (a cycle)", i);
    return now;
}

void fsdp_timeline_free(fsdp_timeline *t) {
    free(t->tasks);
    memset(t, 0, sizeof *t);
}
