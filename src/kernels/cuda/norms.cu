/* RMSNorm and LayerNorm, forward and backward (the CUDA twins of src/kernels/cpu/norms.c).
 *
 * Fast path (C a multiple of 8, 16-byte aligned tensors, C small enough for the row to sit in
 * registers): a group of TPR threads (a warp, or several warps for long rows) owns a row; each
 * thread holds its chunks of 8 elements in registers in storage form, so the row is read from
 * memory once although it is used two or three times. Generic path (any C, any alignment): scalar
 * loops that re-read the row, one block per row; it exists for the tiny test models.
 *
 * Backward: dinp is read, added to and written back (it carries the residual-stream gradient).
 * The weight and bias gradients sum over rows, and must be bitwise reproducible: block b of the
 * backward owns a fixed range of rows (fsdp_cuda_row_blocks fixes their number from N alone),
 * keeps per-column partial sums in registers and writes them to scratch row b; a second kernel
 * (fsdp_cuda_colsum_finalize, reduce.cu) adds the partial rows in a fixed order into the
 * gradient. No atomics anywhere, so runs repeat bit for bit on any GPU. */
#include "cuda_common.cuh"

/* Chunks per thread on the fast path, and the most threads a row group may have. The forward
 * only caches the input: a warp per row up to C = 2048, blocks of 256 threads, C <= 16384. The
 * backward caches input, output gradient, the next row's prefetch, dinp and one or two
 * accumulators per element, so it keeps one chunk per thread (256 threads per row at C = 2048,
 * up to 1024 threads, C <= 8192) and is held to 64 registers: eight blocks of 256 fit on a
 * multiprocessor and the 1024 row blocks of a large N run in a single wave. */
#define FWD_K 8
#define FWD_MAX_TPR 256
#define BWD_K 1
#define BWD_MAX_TPR 1024
#define BWD_MAX_TPR_F32 512 /* fp32 rows need twice the registers: 128 per thread, C <= 4096 */
#define GENERIC_THREADS 128

/* Threads per row for `nch` chunks at `k` per thread: a multiple of 32, or 0 when the row does not
 * fit in `max_tpr` threads' registers (the generic path takes it). */
static int threads_per_row(int nch, int k, int max_tpr) {
    int t = fsdp_cuda_ceil_div(fsdp_cuda_ceil_div(nch, k), 32) * 32;
    return t > max_tpr ? 0 : t;
}

/* The forward fast path's row in registers: thread t of a row group holds chunks t, t + tpr, ... of
 * 8 elements in storage form. */
static __device__ __forceinline__ void load_row_chunks(fsdp_raw8 xr[FWD_K], const void *inp, size_t base, int nch,
                                                       int t, int tpr, int valid, int bf16) {
#pragma unroll
    for (int k = 0; k < FWD_K; k++) {
        int j = t + k * tpr;
        if (valid && j < nch) xr[k] = ld_raw8(inp, base + j, bf16);
    }
}

/* This thread's share of sum(x - shift) or, with `square`, sum((x - shift)^2) over its chunks. */
static __device__ __forceinline__ float chunk_sum(const fsdp_raw8 xr[FWD_K], int nch, int t, int tpr, int valid,
                                                  int bf16, float shift, int square) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < FWD_K; k++) {
        int j = t + k * tpr;
        if (valid && j < nch) {
            float v[8];
            unpack8(xr[k], bf16, v);
#pragma unroll
            for (int e = 0; e < 8; e++) acc += square ? (v[e] - shift) * (v[e] - shift) : v[e] - shift;
        }
    }
    return acc;
}

/* ================================================================================================
 * RMSNorm
 * ================================================================================================ */

