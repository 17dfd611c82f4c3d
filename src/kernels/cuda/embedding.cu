/* Token (and learned position) embeddings: the row gather and its scatter-add gradient (CUDA twins
 * of src/kernels/cpu/embedding.c).
 *
 * Forward: one thread per chunk of 8 channels of one output row (16-byte accesses when C is a
 * multiple of 8 and the tables are aligned, else one channel per thread).
 *
 * Backward: rows hit by several tokens must be summed. The CPU reference avoids a race by giving
 * each thread a channel block; on the GPU that would serialise N rows per thread, so the gradient
 * is scattered with atomics instead, the one non-determinism ops_cuda.h allows: the order of the
 * few additions into one embedding row. fp32 gradients use Hopper's 16-byte float4 atomics
 * (scalar float atomics on older GPUs); bf16 gradients use bf16x2 atomics, which round after
 * every addition, so a row hit k times carries up to k bf16 roundings instead of one (acceptable:
 * bf16 gradients are already that coarse). */
#include <string.h>

#include "cuda_common.cuh"

#define EMB_THREADS 256

/* Item = (row n, group q of E channels). */
static __device__ __forceinline__ void emb_fwd(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                               int pos_offset, int T, int C, unsigned items, int bf16, int E) {
    unsigned groups = (unsigned)(C / E);
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items; idx += gridDim.x * blockDim.x) {
        unsigned q = idx % groups, n = idx / groups;
        float v[8];
        ldE(wte, (size_t)tokens[n] * groups + q, bf16, E, v);
        if (wpe) {
            float p[8];
            ldE(wpe, (size_t)(pos_offset + (int)(n % (unsigned)T)) * groups + q, bf16, E, p);
#pragma unroll
            for (int e = 0; e < E; e++) v[e] += p[e];
        }
        stE(out, (size_t)n * groups + q, bf16, E, v);
    }
}
static __global__ void emb_fwd_kernel(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                      int pos_offset, int T, int C, unsigned items, int bf16, int vec) {
    if (bf16) {
        if (vec)
            emb_fwd(out, tokens, wte, wpe, pos_offset, T, C, items, 1, 8);
        else
            emb_fwd(out, tokens, wte, wpe, pos_offset, T, C, items, 1, 1);
    } else {
        if (vec)
            emb_fwd(out, tokens, wte, wpe, pos_offset, T, C, items, 0, 8);
        else
            emb_fwd(out, tokens, wte, wpe, pos_offset, T, C, items, 0, 1);
    }
}

extern "C" void fsdp_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                            int pos_offset, int N, int T, int C, fsdp_dtype act, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int vec = C % 8 == 0 && fsdp_cuda_aligned16(out) && fsdp_cuda_aligned16(wte) && fsdp_cuda_aligned16(wpe);
    size_t items = (size_t)N * (vec ? C / 8 : C);
    FSDP_ASSERT(items < ((size_t)1 << 31));
    emb_fwd_kernel<<<fsdp_cuda_grid(items, EMB_THREADS), EMB_THREADS, 0, s>>>(out, tokens, wte, wpe, pos_offset, T, C,
                                                                              (unsigned)items, act == FSDP_BF16, vec);
    fsdp_cuda_check_launch("embedding_forward");
}

/* Adds E values into p[i * E ...] (E = 8: 16-byte aligned chunk i; E = 1: element i) with atomics
 * of the gradient dtype. */
static __device__ __forceinline__ void atomic_addE(void *p, size_t i, int gbf16, int E, const float *v) {
    if (E == 1) {
        if (gbf16)
            atomicAdd((__nv_bfloat16 *)p + i, __float2bfloat16_rn(v[0]));
        else
            atomicAdd((float *)p + i, v[0]);
    } else if (gbf16) {
        __nv_bfloat162 *q = (__nv_bfloat162 *)p + 4 * i;
#pragma unroll
        for (int e = 0; e < 4; e++) atomicAdd(q + e, __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]));
    } else {
#if __CUDA_ARCH__ >= 900
        float4 *q = (float4 *)p + 2 * i;
        atomicAdd(q, make_float4(v[0], v[1], v[2], v[3]));
        atomicAdd(q + 1, make_float4(v[4], v[5], v[6], v[7]));
#else
        float *q = (float *)p + 8 * i;
#pragma unroll
        for (int e = 0; e < 8; e++) atomicAdd(q + e, v[e]);
#endif
    }
}

static __device__ __forceinline__ void emb_bwd(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                               int padding_idx, int pos_offset, int T, int C, unsigned items,
                                               int bf16, int gbf16, int E) {
    unsigned groups = (unsigned)(C / E);
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items; idx += gridDim.x * blockDim.x) {
        unsigned q = idx % groups, n = idx / groups;
        float d[8];
        ldE(dout, (size_t)n * groups + q, bf16, E, d);
        if (tokens[n] != padding_idx) atomic_addE(dwte, (size_t)tokens[n] * groups + q, gbf16, E, d);
        if (dwpe) atomic_addE(dwpe, (size_t)(pos_offset + (int)(n % (unsigned)T)) * groups + q, gbf16, E, d);
    }
}
/* mode bits: 1 act bf16, 2 grad bf16, 4 vector path. */
static __global__ void emb_bwd_kernel(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                      int padding_idx, int pos_offset, int T, int C, unsigned items, int mode) {
/* clang-format off */
#define EMB_BWD_CASE(m) \
    case m: emb_bwd(dwte, dwpe, dout, tokens, padding_idx, pos_offset, T, C, items, (m) & 1, ((m) >> 1) & 1, \
                    (m) & 4 ? 8 : 1); \
        break;
    switch (mode) {
        EMB_BWD_CASE(0) EMB_BWD_CASE(1) EMB_BWD_CASE(2) EMB_BWD_CASE(3)
        EMB_BWD_CASE(4) EMB_BWD_CASE(5) EMB_BWD_CASE(6) EMB_BWD_CASE(7)
    }
#undef EMB_BWD_CASE
/* clang-format on */
}

