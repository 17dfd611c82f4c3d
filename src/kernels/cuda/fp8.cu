/* FP8 casts (amax, scale, codes; with or without a transpose) and the scaling epilogue of rowwise
 * products: the GPU twins of src/kernels/cpu/fp8.c (rules in ../fp8.h, launchers in ../fp8_cuda.h).
 *
 * Bit-exactness with the CPU: the amax is a maximum of magnitude bits (exact, in any order, so
 * atomicMax on the bits is deterministic); the scale is fsdp_fp8_scale, the same inline function
 * (one double division, one rounding to float); each code is __fmul_rn(x, scale) then
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE (round to nearest even, saturating), which is what
 * fsdp_encode_code does. This file is never built with --use_fast_math.
 *
 * Passes over memory:
 *  - rowwise without transpose (x and W in the forward, dy for dx): one block per row reads the row
 *    to find its amax and again to cast it; the second read hits L1/L2 (a row is at most a few tens
 *    of KiB), so DRAM sees one read and one write of the row;
 *  - tensorwise, and every transposed cast: an amax pass (atomicMax per warp, or per column and row
 *    over a block of rows) and a cast pass; given amax_in (a producing kernel's report) the first is
 *    skipped;
 *  - the transposed casts (W^T, dy^T, x^T) go through 64 x 64 tiles in shared memory, so both the
 *    reads of the source rows and the writes of the code rows are contiguous per warp; the same tile
 *    can also be written untransposed (fsdp_cuda_fp8_cast_both: dy for both gradient products from
 *    one amax pass and one cast pass). */
#include <cuda_fp8.h>
#include <limits.h>

#include "../fp8.h"
#include "../fp8_cuda.h"
#include "cuda_common.cuh"

#define FP8_THREADS 256
#define TILE 64             /* transposed casts: TILE x TILE elements per block */
#define COL_AMAX_ROWS 64    /* rows per block of the column amax */

static __device__ __forceinline__ __nv_fp8_interpretation_t fp8_kind(int t) {
    return t == FSDP_E4M3 ? __NV_E4M3 : __NV_E5M2;
}

static __device__ __forceinline__ unsigned char encode(float x, float scale, int t) {
    return (unsigned char)__nv_cvt_float_to_fp8(__fmul_rn(x, scale), __NV_SATFINITE, fp8_kind(t));
}

/* The block's maximum of v (every thread gets it); sh holds FP8_THREADS / 32 words. */
static __device__ __forceinline__ unsigned block_max(unsigned v, unsigned *sh) {
    v = __reduce_max_sync(0xffffffffu, v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0u;
    return __reduce_max_sync(0xffffffffu, v);
}

/* ---- amax passes -------------------------------------------------------------------------------- */

/* amax[0] (as bits, zeroed before) = max |x| over n elements; vec: 8 at a time. */
#define AMAX_TENSOR_KERNEL(name, BF16, VEC)                                                                   \
    static __global__ void __launch_bounds__(FP8_THREADS) name(unsigned *amax, const void *x, size_t n) {    \
        unsigned m = 0;                                                                                       \
        const size_t stride = (size_t)gridDim.x * blockDim.x;                                                 \
        if (VEC) {                                                                                            \
            for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n / 8; j += stride) {          \
                float v[8];                                                                                   \
                ld8(x, j, BF16, v);                                                                           \
                _Pragma("unroll") for (int k = 0; k < 8; k++) m = max(m, amax_bits(v[k]));                    \
            }                                                                                                 \
        } else {                                                                                              \
            for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)                \
                m = max(m, amax_bits(ld1(x, i, BF16)));                                                        \
        }                                                                                                     \
        m = __reduce_max_sync(0xffffffffu, m);                                                                \
        if ((threadIdx.x & 31) == 0 && m > *(volatile unsigned *)amax) atomicMax(amax, m);                                                 \
    }
AMAX_TENSOR_KERNEL(amax_tensor_f32, 0, 0)
AMAX_TENSOR_KERNEL(amax_tensor_f32_vec, 0, 1)
AMAX_TENSOR_KERNEL(amax_tensor_bf16, 1, 0)
AMAX_TENSOR_KERNEL(amax_tensor_bf16_vec, 1, 1)

/* Per row and/or per column maxima of |x| (bits, zeroed before; either pointer may be NULL) over a
 * block of COL_AMAX_ROWS rows: a thread takes E consecutive columns (8: one 16- or 32-byte load a row
 * when vec), keeps their column maxima, and a row's maximum is a warp maximum gathered in shared
 * memory, so a block issues one global atomic per row and per column. */
