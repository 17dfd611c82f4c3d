/* Times the block projections' matrix products in bf16 and in FP8 (tensorwise and rowwise scales,
 * src/kernels/fp8.h), through the CUDA backend's ops as training calls them, at 16,384 tokens on the
 * Llama-3.2-1B and Llama-2-7B block shapes: q/k/v (one fused product), o, gate/up (fused), down.
 * Per shape and product: forward (matmul_forward / matmul_forward_fp8), the weight gradient alone
 * (matmul_backward with no dinp) and the whole backward (dx and dW); the FP8 figures include every
 * cast (amax passes, casts and transposes; tensorwise backward casts of x^T and W^T take the amax
 * the forward saved, as training does), so they are what a training step would pay. Each figure
 * is the median of 20 timed runs (events on the backend's compute stream) after 3 warm-up runs
 * (cuBLASLt's algorithm choice is timed during the first), in ms and TFLOP/s (2 N C OC per product),
 * with the FP8 / bf16 speed ratio. Also the forward's two casts alone (tensorwise), to show what the
 * casts cost. Not a test: no pass/fail; exits 0 without a GPU or on a GPU without FP8.
 *
 * Usage: fp8_bench [tokens]   (default 16384) */
#include <stdio.h>
#include <stdlib.h>

#ifndef FSDP_HAVE_CUDA
int main(void) {
    printf("fp8_bench: built without CUDA, nothing to time\n");
    return 0;
}
#else

#include <cuda_runtime.h>
#include <mpi.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "bench_cuda.h"
#include "kernels/fp8_cuda.h"

typedef struct {
    const char *model, *layer;
    int C, OC;
} proj;

static const proj PROJECTIONS[] = {
    {"Llama-3.2-1B", "q/k/v", 2048, 3072},  {"Llama-3.2-1B", "o", 2048, 2048},
    {"Llama-3.2-1B", "gate/up", 2048, 16384}, {"Llama-3.2-1B", "down", 8192, 2048},
    {"Llama-2-7B", "q/k/v", 4096, 12288},   {"Llama-2-7B", "o", 4096, 4096},
    {"Llama-2-7B", "gate/up", 4096, 22016},  {"Llama-2-7B", "down", 11008, 4096},
};

/* One product's case: the tensors and the recipe (NULL: bf16). */
typedef struct {
    fsdp_backend *be;
    int N, C, OC;
    void *x, *w, *y, *dy, *dx, *dw;
    const fsdp_fp8_recipe *r;
    float *saved_amax; /* tensorwise: the forward's amax, which the backward reads, as in training */
} bench_case;

static void forward(const bench_case *k) {
    if (k->r)
        k->be->ops->matmul_forward_fp8(k->be, k->y, k->x, k->w, NULL, NULL, k->N, k->C, k->OC, 0, k->r,
                                       (fsdp_fp8_amax){NULL, NULL, k->saved_amax}, NULL);
    else
        k->be->ops->matmul_forward(k->be, k->y, k->x, k->w, NULL, NULL, k->N, k->C, k->OC, 0);
}
static void backward(const bench_case *k, void *dx) {
    if (k->r)
        k->be->ops->matmul_backward_fp8(k->be, dx, k->dw, NULL, k->dy, k->x, k->w, k->N, k->C, k->OC, k->r,
                                        (fsdp_fp8_amax){NULL, NULL, k->saved_amax}, NULL);
    else
        k->be->ops->matmul_backward(k->be, dx, k->dw, NULL, k->dy, k->x, k->w, k->N, k->C, k->OC);
}

/* Median ms of REPS runs of what(k) after WARMUP, timed on the compute stream. */
static float median_ms(const bench_case *k, int what) {
    fsdp_backend *be = k->be;
    fsdp_event *e0 = be->runtime->event_create(be, 1), *e1 = be->runtime->event_create(be, 1);
    float t[REPS];
    for (int i = 0; i < WARMUP + REPS; i++) {
        be->runtime->event_record(be, e0, be->compute);
        if (what == 0) forward(k);
        else backward(k, what == 2 ? k->dx : NULL);
        be->runtime->event_record(be, e1, be->compute);
        be->runtime->event_synchronize(be, e1);
        if (i >= WARMUP) t[i - WARMUP] = be->runtime->event_elapsed_ms(be, e0, e1);
    }
    be->runtime->event_destroy(be, e0);
    be->runtime->event_destroy(be, e1);
    qsort(t, REPS, sizeof(float), bench_cmp_float);
    return 0.5f * (t[REPS / 2 - 1] + t[REPS / 2]);
}

