/* The attention launchers of ops_cuda.h: flash forward/backward dispatch between the tensor-core
 * path (attention_flash_fwd.cu, attention_flash_bwd.cu: bf16, D in {64, 128}, 16-byte aligned
 * tensors) and the exact path (attention_exact.cu: everything else), and the causal softmax
 * kernels of eager attention (whose Q K^T and P V are cuBLAS batched products in the backend).
 *
 * The softmax kernels use one warp per row of scores and three passes over it (max, sum,
 * write), each lane owning the columns lane + 32 i: every element is read and written by the
 * same lane, which is what lets probs alias scores and dscores alias dprobs. */
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

void fsdp_cuda_flash_forward(void *out, float *lse, const void *qkv, int B, int T, int Hq, int Hkv, int D,
                             fsdp_dtype act, cudaStream_t s) {
    attn_args a = attn_make("fsdp_cuda_flash_forward", B, T, Hq, Hkv, D);
    if ((long long)B * T == 0) return;
    a.qkv = qkv, a.o = out, a.lse_out = lse;
    if (act == FSDP_BF16 && aligned16(qkv) && aligned16(out) && attn_tc_forward(&a, s) == 0) return;
    attn_exact_forward(&a, act, s);
}

void fsdp_cuda_flash_backward(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                              int B, int T, int Hq, int Hkv, int D, fsdp_dtype act, float *scratch, cudaStream_t s) {
    attn_args a = attn_make("fsdp_cuda_flash_backward", B, T, Hq, Hkv, D);
    if ((long long)B * T == 0) return;
    a.qkv = qkv, a.out = out, a.dout = dout, a.lse = lse, a.dqkv = dqkv;
    a.delta = a.delta_out = scratch;
    attn_delta(&a, act, s);
    if (act == FSDP_BF16 && aligned16(qkv) && aligned16(dout) && aligned16(dqkv) && attn_tc_backward(&a, s) == 0)
        return;
    attn_exact_backward(&a, act, s);
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

/* Row r = (bh, t) of [BH, T, T]: columns 0..t are visible. probs may alias scores. */
__global__ void __launch_bounds__(SM_WARPS * 32)
    attn_causal_softmax_fwd(void *probs, float *lse, const void *scores, long long rows, int T, float scale, int bf) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long r = (long long)blockIdx.x * SM_WARPS + warp;
    if (r >= rows) return;
    const int t = (int)(r % T);
    const long long base = r * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32) m = fmaxf(m, scale * sm_ld(scores, base + j, bf));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) sum += __expf(scale * sm_ld(scores, base + j, bf) - m);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float l = m + __logf(sum);
    for (int j = lane; j < T; j += 32)
        sm_st(probs, base + j, j <= t ? __expf(scale * sm_ld(scores, base + j, bf) - l) : 0.0f, bf);
    if (lane == 0) lse[r] = l;
}

/* dscores = scale * P * (dP - sum_j dP_j P_j) over visible columns, 0 elsewhere; may alias dprobs. */
__global__ void __launch_bounds__(SM_WARPS * 32) attn_causal_softmax_bwd(void *dscores, const void *dprobs,
                                                                         const void *probs, long long rows, int T,
                                                                         float scale, int bf) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long r = (long long)blockIdx.x * SM_WARPS + warp;
    if (r >= rows) return;
    const int t = (int)(r % T);
    const long long base = r * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot = fmaf(sm_ld(dprobs, base + j, bf), sm_ld(probs, base + j, bf), dot);
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    for (int j = lane; j < T; j += 32) {
        float v = 0.0f;
        if (j <= t) v = scale * sm_ld(probs, base + j, bf) * (sm_ld(dprobs, base + j, bf) - dot);
        sm_st(dscores, base + j, v, bf);
    }
}

void fsdp_cuda_causal_softmax_forward(void *probs, float *lse, const void *scores, int BH, int T, float scale,
                                      fsdp_dtype act, cudaStream_t s) {
    const long long rows = (long long)BH * T;
    if (rows <= 0) return;
    attn_causal_softmax_fwd<<<(unsigned)((rows + SM_WARPS - 1) / SM_WARPS), SM_WARPS * 32, 0, s>>>(
        probs, lse, scores, rows, T, scale, act == FSDP_BF16);
    attn_check_launch("attn_causal_softmax_fwd");
}

void fsdp_cuda_causal_softmax_backward(void *dscores, const void *dprobs, const void *probs, int BH, int T,
                                       float scale, fsdp_dtype act, cudaStream_t s) {
    const long long rows = (long long)BH * T;
    if (rows <= 0) return;
    attn_causal_softmax_bwd<<<(unsigned)((rows + SM_WARPS - 1) / SM_WARPS), SM_WARPS * 32, 0, s>>>(
        dscores, dprobs, probs, rows, T, scale, act == FSDP_BF16);
    attn_check_launch("attn_causal_softmax_bwd");
}
