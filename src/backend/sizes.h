/* What the backends allocate, as pure functions that need no device: the bytes of a dtype, what
 * reserved_bytes grows by for one allocation, and the workspaces the backends keep for themselves
 * (cuBLASLt workspace, GEMM tuning scratch, op scratch). The backends allocate exactly what these
 * say, and memory plans (src/train/memory_plan.c) count with them, so that a plan made on a laptop
 * predicts the max_reserved_bytes of a run on a GPU.
 *
 * What no fsdp.c allocation holds (the CUDA context, NCCL's and cuBLAS's own buffers) is not in
 * reserved_bytes; fsdp_outside_estimate gives the estimate the plan adds for it when it decides
 * what fits in a GPU's memory. */
#ifndef FSDP_BACKEND_SIZES_H
#define FSDP_BACKEND_SIZES_H

#include <stddef.h>
#include <stdint.h>

#include "../base/dtype.h"
#include "../kernels/op_args.h"

typedef enum { FSDP_DEVICE_CPU = 0, FSDP_DEVICE_CUDA = 1 } fsdp_device_kind;

/* "cpu" or "cuda"; -1 for anything else. */
int fsdp_device_kind_parse(const char *name, fsdp_device_kind *out);
const char *fsdp_device_kind_name(fsdp_device_kind k);

/* Bytes per element: the CPU stores bf16 as fp32 (emulated), the GPU as 2 bytes; blockwise dtypes
 * codes take one byte on both. */
size_t fsdp_device_dtype_size(fsdp_device_kind k, fsdp_dtype t);
/* Bytes of `count` elements as one piece of a collective or a quantized copy: count elements of a
 * plain dtype, or codes and scales of a blockwise one (fsdp_dtype_piece_bytes). */
size_t fsdp_device_piece_bytes(fsdp_device_kind k, fsdp_dtype t, size_t count);
/* What one alloc of `bytes` adds to reserved_bytes: the CPU counts what was asked for, the GPU
 * the cudaMalloc size (a multiple of 256 bytes, at least 256). */
size_t fsdp_device_alloc_size(fsdp_device_kind k, size_t bytes);

/* The CUDA backend's own buffers, allocated when it is created: the cuBLASLt workspace (the size
 * cuBLAS recommends for Hopper) and, unless FSDP_GEMM_TUNE=0, the scratch on which products that
 * accumulate in place are timed while their algorithm is chosen. */
#define FSDP_CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)
#define FSDP_CUDA_TUNE_SCRATCH_BYTES ((size_t)256 << 20)

/* The shapes of the ops that take the backend's op scratch in one training step. */
typedef struct {
    int tokens;          /* N = batch * seq: rows of every norm and bias gradient */
    int hidden;          /* C: width of the norms */
    int widest_bias;     /* widest bias gradient (output features), 0 when no layer has biases */
    int batch, seq, q_heads, kv_heads, head_dim;
    fsdp_attn attn;
    int attn_dropout;    /* attention probabilities are dropped (eager keeps a second T x T buffer) */
    fsdp_dtype act_dtype;
    int64_t longest_sum; /* elements of the longest sum / sum of squares (the gradient shards) */
    size_t fp8_scratch;  /* --fp8: the block projections' largest FP8 operands (fsdp_fp8_layer_scratch) */
} fsdp_op_extent;

/* --attn cudnn's scratch per attention backward: cuDNN's fp32 dQ sums and row deltas, which fsdp.c
 * places, and the engine's own workspace (measured with cuDNN 9.19 on Hopper: 256 bytes, plus the
 * per-query-head dK and dV with grouped heads; the GPU test holds the two equal). */
size_t fsdp_cudnn_attention_scratch(int B, int T, int Hq, int Hkv, int D);
/* Its two parts fsdp.c places at the front of the workspace, 256-byte aligned: dQ's fp32 sums
 * [B, Hq, T, D] and the row deltas rowsum(dO . O) [B, Hq, T]. */
size_t fsdp_cudnn_dq_accum_bytes(int B, int T, int Hq, int D);
size_t fsdp_cudnn_delta_bytes(int B, int T, int Hq);

/* The largest op-scratch request of a step with these shapes (0 on the CPU, whose ops take
 * transient host memory that reserved_bytes does not count). The CUDA backend reserves it before
 * the first step (reserve_scratch), so a step allocates nothing. */
size_t fsdp_device_op_scratch(fsdp_device_kind k, const fsdp_op_extent *x);

/* The op scratch of generation's attention for one query row over a KV cache of `keys` positions
 * (0 on the CPU); the decoder reserves it when it is made. */
size_t fsdp_device_decode_scratch(fsdp_device_kind k, int q_heads, int head_dim, int keys);

/* Every buffer the backend holds for itself with these shapes, as reserved_bytes counts them. */
typedef struct {
    size_t lt_workspace, tune_scratch, op_scratch;
    size_t total;
} fsdp_device_workspace;
void fsdp_device_workspace_bytes(fsdp_device_kind k, const fsdp_op_extent *x, int gemm_tuning,
                                 fsdp_device_workspace *out);

/* Device memory in use outside fsdp.c's allocations on a GPU running one rank with
 * `communicators` NCCL communicators, `all_reduce_communicators` of them carrying the replicas'
 * large all-reduces: the CUDA context with the kernels and cuBLAS(Lt) loaded, and NCCL's buffers,
 * most of which NCCL allocates at a communicator's first collectives, not when it is created.
 * Estimates (not counted by reserved_bytes): the GPU runs report the measured value ("outside_gib"
 * in the metrics summary at the end of the run) and bench/plan_vs_measured.py compares them. The
 * figures are what two H100s over NVLink measured at the end of a run (NCCL 2.28, 2026-11-25: 0.58
 * GiB context; 1.81 GiB for the gather, reduce-scatter and norm communicators of FULL; 0.86 GiB for
 * NO_SHARD's all-reduce communicator); NCCL's channel count,
 * and so its buffers, differ on other topologies. 0 on the CPU. */
#define FSDP_CUDA_CONTEXT_BYTES_ESTIMATE ((size_t)600 << 20)
#define FSDP_NCCL_COMM_BYTES_ESTIMATE ((size_t)620 << 20)
#define FSDP_NCCL_ALL_REDUCE_COMM_BYTES_ESTIMATE ((size_t)900 << 20)
size_t fsdp_outside_estimate(fsdp_device_kind k, int communicators, int all_reduce_communicators);

#endif