#define AMAX_RC_KERNEL(name, BF16, VEC)                                                                       \
    static __global__ void __launch_bounds__(FP8_THREADS) name(unsigned *amax_rows, unsigned *amax_cols,      \
                                                               const void *x, int R, int Cc) {                \
        const int E = VEC ? 8 : 1;                                                                            \
        __shared__ unsigned rowmax[COL_AMAX_ROWS];                                                            \
        if (threadIdx.x < COL_AMAX_ROWS) rowmax[threadIdx.x] = 0u;                                            \
        __syncthreads();                                                                                      \
        const int c = (blockIdx.x * blockDim.x + threadIdx.x) * E;                                            \
        const int r0 = blockIdx.y * COL_AMAX_ROWS, r1 = min(R, r0 + COL_AMAX_ROWS);                          \
        unsigned m[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};                                                     \
        for (int r = r0; r < r1; r++) {                                                                       \
            unsigned rm = 0u;                                                                                 \
            if (c < Cc) {                                                                                     \
                float v[8];                                                                                   \
                const size_t at = (size_t)r * Cc + c;                                                         \
                ldE(x, VEC ? at / 8 : at, BF16, E, v);                                                        \
                _Pragma("unroll") for (int k = 0; k < E; k++) {                                               \
                    const unsigned b = amax_bits(v[k]);                                                        \
                    m[k] = max(m[k], b);                                                                      \
                    rm = max(rm, b);                                                                          \
                }                                                                                             \
            }                                                                                                 \
            if (amax_rows) {                                                                                  \
                rm = __reduce_max_sync(0xffffffffu, rm);                                                      \
                if ((threadIdx.x & 31) == 0 && rm) atomicMax(rowmax + (r - r0), rm);                          \
            }                                                                                                 \
        }                                                                                                     \
        if (amax_cols && c < Cc)                                                                              \
            _Pragma("unroll") for (int k = 0; k < E; k++) if (m[k]) atomicMax(amax_cols + c + k, m[k]);       \
        if (amax_rows) {                                                                                      \
            __syncthreads();                                                                                  \
            if (threadIdx.x < r1 - r0 && rowmax[threadIdx.x]) atomicMax(amax_rows + r0 + threadIdx.x, rowmax[threadIdx.x]); \
        }                                                                                                     \
    }
AMAX_RC_KERNEL(amax_rc_f32, 0, 0)
AMAX_RC_KERNEL(amax_rc_f32_vec, 0, 1)
AMAX_RC_KERNEL(amax_rc_bf16, 1, 0)
AMAX_RC_KERNEL(amax_rc_bf16_vec, 1, 1)

/* Launches the row/column amax over x[R, Cc]. */
static void amax_rows_cols(unsigned *rows, unsigned *cols, const void *x, int bf16, int R, int Cc, cudaStream_t s) {
    const int vec = Cc % 8 == 0 && fsdp_cuda_aligned16(x);
    void (*k)(unsigned *, unsigned *, const void *, int, int) =
        bf16 ? (vec ? amax_rc_bf16_vec : amax_rc_bf16) : (vec ? amax_rc_f32_vec : amax_rc_f32);
    const int per_block = FP8_THREADS * (vec ? 8 : 1);
    dim3 grid((unsigned)fsdp_cuda_ceil_div(Cc, per_block), (unsigned)fsdp_cuda_ceil_div(R, COL_AMAX_ROWS));
    if (grid.y > 65535u) fsdp_fatal("internal error: an FP8 amax over %d rows (at most %d)", R, 65535 * COL_AMAX_ROWS);
    k<<<grid, FP8_THREADS, 0, s>>>(rows, cols, x, R, Cc);
    fsdp_cuda_check_launch("fp8 amax_rows_cols");
}

/* Launches the tensorwise amax over n elements of x into amax (bits, zeroed before). */
static void amax_tensor(unsigned *amax, const void *x, int bf16, size_t n, cudaStream_t s) {
    const int vec = n % 8 == 0 && fsdp_cuda_aligned16(x);
    void (*k)(unsigned *, const void *, size_t) =
        bf16 ? (vec ? amax_tensor_bf16_vec : amax_tensor_bf16) : (vec ? amax_tensor_f32_vec : amax_tensor_f32);
    unsigned grid = fsdp_cuda_grid(vec ? n / 8 : n, FP8_THREADS);
    if (grid > 4096) grid = 4096; /* a few waves; the grid-stride loop does the rest */
    k<<<grid, FP8_THREADS, 0, s>>>(amax, x, n);
    fsdp_cuda_check_launch("fp8 amax_tensor");
}

/* ---- casts ----------------------------------------------------------------------------------------- */

typedef struct {
    unsigned char *codes;
    float *scale, *inv, *amax_out;
    const void *src;
    const float *amax; /* amax_in, or where the amax pass left it */
    int R, Cc, t, pow2;
    /* the transposed cast's second output (fsdp_cuda_fp8_cast_both): codes [R, Cc] with their scales
     * (per row of src, or one), from amax_rm; NULL: none */
    unsigned char *codes_rm;
    float *scale_rm, *inv_rm;
    const float *amax_rm;
} cast_args;

