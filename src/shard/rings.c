/* Slot rings: units of the same padded size share one allocation of slots, each holding one unit at
 * a time, with the event that says when its last user let go. fsdp_plan_rings decides the rings
 * without a device, for the engine and its memory plan alike. */
#include <stdlib.h>

#include "../base/error.h"
#include "engine_internal.h"

int fsdp_plan_rings(const int64_t *padded, const int *pinned, int num_units, int max_live, int keep_all,
                    fsdp_ring_shape *rings, int *which) {
    int *count = fsdp_xcalloc((size_t)num_units, sizeof(int), "unit rings");
    int *pins = fsdp_xcalloc((size_t)num_units, sizeof(int), "unit rings");
    int n = 0;
    for (int u = 0; u < num_units; u++) {
        int r = 0;
        while (r < n && rings[r].elems != padded[u]) r++;
        if (r == n) rings[n++].elems = padded[u];
        which[u] = r;
        count[r]++;
        pins[r] += pinned ? pinned[u] : 0;
    }
    for (int r = 0; r < n; r++) {
        int cap = keep_all ? count[r] : max_live + pins[r];
        rings[r].capacity = cap < count[r] ? cap : count[r];
    }
    free(count);
    free(pins);
    return n;
}

int engine_build_rings(fsdp_engine *e, slot_ring **out, int *which, int keep_all) {
    int64_t *padded = fsdp_xmalloc((size_t)e->num_units * sizeof(int64_t), "unit rings");
    for (int u = 0; u < e->num_units; u++) padded[u] = e->units[u].padded;
    fsdp_ring_shape *shapes = fsdp_xcalloc((size_t)e->num_units, sizeof *shapes, "unit rings");
    int n = fsdp_plan_rings(padded, e->pinned, e->num_units, e->opts.max_live, keep_all, shapes, which);
    slot_ring *rings = fsdp_xcalloc((size_t)e->num_units, sizeof *rings, "unit rings");
    for (int r = 0; r < n; r++) {
        rings[r].elems = shapes[r].elems;
        rings[r].capacity = shapes[r].capacity;
    }
    free(padded);
    free(shapes);
    *out = rings;
    return n;
}

void slot_ring_alloc(fsdp_engine *e, slot_ring *r, size_t esize, fsdp_comm *shared_with, const char *what) {
    size_t bytes = (size_t)r->capacity * (size_t)r->elems * esize;
    r->base = shared_with ? e->be->coll->alloc_shared(e->be, shared_with, bytes, what) : e->be->runtime->alloc(e->be, bytes, what);
    r->owner = fsdp_xmalloc((size_t)r->capacity * sizeof(int), what);
    r->released = fsdp_xcalloc((size_t)r->capacity, sizeof(fsdp_event *), what);
    r->released_valid = fsdp_xcalloc((size_t)r->capacity, sizeof(int), what);
    for (int s = 0; s < r->capacity; s++) {
        r->owner[s] = -1;
        r->released[s] = e->be->runtime->event_create(e->be, 0);
    }
}

void slot_ring_free(fsdp_backend *be, slot_ring *r) {
    be->runtime->free(be, r->base);
    for (int s = 0; s < r->capacity; s++) be->runtime->event_destroy(be, r->released[s]);
    free(r->owner);
    free(r->released);
    free(r->released_valid);
}

void *slot_ring_slot(const slot_ring *r, int slot, size_t esize) {
    return (char *)r->base + (size_t)slot * (size_t)r->elems * esize;
}

int slot_ring_free_slot(const slot_ring *r) {
    for (int s = 0; s < r->capacity; s++)
        if (r->owner[s] < 0) return s;
    return -1;
}
