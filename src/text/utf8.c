/* UTF-8 helpers of utf8.h (validation itself is in src/base/utf8.c). */
#include "utf8.h"

int fsdp_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return o[0] = (unsigned char)(0xC0 | (cp >> 6)), o[1] = (unsigned char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)), o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18)), o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

void fsdp_utf8_lossy(const char *s, size_t n, fsdp_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* valid bytes not yet copied start at run */
    while (i < n) {
        int len = fsdp_utf8_sequence(u + i, n - i);
        if (len > 0) {
            i += (size_t)len;
            continue;
        }
        fsdp_buf_add(out, s + run, i - run);
        fsdp_buf_add(out, "\xEF\xBF\xBD", 3);
        i += (size_t)(-len);
        run = i;
    }
    fsdp_buf_add(out, s + run, n - run);
}

int fsdp_is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
