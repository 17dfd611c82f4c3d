/* Deterministic reductions: bias gradients (column sums of an [N, OC] matrix), the second pass that
 * every column sum shares (fsdp_cuda_colsum_finalize, also used by norms.cu), whole-array sums and
 * sums of squares, and the gradient-clipping coefficient.
 *
 * No atomics: each reduction runs a fixed number of blocks that depends only on the problem size,
 * each block writes its partial to scratch, and one more kernel adds the partials in a fixed
 * order. The same inputs therefore give bitwise the same result on every run, whatever the size of
 * the GPU. */
#include "cuda_common.cuh"

/* ---- second pass of column sums ------------------------------------------------------------------ */

/* Block (32 columns, 32 slices): slice y sums partial rows y, y + 32, ...; then the 32 slice sums
 * of each column are added in slice order. blockIdx.y picks the first or the second output. */
static __global__ void colsum_finalize_kernel(void *dst0, void *dst1, const float *part, int G, int C, int gbf16) {
    __shared__ float sh[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    const float *p = part + (blockIdx.y ? (size_t)G * C : 0);
    float s = 0.0f;
    if (c < C) {
#pragma unroll 8
        for (int b = threadIdx.y; b < G; b += 32) s += p[(size_t)b * C + c];
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) t += sh[i][threadIdx.x];
        void *dst = blockIdx.y ? dst1 : dst0;
        if (gbf16)
            st1(dst, c, 1, ld1(dst, c, 1) + t);
        else
            st1(dst, c, 0, ld1(dst, c, 0) + t);
    }
}

void fsdp_cuda_colsum_finalize(void *dst0, void *dst1, const float *part, int G, int C, fsdp_dtype grad,
                               cudaStream_t s) {
    dim3 grid((unsigned)fsdp_cuda_ceil_div(C, 32), dst1 ? 2 : 1), block(32, 32);
    colsum_finalize_kernel<<<grid, block, 0, s>>>(dst0, dst1, part, G, C, grad == FSDP_BF16);
    fsdp_cuda_check_launch("colsum_finalize");
}

/* ---- bias gradients: dbias[OC] += sum over n of dout[n, OC] ------------------------------------------ */

#define COLSUM_THREADS 128

/* Block (x, b): chunk (or column) j of rows [b * rows, ...), four rows' loads in flight at a time. */
static __device__ __forceinline__ void colsum_part(float *part, const void *dout, int N, int OC, int rows, int bf16,
                                                   int E) {
    int width = OC / E; /* chunks of E per row */
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    int r0 = blockIdx.y * rows, r1 = min(N, r0 + rows);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int row = r0;
    for (; row + 4 <= r1; row += 4) {
        float v[4][8];
#pragma unroll
        for (int q = 0; q < 4; q++) ldE(dout, (size_t)(row + q) * width + j, bf16, E, v[q]);
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int e = 0; e < E; e++) acc[e] += v[q][e];
    }
    for (; row < r1; row++) {
        float v[8];
        ldE(dout, (size_t)row * width + j, bf16, E, v);
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] += v[e];
    }
    stE(part, (size_t)blockIdx.y * width + j, 0, E, acc);
}
static __global__ void colsum_part_kernel(float *part, const void *dout, int N, int OC, int rows, int bf16, int vec) {
    if (bf16) {
        if (vec)
            colsum_part(part, dout, N, OC, rows, 1, 8);
        else
            colsum_part(part, dout, N, OC, rows, 1, 1);
    } else {
        if (vec)
            colsum_part(part, dout, N, OC, rows, 0, 8);
        else
            colsum_part(part, dout, N, OC, rows, 0, 1);
    }
}

extern "C" void fsdp_cuda_column_sum(void *dbias, const void *dout, int N, int OC, fsdp_dtype act, fsdp_dtype grad,
                                     float *scratch, cudaStream_t s) {
    if (N <= 0 || OC <= 0) return;
    int G = fsdp_cuda_row_blocks(N), rows = fsdp_cuda_ceil_div(N, G);
    int vec = OC % 8 == 0 && fsdp_cuda_aligned16(dout) && fsdp_cuda_aligned16(scratch);
    int width = vec ? OC / 8 : OC;
    dim3 grid((unsigned)fsdp_cuda_ceil_div(width, COLSUM_THREADS), (unsigned)G);
    colsum_part_kernel<<<grid, COLSUM_THREADS, 0, s>>>(scratch, dout, N, OC, rows, act == FSDP_BF16, vec);
    fsdp_cuda_check_launch("column_sum");
    fsdp_cuda_colsum_finalize(dbias, NULL, scratch, G, OC, grad, s);
}

/* ---- whole-array sums ----------------------------------------------------------------------------- */

