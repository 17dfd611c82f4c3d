/* RMSNorm and LayerNorm, forward and backward (the CUDA twins of cpu_rmsnorm_* and cpu_layernorm_*
 * in src/kernels/cpu/norms.c), with the residual dropout optionally fused. One pipeline serves
 * both norms: RMSNorm is its no-mean, no-bias case. The bodies are templates on LN (0: RMSNorm,
 * 1: LayerNorm) and DROP (fused dropout), the fast path's also on BF16 (storage dtype; the generic
 * kernels branch on it once), so each kernel compiles to the code of its own case alone: the
 * loads, reductions and stores are shared, only the per-element arithmetic differs.
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
 * keeps per-column partial sums in registers and writes them to scratch row b (LayerNorm: weight
 * partials at part[b * C], bias partials at part[(G + b) * C]); a second kernel
 * (fsdp_cuda_colsum_finalize, reduce.cu) adds the partial rows in a fixed order into the
 * gradient. No atomics anywhere, so runs repeat bit for bit on any GPU.
 *
 * Fused residual dropout (the *_dropout launchers; kernels instantiated separately with DROP = 1,
 * so the plain kernels are unchanged): the forward builds each row as residual + keep . x /
 * (1 - p), rounds it to the storage dtype, writes it as the new residual stream and normalises the
 * rounded row already in registers (one read of residual and x, one write of each output, where
 * the unfused pair would write and re-read the residual). The backward, once a row's dinp is
 * complete, also writes dx = keep . dinp / (1 - p) of the rounded dinp. Masks follow
 * src/kernels/dropout.h: row n is position n % T of sample sample_base + n / T, and the 8 elements
 * of a chunk are two whole Philox groups because C is a multiple of 8 on the fast path. */
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

/* The residual dropout a norm kernel fuses (drop = 1 kernels only). */
typedef struct {
    void *res_out;  /* forward: residual + keep . x / (1 - p), written (may alias the residual) */
    const void *x;  /* forward: the branch output */
    void *dx;       /* backward: keep . dinp / (1 - p), written */
    fsdp_dropout d;
    int T;          /* rows per sample */
    int active;     /* d draws a mask; 0 makes the kernels a plain add / copy */
} norm_drop;

/* Threads per row for `nch` chunks at `k` per thread: a multiple of 32, or 0 when the row does not
 * fit in `max_tpr` threads' registers (the generic path takes it). */
static inline int threads_per_row(int nch, int k, int max_tpr) {
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

/* Keep bits of chunk j of row `row` (all kept when the dropout is inactive). */
static __device__ __forceinline__ unsigned norm_drop_bits(const norm_drop &nd, int row, int C, int j) {
    if (!nd.active) return 0xffu;
    const uint64_t e = (uint64_t)(row % nd.T) * (uint64_t)C + 8u * (uint64_t)j;
    return drop_bits8(nd.d, nd.d.sample_base + row / nd.T, e >> 2);
}

/* load_row_chunks of the row residual + keep . x / (1 - p), rounded to storage form and written
 * to nd.res_out on the way. */
static __device__ __forceinline__ void load_dropout_row_chunks(fsdp_raw8 xr[FWD_K], const void *residual,
                                                               const norm_drop &nd, int row, size_t base, int nch,
                                                               int t, int tpr, int valid, int bf16) {
    const float scale = nd.active ? nd.d.scale : 1.0f;
#pragma unroll
    for (int k = 0; k < FWD_K; k++) {
        int j = t + k * tpr;
        if (valid && j < nch) {
            const unsigned bits = norm_drop_bits(nd, row, nch * 8, j);
            float r[8], v[8];
            ld8(residual, base + j, bf16, r);
            ld8(nd.x, base + j, bf16, v);
#pragma unroll
            for (int e = 0; e < 8; e++) r[e] += (bits >> e) & 1u ? v[e] * scale : 0.0f;
            xr[k] = pack8(r, bf16);
            st_raw8(nd.res_out, base + j, bf16, xr[k]);
        }
    }
}

/* The generic path's version: writes row `row` of nd.res_out (element by element, each by the
 * thread that later reads it back). */
static __device__ __forceinline__ void dropout_row_generic(const void *residual, const norm_drop &nd, int row, int C,
                                                           int bf16) {
    const size_t base = (size_t)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int keep = !nd.active || fsdp_dropout_keep_row(&nd.d, row, nd.T, C, c);
        const float x = keep ? ld1(nd.x, base + c, bf16) * (nd.active ? nd.d.scale : 1.0f) : 0.0f;
        st1(nd.res_out, base + c, bf16, ld1(residual, base + c, bf16) + x);
    }
}

