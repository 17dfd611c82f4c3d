/* Pointwise ops: rotary embedding (forward and its transpose), SwiGLU forward/backward and the
 * ReLU backward (CUDA twins of src/kernels/cpu/rope.c and activations.c).
 *
 * All are memory-bound streams: each thread handles one chunk of 8 consecutive elements (16-byte
 * accesses) when sizes and alignment allow, else single elements through the same kernel body;
 * grid-stride loops make any size correct. Index arithmetic is 32-bit (the launchers assert the
 * item count is below 2^31), because 64-bit division would cost as much as the memory traffic here. */
#include "cuda_common.cuh"

#define PW_THREADS 256

static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + fast_exp2(-x * 1.4426950408889634f)); }

/* ---- ReLU backward: d = out > 0 ? d : 0 --------------------------------------------------------------- */

/* A select, not a multiply by the mask: an inf or NaN gradient behind a dead unit must not leak. */
static __device__ __forceinline__ void relu_bwd(void *d, const void *out, size_t n, int bf16, int vec) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (vec) {
        size_t nch = n / 8;
        for (size_t j = tid; j < nch; j += stride) {
            float g[8], o[8];
            ld8(d, j, bf16, g);
            ld8(out, j, bf16, o);
#pragma unroll
            for (int e = 0; e < 8; e++) g[e] = o[e] > 0.0f ? g[e] : 0.0f;
            st8(d, j, bf16, g);
        }
        done = nch * 8;
    }
    for (size_t i = done + tid; i < n; i += stride)
        if (!(ld1(out, i, bf16) > 0.0f)) st1(d, i, bf16, 0.0f);
}
static __global__ void relu_bwd_kernel(void *d, const void *out, size_t n, int bf16, int vec) {
    if (bf16) {
        if (vec)
            relu_bwd(d, out, n, 1, 1);
        else
            relu_bwd(d, out, n, 1, 0);
    } else {
        if (vec)
            relu_bwd(d, out, n, 0, 1);
        else
            relu_bwd(d, out, n, 0, 0);
    }
}

extern "C" void fsdp_cuda_relu_backward(void *d, const void *out, size_t n, fsdp_dtype act, cudaStream_t s) {
    if (n == 0) return;
    int vec = fsdp_cuda_aligned16(d) && fsdp_cuda_aligned16(out);
    relu_bwd_kernel<<<fsdp_cuda_grid(vec ? n / 8 + 1 : n, PW_THREADS), PW_THREADS, 0, s>>>(d, out, n, act == FSDP_BF16,
                                                                                           vec);
    fsdp_cuda_check_launch("relu_backward");
}

/* ---- rotary embedding ------------------------------------------------------------------------------ */

/* Item = (token row, q-or-k head, group of E pairs): E elements of the first half of the head and
 * the E elements D/2 further, with their E (cos, sin) pairs. sign = -1 applies the transpose.
 * H2 = Hq + Hkv heads are rotated (q and k are contiguous at the start of a row of W elements). */
static __device__ __forceinline__ void rope(void *qkv, const float *cos_sin, int T, int H2, int D, int W,
                                            unsigned items, float sign, int bf16, int E, unsigned *amax) {
    int half = D / 2;
    unsigned groups = (unsigned)(half / E), am = 0u;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items; idx += gridDim.x * blockDim.x) {
        unsigned q = idx % groups, rest = idx / groups;
        unsigned h = rest % (unsigned)H2, bt = rest / (unsigned)H2, t = bt % (unsigned)T;
        size_t off = (size_t)bt * W + (size_t)h * D + (size_t)q * E;
        const float *cs = cos_sin + ((size_t)t * half + (size_t)q * E) * 2;
        float x1[8], x2[8], c[8], sn[8];
        ldE(qkv, off / E, bf16, E, x1);
        ldE(qkv, (off + half) / E, bf16, E, x2);
        if (E == 8) {
#pragma unroll
            for (int p = 0; p < 4; p++) {
                float4 a = ((const float4 *)cs)[p];
                c[2 * p] = a.x, sn[2 * p] = a.y, c[2 * p + 1] = a.z, sn[2 * p + 1] = a.w;
            }
        } else {
            c[0] = cs[0], sn[0] = cs[1];
        }
#pragma unroll
        for (int e = 0; e < E; e++) {
            float si = sign * sn[e], a = x1[e], b = x2[e];
            x1[e] = a * c[e] - b * si;
            x2[e] = b * c[e] + a * si;
        }
        stE(qkv, off / E, bf16, E, x1);
        stE(qkv, (off + half) / E, bf16, E, x2);
        if (amax) am = max(am, max(stored_amax(x1, E, bf16), stored_amax(x2, E, bf16)));
    }
    if (amax) { /* the value part of each row, after the H2 rotated heads: read for its amax only */
        const unsigned vgroups = (unsigned)((W - H2 * D) / E), vitems = items / (unsigned)(H2 * groups) * vgroups;
        for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < vitems; idx += gridDim.x * blockDim.x) {
            const unsigned q = idx % vgroups, bt = idx / vgroups;
            float v[8];
            ldE(qkv, ((size_t)bt * W + (size_t)H2 * D) / E + q, bf16, E, v);
            am = max(am, stored_amax(v, E, 0));
        }
        warp_amax_report(amax, am);
    }
}
static __global__ void rope_kernel(void *qkv, const float *cos_sin, int T, int H2, int D, int W, unsigned items,
                                   float sign, int bf16, int vec, unsigned *amax) {
    if (bf16) {
        if (vec)
            rope(qkv, cos_sin, T, H2, D, W, items, sign, 1, 8, amax);
        else
            rope(qkv, cos_sin, T, H2, D, W, items, sign, 1, 1, amax);
    } else {
        if (vec)
            rope(qkv, cos_sin, T, H2, D, W, items, sign, 0, 8, amax);
        else
            rope(qkv, cos_sin, T, H2, D, W, items, sign, 0, 1, amax);
    }
}

