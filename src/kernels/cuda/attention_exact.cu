/* The exact attention path for every case the tensor-core kernels do not take (fp32 activations,
 * head dims other than 64 and 128, unaligned tensors), and the delta kernel both backward paths
 * use. fp32 arithmetic throughout, nothing T x T, deterministic (fixed summation orders, no
 * atomics); simple rather than fast (CUDA cores only).
 *
 * One warp per output row, EX_WARPS consecutive rows of one head per block. The row's own vectors
 * (q and dout; or k and v) sit in the warp's slice of shared memory; the other side is walked in
 * chunks of 32 rows that the block loads together (coalesced, converted to fp32, rows padded to an
 * odd stride so that lane j reading row j is free of bank conflicts). Per chunk, lane j computes
 * row j's dot products over D, the warp reduces what the online softmax needs, and the 32 weights
 * are broadcast by shuffles while every lane accumulates its own columns d = lane + 32 i of the
 * output (D <= ATTN_DMAX, so at most ATTN_DMAX / 32 accumulators per lane). Each kernel is
 * compiled once per dtype.
 *
 * Dropout (dr.active, a uniform branch): lane j draws the keep bit of its own (query, key) element
 * (src/kernels/dropout.h); the forward accumulates keep . P and scales by 1 / (1 - p) with 1 / l,
 * the backward uses keep' = keep / (1 - p) on dP and on the P of dV.
 *
 * Sliding window (a.window > 0): the walks start at the block's first visible key (queries: end at
 * the last query that sees the block's keys), a warp skips chunks none of whose keys it sees, and
 * invisible keys score -inf (P = 0) as keys after the query do. */
#include "attention_common.cuh"

#define EX_WARPS 8
#define EX_CHUNK 32
#define EX_ACC (ATTN_DMAX / 32)

