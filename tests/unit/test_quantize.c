/* Checks blockwise quantization (src/kernels/cpu/quantize.c, the reference the CUDA kernels match bit
 * for bit) and the CPU backend's quantize / dequantize / sum_pieces ops and blockwise collectives.
 *
 * Error bounds checked per element, for a block of amax a and stored scale s = fl(a / max_finite):
 *  - int8: |dequantized - x| <= s * (0.5 + 2^-14). Half a code step, plus the rounding of the
 *    scaled value x * fl(127 / a) (at most 2 ulp of a value <= 127, i.e. 127 * 2^-23) and of the
 *    product code * s (127 * 2^-24), both relative to s.
 *  - fp8 with M mantissa bits and smallest normal exponent emin (e4m3: M = 3, emin = -6; e5m2: M = 2,
 *    emin = -14): |dequantized - x| <= max(2^-(M+1) |x|, 2^(emin-M-1) s) * (1 + 2^-22) + 2^-21 |x|.
 *    The first term is round-to-nearest in the fp8 grid: half an ulp, relative 2^-(M+1) (e4m3
 *    2^-4, e5m2 2^-3) where the scaled value is normal, absolute half the subnormal spacing (e4m3
 *    2^-10 s, e5m2 2^-17 s) below; the rest covers the three fp32 roundings (reciprocal, scaling
 *    product, dequantizing product) of at most 2^-24 each.
 *  That the bounds are nearly reached (error / bound > 0.5 somewhere) shows the codes really are
 *  that coarse. Beside the bounds: the stored scale equals fl(a / max_finite) and the largest
 *  element maps to the largest code; exact ties round to the even code; ragged last pieces and
 *  blocks and the zero padding past `valid`; the piece layout (codes, zeroed padding, scales at
 *  count rounded up to 16); zero blocks (scale 0), NaN/Inf blocks (NaN scale, codes 0, every value
 *  NaN) and blocks too small to scale (scale 0); sum_pieces bitwise against a loop written out here,
 *  accumulate against overwrite, bf16 rounding; plain dtypes (casts); bitwise equality under 1 and 3
 *  OpenMP threads; and through the CPU backend: the three ops on a stream, queued behind a pending
 *  all-gather of pieces, and all_gather / all_to_all moving exactly a piece's bytes. */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "kernels/ops_cpu.h"

#include "check.h"

static const fsdp_dtype CODES[3] = {FSDP_I8, FSDP_E4M3, FSDP_E5M2};

/* ---- helpers ------------------------------------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double rnd(void) { /* splitmix64 in [0, 1) */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}
static float *fmalloc(size_t n) { return xmalloc(n * sizeof(float)); }

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* Bitwise equal, or both NaN (the sign and payload of a NaN made by arithmetic are the FPU's). */
static int same(float a, float b) { return bits(a) == bits(b) || (isnan(a) && isnan(b)); }

/* Values over many magnitudes: per block of 256 a top exponent in [-30, 30], each value 2^-0..24
 * below it with a random mantissa and sign, some zeros and negative zeros; rounded to bf16 when asked
 * (as the CPU backend stores bf16). */
static float *magnitudes(size_t n, int bf16) {
    float *x = fmalloc(n);
    int top = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % FSDP_QUANT_BLOCK == 0) top = (int)(rnd() * 61.0) - 30;
        double r = rnd();
        float v = ldexpf((float)(1.0 + rnd()), top - (int)(rnd() * 25.0));
        if (r < 0.02) v = 0.0f;
        if (rnd() < 0.5) v = -v;
        x[i] = bf16 ? fsdp_round_bf16(v) : v;
    }
    return x;
}