static __device__ __forceinline__ void rms_fwd_vec(void *out, float *rstd, const void *inp, const void *weight, int N,
                                                   int C, float eps, int bf16) {
    __shared__ float sh[32 * (FWD_MAX_TPR / 32)];
    int row = blockIdx.x * blockDim.y + threadIdx.y, valid = row < N;
    int nch = C / 8, t = threadIdx.x, tpr = blockDim.x;
    size_t base = (size_t)row * nch;
    fsdp_raw8 xr[FWD_K];
    load_row_chunks(xr, inp, base, nch, t, tpr, valid, bf16);
    float ss = chunk_sum(xr, nch, t, tpr, valid, bf16, 0.0f, 1);
    ss = group_sum(ss, sh);
    if (!valid) return;
    float r = rsqrtf(ss / (float)C + eps);
#pragma unroll
    for (int k = 0; k < FWD_K; k++) {
        int j = t + k * tpr;
        if (j < nch) {
            float v[8], w[8];
            unpack8(xr[k], bf16, v);
            ld8(weight, j, bf16, w);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = v[e] * r * w[e];
            st8(out, base + j, bf16, v);
        }
    }
    if (t == 0) rstd[row] = r;
}
static __global__ void __launch_bounds__(FWD_MAX_TPR)
    rms_fwd_vec_f32(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps) {
    rms_fwd_vec(out, rstd, inp, weight, N, C, eps, 0);
}
static __global__ void __launch_bounds__(FWD_MAX_TPR)
    rms_fwd_vec_bf16(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps) {
    rms_fwd_vec(out, rstd, inp, weight, N, C, eps, 1);
}

static __device__ __forceinline__ void rms_fwd_gen(void *out, float *rstd, const void *inp, const void *weight, int C,
                                                   float eps, int bf16) {
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = ld1(inp, base + c, bf16);
        ss += v * v;
    }
    ss = group_sum(ss, sh);
    float r = rsqrtf(ss / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        st1(out, base + c, bf16, ld1(inp, base + c, bf16) * r * ld1(weight, c, bf16));
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}
static __global__ void rms_fwd_gen_kernel(void *out, float *rstd, const void *inp, const void *weight, int C, float eps,
                                          int bf16) {
    if (bf16)
        rms_fwd_gen(out, rstd, inp, weight, C, eps, 1);
    else
        rms_fwd_gen(out, rstd, inp, weight, C, eps, 0);
}

extern "C" void fsdp_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C,
                                          float eps, fsdp_dtype act, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = act == FSDP_BF16;
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, FWD_K, FWD_MAX_TPR) : 0;
    if (tpr && fsdp_cuda_aligned16(out) && fsdp_cuda_aligned16(inp) && fsdp_cuda_aligned16(weight)) {
        int rpb = tpr >= 256 ? 1 : 256 / tpr;
        dim3 block(tpr, rpb);
        unsigned grid = (unsigned)fsdp_cuda_ceil_div(N, rpb);
        if (bf16)
            rms_fwd_vec_bf16<<<grid, block, 0, s>>>(out, rstd, inp, weight, N, C, eps);
        else
            rms_fwd_vec_f32<<<grid, block, 0, s>>>(out, rstd, inp, weight, N, C, eps);
        fsdp_cuda_check_launch("rmsnorm_forward");
    } else {
        rms_fwd_gen_kernel<<<N, GENERIC_THREADS, 0, s>>>(out, rstd, inp, weight, C, eps, bf16);
        fsdp_cuda_check_launch("rmsnorm_forward_generic");
    }
}

/* Rows [r0, r1) of block b; partial column sums of dout * x * rstd go to part[b * C ...]. The next
 * row's input and output gradient are loaded before the current row's reduction, so the
 * barrier-bound reduction overlaps the next row's memory latency. */
