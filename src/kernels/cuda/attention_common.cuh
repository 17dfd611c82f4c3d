/* Private to the attention kernels (src/kernels/cuda/attention*.cu): the argument block every
 * attention kernel takes, the PTX wrappers of the tensor-core path (cp.async, ldmatrix,
 * mma.sync m16n8k16 bf16), the fragment address rules, and the host-side entry points by which
 * attention.cu dispatches to the tensor-core and exact paths.
 *
 * Fragment conventions (PTX ISA, mma.m16n8k16 with .bf16 inputs and .f32 accumulators). In a warp,
 * lane = 4 * g + c (g = lane / 4 the "group", c = lane % 4):
 *   A (16 x 16, row-major), 4 registers of 2 bf16: a[0] = A[g][2c, 2c+1], a[1] = A[g+8][2c, 2c+1],
 *       a[2] = A[g][2c+8, 2c+9], a[3] = A[g+8][2c+8, 2c+9]; the lower column in the low half.
 *   B (16 x 8, k x n, "col"), 2 registers: b[0] = B[2c, 2c+1][g], b[1] = B[2c+8, 2c+9][g].
 *   C/D (16 x 8 fp32), 4 registers: c[0], c[1] = C[g][2c, 2c+1], c[2], c[3] = C[g+8][2c, 2c+1].
 * Hence a C tile pair (n-tiles 2k, 2k+1) of a product P = X Y, packed to bf16, is exactly the A
 * fragment of P's k-th 16-column slice: the softmax probabilities go from one mma to the next
 * without leaving registers (attn_pack_a).
 *
 * Shared-memory tiles are row-major with a row stride of D + 8 bf16 (16 bytes of padding), which
 * puts the eight 16-byte rows read by one ldmatrix 8x8 matrix in eight different bank groups, so
 * every ldmatrix here is conflict-free without a swizzle. */
#ifndef FSDP_KERNELS_CUDA_ATTENTION_COMMON_CUH
#define FSDP_KERNELS_CUDA_ATTENTION_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../../base/dtype.h"
#include "../../base/error.h"
#include "../ops_cuda.h"

typedef __nv_bfloat16 bf16;

#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.69314718055994531f
/* Largest head dimension of the exact path (lane-strided accumulators of ATTN_DMAX / 32). */
#define ATTN_DMAX 256

/* Everything an attention kernel needs, passed by value. Pointers not used by a kernel are NULL.
 * Offsets (in elements): q of (b, t, h) at (b*T + t)*W + h*D, k of kv head g at (b*T + t)*W +
 * (Hq + g)*D, v at (b*T + t)*W + (Hq + Hkv + g)*D; out/dout of (b, t, h) at ((b*T + t)*Hq + h)*D;
 * lse/delta of (b, h, t) at (b*Hq + h)*T + t. */
typedef struct {
    const void *qkv;
    const void *out;   /* forward output, read by the delta kernel */
    const void *dout;
    const float *lse;  /* read by the backward */
    const float *delta;
    void *o;           /* forward output */
    float *lse_out;    /* forward lse */
    void *dqkv;
    float *delta_out;
    float *dq_accum;   /* the atomic-dQ backward: fp32 [B, T, Hq, D], zeroed before it */
    int B, T, Hq, Hkv, D, group;
    long long W; /* elements per token of qkv: (Hq + 2*Hkv) * D */
    float scale; /* 1 / sqrt(D) */
    float sl2;   /* scale * log2(e): scores go to the exp2 domain with one FFMA */
    int window;  /* sliding window: query t sees keys t - window < j <= t; 0: every j <= t */
} attn_args;

/* Dropout on the probabilities (src/kernels/dropout.h): P V uses keep . P / (1 - p). A separate
 * kernel parameter of the kernels that can drop, so that attn_args, and with it the code of the
 * plain tensor-core kernels, is what it is without dropout. */
typedef struct {
    fsdp_dropout drop;
    int tb;     /* ceil(T / 16): the mask numbers its 16 x 16 tiles per side */
    int active; /* 0: no dropout (the exact kernels test it at run time) */
} attn_dropout;

/* The two kernels of one tile shape of a flash body (flash_fwd_body, flash_bwd_dq_body,
 * flash_bwd_dkdv_body): `name` without dropout (the body sees DROP = 0 and an inactive dropout
 * block, so none of its dropout code is compiled in) and `drop_name` with it. The trailing
 * arguments are the body's tile shape. */
