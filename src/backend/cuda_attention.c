/* Attention on the GPU: flash (the kernels in src/kernels/cuda/attention*.cu) or eager, composed
 * here as the course's baseline computes it: scores by batched GEMM into the [B,Hq,T,T] probability
 * buffer, a causal softmax in place, then P V by batched GEMM; the backward likewise.
 *
 * The batched GEMMs run once per (sequence, position inside the query-head group), each batching
 * over the kv heads, so grouped-query heads need no copies: query head j*g+i reads kv head j. All
 * matrices are addressed in the column-major convention of cuBLAS.
 *
 * Eager dropout: the softmax kernel writes the undropped probabilities to probs (saved for the
 * backward) and the dropped ones to scratch, which P V reads; the backward's softmax kernel turns
 * dP into dS in place and rewrites the dropped probabilities beside it for dV. */
#include <math.h>

#include "../kernels/ops_cuda.h"
#include "cuda_internal.h"
#if FSDP_HAVE_CUDNN
#include "cuda_cudnn_attention.h"
#endif

static size_t esize(fsdp_backend *be) { return fsdp_dtype_info_of(be->act_dtype)->bytes; }

/* Why --attn cudnn cannot run this attention (and, with `backward`, its backward); NULL: it can. */
static const char *cudnn_refusal(fsdp_backend *be, int T, int D, int window, const fsdp_dropout *drop, int backward) {
#if FSDP_HAVE_CUDNN
    return fsdp_cuda_cudnn_attention_unsupported(be->act_dtype, T, D, window, drop, backward);
#else
    (void)be, (void)T, (void)D, (void)window, (void)drop, (void)backward;
    return "this build has no cuDNN (cudnn_graph.h was not found when it was configured)";
#endif
}

const char *fsdp_cuda_attention_unsupported_op(fsdp_backend *be, fsdp_attn mode, int T, int D, int window,
                                              double dropout) {
    if (mode != FSDP_ATTN_CUDNN) return NULL;
    const fsdp_dropout drop = fsdp_dropout_make(dropout, 0, 0, 0, FSDP_DROPOUT_ATTN_PROBS);
    return cudnn_refusal(be, T, D, window, dropout > 0 ? &drop : NULL, 1);
}

/* --attn cudnn: whether the op runs on cuDNN; a case it cannot run ends the run saying why (the
 * trainer asked at set-up, so this is for callers that did not). */
static int use_cudnn(fsdp_backend *be, fsdp_attn mode, int T, int D, int window, const fsdp_dropout *drop,
                     int backward) {
    if (mode != FSDP_ATTN_CUDNN) return 0;
    const char *why = cudnn_refusal(be, T, D, window, drop, backward);
    if (why) fsdp_fatal("--attn cudnn: %s; --attn flash runs it", why);
    return 1;
}

void fsdp_cuda_attention_forward_op(fsdp_backend *be, fsdp_attn mode, void *out, float *lse, void *probs,
                                    const void *qkv, int B, int T, int Hq, int Hkv, int D, int window,
                                    const fsdp_dropout *drop) {
    cudaStream_t s = compute_stream(be);
    if (use_cudnn(be, mode, T, D, window, drop, 0)) {
#if FSDP_HAVE_CUDNN /* (without it use_cudnn ends the run) */
        fsdp_cuda_cudnn_attention_forward(be, out, lse, qkv, B, T, Hq, Hkv, D);
#endif
        return;
    }
    if (fsdp_attn_flash(mode) || !probs) {
        fsdp_cuda_flash_forward_window(out, lse, qkv, B, T, Hq, Hkv, D, window, drop, be->act_dtype, s);
        return;
    }
    size_t es = esize(be);
    int g = Hq / Hkv, rs = (Hq + 2 * Hkv) * D, os = Hq * D;
    long long TT = (long long)T * T;
    const char *base = qkv;
    for (int b = 0; b < B; b++) {
        const char *seq = base + (size_t)b * T * rs * es;
        for (int i = 0; i < g; i++) {
            /* scores^T[T_k, T_q] = K_j (op T) x Q_h, h = j*g + i, batched over j */
            const void *K = seq + (size_t)Hq * D * es, *Q = seq + (size_t)i * D * es;
            void *S = (char *)probs + (size_t)((long long)b * Hq + i) * TT * es;
            fsdp_cuda_gemm_strided_batched(be, 1, 0, T, T, D, K, rs, D, Q, rs, (long long)g * D, 0.0f, S, T,
                                           g * TT, Hkv, be->act_dtype, s);
        }
    }
    const void *pv = probs; /* the probabilities P V multiplies */
    if (fsdp_dropout_active(drop)) {
        void *dropped = fsdp_cuda_scratch(be, (size_t)B * Hq * TT * es);
        fsdp_cuda_causal_softmax_dropout_forward_window(probs, dropped, lse, probs, B, Hq, T, window,
                                                        1.0f / sqrtf((float)D), drop, be->act_dtype, s);
        pv = dropped;
    } else {
        fsdp_cuda_causal_softmax_forward_window(probs, lse, probs, B * Hq, T, window, 1.0f / sqrtf((float)D),
                                                be->act_dtype, s);
    }
    for (int b = 0; b < B; b++) {
        const char *seq = base + (size_t)b * T * rs * es;
        for (int i = 0; i < g; i++) {
            /* out_h^T[D, T_q] = V_j^T[D, T_k] x P_h^T[T_k, T_q] */
            const void *V = seq + (size_t)(Hq + Hkv) * D * es;
            const void *P = (const char *)pv + (size_t)((long long)b * Hq + i) * TT * es;
            void *O = (char *)out + ((size_t)b * T * os + (size_t)i * D) * es;
            fsdp_cuda_gemm_strided_batched(be, 0, 0, D, T, T, V, rs, D, P, T, g * TT, 0.0f, O, os, (long long)g * D,
                                           Hkv, be->act_dtype, s);
        }
    }
}

