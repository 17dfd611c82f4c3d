/* Linear layers, PyTorch convention: weight is [OC, C], out = inp W^T (+ bias) (+ residual), then
 * an optional ReLU (whose backward, cpu_relu_backward, lives in activations.c); and the backward.
 *
 * Loops are blocked so that a small block of rows of one operand is reused from L1 while the other
 * streams; the blocking never changes the order of any sum (every sum runs over its index in
 * ascending order), so results do not depend on block sizes or thread counts. */
#include <string.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

#define MM_ROWS 8   /* rows of inp per task in the forward and dinp */
#define MM_OCS 8    /* output channels per task in dweight */

/* residual may alias out: each element is read before it is written, by the same iteration. */
void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, const float *residual,
                        int N, int C, int OC, int relu) {
    int nblocks = (N + MM_ROWS - 1) / MM_ROWS;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int n0 = blk * MM_ROWS, n1 = n0 + MM_ROWS < N ? n0 + MM_ROWS : N;
        for (int oc = 0; oc < OC; oc++) {
            const float *w = weight + (size_t)oc * C;
            for (int n = n0; n < n1; n++) {
                size_t i = (size_t)n * OC + oc;
                float y = cpu_dot(inp + (size_t)n * C, w, C);
                if (bias) y += bias[oc];
                if (residual) y += residual[i];
                out[i] = (relu && y < 0.0f) ? 0.0f : y; /* NaN passes, as in torch.relu */
            }
        }
    }
}

void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC) {
    if (dinp) { /* dinp[n,:] = sum_oc dout[n,oc] W[oc,:]; overwritten */
        int nblocks = (N + MM_ROWS - 1) / MM_ROWS;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int n0 = blk * MM_ROWS, n1 = n0 + MM_ROWS < N ? n0 + MM_ROWS : N;
            memset(dinp + (size_t)n0 * C, 0, (size_t)(n1 - n0) * C * sizeof(float));
            for (int oc = 0; oc < OC; oc++)
                for (int n = n0; n < n1; n++)
                    cpu_axpy(dinp + (size_t)n * C, dout[(size_t)n * OC + oc], weight + (size_t)oc * C, C);
        }
    }
    /* dweight[oc,:] += sum_n dout[n,oc] inp[n,:]. The new contribution is summed in scratch first
     * and then added once, as PyTorch adds a fresh .grad into an accumulated one. */
    int nblocks = (OC + MM_OCS - 1) / MM_OCS;
#pragma omp parallel
    {
        float *acc = cpu_scratch((size_t)MM_OCS * C * sizeof(float));
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int o0 = blk * MM_OCS, o1 = o0 + MM_OCS < OC ? o0 + MM_OCS : OC;
            memset(acc, 0, (size_t)MM_OCS * C * sizeof(float));
            for (int n = 0; n < N; n++)
                for (int oc = o0; oc < o1; oc++)
                    cpu_axpy(acc + (size_t)(oc - o0) * C, dout[(size_t)n * OC + oc], inp + (size_t)n * C, C);
            for (int oc = o0; oc < o1; oc++) {
                float *dw = dweight + (size_t)oc * C;
                const float *a = acc + (size_t)(oc - o0) * C;
                for (int c = 0; c < C; c++) dw[c] += a[c];
                if (dbias) {
                    float s = 0.0f;
                    for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + oc];
                    dbias[oc] += s;
                }
            }
        }
        free(acc);
    }
}
