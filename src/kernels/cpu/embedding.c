/* Token (and learned position) embeddings: the lookup and its scatter-add gradient. */
#include <string.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

/* Channels per task in the backward: wide enough to stream rows, narrow enough to spread C. */
#define EMB_CBLOCK 64

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int pos_offset,
                           int N, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        const float *e = wte + (size_t)tokens[n] * C;
        if (!wpe) {
            memcpy(o, e, (size_t)C * sizeof(float));
            continue;
        }
        const float *p = wpe + (size_t)(pos_offset + n % T) * C;
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

/* Rows sharing a token add into the same dwte row, so parallelising over rows would race or make
 * the order thread-dependent. Each task owns a block of channels instead and visits rows in order. */
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int pos_offset,
                            int N, int T, int C) {
    int nblocks = (C + EMB_CBLOCK - 1) / EMB_CBLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * EMB_CBLOCK;
        int c1 = c0 + EMB_CBLOCK < C ? c0 + EMB_CBLOCK : C;
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C;
            float *w = dwte + (size_t)tokens[n] * C;
            for (int c = c0; c < c1; c++) w[c] += d[c];
            if (dwpe) {
                float *p = dwpe + (size_t)(pos_offset + n % T) * C;
                for (int c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}
