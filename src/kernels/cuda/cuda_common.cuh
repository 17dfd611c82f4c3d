/* Private helpers of the CUDA kernels (the .cu files of src/kernels/cuda): storage-dtype loads and stores,
 * the launch check, warp and block reductions, and the host-side choice of vector or scalar path.
 *
 * Storage is FSDP_BF16 (__nv_bfloat16) or FSDP_F32 (float); arithmetic is always fp32. Helpers
 * take the dtype as an `int bf16` that each kernel passes as a literal 0 or 1 to a
 * __forceinline__ body: the compiler folds the branches away, so every dtype variant is a
 * specialised kernel without C++ templates.
 *
 * Vector unit: a chunk of 8 consecutive elements, one 16-byte access in bf16 and two in fp32.
 * Chunk j of a tensor covers elements [8j, 8j + 8); a tensor may take the vector path only when its
 * base pointer is 16-byte aligned (fsdp_cuda_aligned16) and the extent being chunked is a multiple
 * of 8. Scalar fallbacks handle every other size. */
#ifndef FSDP_KERNELS_CUDA_COMMON_CUH
#define FSDP_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "../../base/dtype.h"
#include "../../base/error.h"
#include "../ops_cuda.h"

/* ---- host side ---------------------------------------------------------------------------------- */

/* Every launch is followed by this: a bad configuration must stop the run where it happened, not
 * surface as a wrong number (or a sticky error) many kernels later. */
static inline void fsdp_cuda_check_launch(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fsdp_fatal("kernel %s failed to launch: %s", kernel, cudaGetErrorString(e));
}

static inline int fsdp_cuda_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Zeroes the amax a kernel is about to report into (warp_amax_report), when there is one. */
static inline void fsdp_cuda_amax_reset(float *amax, cudaStream_t s, const char *kernel) {
    if (!amax) return;
    cudaError_t e = cudaMemsetAsync(amax, 0, sizeof *amax, s);
    if (e != cudaSuccess) fsdp_fatal("kernel %s: cudaMemsetAsync of its amax failed: %s", kernel, cudaGetErrorString(e));
}

/* Blocks for a grid-stride loop over `work` items at `threads` per block. The cap only bounds the
 * grid; grid-stride loops make any cap correct. */
static inline unsigned fsdp_cuda_grid(size_t work, int threads) {
    size_t g = (work + (size_t)threads - 1) / (size_t)threads;
    if (g < 1) g = 1;
    if (g > ((size_t)1 << 20)) g = (size_t)1 << 20;
    return (unsigned)g;
}

static inline int fsdp_cuda_ceil_div(int a, int b) { return (a + b - 1) / b; }

/* Two-pass column sums (norm weight/bias gradients, bias gradients): pass one runs G =
 * fsdp_cuda_row_blocks(N) row blocks (cuda_scratch.h), block b summing its own fixed range of rows
 * into partial row b of an fp32 scratch [G, C]; pass two adds the G partials of each column in a
 * fixed order into the gradient. G depends on N alone (never on the device), so results are
 * bitwise reproducible everywhere. */

/* dst0[c] += sum_b part[b * C + c] and, when dst1 is not NULL, dst1[c] += sum_b part[(G + b) * C + c],
 * for c < C, in dtype `grad`, summing b in a fixed order (reduce.cu). */
void fsdp_cuda_colsum_finalize(void *dst0, void *dst1, const float *part, int G, int C, fsdp_dtype grad,
                               cudaStream_t s);

/* ---- device side: loads and stores -------------------------------------------------------------- */

/* A chunk of 8 elements as it sits in memory: bf16 fills lo only, fp32 fills lo and hi. Keeping
 * rows in this form instead of as floats halves the registers a cached bf16 row needs. */
typedef struct {
    uint4 lo, hi;
} fsdp_raw8;

