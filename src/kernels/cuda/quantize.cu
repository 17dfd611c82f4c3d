/* Blockwise quantization (fp32 or bf16 into int8 / fp8 pieces of codes and scales), its inverse,
 * and the sum of quantized pieces into an fp32 or bf16 shard: the GPU twins of
 * src/kernels/cpu/quantize.c, equal to it bit for bit (codes, scales, padding and outputs).
 *
 * Bit-exactness: every step is one IEEE-rounded fp32 operation spelled as an intrinsic (__fdiv_rn,
 * __fmul_rn, __fadd_rn), so neither contraction into FMAs nor approximate division can creep in,
 * and this file is never built with --use_fast_math. fp8 codes come from the cvt instructions
 * (round to nearest even, saturating: what fsdp_encode_code does); fp8 decoding goes through half
 * precision, which holds every fp8 value exactly. int8 goes through the float of 1.5 * 2^23 + k,
 * whose low mantissa byte is k: the addition rounds to nearest even as rintf does, and both
 * directions stay on the full-rate float and byte-permute units.
 *
 * Speed: the kernels are bound by memory only if every access is a contiguous run per warp, each
 * lane keeps enough bytes in flight and few instructions go to an element (bench/quantize_bench.c
 * measures them against a device-to-device copy):
 *  - quantize and dequantize give each 256-element block to one warp, 8 elements a lane, and each
 *    warp a few consecutive blocks at a time whose loads all issue before the first is used; a
 *    block's amax is one warp max, and the two divisions of all the warp's blocks run at once, one
 *    per lane;
 *  - sum_pieces gives each warp a span of 512 outputs, 16 a lane, and walks the pieces in order
 *    with a few pieces' loads in flight at a time;
 *  - one kernel per variant (dtypes, vector or scalar path), so that each gets its own registers.
 * Vector accesses where the plain side is 16-byte aligned and count keeps every piece so; scalar
 * ones at ragged ends and otherwise. Grid-stride loops, size_t indices. */
#include <cuda_fp8.h>

#include "cuda_common.cuh"

#define QUANT_THREADS 256
#define QUANT_WARPS (QUANT_THREADS / 32)
#define SUM_THREADS 256
#define INF_BITS 0x7f800000u
#define QUANT_NAN_BITS 0x7fc00000u /* the scale of a non-finite block, as on the CPU */
#define INT8_MAGIC 12582912.0f     /* 1.5 * 2^23 */

/* ---- device side: codes ------------------------------------------------------------------------- */

/* The dtype of codes is passed as its fsdp_dtype value (FSDP_I8, FSDP_E4M3, FSDP_E5M2), a literal in
 * every kernel variant. */
static __device__ __forceinline__ __nv_fp8_interpretation_t fp8_kind(int t) {
    return t == FSDP_E4M3 ? __NV_E4M3 : __NV_E5M2;
}

/* rint(clamp(y, -127, 127)) in the low byte (clamping first rounds the same way). */
static __device__ __forceinline__ unsigned int8_byte(float y) {
    return __float_as_uint(__fadd_rn(fminf(fmaxf(y, -127.0f), 127.0f), INT8_MAGIC));
}

/* The low bytes of a, b, c, d as one word, a's lowest (memory order). */
static __device__ __forceinline__ unsigned pack_low_bytes(unsigned a, unsigned b, unsigned c, unsigned d) {
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

static __device__ __forceinline__ unsigned encode4(const float *y, int t) {
    if (t == FSDP_I8) return pack_low_bytes(int8_byte(y[0]), int8_byte(y[1]), int8_byte(y[2]), int8_byte(y[3]));
    const unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(y[0], y[1]), __NV_SATFINITE, fp8_kind(t));
    const unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(y[2], y[3]), __NV_SATFINITE, fp8_kind(t));
    return lo | hi << 16;
}

/* The values of the four codes of w (lowest byte first), each times scale. */
static __device__ __forceinline__ void decode4(unsigned w, float scale, int t, float *v) {
    if (t == FSDP_I8) {
        /* byte ^ 0x80 = k + 128 under the exponent of 2^23: 2^23 + k + 128, less 2^23 + 128, is k. */
        const unsigned biased = w ^ 0x80808080u;
        v[0] = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7540));
        v[1] = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7541));
        v[2] = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7542));
        v[3] = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7543));
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = __fadd_rn(v[k], -8388736.0f);
    } else {
        const float2 a = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), fp8_kind(t))));
        const float2 b = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), fp8_kind(t))));
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = __fmul_rn(v[k], scale);
}

