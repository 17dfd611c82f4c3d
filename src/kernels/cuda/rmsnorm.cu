/* RMSNorm forward and backward (the CUDA twin of cpu_rmsnorm_* in src/kernels/cpu/norms.c), and
 * the same kernels with the residual dropout fused (the row layout, the paths and the fusion are
 * described in norms_common.cuh). Each body takes `drop` as a literal: the drop = 0 kernels are the
 * plain norms, unchanged by the fusion. */
#include "norms_common.cuh"

/* ---- forward ----------------------------------------------------------------------------------- */

static __device__ __forceinline__ void rms_fwd_vec(void *out, float *rstd, const void *inp, const void *weight, int N,
                                                   int C, float eps, int bf16, int drop, const norm_drop &nd) {
    __shared__ float sh[32 * (FWD_MAX_TPR / 32)];
    int row = blockIdx.x * blockDim.y + threadIdx.y, valid = row < N;
    int nch = C / 8, t = threadIdx.x, tpr = blockDim.x;
    size_t base = (size_t)row * nch;
    fsdp_raw8 xr[FWD_K];
    if (drop)
        load_dropout_row_chunks(xr, inp, nd, row, base, nch, t, tpr, valid, bf16);
    else
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
    const norm_drop none{};
    rms_fwd_vec(out, rstd, inp, weight, N, C, eps, 0, 0, none);
}
static __global__ void __launch_bounds__(FWD_MAX_TPR)
    rms_fwd_vec_bf16(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps) {
    const norm_drop none{};
    rms_fwd_vec(out, rstd, inp, weight, N, C, eps, 1, 0, none);
}
static __global__ void __launch_bounds__(FWD_MAX_TPR) rms_fwd_drop_vec_f32(void *out, float *rstd, const void *inp,
                                                                           const void *weight, int N, int C, float eps,
                                                                           const norm_drop nd) {
    rms_fwd_vec(out, rstd, inp, weight, N, C, eps, 0, 1, nd);
}
static __global__ void __launch_bounds__(FWD_MAX_TPR) rms_fwd_drop_vec_bf16(void *out, float *rstd, const void *inp,
                                                                            const void *weight, int N, int C,
                                                                            float eps, const norm_drop nd) {
    rms_fwd_vec(out, rstd, inp, weight, N, C, eps, 1, 1, nd);
}

static __device__ __forceinline__ void rms_fwd_gen(void *out, float *rstd, const void *inp, const void *weight, int C,
                                                   float eps, int bf16, int drop, const norm_drop &nd) {
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * C;
    if (drop) {
        dropout_row_generic(inp, nd, blockIdx.x, C, bf16);
        inp = nd.res_out;
    }
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
    const norm_drop none{};
    if (bf16)
        rms_fwd_gen(out, rstd, inp, weight, C, eps, 1, 0, none);
    else
        rms_fwd_gen(out, rstd, inp, weight, C, eps, 0, 0, none);
}
static __global__ void rms_fwd_drop_gen_kernel(void *out, float *rstd, const void *inp, const void *weight, int C,
                                               float eps, int bf16, const norm_drop nd) {
    if (bf16)
        rms_fwd_gen(out, rstd, inp, weight, C, eps, 1, 1, nd);
    else
        rms_fwd_gen(out, rstd, inp, weight, C, eps, 0, 1, nd);
}

/* nd NULL: the plain norm of inp; else the norm of inp + dropout(nd->x), written to nd->res_out. */
static void rms_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C, float eps,
                        fsdp_dtype act, cudaStream_t s, const norm_drop *nd) {
    if (N <= 0 || C <= 0) return;
    int bf16 = act == FSDP_BF16;
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, FWD_K, FWD_MAX_TPR) : 0;
    int aligned = fsdp_cuda_aligned16(out) && fsdp_cuda_aligned16(inp) && fsdp_cuda_aligned16(weight);
    if (nd) aligned = aligned && fsdp_cuda_aligned16(nd->res_out) && fsdp_cuda_aligned16(nd->x);
    if (tpr && aligned) {
        int rpb = tpr >= 256 ? 1 : 256 / tpr;
        dim3 block(tpr, rpb);
        unsigned grid = (unsigned)fsdp_cuda_ceil_div(N, rpb);
        if (nd && bf16)
            rms_fwd_drop_vec_bf16<<<grid, block, 0, s>>>(out, rstd, inp, weight, N, C, eps, *nd);
        else if (nd)
            rms_fwd_drop_vec_f32<<<grid, block, 0, s>>>(out, rstd, inp, weight, N, C, eps, *nd);
        else if (bf16)
            rms_fwd_vec_bf16<<<grid, block, 0, s>>>(out, rstd, inp, weight, N, C, eps);
        else
            rms_fwd_vec_f32<<<grid, block, 0, s>>>(out, rstd, inp, weight, N, C, eps);
        fsdp_cuda_check_launch(nd ? "rmsnorm_dropout_forward" : "rmsnorm_forward");
    } else if (nd) {
        rms_fwd_drop_gen_kernel<<<N, GENERIC_THREADS, 0, s>>>(out, rstd, inp, weight, C, eps, bf16, *nd);
        fsdp_cuda_check_launch("rmsnorm_dropout_forward_generic");
    } else {
        rms_fwd_gen_kernel<<<N, GENERIC_THREADS, 0, s>>>(out, rstd, inp, weight, C, eps, bf16);
        fsdp_cuda_check_launch("rmsnorm_forward_generic");
    }
}

