/* Checks the dropout masks (src/base/philox.h, src/kernels/dropout.h) and the CPU reference ops that
 * use them (src/kernels/cpu/dropout.c, the dropout of src/kernels/cpu/attention.c):
 *  - Philox-4x32-10 against the published known-answer vectors of Random123;
 *  - thresholds and scales from the rate; the kept fraction within 5 sigma of 1 - p over a million
 *    elements, for residual and attention-probability masks, and masks of different layers, sites,
 *    samples and seeds agreeing only as often as independent ones would;
 *  - the probability groups: every (query, key) has its own (group, word), and the four elements of
 *    a group sit in one thread of an mma.m16n8k16 accumulator in both tile layouts of the kernels;
 *  - residual dropout forward against a naive loop, with aliasing; its backward exactly; gradients
 *    of both against finite differences with the mask fixed;
 *  - attention with dropout against a double-precision reference, its backward against finite
 *    differences (stored and recomputed probabilities), probs and lse those of the undropped
 *    softmax;
 *  - rows addressed by sample index: a micro-batch split differently gives bitwise the same result;
 *  - p = 0 (and NULL) gives bitwise the dropout-free result, and a positive p does change it;
 *  - bitwise equality under 1, 2 and 3 OpenMP threads.
 * Prints one line per check; exits 1 on any failure. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/philox.h"
#include "kernels/dropout.h"
#include "kernels/ops_cpu.h"

#include "attention_rig.h"
#include "grad_check.h"

/* ---- the generator ------------------------------------------------------------------------------ */

static void test_philox_known_answers(void) {
    /* Random123's kat_vectors: counter, key, expected output. */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
         0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
         0x5001e420u, 0x24126ea1u},
    };
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        const uint32_t *v = kat[k];
        fsdp_philox4 r = fsdp_philox4x32_10(v[0], v[1], v[2], v[3], v[4], v[5]);
        for (int i = 0; i < 4; i++) ok &= r.w[i] == v[6 + i];
    }
    check_that(ok, "%-40s Random123 known-answer vectors (3)", "philox4x32-10");
}

static void test_rate(void) {
    fsdp_dropout z = fsdp_dropout_make(0.0, 1, 0, 0, 0), d = fsdp_dropout_make(0.1, 1, 0, 0, 0);
    fsdp_dropout h = fsdp_dropout_make(0.5, 1, 0, 0, 0), t = fsdp_dropout_make(1e-12, 1, 0, 0, 0);
    int ok = z.threshold == 0 && z.scale == 1.0f && !fsdp_dropout_active(&z) && !fsdp_dropout_active(NULL);
    ok &= d.threshold == 429496730u && d.scale == (float)(1.0 / 0.9) && fsdp_dropout_active(&d);
    ok &= h.threshold == 0x80000000u && h.scale == 2.0f;
    ok &= t.threshold == 0 && !fsdp_dropout_active(&t); /* rounds to nothing dropped */
    ok &= fsdp_dropout_rate_ok(0.0) && fsdp_dropout_rate_ok(0.999) && !fsdp_dropout_rate_ok(1.0) &&
          !fsdp_dropout_rate_ok(-0.1) && !fsdp_dropout_rate_ok(NAN);
    check_that(ok, "%-40s thresholds round(p 2^32), scales 1/(1-p), p = 1 refused", "dropout rate");
}

/* Kept fraction of n residual elements (rows of T x C from sample_base) and agreement with a second
 * descriptor e over the same elements. */
static void count_rows(const fsdp_dropout *d, const fsdp_dropout *e, int N, int T, int C, long *kept, long *agree) {
    *kept = *agree = 0;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            int a = fsdp_dropout_keep_row(d, n, T, C, c);
            *kept += a;
            if (e) *agree += a == fsdp_dropout_keep_row(e, n, T, C, c);
        }
}

/* |observed - expected| within 5 standard deviations of a binomial proportion. */
static int within(double frac, double q, long n, double *sigmas) {
    *sigmas = fabs(frac - q) / sqrt(q * (1.0 - q) / (double)n);
    return *sigmas <= 5.0;
}

