/* Checks the CUDA quantization kernels (src/kernels/cuda/quantize.cu) against the CPU reference
 * (src/kernels/cpu/quantize.c), bit for bit: every byte of the quantized pieces (codes, scales,
 * padding), every dequantized value (fp32 and bf16) and every sum of pieces (fp32 and bf16,
 * accumulate and overwrite), NaN matching NaN (the bits of a NaN made by arithmetic are the
 * processor's).
 *
 * Inputs are fp32 or bf16 (rounded to bf16 first, so both sides see the same values), block by
 * block one of: values over 25 or 45 binades (after scaling many fall among the fp8 subnormals or
 * below them), exact ties between codes (amax = max_finite, so the scale is 1), all zeros, a NaN or
 * an Inf, amax too small to scale (below max_finite / FLT_MAX) or just above it (subnormal scales),
 * fp32 subnormals among normal values, negative zeros. Every finite fp32 magnitude range is also
 * encoded with the scale fixed at 1 (codes straight from the hardware conversion), and every one of
 * the 256 codes decoded. Sizes cover ragged last pieces and blocks, `valid` inside a piece, counts
 * that are multiples of 8, of 4 only, and neither (vector and scalar paths), misaligned plain
 * buffers, 1 to 8 pieces and 8 Mi elements. The backend's ops table (quantize, dequantize, sum_pieces on a side
 * stream) is checked against the same reference. No collective runs here: NCCL's byte counts are
 * the multi-GPU tests' business.
 *
 * Prints one line per check (with the first differing element when one fails); exits 1 on any
 * failure, 77 (skipped) without a GPU. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "kernels/ops_cpu.h"
#include "kernels/ops_cuda.h"
#include "check.h"
#define CUDA_RIG_SEED 0x3c6ef372fe94f82bull
#include "cuda_rig.h"

static const fsdp_dtype CODES[3] = {FSDP_I8, FSDP_E4M3, FSDP_E5M2};
static const fsdp_dtype PLAIN[2] = {FSDP_F32, FSDP_BF16};

/* ---- device buffers --------------------------------------------------------------------------------- */

