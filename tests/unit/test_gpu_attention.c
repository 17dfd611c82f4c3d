/* Checks the CUDA attention kernels (src/kernels/cuda/attention*.cu) against the CPU reference
 * (src/kernels/cpu/attention.c) on fresh random inputs of magnitude ~1:
 *  - flash forward (out, lse) and backward (dqkv) on the tensor-core path (bf16, D = 64 and 128)
 *    and on the exact path (fp32; odd head dims such as 40; an unaligned bf16 tensor), GQA group
 *    sizes 1, 2 and 4, T from 1 to 1024 (ragged tiles included), B = 1 and 2. The CPU backward is
 *    given the GPU's own out and lse, so that it checks the backward alone;
 *  - relative errors ||gpu - cpu|| / ||cpu|| below 2e-2 for bf16 tensors (1e-3 for lse) and 1e-4
 *    in fp32; outputs are poisoned with NaN before every run and NaN never passes;
 *  - the backward is bitwise deterministic over two runs;
 *  - the eager causal softmax forward and backward, out of place and in place, against a
 *    double-precision computation, with masked entries exactly 0;
 *  - dropout on the probabilities (src/kernels/dropout.h), on every path above: values against the
 *    CPU with the same descriptor, and the masks bit for bit through probes whose outputs are 0
 *    exactly where an element is dropped (V one-hot for the forward, dout one-hot for dV, K
 *    one-hot with out = 0 for dQ; T <= D), counting the elements whose zero-ness differs from the
 *    CPU's (must be 0); the eager softmax's dropped probabilities likewise.
 *  - sliding windows (Mistral): the same comparisons with the windowed CPU reference for windows
 *    of 1 to 257 keys (shorter and longer than the kernels' key blocks, and than T), with dropout
 *    too, and the eager softmax's window mask (entries outside exactly 0).
 * Prints one line per case; exits 1 on any failure, 77 when there is no GPU. `--quick` skips the
 * T = 1024 cases (for runs under compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "check.h"
#include "kernels/ops_cpu.h"
#include "kernels/ops_cuda.h"
#define CUDA_RIG_SEED 0x243f6a8885a308d3ull
#include "cuda_rig.h"

/* Device buffer of n elements of type t (plus `pad` bytes in front, to test unaligned tensors),
 * filled with NaN bytes. Returns the element pointer; *base gets what to free. */
static void *dev_alloc(size_t n, fsdp_dtype t, size_t pad, void **base) {
    char *p;
    CK(cudaMalloc((void **)&p, n * esz(t) + pad + 16));
    CK(cudaMemset(p, 0xff, n * esz(t) + pad + 16));
    *base = p;
    return p + pad;
}

