/* The attention launchers of ops_cuda.h: flash forward/backward dispatch between the tensor-core
 * path (attention_flash_fwd.cu, attention_flash_bwd.cu: bf16, D in {64, 128}, 16-byte aligned
 * tensors) and the exact path (attention_exact.cu: everything else), and the causal softmax
 * kernels of eager attention (whose Q K^T and P V are cuBLAS batched products in the backend).
 *
 * The softmax kernels use one warp per row of scores and three passes over it (max, sum,
 * write), each lane owning the columns lane + 32 i: every element is read and written by the
 * same lane, which is what lets probs alias scores and dscores alias dprobs.
 *
 * A sliding window (window > 0, Mistral) rides in attn_args to the flash and exact kernels, and is
 * a launch argument of the eager softmax, which zeroes the probabilities outside it.
 *
 * Dropout on the probabilities: the flash launchers pass the descriptor to the kernels (attn_args);
 * the eager softmax kernels have separately compiled variants (drop = 1) that also write the
 * dropped probabilities keep . P / (1 - p) that P V (and, in the backward, dV) multiply, while
 * probs keeps the undropped softmax; each lane draws the keep bit of each of its elements. */
#include <math.h>

#include "attention_common.cuh"

#define SM_WARPS 8

static attn_args attn_make(const char *op, int B, int T, int Hq, int Hkv, int D) {
    if (B < 0 || T < 0 || Hq < 1 || Hkv < 1 || Hq % Hkv != 0 || D < 1 || D > ATTN_DMAX)
        fsdp_fatal("%s: unsupported shape B=%d T=%d Hq=%d Hkv=%d D=%d (need Hq %% Hkv == 0, 1 <= D <= %d)", op, B, T,
                   Hq, Hkv, D, ATTN_DMAX);
    attn_args a;
    memset(&a, 0, sizeof a);
    a.B = B, a.T = T, a.Hq = Hq, a.Hkv = Hkv, a.D = D, a.group = Hq / Hkv;
    a.W = (long long)(Hq + 2 * Hkv) * D;
    a.scale = 1.0f / sqrtf((float)D);
    a.sl2 = a.scale * ATTN_LOG2E;
    return a;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The kernels' form of drop (NULL or a zero rate: inactive). */
static attn_dropout attn_dropout_make(const attn_args *a, const fsdp_dropout *drop) {
    attn_dropout dr;
    memset(&dr, 0, sizeof dr);
    if (!fsdp_dropout_active(drop)) return dr;
    fsdp_dropout_check_probs(drop, a->B, a->Hq, a->T);
    dr.active = 1;
    dr.drop = *drop;
    dr.tb = (a->T + 15) / 16;
    return dr;
}

void fsdp_cuda_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int Hq, int Hkv, int D,
                             const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s) {
    fsdp_cuda_flash_forward_window(out, lse, qkv, B, T, Hq, Hkv, D, 0, drop, act, s);
}

void fsdp_cuda_flash_backward(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int B, int T, int Hq, int Hkv, int D, const fsdp_dropout *drop, fsdp_dtype act,
                              float *scratch, cudaStream_t s) {
    fsdp_cuda_flash_backward_window(dqkv, dout, qkv, out, lse, B, T, Hq, Hkv, D, 0, drop, act, scratch, s);
}

/* A window as wide as the sequence masks nothing: the kernels then take their causal-only path. */
static int attn_window(int window, int T) { return window > 0 && window < T ? window : 0; }

void fsdp_cuda_flash_forward_window(void *out, float *lse, const void *qkv, int B, int T, int Hq, int Hkv, int D,
                                    int window, const fsdp_dropout *drop, fsdp_dtype act, cudaStream_t s) {
    attn_args a = attn_make("fsdp_cuda_flash_forward", B, T, Hq, Hkv, D);
    if ((long long)B * T == 0) return;
    a.window = attn_window(window, T);
    const attn_dropout dr = attn_dropout_make(&a, drop);
    a.qkv = qkv, a.o = out, a.lse_out = lse;
    if (act == FSDP_BF16 && aligned16(qkv) && aligned16(out) && attn_tc_forward(&a, &dr, s) == 0) return;
    attn_exact_forward(&a, &dr, act, s);
}

/* The two backwards: dq_accum NULL runs the deterministic kernels; else dQ's fp32 sums go there (the
 * atomic-dQ kernel), and shapes the tensor-core path does not take run the exact path either way. */
static void flash_backward(const char *op, void *dqkv, const void *dout, const void *qkv, const void *out,
                           const float *lse, int B, int T, int Hq, int Hkv, int D, int window,
                           const fsdp_dropout *drop, fsdp_dtype act, float *scratch, float *dq_accum, cudaStream_t s) {
    attn_args a = attn_make(op, B, T, Hq, Hkv, D);
    if ((long long)B * T == 0) return;
    a.window = attn_window(window, T);
    const attn_dropout dr = attn_dropout_make(&a, drop);
    a.qkv = qkv, a.out = out, a.dout = dout, a.lse = lse, a.dqkv = dqkv;
    a.delta = a.delta_out = scratch;
    a.dq_accum = dq_accum;
    attn_delta(&a, act, s);
    if (act == FSDP_BF16 && aligned16(qkv) && aligned16(dout) && aligned16(dqkv) && attn_tc_backward(&a, &dr, s) == 0)
        return;
    a.dq_accum = NULL;
    attn_exact_backward(&a, &dr, act, s);
}

