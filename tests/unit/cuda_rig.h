/* What the GPU unit tests that call the CUDA kernels directly (test_gpu_attention, test_gpu_decode,
 * test_gpu_dropout, test_gpu_kernels) share: CK(call) around every CUDA runtime call (a failure
 * exits naming the call, file and line), a fixed-seed random stream, checked host buffers (random
 * ones rounded to what dtype t represents, so the CPU sees what the GPU reads), fp32 host
 * arrays to and from device tensors of dtype t (bf16 rounded on the way in, widened on the way out)
 * and the relative error. The test defines CUDA_RIG_SEED, its stream's seed, before including it.
 * Header-only; the backend-level copies are device_copy.h's. */
#ifndef FSDP_TESTS_UNIT_CUDA_RIG_H
#define FSDP_TESTS_UNIT_CUDA_RIG_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda_check.h"
#include "base/dtype.h"

#ifndef CUDA_RIG_SEED
#error "define CUDA_RIG_SEED (the test's random seed) before including cuda_rig.h"
#endif

#define CK(call) FSDP_CHECK_CUDA(call)

static uint64_t g_rng = CUDA_RIG_SEED;

static inline double rnd(void) { /* splitmix64: every run draws the same values, in [0, 1) */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}
static inline float rnd_sym(float a) { return (float)((2.0 * rnd() - 1.0) * a); } /* uniform in (-a, a) */

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}
static inline float *hmalloc(size_t n) { return xmalloc(n * sizeof(float)); }

/* Device memory (16 bytes for a request of 0, so every buffer is a real pointer), and its release. */
static inline void *dmalloc(size_t bytes) {
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static inline void dfree(void *p) {
    if (p) CK(cudaFree(p));
}

/* n values uniform in (-a, a), as representable in t. */
static inline float *hrand(size_t n, float a, fsdp_dtype t) {
    float *p = hmalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = t == FSDP_BF16 ? fsdp_round_bf16(rnd_sym(a)) : rnd_sym(a);
    return p;
}

static inline size_t esz(fsdp_dtype t) { return t == FSDP_BF16 ? 2 : 4; }

static inline void upload(void *d, const float *h, size_t n, fsdp_dtype t) {
    if (t == FSDP_F32) {
        CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
        return;
    }
    uint16_t *b = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) b[i] = fsdp_f32_to_bf16(h[i]);
    CK(cudaMemcpy(d, b, n * 2, cudaMemcpyHostToDevice));
    free(b);
}

static inline void download(float *h, const void *d, size_t n, fsdp_dtype t) {
    if (t == FSDP_F32) {
        CK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
        return;
    }
    uint16_t *b = xmalloc(n * 2);
    CK(cudaMemcpy(b, d, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) h[i] = fsdp_bf16_to_f32(b[i]);
    free(b);
}

/* ||g - c|| / ||c|| in double (||g - c|| where c is 0); NaN anywhere gives NaN, which fails every
 * comparison. */
static inline double rel_err(const float *g, const float *c, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(g[i]) || isnan(c[i])) return NAN;
        double d = (double)g[i] - c[i];
        num += d * d;
        den += (double)c[i] * c[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

#endif
