/* UTF-8 helpers of utf8.h. */
#include "utf8.h"

/* Length of the valid sequence at s[0..n) or, when it is invalid, -(bytes of its maximal subpart):
 * the Unicode "maximal subpart" rule that Rust's from_utf8_lossy follows. */
static int sequence(const unsigned char *s, size_t n) {
    unsigned char b = s[0];
    if (b < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) need = 2;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return -i;
        unsigned char c = s[i];
        if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -i;
    }
    return need + 1;
}

size_t fsdp_utf8_invalid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII eight bytes at a time: most text is mostly ASCII */
        while (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, u + i, 8);
            if (v & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        int len = sequence(u + i, n - i);
        if (len < 0) return i;
        i += (size_t)len;
    }
    return n;
}

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
        int len = sequence(u + i, n - i);
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