/* The piece layout as dtype.h states it, spelled out independently of fsdp_dtype_piece_bytes. */
static size_t up16(size_t n) { return (n + 15) / 16 * 16; }
static size_t nblocks(size_t count) { return (count + FSDP_QUANT_BLOCK - 1) / FSDP_QUANT_BLOCK; }
static size_t layout_bytes(size_t count) { return up16(count) + up16(nblocks(count) * 4); }
static uint8_t code_at(const uint8_t *pieces, size_t count, size_t p, size_t i) {
    return pieces[p * layout_bytes(count) + i];
}
static float scale_at(const uint8_t *pieces, size_t count, size_t p, size_t b) {
    float s;
    memcpy(&s, pieces + p * layout_bytes(count) + up16(count) + 4 * b, 4);
    return s;
}

/* Largest magnitude among src elements [first, first + len) below valid (NaN/Inf: Inf). */
static float block_amax(const float *src, size_t first, size_t len, size_t valid) {
    float a = 0.0f;
    for (size_t i = first; i < first + len && i < valid; i++) {
        float m = isnan(src[i]) ? INFINITY : fabsf(src[i]);
        if (m > a) a = m;
    }
    return a;
}

static double bound(fsdp_dtype t, float x, float s) {
    const fsdp_dtype_info *d = fsdp_dtype_info_of(t);
    double ax = fabs((double)x);
    if (d->integer) return s * (0.5 + ldexp(1.0, -14));
    int M = d->mantissa_bits, emin = 2 - (1 << (d->exponent_bits - 1));
    double rel = ldexp(ax, -(M + 1)), sub = ldexp((double)s, emin - M - 1);
    return (rel > sub ? rel : sub) * (1.0 + ldexp(1.0, -22)) + ldexp(ax, -21);
}

static const char *src_name(int bf16) { return bf16 ? "bf16 source" : "fp32 source"; }

/* ---- error bounds and scales ----------------------------------------------------------------------- */

typedef struct {
    int bad_scale, bad_code, bad_bound, bad_top;
    double worst; /* largest error / bound */
} bound_stats;

static void check_element_bounds(fsdp_dtype t, const float *x, const uint8_t *q, const float *deq, size_t count,
                                 int pieces, bound_stats *st) {
    const float maxf = fsdp_dtype_info_of(t)->max_finite;
    for (size_t p = 0; p < (size_t)pieces; p++)
        for (size_t b = 0; b < nblocks(count); b++) {
            size_t first = p * count + b * FSDP_QUANT_BLOCK, len = count - b * FSDP_QUANT_BLOCK;
            if (len > FSDP_QUANT_BLOCK) len = FSDP_QUANT_BLOCK;
            float a = block_amax(x, first, len, SIZE_MAX), s = scale_at(q, count, p, b);
            st->bad_scale += bits(s) != bits(a / maxf);
            const float inv = maxf / a;
            for (size_t i = first; i < first + len; i++) {
                const float y = x[i] * inv;
                st->bad_code += code_at(q, count, p, i - p * count) != (a > 0.0f ? fsdp_encode_code(t, y) : 0);
                double err = fabs((double)deq[i] - x[i]), tol = bound(t, x[i], s);
                st->bad_bound += !(err <= tol);
                if (err / tol > st->worst) st->worst = err / tol;
                if (fabsf(x[i]) == a && a > 0.0f) st->bad_top += fabs((double)fabsf(deq[i]) - a) > ldexp(a, -22);
            }
        }
}

static void test_bounds(fsdp_dtype t, int bf16, size_t count, int pieces) {
    size_t n = (size_t)pieces * count;
    float *x = magnitudes(n, bf16), *deq = fmalloc(n);
    uint8_t *q = xmalloc(pieces * layout_bytes(count));
    cpu_quantize_pieces(q, t, x, count, pieces, n);
    cpu_dequantize_pieces(deq, FSDP_F32, q, t, count, pieces);
    bound_stats st = {0, 0, 0, 0, 0.0};
    check_element_bounds(t, x, q, deq, count, pieces, &st);
    const char *name = fsdp_dtype_name(t);
    check_that(st.bad_scale == 0 && st.bad_code == 0,
               "%s %s count %zu x %d: every scale is fl(amax / max_finite), every code encode(x * fl(max_finite / "
               "amax)) (%d, %d differ)",
               name, src_name(bf16), count, pieces, st.bad_scale, st.bad_code);
    check_that(st.bad_bound == 0 && st.worst > 0.5,
               "%s %s count %zu x %d: every error within its bound (%d outside; largest error / bound %.3f)", name,
               src_name(bf16), count, pieces, st.bad_bound, st.worst);
    check_that(st.bad_top == 0, "%s %s count %zu x %d: each block's largest element comes back as itself (%d not)",
               name, src_name(bf16), count, pieces, st.bad_top);
    free(x), free(deq), free(q);
}

