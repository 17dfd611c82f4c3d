/* Generation on the GPU against the CPU:
 *  - the kernels of src/kernels/cuda/attention_decode.cu against their CPU twins
 *    (src/kernels/cpu/attention_decode.c): the cache append bit for bit, and the attention of N = 1
 *    and 3 query rows over caches of 1 to 20,000 positions (one split, several, the most splits),
 *    head dims 8, 40 (scalar loads), 64, 128 and 256, GQA groups 1, 3 and 4, fp32 and bf16, an
 *    unaligned cache; relative error below 1e-4 in fp32 and 2e-2 in bf16. Cache positions past the
 *    rows' keys hold NaN, so a kernel that reads past its keys fails. The output is bitwise the same
 *    on a second run;
 *  - the whole decoder (src/model/kv_decode.c) on the CUDA backend: logits of every position of a
 *    sequence decoded token by token and prefilled in part, against the CPU backend's training
 *    forward on the same weights (1e-4 in fp32; bf16 against the CPU's bf16 emulation, 5e-2), for
 *    tiny Llama, OPT, Qwen2, tests/data/tiny-llama-untied, Qwen3 (per-head q/k norms) and Mistral (a
 *    window of 5 in 40 positions);
 *  - sliding windows in the kernel: rows past the window, with the cache before it NaN.
 * Exits 77 without a GPU. */
#include <mpi.h>

#include "kernels/ops_cpu.h"
#include "kernels/ops_cuda.h"
#include "check.h"
#include "kv_rig.h"
#define CUDA_RIG_SEED 0x9e3779b97f4a7c15ull
#include "cuda_rig.h"

typedef struct {
    fsdp_dtype t;
    int D, Hq, Hkv, pos0, N, misalign;
    int window; /* sliding window (0: none) */
} dec_case;

static void run_kernel_case(const dec_case *c) {
    const int D = c->D, Hq = c->Hq, Hkv = c->Hkv, N = c->N, pos0 = c->pos0, cap = pos0 + N + 5;
    const fsdp_dtype t = c->t;
    const size_t W = (size_t)(Hq + 2 * Hkv) * D, nqkv = (size_t)N * W, ncache = (size_t)Hkv * cap * D;
    const size_t nout = (size_t)N * Hq * D, pad = c->misalign ? 8 : 0;
    float *qkv = hrand(nqkv, 1.7f, t), *kc = hrand(ncache, 1.7f, t), *vc = hrand(ncache, 1.7f, t);
    /* Positions past the last row's keys, and before the first row's window: NaN, never read. */
    const int first = c->window && pos0 + 1 - c->window > 0 ? pos0 + 1 - c->window : 0;
    for (int g = 0; g < Hkv; g++)
        for (int p = 0; p < cap; p++)
            if (p >= pos0 + N || p < first)
                for (int d = 0; d < D; d++) kc[((size_t)g * cap + p) * D + d] = vc[((size_t)g * cap + p) * D + d] = NAN;
    float *out_ref = malloc(nout * 4), *out = malloc(nout * 4), *out2 = malloc(nout * 4);
    float *kc_gpu = malloc(ncache * 4), *vc_gpu = malloc(ncache * 4);

    char *d_qkv, *d_kc, *d_vc, *d_out;
    float *d_scr = NULL;
    CK(cudaMalloc((void **)&d_qkv, nqkv * esz(t)));
    CK(cudaMalloc((void **)&d_kc, ncache * esz(t) + pad));
    CK(cudaMalloc((void **)&d_vc, ncache * esz(t) + pad));
    CK(cudaMalloc((void **)&d_out, nout * esz(t)));
    const int keys = fsdp_cuda_decode_keys(pos0 + N, c->window);
    size_t scr = fsdp_cuda_decode_scratch(N, keys, Hq, D);
    if (scr) CK(cudaMalloc((void **)&d_scr, scr));
    upload(d_qkv, qkv, nqkv, t);
    upload(d_kc + pad, kc, ncache, t);
    upload(d_vc + pad, vc, ncache, t);
    CK(cudaMemset(d_out, 0xff, nout * esz(t)));

    cpu_kv_cache_append(kc, vc, qkv, N, pos0, cap, Hq, Hkv, D);
    cpu_attention_decode_window(out_ref, qkv, kc, vc, N, pos0, cap, Hq, Hkv, D, c->window);
    fsdp_cuda_kv_cache_append(d_kc + pad, d_vc + pad, d_qkv, N, pos0, cap, Hq, Hkv, D, t, 0);
    fsdp_cuda_attention_decode_window(d_out, d_qkv, d_kc + pad, d_vc + pad, N, pos0, cap, Hq, Hkv, D, c->window, t,
                                      d_scr, 0);
    CK(cudaDeviceSynchronize());
    download(kc_gpu, d_kc + pad, ncache, t);
    download(vc_gpu, d_vc + pad, ncache, t);
    download(out, d_out, nout, t);
    int same_cache = 1; /* the appended rows; the NaN before the window stays NaN */
    for (size_t i = 0; i < ncache; i++)
        if (!(kc_gpu[i] == kc[i] || (isnan(kc_gpu[i]) && isnan(kc[i]))) ||
            !(vc_gpu[i] == vc[i] || (isnan(vc_gpu[i]) && isnan(vc[i]))))
            same_cache = 0;
    double e = rel_err(out, out_ref, nout), tol = t == FSDP_BF16 ? 2e-2 : 1e-4;
    CK(cudaMemset(d_out, 0xff, nout * esz(t)));
    fsdp_cuda_attention_decode_window(d_out, d_qkv, d_kc + pad, d_vc + pad, N, pos0, cap, Hq, Hkv, D, c->window, t,
                                      d_scr, 0);
    CK(cudaDeviceSynchronize());
    download(out2, d_out, nout, t);
    int det = memcmp(out, out2, nout * 4) == 0;
    check_that(same_cache && !isnan(e) && e < tol && det,
               "decode %s D=%d Hq=%d Hkv=%d pos0=%d N=%d%s window=%d (%d splits): append %s, rel err %.2e (< %.0e)%s",
               fsdp_dtype_name(t), D, Hq, Hkv, pos0, N, c->misalign ? " unaligned" : "", c->window,
               fsdp_cuda_decode_splits(keys), same_cache ? "exact" : "DIFFERS", e, tol,
               det ? ", deterministic" : ", NOT DETERMINISTIC");
    cudaFree(d_qkv), cudaFree(d_kc), cudaFree(d_vc), cudaFree(d_out), cudaFree(d_scr);
    free(qkv), free(kc), free(vc), free(out_ref), free(out), free(out2), free(kc_gpu), free(vc_gpu);
}

