/* Checks every CUDA kernel of src/kernels/ops_cuda.h (except attention) against its CPU reference
 * in src/kernels/ops_cpu.h (their timings are bench/kernels_bench.c's).
 *
 * For each op, in fp32 and bf16 activation modes (and fp32/bf16 gradient or master dtypes where the
 * op has them), at a tiny odd size (the scalar fallbacks; flat ops also on a misaligned pointer)
 * and at a realistic size (the vectorised paths):
 *  - inputs are fresh random values, never zeros; in bf16 mode they are rounded to bf16 first, so
 *    the CPU reference runs on exactly the values the GPU reads;
 *  - outputs that must be overwritten are poisoned with NaN; outputs that accumulate (+=) are
 *    pre-filled with random values of the size of the increment, which the reference adds to too;
 *  - the error is ||gpu - cpu|| / ||cpu||; fp32 mode must stay under 1e-5 where the op reduces and
 *    1e-6 where it does not, bf16 mode under 1e-2 (outputs are rounded to bf16); NaN never passes;
 *  - reductions (norm weight/bias gradients, column sums, sums and sums of squares) must be
 *    bitwise identical over two runs.
 *
 * Prints one line per check; exits 1 on any failure, 77 (skipped) without a GPU. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/ops_cpu.h"
#include "kernels/ops_cuda.h"
#include "check.h"
#define CUDA_RIG_SEED 0x243f6a8885a308d3ull
#include "cuda_rig.h"

/* ---- utilities ----------------------------------------------------------------------------------- */

static float *hcopy(const float *x, size_t n) {
    float *p = hmalloc(n);
    memcpy(p, x, n * sizeof(float));
    return p;
}
static void round_if(float *x, size_t n, fsdp_dtype t) {
    if (t == FSDP_BF16) cpu_round_bf16(x, n);
}

static const char *dn(fsdp_dtype t) { return t == FSDP_BF16 ? "bf16" : "f32"; }

static void *offset(void *p, size_t elems, fsdp_dtype t) { return (char *)p + elems * esz(t); }

static void *dcopy(const float *h, size_t n, fsdp_dtype t) {
    void *d = dmalloc(n * esz(t));
    upload(d, h, n, t);
    return d;
}
static float *hget(const void *d, size_t n, fsdp_dtype t) {
    float *h = hmalloc(n);
    CK(cudaDeviceSynchronize());
    download(h, d, n, t);
    return h;
}
/* All-ones bytes are a NaN in fp32 and in bf16. */
static void *dnan(size_t n, fsdp_dtype t) {
    void *d = dmalloc(n * esz(t));
    CK(cudaMemset(d, 0xff, n * esz(t)));
    return d;
}

static double tol_for(int bf16, int reduces) { return bf16 ? 1e-2 : reduces ? 1e-5 : 1e-6; }

static void report(const char *op, const char *mode, const char *size, double err, double tol) {
    check_that(err <= tol, "%-26s %-22s %-26s err %.3e (tol %.0e)", op, mode, size, err, tol); /* false for NaN */
}
static void check(const char *op, const char *mode, const char *size, const float *g, const float *c, size_t n,
                  double tol) {
    report(op, mode, size, rel_err(g, c, n), tol);
}
/* An op's reported amax (one fp32 on the device; poisoned before the op) must be max |out| over the
 * values the op stored, exactly: what the FP8 cast would measure. */
static void check_amax(const char *op, const char *mode, const char *size, const float *d_amax, const float *got,
                       size_t n) {
    float want = 0.0f, have;
    for (size_t i = 0; i < n; i++) want = fmaxf(want, fabsf(got[i]));
    CK(cudaMemcpy(&have, d_amax, sizeof have, cudaMemcpyDeviceToHost));
    check_that(have == want, "%-26s %-22s %-26s reported amax %.9g (max |out| %.9g)", op, mode, size, have, want);
}

/* Two device buffers must hold the same bytes. */
static void check_bitwise(const char *op, const char *mode, const char *size, const void *a, const void *b,
                          size_t bytes) {
    unsigned char *ha = malloc(bytes ? bytes : 1), *hb = malloc(bytes ? bytes : 1);
    if (!ha || !hb) exit(1);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
    check_that(memcmp(ha, hb, bytes) == 0, "%-26s %-22s %-26s bitwise repeat", op, mode, size);
    free(ha);
    free(hb);
}

static char g_mode[64], g_size[64];
static const char *mode1(fsdp_dtype a) {
    snprintf(g_mode, sizeof g_mode, "act=%s", dn(a));
    return g_mode;
}
static const char *mode2(const char *k1, fsdp_dtype a, const char *k2, fsdp_dtype b) {
    snprintf(g_mode, sizeof g_mode, "%s=%s %s=%s", k1, dn(a), k2, dn(b));
    return g_mode;
}
static const char *sizef(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *sizef(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_size, sizeof g_size, fmt, ap);
    va_end(ap);
    return g_size;
}

