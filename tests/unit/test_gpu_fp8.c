/* The FP8 casts and products on the GPU against the CPU reference (src/kernels/fp8.h):
 *  - casts (src/kernels/cuda/fp8.cu): codes, scales, inverse scales and amax bit for bit against
 *    cpu_fp8_cast (a NaN's code matching any NaN code), from fp32 and bf16, into e4m3 and e5m2,
 *    tensorwise and rowwise, with and without the transpose, with and without power-of-two scales,
 *    with the amax computed or reported (amax_in); shapes that take the vector and the scalar paths,
 *    ragged tiles, and rows holding zeros, NaN, Inf and tiny values; the backward's cast of dy into
 *    both layouts in one pass against two CPU casts;
 *  - the rowwise epilogue kernel (the fallback when cuBLASLt lacks outer-vector scales) bit for bit;
 *  - the backend's matmul_forward_fp8 / matmul_backward_fp8 (cuBLASLt FP8) for tensorwise, rowwise
 *    and e5m2-gradient recipes, on block-like shapes: the forward (with bias, residual and relu, and
 *    without), dx and dW (accumulated onto a non-zero gradient) against the CPU emulation of the same
 *    bf16 inputs (near-exact: they differ by the order of fp32 sums, fast accumulation in the forward
 *    and the rounding of the output to bf16), and against the bf16 products (matmul_forward /
 *    matmul_backward): the FP8 error must stay within 1.25x the emulation's own error plus 4e-3;
 *    tensorwise told the amax of x and dy (fsdp_fp8_amax, as the norms and the backward ops report them)
 *    gives the measured outputs bit for bit;
 *  - a weight fed as codes (fsdp_fp8_weight, W and W^T as a gather brings them) gives the casting
 *    products' y, dx and dW bit for bit; the kernels behind FP8 weights on the wire (amax of a part, the
 *    parts' scales, the encode, the unpack from gathered pieces into W, W^T and the unit) against the CPU
 *    reference bit for bit, fp32 and bf16, ragged tiles, weights across pieces;
 *  - fp8_products is set exactly on GPUs of compute capability 8.9 and newer; elsewhere the
 *    products are skipped with a line (the casts still run), as `--fp8` must refuse there.
 * Exits 1 on any failure, 77 (skipped) without a GPU. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "kernels/fp8.h"
#include "kernels/fp8_cuda.h"
#include "check.h"
#define CUDA_RIG_SEED 0x510e527fade682d1ull
#include "cuda_rig.h"

static int nan_code(fsdp_dtype t, uint8_t c) { return t == FSDP_E4M3 ? (c & 0x7f) == 0x7f : (c & 0x7f) > 0x7c; }
static int same_bits(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* ---- casts ---- */

static void fill(float *x, int R, int Cc, int special, fsdp_dtype src_t) {
    for (size_t i = 0; i < (size_t)R * Cc; i++) {
        float v = (rnd() < 0.5 ? -1.0f : 1.0f) * ldexpf((float)(1.0 + rnd()), 3 - (int)(rnd() * 24));
        x[i] = src_t == FSDP_BF16 ? fsdp_round_bf16(v) : v;
    }
    if (!special || R < 9) return;
    for (int c = 0; c < Cc; c++) x[1 * Cc + c] = 0.0f, x[3 * Cc + c] = c % 2 ? -0.0f : 1e-30f;
    x[5 * Cc + Cc / 2] = NAN;
    x[7 * Cc + Cc / 3] = INFINITY;
    x[8 * Cc] = -INFINITY;
    if (src_t == FSDP_BF16) /* what the GPU will read */
        for (size_t i = 0; i < (size_t)R * Cc; i++) x[i] = fsdp_round_bf16(x[i]);
}

