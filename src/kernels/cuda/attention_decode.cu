/* Generation's attention over a KV cache: the launchers fsdp_cuda_kv_cache_append and
 * fsdp_cuda_attention_decode of ops_cuda.h (CPU twins in src/kernels/cpu/attention_decode.c).
 *
 * A decode step has one query row per head and a cache of t + 1 keys, so there is no tile of
 * queries to amortise a key over: the work is reading K and V once, and the parallelism has to come
 * from the keys (flash-decoding). Block (h, n, s) takes query head h of row n and the s-th of S
 * splits of its keys (cuda_scratch.h: S depends on the longest row only). Its DEC_WARPS warps walk
 * the split in tiles of 32 keys, lane j scoring key j of the tile against the query (held in
 * shared memory; K rows read as 16-byte vectors when aligned) and each warp keeping its own online
 * softmax (running max m, sum l, output o over d = lane + 32 i). The warps' states are merged in
 * shared memory; with one split the block writes the normalised output, otherwise (m, l, o) goes
 * to the scratch and a second kernel merges the splits in order. Fixed orders everywhere: the same
 * inputs give the same bits. fp32 arithmetic, K/V/q/out in the act dtype. With a sliding window a
 * row's keys are the window's last ones (positions t - window + 1 .. t), split the same way from
 * the first of them. */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define DEC_WARPS 4
#define DEC_THREADS (DEC_WARPS * 32)
#define DEC_DMAX 256
#define DEC_ACC (DEC_DMAX / 32)

typedef struct {
    void *out;
    const void *qkv, *k_cache, *v_cache;
    float *part; /* [N, Hq, S, D + 2]: m, l, o[D] per split; NULL with one split */
    int N, pos0, cap, Hq, Hkv, D, group, S, keys_per_split;
    int window; /* sliding window: row t reads keys t - window < j <= t; 0: all j <= t */
    long long W;
    float scale;
} dec_args;

static __device__ __forceinline__ float dec_warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* q . K[j] for a key row of D elements at `krow` (vec: 16-byte chunks of 8). */
static __device__ __forceinline__ float dec_dot(const float *q, const void *kc, long long row, int D, int bf16,
                                                int vec) {
    float acc = 0.0f;
    if (vec) {
        const size_t chunk0 = (size_t)row * (size_t)(D / 8);
        for (int c = 0; c < D / 8; c++) {
            float k[8];
            ld8(kc, chunk0 + (size_t)c, bf16, k);
#pragma unroll
            for (int e = 0; e < 8; e++) acc = fmaf(q[8 * c + e], k[e], acc);
        }
    } else {
        for (int d = 0; d < D; d++) acc = fmaf(q[d], ld1(kc, (size_t)row * D + d, bf16), acc);
    }
    return acc;
}

static __device__ __forceinline__ void dec_split_body(const dec_args a, const int bf16, const int vec) {
    __shared__ float q[DEC_DMAX];
    __shared__ float wm[DEC_WARPS], wl[DEC_WARPS];
    __shared__ float wo[DEC_WARPS][DEC_DMAX];
    const int h = blockIdx.x, n = blockIdx.y, s = blockIdx.z, D = a.D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* This row's keys lo .. len - 1 (the window's), split s of them. */
    const int len = a.pos0 + n + 1, lo = a.window ? max(0, len - a.window) : 0;
    const int k0 = lo + s * a.keys_per_split, k1 = min(k0 + a.keys_per_split, len);
    const long long prow = (((long long)n * a.Hq + h) * a.S + s) * (D + 2);
    if (k0 >= k1) { /* a split past this row's keys (block-uniform): contributes nothing */
        if (threadIdx.x == 0) a.part[prow] = -INFINITY, a.part[prow + 1] = 0.0f;
        for (int d = threadIdx.x; d < D; d += DEC_THREADS) a.part[prow + 2 + d] = 0.0f;
        return;
    }
    for (int d = threadIdx.x; d < D; d += DEC_THREADS) q[d] = ld1(a.qkv, (size_t)n * a.W + (size_t)h * D + d, bf16);
    __syncthreads();

    const long long base = (long long)(h / a.group) * a.cap; /* first row of this kv head */
    float m = -INFINITY, l = 0.0f, o[DEC_ACC];
