/* UTF-8 as the tokenizer needs it: strict validation (the tokenizer works on valid text only, as
 * Rust strings are), code point decoding and encoding, the lossy conversion of Rust's
 * String::from_utf8_lossy (each maximal invalid subpart becomes one U+FFFD), and the Unicode
 * White_Space property (Rust's char::is_whitespace). */
#ifndef FSDP_TEXT_UTF8_H
#define FSDP_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "../base/utf8.h"
#include "textbuf.h"

/* Bytes of the sequence a valid lead byte starts. */
static inline int fsdp_utf8_len(unsigned char lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/* Decodes the code point at s (valid UTF-8); returns its length. */
static inline int fsdp_utf8_decode(const char *s, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) return *cp = u[0], 1;
    if (u[0] < 0xE0) return *cp = ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu), 2;
    if (u[0] < 0xF0) return *cp = ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu), 3;
    *cp = ((u[0] & 0x07u) << 18) | ((u[1] & 0x3Fu) << 12) | ((u[2] & 0x3Fu) << 6) | (u[3] & 0x3Fu);
    return 4;
}

/* Start of the code point that ends at s + n (valid UTF-8, n > 0). */
static inline size_t fsdp_utf8_last_start(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && (((unsigned char)s[i]) & 0xC0) == 0x80) i--;
    return i;
}

int fsdp_utf8_encode(uint32_t cp, char *out);
void fsdp_utf8_lossy(const char *s, size_t n, fsdp_buf *out);
int fsdp_is_white_space(uint32_t cp);

#endif