/* Blocks of the first pass (fsdp_cuda_reduce_blocks, cuda_scratch.h): one chunk of 8 per thread, from
 * n alone. */
#define REDUCE_THREADS FSDP_CUDA_REDUCE_THREADS

/* Sum (or sum of squares) over a fixed stride pattern. Each chunk of 8 is summed in fp32, chunks
 * accumulate in double per thread (free on Hopper, and it keeps sums over hundreds of millions
 * of values as accurate as the CPU reference), the block reduces in a fixed tree. */
static __device__ __forceinline__ void reduce_part(float *part, const void *x, size_t n, int bf16, int sq, int vec) {
    __shared__ double sh[REDUCE_THREADS / 32];
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    size_t done = 0;
    if (vec) {
        size_t nch = n / 8;
#pragma unroll 4
        for (size_t j = tid; j < nch; j += stride) {
            float v[8], s = 0.0f;
            ld8(x, j, bf16, v);
#pragma unroll
            for (int e = 0; e < 8; e++) s += sq ? v[e] * v[e] : v[e];
            acc += s;
        }
        done = nch * 8;
    }
    for (size_t i = done + tid; i < n; i += stride) {
        float v = ld1(x, i, bf16);
        acc += sq ? v * v : v;
    }
    acc = warp_sum_d(acc);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh[w] = acc;
    __syncthreads();
    if (w == 0) {
        double t = lane < REDUCE_THREADS / 32 ? sh[lane] : 0.0;
        t = warp_sum_d(t);
        if (lane == 0) part[blockIdx.x] = (float)t;
    }
}
static __global__ void __launch_bounds__(REDUCE_THREADS)
    reduce_part_kernel(float *part, const void *x, size_t n, int bf16, int sq, int vec) {
    if (sq) {
        if (bf16) {
            if (vec)
                reduce_part(part, x, n, 1, 1, 1);
            else
                reduce_part(part, x, n, 1, 1, 0);
        } else {
            if (vec)
                reduce_part(part, x, n, 0, 1, 1);
            else
                reduce_part(part, x, n, 0, 1, 0);
        }
    } else {
        if (vec)
            reduce_part(part, x, n, 0, 0, 1);
        else
            reduce_part(part, x, n, 0, 0, 0);
    }
}

/* One block adds the G <= 1024 partials in a fixed tree and adds the total into *out. */
static __global__ void __launch_bounds__(1024) reduce_final_kernel(float *out, const float *part, int G) {
    __shared__ double sh[32];
    double t = threadIdx.x < (unsigned)G ? (double)part[threadIdx.x] : 0.0;
    t = warp_sum_d(t);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh[w] = t;
    __syncthreads();
    if (w == 0) {
        t = warp_sum_d(sh[lane]);
        if (lane == 0) *out += (float)t;
    }
}

static void reduce_launch(float *out, const void *x, int bf16, int sq, size_t n, float *scratch, cudaStream_t s,
                          const char *name) {
    if (n == 0) return;
    int G = fsdp_cuda_reduce_blocks(n);
    reduce_part_kernel<<<G, REDUCE_THREADS, 0, s>>>(scratch, x, n, bf16, sq, fsdp_cuda_aligned16(x));
    fsdp_cuda_check_launch(name);
    reduce_final_kernel<<<1, 1024, 0, s>>>(out, scratch, G);
    fsdp_cuda_check_launch(name);
}

extern "C" void fsdp_cuda_sum_squares(float *out, const void *x, fsdp_dtype t, size_t n, float *scratch,
                                      cudaStream_t s) {
    reduce_launch(out, x, t == FSDP_BF16, 1, n, scratch, s, "sum_squares");
}

extern "C" void fsdp_cuda_sum(float *out, const float *x, size_t n, float *scratch, cudaStream_t s) {
    reduce_launch(out, x, 0, 0, n, scratch, s, "sum");
}

/* ---- gradient clipping --------------------------------------------------------------------------- */

/* torch.nn.utils.clip_grad_norm_'s coefficient, clamped to 1. Correctly rounded sqrt and division
 * (whatever the build's fast-math setting) so the value matches the CPU backend's bit for bit. */
static __global__ void clip_scale_kernel(float *scale, const float *sumsq, float max_norm) {
    float coef = __fdiv_rn(max_norm, __fadd_rn(__fsqrt_rn(*sumsq), 1e-6f));
    *scale = (max_norm > 0.0f && coef < 1.0f) ? coef : 1.0f;
}

extern "C" void fsdp_cuda_clip_scale(float *scale, const float *sumsq, float max_norm, cudaStream_t s) {
    clip_scale_kernel<<<1, 1, 0, s>>>(scale, sumsq, max_norm);
    fsdp_cuda_check_launch("clip_scale");
}
