/* Element types as a table: one row per dtype says its name, its bytes, its safetensors spelling,
 * whether its values travel with block scales, and its floating-point layout. The backends (element
 * sizes, NCCL and MPI types), the engine (what its collectives move), the memory plans and the file
 * formats consult the row instead of testing for a particular dtype, so a new dtype is a new row.
 *
 * Two kinds of dtype:
 *  - plain (fp32, bf16): a tensor is its elements.
 *  - blockwise scaled (int8, fp8 e4m3, fp8 e5m2): used on the wire and in quantized copies only,
 *    never for a tensor the model computes with. A "piece" of `count` elements is laid out as
 *      [count one-byte codes][padding to 16 bytes][ceil(count / FSDP_QUANT_BLOCK) fp32 scales][padding to 16]
 *    (fsdp_dtype_piece_bytes); element i of the piece is code(i) * scale[i / FSDP_QUANT_BLOCK]. A
 *    collective of such a dtype moves whole pieces, so the scales travel with their data.
 *
 * Quantization of a block (the CPU reference src/kernels/cpu/quantize.c and its CUDA twin compute
 * exactly this, bit for bit): amax = the largest magnitude of the block's values (fp32); scale =
 * amax / max_finite; codes = encode(x * (max_finite / amax)), rounded to nearest even and clamped to
 * +-max_finite; amax 0 gives scale 0 and codes 0; a block holding NaN or Inf gets a NaN scale, so
 * that a non-finite gradient stays non-finite through a compressed reduction (the step is then
 * skipped, as without compression).
 *
 * Host conversions: bf16 rounding is round-to-nearest-even, as PyTorch and CUDA's __float2bfloat16_rn
 * do; NaN stays NaN. fp8 encoding is round-to-nearest-even with saturation to the largest finite
 * value (CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE); NaN stays NaN. */
#ifndef FSDP_BASE_DTYPE_H
#define FSDP_BASE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" { /* the CUDA kernels include this header */
#endif

typedef enum {
    FSDP_F32 = 0,
    FSDP_BF16 = 1,
    FSDP_I8 = 2,   /* int8 codes, blockwise scaled */
    FSDP_E4M3 = 3, /* fp8 e4m3 ("fn": no infinities), blockwise scaled */
    FSDP_E5M2 = 4, /* fp8 e5m2, blockwise scaled */
    FSDP_DTYPE_COUNT
} fsdp_dtype;

/* Elements per scale of a blockwise dtype (ZeRO++ and torchao use 128-256: smaller blocks follow the
 * data more closely, larger ones spend fewer bytes on scales; 256 costs 1.6% on top of one byte). */
#define FSDP_QUANT_BLOCK 256

typedef struct {
    const char *name;        /* as flags and logs spell it */
    const char *safetensors; /* the safetensors header's dtype string */
    unsigned bytes;          /* bytes per element (a GPU's; the CPU backend keeps bf16 in 4 bytes) */
    int blockwise;           /* 1: values are codes with one fp32 scale per FSDP_QUANT_BLOCK */
    int integer;             /* 1: integer codes (int8) */
    float max_finite;        /* largest finite magnitude; quantization maps a block's amax onto it */
    int exponent_bits, mantissa_bits;
} fsdp_dtype_info;

extern const fsdp_dtype_info FSDP_DTYPES[FSDP_DTYPE_COUNT];

static inline const fsdp_dtype_info *fsdp_dtype_info_of(fsdp_dtype t) { return &FSDP_DTYPES[t]; }
static inline const char *fsdp_dtype_name(fsdp_dtype t) { return FSDP_DTYPES[t].name; }
static inline int fsdp_dtype_blockwise(fsdp_dtype t) { return FSDP_DTYPES[t].blockwise; }

/* A dtype from a flag's value: its name or an alias (float32, bfloat16, fp8 = e4m3, fp8_e4m3,
 * fp8_e5m2). Returns -1 for anything else. */
int fsdp_dtype_parse(const char *text, fsdp_dtype *out);

/* Bytes of one piece of `count` elements of a blockwise dtype, laid out as the header says (a
 * multiple of 16). */
size_t fsdp_dtype_piece_bytes(fsdp_dtype t, size_t count);
/* Where the scales of such a piece start, in bytes from the piece's start. */
size_t fsdp_dtype_scales_offset(size_t count);

/* ---- element conversions on the host ---- */

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

/* One code of a blockwise dtype from an already scaled value, and back (without the scale). */
uint8_t fsdp_encode_code(fsdp_dtype t, float x);
float fsdp_decode_code(fsdp_dtype t, uint8_t code);

#ifdef __cplusplus
}
#endif

#endif
