/* Growable buffers the tokenizer's stages pass text and ids through, and an arena whose
 * allocations never move (so pieces of text can point into it while it grows). All abort with a
 * message when memory runs out, like fsdp_xmalloc. */
#ifndef FSDP_TEXT_TEXTBUF_H
#define FSDP_TEXT_TEXTBUF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../base/error.h"

typedef struct {
    char *p;
    size_t n, cap;
} fsdp_buf;

typedef struct {
    uint32_t *p;
    size_t n, cap;
} fsdp_ids;

void fsdp_buf_reserve(fsdp_buf *b, size_t extra);
static inline void fsdp_buf_add(fsdp_buf *b, const void *s, size_t n) {
    if (b->cap - b->n < n + 1) fsdp_buf_reserve(b, n + 1);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static inline void fsdp_buf_addc(fsdp_buf *b, char c) { fsdp_buf_add(b, &c, 1); }
void fsdp_buf_free(fsdp_buf *b);

void fsdp_ids_reserve(fsdp_ids *v, size_t extra);
static inline void fsdp_ids_push(fsdp_ids *v, uint32_t id) {
    if (v->n == v->cap) fsdp_ids_reserve(v, 1);
    v->p[v->n++] = id;
}
void fsdp_ids_free(fsdp_ids *v);

/* A piece of text on its way through the stages, or (id >= 0) an added token already matched. */
typedef struct {
    const char *s;
    uint32_t n;
    int32_t id;
} fsdp_piece;

typedef struct {
    fsdp_piece *p;
    size_t n, cap;
} fsdp_pieces;

void fsdp_pieces_reserve(fsdp_pieces *v, size_t extra);
static inline void fsdp_pieces_push(fsdp_pieces *v, const char *s, size_t n, int32_t id) {
    if (v->n == v->cap) fsdp_pieces_reserve(v, 1);
    v->p[v->n].s = s, v->p[v->n].n = (uint32_t)n, v->p[v->n].id = id;
    v->n++;
}
void fsdp_pieces_free(fsdp_pieces *v);

/* Blocks of at least 64 KiB; fsdp_arena_reset keeps the first block for reuse. */
typedef struct fsdp_arena_block fsdp_arena_block;
typedef struct {
    fsdp_arena_block *head;
    size_t used; /* bytes used in head */
} fsdp_arena;

char *fsdp_arena_alloc(fsdp_arena *a, size_t n);
void fsdp_arena_reset(fsdp_arena *a);
void fsdp_arena_free(fsdp_arena *a);

#endif