/* ---- device side: accesses ------------------------------------------------------------------------
 *
 * Every access of the plain side moves 16 bytes a lane, lanes side by side, so that a warp's access
 * covers one contiguous run of whole 32-byte sectors: G = 8 elements of bf16 or G = 4 of fp32 (wider
 * accesses with lanes 32 bytes apart write each sector in two halves, which costs stores dearly).
 * The codes of those G elements move with them (8 or 4 bytes). A lane of a quantization warp holds 8
 * elements of its block: one group of 8 at 8 * lane (bf16), or groups of 4 at 4 * lane and
 * 128 + 4 * lane (fp32). */

static __device__ __forceinline__ int group_size(int bf16) { return bf16 ? 8 : 4; }

/* G elements g .. g + G - 1 of a plain tensor as stored (ld_raw8's form: fp32 in lo then hi, bf16
 * pairs in lo), the first n read and the rest zero: one 16-byte load (two for fp32 with G = 8) when
 * `vec` and all G are there. */
static __device__ __forceinline__ fsdp_raw8 load_group(const void *x, size_t g, int G, int n, int bf16, int vec) {
    if (vec && n == G) {
        if (G == 8) return ld_raw8(x, g / 8, bf16);
        fsdp_raw8 r;
        r.hi = make_uint4(0u, 0u, 0u, 0u);
        if (bf16) {
            const uint2 h = *(const uint2 *)((const __nv_bfloat16 *)x + g);
            r.lo = make_uint4(h.x, h.y, 0u, 0u);
        } else {
            r.lo = *(const uint4 *)((const float *)x + g);
        }
        return r;
    }
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = k < G && k < n ? ld1(x, g + k, bf16) : 0.0f;
    return pack8(v, bf16); /* exact: the values are already bf16 */
}

/* v[0 .. G-1] into elements g .. g + n - 1 (rounded to bf16 in bf16 mode). */
static __device__ __forceinline__ void store_group(void *x, size_t g, int G, int n, int bf16, int vec,
                                                   const float *v) {
    if (vec && n == G) {
        if (G == 8)
            st8(x, g / 8, bf16, v);
        else if (bf16)
            *(uint2 *)((__nv_bfloat16 *)x + g) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
        else
            *(float4 *)((float *)x + g) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) /* unrolled, so that v stays in registers */
        if (k < G && k < n) st1(x, g + k, bf16, v[k]);
}

/* The largest magnitude of a group as fp32 bits (a NaN's bits lie above Inf's; padding zeros do
 * not count). */
static __device__ __forceinline__ unsigned group_amax_bits(fsdp_raw8 r, int bf16) {
    if (bf16) {
        const unsigned m = __vmaxu2(__vmaxu2(r.lo.x & 0x7fff7fffu, r.lo.y & 0x7fff7fffu),
                                    __vmaxu2(r.lo.z & 0x7fff7fffu, r.lo.w & 0x7fff7fffu));
        return max(m << 16, m & 0xffff0000u);
    }
    const unsigned a = max(r.lo.x & 0x7fffffffu, r.lo.y & 0x7fffffffu), b = max(r.lo.z & 0x7fffffffu, r.lo.w & 0x7fffffffu);
    const unsigned c = max(r.hi.x & 0x7fffffffu, r.hi.y & 0x7fffffffu), d = max(r.hi.z & 0x7fffffffu, r.hi.w & 0x7fffffffu);
    return max(max(a, b), max(c, d));
}

/* The n <= G codes at p (aligned to G bytes), zeros past n: .x codes 0-3, .y codes 4-7. */
static __device__ __forceinline__ uint2 load_codes(const uint8_t *p, int G, int n) {
    if (n == G) return G == 8 ? *(const uint2 *)p : make_uint2(*(const unsigned *)p, 0u);
    unsigned long long w = 0;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < G && k < n) w |= (unsigned long long)p[k] << (8 * k);
    return make_uint2((unsigned)w, (unsigned)(w >> 32));
}

