/* The dtype table and the host conversions of blockwise codes (src/base/dtype.h): every fp8 code
 * decodes and encodes back to itself, values between two codes round to the nearer one (ties to
 * the even code), values past the largest finite saturate, NaN stays NaN; int8 rounds to nearest
 * even and clamps; names parse; piece layouts are 16-byte aligned and hold their scales. */
#include <math.h>
#include <stdio.h>

#include "../../src/base/dtype.h"
#include "check.h"

/* The finite codes of an fp8 dtype with a non-negative value, ascending (codes 0..max are). */
static int finite_codes(fsdp_dtype t) { return t == FSDP_E4M3 ? 0x7e : 0x7b; }

static void check_fp8(fsdp_dtype t) {
    const char *name = fsdp_dtype_name(t);
    int top = finite_codes(t), bad = 0;
    for (int c = 0; c < 256; c++) {
        float v = fsdp_decode_code(t, (uint8_t)c);
        if (isnan(v)) {
            bad += !isnan(fsdp_decode_code(t, fsdp_encode_code(t, v)));
            continue;
        }
        if (isinf(v)) continue; /* e5m2's infinities saturate (below) */
        uint8_t back = fsdp_encode_code(t, v);
        /* Zero and negative zero are both exact. */
        if (back != c && !(v == 0.0f && (back & 0x7f) == 0)) bad++;
    }
    check_that(bad == 0, "%s: every finite code round-trips (%d mismatches)", name, bad);
    bad = 0;
    for (int c = 0; c < top; c++) {
        float lo = fsdp_decode_code(t, (uint8_t)c), hi = fsdp_decode_code(t, (uint8_t)(c + 1));
        float mid = 0.5f * (lo + hi); /* exact: fp8 values have few mantissa bits */
        uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
        bad += fsdp_encode_code(t, mid) != even;
        bad += fsdp_encode_code(t, nextafterf(mid, 0.0f)) != c;
        bad += fsdp_encode_code(t, nextafterf(mid, INFINITY)) != c + 1;
        bad += fsdp_encode_code(t, -nextafterf(mid, 0.0f)) != (0x80 | c);
    }
    check_that(bad == 0, "%s: values between codes round to nearest, ties to even (%d mismatches)", name, bad);
    float maxv = fsdp_dtype_info_of(t)->max_finite;
    check_that(fsdp_decode_code(t, (uint8_t)top) == maxv, "%s: the largest finite code is %g", name, maxv);
    check_that(fsdp_encode_code(t, maxv * 4.0f) == top && fsdp_encode_code(t, -INFINITY) == (0x80 | top),
               "%s: beyond the largest finite value saturates", name);
    check_that(isnan(fsdp_decode_code(t, fsdp_encode_code(t, NAN))), "%s: NaN stays NaN", name);
    check_that(fsdp_encode_code(t, ldexpf(1.0f, -40)) == 0, "%s: far below the smallest subnormal is zero", name);
}

int main(void) {
    check_fp8(FSDP_E4M3);
    check_fp8(FSDP_E5M2);
    check_that(fsdp_decode_code(FSDP_E4M3, fsdp_encode_code(FSDP_E4M3, 1.0f)) == 1.0f &&
                   fsdp_encode_code(FSDP_E4M3, 1.0f) == 0x38 && fsdp_encode_code(FSDP_E5M2, 1.0f) == 0x3c,
               "fp8: 1.0 is e4m3 0x38 and e5m2 0x3c (the OCP FP8 encodings)");
    check_that(fsdp_encode_code(FSDP_E4M3, ldexpf(1.0f, -9)) == 0x01 &&
                   fsdp_encode_code(FSDP_E4M3, ldexpf(1.0f, -10)) == 0x00 &&
                   fsdp_encode_code(FSDP_E4M3, ldexpf(3.0f, -10)) == 0x02,
               "e4m3: smallest subnormal 2^-9; 2^-10 ties to 0, 3 * 2^-10 ties to 2 * 2^-9");

    int bad = 0;
    for (int i = -130; i <= 130; i++) {
        int expect = i > 127 ? 127 : i < -127 ? -127 : i;
        bad += (int8_t)fsdp_encode_code(FSDP_I8, (float)i) != expect;
        bad += fsdp_decode_code(FSDP_I8, fsdp_encode_code(FSDP_I8, (float)i)) != (float)expect;
    }
    check_that(bad == 0, "int8: integers encode to themselves, clamped to +-127");
    check_that((int8_t)fsdp_encode_code(FSDP_I8, 2.5f) == 2 && (int8_t)fsdp_encode_code(FSDP_I8, -3.5f) == -4 &&
                   (int8_t)fsdp_encode_code(FSDP_I8, 0.49f) == 0,
               "int8: rounds to nearest, ties to even");

    fsdp_dtype t;
    check_that(fsdp_dtype_parse("bf16", &t) == 0 && t == FSDP_BF16 && fsdp_dtype_parse("int8", &t) == 0 &&
                   t == FSDP_I8 && fsdp_dtype_parse("fp8", &t) == 0 && t == FSDP_E4M3 &&
                   fsdp_dtype_parse("e5m2", &t) == 0 && t == FSDP_E5M2 && fsdp_dtype_parse("FP32", &t) == 0 &&
                   t == FSDP_F32 && fsdp_dtype_parse("int4", &t) == -1,
               "names and aliases parse; unknown names do not");
    bad = 0;
    for (int d = 0; d < FSDP_DTYPE_COUNT; d++) {
        const fsdp_dtype_info *info = fsdp_dtype_info_of((fsdp_dtype)d);
        fsdp_dtype back;
        bad += fsdp_dtype_parse(info->name, &back) != 0 || back != (fsdp_dtype)d;
        bad += info->blockwise != (info->bytes == 1);
    }
    check_that(bad == 0, "every row's name parses back to it; the one-byte dtypes are the blockwise ones");
    bad = 0;
    for (size_t n = 1; n < 3000; n += 37) {
        size_t bytes = fsdp_dtype_piece_bytes(FSDP_I8, n), at = fsdp_dtype_scales_offset(n);
        size_t blocks = (n + FSDP_QUANT_BLOCK - 1) / FSDP_QUANT_BLOCK;
        bad += bytes % 16 != 0 || at % 16 != 0 || at < n || at + blocks * 4 > bytes || bytes > at + blocks * 4 + 15;
    }
    check_that(bad == 0, "pieces: codes, then the scales at a 16-byte boundary, the whole a multiple of 16");
    return check_summary("test_dtype");
}