void fsdp_cuda_attention_backward_op(fsdp_backend *be, fsdp_attn mode, void *dqkv, const void *dout, const void *qkv,
                                     const void *out, const float *lse, const void *probs, int B, int T, int Hq,
                                     int Hkv, int D, int window, const fsdp_dropout *drop) {
    cudaStream_t s = compute_stream(be);
    if (use_cudnn(be, mode, T, D, window, drop, 1)) {
#if FSDP_HAVE_CUDNN /* (without it use_cudnn ends the run) */
        fsdp_cuda_cudnn_attention_backward(be, dqkv, dout, qkv, out, lse, B, T, Hq, Hkv, D);
#endif
        return;
    }
    if (mode == FSDP_ATTN_FLASH_ATOMIC) {
        float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_flash_backward_atomic_scratch(B, T, Hq, Hkv, D));
        fsdp_cuda_flash_backward_atomic(dqkv, dout, qkv, out, lse, B, T, Hq, Hkv, D, window, drop, be->act_dtype,
                                        scratch, s);
        return;
    }
    if (mode == FSDP_ATTN_FLASH || !probs) {
        float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_flash_backward_scratch(B, T, Hq, Hkv, D));
        fsdp_cuda_flash_backward_window(dqkv, dout, qkv, out, lse, B, T, Hq, Hkv, D, window, drop, be->act_dtype,
                                        scratch, s);
        return;
    }
    /* Eager: the saved probabilities are 0 outside a window, which makes dS 0 there. */
    size_t es = esize(be);
    int g = Hq / Hkv, rs = (Hq + 2 * Hkv) * D, os = Hq * D;
    long long TT = (long long)T * T;
    const int dropping = fsdp_dropout_active(drop);
    void *dP = fsdp_cuda_scratch(be, fsdp_cuda_eager_backward_scratch(B, T, Hq, es, dropping));
    for (int b = 0; b < B; b++) {
        const char *seq = (const char *)qkv + (size_t)b * T * rs * es;
        for (int i = 0; i < g; i++) {
            /* dP^T[T_k, T_q] = V_j (op T) x dO_h */
            const void *V = seq + (size_t)(Hq + Hkv) * D * es;
            const void *dO = (const char *)dout + ((size_t)b * T * os + (size_t)i * D) * es;
            void *dPh = (char *)dP + (size_t)((long long)b * Hq + i) * TT * es;
            fsdp_cuda_gemm_strided_batched(be, 1, 0, T, T, D, V, rs, D, dO, os, (long long)g * D, 0.0f, dPh, T, g * TT,
                                           Hkv, be->act_dtype, s);
        }
    }
    const void *pv = probs; /* the probabilities of dV = P^T dO */
    if (dropping) {
        void *dropped = (char *)dP + (size_t)B * Hq * TT * es;
        fsdp_cuda_causal_softmax_dropout_backward(dP, dropped, dP, probs, B, Hq, T, 1.0f / sqrtf((float)D), drop,
                                                  be->act_dtype, s);
        pv = dropped;
    } else {
        fsdp_cuda_causal_softmax_backward(dP, dP, probs, B * Hq, T, 1.0f / sqrtf((float)D), be->act_dtype, s);
    }
    for (int b = 0; b < B; b++) {
        const char *seq = (const char *)qkv + (size_t)b * T * rs * es;
        char *dseq = (char *)dqkv + (size_t)b * T * rs * es;
        for (int i = 0; i < g; i++) {
            const void *Q = seq + (size_t)i * D * es, *K = seq + (size_t)Hq * D * es;
            const void *dO = (const char *)dout + ((size_t)b * T * os + (size_t)i * D) * es;
            const void *dS = (const char *)dP + (size_t)((long long)b * Hq + i) * TT * es;
            const void *P = (const char *)pv + (size_t)((long long)b * Hq + i) * TT * es;
            void *dQ = dseq + (size_t)i * D * es, *dK = dseq + (size_t)Hq * D * es;
            void *dV = dseq + (size_t)(Hq + Hkv) * D * es;
            float acc = i > 0 ? 1.0f : 0.0f; /* kv gradients sum over the heads of their group */
            /* dQ_h^T[D, T_q] = K_j^T[D, T_k] x dS_h^T[T_k, T_q] */
            fsdp_cuda_gemm_strided_batched(be, 0, 0, D, T, T, K, rs, D, dS, T, g * TT, 0.0f, dQ, rs, (long long)g * D,
                                           Hkv, be->act_dtype, s);
            /* dK_j^T[D, T_k] += Q_h^T[D, T_q] x dS_h[T_q, T_k] */
            fsdp_cuda_gemm_strided_batched(be, 0, 1, D, T, T, Q, rs, (long long)g * D, dS, T, g * TT, acc, dK, rs, D,
                                           Hkv, be->act_dtype, s);
            /* dV_j^T[D, T_k] += dO_h^T[D, T_q] x P_h[T_q, T_k] */
            fsdp_cuda_gemm_strided_batched(be, 0, 1, D, T, T, dO, os, (long long)g * D, P, T, g * TT, acc, dV, rs, D,
                                           Hkv, be->act_dtype, s);
        }
    }
    (void)out;
    (void)lse;
}