static const fsdp_dtype DT[2] = {FSDP_F32, FSDP_BF16};

/* ---- embeddings ---------------------------------------------------------------------------------- */

static int32_t *rand_tokens(int n, int V) {
    int32_t *t = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!t) exit(1);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rnd() * V) % V;
    return t;
}
static int32_t *dtokens(const int32_t *h, int n) {
    int32_t *d = dmalloc((size_t)n * sizeof(int32_t));
    CK(cudaMemcpy(d, h, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
}

/* padded: the first token is also the padding_idx, whose row gets no gradient from the backward. */
static void test_embedding(int N, int T, int C, int V, int P, int pos_offset, int with_wpe, int padded) {
    const char *sz = sizef("N=%d T=%d C=%d V=%d%s%s", N, T, C, V, with_wpe ? " wpe" : "", padded ? " padding_idx" : "");
    char szb[80];
    snprintf(szb, sizeof szb, "%s", sz);
    int32_t *tok = rand_tokens(N, V), *dtok = dtokens(tok, N);
    int padding_idx = padded ? tok[0] : -1;
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        float *wte = hrand((size_t)V * C, 1.0f, act), *wpe = with_wpe ? hrand((size_t)P * C, 1.0f, act) : NULL;
        void *dwte_in = dcopy(wte, (size_t)V * C, act), *dwpe_in = wpe ? dcopy(wpe, (size_t)P * C, act) : NULL;
        void *dout = dnan((size_t)N * C, act);
        float *ref = hmalloc((size_t)N * C);
        cpu_embedding_forward(ref, tok, wte, wpe, pos_offset, N, T, C);
        fsdp_cuda_embedding_forward(dout, dtok, dwte_in, dwpe_in, pos_offset, N, T, C, act, 0);
        float *got = hget(dout, (size_t)N * C, act);
        check("embedding_forward", mode1(act), szb, got, ref, (size_t)N * C, tol_for(act == FSDP_BF16, 0));
        free(got), free(ref), free(wte), free(wpe);
        dfree(dwte_in), dfree(dout);
        dfree(dwpe_in);

        for (int gi = 0; gi < 2; gi++) {
            fsdp_dtype grad = DT[gi];
            float *dy = hrand((size_t)N * C, 1.0f, act);
            float *gw = hrand((size_t)V * C, 2.0f, grad), *gp = with_wpe ? hrand((size_t)P * C, 2.0f, grad) : NULL;
            void *d_dy = dcopy(dy, (size_t)N * C, act), *d_gw = dcopy(gw, (size_t)V * C, grad);
            void *d_gp = gp ? dcopy(gp, (size_t)P * C, grad) : NULL;
            cpu_embedding_backward(gw, gp, dy, tok, padding_idx, pos_offset, N, T, C);
            fsdp_cuda_embedding_backward(d_gw, d_gp, d_dy, dtok, padding_idx, pos_offset, N, T, C, act, grad, 0);
            int bf = act == FSDP_BF16 || grad == FSDP_BF16;
            float *got_w = hget(d_gw, (size_t)V * C, grad);
            check("embedding_backward dwte", mode2("act", act, "grad", grad), szb, got_w, gw, (size_t)V * C,
                  tol_for(bf, 1));
            free(got_w);
            if (gp) {
                float *got_p = hget(d_gp, (size_t)P * C, grad);
                check("embedding_backward dwpe", mode2("act", act, "grad", grad), szb, got_p, gp, (size_t)P * C,
                      tol_for(bf, 1));
                free(got_p);
                dfree(d_gp);
            }
            free(dy), free(gw), free(gp);
            dfree(d_dy), dfree(d_gw);
        }
    }
    free(tok);
    dfree(dtok);
}

/* The shard's part of a scatter-add of token rows and periodic (position) rows: windows aligned
 * and unaligned to the 8-element vector path, one straddling the boundary between the two blocks. */
static void test_add_rows(int N, int T, int C, int V, int64_t window_start, int64_t window_len, int padded) {
    const char *sz = sizef("N=%d C=%d V=%d window %lld+%lld%s", N, C, V, (long long)window_start,
                           (long long)window_len, padded ? " padding_idx" : "");
    char szb[112];
    snprintf(szb, sizeof szb, "%s", sz);
    int32_t *tok = rand_tokens(N, V), *dtok = dtokens(tok, N);
    int skip = padded ? tok[0] : -1; /* the token rows skip the padding_idx; positions never skip */
    fsdp_row_set host_sets[2] = {{0, tok, 0, 1, skip}, {(int64_t)V * C, NULL, 2, T, -1}};
    fsdp_row_set dev_sets[2] = {{0, dtok, 0, 1, skip}, {(int64_t)V * C, NULL, 2, T, -1}};
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        float *values = hrand((size_t)N * C, 1.0f, act), *dst = hrand((size_t)window_len, 2.0f, FSDP_F32);
        void *d_values = dcopy(values, (size_t)N * C, act), *d_dst = dcopy(dst, (size_t)window_len, FSDP_F32);
        cpu_add_rows(dst, window_start, window_len, host_sets, 2, values, N, C);
        fsdp_cuda_add_rows(d_dst, window_start, window_len, dev_sets, 2, d_values, N, C, act, 0);
        float *got = hget(d_dst, (size_t)window_len, FSDP_F32);
        check("add_rows", mode1(act), szb, got, dst, (size_t)window_len, tol_for(0, 1));
        free(got), free(values), free(dst);
        dfree(d_values), dfree(d_dst);
    }
    free(tok);
    dfree(dtok);
}

