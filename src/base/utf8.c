/* UTF-8 validation shared by the file readers (src/io) and the tokenizer (src/text): the sequences
 * Rust strings accept (no overlong forms, no surrogates, nothing above U+10FFFF). */
#include "utf8.h"

#include <stdint.h>
#include <string.h>

/* Length of the valid sequence at s[0..n) or, when it is invalid, -(bytes of its maximal subpart):
 * the Unicode "maximal subpart" rule that Rust's from_utf8_lossy follows. */
int fsdp_utf8_sequence(const unsigned char *s, size_t n) {
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
        int len = fsdp_utf8_sequence(u + i, n - i);
        if (len < 0) return i;
        i += (size_t)len;
    }
    return n;
}

