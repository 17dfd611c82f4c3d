/* Causal grouped-query attention on a packed qkv tensor [B, T, (Hq + 2*Hkv) * D]: per token, Hq
 * query heads, then Hkv key heads, then Hkv value heads. Query head h reads kv head h / (Hq/Hkv).
 * With a sliding window W > 0 (Mistral) query t sees keys t - W < j <= t, as transformers' mask
 * does; every loop below runs over that range only, and probs are 0 outside it.
 *
 * Outputs: out [B, T, Hq*D]; lse [B, Hq, T], the natural log-sum-exp of each row of scaled, masked
 * scores; optionally probs [B, Hq, T, T] (eager attention; entries above the diagonal are 0).
 * A probability is always evaluated as expf(score - lse) with the score from cpu_dot, so the
 * backward recomputes exactly the stored values when probs is NULL (flash semantics).
 *
 * The backward runs in two passes so that every output element has one owner thread and a fixed
 * summation order: pass 1 is parallel over query rows (dq), pass 2 over key rows (dk, dv, summed over
 * the query heads of the group and the later queries, in ascending order).
 *
 * Dropout on the probabilities (attention_dropout): out = sum_j keep_j P_j v_j / (1 - p), with the
 * mask of src/kernels/dropout.h drawn per element; lse and the stored probs are the undropped
 * softmax's, and the backward regenerates the mask. With Pd = keep P / (1 - p) and
 * dPd_j = dout . v_j, the softmax sees dP_j = keep_j dPd_j / (1 - p), and
 * delta = dout . out = sum_j Pd_j dPd_j = sum_j P_j dP_j still holds. */
#include <math.h>
#include <string.h>

#include "../ops_cpu.h"
#include "cpu_common.h"

typedef struct {
    int B, T, Hq, Hkv, D, group; /* group = Hq / Hkv query heads per kv head */
    int window;                  /* 0: every key j <= t */
    size_t W;                    /* floats per token of qkv */
    float scale;
} attn_shape;

static attn_shape attn_make(int B, int T, int Hq, int Hkv, int D, int window) {
    attn_shape s = {B, T, Hq, Hkv, D, Hq / Hkv, window > 0 ? window : 0, (size_t)(Hq + 2 * Hkv) * D,
                    1.0f / sqrtf((float)D)};
    return s;
}

/* The first key query t sees; the last key that sees key j is attn_last_query. */
static inline int attn_first_key(const attn_shape *s, int t) {
    return s->window && t - s->window + 1 > 0 ? t - s->window + 1 : 0;
}
static inline int attn_last_query(const attn_shape *s, int j) {
    return s->window && j + s->window - 1 < s->T - 1 ? j + s->window - 1 : s->T - 1;
}

/* Offsets into qkv (or dqkv) of query head h, key head g and value head g of token (b, t). */
static inline size_t q_at(const attn_shape *s, int b, int t, int h) {
    return ((size_t)b * s->T + t) * s->W + (size_t)h * s->D;
}
static inline size_t k_at(const attn_shape *s, int b, int t, int g) { return q_at(s, b, t, s->Hq + g); }
static inline size_t v_at(const attn_shape *s, int b, int t, int g) { return q_at(s, b, t, s->Hq + s->Hkv + g); }
/* Offset of (b, h, t) in out/dout rows (times D) and in lse (times 1). */
static inline size_t row_at(const attn_shape *s, int b, int h, int t) { return ((size_t)b * s->Hq + h) * s->T + t; }
static inline size_t o_at(const attn_shape *s, int b, int t, int h) {
    return ((size_t)b * s->T + t) * s->Hq * s->D + (size_t)h * s->D;
}

static inline float attn_score(const attn_shape *s, const float *qkv, int b, int h, int t, int j) {
    return cpu_dot(qkv + q_at(s, b, t, h), qkv + k_at(s, b, j, h / s->group), s->D) * s->scale;
}

/* P[t, j] of head h: stored, or recomputed from the score and the row's lse. */
static inline float attn_prob(const attn_shape *s, const float *qkv, const float *lse, const float *probs, int b,
                              int h, int t, int j) {
    if (probs) return probs[row_at(s, b, h, t) * s->T + j];
    return expf(attn_score(s, qkv, b, h, t, j) - lse[row_at(s, b, h, t)]);
}

/* Dropout factor of P[b, h, t, j]: 1 / (1 - p) when kept, 0 when dropped, 1 without dropout. */
static inline float attn_keep(const fsdp_dropout *drop, int b, int h, int t, int j, int T) {
    if (!drop) return 1.0f;
    return fsdp_dropout_keep_probs(drop, b, h, t, j, T) ? drop->scale : 0.0f;
}

void cpu_attention_forward(float *out, float *lse, float *probs, const float *qkv, int B, int T, int Hq, int Hkv,
                           int D, const fsdp_dropout *drop) {
    cpu_attention_forward_window(out, lse, probs, qkv, B, T, Hq, Hkv, D, 0, drop);
}

