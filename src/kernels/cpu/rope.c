/* Rotary position embedding, Hugging Face rotate_half convention, applied in place to the q and k
 * heads of a packed qkv tensor [B, T, (Hq + 2*Hkv) * D] (v heads are left alone).
 *
 * cos_sin holds, for each position t in [0, T) and pair i in [0, D/2), the interleaved pair
 * (cos, sin) at index (t * D/2 + i) * 2; the caller has already offset it to the first position.
 * Element i is rotated with element i + D/2. The backward is the transposed rotation. */
#include "../ops_cpu.h"
#include "cpu_common.h"

/* sign = +1 rotates by +theta (forward), -1 by -theta (backward, the transpose). q and k heads
 * are contiguous at the start of each token's row, so they are rotated as Hq + Hkv heads. */
static void rope_rotate(float *qkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D, float sign) {
    int half = D / 2;
    size_t W = (size_t)(Hq + 2 * Hkv) * D;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *cs = cos_sin + (size_t)(bt % T) * half * 2;
        float *row = qkv + (size_t)bt * W;
        for (int h = 0; h < Hq + Hkv; h++) {
            float *x = row + (size_t)h * D;
            for (int i = 0; i < half; i++) {
                float c = cs[2 * i], s = sign * cs[2 * i + 1];
                float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c - x2 * s;
                x[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void cpu_rope_forward(float *qkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D) {
    rope_rotate(qkv, cos_sin, B, T, Hq, Hkv, D, 1.0f);
}

void cpu_rope_backward(float *dqkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D) {
    rope_rotate(dqkv, cos_sin, B, T, Hq, Hkv, D, -1.0f);
}
