/* The ops of the CUDA backend: the dispatch of every arithmetic op to the kernels of src/kernels/cuda
 * (matrix products through cuda_matmul.c, attention in cuda_attention.c), and the backend's ops table.
 * Model ops run on the compute stream; the utilities on the stream they are given. */
#include "../kernels/fp8_cuda.h"
#include "../kernels/ops_cuda.h"
#include "cuda_internal.h"

/* ---- utilities on explicit streams ---- */

static void cuda_cast(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t n,
                      fsdp_stream *s) {
    (void)be;
    fsdp_cuda_cast(dst, dt, src, st, n, s->stream);
}

static void cuda_accumulate(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t n,
                            fsdp_stream *s) {
    (void)be;
    fsdp_cuda_accumulate(dst, dt, src, st, n, s->stream);
}

/* Quantization for the wire (quantize.cu): on the stream given, like cast, so that a dequantize
 * behind a gather on the communication stream needs no event. */
static void cuda_quantize(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t count,
                          int pieces, size_t valid, fsdp_stream *s) {
    (void)be;
    fsdp_cuda_quantize(dst, dt, src, st, count, pieces, valid, s->stream);
}

static void cuda_dequantize(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t count,
                            int pieces, fsdp_stream *s) {
    (void)be;
    fsdp_cuda_dequantize(dst, dt, src, st, count, pieces, s->stream);
}

/* Product weights cast once per gather (fp8.cu), on the stream given: the engine runs them on the
 * compute stream (amax, encode: the update of the shards) and the gather stream (unpack). */
static void cuda_fp8_amax(fsdp_backend *be, float *amax, const void *x, fsdp_dtype t, size_t n, fsdp_stream *s) {
    (void)be;
    fsdp_cuda_fp8_amax(amax, x, t, n, s->stream);
}

static void cuda_fp8_encode(fsdp_backend *be, uint8_t *codes, float *scales, const float *amax_parts, int parts,
                            int stride, const void *x, fsdp_dtype t, size_t n, fsdp_stream *s) {
    (void)be;
    fsdp_cuda_fp8_scales_of_parts(scales, amax_parts, parts, stride, FSDP_E4M3, s->stream);
    fsdp_cuda_fp8_encode(codes, scales, x, t, n, FSDP_E4M3, s->stream);
}

static void cuda_fp8_unpack(fsdp_backend *be, uint8_t *codes, uint8_t *codes_t, void *unit, fsdp_dtype unit_t,
                            const void *pieces, fsdp_dtype t, size_t count, const fsdp_fp8_matrix *m,
                            const float *scales, fsdp_stream *s) {
    fsdp_cuda_fp8_unpack(codes, codes_t, unit, unit_t, pieces, fsdp_device_piece_bytes(be->kind, t, count), count, m,
                         t, scales, s->stream);
}

static void cuda_sum_pieces(fsdp_backend *be, void *dst, fsdp_dtype dt, const void *src, fsdp_dtype st, size_t count,
                            int pieces, int accumulate, fsdp_stream *s) {
    (void)be;
    fsdp_cuda_sum_pieces(dst, dt, src, st, count, pieces, accumulate, s->stream);
}

static void cuda_add_rows(fsdp_backend *be, float *dst, int64_t window_start, int64_t window_len,
                          const fsdp_row_set *sets, int nsets, const void *values, int N, int C, fsdp_stream *s) {
    fsdp_cuda_add_rows(dst, window_start, window_len, sets, nsets, values, N, C, be->act_dtype, s->stream);
}

/* Reductions take the shared scratch, which belongs to the compute stream. */
static void require_compute(fsdp_backend *be, fsdp_stream *s, const char *op) {
    if (s != be->compute) fsdp_fatal("internal error: %s needs the compute stream (it uses the shared scratch)", op);
}