static __device__ __forceinline__ void store_codes(uint8_t *p, int G, int n, uint2 c) {
    if (n == G) {
        if (G == 8)
            *(uint2 *)p = c;
        else
            *(unsigned *)p = c.x;
        return;
    }
    const unsigned long long w = (unsigned long long)c.y << 32 | c.x;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < G && k < n) p[k] = (uint8_t)(w >> (8 * k));
}

static __device__ __forceinline__ void decode_group(uint2 c, float scale, int G, int t, float *v) {
    decode4(c.x, scale, t, v);
    if (G == 8) decode4(c.y, scale, t, v + 4);
}

/* Where group h of this lane lies in block b of a piece of `count`: from *e on, G elements or fewer
 * (none) in a ragged last block. */
static __device__ __forceinline__ int lane_group(size_t b, int h, int G, size_t count, size_t *e) {
    *e = b * FSDP_QUANT_BLOCK + (size_t)h * 32 * G + (size_t)(threadIdx.x & 31) * G;
    return *e < count ? (int)(count - *e < (size_t)G ? count - *e : (size_t)G) : 0;
}

/* ---- where a warp's blocks are ------------------------------------------------------------------- */

/* Block b of piece p, stepped through consecutive blocks without dividing again. */
typedef struct {
    size_t p, b;
} block_pos;

static __device__ __forceinline__ block_pos block_at(size_t q, size_t per_piece) {
    block_pos pos;
    pos.p = q / per_piece;
    pos.b = q - pos.p * per_piece;
    return pos;
}

/* ---- quantize ------------------------------------------------------------------------------------- */

/* Blocks a warp takes at a time: 64 bytes of source a lane in flight. */
#define QUANT_MAX_UNROLL 4
static __host__ __device__ __forceinline__ int quant_unroll(int bf16) { return bf16 ? 4 : 2; }

typedef struct {
    uint8_t *dst;
    const void *src;
    size_t count, valid;     /* elements per piece; source elements readable */
    size_t per_piece, total; /* blocks per piece; blocks in all */
    size_t piece_bytes, scales;
    float max_finite;
} quant_args;

/* The bytes of a piece that belong to no code and no scale. */
static __device__ void zero_padding(uint8_t *piece, const quant_args &a) {
    for (size_t i = a.count; i < a.scales; i++) piece[i] = 0;
    for (size_t i = a.scales + a.per_piece * sizeof(float); i < a.piece_bytes; i++) piece[i] = 0;
}

/* Source group h of this lane in block b of the piece starting at source element `first`. */
static __device__ __forceinline__ fsdp_raw8 quant_load(const quant_args &a, size_t first, size_t b, int h, int sbf,
                                                       int vec) {
    const int G = group_size(sbf);
    size_t e;
    const int n = lane_group(b, h, G, a.count, &e);
    const size_t g = first + e;
    const int readable = g < a.valid ? (int)(a.valid - g < (size_t)n ? a.valid - g : (size_t)n) : 0;
    return load_group(a.src, g, G, readable, sbf, vec);
}

/* Block b of `piece` from the lane's groups: m is the block's amax bits (Inf for NaN or Inf), scale
 * and inv its fl(amax / max_finite) and fl(max_finite / amax). */
static __device__ __forceinline__ void quantize_block(const quant_args &a, uint8_t *piece, size_t b,
                                                      const fsdp_raw8 *raw, unsigned m, float scale, float inv,
                                                      int sbf, int t) {
    const int G = group_size(sbf), H = 8 / G;
    uint2 codes[2] = {make_uint2(0u, 0u), make_uint2(0u, 0u)};
    if (m == INF_BITS) {
        scale = __uint_as_float(QUANT_NAN_BITS);
    } else if (m == 0 || __float_as_uint(inv) == INF_BITS) { /* a zero block, or one too small to scale */
        scale = 0.0f;
    } else {
#pragma unroll
        for (int h = 0; h < H; h++) {
            float y[8];
            unpack8(raw[h], sbf, y);
#pragma unroll
            for (int k = 0; k < 8; k++) y[k] = __fmul_rn(y[k], inv);
            codes[h] = make_uint2(encode4(y, t), G == 8 ? encode4(y + 4, t) : 0u);
        }
    }
#pragma unroll
    for (int h = 0; h < H; h++) {
        size_t e;
        const int n = lane_group(b, h, G, a.count, &e);
        store_codes(piece + e, G, n, codes[h]);
    }
    if ((threadIdx.x & 31) == 0) {
        ((float *)(piece + a.scales))[b] = scale;
        if (b == a.per_piece - 1) zero_padding(piece, a);
    }
}