static void test_cast(int R, int Cc, fsdp_dtype src_t, fsdp_dtype t, int transpose, int rowwise, int pow2,
                      int special, int reported) {
    const int ns = !rowwise ? 1 : transpose ? Cc : R;
    const size_t n = (size_t)R * Cc;
    float *x = hmalloc(n);
    fill(x, R, Cc, special, src_t);
    uint8_t *rc = xmalloc(n), *gc = xmalloc(n);
    float *rs = hmalloc(ns), *ri = hmalloc(ns), *ra = hmalloc(ns), *gs = hmalloc(ns), *gi = hmalloc(ns), *ga = hmalloc(ns);
    float *given = NULL;
    if (reported) { /* a producer's amax: half the real one, so the largest values saturate */
        given = hmalloc(ns);
        cpu_fp8_amax(given, x, R, Cc, transpose, rowwise);
        for (int i = 0; i < ns; i++) given[i] *= 0.5f;
    }
    cpu_fp8_cast(rc, rs, ri, reported ? NULL : ra, x, R, Cc, transpose, rowwise, t, pow2, given);

    void *dx = dmalloc(n * esz(src_t));
    upload(dx, x, n, src_t);
    uint8_t *dc = dmalloc(n);
    float *ds = dmalloc(ns * 4), *di = dmalloc(ns * 4), *da = dmalloc(ns * 4), *dg = NULL;
    if (given) {
        dg = dmalloc(ns * 4);
        CK(cudaMemcpy(dg, given, ns * 4, cudaMemcpyHostToDevice));
    }
    fsdp_cuda_fp8_cast(dc, ds, di, da, dx, src_t, R, Cc, transpose, rowwise, t, pow2, dg, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gc, dc, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gs, ds, ns * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gi, di, ns * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ga, da, ns * 4, cudaMemcpyDeviceToHost));
    int bad = -1;
    for (int i = 0; i < ns && bad < 0; i++)
        if (!same_bits(gs[i], rs[i]) || !same_bits(gi[i], ri[i]) || (!reported && !same_bits(ga[i], ra[i]))) bad = i;
    size_t badc = (size_t)-1;
    for (size_t i = 0; i < n && badc == (size_t)-1; i++)
        if (gc[i] != rc[i] && !(nan_code(t, gc[i]) && nan_code(t, rc[i]))) badc = i;
    check_that(bad < 0 && badc == (size_t)-1,
               "cast %dx%d %s -> %s %s%s%s%s%s: %s", R, Cc, fsdp_dtype_name(src_t), fsdp_dtype_name(t),
               rowwise ? "rowwise" : "tensorwise", transpose ? " transposed" : "", pow2 ? " pow2" : "",
               special ? " special" : "", reported ? " reported-amax" : "",
               bad >= 0 ? "scale differs" : badc != (size_t)-1 ? "a code differs" : "bit-exact");
    if (bad >= 0)
        printf("      scale[%d] gpu %.9g / %.9g / amax %g, cpu %.9g / %.9g / amax %g\n", bad, gs[bad], gi[bad], ga[bad],
               rs[bad], ri[bad], ra[bad]);
    if (badc != (size_t)-1) printf("      code[%zu] gpu 0x%02x, cpu 0x%02x\n", badc, gc[badc], rc[badc]);
    free(x), free(rc), free(gc), free(rs), free(ri), free(ra), free(gs), free(gi), free(ga), free(given);
    dfree(dx), dfree(dc), dfree(ds), dfree(di), dfree(da), dfree(dg);
}

