/* Checks the CPU reference ops (src/kernels/ops_cpu.h), which define what every op computes:
 *  - each forward against a naive double-precision implementation written out here;
 *  - each backward against central finite differences of L = sum(out * R) for a random R, element
 *    by element and along one random direction through all inputs at once (less noisy);
 *  - the accumulation rules: "+=" outputs are pre-filled with random values that are subtracted
 *    afterwards, overwritten outputs are pre-filled with NaN so a missed element shows;
 *  - AdamW against the torch.optim.AdamW formula in double over several steps;
 *  - sums against naive sums, bf16 rounding against fsdp_round_bf16;
 *  - bitwise equality of results under 1, 2 and 3 OpenMP threads;
 *  - that the gradient checker itself rejects a slightly wrong gradient.
 * Sizes are small and deliberately not powers of two. Prints one line per check; exits 1 on any
 * failure. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/ops_cpu.h"

#include "attention_rig.h"
#include "grad_check.h"

/* ---- matmul (+ relu_backward) ------------------------------------------------------------------ */

typedef struct {
    int N, C, OC, relu, alias;
    float *inp, *w, *b, *res, *out, *R; /* b, res may be NULL */
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    const float *res = c->res;
    if (c->alias) { /* residual passed as out itself, as the model does for the residual stream */
        memcpy(c->out, c->res, (size_t)c->N * c->OC * sizeof(float));
        res = c->out;
    }
    cpu_matmul_forward(c->out, c->inp, c->w, c->b, res, c->N, c->C, c->OC, c->relu);
    return dot_d(c->out, c->R, (size_t)c->N * c->OC);
}

static void mm_reference(const mm_ctx *c, double *ref) {
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double y = 0.0;
            for (int k = 0; k < c->C; k++) y += (double)c->inp[n * c->C + k] * c->w[o * c->C + k];
            if (c->b) y += c->b[o];
            if (c->res) y += c->res[n * c->OC + o];
            ref[n * c->OC + o] = (c->relu && y < 0) ? 0.0 : y;
        }
}

/* Analytic gradients: relu_backward masks dout = R, then matmul_backward (dinp pre-filled with NaN:
 * overwritten; dweight/dbias pre-filled with random values: accumulated). */
static void mm_grads(const mm_ctx *c, float *dout, float *dinp, float *dw, float *db) {
    size_t no = (size_t)c->N * c->OC;
    memcpy(dout, c->R, no * sizeof(float));
    if (c->relu) cpu_relu_backward(dout, c->out, no);
    float *pw = rand_f((size_t)c->OC * c->C, 1.0f), *pb = rand_f((size_t)c->OC, 1.0f);
    memcpy(dw, pw, (size_t)c->OC * c->C * sizeof(float));
    memcpy(db, pb, (size_t)c->OC * sizeof(float));
    if (dinp) fill_nan(dinp, (size_t)c->N * c->C);
    cpu_matmul_backward(dinp, dw, c->b ? db : NULL, dout, c->inp, c->w, c->N, c->C, c->OC);
    sub_f(dw, pw, (size_t)c->OC * c->C);
    sub_f(db, pb, (size_t)c->OC);
    free(pw);
    free(pb);
}

static void test_matmul(const char *label, int bias, int residual, int alias, int relu, int null_dinp) {
    mm_ctx c = {.N = 6, .C = 10, .OC = 7, .relu = relu, .alias = alias};
    size_t ni = (size_t)c.N * c.C, nw = (size_t)c.OC * c.C, no = (size_t)c.N * c.OC;
    c.inp = rand_f(ni, 1.0f);
    c.w = rand_f(nw, 1.0f);
    c.b = bias ? rand_f((size_t)c.OC, 1.0f) : NULL;
    c.res = residual ? rand_f(no, 1.0f) : NULL;
    c.out = alloc_f(no);
    c.R = rand_f(no, 1.0f);
    double *ref = malloc(no * sizeof(double));
    if (relu) { /* keep pre-activations >= 0.3 away from the kink, so finite differences never cross it */
        int saved = c.relu;
        c.relu = 0;
        mm_reference(&c, ref);
        c.relu = saved;
        for (size_t i = 0; i < no; i++)
            if (fabs(ref[i]) < 0.25) c.res[i] += ref[i] >= 0 ? 0.3f : -0.3f;
    }
    mm_reference(&c, ref);
    mm_loss(&c);
    char what[96];
    snprintf(what, sizeof what, "matmul %s", label);
    compare(what, c.out, ref, no, 1e-5, 1e-5);
    if (alias) { /* aliased residual must give the same bits as a separate one */
        float *sep = alloc_f(no);
        cpu_matmul_forward(sep, c.inp, c.w, c.b, c.res, c.N, c.C, c.OC, c.relu);
        check_that(memcmp(sep, c.out, no * sizeof(float)) == 0, "%-40s residual aliasing out == separate residual",
                   what);
        free(sep);
    }

    float *dout = alloc_f(no), *dinp = null_dinp ? NULL : alloc_f(ni), *dw = alloc_f(nw), *db = alloc_f((size_t)c.OC);
    mm_grads(&c, dout, dinp, dw, db);
    grad_param ps[4];
    int np = 0;
    if (dinp) ps[np++] = (grad_param){"inp", c.inp, ni, dinp};
    ps[np++] = (grad_param){"weight", c.w, nw, dw};
    if (bias) ps[np++] = (grad_param){"bias", c.b, (size_t)c.OC, db};
    if (residual) ps[np++] = (grad_param){"residual", c.res, no, dout}; /* flows through unchanged */
    check_grads(what, mm_loss, &c, ps, np);

    free(c.inp), free(c.w), free(c.b), free(c.res), free(c.out), free(c.R), free(ref);
    free(dout), free(dinp), free(dw), free(db);
}