static void cuda_sum_squares(fsdp_backend *be, float *out, const void *x, fsdp_dtype t, size_t n, fsdp_stream *s) {
    require_compute(be, s, "sum_squares");
    fsdp_cuda_sum_squares(out, x, t, n, fsdp_cuda_scratch(be, fsdp_cuda_reduce_scratch(n)), s->stream);
}

static void cuda_sum(fsdp_backend *be, float *out, const float *x, size_t n, fsdp_stream *s) {
    require_compute(be, s, "sum");
    fsdp_cuda_sum(out, x, n, fsdp_cuda_scratch(be, fsdp_cuda_reduce_scratch(n)), s->stream);
}

static void cuda_clip_scale(fsdp_backend *be, float *scale, const float *sumsq, float max_norm, fsdp_stream *s) {
    (void)be;
    fsdp_cuda_clip_scale(scale, sumsq, max_norm, s->stream);
}

static void cuda_adamw(fsdp_backend *be, void *param, const void *grad, void *m, void *v, fsdp_dtype master_t, size_t n,
                       const fsdp_adamw_args *a, const float *grad_scale, void *working, fsdp_dtype working_t,
                       fsdp_stream *s) {
    (void)be;
    fsdp_cuda_adamw(param, grad, m, v, master_t, n, a, grad_scale, working, working_t, s->stream);
}

/* ---- model ops ---- */

static void cuda_embedding_forward(fsdp_backend *be, void *out, const int32_t *tokens, const void *wte,
                                   const void *wpe, int pos_offset, int N, int T, int C) {
    fsdp_cuda_embedding_forward(out, tokens, wte, wpe, pos_offset, N, T, C, be->act_dtype, compute_stream(be));
}

static void cuda_embedding_backward(fsdp_backend *be, void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                                    int padding_idx, int pos_offset, int N, int T, int C) {
    fsdp_cuda_embedding_backward(dwte, dwpe, dout, tokens, padding_idx, pos_offset, N, T, C, be->act_dtype,
                                 be->grad_dtype, compute_stream(be));
}

static void cuda_rmsnorm_forward(fsdp_backend *be, void *out, float *rstd, const void *inp, const void *w, int N, int C,
                                 float eps, float *out_amax) {
    fsdp_cuda_rmsnorm_forward(out, rstd, inp, w, N, C, eps, be->act_dtype, compute_stream(be), out_amax);
}

static void cuda_rmsnorm_backward(fsdp_backend *be, void *dinp, void *dw, const void *dout, const void *inp,
                                  const void *w, const float *rstd, int N, int C, float *dinp_amax) {
    float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_norm_backward_scratch(N, C));
    fsdp_cuda_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, be->act_dtype, be->grad_dtype, scratch,
                               compute_stream(be), dinp_amax);
}

static void cuda_layernorm_forward(fsdp_backend *be, void *out, float *mean, float *rstd, const void *inp,
                                   const void *w, const void *b, int N, int C, float eps, float *out_amax) {
    fsdp_cuda_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, be->act_dtype, compute_stream(be), out_amax);
}

static void cuda_layernorm_backward(fsdp_backend *be, void *dinp, void *dw, void *db, const void *dout,
                                    const void *inp, const void *w, const float *mean, const float *rstd, int N, int C,
                                    float *dinp_amax) {
    float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_norm_backward_scratch(N, C));
    fsdp_cuda_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, be->act_dtype, be->grad_dtype, scratch,
                                 compute_stream(be), dinp_amax);
}

/* out[N,OC] = inp[N,C] W^T: in column-major terms out^T[OC,N] = W (stored C x OC, transposed) x inp^T. */
static void cuda_matmul_forward(fsdp_backend *be, void *out, const void *inp, const void *weight, const void *bias,
                                const void *residual, int N, int C, int OC, int relu) {
    fsdp_gemm g = {1, 0, OC, N, C, weight, C, inp, C, residual, OC, out, OC, be->act_dtype, be->act_dtype,
                   bias, relu, residual ? 1.0f : 0.0f, FSDP_F32, NULL, NULL, 0, 0};
    fsdp_cuda_gemm(be, &g, compute_stream(be));
}