/* fsdp_cuda_fp8_cast_both against two CPU casts (without and with the transpose). */
static void test_cast_both(int R, int Cc, fsdp_dtype src_t, fsdp_dtype t, int rowwise) {
    const size_t n = (size_t)R * Cc;
    const int ns = rowwise ? R : 1, nt = rowwise ? Cc : 1;
    float *x = hmalloc(n);
    fill(x, R, Cc, 1, src_t);
    uint8_t *rc = xmalloc(n), *rt = xmalloc(n), *gc = xmalloc(n), *gt = xmalloc(n);
    float *rs = hmalloc(ns), *ri = hmalloc(ns), *rst = hmalloc(nt), *rit = hmalloc(nt);
    float *gs = hmalloc(ns), *gi = hmalloc(ns), *gst = hmalloc(nt), *git = hmalloc(nt);
    cpu_fp8_cast(rc, rs, ri, NULL, x, R, Cc, 0, rowwise, t, rowwise, NULL);
    cpu_fp8_cast(rt, rst, rit, NULL, x, R, Cc, 1, rowwise, t, rowwise, NULL);
    void *dx = dmalloc(n * esz(src_t));
    upload(dx, x, n, src_t);
    uint8_t *dc = dmalloc(n), *dt = dmalloc(n);
    float *d = dmalloc((size_t)(3 * ns + 3 * nt) * 4);
    fsdp_cuda_fp8_cast_both(dc, d, d + ns, d + 2 * ns, dt, d + 3 * ns, d + 3 * ns + nt, d + 3 * ns + 2 * nt, dx, src_t,
                            R, Cc, rowwise, t, rowwise, NULL, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gc, dc, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gt, dt, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gs, d, ns * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gi, d + ns, ns * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gst, d + 3 * ns, nt * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(git, d + 3 * ns + nt, nt * 4, cudaMemcpyDeviceToHost));
    int ok = 1;
    for (int i = 0; i < ns; i++) ok &= same_bits(gs[i], rs[i]) && same_bits(gi[i], ri[i]);
    for (int i = 0; i < nt; i++) ok &= same_bits(gst[i], rst[i]) && same_bits(git[i], rit[i]);
    for (size_t i = 0; i < n; i++) {
        ok &= gc[i] == rc[i] || (nan_code(t, gc[i]) && nan_code(t, rc[i]));
        ok &= gt[i] == rt[i] || (nan_code(t, gt[i]) && nan_code(t, rt[i]));
    }
    check_that(ok, "cast_both %dx%d %s -> %s %s: both layouts bit-exact", R, Cc, fsdp_dtype_name(src_t),
               fsdp_dtype_name(t), rowwise ? "rowwise" : "tensorwise");
    free(x), free(rc), free(rt), free(gc), free(gt), free(rs), free(ri), free(rst), free(rit);
    free(gs), free(gi), free(gst), free(git);
    dfree(dx), dfree(dc), dfree(dt), dfree(d);
}

static void test_casts(void) {
    const int shapes[][2] = {{37, 45}, {64, 128}, {130, 200}, {256, 2048}, {1000, 72}, {16, 11008}};
    const fsdp_dtype srcs[2] = {FSDP_F32, FSDP_BF16}, codes[2] = {FSDP_E4M3, FSDP_E5M2};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int si = 0; si < 2; si++)
            for (int ci = 0; ci < 2; ci++)
                for (int mode = 0; mode < 4; mode++) {
                    const int tr = mode & 1, rw = mode >> 1;
                    test_cast(shapes[k][0], shapes[k][1], srcs[si], codes[ci], tr, rw, rw, k < 3, 0);
                    if (k == 1 || k == 3) test_cast(shapes[k][0], shapes[k][1], srcs[si], codes[ci], tr, rw, !rw, 0, 1);
                    if (tr) test_cast_both(shapes[k][0], shapes[k][1], srcs[si], codes[ci], rw);
                }
}

/* ---- the epilogue ---- */

static void test_epilogue(fsdp_dtype out_t) {
    const int R = 67, Cn = 96;
    const size_t n = (size_t)R * Cn;
    float *acc = hrand(n, 100.0f, FSDP_F32), *ia = hrand(R, 0.01f, FSDP_F32), *ib = hrand(Cn, 0.01f, FSDP_F32);
    float *bias = hrand(Cn, 1.0f, out_t), *add = hrand(n, 1.0f, out_t), *want = hmalloc(n), *got = hmalloc(n);
    for (size_t i = 0; i < n; i++) {
        const int r = (int)(i / Cn), c = (int)(i % Cn);
        const float factor = ia[r] * ib[c];
        float y = factor * acc[i];
        y = y + bias[c];
        y = y + add[i];
        y = y < 0.0f ? 0.0f : y;
        want[i] = out_t == FSDP_BF16 ? fsdp_round_bf16(y) : y;
    }
    float *dacc = dmalloc(n * 4), *dia = dmalloc(R * 4), *dib = dmalloc(Cn * 4);
    void *dbias = dmalloc(Cn * esz(out_t)), *dout = dmalloc(n * esz(out_t));
    CK(cudaMemcpy(dacc, acc, n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dia, ia, R * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dib, ib, Cn * 4, cudaMemcpyHostToDevice));
    upload(dbias, bias, Cn, out_t);
    upload(dout, add, n, out_t);
    fsdp_cuda_fp8_scale_epilogue(dout, out_t, dacc, dia, 1, dib, 1, R, Cn, dbias, dout, 1, 0);
    CK(cudaDeviceSynchronize());
    download(got, dout, n, out_t);
    check_that(!memcmp(got, want, n * 4), "rowwise epilogue (%s, bias, in-place addend, relu) bit-exact",
               fsdp_dtype_name(out_t));
    free(acc), free(ia), free(ib), free(bias), free(add), free(want), free(got);
    dfree(dacc), dfree(dia), dfree(dib), dfree(dbias), dfree(dout);
}