#define ATTN_FLASH_KERNELS(body, warps, name, drop_name, ...)                                                 \
    __global__ void __launch_bounds__((warps) * 32) name(const attn_args a) {                                \
        const attn_dropout none{};                                                                           \
        body(a, none, 0, __VA_ARGS__);                                                                       \
    }                                                                                                        \
    __global__ void __launch_bounds__((warps) * 32) drop_name(const attn_args a, const attn_dropout dr) {   \
        body(a, dr, 1, __VA_ARGS__);                                                                         \
    }

/* ---- host-side entry points between the attention files ---- */

/* The tensor-core path (attention_flash_fwd.cu, attention_flash_bwd.cu): bf16, D in {64, 128},
 * 16-byte aligned tensors. Each returns 0 when it launched, -1 when the case is not its own (the
 * caller then runs the exact path). The backward expects a->delta to be ready. dr->active launches
 * separately compiled variants that drop (the plain kernels are unchanged). */
int attn_tc_forward(const attn_args *a, const attn_dropout *dr, cudaStream_t s);
int attn_tc_backward(const attn_args *a, const attn_dropout *dr, cudaStream_t s);
/* The exact path (attention_exact.cu): any act dtype, 1 <= D <= ATTN_DMAX. */
void attn_exact_forward(const attn_args *a, const attn_dropout *dr, fsdp_dtype act, cudaStream_t s);
void attn_exact_backward(const attn_args *a, const attn_dropout *dr, fsdp_dtype act, cudaStream_t s);
/* delta[b, h, t] = dout . out over D (attention_exact.cu), needed by both backward paths. */
void attn_delta(const attn_args *a, fsdp_dtype act, cudaStream_t s);

/* Fatal with the kernel's name when a launch (or anything before it on the stream) failed. */
static inline void attn_check_launch(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fsdp_fatal("CUDA kernel %s failed to launch: %s", kernel, cudaGetErrorString(e));
}

/* Kernels with more than 48 KB of dynamic shared memory must raise their limit first; the call is
 * cheap, so it is made before every launch rather than cached per device. */
static inline void attn_set_smem(const void *fn, int bytes, const char *kernel) {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess)
        fsdp_fatal("cudaFuncSetAttribute(%s, %d bytes of shared memory) failed: %s", kernel, bytes,
                   cudaGetErrorString(e));
}

/* One launch of a flash body's kernel pair (ATTN_FLASH_KERNELS): the dropping variant when dr is
 * active, else the plain one, its shared memory raised first and the launch checked by name. */
typedef void (*attn_plain_kernel)(const attn_args);
typedef void (*attn_drop_kernel)(const attn_args, const attn_dropout);
static inline void attn_launch(attn_plain_kernel plain, const char *plain_name, attn_drop_kernel drop,
                               const char *drop_name, dim3 grid, int threads, int smem, const attn_args *a,
                               const attn_dropout *dr, cudaStream_t s) {
    if (dr && dr->active) {
        attn_set_smem((const void *)drop, smem, drop_name);
        drop<<<grid, threads, smem, s>>>(*a, *dr);
        attn_check_launch(drop_name);
    } else {
        attn_set_smem((const void *)plain, smem, plain_name);
        plain<<<grid, threads, smem, s>>>(*a);
        attn_check_launch(plain_name);
    }
}

/* ---- device helpers ---- */

static __device__ __forceinline__ uint32_t attn_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte global -> shared copy that bypasses L1; with valid == 0 it reads nothing and writes
 * zeros (src must still be a mapped address). */