/* The checker must reject gradients that are slightly wrong: the largest dweight element off by 10%,
 * and every gradient scaled by 1.05. */
static void test_checker_rejects_wrong_gradients(void) {
    mm_ctx c = {.N = 6, .C = 10, .OC = 7};
    size_t ni = (size_t)c.N * c.C, nw = (size_t)c.OC * c.C, no = (size_t)c.N * c.OC;
    c.inp = rand_f(ni, 1.0f);
    c.w = rand_f(nw, 1.0f);
    c.b = rand_f((size_t)c.OC, 1.0f);
    c.out = alloc_f(no);
    c.R = rand_f(no, 1.0f);
    float *dout = alloc_f(no), *dinp = alloc_f(ni), *dw = alloc_f(nw), *db = alloc_f((size_t)c.OC);
    mm_loss(&c);
    mm_grads(&c, dout, dinp, dw, db);

    size_t big = 0; /* the largest element, so the test does not hinge on which one the seed makes small */
    for (size_t i = 1; i < nw; i++)
        if (fabsf(dw[i]) > fabsf(dw[big])) big = i;
    float saved = dw[big];
    dw[big] *= 1.1f;
    grad_param one = {"weight", c.w, nw, dw};
    double max_err, worst = fd_elements(mm_loss, &c, &one, &max_err);
    check_that(worst > 1.0, "%-40s flags one dweight element * 1.1 (err/tol %.2f > 1)", "gradient checker", worst);
    dw[big] = saved;

    for (size_t i = 0; i < ni; i++) dinp[i] *= 1.05f;
    for (size_t i = 0; i < nw; i++) dw[i] *= 1.05f;
    for (int i = 0; i < c.OC; i++) db[i] *= 1.05f;
    grad_param ps[3] = {{"inp", c.inp, ni, dinp}, {"weight", c.w, nw, dw}, {"bias", c.b, (size_t)c.OC, db}};
    double rel;
    worst = fd_direction(mm_loss, &c, ps, 3, &rel);
    check_that(worst > 1.0, "%-40s flags all gradients * 1.05 along a direction (err/tol %.2f > 1)", "gradient checker",
               worst);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.R), free(dout), free(dinp), free(dw), free(db);
}

/* relu_backward alone: L = sum(relu(x) * R), inputs kept >= 0.1 away from 0. */
typedef struct {
    size_t n;
    float *x, *R;
} relu_ctx;

static double relu_loss(void *p) {
    relu_ctx *c = p;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++) s += (c->x[i] > 0 ? c->x[i] : 0.0) * c->R[i];
    return s;
}

static void test_relu_backward(void) {
    relu_ctx c = {.n = 23};
    c.x = alloc_f(c.n);
    for (size_t i = 0; i < c.n; i++) c.x[i] = (rnd() < 0.5 ? -1.0f : 1.0f) * (float)(0.1 + 0.9 * rnd());
    c.R = rand_f(c.n, 1.0f);
    float *out = alloc_f(c.n), *d = copy_f(c.R, c.n);
    for (size_t i = 0; i < c.n; i++) out[i] = c.x[i] > 0 ? c.x[i] : 0.0f;
    cpu_relu_backward(d, out, c.n);
    int exact = 1;
    for (size_t i = 0; i < c.n; i++) exact &= d[i] == (out[i] > 0 ? c.R[i] : 0.0f);
    check_that(exact, "%-40s d == R where out > 0, else 0 (exact)", "relu_backward");
    grad_param p = {"x", c.x, c.n, d};
    check_grads("relu_backward", relu_loss, &c, &p, 1);
    free(c.x), free(c.R), free(out), free(d);
}

/* ---- embedding --------------------------------------------------------------------------------- */

typedef struct {
    int N, T, C, V, P, pos_offset; /* P rows in wpe */
    int32_t *tok;
    float *wte, *wpe, *out, *R;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    cpu_embedding_forward(c->out, c->tok, c->wte, c->wpe, c->pos_offset, c->N, c->T, c->C);
    return dot_d(c->out, c->R, (size_t)c->N * c->C);
}

