/* The FP8 products of the CUDA backend (matmul_forward_fp8 / matmul_backward_fp8; rules in
 * src/kernels/fp8.h): the ops cast their operands into the op scratch (the casts of
 * src/kernels/cuda/fp8.cu, transposed where a product needs it) and run cuBLASLt's FP8 kernels with
 * the inverse scales as their A/B scale pointers.
 *
 * Casts: the forward casts x and W; the backward casts dy once into both layouts (dy for dx, dy^T for
 * dW: one amax pass and one cast pass over dy, the largest operand), W^T and x^T. A weight that came
 * cast (fsdp_fp8_weight: FP8 weights gathered as codes) is read as it is, W and W^T, and not cast; its
 * slots in the scratch stay unused, so the scratch is the same either way. Tensorwise, a
 * product's saved amax (written by its forward) gives W^T and x^T their scales without an amax pass:
 * 7% of Llama-2-7B's FP8 cast traffic per layer.
 *
 * Scales: tensorwise products pass one scale per operand (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
 * rowwise products ask for CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F (one scale per row of each
 * operand, CUDA 12.9 on). Where cuBLASLt has no algorithm for that, the product is computed with unit
 * scales into fp32 and fsdp_cuda_fp8_scale_epilogue applies the row scales, bias, residual and relu;
 * the rest of the run does the same (cuda_context.fp8_epilogue), and FSDP_VERBOSE_GEMM says so.
 *
 * Accumulation follows torchao's defaults: fast accumulation in the forward, periodic promotion to
 * fp32 (no fast accumulation) in the two gradient products. */
#include <stdio.h>

#include "../base/env.h"
#include "../kernels/fp8_cuda.h"
#include "../kernels/ops_cuda.h"
#include "cuda_internal.h"

/* Codes and their three fp32 arrays (amax, scale, inverse scale). */
typedef struct {
    uint8_t *codes;
    float *amax, *scale, *inv;
} fp8_operand;

/* Carves the scratch into operands of the given code bytes and scale counts, and an fp32 product of
 * acc_bytes (0: none); the order and sizes are fsdp_fp8_forward_scratch's and _backward_scratch's. */
static char *carve(fsdp_backend *be, size_t total, int n, const size_t *codes, const long *scales, fp8_operand *ops) {
    char *p = fsdp_cuda_scratch(be, total);
    for (int i = 0; i < n; i++) ops[i].codes = (uint8_t *)p, p += fsdp_fp8_align256(codes[i]);
    for (int i = 0; i < n; i++) {
        const size_t b = fsdp_fp8_align256((size_t)scales[i] * 4);
        ops[i].amax = (float *)p, ops[i].scale = (float *)(p + b), ops[i].inv = (float *)(p + 2 * b);
        p += 3 * b;
    }
    return p;
}

/* out[R, Cn] (out_t) = a . b^T scaled (+ bias) (+ addend: the product's C, beta 1) then relu, where
 * a [R, K] and b [Cn, K] are cast operands. Column-major for cuBLASLt: out^T[Cn, R] = b (K x Cn,
 * transposed) x a (K x R), so cuBLASLt's A is our b and its m is Cn. Returns -1, having run nothing,
 * when rowwise scales find no cuBLASLt algorithm and no epilogue buffer was given (acc NULL). */
static int product(fsdp_backend *be, void *out, fsdp_dtype out_t, const void *addend, const fp8_operand *a,
                   fsdp_dtype a_t, const fp8_operand *b, fsdp_dtype b_t, int R, int Cn, int K, const void *bias,
                   int relu, int fast_accum, int rowwise, float *acc) {
    cudaStream_t s = compute_stream(be);
    if (!acc) {
        fsdp_gemm g = {1, 0, Cn, R, K, b->codes, K, a->codes, K, addend, Cn, out, Cn, b_t, out_t, bias, relu,
                       addend ? 1.0f : 0.0f, a_t, b->inv, a->inv, rowwise, fast_accum};
        if (!rowwise) {
            fsdp_cuda_gemm(be, &g, s);
            return 0;
        }
        return fsdp_cuda_gemm_try(be, &g, s);
    }
    /* Unit scales for cuBLASLt (a 1 in a's amax slot, which the casts before it on the stream have
     * finished reading), the row scales, bias, addend and relu after it. */
    static const float one = 1.0f;
    FSDP_CHECK_CUDA(cudaMemcpyAsync(a->amax, &one, sizeof one, cudaMemcpyHostToDevice, s));
    fsdp_gemm u = {1, 0, Cn, R, K, b->codes, K, a->codes, K, NULL, Cn, acc, Cn, b_t, FSDP_F32, NULL, 0, 0.0f,
                   a_t, a->amax, a->amax, 0, fast_accum};
    fsdp_cuda_gemm(be, &u, s);
    fsdp_cuda_fp8_scale_epilogue(out, out_t, acc, a->inv, rowwise, b->inv, rowwise, R, Cn, bias, addend, relu, s);
    return 0;
}