/* ---- layout, ragged ends, valid ------------------------------------------------------------------ */

static int padding_is_zero(const uint8_t *q, size_t count, int pieces) {
    int bad = 0;
    for (size_t p = 0; p < (size_t)pieces; p++) {
        const uint8_t *piece = q + p * layout_bytes(count);
        for (size_t i = count; i < up16(count); i++) bad += piece[i] != 0;
        for (size_t i = up16(count) + 4 * nblocks(count); i < layout_bytes(count); i++) bad += piece[i] != 0;
    }
    return bad == 0;
}

/* src holds exactly `valid` elements (AddressSanitizer catches a read past them); the output starts
 * as 0xAB bytes and has 64 guard bytes after it. */
static void test_valid(fsdp_dtype t, size_t count, int pieces, size_t valid) {
    const size_t n = (size_t)pieces * count, bytes = pieces * layout_bytes(count);
    check_that(fsdp_dtype_piece_bytes(t, count) == layout_bytes(count) && fsdp_dtype_scales_offset(count) == up16(count),
               "%s count %zu: piece of %zu bytes, scales at %zu", fsdp_dtype_name(t), count, layout_bytes(count),
               up16(count));
    float *x = magnitudes(valid, 0), *deq = fmalloc(n), *full = fmalloc(n);
    for (size_t i = 0; i < n; i++) full[i] = i < valid ? x[i] : 0.0f;
    uint8_t *q = xmalloc(bytes + 64);
    memset(q, 0xab, bytes + 64);
    cpu_quantize_pieces(q, t, x, count, pieces, valid);
    cpu_dequantize_pieces(deq, FSDP_F32, q, t, count, pieces);
    int guard = 0, past = 0, zero_scales = 0;
    for (size_t i = 0; i < 64; i++) guard += q[bytes + i] != 0xab;
    for (size_t i = valid; i < n; i++) past += code_at(q, count, i / count, i % count) != 0 || bits(deq[i]) != 0;
    for (size_t p = 0; p < (size_t)pieces; p++)
        for (size_t b = 0; b < nblocks(count); b++)
            if (p * count + b * FSDP_QUANT_BLOCK >= valid) zero_scales += bits(scale_at(q, count, p, b)) != 0;
    bound_stats st = {0, 0, 0, 0, 0.0};
    check_element_bounds(t, full, q, deq, count, pieces, &st);
    check_that(guard == 0 && padding_is_zero(q, count, pieces),
               "%s count %zu x %d valid %zu: padding zeroed, nothing written past the pieces", fsdp_dtype_name(t),
               count, pieces, valid);
    check_that(past == 0 && zero_scales == 0 && st.bad_bound == 0 && st.bad_scale == 0 && st.bad_code == 0,
               "%s count %zu x %d valid %zu: zeros past valid (%d codes or values, %d scales), bounds and scales "
               "before it (%d, %d)",
               fsdp_dtype_name(t), count, pieces, valid, past, zero_scales, st.bad_bound, st.bad_scale);
    free(x), free(deq), free(full), free(q);
}

/* ---- special blocks ---------------------------------------------------------------------------------- */

enum { SPECIAL_BLOCKS = 7 };

/* Blocks: zero, one NaN, one +Inf, one -Inf, too small to scale (1e-38), normal, and the largest
 * finite value with exact ties between codes (scale exactly 1). Returns the expected tie codes. */
