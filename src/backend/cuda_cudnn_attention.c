/* --attn cudnn (cuda_cudnn_attention.h): the causal attention graphs cuDNN's fused-attention
 * engines recognise, built on the backend API as cuDNN's own frontend builds them for cuDNN 9.x
 * without its 9.21 single-node forms: matrix products, pointwise ops and reductions that the
 * heuristics fuse into one Hopper kernel each way.
 *
 * Forward (14 ops): S = Q K^T scale; causal mask (row index >= column index, else -inf); the
 * softmax as max, sub, exp, sum, then Stats = max + log(sum) (the log-sum-exp the flash kernels
 * keep, fp32 [B, Hq, T]) and P = exp / sum in bf16; O = P V.
 * Backward (24 ops; 22 without grouped heads): delta = rowsum(dO . O) into softmax_sum;
 * P = exp(S scale - Stats) masked; dV = P^T dO; dS = P (dO V^T - delta) scale; dK = dS^T Q;
 * dQ = dS K, summed in fp32 (dq_accum) and converted. With grouped heads dK and dV are computed per
 * query head and reduced over the group.
 *
 * K^T and V^T are the packed buffer seen with dims 2 and 3 swapped (strides too), P^T and dS^T
 * reshapes with transposed strides: no copies. The two fp32 buffers the backward names
 * (softmax_sum and dq_accum) lie at the front of its workspace, the engine's after them; the
 * engine initialises them (no memset). Plans are built once per shape and kept.
 *
 * cuDNN at or below 9.15 needs an extra padding mask in the backward when T is not a multiple of
 * 128 (its frontend adds one); fsdp.c refuses that case with a message instead (9.16 on run it).
 * 9.10.0 and 9.10.1 have known-bad attention and are refused. */
#include "cuda_cudnn_attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/log.h"
#include "cuda_cudnn_graph.h"
#include "cuda_internal.h"
#include "sizes.h"

/* The caller's tensors, by uid. */
enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF, U_DO, U_DQ, U_DK, U_DV, U_ONE, U_SOFTMAX_SUM, U_DQ_ACCUM };

typedef struct {
    int B, T, Hq, Hkv, D, backward;
    fsdp_cudnn_build build;
    cudnnBackendDescriptor_t plan;
    size_t engine_workspace;
} attention_plan;

#define MAX_PLANS 8
struct fsdp_cudnn_context {
    const fsdp_cudnn_api *api;
    cudnnHandle_t handle;
    attention_plan *plans[MAX_PLANS];
    int n_plans;
};

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The shapes both graphs use: scores [B, Hq, T, T], per-row values [B, Hq, T, 1] (fsdp.c's lse
 * layout), out and its gradient [B, T, Hq, D] seen as [B, Hq, T, D]; W the packed row's width. */
typedef struct {
    int64_t scores[4], rows[4], row_strides[4], out[4], out_strides[4], W;
} graph_dims;

static graph_dims dims_of(int B, int T, int Hq, int Hkv, int D) {
    const graph_dims d = {{B, Hq, T, T},
                          {B, Hq, T, 1},
                          {(int64_t)Hq * T, T, 1, 1},
                          {B, Hq, T, D},
                          {(int64_t)T * Hq * D, D, (int64_t)Hq * D, 1},
                          (int64_t)(Hq + 2 * Hkv) * D};
    return d;
}

static cudnnBackendDescriptor_t in_memory(fsdp_cudnn_build *g, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                                          const int64_t strides[4]) {
    return fsdp_cudnn_tensor(g, uid, type, dims, strides, FSDP_CUDNN_IN_MEMORY);
}

/* H heads of the packed q|k|v (or of its gradient) in bf16, [B, H, T, D] with strides [T W, D, W, 1];
 * with `transpose` seen as [B, H, D, T] (dims and strides 2 and 3 swapped: K^T, V^T). */
static cudnnBackendDescriptor_t packed_heads(fsdp_cudnn_build *g, int64_t uid, const graph_dims *d, int H, int D,
                                             int transpose) {
    const int64_t B = d->out[0], T = d->out[2];
    int64_t dims[4] = {B, H, T, D}, strides[4] = {T * d->W, D, d->W, 1};
    if (transpose) dims[2] = D, dims[3] = T, strides[2] = 1, strides[3] = d->W;
    return in_memory(g, uid, CUDNN_DATA_BFLOAT16, dims, strides);
}

