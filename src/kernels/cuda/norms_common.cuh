/* Private to the norm kernels (rmsnorm.cu, layernorm.cu, the CUDA twins of src/kernels/cpu/norms.c):
 * the row layout they share, and the residual dropout they can fuse.
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
 * gradient. No atomics anywhere, so runs repeat bit for bit on any GPU.
 *
 * Fused residual dropout (the *_dropout launchers; kernels compiled separately with drop = 1, so
 * the plain kernels are unchanged): the forward builds each row as residual + keep . x / (1 - p),
 * rounds it to the storage dtype, writes it as the new residual stream and normalises the rounded
 * row already in registers (one read of residual and x, one write of each output, where the
 * unfused pair would write and re-read the residual). The backward, once a row's dinp is
 * complete, also writes dx = keep . dinp / (1 - p) of the rounded dinp. Masks follow
 * src/kernels/dropout.h: row n is position n % T of sample sample_base + n / T, and the 8 elements
 * of a chunk are two whole Philox groups because C is a multiple of 8 on the fast path. */
#ifndef FSDP_KERNELS_CUDA_NORMS_COMMON_CUH
#define FSDP_KERNELS_CUDA_NORMS_COMMON_CUH

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

#endif