/* dx of 8 elements from the fp32 dinp just computed: rounded as dinp is stored, then masked. */
static __device__ __forceinline__ void dropout_grad8(float *g, const float *di, unsigned bits, float scale, int bf16) {
#pragma unroll
    for (int e = 0; e < 8; e++) g[e] = (bits >> e) & 1u ? (bf16 ? round_bf16(di[e]) : di[e]) * scale : 0.0f;
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

/* Host: the launch-time form of a fused dropout (NULL descriptor = no mask). */
static inline norm_drop norm_drop_make(void *res_out, const void *x, void *dx, const fsdp_dropout *drop, int N,
                                       int T, int C) {
    norm_drop nd;
    memset(&nd, 0, sizeof nd);
    nd.res_out = res_out, nd.x = x, nd.dx = dx, nd.T = T > 0 ? T : 1;
    nd.active = fsdp_dropout_active(drop);
    if (nd.active) {
        nd.d = *drop;
        fsdp_dropout_check_rows(drop, fsdp_cuda_ceil_div(N, nd.T), nd.T, C);
    }
    return nd;
}

/* ---- forward ----------------------------------------------------------------------------------- */

/* The statistics are sums over the row in registers: LayerNorm's mean first, then the sum of
 * squares about the mean (about 0 for RMSNorm), which has no cancellation problem. */
template <int LN, int BF16, int DROP>
static __device__ __forceinline__ void norm_fwd_vec(void *out, float *mean, float *rstd, const void *inp,
                                                    const void *weight, const void *bias, int N, int C, float eps,
                                                    unsigned *amax, const norm_drop &nd) {
    __shared__ float sh[32 * (FWD_MAX_TPR / 32)];
    int row = blockIdx.x * blockDim.y + threadIdx.y, valid = row < N;
    int nch = C / 8, t = threadIdx.x, tpr = blockDim.x;
    size_t base = (size_t)row * nch;
    fsdp_raw8 xr[FWD_K];
    if (DROP)
        load_dropout_row_chunks(xr, inp, nd, row, base, nch, t, tpr, valid, BF16);
    else
        load_row_chunks(xr, inp, base, nch, t, tpr, valid, BF16);
    float m = 0.0f;
    if (LN) m = group_sum(chunk_sum(xr, nch, t, tpr, valid, BF16, 0.0f, 0), sh) / (float)C;
    float ss = group_sum(chunk_sum(xr, nch, t, tpr, valid, BF16, m, 1), sh);
    if (!valid) return;
    float r = rsqrtf(ss / (float)C + eps);
    unsigned am = 0u; /* of the stored values */
#pragma unroll
    for (int k = 0; k < FWD_K; k++) {
        int j = t + k * tpr;
        if (j < nch) {
            float v[8], w[8], b[8];
            unpack8(xr[k], BF16, v);
            ld8(weight, j, BF16, w);
            if (LN) {
                if (bias) {
                    ld8(bias, j, BF16, b);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) b[e] = 0.0f;
                }
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = (v[e] - m) * r * w[e] + b[e];
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = v[e] * r * w[e];
            }
            st8(out, base + j, BF16, v);
            if (amax)
#pragma unroll
                for (int e = 0; e < 8; e++) am = max(am, amax_bits(BF16 ? round_bf16(v[e]) : v[e]));
        }
    }
    if (t == 0) {
        if (LN) mean[row] = m;
        rstd[row] = r;
    }
    if (amax) warp_amax_report(amax, am);
}
#define NORM_FWD_ARGS                                                                                                  \
    void *out, float *mean, float *rstd, const void *inp, const void *weight, const void *bias, int N, int C, float eps, \
        unsigned *amax