static void test_embedding(int with_wpe) {
    static const int32_t tokens[10] = {3, 1, 3, 3, 0, 10, 1, 3, 7, 3}; /* repeats within and across rows */
    emb_ctx c = {.N = 10, .T = 5, .C = 10, .V = 11, .P = 9, .pos_offset = 2, .tok = (int32_t *)tokens};
    size_t ne = (size_t)c.V * c.C, np_ = (size_t)c.P * c.C, no = (size_t)c.N * c.C;
    c.wte = rand_f(ne, 1.0f);
    c.wpe = with_wpe ? rand_f(np_, 1.0f) : NULL;
    c.out = alloc_f(no);
    c.R = rand_f(no, 1.0f);
    const char *what = with_wpe ? "embedding wte+wpe, repeated tokens" : "embedding wte only, repeated tokens";
    emb_loss(&c);
    double *ref = malloc(no * sizeof(double));
    for (int n = 0; n < c.N; n++)
        for (int k = 0; k < c.C; k++)
            ref[n * c.C + k] = (double)c.wte[tokens[n] * c.C + k] +
                               (c.wpe ? (double)c.wpe[(c.pos_offset + n % c.T) * c.C + k] : 0.0);
    compare(what, c.out, ref, no, 0.0, 1e-7); /* one fp32 add: exact up to its rounding */

    float *pe = rand_f(ne, 1.0f), *pp = rand_f(np_, 1.0f);
    float *dwte = copy_f(pe, ne), *dwpe = copy_f(pp, np_);
    cpu_embedding_backward(dwte, with_wpe ? dwpe : NULL, c.R, c.tok, -1, c.pos_offset, c.N, c.T, c.C);
    /* padding_idx 3 (the most repeated token): its row gets nothing, every other row the same sums,
     * and the positions of the padded tokens still get theirs. */
    float *pad_wte = copy_f(pe, ne), *pad_wpe = copy_f(pp, np_);
    cpu_embedding_backward(pad_wte, with_wpe ? pad_wpe : NULL, c.R, c.tok, 3, c.pos_offset, c.N, c.T, c.C);
    int pad_ok = memcmp(pad_wte + 3 * c.C, pe + 3 * c.C, (size_t)c.C * sizeof(float)) == 0 &&
                 memcmp(pad_wte, dwte, 3 * (size_t)c.C * sizeof(float)) == 0 &&
                 memcmp(pad_wte + 4 * c.C, dwte + 4 * c.C, (ne - 4 * (size_t)c.C) * sizeof(float)) == 0 &&
                 memcmp(pad_wpe, dwpe, np_ * sizeof(float)) == 0 &&
                 memcmp(dwte + 3 * c.C, pe + 3 * c.C, (size_t)c.C * sizeof(float)) != 0;
    check_that(pad_ok, "%-40s padding_idx: its row untouched, the rest as without", what);
    free(pad_wte), free(pad_wpe);
    sub_f(dwte, pe, ne);
    if (!with_wpe)
        check_that(memcmp(dwpe, pp, np_ * sizeof(float)) == 0, "%-40s dwpe NULL: nothing else touched", what);
    sub_f(dwpe, pp, np_);
    grad_param ps[2] = {{"wte", c.wte, ne, dwte}, {"wpe", c.wpe, np_, dwpe}};
    check_grads(what, emb_loss, &c, ps, with_wpe ? 2 : 1);
    free(c.wte), free(c.wpe), free(c.out), free(c.R), free(ref), free(pe), free(pp), free(dwte), free(dwpe);
}

/* ---- rmsnorm / layernorm ------------------------------------------------------------------------ */

typedef struct {
    int N, C, layer; /* layer: LayerNorm, else RMSNorm */
    float eps;
    float *inp, *w, *b, *out, *mean, *rstd, *R;
} norm_ctx;

static double norm_loss(void *p) {
    norm_ctx *c = p;
    if (c->layer)
        cpu_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, c->eps);
    else
        cpu_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, c->eps);
    return dot_d(c->out, c->R, (size_t)c->N * c->C);
}

static void test_norm(int layer) {
    norm_ctx c = {.N = 6, .C = 10, .layer = layer, .eps = 1e-5f};
    size_t n = (size_t)c.N * c.C;
    c.inp = rand_f(n, 2.0f);
    for (size_t i = 0; i < n; i++) c.inp[i] += 0.5f; /* nonzero mean, so LayerNorm's centring matters */
    c.w = rand_f((size_t)c.C, 1.5f);
    c.b = rand_f((size_t)c.C, 1.0f);
    c.out = alloc_f(n);
    c.mean = alloc_f((size_t)c.N);
    c.rstd = alloc_f((size_t)c.N);
    c.R = rand_f(n, 1.0f);
    const char *what = layer ? "layernorm" : "rmsnorm";
    norm_loss(&c);

    double *ref = malloc(n * sizeof(double)), *rmean = malloc((size_t)c.N * sizeof(double));
    double *rrstd = malloc((size_t)c.N * sizeof(double));
    for (int r = 0; r < c.N; r++) {
        const float *x = c.inp + r * c.C;
        double mu = 0.0, var = 0.0;
        if (layer) {
            for (int k = 0; k < c.C; k++) mu += x[k];
            mu /= c.C;
        }
        for (int k = 0; k < c.C; k++) var += (x[k] - mu) * (x[k] - mu);
        rmean[r] = mu;
        rrstd[r] = 1.0 / sqrt(var / c.C + c.eps);
        for (int k = 0; k < c.C; k++)
            ref[r * c.C + k] = (x[k] - mu) * rrstd[r] * c.w[k] + (layer ? c.b[k] : 0.0);
    }
    compare(what, c.out, ref, n, 1e-5, 1e-5);
    char stat[64];
    snprintf(stat, sizeof stat, "%s rstd", what);
    compare(stat, c.rstd, rrstd, (size_t)c.N, 0.0, 1e-6);
    if (layer) {
        snprintf(stat, sizeof stat, "%s mean", what);
        compare(stat, c.mean, rmean, (size_t)c.N, 1e-7, 1e-6);
    }

    float *pi = rand_f(n, 1.0f), *pw = rand_f((size_t)c.C, 1.0f), *pb = rand_f((size_t)c.C, 1.0f);
    float *dinp = copy_f(pi, n), *dw = copy_f(pw, (size_t)c.C), *db = copy_f(pb, (size_t)c.C);
    if (layer)
        cpu_layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
    else
        cpu_rmsnorm_backward(dinp, dw, c.R, c.inp, c.w, c.rstd, c.N, c.C);
    sub_f(dinp, pi, n); /* norms ADD into dinp (the residual-stream gradient) */
    sub_f(dw, pw, (size_t)c.C);
    sub_f(db, pb, (size_t)c.C);
    grad_param ps[3] = {{"inp", c.inp, n, dinp}, {"weight", c.w, (size_t)c.C, dw}, {"bias", c.b, (size_t)c.C, db}};
    check_grads(what, norm_loss, &c, ps, layer ? 3 : 2);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
    free(ref), free(rmean), free(rrstd), free(pi), free(pw), free(pb), free(dinp), free(dw), free(db);
}

