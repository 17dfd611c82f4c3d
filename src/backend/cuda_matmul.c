/* Matrix products through cuBLASLt, with one measured choice of algorithm per problem (bf16, fp32,
 * and FP8 with tensor or outer-vector scales: fsdp_gemm in cuda_internal.h).
 *
 * The first time a problem (shapes, transposes, dtypes, epilogue, pointer alignment) is seen, the
 * heuristic's top candidates are each timed on it and the fastest is cached for the rest of the
 * run. Problems that accumulate into their output in place (weight gradients) are timed on a
 * scratch copy of a slice of the output, so tuning never disturbs real gradients. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/env.h"
#include "cuda_internal.h"

#define CANDIDATES 8
#define TUNE_SCRATCH_BYTES FSDP_CUDA_TUNE_SCRATCH_BYTES

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldc, ldd;
    int in_t, out_t, epilogue, has_c, align_a, align_b, align_c, align_d;
    int b_t, scaled, outer_vec, fast_accum; /* FP8: B's dtype, scale pointers set, their mode */
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulAlgo_t algo;
    int unsupported; /* cuBLASLt had no algorithm (fsdp_cuda_gemm_try's problems only) */
    struct gemm_entry *next;
} gemm_entry;

struct matmul_cache {
    gemm_entry *entries;
    void *tune_scratch;
    int verbose;
    int no_tuning; /* FSDP_GEMM_TUNE=0: cuBLASLt's first choice, untimed (for comparisons) */
};

static int alignment(const void *p) {
    uintptr_t v = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (v % (uintptr_t)a)) a /= 2;
    return a;
}

/* cuBLASLt's name of each dtype (the fp8 rows are what FP8 products will take). */
static const cudaDataType_t CUDA_TYPES[FSDP_DTYPE_COUNT] = {[FSDP_F32] = CUDA_R_32F, [FSDP_BF16] = CUDA_R_16BF,
                                                           [FSDP_I8] = CUDA_R_8I, [FSDP_E4M3] = CUDA_R_8F_E4M3,
                                                           [FSDP_E5M2] = CUDA_R_8F_E5M2};
static cudaDataType_t cuda_type(int t) { return CUDA_TYPES[t]; }

void fsdp_cuda_matmul_init(fsdp_backend *be) {
    matmul_cache *mc = fsdp_xcalloc(1, sizeof *mc, "the matmul cache");
    mc->verbose = fsdp_env_verbose_gemm();
    mc->no_tuning = !fsdp_env_gemm_tune();
    /* Now rather than at the first product that needs it, so that the first step allocates nothing. */
    if (!mc->no_tuning) mc->tune_scratch = be->runtime->alloc(be, TUNE_SCRATCH_BYTES, "matmul tuning scratch");
    cuda_of(be)->matmuls = mc;
}

void fsdp_cuda_matmul_destroy(fsdp_backend *be) {
    matmul_cache *mc = cuda_of(be)->matmuls;
    if (!mc) return;
    for (gemm_entry *e = mc->entries, *next; e; e = next) {
        next = e->next;
        FSDP_CHECK_CUBLAS(cublasLtMatmulDescDestroy(e->desc));
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(e->a));
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(e->b));
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(e->c));
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(e->d));
        free(e);
    }
    if (mc->tune_scratch) be->runtime->free(be, mc->tune_scratch);
    free(mc);
}

static cublasLtEpilogue_t epilogue_of(const fsdp_gemm *g) {
    if (g->bias) return g->relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    return g->relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT;
}

static void make_layouts(const gemm_key *k, int n, cublasLtMatrixLayout_t *a, cublasLtMatrixLayout_t *b,
                         cublasLtMatrixLayout_t *c, cublasLtMatrixLayout_t *d) {
    cudaDataType_t in = cuda_type(k->in_t), in_b = cuda_type(k->scaled ? k->b_t : k->in_t), out = cuda_type(k->out_t);
    FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(a, in, k->transa ? k->k : k->m, k->transa ? k->m : k->k, k->lda));
    FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(b, in_b, k->transb ? n : k->k, k->transb ? k->k : n, k->ldb));
    FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(c, out, k->m, n, k->ldc));
    FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(d, out, k->m, n, k->ldd));
}

static cublasLtMatmulDesc_t make_desc(fsdp_backend *be, const gemm_key *k) {
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (k->in_t == FSDP_F32 && cuda_of(be)->tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    cublasLtMatmulDesc_t desc;
    FSDP_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    cublasOperation_t ta = k->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epilogue;
    FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_RELU_BIAS) {
        cudaDataType_t bt = cuda_type(k->out_t);
        FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (k->scaled) {
        int8_t fast = (int8_t)k->fast_accum;
        FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        if (k->outer_vec) {
            int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
            FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
            FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
        }
    }
    return desc;
}

static cublasLtMatmulPreference_t make_preference(fsdp_backend *be, const gemm_key *k) {
    cublasLtMatmulPreference_t pref;
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = cuda_of(be)->lt_workspace_bytes;
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al[4] = {(uint32_t)k->align_a, (uint32_t)k->align_b, (uint32_t)k->align_c, (uint32_t)k->align_d};
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4));
    return pref;
}

