#include "rng.h"

#include <math.h>

static inline uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t fsdp_rand_key(uint64_t seed, uint64_t stream) { return mix64(mix64(seed) ^ stream); }

uint64_t fsdp_rand_u64_keyed(uint64_t key, uint64_t index) { return mix64(key ^ index); }

uint64_t fsdp_rand_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    return fsdp_rand_u64_keyed(fsdp_rand_key(seed, stream), index);
}

double fsdp_rand_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (double)(fsdp_rand_u64(seed, stream, index) >> 11) * (1.0 / 9007199254740992.0);
}

uint32_t fsdp_rand_below(uint64_t seed, uint64_t stream, uint64_t index, uint32_t n) {
    /* Lemire's multiply-shift: bias below 2^-32, irrelevant here. */
    uint64_t r = fsdp_rand_u64(seed, stream, index) >> 32;
    return (uint32_t)((r * (uint64_t)n) >> 32);
}

double fsdp_rand_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    return fsdp_rand_normal_keyed(fsdp_rand_key(seed, stream), index);
}

double fsdp_rand_normal_keyed(uint64_t key, uint64_t index) {
    uint64_t a = fsdp_rand_u64_keyed(key, 2 * index), b = fsdp_rand_u64_keyed(key, 2 * index + 1);
    double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* (0, 1) */
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
