/* UTF-8 validation (base layer: the file readers and the tokenizer both need it). */
#ifndef FSDP_BASE_UTF8_H
#define FSDP_BASE_UTF8_H

#include <stddef.h>

/* The offset of the first byte that does not start a valid UTF-8 sequence, or n when all are valid. */
size_t fsdp_utf8_invalid(const char *s, size_t n);
/* Length of the valid sequence at s[0..n), or -(bytes of its maximal subpart) when it is invalid:
 * the Unicode "maximal subpart" rule of Rust's from_utf8_lossy. */
int fsdp_utf8_sequence(const unsigned char *s, size_t n);

#endif