static __device__ __forceinline__ void quantize_body(const quant_args &a, int sbf, int t, int vec) {
    const int U = quant_unroll(sbf), H = 8 / group_size(sbf), lane = threadIdx.x & 31;
    const size_t nwarps = (size_t)gridDim.x * QUANT_WARPS, groups = (a.total + U - 1) / U;
    /* g is the same on every lane of a warp, so the warp reductions see all 32 lanes. */
    for (size_t g = (size_t)blockIdx.x * QUANT_WARPS + threadIdx.x / 32; g < groups; g += nwarps) {
        const size_t q0 = g * U;
        const block_pos pos0 = block_at(q0, a.per_piece);
        block_pos pos = pos0;
        size_t first = pos.p * a.count; /* the piece's first source element */
        fsdp_raw8 raw[QUANT_MAX_UNROLL][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int h = 0; h < H; h++)
                raw[u][h] = q0 + u < a.total ? quant_load(a, first, pos.b, h, sbf, vec) : fsdp_raw8{};
            if (++pos.b == a.per_piece) pos.b = 0, first += a.count;
        }
        unsigned m[QUANT_MAX_UNROLL];
#pragma unroll
        for (int u = 0; u < U; u++) {
            unsigned mine = group_amax_bits(raw[u][0], sbf);
            if (H == 2) mine = max(mine, group_amax_bits(raw[u][1], sbf));
            m[u] = min(__reduce_max_sync(0xffffffffu, mine), INF_BITS);
        }
        /* All the divisions at once: lane u < 16 divides for block u % U its amax by max_finite
         * (the scale), lane 16 + u max_finite by its amax (the scaling factor). */
        unsigned mine = m[0];
#pragma unroll
        for (int u = 1; u < U; u++)
            if ((lane & (U - 1)) == u) mine = m[u];
        const float am = __uint_as_float(mine);
        const float r = __fdiv_rn(lane < 16 ? am : a.max_finite, lane < 16 ? a.max_finite : am);
        pos = pos0; /* the same blocks again: cheaper than keeping where each one goes */
        uint8_t *piece = a.dst + pos.p * a.piece_bytes;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const float scale = __shfl_sync(0xffffffffu, r, u), inv = __shfl_sync(0xffffffffu, r, 16 + u);
            if (q0 + u < a.total) quantize_block(a, piece, pos.b, raw[u], m[u], scale, inv, sbf, t);
            if (++pos.b == a.per_piece) pos.b = 0, piece += a.piece_bytes;
        }
    }
}

/* One kernel per variant (mode: bit 0 source bf16, bit 1 vector loads, bits 2-3 code dtype -
 * FSDP_I8) rather than one switching on the mode: each then gets the registers it needs, not the
 * greediest variant's, and more warps fit on an SM. */
#define QUANT_KERNEL(m)                                                                              \
    static __global__ void __launch_bounds__(QUANT_THREADS) quantize_kernel_##m(quant_args a) {      \
        quantize_body(a, (m) & 1, FSDP_I8 + ((m) >> 2), ((m) >> 1) & 1);                            \
    }
QUANT_KERNEL(0) QUANT_KERNEL(1) QUANT_KERNEL(2) QUANT_KERNEL(3) QUANT_KERNEL(4) QUANT_KERNEL(5)
QUANT_KERNEL(6) QUANT_KERNEL(7) QUANT_KERNEL(8) QUANT_KERNEL(9) QUANT_KERNEL(10) QUANT_KERNEL(11)
#undef QUANT_KERNEL
static void (*const quantize_kernels[12])(quant_args) = {
    quantize_kernel_0, quantize_kernel_1, quantize_kernel_2, quantize_kernel_3, quantize_kernel_4,  quantize_kernel_5,
    quantize_kernel_6, quantize_kernel_7, quantize_kernel_8, quantize_kernel_9, quantize_kernel_10, quantize_kernel_11};

