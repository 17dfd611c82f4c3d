/* Philox-4x32-10: the counter-based random number generator of Salmon, Moraes, Dror and Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), as Random123, cuRAND and PyTorch's
 * CUDA dropout use it. Four 32-bit words of output are a pure function of a 128-bit counter and a
 * 64-bit key: no state, so any thread on any device can draw the numbers of any position directly,
 * and the same position always gives the same numbers.
 *
 * Why Philox and not the splitmix hash of rng.h: dropout masks are drawn inside GPU kernels for
 * every element of the residual stream and of the attention probabilities, forward and again in
 * backward, and must be bit-identical to the CPU reference. Philox is integer arithmetic only
 * (32-bit multiplies and xors: the same bits on any CPU or GPU), costs two 32x32 -> 64-bit
 * multiplies per round (cheap on GPUs, whose 64-bit multiplies are emulated), yields four words
 * per evaluation, passes BigCrush, and has published known-answer vectors that pin the
 * implementation down (tests/unit/test_dropout_ops.c checks them).
 *
 * Written by hand because it is twenty lines, must compile as C11 and as CUDA device code from the
 * same header, and no Debian library offers that. */
#ifndef FSDP_BASE_PHILOX_H
#define FSDP_BASE_PHILOX_H

#include <stdint.h>

/* Functions of these headers are inlined into C and into CUDA host and device code alike. */
#ifdef __CUDACC__
#define FSDP_HD_INLINE static __host__ __device__ __forceinline__
#else
#define FSDP_HD_INLINE static inline
#endif

typedef struct {
    uint32_t w[4];
} fsdp_philox4;

/* The high word of the 64-bit product a * b. */
FSDP_HD_INLINE uint32_t fsdp_philox_mulhi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

/* Philox-4x32 with 10 rounds on counter (c0, c1, c2, c3) and key (k0, k1). */
FSDP_HD_INLINE fsdp_philox4 fsdp_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                              uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u; /* round multipliers */
    const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u; /* Weyl key increments */
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int r = 0; r < 10; r++) {
        const uint32_t hi0 = fsdp_philox_mulhi(M0, c0), lo0 = M0 * c0;
        const uint32_t hi1 = fsdp_philox_mulhi(M1, c2), lo1 = M1 * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    fsdp_philox4 out = {{c0, c1, c2, c3}};
    return out;
}

#endif