static void check(fsdp_backend *be, const char *op, int N, int C, int OC, const fsdp_fp8_recipe *r) {
    if (!be->fp8_products) fsdp_fatal("%s: %s", op, be->fp8_unavailable);
    if (!fsdp_fp8_shape_ok(N, C, OC))
        fsdp_fatal("internal error: %s of N=%d, C=%d, OC=%d, which are not all multiples of %d", op, N, C, OC,
                   FSDP_FP8_DIM_MULTIPLE);
    if (r->granularity != FSDP_FP8_TENSORWISE && r->granularity != FSDP_FP8_ROWWISE)
        fsdp_fatal("internal error: %s with FP8 granularity %d", op, (int)r->granularity);
    if (r->grad_t != FSDP_E4M3 && r->grad_t != FSDP_E5M2)
        fsdp_fatal("internal error: %s with gradients in %s", op, fsdp_dtype_name(r->grad_t));
}

/* cuBLASLt refused outer-vector scales: this and every later rowwise product use the epilogue. */
static void use_epilogue(fsdp_backend *be) {
    cuda_of(be)->fp8_epilogue = 1;
    if (fsdp_env_verbose_gemm())
        fprintf(stderr, "FP8 rowwise products: scales applied by an epilogue kernel from now on\n");
}

void fsdp_cuda_matmul_forward_fp8_op(fsdp_backend *be, void *out, const void *inp, const void *weight, const void *bias,
                                     const void *residual, int N, int C, int OC, int relu, const fsdp_fp8_recipe *r,
                                     fsdp_fp8_amax amax, const fsdp_fp8_weight *w8) {
    check(be, "matmul_forward_fp8", N, C, OC, r);
    if (w8 && r->granularity != FSDP_FP8_TENSORWISE)
        fsdp_fatal("internal error: matmul_forward_fp8 of a cast weight, rowwise");
    cudaStream_t s = compute_stream(be);
    const int rw = r->granularity == FSDP_FP8_ROWWISE, p2 = r->pow2_scales;
    float *keep = rw ? NULL : amax.saved;
    const float *known = rw ? NULL : amax.inp; /* reported by inp's producer */
    if (keep && known && known != keep)
        FSDP_CHECK_CUDA(cudaMemcpyAsync(keep, known, sizeof *keep, cudaMemcpyDeviceToDevice, s));
    for (;;) {
        const int epi = rw && cuda_of(be)->fp8_epilogue;
        fp8_operand op[2]; /* x, W */
        const size_t codes[2] = {(size_t)N * C, (size_t)OC * C};
        const long scales[2] = {N, OC};
        float *acc = (float *)carve(be, fsdp_fp8_forward_scratch(N, C, OC, epi), 2, codes, scales, op);
        fsdp_cuda_fp8_cast(op[0].codes, op[0].scale, op[0].inv, keep ? keep : op[0].amax, inp, be->act_dtype, N, C, 0,
                           rw, FSDP_E4M3, p2, known, s);
        if (w8) { /* cast when it was gathered: its codes as they are, its amax kept for the backward */
            op[1].codes = (uint8_t *)w8->codes, op[1].inv = (float *)w8->scales;
            if (keep)
                FSDP_CHECK_CUDA(cudaMemcpyAsync(keep + 1, w8->scales + 2, sizeof *keep, cudaMemcpyDeviceToDevice, s));
        } else {
            fsdp_cuda_fp8_cast(op[1].codes, op[1].scale, op[1].inv, keep ? keep + 1 : op[1].amax, weight, be->act_dtype,
                               OC, C, 0, rw, FSDP_E4M3, p2, NULL, s);
        }
        if (product(be, out, be->act_dtype, residual, &op[0], FSDP_E4M3, &op[1], FSDP_E4M3, N, OC, C, bias, relu, 1, rw,
                    epi ? acc : NULL) == 0)
            return;
        use_epilogue(be); /* and again with room for the fp32 product: the scratch may move */
    }
}

