/* The FP8 scaling arithmetic and the emulated FP8 products (src/kernels/fp8.h, src/kernels/cpu/fp8.c)
 * against references written here:
 *  - scales: amax -> scale = fp8_max / max(amax, 1e-12) in double (torchao's amax_to_scale), the
 *    power-of-two rounding checked as a property (a power of two, at most the scale, above half of
 *    it), inverse scales 1 / scale;
 *  - codes: every code is the nearest e4m3 / e5m2 value to x * scale found by searching all 256 codes
 *    (decoded here from the bit layout, not by the library), ties to the even code, saturating at
 *    +-max; on random rows and columns, all zeros, a NaN, an Inf, fp32 subnormals, an amax below the
 *    epsilon, values that land among fp8's subnormals, negative zeros, and a reported amax smaller
 *    than the real one (the producer entry point: the excess saturates);
 *  - products: each emulated product (forward, dx, dW accumulated, for tensorwise, rowwise and e5m2
 *    gradients) within a bound derived from the formats' precision, element by element: with
 *    u = 2^-(mantissa bits + 1) and h half the smallest subnormal, each operand value is off by at
 *    most e = max(u |v|, h / scale), so |sum a b - sum a~ b~| <= sum (ea |b| + eb |a| + ea eb), plus
 *    the fp32 summation's rounding; rowwise scaling beats tensorwise by far on rows of very different
 *    magnitudes; the CPU backend's ops equal the reference rounded to bf16; odd shapes are refused
 *    by fsdp_fp8_shape_ok.
 * Exits 1 on any failure. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "kernels/fp8.h"
#include "check.h"

static uint64_t g_rng = 0x6a09e667f3bcc909ull;
static double rnd(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}
static float rnd_sym(float a) { return (float)((2.0 * rnd() - 1.0) * a); }

static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* ---- reference: the formats from their bit layouts ---- */

static int mant_bits(fsdp_dtype t) { return t == FSDP_E4M3 ? 3 : 2; }
static int exp_bias(fsdp_dtype t) { return t == FSDP_E4M3 ? 7 : 15; }
static double fmt_max(fsdp_dtype t) { return t == FSDP_E4M3 ? 448.0 : 57344.0; }

/* The value of a code, NaN for NaN and Inf codes (which a saturating cast never writes for numbers). */
static double ref_decode(fsdp_dtype t, unsigned code) {
    const int M = mant_bits(t), bias = exp_bias(t);
    const unsigned mag = code & 0x7f, e = mag >> M, m = mag & ((1u << M) - 1);
    if (t == FSDP_E4M3 && mag == 0x7f) return NAN;
    if (t == FSDP_E5M2 && e == 31) return NAN;
    double v = e == 0 ? ldexp((double)m, 1 - bias - M) : ldexp((double)((1u << M) + m), (int)e - bias - M);
    return code & 0x80 ? -v : v;
}

/* The nearest code to y: search every finite code; ties to the even code; beyond max saturates. */
static unsigned ref_encode(fsdp_dtype t, float y) {
    if (isnan(y)) return 0x7f;
    double best_d = INFINITY;
    unsigned best = 0;
    const double a = fabs((double)y) > fmt_max(t) ? fmt_max(t) : fabs((double)y);
    for (unsigned c = 0; c < 0x80; c++) {
        double v = ref_decode(t, c);
        if (isnan(v)) continue;
        double d = fabs(v - a);
        if (d < best_d || (d == best_d && !(c & 1))) best_d = d, best = c;
    }
    return (signbit(y) ? 0x80u : 0u) | best;
}

static int code_equal(fsdp_dtype t, unsigned got, unsigned want) {
    if (isnan(ref_decode(t, want))) return isnan(ref_decode(t, got));
    if ((want & 0x7f) == 0) return (got & 0x7f) == 0 && (got & 0x80) == (want & 0x80);
    return got == want;
}

static float ref_scale(float amax, fsdp_dtype t) {
    double a = isnan(amax) ? amax : fmax((double)amax, 1e-12);
    return (float)(fmt_max(t) / a);
}

static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || a == b; }

/* ---- the casts ---- */