/* y = mode(x[, b]) (fp32 math) into a new virtual tensor of the given type and dims; appends the op. */
static cudnnBackendDescriptor_t pointwise_to(fsdp_cudnn_build *g, cudnnBackendDescriptor_t *ops, int *n,
                                             cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                             cudnnBackendDescriptor_t b, cudnnDataType_t type, const int64_t dims[4]) {
    cudnnBackendDescriptor_t y = fsdp_cudnn_virtual(g, type, dims);
    ops[(*n)++] = fsdp_cudnn_pointwise(g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, 0);
    return y;
}

/* The causal mask over scores s (fp32 [B, Hq, T, T]): keeps s where the query index (axis 2) is at
 * or after the key index (axis 3), -inf elsewhere. Appends 4 ops; returns the masked scores. */
static cudnnBackendDescriptor_t causal_mask(fsdp_cudnn_build *g, cudnnBackendDescriptor_t *ops, int *n,
                                            cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t neg_inf,
                                            const int64_t S4[4]) {
    cudnnBackendDescriptor_t row = fsdp_cudnn_virtual(g, CUDNN_DATA_INT32, S4);
    cudnnBackendDescriptor_t col = fsdp_cudnn_virtual(g, CUDNN_DATA_INT32, S4);
    cudnnBackendDescriptor_t keep = fsdp_cudnn_virtual(g, CUDNN_DATA_BOOLEAN, S4);
    cudnnBackendDescriptor_t masked = fsdp_cudnn_virtual(g, CUDNN_DATA_FLOAT, S4);
    ops[(*n)++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    ops[(*n)++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    ops[(*n)++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, 0);
    ops[(*n)++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, masked, 0);
    return masked;
}

static int build_forward(fsdp_cudnn_build *g, cudnnBackendDescriptor_t *ops, int B, int T, int Hq, int Hkv, int D) {
    const graph_dims d = dims_of(B, T, Hq, Hkv, D);
    const int64_t *S4 = d.scores, *R = d.rows;
    cudnnBackendDescriptor_t q = packed_heads(g, U_Q, &d, Hq, D, 0), kt = packed_heads(g, U_K, &d, Hkv, D, 1),
                             v = packed_heads(g, U_V, &d, Hkv, D, 0);
    cudnnBackendDescriptor_t o = in_memory(g, U_O, CUDNN_DATA_BFLOAT16, d.out, d.out_strides);
    cudnnBackendDescriptor_t stats = in_memory(g, U_STATS, CUDNN_DATA_FLOAT, R, d.row_strides);
    cudnnBackendDescriptor_t scale = fsdp_cudnn_scalar(g, U_SCALE), neg_inf = fsdp_cudnn_scalar(g, U_NEG_INF);

    int n = 0;
    cudnnBackendDescriptor_t s1 = fsdp_cudnn_virtual(g, CUDNN_DATA_FLOAT, S4);
    ops[n++] = fsdp_cudnn_matmul(g, q, kt, s1);
    cudnnBackendDescriptor_t s2 = pointwise_to(g, ops, &n, CUDNN_POINTWISE_MUL, s1, scale, CUDNN_DATA_FLOAT, S4);
    cudnnBackendDescriptor_t s3 = causal_mask(g, ops, &n, s2, neg_inf, S4);
    cudnnBackendDescriptor_t max = fsdp_cudnn_virtual(g, CUDNN_DATA_FLOAT, R);
    ops[n++] = fsdp_cudnn_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s3, max);
    cudnnBackendDescriptor_t centred = pointwise_to(g, ops, &n, CUDNN_POINTWISE_SUB, s3, max, CUDNN_DATA_FLOAT, S4);
    cudnnBackendDescriptor_t e = pointwise_to(g, ops, &n, CUDNN_POINTWISE_EXP, centred, NULL, CUDNN_DATA_FLOAT, S4);
    cudnnBackendDescriptor_t sum = fsdp_cudnn_virtual(g, CUDNN_DATA_FLOAT, R);
    ops[n++] = fsdp_cudnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    cudnnBackendDescriptor_t log_sum = pointwise_to(g, ops, &n, CUDNN_POINTWISE_LOG, sum, NULL, CUDNN_DATA_FLOAT, R);
    ops[n++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_sum, NULL, stats, 0);
    /* P in the products' input type: what the engine's second product takes */
    cudnnBackendDescriptor_t p = pointwise_to(g, ops, &n, CUDNN_POINTWISE_DIV, e, sum, CUDNN_DATA_BFLOAT16, S4);
    ops[n++] = fsdp_cudnn_matmul(g, p, v, o);
    return n;
}

/* A key or value gradient: x^T (the scores-shaped x seen transposed, in bf16) times a, per query
 * head, then with grouped heads summed over each group into out. Appends 2 or 3 ops. */
static void kv_gradient(fsdp_cudnn_build *g, cudnnBackendDescriptor_t *ops, int *n, cudnnBackendDescriptor_t x,
                        cudnnBackendDescriptor_t a, int grouped, const int64_t full[4], const int64_t xt_dims[4],
                        const int64_t xt_strides[4], cudnnBackendDescriptor_t out) {
    cudnnBackendDescriptor_t xt = fsdp_cudnn_virtual_strided(g, CUDNN_DATA_BFLOAT16, xt_dims, xt_strides);
    ops[(*n)++] = fsdp_cudnn_reshape(g, x, xt);
    if (!grouped) {
        ops[(*n)++] = fsdp_cudnn_matmul(g, xt, a, out);
        return;
    }
    cudnnBackendDescriptor_t per_head = fsdp_cudnn_virtual(g, CUDNN_DATA_BFLOAT16, full);
    ops[(*n)++] = fsdp_cudnn_matmul(g, xt, a, per_head);
    ops[(*n)++] = fsdp_cudnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, per_head, out);
}