void cpu_attention_forward_window(float *out, float *lse, float *probs, const float *qkv, int B, int T, int Hq,
                                  int Hkv, int D, int window, const fsdp_dropout *drop) {
    attn_shape s = attn_make(B, T, Hq, Hkv, D, window);
    if (!fsdp_dropout_active(drop)) drop = NULL;
    if (drop) fsdp_dropout_check_probs(drop, B, Hq, T);
#pragma omp parallel
    {
        float *sc = cpu_scratch((size_t)T * sizeof(float)); /* scores of one query row */
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < Hq; h++)
                for (int t = 0; t < T; t++) {
                    const int j0 = attn_first_key(&s, t);
                    float mx = -INFINITY;
                    for (int j = j0; j <= t; j++) {
                        sc[j] = attn_score(&s, qkv, b, h, t, j);
                        if (sc[j] > mx) mx = sc[j];
                    }
                    double sum = 0.0;
                    for (int j = j0; j <= t; j++) sum += expf(sc[j] - mx);
                    float l = (float)(mx + log(sum));
                    lse[row_at(&s, b, h, t)] = l;
                    float *o = out + o_at(&s, b, t, h);
                    float *prow = probs ? probs + row_at(&s, b, h, t) * T : NULL;
                    memset(o, 0, (size_t)D * sizeof(float));
                    if (prow)
                        for (int j = 0; j < j0; j++) prow[j] = 0.0f;
                    for (int j = j0; j <= t; j++) {
                        float p = expf(sc[j] - l);
                        if (prow) prow[j] = p;
                        cpu_axpy(o, p * attn_keep(drop, b, h, t, j, T), qkv + v_at(&s, b, j, h / s.group), D);
                    }
                    if (prow)
                        for (int j = t + 1; j < T; j++) prow[j] = 0.0f;
                }
        free(sc);
    }
}

/* With dP = dout . v and delta = dout . out (= sum_j P dP), the score gradient is
 * dS = P (dP - delta); dq = scale sum_j dS k_j, dk_j = scale sum dS q, dv_j = sum P dout (with
 * dropout, dP and the P of dv carry the factor keep / (1 - p)). */
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            const float *probs, int B, int T, int Hq, int Hkv, int D, const fsdp_dropout *drop) {
    cpu_attention_backward_window(dqkv, dout, qkv, out, lse, probs, B, T, Hq, Hkv, D, 0, drop);
}

void cpu_attention_backward_window(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, const float *probs, int B, int T, int Hq, int Hkv, int D,
                                   int window, const fsdp_dropout *drop) {
    attn_shape s = attn_make(B, T, Hq, Hkv, D, window);
    if (!fsdp_dropout_active(drop)) drop = NULL;
    if (drop) fsdp_dropout_check_probs(drop, B, Hq, T);
    float *delta = cpu_scratch((size_t)B * Hq * T * sizeof(float));

    /* Pass 1: dq and delta, one query row per iteration. */
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++) {
                const float *d = dout + o_at(&s, b, t, h);
                float dl = cpu_dot(d, out + o_at(&s, b, t, h), D);
                delta[row_at(&s, b, h, t)] = dl;
                float *dq = dqkv + q_at(&s, b, t, h);
                memset(dq, 0, (size_t)D * sizeof(float));
                for (int j = attn_first_key(&s, t); j <= t; j++) {
                    float p = attn_prob(&s, qkv, lse, probs, b, h, t, j);
                    float dp = cpu_dot(d, qkv + v_at(&s, b, j, h / s.group), D) * attn_keep(drop, b, h, t, j, T);
                    cpu_axpy(dq, p * (dp - dl), qkv + k_at(&s, b, j, h / s.group), D);
                }
                for (int i = 0; i < D; i++) dq[i] *= s.scale;
            }

    /* Pass 2: dk and dv, one key row per iteration, over the group's heads and the queries that see
     * key j (j <= t, and within the window). */
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++)
            for (int j = 0; j < T; j++) {
                float *dk = dqkv + k_at(&s, b, j, g), *dv = dqkv + v_at(&s, b, j, g);
                const float *v = qkv + v_at(&s, b, j, g);
                memset(dk, 0, (size_t)D * sizeof(float));
                memset(dv, 0, (size_t)D * sizeof(float));
                for (int h = g * s.group; h < (g + 1) * s.group; h++)
                    for (int t = j, t1 = attn_last_query(&s, j); t <= t1; t++) {
                        const float *d = dout + o_at(&s, b, t, h);
                        float p = attn_prob(&s, qkv, lse, probs, b, h, t, j), k = attn_keep(drop, b, h, t, j, T);
                        float dp = cpu_dot(d, v, D) * k;
                        cpu_axpy(dk, p * (dp - delta[row_at(&s, b, h, t)]), qkv + q_at(&s, b, t, h), D);
                        cpu_axpy(dv, p * k, d, D);
                    }
                for (int i = 0; i < D; i++) dk[i] *= s.scale;
            }
    free(delta);
}