/* Checks cpu_fp8_cast of x[R, Cc] against the reference; amax_in optional (the producer's). */
static void check_cast(const char *what, const float *x, int R, int Cc, int transpose, int rowwise, fsdp_dtype t,
                       int pow2, const float *amax_in) {
    const int ns = !rowwise ? 1 : transpose ? Cc : R;
    uint8_t *codes = xmalloc((size_t)R * Cc);
    float *scale = xmalloc(ns * 4), *inv = xmalloc(ns * 4), *amax = xmalloc(ns * 4), *ramax = xmalloc(ns * 4);
    cpu_fp8_cast(codes, scale, inv, amax_in ? NULL : amax, x, R, Cc, transpose, rowwise, t, pow2, amax_in);
    /* reference amax: max |x| in double, NaN if any NaN */
    for (int i = 0; i < ns; i++) ramax[i] = 0.0f;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < Cc; c++) {
            int i = !rowwise ? 0 : transpose ? c : r;
            float v = x[(size_t)r * Cc + c];
            if (isnan(v) || isnan(ramax[i])) ramax[i] = NAN;
            else if (fabsf(v) > ramax[i]) ramax[i] = fabsf(v);
        }
    int bad = 0;
    for (int i = 0; i < ns && !bad; i++) {
        const float a = amax_in ? amax_in[i] : ramax[i];
        if (!amax_in && !same_float(amax[i], ramax[i])) {
            check_that(0, "%s: amax[%d] %g, reference %g", what, i, amax[i], ramax[i]);
            bad = 1;
        }
        float want = ref_scale(a, t);
        if (pow2) {
            /* a power of two at most the exact scale and above half of it */
            int e;
            double m = frexp(scale[i], &e);
            if (!(isnan(want) ? isnan(scale[i])
                              : want == 0.0f ? scale[i] == 0.0f : (m == 0.5 && scale[i] <= want && scale[i] > want / 2)))
                check_that(0, "%s: scale[%d] %g is not the power of two below %g", what, i, scale[i], want), bad = 1;
            want = scale[i];
        } else if (!same_float(scale[i], want)) {
            check_that(0, "%s: scale[%d] %.9g, reference %.9g (amax %g)", what, i, scale[i], want, a), bad = 1;
        }
        if (!same_float(inv[i], 1.0f / want))
            check_that(0, "%s: inv_scale[%d] %g is not 1 / %g", what, i, inv[i], want), bad = 1;
    }
    for (int r = 0; r < R && !bad; r++)
        for (int c = 0; c < Cc && !bad; c++) {
            const int i = !rowwise ? 0 : transpose ? c : r;
            const float y = x[(size_t)r * Cc + c] * scale[i];
            const unsigned want = ref_encode(t, y);
            const unsigned got = codes[transpose ? (size_t)c * R + r : (size_t)r * Cc + c];
            if (!code_equal(t, got, want)) {
                check_that(0, "%s: code of x[%d,%d] = %g (scaled %g) is 0x%02x, reference 0x%02x", what, r, c,
                           x[(size_t)r * Cc + c], y, got, want);
                bad = 1;
            }
        }
    check_that(!bad, "cast %s (%dx%d, %s%s, %s%s)", what, R, Cc, rowwise ? "rowwise" : "tensorwise",
               transpose ? ", transposed" : "", fsdp_dtype_name(t), pow2 ? ", pow2" : "");
    free(codes), free(scale), free(inv), free(amax), free(ramax);
}