static __device__ __forceinline__ float scale_of(float amax, int t, int pow2) {
    return fsdp_fp8_scale(amax, t == FSDP_E4M3 ? 448.0f : 57344.0f, pow2);
}

/* Rowwise without transpose: block = row r. The amax (unless given), the scale, then the codes. */
#define CAST_ROWS_KERNEL(name, BF16, VEC)                                                                     \
    static __global__ void __launch_bounds__(FP8_THREADS) name(cast_args a) {                                \
        __shared__ unsigned sh[FP8_THREADS / 32];                                                             \
        const size_t r = blockIdx.x, row = r * (size_t)a.Cc;                                                  \
        float amax;                                                                                           \
        if (a.amax) {                                                                                         \
            amax = a.amax[r];                                                                                 \
        } else {                                                                                              \
            unsigned m = 0;                                                                                   \
            if (VEC) {                                                                                        \
                for (int j = threadIdx.x; j < a.Cc / 8; j += blockDim.x) {                                    \
                    float v[8];                                                                               \
                    ld8(a.src, row / 8 + j, BF16, v);                                                         \
                    _Pragma("unroll") for (int k = 0; k < 8; k++) m = max(m, amax_bits(v[k]));                \
                }                                                                                             \
            } else {                                                                                          \
                for (int c = threadIdx.x; c < a.Cc; c += blockDim.x) m = max(m, amax_bits(ld1(a.src, row + c, BF16))); \
            }                                                                                                 \
            m = block_max(m, sh);                                                                             \
            amax = __uint_as_float(m > 0x7f800000u ? 0x7fc00000u : m);                                       \
            if (threadIdx.x == 0 && a.amax_out) a.amax_out[r] = amax;                                         \
        }                                                                                                     \
        const float s = scale_of(amax, a.t, a.pow2);                                                          \
        if (threadIdx.x == 0) a.scale[r] = s, a.inv[r] = __fdiv_rn(1.0f, s);                                 \
        if (VEC) {                                                                                            \
            for (int j = threadIdx.x; j < a.Cc / 8; j += blockDim.x) {                                        \
                float v[8];                                                                                   \
                ld8(a.src, row / 8 + j, BF16, v);                                                             \
                unsigned lo = 0, hi = 0;                                                                      \
                _Pragma("unroll") for (int k = 0; k < 4; k++) lo |= (unsigned)encode(v[k], s, a.t) << (8 * k); \
                _Pragma("unroll") for (int k = 0; k < 4; k++) hi |= (unsigned)encode(v[4 + k], s, a.t) << (8 * k); \
                ((uint2 *)(a.codes + row))[j] = make_uint2(lo, hi);                                           \
            }                                                                                                 \
        } else {                                                                                              \
            for (int c = threadIdx.x; c < a.Cc; c += blockDim.x) a.codes[row + c] = encode(ld1(a.src, row + c, BF16), s, a.t); \
        }                                                                                                     \
    }
CAST_ROWS_KERNEL(cast_rows_f32, 0, 0)
CAST_ROWS_KERNEL(cast_rows_f32_vec, 0, 1)
CAST_ROWS_KERNEL(cast_rows_bf16, 1, 0)
CAST_ROWS_KERNEL(cast_rows_bf16_vec, 1, 1)

/* Tensorwise without transpose: grid-stride over the elements, 8 at a time when vec. */
#define CAST_FLAT_KERNEL(name, BF16, VEC)                                                                     \
    static __global__ void __launch_bounds__(FP8_THREADS) name(cast_args a) {                                \
        const float s = scale_of(a.amax[0], a.t, a.pow2);                                                     \
        const size_t n = (size_t)a.R * a.Cc, stride = (size_t)gridDim.x * blockDim.x;                         \
        const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;                                   \
        if (first == 0) a.scale[0] = s, a.inv[0] = __fdiv_rn(1.0f, s);                                       \
        if (VEC) {                                                                                            \
            for (size_t j = first; j < n / 8; j += stride) {                                                  \
                float v[8];                                                                                   \
                ld8(a.src, j, BF16, v);                                                                       \
                unsigned lo = 0, hi = 0;                                                                      \
                _Pragma("unroll") for (int k = 0; k < 4; k++) lo |= (unsigned)encode(v[k], s, a.t) << (8 * k); \
                _Pragma("unroll") for (int k = 0; k < 4; k++) hi |= (unsigned)encode(v[4 + k], s, a.t) << (8 * k); \
                ((uint2 *)a.codes)[j] = make_uint2(lo, hi);                                                   \
            }                                                                                                 \
        } else {                                                                                              \
            for (size_t i = first; i < n; i += stride) a.codes[i] = encode(ld1(a.src, i, BF16), s, a.t); \
        }                                                                                                     \
    }
CAST_FLAT_KERNEL(cast_flat_f32, 0, 0)
CAST_FLAT_KERNEL(cast_flat_f32_vec, 0, 1)
CAST_FLAT_KERNEL(cast_flat_bf16, 1, 0)
CAST_FLAT_KERNEL(cast_flat_bf16_vec, 1, 1)

