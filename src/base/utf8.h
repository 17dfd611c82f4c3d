/* UTF-8 and Unicode text, the one module every layer uses for it (the file readers of src/io, the
 * tokenizer of src/text):
 *
 *   validation    the sequences Rust strings accept (no overlong forms, no surrogates, nothing
 *                 above U+10FFFF): the tokenizer works on valid text only, as `tokenizers` does;
 *   code points   decoding and encoding of valid text;
 *   lossy         Rust's String::from_utf8_lossy (each maximal invalid subpart becomes one U+FFFD);
 *   properties    the White_Space property (Rust's char::is_whitespace);
 *   normalization NFC, NFD, NFKC and NFKD through utf8proc (Debian libutf8proc), the normalizers of
 *                 tokenizer.json files (Qwen's NFC, Claude's NFKC);
 *   lowercase     the Lowercase normalizer of tokenizers, which maps character by character with Rust's
 *                 char::to_lowercase (so a word-final capital sigma becomes U+03C3, not the U+03C2 of
 *                 str::to_lowercase): utf8proc's simple case mapping plus U+0130, whose lowercase is
 *                 two characters ("i" + U+0307).
 *
 * Unicode versions: utf8proc's tables and those of the Rust crates behind `tokenizers` are of
 * different Unicode versions; they differ only for characters assigned since the older one. */
#ifndef FSDP_BASE_UTF8_H
#define FSDP_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* The offset of the first byte that does not start a valid UTF-8 sequence, or n when all are valid. */
size_t fsdp_utf8_invalid(const char *s, size_t n);
/* Length of the valid sequence at s[0..n), or -(bytes of its maximal subpart) when it is invalid:
 * the Unicode "maximal subpart" rule of Rust's from_utf8_lossy. */
int fsdp_utf8_sequence(const unsigned char *s, size_t n);

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

/* Writes cp's 1 to 4 bytes to out; returns how many. */
int fsdp_utf8_encode(uint32_t cp, char *out);
/* from_utf8_lossy of s[0..n) into out, which holds at least 3n bytes; returns the bytes written. */
size_t fsdp_utf8_lossy(const char *s, size_t n, char *out);
/* Rust's char::is_whitespace (the White_Space property). */
int fsdp_is_white_space(uint32_t cp);

typedef enum { FSDP_UNICODE_NFC, FSDP_UNICODE_NFD, FSDP_UNICODE_NFKC, FSDP_UNICODE_NFKD } fsdp_unicode_form;
/* The normalization form of valid UTF-8 s[0..n): 1 with *out a malloc'ed text of *out_n bytes, or 0
 * when the text is its own normal form for certain without looking further (ASCII only); -1 with
 * err naming utf8proc's failure. */
int fsdp_utf8_normalize(fsdp_unicode_form form, const char *s, size_t n, char **out, size_t *out_n, fsdp_err *err);
/* Rust's char::to_lowercase of each character of valid UTF-8 s[0..n) into out, which holds at least
 * 2n bytes (no character's lowercase takes more than 1.5 times its bytes); returns the bytes written. */
size_t fsdp_utf8_lowercase(const char *s, size_t n, char *out);

#endif