static void *drand(fsdp_backend *be, size_t n, float a) {
    void *d = be->runtime->alloc(be, n * 2, "bench tensor");
    uint16_t *h = malloc(n * 2);
    if (!h) {
        fprintf(stderr, "fp8_bench: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) h[i] = fsdp_f32_to_bf16(a * bench_uniform_sym());
    CK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* The forward's two tensorwise casts alone (x and W into e4m3), median ms. */
static float casts_ms(const bench_case *k) {
    fsdp_backend *be = k->be;
    const size_t nx = (size_t)k->N * k->C, nw = (size_t)k->OC * k->C;
    uint8_t *cx = be->runtime->alloc(be, nx, "codes"), *cw = be->runtime->alloc(be, nw, "codes");
    float *sc = be->runtime->alloc(be, 6 * sizeof(float), "scales");
    cudaStream_t s = 0;
    CK(cudaDeviceSynchronize());
    float ms;
    BENCH_MEDIAN_MS((fsdp_cuda_fp8_cast(cx, sc, sc + 1, sc + 2, k->x, FSDP_BF16, k->N, k->C, 0, 0, FSDP_E4M3, 0, NULL, s),
                     fsdp_cuda_fp8_cast(cw, sc + 3, sc + 4, sc + 5, k->w, FSDP_BF16, k->OC, k->C, 0, 0, FSDP_E4M3, 0,
                                        NULL, s)),
                    ms);
    be->runtime->free(be, cx);
    be->runtime->free(be, cw);
    be->runtime->free(be, sc);
    return ms;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const int N = argc > 1 ? atoi(argv[1]) : 16384;
    if (!fsdp_backend_cuda_available()) {
        printf("fp8_bench: no GPU, nothing to time\n");
        MPI_Finalize();
        return 0;
    }
    fsdp_err err = {0};
    fsdp_backend_options o = {.kind = "cuda", .act_dtype = FSDP_BF16, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend *be = fsdp_backend_create(&o, &err);
    if (!be) {
        fprintf(stderr, "fp8_bench: %s\n", err.msg);
        MPI_Finalize();
        return 1;
    }
    if (!be->fp8_products || N <= 0 || N % FSDP_FP8_DIM_MULTIPLE) {
        printf("fp8_bench: %s\n", !be->fp8_products ? be->fp8_unavailable : "tokens must be a positive multiple of 16");
        be->runtime->destroy(be);
        MPI_Finalize();
        return !be->fp8_products ? 0 : 1;
    }
    const fsdp_fp8_recipe tw = fsdp_fp8_recipe_of(FSDP_FP8_TENSORWISE), rw = fsdp_fp8_recipe_of(FSDP_FP8_ROWWISE);
    const fsdp_fp8_recipe *recipes[3] = {NULL, &tw, &rw};
    printf("fp8_bench on %s: %d tokens, bf16 activations, fp32 weight gradients; median of %d runs; FP8 includes "
           "its casts\n", be->device_name, N, REPS);
    printf("%-13s %-8s %6s %6s  %-9s %9s %7s  %9s %7s %5s  %9s %7s %5s\n", "model", "layer", "C", "OC", "product",
           "bf16 ms", "TF/s", "tensor ms", "TF/s", "x", "row ms", "TF/s", "x");
    for (size_t p = 0; p < sizeof PROJECTIONS / sizeof PROJECTIONS[0]; p++) {
        const proj *pr = &PROJECTIONS[p];
        bench_case k = {be, N, pr->C, pr->OC, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        float *saved = be->runtime->alloc(be, FSDP_FP8_SAVED_AMAX * sizeof(float), "saved amax");
        k.x = drand(be, (size_t)N * pr->C, 1.0f);
        k.w = drand(be, (size_t)pr->OC * pr->C, 0.02f);
        k.dy = drand(be, (size_t)N * pr->OC, 1e-3f);
        k.y = be->runtime->alloc(be, (size_t)N * pr->OC * 2, "y");
        k.dx = be->runtime->alloc(be, (size_t)N * pr->C * 2, "dx");
        k.dw = be->runtime->alloc(be, (size_t)pr->OC * pr->C * 4, "dw");
        const double flops = 2.0 * N * (double)pr->C * pr->OC;
        float ms[3][3]; /* recipe x {forward, dW, dx + dW} */
        for (int r = 0; r < 3; r++) {
            k.r = recipes[r];
            /* the forward (timed first) saves what the backward reads */
            k.saved_amax = recipes[r] == &tw ? saved : NULL;
            for (int what = 0; what < 3; what++) ms[r][what] = median_ms(&k, what);
        }
        static const char *names[4] = {"forward", "dW", "dx", "backward"};
        for (int what = 0; what < 4; what++) {
            double t[3], f = what == 3 ? 2 * flops : flops;
            for (int r = 0; r < 3; r++)
                t[r] = what == 2 ? ms[r][2] - ms[r][1] : what == 3 ? ms[r][2] : ms[r][what];
            printf("%-13s %-8s %6d %6d  %-9s %9.3f %7.0f  %9.3f %7.0f %5.2f  %9.3f %7.0f %5.2f\n", pr->model, pr->layer,
                   pr->C, pr->OC, names[what], t[0], f / (t[0] * 1e-3) / 1e12, t[1], f / (t[1] * 1e-3) / 1e12,
                   t[0] / t[1], t[2], f / (t[2] * 1e-3) / 1e12, t[0] / t[2]);
        }
        printf("%-13s %-8s %6d %6d  %-9s %9.3f ms (x and W to e4m3, tensorwise, amax passes included)\n", pr->model,
               pr->layer, pr->C, pr->OC, "casts", casts_ms(&k));
        void *ptrs[] = {k.x, k.w, k.dy, k.y, k.dx, k.dw, saved};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) be->runtime->free(be, ptrs[i]);
    }
    printf("(dx = backward - dW; x = bf16 ms / FP8 ms)\n");
    be->runtime->destroy(be);
    MPI_Finalize();
    return 0;
}
#endif
