/* Residual dropout on its own, forward (out = residual + keep . x / (1 - p)) and backward
 * (dx = keep . dout / (1 - p)): the CUDA twins of src/kernels/cpu/dropout.c, with the masks of
 * src/kernels/dropout.h. The model fuses both into the norms (norms.cu); these
 * stand-alone passes are the unfused reference point of the benchmark and serve any residual add
 * that no norm follows.
 *
 * A memory-bound stream: one thread per chunk of 8 elements of a row (two whole Philox groups, since
 * C is then a multiple of 8) when sizes and alignment allow, else one thread per element through
 * the same body. Grid-stride loops make any size correct. */
#include "cuda_common.cuh"

#define DR_THREADS 256

/* residual may be NULL (the backward: out = keep . x * scale). */
static __device__ __forceinline__ void dropout_rows(void *out, const void *residual, const void *x, int N, int T,
                                                    int C, const fsdp_dropout &d, int active, int bf16, int vec) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    const float scale = active ? d.scale : 1.0f;
    if (vec) {
        const int nch = C / 8;
        const size_t total = (size_t)N * nch;
        for (size_t q = tid; q < total; q += stride) {
            const int row = (int)(q / (size_t)nch), j = (int)(q % (size_t)nch);
            unsigned bits = 0xffu;
            if (active) bits = drop_bits8(d, d.sample_base + row / T, ((uint64_t)(row % T) * C + 8u * j) >> 2);
            float v[8], r[8];
            ld8(x, q, bf16, v);
            if (residual) {
                ld8(residual, q, bf16, r);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) r[e] = 0.0f;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = r[e] + ((bits >> e) & 1u ? v[e] * scale : 0.0f);
            st8(out, q, bf16, v);
        }
        return;
    }
    const size_t total = (size_t)N * C;
    for (size_t i = tid; i < total; i += stride) {
        const int row = (int)(i / (size_t)C), c = (int)(i % (size_t)C);
        const int keep = !active || fsdp_dropout_keep_row(&d, row, T, C, c);
        const float v = keep ? ld1(x, i, bf16) * scale : 0.0f;
        st1(out, i, bf16, residual ? ld1(residual, i, bf16) + v : v);
    }
}

static __global__ void __launch_bounds__(DR_THREADS) dropout_rows_kernel(void *out, const void *residual, const void *x,
                                                                         int N, int T, int C, const fsdp_dropout d,
                                                                         int active, int bf16, int vec) {
    if (bf16) {
        if (vec)
            dropout_rows(out, residual, x, N, T, C, d, active, 1, 1);
        else
            dropout_rows(out, residual, x, N, T, C, d, active, 1, 0);
    } else {
        if (vec)
            dropout_rows(out, residual, x, N, T, C, d, active, 0, 1);
        else
            dropout_rows(out, residual, x, N, T, C, d, active, 0, 0);
    }
}

static void dropout_launch(void *out, const void *residual, const void *x, int N, int T, int C,
                           const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s, const char *name) {
    if (N <= 0 || C <= 0) return;
    if (T <= 0) fsdp_fatal("%s: T = %d must be positive", name, T);
    const int active = fsdp_dropout_active(drop);
    fsdp_dropout d;
    memset(&d, 0, sizeof d);
    if (active) {
        d = *drop;
        fsdp_dropout_check_rows(drop, fsdp_cuda_ceil_div(N, T), T, C);
    }
    const int vec = C % 8 == 0 && fsdp_cuda_aligned16(out) && fsdp_cuda_aligned16(x) &&
                    (!residual || fsdp_cuda_aligned16(residual));
    const size_t work = vec ? (size_t)N * (C / 8) : (size_t)N * C;
    dropout_rows_kernel<<<fsdp_cuda_grid(work, DR_THREADS), DR_THREADS, 0, s>>>(out, residual, x, N, T, C, d, active,
                                                                                act == FSDP_BF16, vec);
    fsdp_cuda_check_launch(name);
}

extern "C" void fsdp_cuda_residual_dropout_forward(void *out, const void *residual, const void *x, int N, int T, int C,
                                                   const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s) {
    dropout_launch(out, residual, x, N, T, C, drop, act, s, "residual_dropout_forward");
}

extern "C" void fsdp_cuda_dropout_backward(void *dx, const void *dout, int N, int T, int C, const fsdp_dropout *drop,
                                           fsdp_dtype act, cudaStream_t s) {
    dropout_launch(dx, NULL, dout, N, T, C, drop, act, s, "dropout_backward");
}