static void cuda_matmul_backward(fsdp_backend *be, void *dinp, void *dweight, void *dbias, const void *dout,
                                 const void *inp, const void *weight, int N, int C, int OC) {
    cudaStream_t s = compute_stream(be);
    if (dinp) {
        /* dinp^T[C,N] = W^T (stored C x OC) x dout^T (stored OC x N) */
        fsdp_gemm g = {0, 0, C, N, OC, weight, C, dout, OC, NULL, C, dinp, C, be->act_dtype, be->act_dtype,
                       NULL, 0, 0.0f, FSDP_F32, NULL, NULL, 0, 0};
        fsdp_cuda_gemm(be, &g, s);
    }
    /* dW^T[C,OC] += inp^T (stored C x N) x dout (stored OC x N, transposed) */
    fsdp_gemm g = {0, 1, C, OC, N, inp, C, dout, OC, dweight, C, dweight, C, be->act_dtype, be->grad_dtype,
                   NULL, 0, 1.0f, FSDP_F32, NULL, NULL, 0, 0};
    fsdp_cuda_gemm(be, &g, s);
    if (dbias) {
        float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_column_sum_scratch(N, OC));
        fsdp_cuda_column_sum(dbias, dout, N, OC, be->act_dtype, be->grad_dtype, scratch, s);
    }
}

static void cuda_relu_backward(fsdp_backend *be, void *d, const void *out, size_t n) {
    fsdp_cuda_relu_backward(d, out, n, be->act_dtype, compute_stream(be));
}

static void cuda_rope_forward(fsdp_backend *be, void *qkv, const float *cs, int B, int T, int Hq, int Hkv, int D) {
    fsdp_cuda_rope_forward(qkv, cs, B, T, Hq, Hkv, D, be->act_dtype, compute_stream(be));
}

static void cuda_rope_backward(fsdp_backend *be, void *dqkv, const float *cs, int B, int T, int Hq, int Hkv, int D,
                               float *dqkv_amax) {
    fsdp_cuda_rope_backward(dqkv, cs, B, T, Hq, Hkv, D, be->act_dtype, compute_stream(be), dqkv_amax);
}

static void cuda_swiglu_forward(fsdp_backend *be, void *out, const void *gateup, int N, int F, float *out_amax) {
    fsdp_cuda_swiglu_forward(out, gateup, N, F, be->act_dtype, compute_stream(be), out_amax);
}

static void cuda_swiglu_backward(fsdp_backend *be, void *dgateup, const void *dout, const void *gateup, int N, int F,
                                 float *dgateup_amax) {
    fsdp_cuda_swiglu_backward(dgateup, dout, gateup, N, F, be->act_dtype, compute_stream(be), dgateup_amax);
}

static void cuda_cross_entropy(fsdp_backend *be, float *losses, void *logits, const int32_t *targets, int n, int V,
                               float grad_scale) {
    fsdp_cuda_cross_entropy(losses, logits, targets, n, V, grad_scale, be->act_dtype, compute_stream(be));
}

/* ---- residual dropout (the kernels of dropout.cu and the fused norms of norms.cu) ---- */

static void cuda_residual_dropout_forward(fsdp_backend *be, void *out, const void *residual, const void *x, int N,
                                          int T, int C, const fsdp_dropout *drop) {
    fsdp_cuda_residual_dropout_forward(out, residual, x, N, T, C, drop, be->act_dtype, compute_stream(be));
}

static void cuda_dropout_backward(fsdp_backend *be, void *dx, const void *dout, int N, int T, int C,
                                  const fsdp_dropout *drop) {
    fsdp_cuda_dropout_backward(dx, dout, N, T, C, drop, be->act_dtype, compute_stream(be));
}

