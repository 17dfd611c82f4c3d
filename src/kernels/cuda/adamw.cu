/* The AdamW update on a flat parameter range (CUDA twin of src/kernels/cpu/adamw.c, itself step for
 * step torch.optim.AdamW): decoupled weight decay, moment updates, bias-corrected step.
 *
 * The scalar factors are computed on the host in double, exactly as the CPU reference computes
 * them; the per-element arithmetic uses explicitly rounded operations (__fmul_rn, __fdiv_rn,
 * __fsqrt_rn, ...) so that no multiply-add is fused and no fast-math approximation creeps in: with
 * fp32 master weights the GPU update is bitwise the CPU's. The gradient scale (clipping and loss
 * normalisation) is read from device memory, so the step needs no host synchronisation.
 *
 * param, grad, m and v share the master dtype; a bf16 master is loaded, updated in fp32 and
 * stored rounded (p, m and v alike). `working`, when given, receives the new parameter in its own
 * dtype (the copy that the next all-gather reads). */
#include <math.h>

#include "cuda_common.cuh"

#define ADAMW_THREADS 256

typedef struct {
    float decay, step_size, bc2_sqrt, b1, b2, ob1, ob2, eps;
} adamw_consts;

/* With a bf16 master (mbf), p is rounded here rather than only when stored, because the working
 * copy must receive the rounded value, as the CPU reference gives it. */
static __device__ __forceinline__ void adamw_elem(float *p, float *m, float *v, float grad, float gs,
                                                  const adamw_consts *k, int mbf) {
    float g = __fmul_rn(grad, gs);
    float pi = __fmul_rn(*p, k->decay);
    float mi = __fadd_rn(__fmul_rn(k->b1, *m), __fmul_rn(k->ob1, g));
    float vi = __fadd_rn(__fmul_rn(k->b2, *v), __fmul_rn(__fmul_rn(k->ob2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k->bc2_sqrt), k->eps);
    pi = __fsub_rn(pi, __fmul_rn(k->step_size, __fdiv_rn(mi, denom)));
    *p = mbf ? round_bf16(pi) : pi;
    *m = mi;
    *v = vi;
}

/* wmode: 0 no working copy, 1 fp32, 2 bf16. */
static __device__ __forceinline__ void adamw(void *param, const void *grad, void *m, void *v, void *working, size_t n,
                                             const float *grad_scale, adamw_consts k, int mbf, int wmode, int vec) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    float gs = *grad_scale;
    size_t done = 0;
    if (vec) {
        size_t nch = n / 8;
        for (size_t j = tid; j < nch; j += stride) {
            float p[8], g[8], mm[8], vv[8];
            ld8(param, j, mbf, p);
            ld8(grad, j, mbf, g);
            ld8(m, j, mbf, mm);
            ld8(v, j, mbf, vv);
#pragma unroll
            for (int e = 0; e < 8; e++) adamw_elem(&p[e], &mm[e], &vv[e], g[e], gs, &k, mbf);
            st8(param, j, mbf, p);
            st8(m, j, mbf, mm);
            st8(v, j, mbf, vv);
            if (wmode) st8(working, j, wmode == 2, p);
        }
        done = nch * 8;
    }
    for (size_t i = done + tid; i < n; i += stride) {
        float p = ld1(param, i, mbf), mm = ld1(m, i, mbf), vv = ld1(v, i, mbf);
        adamw_elem(&p, &mm, &vv, ld1(grad, i, mbf), gs, &k, mbf);
        st1(param, i, mbf, p);
        st1(m, i, mbf, mm);
        st1(v, i, mbf, vv);
        if (wmode) st1(working, i, wmode == 2, p);
    }
}

/* mode = master bf16 (bit 0) + 2 * wmode (bits 1-2) + 8 * vector path (bit 3). */
static __global__ void adamw_kernel(void *param, const void *grad, void *m, void *v, void *working, size_t n,
                                    const float *grad_scale, adamw_consts k, int mode) {
/* clang-format off */
#define ADAMW_CASE(c) \
    case c: adamw(param, grad, m, v, working, n, grad_scale, k, (c) & 1, ((c) >> 1) & 3, ((c) >> 3) & 1); break;
    switch (mode) {
        ADAMW_CASE(0) ADAMW_CASE(1) ADAMW_CASE(2) ADAMW_CASE(3) ADAMW_CASE(4) ADAMW_CASE(5)
        ADAMW_CASE(8) ADAMW_CASE(9) ADAMW_CASE(10) ADAMW_CASE(11) ADAMW_CASE(12) ADAMW_CASE(13)
    }
#undef ADAMW_CASE
/* clang-format on */
}

extern "C" void fsdp_cuda_adamw(void *param, const void *grad, void *m, void *v, fsdp_dtype master, size_t n,
                                const fsdp_adamw_args *a, const float *grad_scale, void *working, fsdp_dtype working_t,
                                cudaStream_t s) {
    if (n == 0) return;
    /* Same expressions, in the same precision, as cpu_adamw. */
    double bc1 = 1.0 - pow((double)a->beta1, (double)a->step);
    double bc2 = 1.0 - pow((double)a->beta2, (double)a->step);
    adamw_consts k;
    k.decay = (float)(1.0 - (double)a->lr * a->weight_decay);
    k.step_size = (float)(a->lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.b1 = a->beta1, k.b2 = a->beta2;
    k.ob1 = (float)(1.0 - a->beta1), k.ob2 = (float)(1.0 - a->beta2);
    k.eps = a->eps;
    int wmode = working ? (working_t == FSDP_BF16 ? 2 : 1) : 0;
    int vec = fsdp_cuda_aligned16(param) && fsdp_cuda_aligned16(grad) && fsdp_cuda_aligned16(m) &&
              fsdp_cuda_aligned16(v) && fsdp_cuda_aligned16(working);
    int mode = (master == FSDP_BF16) | wmode << 1 | vec << 3;
    adamw_kernel<<<fsdp_cuda_grid(vec ? n / 8 + 1 : n, ADAMW_THREADS), ADAMW_THREADS, 0, s>>>(
        param, grad, m, v, working, n, grad_scale, k, mode);
    fsdp_cuda_check_launch("adamw");
}
