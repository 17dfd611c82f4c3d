/* BPE of bpe.h. */
#include "bpe.h"

#include <stdio.h>
#include <stdlib.h>

#include "../base/utf8.h"

struct fsdp_bpe_symbol {
    uint32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes of text; 0 = merged into its left neighbour */
};
struct fsdp_bpe_merge {
    uint32_t rank, pos, id;
};

/* Words longer than this are not cached (tokenizers' MAX_LENGTH); the cache is emptied when full. */
enum { CACHE_MAX_WORD = 256, CACHE_MAX_ENTRIES = 1 << 16 };

static int lookup_fail(fsdp_err *err, const char *file, size_t i, const fsdp_tj_str *t) {
    return fsdp_errf(err, "%s: model.merges[%zu]: \"%s\" is not in model.vocab", file, i, t->s);
}

int fsdp_bpe_init(fsdp_bpe *b, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err) {
    memset(b, 0, sizeof *b);
    b->tokens = spec->vocab;
    b->vocab_size = spec->vocab_size;
    fsdp_strmap_init(&b->vocab, spec->vocab_size);
    for (uint32_t id = 0; id < spec->vocab_size; id++)
        if (spec->vocab[id].s) fsdp_strmap_put(&b->vocab, spec->vocab[id].s, spec->vocab[id].n, id);
    b->fuse_unk = spec->fuse_unk, b->byte_fallback = spec->byte_fallback, b->ignore_merges = spec->ignore_merges;
    if (spec->unk_token.s) {
        /* tokenizers fails only when an unknown character meets a missing unk token; refusing up front
         * names the problem before any text is read */
        if (!fsdp_strmap_get(&b->vocab, spec->unk_token.s, spec->unk_token.n, &b->unk_id))
            return fsdp_errf(err, "%s: model.unk_token \"%s\" is not in model.vocab", file, spec->unk_token.s);
        b->has_unk = 1;
    }
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        uint32_t id;
        b->byte_token[i] = fsdp_strmap_get(&b->vocab, name, 6, &id) ? (int32_t)id : -1;
    }
    for (uint32_t cp = 0; cp < 0x800; cp++) {
        char ch[4];
        int n = fsdp_utf8_encode(cp, ch);
        uint32_t id;
        b->small_char[cp] = (cp < 0xD800 && fsdp_strmap_get(&b->vocab, ch, (size_t)n, &id)) ? (int32_t)id : -1;
    }
    fsdp_u64map_init(&b->merges, spec->num_merges);
    fsdp_buf joined = {0};
    for (size_t i = 0; i < spec->num_merges; i++) {
        const fsdp_tj_str *l = &spec->merges[i][0], *r = &spec->merges[i][1];
        uint32_t a, c, m;
        if (!fsdp_strmap_get(&b->vocab, l->s, l->n, &a)) return fsdp_buf_free(&joined), lookup_fail(err, file, i, l);
        if (!fsdp_strmap_get(&b->vocab, r->s, r->n, &c)) return fsdp_buf_free(&joined), lookup_fail(err, file, i, r);
        joined.n = 0;
        fsdp_buf_add(&joined, l->s, l->n);
        fsdp_buf_add(&joined, r->s, r->n);
        if (!fsdp_strmap_get(&b->vocab, joined.p, joined.n, &m)) {
            fsdp_tj_str t = {joined.p, joined.n};
            int rc = lookup_fail(err, file, i, &t);
            fsdp_buf_free(&joined);
            return rc;
        }
        /* a pair listed twice keeps its last rank, as tokenizers' map insertion does */
        fsdp_u64map_put(&b->merges, (uint64_t)a << 32 | c, (uint64_t)i << 32 | m);
    }
    fsdp_buf_free(&joined);
    return 0;
}

void fsdp_bpe_free(fsdp_bpe *b) {
    fsdp_strmap_free(&b->vocab);
    fsdp_u64map_free(&b->merges);
}

