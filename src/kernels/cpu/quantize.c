/* Blockwise quantization, its inverse and the sum of quantized pieces: the reference that
 * src/kernels/cuda/quantize.cu reproduces bit for bit (declarations and promises in ops_cpu.h).
 *
 * Bit-exactness rests on doing every step as one correctly rounded fp32 operation in a fixed order:
 * the block's amax is a maximum (exact), its scale and reciprocal one division each, each scaled
 * value one multiplication, each code fsdp_encode_code's round-to-nearest-even. Products and sums
 * are separate statements and the project builds ISO C11 (gcc then contracts nothing into FMAs).
 * Work is split over OpenMP threads by whole blocks of FSDP_QUANT_BLOCK elements, each computed by
 * one thread, so the thread count changes nothing. */
#include <math.h>
#include <string.h>

#include "../../base/dtype.h"
#include "../ops_cpu.h"
#include "cpu_common.h"

/* The scale of a block holding NaN or Inf: one fixed quiet NaN, so that equal inputs give equal
 * bytes here and on the GPU. */
#define QUANT_NAN_BITS 0x7fc00000u
#define INF_BITS 0x7f800000u

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* |x| as bits, NaN mapped to Inf: the maximum over a block is then Inf exactly when the block holds
 * a non-finite value, and the maximum of non-negative floats is the maximum of their bits. */
static uint32_t magnitude_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= 0x7fffffffu;
    return u > INF_BITS ? INF_BITS : u;
}

static size_t blocks_of(size_t count) { return (count + FSDP_QUANT_BLOCK - 1) / FSDP_QUANT_BLOCK; }

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* One block of `len` codes from its first n values (the rest are zeros: a ragged end past `valid`).
 * Returns the block's scale. */
static float quantize_block(fsdp_dtype t, const float *x, size_t n, size_t len, uint8_t *codes) {
    const float max_finite = fsdp_dtype_info_of(t)->max_finite;
    uint32_t amax_bits = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t m = magnitude_bits(x[i]);
        if (m > amax_bits) amax_bits = m;
    }
    memset(codes, 0, len);
    if (amax_bits == INF_BITS) return from_bits(QUANT_NAN_BITS);
    const float amax = from_bits(amax_bits), inv = max_finite / amax;
    if (amax_bits == 0 || isinf(inv)) return 0.0f; /* nothing to scale, or too little to scale */
    for (size_t i = 0; i < n; i++) {
        const float scaled = x[i] * inv;
        codes[i] = fsdp_encode_code(t, scaled);
    }
    return amax / max_finite;
}

/* Plain pieces are one contiguous run of pieces * count values. */
static void cast_pieces(float *dst, fsdp_dtype dst_t, const float *src, size_t n, size_t valid) {
    const int round = dst_t == FSDP_BF16;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float v = i < valid ? src[i] : 0.0f;
        dst[i] = round ? fsdp_round_bf16(v) : v;
    }
}

/* Zeros in the two paddings of a piece: after its codes and after its scales. */
static void zero_padding(uint8_t *piece, size_t count, size_t piece_bytes) {
    const size_t scales = fsdp_dtype_scales_offset(count), scales_end = scales + blocks_of(count) * sizeof(float);
    memset(piece + count, 0, scales - count);
    memset(piece + scales_end, 0, piece_bytes - scales_end);
}

void cpu_quantize_pieces(void *dst, fsdp_dtype dst_t, const float *src, size_t count, int pieces, size_t valid) {
    if (count == 0 || pieces <= 0) return;
    if (!fsdp_dtype_blockwise(dst_t)) {
        cast_pieces(dst, dst_t, src, (size_t)pieces * count, valid);
        return;
    }
    const size_t piece_bytes = fsdp_dtype_piece_bytes(dst_t, count), scales = fsdp_dtype_scales_offset(count);
    const size_t per_piece = blocks_of(count), total = (size_t)pieces * per_piece;
#pragma omp parallel for schedule(static)
    for (size_t q = 0; q < total; q++) {
        const size_t p = q / per_piece, b = q % per_piece, start = b * FSDP_QUANT_BLOCK;
        const size_t len = min_size(FSDP_QUANT_BLOCK, count - start), first = p * count + start;
        const size_t n = first < valid ? min_size(len, valid - first) : 0;
        uint8_t *piece = (uint8_t *)dst + p * piece_bytes;
        /* src + first is formed only when it is read: past `valid` src may end. */
        const float scale = quantize_block(dst_t, n ? src + first : src, n, len, piece + start);
        memcpy(piece + scales + b * sizeof(float), &scale, sizeof scale);
    }
    for (int p = 0; p < pieces; p++) zero_padding((uint8_t *)dst + (size_t)p * piece_bytes, count, piece_bytes);
}