static int build_backward(fsdp_cudnn_build *g, cudnnBackendDescriptor_t *ops, int B, int T, int Hq, int Hkv, int D) {
    const graph_dims d = dims_of(B, T, Hq, Hkv, D);
    const int64_t *S4 = d.scores, *R = d.rows;
    const int64_t ST4[4] = {B, Hq, T, T}, ST_strides[4] = {(int64_t)Hq * T * T, (int64_t)T * T, 1, T};
    const int64_t full[4] = {B, Hq, T, D};
    const int grouped = Hq != Hkv;
    cudnnBackendDescriptor_t q = packed_heads(g, U_Q, &d, Hq, D, 0), kt = packed_heads(g, U_K, &d, Hkv, D, 1),
                             vt = packed_heads(g, U_V, &d, Hkv, D, 1);
    cudnnBackendDescriptor_t o = in_memory(g, U_O, CUDNN_DATA_BFLOAT16, d.out, d.out_strides);
    cudnnBackendDescriptor_t dout = in_memory(g, U_DO, CUDNN_DATA_BFLOAT16, d.out, d.out_strides);
    cudnnBackendDescriptor_t stats = in_memory(g, U_STATS, CUDNN_DATA_FLOAT, R, d.row_strides);
    cudnnBackendDescriptor_t dq = packed_heads(g, U_DQ, &d, Hq, D, 0), dk = packed_heads(g, U_DK, &d, Hkv, D, 0),
                             dv = packed_heads(g, U_DV, &d, Hkv, D, 0);
    cudnnBackendDescriptor_t scale = fsdp_cudnn_scalar(g, U_SCALE), neg_inf = fsdp_cudnn_scalar(g, U_NEG_INF),
                             one = fsdp_cudnn_scalar(g, U_ONE);
    cudnnBackendDescriptor_t softmax_sum = in_memory(g, U_SOFTMAX_SUM, CUDNN_DATA_FLOAT, R, d.row_strides);
    const int64_t acc_strides[4] = {(int64_t)Hq * T * D, (int64_t)T * D, D, 1};
    cudnnBackendDescriptor_t dq_accum = in_memory(g, U_DQ_ACCUM, CUDNN_DATA_FLOAT, full, acc_strides);

    int n = 0;
    /* delta = rowsum(dO . O), through the scale-by-one the engine's pattern has for dropout; the
     * product's strides are the frontend's (virtual: they describe no memory) */
    const int64_t doo_strides[4] = {(int64_t)Hq * T * D, (int64_t)T * D, (int64_t)Hq * D, 1};
    cudnnBackendDescriptor_t doo = fsdp_cudnn_virtual_strided(g, CUDNN_DATA_FLOAT, d.out, doo_strides);
    ops[n++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, o, NULL, doo, 0);
    cudnnBackendDescriptor_t dsum = fsdp_cudnn_virtual(g, CUDNN_DATA_FLOAT, R);
    ops[n++] = fsdp_cudnn_reduction(g, CUDNN_REDUCE_TENSOR_ADD, doo, dsum);
    ops[n++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dsum, one, NULL, softmax_sum, 0);
    /* P = exp(S scale - Stats), masked */
    cudnnBackendDescriptor_t s1 = fsdp_cudnn_virtual(g, CUDNN_DATA_FLOAT, S4);
    ops[n++] = fsdp_cudnn_matmul(g, q, kt, s1);
    cudnnBackendDescriptor_t s2 = pointwise_to(g, ops, &n, CUDNN_POINTWISE_MUL, s1, scale, CUDNN_DATA_FLOAT, S4);
    cudnnBackendDescriptor_t s3 = pointwise_to(g, ops, &n, CUDNN_POINTWISE_SUB, s2, stats, CUDNN_DATA_FLOAT, S4);
    cudnnBackendDescriptor_t s4 = causal_mask(g, ops, &n, s3, neg_inf, S4);
    cudnnBackendDescriptor_t p = pointwise_to(g, ops, &n, CUDNN_POINTWISE_EXP, s4, NULL, CUDNN_DATA_FLOAT, S4);
    /* dV = P^T dO */
    kv_gradient(g, ops, &n, p, dout, grouped, full, ST4, ST_strides, dv);
    /* dS = P (dO V^T - delta) scale */
    cudnnBackendDescriptor_t dp = fsdp_cudnn_virtual(g, CUDNN_DATA_FLOAT, S4);
    ops[n++] = fsdp_cudnn_matmul(g, dout, vt, dp);
    cudnnBackendDescriptor_t t1 = pointwise_to(g, ops, &n, CUDNN_POINTWISE_SUB, dp, softmax_sum, CUDNN_DATA_FLOAT, S4);
    cudnnBackendDescriptor_t t2 = pointwise_to(g, ops, &n, CUDNN_POINTWISE_MUL, t1, p, CUDNN_DATA_FLOAT, S4);
    cudnnBackendDescriptor_t ds = pointwise_to(g, ops, &n, CUDNN_POINTWISE_MUL, t2, scale, CUDNN_DATA_FLOAT, S4);
    /* dK = dS^T Q */
    kv_gradient(g, ops, &n, ds, q, grouped, full, ST4, ST_strides, dk);
    /* dQ = dS K in fp32, then bf16 (K seen untransposed: fp32 as the frontend declares it) */
    const int64_t k_dims[4] = {B, Hkv, T, D}, k_strides[4] = {T * d.W, D, d.W, 1};
    cudnnBackendDescriptor_t k = fsdp_cudnn_virtual_strided(g, CUDNN_DATA_FLOAT, k_dims, k_strides);
    ops[n++] = fsdp_cudnn_reshape(g, kt, k);
    ops[n++] = fsdp_cudnn_matmul(g, ds, k, dq_accum);
    ops[n++] = fsdp_cudnn_pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, NULL, NULL, dq, 0);
    return n;
}

