/* FP8 casts and products on the CPU: the reference that src/kernels/cuda/fp8.cu reproduces (casts bit
 * for bit, products up to the order of the sums), and the emulation the CPU backend trains with
 * (declarations and the rules in ../fp8.h).
 *
 * Bit-exactness of the casts rests on one correctly rounded fp32 multiplication per element and
 * fsdp_encode_code's round-to-nearest-even (the project builds ISO C11: nothing is contracted into
 * an FMA). Every output element is computed by one OpenMP thread and every sum runs over k in
 * ascending order (cpu_dot), so thread counts change nothing. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "../fp8.h"
#include "cpu_common.h"

int fsdp_fp8_parse(const char *text, fsdp_fp8_granularity *out) {
    static const char *const names[] = {"none", "tensorwise", "rowwise"};
    for (int g = 0; g < 3; g++)
        if (!strcasecmp(text, names[g])) {
            *out = (fsdp_fp8_granularity)g;
            return 0;
        }
    return -1;
}

const char *fsdp_fp8_name(fsdp_fp8_granularity g) {
    return g == FSDP_FP8_TENSORWISE ? "tensorwise" : g == FSDP_FP8_ROWWISE ? "rowwise" : "none";
}

/* |x| as bits: the maximum of non-negative floats is the maximum of their bits, and a NaN's bits lie
 * above Inf's, so a NaN anywhere makes the maximum a NaN. */
static uint32_t magnitude_bits(float x) { return fsdp_fp8_bits(x) & 0x7fffffffu; }

/* The canonical amax of a NaN, so that CPU and GPU agree on its bits. */
#define FP8_NAN_BITS 0x7fc00000u

static float amax_of_bits(uint32_t m) { return fsdp_fp8_from_bits(m > 0x7f800000u ? FP8_NAN_BITS : m); }

void cpu_fp8_amax(float *amax, const float *src, int R, int Cc, int transpose, int rowwise) {
    if (!rowwise) {
        uint32_t m = 0;
        for (size_t i = 0; i < (size_t)R * Cc; i++) {
            uint32_t b = magnitude_bits(src[i]);
            if (b > m) m = b;
        }
        amax[0] = amax_of_bits(m);
        return;
    }
    if (!transpose) { /* per row of src */
#pragma omp parallel for schedule(static)
        for (int r = 0; r < R; r++) {
            uint32_t m = 0;
            for (int c = 0; c < Cc; c++) {
                uint32_t b = magnitude_bits(src[(size_t)r * Cc + c]);
                if (b > m) m = b;
            }
            amax[r] = amax_of_bits(m);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < Cc; c++) { /* per column of src */
        uint32_t m = 0;
        for (int r = 0; r < R; r++) {
            uint32_t b = magnitude_bits(src[(size_t)r * Cc + c]);
            if (b > m) m = b;
        }
        amax[c] = amax_of_bits(m);
    }
}

void cpu_fp8_cast(uint8_t *codes, float *scale, float *inv_scale, float *amax_out, const float *src, int R, int Cc,
                  int transpose, int rowwise, fsdp_dtype t, int pow2, const float *amax_in) {
    const int nscales = !rowwise ? 1 : transpose ? Cc : R;
    float *amax = amax_out;
    float *own = NULL;
    if (amax_in) {
        amax = (float *)amax_in;
    } else {
        if (!amax) amax = own = cpu_scratch((size_t)nscales * sizeof(float));
        cpu_fp8_amax(amax, src, R, Cc, transpose, rowwise);
    }
    const float fp8_max = fsdp_dtype_info_of(t)->max_finite;
    for (int i = 0; i < nscales; i++) {
        scale[i] = fsdp_fp8_scale(amax[i], fp8_max, pow2);
        inv_scale[i] = 1.0f / scale[i];
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        for (int c = 0; c < Cc; c++) {
            const float s = scale[!rowwise ? 0 : transpose ? c : r];
            const float y = src[(size_t)r * Cc + c] * s;
            const size_t at = transpose ? (size_t)c * R + r : (size_t)r * Cc + c;
            codes[at] = fsdp_encode_code(t, y);
        }
    }
    free(own);
}

void cpu_fp8_scales_of_parts(float *scales, const float *amax_parts, int parts, int stride, fsdp_dtype t) {
    uint32_t m = 0;
    for (int p = 0; p < parts; p++) {
        uint32_t b = magnitude_bits(amax_parts[(size_t)p * stride]);
        if (b > m) m = b;
    }
    scales[2] = amax_of_bits(m);
    scales[1] = fsdp_fp8_scale(scales[2], fsdp_dtype_info_of(t)->max_finite, 0);
    scales[0] = 1.0f / scales[1];
}

void cpu_fp8_unpack(uint8_t *codes, uint8_t *codes_t, float *unit, int round_bf16, const uint8_t *pieces,
                    size_t piece_bytes, size_t count, const fsdp_fp8_matrix *m, fsdp_dtype t, float inv_scale) {
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = fsdp_decode_code(t, (uint8_t)c) * inv_scale;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < m->rows; r++) {
        for (int c = 0; c < m->cols; c++) {
            const size_t i = (size_t)r * m->cols + c, g = (size_t)m->offset + i;
            const uint8_t code = pieces[(g / count) * piece_bytes + g % count];
            codes[i] = code;
            codes_t[(size_t)c * m->rows + r] = code;
            unit[g] = round_bf16 ? fsdp_round_bf16(table[code]) : table[code];
        }
    }
}

/* Decoded codes (without their scales): fp8 values are exact in fp32. */
static float *decode_all(const uint8_t *codes, fsdp_dtype t, size_t n) {
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = fsdp_decode_code(t, (uint8_t)c);
    float *v = cpu_scratch(n * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) v[i] = table[codes[i]];
    return v;
}

