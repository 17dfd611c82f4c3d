/* Allocation sizes of the backends, without a device (see sizes.h). */
#include "sizes.h"

#include <string.h>

#include "../kernels/cuda_scratch.h"

int fsdp_device_kind_parse(const char *name, fsdp_device_kind *out) {
    if (!strcmp(name, "cpu")) *out = FSDP_DEVICE_CPU;
    else if (!strcmp(name, "cuda")) *out = FSDP_DEVICE_CUDA;
    else return -1;
    return 0;
}

const char *fsdp_device_kind_name(fsdp_device_kind k) { return k == FSDP_DEVICE_CUDA ? "cuda" : "cpu"; }

size_t fsdp_device_dtype_size(fsdp_device_kind k, fsdp_dtype t) {
    if (k == FSDP_DEVICE_CPU && t == FSDP_BF16) return 4; /* emulated in fp32 storage */
    return fsdp_dtype_info_of(t)->bytes;
}

size_t fsdp_device_piece_bytes(fsdp_device_kind k, fsdp_dtype t, size_t count) {
    return fsdp_dtype_blockwise(t) ? fsdp_dtype_piece_bytes(t, count) : count * fsdp_device_dtype_size(k, t);
}

size_t fsdp_device_alloc_size(fsdp_device_kind k, size_t bytes) {
    if (k == FSDP_DEVICE_CPU) return bytes;
    size_t rounded = (bytes + 255) & ~(size_t)255;
    return rounded ? rounded : 256;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

size_t fsdp_cudnn_dq_accum_bytes(int B, int T, int Hq, int D) {
    return align256((size_t)B * Hq * T * D * sizeof(float));
}
size_t fsdp_cudnn_delta_bytes(int B, int T, int Hq) { return align256((size_t)B * Hq * T * sizeof(float)); }

size_t fsdp_cudnn_attention_scratch(int B, int T, int Hq, int Hkv, int D) {
    const size_t rows = (size_t)B * Hq * T;
    const size_t ours = fsdp_cudnn_dq_accum_bytes(B, T, Hq, D) + fsdp_cudnn_delta_bytes(B, T, Hq);
    /* the engine's: with grouped heads, per-query-head dK and dV in bf16 before the group sums */
    const size_t engine = (Hq != Hkv ? 2 * align256(rows * D * 2) : 0) + 256;
    return ours + engine;
}

size_t fsdp_device_op_scratch(fsdp_device_kind k, const fsdp_op_extent *x) {
    if (k == FSDP_DEVICE_CPU) return 0;
    size_t need = fsdp_cuda_norm_backward_scratch(x->tokens, x->hidden);
    if (x->widest_bias > 0) need = max_size(need, fsdp_cuda_column_sum_scratch(x->tokens, x->widest_bias));
    if (x->attn == FSDP_ATTN_EAGER)
        need = max_size(need, fsdp_cuda_eager_backward_scratch(x->batch, x->seq, x->q_heads,
                                                               fsdp_device_dtype_size(k, x->act_dtype), x->attn_dropout));
    else if (x->attn == FSDP_ATTN_CUDNN)
        need = max_size(need, fsdp_cudnn_attention_scratch(x->batch, x->seq, x->q_heads, x->kv_heads, x->head_dim));
    else if (x->attn == FSDP_ATTN_FLASH_ATOMIC)
        need = max_size(need, fsdp_cuda_flash_backward_atomic_scratch(x->batch, x->seq, x->q_heads, x->kv_heads,
                                                                      x->head_dim));
    else
        need = max_size(need, fsdp_cuda_flash_backward_scratch(x->batch, x->seq, x->q_heads, x->kv_heads,
                                                               x->head_dim));
    /* Qwen3's per-head q/k norms: their partial rows are head_dim wide, within the norms' unless
     * head_dim exceeds hidden. */
    if (x->head_dim > 0) need = max_size(need, fsdp_cuda_qk_norm_backward_scratch(x->tokens, x->head_dim));
    need = max_size(need, fsdp_cuda_reduce_scratch((size_t)x->longest_sum));
    need = max_size(need, x->fp8_scratch);
    return max_size(need, fsdp_cuda_reduce_scratch((size_t)x->tokens)); /* the loss sum */
}

size_t fsdp_device_decode_scratch(fsdp_device_kind k, int q_heads, int head_dim, int keys) {
    return k == FSDP_DEVICE_CPU ? 0 : fsdp_cuda_decode_scratch(1, keys, q_heads, head_dim);
}

void fsdp_device_workspace_bytes(fsdp_device_kind k, const fsdp_op_extent *x, int gemm_tuning,
                                 fsdp_device_workspace *out) {
    memset(out, 0, sizeof *out);
    if (k == FSDP_DEVICE_CPU) return;
    out->lt_workspace = fsdp_device_alloc_size(k, FSDP_CUDA_LT_WORKSPACE_BYTES);
    out->tune_scratch = gemm_tuning ? fsdp_device_alloc_size(k, FSDP_CUDA_TUNE_SCRATCH_BYTES) : 0;
    size_t scratch = fsdp_device_op_scratch(k, x);
    out->op_scratch = scratch ? fsdp_device_alloc_size(k, scratch) : 0;
    out->total = out->lt_workspace + out->tune_scratch + out->op_scratch;
}

size_t fsdp_outside_estimate(fsdp_device_kind k, int communicators, int all_reduce_communicators) {
    if (k == FSDP_DEVICE_CPU) return 0;
    return FSDP_CUDA_CONTEXT_BYTES_ESTIMATE + (size_t)(communicators - all_reduce_communicators) * FSDP_NCCL_COMM_BYTES_ESTIMATE +
           (size_t)all_reduce_communicators * FSDP_NCCL_ALL_REDUCE_COMM_BYTES_ESTIMATE;
}