static void test_statistics(void) {
    const int N = 512, T = 64, C = 2048; /* 2^20 elements over 8 samples */
    const double rates[3] = {0.1, 0.5, 0.9};
    for (int k = 0; k < 3; k++) {
        double p = rates[k], s;
        fsdp_dropout d = fsdp_dropout_make(p, 1234, 77, 3, FSDP_DROPOUT_MLP_OUT);
        long kept, agree;
        count_rows(&d, NULL, N, T, C, &kept, &agree);
        long n = (long)N * C;
        int ok = within((double)kept / n, 1.0 - p, n, &s);
        check_that(ok, "%-40s p %.1f: kept %.5f of %ld (%.1f sigma)", "residual mask", p, (double)kept / n, n, s);
        /* Probabilities: every (b, h, i, j) of 2 samples x 8 heads x 256 x 256. */
        fsdp_dropout a = fsdp_dropout_make(p, 1234, 77, 3, FSDP_DROPOUT_ATTN_PROBS);
        long pk = 0, pn = 0;
        for (int b = 0; b < 2; b++)
            for (int h = 0; h < 8; h++)
                for (int i = 0; i < 256; i++)
                    for (int j = 0; j < 256; j++, pn++) pk += fsdp_dropout_keep_probs(&a, b, h, i, j, 256);
        ok = within((double)pk / pn, 1.0 - p, pn, &s);
        check_that(ok, "%-40s p %.1f: kept %.5f of %ld (%.1f sigma)", "probability mask", p, (double)pk / pn, pn, s);
    }
    /* Independence of the counter's fields: two masks that differ in one field must agree as often
     * as independent ones (p^2 + (1-p)^2), not always. */
    const double p = 0.5;
    fsdp_dropout base = fsdp_dropout_make(p, 1234, 77, 3, FSDP_DROPOUT_MLP_OUT);
    fsdp_dropout other[4] = {fsdp_dropout_make(p, 1235, 77, 3, FSDP_DROPOUT_MLP_OUT),
                             fsdp_dropout_make(p, 1234, 78, 3, FSDP_DROPOUT_MLP_OUT),
                             fsdp_dropout_make(p, 1234, 77, 4, FSDP_DROPOUT_MLP_OUT),
                             fsdp_dropout_make(p, 1234, 77, 3, FSDP_DROPOUT_ATTN_OUT)};
    const char *field[4] = {"seed", "sample", "layer", "site"};
    for (int k = 0; k < 4; k++) {
        long kept, agree, n = 64L * 2048;
        double s;
        count_rows(&base, &other[k], 64, 64, 2048, &kept, &agree);
        int ok = within((double)agree / n, p * p + (1 - p) * (1 - p), n, &s);
        check_that(ok, "%-40s masks differing in %-6s agree on %.4f (%.1f sigma)", "mask independence", field[k],
                   (double)agree / n, s);
    }
}

/* Every (i, j) of a T x T head has its own (group, word); the four elements of each group lie in one
 * 16 x 16 tile and in one lane's accumulator, both for tiles laid out queries x keys (lane = 4 (i % 8)
 * + (j % 8) / 2) and keys x queries (lane = 4 (j % 8) + (i % 8) / 2). */
static void test_probs_groups(void) {
    const int T = 37, H = 2;
    const uint64_t tb = (T + 15) / 16, ngroups = (uint64_t)H * tb * tb * 64;
    int8_t *seen = calloc(ngroups * 4, 1);
    int *owner = malloc(ngroups * 3 * sizeof(int));
    for (uint64_t g = 0; g < ngroups * 3; g++) owner[g] = -1;
    int ok = seen && owner;
    for (int h = 0; h < H && ok; h++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                uint64_t g = fsdp_dropout_probs_group(h, i, j, T);
                int w = fsdp_dropout_probs_word(i, j);
                if (g >= ngroups || seen[g * 4 + w]) {
                    ok = 0;
                    continue;
                }
                seen[g * 4 + w] = 1;
                int who[3] = {(i / 16) * 1000 + j / 16, 4 * (i % 8) + (j % 8) / 2, 4 * (j % 8) + (i % 8) / 2};
                for (int k = 0; k < 3; k++) {
                    if (owner[g * 3 + k] < 0) owner[g * 3 + k] = who[k];
                    ok &= owner[g * 3 + k] == who[k];
                }
            }
    check_that(ok, "%-40s T %d: one (group, word) per element, groups inside one lane in both layouts",
               "probability groups", T);
    free(seen);
    free(owner);
}

