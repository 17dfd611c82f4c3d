/* Scratch the CUDA kernels need, in bytes, as pure functions of the shapes: plain C (no CUDA
 * headers), so that the kernels that size their launches from them (src/kernels/cuda), the CUDA
 * backend that hands out the scratch, and a memory plan made on a machine without a GPU
 * (src/backend/sizes.c) all use the same arithmetic.
 *
 * Deterministic reductions across rows run in two passes over a fixed number of row blocks that
 * depends on the row count alone (never on the device), each block writing one fp32 partial row
 * into the scratch; whole-array sums likewise write one fp32 partial per block. */
#ifndef FSDP_KERNELS_CUDA_SCRATCH_H
#define FSDP_KERNELS_CUDA_SCRATCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Row blocks of the column sums: at least 32 rows per block keep the partials' traffic a few
 * percent of the main pass; at most 1024 blocks fill any GPU and bound the scratch. */
#define FSDP_CUDA_ROWS_PER_BLOCK_MIN 32
#define FSDP_CUDA_ROW_BLOCKS_MAX 1024
/* Whole-array sums: threads per block, elements per thread and chunk, most blocks. */
#define FSDP_CUDA_REDUCE_THREADS 512
#define FSDP_CUDA_REDUCE_CHUNK 8
#define FSDP_CUDA_REDUCE_MAX_BLOCKS 1024

static inline int fsdp_cuda_row_blocks(int N) {
    int g = (N + FSDP_CUDA_ROWS_PER_BLOCK_MIN - 1) / FSDP_CUDA_ROWS_PER_BLOCK_MIN;
    return g < 1 ? 1 : g > FSDP_CUDA_ROW_BLOCKS_MAX ? FSDP_CUDA_ROW_BLOCKS_MAX : g;
}

static inline int fsdp_cuda_reduce_blocks(size_t n) {
    size_t per_block = (size_t)FSDP_CUDA_REDUCE_THREADS * FSDP_CUDA_REDUCE_CHUNK;
    size_t g = (n + per_block - 1) / per_block;
    return g < 1 ? 1 : g > FSDP_CUDA_REDUCE_MAX_BLOCKS ? FSDP_CUDA_REDUCE_MAX_BLOCKS : (int)g;
}

/* RMSNorm/LayerNorm backward: the weight and the bias partial rows of every row block. */
static inline size_t fsdp_cuda_norm_backward_scratch(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return 2 * (size_t)fsdp_cuda_row_blocks(N) * (size_t)C * sizeof(float);
}

/* Per-head q/k RMSNorm backward (qk_norm.cu): the q and the k weight partial rows [D] of every row
 * block of the N tokens. */
static inline size_t fsdp_cuda_qk_norm_backward_scratch(int N, int D) { return fsdp_cuda_norm_backward_scratch(N, D); }

/* Bias gradients: one partial row per row block. */
static inline size_t fsdp_cuda_column_sum_scratch(int N, int OC) {
    if (N <= 0 || OC <= 0) return 0;
    return (size_t)fsdp_cuda_row_blocks(N) * (size_t)OC * sizeof(float);
}

/* sum and sum_squares over n elements: one partial per block. */
static inline size_t fsdp_cuda_reduce_scratch(size_t n) { return (size_t)fsdp_cuda_reduce_blocks(n) * sizeof(float); }

/* Flash attention backward: delta[B, Hq, T] (rowsum of dO * O). */
static inline size_t fsdp_cuda_flash_backward_scratch(int B, int T, int Hq, int Hkv, int D) {
    (void)Hkv, (void)D;
    return (size_t)B * (size_t)Hq * (size_t)T * sizeof(float);
}

/* The atomic-dQ flash backward: delta, then (at a 256-byte boundary) dQ's fp32 sums [B, T, Hq, D]. */
static inline size_t fsdp_cuda_flash_backward_atomic_delta_bytes(int B, int T, int Hq) {
    return ((size_t)B * (size_t)Hq * (size_t)T * sizeof(float) + 255) / 256 * 256;
}
static inline size_t fsdp_cuda_flash_backward_atomic_scratch(int B, int T, int Hq, int Hkv, int D) {
    (void)Hkv;
    return fsdp_cuda_flash_backward_atomic_delta_bytes(B, T, Hq) + (size_t)B * T * Hq * D * sizeof(float);
}

/* Eager attention backward: the gradient of the probabilities, dP[B, Hq, T, T] in the activation
 * dtype (esize bytes per element), and with attention dropout a second such buffer for the dropped
 * probabilities that dV is computed from. */
static inline size_t fsdp_cuda_eager_backward_scratch(int B, int T, int Hq, size_t esize, int dropping) {
    return (size_t)B * (size_t)Hq * (size_t)T * (size_t)T * esize * (dropping ? 2 : 1);
}

/* Attention over a KV cache (attention_decode.cu): the keys of a query row are split into at most
 * FSDP_CUDA_DECODE_MAX_SPLITS blocks of at least FSDP_CUDA_DECODE_SPLIT_KEYS keys, a number that
 * depends on the longest row alone (`keys` = its length); with more than one split, every (row,
 * head, split) writes its running maximum, sum and unnormalised output [D] (fp32) to the scratch,
 * and a second kernel combines them in split order. */
#define FSDP_CUDA_DECODE_SPLIT_KEYS 256
#define FSDP_CUDA_DECODE_MAX_SPLITS 64

static inline int fsdp_cuda_decode_splits(int keys) {
    int s = (keys + FSDP_CUDA_DECODE_SPLIT_KEYS - 1) / FSDP_CUDA_DECODE_SPLIT_KEYS;
    return s < 1 ? 1 : s > FSDP_CUDA_DECODE_MAX_SPLITS ? FSDP_CUDA_DECODE_MAX_SPLITS : s;
}

/* Keys the longest of rows ending at position `len` - 1 reads: all of them, or the window's. */
static inline int fsdp_cuda_decode_keys(int len, int window) { return window > 0 && window < len ? window : len; }

static inline size_t fsdp_cuda_decode_scratch(int N, int keys, int Hq, int D) {
    int s = fsdp_cuda_decode_splits(keys);
    if (s == 1 || N <= 0) return 0;
    return (size_t)N * (size_t)Hq * (size_t)s * ((size_t)D + 2) * sizeof(float);
}

#ifdef __cplusplus
}
#endif

#endif