static __device__ __forceinline__ float ex_ld(const void *p, long long i, int bf) {
    return bf ? __bfloat162float(((const bf16 *)p)[i]) : ((const float *)p)[i];
}
static __device__ __forceinline__ void ex_st(void *p, long long i, float v, int bf) {
    if (bf)
        ((bf16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}
static __device__ __forceinline__ float ex_warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
static __device__ __forceinline__ float ex_warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
/* sum over d < D of u[d] * v[d], both in shared memory. */
static __device__ __forceinline__ float ex_dot(const float *u, const float *v, int D) {
    float acc = 0.0f;
    for (int d = 0; d < D; d++) acc = fmaf(u[d], v[d], acc);
    return acc;
}
/* The keys query t sees: ex_first_key(a, t) .. t (the sliding window's first, else 0); the queries
 * that see key j: j .. ex_query_end(a, j) - 1. */
static __device__ __forceinline__ int ex_first_key(const attn_args &a, int t) {
    return a.window ? max(0, t - a.window + 1) : 0;
}
static __device__ __forceinline__ int ex_query_end(const attn_args &a, int j) {
    return a.window ? min(a.T, j + a.window) : a.T;
}
static __device__ __forceinline__ bool ex_visible(const attn_args &a, int t, int j) {
    return j <= t && (!a.window || j > t - a.window);
}
/* Row stride of a chunk tile: odd, so that 32 lanes reading 32 rows at one column hit 32 banks. */
static __device__ __forceinline__ int ex_lds(int D) { return D | 1; }
/* Dynamic shared memory: two chunk tiles, two vectors of D per warp, and 2 * EX_CHUNK floats. */
static size_t ex_smem_bytes(int D) {
    return (size_t)(2 * EX_CHUNK * (D | 1) + 2 * EX_WARPS * D + 2 * EX_CHUNK) * sizeof(float);
}

/* Loads rows r0 .. r0 + 31 (those < rend) of two tensors (element offsets off_x + r * stride) into
 * the chunk tiles tx and ty as fp32. Rows >= rend are left as they are and never read. */
static __device__ __forceinline__ void ex_load_chunk(float *tx, float *ty, const void *x, const void *y,
                                                     long long off_x, long long off_y, long long stride_x,
                                                     long long stride_y, int r0, int rend, int D, int bf) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, lds = ex_lds(D);
    for (int rr = warp; rr < EX_CHUNK && r0 + rr < rend; rr += EX_WARPS)
        for (int d = lane; d < D; d += 32) {
            tx[rr * lds + d] = ex_ld(x, off_x + (long long)(r0 + rr) * stride_x + d, bf);
            ty[rr * lds + d] = ex_ld(y, off_y + (long long)(r0 + rr) * stride_y + d, bf);
        }
}

/* Forward. Block (b*Hq + h, y) holds query rows t = T - 1 - EX_WARPS*y - warp (the longest rows
 * are launched first); a warp whose t < 0 only takes part in the barriers. */
static __device__ __forceinline__ void ex_exact_fwd_body(const attn_args a, const attn_dropout &dr, const int bf) {
    extern __shared__ float ex_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, T = a.T, D = a.D, lds = ex_lds(D);
    float *tk = ex_sm, *tv = tk + EX_CHUNK * lds, *q = tv + EX_CHUNK * lds + warp * 2 * D;
    const int bh = blockIdx.x, b = bh / a.Hq, h = bh % a.Hq, kvh = h / a.group;
    const int tmax = T - 1 - EX_WARPS * (int)blockIdx.y, t = tmax - warp;
    const long long tok0 = (long long)b * T;
    if (t >= 0)
        for (int d = lane; d < D; d += 32) q[d] = ex_ld(a.qkv, (tok0 + t) * a.W + (long long)h * D + d, bf);

    float o[EX_ACC], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int i = 0; i < EX_ACC; i++) o[i] = 0.0f;
    for (int j0 = ex_first_key(a, tmax - (EX_WARPS - 1)); j0 <= tmax; j0 += EX_CHUNK) {
        __syncthreads(); /* the previous chunk is consumed (and q is written) */
        ex_load_chunk(tk, tv, a.qkv, a.qkv, tok0 * a.W + (long long)(a.Hq + kvh) * D,
                      tok0 * a.W + (long long)(a.Hq + a.Hkv + kvh) * D, a.W, a.W, j0, tmax + 1, D, bf);
        __syncthreads();
        /* warp-uniform: no key of the chunk is visible to row t */
        if (t < j0 || j0 + EX_CHUNK - 1 < ex_first_key(a, t)) continue;
        const int j = j0 + lane, n = min(EX_CHUNK, t + 1 - j0);
        const bool vis = ex_visible(a, t, j);
        const float sc = vis ? ex_dot(q, tk + lane * lds, D) * a.scale : -INFINITY;
        const float m_new = fmaxf(m, ex_warp_max(sc)); /* finite: some key of the chunk is visible */
        const float alpha = __expf(m - m_new), p = __expf(sc - m_new);
        l = l * alpha + ex_warp_sum(p);
        m = m_new;
        const float pd = dr.active && vis && !fsdp_dropout_keep_probs(&dr.drop, b, h, t, j, T) ? 0.0f : p;
#pragma unroll
        for (int i = 0; i < EX_ACC; i++) o[i] *= alpha;
        for (int jj = 0; jj < n; jj++) {
            const float pj = __shfl_sync(0xffffffffu, pd, jj);
#pragma unroll
            for (int i = 0; i < EX_ACC; i++)
                if (lane + 32 * i < D) o[i] = fmaf(pj, tv[jj * lds + lane + 32 * i], o[i]);
        }
    }
    if (t < 0) return;
    const float inv = (dr.active ? dr.drop.scale : 1.0f) / l;
    const long long orow = ((tok0 + t) * a.Hq + h) * D;
#pragma unroll
    for (int i = 0; i < EX_ACC; i++)
        if (lane + 32 * i < D) ex_st(a.o, orow + lane + 32 * i, o[i] * inv, bf);
    if (lane == 0) a.lse_out[(long long)bh * T + t] = m + __logf(l);
}

/* dq of query row t (rows laid out as in the forward): sum over keys j <= t of dS_j k_j, times
 * scale, with dS_j = P_j (dout . v_j - delta) and P_j = exp(scale q . k_j - lse). */