/* Transposed: block = TILE rows x TILE columns of src; codes row c (a column of src) gets the tile's
 * TILE codes of rows r0 .. r0 + TILE - 1, 16 per thread (one 16-byte store when vec: R a multiple
 * of 16 and the tile whole). Scales per column of src (rowwise) or one. */
#define CAST_T_KERNEL(name, BF16)                                                                             \
    static __global__ void __launch_bounds__(FP8_THREADS) name(cast_args a, int rowwise, int vec, int vec_rm,     \
                                                               int vec_ld) {                                  \
        __shared__ float tile[TILE][TILE + 1];                                                                \
        const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;                                             \
        if (vec_ld && c0 + TILE <= a.Cc) { /* 8 elements (16 or 32 bytes) a thread, 8 threads a row */       \
            const int cc = (threadIdx.x % 8) * 8;                                                             \
            for (int tr = threadIdx.x / 8; tr < TILE; tr += FP8_THREADS / 8) {                                \
                const int r = r0 + tr;                                                                        \
                float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};                                \
                if (r < a.R) ld8(a.src, ((size_t)r * a.Cc + c0 + cc) / 8, BF16, v);                           \
                _Pragma("unroll") for (int k = 0; k < 8; k++) tile[tr][cc + k] = v[k];                        \
            }                                                                                                 \
        } else {                                                                                              \
            const int tc = threadIdx.x % TILE;                                                                \
            for (int tr = threadIdx.x / TILE; tr < TILE; tr += FP8_THREADS / TILE) {                          \
                const int r = r0 + tr, c = c0 + tc;                                                           \
                tile[tr][tc] = r < a.R && c < a.Cc ? ld1(a.src, (size_t)r * a.Cc + c, BF16) : 0.0f;          \
            }                                                                                                 \
        }                                                                                                     \
        __syncthreads();                                                                                      \
        if (a.codes_rm) { /* row r0 + orow of src, 16 columns a thread, row scales */                         \
            const int orow = threadIdx.x / 4, part = threadIdx.x % 4, r = r0 + orow, cb = c0 + 16 * part;     \
            if (r < a.R) {                                                                                    \
                const float s = scale_of(a.amax_rm[rowwise ? r : 0], a.t, a.pow2);                            \
                if (blockIdx.x == 0 && part == 0 && (rowwise || r == 0))                                      \
                    a.scale_rm[rowwise ? r : 0] = s, a.inv_rm[rowwise ? r : 0] = __fdiv_rn(1.0f, s);          \
                unsigned char *out = a.codes_rm + (size_t)r * a.Cc;                                           \
                if (vec_rm && cb + 16 <= a.Cc) {                                                              \
                    unsigned w[4] = {0u, 0u, 0u, 0u};                                                         \
                    _Pragma("unroll") for (int k = 0; k < 16; k++)                                            \
                        w[k / 4] |= (unsigned)encode(tile[orow][16 * part + k], s, a.t) << (8 * (k % 4));     \
                    *(uint4 *)(out + cb) = make_uint4(w[0], w[1], w[2], w[3]);                                \
                } else {                                                                                      \
                    for (int k = 0; k < 16 && cb + k < a.Cc; k++) out[cb + k] = encode(tile[orow][16 * part + k], s, a.t); \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        const int orow = threadIdx.x / 4, part = threadIdx.x % 4, c = c0 + orow;                              \
        if (c >= a.Cc) return;                                                                                \
        const float s = scale_of(a.amax[rowwise ? c : 0], a.t, a.pow2);                                       \
        if (blockIdx.y == 0 && part == 0 && (rowwise || c == 0)) a.scale[rowwise ? c : 0] = s,                \
                                                                  a.inv[rowwise ? c : 0] = __fdiv_rn(1.0f, s); \
        unsigned char *out = a.codes + (size_t)c * a.R;                                                       \
        const int rb = r0 + 16 * part;                                                                        \
        if (vec && rb + 16 <= a.R) {                                                                          \
            unsigned w[4] = {0u, 0u, 0u, 0u};                                                                 \
            _Pragma("unroll") for (int k = 0; k < 16; k++)                                                    \
                w[k / 4] |= (unsigned)encode(tile[16 * part + k][orow], s, a.t) << (8 * (k % 4));             \
            *(uint4 *)(out + rb) = make_uint4(w[0], w[1], w[2], w[3]);                                        \
        } else {                                                                                              \
            for (int k = 0; k < 16 && rb + k < a.R; k++) out[rb + k] = encode(tile[16 * part + k][orow], s, a.t); \
        }                                                                                                     \
    }
CAST_T_KERNEL(cast_t_f32, 0)
CAST_T_KERNEL(cast_t_bf16, 1)

static void check_dtypes(fsdp_dtype src_t, fsdp_dtype t) {
    if ((src_t != FSDP_BF16 && src_t != FSDP_F32) || (t != FSDP_E4M3 && t != FSDP_E5M2))
        fsdp_fatal("internal error: an FP8 cast from %s to %s (fp32 or bf16 into e4m3 or e5m2 only)",
                   fsdp_dtype_name(src_t), fsdp_dtype_name(t));
}

void fsdp_cuda_fp8_cast(uint8_t *codes, float *scale, float *inv_scale, float *amax_out, const void *src,
                        fsdp_dtype src_t, int R, int Cc, int transpose, int rowwise, fsdp_dtype t, int pow2,
                        const float *amax_in, cudaStream_t s) {
    check_dtypes(src_t, t);
    if (R <= 0 || Cc <= 0) return;
    if (!amax_in && !amax_out) fsdp_fatal("internal error: an FP8 cast with neither an amax given nor room for one");
    const int bf16 = src_t == FSDP_BF16;
    const size_t n = (size_t)R * Cc;
    cast_args a = {codes, scale, inv_scale, amax_out, src, amax_in ? amax_in : amax_out, R, Cc, (int)t, pow2};
    if (rowwise && !transpose) {
        if (amax_in) a.amax_out = NULL;
        else a.amax = NULL; /* the kernel computes it */
        const int vec = Cc % 8 == 0 && fsdp_cuda_aligned16(src) && ((uintptr_t)codes & 7u) == 0;
        void (*k)(cast_args) = bf16 ? (vec ? cast_rows_bf16_vec : cast_rows_bf16) : (vec ? cast_rows_f32_vec : cast_rows_f32);
        k<<<R, FP8_THREADS, 0, s>>>(a);
        fsdp_cuda_check_launch("fp8 cast_rows");
        return;
    }
    const int nscales = rowwise ? Cc : 1;
    if (!amax_in) {
        cudaError_t e = cudaMemsetAsync(amax_out, 0, (size_t)nscales * sizeof(float), s);
        if (e != cudaSuccess) fsdp_fatal("kernel fp8 amax failed to launch: cudaMemsetAsync: %s", cudaGetErrorString(e));
        if (rowwise) {
            amax_rows_cols(NULL, (unsigned *)amax_out, src, bf16, R, Cc, s);
        } else {
            amax_tensor((unsigned *)amax_out, src, bf16, n, s);
        }
    }
    if (!transpose) {
        const int vec = n % 8 == 0 && fsdp_cuda_aligned16(src) && ((uintptr_t)codes & 7u) == 0;
        void (*k)(cast_args) = bf16 ? (vec ? cast_flat_bf16_vec : cast_flat_bf16) : (vec ? cast_flat_f32_vec : cast_flat_f32);
        unsigned grid = fsdp_cuda_grid(vec ? n / 8 : n, FP8_THREADS);
        if (grid > 8192) grid = 8192;
        k<<<grid, FP8_THREADS, 0, s>>>(a);
        fsdp_cuda_check_launch("fp8 cast_flat");
        return;
    }
    const int vec = R % 16 == 0 && ((uintptr_t)codes & 15u) == 0;
    dim3 grid((unsigned)fsdp_cuda_ceil_div(Cc, TILE), (unsigned)fsdp_cuda_ceil_div(R, TILE));
    if (grid.y > 65535u) fsdp_fatal("internal error: an FP8 transposed cast of %d rows (at most %d)", R, 65535 * TILE);
    const int vec_ld = Cc % 8 == 0 && fsdp_cuda_aligned16(src);
    (bf16 ? cast_t_bf16 : cast_t_f32)<<<grid, FP8_THREADS, 0, s>>>(a, rowwise, vec, 0, vec_ld);
    fsdp_cuda_check_launch("fp8 cast_transpose");
}

void fsdp_cuda_fp8_cast_both(uint8_t *codes, float *scale, float *inv_scale, float *amax, uint8_t *codes_t,
                             float *scale_t, float *inv_scale_t, float *amax_t, const void *src, fsdp_dtype src_t,
                             int R, int Cc, int rowwise, fsdp_dtype t, int pow2, const float *amax_in,
                             cudaStream_t s) {
    check_dtypes(src_t, t);
    if (R <= 0 || Cc <= 0) return;
    if (amax_in && rowwise) fsdp_fatal("internal error: an FP8 rowwise cast_both given its amax");
    const int bf16 = src_t == FSDP_BF16;
    const size_t n = (size_t)R * Cc;
    cudaError_t e;
    if (amax_in) {
        e = cudaMemcpyAsync(amax, amax_in, sizeof(float), cudaMemcpyDeviceToDevice, s);
        if (e == cudaSuccess) e = cudaMemcpyAsync(amax_t, amax_in, sizeof(float), cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) fsdp_fatal("fp8 cast_both: cudaMemcpyAsync of the given amax: %s", cudaGetErrorString(e));
    }
    e = amax_in ? cudaSuccess : cudaMemsetAsync(amax, 0, (size_t)(rowwise ? R : 1) * sizeof(float), s);
    if (e == cudaSuccess && rowwise) e = cudaMemsetAsync(amax_t, 0, (size_t)Cc * sizeof(float), s);
    if (e != cudaSuccess) fsdp_fatal("kernel fp8 amax failed to launch: cudaMemsetAsync: %s", cudaGetErrorString(e));
    if (amax_in) {
        /* given */
    } else if (rowwise) {
        amax_rows_cols((unsigned *)amax, (unsigned *)amax_t, src, bf16, R, Cc, s);
    } else {
        amax_tensor((unsigned *)amax, src, bf16, n, s);
        e = cudaMemcpyAsync(amax_t, amax, sizeof(float), cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) fsdp_fatal("fp8 cast_both: cudaMemcpyAsync of the amax: %s", cudaGetErrorString(e));
    }
    cast_args a = {codes_t, scale_t, inv_scale_t, NULL, src, amax_t, R, Cc, (int)t, pow2,
                   codes, scale, inv_scale, amax};
    const int vec = R % 16 == 0 && ((uintptr_t)codes_t & 15u) == 0;
    const int vec_rm = Cc % 16 == 0 && ((uintptr_t)codes & 15u) == 0;
    dim3 grid((unsigned)fsdp_cuda_ceil_div(Cc, TILE), (unsigned)fsdp_cuda_ceil_div(R, TILE));
    if (grid.y > 65535u) fsdp_fatal("internal error: an FP8 transposed cast of %d rows (at most %d)", R, 65535 * TILE);
    const int vec_ld = Cc % 8 == 0 && fsdp_cuda_aligned16(src);
    (bf16 ? cast_t_bf16 : cast_t_f32)<<<grid, FP8_THREADS, 0, s>>>(a, rowwise, vec, vec_rm, vec_ld);
    fsdp_cuda_check_launch("fp8 cast_both");
}

/* ---- the scaling epilogue ------------------------------------------------------------------------- */

#define EPILOGUE_KERNEL(name, BF16)                                                                           \
    static __global__ void __launch_bounds__(FP8_THREADS) name(void *out, const float *acc, const float *inv_a, \
                                                               int a_rw, const float *inv_b, int b_rw, int R, \
                                                               int Cn, const void *bias, const void *addend,  \
                                                               int relu) {                                    \
        const size_t n = (size_t)R * Cn, stride = (size_t)gridDim.x * blockDim.x;                             \
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {                  \
            const int r = (int)(i / Cn), c = (int)(i % Cn);                                                   \
            const float factor = __fmul_rn(inv_a[a_rw ? r : 0], inv_b[b_rw ? c : 0]);                         \
            float y = __fmul_rn(factor, acc[i]);                                                              \
            if (bias) y = __fadd_rn(y, ld1(bias, c, BF16));                                                   \
            if (addend) y = __fadd_rn(y, ld1(addend, i, BF16));                                               \
            st1(out, i, BF16, (relu && y < 0.0f) ? 0.0f : y);                                                 \
        }                                                                                                     \
    }
EPILOGUE_KERNEL(epilogue_f32, 0)
EPILOGUE_KERNEL(epilogue_bf16, 1)

void fsdp_cuda_fp8_scale_epilogue(void *out, fsdp_dtype out_t, const float *acc, const float *inv_a, int a_rowwise,
                                  const float *inv_b, int b_rowwise, int R, int Cn, const void *bias,
                                  const void *addend, int relu, cudaStream_t s) {
    if (out_t != FSDP_BF16 && out_t != FSDP_F32)
        fsdp_fatal("internal error: the FP8 epilogue into %s (fp32 or bf16 only)", fsdp_dtype_name(out_t));
    const size_t n = (size_t)R * Cn;
    if (n == 0) return;
    unsigned grid = fsdp_cuda_grid(n, FP8_THREADS);
    if (grid > 8192) grid = 8192;
    (out_t == FSDP_BF16 ? epilogue_bf16 : epilogue_f32)<<<grid, FP8_THREADS, 0, s>>>(
        out, acc, inv_a, a_rowwise, inv_b, b_rowwise, R, Cn, bias, addend, relu);
    fsdp_cuda_check_launch("fp8 scale_epilogue");
}

/* ---- product weights cast once per gather (../fp8.h) ----------------------------------------------- */

void fsdp_cuda_fp8_amax(float *amax, const void *src, fsdp_dtype src_t, size_t n, cudaStream_t s) {
    check_dtypes(src_t, FSDP_E4M3);
    cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), s);
    if (e != cudaSuccess) fsdp_fatal("kernel fp8 amax failed to launch: cudaMemsetAsync: %s", cudaGetErrorString(e));
    if (n > 0) amax_tensor((unsigned *)amax, src, src_t == FSDP_BF16, n, s);
}