/* ---- dequantize ----------------------------------------------------------------------------------- */

#define DEQUANT_UNROLL 4 /* blocks a warp takes at a time */

typedef struct {
    void *dst;
    const uint8_t *src;
    size_t count, per_piece, total, piece_bytes, scales;
} dequant_args;

static __device__ __forceinline__ void dequantize_body(const dequant_args &a, int dbf, int t, int vec) {
    const int G = group_size(dbf), H = 8 / G;
    const size_t nwarps = (size_t)gridDim.x * QUANT_WARPS;
    const size_t groups = (a.total + DEQUANT_UNROLL - 1) / DEQUANT_UNROLL;
    for (size_t g = (size_t)blockIdx.x * QUANT_WARPS + threadIdx.x / 32; g < groups; g += nwarps) {
        const size_t q0 = g * DEQUANT_UNROLL;
        const block_pos pos0 = block_at(q0, a.per_piece);
        block_pos pos = pos0;
        const uint8_t *piece = a.src + pos.p * a.piece_bytes;
        uint2 codes[DEQUANT_UNROLL][2];
        float scale[DEQUANT_UNROLL];
#pragma unroll
        for (int u = 0; u < DEQUANT_UNROLL; u++) {
            const int in = q0 + u < a.total;
#pragma unroll
            for (int h = 0; h < H; h++) {
                size_t e;
                const int n = in ? lane_group(pos.b, h, G, a.count, &e) : 0;
                codes[u][h] = n > 0 ? load_codes(piece + e, G, n) : make_uint2(0u, 0u);
            }
            scale[u] = in ? ((const float *)(piece + a.scales))[pos.b] : 0.0f;
            if (++pos.b == a.per_piece) pos.b = 0, piece += a.piece_bytes;
        }
        pos = pos0;
        size_t first = pos.p * a.count; /* the piece's first output element */
#pragma unroll
        for (int u = 0; u < DEQUANT_UNROLL; u++) {
            if (q0 + u < a.total) {
#pragma unroll
                for (int h = 0; h < H; h++) {
                    size_t e;
                    const int n = lane_group(pos.b, h, G, a.count, &e);
                    float v[8];
                    decode_group(codes[u][h], scale[u], G, t, v);
                    if (n > 0) store_group(a.dst, first + e, G, n, dbf, vec, v);
                }
            }
            if (++pos.b == a.per_piece) pos.b = 0, first += a.count;
        }
    }
}

/* mode: bit 0 destination bf16, bit 1 vector stores, bits 2-3 code dtype - FSDP_I8. */
#define DEQUANT_KERNEL(m)                                                                            \
    static __global__ void __launch_bounds__(QUANT_THREADS) dequantize_kernel_##m(dequant_args a) {  \
        dequantize_body(a, (m) & 1, FSDP_I8 + ((m) >> 2), ((m) >> 1) & 1);                          \
    }
DEQUANT_KERNEL(0) DEQUANT_KERNEL(1) DEQUANT_KERNEL(2) DEQUANT_KERNEL(3) DEQUANT_KERNEL(4) DEQUANT_KERNEL(5)
DEQUANT_KERNEL(6) DEQUANT_KERNEL(7) DEQUANT_KERNEL(8) DEQUANT_KERNEL(9) DEQUANT_KERNEL(10) DEQUANT_KERNEL(11)
#undef DEQUANT_KERNEL
static void (*const dequantize_kernels[12])(dequant_args) = {
    dequantize_kernel_0, dequantize_kernel_1, dequantize_kernel_2, dequantize_kernel_3,
    dequantize_kernel_4, dequantize_kernel_5, dequantize_kernel_6, dequantize_kernel_7,
    dequantize_kernel_8, dequantize_kernel_9, dequantize_kernel_10, dequantize_kernel_11};

/* ---- sum_pieces ----------------------------------------------------------------------------------- */