static void cuda_rmsnorm_dropout_forward(fsdp_backend *be, void *res_out, void *out, float *rstd, const void *residual,
                                         const void *x, const void *w, int N, int T, int C, float eps,
                                         const fsdp_dropout *drop, float *out_amax) {
    fsdp_cuda_rmsnorm_dropout_forward(res_out, out, rstd, residual, x, w, N, T, C, eps, drop, be->act_dtype,
                                      compute_stream(be), out_amax);
}

static void cuda_layernorm_dropout_forward(fsdp_backend *be, void *res_out, void *out, float *mean, float *rstd,
                                           const void *residual, const void *x, const void *w, const void *b, int N,
                                           int T, int C, float eps, const fsdp_dropout *drop, float *out_amax) {
    fsdp_cuda_layernorm_dropout_forward(res_out, out, mean, rstd, residual, x, w, b, N, T, C, eps, drop,
                                        be->act_dtype, compute_stream(be), out_amax);
}

static void cuda_rmsnorm_dropout_backward(fsdp_backend *be, void *dinp, void *dx, void *dw, const void *dout,
                                          const void *inp, const void *w, const float *rstd, int N, int T, int C,
                                          const fsdp_dropout *drop, float *dx_amax) {
    float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_norm_backward_scratch(N, C));
    fsdp_cuda_rmsnorm_dropout_backward(dinp, dx, dw, dout, inp, w, rstd, N, T, C, drop, be->act_dtype,
                                       be->grad_dtype, scratch, compute_stream(be), dx_amax);
}

static void cuda_layernorm_dropout_backward(fsdp_backend *be, void *dinp, void *dx, void *dw, void *db,
                                            const void *dout, const void *inp, const void *w, const float *mean,
                                            const float *rstd, int N, int T, int C, const fsdp_dropout *drop,
                                            float *dx_amax) {
    float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_norm_backward_scratch(N, C));
    fsdp_cuda_layernorm_dropout_backward(dinp, dx, dw, db, dout, inp, w, mean, rstd, N, T, C, drop, be->act_dtype,
                                         be->grad_dtype, scratch, compute_stream(be), dx_amax);
}

const fsdp_backend_ops fsdp_cuda_ops = {
    .cast = cuda_cast,
    .accumulate = cuda_accumulate,
    .quantize = cuda_quantize,
    .dequantize = cuda_dequantize,
    .sum_pieces = cuda_sum_pieces,
    .sum_squares = cuda_sum_squares,
    .sum = cuda_sum,
    .clip_scale = cuda_clip_scale,
    .add_rows = cuda_add_rows,
    .adamw = cuda_adamw,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .matmul_forward_fp8 = fsdp_cuda_matmul_forward_fp8_op,
    .matmul_backward_fp8 = fsdp_cuda_matmul_backward_fp8_op,
    .fp8_amax = cuda_fp8_amax,
    .fp8_encode = cuda_fp8_encode,
    .fp8_unpack = cuda_fp8_unpack,
    .relu_backward = cuda_relu_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_forward = fsdp_cuda_attention_forward_op,
    .attention_unsupported = fsdp_cuda_attention_unsupported_op,
    .attention_backward = fsdp_cuda_attention_backward_op,
    .qk_norm_forward = fsdp_cuda_qk_norm_forward_op,
    .qk_norm_backward = fsdp_cuda_qk_norm_backward_op,
    .kv_cache_append = fsdp_cuda_kv_cache_append_op,
    .attention_decode = fsdp_cuda_attention_decode_op,
    .residual_dropout_forward = cuda_residual_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .rmsnorm_dropout_forward = cuda_rmsnorm_dropout_forward,
    .layernorm_dropout_forward = cuda_layernorm_dropout_forward,
    .rmsnorm_dropout_backward = cuda_rmsnorm_dropout_backward,
    .layernorm_dropout_backward = cuda_layernorm_dropout_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .cross_entropy = cuda_cross_entropy,
};