static float *special_input(fsdp_dtype t, uint8_t *tie_codes) {
    const size_t B = FSDP_QUANT_BLOCK;
    float *x = magnitudes(SPECIAL_BLOCKS * B, 0);
    const fsdp_dtype_info *d = fsdp_dtype_info_of(t);
    for (size_t i = 0; i < B; i++) x[i] = 0.0f, x[4 * B + i] = (float)(rnd() - 0.5) * 2e-38f;
    x[4 * B + 3] = 1e-38f;
    x[B + 77] = NAN, x[2 * B + 5] = INFINITY, x[3 * B + 200] = -INFINITY;
    float *tie = x + 6 * B;
    tie[0] = d->max_finite; /* amax = max_finite: the reciprocal is exactly 1 */
    tie_codes[0] = fsdp_encode_code(t, d->max_finite);
    int top = t == FSDP_E4M3 ? 0x7d : 0x7a; /* fp8: the code below the largest finite */
    for (size_t i = 1; i < B; i++) {
        int c = d->integer ? (int)(rnd() * 254.0) - 127 : (int)(rnd() * (top + 1)), neg = rnd() < 0.5;
        float lo, hi;
        if (d->integer) {
            lo = (float)c, hi = (float)(c + 1); /* -127 .. 127 */
        } else {
            lo = fsdp_decode_code(t, (uint8_t)c), hi = fsdp_decode_code(t, (uint8_t)(c + 1));
        }
        int even = d->integer ? (c % 2 == 0 ? c : c + 1) : (c & 1 ? c + 1 : c);
        float mid = 0.5f * (lo + hi); /* exact: few mantissa bits */
        tie[i] = neg ? -mid : mid;
        tie_codes[i] = d->integer ? (uint8_t)(int8_t)(neg ? -even : even) : (uint8_t)((neg ? 0x80 : 0) | even);
    }
    return x;
}

static void test_special(fsdp_dtype t) {
    const size_t B = FSDP_QUANT_BLOCK, count = SPECIAL_BLOCKS * B;
    uint8_t ties[FSDP_QUANT_BLOCK];
    float *x = special_input(t, ties), *deq = fmalloc(count);
    uint8_t *q = xmalloc(layout_bytes(count));
    cpu_quantize_pieces(q, t, x, count, 1, count);
    cpu_dequantize_pieces(deq, FSDP_F32, q, t, count, 1);
    const char *name = fsdp_dtype_name(t);
    int zero = 0, nonfinite = 0, tiny = 0, tie = 0;
    for (size_t i = 0; i < B; i++) {
        zero += q[i] != 0 || bits(deq[i]) != 0;
        for (int b = 1; b <= 3; b++) nonfinite += q[b * B + i] != 0 || !isnan(deq[b * B + i]);
        tiny += q[4 * B + i] != 0 || bits(deq[4 * B + i]) != 0;
        tie += q[6 * B + i] != ties[i] || deq[6 * B + i] != fsdp_decode_code(t, ties[i]);
    }
    check_that(zero == 0 && bits(scale_at(q, count, 0, 0)) == 0, "%s: a zero block has scale 0, codes 0 (%d not)",
               name, zero);
    int nan_scales = 1;
    for (int b = 1; b <= 3; b++) nan_scales &= bits(scale_at(q, count, 0, (size_t)b)) == 0x7fc00000u;
    check_that(nonfinite == 0 && nan_scales,
               "%s: blocks holding NaN, +Inf, -Inf get the NaN scale 0x7fc00000, codes 0, all values NaN (%d not)",
               name, nonfinite);
    check_that(tiny == 0 && bits(scale_at(q, count, 0, 4)) == 0,
               "%s: a block whose max_finite / amax overflows (amax 1e-38) is stored as zeros (%d not)", name, tiny);
    const float s5 = scale_at(q, count, 0, 5);
    int normal = s5 != block_amax(x, 5 * B, B, SIZE_MAX) / fsdp_dtype_info_of(t)->max_finite;
    for (size_t i = 5 * B; i < 6 * B; i++) normal += !(fabs((double)deq[i] - x[i]) <= bound(t, x[i], s5));
    check_that(normal == 0, "%s: the normal block after them keeps its own scale and bounds (%d not)", name, normal);
    check_that(tie == 0 && scale_at(q, count, 0, 6) == 1.0f,
               "%s: exact ties between codes round to the even code (scale 1; %d not)", name, tie);
    free(x), free(deq), free(q);
}

