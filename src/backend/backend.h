/* The backend interface: every piece of memory, arithmetic, communication and ordering that the
 * model (src/model), the sharding engine (src/shard) and the trainer (src/train) need from a device,
 * in three constant tables (runtime, collectives, ops) apart from the instance's state.
 *
 * Two implementations fill them: the CPU backend (fp32 math with OpenMP, collectives through
 * non-blocking MPI) and the CUDA backend (kernels in src/kernels/cuda, cuBLASLt, NCCL bootstrapped by
 * MPI). Nothing above this header knows which one it runs on.
 *
 * Conventions
 *  - Pointers to tensors are device pointers of the backend (host pointers for the CPU backend).
 *    Shapes are passed explicitly; all tensors are dense and row-major.
 *  - "act" tensors (activations, gathered working weights, their gradients) have the backend's
 *    act_dtype; "grad" tensors (parameter gradients written by backward ops) have grad_dtype;
 *    statistics (rstd, mean, lse, losses) are always fp32.
 *  - Parameter gradients are always ACCUMULATED (+=) into their buffer; the sharding engine zeroes
 *    a unit's gradient buffer when it hands it out. Input gradients are overwritten, except where a
 *    comment says "+=" (the norms add into the residual-stream gradient).
 *  - Ops without a stream argument run in order on the backend's compute stream. Ops and
 *    collectives with a stream argument run in order on that stream; streams are ordered against
 *    each other only through events.
 *  - On the CPU, a bf16 tensor is stored as fp32 values rounded to bf16 (dtype_size(BF16) == 4), so
 *    that bf16 training is emulated with the same code. On the GPU it is real bf16.
 *  - Linear layers follow PyTorch: weight[out_features, in_features], y = x W^T + b.
 *  - Dropout (the *_dropout ops) takes a `const fsdp_dropout *` made by fsdp_dropout_make
 *    (src/kernels/dropout.h) for one site of one layer and one micro-batch. Masks are a pure
 *    function of (seed, global sample index, layer, site, position in the sample's tensor): row n
 *    of an [N, C] tensor is position n % T of sample drop->sample_base + n / T, and batch row b of
 *    the attention probabilities is sample drop->sample_base + b. Backward ops regenerate the
 *    forward's mask from the same descriptor. NULL, or a rate of 0, draws nothing: the op is then
 *    exactly its dropout-free form.
 */
#ifndef FSDP_BACKEND_BACKEND_H
#define FSDP_BACKEND_BACKEND_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/dtype.h"
#include "../base/error.h"
#include "../kernels/dropout.h"
#include "../kernels/fp8.h"
#include "../kernels/op_args.h"
#include "sizes.h"

typedef struct fsdp_backend fsdp_backend;
typedef struct fsdp_stream fsdp_stream;
typedef struct fsdp_event fsdp_event;
typedef struct fsdp_comm fsdp_comm;

/* comm_create flags */
enum {
    /* Run all-gathers and all-to-alls between buffers from alloc_shared on copy engines where the
     * backend can (NCCL's zero-CTA policy): they then take no SMs from the compute they overlap. */
    FSDP_COMM_COPY_ENGINES = 1
};

typedef struct {
    const char *kind;      /* "auto", "cpu" or "cuda" */
    fsdp_dtype act_dtype;  /* compute dtype of activations and working weights */
    fsdp_dtype grad_dtype; /* dtype of parameter gradients written by backward ops */
    int local_rank;        /* node-local rank: picks the GPU */
    int local_size;        /* ranks on this node */
    /* Memory this rank may use, 0 = the device's: the CPU backend refuses to reserve more; the CUDA
     * backend refuses an allocation that would take the GPU's used memory (everyone's, the CUDA
     * context and NCCL included) past it, emulating a smaller GPU. */
    size_t memory_limit;
} fsdp_backend_options;