static void test_casts(void) {
    const fsdp_dtype types[2] = {FSDP_E4M3, FSDP_E5M2};
    const int R = 37, Cc = 45;
    float *x = xmalloc((size_t)R * Cc * 4);
    for (int ti = 0; ti < 2; ti++) {
        const fsdp_dtype t = types[ti];
        for (int mode = 0; mode < 4; mode++) {
            const int transpose = mode & 1, rowwise = mode >> 1;
            /* values over 30 binades: after scaling many fall among fp8's subnormals or below */
            for (size_t i = 0; i < (size_t)R * Cc; i++)
                x[i] = (rnd() < 0.5 ? -1.0f : 1.0f) * ldexpf((float)(1.0 + rnd()), 4 - (int)(rnd() * 30));
            check_cast("spread", x, R, Cc, transpose, rowwise, t, 0, NULL);
            check_cast("spread", x, R, Cc, transpose, rowwise, t, 1, NULL);
            /* special rows and columns */
            for (size_t i = 0; i < (size_t)R * Cc; i++) x[i] = rnd_sym(3.0f);
            for (int c = 0; c < Cc; c++) x[2 * Cc + c] = 0.0f;                                   /* a zero row */
            for (int c = 0; c < Cc; c++) x[4 * Cc + c] = c % 2 ? -0.0f : 0.0f;                   /* -0 */
            for (int c = 0; c < Cc; c++) x[6 * Cc + c] = rnd_sym(1e-39f);                         /* fp32 subnormals */
            for (int c = 0; c < Cc; c++) x[8 * Cc + c] = rnd_sym(1e-14f);                         /* amax < eps */
            for (int c = 0; c < Cc; c++) x[10 * Cc + c] = ldexpf(rnd_sym(1.0f), -12);             /* tiny codes */
            x[12 * Cc + 5] = NAN;
            x[14 * Cc + 7] = INFINITY;
            x[16 * Cc + 9] = -INFINITY;
            check_cast("special", x, R, Cc, transpose, rowwise, t, 0, NULL);
            check_cast("special", x, R, Cc, transpose, rowwise, t, 1, NULL);
            /* finite only, zeros and subnormals included */
            x[12 * Cc + 5] = 1.0f, x[14 * Cc + 7] = -2.0f, x[16 * Cc + 9] = 0.5f;
            check_cast("finite", x, R, Cc, transpose, rowwise, t, 0, NULL);
            /* a reported amax a quarter of the real one: the largest values saturate */
            const int ns = !rowwise ? 1 : transpose ? Cc : R;
            float *amax = xmalloc(ns * 4);
            cpu_fp8_amax(amax, x, R, Cc, transpose, rowwise);
            for (int i = 0; i < ns; i++) amax[i] *= 0.25f;
            check_cast("reported amax", x, R, Cc, transpose, rowwise, t, 0, amax);
            free(amax);
        }
        /* a whole tensor of zeros: a finite scale, zero codes */
        for (size_t i = 0; i < (size_t)R * Cc; i++) x[i] = 0.0f;
        check_cast("zeros", x, R, Cc, 0, 0, t, 0, NULL);
    }
    /* saturation and ties, directly: amax 448 gives scale 1 */
    float row[16] = {448.0f, -448.0f, 480.0f, 1.0625f, 1.1875f, 0.0009765625f, 0.0029296875f, -0.0f,
                     17.0f, 19.0f, 240.0f, 232.0f, 0.001953125f, 0.0048828125f, -1.0625f, 0.0f};
    check_cast("ties", row, 1, 16, 0, 0, FSDP_E4M3, 0, NULL);
    /* the saturating values themselves: 480 * 1 is above 448 after the reported amax 448 */
    float one_amax = 448.0f;
    check_cast("saturation", row, 1, 16, 0, 0, FSDP_E4M3, 0, &one_amax);
    uint8_t codes[16];
    float s, inv;
    cpu_fp8_cast(codes, &s, &inv, NULL, row, 1, 16, 0, 0, FSDP_E4M3, 0, &one_amax);
    check_that(codes[2] == 0x7e && codes[1] == 0xfe && s == 1.0f, "480 saturates to 448 (0x%02x), -448 is 0x%02x", codes[2],
               codes[1]);
    free(x);
}

/* ---- the products ---- */

/* Largest magnitude per operand row (rowwise) or overall, for the bound's subnormal term. */
static double unit_roundoff(fsdp_dtype t) { return ldexp(1.0, -(mant_bits(t) + 1)); }
static double half_subnormal(fsdp_dtype t) { return ldexp(1.0, 1 - exp_bias(t) - mant_bits(t) - 1); }

/* out[R, Cn] vs sum_k a[r,k] b[c,k] (a [R,K], b [Cn,K], fp32 values, row-major; a_t/b_t their fp8
 * types; rowwise: scales per row). Returns the worst ratio err / bound. */
static double product_bound_ratio(const float *out, const float *base, const float *a, fsdp_dtype a_t,
                                  const float *b, fsdp_dtype b_t, int R, int Cn, int K, int rowwise, int pow2) {
    float *sa = xmalloc(R * 4), *sb = xmalloc(Cn * 4);
    cpu_fp8_amax(sa, a, R, K, 0, rowwise);
    cpu_fp8_amax(sb, b, Cn, K, 0, rowwise);
    for (int i = 0; i < (rowwise ? R : 1); i++) sa[i] = fsdp_fp8_scale(sa[i], (float)fmt_max(a_t), pow2);
    for (int i = 0; i < (rowwise ? Cn : 1); i++) sb[i] = fsdp_fp8_scale(sb[i], (float)fmt_max(b_t), pow2);
    const double ua = unit_roundoff(a_t), ub = unit_roundoff(b_t);
    double worst = 0.0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < Cn; c++) {
            const double ha = half_subnormal(a_t) / sa[rowwise ? r : 0], hb = half_subnormal(b_t) / sb[rowwise ? c : 0];
            double exact = 0.0, bound = 0.0, absum = 0.0;
            for (int k = 0; k < K; k++) {
                const double x = a[(size_t)r * K + k], y = b[(size_t)c * K + k];
                const double ea = fmax(ua * fabs(x), ha), eb = fmax(ub * fabs(y), hb);
                exact += x * y;
                bound += ea * fabs(y) + eb * fabs(x) + ea * eb;
                absum += (fabs(x) + ea) * (fabs(y) + eb);
            }
            const double want = exact + (base ? base[(size_t)r * Cn + c] : 0.0);
            /* fp32 sums of K terms (8 partial sums and their tree), the scaling and the final addition */
            bound += (K + 8) * ldexp(1.0, -23) * absum + ldexp(1.0, -22) * fabs(want);
            const double err = fabs((double)out[(size_t)r * Cn + c] - want);
            const double ratio = err / bound;
            if (!(ratio <= worst)) worst = ratio; /* NaN sticks */
        }
    free(sa), free(sb);
    return worst;
}