/* ---- sum_pieces ------------------------------------------------------------------------------------- */

/* Element i of piece p, as a loop over the layout would read it. */
static float piece_value(const void *src, fsdp_dtype t, size_t count, size_t p, size_t i) {
    if (!fsdp_dtype_blockwise(t)) return ((const float *)src)[p * count + i];
    const float v = fsdp_decode_code(t, code_at(src, count, p, i));
    return v * scale_at(src, count, p, i / FSDP_QUANT_BLOCK);
}

static float *expected_sum(const float *dst0, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                           int pieces, int accumulate) {
    float *e = fmalloc(count);
    for (size_t i = 0; i < count; i++) {
        float acc = accumulate ? dst0[i] : 0.0f;
        for (int p = 0; p < pieces; p++) {
            const float v = piece_value(src, src_t, count, (size_t)p, i);
            acc = acc + v;
        }
        e[i] = dst_t == FSDP_BF16 ? fsdp_round_bf16(acc) : acc;
    }
    return e;
}

/* The pieces to sum: quantized from values over many magnitudes with one NaN in block 1 of the last
 * piece (so the NaN reaches the sum there), or plain values rounded to src_t. */
static void *sum_source(fsdp_dtype src_t, size_t count, int pieces) {
    size_t n = (size_t)pieces * count;
    float *x = magnitudes(n, src_t == FSDP_BF16);
    if (count > FSDP_QUANT_BLOCK + 9) x[(size_t)(pieces - 1) * count + FSDP_QUANT_BLOCK + 9] = NAN;
    if (!fsdp_dtype_blockwise(src_t)) return x;
    void *q = xmalloc(pieces * layout_bytes(count));
    cpu_quantize_pieces(q, src_t, x, count, pieces, n);
    free(x);
    return q;
}

static void test_sum(fsdp_dtype src_t, fsdp_dtype dst_t, size_t count, int pieces, int accumulate) {
    void *src = sum_source(src_t, count, pieces);
    float *dst0 = magnitudes(count, dst_t == FSDP_BF16), *dst = fmalloc(count);
    memcpy(dst, dst0, count * sizeof(float));
    float *want = expected_sum(dst0, dst_t, src, src_t, count, pieces, accumulate);
    cpu_sum_pieces(dst, dst_t, src, src_t, count, pieces, accumulate);
    int bad = 0, nans = 0;
    for (size_t i = 0; i < count; i++) bad += !same(dst[i], want[i]), nans += isnan(dst[i]);
    check_that(bad == 0 && (count <= FSDP_QUANT_BLOCK + 9 || nans > 0),
               "sum_pieces %s -> %s, count %zu x %d, %s: bitwise the fp32 loop in piece order (%d differ; %d NaN)",
               fsdp_dtype_name(src_t), fsdp_dtype_name(dst_t), count, pieces, accumulate ? "accumulate" : "overwrite",
               bad, nans);
    free(src), free(dst0), free(dst), free(want);
}

/* ---- plain dtypes --------------------------------------------------------------------------------- */