static void run(fsdp_backend *be, cublasLtMatmulDesc_t desc, const cublasLtMatmulAlgo_t *algo, const fsdp_gemm *g,
                cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                cublasLtMatrixLayout_t d, const void *C, void *D, cudaStream_t s) {
    cuda_context *im = cuda_of(be);
    float alpha = 1.0f, beta = g->beta;
    if (g->bias)
        FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
    if (g->a_scale) {
        FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->a_scale,
                                                         sizeof g->a_scale));
        FSDP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->b_scale,
                                                         sizeof g->b_scale));
    }
    FSDP_CHECK_CUBLAS(cublasLtMatmul(im->lt, desc, &alpha, g->A, a, g->B, b, &beta, C ? C : D, c, D, d, algo,
                                     im->lt_workspace, im->lt_workspace_bytes, s));
}

/* Times the candidates on this problem (or on a slice of it, when it accumulates in place) and
 * returns the index of the fastest. */
static int tune(fsdp_backend *be, gemm_entry *e, const fsdp_gemm *g, cublasLtMatmulHeuristicResult_t *res, int count,
                cudaStream_t s) {
    matmul_cache *mc = cuda_of(be)->matmuls;
    const gemm_key *k = &e->key;
    int in_place = g->beta != 0.0f && g->C == g->D;
    int n = k->n;
    cublasLtMatrixLayout_t a = e->a, b = e->b, c = e->c, d = e->d;
    const void *C = g->C;
    void *D = g->D;
    if (in_place) {
        size_t col = (size_t)k->ldd * fsdp_dtype_info_of((fsdp_dtype)k->out_t)->bytes;
        size_t fit = TUNE_SCRATCH_BYTES / col;
        if ((size_t)n > fit) n = (int)(fit / 128 * 128 > 0 ? fit / 128 * 128 : fit);
        make_layouts(k, n, &a, &b, &c, &d);
        C = D = mc->tune_scratch;
        FSDP_CHECK_CUDA(cudaMemsetAsync(D, 0, col * (size_t)n, s));
    }
    cudaEvent_t start, stop;
    FSDP_CHECK_CUDA(cudaEventCreate(&start));
    FSDP_CHECK_CUDA(cudaEventCreate(&stop));
    int best = 0;
    float best_ms = 1e30f;
    for (int i = 0; i < count; i++) {
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(cuda_of(be)->lt, e->desc, a, b, c, d, &res[i].algo, &check) !=
            CUBLAS_STATUS_SUCCESS)
            continue;
        run(be, e->desc, &res[i].algo, g, a, b, c, d, C, D, s); /* warm-up */
        FSDP_CHECK_CUDA(cudaEventRecord(start, s));
        for (int r = 0; r < 3; r++) run(be, e->desc, &res[i].algo, g, a, b, c, d, C, D, s);
        FSDP_CHECK_CUDA(cudaEventRecord(stop, s));
        FSDP_CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0.0f;
        FSDP_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        if (ms < best_ms) best_ms = ms, best = i;
    }
    FSDP_CHECK_CUDA(cudaEventDestroy(start));
    FSDP_CHECK_CUDA(cudaEventDestroy(stop));
    if (in_place) {
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(a));
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(b));
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(c));
        FSDP_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(d));
    }
    if (mc->verbose) {
        double tflops = 2.0 * k->m * (double)n * k->k * 3 / (best_ms * 1e-3) / 1e12;
        fprintf(stderr, "gemm m=%d n=%d k=%d %c%c %s->%s epi=%d: candidate %d of %d, %.3f ms, %.0f TFLOP/s\n", k->m, k->n,
                k->k, k->transa ? 'T' : 'N', k->transb ? 'T' : 'N', fsdp_dtype_name((fsdp_dtype)k->in_t),
                fsdp_dtype_name((fsdp_dtype)k->out_t),
                k->epilogue, best, count, best_ms / 3, tflops);
    }
    return best;
}