static void *dbytes(const void *h, size_t bytes) {
    void *d = dmalloc(bytes);
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void *hbytes(const void *d, size_t bytes) {
    void *h = xmalloc(bytes);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* A plain tensor of n elements of t at `mis` elements past a 256-byte aligned allocation (mis = 1
 * makes it misaligned: the scalar path), filled from fp32 values; NaN before and after them, so that
 * a kernel reading past n shows. *base is what to free. */
static void *dplain(const float *x, size_t n, fsdp_dtype t, int mis, void **base) {
    *base = dmalloc((n + 8) * esz(t));
    CK(cudaMemset(*base, 0xff, (n + 8) * esz(t)));
    void *d = (char *)*base + (size_t)mis * esz(t);
    if (n) upload(d, x, n, t);
    return d;
}

static float *hplain(const void *d, size_t n, fsdp_dtype t) {
    float *h = hmalloc(n);
    CK(cudaDeviceSynchronize());
    if (n) download(h, d, n, t);
    return h;
}

/* ---- inputs --------------------------------------------------------------------------------------------- */

static float round_to(float v, fsdp_dtype t) { return t == FSDP_BF16 ? fsdp_round_bf16(v) : v; }

static float signed_value(float v) { return rnd() < 0.5 ? -v : v; }

/* Each value 2^0 .. 2^-(spread-1) below 2^top, random mantissa and sign. */
static void fill_spread(float *x, size_t n, int top, int spread) {
    for (size_t i = 0; i < n; i++) x[i] = signed_value(ldexpf((float)(1.0 + rnd()), top - (int)(rnd() * spread)));
}

/* amax = max_finite (the reciprocal is exactly 1) and the rest midpoints between adjacent codes. */
static void fill_ties(float *x, size_t n, fsdp_dtype t) {
    const fsdp_dtype_info *d = fsdp_dtype_info_of(t);
    const int top = t == FSDP_E4M3 ? 0x7d : 0x7a;
    x[0] = d->max_finite;
    for (size_t i = 1; i < n; i++) {
        if (d->integer) {
            x[i] = signed_value((float)((int)(rnd() * 254.0) - 127) + 0.5f);
        } else {
            int c = (int)(rnd() * (top + 1));
            x[i] = signed_value(0.5f * (fsdp_decode_code(t, (uint8_t)c) + fsdp_decode_code(t, (uint8_t)(c + 1))));
        }
    }
}

/* One block of `n` values of kind k (see the file comment). */
static void fill_block(float *x, size_t n, fsdp_dtype t, int k) {
    const float maxf = fsdp_dtype_info_of(t)->max_finite, threshold = maxf / 3.4028234663852886e38f;
    switch (k) {
    case 0: fill_spread(x, n, (int)(rnd() * 61.0) - 30, 25); break;
    case 1: fill_spread(x, n, (int)(rnd() * 61.0) - 30, 45); break;
    case 2: fill_ties(x, n, t); break;
    case 3: memset(x, 0, n * sizeof(float)); break;
    case 4:
        fill_spread(x, n, 0, 25);
        x[(size_t)(rnd() * n)] = rnd() < 0.5 ? NAN : signed_value(INFINITY);
        break;
    case 5: fill_spread(x, n, -125, 8); x[0] = threshold * 0.5f; break;  /* too small to scale */
    case 6: fill_spread(x, n, -125, 20); x[0] = threshold * 1.5f; break; /* subnormal scale */
    case 7:
        fill_spread(x, n, -100, 25);
        for (size_t i = 0; i < n; i += 3) x[i] = signed_value(ldexpf((float)rnd(), -126)); /* fp32 subnormals */
        break;
    default:
        fill_spread(x, n, 3, 10);
        for (size_t i = 0; i < n; i += 2) x[i] = -0.0f;
        x[n / 2] = -16.0f; /* a power of two as amax */
        break;
    }
}

/* n values, block by block (blocks of the flat array: piece boundaries need not align with them,
 * which mixes kinds inside ragged blocks too), rounded to t. */
static float *make_input(size_t n, fsdp_dtype code_t, fsdp_dtype t) {
    float *x = hmalloc(n ? n : 1);
    for (size_t i = 0; i < n; i += FSDP_QUANT_BLOCK) {
        size_t len = n - i < FSDP_QUANT_BLOCK ? n - i : FSDP_QUANT_BLOCK;
        double r = rnd();
        int k = r < 0.4 ? 0 : r < 0.55 ? 1 : 2 + (int)(rnd() * 7.0);
        fill_block(x + i, len, code_t, k);
    }
    for (size_t i = 0; i < n; i++) x[i] = round_to(x[i], t);
    return x;
}

/* ---- comparisons ------------------------------------------------------------------------------------ */

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Quantized bytes: the first difference is shown by piece and offset. */
static void compare_pieces(const char *what, const uint8_t *got, const uint8_t *want, fsdp_dtype t, size_t count,
                           int pieces) {
    const size_t pb = fsdp_dtype_piece_bytes(t, count), bytes = pb * (size_t)pieces, scales = fsdp_dtype_scales_offset(count);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < bytes; i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
    if (!check_that(bad == 0, "%s: %zu bytes equal the CPU's (%zu differ)", what, bytes, bad)) {
        size_t p = first / pb, off = first % pb;
        if (off < count)
            printf("      first: piece %zu code %zu: gpu %02x cpu %02x\n", p, off, got[first], want[first]);
        else if (off >= scales && off < scales + 4 * ((count + FSDP_QUANT_BLOCK - 1) / FSDP_QUANT_BLOCK)) {
            size_t b = (off - scales) / 4, at = p * pb + scales + 4 * b;
            float g, w;
            memcpy(&g, got + at, 4), memcpy(&w, want + at, 4);
            printf("      first: piece %zu scale %zu: gpu %a cpu %a\n", p, b, g, w);
        } else {
            printf("      first: piece %zu padding byte %zu: gpu %02x cpu %02x\n", p, off, got[first], want[first]);
        }
    }
}

/* Values of dtype t read back as fp32 (bf16 widened): bitwise equal, or both NaN. */
static void compare_values(const char *what, const float *got, const float *want, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (fbits(got[i]) != fbits(want[i]) && !(isnan(got[i]) && isnan(want[i])) && bad++ == 0) first = i;
    if (!check_that(bad == 0, "%s: %zu values equal the CPU's bitwise (%zu differ)", what, n, bad))
        printf("      first: element %zu: gpu %a cpu %a\n", first, got[first], want[first]);
}

/* ---- quantize, dequantize, sum_pieces against the reference ------------------------------------------------- */

typedef struct {
    size_t count, valid;
    int pieces, mis; /* mis: plain buffers one element past alignment */
} shape;

static char g_what[160];
static const char *what(const char *op, fsdp_dtype a, fsdp_dtype b, shape s, const char *extra) {
    snprintf(g_what, sizeof g_what, "%s %s->%s count %zu x %d valid %zu%s%s", op, fsdp_dtype_name(a),
             fsdp_dtype_name(b), s.count, s.pieces, s.valid, s.mis ? " misaligned" : "", extra);
    return g_what;
}

/* The quantized pieces (CPU reference and GPU copy), from input x in src_t. */
static void quantize_case(fsdp_dtype t, fsdp_dtype src_t, shape s, uint8_t **ref, void **dq) {
    const size_t bytes = fsdp_dtype_piece_bytes(t, s.count) * (size_t)s.pieces;
    float *x = make_input(s.valid, t, src_t);
    *ref = xmalloc(bytes);
    cpu_quantize_pieces(*ref, t, x, s.count, s.pieces, s.valid);
    void *base, *dx = dplain(x, s.valid, src_t, s.mis, &base);
    *dq = dmalloc(bytes);
    CK(cudaMemset(*dq, 0xab, bytes)); /* padding must be written, not left */
    fsdp_cuda_quantize(*dq, t, dx, src_t, s.count, s.pieces, s.valid, 0);
    uint8_t *got = hbytes(*dq, bytes);
    compare_pieces(what("quantize", src_t, t, s, ""), got, *ref, t, s.count, s.pieces);
    free(x), free(got);
    dfree(base);
}

static void dequantize_case(fsdp_dtype t, fsdp_dtype dst_t, shape s, const uint8_t *ref_q, const void *dq) {
    const size_t n = s.count * (size_t)s.pieces;
    float *want = hmalloc(n);
    cpu_dequantize_pieces(want, dst_t, ref_q, t, s.count, s.pieces);
    void *base = dmalloc((n + 8) * esz(dst_t)), *dd = (char *)base + (size_t)s.mis * esz(dst_t);
    CK(cudaMemset(base, 0xff, (n + 8) * esz(dst_t)));
    fsdp_cuda_dequantize(dd, dst_t, dq, t, s.count, s.pieces, 0);
    float *got = hplain(dd, n, dst_t);
    compare_values(what("dequantize", t, dst_t, s, ""), got, want, n);
    free(want), free(got);
    dfree(base);
}

/* src: pieces of src_t (host reference bytes or floats, and the device copy). */
static void sum_case(fsdp_dtype src_t, fsdp_dtype dst_t, shape s, const void *ref_src, const void *dsrc,
                     int accumulate) {
    float *init = make_input(s.count, FSDP_E4M3, dst_t), *want = hmalloc(s.count);
    memcpy(want, init, s.count * sizeof(float));
    cpu_sum_pieces(want, dst_t, ref_src, src_t, s.count, s.pieces, accumulate);
    void *base, *dd = dplain(init, s.count, dst_t, s.mis, &base);
    fsdp_cuda_sum_pieces(dd, dst_t, dsrc, src_t, s.count, s.pieces, accumulate, 0);
    float *got = hplain(dd, s.count, dst_t);
    compare_values(what("sum_pieces", src_t, dst_t, s, accumulate ? " accumulate" : " overwrite"), got, want, s.count);
    free(init), free(want), free(got);
    dfree(base);
}

static void test_blockwise(fsdp_dtype t, fsdp_dtype src_t, shape s) {
    uint8_t *ref_q;
    void *dq;
    quantize_case(t, src_t, s, &ref_q, &dq);
    for (int d = 0; d < 2; d++) {
        dequantize_case(t, PLAIN[d], s, ref_q, dq);
        sum_case(t, PLAIN[d], s, ref_q, dq, d); /* fp32 overwrite, bf16 accumulate */
        if (s.count < 100000) sum_case(t, PLAIN[d], s, ref_q, dq, !d);
    }
    free(ref_q);
    dfree(dq);
}

/* Plain pieces: quantize and dequantize are casts; sum_pieces adds plain pieces. */
static void test_plain(fsdp_dtype t, fsdp_dtype src_t, shape s) {
    const size_t n = s.count * (size_t)s.pieces;
    float *x = make_input(s.valid, FSDP_E4M3, src_t), *want = hmalloc(n);
    cpu_quantize_pieces(want, t, x, s.count, s.pieces, s.valid);
    void *xb, *dx = dplain(x, s.valid, src_t, s.mis, &xb);
    void *qb = dmalloc((n + 8) * esz(t)), *dq = (char *)qb + (size_t)s.mis * esz(t);
    CK(cudaMemset(qb, 0xff, (n + 8) * esz(t)));
    fsdp_cuda_quantize(dq, t, dx, src_t, s.count, s.pieces, s.valid, 0);
    float *got = hplain(dq, n, t);
    compare_values(what("quantize (a cast)", src_t, t, s, ""), got, want, n);
    for (int d = 0; d < 2; d++) {
        float *back = hmalloc(n);
        cpu_dequantize_pieces(back, PLAIN[d], want, t, s.count, s.pieces);
        void *bb = dmalloc((n + 8) * esz(PLAIN[d])), *db = (char *)bb + (size_t)s.mis * esz(PLAIN[d]);
        fsdp_cuda_dequantize(db, PLAIN[d], dq, t, s.count, s.pieces, 0);
        float *gb = hplain(db, n, PLAIN[d]);
        compare_values(what("dequantize (a cast)", t, PLAIN[d], s, ""), gb, back, n);
        sum_case(t, PLAIN[d], s, want, dq, d);
        free(back), free(gb);
        dfree(bb);
    }
    free(x), free(want), free(got);
    dfree(xb), dfree(qb);
}

/* ---- the conversions themselves ------------------------------------------------------------------------ */

/* Random fp32 bit patterns of every exponent below max_finite, in blocks led by max_finite itself:
 * the scale is 1, so each code is the hardware's conversion of the value as it is. */
static void test_encode_range(fsdp_dtype t) {
    const size_t count = 4096 * FSDP_QUANT_BLOCK;
    const float maxf = fsdp_dtype_info_of(t)->max_finite;
    float *x = hmalloc(count);
    for (size_t i = 0; i < count; i++) {
        float v;
        do {
            uint32_t u = (uint32_t)(rnd() * 4294967296.0);
            memcpy(&v, &u, 4);
        } while (!(fabsf(v) < maxf) || fabsf(v) < 1e-30f * (float)rnd()); /* keep most magnitudes near the codes */
        x[i] = i % FSDP_QUANT_BLOCK == 0 ? maxf : v;
    }
    const size_t bytes = fsdp_dtype_piece_bytes(t, count);
    uint8_t *ref = xmalloc(bytes);
    cpu_quantize_pieces(ref, t, x, count, 1, count);
    float *dx = dmalloc(count * 4);
    CK(cudaMemcpy(dx, x, count * 4, cudaMemcpyHostToDevice));
    void *dq = dmalloc(bytes);
    fsdp_cuda_quantize(dq, t, dx, FSDP_F32, count, 1, count, 0);
    uint8_t *got = hbytes(dq, bytes);
    shape s = {count, count, 1, 0};
    compare_pieces(what("quantize at scale 1 (every magnitude)", FSDP_F32, t, s, ""), got, ref, t, count, 1);
    free(x), free(ref), free(got);
    dfree(dx), dfree(dq);
}

/* Two pieces holding all 256 codes, with scales 1 and 2^-20. */
static void test_decode_all(fsdp_dtype t) {
    const size_t count = 256, pb = fsdp_dtype_piece_bytes(t, count);
    uint8_t *q = xmalloc(2 * pb);
    memset(q, 0, 2 * pb);
    const float scales[2] = {1.0f, ldexpf(1.0f, -20)};
    for (int p = 0; p < 2; p++) {
        for (int c = 0; c < 256; c++) q[p * pb + (size_t)c] = (uint8_t)c;
        memcpy(q + p * pb + fsdp_dtype_scales_offset(count), &scales[p], 4);
    }
    void *dq = dbytes(q, 2 * pb);
    shape s = {count, 2 * count, 2, 0};
    for (int d = 0; d < 2; d++) {
        dequantize_case(t, PLAIN[d], s, q, dq);
        sum_case(t, PLAIN[d], s, q, dq, 1);
    }
    free(q);
    dfree(dq);
}

/* ---- through the backend ------------------------------------------------------------------------------- */

static void test_backend(fsdp_backend *be, fsdp_dtype t) {
    const size_t count = 5 * FSDP_QUANT_BLOCK + 24, valid = 3 * count + 77;
    const int pieces = 4;
    const size_t pb = fsdp_device_piece_bytes(be->kind, t, count), bytes = pb * pieces, n = count * pieces;
    float *x = make_input(valid, t, FSDP_BF16), *acc = make_input(count, t, FSDP_F32);
    uint8_t *ref_q = xmalloc(bytes);
    float *ref_deq = hmalloc(n), *ref_sum = hmalloc(count);
    cpu_quantize_pieces(ref_q, t, x, count, pieces, valid);
    cpu_dequantize_pieces(ref_deq, FSDP_BF16, ref_q, t, count, pieces);
    memcpy(ref_sum, acc, count * 4);
    cpu_sum_pieces(ref_sum, FSDP_F32, ref_q, t, count, pieces, 1);

    fsdp_stream *s = be->runtime->stream_create(be, "quant");
    void *dx = be->runtime->alloc(be, valid * 2, "test"), *dq = be->runtime->alloc(be, bytes, "test");
    void *ddeq = be->runtime->alloc(be, n * 2, "test"), *dacc = be->runtime->alloc(be, count * 4, "test");
    be->runtime->stream_synchronize(be, be->compute); /* alloc zeroes on the compute stream */
    upload(dx, x, valid, FSDP_BF16);
    upload(dacc, acc, count, FSDP_F32);
    be->ops->quantize(be, dq, t, dx, FSDP_BF16, count, pieces, valid, s);
    be->ops->dequantize(be, ddeq, FSDP_BF16, dq, t, count, pieces, s);
    be->ops->sum_pieces(be, dacc, FSDP_F32, dq, t, count, pieces, 1, s);
    be->runtime->stream_synchronize(be, s);
    uint8_t *got_q = hbytes(dq, bytes);
    float *got_deq = hplain(ddeq, n, FSDP_BF16), *got_sum = hplain(dacc, count, FSDP_F32);
    shape sh = {count, valid, pieces, 0};
    compare_pieces(what("backend quantize", FSDP_BF16, t, sh, ""), got_q, ref_q, t, count, pieces);
    compare_values(what("backend dequantize", t, FSDP_BF16, sh, ""), got_deq, ref_deq, n);
    compare_values(what("backend sum_pieces", t, FSDP_F32, sh, " accumulate"), got_sum, ref_sum, count);
    free(x), free(acc), free(ref_q), free(ref_deq), free(ref_sum), free(got_q), free(got_deq), free(got_sum);
    void *ptrs[] = {dx, dq, ddeq, dacc};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) be->runtime->free(be, ptrs[i]);
    be->runtime->stream_destroy(be, s);
}

static void test_backends(void) {
    fsdp_err err = {0};
    fsdp_backend_options o = {.kind = "cuda", .act_dtype = FSDP_BF16, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend *be = fsdp_backend_create(&o, &err);
    if (!check_that(be != NULL, "CUDA backend created%s%s", be ? "" : ": ", be ? "" : err.msg)) return;
    for (int i = 0; i < 3; i++) test_backend(be, CODES[i]);
    be->runtime->destroy(be);
}

/* ---- main ------------------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (!fsdp_backend_cuda_available()) {
        printf("test_gpu_quantize: SKIPPED (no GPU)\n");
        MPI_Finalize();
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    const shape shapes[] = {
        {1000, 3000, 3, 0},         {1000, 2300, 3, 0},        /* ragged last block; valid inside piece 2 */
        {37, 3 * 37 + 5, 4, 0},     {1, 5, 5, 0},              /* short blocks; one element a piece */
        {256, 512, 2, 0},           {4104, 3 * 4104, 3, 0},    /* whole blocks; count % 8 == 0, ragged block */
        {4104, 2 * 4104, 2, 1},     {65539, 131000, 2, 0},     /* misaligned plain side; odd count */
        {1 << 20, 8 << 20, 8, 0},   {3 << 19, (3 << 19) - 9, 1, 0},
        {1004, 3 * 1004 - 50, 3, 0}, /* count % 8 == 4: the vector path for fp32 only */
    };
    for (int i = 0; i < 3; i++) {
        test_encode_range(CODES[i]);
        test_decode_all(CODES[i]);
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            for (int sb = 0; sb < 2; sb++) test_blockwise(CODES[i], PLAIN[sb], shapes[k]);
    }
    for (int d = 0; d < 2; d++)
        for (int sb = 0; sb < 2; sb++) {
            test_plain(PLAIN[d], PLAIN[sb], shapes[1]);
            test_plain(PLAIN[d], PLAIN[sb], shapes[6]);
            test_plain(PLAIN[d], PLAIN[sb], shapes[5]);
        }
    test_backends();
    CK(cudaGetLastError());
    int status = check_summary("test_gpu_quantize");
    MPI_Finalize();
    return status;
}