#pragma unroll
    for (int i = 0; i < DEC_ACC; i++) o[i] = 0.0f;
    for (int j0 = k0 + 32 * warp; j0 < k1; j0 += 32 * DEC_WARPS) { /* warp-uniform */
        const int j = j0 + lane, nk = min(32, k1 - j0);
        const float sc = j < k1 ? dec_dot(q, a.k_cache, base + j, D, bf16, vec) * a.scale : -INFINITY;
        const float m_new = fmaxf(m, dec_warp_max(sc)); /* finite: key j0 < k1 is lane 0's */
        const float alpha = __expf(m - m_new), p = j < k1 ? __expf(sc - m_new) : 0.0f;
        l = l * alpha + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int i = 0; i < DEC_ACC; i++) o[i] *= alpha;
        for (int jj = 0; jj < nk; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const size_t vrow = (size_t)(base + j0 + jj) * D;
#pragma unroll
            for (int i = 0; i < DEC_ACC; i++)
                if (lane + 32 * i < D) o[i] = fmaf(pj, ld1(a.v_cache, vrow + lane + 32 * i, bf16), o[i]);
        }
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
    for (int i = 0; i < DEC_ACC; i++)
        if (lane + 32 * i < D) wo[warp][lane + 32 * i] = o[i];
    __syncthreads();

    /* Merge the warps (a warp without keys has m = -inf, l = 0 and adds nothing). */
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w]);
    float L = 0.0f, f[DEC_WARPS];
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) f[w] = __expf(wm[w] - M), L += wl[w] * f[w];
    for (int d = threadIdx.x; d < D; d += DEC_THREADS) {
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) acc += wo[w][d] * f[w];
        if (a.S == 1)
            st1(a.out, ((size_t)n * a.Hq + h) * D + d, bf16, acc / L);
        else
            a.part[prow + 2 + d] = acc;
    }
    if (a.S > 1 && threadIdx.x == 0) a.part[prow] = M, a.part[prow + 1] = L;
}

/* out of (h, n) from its S splits, merged in split order (split 0 always holds keys). */
static __device__ __forceinline__ void dec_merge_body(const dec_args a, const int bf16) {
    const int h = blockIdx.x, n = blockIdx.y, D = a.D;
    const float *p = a.part + ((long long)n * a.Hq + h) * a.S * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < a.S; s++) M = fmaxf(M, p[(long long)s * (D + 2)]);
    float L = 0.0f;
    for (int s = 0; s < a.S; s++) L += p[(long long)s * (D + 2) + 1] * __expf(p[(long long)s * (D + 2)] - M);
    for (int d = threadIdx.x; d < D; d += DEC_THREADS) {
        float acc = 0.0f;
        for (int s = 0; s < a.S; s++) {
            const float *ps = p + (long long)s * (D + 2);
            acc += ps[2 + d] * __expf(ps[0] - M);
        }
        st1(a.out, ((size_t)n * a.Hq + h) * D + d, bf16, acc / L);
    }
}

__global__ void __launch_bounds__(DEC_THREADS) dec_split_f32(const dec_args a) { dec_split_body(a, 0, 0); }
__global__ void __launch_bounds__(DEC_THREADS) dec_split_f32_vec(const dec_args a) { dec_split_body(a, 0, 1); }
__global__ void __launch_bounds__(DEC_THREADS) dec_split_bf16(const dec_args a) { dec_split_body(a, 1, 0); }
__global__ void __launch_bounds__(DEC_THREADS) dec_split_bf16_vec(const dec_args a) { dec_split_body(a, 1, 1); }
__global__ void __launch_bounds__(DEC_THREADS) dec_merge_f32(const dec_args a) { dec_merge_body(a, 0); }
__global__ void __launch_bounds__(DEC_THREADS) dec_merge_bf16(const dec_args a) { dec_merge_body(a, 1); }

/* k and v heads of N rows into the cache: element (which, n, g, d) of the grid-stride loop. */
static __device__ __forceinline__ void append_body(void *kc, void *vc, const void *qkv, int N, int pos0, int cap,
                                                   int Hq, int Hkv, int D, long long W, int bf16) {
    const size_t per = (size_t)N * Hkv * D, total = 2 * per;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int which = i >= per;
        const size_t r = i - (which ? per : 0);
        const int d = (int)(r % (size_t)D), g = (int)(r / (size_t)D % (size_t)Hkv), n = (int)(r / ((size_t)D * Hkv));
        const size_t src = (size_t)n * W + (size_t)(Hq + which * Hkv + g) * D + d;
        const size_t dst = ((size_t)g * cap + (size_t)(pos0 + n)) * D + d;
        void *cache = which ? vc : kc;
        if (bf16)
            ((__nv_bfloat16 *)cache)[dst] = ((const __nv_bfloat16 *)qkv)[src];
        else
            ((float *)cache)[dst] = ((const float *)qkv)[src];
    }
}