/* ---- rope --------------------------------------------------------------------------------------- */

typedef struct {
    int B, T, Hq, Hkv, D;
    float *qkv, *work, *cos_sin, *R;
} rope_ctx;

static size_t rope_numel(const rope_ctx *c) { return (size_t)c->B * c->T * (c->Hq + 2 * c->Hkv) * c->D; }

static double rope_loss(void *p) {
    rope_ctx *c = p;
    memcpy(c->work, c->qkv, rope_numel(c) * sizeof(float));
    cpu_rope_forward(c->work, c->cos_sin, c->B, c->T, c->Hq, c->Hkv, c->D);
    return dot_d(c->work, c->R, rope_numel(c));
}

/* 1 when the v heads of every token of a and b are bitwise equal. */
static int v_heads_equal(const rope_ctx *c, const float *a, const float *b) {
    int W = (c->Hq + 2 * c->Hkv) * c->D, v0 = (c->Hq + c->Hkv) * c->D;
    for (int bt = 0; bt < c->B * c->T; bt++)
        if (memcmp(a + bt * W + v0, b + bt * W + v0, (size_t)(W - v0) * sizeof(float))) return 0;
    return 1;
}

static void test_rope(void) {
    rope_ctx c = {.B = 2, .T = 5, .Hq = 4, .Hkv = 2, .D = 6};
    size_t n = rope_numel(&c);
    int half = c.D / 2, W = (c.Hq + 2 * c.Hkv) * c.D;
    c.qkv = rand_f(n, 1.0f);
    c.work = alloc_f(n);
    c.R = rand_f(n, 1.0f);
    c.cos_sin = alloc_f((size_t)c.T * half * 2);
    for (int t = 0; t < c.T; t++) /* positions 3.. (an offset cache), HF inverse frequencies */
        for (int i = 0; i < half; i++) {
            double th = (t + 3) * pow(10000.0, -2.0 * i / c.D);
            c.cos_sin[(t * half + i) * 2] = (float)cos(th);
            c.cos_sin[(t * half + i) * 2 + 1] = (float)sin(th);
        }
    rope_loss(&c);
    double *ref = malloc(n * sizeof(double));
    for (int bt = 0; bt < c.B * c.T; bt++)
        for (int h = 0; h < c.Hq + 2 * c.Hkv; h++)
            for (int i = 0; i < c.D; i++) {
                size_t at = (size_t)bt * W + h * c.D;
                const float *x = c.qkv + at;
                if (h >= c.Hq + c.Hkv) { /* v head */
                    ref[at + i] = x[i];
                    continue;
                }
                int k = i % half, t = bt % c.T;
                double cs = c.cos_sin[(t * half + k) * 2], sn = c.cos_sin[(t * half + k) * 2 + 1];
                /* rotate_half(x) = [-x2, x1] */
                double rot = i < half ? -(double)x[i + half] : (double)x[i - half];
                ref[at + i] = x[i] * cs + rot * sn;
            }
    compare("rope q,k heads (v untouched)", c.work, ref, n, 1e-6, 1e-6);
    check_that(v_heads_equal(&c, c.work, c.qkv), "%-40s forward leaves v heads bitwise", "rope");

    float *d = copy_f(c.R, n);
    cpu_rope_backward(d, c.cos_sin, c.B, c.T, c.Hq, c.Hkv, c.D);
    check_that(v_heads_equal(&c, d, c.R), "%-40s backward leaves dv heads bitwise", "rope");
    grad_param p = {"qkv", c.qkv, n, d};
    check_grads("rope", rope_loss, &c, &p, 1);
    free(c.qkv), free(c.work), free(c.R), free(c.cos_sin), free(ref), free(d);
}

/* ---- attention ---------------------------------------------------------------------------------- */

/* Forward against the reference, then the gradient of both paths (stored probs, recomputed probs). */
static void test_attention(int B, int T, int Hq, int Hkv, int D) {
    attn_ctx c = {.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D};
    attn_setup(&c);
    attn_check_paths(&c, "attention", "attention");
    attn_free(&c);
}

/* With a sliding window (Mistral): the reference masks keys j <= t - window too. */
static void test_attention_window(int B, int T, int Hq, int Hkv, int D, int window) {
    attn_ctx c = {.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D, .window = window};
    attn_setup(&c);
    attn_check_paths(&c, "attention (window)", "attention (window)");
    /* The window is applied: the output differs from plain causal attention's where it cuts. */
    size_t no = attn_out_numel(&c);
    float *plain = alloc_f(no), *lse = alloc_f((size_t)B * Hq * T);
    cpu_attention_forward(plain, lse, NULL, c.qkv, B, T, Hq, Hkv, D, NULL);
    cpu_attention_forward_window(c.out, c.lse, NULL, c.qkv, B, T, Hq, Hkv, D, window, NULL);
    double diff = 0.0;
    for (size_t i = 0; i < no; i++) diff = fmax(diff, fabs((double)plain[i] - c.out[i]));
    if (window < T)
        check_that(diff > 1e-3, "attention window %d of %d changes the output: max diff %.2e", window, T, diff);
    else
        check_that(diff == 0.0, "attention window %d >= T %d is plain causal attention: max diff %.2e", window, T, diff);
    free(plain), free(lse);
    attn_free(&c);
}