static void sync_check(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "test_gpu_attention: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* ||x - ref|| / ||ref|| over the elements selected by (start, count, stride, len): for each of
 * `count` blocks at start + k * stride, `len` consecutive elements. NaN anywhere gives NaN. */
static double rel_err_sel(const float *x, const float *ref, size_t start, size_t count, size_t stride, size_t len) {
    double num = 0.0, den = 0.0;
    for (size_t k = 0; k < count; k++)
        for (size_t i = 0; i < len; i++) {
            size_t j = start + k * stride + i;
            if (isnan(x[j]) || isnan(ref[j])) return NAN;
            double d = (double)x[j] - ref[j];
            num += d * d;
            den += (double)ref[j] * ref[j];
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int pass(double err, double tol) { return !isnan(err) && err < tol; } /* NaN never passes */

/* ---- flash attention ------------------------------------------------------------------------- */

typedef struct {
    fsdp_dtype act;
    int D, B, T, Hq, Hkv;
    int misalign; /* offset every tensor by 8 bytes: the bf16 D=64/128 case must then take the exact path */
    double p;     /* attention dropout (0: none) */
    int window;   /* sliding window (0: none): query t sees keys t - window < j <= t */
} flash_case;

/* The dropout of a case (NULL for p = 0): a sample base and layer that are not 0, so that a kernel
 * that ignored them would draw other masks. */
static const fsdp_dropout *case_dropout(double p, fsdp_dropout *store) {
    if (p <= 0.0) return NULL;
    *store = fsdp_dropout_make(p, 0x5eed, 1000003, 5, FSDP_DROPOUT_ATTN_PROBS);
    return store;
}

static void run_flash(const flash_case *c) {
    const int D = c->D, B = c->B, T = c->T, Hq = c->Hq, Hkv = c->Hkv;
    const fsdp_dtype t = c->act;
    const size_t W = (size_t)(Hq + 2 * Hkv) * D, nqkv = (size_t)B * T * W, no = (size_t)B * T * Hq * D,
                 nl = (size_t)B * Hq * T;
    const size_t pad = c->misalign ? 8 : 0;
    const double tol = t == FSDP_BF16 ? 2e-2 : 1e-4, tol_lse = t == FSDP_BF16 ? 1e-3 : 1e-4;

    fsdp_dropout store;
    const fsdp_dropout *drop = case_dropout(c->p, &store);
    float *qkv = hrand(nqkv, 1.7320508f, t), *dout = hrand(no, 1.7320508f, t);
    float *out_ref = hmalloc(no), *lse_ref = hmalloc(nl);
    float *out = hmalloc(no), *lse = hmalloc(nl);
    float *dqkv_ref = hmalloc(nqkv), *dqkv = hmalloc(nqkv);
    float *dqkv2 = hmalloc(nqkv);

    void *b_qkv, *b_out, *b_lse, *b_dout, *b_dqkv, *b_scr;
    void *d_qkv = dev_alloc(nqkv, t, pad, &b_qkv), *d_out = dev_alloc(no, t, pad, &b_out);
    void *d_dout = dev_alloc(no, t, pad, &b_dout), *d_dqkv = dev_alloc(nqkv, t, pad, &b_dqkv);
    float *d_lse = dev_alloc(nl, FSDP_F32, 0, &b_lse);
    size_t scr_bytes = fsdp_cuda_flash_backward_scratch(B, T, Hq, Hkv, D);
    float *d_scr = dev_alloc(scr_bytes / 4 + 1, FSDP_F32, 0, &b_scr);
    upload(d_qkv, qkv, nqkv, t);
    upload(d_dout, dout, no, t);

    /* Forward. */
    cpu_attention_forward_window(out_ref, lse_ref, NULL, qkv, B, T, Hq, Hkv, D, c->window, drop);
    fsdp_cuda_flash_forward_window(d_out, d_lse, d_qkv, B, T, Hq, Hkv, D, c->window, drop, t, 0);
    sync_check("flash forward");
    download(out, d_out, no, t);
    download(lse, d_lse, nl, FSDP_F32);
    double e_out = rel_err(out, out_ref, no), e_lse = rel_err(lse, lse_ref, nl);

    /* Backward, against the CPU backward of the GPU's own out and lse. */
    cpu_attention_backward_window(dqkv_ref, dout, qkv, out, lse, NULL, B, T, Hq, Hkv, D, c->window, drop);
    fsdp_cuda_flash_backward_window(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, Hq, Hkv, D, c->window, drop, t, d_scr,
                                    0);
    sync_check("flash backward");
    download(dqkv, d_dqkv, nqkv, t);
    const size_t ntok = (size_t)B * T;
    double e_dq = rel_err_sel(dqkv, dqkv_ref, 0, ntok, W, (size_t)Hq * D);
    double e_dk = rel_err_sel(dqkv, dqkv_ref, (size_t)Hq * D, ntok, W, (size_t)Hkv * D);
    double e_dv = rel_err_sel(dqkv, dqkv_ref, (size_t)(Hq + Hkv) * D, ntok, W, (size_t)Hkv * D);

    /* Determinism: poison, run again, compare bits. */
    CK(cudaMemset(d_dqkv, 0xff, nqkv * esz(t)));
    CK(cudaMemset(d_scr, 0xff, scr_bytes));
    fsdp_cuda_flash_backward_window(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, Hq, Hkv, D, c->window, drop, t, d_scr,
                                    0);
    sync_check("flash backward (second run)");
    download(dqkv2, d_dqkv, nqkv, t);
    int det = memcmp(dqkv, dqkv2, nqkv * sizeof(float)) == 0;

    int ok = pass(e_out, tol) && pass(e_lse, tol_lse) && pass(e_dq, tol) && pass(e_dk, tol) && pass(e_dv, tol) && det;
    check_that(ok, "flash %s D=%d B=%d T=%d Hq=%d Hkv=%d%s p=%.2f window=%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e %s",
               fsdp_dtype_name(t), D, B, T, Hq, Hkv, c->misalign ? " unaligned" : "", c->p, c->window, e_out, e_lse,
               e_dq, e_dk, e_dv, det ? "deterministic" : "NOT DETERMINISTIC");

    /* The atomic-dQ backward: dQ against the CPU's within the same tolerance, dK and dV bit for bit
     * the deterministic backward's (the same sums in the same order). */
    void *b_ascr;
    const size_t ascr_bytes = fsdp_cuda_flash_backward_atomic_scratch(B, T, Hq, Hkv, D);
    float *d_ascr = dev_alloc(ascr_bytes / 4 + 1, FSDP_F32, 0, &b_ascr);
    CK(cudaMemset(d_dqkv, 0xff, nqkv * esz(t)));
    CK(cudaMemset(d_ascr, 0xff, ascr_bytes));
    fsdp_cuda_flash_backward_atomic(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, Hq, Hkv, D, c->window, drop, t, d_ascr, 0);
    sync_check("flash backward (atomic dQ)");
    download(dqkv2, d_dqkv, nqkv, t);
    const double a_dq = rel_err_sel(dqkv2, dqkv_ref, 0, ntok, W, (size_t)Hq * D);
    int kv_same = 1;
    for (size_t tok = 0; tok < ntok; tok++)
        kv_same &= memcmp(dqkv + tok * W + (size_t)Hq * D, dqkv2 + tok * W + (size_t)Hq * D,
                          (size_t)2 * Hkv * D * sizeof(float)) == 0;
    check_that(pass(a_dq, tol) && kv_same, "flash %s D=%d B=%d T=%d Hq=%d Hkv=%d%s p=%.2f window=%d, atomic dQ: dq %.2e, "
               "dk and dv %s", fsdp_dtype_name(t), D, B, T, Hq, Hkv, c->misalign ? " unaligned" : "", c->p, c->window,
               a_dq, kv_same ? "bitwise the deterministic backward's" : "DIFFER from the deterministic backward's");
    CK(cudaFree(b_ascr));

    CK(cudaFree(b_qkv));
    CK(cudaFree(b_out));
    CK(cudaFree(b_lse));
    CK(cudaFree(b_dout));
    CK(cudaFree(b_dqkv));
    CK(cudaFree(b_scr));
    free(qkv), free(dout), free(out_ref), free(lse_ref), free(out), free(lse), free(dqkv_ref), free(dqkv), free(dqkv2);
}

/* ---- eager softmax ------------------------------------------------------------------------------ */

/* The log-sum-exp of a causal row of scores (columns j0..row_t), scaled, in double. */
static double window_row_lse(const float *s, int j0, int row_t, float scale) {
    double m = -INFINITY, sum = 0.0;
    for (int j = j0; j <= row_t; j++) m = fmax(m, (double)scale * s[j]);
    for (int j = j0; j <= row_t; j++) sum += exp((double)scale * s[j] - m);
    return m + log(sum);
}
static double causal_row_lse(const float *s, int row_t, float scale) { return window_row_lse(s, 0, row_t, scale); }

/* The eager softmax within a sliding window: columns row_t - window < j <= row_t visible, every
 * other one exactly 0; the backward of the stored probabilities (0 outside) gives dscores 0 there. */
static void run_softmax_window(fsdp_dtype t, int BH, int T, int window) {
    const size_t n = (size_t)BH * T * T, rows = (size_t)BH * T;
    const float scale = 0.125f;
    const double tol = t == FSDP_BF16 ? 2e-2 : 1e-4;
    float *sc = hrand(n, 4.0f, t), *p_ref = hmalloc(n), *lse_ref = hmalloc(rows), *got = hmalloc(n), *lse = hmalloc(rows);
    for (size_t r = 0; r < rows; r++) {
        const int row_t = (int)(r % T), j0 = row_t - window + 1 > 0 ? row_t - window + 1 : 0;
        const double l = window_row_lse(sc + r * T, j0, row_t, scale);
        lse_ref[r] = (float)l;
        for (int j = 0; j < T; j++)
            p_ref[r * T + j] = j >= j0 && j <= row_t ? (float)exp((double)scale * sc[r * T + j] - l) : 0.0f;
    }
    void *b_a, *b_l;
    void *d_a = dev_alloc(n, t, 0, &b_a);
    float *d_lse = dev_alloc(rows, FSDP_F32, 0, &b_l);
    upload(d_a, sc, n, t);
    fsdp_cuda_causal_softmax_forward_window(d_a, d_lse, d_a, BH, T, window, scale, t, 0);
    sync_check("causal softmax forward (window)");
    download(got, d_a, n, t);
    download(lse, d_lse, rows, FSDP_F32);
    int zeros = 1;
    for (size_t i = 0; i < n; i++) zeros &= p_ref[i] != 0.0f || got[i] == 0.0f;
    const double e_p = rel_err(got, p_ref, n), e_l = rel_err(lse, lse_ref, rows);
    check_that(pass(e_p, tol) && pass(e_l, t == FSDP_BF16 ? 1e-3 : 1e-4) && zeros,
               "causal softmax %s BH=%d T=%d window=%d: probs %.2e lse %.2e%s", fsdp_dtype_name(t), BH, T, window, e_p,
               e_l, zeros ? "" : " (entries outside the window not 0)");
    CK(cudaFree(b_a));
    CK(cudaFree(b_l));
    free(sc), free(p_ref), free(lse_ref), free(got), free(lse);
}

static void run_softmax(fsdp_dtype t, int BH, int T) {
    const size_t n = (size_t)BH * T * T, rows = (size_t)BH * T;
    const float scale = 0.125f;
    const double tol = t == FSDP_BF16 ? 2e-2 : 1e-4;
    float *sc = hrand(n, 4.0f, t), *dp = hrand(n, 1.0f, t);
    float *p_ref = hmalloc(n), *lse_ref = hmalloc(rows);
    float *ds_ref = hmalloc(n), *p_in = hmalloc(n);
    float *got = hmalloc(n), *lse = hmalloc(rows);

    for (size_t r = 0; r < rows; r++) {
        const int row_t = (int)(r % T);
        const float *s = sc + r * T;
        const double l = causal_row_lse(s, row_t, scale);
        lse_ref[r] = (float)l;
        for (int j = 0; j < T; j++) p_ref[r * T + j] = j <= row_t ? (float)exp((double)scale * s[j] - l) : 0.0f;
    }
    /* The backward's probs input is what a forward of this dtype would have stored. */
    for (size_t i = 0; i < n; i++) p_in[i] = t == FSDP_BF16 ? fsdp_round_bf16(p_ref[i]) : p_ref[i];
    for (size_t r = 0; r < rows; r++) {
        const int row_t = (int)(r % T);
        double dot = 0.0;
        for (int j = 0; j <= row_t; j++) dot += (double)dp[r * T + j] * p_in[r * T + j];
        for (int j = 0; j < T; j++)
            ds_ref[r * T + j] = j <= row_t ? (float)(scale * (double)p_in[r * T + j] * (dp[r * T + j] - dot)) : 0.0f;
    }

    void *b_a, *b_b, *b_c, *b_l;
    void *d_a = dev_alloc(n, t, 0, &b_a), *d_b = dev_alloc(n, t, 0, &b_b), *d_c = dev_alloc(n, t, 0, &b_c);
    float *d_lse = dev_alloc(rows, FSDP_F32, 0, &b_l);
    for (int inplace = 0; inplace < 2; inplace++) {
        /* Forward: scores in d_a, probs in d_b (or in d_a). */
        CK(cudaMemset(d_b, 0xff, n * esz(t)));
        CK(cudaMemset(d_lse, 0xff, rows * sizeof(float)));
        upload(d_a, sc, n, t);
        void *probs = inplace ? d_a : d_b;
        fsdp_cuda_causal_softmax_forward(probs, d_lse, d_a, BH, T, scale, t, 0);
        sync_check("causal softmax forward");
        download(got, probs, n, t);
        download(lse, d_lse, rows, FSDP_F32);
        int zeros = 1;
        for (size_t r = 0; r < rows; r++)
            for (int j = (int)(r % T) + 1; j < T; j++) zeros &= got[r * T + j] == 0.0f;
        double e_p = rel_err(got, p_ref, n), e_l = rel_err(lse, lse_ref, rows);

        /* Backward: dprobs in d_a, probs in d_c, dscores in d_b (or in d_a). */
        CK(cudaMemset(d_b, 0xff, n * esz(t)));
        upload(d_a, dp, n, t);
        upload(d_c, p_in, n, t);
        void *dscores = inplace ? d_a : d_b;
        fsdp_cuda_causal_softmax_backward(dscores, d_a, d_c, BH, T, scale, t, 0);
        sync_check("causal softmax backward");
        download(got, dscores, n, t);
        for (size_t r = 0; r < rows; r++)
            for (int j = (int)(r % T) + 1; j < T; j++) zeros &= got[r * T + j] == 0.0f;
        double e_ds = rel_err(got, ds_ref, n);

        int ok = pass(e_p, tol) && pass(e_l, t == FSDP_BF16 ? 1e-3 : 1e-4) && pass(e_ds, tol) && zeros;
        check_that(ok, "causal softmax %s BH=%d T=%d%s: probs %.2e lse %.2e dscores %.2e%s", fsdp_dtype_name(t), BH, T,
                   inplace ? " in place" : "", e_p, e_l, e_ds, zeros ? "" : " (masked entries not 0)");
    }
    CK(cudaFree(b_a));
    CK(cudaFree(b_b));
    CK(cudaFree(b_c));
    CK(cudaFree(b_l));
    free(sc), free(dp), free(p_ref), free(lse_ref), free(ds_ref), free(p_in), free(got), free(lse);
}

/* ---- dropout mask probes -------------------------------------------------------------------------- */

/* Elements whose zero-ness differs between x and ref among count blocks of len at start + k *
 * stride; *zeros gets ref's zeros there. */
static size_t zero_mismatch(const float *x, const float *ref, size_t start, size_t count, size_t stride, size_t len,
                            size_t *zeros) {
    size_t diff = 0;
    *zeros = 0;
    for (size_t k = 0; k < count; k++)
        for (size_t i = 0; i < len; i++) {
            const size_t j = start + k * stride + i;
            *zeros += ref[j] == 0.0f;
            diff += (x[j] == 0.0f) != (ref[j] == 0.0f) || isnan(x[j]);
        }
    return diff;
}

/* Three probes of one case (T <= D), each run on the CPU and the GPU with the same dropout:
 *  - forward with V one-hot (v_j = e_j): out[t, h, j] = keep' P[h, t, j];
 *  - backward with dout one-hot (dout[t, h] = e_t): dV[j, g, t] = sum over g's heads of keep' P;
 *  - backward with K one-hot and out = 0 (so delta = 0): dQ[t, h, j] = scale keep' P dP.
 * Each output is 0 exactly where (all) the elements it reads are dropped, so the masks of the
 * forward, dK/dV and dQ kernels are compared element by element with the CPU's. */
static void run_flash_probe(const flash_case *c) {
    const int D = c->D, B = c->B, T = c->T, Hq = c->Hq, Hkv = c->Hkv;
    const fsdp_dtype t = c->act;
    const size_t W = (size_t)(Hq + 2 * Hkv) * D, nqkv = (size_t)B * T * W, no = (size_t)B * T * Hq * D;
    const size_t nl = (size_t)B * Hq * T, ntok = (size_t)B * T, pad = c->misalign ? 8 : 0;
    if (!check_quiet(T <= D, "probe case T=%d > D=%d (test error)", T, D)) return;
    fsdp_dropout store;
    const fsdp_dropout *drop = case_dropout(c->p, &store);
    float *qkv = hrand(nqkv, 1.7320508f, t), *dout = hrand(no, 1.7320508f, t);
    float *zeros_o = hmalloc(no), *ref = hmalloc(nqkv);
    float *got = hmalloc(nqkv), *lse = hmalloc(nl);
    float *out = hmalloc(no);
    memset(zeros_o, 0, no * sizeof(float));
    void *b_qkv, *b_out, *b_lse, *b_dout, *b_dqkv, *b_scr, *b_zero;
    void *d_qkv = dev_alloc(nqkv, t, pad, &b_qkv), *d_out = dev_alloc(no, t, pad, &b_out);
    void *d_dout = dev_alloc(no, t, pad, &b_dout), *d_dqkv = dev_alloc(nqkv, t, pad, &b_dqkv);
    void *d_zero = dev_alloc(no, t, pad, &b_zero);
    float *d_lse = dev_alloc(nl, FSDP_F32, 0, &b_lse);
    float *d_scr = dev_alloc(fsdp_cuda_flash_backward_scratch(B, T, Hq, Hkv, D) / 4 + 1, FSDP_F32, 0, &b_scr);
    upload(d_zero, zeros_o, no, t);
    size_t zf, zk, zq;

    /* Forward, V one-hot. */
    for (size_t tok = 0; tok < ntok; tok++)
        for (int g = 0; g < Hkv; g++)
            for (int d = 0; d < D; d++)
                qkv[tok * W + (size_t)(Hq + Hkv + g) * D + d] = d == (int)(tok % T) ? 1.0f : 0.0f;
    upload(d_qkv, qkv, nqkv, t);
    cpu_attention_forward(ref, lse, NULL, qkv, B, T, Hq, Hkv, D, drop);
    fsdp_cuda_flash_forward(d_out, d_lse, d_qkv, B, T, Hq, Hkv, D, drop, t, 0);
    sync_check("probe forward");
    download(got, d_out, no, t);
    const size_t mf = zero_mismatch(got, ref, 0, 1, 0, no, &zf);

    /* dV with dout one-hot, against the GPU's own out and lse. */
    download(out, d_out, no, t);
    download(lse, d_lse, nl, FSDP_F32);
    float *onehot = hmalloc(no);
    for (size_t tok = 0; tok < ntok; tok++)
        for (int h = 0; h < Hq; h++)
            for (int d = 0; d < D; d++) onehot[(tok * Hq + h) * D + d] = d == (int)(tok % T) ? 1.0f : 0.0f;
    upload(d_dout, onehot, no, t);
    cpu_attention_backward(ref, onehot, qkv, out, lse, NULL, B, T, Hq, Hkv, D, drop);
    fsdp_cuda_flash_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, Hq, Hkv, D, drop, t, d_scr, 0);
    sync_check("probe backward (dV)");
    download(got, d_dqkv, nqkv, t);
    const size_t mk = zero_mismatch(got, ref, (size_t)(Hq + Hkv) * D, ntok, W, (size_t)Hkv * D, &zk);

    /* dQ with K one-hot and out = 0; V random again, lse from the GPU forward of these inputs. */
    float *vrand = hrand(nqkv, 1.7320508f, t);
    for (size_t tok = 0; tok < ntok; tok++)
        for (int g = 0; g < Hkv; g++)
            for (int d = 0; d < D; d++) {
                qkv[tok * W + (size_t)(Hq + g) * D + d] = d == (int)(tok % T) ? 1.0f : 0.0f;
                qkv[tok * W + (size_t)(Hq + Hkv + g) * D + d] = vrand[tok * W + (size_t)(Hq + Hkv + g) * D + d];
            }
    upload(d_qkv, qkv, nqkv, t);
    upload(d_dout, dout, no, t);
    fsdp_cuda_flash_forward(d_out, d_lse, d_qkv, B, T, Hq, Hkv, D, drop, t, 0);
    sync_check("probe forward (K one-hot)");
    download(lse, d_lse, nl, FSDP_F32);
    cpu_attention_backward(ref, dout, qkv, zeros_o, lse, NULL, B, T, Hq, Hkv, D, drop);
    fsdp_cuda_flash_backward(d_dqkv, d_dout, d_qkv, d_zero, d_lse, B, T, Hq, Hkv, D, drop, t, d_scr, 0);
    sync_check("probe backward (dQ)");
    download(got, d_dqkv, nqkv, t);
    const size_t mq = zero_mismatch(got, ref, 0, ntok, W, (size_t)Hq * D, &zq);

    const int ok = mf == 0 && mk == 0 && mq == 0 && zf > 0 && zk > 0 && zq > 0;
    check_that(ok,
               "flash mask probe %s D=%d B=%d T=%d Hq=%d Hkv=%d%s p=%.2f: mismatched zeros fwd %zu (of %zu zeros) "
               "dV %zu (of %zu) dQ %zu (of %zu)",
               fsdp_dtype_name(t), D, B, T, Hq, Hkv, c->misalign ? " unaligned" : "", c->p, mf, zf, mk, zk, mq, zq);
    void *bufs[] = {b_qkv, b_out, b_lse, b_dout, b_dqkv, b_scr, b_zero};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK(cudaFree(bufs[i]));
    free(qkv), free(dout), free(zeros_o), free(ref), free(got), free(lse), free(out), free(onehot), free(vrand);
}

/* The eager softmax with dropout on [B * Hq, T, T] against double precision with the CPU's mask:
 * probs undropped, dropped = keep' P (its zeros exactly the mask), lse; the backward in place on
 * dprobs, and its dropped probabilities again. */
static void run_softmax_dropout(fsdp_dtype t, int B, int Hq, int T, double p) {
    if (!check_quiet(T <= 1024, "causal softmax dropout T=%d > 1024 (test error)", T)) return;
    const size_t n = (size_t)B * Hq * T * T, rows = (size_t)B * Hq * T;
    const float scale = 0.125f;
    const double tol = t == FSDP_BF16 ? 2e-2 : 1e-4;
    const fsdp_dropout drop = fsdp_dropout_make(p, 99, 31337, 2, FSDP_DROPOUT_ATTN_PROBS);
    float *sc = hrand(n, 4.0f, t), *dp = hrand(n, 1.0f, t);
    float *p_ref = hmalloc(n), *pd_ref = hmalloc(n);
    float *lse_ref = hmalloc(rows), *ds_ref = hmalloc(n);
    float *p_in = hmalloc(n), *pdb_ref = hmalloc(n);
    float *got = hmalloc(n), *lse = hmalloc(rows);
    for (size_t r = 0; r < rows; r++) {
        const int row_t = (int)(r % T), bh = (int)(r / T), b = bh / Hq, h = bh % Hq;
        const float *s = sc + r * T;
        const double l = causal_row_lse(s, row_t, scale);
        lse_ref[r] = (float)l;
        for (int j = 0; j < T; j++) {
            const double pj = j <= row_t ? exp((double)scale * s[j] - l) : 0.0;
            const int keep = j <= row_t && fsdp_dropout_keep_probs(&drop, b, h, row_t, j, T);
            p_ref[r * T + j] = (float)pj;
            pd_ref[r * T + j] = keep ? (float)(pj * drop.scale) : 0.0f;
        }
    }
    for (size_t i = 0; i < n; i++) p_in[i] = t == FSDP_BF16 ? fsdp_round_bf16(p_ref[i]) : p_ref[i];
    for (size_t r = 0; r < rows; r++) {
        const int row_t = (int)(r % T), bh = (int)(r / T), b = bh / Hq, h = bh % Hq;
        double dot = 0.0;
        float k[1024]; /* keep' of the row (T <= 1024 here) */
        for (int j = 0; j < T; j++)
            k[j] = j <= row_t && fsdp_dropout_keep_probs(&drop, b, h, row_t, j, T) ? drop.scale : 0.0f;
        for (int j = 0; j <= row_t; j++) dot += (double)dp[r * T + j] * k[j] * p_in[r * T + j];
        for (int j = 0; j < T; j++) {
            const double pj = p_in[r * T + j];
            ds_ref[r * T + j] = j <= row_t ? (float)(scale * pj * (dp[r * T + j] * k[j] - dot)) : 0.0f;
            pdb_ref[r * T + j] = (float)((double)p_in[r * T + j] * k[j]);
        }
    }
    void *b_a, *b_b, *b_c, *b_l;
    void *d_a = dev_alloc(n, t, 0, &b_a), *d_b = dev_alloc(n, t, 0, &b_b), *d_c = dev_alloc(n, t, 0, &b_c);
    float *d_lse = dev_alloc(rows, FSDP_F32, 0, &b_l);
    /* Forward in place: scores and probs in d_a, dropped in d_b. */
    upload(d_a, sc, n, t);
    fsdp_cuda_causal_softmax_dropout_forward(d_a, d_b, d_lse, d_a, B, Hq, T, scale, &drop, t, 0);
    sync_check("causal softmax dropout forward");
    download(got, d_a, n, t);
    const double e_p = rel_err(got, p_ref, n);
    download(lse, d_lse, rows, FSDP_F32);
    const double e_l = rel_err(lse, lse_ref, rows);
    download(got, d_b, n, t);
    size_t zf;
    const double e_pd = rel_err(got, pd_ref, n);
    const size_t mf = zero_mismatch(got, pd_ref, 0, 1, 0, n, &zf);
    /* Backward: dprobs in d_a (dscores in place), probs in d_c, dropped in d_b. */
    CK(cudaMemset(d_b, 0xff, n * esz(t)));
    upload(d_a, dp, n, t);
    upload(d_c, p_in, n, t);
    fsdp_cuda_causal_softmax_dropout_backward(d_a, d_b, d_a, d_c, B, Hq, T, scale, &drop, t, 0);
    sync_check("causal softmax dropout backward");
    download(got, d_a, n, t);
    /* dscores is a difference of nearly equal terms where a row has one visible column (T = 1: it
     * is rounding noise around 0), so its error is measured against the size of the terms. */
    double ds_err2 = 0.0, ds_terms2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - ds_ref[i], term = (double)scale * p_in[i] * dp[i] * drop.scale;
        ds_err2 += d * d;
        ds_terms2 += term * term + (double)ds_ref[i] * ds_ref[i];
    }
    const double e_ds = isnan(ds_err2) ? NAN : sqrt(ds_err2 / (ds_terms2 > 0 ? ds_terms2 : 1.0));
    download(got, d_b, n, t);
    size_t zb;
    const double e_pdb = rel_err(got, pdb_ref, n);
    const size_t mb = zero_mismatch(got, pdb_ref, 0, 1, 0, n, &zb);
    const int ok = pass(e_p, tol) && pass(e_l, t == FSDP_BF16 ? 1e-3 : 1e-4) && pass(e_pd, tol) && pass(e_ds, tol) &&
                   pass(e_pdb, tol) && mf == 0 && mb == 0 && zf > 0;
    check_that(ok,
               "causal softmax dropout %s B=%d Hq=%d T=%d p=%.2f: probs %.2e lse %.2e dropped %.2e (zeros mismatched "
               "%zu of %zu) dscores %.2e dropped' %.2e (mismatched %zu)",
               fsdp_dtype_name(t), B, Hq, T, p, e_p, e_l, e_pd, mf, zf, e_ds, e_pdb, mb);
    CK(cudaFree(b_a));
    CK(cudaFree(b_b));
    CK(cudaFree(b_c));
    CK(cudaFree(b_l));
    free(sc), free(dp), free(p_ref), free(pd_ref), free(lse_ref), free(ds_ref), free(p_in), free(pdb_ref);
    free(got), free(lse);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("test_gpu_attention: SKIPPED (no GPU)\n");
        return 77;
    }
    CK(cudaSetDevice(0));

    /* Tensor-core path: every T against every group size, for both head dims. */
    const int Ts[] = {1, 37, 128, 200, 1024};
    for (int di = 0; di < 2; di++)
        for (int ti = 0; ti < 5; ti++)
            for (int gi = 0; gi < 3; gi++) {
                const int group = 1 << gi, Hkv = group == 4 ? 1 : 2, T = Ts[ti];
                if (quick && T > 200) continue;
                const int B = T >= 1024 ? 1 : 1 + (ti + gi) % 2;
                flash_case c = {FSDP_BF16, di == 0 ? 64 : 128, B, T, group * Hkv, Hkv, 0, 0.0, 0};
                run_flash(&c);
            }

    /* Exact path. */
    const flash_case exact[] = {
        {FSDP_F32, 64, 2, 37, 4, 2, 0, 0.0, 0},   {FSDP_F32, 64, 1, 200, 4, 1, 0, 0.0, 0},
        {FSDP_F32, 64, 1, 1, 2, 2, 0, 0.0, 0},    {FSDP_F32, 128, 1, 130, 4, 1, 0, 0.0, 0},
        {FSDP_F32, 40, 2, 37, 4, 2, 0, 0.0, 0},   {FSDP_F32, 40, 1, 128, 2, 2, 0, 0.0, 0},
        {FSDP_BF16, 40, 2, 37, 4, 1, 0, 0.0, 0},  {FSDP_BF16, 40, 1, 200, 4, 2, 0, 0.0, 0},
        {FSDP_BF16, 256, 1, 70, 2, 1, 0, 0.0, 0}, {FSDP_F32, 6, 2, 45, 3, 1, 0, 0.0, 0},
        {FSDP_BF16, 64, 2, 37, 4, 2, 1, 0.0, 0},  {FSDP_BF16, 128, 1, 100, 2, 1, 1, 0.0, 0},
    };
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) run_flash(&exact[i]);

    /* Eager softmax. */
    const int sT[] = {1, 37, 200};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) run_softmax(k ? FSDP_BF16 : FSDP_F32, 3, sT[i]);

    /* Dropout: tensor-core path (ragged and whole tiles, every group size), exact path (fp32, odd
     * and large head dims, an unaligned bf16 tensor), then the mask probes and the eager softmax. */
    const int dT[] = {37, 128, 200, 1024};
    for (int di = 0; di < 2; di++)
        for (int ti = 0; ti < 4; ti++)
            for (int gi = 0; gi < 3; gi++) {
                const int group = 1 << gi, Hkv = group == 4 ? 1 : 2, T = dT[ti];
                if (quick && T > 200) continue;
                const int B = T >= 1024 ? 1 : 1 + (ti + gi) % 2;
                flash_case c = {FSDP_BF16, di == 0 ? 64 : 128, B, T, group * Hkv, Hkv, 0, gi == 1 ? 0.5 : 0.1, 0};
                run_flash(&c);
            }
    const flash_case exact_drop[] = {
        {FSDP_F32, 64, 2, 37, 4, 2, 0, 0.1, 0},   {FSDP_F32, 128, 1, 130, 4, 1, 0, 0.3, 0},
        {FSDP_F32, 40, 2, 37, 4, 2, 0, 0.1, 0},   {FSDP_BF16, 40, 1, 200, 4, 2, 0, 0.1, 0},
        {FSDP_BF16, 256, 1, 70, 2, 1, 0, 0.2, 0}, {FSDP_BF16, 64, 2, 37, 4, 2, 1, 0.1, 0},
    };
    for (size_t i = 0; i < sizeof exact_drop / sizeof exact_drop[0]; i++) run_flash(&exact_drop[i]);
    const flash_case probes[] = {
        {FSDP_BF16, 64, 2, 64, 2, 2, 0, 0.3, 0},  {FSDP_BF16, 64, 1, 37, 4, 1, 0, 0.5, 0},
        {FSDP_BF16, 128, 2, 128, 2, 2, 0, 0.3, 0}, {FSDP_BF16, 128, 1, 100, 4, 2, 0, 0.1, 0},
        {FSDP_F32, 64, 2, 64, 4, 2, 0, 0.3, 0},   {FSDP_BF16, 40, 1, 37, 2, 2, 0, 0.3, 0},
        {FSDP_BF16, 64, 1, 50, 2, 2, 1, 0.3, 0},
    };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) run_flash_probe(&probes[i]);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) run_softmax_dropout(k ? FSDP_BF16 : FSDP_F32, 2, 3, sT[i], 0.2);

    /* Sliding windows (Mistral): windows shorter than a key block, across block and tile edges, and
     * longer than the sequence; every path (tensor cores at D = 64 and 128, the exact path in fp32,
     * odd head dims, an unaligned bf16 tensor), GQA, with and without dropout; the eager softmax. */
    const flash_case windows[] = {
        {FSDP_BF16, 64, 2, 200, 4, 2, 0, 0.0, 5},     {FSDP_BF16, 64, 1, 300, 8, 2, 0, 0.0, 64},
        {FSDP_BF16, 64, 1, 1024, 4, 1, 0, 0.0, 100},  {FSDP_BF16, 128, 2, 200, 4, 2, 0, 0.0, 33},
        {FSDP_BF16, 128, 1, 1024, 8, 2, 0, 0.0, 257}, {FSDP_BF16, 128, 1, 37, 2, 2, 0, 0.0, 100},
        {FSDP_BF16, 64, 2, 200, 4, 2, 0, 0.2, 17},    {FSDP_BF16, 128, 1, 130, 4, 1, 0, 0.1, 40},
        {FSDP_F32, 64, 2, 150, 4, 2, 0, 0.0, 7},      {FSDP_F32, 40, 1, 200, 4, 1, 0, 0.0, 50},
        {FSDP_BF16, 40, 2, 100, 2, 2, 0, 0.0, 1},     {FSDP_BF16, 64, 1, 150, 4, 2, 1, 0.0, 31},
        {FSDP_F32, 128, 1, 100, 2, 1, 0, 0.3, 9},
    };
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        if (quick && windows[i].T > 300) continue;
        run_flash(&windows[i]);
    }
    for (int k = 0; k < 2; k++) {
        run_softmax_window(k ? FSDP_BF16 : FSDP_F32, 3, 37, 5);
        run_softmax_window(k ? FSDP_BF16 : FSDP_F32, 2, 200, 64);
    }

    return check_summary("test_gpu_attention");
}