/* ---- norms --------------------------------------------------------------------------------------- */

static void test_rmsnorm(int N, int C) {
    char sz[64];
    snprintf(sz, sizeof sz, "N=%d C=%d", N, C);
    size_t nc = (size_t)N * C;
    float eps = 1e-5f;
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        int bf = act == FSDP_BF16;
        float *x = hrand(nc, 2.0f, act), *w = hrand((size_t)C, 1.5f, act);
        float *ref = hmalloc(nc), *rstd = hmalloc((size_t)N);
        cpu_rmsnorm_forward(ref, rstd, x, w, N, C, eps);
        void *dx = dcopy(x, nc, act), *dw = dcopy(w, (size_t)C, act), *dy = dnan(nc, act);
        float *drstd = dnan((size_t)N, FSDP_F32), *d_am = dnan(1, FSDP_F32);
        fsdp_cuda_rmsnorm_forward(dy, drstd, dx, dw, N, C, eps, act, 0, d_am);
        float *got = hget(dy, nc, act), *got_r = hget(drstd, (size_t)N, FSDP_F32);
        check("rmsnorm_forward out", mode1(act), sz, got, ref, nc, tol_for(bf, 1));
        check_amax("rmsnorm_forward out", mode1(act), sz, d_am, got, nc);
        dfree(d_am);
        check("rmsnorm_forward rstd", mode1(act), sz, got_r, rstd, (size_t)N, tol_for(bf, 1));
        free(got), free(got_r), free(ref);
        dfree(dy);
        CK(cudaMemcpy(drstd, rstd, (size_t)N * 4, cudaMemcpyHostToDevice));

        float *scratch = dmalloc(fsdp_cuda_norm_backward_scratch(N, C));
        for (int gi = 0; gi < 2; gi++) {
            fsdp_dtype grad = DT[gi];
            int bfg = bf || grad == FSDP_BF16;
            float *dout = hrand(nc, 1.0f, act), *dinp = hrand(nc, 1.0f, act);
            float *dwt = hrand((size_t)C, 0.5f * sqrtf((float)N), grad);
            void *d_dout = dcopy(dout, nc, act), *d_dinp = dcopy(dinp, nc, act), *d_dw = dcopy(dwt, (size_t)C, grad);
            void *d_dinp2 = dcopy(dinp, nc, act), *d_dw2 = dcopy(dwt, (size_t)C, grad);
            float *d_bam = dnan(1, FSDP_F32);
            cpu_rmsnorm_backward(dinp, dwt, dout, x, w, rstd, N, C);
            fsdp_cuda_rmsnorm_backward(d_dinp, d_dw, d_dout, dx, dw, drstd, N, C, act, grad, scratch, 0, d_bam);
            fsdp_cuda_rmsnorm_backward(d_dinp2, d_dw2, d_dout, dx, dw, drstd, N, C, act, grad, scratch, 0, NULL);
            float *g_dinp = hget(d_dinp, nc, act), *g_dw = hget(d_dw, (size_t)C, grad);
            const char *m = mode2("act", act, "grad", grad);
            check("rmsnorm_backward dinp", m, sz, g_dinp, dinp, nc, tol_for(bf, 1));
            check_amax("rmsnorm_backward dinp", m, sz, d_bam, g_dinp, nc);
            dfree(d_bam);
            check("rmsnorm_backward dweight", m, sz, g_dw, dwt, (size_t)C, tol_for(bfg, 1));
            check_bitwise("rmsnorm_backward dweight", m, sz, d_dw, d_dw2, (size_t)C * esz(grad));
            free(g_dinp), free(g_dw), free(dout), free(dinp), free(dwt);
            dfree(d_dout), dfree(d_dinp), dfree(d_dw), dfree(d_dinp2), dfree(d_dw2);
        }
        dfree(scratch);
        free(x), free(w), free(rstd);
        dfree(dx), dfree(dw), dfree(drstd);
    }
}