/* ---- residual dropout ------------------------------------------------------------------------- */

typedef struct {
    int N, T, C;
    fsdp_dropout d;
    float *res, *x, *out, *R;
} rd_ctx;

static double rd_loss(void *p) {
    rd_ctx *c = p;
    cpu_residual_dropout_forward(c->out, c->res, c->x, c->N, c->T, c->C, &c->d);
    return dot_d(c->out, c->R, (size_t)c->N * c->C);
}

/* C = 10 is not a multiple of 4, so Philox groups straddle rows. */
static void test_residual_dropout(void) {
    rd_ctx c = {.N = 15, .T = 5, .C = 10};
    c.d = fsdp_dropout_make(0.3, 99, 1000, 2, FSDP_DROPOUT_ATTN_OUT);
    size_t n = (size_t)c.N * c.C;
    c.res = rand_f(n, 1.0f), c.x = rand_f(n, 1.0f), c.out = alloc_f(n), c.R = rand_f(n, 1.0f);
    fill_nan(c.out, n);
    rd_loss(&c);
    double *ref = malloc(n * sizeof(double));
    long kept = 0;
    for (int r = 0; r < c.N; r++)
        for (int k = 0; k < c.C; k++) {
            int keep = fsdp_dropout_keep_row(&c.d, r, c.T, c.C, k);
            kept += keep;
            ref[r * c.C + k] = (double)c.res[r * c.C + k] + (keep ? (double)c.x[r * c.C + k] * c.d.scale : 0.0);
        }
    compare("residual_dropout_forward p 0.3", c.out, ref, n, 1e-7, 1e-6);
    check_that(kept > 0 && kept < (long)n, "%-40s kept %ld of %zu (some of each)", "residual_dropout_forward", kept, n);

    float *a = copy_f(c.res, n), *b = copy_f(c.x, n); /* out aliasing residual, then x */
    cpu_residual_dropout_forward(a, a, c.x, c.N, c.T, c.C, &c.d);
    cpu_residual_dropout_forward(b, c.res, b, c.N, c.T, c.C, &c.d);
    check_that(!memcmp(a, c.out, n * 4) && !memcmp(b, c.out, n * 4), "%-40s out aliasing residual or x: same bits",
               "residual_dropout_forward");

    float *dx = alloc_f(n), *dres = copy_f(c.R, n);
    fill_nan(dx, n);
    cpu_dropout_backward(dx, c.R, c.N, c.T, c.C, &c.d);
    int exact = 1;
    for (int r = 0; r < c.N; r++)
        for (int k = 0; k < c.C; k++)
            exact &= dx[r * c.C + k] ==
                     (fsdp_dropout_keep_row(&c.d, r, c.T, c.C, k) ? c.R[r * c.C + k] * c.d.scale : 0.0f);
    float *inplace = copy_f(c.R, n);
    cpu_dropout_backward(inplace, inplace, c.N, c.T, c.C, &c.d);
    exact &= !memcmp(inplace, dx, n * 4);
    check_that(exact, "%-40s dx = keep . dout / (1 - p) exactly, also in place", "dropout_backward");
    grad_param ps[2] = {{"x", c.x, n, dx}, {"residual", c.res, n, dres}};
    check_grads("residual_dropout p 0.3 (mask fixed)", rd_loss, &c, ps, 2);

    /* p = 0 and NULL: no mask at all. */
    fsdp_dropout z = fsdp_dropout_make(0.0, 99, 1000, 2, FSDP_DROPOUT_ATTN_OUT);
    float *o0 = alloc_f(n), *o1 = alloc_f(n), *plain = alloc_f(n), *d0 = alloc_f(n);
    for (size_t i = 0; i < n; i++) plain[i] = c.res[i] + c.x[i];
    cpu_residual_dropout_forward(o0, c.res, c.x, c.N, c.T, c.C, &z);
    cpu_residual_dropout_forward(o1, c.res, c.x, c.N, c.T, c.C, NULL);
    cpu_dropout_backward(d0, c.R, c.N, c.T, c.C, &z);
    check_that(!memcmp(o0, plain, n * 4) && !memcmp(o1, plain, n * 4) && !memcmp(d0, c.R, n * 4),
               "%-40s p 0 and NULL: out = residual + x, dx = dout (bitwise)", "residual dropout");
    check_that(memcmp(c.out, plain, n * 4) != 0, "%-40s p 0.3 changes the result", "residual dropout");
    free(c.res), free(c.x), free(c.out), free(c.R), free(ref), free(a), free(b), free(dx), free(dres);
    free(inplace), free(o0), free(o1), free(plain), free(d0);
}

