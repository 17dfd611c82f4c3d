/* Times the flash attention kernels (fsdp_cuda_flash_forward / _backward, bf16) at training
 * shapes and prints TFLOP/s. Causal FLOPs are counted as forward = 2 * B * Hq * T * T * D (two
 * products of 2 * T * T * D each, halved by the mask) and backward = 2.5 x forward, the usual
 * convention, whatever the kernels actually compute (the deterministic backward recomputes P and
 * does 7 products, not 5), and the backward is timed twice: deterministic, and with dQ summed by
 * atomics (fsdp_cuda_flash_backward_atomic, 5 products). Each figure is the median of 20 timed runs (CUDA events) after 3
 * warm-up runs, on random inputs. Not a test: no pass/fail; exits 0 without a GPU.
 *
 * Where the build has cuDNN (FSDP_HAVE_CUDNN) each shape is also timed through the CUDA backend's
 * attention ops with --attn cudnn (cuDNN's fused attention: the plan is built in the warm-up runs),
 * as the mean of REPS runs between two device synchronisations (the backend's own stream).
 *
 * `attention_bench --dropout P` also times every shape with attention-probability dropout at rate P
 * (the DROP variants of the kernels) and prints its time relative to the plain kernels.
 *
 * Build: gcc -std=c11 -O2 -Isrc -I/usr/local/cuda/include bench/attention_bench.c <libfsdp_core.a and
 * its dependencies> -L/usr/local/cuda/lib64 -lcudart */
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "bench_cuda.h"
#include "backend/backend.h"
#include "kernels/ops_cuda.h"

#if FSDP_HAVE_CUDNN
#include <time.h>

static fsdp_backend *cudnn_backend; /* NULL: cuDNN not timed */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
#endif


static uint64_t g_rng = 0x853c49e6748fea9bull;
static float rnd_sym(void) { /* splitmix64 -> uniform (-1.7, 1.7): magnitude ~1 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 1.7320508);
}

static void *rand_bf16_dev(size_t n) {
    uint16_t *h = malloc(n * sizeof(uint16_t));
    if (!h) {
        fprintf(stderr, "attention_bench: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) h[i] = fsdp_f32_to_bf16(rnd_sym());
    void *d;
    CK(cudaMalloc(&d, n * sizeof(uint16_t)));
    CK(cudaMemcpy(d, h, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct {
    void *out, *dout, *qkv, *dqkv;
    float *lse, *scratch;
    int B, T, Hq, Hkv, D;
    const fsdp_dropout *drop; /* NULL: no dropout */
} shape;

static void run_fwd(const shape *s) {
    fsdp_cuda_flash_forward(s->out, s->lse, s->qkv, s->B, s->T, s->Hq, s->Hkv, s->D, s->drop, FSDP_BF16, 0);
}
static void run_bwd(const shape *s) {
    fsdp_cuda_flash_backward(s->dqkv, s->dout, s->qkv, s->out, s->lse, s->B, s->T, s->Hq, s->Hkv, s->D, s->drop,
                             FSDP_BF16, s->scratch, 0);
}
static void run_bwd_atomic(const shape *s) {
    fsdp_cuda_flash_backward_atomic(s->dqkv, s->dout, s->qkv, s->out, s->lse, s->B, s->T, s->Hq, s->Hkv, s->D, 0,
                                    s->drop, FSDP_BF16, s->scratch, 0);
}

/* Median milliseconds of REPS runs of fn (bench_cuda.h). */
static float time_ms(void (*fn)(const shape *), const shape *s) {
    float ms;
    BENCH_MEDIAN_MS(fn(s), ms);
    return ms;
}