/* A warp sums a span of 512 outputs (two blocks): lane l holds K = 16 / G groups of G, group k at
 * 32 * G * k + G * l, G set by the destination's dtype. */
#define SUM_SPAN 512
#define SUM_MAX_GROUPS 4
#define SUM_MAX_BATCH 4
/* Pieces whose loads are issued together before the first is added: about 64 bytes a lane in
 * flight. */
static __device__ __forceinline__ int sum_batch(int st) { return st == FSDP_F32 ? 1 : st == FSDP_BF16 ? 2 : 4; }

typedef struct {
    void *dst;
    const void *src;
    size_t count, piece_bytes, scales; /* piece_bytes and scales: blockwise sources only */
    int pieces, accumulate;
} sum_args;

/* A lane's groups of one piece as loaded: plain values, or codes and the scales of the span's two
 * blocks (the variant's literal st leaves the other fields unused). */
typedef struct {
    fsdp_raw8 g[SUM_MAX_GROUPS];
    uint2 codes[SUM_MAX_GROUPS];
    float scale[2];
} piece_groups;

/* st: the source's fsdp_dtype; group k starts at element e[k] of the piece and has n[k] elements. */
static __device__ __forceinline__ void piece_load(const sum_args &a, int p, const size_t *e, const int *n, int G,
                                                  int st, int vec, piece_groups &c) {
    const int K = 16 / G;
    if (st == FSDP_F32 || st == FSDP_BF16) {
#pragma unroll
        for (int k = 0; k < K; k++) c.g[k] = load_group(a.src, (size_t)p * a.count + e[k], G, n[k], st == FSDP_BF16, vec);
        return;
    }
    const uint8_t *piece = (const uint8_t *)a.src + (size_t)p * a.piece_bytes;
#pragma unroll
    for (int k = 0; k < K; k++) c.codes[k] = n[k] > 0 ? load_codes(piece + e[k], G, n[k]) : make_uint2(0u, 0u);
    /* Groups 0 .. K/2 - 1 lie in the span's first block, the rest in its second (when the piece has
     * it: lane 0's group K/2 starts it). Every lane loads the same two scales. */
    const float *scales = (const float *)(piece + a.scales) + e[0] / FSDP_QUANT_BLOCK;
    const size_t second = e[K / 2] - (size_t)(threadIdx.x & 31) * G;
    c.scale[0] = scales[0];
    c.scale[1] = second < a.count ? scales[1] : 0.0f;
}

/* acc += the groups' values, in fp32, each addition rounded. */
static __device__ __forceinline__ void piece_add(float (*acc)[8], const piece_groups &c, int G, int st) {
    const int K = 16 / G;
#pragma unroll
    for (int k = 0; k < K; k++) {
        float v[8];
        if (st == FSDP_F32 || st == FSDP_BF16)
            unpack8(c.g[k], st == FSDP_BF16, v);
        else
            decode_group(c.codes[k], c.scale[k < K / 2 ? 0 : 1], G, st, v);
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (i < G) acc[k][i] = __fadd_rn(acc[k][i], v[i]);
    }
}

static __device__ __forceinline__ void sum_body(const sum_args &a, int dbf, int st, int vec) {
    const int G = group_size(dbf), K = 16 / G, batch = sum_batch(st), lane = threadIdx.x & 31;
    const size_t spans = (a.count + SUM_SPAN - 1) / SUM_SPAN, nwarps = (size_t)gridDim.x * (blockDim.x / 32);
    for (size_t s = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; s < spans; s += nwarps) {
        size_t e[SUM_MAX_GROUPS];
        int n[SUM_MAX_GROUPS];
        float acc[SUM_MAX_GROUPS][8];
#pragma unroll
        for (int k = 0; k < K; k++) {
            e[k] = s * SUM_SPAN + (size_t)k * 32 * G + (size_t)lane * G;
            n[k] = e[k] < a.count ? (int)(a.count - e[k] < (size_t)G ? a.count - e[k] : (size_t)G) : 0;
            if (a.accumulate)
                unpack8(load_group(a.dst, e[k], G, n[k], dbf, vec), dbf, acc[k]);
            else
#pragma unroll
                for (int i = 0; i < 8; i++) acc[k][i] = 0.0f;
        }
        for (int p = 0; p < a.pieces; p += batch) {
            piece_groups c[SUM_MAX_BATCH];
#pragma unroll
            for (int u = 0; u < batch; u++)
                if (p + u < a.pieces) piece_load(a, p + u, e, n, G, st, vec, c[u]);
#pragma unroll
            for (int u = 0; u < batch; u++) /* in piece order */
                if (p + u < a.pieces) piece_add(acc, c[u], G, st);
        }
#pragma unroll
        for (int k = 0; k < K; k++)
            if (n[k] > 0) store_group(a.dst, e[k], G, n[k], dbf, vec, acc[k]);
    }
}