void cpu_fp8_product(float *out, const uint8_t *a, fsdp_dtype a_t, const float *inv_a, int a_rowwise,
                     const uint8_t *b, fsdp_dtype b_t, const float *inv_b, int b_rowwise, int R, int Cn, int K,
                     const float *bias, float beta, int relu) {
    float *av = decode_all(a, a_t, (size_t)R * K), *bv = decode_all(b, b_t, (size_t)Cn * K);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float sa = inv_a[a_rowwise ? r : 0];
        for (int c = 0; c < Cn; c++) {
            const float factor = sa * inv_b[b_rowwise ? c : 0];
            const float acc = cpu_dot(av + (size_t)r * K, bv + (size_t)c * K, K);
            float y = factor * acc;
            if (bias) y = y + bias[c];
            const size_t i = (size_t)r * Cn + c;
            if (beta != 0.0f) y = y + beta * out[i];
            out[i] = (relu && y < 0.0f) ? 0.0f : y; /* NaN passes, as in torch.relu */
        }
    }
    free(av);
    free(bv);
}

/* One operand cast into fresh buffers: codes, and its scales (1 or `rows` of them). */
typedef struct {
    uint8_t *codes;
    float *scale, *inv;
} operand;

/* amax_in / amax_out as cpu_fp8_cast's (NULL: measured here, kept nowhere). */
static operand cast_operand(const float *src, int R, int Cc, int transpose, int rowwise, fsdp_dtype t, int pow2,
                            const float *amax_in, float *amax_out) {
    const int nscales = !rowwise ? 1 : transpose ? Cc : R;
    operand o = {cpu_scratch((size_t)R * Cc), cpu_scratch((size_t)nscales * sizeof(float)),
                 cpu_scratch((size_t)nscales * sizeof(float))};
    cpu_fp8_cast(o.codes, o.scale, o.inv, amax_out, src, R, Cc, transpose, rowwise, t, pow2, amax_in);
    return o;
}

static void operand_free(operand *o) {
    free(o->codes);
    free(o->scale);
    free(o->inv);
}

void cpu_fp8_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            const float *residual, int N, int C, int OC, int relu, const fsdp_fp8_recipe *r,
                            fsdp_fp8_amax amax, const fsdp_fp8_weight *w8) {
    const int rw = r->granularity == FSDP_FP8_ROWWISE;
    float *keep = rw ? NULL : amax.saved;
    const float *known = rw ? NULL : amax.inp;
    if (keep && known && known != keep) keep[0] = known[0];
    operand x = cast_operand(inp, N, C, 0, rw, FSDP_E4M3, r->pow2_scales, known, known ? NULL : keep);
    operand w = {NULL, NULL, NULL};
    if (!w8) w = cast_operand(weight, OC, C, 0, rw, FSDP_E4M3, r->pow2_scales, NULL, keep ? keep + 1 : NULL);
    else if (keep) keep[1] = w8->scales[2];
    if (residual && residual != out) memcpy(out, residual, (size_t)N * OC * sizeof(float));
    cpu_fp8_product(out, x.codes, FSDP_E4M3, x.inv, rw, w8 ? w8->codes : w.codes, FSDP_E4M3,
                    w8 ? w8->scales : w.inv, rw, N, OC, C, bias, residual ? 1.0f : 0.0f, relu);
    operand_free(&x);
    operand_free(&w);
}

void cpu_fp8_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, int N, int C, int OC, const fsdp_fp8_recipe *r,
                             fsdp_fp8_amax amax, const fsdp_fp8_weight *w8) {
    const int rw = r->granularity == FSDP_FP8_ROWWISE, p2 = r->pow2_scales;
    const float *kept = rw ? NULL : amax.saved, *dy_amax = rw ? NULL : amax.dout;
    if (dinp) { /* dx[N, C] = dy[N, OC] . (W^T)[C, OC]^T */
        operand dy = cast_operand(dout, N, OC, 0, rw, r->grad_t, p2, dy_amax, NULL);
        operand wt = {NULL, NULL, NULL};
        if (!w8) wt = cast_operand(weight, OC, C, 1, rw, FSDP_E4M3, p2, kept ? kept + 1 : NULL, NULL);
        cpu_fp8_product(dinp, dy.codes, r->grad_t, dy.inv, rw, w8 ? w8->codes_t : wt.codes, FSDP_E4M3,
                        w8 ? w8->scales : wt.inv, rw, N, C, OC, NULL, 0.0f, 0);
        operand_free(&dy);
        operand_free(&wt);
    }
    /* dW[OC, C] += (dy^T)[OC, N] . (x^T)[C, N]^T: the fresh product first, then added once, as
     * PyTorch adds a new .grad into an accumulated one. */
    operand dyt = cast_operand(dout, N, OC, 1, rw, r->grad_t, p2, dy_amax, NULL);
    operand xt = cast_operand(inp, N, C, 1, rw, FSDP_E4M3, p2, kept, NULL);
    float *fresh = cpu_scratch((size_t)OC * C * sizeof(float));
    cpu_fp8_product(fresh, dyt.codes, r->grad_t, dyt.inv, rw, xt.codes, FSDP_E4M3, xt.inv, rw, OC, C, N, NULL, 0.0f,
                    0);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < (size_t)OC * C; i++) dweight[i] += fresh[i];
    free(fresh);
    operand_free(&dyt);
    operand_free(&xt);
    if (dbias) { /* from dy as it is, as the bf16 products do: a sum needs no FP8 */
#pragma omp parallel for schedule(static)
        for (int oc = 0; oc < OC; oc++) {
            float s = 0.0f;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + oc];
            dbias[oc] += s;
        }
    }
}
