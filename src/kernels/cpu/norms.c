/* RMSNorm (Llama) and LayerNorm (OPT): forward with saved row statistics, and backward.
 *
 * Input gradients are ADDED to dinp (it holds the residual-stream gradient); parameter gradients
 * are added too. Row work is parallel over rows; parameter gradients, which sum over rows, are
 * parallel over channel blocks with rows visited in order, so no sum depends on the thread count. */
#include <math.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

#define NORM_CBLOCK 64

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        double gx = 0.0; /* sum_c g*x with g = dout*weight */
        for (int c = 0; c < C; c++) gx += (double)d[c] * weight[c] * x[c];
        float r = rstd[n];
        float k = (float)(gx / C) * r * r * r;
        for (int c = 0; c < C; c++) dx[c] += r * d[c] * weight[c] - k * x[c];
    }
    int nblocks = (C + NORM_CBLOCK - 1) / NORM_CBLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * NORM_CBLOCK, c1 = c0 + NORM_CBLOCK < C ? c0 + NORM_CBLOCK : C;
        float acc[NORM_CBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) acc[c - c0] += d[c] * x[c] * rstd[n];
        }
        for (int c = c0; c < c1; c++) dweight[c] += acc[c - c0];
    }
}

/* bias may be NULL (a LayerNorm without bias). */
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += x[c];
        double mu = s / C;
        /* Two passes: the variance of (x - mean) has no cancellation problem. */
        double v = 0.0;
        for (int c = 0; c < C; c++) v += (x[c] - mu) * (x[c] - mu);
        float m = (float)mu, r = (float)(1.0 / sqrt(v / C + eps));
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * weight[c] + (bias ? bias[c] : 0.0f);
        mean[n] = m;
        rstd[n] = r;
    }
}

/* dbias may be NULL. */
void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], r = rstd[n];
        double sg = 0.0, sgx = 0.0; /* sums of g and g*xhat, g = dout*weight */
        for (int c = 0; c < C; c++) {
            float g = d[c] * weight[c];
            sg += g;
            sgx += (double)g * ((x[c] - m) * r);
        }
        float mg = (float)(sg / C), mgx = (float)(sgx / C);
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * r;
            dx[c] += r * (d[c] * weight[c] - mg - xhat * mgx);
        }
    }
    int nblocks = (C + NORM_CBLOCK - 1) / NORM_CBLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * NORM_CBLOCK, c1 = c0 + NORM_CBLOCK < C ? c0 + NORM_CBLOCK : C;
        float accw[NORM_CBLOCK] = {0}, accb[NORM_CBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) {
                accw[c - c0] += d[c] * ((x[c] - mean[n]) * rstd[n]);
                accb[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dweight[c] += accw[c - c0];
            if (dbias) dbias[c] += accb[c - c0];
        }
    }
}