/* Out of memory. Both backends report a failed allocation (device memory exhausted, or the
 * memory_limit reached) through fsdp_backend_out_of_memory: while `deferred` is set, the failure is
 * recorded here and alloc returns NULL (copies and zeroing then skip NULL pointers), so that the
 * caller can reach a point where every rank agrees and build again smaller; otherwise the hook
 * (installed by the trainer) is called and must not return, and without a hook the backend stops
 * every rank with its own one-line message. */
typedef struct fsdp_oom {
    int deferred;
    int failures;       /* allocations refused while deferred */
    size_t bytes;       /* the first refused allocation */
    char what[64];
    char detail[192];   /* what the device had: "4.10 GiB held by fsdp.c, 0.52 GiB free of 79.19" */
    void (*hook)(fsdp_backend *be, size_t bytes, const char *what, const char *detail, void *arg);
    void *hook_arg;
} fsdp_oom;

/* The interface tables. Each backend defines one constant instance of each table, with designated
 * initializers, next to the functions it names (backend_cpu.c; cuda_backend.c for the runtime and the
 * collectives, cuda_ops.c for the ops); every backend instance points at its backend's tables, and
 * what changes at run time lives in struct fsdp_backend and the backend's private context. Callers
 * go through the group: be->runtime->alloc(be, ...), be->coll->all_gather(be, ...),
 * be->ops->matmul_forward(be, ...). A new op is one entry of fsdp_backend_ops here and, in each
 * backend, its function and one initializer line in the file that defines the table. Every entry is
 * required: fsdp_backend_create stops on a table with an entry left out (NULL). */