static __device__ __forceinline__ void rms_bwd_vec(void *dinp, float *part, const void *dout, const void *inp,
                                                   const void *weight, const float *rstd, int N, int C, int rows,
                                                   int bf16) {
    __shared__ float sh[32];
    int nch = C / 8, t = threadIdx.x, tpr = blockDim.x;
    int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    fsdp_raw8 wr[BWD_K], xr[BWD_K], dr[BWD_K];
    float acc[BWD_K][8];
#pragma unroll
    for (int k = 0; k < BWD_K; k++) {
        int j = t + k * tpr;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[k][e] = 0.0f;
        if (j < nch) {
            wr[k] = ld_raw8(weight, j, bf16);
            if (r0 < r1) {
                xr[k] = ld_raw8(inp, (size_t)r0 * nch + j, bf16);
                dr[k] = ld_raw8(dout, (size_t)r0 * nch + j, bf16);
            }
        }
    }
    for (int row = r0; row < r1; row++) {
        size_t base = (size_t)row * nch;
        fsdp_raw8 nx[BWD_K], nd[BWD_K], ir[BWD_K];
        float r = rstd[row];
        float gx = 0.0f;
#pragma unroll
        for (int k = 0; k < BWD_K; k++) {
            int j = t + k * tpr;
            if (j < nch) {
                ir[k] = ld_raw8(dinp, base + j, bf16);
                if (row + 1 < r1) {
                    nx[k] = ld_raw8(inp, base + nch + j, bf16);
                    nd[k] = ld_raw8(dout, base + nch + j, bf16);
                }
                float x[8], d[8], w[8];
                unpack8(xr[k], bf16, x);
                unpack8(dr[k], bf16, d);
                unpack8(wr[k], bf16, w);
#pragma unroll
                for (int e = 0; e < 8; e++) gx += d[e] * w[e] * x[e];
            }
        }
        gx = group_sum(gx, sh);
        float kk = gx / (float)C * r * r * r;
#pragma unroll
        for (int k = 0; k < BWD_K; k++) {
            int j = t + k * tpr;
            if (j < nch) {
                float x[8], d[8], w[8], di[8];
                unpack8(xr[k], bf16, x);
                unpack8(dr[k], bf16, d);
                unpack8(wr[k], bf16, w);
                unpack8(ir[k], bf16, di);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    di[e] += r * d[e] * w[e] - kk * x[e];
                    acc[k][e] += d[e] * x[e] * r;
                }
                st8(dinp, base + j, bf16, di);
                xr[k] = nx[k];
                dr[k] = nd[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < BWD_K; k++) {
        int j = t + k * tpr;
        if (j < nch) st8(part, (size_t)blockIdx.x * nch + j, 0, acc[k]);
    }
}
static __global__ void __launch_bounds__(BWD_MAX_TPR_F32)
    rms_bwd_vec_f32(void *dinp, float *part, const void *dout, const void *inp, const void *weight, const float *rstd,
                    int N, int C, int rows) {
    rms_bwd_vec(dinp, part, dout, inp, weight, rstd, N, C, rows, 0);
}
static __global__ void __launch_bounds__(BWD_MAX_TPR)
    rms_bwd_vec_bf16(void *dinp, float *part, const void *dout, const void *inp, const void *weight, const float *rstd,
                     int N, int C, int rows) {
    rms_bwd_vec(dinp, part, dout, inp, weight, rstd, N, C, rows, 1);
}

/* Generic: the block's scratch row is its accumulator (each column belongs to one thread). */
static __device__ __forceinline__ void rms_bwd_gen(void *dinp, float *part, const void *dout, const void *inp,
                                                   const void *weight, const float *rstd, int N, int C, int rows,
                                                   int bf16) {
    __shared__ float sh[32];
    int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    float *acc = part + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) acc[c] = 0.0f;
    for (int row = r0; row < r1; row++) {
        size_t base = (size_t)row * C;
        float r = rstd[row], gx = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            gx += ld1(dout, base + c, bf16) * ld1(weight, c, bf16) * ld1(inp, base + c, bf16);
        gx = group_sum(gx, sh);
        float kk = gx / (float)C * r * r * r;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float x = ld1(inp, base + c, bf16), d = ld1(dout, base + c, bf16), w = ld1(weight, c, bf16);
            st1(dinp, base + c, bf16, ld1(dinp, base + c, bf16) + (r * d * w - kk * x));
            acc[c] += d * x * r;
        }
    }
}
static __global__ void rms_bwd_gen_kernel(void *dinp, float *part, const void *dout, const void *inp,
                                          const void *weight, const float *rstd, int N, int C, int rows, int bf16) {
    if (bf16)
        rms_bwd_gen(dinp, part, dout, inp, weight, rstd, N, C, rows, 1);
    else
        rms_bwd_gen(dinp, part, dout, inp, weight, rstd, N, C, rows, 0);
}

