/* Pointwise activations: SwiGLU (Llama MLP) forward/backward and the ReLU backward (OPT MLP; the
 * ReLU forward is fused into cpu_matmul_forward). */
#include <math.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* gateup rows are [gate (F) | up (F)]. */
void cpu_swiglu_forward(float *out, const float *gateup, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gateup + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
        for (int f = 0; f < F; f++) o[f] = g[f] * sigmoidf(g[f]) * u[f];
    }
}

/* d silu(g)/dg = s + g s (1 - s) with s = sigmoid(g). dgateup is overwritten. */
void cpu_swiglu_backward(float *dgateup, const float *dout, const float *gateup, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gateup + (size_t)n * 2 * F, *u = g + F;
        const float *d = dout + (size_t)n * F;
        float *dg = dgateup + (size_t)n * 2 * F, *du = dg + F;
        for (int f = 0; f < F; f++) {
            float s = sigmoidf(g[f]);
            dg[f] = d[f] * u[f] * (s + g[f] * s * (1.0f - s));
            du[f] = d[f] * g[f] * s;
        }
    }
}

/* A select rather than a multiply by the mask (as torch's threshold_backward), so an inf or NaN
 * gradient behind a dead unit does not leak through as NaN. */
void cpu_relu_backward(float *d, const float *out, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        if (!(out[i] > 0.0f)) d[i] = 0.0f;
}