static float *rand_matrix(int R, int Cc, float a) {
    float *m = xmalloc((size_t)R * Cc * 4);
    for (size_t i = 0; i < (size_t)R * Cc; i++) m[i] = rnd_sym(a);
    return m;
}

static float *transpose_of(const float *x, int R, int Cc) {
    float *t = xmalloc((size_t)R * Cc * 4);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < Cc; c++) t[(size_t)c * R + r] = x[(size_t)r * Cc + c];
    return t;
}

static void test_products(const fsdp_fp8_recipe *rc, const char *name) {
    const int N = 48, C = 80, OC = 32;
    const int rw = rc->granularity == FSDP_FP8_ROWWISE;
    float *x = rand_matrix(N, C, 2.0f), *w = rand_matrix(OC, C, 0.05f), *dy = rand_matrix(N, OC, 1e-3f);
    /* a few rows far larger than the rest, as activations have */
    for (int c = 0; c < C; c++) x[3 * C + c] *= 40.0f;
    float *y = xmalloc((size_t)N * OC * 4), *dx = xmalloc((size_t)N * C * 4), *dw = rand_matrix(OC, C, 1e-4f);
    float *dw0 = xmalloc((size_t)OC * C * 4);
    memcpy(dw0, dw, (size_t)OC * C * 4);
    cpu_fp8_matmul_forward(y, x, w, NULL, NULL, N, C, OC, 0, rc, FSDP_FP8_AMAX_NONE, NULL);
    cpu_fp8_matmul_backward(dx, dw, NULL, dy, x, w, N, C, OC, rc, FSDP_FP8_AMAX_NONE, NULL);
    double r1 = product_bound_ratio(y, NULL, x, FSDP_E4M3, w, FSDP_E4M3, N, OC, C, rw, rc->pow2_scales);
    float *wt = transpose_of(w, OC, C), *dyt = transpose_of(dy, N, OC), *xt = transpose_of(x, N, C);
    double r2 = product_bound_ratio(dx, NULL, dy, rc->grad_t, wt, FSDP_E4M3, N, C, OC, rw, rc->pow2_scales);
    double r3 = product_bound_ratio(dw, dw0, dyt, rc->grad_t, xt, FSDP_E4M3, OC, C, N, rw, rc->pow2_scales);
    check_close("forward within the e4m3 bound (err / bound)", r1, 1.0);
    check_close("dx within the bound (err / bound)", r2, 1.0);
    check_close("dW += within the bound (err / bound)", r3, 1.0);
    printf("      (%s: worst err / bound %.3f %.3f %.3f)\n", name, r1, r2, r3);
    free(x), free(w), free(dy), free(y), free(dx), free(dw), free(dw0), free(wt), free(dyt), free(xt);
}

/* Rows of magnitudes 2^0 .. 2^-19: tensorwise scaling pushes the small rows below e4m3's range,
 * rowwise keeps every row's relative precision. */
static void test_rowwise_precision(void) {
    const int N = 32, C = 64, OC = 16;
    float *x = rand_matrix(N, C, 1.0f), *w = rand_matrix(OC, C, 1.0f);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) x[(size_t)n * C + c] = ldexpf(x[(size_t)n * C + c], -(n % 20));
    double err[3];
    for (int g = 1; g <= 2; g++) {
        fsdp_fp8_recipe rc = fsdp_fp8_recipe_of((fsdp_fp8_granularity)g);
        float *y = xmalloc((size_t)N * OC * 4);
        cpu_fp8_matmul_forward(y, x, w, NULL, NULL, N, C, OC, 0, &rc, FSDP_FP8_AMAX_NONE, NULL);
        double worst = 0.0; /* the worst row's relative error */
        for (int n = 0; n < N; n++) {
            double num = 0, den = 0;
            for (int o = 0; o < OC; o++) {
                double exact = 0;
                for (int c = 0; c < C; c++) exact += (double)x[(size_t)n * C + c] * w[(size_t)o * C + c];
                num += (y[(size_t)n * OC + o] - exact) * (y[(size_t)n * OC + o] - exact);
                den += exact * exact;
            }
            worst = fmax(worst, sqrt(num / den));
        }
        err[g] = worst;
        free(y);
    }
    check_that(err[2] < 0.1 && err[1] > 4 * err[2], "rowwise keeps small rows (worst row error %.3f) where tensorwise loses them (%.3f)",
               err[2], err[1]);
    free(x), free(w);
}

