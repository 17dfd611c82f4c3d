/* What the CUDA benchmark programs share: a checked CUDA call that stops the program with the call,
 * file, line and CUDA's message, and the number of warm-up and timed repetitions. */
#ifndef FSDP_BENCH_CUDA_H
#define FSDP_BENCH_CUDA_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#define WARMUP 3
#define REPS 20

#endif
