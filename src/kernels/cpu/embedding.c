/* Token (and learned position) embeddings: the lookup and its scatter-add gradient. */
#include <stdint.h>
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

static int64_t row_of(const fsdp_row_set *s, int n) {
    return s->rows ? (int64_t)s->rows[n] : (int64_t)(s->offset + n % s->period);
}

/* Rows sharing a token add into the same row, so parallelising over rows would race or make the
 * order thread-dependent. Each task owns a block of channels instead and visits rows in order, so
 * every element receives its rows in the same order whatever the thread count. */
void cpu_add_rows(float *dst, int64_t window_start, int64_t window_len, const fsdp_row_set *sets, int nsets,
                  const float *values, int N, int C) {
    int64_t window_end = window_start + window_len;
    int nblocks = (C + EMB_CBLOCK - 1) / EMB_CBLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * EMB_CBLOCK;
        int c1 = c0 + EMB_CBLOCK < C ? c0 + EMB_CBLOCK : C;
        for (int n = 0; n < N; n++) {
            const float *v = values + (size_t)n * C;
            for (int k = 0; k < nsets; k++) {
                if (sets[k].rows && sets[k].rows[n] == sets[k].skip) continue;
                int64_t first = sets[k].base + row_of(&sets[k], n) * C;
                int64_t lo = first + c0 > window_start ? first + c0 : window_start;
                int64_t hi = first + c1 < window_end ? first + c1 : window_end;
                for (int64_t e = lo; e < hi; e++) dst[e - window_start] += v[e - first];
            }
        }
    }
}

/* The whole-table case of cpu_add_rows: the window covers every row. */
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int padding_idx,
                            int pos_offset, int N, int T, int C) {
    const int64_t everything = INT64_MAX / 2;
    fsdp_row_set token_rows = {0, tokens, 0, 1, padding_idx};
    cpu_add_rows(dwte, 0, everything, &token_rows, 1, dout, N, C);
    if (dwpe) {
        fsdp_row_set position_rows = {0, NULL, pos_offset, T, -1};
        cpu_add_rows(dwpe, 0, everything, &position_rows, 1, dout, N, C);
    }
}