/* The same 4 samples as one micro-batch or as micro-batches of 1 and 3: bitwise the same rows. */
static void test_residual_split(void) {
    const int T = 6, C = 9, B = 4;
    size_t n = (size_t)B * T * C, n1 = (size_t)T * C;
    float *res = rand_f(n, 1.0f), *x = rand_f(n, 1.0f), *whole = alloc_f(n), *parts = alloc_f(n);
    float *dw = alloc_f(n), *dp = alloc_f(n);
    fsdp_dropout d = fsdp_dropout_make(0.4, 7, 500, 1, FSDP_DROPOUT_MLP_OUT);
    fsdp_dropout d1 = d, d3 = d;
    d3.sample_base = d.sample_base + 1;
    cpu_residual_dropout_forward(whole, res, x, B * T, T, C, &d);
    cpu_residual_dropout_forward(parts, res, x, T, T, C, &d1);
    cpu_residual_dropout_forward(parts + n1, res + n1, x + n1, 3 * T, T, C, &d3);
    cpu_dropout_backward(dw, x, B * T, T, C, &d);
    cpu_dropout_backward(dp, x, T, T, C, &d1);
    cpu_dropout_backward(dp + n1, x + n1, 3 * T, T, C, &d3);
    check_that(!memcmp(whole, parts, n * 4) && !memcmp(dw, dp, n * 4),
               "%-40s 4 samples at once == 1 + 3 (bitwise, forward and backward)", "residual dropout split");
    free(res), free(x), free(whole), free(parts), free(dw), free(dp);
}

/* ---- attention ---------------------------------------------------------------------------------- */

/* Attention with the mask applied to the normalised probabilities against the double reference,
 * both backward paths against finite differences; and p does change out, not lse. */
static void test_attention_dropout(int B, int T, int Hq, int Hkv, int D, double p) {
    fsdp_dropout d = fsdp_dropout_make(p, 4242, 31, 5, FSDP_DROPOUT_ATTN_PROBS);
    attn_ctx c = {.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D, .drop = &d};
    attn_setup(&c);
    size_t no = attn_out_numel(&c), nl = (size_t)B * Hq * T;
    float *plain = alloc_f(no), *plain_lse = alloc_f(nl);
    cpu_attention_forward(plain, plain_lse, NULL, c.qkv, B, T, Hq, Hkv, D, NULL);
    char label[32];
    snprintf(label, sizeof label, "attention p %.2f", p);
    attn_check_paths(&c, label, "attention dropout");
    attn_loss(&c); /* the gradient checks left perturbed outputs */
    check_that(memcmp(plain, c.out, no * 4) != 0 && !memcmp(plain_lse, c.lse, nl * 4),
               "%-40s p %.2f changes out, not lse", "attention dropout", p);
    attn_free(&c);
    free(plain), free(plain_lse);
}