extern "C" void fsdp_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C,
                                          float eps, fsdp_dtype act, cudaStream_t s) {
    rms_forward(out, rstd, inp, weight, N, C, eps, act, s, NULL);
}

extern "C" void fsdp_cuda_rmsnorm_dropout_forward(void *res_out, void *out, float *rstd, const void *residual,
                                                  const void *x, const void *weight, int N, int T, int C, float eps,
                                                  const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s) {
    const norm_drop nd = norm_drop_make(res_out, x, NULL, drop, N, T, C);
    rms_forward(out, rstd, residual, weight, N, C, eps, act, s, &nd);
}

/* ---- backward ---------------------------------------------------------------------------------- */

/* Rows [r0, r1) of block b; partial column sums of dout * x * rstd go to part[b * C ...]. The next
 * row's input and output gradient are loaded before the current row's reduction, so the
 * barrier-bound reduction overlaps the next row's memory latency. With drop, the row's keep bits
 * are drawn while its loads are in flight. */
static __device__ __forceinline__ void rms_bwd_vec(void *dinp, float *part, const void *dout, const void *inp,
                                                   const void *weight, const float *rstd, int N, int C, int rows,
                                                   int bf16, int drop, const norm_drop &nd) {
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
        fsdp_raw8 nx[BWD_K], nd_[BWD_K], ir[BWD_K];
        unsigned bits[BWD_K];
        float r = rstd[row];
        float gx = 0.0f;
#pragma unroll
        for (int k = 0; k < BWD_K; k++) {
            int j = t + k * tpr;
            if (j < nch) {
                ir[k] = ld_raw8(dinp, base + j, bf16);
                if (row + 1 < r1) {
                    nx[k] = ld_raw8(inp, base + nch + j, bf16);
                    nd_[k] = ld_raw8(dout, base + nch + j, bf16);
                }
                if (drop) bits[k] = norm_drop_bits(nd, row, C, j);
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
                if (drop) {
                    float g[8];
                    dropout_grad8(g, di, bits[k], nd.active ? nd.d.scale : 1.0f, bf16);
                    st8(nd.dx, base + j, bf16, g);
                }
                xr[k] = nx[k];
                dr[k] = nd_[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < BWD_K; k++) {
        int j = t + k * tpr;
        if (j < nch) st8(part, (size_t)blockIdx.x * nch + j, 0, acc[k]);
    }
}
#define RMS_BWD_ARGS                                                                                                   \
    void *dinp, float *part, const void *dout, const void *inp, const void *weight, const float *rstd, int N, int C,   \
        int rows
static __global__ void __launch_bounds__(BWD_MAX_TPR_F32) rms_bwd_vec_f32(RMS_BWD_ARGS) {
    const norm_drop none{};
    rms_bwd_vec(dinp, part, dout, inp, weight, rstd, N, C, rows, 0, 0, none);
}
static __global__ void __launch_bounds__(BWD_MAX_TPR) rms_bwd_vec_bf16(RMS_BWD_ARGS) {
    const norm_drop none{};
    rms_bwd_vec(dinp, part, dout, inp, weight, rstd, N, C, rows, 1, 0, none);
}
static __global__ void __launch_bounds__(BWD_MAX_TPR_F32) rms_bwd_drop_vec_f32(RMS_BWD_ARGS, const norm_drop nd) {
    rms_bwd_vec(dinp, part, dout, inp, weight, rstd, N, C, rows, 0, 1, nd);
}
static __global__ void __launch_bounds__(BWD_MAX_TPR) rms_bwd_drop_vec_bf16(RMS_BWD_ARGS, const norm_drop nd) {
    rms_bwd_vec(dinp, part, dout, inp, weight, rstd, N, C, rows, 1, 1, nd);
}

/* Generic: the block's scratch row is its accumulator (each column belongs to one thread). */
static __device__ __forceinline__ void rms_bwd_gen(void *dinp, float *part, const void *dout, const void *inp,
                                                   const void *weight, const float *rstd, int N, int C, int rows,
                                                   int bf16, int drop, const norm_drop &nd) {
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
            float di = ld1(dinp, base + c, bf16) + (r * d * w - kk * x);
            st1(dinp, base + c, bf16, di);
            acc[c] += d * x * r;
            if (drop) {
                const int keep = !nd.active || fsdp_dropout_keep_row(&nd.d, row, nd.T, C, c);
                const float g = keep ? (bf16 ? round_bf16(di) : di) * (nd.active ? nd.d.scale : 1.0f) : 0.0f;
                st1(nd.dx, base + c, bf16, g);
            }
        }
    }
}
static __global__ void rms_bwd_gen_kernel(RMS_BWD_ARGS, int bf16) {
    const norm_drop none{};
    if (bf16)
        rms_bwd_gen(dinp, part, dout, inp, weight, rstd, N, C, rows, 1, 0, none);
    else
        rms_bwd_gen(dinp, part, dout, inp, weight, rstd, N, C, rows, 0, 0, none);
}
static __global__ void rms_bwd_drop_gen_kernel(RMS_BWD_ARGS, int bf16, const norm_drop nd) {
    if (bf16)
        rms_bwd_gen(dinp, part, dout, inp, weight, rstd, N, C, rows, 1, 1, nd);
    else
        rms_bwd_gen(dinp, part, dout, inp, weight, rstd, N, C, rows, 0, 1, nd);
}