static void test_layernorm(int N, int C, int with_bias) {
    char sz[64];
    snprintf(sz, sizeof sz, "N=%d C=%d%s", N, C, with_bias ? "" : " nobias");
    size_t nc = (size_t)N * C;
    float eps = 1e-5f;
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        int bf = act == FSDP_BF16;
        float *x = hrand(nc, 2.0f, act), *w = hrand((size_t)C, 1.5f, act);
        float *b = with_bias ? hrand((size_t)C, 0.5f, act) : NULL;
        for (size_t i = 0; i < nc; i++) x[i] += 0.75f; /* a mean far from 0 */
        round_if(x, nc, act);
        float *ref = hmalloc(nc), *mean = hmalloc((size_t)N), *rstd = hmalloc((size_t)N);
        cpu_layernorm_forward(ref, mean, rstd, x, w, b, N, C, eps);
        void *dx = dcopy(x, nc, act), *dw = dcopy(w, (size_t)C, act), *db = b ? dcopy(b, (size_t)C, act) : NULL;
        void *dy = dnan(nc, act);
        float *dmean = dnan((size_t)N, FSDP_F32), *drstd = dnan((size_t)N, FSDP_F32), *d_am = dnan(1, FSDP_F32);
        fsdp_cuda_layernorm_forward(dy, dmean, drstd, dx, dw, db, N, C, eps, act, 0, d_am);
        float *got = hget(dy, nc, act), *got_m = hget(dmean, (size_t)N, FSDP_F32);
        check_amax("layernorm_forward out", mode1(act), sz, d_am, got, nc);
        dfree(d_am);
        float *got_r = hget(drstd, (size_t)N, FSDP_F32);
        check("layernorm_forward out", mode1(act), sz, got, ref, nc, tol_for(bf, 1));
        check("layernorm_forward mean", mode1(act), sz, got_m, mean, (size_t)N, tol_for(bf, 1));
        check("layernorm_forward rstd", mode1(act), sz, got_r, rstd, (size_t)N, tol_for(bf, 1));
        free(got), free(got_m), free(got_r), free(ref);
        dfree(dy);
        CK(cudaMemcpy(dmean, mean, (size_t)N * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(drstd, rstd, (size_t)N * 4, cudaMemcpyHostToDevice));

        float *scratch = dmalloc(fsdp_cuda_norm_backward_scratch(N, C));
        for (int gi = 0; gi < 2; gi++) {
            fsdp_dtype grad = DT[gi];
            int bfg = bf || grad == FSDP_BF16;
            float s = 0.5f * sqrtf((float)N);
            float *dout = hrand(nc, 1.0f, act), *dinp = hrand(nc, 1.0f, act);
            float *dwt = hrand((size_t)C, s, grad), *dbs = with_bias ? hrand((size_t)C, s, grad) : NULL;
            void *d_dout = dcopy(dout, nc, act), *d_dinp = dcopy(dinp, nc, act), *d_dw = dcopy(dwt, (size_t)C, grad);
            void *d_dinp2 = dcopy(dinp, nc, act), *d_dw2 = dcopy(dwt, (size_t)C, grad);
            void *d_db = dbs ? dcopy(dbs, (size_t)C, grad) : NULL, *d_db2 = dbs ? dcopy(dbs, (size_t)C, grad) : NULL;
            float *d_bam = dnan(1, FSDP_F32);
            cpu_layernorm_backward(dinp, dwt, dbs, dout, x, w, mean, rstd, N, C);
            fsdp_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, dx, dw, dmean, drstd, N, C, act, grad, scratch, 0,
                                         d_bam);
            fsdp_cuda_layernorm_backward(d_dinp2, d_dw2, d_db2, d_dout, dx, dw, dmean, drstd, N, C, act, grad, scratch,
                                         0, NULL);
            const char *m = mode2("act", act, "grad", grad);
            float *g_dinp = hget(d_dinp, nc, act), *g_dw = hget(d_dw, (size_t)C, grad);
            check("layernorm_backward dinp", m, sz, g_dinp, dinp, nc, tol_for(bf, 1));
            check_amax("layernorm_backward dinp", m, sz, d_bam, g_dinp, nc);
            dfree(d_bam);
            check("layernorm_backward dweight", m, sz, g_dw, dwt, (size_t)C, tol_for(bfg, 1));
            check_bitwise("layernorm_backward dweight", m, sz, d_dw, d_dw2, (size_t)C * esz(grad));
            if (dbs) {
                float *g_db = hget(d_db, (size_t)C, grad);
                check("layernorm_backward dbias", m, sz, g_db, dbs, (size_t)C, tol_for(bfg, 1));
                check_bitwise("layernorm_backward dbias", m, sz, d_db, d_db2, (size_t)C * esz(grad));
                free(g_db);
                dfree(d_db), dfree(d_db2);
            }
            free(g_dinp), free(g_dw), free(dout), free(dinp), free(dwt), free(dbs);
            dfree(d_dout), dfree(d_dinp), dfree(d_dw), dfree(d_dinp2), dfree(d_dw2);
        }
        dfree(scratch);
        free(x), free(w), free(b), free(mean), free(rstd);
        dfree(dx), dfree(dw), dfree(dmean), dfree(drstd);
        dfree(db);
    }
}