void fsdp_cuda_flash_backward_window(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                     int B, int T, int Hq, int Hkv, int D, int window, const fsdp_dropout *drop,
                                     fsdp_dtype act, float *scratch, cudaStream_t s) {
    flash_backward("fsdp_cuda_flash_backward", dqkv, dout, qkv, out, lse, B, T, Hq, Hkv, D, window, drop, act, scratch,
                   NULL, s);
}

void fsdp_cuda_flash_backward_atomic(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                     int B, int T, int Hq, int Hkv, int D, int window, const fsdp_dropout *drop,
                                     fsdp_dtype act, float *scratch, cudaStream_t s) {
    float *dq_accum = (float *)((char *)scratch + fsdp_cuda_flash_backward_atomic_delta_bytes(B, T, Hq));
    flash_backward("fsdp_cuda_flash_backward_atomic", dqkv, dout, qkv, out, lse, B, T, Hq, Hkv, D, window, drop, act,
                   scratch, dq_accum, s);
}

/* ---- eager softmax ------------------------------------------------------------------------------ */

static __device__ __forceinline__ float sm_ld(const void *p, long long i, int bf) {
    return bf ? __bfloat162float(((const bf16 *)p)[i]) : ((const float *)p)[i];
}
static __device__ __forceinline__ void sm_st(void *p, long long i, float v, int bf) {
    if (bf)
        ((bf16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* The dropout factor keep / (1 - p) of element (row r, column j) of [B * Hq, T, T]. */
static __device__ __forceinline__ float sm_keep(const fsdp_dropout &d, long long r, int j, int T, int Hq) {
    const long long bh = r / T;
    const int b = (int)(bh / Hq), h = (int)(bh % Hq), t = (int)(r % T);
    return fsdp_dropout_keep_probs(&d, b, h, t, j, T) ? d.scale : 0.0f;
}

/* Row r = (bh, t) of [BH, T, T]: columns j0..t are visible (j0 = t - window + 1 with a window, else
 * 0). probs may alias scores (a lane reads and writes its own columns lane + 32 i). With drop,
 * dropped[r, j] = keep' P as well. */
static __device__ __forceinline__ void softmax_fwd_body(void *probs, void *dropped, float *lse, const void *scores,
                                                        long long rows, int T, int window, float scale, int bf,
                                                        int drop, const fsdp_dropout &d, int Hq) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long r = (long long)blockIdx.x * SM_WARPS + warp;
    if (r >= rows) return;
    const int t = (int)(r % T), j0 = window > 0 ? max(0, t - window + 1) : 0;
    const long long base = r * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        if (j >= j0) m = fmaxf(m, scale * sm_ld(scores, base + j, bf));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32)
        if (j >= j0) sum += __expf(scale * sm_ld(scores, base + j, bf) - m);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float l = m + __logf(sum);
    for (int j = lane; j < T; j += 32) {
        const int visible = j >= j0 && j <= t;
        const float p = visible ? __expf(scale * sm_ld(scores, base + j, bf) - l) : 0.0f;
        sm_st(probs, base + j, p, bf);
        if (drop) sm_st(dropped, base + j, visible ? p * sm_keep(d, r, j, T, Hq) : 0.0f, bf);
    }
    if (lane == 0) lse[r] = l;
}
__global__ void __launch_bounds__(SM_WARPS * 32) attn_causal_softmax_fwd(void *probs, float *lse, const void *scores,
                                                                         long long rows, int T, int window,
                                                                         float scale, int bf) {
    const fsdp_dropout none{};
    softmax_fwd_body(probs, NULL, lse, scores, rows, T, window, scale, bf, 0, none, 1);
}
__global__ void __launch_bounds__(SM_WARPS * 32)
    attn_causal_softmax_drop_fwd(void *probs, void *dropped, float *lse, const void *scores, long long rows, int T,
                                 int window, float scale, int bf, const fsdp_dropout d, int Hq) {
    softmax_fwd_body(probs, dropped, lse, scores, rows, T, window, scale, bf, 1, d, Hq);
}

/* dscores = scale * P * (dP - sum_j dP_j P_j) over visible columns, 0 elsewhere; may alias dprobs.
 * With drop, dprobs is the gradient of the dropped probabilities: dP = keep' dprobs, and
 * dropped = keep' P (for dV) is written. */
static __device__ __forceinline__ void softmax_bwd_body(void *dscores, void *dropped, const void *dprobs,
                                                        const void *probs, long long rows, int T, float scale, int bf,
                                                        int drop, const fsdp_dropout &d, int Hq) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long r = (long long)blockIdx.x * SM_WARPS + warp;
    if (r >= rows) return;
    const int t = (int)(r % T);
    const long long base = r * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float dp = sm_ld(dprobs, base + j, bf);
        if (drop) dp *= sm_keep(d, r, j, T, Hq);
        dot = fmaf(dp, sm_ld(probs, base + j, bf), dot);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    for (int j = lane; j < T; j += 32) {
        float v = 0.0f, pd = 0.0f;
        if (j <= t) {
            const float p = sm_ld(probs, base + j, bf), k = drop ? sm_keep(d, r, j, T, Hq) : 1.0f;
            v = scale * p * (sm_ld(dprobs, base + j, bf) * k - dot);
            pd = p * k;
        }
        sm_st(dscores, base + j, v, bf);
        if (drop) sm_st(dropped, base + j, pd, bf);
    }
}
__global__ void __launch_bounds__(SM_WARPS * 32) attn_causal_softmax_bwd(void *dscores, const void *dprobs,
                                                                         const void *probs, long long rows, int T,
                                                                         float scale, int bf) {
    const fsdp_dropout none{};
    softmax_bwd_body(dscores, NULL, dprobs, probs, rows, T, scale, bf, 0, none, 1);
}
__global__ void __launch_bounds__(SM_WARPS * 32)
    attn_causal_softmax_drop_bwd(void *dscores, void *dropped, const void *dprobs, const void *probs, long long rows,
                                 int T, float scale, int bf, const fsdp_dropout d, int Hq) {
    softmax_bwd_body(dscores, dropped, dprobs, probs, rows, T, scale, bf, 1, d, Hq);
}