template <int LN, int BF16>
static __global__ void __launch_bounds__(FWD_MAX_TPR) norm_fwd_vec_kernel(NORM_FWD_ARGS) {
    const norm_drop none{};
    norm_fwd_vec<LN, BF16, 0>(out, mean, rstd, inp, weight, bias, N, C, eps, amax, none);
}
template <int LN, int BF16>
static __global__ void __launch_bounds__(FWD_MAX_TPR) norm_fwd_drop_vec_kernel(NORM_FWD_ARGS, const norm_drop nd) {
    norm_fwd_vec<LN, BF16, 1>(out, mean, rstd, inp, weight, bias, N, C, eps, amax, nd);
}

template <int LN, int DROP>
static __device__ __forceinline__ void norm_fwd_gen(void *out, float *mean, float *rstd, const void *inp,
                                                    const void *weight, const void *bias, int C, float eps,
                                                    int bf16, unsigned *amax, const norm_drop &nd) {
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * C;
    if (DROP) {
        dropout_row_generic(inp, nd, blockIdx.x, C, bf16);
        inp = nd.res_out;
    }
    float m = 0.0f;
    if (LN) {
        float sum = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) sum += ld1(inp, base + c, bf16);
        m = group_sum(sum, sh) / (float)C;
    }
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = LN ? ld1(inp, base + c, bf16) - m : ld1(inp, base + c, bf16);
        ss += v * v;
    }
    ss = group_sum(ss, sh);
    float r = rsqrtf(ss / (float)C + eps);
    unsigned am = 0u;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float y;
        if (LN) {
            float b = bias ? ld1(bias, c, bf16) : 0.0f;
            y = (ld1(inp, base + c, bf16) - m) * r * ld1(weight, c, bf16) + b;
        } else {
            y = ld1(inp, base + c, bf16) * r * ld1(weight, c, bf16);
        }
        st1(out, base + c, bf16, y);
        am = max(am, amax_bits(bf16 ? round_bf16(y) : y));
    }
    if (threadIdx.x == 0) {
        if (LN) mean[blockIdx.x] = m;
        rstd[blockIdx.x] = r;
    }
    if (amax) warp_amax_report(amax, am);
}
#define NORM_FWD_GEN_ARGS                                                                                              \
    void *out, float *mean, float *rstd, const void *inp, const void *weight, const void *bias, int C, float eps,     \
        int bf16, unsigned *amax
template <int LN>
static __global__ void norm_fwd_gen_kernel(NORM_FWD_GEN_ARGS) {
    const norm_drop none{};
    if (bf16)
        norm_fwd_gen<LN, 0>(out, mean, rstd, inp, weight, bias, C, eps, 1, amax, none);
    else
        norm_fwd_gen<LN, 0>(out, mean, rstd, inp, weight, bias, C, eps, 0, amax, none);
}
template <int LN>
static __global__ void norm_fwd_drop_gen_kernel(NORM_FWD_GEN_ARGS, const norm_drop nd) {
    if (bf16)
        norm_fwd_gen<LN, 1>(out, mean, rstd, inp, weight, bias, C, eps, 1, amax, nd);
    else
        norm_fwd_gen<LN, 1>(out, mean, rstd, inp, weight, bias, C, eps, 0, amax, nd);
}