/* p = 0 and NULL give the dropout-free bits; a 3-sample micro-batch equals 1 + 2 samples. */
static void test_attention_exact_cases(void) {
    const int B = 3, T = 19, Hq = 4, Hkv = 2, D = 8; /* T > 16: more than one 16 x 16 tile */
    const size_t W = (size_t)(Hq + 2 * Hkv) * D, nq = (size_t)B * T * W, no = (size_t)B * T * Hq * D;
    const size_t nl = (size_t)B * Hq * T;
    float *qkv = rand_f(nq, 1.5f), *dout = rand_f(no, 1.0f);
    float *o[3], *l[3], *g[3];
    for (int k = 0; k < 3; k++) o[k] = alloc_f(no), l[k] = alloc_f(nl), g[k] = alloc_f(nq);
    fsdp_dropout z = fsdp_dropout_make(0.0, 5, 10, 0, FSDP_DROPOUT_ATTN_PROBS);
    cpu_attention_forward(o[0], l[0], NULL, qkv, B, T, Hq, Hkv, D, NULL);
    cpu_attention_backward(g[0], dout, qkv, o[0], l[0], NULL, B, T, Hq, Hkv, D, NULL);
    cpu_attention_forward(o[1], l[1], NULL, qkv, B, T, Hq, Hkv, D, &z);
    cpu_attention_backward(g[1], dout, qkv, o[1], l[1], NULL, B, T, Hq, Hkv, D, &z);
    check_that(!memcmp(o[0], o[1], no * 4) && !memcmp(l[0], l[1], nl * 4) && !memcmp(g[0], g[1], nq * 4),
               "%-40s p 0 == no dropout (bitwise, forward and backward)", "attention dropout");

    fsdp_dropout d = fsdp_dropout_make(0.2, 5, 10, 0, FSDP_DROPOUT_ATTN_PROBS), d2 = d;
    d2.sample_base = d.sample_base + 1;
    const size_t tq = (size_t)T * W, to = (size_t)T * Hq * D, tl = (size_t)Hq * T;
    cpu_attention_forward(o[1], l[1], NULL, qkv, B, T, Hq, Hkv, D, &d);
    cpu_attention_backward(g[1], dout, qkv, o[1], l[1], NULL, B, T, Hq, Hkv, D, &d);
    cpu_attention_forward(o[2], l[2], NULL, qkv, 1, T, Hq, Hkv, D, &d);
    cpu_attention_backward(g[2], dout, qkv, o[2], l[2], NULL, 1, T, Hq, Hkv, D, &d);
    cpu_attention_forward(o[2] + to, l[2] + tl, NULL, qkv + tq, 2, T, Hq, Hkv, D, &d2);
    cpu_attention_backward(g[2] + tq, dout + to, qkv + tq, o[2] + to, l[2] + tl, NULL, 2, T, Hq, Hkv, D, &d2);
    check_that(!memcmp(o[1], o[2], no * 4) && !memcmp(g[1], g[2], nq * 4),
               "%-40s 3 samples at once == 1 + 2 (bitwise, forward and backward)", "attention dropout split");
    for (int k = 0; k < 3; k++) free(o[k]), free(l[k]), free(g[k]);
    free(qkv), free(dout);
}

/* The mask probes of tests/unit/test_gpu_attention.c rest on this: with V one-hot (v_j = e_j) the
 * output out[t, h, j] is 0 exactly where P[h, t, j] is dropped; with dout one-hot (dout[t, h] = e_t)
 * and one query head per kv head, dV[j, h, t] is; with K one-hot and out = 0, dQ[t, h, j] is. */
static void test_attention_probes(void) {
    const int B = 2, T = 21, Hq = 2, Hkv = 2, D = 24; /* T <= D */
    const size_t W = (size_t)(Hq + 2 * Hkv) * D, nq = (size_t)B * T * W, no = (size_t)B * T * Hq * D;
    const size_t nl = (size_t)B * Hq * T;
    fsdp_dropout d = fsdp_dropout_make(0.3, 8, 70, 1, FSDP_DROPOUT_ATTN_PROBS);
    float *qkv = rand_f(nq, 1.5f), *dout = rand_f(no, 1.0f), *out = alloc_f(no), *lse = alloc_f(nl);
    float *g = alloc_f(nq), *onehot = alloc_f(no), *zero = alloc_f(no);
    memset(zero, 0, no * sizeof(float));
    for (int bt = 0; bt < B * T; bt++)
        for (int k = 0; k < Hkv; k++)
            for (int i = 0; i < D; i++) qkv[(size_t)bt * W + (size_t)(Hq + Hkv + k) * D + i] = i == bt % T;
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < D; i++) onehot[((size_t)bt * Hq + h) * D + i] = i == bt % T;
    long bad[3] = {0, 0, 0}, dropped = 0;
    cpu_attention_forward(out, lse, NULL, qkv, B, T, Hq, Hkv, D, &d);
    cpu_attention_backward(g, onehot, qkv, out, lse, NULL, B, T, Hq, Hkv, D, &d);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j <= t; j++) {
                    int drop = !fsdp_dropout_keep_probs(&d, b, h, t, j, T);
                    dropped += drop;
                    bad[0] += (out[((size_t)(b * T + t) * Hq + h) * D + j] == 0.0f) != drop;
                    bad[1] += (g[(size_t)(b * T + j) * W + (size_t)(Hq + Hkv + h) * D + t] == 0.0f) != drop;
                }
    for (int bt = 0; bt < B * T; bt++) /* K one-hot, V random again */
        for (int k = 0; k < Hkv; k++)
            for (int i = 0; i < D; i++) {
                qkv[(size_t)bt * W + (size_t)(Hq + k) * D + i] = i == bt % T;
                qkv[(size_t)bt * W + (size_t)(Hq + Hkv + k) * D + i] = rnd_sym(1.5f);
            }
    cpu_attention_forward(out, lse, NULL, qkv, B, T, Hq, Hkv, D, &d);
    cpu_attention_backward(g, dout, qkv, zero, lse, NULL, B, T, Hq, Hkv, D, &d);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j <= t; j++)
                    bad[2] += (g[(size_t)(b * T + t) * W + (size_t)h * D + j] == 0.0f) !=
                              !fsdp_dropout_keep_probs(&d, b, h, t, j, T);
    check_that(!bad[0] && !bad[1] && !bad[2] && dropped > 0,
               "%-40s zeros == dropped: out %ld, dV %ld, dQ %ld mismatches (%ld dropped)", "attention mask probes",
               bad[0], bad[1], bad[2], dropped);
    free(qkv), free(dout), free(out), free(lse), free(g), free(onehot), free(zero);
}