static unsigned sm_blocks(long long rows) { return (unsigned)((rows + SM_WARPS - 1) / SM_WARPS); }

void fsdp_cuda_causal_softmax_forward(void *probs, float *lse, const void *scores, int BH, int T, float scale,
                                      fsdp_dtype act, cudaStream_t s) {
    fsdp_cuda_causal_softmax_forward_window(probs, lse, scores, BH, T, 0, scale, act, s);
}

void fsdp_cuda_causal_softmax_forward_window(void *probs, float *lse, const void *scores, int BH, int T, int window,
                                             float scale, fsdp_dtype act, cudaStream_t s) {
    const long long rows = (long long)BH * T;
    if (rows <= 0) return;
    attn_causal_softmax_fwd<<<sm_blocks(rows), SM_WARPS * 32, 0, s>>>(probs, lse, scores, rows, T,
                                                                      attn_window(window, T), scale,
                                                                      act == FSDP_BF16);
    attn_check_launch("attn_causal_softmax_fwd");
}

void fsdp_cuda_causal_softmax_backward(void *dscores, const void *dprobs, const void *probs, int BH, int T,
                                       float scale, fsdp_dtype act, cudaStream_t s) {
    const long long rows = (long long)BH * T;
    if (rows <= 0) return;
    attn_causal_softmax_bwd<<<sm_blocks(rows), SM_WARPS * 32, 0, s>>>(dscores, dprobs, probs, rows, T, scale,
                                                                      act == FSDP_BF16);
    attn_check_launch("attn_causal_softmax_bwd");
}

void fsdp_cuda_causal_softmax_dropout_forward(void *probs, void *dropped, float *lse, const void *scores, int B,
                                              int Hq, int T, float scale, const fsdp_dropout *drop, fsdp_dtype act,
                                              cudaStream_t s) {
    fsdp_cuda_causal_softmax_dropout_forward_window(probs, dropped, lse, scores, B, Hq, T, 0, scale, drop, act, s);
}

void fsdp_cuda_causal_softmax_dropout_forward_window(void *probs, void *dropped, float *lse, const void *scores, int B,
                                                     int Hq, int T, int window, float scale, const fsdp_dropout *drop,
                                                     fsdp_dtype act, cudaStream_t s) {
    if (!fsdp_dropout_active(drop))
        fsdp_fatal("internal error: fsdp_cuda_causal_softmax_dropout_forward without dropout");
    const long long rows = (long long)B * Hq * T;
    if (rows <= 0) return;
    fsdp_dropout_check_probs(drop, B, Hq, T);
    attn_causal_softmax_drop_fwd<<<sm_blocks(rows), SM_WARPS * 32, 0, s>>>(
        probs, dropped, lse, scores, rows, T, attn_window(window, T), scale, act == FSDP_BF16, *drop, Hq);
    attn_check_launch("attn_causal_softmax_drop_fwd");
}

void fsdp_cuda_causal_softmax_dropout_backward(void *dscores, void *dropped, const void *dprobs, const void *probs,
                                               int B, int Hq, int T, float scale, const fsdp_dropout *drop,
                                               fsdp_dtype act, cudaStream_t s) {
    if (!fsdp_dropout_active(drop))
        fsdp_fatal("internal error: fsdp_cuda_causal_softmax_dropout_backward without dropout");
    const long long rows = (long long)B * Hq * T;
    if (rows <= 0) return;
    fsdp_dropout_check_probs(drop, B, Hq, T);
    attn_causal_softmax_drop_bwd<<<sm_blocks(rows), SM_WARPS * 32, 0, s>>>(dscores, dropped, dprobs, probs, rows, T,
                                                                           scale, act == FSDP_BF16, *drop, Hq);
    attn_check_launch("attn_causal_softmax_drop_bwd");
}
