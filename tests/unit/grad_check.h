/* Shared by the CPU op tests (test_ops_grad.c, test_dropout_ops.c): a fixed-seed random source,
 * allocation helpers, the comparison of an output with a double reference, and the
 * gradient checker (central finite differences element by element and along one random direction).
 * Header-only: each test program includes it once. */
#ifndef FSDP_TESTS_GRAD_CHECK_H
#define FSDP_TESTS_GRAD_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ---- small utilities -------------------------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* splitmix64: a fixed seed makes every run of the test identical. */
static inline double rnd(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0; /* [0, 1) */
}
static inline float rnd_sym(float a) { return (float)((2.0 * rnd() - 1.0) * a); } /* uniform in (-a, a) */

static inline float *alloc_f(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}
static inline float *rand_f(size_t n, float a) {
    float *p = alloc_f(n);
    for (size_t i = 0; i < n; i++) p[i] = rnd_sym(a);
    return p;
}
static inline float *copy_f(const float *x, size_t n) {
    float *p = alloc_f(n);
    memcpy(p, x, n * sizeof(float));
    return p;
}
static inline void fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static inline void sub_f(float *x, const float *y, size_t n) { /* x -= y: removes a "+=" pre-fill */
    for (size_t i = 0; i < n; i++) x[i] -= y[i];
}
static inline double dot_d(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Compares an op's output with a double reference: |got - ref| <= atol + rtol * |ref|. */
static inline void compare(const char *what, const float *got, const double *ref, size_t n, double atol,
                           double rtol) {
    double worst = 0.0, worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        double r = e == 0.0 ? 0.0 : e / (atol + rtol * fabs(ref[i]));
        if (!(e <= worst)) worst = e; /* NaN sticks */
        if (!(r <= worst_ratio)) worst_ratio = r;
    }
    check_that(worst_ratio <= 1.0, "%-40s forward vs double reference: max abs err %.2e (err/tol %.3f)", what, worst,
               worst_ratio);
}

/* ---- the gradient checker ---------------------------------------------------------------------- */

typedef double (*loss_fn)(void *ctx); /* re-runs the forward from the current inputs, returns L */

typedef struct {
    const char *name;
    float *x;       /* the input, perturbed in place and restored */
    size_t n;
    const float *g; /* the analytic dL/dx */
} grad_param;

#define FD_STEP 3e-3     /* relative to max(1, |x|) */
#define FD_RTOL 2e-2
#define FD_ATOL 2e-3     /* times the largest gradient of the tensor */
#define DIR_RTOL 2e-3
#define DIR_ATOL 1e-4    /* times sum |g_i * dx_i| */

/* Element-by-element central differences. The step actually taken is the difference of the two
 * rounded fp32 inputs, so fp32 rounding of x + h does not bias the quotient. Returns the worst
 * error/tolerance ratio (<= 1 passes); prints nothing. */
static inline double fd_elements(loss_fn f, void *ctx, const grad_param *p, double *max_err) {
    double *fd = malloc(p->n * sizeof(double));
    double scale = 1e-3;
    for (size_t i = 0; i < p->n; i++) {
        float x0 = p->x[i];
        double h = FD_STEP * fmax(1.0, fabs(x0));
        float xp = (float)(x0 + h), xm = (float)(x0 - h);
        p->x[i] = xp;
        double lp = f(ctx);
        p->x[i] = xm;
        double lm = f(ctx);
        p->x[i] = x0;
        fd[i] = (lp - lm) / ((double)xp - (double)xm);
        scale = fmax(scale, fmax(fabs(fd[i]), fabs(p->g[i])));
    }
    double worst = 0.0;
    *max_err = 0.0;
    for (size_t i = 0; i < p->n; i++) {
        double an = p->g[i], e = fabs(fd[i] - an);
        double tol = FD_RTOL * fmax(fabs(an), fabs(fd[i])) + FD_ATOL * scale;
        if (!(e <= *max_err)) *max_err = e;
        if (!(e / tol <= worst)) worst = e / tol;
    }
    free(fd);
    return worst;
}

/* Moves every input at once along a random direction u: compares L(x + t u) - L(x - t u) with
 * sum_i g_i * (actual step of x_i). Returns the error/tolerance ratio; *rel gets |fd - an| / |an|. */
static inline double fd_direction(loss_fn f, void *ctx, const grad_param *ps, int np, double *rel) {
    float **x0 = malloc((size_t)np * sizeof(float *)), **xp = malloc((size_t)np * sizeof(float *));
    float **xm = malloc((size_t)np * sizeof(float *));
    double an = 0.0, mag = 0.0;
    for (int k = 0; k < np; k++) {
        const grad_param *p = &ps[k];
        x0[k] = copy_f(p->x, p->n);
        xp[k] = alloc_f(p->n);
        xm[k] = alloc_f(p->n);
        for (size_t i = 0; i < p->n; i++) {
            double h = FD_STEP * fmax(1.0, fabs(x0[k][i])) * (2.0 * rnd() - 1.0);
            xp[k][i] = (float)(x0[k][i] + h);
            xm[k][i] = (float)(x0[k][i] - h);
            double term = (double)p->g[i] * ((double)xp[k][i] - (double)xm[k][i]);
            an += term;
            mag += fabs(term);
        }
    }
    for (int k = 0; k < np; k++) memcpy(ps[k].x, xp[k], ps[k].n * sizeof(float));
    double lp = f(ctx);
    for (int k = 0; k < np; k++) memcpy(ps[k].x, xm[k], ps[k].n * sizeof(float));
    double lm = f(ctx);
    for (int k = 0; k < np; k++) {
        memcpy(ps[k].x, x0[k], ps[k].n * sizeof(float));
        free(x0[k]);
        free(xp[k]);
        free(xm[k]);
    }
    free(x0);
    free(xp);
    free(xm);
    double fd = lp - lm, e = fabs(fd - an);
    *rel = e / fmax(fabs(an), 1e-30);
    return e / (DIR_RTOL * fmax(fabs(an), fabs(fd)) + DIR_ATOL * mag + 1e-12);
}

/* Runs both checks on every listed input, one line each. f(ctx) must be current on entry. */
static inline void check_grads(const char *op, loss_fn f, void *ctx, const grad_param *ps, int np) {
    for (int k = 0; k < np; k++) {
        double max_err, worst = fd_elements(f, ctx, &ps[k], &max_err);
        check_that(worst <= 1.0, "%-40s d%-8s %4zu elems: max |fd-an| %.2e (err/tol %.3f)", op, ps[k].name, ps[k].n,
                   max_err, worst);
    }
    double rel, worst = fd_direction(f, ctx, ps, np, &rel);
    check_that(worst <= 1.0, "%-40s directional derivative: rel err %.2e (err/tol %.3f)", op, rel, worst);
}

#endif
