/* Buffers and the arena of textbuf.h. */
#include "textbuf.h"

#include <stdlib.h>

/* Room for `extra` more of the `elem`-byte elements of *items (n used, *cap allocated), by doubling
 * from `first`: the one growth rule of the text buffers. */
static void reserve(void **items, size_t *cap, size_t n, size_t extra, size_t elem, size_t first, const char *what) {
    size_t want = n + extra, grown = *cap ? *cap : first;
    while (grown < want) grown *= 2;
    if (grown == *cap) return;
    void *p = realloc(*items, grown * elem);
    if (!p) fsdp_fatal("out of host memory (%zu %s)", grown, what);
    *items = p, *cap = grown;
}

void fsdp_buf_reserve(fsdp_buf *b, size_t extra) {
    void *p = b->p;
    reserve(&p, &b->cap, b->n, extra, 1, 256, "bytes of text");
    b->p = p;
}

void fsdp_buf_free(fsdp_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void fsdp_ids_reserve(fsdp_ids *v, size_t extra) {
    void *p = v->p;
    reserve(&p, &v->cap, v->n, extra, sizeof *v->p, 64, "token ids");
    v->p = p;
}

void fsdp_ids_free(fsdp_ids *v) {
    free(v->p);
    memset(v, 0, sizeof *v);
}

void fsdp_pieces_reserve(fsdp_pieces *v, size_t extra) {
    void *p = v->p;
    reserve(&p, &v->cap, v->n, extra, sizeof *v->p, 64, "pieces of text");
    v->p = p;
}

void fsdp_pieces_free(fsdp_pieces *v) {
    free(v->p);
    memset(v, 0, sizeof *v);
}

struct fsdp_arena_block {
    fsdp_arena_block *next;
    size_t size;
    char data[];
};

enum { ARENA_BLOCK = 1 << 16 };

char *fsdp_arena_alloc(fsdp_arena *a, size_t n) {
    n = (n + 7) & ~(size_t)7;
    if (!a->head || a->head->size - a->used < n) {
        size_t size = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        fsdp_arena_block *b = malloc(sizeof *b + size);
        if (!b) fsdp_fatal("out of host memory (tokenizer arena of %zu bytes)", size);
        b->next = a->head, b->size = size;
        a->head = b, a->used = 0;
    }
    char *p = a->head->data + a->used;
    a->used += n;
    return p;
}

void fsdp_arena_reset(fsdp_arena *a) {
    if (!a->head) return;
    /* keep the oldest block (the list's tail): it is the common working size */
    fsdp_arena_block *b = a->head;
    while (b->next) {
        fsdp_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = b, a->used = 0;
}

void fsdp_arena_free(fsdp_arena *a) {
    for (fsdp_arena_block *b = a->head; b;) {
        fsdp_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL, a->used = 0;
}