/* ---- column sums ----------------------------------------------------------------------------------- */

static void test_column_sum(int N, int OC) {
    char sz[64];
    snprintf(sz, sizeof sz, "N=%d OC=%d", N, OC);
    size_t n = (size_t)N * OC;
    for (int ai = 0; ai < 2; ai++)
        for (int gi = 0; gi < 2; gi++) {
            fsdp_dtype act = DT[ai], grad = DT[gi];
            float *dout = hrand(n, 1.0f, act), *db = hrand((size_t)OC, 0.5f * sqrtf((float)N), grad);
            void *d_dout = dcopy(dout, n, act), *d_db = dcopy(db, (size_t)OC, grad),
                 *d_db2 = dcopy(db, (size_t)OC, grad);
            float *scratch = dmalloc(fsdp_cuda_column_sum_scratch(N, OC));
            /* The reference: cpu_matmul_backward's bias gradient, a row-ordered fp32 sum per column. */
            for (int oc = 0; oc < OC; oc++) {
                float s = 0.0f;
                for (int r = 0; r < N; r++) s += dout[(size_t)r * OC + oc];
                db[oc] += s;
            }
            fsdp_cuda_column_sum(d_db, d_dout, N, OC, act, grad, scratch, 0);
            fsdp_cuda_column_sum(d_db2, d_dout, N, OC, act, grad, scratch, 0);
            float *got = hget(d_db, (size_t)OC, grad);
            const char *m = mode2("act", act, "grad", grad);
            check("column_sum", m, sz, got, db, (size_t)OC, tol_for(act == FSDP_BF16 || grad == FSDP_BF16, 1));
            check_bitwise("column_sum", m, sz, d_db, d_db2, (size_t)OC * esz(grad));
            free(got), free(dout), free(db);
            dfree(d_dout), dfree(d_db), dfree(d_db2), dfree(scratch);
        }
}

/* ---- pointwise ------------------------------------------------------------------------------------- */

/* mis = 1 runs on pointers one element past an aligned allocation (the scalar path). */
static void test_relu_backward(size_t n, int mis) {
    char sz[64];
    snprintf(sz, sizeof sz, "n=%zu%s", n, mis ? " misaligned" : "");
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        float *d = hrand(n, 1.0f, act), *out = hrand(n, 1.0f, act);
        void *bd = dmalloc((n + 1) * esz(act)), *bo = dmalloc((n + 1) * esz(act));
        void *dd = offset(bd, (size_t)mis, act), *dout = offset(bo, (size_t)mis, act);
        upload(dd, d, n, act);
        upload(dout, out, n, act);
        cpu_relu_backward(d, out, n);
        fsdp_cuda_relu_backward(dd, dout, n, act, 0);
        float *got = hget(dd, n, act);
        check("relu_backward", mode1(act), sz, got, d, n, tol_for(act == FSDP_BF16, 0));
        free(got), free(d), free(out);
        dfree(bd), dfree(bo);
    }
}

static void test_rope(int B, int T, int Hq, int Hkv, int D) {
    char sz[64];
    snprintf(sz, sizeof sz, "B=%d T=%d H=%d/%d D=%d", B, T, Hq, Hkv, D);
    size_t n = (size_t)B * T * (Hq + 2 * Hkv) * D;
    int half = D / 2;
    float *cs = hmalloc((size_t)T * D);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = (t + 3) * pow(500000.0, -2.0 * i / D);
            cs[((size_t)t * half + i) * 2] = (float)cos(ang);
            cs[((size_t)t * half + i) * 2 + 1] = (float)sin(ang);
        }
    float *dcs = dcopy(cs, (size_t)T * D, FSDP_F32);
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        for (int dir = 0; dir < 2; dir++) {
            float *qkv = hrand(n, 1.0f, act);
            /* The backward's amax covers the value part it does not rotate: at D = 12 its largest element
             * is put there; at the other sizes it lies wherever the random values put it. */
            if (dir == 1 && D == 12) qkv[n - 1 - (size_t)D / 3] = 3.5f;
            void *d = dcopy(qkv, n, act);
            float *d_am = dnan(1, FSDP_F32);
            if (dir == 0) {
                cpu_rope_forward(qkv, cs, B, T, Hq, Hkv, D);
                fsdp_cuda_rope_forward(d, dcs, B, T, Hq, Hkv, D, act, 0);
            } else {
                cpu_rope_backward(qkv, cs, B, T, Hq, Hkv, D);
                fsdp_cuda_rope_backward(d, dcs, B, T, Hq, Hkv, D, act, 0, d_am);
            }
            float *got = hget(d, n, act);
            check(dir ? "rope_backward" : "rope_forward", mode1(act), sz, got, qkv, n, tol_for(act == FSDP_BF16, 0));
            if (dir == 1) check_amax("rope_backward dqkv", mode1(act), sz, d_am, got, n);
            dfree(d_am);
            free(got), free(qkv);
            dfree(d);
        }
    }
    free(cs);
    dfree(dcs);
}