static void test_plain(fsdp_dtype t, size_t count, int pieces, size_t valid) {
    size_t n = (size_t)pieces * count;
    float *x = magnitudes(valid, 0), *q = fmalloc(n), *back = fmalloc(n);
    for (size_t i = 0; i < n; i++) q[i] = NAN;
    cpu_quantize_pieces(q, t, x, count, pieces, valid);
    cpu_dequantize_pieces(back, FSDP_F32, q, t, count, pieces);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = i < valid ? (t == FSDP_BF16 ? fsdp_round_bf16(x[i]) : x[i]) : 0.0f;
        bad += bits(q[i]) != bits(want) || bits(back[i]) != bits(want);
    }
    check_that(bad == 0, "plain %s pieces, count %zu x %d valid %zu: a cast, zeros past valid, and back (%d differ)",
               fsdp_dtype_name(t), count, pieces, valid, bad);
    free(x), free(q), free(back);
}

static void test_bf16_output(fsdp_dtype t) {
    const size_t count = 777;
    float *x = magnitudes(count, 0), *f = fmalloc(count), *h = fmalloc(count);
    uint8_t *q = xmalloc(layout_bytes(count));
    cpu_quantize_pieces(q, t, x, count, 1, count);
    cpu_dequantize_pieces(f, FSDP_F32, q, t, count, 1);
    cpu_dequantize_pieces(h, FSDP_BF16, q, t, count, 1);
    int bad = 0;
    for (size_t i = 0; i < count; i++) bad += bits(h[i]) != bits(fsdp_round_bf16(f[i]));
    check_that(bad == 0, "%s: dequantize into bf16 is the fp32 value rounded to nearest even (%d differ)",
               fsdp_dtype_name(t), bad);
    free(x), free(f), free(h), free(q);
}

/* ---- threads ------------------------------------------------------------------------------------------ */

typedef struct {
    uint8_t *q;
    float *deq, *sum;
} run_out;

static run_out run_all(fsdp_dtype t, const float *x, size_t count, int pieces, int threads) {
    omp_set_num_threads(threads);
    run_out o = {xmalloc(pieces * layout_bytes(count)), fmalloc((size_t)pieces * count), fmalloc(count)};
    cpu_quantize_pieces(o.q, t, x, count, pieces, (size_t)pieces * count - 100);
    cpu_dequantize_pieces(o.deq, FSDP_BF16, o.q, t, count, pieces);
    for (size_t i = 0; i < count; i++) o.sum[i] = x[i];
    cpu_sum_pieces(o.sum, FSDP_F32, o.q, t, count, pieces, 1);
    return o;
}

static void test_threads(fsdp_dtype t) {
    const size_t count = 40 * FSDP_QUANT_BLOCK + 17;
    const int pieces = 4, saved = omp_get_max_threads();
    float *x = magnitudes((size_t)pieces * count, 0);
    run_out a = run_all(t, x, count, pieces, 1), b = run_all(t, x, count, pieces, 3);
    omp_set_num_threads(saved);
    check_that(!memcmp(a.q, b.q, pieces * layout_bytes(count)) &&
                   !memcmp(a.deq, b.deq, (size_t)pieces * count * 4) && !memcmp(a.sum, b.sum, count * 4),
               "%s: quantize, dequantize, sum_pieces bitwise equal under 1 and 3 threads", fsdp_dtype_name(t));
    free(x), free(a.q), free(a.deq), free(a.sum), free(b.q), free(b.deq), free(b.sum);
}

/* ---- through the CPU backend ---------------------------------------------------------------------- */

static void *be_upload(fsdp_backend *be, const void *h, size_t bytes, size_t slack) {
    void *d = be->runtime->alloc(be, bytes + slack, "test");
    be->runtime->copy_h2d(be, d, h, bytes, be->compute);
    return d;
}

static void *be_download(fsdp_backend *be, const void *d, size_t bytes, fsdp_stream *s) {
    void *h = xmalloc(bytes);
    be->runtime->stream_synchronize(be, s);
    be->runtime->copy_d2h(be, h, d, bytes, s);
    be->runtime->stream_synchronize(be, s);
    return h;
}

/* The three ops on a side stream against the reference, a dequantize queued behind an all-gather of
 * the first piece (one rank: the gather copies it). */