static struct fsdp_cudnn_context *context_of(fsdp_backend *be) {
    cuda_context *im = cuda_of(be);
    if (im->cudnn) return im->cudnn;
    char why[320];
    const fsdp_cudnn_api *api = fsdp_cudnn_load(why, sizeof why);
    if (!api) fsdp_fatal("--attn cudnn: %s", why);
    struct fsdp_cudnn_context *c = fsdp_xcalloc(1, sizeof *c, "the cuDNN context");
    c->api = api;
    const cudnnStatus_t st = api->create(&c->handle);
    if (st != CUDNN_STATUS_SUCCESS)
        fsdp_fatal("--attn cudnn: cudnnCreate failed on GPU %d: %s", im->device, api->get_error_string(st));
    im->cudnn = c;
    return c;
}

static attention_plan *plan_of(fsdp_backend *be, int backward, int B, int T, int Hq, int Hkv, int D) {
    struct fsdp_cudnn_context *c = context_of(be);
    for (int i = 0; i < c->n_plans; i++) {
        attention_plan *p = c->plans[i];
        if (p->backward == backward && p->B == B && p->T == T && p->Hq == Hq && p->Hkv == Hkv && p->D == D) return p;
    }
    if (c->n_plans == MAX_PLANS) { /* shapes come and go (evaluation's last batch): drop the oldest */
        fsdp_cudnn_build_free(&c->plans[0]->build);
        free(c->plans[0]);
        memmove(c->plans, c->plans + 1, (MAX_PLANS - 1) * sizeof c->plans[0]);
        c->n_plans--;
    }
    attention_plan *p = fsdp_xcalloc(1, sizeof *p, "a cuDNN attention plan");
    p->B = B, p->T = T, p->Hq = Hq, p->Hkv = Hkv, p->D = D, p->backward = backward;
    fsdp_cudnn_build_init(&p->build, c->api);
    cudnnBackendDescriptor_t ops[32];
    const int n =
        backward ? build_backward(&p->build, ops, B, T, Hq, Hkv, D) : build_forward(&p->build, ops, B, T, Hq, Hkv, D);
    int64_t ws = 0;
    const double began = fsdp_now();
    if (fsdp_cudnn_ok(&p->build)) p->plan = fsdp_cudnn_plan(&p->build, c->handle, ops, n, &ws);
    if (!fsdp_cudnn_ok(&p->build))
        fsdp_fatal("--attn cudnn: cuDNN %zu has no plan for the attention %s of batch %d x %d tokens, %d/%d heads of "
                   "%d (%s); --attn flash runs it",
                   p->build.version, backward ? "backward" : "forward", B, T, Hq, Hkv, D, p->build.failure);
    p->engine_workspace = align256((size_t)ws);
    /* Once per shape and direction: which cuDNN runs, and what the first step spends on its plan. */
    fsdp_log("--attn cudnn: cuDNN %zu (%s) planned the attention %s of %d x %d tokens in %.2f s\n", p->build.version,
             c->api->path, backward ? "backward" : "forward", B, T, fsdp_now() - began);
    c->plans[c->n_plans++] = p;
    return p;
}