/* The CPU backend with bf16 activations and fp32 gradients (NULL: it could not be made). */
static fsdp_backend *cpu_backend(void) {
    fsdp_err err = {0};
    fsdp_backend_options o = {.kind = "cpu", .act_dtype = FSDP_BF16, .grad_dtype = FSDP_F32, .local_size = 1};
    return fsdp_backend_create(&o, &err);
}

/* The CPU backend's ops: the reference products, outputs rounded to bf16, bias and residual. With a
 * saved amax (tensorwise) the forward records max |x| and max |W| and the backward, reading them,
 * gives what measuring x^T and W^T again gives. */
static void backend_ops_case(fsdp_backend *be, fsdp_fp8_granularity g, int save) {
    const int N = 32, C = 48, OC = 64;
    fsdp_fp8_recipe rc = fsdp_fp8_recipe_of(g);
    const char *name = fsdp_fp8_name(g), *how = save ? ", the amax saved by the forward" : "";
    float *x = rand_matrix(N, C, 1.0f), *w = rand_matrix(OC, C, 0.1f), *b = rand_matrix(1, OC, 0.5f);
    float *res = rand_matrix(N, OC, 1.0f), *dy = rand_matrix(N, OC, 0.01f);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = fsdp_round_bf16(x[i]);
    float saved[FSDP_FP8_SAVED_AMAX] = {-1.0f, -1.0f};
    float *y = xmalloc((size_t)N * OC * 4), *want = xmalloc((size_t)N * OC * 4);
    be->ops->matmul_forward_fp8(be, y, x, w, b, res, N, C, OC, 1, &rc, (fsdp_fp8_amax){NULL, NULL, save ? saved : NULL}, NULL);
    cpu_fp8_matmul_forward(want, x, w, b, res, N, C, OC, 1, &rc, FSDP_FP8_AMAX_NONE, NULL);
    int same = 1;
    for (size_t i = 0; i < (size_t)N * OC; i++) same &= y[i] == fsdp_round_bf16(want[i]);
    check_that(same, "%s: backend matmul_forward_fp8 (bias, residual, relu) = reference rounded to bf16%s", name, how);
    if (save) {
        float ax = 0.0f, aw = 0.0f;
        for (size_t i = 0; i < (size_t)N * C; i++) ax = fmaxf(ax, fabsf(x[i]));
        for (size_t i = 0; i < (size_t)OC * C; i++) aw = fmaxf(aw, fabsf(w[i]));
        if (g == FSDP_FP8_TENSORWISE)
            check_that(saved[0] == ax && saved[1] == aw, "%s: the forward saved max|x| %g and max|W| %g (want %g, %g)",
                       name, saved[0], saved[1], ax, aw);
        else
            check_that(saved[0] == -1.0f && saved[1] == -1.0f, "%s: rowwise leaves the saved amax alone", name);
    }
    float *dx = xmalloc((size_t)N * C * 4), *dw = xmalloc((size_t)OC * C * 4), *db = xmalloc(OC * 4);
    float *rdx = xmalloc((size_t)N * C * 4), *rdw = xmalloc((size_t)OC * C * 4), *rdb = xmalloc(OC * 4);
    memset(dw, 0, (size_t)OC * C * 4), memset(rdw, 0, (size_t)OC * C * 4), memset(db, 0, OC * 4), memset(rdb, 0, OC * 4);
    be->ops->matmul_backward_fp8(be, dx, dw, db, dy, x, w, N, C, OC, &rc, (fsdp_fp8_amax){NULL, NULL, save ? saved : NULL}, NULL);
    cpu_fp8_matmul_backward(rdx, rdw, rdb, dy, x, w, N, C, OC, &rc, FSDP_FP8_AMAX_NONE, NULL);
    same = 1;
    for (size_t i = 0; i < (size_t)N * C; i++) same &= dx[i] == fsdp_round_bf16(rdx[i]);
    for (size_t i = 0; i < (size_t)OC * C; i++) same &= dw[i] == rdw[i];
    for (int i = 0; i < OC; i++) same &= db[i] == rdb[i];
    check_that(same, "%s: backend matmul_backward_fp8 = reference (dx rounded to bf16, dW and db in fp32)%s", name, how);
    if (save && g == FSDP_FP8_TENSORWISE) {
        /* A saved amax that is not the tensors' changes the scales: the backward does read it. */
        float wrong[FSDP_FP8_SAVED_AMAX] = {saved[0] * 3.0f, saved[1] * 3.0f};
        memset(dw, 0, (size_t)OC * C * 4);
        be->ops->matmul_backward_fp8(be, dx, dw, db, dy, x, w, N, C, OC, &rc, (fsdp_fp8_amax){NULL, NULL, wrong}, NULL);
        int differs = 0;
        for (size_t i = 0; i < (size_t)OC * C; i++) differs |= dw[i] != rdw[i];
        check_that(differs, "%s: the backward's x^T and W^T scales come from the saved amax", name);
    }
    free(x), free(w), free(b), free(res), free(dy), free(y), free(want), free(dx), free(dw), free(db);
    free(rdx), free(rdw), free(rdb);
}