static __device__ __forceinline__ fsdp_raw8 ld_raw8(const void *p, size_t chunk, int bf16) {
    fsdp_raw8 r;
    if (bf16) {
        r.lo = ((const uint4 *)p)[chunk];
        r.hi = make_uint4(0u, 0u, 0u, 0u);
    } else {
        const uint4 *q = (const uint4 *)p + 2 * chunk;
        r.lo = q[0];
        r.hi = q[1];
    }
    return r;
}

static __device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

static __device__ __forceinline__ void unpack8(fsdp_raw8 r, int bf16, float *v) {
    if (bf16) {
        v[0] = bf16_lo(r.lo.x), v[1] = bf16_hi(r.lo.x), v[2] = bf16_lo(r.lo.y), v[3] = bf16_hi(r.lo.y);
        v[4] = bf16_lo(r.lo.z), v[5] = bf16_hi(r.lo.z), v[6] = bf16_lo(r.lo.w), v[7] = bf16_hi(r.lo.w);
    } else {
        v[0] = __uint_as_float(r.lo.x), v[1] = __uint_as_float(r.lo.y);
        v[2] = __uint_as_float(r.lo.z), v[3] = __uint_as_float(r.lo.w);
        v[4] = __uint_as_float(r.hi.x), v[5] = __uint_as_float(r.hi.y);
        v[6] = __uint_as_float(r.hi.z), v[7] = __uint_as_float(r.hi.w);
    }
}

/* Round-to-nearest-even, low element in the low half (memory order). */
static __device__ __forceinline__ unsigned pack_bf16x2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const unsigned *)&h;
}

/* The storage form of 8 floats (rounded to bf16 in bf16 mode), and its 16- or 32-byte store. */
static __device__ __forceinline__ fsdp_raw8 pack8(const float *v, int bf16) {
    fsdp_raw8 r;
    if (bf16) {
        r.lo = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                          pack_bf16x2(v[6], v[7]));
        r.hi = make_uint4(0u, 0u, 0u, 0u);
    } else {
        r.lo = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
        r.hi = make_uint4(__float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]), __float_as_uint(v[7]));
    }
    return r;
}
static __device__ __forceinline__ void st_raw8(void *p, size_t chunk, int bf16, fsdp_raw8 r) {
    if (bf16) {
        ((uint4 *)p)[chunk] = r.lo;
    } else {
        uint4 *q = (uint4 *)p + 2 * chunk;
        q[0] = r.lo;
        q[1] = r.hi;
    }
}

static __device__ __forceinline__ void ld8(const void *p, size_t chunk, int bf16, float *v) {
    unpack8(ld_raw8(p, chunk, bf16), bf16, v);
}

