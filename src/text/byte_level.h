/* GPT-2's byte-level alphabet (ByteLevel in tokenizers): every byte is shown as one printable
 * Unicode character, so that byte-level BPE works on text. Bytes '!'..'~', 0xA1..0xAC and
 * 0xAE..0xFF stand for themselves; the other 68 bytes take U+0100 onwards in byte order. */
#ifndef FSDP_TEXT_BYTE_LEVEL_H
#define FSDP_TEXT_BYTE_LEVEL_H

#include <stddef.h>
#include <stdint.h>

#include "textbuf.h"

/* Appends the characters of n bytes to out (each byte becomes 1 or 2 bytes of UTF-8). */
void fsdp_byte_level_encode(const char *s, size_t n, char *out, size_t *out_len);
/* The byte a code point stands for, or -1 when it is not in the alphabet. */
int fsdp_byte_level_byte(uint32_t cp);
/* tokenizers' ByteLevel decoder for one token: appends its bytes to out when every character is in
 * the alphabet, else the token's own bytes. */
void fsdp_byte_level_decode_token(const char *tok, size_t n, fsdp_buf *out);

#endif