static void test_backend_ops(void) {
    fsdp_backend *be = cpu_backend();
    if (!check_that(be != NULL, "CPU backend created")) return;
    check_that(be->fp8_products == 1, "the CPU backend emulates FP8 products");
    backend_ops_case(be, FSDP_FP8_ROWWISE, 0);
    backend_ops_case(be, FSDP_FP8_ROWWISE, 1);
    backend_ops_case(be, FSDP_FP8_TENSORWISE, 0);
    backend_ops_case(be, FSDP_FP8_TENSORWISE, 1);
    be->runtime->destroy(be);
}

/* The CPU backend's ops that report their output's amax (out_amax of backend.h): max |out| over the
 * stored (bf16-rounded) values, exactly. */
static float max_abs(const float *v, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(v[i]));
    return m;
}

static void test_reported_amax(void) {
    fsdp_backend *be = cpu_backend();
    if (!check_that(be != NULL, "CPU backend created")) return;
    const int N = 16, C = 48, F = 32;
    float *x = rand_matrix(N, C, 3.0f), *w = rand_matrix(1, C, 1.0f), *b = rand_matrix(1, C, 0.5f);
    float *res = rand_matrix(N, C, 1.0f), *gu = rand_matrix(N, 2 * F, 4.0f), *dy = rand_matrix(N, F, 1.0f);
    float *out = xmalloc((size_t)N * C * 4), *res_out = xmalloc((size_t)N * C * 4), *mean = xmalloc(N * 4);
    float *rstd = xmalloc(N * 4), *act = xmalloc((size_t)N * 2 * F * 4), amax = -1.0f;
    be->ops->rmsnorm_forward(be, out, rstd, x, w, N, C, 1e-5f, &amax);
    check_that(amax == max_abs(out, (size_t)N * C) && amax > 0, "rmsnorm_forward reports max |out| (%g)", amax);
    amax = -1.0f;
    be->ops->layernorm_forward(be, out, mean, rstd, x, w, b, N, C, 1e-5f, &amax);
    check_that(amax == max_abs(out, (size_t)N * C) && amax > 0, "layernorm_forward reports max |out| (%g)", amax);
    fsdp_dropout d = fsdp_dropout_make(0.1, 5, 0, 0, FSDP_DROPOUT_MLP_OUT);
    amax = -1.0f;
    be->ops->rmsnorm_dropout_forward(be, res_out, out, rstd, res, x, w, N, N, C, 1e-5f, &d, &amax);
    check_that(amax == max_abs(out, (size_t)N * C) && amax > 0, "rmsnorm_dropout_forward reports max |out| (%g)",
               amax);
    amax = -1.0f;
    be->ops->swiglu_forward(be, act, gu, N, F, &amax);
    check_that(amax == max_abs(act, (size_t)N * F) && amax > 0, "swiglu_forward reports max |out| (%g)", amax);
    amax = -1.0f;
    be->ops->swiglu_backward(be, act, dy, gu, N, F, &amax);
    check_that(amax == max_abs(act, (size_t)N * 2 * F) && amax > 0, "swiglu_backward reports max |dgateup| (%g)",
               amax);
    /* the backwards: the norms' dinp (+=) and dropped dx, rotary's whole dqkv (the value part unrotated) */
    float *dw = xmalloc(C * 4), *db = xmalloc(C * 4), *dx = xmalloc((size_t)N * C * 4), *dyc = rand_matrix(N, C, 1.0f);
    memset(dw, 0, C * 4), memset(db, 0, C * 4);
    memcpy(out, res, (size_t)N * C * 4);
    amax = -1.0f;
    be->ops->rmsnorm_backward(be, out, dw, dyc, x, w, rstd, N, C, &amax);
    check_that(amax == max_abs(out, (size_t)N * C) && amax > 0, "rmsnorm_backward reports max |dinp| (%g)", amax);
    amax = -1.0f;
    be->ops->layernorm_backward(be, out, dw, db, dyc, x, w, mean, rstd, N, C, &amax);
    check_that(amax == max_abs(out, (size_t)N * C) && amax > 0, "layernorm_backward reports max |dinp| (%g)", amax);
    amax = -1.0f;
    be->ops->rmsnorm_dropout_backward(be, out, dx, dw, dyc, x, w, rstd, N, N, C, &d, &amax);
    check_that(amax == max_abs(dx, (size_t)N * C) && amax > 0 && amax != max_abs(out, (size_t)N * C),
               "rmsnorm_dropout_backward reports max |dx| (%g)", amax);
    const int T = 4, Hq = 2, Hkv = 1, D = 8, W = (Hq + 2 * Hkv) * D; /* N / T = 4 sequences of 4 */
    float *cs = xmalloc((size_t)T * D * 4), *qkv = rand_matrix(N, W, 1.0f);
    for (int i = 0; i < T * D; i++) cs[i] = i % 2 ? 0.6f : 0.8f; /* cos 0.8, sin 0.6 */
    qkv[5 * W + W - 3] = 9.0f; /* the largest element in the value part */
    amax = -1.0f;
    be->ops->rope_backward(be, qkv, cs, N / T, T, Hq, Hkv, D, &amax);
    check_that(amax == max_abs(qkv, (size_t)N * W) && amax == 9.0f, "rope_backward reports max |dqkv| (%g)", amax);
    qkv[5 * W + W - 3] = 0.0f;
    amax = -1.0f;
    be->ops->rope_backward(be, qkv, cs, N / T, T, Hq, Hkv, D, &amax);
    check_that(amax == max_abs(qkv, (size_t)N * W) && amax > 0, "rope_backward reports max |dqkv| after it (%g)",
               amax);
    free(x), free(w), free(b), free(res), free(gu), free(dy), free(out), free(res_out), free(mean), free(rstd);
    free(act), free(dw), free(db), free(dx), free(dyc), free(cs), free(qkv);
    be->runtime->destroy(be);
}