/* ---- weights cast once per gather (fsdp_cuda_fp8_amax, _scales_of_parts, _encode, _unpack) ---- */

/* A weight's part from a shard (n elements, fp32 or bf16) encoded with the scale of the largest of three
 * parts' amaxes, and a weight unpacked from gathered pieces, against the CPU reference bit for bit. */
static void test_wire_encode(size_t n, fsdp_dtype src_t, int special) {
    float *x = hmalloc(n ? n : 1);
    fill(x, 1, (int)n, 0, src_t);
    if (special && n > 9) x[n / 2] = NAN;
    float parts[3 * 4] = {0}; /* three ranks' amaxes, FSDP_FP8_MAX_MATRICES apart, this one second */
    parts[0] = 0.25f, parts[8] = 3.0f;
    cpu_fp8_amax(&parts[4], x, 1, (int)n, 0, 0);
    float want[FSDP_FP8_SCALES], got[FSDP_FP8_SCALES], gamax;
    cpu_fp8_scales_of_parts(want, parts, 3, 4, FSDP_E4M3);
    uint8_t *rc = xmalloc(n + 1), *gc = xmalloc(n + 1);
    float s, inv;
    cpu_fp8_cast(rc, &s, &inv, NULL, x, 1, (int)n, 0, 0, FSDP_E4M3, 0, want + 2);
    void *dx = dmalloc((n + 1) * esz(src_t));
    upload(dx, x, n, src_t);
    float *dparts = dmalloc(sizeof parts), *dscales = dmalloc(FSDP_FP8_SCALES * 4), *damax = dmalloc(4);
    uint8_t *dc = dmalloc(n + 1);
    CK(cudaMemcpy(dparts, parts, sizeof parts, cudaMemcpyHostToDevice));
    fsdp_cuda_fp8_amax(damax, dx, src_t, n, 0);
    fsdp_cuda_fp8_scales_of_parts(dscales, dparts, 3, 4, FSDP_E4M3, 0);
    fsdp_cuda_fp8_encode(dc, dscales, dx, src_t, n, FSDP_E4M3, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(&gamax, damax, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got, dscales, sizeof got, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gc, dc, n, cudaMemcpyDeviceToHost));
    int ok = same_bits(gamax, parts[4]);
    for (int i = 0; i < FSDP_FP8_SCALES; i++) ok &= same_bits(got[i], want[i]);
    for (size_t i = 0; i < n; i++) ok &= gc[i] == rc[i] || (nan_code(FSDP_E4M3, gc[i]) && nan_code(FSDP_E4M3, rc[i]));
    check_that(ok, "FP8 weight part of %zu %s%s: amax, the parts' scales and the codes bit-exact", n,
               fsdp_dtype_name(src_t), special ? " with a NaN" : "");
    free(x), free(rc), free(gc);
    dfree(dx), dfree(dparts), dfree(dscales), dfree(damax), dfree(dc);
}