static void test_backend_ops(fsdp_backend *be, fsdp_comm *comm, fsdp_dtype t) {
    const size_t count = 3 * FSDP_QUANT_BLOCK + 40, valid = 2 * count + 100;
    const int pieces = 3;
    const size_t pb = fsdp_device_piece_bytes(be->kind, t, count), qbytes = pieces * pb, n = (size_t)pieces * count;
    fsdp_stream *s = be->runtime->stream_create(be, "quant");
    float *x = magnitudes(valid, 1), *acc0 = magnitudes(count, 1);
    uint8_t *ref_q = xmalloc(qbytes);
    float *ref_deq = fmalloc(n), *ref_sum = fmalloc(count), *ref_first = fmalloc(count);
    cpu_quantize_pieces(ref_q, t, x, count, pieces, valid);
    cpu_dequantize_pieces(ref_deq, FSDP_BF16, ref_q, t, count, pieces);
    cpu_dequantize_pieces(ref_first, FSDP_F32, ref_q, t, count, 1);
    memcpy(ref_sum, acc0, count * 4);
    cpu_sum_pieces(ref_sum, FSDP_F32, ref_q, t, count, pieces, 1);

    float *dx = be_upload(be, x, valid * 4, 0), *dacc = be_upload(be, acc0, count * 4, 0);
    uint8_t *dq = be->runtime->alloc(be, qbytes, "test"), *dg = be->runtime->alloc(be, qbytes, "test");
    float *ddeq = be->runtime->alloc(be, n * 4, "test"), *dfirst = be->runtime->alloc(be, count * 4, "test");
    be->runtime->stream_synchronize(be, be->compute);
    be->ops->quantize(be, dq, t, dx, FSDP_BF16, count, pieces, valid, s);
    be->ops->dequantize(be, ddeq, FSDP_BF16, dq, t, count, pieces, s);
    be->ops->sum_pieces(be, dacc, FSDP_F32, dq, t, count, pieces, 1, s);
    be->coll->all_gather(be, comm, dq, dg, count, t, s);
    be->ops->dequantize(be, dfirst, FSDP_F32, dg, t, count, 1, s);
    uint8_t *got_q = be_download(be, dq, qbytes, s);
    float *got_deq = be_download(be, ddeq, n * 4, s), *got_sum = be_download(be, dacc, count * 4, s);
    float *got_first = be_download(be, dfirst, count * 4, s);
    check_that(!memcmp(got_q, ref_q, qbytes) && !memcmp(got_deq, ref_deq, n * 4) && !memcmp(got_sum, ref_sum, count * 4),
               "backend %s: quantize, dequantize into bf16 and sum_pieces (accumulate) on a stream equal the "
               "reference bitwise",
               fsdp_dtype_name(t));
    check_that(!memcmp(got_first, ref_first, count * 4),
               "backend %s: a dequantize queued behind an all_gather of a piece reads the gathered piece",
               fsdp_dtype_name(t));
    free(x), free(acc0), free(ref_q), free(ref_deq), free(ref_sum), free(ref_first), free(got_q), free(got_deq);
    free(got_sum), free(got_first);
    void *ptrs[] = {dx, dacc, dq, dg, ddeq, dfirst};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) be->runtime->free(be, ptrs[i]);
    be->runtime->stream_destroy(be, s);
}

/* A collective of `count` elements of t moves fsdp_device_piece_bytes bytes per rank: the receive
 * buffer gets them, and the 64 bytes after them stay untouched. */