static void bench(int B, int T, int Hq, int Hkv, int D, double p) {
    shape s = {0};
    s.B = B, s.T = T, s.Hq = Hq, s.Hkv = Hkv, s.D = D;
    const size_t nqkv = (size_t)B * T * (Hq + 2 * Hkv) * D, no = (size_t)B * T * Hq * D;
    s.qkv = rand_bf16_dev(nqkv);
    s.dout = rand_bf16_dev(no);
    CK(cudaMalloc(&s.out, no * 2));
    CK(cudaMalloc(&s.dqkv, nqkv * 2));
    CK(cudaMalloc((void **)&s.lse, (size_t)B * Hq * T * sizeof(float)));
    CK(cudaMalloc((void **)&s.scratch, fsdp_cuda_flash_backward_atomic_scratch(B, T, Hq, Hkv, D) + 16));

    const double fwd_flop = 2.0 * B * Hq * (double)T * T * D, bwd_flop = 2.5 * fwd_flop;
    const float fwd_ms = time_ms(run_fwd, &s);
    const float bwd_ms = time_ms(run_bwd, &s), abwd_ms = time_ms(run_bwd_atomic, &s);
    printf("B=%-3d T=%-5d Hq=%-3d Hkv=%-3d D=%-4d  fwd %8.3f ms %7.1f TFLOP/s   bwd %8.3f ms %7.1f TFLOP/s   "
           "bwd atomic dQ %8.3f ms %7.1f TFLOP/s\n", B, T, Hq, Hkv, D, fwd_ms, fwd_flop / (fwd_ms * 1e-3) / 1e12, bwd_ms,
           bwd_flop / (bwd_ms * 1e-3) / 1e12, abwd_ms, bwd_flop / (abwd_ms * 1e-3) / 1e12);
    if (p > 0.0) {
        const fsdp_dropout drop = fsdp_dropout_make(p, 1234, 0, 0, FSDP_DROPOUT_ATTN_PROBS);
        s.drop = &drop;
        const float dfwd_ms = time_ms(run_fwd, &s), dbwd_ms = time_ms(run_bwd, &s);
        s.drop = NULL;
        printf("  with dropout %.2f:                       fwd %8.3f ms (x%.3f)             bwd %8.3f ms (x%.3f)\n", p,
               dfwd_ms, dfwd_ms / fwd_ms, dbwd_ms, dbwd_ms / bwd_ms);
    }
#if FSDP_HAVE_CUDNN
    if (cudnn_backend) {
        fsdp_backend *g = cudnn_backend;
        double ms[2];
        for (int bwd = 0; bwd < 2; bwd++) {
            for (int r = 0; r < WARMUP + REPS; r++) {
                if (r == WARMUP) {
                    CK(cudaDeviceSynchronize());
                    ms[bwd] = now_ms();
                }
                if (bwd)
                    g->ops->attention_backward(g, FSDP_ATTN_CUDNN, s.dqkv, s.dout, s.qkv, s.out, s.lse, NULL, B, T, Hq,
                                               Hkv, D, 0, NULL);
                else
                    g->ops->attention_forward(g, FSDP_ATTN_CUDNN, s.out, s.lse, NULL, s.qkv, B, T, Hq, Hkv, D, 0, NULL);
            }
            CK(cudaDeviceSynchronize());
            ms[bwd] = (now_ms() - ms[bwd]) / REPS;
        }
        printf("  cudnn:                                    fwd %8.3f ms %7.1f TFLOP/s   bwd %8.3f ms %7.1f TFLOP/s\n",
               ms[0], fwd_flop / (ms[0] * 1e-3) / 1e12, ms[1], bwd_flop / (ms[1] * 1e-3) / 1e12);
    }
#endif
    fflush(stdout);

    CK(cudaFree(s.qkv));
    CK(cudaFree(s.dout));
    CK(cudaFree(s.out));
    CK(cudaFree(s.dqkv));
    CK(cudaFree(s.lse));
    CK(cudaFree(s.scratch));
}

int main(int argc, char **argv) {
    double p = 0.0;
    if (argc == 3 && strcmp(argv[1], "--dropout") == 0) p = atof(argv[2]);
    if ((argc != 1 && argc != 3) || !fsdp_dropout_rate_ok(p)) {
        fprintf(stderr, "usage: attention_bench [--dropout P]   (0 <= P < 1)\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("attention_bench: no GPU, nothing to time\n");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("attention_bench on %s (%d SMs); causal, bf16, flash path\n", prop.name, prop.multiProcessorCount);
#if FSDP_HAVE_CUDNN
    MPI_Init(&argc, &argv);
    fsdp_err err = {0};
    fsdp_backend_options o = {.kind = "cuda", .act_dtype = FSDP_BF16, .grad_dtype = FSDP_F32, .local_size = 1};
    cudnn_backend = fsdp_backend_create(&o, &err);
    if (!cudnn_backend) printf("cudnn not timed: %s\n", err.msg);
#endif
    bench(8, 2048, 32, 8, 64, p);
    bench(32, 1024, 32, 8, 64, p); /* Llama-3.2-1B, micro-batch 32 x 1024 */
    bench(4, 2048, 32, 32, 128, p);
    bench(5, 4096, 32, 32, 128, p); /* Llama-2-7B, micro-batch 5 x 4096 */
#if FSDP_HAVE_CUDNN
    if (cudnn_backend) cudnn_backend->runtime->destroy(cudnn_backend);
    MPI_Finalize();
#endif
    return 0;
}
