/* The dtype table and the host conversions of blockwise codes (dtype.h). fp8 encoding is written
 * here rather than taken from a library: no C library on Debian converts to e4m3/e5m2, and the
 * rule (nearest even, saturating) is a few lines on the float's exponent. */
#include "dtype.h"

#include <math.h>
#include <strings.h>

const fsdp_dtype_info FSDP_DTYPES[FSDP_DTYPE_COUNT] = {
    [FSDP_F32] = {"fp32", "F32", 4, 0, 0, 3.402823466e38f, 8, 23},
    [FSDP_BF16] = {"bf16", "BF16", 2, 0, 0, 3.38953139e38f, 8, 7},
    [FSDP_I8] = {"int8", "I8", 1, 1, 1, 127.0f, 0, 7},
    [FSDP_E4M3] = {"fp8", "F8_E4M3", 1, 1, 0, 448.0f, 4, 3},
    [FSDP_E5M2] = {"fp8_e5m2", "F8_E5M2", 1, 1, 0, 57344.0f, 5, 2},
};

int fsdp_dtype_parse(const char *text, fsdp_dtype *out) {
    static const struct {
        const char *name;
        fsdp_dtype t;
    } aliases[] = {{"float32", FSDP_F32}, {"bfloat16", FSDP_BF16}, {"e4m3", FSDP_E4M3},
                   {"fp8_e4m3", FSDP_E4M3}, {"e5m2", FSDP_E5M2}};
    for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
        if (!strcasecmp(text, FSDP_DTYPES[t].name)) {
            *out = (fsdp_dtype)t;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (!strcasecmp(text, aliases[i].name)) {
            *out = aliases[i].t;
            return 0;
        }
    }
    return -1;
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

size_t fsdp_dtype_scales_offset(size_t count) { return align16(count); }

size_t fsdp_dtype_piece_bytes(fsdp_dtype t, size_t count) {
    (void)t; /* every blockwise dtype has one-byte codes */
    size_t blocks = (count + FSDP_QUANT_BLOCK - 1) / FSDP_QUANT_BLOCK;
    return align16(count) + align16(blocks * sizeof(float));
}

/* The largest finite code of a float layout: all exponent bits but the reserved top pattern. */
static uint8_t max_code(fsdp_dtype t) { return t == FSDP_E4M3 ? 0x7e : 0x7b; }
static uint8_t nan_code(fsdp_dtype t) { return t == FSDP_E4M3 ? 0x7f : 0x7e; }

uint8_t fsdp_encode_code(fsdp_dtype t, float x) {
    const fsdp_dtype_info *d = &FSDP_DTYPES[t];
    if (d->integer) {
        if (isnan(x)) return 0;
        float r = rintf(x);
        if (r > d->max_finite) r = d->max_finite;
        if (r < -d->max_finite) r = -d->max_finite;
        return (uint8_t)(int8_t)r;
    }
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | nan_code(t);
    float a = fabsf(x);
    if (a >= d->max_finite) return sign | max_code(t);
    if (a == 0.0f) return sign;
    int M = d->mantissa_bits, bias = (1 << (d->exponent_bits - 1)) - 1;
    int e;
    (void)frexpf(a, &e);
    e -= 1; /* a = m * 2^e with m in [1, 2) */
    int min_exp = 1 - bias;
    /* The spacing of representable values near a: subnormals below the smallest normal. Scaling
     * by a power of two is exact, so rintf rounds the true value to nearest even. */
    int quantum_exp = (e < min_exp ? min_exp : e) - M;
    unsigned q = (unsigned)rintf(ldexpf(a, -quantum_exp));
    unsigned code;
    if (e < min_exp)
        code = q; /* subnormal; q == 2^M is the smallest normal, whose code is the same number */
    else
        code = ((unsigned)(e + bias) << M) + (q - (1u << M)); /* a carry into the exponent is right */
    if (code > max_code(t)) code = max_code(t);
    return sign | (uint8_t)code;
}

float fsdp_decode_code(fsdp_dtype t, uint8_t code) {
    const fsdp_dtype_info *d = &FSDP_DTYPES[t];
    if (d->integer) return (float)(int8_t)code;
    int M = d->mantissa_bits, E = d->exponent_bits, bias = (1 << (E - 1)) - 1;
    float sign = code & 0x80 ? -1.0f : 1.0f;
    unsigned mag = code & 0x7f, exp = mag >> M, man = mag & ((1u << M) - 1);
    if (t == FSDP_E4M3 && mag == 0x7f) return NAN;
    if (t == FSDP_E5M2 && exp == 31) return man ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexpf((float)man, 1 - bias - M);
    return sign * ldexpf((float)((1u << M) + man), (int)exp - bias - M);
}
