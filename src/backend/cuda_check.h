/* FSDP_CHECK_CUDA(call): a CUDA runtime call whose failure is fatal (fsdp_fatal), naming the call,
 * file, line, rank and CUDA's message. Shared by the CUDA backend and by the programs that call the
 * kernels directly (the GPU unit tests, the CUDA benchmarks). FSDP_CHECK_STATUS_ is the same check
 * for any library whose calls return a status with a message function (cuBLAS, NCCL:
 * cuda_internal.h). */
#ifndef FSDP_BACKEND_CUDA_CHECK_H
#define FSDP_BACKEND_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "../base/error.h"

#define FSDP_CHECK_STATUS_(status_type, success, message, call, text)                                 \
    do {                                                                                              \
        status_type fsdp_rc_ = (status_type)(call);                                                   \
        if (fsdp_rc_ != (success))                                                                    \
            fsdp_fatal("%s failed at %s:%d: %s", text, __FILE__, __LINE__, message(fsdp_rc_));        \
    } while (0)
#define FSDP_CHECK_CUDA(call) FSDP_CHECK_STATUS_(cudaError_t, cudaSuccess, cudaGetErrorString, call, #call)

#endif