/* Every code's value, so that decoding costs one load. */
static void decode_table(fsdp_dtype t, float table[256]) {
    for (int c = 0; c < 256; c++) table[c] = fsdp_decode_code(t, (uint8_t)c);
}

/* Element i of piece p of src (src_t blockwise), for i within block b of the piece. */
typedef struct {
    const uint8_t *base;
    size_t piece_bytes, scales;
    float table[256];
} pieces_view;

static void view_init(pieces_view *v, const void *src, fsdp_dtype t, size_t count) {
    v->base = src;
    v->piece_bytes = fsdp_dtype_piece_bytes(t, count);
    v->scales = fsdp_dtype_scales_offset(count);
    decode_table(t, v->table);
}

static float view_scale(const pieces_view *v, size_t p, size_t b) {
    float s;
    memcpy(&s, v->base + p * v->piece_bytes + v->scales + b * sizeof(float), sizeof s);
    return s;
}

static const uint8_t *view_codes(const pieces_view *v, size_t p) { return v->base + p * v->piece_bytes; }

void cpu_dequantize_pieces(float *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                           int pieces) {
    if (count == 0 || pieces <= 0) return;
    if (!fsdp_dtype_blockwise(src_t)) {
        const size_t n = (size_t)pieces * count;
        cast_pieces(dst, dst_t, src, n, n);
        return;
    }
    pieces_view v;
    view_init(&v, src, src_t, count);
    const int round = dst_t == FSDP_BF16;
    const size_t per_piece = blocks_of(count), total = (size_t)pieces * per_piece;
#pragma omp parallel for schedule(static)
    for (size_t q = 0; q < total; q++) {
        const size_t p = q / per_piece, b = q % per_piece, start = b * FSDP_QUANT_BLOCK;
        const size_t len = min_size(FSDP_QUANT_BLOCK, count - start);
        const uint8_t *codes = view_codes(&v, p) + start;
        const float scale = view_scale(&v, p, b);
        float *out = dst + p * count + start;
        for (size_t i = 0; i < len; i++) {
            const float x = v.table[codes[i]] * scale;
            out[i] = round ? fsdp_round_bf16(x) : x;
        }
    }
}

/* acc[i] += element start + i of piece p, for i < len. */
static void add_piece(float *acc, const void *src, fsdp_dtype src_t, const pieces_view *v, size_t count, size_t p,
                      size_t b, size_t len) {
    const size_t start = b * FSDP_QUANT_BLOCK;
    if (!fsdp_dtype_blockwise(src_t)) {
        const float *x = (const float *)src + p * count + start;
        for (size_t i = 0; i < len; i++) acc[i] = acc[i] + x[i];
        return;
    }
    const uint8_t *codes = view_codes(v, p) + start;
    const float scale = view_scale(v, p, b);
    for (size_t i = 0; i < len; i++) {
        const float x = v->table[codes[i]] * scale;
        acc[i] = acc[i] + x;
    }
}

void cpu_sum_pieces(float *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count, int pieces,
                    int accumulate) {
    if (count == 0) return;
    pieces_view v;
    if (fsdp_dtype_blockwise(src_t)) view_init(&v, src, src_t, count);
    const int round = dst_t == FSDP_BF16;
    const size_t nblocks = blocks_of(count);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblocks; b++) {
        const size_t start = b * FSDP_QUANT_BLOCK, len = min_size(FSDP_QUANT_BLOCK, count - start);
        float acc[FSDP_QUANT_BLOCK];
        for (size_t i = 0; i < len; i++) acc[i] = accumulate ? dst[start + i] : 0.0f;
        for (int p = 0; p < pieces; p++) add_piece(acc, src, src_t, &v, count, (size_t)p, b, len);
        for (size_t i = 0; i < len; i++) dst[start + i] = round ? fsdp_round_bf16(acc[i]) : acc[i];
    }
}