static void test_collective_bytes(fsdp_backend *be, fsdp_comm *comm, fsdp_dtype t, size_t count, int to_all) {
    const size_t bytes = fsdp_device_piece_bytes(be->kind, t, count);
    uint8_t *h = xmalloc(bytes), *guard = xmalloc(bytes + 64);
    for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)(rnd() * 256.0);
    memset(guard, 0xcd, bytes + 64);
    void *send = be_upload(be, h, bytes, 0), *recv = be_upload(be, guard, bytes + 64, 0);
    if (to_all)
        be->coll->all_to_all(be, comm, send, recv, count, t, be->compute);
    else
        be->coll->all_gather(be, comm, send, recv, count, t, be->compute);
    uint8_t *got = be_download(be, recv, bytes + 64, be->compute);
    int guard_bad = 0;
    for (size_t i = 0; i < 64; i++) guard_bad += got[bytes + i] != 0xcd;
    check_that(!memcmp(got, h, bytes) && guard_bad == 0, "backend %s of %zu %s elements moves exactly %zu bytes",
               to_all ? "all_to_all" : "all_gather", count, fsdp_dtype_name(t), bytes);
    /* In place: send is the receive buffer's own slot. */
    if (!to_all) {
        be->coll->all_gather(be, comm, recv, recv, count, t, be->compute);
        uint8_t *again = be_download(be, recv, bytes, be->compute);
        check_that(!memcmp(again, h, bytes), "backend all_gather of %s in place keeps the piece", fsdp_dtype_name(t));
        free(again);
    }
    free(h), free(guard), free(got);
    be->runtime->free(be, send), be->runtime->free(be, recv);
}

static void test_backend(void) {
    fsdp_err err = {0};
    fsdp_backend_options o = {.kind = "cpu", .act_dtype = FSDP_BF16, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend *be = fsdp_backend_create(&o, &err); /* which checks that no table entry is missing */
    if (!check_that(be != NULL, "CPU backend created")) return;
    fsdp_comm *comm = be->coll->comm_create(be, MPI_COMM_WORLD, "test", 0);
    for (int i = 0; i < 3; i++) {
        test_backend_ops(be, comm, CODES[i]);
        test_collective_bytes(be, comm, CODES[i], 1000, 0);
        test_collective_bytes(be, comm, CODES[i], 37, 1);
    }
    test_collective_bytes(be, comm, FSDP_BF16, 1000, 0);
    test_collective_bytes(be, comm, FSDP_F32, 37, 1);
    be->coll->comm_destroy(be, comm);
    be->runtime->destroy(be);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    for (int i = 0; i < 3; i++) {
        fsdp_dtype t = CODES[i];
        for (int bf16 = 0; bf16 < 2; bf16++) {
            test_bounds(t, bf16, 1000, 3);
            test_bounds(t, bf16, 64 * FSDP_QUANT_BLOCK, 2);
        }
        test_valid(t, 1000, 3, 2 * 1000 + 300); /* ragged last block; last piece partly past valid */
        test_valid(t, 37, 4, 3 * 37 + 5);       /* one short block per piece; codes padded by 11 */
        test_valid(t, 512, 2, 1024);            /* whole blocks, nothing past valid */
        test_valid(t, 1, 5, 5);
        test_valid(t, 1000, 3, 1);              /* almost nothing valid */
        test_special(t);
        test_bf16_output(t);
        test_threads(t);
    }
    const fsdp_dtype sources[5] = {FSDP_F32, FSDP_BF16, FSDP_I8, FSDP_E4M3, FSDP_E5M2};
    for (int si = 0; si < 5; si++)
        for (int d = 0; d < 2; d++)
            for (int acc = 0; acc < 2; acc++) {
                fsdp_dtype dst_t = d ? FSDP_BF16 : FSDP_F32;
                test_sum(sources[si], dst_t, 1000, 3, acc);
                test_sum(sources[si], dst_t, 37, 1, acc);
                if (acc) test_sum(sources[si], dst_t, 4 * FSDP_QUANT_BLOCK, 8, acc);
            }
    test_plain(FSDP_F32, 1000, 3, 2500);
    test_plain(FSDP_BF16, 1000, 3, 2500);
    test_plain(FSDP_BF16, 37, 2, 74);
    test_backend();
    int status = check_summary("test_quantize");
    MPI_Finalize();
    return status;
}