/* A product told its input's and its output gradient's amax (as the norm and SwiGLU report them)
 * gives what measuring them gives; told a wrong one, it uses it. */
static void test_given_amax(void) {
    fsdp_backend *be = cpu_backend();
    if (!check_that(be != NULL, "CPU backend created")) return;
    const int N = 32, C = 48, OC = 64;
    fsdp_fp8_recipe rc = fsdp_fp8_recipe_of(FSDP_FP8_TENSORWISE);
    float *x = rand_matrix(N, C, 1.0f), *w = rand_matrix(OC, C, 0.1f), *dy = rand_matrix(N, OC, 0.01f);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = fsdp_round_bf16(x[i]);
    for (size_t i = 0; i < (size_t)N * OC; i++) dy[i] = fsdp_round_bf16(dy[i]);
    float *y0 = xmalloc((size_t)N * OC * 4), *y1 = xmalloc((size_t)N * OC * 4);
    float saved[FSDP_FP8_SAVED_AMAX], ax = max_abs(x, (size_t)N * C), ady = max_abs(dy, (size_t)N * OC);
    be->ops->matmul_forward_fp8(be, y0, x, w, NULL, NULL, N, C, OC, 0, &rc, FSDP_FP8_AMAX_NONE, NULL);
    saved[0] = ax;
    be->ops->matmul_forward_fp8(be, y1, x, w, NULL, NULL, N, C, OC, 0, &rc, (fsdp_fp8_amax){saved, NULL, saved}, NULL);
    check_that(!memcmp(y0, y1, (size_t)N * OC * 4) && saved[1] == max_abs(w, (size_t)OC * C),
               "forward told max |x| = forward measuring it; it saved max |W|");
    float *dx0 = xmalloc((size_t)N * C * 4), *dx1 = xmalloc((size_t)N * C * 4);
    float *dw0 = calloc((size_t)OC * C, 4), *dw1 = calloc((size_t)OC * C, 4);
    be->ops->matmul_backward_fp8(be, dx0, dw0, NULL, dy, x, w, N, C, OC, &rc, FSDP_FP8_AMAX_NONE, NULL);
    float told = ady;
    be->ops->matmul_backward_fp8(be, dx1, dw1, NULL, dy, x, w, N, C, OC, &rc, (fsdp_fp8_amax){NULL, &told, saved}, NULL);
    check_that(!memcmp(dx0, dx1, (size_t)N * C * 4) && !memcmp(dw0, dw1, (size_t)OC * C * 4),
               "backward told max |dy| and the saved amax = backward measuring them");
    told = 3.0f * ady; /* not a power of two, which would only shift the exponents */
    memset(dw1, 0, (size_t)OC * C * 4);
    be->ops->matmul_backward_fp8(be, dx1, dw1, NULL, dy, x, w, N, C, OC, &rc, (fsdp_fp8_amax){NULL, &told, saved}, NULL);
    check_that(memcmp(dx0, dx1, (size_t)N * C * 4) != 0, "backward uses the dy amax it is told");
    free(x), free(w), free(dy), free(y0), free(y1), free(dx0), free(dx1), free(dw0), free(dw1);
    be->runtime->destroy(be);
}

