/* UTF-8 and Unicode text of utf8.h. Validation and the code point helpers are written here (a few
 * lines each, on the tokenizer's hot path); normalization and case mapping are utf8proc's. */
#include "utf8.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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

/* The first byte at or after i that is not ASCII (n when none), eight bytes at a time. */
static size_t skip_ascii(const unsigned char *u, size_t i, size_t n) {
    while (i + 8 <= n) {
        uint64_t v;
        memcpy(&v, u + i, 8);
        if (v & 0x8080808080808080ULL) break;
        i += 8;
    }
    while (i < n && u[i] < 0x80) i++;
    return i;
}

size_t fsdp_utf8_invalid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while ((i = skip_ascii(u, i, n)) < n) {
        int len = fsdp_utf8_sequence(u + i, n - i);
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

size_t fsdp_utf8_lossy(const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0, w = 0; /* valid bytes not yet copied start at run */
    while (i < n) {
        int len = fsdp_utf8_sequence(u + i, n - i);
        if (len > 0) {
            i += (size_t)len;
            continue;
        }
        memcpy(out + w, s + run, i - run);
        w += i - run;
        memcpy(out + w, "\xEF\xBF\xBD", 3);
        w += 3;
        i += (size_t)(-len);
        run = i;
    }
    memcpy(out + w, s + run, n - run);
    return w + n - run;
}

int fsdp_is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- normalization ----------------------------------------------------------------------------- */

int fsdp_utf8_normalize(fsdp_unicode_form form, const char *s, size_t n, char **out, size_t *out_n, fsdp_err *err) {
    /* ASCII is invariant under all four forms; most text is, and utf8proc would copy it */
    if (skip_ascii((const unsigned char *)s, 0, n) == n) return 0;
    static const int options[] = {
        [FSDP_UNICODE_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [FSDP_UNICODE_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [FSDP_UNICODE_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [FSDP_UNICODE_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    utf8proc_uint8_t *dst = NULL;
    /* without UTF8PROC_NULLTERM utf8proc reads exactly n bytes, NUL characters included */
    utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                        (utf8proc_option_t)options[form]);
    if (len < 0) {
        if (len == UTF8PROC_ERROR_NOMEM) fsdp_fatal("utf8proc_map: out of host memory normalizing %zu bytes", n);
        return fsdp_errf(err, "utf8proc_map: %s", utf8proc_errmsg(len));
    }
    *out = (char *)dst, *out_n = (size_t)len;
    return 1;
}

/* ---- lowercase (tokenizers: Rust's char::to_lowercase, character by character) ---------------------- */

size_t fsdp_utf8_lowercase(const char *s, size_t n, char *out) {
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)s[i];
        if (b < 0x80) {
            out[w++] = (char)(b >= 'A' && b <= 'Z' ? b + 32 : b);
            i++;
            continue;
        }
        uint32_t c;
        int len = fsdp_utf8_decode(s + i, &c);
        i += (size_t)len;
        if (c == 0x130) { /* SpecialCasing: the only unconditional lowercase of two characters */
            out[w++] = 'i';
            w += (size_t)fsdp_utf8_encode(0x307, out + w);
            continue;
        }
        w += (size_t)fsdp_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)c), out + w);
    }
    return w;
}