/* ---- per-head q/k RMSNorm (Qwen3) --------------------------------------------------------------- */

typedef struct {
    int N, Hq, Hkv, D;
    float eps;
    float *inp, *wq, *wk, *out, *rstd, *R;
} qkn_ctx;

static size_t qkn_numel(const qkn_ctx *c) { return (size_t)c->N * (c->Hq + 2 * c->Hkv) * c->D; }

static double qkn_loss(void *p) {
    qkn_ctx *c = p;
    cpu_qk_norm_forward(c->out, c->rstd, c->inp, c->wq, c->wk, c->N, c->Hq, c->Hkv, c->D, c->eps);
    return dot_d(c->out, c->R, qkn_numel(c));
}

/* Forward against RMSNorm of each head in double (q heads with wq, k heads with wk, v copied), the
 * gradients of the input and both weights against finite differences, and the in-place backward
 * (dinp == dout, as the model runs it) against the out-of-place one. */
static void test_qk_norm(void) {
    qkn_ctx c = {.N = 5, .Hq = 4, .Hkv = 2, .D = 6, .eps = 1e-6f};
    const size_t n = qkn_numel(&c), W = (size_t)(c.Hq + 2 * c.Hkv) * c.D, H = (size_t)(c.Hq + c.Hkv);
    c.inp = rand_f(n, 2.0f);
    c.wq = rand_f((size_t)c.D, 1.5f);
    c.wk = rand_f((size_t)c.D, 1.5f);
    c.out = alloc_f(n);
    c.rstd = alloc_f((size_t)c.N * H);
    c.R = rand_f(n, 1.0f);
    fill_nan(c.out, n);
    qkn_loss(&c);
    double *ref = malloc(n * sizeof(double));
    for (int r = 0; r < c.N; r++)
        for (size_t h = 0; h < (size_t)(c.Hq + 2 * c.Hkv); h++) {
            const float *x = c.inp + r * W + h * c.D;
            double ss = 0.0;
            for (int k = 0; k < c.D; k++) ss += (double)x[k] * x[k];
            double rs = h < H ? 1.0 / sqrt(ss / c.D + c.eps) : 1.0;
            const float *w = h < (size_t)c.Hq ? c.wq : c.wk;
            for (int k = 0; k < c.D; k++) ref[r * W + h * c.D + k] = h < H ? x[k] * rs * w[k] : x[k];
        }
    compare("qk_norm forward (per head; v copied)", c.out, ref, n, 1e-6, 1e-5);
    float *dinp = alloc_f(n), *pwq = rand_f((size_t)c.D, 1.0f), *pwk = rand_f((size_t)c.D, 1.0f);
    float *dwq = copy_f(pwq, (size_t)c.D), *dwk = copy_f(pwk, (size_t)c.D);
    fill_nan(dinp, n); /* every element is written */
    cpu_qk_norm_backward(dinp, dwq, dwk, c.R, c.inp, c.wq, c.wk, c.rstd, c.N, c.Hq, c.Hkv, c.D);
    sub_f(dwq, pwq, (size_t)c.D); /* the weights' gradients are ADDED */
    sub_f(dwk, pwk, (size_t)c.D);
    grad_param ps[3] = {{"inp", c.inp, n, dinp}, {"q_norm", c.wq, (size_t)c.D, dwq}, {"k_norm", c.wk, (size_t)c.D, dwk}};
    check_grads("qk_norm", qkn_loss, &c, ps, 3);
    qkn_loss(&c); /* rstd of the unperturbed input again (the checks left the last perturbation's) */
    float *inplace = copy_f(c.R, n), *dwq2 = calloc((size_t)c.D, sizeof(float)), *dwk2 = calloc((size_t)c.D, sizeof(float));
    cpu_qk_norm_backward(inplace, dwq2, dwk2, inplace, c.inp, c.wq, c.wk, c.rstd, c.N, c.Hq, c.Hkv, c.D);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)inplace[i] - dinp[i]));
    for (int k = 0; k < c.D; k++) worst = fmax(worst, fabs((double)dwq2[k] - dwq[k]) + fabs((double)dwk2[k] - dwk[k]));
    check_that(worst <= 1e-6, "qk_norm backward in place (dinp == dout) equals out of place: max diff %.2e", worst);
    free(c.inp), free(c.wq), free(c.wk), free(c.out), free(c.rstd), free(c.R), free(ref);
    free(dinp), free(pwq), free(pwk), free(dwq), free(dwk), free(inplace), free(dwq2), free(dwk2);
}

/* ---- swiglu ------------------------------------------------------------------------------------- */

typedef struct {
    int N, F;
    float *gu, *out, *R;
} swiglu_ctx;

static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    cpu_swiglu_forward(c->out, c->gu, c->N, c->F);
    return dot_d(c->out, c->R, (size_t)c->N * c->F);
}

static void test_swiglu(void) {
    swiglu_ctx c = {.N = 6, .F = 9};
    size_t ng = (size_t)c.N * 2 * c.F, no = (size_t)c.N * c.F;
    c.gu = rand_f(ng, 3.0f);
    c.out = alloc_f(no);
    c.R = rand_f(no, 1.0f);
    swiglu_loss(&c);
    double *ref = malloc(no * sizeof(double));
    for (int n = 0; n < c.N; n++)
        for (int f = 0; f < c.F; f++) {
            double g = c.gu[n * 2 * c.F + f], u = c.gu[n * 2 * c.F + c.F + f];
            ref[n * c.F + f] = g / (1.0 + exp(-g)) * u;
        }
    compare("swiglu", c.out, ref, no, 1e-6, 1e-5);
    float *d = alloc_f(ng);
    fill_nan(d, ng);
    cpu_swiglu_backward(d, c.R, c.gu, c.N, c.F);
    grad_param p = {"gateup", c.gu, ng, d};
    check_grads("swiglu", swiglu_loss, &c, &p, 1);
    free(c.gu), free(c.out), free(c.R), free(ref), free(d);
}

