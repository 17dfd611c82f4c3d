/* Launch functions of the FP8 kernels (src/kernels/cuda/fp8.cu), callable from C: the casts of
 * ../fp8.h on the GPU, bit for bit what cpu_fp8_cast writes (codes, scales, inverse scales, amax; a
 * NaN's code or amax may differ from the CPU's in sign or payload only), and the scaling epilogue
 * of rowwise products when cuBLASLt cannot apply the row scales itself. Device pointers, enqueued
 * on `s`, never synchronising; a failed launch is fatal and names the kernel.
 *
 * The conversions come from cuda_fp8.h, which runs them as instructions on sm_89 and newer and in
 * software below (sm_80 builds and runs these casts; only the products need FP8 tensor cores). */
#ifndef FSDP_KERNELS_FP8_CUDA_H
#define FSDP_KERNELS_FP8_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "../base/dtype.h"
#include "fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cpu_fp8_cast's arguments with src of src_t (FSDP_BF16 or FSDP_F32). amax_in NULL: the amax is
 * computed into amax_out (device, one float per scale; required then). Without transpose a
 * rowwise cast is one kernel (a block reads its row twice, the second time from cache); the others
 * are an amax pass and a cast pass, the transposed ones through shared-memory tiles. */
void fsdp_cuda_fp8_cast(uint8_t *codes, float *scale, float *inv_scale, float *amax_out, const void *src,
                        fsdp_dtype src_t, int R, int Cc, int transpose, int rowwise, fsdp_dtype t, int pow2,
                        const float *amax_in, cudaStream_t s);

/* Both casts of one source in one pass over it (the backward's dy, which both gradient products read):
 * what fsdp_cuda_fp8_cast writes without transpose (codes, scale, inv_scale, amax: per row of src, or
 * one) and with it (codes_t [Cc, R], scale_t, inv_scale_t, amax_t: per column of src, or one). One
 * amax pass (rows and columns together when rowwise), then one pass through shared-memory tiles
 * that writes both layouts. amax_in (tensorwise only; NULL: measured): src's amax as its producer
 * reported it, copied to amax and amax_t, and no amax pass. */
void fsdp_cuda_fp8_cast_both(uint8_t *codes, float *scale, float *inv_scale, float *amax, uint8_t *codes_t,
                             float *scale_t, float *inv_scale_t, float *amax_t, const void *src, fsdp_dtype src_t,
                             int R, int Cc, int rowwise, fsdp_dtype t, int pow2, const float *amax_in,
                             cudaStream_t s);

/* out[R, Cn] (row-major, out_t) = (inv_a[r] * inv_b[c]) * acc[r, c] (+ bias[c], out_t) (+ addend[r, c],
 * out_t; may alias out) then relu; inv_a has R values when a_rowwise, else 1 (likewise inv_b, Cn). */
void fsdp_cuda_fp8_scale_epilogue(void *out, fsdp_dtype out_t, const float *acc, const float *inv_a, int a_rowwise,
                                  const float *inv_b, int b_rowwise, int R, int Cn, const void *bias,
                                  const void *addend, int relu, cudaStream_t s);

/* Product weights cast once per gather (../fp8.h), the twins of the CPU reference:
 * fsdp_cuda_fp8_amax: amax[0] = max |src| over n elements (0 for none), as cpu_fp8_amax's tensorwise;
 * fsdp_cuda_fp8_scales_of_parts: cpu_fp8_scales_of_parts, one thread;
 * fsdp_cuda_fp8_encode: n codes of src with the scale in scales (FSDP_FP8_SCALES floats: inverse, scale,
 *   amax; the first two rewritten from the amax as a tensorwise cast computes them), n < 2^31;
 * fsdp_cuda_fp8_unpack: cpu_fp8_unpack, through 32 x 32 tiles, the inverse scale read from scales[0]. */
void fsdp_cuda_fp8_amax(float *amax, const void *src, fsdp_dtype src_t, size_t n, cudaStream_t s);
void fsdp_cuda_fp8_scales_of_parts(float *scales, const float *amax_parts, int parts, int stride, fsdp_dtype t,
                                   cudaStream_t s);
void fsdp_cuda_fp8_encode(uint8_t *codes, float *scales, const void *src, fsdp_dtype src_t, size_t n, fsdp_dtype t,
                          cudaStream_t s);
void fsdp_cuda_fp8_unpack(uint8_t *codes, uint8_t *codes_t, void *unit, fsdp_dtype unit_t, const void *pieces,
                          size_t piece_bytes, size_t count, const fsdp_fp8_matrix *m, fsdp_dtype t,
                          const float *scales, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