static __device__ __forceinline__ void ex_exact_dq_body(const attn_args a, const attn_dropout &dr, const int bf) {
    extern __shared__ float ex_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, T = a.T, D = a.D, lds = ex_lds(D);
    float *tk = ex_sm, *tv = tk + EX_CHUNK * lds, *q = tv + EX_CHUNK * lds + warp * 2 * D, *dout = q + D;
    const int bh = blockIdx.x, b = bh / a.Hq, h = bh % a.Hq, kvh = h / a.group;
    const int tmax = T - 1 - EX_WARPS * (int)blockIdx.y, t = tmax - warp;
    const long long tok0 = (long long)b * T;
    float lse = 0.0f, delta = 0.0f;
    if (t >= 0) {
        for (int d = lane; d < D; d += 32) {
            q[d] = ex_ld(a.qkv, (tok0 + t) * a.W + (long long)h * D + d, bf);
            dout[d] = ex_ld(a.dout, ((tok0 + t) * a.Hq + h) * D + d, bf);
        }
        lse = a.lse[(long long)bh * T + t];
        delta = a.delta[(long long)bh * T + t];
    }

    float dq[EX_ACC];
#pragma unroll
    for (int i = 0; i < EX_ACC; i++) dq[i] = 0.0f;
    for (int j0 = ex_first_key(a, tmax - (EX_WARPS - 1)); j0 <= tmax; j0 += EX_CHUNK) {
        __syncthreads();
        ex_load_chunk(tk, tv, a.qkv, a.qkv, tok0 * a.W + (long long)(a.Hq + kvh) * D,
                      tok0 * a.W + (long long)(a.Hq + a.Hkv + kvh) * D, a.W, a.W, j0, tmax + 1, D, bf);
        __syncthreads();
        if (t < j0 || j0 + EX_CHUNK - 1 < ex_first_key(a, t)) continue;
        const int j = j0 + lane, n = min(EX_CHUNK, t + 1 - j0);
        float ds = 0.0f;
        if (ex_visible(a, t, j)) {
            const float p = __expf(ex_dot(q, tk + lane * lds, D) * a.scale - lse);
            float dp = ex_dot(dout, tv + lane * lds, D);
            if (dr.active) dp = fsdp_dropout_keep_probs(&dr.drop, b, h, t, j, T) ? dp * dr.drop.scale : 0.0f;
            ds = p * (dp - delta);
        }
        for (int jj = 0; jj < n; jj++) {
            const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
            for (int i = 0; i < EX_ACC; i++)
                if (lane + 32 * i < D) dq[i] = fmaf(dsj, tk[jj * lds + lane + 32 * i], dq[i]);
        }
    }
    if (t < 0) return;
    const long long qrow = (tok0 + t) * a.W + (long long)h * D;
#pragma unroll
    for (int i = 0; i < EX_ACC; i++)
        if (lane + 32 * i < D) ex_st(a.dqkv, qrow + lane + 32 * i, dq[i] * a.scale, bf);
}

/* dk and dv of key j = EX_WARPS * y + warp of block (b*Hkv + g, y): sums over the group's heads
 * and the queries t >= j, walked in chunks from the block's first key (queries before a warp's
 * own key get P = 0). */
static __device__ __forceinline__ void ex_exact_dkv_body(const attn_args a, const attn_dropout &dr, const int bf) {
    extern __shared__ float ex_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, T = a.T, D = a.D, lds = ex_lds(D);
    float *tq = ex_sm, *tdo = tq + EX_CHUNK * lds, *k = tdo + EX_CHUNK * lds + warp * 2 * D, *v = k + D;
    float *slse = tdo + EX_CHUNK * lds + EX_WARPS * 2 * D, *sdl = slse + EX_CHUNK;
    const int b = blockIdx.x / a.Hkv, kvh = blockIdx.x % a.Hkv;
    const int jmin = EX_WARPS * (int)blockIdx.y, j = jmin + warp;
    const long long tok0 = (long long)b * T;
    const long long koff = (long long)(a.Hq + kvh) * D, voff = (long long)(a.Hq + a.Hkv + kvh) * D;
    if (j < T)
        for (int d = lane; d < D; d += 32) {
            k[d] = ex_ld(a.qkv, (tok0 + j) * a.W + koff + d, bf);
            v[d] = ex_ld(a.qkv, (tok0 + j) * a.W + voff + d, bf);
        }

    float dk[EX_ACC], dv[EX_ACC];
#pragma unroll
    for (int i = 0; i < EX_ACC; i++) dk[i] = dv[i] = 0.0f;
    for (int h = kvh * a.group; h < (kvh + 1) * a.group; h++) {
        const long long bh = (long long)b * a.Hq + h;
        for (int t0 = jmin; t0 < ex_query_end(a, jmin + EX_WARPS - 1); t0 += EX_CHUNK) {
            __syncthreads();
            ex_load_chunk(tq, tdo, a.qkv, a.dout, tok0 * a.W + (long long)h * D, (tok0 * a.Hq + h) * D, a.W,
                          (long long)a.Hq * D, t0, T, D, bf);
            if (threadIdx.x < EX_CHUNK && t0 + (int)threadIdx.x < T) {
                slse[threadIdx.x] = a.lse[bh * T + t0 + threadIdx.x];
                sdl[threadIdx.x] = a.delta[bh * T + t0 + threadIdx.x];
            }
            __syncthreads();
            /* warp-uniform: no query of the chunk sees j */
            if (j >= T || t0 + EX_CHUNK - 1 < j || t0 >= ex_query_end(a, j)) continue;
            const int t = t0 + lane, n = min(EX_CHUNK, T - t0);
            float p = 0.0f, ds = 0.0f;
            if (t < T && ex_visible(a, t, j)) {
                p = __expf(ex_dot(k, tq + lane * lds, D) * a.scale - slse[lane]);
                float dp = ex_dot(v, tdo + lane * lds, D);
                if (dr.active) { /* p becomes the P of dV: keep' P */
                    const float kp = fsdp_dropout_keep_probs(&dr.drop, b, h, t, j, T) ? dr.drop.scale : 0.0f;
                    ds = p * (dp * kp - sdl[lane]);
                    p *= kp;
                } else {
                    ds = p * (dp - sdl[lane]);
                }
            }
            for (int tt = 0; tt < n; tt++) {
                const float pt = __shfl_sync(0xffffffffu, p, tt), dst = __shfl_sync(0xffffffffu, ds, tt);
#pragma unroll
                for (int i = 0; i < EX_ACC; i++)
                    if (lane + 32 * i < D) {
                        dk[i] = fmaf(dst, tq[tt * lds + lane + 32 * i], dk[i]);
                        dv[i] = fmaf(pt, tdo[tt * lds + lane + 32 * i], dv[i]);
                    }
            }
        }
    }
    if (j >= T) return;
    const long long krow = (tok0 + j) * a.W + koff, vrow = (tok0 + j) * a.W + voff;
#pragma unroll
    for (int i = 0; i < EX_ACC; i++)
        if (lane + 32 * i < D) {
            ex_st(a.dqkv, krow + lane + 32 * i, dk[i] * a.scale, bf);
            ex_st(a.dqkv, vrow + lane + 32 * i, dv[i], bf);
        }
}