/* mode: bit 0 destination bf16, bit 1 vector path, bits 2-4 the source's fsdp_dtype. */
#define SUM_KERNEL(m)                                                                                \
    static __global__ void __launch_bounds__(SUM_THREADS) sum_pieces_kernel_##m(sum_args a) {        \
        sum_body(a, (m) & 1, (m) >> 2, ((m) >> 1) & 1);                                              \
    }
SUM_KERNEL(0) SUM_KERNEL(1) SUM_KERNEL(2) SUM_KERNEL(3) SUM_KERNEL(4) SUM_KERNEL(5) SUM_KERNEL(6)
SUM_KERNEL(7) SUM_KERNEL(8) SUM_KERNEL(9) SUM_KERNEL(10) SUM_KERNEL(11) SUM_KERNEL(12) SUM_KERNEL(13)
SUM_KERNEL(14) SUM_KERNEL(15) SUM_KERNEL(16) SUM_KERNEL(17) SUM_KERNEL(18) SUM_KERNEL(19)
#undef SUM_KERNEL
static void (*const sum_pieces_kernels[20])(sum_args) = {
    sum_pieces_kernel_0,  sum_pieces_kernel_1,  sum_pieces_kernel_2,  sum_pieces_kernel_3,  sum_pieces_kernel_4,
    sum_pieces_kernel_5,  sum_pieces_kernel_6,  sum_pieces_kernel_7,  sum_pieces_kernel_8,  sum_pieces_kernel_9,
    sum_pieces_kernel_10, sum_pieces_kernel_11, sum_pieces_kernel_12, sum_pieces_kernel_13, sum_pieces_kernel_14,
    sum_pieces_kernel_15, sum_pieces_kernel_16, sum_pieces_kernel_17, sum_pieces_kernel_18, sum_pieces_kernel_19};

/* ---- host side ------------------------------------------------------------------------------------ */

static void require_plain(fsdp_dtype t, const char *op, const char *side) {
    if (fsdp_dtype_blockwise(t))
        fsdp_fatal("internal error: %s with a blockwise %s (%s); that side must be fp32 or bf16", op, side,
                   fsdp_dtype_name(t));
}

/* Codes are loaded 8 bytes at a time and scales as floats: pieces start on 16-byte boundaries. */
static void require_aligned_pieces(const void *p, const char *op) {
    if (!fsdp_cuda_aligned16(p))
        fsdp_fatal("internal error: %s of blockwise pieces at %p, which is not 16-byte aligned", op, p);
}

static size_t blocks_of(size_t count) { return (count + FSDP_QUANT_BLOCK - 1) / FSDP_QUANT_BLOCK; }

static int is_bf16(fsdp_dtype t) { return t == FSDP_BF16; }

/* Quantize into a plain dtype: a cast of what is valid, zeros after it. */
static void cast_pieces(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t n, size_t valid,
                        cudaStream_t s) {
    const size_t cast = valid < n ? valid : n, bytes = fsdp_dtype_info_of(dst_t)->bytes;
    if (cast) fsdp_cuda_cast(dst, dst_t, src, src_t, cast, s);
    if (cast == n) return;
    cudaError_t e = cudaMemsetAsync((char *)dst + cast * bytes, 0, (n - cast) * bytes, s);
    if (e != cudaSuccess) fsdp_fatal("kernel quantize failed to launch: cudaMemsetAsync: %s", cudaGetErrorString(e));
}

