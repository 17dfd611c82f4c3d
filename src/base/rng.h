/* Counter-based random numbers: every value is a pure function of (seed, stream, index), so that
 * weights initialised or tokens sampled on any number of ranks are the same numbers. */
#ifndef FSDP_BASE_RNG_H
#define FSDP_BASE_RNG_H

#include <stdint.h>

/* A well-mixed 64-bit hash of three words (splitmix64 finaliser chained). */
uint64_t fsdp_rand_u64(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1) with 53 bits. */
double fsdp_rand_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform integer in [0, n) without modulo bias worth caring about (n < 2^32). */
uint32_t fsdp_rand_below(uint64_t seed, uint64_t stream, uint64_t index, uint32_t n);
/* Standard normal (Box-Muller on two counter draws). */
double fsdp_rand_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* The same numbers with (seed, stream) mixed once into a key: fsdp_rand_u64(seed, stream, i) ==
 * fsdp_rand_u64_keyed(fsdp_rand_key(seed, stream), i), and likewise for the normal. A loop over one
 * stream's indices mixes the key once instead of once per index (fsdp_param_init_fill). */
uint64_t fsdp_rand_key(uint64_t seed, uint64_t stream);
uint64_t fsdp_rand_u64_keyed(uint64_t key, uint64_t index);
double fsdp_rand_normal_keyed(uint64_t key, uint64_t index);

#endif