void fsdp_cuda_matmul_backward_fp8_op(fsdp_backend *be, void *dinp, void *dweight, void *dbias, const void *dout,
                                      const void *inp, const void *weight, int N, int C, int OC,
                                      const fsdp_fp8_recipe *r, fsdp_fp8_amax amax, const fsdp_fp8_weight *w8) {
    check(be, "matmul_backward_fp8", N, C, OC, r);
    if (w8 && r->granularity != FSDP_FP8_TENSORWISE)
        fsdp_fatal("internal error: matmul_backward_fp8 of a cast weight, rowwise");
    cudaStream_t s = compute_stream(be);
    const int rw = r->granularity == FSDP_FP8_ROWWISE, p2 = r->pow2_scales;
    const float *kept = rw ? NULL : amax.saved; /* the forward's amax of x and W: x^T's and W^T's */
    const float *dy_amax = rw ? NULL : amax.dout;  /* reported by dy's producer */
    const fsdp_dtype gt = r->grad_t;
    for (;;) {
        const int epi = rw && cuda_of(be)->fp8_epilogue;
        fp8_operand op[4]; /* dy [N, OC], dy^T [OC, N], W^T [C, OC], x^T [C, N] */
        const size_t codes[4] = {(size_t)N * OC, (size_t)OC * N, (size_t)C * OC, (size_t)C * N};
        const long scales[4] = {N, OC, C, C};
        float *acc = (float *)carve(be, fsdp_fp8_backward_scratch(N, C, OC, epi), 4, codes, scales, op);
        fsdp_cuda_fp8_cast_both(op[0].codes, op[0].scale, op[0].inv, op[0].amax, op[1].codes, op[1].scale, op[1].inv,
                                op[1].amax, dout, be->act_dtype, N, OC, rw, gt, p2, dy_amax, s);
        if (dinp && w8)
            op[2].codes = (uint8_t *)w8->codes_t, op[2].inv = (float *)w8->scales;
        else if (dinp)
            fsdp_cuda_fp8_cast(op[2].codes, op[2].scale, op[2].inv, op[2].amax, weight, be->act_dtype, OC, C, 1, rw,
                               FSDP_E4M3, p2, kept ? kept + 1 : NULL, s);
        fsdp_cuda_fp8_cast(op[3].codes, op[3].scale, op[3].inv, op[3].amax, inp, be->act_dtype, N, C, 1, rw, FSDP_E4M3,
                           p2, kept, s);
        /* dx[N, C] = dy[N, OC] . (W^T)[C, OC]^T, overwritten: running it again after a refusal of the
         * next product is harmless */
        if (dinp && product(be, dinp, be->act_dtype, NULL, &op[0], gt, &op[2], FSDP_E4M3, N, C, OC, NULL, 0, 0, rw,
                            epi ? acc : NULL) != 0) {
            use_epilogue(be);
            continue;
        }
        /* dW[OC, C] += (dy^T)[OC, N] . (x^T)[C, N]^T, accumulated by the product itself (beta 1) */
        if (product(be, dweight, be->grad_dtype, dweight, &op[1], gt, &op[3], FSDP_E4M3, OC, C, N, NULL, 0, 0, rw,
                    epi ? acc : NULL) != 0) {
            use_epilogue(be);
            continue;
        }
        break;
    }
    if (dbias) {
        float *scratch = fsdp_cuda_scratch(be, fsdp_cuda_column_sum_scratch(N, OC));
        fsdp_cuda_column_sum(dbias, dout, N, OC, be->act_dtype, be->grad_dtype, scratch, s);
    }
}
