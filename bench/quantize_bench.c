/* Times the blockwise quantization kernels (src/kernels/cuda/quantize.cu) on 64 Mi-element buffers,
 * the sizes of a large unit's gradient or gathered weights: quantize (bf16 or fp32 -> int8 / fp8 pieces),
 * dequantize (pieces -> bf16) and sum_pieces (S pieces -> one fp32 shard, the local half of a
 * compressed reduce-scatter; bf16 pieces beside them as the uncompressed reference), for S = 2 and
 * 8 pieces. Each figure is the median of 20 timed runs (CUDA events) after 3 warm-up runs, with the
 * bandwidth on the bytes the op must move (each input read once, each output written once, codes and
 * scales counted as the pieces' bytes), next to a device-to-device cudaMemcpy of the bf16 buffer
 * timed in the same run (read + write: the ceiling). Not a test: no pass/fail; exits 0 without a
 * GPU.
 *
 * Usage: quantize_bench */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef FSDP_HAVE_CUDA
int main(void) {
    printf("quantize_bench: built without CUDA, nothing to time\n");
    return 0;
}
#else

#include <cuda_runtime.h>

#include "base/dtype.h"
#include "bench_cuda.h"
#include "kernels/ops_cuda.h"

#define ELEMENTS ((size_t)64 << 20)


/* The buffers of one run: the bf16 tensor and an fp32 one, the quantized pieces, a second bf16
 * tensor (dequantize's output, memcpy's destination) and the fp32 shard. */
typedef struct {
    fsdp_dtype code;
    int pieces;
    size_t count; /* ELEMENTS / pieces */
    void *bf16, *f32, *quant, *bf16_out, *shard;
} bench_case;

static void run_quantize(const bench_case *k) {
    fsdp_cuda_quantize(k->quant, k->code, k->bf16, FSDP_BF16, k->count, k->pieces, ELEMENTS, 0);
}
static void run_quantize_f32(const bench_case *k) {
    fsdp_cuda_quantize(k->quant, k->code, k->f32, FSDP_F32, k->count, k->pieces, ELEMENTS, 0);
}
static void run_dequantize(const bench_case *k) {
    fsdp_cuda_dequantize(k->bf16_out, FSDP_BF16, k->quant, k->code, k->count, k->pieces, 0);
}
static void run_sum(const bench_case *k) {
    fsdp_cuda_sum_pieces(k->shard, FSDP_F32, k->quant, k->code, k->count, k->pieces, 0, 0);
}
static void run_sum_bf16(const bench_case *k) {
    fsdp_cuda_sum_pieces(k->shard, FSDP_F32, k->bf16, FSDP_BF16, k->count, k->pieces, 0, 0);
}
static void run_memcpy(const bench_case *k) {
    CK(cudaMemcpyAsync(k->bf16_out, k->bf16, ELEMENTS * 2, cudaMemcpyDeviceToDevice, 0));
}

/* Median milliseconds of REPS runs of fn (bench_cuda.h). */
static float time_ms(void (*fn)(const bench_case *), const bench_case *k) {
    float ms;
    BENCH_MEDIAN_MS(fn(k), ms);
    return ms;
}

static double gbps(double bytes, float ms) { return bytes / (ms * 1e-3) / 1e9; }

static void line(const char *op, const bench_case *k, float ms, double bytes, double ceiling) {
    char what[64];
    snprintf(what, sizeof what, "%s S=%d", op, k->pieces);
    printf("  %-30s %8.3f ms %7.0f GB/s  %3.0f%% of memcpy\n", what, ms, gbps(bytes, ms),
           100.0 * gbps(bytes, ms) / ceiling);
}

static void bench(bench_case *k, double ceiling) {
    const double elems = (double)ELEMENTS, quant_bytes = (double)k->pieces * fsdp_dtype_piece_bytes(k->code, k->count);
    const double shard_bytes = (double)k->count * 4.0;
    char op[48];
    run_quantize(k); /* pieces for the others to read */
    snprintf(op, sizeof op, "quantize bf16->%s", fsdp_dtype_name(k->code));
    line(op, k, time_ms(run_quantize, k), elems * 2.0 + quant_bytes, ceiling);
    snprintf(op, sizeof op, "quantize fp32->%s", fsdp_dtype_name(k->code));
    line(op, k, time_ms(run_quantize_f32, k), elems * 4.0 + quant_bytes, ceiling);
    run_quantize(k);
    snprintf(op, sizeof op, "dequantize %s->bf16", fsdp_dtype_name(k->code));
    line(op, k, time_ms(run_dequantize, k), quant_bytes + elems * 2.0, ceiling);
    snprintf(op, sizeof op, "sum_pieces %s->fp32", fsdp_dtype_name(k->code));
    line(op, k, time_ms(run_sum, k), quant_bytes + shard_bytes, ceiling);
    fflush(stdout);
}

static void *dev(size_t bytes) {
    void *p = NULL;
    CK(cudaMalloc(&p, bytes));
    return p;
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("quantize_bench: no GPU, nothing to time\n");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    uint16_t *h = malloc(ELEMENTS * 2);
    float *hf = malloc(ELEMENTS * 4);
    if (!h || !hf) {
        fprintf(stderr, "quantize_bench: out of host memory\n");
        return 1;
    }
    for (size_t i = 0; i < ELEMENTS; i++) hf[i] = bench_uniform_sym(), h[i] = fsdp_f32_to_bf16(hf[i]);
    bench_case k = {FSDP_I8,          2, ELEMENTS / 2, dev(ELEMENTS * 2), dev(ELEMENTS * 4),
                    dev(fsdp_dtype_piece_bytes(FSDP_I8, ELEMENTS) + 4096), dev(ELEMENTS * 2), dev(ELEMENTS / 2 * 4)};
    CK(cudaMemcpy(k.bf16, h, ELEMENTS * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k.f32, hf, ELEMENTS * 4, cudaMemcpyHostToDevice));
    free(h), free(hf);

    const float copy_ms = time_ms(run_memcpy, &k);
    const double ceiling = gbps(2.0 * ELEMENTS * 2, copy_ms);
    printf("quantize_bench on %s (%d SMs): %zu Mi elements, blocks of %d\n", prop.name, prop.multiProcessorCount,
           ELEMENTS >> 20, FSDP_QUANT_BLOCK);
    printf("  %-30s %8.3f ms %7.0f GB/s  (read + write: the ceiling)\n", "cudaMemcpy d2d (bf16 buffer)", copy_ms,
           ceiling);
    const fsdp_dtype codes[2] = {FSDP_I8, FSDP_E4M3};
    const int pieces[2] = {2, 8};
    for (int c = 0; c < 2; c++)
        for (int p = 0; p < 2; p++) {
            k.code = codes[c], k.pieces = pieces[p], k.count = ELEMENTS / (size_t)pieces[p];
            bench(&k, ceiling);
        }
    for (int p = 0; p < 2; p++) {
        k.pieces = pieces[p], k.count = ELEMENTS / (size_t)pieces[p];
        line("sum_pieces bf16->fp32", &k, time_ms(run_sum_bf16, &k), ELEMENTS * 2.0 + k.count * 4.0, ceiling);
    }
    void *ptrs[] = {k.bf16, k.f32, k.quant, k.bf16_out, k.shard};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) CK(cudaFree(ptrs[i]));
    return 0;
}

#endif