/* out_amax (NULL: none): max |qkv| as stored over the whole rows, rotated parts after the rotation. */
static void rope_launch(void *qkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D, float sign,
                        fsdp_dtype act, cudaStream_t s, const char *name, float *out_amax) {
    fsdp_cuda_amax_reset(out_amax, s, name);
    if (B <= 0 || T <= 0 || D < 2 || Hq + Hkv <= 0) return;
    int half = D / 2, H2 = Hq + Hkv, W = (Hq + 2 * Hkv) * D;
    int vec = half % 8 == 0 && fsdp_cuda_aligned16(qkv) && fsdp_cuda_aligned16(cos_sin);
    size_t items = (size_t)B * T * H2 * (vec ? half / 8 : half);
    FSDP_ASSERT(items < ((size_t)1 << 31));
    rope_kernel<<<fsdp_cuda_grid(items, PW_THREADS), PW_THREADS, 0, s>>>(qkv, cos_sin, T, H2, D, W, (unsigned)items,
                                                                         sign, act == FSDP_BF16, vec,
                                                                         (unsigned *)out_amax);
    fsdp_cuda_check_launch(name);
}

extern "C" void fsdp_cuda_rope_forward(void *qkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D,
                                       fsdp_dtype act, cudaStream_t s) {
    rope_launch(qkv, cos_sin, B, T, Hq, Hkv, D, 1.0f, act, s, "rope_forward", NULL);
}

extern "C" void fsdp_cuda_rope_backward(void *dqkv, const float *cos_sin, int B, int T, int Hq, int Hkv, int D,
                                        fsdp_dtype act, cudaStream_t s, float *out_amax) {
    rope_launch(dqkv, cos_sin, B, T, Hq, Hkv, D, -1.0f, act, s, "rope_backward", out_amax);
}

/* ---- SwiGLU: gateup rows are [gate (F) | up (F)] ----------------------------------------------------- */

/* Item = (row n, group q of E columns); indices below are in units of E elements. */

/* amax (NULL: none) gets max |out| (warp_amax_report). */
static __device__ __forceinline__ void swiglu_fwd(void *out, const void *gateup, int F, unsigned items, int bf16,
                                                  int E, unsigned *amax) {
    unsigned groups = (unsigned)(F / E), am = 0u;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items; idx += gridDim.x * blockDim.x) {
        unsigned q = idx % groups, n = idx / groups;
        size_t gi = (size_t)n * 2 * groups + q;
        float g[8], u[8];
        ldE(gateup, gi, bf16, E, g);
        ldE(gateup, gi + groups, bf16, E, u);
#pragma unroll
        for (int e = 0; e < E; e++) g[e] = g[e] * sigmoid(g[e]) * u[e];
        stE(out, (size_t)n * groups + q, bf16, E, g);
        if (amax) am = max(am, stored_amax(g, E, bf16));
    }
    if (amax) warp_amax_report(amax, am);
}
static __global__ void swiglu_fwd_kernel(void *out, const void *gateup, int F, unsigned items, int bf16, int vec,
                                         unsigned *amax) {
    if (bf16) {
        if (vec)
            swiglu_fwd(out, gateup, F, items, 1, 8, amax);
        else
            swiglu_fwd(out, gateup, F, items, 1, 1, amax);
    } else {
        if (vec)
            swiglu_fwd(out, gateup, F, items, 0, 8, amax);
        else
            swiglu_fwd(out, gateup, F, items, 0, 1, amax);
    }
}