static __device__ __forceinline__ void st8(void *p, size_t chunk, int bf16, const float *v) {
    if (bf16) {
        uint4 u;
        u.x = pack_bf16x2(v[0], v[1]), u.y = pack_bf16x2(v[2], v[3]);
        u.z = pack_bf16x2(v[4], v[5]), u.w = pack_bf16x2(v[6], v[7]);
        ((uint4 *)p)[chunk] = u;
    } else {
        float4 *q = (float4 *)p + 2 * chunk;
        q[0] = make_float4(v[0], v[1], v[2], v[3]);
        q[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

static __device__ __forceinline__ float ld1(const void *p, size_t i, int bf16) {
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}

static __device__ __forceinline__ void st1(void *p, size_t i, int bf16, float x) {
    if (bf16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else
        ((float *)p)[i] = x;
}

/* Loads/stores `E` elements (E = 8: chunk `j` of 8; E = 1: element `j`), so one kernel body serves
 * the vector path and the scalar fallback. */
static __device__ __forceinline__ void ldE(const void *p, size_t j, int bf16, int E, float *v) {
    if (E == 8)
        ld8(p, j, bf16, v);
    else
        v[0] = ld1(p, j, bf16);
}

static __device__ __forceinline__ void stE(void *p, size_t j, int bf16, int E, const float *v) {
    if (E == 8)
        st8(p, j, bf16, v);
    else
        st1(p, j, bf16, v[0]);
}

/* The fp32 value nearest to x that bf16 can represent (round-to-nearest-even). */
static __device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/* 2^x on the special-function unit (ex2.approx: relative error about 2^-22), independent of
 * whether the file is built with --use_fast_math. */
static __device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ---- device side: dropout masks (src/kernels/dropout.h) ------------------------------------------ */

/* Keep bits (bit e = element e) of the 8 consecutive elements of a sample's tensor that start at
 * element 4 * group (two Philox groups). */
static __device__ __forceinline__ unsigned drop_bits8(const fsdp_dropout &d, int64_t sample, uint64_t group) {
    const fsdp_philox4 a = fsdp_dropout_draw(&d, sample, group), b = fsdp_dropout_draw(&d, sample, group + 1);
    unsigned bits = 0;
#pragma unroll
    for (int i = 0; i < 4; i++)
        bits |= (unsigned)(a.w[i] >= d.threshold) << i | (unsigned)(b.w[i] >= d.threshold) << (i + 4);
    return bits;
}

/* ---- device side: reductions -------------------------------------------------------------------- */

/* |x| as ordered bits: the FP8 amax of src/kernels/fp8.h is the maximum of these (exact in any order;
 * a NaN's bits exceed every number's, so a NaN makes the amax NaN). */
static __device__ __forceinline__ unsigned amax_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

/* max over e < E of |v[e]| as stored (rounded to bf16 when bf16), as amax bits. */
static __device__ __forceinline__ unsigned stored_amax(const float *v, int E, int bf16) {
    unsigned m = 0u;
#pragma unroll
    for (int e = 0; e < E; e++) m = max(m, amax_bits(bf16 ? round_bf16(v[e]) : v[e]));
    return m;
}

/* *amax (bits, zeroed before the kernel) = max(*amax, the warp's largest v): the report of a tensor's
 * amax by the kernel that writes it (tensorwise FP8), so that no pass over memory measures it again.
 * One atomic per warp at most, and none once the running maximum is as large, which after the
 * first warps is nearly every warp. Lanes that have left the kernel are not waited for. */
static __device__ __forceinline__ void warp_amax_report(unsigned *amax, unsigned v) {
    const unsigned mask = __activemask();
    v = __reduce_max_sync(mask, v);
    const unsigned lane = (threadIdx.x + threadIdx.y * blockDim.x) & 31u;
    if (lane == (unsigned)(__ffs(mask) - 1) && v > *(volatile unsigned *)amax) atomicMax(amax, v);
}

/* Butterfly sums: every lane ends with the same value, added in the same order on every run. */
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Row groups: a block is blockDim.y groups of blockDim.x threads (a multiple of 32, at most 1024),
 * one row per group. group_sum returns the group's total to all its threads. `sh` is shared memory
 * of 32 * blockDim.y floats. It contains __syncthreads when a group spans several warps, so every
 * thread of the block must call it (no early return before it). */
static __device__ __forceinline__ float group_sum(float v, float *sh) {
    v = warp_sum(v);
    if (blockDim.x == 32) return v;
    float *s = sh + 32 * threadIdx.y;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* the previous call's readers are done with sh */
    if (lane == 0) s[w] = v;
    __syncthreads();
    return warp_sum(lane < nw ? s[lane] : 0.0f);
}

/* Two sums at once (one pair of barriers instead of two); `sh` holds 64 * blockDim.y floats. */
static __device__ __forceinline__ float2 group_sum2(float a, float b, float *sh) {
    a = warp_sum(a);
    b = warp_sum(b);
    if (blockDim.x == 32) return make_float2(a, b);
    float *s = sh + 64 * threadIdx.y;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) s[w] = a, s[32 + w] = b;
    __syncthreads();
    return make_float2(warp_sum(lane < nw ? s[lane] : 0.0f), warp_sum(lane < nw ? s[32 + lane] : 0.0f));
}

#endif
