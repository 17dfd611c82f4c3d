/* Whole-array reductions (gradient-norm clipping, metrics) and in-place bf16 rounding.
 *
 * Sums are taken in double over fixed chunks of REDUCE_CHUNK elements; the chunk partials are then
 * added in chunk order, so the result depends only on n and the data, not on the thread count. */
#include "../../base/dtype.h"
#include "../ops_cpu.h"
#include "cpu_common.h"

#define REDUCE_CHUNK 4096

static double chunk_sum(const float *x, size_t n, int squares) {
    double s = 0.0;
    if (squares)
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    else
        for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

static double chunked_sum(const float *x, size_t n, int squares) {
    size_t nchunks = (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
    if (nchunks <= 1) return chunk_sum(x, n, squares);
    double *part = cpu_scratch(nchunks * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; k++) {
        size_t off = k * REDUCE_CHUNK, len = n - off < REDUCE_CHUNK ? n - off : REDUCE_CHUNK;
        part[k] = chunk_sum(x + off, len, squares);
    }
    double s = 0.0;
    for (size_t k = 0; k < nchunks; k++) s += part[k];
    free(part);
    return s;
}

double cpu_sum_squares(const float *x, size_t n) { return chunked_sum(x, n, 1); }
double cpu_sum(const float *x, size_t n) { return chunked_sum(x, n, 0); }

void cpu_round_bf16(float *x, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = fsdp_round_bf16(x[i]);
}