extern "C" void fsdp_cuda_rmsnorm_backward(void *dinp, void *dweight, const void *dout, const void *inp,
                                           const void *weight, const float *rstd, int N, int C, fsdp_dtype act,
                                           fsdp_dtype grad, float *scratch, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = act == FSDP_BF16;
    int G = fsdp_cuda_row_blocks(N), rows = fsdp_cuda_ceil_div(N, G);
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, BWD_K, bf16 ? BWD_MAX_TPR : BWD_MAX_TPR_F32) : 0;
    if (tpr && fsdp_cuda_aligned16(dinp) && fsdp_cuda_aligned16(dout) && fsdp_cuda_aligned16(inp) &&
        fsdp_cuda_aligned16(weight) && fsdp_cuda_aligned16(scratch)) {
        if (bf16)
            rms_bwd_vec_bf16<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows);
        else
            rms_bwd_vec_f32<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows);
        fsdp_cuda_check_launch("rmsnorm_backward");
    } else {
        rms_bwd_gen_kernel<<<G, GENERIC_THREADS, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows, bf16);
        fsdp_cuda_check_launch("rmsnorm_backward_generic");
    }
    fsdp_cuda_colsum_finalize(dweight, NULL, scratch, G, C, grad, s);
}

/* ================================================================================================
 * LayerNorm (bias optional in both directions)
 * ================================================================================================ */

static __device__ __forceinline__ void ln_fwd_vec(void *out, float *mean, float *rstd, const void *inp,
                                                  const void *weight, const void *bias, int N, int C, float eps,
                                                  int bf16) {
    __shared__ float sh[32 * (FWD_MAX_TPR / 32)];
    int row = blockIdx.x * blockDim.y + threadIdx.y, valid = row < N;
    int nch = C / 8, t = threadIdx.x, tpr = blockDim.x;
    size_t base = (size_t)row * nch;
    fsdp_raw8 xr[FWD_K];
    load_row_chunks(xr, inp, base, nch, t, tpr, valid, bf16);
    float sum = chunk_sum(xr, nch, t, tpr, valid, bf16, 0.0f, 0);
    float m = group_sum(sum, sh) / (float)C;
    /* Second pass over the registers: the variance of (x - mean) has no cancellation problem. */
    float var = chunk_sum(xr, nch, t, tpr, valid, bf16, m, 1);
    var = group_sum(var, sh);
    if (!valid) return;
    float r = rsqrtf(var / (float)C + eps);
#pragma unroll
    for (int k = 0; k < FWD_K; k++) {
        int j = t + k * tpr;
        if (j < nch) {
            float v[8], w[8], b[8];
            unpack8(xr[k], bf16, v);
            ld8(weight, j, bf16, w);
            if (bias) {
                ld8(bias, j, bf16, b);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) b[e] = 0.0f;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = (v[e] - m) * r * w[e] + b[e];
            st8(out, base + j, bf16, v);
        }
    }
    if (t == 0) mean[row] = m, rstd[row] = r;
}
static __global__ void __launch_bounds__(FWD_MAX_TPR)
    ln_fwd_vec_f32(void *out, float *mean, float *rstd, const void *inp, const void *weight, const void *bias, int N,
                   int C, float eps) {
    ln_fwd_vec(out, mean, rstd, inp, weight, bias, N, C, eps, 0);
}
static __global__ void __launch_bounds__(FWD_MAX_TPR)
    ln_fwd_vec_bf16(void *out, float *mean, float *rstd, const void *inp, const void *weight, const void *bias, int N,
                    int C, float eps) {
    ln_fwd_vec(out, mean, rstd, inp, weight, bias, N, C, eps, 1);
}

static __device__ __forceinline__ void ln_fwd_gen(void *out, float *mean, float *rstd, const void *inp,
                                                  const void *weight, const void *bias, int C, float eps, int bf16) {
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * C;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += ld1(inp, base + c, bf16);
    float m = group_sum(sum, sh) / (float)C;
    float var = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = ld1(inp, base + c, bf16) - m;
        var += v * v;
    }
    var = group_sum(var, sh);
    float r = rsqrtf(var / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float b = bias ? ld1(bias, c, bf16) : 0.0f;
        st1(out, base + c, bf16, (ld1(inp, base + c, bf16) - m) * r * ld1(weight, c, bf16) + b);
    }
    if (threadIdx.x == 0) mean[blockIdx.x] = m, rstd[blockIdx.x] = r;
}
static __global__ void ln_fwd_gen_kernel(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                                         const void *bias, int C, float eps, int bf16) {
    if (bf16)
        ln_fwd_gen(out, mean, rstd, inp, weight, bias, C, eps, 1);
    else
        ln_fwd_gen(out, mean, rstd, inp, weight, bias, C, eps, 0);
}

