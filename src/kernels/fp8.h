/* FP8 matrix products: the scaling recipes, the scaling arithmetic, and the CPU reference of the
 * casts and of the products (src/kernels/cpu/fp8.c). The CUDA twins are in fp8_cuda.h.
 *
 * Scaling is torchao's float8 "dynamic" recipe (torchao/float8/float8_utils.py, which torchtitan's
 * --float8 drives), computed the same way here and on the GPU, bit for bit:
 *   amax  = max |x| over the tensor (tensorwise) or over each row of an operand along the product's
 *           reduction dimension (rowwise); a NaN counts above every number, so amax is NaN then;
 *   scale = (float)(fp8_max / max(amax, 1e-12)), the division in double as torchao does it (1e-12 is
 *           torchao's EPS: an all-zero tensor gets a large finite scale and codes 0); optionally
 *           rounded down to a power of two (torchao's rowwise recipe does, so that scaling is exact);
 *   code  = encode(x * scale): the product in fp32, then round-to-nearest-even with saturation to
 *           +-fp8_max (fsdp_encode_code; torchao's clamp-then-cast), NaN stays NaN;
 *   value = decode(code) * inv_scale, inv_scale = 1.0f / scale: what cuBLASLt multiplies the
 *           product by (its A/B scale pointers), and what torchao hands torch._scaled_mm.
 * An Inf in the tensor gives scale 0 (fp8_max / Inf), its x * 0 codes NaN and the product is NaN, as
 * a NaN's is: a non-finite input stays non-finite, so the step is skipped as in bf16.
 *
 * The three products of a linear layer y = x W^T (x [N, C], W [OC, C], dy [N, OC]), each "TN" as
 * cuBLASLt's FP8 kernels need it (both operands contiguous along the reduction dimension):
 *   forward  y[N, OC]  = x  . W^T   operands x [N, C]   and W  [OC, C]   (reduction over C)
 *   input    dx[N, C]  = dy . W     operands dy [N, OC] and W^T [C, OC]  (reduction over OC)
 *   weight   dW[OC, C] = dy^T . x   operands dy^T [OC, N] and x^T [C, N] (reduction over N)
 * so W^T, dy^T and x^T are cast with a transpose (the cast writes them; no separate pass). Rowwise
 * scales are per row of each operand as written: x's rows and W's rows in the forward, dy's rows and
 * W's columns for dx, dy's columns and x's columns for dW. Every one of N, C, OC is the reduction
 * dimension of one product, so all three must be multiples of 16 (fsdp_fp8_shape_ok).
 *
 * The product in fp32: acc[r, c] = sum_k decode(a[r, k]) decode(b[c, k]) (each term exact in fp32),
 * then out = (inv_a[r] * inv_b[c]) * acc (+ bias[c]) (+ beta * out before), relu. The CPU sums k in
 * a fixed order; the GPU's tensor cores in their own, which is the only difference. */
#ifndef FSDP_KERNELS_FP8_H
#define FSDP_KERNELS_FP8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define FSDP_FP8_HD __host__ __device__
#else
#define FSDP_FP8_HD
#endif

/* torchao's EPS: the smallest amax a scale is computed from. */
#define FSDP_FP8_EPS 1e-12
/* cuBLASLt's FP8 kernels want every dimension a multiple of 16 (torch._scaled_mm asks the same). */
#define FSDP_FP8_DIM_MULTIPLE 16
/* A product's saved amax: [0] the input's, [1] the weight's. */
#define FSDP_FP8_SAVED_AMAX 2

typedef enum {
    FSDP_FP8_NONE = 0,       /* bf16 products */
    FSDP_FP8_TENSORWISE = 1, /* one scale per operand */
    FSDP_FP8_ROWWISE = 2     /* one scale per row of each operand along the reduction dimension */
} fsdp_fp8_granularity;

/* The amax a tensorwise FP8 product of a linear layer shares with the kernels around it, so that
 * no pass over memory measures a tensor whose amax is known; rowwise products ignore it (their
 * scales are per row). Each pointer is NULL or fp32 in the backend's memory:
 *   inp:   max |inp|, reported by the kernel that wrote inp (a norm, SwiGLU);
 *   dout:  max |dout|, reported by the kernel that wrote dout (SwiGLU's backward);
 *   saved: FSDP_FP8_SAVED_AMAX floats that the forward fills with the amax of inp and of the weight
 *          and the backward of the same two tensors reads for x^T and W^T (a tensor's amax is its
 *          transpose's). inp may point at saved[0]. */
typedef struct {
    const float *inp, *dout;
    float *saved;
} fsdp_fp8_amax;
/* Nothing shared: every amax measured where it is needed. */
#define FSDP_FP8_AMAX_NONE ((fsdp_fp8_amax){NULL, NULL, NULL})

/* How the three products of a layer are computed. */
typedef struct {
    fsdp_fp8_granularity granularity;
    fsdp_dtype grad_t; /* dy's codes in the two backward products: FSDP_E4M3 or FSDP_E5M2 */
    int pow2_scales;   /* round every scale down to a power of two */
} fsdp_fp8_recipe;

