/* Checks the CUDA residual-dropout kernels against the CPU reference: the stand-alone forward and
 * backward (src/kernels/cuda/dropout.cu vs src/kernels/cpu/dropout.c) and the norms with the dropout
 * fused (norms.cu vs cpu_residual_dropout_forward then cpu_*norm_forward, and
 * cpu_*norm_backward then cpu_dropout_backward, outputs rounded where the act dtype stores them):
 *  - masks bit-identical: a probe with residual = 0 and x = 1 makes every kept element exactly
 *    1 / (1 - p) and every dropped one exactly 0, and the backward's dx is 0 exactly where the CPU
 *    drops; the count of elements whose zero-ness differs from the CPU's must be 0 (and the number
 *    dropped is printed, so a probe that drops nothing shows);
 *  - values: ||gpu - cpu|| / ||cpu|| under 1e-5 in fp32 (1e-6 where nothing reduces) and 1e-2 in
 *    bf16, inputs rounded to bf16 for both sides; outputs poisoned with NaN first, NaN never passes;
 *  - rows addressed by sample: 4 samples at once equal 1 + 3 samples (bitwise);
 *  - p = 0: out = residual + x and dx = dinp;
 * in fp32 and bf16, on the vector path (C a multiple of 8, aligned) and the scalar / generic path
 * (odd C, a misaligned tensor). Prints one line per check naming the op, dtype, shape and p, with
 * the error or the mismatch count; exits 1 on any failure, 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FSDP_HAVE_CUDA
int main(void) {
    printf("test_gpu_dropout: SKIPPED (built without CUDA)\n");
    return 77;
}
#else

#include "base/dtype.h"
#include "check.h"
#include "kernels/dropout.h"
#include "kernels/ops_cpu.h"
#include "kernels/ops_cuda.h"
#define CUDA_RIG_SEED 0x13198a2e03707344ull
#include "cuda_rig.h"

static void round_if(float *x, size_t n, fsdp_dtype t) {
    if (t == FSDP_BF16) cpu_round_bf16(x, n);
}
static float *hconst(size_t n, float v) {
    float *p = hmalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

/* Device buffer of n elements (plus `pad` elements in front, for misaligned tensors), NaN-filled. */
typedef struct {
    void *base, *p;
    size_t n;
    fsdp_dtype t;
} dbuf;
static dbuf dalloc(size_t n, fsdp_dtype t, size_t pad) {
    dbuf b = {NULL, NULL, n, t};
    CK(cudaMalloc(&b.base, (n + pad) * esz(t) + 16));
    CK(cudaMemset(b.base, 0xff, (n + pad) * esz(t) + 16));
    b.p = (char *)b.base + pad * esz(t);
    return b;
}
static void dbuf_free(dbuf *b) {
    if (b->base) CK(cudaFree(b->base));
    b->base = b->p = NULL;
}
static void dbuf_upload(dbuf *b, const float *h) { upload(b->p, h, b->n, b->t); }
static dbuf dcopy(const float *h, size_t n, fsdp_dtype t, size_t pad) {
    dbuf b = dalloc(n, t, pad);
    dbuf_upload(&b, h);
    return b;
}
static float *dbuf_download(const dbuf *b) {
    float *h = hmalloc(b->n);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    download(h, b->p, b->n, b->t);
    return h;
}

static char g_case[160];

static void report_err(const char *what, double err, double tol) {
    check_that(err <= tol, "%-44s %-40s rel err %.3e (tol %.0e)", g_case, what, err, tol); /* false for NaN */
}
static void check_vals(const char *what, const dbuf *d, const float *ref, double tol) {
    float *got = dbuf_download(d);
    report_err(what, rel_err(got, ref, d->n), tol);
    free(got);
}
/* Elements whose zero-ness differs between the GPU's output and the CPU's: the masks must agree
 * bit for bit. `zeros` reports how many the CPU has (the probe must drop some). */
static void check_mask(const char *what, const dbuf *d, const float *ref) {
    float *got = dbuf_download(d);
    size_t diff = 0, zeros = 0, nan = 0;
    for (size_t i = 0; i < d->n; i++) {
        nan += isnan(got[i]);
        zeros += ref[i] == 0.0f;
        diff += (got[i] == 0.0f) != (ref[i] == 0.0f);
    }
    check_that(diff == 0 && nan == 0 && zeros > 0 && zeros < d->n,
               "%-44s %-40s mask: %zu of %zu differ (%zu dropped, %zu NaN)", g_case, what, diff, d->n, zeros, nan);
    free(got);
}
static void check_same(const char *what, const dbuf *a, const dbuf *b) {
    float *x = dbuf_download(a), *y = dbuf_download(b);
    check_that(memcmp(x, y, a->n * sizeof(float)) == 0, "%-44s %-40s bitwise equal", g_case, what);
    free(x), free(y);
}