/* Launch names: [ln][drop][generic]. */
static const char *const norm_fwd_names[2][2][2] = {
    {{"rmsnorm_forward", "rmsnorm_forward_generic"},
     {"rmsnorm_dropout_forward", "rmsnorm_dropout_forward_generic"}},
    {{"layernorm_forward", "layernorm_forward_generic"},
     {"layernorm_dropout_forward", "layernorm_dropout_forward_generic"}}};

/* nd NULL: the plain norm of inp; else the norm of inp + dropout(nd->x), written to nd->res_out.
 * RMSNorm (LN = 0) takes mean = bias = NULL. out_amax (NULL: none) gets max |out| (ops_cuda.h). */
template <int LN>
static void norm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight, const void *bias,
                         int N, int C, float eps, fsdp_dtype act, cudaStream_t s, const norm_drop *nd,
                         float *out_amax) {
    if (N <= 0 || C <= 0) return;
    unsigned *amax = (unsigned *)out_amax;
    fsdp_cuda_amax_reset(out_amax, s, norm_fwd_names[LN][nd != NULL][0]);
    int bf16 = act == FSDP_BF16;
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, FWD_K, FWD_MAX_TPR) : 0;
    int aligned = fsdp_cuda_aligned16(out) && fsdp_cuda_aligned16(inp) && fsdp_cuda_aligned16(weight) &&
                  fsdp_cuda_aligned16(bias);
    if (nd) aligned = aligned && fsdp_cuda_aligned16(nd->res_out) && fsdp_cuda_aligned16(nd->x);
    if (tpr && aligned) {
        int rpb = tpr >= 256 ? 1 : 256 / tpr;
        dim3 block(tpr, rpb);
        unsigned grid = (unsigned)fsdp_cuda_ceil_div(N, rpb);
        if (nd && bf16)
            norm_fwd_drop_vec_kernel<LN, 1><<<grid, block, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps, amax, *nd);
        else if (nd)
            norm_fwd_drop_vec_kernel<LN, 0><<<grid, block, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps, amax, *nd);
        else if (bf16)
            norm_fwd_vec_kernel<LN, 1><<<grid, block, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps, amax);
        else
            norm_fwd_vec_kernel<LN, 0><<<grid, block, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps, amax);
    } else if (nd) {
        norm_fwd_drop_gen_kernel<LN><<<N, GENERIC_THREADS, 0, s>>>(out, mean, rstd, inp, weight, bias, C, eps, bf16,
                                                                   amax, *nd);
    } else {
        norm_fwd_gen_kernel<LN><<<N, GENERIC_THREADS, 0, s>>>(out, mean, rstd, inp, weight, bias, C, eps, bf16, amax);
    }
    fsdp_cuda_check_launch(norm_fwd_names[LN][nd != NULL][!(tpr && aligned)]);
}

extern "C" void fsdp_cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *weight, int N, int C,
                                          float eps, fsdp_dtype act, cudaStream_t s, float *out_amax) {
    norm_forward<0>(out, NULL, rstd, inp, weight, NULL, N, C, eps, act, s, NULL, out_amax);
}

extern "C" void fsdp_cuda_rmsnorm_dropout_forward(void *res_out, void *out, float *rstd, const void *residual,
                                                  const void *x, const void *weight, int N, int T, int C, float eps,
                                                  const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s,
                                                  float *out_amax) {
    const norm_drop nd = norm_drop_make(res_out, x, NULL, drop, N, T, C);
    norm_forward<0>(out, NULL, rstd, residual, weight, NULL, N, C, eps, act, s, &nd, out_amax);
}

extern "C" void fsdp_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                                            const void *bias, int N, int C, float eps, fsdp_dtype act, cudaStream_t s,
                                            float *out_amax) {
    norm_forward<1>(out, mean, rstd, inp, weight, bias, N, C, eps, act, s, NULL, out_amax);
}

