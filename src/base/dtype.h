/* Element types of tensors and the bf16 <-> fp32 conversions used on the host and the CPU backend.
 * Rounding is round-to-nearest-even, as PyTorch and CUDA's __float2bfloat16_rn do; NaN stays NaN. */
#ifndef FSDP_BASE_DTYPE_H
#define FSDP_BASE_DTYPE_H

#include <stdint.h>
#include <string.h>

typedef enum { FSDP_F32 = 0, FSDP_BF16 = 1 } fsdp_dtype;

static inline const char *fsdp_dtype_name(fsdp_dtype t) { return t == FSDP_BF16 ? "bf16" : "fp32"; }

static inline uint16_t fsdp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fsdp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The fp32 value nearest to f that bf16 can represent. */
static inline float fsdp_round_bf16(float f) { return fsdp_bf16_to_f32(fsdp_f32_to_bf16(f)); }

#endif