static double tol(fsdp_dtype t, int reduces) { return t == FSDP_BF16 ? 1e-2 : reduces ? 1e-5 : 1e-6; }

/* ---- stand-alone residual dropout -------------------------------------------------------------- */

static void test_residual(fsdp_dtype t, int B, int T, int C, size_t pad, double p) {
    const int N = B * T;
    const size_t n = (size_t)N * C;
    snprintf(g_case, sizeof g_case, "residual %s N=%d T=%d C=%d%s p=%.2f", fsdp_dtype_name(t), N, T, C,
             pad ? " unaligned" : "", p);
    fsdp_dropout d = fsdp_dropout_make(p, 2024, 4000, 7, FSDP_DROPOUT_ATTN_OUT);
    float *res = hrand(n, 1.0f, t), *x = hrand(n, 1.0f, t), *ref = hmalloc(n);
    dbuf dres = dcopy(res, n, t, pad), dx = dcopy(x, n, t, pad), dout = dalloc(n, t, pad);

    cpu_residual_dropout_forward(ref, res, x, N, T, C, &d);
    round_if(ref, n, t);
    fsdp_cuda_residual_dropout_forward(dout.p, dres.p, dx.p, N, T, C, &d, t, 0);
    check_vals("residual_dropout_forward out", &dout, ref, tol(t, 0));

    /* The mask probe: residual 0, x 1. */
    float *zero = hconst(n, 0.0f), *one = hconst(n, 1.0f);
    dbuf_upload(&dres, zero);
    dbuf_upload(&dx, one);
    cpu_residual_dropout_forward(ref, zero, one, N, T, C, &d);
    fsdp_cuda_residual_dropout_forward(dout.p, dres.p, dx.p, N, T, C, &d, t, 0);
    check_mask("residual_dropout_forward probe", &dout, ref);

    /* Backward, also in place. */
    dbuf_upload(&dx, x);
    cpu_dropout_backward(ref, x, N, T, C, &d);
    round_if(ref, n, t);
    fsdp_cuda_dropout_backward(dout.p, dx.p, N, T, C, &d, t, 0);
    check_vals("dropout_backward dx", &dout, ref, tol(t, 0));
    check_mask("dropout_backward dx zeros", &dout, ref);
    fsdp_cuda_dropout_backward(dx.p, dx.p, N, T, C, &d, t, 0);
    check_same("dropout_backward in place", &dx, &dout);

    /* p = 0: a plain add and a copy. */
    fsdp_dropout z = fsdp_dropout_make(0.0, 2024, 4000, 7, FSDP_DROPOUT_ATTN_OUT);
    dbuf_upload(&dres, res);
    dbuf_upload(&dx, x);
    cpu_residual_dropout_forward(ref, res, x, N, T, C, &z);
    round_if(ref, n, t);
    fsdp_cuda_residual_dropout_forward(dout.p, dres.p, dx.p, N, T, C, &z, t, 0);
    check_vals("residual_dropout_forward p=0", &dout, ref, tol(t, 0));
    free(res), free(x), free(ref), free(zero), free(one);
    dbuf_free(&dres), dbuf_free(&dx), dbuf_free(&dout);
}

/* ---- the norms with the dropout fused ------------------------------------------------------------ */

typedef struct {
    fsdp_dtype act, grad;
    int layer, bias; /* LayerNorm (with or without bias), else RMSNorm */
    int B, T, C;
    double p;
} norm_case;

static void cpu_norm_fwd(const norm_case *k, float *out, float *mean, float *rstd, const float *x, const float *w,
                         const float *b) {
    const int N = k->B * k->T;
    if (k->layer)
        cpu_layernorm_forward(out, mean, rstd, x, w, k->bias ? b : NULL, N, k->C, 1e-5f);
    else
        cpu_rmsnorm_forward(out, rstd, x, w, N, k->C, 1e-5f);
    round_if(out, (size_t)N * k->C, k->act);
}

static void gpu_norm_fwd(const norm_case *k, const fsdp_dropout *d, dbuf *res_out, dbuf *out, float *mean,
                         float *rstd, const dbuf *res, const dbuf *x, const dbuf *w, const dbuf *b, int B,
                         size_t row0) {
    const size_t off = row0 * k->C * esz(k->act);
    void *ro = (char *)res_out->p + off, *o = (char *)out->p + off;
    const void *r = (const char *)res->p + off, *xx = (const char *)x->p + off;
    const int N = B * k->T;
    if (k->layer)
        fsdp_cuda_layernorm_dropout_forward(ro, o, mean + row0, rstd + row0, r, xx, w->p, k->bias ? b->p : NULL, N,
                                            k->T, k->C, 1e-5f, d, k->act, 0, NULL);
    else
        fsdp_cuda_rmsnorm_dropout_forward(ro, o, rstd + row0, r, xx, w->p, N, k->T, k->C, 1e-5f, d, k->act, 0, NULL);
}

