/* Times the residual dropout at training shapes (bf16 activations, fp32 gradients): the norms with
 * the dropout fused (one pass) against the plain norm the model runs without dropout (whose
 * residual add is fused into the preceding matrix product's epilogue) and against the unfused pair
 * (a stand-alone dropout pass, then the norm), forward and backward, for LayerNorm (OPT) and
 * RMSNorm (Llama). Each figure is the median of 20 timed runs (CUDA events) after 3 warm-up runs,
 * with the bandwidth achieved on the bytes the op must move (each input read once, each output
 * written once). Not a test: no pass/fail; exits 0 without a GPU.
 *
 * Usage: dropout_bench [--dropout P]   (default 0.1) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FSDP_HAVE_CUDA
int main(void) {
    printf("dropout_bench: built without CUDA, nothing to time\n");
    return 0;
}
#else

#include <cuda_runtime.h>

#include "base/dtype.h"
#include "bench_cuda.h"
#include "kernels/dropout.h"
#include "kernels/ops_cuda.h"



/* n elements of t on the device, random in (-1, 1) (plus 1 when `one`: norm weights). */
static void *dev_rand(size_t n, fsdp_dtype t, int one) {
    const size_t es = t == FSDP_BF16 ? 2 : 4;
    void *h = malloc(n * es), *d;
    if (!h) {
        fprintf(stderr, "dropout_bench: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        const float v = bench_uniform_sym() + (one ? 1.0f : 0.0f);
        if (t == FSDP_BF16)
            ((uint16_t *)h)[i] = fsdp_f32_to_bf16(v);
        else
            ((float *)h)[i] = v;
    }
    CK(cudaMalloc(&d, n * es));
    CK(cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct {
    int layer, N, T, C;
    const fsdp_dropout *drop;
    void *res, *x, *res_out, *out, *w, *b, *dout, *dinp, *dx, *dw, *db;
    float *mean, *rstd, *scratch;
} bench_case;

static void plain_fwd(const bench_case *k) {
    if (k->layer)
        fsdp_cuda_layernorm_forward(k->out, k->mean, k->rstd, k->res, k->w, k->b, k->N, k->C, 1e-5f, FSDP_BF16, 0, NULL);
    else
        fsdp_cuda_rmsnorm_forward(k->out, k->rstd, k->res, k->w, k->N, k->C, 1e-5f, FSDP_BF16, 0, NULL);
}
static void fused_fwd(const bench_case *k) {
    if (k->layer)
        fsdp_cuda_layernorm_dropout_forward(k->res_out, k->out, k->mean, k->rstd, k->res, k->x, k->w, k->b, k->N, k->T,
                                            k->C, 1e-5f, k->drop, FSDP_BF16, 0, NULL);
    else
        fsdp_cuda_rmsnorm_dropout_forward(k->res_out, k->out, k->rstd, k->res, k->x, k->w, k->N, k->T, k->C, 1e-5f,
                                          k->drop, FSDP_BF16, 0, NULL);
}
static void unfused_fwd(const bench_case *k) {
    fsdp_cuda_residual_dropout_forward(k->res_out, k->res, k->x, k->N, k->T, k->C, k->drop, FSDP_BF16, 0);
    if (k->layer)
        fsdp_cuda_layernorm_forward(k->out, k->mean, k->rstd, k->res_out, k->w, k->b, k->N, k->C, 1e-5f, FSDP_BF16, 0, NULL);
    else
        fsdp_cuda_rmsnorm_forward(k->out, k->rstd, k->res_out, k->w, k->N, k->C, 1e-5f, FSDP_BF16, 0, NULL);
}
static void plain_bwd(const bench_case *k) {
    if (k->layer)
        fsdp_cuda_layernorm_backward(k->dinp, k->dw, k->db, k->dout, k->res_out, k->w, k->mean, k->rstd, k->N, k->C,
                                     FSDP_BF16, FSDP_F32, k->scratch, 0, NULL);
    else
        fsdp_cuda_rmsnorm_backward(k->dinp, k->dw, k->dout, k->res_out, k->w, k->rstd, k->N, k->C, FSDP_BF16,
                                   FSDP_F32, k->scratch, 0, NULL);
}
static void fused_bwd(const bench_case *k) {
    if (k->layer)
        fsdp_cuda_layernorm_dropout_backward(k->dinp, k->dx, k->dw, k->db, k->dout, k->res_out, k->w, k->mean,
                                             k->rstd, k->N, k->T, k->C, k->drop, FSDP_BF16, FSDP_F32, k->scratch, 0, NULL);
    else
        fsdp_cuda_rmsnorm_dropout_backward(k->dinp, k->dx, k->dw, k->dout, k->res_out, k->w, k->rstd, k->N, k->T,
                                           k->C, k->drop, FSDP_BF16, FSDP_F32, k->scratch, 0, NULL);
}
static void unfused_bwd(const bench_case *k) {
    plain_bwd(k);
    fsdp_cuda_dropout_backward(k->dx, k->dinp, k->N, k->T, k->C, k->drop, FSDP_BF16, 0);
}

/* Median milliseconds of REPS runs of fn (bench_cuda.h). */
static float time_ms(void (*fn)(const bench_case *), const bench_case *k) {
    float ms;
    BENCH_MEDIAN_MS(fn(k), ms);
    return ms;
}

static void line(const char *what, float ms, double rows_passes, const bench_case *k, float ref_ms) {
    const double bytes = rows_passes * (double)k->N * k->C * 2.0; /* bf16 [N, C] passes */
    printf("  %-44s %8.3f ms %7.0f GB/s   x%.2f of the plain norm\n", what, ms, bytes / (ms * 1e-3) / 1e9,
           ms / ref_ms);
}

static void bench(int layer, int B, int T, int C, double p) {
    const int N = B * T;
    const size_t n = (size_t)N * C;
    const fsdp_dropout drop = fsdp_dropout_make(p, 1234, 0, 0, FSDP_DROPOUT_MLP_OUT);
    bench_case k;
    memset(&k, 0, sizeof k);
    k.layer = layer, k.N = N, k.T = T, k.C = C, k.drop = &drop;
    k.res = dev_rand(n, FSDP_BF16, 0), k.x = dev_rand(n, FSDP_BF16, 0), k.res_out = dev_rand(n, FSDP_BF16, 0);
    k.out = dev_rand(n, FSDP_BF16, 0), k.dout = dev_rand(n, FSDP_BF16, 0), k.dinp = dev_rand(n, FSDP_BF16, 0);
    k.dx = dev_rand(n, FSDP_BF16, 0);
    k.w = dev_rand(C, FSDP_BF16, 1), k.b = layer ? dev_rand(C, FSDP_BF16, 0) : NULL;
    k.dw = dev_rand(C, FSDP_F32, 0), k.db = layer ? dev_rand(C, FSDP_F32, 0) : NULL;
    CK(cudaMalloc((void **)&k.mean, (size_t)N * 4));
    CK(cudaMalloc((void **)&k.rstd, (size_t)N * 4));
    CK(cudaMalloc((void **)&k.scratch, fsdp_cuda_norm_backward_scratch(N, C) + 16));
    fused_fwd(&k); /* statistics for the backward */

    printf("%s N=%d (B=%d x T=%d) C=%d, dropout %.2f\n", layer ? "LayerNorm" : "RMSNorm", N, B, T, C, p);
    const float pf = time_ms(plain_fwd, &k), ff = time_ms(fused_fwd, &k), uf = time_ms(unfused_fwd, &k);
    line("forward: norm (no dropout)", pf, 2, &k, pf);
    line("forward: residual dropout + norm, fused", ff, 4, &k, pf);
    line("forward: residual dropout, then norm", uf, 4, &k, pf);
    const float pb = time_ms(plain_bwd, &k), fb = time_ms(fused_bwd, &k), ub = time_ms(unfused_bwd, &k);
    line("backward: norm (no dropout)", pb, 4, &k, pb);
    line("backward: norm + dropout, fused", fb, 5, &k, pb);
    line("backward: norm, then dropout", ub, 5, &k, pb);
    fflush(stdout);
    void *ptrs[] = {k.res, k.x, k.res_out, k.out, k.dout, k.dinp, k.dx, k.w, k.b, k.dw, k.db, k.mean, k.rstd,
                    k.scratch};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i]) CK(cudaFree(ptrs[i]));
}

int main(int argc, char **argv) {
    double p = 0.1;
    if (argc == 3 && strcmp(argv[1], "--dropout") == 0) p = atof(argv[2]);
    if ((argc != 1 && argc != 3) || !fsdp_dropout_rate_ok(p)) {
        fprintf(stderr, "usage: dropout_bench [--dropout P]   (0 <= P < 1)\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("dropout_bench: no GPU, nothing to time\n");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("dropout_bench on %s (%d SMs); bf16 activations, fp32 gradients\n", prop.name, prop.multiProcessorCount);
    bench(1, 24, 1024, 2048, p); /* OPT-1.3B at MBS 24 (the headline run) */
    bench(0, 16, 1024, 2048, p); /* Llama-3.2-1B at MBS 16 */
    bench(0, 4, 2048, 4096, p);  /* Llama-2-7B */
    return 0;
}

#endif