extern "C" void fsdp_cuda_layernorm_dropout_forward(void *res_out, void *out, float *mean, float *rstd,
                                                    const void *residual, const void *x, const void *weight,
                                                    const void *bias, int N, int T, int C, float eps,
                                                    const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s,
                                                    float *out_amax) {
    const norm_drop nd = norm_drop_make(res_out, x, NULL, drop, N, T, C);
    norm_forward<1>(out, mean, rstd, residual, weight, bias, N, C, eps, act, s, &nd, out_amax);
}

/* ---- backward ---------------------------------------------------------------------------------- */

/* The row's backward coefficients from this thread's partial sums (a group reduction: every thread
 * of the row group calls it): LayerNorm's (mg, mgx), the means of dout * w and of dout * w * xhat;
 * RMSNorm's (kk, 0), kk of dinp += r dout w - kk x (s2 unused). One float2 rather than three
 * reference outputs, which moved registers in four fp32 kernels; with the float2 only the two fp32
 * RMSNorm vec kernels differ from the code written out in place, in the registers of a few MOVs
 * (same instructions in the same order, same register count). */
template <int LN>
static __device__ __forceinline__ float2 norm_bwd_row_coefs(float s1, float s2, float r, int C, float *sh) {
    if (LN) {
        float2 sums = group_sum2(s1, s2, sh);
        return make_float2(sums.x / (float)C, sums.y / (float)C);
    }
    return make_float2(group_sum(s1, sh) / (float)C * r * r * r, 0.0f);
}

/* Rows [r0, r1) of block b. The next row's input and output gradient are loaded before the current
 * row's reduction, so the barrier-bound reduction overlaps the next row's memory latency. With
 * DROP, the row's keep bits are drawn while its loads are in flight. The row reduction is
 * sum(dout * w * x) for RMSNorm; sum(dout * w) and sum(dout * w * xhat) (one group_sum2) for
 * LayerNorm. */
template <int LN, int BF16, int DROP>
static __device__ __forceinline__ void norm_bwd_vec(void *dinp, float *part, const void *dout, const void *inp,
                                                    const void *weight, const float *mean, const float *rstd, int N,
                                                    int C, int rows, unsigned *amax, const norm_drop &nd) {
    __shared__ float sh[LN ? 64 : 32];
    int nch = C / 8, t = threadIdx.x, tpr = blockDim.x;
    int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    fsdp_raw8 wr[BWD_K], xr[BWD_K], dr[BWD_K];
    float accw[BWD_K][8], accb[BWD_K][8]; /* accb: LayerNorm's bias gradient */
    unsigned am = 0u; /* of dinp as stored, or with DROP of dx */
#pragma unroll
    for (int k = 0; k < BWD_K; k++) {
        int j = t + k * tpr;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            accw[k][e] = 0.0f;
            if (LN) accb[k][e] = 0.0f;
        }
        if (j < nch) {
            wr[k] = ld_raw8(weight, j, BF16);
            if (r0 < r1) {
                xr[k] = ld_raw8(inp, (size_t)r0 * nch + j, BF16);
                dr[k] = ld_raw8(dout, (size_t)r0 * nch + j, BF16);
            }
        }
    }
    for (int row = r0; row < r1; row++) {
        size_t base = (size_t)row * nch;
        fsdp_raw8 nx[BWD_K], nd_[BWD_K], ir[BWD_K];
        unsigned bits[BWD_K];
        float m = LN ? mean[row] : 0.0f, r = rstd[row];
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int k = 0; k < BWD_K; k++) {
            int j = t + k * tpr;
            if (j < nch) {
                ir[k] = ld_raw8(dinp, base + j, BF16);
                if (row + 1 < r1) {
                    nx[k] = ld_raw8(inp, base + nch + j, BF16);
                    nd_[k] = ld_raw8(dout, base + nch + j, BF16);
                }
                if (DROP) bits[k] = norm_drop_bits(nd, row, C, j);
                float x[8], d[8], w[8];
                unpack8(xr[k], BF16, x);
                unpack8(dr[k], BF16, d);
                unpack8(wr[k], BF16, w);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    if (LN) {
                        float g = d[e] * w[e];
                        s1 += g;
                        s2 += g * ((x[e] - m) * r);
                    } else {
                        s1 += d[e] * w[e] * x[e];
                    }
                }
            }
        }
        const float2 coefs = norm_bwd_row_coefs<LN>(s1, s2, r, C, sh);
        const float mg = coefs.x, mgx = coefs.y, kk = coefs.x;