static void test_names_and_shapes(void) {
    fsdp_fp8_granularity g;
    check_that(fsdp_fp8_parse("tensorwise", &g) == 0 && g == FSDP_FP8_TENSORWISE && fsdp_fp8_parse("rowwise", &g) == 0 &&
                   g == FSDP_FP8_ROWWISE && fsdp_fp8_parse("none", &g) == 0 && g == FSDP_FP8_NONE &&
                   fsdp_fp8_parse("blockwise", &g) == -1,
               "granularity names parse; others are refused");
    fsdp_fp8_recipe t = fsdp_fp8_recipe_of(FSDP_FP8_TENSORWISE), r = fsdp_fp8_recipe_of(FSDP_FP8_ROWWISE);
    check_that(t.grad_t == FSDP_E4M3 && !t.pow2_scales && r.grad_t == FSDP_E4M3 && r.pow2_scales,
               "torchao's presets: e4m3 everywhere; rowwise rounds scales to powers of two");
    check_that(fsdp_fp8_shape_ok(16384, 2048, 3072) && fsdp_fp8_shape_ok(16384, 11008, 4096) &&
                   !fsdp_fp8_shape_ok(16384, 2048, 3000) && !fsdp_fp8_shape_ok(100, 2048, 2048) &&
                   !fsdp_fp8_shape_ok(16, 24, 16) && !fsdp_fp8_shape_ok(0, 16, 16),
               "shapes: all dimensions multiples of 16, or refused");
    check_that(fsdp_fp8_pow2_floor(3.0f) == 2.0f && fsdp_fp8_pow2_floor(1.0f) == 1.0f &&
                   fsdp_fp8_pow2_floor(0x1.fffffep10f) == 1024.0f && fsdp_fp8_pow2_floor(0.0f) == 0.0f &&
                   fsdp_fp8_pow2_floor(3e-39f) == 0x1p-128f && isnan(fsdp_fp8_pow2_floor(NAN)),
               "power-of-two rounding: down, exact, subnormals, 0 and NaN kept");
    check_that(fsdp_fp8_scale(0.0f, 448.0f, 0) == (float)(448.0 / 1e-12) && fsdp_fp8_scale(INFINITY, 448.0f, 0) == 0.0f &&
                   isnan(fsdp_fp8_scale(NAN, 448.0f, 0)) && fsdp_fp8_scale(448.0f, 448.0f, 0) == 1.0f,
               "scale of amax 0 (epsilon), Inf (0), NaN (NaN), max (1)");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    test_names_and_shapes();
    test_casts();
    fsdp_fp8_recipe tw = fsdp_fp8_recipe_of(FSDP_FP8_TENSORWISE), rw = fsdp_fp8_recipe_of(FSDP_FP8_ROWWISE);
    fsdp_fp8_recipe hybrid = tw, rw_exact = rw;
    hybrid.grad_t = FSDP_E5M2;
    rw_exact.pow2_scales = 0;
    test_products(&tw, "tensorwise");
    test_products(&rw, "rowwise");
    test_products(&hybrid, "tensorwise, e5m2 gradients");
    test_products(&rw_exact, "rowwise, exact scales");
    test_rowwise_precision();
    test_backend_ops();
    test_reported_amax();
    test_given_amax();
    int status = check_summary("test_fp8");
    MPI_Finalize();
    return status;
}