static void test_swiglu(int N, int F) {
    char sz[64];
    snprintf(sz, sizeof sz, "N=%d F=%d", N, F);
    size_t nf = (size_t)N * F;
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        int bf = act == FSDP_BF16;
        float *gu = hrand(2 * nf, 4.0f, act), *dout = hrand(nf, 1.0f, act);
        void *d_gu = dcopy(gu, 2 * nf, act), *d_dout = dcopy(dout, nf, act);
        float *ref = hmalloc(nf), *dref = hmalloc(2 * nf);
        void *d_out = dnan(nf, act), *d_dgu = dnan(2 * nf, act);
        cpu_swiglu_forward(ref, gu, N, F);
        cpu_swiglu_backward(dref, dout, gu, N, F);
        float *d_am = dnan(2, FSDP_F32);
        fsdp_cuda_swiglu_forward(d_out, d_gu, N, F, act, 0, d_am);
        fsdp_cuda_swiglu_backward(d_dgu, d_dout, d_gu, N, F, act, 0, d_am + 1);
        float *got = hget(d_out, nf, act), *dgot = hget(d_dgu, 2 * nf, act);
        check("swiglu_forward", mode1(act), sz, got, ref, nf, tol_for(bf, 0));
        check("swiglu_backward", mode1(act), sz, dgot, dref, 2 * nf, tol_for(bf, 0));
        check_amax("swiglu_forward", mode1(act), sz, d_am, got, nf);
        check_amax("swiglu_backward", mode1(act), sz, d_am + 1, dgot, 2 * nf);
        dfree(d_am);
        free(gu), free(dout), free(ref), free(dref), free(got), free(dgot);
        dfree(d_gu), dfree(d_dout), dfree(d_out), dfree(d_dgu);
    }
}

/* ---- cross-entropy ----------------------------------------------------------------------------------- */

static void test_cross_entropy(int n, int V) {
    char sz[64];
    snprintf(sz, sizeof sz, "n=%d V=%d", n, V);
    size_t nv = (size_t)n * V;
    int32_t *tg = rand_tokens(n, V);
    int valid = 0;
    for (int r = 0; r < n; r++) {
        if (r % 5 == 3) tg[r] = -100; /* ignored positions */
        valid += tg[r] >= 0;
    }
    int32_t *dtg = dtokens(tg, n);
    float gs = 1.0f / (float)(valid ? valid : 1);
    for (int ai = 0; ai < 2; ai++) {
        fsdp_dtype act = DT[ai];
        int bf = act == FSDP_BF16;
        float *x = hrand(nv, 6.0f, act);
        void *dx = dcopy(x, nv, act);
        float *dl = dnan((size_t)n, FSDP_F32), *loss = hmalloc((size_t)n);
        cpu_cross_entropy(loss, x, tg, n, V, gs);
        fsdp_cuda_cross_entropy(dl, dx, dtg, n, V, gs, act, 0);
        float *gl = hget(dl, (size_t)n, FSDP_F32), *gx = hget(dx, nv, act);
        check("cross_entropy losses", mode1(act), sz, gl, loss, (size_t)n, tol_for(bf, 1));
        check("cross_entropy dlogits", mode1(act), sz, gx, x, nv, tol_for(bf, 1));
        free(x), free(loss), free(gl), free(gx);
        dfree(dx), dfree(dl);
    }
    free(tg);
    dfree(dtg);
}

/* ---- optimizer and utilities ------------------------------------------------------------------------ */