/* One thread: the parts' largest amax (as bits, so a NaN wins), then the scale and its inverse. */
static __global__ void scales_of_parts(float *scales, const float *parts, int n, int stride, float fp8_max) {
    unsigned m = 0u;
    for (int p = 0; p < n; p++) m = max(m, amax_bits(parts[(size_t)p * stride]));
    const float amax = __uint_as_float(m > 0x7f800000u ? 0x7fc00000u : m);
    const float scale = fsdp_fp8_scale(amax, fp8_max, 0);
    scales[0] = __fdiv_rn(1.0f, scale), scales[1] = scale, scales[2] = amax;
}

void fsdp_cuda_fp8_scales_of_parts(float *scales, const float *amax_parts, int parts, int stride, fsdp_dtype t,
                                   cudaStream_t s) {
    check_dtypes(FSDP_F32, t);
    scales_of_parts<<<1, 1, 0, s>>>(scales, amax_parts, parts, stride, t == FSDP_E4M3 ? 448.0f : 57344.0f);
    fsdp_cuda_check_launch("fp8 scales_of_parts");
}

void fsdp_cuda_fp8_encode(uint8_t *codes, float *scales, const void *src, fsdp_dtype src_t, size_t n, fsdp_dtype t,
                          cudaStream_t s) {
    if (n > (size_t)INT_MAX) fsdp_fatal("internal error: an FP8 encode of %zu elements (at most %d)", n, INT_MAX);
    fsdp_cuda_fp8_cast(codes, scales + 1, scales, NULL, src, src_t, 1, (int)n, 0, 0, t, 0, scales + 2, s);
}