static void test_wire_unpack(int rows, int cols, int64_t offset, size_t count, int pieces, fsdp_dtype unit_t) {
    const size_t pb = fsdp_dtype_piece_bytes(FSDP_E4M3, count), n = (size_t)rows * cols;
    const size_t unit_n = count * (size_t)pieces;
    uint8_t *p = xmalloc(pb * (size_t)pieces);
    for (size_t i = 0; i < pb * (size_t)pieces; i++) p[i] = (uint8_t)(rnd() * 256.0) & 0xfe; /* no NaN codes */
    float scales[FSDP_FP8_SCALES] = {1.0f / 896.0f, 896.0f, 0.5f};
    float *unit = hmalloc(unit_n), *gunit = hmalloc(unit_n);
    for (size_t i = 0; i < unit_n; i++) unit[i] = unit_t == FSDP_BF16 ? fsdp_round_bf16((float)i) : (float)i;
    uint8_t *rc = xmalloc(n), *rt = xmalloc(n), *gcodes = xmalloc(n), *gt = xmalloc(n);
    fsdp_fp8_matrix m = {offset, rows, cols};
    void *dp = dmalloc(pb * (size_t)pieces), *du = dmalloc(unit_n * esz(unit_t));
    uint8_t *dc = dmalloc(n), *dt = dmalloc(n);
    float *ds = dmalloc(sizeof scales);
    CK(cudaMemcpy(dp, p, pb * (size_t)pieces, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, scales, sizeof scales, cudaMemcpyHostToDevice));
    upload(du, unit, unit_n, unit_t);
    cpu_fp8_unpack(rc, rt, unit, unit_t == FSDP_BF16, p, pb, count, &m, FSDP_E4M3, scales[0]);
    fsdp_cuda_fp8_unpack(dc, dt, du, unit_t, dp, pb, count, &m, FSDP_E4M3, ds, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gcodes, dc, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gt, dt, n, cudaMemcpyDeviceToHost));
    download(gunit, du, unit_n, unit_t);
    check_that(memcmp(gcodes, rc, n) == 0 && memcmp(gt, rt, n) == 0 && memcmp(gunit, unit, unit_n * 4) == 0,
               "FP8 weight %dx%d at %lld of %d pieces of %zu into %s: W, W^T and the unit's values bit-exact", rows,
               cols, (long long)offset, pieces, count, fsdp_dtype_name(unit_t));
    free(p), free(unit), free(gunit), free(rc), free(rt), free(gcodes), free(gt);
    dfree(dp), dfree(du), dfree(dc), dfree(dt), dfree(ds);
}

static void test_wire_weights(void) {
    const size_t parts[] = {0, 7, 4096, 100003};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        test_wire_encode(parts[i], FSDP_F32, 0);
        test_wire_encode(parts[i], FSDP_BF16, i == 3);
    }
    /* the vector kernel (every run of 4 aligned) and the scalar one (an odd offset), ragged tiles, weights
     * across pieces */
    test_wire_unpack(48, 32, 0, 1088, 3, FSDP_BF16);
    test_wire_unpack(80, 48, 1024, 2048, 3, FSDP_F32);
    test_wire_unpack(70, 100, 333, 3200, 3, FSDP_F32);
    test_wire_unpack(256, 512, 4096, 50048, 4, FSDP_BF16);
}

/* ---- products through the backend ---- */

static void *dev_copy(fsdp_backend *be, const float *h, size_t n, fsdp_dtype t) {
    void *d = be->runtime->alloc(be, n * esz(t), "test tensor");
    upload(d, h, n, t);
    return d;
}
static float *host_copy(const void *d, size_t n, fsdp_dtype t) {
    float *h = hmalloc(n);
    CK(cudaDeviceSynchronize());
    download(h, d, n, t);
    return h;
}
static float *round_all(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = fsdp_round_bf16(x[i]);
    return x;
}
static float *minus(const float *a, const float *b, size_t n) {
    float *d = hmalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = a[i] - b[i];
    return d;
}

/* 1 when the `bytes` bytes at device pointers x and y are the same. */
static int device_equal(const void *x, const void *y, size_t bytes) {
    char *a = malloc(bytes), *c = malloc(bytes);
    CK(cudaMemcpy(a, x, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c, y, bytes, cudaMemcpyDeviceToHost));
    const int same = a && c && !memcmp(a, c, bytes);
    free(a), free(c);
    return same;
}