#pragma unroll
        for (int k = 0; k < BWD_K; k++) {
            int j = t + k * tpr;
            if (j < nch) {
                float x[8], d[8], w[8], di[8];
                unpack8(xr[k], BF16, x);
                unpack8(dr[k], BF16, d);
                unpack8(wr[k], BF16, w);
                unpack8(ir[k], BF16, di);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    if (LN) {
                        float xhat = (x[e] - m) * r;
                        di[e] += r * (d[e] * w[e] - mg - xhat * mgx);
                        accw[k][e] += d[e] * xhat;
                        accb[k][e] += d[e];
                    } else {
                        di[e] += r * d[e] * w[e] - kk * x[e];
                        accw[k][e] += d[e] * x[e] * r;
                    }
                }
                st8(dinp, base + j, BF16, di);
                if (DROP) {
                    float g[8];
                    dropout_grad8(g, di, bits[k], nd.active ? nd.d.scale : 1.0f, BF16);
                    st8(nd.dx, base + j, BF16, g);
                    if (amax) am = max(am, stored_amax(g, 8, BF16));
                } else if (amax) {
                    am = max(am, stored_amax(di, 8, BF16));
                }
                xr[k] = nx[k];
                dr[k] = nd_[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < BWD_K; k++) {
        int j = t + k * tpr;
        if (j < nch) {
            st8(part, (size_t)blockIdx.x * nch + j, 0, accw[k]);
            if (LN) st8(part, (size_t)(gridDim.x + blockIdx.x) * nch + j, 0, accb[k]);
        }
    }
    if (amax) warp_amax_report(amax, am);
}
#define NORM_BWD_ARGS                                                                                                  \
    void *dinp, float *part, const void *dout, const void *inp, const void *weight, const float *mean,               \
        const float *rstd, int N, int C, int rows, unsigned *amax
template <int LN, int BF16>
static __global__ void __launch_bounds__(BF16 ? BWD_MAX_TPR : BWD_MAX_TPR_F32) norm_bwd_vec_kernel(NORM_BWD_ARGS) {
    const norm_drop none{};
    norm_bwd_vec<LN, BF16, 0>(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, amax, none);
}
template <int LN, int BF16>
static __global__ void __launch_bounds__(BF16 ? BWD_MAX_TPR : BWD_MAX_TPR_F32)
    norm_bwd_drop_vec_kernel(NORM_BWD_ARGS, const norm_drop nd) {
    norm_bwd_vec<LN, BF16, 1>(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, amax, nd);
}