/* ---- cross entropy ------------------------------------------------------------------------------ */

typedef struct {
    int n, V;
    float grad_scale;
    const int32_t *tgt;
    float *logits, *work, *losses;
} ce_ctx;

static double ce_loss(void *p) { /* grad_scale * sum(losses): what the op's gradient differentiates */
    ce_ctx *c = p;
    memcpy(c->work, c->logits, (size_t)c->n * c->V * sizeof(float));
    cpu_cross_entropy(c->losses, c->work, c->tgt, c->n, c->V, c->grad_scale);
    double s = 0.0;
    for (int r = 0; r < c->n; r++) s += c->losses[r];
    return c->grad_scale * s;
}

static void test_cross_entropy(void) {
    static const int32_t targets[6] = {3, 0, -1, 10, 7, 3}; /* row 2 ignored; first and last class */
    ce_ctx c = {.n = 6, .V = 11, .grad_scale = 0.37f, .tgt = targets};
    size_t nl = (size_t)c.n * c.V;
    c.logits = rand_f(nl, 3.0f);
    c.logits[4 * c.V + 2] = 40.0f; /* a large logit: needs the max subtracted */
    c.work = alloc_f(nl);
    c.losses = alloc_f((size_t)c.n);
    ce_loss(&c);
    double ref[6];
    for (int r = 0; r < c.n; r++) {
        const float *x = c.logits + r * c.V;
        double mx = x[0], s = 0.0;
        for (int v = 1; v < c.V; v++) mx = fmax(mx, x[v]);
        for (int v = 0; v < c.V; v++) s += exp(x[v] - mx);
        ref[r] = targets[r] < 0 ? 0.0 : mx + log(s) - x[targets[r]];
    }
    compare("cross_entropy losses", c.losses, ref, (size_t)c.n, 1e-6, 1e-6);
    int zero = c.losses[2] == 0.0f;
    for (int v = 0; v < c.V; v++) zero &= c.work[2 * c.V + v] == 0.0f;
    check_that(zero, "%-40s ignored row (target -1): loss 0, gradient row 0", "cross_entropy");
    float *g = copy_f(c.work, nl);
    grad_param p = {"logits", c.logits, nl, g};
    check_grads("cross_entropy (grad_scale 0.37)", ce_loss, &c, &p, 1);
    free(c.logits), free(c.work), free(c.losses), free(g);
}

/* ---- adamw -------------------------------------------------------------------------------------- */

/* One torch.optim.AdamW step in double on one element. */
static void adamw_ref(double *p, double *m, double *v, double grad, const fsdp_adamw_args *a, double gs) {
    double g = grad * gs, b1 = a->beta1, b2 = a->beta2;
    *p *= 1.0 - (double)a->lr * a->weight_decay;
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    double bc1 = 1.0 - pow(b1, a->step), bc2 = 1.0 - pow(b2, a->step);
    *p -= (a->lr / bc1) * *m / (sqrt(*v) / sqrt(bc2) + a->eps);
}

/* Several steps against the double formula run alongside. Without round_master the double state
 * evolves on its own (errors must stay ~fp32 rounding); with it, each step starts the reference
 * from the op's bf16 state and allows half a bf16 ulp more, and every stored value must be a bf16. */
static void test_adamw(float wd, float grad_scale, int round_master, int round_working) {
    enum { n = 257, steps = 5 };
    fsdp_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd};
    float *p = rand_f(n, 1.0f), *m = alloc_f(n), *v = alloc_f(n), *g = alloc_f(n), *work = alloc_f(n);
    double rp[n], rm[n], rv[n];
    if (round_master) cpu_round_bf16(p, n);
    for (int i = 0; i < n; i++) m[i] = v[i] = 0.0f, rp[i] = p[i], rm[i] = rv[i] = 0.0;
    double worst_p = 0.0, worst_mv = 0.0;
    int all_bf16 = 1, working_ok = 1;
    for (a.step = 1; a.step <= steps; a.step++) {
        for (int i = 0; i < n; i++) g[i] = rnd_sym(1.0f) * (i % 5 == 0 ? 1e-4f : 1.0f); /* some tiny grads */
        if (round_master)
            for (int i = 0; i < n; i++) rp[i] = p[i], rm[i] = m[i], rv[i] = v[i];
        cpu_adamw(p, g, m, v, n, &a, grad_scale, work, round_master, round_working);
        for (int i = 0; i < n; i++) {
            adamw_ref(&rp[i], &rm[i], &rv[i], g[i], &a, grad_scale);
            /* Slack for fp32 rounding: relative to the terms summed, since m (and p) may cancel to ~0. */
            double gs = (double)g[i] * grad_scale;
            double sp = 1e-7 + 1e-6 * (fabs(rp[i]) + a.lr), sm = 1e-6 * (fabs(rm[i]) + fabs(gs));
            double sv = 1e-6 * (fabs(rv[i]) + gs * gs);
            double ulp = round_master ? 0x1p-8 : 0.0; /* rounding to bf16 adds up to half a bf16 ulp */
            worst_p = fmax(worst_p, fabs(p[i] - rp[i]) / (ulp * fabs(rp[i]) + sp));
            worst_mv = fmax(worst_mv, fabs(m[i] - rm[i]) / (ulp * fabs(rm[i]) + sm));
            worst_mv = fmax(worst_mv, fabs(v[i] - rv[i]) / (ulp * fabs(rv[i]) + sv));
            if (round_master)
                all_bf16 &= p[i] == fsdp_round_bf16(p[i]) && m[i] == fsdp_round_bf16(m[i]) &&
                            v[i] == fsdp_round_bf16(v[i]);
            working_ok &= work[i] == (round_working ? fsdp_round_bf16(p[i]) : p[i]);
        }
    }
    char what[96];
    snprintf(what, sizeof what, "adamw wd %g gs %g%s%s", wd, grad_scale, round_master ? " round_master" : "",
             round_working ? " round_working" : "");
    check_that(worst_p <= 1.0 && worst_mv <= 1.0 && all_bf16 && working_ok,
               "%-40s %d steps vs double: param err/tol %.3f, m,v err/tol %.3f%s, working %s", what, steps, worst_p,
               worst_mv, round_master ? (all_bf16 ? ", all bf16" : ", NOT bf16") : "", working_ok ? "ok" : "WRONG");
    free(p), free(m), free(v), free(g), free(work);
}