static void run(fsdp_backend *be, attention_plan *p, int n, const int64_t *uids, void *const *ptrs, void *workspace) {
    struct fsdp_cudnn_context *c = context_of(be);
    const cudnnStatus_t st = c->api->set_stream(c->handle, compute_stream(be));
    if (st != CUDNN_STATUS_SUCCESS) fsdp_fatal("--attn cudnn: cudnnSetStream failed: %s", c->api->get_error_string(st));
    char why[320];
    if (fsdp_cudnn_execute(c->api, c->handle, p->plan, n, uids, ptrs, workspace, why, sizeof why) !=
        CUDNN_STATUS_SUCCESS)
        fsdp_fatal("--attn cudnn: the attention %s of batch %d x %d tokens failed: %s",
                   p->backward ? "backward" : "forward", p->B, p->T, why);
}

const char *fsdp_cuda_cudnn_attention_unsupported(fsdp_dtype act, int T, int D, int window, const fsdp_dropout *drop,
                                                  int backward) {
    static char why[400];
    if (act != FSDP_BF16) return "cuDNN's fused attention runs bf16 activations (--mixed-precision bf16)";
    /* a window of at least T masks nothing (query t sees keys 0..t): Mistral's 4096 up to 4096 tokens */
    if (window > 0 && window < T)
        return "cuDNN's graphs here are causal without a sliding window (the model's is shorter than the sequence)";
    if (fsdp_dropout_active(drop)) return "cuDNN's graphs here have no attention dropout (--dropout 0 turns it off)";
    if (D % 8 != 0 || D > 256) {
        snprintf(why, sizeof why, "cuDNN's fused attention needs a head dim that is a multiple of 8, at most 256 (%d)",
                 D);
        return why;
    }
    const fsdp_cudnn_api *api = fsdp_cudnn_load(why, sizeof why);
    if (!api) return why;
    const size_t v = api->get_version();
    if (v == 91000 || v == 91001) {
        snprintf(why, sizeof why, "cuDNN %zu has known-bad fused attention; use another cuDNN 9", v);
        return why;
    }
    /* 9.15 and older want a padding mask in the backward unless T is a multiple of 128 */
    if (backward && v <= 91500 && T % 128 != 0) {
        snprintf(why, sizeof why,
                 "cuDNN %zu's attention backward needs the sequence length to be a multiple of 128 (--seq %d); cuDNN "
                 "9.16 or newer has no such limit (FSDP_CUDNN_LIBRARY names its libcudnn.so.9)",
                 v, T);
        return why;
    }
    return NULL;
}