extern "C" void fsdp_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                                            const void *bias, int N, int C, float eps, fsdp_dtype act, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = act == FSDP_BF16;
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, FWD_K, FWD_MAX_TPR) : 0;
    if (tpr && fsdp_cuda_aligned16(out) && fsdp_cuda_aligned16(inp) && fsdp_cuda_aligned16(weight) &&
        fsdp_cuda_aligned16(bias)) {
        int rpb = tpr >= 256 ? 1 : 256 / tpr;
        dim3 block(tpr, rpb);
        unsigned grid = (unsigned)fsdp_cuda_ceil_div(N, rpb);
        if (bf16)
            ln_fwd_vec_bf16<<<grid, block, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
        else
            ln_fwd_vec_f32<<<grid, block, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
        fsdp_cuda_check_launch("layernorm_forward");
    } else {
        ln_fwd_gen_kernel<<<N, GENERIC_THREADS, 0, s>>>(out, mean, rstd, inp, weight, bias, C, eps, bf16);
        fsdp_cuda_check_launch("layernorm_forward_generic");
    }
}

/* As rms_bwd_vec, with two partial rows per block: weight at part[b * C], bias at part[(G + b) * C]. */
static __device__ __forceinline__ void ln_bwd_vec(void *dinp, float *part, const void *dout, const void *inp,
                                                  const void *weight, const float *mean, const float *rstd, int N,
                                                  int C, int rows, int bf16) {
    __shared__ float sh[64];
    int nch = C / 8, t = threadIdx.x, tpr = blockDim.x;
    int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    fsdp_raw8 wr[BWD_K], xr[BWD_K], dr[BWD_K];
    float accw[BWD_K][8], accb[BWD_K][8];
#pragma unroll
    for (int k = 0; k < BWD_K; k++) {
        int j = t + k * tpr;
#pragma unroll
        for (int e = 0; e < 8; e++) accw[k][e] = 0.0f, accb[k][e] = 0.0f;
        if (j < nch) {
            wr[k] = ld_raw8(weight, j, bf16);
            if (r0 < r1) {
                xr[k] = ld_raw8(inp, (size_t)r0 * nch + j, bf16);
                dr[k] = ld_raw8(dout, (size_t)r0 * nch + j, bf16);
            }
        }
    }
    for (int row = r0; row < r1; row++) {
        size_t base = (size_t)row * nch;
        fsdp_raw8 nx[BWD_K], nd[BWD_K], ir[BWD_K];
        float m = mean[row], r = rstd[row];
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < BWD_K; k++) {
            int j = t + k * tpr;
            if (j < nch) {
                ir[k] = ld_raw8(dinp, base + j, bf16);
                if (row + 1 < r1) {
                    nx[k] = ld_raw8(inp, base + nch + j, bf16);
                    nd[k] = ld_raw8(dout, base + nch + j, bf16);
                }
                float x[8], d[8], w[8];
                unpack8(xr[k], bf16, x);
                unpack8(dr[k], bf16, d);
                unpack8(wr[k], bf16, w);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float g = d[e] * w[e];
                    sg += g;
                    sgx += g * ((x[e] - m) * r);
                }
            }
        }
        float2 sums = group_sum2(sg, sgx, sh);
        float mg = sums.x / (float)C, mgx = sums.y / (float)C;