/* Generation over a KV cache (src/kernels/cuda/attention_decode.cu). */
void fsdp_cuda_kv_cache_append_op(fsdp_backend *be, void *k_cache, void *v_cache, const void *qkv, int N, int pos0,
                                  int cap, int Hq, int Hkv, int D) {
    fsdp_cuda_kv_cache_append(k_cache, v_cache, qkv, N, pos0, cap, Hq, Hkv, D, be->act_dtype, compute_stream(be));
}

void fsdp_cuda_attention_decode_op(fsdp_backend *be, void *out, const void *qkv, const void *k_cache,
                                   const void *v_cache, int N, int pos0, int cap, int Hq, int Hkv, int D, int window) {
    size_t bytes = fsdp_cuda_decode_scratch(N, fsdp_cuda_decode_keys(pos0 + N, window), Hq, D);
    float *scratch = bytes ? fsdp_cuda_scratch(be, bytes) : NULL;
    fsdp_cuda_attention_decode_window(out, qkv, k_cache, v_cache, N, pos0, cap, Hq, Hkv, D, window, be->act_dtype,
                                      scratch, compute_stream(be));
}

/* Per-head q/k RMSNorm (src/kernels/cuda/qk_norm.cu). */
void fsdp_cuda_qk_norm_forward_op(fsdp_backend *be, void *out, float *rstd, const void *inp, const void *wq,
                                  const void *wk, int N, int Hq, int Hkv, int D, float eps) {
    fsdp_cuda_qk_norm_forward(out, rstd, inp, wq, wk, N, Hq, Hkv, D, eps, be->act_dtype, compute_stream(be));
}

void fsdp_cuda_qk_norm_backward_op(fsdp_backend *be, void *dinp, void *dwq, void *dwk, const void *dout,
                                   const void *inp, const void *wq, const void *wk, const float *rstd, int N, int Hq,
                                   int Hkv, int D) {
    float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_qk_norm_backward_scratch(N, D));
    fsdp_cuda_qk_norm_backward(dinp, dwq, dwk, dout, inp, wq, wk, rstd, N, Hq, Hkv, D, be->act_dtype, be->grad_dtype,
                               scratch, compute_stream(be));
}