static void test_adamw(size_t n, int mis, fsdp_dtype master, int wmode /* 0 none, 1 f32, 2 bf16 */) {
    char sz[64];
    snprintf(sz, sizeof sz, "n=%zu%s", n, mis ? " misaligned" : "");
    fsdp_dtype wt = wmode == 2 ? FSDP_BF16 : FSDP_F32;
    char mode[64];
    snprintf(mode, sizeof mode, "master=%s work=%s", dn(master), wmode ? dn(wt) : "none");
    fsdp_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
    float scale = 0.37f;
    float *p = hrand(n, 1.0f, master), *g = hrand(n, 1.0f, master), *m = hrand(n, 0.1f, master);
    float *v = hmalloc(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)(rnd() * 0.02 + 1e-4);
    round_if(v, n, master);
    float *p0 = hcopy(p, n);
    size_t es = esz(master);
    void *bp = dmalloc((n + 1) * es), *bg = dmalloc((n + 1) * es), *bm = dmalloc((n + 1) * es),
         *bv = dmalloc((n + 1) * es);
    void *dp = offset(bp, (size_t)mis, master), *dg = offset(bg, (size_t)mis, master);
    void *dm = offset(bm, (size_t)mis, master), *dv = offset(bv, (size_t)mis, master);
    upload(dp, p, n, master), upload(dg, g, n, master), upload(dm, m, n, master), upload(dv, v, n, master);
    void *bw = wmode ? dnan(n + 1, wt) : NULL, *dw = wmode ? offset(bw, (size_t)mis, wt) : NULL;
    float *dscale = dcopy(&scale, 1, FSDP_F32);
    float *w = wmode ? hmalloc(n) : NULL;
    cpu_adamw(p, g, m, v, n, &a, scale, w, master == FSDP_BF16, wmode == 2);
    fsdp_cuda_adamw(dp, dg, dm, dv, master, n, &a, dscale, dw, wt, 0);
    float *gp = hget(dp, n, master), *gm = hget(dm, n, master), *gv = hget(dv, n, master);
    int bf = master == FSDP_BF16;
    /* The parameter moves by ~lr per step: compare the moves, which a wrong update would change. */
    for (size_t i = 0; i < n; i++) gp[i] -= p0[i], p[i] -= p0[i];
    check("adamw param update", mode, sz, gp, p, n, tol_for(bf, 0));
    check("adamw m", mode, sz, gm, m, n, tol_for(bf, 0));
    check("adamw v", mode, sz, gv, v, n, tol_for(bf, 0));
    if (wmode) {
        float *gw = hget(dw, n, wt);
        for (size_t i = 0; i < n; i++) w[i] -= p0[i], gw[i] -= p0[i];
        check("adamw working update", mode, sz, gw, w, n, tol_for(bf || wt == FSDP_BF16, 0));
        free(gw);
        dfree(bw);
    }
    free(p), free(g), free(m), free(v), free(p0), free(w), free(gp), free(gm), free(gv);
    dfree(bp), dfree(bg), dfree(bm), dfree(bv), dfree(dscale);
}

static void test_convert(size_t n, int mis) {
    char sz[64];
    snprintf(sz, sizeof sz, "n=%zu%s", n, mis ? " misaligned" : "");
    for (int acc = 0; acc < 2; acc++)
        for (int di = 0; di < 2; di++)
            for (int si = 0; si < 2; si++) {
                fsdp_dtype dt = DT[di], st = DT[si];
                float *src = hrand(n, 3.0f, st), *dst = hrand(n, 3.0f, dt);
                void *bs = dmalloc((n + 1) * esz(st)), *bd = dmalloc((n + 1) * esz(dt));
                void *ds = offset(bs, (size_t)mis, st), *dd = offset(bd, (size_t)mis, dt);
                upload(ds, src, n, st);
                if (acc)
                    upload(dd, dst, n, dt);
                else
                    CK(cudaMemset(bd, 0xff, (n + 1) * esz(dt)));
                for (size_t i = 0; i < n; i++) dst[i] = acc ? dst[i] + src[i] : src[i];
                round_if(dst, n, dt);
                if (acc)
                    fsdp_cuda_accumulate(dd, dt, ds, st, n, 0);
                else
                    fsdp_cuda_cast(dd, dt, ds, st, n, 0);
                float *got = hget(dd, n, dt);
                /* Both sides round the same fp32 value once: the results must agree exactly. */
                check(acc ? "accumulate" : "cast", mode2("dst", dt, "src", st), sz, got, dst, n, 0.0);
                free(src), free(dst), free(got);
                dfree(bs), dfree(bd);
            }
}

static void test_sums(size_t n, int mis) {
    char sz[64];
    snprintf(sz, sizeof sz, "n=%zu%s", n, mis ? " misaligned" : "");
    float *scratch = dmalloc(fsdp_cuda_reduce_scratch(n));
    for (int k = 0; k < 3; k++) { /* sum_squares f32, sum_squares bf16, sum f32 */
        fsdp_dtype t = k == 1 ? FSDP_BF16 : FSDP_F32;
        float *x = hrand(n, 1.0f, t);
        if (k == 2)
            for (size_t i = 0; i < n; i++) x[i] += 0.25f; /* a sum that does not cancel to ~0 */
        void *bx = dmalloc((n + 1) * esz(t)), *dx = offset(bx, (size_t)mis, t);
        upload(dx, x, n, t);
        float init = 1.5f, out[2];
        float *dout = dmalloc(2 * sizeof(float));
        CK(cudaMemcpy(dout, &init, 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dout + 1, &init, 4, cudaMemcpyHostToDevice));
        for (int rep = 0; rep < 2; rep++) {
            if (k < 2)
                fsdp_cuda_sum_squares(dout + rep, dx, t, n, scratch, 0);
            else
                fsdp_cuda_sum(dout + rep, dx, n, scratch, 0);
        }
        CK(cudaMemcpy(out, dout, 8, cudaMemcpyDeviceToHost));
        float ref = init + (float)(k < 2 ? cpu_sum_squares(x, n) : cpu_sum(x, n));
        const char *op = k < 2 ? "sum_squares" : "sum";
        report(op, mode1(t), sz, fabs((double)out[0] - ref) / fabs((double)ref), tol_for(0, 1));
        check_bitwise(op, mode1(t), sz, dout, dout + 1, 4);
        free(x);
        dfree(bx), dfree(dout);
    }
    dfree(scratch);
}

