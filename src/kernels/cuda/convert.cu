/* Elementwise dtype conversion (cast) and accumulation (dst += src) between fp32 and bf16 in any
 * combination, for the sharding engine (gathered working weights, gradient accumulation).
 *
 * Chunks of 8 with 16-byte accesses when both pointers are aligned, a scalar tail for any n, and a
 * scalar path for misaligned sub-ranges. Accumulation adds in fp32 and rounds once to dst's dtype,
 * as the CPU backend does. A cast between equal dtypes is a plain device copy. */
#include "cuda_common.cuh"

#define CONVERT_THREADS 256

static __device__ __forceinline__ void convert(void *dst, const void *src, size_t n, int dbf, int sbf, int acc,
                                               int vec) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (vec) {
        size_t nch = n / 8;
        for (size_t j = tid; j < nch; j += stride) {
            float v[8];
            ld8(src, j, sbf, v);
            if (acc) {
                float d[8];
                ld8(dst, j, dbf, d);
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = d[e] + v[e];
            }
            st8(dst, j, dbf, v);
        }
        done = nch * 8;
    }
    for (size_t i = done + tid; i < n; i += stride) {
        float v = ld1(src, i, sbf);
        if (acc) v = ld1(dst, i, dbf) + v;
        st1(dst, i, dbf, v);
    }
}

/* mode bits: 1 dst bf16, 2 src bf16, 4 accumulate, 8 vector path. */
static __global__ void convert_kernel(void *dst, const void *src, size_t n, int mode) {
/* clang-format off */
#define CONVERT_CASE(m) \
    case m: convert(dst, src, n, (m) & 1, ((m) >> 1) & 1, ((m) >> 2) & 1, ((m) >> 3) & 1); break;
    switch (mode) {
        CONVERT_CASE(0) CONVERT_CASE(1) CONVERT_CASE(2) CONVERT_CASE(3)
        CONVERT_CASE(4) CONVERT_CASE(5) CONVERT_CASE(6) CONVERT_CASE(7)
        CONVERT_CASE(8) CONVERT_CASE(9) CONVERT_CASE(10) CONVERT_CASE(11)
        CONVERT_CASE(12) CONVERT_CASE(13) CONVERT_CASE(14) CONVERT_CASE(15)
    }
#undef CONVERT_CASE
/* clang-format on */
}

static void convert_launch(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t n, int acc,
                           cudaStream_t s, const char *name) {
    /* In place between dtypes of different sizes would race (element i's bytes differ). */
    FSDP_ASSERT(dst != src || dst_t == src_t);
    int vec = fsdp_cuda_aligned16(dst) && fsdp_cuda_aligned16(src);
    int mode = (dst_t == FSDP_BF16) | (src_t == FSDP_BF16) << 1 | acc << 2 | vec << 3;
    convert_kernel<<<fsdp_cuda_grid(vec ? n / 8 + 1 : n, CONVERT_THREADS), CONVERT_THREADS, 0, s>>>(dst, src, n, mode);
    fsdp_cuda_check_launch(name);
}

extern "C" void fsdp_cuda_cast(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t n,
                               cudaStream_t s) {
    if (n == 0 || (dst == src && dst_t == src_t)) return;
    if (dst_t == src_t) {
        cudaError_t e = cudaMemcpyAsync(dst, src, n * fsdp_dtype_info_of(dst_t)->bytes, cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) fsdp_fatal("kernel cast failed to launch: cudaMemcpyAsync: %s", cudaGetErrorString(e));
        return;
    }
    convert_launch(dst, dst_t, src, src_t, n, 0, s, "cast");
}

extern "C" void fsdp_cuda_accumulate(void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t n,
                                     cudaStream_t s) {
    if (n == 0) return;
    convert_launch(dst, dst_t, src, src_t, n, 1, s, "accumulate");
}
