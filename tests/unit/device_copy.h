/* Test helpers: fp32 host arrays to and from a backend's tensors of dtype t (bf16 rounded on the way
 * in, widened on the way out), synchronously on the compute stream. Header-only. */
#ifndef FSDP_TESTS_UNIT_DEVICE_COPY_H
#define FSDP_TESTS_UNIT_DEVICE_COPY_H

#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"

/* Into d, which holds n elements of dtype t. */
static inline void test_copy_to_device(fsdp_backend *be, void *d, const float *x, size_t n, fsdp_dtype t) {
    if (be->runtime->dtype_size(be, t) == 2) {
        uint16_t *h = malloc(n * 2);
        for (size_t i = 0; i < n; i++) h[i] = fsdp_f32_to_bf16(x[i]);
        be->runtime->copy_h2d(be, d, h, n * 2, be->compute);
        be->runtime->stream_synchronize(be, be->compute);
        free(h);
    } else {
        be->runtime->copy_h2d(be, d, x, n * 4, be->compute);
        be->runtime->stream_synchronize(be, be->compute);
    }
}

static inline void *test_to_device(fsdp_backend *be, const float *x, size_t n, fsdp_dtype t) {
    void *d = be->runtime->alloc(be, n * be->runtime->dtype_size(be, t), "test");
    test_copy_to_device(be, d, x, n, t);
    return d;
}

static inline float *test_to_host(fsdp_backend *be, const void *d, size_t n, fsdp_dtype t) {
    float *x = malloc(n * 4);
    be->runtime->stream_synchronize(be, be->compute);
    if (be->runtime->dtype_size(be, t) == 2) {
        uint16_t *h = malloc(n * 2);
        be->runtime->copy_d2h(be, h, d, n * 2, be->compute);
        be->runtime->stream_synchronize(be, be->compute);
        for (size_t i = 0; i < n; i++) x[i] = fsdp_bf16_to_f32(h[i]);
        free(h);
    } else {
        be->runtime->copy_d2h(be, x, d, n * 4, be->compute);
        be->runtime->stream_synchronize(be, be->compute);
    }
    return x;
}

#endif