#pragma unroll
        for (int k = 0; k < BWD_K; k++) {
            int j = t + k * tpr;
            if (j < nch) {
                float x[8], d[8], w[8], di[8];
                unpack8(xr[k], bf16, x);
                unpack8(dr[k], bf16, d);
                unpack8(wr[k], bf16, w);
                unpack8(ir[k], bf16, di);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float xhat = (x[e] - m) * r;
                    di[e] += r * (d[e] * w[e] - mg - xhat * mgx);
                    accw[k][e] += d[e] * xhat;
                    accb[k][e] += d[e];
                }
                st8(dinp, base + j, bf16, di);
                xr[k] = nx[k];
                dr[k] = nd[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < BWD_K; k++) {
        int j = t + k * tpr;
        if (j < nch) {
            st8(part, (size_t)blockIdx.x * nch + j, 0, accw[k]);
            st8(part, (size_t)(gridDim.x + blockIdx.x) * nch + j, 0, accb[k]);
        }
    }
}
static __global__ void __launch_bounds__(BWD_MAX_TPR_F32)
    ln_bwd_vec_f32(void *dinp, float *part, const void *dout, const void *inp, const void *weight, const float *mean,
                   const float *rstd, int N, int C, int rows) {
    ln_bwd_vec(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 0);
}
static __global__ void __launch_bounds__(BWD_MAX_TPR)
    ln_bwd_vec_bf16(void *dinp, float *part, const void *dout, const void *inp, const void *weight, const float *mean,
                    const float *rstd, int N, int C, int rows) {
    ln_bwd_vec(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 1);
}

static __device__ __forceinline__ void ln_bwd_gen(void *dinp, float *part, const void *dout, const void *inp,
                                                  const void *weight, const float *mean, const float *rstd, int N,
                                                  int C, int rows, int bf16) {
    __shared__ float sh[64];
    int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    float *accw = part + (size_t)blockIdx.x * C, *accb = part + (size_t)(gridDim.x + blockIdx.x) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) accw[c] = 0.0f, accb[c] = 0.0f;
    for (int row = r0; row < r1; row++) {
        size_t base = (size_t)row * C;
        float m = mean[row], r = rstd[row], sg = 0.0f, sgx = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float g = ld1(dout, base + c, bf16) * ld1(weight, c, bf16);
            sg += g;
            sgx += g * ((ld1(inp, base + c, bf16) - m) * r);
        }
        float2 sums = group_sum2(sg, sgx, sh);
        float mg = sums.x / (float)C, mgx = sums.y / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float d = ld1(dout, base + c, bf16), xhat = (ld1(inp, base + c, bf16) - m) * r;
            float di = ld1(dinp, base + c, bf16) + r * (d * ld1(weight, c, bf16) - mg - xhat * mgx);
            st1(dinp, base + c, bf16, di);
            accw[c] += d * xhat;
            accb[c] += d;
        }
    }
}
static __global__ void ln_bwd_gen_kernel(void *dinp, float *part, const void *dout, const void *inp, const void *weight,
                                         const float *mean, const float *rstd, int N, int C, int rows, int bf16) {
    if (bf16)
        ln_bwd_gen(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 1);
    else
        ln_bwd_gen(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 0);
}

extern "C" void fsdp_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, const void *dout, const void *inp,
                                             const void *weight, const float *mean, const float *rstd, int N, int C,
                                             fsdp_dtype act, fsdp_dtype grad, float *scratch, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int bf16 = act == FSDP_BF16;
    int G = fsdp_cuda_row_blocks(N), rows = fsdp_cuda_ceil_div(N, G);
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, BWD_K, bf16 ? BWD_MAX_TPR : BWD_MAX_TPR_F32) : 0;
    if (tpr && fsdp_cuda_aligned16(dinp) && fsdp_cuda_aligned16(dout) && fsdp_cuda_aligned16(inp) &&
        fsdp_cuda_aligned16(weight) && fsdp_cuda_aligned16(scratch)) {
        if (bf16)
            ln_bwd_vec_bf16<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows);
        else
            ln_bwd_vec_f32<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows);
        fsdp_cuda_check_launch("layernorm_backward");
    } else {
        ln_bwd_gen_kernel<<<G, GENERIC_THREADS, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows, bf16);
        fsdp_cuda_check_launch("layernorm_backward_generic");
    }
    fsdp_cuda_colsum_finalize(dweight, dbias, scratch, G, C, grad, s);
}
