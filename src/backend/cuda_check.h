/* FSDP_CHECK_CUDA(call): a CUDA runtime call whose failure is fatal (fsdp_fatal), naming the call,
 * file, line, rank and CUDA's message. Shared by the CUDA backend and by the programs that call the
 * kernels directly (the GPU unit tests, the CUDA benchmarks). */
#ifndef FSDP_BACKEND_CUDA_CHECK_H
#define FSDP_BACKEND_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "../base/error.h"

#define FSDP_CHECK_CUDA(call)                                                                         \
    do {                                                                                              \
        cudaError_t fsdp_rc_ = (call);                                                                \
        if (fsdp_rc_ != cudaSuccess)                                                                  \
            fsdp_fatal("%s failed at %s:%d: %s", #call, __FILE__, __LINE__, cudaGetErrorString(fsdp_rc_)); \
    } while (0)

#endif