/* The scalar form, for any layout: 32 x 32 tiles of the weight, 8 rows of threads; each element read once
 * from its piece, written as W, as its value in the unit, and through shared memory as W^T. */
#define UNPACK_TILE 32
#define UNPACK_ROWS 8
template <int BF16>
static __global__ void __launch_bounds__(UNPACK_TILE *UNPACK_ROWS)
    unpack_weight(uint8_t *codes, uint8_t *codes_t, void *unit, const uint8_t *pieces, size_t piece_bytes, size_t count,
                  fsdp_fp8_matrix m, int t, const float *scales) {
    __shared__ uint8_t tile[UNPACK_TILE][UNPACK_TILE + 4];
    const float inv = scales[0];
    const int c = blockIdx.x * UNPACK_TILE + threadIdx.x;
    for (int k = threadIdx.y; k < UNPACK_TILE; k += UNPACK_ROWS) {
        const int r = blockIdx.y * UNPACK_TILE + k;
        if (r < m.rows && c < m.cols) {
            const size_t i = (size_t)r * m.cols + c, g = (size_t)m.offset + i;
            const uint8_t code = pieces[(g / count) * piece_bytes + g % count];
            codes[i] = code;
            tile[k][threadIdx.x] = code;
            const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, fp8_kind(t))));
            st1(unit, g, BF16, __fmul_rn(v, inv));
        }
    }
    __syncthreads();
    const int r = blockIdx.y * UNPACK_TILE + threadIdx.x; /* the column of W^T this thread writes */
    for (int k = threadIdx.y; k < UNPACK_TILE; k += UNPACK_ROWS) {
        const int cc = blockIdx.x * UNPACK_TILE + k;
        if (r < m.rows && cc < m.cols) codes_t[(size_t)cc * m.rows + r] = tile[threadIdx.x][k];
    }
}