extern "C" void fsdp_cuda_embedding_backward(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                             int padding_idx, int pos_offset, int N, int T, int C, fsdp_dtype act,
                                             fsdp_dtype grad, cudaStream_t s) {
    if (N <= 0 || C <= 0) return;
    int vec = C % 8 == 0 && fsdp_cuda_aligned16(dout) && fsdp_cuda_aligned16(dwte) && fsdp_cuda_aligned16(dwpe);
    size_t items = (size_t)N * (vec ? C / 8 : C);
    FSDP_ASSERT(items < ((size_t)1 << 31));
    int mode = (act == FSDP_BF16) | (grad == FSDP_BF16) << 1 | vec << 2;
    emb_bwd_kernel<<<fsdp_cuda_grid(items, EMB_THREADS), EMB_THREADS, 0, s>>>(dwte, dwpe, dout, tokens, padding_idx,
                                                                              pos_offset, T, C, (unsigned)items, mode);
    fsdp_cuda_check_launch("embedding_backward");
}

/* ---- scatter-add of rows into one shard of a flat buffer (fp32) ---- */

typedef struct {
    fsdp_row_set sets[FSDP_MAX_ROW_SETS];
    int nsets;
    long long window_start, window_end;
} add_rows_args;

static __device__ __forceinline__ long long row_of(const fsdp_row_set *s, unsigned n) {
    return s->rows ? (long long)s->rows[n] : (long long)(s->offset + (int)(n % (unsigned)s->period));
}

/* Item = (entry n, group q of E channels). A group wholly inside the window is added with one
 * vector atomic; one that straddles a window edge (only when the window is not 8-aligned) element
 * by element. */
static __device__ __forceinline__ void add_rows_body(float *dst, const add_rows_args *a, const void *values, int C,
                                                     unsigned items, int bf16, int E) {
    unsigned groups = (unsigned)(C / E);
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items; idx += gridDim.x * blockDim.x) {
        unsigned q = idx % groups, n = idx / groups;
        float v[8];
        ldE(values, (size_t)n * groups + q, bf16, E, v);
        for (int k = 0; k < a->nsets; k++) {
            if (a->sets[k].rows && a->sets[k].rows[n] == a->sets[k].skip) continue; /* padding_idx */
            long long e0 = a->sets[k].base + row_of(&a->sets[k], n) * C + (long long)q * E;
            if (e0 + E <= a->window_start || e0 >= a->window_end) continue;
            if (e0 >= a->window_start && e0 + E <= a->window_end) {
                atomic_addE(dst, (size_t)((e0 - a->window_start) / E), 0, E, v);
            } else {
                for (int e = 0; e < E; e++)
                    if (e0 + e >= a->window_start && e0 + e < a->window_end)
                        atomicAdd(dst + (e0 + e - a->window_start), v[e]);
            }
        }
    }
}

static __global__ void add_rows_kernel(float *dst, add_rows_args a, const void *values, int C, unsigned items,
                                       int bf16, int vec) {
    if (bf16) {
        if (vec)
            add_rows_body(dst, &a, values, C, items, 1, 8);
        else
            add_rows_body(dst, &a, values, C, items, 1, 1);
    } else {
        if (vec)
            add_rows_body(dst, &a, values, C, items, 0, 8);
        else
            add_rows_body(dst, &a, values, C, items, 0, 1);
    }
}

extern "C" void fsdp_cuda_add_rows(float *dst, int64_t window_start, int64_t window_len, const fsdp_row_set *sets,
                                   int nsets, const void *values, int N, int C, fsdp_dtype act, cudaStream_t s) {
    if (N <= 0 || C <= 0 || window_len <= 0) return;
    FSDP_ASSERT(nsets >= 1 && nsets <= FSDP_MAX_ROW_SETS);
    add_rows_args a;
    memset(&a, 0, sizeof a);
    int vec = C % 8 == 0 && window_start % 8 == 0 && fsdp_cuda_aligned16(dst) && fsdp_cuda_aligned16(values);
    for (int k = 0; k < nsets; k++) {
        a.sets[k] = sets[k];
        vec = vec && sets[k].base % 8 == 0;
    }
    a.nsets = nsets;
    a.window_start = window_start;
    a.window_end = window_start + window_len;
    size_t items = (size_t)N * (vec ? C / 8 : C);
    FSDP_ASSERT(items < ((size_t)1 << 31));
    add_rows_kernel<<<fsdp_cuda_grid(items, EMB_THREADS), EMB_THREADS, 0, s>>>(dst, a, values, C, (unsigned)items,
                                                                               act == FSDP_BF16, vec);
    fsdp_cuda_check_launch("add_rows");
}
