/* The checksums of ckpt_checksum.h. */
#include "ckpt_checksum.h"

#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

uint64_t fsdp_cksum_element(uint64_t index, uint32_t bits) { return fmix64(index * GOLDEN + bits); }

/* The inner loop runs over every byte of every checkpoint, written and read: on x86-64 a copy is
 * compiled for AVX-512 (64-bit vector multiplies: about 5x the scalar speed) and AVX2, and the
 * loader picks the best the CPU has. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HASH_LOOP_ATTRS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("O3")))
#else
#define HASH_LOOP_ATTRS
#endif

HASH_LOOP_ATTRS
uint64_t fsdp_cksum_f32(const uint32_t *bits, uint64_t first, size_t n, uint64_t *nonfinite) {
    uint64_t sum = 0, bad = 0, base = first * GOLDEN;
    for (size_t j = 0; j < n; j++) {
        uint32_t b = bits[j];
        sum += fmix64(base + (uint64_t)j * GOLDEN + b);
        bad += (b & 0x7f800000u) == 0x7f800000u;
    }
    *nonfinite += bad;
    return sum;
}

uint64_t fsdp_cksum_bytes(uint64_t seed, const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = fmix64(seed ^ (n * GOLDEN));
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        size_t take = n - i < 8 ? n - i : 8;
        for (size_t k = 0; k < take; k++) w |= (uint64_t)p[i + k] << (8 * k); /* little-endian on any host */
        h = fmix64(h ^ fmix64(w + i * GOLDEN));
    }
    return h;
}
