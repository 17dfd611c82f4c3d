/* The maps of hashmap.h: growth doubles the table when it is half full. */
#include "hashmap.h"

#include <stdlib.h>

#include "../base/error.h"

static size_t table_size(size_t expected) {
    size_t n = 16;
    while (n < expected * 2 + 2) n *= 2;
    return n;
}

void fsdp_strmap_init(fsdp_strmap *m, size_t expected) {
    size_t n = table_size(expected);
    m->slots = fsdp_xcalloc(n, sizeof *m->slots, "string map");
    m->mask = n - 1, m->count = 0;
}

static void strmap_insert(fsdp_strmap *m, const fsdp_strmap_slot *e) {
    for (size_t i = e->hash & m->mask;; i = (i + 1) & m->mask)
        if (!m->slots[i].key) {
            m->slots[i] = *e;
            return;
        }
}

int fsdp_strmap_put(fsdp_strmap *m, const char *key, size_t len, uint32_t value) {
    if (!m->slots) fsdp_strmap_init(m, 16);
    uint64_t h = fsdp_hash_bytes(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        fsdp_strmap_slot *s = &m->slots[i];
        if (!s->key) break;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            s->value = value;
            return 1;
        }
    }
    if ((m->count + 1) * 2 > m->mask + 1) {
        fsdp_strmap old = *m;
        size_t n = (m->mask + 1) * 2;
        m->slots = fsdp_xcalloc(n, sizeof *m->slots, "string map");
        m->mask = n - 1;
        for (size_t i = 0; i <= old.mask; i++)
            if (old.slots[i].key) strmap_insert(m, &old.slots[i]);
        free(old.slots);
    }
    fsdp_strmap_slot e = {key, (uint32_t)len, value, h};
    strmap_insert(m, &e);
    m->count++;
    return 0;
}

void fsdp_strmap_clear(fsdp_strmap *m) {
    if (m->slots) memset(m->slots, 0, (m->mask + 1) * sizeof *m->slots);
    m->count = 0;
}

void fsdp_strmap_free(fsdp_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

void fsdp_u64map_init(fsdp_u64map *m, size_t expected) {
    size_t n = table_size(expected);
    m->keys = fsdp_xmalloc(n * sizeof *m->keys, "id map");
    m->values = fsdp_xmalloc(n * sizeof *m->values, "id map");
    memset(m->keys, 0xFF, n * sizeof *m->keys);
    m->mask = n - 1, m->count = 0;
}

static void u64_insert(fsdp_u64map *m, uint64_t key, uint64_t value) {
    for (size_t i = fsdp_hash_u64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == key || m->keys[i] == FSDP_U64MAP_EMPTY) {
            if (m->keys[i] == FSDP_U64MAP_EMPTY) m->count++;
            m->keys[i] = key, m->values[i] = value;
            return;
        }
    }
}

void fsdp_u64map_put(fsdp_u64map *m, uint64_t key, uint64_t value) {
    if (!m->keys) fsdp_u64map_init(m, 16);
    if ((m->count + 1) * 2 > m->mask + 1) {
        fsdp_u64map old = *m;
        fsdp_u64map_init(m, (old.mask + 1));
        for (size_t i = 0; i <= old.mask; i++)
            if (old.keys[i] != FSDP_U64MAP_EMPTY) u64_insert(m, old.keys[i], old.values[i]);
        free(old.keys);
        free(old.values);
    }
    u64_insert(m, key, value);
}

void fsdp_u64map_free(fsdp_u64map *m) {
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}