/* Memory, copies, streams and events. */
typedef struct fsdp_backend_runtime {
    /* ---- memory ---- */
    size_t (*dtype_size)(fsdp_backend *be, fsdp_dtype t);
    /* Device memory, 256-byte aligned and zeroed; aborts with `what` in the message when it cannot
     * be had. */
    void *(*alloc)(fsdp_backend *be, size_t bytes, const char *what);
    void (*free)(fsdp_backend *be, void *ptr);
    /* Free and total memory of the device as this rank sees it: the GPU's (cudaMemGetInfo), or on
     * the CPU memory_limit less reserved_bytes and memory_limit (both 0 without a limit). */
    void (*memory_info)(fsdp_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* Makes the op scratch at least `bytes` (fsdp_device_op_scratch) now, so that the ops of a step
     * allocate nothing; a no-op on the CPU. */
    void (*reserve_scratch)(fsdp_backend *be, size_t bytes);
    /* Host memory suited to asynchronous copies (pinned on CUDA). */
    void *(*alloc_host)(fsdp_backend *be, size_t bytes, const char *what);
    void (*free_host)(fsdp_backend *be, void *ptr);
    /* Copies ordered on `s`; the host buffer must stay untouched until `s` passes this point. */
    void (*copy_h2d)(fsdp_backend *be, void *dst, const void *src, size_t bytes, fsdp_stream *s);
    void (*copy_d2h)(fsdp_backend *be, void *dst, const void *src, size_t bytes, fsdp_stream *s);
    void (*zero)(fsdp_backend *be, void *dst, size_t bytes, fsdp_stream *s);

    /* ---- streams and events ---- */
    fsdp_stream *(*stream_create)(fsdp_backend *be, const char *name);
    void (*stream_destroy)(fsdp_backend *be, fsdp_stream *s);
    fsdp_event *(*event_create)(fsdp_backend *be, int timing);
    void (*event_destroy)(fsdp_backend *be, fsdp_event *e);
    void (*event_record)(fsdp_backend *be, fsdp_event *e, fsdp_stream *s);
    void (*stream_wait_event)(fsdp_backend *be, fsdp_stream *s, fsdp_event *e);
    void (*event_synchronize)(fsdp_backend *be, fsdp_event *e);
    void (*stream_synchronize)(fsdp_backend *be, fsdp_stream *s);
    /* Milliseconds between two completed events created with timing = 1. */
    float (*event_elapsed_ms)(fsdp_backend *be, fsdp_event *start, fsdp_event *end);

    /* Waits for the device's pending work, then frees the backend. */
    void (*destroy)(fsdp_backend *be);
} fsdp_backend_runtime;

/* Collectives (sum; counts are elements per rank). */
typedef struct fsdp_backend_collectives {
    /* Collective over the ranks of `comm`: a communicator of the backend's own (an NCCL communicator
     * on the GPU, a duplicated MPI communicator on the CPU). Communicators used from different
     * streams concurrently must be distinct. */
    fsdp_comm *(*comm_create)(fsdp_backend *be, MPI_Comm comm, const char *name, int flags);
    void (*comm_destroy)(fsdp_backend *be, fsdp_comm *c);
    /* Device memory that c's collectives reach directly, like alloc otherwise. With
     * FSDP_COMM_COPY_ENGINES on GPUs that share a node over NVLink it is a symmetric NCCL window,
     * which lets all-gathers whose send and receive buffers both lie in such memory run on the
     * copy engines instead of SMs. Collective over c's ranks: every rank calls it in the same order
     * with the same size, and sends from and receives into the same offsets of it. Freed by the
     * runtime's free (also collective then), before c is destroyed. */
    void *(*alloc_shared)(fsdp_backend *be, fsdp_comm *c, size_t bytes, const char *what);
    /* Counts are elements. A blockwise dtype (src/base/dtype.h: int8, fp8) can be all-gathered and
     * exchanged all-to-all, never summed: there `count` elements are one piece of
     * fsdp_device_piece_bytes(kind, t, count) bytes (codes and their scales) and every "count"
     * offset below is a piece offset. reduce_scatter and all_reduce take plain dtypes only. */
    /* recv[r*count .. (r+1)*count) = send of rank r. In place when send == recv + rank*count. */
    void (*all_gather)(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                       fsdp_dtype t, fsdp_stream *s);
    /* recv = sum over ranks of send[rank*count .. (rank+1)*count). In place when
     * recv == send + rank*count; the rest of send is undefined afterwards. */
    void (*reduce_scatter)(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                           fsdp_dtype t, fsdp_stream *s);
    void (*all_reduce)(fsdp_backend *be, fsdp_comm *c, void *buf, size_t count, fsdp_dtype t,
                       fsdp_stream *s);
    /* recv[q*count .. (q+1)*count) = send[rank*count .. (rank+1)*count) of rank q; send and recv
     * must not overlap. */
    void (*all_to_all)(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                       fsdp_dtype t, fsdp_stream *s);
} fsdp_backend_collectives;

/* Arithmetic: the elementwise utilities of the engine and the optimizer, and the model's ops. */
typedef struct fsdp_backend_ops {
    /* ---- elementwise utilities (explicit stream; used by the engine and the optimizer) ---- */
    void (*cast)(fsdp_backend *be, void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t,
                 size_t n, fsdp_stream *s);
    /* dst += src (elementwise, in dst's dtype after converting src) */
    void (*accumulate)(fsdp_backend *be, void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t,
                       size_t n, fsdp_stream *s);
    /* Blockwise quantization for the wire (src/base/dtype.h says the layout and the rule). dst gets
     * `pieces` pieces of `count` elements of dst_t: piece p at dst + p * piece_bytes, where
     * piece_bytes = fsdp_device_piece_bytes(kind, dst_t, count), holds elements
     * [p * count, (p + 1) * count) of src (src_t plain); source elements at or past `valid` read as
     * zero (a ragged end). A plain dst_t makes it a cast into pieces of count elements. */
    void (*quantize)(fsdp_backend *be, void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                     int pieces, size_t valid, fsdp_stream *s);
    /* The inverse: dst[p * count + i] (dst_t plain) = element i of piece p of src (src_t, blockwise
     * or plain, laid out as quantize writes it), for p < pieces, i < count. */
    void (*dequantize)(fsdp_backend *be, void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                       int pieces, fsdp_stream *s);
    /* dst[i] = (accumulate ? dst[i] : 0) + sum over p = 0, 1, .. pieces - 1 of element i of piece p
     * of src (laid out as quantize writes it), for i < count: the sum in fp32 in that order, rounded
     * once to dst_t (plain). The local half of a reduce-scatter done as an all-to-all. */
    void (*sum_pieces)(fsdp_backend *be, void *dst, fsdp_dtype dst_t, const void *src, fsdp_dtype src_t, size_t count,
                       int pieces, int accumulate, fsdp_stream *s);
    /* *out += sum(x^2) in fp32, deterministic order. */
    void (*sum_squares)(fsdp_backend *be, float *out, const void *x, fsdp_dtype t, size_t n, fsdp_stream *s);
    /* *out += sum(x), fp32, deterministic order. */
    void (*sum)(fsdp_backend *be, float *out, const float *x, size_t n, fsdp_stream *s);
    /* *scale = min(1, max_norm / (sqrt(*sumsq) + 1e-6)); max_norm <= 0 gives 1. */
    void (*clip_scale)(fsdp_backend *be, float *scale, const float *sumsq, float max_norm, fsdp_stream *s);
    /* The shard's part of a scatter-add of rows (cpu_add_rows in src/kernels/ops_cpu.h): dst (fp32)
     * holds elements [window_start, window_start + window_len) of a flat array; values are N rows of
     * C in the activation dtype. */
    void (*add_rows)(fsdp_backend *be, float *dst, int64_t window_start, int64_t window_len,
                     const fsdp_row_set *sets, int nsets, const void *values, int N, int C, fsdp_stream *s);
    /* AdamW on a flat range (decoupled weight decay, bias-corrected), the gradient multiplied by
     * *grad_scale first. param/grad/m/v share master_t. If `working` is not NULL the updated
     * parameter is also written there in working_t (the bf16 copy that gets gathered). */
    void (*adamw)(fsdp_backend *be, void *param, const void *grad, void *m, void *v, fsdp_dtype master_t,
                  size_t n, const fsdp_adamw_args *a, const float *grad_scale, void *working,
                  fsdp_dtype working_t, fsdp_stream *s);

    /* ---- model ops (compute stream) ---- */
    /* out[N,C] = wte[tokens[n]] (+ wpe[pos_offset + n % T] when wpe is not NULL). */
    void (*embedding_forward)(fsdp_backend *be, void *out, const int32_t *tokens, const void *wte,
                              const void *wpe, int pos_offset, int N, int T, int C);
    /* dwte[tokens[n]] += dout[n] unless tokens[n] == padding_idx (nn.Embedding's padding_idx; -1:
     * none); dwpe[pos_offset + n % T] += dout[n] when dwpe is not NULL. */
    void (*embedding_backward)(fsdp_backend *be, void *dwte, void *dwpe, const void *dout,
                               const int32_t *tokens, int padding_idx, int pos_offset, int N, int T, int C);

    /* out = x / sqrt(mean(x^2) + eps) * weight; rstd[N] saved. out_amax, here and in the other ops
     * that take one: NULL, or one fp32 of device memory that gets max |out| over the values as stored
     * (NaN if one is): the amax of the tensorwise FP8 product that reads out, reported by the op
     * that writes it (src/kernels/ops_cuda.h). */
    void (*rmsnorm_forward)(fsdp_backend *be, void *out, float *rstd, const void *inp, const void *weight,
                            int N, int C, float eps, float *out_amax);
    /* dinp += ..., dweight += ...; dinp_amax (as out_amax) gets max |dinp| as stored: the output
     * gradient of the projection before the norm. */
    void (*rmsnorm_backward)(fsdp_backend *be, void *dinp, void *dweight, const void *dout, const void *inp,
                             const void *weight, const float *rstd, int N, int C, float *dinp_amax);
    /* out = (x - mean) * rstd * weight + bias; mean[N], rstd[N] saved. */
    void (*layernorm_forward)(fsdp_backend *be, void *out, float *mean, float *rstd, const void *inp,
                              const void *weight, const void *bias, int N, int C, float eps, float *out_amax);
    /* dinp += ..., dweight += ..., dbias += ...; dinp_amax as rmsnorm_backward's. */
    void (*layernorm_backward)(fsdp_backend *be, void *dinp, void *dweight, void *dbias, const void *dout,
                               const void *inp, const void *weight, const float *mean, const float *rstd,
                               int N, int C, float *dinp_amax);

    /* out[N,OC] = inp[N,C] W[OC,C]^T (+ bias[OC]) (+ residual[N,OC]), then relu if `relu`.
     * residual may alias out (in-place residual add). */
    void (*matmul_forward)(fsdp_backend *be, void *out, const void *inp, const void *weight, const void *bias,
                           const void *residual, int N, int C, int OC, int relu);
    /* dinp[N,C] = dout W (overwritten; skipped when dinp is NULL); dweight += dout^T inp;
     * dbias += column sums of dout (when dbias is not NULL). */
    void (*matmul_backward)(fsdp_backend *be, void *dinp, void *dweight, void *dbias, const void *dout,
                            const void *inp, const void *weight, int N, int C, int OC);
    /* The same two products with FP8 operands (src/kernels/fp8.h: the recipe, the scaling, the
     * layouts): x and W cast to e4m3 with scales from their current amax, dy to recipe->grad_t, each
     * product summed in fp32 and scaled back; outputs in the act dtype, dweight accumulated in the
     * grad dtype, dbias from dy unquantized. N, C and OC must be multiples of 16
     * (fsdp_fp8_shape_ok) and the backend must have fp8_products; both are internal errors here, so
     * callers check them where they can refuse in one line. The CPU emulates (codes rounded with the
     * same scales, products in fp32); CUDA runs cuBLASLt's FP8 kernels. amax: what the product shares
     * with the ops around it (fsdp_fp8_amax: the amax of inp or dout that their producer reported,
     * and the forward's saved for the backward), each pass over memory it spares giving the same
     * scales and codes as measuring would. weight8: NULL, or the weight already in e4m3 (tensorwise
     * only: its codes as the gather brought them, fsdp_fp8_weight), which the products then read
     * instead of casting `weight` (the forward also saves its amax for a backward without it). */
    void (*matmul_forward_fp8)(fsdp_backend *be, void *out, const void *inp, const void *weight, const void *bias,
                               const void *residual, int N, int C, int OC, int relu, const fsdp_fp8_recipe *recipe,
                               fsdp_fp8_amax amax, const fsdp_fp8_weight *weight8);
    void (*matmul_backward_fp8)(fsdp_backend *be, void *dinp, void *dweight, void *dbias, const void *dout,
                                const void *inp, const void *weight, int N, int C, int OC,
                                const fsdp_fp8_recipe *recipe, fsdp_fp8_amax amax, const fsdp_fp8_weight *weight8);
    /* Product weights cast once per gather (src/kernels/fp8.h; the engine's FP8 weights, src/shard),
     * on stream s:
     *   fp8_amax:   amax[0] = max |x| over n elements of t (0 for none; NaN if one is);
     *   fp8_encode: scales (FSDP_FP8_SCALES floats) from the largest of amax_parts[p * stride] for
     *               p < parts, then n e4m3 codes of x (t) with that scale (n may be 0);
     *   fp8_unpack: weight m out of gathered pieces of `count` elements of dtype t whose codes were
     *               encoded with the weight's scales: its codes [rows, cols] and codes_t [cols, rows],
     *               and its values into the unit (unit_t) at m->offset (cpu_fp8_unpack). */
    void (*fp8_amax)(fsdp_backend *be, float *amax, const void *x, fsdp_dtype t, size_t n, fsdp_stream *s);
    void (*fp8_encode)(fsdp_backend *be, uint8_t *codes, float *scales, const float *amax_parts, int parts, int stride,
                       const void *x, fsdp_dtype t, size_t n, fsdp_stream *s);
    void (*fp8_unpack)(fsdp_backend *be, uint8_t *codes, uint8_t *codes_t, void *unit, fsdp_dtype unit_t,
                       const void *pieces, fsdp_dtype t, size_t count, const fsdp_fp8_matrix *m, const float *scales,
                       fsdp_stream *s);
    /* d *= (out > 0), in place: the backward of a relu whose output is `out`. */
    void (*relu_backward)(fsdp_backend *be, void *d, const void *out, size_t n);

    /* Rotary embedding, in place on the q and k parts of qkv[B,T,(Hq+2*Hkv)*D] (HF "rotate_half"
     * convention). cos_sin[T][D/2][2] holds cos and sin of position t times frequency i. */
    void (*rope_forward)(fsdp_backend *be, void *qkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D);
    /* The inverse rotation on dq and dk, in place on dqkv (dv untouched); dqkv_amax (as out_amax)
     * gets max |dqkv| over all three parts after it: the q|k|v projection's output gradient. */
    void (*rope_backward)(fsdp_backend *be, void *dqkv, const float *cos_sin, int B, int T, int Hq, int Hkv,
                          int D, float *dqkv_amax);

    /* Causal attention with grouped query heads (query head h reads kv head h / (Hq/Hkv)), scale
     * 1/sqrt(D). qkv[B,T,(Hq+2*Hkv)*D] as above; out[B,T,Hq*D]; lse[B,Hq,T] (natural-log
     * log-sum-exp of the scaled scores) always saved. EAGER also saves probs[B,Hq,T,T] (act dtype)
     * and its backward reads them; FLASH never materialises a T x T matrix (probs is NULL).
     * With dropout (drop active, site FSDP_DROPOUT_ATTN_PROBS: transformers' attention_dropout) the
     * probabilities are dropped before P V: out = (keep . P) V / (1 - p); lse and EAGER's probs
     * stay those of the undropped softmax and the backward regenerates the mask from the same
     * descriptor. drop NULL or inactive: exactly the dropout-free kernels.
     * window > 0 is a sliding window (Mistral's sliding_window): query t attends keys
     * t - window < j <= t only (EAGER's probs are 0 outside); window 0 is plain causal attention. */
    void (*attention_forward)(fsdp_backend *be, fsdp_attn mode, void *out, float *lse, void *probs,
                              const void *qkv, int B, int T, int Hq, int Hkv, int D, int window,
                              const fsdp_dropout *drop);
    /* NULL when `mode` can train attention over T tokens of head dim D with this sliding window
     * and attention dropout rate on this backend, else why not (one line): the trainer asks before
     * it loads anything (--attn cudnn needs cuDNN and supports neither windows nor dropout). */
    const char *(*attention_unsupported)(fsdp_backend *be, fsdp_attn mode, int T, int D, int window, double dropout);
    /* dqkv overwritten (all three parts). */
    void (*attention_backward)(fsdp_backend *be, fsdp_attn mode, void *dqkv, const void *dout,
                               const void *qkv, const void *out, const float *lse, const void *probs,
                               int B, int T, int Hq, int Hkv, int D, int window, const fsdp_dropout *drop);

    /* Per-head RMSNorm of the q and k heads of qkv (Qwen3's q_norm, k_norm; before rope_forward):
     * out[N, (Hq+2*Hkv)*D] = inp with query head h of each row x / sqrt(mean(x^2) + eps) * wq[D],
     * each key head the same with wk[D], the value heads copied; rstd[N, Hq+Hkv] saved. out must
     * not alias inp (the backward reads inp). */
    void (*qk_norm_forward)(fsdp_backend *be, void *out, float *rstd, const void *inp, const void *wq,
                            const void *wk, int N, int Hq, int Hkv, int D, float eps);
    /* dinp overwritten (q and k heads through the norm, value heads copied from dout; dinp may alias
     * dout); dwq += and dwk += (grad dtype). */
    void (*qk_norm_backward)(fsdp_backend *be, void *dinp, void *dwq, void *dwk, const void *dout, const void *inp,
                             const void *wq, const void *wk, const float *rstd, int N, int Hq, int Hkv, int D);

    /* ---- generation with a KV cache (no backward) ---- */
    /* The cache of one layer: k_cache and v_cache [Hkv, cap, D] (act dtype; kv head, position, head
     * dim). Copies the k and v heads of qkv[N, (Hq+2*Hkv)*D] (after rotary; row n is position
     * pos0 + n) into positions pos0 .. pos0 + N - 1 (< cap). */
    void (*kv_cache_append)(fsdp_backend *be, void *k_cache, void *v_cache, const void *qkv, int N, int pos0, int cap,
                            int Hq, int Hkv, int D);
    /* out[N, Hq*D] = attention of the query heads of qkv's rows over the cache: row n (position
     * pos0 + n) attends to cache positions 0 .. pos0 + n, which must have been appended; grouped
     * query heads (query head h reads kv head h / (Hq/Hkv)), scale 1/sqrt(D). Row for row what
     * attention_forward computes for the same keys and values; with window > 0 row n attends to
     * positions pos0 + n - window < j <= pos0 + n only, as attention_forward's window. */
    void (*attention_decode)(fsdp_backend *be, void *out, const void *qkv, const void *k_cache, const void *v_cache,
                             int N, int pos0, int cap, int Hq, int Hkv, int D, int window);

    /* ---- residual dropout (transformers' dropout on a block's output before the residual add) ---- */
    /* out[N,C] = residual + keep . x / (1 - p); out may alias residual or x. */
    void (*residual_dropout_forward)(fsdp_backend *be, void *out, const void *residual, const void *x, int N, int T,
                                     int C, const fsdp_dropout *drop);
    /* dx[N,C] = keep . dout / (1 - p), overwritten; dx may alias dout. */
    void (*dropout_backward)(fsdp_backend *be, void *dx, const void *dout, int N, int T, int C,
                             const fsdp_dropout *drop);
    /* The residual dropout fused with the norm that follows it, in one pass over [N, C]:
     * res_out = residual + keep . x / (1 - p) (stored in the act dtype; may alias residual), then
     * out = norm(res_out) with its statistics saved, exactly as rmsnorm_forward / layernorm_forward
     * of the stored res_out. After an attention block the norm is the same layer's post-attention
     * norm; after an MLP, the next layer's input norm or the final norm. */
    void (*rmsnorm_dropout_forward)(fsdp_backend *be, void *res_out, void *out, float *rstd, const void *residual,
                                    const void *x, const void *weight, int N, int T, int C, float eps,
                                    const fsdp_dropout *drop, float *out_amax);
    void (*layernorm_dropout_forward)(fsdp_backend *be, void *res_out, void *out, float *mean, float *rstd,
                                      const void *residual, const void *x, const void *weight, const void *bias,
                                      int N, int T, int C, float eps, const fsdp_dropout *drop, float *out_amax);
    /* The norm's backward (dinp +=, dweight +=, dbias += as rmsnorm_backward / layernorm_backward)
     * fused with the dropout backward of the residual branch that fed the norm's input: after
     * dinp is complete (it is the residual-stream gradient), dx = keep . dinp / (1 - p) is written
     * (overwritten; the gradient of that branch's output, which its projection's backward reads).
     * dx must not alias dinp or dout. dx_amax (as out_amax) gets max |dx| as stored. */
    void (*rmsnorm_dropout_backward)(fsdp_backend *be, void *dinp, void *dx, void *dweight, const void *dout,
                                     const void *inp, const void *weight, const float *rstd, int N, int T, int C,
                                     const fsdp_dropout *drop, float *dx_amax);
    void (*layernorm_dropout_backward)(fsdp_backend *be, void *dinp, void *dx, void *dweight, void *dbias,
                                       const void *dout, const void *inp, const void *weight, const float *mean,
                                       const float *rstd, int N, int T, int C, const fsdp_dropout *drop,
                                       float *dx_amax);

    /* gateup[N, 2F] = [gate | up] per row; out[N,F] = silu(gate) * up. */
    void (*swiglu_forward)(fsdp_backend *be, void *out, const void *gateup, int N, int F, float *out_amax);
    /* dgateup[N,2F] overwritten (its amax into dgateup_amax, as out_amax). */
    void (*swiglu_backward)(fsdp_backend *be, void *dgateup, const void *dout, const void *gateup, int N, int F,
                            float *dgateup_amax);

    /* Softmax cross-entropy over logits[n,V] against targets[n] (targets < 0 are ignored: loss 0,
     * gradient 0). losses[n] (fp32) overwritten; logits replaced IN PLACE by
     * grad_scale * d(loss)/d(logits). */
    void (*cross_entropy)(fsdp_backend *be, float *losses, void *logits, const int32_t *targets, int n, int V,
                          float grad_scale);
} fsdp_backend_ops;

struct fsdp_backend {
    const fsdp_backend_runtime *runtime;
    const fsdp_backend_collectives *coll;
    const fsdp_backend_ops *ops;

    const char *name;      /* "cpu" or "cuda" */
    char device_name[128]; /* "CPU (8 threads)", "NVIDIA H200" */
    double peak_tflops;    /* dense bf16 peak for MFU (989 on H100/H200 SXM); 0 when unknown */
    fsdp_dtype act_dtype, grad_dtype;
    int emulated_bf16;     /* 1 on the CPU: bf16 values live in fp32 storage */
    /* 1 when matmul_*_fp8 can run: always on the CPU (emulated), on GPUs of compute capability 8.9
     * or newer (Ada, Hopper: cuBLASLt's FP8 kernels); fp8_unavailable then says why not. */
    int fp8_products;
    char fp8_unavailable[128];
    fsdp_stream *compute;  /* the stream the model's ops run on */
    size_t reserved_bytes, max_reserved_bytes; /* device memory held by alloc, and its peak */
    fsdp_device_kind kind;
    size_t memory_limit;   /* fsdp_backend_options.memory_limit */
    /* GPU memory in use besides reserved_bytes, measured with cudaMemGetInfo (0 on the CPU): once the
     * backend was created (the CUDA context, cuBLAS handles), and what creating the NCCL
     * communicators added. NCCL allocates more at its first collectives. */
    size_t outside_at_create, outside_comm_init;
    fsdp_oom oom;

    void *context; /* the backend's private state (cpu_context, cuda_context) */
};

/* Creates the backend named by opts->kind ("auto" picks CUDA when it was built in and a GPU is
 * visible, else the CPU). Returns NULL with err set when the kind cannot be had. */
fsdp_backend *fsdp_backend_create(const fsdp_backend_options *opts, fsdp_err *err);
fsdp_backend *fsdp_backend_cpu_create(const fsdp_backend_options *opts, fsdp_err *err);
#ifdef FSDP_HAVE_CUDA
fsdp_backend *fsdp_backend_cuda_create(const fsdp_backend_options *opts, fsdp_err *err);
#endif
/* 1 when this build has the CUDA backend and at least one GPU is visible. */
int fsdp_backend_cuda_available(void);

/* The failure path of alloc (see fsdp_oom): returns NULL when deferred, else does not return.
 * `detail` says what the device had; `bytes` is 0 when a library failed to allocate an amount it
 * does not say (NCCL's buffers). */
void *fsdp_backend_out_of_memory(fsdp_backend *be, size_t bytes, const char *what, const char *detail);
/* The amount of an out-of-memory message: " allocating 4.60 GiB", or "" for bytes 0 (a library's own). */
const char *fsdp_oom_amount_text(size_t bytes, char buf[48]);

/* Total memory of the first visible GPU and its name; 0 when this build has no CUDA backend or no
 * GPU is visible. */
size_t fsdp_backend_gpu_memory(char *name, size_t name_cap);
#ifdef FSDP_HAVE_CUDA
size_t fsdp_backend_cuda_gpu_memory(char *name, size_t name_cap);
#endif

#endif