static __device__ __forceinline__ void attn_cp_async16(uint32_t dst, const void *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
/* Same for one fp32 (lse and delta rows are not 16-byte aligned in general). */
static __device__ __forceinline__ void attn_cp_async4(uint32_t dst, const void *src, int valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
static __device__ __forceinline__ void attn_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until none of this thread's committed groups is still in flight. */
static __device__ __forceinline__ void attn_cp_async_wait0(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* Four 8x8 b16 matrices; lane i supplies the address of row (i % 8) of matrix i / 8. Without
 * .trans lane t receives row t/4, columns 2(t%4), 2(t%4)+1 of each matrix; with .trans it receives
 * rows 2(t%4), 2(t%4)+1 of column t/4. */
static __device__ __forceinline__ void attn_ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void attn_ldsm_x4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += A * B for one m16n8k16 tile (layouts in the header comment). */
static __device__ __forceinline__ void attn_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Zeroes the C fragments acc[0 .. n): accumulators before their first mma. */
static __device__ __forceinline__ void attn_zero_c(float (*acc)[4], const int n) {
#pragma unroll
    for (int i = 0; i < n; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

/* Two floats to a bf16 pair, round to nearest even, lo in the low half. (cvt's first source
 * operand goes to the upper half.) */
static __device__ __forceinline__ uint32_t attn_pack(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* A fragment of the 16-column slice k of a 16 x (8 n) fp32 C tile row (c[n-tile][4]). */
static __device__ __forceinline__ void attn_pack_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = attn_pack(c0[0], c0[1]);
    a[1] = attn_pack(c0[2], c0[3]);
    a[2] = attn_pack(c1[0], c1[1]);
    a[3] = attn_pack(c1[2], c1[3]);
}

/* Byte offsets of this lane's ldmatrix row address inside a tile with row stride ld (bf16):
 *  - lane_off_a: for a 16 x 16 block at (r0, c0) read as an A fragment (ldmatrix), or read as the
 *    B fragments of two n-tiles when the tile is stored [k][n] (ldmatrix .trans): row r0 + lane%16,
 *    column c0 + 8 * (lane/16). Matrices: 0 = rows 0-7/cols 0-7, 1 = rows 8-15/cols 0-7,
 *    2 = rows 0-7/cols 8-15, 3 = rows 8-15/cols 8-15: a[0..3] for A; with .trans, k = rows and
 *    n = cols, so r[0], r[1] = b[0], b[1] of n-tile c0 and r[2], r[3] = those of n-tile c0 + 8.
 *  - lane_off_b: for the B fragments of two n-tiles (n0, n0 + 8) x k16 when the tile is stored
 *    [n][k] (ldmatrix without .trans): row n0 + lane%8 + 8 * (lane/16), column k0 + 8 *
 *    ((lane/8) % 2). Matrices: 0 = (n 0-7, k 0-7) = b[0] of n-tile n0, 1 = (n 0-7, k 8-15) = b[1],
 *    2 and 3 the same for n-tile n0 + 8. */
static __device__ __forceinline__ uint32_t attn_lane_off_a(int lane, int ld) {
    return (uint32_t)(((lane & 15) * ld + (lane >> 4) * 8) * 2);
}
static __device__ __forceinline__ uint32_t attn_lane_off_b(int lane, int ld) {
    return (uint32_t)((((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8) * 2);
}
/* Dropout keep bits of one Philox group of the probabilities of query tile ib and key tile jb (16
 * rows or columns each) of head h: the elements (i7 + 8 r, j7 + 8 hh) of the tile, bit 2 r + hh
 * (src/kernels/dropout.h). In an mma accumulator with queries as rows (flash forward, dQ) lane
 * (g, c) holds them for i7 = g, j7 = 2c + e; with keys as rows (dK/dV), for i7 = 2c + e, j7 = g. */
static __device__ __forceinline__ unsigned attn_drop_bits(const attn_dropout &dr, int64_t sample, int h, int ib,
                                                          int jb, int i7, int j7) {
    const uint64_t group = ((((uint64_t)h * (uint64_t)dr.tb + (uint64_t)ib) * (uint64_t)dr.tb + (uint64_t)jb) << 6) |
                           (uint64_t)((i7 << 3) | j7);
    const fsdp_philox4 w = fsdp_dropout_draw(&dr.drop, sample, group);
    const uint32_t th = dr.drop.threshold;
    return (unsigned)(w.w[0] >= th) | (unsigned)(w.w[1] >= th) << 1 | (unsigned)(w.w[2] >= th) << 2 |
           (unsigned)(w.w[3] >= th) << 3;
}

/* Causal mask of element e of a C fragment of a product with queries as rows, its 16 x 8 tile at
 * query r0 and key k0 (layouts in the header comment; lane = 4 g + c): whether the element's key
 * comes after its query. */
static __device__ __forceinline__ bool attn_key_after_query(int r0, int k0, int e, int g, int c) {
    const int row = r0 + g + (e >> 1) * 8, key = k0 + 2 * c + (e & 1);
    return key > row;
}

/* The sliding window's mask of the same element: whether its key is at or before its query minus
 * the window (window > 0). */
static __device__ __forceinline__ bool attn_key_before_window(int r0, int k0, int e, int g, int c, int window) {
    const int row = r0 + g + (e >> 1) * 8, key = k0 + 2 * c + (e & 1);
    return key <= row - window;
}

/* Dropout on the MT x (BC / 8) C fragments acc of a warp's product with queries as rows (rows r0
 * .. r0 + 16 MT - 1, keys k0 .. k0 + BC - 1; r0 and k0 multiples of 16): apply(x, keep) for each
 * element x this lane holds, keep its mask bit (nonzero = kept). Tiles wholly above the diagonal
 * draw nothing (their probabilities are 0 already). The flash forward zeroes dropped P; dQ scales
 * dP by keep / (1 - p). */
template <int AN, typename Apply>
static __device__ __forceinline__ void attn_drop_rows(float (*acc)[AN][4], const attn_dropout &dr, int64_t sample,
                                                      int h, int r0, int k0, const int MT, const int BC, int g, int c,
                                                      Apply apply) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int np = 0; np < BC / 16; np++) {
            const int ib = (r0 + mt * 16) >> 4, jb = (k0 >> 4) + np;
            if (jb > ib) continue;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const unsigned w = attn_drop_bits(dr, sample, h, ib, jb, g, 2 * c + e);
                apply(acc[mt][2 * np][e], w & 1u);
                apply(acc[mt][2 * np + 1][e], w & 2u);
                apply(acc[mt][2 * np][2 + e], w & 4u);
                apply(acc[mt][2 * np + 1][2 + e], w & 8u);
            }
        }
}

/* p[0] += x, p[1] += y in global memory, atomically (one 8-byte vector atomic on sm_90; p 8-byte
 * aligned), with nothing returned. */
static __device__ __forceinline__ void attn_red_add2(float *p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd((float2 *)p, make_float2(x, y));
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

/* Byte offset of element (r, c) of a tile with row stride ld. */
static __device__ __forceinline__ uint32_t attn_at(int r, int c, int ld) { return (uint32_t)((r * ld + c) * 2); }

static __device__ __forceinline__ float attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* acc[2 np] and acc[2 np + 1] (one m-tile's n-tiles) += a x the two n-tiles whose B fragments one
 * ldmatrix x4 read into b (b[0], b[1]: n-tile 2 np; b[2], b[3]: 2 np + 1). */
static __device__ __forceinline__ void attn_mma_x2(float (*acc)[4], int np, const uint32_t a[4], const uint32_t b[4]) {
    attn_mma(acc[2 * np], a, b[0], b[1]);
    attn_mma(acc[2 * np + 1], a, b[2], b[3]);
}

/* acc[m][2 np] and acc[m][2 np + 1] += a[m] x B for the m-tiles m < MT, where B is the 16 x 16
 * slice (two n-tiles) of a shared tile whose B fragments one ldmatrix x4 reads at this lane's
 * address addr: without .trans when the tile is stored [n][k] (lane_off_b), with it when stored
 * [k][n] (lane_off_a). The fragments are read once for all MT m-tiles, which is why a warp owns
 * MT = 2 m-tiles where registers allow. acc and a point at m-tile 0 (a single tile passes &acc,
 * &a and MT = 1). The shapes are constants once inlined, and each kernel compiles to the same
 * machine code as when this was written out in place. */
template <int TRANS, int AN>
static __device__ __forceinline__ void attn_mma_ntile_pair(float (*acc)[AN][4], int np, const uint32_t (*a)[4],
                                                           const int MT, uint32_t addr) {
    uint32_t b[4];
    if (TRANS)
        attn_ldsm_x4_t(b, addr);
    else
        attn_ldsm_x4(b, addr);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) attn_mma_x2(acc[mt], np, a[mt], b);
}

/* acc (MT m-tiles x N columns) += bf16(p) (MT m-tiles x K columns) x B, B the K x N shared tile at
 * b_tile stored [k][n] (row stride ld; off_a the lane's attn_lane_off_a): the flash forward's
 * O += P V and the backward's dQ += dS K, with P and dS still the fp32 accumulators of the product
 * before, packed to A fragments in registers (attn_pack_a) into pa[MT][4]. The caller declares pa:
 * an array local to this function is laid out ahead of the caller's accumulators, which changed
 * ptxas's register allocation of the forward (250 -> 246 registers at D = 64, different SASS);
 * with the caller's array the kernels are the same machine code as before. */
template <int AN, int PN>
static __device__ __forceinline__ void attn_mma_packed_kn(float (*acc)[AN][4], const float (*p)[PN][4],
                                                          uint32_t (*pa)[4], const int MT, const int K, const int N,
                                                          uint32_t b_tile, uint32_t off_a, const int ld) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) attn_pack_a(pa[mt], p[mt][2 * kk], p[mt][2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < N / 16; np++)
            attn_mma_ntile_pair<1>(acc, np, pa, MT, b_tile + attn_at(kk * 16, np * 16, ld) + off_a);
    }
}

/* Copies rows [0, rows) of D bf16 each (global row stride `stride` elements) into a shared tile
 * (row stride ld) with cp.async; rows >= valid are zero-filled so that padding rows never carry
 * NaN garbage into a product. rows * D / 8 must be a multiple of nthreads (true for every tile
 * shape used here), so the loop unrolls completely. */
static __device__ __forceinline__ void attn_load_tile(uint32_t dst, const bf16 *src, long long stride, int rows,
                                                      int valid, int D, int ld, int tid, int nthreads) {
    const int cpr = D / 8; /* 16-byte chunks per row */
#pragma unroll
    for (int i = 0; i < rows * cpr / nthreads; i++) {
        const int idx = tid + i * nthreads, r = idx / cpr, c = idx % cpr;
        const int ok = r < valid;
        attn_cp_async16(dst + attn_at(r, c * 8, ld), src + (long long)(ok ? r : 0) * stride + c * 8, ok);
    }
}

/* The top of key block kb (k0 = kb * BC, stage st = kb & 1) of a loop over double-buffered K and V
 * tiles (flash forward, dQ): block kb has landed (the only group in flight); after the barrier
 * every warp is done with block kb - 1, so stage st ^ 1 is free for block kb + 1, which then loads
 * while this one is multiplied. One barrier per block. st and k0 come from the caller, which needs
 * them too: recomputed here they changed the dQ kernels' machine code (3 instructions). */
static __device__ __forceinline__ void attn_kv_step(int kb, int nkb, int st, int k0, uint32_t sk_a, uint32_t sv_a,
                                                    const bf16 *kg, const bf16 *vg, long long W, int T, const int BC,
                                                    const int D, const int LD, int tid, const int NT) {
    attn_cp_async_wait0();
    __syncthreads();
    if (kb + 1 < nkb) {
        const long long koff = (long long)(k0 + BC) * W;
        attn_load_tile(sk_a + (uint32_t)(st ^ 1) * BC * LD * 2, kg + koff, W, BC, T - k0 - BC, D, LD, tid, NT);
        attn_load_tile(sv_a + (uint32_t)(st ^ 1) * BC * LD * 2, vg + koff, W, BC, T - k0 - BC, D, LD, tid, NT);
        attn_cp_async_commit();
    }
}

/* Half r of a C fragment cf (row g + 8 r, columns 2c, 2c + 1), times scale, as one bf16 pair at
 * row `row`, column col of a staging tile with row stride ld. The epilogues write their warp's
 * accumulators into shared memory this way, then copy the rows out with attn_store_rows. */
static __device__ __forceinline__ void attn_stage_half(bf16 *stage, int row, int col, int ld, const float cf[4], int r,
                                                       float scale) {
    *(uint32_t *)(stage + row * ld + col) = attn_pack(cf[2 * r] * scale, cf[2 * r + 1] * scale);
}

/* Copies rows [0, rows) of a warp's staging tile (bf16, stride ld) to global rows (stride
 * `stride` elements) with 16-byte stores, skipping rows >= valid. */
static __device__ __forceinline__ void attn_store_rows(bf16 *dst, long long stride, const bf16 *tile, int rows,
                                                       int valid, int D, int ld, int lane) {
    const int cpr = D / 8;
#pragma unroll
    for (int i = 0; i < rows * cpr / 32; i++) {
        const int idx = lane + i * 32, r = idx / cpr, c = idx % cpr;
        if (r < valid) *(uint4 *)(dst + (long long)r * stride + c * 8) = *(const uint4 *)(tile + r * ld + c * 8);
    }
}

#endif