/* FP8 (GPU) vs emulation (CPU) and vs the bf16 product (GPU), for one product's output. */
static void compare(const char *what, const char *recipe, const float *gpu, const float *emu, const float *bf16,
                    size_t n, double near_tol) {
    const double e_emu = rel_err(gpu, emu, n), e_bf = rel_err(gpu, bf16, n), e_ref = rel_err(emu, bf16, n);
    check_close(what, e_emu, near_tol);
    check_that(e_bf <= 1.25 * e_ref + 4e-3, "  %s vs bf16 product: %.4f (the emulation's own %.4f)", recipe, e_bf, e_ref);
}

static void test_products(fsdp_backend *be, int N, int C, int OC, const fsdp_fp8_recipe *r, const char *name,
                          int with_extras) {
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = round_all(hrand(nx, 1.0f, FSDP_F32), nx), *w = round_all(hrand(nw, 0.03f, FSDP_F32), nw);
    float *dy = round_all(hrand(ny, 1e-3f, FSDP_F32), ny), *b = round_all(hrand(OC, 0.5f, FSDP_F32), OC);
    float *res = round_all(hrand(ny, 1.0f, FSDP_F32), ny), *dw0 = hrand(nw, 1e-3f, FSDP_F32);
    for (int c = 0; c < C; c++) x[5 * C + c] = fsdp_round_bf16(x[5 * C + c] * 30.0f); /* an outlier row */
    void *dx_in = dev_copy(be, x, nx, FSDP_BF16), *dwt = dev_copy(be, w, nw, FSDP_BF16), *ddy = dev_copy(be, dy, ny, FSDP_BF16);
    void *db = dev_copy(be, b, OC, FSDP_BF16), *dres = dev_copy(be, res, ny, FSDP_BF16);
    void *dy8 = be->runtime->alloc(be, ny * 2, "y"), *dyb = be->runtime->alloc(be, ny * 2, "y bf16");
    void *dx8 = be->runtime->alloc(be, nx * 2, "dx"), *dxb = be->runtime->alloc(be, nx * 2, "dx bf16");
    void *dw8 = dev_copy(be, dw0, nw, FSDP_F32), *dwb = dev_copy(be, dw0, nw, FSDP_F32);
    const void *bias = with_extras ? db : NULL, *resid = with_extras ? dres : NULL;
    char what[160];
    /* Tensorwise runs as training does: the forward saves the amax of x and W, the backward reads it. */
    const int save = r->granularity == FSDP_FP8_TENSORWISE;
    float *saved = save ? be->runtime->alloc(be, FSDP_FP8_SAVED_AMAX * sizeof(float), "saved amax") : NULL;

    be->ops->matmul_forward_fp8(be, dy8, dx_in, dwt, bias, resid, N, C, OC, with_extras, r,
                                (fsdp_fp8_amax){NULL, NULL, saved}, NULL);
    be->ops->matmul_forward(be, dyb, dx_in, dwt, bias, resid, N, C, OC, with_extras);
    float *y8 = host_copy(dy8, ny, FSDP_BF16), *yb = host_copy(dyb, ny, FSDP_BF16), *ye = hmalloc(ny);
    cpu_fp8_matmul_forward(ye, x, w, with_extras ? b : NULL, with_extras ? res : NULL, N, C, OC, with_extras, r, FSDP_FP8_AMAX_NONE, NULL);
    round_all(ye, ny);
    snprintf(what, sizeof what, "%s forward %dx%dx%d%s vs the CPU emulation", name, N, C, OC,
             with_extras ? " (bias, residual, relu)" : "");
    compare(what, name, y8, ye, yb, ny, 1e-2); /* fast accumulation: no promotion to fp32 */
    if (save) {
        float got[FSDP_FP8_SAVED_AMAX], ax = 0.0f, aw = 0.0f;
        CK(cudaMemcpy(got, saved, sizeof got, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nx; i++) ax = fmaxf(ax, fabsf(x[i]));
        for (size_t i = 0; i < nw; i++) aw = fmaxf(aw, fabsf(w[i]));
        check_that(got[0] == ax && got[1] == aw, "%s forward %dx%dx%d saved max|x| %g, max|W| %g (want %g, %g)", name, N,
                   C, OC, got[0], got[1], ax, aw);
    }

    be->ops->matmul_backward_fp8(be, dx8, dw8, NULL, ddy, dx_in, dwt, N, C, OC, r, (fsdp_fp8_amax){NULL, NULL, saved}, NULL);
    be->ops->matmul_backward(be, dxb, dwb, NULL, ddy, dx_in, dwt, N, C, OC);
    float *gx8 = host_copy(dx8, nx, FSDP_BF16), *gxb = host_copy(dxb, nx, FSDP_BF16);
    float *gw8 = host_copy(dw8, nw, FSDP_F32), *gwb = host_copy(dwb, nw, FSDP_F32);
    float *ex = hmalloc(nx), *ew = hmalloc(nw);
    memcpy(ew, dw0, nw * 4);
    cpu_fp8_matmul_backward(ex, ew, NULL, dy, x, w, N, C, OC, r, FSDP_FP8_AMAX_NONE, NULL);
    round_all(ex, nx);
    snprintf(what, sizeof what, "%s dx %dx%dx%d vs the CPU emulation", name, N, C, OC);
    compare(what, name, gx8, ex, gxb, nx, 6e-3);
    /* the gradient's increments, so that the starting values do not hide the product's error */
    float *i8 = minus(gw8, dw0, nw), *ie = minus(ew, dw0, nw), *ib = minus(gwb, dw0, nw);
    snprintf(what, sizeof what, "%s dW += %dx%dx%d vs the CPU emulation", name, N, C, OC);
    compare(what, name, i8, ie, ib, nw, 2e-3);

    if (save) { /* the amax of x and dy as their producers report them (the norm, the next op's backward) */
        float given_h[2] = {0.0f, 0.0f};
        for (size_t i = 0; i < nx; i++) given_h[0] = fmaxf(given_h[0], fabsf(x[i]));
        for (size_t i = 0; i < ny; i++) given_h[1] = fmaxf(given_h[1], fabsf(dy[i]));
        float *given = be->runtime->alloc(be, sizeof given_h, "given amax");
        float *saved2 = be->runtime->alloc(be, FSDP_FP8_SAVED_AMAX * sizeof(float), "saved amax");
        CK(cudaMemcpy(given, given_h, sizeof given_h, cudaMemcpyHostToDevice));
        void *gy = be->runtime->alloc(be, ny * 2, "y"), *gx = be->runtime->alloc(be, nx * 2, "dx");
        void *gw = dev_copy(be, dw0, nw, FSDP_F32);
        be->ops->matmul_forward_fp8(be, gy, dx_in, dwt, bias, resid, N, C, OC, with_extras, r,
                                    (fsdp_fp8_amax){given, NULL, saved2}, NULL);
        be->ops->matmul_backward_fp8(be, gx, gw, NULL, ddy, dx_in, dwt, N, C, OC, r,
                                     (fsdp_fp8_amax){NULL, given + 1, saved2}, NULL);
        const int same = device_equal(dy8, gy, ny * 2) && device_equal(dx8, gx, nx * 2) && device_equal(dw8, gw, nw * 4);
        check_that(same, "%s %dx%dx%d: with the amax of x and dy given (as reported), y, dx and dW are the measured "
                   "ones bit for bit", name, N, C, OC);
        void *more[] = {given, saved2, gy, gx, gw};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) be->runtime->free(be, more[i]);
    }

    if (save) { /* the weight as a gather brings it (fsdp_fp8_weight): W and W^T cast once, read by both products */
        uint8_t *wc = be->runtime->alloc(be, nw, "W codes"), *wt = be->runtime->alloc(be, nw, "W^T codes");
        /* inverse, scale, amax as the engine keeps them; W^T's (the same) a stride further */
        float *sc = be->runtime->alloc(be, 2 * FSDP_FP8_SCALES_STRIDE * sizeof(float), "W scales");
        float *st = sc + FSDP_FP8_SCALES_STRIDE;
        fsdp_cuda_fp8_cast_both(wc, sc + 1, sc, sc + 2, wt, st + 1, st, st + 2, dwt, FSDP_BF16, OC, C, 0, FSDP_E4M3, 0,
                                NULL, 0);
        fsdp_fp8_weight w8 = {wc, wt, sc};
        float *saved3 = be->runtime->alloc(be, FSDP_FP8_SAVED_AMAX * sizeof(float), "saved amax");
        void *gy = be->runtime->alloc(be, ny * 2, "y"), *gx = be->runtime->alloc(be, nx * 2, "dx");
        void *gw = dev_copy(be, dw0, nw, FSDP_F32);
        be->ops->matmul_forward_fp8(be, gy, dx_in, dwt, bias, resid, N, C, OC, with_extras, r,
                                    (fsdp_fp8_amax){NULL, NULL, saved3}, &w8);
        be->ops->matmul_backward_fp8(be, gx, gw, NULL, ddy, dx_in, dwt, N, C, OC, r,
                                     (fsdp_fp8_amax){NULL, NULL, saved3}, &w8);
        const int same = device_equal(dy8, gy, ny * 2) && device_equal(dx8, gx, nx * 2) && device_equal(dw8, gw, nw * 4);
        float kept[FSDP_FP8_SAVED_AMAX], aw = 0.0f;
        CK(cudaMemcpy(kept, saved3, sizeof kept, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nw; i++) aw = fmaxf(aw, fabsf(w[i]));
        check_that(same && kept[1] == aw,
                   "%s %dx%dx%d: fed the weight's codes (W, W^T) as a gather brings them, y, dx and dW are the "
                   "casting products' bit for bit, and the forward keeps its amax (%g, want %g)", name, N, C, OC,
                   kept[1], aw);
        void *frees[] = {wc, wt, sc, saved3, gy, gx, gw};
        for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) be->runtime->free(be, frees[i]);
    }
    free(x), free(w), free(dy), free(b), free(res), free(dw0), free(y8), free(yb), free(ye), free(gx8), free(gxb);
    free(gw8), free(gwb), free(ex), free(ew), free(i8), free(ie), free(ib);
    if (saved) be->runtime->free(be, saved);
    void *ptrs[] = {dx_in, dwt, ddy, db, dres, dy8, dyb, dx8, dxb, dw8, dwb};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) be->runtime->free(be, ptrs[i]);
}