void fsdp_cuda_cudnn_attention_forward(fsdp_backend *be, void *out, float *lse, const void *qkv, int B, int T, int Hq,
                                       int Hkv, int D) {
    attention_plan *p = plan_of(be, 0, B, T, Hq, Hkv, D);
    const size_t es = 2; /* bf16 */
    float scale = 1.0f / sqrtf((float)D), neg_inf = -INFINITY;
    const char *base = qkv;
    const int64_t uids[7] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF};
    void *const ptrs[7] = {(void *)base,
                           (void *)(base + (size_t)Hq * D * es),
                           (void *)(base + (size_t)(Hq + Hkv) * D * es),
                           out,
                           lse,
                           &scale,
                           &neg_inf};
    run(be, p, 7, uids, ptrs, p->engine_workspace ? fsdp_cuda_scratch(be, p->engine_workspace) : NULL);
}

void fsdp_cuda_cudnn_attention_backward(fsdp_backend *be, void *dqkv, const void *dout, const void *qkv,
                                        const void *out, const float *lse, int B, int T, int Hq, int Hkv, int D) {
    attention_plan *p = plan_of(be, 1, B, T, Hq, Hkv, D);
    const size_t es = 2;
    const size_t acc = fsdp_cudnn_dq_accum_bytes(B, T, Hq, D), sums = fsdp_cudnn_delta_bytes(B, T, Hq);
    char *ws = fsdp_cuda_scratch(be, acc + sums + p->engine_workspace);
    float scale = 1.0f / sqrtf((float)D), neg_inf = -INFINITY, one = 1.0f;
    const char *base = qkv;
    char *dbase = dqkv;
    const size_t k_off = (size_t)Hq * D * es, v_off = (size_t)(Hq + Hkv) * D * es;
    const int64_t uids[14] = {U_Q,  U_K,  U_V,     U_O,       U_DO,  U_STATS,       U_DQ,
                              U_DK, U_DV, U_SCALE, U_NEG_INF, U_ONE, U_SOFTMAX_SUM, U_DQ_ACCUM};
    void *const ptrs[14] = {(void *)base,
                            (void *)(base + k_off),
                            (void *)(base + v_off),
                            (void *)out,
                            (void *)dout,
                            (void *)lse,
                            dbase,
                            dbase + k_off,
                            dbase + v_off,
                            &scale,
                            &neg_inf,
                            &one,
                            ws + acc,
                            ws};
    run(be, p, 14, uids, ptrs, ws + acc + sums);
}

size_t fsdp_cuda_cudnn_attention_workspace(fsdp_backend *be, int B, int T, int Hq, int Hkv, int D) {
    const attention_plan *f = plan_of(be, 0, B, T, Hq, Hkv, D), *b = plan_of(be, 1, B, T, Hq, Hkv, D);
    const size_t bwd = fsdp_cudnn_dq_accum_bytes(B, T, Hq, D) + fsdp_cudnn_delta_bytes(B, T, Hq) + b->engine_workspace;
    return bwd > f->engine_workspace ? bwd : f->engine_workspace;
}

void fsdp_cuda_cudnn_destroy(fsdp_backend *be) {
    cuda_context *im = cuda_of(be);
    struct fsdp_cudnn_context *c = im->cudnn;
    if (!c) return;
    for (int i = 0; i < c->n_plans; i++) {
        fsdp_cudnn_build_free(&c->plans[i]->build);
        free(c->plans[i]);
    }
    c->api->destroy(c->handle);
    free(c);
    im->cudnn = NULL;
}
