/* Checksums of checkpoint contents that do not depend on how a tensor was split between ranks.
 *
 * Tensor checksum (docs/FORMATS.md, algorithm "sum64-fmix64"): the sum modulo 2^64, over every
 * element i (0-based, row-major) of the float32 tensor, of
 *
 *     fmix64(i * 0x9E3779B97F4A7C15 + bits(x_i))       (bits: the element's IEEE-754 pattern)
 *
 * where fmix64 is MurmurHash3's 64-bit finaliser. Each rank hashes its own pieces and the sums are
 * added across ranks (MPI_SUM on uint64 wraps modulo 2^64), so the result is the same for any
 * layout and any order. Any change to one element, a swap of two elements, a lost or duplicated
 * piece changes the sum except with probability about 2^-64. It is not a defence against an
 * attacker who can recompute it; it is a guard against damaged storage and hand edits.
 *
 * Attribute checksum ("fmix64-bytes"): a 64-bit hash of a byte string (used for the root
 * attributes, which h5py users might edit by hand).
 *
 * Hand-written because no library offers a layout-independent sum of element hashes; written to
 * run at memory speed (vectorised where the CPU allows), so that checkpoints are written and read
 * at disk speed with the hash computed on the way. */
#ifndef FSDP_IO_CKPT_CHECKSUM_H
#define FSDP_IO_CKPT_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define FSDP_CKSUM_ALGORITHM "sum64-fmix64"

/* The hash sum of elements [first, first + n) of a tensor, given their float32 bit patterns.
 * Adds the number of non-finite values (NaN, +-inf) among them to *nonfinite. */
uint64_t fsdp_cksum_f32(const uint32_t *bits, uint64_t first, size_t n, uint64_t *nonfinite);

/* One element's term of the sum (for tests and the documentation's reference). */
uint64_t fsdp_cksum_element(uint64_t index, uint32_t bits);

/* A 64-bit hash of n bytes, chained from `seed` (0 to start). */
uint64_t fsdp_cksum_bytes(uint64_t seed, const void *data, size_t n);

#endif