static void test_backend(void) {
    fsdp_err err = {0};
    fsdp_backend_options o = {.kind = "cuda", .act_dtype = FSDP_BF16, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend *be = fsdp_backend_create(&o, &err);
    if (!check_that(be != NULL, "CUDA backend created%s%s", be ? "" : ": ", be ? "" : err.msg)) return;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int fp8_hw = prop.major * 10 + prop.minor >= 89;
    check_that(be->fp8_products == fp8_hw, "fp8_products = %d on sm_%d%d%s%s", be->fp8_products, prop.major, prop.minor,
               fp8_hw ? "" : ": ", fp8_hw ? "" : be->fp8_unavailable);
    if (!be->fp8_products) {
        printf("test_gpu_fp8: products SKIPPED (%s)\n", be->fp8_unavailable);
        be->runtime->destroy(be);
        return;
    }
    fsdp_fp8_recipe tw = fsdp_fp8_recipe_of(FSDP_FP8_TENSORWISE), rw = fsdp_fp8_recipe_of(FSDP_FP8_ROWWISE);
    fsdp_fp8_recipe hybrid = tw;
    hybrid.grad_t = FSDP_E5M2;
    const struct {
        int N, C, OC;
    } shapes[] = {{256, 512, 768}, {512, 1024, 256}, {1024, 2048, 3072}, {272, 176, 688}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        test_products(be, shapes[k].N, shapes[k].C, shapes[k].OC, &tw, "tensorwise", k == 0);
        test_products(be, shapes[k].N, shapes[k].C, shapes[k].OC, &rw, "rowwise", k == 0);
        test_products(be, shapes[k].N, shapes[k].C, shapes[k].OC, &hybrid, "tensorwise+e5m2", 0);
    }
    be->runtime->destroy(be);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (!fsdp_backend_cuda_available()) {
        printf("test_gpu_fp8: SKIPPED (no GPU)\n");
        MPI_Finalize();
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    test_casts();
    test_epilogue(FSDP_F32);
    test_epilogue(FSDP_BF16);
    test_wire_weights();
    test_backend();
    CK(cudaGetLastError());
    int status = check_summary("test_gpu_fp8");
    MPI_Finalize();
    return status;
}