static void test_norm_dropout(const norm_case *k) {
    const fsdp_dtype t = k->act;
    const int N = k->B * k->T, C = k->C;
    const size_t n = (size_t)N * C;
    snprintf(g_case, sizeof g_case, "%s%s %s/%s N=%d T=%d C=%d p=%.2f", k->layer ? "layernorm" : "rmsnorm",
             k->layer && !k->bias ? "(no bias)" : "", fsdp_dtype_name(t), fsdp_dtype_name(k->grad), N, k->T, C,
             k->p);
    fsdp_dropout d = fsdp_dropout_make(k->p, 77, 123456, 11, FSDP_DROPOUT_MLP_OUT);
    float *res = hrand(n, 1.0f, t), *x = hrand(n, 1.0f, t), *w = hrand((size_t)C, 0.5f, t), *b = hrand(C, 0.2f, t);
    for (int c = 0; c < C; c++) w[c] = t == FSDP_BF16 ? fsdp_round_bf16(w[c] + 1.0f) : w[c] + 1.0f;
    float *ref_res = hmalloc(n), *ref_out = hmalloc(n), *mean = hmalloc(N), *rstd = hmalloc(N);
    dbuf dres = dcopy(res, n, t, 0), dx = dcopy(x, n, t, 0), dw = dcopy(w, C, t, 0), db = dcopy(b, C, t, 0);
    dbuf dro = dalloc(n, t, 0), dout = dalloc(n, t, 0), dmean = dalloc(N, FSDP_F32, 0), drstd = dalloc(N, FSDP_F32, 0);

    /* Forward. */
    cpu_residual_dropout_forward(ref_res, res, x, N, k->T, C, &d);
    round_if(ref_res, n, t);
    cpu_norm_fwd(k, ref_out, mean, rstd, ref_res, w, b);
    gpu_norm_fwd(k, &d, &dro, &dout, dmean.p, drstd.p, &dres, &dx, &dw, &db, k->B, 0);
    check_vals("fused forward res_out", &dro, ref_res, tol(t, 0));
    check_vals("fused forward out", &dout, ref_out, tol(t, 1));
    check_vals("fused forward rstd", &drstd, rstd, t == FSDP_BF16 ? 1e-3 : 1e-5);
    if (k->layer) check_vals("fused forward mean", &dmean, mean, t == FSDP_BF16 ? 1e-2 : 1e-5);

    /* Rows addressed by sample: the first sample, then the other B - 1, into fresh buffers. */
    if (k->B > 1) {
        dbuf dro2 = dalloc(n, t, 0), dout2 = dalloc(n, t, 0);
        fsdp_dropout d1 = d;
        d1.sample_base += 1;
        gpu_norm_fwd(k, &d, &dro2, &dout2, dmean.p, drstd.p, &dres, &dx, &dw, &db, 1, 0);
        gpu_norm_fwd(k, &d1, &dro2, &dout2, dmean.p, drstd.p, &dres, &dx, &dw, &db, k->B - 1, (size_t)k->T);
        check_same("fused forward res_out, 1 + (B-1) samples", &dro, &dro2);
        check_same("fused forward out, 1 + (B-1) samples", &dout, &dout2);
        dbuf_free(&dro2), dbuf_free(&dout2);
    }

    /* Backward: dinp accumulates onto random values; dx is keep' dinp. The CPU uses its own
     * statistics, the GPU its own (they agree to the forward's tolerance). */
    float *dy = hrand(n, 1.0f, t), *dinp0 = hrand(n, 1.0f, t), *dw0 = hrand(C, 1.0f, k->grad),
          *db0 = hrand(C, 1.0f, k->grad);
    float *ref_dinp = hmalloc(n), *ref_dw = hmalloc(C), *ref_db = hmalloc(C), *ref_dx = hmalloc(n);
    memcpy(ref_dinp, dinp0, n * 4), memcpy(ref_dw, dw0, C * 4), memcpy(ref_db, db0, C * 4);
    if (k->layer)
        cpu_layernorm_backward(ref_dinp, ref_dw, k->bias ? ref_db : NULL, dy, ref_res, w, mean, rstd, N, C);
    else
        cpu_rmsnorm_backward(ref_dinp, ref_dw, dy, ref_res, w, rstd, N, C);
    round_if(ref_dinp, n, t);
    round_if(ref_dw, C, k->grad);
    round_if(ref_db, C, k->grad);
    cpu_dropout_backward(ref_dx, ref_dinp, N, k->T, C, &d);
    round_if(ref_dx, n, t);

    dbuf ddy = dcopy(dy, n, t, 0), ddinp = dcopy(dinp0, n, t, 0), ddw = dcopy(dw0, C, k->grad, 0);
    dbuf ddb = dcopy(db0, C, k->grad, 0), ddx = dalloc(n, t, 0);
    float *scratch, *d_am, am = NAN;
    CK(cudaMalloc((void **)&scratch, fsdp_cuda_norm_backward_scratch(N, C) + 16));
    CK(cudaMalloc((void **)&d_am, sizeof(float)));
    CK(cudaMemcpy(d_am, &am, sizeof am, cudaMemcpyHostToDevice)); /* poisoned: the op must set it */
    if (k->layer)
        fsdp_cuda_layernorm_dropout_backward(ddinp.p, ddx.p, ddw.p, k->bias ? ddb.p : NULL, ddy.p, dro.p, dw.p, dmean.p,
                                             drstd.p, N, k->T, C, &d, t, k->grad, scratch, 0, d_am);
    else
        fsdp_cuda_rmsnorm_dropout_backward(ddinp.p, ddx.p, ddw.p, ddy.p, dro.p, dw.p, drstd.p, N, k->T, C, &d, t,
                                           k->grad, scratch, 0, d_am);
    {   /* the reported amax is max |dx| as stored, exactly (what the FP8 cast of dx would measure) */
        float *gx = dbuf_download(&ddx), want = 0.0f;
        for (size_t i = 0; i < n; i++) want = fmaxf(want, fabsf(gx[i]));
        CK(cudaMemcpy(&am, d_am, sizeof am, cudaMemcpyDeviceToHost));
        check_that(am == want, "%-44s %-40s reported amax %.9g (max |dx| %.9g)", g_case, "fused backward dx amax", am,
                   want);
        free(gx);
        CK(cudaFree(d_am));
    }
    check_vals("fused backward dinp (+=)", &ddinp, ref_dinp, tol(t, 1));
    check_vals("fused backward dweight (+=)", &ddw, ref_dw, tol(k->grad, 1));
    if (k->layer && k->bias) check_vals("fused backward dbias (+=)", &ddb, ref_db, tol(k->grad, 1));
    check_vals("fused backward dx", &ddx, ref_dx, tol(t, 1));
    if (k->p > 0) check_mask("fused backward dx zeros", &ddx, ref_dx);

    /* The mask probe: residual 0, x 1 gives res_out = keep / (1 - p) exactly. */
    if (k->p > 0) {
        float *zero = hconst(n, 0.0f), *one = hconst(n, 1.0f);
        dbuf_upload(&dres, zero);
        dbuf_upload(&dx, one);
        cpu_residual_dropout_forward(ref_res, zero, one, N, k->T, C, &d);
        gpu_norm_fwd(k, &d, &dro, &dout, dmean.p, drstd.p, &dres, &dx, &dw, &db, k->B, 0);
        check_mask("fused forward probe res_out", &dro, ref_res);
        free(zero), free(one);
    }
    CK(cudaFree(scratch));
    free(res), free(x), free(w), free(b), free(ref_res), free(ref_out), free(mean), free(rstd);
    free(dy), free(dinp0), free(dw0), free(db0), free(ref_dinp), free(ref_dw), free(ref_db), free(ref_dx);
    dbuf *all[] = {&dres, &dx, &dw, &db, &dro, &dout, &dmean, &drstd, &ddy, &ddinp, &ddw, &ddb, &ddx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dbuf_free(all[i]);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("test_gpu_dropout: SKIPPED (no GPU)\n");
        return 77;
    }
    CK(cudaSetDevice(0));
    const fsdp_dtype DT[2] = {FSDP_F32, FSDP_BF16};
    for (int i = 0; i < 2; i++) {
        const fsdp_dtype t = DT[i];
        test_residual(t, 3, 64, 2048, 0, 0.1);  /* vector path */
        test_residual(t, 2, 37, 100, 0, 0.3);   /* C % 8 != 0: element path, groups straddle rows */
        test_residual(t, 2, 37, 104, 1, 0.5);   /* misaligned: element path */
        for (int kind = 0; kind < 3; kind++) {
            const int layer = kind > 0, bias = kind == 1;
            /* vector path (OPT-1.3B and Llama-2-7B widths), then the generic path (odd C) */
            const norm_case cases[4] = {{t, FSDP_F32, layer, bias, 4, 64, 2048, 0.1},
                                        {t, t, layer, bias, 2, 128, 4096, 0.1},
                                        {t, FSDP_F32, layer, bias, 3, 37, 100, 0.3},
                                        {t, FSDP_F32, layer, bias, 2, 16, 64, 0.0}};
            for (int c = 0; c < 4; c++) test_norm_dropout(&cases[c]);
        }
    }
    return check_summary("test_gpu_dropout");
}

#endif