/* Blocks of a pointwise kernel that reports an amax: a few waves of the grid-stride loop, so that a
 * tensor of hundreds of millions of elements is reported by thousands of warps, not millions. */
static unsigned reporting_grid(size_t items, const float *amax) {
    unsigned g = fsdp_cuda_grid(items, PW_THREADS);
    return amax && g > 8192u ? 8192u : g;
}

extern "C" void fsdp_cuda_swiglu_forward(void *out, const void *gateup, int N, int F, fsdp_dtype act, cudaStream_t s,
                                         float *out_amax) {
    if (N <= 0 || F <= 0) return;
    int vec = F % 8 == 0 && fsdp_cuda_aligned16(out) && fsdp_cuda_aligned16(gateup);
    size_t items = (size_t)N * (vec ? F / 8 : F);
    FSDP_ASSERT(items < ((size_t)1 << 31));
    fsdp_cuda_amax_reset(out_amax, s, "swiglu_forward");
    swiglu_fwd_kernel<<<reporting_grid(items, out_amax), PW_THREADS, 0, s>>>(out, gateup, F, (unsigned)items,
                                                                             act == FSDP_BF16, vec, (unsigned *)out_amax);
    fsdp_cuda_check_launch("swiglu_forward");
}

/* d silu(g)/dg = s + g s (1 - s) with s = sigmoid(g). dgateup is overwritten. */
static __device__ __forceinline__ void swiglu_bwd(void *dgateup, const void *dout, const void *gateup, int F,
                                                  unsigned items, int bf16, int E, unsigned *amax) {
    unsigned groups = (unsigned)(F / E), am = 0u;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items; idx += gridDim.x * blockDim.x) {
        unsigned q = idx % groups, n = idx / groups;
        size_t gi = (size_t)n * 2 * groups + q;
        float g[8], u[8], d[8];
        ldE(gateup, gi, bf16, E, g);
        ldE(gateup, gi + groups, bf16, E, u);
        ldE(dout, (size_t)n * groups + q, bf16, E, d);
#pragma unroll
        for (int e = 0; e < E; e++) {
            float sg = sigmoid(g[e]), dg = d[e] * u[e] * (sg + g[e] * sg * (1.0f - sg));
            u[e] = d[e] * g[e] * sg;
            g[e] = dg;
        }
        stE(dgateup, gi, bf16, E, g);
        stE(dgateup, gi + groups, bf16, E, u);
        if (amax) am = max(am, max(stored_amax(g, E, bf16), stored_amax(u, E, bf16)));
    }
    if (amax) warp_amax_report(amax, am);
}
static __global__ void swiglu_bwd_kernel(void *dgateup, const void *dout, const void *gateup, int F, unsigned items,
                                         int bf16, int vec, unsigned *amax) {
    if (bf16) {
        if (vec)
            swiglu_bwd(dgateup, dout, gateup, F, items, 1, 8, amax);
        else
            swiglu_bwd(dgateup, dout, gateup, F, items, 1, 1, amax);
    } else {
        if (vec)
            swiglu_bwd(dgateup, dout, gateup, F, items, 0, 8, amax);
        else
            swiglu_bwd(dgateup, dout, gateup, F, items, 0, 1, amax);
    }
}

extern "C" void fsdp_cuda_swiglu_backward(void *dgateup, const void *dout, const void *gateup, int N, int F,
                                          fsdp_dtype act, cudaStream_t s, float *dgateup_amax) {
    if (N <= 0 || F <= 0) return;
    int vec = F % 8 == 0 && fsdp_cuda_aligned16(dgateup) && fsdp_cuda_aligned16(dout) && fsdp_cuda_aligned16(gateup);
    size_t items = (size_t)N * (vec ? F / 8 : F);
    FSDP_ASSERT(items < ((size_t)1 << 31));
    fsdp_cuda_amax_reset(dgateup_amax, s, "swiglu_backward");
    swiglu_bwd_kernel<<<reporting_grid(items, dgateup_amax), PW_THREADS, 0, s>>>(
        dgateup, dout, gateup, F, (unsigned)items, act == FSDP_BF16, vec, (unsigned *)dgateup_amax);
    fsdp_cuda_check_launch("swiglu_backward");
}