/* ---- determinism across thread counts ------------------------------------------------------------ */

static void test_threads(void) {
    const int B = 2, T = 13, Hq = 4, Hkv = 2, D = 8, C = 37;
    const size_t nq = (size_t)B * T * (Hq + 2 * Hkv) * D, no = (size_t)B * T * Hq * D, nl = (size_t)B * Hq * T;
    const size_t nr = (size_t)B * T * C, total = 2 * nq + no + nl + nl * T + 2 * nr;
    float *qkv = rand_f(nq, 1.5f), *dout = rand_f(no, 1.0f), *res = rand_f(nr, 1.0f), *x = rand_f(nr, 1.0f);
    fsdp_dropout d = fsdp_dropout_make(0.3, 11, 0, 1, FSDP_DROPOUT_ATTN_PROBS);
    float *ref = alloc_f(total), *got = alloc_f(total);
    int saved = omp_get_max_threads(), same = 1;
    for (int th = 1; th <= 3; th++) {
        float *r = th == 1 ? ref : got;
        float *dq1 = r, *dq2 = r + nq, *out = dq2 + nq, *lse = out + no, *probs = lse + nl, *ro = probs + nl * T;
        float *rd = ro + nr;
        omp_set_num_threads(th);
        cpu_attention_forward(out, lse, probs, qkv, B, T, Hq, Hkv, D, &d);
        cpu_attention_backward(dq1, dout, qkv, out, lse, probs, B, T, Hq, Hkv, D, &d);
        cpu_attention_backward(dq2, dout, qkv, out, lse, NULL, B, T, Hq, Hkv, D, &d);
        cpu_residual_dropout_forward(ro, res, x, B * T, T, C, &d);
        cpu_dropout_backward(rd, x, B * T, T, C, &d);
        if (th > 1) same &= memcmp(ref, got, total * sizeof(float)) == 0;
    }
    omp_set_num_threads(saved);
    check_that(same, "%-40s bitwise equal with 1, 2 and 3 threads", "dropout ops (attention, residual)");
    free(qkv), free(dout), free(res), free(x), free(ref), free(got);
}

int main(void) {
    test_philox_known_answers();
    test_rate();
    test_statistics();
    test_probs_groups();
    test_residual_dropout();
    test_residual_split();
    test_attention_dropout(2, 5, 4, 2, 6, 0.25);  /* GQA */
    test_attention_dropout(1, 20, 2, 1, 4, 0.4);  /* MQA, two 16 x 16 tiles per side */
    test_attention_dropout(1, 6, 2, 2, 5, 0.1);   /* MHA, odd head dim */
    test_attention_exact_cases();
    test_attention_probes();
    test_threads();
    return check_summary("test_dropout_ops");
}