static gemm_entry *lookup(fsdp_backend *be, const fsdp_gemm *g, cudaStream_t s, int may_fail) {
    matmul_cache *mc = cuda_of(be)->matmuls;
    gemm_key k;
    memset(&k, 0, sizeof k);
    k.transa = g->transa, k.transb = g->transb, k.m = g->m, k.n = g->n, k.k = g->k;
    k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc, k.ldd = g->ldd;
    k.in_t = g->in_t, k.out_t = g->out_t, k.epilogue = (int)epilogue_of(g), k.has_c = g->beta != 0.0f;
    k.align_a = alignment(g->A), k.align_b = alignment(g->B), k.align_c = alignment(g->C ? g->C : g->D);
    k.align_d = alignment(g->D);
    if (g->a_scale) k.b_t = g->b_t, k.scaled = 1, k.outer_vec = g->outer_vec, k.fast_accum = g->fast_accum;
    for (gemm_entry *e = mc->entries; e; e = e->next)
        if (!memcmp(&e->key, &k, sizeof k)) return e;

    gemm_entry *e = fsdp_xcalloc(1, sizeof *e, "a matmul plan");
    e->key = k;
    e->desc = make_desc(be, &k);
    make_layouts(&k, k.n, &e->a, &e->b, &e->c, &e->d);
    cublasLtMatmulPreference_t pref = make_preference(be, &k);
    cublasLtMatmulHeuristicResult_t res[CANDIDATES];
    int count = 0;
    if (may_fail) {
        /* A scaling mode this cuBLASLt or GPU lacks is "not supported", not a failure. */
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda_of(be)->lt, e->desc, e->a, e->b, e->c, e->d, pref,
                                                           CANDIDATES, res, &count);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) count = 0;
        else if (st != CUBLAS_STATUS_SUCCESS) FSDP_CHECK_CUBLAS(st);
    } else {
        FSDP_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(cuda_of(be)->lt, e->desc, e->a, e->b, e->c, e->d, pref,
                                                          CANDIDATES, res, &count));
    }
    FSDP_CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    if (count == 0 && may_fail) {
        if (mc->verbose)
            fprintf(stderr, "gemm m=%d n=%d k=%d %s x %s (%s scales): no cuBLASLt algorithm\n", k.m, k.n, k.k,
                    fsdp_dtype_name((fsdp_dtype)k.in_t), fsdp_dtype_name((fsdp_dtype)(k.scaled ? k.b_t : k.in_t)),
                    k.outer_vec ? "outer-vector" : "scalar");
        e->unsupported = 1;
        e->next = mc->entries;
        mc->entries = e;
        return e;
    }
    if (count == 0)
        fsdp_fatal("cuBLASLt has no algorithm for a %dx%dx%d product (%s inputs, %s output, epilogue %d)", k.m, k.n, k.k,
                   fsdp_dtype_name((fsdp_dtype)k.in_t), fsdp_dtype_name((fsdp_dtype)k.out_t), k.epilogue);
    e->algo = res[count > 1 && !mc->no_tuning ? tune(be, e, g, res, count, s) : 0].algo;
    if (mc->verbose && (count == 1 || mc->no_tuning))
        fprintf(stderr, "gemm m=%d n=%d k=%d: cuBLASLt's first of %d, untimed\n", k.m, k.n, k.k, count);
    e->next = mc->entries;
    mc->entries = e;
    return e;
}

void fsdp_cuda_gemm(fsdp_backend *be, const fsdp_gemm *g, cudaStream_t s) {
    gemm_entry *e = lookup(be, g, s, 0);
    if (e->unsupported)
        fsdp_fatal("cuBLASLt has no algorithm for a %dx%dx%d product (%s inputs)", g->m, g->n, g->k,
                   fsdp_dtype_name(g->in_t));
    run(be, e->desc, &e->algo, g, e->a, e->b, e->c, e->d, g->C, g->D, s);
}

int fsdp_cuda_gemm_try(fsdp_backend *be, const fsdp_gemm *g, cudaStream_t s) {
    gemm_entry *e = lookup(be, g, s, 1);
    if (e->unsupported) return -1;
    run(be, e->desc, &e->algo, g, e->a, e->b, e->c, e->d, g->C, g->D, s);
    return 0;
}

void fsdp_cuda_gemm_strided_batched(fsdp_backend *be, int transa, int transb, int m, int n, int k, const void *A,
                                    int lda, long long stride_a, const void *B, int ldb, long long stride_b, float beta,
                                    void *C, int ldc, long long stride_c, int batch, fsdp_dtype t, cudaStream_t s) {
    cuda_context *im = cuda_of(be);
    float alpha = 1.0f;
    cudaDataType_t ct = cuda_type(t);
    cublasComputeType_t compute = (t == FSDP_F32 && im->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    FSDP_CHECK_CUBLAS(cublasSetStream(im->blas, s));
    FSDP_CHECK_CUBLAS(cublasGemmStridedBatchedEx(im->blas, transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                 transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, ct, lda,
                                                 stride_a, B, ct, ldb, stride_b, &beta, C, ct, ldc, stride_c, batch,
                                                 compute, CUBLAS_GEMM_DEFAULT));
}