__global__ void kv_append_f32(void *kc, void *vc, const void *qkv, int N, int pos0, int cap, int Hq, int Hkv, int D,
                              long long W) {
    append_body(kc, vc, qkv, N, pos0, cap, Hq, Hkv, D, W, 0);
}
__global__ void kv_append_bf16(void *kc, void *vc, const void *qkv, int N, int pos0, int cap, int Hq, int Hkv, int D,
                               long long W) {
    append_body(kc, vc, qkv, N, pos0, cap, Hq, Hkv, D, W, 1);
}

static void dec_check_shape(const char *op, int N, int pos0, int cap, int Hq, int Hkv, int D) {
    if (N < 0 || pos0 < 0 || pos0 + N > cap || Hq < 1 || Hkv < 1 || Hq % Hkv != 0 || D < 1 || D > DEC_DMAX)
        fsdp_fatal("%s: unsupported shape N=%d pos0=%d cap=%d Hq=%d Hkv=%d D=%d (need pos0 + N <= cap, Hq %% Hkv == 0, "
                   "1 <= D <= %d)", op, N, pos0, cap, Hq, Hkv, D, DEC_DMAX);
}

void fsdp_cuda_kv_cache_append(void *k_cache, void *v_cache, const void *qkv, int N, int pos0, int cap, int Hq,
                               int Hkv, int D, fsdp_dtype act, cudaStream_t s) {
    dec_check_shape("fsdp_cuda_kv_cache_append", N, pos0, cap, Hq, Hkv, D);
    if (N == 0) return;
    const long long W = (long long)(Hq + 2 * Hkv) * D;
    const unsigned grid = fsdp_cuda_grid(2 * (size_t)N * Hkv * D, 256);
    if (act == FSDP_BF16)
        kv_append_bf16<<<grid, 256, 0, s>>>(k_cache, v_cache, qkv, N, pos0, cap, Hq, Hkv, D, W);
    else
        kv_append_f32<<<grid, 256, 0, s>>>(k_cache, v_cache, qkv, N, pos0, cap, Hq, Hkv, D, W);
    fsdp_cuda_check_launch("kv_append");
}

void fsdp_cuda_attention_decode(void *out, const void *qkv, const void *k_cache, const void *v_cache, int N, int pos0,
                                int cap, int Hq, int Hkv, int D, fsdp_dtype act, float *scratch, cudaStream_t s) {
    fsdp_cuda_attention_decode_window(out, qkv, k_cache, v_cache, N, pos0, cap, Hq, Hkv, D, 0, act, scratch, s);
}

void fsdp_cuda_attention_decode_window(void *out, const void *qkv, const void *k_cache, const void *v_cache, int N,
                                       int pos0, int cap, int Hq, int Hkv, int D, int window, fsdp_dtype act,
                                       float *scratch, cudaStream_t s) {
    dec_check_shape("fsdp_cuda_attention_decode", N, pos0, cap, Hq, Hkv, D);
    if (N == 0) return;
    dec_args a;
    memset(&a, 0, sizeof a);
    a.out = out, a.qkv = qkv, a.k_cache = k_cache, a.v_cache = v_cache;
    a.N = N, a.pos0 = pos0, a.cap = cap, a.Hq = Hq, a.Hkv = Hkv, a.D = D, a.group = Hq / Hkv;
    a.W = (long long)(Hq + 2 * Hkv) * D;
    a.scale = 1.0f / sqrtf((float)D);
    a.window = window > 0 ? window : 0;
    const int keys = fsdp_cuda_decode_keys(pos0 + N, a.window); /* the longest row's */
    a.S = fsdp_cuda_decode_splits(keys);
    a.keys_per_split = (keys + a.S - 1) / a.S;
    a.keys_per_split = (a.keys_per_split + 31) / 32 * 32;
    if (a.S > 1) {
        if (!scratch) fsdp_fatal("fsdp_cuda_attention_decode: %d splits need scratch", a.S);
        a.part = scratch;
    }
    const int vec = D % 8 == 0 && fsdp_cuda_aligned16(k_cache);
    const dim3 grid((unsigned)Hq, (unsigned)N, (unsigned)a.S);
    void (*split)(const dec_args) = act == FSDP_BF16 ? (vec ? dec_split_bf16_vec : dec_split_bf16)
                                                     : (vec ? dec_split_f32_vec : dec_split_f32);
    split<<<grid, DEC_THREADS, 0, s>>>(a);
    fsdp_cuda_check_launch("dec_split");
    if (a.S == 1) return;
    const dim3 mgrid((unsigned)Hq, (unsigned)N);
    if (act == FSDP_BF16)
        dec_merge_bf16<<<mgrid, DEC_THREADS, 0, s>>>(a);
    else
        dec_merge_f32<<<mgrid, DEC_THREADS, 0, s>>>(a);
    fsdp_cuda_check_launch("dec_merge");
}
