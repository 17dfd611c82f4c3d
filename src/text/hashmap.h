/* Open-addressing hash maps for the tokenizer's hot lookups: bytes -> uint32 (the vocabulary, the
 * added tokens, the per-word cache) and uint64 -> uint64 (the BPE merges keyed by a pair of ids, the
 * added-token trie's edges). Written here because C has no standard map and the tokenizer spends
 * most of its time in these lookups (linear probing, power-of-two tables, load at most 1/2).
 *
 * fsdp_strmap borrows its keys: the caller keeps each key's bytes alive and unchanged while the map
 * holds it. */
#ifndef FSDP_TEXT_HASHMAP_H
#define FSDP_TEXT_HASHMAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t fsdp_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
        s += 8, n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0x94d049bb133111ebULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}

static inline uint64_t fsdp_hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

typedef struct {
    const char *key; /* NULL: empty slot */
    uint32_t len;
    uint32_t value;
    uint64_t hash;
} fsdp_strmap_slot;

typedef struct {
    fsdp_strmap_slot *slots;
    size_t mask, count;
} fsdp_strmap;

void fsdp_strmap_init(fsdp_strmap *m, size_t expected);
/* Inserts or overwrites; returns 1 when the key was already there. */
int fsdp_strmap_put(fsdp_strmap *m, const char *key, size_t len, uint32_t value);
void fsdp_strmap_clear(fsdp_strmap *m);
void fsdp_strmap_free(fsdp_strmap *m);

/* 1 and *value when found. */
static inline int fsdp_strmap_get(const fsdp_strmap *m, const char *key, size_t len, uint32_t *value) {
    if (!m->slots) return 0;
    uint64_t h = fsdp_hash_bytes(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const fsdp_strmap_slot *s = &m->slots[i];
        if (!s->key) return 0;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            *value = s->value;
            return 1;
        }
    }
}

#define FSDP_U64MAP_EMPTY UINT64_MAX
typedef struct {
    uint64_t *keys, *values;
    size_t mask, count;
} fsdp_u64map;

void fsdp_u64map_init(fsdp_u64map *m, size_t expected);
/* key must not be FSDP_U64MAP_EMPTY. Inserts or overwrites. */
void fsdp_u64map_put(fsdp_u64map *m, uint64_t key, uint64_t value);
void fsdp_u64map_free(fsdp_u64map *m);

static inline int fsdp_u64map_get(const fsdp_u64map *m, uint64_t key, uint64_t *value) {
    if (!m->keys) return 0;
    for (size_t i = fsdp_hash_u64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) {
            *value = m->values[i];
            return 1;
        }
        if (m->keys[i] == FSDP_U64MAP_EMPTY) return 0;
    }
}

#endif