/* torchao's presets (Float8LinearRecipeName): "tensorwise" is e4m3 everywhere with exact scales;
 * "rowwise" is e4m3 everywhere with scales rounded down to powers of two. */
static inline fsdp_fp8_recipe fsdp_fp8_recipe_of(fsdp_fp8_granularity g) {
    fsdp_fp8_recipe r = {g, FSDP_E4M3, g == FSDP_FP8_ROWWISE};
    return r;
}
/* "none", "tensorwise", "rowwise" -> the granularity; -1 for anything else. */
int fsdp_fp8_parse(const char *text, fsdp_fp8_granularity *out);
const char *fsdp_fp8_name(fsdp_fp8_granularity g);

/* 1 when a layer of these dimensions can run its products in FP8 (all multiples of 16). */
static inline int fsdp_fp8_shape_ok(long N, long C, long OC) {
    return N > 0 && C > 0 && OC > 0 && N % FSDP_FP8_DIM_MULTIPLE == 0 && C % FSDP_FP8_DIM_MULTIPLE == 0 &&
           OC % FSDP_FP8_DIM_MULTIPLE == 0;
}

/* Scratch of a layer's FP8 ops on a GPU (src/backend/cuda_fp8.c), in bytes, each part 256-byte
 * aligned. The forward: x's and W's codes, three fp32 arrays (amax, scale, inverse) of N and OC
 * values. The backward: dy's codes in both layouts (one pass writes both), W^T's and x^T's codes,
 * and three arrays of N, OC, C and C values. With `epilogue` (rowwise scales applied outside
 * cuBLASLt) also the largest fp32 product. */
static inline size_t fsdp_fp8_align256(size_t n) { return (n + 255) & ~(size_t)255; }
static inline size_t fsdp_fp8_forward_scratch(long N, long C, long OC, int epilogue) {
    size_t bytes = fsdp_fp8_align256((size_t)N * C) + fsdp_fp8_align256((size_t)OC * C);
    bytes += 3 * (fsdp_fp8_align256((size_t)N * 4) + fsdp_fp8_align256((size_t)OC * 4));
    return bytes + (epilogue ? fsdp_fp8_align256((size_t)N * OC * 4) : 0);
}
static inline size_t fsdp_fp8_backward_scratch(long N, long C, long OC, int epilogue) {
    size_t bytes = 2 * fsdp_fp8_align256((size_t)N * OC) + fsdp_fp8_align256((size_t)OC * C) +
                   fsdp_fp8_align256((size_t)C * N);
    bytes += 3 * (fsdp_fp8_align256((size_t)N * 4) + fsdp_fp8_align256((size_t)OC * 4) +
                  2 * fsdp_fp8_align256((size_t)C * 4));
    const size_t dx = (size_t)N * C * 4, dw = (size_t)OC * C * 4;
    return bytes + (epilogue ? fsdp_fp8_align256(dx > dw ? dx : dw) : 0);
}
/* The most a layer's FP8 ops ask for (the forward and the backward run one after the other). */
static inline size_t fsdp_fp8_layer_scratch(long N, long C, long OC, int epilogue) {
    size_t f = fsdp_fp8_forward_scratch(N, C, OC, epilogue), b = fsdp_fp8_backward_scratch(N, C, OC, epilogue);
    return f > b ? f : b;
}

/* ---- product weights cast once per gather ----
 *
 * With --gather-dtype fp8 and tensorwise products, the weights of the block's products travel as
 * e4m3 codes with one scale per weight (torchao's float8 all-gather): each rank measures the amax of
 * its part of every weight after the update, the amaxes are all-gathered, and every rank computes
 * the same scale from their maximum and encodes its part with it, straight from the master weights.
 * The gathered codes then feed the products as they are (W for the forward, W^T, one transpose of
 * the codes, for the input gradient): no product casts its weight (src/shard/engine.h).
 *
 * A weight inside a unit's flat buffer: W [rows, cols] row-major from element `offset` (rows = the
 * product's OC, cols its C). */
typedef struct {
    int64_t offset;
    int rows, cols;
} fsdp_fp8_matrix;
/* Weights per unit that can travel so (a block's four products). */
#define FSDP_FP8_MAX_MATRICES 4
/* A weight's scales, FSDP_FP8_SCALES floats: the inverse scale (1.0f / scale), the scale (fsdp_fp8_scale)
 * and the amax they come from, as a tensorwise cast computes them. The inverse scale comes first and
 * the weights' scales lie FSDP_FP8_SCALES_STRIDE floats (256 bytes) apart: cuBLASLt reads it through
 * its scale pointer, which it wants aligned as its operands are. */
#define FSDP_FP8_SCALES 3
#define FSDP_FP8_SCALES_STRIDE 64
/* A weight already in e4m3 for the products: codes [rows, cols] (the forward's W), codes_t [cols, rows]
 * (W^T, for dx), and its FSDP_FP8_SCALES floats; all in the backend's memory. */
typedef struct {
    const uint8_t *codes, *codes_t;
    const float *scales;
} fsdp_fp8_weight;

