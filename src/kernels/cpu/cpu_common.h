/* Helpers shared by the CPU reference ops (private to src/kernels/cpu).
 *
 * Determinism rule for every op here: each output element is computed by exactly one OpenMP thread,
 * and every sum it involves runs in an order fixed by the code, never by the thread count. Loops use
 * static schedules; reductions across threads are never done with OpenMP reduction clauses.
 *
 * Precision: per-row statistics (norm mean/variance, softmax normalisers, cross-entropy) are
 * accumulated in double because they are cheap and set the accuracy of everything downstream;
 * matrix products and gradient sums use fp32, as the GPU kernels do. */
#ifndef FSDP_KERNELS_CPU_COMMON_H
#define FSDP_KERNELS_CPU_COMMON_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* The kernels layer sits below src/base's fatal-error machinery, so scratch allocation failures
 * abort directly; scratch buffers are small (a row or a block of rows per thread). */
static inline void *cpu_scratch(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "fsdp: cpu ops: out of memory allocating %zu bytes of scratch\n", bytes);
        abort();
    }
    return p;
}

/* Dot product with eight independent partial sums: the compiler can vectorise it without
 * -ffast-math, and the summation order depends only on n, so the result is reproducible. */
static inline float cpu_dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

/* y += a * x over n elements (y and x must not overlap). Written in blocks of eight like cpu_dot
 * because gcc's -O2 cost model will not vectorise a loop of unknown length; each element still
 * gets exactly one multiply-add, so the blocking does not change any result. */
static inline void cpu_axpy(float *restrict y, float a, const float *restrict x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] += a * x[i + k];
    for (; i < n; i++) y[i] += a * x[i];
}

#endif