/* Generic: the block's scratch rows are its accumulators (each column belongs to one thread). */
template <int LN, int DROP>
static __device__ __forceinline__ void norm_bwd_gen(void *dinp, float *part, const void *dout, const void *inp,
                                                    const void *weight, const float *mean, const float *rstd, int N,
                                                    int C, int rows, int bf16, unsigned *amax, const norm_drop &nd) {
    __shared__ float sh[LN ? 64 : 32];
    unsigned am = 0u; /* of dinp as stored, or with DROP of dx */
    int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    float *accw = part + (size_t)blockIdx.x * C, *accb = part + (size_t)(gridDim.x + blockIdx.x) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        accw[c] = 0.0f;
        if (LN) accb[c] = 0.0f;
    }
    for (int row = r0; row < r1; row++) {
        size_t base = (size_t)row * C;
        float m = LN ? mean[row] : 0.0f, r = rstd[row], s1 = 0.0f, s2 = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            if (LN) {
                float g = ld1(dout, base + c, bf16) * ld1(weight, c, bf16);
                s1 += g;
                s2 += g * ((ld1(inp, base + c, bf16) - m) * r);
            } else {
                s1 += ld1(dout, base + c, bf16) * ld1(weight, c, bf16) * ld1(inp, base + c, bf16);
            }
        }
        const float2 coefs = norm_bwd_row_coefs<LN>(s1, s2, r, C, sh);
        const float mg = coefs.x, mgx = coefs.y, kk = coefs.x;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float di;
            if (LN) {
                float d = ld1(dout, base + c, bf16), xhat = (ld1(inp, base + c, bf16) - m) * r;
                di = ld1(dinp, base + c, bf16) + r * (d * ld1(weight, c, bf16) - mg - xhat * mgx);
                st1(dinp, base + c, bf16, di);
                accw[c] += d * xhat;
                accb[c] += d;
            } else {
                float x = ld1(inp, base + c, bf16), d = ld1(dout, base + c, bf16), w = ld1(weight, c, bf16);
                di = ld1(dinp, base + c, bf16) + (r * d * w - kk * x);
                st1(dinp, base + c, bf16, di);
                accw[c] += d * x * r;
            }
            if (DROP) {
                const int keep = !nd.active || fsdp_dropout_keep_row(&nd.d, row, nd.T, C, c);
                const float g = keep ? (bf16 ? round_bf16(di) : di) * (nd.active ? nd.d.scale : 1.0f) : 0.0f;
                st1(nd.dx, base + c, bf16, g);
                if (amax) am = max(am, stored_amax(&g, 1, bf16));
            } else if (amax) {
                am = max(am, stored_amax(&di, 1, bf16));
            }
        }
    }
    if (amax) warp_amax_report(amax, am);
}
template <int LN>
static __global__ void norm_bwd_gen_kernel(NORM_BWD_ARGS, int bf16) {
    const norm_drop none{};
    if (bf16)
        norm_bwd_gen<LN, 0>(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 1, amax, none);
    else
        norm_bwd_gen<LN, 0>(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 0, amax, none);
}
template <int LN>
static __global__ void norm_bwd_drop_gen_kernel(NORM_BWD_ARGS, int bf16, const norm_drop nd) {
    if (bf16)
        norm_bwd_gen<LN, 1>(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 1, amax, nd);
    else
        norm_bwd_gen<LN, 1>(dinp, part, dout, inp, weight, mean, rstd, N, C, rows, 0, amax, nd);
}

static const char *const norm_bwd_names[2][2][2] = {
    {{"rmsnorm_backward", "rmsnorm_backward_generic"},
     {"rmsnorm_dropout_backward", "rmsnorm_dropout_backward_generic"}},
    {{"layernorm_backward", "layernorm_backward_generic"},
     {"layernorm_dropout_backward", "layernorm_dropout_backward_generic"}}};

/* RMSNorm (LN = 0) takes mean = dbias = NULL. out_amax (NULL: none) gets max |dinp| as stored, or
 * with nd max |dx|: what the projection whose output gradient it is reads (ops_cuda.h). */
