/* Per-head RMSNorm of the query and key heads (Qwen3's q_norm and k_norm): fsdp_cuda_qk_norm_forward
 * and fsdp_cuda_qk_norm_backward of ops_cuda.h (CPU twins in src/kernels/cpu/qk_norm.c).
 *
 * One warp per head row of qkv [N, (Hq + 2 Hkv) D] (D <= QKN_DMAX): lane l owns elements l + 32 i,
 * loads them once, reduces the sum of squares (forward) or sum dy w x (backward) across the warp,
 * and writes its own elements, which is what lets the backward's dinp alias dout. Value heads are
 * copied by the same warps. The weights' gradients are the two-pass column sums of cuda_common.cuh:
 * row block b (fsdp_cuda_row_blocks over the N tokens) sums its tokens' heads per channel into
 * partial row b of the scratch (q then k), run before the row pass that may overwrite dout, and
 * fsdp_cuda_colsum_finalize adds the partials in a fixed order. fp32 arithmetic; deterministic. */
#include <math.h>

#include "cuda_common.cuh"

#define QKN_WARPS 8
#define QKN_DMAX 256
#define QKN_E (QKN_DMAX / 32)

static __device__ __forceinline__ void qkn_fwd_body(void *out, float *rstd, const void *inp, const void *wq,
                                                    const void *wk, int N, int Hq, int Hkv, int D, float eps,
                                                    int bf16) {
    const int lane = threadIdx.x & 31, H = Hq + Hkv, R = H + Hkv;
    const long long row = (long long)blockIdx.x * QKN_WARPS + (threadIdx.x >> 5);
    if (row >= (long long)N * R) return;
    const long long n = row / R;
    const int h = (int)(row % R);
    const size_t at = (size_t)n * R * D + (size_t)h * D;
    float x[QKN_E];
#pragma unroll
    for (int i = 0; i < QKN_E; i++) x[i] = lane + 32 * i < D ? ld1(inp, at + lane + 32 * i, bf16) : 0.0f;
    if (h >= H) { /* a value head: copied */
#pragma unroll
        for (int i = 0; i < QKN_E; i++)
            if (lane + 32 * i < D) st1(out, at + lane + 32 * i, bf16, x[i]);
        return;
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < QKN_E; i++) ss = fmaf(x[i], x[i], ss);
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / (float)D + eps);
    const void *w = h < Hq ? wq : wk;
#pragma unroll
    for (int i = 0; i < QKN_E; i++)
        if (lane + 32 * i < D) st1(out, at + lane + 32 * i, bf16, x[i] * r * ld1(w, lane + 32 * i, bf16));
    if (lane == 0) rstd[n * H + h] = r;
}

static __device__ __forceinline__ void qkn_bwd_body(void *dinp, const void *dout, const void *inp, const void *wq,
                                                    const void *wk, const float *rstd, int N, int Hq, int Hkv, int D,
                                                    int bf16) {
    const int lane = threadIdx.x & 31, H = Hq + Hkv, R = H + Hkv;
    const long long row = (long long)blockIdx.x * QKN_WARPS + (threadIdx.x >> 5);
    if (row >= (long long)N * R) return;
    const long long n = row / R;
    const int h = (int)(row % R);
    const size_t at = (size_t)n * R * D + (size_t)h * D;
    float dy[QKN_E];
#pragma unroll
    for (int i = 0; i < QKN_E; i++) dy[i] = lane + 32 * i < D ? ld1(dout, at + lane + 32 * i, bf16) : 0.0f;
    if (h >= H) {
        if (dinp != dout)
#pragma unroll
            for (int i = 0; i < QKN_E; i++)
                if (lane + 32 * i < D) st1(dinp, at + lane + 32 * i, bf16, dy[i]);
        return;
    }
    const void *w = h < Hq ? wq : wk;
    float x[QKN_E], wd[QKN_E], gx = 0.0f;
#pragma unroll
    for (int i = 0; i < QKN_E; i++) {
        const int ok = lane + 32 * i < D;
        x[i] = ok ? ld1(inp, at + lane + 32 * i, bf16) : 0.0f;
        wd[i] = ok ? ld1(w, lane + 32 * i, bf16) * dy[i] : 0.0f;
        gx = fmaf(wd[i], x[i], gx);
    }
    gx = warp_sum(gx);
    const float r = rstd[n * H + h], k = gx / (float)D * r * r * r;
#pragma unroll
    for (int i = 0; i < QKN_E; i++)
        if (lane + 32 * i < D) st1(dinp, at + lane + 32 * i, bf16, r * wd[i] - k * x[i]);
}

/* Partial rows of the weights' gradients: thread c < D sums channel c of the query heads, thread
 * D + c of the key heads, over the tokens of row block blockIdx.x, in order. */
static __device__ __forceinline__ void qkn_dw_body(float *part, const void *dout, const void *inp, const float *rstd,
                                                   int N, int Hq, int Hkv, int D, int rows, int bf16) {
    const int t = threadIdx.x;
    if (t >= 2 * D) return;
    const int k = t >= D, c = t - k * D, H = Hq + Hkv, R = H + Hkv, h0 = k ? Hq : 0, h1 = k ? H : Hq;
    const int n0 = blockIdx.x * rows, n1 = min(n0 + rows, N);
    float acc = 0.0f;
    for (int n = n0; n < n1; n++)
        for (int h = h0; h < h1; h++) {
            const size_t at = (size_t)n * R * D + (size_t)h * D + c;
            acc = fmaf(ld1(dout, at, bf16) * ld1(inp, at, bf16), rstd[(size_t)n * H + h], acc);
        }
    part[((size_t)k * gridDim.x + blockIdx.x) * D + c] = acc;
}

