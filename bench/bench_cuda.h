/* What the CUDA benchmark programs share: a checked CUDA call that stops the program with the call,
 * file, line and CUDA's message, and the number of warm-up and timed repetitions. */
#ifndef FSDP_BENCH_CUDA_H
#define FSDP_BENCH_CUDA_H

#include "backend/cuda_check.h"

#define CK(call) FSDP_CHECK_CUDA(call)

#define WARMUP 3
#define REPS 20

#include <stdint.h>
#include <stdlib.h>

/* Uniform in (-1, 1) from splitmix64 with a fixed seed: every run of a benchmark times the same data. */
static uint64_t bench_rng = 0x853c49e6748fea9bull;
static inline float bench_uniform_sym(void) {
    uint64_t z = (bench_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static inline int bench_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* out_ms = the median milliseconds of REPS runs of `stmt` timed with events on the default stream,
 * after WARMUP untimed runs (the median: the machines are shared and a run can be disturbed). */
#define BENCH_MEDIAN_MS(stmt, out_ms)                                                                        \
    do {                                                                                                     \
        cudaEvent_t e0_, e1_;                                                                                \
        float t_[REPS];                                                                                      \
        CK(cudaEventCreate(&e0_));                                                                           \
        CK(cudaEventCreate(&e1_));                                                                           \
        for (int w_ = 0; w_ < WARMUP; w_++) stmt;                                                            \
        CK(cudaDeviceSynchronize());                                                                         \
        for (int r_ = 0; r_ < REPS; r_++) {                                                                  \
            CK(cudaEventRecord(e0_, 0));                                                                     \
            stmt;                                                                                            \
            CK(cudaEventRecord(e1_, 0));                                                                     \
            CK(cudaEventSynchronize(e1_));                                                                   \
            CK(cudaEventElapsedTime(&t_[r_], e0_, e1_));                                                     \
        }                                                                                                    \
        CK(cudaGetLastError());                                                                              \
        CK(cudaEventDestroy(e0_));                                                                           \
        CK(cudaEventDestroy(e1_));                                                                           \
        qsort(t_, REPS, sizeof(float), bench_cmp_float);                                                     \
        (out_ms) = 0.5f * (t_[REPS / 2 - 1] + t_[REPS / 2]);                                                 \
    } while (0)

#endif