extern "C" void fsdp_cuda_quantize(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                                   int pieces, size_t valid, cudaStream_t s) {
    require_plain(src_t, "quantize", "source");
    if (count == 0 || pieces <= 0) return;
    if (!fsdp_dtype_blockwise(dst_t)) {
        cast_pieces(dst, dst_t, src, src_t, (size_t)pieces * count, valid, s);
        return;
    }
    require_aligned_pieces(dst, "quantize");
    quant_args a;
    a.dst = (uint8_t *)dst, a.src = src, a.count = count, a.valid = valid;
    a.per_piece = blocks_of(count), a.total = (size_t)pieces * a.per_piece;
    a.piece_bytes = fsdp_dtype_piece_bytes(dst_t, count), a.scales = fsdp_dtype_scales_offset(count);
    a.max_finite = fsdp_dtype_info_of(dst_t)->max_finite;
    /* Groups of G elements of a piece stay aligned when the pieces of the plain side do. */
    const int vec = fsdp_cuda_aligned16(src) && count % (is_bf16(src_t) ? 8 : 4) == 0;
    const int mode = is_bf16(src_t) | vec << 1 | (int)(dst_t - FSDP_I8) << 2;
    const size_t groups = (a.total + quant_unroll(is_bf16(src_t)) - 1) / quant_unroll(is_bf16(src_t));
    quantize_kernels[mode]<<<fsdp_cuda_grid(groups, QUANT_WARPS), QUANT_THREADS, 0, s>>>(a);
    fsdp_cuda_check_launch("quantize");
}

extern "C" void fsdp_cuda_dequantize(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                                     int pieces, cudaStream_t s) {
    require_plain(dst_t, "dequantize", "destination");
    if (count == 0 || pieces <= 0) return;
    if (!fsdp_dtype_blockwise(src_t)) {
        fsdp_cuda_cast(dst, dst_t, src, src_t, (size_t)pieces * count, s);
        return;
    }
    require_aligned_pieces(src, "dequantize");
    dequant_args a;
    a.dst = dst, a.src = (const uint8_t *)src, a.count = count;
    a.per_piece = blocks_of(count), a.total = (size_t)pieces * a.per_piece;
    a.piece_bytes = fsdp_dtype_piece_bytes(src_t, count), a.scales = fsdp_dtype_scales_offset(count);
    const int vec = fsdp_cuda_aligned16(dst) && count % (is_bf16(dst_t) ? 8 : 4) == 0;
    const int mode = is_bf16(dst_t) | vec << 1 | (int)(src_t - FSDP_I8) << 2;
    const size_t groups = (a.total + DEQUANT_UNROLL - 1) / DEQUANT_UNROLL;
    dequantize_kernels[mode]<<<fsdp_cuda_grid(groups, QUANT_WARPS), QUANT_THREADS, 0, s>>>(a);
    fsdp_cuda_check_launch("dequantize");
}

extern "C" void fsdp_cuda_sum_pieces(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                                     int pieces, int accumulate, cudaStream_t s) {
    require_plain(dst_t, "sum_pieces", "destination");
    if (count == 0) return;
    if (pieces <= 0 && accumulate) return; /* dst already is its own sum */
    const int blockwise = fsdp_dtype_blockwise(src_t);
    if (blockwise) require_aligned_pieces(src, "sum_pieces");
    sum_args a;
    a.dst = dst, a.src = src, a.count = count, a.pieces = pieces < 0 ? 0 : pieces, a.accumulate = accumulate;
    a.piece_bytes = blockwise ? fsdp_dtype_piece_bytes(src_t, count) : 0;
    a.scales = blockwise ? fsdp_dtype_scales_offset(count) : 0;
    /* Groups are aligned in dst and in pieces of codes wherever they start, in plain pieces when
     * each piece is. */
    const int vec = fsdp_cuda_aligned16(dst) && (blockwise || (fsdp_cuda_aligned16(src) && count % 8 == 0));
    const int mode = is_bf16(dst_t) | vec << 1 | (int)src_t << 2;
    const size_t spans = (count + SUM_SPAN - 1) / SUM_SPAN;
    sum_pieces_kernels[mode]<<<fsdp_cuda_grid(spans, SUM_THREADS / 32), SUM_THREADS, 0, s>>>(a);
    fsdp_cuda_check_launch("sum_pieces");
}