/* delta[b, h, t] = dout . out, one warp per row of out (rows in out's order (b, t, h)). */
static __device__ __forceinline__ void ex_delta_body(const attn_args a, const int bf) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, T = a.T, D = a.D;
    const long long r = (long long)blockIdx.x * EX_WARPS + warp;
    if (r >= (long long)a.B * T * a.Hq) return;
    const long long off = r * D;
    float acc = 0.0f;
    /* bf16 pairs when every row starts 4-byte aligned. */
    if (bf && D % 2 == 0 && (((uintptr_t)a.dout | (uintptr_t)a.out) & 3u) == 0) {
        const __nv_bfloat162 *x = (const __nv_bfloat162 *)((const bf16 *)a.dout + off);
        const __nv_bfloat162 *y = (const __nv_bfloat162 *)((const bf16 *)a.out + off);
        for (int i = lane; i < D / 2; i += 32) {
            const float2 u = __bfloat1622float2(x[i]), w = __bfloat1622float2(y[i]);
            acc = fmaf(u.x, w.x, fmaf(u.y, w.y, acc));
        }
    } else {
        for (int d = lane; d < D; d += 32) acc = fmaf(ex_ld(a.dout, off + d, bf), ex_ld(a.out, off + d, bf), acc);
    }
    acc = ex_warp_sum(acc);
    const long long bt = r / a.Hq; /* b * T + t */
    const int h = (int)(r % a.Hq), t = (int)(bt % T), b = (int)(bt / T);
    if (lane == 0) a.delta_out[((long long)b * a.Hq + h) * T + t] = acc;
}

/* The same for bf16 rows of D = 8, 16, ..., 256 elements (D / 8 divides 32) in 16-byte aligned
 * tensors, the flash path's case. One block per token (b, t), whose Hq rows of out and dout are
 * contiguous: a lane reads 16 bytes of each, and the D / 8 lanes of a row (a row never straddles
 * two warps) add their partial sums with a shuffle tree. Runs at about the HBM copy rate. */
#define DELTA_THREADS 128
__global__ void __launch_bounds__(DELTA_THREADS) attn_delta_bf16x8(const attn_args a) {
    const int cpr = a.D / 8, sh = __ffs(cpr) - 1, n = a.Hq * cpr; /* cpr is a power of two */
    const unsigned bt = blockIdx.x;                                /* b * T + t */
    const int b = (int)(bt / (unsigned)a.T), t = (int)(bt % (unsigned)a.T);
    const long long tok = (long long)bt * a.Hq * a.D;
    for (int base = 0; base < n; base += DELTA_THREADS) { /* block-uniform trip count */
        const int c = base + (int)threadIdx.x;
        float acc = 0.0f;
        if (c < n) {
            const uint4 x = *(const uint4 *)((const bf16 *)a.dout + tok + c * 8);
            const uint4 y = *(const uint4 *)((const bf16 *)a.out + tok + c * 8);
            const __nv_bfloat162 *xp = (const __nv_bfloat162 *)&x, *yp = (const __nv_bfloat162 *)&y;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 p = __bfloat1622float2(xp[i]), q = __bfloat1622float2(yp[i]);
                acc = fmaf(p.y, q.y, fmaf(p.x, q.x, acc));
            }
        }
        for (int o = cpr / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (c < n && (c & (cpr - 1)) == 0) a.delta_out[((long long)b * a.Hq + (c >> sh)) * a.T + t] = acc;
    }
}