/* The vector form, where every run of 4 elements lies in one piece and every address is aligned to its
 * 4 elements (the FP8 products' shapes, multiples of 16, and the engine's pieces, multiples of 64): 64 x 64
 * tiles, 16 x 16 threads, 4 codes a thread (one 32-bit load, one store of W, one of W^T, and the 4 values
 * in one 8- or 16-byte store); 32-bit element indices (a unit under 2^32 elements). */
#define UNPACK_VTILE 64
template <int BF16>
static __global__ void __launch_bounds__(256)
    unpack_weight_vec(uint8_t *codes, uint8_t *codes_t, void *unit, const uint8_t *pieces, unsigned piece_bytes,
                      unsigned count, fsdp_fp8_matrix m, int t, const float *scales) {
    __shared__ uint32_t tile[UNPACK_VTILE][UNPACK_VTILE / 4 + 1]; /* 4 codes a word, a padding word a row */
    const float inv = scales[0];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int c = blockIdx.x * UNPACK_VTILE + tx * 4;
    const unsigned off = (unsigned)m.offset, cols = (unsigned)m.cols;
    for (int k = ty; k < UNPACK_VTILE; k += 16) {
        const int r = blockIdx.y * UNPACK_VTILE + k;
        if (r >= m.rows || c >= m.cols) continue;
        const unsigned i = (unsigned)r * cols + (unsigned)c, g = off + i, p = g / count;
        const uint32_t w = *(const uint32_t *)(pieces + (size_t)p * piece_bytes + (g - p * count));
        *(uint32_t *)(codes + i) = w;
        tile[k][tx] = w;
        const __nv_fp8_interpretation_t kind = fp8_kind(t);
        const float2 a = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), kind)));
        const float2 b = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), kind)));
        const float v0 = __fmul_rn(a.x, inv), v1 = __fmul_rn(a.y, inv), v2 = __fmul_rn(b.x, inv),
                    v3 = __fmul_rn(b.y, inv);
        if (BF16) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(v0, v1), hi = __floats2bfloat162_rn(v2, v3);
            uint2 out;
            out.x = *(const unsigned *)&lo, out.y = *(const unsigned *)&hi;
            *(uint2 *)((__nv_bfloat16 *)unit + g) = out;
        } else {
            *(float4 *)((float *)unit + g) = make_float4(v0, v1, v2, v3);
        }
    }
    __syncthreads();
    /* W^T's row cc (W's column) from the tile's column: 4 rows of W a thread, one 32-bit store. */
    const int r4 = blockIdx.y * UNPACK_VTILE + tx * 4;
    for (int k = ty; k < UNPACK_VTILE; k += 16) {
        const int cc = blockIdx.x * UNPACK_VTILE + k;
        if (r4 >= m.rows || cc >= m.cols) continue;
        const int word = k >> 2, shift = (k & 3) * 8;
        uint32_t w = 0;
#pragma unroll
        for (int q = 0; q < 4; q++) w |= ((tile[tx * 4 + q][word] >> shift) & 0xffu) << (8 * q);
        *(uint32_t *)(codes_t + (size_t)cc * m.rows + r4) = w;
    }
}