/* ---- sums, bf16 rounding ------------------------------------------------------------------------ */

static void test_sums(void) {
    static const size_t sizes[] = {0, 1, 4095, 4096, 4097, 100003};
    double worst = 0.0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *x = rand_f(n, 1.0f);
        for (size_t i = 0; i < n; i++) x[i] += 0.25f; /* nonzero mean: cancellation would show */
        double s = 0.0, ss = 0.0;
        for (size_t i = 0; i < n; i++) s += x[i], ss += (double)x[i] * x[i];
        worst = fmax(worst, fabs(cpu_sum(x, n) - s) / fmax(fabs(s), 1e-300));
        worst = fmax(worst, fabs(cpu_sum_squares(x, n) - ss) / fmax(ss, 1e-300));
        free(x);
    }
    check_that(worst <= 1e-12, "%-40s vs naive double sums, n = 0 .. 100003: max rel err %.2e", "sum, sum_squares",
               worst);
}

static void test_round_bf16(void) {
    float known[][2] = {
        {1.0f, 1.0f},
        {1.0f + 0x1p-8f, 1.0f},                    /* tie: to even (down) */
        {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},      /* tie: to even (up) */
        {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f}, /* above the tie */
        {-2.5f, -2.5f},
        {3.4e38f, INFINITY},                        /* rounds past the largest bf16 */
    };
    int n = (int)(sizeof known / sizeof known[0]), ok = 1;
    float x[64];
    for (int i = 0; i < n; i++) x[i] = known[i][0];
    cpu_round_bf16(x, (size_t)n);
    for (int i = 0; i < n; i++) ok &= x[i] == known[i][1];
    float *r = rand_f(1000, 100.0f), *e = copy_f(r, 1000);
    cpu_round_bf16(r, 1000);
    for (int i = 0; i < 1000; i++) ok &= r[i] == fsdp_round_bf16(e[i]);
    x[0] = NAN;
    cpu_round_bf16(x, 1);
    ok &= isnan(x[0]);
    check_that(ok, "%-40s known ties/overflow/NaN and == fsdp_round_bf16 on 1000 values", "round_bf16");
    free(r), free(e);
}

/* ---- determinism across thread counts ----------------------------------------------------------- */

/* Runs op(ctx, result) with 1, 2 and 3 threads; the results (nbytes) must be bitwise identical. */
typedef void (*det_fn)(void *ctx, float *result);

static void check_threads(const char *what, det_fn op, void *ctx, size_t nfloats) {
    float *ref = alloc_f(nfloats), *got = alloc_f(nfloats);
    int saved = omp_get_max_threads(), same = 1;
    omp_set_num_threads(1);
    op(ctx, ref);
    for (int th = 2; th <= 3; th++) {
        omp_set_num_threads(th);
        op(ctx, got);
        same &= memcmp(ref, got, nfloats * sizeof(float)) == 0;
    }
    omp_set_num_threads(saved);
    check_that(same, "%-40s bitwise equal with 1, 2 and 3 threads", what);
    free(ref), free(got);
}

typedef struct {
    int N, C, OC, V, B, T, Hq, Hkv, D;
    float *inp, *w, *dout, *acc0;
    int32_t *tok;
    float *qkv, *aout, *lse, *probs, *adout;
} det_ctx;

