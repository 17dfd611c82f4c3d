/* What the CUDA benchmark programs share: a checked CUDA call that stops the program with the call,
 * file, line and CUDA's message, and the number of warm-up and timed repetitions. */
#ifndef FSDP_BENCH_CUDA_H
#define FSDP_BENCH_CUDA_H

#include "backend/cuda_check.h"

#define CK(call) FSDP_CHECK_CUDA(call)

#define WARMUP 3
#define REPS 20

#endif
