/* Softmax cross-entropy over the vocabulary, fused with its gradient: logits are overwritten with
 * grad_scale * (softmax - onehot(target)), the gradient of grad_scale * sum(losses).
 * Rows whose target is negative (ignored positions) get loss 0 and an all-zero gradient row.
 * Precondition: every target is < V. */
#include <math.h>
#include <string.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

void cpu_cross_entropy(float *losses, float *logits, const int32_t *targets, int n, int V, float grad_scale) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        float *x = logits + (size_t)r * V;
        int tgt = targets[r];
        if (tgt < 0) {
            losses[r] = 0.0f;
            memset(x, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = x[0];
        for (int v = 1; v < V; v++)
            if (x[v] > mx) mx = x[v];
        double sum = 0.0; /* every term is <= 1 after subtracting the max: no overflow */
        for (int v = 0; v < V; v++) sum += expf(x[v] - mx);
        double lse = mx + log(sum);
        losses[r] = (float)(lse - x[tgt]);
        float l = (float)lse;
        for (int v = 0; v < V; v++) x[v] = grad_scale * (expf(x[v] - l) - (v == tgt ? 1.0f : 0.0f));
    }
}