static void kernel_cases(void) {
    const int lengths[] = {0, 1, 31, 255, 256, 257, 1000, 5000, 20000};
    const int dims[][3] = {{64, 8, 2}, {128, 4, 4}, {8, 6, 2}, {40, 12, 3}, {256, 4, 1}};
    for (int ti = 0; ti < 2; ti++)
        for (int di = 0; di < 5; di++)
            for (int li = 0; li < 9; li++) {
                dec_case c = {ti ? FSDP_BF16 : FSDP_F32, dims[di][0], dims[di][1], dims[di][2], lengths[li], 1, 0, 0};
                if (c.D == 256 && c.pos0 > 5000) continue;
                run_kernel_case(&c);
                if (li % 3 == 1) { /* a few with three rows at once */
                    c.N = 3;
                    run_kernel_case(&c);
                }
            }
    dec_case unaligned = {FSDP_BF16, 64, 8, 2, 700, 1, 1, 0};
    run_kernel_case(&unaligned);
    unaligned.t = FSDP_F32;
    run_kernel_case(&unaligned);
    /* Sliding windows: rows past the window (the cache before it is NaN), windows of one split and
     * of several, longer than the rows, of one key. */
    const dec_case windows[] = {
        {FSDP_F32, 64, 8, 2, 40, 1, 0, 5},       {FSDP_BF16, 128, 4, 4, 1000, 3, 0, 300},
        {FSDP_F32, 40, 12, 3, 5000, 1, 0, 4096}, {FSDP_BF16, 64, 8, 2, 20000, 1, 0, 4096},
        {FSDP_F32, 8, 6, 2, 10, 3, 0, 100},      {FSDP_BF16, 64, 8, 2, 257, 3, 1, 1},
        {FSDP_F32, 128, 4, 1, 600, 3, 0, 256},
    };
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) run_kernel_case(&windows[i]);
}

static void model_case(const char *model, fsdp_dtype act, double tol) {
    kv_rig cpu, gpu;
    rig_setup(&cpu, "cpu", model, act, 11);
    rig_setup(&gpu, "cuda", model, act, 11);
    const int T = 40, V = cpu.cfg.vocab_size;
    int32_t tokens[40];
    rig_tokens(&cpu, T, 3, tokens);
    float *ref = malloc((size_t)T * V * 4), *got = malloc((size_t)T * V * 4);
    rig_training_logits(&cpu, tokens, T, ref);
    const int prefills[] = {1, 17};
    for (int i = 0; i < 2; i++) {
        rig_decoder_logits(&gpu, tokens, T, prefills[i], got);
        double e = rig_worst(got, ref, T, V);
        check_that(!isnan(e) && e < tol,
                   "%s %s on the GPU, %s: worst position %.2e (< %.0e) against the CPU training forward", model,
                   fsdp_dtype_name(act), prefills[i] > 1 ? "prefill of 17 then token by token" : "token by token", e,
                   tol);
    }
    free(ref), free(got);
    rig_teardown(&gpu);
    rig_teardown(&cpu);
}

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("test_gpu_decode: SKIPPED (no GPU)\n");
        return 77;
    }
    MPI_Init(&argc, &argv);
    kernel_cases();
    const char *models[] = {"tiny-llama", "tiny-opt", "tiny-qwen2", "tiny-llama-untied", "tiny-qwen3", "tiny-mistral"};
    for (int i = 0; i < 6; i++) {
        model_case(models[i], FSDP_F32, 1e-4);
        model_case(models[i], FSDP_BF16, 5e-2);
    }
    int status = check_summary("test_gpu_decode");
    MPI_Finalize();
    return status;
}