template <int LN>
static void norm_backward(void *dinp, void *dweight, void *dbias, const void *dout, const void *inp, const void *weight,
                          const float *mean, const float *rstd, int N, int C, fsdp_dtype act, fsdp_dtype grad,
                          float *scratch, cudaStream_t s, const norm_drop *nd, float *out_amax) {
    fsdp_cuda_amax_reset(out_amax, s, norm_bwd_names[LN][nd != NULL][0]);
    if (N <= 0 || C <= 0) return;
    unsigned *amax = (unsigned *)out_amax;
    int bf16 = act == FSDP_BF16;
    int G = fsdp_cuda_row_blocks(N), rows = fsdp_cuda_ceil_div(N, G);
    int tpr = C % 8 == 0 ? threads_per_row(C / 8, BWD_K, bf16 ? BWD_MAX_TPR : BWD_MAX_TPR_F32) : 0;
    int aligned = fsdp_cuda_aligned16(dinp) && fsdp_cuda_aligned16(dout) && fsdp_cuda_aligned16(inp) &&
                  fsdp_cuda_aligned16(weight) && fsdp_cuda_aligned16(scratch);
    if (nd) aligned = aligned && fsdp_cuda_aligned16(nd->dx);
    if (tpr && aligned) {
        if (nd && bf16)
            norm_bwd_drop_vec_kernel<LN, 1><<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows,
                                                              amax, *nd);
        else if (nd)
            norm_bwd_drop_vec_kernel<LN, 0><<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows,
                                                              amax, *nd);
        else if (bf16)
            norm_bwd_vec_kernel<LN, 1><<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows, amax);
        else
            norm_bwd_vec_kernel<LN, 0><<<G, tpr, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows, amax);
    } else if (nd) {
        norm_bwd_drop_gen_kernel<LN><<<G, GENERIC_THREADS, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C,
                                                                   rows, amax, bf16, *nd);
    } else {
        norm_bwd_gen_kernel<LN><<<G, GENERIC_THREADS, 0, s>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C, rows,
                                                              amax, bf16);
    }
    fsdp_cuda_check_launch(norm_bwd_names[LN][nd != NULL][!(tpr && aligned)]);
    fsdp_cuda_colsum_finalize(dweight, dbias, scratch, G, C, grad, s);
}

extern "C" void fsdp_cuda_rmsnorm_backward(void *dinp, void *dweight, const void *dout, const void *inp,
                                           const void *weight, const float *rstd, int N, int C, fsdp_dtype act,
                                           fsdp_dtype grad, float *scratch, cudaStream_t s, float *out_amax) {
    norm_backward<0>(dinp, dweight, NULL, dout, inp, weight, NULL, rstd, N, C, act, grad, scratch, s, NULL, out_amax);
}

extern "C" void fsdp_cuda_rmsnorm_dropout_backward(void *dinp, void *dx, void *dweight, const void *dout,
                                                   const void *inp, const void *weight, const float *rstd, int N,
                                                   int T, int C, const fsdp_dropout *drop, fsdp_dtype act,
                                                   fsdp_dtype grad, float *scratch, cudaStream_t s, float *out_amax) {
    const norm_drop nd = norm_drop_make(NULL, NULL, dx, drop, N, T, C);
    norm_backward<0>(dinp, dweight, NULL, dout, inp, weight, NULL, rstd, N, C, act, grad, scratch, s, &nd, out_amax);
}

extern "C" void fsdp_cuda_layernorm_backward(void *dinp, void *dweight, void *dbias, const void *dout, const void *inp,
                                             const void *weight, const float *mean, const float *rstd, int N, int C,
                                             fsdp_dtype act, fsdp_dtype grad, float *scratch, cudaStream_t s,
                                             float *out_amax) {
    norm_backward<1>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, act, grad, scratch, s, NULL, out_amax);
}

extern "C" void fsdp_cuda_layernorm_dropout_backward(void *dinp, void *dx, void *dweight, void *dbias,
                                                     const void *dout, const void *inp, const void *weight,
                                                     const float *mean, const float *rstd, int N, int T, int C,
                                                     const fsdp_dropout *drop, fsdp_dtype act, fsdp_dtype grad,
                                                     float *scratch, cudaStream_t s, float *out_amax) {
    const norm_drop nd = norm_drop_make(NULL, NULL, dx, drop, N, T, C);
    norm_backward<1>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, act, grad, scratch, s, &nd, out_amax);
}