static void test_clip_scale(void) {
    const float sumsq[4] = {4.0f, 0.25f, 0.0f, 1234.5f}, max_norm[3] = {1.0f, 0.0f, 10.0f};
    float *d = dmalloc(8);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            float got;
            CK(cudaMemcpy(d + 1, &sumsq[i], 4, cudaMemcpyHostToDevice));
            fsdp_cuda_clip_scale(d, d + 1, max_norm[j], 0);
            CK(cudaMemcpy(&got, d, 4, cudaMemcpyDeviceToHost));
            float coef = max_norm[j] / (sqrtf(sumsq[i]) + 1e-6f);
            float want = (max_norm[j] > 0.0f && coef < 1.0f) ? coef : 1.0f;
            report("clip_scale", "f32", sizef("sumsq=%g max=%g", sumsq[i], max_norm[j]), got == want ? 0.0 : INFINITY,
                   0.0);
        }
    dfree(d);
}

/* ---- main ------------------------------------------------------------------------------------------------ */

static int has_arg(int argc, char **argv, const char *a) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], a) == 0) return 1;
    return 0;
}

/* --small: tiny sizes only (fast enough for compute-sanitizer). */
int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("test_gpu_kernels: SKIPPED (no GPU)\n");
        return 77;
    }
    int big = !has_arg(argc, argv, "--small");
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);

    /* Tiny odd sizes take the scalar fallbacks; realistic sizes the vectorised paths. */
    test_embedding(7, 5, 40, 1031, 16, 3, 1, 0);
    test_embedding(7, 5, 40, 1031, 16, 3, 1, 1);
    test_embedding(9, 3, 13, 50, 5, 2, 0, 1);                    /* C not a multiple of 8: scalar path */
    test_add_rows(10, 5, 40, 1031, 0, 1031 * 40 + 16 * 40, 0);  /* the whole unit */
    test_add_rows(10, 5, 40, 1031, 0, 1031 * 40 + 16 * 40, 1);  /* ... with a padding_idx */
    test_add_rows(10, 5, 40, 1031, 20616, 20632, 0);             /* the second half: 8-aligned start */
    test_add_rows(10, 5, 40, 1031, 1003, 41000, 0);              /* unaligned: element-wise edges */
    test_add_rows(10, 5, 40, 1031, 1003, 41000, 1);
    test_add_rows(10, 5, 40, 1031, 41120, 300, 0);               /* rows of both sets around their border */
    if (big) test_add_rows(8192, 1024, 2048, 128256, 131334144, 131334144, 0);
    if (big) test_embedding(4096, 2048, 2048, 8192, 2048, 0, 0, 0);
    if (big) test_embedding(4096, 1024, 2048, 512, 2048, 512, 1, 0); /* many repeated tokens: atomics collide */
    if (big) test_embedding(4096, 1024, 2048, 512, 2048, 512, 1, 1);
    test_rmsnorm(7, 40);
    test_rmsnorm(5, 2056); /* a multiple of 8 that is not one of 32 * 8 */
    if (big) test_rmsnorm(4096, 2048);
    test_layernorm(7, 48, 1);
    test_layernorm(7, 48, 0);
    test_layernorm(37, 512, 1);
    if (big) test_layernorm(4096, 2048, 1);
    test_column_sum(7, 40);
    test_column_sum(45, 1024);
    if (big) test_column_sum(4096, 2048);
    test_relu_backward(7 * 40 + 3, 1);
    test_relu_backward(7 * 40 + 3, 0);
    if (big) test_relu_backward((size_t)4096 * 8192, 0);
    test_rope(2, 5, 4, 2, 12);
    test_rope(2, 9, 4, 2, 64);
    if (big) test_rope(2, 1024, 32, 8, 64);
    test_swiglu(7, 88);
    test_swiglu(3, 64);
    if (big) test_swiglu(4096, 8192);
    test_cross_entropy(7, 1031);
    test_cross_entropy(6, 2048);
    if (big) test_cross_entropy(4096, 32000);
    if (big) test_cross_entropy(64, 128256);
    for (int mi = 0; mi < 2; mi++)
        for (int wm = 0; wm < 3; wm++) {
            test_adamw(1003, 1, DT[mi], wm);
            test_adamw(1003, 0, DT[mi], wm);
            if (big) test_adamw(((size_t)1 << 24) + 13, 0, DT[mi], wm);
        }
    test_convert(1003, 1);
    test_convert(1003, 0);
    if (big) test_convert(((size_t)1 << 24) + 13, 0);
    test_sums(1003, 1);
    test_sums(1003, 0);
    if (big) test_sums(((size_t)1 << 24) + 13, 0);
    test_clip_scale();
    CK(cudaGetLastError());
    return check_summary("test_gpu_kernels");
}
