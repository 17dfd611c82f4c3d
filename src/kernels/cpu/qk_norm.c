/* Per-head RMSNorm of the query and key heads (Qwen3's q_norm and k_norm): the reference of the
 * qk_norm ops (ops_cpu.h). A head's D elements are one row of the norm, with the same weights for
 * every head of q (and of k), as transformers' Qwen3RMSNorm(head_dim) applies it to q_proj's output
 * viewed [.., heads, head_dim]. Sums as the plain RMSNorm (norms.c): a row's sum of squares in
 * double, the weights' gradients per channel over rows in order (no sum depends on the thread
 * count). */
#include <math.h>
#include <string.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

void cpu_qk_norm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int N, int Hq,
                         int Hkv, int D, float eps) {
    const size_t W = (size_t)(Hq + 2 * Hkv) * D;
    const int H = Hq + Hkv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            const float *x = inp + (size_t)n * W + (size_t)h * D, *w = h < Hq ? wq : wk;
            float *o = out + (size_t)n * W + (size_t)h * D;
            double ss = 0.0;
            for (int d = 0; d < D; d++) ss += (double)x[d] * x[d];
            float r = (float)(1.0 / sqrt(ss / D + eps));
            for (int d = 0; d < D; d++) o[d] = x[d] * r * w[d];
            rstd[(size_t)n * H + h] = r;
        }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) /* the value heads pass unchanged */
        memcpy(out + (size_t)n * W + (size_t)H * D, inp + (size_t)n * W + (size_t)H * D,
               (size_t)Hkv * D * sizeof(float));
}

void cpu_qk_norm_backward(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp, const float *wq,
                          const float *wk, const float *rstd, int N, int Hq, int Hkv, int D) {
    const size_t W = (size_t)(Hq + 2 * Hkv) * D;
    const int H = Hq + Hkv;
    /* The weights' gradients first: dinp may alias dout, which the row pass then overwrites. */
#pragma omp parallel for schedule(static)
    for (int d = 0; d < 2 * D; d++) {
        const int k = d >= D, c = d - k * D, h0 = k ? Hq : 0, h1 = k ? H : Hq;
        float acc = 0.0f;
        for (int n = 0; n < N; n++)
            for (int h = h0; h < h1; h++) {
                size_t at = (size_t)n * W + (size_t)h * D + (size_t)c;
                acc += dout[at] * inp[at] * rstd[(size_t)n * H + h];
            }
        (k ? dwk : dwq)[c] += acc;
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            const size_t at = (size_t)n * W + (size_t)h * D;
            const float *x = inp + at, *dy = dout + at, *w = h < Hq ? wq : wk;
            float *dx = dinp + at;
            double gx = 0.0; /* sum_d dy * w * x */
            for (int d = 0; d < D; d++) gx += (double)dy[d] * w[d] * x[d];
            const float r = rstd[(size_t)n * H + h], k = (float)(gx / D) * r * r * r;
            for (int d = 0; d < D; d++) dx[d] = r * dy[d] * w[d] - k * x[d];
        }
    if (dinp != dout)
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            memcpy(dinp + (size_t)n * W + (size_t)H * D, dout + (size_t)n * W + (size_t)H * D,
                   (size_t)Hkv * D * sizeof(float));
}