/* Each body compiled once per dtype, so that the loads' dtype test folds away. */
#define EX_KERNELS(name, body)                                                                                \
    __global__ void __launch_bounds__(EX_WARPS * 32, 1) name##_f32(const attn_args a, const attn_dropout dr) { \
        body(a, dr, 0);                                                                                       \
    }                                                                                                         \
    __global__ void __launch_bounds__(EX_WARPS * 32, 1) name##_bf16(const attn_args a, const attn_dropout dr) { \
        body(a, dr, 1);                                                                                       \
    }
EX_KERNELS(attn_exact_fwd, ex_exact_fwd_body)
EX_KERNELS(attn_exact_dq, ex_exact_dq_body)
EX_KERNELS(attn_exact_dkv, ex_exact_dkv_body)
__global__ void __launch_bounds__(EX_WARPS * 32, 1) attn_delta_f32(const attn_args a) { ex_delta_body(a, 0); }
__global__ void __launch_bounds__(EX_WARPS * 32, 1) attn_delta_bf16(const attn_args a) { ex_delta_body(a, 1); }

static unsigned ex_blocks(long long rows) { return (unsigned)((rows + EX_WARPS - 1) / EX_WARPS); }

/* Launches one of a pair of per-dtype kernels over grid (x, y) with the chunk tiles' shared memory. */
typedef void (*ex_kernel)(const attn_args, const attn_dropout);
static void ex_launch(ex_kernel f32, ex_kernel bf16k, const char *name, const attn_args *a, const attn_dropout *dr,
                      fsdp_dtype act, unsigned x, unsigned y, cudaStream_t s) {
    const int smem = (int)ex_smem_bytes(a->D);
    ex_kernel fn = act == FSDP_BF16 ? bf16k : f32;
    attn_dropout none;
    memset(&none, 0, sizeof none);
    attn_set_smem((const void *)fn, smem, name);
    fn<<<dim3(x, y), EX_WARPS * 32, smem, s>>>(*a, dr ? *dr : none);
    attn_check_launch(name);
}

void attn_exact_forward(const attn_args *a, const attn_dropout *dr, fsdp_dtype act, cudaStream_t s) {
    const unsigned rows = (unsigned)((a->T + EX_WARPS - 1) / EX_WARPS);
    ex_launch(attn_exact_fwd_f32, attn_exact_fwd_bf16, "attn_exact_fwd", a, dr, act, (unsigned)(a->B * a->Hq), rows,
              s);
}

void attn_exact_backward(const attn_args *a, const attn_dropout *dr, fsdp_dtype act, cudaStream_t s) {
    const unsigned rows = (unsigned)((a->T + EX_WARPS - 1) / EX_WARPS);
    ex_launch(attn_exact_dq_f32, attn_exact_dq_bf16, "attn_exact_dq", a, dr, act, (unsigned)(a->B * a->Hq), rows, s);
    ex_launch(attn_exact_dkv_f32, attn_exact_dkv_bf16, "attn_exact_dkv", a, dr, act, (unsigned)(a->B * a->Hkv), rows,
              s);
}

void attn_delta(const attn_args *a, fsdp_dtype act, cudaStream_t s) {
    const int D = a->D;
    if (act == FSDP_BF16 && D % 8 == 0 && 32 % (D / 8) == 0 && ((uintptr_t)a->dout & 15u) == 0 &&
        ((uintptr_t)a->out & 15u) == 0) {
        attn_delta_bf16x8<<<(unsigned)((long long)a->B * a->T), DELTA_THREADS, 0, s>>>(*a);
        attn_check_launch("attn_delta_bf16x8");
        return;
    }
    const unsigned blocks = ex_blocks((long long)a->B * a->T * a->Hq);
    if (act == FSDP_BF16)
        attn_delta_bf16<<<blocks, EX_WARPS * 32, 0, s>>>(*a);
    else
        attn_delta_f32<<<blocks, EX_WARPS * 32, 0, s>>>(*a);
    attn_check_launch("attn_delta");
}