/* Each op writes everything it produces into result; "+=" outputs start from acc0. */
static void det_matmul(void *p, float *r) {
    det_ctx *c = p;
    float *dinp = r, *dw = r + c->N * c->C, *db = dw + c->OC * c->C, *out = db + c->OC;
    memcpy(dw, c->acc0, (size_t)(c->OC * c->C + c->OC) * sizeof(float));
    cpu_matmul_backward(dinp, dw, db, c->dout, c->inp, c->w, c->N, c->C, c->OC);
    cpu_matmul_forward(out, c->inp, c->w, db, NULL, c->N, c->C, c->OC, 1);
}
static void det_embedding(void *p, float *r) {
    det_ctx *c = p;
    float *dwte = r, *dwpe = r + c->V * c->C;
    memcpy(r, c->acc0, (size_t)(c->V + c->N) * c->C * sizeof(float));
    cpu_embedding_backward(dwte, dwpe, c->inp, c->tok, -1, 0, c->N, c->N, c->C);
}
static void det_norms(void *p, float *r) {
    det_ctx *c = p;
    size_t n = (size_t)c->N * c->C;
    float *out = r, *dinp = r + n, *dw = dinp + n, *db = dw + c->C, *mean = db + c->C, *rstd = mean + c->N;
    memcpy(dinp, c->acc0, (n + 2 * (size_t)c->C) * sizeof(float));
    cpu_layernorm_forward(out, mean, rstd, c->inp, c->w, c->w + c->C, c->N, c->C, 1e-5f);
    cpu_layernorm_backward(dinp, dw, db, c->dout, c->inp, c->w, mean, rstd, c->N, c->C);
    cpu_rmsnorm_forward(out, rstd, c->inp, c->w, c->N, c->C, 1e-5f);
    cpu_rmsnorm_backward(dinp, dw, c->dout, c->inp, c->w, rstd, c->N, c->C);
}
static void det_attention(void *p, float *r) {
    det_ctx *c = p;
    size_t nq = (size_t)c->B * c->T * (c->Hq + 2 * c->Hkv) * c->D;
    size_t no = (size_t)c->B * c->T * c->Hq * c->D, nl = (size_t)c->B * c->Hq * c->T;
    float *dq1 = r, *dq2 = r + nq, *out = dq2 + nq, *lse = out + no, *probs = lse + nl;
    cpu_attention_forward(out, lse, probs, c->qkv, c->B, c->T, c->Hq, c->Hkv, c->D, NULL);
    cpu_attention_backward(dq1, c->adout, c->qkv, out, lse, probs, c->B, c->T, c->Hq, c->Hkv, c->D, NULL);
    cpu_attention_forward(out, lse, NULL, c->qkv, c->B, c->T, c->Hq, c->Hkv, c->D, NULL);
    cpu_attention_backward(dq2, c->adout, c->qkv, out, lse, NULL, c->B, c->T, c->Hq, c->Hkv, c->D, NULL);
}
static void det_sums(void *p, float *r) {
    det_ctx *c = p;
    size_t n = (size_t)c->N * c->C * 40; /* many 4096-element chunks */
    double s[2] = {cpu_sum(c->acc0, n), cpu_sum_squares(c->acc0, n)};
    memcpy(r, s, sizeof s);
}

static void test_determinism(void) {
    det_ctx c = {.N = 37, .C = 150, .OC = 19, .V = 5, .B = 2, .T = 13, .Hq = 4, .Hkv = 2, .D = 8};
    c.inp = rand_f((size_t)c.N * c.C, 1.0f);
    c.w = rand_f((size_t)c.OC * c.C, 1.0f);
    c.dout = rand_f((size_t)c.N * c.C, 1.0f); /* big enough for matmul (N x OC) and norms (N x C) */
    c.acc0 = rand_f((size_t)c.N * c.C * 40, 1.0f);
    c.tok = malloc((size_t)c.N * sizeof(int32_t));
    for (int i = 0; i < c.N; i++) c.tok[i] = (int32_t)(rnd() * c.V); /* 37 rows, 5 tokens: many repeats */
    size_t nq = (size_t)c.B * c.T * (c.Hq + 2 * c.Hkv) * c.D, no = (size_t)c.B * c.T * c.Hq * c.D;
    size_t nl = (size_t)c.B * c.Hq * c.T;
    c.qkv = rand_f(nq, 1.5f);
    c.adout = rand_f(no, 1.0f);
    check_threads("matmul forward+backward (relu, bias)", det_matmul, &c,
                  (size_t)c.N * c.C + (size_t)c.OC * c.C + c.OC + (size_t)c.N * c.OC);
    check_threads("embedding_backward (repeated tokens)", det_embedding, &c, (size_t)(c.V + c.N) * c.C);
    check_threads("layernorm, rmsnorm forward+backward", det_norms, &c,
                  2 * (size_t)c.N * c.C + 2 * (size_t)c.C + 2 * (size_t)c.N);
    check_threads("attention forward+backward (both paths)", det_attention, &c, 2 * nq + no + nl + nl * c.T);
    check_threads("sum, sum_squares (222000 elements)", det_sums, &c, 4);
    free(c.inp), free(c.w), free(c.dout), free(c.acc0), free(c.tok), free(c.qkv), free(c.adout);
}

int main(void) {
    test_checker_rejects_wrong_gradients();
    test_matmul("bias", 1, 0, 0, 0, 0);
    test_matmul("residual aliasing out", 0, 1, 1, 0, 0);
    test_matmul("bias+residual+relu", 1, 1, 0, 1, 0);
    test_matmul("bias, dinp NULL", 1, 0, 0, 0, 1);
    test_relu_backward();
    test_embedding(1);
    test_embedding(0);
    test_norm(0);
    test_norm(1);
    test_rope();
    test_attention(2, 5, 4, 2, 6); /* GQA */
    test_attention(1, 7, 3, 1, 5); /* MQA, odd head dim */
    test_attention(1, 4, 2, 2, 4); /* MHA */
    test_attention_window(2, 9, 4, 2, 6, 3); /* GQA, a window of 3 in 9 */
    test_attention_window(1, 6, 3, 1, 5, 1); /* each query sees itself only */
    test_attention_window(1, 5, 2, 2, 4, 5); /* a window as long as the sequence */
    test_qk_norm();
    test_swiglu();
    test_cross_entropy();
    test_adamw(0.0f, 1.0f, 0, 0);
    test_adamw(0.1f, 0.25f, 0, 1);
    test_adamw(0.1f, 0.25f, 1, 1);
    test_adamw(0.0f, 3.0f, 1, 0);
    test_sums();
    test_round_bf16();
    test_determinism();
    return check_summary("test_ops_grad");
}