/* ---- the scaling arithmetic (host and device) ---- */

static FSDP_FP8_HD inline uint32_t fsdp_fp8_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static FSDP_FP8_HD inline float fsdp_fp8_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The largest power of two not above s, for s > 0 finite; s itself otherwise (0, Inf, NaN). Exact,
 * where torchao's exp2(floor(log2(s))) goes through a rounded log. */
static FSDP_FP8_HD inline float fsdp_fp8_pow2_floor(float s) {
    uint32_t u = fsdp_fp8_bits(s);
    if ((u & 0x7f800000u) == 0x7f800000u || (u & 0x7fffffffu) == 0) return s;
    if (u & 0x7f800000u) return fsdp_fp8_from_bits(u & 0xff800000u);
    uint32_t m = u & 0x007fffffu, top = 0x00400000u; /* subnormal: keep the highest set bit */
    while (!(m & top)) top >>= 1;
    return fsdp_fp8_from_bits((u & 0x80000000u) | top);
}

/* The scale that maps amax onto fp8_max (header comment); amax >= 0 or NaN. */
static FSDP_FP8_HD inline float fsdp_fp8_scale(float amax, float fp8_max, int pow2) {
    double a = (double)amax;
    if (a < FSDP_FP8_EPS) a = FSDP_FP8_EPS; /* a NaN compares false and stays NaN */
    float s = (float)((double)fp8_max / a);
    return pow2 ? fsdp_fp8_pow2_floor(s) : s;
}

/* ---- CPU reference (src/kernels/cpu/fp8.c) ----
 *
 * A cast reads src[R, Cc] (fp32 values, row-major) and writes codes of dtype t (FSDP_E4M3 or
 * FSDP_E5M2) as [R, Cc], or transposed as [Cc, R] when `transpose` is set. Its scales are per
 * tensor (1), or per row of the codes as written: per row of src (R of them) without transpose, per
 * column of src (Cc) with it; `rowwise` picks. scale[] and inv_scale[] get them; amax_in, when not
 * NULL, holds the amax values to use instead of computing them (the entry point through which a
 * kernel that produced src reports its amax), else amax_out (when not NULL) gets the computed ones. */
void cpu_fp8_amax(float *amax, const float *src, int R, int Cc, int transpose, int rowwise);
void cpu_fp8_cast(uint8_t *codes, float *scale, float *inv_scale, float *amax_out, const float *src, int R, int Cc,
                  int transpose, int rowwise, fsdp_dtype t, int pow2, const float *amax_in);

/* A weight's scales (FSDP_FP8_SCALES floats: inverse, scale, amax) from the amaxes of its parts: amax =
 * the largest of amax_parts[p * stride] for p < parts (a NaN above every number), then the scale and
 * its inverse of a tensorwise cast to t from that amax. */
void cpu_fp8_scales_of_parts(float *scales, const float *amax_parts, int parts, int stride, fsdp_dtype t);
/* A weight out of gathered pieces (src/base/dtype.h's layout: piece p holds unit elements
 * [p * count, (p + 1) * count), its codes at its start, pieces piece_bytes apart) whose codes were
 * encoded with the weight's scale: codes [rows, cols], codes_t [cols, rows], and the values
 * decode(code) * inv_scale into unit[m->offset ..] (rounded to bf16 when round_bf16; the unit's
 * other elements untouched). */
void cpu_fp8_unpack(uint8_t *codes, uint8_t *codes_t, float *unit, int round_bf16, const uint8_t *pieces,
                    size_t piece_bytes, size_t count, const fsdp_fp8_matrix *m, fsdp_dtype t, float inv_scale);

/* out[R, Cn] = (inv_a[r] * inv_b[c]) * sum_k a[r, k] b[c, k] (+ bias[c]) (+ beta * out) then relu,
 * a [R, K] of a_t, b [Cn, K] of b_t; inv_a has R values when a_rowwise, else 1 (likewise inv_b). */
void cpu_fp8_product(float *out, const uint8_t *a, fsdp_dtype a_t, const float *inv_a, int a_rowwise,
                     const uint8_t *b, fsdp_dtype b_t, const float *inv_b, int b_rowwise, int R, int Cn, int K,
                     const float *bias, float beta, int relu);

/* The layer's products as the backend ops do them (backend.h's matmul_forward_fp8 and
 * matmul_backward_fp8, before the CPU backend's bf16 rounding of outputs): casts, then products.
 * amax: as the backend ops take it (fsdp_fp8_amax), in host memory; w8: NULL, or the weight already
 * cast (tensorwise only), read instead of casting weight. */
void cpu_fp8_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            const float *residual, int N, int C, int OC, int relu, const fsdp_fp8_recipe *r,
                            fsdp_fp8_amax amax, const fsdp_fp8_weight *w8);
void cpu_fp8_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, int N, int C, int OC, const fsdp_fp8_recipe *r,
                             fsdp_fp8_amax amax, const fsdp_fp8_weight *w8);

#ifdef __cplusplus
}
#endif

#endif