static void rms_backward(void *dinp, void *dweight, const void *dout, const void *inp, const void *weight,
                         const float *rstd, int N, int C, fsdp_dtype act, fsdp_dtype grad, float *scratch,
                         cudaStream_t s, const norm_drop *nd) {
    if (N <= 0 || C <= 0) return;
    int bf16 = act == FSDP_BF16;
    int G = fsdp_cuda_row_blocks(N), rows = fsdp_cuda_ceil_div(N, G);
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, BWD_K, bf16 ? BWD_MAX_TPR : BWD_MAX_TPR_F32) : 0;
    int aligned = fsdp_cuda_aligned16(dinp) && fsdp_cuda_aligned16(dout) && fsdp_cuda_aligned16(inp) &&
                  fsdp_cuda_aligned16(weight) && fsdp_cuda_aligned16(scratch);
    if (nd) aligned = aligned && fsdp_cuda_aligned16(nd->dx);
    if (tpr && aligned) {
        if (nd && bf16)
            rms_bwd_drop_vec_bf16<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows, *nd);
        else if (nd)
            rms_bwd_drop_vec_f32<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows, *nd);
        else if (bf16)
            rms_bwd_vec_bf16<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows);
        else
            rms_bwd_vec_f32<<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows);
        fsdp_cuda_check_launch(nd ? "rmsnorm_dropout_backward" : "rmsnorm_backward");
    } else if (nd) {
        rms_bwd_drop_gen_kernel<<<G, GENERIC_THREADS, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows, bf16,
                                                              *nd);
        fsdp_cuda_check_launch("rmsnorm_dropout_backward_generic");
    } else {
        rms_bwd_gen_kernel<<<G, GENERIC_THREADS, 0, s>>>(dinp, scratch, dout, inp, weight, rstd, N, C, rows, bf16);
        fsdp_cuda_check_launch("rmsnorm_backward_generic");
    }
    fsdp_cuda_colsum_finalize(dweight, NULL, scratch, G, C, grad, s);
}

extern "C" void fsdp_cuda_rmsnorm_backward(void *dinp, void *dweight, const void *dout, const void *inp,
                                           const void *weight, const float *rstd, int N, int C, fsdp_dtype act,
                                           fsdp_dtype grad, float *scratch, cudaStream_t s) {
    rms_backward(dinp, dweight, dout, inp, weight, rstd, N, C, act, grad, scratch, s, NULL);
}

extern "C" void fsdp_cuda_rmsnorm_dropout_backward(void *dinp, void *dx, void *dweight, const void *dout,
                                                   const void *inp, const void *weight, const float *rstd, int N,
                                                   int T, int C, const fsdp_dropout *drop, fsdp_dtype act,
                                                   fsdp_dtype grad, float *scratch, cudaStream_t s) {
    const norm_drop nd = norm_drop_make(NULL, NULL, dx, drop, N, T, C);
    rms_backward(dinp, dweight, dout, inp, weight, rstd, N, C, act, grad, scratch, s, &nd);
}
