/* Carving one arena: a walk over the tensors a module keeps, run twice with the same code, first with
 * no base to measure the bytes (the memory plan's figure), then over the one allocation to hand out
 * pointers. Offsets are 256-byte aligned (what cuBLASLt and vector loads want), so the two walks
 * agree to the byte. Used by the training arena (arena.c) and the decode arena (kv_decode.c). */
#ifndef FSDP_MODEL_CARVER_H
#define FSDP_MODEL_CARVER_H

#include <stddef.h>

typedef struct {
    char *base; /* NULL while only measuring */
    size_t used;
} carver;

static inline void *carve(carver *c, size_t bytes) {
    size_t off = (c->used + 255) & ~(size_t)255;
    c->used = off + bytes;
    return c->base ? c->base + off : NULL;
}

#endif
