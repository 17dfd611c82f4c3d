/* Residual dropout, forward and backward: the reference of the masks of src/kernels/dropout.h on
 * [N, C] tensors of rows of T positions. Parallel over rows; each Philox group (four consecutive
 * elements of a sample's tensor) is evaluated once, where its first element of the row falls. */
#include "../ops_cpu.h"
#include "cpu_common.h"

/* y[c] = keep(n, c) ? x[c] * scale : 0 for row n (y may alias x). */
static void drop_row(float *y, const float *x, int64_t n, int T, int C, const fsdp_dropout *d) {
    const uint64_t e0 = (uint64_t)(n % T) * (uint64_t)C;
    const int64_t sample = d->sample_base + n / T;
    fsdp_philox4 w = {{0, 0, 0, 0}};
    for (int c = 0; c < C; c++) {
        const uint64_t e = e0 + (uint64_t)c;
        if (c == 0 || (e & 3) == 0) w = fsdp_dropout_draw(d, sample, e >> 2);
        y[c] = w.w[e & 3] >= d->threshold ? x[c] * d->scale : 0.0f;
    }
}

void cpu_residual_dropout_forward(float *out, const float *residual, const float *x, int N, int T, int C,
                                  const fsdp_dropout *drop) {
    const int active = fsdp_dropout_active(drop);
    if (active) fsdp_dropout_check_rows(drop, (N + T - 1) / T, T, C);
#pragma omp parallel
    {
        float *row = active ? cpu_scratch((size_t)C * sizeof(float)) : NULL;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t at = (size_t)n * C;
            if (active) {
                drop_row(row, x + at, n, T, C, drop);
                for (int c = 0; c < C; c++) out[at + c] = residual[at + c] + row[c];
            } else {
                for (int c = 0; c < C; c++) out[at + c] = residual[at + c] + x[at + c];
            }
        }
        free(row);
    }
}

void cpu_dropout_backward(float *dx, const float *dout, int N, int T, int C, const fsdp_dropout *drop) {
    const int active = fsdp_dropout_active(drop);
    if (active) fsdp_dropout_check_rows(drop, (N + T - 1) / T, T, C);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t at = (size_t)n * C;
        if (active)
            drop_row(dx + at, dout + at, n, T, C, drop);
        else if (dx != dout)
            for (int c = 0; c < C; c++) dx[at + c] = dout[at + c];
    }
}
