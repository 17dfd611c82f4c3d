/* The AdamW update, step for step as torch.optim.AdamW (non-fused, non-amsgrad, maximize=False):
 * decoupled weight decay first, then the moment updates and the bias-corrected step.
 * The scalar factors are computed in double, as PyTorch computes them in Python floats. */
#include <math.h>

#include "../../base/dtype.h"
#include "../ops_cpu.h"
#include "cpu_common.h"

void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, const fsdp_adamw_args *a,
               float grad_scale, float *working, int round_master, int round_working) {
    double bc1 = 1.0 - pow(a->beta1, a->step), bc2 = 1.0 - pow(a->beta2, a->step);
    float decay = (float)(1.0 - (double)a->lr * a->weight_decay);
    float step_size = (float)(a->lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float b1 = a->beta1, b2 = a->beta2, ob1 = (float)(1.0 - a->beta1), ob2 = (float)(1.0 - a->beta2);
    float eps = a->eps;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float p = param[i] * decay;
        float mi = b1 * m[i] + ob1 * g;
        float vi = b2 * v[i] + ob2 * g * g;
        p -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
        if (round_master) {
            p = fsdp_round_bf16(p);
            mi = fsdp_round_bf16(mi);
            vi = fsdp_round_bf16(vi);
        }
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (working) working[i] = round_working ? fsdp_round_bf16(p) : p;
    }
}