void fsdp_cuda_fp8_unpack(uint8_t *codes, uint8_t *codes_t, void *unit, fsdp_dtype unit_t, const void *pieces,
                          size_t piece_bytes, size_t count, const fsdp_fp8_matrix *m, fsdp_dtype t, const float *scales,
                          cudaStream_t s) {
    if ((unit_t != FSDP_BF16 && unit_t != FSDP_F32) || (t != FSDP_E4M3 && t != FSDP_E5M2))
        fsdp_fatal("internal error: an FP8 unpack of %s codes into %s", fsdp_dtype_name(t), fsdp_dtype_name(unit_t));
    if (m->rows <= 0 || m->cols <= 0) return;
    const int bf16 = unit_t == FSDP_BF16;
    const size_t end = (size_t)m->offset + (size_t)m->rows * (size_t)m->cols;
    const int vec = m->rows % 4 == 0 && m->cols % 4 == 0 && m->offset % 4 == 0 && count % 4 == 0 &&
                    piece_bytes % 4 == 0 && end <= UINT_MAX && count <= UINT_MAX &&
                    piece_bytes <= UINT_MAX && ((uintptr_t)codes & 3u) == 0 && ((uintptr_t)codes_t & 3u) == 0 &&
                    ((uintptr_t)pieces & 3u) == 0 && fsdp_cuda_aligned16(unit);
    if (vec) {
        dim3 grid((unsigned)fsdp_cuda_ceil_div(m->cols, UNPACK_VTILE),
                  (unsigned)fsdp_cuda_ceil_div(m->rows, UNPACK_VTILE));
        if (grid.y > 65535u)
            fsdp_fatal("internal error: an FP8 unpack of %d rows (at most %d)", m->rows, 65535 * UNPACK_VTILE);
        if (bf16)
            unpack_weight_vec<1><<<grid, 256, 0, s>>>(codes, codes_t, unit, (const uint8_t *)pieces,
                                                      (unsigned)piece_bytes, (unsigned)count, *m, (int)t, scales);
        else
            unpack_weight_vec<0><<<grid, 256, 0, s>>>(codes, codes_t, unit, (const uint8_t *)pieces,
                                                      (unsigned)piece_bytes, (unsigned)count, *m, (int)t, scales);
        fsdp_cuda_check_launch("fp8 unpack_vec");
        return;
    }
    dim3 grid((unsigned)fsdp_cuda_ceil_div(m->cols, UNPACK_TILE), (unsigned)fsdp_cuda_ceil_div(m->rows, UNPACK_TILE));
    if (grid.y > 65535u)
        fsdp_fatal("internal error: an FP8 unpack of %d rows (at most %d)", m->rows, 65535 * UNPACK_TILE);
    dim3 block(UNPACK_TILE, UNPACK_ROWS);
    if (bf16)
        unpack_weight<1><<<grid, block, 0, s>>>(codes, codes_t, unit, (const uint8_t *)pieces, piece_bytes, count, *m,
                                                (int)t, scales);
    else
        unpack_weight<0><<<grid, block, 0, s>>>(codes, codes_t, unit, (const uint8_t *)pieces, piece_bytes, count, *m,
                                                (int)t, scales);
    fsdp_cuda_check_launch("fp8 unpack");
}
