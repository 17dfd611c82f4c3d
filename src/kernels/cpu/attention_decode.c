/* Attention over a KV cache, for generation: the reference of kv_cache_append and attention_decode.
 *
 * The cache of one layer is two tensors [Hkv, cap, D] (kv head, position, head dim): a head's keys
 * are contiguous, so a query walks one dense [t+1, D] matrix. A query row is scored, normalised and
 * summed exactly as cpu_attention_forward does for the same row (cpu_dot scaled, the row's maximum,
 * the sum of exponentials in double, expf(score - lse), cpu_axpy in key order), so that a sequence
 * decoded one token at a time gives bitwise the outputs of the training forward on the whole
 * sequence. With a sliding window W > 0 row t sees cache positions t - W < j <= t, as the training
 * forward's window. */
#include <math.h>
#include <string.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

void cpu_kv_cache_append(float *k_cache, float *v_cache, const float *qkv, int N, int pos0, int cap, int Hq, int Hkv,
                         int D) {
    size_t W = (size_t)(Hq + 2 * Hkv) * D;
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int g = 0; g < Hkv; g++) {
            const float *row = qkv + (size_t)n * W;
            size_t at = ((size_t)g * cap + (size_t)(pos0 + n)) * D;
            memcpy(k_cache + at, row + (size_t)(Hq + g) * D, (size_t)D * sizeof(float));
            memcpy(v_cache + at, row + (size_t)(Hq + Hkv + g) * D, (size_t)D * sizeof(float));
        }
}

void cpu_attention_decode(float *out, const float *qkv, const float *k_cache, const float *v_cache, int N, int pos0,
                          int cap, int Hq, int Hkv, int D) {
    cpu_attention_decode_window(out, qkv, k_cache, v_cache, N, pos0, cap, Hq, Hkv, D, 0);
}

void cpu_attention_decode_window(float *out, const float *qkv, const float *k_cache, const float *v_cache, int N,
                                 int pos0, int cap, int Hq, int Hkv, int D, int window) {
    size_t W = (size_t)(Hq + 2 * Hkv) * D;
    int group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *sc = cpu_scratch((size_t)(pos0 + N) * sizeof(float)); /* scores of one query row */
#pragma omp for collapse(2) schedule(static)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < Hq; h++) {
                const int t = pos0 + n, j0 = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
                const float *q = qkv + (size_t)n * W + (size_t)h * D;
                const float *K = k_cache + (size_t)(h / group) * cap * D;
                const float *V = v_cache + (size_t)(h / group) * cap * D;
                float mx = -INFINITY;
                for (int j = j0; j <= t; j++) {
                    sc[j] = cpu_dot(q, K + (size_t)j * D, D) * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                double sum = 0.0;
                for (int j = j0; j <= t; j++) sum += expf(sc[j] - mx);
                float l = (float)(mx + log(sum));
                float *o = out + (size_t)n * Hq * D + (size_t)h * D;
                memset(o, 0, (size_t)D * sizeof(float));
                for (int j = j0; j <= t; j++) cpu_axpy(o, expf(sc[j] - l), V + (size_t)j * D, D);
            }
        free(sc);
    }
}
