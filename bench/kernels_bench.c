/* Times the norm and flash attention kernels, forward and backward, at Llama-3.2-1B training shapes
 * (bf16 activations, fp32 weight gradients): B * T = 4 * 2048 rows of hidden 2048 for RMSNorm and
 * LayerNorm, and causal grouped-query attention over B = 4, T = 2048, 32 query / 8 kv heads of 64.
 * Each line is the median of 20 timed runs (CUDA events) after 3 warm-up runs, on random inputs,
 * with the bandwidth achieved on the bytes the op must move (norms) or the usual causal TFLOP/s
 * (attention: forward 2 * B * Hq * T^2 * D, backward 2.5 x that). Not a test: no pass/fail; exits
 * 0 without a GPU.
 *
 * It uses only entry points of src/kernels/ops_cuda.h whose signatures have not changed since the
 * norm and flash kernels were restructured, so the same file builds against older sources for a
 * before/after comparison (bench/README.md says how). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "bench_cuda.h"
#include "kernels/cuda_scratch.h"
#include "kernels/ops_cuda.h"
static uint64_t g_rng = 0x243f6a8885a308d3ull;
static float rnd_sym(void) { /* splitmix64, fixed seed: uniform (-1, 1) */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 4503599627370496.0 - 1.0);
}

/* Device buffer of n values a * u + shift, u uniform in (-1, 1), in dtype t. */
static void *drand(size_t n, fsdp_dtype t, float a, float shift) {
    void *d;
    size_t esz = t == FSDP_BF16 ? 2 : 4;
    CK(cudaMalloc(&d, n * esz));
    unsigned char *h = malloc(n * esz);
    if (!h) {
        fprintf(stderr, "kernels_bench: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        float v = rnd_sym() * a + shift;
        if (t == FSDP_BF16) {
            uint32_t u;
            __builtin_memcpy(&u, &v, 4);
            u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
            uint16_t b = (uint16_t)(u >> 16);
            __builtin_memcpy(h + 2 * i, &b, 2);
        } else {
            __builtin_memcpy(h + 4 * i, &v, 4);
        }
    }
    CK(cudaMemcpy(d, h, n * esz, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void *dalloc(size_t bytes) {
    void *d;
    CK(cudaMalloc(&d, bytes));
    return d;
}

static void line_gbs(const char *op, const char *shape, float ms, double bytes) {
    printf("%-22s %-30s %9.4f ms %8.1f GB/s\n", op, shape, ms, bytes / (ms * 1e-3) / 1e9);
    fflush(stdout);
}

static void line_tflops(const char *op, const char *shape, float ms, double flops) {
    printf("%-22s %-30s %9.4f ms %8.1f TFLOP/s\n", op, shape, ms, flops / (ms * 1e-3) / 1e12);
    fflush(stdout);
}

static void bench_norms(int N, int C) {
    const fsdp_dtype A = FSDP_BF16, G = FSDP_F32;
    const size_t nc = (size_t)N * C;
    char shape[64];
    float ms;
    void *x = drand(nc, A, 2.0f, 0.5f), *w = drand((size_t)C, A, 1.0f, 0.0f), *b = drand((size_t)C, A, 1.0f, 0.0f);
    void *y = dalloc(nc * 2), *dy = drand(nc, A, 1.0f, 0.0f), *dx = drand(nc, A, 1.0f, 0.0f);
    void *dw = dalloc((size_t)C * 4), *db = dalloc((size_t)C * 4);
    float *mean = dalloc((size_t)N * 4), *rstd = dalloc((size_t)N * 4);
    float *scratch = dalloc(fsdp_cuda_norm_backward_scratch(N, C));
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    /* Bytes: forward reads x, writes y (bf16) and the row statistics; backward reads x, dout, dinp
     * and writes dinp (the weight and row-statistic reads are small). */
    BENCH_MEDIAN_MS(fsdp_cuda_rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f, A, 0, NULL), ms);
    line_gbs("rmsnorm_forward", shape, ms, nc * 4.0 + N * 4.0);
    BENCH_MEDIAN_MS(fsdp_cuda_rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, A, G, scratch, 0, NULL), ms);
    line_gbs("rmsnorm_backward", shape, ms, nc * 8.0 + N * 4.0);
    BENCH_MEDIAN_MS(fsdp_cuda_layernorm_forward(y, mean, rstd, x, w, b, N, C, 1e-5f, A, 0, NULL), ms);
    line_gbs("layernorm_forward", shape, ms, nc * 4.0 + N * 8.0);
    BENCH_MEDIAN_MS(fsdp_cuda_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, A, G, scratch, 0, NULL), ms);
    line_gbs("layernorm_backward", shape, ms, nc * 8.0 + N * 8.0);
    CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(b)); CK(cudaFree(y)); CK(cudaFree(dy)); CK(cudaFree(dx));
    CK(cudaFree(dw)); CK(cudaFree(db)); CK(cudaFree(mean)); CK(cudaFree(rstd)); CK(cudaFree(scratch));
}

static void bench_flash(int B, int T, int Hq, int Hkv, int D) {
    const fsdp_dtype A = FSDP_BF16;
    const size_t nqkv = (size_t)B * T * (Hq + 2 * Hkv) * D, nout = (size_t)B * T * Hq * D;
    char shape[64];
    float ms;
    void *qkv = drand(nqkv, A, 1.0f, 0.0f), *out = dalloc(nout * 2), *dout = drand(nout, A, 1.0f, 0.0f);
    void *dqkv = dalloc(nqkv * 2);
    float *lse = dalloc((size_t)B * Hq * T * 4);
    float *scratch = dalloc(fsdp_cuda_flash_backward_scratch(B, T, Hq, Hkv, D) + 16);
    const double fwd_flops = 2.0 * B * Hq * (double)T * T * D;
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d/%d D=%d", B, T, Hq, Hkv, D);
    BENCH_MEDIAN_MS(fsdp_cuda_flash_forward(out, lse, qkv, B, T, Hq, Hkv, D, NULL, A, 0), ms);
    line_tflops("flash_forward", shape, ms, fwd_flops);
    BENCH_MEDIAN_MS(fsdp_cuda_flash_backward(dqkv, dout, qkv, out, lse, B, T, Hq, Hkv, D, NULL, A, scratch, 0), ms);
    line_tflops("flash_backward", shape, ms, 2.5 * fwd_flops);
    CK(cudaFree(qkv)); CK(cudaFree(out)); CK(cudaFree(dout)); CK(cudaFree(dqkv)); CK(cudaFree(lse));
    CK(cudaFree(scratch));
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("kernels_bench: no GPU, nothing to time\n");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("kernels_bench on %s: Llama-3.2-1B shapes, act=bf16, grads=f32, median of %d runs\n", prop.name, REPS);
    bench_norms(4 * 2048, 2048);
    bench_flash(4, 2048, 32, 8, 64);
    bench_flash(4, 2048, 16, 4, 128); /* the D = 128 tensor-core variants */
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    return 0;
}