__global__ void __launch_bounds__(QKN_WARPS * 32)
    qkn_fwd_f32(void *o, float *r, const void *x, const void *wq, const void *wk, int N, int Hq, int Hkv, int D, float e) {
    qkn_fwd_body(o, r, x, wq, wk, N, Hq, Hkv, D, e, 0);
}
__global__ void __launch_bounds__(QKN_WARPS * 32)
    qkn_fwd_bf16(void *o, float *r, const void *x, const void *wq, const void *wk, int N, int Hq, int Hkv, int D, float e) {
    qkn_fwd_body(o, r, x, wq, wk, N, Hq, Hkv, D, e, 1);
}
__global__ void __launch_bounds__(QKN_WARPS * 32) qkn_bwd_f32(void *dx, const void *dy, const void *x, const void *wq,
                                                              const void *wk, const float *r, int N, int Hq, int Hkv,
                                                              int D) {
    qkn_bwd_body(dx, dy, x, wq, wk, r, N, Hq, Hkv, D, 0);
}
__global__ void __launch_bounds__(QKN_WARPS * 32) qkn_bwd_bf16(void *dx, const void *dy, const void *x, const void *wq,
                                                               const void *wk, const float *r, int N, int Hq, int Hkv,
                                                               int D) {
    qkn_bwd_body(dx, dy, x, wq, wk, r, N, Hq, Hkv, D, 1);
}
__global__ void __launch_bounds__(2 * QKN_DMAX) qkn_dw_f32(float *part, const void *dy, const void *x, const float *r,
                                                          int N, int Hq, int Hkv, int D, int rows) {
    qkn_dw_body(part, dy, x, r, N, Hq, Hkv, D, rows, 0);
}
__global__ void __launch_bounds__(2 * QKN_DMAX) qkn_dw_bf16(float *part, const void *dy, const void *x, const float *r,
                                                           int N, int Hq, int Hkv, int D, int rows) {
    qkn_dw_body(part, dy, x, r, N, Hq, Hkv, D, rows, 1);
}

static void qkn_check(const char *op, int N, int Hq, int Hkv, int D) {
    if (N < 0 || Hq < 1 || Hkv < 1 || D < 1 || D > QKN_DMAX)
        fsdp_fatal("%s: unsupported shape N=%d Hq=%d Hkv=%d D=%d (1 <= D <= %d)", op, N, Hq, Hkv, D, QKN_DMAX);
}

static unsigned qkn_blocks(int N, int Hq, int Hkv) {
    return (unsigned)(((long long)N * (Hq + 2 * Hkv) + QKN_WARPS - 1) / QKN_WARPS);
}

extern "C" void fsdp_cuda_qk_norm_forward(void *out, float *rstd, const void *inp, const void *wq, const void *wk,
                                          int N, int Hq, int Hkv, int D, float eps, fsdp_dtype act, cudaStream_t s) {
    qkn_check("fsdp_cuda_qk_norm_forward", N, Hq, Hkv, D);
    if (N == 0) return;
    if (act == FSDP_BF16)
        qkn_fwd_bf16<<<qkn_blocks(N, Hq, Hkv), QKN_WARPS * 32, 0, s>>>(out, rstd, inp, wq, wk, N, Hq, Hkv, D, eps);
    else
        qkn_fwd_f32<<<qkn_blocks(N, Hq, Hkv), QKN_WARPS * 32, 0, s>>>(out, rstd, inp, wq, wk, N, Hq, Hkv, D, eps);
    fsdp_cuda_check_launch("qk_norm_forward");
}

extern "C" void fsdp_cuda_qk_norm_backward(void *dinp, void *dwq, void *dwk, const void *dout, const void *inp,
                                           const void *wq, const void *wk, const float *rstd, int N, int Hq, int Hkv,
                                           int D, fsdp_dtype act, fsdp_dtype grad, float *scratch, cudaStream_t s) {
    qkn_check("fsdp_cuda_qk_norm_backward", N, Hq, Hkv, D);
    if (N == 0) return;
    const int G = fsdp_cuda_row_blocks(N), rows = fsdp_cuda_ceil_div(N, G);
    const int threads = (2 * D + 31) / 32 * 32;
    /* The weights' partials first: the row pass may overwrite dout (dinp == dout). */
    if (act == FSDP_BF16)
        qkn_dw_bf16<<<G, threads, 0, s>>>(scratch, dout, inp, rstd, N, Hq, Hkv, D, rows);
    else
        qkn_dw_f32<<<G, threads, 0, s>>>(scratch, dout, inp, rstd, N, Hq, Hkv, D, rows);
    fsdp_cuda_check_launch("qk_norm_weight_grad");
    fsdp_cuda_colsum_finalize(dwq, dwk, scratch, G, D, grad, s);
    if (act == FSDP_BF16)
        qkn_bwd_bf16<<<qkn_blocks(N, Hq, Hkv), QKN_WARPS * 32, 0, s>>>(dinp, dout, inp, wq, wk, rstd, N, Hq, Hkv, D);
    else
        qkn_bwd_f32<<<qkn_blocks(N, Hq, Hkv), QKN_WARPS * 32, 0, s>>>(dinp, dout, inp, wq, wk, rstd, N, Hq, Hkv, D);
    fsdp_cuda_check_launch("qk_norm_backward");
}