void fsdp_bpe_state_free(fsdp_bpe_state *s) {
    fsdp_strmap_free(&s->cache);
    fsdp_arena_free(&s->cache_text);
    fsdp_ids_free(&s->cache_ids);
    free(s->entries);
    free(s->symbols);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

/* ---- the heap of candidate merges: min by (rank, pos) ------------------------------------------ */

static inline int before(const struct fsdp_bpe_merge *a, const struct fsdp_bpe_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct fsdp_bpe_merge *h, size_t *n, struct fsdp_bpe_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&m, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = m;
}

static struct fsdp_bpe_merge heap_pop(struct fsdp_bpe_merge *h, size_t *n) {
    struct fsdp_bpe_merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && before(&h[child + 1], &h[child])) child++;
        if (!before(&h[child], &last)) break;
        h[i] = h[child];
        i = child;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static inline int pair_merge(const fsdp_bpe *b, uint32_t l, uint32_t r, uint32_t pos, struct fsdp_bpe_merge *m) {
    uint64_t v;
    if (!fsdp_u64map_get(&b->merges, (uint64_t)l << 32 | r, &v)) return 0;
    m->rank = (uint32_t)(v >> 32), m->id = (uint32_t)v, m->pos = pos;
    return 1;
}

/* ---- one word ---------------------------------------------------------------------------------- */

static void grow(fsdp_bpe_state *s, size_t n) {
    if (n <= s->cap) return;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    s->symbols = realloc(s->symbols, cap * sizeof *s->symbols);
    /* every merge pushes at most two new candidates: the heap never holds more than 3n */
    s->heap = realloc(s->heap, 3 * cap * sizeof *s->heap);
    if (!s->symbols || !s->heap) fsdp_fatal("out of host memory (BPE word of %zu symbols)", n);
    s->cap = cap;
}

static inline void add_symbol(fsdp_bpe_state *s, size_t *n, uint32_t id, uint32_t len) {
    struct fsdp_bpe_symbol *y = &s->symbols[*n];
    y->id = id, y->len = len, y->prev = (int32_t)*n - 1, y->next = (int32_t)*n + 1;
    (*n)++;
}

/* The symbols of a word before merging (tokenizers' BPE::merge_word). */
static size_t initial_symbols(const fsdp_bpe *b, fsdp_bpe_state *s, const char *w, size_t n) {
    grow(s, n + 1);
    size_t count = 0;
    int unk = 0;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp, id;
        int len = fsdp_utf8_decode(w + i, &cp);
        int found = cp < 0x800 ? (b->small_char[cp] >= 0 ? (id = (uint32_t)b->small_char[cp], 1) : 0)
                               : fsdp_strmap_get(&b->vocab, w + i, (size_t)len, &id);
        if (found) {
            if (unk) add_symbol(s, &count, b->unk_id, unk_len), unk = 0;
            add_symbol(s, &count, id, (uint32_t)len);
        } else {
            int all = b->byte_fallback;
            for (int k = 0; all && k < len; k++) all = b->byte_token[(unsigned char)w[i + k]] >= 0;
            if (all) {
                for (int k = 0; k < len; k++) add_symbol(s, &count, (uint32_t)b->byte_token[(unsigned char)w[i + k]], 1);
            } else if (b->has_unk) {
                if (unk && b->fuse_unk) {
                    unk_len += (uint32_t)len;
                } else {
                    if (unk) add_symbol(s, &count, b->unk_id, unk_len);
                    unk = 1, unk_len = (uint32_t)len;
                }
            }
        }
        i += (size_t)len;
    }
    if (unk) add_symbol(s, &count, b->unk_id, unk_len);
    if (count) s->symbols[count - 1].next = -1;
    return count;
}

static void merge_word(const fsdp_bpe *b, fsdp_bpe_state *s, const char *w, size_t n, fsdp_ids *out) {
    size_t count = initial_symbols(b, s, w, n), heap_n = 0;
    struct fsdp_bpe_symbol *y = s->symbols;
    struct fsdp_bpe_merge m;
    for (size_t i = 0; i + 1 < count; i++)
        if (pair_merge(b, y[i].id, y[i + 1].id, (uint32_t)i, &m)) heap_push(s->heap, &heap_n, m);
    while (heap_n) {
        struct fsdp_bpe_merge top = heap_pop(s->heap, &heap_n);
        struct fsdp_bpe_symbol *cur = &y[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        struct fsdp_bpe_symbol right = y[cur->next];
        uint64_t v;
        if (!fsdp_u64map_get(&b->merges, (uint64_t)cur->id << 32 | right.id, &v) || (uint32_t)v != top.id) continue;
        y[cur->next].len = 0;
        cur->id = top.id, cur->len += right.len, cur->next = right.next;
        if (right.next >= 0) y[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && pair_merge(b, y[cur->prev].id, cur->id, (uint32_t)cur->prev, &m))
            heap_push(s->heap, &heap_n, m);
        if (cur->next >= 0 && pair_merge(b, cur->id, y[cur->next].id, top.pos, &m)) heap_push(s->heap, &heap_n, m);
    }
    for (int32_t i = count ? 0 : -1; i >= 0; i = y[i].next) fsdp_ids_push(out, y[i].id);
}

void fsdp_bpe_word(const fsdp_bpe *b, fsdp_bpe_state *s, const char *w, size_t n, fsdp_ids *out) {
    uint32_t id;
    if (b->ignore_merges && fsdp_strmap_get(&b->vocab, w, n, &id)) {
        fsdp_ids_push(out, id);
        return;
    }
    if (n >= CACHE_MAX_WORD) {
        merge_word(b, s, w, n, out);
        return;
    }
    uint32_t entry;
    if (fsdp_strmap_get(&s->cache, w, n, &entry)) {
        uint64_t e = s->entries[entry];
        size_t off = (size_t)(e >> 16), cnt = (size_t)(e & 0xFFFF);
        fsdp_ids_reserve(out, cnt);
        memcpy(out->p + out->n, s->cache_ids.p + off, cnt * sizeof(uint32_t));
        out->n += cnt;
        return;
    }
    size_t first = out->n;
    merge_word(b, s, w, n, out);
    if (s->num_entries >= CACHE_MAX_ENTRIES) {
        fsdp_strmap_clear(&s->cache);
        fsdp_arena_reset(&s->cache_text);
        s->cache_ids.n = 0, s->num_entries = 0;
    }
    if (s->num_entries == s->cap_entries) {
        s->cap_entries = s->cap_entries ? 2 * s->cap_entries : 1024;
        s->entries = realloc(s->entries, s->cap_entries * sizeof *s->entries);
        if (!s->entries) fsdp_fatal("out of host memory (BPE cache)");
    }
    size_t cnt = out->n - first;
    s->entries[s->num_entries] = (uint64_t)s->cache_ids.n << 16 | cnt;
    fsdp_ids_reserve(&s->cache_ids, cnt);
    memcpy(s->cache_ids.p + s->cache_ids.n, out->p + first, cnt * sizeof(uint32_t));
    s->cache_ids.n += cnt;
    char *key = fsdp_arena_alloc(&s->cache_text, n);
    memcpy(key, w, n);
    fsdp_strmap_put(&s->cache, key, n, (uint32_t)s->num_entries++);
}
